"""torchtune recipe configs (0.6.x): ``tune run RECIPE --config FILE key=value ...``.

The reader maps every key of a recipe YAML to the measured profile's parameters (docs/launch.md,
"torchtune"): the model builder (``torchtune.models.llama3_2.lora_llama3_2_3b``) to a catalog
model and LoRA/QLoRA options, ``dtype`` to the regime (torchtune trains in pure bf16: no
autocast, no fp32 master copy), ``batch_size`` (per device), ``gradient_accumulation_steps``,
``enable_activation_checkpointing`` (torchtune checkpoints every decoder layer whole: ``full``),
``enable_activation_offloading``, ``optimizer._component_`` and ``fused``, ``optimizer_in_bwd``,
``loss._component_`` (``CEWithChunkedOutputLoss`` -> ``chunked``, ``LinearCrossEntropyLoss`` ->
``torchtune_linear``), the FSDP2 keys of the
distributed recipes, ``tensor_parallel_dim``, and the sequence (``tokenizer.max_seq_len``,
``dataset.packed``). ``--override key=value`` applies ``tune run``'s overrides first. Keys that do
not change memory (paths, logging, learning rate...) are listed as ignored; any other key is
refused, naming it.

Which recipe runs a config is not written in it: configs named ``*_single_device*`` run the
single-device recipes (no ``--gpus`` needed); every other config a distributed recipe
(FSDP2 over ``--gpus``).
"""

from __future__ import annotations

import copy
from pathlib import Path

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError

from .hookspecs import LaunchFormatSpec
from ._common import PRECISION_OF_REGIME, Reading, as_bool, as_int, catalog_model, flatten, sequence

VERSION = "torchtune 0.6.1"
REPO = "pytorch/torchtune v0.6.1"

# torchtune model builder (the function name, lora_/qlora_ stripped) -> Hugging Face id in the catalog.
BUILDERS = {
    "llama2_7b": "meta-llama/Llama-2-7b-hf", "llama2_13b": "meta-llama/Llama-2-13b-hf",
    "llama2_70b": "meta-llama/Llama-2-70b-hf",
    "llama3_8b": "meta-llama/Meta-Llama-3-8B", "llama3_70b": "meta-llama/Meta-Llama-3-70B",
    "llama3_1_8b": "meta-llama/Llama-3.1-8B", "llama3_1_70b": "meta-llama/Llama-3.1-70B",
    "llama3_1_405b": "meta-llama/Llama-3.1-405B",
    "llama3_2_1b": "meta-llama/Llama-3.2-1B", "llama3_2_3b": "meta-llama/Llama-3.2-3B",
    "mistral_7b": "mistralai/Mistral-7B-v0.1",
    "qwen2_5_0_5b": "Qwen/Qwen2.5-0.5B", "qwen2_5_1_5b": "Qwen/Qwen2.5-1.5B", "qwen2_5_7b": "Qwen/Qwen2.5-7B",
    "qwen2_5_14b": "Qwen/Qwen2.5-14B", "qwen2_5_32b": "Qwen/Qwen2.5-32B", "qwen2_5_72b": "Qwen/Qwen2.5-72B",
    "qwen3_0_6b": "Qwen/Qwen3-0.6B", "qwen3_1_7b": "Qwen/Qwen3-1.7B", "qwen3_4b": "Qwen/Qwen3-4B",
    "qwen3_8b": "Qwen/Qwen3-8B", "qwen3_14b": "Qwen/Qwen3-14B", "qwen3_32b": "Qwen/Qwen3-32B",
    "gemma2_2b": "google/gemma-2-2b", "gemma2_9b": "google/gemma-2-9b", "gemma2_27b": "google/gemma-2-27b",
    # Gemma 1 (torchtune/models/gemma: MultiHeadAttention, GemmaRMSNorm, GemmaNormEmbeddings x sqrt(dim), GeGLU
    # (gelu tanh), TiedLinear): the measured profile's gemma family, Hugging Face's layer op for op.
    "gemma_2b": "google/gemma-2b", "gemma_7b": "google/gemma-7b",
    # Qwen2 (qwen2 component builder, as Qwen2.5's): one builder for the base and the instruct checkpoints (the same
    # shapes); the catalog keeps the instruct ones.
    "qwen2_1_5b": "Qwen/Qwen2-1.5B-Instruct", "qwen2_7b": "Qwen/Qwen2-7B-Instruct",
    "qwen2_5_3b": "Qwen/Qwen2.5-3B",
}
# Builders of a catalog model that torchtune builds otherwise than the model's measured family describes: refused,
# naming why (-m replaces the builder, as for a model not in the catalog).
_SEPARATE_PROJECTIONS = (
    "torchtune's phi3 component builder ({REPO} torchtune/models/phi3/_component_builders.py: phi3, lora_phi3) makes "
    "q_proj, k_proj, v_proj and the MLP's w1/w3 separate nn.Linear layers (a Llama layer, MultiHeadAttention), where "
    "the measured profile's phi3 family is Hugging Face's Phi3 layer: fused qkv_proj (under SDPA its whole output "
    "kept by v's view, and the attention output's contiguous copy) and fused gate_up_proj; the saved bytes differ")
REFUSED_BUILDERS = {
    "phi3_mini": _SEPARATE_PROJECTIONS.format(REPO=REPO),
    "phi4_14b": ("Phi-4 (microsoft/phi-4, phi3 family): " + _SEPARATE_PROJECTIONS.format(REPO=REPO)
                 + "; phi4_14b also keeps the component builder's rope_base 10,000 (Hugging Face's rope_theta "
                 "250,000: {REPO} torchtune/models/phi4/_model_builders.py:20-37)".format(REPO=REPO)),
}
# Builders whose architecture is another's (same shapes): the catalog entry used, and why.
SAME_AS = {"llama3_3_70b": ("llama3_1_70b", "Llama 3.3 70B has Llama 3.1 70B's architecture (torchtune's "
                                            "llama3_3_70b calls llama3_1_70b)")}

