"""Property-based fuzz of the Python API, the CLI and the input files (issue 13, item 12).

Every generated case is a valid configuration, optionally with ONE field corrupted; the
generator records which field. The properties:

* nothing corrupted: the call returns a sane result (exit 0, valid JSON with the profile
  and the schema version, non-negative components that add up to the total, ``feasible``
  consistent with the total and the capacity);
* one field corrupted: the call raises the library's own error (``InvalidInputError``,
  exit 2) whose ``parameter`` names that field, never a traceback, never a result.

Case counts per default run (``MLSYSIM_FUZZ_SCALE`` multiplies them): 10,000 runs of the
CLI in process (``cli.main([...])``: 6,000 from flags, 2,000 scenario/model/hardware files,
2,000 Hugging Face configs), 6,000 Python API calls, and 200 runs of the installed
``mlsysim-core`` command in a subprocess; ``test_fuzz_ran_every_case`` checks the counts.
Examples are derandomized (the same cases every CI run) unless
``MLSYSIM_FUZZ_RANDOM=1``, which draws new ones (for hunting, not for CI).
"""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlsysim_core import cli
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.solver import TrainingMemoryModel

SCALE = float(os.environ.get("MLSYSIM_FUZZ_SCALE", "1"))
RANDOM = os.environ.get("MLSYSIM_FUZZ_RANDOM") == "1"
HF_DIR = Path(__file__).parent / "data" / "hf_configs"


RAN: dict[str, int] = {}     # kind -> cases run (hypothesis may stop early on a small space)


def _count(test: str) -> None:
    RAN[test] = RAN.get(test, 0) + 1


def _settings(examples: int):
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=None, derandomize=not RANDOM,
                    database=None, suppress_health_check=list(HealthCheck))


def _norm(name: str) -> str:
    return name.strip().lstrip("-").lower().replace("-", "_")


def names_field(parameter: str, accepted: tuple[str, ...]) -> bool:
    """Whether an error's ``parameter`` names one of the accepted fields: the field itself,
    or a dotted path through it (``lora.rank``, ``scenario x.json.batch_size``)."""
    p = _norm(parameter)
    parts = p.replace(" ", ".").split(".")
    for a in accepted:
        a = _norm(a)
        if p == a or a in parts or p.endswith("." + a) or p.startswith(a + ".") or ("." + a + ".") in p:
            return True
    return False


# --- valid configurations ---------------------------------------------------------------

MODELS = ("llama3-8b", "gpt2-small", "qwen/qwen2.5-0.5b", "mixtral-8x7b", "meta-llama/llama-3.2-1b")
HARDWARE = ("h100", "a100", "nvidia/l40s", "mi300x")


@st.composite
def valid_config(draw, default_is_measured: bool = True) -> dict:
    """A valid run, as solve keyword arguments (global batch divides exactly).
    ``profile`` None is the caller's default: measured for the CLI, reference in Python."""
    micro, dp, gas = draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((1, 2)))
    profile = draw(st.sampled_from((None, "reference", "measured")))
    config = {
        "model": draw(st.sampled_from(MODELS)), "hardware": draw(st.sampled_from(HARDWARE)),
        "batch_size": micro * dp * gas, "seq_len": draw(st.sampled_from((128, 512, 1024, 2048))),
        "precision": draw(st.sampled_from(("fp32", "bf16", "fp16"))),
        "optimizer": draw(st.sampled_from(("adam", "adamw", "sgd"))),
        "activation_checkpointing": draw(st.sampled_from(("none", "selective", "full"))),
        "tp_size": draw(st.sampled_from((1, 2))), "pp_size": draw(st.sampled_from((1, 2))), "dp_size": dp,
        "zero_stage": draw(st.sampled_from((0, 1, 2, 3))), "gradient_accumulation_steps": gas,
        "profile": profile,
    }
    if config["model"] == "gpt2-small":    # learned positions: no sequence past its 1,024-row table
        config["seq_len"] = min(config["seq_len"], 1024)
    if profile == "measured" or (profile is None and default_is_measured):
        if draw(st.booleans()):
            config["attention"] = draw(st.sampled_from(("sdpa", "eager")))
        if draw(st.booleans()):
            config["dropout"] = draw(st.sampled_from((0.0, 0.1)))
        if draw(st.booleans()):
            config["runtime_overheads"] = False
    return config


# --- corruptions: (field, accepted parameter names, bad values) --------------------------

