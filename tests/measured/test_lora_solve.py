"""LoRA and QLoRA in a measured-profile solve: predictions against the committed measurements
(validation/lora_measurements.json, made by validation/measure_lora.py with torch, peft and
bitsandbytes; this test needs none of them), hand counts of the model states, and errors."""

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core import HardwareNode, InvalidInputError, TrainingMemoryModel, TransformerWorkload
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig, lora_counts
from mlsysim_core.hf import from_hf_config

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = ROOT / "validation" / "lora_measurements.json"
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PRECISION = {"fp32": "fp32", "amp-bf16": "bf16", "bf16": "bf16"}


def _runs():
    data = json.loads(MEASUREMENTS.read_text(encoding="utf-8"))
    return [run for run in data["runs"] if run.get("measured")]


def _solve(run, solver=None):
    solver = solver or TrainingMemoryModel("measured")
    model = from_hf_config(run["hf_config"], name=run["id"])
    return solver.solve(model, BIG, run["batch_size"], run["seq_len"], PRECISION[run["regime"]], run["optimizer"],
                        run["checkpointing"], profile="measured", regime=run["regime"],
                        optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                        dropout=run["dropout"], runtime_overheads=False, lora=run["lora"])


def _measured_peak(run) -> int:
    # bitsandbytes' QuantState tensors are attributes of the packed weights, neither parameters
    # nor buffers: MemTracker never sees them, measure_lora.py records their bytes beside it.
    return run["measured"]["peak_bytes"] + run["measured"].get("quant_state_bytes", 0)


def test_measurements_cover_lora_and_qlora():
    runs = _runs()
    assert len(runs) >= 6
    assert {r["regime"] for r in runs} >= {"fp32", "amp-bf16", "bf16"}
    assert {r["family"] for r in runs} >= {"llama", "gpt2"}
    assert any(r["lora"]["quantization"] for r in runs)
    assert any(r["lora"]["target_modules"] == "all-linear" for r in runs)
    data = json.loads(MEASUREMENTS.read_text(encoding="utf-8"))
    assert "measure_lora.py" in data["generator"]
    assert (data["peft"], data["bitsandbytes"], data["torch"].split("+")[0]) == ("0.21.2", "0.50.2", "2.13.0")


def test_peak_errors_against_the_measurements():
    solver = TrainingMemoryModel("measured")
    errors = {}
    for run in _runs():
        result = _solve(run, solver)
        errors[run["id"]] = (result.total_memory - _measured_peak(run)) / _measured_peak(run)
        # the adapters are what trains: peft's count, measured
        assert lora_counts(from_hf_config(run["hf_config"]), LoRAConfig(**{
            k: v for k, v in run["lora"].items()})).trainable_parameters == run["measured"]["trainable_parameters"]
    absolute = [abs(e) for e in errors.values()]
    assert statistics.median(absolute) <= 0.03, errors
    assert max(absolute) <= 0.10, errors


def test_model_states_against_the_measurements():
    """Weights (with the tracker-invisible quantization constants), and the optimizer state the
    tracker saw at the peak, for every run whose peak is outside the optimizer step."""
    solver = TrainingMemoryModel("measured")
    for run in _runs():
        m = run["measured"]
        result = _solve(run, solver)
        weights = m["by_category_at_peak"]["parameter"] + m["by_category_at_peak"]["buffer"]
        assert result.weights == weights + m.get("quant_state_bytes", 0), run["id"]
        if m["peak_phase"] != "optimizer":
            assert result.optimizer_state == pytest.approx(m["by_category_at_peak"]["optimizer_state"]), run["id"]


LLAMA_TINY = TransformerWorkload(name="llama-tiny", parameters=19_548_416, layers=4, hidden_dim=256, heads=8,
                                 kv_heads=8, ffn_dim=688, gated_mlp=True, vocab_size=32000, tied_embeddings=False,
                                 architecture="llama")


def test_hand_counted_model_states():
    # rank 8 on q_proj and v_proj: per layer 8 x (256 + 256) twice = 8,192; 4 layers: 32,768 adapter params
    r = TrainingMemoryModel("measured").solve(
        LLAMA_TINY, BIG, 4, 256, "fp32", "adamw", "none", regime="fp32", runtime_overheads=False,
        lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]})
    terms = {t.label: t for t in r.terms}
    assert terms["frozen base parameters (4 B)"].nbytes == 19_548_416 * 4
    assert terms["LoRA adapters (rank 8, 4 B)"].nbytes == 32_768 * 4
    assert terms["RoPE frequency buffers"].nbytes == 128
    assert terms["LoRA adapter gradients (4 B)"].nbytes == 32_768 * 4
    assert terms["adamw state (2 x 32-bit)"].nbytes == 2 * 32_768 * 4
    assert terms["adamw step counters"].nbytes == 16 * 4          # lora_A, lora_B x 2 modules x 4 layers
    assert terms["adamw foreach step temporaries"].nbytes == 32_768 * 4
    # the weights measured with MemTracker (validation/lora_measurements.json): 78,324,864 B
    assert r.weights == 78_324_864


