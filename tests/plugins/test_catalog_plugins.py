"""The catalog's user directory and plugin hooks: loading, attribution, collisions, errors."""

import json
import os
import subprocess
import sys

import pytest

from mlsysim_core import (HardwareNode, InvalidInputError, PluginConflictError, PluginContractError,
                          TransformerWorkload, hookimpl)
from mlsysim_core.catalog import (ENV_CATALOG_DIR, CatalogEntry, CatalogError, find_hardware, find_model,
                                  get_hardware, get_model, list_hardware, list_models, read_catalog_file,
                                  user_catalog_dir)
from mlsysim_core.manager import PluginManager

MODEL_ROW = {"key": "myorg/lm-1b", "aliases": ["mylm"], "name": "MyOrg LM 1B", "parameters": 1_100_000_000,
             "layers": 22, "hidden_dim": 2048, "heads": 32, "kv_heads": 4,
             "sources": {"parameters, layers, hidden_dim, heads, kv_heads": "our config.json"}}
GPU_ROW = {"key": "myorg/card-24g", "name": "MyOrg card 24G", "memory_capacity": 24 * 2**30,
           "memory_bandwidth": 1_000_000_000_000, "vendor": "MyOrg"}


@pytest.fixture
def catalog_dir(tmp_path, monkeypatch):
    """An empty user catalog directory named by MLSYSIM_CATALOG_DIR (and no ~/.config one)."""
    directory = tmp_path / "catalog"
    directory.mkdir()
    monkeypatch.setenv(ENV_CATALOG_DIR, str(directory))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return directory


def write(directory, name, data):
    path = directory / name
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return path


# --- the user directory --------------------------------------------------------------------

def test_user_entries_are_added(catalog_dir, solver):
    path = write(catalog_dir, "myorg.json", {"schema": 1, "models": [MODEL_ROW], "hardware": [GPU_ROW]})
    entry = find_model("MYLM")
    assert entry.key == "myorg/lm-1b" and entry.value.kv_heads == 4
    assert entry.origin == "user" and str(path) in entry.provided_by
    assert list_models(plugins=False)[-1] is entry
    gpu = get_hardware("myorg/card-24g")
    assert gpu.memory_capacity == 24 * 2**30 and find_hardware("MyOrg card 24G").origin == "user"
    result = solver.solve("myorg/lm-1b", "myorg/card-24g", 4, 512)
    assert result.weights == 2 * 1_100_000_000
    assert get_model("llama3-8b").parameters == 8_030_261_248        # the built-ins are still there
    assert get_model("mlsysim:llama3-8b").parameters == 8_030_000_000


def test_a_model_only_or_hardware_only_file(catalog_dir):
    write(catalog_dir, "a-models.json", {"schema": 1, "models": [MODEL_ROW]})
    write(catalog_dir, "b-gpus.json", {"schema": 1, "hardware": [GPU_ROW]})
    write(catalog_dir, "README.md", "not a catalog file")
    assert get_model("mylm").layers == 22 and get_hardware("myorg/card-24g").vendor == "MyOrg"


def test_sparse_model_kind_is_inferred(catalog_dir):
    row = {"key": "myorg/moe", "parameters": 10_000_000_000, "active_parameters": 2_000_000_000,
           "layers": 24, "experts": 16, "active_experts_per_token": 2}
    write(catalog_dir, "moe.json", {"schema": 1, "models": [row]})
    model = get_model("myorg/moe")
    assert model.is_sparse and find_model("myorg/moe").extra["kind"] == "sparse_transformer"


def test_changed_files_are_reread(catalog_dir):
    path = write(catalog_dir, "myorg.json", {"schema": 1, "models": [MODEL_ROW]})
    assert get_model("mylm").layers == 22
    write(catalog_dir, "myorg.json", {"schema": 1, "models": [dict(MODEL_ROW, layers=24)]})
    os.utime(path, ns=(1, 1))         # a different mtime even on coarse file systems
    assert get_model("mylm").layers == 24


