"""Helpers for tests that run the CLI in process."""

from __future__ import annotations

import io

from mlsysim_core.cli import main


def run(*argv):
    """(exit code, stdout) of ``mlsysim-core ARGV``, in this process."""
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def error_of(capsys, *argv):
    """(exit code, the stderr text) of a command that fails; never a traceback."""
    capsys.readouterr()
    code, _ = run(*argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip()
