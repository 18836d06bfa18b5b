"""The command line: every subcommand, flags, JSON, and errors with exit codes."""

import io
import json
import subprocess
import sys

import pytest

from mlsysim_core.cli import main


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def test_bare_command_runs_the_default_estimate():
    code, text = run()
    assert code == 0
    assert "Llama-3.1-8B on NVIDIA H100" in text
    assert "GB (1e9 B)" in text and "GiB (2^30 B)" in text
    # the measured profile by default (fp16 means autocast), its peak phase named...
    assert "(profile: measured; total = the backward phase, the iteration's peak)" in text
    assert "regime amp-fp16" in text and "runtime overheads" in text
    # ... and the reference profile's total beside it. Llama-3.1-8B (curated: 8,030,261,248
    # parameters), batch 8, seq 2048, fp16 adam selective: 16.061+16.061+96.363+73.014+0.803 GB
    assert "reference profile total: 202.302 GB (188.408 GiB), does not fit" in text
    code, text = run("estimate", "--profile", "reference")
    assert "202.302" in text and "NO, 116.402 GB" in text and "235.5 %" in text
    assert "reference profile total" not in text and "runtime overheads" not in text


def test_estimate_flags_match_python(solver):
    code, text = run("estimate", "--model", "mlsysim:llama3-8b", "--hardware", "mlsysim:h100", "--batch-size", "8",
                     "--seq-len", "1024", "--json", "--profile", "reference")
    assert code == 0
    data = json.loads(text)
    assert data["total_memory"] == solver.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024).total_memory
    assert data["gb"]["total_memory"] == pytest.approx(165.790222016)
    assert data["units"] == {"memory": "bytes", "gb": 1e9, "gib": 2**30}
    assert {t["source"] for t in data["terms"]} >= {"model_states", "adam", "selective_checkpointing"}


def test_every_solve_option_is_a_flag(solver):
    code, text = run("estimate", "-m", "mixtral-8x7b", "-g", "h200", "-b", "64", "-s", "4096",
                     "--precision", "bf16", "--optimizer", "sgd", "--checkpointing", "full",
                     "--tp", "2", "--pp", "4", "--dp", "4", "--ep", "8", "--zero-stage", "2",
                     "--grad-accum", "2", "--trainable-fraction", "0.5",
                     "--comm-buffer-fraction", "0.1", "--no-sequence-parallel", "--json", "--profile", "reference")
    assert code == 0
    expected = solver.solve("mixtral-8x7b", "h200", 64, 4096, "bf16", "sgd", "full", 2, 4, 4, 8, 2, 2,
                            0.5, 0.1, sequence_parallel=False)
    assert json.loads(text)["total_memory"] == expected.total_memory


def test_explain_shows_plugins_and_formulas():
    code, text = run("estimate", "--explain", "--zero-stage", "3", "--dp", "8", "--profile", "reference")
    assert code == 0
    assert "[plugin adam (mlsysim-core" in text
    assert "/ 8 (optimizer state sharded: zero3)" in text
    assert "note         ZeRO-3: data-parallel state sharding applied across 8 ranks." in text


@pytest.mark.parametrize("argv,fragment", [
    (["estimate", "--optimizer", "lamb"], "optimizer='lamb' is not allowed"),
    (["estimate", "--model", "gpt5"], "model='gpt5' is not allowed"),
    (["estimate", "--tp", "0"], "tp_size=0"),
    (["estimate", "--option", "rank=3"], "--option='rank=3'"),
    (["estimate", "--option", "adam.lr=3"], "plugin_options['adam']"),
    (["estimate", "--rule", "tp"], "--rule='tp'"),
    (["estimate", "--model", "/nonexistent/model.json"], "--model='/nonexistent/model.json'"),
])
def test_errors_exit_2_with_one_line(capsys, argv, fragment):
    code, _ = run(*argv)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("mlsysim-core: error: ") and fragment in err
    assert "Traceback" not in err


