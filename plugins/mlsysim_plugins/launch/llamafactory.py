"""A LLaMA-Factory training YAML (``llamafactory-cli train recipe.yaml``) as a launch format
(docs/launch-hf.md): its model, finetuning and data arguments plus the transformers
TrainingArguments it passes through (the batch, bf16/fp16, the optimizer, ``deepspeed:`` JSON,
``fsdp``).

Defaults are LLaMA-Factory 0.9.6.dev0's (hiyouga/LLaMA-Factory at
ff6d4d12eeb035d6ce06805a5733dd7b29f2ac30), each with its file and line:

* ``finetuning_type`` lora, ``lora_rank`` 8, ``lora_target`` all (every linear of the decoder
  layers), ``stage`` sft (src/llamafactory/hparams/finetuning_args.py);
* gradient checkpointing on unless ``disable_gradient_checkpointing``
  (src/llamafactory/model/model_utils/checkpointing.py:184);
* ``quantization_bit`` 4 through bitsandbytes (``quantization_method`` bnb) as nf4 with double
  quantization (src/llamafactory/hparams/model_args.py:279-294);
* ``cutoff_len`` 2048; packing off for sft, on for pt (hparams/data_args.py:46,
  hparams/parser.py:645); a packed row is ``cutoff_len - 1`` tokens (data_args.py:189);
* the precision: the model is loaded in the compute dtype (bf16 with ``bf16``/``pure_bf16``,
  hparams/parser.py:640) and the trainable parameters are upcast to fp32 unless ``pure_bf16``,
  BAdam, or ZeRO-3 without quantization (src/llamafactory/model/adapter.py:337-349);
* ``fp8`` with ``bf16``/``fp16``: no fp8 runs (the Accelerator gets the arguments' 16-bit mixed precision;
  ``_fp8``, validation/launch_fp8/).
"""

from __future__ import annotations

from mlsysim_core import hookimpl

from .hookspecs import LaunchFormatSpec
from . import _hf, _recipes
from ._hf import Reading, is_true, whole
from .hf_trainer import TA_IGNORED, _fsdp_arg

VERSION = "LLaMA-Factory 0.9.6.dev0"
REPO = "hiyouga/LLaMA-Factory@ff6d4d12"
FT = f"{REPO} src/llamafactory/hparams/finetuning_args.py"
MA = f"{REPO} src/llamafactory/hparams/model_args.py"
DA = f"{REPO} src/llamafactory/hparams/data_args.py"

# Keys that change nothing the tool prices: data, templates, logging, hubs, export/inference
# engines, learning-rate tricks (LoRA+, rsLoRA's scaling), multimodal processors (text models).
IGNORED = {
    "template", "dataset", "eval_dataset", "dataset_dir", "media_dir", "train_on_prompt", "mask_history",
    "streaming", "buffer_size", "mix_strategy", "interleave_probs", "overwrite_cache", "preprocessing_batch_size",
    "preprocessing_num_workers", "max_samples", "eval_num_beams", "ignore_pad_token_for_loss", "val_size",
    "eval_on_each_dataset", "tool_format", "default_system", "enable_thinking", "preserve_thinking",
    "tokenized_path", "data_shared_file_system", "adapter_folder", "cache_dir", "use_fast_tokenizer",
    "split_special_tokens", "model_revision", "low_cpu_mem_usage", "trust_remote_code", "hf_hub_token",
    "ms_hub_token", "om_hub_token", "print_param_status", "infer_backend", "infer_dtype", "use_kv_cache",
    "offload_folder", "lora_alpha", "loraplus_lr_ratio", "loraplus_lr_embedding", "use_rslora", "plot_loss",
    "compute_accuracy", "disable_shuffling", "early_stopping_steps", "include_effective_tokens_per_second",
    "ray_num_workers", "ray_init_kwargs", "master_addr", "master_port", "moe_aux_loss_coef", "rope_scaling",
    "resize_vocab", "add_tokens", "add_special_tokens", "new_special_tokens_config", "init_special_tokens",
    "train_from_scratch", "quantization_device_map", "generation_max_length", "generation_num_beams",
    "predict_with_generate", "sortish_sample", "generation_config", "do_sample", "temperature", "top_p", "top_k",
    "max_new_tokens", "repetition_penalty", "length_penalty", "skip_special_tokens",
    "image_max_pixels", "image_min_pixels", "image_do_pan_and_scan", "crop_to_patches", "video_max_pixels",
    "video_min_pixels", "video_fps", "video_maxlen", "use_audio_in_video", "audio_sampling_rate",
    "enable_torch_profiler", "profiler_output_dir", "profiler_wait_steps", "profiler_warmup_steps",
    "profiler_active_steps", "profiler_repeat", "profiler_record_shapes", "profiler_profile_memory",
    "profiler_with_stack", "profile_modules", "use_reentrant_gc",
}
# Prefixes of option groups that matter only when their switch is on (the switch is read).
GROUP_PREFIXES = ("export_", "vllm_", "sglang_", "swanlab_", "galore_", "apollo_", "badam_", "oft_", "pref_",
                  "ppo_", "kto_", "simpo_", "dpo_", "ref_model", "reward_model", "freeze_", "pissa_", "kt_",
                  "megatron_bridge_", "hyper_parallel_", "asft_", "eaft_")