NOT_A_COUNT = (0, -1, -1000)
API_GARBAGE = ([], {}, None, True, float("nan"), float("inf"), "x", 1.5, (1, 2), object())

API_CORRUPTIONS = {
    "batch_size": (("batch_size",), (*NOT_A_COUNT, *API_GARBAGE)),
    "seq_len": (("seq_len",), (*NOT_A_COUNT, *API_GARBAGE)),
    "precision": (("precision",), ("fp7", "", "FP 16", *API_GARBAGE)),
    "optimizer": (("optimizer",), ("adamx", "", *API_GARBAGE)),
    "activation_checkpointing": (("activation_checkpointing",), ("sometimes", *API_GARBAGE)),
    "tp_size": (("tp_size",), (*NOT_A_COUNT, *API_GARBAGE)),
    "pp_size": (("pp_size",), (*NOT_A_COUNT, 10_000, *API_GARBAGE)),
    "dp_size": (("dp_size",), (*NOT_A_COUNT, *API_GARBAGE)),
    "ep_size": (("ep_size",), (*NOT_A_COUNT, *API_GARBAGE)),
    "zero_stage": (("zero_stage",), (-1, 4, 7, *API_GARBAGE)),
    "gradient_accumulation_steps": (("gradient_accumulation_steps",), (*NOT_A_COUNT, *API_GARBAGE)),
    "trainable_fraction": (("trainable_fraction",), (-0.1, 1.5, float("nan"), "x", [], None, True)),
    "communication_buffer_fraction": (("communication_buffer_fraction",), (-0.1, 2.0, float("inf"), "x", {}, None)),
    "sequence_parallel": (("sequence_parallel",), ("yes", 1, [])),     # (None: the profile's default)
    "data_parallel": (("data_parallel",), ("zero9", [], {}, 3)),
    "profile": (("profile",), ("nope", [], {}, 3)),
    "cp_size": (("cp_size",), (*NOT_A_COUNT, *API_GARBAGE)),
    "model": (("model",), ("no-such-model", "", [], {}, 3, None)),
    "hardware": (("hardware",), ("no-such-gpu", "", [], {}, 3, None)),
}
# Measured-profile options: corrupted only where the run is measured.
MEASURED_CORRUPTIONS = {
    "regime": (("regime",), ("amp-fp7", [], {}, 3)),
    "attention": (("attention",), ("flashy", [], 3)),
    "dropout": (("dropout",), (-0.5, 1.5, float("nan"), "x", [])),
    "optimizer_impl": (("optimizer_impl",), ("turbo", [], 3)),
    "pipeline_schedule": (("pipeline_schedule",), ("2f2b", [], 3)),
    "offload": (("offload",), ("gpu", "optimizer=tape", 3, [3])),
    "moe_capacity_factor": (("moe_capacity_factor",), (0, -1.0, float("nan"), "x", [])),
    "runtime_overheads": (("runtime_overheads",), ({"cuda_context": -1e12}, {"bogus": 1}, "x", 3)),
    "lora": (("lora",), ({"rank": 0}, {"rank": 100_000}, {"rank": 8, "target_modules": ["nope_proj"]},
                         {"rank": 8, "quantization": "nf3"}, {"quantization": "nf4"}, "x", 3)),
}


@st.composite
def api_case(draw):
    config = draw(valid_config(default_is_measured=False))
    corrupted = None
    measured = config["profile"] == "measured"
    if draw(st.integers(0, 3)) > 0:   # three cases in four are corrupted
        table = dict(API_CORRUPTIONS)
        if measured:
            table.update(MEASURED_CORRUPTIONS)
        corrupted = draw(st.sampled_from(sorted(table)))
        accepted, values = table[corrupted]
        config[corrupted] = draw(st.sampled_from(values))
    if corrupted is None and measured and draw(st.integers(0, 3)) == 0:
        # a global batch that does not divide: refused under the measured profile
        divisor = config["dp_size"] * config["gradient_accumulation_steps"]
        if divisor > 1:
            config["batch_size"] += draw(st.integers(1, divisor - 1))
            corrupted = "batch_size"
    accepted = () if corrupted is None else {**API_CORRUPTIONS, **MEASURED_CORRUPTIONS}[corrupted][0]
    return config, corrupted, accepted


