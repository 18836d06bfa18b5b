"""Techniques are registrations (issue 24, item 3): each is an item of the measured hook
``mlsysim_measured_techniques``. A third-party technique registered through it adds a solve
keyword, a CLI flag and a scenario field, changes the plan (and what lives on the host), and
appears in ``fit techniques``; every built-in technique registered again under another name (the
same object, another name, its plugin replaced) gives byte-identical results."""

from __future__ import annotations

import functools
import json

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, cli, hookimpl, memo
from mlsysim_core.catalog import find_hardware
from mlsysim_core.errors import InvalidInputError, MlsysimError, PluginContractError
from mlsysim_core.manager import PluginManager
from mlsysim_core.registry import PluginInfo
from mlsysim_core.scenario import Scenario, option_fields
from mlsysim_core.terms import HOST
from mlsysim_plugins.measured.builtin_techniques import TECHNIQUES
from mlsysim_plugins.measured.technique_fit import fit_techniques
from mlsysim_plugins.measured.techniques import HOOK, Candidate, Technique

from clitools import run

BUILTIN_PLUGIN = "measured_techniques"
THIRD = PluginInfo(name="acme_techniques", distribution="acme-techniques", version="1.0")
RUN = ("llama3-8b", "h100", 4, 1024)
BASE = dict(profile="measured", precision="bf16", optimizer="adamw")


class _Module:
    """A plugin object implementing the techniques hook (what a third-party module would be)."""

    def __init__(self, items):
        setattr(self, HOOK, hookimpl(lambda: list(items)))


def _world(extra=(), replace_builtin=None) -> PluginManager:
    """The built-in plugins, plus a third-party plugin registering ``extra``; with
    ``replace_builtin``, the built-in techniques' plugin is replaced by the third party's."""
    builtin = PluginManager.from_environment(autoload=False, blocked=())
    pm = PluginManager()
    for name, plugin in sorted(builtin.list_name_plugin()):
        if plugin is not None and not (replace_builtin and name == BUILTIN_PLUGIN):
            pm.register(plugin, name=name, info=builtin.info(name))
    pm.register(_Module((*(replace_builtin or ()), *extra)), name=THIRD.name, info=THIRD)
    pm.check()
    return pm


# --- a third-party technique ----------------------------------------------------------------------

def _acme_apply(plan, registry):
    value = plan.profile_options.acme_state_host
    if value is None:
        return plan
    return attrs.evolve(plan, notes=plan.notes + (f"acme: optimizer state on the host ({value})",))


def _acme_relocate(plan, weights, gradients, optimizer_state):
    if plan.profile_options.acme_state_host != "yes":
        return weights, gradients, optimizer_state
    return weights, gradients, [attrs.evolve(t, tier=HOST, label=f"{t.label} (acme host)") for t in optimizer_state]


ACME = Technique(
    name="acme_host_state", order=45, apply=_acme_apply, relocate=_acme_relocate,
    options={"acme_state_host": attrs.field(default=None, metadata={
        "help": "acme: keep the optimizer state in host memory", "metavar": "yes|no", "type": str,
        "choices": ("yes", "no")})},
    candidates=[Candidate("yes", "acme: optimizer state on the host", "acme's own caveat")],
    active=lambda plan: plan.profile_options.acme_state_host == "yes",
    added_step_time=lambda plan, figures: (0.25, "acme: 0.25 s a step (its own figure)"))


@pytest.fixture
def acme_pm(monkeypatch):
    pm = _world(extra=(ACME,))
    monkeypatch.setattr(cli, "_manager", lambda args: pm)
    return pm


def test_a_third_party_technique_is_a_keyword_that_changes_the_plan(acme_pm):
    solver = TrainingMemoryModel(plugin_manager=acme_pm)
    before = solver.solve(*RUN, **BASE)
    after = solver.solve(*RUN, **BASE, acme_state_host="yes")
    assert after.host_memory > 0 == before.host_memory
    assert after.total_memory < before.total_memory
    assert "acme: optimizer state on the host (yes)" in after.notes
    assert solver.solve(*RUN, **BASE, acme_state_host="no").total_memory == before.total_memory
    with pytest.raises(MlsysimError, match="acme_state_host"):      # not an option without the plugin
        TrainingMemoryModel(plugin_manager=_world()).solve(*RUN, **BASE, acme_state_host="yes")


def test_a_third_party_technique_is_a_flag_and_a_scenario_field(acme_pm, capsys, tmp_path):
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--acme-state-host yes|no measured profile: acme: keep the optimizer state in host memory" in text
    assert "--compile measured profile: torch.compile the model (Inductor, default options; see docs/compile.md)" \
        in text     # the built-ins' too
    code, out = run("estimate", "--precision", "bf16", "--optimizer", "adamw", "--acme-state-host", "yes", "--json")
    assert code == 0 and json.loads(out)["host_memory"] > 0
    assert "acme_state_host" in option_fields(acme_pm.registry)
    path = tmp_path / "acme.json"
    path.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 4, "seq_len": 1024,
                                "profile": "measured",
                                "precision": "bf16", "optimizer": "adamw", "acme_state_host": "yes"}))
    scenario = Scenario.load(path, options=option_fields(acme_pm.registry))
    assert scenario.acme_state_host == "yes"
    assert scenario.solve(TrainingMemoryModel(plugin_manager=acme_pm)).host_memory > 0


