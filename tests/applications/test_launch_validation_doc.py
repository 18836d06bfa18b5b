"""docs/launch.md's validation table is what tools/launch_validation.py prints (issue 26)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long     # (a subprocess check)
def test_the_table_is_the_tools_output():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "launch_validation.py")], capture_output=True,
                         text=True, check=True).stdout
    page = (ROOT / "docs" / "launch.md").read_text()
    recorded = page.split("<!-- launch-validation -->\n", 1)[1].split("<!-- /launch-validation -->", 1)[0]
    assert recorded == out
    packed = next(line for line in out.splitlines() if "+ packed dataset" in line)
    error = float(packed.split("|")[5].strip().rstrip("%").strip())
    assert abs(error) <= 5.0      # the like-with-like row (allocated vs active) within the 5 %


@pytest.mark.long     # (a subprocess check)
def test_the_torchtitan_row_with_the_launchers_environment():
    """torchtitan's FSDP row read as its TOML gives the profile's 5 % reserve (-12.2 %); with the environment
    the published run had (run_llama_train.sh: expandable segments), the caching allocator's mechanism brings it
    within the issue's 10 % of reserved."""
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "launch_validation.py")], capture_output=True,
                         text=True, check=True).stdout
    rows = [line for line in out.splitlines() if "torchtitan/llama3/llama3_8b.toml" in line]
    errors = {("env:" in line): float(line.split("|")[5].strip().rstrip("%").strip()) for line in rows}
    assert errors == {False: -12.2, True: -8.6}
