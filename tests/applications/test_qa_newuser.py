"""A new user's reading of the output (helper Q's QA pass): what `--explain` shows must add
up to what it says the total is, and the same run reads the same everywhere."""

import json
from pathlib import Path

import pytest

import mlsysim_core
from mlsysim_core.render import COMPONENTS

from clitools import error_of, run

# Llama-3.1-8B: 8,030,261,248 parameters (meta-llama/Llama-3.1-8B config.json; the catalog's).
LLAMA31_8B_PARAMS = 8_030_261_248


def _term_lines(text: str) -> list[str]:
    """The tree's term lines, in the order of COMPONENTS then of each component's terms."""
    return [line for line in text.splitlines() if "[plugin " in line]


def test_explain_marks_a_term_the_peak_phase_leaves_out():
    # The default run peaks in the backward phase, before the fp32 gradients exist: the
    # gradients row is 0 B, yet its terms are listed under it. The decoder's gradients:
    # (8,030,261,248 - V x h = 128,256 x 4,096 embedding params, a term of its own) x 4 B.
    r = mlsysim_core.estimate("llama3-8b", "h100", 8, 2048)
    assert r.peak_phase == "backward" and r.gradients == 0
    grad = next(t for t in r.terms_of("gradients") if t.label == "gradients (amp-fp16, 4 B)")
    assert grad.nbytes == (LLAMA31_8B_PARAMS - 128_256 * 4_096) * 4 == 30_019_698_688
    assert "backward" not in grad.phases
    text = r.explain()
    line = next(x for x in text.splitlines() if x.lstrip("│ ├└─").startswith(grad.label + ":"))
    assert "30.020 GB (27.958 GiB, not in the total: not alive in the backward phase, the peak)" in line
    assert "the total is the backward phase, the iteration's peak" in text.splitlines()[2]


@pytest.mark.parametrize("model, kw", [
    ("llama3-8b", {}),
    ("llama3-70b", dict(seq_len=4096, tp_size=8, pp_size=4, dp_size=8, zero_stage=1, gradient_accumulation_steps=8)),
    ("llama3-8b", dict(dp_size=8, zero_stage=3, precision="bf16")),
])
def test_explain_counted_terms_add_up_to_each_component(model, kw):
    """Every term line is marked 'not in the total' exactly when the term is not alive in the
    peak phase (or lives off the accelerator); the unmarked terms sum to the component."""
    dp = kw.get("dp_size", 1) * kw.get("gradient_accumulation_steps", 1)
    r = mlsysim_core.estimate(model, "h100", 8 * dp, **kw)
    lines = iter(_term_lines(r.explain()))
    for component in COMPONENTS:
        counted = 0
        for term in r.terms_of(component):
            line = next(lines)
            assert line.split("[plugin ")[0].lstrip("│ ├└─").startswith(term.label + ":")
            left_out = r.peak_phase not in term.phases or term.tier != "accelerator"
            assert ("not in the total" in line) == left_out, line
            counted += 0 if left_out else term.nbytes
        assert counted == getattr(r, component)
    assert next(lines, None) is None


def test_reference_explain_marks_nothing():
    r = mlsysim_core.TrainingMemoryModel().solve("llama3-8b", "h100", 8, 1024)
    assert r.peak_phase is None
    assert not any("not in the total" in x for x in _term_lines(r.explain()))


def test_estimate_explain_and_json_agree():
    """The same run: the table's total, the explain header's and the JSON's bytes agree."""
    argv = ("estimate", "-m", "llama3-70b", "-b", "64", "--tp", "8", "--pp", "4", "--dp", "2",
            "--grad-accum", "8", "--zero-stage", "1")
    code, text = run(*argv, "--explain", "--no-chart")
    assert code == 0
    code, raw = run(*argv, "--json")
    assert code == 0
    data = json.loads(raw)
    gb = f"{data['total_memory'] * 1e-9:.3f}"
    assert any(x.startswith("total") and x.split()[1] == gb for x in text.splitlines())
    assert f"\n{gb} GB (" in text
    assert sum(data[c] for c in COMPONENTS) == data["total_memory"]
    for note in data["notes"]:
        assert note in " ".join(text.split())


