"""The parallel-residual families (plugins/mlsysim_plugins/measured/architectures/parallel_residual.py:
GPT-NeoX and Falcon) against their measurements (validation/families/parallel_residual), their
hand-derived bytes, and what they refuse. No torch."""

from __future__ import annotations

import statistics

import pytest

from familytools import PHASES, family_configs, family_runs, run_errors
from familytools import solve_model as solve
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured.architectures import parallel_residual as pr
from mlsysim_plugins.measured.families import BUILTIN_FAMILIES, family_for
from mlsysim_plugins.measured.kernels import EAGER, SDPA
from mlsysim_plugins.measured.layers import layer_forward_bytes

RUNS = [r for r in family_runs("parallel_residual") if "measured" in r]
FAMILIES = {**BUILTIN_FAMILIES, **{f.name: f for f in pr.FAMILIES}}
CONFIGS = family_configs("parallel_residual")
ERRORS = {r["id"]: run_errors(r) for r in RUNS}


# --- against the measurements -------------------------------------------------------------------------

def test_every_configuration_is_measured_and_says_its_kernel():
    assert {r["id"] for r in RUNS} == {c["id"] for c in CONFIGS.CONFIGS}
    assert {r["hf_config"]["model_type"] for r in RUNS} == {"gpt_neox", "falcon"}
    assert any(r["method"] == "fake" and r["model"] == "Pythia-1.4B" for r in RUNS)
    assert any(r["method"] == "fake" and r["model"] == "Falcon-7B" for r in RUNS)
    assert all(r["kernel_note"] for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_phase_within_ten_percent(run):
    e = ERRORS[run["id"]]
    assert all(abs(v) <= 0.10 for v in e.values()), e


@pytest.mark.parametrize("arch", ["gpt_neox", "falcon"])
def test_median_within_three_percent(arch):
    runs = [r for r in RUNS if r["hf_config"]["model_type"] == arch]
    peaks = [abs(ERRORS[r["id"]]["peak"]) for r in runs]
    phases = [abs(ERRORS[r["id"]][p]) for r in runs for p in PHASES]
    assert statistics.median(peaks) <= 0.03 and statistics.median(phases) <= 0.03


# --- choosing ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("config, family", [(CONFIGS.PYTHIA_1_4B, "gpt_neox"), (CONFIGS.FALCON7B, "falcon"),
                                            (CONFIGS.FALCON40_TINY, "falcon")])
def test_family_is_chosen_without_an_approximation_note(config, family):
    model = from_hf_config(config, name="m")
    chosen, notes = family_for(model, FAMILIES)
    assert chosen.name == family and notes == ()
    assert not [n for n in solve(model, seq=128).notes if "approximation" in n]


# --- hand-derived bytes -----------------------------------------------------------------------------------

def _layer(config, regime, kernel, *, tokens=2048, seq=2048):
    model = from_hf_config(config, name="m")
    family = pr.GPT_NEOX if model.architecture == "gpt_neox" else pr.FALCON
    return layer_forward_bytes(family=family, hidden=model.hidden_dim, heads=model.heads, kv_heads=model.kv_heads,
                               head_dim=model.hidden_dim // model.heads, ffn=model.ffn_dim, regime=regime,
                               attention=kernel, dropout=False, tokens=tokens, seq_len=seq, model=model, device="cpu")


def test_pythia_layer_bf16_sdpa_bytes():
    # Pythia-1.4B, bf16, s=2048, per token (h=2048, f=8192, a=16): LN mean/rstd 2 x 4, qkv and MLP
    # inputs 2 x 2h, q and k (cat outputs) 2 x 2h, the qkv storage 3 x 2h, the SDPA output 2h + 4a
    # logsumexp, its contiguous copy 2h, gelu input and output 2 x 2f. No mid residual.
    h, f, a = 2048, 8192, 16
    per_token = 8 + 4 * h + 4 * h + 6 * h + 2 * h + 4 * a + 2 * h + 4 * f
    lb = _layer(CONFIGS.PYTHIA_1_4B, "bf16", SDPA)
    assert lb.saved == 2048 * per_token and lb.output == 2048 * 2 * h and lb.output_saved_by_next


