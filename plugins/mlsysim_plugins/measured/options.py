"""The measured profile's own options (``ProfileSpec.options_type``) and its ``prepare``.

Every field is a keyword of ``solve`` (``solve(..., regime="bf16")``), a flag of the CLI
(``--regime bf16``) and a field of a scenario file, derived from this class. ``None``
means "the default". ``prepare`` checks the values first (a bad value is an error even
where the profile then finds it cannot describe the run), then what the profile can
describe for this model, and completes the options: the regime as a ``Regime``, the
runtime overheads as a ``RuntimeOverheads`` (or ``None`` for none), the layout's defaults.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import attrs

from mlsysim_core import _checks
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError, PluginContractError
from mlsysim_core.memo import memoize
from .._evolve import evolve
from .._lazy import lazy_module
from ._cache import evolved as _evolved, kinds
from .families import family_for
from .regimes import check_rule, regime_for
from .techniques import registered, run_stage

# The physics, imported on a measured solve's first use (never when the plugins load: tests/core/test_fast_paths.py);
# module-level stand-ins, not imports in prepare, which would cost on every solve.
_model = lazy_module(globals(), "_model", "mlsysim_plugins.measured.model")
_optimizers = lazy_module(globals(), "_optimizers", "mlsysim_plugins.measured.optimizers")
_parallel = lazy_module(globals(), "_parallel", "mlsysim_plugins.measured.parallel")
_shapes = lazy_module(globals(), "_shapes", "mlsysim_plugins.measured.shapes")


def _option(help: str, metavar: str | None = None, kind=str, choices=None, flag=None, **more):
    """A field with what the CLI, scenario files and the docs say about it. Its metadata keys
    (read by ``mlsysim_core.cli`` and ``mlsysim_core.scenario``, which document them): help,
    metavar, type (the flag's conversion; None: no value flag of its own), choices, flag, and
    where a field needs them: flags, parse, from_file, layout."""
    return attrs.field(default=None, metadata={"help": help, "metavar": metavar, "type": kind, "choices": choices,
                                               "flag": flag, **more})


def _layer_counts(text: str) -> list[int]:
    """``--stage-layers 16,16``: [16, 16]."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of integers") from None


def _names(text: str) -> list[str]:
    """``--lora-targets q_proj,v_proj``: ["q_proj", "v_proj"]."""
    return [t.strip() for t in text.split(",") if t.strip()]


def _offload_parts(value):
    """``optimizer=nvme+gradients`` as ``{"optimizer": "nvme", "gradients": "cpu"}``: every part
    named once, none empty (the last of two would silently win); any other value as it is."""
    if not isinstance(value, str) or "=" not in value:
        return value
    targets: dict[str, str] = {}
    for part in value.split("+"):
        name, _, tier = (p.strip() for p in part.partition("="))
        if not name or ("=" in part and not tier):
            raise InvalidInputError("offload", value, "NAME[=TIER] parts joined by +, e.g. optimizer=nvme+gradients",
                                    "an empty part")
        if name in targets:
            raise InvalidInputError("offload", value, "each of optimizer, gradients, parameters at most once",
                                    f"{name!r} is named twice")
        targets[name] = tier or "cpu"
    return targets


def _whole(value):
    return int(value) if type(value) is float and value.is_integer() else value


def _layer_list(value, where: str):
    if not isinstance(value, list):
        raise InvalidInputError("stage_layers", value, "a list of layer counts, one per pipeline stage", where)
    return [_whole(v) for v in value]


def _lora_table(value, where: str):
    if not isinstance(value, dict):
        raise InvalidInputError("lora", value, "a table of LoRA fields (rank, target_modules, quantization, "
                                "double_quant)", where)
    if "rank" not in value:
        raise InvalidInputError("lora", value, "a table with the adapters' rank (e.g. rank = 16)",
                                f"{where}: lora without rank")
    return {**value, "rank": _whole(value["rank"])}


def _quantizers(registry) -> tuple[str, ...]:
    """``--quant-implementation``'s choices: the implementations registered through the measured hook."""
    from .quantizations import registered
    return tuple(registered(registry))


