"""The LLaMA-Factory launch reader (plugins/mlsysim_plugins/launch/llamafactory.py): every copied
recipe read end to end (an answer or a refusal naming the field, never a traceback), every key
of each file accounted for, hand-derived checks of what the fields became, the trainer's
precision yielding to an accelerate FSDP file, and the CLI."""

import subprocess
import sys
from pathlib import Path

import pytest

from mlsysim_core.errors import MlsysimError, PluginContractError
from mlsysim_core.manager import get_plugin_manager
from mlsysim_core.scenario import LaunchContext, from_launch, launch_format_for, launch_formats, parse_launch_file

DATA = Path(__file__).resolve().parents[1] / "data" / "launch"
LF = DATA / "llamafactory" / "examples"
FILES = sorted(p for p in LF.rglob("*.yaml"))
# file -> the field its refusal names
REFUSED = {"extras/adam_mini/qwen2_full_sft.yaml": "use_adam_mini", "extras/badam/llama3_full_sft.yaml": "use_badam",
           "extras/galore/llama3_full_sft.yaml": "use_galore",     # (extras/fp8: answered, fp8 does not run with bf16)
           "extras/llama_pro/llama3_freeze_sft.yaml": "use_llama_pro",     # (extras/muon: read since
           # Qwen2-1.5B-Instruct is in the catalog, issue 26; its Muon on a Qwen2 is refused when solved)
           "train_lora/qwen3_lora_dpo.yaml": "stage", "train_lora/qwen3_lora_reward.yaml": "stage",
           "train_qlora/llama3_lora_sft_gptq.yaml": "model_name_or_path"}


def accounted(reading, document):
    """The top-level keys the reading mentions: read, approximated, ignored or said in a note."""
    import re
    keys = set()
    for f in reading.fields:
        keys.update(re.split(r"[.\[ /]", f.key)[:1])
    keys.update(reading.ignored)
    keys.update(n.split("=")[0] for n in reading.notes)
    keys.update(d.key for d in reading.defaults)
    return keys


def test_enough_files():
    assert len(FILES) >= 15


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(LF)))
def test_every_file_read_or_refused_naming_the_field(path):
    registry = get_plugin_manager().registry
    document = parse_launch_file(path)
    assert launch_format_for(path, document, registry).name == "llamafactory"
    spec = launch_formats(registry)["llamafactory"]
    name = str(path.relative_to(LF))
    try:
        reading = spec.read(path, document, LaunchContext(registry=registry))
    except PluginContractError:
        raise
    except MlsysimError as err:
        assert name in REFUSED, f"unexpected refusal: {err}"
        assert str(path) in err.parameter and err.parameter.endswith(REFUSED[name]), err.parameter
        return
    assert name not in REFUSED
    missing = set(document) - accounted(reading, document)
    assert not missing, f"keys not accounted for: {missing}"
    launch = from_launch([path], gpus=2, hardware="h100")     # the merge takes it too
    assert launch.scenario.model


def test_lora_sft_fields_and_defaults():
    launch = from_launch([LF / "train_lora/qwen3_lora_sft.yaml"], gpus=2, hardware="h100")
    s = launch.scenario
    # micro-batch 1 x dp 2 x accumulation 8; cutoff_len 2048, not packed (sft): the maximum
    assert (s.model, s.batch_size, s.gradient_accumulation_steps, s.seq_len) == ("qwen/qwen3-4b", 16, 8, 2048)
    o = s.profile_options
    assert o["lora"] == {"rank": 8, "target_modules": "all-linear"}
    assert o["regime"] == "bf16" and o["attention"] == "sdpa" and o["optimizer_impl"] == "fused"
    assert s.activation_checkpointing == "full" and s.optimizer == "adamw"     # LLaMA-Factory's default checkpointing
    defaults = {d.key: d for r in launch.readings for d in r.defaults}
    assert "checkpointing.py:184" in defaults["disable_gradient_checkpointing"].source
    assert defaults["disable_gradient_checkpointing"].version == "LLaMA-Factory 0.9.6.dev0"
    assert "Qwen3-4B-Instruct-2507" in launch.readings[0].fields[0].note     # the variant said