# Each builder's max_seq_len (torchtune/models/<family>/_model_builders.py, v0.6.1): the rows of the RoPE cache its one
# rope module registers at model init (rope_cache=, measured/rope.py), fp32 whatever the recipe's dtype (theta is
# computed .float(), the recipes build under set_default_dtype and never cast the model). Qwen2.5's and Phi-3's rope
# (Qwen2RotaryPositionalEmbeddings, Phi3RotaryPositionalEmbeddings) concatenate cos and sin over the frequencies
# twice (layout "concatenated"); the others stack them (RotaryPositionalEmbeddings, Llama3ScaledRoPE: "pairs").
# Qwen3 has no builder in 0.6.1 (no torchtune/models/qwen3): its runs keep Hugging Face's tables.
# Qwen2.5's _base and _instruct builders differ (131,072 and 32,768: torchtune/models/qwen2_5/_model_builders.py, e.g.
# qwen2_5_7b_base line 154, qwen2_5_7b_instruct line 180): keyed by the builder's full name (lora_/qlora_ stripped).
# Gemma 1: gemma_2b and gemma_7b max_seq_len=8192 (gemma/_model_builders.py lines 40, 144); Qwen2: 32,768
# (qwen2/_model_builders.py lines 38 (7B), 91 (1.5B)); Qwen2.5 3B: 32,768 (qwen2_5/_model_builders.py line 127).
ROPE_ROWS = {
    "llama2_7b": 4096, "llama2_13b": 4096, "llama2_70b": 4096, "llama3_8b": 8192, "llama3_70b": 8192,
    "llama3_1_8b": 131072, "llama3_1_70b": 131072, "llama3_1_405b": 131072, "llama3_2_1b": 131072,
    "llama3_2_3b": 131072, "mistral_7b": 32768, "qwen2_5_0_5b": 32768,
    "qwen2_5_1_5b_base": 131072, "qwen2_5_1_5b_instruct": 32768, "qwen2_5_3b": 32768,
    "qwen2_5_7b_base": 131072, "qwen2_5_7b_instruct": 32768, "qwen2_5_14b_base": 131072,
    "qwen2_5_14b_instruct": 32768, "qwen2_5_32b_base": 131072, "qwen2_5_32b_instruct": 32768,
    "qwen2_5_72b_base": 131072, "qwen2_5_72b_instruct": 32768,
    "gemma2_2b": 8192, "gemma2_9b": 8192, "gemma2_27b": 8192,
    "gemma_2b": 8192, "gemma_7b": 8192, "qwen2_1_5b": 32768, "qwen2_7b": 32768,
}
CONCATENATED_ROPE = ("qwen2_5_", "qwen2_")
# The LoRA builders that build a RoPE module in every layer's attention (lora_<family>_self_attention, v0.6.1:
# llama2 line 417, llama3 418, mistral 399, qwen2 393 (Qwen2.5's too), gemma 345, gemma2 392): one cache and theta
# per layer, where the full builders and lora_llama3_1 / lora_llama3_2 (one Llama3ScaledRoPE passed to every layer)
# keep one: rope_cache_per_layer (rope.py).
PER_LAYER_ROPE = {"llama2_": 417, "llama3_": 418, "mistral_": 399, "qwen2_": 393, "gemma_": 345, "gemma2_": 392}
ROPE_SHARED = ("llama3_1_", "llama3_2_")

# torchtune's LoRA module names -> the measured profile's (peft's) target names.
LORA_MODULES = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")      # torchtune's w1, w3, w2

# optimizer._component_ -> the registered optimizer (None: refused, with why).
OPTIMIZERS = {
    "torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", "torch.optim.SGD": "sgd",
    "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit-bnb", "bitsandbytes.optim.AdamW8bit": "adamw-8bit-bnb",
    # bitsandbytes' 32-bit optimizers (optim_bits=32, their default: Optimizer2State, two fp32 moments per parameter;
    # the paged ones put the moments of tensors of >= 1e5 elements in CUDA managed memory, optim/optimizer.py
    # get_state_buffer -> functional.py get_paged; lowbit_optimizers.bnb32_state_terms). Adam and AdamW keep the
    # same state (the decay is applied in the update, bitsandbytes optim/adam.py and adamw.py).
    "bitsandbytes.optim.PagedAdamW": "paged-adamw-32bit-bnb", "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw-32bit-bnb",
    "bitsandbytes.optim.PagedAdam": "paged-adamw-32bit-bnb", "bitsandbytes.optim.PagedAdam32bit": "paged-adamw-32bit-bnb",
    "bitsandbytes.optim.AdamW": "adamw-32bit-bnb", "bitsandbytes.optim.AdamW32bit": "adamw-32bit-bnb",
    "bitsandbytes.optim.Adam": "adamw-32bit-bnb", "bitsandbytes.optim.Adam32bit": "adamw-32bit-bnb",
    "torchao.optim.AdamW8bit": "adamw-8bit-torchao", "torchao.prototype.low_bit_optim.AdamW8bit": "adamw-8bit-torchao",
    "torchao.optim.AdamW4bit": "adamw-4bit-torchao", "torchao.prototype.low_bit_optim.AdamW4bit": "adamw-4bit-torchao",
    "torchao.optim.AdamWFp8": "adamw-fp8-torchao", "torchao.prototype.low_bit_optim.AdamWFp8": "adamw-fp8-torchao",
}
# Optimizer keys that do not change memory (hyperparameters).
OPTIMIZER_HYPER = ("lr", "weight_decay", "betas", "eps", "momentum_dtype", "nesterov", "dampening", "maximize",
                   "capturable", "differentiable", "percentile_clipping", "block_wise", "min_8bit_size")