_LORA_FLAGS = (
    {"key": "rank", "flag": "--lora-rank", "type": int, "metavar": "N", "required": "the adapters' rank",
     "help": "LoRA fine-tuning with adapters of this rank (base frozen)"},
    {"key": "target_modules", "flag": "--lora-targets", "metavar": "NAME,NAME,...", "parse": _names,
     "help": "with --lora-rank: the adapted modules, e.g. q_proj,v_proj (default: the attention projections, "
             "q,k,v,o_proj; c_attn on GPT-2) or all-linear"},
    {"key": "quantization", "flag": "--quantization", "choices": ("nf4", "fp4", "int8"),
     "help": "QLoRA: the frozen base quantized by bitsandbytes (nf4, fp4 or int8)"},
    {"key": "quant_implementation", "flag": "--quant-implementation", "choices": _quantizers,
     "help": "QLoRA, with --quantization: who stores and dequantizes the base (a registered implementation; "
             "default bitsandbytes; torchao: torchao's NF4Tensor, torchtune's quantize_base)"},
    {"key": "double_quant", "flag": "--double-quant", "const": True,
     "help": "QLoRA, with nf4 or fp4: quantize the quantization constants too"},
    {"key": "dropout", "flag": "--lora-dropout", "type": float, "metavar": "P",
     "help": "with --lora-rank: peft's lora_dropout (default 0.0): each adapted linear keeps its dropout mask "
             "and output"},
    {"key": "adapter_dtype", "flag": "--lora-adapter-dtype", "choices": ("fp32", "base"),
     "help": "with --lora-rank: fp32 adapters over a 16-bit base (default, peft's autocast_adapter_dtype) or the "
             "base's dtype (autocast_adapter_dtype=False, torchtune)"},
    {"key": "use_dora", "flag": "--lora-dora", "const": True,
     "help": "with --lora-rank: DoRA (peft's use_dora): a trainable magnitude per output feature, the weight norm "
             "in every forward"},
    {"key": "modules_to_save", "flag": "--lora-modules-to-save", "metavar": "NAME,NAME,...", "parse": _names,
     "help": "with --lora-rank: peft's modules_to_save, a trainable copy of the token embedding and/or the LM head "
             "(e.g. embed_tokens,lm_head)"})