@pytest.mark.parametrize("command, key, alias", [
    ("models", "meta-llama/llama-3.1-8b", "llama3-8b"),       # the README's and the defaults' name
    ("models", "meta-llama/llama-3.1-70b", "llama3-70b"),
    ("hardware", "nvidia/h100-sxm5-80gb", "h100"),
])
def test_catalog_listings_show_the_short_names_the_docs_use(command, key, alias):
    """`mlsysim-core models` / `hardware` list each entry's other names: the README's
    `-m llama3-70b` and `-g h100` are found in the listing, on their entry's row."""
    code, text = run(command)
    assert code == 0
    header, *rows = text.splitlines()
    assert header.split()[-1] == "aliases"
    (row,) = [r for r in rows if r.split()[0] == key]
    assert alias in row.split("  ")[-1].split(", ")


@pytest.mark.parametrize("flag, dest", [("--trainable-fraction", "trainable_fraction"),
                                        ("--comm-buffer-fraction", "communication_buffer_fraction")])
def test_a_nan_flag_given_once_is_refused_for_its_value(capsys, flag, dest):
    """NaN is not equal to itself: given once, it was reported as the flag given twice with
    contradicting values. It is the value that is wrong."""
    code, err = error_of(capsys, "estimate", flag, "nan")
    assert code == 2
    assert err == f"mlsysim-core: error: {dest}=nan is not allowed: a number in [0.0, 1.0]"
    code, err = error_of(capsys, "estimate", flag, "nan", flag, "NaN")    # twice, one value
    assert err == f"mlsysim-core: error: {dest}=nan is not allowed: a number in [0.0, 1.0]"


DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_the_docs_home_links_every_page_and_names_the_defaults_right():
    """docs/index.md: every user-guide page is linked (the planner, launch configs, the catalog
    were missing), the runtime dependencies are pyproject's, and the profile every command
    uses by default is the measured one."""
    import re
    import tomllib
    index = (DOCS / "index.md").read_text()
    linked = set(re.findall(r"\]\(([\w-]+\.md)", index))
    assert {p.name for p in DOCS.glob("*.md")} - {"index.md"} <= linked
    project = tomllib.loads((DOCS.parent / "pyproject.toml").read_text())["project"]
    for dep in project["dependencies"]:
        assert f"`{dep}`" in index
    assert "The default `reference` profile" not in index
    assert "the default of every `mlsysim-core`\n  command" in index


TORCHTITAN_70B = DOCS.parent / "tests/data/launch/torchtitan/llama3/llama3_70b.toml"   # tp 8, dp shard -1


def test_launch_layout_flags_that_change_the_world_size_are_refused(capsys):
    """`--from` derives dp as the world size over tp x pp x cp (docs/launch.md): with --gpus 16
    the torchtitan 70B file (tp 8) gives dp 2. A --tp 4 that replaced the file's tp after that
    ran 4 x 2 = 8 GPUs, silently, while the section said 'world size 16'."""
    code, text = run("estimate", "--from", str(TORCHTITAN_70B), "--gpus", "16", "-g", "h100", "--no-chart")
    assert code == 0 and "tp=8 pp=1 dp=2" in text
    code, err = error_of(capsys, "estimate", "--from", str(TORCHTITAN_70B), "--gpus", "16", "-g", "h100",
                         "--tp", "4")
    assert code == 2
    assert err.startswith("mlsysim-core: error: --tp=4 is not allowed: a layout of the launch's 16 GPUs "
                          "(tp x pp x cp x dp = 16): give --dp 4 with it")
    assert "the run would have 8 GPUs" in err


def test_launch_dp_flag_without_a_batch_is_refused(capsys):
    """The same 16 GPUs as tp 4 x dp 4: the files' global batch 16 = micro-batch 8 x dp 2 would
    silently become micro-batch 4; with -b the global batch is the user's own."""
    argv = ("estimate", "--from", str(TORCHTITAN_70B), "--gpus", "16", "-g", "h100", "--tp", "4", "--dp", "4")
    code, err = error_of(capsys, *argv)
    assert code == 2
    assert err.startswith("mlsysim-core: error: --dp=4 is not allowed: with -b/--batch-size (the global batch)")
    assert "global batch 16 = micro-batch 8 x dp 2 x accumulation 1" in err
    code, text = run(*argv, "-b", "32", "--no-chart")
    assert code == 0
    assert "tp=4 pp=1 dp=4" in text and "global batch 32 = micro-batch 8 x dp 4 x accumulation 1" in text


