"""torchtitan job configs: the v0.2.x TOML files (``--job.config_file``) and the JSON v0.2.x writes
with ``--job.save_config_file`` (the same sections), as torchtitan v0.2.2 runs them; and the
resolved JSON torchtitan 0.3.0 writes with ``--debug.save_config_file`` (``Trainer.Config.to_dict``:
a ``model_spec`` table with the whole model config, the loss, the activation-checkpointing policy's
fields). docs/launch.md, "torchtitan". Defaults are v0.2.2's ``torchtitan/config/job_config.py``;
a 0.3.0 dump is resolved: every value is in it.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError

from .hookspecs import LaunchFormatSpec
from ._common import Reading, as_bool, as_int, catalog_model, flatten, sink_kernel

VERSION = "torchtitan 0.2.2"
SOURCE = "pytorch/torchtitan v0.2.2: torchtitan/config/job_config.py"

# model.name / flavor -> the catalog's Hugging Face id.
FLAVORS = {
    ("llama3", "8B"): "meta-llama/Llama-3.1-8B", ("llama3", "70B"): "meta-llama/Llama-3.1-70B",
    ("llama3", "405B"): "meta-llama/Llama-3.1-405B",
    ("qwen3", "0.6B"): "Qwen/Qwen3-0.6B", ("qwen3", "1.7B"): "Qwen/Qwen3-1.7B", ("qwen3", "4B"): "Qwen/Qwen3-4B",
    ("qwen3", "8B"): "Qwen/Qwen3-8B", ("qwen3", "14B"): "Qwen/Qwen3-14B", ("qwen3", "32B"): "Qwen/Qwen3-32B",
    ("qwen3", "30B-A3B"): "Qwen/Qwen3-30B-A3B", ("qwen3", "235B-A22B"): "Qwen/Qwen3-235B-A22B-Instruct-2507",
    ("deepseek_v3", "671B"): "deepseek-ai/DeepSeek-V3",
    # the 16B flavor is DeepSeek-V2-Lite's architecture (v0.2.2 torchtitan/models/deepseek_v3/__init__.py lines
    # 78-100 at 73a0e69, 0.3.0's _16b: dim 2048, 27 layers (1 dense, inter 10944), 16 heads, vocab 102400, 64 routed
    # experts of 1408 top-6 softmax + 2 shared, q_lora_rank 0, kv_lora_rank 512, rope 64, nope 128, v 128: the
    # hub's config.json); a dump is checked against the catalog's (_check_model)
    ("deepseek_v3", "16B"): "deepseek-ai/DeepSeek-V2-Lite",
    ("llama4", "17bx128e"): "meta-llama/Llama-4-Maverick-17B-128E",
    ("gpt_oss", "20b"): "openai/gpt-oss-20b", ("gpt_oss", "120b"): "openai/gpt-oss-120b",
}
SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved1f1b": "interleaved-1f1b"}
# Sections and keys that do not change memory.
IGNORED_SECTIONS = {"job", "profiling", "metrics", "lr_scheduler", "checkpoint", "validation", "comm",
                    "fault_tolerance", "memory_estimation", "experimental", "float8", "mx"}
IGNORED_KEYS = {"model.hf_assets_path", "model.tokenizer_path", "model.print_after_conversion", "optimizer.lr",
                "optimizer.eps", "optimizer.weight_decay", "optimizer.beta1", "optimizer.beta2", "training.dataset",
                "training.dataset_path", "training.max_norm", "training.steps", "training.gc_freq",
                "training.gc_debug", "training.seed", "training.deterministic", "training.mixed_precision_reduce",
                "parallelism.enable_async_tensor_parallel", "parallelism.context_parallel_load_balancer",
                "parallelism.context_parallel_rotate_method", "parallelism.expert_parallel_comm_backend",
                "parallelism.pipeline_parallel_expert_parallel_overlap", "compile.components", "compile.backend",
                "activation_checkpoint.preserve_rng_state", "activation_checkpoint.determinism_check",
                "activation_checkpoint.debug", "activation_checkpoint.early_stop",
                "activation_checkpoint.per_op_sac_force_recompute_mm_shapes_by_fqns",
                "quantize.linear.float8.enable_fsdp_float8_all_gather",
                "quantize.linear.float8.precompute_float8_dynamic_scale_for_fsdp", "quantize.linear.float8.filter_fqns",
                "quantize.linear.float8.emulate", "quantize.grouped_mm.float8.fqns", "quantize.linear.mx.filter_fqns",
                "quantize.linear.mx.recipe_name", "quantize.grouped_mm.mx.recipe_name", "quantize.grouped_mm.mx.fqns"}


RESOLVED_VERSION = "torchtitan 0.3.0"
RESOLVED_SOURCE = "pytorch/torchtitan 0.3.0 (PyPI): torchtitan/trainer.py Trainer.Config.to_dict"
# The sections of a 0.3.0 dump that do not change memory (hf_assets_path and dump_folder are scalars).
RESOLVED_IGNORED = {"hf_assets_path", "dump_folder", "profiler", "metrics", "tokenizer", "dataloader", "lr_scheduler",
                    "checkpoint", "comm", "validator", "debug"}
RESOLVED_IGNORED_KEYS = {"parallelism.enable_fsdp_symm_mem", "parallelism.spmd_backend",
                         "parallelism.context_parallel_ptrr_mask_key", "training.disable_cuda_graphs",
                         "compile.enable_async_tensor_parallel"}
# Every key name a model config of torchtitan 0.3.0's registries holds (llama3, qwen3, deepseek_v3, gpt_oss):
# a name outside these (a converter's or LoRA's fields, e.g. ``rank``/``alpha``) is refused, never dropped.
MODEL_KEYS = frozenset(
    "attention attention_norm beta_fast beta_slow bias block_size dim elementwise_affine embedding_dim "
    "enable_weight_tying eps feed_forward ffn_norm gate head_dim hidden_dim high_freq_factor in_features "
    "inner_attention inner_experts kernel_options kv_lora_rank kv_norm layers lm_head load_balance_coeff "
    "low_freq_factor max_seq_len mlp1_bias_EG mlp1_weight_EGD mlp2_bias_ED mlp2_weight_EDF moe mscale mtp_layers "
    "n_heads n_kv_heads norm normalized_shape num_embeddings num_expert_groups num_experts num_limited_groups "
    "original_max_position_embeddings original_seq_len out_features param_init q_lora_rank q_norm qk_nope_head_dim "
    "qk_norm qk_rope_head_dim qkv_linear rope rope_factor route_norm route_scale routed_experts router scaling "
    "scaling_factor score_func sharding_config shared_experts sinks sliding_window_size swiglu_limit theta "
    "tok_embeddings token_dispatcher top_k truncate v_head_dim vocab_size w1 w1_EFD w2 w2_EDF w3 w3_EFD weight "
    "window_size wkv_a wkv_b wo wq wq_a wq_b wqkv".split())


def _model_keys(tree, prefix="model_spec.model"):
    """Every (dotted key, value) of the model tree (list items numbered)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield f"{prefix}.{key}", key, value
            yield from _model_keys(value, f"{prefix}.{key}")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            yield from _model_keys(value, f"{prefix}.{i}")