# Switches that change memory in ways not modelled: refused when on.
NOT_MODELLED = {
    "use_galore": "GaLore (low-rank projected optimizer state)",
    "use_apollo": "APOLLO (low-rank optimizer state)",
    "use_badam": "BAdam (block-coordinate: one block of layers trains at a time)",
    "use_adam_mini": "Adam-mini (one second moment per block; install the mlsysim-adam-mini example plugin and "
                     "give --optimizer adam-mini by hand)",
    "use_llama_pro": "LLaMA Pro (expanded, partly frozen blocks)",
    "pissa_init": "PiSSA initialisation (an SVD of every adapted weight at start-up)",
    "use_unsloth": "Unsloth's patched kernels",
    "use_unsloth_gc": "Unsloth's gradient checkpointing (checkpoints offloaded to the host)",
    "shift_attn": "LongLoRA's shifted sparse attention",
    "mixture_of_depths": "mixture of depths",
    "upcast_layernorm": "norm weights upcast to fp32",
    "upcast_lmhead_output": "the LM head's output upcast to fp32",
    "use_kt": "KTransformers (CPU experts)",
    "use_mca": "Megatron-Core adapter (mcore_adapter)",
    "use_megatron_bridge": "Megatron-Bridge training",
    "use_hyper_parallel": "hyper-parallel training",
    "use_v1_kernels": "LLaMA-Factory's v1 kernels",
    "use_dft_loss": "the DFT loss (probability-weighted: extra logits-sized tensors)",
    "use_asft_loss": "the ASFT loss",
    "use_eaft_loss": "the EAFT loss",
    "enable_torch_profiler": None,
    "freeze_vision_tower": None, "freeze_multi_modal_projector": None, "freeze_language_model":
        "a multimodal model with the language model frozen",
}
STAGES = {"sft": "supervised fine-tuning", "pt": "pre-training (causal LM on raw text)"}


def recognizes(path, document) -> bool:
    return (isinstance(document, dict) and "model_name_or_path" in document and "base_model" not in document
            and bool({"finetuning_type", "stage", "cutoff_len", "template"} & set(document)))


