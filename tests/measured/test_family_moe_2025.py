"""The Qwen-MoE and Llama 4 text families (plugins/mlsysim_plugins/measured/architectures/moe_2025.py):
every run of validation/families/moe_2025 solved and compared phase by phase, hand-derived byte counts of
what the mechanisms add, the family chosen with no approximation note, and what it refuses."""

from __future__ import annotations

import statistics

import pytest

from familytools import family_runs, run_model
from familytools import run_errors as _errors
from familytools import solve_run as solve
from mlsysim_core.errors import NotModelledError
from mlsysim_plugins.measured import architectures
from mlsysim_plugins.measured.architectures import moe_2025
from mlsysim_plugins.measured.families import BUILTIN_FAMILIES, architecture_notes, family_for
from mlsysim_plugins.measured.kernels import EAGER, SDPA

RUNS = family_runs("moe_2025")
FAMILIES = {**BUILTIN_FAMILIES, **{f.name: f for f in architectures.mlsysim_measured_architectures()}}


def by_id(run_id):
    return next(r for r in RUNS if r["id"] == run_id)


# --- the measurements --------------------------------------------------------------------------

def test_every_run_was_measured():
    assert RUNS and all("measured" in r and "error" not in r for r in RUNS)
    kinds = {(r["hf_config"]["model_type"], r["method"]) for r in RUNS}
    assert {("qwen2_moe", "real"), ("qwen3_moe", "real"), ("qwen3_moe", "fake"), ("llama4_text", "real"),
            ("llama4_text", "fake")} <= kinds


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_run_within_targets(run):
    """Every phase within 10 % of what MemTracker measured (the peak too)."""
    errors = _errors(run)
    assert all(abs(e) <= 0.10 for e in errors.values()), errors


@pytest.mark.parametrize("arch", ["qwen2_moe", "qwen3_moe", "llama4_text"])
def test_median_peak_error_per_architecture(arch):
    peaks = [abs(_errors(r)["peak"]) for r in RUNS if r["hf_config"]["model_type"] == arch]
    assert peaks and statistics.median(peaks) <= 0.03, peaks


def test_parameter_counts_are_exact():
    """The family's count (what model.parameters is checked against) is what PyTorch built."""
    for run in RUNS:
        assert moe_2025.count_parameters(run_model(run)) == run["measured"]["parameters"], run["id"]
        assert len(moe_2025.parameter_tensors(_shape(run))) == run["measured"]["parameter_tensors"], run["id"]


def _shape(run):
    from mlsysim_plugins.measured.shapes import ModelShape
    model = run_model(run)
    return ModelShape.of(model, family_for(model, FAMILIES)[0])


# --- hand-derived bytes ------------------------------------------------------------------------

def _layer(run_id, kernel=SDPA, **changes):
    run = by_id(run_id)
    model = run_model(run)
    shape = _shape(run)
    kw = dict(hidden=shape.hidden, heads=shape.heads, kv_heads=shape.kv_heads, head_dim=shape.head_dim,
              ffn=shape.ffn, experts=shape.experts, top_k=shape.top_k, regime=run["regime"], dropout=False,
              tokens=run["batch_size"] * run["seq_len"], seq_len=run["seq_len"], model=model)
    kw.update(changes)
    return {p.name: p.nbytes for p in shape.family.layer_bytes(kernel=kernel, device="cpu", **kw).parts}


def test_qwen3_qk_norm_bytes():
    """q_norm and k_norm over head_dim 64, 8 heads and 2 KV heads (q 512, kv 128), fp32: each saves its
    input (the projection's output, 4 B), the normalized input (4 B) and one rsqrt per head (4 B):
    8 x (512 + 128) + 4 x (8 + 2) = 5,160 B per token; bf16 keeps the fp32 copy and the bf16 normalized
    input: 6 x 640 + 40 = 3,880 B."""
    T = 2 * 256
    assert _layer("qwen3-moe-tiny-fp32-sdpa")["QK-norm (fp32 input, rsqrt, normalized)"] == 5160 * T
    assert _layer("qwen3-moe-tiny-bf16-sdpa")["QK-norm (fp32 input, rsqrt, normalized)"] == 3880 * T


