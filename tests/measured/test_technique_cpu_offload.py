"""torchao's CPU-offload optimizer (issue 16, item 3: ``offload="torchao"`` / ``"torchao+gradients"``):
the committed CPU measurements (``validation/techniques/cpu_offload/``: torchao 0.18's own
``CPUOffloadOptimizer`` with the accelerator simulated) solved phase by phase and for host memory,
hand-derived byte counts, and refusals. No torch."""

from __future__ import annotations

import statistics

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from techniquetools import BIG, measurements, phase_errors, phases, run_by_id, solve

DATA, RUNS = measurements("cpu_offload")


def persistent_host(result):
    return result.host_memory - sum(t.nbytes for t in result.terms if t.label.startswith("host optimizer step"))


def errors(run):
    result = solve(run)
    out = phase_errors(run, result)
    m = run["measured"]
    if m["host"]["total"]:     # the persistent host tensors (the host step's temporaries are not measured)
        out["host"] = (persistent_host(result) - m["host"]["total"]) / m["host"]["total"]
    return out


def _run(run_id):
    return run_by_id(RUNS, run_id)


def test_the_measurements_cover_both_families_at_two_sizes_and_both_modes():
    for mode in ("torchao", "torchao+gradients"):
        models = {r["model"] for r in RUNS if r["solve_options"].get("offload") == mode}
        assert models >= {"gqa-tiny", "gqa-wide", "mixtral-tiny", "mixtral-wide"}, mode
    assert DATA["torch"].startswith("2.13.0") and DATA["transformers"] == "5.23.0" and DATA["torchao"] == "0.18.0"
    assert not [r["id"] for r in DATA["runs"] if "error" in r]


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_phase_and_the_host_within_the_targets(run):
    e = errors(run)
    assert all(abs(v) <= 0.10 for v in e.values()), e


def test_median_error_within_three_percent():
    every = [abs(v) for r in RUNS for v in errors(r).values()]
    assert statistics.median(every) <= 0.03


def test_the_harness_control_measures_the_plain_run():
    """minimal_size above every tensor: torchao's device optimizer holds everything, which must be
    the plain run the profile predicts without offload (the harness changes nothing else)."""
    run = _run("control-all-on-device-gqa-tiny-fp32")
    assert run["measured"]["host"]["total"] == 0
    assert all(abs(v) < 1e-6 for v in errors(run).values())


def test_host_and_device_bytes_by_hand():
    # gqa-tiny (h 256, f 688, L 4, 8 heads, 2 KV heads of 32, V 32,000), fp32, fused AdamW, b 1, s 128.
    run = _run("torchao-gqa-tiny-fp32")
    r = solve(run)
    h, f, V, L, kv = 256, 688, 32000, 4, 64
    layer = h * h + 2 * h * kv + h * h + 3 * h * f     # q, k, v, o, gate, up, down: every one >= 4,096 elements
    big = 2 * V * h + L * layer
    small = (2 * L + 1) * h                           # the norms (256 elements < 4,096): on the device
    # Host: p_host and p_host.grad (4 B each), two fp32 moments, a 4-byte step per offloaded tensor.
    assert r.host_memory == big * 4 * 4 + 4 * (2 + 7 * L) == run["measured"]["host"]["total"]
    by = {t.label: t for t in r.terms}
    device_state = by["adamw state of the tensors under 4,096 elements (device optimizer)"]
    assert device_state.nbytes == small * 8 + 4 * (2 * L + 1) == run["measured"]["device_optimizer"]["state_bytes"]
    # Without offload the device held every tensor's state: the step phase differs by the offloaded state.
    plain = phases(solve(run, offload=None))       # (fused, as the run)
    assert plain["optimizer"] - phases(r)["optimizer"] == big * 8 + 4 * (2 + 7 * L)


def test_offload_gradients_by_hand():
    # torchao+gradients: the step holds only the norms' gradients; in the backward the LM head's mm
    # (logits' gradient 4 T V, its input's 4 T h, its weight's 4 V h) once the cross-entropy's
    # 12 T V + 8 T are gone: 4 T h + 4 V h - 8 T V - 8 T over the loss moment.
    run = _run("torchao-grads-gqa-tiny-fp32")
    r = solve(run)
    T, h, V = 128, 256, 32000
    by = {t.label: t.nbytes for t in r.terms}
    assert by["offloaded gradient in flight, over the loss moment (torchao+gradients)"] == 4 * T * h + 4 * V * h \
        - 8 * T * V - 8 * T == 130_048
    assert by["gradients of the tensors under 4,096 elements (kept on the device)"] == 9 * h * 4
    assert phases(r)["optimizer"] == run["measured"]["peak_by_phase"]["optimizer"]["bytes"]
    kept = solve(run, offload="torchao")
    assert phases(kept)["optimizer"] - phases(r)["optimizer"] == 4 * (sum(
        n for n in _tensors(run) if n >= 4096))


