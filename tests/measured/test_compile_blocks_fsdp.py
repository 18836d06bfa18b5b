"""Per-block compile with full checkpointing under FSDP2 in torchtune's distributed order (``compile="blocks"``,
``activation_checkpointing="full"``, ``compile_checkpoint="outside"``, ``data_parallel="fsdp"``;
``compile.fsdp2_around_blocks``) against validation/compile/blocks_fsdp_measurements.json (one rank of the fake
process group, torchtune 0.6.1's builders and recipe order, the profiler's memory timeline, every phase per rank);
FSDP2's CPU offload with compiled blocks; hand-derived bytes and what stays refused. No torch."""

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
compare = load_script("validation/compile/compare_blocks_fsdp.py")

RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_fsdp_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare.rows()}
PHASES = compare.compare_blocks.PHASES
COMPILED = [r for r in ROWS if "-blocks-" in r and "-offload-" not in r]
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def _model(layers=3, ffn=688):
    return from_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                           "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": 8,
                           "num_key_value_heads": 8, "vocab_size": 1024, "tie_word_embeddings": True,
                           "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                           "hidden_act": "silu"}, name="tt-cell")


def _solve(dp=2, layers=3, **kw):
    kw = {"compile": "blocks", "compile_checkpoint": "outside", "data_parallel": "fsdp", **kw}
    return TrainingMemoryModel().solve(_model(layers), BIG, 2 * dp, 512, "fp32", "adamw", kw.pop("ckpt", "full"),
                                       profile="measured", regime="fp32", attention="sdpa", device="cpu",
                                       runtime_overheads=False, dp_size=dp, **kw)


def test_every_run_is_measured_and_predicted():
    assert len(RUNS) == 20 and set(ROWS) == set(RUNS)
    assert all(isinstance(ROWS[r][0], dict) for r in ROWS)
    assert len(COMPILED) == 9


def test_the_fp32_compiled_runs_forward_and_backward_within_a_fifth_of_a_percent():
    """Full fine-tuning and LoRA (every linear, q and v), ranks of 2 and 4, the first and the last rank: the forward
    peak (the top block's compiled forward beside FSDP2's held all-gather output) and the backward peak (block 1's
    or the top block's recompute and MLP backward beside the gathered, prefetched and reduce-scattered buffers)
    within 0.2 %; the residual is the RoPE cache (torchtune's buffer, measured in the baseline) and the norms'
    weights in the all-gathers (2 x 1,024 B a layer) that the rule's matrix parameters leave out."""
    for rid in COMPILED:
        if "-fp32-" in rid and "-full-in-" not in rid:
            for phase in ("forward", "backward"):
                assert 0 < err(rid, phase) < 0.002, (rid, phase)


def test_torchtitans_order_under_fsdp2():
    """torchtitan's order (apply_ac, apply_compile, apply_fsdp: the checkpoint inside each compiled block, no RNG
    state kept): block 1's backward graph, its recompute inside, beside FSDP2's buffers (fsdp2_around_blocks, no RNG
    step): the backward peak -1.8 %, the single-device order's own gap (layer 0's moment one T x h x 4 short,
    docs/compile.md: -983,040 B on one device, -994 KB here); the forward's peak is the loss's, after the blocks,
    where the rule's terms price FSDP2: +2.0 %. The end of the forward +11.7 % is the rule's (one gathered layer
    alive at the forward's end, torchtitan's last block; the harness reshards every block), its eager twin's too."""
    rid, twin = (f"tt-llama3_2-3l-v1024-fp32-{k}-full-in-fsdp2-w2r0-b2-s512" for k in ("blocks", "eager"))
    assert -0.02 < err(rid, "backward") < -0.015
    assert 0.015 < err(rid, "forward") < 0.025
    assert abs(err(rid, "end_of_forward") - err(twin, "end_of_forward")) < 0.001


def test_every_compiled_phase_within_the_issue_targets():
    """Every phase of the compiled runs in torchtune's order within 2.7 % (the optimizer step and the end of the backward are the
    eager rule's: the LoRA runs' -1 to -2 % is the sharded adapters' step, as their eager twins); the bf16 cell's
    forward -1.7 % and backward -2.6 %."""
    for rid in COMPILED:
        for phase in PHASES:
            if "-full-in-" not in rid:      # (torchtitan's order: test_torchtitans_order_under_fsdp2)
                assert abs(err(rid, phase)) < 0.027, (rid, phase)
    bf16 = "tt-llama3_2-3l-v1024-bf16-blocks-full-fsdp2tt-w2r0-b1-s256"
    assert -0.02 < err(bf16, "forward") < -0.015 and -0.03 < err(bf16, "backward") < -0.02


def test_block_l_minus_2_sets_the_backward_where_an_input_outweighs_a_shard():
    """5 layers at 4 ranks: a block's input and RNG state (1,053,632 B) outweigh its gradient shard (790,528 B), so
    each block up holds 263,104 B more and block 3 (L - 2: the top block holds no reduce-scatter input yet) is the
    highest, G + 3 x 263,104 = 3,951,424 B above block 0's; measured within 0.12 %."""
    rid = "tt-llama3_2-5l-v1024-fp32-blocks-full-fsdp2tt-w4r0-b2-s512"
    assert 0 < err(rid, "backward") < 0.0015
    term = next(t for t in compare._solve(RUNS[rid]).terms if t.label.startswith("FSDP2 around"))
    assert term.nbytes == 3_162_112 + 1_049_600 + 3_162_112 + 3 * (1_048_576 + 5_056 - 790_528)
    assert "at block 3" in term.formula


