"""An axolotl config YAML (``axolotl train config.yml``) as a launch format (docs/launch-hf.md):
the model, LoRA/QLoRA (bitsandbytes 4-bit nf4 with double quantization, or 8-bit), the batch,
the sequence (packing, padding to ``sequence_len``), precision, optimizer (transformers'
names), checkpointing, attention, Liger/Cut Cross-Entropy, ``fp8`` (torchao's float8 training through
accelerate: the measured profile's ``float8``), FSDP (``fsdp``/``fsdp_config``, ``fsdp_version``) and the
``deepspeed:`` JSON.

Defaults are axolotl 0.18.0's schema (axolotl-ai-cloud/axolotl at
067b021c8b87a9e5e380b9173c704cf7340e30f5, src/axolotl/utils/schemas/): ``sequence_len`` 512
(config.py:665), ``micro_batch_size`` 1 and ``gradient_accumulation_steps`` 1
(training.py:71-77), ``optimizer`` adamw_torch_fused (training.py:122),
``gradient_checkpointing`` False (config.py:600), ``bf16`` "auto" (config.py:559: bf16 on a GPU
that has it, src/axolotl/utils/config/__init__.py:156-196 resolve_dtype: the model is loaded in
bf16); 4-bit as nf4 with double quantization (src/axolotl/loaders/model.py:717-719).
"""

from __future__ import annotations

from mlsysim_core import hookimpl

from .hookspecs import LaunchFormatSpec
from . import _hf, _recipes
from ._hf import Reading, is_true, whole
from .hf_trainer import _fsdp_arg

VERSION = "axolotl 0.18.0"
REPO = "axolotl-ai-cloud/axolotl@067b021c"
CONFIG = f"{REPO} src/axolotl/utils/schemas/config.py"
TRAINING = f"{REPO} src/axolotl/utils/schemas/training.py"

IGNORED = {
    "model_type", "tokenizer_type", "tokenizer_config", "tokenizer_use_fast", "tokenizer_legacy",
    "tokenizer_use_mistral_common", "trust_remote_code", "strict", "chat_template", "special_tokens", "tokens",
    "datasets", "test_datasets", "dataset_prepared_path", "val_set_size", "output_dir", "wandb_project",
    "wandb_entity", "wandb_watch", "wandb_name", "wandb_log_model", "wandb_run_id", "mlflow_tracking_uri",
    "mlflow_experiment_name", "use_wandb", "use_mlflow", "use_tensorboard", "num_epochs", "max_steps",
    "lr_scheduler", "lr_scheduler_kwargs", "learning_rate", "warmup_ratio", "warmup_steps", "weight_decay",
    "cosine_min_lr_ratio", "cosine_constant_lr_ratio", "max_grad_norm", "adam_beta1", "adam_beta2",
    "adam_epsilon", "logging_steps", "evals_per_epoch", "eval_steps", "saves_per_epoch", "save_steps",
    "save_strategy", "save_total_limit", "save_only_model", "save_safetensors", "resume_from_checkpoint",
    "auto_resume_from_checkpoints", "early_stopping_patience", "loss_watchdog_threshold", "loss_watchdog_patience",
    "eval_sample_packing", "eval_batch_size", "eval_sequence_len", "eval_table_size", "eval_max_new_tokens",
    "do_bench_eval", "bench_dataset", "seed", "hub_model_id", "hub_strategy", "push_dataset_to_hub",
    "dataset_processes", "dataset_num_proc", "shuffle_merged_datasets", "train_on_inputs", "group_by_length",
    "tf32", "lora_alpha", "lora_fan_in_fan_out", "peft_use_rslora", "lora_model_dir", "flex_attn_compile_kwargs",
    "plugins", "debug", "dataloader_num_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "dataloader_drop_last", "ddp_timeout", "ddp_find_unused_parameters", "ddp_bucket_cap_mb_ignored",
    "special_tokens_fix", "default_system_message", "is_llama_derived_model", "is_mistral_derived_model",
    "lora_on_cpu", "gptq", "base_model_config", "revision_of_model", "hf_use_auth_token",
    "local_rank",    # set by the launcher (older configs list it empty)
}
LIGER = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm", "liger_swiglu",
         "liger_cross_entropy")