def check_sane(r, *, profile: str | None = None) -> None:
    assert r.profile == (profile or r.profile)
    assert math.isfinite(r.total_memory) and r.total_memory > 0
    components = (r.weights, r.gradients, r.optimizer_state, r.activations, r.communication_buffers,
                  r.runtime_overheads)
    assert all(math.isfinite(c) and c >= 0 for c in components), components
    assert sum(components) == pytest.approx(r.total_memory, rel=1e-9, abs=1.0)
    assert r.feasible == (r.total_memory <= r.available_memory) or r.ranks   # ranks: every rank fits
    assert r.memory_utilization == pytest.approx(r.total_memory / r.available_memory, rel=1e-9)


_SOLVERS: dict = {}


def _solver(profile):
    if profile not in _SOLVERS:
        _SOLVERS[profile] = TrainingMemoryModel() if profile is None else TrainingMemoryModel(profile)
    return _SOLVERS[profile]


def _run_api(config: dict):
    config = dict(config)
    model, hardware, batch = config.pop("model"), config.pop("hardware"), config.pop("batch_size")
    profile = config.pop("profile")
    if profile == "measured":         # the profile chosen by name, as users do
        return _solver("measured").solve(model, hardware, batch, **config)
    if profile is not None:           # a corrupted profile: passed to solve
        config["profile"] = profile
    return _solver(None).solve(model, hardware, batch, **config)


@_settings(6000)
@given(case=api_case())
def test_fuzz_python_api(case):
    _count("api")
    config, corrupted, accepted = case
    if corrupted is None:
        check_sane(_run_api(config))
        return
    with pytest.raises(InvalidInputError) as info:
        _run_api(config)
    assert names_field(info.value.parameter, accepted), (
        f"corrupted {corrupted}={config[corrupted]!r} but the error blames {info.value.parameter!r}: {info.value}")


# --- the CLI, in process ------------------------------------------------------------------

FLAG = {"model": "--model", "hardware": "--hardware", "batch_size": "--batch-size", "seq_len": "--seq-len",
        "precision": "--precision", "optimizer": "--optimizer", "activation_checkpointing": "--checkpointing",
        "tp_size": "--tp", "pp_size": "--pp", "dp_size": "--dp", "zero_stage": "--zero-stage",
        "gradient_accumulation_steps": "--grad-accum", "profile": "--profile", "attention": "--attention",
        "dropout": "--dropout"}

# field -> (accepted parameter names, bad command-line values)
CLI_CORRUPTIONS = {
    "batch_size": (("batch_size",), ("0", "-3")),
    "seq_len": (("seq_len",), ("0", "-1")),
    "precision": (("precision",), ("fp7", "FP 16", "")),
    "optimizer": (("optimizer",), ("adamx", "")),
    "activation_checkpointing": (("activation_checkpointing",), ("sometimes",)),
    "tp_size": (("tp_size",), ("0", "-2")),
    "pp_size": (("pp_size",), ("0", "10000")),
    "dp_size": (("dp_size",), ("0",)),
    "zero_stage": (("zero_stage",), ("4", "-1")),
    "gradient_accumulation_steps": (("gradient_accumulation_steps",), ("0",)),
    "profile": (("profile",), ("nope", "")),
    "model": (("model",), ("no-such-model", "missing/dir/", "missing.json")),
    "hardware": (("hardware",), ("no-such-gpu", "missing.json")),
    "attention": (("attention",), ("flashy",)),
    "dropout": (("dropout",), ("1.5", "-0.1", "nan")),
}
# Flags that only exist together with others, as whole argument lists.
CLI_EXTRA_CORRUPTIONS = {
    "trainable_fraction": (("trainable_fraction",), (["--trainable-fraction", "1.5"],
                                                     ["--trainable-fraction", "nan"])),
    "communication_buffer_fraction": (("communication_buffer_fraction",),
                                      (["--comm-buffer-fraction", "-0.5"],)),
    "cp_size": (("cp_size",), (["--cp", "0"],)),
    "regime": (("regime",), (["--regime", "amp-fp7"],)),
    "optimizer_impl": (("optimizer_impl",), (["--optimizer-impl", "turbo"],)),
    "pipeline_schedule": (("pipeline_schedule",), (["--pipeline-schedule", "2f2b"],)),
    "virtual_stages": (("virtual_stages",), (["--pp", "2", "--pipeline-schedule", "interleaved-1f1b",
                                              "--virtual-stages", "1000"],)),
    "offload": (("offload",), (["--offload", "gpu"], ["--offload", "optimizer=tape"])),
    "lora": (("lora", "lora_rank", "lora.rank", "quantization", "lora_targets", "target_modules",
              "double_quant"),
             (["--lora-rank", "0"], ["--lora-rank", "100000"], ["--quantization", "nf4"],
              ["--lora-targets", "q_proj"], ["--lora-rank", "8", "--lora-targets", "nope_proj"])),
    "moe_capacity_factor": (("moe_capacity_factor",), (["--moe-capacity-factor", "0"],
                                                       ["--moe-capacity-factor", "-1"])),
    "ep_size": (("ep_size",), (["--ep", "0"], ["--ep", "3"])),   # 3: not a divisor of 8 experts (measured)
    "stage_layers": (("stage_layers",), (["--pp", "2", "--stage-layers", "1,1"],)),
}