def _check_keys(model, path) -> None:
    """Every key of the dump's model config is one the registries' models have (a converter's or LoRA's
    fields are refused, naming the key), whichever model prices it."""
    for dotted, key, value in _model_keys(model):
        if key not in MODEL_KEYS and ".param_init." not in dotted:
            raise NotModelledError(dotted, value, "a model config of torchtitan 0.3.0's registries (no converter or "
                                   "LoRA fields)", f"{path}: a model-config key the reader does not know; refused "
                                   "rather than dropped")


def _check_model(model, hf: str, path, sinks: bool = False) -> str:
    """The dump's model config against the catalog's: the sizes memory depends on must agree."""
    from mlsysim_core.catalog import find_model
    want = find_model(hf).value
    layers = model.get("layers") or []
    got = {"model_spec.model.dim": (model.get("dim"), want.hidden_dim),
           "model_spec.model.vocab_size": (model.get("vocab_size"), want.vocab_size),
           "model_spec.model.layers": (len(layers), want.layers),
           "model_spec.model.enable_weight_tying": (bool(model.get("enable_weight_tying")), bool(want.tied_embeddings))}
    for i, layer in enumerate(layers):
        attention = layer.get("attention") or {}
        got[f"model_spec.model.layers.{i}.attention.n_heads"] = (attention.get("n_heads"), want.heads)
        if attention.get("n_kv_heads") is not None:
            got[f"model_spec.model.layers.{i}.attention.n_kv_heads"] = (attention["n_kv_heads"], want.kv_heads)
        ffn, moe = layer.get("feed_forward"), layer.get("moe")
        if ffn and not getattr(want, "is_sparse", False):
            got[f"model_spec.model.layers.{i}.feed_forward.w1.out_features"] = (ffn["w1"]["out_features"],
                                                                               want.ffn_dim)
        if moe:
            got[f"model_spec.model.layers.{i}.moe.num_experts"] = (moe.get("num_experts"), getattr(want, "experts", 0))
            got[f"model_spec.model.layers.{i}.moe.router.top_k"] = ((moe.get("router") or {}).get("top_k"),
                                                                  getattr(want, "active_experts_per_token", 0))
    for key, (value, expected) in got.items():
        if value != expected:
            raise NotModelledError(key, value, f"{expected} (the catalog's {hf})", f"{path}: the dump's model "
                                   "config differs from the flavor's in the catalog; give -m with a config.json")
    if model.get("mtp_layers"):
        raise NotModelledError("model_spec.model.mtp_layers", f"{len(model['mtp_layers'])} layers", "none",
                               f"{path}: multi-token-prediction layers are not modelled")
    return (f"the dump's model config checked against the catalog's {hf} (hidden size, vocabulary, layers, heads, "
            "MLP or experts)" + ("" if sinks else "; its attention (FlexAttention or varlen: fused, no s x s scores) "
                                 "priced as sdpa"))


# torchtitan's gpt-oss attention (the model module ``gpt_oss``, whatever the flavor): FlexAttention with the
# sinks applied through the kernel's log-sum-exp, ``out * sigmoid(lse - sink).to(out.dtype)`` (v0.2.2
# torchtitan/models/gpt_oss/model/model.py lines 241-254, ``attn_type = "flex"``, "gpt-oss only support
# FlexAttention" in model/args.py, at 73a0e69; 0.3.0 torchtitan/models/gpt_oss/model.py
# apply_attention_sink_rescale and Attention._apply_sinks, the FlexAttention.Config (block_size,
# kernel_options) or VarlenAttention.Config (window_size) that model_registry's attn_backend picks, "varlen"
# by default: torchtitan/models/gpt_oss/__init__.py; the same files at 659a0d2c, unchanged to 73aed7f6's parent).
GPT_OSS = "gpt_oss"
GPT_OSS_SOURCE = ("pytorch/torchtitan torchtitan/models/gpt_oss/model.py (0.3.0, PyPI; at 659a0d2c) "
                  "apply_attention_sink_rescale, v0.2.2 model/model.py lines 241-254 (73a0e69)")
