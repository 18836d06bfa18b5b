"""Plugin loading, conflicts, contracts and determinism, in-process and fast.

Third-party plugins come from checked-in fake installed distributions under
``tests/fixtures/fake_dists/<dir>/`` (a ``NAME-VER.dist-info`` with METADATA and
entry_points.txt, plus the module): a test puts exactly the ones it needs on ``sys.path``
with ``monkeypatch.syspath_prepend`` and real ``importlib.metadata`` finds them. Every
manager is built fresh; the process-wide ``get_plugin_manager()`` is never touched.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import random
import re
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:        # Python 3.10
    tomllib = None

from mlsysim_core import (OPTIMIZER_STATE, InvalidInputError, LayoutError, MemoryTerm,
                          NotInstalledError, OptimizerSpec, PluginConflictError, PluginContractError,
                          PluginLoadError, TrainingMemoryModel, hookimpl)
from mlsysim_core.manager import PluginManager

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAKE_DISTS = FIXTURES / "fake_dists"
GALORE_SRC = FIXTURES / "mlsysim-demo-optimizer" / "src"

CORE = "mlsysim-core 0.1.0"
P = 8_030_000_000          # mlsysim:llama3-8b parameters (the reference's catalog data, which
                           # the hand derivations below use; the curated llama3-8b has 8,030,261,248)

# (positional, keyword) arguments of a few solves that exercise every axis.
CONFIGS = [
    (("mlsysim:llama3-8b", "h100", 8, 1024), {}),
    (("llama3-70b", "h100", 64, 2048),
     dict(optimizer="adamw", activation_checkpointing="full", tp_size=4, pp_size=4, dp_size=4,
          zero_stage=3, gradient_accumulation_steps=2)),
    (("mixtral-8x7b", "h200", 32, 4096),
     dict(precision="bf16", optimizer="sgd", activation_checkpointing="none", ep_size=8, dp_size=8,
          zero_stage=1, trainable_fraction=0.5)),
    (("gpt3", "b200", 16, 2048),
     dict(precision="fp32", tp_size=8, pp_size=8, dp_size=2, zero_stage=2, sequence_parallel=False)),
]


def _pyproject_entry_points() -> dict[str, str]:
    text = (ROOT / "pyproject.toml").read_text()
    if tomllib is not None:
        return dict(tomllib.loads(text)["project"]["entry-points"]["mlsysim_core"])
    # Python 3.10 has no tomllib: read the one simple section by hand.
    section = text.split('[project.entry-points."mlsysim_core"]', 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^(\w+)\s*=\s*"([^"]+)"', section, flags=re.M))


BUILTIN_ENTRY_POINTS = _pyproject_entry_points()


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    monkeypatch.delenv("MLSYSIM_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("MLSYSIM_DISABLED_PLUGINS", raising=False)


@pytest.fixture
def add_dists(monkeypatch):
    """Put the named fake distributions (directories of tests/fixtures/fake_dists) on sys.path."""
    def add(*names):
        for name in names:
            path = FAKE_DISTS / name
            assert path.is_dir(), path
            monkeypatch.syspath_prepend(str(path))
    return add


@pytest.fixture(scope="module")
def core_pm():
    """Only mlsysim-core's plugins, loaded before any fake distribution is on the path."""
    return PluginManager.from_environment(autoload=False)


def solve(pm, *args, **kwargs):
    return TrainingMemoryModel(plugin_manager=pm).solve(*args, **kwargs)


# --- (1) the built-ins are declared exactly once each --------------------------------------

def test_pyproject_entry_points_are_the_plugin_modules():
    """Every public module of mlsysim_plugins is a plugin; so is every module of the measured
    profile's subpackage that says so (``PLUGIN_MODULES``), under its own name."""
    from mlsysim_plugins.measured import PLUGIN_MODULES
    modules = sorted(p.stem for p in (ROOT / "plugins" / "mlsysim_plugins").glob("*.py")
                     if not p.stem.startswith("_") and not p.stem.endswith("hookspecs"))   # a plugin's hook specs
    expected = {m: f"mlsysim_plugins.{m}" for m in modules}
    expected.update({name: f"mlsysim_plugins.measured.{module}" for name, module in PLUGIN_MODULES.items()})
    expected.update({f"launch_{p.stem}": f"mlsysim_plugins.launch.{p.stem}"     # the launch-format readers
                     for p in (ROOT / "plugins" / "mlsysim_plugins" / "launch").glob("*.py")
                     if not p.stem.startswith("_") and p.stem != "hookspecs"})
    expected["launch"] = "mlsysim_plugins.launch"      # the package adds their hook (hookspecs.py)
    assert BUILTIN_ENTRY_POINTS == expected


