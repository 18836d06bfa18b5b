"""LoRA under tensor and pipeline parallelism together (issue 25 item 2), per stage of a tensor-parallel rank:
Megatron-Bridge's adapters over a tiny Llama split by torch's DTensor TP, cut to one pipeline stage and run in
Megatron-LM's 1F1B order under the fake process group (validation/lora_parallel/measure_lora_tp_pp.py ->
tp_pp_measurements.json, compared by compare_pp.py --tp; this test needs no torch): fp32 and bf16, with and without
sequence parallelism; a stage before the last peaks inside its top layer's MLP, whose transients are counted by hand
here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.terms import FORWARD, GRADIENTS, WEIGHTS
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
COMPARE = load_script("validation/lora_parallel/compare_pp.py")
RUNS = COMPARE.runs(COMPARE.TP_DATA)
COMPARED = [(run, COMPARE.compare(run)) for run in RUNS]
TOP = "top layer's MLP forward: its transients (tensor parallel)"


def _run(key: str) -> dict:
    return next(r for r in RUNS if key in r["id"])


def test_the_measurements():
    data = json.loads(COMPARE.TP_DATA.read_text(encoding="utf-8"))
    assert data["torch"].split("+")[0] == "2.13.0" and data["transformers"] == "5.23.0"
    assert "measure_lora_tp_pp.py" in data["generator"] and "067f987df03b8355b03192d88d70f1709fedf51a" in \
        data["megatron_bridge"]
    assert len(RUNS) == 12 and not any(r.get("error") for r in RUNS)
    for run in RUNS:
        lay = run["layout"]
        assert lay["schedule"] == "1f1b" and lay["tp_size"] > 1 and lay["pp_size"] > 1
        assert run["measured"]["in_flight"] == min(lay["pp_size"] - lay["stage"], lay["microbatches"])


@pytest.mark.parametrize("run,c", COMPARED, ids=[r["id"] for r in RUNS])
def test_every_phase(run, c):
    # (measured: the last stages within 0.32 % in every phase; a stage before the last exact in its forward but in
    # bf16 with SP (-0.85 %, -1.25 %: DTensor's reduce-scatter over dim 1 copies the partial output, Megatron's over
    # dim 0 does not), within 0.53 % in its backward in fp32, 1.2 % to 3.7 % low in bf16, the peaks within 1.25 %)
    assert c is not None
    last = run["layout"]["stage"] == run["layout"]["pp_size"] - 1
    for phase, error in c["errors"].items():
        assert abs(error) <= (0.005 if last else 0.04 if phase == "backward" else 0.015), (phase, error)
    assert abs(c["peak"][2]) <= (0.001 if last else 0.015)


def test_a_stage_holds_its_layers_adapters_split_by_tp():
    # llama-tiny, every linear at r = 16: 78,080 adapter params a layer; two layers a stage, / tp = 2: 78,080 on
    # the rank, 4 B each, their gradients and two Adam moments (the step's peak holds all three)
    run = _run("lora-tp-llama-tiny-fp32-r16-all-w2-b2-s256-pp2-stage0")
    m = run["measured"]
    assert m["trainable_parameters"] == 2 * 78_080 // 2
    rank = COMPARE.rank_of(COMPARE.solve(run), 0)
    assert sum(t.nbytes for t in rank.terms if t.component == GRADIENTS) == 78_080 * 4
    by_label = {t.label: t.nbytes for t in rank.terms}
    assert by_label["LoRA adapters (rank 16, 4 B)"] == 78_080 * 4
    weights = sum(t.nbytes for t in rank.terms if t.component == WEIGHTS)
    assert weights == m["parameters_and_buffers_bytes"]


def _solve(**kw):
    args = dict(regime="fp32", tp_size=2, pp_size=2, dp_size=1, activation_checkpointing="none",
                gradient_accumulation_steps=8, sequence_parallel=False, lora={"rank": 16, "adapter_dtype": "base"})
    args.update(kw)
    return TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 2048, "fp32", **args)


def test_llama3_8b_stages_by_hand():
    # q/k/v/o at r = 16 (per layer 16 x (2 x 8192 + 2 x 5120) = 425,984), 16 layers a stage, tp 2: 3,407,872
    # adapter params on every rank, 4 B
    r = _solve()
    for rank in r.ranks:
        assert {t.label: t.nbytes for t in rank.terms}["LoRA adapters (rank 16, 4 B)"] == 16 * 425_984 // 2 * 4


def _top(run) -> int:
    rank = COMPARE.rank_of(COMPARE.solve(run), run["layout"]["stage"])
    return next(t.nbytes for t in rank.terms if t.label == TOP and t.phases == (FORWARD,))


def test_the_top_layers_mlp_moment_by_hand():
    # llama-tiny (h 256, ffn 688), b 2 x s 256 = 512 tokens, tp 2 (ffn / 2 = 344), per token:
    # fp32, every linear adapted: the layer's input, mid residual, MLP input and product all saved; at the down
    # adapter's all-gather the base's all-reduced output (1,024), the adapter's out / tp (512), the gather's buffer
    # and the gathered whole (1,024 each); less the running micro-batch's output (1,024), counted, not made yet
    T = 512
    assert _top(_run("tp-llama-tiny-fp32-r16-all-w2-b2-s256-pp2-stage0")) == (1024 + 512 + 1024 + 1024 - 1024) * T
    # bf16, q and v adapted: the layer's 16-bit input and mid residual (the norms keep fp32 copies), the MLP's input
    # (no gate/up adapter) 512 each, the product (no down adapter) 688, down's partial output and its all-reduced
    # copy 512 each, less the output 512: 2,736 B a token, the measured forward's gap without the term
    run = _run("tp-llama-tiny-bf16-r16-q-v-w2-b2-s256-pp2-stage0")
    assert _top(run) == (3 * 512 + 688 + 2 * 512 - 512) * T == 2736 * T
    # with SP: the residual stream on half the tokens (256), the post-attention norm's local output besides the MLP's
    # all-gathered input, the reduce-scattered copy on half the tokens
    run = _run("tpsp-llama-tiny-bf16-r16-q-v-w2-b2-s256-pp2-stage0")
    assert _top(run) == (256 + 256 + 256 + 512 + 688 + 512 + 256 - 256) * T


def test_sequence_parallel_stage_io_by_hand():
    # the received input and the gradient sent back are the rank's sequence chunk: T / 2 x h x 2 B in bf16
    run = _run("tpsp-llama-tiny-bf16-r16-q-v-w2-b2-s256-pp2-stage1")
    rank = COMPARE.rank_of(COMPARE.solve(run), 1)
    by_label = {t.label: t.nbytes for t in rank.terms}
    assert by_label["stage input (received; kept for its backward)"] == 256 * 256 * 2
    assert by_label["gradient of the stage input (sent to the previous stage)"] == 256 * 256 * 2


def test_dropout_over_tp_stages_is_refused():
    from mlsysim_core.errors import NotModelledError
    with pytest.raises(NotModelledError) as e:
        _solve(lora={"rank": 16, "adapter_dtype": "base", "dropout": 0.1})
    assert e.value.parameter == "lora.dropout" and "tp_size > 1 and pp_size > 1" in str(e.value)


def test_the_validation_page_shows_the_table():
    begin, end = (COMPARE.TP_BEGIN, COMPARE.TP_END)
    doc = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    assert doc[doc.index(begin) + len(begin):doc.index(end)].strip() == COMPARE.table(COMPARE.TP_DATA)