FLEX_FIELDS = frozenset({"block_size", "kernel_options"})       # FlexAttention.Config (0.3.0 models/common/attention.py)
VARLEN_FIELDS = frozenset({"window_size"})                        # VarlenAttention.Config
FLEX_BLOCK = 128      # torch's _DEFAULT_SPARSE_BLOCK_SIZE, FlexAttention.Config.block_size's default: the BlockMask the
#                       measured profile prices (measured/architectures/gpt_oss.py FLEX_BLOCK)
def _sink_kernel(context, key, value, path) -> str:
    """The registered attention kernel whose declaration is what torchtitan's gpt-oss runs: torch's
    flex_attention (``computes="flex"``) with the sinks through its log-sum-exp (``sinks="lse"``), asked of
    each kernel's declaration, never its name (_common.sink_kernel); none registered: refused, naming ``key``."""
    name = sink_kernel(context)
    if name is None:
        raise NotModelledError(key, value, "a registered measured attention kernel declaring computes='flex' and "
                               "sinks='lse' (the built-in flex_attention)", f"{path}: torchtitan's gpt-oss attention "
                               "(FlexAttention, the sinks through its log-sum-exp) has no kernel to price it")
    return name


def _gpt_oss_attention(r: Reading, context, path, layers=None) -> None:
    """torchtitan's gpt-oss attention as the measured profile's ``attention``: FlexAttention (v0.2.2 always;
    a 0.3.0 dump's layers with FlexAttention.Config's fields) is the kernel declaring computes='flex',
    sinks='lse', its renormalisation approximated (the note); 0.3.0's VarlenAttention refused, naming the key."""
    key, value = "model.name", GPT_OSS
    if layers is not None:
        kinds = {}
        for i, layer in enumerate(layers):
            inner = (layer.get("attention") or {}).get("inner_attention") or {}
            fields = frozenset(inner) - {"param_init", "sharding_config"}
            kinds.setdefault(fields, (i, inner))
        if len(kinds) != 1:
            raise NotModelledError("model_spec.model.layers.*.attention.inner_attention", sorted(map(sorted, kinds)),
                                   "one inner attention for every layer", f"{path}: layers with different attention "
                                   "backends")
        fields, (i, inner) = next(iter(kinds.items()))
        key = f"model_spec.model.layers.{i}.attention.inner_attention"
        if fields == VARLEN_FIELDS:
            raise NotModelledError(key, {k: inner[k] for k in fields}, "FlexAttention.Config's fields (block_size, "
                                   "kernel_options: model_registry(..., attn_backend='flex'))",
                                   f"{path}: VarlenAttention (torch's varlen_attn, FlashAttention's varlen kernel, "
                                   "model_registry's default backend) with the sinks through its log-sum-exp: no "
                                   "registered measured attention kernel declares it (flex_attention declares "
                                   "computes='flex'); the 'flex' backend is priced")
        if fields != FLEX_FIELDS:
            raise NotModelledError(key, inner, "FlexAttention.Config's fields (block_size, kernel_options)",
                                   f"{path}: an inner attention torchtitan 0.3.0's gpt-oss does not run")
        if inner["block_size"] != FLEX_BLOCK:
            raise NotModelledError(f"{key}.block_size", inner["block_size"], f"{FLEX_BLOCK} (torch's default "
                                   "BlockMask block, the one the measured profile prices)", str(path))
        value = {k: inner[k] for k in sorted(fields)}
    kernel = _sink_kernel(context, key, value, path)
    r.approx(key, value, "attention", kernel,
             f"torchtitan's gpt-oss attention: compiled flex_attention (q, k, v at their heads' width under "
             f"enable_gqa, the output and the fp32 log-sum-exp kept, a BlockMask per window) with the sinks through "
             f"its log-sum-exp, out x sigmoid(lse - sink) ({GPT_OSS_SOURCE}): the kernel {kernel!r} declares "
             f"computes='flex', sinks='lse'. Its renormalisation is priced as transformers' (cat, logsumexp, exp: "
             f"4 x r x heads B per token and layer, r = 2 with 16-bit compute, else 4); torchtitan's sigmoid keeps "
             f"its fp32 output and that output cast to the attention's dtype (6 x heads with 16-bit compute, "
             f"4 x heads in fp32): 2 x heads B per token and layer fewer than priced with 16-bit compute, 12 x "
             f"heads in fp32" + ("; kernel_options tune the kernel's tiles, not what it keeps"
                                 if isinstance(value, dict) and value.get("kernel_options") else ""))


