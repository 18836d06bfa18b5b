"""The published reserved-memory rows against the two ways of pricing the caching allocator's reserve.

    python validation/reserved/published.py          # writes published_results.json, prints the table
    python validation/reserved/published.py --doc    # the table of docs/validation.md (from the JSON)

The rows: torchtitan's Llama 3.1 8B FSDP benchmark (``validation/published/torchtitan_llama3_8b.py`` says
what they ran and why they are expressed as they are: regime fsdp-bf16, FSDP, op-SAC, AdamW foreach, local
batch 2, sequence 8192, an H100 with 96 GB; "FSDP + torch.compile" as ``compile="blocks"``; torchtitan's
``run_llama_train.sh`` sets ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``). Their metric is
``reserved_bytes.all.peak``; the prediction is the total without the CUDA context and NCCL's buffers (not in
it). Two reserves: ``allocator="fraction"`` (5 % of the peak allocated, the default) and
``allocator="segments"`` with expandable segments (``measured/allocator.py``). torchtune's published figures
are "peak memory active" (allocated blocks), not reserved: no torchtune row is compared here.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "published_results.json"
GIB = 2**30


def _torchtitan():
    path = HERE.parent / "published" / "torchtitan_llama3_8b.py"
    spec = importlib.util.spec_from_file_location("torchtitan_llama3_8b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RESERVES = {"fraction": {"cuda_context": 0, "nccl_buffers": 0},
            "segments": {"cuda_context": 0, "nccl_buffers": 0, "allocator": "segments", "expandable_segments": True}}


def rows() -> list[dict]:
    t = _torchtitan()
    out = []
    for table, name, gpus, published, why_not in t.ROWS:
        if why_not is not None:
            continue
        extra = t.COMPILED.get(name, {})
        row = {"source": f"torchtitan {table}", "row": name, "gpus": gpus, "published_gib": published}
        for kind, overheads in RESERVES.items():
            total = t.predict(gpus, overheads, **extra)
            row[kind] = {"bytes": int(total), "error": round(total / GIB / published - 1, 6)}
        out.append(row)
    return out


def table(doc: dict) -> str:
    lines = ["| published row | GPUs | published reserved GiB | 5 % reserve GiB | error | segments GiB | error |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        f, s = r["fraction"], r["segments"]
        lines.append(f"| {r['source']}, {r['row']} | {r['gpus']} | {r['published_gib']:.1f} | "
                     f"{f['bytes'] / GIB:.2f} | {f['error']:+.1%} | {s['bytes'] / GIB:.2f} | {s['error']:+.1%} |")
    stats = {}
    for kind in ("fraction", "segments"):
        errors = [abs(r[kind]["error"]) for r in doc["rows"]]
        stats[kind] = f"{sum(errors) / len(errors):.1%} / {max(errors):.1%}"
    lines.append(f"| mean / max abs error | | | | {stats['fraction']} | | {stats['segments']} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if "--doc" in argv:
        print(table(json.loads(RESULTS.read_text())))
        return
    doc = {"generator": "python validation/reserved/published.py", "rows": rows()}
    RESULTS.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(table(doc))


if __name__ == "__main__":
    main()
