"""LitGPT's chunked LM head and chunked cross-entropy under LoRA (``loss="litgpt_chunked"`` with ``lora``; issue 25
item 2) against validation/lora_litgpt_chunked_measurements.json (peft's LoRA on Llama, LitGPT's finetune_lora step,
MemTracker), hand-derived bytes and what stays refused. No torch."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "validation"))
sys.path.insert(0, str(ROOT / "validation" / "families"))
script = load_script("validation/lora_litgpt_chunked.py")

from report_families import predicted_phases  # noqa: E402
from report_lora_variants import end_of_forward  # noqa: E402

RUNS = {r["id"]: r for r in json.loads(Path(script.PATH).read_text(encoding="utf-8"))["runs"] if r.get("measured")}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)


def test_every_phase_to_within_24_bytes():
    """bf16 and fp32, one to three sequences, two or three chunks, LoRA and QLoRA (nf4 and nf4-dq, the LM head
    quantized too): every phase and the forward's end within 24 B (the scalars: the per-chunk total weights, the loss).
    bitsandbytes' QuantState tensors are alive and unseen by the tracker (recorded apart: quant_state_bytes)."""
    rows = script.compare()
    assert len(rows) == 8 and {r["run"]["id"] for r in rows} == set(RUNS)
    assert sum(1 for r in rows if r["run"]["lora"]["quantization"]) == 4
    for row in rows:
        m = row["run"]["measured"]
        q = m.get("quant_state_bytes", 0)
        pred = predicted_phases(row["result"])
        for phase in ("forward", "backward", "optimizer"):
            assert -24 <= pred[phase] - m["peak_by_phase"][phase]["bytes"] - q <= 0, (row["run"]["id"], phase)
        assert -24 <= end_of_forward(row["result"]) - m["alive"]["end_of_forward"]["bytes"] - q <= 0


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


def _weights(run_id):
    row = next(r for r in script.compare() if r["run"]["id"] == run_id)
    return {t.label: t.nbytes for t in row["result"].terms if t.component == "weights"}


def test_qlora_hand_derived_bytes():
    """QLoRA nf4-dq (LitGPT's bnb.nf4-dq) on gqa-tiny (V = 32,000, h = 256, 4 layers) in bf16: the LM head stored
    as bitsandbytes 4-bit beside the decoder linears, its whole weight dequantized by each chunk's matmul."""
    V, h, blocks = 32000, 256, 32000 * 256 // 64
    w = _weights("litgpt-qlora-nf4-dq-gqa-tiny-bf16-r8-qv-base-b1-s256")
    # decoder linears per layer: q 256x256, k and v 256x64, o 256x256, gate and up 256x688, down 688x256
    decoder = 4 * (2 * 256 * 256 + 2 * 256 * 64 + 3 * 256 * 688)
    assert w["quantized base linears (4-bit nf4)"] == (decoder + V * h) // 2
    assert w["frozen base parameters (2 B)"] == 2 * (V * h + 4 * 2 * h + h)      # the embedding and the norms
    t = _terms("litgpt-qlora-nf4-dq-gqa-tiny-bf16-r8-qv-base-b1-s256")
    # one sequence: the last chunk's matmul, the previous logits beside the new, the dequantized head and its
    # fp32 absmax
    assert t["the LM head's moment beyond the loss's: the previous iteration's logits and the dequantized head"] == (
        2 * 256 * V + 2 * 256 * h + 2 * V * h + 4 * blocks - (2 * 255 * V + 2 * 2 * 255))
    # its backward: every chunk's logits gradient (the last zero-filled to 128 rows), the head dequantized again
    assert t["the quantized LM head's backward beyond the loss's: its weight dequantized again"] == (
        2 * 256 * V + 2 * V * h + 4 * blocks - (2 * 255 * V + 2 * 2 * 128 * V))
    # two sequences: the loss's moment (its copy of the last chunk) stays above the head's, by the targets less
    t = _terms("litgpt-qlora-nf4-dq-gqa-tiny-bf16-r8-qv-base-b2-s256")
    assert t["the LM head's moment beyond the loss's: the previous iteration's logits and the dequantized head"] == (
        2 * 512 * V + 2 * 512 * h + 2 * V * h + 4 * blocks - (2 * 510 * V + 2 * 2 * 510 + 2 * 2 * 127 * V + 8 * 510))
    assert "the quantized LM head's backward beyond the loss's: its weight dequantized again" not in t
    # nf4 without double quantization: no fp32 absmax made (the stored one is used); the backward's top is the
    # input gradient's matmul beside the dequantized head
    t = _terms("litgpt-qlora-nf4-gqa-tiny-bf16-r8-qv-base-b1-s256")
    assert t["the LM head's moment beyond the loss's: the previous iteration's logits and the dequantized head"] == (
        2 * 256 * V + 2 * 256 * h + 2 * V * h - (2 * 255 * V + 2 * 2 * 255))
    assert t["the quantized LM head's backward beyond the loss's: its weight dequantized again"] == (
        2 * 256 * V + 2 * V * h + 2 * 128 * h - (2 * 255 * V + 2 * 2 * 128 * V))