# The profile's own options (the techniques add theirs: ``options_type``). ``None`` means the default.
OWN_OPTIONS: dict[str, Any] = {
    "regime": _option("training regime: which dtype weights, gradients, master copy, optimizer state and "
                          "activations have, e.g. fp32, amp-bf16, bf16, mixed-bf16, fsdp-bf16 (default: from "
                          "--precision: 16-bit means autocast)", "REGIME"),
    "optimizer_impl": _option("PyTorch's optimizer step implementation (its temporaries): foreach (default), "
                                  "fused or for-loop", "IMPL"),
    "attention": _option("attention kernel, a registered one: sdpa (default; fused, no s x s scores), eager, "
                             "or flex_attention (with sinks: gpt-oss); `mlsysim-core plugins` lists them", "KERNEL"),
    "dropout": _option("the layers' dropout probability (default 0.0)", "P", kind=float),
    "checkpointed_layers": _option("with --checkpointing full: recompute only this many layers (block recompute)",
                                       "N", kind=int),
    "runtime_overheads": _option("CUDA context, allocator reserve, cuBLAS workspaces, NCCL buffers: "
                                     "a RuntimeOverheads, a dict of its fields, or False for none", kind=None,
                                     flags=({"flag": "--no-runtime-overheads", "const": False,
                                             "help": "leave out the CUDA context, allocator reserve and workspaces"},
                                            {"key": "allocator", "flag": "--allocator",
                                             "choices": ("fraction", "segments"),
                                             "help": "how the caching allocator's reserve is priced: fraction "
                                                     "(default: 5 %% of the peak allocated) or segments (the block "
                                                     "and segment rounding of PyTorch's allocator source; one "
                                                     "device, DDP, FSDP, ZeRO-1/2/3, tp, pp, LoRA; not ep or "
                                                     "offload, see docs/profiles.md)"},
                                            {"key": "expandable_segments", "flag": "--expandable-segments",
                                             "const": True,
                                             "help": "with --allocator segments: PYTORCH_CUDA_ALLOC_CONF="
                                                     "expandable_segments:True"})),
    "pipeline_schedule": _option("pipeline schedule: 1f1b (default), gpipe, interleaved-1f1b, zb-h1, zb-h2",
                                     "SCHEDULE"),
    "virtual_stages": _option("with interleaved-1f1b: model chunks per pipeline rank (default 2)", "V", kind=int,
                                  layout="virtual stages are per layout"),
    "expert_tp_size": _option("tensor parallelism inside the experts (default --tp)", "N", kind=int,
                                  flag=("--expert-tp-size", "--etp"), layout="expert tp is per layout"),
    "stage_layers": _option("decoder layers on each pipeline stage (default: an even split)", "N,N,...",
                                kind=_layer_counts, layout="a stage split is per layout", from_file=_layer_list),
    "moe_capacity_factor": _option("mixture of experts: token dropping with this capacity factor "
                                       "(default dropless)", "CF", kind=float),
    "loss_parallel": _option("with tp > 1: PyTorch's loss_parallel (torchtitan's default): the LM head's logits "
                                 "stay sharded over the vocabulary and the cross-entropy runs on the shards "
                                 "(default: off, the logits gathered on every rank as Hugging Face's tp_plan does)",
                                 kind=None, flags=({"flag": "--loss-parallel", "const": True,
                                                    "help": "with tp > 1, vocabulary-parallel logits and "
                                                            "cross-entropy (torch loss_parallel; torchtitan)"},)),
    "moe_routing_imbalance": _option("dropless mixture of experts under expert parallelism: the busiest rank's "
                                         "routed tokens over the mean, a number >= 1 from your router's statistics, "
                                         "or uniform (the expected maximum under uniform random top-k routing, a lower "
                                         "bound); default balanced", "X|uniform"),
    "device": _option("what runs the kernels: cuda (default: a GPU's fused attention kernels) or cpu "
                          "(PyTorch's CPU kernels, which fall back to the math attention for some layouts, "
                          "as the validation runs measured)", choices=("cuda", "cpu")),
    "architecture": attrs.field(default=None, metadata={"internal": True}),       # the ArchitectureFamily
    "attention_kernel": attrs.field(default=None, metadata={"internal": True}),   # the AttentionKernel
    "checkpointing": attrs.field(default=None, metadata={"internal": True}),      # the CheckpointingSpec
    "optimizer_spec": attrs.field(default=None, metadata={"internal": True}),   # the OptimizerSpec (its .step)
    "techniques": attrs.field(default=None, metadata={"internal": True}),   # the registered Techniques, in order
}



def options_type(techniques, providers=None) -> type:
    """The profile's options type: its own options and the techniques' (``Technique.options``),
    each technique's after the option it names in ``after`` (else at the end, in the techniques'
    order), then the internal ones. One class per set of techniques (``MeasuredOptions`` for the
    built-ins). A field owned twice is an error naming both owners (``providers``: technique name
    -> its plugin's ``PluginInfo``)."""
    techniques = tuple(techniques)
    key = tuple(map(id, techniques))
    if key not in _TYPES:
        owner = {name: "the measured profile" for name in OWN_OPTIONS}
        listed = [n for n, f in OWN_OPTIONS.items() if not f.metadata.get("internal")]
        placed: list[tuple[str | None, list[str]]] = []
        owner.update(dict.fromkeys(_solve_keywords(), "mlsysim-core's solve (a keyword and a scenario field)"))
        for t in techniques:
            for name in t.options:
                _check_option(t, name, (providers or {}).get(t.name))
                if name in owner:
                    info = (providers or {}).get(t.name)
                    raise PluginContractError(
                        f"{info.describe() + ' ' if info else ''}technique {t.name!r} declares option {name!r}, "
                        f"which {owner[name]} owns already: each option has one owner", hook=TECHNIQUES_HOOK,
                        plugin=info and info.name, source=info and info.source)
                owner[name] = f"technique {t.name!r}"
            mine = [n for n, f in t.options.items() if not f.metadata.get("internal")]
            if t.after is None:
                listed += mine
            else:
                placed.append((t.after, mine))
        while placed:       # after an option placed itself: after it is there
            ready = [p for p in placed if p[0] in listed] or placed[:1]
            for after, mine in ready:
                at = listed.index(after) + 1 if after in listed else len(listed)
                listed[at:at] = mine
                placed.remove((after, mine))
        fields = {n: _field(n, techniques) for n in listed}
        fields.update({n: f for n, f in OWN_OPTIONS.items() if f.metadata.get("internal")})
        fields.update({n: f for t in techniques for n, f in t.options.items() if f.metadata.get("internal")})
        cls = attrs.make_class("MeasuredOptions", fields, frozen=True, kw_only=True,
                               cache_hash=True)     # (memo keys hash it: once per object)
        cls.__module__, cls.__doc__ = __name__, MEASURED_OPTIONS_DOC
        _TYPES[key] = (cls, techniques)      # (the techniques kept: their ids stay theirs)
    return _TYPES[key][0]


