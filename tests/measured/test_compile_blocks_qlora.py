"""QLoRA with ``compile="blocks"`` (torchtune's QLoRA recipes with ``compile: True``: torchao's NF4 base, each block
compiled apart) against validation/compile/blocks_qlora_measurements.json (torchtune 0.6.1's
``lora_llama3_2(quantize_base=True)``, the profiler's memory timeline, every phase), the hand-derived dequantized
weights the partitioner saves, and what stays refused. No torch."""

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
compare = load_script("validation/compile/compare_blocks_qlora.py")

RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_qlora_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare.rows()}
PHASES = compare.compare_blocks.PHASES
COMPILED = [r for r in RUNS if "-blocks-" in r]
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
ALL = "tt-llama3_2-3l-v1024-f704-bf16-blocks-qlora-all-b1-s256"


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def test_every_run_is_measured_and_predicted():
    assert len(RUNS) == 20 and len(COMPILED) == 10
    assert all(isinstance(ROWS[r][0], dict) for r in RUNS)


def test_the_compiled_runs_every_phase():
    """Every compiled run, every phase, within 0.9 % but the moments named: the bf16 runs' forward without
    checkpointing (+3.5 %, +4.0 %: the eager loss's forward moment, torchtune's .float() LM head, which plain LoRA's
    bf16 run shares, +3.7 % in blocks_measurements.json), the 128-token frozen-MLP forward (65,600 B short, -1.3 %;
    43 KB of it was hidden by bitsandbytes' constants before the base was read as torchao's), and the optimizer peak
    and end of the backward (exact, but the step's scalars: test_the_weights_are_torchaos_nf4_exactly)."""
    allowed = {(ALL, "forward"): 0.036,
               ("tt-llama3_2-3l-v1024-f704-bf16-blocks-qlora-qv-b1-s256", "forward"): 0.041,
               ("tt-llama3_2-3l-v1024-f704-bf16-blocks-full-qlora-qv-b1-s128", "forward"): 0.014}
    for phase in PHASES:
        if phase in ("optimizer", "end_of_backward"):
            continue
        for r in COMPILED:
            assert abs(err(r, phase)) <= allowed.get((r, phase), 0.009), (r, phase, err(r, phase))
        assert statistics.median(abs(err(r, phase)) for r in COMPILED) <= 0.01, phase


def test_the_weights_are_torchaos_nf4_exactly():
    """Read as torchao's NF4Tensor (quant_implementation='torchao', quantizations.py) and with torchtune's RoPE cache
    (rope_cache=max_seq_len: rope.py), the end of the backward (weights, the cache, adapters, their gradients and
    state) is exact in every run, eager and compiled. Before the cache was selected each was short by it less 64 B:
    the fp32 cache, 4 x max_seq_len x head_dim B (16,384 / 32,768 / 65,536 B at 128 / 256 / 512 positions, head_dim
    32), and torchtune's one fp32 theta (head_dim/2 x 4 = 64 B) where Hugging Face's inv_freq and original_inv_freq
    are 128 B: -16,320 / -32,704 / -65,472 B."""
    for rid, run in RUNS.items():
        pred, meas = ROWS[rid]
        assert pred["end_of_backward"] == meas["end_of_backward"], rid
        # the optimizer peak: the step's few bytes of scalars short (10 B in bf16, 12 in fp32)
        assert -12 <= pred["optimizer"] - meas["optimizer"] <= -10, rid
        # Hugging Face's tables (the default) give the gap back, exactly
        hf = compare.compare_blocks.solve(run)
        cfg = run["hf_config"]
        cache = 4 * cfg["max_position_embeddings"] * cfg["head_dim"]
        assert sum(t.nbytes for t in hf.terms if t.key == "rope_buffers") == 2 * 4 * cfg["head_dim"] // 2
        tt = compare.compare_blocks.solve(run, torchtune_rope=True)
        assert sum(t.nbytes for t in tt.terms if t.key == "rope_cache") == cache + 4 * cfg["head_dim"] // 2
        assert not any(t.key == "rope_tables" for t in tt.terms), rid


def test_compile_saves_more_than_eager_here_and_the_model_says_so():
    """Measured: compiled QLoRA keeps more at the end of the forward than eager (12.1 MB against 9.4 MB above the
    baseline, every linear adapted): the dequantized weights it saves outweigh the activations it drops."""
    eager = RUNS[ALL.replace("-blocks-", "-eager-")]["measured"]["alive"]["end_of_forward"]
    compiled = RUNS[ALL]["measured"]["alive"]["end_of_forward"]
    assert compiled > eager * 1.25
    assert ROWS[ALL][0]["end_of_forward"] > ROWS[ALL.replace("-blocks-", "-eager-")][0]["end_of_forward"]


def _solve(run_id, **kw):
    return compare.compare_blocks.solve({**RUNS[run_id], **kw})


def test_hand_derived_dequantized_weights():
    """h 256, FFN 704, MHA, bf16, every linear adapted: q, k, v, o 256 x 256 = 65,536 each; gate and up 704 x 256,
    down 256 x 704 = 180,224 each. The first block's input needs no gradient: o (its input, SDPA's output, does:
    q, k, v adapted) and the MLP save theirs, 2 x (65,536 + 3 x 180,224) = 1,212,416 B; the two others every
    linear, 2 x (4 x 65,536 + 3 x 180,224) = 1,605,632 B each: 4,423,680 B."""
    term = next(t for t in _solve(ALL).terms if "dequantized NF4" in t.label)
    assert term.nbytes == 1_212_416 + 2 * 1_605_632