def test_pretraining_packs_cutoff_len_minus_one():
    s = from_launch([LF / "train_lora/qwen3_lora_pretrain.yaml"], gpus=1, hardware="h100").scenario
    assert s.seq_len == 2047       # stage pt packs (parser.py:645); a packed row is cutoff_len - 1 (data_args.py:189)


def test_qlora_is_nf4_with_double_quantization():
    s = from_launch([LF / "train_qlora/qwen3_lora_sft_otfq.yaml"], gpus=1, hardware="h100").scenario
    assert s.profile_options["lora"] == {"rank": 8, "target_modules": "all-linear", "quantization": "nf4",
                                         "double_quant": True}


def test_full_with_zero3_takes_deepspeeds_engine():
    launch = from_launch([LF / "train_full/qwen3_full_sft.yaml"], gpus=4, hardware="h100")
    s = launch.scenario
    assert s.zero_stage == 3 and s.profile_options["regime"] == "mixed-bf16"
    assert s.batch_size == 1 * 4 * 2
    assert "lora" not in s.profile_options
    result = s.solve()
    assert result.total_memory > 0


def test_trainer_precision_yields_to_an_fsdp_file():
    """LLaMA-Factory's bf16 regime is read from the file, but the accelerate FSDP config recasts
    the model: its regime wins without a contradiction, and the merge says so. The run is QLoRA (quantization_bit
    4, stored in the compute dtype: quantization.py line 189): the FSDP regime is fsdp-bf16-stored."""
    launch = from_launch([LF / "extras/fsdp_qlora/llama3_lora_sft.yaml",
                          DATA / "accelerate/llamafactory/fsdp_config.yaml"], hardware="h100")
    assert launch.scenario.profile_options["regime"] == "fsdp-bf16-stored"
    assert any("yields to" in n and "fsdp_config" in n for n in launch.notes)
    field = next(f for f in launch.readings[0].fields if f.field == "regime")
    assert field.yields and field.to_dict()["yields"] is True
    # alone, the file's own regime is taken (it beats mlsysim's default)
    alone = from_launch([LF / "extras/fsdp_qlora/llama3_lora_sft.yaml"], gpus=1, hardware="h100")
    assert alone.scenario.profile_options["regime"] == "bf16"


def test_full_bf16_upcasts_and_pure_bf16_does_not(tmp_path):
    """model/adapter.py:337-349: trainable parameters upcast to fp32 under bf16 (amp-bf16), kept in
    bf16 with pure_bf16."""
    base = "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfinetuning_type: full\ncutoff_len: 512\n"
    for extra, regime in (("bf16: true\n", "amp-bf16"), ("pure_bf16: true\n", "bf16"), ("", "fp32")):
        f = tmp_path / "r.yaml"
        f.write_text(base + extra)
        assert from_launch([f], gpus=1, hardware="h100").scenario.profile_options["regime"] == regime


def test_unknown_key_refused_never_dropped(tmp_path):
    f = tmp_path / "r.yaml"
    f.write_text("model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\nfrobnicate: 3\n")
    with pytest.raises(MlsysimError, match="frobnicate"):
        from_launch([f], gpus=1, hardware="h100")


def test_model_flag_replaces_an_unresolved_model():
    launch = from_launch([LF / "extras/muon/qwen2_full_sft.yaml"], gpus=1, hardware="h100", model="qwen/qwen2.5-1.5b")
    assert launch.scenario.model == "qwen/qwen2.5-1.5b" and launch.scenario.optimizer == "muon"


@pytest.mark.long     # (a subprocess check)
def test_cli():
    out = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--from",
                          str(LF / "extras/fsdp_qlora/llama3_lora_sft.yaml"), "--gpus", "1", "-g", "h100"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "quantization_bit = 4" in out.stdout and "checkpointing.py:184" in out.stdout
    refused = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--from",
                              str(LF / "train_lora/qwen3_lora_dpo.yaml"), "--gpus", "2", "-g", "h100"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "stage='dpo'" in refused.stderr and "Traceback" not in refused.stderr


