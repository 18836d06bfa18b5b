"""The launch-config framework (issue 26): `Scenario.from_launch` and `--from`, with readers
registered through the `mlsysim_launch_formats` hook exactly as a third-party package does."""

from __future__ import annotations

import json
import sys
import types

import pytest

from mlsysim_core import hookimpl
from mlsysim_plugins.launch import LaunchFormatSpec
from mlsysim_core.errors import InvalidInputError, NotModelledError, PluginContractError
from mlsysim_core.manager import PluginManager
from mlsysim_core.scenario import LaunchDefault, LaunchField, LaunchReading, Scenario, from_launch

from clitools import error_of, run


def _reader(name: str, marker: str, *, world=None, broken: bool = False, dtype_default: bool = True):
    """A module implementing the hook: reads ``{marker: {...}}`` files."""
    def recognizes(path, document):
        return isinstance(document, dict) and marker in document

    def read(path, document, context):
        if broken:
            raise KeyError("boom")
        cfg = document[marker]
        fields, ignored = [], []
        for key, value in cfg.items():
            if key == "model":
                fields.append(LaunchField(key=f"{marker}.model", value=value, field="model", becomes=value))
            elif key == "mbs":
                fields.append(LaunchField(key=f"{marker}.mbs", value=value, field="micro_batch_size", becomes=value))
            elif key == "seq":
                fields.append(LaunchField(key=f"{marker}.seq", value=value, field="seq_len", becomes=value))
            elif key == "accum":
                fields.append(LaunchField(key=f"{marker}.accum", value=value, field="gradient_accumulation_steps",
                                          becomes=value))
            elif key == "tp":
                fields.append(LaunchField(key=f"{marker}.tp", value=value, field="tp_size", becomes=value))
            elif key == "lr":
                ignored.append(f"{marker}.lr")
            elif key == "fp32_under_tp":     # the regime a function of the merged tp_size (LaunchField.derive)
                fields.append(LaunchField(key=f"{marker}.{key}", value=value, field="regime", becomes="bf16",
                                          derived_from=("tp_size",), derive=lambda merged: None if merged.get(
                                              "tp_size") == 4 else {"becomes": "fp32" if merged.get("tp_size", 1) > 1
                                                                    else "bf16", "note": "by tp"}))
            else:
                raise NotModelledError(f"{marker}.{key}", value, "model, mbs, seq, accum, tp, lr",
                                       f"{path}: unknown key")
        for key, value in context.take_overrides(path) if marker == "tt" else ():
            fields.append(LaunchField(key=key, value=value, field="micro_batch_size", becomes=int(value)))
        return LaunchReading(format=name, path=str(path), fields=fields, ignored=ignored, world=world or {},
                             framework_version=f"{name} 1.0",
                             defaults=[LaunchDefault(key=f"{marker}.dtype", field="regime", value="bf16",
                                                     version=f"{name} 1.0", source="demo/config.py:1")]
                             if dtype_default else [])

    module = types.ModuleType(f"reader_{name.replace('.', '_')}")

    @hookimpl
    def mlsysim_launch_formats():
        return [LaunchFormatSpec(name=name, description=f"{name} files", framework=name, suffixes=(".yaml",),
                                 recognizes=recognizes, read=read)]
    module.mlsysim_launch_formats = mlsysim_launch_formats
    return module


def _pm(*modules):
    pm = PluginManager.from_environment(autoload=False)
    for i, module in enumerate(modules):
        pm.register(module, name=f"thirdparty{i}")
    return pm


@pytest.fixture
def files(tmp_path):
    def write(name, data):
        path = tmp_path / name
        path.write_text(json.dumps(data) if name.endswith(".json") else "\n".join(
            f"{k}:\n" + "\n".join(f"  {kk}: {vv}" for kk, vv in v.items()) for k, v in data.items()) + "\n")
        return path
    return write


def test_third_party_reader_gives_the_scenario(files):
    pm = _pm(_reader("myorg.trainer", "tt"))
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 2, "seq": 1024, "accum": 4, "lr": 0.1}})
    launch = Scenario.from_launch([path], gpus=8, hardware="a100", registry=pm.registry)
    s = launch.scenario
    # the global batch: micro-batch 2 x dp 8 x accumulation 4
    assert (s.batch_size, s.dp_size, s.gradient_accumulation_steps, s.seq_len) == (2 * 8 * 4, 8, 4, 1024)
    assert s.hardware == "a100" and s.model == "llama3-8b" and s.profile_options["regime"] == "bf16"
    assert launch.sources["seq_len"] == f"{path}: tt.seq"
    assert launch.sources["regime"].startswith("default")
    text = launch.describe()
    assert "tt.mbs = 2  ->  micro_batch_size = 2" in text and "ignored (no effect on memory): tt.lr" in text
    assert "tt.dtype (absent)  ->  regime = bf16  (myorg.trainer 1.0; demo/config.py:1)" in text
    # the same run through solve keywords
    direct = Scenario(model="llama3-8b", hardware="a100", batch_size=64, seq_len=1024, dp_size=8, profile="measured",
                      gradient_accumulation_steps=4, profile_options={"regime": "bf16"})
    assert s == direct


