"""QA findings on the command line, third round: catalog errors without tracebacks, one
profile per picture, sweeps that never trip over their own defaults, headers and notes
that `fit` and the plots share with `estimate`, scenarios that keep their files, and
repeated flags refused."""

import json
from pathlib import Path

import pytest


from clitools import error_of, run


@pytest.fixture
def user_catalog(tmp_path, monkeypatch):
    directory = tmp_path / "catalog"
    directory.mkdir()
    monkeypatch.setenv("MLSYSIM_CATALOG_DIR", str(directory))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return directory


# 1. a malformed user catalog: exit 2, one line, no AttributeError from _attributed

def test_catalog_error_without_a_key_is_one_line(capsys, user_catalog):
    (user_catalog / "a.json").write_text(json.dumps(
        {"schema": 1, "models": [{"key": "", "parameters": 1000000000, "layers": 2}]}))
    code, err = error_of(capsys, "models")
    assert code == 2
    assert len(err.splitlines()) == 1 and "a.json" in err and "'key'" in err


def test_catalog_name_collision_in_estimate_is_one_line(capsys, user_catalog):
    row = {"key": "qa-dup", "parameters": 1000000000, "layers": 2}
    (user_catalog / "a.json").write_text(json.dumps({"schema": 1, "models": [row, row]}))
    code, err = error_of(capsys, "estimate", "-m", "qa-dup")
    assert code == 2
    assert len(err.splitlines()) == 1 and "qa-dup" in err


@pytest.fixture(scope="module")
def mpl():
    return pytest.importorskip("matplotlib")


@pytest.fixture()
def drawn(monkeypatch, mpl):
    """Run `plot` for real, keeping the results and figures instead of writing the files."""
    from mlsysim_core import plots
    record = {"results": [], "labels": None, "figures": []}
    real_bars, real_sweep = plots.plot_bars, plots.plot_sweep

    def bars(results, labels=None, **kw):
        record["results"], record["labels"] = list(results), labels
        record["figures"].append(real_bars(results, labels, **kw))
        return record["figures"][-1]

    def sweep(data, **kw):
        record["results"] = list(data.results)
        record["figures"].append(real_sweep(data, **kw))
        return record["figures"][-1]

    monkeypatch.setattr(plots, "plot_bars", bars)
    monkeypatch.setattr(plots, "plot_sweep", sweep)
    monkeypatch.setattr(plots, "save", lambda fig, path, **kw: Path(path))
    return record


# 2. --vary profile: a value the measured profile cannot describe is never drawn as "measured"

def test_vary_profile_leaves_out_a_measured_bar_it_cannot_describe(tmp_path, drawn):
    code, text = run("plot", "bars", "--vary", "profile", "--lora-rank", "8", "--tp", "2",
                     "-o", str(tmp_path / "p.png"))
    assert code == 0, text
    assert [r.profile for r in drawn["results"]] == ["reference"] and drawn["labels"] == ["profile=reference"]
    assert "note: profile=measured is left out: the measured profile cannot describe this run" in text
    assert "note: profile reference, because" not in text      # no fallback note contradicted by a bar
    assert "LoRA stands in as trainable fraction" in text and text.splitlines()[-1].endswith("(profile reference)")


@pytest.mark.parametrize("flags", [["--precision", "int8"], ["--comm-buffer-fraction", "0.5"]])
def test_vary_profile_draws_the_reference_bar_alone(tmp_path, drawn, flags):
    code, text = run("plot", "bars", "--vary", "profile", *flags, "-o", str(tmp_path / "p.png"))
    assert code == 0, text
    assert [r.profile for r in drawn["results"]] == ["reference"]
    assert "profile=measured is left out" in text


def test_vary_profile_qlora_says_the_quantization_is_left_out(tmp_path, drawn):
    code, text = run("plot", "bars", "--vary", "profile", "--lora-rank", "8", "--quantization", "nf4",
                     "-o", str(tmp_path / "p.png"))
    assert code == 0, text
    assert "QLoRA stands in as trainable fraction" in text and "nf4 quantization left out" in text
    assert [r.profile for r in drawn["results"]] == ["reference", "measured"]