LINEAR_CE = "pytorch/torchtune bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 torchtune/modules/loss/cross_entropy_loss.py"
LOSSES = {
    "torchtune.modules.loss.CEWithChunkedOutputLoss": ("chunked", False, ""),
    "torch.nn.CrossEntropyLoss": ("cross_entropy", False, ""),
    # After 0.6.1: the recipe's model skips its output layer and the loss projects chunk by chunk.
    "torchtune.modules.loss.LinearCrossEntropyLoss": (
        "torchtune_linear", False, f"torchtune's LinearCrossEntropyLoss ({LINEAR_CE}): the ignored tokens masked out "
        "of the hidden state, the LM head and cross-entropy one chunk at a time (torchtune > 0.6.1)"),
}
# Each loss's default chunk count and where it is written.
CHUNK_DEFAULTS = {
    "chunked": f"{REPO}: torchtune/modules/loss/ce_chunked_output_loss.py:30 (num_output_chunks=8)",
    "torchtune_linear": f"{LINEAR_CE}: LinearCrossEntropyLoss.__init__ (num_output_chunks=8)",
}

# Top-level keys that do not change memory.
IGNORED_TOP = {"output_dir", "seed", "shuffle", "epochs", "max_steps_per_epoch", "resume_from_checkpoint",
               "checkpointer", "metric_logger", "log_every_n_steps", "log_peak_memory_stats", "log_level", "profiler",
               "lr_scheduler", "save_adapter_weights_only", "enable_async_checkpointing", "cudnn_deterministic_mode",
               "profile_memory", "clip_grad_norm", "low_cpu_ram", "collate_fn", "dataloader", "run_val_every_n_steps",
               "keep_last_n_checkpoints", "save_every_n_steps"}
# Keys of a training recipe that make it something the measured profile does not describe.
REFUSED_TOP = {
    "teacher_model": "knowledge distillation: a second (teacher) model on the device",
    "teacher_checkpointer": "knowledge distillation: a second (teacher) model on the device",
    "kd_loss": "knowledge distillation: a second (teacher) model on the device",
    "ref_checkpointer": "preference optimization with a reference model on the device",
    "policy_model": "PPO: policy, value and reference models on the device",
    "reward_and_value_model": "PPO: policy, value and reference models on the device",
    "quantizer": "quantization-aware training: fake-quantized weights and activations",
    "ac_mode": "torchtune's selective activation checkpointing (ac_mode/ac_option, a prototype)",
    "ac_option": "torchtune's selective activation checkpointing (ac_mode/ac_option, a prototype)",
    "datasets": "a multi-dataset recipe (lora_finetune_distributed_multi_dataset)",
}


def _recognizes(path, document) -> bool:
    """A YAML whose tables name torchtune components (``_component_: torchtune....``)."""
    return isinstance(document, dict) and any(
        isinstance(v, dict) and str(v.get("_component_", "")).startswith("torchtune.") for v in document.values())


def _apply_overrides(document: dict, overrides, path) -> dict:
    """``tune run``'s ``key=value`` overrides: the value read as YAML (as OmegaConf does)."""
    import yaml
    document = copy.deepcopy(document)
    for key, text in overrides:
        try:
            value = yaml.safe_load(text) if text != "" else None
        except yaml.YAMLError:
            value = text
        if key.startswith("~"):
            raise InvalidInputError("--override", f"{key}={text}", "key=value (deleting a key with ~ is not read)")
        node = document
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return document


