"""LoRA under data-parallel layouts (issue 25 item 2), per rank through the rules' placement: one rank
of FSDP2 with peft's adapters measured with the fake process group
(validation/parallel/measure_lora_parallel.py -> validation/parallel/lora_measurements.json; this test
needs no torch) every phase compared; ZeRO-1/2/3 and DDP by hand; the layouts not modelled refused by name."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mlsysim_core import HardwareNode, TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "validation" / "parallel" / "lora_measurements.json").read_text(encoding="utf-8"))
RUNS = DATA["runs"]
sys.path.insert(0, str(ROOT / "validation" / "parallel"))
# validation/parallel/compare.py by its path (validation/compile has a compare.py too: whichever test imported
# ``compare`` first would otherwise shadow the other)
PARALLEL_COMPARE = load_script("validation/parallel/compare.py")
REGIMES, layout_kwargs = PARALLEL_COMPARE.REGIMES, PARALLEL_COMPARE.layout_kwargs
from familytools import REPORT  # noqa: E402

CPU = HardwareNode(name="cpu", memory_capacity=2**40)


def _predict(run):
    model = from_hf_config(run["hf_config"], name=run["model"])
    kw = layout_kwargs(run)
    return TrainingMemoryModel("measured").solve(
        model, CPU, run["batch_size"] * kw["dp_size"], run["seq_len"], precision="fp32", optimizer="adamw",
        activation_checkpointing="none", regime=REGIMES[run["regime"]], optimizer_impl="foreach", attention="sdpa",
        runtime_overheads=False, lora=run["lora"], device="cpu", **kw)


def test_the_measurements():
    assert DATA["peft"] == "0.21.2" and DATA["torch"].split("+")[0] == "2.13.0"
    assert "measure_lora_parallel.py" in DATA["generator"]
    assert {r["layout"]["reshard_after_forward"] for r in RUNS} == {True, False}
    assert {r["regime"] for r in RUNS} == {"fp32", "mp-bf16"}


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_one_rank_of_fsdp2_every_phase(run):
    result = _predict(run)
    measured = run["measured"]
    assert result.total_memory == pytest.approx(measured["peak_bytes"], rel=0.005)
    predicted = REPORT.predicted_phases(result)
    for phase in ("forward", "backward", "optimizer"):
        assert predicted[phase] == pytest.approx(measured["peak_by_phase"][phase]["bytes"], rel=0.02), phase


def test_fsdp2_model_states_per_rank():
    """The sharded parameters: the frozen base and the adapters over the dp ranks (fp32 storage under the
    mixed-precision policy too); the optimizer state of the adapters' shards only."""
    for run in RUNS:
        result = _predict(run)
        m = run["measured"]["peak_by_phase"]["optimizer"]["by_category"]
        assert result.weights == pytest.approx(m["sharded_param"] + m["buffer"], rel=1e-3), run["id"]


def _solve(dp, rule, **kw):
    return TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 2048, "bf16", lora={"rank": 16},
                                                 regime="bf16", dp_size=dp, data_parallel=rule, **kw)


ADAPTERS = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024))    # Llama 3 8B, q/k/v/o at rank 16
BASE = 8_030_261_248


@pytest.mark.parametrize("rule, weight_shards, grad_shards, state_shards", [
    ("zero0", 1, 1, 1), ("zero1", 1, 1, 8), ("zero2", 1, 8, 8), ("zero3", 8, 8, 8), ("fsdp", 8, 8, 8)])
def test_zero_and_fsdp_by_hand(rule, weight_shards, grad_shards, state_shards):
    r = _solve(8, rule)
    terms = {t.label: t.nbytes for t in r.terms}
    assert terms["frozen base parameters (2 B)"] == pytest.approx(BASE * 2 / weight_shards)
    assert terms["LoRA adapters (rank 16, 4 B)"] == pytest.approx(ADAPTERS * 4 / weight_shards)   # fp32 adapters
    assert terms["LoRA adapter gradients (4 B)"] == pytest.approx(ADAPTERS * 4 / grad_shards)
    state = next(n for label, n in terms.items() if label.startswith("adam state"))
    assert state == pytest.approx(ADAPTERS * 8 / state_shards)
    if weight_shards > 1:     # one gathered layer: its frozen matrices in bf16, its adapters in fp32
        layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
        assert terms["all-gathered parameters of one layer"] == layer * 2 + ADAPTERS / 32 * 4
        assert terms["reduce-scatter input: one layer's unsharded gradients"] == ADAPTERS / 32 * 4
    if rule == "zero0":        # DDP's buckets: the adapters' gradients only
        assert terms["DDP gradient buckets"] == ADAPTERS * 4


@pytest.mark.parametrize("kw, parameter, name", [(dict(tp_size=2, sequence_parallel=True), "regime",
                                                  "tp_size=2"), (dict(cp_size=2), "lora", "cp_size=2")])
def test_layouts_not_modelled_are_refused_by_name(kw, parameter, name):
    """(Pipeline parallelism is modelled per stage: tests/measured/test_lora_parallel_pp.py; tensor parallelism
    with Megatron-Bridge's adapters, in the base's dtype, per rank with and without sequence parallelism:
    tests/measured/test_lora_parallel_tp.py, test_lora_parallel_sp.py; the default autocast regime under
    tp is not.)"""
    with pytest.raises(NotModelledError) as info:
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 2048, "bf16", lora={"rank": 16}, **kw)
    assert info.value.parameter == parameter and name in str(info.value)
