"""FSDP2 around eager layers with full checkpointing (``buffers.fsdp2_eager_checkpointed``, the fsdp rule's measured
buffer hook; the mechanism of ``compile.fsdp2_around_blocks``) against the eager twins of
validation/compile/blocks_fsdp_measurements.json (torchtune 0.6.1's distributed order and torchtitan's, one rank of
the fake process group, the profiler's memory timeline): every phase; hand-derived bytes; where it does not apply
(compiled, LoRA, FSDP1, DDP, no or selective checkpointing). No torch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD_END, COMMUNICATION_BUFFERS, FORWARD
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
compare = load_script("validation/compile/compare_blocks_fsdp.py")
RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_fsdp_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare.rows()}
EAGER = [r for r in ROWS if "-eager-" in r and "-lora-" not in r and "-offload-" not in r]
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
FORWARD_LABEL = "FSDP2: the top checkpointed layer's forward beside its gathered parameters (beyond the loss's moment)"
BACKWARD_LABEL = "FSDP2 around the eager layers' recompute and backward"

# the 3-layer fp32 cell (h 256, f 688, V 1,024 tied), b 2 x s 512 = T 1,024 a rank, 2 ranks
G = 790_528 * 4               # one layer's matrices gathered, fp32
ROOT_BYTES = (1024 * 256 + 256) * 4      # the root: the tied embedding and the final norm
T, H, F = 1024, 256, 688
RNG = 5056                    # the CPU generator's state, one per torchtune checkpoint


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def _solve(dp=2, ckpt="full", **kw):
    model = from_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                            "intermediate_size": 688, "num_hidden_layers": 3, "num_attention_heads": 8,
                            "num_key_value_heads": 8, "vocab_size": 1024, "tie_word_embeddings": True,
                            "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                            "hidden_act": "silu"}, name="tt-cell")
    kw.setdefault("data_parallel", "fsdp")
    return TrainingMemoryModel().solve(model, BIG, 2 * dp, 512, "fp32", "adamw", ckpt, profile="measured",
                                       regime="fp32", attention="sdpa", device="cpu", runtime_overheads=False,
                                       dp_size=dp, kv_expanded=True, **kw)


def _term(result, label):
    return next((t for t in result.terms if t.label == label), None)


def test_the_eager_twins_every_phase():
    """torchtune's order (ranks 0 of 2, 0 and 3 of 4, 3 and 5 layers, fp32 and bf16) and torchtitan's: the forward
    within 1 % (fp32 within 0.2 %: the top layer's MLP beside the gathered layer, its held all-gather output and the
    root's), the backward above by at most 2.7 % (block 1's or L - 2's moment; before: 8 to 15 % low), the rest as
    before; median / max over the eager twins within 1 % / 5 % but the backward's median (2.3 %, the eager base's,
    not FSDP2's: docs/compile.md) and torchtitan's end of forward (+11.8 %: the harness reshards the last block,
    torchtitan does not)."""
    assert len(EAGER) == 6
    for rid in EAGER:
        assert abs(err(rid, "forward")) < (0.002 if "-fp32-" in rid else 0.01), rid
        assert -0.001 < err(rid, "backward") < 0.027, rid
        for phase in ("optimizer", "end_of_backward"):
            assert abs(err(rid, phase)) < 0.01, (rid, phase)
    for phase in compare.compare_blocks.PHASES:
        errs = [abs(err(rid, phase)) for rid in EAGER]
        if phase != "end_of_forward":
            assert max(errs) < 0.05, phase
        if phase != "backward":
            assert statistics.median(errs) < 0.01, phase
    assert 0.11 < err("tt-llama3_2-3l-v1024-fp32-eager-full-in-fsdp2-w2r0-b2-s512", "end_of_forward") < 0.12


def test_the_forward_term_by_hand():
    """At the top layer's MLP (torchtune's FeedForward: silu(w1 x) * w3 x): the mid residual and the norm's output
    (T h 4 each), silu's and w3's outputs and their product (3 T f 4); FSDP2 holds the layer's gathered parameters
    and its all-gather output (kept until the next all-gather) and the root's, which the rule's forward terms leave out
    with the root resharded: beyond the loss's forward terms (the final norm 2 T h 4 + 4,096, the logits and their
    log-softmax 2 T V 4, the labels T 8)."""
    r = _solve(plugin_options={"fsdp": {"root_reshard_after_forward": True}})
    t = _term(r, FORWARD_LABEL)
    work = T * (4 * H + 4 * H + 3 * 4 * F)
    later = (2 * T * H * 4 + 4096) + 2 * T * 1024 * 4 + T * 8
    assert t.nbytes == work + 2 * G + ROOT_BYTES - later == 7_427_072
    assert t.phases == (FORWARD,) and t.component == COMMUNICATION_BUFFERS
    # torchtitan's root (no reshard_after_forward): the rule's forward terms hold the layer and the root; FSDP2 the
    # all-gather output more; the same forward peak
    plain = _solve()
    assert _term(plain, FORWARD_LABEL).nbytes == work + G - later
    assert plain.phase_totals[FORWARD] == r.phase_totals[FORWARD]


def test_the_backward_term_by_hand():
    """Block 1 of 3 at 2 ranks: its gathered parameters, the root's, block 0's prefetched all-gather and one step up
    from block 0 (its input and RNG state alive, one gradient shard not born yet); the top block (block 2) has no
    reduce-scatter input yet (- R): lower."""
    t = _term(_solve(), BACKWARD_LABEL)
    step = T * H * 4 + RNG - G / 2
    assert t.nbytes == G + ROOT_BYTES + G + step == 6_846_400
    assert t.phases == (BACKWARD_END,) and t.component == COMMUNICATION_BUFFERS
    assert G + 2 * step - G < G + step       # the top block's moment (R = G in fp32) below block 1's


def test_where_it_does_not_apply():
    """Compiled blocks price it themselves (compile.py), LoRA in lora.py; FSDP1 frees each unit after its forward
    and has no all_gather_state; DDP (zero0) shards nothing; without or with selective checkpointing not measured."""
    for kw in ({"compile": "blocks", "compile_checkpoint": "outside"},
               {"lora": LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), adapter_dtype="base")},
               {"plugin_options": {"fsdp": {"fsdp_version": 1}}}, {"data_parallel": "zero0"},
               {"ckpt": "none"}, {"ckpt": "selective"}):
        r = _solve(**kw)
        assert _term(r, FORWARD_LABEL) is None and _term(r, BACKWARD_LABEL) is None, kw
