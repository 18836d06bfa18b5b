"""What `search` shows a person (issue 27, item 7): a table no wider than the terminal, progress
a pipe can log, and, when nothing fits, the closest layouts and the command that says what
would make one fit."""

import io
import json
import shlex

import pytest

from mlsysim_core import search
from mlsysim_core.catalog import get_hardware, get_model

from clitools import run


@pytest.fixture(scope="module")
def found(solver):
    return search.search_plans(get_model("llama3.1-8b"), get_hardware("h100"), devices=8, global_batch=64,
                               solver=solver, workers=1, profile="reference")


@pytest.fixture(scope="module")
def none_fit(solver):
    return search.search_plans(get_model("llama3.1-70b"), get_hardware("rtx-4090"), devices=2, global_batch=8,
                               solver=solver, workers=1, profile="reference")


def _table_lines(text: str) -> list[str]:
    """The header row and the rows (the lines after the prose above the table)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:2] == ["tp", "cp"])
    return [line for line in lines[start:] if not line.startswith(("...", "(left out"))]


@pytest.mark.parametrize("width", [72, 80, 100, 140])
def test_every_row_fits_the_width(found, width):
    text = found.table(rows=5, width=width)
    assert found.fits
    assert all(len(line) <= width for line in _table_lines(text)), text
    dropped = [line for line in text.splitlines() if line.startswith("(left out")]
    header = _table_lines(text)[0].split()
    # What is left out is named, and is not in the header; the layout itself never is.
    if dropped:
        names = dropped[0].split(": ", 1)[1].split(";")[0].split(", ")
        assert names and all(n.split()[0] not in header or n == "dp rule" for n in names)
        assert f"fit {width} columns" in dropped[0]
    for kept in ("tp", "cp", "pp", "dp", "ep", "ckpt", "mb", "memory", "step"):
        assert kept in header


def test_below_the_narrowest_table_only_the_layout_and_its_answer_are_kept(found):
    header = _table_lines(found.table(rows=3, width=40))[0]
    kept = [name for name, _, priority in search._TABLE_COLUMNS if priority >= search._KEEP]
    assert header.split() == " ".join(kept).split()


def test_a_wide_terminal_shows_every_column(found):
    text = found.table(rows=3, width=400)
    header = _table_lines(text)[0]
    for name, _, _ in search._TABLE_COLUMNS:
        assert name in header
    assert "(left out" not in text


def test_columns_are_left_out_least_useful_first(found):
    # bubble (priority 1) goes before GiB (2), which goes before MFU (3): never the other way round
    text = found.table(rows=3, width=100)
    note = next(line for line in text.splitlines() if line.startswith("(left out"))
    names = note.split(": ", 1)[1].split(";")[0].split(", ")
    order = {name: priority for name, _, priority in search._TABLE_COLUMNS}
    assert [order[n] for n in names] == sorted(order[n] for n in names)
    assert names[0] == "bubble"


def test_the_width_comes_from_COLUMNS(found, monkeypatch):
    monkeypatch.setenv("COLUMNS", "70")
    assert all(len(line) <= 70 for line in _table_lines(found.table(rows=4)))


def test_nothing_fits_names_the_closest_layouts(none_fit):
    assert not none_fit.fits and none_fit.closest
    memory = [c["total_memory"] for c in none_fit.closest]
    assert memory == sorted(memory) and len(none_fit.closest) <= search.CLOSEST
    capacity = get_hardware("rtx-4090").memory_capacity
    for c in none_fit.closest:
        assert c["over"] == c["total_memory"] - capacity > 0 and c["microbatch"] == 1
    text = none_fit.table()
    assert "No layout of the" in text and "The closest" in text
    command = next(line.strip() for line in text.splitlines() if line.strip().startswith("mlsysim-core fit"))
    words = shlex.split(command)
    first = none_fit.closest[0]
    assert words[words.index("--tp-size") + 1] == str(first["tp"])
    assert words[words.index("--data-parallel") + 1] == first["data_parallel"]
    assert words[words.index("-b") + 1] == "8"


def test_the_closest_layout_is_the_one_solve_gives(none_fit, solver):
    c = none_fit.closest[0]
    r = solver.solve(get_model("llama3.1-70b"), get_hardware("rtx-4090"), 8, 2048, "fp16", "adam",
                     c["checkpointing"], c["tp"], c["pp"], c["dp"], c["ep"], 0, c["gradient_accumulation_steps"],
                     data_parallel=c["data_parallel"], sequence_parallel=c["sequence_parallel"], cp_size=c["cp"],
                     profile="reference")
    assert r.total_memory == c["total_memory"] and not r.feasible


def test_the_closest_are_the_same_with_workers(none_fit, solver):
    forked = search.search_plans(get_model("llama3.1-70b"), get_hardware("rtx-4090"), devices=2, global_batch=8,
                                 solver=solver, workers=2, profile="reference")
    assert forked.closest == none_fit.closest


def test_a_search_that_fits_has_no_closest(found):
    assert found.closest == () and found.to_dict()["closest"] == []


def test_nothing_fits_in_json_and_text_from_the_command_line():
    code, text = run("search", "-m", "llama3.1-70b", "-g", "rtx-4090", "-n", "2", "--global-batch", "8",
                     "--profile", "reference", "--no-progress", "--json")
    assert code == 0
    data = json.loads(text)
    assert data["fits"] == [] and data["closest"][0]["over"] > 0
    code, text = run("search", "-m", "llama3.1-70b", "-g", "rtx-4090", "-n", "2", "--global-batch", "8",
                     "--profile", "reference", "--no-progress")
    assert code == 0 and "The closest" in text and "mlsysim-core fit techniques" in text


def test_progress_in_a_pipe_is_lines_a_log_keeps():
    stream = io.StringIO()
    report = search.text_progress(stream, delay=0.0, bar=False, every=0.0)
    for done in (10, 50, 100):
        report(done, 100)
    lines = stream.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines] == ["searched 10 / 100 layouts", "searched 50 / 100 layouts",
                                                       "searched 100 / 100 layouts"]
    assert "\r" not in stream.getvalue()


def test_progress_in_a_pipe_waits_before_its_first_line():
    stream = io.StringIO()
    report = search.text_progress(stream, delay=60.0, bar=False)
    report(5, 100)
    report(100, 100)
    assert stream.getvalue() == ""      # a quick search prints nothing


def test_progress_on_a_terminal_is_a_bar():
    stream = io.StringIO()
    report = search.text_progress(stream, delay=0.0, bar=True)
    report(50, 100)
    report(100, 100)
    assert stream.getvalue().startswith("\r[###############...............] 50 / 100 layouts")
    assert stream.getvalue().endswith("100 / 100 layouts\n")


def test_the_end_is_said_once():
    stream = io.StringIO()
    report = search.text_progress(stream, delay=0.0, bar=False, every=0.0)
    for done in (50, 100, 100):      # (a pool reports the end, then the search does)
        report(done, 100)
    assert [line.split(" (")[0] for line in stream.getvalue().splitlines()] == [
        "searched 50 / 100 layouts", "searched 100 / 100 layouts"]


@pytest.mark.parametrize("env, flag, shown", [(None, None, True), ("1", None, False), ("1", "--progress", True),
                                              (None, "--no-progress", False)])
def test_MLSYSIM_NO_PROGRESS_silences_the_automatic_progress(monkeypatch, env, flag, shown):
    made = []
    real = search.text_progress
    monkeypatch.setattr(search, "text_progress", lambda *a, **kw: made.append(kw) or real(*a, **kw))
    if env is None:
        monkeypatch.delenv("MLSYSIM_NO_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("MLSYSIM_NO_PROGRESS", env)
    code, _ = run("search", "-n", "2", "--global-batch", "4", "--profile", "reference", *([flag] if flag else []))
    assert code == 0 and bool(made) == shown
