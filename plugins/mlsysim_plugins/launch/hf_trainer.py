"""Hugging Face Trainer / TRL arguments (``TrainingArguments``, ``SFTConfig`` with TRL's
``ModelConfig`` and ``ScriptArguments``, as a YAML or JSON: ``trl sft --config``, the
alignment-handbook recipes) as a launch format (docs/launch-hf.md).

Defaults: transformers 5.23.0's TrainingArguments (``optim`` ``adamw_torch_fused`` with
PyTorch >= 2.8, ``per_device_train_batch_size`` 8, ``gradient_accumulation_steps`` 1,
activation checkpointing off) and, for a TRL file (a key only TRL has), TRL 1.9's SFTConfig
(``gradient_checkpointing`` True, ``bf16`` True unless ``fp16``, ``max_length`` 1024, the model
loaded in float32 unless ``dtype`` says otherwise: trl/trainer/utils.py ``create_model_from_path``).
"""

from __future__ import annotations

from mlsysim_core import hookimpl
from mlsysim_core.errors import NotModelledError
from mlsysim_core.scenario import LaunchField

from .hookspecs import LaunchFormatSpec
from . import _hf, _recipes
from ._hf import TA_SOURCE, TRANSFORMERS, TRL, Reading, is_true, whole

TRL_SOURCE = "huggingface/trl@f2cd5771"
# transformers 5.23.0's TrainingArguments fields (ast of training_args.py) that change nothing
# the tool prices: logging, saving, evaluation, hub, schedules, data loading.
TA_IGNORED = {
    "output_dir", "num_train_epochs", "max_steps", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs",
    "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "average_tokens_across_devices",
    "max_grad_norm", "label_smoothing_factor", "bf16_full_eval", "fp16_full_eval", "tf32", "use_cache",
    "neftune_noise_alpha", "torch_empty_cache_steps", "logging_strategy", "logging_steps", "logging_first_step",
    "log_on_each_node", "logging_nan_inf_filter", "include_num_input_tokens_seen", "log_level", "log_level_replica",
    "disable_tqdm", "report_to", "run_name", "project", "trackio_space_id", "trackio_bucket_id",
    "trackio_static_space_id", "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size",
    "prediction_loss_only", "eval_on_start", "eval_do_concat_batches", "eval_use_gather_object",
    "eval_accumulation_steps", "include_for_metrics", "batch_eval_metrics", "save_only_model", "save_strategy",
    "save_steps", "save_on_each_node", "save_total_limit", "enable_jit_checkpoint", "push_to_hub", "hub_token",
    "hub_private_repo", "hub_model_id", "hub_strategy", "hub_always_push", "hub_revision", "load_best_model_at_end",
    "metric_for_best_model", "greater_is_better", "ignore_data_skip", "restore_callback_states_from_checkpoint",
    "full_determinism", "seed", "data_seed", "accelerator_config", "dataloader_drop_last", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "dataloader_in_order", "remove_unused_columns", "label_names",
    "train_sampling_strategy", "length_column_name", "ddp_find_unused_parameters", "ddp_broadcast_buffers",
    "ddp_static_graph", "ddp_backend", "ddp_timeout", "debug", "skip_memory_metrics", "do_train", "do_eval",
    "do_predict", "resume_from_checkpoint", "local_rank", "optim_target_modules",
    # removed before 5.x, still in recipes: nothing they set changes memory
    "overwrite_output_dir", "warmup_ratio", "evaluation_strategy", "logging_dir", "save_safetensors",
    "group_by_length", "hub_model_revision", "fp16_backend", "half_precision_backend", "push_to_hub_model_id",
    "push_to_hub_organization", "use_mps_device", "ray_scope", "include_tokens_per_second", "use_legacy_prediction_loop",
}
# TRL 1.9: SFTConfig/BaseConfig fields and ModelConfig/ScriptArguments keys that change nothing priced,
# and what alignment-handbook's recipes add (data mixtures, chat templates).
TRL_IGNORED = {
    "model_init_kwargs", "router_aux_loss_coef", "trust_remote_code", "chat_template_path", "dataset_text_field",
    "dataset_kwargs", "dataset_num_proc", "eos_token", "pad_token", "truncation_mode", "shuffle_dataset",
    "pad_to_multiple_of", "eval_packing", "completion_only_loss", "assistant_only_loss",
    "model_revision", "lora_alpha", "lora_task_type", "use_rslora", "lora_target_parameters",
    "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "dataset_streaming",
    "gradient_checkpointing_use_reentrant", "ignore_bias_buffers", "chat_template", "dataset_mixture",
    "dataset_config_name", "dataset_splits", "preprocessing_num_workers", "auto_insert_empty_system_msg",
    "system_prompt", "tokenizer_name_or_path", "max_eval_samples", "max_train_samples", "text_column",
    "hub_private_repo", "wandb_entity", "wandb_project", "callbacks", "benchmarks", "dataset_id_or_path",
    "tokenizer_revision", "attn_implementation_eval", "bnb_4bit_compute_dtype",
}
TRL_ONLY = {"max_length", "max_seq_length", "packing", "dataset_text_field", "model_name_or_path", "use_peft",
            "lora_r", "dataset_name", "assistant_only_loss", "completion_only_loss", "padding_free",
            "activation_offloading", "dataset_mixture", "chat_template", "model_init_kwargs", "packing_strategy"}
