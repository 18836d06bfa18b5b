"""The outputs the documentation shows are what the commands print now.

tools/doc_outputs.py runs every ``$ mlsysim-core ...`` command of README.md and docs/*.md
and every Python block marked ``<!-- doc-output: run -->``; a page whose shown output is
stale fails here with the diff. Regenerate with ``python tools/doc_outputs.py``.

The first tests check the tool itself on small pages of their own.
"""

from __future__ import annotations

import concurrent.futures
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import doc_outputs  # noqa: E402

sys.path.remove(str(ROOT / "tools"))


def page(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "page.md"
    path.write_text(text, encoding="utf-8")
    return path


# --- the tool -----------------------------------------------------------------------------

@pytest.mark.long     # runs documentation commands in subprocesses: `pytest --long`, .ci/run
def test_a_stale_output_is_rewritten_and_check_mode_shows_the_diff(tmp_path):
    path = page(tmp_path, "Text.\n\n```console\n$ mlsysim-core estimate --profile reference -s 1024 --no-chart\n"
                          "an old line\n```\n\nMore text.\n")
    report = doc_outputs.process(path)
    assert not report.problems and report.ran == 1
    assert "an old line" not in report.new and "total                     165.794" in report.new
    assert report.new.startswith("Text.\n\n```console\n$ mlsysim-core estimate") and report.new.endswith("```\n\nMore text.\n")
    assert "-an old line" in report.diff()
    assert doc_outputs.main(["--check", str(path)]) == 1
    assert path.read_text(encoding="utf-8") == report.old           # --check changes nothing
    assert doc_outputs.main([str(path)]) == 0
    assert path.read_text(encoding="utf-8") == report.new
    assert doc_outputs.main(["--check", str(path)]) == 0


@pytest.mark.long     # runs documentation commands in subprocesses: `pytest --long`, .ci/run
def test_markers_select_mask_skip_and_expect_an_exit_code(tmp_path):
    text = ("<!-- doc-output: lines='^(total|available) +\\d' -->\n"
            "```console\n$ mlsysim-core estimate --profile reference -s 1024 --no-chart\n```\n\n"
            "<!-- doc-output: head=2 -->\n"
            "```console\n$ mlsysim-core estimate --profile reference -s 1024 --no-chart\n```\n\n"
            "<!-- doc-output: from='^total' head=1 mask='[\\d.]+' -->\n"
            "```console\n$ mlsysim-core estimate --profile reference -s 1024 --no-chart\n...\ntotal                     1.000       2.000  3.0 %\n...\n```\n\n"
            "<!-- doc-output: skip (not today) -->\n"
            "```console\n$ mlsysim-core no-such-command\nwhatever\n```\n\n"
            "<!-- doc-output: exit=2 -->\n"
            "```console\n$ mlsysim-core estimate --ep 2\n$ echo $?\n0\n```\n")
    report = doc_outputs.process(page(tmp_path, text))
    assert not report.problems, report.problems
    assert len(report.skipped) == 1 and report.skipped[0].endswith(": not today")
    blocks = report.new.split("```console\n")[1:]
    assert blocks[0].splitlines()[1:4] == ["...", "total                     165.794       154.408  100.0 %",
                                           "available                  85.899        80.000           NVIDIA H100 SXM5 80GB"]
    assert blocks[1].splitlines()[1:4] == ["meta-llama/Llama-3.1-8B on NVIDIA H100 SXM5 80GB  (profile: reference)",
                                           blocks[1].splitlines()[2], "..."]
    assert blocks[2].splitlines()[1:4] == ["...", "total                     1.000       2.000  3.0 %", "..."]         # masked: kept as it was
    assert blocks[3].splitlines()[1] == "whatever"
    assert blocks[4].splitlines()[1].startswith("mlsysim-core: error: ep_size=2 is not allowed")
    assert blocks[4].splitlines()[2:4] == ["$ echo $?", "2"]


def test_a_failing_command_is_a_problem_and_keeps_the_page_as_it_was(tmp_path):
    text = "```console\n$ mlsysim-core estimate --ep 2\nwhat the page says\n$ echo $?\n0\n```\n"
    report = doc_outputs.process(page(tmp_path, text))
    assert report.new == report.old
    assert len(report.problems) == 1 and "exited with 2, not 0" in report.problems[0]


def test_other_commands_are_left_alone_and_a_mixed_block_needs_a_marker(tmp_path):
    text = ("```console\n$ pip install -e .\n$ pytest\n```\n\n"
            "```console\n$ pip install -e ./x\n$ mlsysim-core plugins | grep x\n```\n")
    report = doc_outputs.process(page(tmp_path, text))
    assert report.ran == 0 and report.new == report.old
    assert len(report.problems) == 1 and "mixes mlsysim-core commands with others" in report.problems[0]
    fixed = "<!-- doc-output: run-only -->\n```console\n$ pip install -e ./nothing-here\n$ mlsysim-core plugins\n```\n"
    report = doc_outputs.process(page(tmp_path, fixed))
    assert report.ran == 1 and not report.problems and report.new == report.old


def test_a_bad_marker_is_a_problem(tmp_path):
    report = doc_outputs.process(page(tmp_path, "<!-- doc-output: hed=3 -->\n```console\n$ mlsysim-core plugins\n```\n"))
    assert report.ran == 0 and "unknown marker option 'hed=3'" in report.problems[0]


@pytest.mark.long     # runs documentation commands in subprocesses: `pytest --long`, .ci/run
def test_commands_never_write_into_the_repository(tmp_path):
    """``-o`` and ``--save-scenario`` write into the scratch copy, even over a file the
    repository has; the files a page shows (``file=``) are found by its commands."""
    target = ROOT / "examples" / "scenarios" / "lora.json"
    before = target.read_bytes()
    text = ("<!-- doc-output: file=run.json -->\n```json\n{\"model\": \"llama3-8b\", \"hardware\": \"h100\", \"batch_size\": 8}\n```\n\n"
            "<!-- doc-output: run-only -->\n```console\n"
            "$ mlsysim-core estimate --scenario run.json --save-scenario examples/scenarios/lora.json\n"
            "$ mlsysim-core estimate --scenario run.json > examples/scenarios/lora.json\n```\n")
    report = doc_outputs.process(page(tmp_path, text))
    assert report.ran == 2 and not report.problems, report.problems
    assert target.read_bytes() == before
    assert doc_outputs.Command(["$ mlsysim-core plot bars -o a.png --save-scenario=b.json > c.txt"], []).written_paths() \
        == ["a.png", "b.json", "c.txt"]


def test_a_command_continues_over_backslashed_lines():
    preamble, found = doc_outputs.commands(["$ mlsysim-core estimate \\", "    --no-chart   # a comment", "out", "",
                                            "$ echo $?", "0"])
    assert preamble == [] and [c.kind for c in found] == ["mlsysim", "echo"]
    assert found[0].shell == "mlsysim-core estimate \\\n--no-chart   # a comment" and found[0].output == ["out", ""]
    assert doc_outputs.Command(["$ python -m mlsysim_core plugins"], []).kind == "mlsysim"
    assert doc_outputs.Command(["$ MLSYSIM_DISABLED_PLUGINS=x mlsysim-core plugins"], []).kind == "mlsysim"


def test_python_blocks_check_their_commented_values(tmp_path):
    text = ("<!-- doc-output: run -->\n```python\nx = 6 * 7\nx          # 42 is the answer\n"
            "print(x, x / 4)   # -> 42 10...\nprint('not checked')   # a remark\n```\n\n"
            "<!-- doc-output: run -->\n```python\nx + 1      # 44\nprint([x])\n# -> [41]\n```\n")
    report = doc_outputs.process(page(tmp_path, text))
    assert report.ran == 2 and report.new == report.old
    assert [p.split(": python: ")[1] for p in report.problems] == [
        "line 1: the comment says '44', it is '43'", "line 2: the comment says '[41]', it is '[42]'"]


# --- the documentation --------------------------------------------------------------------

PAGES = doc_outputs.pages()


@pytest.fixture(scope="module")
def reports():
    """Every page processed once, a few at a time (the whole set takes about 45 s on one core)."""
    with concurrent.futures.ThreadPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        return dict(zip(PAGES, pool.map(doc_outputs.process, PAGES)))


@pytest.mark.long     # every page's commands run (about 45 s on one core): `pytest --long`, .ci/run
@pytest.mark.parametrize("path", PAGES, ids=[doc_outputs.shown_name(p) for p in PAGES])
def test_the_page_shows_what_its_commands_print(path, reports):
    report = reports[path]
    assert not report.problems, "\n".join(report.problems)
    assert report.new == report.old, (
        f"{doc_outputs.shown_name(path)} is stale: run `python tools/doc_outputs.py`\n{report.diff()}")


def test_the_readme_and_the_quickstart_are_checked():
    listed = "\n".join(doc_outputs.list_blocks(ROOT / "README.md") + doc_outputs.list_blocks(ROOT / "docs" / "quickstart.md"))
    assert "README.md" in listed and "python: run" in listed and "generated" in listed
