"""The low-bit and new optimizers (issue 16, item 5): torchao AdamW8bit/AdamW4bit/AdamWFp8,
bitsandbytes AdamW8bit (+ paged, unvalidated) and Muon with its AdamW split.

Every committed run of validation/techniques/optimizers/measurements.json is solved and
compared phase by phase; hand-derived byte counts; refusals and notes. No torch."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "validation" / "techniques" / "optimizers"
sys.path.insert(0, str(DIR))
sys.path.insert(0, str(ROOT / "validation" / "families"))
sys.path.insert(0, str(ROOT / "validation"))

import report_optimizers  # noqa: E402
from scripttools import load_script  # noqa: E402

CONFIGS = load_script(DIR / "configs.py")

NAMES = ("adamw-8bit-torchao", "adamw-4bit-torchao", "adamw-fp8-torchao", "adamw-8bit-bnb",
         "paged-adamw-8bit-bnb", "muon", "adamw-32bit-bnb", "paged-adamw-32bit-bnb", "adamw-8bit-bnb-hf",
         "paged-adamw-8bit-bnb-hf", "lion-32bit-bnb", "paged-lion-32bit-bnb")
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
RUNS = report_optimizers.load()


def _config(model):
    return CONFIGS.MODELS[model][0]


def solve(model="llama-s", optimizer="adamw-8bit-torchao", regime="fp32", impl="foreach", **kw):
    m = from_hf_config(_config(model), name=model)
    return TrainingMemoryModel().solve(m, BIG, 2, 64, "fp32" if regime == "fp32" else "bf16", optimizer, "none",
                                       profile="measured", regime=regime, optimizer_impl=impl, device="cpu",
                                       runtime_overheads=False, **kw)


def term(result, label):
    return sum(t.nbytes for t in result.terms if label in t.label)


@pytest.fixture(scope="module")
def rows():
    return report_optimizers.compare(RUNS)


def test_every_optimizer_is_measured_on_dense_and_moe_models_at_two_sizes():
    seen = {}
    for run in RUNS:
        seen.setdefault(run["optimizer"], set()).add(run["model"])
    for name in ("adamw-8bit-torchao", "adamw-4bit-torchao", "adamw-fp8-torchao", "adamw-8bit-bnb", "adam-8bit",
                 "muon", "adamw-32bit-bnb", "adamw-8bit-bnb-hf", "lion-32bit-bnb"):
        assert {"llama-s", "llama-m", "mixtral-s", "mixtral-m"} <= seen.get(name, set()), (name, seen.get(name))


def test_every_phase_meets_the_targets(rows):
    peak = [abs(r["peak_error"]) for r in rows]
    assert statistics.median(peak) <= 0.03 and max(peak) <= 0.10
    for phase in report_optimizers.PHASES:
        errors = [abs(r["errors"][phase]) for r in rows]
        assert statistics.median(errors) <= 0.03, phase
        assert max(errors) <= 0.10, (phase, max(errors))


# inductor realized 2-4 n B more on a 3-D expert stack here (README: not derived, not fitted)
NOT_MODELLED = {"mixtral-m-adamw-8bit-torchao": -0.0509, "mixtral-s-adamw-4bit-torchao": -0.0573}


def test_the_step_is_exact_where_it_is_the_peak(rows):
    # the optimizer phase holds the step's temporaries: within 1 % for every new optimizer
    for r in rows:
        if r["run"]["id"] in NOT_MODELLED:
            assert r["errors"]["optimizer"] == pytest.approx(NOT_MODELLED[r["run"]["id"]], abs=0.001)
        elif r["run"]["optimizer"] in NAMES:
            assert abs(r["errors"]["optimizer"]) < 0.01, (r["run"]["id"], r["errors"])


def test_torchao_8bit_layout_by_hand():
    # llama-s: h 128, ffn 256, 2 layers, kv 64, vocab 1024, untied. Every matrix is >= 4096
    # elements and a multiple of 256: quantized; the 5 norms (128 each) stay fp32.
    q = 2 * 1024 * 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256)
    per_moment = q * 1 + (q // 256) * 4 + 16 * 256 * 4 + 5 * 128 * 4   # codes, scales, 16 maps, fp32 norms
    r = solve(optimizer="adamw-8bit-torchao")
    assert term(r, "adamw-8bit-torchao moments") == 2 * per_moment
    assert term(r, "step counters") == 21 * 4
    # the compiled step: the largest quantized tensor (embedding, 131,072) x 8 B + 2 x 512 new scales
    assert term(r, "compiled step temporaries") == 131072 * 8 + 2 * 512 * 4


def test_torchao_4bit_and_fp8_by_hand():
    r4 = solve(optimizer="adamw-4bit-torchao")
    q = 2 * 1024 * 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256)
    assert term(r4, "adamw-4bit-torchao moments") == 2 * (q // 2 + (q // 128) * 4 + 16 * 16 * 4 + 5 * 128 * 4)
    assert term(r4, "compiled step temporaries") == 131072 * 26 + 2 * 1024 * 4
    r8 = solve(optimizer="adamw-fp8-torchao")
    assert term(r8, "adamw-fp8-torchao moments") == 2 * (q + (q // 256) * 4 + 5 * 128 * 4)   # no maps
    assert term(r8, "compiled step temporaries") == 131072 * 2 + 2 * 512 * 4


def test_torchao_keeps_tensors_that_are_no_block_multiple_in_full_precision():
    from mlsysim_plugins import lowbit_optimizers as lb

    class Plan:
        profile_options = type("O", (), {"lora": None})()
    import mlsysim_plugins.measured.optimizers as mo
    orig = mo.trainable_tensors
    try:
        mo.trainable_tensors = lambda plan: (4096, 4095, 4096 + 64, 8192)
        _, quantized, small = lb._torchao_layout(Plan(), "adamw-8bit-torchao")
    finally:
        mo.trainable_tensors = orig
    assert quantized == [4096, 8192] and small == 4095 + 4160   # 4160 % 256 != 0: full precision


def test_bnb_layout_by_hand():
    r = solve(optimizer="adamw-8bit-bnb")
    q = 2 * 1024 * 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256)
    assert term(r, "adamw-8bit-bnb moments") == 2 * (q + 4 * (q // 256) + 4 * 5 * 128)
    assert term(r, "quantization maps") == 2 * 256 * 4       # qmap1/qmap2 shared by every tensor
    assert not any(t.phases == ("optimizer_step",) for t in r.terms if "adamw-8bit-bnb" in t.label)


def test_paged_moments_leave_the_allocator_and_are_said_unvalidated():
    """PagedAdamW8bit: the 8-bit moments of tensors of >= 100,000 elements are in CUDA unified memory
    (bitsandbytes get_state_buffer), outside the allocator: the host tier. llama-s (h 128, vocab 1024,
    untied) has two: the embedding and the LM head, 1024 x 128 = 131,072 elements each; its layers'
    matrices (at most 256 x 128) stay ordinary device tensors."""
    paged, plain = solve(optimizer="paged-adamw-8bit-bnb"), solve(optimizer="adamw-8bit-bnb")
    unified = 2 * (2 * 1024 * 128)                # 2 moments x 2 tensors x 1 B
    assert paged.host_memory == unified and plain.host_memory == 0
    assert paged.total_memory == plain.total_memory - unified
    assert any("paged-adamw-8bit-bnb is unvalidated" in n for n in paged.notes)
    from mlsysim_plugins import lowbit_optimizers
    spec = next(s for s in lowbit_optimizers.mlsysim_optimizers() if s.name == "paged-adamw-8bit-bnb")
    assert "unvalidated" in spec.description


def test_torchao_results_say_what_the_step_rests_on():
    assert any("inductor's CPU code" in n for n in solve(optimizer="adamw-4bit-torchao").notes)
    assert not any("inductor" in n for n in solve(optimizer="adamw-8bit-bnb").notes)


def test_muon_split_and_newton_schulz_peak_by_hand():
    r = solve(optimizer="muon", impl="fused")
    # Muon: q, k, v, o, gate, up, down of 2 layers; AdamW: embedding, LM head, 5 norms
    muon = 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256)
    adamw = 2 * 1024 * 128 + 5 * 128
    assert term(r, "muon momentum buffers") == muon * 4
    assert term(r, "muon's adamw state") == 2 * adamw * 4
    assert term(r, "muon's adamw step counters") == 7 * 4
    # Newton-Schulz on the largest matrix (256 x 128, fp32 grads): update 4 n + bf16 X and new X
    # 2 n each + the two 128 x 128 bf16 Gram matrices; AdamW fused adds nothing
    n = 256 * 128
    assert term(r, "muon step temporaries") == 4 * n + 2 * n + 2 * n + 2 * 2 * 128 * 128
    # foreach: AdamW's one temporary over its 262,784 parameters is larger
    assert term(solve(optimizer="muon"), "muon step temporaries") == adamw * 4


def test_muon_puts_moe_expert_stacks_in_adamw():
    r = solve("mixtral-s", optimizer="muon", impl="fused")
    h, f, e = 128, 256, 4
    muon = 2 * (2 * h * h + 2 * 64 * h + e * h)             # attention + router per layer
    assert term(r, "muon momentum buffers") == muon * 4
    adamw = 2 * 1024 * h + 5 * h + 2 * (e * 2 * f * h + e * h * f)
    assert term(r, "muon's adamw state") == 2 * adamw * 4


def test_refusals():
    with pytest.raises(NotModelledError, match="Muon's split of LoRA adapters is not modelled"):
        solve(optimizer="muon", lora={"rank": 8})
    with pytest.raises(InvalidInputError, match="optimizer='adamw-2bit-torchao'"):
        solve(optimizer="adamw-2bit-torchao")


def test_reference_grade():
    m = from_hf_config(_config("llama-s"), name="llama-s")
    P = m.parameters
    for name, bpp in (("adamw-8bit-torchao", 6), ("adamw-4bit-torchao", 5), ("adamw-fp8-torchao", 6),
                      ("adamw-8bit-bnb", 6), ("muon", 8)):
        r = TrainingMemoryModel().solve(m, BIG, 2, 64, "fp32", name, "none")
        assert r.optimizer_state == pytest.approx(P * bpp), name


def test_added_step_time():
    from mlsysim_plugins import lowbit_optimizers, muon
    plan = _plan("adamw-8bit-torchao")
    seconds, how = lowbit_optimizers.added_step_time(plan, memory_bandwidth=10**12)
    params = plan.model.parameters
    assert seconds == pytest.approx(4 * params / 10**12) and "memory bandwidth" in how   # 2 x 8 - 12 B
    assert lowbit_optimizers.added_step_time(_plan("adamw-8bit-bnb"), memory_bandwidth=10**12)[0] == 0.0
    seconds = lowbit_optimizers.added_step_time(_plan("adamw-4bit-torchao"), memory_bandwidth=10**12)[0]
    assert seconds == pytest.approx(38 * params / 10**12)                                # 2 x 26 - 14 B
    assert lowbit_optimizers.added_step_time(attrs.evolve(plan, hardware=attrs.evolve(
        plan.hardware, memory_bandwidth=None)))[0] is None
    seconds, how = muon.added_step_time(_plan("muon"), hardware_flops=1e12)
    layer = [(128, 128), (64, 128), (64, 128), (128, 128), (256, 128), (256, 128), (128, 256)]
    flops = 5 * 2 * sum(4 * min(a, b) ** 2 * max(a, b) + 2 * min(a, b) ** 3 for a, b in layer)
    assert seconds == pytest.approx(flops / 1e12) and "Newton-Schulz" in how


def _plan(optimizer, model="llama-s", solver=None):
    from mlsysim_core.inputs import check_plan, profile_plan
    reg = (solver or TrainingMemoryModel()).registry
    plan = check_plan(reg, "measured", from_hf_config(_config(model), name=model), BIG, 2, 64, "fp32",
                      optimizer, "none", 1, 1, 1, 1, 0, 1, 1.0, 0.05, False, None, None, None, (), 1)
    return profile_plan(reg, reg.profiles["measured"], plan, {"regime": "fp32", "device": "cpu"})


def test_a_renamed_low_bit_optimizer_is_priced_and_offered_as_the_original():
    """``fit techniques`` reads the optimizer's declaration (``OptimizerStep.quantized_moments``,
    ``moment_traffic``, ``step_realized``), never its name: the torchao 8-bit spec registered as
    another name is active in the ladder and adds the same step time."""
    from mlsysim_core import hookimpl
    from mlsysim_core.manager import PluginManager
    from mlsysim_plugins import lowbit_optimizers
    from mlsysim_plugins.measured.builtin_techniques import TECHNIQUES
    spec = next(s for s in lowbit_optimizers.mlsysim_optimizers() if s.name == "adamw-8bit-torchao")

    class Renamed:
        @hookimpl
        def mlsysim_optimizers(self):
            return [attrs.evolve(spec, name="my-8bit")]

    pm = PluginManager.from_environment()
    pm.register(Renamed(), name="renamed-8bit")
    solver = TrainingMemoryModel(plugin_manager=pm)
    lowbit = next(t for t in TECHNIQUES if t.keyword == "optimizer")
    plans = [_plan(name, solver=solver) for name in ("adamw-8bit-torchao", "my-8bit")]
    assert [lowbit.active(p) for p in plans] == [True, True]
    times = [lowbit_optimizers.added_step_time(p, memory_bandwidth=10**12)[0] for p in plans]
    assert times[0] == times[1] > 0
    assert not lowbit.active(_plan("adamw", solver=solver))


def test_bnb_32bit_by_hand_and_its_paged_variant():
    """bitsandbytes' AdamW32bit: two fp32 moments per parameter whatever its dtype, one in-place kernel
    (no step temporaries; measured: every phase of the four runs within 0.01 %). PagedAdamW32bit: the
    moments of the embedding and the LM head (131,072 elements each, >= 100,000) in unified memory."""
    plain, paged = solve(optimizer="adamw-32bit-bnb"), solve(optimizer="paged-adamw-32bit-bnb")
    params = 2 * 1024 * 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256) + 5 * 128
    assert term(plain, "adamw-32bit-bnb moments (fp32)") == 2 * 4 * params
    assert plain.host_memory == 0 and paged.host_memory == 2 * 4 * (2 * 1024 * 128)
    assert paged.total_memory == plain.total_memory - paged.host_memory
    assert any("paged-adamw-32bit-bnb is unvalidated" in n for n in paged.notes)
    assert not any("unvalidated" in n for n in plain.notes)


def test_hugging_face_trainer_keeps_the_embeddings_moments_in_fp32():
    """transformers' Trainer gives every nn.Embedding weight 32-bit states under an 8-bit bitsandbytes
    optimizer (GlobalOptimManager.register_module_override; measured: validation/techniques/optimizers,
    ``adamw-8bit-bnb-hf``, every optimizer phase exact). llama-s's embedding, 1024 x 128 = 131,072
    elements: 2 fp32 moments (8 B each element) instead of 2 x (1 B + an fp32 absmax per 256)."""
    hf, plain = solve(optimizer="adamw-8bit-bnb-hf"), solve(optimizer="adamw-8bit-bnb")
    e = 1024 * 128
    assert hf.total_memory - plain.total_memory == 2 * 4 * e - 2 * (e + 4 * (e // 256))
    paged = solve(optimizer="paged-adamw-8bit-bnb-hf")     # the LM head's 8-bit, the embedding's fp32 moments
    assert paged.host_memory == 2 * e + 2 * 4 * e
    lora = solve(optimizer="adamw-8bit-bnb-hf", lora={"rank": 8})
    assert lora.total_memory == solve(optimizer="adamw-8bit-bnb", lora={"rank": 8}).total_memory


def test_bnb_lion_32bit_is_one_fp32_moment_and_no_temporary():
    """bitsandbytes' Lion32bit (what Hugging Face's ``lion_32bit`` builds): one fp32 moment whatever the
    weights' dtype and an in-place kernel, where ``lion`` (lion-pytorch style) keeps its momentum in the
    state dtype and a foreach temporary (measured: the four runs' optimizer phase exact)."""
    params = 2 * 1024 * 128 + 2 * (2 * 128 * 128 + 2 * 64 * 128 + 3 * 128 * 256) + 5 * 128
    r = solve(optimizer="lion-32bit-bnb", regime="bf16")
    assert term(r, "lion-32bit-bnb moments (fp32)") == 4 * params
    assert not any(t.phases == ("optimizer_step",) for t in r.terms if t.component == "optimizer_state")
    paged = solve(optimizer="paged-lion-32bit-bnb", regime="bf16")
    assert paged.host_memory == 4 * (2 * 1024 * 128) and paged.total_memory == r.total_memory - paged.host_memory