PREFERENCE = {"beta", "max_prompt_length", "ref_model_init_kwargs", "precompute_ref_log_probs", "rpo_alpha",
              "desirable_weight", "num_generations", "reward_funcs", "max_completion_length", "ref_adapter_name"}
MARKERS = {"per_device_train_batch_size", "gradient_accumulation_steps", "learning_rate", "optim", "output_dir",
           "bf16", "gradient_checkpointing", "lr_scheduler_type", "num_train_epochs", "max_steps"} | TRL_ONLY
# Keys of LLaMA-Factory's and axolotl's YAMLs (their readers take those files).
FOREIGN = {"finetuning_type", "stage", "template", "cutoff_len", "base_model", "micro_batch_size", "sequence_len",
           "sample_packing", "datasets", "adapter"}


def recognizes(path, document) -> bool:
    return (isinstance(document, dict) and bool(MARKERS & set(document)) and not (FOREIGN & set(document))
            and "zero_optimization" not in document and "distributed_type" not in document
            and not any(isinstance(v, dict) and str(v.get("_component_", "")).startswith("torchtune.")
                        for v in document.values())      # (a torchtune recipe: the torchtune reader's)
            and not isinstance(document.get("train"), dict))     # (a LitGPT config: the litgpt reader's)


def read(path, document, context):
    is_trl = bool(TRL_ONLY & set(document))
    r = Reading("hf-trainer", path, f"{TRANSFORMERS}" + (f" + {TRL}" if is_trl else ""), context)
    if getattr(context, "framework_version", None):
        r.notes.append(f"--framework-version {context.framework_version}: the defaults listed are those of "
                       f"{r.version} (the only version this reader knows)")
    trainer_args(r, document, trl=is_trl)
    return r.done()