@functools.lru_cache(maxsize=1)
def _solve_keywords() -> frozenset:
    """The names solve and a scenario file own: a technique's option named so would never reach it."""
    import inspect
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.scenario import Scenario
    params = inspect.signature(TrainingMemoryModel.solve).parameters.values()
    return frozenset({p.name for p in params if p.kind is not p.VAR_KEYWORD and p.name != "self"}
                     | {f.name for f in attrs.fields(Scenario)} - {"profile_options"})


def _check_option(technique, name, info):
    """A technique's option is an ``attrs.field(default=..., metadata=...)``: the profile's options
    type is made of it, and a run that leaves the option out takes its default."""
    field = technique.options[name]
    problem = None
    if not hasattr(field, "metadata") or not hasattr(field, "_default"):
        problem = f"is {field!r}, not an attrs.field(default=..., metadata={{...}})"
    elif field._default is attrs.NOTHING:
        problem = "has no default (a run that leaves it out must take one: attrs.field(default=None, ...))"
    if problem:
        raise PluginContractError(f"{info.describe() + ' ' if info else ''}technique {technique.name!r}: option "
                                  f"{name!r} {problem}", hook=TECHNIQUES_HOOK, plugin=info and info.name,
                                  source=info and info.source)


def _field(name, techniques):
    return OWN_OPTIONS.get(name) or next(t.options[name] for t in techniques if name in t.options)


_TYPES: dict[tuple, tuple[type, tuple]] = {}
MEASURED_OPTIONS_DOC = ("The measured profile's options: its own (``OWN_OPTIONS``) and the registered techniques' "
                        "(``Technique.options``). See docs/profiles.md for each one's mechanism.")


def assemble(spec, registry):
    """``ProfileSpec.assemble``: the profile with the options of the registered techniques."""
    from .techniques import registered
    techniques = registered(registry)
    providers = {t.name: registry.provider(TECHNIQUES_HOOK, t.name) for t in techniques}
    cls = options_type(techniques, providers)
    missing = [n for n in READ_BY_THE_PHYSICS if n not in attrs.fields_dict(cls)]
    if missing:     # essential (as pytest's essential plugins are): refused, never an AttributeError later
        info = registry.provider("profile", spec.name)
        raise PluginContractError(
            f"the measured profile's physics reads the options {', '.join(missing)}, which no registered technique "
            f"declares: the built-in techniques (plugin measured_techniques, hook {TECHNIQUES_HOOK}) are essential "
            "to it; unblock that plugin", plugin=info.name, source=info.source, hook=TECHNIQUES_HOOK)
    return attrs.evolve(spec, options_type=cls)


# The built-in techniques' options that the measured physics (model.py, parallel.py, buffers.py, ...)
# still reads directly: a technique registered again under another name keeps them; blocking them all is
# refused by ``assemble``.
READ_BY_THE_PHYSICS = ("lora", "offload", "cpu_offload_optimizer", "loss", "loss_chunks", "optimizer_in_backward",
                       "activation_offload", "float8")


REGIMES_HOOK = "mlsysim_measured_regimes"
KERNELS_HOOK = "mlsysim_measured_attention_kernels"
SCHEDULES_HOOK = "mlsysim_measured_pipeline_schedules"
ARCHITECTURES_HOOK = "mlsysim_measured_architectures"
TECHNIQUES_HOOK = "mlsysim_measured_techniques"


