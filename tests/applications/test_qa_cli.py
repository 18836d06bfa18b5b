"""QA findings on the command line and scenario files (issue 13's classes, instances a
tester found after it): closed or full streams, undecodable and oversized scenario
input, headers that name every rule and plugin that changed the numbers, sweeps honest
about sampling, flags that do nothing refused, and errors that name where a value came
from (the scenario's field, a blocked plugin)."""

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.cli import main
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_core.render import describe_run
from mlsysim_core.scenario import Scenario

from clitools import error_of, run




def command() -> list[str]:
    """The installed `mlsysim-core` command (next to this interpreter), else `-m`."""
    exe = Path(sys.executable).parent / "mlsysim-core"
    found = str(exe) if exe.exists() else shutil.which("mlsysim-core")
    return [found] if found else [sys.executable, "-m", "mlsysim_core"]


def shell(redirect: str, *argv, env=None):
    """Run the installed command through sh with a redirection such as ``>&-``."""
    cmd = " ".join(f"'{a}'" for a in (*command(), *argv)) + " " + redirect
    return subprocess.run(["sh", "-c", cmd], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


BASE = {"model": "llama3-8b", "hardware": "h100", "batch_size": 8}


def write(tmp_path, name, data) -> str:
    path = tmp_path / name
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")
    return str(path)


# --- 1. closed or full standard streams -------------------------------------------------------
# (each runs the installed command in a subprocess, about a second each: long tests, `pytest --long`, .ci/run)

@pytest.mark.long
def test_closed_stdout_is_one_line_and_exit_2():
    proc = shell(">&-", "estimate")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "mlsysim-core: error: standard output is closed: there is nowhere to write the output"]


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.long
@pytest.mark.parametrize("argv", [("estimate",), ("estimate", "--json"), ("plugins",), ("models",),
                                  ("hardware", "--json")])
def test_full_stdout_is_one_line_and_exit_2(argv):
    proc = shell("> /dev/full", *argv)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "mlsysim-core: error: writing the output failed: No space left on device"]


@pytest.mark.long
def test_closed_stderr_keeps_exit_code_2():
    assert shell("2>&-", "estimate", "-b", "0").returncode == 2


@pytest.mark.long
@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_stderr_keeps_exit_code_2():
    assert shell("2> /dev/full", "estimate", "-b", "0").returncode == 2


