"""torchtune recipe configs (0.6.1) read by the built-in `torchtune` launch format (issue 26):
every real config copied under tests/data/launch/torchtune/ reads end to end (an answer or a
refusal naming the field), hand-derived checks of what the fields became, overrides, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlsysim_core.errors import InvalidInputError, MlsysimError, NotModelledError
from mlsysim_core.scenario import Scenario, from_launch

from clitools import run

DATA = Path(__file__).resolve().parents[1] / "data" / "launch" / "torchtune"
FILES = sorted(DATA.rglob("*.yaml"))


def test_the_copies_are_listed_with_their_source():
    listed = (DATA / "SOURCES.md").read_text()
    assert len(FILES) >= 6
    for path in FILES:
        assert f"| {path.relative_to(DATA)} | recipes/configs/{path.relative_to(DATA)} |" in listed


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_config_reads_end_to_end(path):
    """An answer, or a refusal that names a key of the file (or the profile option it became)."""
    gpus = None if "single_device" in path.stem else 8
    try:
        launch = from_launch([path], gpus=gpus, seq_len=2048)
    except MlsysimError as err:
        assert isinstance(err, InvalidInputError), err
        key = err.parameter.split(".")[0].split("[")[0]
        # the file's key, or one it lacks (value None), or a flag it needs
        assert key in path.read_text() or err.value is None or err.parameter in ("--from", "--seq-len"), err
        return
    try:
        launch.scenario.solve()
    except NotModelledError as err:      # the measured profile's refusal, of a field the file set
        assert err.parameter.split(".")[0] in launch.sources, err


def _fields(launch):
    return {(f.key, f.field): f.becomes for r in launch.readings for f in r.fields}


def test_llama3_2_3b_full_single_device_hand_derived():
    path = DATA / "llama3_2" / "3B_full_single_device.yaml"
    launch = from_launch([path], seq_len=1024)
    s = launch.scenario
    # batch_size: 4 per device, one device (the config's name), accumulation 1
    assert (s.model, s.batch_size, s.dp_size, s.gradient_accumulation_steps) == ("meta-llama/llama-3.2-3b", 4, 1, 1)
    assert s.optimizer == "paged-adamw-8bit-bnb" and s.activation_checkpointing == "full"
    o = s.profile_options
    assert o["regime"] == "bf16" and o["optimizer_in_backward"] is True and o["loss"] == "chunked"
    assert o["loss_chunks"] == 8          # CEWithChunkedOutputLoss's default, applied as an implicit default
    assert s.seq_len == 1024              # not packed, max_seq_len null: --seq-len
    [reading] = launch.readings
    assert {d.key for d in reading.defaults} >= {"loss.num_output_chunks"}
    assert "output_dir" in reading.ignored and "optimizer.lr" in reading.ignored
    assert "single_device" in reading.world


def test_llama3_1_8b_full_distributed_hand_derived():
    launch = from_launch([DATA / "llama3_1" / "8B_full.yaml"], gpus=8, seq_len=2048)
    s = launch.scenario
    # FSDP2 over 8 GPUs, batch 2 per device: global 16; resharded after forward (the recipe's default)
    assert (s.dp_size, s.batch_size, s.data_parallel, s.tp_size) == (8, 16, "fsdp", 1)
    assert s.profile_options["regime"] == "bf16" and s.profile_options["optimizer_impl"] == "fused"
    defaults = {d.key: d for r in launch.readings for d in r.defaults}
    assert defaults["fsdp_reshard_after_forward"].version == "torchtune 0.6.1"
    approximated = [f.key for r in launch.readings for f in r.fields if f.approximated]
    # custom_sharded_layers: ['tok_embeddings', 'output'] read as the fsdp rule's separate_units (no longer approximated)
    assert approximated == []
    assert s.plugin_options == {"fsdp": {"root_reshard_after_forward": True, "separate_units": ["embedding", "lm_head"]}}
    with pytest.raises(InvalidInputError, match="--gpus"):
        from_launch([DATA / "llama3_1" / "8B_full.yaml"], seq_len=2048)     # distributed: --gpus needed


def test_70b_fsdp_cpu_offload():
    s = from_launch([DATA / "llama3_1" / "70B_full.yaml"], gpus=8, seq_len=2048).scenario
    assert s.profile_options["offload"] == "optimizer+gradients+parameters"


def test_lora_and_qlora_builders():
    lora = from_launch([DATA / "llama3_2" / "3B_lora_single_device.yaml"], seq_len=2048).scenario
    assert lora.profile_options["lora"] == {"rank": 64, "target_modules": ["q_proj", "v_proj", "o_proj",
                                                                          "gate_proj", "up_proj", "down_proj"],
                                            "adapter_dtype": "base"}
    # torchtune's adapters are in the model's dtype (bf16): rank 64 on q, v, o and the MLP of 28 layers
    # (h 3072, kv 1024, ffn 8192), 2 B each, beside the 3,212,749,824 bf16 base parameters and torchtune's RoPE cache:
    # llama3_2_3b's max_seq_len 131,072 x head_dim/2 64 x (cos, sin) in fp32, and its 64 fp32 theta
    adapters = 28 * 64 * ((3072 + 3072) + (3072 + 1024) + (3072 + 3072) + 3 * (3072 + 8192))
    assert adapters == 89_915_392
    assert lora.profile_options["rope_cache"] == 131_072 and "rope_cache_layout" not in lora.profile_options
    assert lora.solve().weights == 2 * 3_212_749_824 + 2 * adapters + 131_072 * 64 * 2 * 4 + 64 * 4
    qlora = from_launch([DATA / "llama3_2" / "3B_qlora_single_device.yaml"], seq_len=2048)
    table = qlora.scenario.profile_options["lora"]
    # torchtune's quantize_base is torchao's NF4Tensor: read as that implementation, no longer approximated
    assert table["quantization"] == "nf4" and table["quant_implementation"] == "torchao" and "double_quant" not in table
    assert any(not f.approximated and "NF4Tensor" in f.note for r in qlora.readings for f in r.fields)


@pytest.mark.parametrize("name, key", [
    ("llama3_2/evaluation.yaml", "optimizer"),
    ("dev/8B_full_experimental.yaml", "ac_mode"),
])
def test_refusals_name_the_key(name, key):
    with pytest.raises(NotModelledError) as err:
        from_launch([DATA / name], gpus=8, seq_len=2048)
    assert err.value.parameter == key and name in str(err.value)


def test_overrides_as_tune_run(tmp_path):
    path = DATA / "llama3_2" / "3B_full_single_device.yaml"
    launch = from_launch([path], overrides=["dataset.packed=True", "tokenizer.max_seq_len=4096", "batch_size=2",
                                            "enable_activation_checkpointing=False"])
    s = launch.scenario
    assert (s.seq_len, s.batch_size, s.activation_checkpointing) == (4096, 2, "none")
    assert any("packed" in f.note for r in launch.readings for f in r.fields if f.field == "seq_len")
    compiled = from_launch([path], seq_len=512, overrides=["compile=True"])     # each layer compiled apart
    assert compiled.scenario.profile_options["compile"] == "blocks"


def test_compile_dora_and_dropout_mapped():
    """compile: True is torchtune's per-layer compile; DoRA is priced as peft's (said); dropout is read."""
    multinode = from_launch([DATA / "llama3_3" / "70B_full_multinode.yaml"], gpus=8, seq_len=2048)
    assert multinode.scenario.profile_options["compile"] == "blocks"
    dora = from_launch([DATA / "llama3" / "8B_dora.yaml"], gpus=8, seq_len=2048)
    table = dora.scenario.profile_options["lora"]
    assert table["use_dora"] is True
    assert any(f.key == "model.use_dora" and f.approximated and "peft" in f.note for r in dora.readings
               for f in r.fields)


def test_unknown_key_is_refused(tmp_path):
    text = (DATA / "llama3_2" / "3B_full_single_device.yaml").read_text() + "\nmy_new_memory_knob: 3\n"
    path = tmp_path / "3B_full_single_device.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInputError) as err:
        from_launch([path], seq_len=512)
    assert err.value.parameter == "my_new_memory_knob" and "refused rather than dropped" in str(err.value)


def test_same_answer_as_the_flags():
    launch = Scenario.from_launch([DATA / "llama3_1" / "8B_full_single_device.yaml"], seq_len=2048, hardware="a100")
    code, out = run("estimate", "--from", str(DATA / "llama3_1" / "8B_full_single_device.yaml"), "-s", "2048",
                    "-g", "a100", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["total_memory"] == launch.scenario.solve().total_memory
    assert data["launch"]["files"][0]["format"] == "torchtune"


def test_cli_text_and_refusal(capsys):
    path = DATA / "llama3_2" / "3B_lora_single_device.yaml"
    # (LoRA with torchtune's chunked loss is priced since the measured profile combined them)
    code, text = run("estimate", "--from", str(path), "-s", "2048", "--no-chart")
    assert code == 0 and "loss._component_ = torchtune.modules.loss.CEWithChunkedOutputLoss" in text
    code, text = run("estimate", "--from", str(DATA / "llama3_2" / "3B_full_single_device.yaml"), "-s", "2048",
                     "--override", "batch_size=1", "--no-chart", "--optimizer", "adamw")
    assert code == 0
    section = text.split("from launch files:")[1]
    assert "--optimizer adamw overrides optimizer = paged-adamw-8bit-bnb from the files" in section
    assert "batch_size = 1  ->  micro_batch_size = 1" in section


def test_loss_components_map_to_the_registered_implementations():
    # loss._component_ -> --loss: CEWithChunkedOutputLoss -> chunked (num_output_chunks 8, its default);
    # LinearCrossEntropyLoss -> torchtune_linear (read, not approximated; num_output_chunks given or 8);
    # torch.nn.CrossEntropyLoss -> cross_entropy.
    path = DATA / "llama3_2" / "3B_full_single_device.yaml"
    cases = (("torchtune.modules.loss.CEWithChunkedOutputLoss", (), "chunked", 8),
             ("torchtune.modules.loss.LinearCrossEntropyLoss", (), "torchtune_linear", 8),
             ("torchtune.modules.loss.LinearCrossEntropyLoss", ("loss.num_output_chunks=16",), "torchtune_linear",
              16),
             ("torch.nn.CrossEntropyLoss", (), "cross_entropy", None))
    for component, more, loss, chunks in cases:
        launch = from_launch([path], seq_len=2048, overrides=(f"loss._component_={component}",) + more)
        o = launch.scenario.profile_options
        assert (o["loss"], o.get("loss_chunks")) == (loss, chunks)
        field = next(f for r in launch.readings for f in r.fields if f.field == "loss")
        assert field.key == "loss._component_" and not field.approximated
    linear = from_launch([path], seq_len=2048, overrides=("loss._component_=torchtune.modules.loss.LinearCrossEntropyLoss",))
    with pytest.raises(NotModelledError, match="optimizer_in_backward.*torchtune_linear"):
        linear.scenario.solve()       # the config's optimizer_in_bwd: True with this loss is refused, by name
    linear = from_launch([path], seq_len=2048, overrides=(
        "loss._component_=torchtune.modules.loss.LinearCrossEntropyLoss", "optimizer_in_bwd=False"))
    assert linear.scenario.solve().total_memory > 0
    with pytest.raises(NotModelledError, match="loss.mask_ignored_tokens"):
        from_launch([path], seq_len=2048, overrides=("loss._component_=torchtune.modules.loss.LinearCrossEntropyLoss",
                                                     "loss.mask_ignored_tokens=false"))


def test_compiled_lora_without_checkpointing_is_answered():
    """compile: True with LoRA (adapters in the model's dtype, no checkpointing): the measured profile's
    compiled blocks with frozen base weights (compile.lora_layer_saved); the file's own
    enable_activation_checkpointing: True with compile is answered in torchtune's order (compile_model, then
    set_activation_checkpointing: compile.lora_full_terms), the reading not approximated."""
    path = DATA / "llama3_1" / "8B_lora_single_device.yaml"
    launch = from_launch([path], hardware="h100", seq_len=2048,
                         overrides=["compile=True", "enable_activation_checkpointing=False"])
    s = launch.scenario
    assert (s.compile, s.activation_checkpointing, s.profile_options["lora"]["adapter_dtype"]) == \
        ("blocks", "none", "base")
    compiled = s.solve()
    eager = from_launch([path], hardware="h100", seq_len=2048,
                        overrides=["enable_activation_checkpointing=False"]).scenario.solve()
    assert compiled.weights == eager.weights and compiled.allocated_memory < eager.allocated_memory
    assert any(n.startswith("compile='blocks'") for n in compiled.notes)
    checkpointed = from_launch([path], hardware="h100", seq_len=2048, overrides=["compile=True"])
    assert (checkpointed.scenario.compile, checkpointed.scenario.activation_checkpointing) == ("blocks", "full")
    field = next(f for r in checkpointed.readings for f in r.fields if f.key == "compile")
    assert not field.approximated and "torchtune's order" in field.note
    result = checkpointed.scenario.solve()
    assert any(n.startswith("compile='blocks' with LoRA and full checkpointing: torchtune's order")
               for n in result.notes)
    assert any(t.label == "the top block's compiled recompute and MLP backward" for t in result.terms)


def test_compile_with_checkpointing_answered_in_torchtunes_order():
    """torchtune's recipes compile each layer, then wrap it in checkpoint_wrapper: the reading states that order
    (compile_checkpoint='outside', read from compile with enable_activation_checkpointing, not approximated) and
    the answer is compile.blocks_outside_full_terms' (its note); without checkpointing no order is stated."""
    path = DATA / "llama3_2" / "3B_full_single_device.yaml"
    packed = ["dataset.packed=True", "tokenizer.max_seq_len=4096", "optimizer_in_bwd=False", "compile=True"]
    launch = from_launch([path], hardware="a100", overrides=packed)
    fields = [f for r in launch.readings for f in r.fields if f.key == "compile"]
    assert [(f.field, f.becomes, f.approximated) for f in fields] == [("compile", "blocks", False),
                                                                    ("compile_checkpoint", "outside", False)]
    assert (launch.scenario.compile, launch.scenario.activation_checkpointing) == ("blocks", "full")
    assert launch.scenario.compile_checkpoint == "outside"
    result = launch.scenario.solve()
    assert any(n.startswith("compile='blocks' with full checkpointing, compile_checkpoint='outside'")
               for n in result.notes)
    unchecked = from_launch([path], hardware="a100", overrides=[*packed, "enable_activation_checkpointing=False"])
    assert [f.field for r in unchecked.readings for f in r.fields if f.key == "compile"] == ["compile"]
    assert unchecked.scenario.compile_checkpoint is None


