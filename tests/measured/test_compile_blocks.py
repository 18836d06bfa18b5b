"""``compile="blocks"`` (torchtune ``compile: True``, torchtitan ``compile.enable``): each decoder block compiled
apart, against validation/compile/blocks_measurements.json (torchtune 0.6.1's own builders, the profiler's memory
timeline; every phase), hand-derived bytes, what it shares with the eager profile, and what is refused. No torch."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
compare_blocks = load_script("validation/compile/compare_blocks.py")

RUNS = {r["id"]: r for r in json.loads((ROOT / "validation/compile/blocks_measurements.json").read_text(
    encoding="utf-8"))["runs"] if r.get("measured")}
ROWS = {rid: (pred, meas, base) for rid, pred, meas, base in compare_blocks.rows()}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PHASES = ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward")


def err(rid, phase):
    pred, meas, _ = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def test_every_run_is_measured_and_predicted():
    """Every run is predicted (the LoRA runs: test_compile_lora.py)."""
    assert len(RUNS) == 16 + 8 + 2 + 2 + 4
    assert all(isinstance(v[0], dict) for v in ROWS.values())


def test_full_checkpointing_around_compiled_layers_what_is_measured():
    """torchtune compiles each layer, then wraps it in checkpoint_wrapper: the end of the forward holds what the
    eager full checkpointing holds (the layers' inputs); the forward's peak is the top layer's moment: the
    layers' inputs (3 x T x h x 4), their CPU RNG states (3 x 5,056) and the compiled block's whole saved set
    (16,488 B x T) before the checkpoint's hooks drop it. (The recompute moment is not modelled: refused.)"""
    e = RUNS["tt-llama3_2-3l-v1024-fp32-eager-full-b2-s512"]["measured"]
    c = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-b2-s512"]["measured"]
    assert c["alive"]["end_of_forward"] == e["alive"]["end_of_forward"]
    T = 2 * 512
    assert c["peak_by_phase"]["forward"] == 3 * T * 256 * 4 + 3 * 5056 + 16_488 * T


def test_full_checkpointing_in_torchtitans_order_what_is_measured():
    """torchtitan wraps each block in checkpoint_wrapper, then compiles it (the checkpoint inside the graph): the
    end of the forward is eager full checkpointing's again, the forward's peak within 0.4 % of eager's; the
    backward's recompute moment is 4.9 MB above torchtune's order on the 3-layer cell, and on the 32,000-token
    cell the loss sets every phase, equal in all three runs."""
    e = RUNS["tt-llama3_2-3l-v1024-fp32-eager-full-b2-s512"]["measured"]
    tune = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-b2-s512"]["measured"]
    titan = RUNS["tt-llama3_2-3l-v1024-fp32-blocks-full-in-b2-s512"]["measured"]
    assert titan["alive"]["end_of_forward"] == e["alive"]["end_of_forward"]
    assert abs(titan["peak_by_phase"]["forward"] - e["peak_by_phase"]["forward"]) < 0.004 * e["peak_by_phase"]["forward"]
    assert titan["peak_by_phase"]["backward"] - tune["peak_by_phase"]["backward"] == 4_931_584
    big = [RUNS[f"tt-llama3_2-2l-v32000-fp32-{k}-b1-s512"]["measured"] for k in ("eager-full", "blocks-full",
                                                                               "blocks-full-in")]
    assert big[0]["peak_by_phase"] == big[1]["peak_by_phase"] == big[2]["peak_by_phase"]


FULL_IN = ("tt-llama3_2-3l-v1024-fp32-blocks-full-in-b2-s512", "tt-llama3_2-3l-v1024-kv2-fp32-blocks-full-in-b2-s512",
           "tt-llama3_2-3l-v1024-bf16-blocks-full-in-b1-s256", "tt-llama3_2-2l-v32000-fp32-blocks-full-in-b1-s512")


def test_full_checkpointing_in_torchtitans_order_is_predicted():
    """compile="blocks" with full checkpointing is torchtitan's order: every phase of its runs within 3 % (the bf16
    forward: torchtune's LM head, as its eager twin). The backward peak on the layer-dominated fp32 cells, MHA and
    GQA alike, is 983,040 B under the measurement: one T x h x 4 tensor alive at layer 0's moment that the eager
    structure (last_moments) does not count, less the RoPE tables' 65,536 B (the eager MHA twin sits there too,
    -988,040 B); bf16 -2.2 % (not derived); the loss-dominated cell +0.02 %."""
    for rid in FULL_IN:
        for phase in PHASES:
            assert abs(err(rid, phase)) < 0.03, (rid, phase, err(rid, phase))
    for rid in FULL_IN[:2]:
        assert abs(ROWS[rid][0]["backward"] - ROWS[rid][1]["backward"] + 983_040) <= 64, rid
    e = "tt-llama3_2-3l-v1024-fp32-eager-full-b2-s512"
    assert ROWS[e][0]["backward"] - ROWS[e][1]["backward"] == -988_040


def test_torchtunes_order_differs_as_the_note_says():
    """torchtune's recipes compile each layer, then wrap it (the `-blocks-full-` rows): priced as torchtitan's
    order, their forward peak is 10.2 % above the prediction (the top compiled block's whole saved set before
    the checkpoint drops it) and their backward peak 6.5 % below (the recompute outside the backward graph):
    what BLOCKS_FULL, the note every such result carries, says."""
    rid = "tt-llama3_2-3l-v1024-fp32-blocks-full-b2-s512"
    assert -0.103 < err(rid, "forward") < -0.101 and 0.064 < err(rid, "backward") < 0.066
    r = compare_blocks.solve(RUNS[rid])
    assert any("torchtune's recipes compile each layer, then wrap it" in n for n in r.notes)


def test_every_compiled_run_every_phase_within_the_issue_targets():
    """Issue 25's targets (median <= 1 %, max <= 5 %) on every phase of the compiled runs but the bf16 forward
    (the eager torchtune LM head, not the blocks: test below); every one within 0.6 % (op-SAC's end of the
    forward: test_op_sac_blocks_keep_one_residual_less_per_block)."""
    compiled = [r for r in RUNS if "-blocks-" in r and "fsdp2" not in r and "-full" not in r    # FSDP2: below
                and "-lora-" not in r and "-tp-" not in r]                    # LoRA: its own tests; TP: below
    assert len(compiled) == 7
    for phase in PHASES:
        errors = [abs(err(r, phase)) for r in compiled if not (phase == "forward" and "-bf16-blocks-b1" in r)]
        assert statistics.median(errors) <= 0.01, phase
        assert max(errors) <= 0.006, (phase, max(errors))


def test_the_compiled_backward_peak_within_a_fifth_of_a_percent():
    for rid in RUNS:
        if "fsdp2" not in rid and "-full" not in rid and "-blocks-op-sac-" not in rid and "-tp-" not in rid:
            # (the eager full-checkpointing twin: the eager profile's recompute set on torchtune's model, -1.45 %)
            assert abs(err(rid, "backward")) < (0.015 if "-eager-" in rid else 0.0019), (rid, err(rid, "backward"))


def test_op_sac_blocks_keep_one_residual_less_per_block():
    """op-SAC inside compiled blocks: the policy's saved set, as the eager op-SAC term prices it, but for one
    T x h x 4 tensor per block the compiled run does not keep (measured: 2 blocks x 524,288 B, plus the 65,536 B
    of the RoPE tables every torchtune run shows; not explained, not priced)."""
    rid = "tt-llama3_2-2l-v32000-fp32-blocks-op-sac-b1-s512"
    pred, meas, _ = ROWS[rid]
    assert 0 <= pred["end_of_forward"] - meas["end_of_forward"] - (2 * 512 * 256 * 4 + 65_536) <= 64   # (scalars)
    assert abs(err(rid, "backward")) < 0.0036


def test_fsdp2_runs_carry_the_eager_rules_offset():
    """The FSDP2 runs (torchtune's tied model, rank 0 of 2) are 3,227,656 B above the prediction from the forward
    to the backward's peak, eager and compiled alike: the eager FSDP rule's part on this model, not compile's
    (+1.0 % on the backward peak)."""
    for rid in ("tt-llama3_2-2l-v32000-fp32-eager-fsdp2-w2r0-b1-s512", "tt-llama3_2-2l-v32000-fp32-blocks-fsdp2-w2r0-b1-s512"):
        pred, meas, _ = ROWS[rid]
        assert pred["forward"] - meas["forward"] == 3_227_656
        assert abs(err(rid, "backward")) < 0.011 and abs(err(rid, "optimizer")) < 0.001


def test_the_compile_delta_under_fsdp2_is_exact():
    """FSDP2 (rank 0 of 2, the fake process group): the rule's part is the same in the eager and the compiled
    run, so their difference is the blocks' alone: predicted to the byte."""
    e, c = ("tt-llama3_2-2l-v32000-fp32-eager-fsdp2-w2r0-b1-s512", "tt-llama3_2-2l-v32000-fp32-blocks-fsdp2-w2r0-b1-s512")
    for phase in PHASES:
        assert ROWS[c][0][phase] - ROWS[e][0][phase] == ROWS[c][1][phase] - ROWS[e][1][phase], phase
    assert ROWS[c][1]["backward"] - ROWS[e][1]["backward"] == -4_915_200


def test_the_bf16_forward_is_torchtunes_lm_head():
    """torchtune returns ``self.output(h).float()``: the bf16 logits are freed when the model returns, where the
    priced Hugging Face path keeps them beside the fp32 copy (2 x T x V, 32,768,000 B at s 512, V 32,000); the
    eager torchtune run shows the same excess, less its layers' 1.3 MB under-prediction."""
    pred, meas, _ = ROWS["tt-llama3_2-2l-v32000-bf16-blocks-b1-s512"]
    assert 0.999 < (pred["forward"] - meas["forward"]) / (2 * 512 * 32000) < 1.002


def test_grouped_query_blocks_save_k_and_v_at_the_query_width():
    """torchtune expands k and v to the query heads before SDPA (attention.py:285-291): the kv2 run's
    activations equal the kv8 run's (only the parameters differ)."""
    a = RUNS["tt-llama3_2-2l-v32000-fp32-blocks-b1-s512"]["measured"]
    b = RUNS["tt-llama3_2-2l-v32000-kv2-fp32-blocks-b1-s512"]["measured"]
    assert a["peak_bytes"] == b["peak_bytes"]


def model(**over):
    hf = dict(RUNS["tt-llama3_2-2l-v32000-fp32-blocks-b1-s512"]["hf_config"], **over)
    return from_hf_config(hf, name="tt-tiny")


def solve(regime="fp32", compile="blocks", checkpointing="none", **kw):
    return TrainingMemoryModel().solve(model(), BIG, 1, 512, regime, "adamw", checkpointing, profile="measured",
                                       regime=regime, attention="sdpa", device="cpu", runtime_overheads=False,
                                       compile=compile, **kw)


def terms(r):
    return {t.label: t.nbytes for t in r.terms}


def test_hand_derived_blocks():
    """fp32, h 256, FFN 688, 8 heads, T 512: per block and token q, k, v, SDPA's output 4 x 1,024 + fp32
    log-sum-exp 8 x 4 + o 1,024 + gate, up 2 x 2,752 + down 1,024 + 2 norms x (1,024 + 4) + the product 2,752
    = 16,488 B; the first block's input 1,024 per token (the eager term: the first norm saves its input in fp32);
    torchtune's final norm, F.rms_norm's composite on the CPU: normalized x, output and rsqrt."""
    t = terms(solve())
    assert t["decoder layers: saved for backward (compiled)"] == 2 * 512 * 16_488
    assert t["embedding output (saved by the first norm)"] == 512 * 1024
    assert "embedding output (the first block's input, saved)" not in t
    assert t["final norm"] == 512 * (2 * 1024 + 4)
    assert "attention mask (materialized under compile)" not in t
    bf = terms(solve("bf16"))
    assert bf["embedding output (the first block's input, saved)"] == 0      # the last block's output freed instead
    assert bf["final norm"] == 512 * (8 * 256 + 2 * 256 + 4)


def test_off_is_eager_and_blocks_keeps_the_eager_loss():
    eager, blocks = terms(solve(compile=None)), terms(solve())
    for label in ("log-softmax of the logits (fp32)", "cross-entropy backward temporaries (fp32)",
                  "tied embedding gradient: two partials and their sum"):
        assert eager[label] == blocks[label]
    assert solve(compile=None).total_memory == solve(compile=False).total_memory


def test_op_sac_blocks_is_the_policys_saved_set():
    eager, blocks = terms(solve(compile=None, checkpointing="op-sac")), terms(solve(checkpointing="op-sac"))
    assert eager["op-sac layers: input and saved op outputs"] == blocks["op-sac layers: input and saved op outputs"]


def test_compiled_chunked_loss_saves_the_chunks_logits_not_the_log_softmax():
    t = terms(solve(loss="chunked"))
    assert t["every chunk's logits, saved by the compiled cross-entropy"] == 4 * 512 * 32000 + 8 * 512
    assert "log-softmax of every chunk's logits (fp32)" not in t


@pytest.mark.parametrize("kw, name", [
    (dict(checkpointing="full", checkpointed_layers=1), "activation_checkpointing"),
    # (full checkpointing under FSDP2 is modelled: tests/measured/test_compile_blocks_fsdp.py; under TP it is not)
    (dict(checkpointing="full", tp_size=2, sequence_parallel=False), "activation_checkpointing"),
    (dict(checkpointing="selective"), "activation_checkpointing"),
    (dict(loss="fused_linear"), "loss"),
    (dict(cp_size=2), "cp_size"),
    (dict(compile="max-autotune"), "compile"),
])
def test_refused_by_name(kw, name):
    checkpointing = kw.pop("checkpointing", "none")
    with pytest.raises(NotModelledError, match=name):
        solve(checkpointing=checkpointing, **kw)


def test_whole_model_compile_still_refuses_data_parallelism():
    with pytest.raises(NotModelledError, match="blocks"):
        TrainingMemoryModel().solve(model(), BIG, 2, 512, "fp32", "adamw", "none", profile="measured", regime="fp32",
                                    attention="sdpa", device="cpu", compile=True, dp_size=2, data_parallel="fsdp")


TP = ("tt-llama3_2-2l-v1024-untied-fp32-eager-tp-w2r0-b2-s512", "tt-llama3_2-2l-v1024-untied-fp32-blocks-tp-w2r0-b2-s512")


def test_the_compile_delta_under_tensor_parallelism_is_exact():
    """TP (rank 0 of 2, the fake process group, torchtune's plan, no sequence parallelism; then each block
    compiled): compiled minus eager, predicted against measured, to the byte in every phase. Both runs sit at
    the same offset from the prediction (-2.7 % / -3.1 % on the forward peak): the harness leaves the embedding
    replicated (torch 2.13 fails the vocab-parallel embedding's backward behind a compiled block), where the
    rule prices it vocab-parallel (its weight, gradient and AdamW state / tp)."""
    e, c = TP
    for phase in PHASES:
        assert ROWS[c][0][phase] - ROWS[e][0][phase] == ROWS[c][1][phase] - ROWS[e][1][phase], phase
        assert ROWS[c][0][phase] - ROWS[c][1][phase] == ROWS[e][0][phase] - ROWS[e][1][phase], phase
    assert ROWS[c][1]["end_of_forward"] - ROWS[e][1]["end_of_forward"] == -7_012_352


def test_hand_derived_tp_blocks():
    """tp = 2, fp32, h 256, FFN 688, 8 heads, per block and token: q, k, v 3 x 1,024 / 2 + SDPA (1,024 + 32) / 2
    + o 1,024 (all-reduced, whole) + gate, up 2 x 2,752 / 2 + down 1,024 + 2 norms x (1,024 + 4) + the product
    2,752 / 2 = 10,296 B."""
    r = TrainingMemoryModel().solve(model(num_hidden_layers=2, vocab_size=1024, tie_word_embeddings=False), BIG, 2,
                                    512, "fp32", "adamw", "none", profile="measured", regime="fp32",
                                    attention="sdpa", device="cpu", runtime_overheads=False, compile="blocks",
                                    tp_size=2, sequence_parallel=False)
    assert terms(r)["decoder layers: saved for backward (compiled)"] == 2 * 1024 * 10_296


@pytest.mark.parametrize("kw, name", [
    (dict(sequence_parallel=True), "sequence_parallel"),
    (dict(loss="chunked"), "loss"),
    (dict(checkpointing="op-sac"), "activation_checkpointing"),
])
def test_tp_refusals(kw, name):
    checkpointing = kw.pop("checkpointing", "none")
    with pytest.raises(NotModelledError, match=name):
        solve(checkpointing=checkpointing, tp_size=2, **kw)
