"""Eager QLoRA with every layer checkpointed on Hugging Face + peft + bitsandbytes (issue 25/26): the moments derived
on torchtune + torchao (lora._dequantized_in_forward, lora._top_layer_backward) against
validation/lora_ckpt_measurements.json (validation/measure_lora.py --checkpointed: peft 0.21.2, bitsandbytes 0.50.2
nf4 + double quant, bf16, gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False}) as
HF's Trainer and axolotl 067b021c run it; this test needs neither).

What the runs say:

* llama-tiny / gqa-tiny (vocab 32,000): the loss is every phase's peak, the moments are 0, forward and backward
  within 1 %;
* the wide runs (ffn 2,048, vocab 1,024: the top layer is the peak): q/v adapters, the backward's moment is exact
  but what the previous iteration left alive in the tracker's account (``alive.start``'s activation + temp,
  4 x T x h x 2 B: MemTracker's ModTracker's multi-grad hooks on the checkpointed layers' inputs keep them, a
  measurement artifact: without the tracker no activation storage survives the iteration; 2,056 / 4,104 B apart); every linear adapted, the forward's moment
  at up_proj's adapter (the measured peak: its ``* scaling``) with peft's fp32 adapters over the bf16 base (lora_B's
  output and its scaled copy 4 B x T x ffn each where torchtune's are 2 B, and the input cast to fp32): the moments
  under-predict HF/bnb, never over;
* the optimizer phase: that tracker residue again (not the moments)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from familytools import REPORT, solve_model
from mlsysim_core.hf import from_hf_config

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "validation" / "lora_ckpt_measurements.json").read_text(encoding="utf-8"))
RUNS = [r for r in DATA["runs"] if r["lora"]["quantization"]]     # (the plain-LoRA runs: test_lora_ckpt_plain.py)
TINY = [r for r in RUNS if "-tiny-" in r["id"]]
WIDE = [r for r in RUNS if "-wide-" in r["id"]]
QV_WIDE = [r for r in WIDE if "-qv-" in r["id"]]
ALL_WIDE = [r for r in WIDE if "-all-" in r["id"]]
FORWARD_TERM = "a checkpointed layer's forward over the 4-bit base"
BACKWARD_TERM = "the top layer's backward over the 4-bit base"


def _solve(run):
    return solve_model(from_hf_config(run["hf_config"], name=run["id"]), batch=run["batch_size"], seq=run["seq_len"],
                       regime=run["regime"], optimizer=run["optimizer"], checkpointing=run["checkpointing"],
                       optimizer_impl=run["optimizer_impl"], attention=run["attention"], lora=run["lora"])


def _measured(run, phase):
    # bitsandbytes' QuantState tensors: alive, unseen by the tracker (measure_lora.py records their bytes)
    return run["measured"]["peak_by_phase"][phase]["bytes"] + run["measured"]["quant_state_bytes"]


def _residue(run):
    """What the previous iteration left alive at the iteration's start beyond the model states (the tracker's)."""
    c = run["measured"]["alive"]["start"]["by_category"]
    return c["activation"] + c["temp"]


def _term(result, prefix):
    return sum(t.nbytes for t in result.terms if t.label.startswith(prefix))


def test_the_measurements():
    assert (DATA["peft"], DATA["bitsandbytes"], DATA["torch"].split("+")[0]) == ("0.21.2", "0.50.2", "2.13.0")
    assert "measure_lora.py --checkpointed" in DATA["generator"]
    assert len(RUNS) == 13 and all(r.get("measured") and not r.get("error") for r in RUNS)
    for r in RUNS:
        assert r["checkpointing"] == "full" and r["gradient_checkpointing_kwargs"] == {"use_reentrant": False}
        assert (r["lora"]["quantization"], r["lora"]["double_quant"], r["regime"]) == ("nf4", True, "bf16")
    assert {r["seq_len"] for r in WIDE} == {256, 512} and len(QV_WIDE) == 2 and len(ALL_WIDE) == 4


@pytest.mark.parametrize("run", TINY, ids=[r["id"] for r in TINY])
def test_the_loss_is_the_peak_where_the_vocabulary_is_large(run):
    result = _solve(run)
    assert _term(result, FORWARD_TERM) == 0 and _term(result, BACKWARD_TERM) == 0
    predicted = REPORT.predicted_phases(result)
    for phase in ("forward", "backward"):
        assert abs(predicted[phase] - _measured(run, phase)) / _measured(run, phase) <= 0.01, phase


@pytest.mark.parametrize("run", QV_WIDE, ids=[r["id"] for r in QV_WIDE])
def test_the_backward_moment_holds_on_hf_bnb(run):
    """q/v adapted: the top layer's backward moment plus the tracker's residue is the measured backward peak (RNG states
    and scalars apart: 2,056 B at 1,024 tokens, 4,104 at 2,048)."""
    result = _solve(run)
    assert _term(result, BACKWARD_TERM) > 0
    gap = _measured(run, "backward") - REPORT.predicted_phases(result)["backward"] - _residue(run)
    assert 0 <= gap <= 2 * run["batch_size"] * run["seq_len"] + 8, gap


@pytest.mark.parametrize("run", WIDE, ids=[r["id"] for r in WIDE])
def test_the_moments_move_toward_hf_bnb_and_never_past_it(run):
    """Where the top layer is the peak each moment is > 0, and the prediction with it is still below the
    measurement: without the moment the error is larger by the moment's bytes (the Ministral row's move is a
    mechanism HF/bnb has, at least)."""
    result = _solve(run)
    predicted = REPORT.predicted_phases(result)
    for phase, label in (("forward", FORWARD_TERM), ("backward", BACKWARD_TERM)):
        term = _term(result, label)
        assert term > 0, phase
        assert 0 < _measured(run, phase) - predicted[phase] < _measured(run, phase) - (predicted[phase] - term), phase


@pytest.mark.parametrize("run", ALL_WIDE, ids=[r["id"] for r in ALL_WIDE])
def test_every_linear_adapted_hf_holds_peft_fp32_adapter_path(run):
    """Every linear adapted: peft's fp32 adapters over the bf16 base (autocast_adapter_dtype) make lora_B's output and
    its scaled copy 4 B x T x ffn each (torchtune's, in the base's dtype, 2 B) and cast up_proj's input to fp32
    (4 x T x h): the forward's moment prices them (issue 25 item 4; before, the forward's excess beyond the
    tracker's residue was 8,882,176 B at 1,024 tokens, 17,764,352 at 2,048: -30 to -33 %). What is left beyond the
    residue is what Hugging Face's layer and peft free that torchtune keeps: the attention output (c x T x h) and
    lora_A's output (4 x T x r), less 2 x T B of scalars, as on the fp32 runs (test_lora_ckpt_plain.py)."""
    T = run["batch_size"] * run["seq_len"]
    result = _solve(run)
    assert "2 x 4 x T x ffn + 4 x T x r + 4 x T x h" in next(
        t.formula for t in result.terms if t.label.startswith(FORWARD_TERM))
    excess = _measured(run, "forward") - REPORT.predicted_phases(result)["forward"] - _residue(run)
    assert excess == 2 * T - 2 * T * 256 - 4 * T * run["lora"]["rank"]
    assert 8_882_176 * T // 1024 - excess == 2 * 2 * T * 2048 + 4 * T * 256 + 2 * T * run["lora"]["rank"]


