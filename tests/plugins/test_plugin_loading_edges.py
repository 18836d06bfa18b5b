"""Plugin-loading edge cases (issue 13, item 8): unknown blocked names, blocking by
distribution name, the duplicate-entry-point hint, a failing registration hook, and a
plugin that exits at import.

Fake installed distributions are written into ``tmp_path`` (a ``NAME-VER.dist-info`` with
METADATA and entry_points.txt next to the module, as in ``tests/fixtures/fake_dists``) and
put on ``sys.path``; real ``importlib.metadata`` finds them. Module names are unique per
test, so ``sys.modules`` never carries one test's module into another.
"""

from __future__ import annotations

import io
import itertools
import json
import textwrap
import warnings
from pathlib import Path

import pytest

from mlsysim_core import PluginConflictError, PluginContractError, PluginLoadError
from mlsysim_core.cli import describe_blocked, main
from mlsysim_core.manager import PluginManager, PluginWarning

FAKE_DISTS = Path(__file__).resolve().parents[1] / "fixtures" / "fake_dists"
CORE = "mlsysim-core 0.1.0"
_ids = itertools.count()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("MLSYSIM_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("MLSYSIM_DISABLED_PLUGINS", raising=False)


@pytest.fixture
def dist(tmp_path, monkeypatch):
    """``dist("mlsysim-x", {"ep": SOURCE, ...})``: an installed distribution whose entry
    points each load their own module with that source. Returns {ep: module name}."""
    def make(name: str, entry_points: dict[str, str], version: str = "0.1.0") -> dict[str, str]:
        root = tmp_path / f"site{next(_ids)}"
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        modules, lines = {}, ["[mlsysim_core]"]
        for ep, source in entry_points.items():
            module = modules[ep] = f"mlsysim_edge_{ep}_{next(_ids)}"
            (root / f"{module}.py").write_text(textwrap.dedent(source))
            lines.append(f"{ep} = {module}")
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        monkeypatch.syspath_prepend(str(root))
        return modules
    return make


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


GOOD = """
    from mlsysim_core import OPTIMIZER_STATE, MemoryTerm, OptimizerSpec, hookimpl

    def terms(plan, placement, options):
        return [MemoryTerm(component=OPTIMIZER_STATE, label="x", nbytes=1.0)]

    @hookimpl
    def mlsysim_optimizers():
        return [OptimizerSpec(name="edge.{name}", state_terms=terms)]
"""

RAISING_HOOK = """
    from mlsysim_core import hookimpl

    @hookimpl
    def mlsysim_optimizers():
        raise RuntimeError("optimizer table exploded")
"""


def good(name: str) -> str:
    return GOOD.replace("{name}", name)


# --- unknown names in MLSYSIM_DISABLED_PLUGINS / --disable-plugin --------------------------------

def test_unknown_blocked_name_warns_with_did_you_mean_and_loads_everything():
    with pytest.warns(PluginWarning) as caught:
        pm = PluginManager.from_environment(autoload=False, blocked=["sdg"])
    [w] = caught
    msg = str(w.message)
    assert msg.startswith("blocked plugin 'sdg' (MLSYSIM_DISABLED_PLUGINS / --disable-plugin) matches no "
                          "installed plugin (entry-point name) or distribution in group 'mlsysim_core'")
    assert "so it blocks nothing; did you mean 'sgd'?" in msg
    assert pm.unknown_blocked == {"sdg": ("sgd",)}
    assert pm.blocked_names == ("sdg",)
    assert "sgd" in pm.registry.plugins and pm.registry.provider("optimizer", "sgd").source == CORE


def test_unknown_name_from_the_environment_suggests_a_distribution_name(dist, monkeypatch):
    dist("mlsysim-edge-lion", {"edge_lion": good("lion")})
    monkeypatch.setenv("MLSYSIM_DISABLED_PLUGINS", "mlsysim-edge-loin, adma")
    with pytest.warns(PluginWarning) as caught:
        pm = PluginManager.from_environment()
    assert pm.unknown_blocked == {"adma": ("adam", "adamw"), "mlsysim-edge-loin": ("mlsysim-edge-lion",)}
    assert [str(w.message).rsplit("; ", 1)[1] for w in caught] == [
        "did you mean 'adam' or 'adamw'?", "did you mean 'mlsysim-edge-lion'?"]
    assert "edge_lion" in pm.registry.plugins           # nothing was blocked


def test_unknown_name_without_a_close_match_points_to_the_listing():
    with pytest.warns(PluginWarning, match=r"blocks nothing; `mlsysim-core plugins` lists the installed"):
        pm = PluginManager.from_environment(autoload=False, blocked=["zzzzzzzz"])
    assert pm.unknown_blocked == {"zzzzzzzz": ()}


def test_known_names_do_not_warn(dist):
    dist("mlsysim-edge-lion", {"edge_lion": good("lion")})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pm = PluginManager.from_environment(blocked=["sgd", "edge_lion", "MLSYSIM_Edge.Lion"])
    assert pm.unknown_blocked == {}


def test_cli_warns_on_stderr_and_lists_the_unknown_name(capsys):
    code, text = run("--disable-plugin", "sdg", "--no-third-party-plugins", "plugins")
    err = capsys.readouterr().err
    assert code == 0
    assert err.count("mlsysim-core: warning: blocked plugin 'sdg'") == 1
    assert "did you mean 'sgd'?" in err and "Traceback" not in err
    line = next(l for l in text.splitlines() if l.startswith("sdg "))
    assert line.split(None, 1)[1] == ("(blocked: matches no installed plugin or distribution, blocks "
                                      "nothing; did you mean 'sgd'?)")
    assert any(l.startswith("sgd ") and "optimizer: sgd" in l for l in text.splitlines())


def test_cli_json_records_the_unknown_name(capsys):
    code, text = run("--disable-plugin", "sdg", "--disable-plugin", "lion", "--no-third-party-plugins",
                     "plugins", "--json")
    data = json.loads(text)
    assert code == 0
    assert data["blocked"] == ["lion", "sdg"]
    assert data["unknown_blocked"] == {"sdg": ["sgd"]}
    assert data["blocked_entry_points"] == ["lion"]
    assert "mlsysim-core: warning: blocked plugin 'sdg'" in capsys.readouterr().err


def test_cli_warns_once_for_other_commands_too(monkeypatch, capsys):
    monkeypatch.setenv("MLSYSIM_DISABLED_PLUGINS", "adamw,sdg")
    code, text = run("--no-third-party-plugins", "estimate", "--profile", "reference", "-s", "1024")
    err = capsys.readouterr().err
    assert code == 0, err
    assert err.count("mlsysim-core: warning:") == 1 and "'sdg'" in err and "did you mean 'sgd'?" in err
    assert "total" in text


# --- a distribution name blocks all of its entry points ------------------------------------------

@pytest.mark.parametrize("spelling", ["mlsysim-edge-multi", "MLSYSIM_Edge.Multi", "mlsysim__edge--multi"])
def test_a_distribution_name_blocks_its_entry_points(dist, spelling):
    modules = dist("mlsysim-edge-multi", {"edge_a": good("a"), "edge_b": good("b")})
    dist("mlsysim-edge-other", {"edge_c": good("c")})
    pm = PluginManager.from_environment(blocked=[spelling])
    assert pm.unknown_blocked == {}
    assert pm.is_blocked("edge_a") and pm.is_blocked("edge_b")
    assert [(i.name, i.source) for i in pm.blocked_entry_points] == [
        ("edge_a", "mlsysim-edge-multi 0.1.0"), ("edge_b", "mlsysim-edge-multi 0.1.0")]
    assert {"edge_a", "edge_b"}.isdisjoint(pm.registry.plugins)
    assert "edge_c" in pm.registry.plugins and "edge.c" in pm.registry.optimizers
    assert "edge.a" not in pm.registry.optimizers
    import sys
    assert not set(modules.values()) & set(sys.modules)          # never even imported
    assert describe_blocked(pm, spelling) == "(blocked: distribution, entry point(s) edge_a, edge_b)"


def test_a_distribution_name_skips_a_broken_import(dist, capsys):
    dist("mlsysim-edge-broken", {"edge_broken": "import not_a_module_edge_xyz\n"})
    code, text = run("--disable-plugin", "mlsysim-edge-broken", "plugins")
    assert code == 0, capsys.readouterr().err
    assert any(l.split() == ["mlsysim-edge-broken", "(blocked:", "distribution,", "entry", "point(s)",
                             "edge_broken)"] for l in text.splitlines())


# --- the duplicate-entry-point hint never blocks a built-in --------------------------------------

def test_shadowing_a_builtin_suggests_the_distribution_not_the_name(add_dists_fixture):
    add_dists_fixture("shadow_builtin")
    with pytest.raises(PluginConflictError) as exc:
        PluginManager.from_environment()
    msg = str(exc.value)
    assert msg.startswith("entry point 'adam' in group 'mlsysim_core' is declared by more than one plugin: "
                          f"mlsysim-demo-shadow 0.1.0 -> mlsysim_demo_shadow; {CORE} -> mlsysim_plugins.adam. ")
    assert msg.endswith("'adam' is also a built-in plugin's name: uninstall mlsysim-demo-shadow, or block that "
                        "distribution (all of its plugins, not the built-in) with "
                        "MLSYSIM_DISABLED_PLUGINS=mlsysim-demo-shadow (or --disable-plugin mlsysim-demo-shadow)")
    assert "=adam" not in msg
    assert (exc.value.plugin, exc.value.hook) == ("adam", "entry point")
    # Doing what it says keeps the built-in.
    pm = PluginManager.from_environment(blocked=["mlsysim-demo-shadow"])
    assert pm.registry.provider("optimizer", "adam").source == CORE
    assert [i.source for i in pm.blocked_entry_points] == ["mlsysim-demo-shadow 0.1.0"]


def test_cli_follows_the_shadow_hint(add_dists_fixture, capsys):
    add_dists_fixture("shadow_builtin")
    code, _ = run("plugins")
    err = capsys.readouterr().err
    assert code == 3 and "--disable-plugin mlsysim-demo-shadow" in err
    code, text = run("--disable-plugin", "mlsysim-demo-shadow", "plugins", "--json")
    assert code == 0, capsys.readouterr().err
    data = json.loads(text)
    adam = next(p for p in data["plugins"] if p["name"] == "adam")
    assert (adam["distribution"], adam["provides"]) == ("mlsysim-core", {"optimizer": ["adam"]})


def test_a_distribution_named_like_a_builtin_is_not_suggested(dist):
    dist("sgd", {"sgd": good("sgd")})           # distribution 'sgd' shadows the built-in 'sgd'
    with pytest.raises(PluginConflictError) as exc:
        PluginManager.from_environment()
    msg = str(exc.value)
    assert msg.endswith("'sgd' is also a built-in plugin's name: uninstall sgd")
    assert "MLSYSIM_DISABLED_PLUGINS" not in msg


def test_third_party_duplicates_suggest_each_distribution_and_the_name(add_dists_fixture):
    add_dists_fixture("dup_entry_a", "dup_entry_b")
    with pytest.raises(PluginConflictError) as exc:
        PluginManager.from_environment()
    assert str(exc.value).endswith(
        "Uninstall one, or block one distribution (all of its plugins) with MLSYSIM_DISABLED_PLUGINS="
        "<distribution> (mlsysim-demo-dup-a or mlsysim-demo-dup-b), or every declaration of the name with "
        "MLSYSIM_DISABLED_PLUGINS=demo_dup")
    pm = PluginManager.from_environment(blocked=["mlsysim-demo-dup-b"])
    assert pm.info("demo_dup").source == "mlsysim-demo-dup-a 0.1.0"


def test_spec_name_conflict_suggests_the_third_party_plugin(add_dists_fixture):
    add_dists_fixture("clash")
    pm = PluginManager.from_environment()
    with pytest.raises(PluginConflictError) as exc:
        pm.registry
    assert str(exc.value).endswith("Uninstall one, or block one with MLSYSIM_DISABLED_PLUGINS=demo_clash")
    assert pm.broken_plugins() == {"demo_clash": exc.value}
    assert pm.survey().provider("optimizer", "adam").source == CORE   # the built-in keeps its name


@pytest.fixture
def add_dists_fixture(monkeypatch):
    """The checked-in fake distributions of tests/fixtures/fake_dists (read only)."""
    def add(*names):
        for name in names:
            monkeypatch.syspath_prepend(str(FAKE_DISTS / name))
    return add


# --- a failing registration hook -----------------------------------------------------------------

@pytest.fixture
def raising_hook(dist):
    dist("mlsysim-edge-raise", {"edge_raise": RAISING_HOOK})
    dist("mlsysim-edge-lion", {"edge_lion": good("lion")})
    return "plugin 'edge_raise' (mlsysim-edge-raise 0.1.0) hook mlsysim_optimizers raised RuntimeError: " \
           "optimizer table exploded. To run without it, set MLSYSIM_DISABLED_PLUGINS=edge_raise " \
           "(or pass --disable-plugin edge_raise)"


def test_failing_registration_hook_names_plugin_dist_hook_and_the_way_out(raising_hook):
    pm = PluginManager.from_environment()
    with pytest.raises(PluginContractError) as exc:
        pm.registry
    assert str(exc.value) == raising_hook
    assert (exc.value.plugin, exc.value.source, exc.value.hook) == (
        "edge_raise", "mlsysim-edge-raise 0.1.0", "mlsysim_optimizers")
    assert isinstance(exc.value.__cause__, RuntimeError)
    # The survey sets it aside; everything else is there; a solve still refuses.
    survey = pm.survey()
    assert set(survey.broken) == {"edge_raise"} and "edge_raise" in survey.plugins
    assert {"adam", "edge.lion"} <= set(survey.optimizers)
    from mlsysim_core import TrainingMemoryModel
    with pytest.raises(PluginContractError, match="edge_raise"):
        TrainingMemoryModel(plugin_manager=pm).solve("llama3-8b", "h100", 8, 1024)
    with pm.allowing_broken():
        assert pm.registry is survey
    with pytest.raises(PluginContractError):
        pm.registry


def test_plugins_lists_and_marks_a_failing_registration_hook(raising_hook, capsys):
    code, text = run("plugins")
    err = capsys.readouterr().err
    assert code == 3
    lines = {l.split()[0]: l for l in text.splitlines()}
    assert {"adam", "sgd", "model_states", "edge_lion", "edge_raise"} <= set(lines)
    assert "optimizer: edge.lion" in lines["edge_lion"]
    assert lines["edge_raise"].split(None, 1)[1] == f"mlsysim-edge-raise 0.1.0  BROKEN: {raising_hook}"
    assert err == f"mlsysim-core: error: {raising_hook}\n"


def test_plugins_json_marks_a_failing_registration_hook(raising_hook, capsys):
    code, text = run("plugins", "--json")
    assert code == 3
    by_name = {p["name"]: p for p in json.loads(text)["plugins"]}
    assert by_name["edge_raise"]["error"] == raising_hook
    assert by_name["edge_raise"]["provides"] == {}
    assert by_name["edge_raise"]["hooks"] == ["mlsysim_optimizers"]
    assert by_name["adam"]["error"] is None
    assert raising_hook in capsys.readouterr().err


def test_other_commands_fail_with_exit_3_naming_the_hook(raising_hook, capsys):
    code, text = run("estimate", "--profile", "reference")
    err = capsys.readouterr().err
    assert (code, text) == (3, "")
    assert err == f"mlsysim-core: error: {raising_hook}\n"


def test_blocking_the_failing_plugin_as_told_restores_everything(raising_hook, capsys):
    code, text = run("--disable-plugin", "edge_raise", "plugins")
    assert code == 0, capsys.readouterr().err
    assert any(l.split() == ["edge_raise", "(blocked)"] for l in text.splitlines())


@pytest.mark.parametrize("body, what", [
    ("import sys; sys.exit(1)", "SystemExit: called sys.exit(1)"),
    ("return 42", "returned int; expected a list of specs"),
    ("yield 'not a spec'", "returned str 'not a spec'; expected OptimizerSpec"),
], ids=["sys-exit", "wrong-return", "wrong-item"])
def test_every_registration_failure_is_listed(dist, capsys, body, what):
    dist("mlsysim-edge-bad", {"edge_bad": f"""
        from mlsysim_core import hookimpl

        @hookimpl
        def mlsysim_optimizers():
            {body}
    """})
    code, text = run("plugins")
    err = capsys.readouterr().err
    assert code == 3
    assert "edge_bad" in text and "BROKEN: plugin 'edge_bad' (mlsysim-edge-bad 0.1.0) hook mlsysim_optimizers" in text
    assert what in err and "--disable-plugin edge_bad" in err


def test_a_spec_conflict_is_listed_too(add_dists_fixture, capsys):
    add_dists_fixture("clash")
    code, text = run("plugins")
    err = capsys.readouterr().err
    assert code == 3
    assert "BROKEN: optimizer 'adam' is provided by more than one plugin" in text
    assert "MLSYSIM_DISABLED_PLUGINS=demo_clash" in err
    adam = next(l for l in text.splitlines() if l.startswith("adam "))
    assert adam.endswith(f"{CORE}  optimizer: adam")


# --- a plugin that exits (or raises a BaseException) at import -----------------------------------

@pytest.mark.parametrize("source, what", [
    ("import sys\nsys.exit(0)\n", "SystemExit: called sys.exit(0)"),
    ("raise SystemExit('bye')\n", "SystemExit: called sys.exit('bye')"),
    ("class Stop(BaseException):\n    pass\nraise Stop('not an Exception')\n", "Stop: not an Exception"),
], ids=["sys.exit(0)", "SystemExit(str)", "BaseException"])
def test_exit_at_import_is_a_load_error(dist, source, what):
    [module] = dist("mlsysim-edge-exit", {"edge_exit": source}).values()
    with pytest.raises(PluginLoadError) as exc:
        PluginManager.from_environment()
    assert str(exc.value) == (
        f"plugin 'edge_exit' (mlsysim-edge-exit 0.1.0) failed to load from entry point "
        f"'edge_exit = {module}': {what}. To run without it, set MLSYSIM_DISABLED_PLUGINS=edge_exit "
        f"(or pass --disable-plugin edge_exit)")
    assert (exc.value.plugin, exc.value.source, exc.value.hook) == (
        "edge_exit", "mlsysim-edge-exit 0.1.0", "entry point")
    assert isinstance(exc.value.__cause__, BaseException)


@pytest.mark.parametrize("argv", [["plugins"], ["plugins", "--json"], ["estimate"], []],
                         ids=["plugins", "plugins-json", "estimate", "bare"])
def test_exit_at_import_is_exit_3_never_a_silent_0(dist, capsys, argv):
    dist("mlsysim-edge-exit", {"edge_exit": "import sys\nsys.exit(0)\n"})
    code, text = run(*argv)
    err = capsys.readouterr().err
    assert (code, text) == (3, "")
    assert err.startswith("mlsysim-core: error: plugin 'edge_exit' (mlsysim-edge-exit 0.1.0) failed to load")
    assert "SystemExit: called sys.exit(0)" in err and "--disable-plugin edge_exit" in err


def test_keyboard_interrupt_at_import_still_interrupts(dist):
    dist("mlsysim-edge-interrupt", {"edge_interrupt": "raise KeyboardInterrupt\n"})
    with pytest.raises(KeyboardInterrupt):
        PluginManager.from_environment()


def test_a_misspelled_hook_names_the_way_out_too(add_dists_fixture, capsys):
    add_dists_fixture("misspelled_hook")
    code, _ = run("plugins")
    err = capsys.readouterr().err
    assert code == 3
    assert "plugin 'demo_misspelled' (mlsysim-demo-misspelled 0.1.0) implements unknown hook" in err
    assert err.rstrip().endswith(". To run without it, set MLSYSIM_DISABLED_PLUGINS=demo_misspelled "
                                 "(or pass --disable-plugin demo_misspelled)")
    code, _ = run("--disable-plugin", "mlsysim-demo-misspelled", "plugins")
    assert code == 0, capsys.readouterr().err
