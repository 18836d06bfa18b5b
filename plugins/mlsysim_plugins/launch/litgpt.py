"""LitGPT finetune and pretrain configs (``litgpt finetune_full|finetune_lora|pretrain --config FILE``,
the YAMLs of ``config_hub/``), as LitGPT 0.5.x runs them (docs/launch.md, "LitGPT").

Which command a file is for follows from its keys: ``lora_r`` -> ``finetune_lora``;
``model_name`` -> ``pretrain``; else ``finetune_full``. The model is ``checkpoint_dir``'s
Hugging Face id (``checkpoints/meta-llama/Llama-3.2-1B``), or a local ``config.json`` in it.
``precision`` is Lightning's (``bf16-true``: pure bf16; ``bf16-mixed``: autocast), ``quantize``
bitsandbytes' QLoRA, ``devices`` x ``num_nodes`` the world size, ``train.global_batch_size`` and
``train.micro_batch_size`` the batch and accumulation, ``train.max_seq_length`` the sequence.
"""

from __future__ import annotations

from pathlib import Path

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError

from .hookspecs import LaunchFormatSpec
from ._common import PRECISION_OF_REGIME, Reading, as_bool, as_int, catalog_model, flatten, regime_of, sequence

VERSION = "litgpt 0.5.13"
REPO = "Lightning-AI/litgpt 26857050 (v0.5.13)"

QUANTIZE = {"bnb.nf4": ("nf4", False), "bnb.nf4-dq": ("nf4", True), "bnb.fp4": ("fp4", False),
            "bnb.fp4-dq": ("fp4", True), "bnb.int8-training": ("int8", False)}
LORA_TARGETS = (("lora_query", ("q_proj",)), ("lora_key", ("k_proj",)), ("lora_value", ("v_proj",)),
                ("lora_projection", ("o_proj",)), ("lora_mlp", ("gate_proj", "up_proj", "down_proj")))
# LitGPT's setup() defaults for the LoRA switches (litgpt/finetune/lora.py).
LORA_DEFAULTS = {"lora_r": 8, "lora_query": True, "lora_key": False, "lora_value": True, "lora_projection": False,
                 "lora_mlp": False, "lora_head": False}
OPTIMIZERS = {"torch.optim.AdamW": "adamw", "AdamW": "adamw", "torch.optim.Adam": "adam", "Adam": "adam",
              "torch.optim.SGD": "sgd", "SGD": "sgd", "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw-8bit-bnb",
              "bitsandbytes.optim.AdamW8bit": "adamw-8bit-bnb"}
IGNORED = {"out_dir", "resume", "logger_name", "seed", "access_token", "tokenizer_dir", "initial_checkpoint_dir",
           "train.save_interval", "train.log_interval", "train.lr_warmup_steps", "train.lr_warmup_fraction",
           "train.epochs", "train.max_tokens", "train.max_steps", "train.max_norm", "train.min_lr", "log"}
# LitGPT's chunked_cross_entropy splits the sequence in 128-token chunks (litgpt/utils.py).
CHUNK_TOKENS = 128


def _recognizes(path, document) -> bool:
    return (isinstance(document, dict) and isinstance(document.get("train"), dict)
            and ("checkpoint_dir" in document or "model_name" in document or "model_config" in document)
            and ("micro_batch_size" in document["train"] or "global_batch_size" in document["train"]))


_WORKLOAD_FIELDS = ("name", "parameters", "layers", "hidden_dim", "heads", "kv_heads", "head_dim", "vocab_size",
                    "ffn_dim", "gated_mlp", "tied_embeddings", "context_length", "kv_lora_rank", "qk_rope_head_dim",
                    "architecture", "details")


