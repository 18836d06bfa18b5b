"""gpt-oss under the Megatron-Core regime with full recomputation (recompute_granularity "full", method "uniform",
one layer a chunk; issue 25 item 4): every phase of one device and of the stages of a 1F1B pipeline, with and
without expert parallelism, against the recorded measurements of
validation/megatron_gpt_oss/recompute_measurements.json (Megatron-Core's checkpointed_forward and CheckpointFunction
run from its source around measure_moe.py's MoE layer) and hand-derived bytes. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP
from mlsysim_core.types import HardwareNode
from mlsysim_plugins.measured.families import megatron_alltoall_map_held, megatron_clamped_glu_moe

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "validation/megatron_gpt_oss/recompute_measurements.json").read_text(encoding="utf-8"))
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
SHAPE = RECORD["shape"]
H, F, E, K, T = (SHAPE[n] for n in ("hidden", "moe_ffn_hidden_size", "experts", "top_k", "tokens"))
X = T * H * 2              # a layer's input (the residual stream, bf16): what the checkpoint saves
MAP = T * megatron_alltoall_map_held(experts=E)     # one layer's permutation map
RUNS = RECORD["runs"]
# the profile's per-token layer (test_megatron_gpt_oss.py: 2,240 B) less the MoE parts and the MLP input (1,456 B),
# which the harness runs: the attention's and norms' 784 B; the recompute working set adds the layer's output (2h)
# and the MLP backward's activation gradients (2 x k x f x 2 B), a transient the measured moments do not hold
ATTENTION_AND_NORMS = 784 * T
MLP_GRADS = 2 * T * K * F * 2


def tiny(layers):
    """The tiny gpt-oss of test_megatron_gpt_oss.py (h 64, 8 experts of width 48, top-2) with ``layers`` layers."""
    return dict(model_type="gpt_oss", vocab_size=1000, hidden_size=H, intermediate_size=F, num_hidden_layers=layers,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=E,
                num_experts_per_tok=K, max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
                rope_theta=150000.0, sliding_window=128,
                layer_types=["sliding_attention", "full_attention"] * max(1, layers // 2), attention_bias=True,
                swiglu_limit=7.0, hidden_act="silu", router_aux_loss_coef=0.9, output_router_logits=False,
                use_cache=False)


def solve(layers, pp, m, ep=1, checkpointing="full", **options):
    # a micro-batch of one sequence of T tokens on each of the ep data-parallel ranks, m of them an iteration
    return TrainingMemoryModel().solve(from_hf_config(tiny(layers), name="gpt-oss-tiny"), BIG, ep * m, T, "bf16",
                                       "adamw", checkpointing, profile="measured", regime="mixed-bf16-main-grad",
                                       data_parallel="mcore-distopt", attention="sdpa", runtime_overheads=False,
                                       pp_size=pp, ep_size=ep, dp_size=ep, gradient_accumulation_steps=m, **options)


def rank_of(result, stage):
    return next((r for r in result.ranks if stage in r.stages), result) if result.ranks else result


def recompute_terms(rank, phase):
    """The rank's terms of the recomputed layers and the dispatcher (what the harness runs), in ``phase``."""
    return [t for t in rank.terms if t.component == "activations" and phase in t.phases and t.label.startswith(
        ("checkpointed", "recompute", "Megatron-Core alltoall"))]


def moe_share(terms):
    """The terms' bytes with the recompute working sets' attention, norms and MLP gradients left out."""
    return sum(t.nbytes - (ATTENTION_AND_NORMS + MLP_GRADS if t.label.startswith("recompute working set") else 0)
               for t in terms)


