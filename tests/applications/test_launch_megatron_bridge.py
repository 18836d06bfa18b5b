"""Megatron-Bridge launch configs (issue 26): a real resolved ConfigContainer (an 8 x H100 run's
logged Task Configuration, tests/data/launch/megatron_bridge/SOURCE.md) read end to end, every key
accounted for, hand-derived numbers, refusals naming the Bridge key, and the published memory."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import pytest
import yaml

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.scenario import from_launch

DATA = Path(__file__).resolve().parent.parent / "data" / "launch" / "megatron_bridge"
DUMP = DATA / "llama32_1b_pretrain_h100x8.yaml"
MIB = 2**20


def _variant(tmp_path, edit) -> Path:
    """The real dump with one edit (a dict of section -> {key: value}, or a callable on the document)."""
    document = yaml.safe_load(DUMP.read_text())
    if callable(edit):
        edit(document)
    else:
        for section, values in edit.items():
            document[section].update(values)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_the_copy_is_the_sources():
    source = (DATA / "SOURCE.md").read_text()
    digest = hashlib.sha256(DUMP.read_bytes()).hexdigest()
    assert digest in source and DUMP.name in source and "6129a1ad5d345ee9628fa6fba4bbdc48a7d3bce3" in source
    assert "max allocated: 12003.60400390625" in source and "MIT" in source


def test_the_dump_by_hand():
    launch = from_launch([DUMP], gpus=8, hardware="h100")
    reading = launch.readings[0]
    assert reading.format == "megatron-bridge"
    model = reading.model.becomes
    # Llama 3.2 1B: 16 layers, h 2048, 32 heads of 64, 8 query groups, SwiGLU ffn 8192, RMSNorm, no biases,
    # tied embeddings, vocab 128,256 unpadded (should_pad_vocab false): the log's 1,235,814,400 parameters
    h, L, q, kv, f, V = 2048, 16, 32 * 64, 8 * 64, 8192, 128256
    layer = h + h * (q + 2 * kv) + q * h + h + 2 * h * f + f * h
    assert model["parameters"] == V * h + L * layer + h == 1235814400
    assert (model["vocab_size"], model["kv_heads"], model["tied_embeddings"]) == (V, 8, True)
    values = reading.values()
    assert values["seq_len"] == 1024          # dataset.sequence_length, not model.seq_length (131,072)
    assert (values["tp_size"], values["pp_size"], values["micro_batch_size"], values["global_batch_size"]) == \
        (1, 1, 1, 512)
    assert (values["regime"], values["data_parallel"], values["attention"], values["loss"], values["dropout"]) == \
        ("mixed-bf16-main-grad", "mcore-distopt", "sdpa", "megatron_fused", 0.0)
    # ddp.grad_reduce_in_fp32: the fp32 main-grad buffer (no grad_reduce_in_bf16); the weight-gradient fusion on
    assert values["plugin_options"] == {"mcore-distopt": {"gradient_accumulation_fusion": True}}
    keys = {f.key: f.field for f in reading.fields}
    assert keys["dataset.sequence_length"] == "seq_len" and keys["model.attention_backend"] == "attention"
    assert keys["model.cross_entropy_loss_fusion"] == "loss" and keys["ddp.use_distributed_optimizer"] == "data_parallel"
    assert any("model.seq_length 131072 only sizes learned position embeddings" in n for n in reading.notes)
    # gradient_accumulation_fusion: read (the rule's option), shown under the Bridge key with its own value
    fusion = next(f for f in reading.fields if f.key == "model.gradient_accumulation_fusion")
    assert fusion.value is True and not fusion.approximated and fusion.field == "plugin_options"


def test_dummy_wgrads_and_tied_gradient_by_hand():
    """TE's cached dummy weight gradients (bf16, one per distinct shape: qkv [(32 + 2 x 8) x 64, h], proj [h, h],
    fc1 [2f, h], fc2 [h, f], the tied LM head [V, h]; all phases) and the tied embedding's gradient as Megatron's
    hook makes it (the lookup's bf16 [V, h] and its out-of-place sum with the held dummy, at the backward's end)."""
    h, f, V = 2048, 8192, 128256
    result = from_launch([DUMP], gpus=8, hardware="h100").scenario.solve()
    (dummies,) = [t for t in result.terms if "dummy weight gradients" in t.label]
    assert dummies.nbytes == 2 * (48 * 64 * h + h * h + 2 * f * h + h * f + V * h) == 646971392
    assert dummies.phases == ("forward", "backward", "backward_end", "optimizer_step")
    (tied,) = [t for t in result.terms if t.label.startswith("tied embedding gradient")]
    assert tied.nbytes == 2 * V * h * 2 == 1050673152 and tied.phases == ("backward_end",)


def test_without_the_fusion_the_profile_terms(tmp_path):
    """model.gradient_accumulation_fusion false: no dummies, the measured profile's own tied term: the LM head's and
    the lookup's gradients and their sum, each made in the bf16 weights' dtype (3 bf16 [V, h])."""
    h, V = 2048, 128256
    path = _variant(tmp_path, {"model": {"gradient_accumulation_fusion": False}})
    reading = from_launch([path], gpus=8, hardware="h100")
    assert "plugin_options" not in reading.readings[0].values()
    result = reading.scenario.solve()
    assert not [t for t in result.terms if "dummy" in t.label]
    (tied,) = [t for t in result.terms if t.label.startswith("tied embedding gradient")]
    assert tied.nbytes == 3 * V * h * 2


def test_every_key_is_accounted_for():
    reading = from_launch([DUMP], gpus=8, hardware="h100").readings[0]
    listed = {part for item in [*reading.fields, *reading.defaults] for part in item.key.split("/")}
    listed |= set(reading.ignored)
    document = yaml.safe_load(DUMP.read_text())
    missing = []
    for section, value in document.items():
        if section in listed:
            continue
        if isinstance(value, dict):
            missing += [f"{section}.{k}" for k in value if f"{section}.{k}" not in listed]
        else:
            missing.append(section)
    assert missing == []
    assert len(reading.ignored) == len(set(reading.ignored))
    assert "checkpoint" in reading.ignored and "model.generation_config" in reading.ignored


def test_static_memory_by_hand():
    result = from_launch([DUMP], gpus=8, hardware="h100").scenario.solve()
    static = sum(t.nbytes for t in result.terms if t.component in ("weights", "optimizer_state"))
    # bf16 weights 2 B + fp32 main grads 4 B + (fp32 master 4 B + Adam 8 B) / dp 8 = 7.5 B per parameter (the
    # log's "weight and optimizer=8839.72 MB"), and TE's dummy weight gradients (646,971,392 B, above); the RoPE
    # buffer and Adam's step counters are a few bytes
    assert 0 <= static - 1235814400 * 15 // 2 - 646971392 < 4096


@pytest.mark.parametrize("edit, key, kind", [
    ({"peft": {"_target_": "megatron.bridge.peft.dora.DoRA", "dim": 32}}, "peft._target_", NotModelledError),
    ({"model": {"cpu_offloading": True}}, "model.cpu_offloading", NotModelledError),
    ({"model": {"num_moe_experts": 8}}, "model.num_moe_experts", NotModelledError),
    ({"model": {"enable_cuda_graph": True}}, "model.enable_cuda_graph", NotModelledError),
    ({"mixed_precision": {"fp8": "hybrid"}}, "mixed_precision.fp8", NotModelledError),
    ({"optimizer": {"use_precision_aware_optimizer": True}}, "optimizer.use_precision_aware_optimizer",
     NotModelledError),
    ({"ddp": {"use_megatron_fsdp": True}}, "ddp.use_megatron_fsdp", NotModelledError),
    ({"comm_overlap": {"tp_comm_overlap": True}}, "comm_overlap", NotModelledError),
    ({"model": {"tensor_model_parallel_size": 2, "vocab_size": 128257}}, "model.vocab_size", NotModelledError),
    ({"model": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 2}},
     "model.recompute_num_layers", NotModelledError),
    ({"model": {"a_new_field": 1}}, "model.a_new_field", InvalidInputError),
    ({"ddp": {"a_new_field": 1}}, "ddp.a_new_field", InvalidInputError),
    ({"a_new_section": {"x": 1}}, "a_new_section", InvalidInputError),
])
def test_refusals_name_the_bridge_key(tmp_path, edit, key, kind):
    if "peft" in edit or "comm_overlap" in edit or "a_new_section" in edit:
        path = _variant(tmp_path, lambda d: d.update(edit))
    else:
        path = _variant(tmp_path, edit)
    with pytest.raises(kind) as err:
        from_launch([path], gpus=8)
    assert err.value.parameter == key


def test_variants_map_as_megatron_does(tmp_path):
    unfused = {"_args_": [3], "_call_": True, "_target_": "megatron.core.transformer.enums.AttnBackend"}
    path = _variant(tmp_path, {"model": {"attention_backend": unfused, "recompute_granularity": "selective",
                                         "tensor_model_parallel_size": 2, "sequence_parallel": True,
                                         "pipeline_model_parallel_size": 2,
                                         "virtual_pipeline_model_parallel_size": 2},
                               "ddp": {"grad_reduce_in_fp32": False, "use_distributed_optimizer": False},
                               "mixed_precision": {"grad_reduce_in_fp32": False},
                               "optimizer": {"use_distributed_optimizer": False}})
    values = from_launch([path], gpus=8).readings[0].values()
    assert values["attention"] == "eager" and values["activation_checkpointing"] == "selective"
    assert (values["tp_size"], values["sequence_parallel"], values["pp_size"]) == (2, True, 2)
    # Bridge's virtual_pipeline_model_parallel_size is model chunks per rank: 16 layers / (pp 2 x 2) = 4 per chunk
    assert (values["pipeline_schedule"], values["virtual_stages"]) == ("interleaved-1f1b", 2)
    assert values["data_parallel"] == "mcore-ddp"
    assert values["plugin_options"] == {"mcore-ddp": {"grad_reduce_in_bf16": True, "gradient_accumulation_fusion": True}}


def test_the_published_row():
    """The validation row (docs/launch.md, tools/launch_validation.py): -0.8 % of max allocated (the issue's
    target: 5 %; the cuBLAS workspaces left out, as every row of that table); reserved compared with the total
    less the CUDA context, within the issue's 10 %."""
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "tools"))
    try:
        import launch_validation as tool
    finally:
        sys.path.remove(str(root / "tools"))
    rows = [spec for spec in tool.ROWS if spec[2] == "megatron_bridge/llama32_1b_pretrain_h100x8.yaml"]
    errors = {spec[6]: float(tool.row(*spec).split("|")[5].strip().rstrip("%").strip()) for spec in rows}
    assert errors["allocated"] == -0.8 and abs(errors["reserved"]) <= 10
    result = from_launch([DUMP], gpus=8, hardware="h100").scenario.solve()
    error = (result.allocated_memory / MIB - 12003.60400390625) / 12003.60400390625
    assert -0.010 < error < -0.005