def trainer_args(r: Reading, doc: dict, *, trl: bool, prefix: str = "", foreign=(), model_dtype_default=None):
    """Read TrainingArguments (+ TRL) keys of ``doc``; keys in ``foreign`` are left to the caller."""
    p = prefix
    get = doc.get
    for key in PREFERENCE & set(doc):
        r.refuse(f"{p}{key}", doc[key], "a supervised (SFT) or pre-training run",
                 "a preference/RL trainer (DPO, ORPO, KTO, GRPO: paired sequences and a reference or reward model): "
                 "not modelled")
    # The model (TRL's ModelConfig).
    model = None
    if "model_name_or_path" in doc:
        model = _hf.model_name(r, f"{p}model_name_or_path", doc["model_name_or_path"])
    # Batch.
    if "per_device_train_batch_size" in doc:
        r.set(f"{p}per_device_train_batch_size", doc["per_device_train_batch_size"], "micro_batch_size",
              whole(r, f"{p}per_device_train_batch_size", doc["per_device_train_batch_size"]))
    else:
        r.default(f"{p}per_device_train_batch_size", "micro_batch_size", 8, TA_SOURCE, version=TRANSFORMERS)
    if "gradient_accumulation_steps" in doc:
        r.set(f"{p}gradient_accumulation_steps", doc["gradient_accumulation_steps"], "gradient_accumulation_steps",
              whole(r, f"{p}gradient_accumulation_steps", doc["gradient_accumulation_steps"]))
    else:
        r.default(f"{p}gradient_accumulation_steps", "gradient_accumulation_steps", 1, TA_SOURCE, version=TRANSFORMERS)
    kwargs = (doc.get("accelerator_config") or {}) if isinstance(doc.get("accelerator_config"), dict) else {}
    kwargs = kwargs.get("gradient_accumulation_kwargs") or {}
    if isinstance(kwargs, dict) and is_true(kwargs.get("sync_each_batch")) \
            and str(doc.get("gradient_accumulation_steps", 1)) not in ("1", "None"):
        # transformers 5.23.0 trainer.py lines 1897-1901: the gradients synchronized on every micro-batch, where
        # the FSDP readers say accumulation without sync (the fsdp rule's gradient_sync; docs/launch-hf.md)
        r.refuse(f"{p}accelerator_config.gradient_accumulation_kwargs.sync_each_batch", True, "false",
                 "syncing every micro-batch under gradient accumulation is not read (FSDP is priced as "
                 "accumulating without sync)")
    if is_true(get("auto_find_batch_size")):
        r.refuse(f"{p}auto_find_batch_size", True, "false", "the batch is found at run time by retrying after OOM")
    # Precision: autocast from bf16/fp16; the weights' dtype from dtype/torch_dtype.
    bf16, fp16 = get("bf16"), get("fp16")
    if bf16 is None and trl:
        mixed = "fp16" if is_true(fp16) else "bf16"
        if mixed == "bf16":
            r.default(f"{p}bf16", "precision", "bf16", f"{TRL_SOURCE} trl/trainer/base_config.py: bf16 = not fp16",
                      version=TRL)
    else:
        mixed = "bf16" if is_true(bf16) else "fp16" if is_true(fp16) else None
    for k, v in (("bf16", bf16), ("fp16", fp16)):
        if v is not None:
            if is_true(v):
                r.set(f"{p}{k}", v, "precision", k, "torch.autocast " + k)
            else:
                r.ignore(f"{p}{k}")
    if "tf32" in doc:
        r.ignore(f"{p}tf32")
    dtype_key = next((k for k in ("dtype", "torch_dtype") if k in doc), None)
    init = get("model_init_kwargs") if isinstance(get("model_init_kwargs"), dict) else {}
    if dtype_key is None and "dtype" in init:
        dtype_key, dtype_val = "model_init_kwargs.dtype", init["dtype"]
    else:
        dtype_val = get(dtype_key) if dtype_key else None
    if dtype_key:
        weights = _hf.DTYPES.get(str(dtype_val).lower())
        if weights is None:
            r.refuse(f"{p}{dtype_key}", dtype_val, "bfloat16, float16, float32 or auto", "unknown dtype")
        if weights == "auto":
            weights = "bf16"
        r.note(f"{p}{dtype_key}", dtype_val, f"the model's weights in {weights} (the regime below, unless a "
               "DeepSpeed or FSDP config recasts them)")
        src = f"{p}{dtype_key} + bf16/fp16"
    elif trl:
        weights, src = "fp32", f"{TRL_SOURCE} trl/trainer/utils.py create_model_from_path: dtype defaults to float32"
    else:
        weights = model_dtype_default or "bf16"
        src = ("transformers 5.x from_pretrained(dtype='auto'): the checkpoint's dtype, assumed bf16 (the model is "
               "loaded by the user's script)")
    regime = _hf.regime_of(weights, mixed)
    given = [k for k in ("bf16", "fp16") if k in doc] + ([dtype_key] if dtype_key else [])
    if given:     # read from the file, but a DeepSpeed or FSDP config (another file) recasts the model: theirs wins
        r.seen.update(f"{p}{k}" for k in given)
        value = {k: dtype_val if k == dtype_key else get(k) for k in given}
        # the autocast: the run's mixed precision, this file's bf16/fp16 true, else accelerate's (_hf.MIXED_PRECEDENCE)
        r.derived(" + ".join(f"{p}{k}" for k in given), value, "regime", lambda run: (
            _hf.regime_of(weights, run), f"{src}; autocast: the run's mixed precision ({_hf.MIXED_PRECEDENCE}); a "
            "DeepSpeed or FSDP config (another file) recasts the model and wins"), own=mixed, yields=True)
    else:
        r.default(f"{p}bf16/fp16 + model dtype", "regime", regime, src, "when no DeepSpeed or FSDP config (another "
                  "file) casts the model; theirs wins", version=TRL if trl else TRANSFORMERS)
    # Optimizer.
    if "optim" in doc:
        _hf.optimizer(r, f"{p}optim", doc["optim"])
    else:
        _hf.default_optimizer(r, f"{p}optim")
    if get("optim_args"):
        r.refuse(f"{p}optim_args", doc["optim_args"], "empty", "optimizer arguments (momentum, ...) that may add "
                 "state: not modelled")
    elif "optim_args" in doc:
        r.ignore(f"{p}optim_args")
    # Activation checkpointing.
    ck_key = next((k for k in ("activation_checkpointing", "gradient_checkpointing") if k in doc), None)
    if ck_key:
        value = doc[ck_key]
        r.set(f"{p}{ck_key}", value, "activation_checkpointing", "full" if is_true(value) else "none",
              "every decoder layer recomputed (transformers' gradient_checkpointing_enable)" if is_true(value) else "")
        other = {"activation_checkpointing", "gradient_checkpointing"} - {ck_key}
        for k in other & set(doc):
            r.ignore(f"{p}{k}")
    elif trl:
        r.default(f"{p}gradient_checkpointing", "activation_checkpointing", "full",
                  f"{TRL_SOURCE} trl/trainer/base_config.py: gradient_checkpointing = True", version=TRL)
    else:
        r.default(f"{p}gradient_checkpointing", "activation_checkpointing", "none",
                  f"{TA_SOURCE}: activation_checkpointing None -> False", version=TRANSFORMERS)
    for k in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
        if k in doc:
            _ck_kwargs(r, f"{p}{k}", doc[k])
    # Sequence (TRL).
    if trl:
        len_key = next((k for k in ("max_length", "max_seq_length") if k in doc), None)
        packed = is_true(get("packing")) or is_true(get("padding_free"))
        pk = f"{p}packing" if "packing" in doc else f"{p}padding_free" if "padding_free" in doc else f"{p}packing"
        for k in ("packing", "padding_free", "packing_strategy"):
            if k in doc:
                r.ignore(f"{p}{k}") if k != "packing_strategy" else r.ignore(f"{p}{k}")
        if len_key and doc[len_key] is not None:
            _hf.sequence(r, f"{p}{len_key}", whole(r, f"{p}{len_key}", doc[len_key]), packed, pk)
        elif len_key is None:
            _hf.sequence(r, f"{p}max_length", 1024, packed, pk,
                         default_source=f"{TRL_SOURCE} trl/trainer/sft_config.py: max_length = 1024")
        else:
            r.ignore(f"{p}{len_key}")
        if is_true(get("padding_free")) and not is_true(get("packing")):
            r.notes.append("padding_free: the batch's sequences concatenated without padding; priced as packed rows "
                           "of max_length (an upper bound)")
    # Attention, kernels, compile.
    attn_key = next((k for k in ("attn_implementation",) if k in doc), None)
    if attn_key:
        _hf.attention(r, f"{p}{attn_key}", doc[attn_key])
    liger = is_true(get("use_liger_kernel"))
    if liger:
        r.set(f"{p}use_liger_kernel", True, "loss", "fused_linear", "Liger's fused linear cross-entropy "
              "(transformers' _apply_liger_kernel_to_instance: LigerForCausalLMLoss, no logits)")
        r.notes.append(f"{p}use_liger_kernel=True: Liger's RMSNorm/RoPE/SwiGLU kernels are applied too; what they "
                       "save against the eager ops is not priced (an upper bound)")
    elif "use_liger_kernel" in doc:
        r.ignore(f"{p}use_liger_kernel")
    # TRL's loss_type (trl/trainer/sft_config.py; sft_trainer.py lines 1287-1326): unset -> "chunked_nll"
    # unless use_liger_kernel, then "nll"; "chunked_nll" is refused by TRL with Liger.
    if trl or "loss_type" in doc:
        loss_type = get("loss_type")
        if loss_type is None and trl and not liger:
            r.default(f"{p}loss_type", "loss", "trl_chunked_nll", f"{TRL_SOURCE} trl/trainer/sft_config.py: "
                      "loss_type unset -> 'chunked_nll' unless use_liger_kernel (__post_init__)", version=TRL)
        elif loss_type == "chunked_nll":
            if liger:
                r.refuse(f"{p}loss_type", loss_type, "nll with use_liger_kernel", "TRL raises: `loss_type="
                         "'chunked_nll'` is not compatible with `use_liger_kernel=True` (sft_trainer.py)")
            r.set(f"{p}loss_type", loss_type, "loss", "trl_chunked_nll", f"{TRL_SOURCE} trl/trainer/sft_trainer.py "
                  "_chunked_cross_entropy_loss: valid tokens first, 256-token checkpointed chunks of fp32 logits")
        elif loss_type == "nll":
            if liger:
                r.ignore(f"{p}loss_type")
            else:
                r.set(f"{p}loss_type", loss_type, "loss", "cross_entropy", "TRL's nll: the model's own loss "
                      "(transformers ForCausalLMLoss)")
        elif loss_type is not None:
            r.refuse(f"{p}loss_type", loss_type, "chunked_nll or nll", "TRL's dft loss (probability-weighted: "
                     "extra logits-sized tensors) is not modelled")
    if "liger_kernel_config" in doc:
        if get("liger_kernel_config"):
            r.note(f"{p}liger_kernel_config", doc["liger_kernel_config"], "priced as use_liger_kernel")
        else:
            r.ignore(f"{p}liger_kernel_config")
    if is_true(get("torch_compile")):     # Trainer: the whole model torch.compile'd (docs/compile.md)
        r.set(f"{p}torch_compile", doc["torch_compile"], "compile", True, "torch.compile of the whole model")
    elif "torch_compile" in doc:
        r.ignore(f"{p}torch_compile")
    for k in ("torch_compile_backend", "torch_compile_mode"):
        if get(k) and get(k) not in ("inductor", "default"):
            r.refuse(f"{p}{k}", doc[k], "inductor / default / unset", "a compile backend or mode other than Inductor's "
                     "defaults: not modelled (docs/compile.md)")
        elif k in doc:
            r.ignore(f"{p}{k}")
    if "activation_offloading" in doc:
        if is_true(doc["activation_offloading"]):
            r.set(f"{p}activation_offloading", True, "activation_offload", "torchtune",
                  "TRL's activation offloading (torchtune's OffloadActivations)")
        else:
            r.ignore(f"{p}activation_offloading")
    if is_true(get("use_cpu")):
        r.refuse(f"{p}use_cpu", True, "false", "training on the CPU: not an accelerator's memory")
    elif "use_cpu" in doc:
        r.ignore(f"{p}use_cpu")
    if get("ddp_bucket_cap_mb") is not None:
        r.approx(f"{p}ddp_bucket_cap_mb", doc["ddp_bucket_cap_mb"], "communication_buffer_fraction", 0.05,
                 "DDP's bucket cap: the measured profile prices PyTorch's default 25 MB buckets")
    elif "ddp_bucket_cap_mb" in doc:
        r.ignore(f"{p}ddp_bucket_cap_mb")
    if get("parallelism_config"):
        r.refuse(f"{p}parallelism_config", doc["parallelism_config"], "unset (give the accelerate YAML's "
                 "parallelism_config)", "an accelerate ParallelismConfig object in TrainingArguments: not read here")
    elif "parallelism_config" in doc:
        r.ignore(f"{p}parallelism_config")
    # PEFT (TRL ModelConfig).
    _peft(r, doc, p)
    # FSDP and DeepSpeed inside the arguments.
    if get("fsdp"):
        _fsdp_arg(r, f"{p}fsdp", doc["fsdp"], get("fsdp_config") or {}, mixed)
    else:
        for k in ("fsdp", "fsdp_config"):
            if k in doc:
                r.ignore(f"{p}{k}")
    if get("deepspeed"):
        _hf.read_deepspeed_file(r, f"{p}deepspeed", doc["deepspeed"], trainer={"mixed": mixed}, model=model)
    elif "deepspeed" in doc:
        r.ignore(f"{p}deepspeed")
    # Everything else.
    for key, value in doc.items():
        full = f"{p}{key}"
        if full in r.seen or key in foreign:
            continue
        if key in TA_IGNORED or key in TRL_IGNORED:
            r.ignore(full)
        elif key in ("dtype", "torch_dtype", "attn_implementation", "max_length", "max_seq_length"):
            continue
        else:
            r.unknown(full, value, "TrainingArguments (transformers 5.23.0), TRL 1.9's SFTConfig/ModelConfig/"
                      "ScriptArguments keys")
    return model, mixed