def test_a_third_party_technique_is_priced_in_the_ladder(acme_pm):
    solver = TrainingMemoryModel(plugin_manager=acme_pm)
    base = solver.solve(*RUN, **BASE)
    moved = solver.solve(*RUN, **BASE, acme_state_host="yes")
    hardware = attrs.evolve(find_hardware("h100").value,
                            memory_capacity=int((base.total_memory + moved.total_memory) / 2))
    ladder = fit_techniques("llama3-8b", hardware, 4, 1024, solver=solver, techniques=["acme_state_host"], **BASE)
    assert ladder.fits and ladder.combination == {"acme_state_host": "yes"}
    assert [s.label for s in ladder.steps] == ["acme: optimizer state on the host"]
    assert ladder.added_seconds == 0.25 and ladder.steps[0].caveat == "acme's own caveat"
    assert "acme: 0.25 s a step (its own figure)" in ladder.describe()
    with pytest.raises(InvalidInputError, match="acme_state_host"):     # listed among the registered ones
        fit_techniques("llama3-8b", hardware, 4, 1024, solver=solver, techniques=["nothing"], **BASE)


def test_two_techniques_owning_one_option_is_an_error_naming_it():
    clash = attrs.evolve(ACME, name="acme_clash", options={"offload": ACME.options["acme_state_host"]})
    with pytest.raises(PluginContractError, match="technique 'acme_clash' declares option 'offload', which "
                                                  "technique 'offload' owns already"):
        _world(extra=(clash,)).registry


# --- every built-in technique, renamed: byte-identical ----------------------------------------------

CASES = {   # technique -> keyword sets solved with it (on RUN, BASE)
    "offload": [dict(offload="optimizer+gradients"), dict(offload="torchao"), dict(offload="optimizer=nvme")],
    "lora": [dict(lora={"rank": 16}), dict(lora={"rank": 8, "quantization": "nf4"})],
    "loss": [dict(loss="chunked", loss_chunks=4), dict(loss="fused_linear")],
    "float8": [dict(float8="rowwise", regime="bf16", activation_checkpointing="none"),
               dict(float8="tensorwise", regime="bf16", activation_checkpointing="none")],
    "optimizer_in_backward": [dict(optimizer_in_backward=True)],
    "activation_offload": [dict(activation_offload="torchtune"), dict(activation_offload="save_on_cpu")],
    "compile": [dict(compile=True)],
    "activation_checkpointing": [],     # the ladder's only: compared through fit techniques below
    "low_bit_optimizer": [],
    "rope_cache": [dict(rope_cache=131_072), dict(rope_cache=131_072, rope_cache_dtype="bf16", lora={"rank": 16}),
                   dict(rope_cache=8192, rope_cache_per_layer=True, lora={"rank": 16})],
    "kv_expanded": [dict(kv_expanded=True), dict(kv_expanded=True, lora={"rank": 16})],
}
NEW = "acme-renamed-technique"


def test_every_builtin_technique_is_listed():
    assert {t.name for t in TECHNIQUES} == set(CASES)


@functools.lru_cache(maxsize=None)
def _renamed_solver(name: str) -> TrainingMemoryModel:
    items = [attrs.evolve(t, name=NEW) if t.name == name else t for t in TECHNIQUES]
    return TrainingMemoryModel(plugin_manager=_world(replace_builtin=items))


def _outcome(solve):
    try:
        text = json.dumps(solve().to_dict(), sort_keys=True, default=str)
    except MlsysimError as err:
        return ("refused", type(err).__name__, str(err))
    return ("ok", text.replace(THIRD.name, BUILTIN_PLUGIN))


@pytest.fixture
def no_memo():
    memo.set_enabled(False)
    yield
    memo.set_enabled(True)


@pytest.mark.long     # every technique re-registered, memo off (15 s): `pytest --long`, .ci/run
@pytest.mark.parametrize("name", sorted(CASES))
def test_a_builtin_technique_renamed_gives_identical_results(name, solver, no_memo):
    renamed = _renamed_solver(name)
    assert NEW in renamed.registry.extensions[HOOK] and name not in renamed.registry.extensions[HOOK]
    solved = 0
    for kwargs in CASES[name]:
        kw = {**BASE, **kwargs}
        before = _outcome(lambda: solver.solve(*RUN, **kw))
        assert _outcome(lambda: renamed.solve(*RUN, **kw)) == before, kwargs
        solved += before[0] == "ok"
    assert solved or name in ("compile", "activation_checkpointing", "low_bit_optimizer")
    # the ladder: a run that does not fit, every technique offered
    for model, batch, seq in (("llama3-8b", 8, 4096), ("qwen2.5-0.5b", 16, 8192)):
        ladders = [fit_techniques(model, "h100", batch, seq, solver=s, max_solves=300, **BASE).to_dict()
                   for s in (solver, renamed)]
        assert json.dumps(ladders[1], default=str) == json.dumps(ladders[0], default=str)
