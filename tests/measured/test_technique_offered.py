"""What ``fit techniques`` offers is asked of the declarations, never of the names (issue 24 items 1, 3, 7).

- **Checkpointing** (``builtin_techniques._saves_more``): a run whose strategy recomputes nothing
  (``CheckpointingSpec.recomputes``) is offered every strategy of the ladder (those declaring
  ``extensions["measured.saves_rank"]``); one that declares its rank, the strategies of a larger rank;
  any other, none. The offered sets of every built-in strategy are the ones the name table gave
  (written out below); the criterion reads no plan, so they hold for every model. A built-in
  registered again under another name (the same object) gets the built-in's ladder, byte for byte:
  with the name table it got nothing.
- **Low-bit optimizer** (``_quantizes_the_update_of``): offered in place of the run's optimizer when that
  declares the update the candidate quantizes (``OptimizerStep.update``) and quantizes no moments itself.
- **A third party's** ``offered(value, given)`` of two parameters is called as before; one of three gets
  the registry.
"""

from __future__ import annotations

import json

import attrs
import pytest

from mlsysim_core.registry import PluginInfo
from mlsysim_plugins.measured.builtin_techniques import TECHNIQUES
from mlsysim_plugins.measured.optimizer_step import OptimizerStep
from mlsysim_plugins.measured.technique_fit import fit_techniques
from mlsysim_plugins.measured.techniques import Candidate, Technique

from worldtools import BUILTIN_PM, world

ACME = PluginInfo(name="acme_renamed", distribution="acme-renamed", version="1.0")
CHECKPOINTING = next(t for t in TECHNIQUES if t.ladder_keyword == "activation_checkpointing")
LOW_BIT = next(t for t in TECHNIQUES if t.name == "low_bit_optimizer")
LOW_BITS = {"adamw-8bit-torchao", "adamw-4bit-torchao", "adamw-8bit-bnb"}
REGISTRY = BUILTIN_PM.registry

# The ladder by what each saves, the least first: selective, attention-only, mlp-only, every-k, op-sac, full.
# What the name table offered each built-in (the old ranking; save-list was not in it: nothing).
LADDER_OF = {
    "none": {"selective", "attention-only", "mlp-only", "every-k", "op-sac", "full"},
    "selective": {"attention-only", "mlp-only", "every-k", "op-sac", "full"},
    "attention-only": {"mlp-only", "every-k", "op-sac", "full"},
    "mlp-only": {"every-k", "op-sac", "full"},
    "every-k": {"op-sac", "full"},
    "op-sac": {"full"},
    "full": set(),
    "save-list": set(),
}

# The fit-techniques run of tests/measured/test_technique_fit.py: 61.3 GiB on a 40 GiB A100.
MODEL, GPU = "meta-llama/llama-3.2-3b", "nvidia/a100-sxm4-40gb"
RUN = dict(precision="bf16", optimizer="adamw", activation_checkpointing="none", regime="bf16")
FLOPS, LINK = 312e12, 32e9


def _offered(technique, keyword, given, registry=REGISTRY) -> set:
    return {c.value for c in technique.candidates_in(registry)
            if technique.is_offered(c.value, {keyword: given}, registry)}


def test_every_builtin_strategy_is_offered_what_the_name_table_offered():
    assert set(REGISTRY.checkpointing) == set(LADDER_OF), "a built-in strategy was added: say what it is offered"
    for given, expected in LADDER_OF.items():
        assert _offered(CHECKPOINTING, "activation_checkpointing", given) == expected, given


def test_a_run_spelling_its_strategy_otherwise_is_offered_the_same():
    """Resolved as a solve resolves it (case and separators ignored): the name table offered nothing."""
    assert _offered(CHECKPOINTING, "activation_checkpointing", "Attention_Only") == LADDER_OF["attention-only"]


def _renamed(hook, table, name, new):
    return world(hook, [attrs.evolve(table[name], name=new)], info=ACME)


def _ladder(solver, **kwargs):
    return fit_techniques(MODEL, GPU, 2, 4096, solver=solver, hardware_flops=FLOPS, host_link_bytes_per_s=LINK,
                          **{**RUN, **kwargs})


@pytest.mark.parametrize("name", sorted(LADDER_OF))
def test_a_renamed_strategy_is_offered_what_the_builtin_is(name):
    """The same strategy registered again as ``acme-keep-<name>`` beside the built-ins (whose hook made their
    specs again: new partials, closures and ``Recompute`` objects, alike)."""
    new = f"acme-keep-{name}"
    solver = _renamed("mlsysim_checkpointing_strategies", REGISTRY.checkpointing, name, new)
    assert solver.registry.checkpointing[name] is not REGISTRY.checkpointing[name]
    assert _offered(CHECKPOINTING, "activation_checkpointing", new, solver.registry) == LADDER_OF[name]