def test_installed_metadata_matches_pyproject():
    """A stale editable install (entry points added to pyproject but not reinstalled) fails here."""
    installed = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="mlsysim_core")
                 if ep.dist is not None and ep.dist.name == "mlsysim-core"}
    assert installed == BUILTIN_ENTRY_POINTS


def test_builtins_come_from_the_entry_point_group(core_pm):
    assert sorted(core_pm.registry.plugins) == sorted(BUILTIN_ENTRY_POINTS)
    assert {info.source for info in core_pm.registry.plugins.values()} == {CORE}
    assert core_pm.skipped_third_party == ()


# --- (2) import failure ----------------------------------------------------------------------

def test_import_failure_names_plugin_dist_and_escape_hatch(add_dists):
    add_dists("import_error")
    with pytest.raises(PluginLoadError) as exc:
        PluginManager.from_environment()
    msg = str(exc.value)
    assert "plugin 'demo_broken' (mlsysim-demo-broken 0.1.0)" in msg
    assert "entry point 'demo_broken = mlsysim_demo_broken'" in msg
    assert "ModuleNotFoundError: No module named 'mlsysim_demo_not_installed'" in msg
    assert "MLSYSIM_DISABLED_PLUGINS=demo_broken" in msg
    assert (exc.value.plugin, exc.value.source, exc.value.hook) == (
        "demo_broken", "mlsysim-demo-broken 0.1.0", "entry point")
    assert isinstance(exc.value.__cause__, ImportError)


def _assert_loaded_without(pm, core_pm, name):
    assert pm.blocked_names == (name,)
    assert pm.is_blocked(name)
    assert name not in pm.registry.plugins
    assert sorted(pm.registry.plugins) == sorted(BUILTIN_ENTRY_POINTS)
    assert solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024).to_json() == \
        solve(core_pm, "mlsysim:llama3-8b", "h100", 8, 1024).to_json()


def test_blocking_the_broken_plugin_by_argument(add_dists, core_pm):
    add_dists("import_error")
    pm = PluginManager.from_environment(blocked=["demo_broken"])
    _assert_loaded_without(pm, core_pm, "demo_broken")


def test_blocking_the_broken_plugin_by_environment(add_dists, core_pm, monkeypatch):
    add_dists("import_error")
    monkeypatch.setenv("MLSYSIM_DISABLED_PLUGINS", " demo_broken , ")
    pm = PluginManager.from_environment()
    _assert_loaded_without(pm, core_pm, "demo_broken")


def test_blocking_with_load_entrypoints_directly(add_dists, core_pm):
    add_dists("import_error")
    pm = PluginManager()
    pm.load_entrypoints(blocked=["demo_broken"])
    _assert_loaded_without(pm, core_pm, "demo_broken")


def test_broken_third_party_is_not_imported_without_autoload(add_dists):
    add_dists("import_error")
    pm = PluginManager.from_environment(autoload=False)
    assert [i.source for i in pm.skipped_third_party] == ["mlsysim-demo-broken 0.1.0"]
    assert "mlsysim_demo_broken" not in sys.modules


# --- (3) unknown (misspelled) hooks ------------------------------------------------------------

@pytest.mark.parametrize("dist, plugin, source, hook", [
    ("misspelled_hook", "demo_misspelled", "mlsysim-demo-misspelled 0.1.0", "mlsysim_optimisers"),
    ("misspelled_unmarked_hook", "demo_unmarked", "mlsysim-demo-unmarked 0.1.0", "mlsysim_weight_term"),
], ids=["marked", "unmarked"])
def test_misspelled_hook_is_a_contract_error(add_dists, dist, plugin, source, hook):
    add_dists(dist)
    with pytest.raises(PluginContractError) as exc:
        PluginManager.from_environment()
    msg = str(exc.value)
    assert f"plugin '{plugin}' ({source}) implements unknown hook '{hook}' (a misspelling?)" in msg
    assert "Known hooks: mlsysim_checkpointing_strategies, mlsysim_optimizers," in msg
    assert (exc.value.plugin, exc.value.source, exc.value.hook) == (plugin, source, hook)


