"""LoRA and QLoRA under pipeline parallelism (issue 25 item 2), per stage: each stage of a Llama measured alone
with peft's adapters under a 1F1B schedule (validation/lora_parallel/measure_lora_pp.py ->
validation/lora_parallel/pp_measurements.json; this test needs no torch), every phase compared; the model
states per stage by hand; what stays unmodelled (tensor, expert, context parallelism; DoRA, modules_to_save, a
chunked loss and interleaved chunks under pp) refused by type and message."""

from __future__ import annotations

import statistics

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import GRADIENTS
from scripttools import load_script

COMPARE = load_script("validation/lora_parallel/compare_pp.py")
RUNS = COMPARE.runs()
COMPARED = [(run, COMPARE.compare(run)) for run in RUNS]


def test_the_measurements():
    import json
    data = json.loads(COMPARE.DATA.read_text(encoding="utf-8"))
    assert data["peft"] == "0.21.2" and data["torch"].split("+")[0] == "2.13.0"
    assert data["bitsandbytes"] == "0.50.2" and "measure_lora_pp.py" in data["generator"]
    assert not any(r.get("error") for r in RUNS)
    # fully checkpointed stages were measured; the profile refuses LoRA with recomputation under pp (the forward of
    # a stage before the last peaks in a layer's working set, 13 % above the prediction there; the last stage exact)
    checkpointed = [r for r in RUNS if r["checkpointing"] == "full"]
    assert checkpointed and all("activation_checkpointing='full' is not allowed" in COMPARE.refused(r)
                                for r in checkpointed)
    # every stage of the layouts measured, the in-flight micro-batches 1F1B's: min(p - stage, m)
    for run in RUNS:
        lay, m = run["layout"], run["measured"]
        assert m["in_flight"] == min(lay["pp_size"] - lay["stage"], lay["microbatches"]), run["id"]


@pytest.mark.parametrize("run,c", [rc for rc in COMPARED if rc[1] is not None],
                         ids=[r["id"] for r, c in COMPARED if c is not None])
def test_one_stage_every_phase(run, c):
    """Every phase within 5 % but the forward of a stage before the last, whose peak is inside its top layer
    (the top linear's output transients, not modelled: -1.3 % to -6.0 % measured, always under)."""
    assert c["rank"].in_flight == run["measured"]["in_flight"]
    for phase, err in c["errors"].items():
        not_last = any(t.label.startswith("gradient of the stage output") for t in c["rank"].terms)
        if phase == "forward" and not_last:
            assert -0.06 <= err <= 0, (phase, err)
        else:
            assert abs(err) <= 0.05, (phase, err)
    assert abs(c["peak"][2]) <= 0.05


def test_errors_median_and_max():
    errors = [abs(e) for _, c in COMPARED if c is not None for e in c["errors"].values()]
    peaks = [abs(c["peak"][2]) for _, c in COMPARED if c is not None]
    assert len(peaks) == 8
    assert statistics.median(errors) <= 0.01 and max(errors) <= 0.06
    assert statistics.median(peaks) <= 0.01 and max(peaks) <= 0.05


@pytest.mark.parametrize("run,c", [rc for rc in COMPARED if rc[1] is not None],
                         ids=[r["id"] for r, c in COMPARED if c is not None])
def test_stage_model_states(run, c):
    """Per stage: the frozen weights of its own layers (the embedding on the first stage, the final norm and LM
    head on the last; QLoRA's packed codes), its adapters and their gradients, to the byte of what the stage
    holds (parameters and buffers; bitsandbytes' QuantState is no parameter, measured apart). (The optimizer
    phase, AdamW's state over the stage's adapters, is compared to the byte in test_one_stage_every_phase.)"""
    rank, m = c["rank"], run["measured"]
    assert rank.weights == m["parameters_and_buffers_bytes"] + m["quant_state_bytes"]
    grads = sum(t.nbytes for t in rank.terms if t.component == GRADIENTS)
    assert grads == 4 * m["trainable_parameters"]      # fp32 gradients of the stage's adapters
    adapters = sum(t.nbytes for t in rank.terms if t.label.startswith("LoRA adapters"))
    assert adapters == 4 * m["trainable_parameters"]            # fp32 adapters (peft's autocast_adapter_dtype)


def test_layer_adapters_by_hand():
    """Llama tiny (h 256, ffn 688, 4 layers), r 16 on every linear: per layer 16 x ((256 + 256) x 2 + (256 + 64 x 4)
    ... ) counted from the shapes: q, k, v, o are 256 x 256 here (8 KV heads of 32), gate/up 256 -> 688, down
    688 -> 256; two layers per stage at pp 2."""
    per_layer = 16 * (4 * (256 + 256) + 2 * (256 + 688) + (688 + 256))
    run = next(r for r in RUNS if r["id"].startswith("lora-llama-tiny-fp32-r16-all-pp2-stage0"))
    assert run["measured"]["trainable_parameters"] == 2 * per_layer


