"""gpt-oss under the Megatron-Core regime with tensor parallelism and sequence parallelism (issue 25 item 4): one
layer measured on rank 0 of a fake process group of 2 with Megatron-Core's own sequence-parallel linear and
reduce-scatter (validation/megatron_gpt_oss/measure_tp.py, tp_measurements.json) against hand-derived bytes and the
profile; what stays refused at tp > 1, by name. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP
from mlsysim_plugins.measured.families import megatron_alltoall_held, megatron_alltoall_map_held, megatron_clamped_glu_moe

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.hf import from_hf_config
from scripttools import load_script
from test_megatron_gpt_oss import B, BIG, S, T, TINY, solve, term

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "validation/megatron_gpt_oss/tp_measurements.json").read_text(encoding="utf-8"))
RUNS = {r["id"]: r for r in RECORD["runs"]}
LAYER_RUNS = {i: r for i, r in RUNS.items() if not {"recompute_method", "pp", "recompute_modules"} & set(r)}
MODULES = {i: r for i, r in RUNS.items() if "recompute_modules" in r}
FULL = {i: r for i, r in RUNS.items() if r.get("recompute_method") == "uniform"}
BLOCK = {i: r for i, r in RUNS.items() if r.get("recompute_method") == "block"}
H, E, K = 64, 8, 2
# the profile's bytes per token and layer of the tiny gpt-oss (test_megatron_gpt_oss: 2,240), of which the layer's
# input (2h: the input norm's saved input, alive before the layer's forward) and, per routed copy, 2 + 8 + 2h + 10f
LAYER = 2240
RECIPE = dict(sequence_parallel=True, expert_tp_size=1)


def measured_layer(run) -> int:
    """A measured layer's saved bytes as the profile counts them: the growth of its forward (the held row_id_map the
    forward replaced added back), plus its input (saved by the input norm, alive at the start), less the two norms'
    fp32 rsigma (4 B a token each) and the activation's bf16 offset scalar (2 B), which the profile does not count."""
    m = run["measured"]
    return m["saved_with_row_id_map"] + 2 * H * m["tokens_on_rank"] - 8 * m["tokens_on_rank"] - 2


def test_record():
    assert RECORD["megatron_lm_commit"] == "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
    assert RECORD["sequence_parallel"] is True and RECORD["expert_tensor_parallel_size"] == 1
    assert sorted(LAYER_RUNS) == ["tp1-ep1", "tp2-ep1", "tp2-ep2"]
    assert sorted(FULL) == ["tp1-full-l2", "tp2-ep2-full-l2", "tp2-full-l2"]
    assert all(r["recompute_num_layers"] == 1 and r["layers"] == 2 for r in FULL.values())
    assert sorted(BLOCK) == ["tp1-block1-l3", "tp2-block1-l3", "tp2-block2-l3"]
    assert sorted(MODULES) == ["tp2-ep2-layernorm+moe_act", "tp2-layernorm+moe_act"]
    assert sorted(i for i, r in RUNS.items() if "pp" in r) == ["tp2-ep2-pp2-stage1-m4-l2", "tp2-pp2-stage0-m4-l2",
                                                             "tp2-pp2-stage1-m4-l2"]


