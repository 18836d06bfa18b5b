"""An item of the wrong class registered through one of the measured profile's hooks is named with
its plugin (issue 24, a plugin author's first hour, helper AUTHORQA). The hooks declare no item type
to the manager (their classes load lazily), so a technique hook returning a Regime crashed with
``AttributeError: 'Regime' object has no attribute 'order'`` (techniques.py), a named object that is
not a Technique with ``TypeError: unhashable type``, and a regime, kernel, schedule or loss of the
wrong class was accepted, to fail wherever it was first used. Only families were checked."""

from __future__ import annotations

import types

import pytest

from mlsysim_core import PluginContractError, TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_plugins.measured.regimes import Regime

NOT_AN_ITEM = types.SimpleNamespace(name="myorg.thing")
A_REGIME = Regime(name="myorg.thing", description="a regime", weight=2, gradient=2, master=0, state=2, compute=2,
                  residual=2)


def _solve(hook, item, **kw):
    module = types.ModuleType("myorg_items")
    impl = hookimpl(lambda: [item])
    impl.__name__ = hook
    setattr(module, hook, impl)
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(module, name="myorg_items")
    return TrainingMemoryModel("measured", plugin_manager=pm).solve("llama3-8b", "h100", 1, 1024, **kw)


@pytest.mark.parametrize(("hook", "item", "expected", "kw"), [
    ("mlsysim_measured_techniques", NOT_AN_ITEM, "mlsysim_plugins.measured.techniques.Technique", {}),
    ("mlsysim_measured_techniques", A_REGIME, "mlsysim_plugins.measured.techniques.Technique", {}),
    ("mlsysim_measured_regimes", NOT_AN_ITEM, "mlsysim_plugins.measured.regimes.Regime", {}),
    ("mlsysim_measured_attention_kernels", NOT_AN_ITEM, "mlsysim_plugins.measured.kernels.AttentionKernel", {}),
    ("mlsysim_measured_pipeline_schedules", NOT_AN_ITEM, "mlsysim_plugins.measured.schedules.PipelineSchedule", {}),
    ("mlsysim_measured_architectures", NOT_AN_ITEM, "mlsysim_plugins.measured.families.ArchitectureFamily", {}),
    ("mlsysim_measured_losses", NOT_AN_ITEM, "mlsysim_plugins.measured.loss_implementations.LossImplementation",
     {"loss": "chunked"}),
])
def test_an_item_of_the_wrong_class_is_named_with_its_plugin(hook, item, expected, kw):
    with pytest.raises(PluginContractError) as err:
        _solve(hook, item, **kw)
    assert str(err.value) == (f"plugin 'myorg_items' (registered directly) hook {hook} registered "
                              f"{type(item).__name__} 'myorg.thing'; expected {expected}")
    assert (err.value.plugin, err.value.hook) == ("myorg_items", hook)


def test_a_regime_registered_where_regimes_go_is_taken():
    assert _solve("mlsysim_measured_regimes", A_REGIME, regime="myorg.thing").details["regime"] == "myorg.thing"
