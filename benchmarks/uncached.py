"""The uncached solve that issue 24's and issue 27's (item 5) speed targets name: Llama-3.1-8B on an
H100, tp2 pp2 dp8 ZeRO-2, every call at a batch size not seen before (no memo hit for the solve;
what is kept per layout still applies), after one warm-up solve.

    python benchmarks/uncached.py PROFILE N [layout | floor]    # PROFILE: reference or measured

With ``layout``, every call is a layout never seen before instead (a new sequence length:
none of the per-layout memos applies), the other figure ``benchmarks/run.py`` reports.

With ``floor``, every call is the warm-up's solve again with only the whole solve's memo cleared
(``solver._solve``'s table): every other memo answers (the terms kept per layout, the activations
kept per plan, the layer kept per token count, ...). What it costs is the pipeline itself (the
checks, the profile's ``prepare``, the rules' placement, every hook called and every term checked,
sorted and combined, a result per rank) with no formula evaluated again (its memo hits compare
equal plans field by field, a little more than the pipeline alone): about the least a solve at a
new batch size can cost while the core runs that pipeline for it, whatever the profile keeps
(docs/performance.md, issue 27 item 5).

Count it with callgrind, twice, and take the difference (imports and plugin loading cancel):

    PYTHONHASHSEED=0 setarch $(uname -m) -R valgrind --tool=callgrind \\
        --callgrind-out-file=/dev/null python benchmarks/uncached.py measured 25
    (the same with 5; instructions per solve = (count(25) - count(5)) / 20)

Run each tree once first (``... measured 1``): a file compiled during one of the two counted runs
(a changed ``.py`` whose ``__pycache__`` is stale) adds its compilation to that run's count.

To compare a revision, check it out into a worktree and put it first on PYTHONPATH
(``PYTHONPATH=TREE:TREE/plugins``), as benchmarks/instructions.py does.
"""

import sys

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.catalog import get_hardware, get_model


def main(profile: str, n: int, mode: str = "") -> None:
    model, gpu = get_model("llama3-8b"), get_hardware("h100")
    layout = dict(tp_size=2, pp_size=2, dp_size=8, zero_stage=2)
    solver = TrainingMemoryModel(profile)
    solver.solve(model, gpu, 16, 2048, **layout)          # warm-up: plugins loaded
    if mode == "floor":
        import inspect
        from mlsysim_core import solver as pipeline
        solves = inspect.getclosurevars(pipeline._solve).nonlocals["table"]     # the whole solve's memo only
        for _ in range(n):
            solves.clear()
            solver.solve(model, gpu, 16, 2048, **layout)
        return
    for i in range(n):
        if mode == "layout":
            solver.solve(model, gpu, 16, 2056 + 8 * i, **layout)
        else:
            solver.solve(model, gpu, 16 * (i + 2), 2048, **layout)


if __name__ == "__main__":
    if sys.argv[3:] not in ([], ["layout"], ["floor"]):
        sys.exit(f"usage: {sys.argv[0]} PROFILE N [layout | floor]; got {' '.join(sys.argv[3:])!r}")
    main(sys.argv[1], int(sys.argv[2]), "".join(sys.argv[3:]))
