"""What the Hugging Face ecosystem's launch readers share (hf_trainer, accelerate, deepspeed,
llamafactory, axolotl): a builder of one file's `LaunchReading`, the optimizer names of
transformers' ``OptimizerNames``, the DeepSpeed JSON (with ``"auto"`` resolved as transformers'
DeepSpeed integration resolves it), FSDP settings, and the TrainingArguments fields.

Versions the defaults assume (each default says its source):

* transformers 5.23.0 (``transformers/training_args.py``, ``transformers/integrations/deepspeed.py``);
* TRL 1.9 (huggingface/trl at f2cd57710ae345ea6428ae95363267fcf38a3dc8: ``trl/trainer/sft_config.py``,
  ``trl/trainer/base_config.py``, ``trl/trainer/utils.py``);
* DeepSpeed at deepspeedai/DeepSpeed 1b88ac366fc922254d56abda5cf6b1f266556d19
  (``deepspeed/runtime/zero/config.py``);
* accelerate 1.15.0.dev0 (huggingface/accelerate at 16cb6eb80dd9aa8b4df1a63ef57863e455d53b83).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.scenario import LaunchDefault, LaunchField, LaunchReading

TRANSFORMERS = "transformers 5.23.0"
TRL = "TRL 1.9"
DEEPSPEED = "DeepSpeed (deepspeedai/DeepSpeed 1b88ac36)"
ACCELERATE = "accelerate 1.15"
TA_SOURCE = "transformers 5.23.0 src/transformers/training_args.py"
DS_SOURCE = "deepspeedai/DeepSpeed@1b88ac36 deepspeed/runtime/zero/config.py"
HF_DS_SOURCE = "transformers 5.23.0 src/transformers/integrations/deepspeed.py (trainer_config_finalize)"


class Reading:
    """The builder of one file's LaunchReading: every key goes through exactly one of
    ``set``/``ignore``/``refuse``; ``done`` refuses any key left unaccounted for."""

    def __init__(self, fmt: str, path, framework_version: str, context=None):
        self.format, self.path, self.version = fmt, Path(path), framework_version
        self.context = context
        self.fields: list[LaunchField] = []
        self.defaults: list[LaunchDefault] = []
        self.ignored: list[str] = []
        self.notes: list[str] = []
        self.world: dict[str, tuple[str, Any]] = {}
        self.seen: set[str] = set()

    def set(self, key, value, field, becomes, note="", approximated=False, yields=False):
        self.seen.add(key)
        self.fields.append(LaunchField(key=key, value=value, field=field, becomes=becomes, note=note,
                                       approximated=approximated, yields=yields))

    def approx(self, key, value, field, becomes, note):
        self.set(key, value, field, becomes, note, approximated=True)

    def derived(self, key, value, field, derive, own, yields=False, also=()):
        """``field`` as a function of the run's merged mixed precision (`LaunchField.derive`, resolved by
        from_launch after the merge): ``derive(mixed)`` (bf16, fp16 or None) returns ``(becomes, note)`` or
        ``(becomes, note, approximated)``, or None when the key then sets nothing; ``own``: the mixed precision
        this file alone says. ``also``: other fields the value depends on (``lora``: whether the base is stored
        4-bit), as all the files give them: ``derive(mixed, merged)`` then (``merged``: those fields' values,
        this file's own for ``own``)."""
        def resolve(merged):
            mixed = sixteen(merged.get("precision"))
            out = derive(mixed, merged) if also else derive(mixed)
            if out is None:
                return {"becomes": None, "note": f"sets no {field} (no 16-bit mixed precision in the run)"}
            return {"becomes": out[0], "note": out[1], "approximated": (
                mixed == "fp16" and out[0] in BF16_BYTES) or (len(out) > 2 and out[2])}
        own_value = resolve({"precision": own, **{name: self.own(name) for name in also if self.own(name)}})
        self.seen.add(key)
        self.fields.append(LaunchField(key=key, value=value, field=field, yields=yields,
                                       derived_from=("precision", *also), derive=resolve, **own_value))

    def own(self, field):
        """What this file alone gives ``field`` so far (its defaults, then its fields; tables merged key by key, as
        from_launch merges them), None if nothing."""
        given = None
        for becomes in [d.value for d in self.defaults if d.field == field] + [
                f.becomes for f in self.fields if f.field == field and f.becomes is not None]:
            given = {**given, **becomes} if isinstance(given, dict) and isinstance(becomes, dict) else becomes
        return given

    def note(self, key, value, text):
        """A key read whose effect is only said (its value changes nothing the model prices)."""
        self.seen.add(key)
        self.notes.append(f"{key}={value!r}: {text}")

    def default(self, key, field, value, source, note="", version=None):
        self.defaults.append(LaunchDefault(key=key, field=field, value=value, version=version or self.version,
                                           source=source, note=note))

    def ignore(self, key):
        self.seen.add(key)
        if key not in self.ignored:
            self.ignored.append(key)

    def refuse(self, key, value, allowed, why):
        raise NotModelledError(f"{self.path}: {key}", value, allowed, why)

    def unknown(self, key, value, known="the keys docs/launch-hf.md lists"):
        raise NotModelledError(f"{self.path}: {key}", value, known,
                               f"an unknown {self.format} key: never silently dropped")

    def has(self, field) -> bool:
        return any(f.field == field for f in self.fields)

    def done(self) -> LaunchReading:
        self._no_sync_names_the_rule()
        return LaunchReading(format=self.format, path=str(self.path), fields=self.fields, defaults=self.defaults,
                             ignored=self.ignored, world=self.world, framework_version=self.version,
                             notes=self.notes)


    def _no_sync_names_the_rule(self) -> None:
        """``fsdp_config``'s accumulation default (``NO_SYNC_KEY``), or the ``fsdp_version`` field that carries it,
        names the rule the file ends with: accelerate's ``parallelism_config`` or the Trainer's
        ``fsdp: hybrid_shard`` may make it ``hsdp`` after the table is read, the Trainer's ``shard_grad_op``
        ``fsdp-grad-op`` (``_for_rule``: what that rule takes of it)."""
        mine = [d for d in self.defaults if d.field == "plugin_options" and d.key.endswith(NO_SYNC_KEY)]
        read = [f for f in self.fields if f.field == "plugin_options" and any(
            isinstance(v, dict) and "fsdp_version" in v for v in f.becomes.values())]   # fsdp_config's fsdp_version
        if not mine and not read:
            return
        rule = next((f.becomes for f in reversed(self.fields) if f.field == "data_parallel"), None) or next(
            (d.value for d in self.defaults if d.field == "data_parallel"), None)
        for d in mine:
            i = self.defaults.index(d)
            options = _for_rule(rule, next(iter(d.value.values())))
            if options:
                self.defaults[i] = attrs.evolve(d, value={rule: options})
            else:
                del self.defaults[i]
        for f in read:
            i = self.fields.index(f)
            options = _for_rule(rule, next(iter(f.becomes.values())))
            if options:
                self.fields[i] = attrs.evolve(f, becomes={rule: options})
            else:
                del self.fields[i]
                self.ignore(f.key)


def _for_rule(rule, options: dict) -> dict | None:
    """What the final FSDP rule takes of ``fsdp_config``'s options (``gradient_sync``, and ``fsdp_version`` when 1):
    FULL_SHARD and HYBRID_SHARD all of it; SHARD_GRAD_OP (``fsdp-grad-op``) its ``gradient_sync``: FSDP1's
    ``no_sync`` (the gathered parameters and the unsharded gradients kept between the synchronizing micro-batches)
    or FSDP2's ``step`` (accelerate 1.16.0 accelerator.py lines 1126-1131: Accelerator.no_sync under FSDP2 is
    ``set_requires_gradient_sync(False)`` whatever ``reshard_after_forward``; the unsharded gradients in
    reduce_dtype), fsdp.GRADIENT_SYNC; no fsdp_version: that rule keeps every gathered unit from the forward to
    the backward under either (the same bytes), but FSDP1's under LoRA with a 16-bit param_dtype keeps each
    adapter's input copy (lora.fsdp1_adapter_input_cast): its ``fsdp_version`` 1 too; another rule nothing."""
    if rule in ("fsdp", "hsdp"):
        return options
    if rule == "fsdp-grad-op":
        taken = {k: v for k, v in options.items()
                 if k == "fsdp_version" or (k == "gradient_sync" and v in ("no_sync", "step"))}
        return taken or None
    return None


def is_true(value) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "yes", "1"))