def test_hand_derived_bytes():
    # per token of the rank: 2,240 less the layer's input 128 plus the norms' rsigma 8 = 2,120; + the offset scalar
    assert RUNS["tp1-ep1"]["measured"]["saved_with_row_id_map"] == 128 * 2120 + 2 == 271_362
    # tp 2: the rank's 64 tokens of the sequence, the rank's 2 of 4 heads and 1 of 2 kv heads: exactly half
    assert RUNS["tp2-ep1"]["measured"]["saved_with_row_id_map"] == 64 * 2120 + 2 == 135_682
    # tp 2, ep 2: 146 rows received (the busiest-rank effect of routing); per token of the rank 2,120 less the
    # routed copies' 2 x 618, per row received 618 (bf16 probabilities 2, the sorts' maps 8, 2h + 10f)
    assert RUNS["tp2-ep2"]["measured"]["received"] == 146
    assert RUNS["tp2-ep2"]["measured"]["saved_with_row_id_map"] == 64 * (2120 - 2 * 618) + 146 * 618 + 2 == 146_806
    for run in LAYER_RUNS.values():
        m, tokens = run["measured"], run["measured"]["tokens_on_rank"]
        assert tokens == 128 // run["tp"]
        # the dispatcher's held tensors per token of the rank; the counts 8E (one expert-tensor-parallel rank)
        assert m["held"] == megatron_alltoall_held(experts=E) * tokens
        assert m["held_other"] == {"row_id_map": megatron_alltoall_map_held(experts=E) * tokens,
                                   "num_global_tokens_per_local_expert": 8 * E}
        # nothing outlives the backward but the held tensors (replaced): only the layer's input, freed by the script
        assert m["after_backward_over_start"] == -2 * H * tokens
        # the local spec's GlobalMemoryBuffer 'mpu': the sequence-parallel all-gather of linear_qkv's input, T x h bf16
        assert m["mpu_buffer"] == (128 * H * 2 if run["tp"] > 1 else 0)


def test_profile_equals_the_measured_layer():
    # tp 1: the profile's one device; tp 2: rank 0 of tp 2 with sequence parallelism and the recipe's
    # expert_tensor_parallel_size 1 (global batch 2 x 64 tokens, dp 1: 128 tokens, 64 a rank)
    assert measured_layer(RUNS["tp1-ep1"]) == T * LAYER == term(solve(), "decoder layers: saved").nbytes / 2
    r = solve(tp_size=2, dp_size=1, **RECIPE)
    assert measured_layer(RUNS["tp2-ep1"]) == T // 2 * LAYER == term(r, "decoder layers: saved").nbytes / 2
    # under expert parallelism (ep 2 over the 2 tensor-parallel ranks) with the measured busiest-rank load
    run = RUNS["tp2-ep2"]
    load = run["measured"]["received"] / (64 * K)
    r = solve(tp_size=2, ep_size=2, dp_size=1, moe_routing_imbalance=load, **RECIPE)
    routed = sum(p.nbytes for p in megatron_clamped_glu_moe(hidden=H, ffn=48, experts=E, top_k=K)[2:])
    assert routed == 2 * 618
    assert term(r, "decoder layers: saved").nbytes / 2 == pytest.approx(measured_layer(run), abs=1e-6)


def test_recompute_modules_at_tp():
    # Megatron-Core's recompute_modules layernorm and moe_act at tp 2 (measure_modules.py's block in the whole layer):
    # per token of the rank the layer keeps 2,120 B less the pre-MLP norm's output 2h and rsigma 4 (132) and, per row
    # received, the activation's tensors 6f (288), with no offset scalar; in the backward each module's recompute
    # rebuilds what it released (the offset scalar with the activation)
    assert sorted(MODULES) == ["tp2-ep2-layernorm+moe_act", "tp2-layernorm+moe_act"]
    for run in MODULES.values():
        m, t = run["measured"], run["measured"]["tokens_on_rank"]
        assert run["recompute_modules"] == ["layernorm", "moe_act"]
        plain = LAYER_RUNS["tp2-ep1" if run["ep"] == 1 else "tp2-ep2"]["measured"]
        assert m["received"] == plain["received"]
        assert m["saved_with_row_id_map"] == plain["saved_with_row_id_map"] - 132 * t - 288 * m["received"] - 2
        assert m["rebuilt"] == [132 * t, 288 * m["received"] + 2]
        assert m["after_backward_over_start"] == -2 * H * t
        # the profile: the layer's saved bytes and one layer's rebuilt, the busiest-rank load the recorded rows
        options = dict(RECIPE, plugin_options={"selective": {"modules": ["layernorm", "moe_act"]}})
        if run["ep"] > 1:
            options["moe_routing_imbalance"] = m["received"] / (t * K)
        r = solve("selective", tp_size=2, ep_size=run["ep"], dp_size=1, **options)
        # as the profile counts it: the input added, the input norm's rsigma (4 B a token) taken out
        assert term(r, "decoder layers: saved").nbytes / 2 == pytest.approx(
            m["saved_with_row_id_map"] + 2 * H * t - 4 * t, abs=1e-6)
        assert term(r, "recompute modules layernorm, moe_act").nbytes == pytest.approx(
            sum(m["rebuilt"]) - 4 * t - 2, abs=1e-6)
    # by hand, tp 2, ep 1: 64 x (2,120 - 132 - 576) = 90,368 B
    assert MODULES["tp2-layernorm+moe_act"]["measured"]["saved_with_row_id_map"] == 64 * (2120 - 132 - 576) == 90_368


