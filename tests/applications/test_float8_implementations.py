"""Float8 implementations as registered items (issue 27): the plugin ``steptime`` registers its four
``Float8Casts`` under ``mlsysim_float8_implementations``; ``time_plan(float8=...)`` and ``mlsysim-core time
--float8 [IMPL]`` resolve a name through the registry; one registered again under another name by a third
party is timed the same (the one-plugin-world rule)."""

import json

import attrs
import pytest

from clitools import error_of, run
from mlsysim_core import TrainingMemoryModel, hookimpl
from mlsysim_core.cli import DEFAULT_PROFILE
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_core.manager import OWN_DISTRIBUTION, PluginManager
from mlsysim_core.registry import PluginInfo
from mlsysim_core.search import FLOAT8_HOOK, search_plans, time_plan
from mlsysim_plugins.steptime import (TE_CURRENT_SCALING, TE_DELAYED_SCALING, TE_MXFP8, TORCHAO_ROWWISE,
                                      TORCHAO_TENSORWISE, Float8Casts)
from mlsysim_plugins.steptime_hookspecs import Float8Casts as DeclaredType

BUILTIN_PM = PluginManager.from_environment(autoload=False, blocked=())
SOLVER = TrainingMemoryModel(plugin_manager=BUILTIN_PM)
BUILTINS = {"torchao-tensorwise": TORCHAO_TENSORWISE, "torchao-rowwise": TORCHAO_ROWWISE,
            "te-current-scaling": TE_CURRENT_SCALING,
            "te-delayed-scaling": TE_DELAYED_SCALING, "te-mxfp8": TE_MXFP8}
RUN = dict(global_batch=8, seq_len=2048, tp=2, dp=4, memory=False)


def timed(float8, solver=SOLVER, **run):
    return time_plan("llama3-8b", "h100", float8=float8, solver=solver, **{**RUN, **run})


def test_the_builtin_plugin_registers_the_five():
    registered = BUILTIN_PM.registry.extensions[FLOAT8_HOOK]
    assert dict(registered) == BUILTINS
    assert Float8Casts is DeclaredType     # (the hook's item type, public in steptime_hookspecs)
    for name in BUILTINS:
        assert BUILTIN_PM.registry.providers[(FLOAT8_HOOK, name)].distribution == OWN_DISTRIBUTION


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_a_name_is_its_declaration(name):
    by_name, by_object = timed(name), timed(BUILTINS[name])
    assert by_name["components"] == by_object["components"]
    assert by_name["layout"]["float8"] == by_object["layout"]["float8"] == name
    assert f"float8 ({name}): the linears timed in float8 GEMMs" in by_name["notes"][0]


def test_true_is_torchao_tensorwise_and_the_implementations_differ():
    default = timed(True)
    assert default["components"] == timed("torchao-tensorwise")["components"]
    assert default["layout"]["float8"] is True
    assert default["notes"][0].startswith("float8: the linears")
    # TE casts the weights once a step and transposes nothing in the backward: its memory-bound work differs
    steps = {name: timed(name)["step_s"] for name in BUILTINS}
    assert len(set(steps.values())) == len(BUILTINS)
    assert timed(False)["step_s"] != default["step_s"]


class _ThirdParty:
    def __init__(self, items):
        self.mlsysim_float8_implementations = hookimpl(lambda: list(items))


def test_a_renamed_registration_is_timed_the_same():
    pm = PluginManager()
    for plugin_name, plugin in sorted(BUILTIN_PM.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=plugin_name, info=BUILTIN_PM.info(plugin_name))
    copies = [attrs.evolve(item, name=f"acme.casts-{i}") for i, item in enumerate(BUILTINS.values())]
    pm.register(_ThirdParty(copies), name="acme_casts", info=PluginInfo(name="acme_casts", distribution="acme"))
    pm.check()
    solver = TrainingMemoryModel(plugin_manager=pm)
    assert pm.registry.providers[(FLOAT8_HOOK, "acme.casts-1")].distribution == "acme"
    for copy, name in zip(copies, BUILTINS):
        renamed, builtin = timed(copy.name, solver), timed(name)
        assert renamed["components"] == builtin["components"]
        assert renamed["step_s"] == builtin["step_s"]


def test_a_name_not_registered_lists_those_that_are():
    with pytest.raises(InvalidInputError, match="float8='te-foo' is not allowed: one of: te-current-scaling, "
                                                "te-delayed-scaling, te-mxfp8, torchao-rowwise, torchao-tensorwise"):
        timed("te-foo")