def cli_args(config: dict) -> list[str]:
    args = []
    for field, flag in FLAG.items():
        value = config.get(field)
        if value is not None:
            args += [flag, str(value)]
    if config.get("runtime_overheads") is False:
        args.append("--no-runtime-overheads")
    return args


@st.composite
def cli_case(draw):
    config = draw(valid_config())
    command = draw(st.sampled_from(("estimate", "estimate", "estimate", "fit")))
    corrupted, extra = None, []
    measured = config["profile"] != "reference"
    if draw(st.integers(0, 3)) > 0:
        table = {**{k: v for k, v in CLI_CORRUPTIONS.items() if (measured or k not in ("attention", "dropout"))
                    and not (command == "fit" and k == "batch_size")},   # fit batch searches it
                 **{k: v for k, v in CLI_EXTRA_CORRUPTIONS.items()
                    if measured or k in ("trainable_fraction", "communication_buffer_fraction", "cp_size",
                                         "ep_size")}}
        corrupted = draw(st.sampled_from(sorted(table)))
        accepted, values = table[corrupted]
        value = draw(st.sampled_from(values))
        if corrupted == "ep_size" and not measured:
            value = ["--ep", "0"]        # the reference profile keeps the reference's layout rules
        if isinstance(value, list):
            extra = value
            if corrupted in ("virtual_stages", "stage_layers"):
                config["pp_size"] = 2
                config["model"] = "gpt2-small"
                config["seq_len"] = min(config["seq_len"], 1024)    # (its 1,024 learned positions)
        else:
            config[corrupted] = value
    elif measured and command == "estimate" and draw(st.integers(0, 2)) == 0:
        divisor = config["dp_size"] * config["gradient_accumulation_steps"]
        if divisor > 1:
            config["batch_size"] += draw(st.integers(1, divisor - 1))
            corrupted, accepted = "batch_size", ("batch_size",)
    if corrupted == "ep_size":
        config["model"] = "mixtral-8x7b"
    if command == "fit":     # fit batch searches the batch: --batch-size is refused (test_qa_cli)
        config = {k: v for k, v in config.items() if k != "batch_size"}
    argv = [command] + (["batch"] if command == "fit" else []) + cli_args(config) + extra
    if command == "estimate" and draw(st.booleans()):
        argv.append("--explain")
    accepted = () if corrupted is None else {**CLI_CORRUPTIONS, **CLI_EXTRA_CORRUPTIONS}[corrupted][0]
    return argv, corrupted, accepted


def run_cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main([*argv, "--json", "--debug"], out=out)
    return code, out.getvalue()


def check_json_answer(text: str, command: str) -> None:
    data = json.loads(text)
    assert isinstance(data.get("schema_version"), int), "every JSON output names its schema_version"
    if command == "estimate":
        assert data["profile"] in ("reference", "measured")
        assert data["total_memory"] > 0


@_settings(6000)
@given(case=cli_case())
def test_fuzz_cli_in_process(case, capsys):
    _count("cli")
    argv, corrupted, accepted = case
    if "--explain" in argv:
        argv = [a for a in argv if a != "--explain"]     # --json wins; --explain is run below
    if corrupted is None:
        code, text = run_cli(argv)
        assert code == 0
        check_json_answer(text, argv[0])
        return
    try:
        code, _ = run_cli(argv)
    except InvalidInputError as err:
        assert names_field(err.parameter, accepted), (
            f"corrupted {corrupted} in {argv} but the error blames {err.parameter!r}: {err}")
        return
    except SystemExit as exc:      # argparse: a value of the wrong form for its flag
        assert exc.code == 2
        assert "error:" in capsys.readouterr().err
        return
    pytest.fail(f"corrupted {corrupted} in {argv} but the command answered (exit {code})")


