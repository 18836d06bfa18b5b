"""The LoRA variants (issue 25 item 2): DoRA (``lora.use_dora``), ``lora.modules_to_save`` and a chunked loss
with LoRA. Every phase against validation/lora_variant_measurements.json (validation/measure_lora_variants.py:
peft 0.21.2 over transformers 5.23 on CPU, MemTracker; this test needs neither), hand-derived counts and bytes,
and refusals that name the field, its value and what is modelled."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from familytools import PRECISION, solve_model
from familytools import phase_errors as _phase_errors
from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig, lora_counts
from mlsysim_core.hf import from_hf_config
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "validation" / "lora_variant_measurements.json").read_text(encoding="utf-8"))
RUNS = DATA["runs"]
COMPARED = RUNS


def phase_errors(run, result):
    """familytools' errors, bitsandbytes' quantization state (alive, unseen by the tracker: measure_lora.py records
    it) added to every measured phase."""
    q = run["measured"].get("quant_state_bytes", 0)
    m = dict(run["measured"], peak_bytes=run["measured"]["peak_bytes"] + q,
             peak_by_phase={p: dict(v, bytes=v["bytes"] + q) for p, v in run["measured"]["peak_by_phase"].items()})
    return _phase_errors(dict(run, measured=m), result)


def _by_id(prefix):
    return next(r for r in RUNS if r["id"].startswith(prefix))


def _solve(run, *, lora=None, **changes):
    model = from_hf_config(run["hf_config"], name=run["id"])
    options = dict(regime=run["regime"], optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                   dropout=0.0, lora=lora or run["lora"], device="cpu")
    if run.get("loss"):
        options.update(loss=run["loss"], loss_chunks=run["loss_chunks"])
    options.update(changes)
    return solve_model(model, batch=run["batch_size"], seq=run["seq_len"], precision=PRECISION[run["regime"]],
                       optimizer=run["optimizer"], checkpointing=run["checkpointing"], **options)


def _term(result, prefix):
    return sum(t.nbytes for t in result.terms if t.label.startswith(prefix))


def _kind(run):
    return "dora" if run["lora"].get("use_dora") else "chunked loss" if run.get("loss") else "modules_to_save"


def test_the_measurements():
    assert DATA["peft"] == "0.21.2" and DATA["torch"].split("+")[0] == "2.13.0"
    assert "measure_lora_variants.py" in DATA["generator"]
    assert all(r.get("measured") and not r.get("error") for r in RUNS)
    assert {_kind(r) for r in RUNS} == {"dora", "modules_to_save", "chunked loss"}
    assert {r["regime"] for r in COMPARED} == {"fp32", "bf16", "amp-bf16"}


@pytest.mark.parametrize("run", COMPARED, ids=[r["id"] for r in COMPARED])
def test_every_phase_against_the_measurement(run):
    e = phase_errors(run, _solve(run))
    assert all(abs(v) <= 0.05 for v in e.values()), e


def test_median_and_max_per_variant():
    by_kind: dict[str, list[float]] = {}
    for run in COMPARED:
        by_kind.setdefault(_kind(run), []).extend(abs(v) for v in phase_errors(run, _solve(run)).values())
    assert set(by_kind) == {"dora", "modules_to_save", "chunked loss"}
    for kind, errors in by_kind.items():
        assert statistics.median(errors) <= 0.01 and max(errors) <= 0.05, (kind, errors)


# --- DoRA -----------------------------------------------------------------------------------------

def test_dora_magnitude_vectors_are_the_adapted_out_features():
    """DoRA's magnitude: one trainable parameter per output feature of every adapted linear and layer."""
    run = _by_id("dora-llama-tiny-fp32-r8-qv")          # h 256, 4 layers, q and v 256 -> 256, r 8
    layers, h, r = 4, 256, 8
    lora = 2 * layers * r * (h + h)
    assert run["measured"]["trainable_parameters"] == lora + 2 * layers * h
    assert run["measured"]["parameter_tensors"] == 3 * 2 * layers       # lora_A, lora_B, magnitude
    result = _solve(run)
    assert _term(result, "LoRA adapter gradients") == (lora + 2 * layers * h) * 4
    model = from_hf_config(run["hf_config"])
    config = LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"), use_dora=True)
    assert lora_counts(model, config).trainable_parameters == lora + 2 * layers * h


