"""LoRA on every family, derived from the family's description (issue 25 item 2): the adapters from
its layer weights (hand-derived trainable counts, per family), the layer's saved tensors from its own
full-training parts (every phase against validation/lora_family_measurements.json, made by
validation/measure_lora_families.py with peft 0.21.2 on CPU; this test needs neither), a third party's
family adapted from its description alone, and refusals that name the option and its value."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import attrs
import pytest

from familytools import PRECISION, phase_errors, solve_model
from mlsysim_core import TrainingMemoryModel, TransformerWorkload
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_plugins.measured import lora
from mlsysim_plugins.measured.families import LLAMA, LayerWeight
from mlsysim_plugins.measured.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]
DATA = json.loads((ROOT / "validation" / "lora_family_measurements.json").read_text(encoding="utf-8"))
RUNS = DATA["runs"]


def _solve(run, **changes):
    model = from_hf_config(run["hf_config"], name=run["id"])
    options = dict(regime=run["regime"], optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                   dropout=0.0, lora=run["lora"], device="cpu")
    options.update(changes)
    return solve_model(model, batch=run["batch_size"], seq=run["seq_len"], precision=PRECISION[run["regime"]],
                       optimizer=run["optimizer"], checkpointing=run["checkpointing"], **options)


def test_the_measurements_cover_the_families():
    assert DATA["peft"] == "0.21.2" and DATA["torch"].split("+")[0] == "2.13.0"
    assert "measure_lora_families.py" in DATA["generator"]
    assert {r["hf_config"]["model_type"] for r in RUNS} == {"qwen3", "gemma3_text", "gpt_oss", "qwen3_moe", "llama"}
    assert {r["lora_dropout"] for r in RUNS} >= {0.0, 0.05, 0.1}
    assert {r["regime"] for r in RUNS} == {"fp32", "bf16", "amp-bf16"}
    assert all(r.get("measured") for r in RUNS)


@pytest.mark.parametrize("run", RUNS, ids=[r["id"] for r in RUNS])
def test_every_phase_against_the_measurement(run):
    e = phase_errors(run, _solve(run))
    assert all(abs(v) <= 0.01 for v in e.values()), e


def test_lora_dropout_keeps_the_mask_and_the_output():
    """Per adapted linear, peft's lora_A(dropout(x)): on the CPU the bernoulli noise in the adapters' dtype
    (fp32) and the dropout's output (lora_A's input) -- 2 x 4 B x in per token; on CUDA a bool mask. In the
    first layer q and v read an input that requires no grad: the multiply by the noise keeps nothing."""
    run = _by_id("lora-llama-tiny-fp32-r8-qv-dropout")
    with_dropout, without = _solve(run), _solve(run, lora={**run["lora"], "dropout": 0.0})
    layers = lambda r: next(t.nbytes for t in r.terms if t.label.startswith("decoder layers"))   # noqa: E731
    T, h = run["batch_size"] * run["seq_len"], run["hf_config"]["hidden_size"]
    # without dropout q and v share the norm output (one 4h tensor); with it each keeps its own output (4h)
    # and, past the first layer, its noise (4h)
    assert layers(with_dropout) - layers(without) == (2 * 4 - 4) * h * T + 3 * (2 * (4 + 4) - 4) * h * T
    cuda = _solve(run, device="cuda")
    assert layers(with_dropout) - layers(cuda) == 3 * 2 * 3 * h * T


def test_median_and_max_per_family():
    by_family: dict[str, list[float]] = {}
    for run in RUNS:
        by_family.setdefault(run["hf_config"]["model_type"], []).extend(
            abs(v) for v in phase_errors(run, _solve(run)).values())
    for family, errors in by_family.items():
        assert statistics.median(errors) <= 0.01 and max(errors) <= 0.05, (family, errors)


# --- hand-derived trainable counts ------------------------------------------------------------

def _by_id(prefix):
    return next(r for r in RUNS if r["id"].startswith(prefix))


@pytest.mark.parametrize("prefix, expected", [
    # Qwen3 tiny: h 256, q 8 x 64 = 512, kv 2 x 64 = 128, f 688, 4 layers, r 16, all-linear:
    # q, o 16 (256 + 512); k, v 16 (256 + 128); gate, up, down 16 (256 + 688)
    ("lora-qwen3-tiny-fp32-r16-all", 4 * 16 * (2 * 768 + 2 * 384 + 3 * 944)),
    # Gemma 3 tiny: q 4 x 128 = 512, kv 128, f 768, 6 layers, r 16, all-linear
    ("lora-gemma3-tiny-fp32-r16-all", 6 * 16 * (2 * 768 + 2 * 384 + 3 * 1024)),
    # gpt-oss tiny: q 8 x 48 = 384, kv 2 x 48 = 96, 4 layers, r 16, q/k/v/o (router and experts not linears)
    ("lora-gpt-oss-tiny-fp32-r16-qkvo", 4 * 16 * (2 * 640 + 2 * 352)),
    # bf16, r 8, all-linear: the same four (the router is a Parameter, the experts 3-D)
    ("lora-gpt-oss-tiny-bf16-r8-all", 4 * 8 * (2 * 640 + 2 * 352)),
    # Qwen3-MoE tiny: q 512, kv 128, 4 layers, r 16, q/k/v/o
    ("lora-qwen3-moe-tiny-fp32-r16-qkvo", 4 * 16 * (2 * 768 + 2 * 384)),
])
def test_trainable_counts_by_hand(prefix, expected):
    run = _by_id(prefix)
    assert run["measured"]["trainable_parameters"] == expected
    result = _solve(run)
    grads = [t for t in result.terms if t.label.startswith("LoRA adapter gradients")]
    assert grads[0].nbytes == expected * 4


def test_the_adapters_are_read_from_the_layer_weights():
    run = _by_id("lora-qwen3-tiny-fp32")
    model = from_hf_config(run["hf_config"])
    from mlsysim_plugins.measured.architectures.llama_variants import QWEN3
    linears, excluded = lora.family_linears(ModelShape.of(model, QWEN3))
    assert [(x.module, x.in_features, x.out_features) for x in linears] == [
        ("q_proj", 256, 512), ("k_proj", 256, 128), ("v_proj", 256, 128), ("o_proj", 512, 256),
        ("gate_proj", 256, 688), ("up_proj", 256, 688), ("down_proj", 688, 256)]
    assert excluded == ()
    assert lora.family_default_targets(ModelShape.of(model, QWEN3)) == ("q_proj", "k_proj", "v_proj", "o_proj")


def test_qwen3_8b_on_an_h100_is_no_longer_refused():
    """The issue's case: Qwen3-8B, seq 4096, LoRA r16 -- answered by the measured profile, never a fallback."""
    result = TrainingMemoryModel("measured").solve("qwen3-8b", "h100", 1, 4096, "bf16", lora={"rank": 16},
                                                   regime="bf16")
    assert any("derived from the family's description" in n for n in result.notes)
    assert result.activations > 4 * 4096 * 151936      # the fp32 log-softmax of the logits alone