def _ck_kwargs(r: Reading, key, value):
    r.seen.add(key)
    if not isinstance(value, dict):
        if value in (None, "", {}):
            r.ignore(key)
            return
        r.refuse(key, value, "a table", "not a table of checkpoint arguments")
    for k, v in value.items():
        if k == "use_reentrant":
            r.note(f"{key}.{k}", v, "reentrant or not, the same tensors are saved (priced the same)")
        elif k in ("preserve_rng_state", "determinism_check", "debug"):
            r.ignore(f"{key}.{k}")
        else:
            r.refuse(f"{key}.{k}", v, "use_reentrant, preserve_rng_state", "a checkpointing option (offload, every "
                     "n-th layer, ...) not read by this reader")
    if not value:
        r.ignore(key)


def _peft(r: Reading, doc: dict, p: str):
    get = doc.get
    q = None
    if is_true(get("load_in_4bit")):
        q = str(get("bnb_4bit_quant_type", "nf4")).lower()
        if q not in ("nf4", "fp4"):
            r.refuse(f"{p}bnb_4bit_quant_type", q, "nf4 or fp4", "unknown 4-bit type")
    elif is_true(get("load_in_8bit")):
        q = "int8"
    for k in ("load_in_4bit", "load_in_8bit", "bnb_4bit_quant_type", "use_bnb_nested_quant"):
        if k in doc:
            r.seen.add(f"{p}{k}")
    if "bnb_4bit_quant_storage" in doc and not (q in ("nf4", "fp4") and is_true(get("use_peft"))):
        r.ignore(f"{p}bnb_4bit_quant_storage")
    if not is_true(get("use_peft")):
        for k in ("use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save",
                  "use_dora", "lora_task_type", "use_rslora"):
            if k in doc:
                r.ignore(f"{p}{k}")
        if q:
            r.refuse(f"{p}load_in_{'8' if q == 'int8' else '4'}bit", True, "with use_peft",
                     "a quantized base trained without adapters: not modelled")
        return
    lora = {"rank": whole(r, f"{p}lora_r", get("lora_r", 16))}
    r.set(f"{p}use_peft", True, "lora", {"rank": lora["rank"]}, "peft LoRA; base frozen")
    if "lora_r" in doc:
        r.set(f"{p}lora_r", doc["lora_r"], "lora", {"rank": lora["rank"]})
    else:
        r.default(f"{p}lora_r", "lora", {"rank": 16}, f"{TRL_SOURCE} trl/trainer/model_config.py: lora_r = 16",
                  version=TRL)
    if get("lora_target_modules"):
        targets = _hf.lora_targets(doc["lora_target_modules"])
        r.set(f"{p}lora_target_modules", doc["lora_target_modules"], "lora", {"target_modules": targets})
    elif "lora_target_modules" in doc:
        r.ignore(f"{p}lora_target_modules")
    if q:
        table = {"quantization": q}
        if q in ("nf4", "fp4"):
            table["double_quant"] = is_true(get("use_bnb_nested_quant"))
        r.set(f"{p}load_in_{'8' if q == 'int8' else '4'}bit", True, "lora", table, "QLoRA: bitsandbytes " + q)
        if q in ("nf4", "fp4"):
            _quant_storage(r, doc, p)
    if get("lora_modules_to_save"):
        r.set(f"{p}lora_modules_to_save", doc["lora_modules_to_save"], "lora",
              {"modules_to_save": _hf.lora_targets(doc["lora_modules_to_save"])},
              "peft modules_to_save: a trainable copy of each, its gradients and optimizer state")
    if is_true(get("use_dora")):
        r.set(f"{p}use_dora", True, "lora", {"use_dora": True}, "DoRA: magnitude vectors and the weight norm")
    if get("lora_dropout"):
        _recipes.lora_dropout(r, f"{p}lora_dropout", doc["lora_dropout"])
    for k in ("lora_alpha", "lora_task_type", "use_rslora", "use_dora", "lora_dropout", "lora_modules_to_save"):
        if k in doc:
            r.seen.add(f"{p}{k}")


