"""Per-block compile with full checkpointing in torchtune's order for full fine-tuning (``compile="blocks"``,
``compile_checkpoint="outside"``: compile_model, then set_activation_checkpointing wraps each compiled layer;
``compile.blocks_outside_full_terms``) against validation/compile/blocks_order_measurements.json and the two such
runs of blocks_measurements.json (torchtune 0.6.1's own builders, the profiler's memory timeline, every phase);
hand-derived bytes and what is refused. No torch."""

from __future__ import annotations

import statistics

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from scripttools import load_script

compare = load_script("validation/compile/compare_blocks_order.py")

ROWS = {rid: (pred, meas, base) for rid, pred, meas, base in compare.rows()}
COMPILED = [r for r in ROWS if "-blocks-full" in r]
PHASES = compare.compare_blocks.PHASES
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
CELL = "tt-llama3_2-3l-v1024-fp32-blocks-full-b2-s512"


def err(rid, phase):
    pred, meas, _ = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def _model(layers=3, kv=8, vocab=1024, tied=True):
    return from_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
                           "intermediate_size": 688, "num_hidden_layers": layers, "num_attention_heads": 8,
                           "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": tied,
                           "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
                           "hidden_act": "silu"}, name="tt-cell")


def _solve(where="outside", regime="fp32", b=2, seq=512, **kw):
    return TrainingMemoryModel().solve(_model(**kw), BIG, b, seq, regime, "adamw", "full", profile="measured",
                                       regime=regime, attention="sdpa", device="cpu", runtime_overheads=False,
                                       compile="blocks", compile_checkpoint=where)


OIB = [r for r in COMPILED if "-oib-" in r]


def test_every_run_is_measured_and_predicted():
    assert len(COMPILED) == 12 and len(OIB) == 4 and len(ROWS) == 20
    assert all(isinstance(ROWS[r][0], dict) for r in ROWS)


def test_the_compiled_runs_every_phase_within_the_issue_targets():
    """Issue 25's targets on every phase of the twelve compiled runs: median <= 1 %, max <= 5 %, but the forward
    of the bf16 4-layer cell with the whole-logit loss (+6.7 %): its forward peak is the eager loss's moment,
    where the profile prices Hugging Face's head (the bf16 logits kept beside their fp32 copy) and torchtune's
    ``self.output(h).float()`` frees them (2 T V B: the eager loss's gap, not compile's; with torchtune's chunked
    loss the same cell is within 0.2 %). The bf16 3-layer cell's backward (-1.4 %) peaks in layer 0's attention
    backward, after its MLP's weight gradients are born, above the MLP moment modelled."""
    eager_loss = ("tt-llama3_2-4l-v1024-kv2-bf16-blocks-full-b2-s512", "forward")
    for phase in PHASES:
        errors = [abs(err(r, phase)) for r in COMPILED if (r, phase) != eager_loss]
        assert statistics.median(errors) <= 0.01 and max(errors) <= 0.03, phase
    assert 0.06 < err(*eager_loss) < 0.07
    assert abs(err("tt-llama3_2-3l-v1024-bf16-blocks-full-b1-s256", "backward")) < 0.015


def test_the_fp32_cells_to_a_tenth_of_a_percent():
    """Where the top block's forward and layer 0's recompute and MLP backward set the peaks (the 1,024-token fp32
    cells, MHA and GQA, whole-logit and chunked loss, with and without the step in the backward): every phase within
    0.25 %. The residual is the RoPE cache (torchtune's buffer, measured in the baseline; Hugging Face's cos/sin
    tables priced: 65,536 B)."""
    for rid in COMPILED:
        if "-fp32-" in rid and "-v1024-" in rid:
            for phase in PHASES:
                assert abs(err(rid, phase)) < 0.0025, (rid, phase)


def test_the_top_blocks_forward_by_hand():
    """The 3-layer fp32 cell (T = 1,024): the forward's top is the top block's compiled forward, every layer's
    input (T x h x 4) and CPU RNG state (5,056 B) and the block's whole compiled saved set (16,488 B per token)
    before the checkpoint drops it; measured 20,044,608 B above the timeline's zero, to the byte."""
    T = 1024
    top = 3 * (T * 256 * 4 + 5056) + 16488 * T
    assert top == 20_044_608 == ROWS[CELL][1]["forward"] - ROWS[CELL][2]
    r = _solve()
    term = next(t for t in r.terms if t.label.startswith("the top compiled block's forward"))
    later = 2_101_248 + 4_194_304 * 2 + 8_192      # the final norm, log-softmax, logits, labels: not yet
    assert term.nbytes == 16488 * T + 3 * 5056 - later - T * 256 * 4