def test_world_size_over_model_parallel(files):
    pm = _pm(_reader("myorg.trainer", "tt"))
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 1, "seq": 512, "tp": 2}})
    s = from_launch(path, gpus=8, registry=pm.registry).scenario
    assert (s.tp_size, s.dp_size, s.batch_size) == (2, 4, 4)
    with pytest.raises(InvalidInputError, match="multiple of tp x pp x cp = 2"):
        from_launch(path, gpus=3, registry=pm.registry)


def test_distributed_recipe_needs_gpus_single_device_does_not(files):
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 1, "seq": 512}})
    with pytest.raises(InvalidInputError, match="--gpus"):
        from_launch(path, registry=_pm(_reader("myorg.trainer", "tt")).registry)
    single = _pm(_reader("myorg.trainer", "tt", world={"single_device": ("recipe", True)}))
    assert from_launch(path, registry=single.registry).scenario.dp_size == 1
    with pytest.raises(InvalidInputError, match="single-device recipe"):
        from_launch(path, gpus=4, registry=single.registry)


def test_two_readers_claiming_a_file_is_an_error_naming_both(files):
    pm = _pm(_reader("myorg.a", "tt"), _reader("myorg.b", "tt"))
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 1, "seq": 512}})
    with pytest.raises(InvalidInputError) as err:
        from_launch(path, gpus=1, registry=pm.registry)
    assert "'myorg.a' (plugin thirdparty0) and 'myorg.b' (plugin thirdparty1)" in str(err.value)


def test_no_reader_lists_the_formats(files):
    pm = _pm(_reader("myorg.a", "tt"))
    path = files("r.yaml", {"other": {"x": 1}})
    with pytest.raises(InvalidInputError, match=r"no launch format recognizes it") as err:
        from_launch(path, gpus=1, registry=pm.registry)
    assert "myorg.a (myorg.a: myorg.a files)" in str(err.value)


def test_unknown_key_is_refused_not_dropped(files):
    pm = _pm(_reader("myorg.a", "tt"))
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 1, "seq": 512, "fancy_thing": 3}})
    with pytest.raises(NotModelledError, match="tt.fancy_thing=3"):
        from_launch(path, gpus=1, registry=pm.registry)


def test_a_broken_reader_is_named(files):
    pm = _pm(_reader("myorg.a", "tt", broken=True))
    path = files("r.yaml", {"tt": {"model": "llama3-8b"}})
    with pytest.raises(PluginContractError, match="launch format 'myorg.a' \\(plugin thirdparty0\\) raised KeyError"):
        from_launch(path, gpus=1, registry=pm.registry)


def test_files_that_contradict_each_other_are_refused(files):
    pm = _pm(_reader("myorg.a", "tt"), _reader("myorg.b", "uu"))
    one = files("one.yaml", {"tt": {"model": "llama3-8b", "mbs": 1, "seq": 512}})
    two = files("two.yaml", {"uu": {"seq": 1024}})
    with pytest.raises(InvalidInputError) as err:
        from_launch([one, two], gpus=1, registry=pm.registry)
    assert f"{one}'s tt.seq=512 and {two}'s uu.seq=1024 contradict each other" in str(err.value)
    agree = files("three.yaml", {"uu": {"seq": 512, "accum": 2}})
    s = from_launch([one, agree], gpus=2, registry=pm.registry).scenario
    assert (s.seq_len, s.gradient_accumulation_steps, s.batch_size) == (512, 2, 4)


def test_python_files_are_never_executed(tmp_path):
    path = tmp_path / "recipe.py"
    path.write_text("raise SystemExit('executed')\n")
    with pytest.raises(InvalidInputError, match="never executed: dump the resolved config"):
        from_launch(path, gpus=1)


def test_overrides_no_reader_takes_are_refused(files):
    pm = _pm(_reader("myorg.a", "uu"))
    path = files("r.yaml", {"uu": {"model": "llama3-8b", "mbs": 1, "seq": 512}})
    with pytest.raises(InvalidInputError, match="--override"):
        from_launch(path, gpus=1, overrides=["mbs=2"], registry=pm.registry)


@pytest.fixture
def cli_reader(monkeypatch, request):
    """The CLI's plugin manager with the third-party reader registered (as an installed package's)."""
    module = _reader("myorg.trainer", "tt", dtype_default=getattr(request, "param", True))
    original = PluginManager.from_environment.__func__

    def from_environment(cls, *args, **kwargs):
        pm = original(cls, *args, **kwargs)
        pm.register(module, name="thirdparty")
        return pm
    monkeypatch.setattr(PluginManager, "from_environment", classmethod(from_environment))
    monkeypatch.setitem(sys.modules, module.__name__, module)


