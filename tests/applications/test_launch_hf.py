"""The Hugging Face ecosystem's launch readers (hf_trainer, accelerate, deepspeed): every real
file under tests/data/launch read end to end (an answer or a refusal naming the field, never a
traceback), hand-derived checks of what fields became, and the CLI once."""

from pathlib import Path

import pytest

from mlsysim_core.errors import MlsysimError, PluginContractError
from mlsysim_core.manager import get_plugin_manager
from mlsysim_core.scenario import LaunchContext, LaunchReading, from_launch, launch_format_for, parse_launch_file

DATA = Path(__file__).resolve().parents[1] / "data" / "launch"
OURS = {"hf-trainer", "accelerate", "deepspeed"}
FILES = sorted(p for d in ("hf_trainer", "accelerate", "deepspeed", "llamafactory/examples/deepspeed",
                           "axolotl/deepspeed_configs")
               for p in (DATA / d).rglob("*") if p.suffix in (".yaml", ".yml", ".json"))


def test_enough_files():
    assert len(FILES) >= 40


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_file_read_or_refused_naming_the_field(path):
    registry = get_plugin_manager().registry
    document = parse_launch_file(path)
    spec = launch_format_for(path, document, registry)
    assert spec.name in OURS
    try:
        reading = spec.read(path, document, LaunchContext(registry=registry))
    except PluginContractError:     # a reader's bug: never
        raise
    except MlsysimError as err:     # a refusal names the file and the key
        assert str(path) in err.parameter
        return
    assert isinstance(reading, LaunchReading)
    keys = {f.key.split("[")[0] for f in reading.fields} | set(reading.ignored)
    assert keys or reading.notes or reading.defaults


def _read(name, doc, registry=None):
    from mlsysim_plugins.launch import _hf
    r = _hf.Reading("deepspeed", DATA / name, _hf.DEEPSPEED, LaunchContext(registry=registry))
    _hf.deepspeed(r, "", doc, trainer={"mixed": "bf16"}, model="llama3-8b")
    return r.done()


def test_auto_buckets_resolved_from_the_hidden_size():
    """transformers' integration: reduce_bucket_size = h², stage3_prefetch_bucket_size = int(0.9 h²),
    stage3_param_persistence_threshold = 10 h; Llama-3.1-8B has h = 4096."""
    doc = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                                 "stage3_param_persistence_threshold": "auto"}, "bf16": {"enabled": "auto"}}
    text = " ".join(f.note for f in _read("x.json", doc).fields)
    assert f"{4096 * 4096:,}" in text and f"{int(0.9 * 4096 * 4096):,}" in text and f"{10 * 4096:,}" in text
    values = _read("x.json", doc).values()
    assert values["zero_stage"] == 3 and values["regime"] == "mixed-bf16"


def test_unknown_keys_are_refused_never_dropped():
    with pytest.raises(MlsysimError, match="frobnicate"):
        _read("x.json", {"zero_optimization": {"stage": 2}, "frobnicate": 1})
    with pytest.raises(MlsysimError, match="zero_optimization.frobnicate"):
        _read("x.json", {"zero_optimization": {"stage": 2, "frobnicate": 1}})