def test_compiled_blocks_under_tensor_parallelism_without_sequence_parallelism():
    """tensor_parallel_dim with torchtune's plan (no sequence parallelism) and compile: True, no checkpointing,
    torch's cross-entropy: described (compile='blocks' under tp without sp). The file's chunked loss under tp is
    refused by the profile, naming loss, traced to loss._component_."""
    path = DATA / "llama3_1" / "8B_full.yaml"
    tp = ["tensor_parallel_dim=2", "compile=True", "enable_activation_checkpointing=False"]
    launch = from_launch([path], gpus=8, hardware="h100", seq_len=2048,
                         overrides=[*tp, "loss._component_=torch.nn.CrossEntropyLoss"])
    s = launch.scenario
    assert (s.tp_size, s.sequence_parallel, s.compile, s.dp_size) == (2, False, "blocks", 4)
    assert any(n.startswith("compile='blocks'") for n in s.solve().notes)
    chunked = from_launch([path], gpus=8, hardware="h100", seq_len=2048, overrides=tp)
    with pytest.raises(NotModelledError) as err:
        chunked.scenario.solve()
    assert err.value.parameter == "loss" and chunked.sources["loss"].endswith("loss._component_")


def test_framework_version_other_than_the_readers_is_said():
    """--framework-version 9.9: the reader knows torchtune 0.6.1's defaults only, applies them and says so; the
    reading stays labelled 0.6.1 (it was labelled 'torchtune 9.9' while 0.6.1's defaults were applied)."""
    launch = from_launch([DATA / "llama3_2/3B_full_single_device.yaml"], hardware="a100", seq_len=2048,
                         framework_version="9.9")
    reading = launch.readings[0]
    assert reading.framework_version == "torchtune 0.6.1"
    assert "--framework-version 9.9: this reader knows torchtune 0.6.1's defaults only; those are applied" \
        in reading.notes
    same = from_launch([DATA / "llama3_2/3B_full_single_device.yaml"], hardware="a100", seq_len=2048,
                       framework_version="0.6.1")
    assert not any("--framework-version" in n for n in same.readings[0].notes)