def test_the_row_split_static_and_above():
    """The log's two figures (SOURCE.md): allocated between steps 9,554.88 MiB (the static part: weights, main
    grads, optimizer state, TE's dummies, the cuBLAS workspaces, which PyTorch's allocator counts) and max allocated
    12,003.60 MiB, so 2,448.72 MiB above it. Predicted: 9,552.23 (-0.03 %) and 2,454.77 (+0.25 %), as
    docs/launch-megatron.md says; the peak is the loss's backward, no longer the tied embedding's gradient."""
    result = from_launch([DUMP], gpus=8, hardware="h100").scenario.solve()
    workspace = sum(t.nbytes for t in result.terms if t.component == "runtime_overheads" and "cuBLAS" in t.label)
    static = result.weights + result.gradients + result.optimizer_state
    measured_static, measured_peak = 9554.87939453125, 12003.60400390625
    assert round((static + workspace) / MIB, 2) == 9552.23
    assert round((result.allocated_memory - static) / MIB, 2) == 2454.77
    assert abs((static + workspace) / MIB - measured_static) / measured_static < 0.001
    above = measured_peak - measured_static
    assert abs((result.allocated_memory - static) / MIB - above) / above < 0.005


# --- peft (LoRA) and finetuning datasets: a file derived from the real dump (SOURCE.md, derive_finetune.py) ----------

