"""Megatron-Bridge launch configs (issue 26): the resolved ``ConfigContainer`` YAML.

Megatron-Bridge recipes are Python (never executed here); what a run resolved is the YAML its
``ConfigContainer.to_yaml`` writes: ``save_config_filepath`` / ``--dryrun``, and the block its
``pretrain()`` logs between ``------- Task Configuration -------`` and the dashed line before
``Training ...``. The file is read with PyYAML; its ``_target_``/``_call_``/``_args_``/``_partial_``
nodes are data (a class or function path and its arguments): never imported, never called.

The ``model:`` section holds megatron-core ``TransformerConfig`` / Megatron-Bridge
``GPTModelProvider`` fields, which are Megatron-LM's arguments under their config names
(``num_layers`` is ``--num-layers``): the reader turns the sections into that argument mapping and
reads it with the Megatron-LM reader (``megatron.read_mapping``), so a field means the same thing
in both; each field read is reported under its Bridge key. Every other key is either read, refused
(memory-relevant and not modelled, naming the key and value), or listed as ignored with the
reason (a section as a whole where none of its keys changes memory); an unknown key is refused.

Finetuning (docs/launch-megatron.md, "PEFT and finetuning datasets"): ``peft`` (Bridge's ``LoRA`` /
``CanonicalLoRA``) becomes the measured profile's ``lora`` option (``_peft``: Bridge's module names mapped
to the profile's per-projection adapters, the fused ``linear_qkv``/``linear_fc1`` approximated with the
over-count said); a ``FinetuningDatasetConfig`` / ``HFDatasetConfig`` gives the sequence from
``seq_length`` or the packing (``_finetuning_dataset``). No real dump with either was found: they are read
from the v0.1.0rc3 dataclasses, tested on a file derived from the real dump (SOURCE.md).

Sources (the versions of the published run, tests/data/launch/megatron_bridge/SOURCE.md):
NVIDIA-NeMo/Megatron-Bridge v0.1.0rc3 (bf71eba07bae8d36f08b796c106d1197d46ad541) and
NVIDIA/Megatron-LM core_v0.14.0 (23e00ed0963c35382dfe8a5a94fb3cda4d21e133).
"""

from __future__ import annotations

import re

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, MlsysimError, NotModelledError
from mlsysim_core.scenario import LaunchDefault, LaunchField

from . import megatron
from .hookspecs import LaunchFormatSpec
from ._common import as_bool, as_int

CONTAINER = "megatron.bridge.training.config.ConfigContainer"
BRIDGE_COMMIT = "bf71eba07bae8d36f08b796c106d1197d46ad541"     # NVIDIA-NeMo/Megatron-Bridge v0.1.0rc3
CORE_COMMIT = "23e00ed0963c35382dfe8a5a94fb3cda4d21e133"       # NVIDIA/Megatron-LM core_v0.14.0
VERSION = "Megatron-Bridge 0.1.0rc3 (megatron-core 0.14.0)"
BRIDGE = f"NVIDIA-NeMo/Megatron-Bridge {BRIDGE_COMMIT[:10]}"
CORE = f"NVIDIA/Megatron-LM {CORE_COMMIT[:10]}"

# megatron/core/transformer/enums.py at CORE_COMMIT: class AttnBackend(enum.Enum), the dump's
# ``AttnBackend(5)`` (``_args_: [5]``) is its value.
ATTN_BACKENDS = {1: "flash", 2: "fused", 3: "unfused", 4: "local", 5: "auto"}

# Sections none of whose keys changes a rank's memory, ignored as a whole (the reason said once).
IGNORED_SECTIONS = {
    "checkpoint": "checkpoint paths, formats and intervals: saving and loading run outside the training step",
    "logger": "logging and tensorboard/wandb settings",
    "rng": "seeds and the RNG tracker (a few bytes of state)",
    "scheduler": "the learning-rate and weight-decay schedules (scalars)",
    "tokenizer": "the tokenizer (host side; the model's vocab_size is what sizes the embedding)",
    "rerun_state_machine": "NaN/spiky-loss checks and error injection (host-side bookkeeping)",
    "ft": "fault tolerance (host side)",
    "inprocess_restart": "in-process restart (host side)",
    "nvrx_straggler": "straggler detection (host side)",
    "straggler": "straggler detection (host side)",
    "profiling": "the profiler (its traces are host side; a memory snapshot records, it does not allocate on the "
                 "device)",
    "dist": None,        # read below: FSDP switches refused, the rest ignored
}

# --- model: the keys read (Megatron-LM's argument of the same meaning) ---------------------------
MODEL_ARGS = {
    "num_layers": "--num-layers", "hidden_size": "--hidden-size", "num_attention_heads": "--num-attention-heads",
    "num_query_groups": "--num-query-groups", "kv_channels": "--kv-channels", "ffn_hidden_size": "--ffn-hidden-size",
    "normalization": "--normalization", "position_embedding_type": "--position-embedding-type",
    "seq_length": "--max-position-embeddings", "add_bias_linear": "--disable-bias-linear",
    "add_qkv_bias": "--add-qkv-bias", "share_embeddings_and_output_weights": "--untie-embeddings-and-output-weights",
    "vocab_size": "--vocab-size", "make_vocab_size_divisible_by": "--make-vocab-size-divisible-by",
    "tensor_model_parallel_size": "--tensor-model-parallel-size",
    "pipeline_model_parallel_size": "--pipeline-model-parallel-size",
    "context_parallel_size": "--context-parallel-size", "cp_comm_type": "--cp-comm-type",
    "sequence_parallel": "--sequence-parallel",
    "virtual_pipeline_model_parallel_size": "--num-layers-per-virtual-pipeline-stage",
    "recompute_granularity": "--recompute-granularity", "recompute_method": "--recompute-method",
    "recompute_num_layers": "--recompute-num-layers", "recompute_modules": "--recompute-modules",
    "hidden_dropout": "--hidden-dropout", "attention_dropout": "--attention-dropout",
    "attention_backend": "--attention-backend", "transformer_impl": "--transformer-impl",
    "cross_entropy_loss_fusion": "--cross-entropy-loss-fusion", "cross_entropy_fusion_impl": "--cross-entropy-fusion-impl",
    # uneven pipeline stages: TransformerConfig's fields of the same meaning (Megatron-LM's reader: stage_layers)
    "num_layers_in_first_pipeline_stage": "--decoder-first-pipeline-num-layers",
    "num_layers_in_last_pipeline_stage": "--decoder-last-pipeline-num-layers",
    "account_for_embedding_in_pipeline_split": "--account-for-embedding-in-pipeline-split",
    "account_for_loss_in_pipeline_split": "--account-for-loss-in-pipeline-split",
}
# model keys read alongside (not a Megatron-LM argument of their own): the GLU and its activation make
# --swiglu; should_pad_vocab decides the padding; bf16/fp16/params_dtype mirror mixed_precision.
MODEL_CHECKED = ("gradient_accumulation_fusion", "gated_linear_unit", "activation_func", "should_pad_vocab", "bf16", "fp16", "params_dtype",
                 "expert_model_parallel_size", "num_moe_experts", "multi_latent_attention", "mtp_num_layers", "fp8",
                 "fp4", "_target_")

