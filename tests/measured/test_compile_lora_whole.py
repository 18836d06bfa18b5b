"""LoRA with ``compile=True`` (Hugging Face Trainer's ``torch_compile`` over a peft model:
``torch.compile(peft_model)``): the partitioner's saved set with a frozen base, LM head and embedding, against
validation/compile/lora_whole_measurements.json (peft 0.21.2 on transformers 5.23, the profiler's memory
timeline, every phase), hand-derived bytes and what is refused. No torch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
compare = load_script("validation/compile/compare_lora_whole.py")

DOC = json.loads((ROOT / "validation/compile/lora_whole_measurements.json").read_text(encoding="utf-8"))
RUNS = {r["id"]: r for r in DOC["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare.rows()}
COMPILED = [rid for rid, (pred, _) in ROWS.items() if rid.endswith("-compiled") and isinstance(pred, dict)]


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def test_the_trainer_path_compiles_one_graph():
    """peft's LoRA forward traces: one Dynamo graph, no graph break, in every measured run without
    checkpointing."""
    plain = [r for r in RUNS.values() if r["checkpointing"] == "none"]
    assert plain and all(r["measured"]["compiled"]["graphs"] == 1 and not r["measured"]["compiled"]["graph_breaks"]
                         for r in plain)


WIDE = "hf-llama-small-2l-v1024-fp32-lora-all-r16-b1-s512-compiled"     # the layers' backward sets the peak


def test_every_compiled_run_within_the_issue_targets():
    """Every modelled compiled run, every phase: median <= 1 %, max <= 5 % (issue 25) but the wide model's
    backward and forward peaks (below); the others to the byte but the step's few scalars."""
    assert len(COMPILED) >= 4
    for phase in compare.PHASES:
        errors = [abs(err(r, phase)) for r in COMPILED]
        assert statistics.median(errors) <= 0.01, phase
        for r in COMPILED:
            if r == WIDE and phase in ("forward", "backward"):
                continue
            assert abs(ROWS[r][0][phase] - ROWS[r][1][phase]) <= 64, (r, phase)


def test_the_gap_where_the_layers_backward_sets_the_peak():
    """The wide model (h 512, FFN 1,376, every linear, r 16, vocabulary 1,024): the end of the forward and of the
    backward exact, but the backward's peak sits in the top layer's attention backward (after its MLP backward's
    product-sized gradients), which is not modelled: -8.0 %; the forward's peak -1.9 % (inside the top layer)."""
    if WIDE not in ROWS:
        pytest.skip("not measured")
    assert err(WIDE, "end_of_forward") == pytest.approx(0, abs=1e-6)
    assert -0.085 < err(WIDE, "backward") < -0.075
    assert -0.025 < err(WIDE, "forward") < -0.015


def _run(rid):
    return RUNS[rid.rsplit("-", 1)[0]] if rid.endswith(("-compiled", "-eager")) else RUNS[rid]


def _label(rid, label):
    return next(t.nbytes for t in compare.solve(_run(rid)).terms if t.label.startswith(label))


def test_hand_derived_q_v():
    """fp32, h 256, FFN 688, 8 heads, r 8, q and v adapted, b 2, s 512, 3 layers: per token the first layer
    11,748 B + its output 1,024 (as compile='blocks' with LoRA: the norm's output for lora_a, q, k, v, SDPA's
    output and log-sum-exp, lora_a's outputs, the residual, the MLP norm's rsqrt, gate and up), the others 4 B
    more; the last layer's output is the compiled final norm's saved input, in every dtype. Outside the layers:
    the mask b s^2 x 4, the final norm's rsqrt 4 T (the frozen LM head keeps no input), the logits 4 T V, the
    loss's per-token max and log-sum-exp 8 T, the padded labels 8 b (s + 1) and the loss 8; no embedding
    output."""
    rid = "hf-llama-tiny-3l-v1024-fp32-lora-qv-b2-s512"
    T = 2 * 512
    assert _label(rid, "decoder layers") == T * ((11_748 + 1024) + 2 * (11_752 + 1024))
    assert _label(rid, "attention mask") == 4 * 2 * 512 * 512
    assert _label(rid, "final norm (compiled") == 4 * T
    assert _label(rid, "logits (saved") == 4 * T * 1024
    assert _label(rid, "final norm output at the LM head") == 4 * T * 256 - (8 * T + 8 * 2 * 513 + 8)
    labels = [t.label for t in compare.solve(RUNS[rid]).terms]
    assert not any(lab.startswith(("embedding output", "compiled backward's end", "log-softmax")) for lab in labels)


def test_peft_fp32_adapters_over_bf16():
    """bf16 base, peft's fp32 adapters: the attention norm's output is saved as the fp32 copy peft's
    ``Linear.forward`` casts for lora_a (4 h, not 2 h) and lora_a's outputs in fp32 (4 r each)."""
    rid = "hf-llama-tiny-3l-v1024-bf16-lora-qv-b1-s256"
    if rid not in RUNS:
        pytest.skip("not measured")
    T = 256
    first = 4 * 256 + 3 * 512 + 512 + 32 + 2 * 4 * 8 + 512 + 4 + 2 * 2 * 688
    assert _label(rid, "decoder layers") == T * ((first + 512) + 2 * (first + 4 + 512))