DERIVED = DATA / "llama32_1b_lora_squad_derived.yaml"
LORA = "megatron.bridge.peft.lora.LoRA"
PACKED_SPECS = {"_target_": "megatron.bridge.data.datasets.packed_sequence.PackedSequenceSpecs",
                "packed_sequence_size": 4096, "tokenizer_model_name": None, "packed_train_data_path": None,
                "packed_val_data_path": None, "packed_metadata_path": None, "pad_cu_seqlens": False}
# Llama 3.2 1B (the dump's model): h, layers, q and kv widths, ffn, r (LoRA() default dim)
H, L, Q, KV, F, R = 2048, 16, 2048, 512, 8192, 32


def _derived(tmp_path, edit) -> Path:
    """The derived file with one edit (a callable on the document)."""
    document = yaml.safe_load(DERIVED.read_text())
    edit(document)
    path = tmp_path / "finetune.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


def test_the_derived_file_is_the_scripts_output():
    sys.path.insert(0, str(DATA))
    try:
        import derive_finetune
    finally:
        sys.path.remove(str(DATA))
    assert derive_finetune.derive() == DERIVED.read_text()
    source = (DATA / "SOURCE.md").read_text()
    assert hashlib.sha256(DERIVED.read_bytes()).hexdigest() in source and "derived" in source


