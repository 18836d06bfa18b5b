"""The per-layer activation formulas against the committed PyTorch measurements, to the byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core.measured.layers import LayerBytes, amp_weight_copies, layer_forward_bytes

MEASUREMENTS = Path(__file__).resolve().parents[1] / "validation" / "measurements.json"
RUNS = json.loads(MEASUREMENTS.read_text())["runs"]


def _shape(run: dict) -> dict:
    """The layer shape of a run, read from its Hugging Face config."""
    hf = run["hf_config"]
    if hf["model_type"] == "gpt2":
        hidden, heads = hf["n_embd"], hf["n_head"]
        return dict(style="gpt2", hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads,
                    ffn=hf.get("n_inner") or 4 * hidden)
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    shape = dict(style="mixtral" if hf["model_type"] == "mixtral" else "llama", hidden=hidden, heads=heads,
                 kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hidden // heads,
                 ffn=hf["intermediate_size"])
    if shape["style"] == "mixtral":
        shape.update(experts=hf["num_local_experts"], top_k=hf["num_experts_per_tok"])
    return shape


def expected(run: dict) -> int:
    shape = _shape(run)
    tokens = run["batch_size"] * run["seq_len"]
    if run["checkpointing"] == "full":
        # Non-reentrant checkpointing keeps only the layer's input (the residual stream), plus the
        # AMP weight copies, which autocast still caches.
        total = tokens * shape["hidden"] * (2 if run["regime"] == "bf16" else 4)
    else:
        lb = layer_forward_bytes(**shape, regime=run["regime"], attention=run["attention"],
                                 dropout=run["dropout"] > 0, tokens=tokens, seq_len=run["seq_len"])
        total = lb.saved + lb.output
    if run["regime"] == "amp-bf16":
        total += amp_weight_copies(**{k: v for k, v in shape.items() if k != "top_k"})
    return total


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_layer_forward_bytes_match_measurement(run):
    measured = run["measured"]["layer_forward_retained_bytes"]
    assert len(set(measured)) == 1, "every decoder layer retains the same bytes"
    assert expected(run) == measured[0]


def test_parts_add_up_and_scale_with_tokens():
    kw = dict(style="mixtral", hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, regime="amp-bf16",
              attention="eager", dropout=True, seq_len=128, experts=8, top_k=2)
    one, two = layer_forward_bytes(tokens=128, **kw), layer_forward_bytes(tokens=256, **kw)
    assert isinstance(one, LayerBytes)
    assert one.saved == sum(n for _, n in one.parts)
    assert two.saved - one.saved == one.saved - 4 * 8          # expert offsets do not scale
    assert two.output == 2 * one.output


def test_output_saved_by_next():
    base = dict(hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=128, attention="sdpa", dropout=False,
                tokens=8, seq_len=8)
    assert layer_forward_bytes(style="llama", regime="fp32", **base).output_saved_by_next
    assert layer_forward_bytes(style="llama", regime="amp-bf16", **base).output_saved_by_next
    assert not layer_forward_bytes(style="llama", regime="bf16", **base).output_saved_by_next
    assert layer_forward_bytes(style="gpt2", regime="bf16", **base).output_saved_by_next


def test_unknown_names_raise():
    base = dict(hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=128, attention="sdpa", dropout=False,
                tokens=8, seq_len=8)
    with pytest.raises(ValueError):
        layer_forward_bytes(style="bert", regime="fp32", **base)
    with pytest.raises(ValueError):
        layer_forward_bytes(style="llama", regime="fp16", **base)