def _untied(name, context):
    """LitGPT's GPT has its own ``lm_head`` beside ``transformer.wte`` (Lightning-AI/litgpt 26857050
    litgpt/model.py lines 28-31; its Llama-3.2 configs in litgpt/config.py set no tying, and
    ``train.tie_embeddings`` is unsupported by finetune, litgpt/finetune/full.py line 445): a catalog model
    whose Hugging Face config ties them is built untied, one more V x h matrix of weights, gradients and
    optimizer state. Returns ``(model, note)``; ``note`` empty when nothing changes (or -m is given)."""
    if getattr(context, "model", None) is not None or not isinstance(name, str):
        return name, ""
    from mlsysim_core.catalog import find_model
    try:
        entry = find_model(name)
    except Exception:
        return name, ""
    data = entry.to_dict()
    if not data.get("tied_embeddings") or data.get("kind") != "transformer" or "counting" in data:
        return name, ""     # (a catalog entry with its own counting rules, e.g. Falcon's, is kept as it is)
    fields = {k: v for k, v in data.items() if k in _WORKLOAD_FIELDS}
    fields["tied_embeddings"] = False
    fields["parameters"] = data["parameters"] + data["vocab_size"] * data["hidden_dim"]
    fields["name"] = f"{data['name']} (LitGPT: untied lm_head)"
    return fields, (f"{data['name']} as LitGPT builds it: its GPT keeps lm_head apart from the embedding "
                    "(Lightning-AI/litgpt 26857050 litgpt/model.py lines 28-31, no tying in its config), so "
                    f"{data['vocab_size'] * data['hidden_dim']:,} more parameters than the tied Hugging Face model")


_FSDP1 = ("Lightning's FSDPStrategy makes FSDP1's no_sync() (Lightning-AI/pytorch-lightning 2d347d0b "
          "src/lightning/fabric/strategies/fsdp.py, _FSDPBackwardSyncControl)")


_FSDP1_FORWARD = ("Lightning's FSDPStrategy wraps the model in FSDP1's FullyShardedDataParallel (Lightning-AI/"
                  "pytorch-lightning 2d347d0b src/lightning/fabric/strategies/fsdp.py), which frees every unit but the "
                  "root after its forward (the fsdp rule's fsdp_version=1)")


def _no_sync(r, global_batch, accumulation, where, how, strategy, devices=None) -> None:
    """LitGPT accumulates under ``fabric.no_backward_sync(model, enabled=is_accumulating)`` (``where``): on several
    devices every micro-batch but the step's last skips the gradient reduce-scatter, so each rank keeps its
    unsharded gradients between the synchronizing micro-batches (the fsdp rule's ``gradient_sync``, ``how``). Said
    when the accumulation is more than one micro-batch or unknown here (the world not given: harmless at one).
    Under FSDP1 (``how == "no_sync"``: Lightning's FSDPStrategy) the rule's ``fsdp_version=1`` too, in the same
    table (read from ``devices``, with or without accumulation)."""
    fsdp1 = how == "no_sync"
    if accumulation is not None and accumulation <= 1:
        if fsdp1:
            r.set("devices", devices, "plugin_options", {"fsdp": {"fsdp_version": 1}}, _FSDP1_FORWARD)
        return
    r.set("train.global_batch_size", global_batch, "plugin_options",
          {"fsdp": {"gradient_sync": how, **({"fsdp_version": 1} if fsdp1 else {})}},
          f"{accumulation or 'the'} micro-batches accumulated under fabric.no_backward_sync ({REPO}: litgpt/{where}); "
          f"{strategy}: the unsharded gradients kept between the synchronizing micro-batches"
          + (f"; {_FSDP1_FORWARD}" if fsdp1 else ""))