def test_vary_profile_refuses_when_no_profile_can_describe(capsys, tmp_path, mpl):
    code, err = error_of(capsys, "plot", "bars", "--vary", "profile", "--values", "measured", "--precision", "int8",
                         "-o", str(tmp_path / "p.png"))
    assert code == 2 and "--values='measured'" in err


# 3. one picture, one profile: a value the measured profile cannot describe refuses the picture

@pytest.mark.parametrize("argv, failing", [
    (["--vary", "tp_size", "--values", "1,2", "--lora-rank", "8"], "regime="),
    (["--vary", "precision", "--values", "fp32,bf16,int8"], "precision='int8'")])
def test_vary_refuses_when_one_value_is_not_modelled(capsys, tmp_path, drawn, argv, failing):
    code, err = error_of(capsys, "plot", "bars", *argv, "-o", str(tmp_path / "p.png"))
    assert code == 2 and not (tmp_path / "p.png").exists() and not drawn.get("results")
    assert err.startswith(f"mlsysim-core: error: {failing}") and "--profile reference" in err


def test_vary_keeps_the_measured_profile_when_every_value_fits_it(tmp_path, drawn):
    code, text = run("plot", "bars", "--vary", "precision", "--values", "fp32,bf16", "-o", str(tmp_path / "p.png"))
    assert code == 0 and {r.profile for r in drawn["results"]} == {"measured"} and "note: profile" not in text


# 4. sweep defaults past the model's context length are left out (and said); --values named

def test_sweep_seq_leaves_default_values_past_the_context_out(tmp_path, drawn):
    code, text = run("plot", "sweep", "--sweep", "seq", "-m", "gpt2", "-b", "1", "-o", str(tmp_path / "s.png"))
    assert code == 0, text
    assert "note: the default sequence lengths 2,048, 4,096" in text and "left out" in text
    assert len(drawn["results"]) == 2 and "sequence length: 512 fits" in text and "2,048" not in text.split("\n")[1]


def test_sweep_seq_values_past_the_context_name_values(capsys, tmp_path, mpl):
    code, err = error_of(capsys, "plot", "sweep", "--sweep", "seq", "-m", "gpt2", "-b", "1", "--values",
                         "512,2048", "-o", str(tmp_path / "s.png"))
    assert code == 2 and err.startswith("mlsysim-core: error: --values='512,2048'") and "1,024" in err


# 5. the fit header names the layout, the dp rule, the optimizer and the checkpointing; so does the sweep

def test_fit_header_names_the_plan():
    code, text = run("fit", "batch", "--tp", "2", "--pp", "2", "--dp", "2", "--zero-stage", "1")
    assert code == 0, text
    plan = text.splitlines()[1]
    for fragment in ("micro-batch ", "optimizer adam", "checkpointing selective", "tp=2 pp=2 dp=2 ep=1",
                     "dp rule zero1", "global batch"):
        assert fragment in plan, (fragment, plan)


def test_sweep_subtitle_names_the_layout(tmp_path, drawn):
    code, text = run("plot", "sweep", "--dp", "2", "--values", "1,2", "-o", str(tmp_path / "s.png"))
    assert code == 0, text
    title = drawn["figures"][0].axes[0].get_title()
    assert "dp=2" in title and "dp rule" in title


# 6. the result's notes: fit (text and JSON) and the plots print them, as estimate does

def test_fit_prints_the_result_notes():
    code, text = run("fit", "batch", "-m", "mlsysim:llama3-8b", "--profile", "reference")
    assert code == 0
    assert "note         model: mlsysim:llama3-8b is" in text
    code, text = run("fit", "batch", "-m", "mlsysim:llama3-8b", "--profile", "reference", "--json")
    data = json.loads(text)
    assert any("mlsysim:llama3-8b" in n for n in (data["result"] or data["limit"])["notes"])


@pytest.mark.parametrize("kind", ["bars", "timeline", "sweep"])
def test_plots_print_the_result_notes(tmp_path, drawn, kind):
    argv = ["plot", kind, "-m", "mlsysim:llama3-8b", "--profile", "reference", "-o", str(tmp_path / "p.png")]
    code, text = run(*argv, *(["--values", "1,2"] if kind == "sweep" else []))
    assert code == 0, text
    assert "note         model: mlsysim:llama3-8b is" in text


# 8. a sweep refuses the flag of the value it draws

