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


def test_zero_layers_on_device_offloads_every_layer(model):
    """layers_on_device=0: every layer in host memory (save_on_cpu around the whole forward)."""
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME,
                    plugin_options={NAME: {"layers_on_device": 0}})
    assert _by_label(r) == {
        "offload staging buffer (one layer in flight)": (1 * PER_LAYER, "accelerator"),
        "activations offloaded to host memory": (32 * PER_LAYER, "host"),
    }


# --- measured grade (save_on_cpu, measured in PyTorch: validation/examples/) ------------------------

# One Llama-3.1-8B layer under save_on_cpu, fp32, SDPA, micro-batch 1, s = 2048 (T = 2048 tokens):
# every op copies what it saves (norm inputs and outputs, q/k/v inputs x 3, SDPA's q, k, v, output and
# logsumexp, RoPE cos/sin for q and k, the MLP's 2 T h + 4 T f), plus the weights the layer saves.
T, S, H, KV, A, F, D = 2048, 2048, 4096, 1024, 32, 14_336, 128
LAYER_ELEMENTS = 11 * T * H + 3 * T * H + 2 * T * KV + T * A + 4 * T + 4 * T * F + 4 * S * D
LAYER_WEIGHTS = 2 * H * H + 2 * H * KV + 3 * H * F + 2 * H          # q, o, k, v, the MLP, 2 norms
HOST_LAYER = 4 * (LAYER_ELEMENTS + LAYER_WEIGHTS)


@pytest.fixture
def measured(model):
    return TrainingMemoryModel("measured", plugin_manager=model.plugin_manager)


def test_measured_grade_every_layer_offloaded(measured):
    r = measured.solve("llama3-8b", "mlsysim:h100", 1, 2048, precision="fp32", regime="fp32",
                       activation_checkpointing=NAME, plugin_options={NAME: {"layers_on_device": 0}})
    assert HOST_LAYER == 1_833_238_528
    assert r.host_memory == 32 * HOST_LAYER
    terms = {t.label: t for t in r.terms_of("activations") if t.source == "activation_offload"}
    assert set(terms) == {"activations offloaded to host memory", "offload staging buffer (one layer in flight)"}
    staging = terms["offload staging buffer (one layer in flight)"]
    assert staging.nbytes == HOST_LAYER and staging.phases == ("backward_end",)
    assert "measured to the byte" in terms["activations offloaded to host memory"].formula


def test_measured_grade_kept_layers_keep_what_they_save(measured):
    kw = dict(precision="fp32", regime="fp32")
    plain = measured.solve("llama3-8b", "mlsysim:h100", 1, 2048, activation_checkpointing="selective", **kw)
    [layers] = [t for t in plain.terms_of("activations") if t.label.startswith("decoder layers")]
    r = measured.solve("llama3-8b", "mlsysim:h100", 1, 2048, activation_checkpointing=NAME,
                       plugin_options={NAME: {"layers_on_device": 2}}, **kw)
    [kept] = [t for t in r.terms_of("activations") if t.label.startswith("activations kept")]
    assert kept.nbytes == 2 * layers.nbytes / 32
    assert r.host_memory == 30 * HOST_LAYER


def test_measured_grade_says_what_it_approximates(measured):
    """Outside the measured case the host bytes are the profile's saved bytes plus the weights."""
    r = measured.solve("llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME)
    [host] = [t for t in r.terms if t.tier == "host"]
    assert "approximation (regime amp-fp16)" in host.formula


@pytest.mark.parametrize("bad", [-1, 1.5, "one"])
def test_bad_options_are_rejected(model, bad):
    with pytest.raises(InvalidInputError):
        model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048, activation_checkpointing=NAME,
                    plugin_options={NAME: {"layers_on_device": bad}})


@pytest.mark.parametrize("options", [{}, {NAME: {"layers_on_device": 2}}])
def test_the_installed_plugin_conforms(options):
    report = assert_plugin_conforms("activation_offload", options=options)
    assert [name for names in report.provides.values() for name in names] == [NAME]
    assert report.source == "mlsysim-activation-offload 0.1.0"