def test_tp2_hand_derived_terms():
    r = solve(tp_size=2, dp_size=1, **RECIPE)
    t = T // 2
    # the dispatcher's held tensors, the final norm: the rank's T / tp tokens
    assert term(r, "Megatron-Core alltoall dispatcher's held routing").nbytes == 2 * t * 3 * E
    assert term(r, "Megatron-Core alltoall dispatcher's held permutation map").nbytes == 2 * t * 4 * (2 * E + 1)
    assert term(r, "Megatron-Core alltoall dispatcher's held token counts").nbytes == 2 * 8 * E
    assert term(r, "final norm").nbytes == t * (8 * H + 4)
    # parameters a rank (bf16): the vocabulary-parallel embedding and LM head 2 x 1,000 x 64 / 2; per layer the sinks
    # 4 / 2, q/k/v with their biases (64 x 128 + 128) / 2, o_proj 64 x 64 / 2 and its bias 64 (replicated), the
    # router 8 x 65 (replicated), every expert (expert_tp_size 1, ep 1) 75,008, the two norms 128; the final norm 64
    layer = 2 + (64 * 128 + 128) // 2 + 64 * 64 // 2 + 64 + 8 * 65 + 75_008 + 128
    assert term(r, "parameters").nbytes == (64_000 + 2 * layer + 64) * 2 == 455_848
    assert any("tensor parallelism with sequence parallelism (tp 2" in n for n in r.notes)


def test_tp1_is_unchanged_by_the_recipe_options():
    # sequence_parallel and expert_tp_size 1 change nothing on one device
    base = [(x.label, x.nbytes, x.phases) for x in solve().terms]
    assert [(x.label, x.nbytes, x.phases) for x in solve(**RECIPE).terms] == base


@pytest.mark.parametrize("options, parameter, allowed", [
    (dict(tp_size=2, dp_size=1), "sequence_parallel", "True with tp_size > 1 for gpt-oss"),
    (dict(tp_size=2, dp_size=1, sequence_parallel=True), "expert_tp_size", "1 with tp_size > 1 for gpt-oss"),
    (dict(tp_size=2, dp_size=1, sequence_parallel=True, expert_tp_size=2), "expert_tp_size",
     "1 with tp_size > 1 for gpt-oss"),
    (dict(tp_size=2, cp_size=2, dp_size=1, **RECIPE), "cp_size", "1 for gpt-oss under 'mixed-bf16-main-grad'"),
])
def test_what_stays_refused_at_tp(options, parameter, allowed):
    with pytest.raises(NotModelledError) as err:
        solve(**options)
    assert err.value.parameter == parameter and allowed in str(err.value)


def test_selective_core_attn_at_tp_keeps_what_none_keeps():
    none = [(x.label, x.nbytes) for x in solve(tp_size=2, dp_size=1, **RECIPE).terms if x.component == "activations"]
    assert [(x.label, x.nbytes) for x in solve("selective", tp_size=2, dp_size=1, **RECIPE).terms
            if x.component == "activations"] == none


# --- Megatron-Core's full recompute under tensor parallelism (uniform, one layer a chunk; 2 layers, one micro-batch) --

