#!/usr/bin/env python
"""The Bamba family's predictions against validation/mamba2/measurements.json, phase by phase.

    python examples/plugins/mlsysim-mamba2-hybrid/compare_measurements.py     # the README's table (markdown)

No torch needed; run it from mlsysim-core's repository (it reads ``validation/mamba2/measurements.json``)
with mlsysim-core importable. The package's ``src`` is put on ``sys.path`` and its plugin registered
next to mlsysim-core's built-in ones. Each run is solved as it was measured: its config as a
``BambaWorkload``, micro-batch and sequence, regime (fp32 or pure bf16), attention kernel, AdamW
(foreach), no checkpointing, no runtime overheads (MemTracker counts live tensors only).

What is compared (``compare(run)``), predicted - measured, in bytes:

* ``forward``: ``phase_totals["forward"]`` vs the forward's peak (``peak_by_phase.forward``, at
  ``nll_loss_forward``);
* ``end_of_forward``: the forward phase without its forward-only terms (the logits at the loss)
  vs the bytes alive at the end of the forward (``alive.end_of_forward``);
* ``backward``: ``phase_totals["backward"]`` vs the backward's peak (``peak_by_phase.backward``);
* ``backward_end``: ``phase_totals["backward_end"]`` vs the embedding's backward: the bytes alive
  before it (``module_snapshots.embedding.Pre-Backward``) plus the V x h gradient it allocates;
* ``optimizer_step``: ``phase_totals["optimizer_step"]`` vs the optimizer's peak (``peak_by_phase.optimizer``);
* ``end_of_step``: the optimizer-step phase without the step's foreach temporaries vs the bytes
  alive after the step (``alive.end_of_step``).

``expected_offset(run, phase)`` is what the profile is known to leave out (see the README); a
backward that peaks inside a mixer layer's backward has no fixed offset (its transients are not
modelled) and is bounded instead.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
MEASUREMENTS = ROOT / "validation" / "mamba2" / "measurements.json"
PHASES = ("forward", "end_of_forward", "backward", "backward_end", "optimizer_step", "end_of_step")
LOG_SOFTMAX_BACKWARD = "aten._log_softmax_backward_data.default"
MIXER_TRANSIENT_TOLERANCE = 0.05     # a mixer's backward transients: at most 5 % of the measured backward peak

if str(HERE / "src") not in sys.path:
    sys.path.insert(0, str(HERE / "src"))


def load_runs(path: Path = MEASUREMENTS) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["runs"]


@lru_cache(maxsize=None)
def solver(builtin_pm=None):
    """The measured profile with mlsysim-core's own plugins and this package's plugin."""
    from mlsysim_core import PluginManager, TrainingMemoryModel
    from mlsysim_mamba2 import plugin
    builtin = builtin_pm or PluginManager.from_environment(autoload=False, blocked=())
    pm = PluginManager()
    for name in sorted(builtin.registry.plugins):
        pm.register(builtin.get_plugin(name), name=name, info=builtin.info(name))
    pm.register(plugin, name="mamba2_hybrid")
    return TrainingMemoryModel("measured", plugin_manager=pm)


def solve(run: dict, model=None):
    from mlsysim_core import HardwareNode
    from mlsysim_mamba2.workload import BambaWorkload
    workload = BambaWorkload.from_hf_config(run["hf_config"], name=run["model"])
    regime = run["regime"]
    return (model or solver()).solve(
        workload, HardwareNode(name="unbounded", memory_capacity=2**60), run["batch_size"], run["seq_len"],
        "fp32" if regime == "fp32" else "bf16", run["optimizer"], run["checkpointing"], profile="measured",
        regime=regime, optimizer_impl=run["optimizer_impl"], attention=run["attention"],
        dropout=run.get("dropout", 0.0), runtime_overheads=False)


def measured(run: dict) -> dict[str, int]:
    """Each compared quantity as MemTracker measured it (see the module docstring)."""
    m, cfg = run["measured"], run["hf_config"]
    c = 4 if run["regime"] == "fp32" else 2
    return {
        "forward": m["peak_by_phase"]["forward"]["bytes"],
        "end_of_forward": m["alive"]["end_of_forward"]["bytes"],
        "backward": m["peak_by_phase"]["backward"]["bytes"],
        "backward_end": m["module_snapshots"]["embedding"]["Pre-Backward"] + c * cfg["vocab_size"] * cfg["hidden_size"],
        "optimizer_step": m["peak_by_phase"]["optimizer"]["bytes"],
        "end_of_step": m["alive"]["end_of_step"]["bytes"],
    }


def predicted(result) -> dict[str, float]:
    totals = result.phase_totals
    forward_only = sum(t.nbytes for t in result.terms if tuple(t.phases) == ("forward",))
    step_temporaries = sum(t.nbytes for t in result.terms if "step temporaries" in t.label)
    return {"forward": totals["forward"], "end_of_forward": totals["forward"] - forward_only,
            "backward": totals["backward"], "backward_end": totals["backward_end"],
            "optimizer_step": totals["optimizer_step"], "end_of_step": totals["optimizer_step"] - step_temporaries}


def backward_in_a_mixer(run: dict) -> bool:
    """Does the measured backward peak inside a Mamba-2 mixer's backward (not at the loss)?"""
    peak = run["measured"]["peak_by_phase"]["backward"]
    return peak["op"] != LOG_SOFTMAX_BACKWARD


