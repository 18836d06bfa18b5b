"""``compile="blocks"`` under pipeline parallelism (torchtitan compiles each block of each stage's model chunk):
against validation/compile/blocks_pp_measurements.json (one stage of torchtune's model measured alone, 1F1B,
eager and per-block compiled, the profiler's timeline), hand-derived bytes and what stays refused. No torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
compare = load_script("validation/compile/compare_blocks_pp.py")

RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_pp_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas) for rid, pred, meas in compare.rows()}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
GRADIENTS = 7_376_896         # stage 0's gradients (fp32): the eager pipeline rule counts them from the first forward


def off(rid, phase):
    pred, meas = ROWS[rid]
    return pred[phase] - meas[phase]


def test_every_stage_measured():
    assert len(RUNS) == 8 and set(ROWS) == set(RUNS)


def test_the_last_stage_compile_delta_is_exact():
    """The last stage (its blocks, the final norm, LM head and loss; one micro-batch in flight under 1F1B), fp32:
    the compiled run sits where the eager one sits against the prediction (the RoPE tables' offset), every phase."""
    e, c = (f"tt-llama3_2-4l-v1024-untied-fp32-{k}-pp2-stage1-m2-b1-s512" for k in ("eager", "blocks"))
    for phase in compare.PHASES:
        assert abs(off(c, phase) - off(e, phase)) <= 64, phase
        assert abs(off(c, phase)) / ROWS[c][1][phase] < 0.003, phase


def test_the_bf16_last_stage():
    """bf16: the compiled last stage's backward and step within 0.1 %; its forward peak +1.9 %, torchtune's
    ``self.output(h).float()`` (the bf16 logits freed when the model returns; the single-device bf16 rows, +16 % at
    V 32,000, for the same reason). (The eager twin, -3.1 % on the backward, is the eager rule's on torchtune's
    bf16 stage.)"""
    c = "tt-llama3_2-4l-v1024-untied-bf16-blocks-pp2-stage1-m2-b1-s256"
    assert abs(off(c, "backward")) / ROWS[c][1]["backward"] < 0.001
    assert abs(off(c, "optimizer")) / ROWS[c][1]["optimizer"] < 0.001
    assert 0 < off(c, "forward") < 2 * 256 * 1024


@pytest.mark.parametrize("regime", ["fp32", "bf16"])
def test_the_first_stage_forward_is_the_blocks_saved_sets_of_both_micro_batches(regime):
    """The first stage's forward peak (its two warm-up forwards, 1F1B): the compiled blocks' sets and the
    embedding output of both micro-batches, to the byte but for the eager pipeline rule's gradients (born in the
    backward: the measured iteration starts after zero_grad(set_to_none=True)) and the RoPE tables (Hugging
    Face's cos/sin priced, torchtune's cache buffer measured)."""
    s = "s512" if regime == "fp32" else "s256"
    c = f"tt-llama3_2-4l-v1024-untied-{regime}-blocks-pp2-stage0-m2-b1-{s}"
    grads = GRADIENTS if regime == "fp32" else GRADIENTS // 2
    T, c_ = int(s[1:]), 4 if regime == "fp32" else 2
    rope = 2 * T * 32 * c_ - T * 16 * 2 * c_       # cos/sin priced - torchtune's cache (s x head_dim/2 x 2)
    assert 0 <= off(c, "forward") - grads - rope <= 128     # (the frequency buffers: 128 B priced, theta measured)


def solve(stage_rank=None, **kw):
    run = next(iter(RUNS.values()))
    kw = {"compile": "blocks", "pp_size": 2, "pipeline_schedule": "1f1b", "gradient_accumulation_steps": 2, **kw}
    checkpointing = kw.pop("checkpointing", "none")
    return TrainingMemoryModel().solve(from_hf_config(run["hf_config"], name="tt-4l"), BIG, 2, 512, "fp32", "adamw",
                                       checkpointing, profile="measured", regime="fp32", attention="sdpa",
                                       device="cpu", runtime_overheads=False, optimizer_impl="foreach", **kw)


def test_hand_derived_first_stage():
    """Stage 0 of 2 (4 layers, 1F1B, m = 2: two micro-batches in flight): 2 blocks x 2 x 16,488 B x T, and the
    embedding output of each micro-batch (the eager term: the first norm saves it in fp32)."""
    rank = next(r for r in solve().ranks if 0 in r.stages)
    t = {x.label: x.nbytes for x in rank.terms}
    assert t["decoder layers: saved for backward (compiled)"] == 2 * 2 * 16_488 * 512
    assert t["embedding output (saved by the first norm)"] == 2 * 512 * 256 * 4


@pytest.mark.parametrize("kw, name", [
    (dict(lora=LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), adapter_dtype="base")), "lora"),
    (dict(checkpointing="op-sac"), "activation_checkpointing"),
    (dict(pp_size=1, cp_size=2, gradient_accumulation_steps=1), "cp_size"),
])
def test_refused_by_name(kw, name):
    with pytest.raises(NotModelledError, match=name):
        solve(**kw)
