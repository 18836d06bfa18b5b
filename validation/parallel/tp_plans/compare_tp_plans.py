#!/usr/bin/env python
"""The measured profile's per-rank, per-phase prediction against measurements.json (no torch needed).

    python3 validation/parallel/tp_plans/compare_tp_plans.py            # every run, every phase, then per-layer split
    python3 validation/parallel/tp_plans/compare_tp_plans.py --json     # the rows as JSON

Each run is solved as the run was made: ``TrainingMemoryModel("measured").solve(from_hf_config(run["hf_config"]),
b, s, regime=bf16|fp32, optimizer="adamw", optimizer_impl="foreach", attention="sdpa",
activation_checkpointing="none", tp_size=tp, dp_size=1, sequence_parallel=<the plan's>, runtime_overheads=False,
device="cpu")``; ``result.ranks[0].phase_totals`` (rank 0, the rank measured). The profile has no option for loss
parallelism (vocab-sharded logits and cross-entropy) nor for which modules a plan shards; those show up as
differences. Phases compared (each error relative to that phase's measured bytes):

| measured (rank 0)                      | predicted               |
|----------------------------------------|-------------------------|
| ``peak_by_phase.forward``              | ``forward``             |
| ``peak_by_phase.backward``             | ``backward``            |
| ``peak_by_phase.backward_embedding``   | ``backward_end``        |
| ``peak_by_phase.optimizer``            | ``optimizer_step``      |
| ``peak_bytes``                         | ``total_memory``        |

Every difference (measured - predicted) is also written as a multiple of the sizes a mechanism would add, where one
fits: T·h·B (one residual-stream tensor), T·V·4 (one fp32 logits tensor), V·h·B (the embedding or LM head), ...,
full or divided by tp (T = b·s tokens, B = the dtype's bytes). With L = 2 and 4 layers of the same plan and tp, the
difference is split into a per-layer part, (d(L=4) - d(L=2)) / 2, and a layer-independent part, d(L=2) - 2·that.
"""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
PHASES = (("forward", "forward"), ("backward", "backward"), ("backward_end", "backward_embedding"),
          ("optimizer_step", "optimizer"))
GiB = 2**30


def load(path: Path | None = None) -> dict:
    return json.loads((path or HERE / "measurements.json").read_text())


def solve(run: dict):
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    model = from_hf_config(run["hf_config"], name=run["model"])
    return TrainingMemoryModel("measured").solve(
        model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"], run["seq_len"],
        precision="fp32", optimizer=run["optimizer"], optimizer_impl=run["optimizer_impl"],
        attention=run["attention"], activation_checkpointing="none", regime=run["regime"],
        tp_size=run["tp"], dp_size=1, sequence_parallel=run["plan"]["sequence_parallel"], loss_parallel=run["plan"].get("loss_parallel", False),
        runtime_overheads=False, device="cpu")


def measured_phases(m: dict) -> dict:
    return {ph: m["peak_by_phase"][key]["bytes"] for ph, key in PHASES}


def units(run: dict) -> dict[str, int]:
    """Sizes of the tensors a TP mechanism adds or removes (bytes), for naming a difference."""
    c = run["hf_config"]
    T = run["batch_size"] * run["seq_len"]
    h, V, tp = c["hidden_size"], c["vocab_size"], run["tp"]
    B = 2 if run["regime"] == "bf16" else 4
    return {"T·h·B": T * h * B, "T·V·4": T * V * 4, "T·V·B": T * V * B, "V·h·B": V * h * B,
            "T·f·B": T * c["intermediate_size"] * B, "T·4": T * 4, "T·8": T * 8, "tp": tp}


def name_bytes(d: float, run: dict, tol: float = 2e-4) -> str:
    """``d`` as k x unit (under 64 KiB: ~0) with k a multiple of 1/tp, |numerator| <= 64, within 0.02 % + 64 KiB (first fit in a fixed order; a hint, not a proof), else ''."""
    if abs(d) < 65536:
        return "~0 (< 64 KiB)"
    u = units(run)
    tp = u.pop("tp")
    for name in ("T·V·4", "T·V·B", "V·h·B", "T·h·B", "T·f·B", "T·8", "T·4"):  # the likelier mechanism first
        size = u[name]
        k = Fraction(round(d / size * tp), tp)
        if k != 0 and abs(k.numerator) <= 64 and abs(float(k) * size - d) <= tol * abs(d) + 65536:
            return f"{k} x {name}" if k.denominator != 1 else f"{k.numerator} x {name}"
    return ""


def rows(data: dict) -> list[dict]:
    out = []
    for run in data["runs"]:
        result = solve(run)
        rank = result.ranks[0] if result.ranks else result
        pred = dict(rank.phase_totals)
        # The measured backward phase runs to the embedding's backward (its own row too): its
        # peak is the larger of the prediction's loss moment and backward end.
        pred["backward"] = max(pred["backward"], pred["backward_end"])
        meas = measured_phases(run["measured"])
        base = dict(id=run["id"], plan=run["plan"]["name"], model=run["model"], layers=run["layers"], tp=run["tp"],
                    sequence_parallel=run["plan"]["sequence_parallel"], loss_parallel=run["plan"]["loss_parallel"])
        for ph, _ in PHASES:
            d = meas[ph] - pred[ph]
            out.append(dict(base, phase=ph, measured=meas[ph], predicted=int(pred[ph]), diff=int(d),
                            error=pred[ph] / meas[ph] - 1, named=name_bytes(d, run)))
        m = run["measured"]["peak_bytes"]
        d = m - result.total_memory
        out.append(dict(base, phase="peak", measured=m, predicted=int(result.total_memory), diff=int(d),
                        error=result.total_memory / m - 1, named=name_bytes(d, run),
                        measured_phase=run["measured"]["peak_phase"], predicted_phase=result.peak_phase))
    return out


