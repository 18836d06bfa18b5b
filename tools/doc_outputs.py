"""Regenerate (or check) the command outputs that README.md and docs/*.md show.

    python tools/doc_outputs.py                  # rewrite every stale output in place
    python tools/doc_outputs.py --check          # exit 1, with a diff, if a page is stale
    python tools/doc_outputs.py docs/quickstart.md --check     # some pages only
    python tools/doc_outputs.py --list           # every block and what is done with it

**Console blocks.** In a ```` ```console ```` block, a line starting with ``$ `` is a command
(a line ending in ``\\`` continues it); the lines under it, up to the next command, are its
output. Each ``$ mlsysim-core ...`` (or ``$ python -m mlsysim_core ...``) command is run with
``bash -o pipefail`` (so ``| head -40`` works, and a failure inside a pipe is one) and the lines under it are replaced with what it printed,
stdout and stderr together. ``$ echo $?`` prints the previous command's exit code. A block
with no mlsysim-core command (``pip install``, ``pytest``, ...) is left alone; a block that
mixes mlsysim-core commands with other commands must say what to do with a marker.

**Markers.** An HTML comment on the line before a block (blank lines between are allowed)
changes what is done with it; it does not show in the rendered page::

    <!-- doc-output: skip (needs the adam-mini example plugin installed) -->
    <!-- doc-output: run-only -->        run each command, check its exit code, show no output
    <!-- doc-output: exit=2 -->          the commands are meant to fail with this exit code
    <!-- doc-output: head=12 -->         show the first 12 lines of each output, then "..."
    <!-- doc-output: from='^[\\d.]+ GB' -->   show the output from the first line matching
    <!-- doc-output: lines='^key|^mlsysim:h100 ' -->   only the lines matching, "..." between
    <!-- doc-output: mask='\\[[\\d.]+ s\\]' -->    text that changes from run to run (a timing):
                                          compared as equal; the page keeps its old text
    <!-- doc-output: requires=matplotlib -->    skip the block unless the module imports
    <!-- doc-output: file=run.json -->   (before any other block, e.g. ```json) write the
                                          block's text to run.json for the page's commands
    <!-- doc-output: run -->             (before a ```python block) run it, see below

Options combine (``head=20 exit=2``); values with spaces or backslashes go in single quotes.
A ``plot`` command requires matplotlib (the ``plot`` extra) without saying so: where it does
not import, the block is skipped and reported.

**Python blocks** marked ``run`` are executed in order, the blocks of one page sharing their
names, in a fresh interpreter. Where a bare expression has a comment (``r.feasible  # False``),
the comment must start with the value's ``repr`` (words may follow: ``# 0.5 GB``); where a
``print(...)`` has a comment
``# -> TEXT`` (on its line, or on the line under it), TEXT must be what it printed. In
either, ``...`` stands for any text.

**A clean, repeatable run.** Every command of a page runs in one scratch folder that links
to the repository's files (so ``examples/scenarios/lora.json`` is found), with the folders
a command writes to (``-o``, ``--output``, ``--save-scenario``) made real, so the repository
is never written to (``-o docs/img/x.png`` does not replace the picture). The environment is
minimal: no ``MLSYSIM_*`` variables but ``MLSYSIM_NO_PROGRESS=1`` (a search's progress lines
depend on how fast the machine is; a page shows what a terminal keeps), ``HOME`` and ``XDG_CONFIG_HOME`` in the scratch folder
(no user catalog), UTF-8 output, unbuffered (stdout and stderr in the order printed),
``COLUMNS=100``, the ``mlsysim-core`` of this interpreter's environment first on ``PATH``.
Third-party plugins installed in that environment would change the outputs: the tool warns.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import difflib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600
MARKER = re.compile(r"^\s*<!--\s*doc-output:\s*(?P<body>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>`{3,}|~{3,})\s*(?P<lang>[\w+-]*)")
ELIDED = "..."
WRITES = ("-o", "--output", "--save-scenario")
NOT_LINKED = {".git", ".venv", ".venv-ci", "site", ".pytest_cache", "__pycache__", ".mypy_cache",
              ".ruff_cache", "build", "dist"}


def shown_name(page: Path) -> str:
    """A page's name relative to the repository, where it is in it."""
    try:
        return str(page.resolve().relative_to(ROOT))
    except ValueError:
        return str(page)


