"""The gpt-oss family (plugins/mlsysim_plugins/measured/architectures/gpt_oss.py) against its
measurements (validation/families/gpt_oss), its hand-derived bytes, and what it refuses. No torch."""

from __future__ import annotations

import statistics
import sys

import pytest

from familytools import FAMILIES_DIR, PHASES, family_configs, family_runs, phase_errors, solve_run
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.types import SparseTransformerWorkload
from mlsysim_plugins.measured.architectures import gpt_oss
from mlsysim_plugins.measured.families import family_for
from mlsysim_plugins.measured.kernels import EAGER

RUNS = [r for r in family_runs("gpt_oss") if "measured" in r]


def family_runs_file(directory: str, name: str) -> list[dict]:
    import json
    return json.loads((FAMILIES_DIR / directory / name).read_text(encoding="utf-8"))["runs"]

CONFIGS = family_configs("gpt_oss")
RAW = ("layer_types", "sliding_window", "attention_bias", "head_dim", "swiglu_limit", "quantization_config")


def workload(hf: dict, name: str = "gpt-oss", **details) -> SparseTransformerWorkload:
    """The workload of a gpt-oss config: ``mlsysim_core.hf.from_hf_config`` where it knows gpt_oss,
    else built here from the same keys (parameters: the family's exact count)."""
    try:
        from mlsysim_core.hf import from_hf_config
        model = from_hf_config(hf, name=name)
    except InvalidInputError:   # model_type gpt_oss not (yet) supported by hf.py
        kw = dict(name=name, parameters=1, active_parameters=1, layers=hf["num_hidden_layers"],
                  hidden_dim=hf["hidden_size"], heads=hf["num_attention_heads"], kv_heads=hf["num_key_value_heads"],
                  head_dim=hf["head_dim"], vocab_size=hf["vocab_size"], ffn_dim=hf["intermediate_size"],
                  gated_mlp=True, tied_embeddings=hf["tie_word_embeddings"],
                  context_length=hf["max_position_embeddings"], architecture="gpt_oss",
                  details={k: hf[k] for k in RAW if k in hf}, experts=hf["num_local_experts"],
                  active_experts_per_token=hf["num_experts_per_tok"], expert_ffn_dim=hf["intermediate_size"])
        n = gpt_oss.count_parameters(SparseTransformerWorkload(**kw))
        model = SparseTransformerWorkload(**{**kw, "parameters": n, "active_parameters": n})
    if details:
        import attrs
        model = attrs.evolve(model, details={**model.details, **details})
    return model


def solve(run: dict, model=None, **options):
    return solve_run(run, model or workload(run["hf_config"], run["id"]), **options)


def errors(run: dict) -> dict:
    return phase_errors(run, solve(run))


# --- the measurements --------------------------------------------------------------------------------

