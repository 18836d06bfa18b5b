"""LoRA with ``compile="blocks"`` (torchtune's LoRA recipes with ``compile: True``): the compiled blocks' saved set
with frozen base weights, against validation/compile/blocks_measurements.json (torchtune 0.6.1's
``lora_llama3_2``, the profiler's memory timeline, every phase), hand-derived bytes and what is refused. No torch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
compare_blocks = load_script("validation/compile/compare_blocks.py")

RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured") and r.get("lora")}
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare_blocks.rows() if rid in RUNS}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PHASES = compare_blocks.PHASES
QV = ("q_proj", "v_proj")


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def test_every_lora_run_is_predicted_within_the_issue_targets():
    """Every LoRA run, eager and per-block compiled, every phase: median <= 1 %, max <= 5 % (issue 25); the
    compiled fp32 runs within 0.2 %, the eager runs' offsets (the bf16 forward: torchtune's LM head, below)."""
    compiled = [r for r in RUNS if "-blocks-" in r]
    assert len(compiled) == 4 and all(isinstance(ROWS[r][0], dict) for r in RUNS)
    for phase in PHASES:
        errors = [abs(err(r, phase)) for r in RUNS]
        assert statistics.median(errors) <= 0.01 and max(errors) <= 0.05, phase
        assert max(abs(err(r, phase)) for r in compiled if "-fp32-" in r) < 0.006, phase


def test_the_compile_delta_is_the_saved_set_less_eights_bytes_per_adapter():
    """Compiled minus eager, predicted against measured: equal but for 8 B per adapted linear and layer that the
    eager run holds and the compiled one does not (a CPU scalar of the adapter's scaling; not modelled)."""
    for rid, adapters in (("tt-llama3_2-3l-v1024-fp32-blocks-lora-qv-b2-s512", 2 * 3),
                          ("tt-llama3_2-3l-v1024-fp32-blocks-lora-all-b2-s512", 7 * 3),
                          ("tt-llama3_2-2l-v32000-fp32-blocks-lora-qv-b1-s512", 2 * 2),
                          ("tt-llama3_2-3l-v1024-bf16-blocks-lora-all-b1-s256", 7 * 3)):
        eager = rid.replace("-blocks-", "-eager-")
        for phase in ("forward", "backward", "end_of_forward"):
            pred = ROWS[rid][0][phase] - ROWS[eager][0][phase]
            meas = ROWS[rid][1][phase] - ROWS[eager][1][phase]
            assert pred - meas == 8 * adapters, (rid, phase)


def model(**over):
    hf = dict(next(iter(RUNS.values()))["hf_config"], num_hidden_layers=3, vocab_size=1024, **over)
    return from_hf_config(hf, name="tt-tiny-lora")


def solve(targets=QV, regime="fp32", compile="blocks", checkpointing="none", adapter_dtype="base", **kw):
    lora = kw.pop("lora", None) or LoRAConfig(rank=8, target_modules=targets, adapter_dtype=adapter_dtype)
    return TrainingMemoryModel().solve(model(), BIG, 2, 512, regime, "adamw", checkpointing, profile="measured",
                                       regime=regime, attention="sdpa", device="cpu", runtime_overheads=False,
                                       compile=compile, lora=lora, **kw)


def layers(r):
    return next(t.nbytes for t in r.terms if t.label.startswith("decoder layers"))


def test_hand_derived_q_v_blocks():
    """fp32, h 256, FFN 688, 8 heads, r 8, q and v adapted. The first block (its input needs no gradient): the
    attention norm's output 1,024 (lora_a's input) + q, k, v 3 x 1,024 + SDPA's output 1,024 and log-sum-exp 32 +
    lora_a's outputs 2 x 32 + the residual after attention 1,024 + the MLP norm's rsqrt 4 + gate and up
    2 x 2,752 = 11,748 B per token; the others add the attention norm's rsqrt (4); each block's output 1,024
    (the next block's input, the final norm's). Against eager: SiLU's output (2,752) and the eager norms' parts
    are gone; the frozen down projection's input is not saved."""
    T = 2 * 512
    assert layers(solve()) == T * ((11_748 + 1024) + 2 * (11_752 + 1024))


def test_hand_derived_every_linear():
    """Every linear adapted (torchtune's q, k, v, output_proj and MLP): per block the MLP norm's output (1,024),
    the gated product (2,752, the down projection's lora_a input) and seven lora_a outputs (7 x 32) more."""
    every = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    T = 2 * 512
    assert layers(solve(every)) == T * ((15_684 + 1024) + 2 * (15_688 + 1024))


def test_output_projection_alone_keeps_no_attention_in_the_first_block():
    """Only o adapted: nothing in the first block's attention needs a gradient (no SDPA backward); o's lora_a
    keeps SDPA's output (1,024) and its r-wide output; the later blocks keep the attention whole."""
    T = 2 * 512
    first = 1024 + 32 + 1024 + 4 + 2 * 2752
    other = 4 + 3 * 1024 + 1024 + 32 + 32 + 1024 + 4 + 2 * 2752
    assert layers(solve(("o_proj",))) == T * ((first + 1024) + 2 * (other + 1024))


def test_off_is_eager_lora():
    assert solve(compile=None).total_memory == solve(compile=False).total_memory
    assert layers(solve(compile=None)) > layers(solve())


@pytest.mark.parametrize("kw, name", [
    (dict(lora=LoRAConfig(rank=8, target_modules=QV, quantization="fp4")), "lora"),    # (nf4: QLoRA, measured:
    (dict(lora=LoRAConfig(rank=8, target_modules=QV, quantization="int8")), "lora"),   # test_compile_blocks_qlora)
    (dict(lora=LoRAConfig(rank=8, target_modules=QV, dropout=0.1)), "lora"),
    (dict(lora=LoRAConfig(rank=8, target_modules=QV, use_dora=True)), "lora"),
    (dict(regime="bf16", adapter_dtype="fp32"), "lora.adapter_dtype"),
    (dict(checkpointing="selective"), "activation_checkpointing"),
    (dict(targets=("q_proj", "gate_proj"), checkpointing="full"), "lora.target_modules"),   # (full: the MLP
])                                                     # wholly adapted or frozen, test_compile_blocks_extra.py)
def test_refused_by_name(kw, name):
    with pytest.raises(NotModelledError, match=name):
        solve(**kw)


README = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")     # torchtune's README LoRA targets


def _backward_moment(rank, **kw):
    r = solve(README, regime="bf16", checkpointing="full",
              lora=LoRAConfig(rank=rank, target_modules=README, adapter_dtype="base"), **kw)
    return next(t for t in r.terms if "recompute and MLP backward" in t.label)


def test_full_checkpointing_prices_the_highest_blocks_backward_moment():
    """bf16, 3 layers, T = 1,024, h 256, FFN 688. One block lower, its input (c T h = 524,288 B) and CPU RNG state
    (5,056 B) are freed and its adapters' gradients born: at rank 64, 64 x (3 x (256 + 256) + 3 x (256 + 688)) x 2 B
    = 559,104 B, +29,760 B a block; block 0's saved set is 4 B a token smaller (4,096 B): block 0's moment is the
    top block's + 2 x 29,760 - 4,096 = +55,424 B (measured so: validation/lora_offload's rank-64 twin). At rank 8
    (69,888 B of gradients a block) and with gradient accumulation (the gradients alive throughout) the top's."""
    term = _backward_moment(64)
    assert term.label == "the compiled recompute and MLP backward of block 0 (the highest block's moment)"
    assert "moments: top 0, block 1 29,760, block 0 55,424" in term.formula
    assert "559,104 B of adapter gradients born - 524,288 B input - 5,056 B RNG state freed" in term.formula
    assert _backward_moment(8).label == "the top block's compiled recompute and MLP backward"
    assert _backward_moment(64, gradient_accumulation_steps=2).label == ("the top block's compiled recompute and MLP "
                                                                        "backward")


MOMENTS = ROOT / "validation/compile/lora_moments_measurements.json"


def test_the_first_blocks_moment_measured_at_three_layer_counts_and_two_ranks():
    """validation/compile/measure_lora_moments.py (bf16, 256 tokens, the README's LoRA set; 3, 4, 6 layers at rank
    64, 4 at rank 128): every phase within 1 %. The backward's peak is block 0's moment; its prediction is
    147,544 B above the measured in every run, whatever the layer count and rank: the per-block step (adapter
    gradients born, an input and an RNG state freed) is exact, and block 0's moment holds one c T h (131,072 B)
    less than derived (not explained), beside 16,472 B (the other phases of these runs are 16.3 to 16.5 KB off
    too, as the offloaded twins' backward is). Priced on the top block's moment alone (before): -4.6 to -10.1 %."""
    rows = list(compare_blocks.rows(str(MOMENTS)))
    assert len(rows) == 4
    for rid, pred, meas, _ in rows:
        for phase in PHASES:
            assert abs(pred[phase] - meas[phase]) <= 0.01 * meas[phase], (rid, phase)
        assert pred["backward"] - meas["backward"] == 2 * 256 * 256 + 16_472, rid