@pytest.mark.long
def test_broken_pipe_stays_exit_0():
    proc = subprocess.Popen([*command(), "models"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.read(10)
    proc.stdout.close()     # the reader leaves, as `| head` does
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0 and "Traceback" not in err


# --- 2. and 3. scenario files and the Scenario API ------------------------------------------------

@pytest.mark.parametrize("suffix", [".json", ".toml"])
def test_scenario_not_utf8_names_the_scenario(tmp_path, suffix, capsys):
    path = write(tmp_path, "bad" + suffix, bytes(range(256)))
    with pytest.raises(InvalidInputError) as info:
        Scenario.load(path)
    assert info.value.parameter == "scenario" and "UTF-8" in str(info.value)
    code, err = error_of(capsys, "estimate", "--scenario", path)
    assert code == 2 and err.startswith(f"mlsysim-core: error: scenario={path!r}")


@pytest.mark.parametrize("suffix,text", [
    (".json", json.dumps(BASE)[:-1] + ', "seq_len": ' + "9" * 5000 + "}"),
    (".toml", 'model = "llama3-8b"\nhardware = "h100"\nbatch_size = 8\nseq_len = ' + "9" * 5000 + "\n")])
def test_scenario_with_a_5000_digit_number(tmp_path, suffix, text, capsys):
    path = write(tmp_path, "huge" + suffix, text)
    with pytest.raises(InvalidInputError) as info:
        Scenario.load(path)
    assert info.value.parameter == "scenario" and "4300 digits" in str(info.value)
    code, err = error_of(capsys, "estimate", "--scenario", path)
    assert code == 2 and "scenario=" in err and "4300 digits" in err


def test_model_file_with_a_5000_digit_number(tmp_path, capsys):
    path = write(tmp_path, "m.json", '{"parameters": ' + "9" * 5000 + "}")
    code, err = error_of(capsys, "estimate", "-m", path)
    assert code == 2 and err.startswith("mlsysim-core: error: --model=") and "4300 digits" in err


def test_option_with_a_5000_digit_number(capsys):
    code, err = error_of(capsys, "estimate", "--option", "demo.x=" + "9" * 5000)
    assert code == 2 and err.startswith("mlsysim-core: error: --option=")


def test_scenario_api_errors_name_the_argument(tmp_path):
    scenario = Scenario.from_dict(dict(BASE))
    with pytest.raises(InvalidInputTypeError) as info:
        Scenario.load(None)
    assert info.value.parameter == "scenario"
    with pytest.raises(InvalidInputError) as info:
        scenario.dump(tmp_path / "missing" / "x.json")
    assert info.value.parameter == "path" and "does not exist" in str(info.value)
    with pytest.raises(InvalidInputError) as info:
        scenario.dump(tmp_path)
    assert info.value.parameter == "path" and "directory" in str(info.value)
    with pytest.raises(InvalidInputTypeError) as info:
        scenario.dump(None)
    assert info.value.parameter == "path"
    for bad in (5, 0, "measured"):
        with pytest.raises(InvalidInputTypeError) as info:
            scenario.solve(bad)
        assert info.value.parameter == "model" and "TrainingMemoryModel" in str(info.value)
    assert scenario.solve(TrainingMemoryModel()).total_memory > 0


# --- 4. and 5. the header and JSON name every rule and included plugin ------------------------------

def test_cp_rule_is_in_the_header_and_json():
    code, plain = run("estimate", "--cp", "2", "--no-chart")
    code, text = run("estimate", "--rule", "cp=cp-ulysses", "--cp", "2", "--no-chart")
    assert code == 0 and "sharding rule cp=cp-ulysses" in text and "sharding rule" not in plain
    code, text = run("estimate", "--rule", "cp=cp-ulysses", "--cp", "2", "--json")
    assert json.loads(text)["run"]["sharding_rules"] == {"cp": "cp-ulysses"}


def test_rule_help_and_errors_list_the_real_axes(capsys):
    code, err = error_of(capsys, "estimate", "--rule", "x")
    assert code == 2 and "--rule='x'" in err and "tp, cp, pp, ep" in err
    code, err = error_of(capsys, "estimate", "--rule", "dp=zero1")
    assert code == 2 and "--rule='dp=zero1'" in err and "--data-parallel" in err
    with pytest.raises(SystemExit):
        main(["estimate", "--help"], out=io.StringIO())
    assert "tp, cp, pp or ep" in " ".join(capsys.readouterr().out.split())


def test_included_plugins_are_in_the_run_details():
    scenario = Scenario.from_dict({**BASE, "include_plugins": ["myorg_extra"]})
    run_details = scenario.run_details()
    assert run_details["include_plugins"] == ["myorg_extra"]
    assert "included plugins myorg_extra" in describe_run(run_details)
    assert "include_plugins" not in Scenario.from_dict(dict(BASE)).run_details()


# --- 6. integral floats are read as whole numbers ----------------------------------------------------

def test_integral_floats_are_normalised(tmp_path):
    path = write(tmp_path, "f.json", {**BASE, "pp_size": 2.0, "stage_layers": [16.0, 16.0], "virtual_stages": 2.0,
                                      "pipeline_schedule": "interleaved-1f1b", "seq_len": 2048.0, "dp_size": 1.0})
    code, text = run("estimate", "--scenario", path, "--no-chart")
    assert code == 0
    assert "with 2 virtual stages, stage layers 16,16" in text and ", seq 2048" in text
    assert "16.0,16.0" not in text and "2.0 virtual" not in text and "2048.0" not in text
    scenario = Scenario.load(path)
    assert scenario.stage_layers == [16, 16] and type(scenario.virtual_stages) is int
    assert Scenario.from_dict({**BASE, "tp_size": 1.5}).tp_size == 1.5     # solve() names it


# --- 7. and 8. plots ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def mpl():
    return pytest.importorskip("matplotlib")


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_sweep_says_the_exact_largest_as_fit_does(mpl, tmp_path):
    code, fit = run("fit", "batch", "--dp", "8", "--zero", "3", "--json")
    exact = json.loads(fit)["value"]
    code, text = run("plot", "sweep", "-o", str(tmp_path / "s.png"), "--dp", "8", "--zero", "3")
    assert code == 0
    assert (f"largest of the values drawn that fits: 2 (`mlsysim-core fit batch` finds the exact largest: {exact})"
            in text) and exact == 3
    code, fit = run("fit", "seq", "-b", "8", "--dp", "8", "--zero", "3", "--json")
    exact = json.loads(fit)["value"]
    code, text = run("plot", "sweep", "--sweep", "seq", "-o", str(tmp_path / "q.png"), "-b", "8", "--dp", "8",
                     "--zero", "3", "--values", "1024,2048,4096,8192")
    assert code == 0 and f"finds the exact largest: {exact:,})" in text


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_vary_profile_defaults_to_both_profiles(mpl, tmp_path, capsys):
    code, text = run("plot", "bars", "--vary", "profile", "-o", str(tmp_path / "p.png"))
    assert code == 0 and "profiles reference, measured" in text
    code, err = error_of(capsys, "plot", "bars", "--vary", "hardware", "-o", str(tmp_path / "h.png"))
    assert code == 2 and "--values=None" in err and "e.g. h100,a100" in err


# --- 9. flags that would do nothing --------------------------------------------------------------

def test_empty_scenario_name_is_an_error(capsys):
    code, err = error_of(capsys, "estimate", "--scenario", "")
    assert code == 2 and err.startswith("mlsysim-core: error: --scenario=''")


def test_sweep_only_with_plot_sweep(mpl, tmp_path, capsys):
    code, err = error_of(capsys, "plot", "bars", "--sweep", "seq", "-o", str(tmp_path / "b.png"))
    assert code == 2 and err.startswith("mlsysim-core: error: --sweep='seq'") and "plot sweep" in err


def test_multiple_of_only_with_fit_seq(capsys):
    code, err = error_of(capsys, "fit", "batch", "--multiple-of", "128")
    assert code == 2 and err.startswith("mlsysim-core: error: --multiple-of=128") and "fit seq" in err
    code, err = error_of(capsys, "fit", "seq", "--multiple-of", "0")
    assert code == 2 and err.startswith("mlsysim-core: error: --multiple-of=0")


# --- 10. a name only a blocked plugin provides -------------------------------------------------------

@pytest.mark.parametrize("blocked,argv,parameter", [
    ("adam", (), "optimizer='adam'"),
    ("zero", (), "zero_stage='zero0'"),
    ("context_parallel", ("--cp", "2"), "sharding_rules['cp']='cp'"),
    ("full_checkpointing", ("--checkpointing", "full"), "activation_checkpointing='full'")])
def test_blocked_provider_is_named(monkeypatch, capsys, blocked, argv, parameter):
    monkeypatch.setenv("MLSYSIM_DISABLED_PLUGINS", blocked)
    code, err = error_of(capsys, "estimate", *argv)
    assert code == 2 and parameter in err
    assert f"the plugin '{blocked}' that provides it is blocked by MLSYSIM_DISABLED_PLUGINS / --disable-plugin" in err


def test_unrelated_error_does_not_blame_a_blocked_plugin(capsys):
    code, err = error_of(capsys, "--disable-plugin", "sgd", "estimate", "--optimizer", "nosuch")
    assert code == 2 and "optimizer='nosuch'" in err and "blocked" not in err


# --- 11. a model or hardware name from the scenario is named as the scenario's field ---------------

@pytest.mark.parametrize("field,flag", [("model", "-m"), ("hardware", "-g")])
def test_empty_name_from_scenario_or_flag(tmp_path, capsys, field, flag):
    path = write(tmp_path, "s.json", {**BASE, field: ""})
    code, err = error_of(capsys, "estimate", "--scenario", path)
    assert code == 2 and err.startswith(f"mlsysim-core: error: {field}=''") and path in err
    code, err = error_of(capsys, "estimate", flag, "")
    assert code == 2 and err.startswith(f"mlsysim-core: error: --{field}=''")
    code, err = error_of(capsys, "estimate", "--scenario", write(tmp_path, "t.json", dict(BASE)), flag, "")
    assert code == 2 and err.startswith(f"mlsysim-core: error: --{field}=''")


# --- 12. fit refuses the flag of the value it searches ------------------------------------------

@pytest.mark.parametrize("argv,flag", [
    (("fit", "batch", "-b", "0"), "--batch-size=0"), (("fit", "batch", "-b", "64"), "--batch-size=64"),
    (("fit", "seq", "-s", "0"), "--seq-len=0"), (("fit", "seq", "-s", "4096"), "--seq-len=4096"),
    (("fit", "devices", "--dp", "2"), "--dp-size=2")])
def test_fit_refuses_the_searched_flag(capsys, argv, flag):
    code, err = error_of(capsys, *argv)
    assert code == 2 and err.startswith(f"mlsysim-core: error: {flag} is not allowed: not given")


def test_fit_seq_searches_sequences_cp_divides():
    code, text = run("fit", "seq", "--cp", "3", "--dp", "8", "--zero", "3", "--json")
    assert code == 0
    data = json.loads(text)
    assert data["multiple_of"] == 3 and data["value"] % 3 == 0 and data["run"]["seq_len"] == data["value"]
    code, text = run("fit", "seq", "--cp", "3", "--multiple-of", "128", "--dp", "8", "--zero", "3", "--json")
    data = json.loads(text)
    assert code == 0 and data["multiple_of"] == 384 and data["value"] % 384 == 0
    code, text = run("fit", "seq", "--cp", "3", "--dp", "8", "--zero", "3")
    assert "multiples of 3" in text