def test_custom_model_and_hardware_files(tmp_path, solver):
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"name": "tiny", "parameters": 1_000_000, "layers": 2,
                                 "hidden_dim": 64, "heads": 4}))
    gpu = tmp_path / "gpu.json"
    gpu.write_text(json.dumps({"name": "toy", "memory_capacity": 2**30}))
    code, text = run("estimate", "--model", str(model), "--hardware", str(gpu), "--json", "--profile", "reference")
    assert code == 0
    data = json.loads(text)
    assert data["model"] == "tiny" and data["available_memory"] == 2**30
    assert data["weights"] == 2_000_000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"name": "x", "parameters": 5, "layers": 1, "colour": "red"}))
    code, _ = run("estimate", "--model", str(bad))
    assert code == 2


def test_plugins_listing():
    code, text = run("plugins", "--json")
    data = json.loads(text)
    by_name = {p["name"]: p for p in data["plugins"]}
    assert by_name["adam"]["distribution"] == "mlsysim-core"
    assert by_name["adam"]["provides"] == {"optimizer": ["adam"]}
    assert by_name["zero"]["provides"] == {"sharding rule": ["zero0", "zero1", "zero2", "zero3"]}
    assert by_name["model_states"]["hooks"] == ["mlsysim_gradient_terms", "mlsysim_weight_terms"]
    code, text = run("plugins")
    assert code == 0 and "selective_checkpointing" in text and "mlsysim-core 0.1.0" in text


def test_disable_plugin_flag():
    code, text = run("--disable-plugin", "sgd", "plugins", "--json")
    data = json.loads(text)
    assert "sgd" not in {p["name"] for p in data["plugins"]} and data["blocked"] == ["sgd"]
    code, _ = run("--disable-plugin", "sgd", "estimate", "--optimizer", "sgd")
    assert code == 2


def test_models_and_hardware_listings():
    code, text = run("models", "--json")
    models = {m["key"]: m for m in json.loads(text)["models"]}
    assert models["mlsysim:llama3-8b"]["parameters"] == 8_030_000_000
    assert models["mlsysim:llama3-8b"]["origin"] == "reference"
    assert "llama3-8b" in models["meta-llama/llama-3.1-8b"]["aliases"]
    assert models["mlsysim:mixtral-8x7b"]["experts"] == 8
    code, text = run("hardware", "--json")
    hardware = {h["key"]: h for h in json.loads(text)["hardware"]}
    assert hardware["mlsysim:h100"]["memory_capacity"] == 80 * 2**30
    assert "h100" in hardware["nvidia/h100-sxm5-80gb"]["aliases"]
    code, text = run("hardware")
    assert "85.899" in text and "80.00" in text


@pytest.mark.long     # (a subprocess check)
def test_module_and_console_script_entry_points():
    proc = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--json", "-s", "1024",
                           "--profile", "reference"],
                          capture_output=True, text=True, check=True)
    # the default model, curated Llama-3.1-8B (8,030,261,248 parameters), at seq 1024
    assert json.loads(proc.stdout)["gb"]["total_memory"] == pytest.approx(165.7944281088)
    proc = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--precision", "fp6"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and "precision='fp6'" in proc.stderr


def test_fit_commands(solver):
    code, text = run("fit", "batch", "--dp", "8", "--zero-stage", "3", "--profile", "reference")
    assert code == 0
    header, run_line, answer = text.splitlines()[:3]
    assert header.endswith("(profile: reference)") and run_line.startswith("micro-batch 7, fp16, optimizer adam")
    assert "tp=1 pp=1 dp=8 ep=1, dp rule zero3, global batch 56 = micro-batch 7 x dp 8" in run_line
    assert answer.startswith("largest micro-batch: 7, global batch 56") and "bound by activations" in text
    code, text = run("fit", "seq", "-b", "8", "--dp", "8", "--zero", "3", "--multiple-of", "1024", "--json")
    data = json.loads(text)
    assert data["value"] % 1024 == 0 and data["binding"] == "activations"
    assert data["result"]["feasible"] and not data["limit"]["feasible"]
    code, text = run("fit", "devices", "-m", "llama3-70b", "-b", "512", "-s", "4096", "--tp", "8", "--pp", "4",
                     "--zero", "1", "--grad-accum", "8", "--profile", "reference")
    assert text.splitlines()[2].startswith("fewest devices: 128, dp 4, tp 8, pp 4")