def test_off_is_eager_lora():
    run = RUNS["hf-llama-tiny-3l-v1024-fp32-lora-qv-b2-s512"]
    eager = compare.solve(run, compile=False)
    assert eager.total_memory > compare.solve(run).total_memory
    assert not any(t.label.startswith("attention mask") for t in eager.terms)


@pytest.mark.parametrize("lora, ckpt, name", [
    (dict(quantization="nf4"), "none", "lora"),
    (dict(use_dora=True), "none", "lora"),
    (dict(modules_to_save=("lm_head",)), "none", "lora"),
    ({}, "full", "activation_checkpointing"),
])
def test_refused_by_name(lora, ckpt, name):
    run = dict(RUNS["hf-llama-tiny-3l-v1024-fp32-lora-qv-b2-s512"], checkpointing=ckpt)
    with pytest.raises(NotModelledError, match=name):
        compare.solve(run, lora=LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), **lora))


def test_measured_but_refused_runs_name_why():
    """Measured, refused by name: bf16 with an adapted row-parallel linear (peft's fp32 copies' transients),
    Hugging Face's gradient checkpointing (Dynamo breaks the graph at requires_grad_), QLoRA (a dequantizing
    transient in the forward)."""
    refused = {rid: pred for rid, (pred, _) in ROWS.items() if rid.endswith("-compiled") and isinstance(pred, str)}
    assert "lora.target_modules" in refused["hf-llama-tiny-3l-v1024-bf16-lora-all-b1-s256-compiled"]
    assert "requires_grad_" in refused["hf-llama-tiny-3l-v1024-fp32-lora-qv-ckpt-b2-s512-compiled"]
    ckpt = RUNS["hf-llama-tiny-3l-v1024-fp32-lora-qv-ckpt-b2-s512"]["measured"]["compiled"]
    assert ckpt["graphs"] == 3
    nf4 = "hf-llama-tiny-3l-v1024-bf16-nf4-lora-qv-b1-s256"
    if nf4 in RUNS:
        assert "bitsandbytes" in refused[nf4 + "-compiled"]
        q, plain = RUNS[nf4]["measured"]["compiled"], RUNS["hf-llama-tiny-3l-v1024-bf16-lora-qv-b1-s256"]["measured"][
            "compiled"]
        assert q["alive"] == plain["alive"] and q["peak_by_phase"]["backward"] == plain["peak_by_phase"]["backward"]
        assert q["peak_by_phase"]["forward"] - plain["peak_by_phase"]["forward"] == 179_200


def test_bf16_adapters_in_the_base_dtype_are_refused():
    run = RUNS["hf-llama-tiny-3l-v1024-bf16-lora-qv-b1-s256"]
    with pytest.raises(NotModelledError, match="lora.adapter_dtype"):
        compare.solve(run, lora=LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), adapter_dtype="base"))


def test_hand_derived_dropout():
    """lora_dropout 0.05, fp32 q and v: each adapter saves its own dropout output (4 h) in place of the shared norm
    output (4 h), and beyond the first layer (whose norm's output needs no gradient) each bool mask (h): per token
    1,024 more in the first layer, 1,024 + 2 x 256 in the others."""
    rid = "hf-llama-tiny-3l-v1024-fp32-lora-qv-drop0.05-b2-s512"
    T = 2 * 512
    assert _label(rid, "decoder layers") == T * ((11_748 + 1024 + 1024) + 2 * (11_752 + 1024 + 1024 + 512))
    m, plain = RUNS[rid]["measured"]["compiled"], RUNS["hf-llama-tiny-3l-v1024-fp32-lora-qv-b2-s512"]["measured"][
        "compiled"]
    assert m["alive"]["end_of_forward"] - plain["alive"]["end_of_forward"] == T * (1024 + 2 * 1536)


def test_dropout_in_bf16_saves_fp32_dropout_outputs():
    """bf16, peft's fp32 adapters: the dropout outputs are fp32 (the input is cast first): measured 4,096 B per
    token above the run without dropout (1,024 in the first layer, 1,024 + 2 x 256 in the others)."""
    rid = "hf-llama-tiny-3l-v1024-bf16-lora-qv-drop0.05-b1-s256"
    m, plain = RUNS[rid]["measured"]["compiled"], RUNS["hf-llama-tiny-3l-v1024-bf16-lora-qv-b1-s256"]["measured"][
        "compiled"]
    assert m["alive"]["end_of_forward"] - plain["alive"]["end_of_forward"] == 256 * 4096
    assert ROWS[rid + "-compiled"][0]["end_of_forward"] == ROWS[rid + "-compiled"][1]["end_of_forward"]


def test_dropout_on_a_row_parallel_adapter_is_refused():
    run = RUNS["hf-llama-tiny-3l-v1024-fp32-lora-qv-b2-s512"]
    with pytest.raises(NotModelledError, match="lora.dropout"):
        compare.solve(run, lora=LoRAConfig(rank=8, target_modules=("q_proj", "o_proj"), dropout=0.05))