def read(path, document, context):
    r = Reading("llamafactory", path, VERSION, context)
    asked = getattr(context, "framework_version", None)
    if asked and str(asked).strip() not in VERSION:
        r.notes.append(f"--framework-version {asked}: this reader knows {VERSION}'s defaults only; those are applied")
    doc = document
    get = doc.get
    # The stage: what the measured profile can describe.
    stage = str(get("stage", "sft")).lower()
    if "stage" in doc:
        if stage not in STAGES:
            r.refuse("stage", get("stage"), "sft or pt", {
                "rm": "a reward model (a value head scoring chosen and rejected sequences, a pairwise batch)",
                "dpo": "DPO/ORPO/SimPO: chosen and rejected sequences in one batch, and a reference model",
                "kto": "KTO: a reference model and paired batches", "ppo": "PPO: a policy, a value head, a reward "
                "model and a reference, with generation"}.get(stage, "an unknown stage") + ": not modelled")
        r.note("stage", get("stage"), STAGES[stage])
    else:
        r.notes.append(f"stage absent: sft ({FT}: stage = \"sft\")")
    for k, why in NOT_MODELLED.items():
        if k in doc:
            if is_true(doc[k]) and why:
                r.refuse(k, doc[k], "false", why + ": not modelled")
            r.ignore(k)
    if is_true(get("torch_compile")):     # a TrainingArguments field: the HF Trainer compiles the whole model
        r.set("torch_compile", doc["torch_compile"], "compile", True, "the HF Trainer's torch.compile of the whole "
              "model (docs/compile.md)")
    elif "torch_compile" in doc:
        r.ignore("torch_compile")
    if is_true(get("auto_find_batch_size")):
        r.refuse("auto_find_batch_size", True, "false", "the batch is found at run time by retrying after OOM")
    elif "auto_find_batch_size" in doc:
        r.ignore("auto_find_batch_size")
    # The model.
    model = None
    if "model_name_or_path" in doc:
        model = _recipes.model(r, "model_name_or_path", doc["model_name_or_path"], context)
    if get("adapter_name_or_path"):
        r.note("adapter_name_or_path", doc["adapter_name_or_path"], "training continues from saved adapters: "
               "priced as new adapters of lora_rank (the same tensors)")
    elif "adapter_name_or_path" in doc:
        r.ignore("adapter_name_or_path")
    # Fine-tuning type and quantization.
    ft = str(get("finetuning_type", "lora")).lower()
    if ft in ("freeze", "oft"):
        r.refuse("finetuning_type", get("finetuning_type"), "full or lora", {
            "freeze": "partial freezing (freeze_trainable_layers of the blocks train): not modelled",
            "oft": "orthogonal fine-tuning adapters: not modelled"}[ft])
    if ft not in ("full", "lora"):
        r.refuse("finetuning_type", get("finetuning_type"), "full, lora, freeze or oft", "unknown finetuning type")
    if "finetuning_type" in doc:
        if ft == "full":
            r.note("finetuning_type", doc["finetuning_type"], "every parameter trains (no adapters)")
        else:
            r.set("finetuning_type", doc["finetuning_type"], "lora", {"rank": whole(r, "lora_rank", get("lora_rank", 8))},
                  "peft LoRA adapters; the base frozen")
    else:
        r.default("finetuning_type", "lora", {"rank": 8, "target_modules": "all-linear"},
                  f"{FT}: finetuning_type = \"lora\" (with lora_rank 8, lora_target all)")
    bits = get("quantization_bit")
    quant = None
    if bits is not None:
        method = str(get("quantization_method", "bnb")).lower()
        if method != "bnb":
            r.refuse("quantization_method", get("quantization_method"), "bnb",
                     f"on-the-fly {method} quantization: not modelled (bitsandbytes is)")
        bits = whole(r, "quantization_bit", bits)
        if bits == 4:
            qtype = str(get("quantization_type", "nf4")).lower()
            if qtype not in ("nf4", "fp4"):
                r.refuse("quantization_type", qtype, "nf4 or fp4", "unknown 4-bit type")
            quant = {"quantization": qtype, "double_quant": is_true(get("double_quantization", True))}
        elif bits == 8:
            quant = {"quantization": "int8"}
        else:
            r.refuse("quantization_bit", bits, "4 or 8 (bitsandbytes)", f"{bits}-bit quantization: not modelled")
        if ft != "lora":
            r.refuse("quantization_bit", bits, "with finetuning_type lora", "a quantized base trained in full: "
                     "LLaMA-Factory refuses it too (model/adapter.py: \"Quantized models can only be used for the "
                     "LoRA or OFT tuning\")")
    for k in ("quantization_method", "quantization_type", "double_quantization"):
        if k in doc:
            if not quant:
                r.ignore(k)
            elif k == "quantization_method":
                r.note(k, doc[k], "bitsandbytes on-the-fly quantization (the quantization_bit field below)")
            else:
                r.set(k, doc[k], "lora", {"quantization": quant["quantization"]} if k == "quantization_type" else
                      {"double_quant": quant.get("double_quant", False)})
    if ft == "lora":
        _lora(r, doc, quant)
    else:
        for k in ("lora_rank", "lora_target", "lora_dropout", "additional_target"):
            if k in doc:
                r.ignore(k)
    # The batch.
    if "per_device_train_batch_size" in doc:
        r.set("per_device_train_batch_size", doc["per_device_train_batch_size"], "micro_batch_size",
              whole(r, "per_device_train_batch_size", doc["per_device_train_batch_size"]))
    else:
        r.default("per_device_train_batch_size", "micro_batch_size", 8, _hf.TA_SOURCE, version=_hf.TRANSFORMERS)
    if "gradient_accumulation_steps" in doc:
        r.set("gradient_accumulation_steps", doc["gradient_accumulation_steps"], "gradient_accumulation_steps",
              whole(r, "gradient_accumulation_steps", doc["gradient_accumulation_steps"]))
    else:
        r.default("gradient_accumulation_steps", "gradient_accumulation_steps", 1, _hf.TA_SOURCE,
                  version=_hf.TRANSFORMERS)
    # The sequence.
    _sequence(r, doc, stage)
    # Precision.
    mixed = _precision(r, doc, ft, quant)
    # Optimizer.
    if is_true(get("use_muon")):
        r.approx("use_muon", True, "optimizer", "muon", "LLaMA-Factory's Muon (Muon on the 2-D hidden matrices, "
                 "AdamW on the rest): the state as torch.optim.Muon's; its step's transients as torch's")
        if "optim" in doc:
            r.ignore("optim")
    elif "optim" in doc:
        _hf.optimizer(r, "optim", doc["optim"])
    else:
        _hf.default_optimizer(r, "optim", version=f"{VERSION} (transformers >=4.55,<=5.8: {REPO} pyproject.toml:43)")
    if "use_muon" in doc:
        r.seen.add("use_muon")
    if get("optim_args"):
        r.refuse("optim_args", doc["optim_args"], "empty", "optimizer arguments that may add state: not modelled")
    elif "optim_args" in doc:
        r.ignore("optim_args")
    # Activation checkpointing (on by default).
    if "disable_gradient_checkpointing" in doc:
        off = is_true(doc["disable_gradient_checkpointing"])
        r.set("disable_gradient_checkpointing", doc["disable_gradient_checkpointing"], "activation_checkpointing",
              "none" if off else "full", "" if off else "every decoder layer recomputed")
    elif is_true(get("gradient_checkpointing")):
        r.set("gradient_checkpointing", True, "activation_checkpointing", "full")
    else:
        r.default("disable_gradient_checkpointing", "activation_checkpointing", "full",
                  f"{REPO} src/llamafactory/model/model_utils/checkpointing.py:184 (disable_gradient_checkpointing = "
                  "False: gradient_checkpointing_enable on every model that supports it)")
    for k in ("gradient_checkpointing", "gradient_checkpointing_kwargs"):
        if k in doc and k not in r.seen:
            r.ignore(k)
    # Attention, kernels.
    attn = str(get("flash_attn", "auto")).lower()
    if "flash_attn" in doc:
        if attn == "auto":
            r.set("flash_attn", doc["flash_attn"], "attention", "sdpa", "auto: transformers' default (sdpa)")
        else:
            _hf.attention(r, "flash_attn", {"fa2": "flash_attention_2", "fa3": "flash_attention_3"}.get(attn, attn))
    else:
        r.default("flash_attn", "attention", "sdpa", f"{MA}:117 flash_attn = auto (transformers picks sdpa)")
    if is_true(get("enable_liger_kernel")):
        r.set("enable_liger_kernel", True, "loss", "fused_linear", f"Liger's fused linear cross-entropy ({REPO} "
              "src/llamafactory/model/model_utils/liger_kernel.py: fused_linear_cross_entropy kept for the sft and pt "
              "stages, require_logits=False; no logits)")
        r.notes.append("enable_liger_kernel=True: Liger's RMSNorm/RoPE/SwiGLU kernels are applied too; what they save "
                       "against the eager ops is not priced (an upper bound)")
    elif "enable_liger_kernel" in doc:
        r.ignore("enable_liger_kernel")
    _fp8(r, doc)
    # Distributed: DeepSpeed and FSDP through the trainer arguments.
    if get("deepspeed"):
        _hf.read_deepspeed_file(r, "deepspeed", doc["deepspeed"], trainer={"mixed": mixed}, model=model)
    elif "deepspeed" in doc:
        r.ignore("deepspeed")
    if get("fsdp"):
        _fsdp_arg(r, "fsdp", doc["fsdp"], get("fsdp_config") or {}, mixed)
        if not any(f.key == "fsdp" for f in r.fields):
            r.note("fsdp", doc["fsdp"], "FSDP through the trainer; the fsdp_config table sets the sharding")
    else:
        for k in ("fsdp", "fsdp_config"):
            if k in doc:
                r.ignore(k)
    # Everything else.
    for key, value in doc.items():
        if key in r.seen:
            continue
        if key in IGNORED or key in TA_IGNORED or key.startswith(GROUP_PREFIXES) or key.startswith("fp8_"):
            r.ignore(key)     # (an option group's keys: its switch, use_galore, finetuning_type, fp8, ... was read)
        elif key in ("bf16", "fp16", "pure_bf16", "tf32", "cutoff_len", "packing", "neat_packing"):
            r.ignore(key)
        else:
            r.unknown(key, value, f"LLaMA-Factory {VERSION}'s model, data, finetuning and training arguments "
                      "(docs/launch-hf.md)")
    return r.done()