@pytest.mark.long     # two whole searches (about 4 s of the quick suite)
def test_search_command():
    code, text = run("search", "-n", "16", "--global-batch", "32", "--rows", "1", "--no-progress")
    assert code == 0 and "on the Pareto front" in text and "... " in text
    code, text = run("search", "-n", "16", "--global-batch", "32", "--json", "--no-progress")
    data = json.loads(text)
    assert data["candidates"] >= len(data["fits"]) > 0 and all(p["pareto"] for p in data["pareto"])
    code, _ = run("search", "-n", "0", "--global-batch", "32")
    assert code == 2


def test_estimate_measured_profile_flags_match_python():
    from mlsysim_core import TrainingMemoryModel
    code, text = run("estimate", "-m", "llama3-8b", "-b", "2", "-s", "1024", "--regime", "bf16",
                     "--optimizer-impl", "fused", "--attention", "eager", "--dropout", "0.1",
                     "--checkpointing", "full", "--checkpointed-layers", "8", "--no-runtime-overheads", "--json")
    assert code == 0
    data = json.loads(text)
    expected = TrainingMemoryModel("measured").solve(
        "llama3-8b", "h100", 2, 1024, activation_checkpointing="full", regime="bf16", optimizer_impl="fused",
        attention="eager", dropout=0.1, checkpointed_layers=8, runtime_overheads=False)
    assert data["total_memory"] == expected.total_memory and data["details"]["regime"] == "bf16"
    assert data["runtime_overheads"] == 0 and data["profile"] == "measured"


@pytest.mark.long     # (a subprocess check)
def test_estimate_refuses_a_run_the_measured_profile_cannot_describe(tmp_path):
    model = tmp_path / "opaque.json"
    model.write_text(json.dumps({"name": "opaque", "parameters": 7_000_000_000, "layers": 32}))
    for profile, hint in (((), True), (("--profile", "measured"), False)):    # the default and the named one
        proc = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--model", str(model), *profile],
                              capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stdout == "" and "model.hidden_dim=None" in proc.stderr
        assert ("--profile reference gives the textbook estimate" in proc.stderr) == hint
    code, text = run("estimate", "--model", str(model), "--profile", "reference")
    assert code == 0 and "(profile: reference)" in text


def test_time_takes_plugin_options_as_time_plan_does():
    from mlsysim_core import search
    code, text = run("time", "-m", "llama3-8b", "-b", "64", "-s", "8192", "--tp", "2", "--cp", "2", "--dp", "2",
                     "--data-parallel", "zero1", "--option", "cp.ring=transformer-engine", "--json")
    assert code == 0
    expected = search.time_plan("llama3-8b", "h100", global_batch=64, seq_len=8192, tp=2, cp=2, dp=2,
                                data_parallel="zero1", microbatch=32, profile="measured",
                                plugin_options={"cp": {"ring": "transformer-engine"}})
    default = search.time_plan("llama3-8b", "h100", global_batch=64, seq_len=8192, tp=2, cp=2, dp=2,
                               data_parallel="zero1", microbatch=32, profile="measured")
    assert json.loads(text)["step_s"] == expected["step_s"] != default["step_s"]


def test_a_bad_option_value_is_named_in_plain_words(capsys):
    code, _ = run("time", "--option", "cp.ring=nope")
    text = capsys.readouterr().err
    assert code == 2
    assert ("plugin_options['cp']={'ring': 'nope'} is not allowed: fields of ContextParallelOptions (ring: str) "
            "('ring' must be in ('pytorch', 'transformer-engine') (got 'nope') @ cp)") in text
    assert "Attribute(" not in text