def test_default_directory_under_xdg_config_home(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_CATALOG_DIR, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert user_catalog_dir() is None
    directory = tmp_path / "mlsysim-core" / "catalog"
    directory.mkdir(parents=True)
    write(directory, "mine.json", {"schema": 1, "models": [MODEL_ROW]})
    assert user_catalog_dir() == directory
    assert find_model("mylm").origin == "user"


def test_env_directory_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_CATALOG_DIR, str(tmp_path / "missing"))
    with pytest.raises(CatalogError, match=f"{ENV_CATALOG_DIR}=.*missing.* is not a directory"):
        get_model("llama3-8b")


def test_collision_with_a_builtin_names_both_files(catalog_dir):
    path = write(catalog_dir, "clash.json", {"schema": 1, "models": [dict(MODEL_ROW, aliases=["Llama3_8B"])]})
    with pytest.raises(CatalogError) as err:
        get_model("mylm")
    message = str(err.value)
    assert "'llama3-8b'" in message and str(path) in message and "(curated_models.json)" in message
    assert "key 'meta-llama/llama-3.1-8b'" in message and "key 'myorg/lm-1b'" in message
    assert isinstance(err.value, InvalidInputError)


def test_collision_between_user_files_names_both(catalog_dir):
    a = write(catalog_dir, "a.json", {"schema": 1, "hardware": [GPU_ROW]})
    b = write(catalog_dir, "b.json", {"schema": 1, "hardware": [dict(GPU_ROW, key="other", name="MyOrg card 24G")]})
    with pytest.raises(CatalogError, match="myorg-card-24g") as err:
        list_hardware(plugins=False)
    assert str(a) in str(err.value) and str(b) in str(err.value)


def test_curated_key_collision_is_caught(catalog_dir):
    write(catalog_dir, "h.json", {"schema": 1, "hardware": [dict(GPU_ROW, aliases=["NVIDIA/H100"])]})
    with pytest.raises(CatalogError, match="curated_hardware.json"):
        get_hardware("h100")


@pytest.mark.parametrize("content,match", [
    ("{not json", r"not valid JSON"),
    ([MODEL_ROW], r"expected a JSON object"),
    ({"models": [MODEL_ROW]}, r"field 'schema' must be 1, got None"),
    ({"schema": 2, "models": [MODEL_ROW]}, r"field 'schema' must be 1, got 2"),
    ({"schema": 1, "model": [MODEL_ROW]}, r"unknown top-level field 'model'"),
    ({"schema": 1, "models": MODEL_ROW}, r"field 'models' must be a list"),
    ({"schema": 1, "models": [dict(MODEL_ROW, paramters=1)]},
     r"models\[0\] \('myorg/lm-1b'\): unknown field 'paramters' \(did you mean 'parameters'\?\)"),
    ({"schema": 1, "models": [dict(MODEL_ROW, kv_heads=64)]},
     r"models\[0\] \('myorg/lm-1b'\): kv_heads=64 is not allowed: at most heads=32"),
    ({"schema": 1, "models": [dict(MODEL_ROW, layers="22")]},
     r"models\[0\] \('myorg/lm-1b'\): layers='22' is not allowed: an integer >= 1"),
    ({"schema": 1, "models": [{k: v for k, v in MODEL_ROW.items() if k != "layers"}]},
     r"models\[0\] \('myorg/lm-1b'\): required field 'layers' is missing"),
    ({"schema": 1, "models": [dict(MODEL_ROW, experts=8, kind="transformer")]},
     r"field 'experts' is only for mixture-of-experts models"),
    ({"schema": 1, "models": [dict(MODEL_ROW, key="")]}, r"models\[0\]: field 'key' is required"),
    ({"schema": 1, "models": [dict(MODEL_ROW, aliases="mylm")]}, r"field 'aliases' must be a list"),
    ({"schema": 1, "hardware": [dict(GPU_ROW, memory_capacity=0)]},
     r"hardware\[0\] \('myorg/card-24g'\): memory_capacity=0 is not allowed"),
    ({"schema": 1, "hardware": [dict(GPU_ROW, name=3)]}, r"hardware\[0\] \('myorg/card-24g'\): name=3 is not allowed: a non-empty string"),
])
def test_malformed_files_name_the_file_and_field(catalog_dir, content, match):
    path = write(catalog_dir, "bad.json", content)
    with pytest.raises(CatalogError, match=match) as err:
        get_model("llama3-8b")
    assert str(path) in str(err.value)
    with pytest.raises(CatalogError, match=match):
        read_catalog_file(path)