def layer_parameter_bytes(tp, ep):
    """One measured layer's bf16 parameters on the rank: the norms 2h, linear_qkv (a + 2g) x 16 rows of h and their
    bias, linear_proj h x 16a and its bias h, the sinks a (the rank's a = 4 / tp heads, g = 2 / tp kv heads), the router
    8 x (h + 1), 8 / ep experts of fc1 96 x (h + 1) and fc2 h x 48 + h."""
    a, g = 4 // tp, 2 // tp
    qkv = (a + 2 * g) * 16
    return 2 * (2 * H + qkv * (H + 1) + H * 16 * a + H + a + 8 * (H + 1) + 8 // ep * (96 * (H + 1) + H * 48 + H))


def recompute_phases(run) -> dict:
    """The measured moments of a recompute run as the profile's phases count them, over nothing: the start (the
    previous iteration's held dispatcher tensors and the detached inputs and gradients their graphs keep) added
    back; the stage's output (the final norm's input, a term of its own) and the kept layers' norms' rsigma (4 B a
    token each) and offset scalars (2 B), which the profile does not count, left out. The forward's end; the
    backward's phase: under full recompute the bottom layer's recompute (a micro-batch's backward), under block
    recompute the backward's start (every kept layer's saved tensors); the backward's end: the bottom layer's
    recompute, less the bf16 weight gradients of the layers above (Megatron-Core accumulates into main_grad with
    gradient_accumulation_fusion: none in the profile) and the recomputed layer's rsigma and offset scalar; after
    the iteration."""
    m, t, L = run["measured"], run["measured"]["tokens_on_rank"], run["layers"]
    kept = L - min(run["recompute_num_layers"], L) if run["recompute_method"] == "block" else 0
    g = m["held_graph"]
    start = (m["held"] + m["held_other"]["num_global_tokens_per_local_expert"] + m["held_row_id_map"] + g["inputs"]
             + g["input_grads"])
    output, uncounted = t * H * 2, (8 * t + 2)
    bottom = (m["after_recompute"][-1] + start - output - (L - 1) * layer_parameter_bytes(run["tp"], run["ep"])
              - uncounted)
    backward = m["backward_start"] + start - output - kept * uncounted if kept else bottom
    return {FORWARD: m["after_forward"] + start - kept * uncounted, BACKWARD: backward, BACKWARD_END: bottom,
            OPTIMIZER_STEP: m["after_iteration"] + start}


def recompute_profile(run) -> dict:
    """The profile's decoder-layer, recompute and dispatcher terms of the tiny model (the run's layers, 128 tokens)
    at the run's tp and ep (``checkpointed_layers`` = ``recompute_num_layers`` under block recompute), the MLP
    backward's transient activation gradients (2 x T x k x f x 2 B / tp, not held at the measured moment) left out
    of the recompute's phases."""
    tp, ep, m, L = run["tp"], run["ep"], run["measured"], run["layers"]
    options = dict(RECIPE) if tp > 1 else {}
    if ep > 1:      # the recomputed (bottom) layer's rows
        options["moe_routing_imbalance"] = m["received"][0] / (m["tokens_on_rank"] * K)
    if run["recompute_method"] == "block":
        options["checkpointed_layers"] = run["recompute_num_layers"]
    model = dict(TINY, num_hidden_layers=L, layer_types=["sliding_attention", "full_attention"] * 2)
    r = TrainingMemoryModel().solve(from_hf_config(model, name="gpt-oss-tiny"), BIG, B, S, "bf16", "adamw", "full",
                                    profile="measured", regime="mixed-bf16-main-grad", attention="sdpa",
                                    runtime_overheads=False, tp_size=tp, ep_size=ep, dp_size=1, **options)
    mine = [x for x in r.terms if x.component == "activations" and x.label.startswith(
        ("checkpointed", "recompute", "Megatron-Core alltoall", "decoder layers: saved"))]
    grads = 2 * m["tokens_on_rank"] * K * 48 * 2
    full = run["recompute_method"] == "uniform"
    return {phase: sum(x.nbytes for x in mine if phase in x.phases)
            - (grads if phase == BACKWARD_END or (full and phase == BACKWARD) else 0)
            for phase in (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)}


def test_full_recompute_hand_derived():
    # tp 1 (X = 128 tokens x h x 2 = 16,384 B) and tp 2 (64 tokens of the rank, X = 8,192 B): per layer the
    # dispatcher's held probabilities and map 3E, its permutation map 4(2E + 1), its counts 8E
    for rid, t in (("tp1-full-l2", 128), ("tp2-full-l2", 64)):
        run = FULL[rid]
        X, m = t * H * 2, run["measured"]
        held = 2 * (24 * t + 64)
        maps = 2 * 68 * t
        assert m["held_graph"] == {"inputs": 2 * X, "input_grads": 2 * X, "inputs_after": 2 * X,
                                   "input_grads_after": 2 * X}
        phases = recompute_phases(run)
        # the forward's end: the two checkpointed inputs, the held tensors (the no-grad forward's)
        assert phases[FORWARD] == 2 * X + held + maps
        # the bottom layer's recompute: both inputs, the upper layer's input gradient, its held tensors and map, the
        # recomputed layer's saved tensors (as measured without recompute, its input the checkpoint's: 2,120 B a
        # token less the rsigma 8) and its output, its held tensors (its map among its saved tensors)
        assert phases[BACKWARD] == 2 * X + X + (24 * t + 64 + 68 * t) + 2112 * t + X + 24 * t + 64
        # after the iteration: each layer's detached input and its gradient, held by the recomputed graphs
        assert phases[OPTIMIZER_STEP] == 4 * X + held + maps
        assert m["after_iteration"] == 0


def test_block_recompute_hand_derived():
    # tp 1, 3 layers, the first checkpointed (recompute_num_layers 1), X = 16,384 B; per layer the held probabilities
    # and map 24t + the counts 64 (3,136), the permutation map 68t (8,704); a kept layer's saved tensors 2,240 B a token
    # (its input included)
    run, t = BLOCK["tp1-block1-l3"], 128
    X = t * H * 2
    phases = recompute_phases(run)
    # the forward's end: the checkpointed input, every layer's held tensors, the checkpointed layer's map, the two
    # kept layers' saved tensors (their maps among them)
    assert phases[FORWARD] == phases[BACKWARD] == X + 3 * 3136 + 8704 + 2 * 2240 * t == 607_936
    # the bottom layer's recompute: its input and the gradient the kept layers pass down, every layer's held tensors,
    # the kept layers' maps, the recomputed layer's saved tensors (its input the checkpoint's: 2,112 B a token) and
    # its output
    assert phases[BACKWARD_END] == X + X + 3 * 3136 + 2 * 8704 + 2112 * t + X == 346_304
    # after the iteration: the checkpointed layer's detached input and its gradient, every layer's held tensors and map
    assert phases[OPTIMIZER_STEP] == 2 * X + 3 * (3136 + 8704) == 68_288
    # the same layout at tp 2 with two layers checkpointed: the kept layer's saved tensors alive at the backward's start
    run, t = BLOCK["tp2-block2-l3"], 64
    X = t * H * 2
    phases = recompute_phases(run)
    assert phases[BACKWARD] == 2 * X + 3 * (24 * t + 64) + 2 * 68 * t + 2240 * t
    # at the bottom layer's recompute: both checkpointed inputs, the upper checkpointed layer's input gradient (held by
    # its graph: also what layer 0 receives), the upper checkpointed and the kept layer's maps
    assert phases[BACKWARD_END] == 2 * X + X + 3 * (24 * t + 64) + 2 * 68 * t + 2112 * t + X


@pytest.mark.parametrize("rid", sorted(FULL) + sorted(BLOCK))
def test_recompute_profile_equals_the_measurement(rid):
    run = RUNS[rid]
    measured, profile = recompute_phases(run), recompute_profile(run)
    for phase, value in measured.items():
        assert profile[phase] == pytest.approx(value, abs=1e-6), (phase, profile[phase], value)


# --- under pipeline parallelism: a stage of such layers under Megatron-Core's 1F1B ----------------------------------

PIPELINE = {i: r for i, r in RUNS.items() if "pp" in r}


def pipeline_solve(run, **options):
    """The tiny model with the run's layers on each of its pp stages, micro-batches of one 128-token sequence (64 a
    tensor-parallel rank), tp 2 with the recipe's options, ep over the tensor-parallel ranks (dp 1)."""
    L, pp, m, ep = run["layers"], run["pp"], run["microbatches"], run["ep"]
    model = dict(TINY, num_hidden_layers=L * pp, layer_types=["sliding_attention", "full_attention"] * (L * pp // 2))
    return TrainingMemoryModel().solve(from_hf_config(model, name="gpt-oss-tiny"), BIG, m, 128, "bf16", "adamw", "none",
                                       profile="measured", regime="mixed-bf16-main-grad", attention="sdpa",
                                       data_parallel="mcore-distopt", runtime_overheads=False, pp_size=pp,
                                       tp_size=run["tp"], ep_size=ep, dp_size=1, gradient_accumulation_steps=m,
                                       **RECIPE, **options)


@pytest.mark.parametrize("rid", sorted(PIPELINE))
def test_pipeline_stage_against_the_measurement(rid):
    """Every phase of a stage under 1F1B at tp 2 (as test_megatron_gpt_oss_pp.py at tp 1, with the whole layer): the
    forward's and backward's peak (the micro-batches in flight) and the backward's end / optimizer step (the held
    tensors, a later stage's last receive buffer), to the byte against hand-derived bytes and the profile."""
    run = PIPELINE[rid]
    m, t, L, stage = run["measured"], run["measured"]["tokens_on_rank"], run["layers"], run["stage"]
    X = t * H * 2
    rank = next(r for r in pipeline_solve(run).ranks if stage in r.stages)
    n = rank.in_flight
    assert n == min(run["pp"] - stage, run["microbatches"]) and rank.layers == L
    # one micro-batch: the stage's input (the embedding's output or the receive buffer), each layer's saved tensors
    # (as measured without pipelining: 2,120 B a token of the rank + the offset scalar, its input the layer below's
    # output; per row received 618 B under expert parallelism), the pseudo-freed output's 2 B (the last stage: the
    # loss); the growth misses the held row_id_maps and a later stage's previous receive buffer, which it replaced
    layers = sum((2120 - 2 * 618) * t + 618 * r + 2 for r in m["received"])
    saved = L * X + layers
    missed = m["held_row_id_map"] + m["held_input"]
    assert m["held_row_id_map"] == L * 68 * t and m["held_input"] == m["held_input_after"] == (X if stage else 0)
    assert m["one_microbatch"] == saved + 2 - missed
    assert m["forward_peak"] == m["before_backward_peak"] == n * (saved + 2) - missed
    assert m["after_iteration"] == 0
    # the profile: the decoder layers 2,240 B a token of the rank a layer (the rsigma 8 B and the offset scalar not
    # counted), the held tensors and counts; under ep the profile routes evenly (T x k rows a layer)
    decoder = term(rank, "decoder layers: saved").nbytes
    held = term(rank, "Megatron-Core alltoall dispatcher's held routing").nbytes
    counts = term(rank, "Megatron-Core alltoall dispatcher's held token counts").nbytes
    assert held == m["held"] and counts == m["held_other"]["num_global_tokens_per_local_expert"]
    measured = n * (saved - L * (8 * t + 2))
    rows = L * t * K - sum(m["received"])
    assert decoder - measured == n * rows * 618
    # the backward's end and the optimizer step: the held tensors, the row_id_maps, a later stage's receive buffer
    after = m["held"] + sum(m["held_other"].values()) + m["held_input_after"]
    for phase in (BACKWARD_END, OPTIMIZER_STEP):
        kept = sum(x.nbytes for x in rank.terms if x.component == "activations" and phase in x.phases and (
            x.label.startswith(("Megatron-Core alltoall", "pipeline receive buffer"))))
        assert kept == after, (phase, kept, after)


def test_the_docs_table_is_current():
    # docs/validation.md's table is what compare_tp.py prints (python validation/megatron_gpt_oss/compare_tp.py --doc)
    compare = load_script("validation/megatron_gpt_oss/compare_tp.py")
    doc = (ROOT / "docs/validation.md").read_text(encoding="utf-8")
    table = "\n".join(compare.rows())
    assert f"{compare.BEGIN}\n\n{table}\n\n{compare.END}" in doc
    # every phase of every run within the targets: median |error| <= 1 %, max <= 5 %
    errors = sorted(abs(float(row.split("|")[-2].strip().rstrip(" %"))) for row in table.splitlines()[2:])
    assert errors[len(errors) // 2] <= 1 and errors[-1] <= 5, errors[-3:]
