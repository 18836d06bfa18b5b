"""QA findings on the command line, third round: catalog errors without tracebacks, one
profile per picture, sweeps that never trip over their own defaults, headers and notes
that `fit` and the plots share with `estimate`, scenarios that keep their files, and
repeated flags refused."""

import io
import json
import os
from pathlib import Path

import pytest

from mlsysim_core.cli import main


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def error_of(capsys, *argv):
    """(exit code, the stderr text) of a command that fails."""
    capsys.readouterr()
    code, _ = run(*argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return code, err.strip()


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
