"""Per-block compile beyond blocks_measurements.json, against validation/compile/blocks_extra_measurements.json
(torchtune 0.6.1's own builders, the profiler's memory timeline, every phase): torchtitan's compiled loss
(``compile="blocks+loss"``: build_cross_entropy_loss's ``torch.compile(loss_fn)``) and torchtune's LoRA recipes
with full checkpointing and compiled blocks (torchtune's order: ``compile.lora_full_terms``); hand-derived bytes
and what is refused. No torch."""

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
compare = load_script("validation/compile/compare_blocks_extra.py")

RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_extra_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas) for rid, pred, meas, _ in compare.rows()}
PHASES = compare.compare_blocks.PHASES
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
LOSS = [r for r in RUNS if r.endswith(("-titan-compiled-b1-s512", "-titan-compiled-b2-s512", "-titan-compiled-b1-s256"))]
LORA_FULL = [r for r in RUNS if "-blocks-full-lora-" in r]
LORA_CHUNKED = [r for r in RUNS if "-blocks-" in r and "-chunked-lora-" in r]     # torchtune's LoRA recipes' loss
T3 = 2 * 512      # the 3-layer cells' tokens


def err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def test_every_run_is_measured_and_the_compiled_ones_predicted():
    assert len(RUNS) == 24 and len(LOSS) == 7 and len(LORA_FULL) == 5 and len(LORA_CHUNKED) == 4
    assert all(isinstance(ROWS[r][0], dict) for r in RUNS)


def test_the_compiled_runs_every_phase_within_the_issue_targets():
    """Issue 25's targets on every phase of the sixteen compiled runs: median <= 1 %, max <= 5 %. Each is within
    0.6 % but four moments the eager profile prices outside the compiled parts: the bf16 LoRA run's forward
    (+2.1 %: torchtune's .float() LM head, the eager loss moment, as without checkpointing) and the 16-bit
    composite final norm's transients on the bf16 compiled-loss cells (-0.2 % forward, -1.0 % backward) and on
    the bf16 LoRA cell with the compiled chunked loss (-0.4 % forward)."""
    compiled = LOSS + LORA_FULL + LORA_CHUNKED
    for phase in PHASES:
        errors = [abs(err(r, phase)) for r in compiled]
        assert statistics.median(errors) <= 0.01 and max(errors) <= 0.05, phase
        allowed = {("tt-llama3_2-3l-v1024-bf16-blocks-full-lora-all-b1-s256", "forward"): 0.021,
                   ("tt-llama3_2-2l-v32000-bf16-blocks-full-chunked-lora-qv-b1-s512", "forward"): 0.0045,
                   ("tt-llama3_2-3l-v1024-bf16-blocks-titan-compiled-b1-s256", "backward"): 0.0102}
        for r in compiled:
            assert abs(err(r, phase)) <= allowed.get((r, phase), 0.006), (r, phase, err(r, phase))


def test_the_compiled_loss_delta_is_the_mechanism():
    """Compiled loss minus the eager twin (the same step, the loss not compiled), predicted against measured: the
    end of the forward keeps the logits (c T V, the compiled graph's input) and 2 x 4 T (max, log-sum-exp) where
    the eager loss keeps the fp32 log-softmax (4 T V): exact but 4 B (the fp32 loss sum, a scalar); the
    backward's top is the fused kernel's gradient (c T V) and a per-token buffer beside the saved logits, where
    the eager one has the two fp32 temporaries: within 8,196 B (the eager twin's scalars)."""
    for e in ("tt-llama3_2-2l-v32000-fp32-blocks-titan-b1-s512", "tt-llama3_2-2l-v32000-bf16-blocks-titan-b1-s512",
              "tt-llama3_2-3l-v1024-fp32-blocks-titan-b2-s512"):
        c = e.replace("-titan-", "-titan-compiled-")
        for phase in ("end_of_forward", "backward", "end_of_backward"):
            pred = ROWS[c][0][phase] - ROWS[e][0][phase]
            meas = ROWS[c][1][phase] - ROWS[e][1][phase]
            assert abs(pred - meas) <= (4 if phase != "backward" else 8196), (c, phase, pred - meas)
    # fp32, T = 512, V = 32,000: the backward's top above the end of the forward is c T V + 4 T, to the byte
    m = RUNS["tt-llama3_2-2l-v32000-fp32-blocks-titan-compiled-b1-s512"]["measured"]
    assert m["peak_by_phase"]["backward"] - m["alive"]["end_of_forward"] == 4 * 512 * 32000 + 4 * 512