def _read(path, document, context):
    path = Path(path)
    r = Reading("litgpt", path, VERSION)
    asked = getattr(context, "framework_version", None)
    if asked and str(asked).strip() not in VERSION:
        r.note(f"--framework-version {asked}: this reader knows {VERSION}'s defaults only; those are applied")
    cfg = flatten(document)
    lora = any(k.startswith("lora_") for k in document)
    pretrain = "model_name" in document or "model_config" in document
    command = "finetune_lora" if lora else "pretrain" if pretrain else "finetune_full"
    r.note(f"read as `litgpt {command.replace('_', ' ', 1) if command != 'pretrain' else 'pretrain'}` (its keys say so)")
    seen: set[str] = set()

    def take(key, default=None):
        seen.add(key)
        return cfg.get(key, default)

    # --- the model ------------------------------------------------------------------------
    if pretrain:
        if document.get("model_config") and getattr(context, "model", None) is None:
            raise NotModelledError("model_config", document["model_config"], "model_name of a catalog model, or -m",
                                   f"{path}: LitGPT's own model_config fields are not read")
        take("model_config")
        name = take("model_name")
        resolved, note = catalog_model(str(name), "model_name", path, context=context)
        r.set("model_name", name, "model", resolved, note)
    else:
        directory = str(take("checkpoint_dir"))
        hf_id = directory.split("checkpoints/", 1)[-1].strip("/")
        local = Path(directory) if Path(directory).is_absolute() else path.parent / directory
        resolved, note = catalog_model(str(local) if (local / "config.json").is_file() else hf_id, "checkpoint_dir",
                                       path, context=context)
        r.set("checkpoint_dir", directory, "model", resolved, note or f"the Hugging Face id {hf_id}")
    model, untied = _untied(r.values_of("model"), context)
    if untied:
        first = next(f for f in r.fields if f.field == "model")
        r.fields.remove(first)
        r.set(first.key, first.value, "model", model, untied)
    # --- precision and quantization -------------------------------------------------------
    precision = take("precision")
    if precision is None:
        raise InvalidInputError("precision", None, "bf16-true, bf16-mixed, 32-true, 16-mixed", str(path))
    regime = regime_of(precision, "precision", path)
    r.set("precision", precision, "regime", regime, {"bf16": "Lightning's bf16-true: the model, gradients and "
          "optimizer state in bf16", "amp-bf16": "Lightning's bf16-mixed: fp32 weights, autocast"}.get(regime, ""))
    r.set("precision", precision, "precision", PRECISION_OF_REGIME[regime])
    quantize = take("quantize")
    if quantize:
        if not lora:
            raise NotModelledError("quantize", quantize, "no quantization (QLoRA: with the LoRA command)", str(path))
        if quantize not in QUANTIZE:
            raise NotModelledError("quantize", quantize, ", ".join(QUANTIZE), str(path))
        kind, dq = QUANTIZE[quantize]
        r.set("quantize", quantize, "lora", {"quantization": kind, "double_quant": dq}, "bitsandbytes (QLoRA)")
    # --- world and batch ------------------------------------------------------------------
    devices, nodes = take("devices"), take("num_nodes", 1)
    nodes = as_int(nodes if nodes is not None else 1, "num_nodes", path)
    if devices not in (None, "auto", -1):
        devices = as_int(devices, "devices", path)
        r.world["nodes"] = ("num_nodes", nodes)
        r.world["gpus_per_node"] = ("devices", devices)
    world = devices * nodes if isinstance(devices, int) and devices > 0 else None
    micro = as_int(take("train.micro_batch_size"), "train.micro_batch_size", path)
    r.set("train.micro_batch_size", micro, "micro_batch_size", micro, "per device")
    global_batch = take("train.global_batch_size")
    if global_batch is not None:
        r.set("train.global_batch_size", global_batch, "global_batch_size",
              as_int(global_batch, "train.global_batch_size", path),
              "accumulation = global // (devices x nodes) // micro-batch (litgpt/args.py)")
    # --- sequence -------------------------------------------------------------------------
    length = take("train.max_seq_length")
    data = document.get("data")
    seen.update(k for k in cfg if k == "data" or k.startswith("data."))
    if data is not None:
        r.ignore("data")
    sequence(r, "train.max_seq_length", length, packed=pretrain, context=context,
             packed_key="pretraining data (fixed-length blocks)")
    # --- strategy: FSDP and checkpointing -------------------------------------------------
    ranks = world or getattr(context, "gpus", None)
    accumulation = (as_int(global_batch, "train.global_batch_size", path) // ranks // micro
                    if global_batch is not None and ranks else None)
    if lora:
        if world is not None and world > 1:
            r.set("devices", devices, "data_parallel", "fsdp", "litgpt finetune_lora: ModelParallelStrategy "
                  "(FSDP2 fully_shard per Block)")
            _no_sync(r, global_batch, accumulation, "finetune/lora.py line 354", "step",
                     "Lightning's ModelParallelStrategy makes FSDP2's set_requires_gradient_sync(False) "
                     "(Lightning-AI/pytorch-lightning src/lightning/fabric/strategies/model_parallel.py, "
                     "_ParallelBackwardSyncControl)")
        r.set("devices", devices, "activation_checkpointing", "none", "litgpt finetune_lora: no checkpointing")
    elif pretrain:
        r.set("devices", devices, "activation_checkpointing", "none", "litgpt pretrain: FSDPStrategy without "
              "checkpointing")
        if world is None or world > 1:
            r.approx("devices", devices, "data_parallel", "fsdp", "litgpt pretrain: FSDP HYBRID_SHARD (sharded "
                     "within a node, replicated across nodes), counted as FSDP over all ranks: exact on one node")
            _no_sync(r, global_batch, accumulation, "pretrain.py line 352", "no_sync", _FSDP1, devices)
    else:
        if world is None or world > 1:
            r.set("devices", devices, "data_parallel", "fsdp", "litgpt finetune_full: FSDPStrategy(auto_wrap_policy="
                  "{Block}), full shard")
            r.set("devices", devices, "activation_checkpointing", "full", "litgpt finetune_full on several devices: "
                  "activation_checkpointing_policy={Block}")
            _no_sync(r, global_batch, accumulation, "finetune/full.py line 281", "no_sync", _FSDP1, devices)
        else:
            r.set("devices", devices, "activation_checkpointing", "none", "litgpt finetune_full on one device: "
                  "strategy auto, no checkpointing")
    # --- the loss -------------------------------------------------------------------------
    # litgpt/utils.py chunked_cross_entropy (chunk_size 128), registered as loss='litgpt_chunked' from
    # finetune/full.py's call (lines 282-285: the whole logits, logits[..., :-1, :]).
    if command == "finetune_full":
        r.set("train.max_seq_length", length, "loss", "litgpt_chunked", f"{REPO}: litgpt/finetune/full.py:282-285 "
              f"chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:]): {CHUNK_TOKENS}-token chunks in the "
              "logits' dtype, the logits held through the backward")
    elif command == "pretrain":
        r.approx("train.max_seq_length", length, "loss", "litgpt_chunked", f"{REPO}: litgpt/pretrain.py:353-354 "
                 "chunked_cross_entropy(logits, targets): the logits unshifted, so the reshape is a view; counted as "
                 "finetune_full's call, whose shifted copy (micro-batch > 1) and the slice's zero-filled gradient "
                 "pretrain does not make (an upper bound)")
    else:       # the profile prices this call under LoRA (measured.published_losses.litgpt_lora_terms)
        r.set("train.max_seq_length", length, "loss", "litgpt_chunked", f"{REPO}: litgpt/finetune/lora.py:355-358 "
              "model(input_ids, lm_head_chunk_size=128) then chunked_cross_entropy(logits, ...): the frozen LM head "
              "chunked as well (a list of 128-token logits), the list path")
    r.default("chunked_cross_entropy.chunk_size", "loss_chunks", CHUNK_TOKENS,
              f"{REPO}: litgpt/utils.py chunked_cross_entropy(chunk_size=128) (tokens per chunk)")
    # --- optimizer ------------------------------------------------------------------------
    optimizer = document.get("optimizer")
    seen.update(k for k in cfg if k == "optimizer" or k.startswith("optimizer."))
    if isinstance(optimizer, str):
        optimizer = {"class_path": optimizer}
    if optimizer is None:
        r.default("optimizer", "optimizer", "adamw", f"{REPO}: litgpt/finetune/full.py setup(optimizer='AdamW')")
    else:
        component = optimizer.get("class_path")
        name = OPTIMIZERS.get(component)
        if name is None:
            raise NotModelledError("optimizer.class_path", component, ", ".join(OPTIMIZERS), str(path))
        r.set("optimizer.class_path", component, "optimizer", name)
        for key, value in (optimizer.get("init_args") or {}).items():
            if key in ("lr", "weight_decay", "betas", "eps", "momentum"):
                r.ignore(f"optimizer.init_args.{key}")
            elif key == "fused" and as_bool(value, "optimizer.init_args.fused", path):
                r.set("optimizer.init_args.fused", value, "optimizer_impl", "fused")
            else:
                raise InvalidInputError(f"optimizer.init_args.{key}", value, "lr, weight_decay, betas, eps, momentum, "
                                        "fused", f"{path}: refused rather than dropped")
        if not (optimizer.get("init_args") or {}).get("fused"):
            r.default("optimizer.init_args.fused", "optimizer_impl", "foreach",
                      "PyTorch torch.optim: foreach on CUDA when neither is given")
    # --- LoRA -----------------------------------------------------------------------------
    if lora:
        rank = take("lora_r", None)
        if rank is None:
            r.default("lora_r", "lora", {"rank": 8}, f"{REPO}: litgpt/finetune/lora.py setup(lora_r=8)")
            rank = 8
        else:
            r.set("lora_r", rank, "lora", {"rank": as_int(rank, "lora_r", path)})
        targets = []
        for key, names in LORA_TARGETS:
            value = take(key, None)
            on = LORA_DEFAULTS[key] if value is None else as_bool(value, key, path)
            if on:
                targets += names
            if value is None:
                r.default(key, "lora", {}, f"{REPO}: litgpt/finetune/lora.py setup({key}={LORA_DEFAULTS[key]})")
        if not targets:
            raise InvalidInputError("lora_query", False, "at least one LoRA target switched on", str(path))
        r.set("precision", precision, "lora", {"adapter_dtype": "base"},
              f"{REPO}: litgpt/finetune/lora.py:210-211: the GPT, its LoRA adapters included, is built under "
              "fabric.init_module() in the run's precision (or BitsandbytesPrecision's dtype): the adapters in the "
              "base's dtype, not peft's fp32")
        head = take("lora_head", None)
        if head is not None and as_bool(head, "lora_head", path):
            targets += ["lm_head"]
            r.set("lora_head", head, "lora", {"target_modules": targets}, "LoRALinear on the output head (lm_head, "
                  "LitGPT's lora.py GPT: create_lora_linear(..., r=config.lora_r if config.lora_head else 0)): "
                  "r x (h + V) adapter parameters, its input and r-wide output saved")
        elif head is not None:
            r.ignore("lora_head")
        r.set("lora_query/lora_key/lora_value/lora_projection/lora_mlp", [k for k, _ in LORA_TARGETS if cfg.get(
            k, LORA_DEFAULTS[k])], "lora", {"target_modules": targets},
            "LitGPT's fused qkv linear with LoRA on the enabled parts: the same adapter shapes as separate q/k/v")
        if take("lora_alpha") is not None:
            r.ignore("lora_alpha")
        dropout = take("lora_dropout")
        if dropout:
            r.approx("lora_dropout", dropout, "lora", {"rank": as_int(rank, "lora_r", path)},
                     "the adapters' dropout mask and dropped input are not counted")
    tie = take("train.tie_embeddings")
    if tie is not None:
        raise NotModelledError("train.tie_embeddings", tie, "null (the checkpoint's own)", f"{path}: retying the "
                               "embeddings changes the parameters")
    for key in cfg:
        if key in seen:
            continue
        top = key.split(".")[0]
        if key in IGNORED or top in IGNORED or top == "eval":
            r.ignore(key if top != "eval" else "eval")
        else:
            raise InvalidInputError(key, cfg[key], "a LitGPT config key this reader knows (docs/launch.md, LitGPT)",
                                    f"{path}: refused rather than dropped, as it may change memory")
    return r.done()


@hookimpl
def mlsysim_launch_formats():
    return [LaunchFormatSpec(name="litgpt", description="LitGPT finetune/pretrain config YAML (0.5.x)",
                             framework="litgpt", suffixes=(".yaml", ".yml"), recognizes=_recognizes, read=_read)]