def recognizes(path, document) -> bool:
    return isinstance(document, dict) and "base_model" in document


def read(path, document, context):
    r = Reading("axolotl", path, VERSION, context)
    asked = getattr(context, "framework_version", None)
    if asked and str(asked).strip() not in VERSION:
        r.notes.append(f"--framework-version {asked}: this reader knows {VERSION}'s defaults only; those are applied")
    doc = document
    get = doc.get
    # Refusals first: what changes memory and is not modelled.
    if get("unfrozen_parameters"):
        r.refuse("unfrozen_parameters", doc["unfrozen_parameters"], "unset", "only the parameters matching these "
                 "patterns train (a partly frozen model): not modelled")
    if is_true(get("torch_compile")):     # passed to the HF Trainer, which compiles the whole model
        r.set("torch_compile", doc["torch_compile"], "compile", True, "the HF Trainer's torch.compile of the whole "
              "model (docs/compile.md)")
    elif "torch_compile" in doc:
        r.ignore("torch_compile")
    for key, why in (("relora", "ReLoRA"), ("qat", "quantization-aware training"),
                     ("activation_offloading", "axolotl's activation offloading"),
                     ("rl", "an RL/preference trainer (DPO, ORPO, KTO, GRPO: paired sequences, a reference or reward "
                      "model)"), ("reward_model", "a reward model"), ("process_reward_model", "a reward model"),
                     ("sequence_parallel_degree", "Ulysses sequence parallelism from the axolotl config"),
                     ("context_parallel_size", "ring-attention context parallelism from the axolotl config"),
                     ("tensor_parallel_size", "tensor parallelism from the axolotl config"),
                     ("dp_shard_size", None), ("lora_mlp_kernel", "axolotl's LoRA "
                      "kernels"), ("lora_qkv_kernel", "axolotl's LoRA kernels"), ("lora_o_kernel", "axolotl's LoRA "
                      "kernels"), ("unsloth_lora_mlp", "Unsloth's LoRA kernels"), ("unsloth_lora_qkv", "Unsloth's "
                      "LoRA kernels"), ("unsloth_lora_o", "Unsloth's LoRA kernels"),
                     ("unsloth_cross_entropy_loss", "Unsloth's cross-entropy"), ("s2_attention", "shifted sparse "
                      "attention"), ("xformers_attention", "xformers attention"), ("float16", "pure fp16"),
                     ("bfloat16", "the model cast to bf16 without autocast (pure bf16)"),
                     ("quantize_moe_experts", "quantized MoE experts"), ("gptq", "a GPTQ checkpoint")):
        if key in doc:
            v = doc[key]
            on = is_true(v) or (v not in (None, False, "", 0, 1, []) and not isinstance(v, bool))
            if key in ("sequence_parallel_degree", "context_parallel_size", "tensor_parallel_size", "dp_shard_size"):
                on = v not in (None, 1)
            if on and why:
                r.refuse(key, v, "unset / false" + (" / 1" if isinstance(v, int) else ""), why + ": not modelled")
            r.ignore(key)
    # The model.
    model = _recipes.model(r, "base_model", get("base_model"), context) if "base_model" in doc else None
    if get("model_config"):
        cfg = doc["model_config"]
        if isinstance(cfg, dict) and set(cfg) <= {"output_router_logits"}:
            r.note("model_config", cfg, "the router's logits returned for the auxiliary loss (tokens x experts per "
                   "layer, a few MB): not priced")
        else:
            r.refuse("model_config", cfg, "unset", "overrides of the model's config (its architecture): give the "
                     "changed config.json with -m")
    elif "model_config" in doc:
        r.ignore("model_config")
    # Adapters and quantization.
    adapter = str(get("adapter") or "").lower()
    q4, q8 = is_true(get("load_in_4bit")), is_true(get("load_in_8bit"))
    for k in ("load_in_4bit", "load_in_8bit"):
        if k in doc and not is_true(doc[k]):
            r.ignore(k)
    if adapter not in ("", "lora", "qlora"):
        r.refuse("adapter", get("adapter"), "lora or qlora", f"{adapter} adapters: not modelled")
    if (q4 or q8) and not adapter:
        r.refuse("load_in_4bit" if q4 else "load_in_8bit", True, "with adapter lora/qlora", "a quantized base "
                 "trained in full: axolotl refuses it too (schemas/peft.py:183)")
    if adapter:
        _lora(r, doc, adapter, q4, q8)
    else:
        for k in ("lora_r", "lora_dropout", "lora_target_linear", "lora_target_modules", "lora_modules_to_save",
                  "lora_target_parameters"):
            if k in doc:
                r.ignore(k)
        if "adapter" in doc:
            r.ignore("adapter")
    # The batch.
    if "micro_batch_size" in doc:
        r.set("micro_batch_size", doc["micro_batch_size"], "micro_batch_size",
              whole(r, "micro_batch_size", doc["micro_batch_size"]))
    else:
        r.default("micro_batch_size", "micro_batch_size", 1, f"{TRAINING}:77 micro_batch_size = 1")
    if "gradient_accumulation_steps" in doc:
        r.set("gradient_accumulation_steps", doc["gradient_accumulation_steps"], "gradient_accumulation_steps",
              whole(r, "gradient_accumulation_steps", doc["gradient_accumulation_steps"]))
    elif get("batch_size") is None:
        r.default("gradient_accumulation_steps", "gradient_accumulation_steps", 1,
                  f"{TRAINING}:71 gradient_accumulation_steps = 1")
    if get("batch_size") is not None:
        r.set("batch_size", doc["batch_size"], "global_batch_size", whole(r, "batch_size", doc["batch_size"]),
              "the global batch: accumulation = batch_size / (micro_batch_size x data-parallel size)")
    elif "batch_size" in doc:
        r.ignore("batch_size")
    # The sequence: packed rows, or padded to sequence_len, or the longest batch.
    length = whole(r, "sequence_len", doc["sequence_len"]) if "sequence_len" in doc else 512
    packed, padded = is_true(get("sample_packing")), is_true(get("pad_to_sequence_len"))
    for k in ("sample_packing", "pad_to_sequence_len"):
        if k in doc:
            r.note(k, doc[k], "read with sequence_len (the seq_len field)")
    src = None if "sequence_len" in doc else f"{CONFIG}:665 sequence_len = 512"
    if packed or padded:
        how = ("sample_packing: every row is sequence_len tokens" if packed else
               "pad_to_sequence_len: every batch padded to sequence_len")
        if src:
            r.default("sequence_len", "seq_len", length, src, how)
        else:
            r.set("sequence_len", doc["sequence_len"], "seq_len", length, how)
    else:
        _hf.sequence(r, "sequence_len", length, False, "sample_packing off", default_source=src)
    # Precision.
    mixed = _precision(r, doc, adapter)
    # Optimizer.
    if "optimizer" in doc:
        _hf.optimizer(r, "optimizer", doc["optimizer"])
    else:
        _hf.default_optimizer(r, "optimizer", version=VERSION, source=f"{TRAINING}:122 optimizer = "
                              "\"adamw_torch_fused\"")
    if get("optim_args"):
        r.refuse("optim_args", doc["optim_args"], "unset", "optimizer arguments that may add state: not modelled")
    elif "optim_args" in doc:
        r.ignore("optim_args")
    # Activation checkpointing.
    gc = get("gradient_checkpointing")
    if gc in ("offload", "offload_disk"):
        r.refuse("gradient_checkpointing", gc, "true or false", "checkpoints offloaded to the host/disk: not modelled")
    if "gradient_checkpointing" in doc:
        on = is_true(gc)
        r.set("gradient_checkpointing", gc, "activation_checkpointing", "full" if on else "none",
              "every decoder layer recomputed" if on else "")
    else:
        r.default("gradient_checkpointing", "activation_checkpointing", "none",
                  f"{CONFIG}:600 gradient_checkpointing = False")
    if "gradient_checkpointing_kwargs" in doc:
        kw = doc["gradient_checkpointing_kwargs"] or {}
        if not isinstance(kw, dict) or set(kw) - {"use_reentrant", "preserve_rng_state"}:
            r.refuse("gradient_checkpointing_kwargs", kw, "use_reentrant, preserve_rng_state", "a checkpointing "
                     "option not read by this reader")
        r.note("gradient_checkpointing_kwargs", kw, "reentrant or not, the same tensors are saved (priced the same)")
    # Attention.
    if "attn_implementation" in doc:
        _hf.attention(r, "attn_implementation", doc["attn_implementation"])
    for k, kernel in (("flash_attention", "flash_attention_2"), ("sdp_attention", "sdpa"),
                      ("flex_attention", "flex_attention"), ("eager_attention", "eager")):
        if k in doc:
            if is_true(doc[k]) and "attn_implementation" not in doc:
                _hf.attention(r, k, kernel)
            else:
                r.ignore(k)
    if not r.has("attention"):
        r.default("attn_implementation", "attention", "sdpa", "transformers 5.x from_pretrained: sdpa when no "
                  "attention is named", version=_hf.TRANSFORMERS)
    # Kernels and the loss: Liger, Cut Cross-Entropy.
    plugins = [str(p) for p in (get("plugins") or [])]
    cce = any("cut_cross_entropy" in p for p in plugins) and get("cut_cross_entropy", True) is not False
    if is_true(get("liger_fused_linear_cross_entropy")):
        r.set("liger_fused_linear_cross_entropy", True, "loss", "fused_linear", "Liger's fused linear "
              "cross-entropy (axolotl's LigerPlugin: liger_kernel's fused_linear_cross_entropy; no logits)")
    elif cce:
        r.set("plugins", plugins, "loss", "cut_cross_entropy", "Apple's Cut Cross-Entropy (no logits; the measured "
              "profile's cut_cross_entropy is unvalidated)")
    for k in LIGER + ("liger_fused_linear_cross_entropy", "cut_cross_entropy"):
        if k in doc and k not in r.seen:
            if is_true(doc[k]) and k in LIGER:
                r.note(k, True, "a Liger kernel: what it saves less than the eager op is not priced (an upper "
                       "bound)")
            else:
                r.ignore(k)
    # fp8: torchao's float8 training through accelerate.
    _fp8(r, doc)
    # FSDP and DeepSpeed.
    fsdp, cfg, version = get("fsdp"), get("fsdp_config"), get("fsdp_version")
    if fsdp:
        _fsdp_arg(r, "fsdp", fsdp, cfg or {}, mixed)
        if not any(f.key == "fsdp" and not f.derived_from for f in r.fields):     # (the regime: always derived)
            r.note("fsdp", doc["fsdp"], "FSDP through the trainer; the fsdp_config table sets the sharding")
    elif cfg:
        table = dict(cfg)
        if version is not None:
            table["fsdp_version"] = version
        _hf.fsdp_config(r, "fsdp_config", table, mixed)
        r.seen.add("fsdp_config")
    for k in ("fsdp", "fsdp_config", "fsdp_version"):
        if k in doc and k not in r.seen:
            r.ignore(k)
    if get("deepspeed"):
        _hf.read_deepspeed_file(r, "deepspeed", doc["deepspeed"], trainer={"mixed": mixed}, model=model)
    elif "deepspeed" in doc:
        r.ignore("deepspeed")
    if get("ddp_bucket_cap_mb") is not None:
        r.approx("ddp_bucket_cap_mb", doc["ddp_bucket_cap_mb"], "communication_buffer_fraction", 0.05,
                 "DDP's bucket cap: the measured profile prices PyTorch's default 25 MB buckets")
    elif "ddp_bucket_cap_mb" in doc:
        r.ignore("ddp_bucket_cap_mb")
    # Everything else.
    for key, value in doc.items():
        if key in r.seen:
            continue
        if key in IGNORED or key.startswith(("wandb_", "mlflow_", "comet_", "hub_", "eval_", "dataset_")):
            r.ignore(key)
        elif key in ("bf16", "fp16", "sequence_len", "micro_batch_size", "gradient_accumulation_steps"):
            r.ignore(key)
        else:
            r.unknown(key, value, f"{VERSION}'s config keys (docs/launch-hf.md lists the ones read)")
    return r.done()