def test_dora_saves_the_base_and_lora_results():
    """Per adapted linear and token, the base result (c B x out) and the LoRA result (adapter dtype x out); per
    linear three out-sized vectors (two where the input needs no grad: the first layer's q and v)."""
    run = _by_id("dora-llama-tiny-fp32-r8-qv")
    T, h, layers = run["batch_size"] * run["seq_len"], 256, 4
    plain = _solve(run, lora={**run["lora"], "use_dora": False})
    dora = _solve(run)
    per_linear = (4 + 4) * h * T
    vectors = (2 * 2 + 3 * 2 * (layers - 1)) * h * 4
    assert _term(dora, "decoder layers") - _term(plain, "decoder layers") == 2 * layers * per_linear + vectors


def test_dora_with_lora_dropout_keeps_its_own_base_matmul_weight():
    """With lora_dropout DoRA recomputes the base layer on the dropped input, F.linear(dropout(x), W.to(fp32)):
    over a bf16 base with fp32 adapters each adapted linear whose input requires grad keeps its fp32 copy of W
    (4 B x in x out; Qwen3 tiny: q 256 -> 512, k 256 -> 128), and the base result is fp32 (4 B x out per token)."""
    run = _by_id("dora-qwen3-tiny-bf16-r16-qkvo-dropout")
    layers = next(t for t in _solve(run).terms if t.label.startswith("decoder layers"))
    assert "q_proj DoRA: weight saved by its dropped-input matmul 524,288" in layers.formula
    assert "k_proj DoRA: weight saved by its dropped-input matmul 131,072" in layers.formula
    assert f"q_proj DoRA: base result (saved by the magnitude's product) {4 * 512 * 512:,}" in layers.formula
    fp32 = next(t for t in _solve(_by_id("dora-qwen3-tiny-fp32-r16-all-dropout")).terms
                if t.label.startswith("decoder layers"))
    assert "dropped-input matmul" not in fp32.formula        # W itself is fp32: the parameter, nothing new


def test_dora_weight_norm_transient_is_the_forward_peak_of_a_wide_mlp():
    """llama-wide (h 256, ffn 2048, vocab 1024, T 64): down_proj's norm, in^2 x 4 (the identity) + in x r x 4 +
    3 x in x out x 4, outgrows the loss's moment; the term is the excess."""
    run = _by_id("dora-llama-wide-fp32")
    result = _solve(run)
    i, o, r = 2048, 256, 16
    transient = i * i * 4 + i * r * 4 + 3 * i * o * 4
    T, V = 64, 1024
    at_loss = 4 * T + 4 * T * V + 8 * T + 4 * T * V        # final norm's rsqrt, log-softmax, labels, logits
    assert _term(result, "DoRA weight norm") == transient - at_loss
    assert run["measured"]["peak_by_phase"]["forward"]["op"] != "aten.nll_loss_forward.default"


# --- modules_to_save ---------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix, copies", [
    ("mts-llama-tiny-fp32-r8-qv-lmhead", 1), ("mts-llama-tiny-fp32-r8-qv-embed-lmhead", 2),
    ("mts-llama-tiny-fp32-r16-all-embed", 1), ("mts-qwen3-tiny-fp32-r16-qkvo-lmhead", 1)])