def test_launch_layout_flags_where_fit_searches_them(capsys):
    """`fit devices` searches dp (the world size) and `fit batch` the micro-batch: there a
    changed tp or accumulation is the question, not a contradiction of the files."""
    base = ("--from", str(TORCHTITAN_70B), "--gpus", "16", "-g", "h100")
    code, text = run("fit", "devices", *base, "--tp", "4")
    assert code == 0 and "fewest devices:" in text
    code, text = run("fit", "batch", *base, "--grad-accum", "2")
    assert code == 0 and "largest micro-batch:" in text and "x dp 2 x accumulation 2" in text
    code, err = error_of(capsys, "fit", "batch", *base, "--tp", "4")     # the world size still holds
    assert code == 2 and err.startswith("mlsysim-core: error: --tp=4 is not allowed: a layout of the launch's 16 GPUs")
    code, err = error_of(capsys, "fit", "seq", *base, "--grad-accum", "2")   # the batch is a given
    assert code == 2 and err.startswith("mlsysim-core: error: --grad-accum=2 is not allowed: with -b/--batch-size")


def test_quickstart_flag_table_names_real_flags_and_the_sequence_parallel_default():
    """docs/quickstart.md's table of estimate's flags: every flag it names exists, and the
    sequence-parallel row says the profile's default (it said `--no-sequence-parallel`: off,
    while the measured profile, the default, has sequence parallelism off)."""
    import re
    from mlsysim_core.cli import _parser
    text = (DOCS / "quickstart.md").read_text()
    table = text[text.index("## Common flags of `mlsysim-core estimate`"):]
    table = table[:table.index("\n\n", table.index("| Flag |"))]
    flags = set(re.findall(r"`(--[a-z][a-z0-9-]*|-[a-z])[ `]", table))
    known = set()
    for action in _parser()._subparsers._group_actions[0].choices["estimate"]._actions:
        known.update(action.option_strings)
    assert flags and flags <= known, flags - known
    row = next(x for x in table.splitlines() if x.startswith("| `--sequence-parallel`, `--no-sequence-parallel`"))
    assert "off under measured, on under reference" in row


@pytest.mark.parametrize("argv", [("-m", "llama3-70b"), ("--json",), ("--debug", "-b", "16", "--tp", "2")])
def test_a_commands_flag_before_any_command_names_the_command_to_give(capsys, argv):
    """Bare `mlsysim-core` runs `estimate`; `mlsysim-core -m llama3-70b` said "argument
    COMMAND: invalid choice: 'llama3-70b'" (and `--json` "unrecognized arguments")."""
    code, err = error_of(capsys, *argv)
    assert code == 2
    flags = [a for a in argv if a != "--debug"]
    assert err == (f"mlsysim-core: error: COMMAND={flags[0]!r} is not allowed: a command first (estimate, plot, "
                   "fit, search, plugins, models, hardware, time), then its flags (e.g. mlsysim-core estimate "
                   f"{' '.join(flags)})")


def test_estimate_json_carries_the_reference_total_the_text_shows():
    """The text answer prints 'reference profile total: 202.302 GB ...' under the table; the
    JSON of the same run carried nothing of it."""
    code, text = run("estimate", "--no-chart")
    assert "reference profile total: 202.302 GB (188.408 GiB), does not fit" in text
    code, raw = run("estimate", "--json")
    reference = mlsysim_core.TrainingMemoryModel().solve("llama3-8b", "h100", 8, 2048)
    assert json.loads(raw)["reference_profile"] == {"total_memory": reference.total_memory, "feasible": False,
                                                    "refused": None}
    code, raw = run("estimate", "--json", "--profile", "reference")
    assert json.loads(raw)["reference_profile"] is None       # the answer is the reference's own


def test_from_json_reads_estimate_json_with_a_launch_and_a_reference_total():
    """`TrainingMemoryResult.from_json` reads `estimate --json` (test_one_answer_cli); with
    --from the answer's `launch` key made it refuse the document."""
    from mlsysim_core import TrainingMemoryResult
    code, raw = run("estimate", "--from", str(DOCS.parent / "examples/launch/recipe.yaml"), "--gpus", "8",
                    "-g", "h100", "--json")
    assert code == 0 and "launch" in json.loads(raw) and "reference_profile" in json.loads(raw)
    result = TrainingMemoryResult.from_json(raw)
    assert result.total_memory == json.loads(raw)["total_memory"] and result.profile == "measured"