def _lora(r: Reading, doc: dict, quant):
    get = doc.get
    if "lora_rank" in doc:
        r.set("lora_rank", doc["lora_rank"], "lora", {"rank": whole(r, "lora_rank", doc["lora_rank"])})
    else:
        r.default("lora_rank", "lora", {"rank": 8}, f"{FT}: lora_rank = 8")
    if "lora_target" in doc:
        targets = _hf.lora_targets(doc["lora_target"])
        r.set("lora_target", doc["lora_target"], "lora", {"target_modules": targets},
              "every linear of the decoder layers (peft's all-linear; not the LM head)" if targets == "all-linear"
              else "")
    else:
        r.default("lora_target", "lora", {"target_modules": "all-linear"}, f"{FT}: lora_target = \"all\"",
                  "every linear of the decoder layers")
    if quant:
        key = "quantization_bit"
        note = "bitsandbytes " + quant["quantization"] + (" with double quantization" if quant.get("double_quant")
                                                           else "")
        r.set(key, get(key), "lora", quant, note)
        if quant["quantization"] != "int8" and "double_quantization" not in doc:
            r.default("double_quantization", "lora", {"double_quant": True}, f"{MA}:291 double_quantization = True")
        if "quantization_type" not in doc and quant["quantization"] != "int8":
            r.default("quantization_type", "lora", {"quantization": "nf4"}, f"{MA}:287 quantization_type = \"nf4\"")
    if get("additional_target"):     # comma-separated module names -> peft modules_to_save
        r.set("additional_target", doc["additional_target"], "lora",
              {"modules_to_save": _hf.lora_targets(doc["additional_target"])},
              "peft modules_to_save: a trainable copy of each, its gradients and optimizer state")
    elif "additional_target" in doc:
        r.ignore("additional_target")
    if is_true(get("use_dora")):
        r.set("use_dora", True, "lora", {"use_dora": True}, "DoRA: magnitude vectors and the weight norm")
    elif "use_dora" in doc:
        r.ignore("use_dora")
    if "lora_dropout" in doc:
        _recipes.lora_dropout(r, "lora_dropout", doc["lora_dropout"])