# --- (4) wrong return types of registration hooks ----------------------------------------------

def test_registration_hook_returning_a_str(add_dists):
    add_dists("wrong_return")
    pm = PluginManager.from_environment()          # loading is fine; the registry is lazy
    with pytest.raises(PluginContractError) as exc:
        pm.registry
    assert str(exc.value) == ("plugin 'demo_wrong_return' (mlsysim-demo-wrong-return 0.1.0) hook "
                              "mlsysim_optimizers returned str; expected a list of specs. To run without "
                              "it, set MLSYSIM_DISABLED_PLUGINS=demo_wrong_return (or pass "
                              "--disable-plugin demo_wrong_return)")
    assert (exc.value.plugin, exc.value.hook) == ("demo_wrong_return", "mlsysim_optimizers")
    with pytest.raises(PluginContractError, match="demo_wrong_return"):
        solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024)


def test_registration_hook_returning_the_wrong_spec_type(add_dists):
    add_dists("wrong_item")
    pm = PluginManager.from_environment()
    with pytest.raises(PluginContractError) as exc:
        pm.registry
    msg = str(exc.value)
    assert msg.startswith("plugin 'demo_wrong_item' (mlsysim-demo-wrong-item 0.1.0) hook "
                          "mlsysim_sharding_rules returned OptimizerSpec OptimizerSpec(name='demo.not-a-rule'")
    assert msg.endswith("; expected ShardingRuleSpec. To run without it, set "
                        "MLSYSIM_DISABLED_PLUGINS=demo_wrong_item (or pass --disable-plugin demo_wrong_item)")
    assert (exc.value.source, exc.value.hook) == ("mlsysim-demo-wrong-item 0.1.0", "mlsysim_sharding_rules")


# --- (5) invalid bytes at solve time -----------------------------------------------------------

@pytest.fixture
def bad_bytes_pm(add_dists):
    add_dists("bad_bytes")
    return PluginManager.from_environment()


@pytest.mark.parametrize("optimizer, shown", [("demo.negative", "-8030000000.0"), ("demo.nan", "nan")])
def test_invalid_bytes_from_an_optimizer(bad_bytes_pm, optimizer, shown):
    with pytest.raises(PluginContractError) as exc:
        solve(bad_bytes_pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer=optimizer)
    assert str(exc.value) == (
        f"plugin 'demo_bad_bytes' (mlsysim-demo-bad-bytes 0.1.0) optimizer '{optimizer}' state_terms "
        f"raised ValueError: MemoryTerm.nbytes must be a finite number of bytes >= 0, got {shown} "
        f"(term '{optimizer.split('.')[1]} state')")
    assert (exc.value.plugin, exc.value.source, exc.value.hook) == (
        "demo_bad_bytes", "mlsysim-demo-bad-bytes 0.1.0", "state_terms")
    assert isinstance(exc.value.__cause__, ValueError)


def test_nan_bytes_from_an_included_component_hook(bad_bytes_pm, core_pm):
    args = ("mlsysim:llama3-8b", "h100", 8, 1024)
    # Not included: the component hook is never called and nothing changes.
    assert solve(bad_bytes_pm, *args).to_json() == solve(core_pm, *args).to_json()
    with pytest.raises(PluginContractError) as exc:
        solve(bad_bytes_pm, *args, include_plugins=["demo_bad_bytes"])
    assert str(exc.value) == (
        "plugin 'demo_bad_bytes' (mlsysim-demo-bad-bytes 0.1.0) hook mlsysim_optimizer_state_terms "
        "raised ValueError: MemoryTerm.nbytes must be a finite number of bytes >= 0, got nan (term 'nan extra')")
    assert (exc.value.plugin, exc.value.hook) == ("demo_bad_bytes", "mlsysim_optimizer_state_terms")


# --- (6) conflicts -----------------------------------------------------------------------------