def test_the_lm_head_is_quantized_by_the_loss_declaration():
    """The LM head is stored 4-bit because litgpt_chunked declares ``quantizes_lm_head``; a third party's copy
    without the declaration keeps it in the base's dtype (peft's QLoRA), with the declaration it is the
    built-in's, whatever its name."""
    import attrs

    from mlsysim_core import hookimpl
    from mlsysim_core.manager import PluginManager
    from mlsysim_core.registry import PluginInfo
    from mlsysim_plugins.measured.loss_implementations import HOOK
    from mlsysim_plugins.measured.published_losses import PUBLISHED

    builtin = PluginManager.from_environment(autoload=False, blocked=())
    impl = next(i for i in PUBLISHED if i.name == "litgpt_chunked")
    items = [attrs.evolve(impl, name="acme_head"), attrs.evolve(impl, name="acme_plain", quantizes_lm_head=False)]

    class Acme:
        pass
    setattr(Acme, HOOK, staticmethod(hookimpl(lambda: list(items))))
    pm = PluginManager()
    for name, plugin in sorted(builtin.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=name, info=builtin.info(name))
    info = PluginInfo(name="acme_losses", distribution="acme-losses", version="1.0")
    pm.register(Acme(), name=info.name, info=info)
    pm.check()

    def solve(loss):
        r = TrainingMemoryModel(plugin_manager=pm).solve(
            "llama3.2-1b", BIG, 1, 512, "bf16", "adamw", "none", profile="measured", regime="bf16", loss=loss,
            lora=LoRAConfig(rank=8, quantization="nf4", double_quant=True, adapter_dtype="base"))
        return sorted((t.label, t.nbytes) for t in r.terms), {t.label: t.nbytes for t in r.terms}

    declared, renamed, plain = solve("litgpt_chunked"), solve("acme_head"), solve("acme_plain")
    assert renamed[0] == declared[0]
    V, h = 128256, 2048
    key = "quantized base linears (4-bit nf4)"
    assert declared[1][key] - plain[1][key] == V * h // 2
    # llama3.2-1b ties its embedding: the head's 4-bit copy is made beside it, the embedding stays 16-bit
    assert declared[1]["frozen base parameters (2 B)"] == plain[1]["frozen base parameters (2 B)"]


@pytest.mark.parametrize("regime,lora,match", [
    ("amp-bf16", LoRAConfig(rank=8), "autocast"),
    ("bf16", LoRAConfig(rank=8, quantization="int8", adapter_dtype="base"), "int8 Linear8bitLt"),
    ("bf16", LoRAConfig(rank=8, use_dora=True, adapter_dtype="base"), "LoRA or 4-bit QLoRA"),
])
def test_what_stays_refused(regime, lora, match):
    with pytest.raises(NotModelledError, match=match) as err:
        TrainingMemoryModel().solve("llama3.2-1b", BIG, 1, 512, "bf16", "adamw", "none", profile="measured",
                                    regime=regime, lora=lora, loss="litgpt_chunked")
    assert err.value.parameter == "loss"