def test_lora_reading_by_hand():
    reading = from_launch([DERIVED], gpus=8, hardware="h100").readings[0]
    values = reading.values()
    # LoRA(): the four fused modules mapped to the profile's per-projection names, r 32, no dropout, the adapters in
    # the model's bf16 (ParallelLinearAdapter: self.bfloat16())
    assert values["lora"] == {"adapter_dtype": "base", "rank": R, "dropout": 0.0, "target_modules": [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}
    targets = next(f for f in reading.fields if f.key == "peft.target_modules")
    # one fused adapter each for linear_qkv and linear_fc1 in Bridge, one per projection in the profile: 2 + 1 more
    # r x h in-projections per layer
    assert targets.approximated and f"{L * R * H * 3:,} adapter parameters more" in targets.note
    assert L * R * H * 3 == 3145728
    # not packed: dataset.seq_length is what a batch is padded to at most
    seq = next(f for f in reading.fields if f.field == "seq_len")
    assert (seq.key, values["seq_len"]) == ("dataset.seq_length", 2048) and "not packed" in seq.note
    # the frozen base returns no TE dummy: the rule's option off, the adapters' own dummies said (bf16, one per
    # distinct shape: [r, h] (qkv, proj, fc1 in), [q + 2 kv, r], [h, r] (proj, fc2 out), [2f, r], [r, f] (fc2 in))
    fusion = next(f for f in reading.fields if f.key == "model.gradient_accumulation_fusion")
    assert values["plugin_options"] == {"mcore-distopt": {"gradient_accumulation_fusion": False}}
    dummies = 2 * (R * H + (Q + 2 * KV) * R + H * R + 2 * F * R + R * F)
    assert fusion.approximated and f"{dummies:,} B in all, not counted" in fusion.note and dummies == 2031616
    # cross_entropy_loss_fusion false (the recipe's under PEFT): Megatron's unfused vocab-parallel loss, read from the
    # key (the Megatron-LM mapping's default of an absent flag), not listed as a default
    loss = next(f for f in reading.fields if f.field == "loss")
    assert (loss.key, loss.value, values["loss"]) == ("model.cross_entropy_loss_fusion", False,
                                                      "megatron_vocab_parallel")
    assert not [d for d in reading.defaults if d.key == "model.cross_entropy_loss_fusion"]
    assert {"peft.alpha", "peft.params_to_save", "peft.canonical_mapping", "dataset.process_example_fn",
            "dataset.dataset_kwargs", "dataset.packed_sequence_specs"} <= set(reading.ignored)


def test_lora_static_memory_by_hand():
    """The frozen base in bf16; the adapters (the profile's per-projection layout: r (in + out) each) in bf16, their
    fp32 main grads whole, fp32 master and Adam / dp 8; no TE dummies, no tied-embedding gradient."""
    result = from_launch([DERIVED], gpus=8, hardware="h100").scenario.solve()
    adapters = L * R * ((H + Q) + 2 * (H + KV) + (Q + H) + 2 * (H + F) + (F + H))
    assert adapters == 22544384
    bridge = L * R * ((H + Q + 2 * KV) + (Q + H) + (H + 2 * F) + (F + H))     # what the run holds: 3,145,728 fewer
    assert adapters - bridge == 3145728
    terms = {t.label: t.nbytes for t in result.terms}
    assert terms["frozen base parameters (2 B)"] == 2 * 1235814400
    assert terms[f"LoRA adapters (rank {R}, 2 B)"] == 2 * adapters
    assert terms["main-grad buffer (32-bit, whole on every data-parallel rank)"] == 4 * adapters
    assert terms["fp32 master weights"] == 4 * adapters / 8 and terms["adam state (2 x 32-bit)"] == 8 * adapters / 8
    assert not [t for t in result.terms if "dummy" in t.label or t.label.startswith("tied embedding gradient")]
    # the loss: Megatron's unfused vocab-parallel cross-entropy over the frozen LM head (its softmax saved in fp32)
    assert terms["softmax, made in place in the logits' fp32 copy (saved)"] == 4 * 2048 * 128256


def _missing(document: dict, listed: set) -> list:
    def walk(prefix, value):
        if prefix in listed:
            return []
        if isinstance(value, dict) and value:
            return [m for k, v in value.items() for m in walk(f"{prefix}.{k}", v)]
        return [prefix]
    return [m for section, value in document.items() for m in walk(section, value)]


@pytest.mark.parametrize("packed", [False, True])
def test_every_finetune_key_is_accounted_for(tmp_path, packed):
    path = DERIVED if not packed else _derived(tmp_path, lambda d: (
        d["dataset"].update(packed_sequence_specs=PACKED_SPECS, seq_length=4096,
                            dataset_kwargs={"pad_to_max_length": True}), d["model"].update(seq_length=4096)))
    reading = from_launch([path], gpus=8, hardware="h100").readings[0]
    listed = {part for item in [*reading.fields, *reading.defaults] for part in item.key.split("/")}
    listed |= set(reading.ignored)
    assert _missing(yaml.safe_load(path.read_text()), listed) == []
    assert len(reading.ignored) == len(set(reading.ignored))


def test_packed_sequences(tmp_path):
    """default_squad_config(4096, packed_sequence=True): one pack of 4096 tokens per micro-batch (padded to it)."""
    path = _derived(tmp_path, lambda d: (
        d["dataset"].update(packed_sequence_specs=PACKED_SPECS, seq_length=4096,
                            dataset_kwargs={"pad_to_max_length": True}), d["model"].update(seq_length=4096)))
    launch = from_launch([path], gpus=8, hardware="h100", seq_len=512)      # --seq-len: a pack's length is fixed
    seq = next(f for f in launch.readings[0].fields if f.field == "seq_len")
    assert (seq.key, launch.scenario.seq_len) == ("dataset.packed_sequence_specs.packed_sequence_size", 4096)
    assert "packed" in seq.note and "every batch padded to it" in seq.note
    bigger = _derived(tmp_path, lambda d: (d["dataset"].update(packed_sequence_specs=PACKED_SPECS),
                                           d["train"].update(micro_batch_size=2)))
    with pytest.raises(InvalidInputError) as err:
        from_launch([bigger], gpus=8)
    assert err.value.parameter == "train.micro_batch_size"


def test_unpacked_takes_seq_len_unless_padded(tmp_path):
    assert from_launch([DERIVED], gpus=8, seq_len=512).scenario.seq_len == 512
    padded = _derived(tmp_path, lambda d: d["dataset"].update(dataset_kwargs={"pad_to_max_length": True}))
    assert from_launch([padded], gpus=8, seq_len=512).scenario.seq_len == 2048


def test_canonical_lora_maps_exactly(tmp_path):
    """CanonicalLoRA: one adapter per projection, as the measured profile's: not approximated, the same bytes."""
    canonical = ["linear_q", "linear_k", "linear_v", "linear_proj", "linear_fc1_up", "linear_fc1_gate", "linear_fc2"]
    path = _derived(tmp_path, lambda d: d.update(peft={
        "_target_": "megatron.bridge.peft.canonical_lora.CanonicalLoRA", "alpha": 32, "canonical_mapping": {
            "linear_qkv": {"linear_q", "linear_k", "linear_v"}, "linear_proj": {"linear_proj"},
            "linear_fc1": {"linear_fc1_up", "linear_fc1_gate"}, "linear_fc2": {"linear_fc2"}},
        "dim": R, "dropout": 0.0, "dropout_position": "pre", "exclude_modules": [], "lora_A_init_method": "xavier",
        "lora_B_init_method": "zero", "params_to_save": set(), "target_modules": canonical}))
    launch = from_launch([path], gpus=8, hardware="h100")
    targets = next(f for f in launch.readings[0].fields if f.key == "peft.target_modules")
    assert not targets.approximated
    assert launch.readings[0].values()["lora"]["target_modules"] == [
        "q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "gate_proj", "down_proj"]
    assert launch.scenario.solve().allocated_memory == from_launch([DERIVED], gpus=8, hardware="h100") \
        .scenario.solve().allocated_memory


def test_peft_defaults_of_an_edited_dump(tmp_path):
    path = _derived(tmp_path, lambda d: d.update(peft={"_target_": LORA, "dim": 16}))
    reading = from_launch([path], gpus=8).readings[0]
    assert reading.values()["lora"]["rank"] == 16
    defaults = {d.key: d for d in reading.defaults}
    assert defaults["peft.target_modules"].value["target_modules"][0] == "q_proj"
    assert "lora.py" in defaults["peft.target_modules"].source and defaults["peft.dropout"].value == {"dropout": 0.0}


@pytest.mark.parametrize("edit, key, kind", [
    (lambda d: d["peft"].update(_target_="megatron.bridge.peft.dora.DoRA"), "peft._target_", NotModelledError),
    (lambda d: d["peft"].update(target_modules=["*.layers.0.*.linear_qkv"]), "peft.target_modules", NotModelledError),
    (lambda d: d["peft"].update(target_modules=[]), "peft.target_modules", NotModelledError),
    (lambda d: d["peft"].update(exclude_modules=["output_layer"]), "peft.exclude_modules", NotModelledError),
    (lambda d: d["peft"].update(lora_dtype={"_call_": False, "_target_": "torch.float32"}), "peft.lora_dtype",
     NotModelledError),
    (lambda d: d["peft"].update(a2a_experimental=True), "peft.a2a_experimental", NotModelledError),
    (lambda d: d["peft"].update(dropout=0.1, dropout_position="post"), "peft.dropout_position", NotModelledError),
    (lambda d: d["peft"].update(a_new_field=1), "peft.a_new_field", InvalidInputError),
    (lambda d: d["dataset"].update(dataset_kwargs={"get_attention_mask_from_fusion": False}),
     "dataset.dataset_kwargs.get_attention_mask_from_fusion", NotModelledError),
    (lambda d: d["dataset"].update(dataset_kwargs={"a_new_kwarg": 1}), "dataset.dataset_kwargs.a_new_kwarg",
     InvalidInputError),
    (lambda d: d["dataset"].update(a_new_field=1), "dataset.a_new_field", InvalidInputError),
    (lambda d: d["dataset"].update(_target_="my.FinetuningDatasetConfig"), "dataset._target_", NotModelledError),
    (lambda d: d["model"].update(gated_linear_unit=False, activation_func={"_call_": False,
                                                                           "_target_": "torch.nn.functional.gelu"}),
     "peft", NotModelledError),
])
def test_finetune_refusals_name_the_bridge_key(tmp_path, edit, key, kind):
    with pytest.raises(kind) as err:
        from_launch([_derived(tmp_path, edit)], gpus=8)
    assert err.value.parameter == key


@pytest.mark.parametrize("edit, gpus, parameter", [
    # LoRA under pp: the default cross-entropy only (lora._check_pipeline)
    (lambda d: d["model"].update(pipeline_model_parallel_size=2), 16, "loss"),
])
def test_the_profiles_refusals_pass_through(tmp_path, edit, gpus, parameter):
    scenario = from_launch([_derived(tmp_path, edit)], gpus=gpus, hardware="h100").scenario
    with pytest.raises(NotModelledError) as err:
        scenario.solve()
    assert err.value.parameter == parameter


@pytest.mark.parametrize("tp, gpus, sp", [(2, 2, False), (2, 8, False), (2, 8, True)])
def test_lora_under_tp_answers(tmp_path, capsys, tp, gpus, sp):
    """LoRA with tensor_model_parallel_size 2 (the derived dump): the reader passes what the config says (lora from
    peft, tp_size from the model section, cross_entropy_loss_fusion false: loss megatron_vocab_parallel); Megatron's
    main grads, its data-parallel rules and its unfused vocab-parallel cross-entropy with LoRA under tp are measured
    (validation/lora_parallel/measure_lora_tp_dp.py, measure_lora_tp_loss.py), so `estimate --from` answers. The
    loss by hand: the rank's logits shard T x V/tp (T 2,048, V 128,256, tp 2) upcast to the fp32 softmax it saves, and
    the final norm's bf16 output (T x h, h 2,048; with sequence parallelism its T/tp chunk) held until the loss
    returns."""
    from clitools import run
    path = _derived(tmp_path, lambda d: d["model"].update(tensor_model_parallel_size=tp, sequence_parallel=sp))
    launch = from_launch([path], gpus=gpus, hardware="h100")
    assert (launch.scenario.tp_size, launch.scenario.dp_size) == (tp, gpus // tp)
    assert launch.scenario.profile_options["lora"]["rank"] == R
    terms = {t.label: t.nbytes for t in launch.scenario.solve().ranks[0].terms}
    assert terms["softmax, made in place in the logits' fp32 copy (saved)"] == 4 * 2048 * 128_256 // tp
    if sp:
        assert terms["final norm output (held until the loss; sequence parallel)"] == 2 * 2048 * H // tp
    else:
        assert terms["final norm output (held until the loss)"] == 2 * 2048 * H
    code, out = run("estimate", "--from", str(path), "--gpus", str(gpus), "-g", "h100")
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err
    assert "loss: Megatron-Core's unfused vocab-parallel cross-entropy" in out


def test_dora_refused_by_the_cli_naming_peft_target(tmp_path, capsys):
    """Bridge's DoRA (DoRALinear: the magnitude scales the base + adapter sum) is not the profile's (peft's):
    refused by the reader, naming peft._target_."""
    from clitools import run
    path = _derived(tmp_path, lambda d: d["peft"].update(_target_="megatron.bridge.peft.dora.DoRA"))
    code, _ = run("estimate", "--from", str(path), "--gpus", "8", "-g", "h100")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "peft._target_='megatron.bridge.peft.dora.DoRA'" in err


def test_uneven_pipeline_stages_read_as_megatron_builds_them(tmp_path):
    """TransformerConfig's num_layers_in_first/last_pipeline_stage and account_for_embedding/loss_in_pipeline_split
    as Megatron-LM's arguments: Llama 3.2 1B's 16 layers over pp 4 with 2 first and 2 last -> [2, 6, 6, 2]; the
    embedding and the loss in the split over pp 2 -> (16 + 2) / 2 = 9, one fewer each end: [8, 8]; a split Megatron
    refuses (3 first: 13 left over 3 stages) is refused naming the Bridge key."""
    uneven = _variant(tmp_path, {"model": {"pipeline_model_parallel_size": 4, "num_layers_in_first_pipeline_stage": 2,
                                           "num_layers_in_last_pipeline_stage": 2}})
    launch = from_launch([uneven], gpus=8, hardware="h100")
    assert launch.scenario.profile_options["stage_layers"] == [2, 6, 6, 2]
    assert launch.sources["stage_layers"].endswith(
        "model.num_layers_in_first_pipeline_stage/model.num_layers_in_last_pipeline_stage")
    launch.scenario.solve()
    accounted = _variant(tmp_path, {"model": {"pipeline_model_parallel_size": 2,
                                              "account_for_embedding_in_pipeline_split": True,
                                              "account_for_loss_in_pipeline_split": True}})
    assert from_launch([accounted], gpus=8).scenario.profile_options["stage_layers"] == [8, 8]
    bad = _variant(tmp_path, {"model": {"pipeline_model_parallel_size": 4, "num_layers_in_first_pipeline_stage": 3}})
    with pytest.raises(InvalidInputError) as err:
        from_launch([bad], gpus=8)
    assert err.value.parameter == "model.num_layers_in_first_pipeline_stage"