def test_modules_to_save_copies_are_vocab_by_hidden(prefix, copies):
    run = _by_id(prefix)
    V, h = run["hf_config"]["vocab_size"], run["hf_config"]["hidden_size"]
    result = _solve(run)
    assert _term(result, "modules_to_save") == copies * V * h * 4
    adapters = _term(result, "LoRA adapters") // 4
    assert run["measured"]["trainable_parameters"] == adapters + copies * V * h


def test_a_trainable_lm_head_keeps_its_input():
    run = _by_id("mts-llama-tiny-fp32-r8-qv-lmhead")
    T, h = run["batch_size"] * run["seq_len"], 256
    frozen = _solve(run, lora={**run["lora"], "modules_to_save": []})
    assert _term(_solve(run), "final norm") - _term(frozen, "final norm") == 4 * T * h


def test_bf16_copies_beside_fp32_adapters():
    """Over a bf16 base peft casts the adapters to fp32 but not the copies (the run's trainable dtypes): the copies'
    gradients, AdamW's two moments and its foreach temporary in bf16 (2 B), the adapters' in fp32."""
    run = _by_id("mts-llama-tiny-bf16-r8-qv-embed-lmhead")
    assert run["measured"]["trainable_dtypes"] == ["bfloat16", "float32"]
    copies = 2 * 32000 * 256
    result = _solve(run)
    assert _term(result, "modules_to_save: trainable copies (2 B)") == copies * 2
    assert _term(result, "modules_to_save: the copies' gradients (2 B)") == copies * 2
    assert _term(result, "modules_to_save: the copies' optimizer state") == copies * 2 * 2
    assert _term(result, "modules_to_save: the copies' foreach") == copies * 2
    assert _term(result, "LoRA adapter gradients (4 B)") == 2 * 4 * 8 * (256 + 256) * 4
    with pytest.raises(NotModelledError) as e:
        _solve(run, optimizer_impl="for-loop")
    assert e.value.parameter == "lora.modules_to_save" and "for-loop" in str(e.value)


# --- a chunked loss with LoRA ------------------------------------------------------------------------

def test_chunked_loss_with_a_frozen_lm_head():
    """torchtune's chunked cross-entropy under LoRA: no weight-gradient partials; in fp32 the backward's
    moment is the last chunk's cross-entropy temporaries, 2 x 4 x t x V."""
    run = _by_id("chunked-lora-llama-tiny-fp32")
    T, V, n = run["batch_size"] * run["seq_len"], 32000, 8
    result = _solve(run)
    assert _term(result, "cross-entropy backward temporaries, one chunk") == 8 * (T // n) * V
    assert _term(result, "LM head backward") == 0


# --- refusals ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("prefix, change, parameter, value", [
    ("dora-gqa-tiny-amp", {"dropout": 0.1, "quantization": "nf4"}, "lora.dropout", 0.1),
    ("dora-llama-tiny-fp32-r8-qv", {"use_dora": True, "quantization": "int8"}, "lora.quantization", "int8"),
    ("dora-llama-tiny-fp32-r8-qv", {"modules_to_save": ["norm"]}, "lora.modules_to_save", "norm"),
])
def test_refused_variants_name_the_field(prefix, change, parameter, value):
    run = _by_id(prefix)
    with pytest.raises(NotModelledError) as e:
        _solve(run, lora={**run["lora"], **change})
    assert e.value.parameter == parameter and e.value.value == value


def test_modules_to_save_under_data_parallelism_is_refused():
    with pytest.raises(NotModelledError) as e:
        TrainingMemoryModel("measured").solve("llama-3.1-8b", "h100", 2, 1024, "bf16", regime="bf16", dp_size=2,
                                              lora={"rank": 16, "modules_to_save": ["lm_head"], "adapter_dtype": "base"})
    assert e.value.parameter == "lora.modules_to_save" and "dp_size" in str(e.value)


def test_other_losses_with_lora_are_still_refused():
    run = _by_id("chunked-lora-llama-tiny-fp32")
    with pytest.raises(NotModelledError) as e:
        _solve(run, loss="fused_linear", loss_chunks=None)
    assert e.value.parameter == "loss" and e.value.value == "fused_linear"



