"""A third party's measured technique that breaks the contract is named, with its plugin and what it
did (issue 24, a plugin author's first hour, helper AUTHORQA). Written from docs/writing-plugins.md's
"A technique"; before, each of these was a traceback or an error blaming someone else:

- an option that is not an ``attrs.field``: ``AttributeError: 'NoneType' object has no attribute
  'metadata'`` from options.py, under every profile;
- an option without a default: ``plugin 'measured_profile' ... options_type raised TypeError:
  MeasuredOptions.__init__() missing 1 required keyword-only argument``;
- an option named like a solve keyword (``optimizer``): accepted, and never set (solve took it);
- an ``apply`` returning None: ``plugin 'measured_profile' ... prepare raised AttributeError``;
- an ``apply`` raising: blamed on the measured profile's ``prepare``;
- a ``relocate`` returning two lists: ``ValueError: not enough values to unpack``.
"""

from __future__ import annotations

import types

import attrs
import pytest

from mlsysim_core import PluginContractError, TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.terms import HOST
from mlsysim_plugins.measured.techniques import Candidate, Technique

HOOK = "mlsysim_measured_techniques"
PLUGIN = "plugin 'myorg_host_state' (registered directly)"


def _option(**kw):
    return attrs.field(**{"default": None, "metadata": {"help": "keep the optimizer state in host memory",
                                                        "choices": ("yes", "no")}, **kw})


def _relocate(plan, weights, gradients, optimizer_state):
    if plan.profile_options.myorg_state_host != "yes":
        return weights, gradients, optimizer_state
    return weights, gradients, [attrs.evolve(t, tier=HOST) for t in optimizer_state]


def _solver(**fields):
    technique = Technique(**{"name": "myorg.host_state", "order": 45, "relocate": _relocate,
                             "options": {"myorg_state_host": _option()},
                             "candidates": [Candidate("yes", "optimizer state on the host")], **fields})
    module = types.ModuleType("myorg_host_state")
    module.mlsysim_measured_techniques = hookimpl(lambda: [technique])
    module.mlsysim_measured_techniques.__name__ = HOOK
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(module, name="myorg_host_state")
    return TrainingMemoryModel("measured", plugin_manager=pm)


def _solve(solver, **kw):
    return solver.solve("llama3-8b", "h100", 4, 1024, **kw)


def test_the_docs_technique_moves_the_optimizer_state_to_the_host():
    solver = _solver()
    on, off = _solve(solver, myorg_state_host="yes"), _solve(solver)
    assert on.optimizer_state == 0 and on.host_memory == off.optimizer_state == 96_363_136_140
    assert on.weights == off.weights


@pytest.mark.parametrize(("options", "problem"), [
    ({"myorg_state_host": None}, "is None, not an attrs.field(default=..., metadata={...})"),
    ({"myorg_state_host": attrs.field()},
     "has no default (a run that leaves it out must take one: attrs.field(default=None, ...))"),
])
def test_an_option_that_is_not_a_field_with_a_default_is_named(options, problem):
    with pytest.raises(PluginContractError) as err:
        _solve(_solver(options=options))
    assert str(err.value) == f"{PLUGIN} technique 'myorg.host_state': option 'myorg_state_host' {problem}"
    assert (err.value.plugin, err.value.hook) == ("myorg_host_state", HOOK)


def test_an_option_named_like_a_solve_keyword_is_refused():
    with pytest.raises(PluginContractError) as err:
        _solve(_solver(options={"optimizer": _option()}), optimizer="adamw")
    assert str(err.value) == (f"{PLUGIN} technique 'myorg.host_state' declares option 'optimizer', which "
                              "mlsysim-core's solve (a keyword and a scenario field) owns already: each option "
                              "has one owner")


def test_an_apply_that_returns_no_plan_is_named():
    with pytest.raises(PluginContractError) as err:
        _solve(_solver(apply=lambda plan, registry: None))
    assert str(err.value) == (f"{PLUGIN} technique 'myorg.host_state' apply at stage 'optimizer' returned NoneType; "
                              "expected the TrainingPlan (attrs.evolve(plan, ...), or the plan as it is)")
    assert err.value.plugin == "myorg_host_state"


def test_an_apply_that_raises_is_the_techniques_error_not_the_profiles():
    def apply(plan, registry):
        return {}["myorg_state_host"]

    with pytest.raises(PluginContractError) as err:
        _solve(_solver(apply={"completed": apply}))
    assert str(err.value) == (f"{PLUGIN} technique 'myorg.host_state' apply at stage 'completed' raised KeyError: "
                              "'myorg_state_host'")
    assert err.value.plugin == "myorg_host_state"


def test_a_relocate_that_returns_two_lists_is_named():
    with pytest.raises(PluginContractError) as err:
        _solve(_solver(relocate=lambda plan, w, g, o: (w, g)))
    assert str(err.value) == (f"{PLUGIN} technique 'myorg.host_state' relocate returned a tuple of 2; expected "
                              "(weights, gradients, optimizer_state): three lists of MemoryTerm")
    assert (err.value.plugin, err.value.hook) == ("myorg_host_state", HOOK)


def test_a_relocate_that_raises_is_named():
    def relocate(plan, weights, gradients, optimizer_state):
        raise RuntimeError("no host")

    with pytest.raises(PluginContractError) as err:
        _solve(_solver(relocate=relocate))
    assert str(err.value) == f"{PLUGIN} technique 'myorg.host_state' relocate raised RuntimeError: no host"


def test_a_technique_name_follows_the_spec_names_rule():
    """'My Tech' was accepted; a spec's name rule (docs/hooks.md, registration hooks) applies."""
    with pytest.raises(ValueError) as err:
        Technique(name="My Tech")
    assert str(err.value) == ("Technique.name='My Tech' is not a valid name: lowercase letters, digits, '-' and '_', "
                              "optionally dotted (third parties: 'myorg.name')")
    module = types.ModuleType("myorg_host_state")       # made in the hook, as a plugin does
    module.mlsysim_measured_techniques = hookimpl(lambda: [Technique(name="My Tech")])
    module.mlsysim_measured_techniques.__name__ = HOOK
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(module, name="myorg_host_state")
    with pytest.raises(PluginContractError, match=r"^plugin 'myorg_host_state' \(registered directly\) hook "
                                                  r"mlsysim_measured_techniques raised ValueError: Technique\.name="):
        TrainingMemoryModel("measured", plugin_manager=pm).solve("llama3-8b", "h100", 1, 1024)