def test_the_lora_recipes_compiled_chunked_loss():
    """torchtune's LoRA recipes compile CEWithChunkedOutputLoss's compute_cross_entropy (compile_loss, in place):
    each chunk's logits saved (c T V) and a per-token max and log-sum-exp, no fp32 log-softmax (4 T V); the
    frozen LM head keeps no input, so the forward's top is the final norm's output (c T h) alive while the chunks'
    logits are written, before the labels and per-token tensors (2 x 8 T): measured (fp32, T 512, h 256) to 12 B."""
    m = RUNS["tt-llama3_2-2l-v32000-fp32-blocks-chunked-lora-qv-b1-s512"]["measured"]
    T = 512
    assert m["peak_by_phase"]["forward"] - m["alive"]["end_of_forward"] == 4 * T * 256 - 16 * T - 12
    for rid in LORA_CHUNKED:     # every phase but the bf16 forward: the profile's RoPE tables' 65,536 B (fp32) apart
        for phase in PHASES:
            if "-fp32-" in rid and phase not in ("optimizer", "end_of_backward"):
                assert 0 <= ROWS[rid][0][phase] - ROWS[rid][1][phase] - 65_536 <= 64, (rid, phase)
    for rid in LORA_CHUNKED:
        assert any(t.label == "every chunk's logits, saved by the compiled cross-entropy"
                   for t in compare.compare_blocks.solve(RUNS[rid]).terms), rid


def test_the_compiled_loss_under_checkpointing_and_gqa():
    """The compiled loss is the loss's part only: with op-SAC, full checkpointing (torchtitan's order) and
    grouped-query attention the blocks' parts are those of compile='blocks' (op-SAC's +0.4 %: that policy's)."""
    for rid in ("tt-llama3_2-2l-v32000-fp32-blocks-op-sac-titan-compiled-b1-s512",
                "tt-llama3_2-2l-v32000-fp32-blocks-full-in-titan-compiled-b1-s512",
                "tt-llama3_2-2l-v32000-kv2-fp32-blocks-titan-compiled-b1-s512"):
        for phase in PHASES:
            assert abs(err(rid, phase)) < 0.006, (rid, phase)


def model(layers=3, vocab=1024, kv=8):
    return from_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                           "intermediate_size": 688, "num_hidden_layers": layers, "num_attention_heads": 8,
                           "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": True,
                           "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                           "hidden_act": "silu"}, name="tiny")


def solve(targets=("q_proj", "v_proj"), checkpointing="full", compile="blocks", regime="fp32", batch=2, **kw):
    lora = LoRAConfig(rank=8, target_modules=targets, adapter_dtype="base") if targets else None
    return TrainingMemoryModel().solve(model(), BIG, batch, 512, regime, "adamw", checkpointing, profile="measured",
                                       regime=regime, attention="sdpa", device="cpu", runtime_overheads=False,
                                       compile=compile, lora=lora, **kw)


def test_lora_full_forward_top_hand_derived():
    """torchtune's order: the top block's compiled forward makes its whole saved set before the checkpoint drops
    it. fp32, h 256, FFN 688, r 8, T = 1,024, three layers: the layers' inputs and RNG states 3 x (1,048,576 +
    5,056); q and v adapted (a frozen MLP): the block's set S = 11,752 B per token (its output apart), the
    product (2,752, not saved) and the down projection's output (1,024): 15,528; every linear adapted: S =
    15,688 less down's lora_a output (32, not yet) plus gate's and up's lora_b outputs (2 x 2,752) when the
    product is written: 21,160. Measured, from the timeline's zero, to the byte."""
    inputs = 3 * (T3 * 256 * 4 + 5056)
    qv = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-lora-qv-b2-s512"]["measured"]
    every = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-lora-all-b2-s512"]["measured"]
    assert qv["peak_by_phase"]["forward"] == inputs + T3 * (11_752 + 2752 + 1024)
    assert every["peak_by_phase"]["forward"] == inputs + T3 * (15_688 - 32 + 2 * 2752)
    top = next(t for t in solve().terms if t.label.startswith("the top compiled block's forward"))
    assert "T x 15,528 B" in top.formula