def _from_resolved(document, path, r: Reading, model=None):
    """A torchtitan 0.3.0 dump as the v0.2 keys the reader knows (same names where they are the same), the
    flavor's catalog id, and the model check's note. The dump writes each config's fields, not its class:
    the activation-checkpointing policy and the loss are told apart by their fields (classes of
    torchtitan 0.3.0: FullAC, SelectiveAC, MemoryBudgetAC; ChunkedLossWrapper, CrossEntropyLoss)."""
    spec = document.get("model_spec") or {}
    hf = FLAVORS.get((str(spec.get("name")), str(spec.get("flavor"))))
    _check_keys(spec.get("model") or {}, path)
    note = (_check_model(spec.get("model") or {}, hf, path, sinks=spec.get("name") == GPT_OSS)
            if hf is not None and model is None else "")
    r.note("torchtitan 0.3.0's dump names no config class: a model converter that only swaps a Linear config's "
           "class (Float8LinearConverter, MXFP8, NVFP4) leaves no trace in it; the linears are priced as written "
           "(bf16 compute)")
    cfg: dict = {}
    for section in ("training", "parallelism", "compile"):
        cfg.update(flatten({section: document.get(section) or {}}))
    for key, value in document.items():
        if key in ("model_spec", "training", "parallelism", "compile", "optimizer", "activation_checkpoint", "loss",
                   "override"):
            continue
        if key in RESOLVED_IGNORED:
            r.ignore(key)
        else:
            raise InvalidInputError(key, value, "a section of torchtitan 0.3.0's Trainer.Config this reader knows "
                                    "(docs/launch.md, torchtitan)", f"{path}: refused rather than dropped")
    imports = (document.get("override") or {}).get("imports")
    if imports:
        raise NotModelledError("override.imports", imports, "[] (no imported overrides)",
                               f"{path}: imported Python overrides change the model; Python is never executed")
    r.ignore("override")
    # The optimizer: one optimizer over every parameter group.
    opt = document.get("optimizer") or {}
    groups = opt.get("param_groups") or []
    names = {g.get("optimizer_name") for g in groups if isinstance(g, dict)}
    if len(names) != 1:
        raise NotModelledError("optimizer.param_groups", [g.get("optimizer_name") for g in groups],
                               "one optimizer for every group", f"{path}: several optimizers are not modelled")
    cfg["optimizer.name"] = names.pop()
    cfg["optimizer.implementation"] = opt.get("implementation", "fused")
    if opt.get("optimizer_factory_kwargs_by_name"):
        raise NotModelledError("optimizer.optimizer_factory_kwargs_by_name", opt["optimizer_factory_kwargs_by_name"],
                               "{}", str(path))
    for key in opt:
        if key not in ("param_groups", "implementation", "optimizer_factory_kwargs_by_name"):
            raise InvalidInputError(f"optimizer.{key}", opt[key], "param_groups, implementation, "
                                    "optimizer_factory_kwargs_by_name", f"{path}: refused rather than dropped")
    r.ignore("optimizer.param_groups.optimizer_kwargs")
    # Activation checkpointing: None, FullAC (the base fields only), SelectiveAC (per-op SAC: every second
    # matmul recomputed, the attention and the rest of its save list kept), MemoryBudgetAC (memory_budget).
    ac = document.get("activation_checkpoint")
    base = {"preserve_rng_state", "determinism_check", "debug"}
    if ac is None:
        cfg["activation_checkpoint.mode"] = "none"
    elif not isinstance(ac, dict) or not set(ac) >= base:
        raise InvalidInputError("activation_checkpoint", ac, "null or a torchtitan 0.3.0 policy's fields", str(path))
    elif set(ac) == base:
        cfg["activation_checkpoint.mode"] = "full"
    elif set(ac) == base | {"force_recompute_mm_shapes_by_fqns"}:
        cfg["activation_checkpoint.mode"] = "selective"
        cfg["activation_checkpoint.selective_ac_option"] = "op"
        r.note("activation_checkpoint: SelectiveAC (its fields force_recompute_mm_shapes_by_fqns): torchtitan "
               "0.3.0's per-op policy, v0.2.2's selective_ac_option 'op' (torchtitan/distributed/"
               "activation_checkpoint.py: the save list's outputs kept, every second matmul recomputed)")
    elif "memory_budget" in ac:
        raise NotModelledError("activation_checkpoint.memory_budget", ac["memory_budget"], "another policy",
                               f"{path}: MemoryBudgetAC (the compiler's min-cut under a budget) is not modelled")
    else:
        raise InvalidInputError("activation_checkpoint", ac, "the fields of FullAC, SelectiveAC or MemoryBudgetAC",
                                f"{path}: an activation-checkpointing policy this reader does not know")
    if isinstance(ac, dict):
        r.ignore("activation_checkpoint.preserve_rng_state/determinism_check/debug")
    return cfg, hf, note


def _resolved_loss(document, cfg, seen, r: Reading, path) -> None:
    """The loss of a 0.3.0 dump: ChunkedLossWrapper (num_chunks, loss_fn) or the plain CrossEntropyLoss."""
    loss = document.get("loss")
    source = ("pytorch/torchtitan 0.3.0 torchtitan/components/loss.py ChunkedLossWrapper (the loss and its "
              "backward inside the forward, chunk by chunk along the sequence; the measured profile's "
              "torchtitan_chunked, derived from b5bcd76c's, which chunks the flattened tokens: the same chunk sizes)")
    if isinstance(loss, dict) and set(loss) == {"num_chunks", "loss_fn"} and set(loss["loss_fn"] or {}) <= {
            "global_vocab_size"}:
        r.set("loss", "ChunkedLossWrapper", "loss", "torchtitan_chunked", source)
        r.set("loss.num_chunks", loss["num_chunks"], "loss_chunks", as_int(loss["num_chunks"], "loss.num_chunks",
                                                                           path))
    elif isinstance(loss, dict) and set(loss) <= {"global_vocab_size"}:
        r.set("loss", "CrossEntropyLoss", "loss", "cross_entropy", "torchtitan/components/loss.py cross_entropy_loss "
              "(F.cross_entropy(pred.flatten(0, 1).float(), ...)): the logits upcast whole")
    else:
        raise NotModelledError("loss", loss, "ChunkedLossWrapper's or CrossEntropyLoss's fields",
                               f"{path}: a loss this reader does not know")
    r.ignore("loss.loss_fn.global_vocab_size")


def _recognizes(path, document) -> bool:
    if not isinstance(document, dict):
        return False
    if "model_spec" in document and "parallelism" in document:     # torchtitan main's resolved dump
        return True
    model, parallelism = document.get("model"), document.get("parallelism")
    return isinstance(model, dict) and "flavor" in model and (
        isinstance(parallelism, dict) or isinstance(document.get("training"), dict) or "job" in document)


