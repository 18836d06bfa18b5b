"""One test per catalog hook spec (tests/core/test_hooks.py's meta-test counts them too).

Each registers a small plugin directly in a manager that also holds the built-ins, looks its
entry up through that manager, and checks the bytes of a solve by hand.
"""

import pytest

from mlsysim_core import TrainingMemoryModel, hookimpl
from mlsysim_core.catalog import CatalogEntry, find_hardware, find_model, get_hardware, get_model
from mlsysim_core.manager import PluginManager

P = 1_000_000_000


def manager_with(plugin, builtin_pm, name="test_plugin"):
    pm = PluginManager()
    for plugin_name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(plugin_name), name=plugin_name, info=builtin_pm.info(plugin_name))
    pm.register(plugin, name=name)
    return pm


def test_hook_mlsysim_catalog_models(builtin_pm):
    class Models:
        @hookimpl
        def mlsysim_catalog_models(self):
            return [CatalogEntry.from_dict({"key": "test/round-1b", "parameters": P, "layers": 10,
                                            "hidden_dim": 1000, "heads": 10,
                                            "sources": {"parameters": "round numbers"}}, kind="model")]
    pm = manager_with(Models(), builtin_pm)
    entry = find_model("TEST/Round-1B", plugin_manager=pm)
    assert entry.origin == "plugin" and entry.provided_by == "plugin 'test_plugin' (registered directly)"
    model = get_model("test/round-1b", plugin_manager=pm)
    r = TrainingMemoryModel(plugin_manager=pm).solve(model, "h100", 4, 100)
    assert (r.weights, r.gradients, r.optimizer_state) == (2 * P, 2 * P, 12 * P)   # bf16, bf16, Adam fp32
    assert r.activations == 10 * 34 * 100 * 4 * 1000                               # 34 s b h per layer


def test_hook_mlsysim_catalog_hardware(builtin_pm):
    class Hardware:
        @hookimpl
        def mlsysim_catalog_hardware(self):
            yield CatalogEntry.from_dict({"key": "test/card-20g", "memory_capacity": 20 * 10**9,
                                          "vendor": "Test"}, kind="hardware")
    pm = manager_with(Hardware(), builtin_pm)
    assert find_hardware("test/card-20g", plugin_manager=pm).extra["plugin"] == "test_plugin"
    gpu = get_hardware("test/card-20g", plugin_manager=pm)
    r = TrainingMemoryModel(plugin_manager=pm).solve("mlsysim:gpt2-small", gpu, 1, 128)
    assert r.weights == 2 * 124_000_000
    assert r.available_memory == 20 * 10**9 and r.hardware == gpu.name == "test/card-20g"
    with pytest.raises(Exception, match="test/card-20g"):   # unknown to a manager without the plugin
        find_hardware("test/card-20g", plugin_manager=builtin_pm)