def test_time_reproduces_a_search_row_with_sequence_parallelism():
    """`time` times one layout "as a search times each of its rows", but it had only
    --no-sequence-parallel (the measured profile's default already): a search row with sp=y
    (the 70B search's first Pareto row in the README's example) could not be timed."""
    from mlsysim_core import search
    row = dict(global_batch=512, seq_len=2048, tp=4, cp=1, pp=4, dp=4, ep=1, data_parallel="zero1",
               checkpointing="none", microbatch=1)
    want = search.time_plan(mlsysim_core.catalog.get_model("llama3-70b"), mlsysim_core.catalog.get_hardware("h100"),
                            sequence_parallel=True, profile="measured", **row)
    # the row of `mlsysim-core search -n 64 --global-batch 512 -m llama3-70b --json` (tp 4 pp 4 dp 4
    # zero1, no checkpointing, sp, micro-batch 1 x 128): its total_memory
    assert want["memory_bytes"] == 85_829_276_236
    argv = ("time", "-m", "llama3-70b", "--global-batch", "512", "--tp", "4", "--pp", "4", "--dp", "4", "--zero", "1",
            "--checkpointing", "none", "--micro-batch", "1")
    code, raw = run(*argv, "--sequence-parallel", "--json")
    assert code == 0
    got = json.loads(raw)
    assert got["layout"]["sequence_parallel"] is True
    assert (got["memory_bytes"], got["step_s"]) == (want["memory_bytes"], want["step_s"])
    code, raw = run(*argv, "--json")
    assert json.loads(raw)["layout"]["sequence_parallel"] is False      # the measured profile's default
    code, text = run(*argv, "--sequence-parallel")
    assert ", sequence parallel\n" in text


def test_a_renamed_hf_config_file_is_named_after_the_file(tmp_path):
    """`-m DeepSeek-V2-Lite.json` (a config.json saved under the model's name) was named after
    its folder (`hf_configs on NVIDIA H100 ...`); a `config.json` is still named after its folder."""
    text = (DOCS.parent / "tests/data/hf_configs/Llama-3.2-1B.json").read_text()
    (tmp_path / "Llama-3.2-1B.json").write_text(text)
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(text)
    for model, name in ((tmp_path / "Llama-3.2-1B.json", "Llama-3.2-1B"), (tmp_path / "ckpt", "ckpt"),
                        (tmp_path / "ckpt" / "config.json", "ckpt")):
        code, out = run("estimate", "-m", str(model), "--no-chart")
        assert code == 0 and out.startswith(f"{name} on NVIDIA H100 SXM5 80GB"), out.splitlines()[0]


def test_a_respelled_reference_profile_gets_no_reference_total_beside_it():
    """`--profile referencE` is the reference profile (names are read case-insensitively): its
    answer is the reference's own, with no 'reference profile total' beside it, in text or JSON."""
    code, raw = run("estimate", "--profile", "referencE", "--json")
    assert code == 0 and json.loads(raw)["reference_profile"] is None
    assert raw == run("estimate", "--profile", "reference", "--json")[1]
    code, text = run("estimate", "--profile", "REFERENCE", "--no-chart")
    assert "reference profile total" not in text


def test_an_empty_launch_file_is_said_empty(tmp_path, capsys):
    from mlsysim_core.cli import main
    empty = tmp_path / "recipe.yaml"
    empty.write_text("")
    assert main(["estimate", "--from", str(empty), "-g", "h100"]) == 2
    err = capsys.readouterr().err
    assert f"--from='{empty}' is not allowed" in err and "no launch format recognizes it: the file is empty" in err
    full = tmp_path / "other.yaml"
    full.write_text("a_key_nobody_reads: 1\n")
    assert main(["estimate", "--from", str(full), "-g", "h100"]) == 2
    err = capsys.readouterr().err
    assert "(no launch format recognizes it)" in err and "empty" not in err.split("is not allowed")[1]


def test_the_trace_summary_counts_runtime_overheads_when_there_are_any():
    """The trace's summary line adds up to the total: the measured profile's runtime overheads
    (CUDA context, allocator) are named in it; the reference's line keeps its own format."""
    from mlsysim_core.render import format_gb
    from mlsysim_core.solver import TrainingMemoryModel
    measured = TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8)
    assert measured.runtime_overheads > 0
    assert measured.constraint_trace[0].endswith(f", runtime overheads={format_gb(measured.runtime_overheads)}.")
    reference = TrainingMemoryModel().solve("llama3-8b", "h100", 8)
    assert reference.runtime_overheads == 0 and "runtime" not in reference.constraint_trace[0]


def test_fit_says_gib_beside_gb_everywhere():
    from mlsysim_core.inverse import largest_batch
    from mlsysim_core.solver import TrainingMemoryModel
    answer = largest_batch("llama3-8b", "h100", solver=TrainingMemoryModel("measured"), seq_len=2048, tp_size=4)
    text = answer.describe()
    assert text.count("GiB") >= 3 and f"{answer.result.available_memory / 2**30:,.3f} GiB" in text