def whole(r: Reading, key, value, minimum=1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < minimum:
        raise InvalidInputError(f"{r.path}: {key}", value, f"a whole number >= {minimum}")
    return int(value)


# --- the model -------------------------------------------------------------------------------

def model_name(r: Reading, key, value):
    """A Hugging Face id or catalog name to the catalog's name; a local folder's config.json;
    else refused naming the key."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{r.path}: {key}", value, "a Hugging Face model id or a catalog model name")
    from mlsysim_core.catalog import find_model
    try:
        entry = find_model(value)
    except Exception:
        entry = None
    if entry is not None:
        r.set(key, value, "model", entry.key)
        return entry.key
    local = (r.path.parent / value)
    if (local / "config.json").is_file():
        r.set(key, value, "model", str(local / "config.json"))
        return str(local / "config.json")
    # Not resolvable: refused naming the key, unless -m gives the model (then said: -m replaces it).
    if getattr(r.context, "model", None) is None:
        raise InvalidInputError(f"{r.path}: {key}", value, "a model in the catalog (mlsysim-core models), a Hugging "
                                "Face id of one, or a local folder with its config.json; or give -m",
                                "not found in the catalog")
    r.seen.add(key)
    r.notes.append(f"{key}={value!r} is not in the catalog (mlsysim-core models): -m {r.context.model} is taken")
    return None


def hidden_size(model) -> int | None:
    """The model's hidden size (for DeepSpeed's "auto" bucket sizes); None when unknown."""
    if model is None:
        return None
    try:
        if isinstance(model, str) and model.endswith(".json"):
            import json
            data = json.loads(Path(model).read_text())
            data = data.get("text_config", data)
            return int(data.get("hidden_size") or data.get("n_embd"))
        from mlsysim_core.catalog import find_model
        return int(find_model(model).value.hidden_dim)
    except Exception:
        return None


# --- optimizers: every value of transformers 5.23.0's OptimizerNames -----------------------

# name -> (optimizer, optimizer_impl, note); a str value is the reason it is refused.
OPTIMIZERS: dict[str, Any] = {
    "adamw_torch": ("adamw", "foreach", "torch.optim.AdamW, foreach on CUDA (PyTorch's default)"),
    "adamw_torch_fused": ("adamw", "fused", "torch.optim.AdamW(fused=True)"),
    "adamw_torch_xla": "AdamW on XLA (TPU): not a CUDA device",
    "adamw_torch_npu_fused": "AdamW fused on Ascend NPU: not a CUDA device",
    "adafactor": ("adafactor", None, "transformers' Adafactor (factored second moment)"),
    "adamw_anyprecision": "torchdistx AnyPrecisionAdamW (Kahan summation buffers): not modelled",
    "adamw_torch_4bit": ("adamw-4bit-torchao", None, "torchao AdamW4bit"),
    "adamw_torch_8bit": ("adamw-8bit-torchao", None, "torchao AdamW8bit"),
    "ademamix": "AdEMAMix (three state tensors): not modelled",
    "sgd": ("sgd", None, "torch.optim.SGD (no momentum unless optim_args says so)"),
    "adagrad": "Adagrad: not modelled",
    # (8-bit bitsandbytes: the Trainer gives every nn.Embedding weight 32-bit states, trainer.py create_optimizer)
    "adamw_bnb_8bit": ("adamw-8bit-bnb-hf", None, "bitsandbytes AdamW8bit, embeddings at 32-bit state"),
    "adamw_8bit": ("adamw-8bit-bnb-hf", None, "bitsandbytes AdamW8bit (alias of adamw_bnb_8bit)"),
    "ademamix_8bit": "8-bit AdEMAMix: not modelled",
    "lion_8bit": "bitsandbytes 8-bit Lion: not modelled (lion is its 32-bit state)",
    "lion_32bit": ("lion-32bit-bnb", None, "bitsandbytes Lion32bit: one fp32 momentum, in-place kernel"),
    "paged_adamw_32bit": ("paged-adamw-32bit-bnb", None, "bitsandbytes PagedAdamW32bit"),
    "paged_adamw_8bit": ("paged-adamw-8bit-bnb-hf", None, "bitsandbytes PagedAdamW8bit, embeddings at 32-bit state"),
    "paged_ademamix_32bit": "paged AdEMAMix: not modelled",
    "paged_ademamix_8bit": "paged 8-bit AdEMAMix: not modelled",
    "paged_lion_32bit": ("paged-lion-32bit-bnb", None, "bitsandbytes PagedLion32bit"),
    "paged_lion_8bit": "paged 8-bit Lion: not modelled",
    "rmsprop": "RMSprop: not modelled",
    "rmsprop_bnb": "bitsandbytes RMSprop: not modelled",
    "rmsprop_bnb_8bit": "bitsandbytes 8-bit RMSprop: not modelled",
    "rmsprop_bnb_32bit": "bitsandbytes 32-bit RMSprop: not modelled",
    "galore_adamw": "GaLore (low-rank projected state): not modelled",
    "galore_adamw_8bit": "GaLore: not modelled",
    "galore_adafactor": "GaLore: not modelled",
    "galore_adamw_layerwise": "GaLore layer-wise: not modelled",
    "galore_adamw_8bit_layerwise": "GaLore layer-wise: not modelled",
    "galore_adafactor_layerwise": "GaLore layer-wise: not modelled",
    "lomo": "LOMO (fused update in the backward, no state): not modelled",
    "adalomo": "AdaLomo: not modelled",
    "grokadamw": "GrokAdamW (an extra gradient EMA): not modelled",
    "schedule_free_radam": "schedule-free RAdam: not modelled",
    "schedule_free_adamw": "schedule-free AdamW (its own state): not modelled",
    "schedule_free_sgd": "schedule-free SGD: not modelled",
    "apollo_adamw": "APOLLO (low-rank state): not modelled",
    "apollo_adamw_layerwise": "APOLLO layer-wise: not modelled",
    "stable_adamw": "StableAdamW: not modelled",
}
DEFAULT_OPTIM = "adamw_torch_fused"
DEFAULT_OPTIM_SOURCE = (f"{TA_SOURCE}: `default_optim = \"adamw_torch\"`, `\"adamw_torch_fused\"` when "
                        "is_torch_greater_or_equal_than_2_8 (the TrainingArguments.optim field)")


def optimizer(r: Reading, key, value):
    name = value.value if hasattr(value, "value") else value
    entry = OPTIMIZERS.get(str(name).strip().lower()) if isinstance(name, str) else None
    if entry is None:
        r.refuse(key, value, "a value of transformers' OptimizerNames the tool models: " +
                 ", ".join(k for k, v in OPTIMIZERS.items() if not isinstance(v, str)), "unknown optimizer")
    if isinstance(entry, str):
        r.refuse(key, value, "an optimizer the tool models (mlsysim-core plugins lists them)", entry)
    opt, impl, note = entry
    r.set(key, value, "optimizer", opt, note)
    if impl:
        r.set(key, value, "optimizer_impl", impl)


def default_optimizer(r: Reading, key="optim", version=None, source=DEFAULT_OPTIM_SOURCE):
    r.default(key, "optimizer", "adamw", source, "adamw_torch_fused (PyTorch >= 2.8)", version=version or TRANSFORMERS)
    r.default(key, "optimizer_impl", "fused", source, version=version or TRANSFORMERS)


# --- attention -------------------------------------------------------------------------------

def _model_of(r: Reading):
    """The run's model as far as this reading knows it: ``-m`` (which replaces the files'), else the model this
    reading has set so far (None: not yet, or given by another file)."""
    given = getattr(r.context, "model", None)
    return given if given is not None else next((f.becomes for f in reversed(r.fields) if f.field == "model"), None)


def attention(r: Reading, key, value):
    from ._common import declares_sinks, sink_kernel
    context = r.context
    v = str(value).lower() if value is not None else None
    if v in ("eager", "disabled"):
        r.set(key, value, "attention", "eager")
    elif v in ("sdpa", "flash_attention_2", "flash_attention_3", "fa2", "fa3", "auto", "true", "flash_attn",
               "kernels-community/flash-attn", "kernels-community/flash-attn3", "kernels-community/vllm-flash-attn3"):
        r.set(key, value, "attention", "sdpa", "a fused kernel: no s x s scores (as sdpa)")
    elif v in ("flex_attention", "flex") and declares_sinks(_model_of(r)) and sink_kernel(context):
        # transformers' flex_attention_forward with s_aux (a model with attention sinks, gpt-oss): the fused
        # flex_attention renormalised by the sinks through its log-sum-exp, what the kernel declaring
        # computes="flex", sinks="lse" was measured on (validation/families/gpt_oss/measure_flex_sinks.py)
        r.set(key, value, "attention", sink_kernel(context), "transformers' flex_attention_forward with the model's "
              "attention sinks (s_aux): the registered kernel declaring computes='flex', sinks='lse'")
    elif v in ("flex_attention", "flex"):
        r.approx(key, value, "attention", "sdpa", "FlexAttention: a fused kernel, priced as sdpa (no s x s scores)")
    elif v in ("none", "false"):
        r.ignore(key)
    else:
        r.refuse(key, value, "eager, sdpa, flash_attention_2/3 or flex_attention", "an attention kernel not modelled")


# --- precision ---------------------------------------------------------------------------------

DTYPES = {"bfloat16": "bf16", "bf16": "bf16", "torch.bfloat16": "bf16", "float16": "fp16", "fp16": "fp16",
          "half": "fp16", "torch.float16": "fp16", "float32": "fp32", "fp32": "fp32", "float": "fp32",
          "torch.float32": "fp32", "auto": "auto"}


# The run's mixed precision, as transformers 5.23.0 resolves it (training_args.py lines 1612-1618):
# ``mixed_precision`` = accelerate launch's (ACCELERATE_MIXED_PRECISION, the accelerate config's
# mixed_precision: accelerate 1.16.0 utils/launch.py lines 157, 255, 518), unless the training
# arguments' fp16 or bf16 is true; trainer.py line 744 hands it to the Accelerator, which casts
# FSDP's MixedPrecision policy (state.py lines 975-976) or sets DeepSpeed's bf16/fp16 from it
# (training_args.py line 1720, DeepSpeedPlugin.set_mixed_precision). The accelerate reader's
# precision therefore yields to a training-arguments file's; the readers' regimes that depend on
# it are derived from the merged precision (`Reading.derived`).
MIXED_PRECEDENCE = ("the training arguments' bf16/fp16 true win over accelerate's mixed_precision (transformers "
                    "5.23.0 training_args.py lines 1612-1618)")
FP16_AS_BF16 = "; fp16 priced as bf16 (same bytes)"


def sixteen(precision) -> str | None:
    """bf16/fp16 of a precision name (the merged ``precision``), else None."""
    name = str(precision).lower() if precision is not None else ""
    return name if name in ("bf16", "fp16") else None


# accelerate's FSDP policy from the mixed precision (1.16.0 utils/dataclasses.py lines 2008-2013,
# FullyShardedDataParallelPlugin.set_mixed_precision): param_dtype = reduce_dtype = the 16-bit dtype; the trainable
# parameters upcast to fp32 before sharding when mixed precision is set (accelerator.py line 1970 for FSDP1,
# utils/fsdp_utils.py line 801 for FSDP2): the measured profile's fsdp-bf16-reduce-bf16 regime.
ACCELERATE_FSDP_REGIME = "fsdp-bf16-reduce-bf16"
# fp16 (mixed_precision: fp16, the Trainer's fp16: true): the same policy in fp16 with accelerate's loss scaler
# (accelerator.py lines 536-555: FSDP1 ShardedGradScaler, FSDP2 torch.amp.GradScaler), the fp16 regimes of the same
# bytes (the scaler's scalars unpriced; regimes.py, measured in validation/fsdp_no_sync).
FSDP_FP16_REGIMES = {"fsdp-bf16-reduce-bf16": "fsdp-fp16-reduce-fp16", "fsdp-bf16-stored": "fsdp-fp16-stored"}
FP16_SCALER = ("; fp16: accelerate's loss scaler (ShardedGradScaler under FSDP1, GradScaler under FSDP2: "
               "accelerator.py lines 536-555), scalars only, gradients unscaled in place")
# QLoRA under FSDP: the base stored as its framework stores it, bitsandbytes' packed codes viewed as a 16-bit
# bnb_4bit_quant_storage (axolotl-ai-cloud/axolotl@067b021c src/axolotl/loaders/model.py line 720: torch.bfloat16
# for every qlora run; hiyouga/LLaMA-Factory@ff6d4d12 src/llamafactory/model/model_utils/quantization.py line 189:
# the compute dtype, "crucial for fsdp+qlora"; TRL's bnb_4bit_quant_storage, huggingface/trl@f2cd5771
# trl/trainer/utils.py line 242), the embeddings, norms and LM head loaded in 16 bits beside them; transformers
# 5.23.0 distributed/fsdp.py lines 267-285 (update_fsdp_plugin_peft) sets the FSDP policy to that dtype
# (set_mixed_precision(quant_storage, override=True)); accelerate 1.16.0 upcasts to fp32 only the flat parameters
# that require grad (accelerator.py lines 1994-2009, FSDP1: the adapters, wrapped apart by peft's policy) and, under
# FSDP2, nothing when the model holds Params4bit (utils/fsdp_utils.py line 801): the frozen base stays 16-bit, the
# adapters fp32 (peft's autocast_adapter_dtype; LLaMA-Factory's upcast): the measured profile's fsdp-bf16-stored,
# whose LoRA regime keeps the frozen base at 2 B and the adapters, their gradients and state at 4 B (lora.py).
QLORA_FSDP_REGIME = "fsdp-bf16-stored"
QLORA_FSDP_NOTE = (
    "QLoRA under FSDP: the base stored in 16 bits (the packed 4-bit codes viewed as bnb_4bit_quant_storage; the "
    "embeddings, norms and LM head 16-bit), the FSDP policy set to that dtype (transformers 5.23.0 distributed/"
    "fsdp.py lines 267-285, update_fsdp_plugin_peft); accelerate 1.16.0 upcasts only the trainable flat parameters "
    "(accelerator.py lines 1994-2009; FSDP2 with Params4bit: none, utils/fsdp_utils.py line 801): fp32 adapters, "
    "their gradients and state over a 16-bit frozen base, gathered and reduced in 16 bits")
BF16_BYTES = ("fsdp-bf16", ACCELERATE_FSDP_REGIME, QLORA_FSDP_REGIME, "mixed-bf16")


def four_bit(lora) -> bool:
    """Is the base quantized to 4 bits (bitsandbytes nf4/fp4) in a run's merged ``lora`` table?"""
    return isinstance(lora, dict) and str(lora.get("quantization") or "").lower() in ("nf4", "fp4")