# --- scenario, model, hardware and Hugging Face files -----------------------------------

MODEL_FILE = {"name": "fuzz-1b", "parameters": 1_235_814_400, "layers": 16, "hidden_dim": 2048, "heads": 32,
              "kv_heads": 8, "head_dim": 64, "vocab_size": 128256, "ffn_dim": 8192, "gated_mlp": True,
              "tied_embeddings": True}
HARDWARE_FILE = {"name": "fuzz-gpu", "memory_capacity": 80 * 2**30}

# (where, field, accepted parameter names, bad value); where: scenario, model or hardware.
FILE_CORRUPTIONS = (
    ("scenario", "batch_size", ("batch_size",), None),
    ("scenario", "batch_size", ("batch_size",), "8"),
    ("scenario", "batch_size", ("batch_size",), 0),
    ("scenario", "seq_len", ("seq_len",), None),
    ("scenario", "tp_size", ("tp_size",), None),
    ("scenario", "sharding_rules", ("sharding_rules",), "tp"),
    ("scenario", "sharding_rules", ("sharding_rules",), {"tp": 3}),
    ("scenario", "plugin_options", ("plugin_options",), "x"),
    ("scenario", "include_plugins", ("include_plugins",), "adam"),
    ("scenario", "stage_layers", ("stage_layers",), "8,8"),
    ("scenario", "lora", ("lora",), {"quantization": "nf4"}),
    ("scenario", "lora", ("lora",), "yes"),
    ("scenario", "precision", ("precision",), None),
    ("scenario", "bogus_field", ("bogus_field", "scenario"), 1),
    ("scenario", "nesting", ("scenario", "model"), "deep"),
    ("model", "kv_heads", ("kv_heads",), 7),
    ("model", "kv_heads", ("kv_heads",), 64),
    ("model", "hidden_dim", ("hidden_dim", "head_dim", "heads"), "2000 without head_dim"),
    ("model", "heads", ("heads",), 0),
    ("model", "layers", ("layers",), -1),
    ("model", "parameters", ("parameters",), "many"),
    ("model", "name", ("name",), None),
    ("model", "name", ("name",), 3),
    ("model", "gated_mlp", ("gated_mlp",), "yes"),
    ("model", "vocab_size", ("vocab_size",), 1.5),
    ("model", "unknown_field", ("unknown_field", "model"), 1),
    ("hardware", "memory_capacity", ("memory_capacity",), 80),
    ("hardware", "memory_capacity", ("memory_capacity",), -1),
    ("hardware", "memory_capacity", ("memory_capacity",), "80GB"),
    ("hardware", "name", ("name",), None),
    ("hardware", "devices_per_node", ("devices_per_node",), 0),
    ("hardware", "frobs", ("frobs", "hardware"), 1),
)


def _deep(levels: int) -> dict:
    value: dict = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@st.composite
def file_case(draw):
    config = draw(valid_config())
    scenario = {k: v for k, v in config.items() if v is not None and k != "runtime_overheads"}
    if config.get("runtime_overheads") is False:
        scenario["runtime_overheads"] = False
    inline = draw(st.sampled_from(("model", "hardware", "both", "neither")))
    if inline in ("model", "both"):
        scenario["model"] = dict(MODEL_FILE)
        scenario["tp_size"] = min(scenario["tp_size"], 2)
    if inline in ("hardware", "both"):
        scenario["hardware"] = dict(HARDWARE_FILE)
    corrupted = None
    if draw(st.integers(0, 3)) > 0:
        where, field, accepted, value = draw(st.sampled_from(FILE_CORRUPTIONS))
        corrupted = (where, field, accepted)
        if where == "scenario":
            if field == "nesting":
                scenario["model"] = _deep(100_000)
            else:
                scenario[field] = value
        else:
            target = dict(MODEL_FILE if where == "model" else HARDWARE_FILE)
            if value == "2000 without head_dim":    # hidden_dim must then be heads x head_dim
                target.pop("head_dim")
                value = 2000
            target[field] = value
            scenario[where] = target
    as_files = draw(st.booleans())    # model/hardware in their own files, named by --model/--hardware
    suffix = draw(st.sampled_from((".json", ".toml"))) if corrupted is None or corrupted[1] != "nesting" else ".json"
    return scenario, corrupted, as_files, suffix


