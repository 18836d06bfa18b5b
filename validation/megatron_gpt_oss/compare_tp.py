#!/usr/bin/env python
"""The measured profile against tp_measurements.json (one gpt-oss layer under Megatron-Core's tensor parallelism with
sequence parallelism, measure_tp.py), per run and phase: the table of docs/validation.md.

    python validation/megatron_gpt_oss/compare_tp.py [--doc]

``--doc`` rewrites the table between its markers in docs/validation.md. Per layer of the rank: ``forward`` is what the
layer holds at the forward's end (its saved tensors, the dispatcher's held probabilities, routing map and token
counts), ``optimizer_step`` what outlives its backward (the dispatcher's held tensors, the permutation map among
them). The measured side is the record put as the profile counts it (the layer's input, alive before the forward
and saved by the input norm, added; the norms' fp32 rsigma and the activation's offset scalar, which the profile does
not count, taken out: tests/measured/test_megatron_gpt_oss_tp.py derives every number by hand); the profile's side is
the tiny gpt-oss of tests/measured/test_megatron_gpt_oss.py (2 layers, 128 tokens) at the run's tp and ep with
``sequence_parallel=True``, ``expert_tp_size=1`` and, under expert parallelism, the measured busiest-rank load
(``moe_routing_imbalance``), per layer; with Megatron-Core's recompute modules (``layernorm``, ``moe_act``) also what
one layer's recomputes rebuild in the backward (the profile's recompute-modules term). Recompute runs (full: 2 layers; block: 3 layers, the first n checkpointed; one micro-batch): every phase
of the stage, ``t.recompute_phases`` / ``t.recompute_profile`` (the forward's end; the backward's phase, under full
recompute the bottom layer's recompute, under block recompute the backward's start; the backward's end, the bottom
layer's recompute; after the iteration; the stage's output, the upper layers' bf16 weight gradients and the MLP
backward's transient gradients left out, as that test says). Pipeline runs (tp 2, 1F1B stages): ``pipeline``."""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "measured"))
sys.path.insert(0, os.path.dirname(HERE))

import test_megatron_gpt_oss_tp as t  # noqa: E402  (the record, the tiny model's solve, the measured layer)
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP  # noqa: E402
from report import write_table  # noqa: E402  (validation/report.py: the compare scripts' --doc)

BEGIN = "<!-- gpt-oss-megatron-tp-table: begin (validation/megatron_gpt_oss/compare_tp.py --doc) -->"
END = "<!-- gpt-oss-megatron-tp-table: end -->"
LAYERS = 2      # the tiny model's
REBUILT = "backward (one layer's modules rebuilt)"


def profile(run) -> dict:
    tp, ep = run["tp"], run["ep"]
    options = dict(t.RECIPE) if tp > 1 else {}
    if ep > 1:
        options["moe_routing_imbalance"] = run["measured"]["received"] / (run["measured"]["tokens_on_rank"] * t.K)
    modules = run.get("recompute_modules")
    if modules:
        options["plugin_options"] = {"selective": {"modules": modules}}
    how = "selective" if modules else "none"
    r = t.solve(how, tp_size=tp, ep_size=ep, dp_size=1, **options) if tp * ep > 1 else t.solve(how)
    mine = [x for x in r.terms if x.component == "activations" and x.label.startswith(
        ("decoder layers: saved", "Megatron-Core alltoall"))]
    out = {phase: sum(x.nbytes for x in mine if phase in x.phases) / LAYERS for phase in (FORWARD, OPTIMIZER_STEP)}
    if modules:
        out[REBUILT] = next(x.nbytes for x in r.terms if x.label.startswith("recompute modules"))
    return out


def pipeline(run) -> tuple[dict, dict]:
    """A 1F1B stage (``t.test_pipeline_stage_against_the_measurement``): the forward's and the backward's phase hold
    the micro-batches in flight (the stage's inputs and each layer's saved tensors, the norms' rsigma and the offset
    scalars taken out) and the dispatcher's held tensors and counts; the backward's end and the optimizer step the held
    tensors, the permutation maps and a later stage's last receive buffer. Under expert parallelism the recorded rank
    received fewer rows than the balanced T x k (240 of 256 over its two layers): the profile prices at least the mean
    load (``moe_routing_imbalance`` >= 1, the busiest rank's), so it is above by those rows' 618 B each."""
    m, tk, L = run["measured"], run["measured"]["tokens_on_rank"], run["layers"]
    rank = next(r for r in t.pipeline_solve(run).ranks if run["stage"] in r.stages)
    n = rank.in_flight
    missed = m["held_row_id_map"] + m["held_input"]
    held = m["held"] + m["held_other"]["num_global_tokens_per_local_expert"]
    peak = m["forward_peak"] + missed - n * 2 - n * L * (8 * tk + 2) + held
    after = m["held"] + sum(m["held_other"].values()) + m["held_input_after"]
    meas = {FORWARD: peak, BACKWARD: m["before_backward_peak"] + missed - n * 2 - n * L * (8 * tk + 2) + held,
            BACKWARD_END: after, OPTIMIZER_STEP: after}
    prof = {}
    for phase in meas:
        prof[phase] = sum(x.nbytes for x in rank.terms if x.component == "activations" and phase in x.phases and (
            x.label.startswith(("Megatron-Core alltoall", "pipeline receive buffer", "decoder layers: saved"))))
    return meas, prof


def measured(run) -> dict:
    m = run["measured"]
    held = m["held"] + m["held_other"]["num_global_tokens_per_local_expert"]
    if "recompute_modules" not in run:
        return {FORWARD: t.measured_layer(run) + held, OPTIMIZER_STEP: held + m["held_other"]["row_id_map"]}
    # recompute modules layernorm and moe_act: the pre-MLP norm's rsigma and the offset scalar are released (not
    # taken out again); what the modules' recomputes rebuild in the backward, less the rsigma and the offset scalar
    tk = m["tokens_on_rank"]
    return {FORWARD: m["saved_with_row_id_map"] + 2 * t.H * tk - 4 * tk + held,
            OPTIMIZER_STEP: held + m["held_other"]["row_id_map"], REBUILT: sum(m["rebuilt"]) - 4 * tk - 2}


def rows() -> list[str]:
    out = ["| run | tp | ep | recompute | tokens on the rank | phase | measured B | profile B | error |",
           "|---|---|---|---|---|---|---|---|---|"]
    for run in t.RECORD["runs"]:
        method = run.get("recompute_method")
        if "pp" in run:
            meas, prof = pipeline(run)
        elif method:
            meas, prof = t.recompute_phases(run), t.recompute_profile(run)
        else:
            meas, prof = measured(run), profile(run)
        for phase in meas:
            how = ({"uniform": "full", "block": f"block {run.get('recompute_num_layers')} of {run.get('layers')}",
                    None: "none"}[method] if "recompute_modules" not in run
                   else "modules " + ", ".join(run["recompute_modules"])) + (f"; pp {run['pp']} stage {run['stage']}, {run['microbatches']} micro-batches"
                                            if "pp" in run else "")
            out.append(f"| {run['id']} | {run['tp']} | {run['ep']} | {how} | "
                       f"{run['measured']['tokens_on_rank']} | {phase} | "
                       f"{meas[phase]:,} | {prof[phase]:,.0f} | {100 * (prof[phase] / meas[phase] - 1):+.3f} % |")
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    table = "\n".join(rows())
    if "--doc" not in argv:
        print(table)
        return 0
    write_table(table, BEGIN, END)
    print("wrote docs/validation.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