def test_spec_name_conflict_names_both_providers(add_dists):
    add_dists("clash")
    pm = PluginManager.from_environment()
    with pytest.raises(PluginConflictError) as exc:
        pm.registry
    msg = str(exc.value)
    assert msg.startswith("optimizer 'adam' is provided by more than one plugin: "
                          f"plugin 'adam' ({CORE}), plugin 'demo_clash' (mlsysim-demo-clash 0.1.0).")
    assert "MLSYSIM_DISABLED_PLUGINS" in msg
    assert (exc.value.plugin, exc.value.hook) == ("demo_clash", "mlsysim_optimizers")


def test_spec_name_conflict_is_resolved_by_blocking(add_dists, core_pm):
    add_dists("clash")
    pm = PluginManager.from_environment(blocked=["demo_clash"])
    assert pm.registry.provider("optimizer", "adam").source == CORE
    assert solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024).optimizer_state == 12.0 * P


def test_duplicate_entry_point_name_across_distributions(add_dists):
    add_dists("dup_entry_a", "dup_entry_b")
    with pytest.raises(PluginConflictError) as exc:
        PluginManager.from_environment()
    assert str(exc.value).startswith(
        "entry point 'demo_dup' in group 'mlsysim_core' is declared by more than one plugin: "
        "mlsysim-demo-dup-a 0.1.0 -> mlsysim_demo_dup_a; mlsysim-demo-dup-b 0.2.0 -> mlsysim_demo_dup_b.")
    assert (exc.value.plugin, exc.value.hook) == ("demo_dup", "entry point")


def test_third_party_entry_point_cannot_shadow_a_builtin(add_dists):
    add_dists("shadow_builtin")
    with pytest.raises(PluginConflictError) as exc:
        PluginManager.from_environment()
    msg = str(exc.value)
    assert "entry point 'adam' in group 'mlsysim_core' is declared by more than one plugin" in msg
    assert f"{CORE} -> mlsysim_plugins.adam" in msg
    assert "mlsysim-demo-shadow 0.1.0 -> mlsysim_demo_shadow" in msg


def test_duplicate_entry_point_can_be_blocked_as_the_message_says(add_dists):
    add_dists("dup_entry_a", "dup_entry_b")
    pm = PluginManager.from_environment(blocked=["demo_dup"])
    assert pm.blocked_names == ("demo_dup",)


# --- (7) autoload off ----------------------------------------------------------------------------

@pytest.mark.parametrize("how", ["argument", "env-1", "env-true"])
def test_autoload_off_loads_only_builtins(add_dists, monkeypatch, how):
    add_dists("lion", "hpz")
    if how == "argument":
        pm = PluginManager.from_environment(autoload=False)
    else:
        monkeypatch.setenv("MLSYSIM_DISABLE_PLUGIN_AUTOLOAD", how.split("-")[1])
        pm = PluginManager.from_environment()
    assert sorted(pm.registry.plugins) == sorted(BUILTIN_ENTRY_POINTS)
    assert [(i.name, i.source) for i in pm.skipped_third_party] == [
        ("demo_hpz", "mlsysim-demo-hpz 0.1.0"), ("demo_lion", "mlsysim-demo-lion 0.1.0")]
    with pytest.raises(InvalidInputError) as exc:
        solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer="demo.lion")
    assert exc.value.parameter == "optimizer"
    msg = str(exc.value)
    assert msg.startswith("optimizer='demo.lion' is not allowed: ")
    choices = msg.split(" is not allowed: ", 1)[1]
    for name in ("adam", "adamw", "none", "sgd"):       # the installed choices are listed
        assert name in choices
    assert "demo.lion" not in choices and "demo_" not in choices
    with pytest.raises(InvalidInputError) as exc:
        solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, data_parallel="demo.hpz")
    assert exc.value.parameter == "data_parallel"
    assert (f"an installed data-parallel rule: fsdp ({CORE}), fsdp-grad-op ({CORE}), hsdp ({CORE}), "
            f"mcore-ddp ({CORE}), mcore-distopt ({CORE}), "
            f"zero0 ({CORE}), zero1 ({CORE}), zero2 ({CORE}), zero3 ({CORE})") in str(exc.value)


