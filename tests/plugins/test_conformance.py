"""The conformance kit passes every built-in plugin and catches broken ones."""

import random

import attrs
import pytest

from mlsysim_core import MemoryTerm, OPTIMIZER_STATE, OptimizerSpec, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.testing import ConformanceError, assert_plugin_conforms, check_plugin

BUILTINS = ["adam", "adamw", "communication_buffers", "expert_parallel", "full_checkpointing",
            "model_states", "no_checkpointing", "no_optimizer", "pipeline_parallel", "reference_profile",
            "selective_checkpointing", "sgd", "tensor_parallel", "zero"]


@pytest.mark.parametrize("plugin", BUILTINS)
def test_builtins_conform(builtin_pm, plugin):
    report = assert_plugin_conforms(plugin, plugin_manager=builtin_pm)
    assert report.source == "mlsysim-core 0.1.0" and report.solves >= 1


def _pm_with(builtin_pm, plugin, name):
    pm = PluginManager()
    for n in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(n), name=n, info=builtin_pm.info(n))
    pm.register(plugin, name=name)
    return pm


@attrs.frozen
class RankOptions:
    rank: int = attrs.field(default=8, validator=attrs.validators.gt(0))


class GoodOptimizer:
    @hookimpl
    def mlsysim_optimizers(self):
        def state(plan, placement, options):
            return [MemoryTerm(component=OPTIMIZER_STATE, label="low rank",
                               nbytes=options.rank * plan.hidden_dim * 8 / placement.optimizer_state_shards)]
        return [OptimizerSpec(name="test.good", state_terms=state, options_type=RankOptions)]


class NoisyOptimizer:
    @hookimpl
    def mlsysim_optimizers(self):
        def state(plan, placement, options):
            return [MemoryTerm(component=OPTIMIZER_STATE, label="noise", nbytes=random.random() * 1e9)]
        return [OptimizerSpec(name="test.noisy", state_terms=state)]


class NeedsOptions:
    @hookimpl
    def mlsysim_optimizers(self):
        @attrs.frozen
        class Required:
            rank: int
        return [OptimizerSpec(name="test.required", state_terms=lambda *a: [], options_type=Required)]


def test_a_good_plugin_with_options_conforms(builtin_pm):
    pm = _pm_with(builtin_pm, GoodOptimizer(), "test_good")
    report = assert_plugin_conforms("test_good", plugin_manager=pm, allow_direct_registration=True,
                                    options={"test.good": {"rank": 16}})
    assert report.provides == {"optimizer": ("test.good",)} and report.solves == 3


def test_missing_provenance_is_reported(builtin_pm):
    pm = _pm_with(builtin_pm, GoodOptimizer(), "test_good")
    with pytest.raises(ConformanceError, match="provenance: 'test_good' has no distribution"):
        assert_plugin_conforms("test_good", plugin_manager=pm)


def test_nondeterminism_is_reported(builtin_pm):
    pm = _pm_with(builtin_pm, NoisyOptimizer(), "test_noisy")
    report = check_plugin("test_noisy", plugin_manager=pm, allow_direct_registration=True)
    assert any("not deterministic" in f for f in report.failures)


def test_options_without_defaults_are_reported(builtin_pm):
    pm = _pm_with(builtin_pm, NeedsOptions(), "test_required")
    report = check_plugin("test_required", plugin_manager=pm, allow_direct_registration=True)
    assert any("options_type() without arguments fails" in f for f in report.failures)


def test_unknown_plugin(builtin_pm):
    with pytest.raises(ConformanceError, match="plugin 'nope' is not loaded"):
        check_plugin("nope", plugin_manager=builtin_pm)
