"""Real pip installs into throwaway virtualenvs, offline, for the plugin-install tests.

A virtualenv made here sees the host's site-packages (pluggy, attrs, cattrs, pytest and the
editable mlsysim-core with its entry points) through a ``.pth`` file, so installing a plugin
wheel downloads nothing. Commands run with a clean environment (no MLSYSIM_*, PIP_* or
PYTHON* variables from the caller) and fail the test with their output when they fail.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

TIMEOUT = 180


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLSYSIM_", "PIP_", "PYTHON", "PYTEST_")) and k != "VIRTUAL_ENV"}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_CONFIG_FILE=os.devnull,
               PYTHONDONTWRITEBYTECODE="1")
    return env


def run(cmd, *, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=TIMEOUT)
    if check and proc.returncode != 0:
        pytest.fail(f"command failed ({proc.returncode}): {' '.join(map(str, cmd))}\n"
                    f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def host_site_dirs() -> list[str]:
    """Where the host finds pluggy, attrs, cattrs, pytest and mlsysim-core (with its entry points)."""
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    for name in ("mlsysim-core", "pluggy", "attrs", "cattrs", "pytest"):
        dirs.append(str(Path(importlib.metadata.distribution(name).locate_file("")).resolve()))
    out = []
    for d in dirs:
        if d not in out and Path(d).is_dir():
            out.append(d)
    return out


def pip_supports_python_option() -> bool:
    """``pip --python`` (install into another interpreter) needs pip >= 22.3."""
    try:
        import pip
    except ImportError:
        return False
    parts = [int("".join(ch for ch in piece if ch.isdigit()) or 0) for piece in pip.__version__.split(".")[:2]]
    return tuple(parts) >= (22, 3)


def build_wheels(sources, out: Path, cwd: Path) -> None:
    """Build packages into wheels with the host's hatchling, offline."""
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
         "--quiet", "-w", out, *sources], cwd=cwd)


class Venv:
    """A virtualenv that sees the host's packages; plugins are pip-installed into it."""

    def __init__(self, root: Path):
        venv.EnvBuilder(with_pip=False, symlinks=os.name != "nt", clear=True).create(root)
        self.root = root
        self.python = root / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
        purelib = run([self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                      cwd=root).stdout.strip()
        self.site_packages = Path(purelib)
        lines = [f"import site; site.addsitedir({d!r})" for d in host_site_dirs()]
        (self.site_packages / "_mlsysim_host_site.pth").write_text("\n".join(lines) + "\n")

    def install(self, *wheels: Path) -> None:
        common = ["install", "--no-index", "--no-deps", "--quiet"]
        if pip_supports_python_option():
            run([sys.executable, "-m", "pip", "--python", self.python, *common, *wheels], cwd=self.root)
        else:   # pip < 22.3: install from the host straight into the venv's site-packages
            run([sys.executable, "-m", "pip", *common, "--target", self.site_packages, *wheels], cwd=self.root)

    def python_json(self, code: str):
        """Run code in the venv; it prints one JSON document as its last line."""
        proc = run([self.python, "-c", textwrap.dedent(code)], cwd=self.root)
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run([self.python, "-m", "mlsysim_core", *args], cwd=self.root, check=check)

    def cli_json(self, *args: str) -> dict:
        return json.loads(self.cli("estimate", *args, "--json").stdout)