@pytest.mark.parametrize("value", ["0", "false", "no", ""])
def test_autoload_env_falsy_values_keep_third_party(add_dists, monkeypatch, value):
    add_dists("lion")
    monkeypatch.setenv("MLSYSIM_DISABLE_PLUGIN_AUTOLOAD", value)
    pm = PluginManager.from_environment()
    assert pm.info("demo_lion").source == "mlsysim-demo-lion 0.1.0"
    assert pm.registry.provider("optimizer", "demo.lion").name == "demo_lion"


def test_load_entrypoints_without_third_party_equals_autoload_off(add_dists, core_pm):
    add_dists("lion")
    pm = PluginManager()
    pm.load_entrypoints(third_party=False)
    assert [i.name for i in pm.skipped_third_party] == ["demo_lion"]
    assert dict(pm.registry.plugins) == dict(core_pm.registry.plugins)


# --- (8) installed but unselected plugins never change a number ----------------------------------

@pytest.mark.parametrize("args, kwargs", CONFIGS, ids=[c[0][0] for c in CONFIGS])
def test_unselected_third_party_plugins_change_nothing(add_dists, core_pm, args, kwargs):
    add_dists("lion", "hpz", "bad_bytes")
    pm = PluginManager.from_environment()
    assert {"demo_lion", "demo_hpz", "demo_bad_bytes"} <= set(pm.registry.plugins)
    with_plugins = solve(pm, *args, **kwargs)
    without = solve(core_pm, *args, **kwargs)
    assert with_plugins.to_dict() == without.to_dict()
    assert with_plugins.to_json() == without.to_json()
    assert set(with_plugins.plugin_sources.values()) == {CORE}


def test_selected_third_party_optimizer_and_included_hook(add_dists, core_pm):
    add_dists("lion")
    pm = PluginManager.from_environment()
    base = solve(core_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=4, zero_stage=1)
    lion = solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=4, zero_stage=1, optimizer="demo.lion")
    assert lion.optimizer_state == P * 8.0 / 4 == 16_060_000_000.0
    assert (lion.weights, lion.gradients, lion.activations, lion.communication_buffers) == (
        base.weights, base.gradients, base.activations, base.communication_buffers)
    [term] = lion.terms_of("optimizer_state")
    assert term.source == "demo_lion"
    assert lion.plugin_sources["demo_lion"] == "mlsysim-demo-lion 0.1.0"
    # The component hook only counts when the plugin is included.
    inc = solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=4, zero_stage=1, include_plugins=["demo_lion"])
    assert inc.communication_buffers == base.communication_buffers + 1_000_000_000
    assert inc.total_memory == base.total_memory + 1_000_000_000
    assert [t.label for t in inc.terms_of("communication_buffers") if t.source == "demo_lion"] == [
        "demo.lion fused-kernel workspace"]


# --- (9) a third-party data-parallel rule with typed options -------------------------------------

@pytest.fixture
def hpz_pm(add_dists):
    add_dists("hpz")
    return PluginManager.from_environment()


def test_hpz_rule_by_name_with_options(hpz_pm, core_pm):
    args = ("mlsysim:llama3-8b", "h100", 8, 1024)
    r = solve(hpz_pm, *args, dp_size=8, data_parallel="demo.hpz",
              plugin_options={"demo.hpz": {"secondary_group": 4}})
    # Hand derivation, P = 8.03e9 params, fp16 (2 B), dp = 8, secondary group 4:
    assert r.weights == P * 2 / 4 == 4_015_000_000.0            # weights / secondary group
    assert r.gradients == P * 2 / 8 == 2_007_500_000.0          # gradients / dp
    assert r.optimizer_state == P * 12 / 8 == 12_045_000_000.0  # Adam 12 B / dp
    assert r.activations == 32 * 34 * 1024 * 1 * 4096 == 4_563_402_752   # micro-batch 8/8 = 1
    assert r.communication_buffers == 0.05 * r.gradients
    assert r.total_memory == (r.weights + r.gradients + r.optimizer_state + r.activations
                              + r.communication_buffers)
    assert r.selected["dp_rule"] == "demo.hpz"
    assert r.plugin_sources["demo_hpz"] == "mlsysim-demo-hpz 0.1.0"
    assert "demo.hpz: optimizer state and gradients / 8, weights / secondary group of 4." in r.constraint_trace
    # Only the weights differ from ZeRO-3 (which shards them over all 8 ranks).
    z3 = solve(core_pm, *args, dp_size=8, zero_stage=3)
    assert r.weights == 2 * z3.weights
    assert (r.gradients, r.optimizer_state, r.activations, r.communication_buffers) == (
        z3.gradients, z3.optimizer_state, z3.activations, z3.communication_buffers)
    # The default secondary group (8 = dp) is exactly ZeRO-3.
    d = solve(hpz_pm, *args, dp_size=8, data_parallel="demo.hpz")
    assert (d.weights, d.gradients, d.optimizer_state, d.total_memory) == (
        z3.weights, z3.gradients, z3.optimizer_state, z3.total_memory)


