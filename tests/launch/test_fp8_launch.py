"""fp8 training from launch files (FP8READ, issue 26): what each framework's ``fp8`` runs, read end to
end. Sources: huggingface/accelerate@16cb6eb8, axolotl-ai-cloud/axolotl@067b021c,
hiyouga/LLaMA-Factory@ff6d4d12 (the readers' notes cite the lines).

* axolotl ``fp8: true``: accelerate's torchao backend (AORecipeKwargs, Float8LinearConfig's default recipe:
  tensorwise), accelerate's default module filter (the model's first and last nn.Linear and any linear not a
  multiple of 16 kept in high precision), under accelerate's bf16 autocast: the measured profile's
  ``float8='tensorwise'`` where the option expresses the filter (``float8.filter_left_out``).
* accelerate ``mixed_precision: fp8``: ``fp8_config.backend`` AO as above; TE and MS-AMP refused.
* LLaMA-Factory ``fp8: true`` with ``bf16: true``: no fp8 runs (the Accelerator gets bf16), said in a note."""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import yaml

from mlsysim_core.catalog import find_model
from mlsysim_core.errors import MlsysimError, NotModelledError
from mlsysim_core.scenario import from_launch
from mlsysim_plugins.measured import float8

DATA = Path(__file__).resolve().parents[1] / "data" / "launch"
AXOLOTL_FP8 = DATA / "axolotl" / "examples" / "llama-3" / "3b-fp8-fsdp2.yaml"
ACCELERATE_FP8 = DATA / "accelerate" / "accelerate" / "fp8.yaml"
LLAMAFACTORY_FP8 = DATA / "llamafactory" / "examples" / "extras" / "fp8" / "llama3_fp8_deepspeed_sft.yaml"


def _variant(tmp_path, source, name, drop=(), **changes):
    doc = yaml.safe_load(source.read_text())
    for key in drop:
        doc.pop(key, None)
    doc.update(changes)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _fields(launch):
    return {(f.key, f.field): f for r in launch.readings for f in r.fields}


# --- the real files, as written ------------------------------------------------------------------

def test_axolotl_fp8_fsdp2_file_is_refused_on_its_fp8_all_gather():
    with pytest.raises(NotModelledError) as info:
        from_launch([AXOLOTL_FP8], gpus=8, hardware="h100")
    assert info.value.parameter == f"{AXOLOTL_FP8}: fp8_enable_fsdp_float8_all_gather"
    assert info.value.value is True and info.value.allowed == "false"
    assert "FSDP2's float8 all-gather" in info.value.detail and "is not modelled" in info.value.detail


def test_accelerate_fp8_file_is_refused_on_its_transformer_engine_backend():
    with pytest.raises(NotModelledError) as info:
        from_launch([ACCELERATE_FP8], model="meta-llama/Llama-3.2-3B", batch_size=1, seq_len=512)
    assert (info.value.parameter, info.value.value, info.value.allowed) == (
        f"{ACCELERATE_FP8}: fp8_config.backend", "TE", "AO (torchao)")
    assert "TransformerEngine through accelerate" in info.value.detail
    assert "float8='transformer-engine' describes Megatron-Core's layers only" in info.value.detail


def test_llamafactory_fp8_file_answers_as_the_bf16_run_it_is():
    """bf16: true: the Trainer gives the Accelerator bf16, fp8_enabled stays False (the probe
    validation/launch_fp8/lf_fp8_probe.py measured it): the same scenario as the file without its fp8 keys."""
    launch = from_launch([LLAMAFACTORY_FP8], gpus=8, hardware="h100")
    assert launch.scenario.profile_options.get("float8") is None
    notes = [n for r in launch.readings for n in r.notes]
    assert any(n.startswith("fp8=True: no fp8 training:") and "fp8_enabled is False" in n for n in notes)
    plain = LLAMAFACTORY_FP8.with_name("no_fp8.yaml")
    doc = yaml.safe_load(LLAMAFACTORY_FP8.read_text())
    for key in ("fp8", "fp8_backend", "fp8_enable_fsdp_float8_all_gather"):
        doc.pop(key)
    try:
        plain.write_text(yaml.safe_dump(doc))
        other = from_launch([plain], gpus=8, hardware="h100")
    finally:
        plain.unlink()
    assert launch.scenario.solve().total_memory == other.scenario.solve().total_memory


# --- axolotl: mapped to the float8 option --------------------------------------------------------