def expected_offset(run: dict, phase: str) -> int | None:
    """predicted - measured where the profile is exact up to known bytes it leaves out; None for a
    backward that peaks inside a mixer layer (bounded, not exact)."""
    b, s = run["batch_size"], run["seq_len"]
    T = b * s
    scalars = 8        # the fp32 loss and nll_loss's total weight (4 + 4 B)
    if phase == "forward":
        # HF's loss pads the labels to s + 1 and shifts them: at b > 1 the shifted labels are a
        # contiguous copy (the profile's 8T) next to the padded ones (8b(s+1)); at b = 1 a view (one
        # more int64 alive).
        return -(8 * b * (s + 1) + scalars) if b > 1 else -(8 + scalars)
    if phase == "end_of_forward":
        return -(8 + scalars) if b == 1 else -scalars
    if phase == "backward":
        # at _log_softmax_backward_data PyTorch has freed the int64 labels the profile keeps (8T)
        return None if backward_in_a_mixer(run) else 8 * T - scalars
    if phase == "backward_end":
        return -scalars
    return 0


def compare(run: dict, model=None) -> dict[str, tuple[int, float]]:
    """phase -> (measured, predicted)."""
    result = solve(run, model)
    got, want = predicted(result), measured(run)
    return {phase: (want[phase], got[phase]) for phase in PHASES}


def _kb(x: float) -> str:
    return f"{x:+,.0f}" if abs(x) < 10_000 else f"{x / 1000:+,.1f} K"


def table(runs=None) -> str:
    """The README's table: each run's measured bytes and predicted - measured, per phase."""
    runs = load_runs() if runs is None else runs
    head = ("| run | forward peak | Δ | end of forward | Δ | backward peak | Δ | embedding backward | Δ "
            "| optimizer step | Δ | peak phase (measured / predicted) |")
    lines = [head, "|" + "---|" * 13]
    for run in runs:
        result = solve(run)
        got, want = predicted(result), measured(run)
        cells = []
        for phase in ("forward", "end_of_forward", "backward", "backward_end", "optimizer_step"):
            mark = "*" if phase == "backward" and backward_in_a_mixer(run) else ""
            cells += [f"{want[phase]:,}{mark}", _kb(got[phase] - want[phase])]
        names = {"optimizer_step": "optimizer", "backward_end": "backward"}
        lines.append(f"| `{run['id']}` | " + " | ".join(cells)
                     + f" | {run['measured']['peak_phase']} / {names.get(result.peak_phase, result.peak_phase)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
