"""Helpers for the architecture-family tests (tests/test_family_*.py): each family's measured runs
and configs (validation/families/<dir>/), solved as validation/families/report_families.py solves
them for the family table, and their errors phase by phase. No torch."""

from __future__ import annotations

import json
from pathlib import Path

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parent.parent
FAMILIES_DIR = ROOT / "validation" / "families"
REPORT = load_script(FAMILIES_DIR / "report_families.py")
PRECISION = REPORT.REFERENCE_PRECISION        # validation/report.py's: the precision of each regime
PHASES = REPORT.PHASES                        # ("forward", "backward", "optimizer")
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)


def family_runs(directory: str) -> list[dict]:
    """Every run of validation/families/<directory>/measurements.json, as written (none left out)."""
    path = FAMILIES_DIR / directory / "measurements.json"
    return json.loads(path.read_text(encoding="utf-8"))["runs"]


def family_configs(directory: str):
    """validation/families/<directory>/configs.py, imported by path (once)."""
    return load_script(FAMILIES_DIR / directory / "configs.py")


def run_model(run: dict):
    """The run's workload: its HF config, named by its id."""
    return from_hf_config(run["hf_config"], name=run["id"])


def solve_model(model, *, batch=1, seq=256, regime="bf16", precision=None, optimizer="adamw", checkpointing="none",
                solver=None, **options):
    """The measured profile's result for ``model`` on an unbounded node as the runs were measured:
    device="cpu", no runtime overheads, foreach AdamW, SDPA, no dropout, unless ``options`` (the
    profile's options) say otherwise; ``precision`` by default the regime's (``PRECISION``);
    ``solver`` by default ``TrainingMemoryModel()`` (the installed plugins)."""
    opts = dict(regime=regime, optimizer_impl="foreach", attention="sdpa", device="cpu", dropout=0.0,
                runtime_overheads=False)
    opts.update(options)
    return (solver or TrainingMemoryModel()).solve(model, BIG, batch, seq, PRECISION[regime] if precision is None
                                                   else precision, optimizer, checkpointing, profile="measured",
                                                   **opts)


def solve_run(run: dict, model=None, *, solver=None, **changes):
    """``run`` solved as report_families.solve solves it (the family table's numbers); with ``model``
    (instead of the run's), ``solver`` (a ``TrainingMemoryModel``, e.g. one with the built-in plugins
    only) or ``changes`` (profile options: attention, device, dropout, regime, ...), the same solve so
    changed (the precision stays the run's regime's)."""
    if model is None and solver is None and not changes:
        return REPORT.solve(run)
    options = dict(regime=run["regime"], optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                   dropout=run.get("dropout", 0.0), **run.get("solve_options", {}))
    options.update(changes)
    return solve_model(model or run_model(run), batch=run["batch_size"], seq=run["seq_len"],
                       precision=PRECISION[run["regime"]], optimizer=run["optimizer"],
                       checkpointing=run["checkpointing"], solver=solver, **options)


def phase_errors(run: dict, result) -> dict[str, float]:
    """(predicted - measured) / measured of every phase (``PHASES``; the backward: the larger of the
    backward and its end, ``report_families.predicted_phases``) and of the peak (``"peak"``)."""
    predicted = REPORT.predicted_phases(result)
    measured = run["measured"]
    out = {p: (predicted[p] - measured["peak_by_phase"][p]["bytes"]) / measured["peak_by_phase"][p]["bytes"]
           for p in PHASES}
    out["peak"] = (result.total_memory - measured["peak_bytes"]) / measured["peak_bytes"]
    return out


def run_errors(run: dict) -> dict[str, float]:
    """``phase_errors`` of ``run`` as report_families solves it."""
    return phase_errors(run, solve_run(run))


def abs_errors_by_architecture(runs: list[dict]) -> dict[str, dict[str, list[float]]]:
    """Per HF model_type, the runs' absolute ``run_errors``: the peak's (``"peak"``) and every
    phase's (``"phases"``)."""
    out: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        e = run_errors(run)
        s = out.setdefault(run["hf_config"]["model_type"], {"peak": [], "phases": []})
        s["peak"].append(abs(e["peak"]))
        s["phases"] += [abs(e[p]) for p in PHASES]
    return out