def pages() -> list[Path]:
    """Every page the tool reads: README.md and docs/*.md."""
    return [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))


# --- parsing ------------------------------------------------------------------------------

class MarkerError(ValueError):
    pass


@dataclass
class Options:
    skip: str | None = None           # the reason
    run_only: bool = False
    run: bool = False                 # a python block
    exit: int = 0
    head: int | None = None
    start: str | None = None          # from=
    lines: str | None = None
    masks: list[str] = field(default_factory=list)
    requires: list[str] = field(default_factory=list)
    file: str | None = None
    explicit: bool = False            # a marker was given

    @classmethod
    def parse(cls, body: str | None) -> Options:
        options = cls()
        if body is None:
            return options
        options.explicit = True
        if body == "skip" or body.startswith("skip ") or body.startswith("skip("):
            options.skip = body[4:].strip().strip("()").strip() or "no reason given"
            return options
        try:
            words = shlex.split(body)
        except ValueError as err:
            raise MarkerError(f"cannot read the marker {body!r}: {err}") from None
        for word in words:
            key, eq, value = word.partition("=")
            if not eq and key in ("run-only", "run"):
                setattr(options, key.replace("-", "_"), True)
            elif eq and key in ("exit", "head"):
                try:
                    setattr(options, key, int(value))
                except ValueError:
                    raise MarkerError(f"{key}= takes a whole number, not {value!r}") from None
            elif eq and key in ("from", "lines", "mask"):
                try:
                    re.compile(value)
                except re.error as err:
                    raise MarkerError(f"{key}={value!r} is not a regular expression: {err}") from None
                if key == "mask":
                    options.masks.append(value)
                else:
                    setattr(options, "start" if key == "from" else key, value)
            elif eq and key == "requires":
                options.requires += [m for m in value.split(",") if m]
            elif eq and key == "file":
                options.file = value
            else:
                raise MarkerError(f"unknown marker option {word!r} (skip, run-only, run, exit=, head=, "
                                  "from=, lines=, mask=, requires=, file=)")
        return options


@dataclass
class Block:
    page: Path
    lang: str
    indent: str
    first: int                 # index of the first line inside the fence
    end: int                   # index of the closing fence
    options: Options
    marker_error: str | None = None

    @property
    def where(self) -> str:
        return f"{shown_name(self.page)}:{self.first}"


def blocks(page: Path, text: str) -> list[Block]:
    """The fenced blocks of a page, each with the marker before it."""
    lines = text.split("\n")
    found = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, indent = m["fence"], m["indent"]
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence[0] * len(fence))
                                        and lines[end].strip().strip(fence[0]) == ""):
            end += 1
        before = i - 1
        while before >= 0 and not lines[before].strip():
            before -= 1
        marker = MARKER.match(lines[before]) if before >= 0 else None
        error = None
        try:
            options = Options.parse(marker["body"] if marker else None)
        except MarkerError as err:
            options, error = Options(skip="a bad marker"), str(err)
        found.append(Block(page, m["lang"], indent, i + 1, end, options, error))
        i = end + 1
    return found