def test_the_last_rank_is_the_first_rank():
    """Rank 3 of 4 measures what rank 0 does (every shard the same size here), and the profile's heaviest rank is
    both."""
    for kind in ("eager", "blocks"):
        a, b = (RUNS[f"tt-llama3_2-3l-v1024-fp32-{kind}-full-fsdp2tt-w4r{r}-b2-s512"]["measured"] for r in (0, 3))
        assert a["peak_by_phase"] == b["peak_by_phase"] and a["alive"] == b["alive"]


def test_the_fsdp2_moment_by_hand():
    """The w2 cell: G = 790,528 matrix parameters x 4 B = 3,162,112 B a gathered layer, the root's embedding and
    final norm 1,049,600 B, T h x 4 = 1,048,576 B a block input, the CPU RNG state 5,056 B, R / W = 1,581,056 B a
    block's gradient shard: block 1's moment is block 0's + G (block 0's all-gather prefetched) + one input and RNG
    state - one shard = +2,634,688 B (measured +2,635,712 between the two moments of the timeline: the norms'
    weights, 2,048 B, in the prefetched all-gather and the shard); the top block's, block 0's + G + 2 x (input + RNG
    state - shard) - R (no reduce-scatter input held yet) = -1,054,848 B (measured -1,056,896: the norms again). The term: G + root + block 1's = 6,846,400 B."""
    r = _solve()
    term = next(t for t in r.terms if t.label == "FSDP2 around the compiled blocks' recompute and backward")
    G, root, step, R = 3_162_112, 1_049_600, 1_048_576 + 5_056 - 1_581_056, 3_162_112
    assert G + step == 2_634_688 and G + 2 * step - R == -1_054_848
    assert term.nbytes == G + root + G + step == 6_846_400
    forward = next(t for t in r.terms if t.label.startswith("the top compiled block's forward"))
    assert forward.nbytes == _solve(dp=1).terms[[t.label for t in _solve(dp=1).terms].index(forward.label)].nbytes + G


def test_the_forward_holds_the_gathered_layer_and_root_whatever_the_rules_forward_phase():
    """torchtune's shard_model reshards the root after the model's forward too (the fsdp rule's
    root_reshard_after_forward, which the torchtune reader sets): the rule's gather terms leave the forward phase
    (none is alive at the forward's end), but the top block's compiled forward runs inside the model's, with its
    gathered parameters and the root's: the forward peak is the same either way, every other phase too."""
    plain = _solve().phase_totals
    resharded = _solve(plugin_options={"fsdp": {"root_reshard_after_forward": True}}).phase_totals
    assert resharded == plain


def test_one_device_and_ddp_unchanged_by_the_fsdp2_terms():
    """Without weight sharding nothing of FSDP2 is added (the single-device terms, byte for byte)."""
    one = _solve(dp=1, data_parallel=None)
    assert not any(t.label.startswith("FSDP2") for t in one.terms)


def test_the_offload_runs_equal_their_twins():
    """fsdp_cpu_offload on the CPU moves nothing (the host is the device): the -offload- runs measure their twins to
    the byte, compiled and eager, so compile's difference from eager is the same with the policy, every phase; the
    profile's compiled-minus-eager difference is the same with and without it too (the offload's terms are the
    rule's, the compiled blocks' untouched)."""
    for kind in ("eager", "blocks"):
        a = RUNS[f"tt-llama3_2-3l-v1024-fp32-{kind}-full-fsdp2tt-offload-w2r0-b2-s512"]["measured"]
        b = RUNS[f"tt-llama3_2-3l-v1024-fp32-{kind}-full-fsdp2tt-w2r0-b2-s512"]["measured"]
        assert a["peak_by_phase"] == b["peak_by_phase"] and a["alive"] == b["alive"]
    cells = {k: ROWS[f"tt-llama3_2-3l-v1024-fp32-{k}-w2r0-b2-s512"][0] for k in (
        "blocks-full-fsdp2tt-offload", "eager-full-fsdp2tt-offload", "blocks-full-fsdp2tt", "eager-full-fsdp2tt")}
    for phase in PHASES:
        with_ = cells["blocks-full-fsdp2tt-offload"][phase] - cells["eager-full-fsdp2tt-offload"][phase]
        assert with_ == cells["blocks-full-fsdp2tt"][phase] - cells["eager-full-fsdp2tt"][phase], phase