def _toml(data: dict) -> str | None:
    """A tiny TOML writer for the fuzz's flat scenarios (None where TOML cannot say it)."""
    lines, tables = [], []
    for key, value in data.items():
        if value is None:
            return None
        if isinstance(value, dict):
            tables.append((key, value))
        else:
            lines.append(f"{key} = {json.dumps(value)}")
    for key, table in tables:
        lines.append(f"[{key}]")
        for k, v in table.items():
            if v is None or isinstance(v, dict):
                return None
            lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


def _write(path: Path, data: dict, suffix: str) -> Path:
    if suffix == ".toml":
        text = _toml(data)
        if text is not None and "nan" not in text.lower():
            path = path.with_suffix(".toml")
            path.write_text(text, encoding="utf-8")
            return path
    path = path.with_suffix(".json")
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    try:
        path.write_text(json.dumps(data), encoding="utf-8")
    except RecursionError:     # the deep-nesting case: write it by hand
        path.write_text('{"a": ' * 100_000 + "{}" + "}" * 100_000, encoding="utf-8")
    return path


@_settings(2000)
@given(case=file_case())
def test_fuzz_files(case, tmp_path_factory, capsys):
    _count("cli")
    scenario, corrupted, as_files, suffix = case
    tmp = tmp_path_factory.mktemp("fuzz")
    argv = ["estimate"]
    if as_files and corrupted is None or (as_files and corrupted and corrupted[0] != "scenario"):
        for name in ("model", "hardware"):
            if isinstance(scenario.get(name), dict):
                path = tmp / f"{name}.json"
                path.write_text(json.dumps(scenario[name]), encoding="utf-8")
                argv += [f"--{name}", str(path)]
                scenario[name] = "llama3-8b" if name == "model" else "h100"    # overridden by the flag
    argv += ["--scenario", str(_write(tmp / "scenario", scenario, suffix))]
    if corrupted is None:
        code, text = run_cli(argv)
        assert code == 0
        check_json_answer(text, "estimate")
        return
    where, field, accepted = corrupted
    try:
        code, _ = run_cli(argv)
    except InvalidInputError as err:
        assert names_field(err.parameter, accepted) or names_field(err.parameter, (where,)) and field in str(err), (
            f"corrupted {where}.{field} but the error blames {err.parameter!r}: {err}")
        return
    pytest.fail(f"corrupted {where}.{field}={scenario.get(field)!r} but the command answered (exit {code})")


HF_CORRUPTIONS = (
    # (field, accepted parameter names, bad value; DELETE removes the field)
    ("model_type", ("model_type",), "DELETE"),
    ("model_type", ("model_type",), "no_such_family"),
    ("model_type", ("model_type",), 3),
    ("num_attention_heads", ("num_attention_heads", "heads"), 0),
    ("num_attention_heads", ("num_attention_heads", "heads"), "many"),
    ("num_attention_heads", ("num_attention_heads", "heads"), None),
    ("num_key_value_heads", ("num_key_value_heads", "kv_heads"), "NOT A DIVISOR"),
    ("hidden_size", ("hidden_size", "hidden_dim"), -4),
    ("hidden_size", ("hidden_size", "hidden_dim"), 1.5),
    ("num_hidden_layers", ("num_hidden_layers", "layers"), 0),
    ("vocab_size", ("vocab_size",), "big"),
    ("intermediate_size", ("intermediate_size", "ffn_dim"), -1),
)
MOE_CORRUPTIONS = (
    ("num_experts_per_tok", ("num_experts_per_tok", "active_experts_per_token"), 1000),
    ("num_experts_per_tok", ("num_experts_per_tok", "active_experts_per_token"), 0),
)


