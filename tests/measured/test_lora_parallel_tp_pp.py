"""LoRA under tensor and pipeline parallelism together (issue 25 item 2), per stage of a tensor-parallel rank:
Megatron-Bridge's adapters over a tiny Llama split by torch's DTensor TP, cut to one pipeline stage and run in
Megatron-LM's 1F1B order under the fake process group (validation/lora_parallel/measure_lora_tp_pp.py ->
tp_pp_measurements.json, compared by compare_pp.py --tp; this test needs no torch). Modelled in fp32 without sequence
parallelism; 16-bit regimes and sequence parallelism with pp are measured and refused, naming the gap."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import GRADIENTS, WEIGHTS

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("compare_lora_pp_tp", ROOT / "validation" / "lora_parallel" /
                                               "compare_pp.py")
COMPARE = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(COMPARE)
RUNS = COMPARE.runs(COMPARE.TP_DATA)
MODELLED = [r for r in RUNS if r["regime"] == "fp32" and r["layout"]["kind"] == "tp"]
COMPARED = [(run, COMPARE.compare(run)) for run in MODELLED]


def test_the_measurements():
    data = json.loads(COMPARE.TP_DATA.read_text(encoding="utf-8"))
    assert data["torch"].split("+")[0] == "2.13.0" and data["transformers"] == "5.23.0"
    assert "measure_lora_tp_pp.py" in data["generator"] and "067f987df03b8355b03192d88d70f1709fedf51a" in \
        data["megatron_bridge"]
    assert len(RUNS) == 10 and not any(r.get("error") for r in RUNS) and len(MODELLED) == 4
    for run in RUNS:
        lay = run["layout"]
        assert lay["schedule"] == "1f1b" and lay["tp_size"] > 1 and lay["pp_size"] > 1
        assert run["measured"]["in_flight"] == min(lay["pp_size"] - lay["stage"], lay["microbatches"])


@pytest.mark.parametrize("run,c", COMPARED, ids=[r["id"] for r in MODELLED])
def test_every_phase(run, c):
    # (measured: the last stages within 0.32 % in every phase; a stage before the last within 0.53 % in its
    # backward and step, its forward 2.8 % and 4.3 % low: the top layer's MLP transients, not modelled, as without tp)
    last = run["layout"]["stage"] == run["layout"]["pp_size"] - 1
    for phase, error in c["errors"].items():
        assert abs(error) <= (0.005 if last else 0.01 if phase != "forward" else 0.05), (phase, error)
    assert abs(c["peak"][2]) <= (0.001 if last else 0.02)


def test_a_stage_holds_its_layers_adapters_split_by_tp():
    # llama-tiny, every linear at r = 16: 78,080 adapter params a layer; two layers a stage, / tp = 2: 78,080 on
    # the rank, 4 B each, their gradients and two Adam moments (the step's peak holds all three)
    run = next(r for r in MODELLED if r["layout"]["pp_size"] == 2 and r["layout"]["stage"] == 0)
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


@pytest.mark.parametrize("kw,parameter,message", [
    ({"regime": "bf16"}, "regime", "that stage's forward peak 6.1 % above the prediction in bf16"),
    ({"sequence_parallel": True}, "sequence_parallel", "7.3 % with sequence parallelism"),
])
def test_refused_where_measured_off(kw, parameter, message):
    with pytest.raises(NotModelledError) as e:
        _solve(**kw)
    assert e.value.parameter == parameter and message in str(e.value)