def test_the_torchtune_configs_that_were_refused_answer():
    from mlsysim_core.cli import main
    for args in (["tests/data/launch/torchtune/llama3_1/8B_full.yaml", "--gpus", "8", "-g", "a100", "--override",
                  "compile=True"],
                 ["tests/data/launch/torchtune/llama3_3/70B_full_multinode.yaml", "--gpus", "16", "-g", "h100"],
                 ["tests/data/launch/torchtune/llama3_1/70B_full.yaml", "--gpus", "8", "-g", "a100", "--override",
                  "compile=True"]):
        assert main(["estimate", "--from", args[0], *args[1:], "--seq-len", "2048", "--json"]) == 0, args


@pytest.mark.parametrize("kw, name, says", [
    (dict(ckpt="selective"), "activation_checkpointing", "none, op-sac or full"),
    (dict(offload="optimizer"), "offload", "'optimizer\\+gradients\\+parameters'"),
    (dict(offload="optimizer+gradients+parameters", lora=LoRAConfig(rank=8, adapter_dtype="base")), "offload",
     "no LoRA"),
    (dict(optimizer_in_backward=True), "optimizer_in_backward", "one device"),
    (dict(activation_offload="torchtune"), "activation_offload", "under a parallel layout"),
    (dict(plugin_options={"fsdp": {"fsdp_version": 1}}), "activation_checkpointing", "FSDP2"),
    (dict(plugin_options={"fsdp": {"prefetch_layers": 2}}), "activation_checkpointing", "FSDP2"),
])
def test_refused_by_name(kw, name, says):
    with pytest.raises(NotModelledError, match=says) as e:
        _solve(**kw)
    assert e.value.parameter == name


def test_tensor_parallel_full_checkpointing_stays_refused():
    with pytest.raises(NotModelledError) as e:
        _solve(dp=1, data_parallel=None, tp_size=2, sequence_parallel=False)
    assert e.value.parameter == "activation_checkpointing"


def test_torchtitans_compiled_loss_under_tensor_parallelism_says_why():
    """torchtitan's 405B config (tp 8, compile.components model and loss): refused naming loss_parallel's DTensor
    logits and the sequence parallelism of torchtitan's TP plan."""
    with pytest.raises(NotModelledError, match="loss_parallel\\(\\) on the LM head's vocabulary-split DTensor logits"
                                               ".*sequence_parallel") as e:
        TrainingMemoryModel().solve(_model(), BIG, 2, 512, "fp32", "adamw", "none", profile="measured",
                                    regime="fp32", attention="sdpa", device="cpu", tp_size=2, compile="blocks+loss")
    assert e.value.parameter == "tp_size"
    with pytest.raises(NotModelledError, match="the schedule, which calls it per micro-batch") as e:
        TrainingMemoryModel().solve(_model(4), BIG, 2, 512, "fp32", "adamw", "none", profile="measured",
                                    regime="fp32", attention="sdpa", device="cpu", pp_size=2, compile="blocks+loss")
    assert e.value.parameter == "pp_size"


qlora = load_script("validation/compile/compare_blocks_qlora_fsdp.py")
QROWS = {rid: (pred, meas) for rid, pred, meas in qlora.rows()}


def test_qlora_under_fsdp2_with_compiled_blocks():
    """torchtune's distributed QLoRA with compile (lora_finetune_distributed: set_trainable_params, compile_model,
    set_activation_checkpointing, shard_model; torchao's NF4 under FSDP2), ranks of 2 and 4 and the one-device twin
    (validation/compile/measure_blocks_qlora_fsdp.py): the backward peak (the step's peak), the ends of the forward
    and backward, the setup and the step within 0.02 %; the forward peak is short by the same bytes at every world
    size (-5.5 % on one device, -5.2 and -5.4 % under FSDP2: the compiled block's CPU 16-bit matmuls over the
    dequantized weights, not replayed with the MLP adapted), never the step's peak here."""
    compiled = [r for r in QROWS if "-blocks-" in r]
    one = next(r for r in compiled if "-1dev-" in r)
    short = QROWS[one][1]["forward"] - QROWS[one][0]["forward"]
    for rid in compiled:       # FSDP2's part of the forward exact: short by the one-device bytes (but the norms'
        assert abs(QROWS[rid][1]["forward"] - QROWS[rid][0]["forward"] - short) < 4_096, rid     # weights, gathered)
    assert len(compiled) == 3 and all(isinstance(QROWS[r][0], dict) for r in QROWS)
    for rid in compiled:
        pred, meas = QROWS[rid]
        for phase in qlora.PHASES:
            e = (pred[phase] - meas[phase]) / meas[phase]
            if phase == "forward":
                assert -0.056 < e < -0.05 and meas["forward"] < meas["backward"], rid
            else:
                assert abs(e) < 0.0002, (rid, phase)


def test_qlora_under_fsdp2_without_checkpointing_stays_refused():
    with pytest.raises(NotModelledError, match="a nf4 base inside the compiled block is not measured") as e:
        TrainingMemoryModel().solve(_model(ffn=512), BIG, 4, 512, "bf16", "adamw", "none", profile="measured",
                                    regime="bf16", attention="sdpa", device="cpu", dp_size=2, data_parallel="fsdp",
                                    compile="blocks", lora=LoRAConfig(rank=8, adapter_dtype="base",
                                                                      quantization="nf4",
                                                                      quant_implementation="torchao"))
    assert e.value.parameter == "lora.quant_implementation"
