"""The GLM-4.5, Ministral and Ministral 3 families (plugins/mlsysim_plugins/measured/architectures/
glm_ministral.py). Every run of validation/families/glm_ministral solved (device="cpu", what the runs
measured) and compared phase by phase against the targets; hand-derived byte counts of what the
mechanisms add (the Llama-4 scale, the sliding windows' masks and repeated k, v, QK-norm, the CPU
SDPA output copy of GLM's concatenated rotary q, partial rotary tables); the families chosen with no
approximation note; what they refuse."""

from __future__ import annotations

import statistics

import pytest

from familytools import abs_errors_by_architecture, family_configs, family_runs
from familytools import run_errors as errors
from familytools import solve_run as solve
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured import architectures, layers
from mlsysim_plugins.measured.architectures import glm_ministral as gm
from mlsysim_plugins.measured.families import BUILTIN_FAMILIES, architecture_notes, family_for

RUNS = family_runs("glm_ministral")
FAMILIES = {**BUILTIN_FAMILIES, **{f.name: f for f in architectures.mlsysim_measured_architectures()}}
MODELS = family_configs("glm_ministral").MODELS


def model_of(name, **changes):
    return from_hf_config({**MODELS[name], **changes}, name=name)


def run_of(rid):
    return next(r for r in RUNS if r["id"] == rid)


# --- the measurements -------------------------------------------------------------------------------

def test_every_run_is_measured():
    assert RUNS and all("measured" in r and "error" not in r for r in RUNS)
    assert {r["hf_config"]["model_type"] for r in RUNS} == {"glm4_moe", "ministral", "ministral3"}
    fakes = {r["hf_config"]["model_type"] for r in RUNS if r["method"] == "fake"}
    assert fakes == {"glm4_moe", "ministral", "ministral3"}


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_run_phase_by_phase(run):
    """Every phase within 3 % (the worst, 2.9 %: full checkpointing's end of the backward in the tiny
    Ministral runs, where the profile counts one layer's recompute working set beside the embedding's
    gradient, which is computed only after that layer's backward has freed it; the mid-backward
    moment of a tiny fp32 MoE layer's grouped_mm backward, -2.2 %)."""
    e = errors(run)
    assert all(abs(v) <= 0.03 for v in e.values()), e


def test_targets_per_architecture():
    for arch, s in abs_errors_by_architecture(RUNS).items():
        assert statistics.median(s["peak"]) <= 0.03 and max(s["peak"]) <= 0.10, arch
        assert statistics.median(s["phases"]) <= 0.03 and max(s["phases"]) <= 0.10, arch


@pytest.mark.parametrize("run", [r for r in RUNS if r["method"] == "real"], ids=lambda r: r["id"])
def test_parameters_as_built(run):
    """The families' own parameter counts and tensor lists are transformers' models (from the runs)."""
    model = from_hf_config(run["hf_config"], name=run["id"])
    family = FAMILIES[model.architecture]
    assert family.count_parameters(model) == model.parameters == run["measured"]["parameters"]
    if family is gm.GLM4_MOE:
        assert len(gm._glm_model_tensors(model)) == run["measured"]["parameter_tensors"]


@pytest.mark.parametrize("run", [r for r in RUNS if r["checkpointing"] == "none" and r["regime"] != "amp-bf16"
                                 and r["method"] == "real"], ids=lambda r: r["id"])
def test_layers_exact_in_sum(run):
    """The (mean) layer x layers is what the decoder layers retained (MemTracker's per-layer growth; in
    bf16 each layer's output too, which the next norm's fp32 copy lets die later)."""
    [term] = [t for t in solve(run).terms if t.label == "decoder layers: saved for backward"]
    outputs = 2 * run["batch_size"] * run["seq_len"] * run["hf_config"]["hidden_size"] if run["regime"] == "bf16" else 0
    retained = run["measured"]["layer_forward_retained_bytes"]
    assert term.nbytes + len(retained) * outputs == pytest.approx(sum(retained), rel=1e-12)


# --- hand-derived byte counts ------------------------------------------------------------------------