# model keys refused unless they hold the value given here (key -> (allowed values, why)). None: unset.
_OFF = (None, False)
MODEL_REFUSED_UNLESS = {
    "cpu_offloading": (_OFF, "activation/weight CPU offloading is not modelled"),
    "enable_cuda_graph": (_OFF, "CUDA graphs (their static input/output buffers and private pool) are not modelled"),
    "external_cuda_graph": (_OFF, "CUDA graphs are not modelled"),
    "fp8_param": (_OFF, "fp8 parameters are not modelled"),
    "fp4_param": (_OFF, "fp4 parameters are not modelled"),
    "qk_layernorm": (_OFF, "QK layer norms (their parameters and saved inputs) are not modelled"),
    "fp32_residual_connection": (_OFF, "an fp32 residual stream is not modelled"),
    "fp16_lm_cross_entropy": (_OFF, "a 16-bit cross-entropy is not modelled (the loss upcasts the logits)"),
    "memory_efficient_layer_norm": (_OFF, "TransformerEngine's memory-efficient LayerNorm (it saves its output, "
                                          "not its input) is not modelled"),
    "distribute_saved_activations": (_OFF, "saved activations distributed over tp are not modelled"),
    "defer_embedding_wgrad_compute": (_OFF, "the deferred embedding weight gradient (its kept activation gradients) "
                                            "is not modelled"),
    "delay_wgrad_compute": (_OFF, "delayed weight-gradient computation is not modelled"),
    "tp_comm_overlap": (_OFF, "TransformerEngine's userbuffers for tp communication overlap are not modelled"),
    "is_hybrid_model": (_OFF, "hybrid (Mamba) models are not read"),
    "heterogeneous_block_specs": (_OFF, "heterogeneous layers are not read"),
    "use_transformer_engine_full_layer_spec": (_OFF, "TransformerEngine's full TransformerLayer is not modelled"),
    "use_te_activation_func": (_OFF, "TransformerEngine's activation modules are not modelled"),
    "activation_func_fp8_input_store": (_OFF, "an fp8 store of the activation input is not modelled"),
    "activation_func_clamp_value": (_OFF, "a clamped activation is not modelled"),
    "use_fused_weighted_squared_relu": (_OFF, "the weighted squared ReLU is not modelled"),
    "enable_autocast": (_OFF, "autocast inside the model is not modelled"),
    "use_kitchen": (_OFF, "kitchen quantization is not modelled"),
    "quant_recipe": (_OFF, "quantization recipes are not modelled"),
    "window_size": (_OFF, "sliding-window attention is not read"),
    "softmax_type": (("vanilla",), "only the vanilla softmax is read"),
    "parallel_output": ((True,), "gathering the logits over tp (parallel_output false) is not modelled"),
    "pipeline_model_parallel_layout": (_OFF, "uneven pipeline stages are not read"),
    "hierarchical_context_parallel_sizes": (_OFF, "hierarchical context parallelism is not read"),
    "num_microbatches_with_partial_activation_checkpoints": (_OFF, "partial checkpointing of micro-batches is "
                                                                   "not modelled"),
    "mrope_section": (_OFF, "multimodal RoPE is not read"),
    "mtp_enabled": (_OFF, "multi-token prediction is not read"),
    "transformer_layer_spec": (("megatron.bridge.models.gpt_provider.default_layer_spec",),
                               "a custom layer spec (Python) is not read; the default spec is Megatron-Core's GPT "
                               "layer with TransformerEngine modules (transformer_impl)"),
}
# A model key whose value matters only when another key switches its feature on: ignored while off.
MODEL_FEATURE_PREFIXES = {"fp8_": "fp8", "fp4_": "fp4", "moe_": "num_moe_experts", "mamba_": "is_hybrid_model",
                          "cuda_graph_": "enable_cuda_graph", "tp_comm_": "tp_comm_overlap",
                          "cpu_offloading_": "cpu_offloading", "mtp_": "mtp_num_layers"}
# model keys that do not change memory: initialization, RoPE's constants (its cos/sin are computed for
# the input's length), the fusions Megatron-LM's reader also ignores, pipeline p2p settings, inference-only
# settings, the Python callables the trainer sets (timers, grad sync functions), the generation config.
MODEL_IGNORED = {
    "apply_query_key_layer_scaling", "apply_residual_connection_post_layernorm",
    "apply_rope_fusion", "async_tensor_model_parallel_allreduce", "autocast_dtype", "barrier_with_L1_time",
    "batch_p2p_comm", "batch_p2p_sync", "bias_activation_fusion", "bias_dropout_fusion", "calculate_per_token_loss",
    "clone_scatter_output_in_embedding", "config_logger_dir", "deallocate_pipeline_outputs", "deterministic_mode",
    "disable_bf16_reduced_precision_matmul", "disable_parameter_transpose_cache", "embedding_init_method",
    "embedding_init_method_std", "expert_tensor_parallel_size", "finalize_model_grads_func", "first_last_layers_bf16",
    "flash_decode", "fused_single_qkv_rope", "generation_config", "glu_linear_offset", "grad_scale_func",
    "grad_sync_func", "hetereogenous_dist_checkpoint", "high_freq_factor",
    "inference_rng_tracker", "inference_sampling_seed", "init_method", "init_method_std", "init_model_with_meta_device",
    "layernorm_epsilon", "layernorm_zero_centered_gamma", "low_freq_factor", "masked_softmax_fusion",
    "microbatch_group_size_per_vp_stage", "mlp_chunks_for_prefill", "no_rope_freq", "no_sync_func",
    "num_layers_at_end_in_bf16", "num_layers_at_start_in_bf16", "old_context_len", "output_layer_init_method",
    "overlap_moe_expert_parallel_comm", "overlap_p2p_comm", "overlap_p2p_comm_warmup_flush", "param_sync_func",
    "perform_initialization", "persist_layer_norm", "pipeline_dtype", "pipeline_model_parallel_comm_backend",
    "restore_modelopt_state", "rotary_base", "rotary_interleaved", "rotary_percent", "scale_factor",
    "scatter_embedding_sequence_parallel", "seq_len_interpolation_factor", "softmax_scale", "symmetric_ar_type",
    "test_mode", "timers", "use_cpu_initialization", "use_mamba_mem_eff_path", "use_ring_exchange_p2p",
    "use_te_rng_tracker", "use_transformer_engine_op_fuser", "variable_seq_lengths", "wgrad_deferral_limit",
    "window_attn_skip_freq", "attention_softmax_in_fp32", "tp_only_amax_red",
}

# --- the other sections ----------------------------------------------------------------------------
DDP_REFUSED_UNLESS = {
    "use_custom_fsdp": (_OFF, "Megatron FSDP is not read"),
    "use_megatron_fsdp": (_OFF, "Megatron FSDP is not read"),
    "data_parallel_sharding_strategy": (("no_shard",), "only the distributed optimizer / DDP layouts are read"),
    "num_distributed_optimizer_instances": ((1,), "several distributed-optimizer instances are not modelled"),
    "fp8_param_gather": (_OFF, "fp8 parameter all-gathers are not modelled"),
    "nccl_ub": (_OFF, "NCCL user buffers are not modelled"),
    "reuse_grad_buf_for_mxfp8_param_ag": (_OFF, "MXFP8 parameter all-gathers are not modelled"),
    "delay_wgrad_compute": (_OFF, "delayed weight-gradient computation is not modelled"),
}
DDP_IGNORED = {
    "align_param_gather", "average_in_collective", "check_for_large_grads", "check_for_nan_in_grad",
    "disable_symmetric_registration", "gradient_reduce_div_fusion", "overlap_grad_reduce", "overlap_param_gather",
    # FSDP-only settings (FSDP refused above)
    "fsdp_double_buffer", "keep_fp8_transpose_cache", "outer_dp_sharding_strategy", "preserve_fp32_weights",
    "suggested_communication_unit_size",
}
MIXED_REFUSED_UNLESS = {
    "fp32": (_OFF, "fp32 training is not modelled"),
    "fp8": (_OFF, "fp8 training is not modelled"),
    "fp8_param": (_OFF, "fp8 parameters are not modelled"),
    "fp8_param_gather": (_OFF, "fp8 parameter all-gathers are not modelled"),
    "autocast_enabled": (_OFF, "autocast is not modelled"),
    "reuse_grad_buf_for_mxfp8_param_ag": (_OFF, "MXFP8 parameter all-gathers are not modelled"),
}
MIXED_IGNORED = {   # loss-scaler scalars (fp16), fp8 settings while fp8 is off, the p2p dtype
    "hysteresis", "initial_loss_scale", "loss_scale", "loss_scale_window", "min_loss_scale", "pipeline_dtype",
    "autocast_dtype", "first_last_layers_bf16", "num_layers_at_end_in_bf16", "num_layers_at_start_in_bf16",
    "fp8_amax_compute_algo", "fp8_amax_history_len", "fp8_dot_product_attention", "fp8_margin",
    "fp8_multi_head_attention", "fp8_recipe", "fp8_wgrad",
}
OPTIM_REFUSED_UNLESS = {
    "optimizer": (("adam",), "only Megatron's Adam (AdamW) is read"),
    "optimizer_cpu_offload": (_OFF, "the optimizer's CPU offload is not modelled"),
    "use_precision_aware_optimizer": (_OFF, "the precision-aware optimizer (main_grads_dtype, main_params_dtype, "
                                            "exp_avg_dtype, exp_avg_sq_dtype, store_param_remainders) is not modelled"),
    "reuse_grad_buf_for_mxfp8_param_ag": (_OFF, "MXFP8 parameter all-gathers are not modelled"),
}
# Used only by the precision-aware optimizer (megatron/core/optimizer/__init__.py and distrib_optimizer.py at
# CORE_COMMIT read them under `if config.use_precision_aware_optimizer`): with it off the state is fp32.
OPTIM_PRECISION_AWARE = ("main_grads_dtype", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
                         "store_param_remainders")