def prepare(plan, registry):
    """The plan with its measured options checked and completed (``ProfileSpec.prepare``)."""
    regimes, schedules, kernels, families = (_registered(registry, hook) for hook in (
        REGIMES_HOOK, SCHEDULES_HOOK, KERNELS_HOOK, ARCHITECTURES_HOOK))
    techniques = tuple(registered(registry))     # the registered techniques, in order (techniques.py)
    plan = run_stage(plan, registry, "given", techniques)     # e.g. offload=torchao, its own machinery
    cf = plan.profile_options.moe_capacity_factor
    o, notes = _completed(registry, plan.profile_options, kinds(plan.profile_options), techniques,
                          plan.activation_checkpointing, plan.model, plan.precision, plan.seq_len,
                          plan.communication_buffer_fraction)
    plan = _evolved(plan, profile_options=o, notes=plan.notes + notes)
    check_rule(plan, registry)     # the data-parallel rule declares what the regime needs (Regime.requires)
    plan = run_stage(plan, registry, "completed", techniques)     # e.g. LoRA
    if cf is not None:
        if not plan.model.is_sparse:
            raise InvalidInputError("moe_capacity_factor", cf, "None for a dense model",
                                    f"{plan.model.name!r} has no experts")
        plan = _evolved(plan, profile_options=with_option(plan.profile_options, "moe_capacity_factor", float(cf)))
    if o.loss_parallel is not None:
        plan = _loss_parallel(plan, o.loss_parallel)
    if o.moe_routing_imbalance is not None:
        plan = _routing_imbalance(plan, o.moe_routing_imbalance, cf)
    # The selected optimizer's spec: its declaration (OptimizerSpec.step) is what the techniques read.
    plan = _evolved(plan, profile_options=with_option(plan.profile_options, "optimizer_spec",
                                                    registry.optimizers[plan.optimizer]))
    plan = run_stage(plan, registry, "optimizer", techniques)     # loss, optimizer in backward, float8, ...
    plan = run_stage(plan, registry, "last", techniques)          # e.g. torchao's offload refusals
    said = registry.optimizers[plan.optimizer].extensions.get("measured.notes")   # e.g. "unvalidated"
    ro = plan.profile_options.runtime_overheads
    if ro is not None and ro.cublas_workspace is None and _model.compute_capability(plan.hardware) is None:
        plan = _evolved(plan, notes=plan.notes + (_model.cublas_workspace_bytes(None)[1],))    # cuBLAS: not said
    if said is not None:
        plan = _evolved(plan, notes=plan.notes + tuple(said(plan)))
    plan = _parallel.layout_options(plan, schedules)
    family = o.architecture
    if family.check is not None:      # the family's word on this run: notes, or a refusal by name
        plan = _evolved(plan, notes=plan.notes + tuple(family.check(plan)))
    if plan.batch_size % (plan.dp_size * plan.gradient_accumulation_steps):   # no silent rounding
        _checks.whole_microbatches(plan.batch_size, plan.dp_size, plan.gradient_accumulation_steps)
    return plan


def with_option(o, name: str, value):
    """The options ``o`` with one of them set: one object for the same options (and types of their
    values) and value, so the per-layout memos compare options by identity."""
    return _with_option(o, kinds(o), name, value)


@memoize
def _with_option(o, o_kinds: tuple, name: str, value):
    return evolve(o, **{name: value})