FP8 = (f"{REPO} src/axolotl/core/trainers/base.py:682-700: mixed_precision='fp8', AORecipeKwargs(config="
       "Float8LinearConfig(...)), torchao's default recipe: tensorwise; monkeypatch/trainer_accelerator_args.py hands "
       "it to the Accelerator, monkeypatch/accelerate/float8_moe_filter.py keeps MoE routers out")


def _fp8(r: Reading, doc: dict) -> None:
    """``fp8: true``: axolotl hands accelerate an AORecipeKwargs (torchao float8 training, tensorwise) with no
    module filter, so accelerate's default applies (the first and last nn.Linear kept in high precision), under
    accelerate's bf16 autocast of the forward: the measured profile's float8 option (its bf16 weights are what
    the autocast computes in: the regime read from bf16). FSDP2's fp8 all-gather is refused."""
    from .accelerate import AO_FILTER, AO_RUN, AUTOCAST, ao_float8
    get = doc.get
    gather_key = "fp8_enable_fsdp_float8_all_gather"
    if not is_true(get("fp8")):
        for k in ("fp8", gather_key):
            if k in doc:
                r.ignore(k)
        return
    if is_true(get(gather_key)) and (get("fsdp") or get("fsdp_config")):
        r.refuse(gather_key, doc[gather_key], "false", "FSDP2's float8 all-gather (torchao "
                 "WeightWithDynamicFloat8CastTensor: the sharded weights cast to fp8 before the all-gather, "
                 "force_recompute_fp8_weight_in_bwd) is not modelled")
    if gather_key in doc:
        r.note(gather_key, doc[gather_key], "FSDP2's float8 all-gather: no FSDP here, nothing gathered")
    ao_float8(r, "fp8", doc["fp8"], "tensorwise", f"{AO_RUN} ({FP8}); {AO_FILTER}; {AUTOCAST}, the weights' "
              "dtype (bf16): the regime's")