@pytest.mark.parametrize("run", ALL_WIDE, ids=[r["id"] for r in ALL_WIDE])
def test_every_linear_adapted_backward_at_up_projs_fp32_adapter(run):
    """Every linear adapted over the bf16 base with peft's fp32 adapters, the recompute's moment at up_proj's adapter
    (validation/lora_ckpt_trace.py: lora_B's fp32 output and its scaled copy, 2 x 4 B x T x ffn, beside up's base
    output and the saved set made so far) is the layer's largest: the backward -5.8 .. -8.5 % -> -5.1 .. -5.4 %, beyond
    the tracker's residue 575,496 B at 1,024 tokens (one layer's adapter gradients, 573,440, and 2 x T + 8 B) and
    1,052,680 at 2,048 (T x h x 2 + 4,104), never over."""
    result = _solve(run)
    term = next(t for t in result.terms if t.label.startswith(BACKWARD_TERM))
    assert "at up_proj's fp32 adapter in the recompute" in term.formula
    T = run["batch_size"] * run["seq_len"]
    gap = _measured(run, "backward") - REPORT.predicted_phases(result)["backward"] - _residue(run)
    assert gap == {1024: 573_440 + 2 * T + 8, 2048: 2 * T * 256 + 2 * T + 8}[T]


def test_forward_moment_by_hand():
    """llama-wide q/v, 4 x 256 tokens, bf16: T = 1,024, h = 256, ffn = 2,048, c = res = 2; a = c T ffn = 4,194,304;
    the MLP's max(a + 1,048,576 (down_proj's bf16 dequantization, 256 x 2,048 x 2 B), 2a + 2 x 524,288, 3a) = 3a =
    12,582,912; plus (2c + res) T h = 1,572,864: 14,155,776 B, beyond the loss's moment."""
    run = next(r for r in QV_WIDE if r["seq_len"] == 256)
    term = next(t for t in _solve(run).terms if t.label.startswith(FORWARD_TERM))
    assert "14,155,776 B" in term.formula
    at_loss = int(term.formula.split(" - ")[-1].split(" B")[0].replace(",", ""))
    assert term.nbytes == 14_155_776 - at_loss > 0
