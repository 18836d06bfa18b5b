"""The Llama-variant families (issue 15): Qwen2, Qwen3, OLMo 2 and Phi-3, each modelled as it is
(plugins/mlsysim_plugins/measured/architectures/llama_variants.py). No torch.

Every run of validation/families/llama_variants/measurements.json (PyTorch's MemTracker, torch 2.13,
transformers 5.23, CPU; real runs and FakeTensorMode runs at public shapes) is solved and compared
phase by phase; hand-derived byte counts check the mechanisms each family adds to Llama's layer.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from familytools import family_runs, phase_errors, solve_model, solve_run
from mlsysim_core import NotModelledError, TrainingMemoryModel
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured.architectures import llama_variants as lv
from mlsysim_plugins.measured.families import LLAMA, family_for
from mlsysim_plugins.measured.kernels import BUILTIN_KERNELS
from mlsysim_plugins.measured.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]
RUNS = [r for r in family_runs("llama_variants") if "measured" in r]
CONFIGS = ROOT / "tests" / "data" / "hf_configs"
ARCHES = ("qwen2", "qwen3", "olmo2", "phi3")
MIB = 2**20


@pytest.fixture(scope="module")
def measured(builtin_pm):
    return TrainingMemoryModel("measured", plugin_manager=builtin_pm)


def _tiny(model_type, **extra):
    d = dict(model_type=model_type, vocab_size=8192, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6,
             tie_word_embeddings=False, use_cache=False)
    d.update(extra)
    return d


def _solve(measured, run_or_model, *, batch=2, regime="fp32", **options):
    model = run_or_model if not isinstance(run_or_model, dict) else from_hf_config(run_or_model, name="m")
    return solve_model(model, batch=batch, regime=regime, solver=measured, **options)


def _errors(measured, run) -> dict:
    r = solve_run(run, solver=measured)
    assert not [n for n in r.notes if n.startswith("approximation")], r.notes
    return phase_errors(run, r)


# --- the measured runs ----------------------------------------------------------------------------

def test_every_architecture_has_real_and_public_shape_runs():
    for arch in ARCHES:
        runs = [r for r in RUNS if r["hf_config"]["model_type"] == arch]
        assert {r["method"] for r in runs} == {"real", "fake"}, arch
        real = [r for r in runs if r["method"] == "real"]
        assert {r["regime"] for r in real} == {"fp32", "bf16", "amp-bf16"}, arch
        assert {r["attention"] for r in real} == {"sdpa", "eager"}, arch
        assert {r["checkpointing"] for r in real} == {"none", "full"}, arch


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_phase_of_every_run(measured, run):
    errors = _errors(measured, run)
    # Derived op by op: every phase within 1 % (most are exact to the byte).
    assert max(abs(e) for e in errors.values()) <= 0.01, errors


@pytest.mark.parametrize("arch", ARCHES)
def test_peak_targets_per_architecture(measured, arch):
    peaks = [abs(_errors(measured, r)["peak"]) for r in RUNS if r["hf_config"]["model_type"] == arch]
    assert statistics.median(peaks) <= 0.03 and max(peaks) <= 0.10


# --- which family ------------------------------------------------------------------------------------

@pytest.mark.parametrize("arch", ARCHES)
def test_the_variant_family_models_its_architecture_without_a_note(builtin_pm, arch):
    from mlsysim_plugins.measured.families import HOOK
    families = {f.name: f for fs in getattr(builtin_pm.hook, HOOK)() for f in fs}
    model = from_hf_config(_tiny(arch), name="m")
    family, notes = family_for(model, families)
    assert family is lv._BY_ARCH[arch] and notes == ()
    assert family.count_parameters(model) == model.parameters


@pytest.mark.parametrize("name", ["Phi-3-mini-4k-instruct", "Qwen2.5-0.5B"])
def test_parameter_tensors_of_public_configs_sum_to_the_exact_count(name):
    model = from_hf_config(CONFIGS / f"{name}.json")
    shape = ModelShape.of(model, lv._BY_ARCH[model.architecture])
    assert sum(shape.parameter_tensors()) == model.parameters
    assert sum(r * (c or 1) for r, c in shape.matrix_shapes()) == model.parameters


# --- hand-derived bytes -------------------------------------------------------------------------------

def _layer(arch, regime, attention="sdpa", *, h=256, heads=8, kv=2, d=32, f=688, T=512, s=256, model=None):
    return lv._BY_ARCH[arch].layer_bytes(kernel=BUILTIN_KERNELS[attention], device="cpu", hidden=h, heads=heads,
                                         kv_heads=kv, head_dim=d, ffn=f, experts=0, top_k=0, regime=regime,
                                         dropout=False, tokens=T, seq_len=s, model=model)


def _llama(regime, attention="sdpa", *, d=32):
    """The built-in Llama layer of the same shape (what each variant adds to)."""
    return LLAMA.layer_bytes(kernel=BUILTIN_KERNELS[attention], device="cpu", hidden=256, heads=8, kv_heads=2,
                             head_dim=d, ffn=688, experts=0, top_k=0, regime=regime, dropout=False, tokens=512,
                             seq_len=256)


@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
def test_qwen2_biases_add_no_saved_tensor(regime):
    # addmm saves its input and weight; the bias gradient is a sum of the output gradient.
    assert _layer("qwen2", regime).saved == _llama(regime).saved


def test_qwen2_biases_are_parameters_and_amp_copies(measured):
    cfg = _tiny("qwen2")
    model = from_hf_config(cfg, name="m")
    llama = from_hf_config({**cfg, "model_type": "llama", "attention_bias": False}, name="m")
    q, kv = 256, 64
    assert model.parameters - llama.parameters == 4 * (q + 2 * kv)      # 4 layers x (q + k + v biases)
    a = _solve(measured, model, regime="amp-bf16")
    copies = [t for t in a.terms if "autocast 16-bit copies of the layers" in t.label]
    assert copies[0].nbytes == 2 * 4 * (256 * (q + 2 * kv) + q * 256 + 3 * 256 * 688 + q + 2 * kv)


@pytest.mark.parametrize("regime,per_token", [
    # per norm over n with g groups: fp32 input 4n + normalized (fp32 4n | bf16 2n) + rsqrt 4g;
    # q: n = 8 x 64 = 512, g = 8; k: n = 2 x 64 = 128, g = 2.
    ("fp32", 8 * (512 + 128) + 4 * (8 + 2)),
    ("bf16", 6 * (512 + 128) + 4 * (8 + 2)),
    ("amp-bf16", 6 * (512 + 128) + 4 * (8 + 2)),
])
def test_qwen3_qk_norm_bytes(regime, per_token):
    qwen3 = _layer("qwen3", regime, d=64)
    assert qwen3.saved - _llama(regime, d=64).saved == per_token * 512
    assert any(p.name.startswith("QK-norm") for p in qwen3.parts)


@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
def test_olmo2_layer_by_hand(regime):
    h, q, kv, f, T = 256, 256, 64, 688, 512
    c = 4 if regime == "fp32" else 2
    norm = lambda n: 8 * n + 4                                     # noqa: E731  Olmo2RMSNorm keeps fp32 normalized
    attention = c * (q + 2 * kv) + c * q + 4 * 8                   # SDPA: q, k, v, output, logsumexp
    mid = {"fp32": 4 * h, "bf16": 2 * h, "amp-bf16": 4 * h}[regime]   # AMP: the gate and up casts
    casts = 6 * h if regime == "amp-bf16" else 0                   # AMP: q/k/v casts of the raw input
    per_token = casts + norm(q) + norm(kv) + attention + norm(h) + mid + 4 * c * f + norm(h)
    lb = _layer("olmo2", regime, d=32)
    assert lb.saved == per_token * T
    assert lb.output_saved_by_next == (regime != "amp-bf16")      # q/k/v read the raw residual


def test_olmo2_final_norm_keeps_fp32_normalized_in_bf16():
    assert lv.OLMO2_NORM.final_saved("bf16", 2, 10, 100)[0] == 10 * 10 * 100 + 40
    assert lv.OLMO2_NORM.final_saved("fp32", 4, 10, 100)[0] == 8 * 10 * 100 + 40


@pytest.mark.parametrize("regime", ["fp32", "bf16", "amp-bf16"])
def test_phi3_fused_qkv_stays_whole_under_sdpa(regime):
    c = 4 if regime == "fp32" else 2
    phi3, llama = _layer("phi3", regime), _llama(regime)
    # SDPA keeps v, a view of qkv: its q and k parts (c x (q + kv)) stay; rotary's q is laid out
    # (b, heads, s, d) (q is a slice of qkv), so the output's transpose is copied once more (c x q);
    # AMP casts the input once for qkv_proj and once for gate_up_proj instead of five times.
    fewer_casts = 3 * 2 * 256 if regime == "amp-bf16" else 0
    assert phi3.saved - llama.saved == (c * (256 + 64) + c * 256 - fewer_casts) * 512
    # Eager with GQA (k, v repeated) or batch > 1 (matmul's reshape copies v) keeps nothing more.
    assert _layer("phi3", regime, "eager").saved == _llama(regime, "eager").saved - fewer_casts * 512
    # Batch 1 without GQA: matmul's reshape of v is a view, the whole qkv stays (c x (q + kv) more).
    mha = dict(kv=8, T=256)
    eager_b1 = _layer("phi3", regime, "eager", **mha).saved
    llama_b1 = LLAMA.layer_bytes(kernel=BUILTIN_KERNELS["eager"], device="cpu", hidden=256, heads=8, kv_heads=8,
                                 head_dim=32, ffn=688, experts=0, top_k=0, regime=regime, dropout=False, tokens=256,
                                 seq_len=256).saved
    assert eager_b1 - llama_b1 == (c * (256 + 256) - fewer_casts) * 256


def test_phi3_partial_rotary_scales_the_rope_terms(measured):
    full = _solve(measured, _tiny("phi3", sliding_window=None))
    part = _solve(measured, _tiny("phi3", sliding_window=None, partial_rotary_factor=0.75))
    rope = lambda r: {t.label: t.nbytes for t in r.terms if t.label.startswith("RoPE")}  # noqa: E731
    assert rope(part) == {k: v * 24 / 32 for k, v in rope(full).items()} and len(rope(full)) == 2


# --- refusals ------------------------------------------------------------------------------------------

def test_sliding_window_layers_are_refused(measured):
    with pytest.raises(NotModelledError, match="sliding_window_layers"):
        _solve(measured, _tiny("qwen2", use_sliding_window=True, sliding_window=128, max_window_layers=0))


def test_phi3_from_its_window_on_sdpa_is_refused_and_below_it_is_not(measured):
    # transformers masks from kv_length >= sliding_window on (masking_utils._ignore_causal_mask_sdpa)
    model = from_hf_config(_tiny("phi3", sliding_window=200), name="m")
    with pytest.raises(NotModelledError, match="sliding window 200"):
        _solve(measured, model, seq=200)
    assert _solve(measured, model, seq=199).total_memory > 0
    assert _solve(measured, model, seq=256, attention="eager").total_memory > 0


def test_phi3_dropout_is_refused(measured):
    model = from_hf_config(_tiny("phi3", sliding_window=None), name="m")
    with pytest.raises(NotModelledError, match="residual and embedding dropouts"):
        _solve(measured, model, dropout=0.1)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "olmo2"])
def test_lora_is_derived_from_the_family(measured, arch):
    """LoRA on the variants: the adapters from their layer weights (tests/measured/test_lora_families.py)."""
    result = _solve(measured, _tiny(arch), lora=dict(rank=8))
    assert any("derived from the family's description" in n for n in result.notes)


def test_olmo2_rope_tables_are_fp32_in_bf16(measured):
    # Olmo2RotaryEmbedding.forward returns fp32 cos, sin (no cast): 2 x s x head_dim x 4 B.
    result = _solve(measured, _tiny("olmo2"), regime="bf16")
    table = next(t for t in result.terms if t.label.startswith("RoPE cos/sin"))
    assert table.nbytes == 2 * 256 * 32 * 4
    qwen3 = _solve(measured, _tiny("qwen3", head_dim=32), regime="bf16")
    assert next(t for t in qwen3.terms if t.label.startswith("RoPE cos/sin")).nbytes == 2 * 256 * 32 * 2