@memoize
def _completed(registry, o, o_kinds: tuple, techniques, activation_checkpointing, model, precision, seq_len,
               communication_buffer_fraction) -> tuple:
    """``prepare``'s first part: the options as given (after the ``given`` stage) checked and
    completed, and the notes about the model: the same for every batch, so kept."""
    regimes, schedules, kernels = (_registered(registry, hook) for hook in (REGIMES_HOOK, SCHEDULES_HOOK,
                                                                             KERNELS_HOOK))
    chosen = regime_for(o.regime, "fp32", regimes) if o.regime is not None else None   # the name, before the model
    impl = "foreach" if o.optimizer_impl is None else _checks.name("optimizer_impl", o.optimizer_impl,
                                                                   _optimizers.IMPLEMENTATIONS)
    kernel = "sdpa" if o.attention is None else _checks.name("attention", o.attention, kernels)
    device = "cuda" if o.device is None else _checks.name("device", o.device, ("cuda", "cpu"))
    p = 0.0 if o.dropout is None else _checks.fraction("dropout", o.dropout)
    if p >= 1.0:
        raise InvalidInputError("dropout", o.dropout, "a probability in [0.0, 1.0)")
    blocks = None
    checkpointing = registry.checkpointing[activation_checkpointing]     # what it declares, read below
    if o.checkpointed_layers is not None:
        blocks = _checks.count("checkpointed_layers", o.checkpointed_layers, minimum=0)
        if checkpointing.recomputes != "layers":
            whole = sorted(n for n, s in registry.checkpointing.items() if s.recomputes == "layers")
            raise InvalidInputError("checkpointed_layers", o.checkpointed_layers,
                                    "None unless the strategy recomputes whole layers (recomputes='layers': "
                                    f"{', '.join(whole)})",
                                    f"activation_checkpointing={activation_checkpointing!r}")
        if blocks > model.layers:
            raise InvalidInputError("checkpointed_layers", o.checkpointed_layers,
                                    f"at most the model's {model.layers} layers")
    overheads = _runtime_overheads(o.runtime_overheads, _model.RuntimeOverheads)
    cf = o.moe_capacity_factor
    if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < 1e6):
        raise (InvalidInputTypeError if not isinstance(cf, (int, float)) or isinstance(cf, bool)
               else InvalidInputError)("moe_capacity_factor", cf, "a number > 0 (e.g. 1.25), or None")
    _parallel.check_option_values(o.pipeline_schedule, o.virtual_stages, getattr(o, "offload", None), schedules)
    # Then what the profile can describe, and what it approximates.
    if communication_buffer_fraction != 0.05:     # the reference's knob: never silently ignored
        raise NotModelledError(
            "communication_buffer_fraction", communication_buffer_fraction,
            "the default 0.05 under a measured-grade profile",
            "the measured profile sizes communication buffers from the sharding rules' own buckets; "
            "this is the reference profile's knob (profile='reference' uses it)")
    family, notes = _family_and_notes(registry, model, seq_len)
    o = evolve(o, regime=chosen or regime_for(None, precision, regimes), optimizer_impl=impl,
                     attention=kernel, attention_kernel=kernels[kernel], architecture=family, dropout=p, device=device,
                     checkpointed_layers=blocks, runtime_overheads=overheads, checkpointing=checkpointing,
                     techniques=techniques)
    return o, notes


@memoize
def _family_and_notes(registry, model, seq_len) -> tuple:
    """The family that models ``model`` (one registered family, or the nearest built-in, said) and
    the notes about the model and the sequence: the same for every solve of them, so kept."""
    families = _registered(registry, ARCHITECTURES_HOOK)
    third_party = {name: info.name for name in families
                   if (info := registry.provider(ARCHITECTURES_HOOK, name)).distribution != "mlsysim-core"}
    family, _ = family_for(model, families, third_party)
    _shapes.ModelShape.of(model, family)     # the shapes the profile needs, or a clear error now
    notes = _shapes.parameter_check(model, family)     # parameters that contradict the shapes: an error or a warning
    if not family.claims_model(model):     # no registered family models it: never costed as another
        arch = model.architecture
        raise NotModelledError(
            "model.architecture", arch,
            f"an architecture a registered family models ({', '.join(_architectures(families))}), e.g. "
            f"{type(model).__name__}(..., architecture='llama') for Llama-style layers, or a model imported "
            "from its config.json (mlsysim_core.hf.from_hf_config)",
            (f"{model.name!r} gives no architecture" if not arch else
             f"no registered family models {arch!r} (or its shapes do not fit the family that lists it)")
            + ", so its layers (MLP, norms, positions, attention) are unknown; profile='reference' is the "
            "textbook estimate from its sizes alone")
    notes += _shapes.approximation_notes(model, family, families)    # what is costed as something else: said
    if model.context_length is not None or seq_len > 1024:
        notes += _shapes.sequence_check(model, seq_len, family)    # past a position table: an error
    return family, notes


def _loss_parallel(plan, value):
    value = _checks.flag("loss_parallel", value)
    plan = evolve(plan, profile_options=evolve(plan.profile_options, loss_parallel=value))
    from .model import megatron
    if value and (plan.tp_size == 1 or megatron(plan.profile_options.regime)):
        why = ("without tensor parallelism the logits are whole" if plan.tp_size == 1 else
               "Megatron-Core's cross-entropy is vocabulary-parallel already")
        plan = evolve(plan, notes=plan.notes + (f"loss_parallel changes nothing here: {why}",))
    return plan


