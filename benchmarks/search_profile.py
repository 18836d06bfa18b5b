"""Where a measured search's time goes (issue 27 item 5): the layouts, the solves, what was pruned, and
the CPU seconds in the memory solves, the step times and the search's own work, in-process.

    python benchmarks/search_profile.py                 # Mixtral-8x7B on 128 H100, B=1024, s=4096
    python benchmarks/search_profile.py --devices 16 --global-batch 64 --model llama3-70b

cProfile adds its overhead to every call, the shares are what to read; `benchmarks/run.py` times the
search without it (two workers).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import time
from collections import Counter

from mlsysim_core import search
from mlsysim_core.catalog import get_hardware

# (what the time is spent on, the functions whose cumulative time counts it)
PARTS = (("memory solves (solve_plan)", ("solve_plan",)), ("layout checks (check_plan)", ("check_plan",)),
         ("step times (the step-time model's time)", ("time_layout",)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mixtral-8x7b")
    parser.add_argument("--hardware", default="h100")
    parser.add_argument("--devices", type=int, default=128)
    parser.add_argument("--global-batch", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=4096)
    args = parser.parse_args()
    kwargs = dict(devices=args.devices, global_batch=args.global_batch, seq_len=args.seq_len, profile="measured",
                  workers=1)
    search.search_plans(args.model, args.hardware, **{**kwargs, "devices": 8, "global_batch": 8})   # (imports, memos)
    kinds: Counter = Counter()      # (fit, with its terms, at gas = 1) -> solves
    solve, limit = search.solve_plan, get_hardware(args.hardware).memory_capacity * 1e-9

    def counted(registry, plan, options, total_only=False):
        result = solve(registry, plan, options, total_only=total_only)
        total = result if total_only else result.total_memory
        kinds[total * 1e-9 <= limit, not total_only, plan.gradient_accumulation_steps == 1] += 1
        return result
    search.solve_plan = counted
    profiler = cProfile.Profile()
    started = time.perf_counter()
    profiler.enable()
    found = search.search_plans(args.model, args.hardware, **kwargs)
    profiler.disable()
    wall = time.perf_counter() - started
    stats = pstats.Stats(profiler).stats
    print(f"{args.model} on {args.devices} x {args.hardware}, B={args.global_batch}, s={args.seq_len}, measured, "
          f"in-process under cProfile: {wall:.1f} s ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f})")
    print(f"  {'layouts enumerated':<26}{found.candidates:>9,}")
    print(f"  {'solved':<26}{found.solves:>9,} (the state bounds' extra solves included)")
    print(f"  {'pruned by a bound':<26}{found.state_pruned:>9,} (search.state_bytes, search.without_gradients)")
    print(f"  {'pruned by the micro-batch':<26}{found.candidates - found.solves - found.state_pruned:>9,} "
          "(about: or rejected by the rules)")
    print(f"  fit {len(found.fits):,}, on the Pareto front {len(found.pareto)}")
    fit = sum(v for k, v in kinds.items() if k[0])
    print(f"  solves that fit {fit:,} (the rows before one row per answer), that did not "
          f"{found.solves - fit:,}: {sum(v for k, v in kinds.items() if not k[0] and k[2]):,} of them at gas = 1; "
          f"{sum(v for k, v in kinds.items() if k[1]):,} solves with their terms (for a bound)")
    for label, names in PARTS:
        seconds = max((v[3] for (_, _, name), v in stats.items() if name in names), default=0.0)
        print(f"  {label:<42} {seconds:>7.1f} s  {seconds / wall:>5.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