def test_hpz_options_as_the_attrs_instance(hpz_pm):
    options_type = sys.modules["mlsysim_demo_hpz"].HpzOptions
    r = solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, data_parallel="demo.hpz",
              plugin_options={"demo.hpz": options_type(secondary_group=2)})
    assert r.weights == P * 2 / 2 == 8_030_000_000.0


@pytest.mark.parametrize("value, fragment", [
    ({"secondary": 4}, "unknown field(s) secondary @ demo.hpz"),
    ({"secondary_group": "four"}, "expected an integer, got 'four' @ demo.hpz.secondary_group"),
    ({"secondary_group": [4]}, "expected an integer, got [4] @ demo.hpz.secondary_group"),
    ({"secondary_group": 0}, "'secondary_group' must be > 0: 0 @ demo.hpz"),
    ({"secondary_group": -4}, "'secondary_group' must be > 0: -4 @ demo.hpz"),
    (4, "a dict or a HpzOptions instance"),
], ids=["unknown-field", "wrong-type-str", "wrong-type-list", "zero", "negative", "not-a-dict"])
def test_hpz_bad_options(hpz_pm, value, fragment):
    with pytest.raises(InvalidInputError) as exc:
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, data_parallel="demo.hpz",
              plugin_options={"demo.hpz": value})
    assert not isinstance(exc.value, PluginContractError)
    assert exc.value.parameter == "plugin_options['demo.hpz']"
    assert str(exc.value).startswith(f"plugin_options['demo.hpz']={value!r} is not allowed")
    assert fragment in str(exc.value)


def test_hpz_layout_error_passes_through(hpz_pm):
    with pytest.raises(LayoutError) as exc:
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, data_parallel="demo.hpz",
              plugin_options={"demo.hpz": {"secondary_group": 3}})
    assert str(exc.value) == ("plugin_options['demo.hpz'].secondary_group=3 is not allowed: "
                              "a divisor of dp_size=8")


def test_options_for_an_unselected_spec_raise(hpz_pm):
    with pytest.raises(InvalidInputError) as exc:
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, zero_stage=3,
              plugin_options={"demo.hpz": {"secondary_group": 4}})
    assert exc.value.parameter == "plugin_options"
    assert exc.value.value == "demo.hpz"
    assert "that spec is not selected in this solve" in str(exc.value)
    assert "options for a selected spec: adam, cp, ep, pp, selective, tp, zero3" in str(exc.value)


def test_options_for_a_spec_without_options_raise(hpz_pm):
    with pytest.raises(InvalidInputError) as exc:
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, plugin_options={"adam": {}})
    assert exc.value.parameter == "plugin_options['adam']"
    assert "nothing: 'adam' declares no options" in str(exc.value)


def test_data_parallel_rule_and_zero_stage_are_exclusive(hpz_pm):
    with pytest.raises(InvalidInputError) as exc:
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, zero_stage=2, data_parallel="demo.hpz")
    assert exc.value.parameter == "zero_stage"


@pytest.mark.parametrize("value", [4.5, True])
def test_non_int_option_values_are_rejected(hpz_pm, value):
    with pytest.raises(InvalidInputError):
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, data_parallel="demo.hpz",
              plugin_options={"demo.hpz": {"secondary_group": value}})


def test_out_of_range_option_message_names_the_rule(hpz_pm):
    with pytest.raises(InvalidInputError) as exc:
        solve(hpz_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=8, data_parallel="demo.hpz",
              plugin_options={"demo.hpz": {"secondary_group": 0}})
    assert "must be > 0" in str(exc.value)


# --- the demo optimizer package's plugin module, registered directly ------------------------------