def test_torchtune_linear_loss_with_a_frozen_lm_head():
    """torchtune's LinearCrossEntropyLoss under LoRA: the chunks' matmuls keep no input (the masked copy lives
    through the loss only) and no weight-gradient partials; the backward's moment is one chunk's cross-entropy
    temporaries, 2 x 4 x t x V; under autocast every chunk saves its own 16-bit cast of the frozen LM head."""
    run = _by_id("ttlinear-lora-llama-tiny-fp32")
    T, V, h, n = 512, 32000, 256, 8
    result = _solve(run)
    assert _term(result, "chunked linear cross-entropy backward") == 8 * (T // n) * V
    assert _term(result, "LM head input") == 0
    masked = next(t for t in result.terms if t.label.startswith("masked hidden state"))
    assert masked.nbytes == 4 * T * h and masked.phases == ("forward",)
    amp = _solve(_by_id("ttlinear-lora-gqa-tiny-amp"))
    assert _term(amp, "autocast 16-bit casts of the frozen LM head") == (n - 1) * 2 * V * h


def test_chunked_loss_over_a_trainable_lm_head_copy():
    """With modules_to_save=["lm_head"] the chunked loss's LM head trains: its weight-gradient partials return
    (fp32: the second chunk's partial beside the first and their sum, 3 x V x h x 4, with 6 of 8 chunks' logits
    gradients and two chunks' input gradients, less the freed log-softmaxes)."""
    run = _by_id("chunked-mts-llama-tiny-fp32")
    T, V, h, n = 512, 32000, 256, 8
    t = T // n
    expected = 4 * T * V * (n - 2) / n + 3 * V * h * 4 + 2 * 4 * t * h - 4 * T * V
    assert _term(_solve(run), "LM head backward") == expected
    assert _term(_solve(run, lora={**run["lora"], "modules_to_save": []}), "LM head backward") == 0


def test_defaults_are_off():
    config = LoRAConfig(rank=8)
    assert config.use_dora is False and config.modules_to_save == ()


def test_the_fields_as_a_dict_and_their_errors():
    from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
    from mlsysim_core.finetune import _config
    assert _config({"rank": 8, "modules_to_save": "lm_head"}).modules_to_save == ("lm_head",)
    assert _config({"rank": 8, "modules_to_save": ["embed_tokens", "lm_head"], "use_dora": True}).use_dora is True
    with pytest.raises(InvalidInputError) as e:
        _config({"rank": 8, "modules_to_save": ["lm_head", "lm_head"]})
    assert e.value.parameter == "lora.modules_to_save"
    with pytest.raises(InvalidInputTypeError) as e:
        _config({"rank": 8, "use_dora": "yes"})
    assert e.value.parameter == "lora.use_dora"


def test_the_table_in_the_docs_is_current():
    report = load_script("validation/report_lora_variants.py")
    section = report.render(report.compare(report.load()))
    assert section in (ROOT / "docs" / "finetune.md").read_text(encoding="utf-8"), \
        "docs/finetune.md is stale: run python validation/report_lora_variants.py"


def test_qdora_dequantizes_the_weight_for_its_norm():
    """QDoRA over bitsandbytes nf4 (bf16 compute, fp32 adapters): the norm reads the dequantized weight cast to the
    input's fp32, out x in x 4 beside the identity, lora_A's output, the product, s x BA and their sum; the
    largest is down_proj's (in 688, out 256, r 16)."""
    run = _by_id("qdora-llama-tiny-bf16-nf4")
    i, o, r = 688, 256, 16
    expected = i * i * 4 + i * r * 4 + 4 * o * i * 4
    formula = next(t.formula for t in _solve(run).terms if t.label.startswith("DoRA weight norm"))
    assert f"max(0, {expected:,.0f} B (down_proj" in formula and "W cast" in formula