def _layer(model, regime="bf16", attention="sdpa", seq=128, batch=1, device="cpu"):
    family = FAMILIES[model.architecture]
    return layers.layer_forward_bytes(family=family, hidden=model.hidden_dim, heads=model.heads,
                                      kv_heads=model.kv_heads, head_dim=model.head_dim, ffn=model.ffn_dim,
                                      regime=regime, attention=attention, dropout=False, tokens=batch * seq,
                                      seq_len=seq, experts=getattr(model, "experts", 0) or 0,
                                      top_k=getattr(model, "active_experts_per_token", 0) or 0, model=model,
                                      device=device)


def test_ministral3_llama4_scale():
    # q * scale(1, 1, s, 1): the multiply keeps the scale, a bf16 cast (2 s) or fp32 (4 s), per layer
    m = model_of("ministral3-tiny")
    parts = {p.name: p.nbytes for p in _layer(m).parts}
    assert parts["Llama-4 attention scale (1 x 1 x s x 1, saved by q's multiply)"] == 2 * 128
    fp32 = {p.name: p.nbytes for p in _layer(m, "fp32", batch=2).parts}
    assert fp32["Llama-4 attention scale (1 x 1 x s x 1, saved by q's multiply)"] == 4 * 128   # not x batch


def test_ministral_sliding_layers_past_the_window():
    # 3 of 4 layers slide; past the window (64 <= s = 128) SDPA repeats k, v to every head and keeps the
    # additive mask: per token 2 x c x (q - kv) + c x s = 2 x 2 x (256 - 64) + 2 x 128 = 1024 B, in 3 of 4
    # layers: the mean layer keeps 3/4 x 1024 x 128 tokens more than with the window past s
    masked, wide = model_of("ministral-tiny"), model_of("ministral-tiny-wide")
    assert gm.sliding(masked) == (64, 3) and gm.sliding(wide) == (256, 3)
    assert _layer(masked).saved - _layer(wide).saved == pytest.approx(3 / 4 * 1024 * 128)
    # eager keeps k, v at every head and builds masks for every layer type anyway: no difference
    assert _layer(masked, attention="eager").saved == _layer(wide, attention="eager").saved


def test_ministral_without_layer_types_slides_everywhere():
    # MinistralConfig.__post_init__: sliding_window without layer_types makes every layer sliding;
    # Ministral3Model.forward: a sliding_window masks every layer
    hf = dict(MODELS["ministral-tiny"])
    del hf["layer_types"]
    assert gm.sliding(from_hf_config(hf, name="m")) == (64, 4)
    assert gm.sliding(model_of("ministral3-tiny-window")) == (64, 3)
    assert gm.sliding(model_of("ministral3-tiny")) == (None, 0)


def test_full_checkpointing_keeps_the_masks():
    # SDPA past the window: the sliding layers' bool mask b x s x s = 128 x 128 B; eager: one additive
    # mask per layer type (full and sliding) in the embeddings' dtype, 2 x 128 x 128 x 4 B (fp32)
    run = run_of("ministral-tiny-fp32-sdpa-full")
    [mask] = [t for t in solve(run).terms if t.label.startswith("sliding-window mask")]
    assert mask.nbytes == 128 * 128
    [eager] = [t for t in solve(run, attention="eager").terms if t.label.startswith("eager attention masks")]
    assert eager.nbytes == 2 * 128 * 128 * 4


def test_glm_qk_norm_and_cpu_sdpa_output_copy():
    m, air = model_of("glm45-tiny"), model_of("glm45-tiny", use_qk_norm=False)
    q, kv, a, g, T = 256, 64, 8, 2, 128
    # QK-norm in fp32: fp32 input 4n + normalized 4n per width, rsqrt 4 per head
    assert _layer(m, "fp32").saved - _layer(air, "fp32").saved == pytest.approx(((4 + 4) * (q + kv) + 4 * (a + g)) * T)
    # rotary's torch.cat lays q out (b, heads, s, d): CPU SDPA's output copy for o_proj, c x q per token;
    # a GPU's kernels write (b, s, heads, d): none by default
    assert _layer(m, "bf16").saved - _layer(m, "bf16", device="cuda").saved == 2 * q * T
    assert _layer(m, "bf16", attention="eager").saved == _layer(m, "bf16", attention="eager", device="cuda").saved