def test_lora_full_backward_top_hand_derived():
    """The top block's recompute and MLP backward: the layers' inputs (the top one's RNG state freed), the block
    output's gradient (1,048,576) and T x the recomputed set S with the MLP backward's product-sized buffers:
    two with a frozen MLP; five with the MLP adapted, the product and down's lora_a output freed and down's
    adapters' gradients (8 x (688 + 256) x 4 = 30,208) born. Measured to the byte but 8 B (two scalars)."""
    base = 3 * T3 * 256 * 4 + 2 * 5056 + T3 * 256 * 4
    qv = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-lora-qv-b2-s512"]["measured"]
    every = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-lora-all-b2-s512"]["measured"]
    assert qv["peak_by_phase"]["backward"] == base + T3 * (11_752 + 2 * 2752) + 8
    assert every["peak_by_phase"]["backward"] == base + T3 * (15_688 - 2752 - 32 + 5 * 2752) + 30_208 + 8
    for rid in ("tt-llama3_2-3l-v1024-fp32-blocks-full-lora-qv-b2-s512",
                "tt-llama3_2-3l-v1024-fp32-blocks-full-lora-all-b2-s512"):
        pred, meas = ROWS[rid]     # the profile's RoPE tables (Hugging Face's, 65,536 B over torchtune's buffer)
        assert 0 <= pred["backward"] - meas["backward"] - 65_536 <= 64, rid


def test_lora_full_is_torchtunes_order_said():
    r = solve()
    assert any(n.startswith("compile='blocks' with LoRA and full checkpointing: torchtune's order") for n in r.notes)
    assert not any("torchtitan's order" in n for n in r.notes)


def test_accumulation_keeps_every_adapter_gradient_in_the_backward_top():
    """With gradient accumulation every adapter's gradient is alive (the gradient terms, throughout): the top
    block's moment subtracts none as unborn."""
    one = next(t for t in solve().terms if t.label == "the top block's compiled recompute and MLP backward")
    acc = next(t for t in solve(batch=4, gradient_accumulation_steps=2).terms
               if t.label == "the top block's compiled recompute and MLP backward")
    adapters = 3 * 2 * 8 * (256 + 256) * 4
    assert acc.nbytes - one.nbytes == adapters


@pytest.mark.parametrize("kw, name", [
    (dict(targets=("q_proj", "gate_proj")), "lora.target_modules"),       # the MLP partly adapted
    (dict(checkpointing="selective"), "activation_checkpointing"),
    (dict(compile="blocks+loss"), "lora"),                                 # the compiled loss with LoRA
    (dict(targets=None, compile="blocks+loss", loss="chunked"), "loss"),
    (dict(targets=None, compile="blocks+loss", checkpointing="none", tp_size=2, sequence_parallel=False), "tp_size"),
    (dict(targets=None, compile="loss"), "compile"),
])
def test_refused_by_name(kw, name):
    with pytest.raises(NotModelledError) as e:
        solve(**kw)
    assert e.value.parameter == name


def test_blocks_and_loss_off_is_unchanged():
    """compile='blocks+loss' changes only the loss's terms: the blocks' are compile='blocks''s."""
    a, b = solve(targets=None, checkpointing="none"), solve(targets=None, checkpointing="none", compile="blocks+loss")
    layers = [t for t in a.terms if t.label.startswith("decoder layers")]
    assert layers and layers == [t for t in b.terms if t.label.startswith("decoder layers")]
    assert b.total_memory < a.total_memory
