"""The Gemma families (plugins/mlsysim_plugins/measured/architectures/gemma.py) against their
measurements (validation/families/gemma), their hand-derived bytes, and what they refuse. No torch."""

from __future__ import annotations

import statistics
from pathlib import Path

import attrs
import pytest

from familytools import PHASES, family_configs, family_runs, run_errors
from familytools import solve_model as solve
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured.architectures import gemma
from mlsysim_plugins.measured.families import BUILTIN_FAMILIES, family_for
from mlsysim_plugins.measured.kernels import EAGER, SDPA, SEPARATE_QKV, AttentionKernel
from mlsysim_plugins.measured.layers import layer_forward_bytes
from mlsysim_plugins.measured.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]
RUNS = [r for r in family_runs("gemma") if "measured" in r]
FAMILIES = {**BUILTIN_FAMILIES, **{f.name: f for f in gemma.FAMILIES}}
CONFIGS = family_configs("gemma")


def model_of(name: str, **hf):
    return from_hf_config({**CONFIGS.MODELS[name], "use_cache": False, **hf}, name=name)


ERRORS = {r["id"]: run_errors(r) for r in RUNS}


# --- against the measurements -------------------------------------------------------------------------

def test_every_configuration_is_measured():
    assert {r["id"] for r in RUNS} == {c["id"] for c in CONFIGS.CONFIGS}
    assert {r["hf_config"]["model_type"] for r in RUNS} == {"gemma", "gemma2", "gemma3_text"}
    assert any(r["method"] == "fake" and r["model"] == "gemma-2-2b" for r in RUNS)
    assert any(r["method"] == "fake" and r["model"] == "gemma-3-1b" for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_phase_within_ten_percent(run):
    for phase, e in ERRORS[run["id"]].items():
        assert abs(e) <= 0.10, (run["id"], phase, e)


@pytest.mark.parametrize("arch", ["gemma", "gemma2", "gemma3_text"])
def test_median_errors_within_three_percent(arch):
    runs = [r for r in RUNS if r["hf_config"]["model_type"] == arch]
    assert runs
    peaks = [abs(ERRORS[r["id"]]["peak"]) for r in runs]
    phases = [abs(ERRORS[r["id"]][p]) for r in runs for p in PHASES]
    assert statistics.median(peaks) <= 0.03 and statistics.median(phases) <= 0.03, (peaks, phases)


def test_every_run_records_the_kernel_it_ran():
    for run in RUNS:
        assert run.get("kernel_note"), run["id"]


# --- the family is chosen, exactly -----------------------------------------------------------------------

@pytest.mark.parametrize("name, family", [("gemma-tiny", gemma.GEMMA), ("gemma2-tiny", gemma.GEMMA2),
                                          ("gemma3-tiny", gemma.GEMMA3), ("gemma-2-2b", gemma.GEMMA2)])
def test_family_is_chosen_without_an_approximation_note(name, family):
    chosen, notes = family_for(model_of(name), FAMILIES)
    assert chosen is family and notes == ()
    result = solve(model_of(name), attention="eager")
    assert not any("approximation" in n for n in result.notes), result.notes


@pytest.mark.parametrize("name", ["gemma-tiny", "gemma2-tiny", "gemma3-tiny", "gemma-2-2b", "gemma-3-1b"])
def test_parameter_count_is_exact(name):
    model = model_of(name)
    family = FAMILIES[model.architecture]
    assert family.count_parameters(model) == model.parameters
    measured = [r["measured"]["parameters"] for r in RUNS if r["model"] == name]
    assert all(m == model.parameters for m in measured)
    shape = ModelShape.of(model, family)
    assert len(shape.parameter_tensors()) == len(shape.matrix_shapes())


# --- hand-derived bytes ------------------------------------------------------------------------------------

def _layer(model, regime, attention="sdpa", seq=256, tokens=256):
    family = FAMILIES[model.architecture]
    s = ModelShape.of(model, family)
    return layer_forward_bytes(family=family, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                               ffn=s.ffn, regime=regime, attention=attention, dropout=False, tokens=tokens,
                               seq_len=seq, model=model, device="cpu")


def test_gemma_norm_keeps_an_fp32_normalized_x_in_bf16():
    # bf16 GemmaRMSNorm: fp32 copy 4h + fp32 normalized 4h + bf16 output 2h + rsqrt 4 = 10h + 4 per token,
    # Llama's 8h + 4 (its normalized x is cast to bf16 before the weight multiply).
    h = 256
    assert gemma._norm_bytes("bf16", h, input_saved=True, output_saved=True) == 10 * h + 4
    assert gemma._norm_bytes("fp32", h, input_saved=False, output_saved=True) == 8 * h + 4
    assert gemma._norm_bytes("amp-bf16", h, input_saved=False, output_saved=True) == 4 * h + 4


def test_four_norms_and_qk_norm():
    # Gemma 3 tiny (h 256, 4 heads x 128, 1 kv head) in fp32, eager: QK-norm keeps the fp32 q and k (4q + 4kv),
    # their normalized copies (4q + 4kv) and the rsqrt per head (4 x (4 + 1)): 8 x 640 + 20 = 5,140 B per token.
    lb = _layer(model_of("gemma3-tiny"), "fp32", attention="eager")
    parts = {p.name: p.nbytes for p in lb.parts}
    assert parts["QK-norm (fp32 inputs, normalized, rsqrt)"] == 256 * (8 * (512 + 128) + 4 * 5)
    # the post-attention and post-feedforward norms: fp32 input + normalized + rsqrt, 8h + 4 each
    assert parts["post-attention norm of o_proj's output (fp32 input, normalized, rsqrt)"] == 256 * (8 * 256 + 4)
    # (1 + w) of four norms and of q_norm, k_norm, fp32, once per layer
    assert parts["(1 + w) of the 4 norms (fp32)"] == 4 * 4 * 256
    assert parts["(1 + w) of q_norm and k_norm (fp32)"] == 2 * 4 * 128


def test_attention_soft_capping_keeps_the_tanh_output():
    # Gemma 2 eager: tanh(scores / cap) saves its output, heads x s per token in the compute dtype.
    model = model_of("gemma2-tiny")
    for regime, c in (("fp32", 4), ("bf16", 2), ("amp-bf16", 2)):
        parts = {p.name: p.nbytes for p in _layer(model, regime, attention="eager").parts}
        assert parts["attention logit soft-capping (tanh output)"] == c * 4 * 256 * 256
    no_cap = model_of("gemma2-tiny", attn_logit_softcapping=None)
    assert not any("soft-capping" in p.name for p in _layer(no_cap, "bf16", attention="eager").parts)


def test_gemma2_costs_eager_attention_under_sdpa_with_a_note():
    model = model_of("gemma2-tiny")
    sdpa, eager = solve(model, attention="sdpa"), solve(model, attention="eager")
    assert sdpa.total_memory == eager.total_memory
    assert any("_supports_sdpa = False" in n for n in sdpa.notes)
    assert not any("_supports_sdpa" in n for n in eager.notes)


def test_sliding_layers_past_the_window_get_a_mask_under_sdpa():
    # Gemma 3 tiny: 5 of 6 layers slide (window 64 <= s = 256): SDPA gets a (b, 1, s, s) bool mask, which it
    # turns into an additive bf16 mask that the kernel saves: s x 2 B per token in each sliding layer. With
    # one KV head repeat_kv is a view: q/k/v stay 2 B x (512 + 2 x 128). The mean layer: 5/6 and 1/6.
    model = model_of("gemma3-tiny")
    parts = {p.name: p.nbytes for p in _layer(model, "bf16").parts}
    assert parts["q/k/v [sliding layers, masked (mask): 5 of 6]"] == 256 * 2 * (512 + 2 * 128) * 5 / 6
    assert parts["q/k/v [full layers: 1 of 6]"] == 256 * 2 * (512 + 2 * 128) / 6
    assert parts["additive attention mask (query dtype, saved by SDPA) [sliding layers, masked (mask): 5 of 6]"] \
        == 256 * 256 * 2 * 5 / 6
    # under AMP autocast's bf16 cast of the fp32 rotary k materializes the repeated view: 2 B x (512 - 128)
    amp = {p.name: p.nbytes for p in _layer(model, "amp-bf16").parts}
    assert amp["k's bf16 cast at every head (AMP, of the repeated view) [sliding layers, masked (mask): 5 of 6]"] \
        == 256 * 2 * (512 - 128) * 5 / 6
    # two KV heads of four: repeat_kv copies k and v to every head (2 B x 3 x 512 per token)
    gqa = {p.name: p.nbytes for p in _layer(model_of("gemma3-tiny", num_key_value_heads=2), "bf16").parts}
    assert gqa["q/k/v [sliding layers, masked (k, v repeated): 5 of 6]"] == 256 * 2 * 3 * 512 * 5 / 6
    # within the window no mask is built: every layer keeps k, v at one head, no mask
    short = {p.name: p.nbytes for p in _layer(model, "bf16", seq=32, tokens=32).parts}
    assert short["q/k/v"] == 32 * 2 * (512 + 2 * 128) and not any("mask" in n for n in short)
    # eager keeps full s x s scores in every layer: the window changes nothing
    assert not any("mask" in p.name for p in _layer(model, "bf16", attention="eager").parts)


def test_final_logit_soft_capping_keeps_a_logits_sized_tanh_output():
    # Gemma-2-2B, bf16, b=1, s=2048: tanh(logits / 30) kept for its backward, 2 B x 2048 x 256,000.
    model = from_hf_config(ROOT / "tests" / "data" / "hf_configs" / "gemma-2-2b.json")
    terms = {t.label: t.nbytes for t in solve(model, seq=2048, attention="eager").terms}
    assert terms["final logit soft-capping: tanh output (saved)"] == 2 * 2048 * 256000
    uncapped = attrs.evolve(model, details={**model.details, "final_logit_softcapping": None})
    assert not any("soft-capping" in t.label for t in solve(uncapped, seq=2048, attention="eager").terms)


def test_gemma3_two_rotary_embeddings():
    model = model_of("gemma3-tiny")
    terms = [t for t in solve(model).terms if t.label.startswith("RoPE")]
    tables = [t for t in terms if "cos/sin" in t.label]
    buffers = [t for t in terms if "frequency" in t.label]
    assert len(tables) == 2 and len(buffers) == 2
    assert {t.nbytes for t in buffers} == {2 * 64 * 4}


def test_defaults_are_assumed_with_a_note_for_a_catalog_like_model():
    # A catalog entry has no config details: Gemma 2's documented defaults, said in notes, cost the same
    # bytes as the imported config that has them.
    model = model_of("gemma2-tiny", sliding_window=4096, layer_types=None)
    bare = attrs.evolve(model, details={})
    notes = solve(bare, attention="eager").notes
    assert any("final_logit_softcapping = 30.0 assumed" in n for n in notes)
    assert any("2 of 4 sliding-window layers assumed" in n for n in notes)
    assert solve(bare, attention="eager").total_memory == solve(model, attention="eager").total_memory
    # an imported config that leaves a soft-capping out has none (its details keep only what is set)
    assert not any("assumed" in n for n in solve(model_of("gemma2-tiny", final_logit_softcapping=None)).notes)


def test_checkpointed_masks_and_tied_partials():
    # Full checkpointing keeps the masks as the layers' inputs: eager's two additive masks (full and
    # sliding layers), fp32, b x s x s each.
    terms = {t.label: t.nbytes for t in solve(model_of("gemma2-tiny"), batch=2, regime="fp32", attention="eager",
                                              checkpointing="full").terms}
    assert terms["eager attention masks (kept by the checkpoints)"] == 2 * 2 * 256 * 256 * 4
    # SDPA: only the sliding layers' bool mask
    terms = {t.label: t.nbytes for t in solve(model_of("gemma3-tiny"), batch=2, checkpointing="full").terms}
    assert terms["sliding-window mask (bool, kept by the checkpoints)"] == 2 * 256 * 256
    # The tied embedding's three V x h gradients come after the recompute working set is freed; one
    # partial (the LM head's) overlaps it.
    result = solve(model_of("gemma-tiny"), batch=2, regime="fp32", checkpointing="full")
    work = next(t.nbytes for t in result.terms if t.label.startswith("recompute working set"))
    tied = next(t.nbytes for t in result.terms if t.label.startswith("tied embedding gradient"))
    E = 4096 * 256 * 4
    assert tied == max(work + E, 3 * E) - work


# --- refusals --------------------------------------------------------------------------------------------

def test_lora_is_derived_from_the_family():
    """LoRA on Gemma: the adapters from its layer weights (tests/measured/test_lora_families.py)."""
    result = solve(model_of("gemma-tiny"), lora={"rank": 8})
    assert any("derived from the family's description" in n for n in result.notes)


def test_gemma2_under_a_kernel_without_its_layout_is_refused():
    flash = AttentionKernel(name="flash-test", description="a kernel knowing Llama's layout only",
                            layouts={SEPARATE_QKV: dict(SDPA.layouts)[SEPARATE_QKV]})
    lb = FAMILIES["gemma2"]
    with pytest.raises(NotModelledError, match="gemma2-eager"):
        s = ModelShape.of(model_of("gemma2-tiny"), lb)
        layer_forward_bytes(family=lb, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                            ffn=s.ffn, regime="bf16", attention=flash, dropout=False, tokens=256, seq_len=256,
                            model=model_of("gemma2-tiny"))
    assert EAGER.layouts  # (the built-in kernels are used through the family's own layouts)


def test_more_sliding_layers_than_layers_is_refused():
    model = model_of("gemma3-tiny")
    bad = attrs.evolve(model, details={**model.details, "sliding_window_layers": 7})
    with pytest.raises(InvalidInputError, match="sliding_window_layers"):
        solve(bad)