def test_an_object_that_is_no_declaration_is_refused():
    with pytest.raises(InvalidInputTypeError, match="float8=3 is not allowed: True .*Float8Casts"):
        timed(3)


def test_time_float8_on_the_command_line(capsys, monkeypatch):
    args = ["time", "-m", "llama3-8b", "-g", "h100", "-b", "8", "--tp", "2", "--dp", "4", "--json"]
    code, bare = run(*args, "--float8")
    assert code == 0
    assert json.loads(bare)["step_s"] == timed(True, profile=DEFAULT_PROFILE, microbatch=2)["step_s"]
    code, te = run(*args, "--float8", "te-current-scaling")
    assert code == 0
    assert json.loads(te)["step_s"] == timed("te-current-scaling", profile=DEFAULT_PROFILE, microbatch=2)["step_s"]
    assert json.loads(te)["layout"]["float8"] == "te-current-scaling"
    code, err = error_of(capsys, *args, "--float8", "te-foo")
    assert code != 0 and "float8='te-foo' is not allowed: one of: te-current-scaling" in err
    capsys.readouterr()
    monkeypatch.setenv("COLUMNS", "400")    # (the help unwrapped)
    with pytest.raises(SystemExit):
        run("time", "--help")
    text = capsys.readouterr().out
    assert ("a registered float8 implementation: te-current-scaling, te-delayed-scaling, te-mxfp8, torchao-rowwise, "
            "torchao-tensorwise; "
            "bare --float8: torchao-tensorwise" in text)


# --- search --allow-float8 [IMPL] -----------------------------------------------------------------------------

SEARCH = dict(devices=2, global_batch=8, seq_len=2048, profile="measured", regime="bf16", workers=1)


def searched(allow_float8, solver=SOLVER):
    return search_plans("llama3-8b", "h100", allow_float8=allow_float8, solver=solver, **SEARCH)


def rows(found):
    return [tuple(c) for c in found.fits]


def test_search_by_name_is_the_default_implementation():
    default, named = searched(True), searched("torchao-tensorwise")
    assert rows(named) == rows(default)
    assert named.run["allow_float8"] == "torchao-tensorwise" and named.run["float8_memory"] == "tensorwise"
    assert "float8='torchao-tensorwise' (memory as float8='tensorwise')" in " ".join(named.notes)


def test_search_with_a_transformer_engine_implementation():
    """Timed with its casts (each float8 row as time_plan times it), its memory the 16-bit row's (not modelled)."""
    found = searched("te-mxfp8")
    assert "float8='te-mxfp8' (memory: the 16-bit run's, not modelled)" in " ".join(found.notes)
    eager = {(c.tp, c.pp, c.dp, c.data_parallel, c.checkpointing, c.sequence_parallel, c.microbatch):
             c for c in found.fits if not c.float8}
    fp8 = [c for c in found.fits if c.float8]
    assert fp8 and len(fp8) == len(eager)
    for c in fp8[:3]:
        same = eager[(c.tp, c.pp, c.dp, c.data_parallel, c.checkpointing, c.sequence_parallel,
                      c.microbatch)]
        assert c.total_memory == same.total_memory and c.step_time < same.step_time
        alone = {f: time_plan("llama3-8b", "h100", float8=f, solver=SOLVER, global_batch=8, seq_len=2048, tp=c.tp,
                              pp=c.pp, dp=c.dp, data_parallel=c.data_parallel, checkpointing=c.checkpointing,
                              microbatch=c.microbatch, sequence_parallel=c.sequence_parallel, profile="measured",
                              regime="bf16", memory=False)["components"] for f in (False, "te-mxfp8")}
        # what float8 changes, component by component, as time_plan times it (the search's optimizer component
        # is its own: it differs from time_plan's in the 16-bit rows too)
        row, row16 = found.components(c), found.components(same)
        for k in row:
            assert row[k] - row16[k] == pytest.approx(alone["te-mxfp8"][k] - alone[False][k], rel=1e-9, abs=1e-15), k


def test_search_with_a_renamed_registration_is_the_same():
    pm = PluginManager()
    for plugin_name, plugin in sorted(BUILTIN_PM.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=plugin_name, info=BUILTIN_PM.info(plugin_name))
    pm.register(_ThirdParty([attrs.evolve(TE_MXFP8, name="acme.mx")]), name="acme_casts",
                info=PluginInfo(name="acme_casts", distribution="acme"))
    assert rows(searched("acme.mx", TrainingMemoryModel(plugin_manager=pm))) == rows(searched("te-mxfp8"))
    with pytest.raises(InvalidInputError, match="allow_float8='te-foo' is not allowed: one of: te-current-scaling"):
        searched("te-foo")
