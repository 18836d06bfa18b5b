"""A scenario that uses the option of a technique whose plugin is blocked (MLSYSIM_DISABLED_PLUGINS /
--disable-plugin) or not loaded (third-party autoloading off) says so (issue 24, helper AUTHORQA's
leftovers): it said "unknown field(s)" (a file) or "no such keyword" (Python), as if the option
were misspelled. The plugin here is an installed distribution (a dist-info on sys.path, found by
importlib.metadata as pip's would be) whose technique ``myorg.host_state`` declares the option
``myorg_state_host`` (docs/writing-plugins.md's "A technique")."""

from __future__ import annotations

import json
import textwrap

import pytest

from clitools import error_of, run as run_cli
from mlsysim_core import InvalidInputError, InvalidInputTypeError, TrainingMemoryModel, estimate
from mlsysim_core import manager as manager_module, solver as solver_module
from mlsysim_core.manager import PluginManager
from mlsysim_core.scenario import Scenario, unloaded_options

MODULE = "mlsysim_aq2_host_state"
PLUGIN = "myorg_host_state"
BLOCKED = (f"'myorg_state_host' is an option of plugin '{PLUGIN}' (mlsysim-aq2-host-state 0.1.0), blocked by "
           "MLSYSIM_DISABLED_PLUGINS / --disable-plugin")


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The technique's distribution installed; the process-wide manager made afresh from the environment."""
    monkeypatch.delenv("MLSYSIM_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("MLSYSIM_DISABLED_PLUGINS", raising=False)
    site = tmp_path / "site"
    info = site / "mlsysim_aq2_host_state-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mlsysim-aq2-host-state\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[mlsysim_core]\n{PLUGIN} = {MODULE}\n")
    (site / f"{MODULE}.py").write_text(textwrap.dedent('''
        import attrs
        from mlsysim_core import hookimpl

        def _relocate(plan, weights, gradients, optimizer_state):
            from mlsysim_core.terms import HOST
            if plan.profile_options.myorg_state_host != "yes":
                return weights, gradients, optimizer_state
            return weights, gradients, [attrs.evolve(t, tier=HOST) for t in optimizer_state]

        @hookimpl
        def mlsysim_measured_techniques():
            from mlsysim_plugins.measured.techniques import Candidate, Technique
            return [Technique(name="myorg.host_state", order=45, relocate=_relocate,
                              options={"myorg_state_host": attrs.field(default=None, metadata={
                                  "help": "keep the optimizer state in host memory", "choices": ("yes", "no")})},
                              candidates=[Candidate("yes", "optimizer state on the host")])]
        '''))
    monkeypatch.syspath_prepend(str(site))

    def block(env=None, autoload=None):
        """The process-wide manager as the environment ``env`` (MLSYSIM_DISABLED_PLUGINS) makes it."""
        if env is not None:
            monkeypatch.setenv("MLSYSIM_DISABLED_PLUGINS", env)
        pm = PluginManager.from_environment(autoload=autoload)
        for module in (manager_module, solver_module):
            monkeypatch.setattr(module, "get_plugin_manager", lambda: pm)
        return pm
    return block


@pytest.fixture
def scenario_file(tmp_path):
    path = tmp_path / "host.json"
    path.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 8,
                                "profile": "measured", "myorg_state_host": "yes"}))
    return path


def test_loaded_the_option_works(installed, scenario_file):
    installed()
    on = Scenario.load(scenario_file).solve()
    assert on.optimizer_state == 0 and on.host_memory > 0
    assert unloaded_options(["myorg_state_host"]) == ""      # loaded: nothing to say


@pytest.mark.parametrize("env", [PLUGIN, "mlsysim-aq2-host-state"])     # the entry point, or its distribution
def test_a_file_names_the_blocked_plugin(installed, scenario_file, env):
    installed(env)
    with pytest.raises(InvalidInputError) as err:
        Scenario.load(scenario_file)
    assert err.value.parameter == "scenario host.json" and err.value.value == "myorg_state_host"
    assert err.value.detail == f"unknown field(s); {BLOCKED}"