def test_qwen2_shared_expert_bytes():
    """Qwen 2's shared expert (width 512) in fp32: gate, silu, up and product (4 x 4 x 512 B per token),
    and its sigmoid gate: the sigmoid output (4 B) and the shared output it multiplies (4 x 256 B)."""
    parts = _layer("qwen2-moe-tiny-fp32-sdpa")
    T = 2 * 256
    assert parts["MoE x 4/4: shared expert (gate, silu, up, product)"] == 4 * 4 * 512 * T
    assert parts["MoE x 4/4: shared expert gate (sigmoid output, shared output)"] == (4 + 4 * 256) * T


def test_llama4_dense_dispatch_bytes():
    """Llama 4's experts see every token (bmm over all E = 4 experts): in bf16 the input repeated to
    every expert (2 x 4 x 256 B per token) and its scored copy (same), then gate_up, silu and the
    product (4 x 2 x 4 x 256 B): E times a dense MLP, not top-k times."""
    parts = _layer("llama4-tiny-bf16-sdpa")
    T = 2 * 256
    assert parts["MoE x 4/4: hidden repeated to every expert (saved by the score multiply)"] == 2 * 4 * 256 * T
    assert parts["MoE x 4/4: scored expert input (saved by bmm)"] == 2 * 4 * 256 * T
    assert parts["MoE x 4/4: experts over all tokens (gate_up, silu, product)"] == 4 * 2 * 4 * 256 * T


def test_llama4_eager_softmax_stays_bf16():
    """Llama 4's eager attention keeps its softmax in bf16 (no fp32 upcast): 2 B per score, where
    Llama's eager keeps the fp32 softmax and its bf16 copy (6 B)."""
    parts = _layer("llama4-tiny-bf16-sdpa", kernel=EAGER)
    scores = 8 * 256                                      # heads x seq_len per token
    assert parts["attention scores (softmax in the scores' dtype)"] == 2 * scores * 2 * 256


def test_llama4_rope_table_is_complex64():
    """One complex64 freqs_cis of s x head_dim/2 (b = 1 positions) in every regime: 4 x s x d bytes."""
    run = by_id("llama4-tiny-bf16-sdpa")
    terms = [t for t in solve(run).terms if t.label == "RoPE freqs_cis (complex64)"]
    assert len(terms) == 1 and terms[0].nbytes == 4 * 256 * 32


# --- choosing and refusing ------------------------------------------------------------------------

@pytest.mark.parametrize("run_id,name", [("qwen2-moe-tiny-fp32-sdpa", "qwen_moe"), ("qwen3-moe-tiny-fp32-sdpa", "qwen_moe"),
                                         ("llama4-tiny-fp32-sdpa", "llama4_text")])
def test_family_chosen_without_approximation_note(run_id, name):
    model = run_model(by_id(run_id))
    family, notes = family_for(model, FAMILIES)
    assert family.name == name and notes == ()
    assert architecture_notes(model, family, FAMILIES) == ()


def test_dropout_refused():
    run = by_id("qwen3-moe-tiny-fp32-sdpa")
    with pytest.raises(NotModelledError, match="attention dropout was not measured"):
        solve(run, dropout=0.1)


def test_llama4_past_one_chunk_refused():
    run = dict(by_id("llama4-tiny-fp32-sdpa"))
    model = run_model(run)
    details = dict(model.details, attention_chunk_size=128)
    import attrs
    with pytest.raises(NotModelledError, match="attention_chunk_size=128"):
        solve(run, model=attrs.evolve(model, details=details))


def test_megatron_regime_refused():
    run = by_id("qwen2-moe-tiny-bf16-sdpa")
    with pytest.raises(NotModelledError, match="Megatron-Core"):
        solve(run, regime="mixed-bf16-main-grad")
