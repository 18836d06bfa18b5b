"""The per-layer activation formulas against the committed PyTorch measurements, to the byte."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_plugins.measured.layers import LayerBytes, amp_weight_copies, layer_forward_bytes
from scripttools import load_script

MEASUREMENTS = Path(__file__).resolve().parents[2] / "validation" / "measurements.json"
RUNS = json.loads(MEASUREMENTS.read_text())["runs"]


def _shape(run: dict) -> dict:
    """The layer shape of a run, read from its Hugging Face config."""
    hf = run["hf_config"]
    if hf["model_type"] == "gpt2":
        hidden, heads = hf["n_embd"], hf["n_head"]
        return dict(family="gpt2", hidden=hidden, heads=heads, kv_heads=heads, head_dim=hidden // heads,
                    ffn=hf.get("n_inner") or 4 * hidden)
    hidden, heads = hf["hidden_size"], hf["num_attention_heads"]
    shape = dict(family="mixtral" if hf["model_type"] == "mixtral" else "llama", hidden=hidden, heads=heads,
                 kv_heads=hf.get("num_key_value_heads") or heads, head_dim=hidden // heads,
                 ffn=hf["intermediate_size"])
    if shape["family"] == "mixtral":
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
    kw = dict(family="mixtral", hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, regime="amp-bf16",
              attention="eager", dropout=True, seq_len=128, experts=8, top_k=2)
    one, two = layer_forward_bytes(tokens=128, **kw), layer_forward_bytes(tokens=256, **kw)
    assert isinstance(one, LayerBytes)
    assert one.saved == sum(p.nbytes for p in one.parts)
    assert two.saved - one.saved == one.saved - 4 * 8          # expert offsets do not scale
    assert two.output == 2 * one.output


def test_output_saved_by_next():
    base = dict(hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=128, attention="sdpa", dropout=False,
                tokens=8, seq_len=8)
    assert layer_forward_bytes(family="llama", regime="fp32", **base).output_saved_by_next
    assert layer_forward_bytes(family="llama", regime="amp-bf16", **base).output_saved_by_next
    assert not layer_forward_bytes(family="llama", regime="bf16", **base).output_saved_by_next
    assert layer_forward_bytes(family="gpt2", regime="bf16", **base).output_saved_by_next


def test_unknown_names_raise():
    base = dict(hidden=64, heads=4, kv_heads=4, head_dim=16, ffn=128, attention="sdpa", dropout=False,
                tokens=8, seq_len=8)
    with pytest.raises(ValueError):
        layer_forward_bytes(family="bert", regime="fp32", **base)
    with pytest.raises(ValueError):
        layer_forward_bytes(family="llama", regime="fp16", **base)


# Combinations measurements.json lacks (SDPA with dropout, AMP/bf16 with dropout), measured the same way
# (validation/measure.py's tracker, real CPU tensors) on the tiny models: (model, regime, attention,
# dropout, batch, seq_len, layer_forward_retained_bytes).
EXTRA = [
    ("gpt2-tiny", "fp32", "sdpa", 0.1, 1, 64, 2294784),
    ("gpt2-tiny", "fp32", "sdpa", 0.1, 2, 96, 6786048),
    ("gpt2-tiny", "bf16", "sdpa", 0.1, 1, 96, 2065152),
    ("gpt2-tiny", "amp-bf16", "sdpa", 0.1, 1, 96, 3741696),
    ("gpt2-tiny", "amp-bf16", "eager", 0.1, 1, 96, 3446784),
    ("gpt2-tiny", "bf16", "eager", 0.1, 1, 96, 1696512),
    ("llama-tiny", "fp32", "sdpa", 0.1, 1, 96, 2925312),
    ("llama-tiny", "bf16", "sdpa", 0.1, 1, 96, 2200320),
    ("llama-tiny", "amp-bf16", "sdpa", 0.1, 1, 96, 3977984),
    ("llama-tiny", "amp-bf16", "eager", 0.1, 1, 96, 3683072),
    ("gqa-tiny", "bf16", "sdpa", 0.1, 2, 64, 2540544),
    ("gqa-tiny", "amp-bf16", "sdpa", 0.1, 2, 64, 4187136),
    ("gqa-tiny", "bf16", "eager", 0.1, 2, 64, 2081792),
    ("mixtral-tiny", "amp-bf16", "sdpa", 0.1, 2, 64, 5000736),
    ("mixtral-tiny", "bf16", "eager", 0.1, 2, 64, 2702880),
    ("mixtral-tiny", "amp-bf16", "eager", 0.0, 2, 64, 4410912),
]


@pytest.mark.parametrize("model,regime,attention,dropout,batch,seq_len,measured", EXTRA,
                         ids=["-".join(map(str, e[:6])) for e in EXTRA])
def test_layer_forward_bytes_match_extra_measurements(model, regime, attention, dropout, batch, seq_len,
                                                      measured):
    configs = load_script(MEASUREMENTS.parent / "configs.py")
    run = dict(hf_config=configs._hf(configs.MODELS[model][1], dropout), batch_size=batch, seq_len=seq_len,
               regime=regime, attention=attention, checkpointing="none", dropout=dropout)
    assert expected(run) == measured
