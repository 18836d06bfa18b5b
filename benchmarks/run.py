"""Benchmarks: one command, medians and ratios measured in the same run.

    python benchmarks/run.py            # all benchmarks, a table on stdout
    python benchmarks/run.py --json out.json

Measures `solve` (reference and measured profiles, every installed plugin taking part: no
path skips the plugin pipeline; repeated calls and a sweep of distinct calls), `import
mlsysim_core` in fresh processes, the CLI's `estimate` wall time, the inverse solves and
plan searches. Where `mlsysim==0.3.0` is importable in the
same environment (never a dependency; e.g. `pip install mlsysim==0.3.0` in a scratch venv
together with this project), it also times the reference implementation's `solve` on the
same inputs and prints the speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import timeit

CASES = {
    # name: (model, hardware, positional args after hardware, keyword args)
    "golden (Llama-3.1-8B, H100, B=8, s=1024)": ("llama3-8b", "h100", (8, 1024), {}),
    "default (Llama-3.1-8B, H100, B=8)": ("llama3-8b", "h100", (8,), {}),
    "complex (Mixtral, tp2 pp4 dp4 ep8 ZeRO-3, none)": (
        "mixtral-8x7b", "h100", (64, 2048), dict(activation_checkpointing="none", tp_size=2, pp_size=4,
                                                 dp_size=4, ep_size=8, zero_stage=3)),
}


def _median_per_call(fn, number: int, repeat: int = 15) -> float:
    for _ in range(min(number, 300)):
        fn()
    times = timeit.repeat(fn, number=number, repeat=repeat)
    return statistics.median(times) / number


MEASURED_CASES = {
    # the measured profile: single device, then a parallel layout (one pipeline run per rank class)
    "measured, Llama-3.1-8B, H100, B=8, s=2048": ("llama3-8b", "h100", (8, 2048), {}),
    "measured, Llama-3.1-8B, H100, B=8, s=1024": ("llama3-8b", "h100", (8, 1024), {}),
    "measured, parallel: tp2 pp4 dp8, B=64 (3 rank classes)": (
        "llama3-8b", "h100", (64, 2048), dict(tp_size=2, pp_size=4, dp_size=8)),
}


def bench_solve(results: dict) -> None:
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.catalog import get_hardware, get_model
    solver = TrainingMemoryModel()
    for name, (model, hardware, args, kwargs) in CASES.items():
        m, h = get_model(model), get_hardware(hardware)
        results[f"solve: {name}"] = _median_per_call(lambda: solver.solve(m, h, *args, **kwargs), 2000)
    # A sweep: a new global batch every call (2,000 distinct plans, more than the caches hold
    # between two visits), so plans are checked and activation terms built on every call.
    m, h = get_model("llama3-8b"), get_hardware("h100")
    batches = iter(range(1, 10**9))
    results["solve: sweep, a new batch size every call (no repeated plan)"] = _median_per_call(
        lambda: solver.solve(m, h, next(batches), 1024), 2000)
    measured = TrainingMemoryModel("measured")
    for name, (model, hardware, args, kwargs) in MEASURED_CASES.items():
        m, h = get_model(model), get_hardware(hardware)
        results[f"solve: {name}"] = _median_per_call(lambda: measured.solve(m, h, *args, **kwargs), 500)
    model, hardware, args, kwargs = MEASURED_CASES["measured, Llama-3.1-8B, H100, B=8, s=2048"]
    results["solve: measured, Llama-3.1-8B, H100, B=8, s=2048, catalog names"] = _median_per_call(
        lambda: measured.solve(model, hardware, *args, **kwargs), 500)
    bench_uncached(results, measured)
    # The reference implementation, on the same inputs, if installed here.
    try:
        from mlsysim import Hardware, Models
        from mlsysim.engine.solvers.training import TrainingMemoryModel as Reference
    except Exception:
        return
    ref = Reference()
    paths = {"llama3-8b": Models.Language.Llama3_8B, "mixtral-8x7b": Models.Language.Mixtral_8x7B,
             "h100": Hardware.Cloud.H100}
    for name, (model, hardware, args, kwargs) in CASES.items():
        m, h = paths[model], paths[hardware]
        results[f"reference mlsysim 0.3.0 solve: {name}"] = _median_per_call(
            lambda: ref.solve(m, h, *args, **kwargs), 300)


UNCACHED = dict(tp_size=2, pp_size=2, dp_size=8, zero_stage=2)     # benchmarks/uncached.py's layout (issue 27, item 5)
UNCACHED_KEY = "solve: measured, tp2 pp2 dp8 ZeRO-2, a new batch size every call (uncached)"
UNCACHED_TARGET = 40e-6     # issue 27, item 5: <= 40 us (10x fewer than the ~500 us it quotes); docs/performance.md


def bench_uncached(results: dict, measured) -> None:
    """What a measured solve costs when the memo cannot answer it (Llama-3.1-8B, H100, tp2 pp2 dp8
    ZeRO-2, s=2048): a batch size not seen before on a layout seen before (what a sweep or a search
    pays: the per-layout memos answer what does not depend on the batch), and a layout never seen
    before (a new sequence length every call: nothing kept applies), beside the memo hit above."""
    from mlsysim_core.catalog import get_hardware, get_model
    m, h = get_model("llama3-8b"), get_hardware("h100")
    batches = iter(range(10**6, 10**9))
    results[UNCACHED_KEY] = _median_per_call(
        lambda: measured.solve(m, h, 16 * next(batches), 2048, **UNCACHED), 200)
    lengths = iter(range(1024, 10**9, 8))
    results["solve: measured, tp2 pp2 dp8 ZeRO-2, a layout never seen before (new seq_len)"] = _median_per_call(
        lambda: measured.solve(m, h, 16, next(lengths), **UNCACHED), 100, repeat=5)
    results["solve: measured, tp2 pp2 dp8 ZeRO-2, repeated (a memo hit)"] = _median_per_call(
        lambda: measured.solve(m, h, 16, 2048, **UNCACHED), 500)
    import inspect
    from mlsysim_core import solver as pipeline
    solves = inspect.getclosurevars(pipeline._solve).nonlocals["table"]      # the whole solve's memo only

    def floor():       # benchmarks/uncached.py's floor: every other memo answers; the pipeline's own cost
        solves.clear()
        measured.solve(m, h, 16, 2048, **UNCACHED)
    results["solve: measured, tp2 pp2 dp8 ZeRO-2, every memo but the solve's (the pipeline alone)"] = \
        _median_per_call(floor, 200)


def bench_import(results: dict, runs: int = 9) -> None:
    code = "import time; t = time.perf_counter(); import mlsysim_core; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(runs)]
    results["import mlsysim_core (in-process time, fresh interpreter)"] = statistics.median(times)


def bench_plugin_loading(results: dict, runs: int = 7) -> None:
    """Entry-point discovery scans every installed distribution: it happens on first use
    (never at import), once per process."""
    import importlib.metadata
    code = ("import time; t = time.perf_counter(); from mlsysim_core.manager import PluginManager; "
            "PluginManager.from_environment().registry; print(time.perf_counter() - t)")
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(runs)]
    n = len(list(importlib.metadata.distributions()))
    results[f"load plugins + build registry (fresh process, {n} distributions installed)"] = statistics.median(times)


def _wall(command: list[str], runs: int, env=None) -> float:
    walls = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(command, capture_output=True, check=True, env=env)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls)


def bench_cli(results: dict, runs: int = 7) -> None:
    """``estimate`` as a user runs it: the console script pip installed beside this
    interpreter (``mlsysim-core estimate``), else ``python -m mlsysim_core estimate``."""
    script = os.path.join(os.path.dirname(sys.executable), "mlsysim-core")
    exe = [script, "estimate"] if os.path.exists(script) else [sys.executable, "-m", "mlsysim_core", "estimate"]
    shown = "`mlsysim-core estimate`" if exe[0] == script else "`python -m mlsysim_core estimate`"
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        # This environment compiles every module from source in every process (~0.1 s);
        # an installed package has its bytecode (pip compiles it at install). Measure both,
        # the bytecode kept in a scratch directory (PYTHONPYCACHEPREFIX: nothing is
        # written to the tree).
        results[f"CLI {shown} wall time, compiled from source every run"] = _wall(exe, runs)
        import tempfile
        with tempfile.TemporaryDirectory() as cache:
            env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
            env["PYTHONPYCACHEPREFIX"] = cache
            subprocess.run(exe, capture_output=True, check=True, env=env)     # writes the bytecode
            results[f"CLI {shown} wall time"] = _wall(exe, runs, env)
            bench_cli_from(results, exe, shown, runs, env)
    else:
        results[f"CLI {shown} wall time"] = _wall(exe, runs)
        bench_cli_from(results, exe, shown, runs)
    results["python -c pass wall time (the interpreter alone, for scale)"] = _wall([sys.executable, "-c", "pass"], runs)


# `estimate --from` (issue 26: "adds at most 50 ms to estimate's wall time"): the example recipe
# (torchtune's llama3_1/8B_full.yaml, packed at 4096) read from the file, and the same run given as
# flags, timed alternately in one run so both see the same machine load.
FROM_ARGS = ["--from", "examples/launch/recipe.yaml", "--gpus", "8", "-g", "h100"]
AS_FLAGS = ["-m", "meta-llama/llama-3.1-8b", "-g", "h100", "-b", "16", "-s", "4096", "--precision", "bf16",
            "--optimizer", "adamw", "--activation-checkpointing", "full", "--dp", "8", "--data-parallel", "fsdp",
            "--profile", "measured", "--regime", "bf16", "--optimizer-impl", "fused", "--loss", "chunked",
            "--loss-chunks", "8"]


def bench_cli_from(results: dict, exe: list, shown: str, runs: int, env=None) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    walls: dict[str, list[float]] = {"flags": [], "from": []}
    for command in (exe + AS_FLAGS, exe + FROM_ARGS):     # warm both (bytecode, page cache)
        subprocess.run(command, capture_output=True, check=True, env=env, cwd=root)
    for _ in range(runs):
        for name, command in (("flags", exe + AS_FLAGS), ("from", exe + FROM_ARGS)):
            t = time.perf_counter()
            subprocess.run(command, capture_output=True, check=True, env=env, cwd=root)
            walls[name].append(time.perf_counter() - t)
    flags, from_file = statistics.median(walls["flags"]), statistics.median(walls["from"])
    results[f"CLI {shown} wall time, the recipe's run given as flags"] = flags
    results[f"CLI {shown} --from examples/launch/recipe.yaml wall time"] = from_file
    results["CLI estimate --from: added wall time (s; the issue's budget 0.050)"] = from_file - flags


def bench_search(results: dict) -> None:
    try:
        from mlsysim_core import inverse, search
    except ImportError:
        return
    results["inverse: largest micro-batch (Llama-3.1-8B, H100)"] = _median_per_call(
        lambda: inverse.largest_batch("llama3-8b", "h100", seq_len=2048), 20, repeat=5)
    results["inverse: longest sequence (Llama-3.1-8B, H100, B=1)"] = _median_per_call(
        lambda: inverse.longest_sequence("llama3-8b", "h100", batch_size=1), 20, repeat=5)
    for name, (model, devices, batch, *more) in SEARCHES.items():
        options = more[0] if more else {}
        t = time.perf_counter()
        plan = search.search_plans(model, "h100", devices=devices, global_batch=batch, seq_len=4096, **options)
        elapsed = time.perf_counter() - t
        results[f"plan search: {name} (whole search)"] = elapsed
        results[f"plan search: {name}: candidates evaluated"] = plan.candidates
        results[f"plan search: {name}: candidates solved"] = plan.solves
        results[f"plan search: {name}: candidates pruned by a memory bound"] = plan.state_pruned
        results[f"plan search: {name}: candidates per second"] = plan.candidates / elapsed
        if "workers" in options:
            continue
        t = time.perf_counter()     # the same search in this process only (no worker processes)
        search.search_plans(model, "h100", devices=devices, global_batch=batch, seq_len=4096, workers=1, **options)
        results[f"plan search: {name}, in-process (workers=1)"] = time.perf_counter() - t


SEARCH_TARGET = ("Mixtral-8x7B on 128 H100, B=1024, measured, 2 workers", 100_000, 2.0)   # issue 27 item 5


def search_target_line(results: dict) -> str | None:
    """Issue 27 item 5's search target against this run: >= 100,000 layouts in <= 2 s."""
    name, layouts, seconds = SEARCH_TARGET
    took, found = results.get(f"plan search: {name} (whole search)"), results.get(f"plan search: {name}: "
                                                                                  "candidates evaluated")
    if took is None:
        return None
    return (f"measured search: {found:,.0f} layouts in {took:.1f} s, {took / seconds:.1f}x issue 27 item 5's "
            f"target ({layouts:,} in {seconds:.0f} s; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")


