"""Instructions executed per workload, counted by valgrind (not affected by the machine's load).

    python benchmarks/instructions.py                  # the working tree
    python benchmarks/instructions.py 9a4c57f HEAD     # git revisions, side by side

Wall-clock timings on a shared machine move by about +-25 % from run to run; instruction
counts do not, so they are how two versions are compared here. Each workload is run in
two fresh processes that differ only in how many times it repeats (the difference is the
cost of the extra repeats: imports, plugin loading and warm-up cancel out), under
``valgrind --tool=callgrind`` with ``PYTHONHASHSEED=0`` and address randomisation off.
Counts of one build still vary by a few per cent between processes (the memory layout
changes which id-keyed cache entries collide), so each is the lowest of ``--runs`` tries.

Revisions are checked out into temporary git worktrees and imported from there (the
plugins' entry points come from the installed distribution; their modules from the
worktree). Needs valgrind.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

WORKLOADS = {
    # name: (what one repeat is, repeats in the short run, repeats in the long run)
    "search": ("a reduced plan search: Mixtral-8x7B on 128 H100, B=1024, seq 4096, dp rules zero1 and fsdp, "
               "checkpointing selective and none (20,640 layouts, 14,570 solved), in-process", 1, 2),
    "solve": ("a repeated golden-case solve (Llama-3.1-8B, H100, B=8, s=1024) plus a repeated Mixtral "
              "tp2 pp4 dp4 ep8 ZeRO-3 solve, reference profile", 1000, 3000),
}


def run_workload(name: str, repeats: int) -> None:
    """What one process counts (run by valgrind)."""
    from mlsysim_core import TrainingMemoryModel, search
    from mlsysim_core.catalog import get_hardware, get_model
    if name == "search":
        for _ in range(repeats):
            search.search_plans("mixtral-8x7b", "h100", devices=128, global_batch=1024, seq_len=4096, workers=1,
                                data_parallel=("zero1", "fsdp"), checkpointing=("selective", "none"))
    else:
        solver = TrainingMemoryModel()
        llama, mixtral, h100 = get_model("llama3-8b"), get_model("mixtral-8x7b"), get_hardware("h100")
        for _ in range(repeats):
            solver.solve(llama, h100, 8, 1024)
            solver.solve(mixtral, h100, 64, 2048, activation_checkpointing="none", tp_size=2, pp_size=4, dp_size=4,
                         ep_size=8, zero_stage=3)


def _count(tree: str, name: str, repeats: int) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0",
           "PYTHONPATH": os.pathsep.join([tree, os.path.join(tree, "plugins")])}
    command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
               "--workload", name, str(repeats)]
    arch = os.uname().machine
    command = ["setarch", arch, "-R", *command]      # address randomisation off
    out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, check=True).stderr
    return int(re.search(r"Collected : (\d+)", out).group(1))


def count(tree: str, name: str, runs: int) -> float:
    """Instructions per repeat of ``name`` in ``tree`` (the lowest of ``runs`` tries)."""
    _, short, long = WORKLOADS[name]
    # One plain run first: where bytecode is written, the first process compiles the sources
    # and the next one does not, which would not cancel out.
    subprocess.run([sys.executable, __file__, "--workload", name, str(short)], cwd=tree, check=True,
                   env={**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.path.join(tree, "plugins")])})
    return min((_count(tree, name, long) - _count(tree, name, short)) / (long - short) for _ in range(runs))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("revisions", nargs="*", help="git revisions (default: the working tree)")
    parser.add_argument("--runs", type=int, default=2, help="tries per count; the lowest is kept")
    parser.add_argument("--workload", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        run_workload(args.workload[0], int(args.workload[1]))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory() as scratch:
        trees = {}
        for rev in args.revisions:
            tree = os.path.join(scratch, re.sub(r"\W", "_", rev))
            subprocess.run(["git", "-C", here, "worktree", "add", "--detach", tree, rev], check=True,
                           capture_output=True)
            trees[rev] = tree
        trees = trees or {"working tree": here}
        try:
            counts = {rev: {name: count(tree, name, args.runs) for name in WORKLOADS} for rev, tree in trees.items()}
        finally:
            for tree in trees.values():
                if tree != here:
                    subprocess.run(["git", "-C", here, "worktree", "remove", "--force", tree], capture_output=True)
    for name, (what, _, _) in WORKLOADS.items():
        print(f"{name}: {what}")
        first = None
        for rev, by_name in counts.items():
            value = by_name[name]
            change = f"  ({(value / first - 1) * 100:+.1f} %)" if first else ""
            print(f"  {rev:<14} {value:>16,.0f} instructions per repeat{change}")
            first = first or value
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