def test_the_runs_cover_the_mechanisms():
    ids = {r["id"] for r in RUNS}
    assert ids == {c["id"] for c in CONFIGS.CONFIGS}
    kinds = {(r["regime"], r["checkpointing"], r["method"]) for r in RUNS}
    assert {("fp32", "none", "real"), ("bf16", "none", "real"), ("fp32", "full", "real"), ("bf16", "full", "real"),
            ("amp-bf16", "none", "real"), ("bf16", "none", "fake")} <= kinds
    assert all(r["measured"]["attn_implementation"] == "eager" for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_every_phase_within_target(run):
    e = errors(run)
    assert all(abs(v) <= 0.10 for v in e.values()), e


def test_median_errors_within_target():
    all_errors = [errors(r) for r in RUNS]
    assert statistics.median(abs(e["peak"]) for e in all_errors) <= 0.03
    assert statistics.median(abs(e[p]) for e in all_errors for p in PHASES) <= 0.03


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_parameters_exact(run):
    assert workload(run["hf_config"]).parameters == run["measured"]["parameters"]
    assert gpt_oss.count_parameters(workload(run["hf_config"])) == run["measured"]["parameters"]


def test_public_parameter_counts():
    # openai's model card: gpt-oss-20b 20.91B, gpt-oss-120b 116.83B parameters (bf16 dequantized)
    for layers, experts, total in ((24, 32, 20_914_757_184), (36, 128, 116_829_156_672)):
        hf = CONFIGS._gpt_oss(2880, 2880, layers, 64, 8, 64, 201088, experts, 4, 128)
        assert gpt_oss.count_parameters(workload(hf)) == total


# --- hand-derived bytes --------------------------------------------------------------------------------

def test_sink_attention_bytes():
    # fp32, 8 heads of 48 (q = 384), s = 256: q, repeated k, repeated v 3 x 4 x 384; the int64 max
    # indices 8 x 8; the softmax over the s scores + the sink: 4 x 8 x 257; o_proj's input 4 x 384.
    parts = gpt_oss.eager_sinks(kind="fp32", dropout=False, heads=8, q_dim=384, kv_dim=96, hidden=256, seq_len=256,
                                tokens=512)
    assert [p.nbytes for p in parts] == [3 * 4 * 384, 64, 4 * 8 * 257, 4 * 384]
    # bf16: softmax in bf16 (dtype=logits.dtype), 2 x a x (s + 1), not Llama's fp32 4 x a x s (+ its bf16 copy)
    bf16 = gpt_oss.eager_sinks(kind="bf16", dropout=False, heads=8, q_dim=384, kv_dim=96, hidden=256, seq_len=256,
                               tokens=512)
    assert bf16[2].nbytes == 2 * 8 * 257
    # AMP: fp32 softmax with the sink + the bf16 copy of its s columns the matmul saves
    amp = gpt_oss.eager_sinks(kind="amp-bf16", dropout=False, heads=8, q_dim=384, kv_dim=96, hidden=256, seq_len=256,
                              tokens=512)
    assert amp[3].nbytes == 4 * 8 * 257 + 2 * 8 * 256


def test_layer_bytes_by_hand():
    # bf16, h = 256, f = 192, k = 2 of E = 8, per token: two norms 2 x (10h + 4) (the fp32 normalized
    # x is saved by the weight multiply); the router's top-k indices 8k and softmax 2k; four int64
    # index tensors 32k; the experts 2 x k x (2h + 7f) (input, gate_up 2f, clamped gate, sigmoid, glu,
    # up + 1, down input, down output); the gathered routing weights 2k; no mid residual in bf16.
    T, h, f, k = 512, 256, 192, 2
    lb = gpt_oss.gpt_oss_layer(attention=lambda **kw: (), hidden=h, heads=8, kv_heads=2, head_dim=48, ffn=f,
                               experts=8, top_k=k, regime="bf16", dropout=False, tokens=T, seq_len=256)
    per_token = 2 * (10 * h + 4) + 8 * k + 2 * k + 32 * k + 2 * k * (2 * h + 7 * f) + 2 * k
    assert lb.saved == T * per_token + 4 * 8
    assert lb.output == 2 * T * h and not lb.output_saved_by_next


def test_rope_tables_are_half_width():
    run = next(r for r in RUNS if r["id"] == "gpt-oss-tiny-fp32-eager")
    term = next(t for t in solve(run).terms if t.label == "RoPE cos/sin tables")
    assert term.nbytes == 2 * 256 * 24 * 4       # cos and sin: s x head_dim / 2 x 4 B


def test_eager_masks_kept_by_checkpointed_layers():
    # one additive (b, 1, s, s) mask per layer type (sliding, full) in the embeddings' dtype (fp32):
    # 2 x 2 x 256 x 256 x 4 B, kept as the checkpointed layers' inputs; none without checkpointing
    run = next(r for r in RUNS if r["id"] == "gpt-oss-tiny-fp32-eager-ckpt")
    term = next(t for t in solve(run).terms if t.label.startswith("eager attention masks"))
    assert term.nbytes == 2 * 2 * 256 * 256 * 4
    plain = next(r for r in RUNS if r["id"] == "gpt-oss-tiny-fp32-eager")
    assert not [t for t in solve(plain).terms if t.label.startswith("eager attention masks")]


def test_first_layer_attention_backward():
    # gpt-oss-120b at 2 layers, bf16, s = 2048: the backward peaks in layer 0's max backward (measured:
    # aten.scatter.src in layers.0.self_attn) with the input norm 10h + 4, q and the repeated k
    # 2 x 2 x 4096, the max indices 8 x 64 and three 2 x 64 x 2049 tensors per token kept; the term is
    # what that adds over the end-of-backward terms (the embedding's gradient V x h x 2 B being computed
    # and the embedding output's T x h x 2 B)
    run = next(r for r in RUNS if r["id"] == "gpt-oss-120b-2L-bf16-eager-fake")
    assert run["measured"]["peak_by_phase"]["backward"]["op"] == "aten.scatter.src"
    term = next(t for t in solve(run).terms if t.label.startswith("first layer's attention backward"))
    T, h, V = 2048, 2880, 201088
    working = T * ((10 * h + 4) + 2 * 2 * 4096 + 8 * 64 + 3 * 2 * 64 * 2049)
    assert term.nbytes == working - (V * h * 2 + T * h * 2)


def test_measured_layers_match_the_walker():
    # validation/measure.py records each decoder layer's growth of live memory in its forward
    for run in RUNS:
        if run["checkpointing"] != "none" or run["regime"] == "amp-bf16":
            continue
        hf = run["hf_config"]
        lb = gpt_oss.GPT_OSS.layer_bytes(
            kernel=EAGER, device="cpu", hidden=hf["hidden_size"], heads=hf["num_attention_heads"],
            kv_heads=hf["num_key_value_heads"], head_dim=hf["head_dim"], ffn=hf["intermediate_size"],
            experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"], regime=run["regime"], dropout=False,
            tokens=run["batch_size"] * run["seq_len"], seq_len=run["seq_len"])
        for measured in run["measured"]["layer_forward_retained_bytes"][1:]:
            assert measured == pytest.approx(lb.retained, rel=0.01), run["id"]


# --- choice and refusals -----------------------------------------------------------------------------

def test_chosen_with_no_approximation_note():
    from mlsysim_plugins.measured.families import BUILTIN_FAMILIES
    model = workload(CONFIGS.GPT_OSS_TINY)
    family, notes = family_for(model, {**BUILTIN_FAMILIES, "gpt_oss": gpt_oss.GPT_OSS})
    assert family is gpt_oss.GPT_OSS and notes == ()
    result = solve(RUNS[0])
    assert not [n for n in result.notes if "approximation" in n]


def test_sdpa_costed_as_the_eager_fallback_with_a_note():
    # transformers 5.23: attn_implementation="sdpa" raises for gpt-oss, none given runs eager
    run = RUNS[0]
    eager, sdpa = solve(run), solve(run, attention="sdpa")
    assert sdpa.total_memory == eager.total_memory
    assert any("_supports_sdpa = False" in n and "costed as eager" in n for n in sdpa.notes)
    assert not any("_supports_sdpa" in n for n in eager.notes)


def test_other_kernels_refused():
    import types
    from mlsysim_plugins.measured.kernels import AttentionKernel
    flex = AttentionKernel(name="flex", description="x", layouts={})
    # (a kernel with no formula for the sinks layout: the family's check refuses it by name)
    options = types.SimpleNamespace(attention="flex", attention_kernel=flex, regime=None)
    with pytest.raises(NotModelledError, match=r"attention=.flex.*of which eager and flex_attention .* are modelled"):
        gpt_oss.check(types.SimpleNamespace(profile_options=options, model=workload(CONFIGS.GPT_OSS_TINY)))


# --- flex_attention with sinks (a kernel declaring computes="flex", sinks="lse") --------------------------

FLEX_RUNS = [r for r in family_runs_file("gpt_oss", "flex_sinks_measurements.json") if "measured" in r]


def test_flex_runs_cover_the_regimes():
    assert {r["id"] for r in FLEX_RUNS} == {c["id"] for c in CONFIGS.FLEX_SINKS_CONFIGS}
    assert {(r["regime"], r["checkpointing"]) for r in FLEX_RUNS} == {
        ("fp32", "none"), ("bf16", "none"), ("amp-bf16", "none"), ("fp32", "full"), ("bf16", "full")}
    assert all(r["attention"] == "flex_attention" for r in FLEX_RUNS)


@pytest.mark.parametrize("run", FLEX_RUNS, ids=lambda r: r["id"])
def test_flex_every_phase_within_target(run):
    e = errors(run)
    assert all(abs(v) <= 0.05 for v in e.values()), e


def test_flex_median_error_within_target():
    all_errors = [errors(r) for r in FLEX_RUNS]
    assert statistics.median(abs(e[p]) for e in all_errors for p in PHASES) <= 0.01


def test_flex_sinks_bytes_by_hand():
    # 8 heads of 48 (q = 384), 2 KV heads (kv = 96), s = 256. fp32: q, k, v 4 x (384 + 2 x 96); the output
    # 4 x 384 + the fp32 log-sum-exp 4 x 8; the renormalisation (cat 2a, logsumexp a, exp a) 4 x 4 x 8; o_proj's
    # input 4 x 384. On the CPU (uncompiled) the autograd function also keeps the fp32 row maxima, 4 x 8.
    kw = dict(dropout=False, heads=8, q_dim=384, kv_dim=96, hidden=256, seq_len=256, tokens=512)
    fp32 = gpt_oss.flex_sinks(kind="fp32", **kw)
    assert [p.nbytes for p in fp32] == [4 * 576, 4 * 384 + 32, 4 * 4 * 8, 4 * 384]
    assert [p.nbytes for p in gpt_oss.flex_sinks(kind="fp32", device="cpu", **kw)][1] == 4 * 384 + 32 + 32
    # bf16: 2-byte tensors, the renormalisation in bf16 (2 x 4a); autocast: bf16 casts into flex_attention,
    # the renormalisation in fp32, o_proj's bf16 cast
    assert [p.nbytes for p in gpt_oss.flex_sinks(kind="bf16", **kw)] == [2 * 576, 2 * 384 + 32, 2 * 4 * 8, 2 * 384]
    assert [p.nbytes for p in gpt_oss.flex_sinks(kind="amp-bf16", **kw)] == [2 * 576, 2 * 384 + 32, 4 * 4 * 8,
                                                                             2 * 384]
    # 6 query heads (not a power of two): transformers repeats k and v to all heads (repeat_kv)
    six = gpt_oss.flex_sinks(kind="bf16", **{**kw, "heads": 6, "q_dim": 288})
    assert six[0].nbytes == 2 * 3 * 288
    # no s in any of them: the bytes per token do not grow with the sequence
    long = gpt_oss.flex_sinks(kind="bf16", **{**kw, "seq_len": 131072})
    assert [p.nbytes for p in long] == [p.nbytes for p in gpt_oss.flex_sinks(kind="bf16", **kw)]


def test_flex_keeps_block_masks_not_the_eager_terms():
    # one BlockMask per layer type (sliding, full): 4 x b x (n^2 + n) int32 with n = ceil(256 / 128) = 2 blocks;
    # no additive (b, 1, s, s) masks under checkpointing, no first-layer s x (s + 1) backward moment
    for run in FLEX_RUNS:
        labels = {t.label: t.nbytes for t in solve(run).terms}
        assert labels["flex_attention block masks (saved by every layer)"] == 2 * 4 * 2 * (2 * 2 + 2) * 4
        assert not [k for k in labels if k.startswith(("eager attention masks", "first layer's attention"))]


def test_flex_is_what_the_kernel_declares_not_its_name():
    import attrs
    from mlsysim_core import TrainingMemoryModel, hookimpl
    from mlsysim_core.manager import PluginManager
    from mlsysim_plugins.measured.kernels import FLEX_ATTENTION
    mine = attrs.evolve(FLEX_ATTENTION, name="myorg.flex-sinks", description="flex_attention, as myorg runs it")
    no_sinks = attrs.evolve(FLEX_ATTENTION, name="myorg.flex", sinks="")

    class MyOrg:
        @hookimpl
        def mlsysim_measured_attention_kernels(self):
            return [mine, no_sinks]

    pm = PluginManager.from_environment(autoload=False)
    pm.register(MyOrg(), name="myorg_kernels")
    solver = TrainingMemoryModel("measured", plugin_manager=pm)
    run = FLEX_RUNS[0]
    assert solve_run(run, workload(run["hf_config"]), solver=solver, attention="myorg.flex-sinks").total_memory \
        == solve(run).total_memory
    with pytest.raises(NotModelledError, match=r"attention='myorg.flex'.*declares no support for attention sinks"):
        solve_run(run, workload(run["hf_config"]), solver=solver, attention="myorg.flex")
    with pytest.raises(ValueError, match="AttentionKernel.sinks"):
        attrs.evolve(FLEX_ATTENTION, sinks="softmax-offset")


def test_flex_refused_for_other_families():
    # flex_attention has formulas for gpt-oss's sinks layout only (a Llama under it was not measured)
    from mlsysim_plugins.measured.kernels import FLEX_ATTENTION, SEPARATE_QKV
    with pytest.raises(NotModelledError, match="knows the layouts: none"):
        FLEX_ATTENTION.formula(SEPARATE_QKV)


def test_flex_at_long_sequences():
    # gpt-oss-120b's attention at s = 131,072, bf16, per token and layer on a GPU: eager keeps the sink-softmax
    # 2 x 64 x (s + 1) B (16.8 MB) besides q/k/v; flex_attention 2 x (4096 + 2 x 512) + 2 x 4096 + 4 x 64 +
    # 2 x 4 x 64 + 2 x 4096 (27,392 B), whatever s
    kw = dict(dropout=False, heads=64, q_dim=4096, kv_dim=512, hidden=2880, seq_len=131072, tokens=131072)
    assert sum(p.nbytes for p in gpt_oss.flex_sinks(kind="bf16", **kw)) == 27_392
    assert sum(p.nbytes for p in gpt_oss.eager_sinks(kind="bf16", **kw)) == 3 * 2 * 4096 + 8 * 64 + 2 * 64 * 131073 \
        + 2 * 4096


def test_dropout_refused():
    with pytest.raises(NotModelledError, match="dropout"):
        solve(RUNS[0], dropout=0.1)


MXFP4 = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                              "model.embed_tokens", "lm_head"]}