# --- a third party's family -------------------------------------------------------------------

def _fused_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    return (LayerWeight("attn.wqkv", h * (q_dim + 2 * kv_dim), shape=(q_dim + 2 * kv_dim, h)),
            LayerWeight("attn.wo", q_dim * h, shape=(h, q_dim)),
            LayerWeight("ffn.w13", 2 * f * h, shape=(2 * f, h)),
            LayerWeight("ffn.w2", f * h, shape=(h, f)))


FUSED = attrs.evolve(LLAMA, name="test.fused", label="Fused", architectures=("fusedarch",), fallback=False,
                     layer_weights=_fused_weights, lora_layer=None, pack_hook_copies=None,
                     lora_default_targets=("wqkv",))


def _fused_model():
    h, q, kv, f, V, L = 256, 256, 64, 512, 1000, 2
    per_layer = h * (q + 2 * kv) + q * h + 3 * f * h + 2 * h
    return TransformerWorkload(name="fused-tiny", parameters=2 * V * h + L * per_layer + h, layers=L, hidden_dim=h,
                               heads=4, kv_heads=1, vocab_size=V, ffn_dim=f, gated_mlp=True, tied_embeddings=False,
                               architecture="fusedarch")


def test_a_third_party_family_gets_lora_from_its_description():
    model = _fused_model()
    shape = ModelShape.of(model, FUSED)
    linears, _ = lora.family_linears(shape)
    assert [(x.module, x.in_features, x.out_features) for x in linears] == [
        ("attn.wqkv", 256, 384), ("attn.wo", 256, 256), ("ffn.w13", 256, 1024), ("ffn.w2", 512, 256)]
    from mlsysim_core.finetune import LoRAConfig
    counts = lora.generic_counts(shape, LoRAConfig(rank=8, target_modules=("wqkv", "w2")))
    assert counts.trainable_parameters == 2 * 8 * ((256 + 384) + (512 + 256))
    assert counts.per_module == (("attn.wqkv", 256, 384, 8 * 640), ("ffn.w2", 512, 256, 8 * 768))
    everything = lora.generic_counts(shape, LoRAConfig(rank=8, target_modules="all-linear"))
    assert everything.trainable_parameters == 2 * 8 * (640 + 512 + 1280 + 768)
    assert lora.generic_counts(shape, LoRAConfig(rank=8)).trainable_parameters == 2 * 8 * 640   # its default