@dataclass
class Command:
    text: list[str]            # the command's lines as on the page ("$ ..." and continuations)
    output: list[str]          # the lines under it, as on the page

    @property
    def shell(self) -> str:
        """The command as bash reads it."""
        return "\n".join([self.text[0].lstrip()[2:]] + [line.strip() for line in self.text[1:]])

    @property
    def kind(self) -> str:
        """``mlsysim`` (run and shown), ``echo`` (``echo $?``) or ``other`` (left alone)."""
        try:
            words = shlex.split(self.shell, comments=True)
        except ValueError:
            return "other"
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            words = words[1:]
        if words[:1] == ["mlsysim-core"] or (words[:1] in (["python"], ["python3"])
                                             and words[1:3] == ["-m", "mlsysim_core"]):
            return "mlsysim"
        if words == ["echo", "$?"]:
            return "echo"
        return "other"

    @property
    def is_plot(self) -> bool:
        words = shlex.split(self.shell, comments=True)
        subcommands = [w for w in words[1:] if not w.startswith("-")]
        return self.kind == "mlsysim" and "plot" in subcommands[:3]

    def written_paths(self) -> list[str]:
        """The files the command writes: the values of -o, --output and --save-scenario,
        and the targets of > and >>."""
        lexer = shlex.shlex(self.shell, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        found = []
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if eq and flag in WRITES:
                found.append(value)
            elif (word in WRITES or word in (">", ">>", "&>", ">|")) and i + 1 < len(words):
                found.append(words[i + 1])
        return found


def commands(lines: list[str]) -> tuple[list[str], list[Command]]:
    """A console block's lines before the first command, and its commands."""
    preamble: list[str] = []
    found: list[Command] = []
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("$ ") or lines[i].strip() == "$":
            text = [lines[i]]
            while text[-1].rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text.append(lines[i])
            found.append(Command(text, []))
        elif found:
            found[-1].output.append(lines[i])
        else:
            preamble.append(lines[i])
        i += 1
    return preamble, found


# --- running ------------------------------------------------------------------------------

def clean_environment(scratch: Path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "/usr/bin:/bin")
    env = {
        "PATH": bindir + os.pathsep + path,
        "HOME": str(scratch / ".home"),
        "XDG_CONFIG_HOME": str(scratch / ".config"),
        "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8",
        "PYTHONIOENCODING": "utf-8", "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "COLUMNS": "100", "LINES": "50", "TERM": "dumb", "TZ": "UTC",
        "MPLBACKEND": "Agg", "MPLCONFIGDIR": str(scratch / ".home" / "mpl"),
        "MLSYSIM_NO_PROGRESS": "1",
    }
    if "VIRTUAL_ENV" in os.environ:
        env["VIRTUAL_ENV"] = os.environ["VIRTUAL_ENV"]
    if "TMPDIR" in os.environ:
        env["TMPDIR"] = os.environ["TMPDIR"]
    return env


class Sandbox:
    """A scratch folder standing in for the repository root: a link to each of its files
    and folders, a folder made real (its entries links) where a command writes."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkdtemp(prefix="mlsysim-doc-outputs-"))
        for entry in ROOT.iterdir():
            if entry.name not in NOT_LINKED:
                (self.path / entry.name).symlink_to(entry)
        self.env = clean_environment(self.path)

    def close(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def writable(self, relative: str) -> None:
        """Make the folder that will hold ``relative`` a real folder, if it exists, and
        ``relative`` itself no link (a command writing it would write through the link)."""
        if Path(relative).is_absolute() or ".." in Path(relative).parts:
            raise ValueError(f"a command writes {relative!r}, outside the scratch folder: "
                             "use a relative path inside the repository")
        here = self.path
        for part in Path(relative).parent.parts:
            here = here / part
            if here.is_symlink() and here.is_dir():
                target = here.resolve()
                here.unlink()
                here.mkdir()
                for entry in target.iterdir():
                    (here / entry.name).symlink_to(entry)
            elif not here.exists():
                return
        if (self.path / relative).is_symlink():
            (self.path / relative).unlink()

    def write(self, relative: str, text: str) -> None:
        self.writable(relative)
        target = self.path / relative
        if target.is_symlink():
            target.unlink()
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")

    def run(self, command: str) -> tuple[int, list[str]]:
        try:
            done = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=self.path, env=self.env,
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return 124, [f"(timed out after {TIMEOUT_S} s)"]
        text = done.stdout.decode("utf-8", "replace")
        lines = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while lines and not lines[-1]:
            lines.pop()
        return done.returncode, lines


def select(output: list[str], options: Options) -> list[str]:
    """The part of a command's output the page shows: from the line ``from=`` matches,
    ``head=`` lines of it, those ``lines=`` matches; "..." where lines are left out."""
    at = 0
    if options.start is not None:
        at = next((i for i, line in enumerate(output) if re.search(options.start, line)), None)
        if at is None:
            return [f"(no line matches from={options.start!r})"] + output
    shown = output[at:]
    cut = options.head is not None and len(shown) > options.head
    if cut:
        shown = shown[:options.head]
    if options.lines is not None:
        kept: list[str] = []
        for line in shown:
            if re.search(options.lines, line):
                kept.append(line)
            elif not kept or kept[-1] != ELIDED:
                kept.append(ELIDED)
        shown = kept
    if at and shown[:1] != [ELIDED]:
        shown = [ELIDED] + shown
    if cut and shown[-1:] != [ELIDED]:
        shown = shown + [ELIDED]
    return shown


def masked(lines: list[str], masks: list[str]) -> list[str]:
    for mask in masks:
        lines = [re.sub(mask, "\x00", line) for line in lines]
    return lines


def missing_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


# --- python blocks ------------------------------------------------------------------------

def _python_runner() -> None:
    """Run the python blocks given as JSON on stdin, one namespace for all; print, as JSON, each
    top-level expression statement's lines, value's repr and printed text."""
    import ast
    import contextlib
    import io
    namespace: dict = {"__name__": "__doc_outputs__"}
    results = []
    for source in json.load(sys.stdin):
        found = []
        try:
            tree = ast.parse(source)
        except SyntaxError as err:
            results.append({"error": f"SyntaxError: {err}"})
            continue
        try:
            for statement in tree.body:
                printed = io.StringIO()
                with contextlib.redirect_stdout(printed):
                    if isinstance(statement, ast.Expr):
                        value = eval(compile(ast.Expression(statement.value), "<doc>", "eval"), namespace)
                        found.append({"first": statement.lineno, "last": statement.end_lineno,
                                      "repr": repr(value), "printed": printed.getvalue(),
                                      "call": isinstance(statement.value, ast.Call)})
                    else:
                        exec(compile(ast.Module([statement], []), "<doc>", "exec"), namespace)
        except Exception as err:      # the block is wrong: say so, with the line
            found.append({"error": f"line {statement.lineno}: {type(err).__name__}: {err}"})
        results.append(found)
    json.dump(results, sys.stdout)


def _wildcard(expected: str, actual: str) -> bool:
    pattern = ".*?".join(re.escape(part) for part in expected.split(ELIDED))
    return re.fullmatch(pattern, actual.strip(), re.DOTALL) is not None


def _comment(line: str) -> str | None:
    """The comment of a line of Python (not inside a string), without the ``#``."""
    import io
    import tokenize
    try:
        for token in tokenize.generate_tokens(io.StringIO(line + "\n").readline):
            if token.type == tokenize.COMMENT:
                return token.string[1:].strip()
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None
    return None


def check_python(sources: list[str], sandbox: Sandbox) -> list[list[str]]:
    """Run the blocks; for each, what is wrong with its commented values (empty: all true)."""
    done = subprocess.run([sys.executable, "-c",
                           f"import sys; sys.path.insert(0, {str(ROOT / 'tools')!r}); "
                           "import doc_outputs; doc_outputs._python_runner()"],
                          input=json.dumps(sources), capture_output=True, text=True,
                          cwd=sandbox.path, env=sandbox.env, timeout=TIMEOUT_S)
    if done.returncode:
        return [[f"the python blocks could not be run: {done.stderr.strip()}"]] * len(sources)
    problems = []
    for source, results in zip(sources, json.loads(done.stdout)):
        lines = source.split("\n")
        wrong = []
        if isinstance(results, dict):
            problems.append([results["error"]])
            continue
        for r in results:
            if "error" in r:
                wrong.append(f"raised at {r['error']}")
                continue
            comment = _comment(lines[r["last"] - 1])
            below = lines[r["last"]].strip() if r["last"] < len(lines) else ""
            if r["call"]:
                if comment is None and below.startswith("#"):
                    comment = below[1:].strip()
                if comment is None or not comment.startswith("->"):
                    continue
                expected, actual = comment[2:].strip(), r["printed"].rstrip("\n")
            else:
                if not comment:
                    continue
                # the value, then maybe words about it: some words from the start must be it
                words = comment.split(" ")
                actual = r["repr"]
                prefixes = [" ".join(words[:k]).strip() for k in range(len(words), 0, -1)]
                expected = next((p for p in prefixes if p and _wildcard(p, actual)), comment)
                if comment.startswith(actual) and not re.match(r"[\w.]", comment[len(actual):]):
                    expected = actual          # followed by punctuation: "(1, 2): the ..."
            if not _wildcard(expected, actual):
                wrong.append(f"line {r['last']}: the comment says {expected!r}, it is {actual!r}")
        problems.append(wrong)
    return problems


# --- a page -------------------------------------------------------------------------------

@dataclass
class Report:
    page: Path
    old: str
    new: str
    problems: list[str] = field(default_factory=list)     # commands that failed, bad markers
    skipped: list[str] = field(default_factory=list)      # blocks skipped, and why
    ran: int = 0                                          # commands run

    def diff(self) -> str:
        name = shown_name(self.page)
        return "".join(difflib.unified_diff(self.old.splitlines(True), self.new.splitlines(True),
                                            f"{name} (on the page)", f"{name} (as the commands print it)"))


def process(page: Path) -> Report:
    """Run a page's commands; the page as it should be, and what went wrong."""
    old = page.read_text(encoding="utf-8")
    lines = old.split("\n")
    report = Report(page, old, old)
    replacements: list[tuple[int, int, list[str]]] = []
    python_blocks: list[Block] = []
    sandbox = None
    try:
        for block in blocks(page, old):
            options = block.options
            if block.marker_error:
                report.problems.append(f"{block.where}: {block.marker_error}")
                continue
            body = lines[block.first:block.end]
            if options.file:
                if sandbox is None:
                    sandbox = Sandbox()
                sandbox.write(options.file, "\n".join(line[len(block.indent):] for line in body) + "\n")
                continue
            if block.lang == "python":
                if options.run:
                    python_blocks.append(block)
                elif options.explicit and not options.skip:
                    report.problems.append(f"{block.where}: a python block takes the marker `run` or `skip`")
                continue
            if block.lang != "console":
                continue
            preamble, found = commands(body)
            ours = [c for c in found if c.kind == "mlsysim"]
            if not ours:
                continue
            if options.skip:
                report.skipped.append(f"{block.where}: {options.skip}")
                continue
            if not options.explicit and any(c.kind == "other" for c in found):
                report.problems.append(
                    f"{block.where}: this block mixes mlsysim-core commands with others "
                    f"({', '.join(c.shell.splitlines()[0] for c in found if c.kind == 'other')}): "
                    "say what to do with a marker, e.g. <!-- doc-output: skip (why) -->")
                continue
            need = missing_modules(options.requires + (["matplotlib"] if any(c.is_plot for c in ours) else []))
            if need:
                report.skipped.append(f"{block.where}: {', '.join(need)} is not installed")
                continue
            if sandbox is None:
                sandbox = Sandbox()
            new_body = list(preamble)
            status, failed = 0, False
            for command in found:
                shown = command.output
                if command.kind == "echo":
                    if not failed:              # else the page keeps what it says
                        shown = [block.indent + str(status)]
                elif command.kind == "mlsysim":
                    try:
                        for path in command.written_paths():
                            sandbox.writable(path)
                    except ValueError as err:
                        report.problems.append(f"{block.where}: {err}")
                        new_body += command.text + shown
                        continue
                    status, output = sandbox.run(command.shell)
                    report.ran += 1
                    failed = status != options.exit
                    if failed:
                        report.problems.append(
                            f"{block.where}: `{command.shell}` exited with {status}, not {options.exit}:\n"
                            + "\n".join("    " + line for line in output[-15:]))
                    elif not options.run_only:
                        fresh = select(output, options)
                        old_shown = [line[len(block.indent):] if line.startswith(block.indent) else line.lstrip()
                                     for line in command.output]
                        if masked(fresh, options.masks) != masked(old_shown, options.masks):
                            shown = [(block.indent + line).rstrip() for line in fresh]
                new_body += command.text + shown
            replacements.append((block.first, block.end, new_body))
        if python_blocks:
            if sandbox is None:
                sandbox = Sandbox()
            sources = ["\n".join(line[len(b.indent):] for line in lines[b.first:b.end]) for b in python_blocks]
            for block, wrong in zip(python_blocks, check_python(sources, sandbox)):
                report.ran += 1
                report.problems += [f"{block.where}: python: {w}" for w in wrong]
    finally:
        if sandbox is not None:
            sandbox.close()
    for first, end, body in reversed(replacements):
        lines[first:end] = body
    report.new = "\n".join(lines)
    return report


def third_party_plugins() -> list[str]:
    from importlib.metadata import entry_points
    return sorted(f"{ep.name} ({ep.dist.name if ep.dist else '?'})" for ep in entry_points(group="mlsysim_core")
                  if ep.dist is None or ep.dist.name.replace("_", "-").lower() != "mlsysim-core")


def list_blocks(page: Path) -> list[str]:
    text = page.read_text(encoding="utf-8")
    lines = text.split("\n")
    out = []
    for block in blocks(page, text):
        if block.lang == "console":
            _, found = commands(lines[block.first:block.end])
            if not any(c.kind == "mlsysim" for c in found):
                continue
            o = block.options
            what = (f"skip ({o.skip})" if o.skip else "run-only" if o.run_only else "generated")
            out.append(f"{block.where}: {what}: " + "; ".join(c.shell.splitlines()[0] for c in found))
        elif block.options.explicit:
            out.append(f"{block.where}: {block.lang or 'text'}: "
                       + ("run" if block.options.run else f"file={block.options.file}" if block.options.file
                          else f"skip ({block.options.skip})"))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pages", nargs="*", type=Path, help="pages to process (default: README.md and docs/*.md)")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 with a diff if a page is stale")
    parser.add_argument("--list", action="store_true", help="list the blocks and what is done with each")
    parser.add_argument("-j", "--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="pages processed at once (default: %(default)s)")
    args = parser.parse_args(argv)
    chosen = [p.resolve() for p in args.pages] or pages()
    if args.list:
        for page in chosen:
            for line in list_blocks(page):
                print(line)
        return 0
    extra = third_party_plugins()
    if extra:
        print(f"doc_outputs: warning: third-party plugins are installed ({', '.join(extra)}): "
              "the outputs may differ from a clean install", file=sys.stderr)
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        reports = list(pool.map(process, chosen))
    stale = failed = 0
    for report in reports:
        name = shown_name(report.page)
        for skipped in report.skipped:
            print(f"skipped {skipped}", file=sys.stderr)
        for problem in report.problems:
            failed += 1
            print(f"error: {problem}", file=sys.stderr)
        if report.new != report.old:
            stale += 1
            if args.check:
                sys.stdout.write(report.diff())
            else:
                report.page.write_text(report.new, encoding="utf-8")
                print(f"updated {name}", file=sys.stderr)
    ran = sum(r.ran for r in reports)
    verdict = (f"{stale} page(s) stale: run python tools/doc_outputs.py" if args.check and stale
               else f"{stale} page(s) updated" if stale else "every output is current")
    print(f"doc_outputs: {ran} commands/blocks run over {len(reports)} pages; {verdict}"
          + (f"; {failed} problem(s)" if failed else ""), file=sys.stderr)
    return 1 if failed or (args.check and stale) else 0


if __name__ == "__main__":
    sys.exit(main())