def _tensors(run):
    h, f, V, L, kv = 256, 688, 32000, 4, 64
    return [V * h] + [h * h, h * kv, h * kv, h * h, h * f, h * f, h * f, h, h] * L + [h, V * h]


def test_the_note_and_unchanged_numbers_without_it():
    run = _run("torchao-gqa-tiny-fp32")
    r = solve(run)
    assert any("torchao's CPUOffloadOptimizer" in n and "simulated" in n for n in r.notes)
    assert not any("CPUOffloadOptimizer" in n for n in solve(run, offload=None).notes)
    # torchao's default is a fused AdamW: without optimizer_impl the device optimizer is fused.
    model = from_hf_config(run["hf_config"], name="m")
    a = TrainingMemoryModel().solve(model, BIG, 1, 128, "fp32", "adamw", "none", profile="measured",
                                    offload="torchao", device="cpu", runtime_overheads=False)
    assert a.total_memory == r.total_memory


def test_refusals():
    run = _run("torchao-gqa-tiny-fp32")
    model = from_hf_config(run["hf_config"], name="m")
    s = TrainingMemoryModel().solve
    with pytest.raises(InvalidInputError, match="torchao or torchao\\+gradients"):
        s(model, BIG, 1, 128, "fp32", "adamw", "none", profile="measured", offload="torchao+optimizer")
    with pytest.raises(InvalidInputError, match="torchao or torchao\\+gradients"):
        s(model, BIG, 1, 128, "fp32", "adamw", "none", profile="measured", offload="torchao+parameters")
    with pytest.raises(NotModelledError, match="single-GPU"):
        s(model, BIG, 2, 128, "fp32", "adamw", "none", profile="measured", offload="torchao", dp_size=2)
    with pytest.raises(NotModelledError, match="gradient accumulation"):
        s(model, BIG, 2, 128, "fp32", "adamw", "none", profile="measured", offload="torchao+gradients",
          gradient_accumulation_steps=2)
    with pytest.raises(NotModelledError, match="optimizer one of adam, adamw"):
        s(model, BIG, 1, 128, "fp32", "sgd", "none", profile="measured", offload="torchao")
    with pytest.raises(NotModelledError, match="master"):
        s(model, BIG, 1, 128, "bf16", "adamw", "none", profile="measured", offload="torchao", regime="mixed-bf16")
    with pytest.raises(NotModelledError, match="optimizer.step"):
        s(model, BIG, 1, 128, "fp32", "adamw", "none", profile="measured", offload="torchao",
          optimizer_in_backward=True)
    # Gradient accumulation without offload_gradients: derived, said.
    r = s(model, BIG, 2, 128, "fp32", "adamw", "none", profile="measured", offload="torchao",
          gradient_accumulation_steps=2)
    assert any("gradient accumulation: derived" in n for n in r.notes)


def test_added_step_time():
    from mlsysim_core.inputs import check_plan, profile_plan
    from mlsysim_plugins.measured.cpu_offload import added_step_time
    run = _run("torchao-gqa-tiny-fp32")
    reg = TrainingMemoryModel().registry
    plan = check_plan(reg, "measured", from_hf_config(run["hf_config"], name="m"), BIG, 1, 128, "fp32", "adamw",
                      "none", 1, 1, 1, 1, 0, 1, 1.0, 0.05, False, None, None, None, (), 1)
    plan = profile_plan(reg, reg.profiles["measured"], plan, {"regime": "fp32", "device": "cpu", "offload": "torchao"})
    seconds, how = added_step_time(plan, host_link_bytes_per_s=25e9, host_memory_bytes_per_s=100e9)
    big = sum(n for n in _tensors(run) if n >= 4096)
    # Over the link: gradients out (4 B) and parameters back (4 B); in host memory the CPU step's
    # reads of p, g, m, v and writes of p, m, v (7 x 4 B).
    assert seconds == pytest.approx(big * 8 / 25e9 + big * 28 / 100e9)
    assert added_step_time(plan)[0] is None and "unknown" in added_step_time(plan)[1]