def _sequence(r: Reading, doc: dict, stage: str):
    get = doc.get
    neat = is_true(get("neat_packing"))
    packing_given = "packing" in doc and get("packing") is not None
    packed = neat or (is_true(get("packing")) if packing_given else stage == "pt")
    key = "neat_packing" if neat else "packing"
    why = (f"{key}: true" if (neat or packing_given) else
           f"packing unset: on for stage pt ({REPO} src/llamafactory/hparams/parser.py:645)" if packed else
           f"packing unset: off for stage {stage} ({REPO} src/llamafactory/hparams/parser.py:645)")
    for k in ("packing", "neat_packing"):
        if k in doc:
            r.note(k, doc[k], "read with cutoff_len (the seq_len field)")
    if "cutoff_len" in doc:
        length = whole(r, "cutoff_len", doc["cutoff_len"])
        source = None
    else:
        length, source = 2048, f"{DA}:46 cutoff_len = 2048"
    if packed:     # data_args.py:189: cutoff_len -= 1 with packing
        note = f"packed ({why}): every row is cutoff_len - 1 = {length - 1} tokens ({DA}:189)"
        if source:
            r.default("cutoff_len", "seq_len", length - 1, source, note)
        else:
            r.set("cutoff_len", doc["cutoff_len"], "seq_len", length - 1, note)
    else:
        _hf.sequence(r, "cutoff_len", length, packed, why, default_source=source)
    if neat:
        r.notes.append("neat_packing: packed rows without cross-attention between sequences (varlen kernels): the "
                       "activations are the packed row's")