def fsdp_regime(without=None):
    """FSDP's regime from the run's mixed precision as accelerate builds it: 16-bit, FSDP's MixedPrecision with
    param_dtype = reduce_dtype = the 16-bit dtype over fp32 shards (fsdp-bf16-reduce-bf16), over a 4-bit base
    (the run's merged ``lora``: QLoRA) the base stored in 16 bits (fsdp-bf16-stored); none: ``without`` (a
    ``(regime, note)``, or None: nothing set). Read with ``also=("lora",)``."""
    def derive(mixed, merged=None):
        if mixed is None:
            return without
        fp16 = mixed == "fp16"
        if four_bit((merged or {}).get("lora")):
            return (FSDP_FP16_REGIMES[QLORA_FSDP_REGIME] if fp16 else QLORA_FSDP_REGIME), QLORA_FSDP_NOTE + (
                FP16_SCALER + "; the policy in the storage dtype (2 B: bf16 where the framework stores the codes as "
                "bf16, axolotl's, the same bytes)" if fp16 else "")
        return (FSDP_FP16_REGIMES[ACCELERATE_FSDP_REGIME] if fp16 else ACCELERATE_FSDP_REGIME), (
            "accelerate's FSDP mixed precision: fp32 sharded parameters, gradients and state (accelerate 1.16.0 "
            "upcasts the trainable parameters when mixed precision is set: accelerator.py line 1970, "
            "utils/fsdp_utils.py line 801), parameters gathered and gradients reduced in 16 bits (param_dtype = "
            "reduce_dtype: utils/dataclasses.py lines 2008-2013)" + (FP16_SCALER if fp16 else ""))
    return derive


