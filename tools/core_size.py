"""The framework core's size, as issue 14 counts it (and issue 24, item 6, restates): every line
of the .py files in mlsysim_core except catalog/ and the edge modules (CLI, rendering, plots,
HF import, search, inverse solves, scenarios, fine-tuning configs, the conformance kit). The
planner's physics and the technique ladder are not edge modules: in mlsysim_core they count.

    python tools/core_size.py        # prints each file and the total; exit 1 over the limits
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "mlsysim_core"
EDGE = {"cli.py", "render.py", "plots.py", "hf.py", "search.py", "inverse.py", "scenario.py", "finetune.py",
        "testing.py", "__main__.py"}
CORE_LIMIT, SOLVER_LIMIT = 2000, 500


def core_files() -> list[Path]:
    return sorted(p for p in ROOT.rglob("*.py")
                  if p.relative_to(ROOT).parts[0] != "catalog" and p.name not in EDGE)


def lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def main() -> int:
    total = 0
    for path in core_files():
        n = lines(path)
        total += n
        print(f"{n:6d}  {path.relative_to(ROOT.parent)}")
    solver = lines(ROOT / "solver.py")
    print(f"{total:6d}  total (limit {CORE_LIMIT}); solver.py {solver} (limit {SOLVER_LIMIT})")
    return 0 if total <= CORE_LIMIT and solver <= SOLVER_LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
