"""LitGPT's chunked LM head and chunked cross-entropy under LoRA (``loss="litgpt_chunked"`` with ``lora``; issue 25
item 2) against validation/lora_litgpt_chunked_measurements.json (peft's LoRA on Llama, LitGPT's finetune_lora step,
MemTracker), hand-derived bytes and what stays refused. No torch."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.types import HardwareNode

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "validation"))
sys.path.insert(0, str(ROOT / "validation" / "families"))
_spec = importlib.util.spec_from_file_location("lora_litgpt_chunked", ROOT / "validation/lora_litgpt_chunked.py")
script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(script)

from report_families import predicted_phases  # noqa: E402
from report_lora_variants import end_of_forward  # noqa: E402

RUNS = {r["id"]: r for r in json.loads(Path(script.PATH).read_text(encoding="utf-8"))["runs"] if r.get("measured")}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)


def test_every_phase_to_within_24_bytes():
    """bf16 and fp32, one to three sequences, two or three chunks: every phase and the forward's end within 24 B
    (the scalars: the per-chunk total weights, the loss)."""
    rows = script.compare()
    assert len(rows) == 4 and {r["run"]["id"] for r in rows} == set(RUNS)
    for row in rows:
        m = row["run"]["measured"]
        pred = predicted_phases(row["result"])
        for phase in ("forward", "backward", "optimizer"):
            assert -24 <= pred[phase] - m["peak_by_phase"][phase]["bytes"] <= 0, (row["run"]["id"], phase)
        assert -24 <= end_of_forward(row["result"]) - m["alive"]["end_of_forward"]["bytes"] <= 0


def _terms(run_id):
    row = next(r for r in script.compare() if r["run"]["id"] == run_id)
    return {t.label: t.nbytes for t in row["result"].terms if t.component == "activations"}


def test_hand_derived_bytes():
    """gqa-tiny (V = 32,000, h = 256) in bf16, b = 2, s = 256: two chunks of 128 positions, R = 2 x 255 rows."""
    t = _terms("litgpt-lora-gqa-tiny-bf16-r8-qv-base-b2-s256")
    assert t["logits, every chunk (2 B, held through the backward and the step)"] == 2 * 512 * 32000
    assert t["log-softmax of every chunk (2 B)"] == 2 * 510 * 32000
    assert t["shifted targets (int64)"] == 8 * 510
    # the first chunk's (the engine's last) nll and log-softmax gradients, every chunk's targets released
    assert t["chunked cross-entropy backward, one chunk at a time"] == 2 * 2 * (2 * 128) * 32000 - 8 * 510
    assert t["the last chunk's shifted logits copy (2 B)"] == 2 * 2 * 127 * 32000
    # one sequence: the LM head's last chunk beside the previous iteration's logits is the forward's top
    t = _terms("litgpt-lora-gqa-tiny-bf16-r8-qv-base-b1-s256")
    assert t["the LM head's moment beyond the loss's: the previous iteration's logits"] == (
        2 * 256 * 32000 + 2 * 256 * 256 - (2 * 255 * 32000 + 2 * 2 * 255))
    # three chunks (s = 384): the middle one's moment, the first chunk's targets still saved
    t = _terms("litgpt-lora-llama-tiny-fp32-r8-qv-base-b2-s384")
    assert t["chunked cross-entropy backward, one chunk at a time"] == 2 * 4 * 256 * 32000 - 8 * 766 + 8 * 2 * 128


@pytest.mark.parametrize("regime,lora,match", [
    ("amp-bf16", LoRAConfig(rank=8), "autocast"),
    ("bf16", LoRAConfig(rank=8, quantization="nf4", adapter_dtype="base"), "BitsandbytesPrecision"),
    ("bf16", LoRAConfig(rank=8, use_dora=True, adapter_dtype="base"), "plain LoRA"),
])
def test_what_stays_refused(regime, lora, match):
    with pytest.raises(NotModelledError, match=match) as err:
        TrainingMemoryModel().solve("llama3.2-1b", BIG, 1, 512, "bf16", "adamw", "none", profile="measured",
                                    regime=regime, lora=lora, loss="litgpt_chunked")
    assert err.value.parameter == "loss"
