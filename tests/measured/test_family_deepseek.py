"""The DeepSeek family (plugins/mlsysim_plugins/measured/architectures/deepseek.py): multi-head latent
attention and DeepSeek MoE. Every run of validation/families/deepseek solved (device="cpu", what the
runs measured) and compared phase by phase; hand-derived byte counts of what the mechanisms save;
the kernel chosen per device (the default cuda prediction never has the CPU math kernel's s x s
probabilities); the family chosen with no approximation note; what it refuses."""

from __future__ import annotations

import statistics

import pytest

from familytools import abs_errors_by_architecture, family_configs, family_runs
from familytools import run_errors as errors
from familytools import solve_run as solve
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured import architectures
from mlsysim_plugins.measured.architectures import deepseek
from mlsysim_plugins.measured.families import BUILTIN_FAMILIES, architecture_notes, family_for
from mlsysim_plugins.measured.kernels import EAGER, SDPA

RUNS = family_runs("deepseek")
FAMILIES = {**BUILTIN_FAMILIES, **{f.name: f for f in architectures.mlsysim_measured_architectures()}}
FAMILY = deepseek.FAMILIES[0]


def _config(model: str) -> dict:
    return dict(family_configs("deepseek").MODELS[model])


# --- the measured runs ---------------------------------------------------------------------

def test_every_run_is_measured_and_says_its_kernel():
    ids = {r["id"] for r in RUNS if r.get("measured")}
    assert len(ids) == len(RUNS) >= 15
    assert {r["hf_config"]["model_type"] for r in RUNS} == {"deepseek_v2", "deepseek_v3"}
    assert any(r["method"] == "fake" for r in RUNS)
    for run in RUNS:
        assert run["kernel_note"].startswith("sdpa on CPU: the math kernel" if run["attention"] == "sdpa" else "eager")
        assert run["measured"]["attn_implementation"] == run["attention"]


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_run_phase_by_phase(run):
    e = errors(run)
    assert all(abs(v) <= 0.10 for v in e.values()), e


def test_targets_per_architecture():
    for arch, s in abs_errors_by_architecture(RUNS).items():
        peaks, every = s["peak"], s["phases"]
        assert statistics.median(peaks) <= 0.03 and max(peaks) <= 0.10, (arch, peaks)
        assert statistics.median(every) <= 0.03 and max(every) <= 0.10, (arch, every)


@pytest.mark.parametrize("run", [r for r in RUNS if r["method"] == "real"], ids=lambda r: r["id"])
def test_parameters_and_tensors_as_built(run):
    """The family's own parameter count and tensor list are transformers' model (from the run)."""
    model = from_hf_config(run["hf_config"], name=run["id"])
    assert deepseek._count_parameters(model) == model.parameters == run["measured"]["parameters"]
    assert len(deepseek._model_tensors(deepseek.sizes(model))) == run["measured"]["parameter_tensors"]


@pytest.mark.parametrize("run", [r for r in RUNS if r["checkpointing"] == "none" and r["method"] == "real" and r["regime"] != "amp-bf16"],
                         ids=lambda r: r["id"])
def test_layers_exact_in_sum(run):
    """The mean layer x layers is what the decoder layers retained (MemTracker's per-layer growth;
    in bf16 each layer's output too, which the next norm's fp32 copy lets die later)."""
    result = solve(run)
    [term] = [t for t in result.terms if t.label == "decoder layers: saved for backward"]
    hf = run["hf_config"]
    outputs = 2 * run["batch_size"] * run["seq_len"] * hf["hidden_size"] if run["regime"] == "bf16" else 0
    retained = run["measured"]["layer_forward_retained_bytes"]
    assert term.nbytes + len(retained) * outputs == pytest.approx(sum(retained), rel=1e-12)


# --- hand-derived byte counts -----------------------------------------------------------------

def _sizes(model="deepseek-v3-tiny"):
    return deepseek.sizes(from_hf_config(_config(model), name=model))


def test_v3_router_keeps_only_what_the_weights_hang_from():
    z = _sizes()                    # E 8, k 2, h 256, norm_topk_prob
    # sigmoid output 4E + top-k indices 8k + the sum 4 + normalized weights 4k; the group-limited
    # selection's tensors die with the router; bf16 adds the fp32 copy of the input (4h)
    assert deepseek._router_per_token(z, "fp32") == 4 * 8 + 8 * 2 + 4 + 4 * 2 == 60
    assert deepseek._router_per_token(z, "bf16") == 60 + 4 * 256
    v2 = _sizes("deepseek-v2-tiny")
    assert deepseek._router_per_token(v2, "fp32") == 4 * 8 + 8 * 2             # softmax, top-k, no normalization
    assert deepseek._router_per_token(_sizes("deepseek-v2-tiny-groups"), "fp32") == 4 * 8 + 8 * 2 + 8   # + the mask


