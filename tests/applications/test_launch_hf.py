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


def test_trl_chunked_nll_under_lora_is_answered():
    """TRL's default chunked NLL under QLoRA (the frozen LM head: validation/trl_loss/measure.py) is answered with its
    own terms; refused before."""
    launch = from_launch([DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_qlora.yaml"], gpus=8)
    assert launch.scenario.profile_options["loss"] == "trl_chunked_nll"
    result = launch.scenario.solve()
    labels = {t.label for t in result.terms}
    assert "chunked nll: one chunk recomputed and its backward (frozen LM head)" in labels
    assert "log-softmax of the logits (fp32)" not in labels and result.total_memory > 0


def test_trl_qlora_storage_under_fsdp(tmp_path):
    """TRL's bnb_4bit_quant_storage (huggingface/trl@f2cd5771 trl/trainer/model_config.py line 168, default None:
    bitsandbytes' uint8): with bfloat16 the 4-bit base is sharded under FSDP with a bf16 policy
    (fsdp-bf16-stored); unset under FSDP it is refused by name (FSDP1 cannot flatten uint8 with bf16 parameters,
    accelerate leaves FSDP2's uint8 Params4bit unsharded); without FSDP the storage changes no byte."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_qlora.yaml").read_text())
    doc["loss_type"] = "nll"     # (TRL's default chunked NLL under LoRA: its own test)
    fsdp = DATA / "accelerate/trl/fsdp1.yaml"
    f = tmp_path / "qlora.yaml"
    f.write_text(yaml.safe_dump({**doc, "bnb_4bit_quant_storage": "bfloat16"}))
    for files in ([f, fsdp], [fsdp, f]):
        assert from_launch(files).scenario.profile_options["regime"] == "fsdp-bf16-stored"
    single = from_launch([f], gpus=1).scenario
    assert single.profile_options["regime"] == "bf16" and single.profile_options["lora"]["quantization"] == "nf4"
    f.write_text(yaml.safe_dump(doc))
    assert from_launch([f], gpus=1).scenario.profile_options["regime"] == "bf16"
    for files in ([f, fsdp], [fsdp, f]):
        with pytest.raises(MlsysimError, match=r"bnb_4bit_quant_storage.*bfloat16 or float16 under FSDP.*uint8"):
            from_launch(files)
    f.write_text(yaml.safe_dump({**doc, "bnb_4bit_quant_storage": "int4"}))
    with pytest.raises(MlsysimError, match="bnb_4bit_quant_storage='int4'.*unknown storage dtype"):
        from_launch([f], gpus=1)


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


def test_fsdp2_shard_grad_op_accumulates_under_set_requires_gradient_sync(tmp_path):
    """FSDP2 SHARD_GRAD_OP (accelerate's fsdp_reshard_after_forward false with fsdp_version 2: whitecircle/halo's
    fsdp2_gradop_config.yaml, verbatim) with gradient accumulation: accelerate 1.16.0's Accelerator.no_sync is
    set_requires_gradient_sync(False) under FSDP2 whatever reshard_after_forward (accelerator.py lines 1126-1131),
    and the Trainer enters it on every micro-batch but the last (transformers 5.23.0 trainer.py lines 1897-1908):
    the fsdp-grad-op rule's gradient_sync='step' (before: dropped, priced as syncing every micro-batch). The
    Trainer file: alignment-handbook's zephyr-7b-beta config_full.yaml with its own bf16 true (accumulation 4).
    halo's accelerate file says mixed_precision "no", but the Trainer's bf16 wins (transformers 5.23.0
    training_args.py lines 1612-1618): accelerate builds FSDP's bf16 MixedPrecision, param_dtype = reduce_dtype = bf16
    (accelerate 1.16.0 utils/dataclasses.py lines 2008-2013) over fp32 shards: the fsdp-bf16-reduce-bf16 regime
    derived from the merged precision (before: fsdp-bf16, approximated, its fp32 reduce pricing the accumulated
    gradients at 4 B: 25.3 GB where the run keeps 10.9 GB). Without mixed precision accelerate neither upcasts
    nor casts: the model's own dtype, bf16 (before: fp32)."""
    import attrs
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    assert doc["bf16"] is True
    doc["gradient_accumulation_steps"] = 4
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    halo = DATA / "accelerate/halo/fsdp2_gradop_config.yaml"
    launch = from_launch([trainer, halo], hardware="h100")
    s = launch.scenario
    assert (s.data_parallel, s.plugin_options, s.gradient_accumulation_steps, s.precision, s.regime) == (
        "fsdp-grad-op", {"fsdp-grad-op": {"gradient_sync": "step"}}, 4, "bf16", "fsdp-bf16-reduce-bf16")
    [default] = [d for r in launch.readings for d in r.defaults if d.field == "plugin_options"]
    assert "set_requires_gradient_sync(False)" in default.source and "sync_each_batch" in default.source
    [field] = [f for f in launch.readings[1].fields if f.field == "regime"]
    assert (field.key, field.value, field.becomes, field.approximated) == ("mixed_precision", "no", "fsdp-bf16-reduce-bf16",
                                                                                   False)
    assert launch.sources["regime"] == f"{halo}: mixed_precision (derived from precision='bf16' from {trainer}: bf16)"
    assert launch.sources["precision"] == f"{trainer}: bf16"
    result = s.solve()
    terms = {t.label: t.nbytes for t in result.terms}
    # Mistral 7B (h 4096, 32 layers, 8 KV heads of 128, MLP 14336, vocab 32000, untied)
    params = 32 * (4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) + 2 * 32000 * 4096 + 4096
    assert params == 7_241_732_096
    # accelerate upcasts the bf16-loaded parameters to fp32 (fsdp_utils.py line 801): the rank's 1/8 shard of fp32
    # parameters and of AdamW's two fp32 states
    assert terms["parameters (fsdp-bf16-reduce-bf16, 4 B)"] == params / 8 * 4
    assert terms["adamw state (2 x 32-bit)"] == params / 8 * 2 * 4
    # every parameter's unsharded gradient, in the policy's reduce dtype (bf16, 2 B), less the rank's 1/8 fp32 shard
    [term] = [t for t in result.terms if "accumulated over micro-batches" in t.label]
    assert term.nbytes == params * 2 - params / 8 * 4 == 10_862_598_144
    synced = attrs.evolve(s, plugin_options={}).solve()      # priced as syncing every micro-batch
    assert result.total_memory - synced.total_memory >= term.nbytes * 0.9
    # halo's file alone says no mixed precision: no policy, no upcast (accelerator.py line 1970, fsdp_utils.py line
    # 801): the Trainer's regime, the model's own dtype (zephyr's torch_dtype bfloat16): pure bf16
    doc["bf16"] = False
    trainer.write_text(yaml.safe_dump(doc))
    launch = from_launch([trainer, halo], hardware="h100")
    assert launch.scenario.regime == "bf16" and "precision" not in launch.sources
    [field] = [f for f in launch.readings[1].fields if f.field == "regime"]
    assert field.becomes is None


def test_accelerate_mixed_precision_when_the_trainer_bf16_is_off(tmp_path):
    """The reverse: the accelerate config says bf16, the Trainer's bf16 false: transformers keeps accelerate's
    mixed precision (training_args.py lines 1612-1618: bf16/fp16 false leave ACCELERATE_MIXED_PRECISION). FSDP
    (halo's file with mixed_precision bf16): fsdp-bf16-reduce-bf16, precision bf16 from the accelerate file. DDP (TRL's
    multi_gpu.yaml, bf16) with the model loaded in fp32: autocast bf16 over fp32 weights, amp-bf16, the Trainer's
    regime derived from the merged precision (before: regime fp32 and precision bf16, refused)."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["bf16"] = False
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    halo = yaml.safe_load((DATA / "accelerate/halo/fsdp2_gradop_config.yaml").read_text())
    halo["mixed_precision"] = "bf16"
    config = tmp_path / "fsdp2_gradop_config.yaml"
    config.write_text(yaml.safe_dump(halo))
    launch = from_launch([trainer, config], hardware="h100")
    assert (launch.scenario.regime, launch.scenario.precision) == ("fsdp-bf16-reduce-bf16", "bf16")
    assert launch.sources["precision"] == f"{config}: mixed_precision"
    doc["torch_dtype"], doc["loss_type"] = "float32", "nll"     # (TRL's chunked loss under autocast: not modelled)
    trainer.write_text(yaml.safe_dump(doc))
    ddp = DATA / "accelerate/trl/multi_gpu.yaml"
    launch = from_launch([trainer, ddp], hardware="h100")
    s = launch.scenario
    assert (s.regime, s.precision, s.data_parallel, s.dp_size) == ("amp-bf16", "bf16", None, 8)     # DDP
    assert launch.sources["regime"].endswith(f"(derived from precision='bf16' from {ddp}: mixed_precision)")
    terms = {t.label: t.nbytes for t in s.solve().terms}
    params = 7_241_732_096      # Mistral 7B (the test above): fp32 weights and AdamW states, unsharded under DDP
    assert terms["parameters (amp-bf16, 4 B)"] == params * 4
    assert terms["adamw state (2 x 32-bit)"] == params * 2 * 4


def test_trainer_fp16_wins_over_accelerate_bf16(tmp_path):
    """The Trainer's fp16 true over accelerate's mixed_precision bf16 (training_args.py lines 1615-1616): fp16,
    the accelerate file's precision yields (said in the notes); under DDP (TRL's multi_gpu.yaml) with the model in
    fp32, autocast fp16: amp-fp16."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["bf16"], doc["fp16"], doc["torch_dtype"], doc["loss_type"] = False, True, "float32", "nll"
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    ddp = DATA / "accelerate/trl/multi_gpu.yaml"
    launch = from_launch([trainer, ddp], hardware="h100")
    assert (launch.scenario.precision, launch.scenario.regime) == ("fp16", "amp-fp16")
    assert f"precision: {ddp}'s mixed_precision='bf16' yields to {trainer}'s fp16='fp16'" in launch.notes
    launch = from_launch([ddp, trainer], hardware="h100")      # either order
    assert (launch.scenario.precision, launch.scenario.regime) == ("fp16", "amp-fp16")


def test_deepspeed_plugin_takes_the_trainer_bf16(tmp_path):
    """accelerate's DeepSpeed plugin (TRL's zero3.yaml) with mixed_precision "no" and the Trainer's bf16 true:
    transformers builds DeepSpeedPlugin() and sets its bf16 from the Trainer's mixed precision (training_args.py
    lines 1714-1720, DeepSpeedPlugin.set_mixed_precision): DeepSpeed's 16-bit engine, mixed-bf16 (before: the
    Trainer's regime bf16, as if no engine recast the model). Bf16 off: accelerate's plugin sets no regime (the
    Trainer's stands). A deepspeed_config_file's "auto" bf16 (accelerate's deepspeed.yaml + a JSON with "auto")
    is filled from the merged precision alike."""
    import json
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    zero3 = yaml.safe_load((DATA / "accelerate/trl/zero3.yaml").read_text())
    zero3["mixed_precision"] = "no"
    config = tmp_path / "zero3.yaml"
    config.write_text(yaml.safe_dump(zero3))
    launch = from_launch([trainer, config], hardware="h100")
    s = launch.scenario
    assert (s.regime, s.precision, s.zero_stage) == ("mixed-bf16", "bf16", 3)
    assert launch.sources["regime"] == f"{config}: mixed_precision (derived from precision='bf16' from {trainer}: bf16)"
    terms = {t.label: t.nbytes for t in s.solve().terms}
    params = 7_241_732_096     # ZeRO-3 over 8: bf16 parameters, fp32 master, two fp32 states, each the rank's 1/8
    assert terms["parameters (mixed-bf16, 2 B)"] == params / 8 * 2
    doc["bf16"] = False
    trainer.write_text(yaml.safe_dump(doc))
    launch = from_launch([trainer, config], hardware="h100")
    assert launch.scenario.regime == "bf16"    # the Trainer's: the model loaded in bf16 (torch_dtype), no 16-bit engine
    [field] = [f for f in launch.readings[1].fields if f.field == "regime"]
    assert (field.becomes, field.note) == (None, "sets no regime (no 16-bit mixed precision in the run) (derived from "
                                           "precision: none given)")
    ds = json.loads((DATA / "accelerate/deepspeed_config_templates/zero_stage2_config.json").read_text())
    ds.pop("fp16", None)
    ds["bf16"] = {"enabled": "auto"}
    (tmp_path / "ds.json").write_text(json.dumps(ds))
    config.write_text(yaml.safe_dump({"distributed_type": "DEEPSPEED", "mixed_precision": "no", "num_processes": 8,
                                      "deepspeed_config": {"deepspeed_config_file": str(tmp_path / "ds.json")}}))
    assert from_launch([trainer, config], hardware="h100").scenario.regime == "fp32"     # auto, both off
    doc["bf16"] = True
    trainer.write_text(yaml.safe_dump(doc))
    assert from_launch([trainer, config], hardware="h100").scenario.regime == "mixed-bf16"


def test_trainer_shard_grad_op_with_fsdp2_accumulates_under_set_requires_gradient_sync(tmp_path):
    """TrainingArguments fsdp: shard_grad_op with fsdp_config fsdp_version 2 (transformers 5.23.0 training_args.py
    lines 2920-2925: reshard_after_forward False): the same option; under FSDP1 (fsdp_version 1) the no_sync one."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["gradient_accumulation_steps"] = 4
    doc["fsdp"], doc["fsdp_config"] = "shard_grad_op auto_wrap", {"fsdp_version": 2}
    path = tmp_path / "config_full.yaml"
    path.write_text(yaml.safe_dump(doc))
    s = from_launch([path], gpus=8, hardware="h100").scenario
    assert (s.data_parallel, s.plugin_options) == ("fsdp-grad-op", {"fsdp-grad-op": {"gradient_sync": "step"}})
    doc["fsdp_config"] = {"fsdp_version": 1}
    path.write_text(yaml.safe_dump(doc))
    s = from_launch([path], gpus=8, hardware="h100").scenario
    assert (s.data_parallel, s.plugin_options) == ("fsdp-grad-op", {"fsdp-grad-op": {"gradient_sync": "no_sync", "fsdp_version": 1}})


def test_trainer_fsdp_argument_takes_accelerate_mixed_precision(tmp_path):
    """The Trainer's own `fsdp: full_shard auto_wrap` with bf16 false, launched with TRL's multi_gpu.yaml
    (mixed_precision bf16): the Accelerator gets bf16 (training_args.py lines 1612-1618) and sets the FSDP plugin's
    MixedPrecision from it (accelerate 1.16.0 state.py lines 975-976): fsdp-bf16-reduce-bf16, derived (before: the Trainer's
    pure bf16, as if FSDP kept the bf16-loaded weights). Alone, bf16 false: no mixed precision, the model's dtype."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["bf16"], doc["fsdp"] = False, "full_shard auto_wrap"
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    ddp = DATA / "accelerate/trl/multi_gpu.yaml"
    launch = from_launch([trainer, ddp], hardware="h100")
    assert (launch.scenario.regime, launch.scenario.data_parallel) == ("fsdp-bf16-reduce-bf16", "fsdp")
    assert launch.sources["regime"] == (f"{trainer}: bf16 + torch_dtype/fsdp (derived from precision='bf16' from "
                                        f"{ddp}: mixed_precision)")     # (the file's two regime keys, fsdp's last)
    assert from_launch([trainer], gpus=8, hardware="h100").scenario.regime == "bf16"


def test_fp16_under_fsdp_is_the_fp16_policy_with_bf16s_bytes(tmp_path):
    """An fp16 run under FSDP (V100/T4/A10): alignment-handbook's accelerate FSDP file with mixed_precision fp16
    and the zephyr Trainer file with fp16 true (before: refused, "precision='fp16' is not allowed: bf16 with regime
    'fsdp-bf16-reduce-bf16'"). accelerate 1.16.0 set_mixed_precision("fp16") gives param_dtype = reduce_dtype = fp16
    (utils/dataclasses.py lines 2008-2013) over fp32 shards, with its loss scaler (accelerator.py lines 536-555:
    ShardedGradScaler under FSDP1): fsdp-fp16-reduce-fp16, derived, not approximated; every byte the bf16 run's
    (the scaler's scalars unpriced: validation/fsdp_no_sync). FSDP2 (TRL's fsdp2.yaml) and the Trainer's own
    ``fsdp:`` argument choose it too."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["bf16"], doc["fp16"] = False, True
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    acc = yaml.safe_load((DATA / "accelerate/alignment-handbook/fsdp.yaml").read_text())
    acc["mixed_precision"] = "fp16"
    config = tmp_path / "fsdp.yaml"
    config.write_text(yaml.safe_dump(acc))
    launch = from_launch([trainer, config], hardware="v100")
    s = launch.scenario
    assert (s.regime, s.precision, s.data_parallel, s.dp_size) == ("fsdp-fp16-reduce-fp16", "fp16", "fsdp", 8)
    [field] = [f for f in launch.readings[1].fields if f.field == "regime"]
    assert (field.key, field.becomes, field.approximated) == ("mixed_precision", "fsdp-fp16-reduce-fp16", False)
    assert "ShardedGradScaler" in field.note
    result = s.solve()
    terms = {t.label: t.nbytes for t in result.terms}
    params = 7_241_732_096      # Mistral 7B (test_trainer_gradient_accumulation_under_fsdp2_grad_op)
    assert terms["parameters (fsdp-fp16-reduce-fp16, 4 B)"] == params / 8 * 4     # the fp32 shard
    assert terms["adamw state (2 x 32-bit)"] == params / 8 * 2 * 4
    # the same run in bf16: every term's bytes the same
    doc["bf16"], doc["fp16"] = True, False
    trainer.write_text(yaml.safe_dump(doc))
    acc["mixed_precision"] = "bf16"
    config.write_text(yaml.safe_dump(acc))
    bf16 = from_launch([trainer, config], hardware="v100").scenario
    assert bf16.regime == "fsdp-bf16-reduce-bf16"
    other = bf16.solve()
    assert [t.nbytes for t in result.terms] == [t.nbytes for t in other.terms]
    assert result.total_memory == other.total_memory
    # FSDP2 (TRL's fsdp2.yaml, mixed_precision bf16 yields to the Trainer's fp16 true) and the Trainer's fsdp:
    doc["bf16"], doc["fp16"] = False, True
    trainer.write_text(yaml.safe_dump(doc))
    two = from_launch([trainer, DATA / "accelerate/trl/fsdp2.yaml"], hardware="v100").scenario
    assert (two.regime, two.precision, two.plugin_options) == ("fsdp-fp16-reduce-fp16", "fp16",
                                                               {"fsdp": {"gradient_sync": "step"}})
    doc["fsdp"] = "full_shard auto_wrap"
    trainer.write_text(yaml.safe_dump(doc))
    alone = from_launch([trainer], gpus=8, hardware="v100").scenario
    assert (alone.regime, alone.precision, alone.data_parallel) == ("fsdp-fp16-reduce-fp16", "fp16", "fsdp")


def test_fp16_under_fsdp2_accumulates_in_fp16(tmp_path):
    """FSDP2's unsynced accumulation keeps the unsharded gradients in reduce_dtype: fp16, 2 B, as bf16's (Mistral
    7B on 8 ranks, 4 micro-batches): every parameter x 2 B, less the rank's fp32 shard."""
    import yaml
    doc = yaml.safe_load((DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["bf16"], doc["fp16"], doc["gradient_accumulation_steps"] = False, True, 4
    trainer = tmp_path / "config_full.yaml"
    trainer.write_text(yaml.safe_dump(doc))
    result = from_launch([trainer, DATA / "accelerate/trl/fsdp2.yaml"], hardware="v100").scenario.solve()
    [term] = [t for t in result.terms if "accumulated over micro-batches" in t.label]
    params = 7_241_732_096
    assert term.nbytes == params * 2 - params / 8 * 4