def test_offload_and_optimizers():
    values = _read("x.json", {"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}}).values()
    assert values["offload"] == "optimizer+gradients"
    from mlsysim_plugins.launch import _hf
    names = set(_hf.OPTIMIZERS)
    assert {"adamw_torch_fused", "adamw_torch", "paged_adamw_8bit", "galore_adamw"} <= names
    r = _hf.Reading("hf-trainer", DATA / "x.yaml", _hf.TRANSFORMERS)
    with pytest.raises(MlsysimError, match="galore_adamw"):
        _hf.optimizer(r, "optim", "galore_adamw")


def test_transformers_optimizer_names_all_classified():
    """Every value of transformers 5.23.0's OptimizerNames, when its source is at hand."""
    import ast
    import glob
    found = glob.glob("/tmp/tfvenv/lib/python3*/site-packages/transformers/training_args.py")
    if not found:
        pytest.skip("transformers' source not installed here")
    tree = ast.parse(Path(found[0]).read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "OptimizerNames")
    values = {s.value.value for s in cls.body if isinstance(s, ast.Assign) and isinstance(s.value, ast.Constant)}
    from mlsysim_plugins.launch import _hf
    assert values == set(_hf.OPTIMIZERS)


def test_trainer_with_deepspeed_end_to_end():
    launch = from_launch([DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml",
                          DATA / "accelerate/alignment-handbook/zero3.yaml"], hardware="h100")
    s = launch.scenario
    assert (s.model, s.zero_stage, s.dp_size, s.batch_size, s.seq_len) == ("mistralai/mistral-7b-v0.1", 3, 8, 128, 2048)
    assert s.profile_options["regime"] == "mixed-bf16"     # DeepSpeed's engine beats the trainer's default
    assert s.activation_checkpointing == "full"
    import attrs
    result = attrs.evolve(s, profile="measured").solve()
    assert result.total_memory > 0


@pytest.mark.long     # (a subprocess check)
def test_cli(run_cli=None):
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--from",
                          str(DATA / "hf_trainer/trl/example_config.yaml"), "--from",
                          str(DATA / "accelerate/trl/fsdp2.yaml"), "-g", "h100"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "fsdp_config.fsdp_reshard_after_forward" in out.stdout and "adamw_torch_fused" in out.stdout


def _trl(tmp_path, **extra):
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc.update(extra)
    f = tmp_path / "sft.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def _loss_of(launch):
    fields = [f for r in launch.readings for f in r.fields if f.field == "loss"]
    defaults = [d for r in launch.readings for d in r.defaults if d.field == "loss"]
    return launch.scenario.profile_options.get("loss"), fields, defaults


def test_trl_and_liger_losses(tmp_path):
    # TRL 1.9's SFTConfig: loss_type unset -> chunked_nll (trl_chunked_nll, an implicit default) unless
    # use_liger_kernel; use_liger_kernel -> fused_linear (Liger's fused linear cross-entropy, read);
    # loss_type nll -> cross_entropy; chunked_nll -> trl_chunked_nll; dft and chunked_nll + Liger refused by name.
    loss, fields, defaults = _loss_of(from_launch([_trl(tmp_path)], gpus=8))
    assert loss == "trl_chunked_nll" and not fields and defaults[0].key == "loss_type"
    loss, fields, _ = _loss_of(from_launch([_trl(tmp_path, loss_type="chunked_nll")], gpus=8))
    assert loss == "trl_chunked_nll" and fields[0].key == "loss_type" and not fields[0].approximated
    loss, fields, _ = _loss_of(from_launch([_trl(tmp_path, loss_type="nll")], gpus=8))
    assert loss == "cross_entropy" and fields[0].key == "loss_type"
    loss, fields, defaults = _loss_of(from_launch([_trl(tmp_path, use_liger_kernel=True)], gpus=8))
    assert loss == "fused_linear" and fields[0].key == "use_liger_kernel" and not fields[0].approximated
    assert not defaults
    for extra in ({"loss_type": "dft"}, {"loss_type": "chunked_nll", "use_liger_kernel": True}):
        with pytest.raises(MlsysimError, match="loss_type"):
            from_launch([_trl(tmp_path, **extra)], gpus=8)
    assert from_launch([_trl(tmp_path)], gpus=8).scenario.solve().total_memory > 0


def test_trl_chunked_nll_under_lora_is_refused_naming_loss_type():
    launch = from_launch([DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_qlora.yaml"], gpus=8)
    assert launch.scenario.profile_options["loss"] == "trl_chunked_nll"
    with pytest.raises(MlsysimError, match="trl_chunked_nll.*LoRA"):
        launch.scenario.solve()


def test_flex_attention_on_a_model_with_sinks_is_the_declared_kernel(tmp_path):
    """attn_implementation flex_attention (alignment-handbook's smollm3 sft.yaml with that one edit): on a model whose
    config declares attention sinks (gpt-oss: the catalog's attention_sinks, from config.json) transformers runs
    flex_attention_forward with s_aux, what the kernel declaring computes='flex', sinks='lse' was measured on: that
    kernel, by declaration, not approximated; on a model without sinks it stays priced as sdpa (approximated); with
    no such kernel registered, as before."""
    import attrs
    import yaml
    document = yaml.safe_load((DATA / "hf_trainer" / "alignment-handbook" / "smollm3" / "sft" / "sft.yaml").read_text())
    document["attn_implementation"] = "flex_attention"
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump(document))

    def attention(**kwargs):
        launch = from_launch([path], gpus=8, hardware="h100", **kwargs)
        (field,) = [f for r in launch.readings for f in r.fields if f.field == "attention"]
        return field.becomes, field.approximated

    assert attention(model="openai/gpt-oss-20b") == ("flex_attention", False)
    assert attention(model="meta-llama/Llama-3.2-3B") == ("sdpa", True)
    registry = get_plugin_manager().registry
    hook = "mlsysim_measured_attention_kernels"
    kernels = registry.extensions[hook]
    renamed = attrs.evolve(registry, extensions={**registry.extensions, hook: {
        "sdpa": kernels["sdpa"], "sink-fused": attrs.evolve(kernels["flex_attention"], name="sink-fused")}})
    assert attention(model="openai/gpt-oss-20b", registry=renamed) == ("sink-fused", False)
    none = attrs.evolve(registry, extensions={**registry.extensions, hook: {"sdpa": kernels["sdpa"]}})
    assert attention(model="openai/gpt-oss-20b", registry=none) == ("sdpa", True)