def test_glm_partial_rotary_tables_and_router_buffers():
    run = run_of("glm45-tiny-bf16-sdpa")
    terms = {t.label: t.nbytes for t in solve(run).terms}
    # cos, sin: 2 x s x (head_dim x 0.5) x 2 B; inv_freq and original_inv_freq: 2 x 8 x 4 B
    assert terms["RoPE cos/sin tables"] == 2 * 128 * 16 * 2
    assert terms["RoPE frequency buffers"] == 2 * 8 * 4
    assert terms["routers' e_score_correction_bias buffers (fp32)"] == 2 * 8 * 4      # 2 MoE layers x 8 experts


def test_glm_mean_layer_reuses_deepseek_moe():
    # the MoE block is DeepSeek-V3's: deepseek._router_per_token on GLM's sizes (E 8, k 2, norm_topk_prob):
    # sigmoid 4E + indices 8k + sum 4 + weights 4k; bf16 + the router input's fp32 copy 4h
    z = gm.glm(model_of("glm45-tiny")).moe
    from mlsysim_plugins.measured.architectures import deepseek
    assert deepseek._router_per_token(z, "fp32") == 4 * 8 + 8 * 2 + 4 + 4 * 2
    assert deepseek._router_per_token(z, "bf16") == 60 + 4 * 256
    assert (z.dense_layers, z.moe_layers, z.shared_ffn) == (1, 2, 128)


# --- choosing and refusing ---------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["glm45-tiny", "glm45-air-4l", "ministral-tiny", "ministral-8b", "ministral3-tiny"])
def test_family_chosen_without_approximation(name):
    model = model_of(name)
    family, notes = family_for(model, FAMILIES)
    assert family is gm._BY_ARCH[model.architecture] and notes == ()
    assert architecture_notes(model, family, FAMILIES) == ()
    assert not [n for n in solve(run_of("glm45-tiny-fp32-sdpa"), model=model).notes if n.startswith("approximation")]


def test_ministral_8b_parameters_are_the_model_cards():
    assert model_of("ministral-8b").parameters == 8_019_808_256


def test_mean_layer_note_under_checkpointing():
    assert not any("mean" in n for n in solve(run_of("glm45-tiny-fp32-sdpa")).notes)
    assert any("costed as their mean (1 dense, 2 MoE" in n and "recompute working set" in n
               for n in solve(run_of("glm45-tiny-bf16-sdpa-full")).notes)


@pytest.mark.parametrize("rid", ["glm45-tiny-fp32-sdpa", "ministral-tiny-fp32-sdpa", "ministral3-tiny-fp32-sdpa"])
def test_dropout_refused(rid):
    with pytest.raises(NotModelledError) as e:
        solve(run_of(rid), dropout=0.1)
    assert "dropout" in str(e.value) and "not measured" in str(e.value)


def test_glm_megatron_refused():
    with pytest.raises(NotModelledError, match="Megatron-Core"):
        gm.GLM4_MOE.megatron_mlp(hidden=1, ffn=1, experts=1, top_k=1)


def test_catalog_style_models_hear_the_defaults():
    """A model without imported details: GLM-4.5's defaults and Ministral's window are said."""
    import attrs
    glm = attrs.evolve(model_of("glm45-tiny"), details={})
    assert any("first_k_dense_replace=1 assumed" in n for n in gm.GLM4_MOE.assumptions(glm))
    ministral = attrs.evolve(model_of("ministral-tiny"), details={})
    assert any("no sliding window assumed" in n for n in gm.MINISTRAL_FAMILY.assumptions(ministral))


def test_ministral_mean_layer_note_past_the_window():
    # masked and unmasked layers differ only past the window under SDPA: then checkpointing's one-layer
    # working set is the mean layer's (said); below the window, or eager, the layers are alike
    assert any("costed as their mean (3 masked sliding-window, 1 full" in n
               for n in solve(run_of("ministral-tiny-fp32-sdpa-full")).notes)
    assert not any("mean" in n for n in solve(run_of("ministral-tiny-fp32-sdpa")).notes)
    assert not any("mean" in n for n in solve(run_of("ministral-tiny-fp32-sdpa-full"), attention="eager").notes)