@pytest.mark.parametrize("argv, flag", [(["--sweep", "batch", "-b", "16"], "--batch-size=16"),
                                        (["--sweep", "seq", "-s", "4096"], "--seq-len=4096")])
def test_sweep_refuses_the_swept_flag(capsys, tmp_path, mpl, argv, flag):
    code, err = error_of(capsys, "plot", "sweep", *argv, "-o", str(tmp_path / "s.png"))
    assert code == 2 and flag in err and len(err.splitlines()) == 1


# 9. duplicates refused; numbers parsed as numbers

@pytest.mark.parametrize("values", ["measured,measured", "reference, Reference"])
def test_vary_values_twice_refused(capsys, tmp_path, mpl, values):
    code, err = error_of(capsys, "plot", "bars", "--vary", "profile", "--values", values, "-o", str(tmp_path / "p.png"))
    assert code == 2 and "--values=" in err and "each value once" in err


@pytest.mark.parametrize("bad", ["inf", "nan", "-inf"])
def test_vary_non_finite_numbers_refused_naming_the_field(capsys, tmp_path, mpl, bad):
    code, err = error_of(capsys, "plot", "bars", "--vary", "trainable_fraction", "--values", f"0.5,{bad}",
                         "-o", str(tmp_path / "p.png"))
    assert code == 2 and "trainable_fraction=" in err and "a finite number" in err and "got str" not in err


def test_sweep_values_twice_refused(capsys, tmp_path, mpl):
    code, err = error_of(capsys, "plot", "sweep", "--values", "1,2,2", "-o", str(tmp_path / "s.png"))
    assert code == 2 and "--values='1,2,2'" in err


# 7. a scenario's relative file paths: relative to the scenario's folder; saved absolute

MODEL = {"name": "qa-mine", "parameters": 1000000000, "layers": 8, "hidden_dim": 2048, "heads": 16,
         "vocab_size": 32000, "architecture": "llama"}
HARDWARE = {"name": "qa-hw", "memory_capacity": 80000000000}


def test_saved_scenario_keeps_its_files_from_another_folder(tmp_path, monkeypatch):
    work = tmp_path / "w"
    (work / "sub").mkdir(parents=True)
    (work / "mymodel.json").write_text(json.dumps(MODEL))
    (work / "myhw.json").write_text(json.dumps(HARDWARE))
    monkeypatch.chdir(work)
    code, first = run("estimate", "-m", "mymodel.json", "-g", "myhw.json", "-b", "2",
                      "--save-scenario", str(work / "sub" / "rel.json"))
    assert code == 0, first
    saved = json.loads((work / "sub" / "rel.json").read_text())
    assert saved["model"] == str(work / "mymodel.json") and saved["hardware"] == str(work / "myhw.json")
    monkeypatch.chdir(tmp_path)
    code, again = run("estimate", "--scenario", str(work / "sub" / "rel.json"))
    assert code == 0 and again == first


def test_relative_paths_in_a_scenario_are_read_from_its_folder(tmp_path, monkeypatch):
    from mlsysim_core.scenario import Scenario

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "m.json").write_text(json.dumps(MODEL))
    (tmp_path / "hw.json").write_text(json.dumps(HARDWARE))
    (tmp_path / "runs").mkdir()
    scenario = tmp_path / "runs" / "s.json"
    scenario.write_text(json.dumps({"model": "../models/m.json", "hardware": "../hw.json", "batch_size": 2}))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = Scenario.load(scenario)
    assert Path(loaded.model) == (tmp_path / "runs" / "../models/m.json").absolute()
    code, text = run("estimate", "--scenario", str(scenario))
    assert code == 0 and text.startswith("qa-mine on qa-hw")
    # catalog names stay names
    scenario.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 2}))
    assert (Scenario.load(scenario).model, Scenario.load(scenario).hardware) == ("llama3-8b", "h100")


# 9. repeated --option / --rule: the last would silently win

@pytest.mark.parametrize("argv, flag", [(["--option", "a.b=1", "--option", "a.b=2"], "--option='a.b=2'"),
                                        (["--rule", "cp=x", "--rule", "cp=y"], "--rule='cp=y'")])
def test_repeated_option_or_rule_refused(capsys, argv, flag):
    code, err = error_of(capsys, "estimate", *argv)
    assert code == 2 and err.startswith(f"mlsysim-core: error: {flag}") and "given twice" in err