def test_axolotl_fp8_single_device_is_the_float8_option(tmp_path):
    """fp8: true on one device without FSDP or compile: float8='tensorwise', the same bytes as the option
    given by hand (the regime: bf16, the model's dtype under the autocast)."""
    path = _variant(tmp_path, AXOLOTL_FP8, "single.yaml", drop=("fsdp_version", "fsdp_config", "torch_compile",
                                                                "flex_attn_compile_kwargs",
                                                                "fp8_enable_fsdp_float8_all_gather"),
                    attn_implementation="sdpa")
    launch = from_launch([path], gpus=1, hardware="h100")
    o = launch.scenario.profile_options
    assert o["float8"] == "tensorwise" and o["regime"] == "bf16"
    field = _fields(launch)[("fp8", "float8")]
    assert "AORecipeKwargs" in field.note and "layer 0's q_proj left out changes no term" in field.note
    result = launch.scenario.solve()
    assert any(t.label.startswith("float8 casts") for t in result.terms)
    by_hand = attrs.evolve(launch.scenario, profile_options={**o, "float8": None}).solve()
    assert result.total_memory > by_hand.total_memory     # the casts' excess at the loss (Liger's fused loss)


def test_axolotl_fp8_under_fsdp_names_the_layout(tmp_path):
    path = _variant(tmp_path, AXOLOTL_FP8, "fsdp.yaml", drop=("torch_compile", "flex_attn_compile_kwargs"),
                    fp8_enable_fsdp_float8_all_gather=False, attn_implementation="sdpa")
    with pytest.raises(NotModelledError) as info:
        from_launch([path], gpus=8, hardware="h100").scenario.solve()
    assert (info.value.parameter, info.value.value) == ("float8", "tensorwise")
    assert "a parallel layout (dp 8, dp=fsdp): float8 is validated on one device" in info.value.detail


def test_axolotl_fp8_of_a_mixtral_is_refused_on_the_first_linear(tmp_path):
    path = _variant(tmp_path, AXOLOTL_FP8, "mixtral.yaml", base_model="mistralai/Mixtral-8x7B-v0.1",
                    fp8_enable_fsdp_float8_all_gather=False)
    with pytest.raises(NotModelledError) as info:
        from_launch([path], gpus=8, hardware="h100")
    assert info.value.parameter == f"{path}: fp8"
    assert "keeps the model's first nn.Linear (layer 0's q_proj) in high precision" in info.value.detail
    assert info.value.detail.endswith("(a Mixtral-style layer)")


# --- accelerate: the backends --------------------------------------------------------------------

@pytest.mark.parametrize("backend, allowed, why", [
    (None, "AO (torchao)", "mixed_precision fp8 without a backend"),
    ("MSAMP", "AO (torchao)", "MS-AMP"),
    ("XYZ", "AO, TE or MSAMP", "unknown fp8 backend")])
def test_accelerate_fp8_backends_refused(tmp_path, backend, allowed, why):
    path = _variant(tmp_path, ACCELERATE_FP8, "fp8.yaml", fp8_config={"backend": backend})
    with pytest.raises(NotModelledError) as info:
        from_launch([path], model="meta-llama/Llama-3.2-3B", batch_size=1, seq_len=512)
    assert (info.value.parameter, info.value.value, info.value.allowed) == (f"{path}: fp8_config.backend", backend,
                                                                            allowed)
    assert why in info.value.detail


def test_accelerate_fp8_ao_is_the_float8_option_under_bf16_autocast(tmp_path):
    """AO: float8='tensorwise' (AORecipeKwargs()'s Float8LinearConfig), the precision bf16 (accelerate's
    autocast); the model from -m, the filter checked with it. A script's fp32 model under that autocast is
    what the option refuses, naming why."""
    path = _variant(tmp_path, ACCELERATE_FP8, "ao.yaml", fp8_config={"backend": "AO", "pad_inner_dim": True})
    launch = from_launch([path], model="meta-llama/Llama-3.2-3B", batch_size=1, seq_len=512)
    assert launch.scenario.profile_options["float8"] == "tensorwise" and launch.scenario.precision == "bf16"
    assert "layer 0's q_proj left out changes no term" in _fields(launch)[("fp8_config.backend", "float8")].note
    with pytest.raises(NotModelledError) as info:
        launch.scenario.solve()
    assert "under autocast Float8Linear casts its input" in info.value.detail
    with pytest.raises(NotModelledError) as info:       # a model whose first linear's cast may set a moment
        from_launch([path], model="Qwen/Qwen3-0.6B", batch_size=1, seq_len=512)
    assert "heads x head_dim 2048 != hidden 1024" in info.value.detail