OPTIM_IGNORED = {    # hyper-parameters and scalars, CPU-offload settings while the offload is off
    "adam_beta1", "adam_beta2", "adam_eps", "barrier_with_L1_time", "clip_grad", "config_logger_dir", "decoupled_lr",
    "decoupled_min_lr", "decoupled_weight_decay", "fp8_recipe", "hysteresis", "initial_loss_scale",
    "log_num_zeros_in_grad", "loss_scale", "loss_scale_window", "lr", "min_loss_scale", "min_lr",
    "optimizer_offload_fraction", "overlap_cpu_optimizer_d2h_h2d", "overlap_param_gather",
    "overlap_param_gather_with_optimizer_step", "pin_cpu_grads", "pin_cpu_params", "sgd_momentum", "timers",
    "use_torch_optimizer_for_cpu_offload", "weight_decay", "params_dtype", "bf16", "fp16",
}
DATASET_IGNORED = {   # the loader, the data's sources and splits, its caches: host side
    "blend", "blend_per_split", "data_sharding", "dataloader_type", "drop_last_partial_validation_sequence",
    "eod_mask_loss", "full_validation", "mid_level_dataset_surplus", "mmap_bin_files", "mock",
    "multiple_validation_sets", "num_dataset_builder_threads", "num_workers", "object_storage_cache_path",
    "path_to_cache", "persistent_workers", "pin_memory", "random_seed", "reset_attention_mask", "reset_position_ids",
    "split", "split_matrix", "tokenizer", "add_extra_token_to_sequence",
}
# --- finetuning datasets (BRIDGE_COMMIT src/megatron/bridge/training/config.py FinetuningDatasetConfig and its
# DataloaderConfig; data/builders/hf_dataset.py HFDatasetConfig; data/datasets/packed_sequence.py PackedSequenceSpecs;
# data/datasets/sft.py create_sft_dataset / GPTSFTDataset / GPTSFTPackedDataset, what dataset_kwargs feeds) --------
FINETUNING_DATASETS = ("megatron.bridge.training.config.FinetuningDatasetConfig",
                       "megatron.bridge.data.builders.hf_dataset.HFDatasetConfig")
FINETUNING_DATASET_IGNORED = {   # the data's source, splits, caches and the loader's workers: host side
    "dataloader_type", "num_workers", "data_sharding", "pin_memory", "persistent_workers", "dataset_root", "seed",
    "memmap_workers", "max_train_samples", "do_validation", "do_test",
    # HFDatasetConfig: which Hugging Face dataset and how it is split and processed into the SFT files
    "dataset_name", "process_example_fn", "dataset_subset", "dataset_dict", "split", "download_mode",
    "val_proportion", "split_val_from_train", "delete_raw", "rewrite", "hf_kwargs", "hf_filter_lambda",
    "hf_filter_lambda_kwargs",
}
PACKED_IGNORED = {   # the packed files' paths and the tokenizer they were made with; cu_seqlens padding (a few ints)
    "tokenizer_model_name", "packed_train_data_path", "packed_val_data_path", "packed_metadata_path",
    "pad_cu_seqlens",
}
SFT_KWARGS_IGNORED = {   # the samples' text, template, truncation and loss mask: what fills a batch, not its size
    "add_bos", "add_eos", "add_sep", "sep_id", "label_key", "answer_only_loss", "truncation_field", "prompt_template",
    "truncation_method", "index_mapping_dir", "hf_dataset", "global_sample_mapping", "chat", "special_tokens",
    "min_seq_length", "max_num_samples", "pad_seq_length_to_mult", "ceil_to_power_2", "tokens_to_generate",
    "is_test", "output_original_text", "sanity_check_dist_workers", "return_cu_seqlen", "seed", "memmap_workers",
}
SFT_KWARGS_REFUSED_UNLESS = {
    "get_attention_mask_from_fusion": ((True,), "the collated [b, 1, s, s] attention mask moved to the device is not "
                                                "modelled"),
    "virtual_tokens": ((0,), "virtual prompt tokens (p-tuning) are not read"),
}
TRAIN_IGNORED = {
    "check_weight_hash_across_dp_replicas_interval", "decrease_batch_size_if_needed", "eval_interval", "eval_iters",
    "exit_duration_in_mins", "exit_interval", "exit_signal", "exit_signal_handler", "exit_signal_handler_for_dataloader",
    "manual_gc", "manual_gc_eval", "manual_gc_interval", "skip_train", "train_iters", "train_sync_interval",
    "rampup_batch_size", "empty_unused_memory_level",
}
DIST_REFUSED_UNLESS = {
    "use_megatron_fsdp": (_OFF, "Megatron FSDP is not read"),
    "use_torch_fsdp2": (_OFF, "PyTorch FSDP2 under Megatron is not read"),
}


def plain(value):
    """A dump's value with its ``_target_`` nodes read as data: a dtype or function reference
    (``_call_: false``) is its dotted path; ``AttnBackend(5)`` is the enum member's name; any other
    node stays the dict it is. Nothing is imported."""
    if isinstance(value, dict) and "_target_" in value:
        target = str(value["_target_"])
        if target.endswith("transformer.enums.AttnBackend") and value.get("_args_"):
            number = value["_args_"][0]
            return ATTN_BACKENDS.get(number, f"AttnBackend({number})")
        if value.get("_call_") is False and set(value) <= {"_target_", "_call_"}:
            return target
    return value


def _refuse(path, key, value, allowed, why):
    raise NotModelledError(key, value, "leave it out" if allowed == _OFF else " or ".join(map(repr, allowed)),
                           f"{path}: {why} (Megatron-Bridge)")


def _check(path, section: str, table: dict, key: str, value, walk=None) -> None:
    """A key refused unless at an allowed value; at it, the key changes nothing (listed as ignored)."""
    allowed, why = table[key]
    if plain(value) not in allowed:
        _refuse(path, f"{section}.{key}", plain(value), allowed, why)
    if walk is not None:
        walk.ignore(f"{section}.{key}")


class _Walk:
    """Every key of the container visited once: read, refused, or ignored (listed)."""

    def __init__(self, path):
        self.path, self.ignored, self.notes, self.read = path, [], [], {}
        self.seq_note = None      # a finetuning dataset's sequence rule (the seq_len field's note)

    def ignore(self, key: str) -> None:
        self.ignored.append(key)

    def unknown(self, key: str, value) -> None:
        raise InvalidInputError(key, value, "a ConfigContainer field this reader knows (docs/launch-megatron.md, "
                                "Megatron-Bridge)", f"{self.path}: {key} is not read; it is refused rather than "
                                "dropped, as it may change memory")


def _section(doc: dict, name: str, path) -> dict:
    value = doc.get(name)
    if not isinstance(value, dict):
        raise InvalidInputError(name, value, "a table (the resolved ConfigContainer's section)",
                                f"{path}: a resolved ConfigContainer has every section")
    return value