def test_the_record():
    assert RECORD["megatron_lm_commit"] == "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
    assert RECORD["recompute"] == {"recompute_granularity": "full", "recompute_method": "uniform",
                                   "recompute_num_layers": 1}
    assert len(RUNS) == 10


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_recompute_against_the_measurement(run):
    """Hand-derived bytes of every measured moment, to the byte, and the profile's rank within 1 % of each phase
    (the forward's end, a micro-batch's backward at its bottom layer's recompute, the backward's end, the
    optimizer step)."""
    pp, stage, m, L, ep = (run[n] for n in ("pp", "stage", "microbatches", "layers", "ep"))
    meas = run["measured"]
    n = min(pp - stage, m)                      # 1F1B's micro-batches in flight
    last = stage == pp - 1
    received = meas["received"]
    router, row_id_map, per_copy, experts = (p.nbytes for p in megatron_clamped_glu_moe(
        hidden=H, ffn=F, experts=E, top_k=K))
    per_row = (per_copy + experts) // K
    # one layer's recomputed MoE tensors: per token the router and the permutation map, per received row the rest,
    # the router's input (the layer's input here: the checkpoint's storage) not again; + the 2 B offset scalar
    layer_moe = [(router + row_id_map) * T + per_row * r + 2 for r in received]
    held, counts = meas["held"], meas["held_other"]["num_global_tokens_per_local_expert"]
    assert meas["held_other"]["row_id_map"] == meas["held_row_id_map"] == L * MAP
    # after the backward: every layer's detached input and its .grad, held by the recomputed probabilities' graph
    graph = meas["held_graph"]
    assert graph == {"inputs": L * X, "input_grads": L * X, "inputs_after": L * X, "input_grads_after": L * X}
    start = held + counts + L * MAP + 2 * L * X     # what the previous iteration left (the growth is over it)
    assert meas["after_iteration"] == 0
    # the forward's end: n micro-batches' checkpointed inputs (+ 2 B each pseudo-freed output)
    forward = n * L * X + held + counts + L * MAP
    assert meas["forward_peak"] + start == forward + 2 * n
    # before a cool-down backward (a stage with warm-up forwards): the n - 1 in flight, and the previous
    # micro-batch's inputs and input gradients (n + 1 inputs' worth); else n in flight
    cool = n + 1 if n > 1 else n
    assert meas["before_backward_peak"] + start == cool * L * X + held + counts + L * MAP + 2 * max(n - 1, 1)
    # the first backward's bottom-layer recompute: n in flight, the L - 1 upper layers' input gradients, the
    # recomputed layer (with its output) in place of its held map; a later stage's received gradient (the
    # profile's pipeline buffer term); the bf16 loss and its gradient (the last stage), the pseudo-freed outputs
    recv, loss = (0, 4) if last else (X, 0)
    bottom = n * L * X + (L - 1) * X + layer_moe[0] + X + (L - 1) * MAP + held + counts
    assert meas["recompute_peak"] + start == bottom + recv + loss + 2 * n
    # the backward's end: the last micro-batch's bottom-layer recompute (its L inputs, L - 1 input gradients)
    end = L * X + (L - 1) * X + layer_moe[0] + X + (L - 1) * MAP + held + counts
    assert meas["after_recompute"][-1] + start == end + recv + loss + 2
    after = L * X * 2 + held + counts + L * MAP
    # the profile, with the measured routing (the busiest layer's rows: moe_routing_imbalance)
    options = {} if ep == 1 else {"moe_routing_imbalance": received[0] / (T * K)}
    rank = rank_of(solve(L * pp, pp, m, ep, **options), stage)
    assert getattr(rank, "in_flight", 1) == n
    measured = {FORWARD: forward, BACKWARD: bottom, BACKWARD_END: end, OPTIMIZER_STEP: after}
    for phase, value in measured.items():
        profile = moe_share(recompute_terms(rank, phase))
        assert abs(profile / value - 1) < 0.01, (phase, profile, value)
    assert moe_share(recompute_terms(rank, FORWARD)) == forward
    assert moe_share(recompute_terms(rank, OPTIMIZER_STEP)) == after


def test_tiny_hand_derived_terms():
    # 2 layers on one device: the checkpointed inputs 2 X; the recompute working set per token 2,240 + output 128
    # + MLP gradients 384, less the input (128) in a micro-batch's backward; the upper layer's input gradient X;
    # at the backward's end the bottom layer's recompute with one input and one gradient more; after it both
    # layers' inputs and gradients
    r = solve(2, 1, 1)
    by = {t.label: t for t in r.terms}
    assert by["checkpointed layers: their inputs"].nbytes == 2 * X
    assert by["recompute working set in a micro-batch's backward (one layer)"].nbytes == T * (2240 + 128 + 384) - X
    assert tuple(by["recompute working set in a micro-batch's backward (one layer)"].phases) == (BACKWARD,)
    held = by["checkpointed inputs and their gradients held by the dispatcher's probabilities (after the backward)"]
    assert held.nbytes == 4 * X and tuple(held.phases) == (OPTIMIZER_STEP,)
    end = by["checkpointed inputs and input gradients held by the dispatcher's probabilities (at the first "
             "layer's recompute)"]
    assert end.nbytes == 2 * X and tuple(end.phases) == (BACKWARD_END,)
    assert by["Megatron-Core alltoall dispatcher's held permutation map"].nbytes == 2 * MAP
    assert not [t for t in r.terms if t.label.startswith("pipeline receive buffer")]


def test_the_published_layout_solves_with_full_recompute():
    # Megatron-Bridge's GPT-OSS 120B on 64 H100 (pp 4, ep 8, dp 16, micro-batch 1, sequence 4096)
    r = TrainingMemoryModel("measured").solve(
        "gpt-oss-120b", "h100", 8 * 16, seq_len=4096, precision="bf16", regime="mixed-bf16-main-grad",
        data_parallel="mcore-distopt", activation_checkpointing="full", pp_size=4, ep_size=8, dp_size=16,
        gradient_accumulation_steps=8)
    assert r.feasible and max(x.total_memory for x in r.ranks) < 80 * 2**30
    assert any("full recompute" in n for n in r.notes)


@pytest.mark.parametrize("shape, options, parameter", [
    ((2, 1, 1), dict(checkpointing="every-k"), "activation_checkpointing"),
    # Megatron-Core's block recompute is measured on one stage only (test_megatron_gpt_oss_tp.py)
    ((4, 2, 2), dict(checkpointing="full", checkpointed_layers=1), "checkpointed_layers"),
])
def test_what_stays_refused(shape, options, parameter):
    with pytest.raises(NotModelledError) as err:
        solve(*shape, **options)
    assert err.value.parameter == parameter