def deepspeed_regime(without=None):
    """DeepSpeed's regime from the run's mixed precision: 16-bit, its 16-bit engine (fp32 master and
    state); none: ``without``."""
    def derive(mixed):
        if mixed is None:
            return without
        return "mixed-bf16", ("DeepSpeed's 16-bit engine: fp32 master and state" + (FP16_AS_BF16 if mixed == "fp16"
                                                                                     else ""))
    return derive


def regime_of(weights: str, mixed: str | None) -> str:
    """The measured regime of a model loaded in ``weights`` (bf16/fp16/fp32) trained with
    autocast ``mixed`` (bf16/fp16/None) and no engine recasting it."""
    if weights == "fp32":
        return {"bf16": "amp-bf16", "fp16": "amp-fp16"}.get(mixed, "fp32")
    return weights


# --- FSDP ------------------------------------------------------------------------------------

NO_SYNC_KEY = " (gradient accumulation)"     # fsdp_config's default of the rule's gradient_sync (Reading.done)
SHARDING = {"FULL_SHARD": "fsdp", "1": "fsdp", "SHARD_GRAD_OP": "fsdp-grad-op", "2": "fsdp-grad-op",
            "NO_SHARD": None, "3": None, "HYBRID_SHARD": "hsdp", "4": "hsdp", "HYBRID_SHARD_ZERO2": "hsdp-zero2",
            "5": "hsdp-zero2"}
FSDP_IGNORED = {"fsdp_auto_wrap_policy", "fsdp_backward_prefetch", "fsdp_forward_prefetch",
                "fsdp_cpu_ram_efficient_loading", "fsdp_state_dict_type", "fsdp_sync_module_states",
                "fsdp_use_orig_params", "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params",
                "fsdp_limit_all_gathers", "fsdp_backward_prefetch_policy", "fsdp_module_classes_to_ignore",
                "xla", "xla_fsdp_grad_ckpt", "xla_fsdp_settings", "fsdp_ignored_modules", "fsdp_sync_module_state"}