def test_layer_zeros_backward_by_hand():
    """Layer 0's recompute outside its backward graph, then the graph (the 3-layer fp32 cell): the recomputed set
    without its output (16,488 - 1,024 B per token), the product's size once (the product freed, gate's and up's
    gradients born: 2,752 B per token), the down projection's weight gradient (688 x 256 x 4) and, tied, the LM
    head's weight gradient waiting (1,024 x 256 x 4); torchtitan's order holds three of the product's size and no
    weight gradient of the block instead."""
    T = 1024
    work = (16488 - 1024 + 2752) * T + 688 * 256 * 4 + 1024 * 256 * 4
    inside, outside = _solve("inside"), _solve("outside")
    end = next(t for t in outside.terms if t.label.startswith("recompute working set"))
    assert f"= {work:,} B in place of the eager recompute" in end.formula
    titan = next(t for t in inside.terms if t.label.startswith("recompute working set"))
    assert titan.nbytes - end.nbytes == (16488 - 1024 + 3 * 2752) * T - work


def test_the_default_order_is_unchanged():
    """compile_checkpoint None: torchtitan's order without LoRA (the same terms as 'inside'), torchtune's with LoRA."""
    inside = _solve("inside")
    default = TrainingMemoryModel().solve(_model(), BIG, 2, 512, "fp32", "adamw", "full", profile="measured",
                                          regime="fp32", attention="sdpa", device="cpu", runtime_overheads=False,
                                          compile="blocks")
    assert [(t.label, t.nbytes) for t in default.terms] == [(t.label, t.nbytes) for t in inside.terms]
    assert not any("compile_checkpoint='outside'" in n for n in default.notes)
    assert any("compile_checkpoint='outside'" in n for n in _solve().notes)


@pytest.mark.parametrize("kw, name", [
    ({"compile": None}, "compile_checkpoint"),
    ({"activation_checkpointing": "none"}, "compile_checkpoint"),
    ({"lora": LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), adapter_dtype="base"),
      "compile_checkpoint": "inside"}, "compile_checkpoint"),
])
def test_refused_by_name(kw, name):
    args = dict(profile="measured", regime="fp32", attention="sdpa", device="cpu", runtime_overheads=False,
                compile="blocks", compile_checkpoint="outside")
    ac = kw.pop("activation_checkpointing", "full")
    args.update(kw)
    with pytest.raises(NotModelledError) as e:
        TrainingMemoryModel().solve(_model(), BIG, 2, 512, "fp32", "adamw", ac, **args)
    assert e.value.parameter == name


def test_invalid_value_refused():
    with pytest.raises(Exception, match="compile_checkpoint"):
        _solve("between")


def test_the_step_in_the_backward_within_a_quarter_percent():
    """torchtune's optimizer_in_bwd with compiled blocks in torchtune's order: every phase of the four runs within
    0.25 %; in the 1,024-token cells the backward's peak is the top block's recompute and MLP backward (every
    gradient stepped and freed, every layer's input alive), measured 24,610,696 B above the zero on the 3-layer fp32
    cell: 3 inputs (T h 4) + 2 RNG states + its output's gradient (T h 4) + T x (16,488 - 1,024 + 2,752) + the down
    projection's weight gradient (688 x 256 x 4) + the tied LM head's gradient (1,024 x 256 x 4), 8 B of scalars
    aside."""
    for rid in OIB:
        for phase in PHASES:
            assert abs(err(rid, phase)) < 0.0025, (rid, phase)
    T, th = 1024, 1024 * 256 * 4
    top = 3 * th + 2 * 5056 + th + (16488 - 1024 + 2752) * T + 688 * 256 * 4 + 1024 * 256 * 4
    rid = "tt-llama3_2-3l-v1024-fp32-blocks-full-oib-b2-s512"
    assert top + 8 == ROWS[rid][1]["backward"] - ROWS[rid][2]


def test_the_step_in_the_backward_is_refused_in_torchtitans_order():
    with pytest.raises(NotModelledError) as e:
        TrainingMemoryModel().solve(_model(), BIG, 2, 512, "fp32", "adamw", "full", profile="measured", regime="fp32",
                                    attention="sdpa", device="cpu", runtime_overheads=False, compile="blocks",
                                    optimizer_in_backward=True)
    assert e.value.parameter == "optimizer_in_backward" and "compile_checkpoint='outside'" in str(e.value)