FP8 = f"{REPO} src/llamafactory/train/fp8_utils.py"
TF_ARGS = ("transformers 5.8.0 (LLaMA-Factory's newest allowed, pyproject.toml:43) and 5.23.0: trainer.py "
           "_build_accelerator_args passes the arguments' mixed_precision, set from bf16/fp16 when they were parsed "
           "(training_args.py: 'self.mixed_precision = os.environ.get(\"ACCELERATE_MIXED_PRECISION\", \"no\"); "
           "if self.fp16: ...fp16; elif self.bf16: ...bf16')")


def _fp8(r: Reading, doc: dict) -> None:
    """``fp8``: what LLaMA-Factory runs for it. ``fp8_backend: te``: a TransformerEngine recipe forced into the
    Accelerator (refused). Otherwise (auto, torchao) ``configure_fp8_environment`` only sets
    ACCELERATE_MIXED_PRECISION=fp8 when the trainer is built; the AORecipeKwargs (rowwise, its own filter) that
    ``create_fp8_kwargs`` builds are logged, never handed to the Accelerator; and the Trainer gives the
    Accelerator the mixed precision its arguments were parsed with: bf16 or fp16 when the file says so, and
    fp8 never runs (measured: transformers 5.23.0 / accelerate 1.16.0, fp8_enabled False). Without bf16/fp16 it
    runs only if the launcher set ACCELERATE_MIXED_PRECISION=fp8 before: not in the file, refused."""
    get = doc.get
    keys = [k for k in ("fp8", "fp8_backend", "fp8_enable_fsdp_float8_all_gather") if k in doc]
    on = is_true(get("fp8")) or is_true(get("fp8_enable_fsdp_float8_all_gather"))     # parser.py:543-550
    if not on:
        for k in keys:
            r.ignore(k)
        return
    key = "fp8" if is_true(get("fp8")) else "fp8_enable_fsdp_float8_all_gather"
    backend = str(get("fp8_backend", "auto")).strip().lower()
    if backend == "te":
        r.refuse("fp8_backend", doc["fp8_backend"], "auto or torchao", "TransformerEngine through accelerate: "
                 f"patch_accelerator_for_fp8 forces mixed_precision fp8 with TERecipeKwargs(fp8_format HYBRID, "
                 f"amax_history_len 16) ({FP8}:185-232); the measured profile's float8='transformer-engine' describes "
                 "Megatron-Core's layers only")
    if not (is_true(get("bf16")) or is_true(get("fp16"))):
        r.refuse(key, doc[key], "false, or with bf16/fp16 true (then fp8 does not run)", "whether fp8 runs depends on "
                 "ACCELERATE_MIXED_PRECISION as the launcher set it before the arguments were parsed (accelerate "
                 f"launch --mixed_precision fp8), not on the file ({FP8}:120-152 sets it only when the trainer is "
                 f"built; {TF_ARGS})")
    half = "bf16" if is_true(get("bf16")) else "fp16"
    r.note(key, doc[key], f"no fp8 training: {FP8}:120-152 sets ACCELERATE_MIXED_PRECISION=fp8 only when the trainer "
           f"is built, the AORecipeKwargs of create_fp8_kwargs (:29-105) are logged, not given to the Accelerator, "
           f"and the Accelerator gets {half} ({TF_ARGS}): accelerate's fp8_enabled is False (measured with transformers "
           "5.23.0 and accelerate 1.16.0); the run is the 16-bit one the other keys describe")
    for k in keys:
        if k != key:
            r.note(k, doc[k], "read with " + key + " (no fp8 training)")