def _attention(kernel, device, kind="fp32", tokens=256, seq=256):
    family_formula = dict(FAMILY.attention_layouts)[kernel.name]
    return {p.name: p.nbytes for p in family_formula(kind=kind, dropout=False, heads=8, q_dim=8 * 48, kv_dim=8 * 40,
                                                     hidden=256, seq_len=seq, tokens=tokens, grads=(True,) * 3,
                                                     device=device, mla=(32, 16, 40))}


def test_mla_attention_per_kernel_and_device():
    a, s = 8, 256
    cpu = _attention(SDPA, "cpu")
    # the CPU math kernel: fp32 scaled q, k (a x 48 each), fp32 probabilities, v a view of kv_b_proj's
    # output (a x (32 + 40)) at batch 1, the o_proj input (a x 40)
    assert sum(cpu.values()) == 4 * 2 * a * 48 + 4 * a * s + 4 * a * 72 + 4 * a * 40
    assert _attention(SDPA, "cpu", tokens=512)["v (contiguous copy for the batched matmul)"] == 4 * a * 40
    assert _attention(SDPA, "cpu", kind="bf16")["v (fp32 copy, math kernel)"] == 4 * a * 40
    cuda = _attention(SDPA, "cuda", kind="bf16")
    # the memory-efficient kernel: q, k, v's storage, output + fp32 logsumexp; no s x s tensor
    assert sum(cuda.values()) == 2 * (2 * a * 48 + a * 72 + a * 40) + 4 * a
    assert not any("probabilities" in n or "scores" in n for n in cuda)
    assert _attention(EAGER, "cuda", kind="bf16") == _attention(EAGER, "cpu", kind="bf16")
    assert _attention(EAGER, "cpu", kind="bf16")["attention scores"] == (4 + 2) * a * s


def test_default_cuda_prediction_has_no_cpu_math_kernel():
    run = next(r for r in RUNS if r["id"] == "deepseek-v3-tiny-bf16-sdpa")
    cpu, cuda = solve(run), solve(run, device="cuda")
    assert "the CPU math kernel" in " ".join(cpu.notes) and "memory-efficient kernel" in " ".join(cuda.notes)
    layers = {r: next(t for t in res.terms if t.label == "decoder layers: saved for backward")
              for r, res in (("cpu", cpu), ("cuda", cuda))}
    assert "probabilities" in layers["cpu"].formula and "probabilities" not in layers["cuda"].formula
    assert layers["cuda"].nbytes < layers["cpu"].nbytes


def test_rope_tables_are_the_rope_dims():
    """V3: cos, sin (2 x s x qk_rope_head_dim, bf16 here); V2: complex64 freqs_cis (s x dr/2 x 8 B)."""
    v3 = next(r for r in RUNS if r["id"] == "deepseek-v3-tiny-bf16-sdpa")
    v2 = next(r for r in RUNS if r["id"] == "deepseek-v2-tiny-bf16-sdpa")
    [t3] = [t for t in solve(v3).terms if t.label == "RoPE cos/sin tables"]
    [t2] = [t for t in solve(v2).terms if t.label == "RoPE tables"]
    assert t3.nbytes == 2 * 256 * 16 * 2 and t2.nbytes == 256 * 8 * 8
    [buffers] = [t for t in solve(v3).terms if t.label == "routers' e_score_correction_bias buffers (fp32)"]
    assert buffers.nbytes == 2 * 8 * 4              # 2 MoE layers x 8 experts, fp32


# --- choosing and refusing --------------------------------------------------------------------

@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3", "kimi_k2"])
def test_family_chosen_without_approximation(model_type):
    hf = _config("deepseek-v3-tiny" if model_type != "deepseek_v2" else "deepseek-v2-tiny")
    hf["model_type"] = model_type
    model = from_hf_config(hf, name=model_type)
    family, notes = family_for(model, FAMILIES)
    assert family is FAMILY and notes == () and architecture_notes(model, family, FAMILIES) == ()
    assert "kimi_k2" in FAMILY.architectures


def test_mean_layer_note_under_pipeline_or_checkpointing():
    run = next(r for r in RUNS if r["id"] == "deepseek-v3-tiny-fp32-sdpa")
    assert not any("mean" in n for n in solve(run).notes)
    full = next(r for r in RUNS if r["id"] == "deepseek-v3-tiny-bf16-sdpa-full")
    assert any("costed as their mean" in n and "recompute working set" in n for n in solve(full).notes)


@pytest.mark.parametrize("changes, field, words", [
    (dict(dropout=0.1), "dropout", "MLA"),
])
def test_refusals(changes, field, words):
    run = next(r for r in RUNS if r["id"] == "deepseek-v3-tiny-fp32-sdpa")
    with pytest.raises(NotModelledError) as e:
        solve(run, **changes)
    assert field in str(e.value) and words in str(e.value)


def test_megatron_regime_refused():
    with pytest.raises(NotModelledError, match="Megatron-Core"):
        FAMILY.megatron_mlp(hidden=1, ffn=1, experts=1, top_k=1)