def test_python_names_the_blocked_plugin(installed):
    pm = installed(PLUGIN)
    scenario = Scenario(model="llama3-8b", hardware="h100", batch_size=8, profile="measured",
                        profile_options={"myorg_state_host": "yes"})
    for run in (lambda: scenario.solve(), lambda: scenario.solve(TrainingMemoryModel(plugin_manager=pm)),
                lambda: estimate("llama3-8b", "h100", 8, myorg_state_host="yes")):
        with pytest.raises(InvalidInputTypeError) as err:
            run()
        assert err.value.parameter == "myorg_state_host" and err.value.value == "yes"
        assert err.value.detail == f"no such keyword; {BLOCKED}"


def test_third_party_plugins_off_is_said(installed, scenario_file):
    installed(autoload=False)
    with pytest.raises(InvalidInputError) as err:
        Scenario.load(scenario_file)
    assert err.value.detail == (
        f"unknown field(s); 'myorg_state_host' is an option of plugin '{PLUGIN}' (mlsysim-aq2-host-state 0.1.0), "
        "not loaded: third-party plugins are off (MLSYSIM_DISABLE_PLUGIN_AUTOLOAD / --no-third-party-plugins)")


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_the_cli_says_blocked(installed, scenario_file, capsys, monkeypatch):
    installed(PLUGIN)
    code, err = error_of(capsys, "estimate", "--scenario", str(scenario_file))
    assert code == 2 and err.endswith(f"(unknown field(s); {BLOCKED})")
    # --disable-plugin blocks it for the command only: the command's own manager names it blocked
    monkeypatch.delenv("MLSYSIM_DISABLED_PLUGINS")
    installed()
    for where in (["--disable-plugin", PLUGIN, "estimate"], ["estimate", "--disable-plugin", PLUGIN],
                  ["--disable-plugin", "mlsysim-aq2-host-state", "estimate"]):    # (before or after; the dist)
        code, err = error_of(capsys, *where, "--scenario", str(scenario_file))
        assert code == 2 and err == (f"mlsysim-core: error: scenario host.json='myorg_state_host' is not allowed: "
                                     f"known fields: {err.split('known fields: ')[1].split(' (')[0]} "
                                     f"(unknown field(s); {BLOCKED})")
    code, err = error_of(capsys, "estimate", "--no-third-party-plugins", "--scenario", str(scenario_file))
    assert code == 2 and err.endswith(
        f"(unknown field(s); 'myorg_state_host' is an option of plugin '{PLUGIN}' (mlsysim-aq2-host-state 0.1.0), "
        "not loaded: third-party plugins are off (MLSYSIM_DISABLE_PLUGIN_AUTOLOAD / --no-third-party-plugins))")


def _usage_error(capsys, *argv):
    """(exit code, the last stderr line) of a command argparse refuses (its usage, then the error)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        run_cli(*argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("usage: ")
    return exit_.value.code, err.strip().splitlines()[-1]


FLAG_BLOCKED = f"--myorg-state-host: {BLOCKED}"


def test_the_blocked_plugins_flag_is_named(installed, capsys, monkeypatch):
    """The technique's flag (--myorg-state-host, from its option) is no flag of a command that does
    not load it: argparse's "unrecognized arguments" names the plugin that declares it and why."""
    installed()
    code, out = run_cli("estimate", "--myorg-state-host", "yes", "--json")     # loaded: the flag works
    assert code == 0 and json.loads(out)["optimizer_state"] == 0
    for argv in (["--disable-plugin", PLUGIN, "estimate", "--myorg-state-host", "yes"],
                 ["estimate", "--myorg-state-host=yes", "--disable-plugin", PLUGIN],
                 ["--disable-plugin", PLUGIN, "search", "--devices", "8", "--myorg-state-host", "yes"]):
        code, err = _usage_error(capsys, *argv)
        given = "--myorg-state-host=yes" if "--myorg-state-host=yes" in argv else "--myorg-state-host yes"
        assert code == 2 and err == f"mlsysim-core: error: unrecognized arguments: {given} ({FLAG_BLOCKED})"
    code, err = _usage_error(capsys, "estimate", "--no-third-party-plugins", "--myorg-state-host", "yes")
    assert code == 2 and err == (
        "mlsysim-core: error: unrecognized arguments: --myorg-state-host yes (--myorg-state-host: 'myorg_state_host' "
        f"is an option of plugin '{PLUGIN}' (mlsysim-aq2-host-state 0.1.0), not loaded: third-party plugins are off "
        "(MLSYSIM_DISABLE_PLUGIN_AUTOLOAD / --no-third-party-plugins))")
    monkeypatch.setenv("MLSYSIM_DISABLED_PLUGINS", PLUGIN)     # blocked by the environment
    code, err = _usage_error(capsys, "estimate", "--myorg-state-host", "yes", "--json")
    assert code == 2 and err == (f"mlsysim-core: error: unrecognized arguments: --myorg-state-host yes "
                                 f"({FLAG_BLOCKED})")