def test_extra_metadata_and_round_trip(catalog_dir):
    row = dict(MODEL_ROW, notes="internal", extra={"team": "lm", "run": 7})
    write(catalog_dir, "x.json", {"schema": 1, "models": [row]})
    entry = find_model("mylm")
    assert entry.extra["notes"] == "internal" and entry.extra["team"] == "lm"
    assert CatalogEntry.from_dict(entry.to_dict()) == entry


# --- plugins -------------------------------------------------------------------------------

def manager(*plugins):
    """A manager with the built-ins and the given (name, object) plugins registered directly."""
    pm = PluginManager.from_environment(autoload=False)
    for name, plugin in plugins:
        pm.register(plugin, name=name)
    return pm


class Catalog:
    """A plugin that adds entries; counts how often its hooks run."""

    def __init__(self, models=(), hardware=()):
        self.models, self.hardware, self.calls = list(models), list(hardware), 0

    @hookimpl
    def mlsysim_catalog_models(self):
        self.calls += 1
        return [CatalogEntry.from_dict(row, kind="model") for row in self.models]

    @hookimpl
    def mlsysim_catalog_hardware(self):
        return (CatalogEntry.from_dict(row, kind="hardware") for row in self.hardware)   # a generator


def test_plugin_entries_are_added_and_attributed(catalog_dir):
    plugin = Catalog([MODEL_ROW], [GPU_ROW])
    pm = manager(("myorg_catalog", plugin))
    entry = find_model("mylm", plugin_manager=pm)
    assert entry.origin == "plugin" and entry.provided_by == "plugin 'myorg_catalog' (registered directly)"
    assert entry.extra["plugin"] == "myorg_catalog"
    assert list_models(plugin_manager=pm)[-1] is entry
    assert get_hardware("myorg/card-24g", plugin_manager=pm).memory_capacity == 24 * 2**30
    list_models(plugin_manager=pm)
    get_model("myorg/lm-1b", plugin_manager=pm)
    assert plugin.calls == 1                                     # collected once per manager
    with pytest.raises(InvalidInputError, match="model=.mylm. is not allowed"):  # not in another manager
        get_model("mylm", plugin_manager=manager())


def test_builtin_lookups_do_not_call_plugins(catalog_dir):
    plugin = Catalog([MODEL_ROW])
    pm = manager(("myorg_catalog", plugin))
    assert get_model("llama3-8b", plugin_manager=pm).parameters == 8_030_261_248
    assert list_models(plugin_manager=pm, plugins=False)[-1].origin == "curated"
    assert plugin.calls == 0


def test_registering_or_unregistering_recollects(catalog_dir):
    pm = manager()
    n = len(list_models(plugin_manager=pm))
    pm.register(Catalog([MODEL_ROW]), name="myorg_catalog")
    assert len(list_models(plugin_manager=pm)) == n + 1
    pm.unregister(name="myorg_catalog")
    assert len(list_models(plugin_manager=pm)) == n


def test_plugins_are_listed_by_plugin_name(catalog_dir):
    second = dict(MODEL_ROW, key="aaa/model", aliases=[], name="aaa/model")
    pm = manager(("zzz_catalog", Catalog([second])), ("aaa_catalog", Catalog([MODEL_ROW])))
    tail = [e.extra["plugin"] for e in list_models(plugin_manager=pm)[-2:]]
    assert tail == ["aaa_catalog", "zzz_catalog"]


