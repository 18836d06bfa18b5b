"""LitGPT config_hub YAMLs read by the built-in `litgpt` launch format (issue 26): every copied
file reads end to end (an answer or a refusal naming the field), hand-derived checks, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core.errors import InvalidInputError, MlsysimError, NotModelledError
from mlsysim_core.scenario import from_launch

from clitools import run

DATA = Path(__file__).resolve().parents[1] / "data" / "launch" / "litgpt"
FILES = sorted(DATA.rglob("*.yaml"))


def test_the_copies_are_listed_with_their_source():
    listed = (DATA / "SOURCES.md").read_text()
    assert len(FILES) >= 6
    for path in FILES:
        assert f"| {path.relative_to(DATA)} | config_hub/{path.relative_to(DATA)} |" in listed


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_config_reads_end_to_end(path):
    gpus = None if "devices: auto" not in path.read_text() else 8
    try:
        launch = from_launch([path], gpus=gpus)
    except MlsysimError as err:
        assert isinstance(err, InvalidInputError), err
        assert err.parameter.split(".")[0] in path.read_text(), err
        return
    try:
        launch.scenario.solve()
    except NotModelledError as err:
        assert err.parameter.split(".")[0] in launch.sources or err.parameter.startswith("model."), err


def test_full_finetune_one_device_hand_derived():
    launch = from_launch([DATA / "finetune" / "llama-3.2-1B" / "full.yaml"])
    s = launch.scenario
    # devices 1: global 64 = micro 4 x accumulation 16; no FSDP, no checkpointing; bf16-true: pure bf16
    # LitGPT's GPT keeps lm_head apart from the embedding (litgpt/model.py lines 28-31): Llama-3.2-1B untied,
    # 1,235,814,400 + 128,256 x 2,048 = 1,498,482,688 parameters
    assert s.model["tied_embeddings"] is False and s.model["parameters"] == 1_235_814_400 + 128_256 * 2048
    assert (s.dp_size, s.batch_size, s.gradient_accumulation_steps) == (1, 64, 16)
    assert s.activation_checkpointing == "none" and s.data_parallel is None and s.optimizer == "adamw"
    assert s.profile_options["regime"] == "bf16" and s.seq_len == 512
    # LitGPT's chunked_cross_entropy (finetune/full.py:282-285): loss='litgpt_chunked', 128 tokens per chunk
    assert s.profile_options["loss"] == "litgpt_chunked" and s.profile_options["loss_chunks"] == 128
    loss = next(f for r in launch.readings for f in r.fields if f.field == "loss")
    assert loss.key == "train.max_seq_length" and not loss.approximated


def test_full_finetune_four_devices_is_fsdp_with_checkpointing(tmp_path):
    # global 64 = micro 4 x devices 4 x accumulation 4: litgpt accumulates under fabric.no_backward_sync, which
    # Lightning's FSDPStrategy makes FSDP1's no_sync(): the whole model's gradients unsharded on every rank
    # (16 GB for Llama-3-8B in bf16: the README's OOM on 4x A10G): the fsdp rule's gradient_sync="no_sync",
    # read from train.global_batch_size (tests/plugins/test_fsdp_no_sync.py); FSDP1's forward: fsdp_version=1.
    s = from_launch([DATA / "finetune" / "llama-3-8b" / "full.yaml"]).scenario
    assert (s.gradient_accumulation_steps, s.plugin_options) == (4, {"fsdp": {"gradient_sync": "no_sync",
                                                                             "fsdp_version": 1}})
    one_step = tmp_path / "full.yaml"
    one_step.write_text((DATA / "finetune" / "llama-3-8b" / "full.yaml").read_text().replace(
        "global_batch_size: 64", "global_batch_size: 16"))
    s = from_launch([one_step]).scenario
    # devices 4 (the file's world size): FSDP per Block with activation checkpointing per Block
    assert (s.dp_size, s.data_parallel, s.activation_checkpointing) == (4, "fsdp", "full")
    with pytest.raises(InvalidInputError, match="--gpus 8 and"):
        from_launch([one_step], gpus=8)


def test_lora_and_qlora():
    lora = from_launch([DATA / "finetune" / "llama-3.2-3B" / "lora.yaml"]).scenario.profile_options["lora"]
    # LitGPT builds the adapters in the run's precision (fabric.init_module), not peft's fp32: "base"
    assert lora == {"rank": 32, "target_modules": ["q_proj", "v_proj"], "adapter_dtype": "base"}
    qlora = from_launch([DATA / "finetune" / "llama-3.2-3B" / "qlora.yaml"]).scenario.profile_options["lora"]
    assert qlora["quantization"] == "nf4" and qlora["double_quant"] is False


@pytest.mark.parametrize("name, key", [("pretrain/tinystories.yaml", "model_config")])     # (lora_head: the LM
# head a LoRA target, tests/measured/test_lora_head.py)
def test_refusals_name_the_key(name, key):
    with pytest.raises(NotModelledError) as err:
        from_launch([DATA / name], gpus=8)
    assert err.value.parameter == key and name in str(err.value)


def test_unknown_model_can_be_replaced_with_m(tmp_path):
    # (google/gemma-2b is in the catalog since issue 26: the file's own model is read, LitGPT's untied head;
    # a model the catalog lacks is refused naming checkpoint_dir)
    assert from_launch([DATA / "finetune" / "gemma-2b" / "full.yaml"]).scenario.model["parameters"] == 3_030_460_416
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text((DATA / "finetune" / "gemma-2b" / "full.yaml").read_text().replace(
        "google/gemma-2b", "bigcode/starcoder2-3b"))
    with pytest.raises(InvalidInputError, match="checkpoint_dir"):
        from_launch([unknown])
    # (the file accumulates 4 micro-batches under FSDP1's no_sync: the fsdp rule's gradient_sync; FSDP1's forward)
    s = from_launch([DATA / "finetune" / "gemma-2b" / "full.yaml"], model="google/gemma-2-2b").scenario
    assert s.plugin_options == {"fsdp": {"gradient_sync": "no_sync", "fsdp_version": 1}}
    text = (DATA / "finetune" / "gemma-2b" / "full.yaml").read_text()
    one_step = tmp_path / "full.yaml"
    one_step.write_text(text.replace("global_batch_size: 16", "global_batch_size: 4"))
    launch = from_launch([one_step], model="google/gemma-2-2b")
    assert launch.scenario.model == "google/gemma-2-2b"


def test_cli_json():
    code, out = run("estimate", "--from", str(DATA / "finetune" / "llama-3.2-1B" / "full.yaml"), "-g", "a10g", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["run"]["global_batch"] == 64 and data["launch"]["files"][0]["format"] == "litgpt"


def test_loss_mapping_per_command():
    # finetune_full: exactly litgpt_chunked; pretrain (no shifted copy) and finetune_lora (chunked LM head):
    # litgpt_chunked as an approximation; under LoRA the profile prices the chunked LM head
    # (published_losses.litgpt_lora_terms); under QLoRA its 4-bit LM head too (Lightning's BitsandbytesPrecision).
    pre = from_launch([DATA / "pretrain" / "tinyllama.yaml"], gpus=8, model="meta-llama/Llama-3.2-1B")
    field = next(f for r in pre.readings for f in r.fields if f.field == "loss")
    assert pre.scenario.profile_options["loss"] == "litgpt_chunked" and field.approximated
    lora = from_launch([DATA / "finetune" / "llama-3.2-1B" / "lora.yaml"])
    assert lora.scenario.profile_options["loss"] == "litgpt_chunked"
    assert lora.scenario.solve().notes[0].startswith("loss: LitGPT's chunked_cross_entropy")
    qlora = from_launch([DATA / "finetune" / "llama-3.2-3B" / "qlora.yaml"])
    terms = {t.label: t for t in qlora.scenario.solve().terms}
    head = terms["quantized base linears (4-bit nf4)"]
    assert "the LM head's too" in head.formula
    # the 28 layers' linears (q, k, v, o; gate, up, down) and the untied LM head (128,256 x 3,072), two codes a byte
    assert head.nbytes == (28 * (2 * 3072 * 3072 + 2 * 3072 * 1024 + 3 * 3072 * 8192) + 128256 * 3072) // 2


def test_framework_version_other_than_the_readers_is_said():
    """--framework-version 9.9: LitGPT 0.5.13's defaults applied, said, and the reading labelled as what it applied."""
    reading = from_launch([DATA / "finetune" / "llama-3.2-1B" / "full.yaml"], framework_version="9.9").readings[0]
    assert reading.framework_version == "litgpt 0.5.13"
    assert "--framework-version 9.9: this reader knows litgpt 0.5.13's defaults only; those are applied" \
        in reading.notes