def test_other_unrecognized_flags_keep_argparses_message(installed, capsys):
    installed()
    for argv, given in ((["--disable-plugin", PLUGIN, "estimate", "--myorg-state-hots", "yes"],
                         "--myorg-state-hots yes"),     # a misspelling: no plugin declares it
                        (["estimate", "--myorg-state-hots", "yes"], "--myorg-state-hots yes"),
                        (["--disable-plugin", PLUGIN, "models", "--myorg-state-host", "yes"],
                         "--myorg-state-host yes")):    # a command that takes no option flags
        code, err = _usage_error(capsys, *argv)
        assert code == 2 and err == f"mlsysim-core: error: unrecognized arguments: {given}"


def test_a_misspelled_option_is_still_unknown(installed, scenario_file):
    installed(PLUGIN)
    scenario_file.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 8,
                                         "myorg_state_hots": "yes"}))
    with pytest.raises(InvalidInputError) as err:
        Scenario.load(scenario_file)
    assert err.value.detail == "unknown field(s)"
    with pytest.raises(InvalidInputTypeError) as err:
        estimate("llama3-8b", "h100", 8, myorg_state_hots="yes")
    assert err.value.detail.startswith("no such keyword") and "blocked" not in err.value.detail


def test_a_launch_file_whose_key_sets_the_blocked_option(installed, tmp_path):
    """A reader that reads the key into the option: the user's run needs the blocked plugin (not the
    reader's bug, which an option no installed plugin declares would be)."""
    import types

    from mlsysim_core import hookimpl
    from mlsysim_core.scenario import from_launch
    from mlsysim_plugins.launch import LaunchField, LaunchFormatSpec, LaunchReading
    pm = installed(PLUGIN)
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  model: llama3-8b\n  host_state: yes\n")

    def read(p, document, context):
        return LaunchReading(format="myorg.trainer", path=str(p), world={"single_device": ("trainer", True)},
                             fields=[LaunchField(key="trainer.model", value="llama3-8b", field="model",
                                                 becomes="llama3-8b"),
                                     LaunchField(key="trainer.host_state", value=True, field="myorg_state_host",
                                                 becomes="yes")])
    reader = types.ModuleType("myorg_trainer_reader")
    reader.mlsysim_launch_formats = hookimpl(lambda: [LaunchFormatSpec(
        name="myorg.trainer", framework="myorg-trainer", suffixes=(".yaml",),
        recognizes=lambda p, d: isinstance(d, dict) and "trainer" in d, read=read)])
    reader.mlsysim_launch_formats.__name__ = "mlsysim_launch_formats"
    pm.register(reader, name="myorg_trainer_reader")
    with pytest.raises(InvalidInputError) as err:
        from_launch([path], registry=pm.registry, seq_len=1024, batch_size=8)
    assert str(err.value) == (f"--from={str(path)!r} is not allowed: a file whose keys the loaded plugins model "
                              f"(trainer.host_state sets 'myorg_state_host': {BLOCKED})")