def _read(path, document, context) -> Reading:
    path = Path(path)
    overrides = context.take_overrides(path) if context is not None and context.overrides else []
    document = _apply_overrides(document, overrides, path) if overrides else document
    overridden = {key for key, _ in overrides}
    r = Reading("torchtune", path, VERSION)
    asked = getattr(context, "framework_version", None)
    if asked and str(asked).strip() not in VERSION:
        r.note(f"--framework-version {asked}: this reader knows {VERSION}'s defaults only; those are applied")
    if overrides:
        r.note("overrides applied first, as `tune run ... key=value`: " + ", ".join(f"{k}={v}" for k, v in overrides))
    cfg = document
    single = "single_device" in path.stem
    recipe = f"{'lora' if _is_lora(cfg) else 'full'}_finetune_{'single_device' if single else 'distributed'}"
    r.note(f"read as torchtune's {recipe} recipe (the config's name {'says' if single else 'does not say'} "
           "single_device)")
    if single:
        r.world["single_device"] = (f"config name {path.name}", True)
    if "optimizer" not in cfg:
        raise NotModelledError("optimizer", None, "a training recipe config (with optimizer)",
                               f"{path}: no optimizer: not a training config (generation, evaluation or "
                               "quantization recipes do not train)")
    for key, why in REFUSED_TOP.items():
        if key in cfg:
            raise NotModelledError(key, _short(cfg[key]), "a fine-tuning recipe (full, LoRA or QLoRA SFT)",
                                   f"{path}: {why} is not modelled")
    if not isinstance(cfg.get("model"), dict):
        raise InvalidInputError("model._component_", None, "a torchtune model builder", str(path))
    seen = set()

    def take(key):
        seen.add(key)
        return cfg.get(key)

    def source(key, recipe_name=recipe):
        return f"{REPO}: recipes/{recipe_name}.py, cfg.get({key!r}, ...)"

    # --- the model (and LoRA/QLoRA) -----------------------------------------------------
    _model(r, take("model"), path, context)
    # --- precision ------------------------------------------------------------------------
    dtype = take("dtype")
    if dtype is None:
        raise InvalidInputError("dtype", None, "bf16 or fp32 (every torchtune recipe config sets it)", str(path))
    regime = {"bf16": "bf16", "fp32": "fp32"}.get(str(dtype))
    if regime is None:
        raise NotModelledError("dtype", dtype, "bf16 or fp32 (torchtune refuses fp16 training)", str(path))
    r.set("dtype", dtype, "regime", regime, "torchtune trains in pure " + regime + (": weights, gradients and "
          "optimizer state bf16, no autocast, no fp32 master copy" if regime == "bf16" else ""))
    r.set("dtype", dtype, "precision", PRECISION_OF_REGIME[regime])
    device = take("device")
    if device not in (None, "cuda"):
        raise NotModelledError("device", device, "cuda", f"{path}: the recipe's device")
    # --- batch ----------------------------------------------------------------------------
    r.set("batch_size", take("batch_size"), "micro_batch_size", as_int(cfg.get("batch_size"), "batch_size", path),
          "per device")
    accum = take("gradient_accumulation_steps")
    if accum is None:
        r.default("gradient_accumulation_steps", "gradient_accumulation_steps", 1, source("gradient_accumulation_steps"))
    else:
        r.set("gradient_accumulation_steps", accum, "gradient_accumulation_steps",
              as_int(accum, "gradient_accumulation_steps", path))
    # --- sequence -------------------------------------------------------------------------
    _sequence(r, cfg, seen, path, context)
    # --- activations ----------------------------------------------------------------------
    for key, field, on, off, default in (
            ("enable_activation_checkpointing", "activation_checkpointing", "full", "none", False),
            ("enable_activation_offloading", "activation_offload", "torchtune", None, False)):
        value = take(key)
        if value is None:
            r.default(key, field, off if not default else on, source(key))
        else:
            flag = as_bool(value, key, path)
            becomes = on if flag else off
            r.set(key, value, field, becomes, "torchtune checkpoints each decoder layer whole" if becomes == "full"
                  else "torchtune's OffloadActivations" if becomes == "torchtune" else "")
    if r.values_of("activation_offload") == "torchtune" and r.values_of("activation_checkpointing") != "full":
        raise InvalidInputError("enable_activation_offloading", True, "with enable_activation_checkpointing: True",
                                f"{path}: torchtune refuses activation offloading without checkpointing")
    compile_ = take("compile")
    if compile_ is not None and as_bool(compile_, "compile", path):   # training.compile_model: block by block
        what = "torchtune compiles each decoder layer apart and the loss (training.compile_model, compile_loss; " \
               "docs/compile.md)"
        if r.values_of("activation_checkpointing") == "full" and r.has("lora"):
            # recipes/lora_finetune_*.py _setup_model: compile_model, then set_activation_checkpointing wraps each
            # compiled layer: with LoRA the profile prices that order (compile.lora_full_terms; docs/compile.md)
            r.set("compile", compile_, "compile", "blocks", what + "; with enable_activation_checkpointing each "
                  "compiled layer is wrapped in checkpoint_wrapper (compile_model, then set_activation_checkpointing): "
                  "torchtune's order, priced as such with LoRA")
        elif r.values_of("activation_checkpointing") == "full":
            # recipes/*_single_device.py _setup_model: training.compile_model(model), then
            # training.set_activation_checkpointing wraps each compiled layer (the checkpoint outside the graph):
            # compile_checkpoint="outside" (compile.blocks_outside_full_terms; docs/compile.md)
            r.set("compile", compile_, "compile", "blocks", what)
            r.set("compile", compile_, "compile_checkpoint", "outside", "with enable_activation_checkpointing "
                  "torchtune wraps each compiled layer in checkpoint_wrapper (compile_model, then "
                  "set_activation_checkpointing): the checkpoint outside each compiled block")
        else:
            r.set("compile", compile_, "compile", "blocks", what)
    elif compile_ is None:
        r.default("compile", "compile", False, source("compile"))
    else:
        r.ignore("compile")     # (False: eager, what is modelled)
    # --- optimizer ------------------------------------------------------------------------
    _optimizer(r, take("optimizer"), path)
    in_bwd = take("optimizer_in_bwd")
    if in_bwd is None:
        r.default("optimizer_in_bwd", "optimizer_in_backward", False, source("optimizer_in_bwd"))
    elif as_bool(in_bwd, "optimizer_in_bwd", path):
        r.set("optimizer_in_bwd", in_bwd, "optimizer_in_backward", True)
    else:
        r.ignore("optimizer_in_bwd")
    _loss(r, take("loss"), path)
    # --- distribution ---------------------------------------------------------------------
    _distributed(r, cfg, take, single, path, source)
    # --- everything else ------------------------------------------------------------------
    for key in cfg:
        if key in seen:
            continue
        if key in IGNORED_TOP:
            r.ignore(key)
        elif key == "tokenizer" or key == "dataset":
            pass     # (read in _sequence)
        else:
            raise InvalidInputError(key, _short(cfg[key]), "a key of torchtune's fine-tuning recipes this reader knows "
                                    "(docs/launch.md, torchtune)", f"{path}: refused rather than dropped, as it may "
                                    "change memory")
    for key in overridden:
        r.note(f"{key} comes from --override")
    return r.done()


def _is_lora(cfg) -> bool:
    model = cfg.get("model") if isinstance(cfg.get("model"), dict) else {}
    name = str(model.get("_component_", "")).rsplit(".", 1)[-1]
    return name.startswith(("lora_", "qlora_"))