def test_the_dequantized_weights_are_what_compiled_qlora_adds_to_compiled_lora():
    """Without quantization the same run's saved set is the same but the weights (the partitioner's graphs differ
    only there): the end of the forward differs by the dequantized weights and the weights' own bytes."""
    run = RUNS[ALL]
    plain = _solve(ALL, lora={k: v for k, v in run["lora"].items() if k != "quantize_base"})
    q = _solve(ALL)

    def activations(r):
        return sum(t.nbytes for t in r.terms if t.component == "activations" and "forward" in t.phases
                   and "backward" in t.phases)
    assert activations(q) - activations(plain) == 4_423_680


def test_qlora_notes_say_what_is_modelled():
    assert any("dequantized weight" in n for n in _solve(ALL).notes)


def _model():
    return from_hf_config(RUNS[ALL]["hf_config"], name="qlora-tiny")


@pytest.mark.parametrize("kw, name, says", [
    # the field that takes it out, with its value (was parameter 'lora' and the whole LoRAConfig's repr)
    (dict(quantization="fp4"), "lora.quant_implementation", "fp4 base inside the compiled block is not measured"),
    (dict(quantization="int8"), "lora.quant_implementation", "int8 base inside the compiled block is not measured"),
    # bitsandbytes' nf4 (Linear4bit's dequantization is no traced torch op): only torchao's declares its compiled form
    (dict(quantization="nf4"), "lora.quant_implementation",
     r"^lora.quant_implementation='bitsandbytes' is not allowed: .*nf4 base inside the compiled block is not "
     r"measured \(bitsandbytes's"),
    (dict(quantization="nf4", quant_implementation="torchao", dropout=0.1), "lora.dropout",
     r"^lora.dropout=0.1 is not allowed: .*adapters' dropout"),
    (dict(quantization="nf4", quant_implementation="torchao", use_dora=True), "lora.use_dora",
     r"^lora.use_dora=True is not allowed: .*DoRA's magnitude"),
    (dict(modules_to_save=("lm_head",)), "lora.modules_to_save", "trainable copies of the embedding or LM head"),
])
def test_refused_by_name(kw, name, says):
    with pytest.raises(NotModelledError, match=says) as e:
        TrainingMemoryModel().solve(_model(), BIG, 1, 256, "bf16", "adamw", "none", profile="measured",
                                    regime="bf16", attention="sdpa", device="cpu", compile="blocks",
                                    lora=LoRAConfig(rank=8, adapter_dtype="base", **kw))
    assert e.value.parameter == name


def test_data_parallel_qlora_with_compiled_blocks_is_refused():
    # torchao's NF4 split or gathered over ranks under compiled blocks is not measured (lora.py's implementation
    # check, or, where the implementation declares its split under FSDP2 eagerly, compile's own LoRA check)
    with pytest.raises(NotModelledError, match="split or gathered over ranks is not measured|a nf4 base inside the "
                                               "compiled block is not measured") as e:
        TrainingMemoryModel().solve(_model(), BIG, 2, 256, "bf16", "adamw", "none", profile="measured",
                                    regime="bf16", attention="sdpa", device="cpu", compile="blocks", dp_size=2,
                                    data_parallel="fsdp", lora=LoRAConfig(rank=8, adapter_dtype="base",
                                                                          quantization="nf4",
                                                                          quant_implementation="torchao"))
    assert e.value.parameter == "lora.quant_implementation"


def test_offloading_compiled_qlora_blocks_is_refused():
    with pytest.raises(NotModelledError, match="not measured") as e:
        TrainingMemoryModel().solve(_model(), BIG, 1, 256, "bf16", "adamw", "full", profile="measured",
                                    regime="bf16", attention="sdpa", device="cpu", compile="blocks",
                                    activation_offload="torchtune",
                                    lora=LoRAConfig(rank=8, adapter_dtype="base", quantization="nf4",
                                                    quant_implementation="torchao",
                                                    target_modules=("q_proj", "v_proj")))
    assert e.value.parameter == "activation_offload"


def test_the_frozen_mlp_moments_follow_the_cpu_16_bit_matmul():
    """bf16, the MLP frozen, full checkpointing, 128 tokens (T != h: every buffer's size tells what it is): the
    forward's peak is at up's matmul, whose fp32 output (4 x 128 x 704 = 360,448 B, + 128) the timeline shows
    beside every weight dequantized at the block's start; the backward's at the down projection's input gradient
    (the product's gradient 180,224 B and its fp32 copy). Both within 0.9 %; the same cell priced as the MLP
    backward's moment alone would be 7.5 % high at the backward and 3.2 % low at the forward. The forward is 65,600 B
    short (-1.3 %; 43 KB of it hidden by bitsandbytes' constants before the base was read as torchao's NF4)."""
    rid = "tt-llama3_2-3l-v1024-f704-bf16-blocks-full-qlora-qv-b1-s128"
    assert abs(err(rid, "forward")) <= 0.014 and abs(err(rid, "backward")) <= 0.005
    r = _solve(rid)
    assert any("fp32 copy, the CPU's 16-bit matmul" in t.formula for t in r.terms)
    run = RUNS[rid]      # the same cell on a GPU: no fp32 copy priced (the CPU's lowering)
    gpu = TrainingMemoryModel().solve(_model(), BIG, 1, 128, "bf16", "adamw", "full", profile="measured",
                                      regime="bf16", attention="sdpa", device="cuda", runtime_overheads=False,
                                      compile="blocks", lora=LoRAConfig(rank=8, adapter_dtype="base",
                                                                        quantization="nf4", quant_implementation="torchao",
                                                                        target_modules=tuple(run["lora"]["targets"])))
    assert not any("the CPU's 16-bit matmul" in t.formula for t in gpu.terms)