def _lora(r: Reading, doc: dict, adapter: str, q4: bool, q8: bool):
    get = doc.get
    if adapter == "qlora" and not q4:
        r.refuse("adapter", "qlora", "with load_in_4bit: true", "axolotl requires load_in_4bit for qlora "
                 "(schemas/peft.py:222)")
    if "lora_r" not in doc:
        r.refuse("lora_r", None, "the adapters' rank", "adapter without lora_r (axolotl's schema has no default)")
    rank = whole(r, "lora_r", doc["lora_r"])
    r.set("adapter", doc["adapter"], "lora", {"rank": rank}, "peft LoRA; base frozen")
    r.set("lora_r", doc["lora_r"], "lora", {"rank": rank})
    if is_true(get("lora_target_linear")):
        r.set("lora_target_linear", True, "lora", {"target_modules": "all-linear"}, "every linear of the decoder "
              "layers (axolotl's find_all_linear_names; not the LM head)")
        if "lora_target_modules" in doc:
            r.note("lora_target_modules", doc["lora_target_modules"], "merged with lora_target_linear's: all linears")
    elif get("lora_target_modules"):
        r.set("lora_target_modules", doc["lora_target_modules"], "lora",
              {"target_modules": _hf.lora_targets(doc["lora_target_modules"])})
    else:
        r.refuse("lora_target_modules", get("lora_target_modules"), "a list of modules or lora_target_linear: true",
                 "no adapted modules named")
    if "lora_target_linear" in doc and not is_true(get("lora_target_linear")):
        r.ignore("lora_target_linear")
    if get("lora_modules_to_save"):
        r.set("lora_modules_to_save", doc["lora_modules_to_save"], "lora",
              {"modules_to_save": _hf.lora_targets(doc["lora_modules_to_save"])},
              "peft modules_to_save: a trainable copy of each, its gradients and optimizer state")
    elif "lora_modules_to_save" in doc:
        r.ignore("lora_modules_to_save")
    if is_true(get("peft_use_dora")):
        r.set("peft_use_dora", True, "lora", {"use_dora": True}, "DoRA: magnitude vectors and the weight norm")
    elif "peft_use_dora" in doc:
        r.ignore("peft_use_dora")
    if get("lora_target_parameters"):
        r.refuse("lora_target_parameters", doc["lora_target_parameters"], "unset", "LoRA on raw parameters (MoE "
                 "experts): not modelled")
    elif "lora_target_parameters" in doc:
        r.ignore("lora_target_parameters")
    if q4:
        r.set("load_in_4bit", True, "lora", {"quantization": "nf4", "double_quant": True},
              f"bitsandbytes nf4 with double quantization ({REPO} src/axolotl/loaders/model.py:717-719)")
    elif q8:
        r.set("load_in_8bit", True, "lora", {"quantization": "int8"}, "bitsandbytes LLM.int8")
    if "lora_dropout" in doc:
        _recipes.lora_dropout(r, "lora_dropout", doc["lora_dropout"])