def fsdp_config(r: Reading, prefix: str, cfg: dict, mixed: str | None, strategy_default="FULL_SHARD"):
    """An FSDP config table (accelerate's fsdp_config, TrainingArguments.fsdp_config, axolotl's
    fsdp_config): keys with or without the ``fsdp_`` prefix."""
    if not isinstance(cfg, dict):
        raise InvalidInputError(f"{r.path}: {prefix}", cfg, "a table of FSDP settings")
    norm = {(k if str(k).startswith("fsdp_") or k in ("xla", "xla_fsdp_grad_ckpt", "xla_fsdp_settings")
             else f"fsdp_{k}"): (k, v) for k, v in cfg.items()}
    version, version_read = 1, False
    if "fsdp_version" in norm:
        k, v = norm["fsdp_version"]
        version = whole(r, f"{prefix}.{k}", v)
    rule = "fsdp"
    if "fsdp_reshard_after_forward" in norm:
        k, v = norm["fsdp_reshard_after_forward"]
        value = str(v).upper()
        if version == 2 or isinstance(v, bool) or value in ("TRUE", "FALSE"):
            rule = "fsdp" if is_true(v) or v is True else "fsdp-grad-op"
        else:
            rule = SHARDING.get(value, "?")
        r.set(f"{prefix}.{k}", v, "data_parallel", rule) if rule not in ("?", None, "hsdp-zero2") else None
        _sharding_check(r, f"{prefix}.{k}", v, rule)
    elif "fsdp_sharding_strategy" in norm:
        k, v = norm["fsdp_sharding_strategy"]
        rule = SHARDING.get(str(v).upper(), "?")
        _sharding_check(r, f"{prefix}.{k}", v, rule)
        r.set(f"{prefix}.{k}", v, "data_parallel", rule)
    else:
        r.default(f"{prefix}.fsdp_sharding_strategy", "data_parallel", "fsdp", f"{ACCELERATE} FullyShardedDataParallelPlugin "
                  "(sharding_strategy FULL_SHARD / reshard_after_forward True)", version=ACCELERATE)
    for nk, (k, v) in norm.items():
        key = f"{prefix}.{k}"
        if nk in ("fsdp_version", "fsdp_reshard_after_forward", "fsdp_sharding_strategy"):
            continue
        if nk == "fsdp_offload_params":
            if is_true(v):
                r.set(key, v, "offload", "optimizer+gradients+parameters", "FSDP CPUOffload(offload_params=True)")
            else:
                r.ignore(key)
        elif nk == "fsdp_activation_checkpointing":
            if is_true(v):
                r.set(key, v, "activation_checkpointing", "full", "every decoder layer wrapped in checkpoint")
            else:
                r.ignore(key)
        elif nk in FSDP_IGNORED:
            if nk == "fsdp_auto_wrap_policy" and str(v).upper() == "NO_WRAP":
                r.refuse(key, v, "TRANSFORMER_BASED_WRAP or SIZE_BASED_WRAP", "one FSDP unit for the whole model "
                         "(everything gathered at once): not modelled")
            if nk == "fsdp_backward_prefetch" and str(v).upper() not in ("BACKWARD_PRE", "NONE", ""):
                r.note(key, v, "the prefetch policy changes only which layer's gather overlaps (priced: one ahead)")
            else:
                r.ignore(key)
        else:
            r.unknown(key, v, "the FSDP settings of accelerate's FullyShardedDataParallelPlugin")
    if rule in ("fsdp", "hsdp", "fsdp-grad-op"):     # (the final rule's share: Reading._no_sync_names_the_rule)
        # Gradient accumulation under FSDP skips the reduce-scatter on every micro-batch but the last: transformers
        # 5.23.0 trainer.py lines 1897-1908 (sync_context = accelerator.no_sync unless gradient_accumulation_kwargs'
        # sync_each_batch, DeepSpeed, or the last micro-batch), accelerate 1.16.0 accelerator.py lines 1126-1139
        # (no_sync: FSDP2 set_requires_gradient_sync(False), FSDP1 the model's no_sync()); Accelerator.accumulate
        # likewise. The option acts only with gradient_accumulation_steps > 1 (fsdp.FullShardOptions).
        # FSDP1 (fsdp_version 1, accelerate's default) frees every unit but the root after its forward: the rule's
        # fsdp_version (fsdp.FullShardOptions), in the same table as gradient_sync (one plugin_options value).
        options = {"gradient_sync": "step" if version == 2 else "no_sync", **({"fsdp_version": 1} if version == 1
                                                                              else {})}
        source = (f"accelerate 1.16.0 accelerator.py lines 1126-1139 (Accelerator.no_sync under FSDP{version}: "
                  + ("set_requires_gradient_sync(False))" if version == 2 else "the model's no_sync())")
                  + "; transformers 5.23.0 trainer.py lines 1897-1908 (accelerator.no_sync on every micro-batch but "
                  "the last, unless accelerator_config.gradient_accumulation_kwargs.sync_each_batch)")
        accumulation = ("the unsharded gradients kept between the synchronizing micro-batches when "
                        "gradient_accumulation_steps > 1")
        if version == 1 and "fsdp_version" in norm:
            k, v = norm["fsdp_version"]
            version_read = True
            r.set(f"{prefix}.{k}", v, "plugin_options", {rule: options},
                  f"FSDP1 (FullyShardedDataParallel): under FULL_SHARD / HYBRID_SHARD every unit but the root freed "
                  f"after its forward; gradient accumulation under its no_sync(), {accumulation} ({source})")
        else:
            r.default(f"{prefix}{NO_SYNC_KEY}", "plugin_options", {rule: options},
                      source + ("; accelerate 1.16.0 FullyShardedDataParallelPlugin fsdp_version 1 (FSDP1: every "
                                "unit but the root freed after its forward)" if version == 1 else ""),
                      accumulation, version=ACCELERATE)
    if "fsdp_version" in norm and not version_read:
        r.ignore(f"{prefix}.{norm['fsdp_version'][0]}")
    if mixed in ("bf16", "fp16"):     # (QLoRA: the run's merged lora, fsdp_regime)
        r.derived(f"{prefix} (with mixed precision {mixed})", mixed, "regime", fsdp_regime(), own=mixed,
                  also=("lora",))
    return rule


def _sharding_check(r, key, value, rule):
    if rule == "?":
        r.refuse(key, value, "FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD (1, 2, 4), or a bool (FSDP2)",
                 "unknown sharding strategy")
    if rule is None:
        r.refuse(key, value, "FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD", "NO_SHARD (FSDP as DDP): use plain "
                 "data parallelism (MULTI_GPU) instead; not modelled as FSDP")
    if rule == "hsdp-zero2":
        r.refuse(key, value, "FULL_SHARD, SHARD_GRAD_OP or HYBRID_SHARD", "HYBRID_SHARD_ZERO2: not modelled")