def _short(value):
    text = repr(value)
    return value if len(text) < 200 else text[:197] + "..."


def _model(r: Reading, model, path, context) -> None:
    component = str(model.get("_component_"))
    name = component.rsplit(".", 1)[-1]
    qlora = name.startswith("qlora_")
    lora = qlora or name.startswith("lora_")
    builder = name.split("_", 1)[1] if lora else name      # (with its _base / _instruct: the RoPE rows differ)
    base = builder.removesuffix("_instruct").removesuffix("_base")
    note = ""
    if base in SAME_AS:
        base, note = SAME_AS[base]
        builder = base
    if base not in BUILDERS and getattr(context, "model", None) is not None:
        r.set("model._component_", component, "model", context.model, f"-m {context.model} replaces this builder")
    elif base in REFUSED_BUILDERS:
        raise NotModelledError("model._component_", component, "a builder whose model the measured profile describes "
                               "(or -m MODEL in its place)", f"{path}: {REFUSED_BUILDERS[base]}")
    elif base not in BUILDERS:
        raise NotModelledError("model._component_", component, "a builder of a model in the catalog: "
                               + ", ".join(sorted(f"{p}{b}" for b in BUILDERS for p in ("",))) + " (with lora_/qlora_)",
                               f"{path}: no catalog model for this builder (a vision, Qwen2 0.5B or Code Llama model "
                               "is not in the catalog)")
    else:
        resolved, more = catalog_model(BUILDERS[base], "model._component_", path, context=context)
        r.set("model._component_", component, "model", resolved, "; ".join(n for n in (note, more) if n))
        _rope_cache(r, base, component, lora=lora)
        _kv_expanded(r, base, component)
        if base.startswith("gemma_"):
            r.note(f"{component}: the measured gemma family counts Hugging Face's 0-d embed_scale buffer (2 B in "
                   "bf16, 4 B in fp32) with the weights; torchtune's GemmaNormEmbeddings registers none (it multiplies "
                   f"by torch.tensor(embedding_dim ** 0.5) made on the host in each forward: {REPO} "
                   "torchtune/models/gemma/gemma_norm_embedding.py)")
    keys = {k: v for k, v in model.items() if k != "_component_"}
    if not lora:
        if keys:
            key = next(iter(keys))
            raise InvalidInputError(f"model.{key}", keys[key], "no other model key (a builder's own arguments are "
                                    "not read)", f"{path}: refused rather than dropped")
        return
    rank = keys.pop("lora_rank", None)
    if rank is None:
        raise InvalidInputError("model.lora_rank", None, "the adapters' rank", f"{path}: a LoRA builder without it")
    modules = keys.pop("lora_attn_modules", None)
    if not isinstance(modules, list) or not modules:
        raise InvalidInputError("model.lora_attn_modules", modules, "a list of q_proj, k_proj, v_proj, output_proj",
                                str(path))
    unknown = [m for m in modules if m not in LORA_MODULES]
    if unknown:
        raise InvalidInputError("model.lora_attn_modules", modules, "q_proj, k_proj, v_proj, output_proj", str(path))
    targets = [LORA_MODULES[m] for m in modules]
    mlp = keys.pop("apply_lora_to_mlp", False)
    if as_bool(mlp, "model.apply_lora_to_mlp", path):
        targets += MLP_MODULES
    output = keys.pop("apply_lora_to_output", False)
    if as_bool(output, "model.apply_lora_to_output", path):
        _untied_output(r, path)
        targets = targets + ["lm_head"]
    table = {"rank": as_int(rank, "model.lora_rank", path), "target_modules": targets}
    # torchtune builds the LoRA model under set_default_dtype(dtype): the adapters are in the base's dtype (bf16
    # with dtype: bf16), which the recipe asserts (validate_expected_param_dtype(adapter_params, dtype=self._dtype)),
    # not peft's fp32 adapters over a 16-bit base
    r.default("model._component_", "lora", {"adapter_dtype": "base"}, f"{REPO} recipes/lora_finetune_single_device.py "
              "lines 431-481 (_setup_model), recipes/lora_finetune_distributed.py line 497",
              "LoRALinear's lora_a/lora_b created in the model's dtype (torchtune/modules/peft/lora.py lines 91-92)")
    r.set("model.lora_rank", rank, "lora", {"rank": table["rank"]})
    r.set("model.lora_attn_modules", modules, "lora", {"target_modules": targets},
          "with apply_lora_to_mlp: gate_proj, up_proj, down_proj (torchtune's w1, w3, w2)" if mlp else "")
    r.set("model.apply_lora_to_mlp", mlp, "lora", {"target_modules": targets})
    if as_bool(output, "model.apply_lora_to_output", path):
        r.set("model.apply_lora_to_output", output, "lora", {"target_modules": targets}, "LoRALinear on the output "
              "projection (lm_head): r x (h + V) adapter parameters, its input and r-wide output saved "
              f"({REPO} torchtune/models/llama3/_component_builders.py lora_llama3: output_proj)")
    elif "apply_lora_to_output" in model:
        r.ignore("model.apply_lora_to_output")
    for key in ("lora_alpha",):
        if keys.pop(key, None) is not None:
            r.ignore(f"model.{key}")
    dropout = keys.pop("lora_dropout", 0.0)
    if dropout:
        r.set("model.lora_dropout", dropout, "lora", {"dropout": float(dropout)},
              "LoRALinear's nn.Dropout on the adapters' input: a mask and a dropped copy per adapted linear")
    elif "lora_dropout" in model:
        r.ignore("model.lora_dropout")
    if as_bool(keys.pop("use_dora", False), "model.use_dora", path):
        r.approx("model.use_dora", True, "lora", {"use_dora": True}, "torchtune's DoRALinear counted as peft's "
                 "DoRA (the measured one): a magnitude vector per adapted linear, the weight norm in the forward")
    quantize = keys.pop("quantize_base", qlora)
    if as_bool(quantize, "model.quantize_base", path):
        r.set("model._component_" if "quantize_base" not in model else "model.quantize_base",
              component if "quantize_base" not in model else quantize, "lora",
              {"quantization": "nf4", "quant_implementation": "torchao"},
              "torchao's NF4Tensor (to_nf4: 4-bit, blocks of 64, its scalers quantized to 8 bits in blocks of 256; "
              "linear_nf4 dequantizes through int64 codes)")
    if keys:
        key = next(iter(keys))
        raise InvalidInputError(f"model.{key}", keys[key], "a LoRA builder argument this reader knows: lora_rank, "
                                "lora_alpha, lora_dropout, lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output, "
                                "use_dora, quantize_base", f"{path}: refused rather than dropped")