@st.composite
def hf_case(draw):
    name = draw(st.sampled_from(sorted(p.name for p in HF_DIR.glob("*.json"))))
    config = json.loads((HF_DIR / name).read_text(encoding="utf-8"))
    corrupted = None
    if draw(st.integers(0, 3)) > 0:
        table = HF_CORRUPTIONS + (MOE_CORRUPTIONS if "num_experts_per_tok" in config else ())
        field, accepted, value = draw(st.sampled_from(table))
        if (field not in config and field != "model_type") or (field == "num_key_value_heads" and "kv_lora_rank" in config):
            field, accepted, value = HF_CORRUPTIONS[0]      # (multi-head latent attention reads no KV head count)
        if value == "DELETE":
            config.pop(field, None)
        elif value == "NOT A DIVISOR":   # of the head count, and fewer
            heads = config["num_attention_heads"]
            config[field] = next(k for k in range(2, heads) if heads % k)
        else:
            config[field] = value
        corrupted = (field, accepted)
    layout = draw(st.sampled_from(("file", "dir", "scenario")))
    profile = draw(st.sampled_from((None, "reference", "measured")))
    run = {"batch_size": draw(st.integers(1, 16)), "seq_len": draw(st.sampled_from((128, 256, 512, 1024))),
           "precision": draw(st.sampled_from(("fp32", "bf16", "fp16")))}
    return config, corrupted, layout, profile, run


@_settings(2000)
@given(case=hf_case())
def test_fuzz_hf_configs(case, tmp_path_factory):
    _count("cli")
    config, corrupted, layout, profile, run = case
    tmp = tmp_path_factory.mktemp("hf")
    if layout == "scenario":
        path = tmp / "scenario.json"
        path.write_text(json.dumps({"model": config, "hardware": "h100", **run}), encoding="utf-8")
        argv = ["estimate", "--scenario", str(path)]
    else:
        (tmp / "config.json").write_text(json.dumps(config), encoding="utf-8")
        argv = ["estimate", "--model", str(tmp / "config.json" if layout == "file" else tmp) + ("" if layout == "file" else "/"),
                "-b", str(run["batch_size"]), "-s", str(run["seq_len"]), "--precision", run["precision"]]
    if profile:
        argv += ["--profile", profile]
    if corrupted is None:
        code, text = run_cli(argv)
        assert code == 0
        check_json_answer(text, "estimate")
        return
    field, accepted = corrupted
    try:
        code, _ = run_cli(argv)
    except InvalidInputError as err:
        assert names_field(err.parameter, accepted) or field in str(err), (
            f"corrupted HF {field}={config.get(field, '<deleted>')!r} ({layout}) but the error blames "
            f"{err.parameter!r}: {err}")
        return
    pytest.fail(f"corrupted HF {field} ({layout}) but the command answered (exit {code})")


# --- the installed command, in a subprocess --------------------------------------------

def _installed_command() -> str | None:
    beside = Path(sys.executable).parent / "mlsysim-core"
    return str(beside) if beside.exists() else shutil.which("mlsysim-core")


@st.composite
def subprocess_case(draw):
    argv, corrupted, accepted = draw(cli_case())
    encoding = draw(st.sampled_from((None, None, "ascii", "cp1252", "latin-1")))
    as_json = draw(st.booleans()) and "--explain" not in argv
    return argv + (["--json"] if as_json else []), corrupted, accepted, encoding


@pytest.mark.skipif(_installed_command() is None, reason="the mlsysim-core command is not installed")
@_settings(200)
@given(case=subprocess_case())
def test_fuzz_installed_command(case):
    _count("subprocess")
    argv, corrupted, accepted, encoding = case
    env = {**os.environ, "MLSYSIM_DISABLE_PLUGIN_AUTOLOAD": "1"}
    if encoding:
        env["PYTHONIOENCODING"] = encoding
    proc = subprocess.run([_installed_command(), *argv], capture_output=True, env=env, timeout=120)
    stderr = proc.stderr.decode("utf-8", "replace")
    assert "Traceback" not in stderr, stderr
    if corrupted is None:
        assert proc.returncode == 0, stderr
        if "--json" in argv:
            check_json_answer(proc.stdout.decode("utf-8"), argv[0])
        return
    assert proc.returncode in (2, 3), (argv, proc.returncode, stderr)
    said = stderr.replace("-", "_").lower()
    assert "error:" in said and any(_norm(a) in said for a in accepted), (corrupted, argv, stderr)


def test_fuzz_ran_every_case():
    """The counts the module docstring promises (when the whole module ran, at scale 1 or more)."""
    expected = {"cli": 10_000, "api": 6_000}
    if _installed_command() is not None:
        expected["subprocess"] = 200
    if set(RAN) < set(expected) or SCALE < 1:
        pytest.skip("run the whole module at MLSYSIM_FUZZ_SCALE >= 1 to count its cases")
    for kind, n in expected.items():
        assert RAN[kind] >= n, f"{kind}: {RAN[kind]} cases ran, {n} promised"