# --- DeepSpeed -------------------------------------------------------------------------------

DS_DEFAULTS = {   # deepspeed/runtime/zero/config.py (DeepSpeedZeroConfig), elements
    "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000, "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000}
BUCKETS = ("reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
           "stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
           "stage3_param_persistence_threshold")
ZERO3_ONLY = {"stage3_prefetch_bucket_size", "stage3_max_live_parameters", "stage3_max_reuse_distance",
              "stage3_param_persistence_threshold"}
ZERO_IGNORED = {"allgather_partitions", "reduce_scatter", "sub_group_size", "round_robin_gradients",
                "stage3_gather_16bit_weights_on_model_save", "stage3_gather_fp16_weights_on_model_save",
                "gather_16bit_weights_on_model_save", "load_from_fp32_weights", "elastic_checkpoint",
                "ignore_unused_parameters", "legacy_stage1", "use_multi_rank_bucket_allreduce",
                "memory_efficient_linear", "log_trace_cache_warnings", "enable_sanity_checks",
                "zero_quantized_weights", "zero_quantized_gradients", "cpu_offload_use_pin_memory",
                "stage3_module_granularity_threshold", "module_granularity_threshold"}
DS_IGNORED = {"gradient_clipping", "steps_per_print", "wall_clock_breakdown", "scheduler", "zero_allow_untested_optimizer",
              "prescale_gradients", "gradient_predivide_factor", "tensorboard", "wandb", "csv_monitor", "comms_logger",
              "flops_profiler", "dump_state", "memory_breakdown", "sparse_gradients", "checkpoint",
              "zero_force_ds_cpu_optimizer", "data_efficiency", "aio", "seed",
              "seq_parallel_communication_data_type",
              "comms_config", "monitor_config"}     # (logging and monitoring tables: LLaMA-Factory's ds_z3_fp8_config.json)


def bucket_options_available(registry, rule: str) -> set[str]:
    """The DeepSpeed bucket options the ``rule`` takes (the deepspeed_buckets plugin), if installed."""
    try:
        import attrs
        spec = registry.sharding_rules.get(rule) if registry is not None else None
        kind = getattr(spec, "options_type", None)
        return {f.name for f in attrs.fields(kind)} if kind is not None else set()
    except Exception:
        return set()