def per_layer_split(data: dict, table: list[dict]) -> list[dict]:
    """For each (plan, model-without-L, tp, phase) with L = 2 and 4: the per-layer and layer-independent parts."""
    runs = {r["id"]: r for r in data["runs"]}
    by = {}
    for r in table:
        if not r["model"].startswith("llama-3-8b-L"):
            continue
        by.setdefault((r["plan"], r["tp"], r["phase"]), {})[r["layers"]] = r
    out = []
    for (plan, tp, ph), d in sorted(by.items()):
        if 2 not in d or 4 not in d:
            continue
        per_layer = (d[4]["diff"] - d[2]["diff"]) / 2
        const = d[2]["diff"] - 2 * per_layer
        run = runs[d[2]["id"]]
        out.append(dict(plan=plan, tp=tp, phase=ph, per_layer=per_layer, constant=const,
                        per_layer_named=name_bytes(per_layer, run), constant_named=name_bytes(const, run)))
    return out


DOC_BEGIN = "<!-- BEGIN TP plan table: generated by validation/parallel/tp_plans/compare_tp_plans.py --doc -->"
DOC_END = "<!-- END TP plan table -->"


def doc_table(table: list[dict]) -> str:
    """The per-plan summary docs/validation.md shows: per plan and phase, runs, median and max abs. error."""
    import statistics
    lines = [DOC_BEGIN, "",
             "Per rank (rank 0; the TP ranks are identical), every phase, against the measured profile solved with the "
             "plan's `sequence_parallel` and `loss_parallel` (`python validation/parallel/tp_plans/compare_tp_plans.py "
             "--doc` regenerates this table; `tests/validation/test_validation_tp_plans.py` checks it and the targets: median at "
             "most 5 %, max at most 10 %). Llama-3-8B shapes (bf16, b=1, s=2048, 2 and 4 layers, tp 2, 4, 8) and a "
             "125M Llama with 4 KV heads (fp32, tp 4); sources of each plan: validation/parallel/tp_plans/README.md.",
             "", "| plan | SP | loss parallel | runs | phase | median abs. error | max abs. error |",
             "|---|---|---|---|---|---|---|"]
    for plan in dict.fromkeys(r["plan"] for r in table):
        mine = [r for r in table if r["plan"] == plan]
        ids = {r["id"] for r in mine}
        for phase in ("forward", "backward", "backward_end", "optimizer_step", "peak"):
            errs = [abs(r["error"]) for r in mine if r["phase"] == phase]
            lines.append(f"| {plan} | {'on' if mine[0]['sequence_parallel'] else 'off'} | "
                         f"{'on' if mine[0]['loss_parallel'] else 'off'} | {len(ids)} | {phase} | "
                         f"{100 * statistics.median(errs):.3f} % | {100 * max(errs):.3f} % |")
    return "\n".join(lines + ["", DOC_END])


def update_doc(table: list[dict], check: bool) -> int:
    """Write the table into docs/validation.md (``check``: exit status 1 if it is stale), with
    validation/report.py's section writer."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from report import DOC, update_doc as write_section, write_or_check
    new = write_section(doc_table(table), DOC, begin=DOC_BEGIN, end=DOC_END,
                        heading="Tensor-parallel plans: every phase of a rank against PyTorch")
    return write_or_check(new, check, "parallel/tp_plans/compare_tp_plans.py --doc", DOC)


def main() -> int:
    data = load()
    table = rows(data)
    if "--doc" in sys.argv or "--check" in sys.argv:
        return update_doc(table, "--check" in sys.argv)
    if "--json" in sys.argv:
        print(json.dumps({"rows": table, "per_layer_split": per_layer_split(data, table)}, indent=1))
        return 0
    print(f"{'plan':<12}{'model':<17}{'tp':>3} {'phase':<15}{'measured B':>16}{'predicted B':>16}"
          f"{'meas-pred B':>15}{'err':>9}  named")
    for r in table:
        extra = f"  ({r['measured_phase']} / {r['predicted_phase']})" if r["phase"] == "peak" else ""
        print(f"{r['plan']:<12}{r['model']:<17}{r['tp']:>3} {r['phase']:<15}{r['measured']:16,d}{r['predicted']:16,d}"
              f"{r['diff']:15,d}{r['error']:+9.3%}  {r['named']}{extra}")
    print("\nmeasured - predicted, split into a per-decoder-layer part and a layer-independent part (L = 2 and 4):")
    print(f"{'plan':<12}{'tp':>3} {'phase':<15}{'per layer B':>16}  {'':<22}{'independent B':>16}  named")
    for r in per_layer_split(data, table):
        print(f"{r['plan']:<12}{r['tp']:>3} {r['phase']:<15}{r['per_layer']:16,.0f}  {r['per_layer_named']:<22}"
              f"{r['constant']:16,.0f}  {r['constant_named']}")
    print("\nmeasured only, alive at the protocol's points (bytes):")
    for run in data["runs"]:
        a = run["measured"]["alive_points"]
        print(f"  {run['id']:<52} " + "  ".join(f"{k} {a[k]:,d}" for k in
                                                 ("start", "end_of_forward", "end_of_backward", "end_of_step")))
    errs = sorted(abs(r["error"]) for r in table)
    print(f"\n{len(table)} rows: median |err| {errs[len(errs) // 2]:.3%}, max {errs[-1]:.3%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