def test_a_third_party_family_solves_through_the_hook(builtin_pm):
    from test_families_kernels import Registers, manager
    solver = TrainingMemoryModel("measured", plugin_manager=manager(builtin_pm, (Registers(FUSED), "test_fused")))
    result = solver.solve(_fused_model(), "h100", 2, 256, "fp32", lora={"rank": 8}, regime="fp32")
    assert any("attn.wqkv 256x384 adapted" in n for n in result.notes)
    assert any("wqkv" in n and "not given" in n for n in result.notes)


# --- refusals name the option and the value ----------------------------------------------------

@pytest.mark.parametrize("model, target, error, fragment", [
    ("mixtral-8x7b", "experts.gate_up", NotModelledError, "3-D parameters"),
    ("gpt-oss-20b", "router", NotModelledError, "not an nn.Linear"),
    ("qwen3-8b", "wqkv", InvalidInputError, "q_proj"),
    ("qwen3-8b", "q-proj", InvalidInputError, "q_proj"),
])
def test_refusals_name_the_target(model, target, error, fragment):
    with pytest.raises(error) as info:
        TrainingMemoryModel("measured").solve(model, "h100", 1, 256, lora={"rank": 8, "target_modules": [target]})
    assert (info.value.parameter, info.value.value) == ("lora.target_modules", target)
    assert fragment in str(info.value)


@pytest.mark.parametrize("model, defaults", [
    ("openai/gpt-oss-20b", "q_proj, k_proj, v_proj, o_proj"),          # its MLP width equals hidden
    ("microsoft/phi-3-mini-4k-instruct", "qkv_proj, o_proj"),          # fused q/k/v; not gate_up_proj
    ("tiiuae/falcon-7b", "query_key_value, dense"),
    ("deepseek-ai/deepseek-v3", "q_a_proj, q_b_proj, kv_a_proj_with_mqa, kv_b_proj, o_proj"),   # the family's own
    ("mistralai/mixtral-8x7b-v0.1", "q_proj, k_proj, v_proj, o_proj"),  # not its router
])
def test_default_targets_are_the_attention_projections(model, defaults):
    result = TrainingMemoryModel("measured").solve(model, "h200", 1, 512, "bf16", lora={"rank": 8}, regime="bf16")
    assert any(n.endswith(f"layers, {defaults}") for n in result.notes), result.notes


@pytest.mark.parametrize("model", ["meta-llama/llama-4-maverick-17b-128e", "qwen/qwen1.5-moe-a2.7b"])
def test_a_mean_layer_adapts_its_attention_and_refuses_the_rest(model):
    """Llama 4 and Qwen 1.5-MoE describe a mean layer (dense and MoE layers averaged): the attention every
    layer has is adapted; all-linear would place adapters on linears only some layers have: refused."""
    solver = TrainingMemoryModel("measured")
    assert solver.solve(model, "h200", 1, 512, "bf16", lora={"rank": 8}, regime="bf16").total_memory > 0
    with pytest.raises(NotModelledError) as info:
        solver.solve(model, "h200", 1, 512, "bf16", lora={"rank": 8, "target_modules": "all-linear"}, regime="bf16")
    assert info.value.parameter == "lora" and "mean layer" in str(info.value)


def test_mixtral_router_is_not_a_linear():
    with pytest.raises(NotModelledError) as info:
        TrainingMemoryModel("measured").solve("mixtral-8x7b", "h200", 1, 512, lora={"rank": 8,
                                                                                    "target_modules": ["router"]})
    assert (info.value.parameter, info.value.value) == ("lora.target_modules", "router")


def test_adapters_in_the_base_dtype():
    """peft's autocast_adapter_dtype=False (torchtune's recipes): bf16 adapters, gradients and Adam state over a
    bf16 base; lora_A shares the layer's bf16 input (no fp32 copy)."""
    run = _by_id("lora-qwen3-tiny-bf16-r16-all-bf16adapters")
    assert run["measured"]["trainable_dtypes"] == ["bfloat16"]
    base, fp32 = _solve(run), _solve(run, lora={**run["lora"], "adapter_dtype": "fp32"})
    terms = {t.label: t.nbytes for t in base.terms}
    n = run["measured"]["trainable_parameters"]
    assert terms["LoRA adapters (rank 16, 2 B)"] == 2 * n and terms["LoRA adapter gradients (2 B)"] == 2 * n
    assert base.activations < fp32.activations
    with pytest.raises(InvalidInputError) as info:
        _solve(run, lora={**run["lora"], "adapter_dtype": "bf16"})
    assert (info.value.parameter, info.value.value) == ("lora.adapter_dtype", "bf16")