def _to_arguments(doc: dict, path, walk: _Walk, context=None) -> tuple[dict, dict]:
    """The Megatron-LM argument mapping the container means, and flag -> the Bridge key it came from."""
    args: dict = {}
    origin: dict = {}

    def put(flag, value, key):
        args[flag] = value
        origin[flag] = key

    for name in ("model", "mixed_precision", "ddp", "optimizer", "dataset", "train"):
        _section(doc, name, path)
    # --- model -------------------------------------------------------------------------------------
    model = {k: plain(v) for k, v in _section(doc, "model", path).items()}
    provider = model.get("_target_")
    for flagged in ("num_moe_experts", "multi_latent_attention", "mtp_num_layers", "fp8", "fp4"):
        if model.get(flagged) not in _OFF:
            _refuse(path, f"model.{flagged}", model[flagged], _OFF,
                    {"num_moe_experts": "Megatron's MoE layers (router, dispatcher, grouped GEMM buffers) are not read",
                     "multi_latent_attention": "multi-latent attention is not read",
                     "mtp_num_layers": "multi-token prediction is not read",
                     "fp8": "fp8 training is not modelled", "fp4": "fp4 training is not modelled"}[flagged])
    if model.get("expert_model_parallel_size", 1) not in (1, None):
        _refuse(path, "model.expert_model_parallel_size", model["expert_model_parallel_size"], (1,),
                "expert parallelism needs num_moe_experts, which is not read")
    for key in ("num_moe_experts", "multi_latent_attention", "mtp_num_layers", "fp8", "fp4",
                "expert_model_parallel_size", "_target_"):
        if key in model:
            walk.ignore(f"model.{key}")      # checked above: off (the provider class: its fields are what is read)
    for key, value in model.items():
        if key in MODEL_REFUSED_UNLESS:
            _check(path, "model", MODEL_REFUSED_UNLESS, key, value, walk)
    gated = as_bool(model.get("gated_linear_unit", False), "model.gated_linear_unit", path)
    activation = str(model.get("activation_func", ""))
    if gated and not activation.endswith(".silu"):
        _refuse(path, "model.activation_func", activation, ("torch.nn.functional.silu",),
                "a gated MLP with another activation than SiLU (SwiGLU) is not read")
    if not gated and not activation.endswith(".gelu"):
        _refuse(path, "model.activation_func", activation, ("torch.nn.functional.gelu",),
                "a plain MLP with another activation than GELU is not read")
    put("--swiglu", gated, "model.gated_linear_unit")
    # gradient_accumulation_fusion: Megatron-LM's --no-gradient-accumulation-fusion inverted (the rules' option
    # gradient_accumulation_fusion, plugins/mlsysim_plugins/megatron.py); absent: megatron-core's default, off
    # (megatron/core/model_parallel_config.py at CORE_COMMIT)
    fused = as_bool(model.get("gradient_accumulation_fusion", False), "model.gradient_accumulation_fusion", path)
    put("--no-gradient-accumulation-fusion", not fused, "model.gradient_accumulation_fusion")
    # recompute_method/num_layers belong to full recompute, recompute_modules to selective: the others unused
    # (megatron/core/transformer/transformer_config.py at CORE_COMMIT)
    granularity = model.get("recompute_granularity")
    unused = {None: ("recompute_method", "recompute_num_layers", "recompute_modules"),
              "full": ("recompute_modules",), "selective": ("recompute_method", "recompute_num_layers")}.get(granularity, ())
    for key in unused:
        if key in model:
            walk.ignore(f"model.{key}")
    if granularity is None:     # null in the dump: Megatron-LM's reader says "none" under the argument's name
        origin["--recompute-granularity"] = "model.recompute_granularity"
    for key, flag in MODEL_ARGS.items():
        if key not in model or model[key] is None or key in unused:
            if key in model and model[key] is None and key not in unused and key != "recompute_granularity":
                walk.ignore(f"model.{key}")      # null: the feature off (Megatron's default for the argument)
            continue
        value = model[key]
        if key in ("add_bias_linear", "share_embeddings_and_output_weights"):
            value = not as_bool(value, f"model.{key}", path)
        elif key == "virtual_pipeline_model_parallel_size":      # Bridge: model chunks per rank; the flag: layers
            chunks = as_int(value, f"model.{key}", path)          # per chunk
            pp = as_int(model.get("pipeline_model_parallel_size", 1), "model.pipeline_model_parallel_size", path)
            layers = as_int(model.get("num_layers"), "model.num_layers", path)
            if layers % (pp * chunks):
                _refuse(path, f"model.{key}", chunks, ("a divisor of num_layers / pp",), "uneven virtual stages")
            value = layers // (pp * chunks)
        elif key == "cp_comm_type" and as_int(model.get("context_parallel_size", 1), "model.context_parallel_size",
                                              path) == 1:
            walk.ignore("model.cp_comm_type")
            continue
        put(flag, value, f"model.{key}")
    if "num_query_groups" in model and model["num_query_groups"] is not None:
        put("--group-query-attention", True, "model.num_query_groups")
    if "position_embedding_type" in model and model.get("position_embedding_type") != "learned_absolute":
        # RoPE computes its cos/sin for the input's length (megatron/core/models/common/embeddings/
        # rotary_pos_embedding.py get_rotary_seq_len): model.seq_length sizes nothing but learned positions.
        args.pop("--max-position-embeddings", None)
        origin.pop("--max-position-embeddings", None)
        walk.ignore("model.seq_length")
    # should_pad_vocab (set by Bridge's setup from the tokenizer: training/setup.py _validate_and_set_vocab_size):
    # the provider pads vocab_size to a multiple of make_vocab_size_divisible_by x tp only when it is true
    # (models/gpt_provider.py provide()); false: the model's vocab_size as it is.
    if not as_bool(model.get("should_pad_vocab", False), "model.should_pad_vocab", path):
        tp = as_int(model.get("tensor_model_parallel_size", 1), "model.tensor_model_parallel_size", path)
        vocab = model.get("vocab_size")
        if isinstance(vocab, int) and vocab % tp:
            _refuse(path, "model.vocab_size", vocab, ("a multiple of tensor_model_parallel_size",),
                    "an unpadded vocabulary (should_pad_vocab false) that tp does not divide")
        put("--make-vocab-size-divisible-by", 1, "model.should_pad_vocab")
        if "make_vocab_size_divisible_by" in model:
            walk.ignore("model.make_vocab_size_divisible_by")
        walk.notes.append("model.should_pad_vocab false: the vocabulary is model.vocab_size unpadded "
                          f"({BRIDGE} src/megatron/bridge/models/gpt_provider.py provide()); "
                          "model.make_vocab_size_divisible_by is not used")
    walk.read["model"] = model
    for key in model:
        if key in MODEL_ARGS or key in MODEL_CHECKED or key in MODEL_REFUSED_UNLESS or key == "cp_comm_type":
            continue
        feature = next((f for p, f in MODEL_FEATURE_PREFIXES.items() if key.startswith(p)), None)
        if feature is not None and model.get(feature) in _OFF:
            walk.ignore(f"model.{key}")
        elif key in MODEL_IGNORED:
            walk.ignore(f"model.{key}")
        elif feature is not None:
            _refuse(path, f"model.{key}", model[key], _OFF, f"set while model.{feature} is on (refused above)")
        else:
            walk.unknown(f"model.{key}", model[key])

    # --- mixed precision -----------------------------------------------------------------------------
    mixed = {k: plain(v) for k, v in _section(doc, "mixed_precision", path).items()}
    for key, value in mixed.items():
        if key in MIXED_REFUSED_UNLESS:
            _check(path, "mixed_precision", MIXED_REFUSED_UNLESS, key, value, walk)
    bf16 = as_bool(mixed.get("bf16"), "mixed_precision.bf16", path)
    fp16 = as_bool(mixed.get("fp16"), "mixed_precision.fp16", path)
    if bf16:
        put("--bf16", True, "mixed_precision.bf16")
    if fp16:
        put("--fp16", True, "mixed_precision.fp16")
    wanted = "torch.bfloat16" if bf16 else "torch.float16"
    for where, table in (("mixed_precision", mixed), ("model", model),
                         ("optimizer", {k: plain(v) for k, v in doc.get("optimizer", {}).items()})):
        if table.get("params_dtype") not in (None, wanted):
            _refuse(path, f"{where}.params_dtype", table["params_dtype"], (wanted,),
                    "weights in another dtype than the mixed precision's 16-bit one are not modelled")
        for name, on in (("bf16", bf16), ("fp16", fp16)):
            if name in table and as_bool(table[name], f"{where}.{name}", path) != on:
                _refuse(path, f"{where}.{name}", table[name], (on,),
                        f"disagrees with mixed_precision.{name} (Bridge applies the mixed precision to every section)")
    for where, table in (("mixed_precision", mixed), ("model", model)):
        for key in ("params_dtype", "bf16", "fp16"):       # checked above: the mixed precision's
            if key in table and not (where == "mixed_precision" and key in ("bf16", "fp16") and table[key]):
                walk.ignore(f"{where}.{key}")
    for key in mixed:
        if key in ("_target_", "bf16", "fp16", "params_dtype", "grad_reduce_in_fp32") or key in MIXED_REFUSED_UNLESS:
            if key in ("_target_", "grad_reduce_in_fp32"):
                walk.ignore(f"mixed_precision.{key}")
            continue
        if key in MIXED_IGNORED:
            walk.ignore(f"mixed_precision.{key}")
        else:
            walk.unknown(f"mixed_precision.{key}", mixed[key])

    # --- ddp and the optimizer -----------------------------------------------------------------------
    ddp = {k: plain(v) for k, v in _section(doc, "ddp", path).items()}
    optim = {k: plain(v) for k, v in _section(doc, "optimizer", path).items()}
    for key, value in ddp.items():
        if key in DDP_REFUSED_UNLESS:
            _check(path, "ddp", DDP_REFUSED_UNLESS, key, value, walk)
    for key, value in optim.items():
        if key in OPTIM_REFUSED_UNLESS:
            _check(path, "optimizer", OPTIM_REFUSED_UNLESS, key, value, walk)
    distopt = as_bool(ddp.get("use_distributed_optimizer"), "ddp.use_distributed_optimizer", path)
    if as_bool(optim.get("use_distributed_optimizer"), "optimizer.use_distributed_optimizer", path) != distopt:
        _refuse(path, "optimizer.use_distributed_optimizer", optim.get("use_distributed_optimizer"), (distopt,),
                "disagrees with ddp.use_distributed_optimizer (Bridge's ConfigContainer.validate asserts they agree)")
    put("--use-distributed-optimizer", distopt, "ddp.use_distributed_optimizer")
    walk.ignore("optimizer.use_distributed_optimizer")       # checked: the same as ddp's
    put("--optimizer", optim.get("optimizer", "adam"), "optimizer.optimizer")
    fp32_grads = as_bool(ddp.get("grad_reduce_in_fp32", True), "ddp.grad_reduce_in_fp32", path)
    if "grad_reduce_in_fp32" in mixed and as_bool(mixed["grad_reduce_in_fp32"], "mixed_precision.grad_reduce_in_fp32",
                                                  path) != fp32_grads:
        _refuse(path, "mixed_precision.grad_reduce_in_fp32", mixed["grad_reduce_in_fp32"], (fp32_grads,),
                "disagrees with ddp.grad_reduce_in_fp32")
    if bf16:
        put("--grad-reduce-in-bf16", not fp32_grads, "ddp.grad_reduce_in_fp32")
        if fp32_grads:
            walk.notes.append("ddp.grad_reduce_in_fp32 true: the main-grad buffer is fp32 (the Megatron-Core rules' "
                              "default, no option set)")
    elif fp32_grads:
        put("--accumulate-allreduce-grads-in-fp32", True, "ddp.grad_reduce_in_fp32")
    if not as_bool(optim.get("use_precision_aware_optimizer", False), "optimizer.use_precision_aware_optimizer", path):
        for key in OPTIM_PRECISION_AWARE:
            if key in optim:
                walk.ignore(f"optimizer.{key}")
        walk.notes.append("optimizer.use_precision_aware_optimizer false: main_grads_dtype, main_params_dtype, "
                          "exp_avg_dtype, exp_avg_sq_dtype and store_param_remainders are not used (the main "
                          f"grads, master weights and Adam state are fp32: {CORE} megatron/core/optimizer/__init__.py, "
                          "distrib_optimizer.py read them under use_precision_aware_optimizer)")
    for key in ddp:
        if key in ("_target_", "use_distributed_optimizer", "grad_reduce_in_fp32") or key in DDP_REFUSED_UNLESS:
            if key == "_target_":
                walk.ignore("ddp._target_")
            continue
        if key == "bucket_size" or key == "pad_buckets_for_high_nccl_busbw":
            walk.ignore(f"ddp.{key}")
        elif key in DDP_IGNORED:
            walk.ignore(f"ddp.{key}")
        else:
            walk.unknown(f"ddp.{key}", ddp[key])
    walk.notes.append("ddp.bucket_size, ddp.overlap_grad_reduce, ddp.overlap_param_gather: the buckets are views of "
                      "the contiguous grad and param buffers, reduced and gathered in place "
                      f"({CORE} megatron/core/distributed/param_and_grad_buffer.py): no memory of their own; the "
                      "buckets' alignment padding is not counted")
    for key in optim:
        if key in ("_target_", "use_distributed_optimizer", "optimizer") or key in OPTIM_REFUSED_UNLESS \
                or key in OPTIM_PRECISION_AWARE:
            if key == "_target_":
                walk.ignore("optimizer._target_")
            continue
        if key in OPTIM_IGNORED:
            walk.ignore(f"optimizer.{key}")
        else:
            walk.unknown(f"optimizer.{key}", optim[key])

    # --- data and batch ----------------------------------------------------------------------------
    dataset = _section(doc, "dataset", path)
    if "sequence_length" in dataset:
        _pretraining_dataset(dataset, model, path, walk, put)
    elif "seq_length" in dataset:
        _finetuning_dataset(dataset, model, doc, path, walk, put, context)
    else:
        raise NotModelledError("dataset._target_", dataset.get("_target_"), "a GPTDatasetConfig (sequence_length) or "
                               "a FinetuningDatasetConfig / HFDatasetConfig (seq_length)",
                               f"{path}: a dataset config with neither sequence_length nor seq_length is not read")
    train = _section(doc, "train", path)
    put("--micro-batch-size", train.get("micro_batch_size", 1), "train.micro_batch_size")
    if train.get("global_batch_size") is not None:
        put("--global-batch-size", train["global_batch_size"], "train.global_batch_size")
    for key in train:
        if key in ("micro_batch_size", "global_batch_size"):
            continue
        if key in TRAIN_IGNORED or key == "_target_":
            walk.ignore(f"train.{key}")
        else:
            walk.unknown(f"train.{key}", train[key])
    if train.get("empty_unused_memory_level") not in (None, 0):
        walk.notes.append(f"train.empty_unused_memory_level {train['empty_unused_memory_level']}: the allocator's "
                          "cache emptied between steps (reserved memory, not the allocated peak)")
    if provider is not None:
        walk.notes.append(f"model._target_ {provider}: read as its fields (the class is not imported)")
    return args, origin