def deepspeed(r: Reading, prefix: str, doc: dict, trainer: dict | None = None, model=None):
    """A DeepSpeed config (a JSON's table, or the ``deepspeed`` table of a trainer config).
    ``trainer``: the TrainingArguments values that resolve its ``"auto"`` (None: another file's).
    ``model``: for the hidden-size ``"auto"`` buckets."""
    if not isinstance(doc, dict):
        raise InvalidInputError(f"{r.path}: {prefix or 'DeepSpeed config'}", doc, "a table of DeepSpeed settings")
    p = (prefix + ".") if prefix else ""
    zero = doc.get("zero_optimization", {}) or {}
    if not isinstance(zero, dict):
        raise InvalidInputError(f"{r.path}: {p}zero_optimization", zero, "a table")
    stage = zero.get("stage", 0)
    stage = whole(r, f"{p}zero_optimization.stage", stage, 0)
    if stage > 3:
        r.refuse(f"{p}zero_optimization.stage", stage, "0, 1, 2 or 3", "no such ZeRO stage")
    if "stage" in zero:
        r.set(f"{p}zero_optimization.stage", stage, "zero_stage", stage)
    else:
        r.default(f"{p}zero_optimization.stage", "zero_stage", 0, f"{DS_SOURCE}: stage = 0", version=DEEPSPEED)
    # Precision.
    bf = doc.get("bf16", doc.get("bfloat16"))
    fp = doc.get("fp16")
    bf_key = f"{p}{'bf16' if 'bf16' in doc else 'bfloat16'}.enabled"
    bf_on, fp_on = _enabled(bf), _enabled(fp)
    for name, table in (("bf16", bf if "bf16" in doc else None), ("bfloat16", doc.get("bfloat16")), ("fp16", fp)):
        if isinstance(table, dict):
            for k in table:
                if k != "enabled":
                    r.ignore(f"{p}{name}.{k}")     # loss scaling, immediate_grad_update: no memory of note
    if bf_on == "auto" or fp_on == "auto":
        mixed = (trainer or {}).get("mixed") if trainer is not None else "assumed"
        key = bf_key if bf_on == "auto" else f"{p}fp16.enabled"
        if (trainer or {}).get("derived"):     # accelerate's deepspeed_config_file: the run's merged precision fills it
            r.derived(key, "auto", "regime", deepspeed_regime(("fp32", "\"auto\" = the run's bf16/fp16, both off: "
                                                               "fp32")), own=mixed)
        elif mixed == "assumed":
            r.approx(key, "auto", "regime", "mixed-bf16", "\"auto\": transformers fills it from the trainer "
                     "arguments' bf16/fp16 (another file); assumed on (16-bit weights and gradients, fp32 master "
                     "and state). With bf16 and fp16 both off it would be fp32")
        elif mixed in ("bf16", "fp16"):
            r.set(key, "auto", "regime", "mixed-bf16", f"\"auto\" = the trainer's {mixed} ({HF_DS_SOURCE}: "
                  "trainer_config_process fill_match): DeepSpeed's 16-bit engine, fp32 master and state"
                  + ("; fp16 priced as bf16 (same bytes)" if mixed == "fp16" else ""))
        else:
            r.set(key, "auto", "regime", "fp32", "\"auto\" = the trainer's bf16/fp16, both off: fp32")
    elif bf_on is True:
        r.set(bf_key, True, "regime", "mixed-bf16", "DeepSpeed bf16: bf16 weights and gradients, fp32 master and state")
        r.set(bf_key, True, "precision", "bf16")
    elif fp_on is True:
        r.approx(f"{p}fp16.enabled", True, "regime", "mixed-bf16", "DeepSpeed fp16 (loss scaling): bytes as mixed-bf16")
        r.set(f"{p}fp16.enabled", True, "precision", "fp16")
    else:
        for key, val in ((bf_key, bf), (f"{p}fp16.enabled", fp)):
            if val is not None:
                r.ignore(key)
    for k in ("bf16", "bfloat16", "fp16"):
        if k in doc:
            r.seen.add(f"{p}{k}")
    # Optimizer.
    opt = doc.get("optimizer")
    if isinstance(opt, dict):
        kind = str(opt.get("type", "")).lower()
        if kind in ("adam", "adamw", "cpuadam", "fusedadam"):
            r.set(f"{p}optimizer.type", opt.get("type"), "optimizer", "adamw",
                  "DeepSpeed's Adam (FusedAdam on GPU, DeepSpeedCPUAdam with offload): master + m + v")
        elif kind == "lion":
            r.set(f"{p}optimizer.type", opt.get("type"), "optimizer", "lion")
        else:
            r.refuse(f"{p}optimizer.type", opt.get("type"), "Adam, AdamW or Lion", "a DeepSpeed optimizer not modelled")
        r.ignore(f"{p}optimizer.params")
    elif opt is not None:
        raise InvalidInputError(f"{r.path}: {p}optimizer", opt, "a table with type and params")
    # Batch.
    for key, field in (("train_micro_batch_size_per_gpu", "micro_batch_size"),
                       ("gradient_accumulation_steps", "gradient_accumulation_steps"),
                       ("train_batch_size", "global_batch_size")):
        if key not in doc:
            continue
        value = doc[key]
        if value == "auto":
            r.note(f"{p}{key}", value, "\"auto\": the trainer arguments' " + {
                "train_micro_batch_size_per_gpu": "per_device_train_batch_size",
                "gradient_accumulation_steps": "gradient_accumulation_steps",
                "train_batch_size": "world size x per_device_train_batch_size x gradient_accumulation_steps"}[key]
                + f" ({HF_DS_SOURCE.replace('trainer_config_finalize', 'trainer_config_process')})")
        else:
            r.set(f"{p}{key}", value, field, whole(r, f"{p}{key}", value))
    # Offload.
    offload_opt = _device(r, f"{p}zero_optimization.offload_optimizer", zero.get("offload_optimizer"))
    offload_par = _device(r, f"{p}zero_optimization.offload_param", zero.get("offload_param"))
    if offload_par and stage != 3:
        r.refuse(f"{p}zero_optimization.offload_param", zero.get("offload_param"), "only with stage 3",
                 "DeepSpeed offloads parameters only under ZeRO-3")
    if offload_opt or offload_par:
        what = "optimizer" if not offload_par else "optimizer+gradients+parameters"
        if offload_par and not offload_opt:
            r.refuse(f"{p}zero_optimization.offload_param", zero.get("offload_param"),
                     "with offload_optimizer too", "parameters offloaded with the optimizer on the GPU: not modelled")
        if stage >= 2 and not offload_par:
            what = "optimizer+gradients"     # ZeRO-Offload: the fp32 gradient partitions live on the host too
        tiers = {"nvme": "nvme"}
        value = what if "nvme" not in (offload_opt, offload_par) else \
            {n: tiers.get(d, "cpu") for n, d in (("optimizer", offload_opt), ("parameters", offload_par)) if d}
        key = f"{p}zero_optimization.offload_param" if offload_par else f"{p}zero_optimization.offload_optimizer"
        r.set(key, zero.get("offload_param") or zero.get("offload_optimizer"), "offload", value,
              "DeepSpeed ZeRO-Offload" + (" / ZeRO-Infinity" if offload_par else ""))
        if offload_par and offload_opt:
            r.seen.add(f"{p}zero_optimization.offload_optimizer")
    # Buckets.
    hidden = hidden_size(model)
    rule = f"zero{stage}"
    takes = bucket_options_available(getattr(r.context, "registry", None), rule)
    given = {}
    for k in BUCKETS:
        if k not in zero:
            continue
        key, value = f"{p}zero_optimization.{k}", zero[k]
        if k in ZERO3_ONLY and stage != 3:
            r.ignore(key)
            continue
        if value == "auto":
            factor = {"reduce_bucket_size": (1.0, "hidden_size²"), "stage3_prefetch_bucket_size": (0.9, "0.9·hidden_size²"),
                      "stage3_param_persistence_threshold": (None, "10·hidden_size")}.get(k)
            if factor is None:
                r.refuse(key, value, "a number", "DeepSpeed's integration fills no \"auto\" for it")
            if hidden is None:
                r.approx(key, value, "communication_buffer_fraction", 0.05, f"\"auto\" = {factor[1]} elements "
                         f"({HF_DS_SOURCE}), unresolved: the model is not named in this file; the profile's own "
                         "buffers are priced")
                continue
            value_n = 10 * hidden if factor[0] is None else int(factor[0] * hidden * hidden)
            note = f"\"auto\" = {factor[1]} = {value_n:,} elements for hidden_size {hidden} ({HF_DS_SOURCE})"
        elif isinstance(value, bool):
            value_n, note = value, ""
        else:
            try:
                value_n = int(float(value))
            except (TypeError, ValueError):
                raise InvalidInputError(f"{r.path}: {key}", value, "a number of elements or \"auto\"") from None
            note = ""
        given[k] = (key, zero[k], value_n, note)
    taken = {k: v for k, v in given.items() if k in takes}
    for k, (key, raw, value_n, note) in given.items():
        if k not in taken:
            r.approx(key, raw, "communication_buffer_fraction", 0.05,
                     (note + "; " if note else "") + f"{k}={value_n!r}: DeepSpeed's bucket is not an input of the "
                     f"{rule} rule in this installation; the measured profile prices its own buffers")
    if taken:
        notes = "; ".join(n for (_, _, _, n) in taken.values() if n)
        r.set(" + ".join(key for (key, _, _, _) in taken.values()), {k: raw for k, (_, raw, _, _) in taken.items()},
              "plugin_options", {rule: {k: v for k, (_, _, v, _) in taken.items()}},
              (notes + "; " if notes else "") + "elements; DeepSpeed's defaults for the rest")
    elif stage and takes:
        wanted = [k for k in ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size",
                              "stage3_param_persistence_threshold", "stage3_max_live_parameters",
                              "stage3_max_reuse_distance") if k in takes and k in DS_DEFAULTS]
        r.default(f"{p}zero_optimization.{'/'.join(wanted)}", "plugin_options",
                  {rule: {k: DS_DEFAULTS[k] for k in wanted}}, f"{DS_SOURCE} (DeepSpeedZeroConfig)",
                  "elements: DeepSpeed's own buckets", version=DEEPSPEED)
    elif stage and not given:
        r.notes.append(f"{p}zero_optimization buckets absent: DeepSpeed's defaults (reduce_bucket_size 5e8 elements, "
                       f"...; {DS_SOURCE}) are not inputs of the {rule} rule in this installation: the measured "
                       "profile prices its own buffers")
    for k, v in zero.items():
        key = f"{p}zero_optimization.{k}"
        if k in ("stage", "offload_optimizer", "offload_param") or k in BUCKETS:
            r.seen.add(key)
        elif k in ZERO_IGNORED:
            r.ignore(key)
        elif k in ("zero_hpz_partition_size", "mics_shard_size") and v in (1, -1):
            r.ignore(key)
        elif k == "zero_quantized_nontrainable_weights" and not v:
            r.ignore(key)
        else:
            r.refuse(key, v, "the ZeRO settings docs/launch-hf.md lists", "a ZeRO setting that changes memory, "
                     "not modelled" if k in ("zero_hpz_partition_size", "mics_shard_size",
                                             "zero_quantized_nontrainable_weights", "zenflow") else
                     "an unknown zero_optimization key: never silently dropped")
    # The rest of the file.
    for k, v in doc.items():
        key = f"{p}{k}"
        if k in ("zero_optimization", "optimizer", "bf16", "bfloat16", "fp16", "train_micro_batch_size_per_gpu",
                 "gradient_accumulation_steps", "train_batch_size"):
            continue
        if k in DS_IGNORED or k.startswith("_") and isinstance(v, str):     # "_comment": a text DeepSpeed never reads
            r.ignore(key)
        elif k == "activation_checkpointing":
            _ds_checkpointing(r, key, v)
        elif k == "compile":
            if isinstance(v, dict) and not v.get("disable", False) or v is True:
                r.refuse(key, v, "no torch.compile", "DeepSpeed's engine.compile (the module compiled inside the "
                         "engine, under ZeRO's hooks) is not modelled (docs/compile.md)")
            r.ignore(key)
        elif k == "communication_data_type" and v in (None, "fp32", "bf16", "fp16"):
            r.note(key, v, "the gradient reduction dtype: the buffers are priced in the model's 16-bit dtype")
        elif k == "sequence_parallel_size":
            if whole(r, key, v) != 1:
                r.refuse(key, v, "1", "DeepSpeed Ulysses (ALST) sequence parallelism from the DeepSpeed config: "
                         "give --cp with --rule cp=cp-ulysses instead")
            r.ignore(key)
        elif k == "tensor_parallel":
            size = (v or {}).get("autotp_size", 1) if isinstance(v, dict) else v
            if size not in (1, None):
                r.set(f"{key}.autotp_size", size, "tp_size", whole(r, f"{key}.autotp_size", size),
                      "DeepSpeed AutoTP: Megatron-style column/row split of the linears")
            else:
                r.ignore(key)
        else:
            r.refuse(key, v, "the DeepSpeed settings docs/launch-hf.md lists",
                     "a DeepSpeed setting not modelled" if k in ("fp8", "data_types", "pipeline", "moe",
                                                                 "quantize_training", "amp")
                     else "an unknown DeepSpeed key: never silently dropped")