def test_falcon7b_sdpa_runs_the_fp32_math_kernel():
    # Falcon-7B hands SDPA 71 query heads and 1 KV head without enable_gqa: the math kernel keeps
    # fp32 q, k, v (4 x (q + 2 x 64)) and the fp32 s x s probabilities (4 x 71 x 2048 per token),
    # whatever the regime, and on either device.
    q, kv, S = 4544, 64, 71 * 2048
    parts = {p.name: p.nbytes for p in _layer(CONFIGS.FALCON7B, "bf16", SDPA).parts}
    assert parts["q, k, v (fp32, scaled; math kernel)"] == 2048 * 4 * (q + 2 * kv)
    assert parts["attention probabilities (fp32, math kernel)"] == 2048 * 4 * S
    for device in ("cpu", "cuda"):
        own = pr.FALCON.attention_of(SDPA, device)(kind="bf16", dropout=False, heads=71, q_dim=q, kv_dim=kv,
                                                   hidden=q, seq_len=2048, tokens=2048)
        assert sum(p.nbytes for p in own) == 4 * (q + 2 * kv) + 4 * S + 2 * q


def test_falcon40_style_fused_sdpa_and_its_mask():
    # new_decoder_architecture broadcasts k, v to all heads: the fused kernel (q, k, v 3 x 2q, output
    # 2q + 4a); its materialized mask, b x s x s in the model dtype, is one term outside the layers.
    lb = _layer(CONFIGS.FALCON40_TINY, "bf16", SDPA, tokens=512, seq=256)
    parts = {p.name: p.nbytes for p in lb.parts}
    assert parts["q, k, v (k, v broadcast to all heads)"] == 512 * 3 * 2 * 256
    model = from_hf_config(CONFIGS.FALCON40_TINY, name="f40")
    mask = [t for t in solve(model, batch=2, seq=256).terms if t.label.startswith("causal mask")]
    assert [t.nbytes for t in mask] == [2 * 256 * 256 * 2]
    assert not [t for t in solve(model, batch=2, seq=256, attention="eager").terms if t.label.startswith("causal")]


def test_partial_rotary_tables():
    # cos and sin of rotary_pct x head_dim = 0.25 x 128 = 32 dims, bf16: 2 x s x 32 x 2 B
    terms = {t.label: t.nbytes for t in solve(from_hf_config(CONFIGS.PYTHIA_1_4B, name="p"), seq=2048).terms}
    assert terms["RoPE cos/sin tables"] == 2 * 2048 * 32 * 2
    half = from_hf_config({**CONFIGS.PYTHIA_1_4B, "rotary_pct": 0.5}, name="p2")
    assert {t.label: t.nbytes for t in solve(half, seq=2048).terms}["RoPE cos/sin tables"] == 2 * 2048 * 64 * 2


def test_parameter_tensors_match_the_measured_count():
    for run in RUNS:
        model = from_hf_config(run["hf_config"], name=run["id"])
        family = FAMILIES[model.architecture]
        from mlsysim_plugins.measured.shapes import ModelShape
        shape = ModelShape.of(model, family)
        assert len(shape.parameter_tensors()) == run["measured"]["parameter_tensors"], run["id"]
        assert sum(shape.parameter_tensors()) == run["measured"]["parameters"], run["id"]


# --- refusals ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, parameter", [({"alibi": True}, "alibi"), ({"parallel_attn": False}, "parallel_attn"),
                                               ({"multi_query": False}, "multi_query")])
def test_falcon_layouts_not_modelled_are_refused(change, parameter):
    model = from_hf_config({**CONFIGS.FALCON7_TINY, **change}, name="f")
    with pytest.raises(NotModelledError, match=parameter):
        solve(model)


def test_dropout_is_refused():
    with pytest.raises(NotModelledError, match="dropout"):
        solve(from_hf_config(CONFIGS.NEOX_TINY, name="n"), dropout=0.1)
    with pytest.raises(NotModelledError, match="dropout"):
        pr.FALCON.attention_of(EAGER)(kind="bf16", dropout=True, heads=8, q_dim=256, kv_dim=32, hidden=256,
                                      seq_len=64, tokens=64)