FSDP_RULES = ("fsdp", "fsdp-grad-op", "hsdp")


def _quant_storage(r: Reading, doc: dict, p: str):
    """TRL's ``bnb_4bit_quant_storage`` (huggingface/trl@f2cd5771 trl/trainer/model_config.py line 168: None, i.e.
    bitsandbytes' uint8; trl/trainer/utils.py line 242 hands it to BitsAndBytesConfig). The packed codes' bytes are
    the same in any storage dtype; under FSDP it decides what FSDP can do with them: a 16-bit storage is flattened
    and sharded with the base's 16-bit parameters under a policy in that dtype (_hf.fsdp_regime: fsdp-bf16-stored),
    uint8 is not (FSDP1 flattens tensors of one dtype only; accelerate 1.16.0 leaves FSDP2's non-floating Params4bit
    unsharded, utils/fsdp_utils.py lines 780-783): refused under FSDP, the rule the run's files give
    (``data_parallel``, resolved after the merge)."""
    key, value = f"{p}bnb_4bit_quant_storage", doc.get("bnb_4bit_quant_storage")
    storage = _hf.DTYPES.get(str(value).lower()) if value is not None else None
    if value is not None and storage not in ("bf16", "fp16", "fp32"):
        r.refuse(key, value, "bfloat16, float16 or float32 (unset: uint8)", "unknown storage dtype")

    def resolve(merged):
        rule = merged.get("data_parallel")
        if rule in FSDP_RULES and storage not in ("bf16", "fp16"):
            raise NotModelledError(f"{r.path}: {key}", value, f"bfloat16 or float16 under FSDP (rule {rule})",
                                   ("bitsandbytes' uint8 storage (unset)" if value is None else f"{value} storage")
                                   + " under FSDP: FSDP1 flattens tensors of one dtype only, accelerate 1.16.0 leaves "
                                   "FSDP2's non-floating Params4bit unsharded (utils/fsdp_utils.py lines 780-783); "
                                   "an fp32 storage puts the policy in fp32: not modelled")
        return {"becomes": None, "note": "the packed 4-bit codes viewed as " + (storage or "uint8") + " (the same "
                "bytes); under FSDP a 16-bit storage is sharded with the base (the FSDP regime: fsdp-bf16-stored)"}
    r.seen.add(key)
    r.fields.append(LaunchField(key=key, value=value, field="lora", derived_from=("data_parallel",),
                                derive=resolve, **resolve({"data_parallel": r.own("data_parallel")})))