SEARCHES = {   # model, H100s, global batch (seq 4096)[, search options]; every layout incl. cp, every dp rule
    # and strategy
    "Llama-3-70B on 64 H100, B=512": ("llama3-70b", 64, 512),
    "Mixtral-8x7B on 128 H100, B=1024": ("mixtral-8x7b", 128, 1024),
    # issue 17's speed case: the measured profile, two worker processes
    "Mixtral-8x7B on 128 H100, B=1024, measured, 2 workers": ("mixtral-8x7b", 128, 1024,
                                                               {"profile": "measured", "workers": 2}),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the numbers to this file")
    args = parser.parse_args()
    results: dict[str, float] = {}
    bench_solve(results)
    bench_import(results)
    bench_plugin_loading(results)
    bench_cli(results)
    bench_search(results)
    print(f"{'benchmark':<70} {'median':>14}")
    for name, value in results.items():
        if "candidates" in name:
            print(f"{name:<70} {value:>14,.0f}")
        elif value < 1e-3:
            print(f"{name:<70} {value * 1e6:>11.2f} us")
        else:
            print(f"{name:<70} {value * 1e3:>11.2f} ms")
    for name in CASES:
        ours, ref = results.get(f"solve: {name}"), results.get(f"reference mlsysim 0.3.0 solve: {name}")
        if ours and ref:
            print(f"speed-up vs reference, {name}: {ref / ours:.0f}x")
    if results.get(UNCACHED_KEY):
        print(f"uncached measured solve: {results[UNCACHED_KEY] / UNCACHED_TARGET:.1f}x issue 27 item 5's target "
              f"({UNCACHED_TARGET * 1e6:.0f} us; instructions per solve: benchmarks/uncached.py)")
    if search_target_line(results):
        print(search_target_line(results))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