def _solve(**kw):
    base = dict(lora={"rank": 16}, regime="bf16", gradient_accumulation_steps=8, activation_checkpointing="none")
    base.update(kw)
    return TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 2048, "bf16", **base)


def test_pipeline_stages_of_llama3_8b():
    """Llama 3 8B, 4 stages of 8 layers: every stage holds 8 layers' adapters (q/k/v/o at rank 16: 8 x 16 x
    (2 x 8192 + 2 x 5120) = 3,407,872), their fp32 gradients and Adam moments; the first stage the frozen
    embedding, the last the final norm and LM head."""
    r = _solve(pp_size=4)
    first, middle, last = r.ranks
    adapters = 8 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024))
    for rank in r.ranks:
        assert sum(t.nbytes for t in rank.terms if t.component == GRADIENTS) == 4 * adapters
        assert sum(t.nbytes for t in rank.terms if t.label.startswith("LoRA adapters")) == 4 * adapters
    layer = 4096 * (4096 * 2 + 1024 * 2) + 3 * 4096 * 14336 + 2 * 4096
    vocab = 128256 * 4096
    frozen = {t.label: t.nbytes for t in first.terms}["frozen base parameters (2 B)"]
    assert frozen == 2 * (8 * layer + vocab)
    assert {t.label: t.nbytes for t in middle.terms}["frozen base parameters (2 B)"] == 2 * 8 * layer
    assert {t.label: t.nbytes for t in last.terms}["frozen base parameters (2 B)"] == 2 * (8 * layer + vocab + 4096)
    # the received input only on later stages, the loss only on the last
    assert not any("stage input" in t.label for t in first.terms)
    assert any("stage input" in t.label for t in middle.terms)
    assert any("log-softmax" in t.label for t in last.terms)
    assert not any("log-softmax" in t.label for t in middle.terms)
    # m = 8 micro-batches > in flight: the gradients exist in every forward after the first backward
    assert "forward" in next(t for t in first.terms if t.label.startswith("LoRA adapter gradients")).phases


def test_qlora_pipeline_stage_quantized_share():
    r = _solve(pp_size=2, lora={"rank": 16, "quantization": "nf4", "double_quant": True})
    whole = TrainingMemoryModel("measured").solve("llama3-8b", "h100", 8, 2048, "bf16", regime="bf16",
                                                  gradient_accumulation_steps=8, activation_checkpointing="none",
                                                  lora={"rank": 16, "quantization": "nf4", "double_quant": True})
    packed = [{t.label: t.nbytes for t in rank.terms}["quantized base linears (4-bit nf4)"] for rank in r.ranks]
    assert sum(packed) == {t.label: t.nbytes for t in whole.terms}["quantized base linears (4-bit nf4)"]


@pytest.mark.parametrize("kw,parameter,message", [
    ({"tp_size": 2, "pp_size": 2, "lora": {"rank": 16, "adapter_dtype": "base", "use_dora": True}},
     "lora.use_dora", "tp_size=2: not measured under tensor parallelism"),
    ({"cp_size": 2}, "lora", "cp_size=2"),
    ({"pp_size": 2, "lora": {"rank": 16, "use_dora": True}}, "lora.use_dora",
     "pp_size=2: DoRA's weight norms per pipeline stage are not measured"),
    ({"pp_size": 2, "lora": {"rank": 16, "modules_to_save": ["lm_head"]}}, "lora.modules_to_save",
     "trainable copies of the embedding / LM head on the first / last stage are not measured"),
    ({"pp_size": 2, "pipeline_schedule": "interleaved-1f1b"}, "pipeline_schedule",
     "LoRA over interleaved model chunks is not measured"),
    ({"pp_size": 2, "activation_checkpointing": "full"}, "activation_checkpointing",
     "the forward working set of a recomputed layer on a stage before the last is not modelled under LoRA"),
])
def test_refused(kw, parameter, message):
    with pytest.raises(NotModelledError) as e:
        _solve(**kw)
    assert e.value.parameter == parameter
    assert message in str(e.value)
    if parameter == "lora":
        assert "data-parallel layouts, pipeline stages and tensor parallelism" in str(e.value)


def test_one_device_and_data_parallel_unchanged_by_stages():
    """pp 1: the stage is the whole model (no stage terms, the gradients born in the backward)."""
    r = _solve(dp_size=2, gradient_accumulation_steps=1)
    assert not any("stage" in t.label for t in r.terms)
    grads = next(t for t in r.terms if t.label.startswith("LoRA adapter gradients"))
    assert "forward" not in grads.phases
