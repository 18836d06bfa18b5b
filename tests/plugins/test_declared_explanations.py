"""`explain` quotes what the selected plugins declare (``extensions["explain.*"]``), never a table
keyed on built-in names (issue 24, item 1): a built-in registered under another name explains
itself word for word as the built-in does, and a third party's declarations are used the same way."""

import attrs
import pytest

from mlsysim_core import ShardingRuleSpec, TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.render import EXPLAIN_LABEL, EXPLAIN_SHARDS, EXPLAIN_WHY, explain, why

MODEL, GPU = "mlsysim:llama3-8b", "mlsysim:h100"


class _Renamed:
    """Re-registers one built-in optimizer, strategy and rule under new names (the same objects)."""

    def __init__(self, registry):
        self.optimizer = attrs.evolve(registry.optimizers["adamw"], name="acme.adamw")
        self.strategy = attrs.evolve(registry.checkpointing["full"], name="acme.full")
        self.rule = attrs.evolve(registry.sharding_rules["zero2"], name="acme.zero2")

    @hookimpl
    def mlsysim_optimizers(self):
        return [self.optimizer]

    @hookimpl
    def mlsysim_checkpointing_strategies(self):
        return [self.strategy]

    @hookimpl
    def mlsysim_sharding_rules(self):
        return [self.rule]


@pytest.fixture(scope="module")
def renamed():
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(_Renamed(pm.registry), "acme_renamed")
    return TrainingMemoryModel(plugin_manager=pm)


def _texts(solver, optimizer, strategy, rule):
    r = solver.solve(MODEL, GPU, 64, 2048, "bf16", optimizer, strategy, dp_size=8, data_parallel=rule)
    return {c: why(r, c, solver.registry) for c in ("weights", "gradients", "optimizer_state", "activations")}


def test_a_renamed_builtin_explains_itself_as_the_builtin(renamed):
    builtin = _texts(renamed, "adamw", "full", "zero2")
    copy = _texts(renamed, "acme.adamw", "acme.full", "acme.zero2")
    assert copy == builtin
    assert "ZeRO-2 shards them over the 8 data-parallel ranks." in builtin["gradients"]
    assert "ZeRO-2 shards it over the 8 data-parallel ranks." in builtin["optimizer_state"]
    assert "shards" not in builtin["weights"]          # ZeRO-2 declares no weight sharding
    assert builtin["optimizer_state"].startswith("AdamW (Adam with decoupled weight decay)")
    assert builtin["activations"].startswith("Only the input of each layer")


def test_explain_quotes_the_registry_it_is_given(renamed):
    r = renamed.solve(MODEL, GPU, 64, 2048, "bf16", "acme.adamw", "acme.full", dp_size=8, data_parallel="acme.zero2")
    tree = explain(r, registry=renamed.registry)
    assert "ZeRO-2 shards them over the 8 data-parallel ranks." in tree
    assert r.explain(renamed.registry) == tree


class _Striped:
    """A third-party data-parallel rule declaring what it shards and how a sentence names it."""

    @hookimpl
    def mlsysim_sharding_rules(self):
        base = PluginManager.from_environment(autoload=False, blocked=()).registry.sharding_rules["zero3"]
        return [ShardingRuleSpec(name="acme.striped", axis="dp", apply=base.apply, description="striped ZeRO-3",
                                 extensions={EXPLAIN_SHARDS: ("weights",), EXPLAIN_LABEL: "Striped sharding"}),
                ShardingRuleSpec(name="acme.quiet", axis="dp", apply=base.apply, description="says nothing")]


def test_a_third_party_rule_is_explained_by_what_it_declares():
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(_Striped(), "acme_striped")
    solver = TrainingMemoryModel(plugin_manager=pm)
    r = solver.solve(MODEL, GPU, 64, 2048, dp_size=8, data_parallel="acme.striped")
    assert why(r, "weights", solver.registry).endswith("Striped sharding shards them over the 8 data-parallel ranks.")
    assert "shards" not in why(r, "gradients", solver.registry)     # it declared weights only
    quiet = solver.solve(MODEL, GPU, 64, 2048, dp_size=8, data_parallel="acme.quiet")
    assert "shards" not in why(quiet, "weights", solver.registry)   # nothing declared: nothing claimed


def test_every_builtin_optimizer_and_strategy_of_the_reference_declares_its_explanation(renamed):
    registry = renamed.registry
    for name in ("adam", "adamw", "sgd", "none"):
        assert isinstance(registry.optimizers[name].extensions.get(EXPLAIN_WHY), str), name
    for name in ("selective", "full", "none"):
        what, how = registry.checkpointing[name].extensions[EXPLAIN_WHY]
        assert what and how.endswith("."), name
    for stage, shards in enumerate(((), ("optimizer_state",), ("optimizer_state", "gradients"),
                                    ("optimizer_state", "gradients", "weights"))):
        assert tuple(registry.sharding_rules[f"zero{stage}"].extensions[EXPLAIN_SHARDS]) == shards