def _untied_output(r: Reading, path) -> None:
    """``apply_lora_to_output: True`` needs an output projection of its own: torchtune's builders of tied models
    refuse it (``lora_llama3_2``: "apply_lora_to_output is currently not supporting in llama3.2 1b and 3b, as the
    projection layer weights are tied to the embeddings"; ``lora_qwen2`` with ``tie_word_embeddings``: "incompatible";
    the Gemma builders take no such argument), so a tied model is refused, naming the key."""
    from mlsysim_core.catalog import get_model
    name = r.values_of("model")
    try:
        model = get_model(name) if isinstance(name, str) else None
    except Exception:       # (a local config.json: its own tie is read when it is solved)
        model = None
    if model is not None and model.tied_embeddings:
        raise NotModelledError("model.apply_lora_to_output", True, "False for a model whose output projection is "
                               "tied to its embedding", f"{path}: torchtune's builders of tied models refuse it "
                               f"({REPO} torchtune/models/llama3_2/_component_builders.py lora_llama3_2, "
                               "qwen2/_component_builders.py lora_qwen2: ValueError)")


def _rope_cache(r: Reading, base: str, component: str, *, lora: bool = False) -> None:
    """The builder's RoPE module: a cache of its max_seq_len rows, fp32, alive the whole run (ROPE_ROWS); read
    from the builder the file names (a field of ``model._component_``, not a default of an absent key). Keyed by the
    builder's own name (Qwen2.5's _base and _instruct builders differ), else ``base``. A LoRA builder of a
    PER_LAYER_ROPE family builds one per layer: ``rope_cache_per_layer``."""
    name = component.rsplit(".", 1)[-1]
    builder = name.split("_", 1)[1] if name.startswith(("lora_", "qlora_")) else name
    rows = ROPE_ROWS.get(builder, ROPE_ROWS.get(base))
    if rows is None:
        return
    family = next(f for f in ("llama3_1", "llama3_2", "llama2", "llama3", "mistral", "qwen2_5", "qwen2", "gemma2",
                              "gemma") if base.startswith(f + "_"))
    concatenated = base.startswith(CONCATENATED_ROPE)
    how = f"the rope module's cache ({REPO} torchtune/models/{family}/_model_builders.py, {builder}: " \
          f"max_seq_len={rows}; rope_init, build_rope_cache: max_seq_len positions, fp32"
    per_layer = lora and not base.startswith(ROPE_SHARED) and next(
        (line for prefix, line in PER_LAYER_ROPE.items() if base.startswith(prefix)), None)
    if per_layer:
        where = "qwen2" if family == "qwen2_5" else family
        r.set("model._component_", component, "rope_cache", rows, how + ") in place of Hugging Face's per-forward "
              "cos/sin tables")
        r.set("model._component_", component, "rope_cache_per_layer", True, f"torchtune's lora_{where}_self_attention "
              f"builds a rope module, its cache and theta, in each layer ({REPO} torchtune/models/{where}/"
              f"_component_builders.py line {per_layer}), where the full builder shares one")
    else:
        r.set("model._component_", component, "rope_cache", rows, how + ", one shared by every layer) in place of "
              "Hugging Face's per-forward cos/sin tables")
    if concatenated:
        r.set("model._component_", component, "rope_cache_layout", "concatenated", f"max_seq_len x 2 head_dim values "
              f"({REPO} torchtune/models/qwen2/_positional_embeddings.py: build_rope_cache, cat([cos, sin]) of "
              "cat([theta, theta]))")


def _kv_expanded(r: Reading, base: str, component: str) -> None:
    """A grouped-query builder's attention (MultiHeadAttention; Gemma 2's the same way) expands k and v to every
    query head before SDPA, which saves the copies (measured/kv_expand.py); an MHA builder expands nothing."""
    from mlsysim_core.catalog import find_model
    spec = find_model(BUILDERS[base]).value
    if not spec.kv_heads or spec.kv_heads >= spec.heads:
        return
    if spec.kv_heads == 1:
        # One key/value head (Gemma 2B): unsqueeze(2).expand(...).flatten(1, 2) merges a size-1 dimension with a
        # stride-0 one, a view (stride 0 over the heads): SDPA gets and saves the un-expanded storage (torchtune
        # 0.6.1's gemma component builder, CPU: k's storage 512 B for b=2, s=8, head_dim=16 in bf16 at 4 query
        # heads, as k_proj's output; 2 key/value heads: a 2,048 B copy)
        r.note(f"{component}: num_kv_heads=1: MultiHeadAttention's expand + flatten of k and v is a view (stride 0 "
               "over the query heads), no copy: kv_expanded not set")
        return
    where = "gemma2/_attention.py (Gemma2Attention" if base.startswith("gemma2_") else "modules/attention.py (" \
        "MultiHeadAttention"
    r.set("model._component_", component, "kv_expanded", True, f"num_kv_heads={spec.kv_heads} < num_heads="
          f"{spec.heads}: SDPA saves k and v at every query head's width ({REPO} torchtune/{where}.forward: "
          "k.unsqueeze(2).expand(...) then flatten/reshape, a copy)")