def _fsdp_arg(r: Reading, key, value, cfg, mixed):
    words = value.split() if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if words is None:
        if value is True:
            words = ["full_shard"]
        else:
            r.refuse(key, value, "full_shard, shard_grad_op, hybrid_shard, offload, auto_wrap", "unknown FSDP option")
    rule = None
    for w in words:
        w = str(w).lower()
        if w in ("full_shard", "shard_grad_op", "hybrid_shard"):
            rule = {"full_shard": "fsdp", "shard_grad_op": "fsdp-grad-op", "hybrid_shard": "hsdp"}[w]
        elif w == "offload":
            r.set(f"{key}[offload]", "offload", "offload", "optimizer+gradients+parameters", "FSDP CPUOffload")
        elif w not in ("auto_wrap",):
            r.refuse(key, value, "full_shard, shard_grad_op, hybrid_shard, offload, auto_wrap",
                     f"{w}: not modelled" if w in ("no_shard", "hybrid_shard_zero2") else "unknown FSDP option")
    cfg = dict(cfg) if isinstance(cfg, dict) else {}
    if rule and not any(k in cfg for k in ("fsdp_sharding_strategy", "sharding_strategy", "reshard_after_forward",
                                            "fsdp_reshard_after_forward")):
        r.set(key, value, "data_parallel", rule)
        r.seen.add(key)
    else:
        r.seen.add(key)
    if cfg or rule:
        if cfg:     # the table's own key: each of its keys is accounted for by fsdp_config
            r.seen.add(key.replace("fsdp", "fsdp_config"))
        fsdp_rule = _hf.fsdp_config(r, key.replace("fsdp", "fsdp_config"), cfg, None) if cfg else None
        # the regime: the run's mixed precision (this file's bf16/fp16, else accelerate's: _hf.MIXED_PRECEDENCE) sets
        # the plugin's MixedPrecision (accelerate state.py lines 975-976); none: the model's own dtype (the regime above)
        r.derived(key, value, "regime", _hf.fsdp_regime(None), own=mixed, also=("lora",))
        return fsdp_rule


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="hf-trainer", description="Hugging Face TrainingArguments / TRL SFTConfig "
                             "(YAML or JSON: trl sft --config, alignment-handbook recipes)", framework=TRANSFORMERS,
                             suffixes=(".yaml", ".yml", ".json"), recognizes=recognizes, read=read)]