@pytest.fixture
def galore_pm(monkeypatch):
    monkeypatch.syspath_prepend(str(GALORE_SRC))
    module = importlib.import_module("mlsysim_demo_optimizer.galore")
    pm = PluginManager.from_environment(autoload=False)
    pm.register(module, name="demo_galore")
    return pm


def test_galore_state_matches_the_readme_formula(galore_pm):
    r = solve(galore_pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer="demo.galore",
              plugin_options={"demo.galore": {"rank": 64}})
    master, moments = 4.0 * P, 8 * 64 * 4096 * 7 * 32
    assert moments == 469_762_048
    assert r.optimizer_state == master + moments == 32_589_762_048.0
    terms = {t.label: t for t in r.terms_of("optimizer_state")}
    assert terms["demo.galore fp32 master copy"].nbytes == 32_120_000_000.0
    low = terms["demo.galore low-rank moments m, v (fp32, rank 64)"]
    assert low.nbytes == moments
    assert low.formula == ("8 B x rank 64 x hidden_dim 4096 x 7 matrices/layer x 32 layers "
                           "/ 1 (parameter shards)")
    assert {t.source for t in terms.values()} == {"demo_galore"}
    # Default rank 128.
    d = solve(galore_pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer="demo.galore")
    assert d.optimizer_state == master + 2 * moments == 33_059_524_096.0


def test_galore_state_is_sharded(galore_pm):
    r = solve(galore_pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer="demo.galore", tp_size=2, pp_size=2,
              dp_size=4, zero_stage=1, plugin_options={"demo.galore": {"rank": 64}})
    # master: 4 B x (P / (tp*pp)) / dp; moments: 469,762,048 / (tp*pp) / dp
    assert r.optimizer_state == 4.0 * P / 4 / 4 + 469_762_048 / 16 == 2_036_860_128.0


@pytest.mark.parametrize("rank", [0, -64, "sixty-four"])
def test_galore_bad_rank(galore_pm, rank):
    with pytest.raises(InvalidInputError) as exc:
        solve(galore_pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer="demo.galore",
              plugin_options={"demo.galore": {"rank": rank}})
    assert exc.value.parameter == "plugin_options['demo.galore']"


# --- (10) registration order never changes a result ----------------------------------------------

def _builtin_modules():
    return {name: importlib.import_module(value) for name, value in BUILTIN_ENTRY_POINTS.items()}


def _manager_in_order(names):
    modules = _builtin_modules()
    pm = PluginManager()
    for name in names:
        pm.register(modules[name], name=name)
    pm.check()
    return pm


def _orders():
    names = sorted(BUILTIN_ENTRY_POINTS)
    orders = {"sorted": names, "reversed": names[::-1]}
    for seed in (1, 7, 2024):
        shuffled = names[:]
        random.Random(seed).shuffle(shuffled)
        orders[f"shuffled-{seed}"] = shuffled
    return orders


def test_registration_order_independence(core_pm):
    orders = _orders()
    assert len({tuple(o) for o in orders.values()}) == len(orders)
    results = {label: [solve(_manager_in_order(order), *a, **k).to_json() for a, k in CONFIGS]
               for label, order in orders.items()}
    reference = results["sorted"]
    for label, jsons in results.items():
        assert jsons == reference, label
    # Same numbers as loading through the entry points (only the provenance label differs).
    for (a, k), text in zip(CONFIGS, reference):
        direct = solve(_manager_in_order(orders["reversed"]), *a, **k).to_dict()
        loaded = solve(core_pm, *a, **k).to_dict()
        assert set(direct.pop("plugin_sources").values()) == {"registered directly"}
        assert set(loaded.pop("plugin_sources").values()) == {CORE}
        assert direct == loaded


# --- (11) sharding-rule and component-hook contract violations -----------------------------------

@pytest.fixture
def bad_rules_pm(add_dists):
    add_dists("bad_rules")
    return PluginManager.from_environment()


def test_sharding_rule_returning_the_wrong_type(bad_rules_pm):
    with pytest.raises(PluginContractError) as exc:
        solve(bad_rules_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=2, data_parallel="demo.dict-apply")
    assert str(exc.value) == ("plugin 'demo_bad_rules' (mlsysim-demo-bad-rules 0.1.0) sharding rule "
                              "'demo.dict-apply' apply returned dict; expected ShardingEffect")
    assert (exc.value.plugin, exc.value.source, exc.value.hook) == (
        "demo_bad_rules", "mlsysim-demo-bad-rules 0.1.0", "apply")