def test_qlora_weights_are_the_quantized_layout():
    cfg = LoRAConfig(rank=16, target_modules="all-linear", quantization="nf4", double_quant=True)
    c = lora_counts(LLAMA_TINY, cfg)
    r = TrainingMemoryModel("measured").solve(LLAMA_TINY, BIG, 4, 256, "bf16", "adamw", "none", regime="bf16",
                                              runtime_overheads=False, lora=cfg)
    terms = {t.label: t.nbytes for t in r.terms}
    assert terms["frozen base parameters (2 B)"] == (c.frozen_parameters - c.quantized_parameters) * 2
    assert terms["quantized base linears (4-bit nf4)"] == c.quantized_weight_bytes == c.quantized_parameters // 2
    assert terms["quantization constants"] == c.quantization_constant_bytes
    # peft keeps the adapters in fp32 over a bf16 base: fp32 adapters, gradients and Adam state
    assert terms["LoRA adapters (rank 16, 4 B)"] == c.trainable_parameters * 4
    assert terms["LoRA adapter gradients (4 B)"] == c.trainable_parameters * 4
    assert terms["adamw state (2 x 32-bit)"] == c.trainable_parameters * 8


def test_lora_cuts_the_model_states_against_full_training():
    solver = TrainingMemoryModel("measured")
    full = solver.solve("llama3-8b", "h100", 1, 1024, regime="bf16", runtime_overheads=False)
    lora = solver.solve("llama3-8b", "h100", 1, 1024, regime="bf16", runtime_overheads=False,
                        lora=LoRAConfig(rank=16, target_modules=("q_proj", "v_proj")))
    assert lora.gradients < full.gradients / 100
    assert lora.optimizer_state < full.optimizer_state / 100
    assert lora.weights == pytest.approx(full.weights, rel=0.01)


@pytest.mark.parametrize("optimizer, impl", [("adafactor", "for-loop"), ("adam-8bit", "foreach"),
                                             ("sgd-momentum", "foreach"), ("lion", "for-loop")])
def test_other_optimizers_follow_the_adapters(optimizer, impl):
    r = TrainingMemoryModel("measured").solve(LLAMA_TINY, BIG, 1, 128, "fp32", optimizer, "none", regime="fp32",
                                              optimizer_impl=impl, runtime_overheads=False,
                                              lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]})
    assert 0 < r.optimizer_state <= 3 * 32_768 * 4 + 16 * 4


@pytest.mark.parametrize("kwargs, parameter, fragment", [
    (dict(lora=7), "lora", "LoRAConfig"),
    (dict(lora={"rank": 0}), "lora", "rank"),
    (dict(lora={"rank": 8, "target_modules": ["c_attn"]}), "lora", "c_attn"),
    (dict(lora={"rank": 8, "bogus": 1}), "lora", "bogus"),
    (dict(lora={"rank": 8}, tp_size=2), "regime", "tp_size=2"),     # (autocast under TP: not measured)
    (dict(lora={"rank": 8}, trainable_fraction=0.5), "trainable_fraction", "1.0"),
])
def test_bad_lora_values_name_the_parameter(kwargs, parameter, fragment):
    with pytest.raises(InvalidInputError) as info:
        TrainingMemoryModel("measured").solve(LLAMA_TINY, BIG, 8, 256, **kwargs)
    assert info.value.parameter.startswith(parameter)
    assert fragment in str(info.value)


def test_lora_needs_the_measured_profile():
    with pytest.raises(InvalidInputError, match="lora"):
        TrainingMemoryModel("reference").solve(LLAMA_TINY, BIG, 8, 256, lora={"rank": 8})


def test_lora_on_a_mixture_of_experts():
    """The attention of a mixture of experts is adapted (derived from its family's description,
    tests/measured/test_lora_families.py); its fused 3-D experts are refused, naming the target."""
    result = TrainingMemoryModel("measured").solve("mixtral-8x7b", "h100", 1, 256, lora={"rank": 8})
    assert any("q_proj 4096x4096" in n and "derived from the family's description" in n for n in result.notes)
    with pytest.raises(NotModelledError, match="3-D parameters") as info:
        TrainingMemoryModel("measured").solve("mixtral-8x7b", "h100", 1, 256,
                                              lora={"rank": 8, "target_modules": ["experts.gate_up"]})
    assert (info.value.parameter, info.value.value) == ("lora.target_modules", "experts.gate_up")


def test_cli_flags_and_scenario_field(tmp_path):
    import io
    from mlsysim_core.cli import main
    out = io.StringIO()
    assert main(["estimate", "--model", "llama3-8b", "--batch-size", "1", "--seq-len", "1024", "--regime", "bf16",
                 "--lora-rank", "16", "--lora-targets", "all-linear", "--quantization", "nf4", "--double-quant",
                 "--json", "--save-scenario", str(tmp_path / "s.json")], out=out) == 0
    flags = json.loads(out.getvalue())
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["lora"] == {"rank": 16, "target_modules": ["all-linear"], "quantization": "nf4",
                             "double_quant": True}
    out = io.StringIO()
    assert main(["estimate", "--scenario", str(tmp_path / "s.json"), "--json"], out=out) == 0
    assert json.loads(out.getvalue())["total_memory"] == flags["total_memory"]
    assert flags["weights"] < 7e9      # a 4-bit 8B model, not 16 GB of bf16 weights
