"""Measure the architecture families' training iterations with PyTorch's own tracker.

Each family has a directory here with a ``configs.py`` whose ``CONFIGS`` list has the schema
of ``validation/configs.py`` (``id``, ``family``, ``model``, ``hf_config``, ``batch_size``,
``seq_len``, ``regime``, ``optimizer``, ``optimizer_impl``, ``checkpointing``, ``attention``,
``dropout``, ``method``: ``real`` at small sizes, ``fake`` (FakeTensorMode) at public shapes).
Each run is measured with ``validation/measure.py``'s protocol (three iterations, the third
measured; every phase's peak) and written to that directory's ``measurements.json``.

    /tmp/valvenv/bin/python validation/families/measure_families.py gemma
    /tmp/valvenv/bin/python validation/families/measure_families.py gemma --only ID [ID ...]

(``python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt``:
torch==2.13.0 CPU build, transformers==5.23.0.)
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import measure as harness  # noqa: E402  (validation/measure.py)


def family_configs(family: str) -> list[dict]:
    path = HERE / family / "configs.py"
    spec = importlib.util.spec_from_file_location(f"family_configs_{family}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.CONFIGS)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("family", help="the family directory under validation/families/")
    ap.add_argument("--only", nargs="+", metavar="ID", help="measure only these ids (merged into the file)")
    args = ap.parse_args(argv)
    import torch
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    configs = family_configs(args.family)
    by_id = {c["id"]: c for c in configs}
    unknown = [i for i in args.only or () if i not in by_id]
    if unknown:
        ap.error(f"unknown configuration ids: {unknown}")
    todo = [by_id[i] for i in args.only] if args.only else configs
    out = HERE / args.family / "measurements.json"
    previous = harness.previous_runs(str(out), harness._versions())[0] if args.only else {}
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = harness.measure(cfg)
            m = run["measured"]
            msg = f"peak {m['peak_bytes'] / 2**20:10.1f} MiB in {m['peak_phase']:<9} ({m['peak_op']}) {m['wall_s']:6.1f}s"
        except Exception as e:  # record and go on
            run["error"] = f"{type(e).__name__}: {e}".strip()[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = f"ERROR {run['error'][:300]}"
            gc.collect()
        results[cfg["id"]] = run
        print(f"[{n:3d}/{len(todo)}] {cfg['method']:<4} {cfg['id']:<50} {msg}", flush=True)
    runs = [results.get(c["id"]) or previous.get(c["id"]) for c in configs]
    doc = {"generator": f"/tmp/valvenv/bin/python validation/families/measure_families.py {args.family}",
           "environment": "python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt",
           "python": platform.python_version(), **harness._versions(),
           "runs": [r for r in runs if r is not None]}
    out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