def _read(path, document, context):
    path = Path(path)
    resolved = "model_spec" in document
    if resolved:
        r = Reading("torchtitan", path, RESOLVED_VERSION)
        cfg, hf, model_note = _from_resolved(document, path, r, getattr(context, "model", None))
    else:
        version = f"torchtitan {context.framework_version}" if context is not None and context.framework_version \
            else VERSION
        r = Reading("torchtitan", path, version)
        cfg = flatten(document)
    seen: set[str] = set()

    def take(key, default=None):
        seen.add(key)
        return cfg.get(key, default)

    def get(key, default, field=None, note=""):
        """The file's value of ``key``, or torchtitan's default (recorded when ``field`` is given)."""
        seen.add(key)
        if key in cfg:
            return cfg[key], True
        if field is not None:
            r.default(key, field, default, SOURCE, note)
        return default, False

    # --- model ------------------------------------------------------------------------------
    if resolved:
        name, flavor = document["model_spec"].get("name"), document["model_spec"].get("flavor")
        if hf is None and getattr(context, "model", None) is None:
            raise NotModelledError("model_spec.flavor", f"{name}/{flavor}", "a flavor of a model in the catalog: "
                                   + ", ".join(f"{n}/{f}" for n, f in FLAVORS) + "; or give -m",
                                   f"{path}: no catalog model for this model_spec name and flavor")
        model, note = catalog_model(hf or "", "model_spec.flavor", path, context=context)
        r.set("model_spec.name/model_spec.flavor", f"{name}/{flavor}", "model", model,
              "; ".join(n for n in (note, model_note) if n))
        if name == GPT_OSS:
            _gpt_oss_attention(r, context, path, (document["model_spec"].get("model") or {}).get("layers") or [])
    else:
        name, flavor = take("model.name", "llama3"), take("model.flavor")
        hf = FLAVORS.get((str(name), str(flavor)))
        if hf is None and getattr(context, "model", None) is None:
            raise NotModelledError("model.flavor", f"{name}/{flavor}", "a flavor of a model in the catalog: "
                                   + ", ".join(f"{n}/{f}" for n, f in FLAVORS) + "; or give -m",
                                   f"{path}: no catalog model for this model.name and model.flavor")
        model, note = catalog_model(hf or "", "model.flavor", path, context=context)
        r.set("model.name/model.flavor", f"{name}/{flavor}", "model", model, note)
        if name == GPT_OSS:
            _gpt_oss_attention(r, context, path)
    converters = take("model.converters") or []
    if isinstance(converters, str):
        converters = [c for c in converters.split(",") if c]
    for converter in converters:
        if converter == "float8":
            recipe = take("quantize.linear.float8.recipe_name") or "tensorwise"
            if recipe not in ("tensorwise", "rowwise"):
                raise NotModelledError("quantize.linear.float8.recipe_name", recipe, "tensorwise or rowwise", str(path))
            r.set("model.converters", converters, "float8", recipe, "torchao float8 training")
        else:
            raise NotModelledError("model.converters", converters, "float8, or none", f"{path}: the converter "
                                   f"{converter!r} is not modelled")
    # --- batch and sequence -----------------------------------------------------------------
    local, _ = get("training.local_batch_size", 8)
    r.set("training.local_batch_size", local, "micro_batch_size", as_int(local, "training.local_batch_size", path),
          "per data-parallel rank")
    global_batch, given = get("training.global_batch_size", -1)
    if given and as_int(global_batch, "training.global_batch_size", path, minimum=-1) > 0:
        r.set("training.global_batch_size", global_batch, "global_batch_size", global_batch,
              "accumulation = global // (local x dp)")
    seq, given = get("training.seq_len", 2048)
    r.set("training.seq_len", seq, "seq_len", as_int(seq, "training.seq_len", path),
          "torchtitan's datasets are packed into fixed-length sequences" + ("" if given else
                                                                            " (the default, 2048)"))
    # --- precision --------------------------------------------------------------------------
    dtype, dtype_given = get("training.dtype", "float32")
    param, param_given = get("training.mixed_precision_param", "bfloat16")
    if dtype == "bfloat16":
        r.set("training.dtype", dtype, "regime", "bf16", "pure bf16 training")
    elif dtype == "float32":
        regime = "fsdp-bf16" if param == "bfloat16" else "fp32"
        note = ("FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on fp32 parameters"
                if regime == "fsdp-bf16" else "fp32")
        if dtype_given or param_given:
            r.set("training.mixed_precision_param" if param_given else "training.dtype",
                  param if param_given else dtype, "regime", regime, note)
        else:
            r.default("training.dtype/training.mixed_precision_param", "regime", regime, SOURCE,
                      "dtype float32, mixed_precision_param bfloat16: " + note)
    else:
        raise NotModelledError("training.dtype", dtype, "bfloat16 or float32", str(path))
    if as_bool(get("training.enable_cpu_offload", False)[0], "training.enable_cpu_offload", path):
        r.set("training.enable_cpu_offload", True, "offload", "optimizer+gradients+parameters", "FSDP2 CPUOffloadPolicy")
    # --- optimizer --------------------------------------------------------------------------
    opt, _ = get("optimizer.name", "AdamW")
    optimizer = {"AdamW": "adamw", "Adam": "adam"}.get(str(opt))
    if optimizer is None:
        raise NotModelledError("optimizer.name", opt, "AdamW or Adam", str(path))
    r.set("optimizer.name", opt, "optimizer", optimizer)
    impl, given = get("optimizer.implementation", "fused", None if "optimizer.implementation" in cfg
                      else "optimizer_impl")
    if given:
        r.set("optimizer.implementation", impl, "optimizer_impl", impl)
    if as_bool(get("optimizer.early_step_in_backward", False)[0], "optimizer.early_step_in_backward", path):
        r.set("optimizer.early_step_in_backward", True, "optimizer_in_backward", True)
    # --- parallelism ------------------------------------------------------------------------
    sizes = {}
    for key, field in (("tensor_parallel_degree", "tp_size"), ("pipeline_parallel_degree", "pp_size"),
                       ("context_parallel_degree", "cp_size"), ("expert_parallel_degree", "ep_size")):
        value, given = get(f"parallelism.{key}", 1)
        sizes[field] = as_int(value, f"parallelism.{key}", path)
        if given:
            r.set(f"parallelism.{key}", value, field, sizes[field])
    etp, given = get("parallelism.expert_tensor_parallel_degree", 1)
    if given and sizes["ep_size"] > 1:
        r.set("parallelism.expert_tensor_parallel_degree", etp, "expert_tp_size", as_int(etp, "etp", path))
    replicate, _ = get("parallelism.data_parallel_replicate_degree", 1)
    shard, _ = get("parallelism.data_parallel_shard_degree", -1)
    replicate = as_int(replicate, "parallelism.data_parallel_replicate_degree", path)
    shard = as_int(shard, "parallelism.data_parallel_shard_degree", path, minimum=-1)
    world = context.gpus if context is not None else None
    model_parallel = sizes["tp_size"] * sizes["pp_size"] * sizes["cp_size"]
    if shard == -1:
        if world is None:
            raise InvalidInputError("--gpus", None, "the number of GPUs (data_parallel_shard_degree = -1 takes what "
                                    "the world leaves)", str(path))
        shard = world // (replicate * model_parallel)
    elif shard >= 1:
        r.world["gpus"] = ("parallelism.*_degree", replicate * shard * model_parallel)
    r.set("parallelism.data_parallel_shard_degree", cfg.get("parallelism.data_parallel_shard_degree", -1),
          "dp_size", replicate * shard, f"dp = replicate {replicate} x shard {shard}")
    reshard, _ = get("parallelism.fsdp_reshard_after_forward", "default")
    # torchtitan's FSDP shards over dp_shard x cp (v0.2.2 torchtitan/distributed/parallel_dims.py fsdp_enabled:
    # "return self.dp_shard_enabled or self.cp_enabled"): a cp run is an FSDP run however few shards dp has
    if shard > 1 or sizes["cp_size"] > 1 or (replicate == 1 and (world or 1) > model_parallel):
        grad_op = reshard == "never" or (reshard == "default" and sizes["pp_size"] > 1)
        rule = "hsdp" if replicate > 1 else ("fsdp-grad-op" if grad_op else "fsdp")
        r.set("parallelism.data_parallel_shard_degree", shard, "data_parallel", rule,
              "FSDP2 fully_shard per block" + ("; replicated across data_parallel_replicate_degree" if
                                               rule == "hsdp" else ""))
    elif replicate > 1:
        r.set("parallelism.data_parallel_replicate_degree", replicate, "zero_stage", 0, "DDP (replicate only)")
        _ddp_precision(r, sizes)
    # The loss: v0.2.x has no loss section; torchtitan/components/loss.py cross_entropy_loss upcasts the whole
    # logits (pred.flatten(0, 1).float()) and calls F.cross_entropy: the default implementation's bytes.
    # (ChunkedLossWrapper, loss="torchtitan_chunked", is torchtitan 0.3.0's: _resolved_loss.)
    if resolved:
        _resolved_loss(document, cfg, seen, r, path)
    else:
        r.default("loss", "loss", "cross_entropy", "pytorch/torchtitan v0.2.2 torchtitan/components/loss.py "
                  "cross_entropy_loss (F.cross_entropy(pred.flatten(0, 1).float(), ...)): the logits upcast whole, "
                  "the fp32 log-softmax saved; no chunked loss before torchtitan main's ChunkedLossWrapper")
    if sizes["tp_size"] > 1:
        sp = as_bool(take("parallelism.enable_sequence_parallel") if resolved else True,
                     "parallelism.enable_sequence_parallel", path)
        r.set("parallelism.enable_sequence_parallel" if resolved else "parallelism.tensor_parallel_degree",
              sp if resolved else sizes["tp_size"], "sequence_parallel", sp,
              "torchtitan's TP plan: sequence parallel norms" if sp else "no sequence parallelism")
        disable, _ = get("parallelism.disable_loss_parallel", False, "loss_parallel",
                         "loss parallel on when tp > 1")
        r.set("parallelism.disable_loss_parallel", disable, "loss_parallel", not as_bool(disable, "loss", path))
    else:
        take("parallelism.disable_loss_parallel")
        take("parallelism.enable_sequence_parallel")
    if sizes["pp_size"] > 1:
        schedule, _ = get("parallelism.pipeline_parallel_schedule", "1F1B")
        mapped = SCHEDULES.get(str(schedule).lower())
        if mapped is None:
            raise NotModelledError("parallelism.pipeline_parallel_schedule", schedule, ", ".join(SCHEDULES), str(path))
        r.set("parallelism.pipeline_parallel_schedule", schedule, "pipeline_schedule", mapped)
        pp_micro, _ = get("parallelism.pipeline_parallel_microbatch_size", 1)
        r.approx("parallelism.pipeline_parallel_microbatch_size", pp_micro, "micro_batch_size",
                 as_int(pp_micro, "pipeline_parallel_microbatch_size", path),
                 "the local batch split into pipeline micro-batches, counted as accumulation steps")
        r.set("training.local_batch_size", local, "gradient_accumulation_steps",
              max(1, as_int(local, "training.local_batch_size", path) // as_int(pp_micro, "pp micro", path)))
        r.fields[:] = [f for f in r.fields if not (f.key == "training.local_batch_size"
                                                   and f.field == "micro_batch_size")]
    elif resolved:       # a resolved dump writes the pipeline's settings without a pipeline: no effect
        for key in ("pipeline_parallel_schedule", "pipeline_parallel_microbatch_size"):
            take(f"parallelism.{key}")
            r.ignore(f"parallelism.{key} (pp 1)")
    for key in ("pipeline_parallel_layers_per_stage", "module_fqns_per_model_part", "pipeline_parallel_schedule_csv"):
        value = take(f"parallelism.{key}")
        if value not in (None, "", []):
            raise NotModelledError(f"parallelism.{key}", value, "unset (an even split)", str(path))
    weights = {}
    for key in ("pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers"):
        weights[key] = take(f"parallelism.{key}")
    if sizes["pp_size"] > 1 and r.values_of("pipeline_schedule") in ("1f1b", "gpipe"):
        _stage_split(r, path, weights, sizes["pp_size"], model, context)
    elif sizes["pp_size"] > 1:
        for key, value in weights.items():
            if value not in (None, 1):
                raise NotModelledError(f"parallelism.{key}", value, "1 with an interleaved schedule", str(path))
        r.note("an interleaved schedule: the layers priced evenly over the model chunks, where torchtitan's "
               "generate_llm_fqn_per_model_part counts the embedding and the output as one layer each of the "
               "chunks' split (v0.2.2 torchtitan/distributed/pipeline_parallel.py)")
    # --- activation checkpointing -----------------------------------------------------------
    mode, given = get("activation_checkpoint.mode", "selective", None)
    option, option_given = get("activation_checkpoint.selective_ac_option", "2")
    if not given:
        r.default("activation_checkpoint.mode", "activation_checkpointing", "every-k" if str(option) != "op"
                  else "op-sac", SOURCE, "mode selective, selective_ac_option '2': every second layer recomputed")
    if mode == "none":
        r.set("activation_checkpoint.mode", mode, "activation_checkpointing", "none")
    elif mode == "full":
        r.set("activation_checkpoint.mode", mode, "activation_checkpointing", "full")
    elif mode == "selective":
        if str(option) == "op":
            r.set("activation_checkpoint.selective_ac_option", option, "activation_checkpointing", "op-sac",
                  "torchtitan's per-op SAC policy")
        else:
            k = as_int(option, "activation_checkpoint.selective_ac_option", path)
            if given:
                r.set("activation_checkpoint.selective_ac_option", option, "activation_checkpointing", "every-k",
                      f"every {k}-th layer recomputed whole")
            r.set("activation_checkpoint.selective_ac_option", option, "plugin_options", {"every-k": {"k": k}})
    else:
        raise NotModelledError("activation_checkpoint.mode", mode, "none, full or selective", str(path))
    if as_bool(get("compile.enable", False)[0], "compile.enable", path):
        # apply_compile: each TransformerBlock torch.compile'd apart when "model" is in compile.components;
        # build_cross_entropy_loss wraps the loss function in torch.compile when "loss" is (job_config.py
        # Compile.components, default ["model", "loss"]; torchtitan/components/loss.py at 73a0e69)
        components = take("compile.components")
        given = components is not None
        components = ["model", "loss"] if components is None else components
        components = [str(c) for c in (components if isinstance(components, (list, tuple)) else [components])]
        unknown = sorted(set(components) - {"model", "loss"})
        if unknown:
            raise InvalidInputError("compile.components", components, '"model" and/or "loss"', str(path))
        if "loss" in components and r.values_of("loss") not in (None, "cross_entropy"):
            # 0.3.0: ChunkedLossWrapper builds its inner loss_fn with the compile config, and BaseLoss._maybe_compile
            # wraps CrossEntropyLoss's cross_entropy_loss in torch.compile when compile.enable and "loss" in
            # compile.components: each chunk's logits go through the compiled loss, its backward run in the forward
            # (torchtitan 0.3.0 torchtitan/components/loss.py BaseLoss._maybe_compile, ChunkedLossWrapper.__init__)
            raise NotModelledError("compile.components", components, "no \"loss\" in compile.components "
                                   "(compile.enable false: the chunked loss eager, loss='torchtitan_chunked')",
                                   f"{path}: ChunkedLossWrapper's inner CrossEntropyLoss torch.compile'd chunk by chunk "
                                   "(BaseLoss._maybe_compile); the measured profile has no compiled form of "
                                   "torchtitan_chunked (the compiled cross_entropy_loss, compile='blocks+loss', is "
                                   "measured on the whole logits, compiled blocks with the chunked loss are not)")
        if "loss" in components and "model" not in components:
            raise NotModelledError("compile.components", components, '["model", "loss"] or ["model"]',
                                   f"{path}: the loss compiled with the blocks eager is not measured (compile='blocks+loss' "
                                   "is the blocks and the loss compiled)")
        if components == ["model"]:
            r.set("compile.enable", True, "compile", "blocks", "each TransformerBlock torch.compile'd apart "
                  "(torchtitan apply_compile; docs/compile.md)")
        elif components:
            r.set("compile.components" if given else "compile.enable", components if given else True, "compile",
                  "blocks+loss", "each TransformerBlock torch.compile'd apart and the loss function torch.compile'd "
                  "(apply_compile, build_cross_entropy_loss; docs/compile.md)" + (
                      "" if given else "; torchtitan's default components: model and loss"))
        else:
            r.ignore("compile.enable (compile.components [])")
    if resolved:
        graphs = not as_bool(take("training.disable_cuda_graphs"), "training.disable_cuda_graphs", path)
        if graphs:
            r.approx("training.disable_cuda_graphs", False, "regime", r.values_of("regime"),
                     "CUDA graphs capture the forward and backward (torchtitan 0.3.0's default; trainer.py "
                     "wrap_with_cuda_graph): the capture allocates what an eager step allocates, priced so; the "
                     "graph's private pool stays reserved between steps, so reserved memory exceeds the eager "
                     "run's (not priced)")
    _allocator(r, sizes)
    # --- the rest ---------------------------------------------------------------------------
    for key, value in cfg.items():
        if key in seen:
            continue
        section = key.split(".")[0]
        if section in IGNORED_SECTIONS or key in IGNORED_KEYS or key.startswith("training.dataloader.") or (
                resolved and key in RESOLVED_IGNORED_KEYS):
            r.ignore(key if section not in IGNORED_SECTIONS else section)
        else:
            raise InvalidInputError(key, value, "a torchtitan job config key this reader knows "
                                    "(docs/launch.md, torchtitan)", f"{path}: refused rather than dropped")
    return r.done()


def _stage_split(r: Reading, path, weights: dict, pp: int, model, context) -> None:
    """torchtitan's split of the decoder layers over a single-stage schedule's pp stages (v0.2.2
    torchtitan/distributed/pipeline_parallel.py pipeline_llm and generate_llm_fqn_per_model_part, lines 59-120 and
    236-345 at 73a0e69): the embedding counted as ``first_stage_less_layers`` layers and the norm and output as
    ``last_stage_less_layers`` (1 and 1 by default), L + both split as evenly as the stages allow (the first
    ``remainder`` stages one more), the first and last stages holding that many decoder layers fewer: the
    measured profile's ``stage_layers``."""
    if isinstance(model, dict):      # -m with a config.json's fields
        from mlsysim_core.hf import from_hf_config
        from mlsysim_core.catalog.files import structure_model
        layers = (from_hf_config(model) if "model_type" in model else structure_model(model)).layers
    elif hasattr(model, "layers"):
        layers = model.layers
    elif str(model).endswith(".json") and Path(str(model)).is_file():      # a local config.json
        import json
        from mlsysim_core.hf import from_hf_config
        layers = from_hf_config(json.loads(Path(str(model)).read_text())).layers
    else:
        from mlsysim_core.catalog import find_model
        layers = find_model(str(model)).value.layers
    key_in, key_out = "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers"
    w_in = as_int(1 if weights[key_in] is None else weights[key_in], f"parallelism.{key_in}", path, minimum=0)
    w_out = as_int(1 if weights[key_out] is None else weights[key_out], f"parallelism.{key_out}", path, minimum=0)
    effective = layers + w_in + w_out
    base, extra = divmod(effective, pp)
    for key, w in ((key_in, w_in), (key_out, w_out)):
        if base == 0 or w > base:
            raise InvalidInputError(f"parallelism.{key}", w, f"at most {base}, the fewest effective layers a stage "
                                    f"gets ({layers} layers + {w_in} + {w_out} over pp {pp})", f"{path}: torchtitan "
                                    "refuses the split (generate_llm_fqn_per_model_part)")
    sizes = [base + (i < extra) for i in range(pp)]
    split = [n - (w_in if i == 0 else w_out if i == pp - 1 else 0) for i, n in enumerate(sizes)]
    if 0 in split:
        raise NotModelledError(f"parallelism.{key_in if split[0] == 0 else key_out}", w_in if split[0] == 0 else w_out,
                               "a split leaving every stage a decoder layer", f"{path}: a stage of the embedding or "
                               "the output alone is not a stage the measured profile prices")
    note = (f"torchtitan's generate_llm_fqn_per_model_part: {layers} layers + the embedding as {w_in} and the output "
            f"as {w_out} over pp {pp}: {split}")
    given = [k for k in (key_in, key_out) if weights[k] is not None]
    if given:
        r.set("/".join(f"parallelism.{k}" for k in given), "/".join(str(weights[k]) for k in given), "stage_layers",
              split, note)
    else:
        r.default(f"parallelism.{key_in}/{key_out}", "stage_layers", split, SOURCE + " (1 and 1) and "
                  "torchtitan/distributed/pipeline_parallel.py generate_llm_fqn_per_model_part", note)


# torchtitan's launcher exports the allocator setting for every run it starts: run_llama_train.sh at 9dec370
# (PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True", validation/published/torchtitan_llama3_8b.py) and
# run_train.sh at 0168bd51 (PYTORCH_ALLOC_CONF="expandable_segments:True", the same setting's newer name).
LAUNCHER = ("pytorch/torchtitan run_llama_train.sh (9dec370) and run_train.sh (0168bd51): the launcher exports "
            "expandable_segments:True")


def _allocator(r, sizes) -> None:
    """The launcher's expandable segments, said: a job config does not carry the environment it runs in (the
    launcher's setting is not this file's), so the reserve stays the profile's fraction; the note says whether
    the measured profile's ``runtime_overheads.allocator='segments'`` describes this layout (measured/allocator.py:
    not ep, not CPU offload, not FSDP's SHARD_GRAD_OP rule, and FSDP2's stream pools not on a tp or pp rank), for a
    run known to have it."""
    fsdp = r.values_of("data_parallel")
    split = [f"{name}={sizes[name]}" for name in ("tp_size", "pp_size") if sizes[name] > 1 and fsdp]
    if sizes["ep_size"] > 1:
        split.append(f"ep_size={sizes['ep_size']}")
    if fsdp == "fsdp-grad-op":
        split.append("FSDP2 without resharding after the forward (fsdp-grad-op)")
    if r.values_of("offload"):
        split.append("training.enable_cpu_offload")
    r.note(f"{LAUNCHER}, which this file does not carry: the reserve above the allocated bytes is priced as the "
           "profile's fraction (runtime_overheads.allocator_fraction); " + (
               f"the allocator mechanism does not describe {', '.join(split)}" if split else
               "for a run known to have the setting, runtime_overheads={'allocator': 'segments', "
               "'expandable_segments': True} prices the caching allocator's segments and FSDP2's stream pools "
               "(measured/allocator.py)"))

def _ddp_precision(r, sizes) -> None:
    """Without FSDP (DDP, replicate only) torchtitan's mixed_precision_param is not a MixedPrecisionPolicy: v0.2.2
    torchtitan/distributed/utils.py (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce) maybe_enable_amp, "if
    parallel_dims.fsdp_enabled: ... handled by fully_shard", else with tp or pp "Mixed precision training is disabled"
    (fp32), else "torch.autocast(device_type, dtype=TORCH_DTYPE_MAP[mixed_precision_param])" (amp-bf16). The
    precision read earlier (fsdp-bf16, which needs an FSDP rule: Regime.requires) becomes that regime."""
    if r.values_of("regime") != "fsdp-bf16":
        return
    regime, how = (("fp32", "with tp or pp and no FSDP torchtitan disables mixed precision")
                   if sizes["tp_size"] > 1 or sizes["pp_size"] > 1 else
                   ("amp-bf16", "DDP without FSDP: torch.autocast in mixed_precision_param (bf16)"))
    why = f"{how} (torchtitan/distributed/utils.py maybe_enable_amp)"
    r.fields[:] = [attrs.evolve(f, becomes=regime, note=why) if f.field == "regime" else f for f in r.fields]
    r.defaults[:] = [attrs.evolve(d, value=regime, note=why) if d.field == "regime" else d for d in r.defaults]


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="torchtitan", description="torchtitan v0.2.x job config (TOML, or its saved JSON); "
                             "torchtitan 0.3.0's resolved dump (--debug.save_config_file)",
                             framework="torchtitan", suffixes=(".toml", ".json"), recognizes=_recognizes, read=_read)]