@pytest.mark.long     # (a subprocess check)
def test_validation_table_in_the_docs_is_the_tools_output():
    """docs/launch-hf.md's validation table is what tools/launch_validation_hf.py prints."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "tools" / "launch_validation_hf.py"), "--check"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def test_yields_in_either_order_and_two_yielding_values_contradict(tmp_path):
    files = [LF / "extras/fsdp_qlora/llama3_lora_sft.yaml", DATA / "accelerate/llamafactory/fsdp_config.yaml"]
    for order in (files, files[::-1]):
        launch = from_launch(order, hardware="h100")
        assert launch.scenario.profile_options["regime"] == "fsdp-bf16-stored"
        assert sum("yields to" in n for n in launch.notes) == 1
    other = tmp_path / "ax.yml"     # axolotl's regime also yields: two yielding values that differ contradict
    other.write_text("base_model: meta-llama/Meta-Llama-3-8B\nbf16: false\n")     # fp32, yielding
    with pytest.raises(MlsysimError, match="regime.*contradict"):
        from_launch([LF / "extras/fsdp_qlora/llama3_lora_sft.yaml", other], gpus=1, hardware="h100")


def test_framework_version_other_than_the_readers_is_said():
    launch = from_launch([LF / "train_lora/qwen3_lora_sft.yaml"], gpus=1, hardware="h100", framework_version="0.8.3")
    assert any("--framework-version 0.8.3" in n for n in launch.readings[0].notes)


def test_trainer_arguments_regime_yields_to_deepspeed():
    """The Trainer's bf16 + torch_dtype is read (not a default) and gives way to the accelerate
    file's DeepSpeed engine."""
    launch = from_launch([DATA / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml",
                          DATA / "accelerate/alignment-handbook/zero3.yaml"], hardware="h100")
    assert launch.scenario.profile_options["regime"] == "mixed-bf16"
    read = next(f for f in launch.readings[0].fields if f.field == "regime")
    assert read.yields and read.becomes == "bf16" and "torch_dtype" in read.key
    assert any("yields to" in n and "zero3.yaml" in n for n in launch.notes)


def test_enable_liger_kernel_is_the_fused_linear_loss(tmp_path):
    # enable_liger_kernel: true -> --loss fused_linear (LLaMA-Factory keeps Liger's fused linear cross-entropy for
    # the sft and pt stages: liger_kernel.py, require_logits=False)
    import yaml
    doc = yaml.safe_load((LF / "train_full" / "qwen3_full_sft.yaml").read_text())
    doc["enable_liger_kernel"] = True
    doc.pop("deepspeed", None)
    f = tmp_path / "liger.yaml"
    f.write_text(yaml.safe_dump(doc))
    launch = from_launch([f], gpus=1, hardware="h100")
    field = next(f for r in launch.readings for f in r.fields if f.field == "loss")
    assert (field.key, field.becomes, field.approximated) == ("enable_liger_kernel", "fused_linear", False)
    assert launch.scenario.solve().total_memory > 0


def test_qlora_under_accelerate_fsdp_stores_the_base_in_bf16(tmp_path):
    """QLoRA (quantization_bit 4) with accelerate's FSDP config: LLaMA-Factory stores the 4-bit codes in the compute
    dtype (ff6d4d12 src/llamafactory/model/model_utils/quantization.py line 189) and transformers sets FSDP's policy
    to it (update_fsdp_plugin_peft): fsdp-bf16-stored, whatever the file order. The same run without
    quantization_bit (LoRA over a bf16 base) keeps accelerate's fsdp-bf16-reduce-bf16. Bytes: the frozen embedding,
    norms and LM head at 2 B (not 4 B) per rank, the adapters fp32 either way."""
    accel = DATA / "accelerate/llamafactory/fsdp_config.yaml"
    qlora = LF / "extras/fsdp_qlora/llama3_lora_sft.yaml"
    lora = tmp_path / "lora.yaml"
    lora.write_text(qlora.read_text().replace("quantization_bit: 4\n", ""))
    for files in ([qlora, accel], [accel, qlora]):
        launch = from_launch(files, hardware="h100")
        field = next(f for r in launch.readings for f in r.fields if (f.key, f.field) == ("mixed_precision", "regime"))
        assert field.becomes == "fsdp-bf16-stored" and "update_fsdp_plugin_peft" in field.note
        assert "lora=" in field.note and "quantization_bit" in field.note     # (derived from the merged lora)
    plain = from_launch([lora, accel], hardware="h100").scenario
    assert plain.profile_options["regime"] == "fsdp-bf16-reduce-bf16"
    s = from_launch([qlora, accel], hardware="h100").scenario
    terms = {t.label: t.nbytes for t in s.solve().terms}
    V, h, L = 128256, 4096, 32     # Meta-Llama-3-8B: untied embedding and LM head, 2 norms a layer, a final norm
    plain_params = 2 * V * h + (2 * L + 1) * h
    assert terms["frozen base parameters (2 B)"] == plain_params * 2 / 2     # x 2 B, sharded over the 2 ranks
    adapters = L * 8 * (2 * (h + h) + 2 * (h + 1024) + 2 * (h + 14336) + (14336 + h))   # r (in + out), seven linears
    assert terms["LoRA adapters (rank 8, 4 B)"] == adapters * 4 / 2