def test_rope_cache_per_builder():
    """Each builder's max_seq_len as torchtune 0.6.1's model builders set it (the RoPE cache's rows, rope.py); Qwen2.5's
    rope concatenates cos and sin (twice the values per position). Qwen2.5's _base and _instruct builders differ
    (qwen2_5/_model_builders.py lines 154 and 180)."""
    from mlsysim_plugins.launch.torchtune import ROPE_ROWS, _rope_cache
    from mlsysim_plugins.launch._common import Reading
    assert (ROPE_ROWS["llama2_7b"], ROPE_ROWS["llama3_8b"], ROPE_ROWS["llama3_1_8b"], ROPE_ROWS["mistral_7b"],
            ROPE_ROWS["qwen2_5_0_5b"], ROPE_ROWS["qwen2_5_7b_base"], ROPE_ROWS["qwen2_5_7b_instruct"],
            ROPE_ROWS["gemma2_9b"]) == (4096, 8192, 131072, 32768, 32768, 131072, 32768, 8192)
    seen = {}
    for base, builder in (("llama3_1_8b", "llama3_1_8b"), ("qwen2_5_7b", "qwen2_5_7b_base"), ("qwen3_8b", "qwen3_8b")):
        r = Reading("torchtune", "config.yaml", "torchtune 0.6.1")
        _rope_cache(r, base, f"torchtune.models.{builder}")
        assert r.defaults == []      # read from the builder the file names, not a default of an absent key
        seen[base] = {f.field: f.becomes for f in r.fields if f.key == "model._component_"}
    assert seen == {"llama3_1_8b": {"rope_cache": 131072},
                    "qwen2_5_7b": {"rope_cache": 131072, "rope_cache_layout": "concatenated"},
                    "qwen3_8b": {}}      # no qwen3 builder in 0.6.1: Hugging Face's tables