def _sequence(r: Reading, cfg, seen, path, context) -> None:
    tokenizer = cfg.get("tokenizer") or {}
    dataset = cfg.get("dataset") or {}
    seen.update(("tokenizer", "dataset"))
    datasets = dataset if isinstance(dataset, list) else [dataset]
    packed = any(as_bool(d.get("packed", False), "dataset.packed", path) for d in datasets if isinstance(d, dict))
    for key in flatten(tokenizer, "tokenizer"):
        if key != "tokenizer.max_seq_len":
            r.ignore(key)
    for i, d in enumerate(datasets):
        for key in flatten(d, "dataset" if len(datasets) == 1 else f"dataset[{i}]"):
            if not key.endswith(".packed"):
                r.ignore(key)
    length = tokenizer.get("max_seq_len") if isinstance(tokenizer, dict) else None
    if packed and length is None:
        raise InvalidInputError("tokenizer.max_seq_len", None, "a length (packing needs it)",
                                f"{path}: dataset.packed is True")
    sequence(r, "tokenizer.max_seq_len", length, packed=packed, context=context, packed_key="dataset.packed")


def _optimizer(r: Reading, optimizer, path) -> None:
    if not isinstance(optimizer, dict) or "_component_" not in optimizer:
        raise InvalidInputError("optimizer._component_", optimizer, "an optimizer component", str(path))
    component = optimizer["_component_"]
    keys = {k: v for k, v in optimizer.items() if k != "_component_"}
    if component == "torchao.prototype.low_bit_optim.CPUOffloadOptimizer" or component.endswith("CPUOffloadOptimizer"):
        inner = keys.pop("optimizer_class", "torch.optim.AdamW")
        grads = as_bool(keys.pop("offload_gradients", False), "optimizer.offload_gradients", path)
        r.set("optimizer._component_", component, "offload", "torchao+gradients" if grads else "torchao")
        component = inner
    name = OPTIMIZERS.get(component, "?")
    if name == "?":
        raise NotModelledError("optimizer._component_", component, "one of " + ", ".join(
            k for k, v in OPTIMIZERS.items() if v), f"{path}: no registered optimizer for it")
    if name == "sgd" and float(keys.pop("momentum", 0) or 0):
        name = "sgd-momentum"
    r.set("optimizer._component_", component, "optimizer", name)
    fused = keys.pop("fused", None)
    foreach = keys.pop("foreach", None)
    if component.startswith("torch.optim."):
        if fused is not None and as_bool(fused, "optimizer.fused", path):
            r.set("optimizer.fused", fused, "optimizer_impl", "fused")
        elif foreach is not None and not as_bool(foreach, "optimizer.foreach", path):
            r.set("optimizer.foreach", foreach, "optimizer_impl", "for-loop")
        else:
            r.default("optimizer.fused", "optimizer_impl", "foreach",
                      "PyTorch torch.optim: foreach=None and fused=None take the foreach implementation on CUDA")
            if fused is not None:
                r.ignore("optimizer.fused")
    elif fused is not None or foreach is not None:
        raise InvalidInputError("optimizer.fused", fused, "no fused/foreach for " + component, str(path))
    if as_bool(keys.pop("amsgrad", False), "optimizer.amsgrad", path):
        raise NotModelledError("optimizer.amsgrad", True, "False", f"{path}: AMSGrad's third state is not modelled")
    for key in list(keys):
        if key in OPTIMIZER_HYPER or key == "momentum":
            r.ignore(f"optimizer.{key}")
            keys.pop(key)
    if keys:
        key = next(iter(keys))
        raise InvalidInputError(f"optimizer.{key}", keys[key], "an optimizer argument this reader knows",
                                f"{path}: refused rather than dropped")


def _loss(r: Reading, loss, path) -> None:
    if not isinstance(loss, dict) or "_component_" not in loss:
        raise InvalidInputError("loss._component_", loss, "a loss component", str(path))
    component = loss["_component_"]
    if component not in LOSSES:
        raise NotModelledError("loss._component_", component, "one of " + ", ".join(LOSSES),
                               f"{path}: a loss the measured profile does not model (preference and RL losses "
                               "need a reference or value model)")
    name, approximated, note = LOSSES[component]
    (r.approx if approximated else r.set)("loss._component_", component, "loss", name, note)
    if name in CHUNK_DEFAULTS:
        chunks = loss.get("num_output_chunks")
        if chunks is None:
            r.default("loss.num_output_chunks", "loss_chunks", 8, CHUNK_DEFAULTS[name])
        else:
            r.set("loss.num_output_chunks", chunks, "loss_chunks", as_int(chunks, "loss.num_output_chunks", path))
    linear = name == "torchtune_linear"
    for key in loss:
        if key in ("_component_", "num_output_chunks"):
            continue
        if key in ("ignore_index", "label_smoothing", "reduction") or (linear and key == "tp_enabled"):
            r.ignore(f"loss.{key}")
        elif linear and key == "mask_ignored_tokens":
            if not as_bool(loss[key], "loss.mask_ignored_tokens", path):
                raise NotModelledError("loss.mask_ignored_tokens", loss[key], "true (the default)",
                                       f"{path}: loss='torchtune_linear' models LinearCrossEntropyLoss with the "
                                       "ignored tokens masked out (index_select), as torchtune's default")
            r.ignore(f"loss.{key}")
        else:
            raise InvalidInputError(f"loss.{key}", loss[key], "a loss argument this reader knows", str(path))