def test_mxfp4_checkpoint_costed_in_bf16_with_a_note():
    run = next(r for r in RUNS if r["id"] == "gpt-oss-tiny-bf16-eager")
    plain = solve(run)
    quantized = solve(run, model=workload(run["hf_config"], run["id"], quantization_config=MXFP4))
    assert quantized.total_memory == plain.total_memory      # dequantized bf16 weights, as transformers trains
    assert any("mxfp4" in n and "dequantized to bf16" in n for n in quantized.notes)
    assert not any("mxfp4" in n for n in plain.notes)


def test_mxfp4_training_refused():
    from mlsysim_plugins.measured.regimes import REGIMES
    import attrs
    run = next(r for r in RUNS if r["id"] == "gpt-oss-tiny-bf16-eager")
    model = workload(run["hf_config"], run["id"], quantization_config=MXFP4)
    four_bit = attrs.evolve(REGIMES["bf16"], name="mxfp4-weights", weight=0.53125)   # 4.25 bits per weight
    with pytest.raises(NotModelledError, match=r"MXFP4.*dequantized to bf16"):
        solve(run, model=model, regime=four_bit)


def test_megatron_refused():
    run = next(r for r in RUNS if r["id"] == "gpt-oss-tiny-bf16-eager")
    with pytest.raises(NotModelledError, match="Megatron-Core"):
        solve(run, regime="mixed-bf16-main-grad")


def test_missing_attention_bias_is_said():
    model = workload(CONFIGS.GPT_OSS_TINY)
    bare = attrs_evolve(model, details={k: v for k, v in model.details.items() if k != "attention_bias"})
    assert gpt_oss.assumptions(bare) and "attention_bias" in gpt_oss.assumptions(bare)[0]
    assert gpt_oss.count_parameters(bare) == gpt_oss.count_parameters(model)


def attrs_evolve(obj, **changes):
    import attrs
    return attrs.evolve(obj, **changes)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