def test_a_strategy_sits_where_it_declares():
    """A third party's strategy recomputing nothing, with terms of its own, is offered the whole ladder; one
    recomputing part of a layer its own way (here op-SAC's share declared as a function of its own) sits
    where its ``measured.saves_rank`` says: op-SAC's 5, before full; declaring none, it is not in the ladder
    (neither offered nor offered anything)."""
    table = REGISTRY.checkpointing
    keep = attrs.evolve(table["none"], name="acme.keep", extensions={"measured.activation_terms": lambda *a: []})
    sac = attrs.evolve(table["op-sac"], name="acme.sac", recompute=lambda plan: table["op-sac"].recompute(plan))
    unranked = attrs.evolve(sac, name="acme.unranked", extensions={
        k: v for k, v in sac.extensions.items() if k != "measured.saves_rank"})
    solver = world("mlsysim_checkpointing_strategies", [keep, sac, unranked], info=ACME)
    assert _offered(CHECKPOINTING, "activation_checkpointing", "acme.keep", solver.registry) == {
        *LADDER_OF["none"], "acme.sac"}
    assert _offered(CHECKPOINTING, "activation_checkpointing", "acme.sac", solver.registry) == {"full"}
    assert _offered(CHECKPOINTING, "activation_checkpointing", "every-k", solver.registry) == {
        "op-sac", "acme.sac", "full"}
    assert _offered(CHECKPOINTING, "activation_checkpointing", "acme.unranked", solver.registry) == set()
    assert "acme.unranked" not in {c.value for c in CHECKPOINTING.candidates_in(solver.registry)}


@pytest.mark.parametrize("name", ["none", "selective", "op-sac"])
def test_a_renamed_strategy_gets_the_builtins_ladder(name):
    """Renamed as above: the same ladder, byte for byte (the name written back)."""
    new = f"acme-keep-{name}"
    solver = _renamed("mlsysim_checkpointing_strategies", REGISTRY.checkpointing, name, new)
    before = json.dumps(_ladder(solver, activation_checkpointing=name).to_dict(), default=str)
    after = json.dumps(_ladder(solver, activation_checkpointing=new).to_dict(), default=str)
    assert after.replace(new, name) == before
    assert json.loads(before)["evaluated"] > 1


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_a_renamed_adamw_gets_adamws_ladder():
    solver = _renamed("mlsysim_optimizers", REGISTRY.optimizers, "adamw", "acme-adamw")
    assert _offered(LOW_BIT, "optimizer", "acme-adamw", solver.registry) == LOW_BITS
    before = json.dumps(_ladder(solver).to_dict(), default=str)
    after = json.dumps(_ladder(solver, optimizer="acme-adamw").to_dict(), default=str)
    assert after.replace("acme-adamw", "adamw") == before
    assert json.loads(before)["combination"]["optimizer"] == "adamw-8bit-bnb"


def _third_party_adam(**step):
    """Adam's measured terms under a spec of a third party's own, declaring its step as ``step`` says."""
    spec = attrs.evolve(REGISTRY.optimizers["adamw"], name="acme.adam", step=OptimizerStep(moments=2, **step))
    return world("mlsysim_optimizers", [spec], info=ACME)


def test_a_third_party_optimizer_declaring_adams_update_is_offered_the_low_bit_ones():
    solver = _third_party_adam(update="adam")
    assert _offered(LOW_BIT, "optimizer", "acme.adam", solver.registry) == LOW_BITS
    ladder = _ladder(solver, optimizer="acme.adam")
    assert ladder.fits and ladder.combination["optimizer"] in LOW_BITS


def test_an_optimizer_declaring_no_update_or_quantized_moments_is_offered_none():
    assert _offered(LOW_BIT, "optimizer", "acme.adam", _third_party_adam().registry) == set()
    quantized = _third_party_adam(update="adam", quantized_moments="8-bit")
    assert _offered(LOW_BIT, "optimizer", "acme.adam", quantized.registry) == set()
    for name in ("lion", "sgd", "muon", "adamw-8bit-bnb", "adam-8bit"):
        assert _offered(LOW_BIT, "optimizer", name) == set(), name
    for name in ("adam", "adamw", "adamw-32bit-bnb", "paged-adamw-32bit-bnb"):     # Adam's update, full precision
        assert _offered(LOW_BIT, "optimizer", name) == LOW_BITS, name


def test_a_two_parameter_offered_is_called_as_before_and_three_get_the_registry():
    calls = []
    two = Technique(name="acme.two", keyword="x", candidates=[Candidate(1, "one")],
                    offered=lambda value, given: calls.append((value, given)) or True)
    three = Technique(name="acme.three", keyword="x", candidates=[Candidate(1, "one")],
                      offered=lambda value, given, registry: calls.append((value, given, registry)) or False)
    assert two.is_offered(1, {"x": 5}, REGISTRY) is True
    assert three.is_offered(1, {"x": 5}, REGISTRY) is False
    assert calls == [(1, 5), (1, 5, REGISTRY)]
    assert attrs.evolve(three, name="acme.renamed").is_offered(1, {}, REGISTRY) is False    # read again, same
    assert calls[-1] == (1, None, REGISTRY)