def _precision(r: Reading, doc: dict, ft: str, quant) -> str | None:
    """The regime: LLaMA-Factory loads the model in the compute dtype and upcasts the trainable
    parameters to fp32 (model/adapter.py:337-349) unless pure_bf16; the trainer autocasts."""
    get = doc.get
    pure = is_true(get("pure_bf16"))
    bf16, fp16 = is_true(get("bf16")), is_true(get("fp16"))
    mixed = "bf16" if (bf16 or pure) else "fp16" if fp16 else None
    src = f"{REPO} src/llamafactory/model/adapter.py:337-349"
    for k in ("bf16", "fp16", "pure_bf16"):
        if k in doc and not is_true(doc[k]):
            r.ignore(k)
    if pure:
        r.set("pure_bf16", True, "precision", "bf16", "pure bf16: no autocast, no fp32 upcast of the trainable "
              "parameters")
        regime, note, approx = "bf16", "bf16 weights, gradients and optimizer state (no fp32 copy)", False
        if ft == "lora":
            note, approx = ("pure bf16 base; LLaMA-Factory keeps the adapters in bf16 too, the measured profile "
                            "prices them in fp32 (peft's autocast_adapter_dtype): the adapters' bytes are over"), True
        if bf16:
            r.seen.add("bf16")
        weak_regime(r, "pure_bf16", True, regime, note, approx)
        return "bf16"
    if mixed:
        r.set(mixed, True, "precision", mixed, "torch.autocast " + mixed)
    if ft == "full":
        if mixed:
            regime, note = "amp-bf16" if mixed == "bf16" else "amp-fp16", (
                f"the trainable parameters upcast to fp32 ({src}), torch.autocast {mixed}: fp32 weights, "
                "gradients and optimizer state")
        else:
            regime, note = "fp32", f"no bf16/fp16: trainable parameters upcast to fp32 ({src}), no autocast"
        weak_regime(r, mixed or "bf16/fp16 (unset)", mixed is not None, regime, note + "; a DeepSpeed or FSDP "
                    "config (this file's deepspeed:, or an accelerate file) recasts the model and wins", False)
        return mixed
    # LoRA: the base in the compute dtype (bf16 when the GPU has it), the adapters upcast to fp32.
    base = "fp16" if mixed == "fp16" else "bf16"
    note = (f"the base in {base} (the compute dtype), the adapters upcast to fp32 ({src})"
            + (f" under torch.autocast {mixed}: priced as {base} without autocast (the adapters' casts and "
               "the input of each lora_A differ by a few MB per layer)" if mixed else ", no autocast"))
    if not mixed:
        note += (f"; compute dtype inferred from the checkpoint and the GPU ({REPO} "
                 "src/llamafactory/model/patcher.py:379 infer_optim_dtype): bf16 assumed")
    weak_regime(r, mixed or "bf16/fp16 (unset)", mixed is not None, base, note, mixed is not None)
    return mixed


def weak_regime(r: Reading, key, value, regime, note, approximated):
    from mlsysim_core.scenario import LaunchField
    r.seen.add(key)
    r.fields.append(LaunchField(key=key, value=value, field="regime", becomes=regime, note=note,
                                approximated=approximated, yields=True))


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="llamafactory", description="LLaMA-Factory training YAML (llamafactory-cli "
                             "train; with its deepspeed: JSON)", framework=VERSION, suffixes=(".yaml", ".yml", ".json"),
                             recognizes=recognizes, read=read)]