def _pretraining_dataset(dataset: dict, model: dict, path, walk: _Walk, put) -> None:
    """A GPTDatasetConfig / MockGPTDatasetConfig: every micro-batch is dataset.sequence_length tokens."""
    # The run's sequence is the data's: the GPT dataset yields micro-batches of dataset.sequence_length tokens
    # (megatron/core/datasets/gpt_dataset.py: sequence_length + add_extra_token_to_sequence tokens per sample,
    # shifted into tokens and labels); model.seq_length only sizes learned position embeddings (RoPE's are computed
    # for the input's length). Bridge's validate asks them to agree (training/config.py at BRIDGE_COMMIT); a dump
    # where they differ still ran with the data's length.
    put("--seq-length", dataset["sequence_length"], "dataset.sequence_length")
    _model_seq_note(model, dataset["sequence_length"], "dataset.sequence_length", walk)
    if as_bool(dataset.get("create_attention_mask", False), "dataset.create_attention_mask", path) and not as_bool(
            dataset.get("skip_getting_attention_mask_from_dataset", True),
            "dataset.skip_getting_attention_mask_from_dataset", path):
        _refuse(path, "dataset.skip_getting_attention_mask_from_dataset", False, (True,),
                "the dataset's [b, 1, s, s] attention mask moved to the device is not modelled")
    for key in dataset:
        if key == "sequence_length":
            continue
        if key in DATASET_IGNORED or key == "_target_" or key in ("create_attention_mask", "skip_getting_attention_mask_from_dataset"):
            walk.ignore(f"dataset.{key}")
        else:
            walk.unknown(f"dataset.{key}", dataset[key])


