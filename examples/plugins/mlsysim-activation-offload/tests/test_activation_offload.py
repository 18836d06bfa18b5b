"""Activation offloading's numbers, derived by hand (see README.md), and the conformance kit.

Run with the package installed: ``pip install -e ".[test]" && pytest``.
"""

import pytest

from mlsysim_core import InvalidInputError, PluginManager, TrainingMemoryModel
from mlsysim_core.testing import assert_plugin_conforms
from mlsysim_activation_offload import offload

NAME = "offload.selective-offload"
# Llama-3.1-8B (32 layers, hidden 4096), global batch 8 (micro-batch 8), s = 2048, fp16:
PER_LAYER = 34 * 2048 * 8 * 4096        # 2,281,701,376 B per layer (Korthikanti, selective)


@pytest.fixture
def model():
    pm = PluginManager()
    pm.load_entrypoints(third_party=False)
    pm.register(offload, name="activation_offload")
    return TrainingMemoryModel(plugin_manager=pm)


def _by_label(result):
    return {t.label: (t.nbytes, t.tier) for t in result.terms_of("activations")}


def test_one_layer_kept_one_in_flight_the_rest_on_the_host(model):
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME)
    assert PER_LAYER == 2_281_701_376
    assert _by_label(r) == {
        "activations kept on device (selective recompute)": (1 * PER_LAYER, "accelerator"),
        "offload staging buffer (one layer in flight)": (1 * PER_LAYER, "accelerator"),
        "activations offloaded to host memory": (31 * PER_LAYER, "host"),
    }
    assert r.activations == 2 * PER_LAYER == 4_563_402_752
    assert r.host_memory == 31 * PER_LAYER == 70_732_742_656
    selective = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048)
    assert selective.activations == 32 * PER_LAYER
    # Host bytes never count against the accelerator.
    assert selective.total_memory - r.total_memory == 30 * PER_LAYER
    assert {t.source for t in r.terms_of("activations")} == {"activation_offload"}


def test_the_readme_example_fits_only_with_offloading(model):
    # Global batch 32 over dp = 8 (micro-batch 4), s = 4096, ZeRO-3.
    kw = dict(dp_size=8, zero_stage=3)
    per_layer = 34 * 4096 * 4 * 4096
    assert per_layer == PER_LAYER
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 32, 4096, activation_checkpointing=NAME, **kw)
    selective = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 32, 4096, **kw)
    assert (r.activations, r.host_memory) == (4_563_402_752, 70_732_742_656)
    assert r.feasible and not selective.feasible
    assert round(r.gb.total_memory, 3) == 20.724 and round(selective.gb.total_memory, 3) == 89.175


def test_a_wider_window(model):
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME,
                    plugin_options={NAME: {"layers_on_device": 4}})
    assert r.activations == (4 + 1) * PER_LAYER
    assert r.host_memory == 28 * PER_LAYER


def test_nothing_to_offload_is_plain_selective(model):
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME,
                    plugin_options={NAME: {"layers_on_device": 32}})
    assert r.activations == model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048).activations
    assert r.host_memory == 0
    assert len(r.terms_of("activations")) == 1


def test_pipeline_stages_and_sequence_parallelism(model):
    # pp = 4: 8 layers on a stage; tp = 4 with sequence parallelism: everything / 4.
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, tp_size=4, pp_size=4, activation_checkpointing=NAME)
    assert r.activations == 2 * PER_LAYER / 4
    assert r.host_memory == 7 * PER_LAYER / 4


def test_precision_scales_the_bytes(model):
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, precision="fp32", activation_checkpointing=NAME)
    assert r.host_memory == 31 * PER_LAYER * 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, "one"])
def test_bad_options_are_rejected(model, bad):
    with pytest.raises(InvalidInputError):
        model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME,
                    plugin_options={NAME: {"layers_on_device": bad}})


@pytest.mark.parametrize("options", [{}, {NAME: {"layers_on_device": 2}}])
def test_the_installed_plugin_conforms(options):
    report = assert_plugin_conforms("activation_offload", options=options)
    assert [name for names in report.provides.values() for name in names] == [NAME]
    assert report.source == "mlsysim-activation-offload 0.1.0"