def _routing_imbalance(plan, value, cf):
    """Check and keep ``moe_routing_imbalance`` (``routing.py``), saying where it changes nothing."""
    from .routing import imbalance_factor, imbalance_value
    value = imbalance_value(value)
    if not plan.model.is_sparse:
        raise InvalidInputError("moe_routing_imbalance", value, "None for a dense model",
                                f"{plan.model.name!r} has no experts")
    if cf is not None:
        raise InvalidInputError("moe_routing_imbalance", value, "None with moe_capacity_factor",
                                "routing imbalance is for dropless routing; a capacity factor caps every expert's "
                                "load (the experts' activations scale with it instead)")
    plan = evolve(plan, profile_options=evolve(plan.profile_options, moe_routing_imbalance=value))
    if plan.ep_size == 1:
        note = ("moe_routing_imbalance changes nothing without expert parallelism: one device computes every "
                "routed copy, T x top-k rows however they are spread over its experts")
    else:
        note = (f"routing imbalance: the busiest expert-parallel rank computes {imbalance_factor(plan):.4f} x the "
                f"mean routed tokens ({value if value == 'uniform' else 'given'}); its experts' activations and "
                "all-to-all receive buffer scale with it")
    return evolve(plan, notes=plan.notes + (note,))


def _runtime_overheads(value, RuntimeOverheads):
    if value is None or value is True:
        return RuntimeOverheads()
    if value is False:
        return None
    if isinstance(value, RuntimeOverheads):
        return value
    if isinstance(value, Mapping):
        from mlsysim_core.serialization import structure_options
        return structure_options("runtime_overheads", "runtime_overheads", RuntimeOverheads, dict(value))
    raise InvalidInputTypeError("runtime_overheads", value, "a RuntimeOverheads, a dict of its fields, True or False")


def _registered(registry, hook: str) -> Mapping[str, Any]:
    """The items registered through one of the profile's hooks (every plugin's, built-ins
    included, as the registry collected them)."""
    items = registry.extensions.get(hook)
    if not items:
        raise NotModelledError("profile", "measured", f"a plugin that implements {hook}",
                               "no installed plugin registers any (is the built-in plugin blocked?)")
    check_items(registry, hook, items)
    return items


@functools.lru_cache(maxsize=1)
def item_types() -> dict[str, type]:
    """The class each of the profile's registration hooks registers (imported when asked: the
    measured modules load lazily)."""
    from .families import ArchitectureFamily
    from .kernels import AttentionKernel
    from .loss_implementations import HOOK as LOSSES_HOOK, LossImplementation
    from .quantizations import HOOK as QUANT_HOOK, QuantImplementation
    from .regimes import Regime
    from .schedules import PipelineSchedule
    from .techniques import Technique
    return {ARCHITECTURES_HOOK: ArchitectureFamily, REGIMES_HOOK: Regime, KERNELS_HOOK: AttentionKernel,
            SCHEDULES_HOOK: PipelineSchedule, TECHNIQUES_HOOK: Technique, LOSSES_HOOK: LossImplementation,
            QUANT_HOOK: QuantImplementation}


def check_items(registry, hook: str, items: Mapping[str, Any]) -> None:
    """Every item registered through ``hook`` is of the class the hook registers: another is the
    plugin's contract broken, named with its plugin (never an AttributeError where it is used)."""
    expected = item_types()[hook]
    for name, item in items.items():
        if not isinstance(item, expected):
            info = registry.provider(hook, name)
            raise PluginContractError(f"{info.describe() + ' ' if info else ''}hook {hook} registered "
                                      f"{type(item).__name__} {name!r}; expected {expected.__module__}."
                                      f"{expected.__qualname__}", hook=hook, plugin=info and info.name,
                                      source=info and info.source)


def _architectures(families: Mapping[str, Any]) -> list[str]:
    """Every ``model.architecture`` value a registered family lists, sorted."""
    return sorted({a for f in families.values() for a in getattr(f, "architectures", ())})



def __getattr__(name):
    """``MeasuredOptions``: the options with the built-in techniques' (what ``ProfileSpec.options_type``
    declares before the registry assembles the registered ones: ``assemble``)."""
    if name == "MeasuredOptions":
        from .builtin_techniques import TECHNIQUES
        return options_type(TECHNIQUES)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