def _model_seq_note(model: dict, length, key: str, walk: _Walk) -> None:
    if model.get("seq_length") not in (None, length):
        walk.notes.append(f"{key} {length} is the run's sequence (what a micro-batch holds); model.seq_length "
                          f"{model['seq_length']} only sizes learned position embeddings"
                          + (" (RoPE here: it sizes nothing)" if model.get("position_embedding_type")
                             != "learned_absolute" else ""))


def _finetuning_dataset(dataset: dict, model: dict, doc: dict, path, walk: _Walk, put, context) -> None:
    """A FinetuningDatasetConfig / HFDatasetConfig (``FINETUNING_DATASETS``): the sequence a micro-batch holds, from
    seq_length and the packing (BRIDGE_COMMIT src/megatron/bridge/data/builders/finetuning_dataset.py
    ``_create_dataset``: the SFT dataset's max_seq_length is seq_length, or packed_sequence_size when packing;
    data/datasets/sft.py ``collate_fn``: a batch is padded to its longest sample rounded up to a multiple of
    pad_seq_length_to_mult (16), at most max_seq_length, or to max_seq_length with pad_to_max_length)."""
    target = dataset.get("_target_")
    if target not in FINETUNING_DATASETS:
        _refuse(path, "dataset._target_", target, tuple(FINETUNING_DATASETS),
                "a finetuning dataset config of another class (its fields unknown) is not read")
    walk.ignore("dataset._target_")
    seq = as_int(dataset["seq_length"], "dataset.seq_length", path)
    kwargs = dataset.get("dataset_kwargs") or {}
    if not isinstance(kwargs, dict):
        raise InvalidInputError("dataset.dataset_kwargs", kwargs, "a table of the SFT dataset's arguments", str(path))
    for key, value in kwargs.items():
        if key in SFT_KWARGS_IGNORED or key == "pad_to_max_length":
            walk.ignore(f"dataset.dataset_kwargs.{key}")
        elif key in SFT_KWARGS_REFUSED_UNLESS:
            _check(path, "dataset.dataset_kwargs", SFT_KWARGS_REFUSED_UNLESS, key, value, walk)
        else:
            walk.unknown(f"dataset.dataset_kwargs.{key}", value)
    if not kwargs and "dataset_kwargs" in dataset:
        walk.ignore("dataset.dataset_kwargs")
    padded = as_bool(kwargs.get("pad_to_max_length", False), "dataset.dataset_kwargs.pad_to_max_length", path)
    specs = dataset.get("packed_sequence_specs")
    if specs is not None and not isinstance(specs, dict):
        raise InvalidInputError("dataset.packed_sequence_specs", specs, "a PackedSequenceSpecs table or null", str(path))
    size = (specs or {}).get("packed_sequence_size", -1)
    packed = size is not None and as_int(size, "dataset.packed_sequence_specs.packed_sequence_size", path,
                                         minimum=-(2**62)) > 0
    for key in specs or {}:
        if key in PACKED_IGNORED or key == "_target_" or (key == "packed_sequence_size" and not packed):
            walk.ignore(f"dataset.packed_sequence_specs.{key}")
        elif key != "packed_sequence_size":
            walk.unknown(f"dataset.packed_sequence_specs.{key}", specs[key])
    if specs is None and "packed_sequence_specs" in dataset:
        walk.ignore("dataset.packed_sequence_specs")
    how = (" (dataset.dataset_kwargs.pad_to_max_length: every batch padded to it)" if padded else
           " (an upper bound: a batch is padded to its longest sample rounded up to 16, at most this; "
           "dataset.dataset_kwargs.pad_to_max_length pads every batch to it)")
    if packed:
        micro = doc.get("train", {}).get("micro_batch_size", 1)
        if micro not in (None, 1):
            raise InvalidInputError("train.micro_batch_size", micro, "1 with packed sequences",
                                    f"{path}: Megatron-Bridge refuses a micro-batch above 1 with packed sequences "
                                    "(ConfigContainer.validate: the packs are the batch)")
        put("--seq-length", size, "dataset.packed_sequence_specs.packed_sequence_size")
        walk.ignore("dataset.seq_length")
        walk.seq_note = (f"packed (dataset.packed_sequence_specs.packed_sequence_size {size}): a micro-batch is one "
                         f"pack of whole samples (each at most dataset.seq_length {seq} tokens), {size} tokens"
                         + how + "; the packed samples attend within themselves (THD, cu_seqlens), priced as one "
                         "sequence of the pack's length (the attention kernels keep per-token tensors)")
        _model_seq_note(model, size, "dataset.packed_sequence_specs.packed_sequence_size", walk)
    else:
        given = getattr(context, "seq_len", None) if not padded else None
        put("--seq-length", given if given is not None else seq, "dataset.seq_length")
        walk.seq_note = ((f"not packed: dataset.seq_length {seq}" + how) if given is None else
                         f"not packed: the longest batch decides; --seq-len {given} taken (dataset.seq_length, the "
                         f"most a batch is padded to, is {seq})")
        _model_seq_note(model, seq, "dataset.seq_length", walk)
    for key in dataset:
        if key in ("_target_", "seq_length", "dataset_kwargs", "packed_sequence_specs"):
            continue
        if key in FINETUNING_DATASET_IGNORED:
            walk.ignore(f"dataset.{key}")
        else:
            walk.unknown(f"dataset.{key}", dataset[key])


def _rest(doc: dict, path, walk: _Walk) -> None:
    walk.ignore("_target_")      # the container's class: what recognizes the file
    for name, value in doc.items():
        if name in ("_target_", "model", "mixed_precision", "ddp", "optimizer", "dataset", "train"):
            continue
        if name == "peft":
            if value is None:
                walk.ignore("peft")
            # (else: read by _peft)
        elif name == "comm_overlap":
            if value is not None:
                raise NotModelledError("comm_overlap", value, "null", f"{path}: Megatron-Bridge's communication-overlap "
                                       "config (TransformerEngine userbuffers for tp overlap) is not modelled")
            walk.ignore("comm_overlap")
        elif name == "dist":
            table = value if isinstance(value, dict) else {}
            for key, item in table.items():
                if key in DIST_REFUSED_UNLESS:
                    _check(path, "dist", DIST_REFUSED_UNLESS, key, item)
            walk.ignore("dist")
        elif name in IGNORED_SECTIONS:
            walk.ignore(name)
        else:
            walk.unknown(name, value)


