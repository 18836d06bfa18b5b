"""The Bamba family against numbers PyTorch measured, and the conformance kit.

Run with the package installed: ``pip install -e ".[test]" && pytest``. The measured numbers are
copied from ``validation/mamba2/measurements.json`` of mlsysim-core (transformers 5.23, torch 2.13,
CPU, MemTracker); mlsysim-core's ``tests/plugins/test_example_mamba2.py`` checks all 17 runs, phase by phase.
"""

import pytest

from mlsysim_core import HardwareNode, NotModelledError, PluginManager, TrainingMemoryModel, TransformerWorkload
from mlsysim_core.testing import assert_plugin_conforms

from mlsysim_mamba2.catalog import BAMBA_9B, BAMBA_TINY
from mlsysim_mamba2.family import BAMBA
from mlsysim_mamba2.workload import BambaWorkload

BIG = HardwareNode(name="unbounded", memory_capacity=2**60)


@pytest.fixture(scope="module")
def model():
    """Every installed plugin, this one included (through its entry point ``mamba2_hybrid``)."""
    pm = PluginManager.from_environment()
    assert "mamba2_hybrid" in pm.registry.plugins
    return TrainingMemoryModel("measured", plugin_manager=pm)


def solve(model, workload, b, s, regime, **kw):
    return model.solve(workload, BIG, b, s, "fp32" if regime == "fp32" else "bf16", "adamw", "none",
                       regime=regime, optimizer_impl="foreach", runtime_overheads=False, **kw)


def test_the_family_is_chosen_for_bamba(model):
    r = solve(model, BAMBA_TINY, 1, 64, "fp32")
    assert r.selected and not any("costed as Llama" in n for n in r.notes)
    assert not any("costed as their mean" in n for n in r.notes)      # one device: the mean layer is exact
    two = solve(model, BAMBA_TINY, 2, 64, "fp32", pp_size=2)
    assert any(n.startswith("approximation: Bamba layers are costed as their mean") for n in two.notes)
    assert BAMBA.claims_model(BAMBA_TINY) and BAMBA.claims_model(BAMBA_9B)


def test_bamba_tiny_fp32_b1_s64_as_measured(model):
    """bamba-tiny-fp32-b1-s64 (layers M M A M): the optimizer step's peak to the byte; the
    layers' saved tensors are the measured per-layer growth (3 x 4,103,794 + 1,280,512); the
    forward's peak 16 B under the measured (the fp32 loss, nll_loss's total weight and, at b = 1,
    one more int64 label, not modelled)."""
    r = solve(model, BAMBA_TINY, 1, 64, "fp32")
    assert r.phase_totals["optimizer_step"] == 90_525_100 == r.total_memory
    layers = [t for t in r.terms if t.label == "decoder layers: saved for backward"]
    assert [t.nbytes for t in layers] == [3 * 4_103_794 + 1_280_512]
    assert r.phase_totals["forward"] == 69_161_426 - 16


def test_bamba_tiny_bf16_b4_s256_as_measured(model):
    """bamba-tiny-bf16-b4-s256, activation-bound: the backward peaks at _log_softmax_backward_data,
    where PyTorch has released the int64 labels (8T) the profile keeps, less the 8 B of loss scalars."""
    r = solve(model, BAMBA_TINY, 4, 256, "bf16")
    T = 4 * 256
    assert r.peak_phase == "backward"
    assert r.phase_totals["backward"] == 225_693_290 + 8 * T - 8
    assert r.phase_totals["optimizer_step"] == 45_270_620


def test_what_is_not_modelled_is_refused_by_name(model):
    with pytest.raises(NotModelledError, match=r"regime='autocast \(amp-bf16, amp-fp16\)' is not allowed"):
        solve(model, BAMBA_TINY, 1, 64, "amp-bf16")
    with pytest.raises(NotModelledError, match="dropout"):
        solve(model, BAMBA_TINY, 1, 64, "fp32", dropout=0.1)
    plain = TransformerWorkload(name="bamba-as-transformer", parameters=BAMBA_TINY.parameters, layers=4,
                                hidden_dim=256, heads=8, kv_heads=2, vocab_size=2048, ffn_dim=640, gated_mlp=True,
                                tied_embeddings=False, architecture="bamba")
    with pytest.raises(NotModelledError, match="BambaWorkload"):
        solve(model, plain, 1, 64, "fp32")


def test_bamba_9b_in_the_catalog(model):
    from mlsysim_core.catalog import get_model
    bamba = get_model("bamba-9b", plugin_manager=PluginManager.from_environment())
    assert bamba == BAMBA_9B and isinstance(bamba, BambaWorkload)
    assert bamba.parameters == bamba.count_parameters() == 9_780_235_392
    r = model.solve("bamba-9b", "h100", 1, 4096, regime="bf16")
    assert r.peak_phase == "backward" and r.total_memory > 80 * 2**30     # the pure-torch scan: ~5 GB per layer


# The solves the conformance kit tries the family in: models it claims, under the measured profile.
LAYOUTS = {"mlsysim_measured_architectures": [
    {"model": "bamba-tiny", "profile": "measured", "regime": "fp32", "batch_size": 2, "seq_len": 128},
    {"model": "bamba-9b", "profile": "measured", "regime": "bf16", "batch_size": 8, "seq_len": 4096,
     "tp_size": 2, "pp_size": 2, "dp_size": 2, "activation_checkpointing": "full"},
]}


def test_the_installed_plugin_conforms():
    """The conformance kit, against the plugin as pip installed it (entry point ``mamba2_hybrid``),
    solving the family in ``LAYOUTS``."""
    report = assert_plugin_conforms("mamba2_hybrid", layouts=LAYOUTS)
    assert report.provides == {"mlsysim_measured_architectures": ("mamba2.bamba",)}
    assert report.source == "mlsysim-mamba2-hybrid 0.1.0"
    assert report.solves >= len(LAYOUTS["mlsysim_measured_architectures"])