def _distributed(r: Reading, cfg, take, single, path, source) -> None:
    keys = ("fsdp_cpu_offload", "fsdp_reshard_after_forward", "tensor_parallel_dim", "tensor_parallel_plan",
            "custom_sharded_layers", "fsdp")
    if single:
        for key in keys:
            if key in cfg:
                raise InvalidInputError(key, _short(cfg[key]), "no distributed key in a single-device config",
                                        f"{path}: a *_single_device config runs on one device")
        return
    recipe = f"{'lora' if _is_lora(cfg) else 'full'}_finetune_distributed"
    offload = take("fsdp_cpu_offload")
    if isinstance(cfg.get("fsdp"), dict):      # (older spelling: fsdp.cpu_offload)
        take("fsdp")
        offload = cfg["fsdp"].get("cpu_offload", offload)
        if set(cfg["fsdp"]) - {"cpu_offload"}:
            raise InvalidInputError("fsdp", cfg["fsdp"], "fsdp.cpu_offload", str(path))
    reshard = take("fsdp_reshard_after_forward")
    if reshard is None:
        r.default("fsdp_reshard_after_forward", "data_parallel", "fsdp", source("fsdp_reshard_after_forward", recipe),
                  "FSDP2 fully_shard per decoder layer, resharded after the forward")
    else:
        r.set("fsdp_reshard_after_forward", reshard, "data_parallel",
              "fsdp" if as_bool(reshard, "fsdp_reshard_after_forward", path) else "fsdp-grad-op")
    if reshard is None or as_bool(reshard, "fsdp_reshard_after_forward", path):
        # training.shard_model hands reshard_after_forward to the root's fully_shard too (fsdp.FullShardOptions.
        # root_reshard_after_forward; measured: validation/qlora_fsdp2)
        r.default("fsdp_reshard_after_forward", "plugin_options", {"fsdp": {"root_reshard_after_forward": True}},
                  "pytorch/torchtune v0.6.1: torchtune/training/_distributed.py (shard_model: fully_shard(model, "
                  "**fsdp_kwargs) on the root too)", "the root (embedding, LM head, final norm) resharded after the "
                  "model's forward as the layers are, gathered again for the backward")
    if offload is None:
        r.default("fsdp_cpu_offload", "offload", None, source("fsdp_cpu_offload", recipe), "no offload")
    elif as_bool(offload, "fsdp_cpu_offload", path):
        r.set("fsdp_cpu_offload", offload, "offload", "optimizer+gradients+parameters",
              "FSDP2 CPUOffloadPolicy: sharded parameters, gradients and the optimizer step on the host")
    else:
        r.ignore("fsdp_cpu_offload")
    tp = take("tensor_parallel_dim")
    if tp is None:
        r.default("tensor_parallel_dim", "tp_size", 1, source("tensor_parallel_dim", "full_finetune_distributed"))
    else:
        tp = as_int(tp, "tensor_parallel_dim", path)
        r.set("tensor_parallel_dim", cfg["tensor_parallel_dim"], "tp_size", tp)
        if tp > 1:
            r.set("tensor_parallel_dim", cfg["tensor_parallel_dim"], "sequence_parallel", False,
                  "torchtune's base_llama_tp_plan: column/row-wise linears, no sequence parallelism; the output "
                  "projection's logits replicated")
    plan = take("tensor_parallel_plan")
    if plan is not None:
        component = plan.get("_component_") if isinstance(plan, dict) else plan
        if not str(component).endswith("base_llama_tp_plan"):
            raise NotModelledError("tensor_parallel_plan._component_", component, "torchtune.models.llama3."
                                   "base_llama_tp_plan", f"{path}: another tensor-parallel plan is not read")
        r.ignore("tensor_parallel_plan")
    layers = take("custom_sharded_layers")
    units = {"tok_embeddings": "embedding", "output": "lm_head"}     # the fsdp rule's separate_units
    if layers and isinstance(layers, (list, tuple)) and set(layers) <= set(units) and \
            (r.values_of("data_parallel") or "fsdp") == "fsdp":
        # training.shard_model fully_shard's each module get_shard_conditions names as a unit of its own, before the
        # root (fsdp.FullShardOptions.separate_units; measured: validation/compile/measure_blocks_fsdp_custom.py)
        fsdp = dict((r.values_of("plugin_options") or {}).get("fsdp") or {})
        r.set("custom_sharded_layers", layers, "plugin_options",
              {"fsdp": {**fsdp, "separate_units": [units[n] for n in units if n in layers]}},
              "pytorch/torchtune v0.6.1: torchtune/training/_distributed.py (shard_model: fully_shard on every module "
              "get_shard_conditions(names_to_match=custom_sharded_layers) names, then on the model): the root unit "
              "keeps the final norm; the embedding and the output projection gathered only around their own forward "
              "and backward")
    elif layers:
        r.approx("custom_sharded_layers", layers, "data_parallel", r.values_of("data_parallel") or "fsdp",
                 "the named modules sharded as their own FSDP units: their gathered copies are counted as the root's "
                 "are (separate_units reads tok_embeddings and output under fsdp_reshard_after_forward: true)")


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="torchtune", description="torchtune recipe config (0.6.x), with tune run overrides",
                             framework="torchtune", suffixes=(".yaml", ".yml"), recognizes=_recognizes, read=_read)]