def test_accelerate_fp8_ao_under_fsdp_refuses_its_default_fp8_all_gather(tmp_path):
    fsdp = yaml.safe_load((DATA / "accelerate" / "accelerate" / "fsdp.yaml").read_text())
    fsdp.update(mixed_precision="fp8", fp8_config={"backend": "AO"})
    path = tmp_path / "fsdp_fp8.yaml"
    path.write_text(yaml.safe_dump(fsdp))
    with pytest.raises(NotModelledError) as info:
        from_launch([path], model="meta-llama/Llama-3.2-3B", batch_size=1, seq_len=512)
    assert (info.value.parameter, info.value.value) == (f"{path}: fp8_config.enable_fsdp_float8_all_gather", True)


# --- LLaMA-Factory: when fp8 would run -----------------------------------------------------------

def test_llamafactory_fp8_te_and_without_bf16_are_refused(tmp_path):
    te = _variant(tmp_path, LLAMAFACTORY_FP8, "te.yaml", fp8_backend="te")
    with pytest.raises(NotModelledError) as info:
        from_launch([te], gpus=8)
    assert (info.value.parameter, info.value.value) == (f"{te}: fp8_backend", "te")
    assert "TERecipeKwargs" in info.value.detail
    bare = _variant(tmp_path, LLAMAFACTORY_FP8, "bare.yaml", bf16=False)
    with pytest.raises(NotModelledError) as info:
        from_launch([bare], gpus=8)
    assert (info.value.parameter, info.value.value) == (f"{bare}: fp8", True)
    assert "ACCELERATE_MIXED_PRECISION as the launcher set it" in info.value.detail


# --- the float8 option's declaration of the filters it expresses ---------------------------------

def test_first_linear_left_out_changes_nothing_when_q_proj_is_square():
    """Layer 0's q_proj (h -> heads x head_dim) and o_proj (back) have the same cast bytes when heads x
    head_dim == hidden, so the backward's-end maximum is unchanged without q_proj."""
    T, c = 512 * 2, 2
    for rowwise in (False, True):
        q = float8._backward_cast(float8._Linear("q_proj", 3072, 3072), T, c, rowwise)
        o = float8._backward_cast(float8._Linear("o_proj", 3072, 3072), T, c, rowwise)
        assert q == o
    llama = find_model("meta-llama/Llama-3.2-3B").value
    assert float8.filter_left_out(llama, first_linear=True) is None
    odd = attrs.evolve(llama, ffn_dim=8200)
    assert float8.filter_left_out(odd, first_linear=False) == (
        "ffn 8200 not a multiple of 16: the filter keeps those linears in high precision, the float8 option converts "
        "every decoder linear")


def test_every_fp8_file_answers_or_is_refused_by_name():
    for path, kw in ((AXOLOTL_FP8, {"gpus": 8}), (ACCELERATE_FP8, {"model": "meta-llama/Llama-3.2-3B", "batch_size": 1,
                                                                   "seq_len": 512}), (LLAMAFACTORY_FP8, {"gpus": 8})):
        try:
            from_launch([path], hardware="h100", **kw).scenario.solve()
        except MlsysimError as err:
            assert str(path) in err.parameter and "fp8" in err.parameter


def test_accelerate_filter_measured_the_same_as_every_decoder_linear():
    """validation/techniques/float8 (torchao 0.18.0, CPU): three Llama-style runs with accelerate's default filter
    (layer 0's q_proj and the LM head in high precision; 13, 13, 20 Float8Linears) measure every phase to the byte
    what their all-decoder-linears twins do (14, 14, 21): the square q_proj's casts are o_proj's, as
    float8.filter_left_out declares."""
    import json
    runs = {r["id"]: r for r in json.loads((Path(__file__).resolve().parents[2] / "validation" / "techniques" /
                                            "float8" / "measurements.json").read_text())["runs"]}
    for base in ("llama-a-bf16-tensorwise", "llama-c-bf16-tensorwise", "llama-b-bf16-tensorwise"):
        every, accelerate = runs[base]["measured"], runs[base + "-accelerate"]["measured"]
        assert accelerate["float8_linears"] == every["float8_linears"] - 1
        assert "model.layers.0.self_attn.q_proj" not in accelerate["float8_linears_layer0"]
        assert {p: v["bytes"] for p, v in accelerate["peak_by_phase"].items()} == {
            p: v["bytes"] for p, v in every["peak_by_phase"].items()}