# --- peft: Megatron-Bridge's LoRA (BRIDGE_COMMIT src/megatron/bridge/peft/) ----------------------------------------
LORA = "megatron.bridge.peft.lora.LoRA"
CANONICAL_LORA = "megatron.bridge.peft.canonical_lora.CanonicalLoRA"
DORA = "megatron.bridge.peft.dora.DoRA"
# Bridge's module names -> the measured profile's (peft's Llama names), and whether one Bridge adapter spans several
# of them. LoRA adapts the fused linear_qkv and linear_fc1 with one ParallelLinearAdapter each (lora.py transform);
# CanonicalLoRA one adapter per projection (canonical_lora.py: LoRALinearSplitQKV, LoRALinearSplitFC1UpGate).
LORA_TARGETS = {"linear_qkv": ("q_proj", "k_proj", "v_proj"), "linear_proj": ("o_proj",),
                "linear_fc1": ("gate_proj", "up_proj"), "linear_fc2": ("down_proj",)}
CANONICAL_TARGETS = {"linear_q": ("q_proj",), "linear_k": ("k_proj",), "linear_v": ("v_proj",),
                     "linear_proj": ("o_proj",), "linear_fc1_up": ("up_proj",), "linear_fc1_gate": ("gate_proj",),
                     "linear_fc2": ("down_proj",)}
PEFT_IGNORED = {
    "alpha": "the adapter's output scale (x * alpha / dim: a scalar multiply, nothing saved)",
    "lora_A_init_method": "initialization", "lora_B_init_method": "initialization",
    "params_to_save": "the adapter parameters' names a checkpoint saves (PEFT.set_params_to_save)",
}
PEFT_REFUSED_UNLESS = {
    "exclude_modules": ((None, []), "exclude_modules adapts every other linear, the output layer (LM head) included: "
                                    "LoRA on the LM head is not modelled"),
    "a2a_experimental": (_OFF, "the experimental all-to-all of the row adapters' output is not modelled"),
    "lora_dtype": ((None,), "adapters in another dtype than the model's are not read (the ParallelLinearAdapter "
                            "takes the model's 16-bit dtype: peft/utils.py, self.bfloat16())"),
}