def test_fp16_qlora_under_accelerate_fsdp(tmp_path):
    """The fsdp_qlora recipe with fp16: true and accelerate's FSDP file with mixed_precision: fp16 (its own comment:
    "bf16  # or fp16"): LLaMA-Factory stores the codes in the compute dtype, fp16 (quantization.py line 189), the
    policy follows it, accelerate adds its loss scaler: fsdp-fp16-stored (before: refused, precision fp16 against
    fsdp-bf16-stored). The bytes: fsdp-bf16-stored's, term by term."""
    import yaml
    doc = yaml.safe_load((LF / "extras/fsdp_qlora/llama3_lora_sft.yaml").read_text())
    assert doc.pop("bf16") is True
    qlora = tmp_path / "llama3_lora_sft.yaml"
    qlora.write_text(yaml.safe_dump({**doc, "fp16": True}))
    acc = yaml.safe_load((DATA / "accelerate/llamafactory/fsdp_config.yaml").read_text())
    accel = tmp_path / "fsdp_config.yaml"
    accel.write_text(yaml.safe_dump({**acc, "mixed_precision": "fp16"}))
    s = from_launch([qlora, accel], hardware="v100").scenario
    assert (s.profile_options["regime"], s.precision) == ("fsdp-fp16-stored", "fp16")
    b = from_launch([LF / "extras/fsdp_qlora/llama3_lora_sft.yaml", DATA / "accelerate/llamafactory/fsdp_config.yaml"],
                    hardware="v100").scenario
    one, two = s.solve(), b.solve()
    assert [t.nbytes for t in one.terms] == [t.nbytes for t in two.terms]
    terms = {t.label: t.nbytes for t in one.terms}
    V, h, L = 128256, 4096, 32     # as test_qlora_under_accelerate_fsdp_stores_the_base_in_bf16
    assert terms["frozen base parameters (2 B)"] == (2 * V * h + (2 * L + 1) * h) * 2 / 2
    # the same recipe with fp16 alone on one GPU: its own regime (the fp16 base, no FSDP), unchanged
    assert from_launch([qlora], gpus=1, hardware="v100").scenario.profile_options["regime"] == "fp16"


def test_a_deepspeed_comment_is_ignored_and_autotp_read(tmp_path):
    """LLaMA-Factory's ds_z2_autotp_config.json opens with a "_comment" string (a text DeepSpeed never reads): it is
    listed as ignored, not refused; its AutoTP size becomes tp 2 and stage 2 ZeRO-2. A non-text "_" key is still
    refused, naming it."""
    import json
    path = LF / "deepspeed/ds_z2_autotp_config.json"
    launch = from_launch([path], gpus=8, hardware="h100", model="llama3-8b", batch_size=8, seq_len=2048)
    s = launch.scenario
    assert (s.tp_size, s.zero_stage) == (2, 2)
    assert "_comment" in launch.readings[0].ignored
    odd = tmp_path / "ds.json"
    odd.write_text(json.dumps({**json.loads(path.read_text()), "_buckets": 5}))
    with pytest.raises(MlsysimError) as err:
        from_launch([odd], gpus=8, hardware="h100", model="llama3-8b", batch_size=8, seq_len=2048)
    assert "_buckets" in str(err.value)