def _precision(r: Reading, doc: dict, adapter: str) -> str | None:
    """axolotl loads the model in bf16 with bf16 (auto on a bf16 GPU) and the trainer autocasts:
    a full fine-tune trains bf16 weights with bf16 gradients and state (pure bf16); LoRA adapters
    are fp32 over the bf16 base (peft's autocast_adapter_dtype)."""
    get = doc.get
    src = f"{REPO} src/axolotl/utils/config/__init__.py:156-196 (resolve_dtype)"
    bf = get("bf16", "auto")
    fp16 = is_true(get("fp16"))
    if bf == "auto" and not fp16:
        mixed = "bf16"
        if "bf16" in doc:
            r.set("bf16", "auto", "precision", "bf16", "auto: bf16 on a GPU that has it (every GPU the tool prices "
                  f"from Ampere on; {src})")
        else:
            r.default("bf16", "precision", "bf16", f"{CONFIG}:559 bf16 = \"auto\"; {src}", "bf16 on a GPU that has it")
    elif is_true(bf):
        mixed = "bf16"
        r.set("bf16", bf, "precision", "bf16", "the model loaded in bf16, torch.autocast bf16")
    elif fp16:
        mixed = "fp16"
        r.set("fp16", True, "precision", "fp16", "the model loaded in fp16, torch.autocast fp16")
        if "bf16" in doc:
            r.ignore("bf16")
    else:
        mixed = None
        if "bf16" in doc:
            r.ignore("bf16")
    if "fp16" in doc and not fp16:
        r.ignore("fp16")
    load8 = is_true(get("load_in_8bit"))
    if mixed is None:
        base = "fp16" if load8 else "fp32"
        note = (f"no bf16/fp16: the model in {'fp16 (load_in_8bit)' if load8 else 'fp32'} ({src})")
        _recipes.weak(r, "bf16/fp16", None, "regime", base, note)
        return None
    if adapter:
        note = (f"the base loaded in {mixed}, the adapters in fp32 (peft's autocast_adapter_dtype) under "
                f"torch.autocast {mixed}: priced as {mixed} without autocast (the adapters' casts and each lora_A's "
                "input differ by a few MB per layer)")
        r.fields.append(_field("bf16/fp16", bf if mixed == "bf16" else True, mixed, note, approximated=True))
        r.seen.add("bf16/fp16")
        return mixed
    _recipes.weak(r, "bf16/fp16", bf if mixed == "bf16" else True, "regime", mixed,
                  f"the model loaded in {mixed} ({src}): weights, gradients and optimizer state in {mixed} (no fp32 "
                  "copy; autocast of 16-bit weights casts nothing); a DeepSpeed or FSDP config recasts it and wins")
    return mixed


def _field(key, value, regime, note, approximated=False):
    from mlsysim_core.scenario import LaunchField
    return LaunchField(key=key, value=value, field="regime", becomes=regime, note=note, approximated=approximated,
                       yields=True)


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="axolotl", description="axolotl config YAML (axolotl train; with its deepspeed: "
                             "JSON)", framework=VERSION, suffixes=(".yaml", ".yml"), recognizes=recognizes, read=read)]
