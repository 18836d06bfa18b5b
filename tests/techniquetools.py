"""Helpers for the technique tests (tests/test_technique_*.py) whose committed CPU measurements sit in
validation/techniques/<dir>/measurements.json: the runs, each solved as measured (an unbounded
device, the run's regime, optimizer, checkpointing policy and solve options) and its errors phase
by phase. No torch."""

from __future__ import annotations

import json

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.hf import from_hf_config

from familytools import BIG, PHASES, PRECISION, REPORT, ROOT

# The solved peaks of the measured phases (the backward: its own and its end's, the larger),
# as the family table computes them.
phases = REPORT.predicted_phases


def measurements(directory: str) -> tuple[dict, list[dict]]:
    """validation/techniques/<directory>/measurements.json, and its runs that were measured."""
    data = json.loads((ROOT / "validation/techniques" / directory / "measurements.json").read_text(encoding="utf-8"))
    return data, [r for r in data["runs"] if "measured" in r]


def solve(run, **more):
    """The run solved as measured; a checkpointing policy's options (``policy_options``) as its plugin's."""
    model = from_hf_config(run["hf_config"], name=run["id"])
    policy = run["checkpointing"]
    options = dict(regime=run["regime"], optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                   device="cpu", dropout=0.0, runtime_overheads=False, **{**run["solve_options"], **more})
    return TrainingMemoryModel().solve(model, BIG, run["batch_size"], run["seq_len"], PRECISION[run["regime"]],
                                       run["optimizer"], policy, profile="measured",
                                       plugin_options={policy: run["policy_options"]} if run.get("policy_options")
                                       else None,
                                       **options)


def phase_errors(run, result) -> dict:
    """(solved - measured) / measured for each phase's peak and the whole peak."""
    predicted = phases(result)
    m = run["measured"]
    out = {p: (predicted[p] - m["peak_by_phase"][p]["bytes"]) / m["peak_by_phase"][p]["bytes"] for p in PHASES}
    out["peak"] = (result.total_memory - m["peak_bytes"]) / m["peak_bytes"]
    return out


def errors(run):
    return phase_errors(run, solve(run))


def run_by_id(runs, run_id):
    return next(r for r in runs if r["id"] == run_id)