def test_cli_estimate_from_text_and_json(cli_reader, files):
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 2, "seq": 1024, "lr": 0.1}})
    code, text = run("estimate", "--from", str(path), "--gpus", "4", "-g", "h100", "--no-chart", "--regime", "fp32")
    assert code == 0
    section = text.split("from launch files:", 1)[1]
    assert "tt.seq = 1024  ->  seq_len = 1024" in section
    assert "--regime fp32 overrides regime = bf16 from the files" in section
    code, out = run("estimate", "--from", str(path), "--gpus", "4", "--json")
    data = json.loads(out)
    assert data["run"]["global_batch"] == 8 and data["run"]["dp_size"] == 4
    assert data["launch"]["files"][0]["ignored"] == ["tt.lr"]
    # the same as the flags that describe it
    code, plain = run("estimate", "-m", "llama3-8b", "-b", "8", "--dp", "4", "-s", "1024", "--regime", "bf16", "--json")
    assert json.loads(plain)["total_memory"] == data["total_memory"]


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
@pytest.mark.parametrize("cli_reader", [False], indirect=True)     # (search refuses regime bf16 today)
def test_cli_fit_and_search_from(cli_reader, files):
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 2, "seq": 1024}})
    code, text = run("fit", "batch", "--from", str(path), "--gpus", "8", "--json")
    assert code == 0 and json.loads(text)["launch"]["files"][0]["format"] == "myorg.trainer"
    code, text = run("fit", "techniques", "--from", str(path), "--gpus", "8")
    assert code == 0 and "from launch files:" in text
    # search --from is the search its values describe: 8 devices, global batch 16, llama3-8b, seq 1024
    code, text = run("search", "--from", str(path), "--gpus", "8", "--json", "--workers", "1")
    plain_code, plain = run("search", "-n", "8", "--global-batch", "16", "-m", "llama3-8b", "-s", "1024",
                            "--checkpointing", "selective", "--json", "--workers", "1")
    assert code == plain_code
    if code == 0:
        data = json.loads(text)
        assert data["launch"]["files"][0]["path"] == str(path)
        del data["launch"]
        strip = lambda d: {k: v for k, v in d.items() if k not in ("elapsed_s", "seconds")}
        assert strip(data) == strip(json.loads(plain))


def test_cli_refusals_name_the_flag(cli_reader, files, capsys):
    path = files("r.yaml", {"tt": {"model": "llama3-8b", "mbs": 2, "seq": 1024}})
    code, err = error_of(capsys, "estimate", "--gpus", "8")
    assert code == 2 and "--gpus=8 is not allowed: given with --from FILE" in err
    code, err = error_of(capsys, "estimate", "--from", str(path), "--nodes", "2")
    assert code == 2 and "--nodes with --gpus-per-node" in err
    code, text = run("estimate", "--from", str(path), "--nodes", "2", "--gpus-per-node", "4", "--json")
    assert json.loads(text)["run"]["dp_size"] == 8


def test_a_derived_field_is_resolved_from_the_merged_values(files):
    """LaunchField.derive: a reader gives a value as a function of another field as all the files give it,
    resolved after the merge (another file's tp here), then merged by the same rules; the reading shows what it
    became and from what, the sources too. None: the key sets nothing."""
    pm = _pm(_reader("myorg.trainer", "tt", dtype_default=False), _reader("myorg.launcher", "ll", dtype_default=False))
    trainer = files("t.yaml", {"tt": {"model": "llama3-8b", "mbs": 1, "seq": 512, "fp32_under_tp": True}})
    alone = from_launch([trainer], gpus=8, registry=pm.registry)
    assert alone.scenario.profile_options["regime"] == "bf16"      # tp 1: no file gives tp_size
    assert "(derived from tp_size: none given)" in alone.readings[0].fields[-1].note
    launcher = files("l.yaml", {"ll": {"tp": 2}})
    launch = from_launch([trainer, launcher], gpus=8, registry=pm.registry)
    assert launch.scenario.profile_options["regime"] == "fp32"
    [field] = [f for f in launch.readings[0].fields if f.field == "regime"]
    assert (field.becomes, field.derive, field.derived_from) == ("fp32", None, ("tp_size",))
    assert field.note == f"by tp (derived from tp_size=2 from {launcher}: ll.tp)"
    assert launch.sources["regime"] == f"{trainer}: tt.fp32_under_tp (derived from tp_size=2 from {launcher}: ll.tp)"
    assert field.to_dict()["derived_from"] == ["tp_size"]
    none = from_launch([trainer, files("l4.yaml", {"ll": {"tp": 4}})], gpus=8, registry=pm.registry)
    assert "regime" not in none.scenario.profile_options and "regime" not in none.sources
