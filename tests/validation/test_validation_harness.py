"""The validation scripts share one harness (issue 24 item 8), and the compiled measurements of
validation/compile/ (issue 25 item 1: the profiler's memory timeline) are well-formed. No torch.

* every measurement script under validation/ imports validation/harness.py and keeps no copy of the
  protocol, the records, the tracker or the command line (no ``def run_protocol`` and the like outside
  harness.py, no argparse parser of its own in a measure script);
* validation/compile/measurements.json: the regenerating command, every run's three measurements
  (MemTracker, the profiler's timeline eager and compiled), each peak at least every phase's peak and every
  alive point, the peak's phase holding the peak, and the eager timeline equal to MemTracker's figures
  above ``alive.after_zero_grad``, except for allocations no op returns: the optimizer phase within 64
  bytes, and with full checkpointing the 5,056-byte CPU RNG state each checkpointed layer keeps from its
  forward to its recomputation (the forward, the backward's top and the end of the forward, exactly).
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VALIDATION = ROOT / "validation"
HARNESS = VALIDATION / "harness.py"
SCRIPTS = sorted({*VALIDATION.rglob("measure_*.py"), VALIDATION / "measure.py",
                  VALIDATION / "published" / "torchtitan_measure.py"})
# what only harness.py defines
SHARED = {"run_protocol", "previous_runs", "peak_record", "build_optimizer", "layer_forward_deltas",
          "fake_scalar_values", "_find_packed_sequence_indices", "_point", "_mod_totals", "write_json",
          "memory_timeline", "profiled_iteration", "fold_backward_sub_phases", "error_record", "training_run"}
IMPORTS = re.compile(r"^\s*(?:import|from) (\w+)", re.M)
BY_MODULE = {p.stem: p for p in SCRIPTS}


def _uses_harness(path, seen=()) -> bool:
    """The script imports harness.py, or another measure script that does (measure_parallel.py, ...)."""
    names = set(IMPORTS.findall(path.read_text(encoding="utf-8")))
    if "harness" in names:
        return True
    return any(_uses_harness(BY_MODULE[n], (*seen, path)) for n in names
               if n in BY_MODULE and BY_MODULE[n] not in seen and BY_MODULE[n] != path)


def test_the_scripts_are_found():
    names = {p.relative_to(VALIDATION).as_posix() for p in SCRIPTS}
    assert {"measure.py", "measure_lora.py", "families/measure_families.py", "mamba2/measure_mamba2.py",
            "examples/measure_examples.py", "parallel/measure_parallel.py",
            "parallel/tp_phases/measure_tp_phases.py", "parallel/tp_plans/measure_tp_plans.py",
            "published/torchtitan_measure.py", "compile/measure_compile.py",
            "techniques/checkpointing/measure_checkpointing.py", "techniques/loss/measure_loss.py",
            "techniques/optimizers/measure_optimizers.py"} <= names
    assert not (VALIDATION / "techniques" / "_harness.py").exists()


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(VALIDATION).as_posix())
def test_every_measure_script_uses_the_one_harness(path):
    text = path.read_text(encoding="utf-8")
    assert _uses_harness(path), f"{path.name} does not import validation/harness.py"
    tree = ast.parse(text)
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert not defined & SHARED, f"{path.name} defines its own {sorted(defined & SHARED)}"
    assert "ArgumentParser(" not in text, f"{path.name} builds its own command line (use harness.main)"
    assert not re.search(r"^\s*import measure\b|^\s*from measure import", text, re.M)


def test_no_copy_of_the_protocol_anywhere_in_validation():
    for path in VALIDATION.rglob("*.py"):
        if path == HARNESS:
            continue
        assert not re.search(r"^\s*def run_protocol\b", path.read_text(encoding="utf-8"), re.M), path


def test_the_harness_defines_the_shared_pieces():
    tree = ast.parse(HARNESS.read_text(encoding="utf-8"))
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    assert SHARED | {"main", "build_model", "timeline_measure", "PhaseMemTracker", "optimizer_in_backward"} <= defined


# --------------------------------------------------------------------------- validation/compile
COMPILE = VALIDATION / "compile" / "measurements.json"
DOC = json.loads(COMPILE.read_text(encoding="utf-8"))
RUNS = DOC["runs"]
PHASES = ("forward", "backward", "optimizer")
POINTS = ("end_of_forward", "end_of_backward", "end_of_step")


def test_compile_file_says_how_it_was_made():
    assert DOC["generator"].endswith("validation/compile/measure_compile.py")
    assert "requirements.txt" in DOC["environment"] and DOC["torch"] and DOC["transformers"]
    assert DOC["device"] == "cpu" and "profile_memory=True" in DOC["timeline"]
    assert len(RUNS) >= 4 and len({r["id"] for r in RUNS}) == len(RUNS)
    grid = {(r["regime"], r["checkpointing"], r["batch_size"]) for r in RUNS}
    assert {g[0] for g in grid} == {"fp32", "bf16"} and {g[1] for g in grid} >= {"none"}
    assert len({g[2] for g in grid}) >= 2


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_compile_run_is_internally_consistent(run):
    assert "error" not in run
    m = run["measured"]
    for kind in ("memtracker", "eager", "compiled"):
        rec = m[kind]
        phases = rec["peak_by_phase"]
        assert set(PHASES) <= set(phases) and set(POINTS) <= set(rec["alive"])
        assert all(rec["peak_bytes"] >= phases[p] for p in PHASES), kind
        assert all(rec["peak_bytes"] >= rec["alive"][p] for p in POINTS), kind
        assert phases[rec["peak_phase"]] == rec["peak_bytes"], kind
        assert phases["forward"] >= rec["alive"]["end_of_forward"] and phases["backward"] >= rec["alive"]["end_of_backward"]
        assert phases["optimizer"] >= rec["alive"]["end_of_step"]
    for kind in ("eager", "compiled"):
        assert m[kind]["baseline_bytes"] > 0 and m[kind]["memory_events"] > 0
    assert m["compiled"]["compiled"] is True and m["eager"]["compiled"] is False
    assert m["peak_bytes"] == m["compiled"]["peak_bytes"]


RNG_STATE_BYTES = 5056  # the CPU generator's state, kept by each checkpointed layer (made by no op)


@pytest.mark.parametrize("run", RUNS, ids=lambda r: r["id"])
def test_eager_timeline_equals_memtracker(run):
    m = run["measured"]
    eager, tracker = m["eager"], m["memtracker"]
    extra = RNG_STATE_BYTES * run["hf_config"]["num_hidden_layers"] if run["checkpointing"] == "full" else 0
    assert tracker["peak_bytes"] == tracker["peak_bytes_absolute"] - tracker["after_zero_grad_bytes"]
    assert eager["peak_by_phase"]["forward"] == tracker["peak_by_phase"]["forward"] + extra
    # Each checkpointed layer's RNG state lives until its recomputation: a backward peak at the loss holds them
    # all, one inside the layers' recomputation (the layer-dominated runs) those of the layers not yet recomputed.
    back = eager["peak_by_phase"]["backward"] - tracker["peak_by_phase"]["backward"]
    assert back % RNG_STATE_BYTES == 0 and (RNG_STATE_BYTES if extra else 0) <= back <= extra
    step = eager["peak_by_phase"]["optimizer"] - tracker["peak_by_phase"]["optimizer"]
    assert 0 <= step <= 64
    at_peak = {"forward": extra, "backward": back, "optimizer": step}[eager["peak_phase"]]
    assert eager["peak_bytes"] == tracker["peak_bytes"] + at_peak
    assert m["eager_profiler_equals_memtracker"] is (at_peak == 0)     # (a peak in the step: its few bytes)
    assert eager["alive"]["end_of_forward"] == tracker["alive"]["end_of_forward"] + extra
    assert eager["alive"]["end_of_backward"] == tracker["alive"]["end_of_backward"]
    assert eager["alive"]["end_of_step"] == tracker["alive"]["end_of_step"]
    # the compiled step is the eager one (only the model is compiled): same optimizer-phase bytes above the backward
    assert (m["compiled"]["peak_by_phase"]["optimizer"] - m["compiled"]["alive"]["end_of_backward"]
            == eager["peak_by_phase"]["optimizer"] - eager["alive"]["end_of_backward"])
