"""LoRA under tensor parallelism (issue 25 item 2), per rank: Megatron-Bridge's ParallelLinearAdapter re-implemented
over a tiny Llama split by torch's DTensor TP (ColwiseParallel q/k/v/gate/up, RowwiseParallel o/down), one rank
measured under the fake process group (validation/lora_parallel/measure_lora_tp.py ->
validation/lora_parallel/tp_measurements.json; this test needs no torch), every phase compared; the adapters'
per-rank bytes by hand (r (in + out) / tp per adapted linear); what stays unmodelled refused by type and message."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.terms import GRADIENTS, WEIGHTS
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
COMPARE = load_script("validation/lora_parallel/compare_tp.py")
RUNS = COMPARE.runs()
COMPARED = [(run, COMPARE.compare(run)) for run in RUNS]


def _run(key: str) -> dict:
    return next(r for r in RUNS if key in r["id"])


def test_the_measurements():
    data = json.loads(COMPARE.DATA.read_text(encoding="utf-8"))
    assert data["torch"].split("+")[0] == "2.13.0" and data["transformers"] == "5.23.0"
    assert "measure_lora_tp.py" in data["generator"] and "067f987df03b8355b03192d88d70f1709fedf51a" in \
        data["megatron_bridge"]
    assert len(RUNS) == 8 and not any(r.get("error") for r in RUNS)
    for run in RUNS:
        assert run["layout"]["kind"] == "tp" and run["measured"]["tp_plan"]["mlp"].startswith("ColwiseParallel")


@pytest.mark.parametrize("run,c", COMPARED, ids=[r["id"] for r in RUNS])
def test_every_phase_within_one_percent(run, c):
    # (measured: the peaks within 0.01 %; the forward's peak at the LM head's all-gather 0.13-0.28 % low)
    for phase, error in c["errors"].items():
        assert abs(error) <= 0.01, (phase, error)
    assert abs(c["peak"][2]) <= 0.001


def test_adapters_per_rank_by_hand():
    # llama-tiny: h 256, ffn 688, 8 heads (q = kv = 256), 4 layers; all linears adapted at r = 16, tp = 2:
    # per layer 4 x 16 x (256 + 256) + 3 x 16 x (256 + 688) = 78,080 adapter params, / tp = 39,040 on each rank
    run = _run("fp32-r16-all-w2")
    adapters = 4 * (4 * 16 * (256 + 256) + 3 * 16 * (256 + 688)) // 2
    assert adapters == 156_160
    m = run["measured"]
    assert m["alive"]["end_of_backward"]["by_category"]["gradient"] == adapters * 4 == 624_640
    result = COMPARE.solve(run)
    rank = result.ranks[0]
    grads = sum(t.nbytes for t in rank.terms if t.component == GRADIENTS)
    assert grads == 624_640
    weights = sum(t.nbytes for t in rank.terms if t.component == WEIGHTS and "RoPE" not in t.label)
    assert weights == m["local_parameter_storage_bytes"] == 39_726_080
    # bf16: Megatron-Bridge casts the adapters to bf16 (2 B), half the fp32 run's gradients
    assert _run("bf16-r16-all-w2")["measured"]["alive"]["end_of_backward"]["by_category"]["gradient"] == 312_320
    # tp = 4, r = 8: a quarter of the r = 8 adapters, 4 B
    assert _run("fp32-r8-all-w4")["measured"]["alive"]["end_of_backward"]["by_category"]["gradient"] == \
        4 * (4 * 8 * 512 + 3 * 8 * 944) // 4 * 4 == 156_160


def test_layer_saved_bytes_per_token_by_hand():
    # fp32, tp = 2, r = 16, every linear adapted: per token a later layer keeps the input norm's rsqrt (4), the
    # norm output the column adapters read, whole (4 h = 1,024), three gathered r-wide intermediates (3 x 64), the
    # attention kernel's q, k, v of the rank's 4 heads and its logsumexp (3 x 512 + 16), o's adapter input shard
    # (the kernel's output, 512) and its r (64), the mid residual and post-attention rsqrt (1,028), the MLP's norm
    # output (1,024) and two r (128), gate, silu and up outputs of ffn / 2 (3 x 1,376), down's input shard (1,376)
    # and its r (64), the layer's output (1,024): 12,120 B, as measured
    by_hand = 4 + 1024 + 192 + 3 * 512 + 16 + 512 + 64 + 1028 + 1024 + 128 + 3 * 1376 + 1376 + 64 + 1024
    run = _run("fp32-r16-all-w2")
    T = run["batch_size"] * run["seq_len"]
    assert by_hand == 12_120 and run["measured"]["layer_forward_retained_bytes"][1:] == [by_hand * T] * 3
    rank = COMPARE.solve(run).ranks[0]
    layers = next(t for t in rank.terms if t.label == "decoder layers: saved for backward (LoRA)")
    assert layers.nbytes == sum(run["measured"]["layer_forward_retained_bytes"])


def test_lora_dropout_by_hand():
    # lora_dropout 0.1 (dropout_position="pre"), fp32, every linear: each adapter drops its own input and lora_A keeps
    # the dropped copy, the CPU's dropout its noise tensor (4 B a value); the norm outputs and down's input, which
    # lora_A kept without dropout, are now kept by nobody. Per token, on the 12,120 B without dropout: q, k, v
    # 3 x (1,024 + 1,024) - 1,024; o 512 + 512; gate, up 2 x (1,024 + 1,024) - 1,024; down 1,376 + 1,376 - 1,376
    run = _run("fp32-r16-all-d0.1-w2")
    T = run["batch_size"] * run["seq_len"]
    by_hand = 12_120 + (3 * 2048 - 1024) + 1024 + (2 * 2048 - 1024) + 1376
    assert by_hand == 22_712 and run["measured"]["layer_forward_retained_bytes"][1:] == [by_hand * T] * 3
    layers = next(t for t in COMPARE.solve(run).ranks[0].terms if t.label == "decoder layers: saved for backward (LoRA)")
    assert layers.nbytes == sum(run["measured"]["layer_forward_retained_bytes"])


def test_grouped_query_attention_splits_the_kv_heads():
    # gqa-tiny: 2 KV heads of 32 (kv = 64), one on each of tp = 2 ranks. Adapters per layer, every linear at r = 16:
    # q and o 16 x 512, k and v 16 x (256 + 64), the MLP's 3 x 16 x 944: 71,936, x 4 layers / 2 x 4 B; per token a
    # layer keeps the llama-tiny run's 12,120 B but k and v of one KV head (2 x 128 B) instead of four (2 x 512 B)
    run = _run("gqa-tiny-fp32-r16-all-w2")
    m = run["measured"]
    assert m["alive"]["end_of_backward"]["by_category"]["gradient"] == 4 * 71_936 // 2 * 4 == 575_488
    T = run["batch_size"] * run["seq_len"]
    assert m["layer_forward_retained_bytes"][1] == (12_120 - 2 * (512 - 128)) * T
    rank = COMPARE.solve(run).ranks[0]
    assert sum(t.nbytes for t in rank.terms if t.component == GRADIENTS) == 575_488
    layers = next(t for t in rank.terms if t.label == "decoder layers: saved for backward (LoRA)")
    assert layers.nbytes == sum(m["layer_forward_retained_bytes"])


def _solve(**kw):
    lora = kw.pop("lora", {"rank": 16, "adapter_dtype": "base"})
    args = dict(regime="bf16", tp_size=2, dp_size=1, sequence_parallel=False, activation_checkpointing="none")
    args.update(kw)
    return TrainingMemoryModel("measured").solve("llama3-8b", "h100", 4, 2048, "bf16", lora=lora, **args)


def test_llama3_8b_adapters_per_rank():
    # the default targets (the attention projections q, k, v, o) of Llama 3 8B (h 4096, kv 1024, 32 layers), r = 16,
    # tp = 2, bf16 adapters: 32 x 16 x (2 x (4096 + 4096) + 2 x (4096 + 1024)) / 2 params x 2 B, weights and
    # gradients alike
    rank = _solve().ranks[0]
    by_label = {t.label: t.nbytes for t in rank.terms}
    adapters = 32 * 16 * (2 * 8192 + 2 * 5120) // 2 * 2
    assert by_label["LoRA adapters (rank 16, 2 B)"] == adapters == 13_631_488
    assert by_label["LoRA adapter gradients (2 B)"] == adapters


@pytest.mark.parametrize("kw,error,parameter,message", [
    ({"lora": {"rank": 16}}, NotModelledError, "lora.adapter_dtype",
     "Megatron-Bridge casts its adapters to the model's 16-bit dtype"),
    ({"lora": {"rank": 16, "adapter_dtype": "base", "quantization": "nf4"}}, NotModelledError, "lora.quantization",
     "a quantized base split by tensor parallelism is not measured"),
    ({"lora": {"rank": 15, "adapter_dtype": "base"}}, InvalidInputError, "lora.rank", "a multiple of tp_size=2"),
    ({"dp_size": 2}, NotModelledError, "dp_size", "combined with data parallelism"),
    ({"regime": "amp-bf16", "lora": {"rank": 16}}, NotModelledError, "regime",
     "measured in fp32, pure bf16 and under Megatron-Core's main-grad buffer"),
    ({"activation_checkpointing": "full"}, NotModelledError, "activation_checkpointing",
     "recomputation under LoRA and tensor parallelism is not measured"),
    ({"ep_size": 2}, NotModelledError, "lora", "split by expert or context parallelism"),
])
def test_refused(kw, error, parameter, message):
    with pytest.raises(error) as e:
        _solve(**kw)
    assert e.value.parameter == parameter
    assert message in str(e.value)


def test_the_derived_families_are_refused():
    with pytest.raises(NotModelledError) as e:
        TrainingMemoryModel("measured").solve("qwen3-8b", "h100", 4, 2048, "bf16", regime="bf16", tp_size=2,
                                              sequence_parallel=False, activation_checkpointing="none",
                                              lora={"rank": 16, "adapter_dtype": "base"})
    assert e.value.parameter == "lora" and "under LoRA and tensor parallelism are not measured" in str(e.value)


def test_the_validation_page_shows_the_table():
    begin, end = COMPARE.MARKERS[False]
    doc = (ROOT / "docs" / "validation.md").read_text(encoding="utf-8")
    assert doc[doc.index(begin) + len(begin):doc.index(end)].strip() == COMPARE.table(COMPARE.DATA)