def test_plugin_collision_with_a_builtin(catalog_dir):
    pm = manager(("myorg_catalog", Catalog([dict(MODEL_ROW, aliases=["llama3-8b"])])))
    assert get_model("llama3-8b", plugin_manager=pm).parameters == 8_030_261_248   # built-in names win
    with pytest.raises(PluginConflictError) as err:
        list_models(plugin_manager=pm)
    message = str(err.value)
    assert "plugin 'myorg_catalog' (registered directly)" in message and "models.json" in message
    assert err.value.plugin == "myorg_catalog" and err.value.hook == "mlsysim_catalog_models"


def test_plugin_collision_with_a_user_entry_and_another_plugin(catalog_dir):
    path = write(catalog_dir, "mine.json", {"schema": 1, "hardware": [GPU_ROW]})
    pm = manager(("one", Catalog(hardware=[GPU_ROW])), ("two", Catalog(hardware=[GPU_ROW])))
    with pytest.raises(PluginConflictError) as err:
        list_hardware(plugin_manager=pm)
    message = str(err.value)
    assert str(path) in message and "plugin 'one'" in message and "plugin 'two'" in message


def test_plugin_collision_is_reported_on_an_unknown_name(catalog_dir):
    pm = manager(("one", Catalog([MODEL_ROW])), ("two", Catalog([MODEL_ROW])))
    with pytest.raises(PluginConflictError, match="plugin 'one'.*plugin 'two'"):
        get_model("no-such-model", plugin_manager=pm)


class Returns:
    def __init__(self, value):
        self.value = value

    @hookimpl
    def mlsysim_catalog_models(self):
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


@pytest.mark.parametrize("value,match", [
    (CatalogEntry.from_dict(MODEL_ROW), r"returned CatalogEntry; expected a list of CatalogEntry"),
    ("myorg/lm-1b", r"returned str"),
    ([dict(MODEL_ROW)], r"returned dict .*expected a CatalogEntry \(build one with CatalogEntry.from_dict"),
    ([TransformerWorkload(name="x", parameters=10, layers=1)], r"returned TransformerWorkload"),
    ([CatalogEntry.from_dict(GPU_ROW)], r"entry 'myorg/card-24g' whose value is a HardwareNode"),
    (RuntimeError("boom"), r"raised RuntimeError: boom"),
])
def test_plugin_contract_errors(catalog_dir, value, match):
    pm = manager(("bad_catalog", Returns(value)))
    with pytest.raises(PluginContractError, match=match) as err:
        list_models(plugin_manager=pm)
    assert "plugin 'bad_catalog'" in str(err.value) and err.value.hook == "mlsysim_catalog_models"


def test_plugin_returning_none_adds_nothing(catalog_dir):
    pm = manager(("empty", Returns(None)))
    assert len(list_models(plugin_manager=pm)) == len(list_models(plugins=False))


def test_catalog_hook_cannot_be_a_wrapper(catalog_dir):
    class Wrapper:
        @hookimpl(wrapper=True)
        def mlsysim_catalog_hardware(self):
            return (yield)
    pm = manager(("wrapper", Wrapper()))
    with pytest.raises(PluginContractError, match="wrapper"):
        list_hardware(plugin_manager=pm)


def test_misspelled_catalog_hook_is_caught():
    class Typo:
        def mlsysim_catalog_model(self):
            return []
    pm = manager(("typo", Typo()))
    with pytest.raises(PluginContractError, match="unknown hook 'mlsysim_catalog_model'"):
        pm.check()


def test_hardware_entries_from_python():
    entry = CatalogEntry(key="x/gpu", value=HardwareNode(name="X GPU", memory_capacity=2**30))
    assert entry.kind == "hardware" and entry.aliases == () and entry.origin is None
    assert CatalogEntry.from_dict(entry.to_dict()) == entry


def test_importing_and_builtin_lookups_load_no_plugins():
    code = ("import sys, mlsysim_core.catalog as c; c.get_model('llama3-8b'); c.get_hardware('nvidia/h100');"
            "c.list_models(plugins=False); print(sorted(m for m in sys.modules if 'mlsysim_plugins' in m "
            "or m == 'mlsysim_core.manager'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
