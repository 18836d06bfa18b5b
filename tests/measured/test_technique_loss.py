"""The ``loss`` option (issue 16, item 2): torchtune's chunked cross-entropy and Liger's fused
linear cross-entropy against the runs of validation/techniques/loss/ (every phase), hand-derived
byte counts, the default unchanged, and what is refused. No torch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, FORWARD
from mlsysim_core.types import HardwareNode
from mlsysim_plugins.measured import loss as L

ROOT = Path(__file__).resolve().parents[2]
RUNS = json.loads((ROOT / "validation/techniques/loss/measurements.json").read_text(encoding="utf-8"))["runs"]
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PRECISION = {"fp32": "fp32", "bf16": "bf16", "amp-bf16": "bf16"}
PHASES = ("forward", "backward", "optimizer")
LLAMA = dict(model_type="llama", vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
             num_attention_heads=8, num_key_value_heads=2, hidden_act="silu", max_position_embeddings=4096,
             rms_norm_eps=1e-6, tie_word_embeddings=False, rope_theta=10000.0, use_cache=False)


def solve(model, b=2, s=256, regime="bf16", checkpointing="none", device="cpu", **options):
    return TrainingMemoryModel().solve(model, BIG, b, s, PRECISION.get(regime, "bf16"), "adamw", checkpointing, profile="measured",
                                       regime=regime, attention="sdpa", device=device, runtime_overheads=False,
                                       **options)


def solve_run(run):
    model = from_hf_config(run["hf_config"], name=run["id"])
    return solve(model, run["batch_size"], run["seq_len"], run["regime"], run["checkpointing"],
                 **run.get("solve_options", {}))


def totals(result):
    return result.phase_totals


def errors(run):
    r = solve_run(run)
    t = totals(r)
    pred = {"forward": t.get("forward", 0), "backward": max(t.get("backward", 0), t.get("backward_end", 0)),
            "optimizer": t.get("optimizer_step", 0)}
    meas = {p: run["measured"]["peak_by_phase"][p]["bytes"] for p in PHASES}
    out = {p: (pred[p] - meas[p]) / meas[p] for p in PHASES}
    out["peak"] = (r.total_memory - run["measured"]["peak_bytes"]) / run["measured"]["peak_bytes"]
    return out


ERRORS = {r["id"]: errors(r) for r in RUNS}


# --- against the measurements -------------------------------------------------------------------------

def test_every_loss_dense_and_moe_at_two_sizes_is_measured():
    got = {(r["loss"], r["hf_config"]["model_type"], r["model"]) for r in RUNS}
    for loss in ("chunked", "fused_linear"):
        for arch in ("llama", "mixtral"):
            assert len({m for lo, a, m in got if lo == loss and a == arch}) >= 2, (loss, arch)


@pytest.mark.parametrize("loss", ["cross_entropy", "chunked", "fused_linear"])
def test_targets_every_phase(loss):
    errs = [ERRORS[r["id"]] for r in RUNS if r["loss"] == loss]
    assert errs
    for key in ("peak",) + PHASES:
        values = [abs(e[key]) for e in errs]
        assert statistics.median(values) <= 0.03, (loss, key, values)
        assert max(values) <= 0.10, (loss, key, values)


@pytest.mark.parametrize("rid", sorted(ERRORS))
def test_each_run_every_phase_within_ten_percent(rid):
    assert all(abs(e) <= 0.10 for e in ERRORS[rid].values()), ERRORS[rid]


# --- hand-derived bytes -------------------------------------------------------------------------------

def _terms(result, phase):
    return {t.label: t.nbytes for t in result.terms if phase in t.phases}


def test_default_unchanged_and_cross_entropy_is_the_default():
    m = from_hf_config(LLAMA, name="llama")
    a, b = solve(m), solve(m, loss="cross_entropy")
    assert a.total_memory == b.total_memory and totals(a) == totals(b)


def test_chunked_forward_keeps_whole_bf16_logits_and_one_fp32_chunk():
    # bf16, b=2, s=256 (T=512), V=32000, 8 chunks of 32 positions (t = 64 tokens):
    # logits 2 T V + fp32 copy of one chunk 4 t V; the log-softmax stays whole (4 T V).
    m = from_hf_config(LLAMA, name="llama")
    fw = _terms(solve(m, loss="chunked"), FORWARD)
    assert fw["logits, every chunk (2 B) + one chunk's fp32 copy"] == 2 * 512 * 32000 + 4 * 64 * 32000
    assert fw["log-softmax of every chunk's logits (fp32)"] == 4 * 512 * 32000
    ce = solve(m)
    saved = totals(solve(m))["forward"] - totals(solve(m, loss="chunked"))["forward"]
    assert saved == 4 * 512 * 32000 - 4 * 64 * 32000          # only the fp32 copy shrinks to one chunk
    assert totals(ce)["backward"] > totals(solve(m, loss="chunked"))["backward"]


def test_chunked_backward_moment_of_the_lm_head():
    # fp32, T=512, V=32000, h=256, n=8, t=64: the LM head's backward, second chunk's partial summed:
    # 4 T V x 6/8 (logits gradients left) + 3 x V h x 4 + 2 x t h x 4 - 4 T V (log-softmax freed),
    # larger than one chunk's cross-entropy temporaries 8 t V.
    m = from_hf_config(LLAMA, name="llama")
    bw = _terms(solve(m, regime="fp32", loss="chunked"), BACKWARD)
    T, V, h, t = 512, 32000, 256, 64
    want = 4 * T * V * 6 / 8 + 3 * V * h * 4 + 2 * t * h * 4 - 4 * T * V
    assert want > 8 * t * V
    assert bw["LM head backward: the chunks' logits gradients and the weight gradient partials"] == want


def test_fused_chunk_size_is_ligers():
    # Liger's own comment (fused_linear_cross_entropy.py line 63): BT=4096*4, V=32000, H=4096 -> 2048.
    assert L.fused_chunk_tokens(4096 * 4, 4096, 32000) == 2048
    assert L.fused_chunk_tokens(512, 256, 32000) == 8       # ceil(32000 / 256) = 125; ceil(512 / 125) = 5 -> 8
    assert L.fused_chunk_tokens(8, 4096, 32000) == 1


def test_fused_terms():
    # bf16, T=512, h=256, V=32000: grad_input 2 T h and grad_weight 2 V h saved; the LM head input (2 T h)
    # is no longer saved by the final norm term; per chunk (t=8): 2 t V logits + the weight-gradient
    # mm (2 V h) and its fp32 copy (4 V h).
    m = from_hf_config(LLAMA, name="llama")
    r = solve(m, loss="fused_linear")
    T, h, V, t = 512, 256, 32000, L.fused_chunk_tokens(512, 256, 32000)
    saved = _terms(r, BACKWARD)
    assert saved["fused loss: LM head input gradient (computed in the forward)"] == 2 * T * h
    assert saved["fused loss: LM head weight gradient (computed in the forward)"] == 2 * V * h
    fw = _terms(r, FORWARD)
    assert fw["fused loss: shifted labels, per-token loss, one logits chunk"] == 8 * T + 4 * T + 2 * t * V + 6 * V * h
    assert not any("log-softmax" in k for k in fw)
    assert any("unvalidated" in n for n in r.notes)


def test_fused_amp_on_a_gpu_takes_addmm():
    m = from_hf_config(LLAMA, name="llama")
    T, h, V = 512, 256, 32000
    t = L.fused_chunk_tokens(T, h, V)
    gpu = _terms(solve(m, regime="amp-bf16", device="cuda", loss="fused_linear"), FORWARD)
    assert gpu["fused loss: shifted labels, per-token loss, one logits chunk"] == 12 * T + 2 * t * V + max(2 * t * h, 2 * t * h)
    cpu = _terms(solve(m, regime="amp-bf16", device="cpu", loss="fused_linear"), FORWARD)
    assert cpu["fused loss: shifted labels, per-token loss, one logits chunk"] == 12 * T + 2 * t * V + 6 * V * h


def test_added_step_time():
    m = from_hf_config(LLAMA, name="llama")
    for loss, launches in (("chunked", 13 * 7), ("fused_linear", None)):
        r = solve(m, loss=loss)
        seconds, how = L.added_step_time(r.plan if hasattr(r, "plan") else _plan(m, loss))
        assert seconds is not None and seconds >= 0 and "no extra FLOPs" in how
        if launches:
            assert seconds == pytest.approx(launches * L.LAUNCH_S)


def _plan(model, loss):
    import types
    return types.SimpleNamespace(profile_options=types.SimpleNamespace(loss=loss, loss_chunks=None),
                                 microbatch=2, seq_len=256, model=model)


# --- what is refused ----------------------------------------------------------------------------------

def test_bad_values():
    m = from_hf_config(LLAMA, name="llama")
    with pytest.raises(InvalidInputError, match="loss"):
        solve(m, loss="focal")
    with pytest.raises(InvalidInputError, match="loss_chunks"):
        solve(m, loss="fused_linear", loss_chunks=4)
    with pytest.raises(InvalidInputError, match="loss_chunks"):
        solve(m, loss="chunked", loss_chunks=0)
    with pytest.raises(InvalidInputError, match="sequence length"):
        solve(m, s=4, loss="chunked", loss_chunks=8)


@pytest.mark.parametrize("loss", ["chunked", "fused_linear"])
def test_not_modelled(loss):
    m = from_hf_config(LLAMA, name="llama")
    if loss != "chunked":       # (torchtune's chunked loss declares LoRA: tests/measured/test_lora_variants.py)
        with pytest.raises(NotModelledError, match="LoRA"):
            solve(m, loss=loss, lora={"rank": 8})
    with pytest.raises(NotModelledError, match="tensor parallelism"):
        TrainingMemoryModel().solve(m, BIG, 2, 256, "bf16", "adamw", "none", tp_size=2, profile="measured",
                                    regime="bf16", loss=loss)
    with pytest.raises(NotModelledError, match="Megatron"):
        solve(m, regime="mixed-bf16-main-grad", loss=loss)
    gemma2 = from_hf_config(dict(model_type="gemma2", vocab_size=8192, hidden_size=256, intermediate_size=512,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                                 final_logit_softcapping=30.0, use_cache=False), name="g2")
    with pytest.raises(NotModelledError, match="soft-capping"):
        solve(gemma2, regime="bf16", loss=loss)