def _enabled(table):
    if isinstance(table, dict):
        v = table.get("enabled", False)
        return "auto" if v == "auto" else bool(v) if isinstance(v, bool) else is_true(v)
    return None


def _device(r: Reading, key, table):
    if table is None:
        return None
    if not isinstance(table, dict):
        raise InvalidInputError(f"{r.path}: {key}", table, "a table with device: cpu, nvme or none")
    device = str(table.get("device", "none")).lower()
    for k in table:
        if k not in ("device", "pin_memory", "nvme_path", "buffer_count", "buffer_size", "fast_init", "max_in_cpu",
                     "pipeline_read", "pipeline_write", "ratio"):
            r.unknown(f"{key}.{k}", table[k], "device, pin_memory, nvme_path, buffer_count, buffer_size")
    if "ratio" in table and float(table["ratio"]) < 1.0:
        r.refuse(f"{key}.ratio", table["ratio"], "1.0", "partial optimizer offload (ZeRO-3 ratio): not modelled")
    if device in ("none", "", "null"):
        r.ignore(key)
        return None
    if device not in ("cpu", "nvme"):
        r.refuse(f"{key}.device", device, "cpu, nvme or none", "unknown offload device")
    return device


def _ds_checkpointing(r: Reading, key, table):
    if not isinstance(table, dict):
        raise InvalidInputError(f"{r.path}: {key}", table, "a table")
    for k, v in table.items():
        if k in ("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
                 "synchronize_checkpoint_boundary") and is_true(v):
            r.refuse(f"{key}.{k}", v, "false", "DeepSpeed's activation-checkpointing API (Megatron models): not modelled")
        r.ignore(f"{key}.{k}")


def resolve_file(r: Reading, key, value, bases=()) -> Path:
    """A file a config names (a DeepSpeed JSON): as given (absolute), relative to the config's
    folder, then relative to each of the config's ancestors (a repository root, where the
    framework is launched from), then ``bases``."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{r.path}: {key}", value, "a path to a JSON file")
    path = Path(value).expanduser()
    candidates = [path] if path.is_absolute() else [folder / path for folder in
                                                    (r.path.parent, *r.path.parent.parents, *bases)]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise InvalidInputError(f"{r.path}: {key}", value, "a DeepSpeed JSON that exists",
                            f"looked relative to {r.path.parent} and its parent folders")


def read_deepspeed_file(r: Reading, key, value, trainer=None, model=None, bases=()):
    """A DeepSpeed JSON named in another config (TrainingArguments/LLaMA-Factory/axolotl
    ``deepspeed``, accelerate's ``deepspeed_config_file``), read into the same reading."""
    import json
    if isinstance(value, dict):
        r.seen.add(key)
        deepspeed(r, key, value, trainer, model)
        return
    path = resolve_file(r, key, value, bases)
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise InvalidInputError(f"{r.path}: {key}", value, "a readable DeepSpeed JSON", str(err)) from None
    r.note(key, value, f"read {path}")
    deepspeed(r, f"{key}[{path.name}]", doc, trainer, model)


# --- sequence ----------------------------------------------------------------------------------

def sequence(r: Reading, key, length, packed: bool, packing_key: str, default_source: str | None = None):
    """The sequence: with packing, the packed length; without, --seq-len if given, else the
    maximum length (the memory depends on the longest batch)."""
    given = getattr(r.context, "seq_len", None)
    if packed:
        if default_source:
            r.default(key, "seq_len", length, default_source, f"packed ({packing_key}): every sequence this long")
        else:
            r.set(key, length, "seq_len", length, f"packed ({packing_key}): every sequence this long")
    elif given is not None:
        r.note(key, length, f"no packing ({packing_key}): the memory depends on the longest batch; --seq-len "
               f"{given} used instead of this maximum")
    elif default_source:
        r.default(key, "seq_len", length, default_source, f"no packing ({packing_key}): the maximum length, the "
                  "longest batch's bound (the memory depends on the longest batch; --seq-len gives another)")
    else:
        r.set(key, length, "seq_len", length, f"no packing ({packing_key}): the maximum length, the longest batch's "
              "bound (the memory depends on the longest batch; --seq-len gives another)")


# --- LoRA / QLoRA --------------------------------------------------------------------------

def lora_targets(value):
    if value in ("all", "all-linear", "all_linear") or value is True:
        return "all-linear"
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    return tuple(value)