def _adapter_shapes(model: dict, modules, rank: int) -> tuple[tuple[int, int], ...]:
    """The (rows, cols) of every adapter weight of a layer on a tensor-parallel rank, as ParallelLinearAdapter makes
    them (BRIDGE_COMMIT peft/utils.py): a column-parallel base's linear_in = ColumnParallelLinear(in, r) [r / tp, in],
    a row-parallel base's RowParallelLinear(in, r, input_is_parallel) [r, in / tp]; linear_out =
    ColumnParallelLinear(r, out) [out / tp, r] either way."""
    h, t = int(model["hidden_size"]), int(model.get("tensor_model_parallel_size") or 1)
    head = int(model.get("kv_channels") or h // int(model["num_attention_heads"]))
    q = int(model["num_attention_heads"]) * head
    kv = int(model.get("num_query_groups") or model["num_attention_heads"]) * head
    f = int(model["ffn_hidden_size"])
    gate = 2 if as_bool(model.get("gated_linear_unit", False), "model.gated_linear_unit", "") else 1
    column = {"linear_qkv": q + 2 * kv, "linear_q": q, "linear_k": kv, "linear_v": kv, "linear_fc1": gate * f,
              "linear_fc1_up": f, "linear_fc1_gate": f}
    row = {"linear_proj": (q, h), "linear_fc2": (f, h)}
    shapes = []
    for m in modules:
        if m in column:
            shapes += [(rank // t, h), (column[m] // t, rank)]
        else:
            fan_in, out = row[m]
            shapes += [(rank, fan_in // t), (out // t, rank)]
    return tuple(shapes)


def _peft(doc: dict, path, walk: _Walk) -> tuple[list, list, int]:
    """The ``lora`` option of the measured profile from the dump's ``peft`` section, and the bytes of the adapters'
    own cached dummy weight gradients (one per distinct adapter weight shape, under gradient_accumulation_fusion: not
    counted, said); the dataclass's defaults of the keys a dump lacks. None: ([], [], 0)."""
    peft = doc.get("peft")
    if peft is None:
        return [], [], 0
    if not isinstance(peft, dict):
        raise InvalidInputError("peft", peft, "a PEFT table (a LoRA) or null", str(path))
    target = peft.get("_target_")
    if target == DORA:
        raise NotModelledError("peft._target_", target, f"{LORA} or {CANONICAL_LORA}",
                               f"{path}: Megatron-Bridge's DoRA (peft/dora_layers.py DoRALinear: the magnitude over the "
                               "detached weight norm scales the base + adapter sum, one out-sized tensor saved per "
                               "token) is not the measured profile's DoRA (peft's: the base and LoRA results saved "
                               "apart, lora.dora_parts)")
    if target not in (LORA, CANONICAL_LORA):
        raise NotModelledError("peft._target_", target, f"{LORA} or {CANONICAL_LORA}",
                               f"{path}: only Megatron-Bridge's LoRA and CanonicalLoRA are read")
    model = doc["model"]
    if not as_bool(model.get("gated_linear_unit", False), "model.gated_linear_unit", path):
        raise NotModelledError("peft", target, "null with a non-gated MLP",
                               f"{path}: LoRA is read over Llama-style layers (gated SwiGLU MLP) only")
    canonical = target == CANONICAL_LORA
    names = CANONICAL_TARGETS if canonical else LORA_TARGETS
    fields = [LaunchField(
        key="peft._target_", value=target, field="lora", becomes={"adapter_dtype": "base"},
        note=f"Megatron-Bridge's {'CanonicalLoRA' if canonical else 'LoRA'} ({BRIDGE} src/megatron/bridge/peft/"
             f"{'canonical_lora' if canonical else 'lora'}.py): the base frozen (PEFT.freeze_model), in the model's "
             "16-bit dtype; each adapted linear gets a ParallelLinearAdapter (linear_in r x in, linear_out out x r) "
             "cast to that dtype (peft/utils.py: self.bfloat16()); only the adapters are in Megatron's grad buffer "
             "and optimizer; the layers' saved tensors are the measured profile's LoRA layers' (a frozen linear keeps "
             "no input, as TransformerEngine's: module/linear.py backward_needs_input = weight.requires_grad)")]
    defaults = []
    source = f"{BRIDGE} src/megatron/bridge/peft/{'canonical_lora' if canonical else 'lora'}.py"
    for key, value in (("target_modules", list(names)), ("dim", 32), ("dropout", 0.0)):
        if key not in peft:        # (a resolved dump has every field; an edited one may lack some)
            defaults.append(LaunchDefault(key=f"peft.{key}", field="lora", value={}, version=VERSION,
                                          source=f"{source} ({'CanonicalLoRA' if canonical else 'LoRA'}.{key} = "
                                                 f"{value!r})"))
    modules = peft.get("target_modules", list(names))
    if not isinstance(modules, list) or not modules:
        raise NotModelledError("peft.target_modules", modules, "a list of " + ", ".join(names),
                               f"{path}: an empty target_modules adapts every linear, the output layer (LM head) "
                               "included: LoRA on the LM head is not modelled")
    for m in modules:
        if m not in names:
            raise NotModelledError("peft.target_modules", modules, "a list of " + ", ".join(names),
                                   f"{path}: {m!r}: "
                                   + ("per-layer targets (wildcards) are not read" if "*" in str(m) or "." in str(m)
                                      else "not a module this reader maps to the measured profile's LoRA"))
    if len(set(modules)) != len(modules):
        raise InvalidInputError("peft.target_modules", modules, "distinct module names", str(path))
    rank = as_int(peft.get("dim", 32), "peft.dim", path)
    mapped = [p for m in modules for p in names[m]]
    fused = [m for m in modules if len(names[m]) > 1]
    h, layers = int(model["hidden_size"]), int(model["num_layers"])
    dropout = peft.get("dropout", 0.0) or 0.0
    if isinstance(dropout, bool) or not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
        raise InvalidInputError("peft.dropout", dropout, "a probability in [0, 1)", str(path))
    note = f"{', '.join(modules)} -> {', '.join(mapped)}"
    if fused:
        extra = layers * rank * h * sum(len(names[m]) - 1 for m in fused)
        note += (f"; approximated: Megatron-Bridge adapts the fused {' and '.join(fused)} with one adapter each "
                 f"(r x h in, the fused width out), the measured profile one per projection (Megatron-Bridge's layout "
                 f"each, validation/lora_parallel/measure_lora_tp.py): {extra:,} adapter parameters more than the run "
                 f"has ({layers} layers x r {rank} x h {h} x {sum(len(names[m]) - 1 for m in fused)}), and "
                 f"{sum(len(names[m]) - 1 for m in fused)} more r-wide intermediates per token and layer"
                 + (", and as many more dropout masks and dropped copies of the h-wide input" if dropout else ""))
    read = {"target_modules": ({"target_modules": mapped}, note, bool(fused)), "dim": ({"rank": rank}, "", False)}
    position = peft.get("dropout_position", "pre")
    if dropout and position != "pre":
        raise NotModelledError("peft.dropout_position", position, "'pre' with dropout > 0",
                               f"{path}: dropout on the adapter's output is not modelled")
    read["dropout"] = ({"dropout": dropout}, "dropout_position pre: on the adapter's input, as peft's lora_dropout"
                       if dropout else "", False)
    for key, (becomes, text, approximated) in read.items():
        if key in peft:
            fields.append(LaunchField(key=f"peft.{key}", value=peft[key], field="lora", becomes=becomes, note=text,
                                      approximated=approximated))
        else:
            defaults = [attrs.evolve(d, value=becomes, note=text) if d.key == f"peft.{key}" else d for d in defaults]
    for key, value in peft.items():
        if key in ("_target_", "target_modules", "dim", "dropout"):
            continue
        if key == "dropout_position" or key in PEFT_IGNORED:
            walk.ignore(f"peft.{key}")
        elif key == "canonical_mapping":
            if value and not canonical:
                _refuse(path, "peft.canonical_mapping", value, (None, {}), "a canonical mapping on LoRA is not read")
            walk.ignore("peft.canonical_mapping")       # CanonicalLoRA's: made from target_modules (__post_init__)
        elif key in PEFT_REFUSED_UNLESS:
            _check(path, "peft", PEFT_REFUSED_UNLESS, key, value, walk)
        else:
            walk.unknown(f"peft.{key}", value)
    dummies = 2 * sum(r * c for r, c in dict.fromkeys(_adapter_shapes(model, modules, rank)))
    return fields, defaults, dummies


# The arguments Megatron-LM's reader builds the model from (its "model" field).
ARCHITECTURE = ("--num-layers", "--hidden-size", "--num-attention-heads", "--num-query-groups", "--group-query-attention",
                "--kv-channels", "--ffn-hidden-size", "--swiglu", "--normalization", "--position-embedding-type",
                "--max-position-embeddings", "--disable-bias-linear", "--add-qkv-bias",
                "--untie-embeddings-and-output-weights", "--vocab-size", "--make-vocab-size-divisible-by")
_FLAG = re.compile(r"(?<![\w-])--[a-z0-9-]+")


def _rename(text: str, origin: dict) -> str:
    return _FLAG.sub(lambda m: origin.get(m.group(0), m.group(0)), text)


def read(path, document, context):
    walk = _Walk(path)
    args, origin = _to_arguments(document, path, walk, context)
    _rest(document, path, walk)
    lora, lora_defaults, dummies = _peft(document, path, walk)
    try:
        reading = megatron.read_mapping(args, path, context)
    except MlsysimError as err:      # name the Bridge key, not the argument it became
        if isinstance(err, InvalidInputError) and err.parameter in origin:
            raise type(err)(origin[err.parameter], err.value, err.allowed, _rename(err.detail, origin)) from None
        raise
    architecture = sorted({origin[f] for f in ARCHITECTURE if f in origin} | {"model.activation_func"})
    fields = [attrs.evolve(f, key="/".join(architecture) if f.field == "model" else
                           _rename(f.key.replace("/", " "), origin).replace(" ", "/"), note=_rename(f.note, origin))
              for f in reading.fields]
    defaults = [attrs.evolve(d, key=_rename(d.key.replace("/", " "), origin).replace(" ", "/"), version=VERSION)
                for d in reading.defaults]
    # Keys read whose value changes nothing here (tp 1's sequence_parallel, cp 1, the TE implementation, the
    # native loss fusion): no field of their own; listed as ignored and said in a note.
    shown = {part for item in [*fields, *defaults] for part in item.key.split("/")}
    quiet = sorted({key for key in origin.values() if key not in shown} - set(walk.ignored))
    notes = [*walk.notes, *(_rename(n, origin) for n in reading.notes)]
    if quiet:
        notes.append("read, no effect at their values: " + ", ".join(f"{k}={_value(document, k)!r}" for k in quiet))
    # Megatron-LM's reader applies its own defaults only to flags the mapping lacks; the dump is resolved, so
    # the only ones left are the optimizer's fused step and the null recompute (said as defaults).
    # (the Megatron-LM flag is the negation of the Bridge key: its value shown as the key's)
    fields = [attrs.evolve(f, value=not f.value) if f.key == "model.gradient_accumulation_fusion" else f
              for f in fields]
    # A Megatron-LM default whose Bridge key the dump has (a false flag, a null, the optimizer's name: the mapping
    # drops them as absent) is that key read, not a default.
    present = [d for d in defaults if "/" not in d.key and _has(document, d.key)]
    fields += [LaunchField(key=d.key, value=_value(document, d.key), field=d.field, becomes=d.value,
                           note="; ".join(n for n in (d.note, d.source) if n)) for d in present]
    defaults = [d for d in defaults if d not in present]
    if walk.seq_note is not None:       # a finetuning dataset: its own sequence rule
        fields = [attrs.evolve(f, note=walk.seq_note) if f.field == "seq_len" else f for f in fields]
    if lora:
        fields = [_frozen_base(f, dummies) if f.key == "model.gradient_accumulation_fusion" else f
                  for f in fields] + lora
        defaults += lora_defaults
    read = {f.key for f in fields}
    return attrs.evolve(reading, format="megatron-bridge", fields=fields, defaults=defaults,
                        ignored=[k for k in dict.fromkeys([*walk.ignored, *quiet, *reading.ignored]) if k not in read],
                        framework_version=VERSION, notes=notes)


def _frozen_base(field, dummies: int):
    """model.gradient_accumulation_fusion under PEFT: the frozen base's linears and the frozen LM head compute no
    weight gradient, so no dummy for them and no tied-embedding gradient: the rule's option off, the adapters' own
    dummies (small) said, not counted."""
    if not isinstance(field.becomes, dict):
        return field
    becomes = {rule: {**options, "gradient_accumulation_fusion": False} for rule, options in field.becomes.items()}
    return attrs.evolve(field, becomes=becomes, approximated=True, note=(
        "under peft the frozen linears compute no weight gradient (NVIDIA/TransformerEngine v2.7 "
        "transformer_engine/pytorch/module/linear.py: ctx.requires_wgrad = weight.requires_grad; the frozen LM head "
        f"runs megatron-core's LinearWithFrozenWeight, {CORE} megatron/core/tensor_parallel/layers.py): no cached "
        "dummy for them and no tied-embedding gradient; the adapters' weight gradients go into main_grad and each "
        "returns a cached dummy of its shape (layers.py LinearWithGradAccumulationAndAsyncCommunication.backward, "
        f"get_dummy_wgrad), {dummies:,} B in all, not counted"))


def _has(document: dict, key: str) -> bool:
    section, _, name = key.partition(".")
    return isinstance(document.get(section), dict) and name in document[section]


def _value(document: dict, key: str):
    section, _, name = key.partition(".")
    return plain(document.get(section, {}).get(name))


def recognizes(path, document) -> bool:
    return isinstance(document, dict) and document.get("_target_") == CONTAINER


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(
        name="megatron-bridge", framework="Megatron-Bridge",
        description="Megatron-Bridge's resolved ConfigContainer YAML (save_config_filepath, --dryrun, the logged "
                    "Task Configuration)",
        suffixes=(".yaml", ".yml"), recognizes=recognizes, read=read)]
