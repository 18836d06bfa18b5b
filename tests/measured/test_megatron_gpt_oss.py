"""gpt-oss under the Megatron-Core regime (issue 25 item 4): the MoE layer Megatron-Bridge's gpt-oss recipes run
(``families.megatron_clamped_glu_moe``, ``megatron_alltoall_held``), against hand-derived bytes and the recorded
measurements of validation/megatron_gpt_oss/moe_measurements.json; what stays refused, by name. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, BACKWARD_END, OPTIMIZER_STEP, PHASES
from mlsysim_core.types import HardwareNode
from mlsysim_plugins.measured.families import (megatron_alltoall_counts_held, megatron_alltoall_held,
                                               megatron_alltoall_map_held, megatron_clamped_glu_moe,
                                               megatron_pre_mlp_norm_recomputed)
from mlsysim_plugins.measured.architectures.gpt_oss import GPT_OSS

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "validation/megatron_gpt_oss/moe_measurements.json").read_text(encoding="utf-8"))
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
# A small gpt-oss (h 64, 4 heads of 16, 2 kv heads, 8 experts of width 48, top-2, 2 layers).
TINY = dict(model_type="gpt_oss", vocab_size=1000, hidden_size=64, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=8, num_experts_per_tok=2,
            max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False, rope_theta=150000.0,
            sliding_window=128, layer_types=["sliding_attention", "full_attention"], attention_bias=True,
            swiglu_limit=7.0, hidden_act="silu", router_aux_loss_coef=0.9, output_router_logits=False,
            use_cache=False)
B, S = 2, 64
T = B * S


def solve(checkpointing="none", attention="sdpa", **options):
    if options.get("dp_size", 1) * options.get("cp_size", 1) > 1:     # (the rule the regime requires: Megatron's DDP)
        options.setdefault("data_parallel", "mcore-ddp")
    return TrainingMemoryModel().solve(from_hf_config(TINY, name="gpt-oss-tiny"), BIG, B, S, "bf16", "adamw",
                                       checkpointing, profile="measured", regime="mixed-bf16-main-grad",
                                       attention=attention, runtime_overheads=False, **options)


def term(result, label):
    return next(t for t in result.terms if t.label.startswith(label))


# --- the MoE layer's formula ----------------------------------------------------------------------------------

def test_gpt_oss_20b_moe_bytes_per_token():
    # gpt-oss-20b: h = f = 2880, E = 32, k = 4. Router: int64 indices 8k + fp32 softmax 4k = 48; permute's
    # int32 row_id_map 4 x (2E + 1) = 260; per routed copy bf16 probs 2 + two chunk sorts' int32 maps 8: 40;
    # experts k x (fc1 input 2h + fc1 output 4f + the clamps' cat 4f + fc2 input 2f) = 4 x (5,760 + 28,800).
    parts = megatron_clamped_glu_moe(hidden=2880, ffn=2880, experts=32, top_k=4)
    assert [p.nbytes for p in parts] == [48, 260, 40, 138_240]
    assert [p.split for p in parts] == ["replicated", "replicated", "experts", "experts"]
    assert megatron_alltoall_held(experts=32) == 96          # bf16 [T, E] probs + bool [T, E] map


def test_formula_equals_the_measurements():
    runs = [r for r in RECORD["runs"] if "ep" not in r]
    assert len(runs) == 3 and RECORD["megatron_lm_commit"] == "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
    for run in runs:
        tokens, h, f, E, k = run["tokens"], run["hidden"], run["moe_ffn_hidden_size"], run["experts"], run["top_k"]
        per_token = sum(p.nbytes for p in megatron_clamped_glu_moe(hidden=h, ffn=f, experts=E, top_k=k))
        m = run["measured"]
        # + the activation's bf16 linear_offset scalar (2 B a layer), which the profile does not count; the growth
        # over the start misses the row_id_map that replaced the previous iteration's (held by the dispatcher as
        # reversed_local_input_permutation_mapping): added back
        assert per_token * tokens + 2 == m["saved"] + m["held_other"]["row_id_map"] == m["saved_with_row_id_map"]
        assert megatron_alltoall_held(experts=E) * tokens == m["held"], run["id"]
        assert m["held_other"] == {"row_id_map": megatron_alltoall_map_held(experts=E) * tokens,
                                   "num_global_tokens_per_local_expert":
                                       megatron_alltoall_counts_held(experts=E, local_experts=E)}, run["id"]
        # the held tensors of the previous iteration are replaced: nothing else outlives the backward
        assert run["measured"]["after_backward_over_start"] == 0, run["id"]


def test_formula_equals_the_measurements_under_expert_parallelism():
    # One rank of an expert-parallel group (validation/megatron_gpt_oss/measure_moe.py, EP_CONFIGS): the router,
    # the permute's row_id_map and the held [T, E] tensors per token of the rank (every expert), the probabilities,
    # the chunk sorts' maps (with more than one local expert) and the experts' tensors per row the rank received
    runs = {r["id"]: r for r in RECORD["runs"] if "ep" in r}
    assert sorted(runs) == ["ep2-t128-h64-f48-e8-k4", "ep4-t64-h48-f32-e4-k2", "ep4-t96-h32-f40-e8-k2"]
    for run in runs.values():
        tokens, h, f, E, k, ep = (run[n] for n in ("tokens", "hidden", "moe_ffn_hidden_size", "experts", "top_k", "ep"))
        m = run["measured"]
        received = m["received"]
        router, row_id_map, per_copy, experts = (p.nbytes for p in megatron_clamped_glu_moe(
            hidden=h, ffn=f, experts=E, top_k=k))
        # per row received: bf16 probabilities 2, the two chunk sorts' int32 maps 8 with more than one local
        # expert (the parts assume them: one local expert is refused), the experts 2h + 10f
        sorts = 8 if E // ep > 1 else 0
        per_received_copy = 2 + sorts + 2 * h + 10 * f
        if sorts:
            assert per_received_copy * k == per_copy + experts
        expected = (router + row_id_map) * tokens + per_received_copy * received + 2
        # the growth over the start misses the row_id_map that replaced the previous iteration's (the dispatcher
        # holds it as reversed_local_input_permutation_mapping): added back
        assert m["saved"] + m["held_other"]["row_id_map"] == expected, run["id"]
        assert m["held_other"]["row_id_map"] == megatron_alltoall_map_held(experts=E) * tokens == row_id_map * tokens
        assert m["held_other"].get("num_global_tokens_per_local_expert", 0) == \
            megatron_alltoall_counts_held(experts=E, local_experts=E // ep)
        assert megatron_alltoall_held(experts=E) * tokens == m["held"], run["id"]
        assert m["after_backward_over_start"] == 0, run["id"]
    # the hand-derived bytes of one: 128 tokens, top-4, 532 rows received (the busiest-rank effect of routing),
    # 4 experts a rank: per token 12k 48 + 4(2E + 1) 68; per received row 2 + 8 + 2h + 10f 618
    assert runs["ep2-t128-h64-f48-e8-k4"]["measured"]["received"] == 532
    assert runs["ep2-t128-h64-f48-e8-k4"]["measured"]["saved_with_row_id_map"] == 128 * (48 + 68) + 532 * 618 + 2
    # one expert a rank (E = ep = 4): no chunk sort, per received row 2 + 2h + 10f = 418
    assert runs["ep4-t64-h48-f32-e4-k2"]["measured"]["saved_with_row_id_map"] == 64 * (24 + 36) + 152 * 418 + 2


def test_recompute_modules_formula_equals_the_measurements():
    # Megatron-Core's selective recompute_modules moe_act and layernorm (Megatron-Bridge's GPT-OSS 120B H100 perf
    # recipe) on the pre-MLP norm and the MoE block (validation/megatron_gpt_oss/measure_modules.py): one rank and
    # one rank of 2 under expert parallelism, every combination of the two modules
    record = json.loads((ROOT / "validation/megatron_gpt_oss/modules_measurements.json").read_text(encoding="utf-8"))
    assert record["megatron_lm_commit"] == "d98e8a64ddf34856e74b24714e3bedb2f5a39553" and len(record["runs"]) == 8
    for run in record["runs"]:
        tokens, h, f, E, k, ep = (run[n] for n in ("tokens", "hidden", "moe_ffn_hidden_size", "experts", "top_k", "ep"))
        modules, m = run["recompute_modules"], run["measured"]
        router, row_id_map, per_copy, experts = (p.nbytes for p in megatron_clamped_glu_moe(
            hidden=h, ffn=f, experts=E, top_k=k, recompute_modules=modules))
        moe = (router + row_id_map) * tokens + (per_copy + experts) // k * m["received"]
        # + the activation's offset scalar, saved only when the activation is not checkpointed; the pre-MLP norm
        # (Transformer Engine's RMSNorm stand-in): its output (the router's input) and its fp32 rsigma (4 B a token,
        # which the profile's layer does not count), both released by the layernorm module
        offset = 0 if "moe_act" in modules else 2
        norm = 0 if "layernorm" in modules else (megatron_pre_mlp_norm_recomputed(hidden=h) + 4) * tokens
        assert m["saved_with_row_id_map"] == moe + offset + norm, run["id"]
        assert m["after_backward_over_start"] == 0, run["id"]
        # in the backward each module's recompute (its gradient hook) rebuilds what it released: the layernorm's
        # output (+ its rsigma), then the activation's tensors (+ the offset scalar), per row received; the profile's
        # parts (megatron_recompute_modules) are those bytes less the rsigma and the scalar it never counts
        released = dict(zip(modules, GPT_OSS.megatron_recompute_modules(modules, hidden=h, ffn=f, experts=E,
                                                                         top_k=k)))    # (one part a module, in order)
        expected = []
        if "layernorm" in modules:
            expected.append(released["layernorm"].nbytes * tokens + 4 * tokens)
        if "moe_act" in modules:
            expected.append(released["moe_act"].nbytes // k * m["received"] + 2)
        assert m["rebuilt"] == expected, run["id"]
    # by hand, one rank, 128 tokens, top-4, f 48: moe_act releases the clamps' views and their cat and fc2's input,
    # 6f a routed copy (147,456 B) and the offset scalar; layernorm the norm's output 2h and rsigma (16,896 B)
    saved = {tuple(r["recompute_modules"]): r["measured"]["saved_with_row_id_map"] for r in record["runs"]
             if r["ep"] == 1}
    assert saved[()] == 348_162 and saved[("moe_act",)] == 348_162 - 6 * 48 * 4 * 128 - 2
    assert saved[("layernorm",)] == 348_162 - (2 * 64 + 4) * 128
    assert saved[("layernorm", "moe_act")] == 348_162 - 147_456 - 2 - 16_896
    # by default (no module) the parts are the measured ones of measure_moe.py
    assert megatron_clamped_glu_moe(hidden=64, ffn=48, experts=8, top_k=4) == megatron_clamped_glu_moe(
        hidden=64, ffn=48, experts=8, top_k=4, recompute_modules=("core_attn", "layernorm"))


# --- the whole model -----------------------------------------------------------------------------------------

def test_tiny_gpt_oss_under_megatron_hand_derived():
    r = solve()
    # per token and layer: layernorm inputs 4h 256, qkv input 2h 128, q/k/v 2(q + 2kv) 256, fused attention's
    # fp32 statistics 4a 16, out-proj input 2q 128, mlp input 2h 128; MoE: router 12k 24, row_id_map
    # 4(2E + 1) 68, probs and sorts' maps k(2 + 8) 20, experts k(2h + 10f) 1,216: 2,240
    assert term(r, "decoder layers: saved").nbytes == 2 * T * 2240
    # final norm as every family's under this regime (RMSNorm: 8h + 4 per token), not transformers' gpt-oss norm
    assert term(r, "final norm").nbytes == T * (8 * 64 + 4)
    held = term(r, "Megatron-Core alltoall dispatcher's held routing")
    assert held.nbytes == 2 * T * 3 * 8 and tuple(held.phases) == PHASES
    # the permute's row_id_map (4(2E + 1) = 68 B a token), a saved part until the layer's backward, held after it;
    # the int64 token counts (8E a layer), held in every phase
    kept = term(r, "Megatron-Core alltoall dispatcher's held permutation map")
    assert kept.nbytes == 2 * T * 68 and tuple(kept.phases) == (BACKWARD_END, OPTIMIZER_STEP)
    counts = term(r, "Megatron-Core alltoall dispatcher's held token counts")
    assert counts.nbytes == 2 * 8 * 8 and tuple(counts.phases) == PHASES
    # the rotary table is head_dim wide under Megatron-Core (emb = cat(freqs, freqs)): 2 x s x 16 x 2 B
    assert term(r, "RoPE cos/sin tables").nbytes == 2 * S * 16 * 2
    labels = " ".join(t.label for t in r.terms)
    assert "eager attention masks" not in labels and "first layer's attention backward" not in labels
    assert any("measured to the byte (validation/megatron_gpt_oss)" in n for n in r.notes)


def test_selective_keeps_what_none_keeps():
    # Korthikanti's selective recompute drops only the parts marked recomputed_by_selective: with fused attention
    # and this MoE layer there are none (the CLI's default checkpointing under the regime)
    assert [(t.label, t.nbytes, t.phases) for t in solve("selective").terms if t.component == "activations"] == \
        [(t.label, t.nbytes, t.phases) for t in solve("none").terms if t.component == "activations"]


def test_tiny_gpt_oss_under_expert_parallelism_hand_derived():
    # ep 2 over dp 2 (4 experts a rank), global batch 2: a micro-batch of 1, 64 tokens a rank
    r = solve(ep_size=2, dp_size=2)
    t = S
    # per token and layer the same 2,240 B as on one device (balanced routing: T x k copies a rank; the row_id_map
    # and the router over all 8 experts; two or more local experts, so both chunk sorts)
    assert term(r, "decoder layers: saved").nbytes == 2 * t * 2240
    assert term(r, "Megatron-Core alltoall dispatcher's held routing").nbytes == 2 * t * 3 * 8
    assert term(r, "Megatron-Core alltoall dispatcher's held permutation map").nbytes == 2 * t * 68
    # the token counts: [ep, E / ep] int64 = 8E a layer
    assert term(r, "Megatron-Core alltoall dispatcher's held token counts").nbytes == 2 * 8 * 8
    # the experts' weights over the 2 ranks: 304,344 parameters less half of 2 layers x (gate_up 8 x 64 x 96 + its
    # bias 8 x 96 + down 8 x 48 x 64 + its bias 8 x 64 = 75,008), in bf16
    assert term(r, "parameters").nbytes == (304_344 - 75_008) * 2
    # the profile's all-to-all send + receive buffers (not measured): 2 x T x k x h x 2 B
    assert term(r, "expert all-to-all dispatch + combine buffers").nbytes == 2 * t * 2 * 64 * 2
    assert any("under expert parallelism (ep 2, 4 experts a rank" in n for n in r.notes)
    # the busiest rank's load scales what is per routed copy (probabilities, sorts' maps, experts: 2 x (2 + 8) +
    # 1,216 = 1,236 of the 2,240)
    heavy = solve(ep_size=2, dp_size=2, moe_routing_imbalance=1.5)
    assert term(heavy, "decoder layers: saved").nbytes == 2 * t * (2240 - 1236 + 1.5 * 1236)


@pytest.mark.parametrize("options, parameter, allowed", [
    (dict(ep_size=8, dp_size=8), "ep_size", "a divisor of the 8 experts below 8 (two or more experts on a rank)"),
    (dict(ep_size=2, dp_size=2, tp_size=2), "sequence_parallel", "True with tp_size > 1 for gpt-oss"),
    (dict(attention="eager"), "attention", "computes='sdpa'"),
    (dict(checkpointing="every-k"), "activation_checkpointing", "'none', 'selective' or 'full' (every layer"),
    (dict(tp_size=2, dp_size=1), "sequence_parallel", "True with tp_size > 1 for gpt-oss"),
    (dict(cp_size=2, dp_size=1), "cp_size", "1 for gpt-oss under 'mixed-bf16-main-grad'"),
    (dict(dropout=0.1), "dropout", "0.0 for gpt-oss"),
    (dict(moe_capacity_factor=1.25), "moe_capacity_factor", "None (dropless)"),
])
def test_what_stays_refused(options, parameter, allowed):
    with pytest.raises(NotModelledError) as err:
        solve(**options)
    assert err.value.parameter == parameter and allowed in str(err.value)


# --- Megatron-Core's selective recompute_modules (the selective strategy's modules) ----------------------------

def modules(*names):
    return {"plugin_options": {"selective": {"modules": list(names)}}}


def test_recompute_modules_hand_derived():
    # Megatron-Bridge's GPT-OSS 120B H100 perf recipe: recompute_modules ["layernorm", "moe_act"]. Per token and
    # layer the 2,240 B less the pre-MLP norm's output 2h (128) and the activation's tensors 6f a routed copy
    # (2 x 288 = 576): 1,536 B; one layer's 704 B rebuilt in its backward
    r = solve("selective", **modules("layernorm", "moe_act"))
    assert term(r, "decoder layers: saved").nbytes == 2 * T * (2240 - 128 - 576)
    rebuilt = term(r, "recompute modules layernorm, moe_act")
    assert rebuilt.nbytes == T * (128 + 576) and tuple(rebuilt.phases) == (BACKWARD, BACKWARD_END)
    assert term(solve("selective", **modules("moe_act")), "decoder layers: saved").nbytes == 2 * T * (2240 - 576)
    # the per-token bytes are the measured ones (test_recompute_modules_formula_equals_the_measurements)
    assert [p.nbytes for p in GPT_OSS.megatron_recompute_modules(("layernorm", "moe_act"), hidden=64, ffn=48,
                                                                  experts=8, top_k=2)] == [128, 576]


def test_recompute_modules_default_is_byte_identical():
    # Megatron-Core's default, core_attn: the selective strategy as it was (nothing recomputed with fused attention)
    base = [(t.label, t.nbytes, t.phases) for t in solve("selective").terms]
    assert [(t.label, t.nbytes, t.phases) for t in solve("selective", **modules("core_attn")).terms] == base
    assert not any(t.label.startswith("recompute modules") for t in solve("selective").terms)


def test_recompute_modules_under_expert_parallelism_follow_the_busiest_rank():
    # ep 2 over dp 2 (64 tokens a rank): the experts' released bytes scale with the routing imbalance, as the experts'
    # saved parts do; the norm's output does not
    heavy = solve("selective", ep_size=2, dp_size=2, moe_routing_imbalance=1.5, **modules("layernorm", "moe_act"))
    plain = solve("selective", ep_size=2, dp_size=2, moe_routing_imbalance=1.5)
    released = S * (128 + 1.5 * 576)
    assert term(plain, "decoder layers: saved").nbytes - term(heavy, "decoder layers: saved").nbytes == 2 * released
    assert term(heavy, "recompute modules layernorm, moe_act").nbytes == released


@pytest.mark.parametrize("value, message", [
    (["moe"], "plugin_options['selective'].modules='moe' is not allowed: one of core_attn, layernorm, moe_act"),
    ([], "plugin_options['selective'].modules=() is not allowed: a non-empty list of Megatron-Core recompute modules"),
    (["core_attn", "mlp"], "plugin_options['selective'].modules='mlp' is not allowed: one of core_attn, layernorm, "
                           "moe_act"),
])
def test_recompute_modules_bad_input(value, message):
    with pytest.raises(InvalidInputError) as err:
        solve("selective", plugin_options={"selective": {"modules": value}})
    assert err.value.parameter == "plugin_options['selective']" and message in str(err.value)


def test_recompute_modules_refused_where_not_described():
    llama = dict(TINY, model_type="llama", num_local_experts=None, num_experts_per_tok=None)
    with pytest.raises(NotModelledError) as err:     # a family that declares none
        TrainingMemoryModel().solve(from_hf_config({k: v for k, v in llama.items() if v is not None}, name="llama-tiny"),
                                    BIG, B, S, "bf16", "adamw", "selective", profile="measured",
                                    regime="mixed-bf16-main-grad", runtime_overheads=False, **modules("layernorm"))
    assert err.value.parameter == "plugin_options['selective'].modules" and "megatron_recompute_modules" in str(err.value)
    with pytest.raises(NotModelledError) as err:     # outside Megatron-Core
        TrainingMemoryModel().solve(from_hf_config(TINY, name="gpt-oss-tiny"), BIG, B, S, "bf16", "adamw", "selective",
                                    profile="measured", regime="bf16", attention="eager", runtime_overheads=False,
                                    **modules("moe_act"))
    assert "a regime with main_grad" in str(err.value)
    with pytest.raises(NotModelledError) as err:     # the reference profile: Korthikanti's attention core only
        TrainingMemoryModel().solve(from_hf_config(TINY, name="gpt-oss-tiny"), BIG, B, S, "bf16", "adamw", "selective",
                                    profile="reference", **modules("moe_act"))
    assert "['core_attn'] under the reference profile" in str(err.value)


def test_the_published_h100_recipe_as_configured():
    # Megatron-Bridge 067f987 perf_recipes/gpt_oss/h100/gpt_oss.py gpt_oss_120b_pretrain_64gpu_h100_bf16_config: pp 4,
    # ep 8 (dp 16), micro-batch 1, global batch 1280, sequence 4096, recompute_modules ["layernorm", "moe_act"]
    # (selective), grad_reduce_in_fp32 False (_perf_precision: the mcore-distopt rule's grad_reduce_in_bf16)
    def run(checkpointing, **options):
        return TrainingMemoryModel("measured").solve(
            "gpt-oss-120b", "h100", 1280, seq_len=4096, precision="bf16", regime="mixed-bf16-main-grad",
            data_parallel="mcore-distopt", activation_checkpointing=checkpointing, pp_size=4, ep_size=8, dp_size=16,
            gradient_accumulation_steps=80, **options)
    bf16 = {"mcore-distopt": {"grad_reduce_in_bf16": True}}
    recipe = run("selective", plugin_options={**bf16, "selective": {"modules": ["layernorm", "moe_act"]}})
    plain = run("selective", plugin_options=bf16)
    first, first_plain = recipe.ranks[0], plain.ranks[0]
    assert first.in_flight == 4 and first.layers == 9
    # per token and layer the pre-MLP norm's output 2h and the experts' activation tensors 6f x k: h = f = 2,880, k 4
    per_layer = 4096 * (2 * 2880 + 6 * 2880 * 4)
    saved, saved_plain = (next(t for t in r.terms if t.label.startswith("decoder layers: saved"))
                          for r in (first, first_plain))
    assert saved_plain.nbytes - saved.nbytes == 9 * 4 * per_layer
    assert next(t for t in first.terms if t.label.startswith("recompute modules")).nbytes == per_layer
    assert recipe.feasible and max(r.total_memory for r in recipe.ranks) < 80 * 2**30