def test_sharding_rule_raising(bad_rules_pm):
    with pytest.raises(PluginContractError) as exc:
        solve(bad_rules_pm, "mlsysim:llama3-8b", "h100", 8, 1024, dp_size=2, data_parallel="demo.raising-apply")
    assert str(exc.value) == ("plugin 'demo_bad_rules' (mlsysim-demo-bad-rules 0.1.0) sharding rule "
                              "'demo.raising-apply' apply raised KeyError: 'secondary_group'")
    assert isinstance(exc.value.__cause__, KeyError)


def test_component_hook_raising_names_the_plugin(bad_rules_pm, core_pm):
    args = ("mlsysim:llama3-8b", "h100", 8, 1024)
    assert solve(bad_rules_pm, *args).to_json() == solve(core_pm, *args).to_json()
    with pytest.raises(PluginContractError) as exc:
        solve(bad_rules_pm, *args, include_plugins=["demo_bad_rules"])
    assert str(exc.value) == ("plugin 'demo_bad_rules' (mlsysim-demo-bad-rules 0.1.0) hook "
                              "mlsysim_activation_terms raised RuntimeError: demo activation hook exploded")
    assert (exc.value.plugin, exc.value.hook) == ("demo_bad_rules", "mlsysim_activation_terms")
    assert isinstance(exc.value.__cause__, RuntimeError)


class _GeneratorOptimizer:
    """A plugin written with generators: both its hook and its state_terms yield lazily."""

    @staticmethod
    def negative_terms(plan, placement, options):
        yield MemoryTerm(component=OPTIMIZER_STATE, label="negative", nbytes=-1)

    @hookimpl
    def mlsysim_optimizers(self):
        yield OptimizerSpec(name="demo.gen", state_terms=self.negative_terms)


class _GeneratorBadSpec:
    @hookimpl
    def mlsysim_optimizers(self):
        yield OptimizerSpec(name="Not A Valid Name", state_terms=print)


def test_generator_plugins_work_when_valid():
    pm = PluginManager.from_environment(autoload=False)
    pm.register(_GeneratorOptimizer(), name="demo_gen")
    assert pm.registry.provider("optimizer", "demo.gen").source == "registered directly"


def test_generator_state_terms_with_bad_bytes_blame_the_plugin():
    pm = PluginManager.from_environment(autoload=False)
    pm.register(_GeneratorOptimizer(), name="demo_gen")
    with pytest.raises(PluginContractError, match="demo_gen"):
        solve(pm, "mlsysim:llama3-8b", "h100", 8, 1024, optimizer="demo.gen")


def test_generator_registration_hook_with_bad_spec_blames_the_plugin():
    pm = PluginManager.from_environment(autoload=False)
    pm.register(_GeneratorBadSpec(), name="demo_genspec")
    with pytest.raises(PluginContractError, match="demo_genspec"):
        pm.registry


# --- (12) the not-installed guard ------------------------------------------------------------------

def test_missing_own_entry_points_raise_not_installed(add_dists, monkeypatch):
    add_dists("lion")
    real = importlib.metadata.entry_points

    def without_core(**kwargs):
        return [ep for ep in real(**kwargs) if ep.dist is None or ep.dist.name != "mlsysim-core"]

    monkeypatch.setattr(importlib.metadata, "entry_points", without_core)
    assert [ep.name for ep in importlib.metadata.entry_points(group="mlsysim_core")] == ["demo_lion"]
    with pytest.raises(NotInstalledError) as exc:
        PluginManager.from_environment()
    msg = str(exc.value)
    assert "mlsysim-core is not installed" in msg
    assert "`pip install -e .`" in msg
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda **kwargs: [])
    with pytest.raises(NotInstalledError, match=r"pip install -e \."):
        PluginManager().load_entrypoints()


def test_guard_only_applies_to_the_real_group():
    pm = PluginManager()
    pm.load_entrypoints(group="mlsysim_core_tests_no_such_group")
    assert pm.list_name_plugin() == []
    assert dict(pm.registry.optimizers) == {}
    assert dict(pm.registry.plugins) == {}
