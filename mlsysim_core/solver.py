"""The solver: one fixed, documented pipeline.

    1. check the inputs          -> TrainingPlan          (nothing unchecked past here)
    2. select one spec per axis   (optimizer, checkpointing, tp, pp, ep, dp rules)
    3. apply the sharding rules   -> Placement             (tp, pp, ep, then dp)
    4. collect terms per component: weights, gradients, optimizer state, activations,
       communication buffers (selected specs + the profile's component hooks)
    5. combine                    -> TrainingMemoryResult  (the profile's rule: "sum" or "peak")

Only selected specs are called, so installed-but-unselected plugins contribute nothing.
Shard factors are integer products, and terms are ordered by (source, label) before
they are added, so pluggy's registration order never decides a number.
"""

from __future__ import annotations

import operator
import types
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError, NotModelledError, PluginContractError, PluginError
from .manager import PluginManager, get_plugin_manager
from .plan import PRECISION_BYTES, Placement, TrainingPlan
from .registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, PluginInfo, Registry
from .result import TrainingMemoryResult, _new_result
from .specs import _SHARD_FIELDS, AXES, DATA, DEFAULT_RULES, ShardingEffect, SplitSoFar
from .terms import (ACCELERATOR, ACTIVATIONS, COMMUNICATION_BUFFERS, COMPONENTS, GRADIENTS, HOST, RUNTIME_OVERHEADS,
                    OPTIMIZER_STATE, PHASES, WEIGHTS, MemoryTerm, _source_cell)
from .types import HardwareNode, TransformerWorkload

DEFAULT_PROFILE = "reference"
_ZERO_RULES = ("zero0", "zero1", "zero2", "zero3")


class TrainingMemoryModel:
    """How much memory one accelerator needs to train a model, and whether it fits.

    ``TrainingMemoryModel()`` uses the ``reference`` profile, which reproduces the
    reference model (mlsysim 0.3.0) exactly. ``plugin_manager`` lets tests and embedders
    supply their own set of plugins; by default every installed plugin is loaded once
    per process.
    """

    def __init__(self, profile: str = DEFAULT_PROFILE, *, plugin_manager: PluginManager | None = None):
        if plugin_manager is not None and not isinstance(plugin_manager, PluginManager):
            raise InvalidInputTypeError("plugin_manager", plugin_manager,
                                        "a mlsysim_core.manager.PluginManager, or None for the installed plugins",
                                        f"got {type(plugin_manager).__name__}")
        if not isinstance(profile, str):
            raise InvalidInputTypeError("profile", profile, "a profile name, e.g. 'reference' or 'measured'",
                                        f"got {type(profile).__name__}")
        self._pm = plugin_manager
        self._profile = profile

    @property
    def plugin_manager(self) -> PluginManager:
        if self._pm is None:
            self._pm = get_plugin_manager()
        return self._pm

    @property
    def registry(self) -> Registry:
        return self.plugin_manager.registry

    def solve(self, model, hardware, batch_size, seq_len=2048, precision='fp16', optimizer='adam',
              activation_checkpointing='selective', tp_size=1, pp_size=1, dp_size=1, ep_size=1,
              zero_stage=0, gradient_accumulation_steps=1, trainable_fraction=1.0,
              communication_buffer_fraction=0.05, *, sequence_parallel: bool = True,
              data_parallel: str | None = None, sharding_rules: Mapping[str, str] | None = None,
              plugin_options: Mapping[str, Any] | None = None,
              include_plugins: Sequence[str] = (), profile: str | None = None,
              regime: str | None = None, optimizer_impl: str | None = None,
              attention: str | None = None, dropout: float | None = None,
              checkpointed_layers: int | None = None, runtime_overheads: Any = None,
              cp_size: int = 1, lora: Any = None, pipeline_schedule: str | None = None,
              virtual_stages: int | None = None, expert_tp_size: int | None = None,
              stage_layers: Sequence[int] | None = None, offload: Any = None,
              moe_capacity_factor: float | None = None,
              ) -> TrainingMemoryResult:
        """Solve for the memory of one accelerator.

        The positional parameters are the reference model's, in its order, with its
        defaults; ``batch_size`` is the GLOBAL batch (all DP replicas and accumulation
        steps). Keyword-only extensions:

        * ``sequence_parallel``: with ``tp_size > 1``, divide activations by ``tp_size``.
        * ``data_parallel``: name of a data-parallel sharding rule (e.g. a third party's
          ZeRO variant); by default ``zero_stage`` selects ``zero0`` .. ``zero3``.
        * ``sharding_rules``: ``{"tp"|"pp"|"ep": rule name}`` to replace a default rule.
        * ``plugin_options``: ``{spec name: options}``, a dict or the spec's attrs options.
        * ``include_plugins``: plugins whose component hooks take part in addition to
          the profile's own.
        * ``profile``: overrides the model's profile for this call.
        * ``cp_size``: context parallelism, the sequence split over ``cp_size`` ranks
          (devices = tp x cp x pp x dp; ZeRO shards over dp x cp).

        Measured-grade profiles (``profile="measured"``) also read:

        * ``regime``: ``fp32``, ``amp-bf16``, ``amp-fp16``, ``bf16``, ``fp16``,
          ``mixed-bf16``, ``mixed-bf16-main-grad``, ``fsdp-bf16`` (default: from ``precision``: 16-bit
          means autocast, fp32 means fp32);
        * ``optimizer_impl``: PyTorch's ``foreach`` (default), ``fused`` or ``for-loop`` step;
        * ``attention``: ``sdpa`` (default; fused kernels, no s x s scores) or ``eager``;
        * ``dropout``: the layers' dropout probability (default 0.0);
        * ``checkpointed_layers``: with ``activation_checkpointing="full"``, recompute only
          this many of the layers (block recompute; default all);
        * ``runtime_overheads``: a ``RuntimeOverheads``, a dict of its fields, or ``False``
          for none (default: ``RuntimeOverheads()``);
        * ``lora``: a ``mlsysim_core.finetune.LoRAConfig`` (or a dict of its fields): LoRA or
          QLoRA fine-tuning, adapters trainable and the base frozen;
        * ``pipeline_schedule``: ``1f1b`` (default), ``gpipe``, ``interleaved-1f1b`` (with
          ``virtual_stages`` model chunks per rank), ``zb-h1`` or ``zb-h2`` (zero bubble);
        * ``expert_tp_size``: tensor parallelism inside the experts (default ``tp_size``);
          expert data parallelism is tp x dp / (expert_tp x ep);
        * ``stage_layers``: decoder layers on each pipeline stage (default: an even split);
        * ``offload``: what lives in host memory or on NVMe: ``"optimizer"``,
          ``"optimizer+gradients"``, ``"optimizer+gradients+parameters"``, a sequence of
          those names, or ``{name: "cpu" | "nvme"}``;
        * ``moe_capacity_factor``: mixture-of-experts with token dropping: every expert's
          batch padded to capacity factor x its share of the routed tokens (default dropless).

        With a parallel layout a measured-grade result describes every distinct rank
        (``result.ranks``: first, middle and last pipeline stages); its totals are the
        heaviest rank's, and ``feasible`` means every rank fits.
        """
        pm = self._pm
        registry = pm._registry if pm is not None else None     # (the loaded registry, without the properties)
        if registry is None:
            registry = self.registry
        if type(model) is str:       # catalog names, including entries this manager's plugins add
            from .catalog import get_model
            model = get_model(model, plugin_manager=self.plugin_manager)
        if type(hardware) is str:
            from .catalog import get_hardware
            hardware = get_hardware(hardware, plugin_manager=self.plugin_manager)
        profile = self._profile if profile is None else profile
        plan = _build_plan(registry, profile, model, hardware, batch_size, seq_len,
                           precision, optimizer, activation_checkpointing, tp_size, pp_size,
                           dp_size, ep_size, zero_stage, gradient_accumulation_steps,
                           trainable_fraction, communication_buffer_fraction, sequence_parallel,
                           data_parallel, sharding_rules, plugin_options, include_plugins, cp_size)
        measured = (regime, optimizer_impl, attention, dropout, checkpointed_layers, runtime_overheads,
                    lora, pipeline_schedule, virtual_stages, expert_tp_size, stage_layers, offload,
                    moe_capacity_factor)
        if registry.profiles[plan.profile].grade == "measured":
            plan = _measured_plan_reused(registry, plan, measured)
            if plan.batch_size % (plan.dp_size * plan.gradient_accumulation_steps):   # no silent rounding
                _checks.whole_microbatches(plan.batch_size, plan.dp_size, plan.gradient_accumulation_steps)
            parallel = _parallel_module()
            if parallel.is_parallel(plan):
                return parallel.solve_ranks(plan, lambda p: _run_pipeline(registry, p))
        elif any(map(operator.is_not, measured, _NO_MEASURED)):
            given = [n for n, v in zip(_MEASURED_OPTIONS, measured) if v is not None]
            raise InvalidInputError(given[0], measured[_MEASURED_OPTIONS.index(given[0])],
                                    "None under a reference-grade profile",
                                    f"profile {plan.profile!r} ignores it; use profile='measured'")
        return _run_pipeline(registry, plan)


# --- 1. inputs ----------------------------------------------------------------------------

_MEASURED_OPTIONS = ("regime", "optimizer_impl", "attention", "dropout", "checkpointed_layers",
                     "runtime_overheads", "lora", "pipeline_schedule", "virtual_stages", "expert_tp_size",
                     "stage_layers", "offload", "moe_capacity_factor")
_NO_MEASURED = (None,) * len(_MEASURED_OPTIONS)


def _measured_plan(plan: TrainingPlan, regime, optimizer_impl, attention, dropout, checkpointed_layers,
                   runtime_overheads, lora=None, pipeline_schedule=None, virtual_stages=None,
                   expert_tp_size=None, stage_layers=None, offload=None,
                   moe_capacity_factor=None) -> TrainingPlan:
    """The measured-grade options, checked and with their defaults. The options' own values
    are checked first, so that a bad one is an error even when the profile then finds it
    cannot describe the run (the CLI would fall back and leave the option out)."""
    from .measured.model import RuntimeOverheads
    from .measured.optimizers import IMPLEMENTATIONS
    from .measured.regimes import regime_for
    from .measured.shapes import ModelShape, approximation_notes, parameter_check, sequence_check
    chosen = regime_for(regime, "fp32") if regime is not None else None     # the name, before the model
    impl = "foreach" if optimizer_impl is None else _checks.name("optimizer_impl", optimizer_impl, IMPLEMENTATIONS)
    kernel = "sdpa" if attention is None else _checks.name("attention", attention, ("sdpa", "eager"))
    p = 0.0 if dropout is None else _checks.fraction("dropout", dropout)
    if p >= 1.0:
        raise InvalidInputError("dropout", dropout, "a probability in [0.0, 1.0)")
    blocks = None
    if checkpointed_layers is not None:
        blocks = _checks.count("checkpointed_layers", checkpointed_layers, minimum=0)
        if plan.activation_checkpointing != "full":
            raise InvalidInputError("checkpointed_layers", checkpointed_layers,
                                    "None unless activation_checkpointing='full'",
                                    f"activation_checkpointing={plan.activation_checkpointing!r}")
        if blocks > plan.model.layers:
            raise InvalidInputError("checkpointed_layers", checkpointed_layers,
                                    f"at most the model's {plan.model.layers} layers")
    if runtime_overheads is None or runtime_overheads is True:
        overheads = RuntimeOverheads()
    elif runtime_overheads is False:
        overheads = None
    elif isinstance(runtime_overheads, RuntimeOverheads):
        overheads = runtime_overheads
    elif isinstance(runtime_overheads, Mapping):
        from .serialization import structure_options
        overheads = structure_options("runtime_overheads", "runtime_overheads", RuntimeOverheads,
                                      dict(runtime_overheads))
    else:
        raise InvalidInputTypeError("runtime_overheads", runtime_overheads,
                                    "a RuntimeOverheads, a dict of its fields, True or False")
    if moe_capacity_factor is not None:
        cf = moe_capacity_factor
        if isinstance(cf, bool) or not isinstance(cf, (int, float)) or not 0 < cf < 1e6:
            raise (InvalidInputTypeError if not isinstance(cf, (int, float)) or isinstance(cf, bool)
                   else InvalidInputError)("moe_capacity_factor", cf, "a number > 0 (e.g. 1.25), or None")
    _parallel_module().check_option_values(pipeline_schedule, virtual_stages, offload)
    # Then what the profile can describe, and what it approximates.
    if plan.communication_buffer_fraction != 0.05:     # the reference's knob: never silently ignored
        raise NotModelledError(
            "communication_buffer_fraction", plan.communication_buffer_fraction,
            "the default 0.05 under a measured-grade profile",
            "the measured profile sizes communication buffers from the sharding rules' own buckets; "
            "this is the reference profile's knob (profile='reference' uses it)")
    ModelShape.of(plan.model)     # the shapes the profile needs, or a clear error now
    warnings = parameter_check(plan.model)     # parameters that contradict the shapes: an error or a warning
    warnings += approximation_notes(plan.model)    # what is costed as something else: said, never silent
    if plan.model.context_length is not None or plan.seq_len > 1024:
        warnings += sequence_check(plan.model, plan.seq_len)    # past a position table: an error; past RoPE's: a note
    chosen = chosen or regime_for(None, plan.precision)
    plan = attrs.evolve(plan, regime=chosen, optimizer_impl=impl, attention=kernel, dropout=p,
                        checkpointed_layers=blocks, runtime_overheads=overheads, warnings=warnings)
    if lora is not None:
        from .finetune import lora_option
        plan = lora_option(plan, lora)
    from .measured.parallel import layout_options
    if moe_capacity_factor is not None:
        if not plan.model.is_sparse:
            raise InvalidInputError("moe_capacity_factor", moe_capacity_factor, "None for a dense model",
                                    f"{plan.model.name!r} has no experts")
        plan = attrs.evolve(plan, moe_capacity_factor=float(moe_capacity_factor))
    return layout_options(plan, pipeline_schedule, virtual_stages, expert_tp_size, stage_layers, offload)


_PARALLEL = None
_SIMPLE_OPTION_TYPES = frozenset((type(None), str, int, bool))


def _parallel_module():
    global _PARALLEL
    if _PARALLEL is None:
        from .measured import parallel
        _PARALLEL = parallel
    return _PARALLEL


def _measured_plan_reused(registry: Registry, plan: TrainingPlan, measured: tuple) -> TrainingPlan:
    """``_measured_plan``, reusing the plan it gave before for the same checked plan (by
    identity: the cache holds it) and the same options (None, str, int or bool values,
    compared with their types; anything else is checked afresh). Plans are frozen and the
    checks depend on nothing else, so the outcome is the same."""
    if not FAST_PATHS:
        return _measured_plan(plan, *measured)
    if not any(map(operator.is_not, measured, _NO_MEASURED)):   # every option None: the plan is the key
        plans = registry.cache.get("measured plans, no options")
        if plans is None:
            plans = registry.cache["measured plans, no options"] = {}
        hit = plans.get(id(plan))
        if hit is not None and hit[0] is plan:
            return hit[1]
        checked = _measured_plan(plan, *measured)
        if len(plans) >= _CACHE_SIZE:
            plans.clear()
        plans[id(plan)] = (plan, checked)
        return checked
    simple = _SIMPLE_OPTION_TYPES
    for value in measured:
        if type(value) not in simple:
            return _measured_plan(plan, *measured)
    key = (id(plan), measured, tuple(map(type, measured)))
    plans = registry.cache.get("measured plans")
    if plans is None:
        plans = registry.cache["measured plans"] = {}
    hit = plans.get(key)
    if hit is not None and hit[0] is plan:
        return hit[1]
    checked = _measured_plan(plan, *measured)
    if len(plans) >= _CACHE_SIZE:
        plans.clear()
    plans[key] = (plan, checked)
    return checked


def _check_tp(model: TransformerWorkload, tp_size: int) -> None:
    """Under every profile, a tensor-parallel rank holds at least one column of the hidden
    size (the reference's 4096 stand-in when the model has none): more ranks than that split
    nothing. (The measured profile also needs tp to divide the heads; the reference profile
    does not check the heads: mlsysim 0.3.0 accepted tp=16 on 12 heads, and the recorded
    reference grid has such runs.)"""
    hidden = model.hidden_dim or 4096
    if tp_size > hidden:
        from .errors import LayoutError
        heads = model.heads
        hint = (f"; with its {heads} heads, a divisor of {heads} (e.g. {_largest_divisor(heads, 8)})"
                if heads else "")
        raise LayoutError("tp_size", tp_size, f"at most the model's hidden size {hidden}{hint}",
                          "tensor parallelism splits the hidden dimension (and the heads) over tp ranks: "
                          "more ranks than columns leaves ranks with nothing")


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def _check_included(registry: Registry, profile: str, include: tuple) -> None:
    """``include_plugins`` may name plugins that add component terms the profile does not
    already have: not a plugin that provides a profile (its hooks are that profile's model,
    not an add-on), nor one the selected profile already runs (its terms would count twice),
    nor one without component hooks (including it would change nothing)."""
    key = ("includable", profile)
    includable = registry.cache.get(key)
    if includable is None:
        from .hookspecs import COMPONENT_HOOKS
        providers = {info.name for (kind, _), info in registry.providers.items() if kind == PROFILE}
        # (a component plugin of another profile is part of that profile's model, not an add-on:
        # the reference's model_states under the measured profile would count the weights twice)
        providers |= {name for spec in registry.profiles.values() for name in spec.component_plugins
                      if spec.name != profile}
        runs = set(registry.profiles[profile].component_plugins)
        hooked = {impl.plugin.name for hook in COMPONENT_HOOKS.values()
                  for impl in registry.component_impls.get(hook, ())}
        includable = registry.cache[key] = (tuple(sorted(hooked - providers - runs)), providers, runs, hooked)
    names, providers, runs, hooked = includable
    for plugin in include:
        if plugin in names:
            continue
        why = (f"plugin {plugin!r} provides a profile or is part of one: use profile= to select it"
               if plugin in providers else
               f"profile {profile!r} already runs plugin {plugin!r}: its terms would count twice" if plugin in runs
               else f"plugin {plugin!r} implements no component hook: including it would change nothing")
        raise InvalidInputError("include_plugins", plugin,
                                "a plugin whose component hooks the profile does not already run: "
                                + (", ".join(names) if names else "(none installed)"), why)


def _resolve_model(model) -> TransformerWorkload:
    if isinstance(model, str):
        from .catalog import get_model
        return get_model(model)
    if not isinstance(model, TransformerWorkload):
        raise InvalidInputTypeError("model", model,
                                    "a TransformerWorkload, SparseTransformerWorkload or a catalog name "
                                    "(see `mlsysim-core models`)", f"got {type(model).__name__}")
    return model


def _resolve_hardware(hardware) -> HardwareNode:
    if isinstance(hardware, str):
        from .catalog import get_hardware
        return get_hardware(hardware)
    if not isinstance(hardware, HardwareNode):
        raise InvalidInputTypeError("hardware", hardware,
                                    "a HardwareNode or a catalog name (see `mlsysim-core hardware`)",
                                    f"got {type(hardware).__name__}")
    return hardware


def _catalog_notes(plan: TrainingPlan) -> tuple[str, ...]:
    """A note for a model or accelerator that is the reference's catalog data (``mlsysim:``)."""
    import sys
    catalog = sys.modules.get("mlsysim_core.catalog")     # never imported: no catalog objects
    return catalog.provenance_notes(plan.model, plan.hardware) if catalog is not None else ()


def _select_rule(registry: Registry, axis: str, name: object, parameter: str) -> str:
    choices = registry.rules_for_axis(axis)
    if not isinstance(name, str) or name.strip().lower() not in choices:
        label = {"dp": "data-parallel", "tp": "tensor-parallel", "pp": "pipeline-parallel",
                 "ep": "expert-parallel", "cp": "context-parallel"}[axis]
        raise (InvalidInputTypeError if not isinstance(name, str) else InvalidInputError)(
            parameter, name, f"an installed {label} rule: {registry.describe_choices(SHARDING, choices)}")
    return name.strip().lower()


# Fast paths (the solver's own caches; plugins memoise their terms separately, see
# mlsysim_plugins._memo and mlsysim_core.measured._cache). False turns them off: tests check
# that results are byte-identical either way.
FAST_PATHS = True
_CACHE_SIZE = 4096


def _build_plan(registry, profile, model, hardware, batch_size, seq_len, precision, optimizer,
                activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
                gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
                sequence_parallel, data_parallel, sharding_rules, plugin_options,
                include_plugins, cp_size=1) -> TrainingPlan:
    """The checked plan. Inputs checked before (the same registry, the same model and
    hardware objects, the same values of exactly the same types) give the plan built then:
    plans are frozen, and a check's outcome depends on nothing else. Only values of the
    expected types are looked up (anything else, unhashable included, goes to the checks,
    whose errors name it)."""
    if FAST_PATHS and (sharding_rules is None or type(sharding_rules) is dict and not sharding_rules) and \
            (plugin_options is None or type(plugin_options) is dict and not plugin_options) and \
            type(profile) is str and type(precision) is str and type(optimizer) is str and \
            type(activation_checkpointing) is str and (data_parallel is None or type(data_parallel) is str) and \
            (type(include_plugins) is tuple and all(type(name) is str for name in include_plugins) or
             type(include_plugins) is list and not include_plugins) and \
            type(batch_size) is int and type(seq_len) is int and type(tp_size) is int and \
            type(pp_size) is int and type(dp_size) is int and type(ep_size) is int and \
            type(zero_stage) is int and type(gradient_accumulation_steps) is int and type(cp_size) is int and \
            type(trainable_fraction) is float and type(communication_buffer_fraction) is float and \
            (sequence_parallel is True or sequence_parallel is False):
        plans = registry.cache.get("plans")
        if plans is None:
            plans = registry.cache["plans"] = {}
        # Objects by identity (a cached plan holds them, so their ids are not reused while
        # it is cached), the rest by value.
        key = (profile, id(model), id(hardware), batch_size, seq_len, precision, optimizer,
               activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
               gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
               sequence_parallel, data_parallel, cp_size, include_plugins or ())
        plan = plans.get(key)
        if plan is not None and plan.model is model and plan.hardware is hardware:
            return plan
        plan = _checked_plan(registry, profile, model, hardware, batch_size, seq_len, precision, optimizer,
                             activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
                             gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
                             sequence_parallel, data_parallel, sharding_rules, plugin_options,
                             include_plugins, cp_size)
        if plan.model is model and plan.hardware is hardware:    # not for catalog names
            if len(plans) >= _CACHE_SIZE:
                plans.clear()
            plans[key] = plan
        return plan
    return _checked_plan(registry, profile, model, hardware, batch_size, seq_len, precision, optimizer,
                         activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
                         gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
                         sequence_parallel, data_parallel, sharding_rules, plugin_options,
                         include_plugins, cp_size)


def _checked_plan(registry, profile, model, hardware, batch_size, seq_len, precision, optimizer,
                  activation_checkpointing, tp_size, pp_size, dp_size, ep_size, zero_stage,
                  gradient_accumulation_steps, trainable_fraction, communication_buffer_fraction,
                  sequence_parallel, data_parallel, sharding_rules, plugin_options,
                  include_plugins, cp_size=1) -> TrainingPlan:
    profile = _checks.name("profile", profile, registry.profiles)
    model = _resolve_model(model)
    hardware = _resolve_hardware(hardware)
    # The reference model's order of checks (spec §4), made strict.
    precision = _checks.name("precision", precision, PRECISION_BYTES)
    if not isinstance(optimizer, str) or optimizer.lower() not in registry.optimizers:
        raise (InvalidInputError if isinstance(optimizer, str) else InvalidInputTypeError)(
            "optimizer", optimizer,
            f"an installed optimizer: {registry.describe_choices(OPTIMIZER, registry.optimizers)}")
    if not isinstance(activation_checkpointing, str) or activation_checkpointing not in registry.checkpointing:
        # Case-sensitive, as the reference: 'Selective' is not a strategy name.
        raise (InvalidInputError if isinstance(activation_checkpointing, str) else InvalidInputTypeError)(
            "activation_checkpointing", activation_checkpointing,
            f"one of: {registry.describe_choices(CHECKPOINTING, registry.checkpointing)}")
    count = _checks.count
    batch_size = count("batch_size", batch_size)
    seq_len = count("seq_len", seq_len)
    tp_size = count("tp_size", tp_size)
    pp_size = count("pp_size", pp_size)
    dp_size = count("dp_size", dp_size)
    ep_size = count("ep_size", ep_size)
    cp_size = count("cp_size", cp_size) if cp_size != 1 or type(cp_size) is not int else 1
    gradient_accumulation_steps = count("gradient_accumulation_steps", gradient_accumulation_steps)
    trainable_fraction = _checks.fraction("trainable_fraction", trainable_fraction)
    communication_buffer_fraction = _checks.fraction("communication_buffer_fraction",
                                                     communication_buffer_fraction)
    if type(zero_stage) is not int or zero_stage not in (0, 1, 2, 3):
        if isinstance(zero_stage, bool) or zero_stage not in (0, 1, 2, 3):
            raise (InvalidInputTypeError if isinstance(zero_stage, bool) else InvalidInputError)(
                "zero_stage", zero_stage, "0, 1, 2 or 3")
        zero_stage = int(zero_stage)
    if sequence_parallel is not True and sequence_parallel is not False:
        _checks.flag("sequence_parallel", sequence_parallel)
    if tp_size > 1:
        _check_tp(model, tp_size)
    # Wrong types are errors, even when falsy (0, "", [] are not "not given"): only None and
    # the documented empty forms ({} for the mappings, an empty sequence of names) are.
    if sharding_rules is not None and not isinstance(sharding_rules, Mapping):
        raise InvalidInputTypeError("sharding_rules", sharding_rules,
                                    f"a mapping of axis ({', '.join(DEFAULT_RULES)}) -> rule name, or None",
                                    f"got {type(sharding_rules).__name__}")
    if plugin_options is not None and not isinstance(plugin_options, Mapping):
        raise InvalidInputTypeError("plugin_options", plugin_options, "a mapping of spec name -> options, or None",
                                    f"got {type(plugin_options).__name__}")
    if isinstance(include_plugins, str):
        include_plugins = (include_plugins,)
    if include_plugins is not None and (
            not isinstance(include_plugins, Iterable) or isinstance(include_plugins, (bytes, Mapping, set, frozenset))
            or not all(isinstance(plugin, str) for plugin in include_plugins)):
        raise InvalidInputTypeError("include_plugins", include_plugins,
                                    "a sequence of installed plugin names (or one name), or ()",
                                    f"got {type(include_plugins).__name__}")

    if registry.checkpointing[activation_checkpointing].requires_heads and model.heads is None:
        usable = sorted(n for n, s in registry.checkpointing.items() if not s.requires_heads)
        raise InvalidInputError(
            "activation_checkpointing", activation_checkpointing,
            f"a strategy that does not need the head count for model {model.name!r} (heads=None): "
            f"{', '.join(usable)}",
            f"strategy '{activation_checkpointing}' needs model.heads"
            + (": the 5*a*s^2*b attention-score term scales with the head count (Korthikanti et al. "
               "2023, Sec. 4.1)" if activation_checkpointing == "none" else ""))

    # Which specs: the same answer for the same names, so it is cached when it can be.
    key = None
    if not sharding_rules and not plugin_options and not include_plugins and \
            (data_parallel is None or type(data_parallel) is str):
        key = ("select", optimizer, activation_checkpointing, zero_stage, data_parallel)
        chosen = registry.cache.get(key)
        if chosen is not None:
            optimizer_name, rules, include, options = chosen
            return TrainingPlan(
                model=model, hardware=hardware, batch_size=batch_size, seq_len=seq_len, precision=precision,
                optimizer=optimizer_name, activation_checkpointing=activation_checkpointing, tp_size=tp_size,
                pp_size=pp_size, dp_size=dp_size, ep_size=ep_size, zero_stage=zero_stage,
                gradient_accumulation_steps=gradient_accumulation_steps, trainable_fraction=trainable_fraction,
                communication_buffer_fraction=communication_buffer_fraction,
                sequence_parallel=sequence_parallel, profile=profile, rules=rules, options=options,
                include_plugins=include, cp_size=cp_size)
    optimizer_name = optimizer.lower()

    # Select one sharding rule per axis.
    if sharding_rules is not None and not isinstance(sharding_rules, Mapping):
        raise InvalidInputTypeError("sharding_rules", sharding_rules,
                                    f"a mapping of axis ({', '.join(DEFAULT_RULES)}) -> rule name",
                                    f"got {type(sharding_rules).__name__}")
    requested = dict(sharding_rules) if sharding_rules else {}
    for axis in requested:
        if axis not in DEFAULT_RULES:
            raise InvalidInputError("sharding_rules", requested,
                                    f"keys among {', '.join(DEFAULT_RULES)} (use data_parallel= for 'dp')")
    rules = {}
    for axis, default in DEFAULT_RULES.items():
        name = requested.get(axis, default)
        rules[axis] = name if type(name) is str and name in registry.rules_by_axis[axis] else \
            _select_rule(registry, axis, name, f"sharding_rules[{axis!r}]")
    if data_parallel is None:
        name = _ZERO_RULES[zero_stage]
        rules[DATA] = name if name in registry.rules_by_axis[DATA] else _select_rule(registry, DATA, name, "zero_stage")
    else:
        rules[DATA] = _select_rule(registry, DATA, data_parallel, "data_parallel")    # a known rule first
        if zero_stage != 0:
            raise InvalidInputError("zero_stage", zero_stage,
                                    "0 when data_parallel= names a rule (the rule decides the sharding)",
                                    f"data_parallel={data_parallel!r}")
    rules = types.MappingProxyType(rules)

    include = tuple(sorted(set(include_plugins))) if include_plugins else ()
    for plugin in include:
        if plugin not in registry.plugins:
            raise InvalidInputError("include_plugins", plugin,
                                    f"an installed plugin: {', '.join(sorted(registry.plugins))}")
    if include:
        _check_included(registry, profile, include)

    if not plugin_options and not _specs_with_options(registry).intersection(
            (optimizer_name, activation_checkpointing, *rules.values())):
        options = _NO_OPTIONS     # nothing to structure: the common case
    else:
        spec_names = {optimizer_name: registry.optimizers[optimizer_name],
                      activation_checkpointing: registry.checkpointing[activation_checkpointing]}
        spec_names.update({name: registry.sharding_rules[name] for name in rules.values()})
        options = types.MappingProxyType(_structure_options(plugin_options or {}, spec_names))
    if key is not None:
        registry.cache[key] = (optimizer_name, rules, include, options)

    return TrainingPlan(model=model, hardware=hardware, batch_size=batch_size, seq_len=seq_len,
                        precision=precision, optimizer=optimizer_name,
                        activation_checkpointing=activation_checkpointing, tp_size=tp_size, pp_size=pp_size,
                        dp_size=dp_size, ep_size=ep_size, zero_stage=zero_stage,
                        gradient_accumulation_steps=gradient_accumulation_steps,
                        trainable_fraction=trainable_fraction,
                        communication_buffer_fraction=communication_buffer_fraction,
                        sequence_parallel=sequence_parallel, profile=profile, rules=rules,
                        options=options, include_plugins=include, cp_size=cp_size)


_NO_OPTIONS: Mapping[str, Any] = types.MappingProxyType({})


def _specs_with_options(registry: Registry) -> frozenset:
    """Names of the installed specs that declare options (cached per registry)."""
    names = registry.cache.get("optioned")
    if names is None:
        names = registry.cache["optioned"] = frozenset(
            name for table in (registry.optimizers, registry.checkpointing, registry.sharding_rules)
            for name, spec in table.items() if spec.options_type is not None)
    return names


def _structure_options(given: Mapping[str, Any], selected: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(given, Mapping):
        raise InvalidInputTypeError("plugin_options", given, "a mapping of spec name -> options")
    for name in given:
        if name not in selected:
            raise InvalidInputError("plugin_options", name,
                                    f"options for a selected spec: {', '.join(sorted(selected))}",
                                    "that spec is not selected in this solve")
    options = {}
    for name, spec in selected.items():
        if spec.options_type is None:
            if name in given:
                raise InvalidInputError(f"plugin_options[{name!r}]", given[name],
                                        f"nothing: '{name}' declares no options")
            continue
        if name in given:
            from .serialization import structure_options
            options[name] = structure_options("plugin_options", name, spec.options_type, given[name])
        else:
            try:
                options[name] = spec.options_type()
            except TypeError as err:
                raise InvalidInputError(f"plugin_options[{name!r}]", None,
                                        f"values for the required options of '{name}'", str(err)) from err
    return options


# --- 2-5. the pipeline --------------------------------------------------------------------
#
# The hot path: a solve builds about a dozen small objects and makes one call per selected
# spec and per component-hook implementation. Provenance is stamped while a plugin runs
# (terms default their ``source`` to the plugin being called), so terms are built once.

_ITERABLE_EXCLUDED = (str, bytes, MemoryTerm)


def _listed(items):
    """A plugin's returned iterable as a list (generators run plugin code while consumed)."""
    if items is None:
        return []
    if type(items) is list:
        return items
    if isinstance(items, _ITERABLE_EXCLUDED) or not isinstance(items, Iterable):
        return items   # _stamp reports the wrong type
    return list(items)


def _blame(info: PluginInfo, what, hook: str, err: BaseException) -> PluginContractError:
    return PluginContractError(f"{info.describe()} {_where(what)} raised {type(err).__name__}: {err}",
                               plugin=info.name, source=info.source, hook=hook)


def _where(what) -> str:
    """Call sites are described lazily (a format string and its arguments): only errors need them."""
    return what[0].format(*what[1:]) if isinstance(what, tuple) else what


def _terms(info: PluginInfo, what, hook: str, function: Callable, args: tuple, component: str,
           cell: list) -> list[MemoryTerm]:
    """The hot path of one term-returning plugin call: name the plugin in the pipeline's
    provenance cell (terms it builds are stamped with it), call it, blame it for anything
    but a user error, and check what it returned."""
    cell[0] = info.name
    try:
        items = function(*args)
        if type(items) is not list:
            items = _listed(items)
    except (InvalidInputError, PluginContractError):
        raise
    except Exception as err:
        raise _blame(info, what, hook, err) from err
    if type(items) is list:
        name = info.name
        if len(items) > 3 and FAST_PATHS:
            # The same term objects, already found right for this plugin and component (the
            # cache holds them, so their ids are not reused while cached), are right again.
            key = (name, component, *map(id, items))
            if key in _CHECKED:
                return items
            for term in items:
                if type(term) is not MemoryTerm or term.component != component or term.source != name:
                    return _stamp(info, items, component, what, hook)
            if len(_CHECKED) >= _CACHE_SIZE:
                _CHECKED.clear()
            _CHECKED[key] = tuple(items)
            return items
        for term in items:
            if type(term) is not MemoryTerm or term.component != component or term.source != name:
                return _stamp(info, items, component, what, hook)
        return items
    return _stamp(info, items, component, what, hook)


_CHECKED: dict = {}   # (plugin, component, the terms' ids) -> the terms, found right


def _stamp(info: PluginInfo, items, component: str, what, hook: str) -> list[MemoryTerm]:
    """Check what a plugin returned; re-stamp any term not already stamped with the plugin."""
    if type(items) is not list:
        where = _where(what)
        raise PluginContractError(
            f"{info.describe()} {where} returned {type(items).__name__}; expected a list of MemoryTerm",
            plugin=info.name, source=info.source, hook=hook)
    for i, term in enumerate(items):
        if type(term) is not MemoryTerm and not isinstance(term, MemoryTerm):
            where = _where(what)
            raise PluginContractError(
                f"{info.describe()} {where} returned {type(term).__name__} {term!r}; expected MemoryTerm",
                plugin=info.name, source=info.source, hook=hook)
        if term.component != component:
            where = _where(what)
            raise PluginContractError(
                f"{info.describe()} {where} returned a '{term.component}' term ({term.label!r}); "
                f"expected component '{component}'", plugin=info.name, source=info.source, hook=hook)
        if term.source != info.name:
            items[i] = attrs.evolve(term, source=info.name)
    return items


_PLAN_PLACEMENT = ("plan", "placement")


class _Selection:
    """Everything a solve needs that depends only on which specs and plugins are selected:
    built once per registry and selection, then reused (searches solve thousands of
    layouts with the same selection)."""

    __slots__ = ("rules", "optimizer", "checkpointing", "impls", "calls", "plugin_sources", "selected", "missing",
                 "profile_info", "combine_peak", "splits", "placements", "shaped", "rule_calls")

    def __init__(self, registry: Registry, plan: TrainingPlan):
        from .hookspecs import COMPONENT_HOOKS
        self.rules = tuple((axis, name, registry.providers[(SHARDING, name)], registry.sharding_rules[name].apply,
                            _takes_split(registry.sharding_rules[name].apply))
                           for axis, name in ((axis, plan.rules[axis]) for axis in AXES))
        self.splits = any(rule[4] for rule in self.rules)
        self.rule_calls = tuple((info.name, apply, info, name) for _, name, info, apply, _ in self.rules)   # a rule reads what the earlier ones did
        # The effects' ids and the model's counts -> (placement, buffers, notes, effects); a
        # placement depends on the rules alone, so selections with the same rules (e.g. the
        # checkpointing strategies of one layout in a search) share one cache.
        self.placements = registry.cache.setdefault(("placements", tuple(rule[1] for rule in self.rules)), {})
        # The effects' shards (not their buffers) and the model's counts -> (placement, notes).
        self.shaped = registry.cache.setdefault(("shaped", tuple(rule[1] for rule in self.rules)), {})
        opt, ckpt = plan.optimizer, plan.activation_checkpointing
        profile = registry.profiles[plan.profile]
        measured = profile.grade == "measured"
        optimizer, checkpointing = registry.optimizers[opt], registry.checkpointing[ckpt]
        opt_fn = optimizer.measured_state_terms if measured else optimizer.state_terms
        ckpt_fn = checkpointing.measured_activation_terms if measured else checkpointing.activation_terms
        for fn, kind, name, parameter, table in (
                (opt_fn, OPTIMIZER, opt, "optimizer", registry.optimizers),
                (ckpt_fn, CHECKPOINTING, ckpt, "activation_checkpointing", registry.checkpointing)):
            if fn is None:
                field = "measured_state_terms" if kind == OPTIMIZER else "measured_activation_terms"
                usable = sorted(n for n, spec in table.items() if getattr(spec, field) is not None)
                raise NotModelledError(
                    parameter, name, f"one with a measured-grade model under profile {plan.profile!r}: "
                    f"{', '.join(usable)}",
                    f"{registry.providers[(kind, name)].describe()} gives no {field}; "
                    "profile='reference' accepts it")
        # (provider, callable, call site for messages, hook name for messages)
        self.optimizer = (registry.providers[(OPTIMIZER, opt)], opt_fn,
                          ("optimizer '{}' " + ("measured_state_terms" if measured else "state_terms"), opt),
                          "state_terms")
        self.checkpointing = (registry.providers[(CHECKPOINTING, ckpt)], ckpt_fn,
                              ("checkpointing strategy '{}' " + ("measured_activation_terms" if measured
                                                                 else "activation_terms"), ckpt),
                              "activation_terms")
        self.combine_peak = profile.combine == "peak"
        wanted = set(profile.component_plugins) | set(plan.include_plugins)
        self.impls = {component: tuple(i for i in registry.component_impls[hook] if i.plugin.name in wanted)
                      for component, hook in COMPONENT_HOOKS.items()}
        # Ready-made calls per component: (provider, function, argnames or None for the usual
        # (plan, placement), call site, hook name).
        self.calls = {component: tuple((i.plugin, i.function, _arguments(i.argnames),
                                        ("hook {}", COMPONENT_HOOKS[component]), COMPONENT_HOOKS[component])
                                       for i in impls)
                      for component, impls in self.impls.items()}
        self.missing = sorted(n for n in profile.component_plugins if n not in registry.plugins)
        self.profile_info = registry.providers[(PROFILE, plan.profile)]
        infos = [self.optimizer[0], self.checkpointing[0], *(rule[2] for rule in self.rules),
                 *(impl.plugin for impls in self.impls.values() for impl in impls)]
        # The plugins that took part and their distributions.
        self.plugin_sources = types.MappingProxyType(dict(sorted((i.name, i.source) for i in infos)))
        self.selected = types.MappingProxyType(
            {"profile": plan.profile, "optimizer": opt, "activation_checkpointing": ckpt,
             **{f"{axis}_rule": plan.rules[axis] for axis in AXES}})


def _arguments(argnames: tuple) -> Callable | None:
    """How to pick a hook implementation's arguments from ``(plan, placement, extra)``, where
    extra is the component's third hook argument (``model_states``, ``allocated``); ``None``
    for the usual ``(plan, placement)``."""
    if tuple(argnames) == _PLAN_PLACEMENT:
        return None
    index = tuple({"plan": 0, "placement": 1}.get(a, 2) for a in argnames)
    if len(index) >= 2:
        return operator.itemgetter(*index)        # a tuple, in C
    if len(index) == 1:
        return lambda values, i=index[0]: (values[i],)
    return lambda values: ()


def _takes_split(apply) -> bool:
    """Does a rule's apply take the optional third parameter (SplitSoFar)?"""
    import inspect
    try:
        parameters = list(inspect.signature(apply).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 3 or any(p.kind == p.VAR_POSITIONAL for p in parameters)


_LAST_SELECTION = (None, None, None)   # (plan, registry, its selection): repeated solves of one plan


def _selection(registry: Registry, plan: TrainingPlan) -> _Selection:
    global _LAST_SELECTION
    last = _LAST_SELECTION
    if last[0] is plan and last[1] is registry and FAST_PATHS:
        return last[2]
    rules = plan.rules
    key = (plan.profile, plan.include_plugins, plan.optimizer, plan.activation_checkpointing,
           rules["tp"], rules["cp"], rules["pp"], rules["ep"], rules["dp"])
    selection = registry.cache.get(key)
    if selection is None:
        selection = registry.cache[key] = _Selection(registry, plan)
    _LAST_SELECTION = (plan, registry, selection)
    return selection


def _place(selection: _Selection, plan: TrainingPlan, cell: list) -> tuple[Placement, list, list]:
    """Call every selected rule; combine their effects into the rank's placement.

    Rules are pure and their effects frozen: the same effect objects (built-in rules memoise
    them) and the same model counts give the same placement, so that is cached per
    selection. The cache holds the effects, so their ids are not reused while cached."""
    if selection.splits or not FAST_PATHS:
        return _place_in_order(selection, plan, cell)
    options = plan.options
    effects = []
    append = effects.append
    for source, apply, info, name in selection.rule_calls:
        cell[0] = source
        try:
            append(apply(plan, options.get(name) if options else None))
        except (InvalidInputError, PluginContractError):
            raise
        except Exception as err:
            raise _blame(info, ("sharding rule '{}' apply", name), "apply", err) from err
    model = plan.model
    counts = (model.parameters, model.layers, plan.trainable_fraction)
    key = (*map(id, effects), *counts)
    placements = selection.placements
    hit = placements.get(key)
    if hit is None:
        # New effects, but often new only in their buffers (the pipeline and context-parallel
        # rules' buffers grow with the micro-batch), and the placement depends on the shards.
        well_formed = all(type(effect) is ShardingEffect for effect in effects)   # else: _place_in_order says why
        shape = (*map(_effect_shape, effects), *counts) if well_formed else None
        shaped = selection.shaped.get(shape) if well_formed else None
        if shaped is None:
            placement, buffers, notes = _place_in_order(selection, plan, cell, effects)
            if len(selection.shaped) >= _CACHE_SIZE:
                selection.shaped.clear()
            selection.shaped[shape] = (placement, tuple(notes))     # (well formed: it did not raise)
        else:
            placement, notes = shaped
            buffers = []
            for (_, name, info, _, _), effect in zip(selection.rules, effects):
                if effect.buffer_terms:
                    buffers += _checked(info, list(effect.buffer_terms), COMMUNICATION_BUFFERS,
                                        ("sharding rule '{}' apply", name), "apply")
        if len(placements) >= _CACHE_SIZE:
            placements.clear()
        hit = placements[key] = (placement, tuple(buffers), tuple(notes), tuple(effects))
    return hit[0], hit[1], hit[2]     # the buffers as a tuple: never changed by the caller


# What of a rule's effect the placement depends on (everything but its buffers), read in C.
_effect_shape = operator.attrgetter("parameter_shards", "activation_shards", "weight_shards", "gradient_shards",
                                    "optimizer_state_shards", "layers_per_stage", "notes")


def _place_in_order(selection: _Selection, plan: TrainingPlan, cell: list,
                    effects=None) -> tuple[Placement, list, list]:
    """The rules in axis order, each seeing what the earlier ones did; ``effects``: what rules
    that do not read it already returned, in the same order."""
    shards = dict.fromkeys(_SHARD_FIELDS, 1)       # integer products: the rules' order never changes a number
    split_by = dict.fromkeys(_SHARD_FIELDS, ())    # the rules that split each quantity
    layers_per_stage = layers_rule = None
    buffer_terms, notes = [], []
    options = plan.options
    for index, (axis, name, info, apply, takes_split) in enumerate(selection.rules):   # tp, cp, pp, ep, then dp
        option = options.get(name) if options else None
        cell[0] = info.name
        try:
            if effects is not None:
                effect = effects[index]
            elif takes_split:
                effect = apply(plan, option, SplitSoFar(
                    **shards, parameters_per_rank=plan.model.parameters / shards["parameter_shards"],
                    layers_per_stage=layers_per_stage))
            else:
                effect = apply(plan, option)
        except (InvalidInputError, PluginContractError):
            raise
        except Exception as err:
            raise _blame(info, ("sharding rule '{}' apply", name), "apply", err) from err
        if type(effect) is not ShardingEffect:
            raise PluginContractError(
                f"{info.describe()} sharding rule '{name}' apply returned {type(effect).__name__}; "
                "expected ShardingEffect", plugin=info.name, source=info.source, hook="apply")
        for field in _SHARD_FIELDS:
            factor = getattr(effect, field)
            if factor != 1:
                shards[field] *= factor
                split_by[field] += (name,)
        if effect.layers_per_stage is not None:
            if layers_rule is not None:
                raise PluginContractError(
                    f"{info.describe()} sharding rule '{name}' sets layers_per_stage, which the "
                    f"'{layers_rule}' rule already set", plugin=info.name, source=info.source, hook="apply")
            layers_rule = name
            layers_per_stage = _checks.count(f"{name}.layers_per_stage", effect.layers_per_stage)
        if effect.buffer_terms:
            buffer_terms += _checked(info, list(effect.buffer_terms), COMMUNICATION_BUFFERS,
                                     ("sharding rule '{}' apply", name), "apply")
        if effect.notes:
            notes.append((axis, effect.notes))
    parameters_per_rank = plan.model.parameters / shards["parameter_shards"]
    placement = Placement(
        **shards, parameters_per_rank=parameters_per_rank,
        trainable_parameters_per_rank=parameters_per_rank * plan.trainable_fraction,
        layers_per_stage=layers_per_stage if layers_per_stage is not None else plan.model.layers,
        shard_sources=split_by)
    return placement, buffer_terms, notes


def _checked(info: PluginInfo, items: list, component: str, what, hook: str) -> list[MemoryTerm]:
    """``_stamp``, with the common case (every term right and already stamped) first."""
    name = info.name
    for term in items:
        if type(term) is not MemoryTerm or term.component != component or term.source != name:
            return _stamp(info, items, component, what, hook)
    return items


def _hook_terms(calls, component: str, plan: TrainingPlan, placement: Placement, extra, cell) -> list[MemoryTerm]:
    """The terms of one component's hook implementations, in plugin-name order."""
    if not calls:
        return []
    terms: list[MemoryTerm] = []     # a new list: a plugin's own list is never changed
    for info, function, pick, what, hook in calls:
        terms += _terms(info, what, hook, function,
                        (plan, placement) if pick is None else pick((plan, placement, extra)), component, cell)
    return terms


def _accelerator_sum(terms: list[MemoryTerm]):
    total = 0
    for term in terms:
        if term.tier is ACCELERATOR or term.tier == ACCELERATOR:
            total += term.nbytes
    return total


def _ordered(terms: list[MemoryTerm]) -> list[MemoryTerm]:
    if len(terms) > 1:
        terms.sort(key=_term_key)
    return terms


_term_key = operator.attrgetter("source", "label")     # (source, label), in C


_NOTE_ORDER = (DATA, "tp", "cp", "pp", "ep")
_PHASE_INDEX = {phase: i for i, phase in enumerate(PHASES)}
_COMPONENT_INDEX = {component: i for i, component in enumerate(COMPONENTS)}


def _alive(terms, alive=None) -> list[list]:
    """Accelerator bytes alive per phase and component (``[phase][component]``), added in
    term order; ``alive`` continues an earlier table (adding terms at the end of the list
    gives the same sums, bit for bit, as recounting them all)."""
    if alive is None:
        alive = [[0] * len(COMPONENTS) for _ in PHASES]
    phase_index, component_index = _PHASE_INDEX, _COMPONENT_INDEX
    for term in terms:
        if term.tier != ACCELERATOR:
            continue
        i, nbytes = component_index[term.component], term.nbytes
        for phase in term.phases:
            alive[phase_index[phase]][i] += nbytes
    return alive


_ALIVE: dict = {}   # the terms' ids -> (the terms, the alive table, its peak)


def _alive_reused(terms: tuple) -> tuple[list, tuple]:
    """``_alive(terms)`` (a new table) and its peak. The same term objects (the plugins
    memoise theirs; the cache holds them, so their ids are not reused while cached) give
    the same table, so it is kept and copied."""
    if not FAST_PATHS:
        alive = _alive(terms)
        return alive, _peak_of(alive), _host_sum(terms)
    key = tuple(map(id, terms))
    hit = _ALIVE.get(key)
    if hit is None:
        alive = _alive(terms)
        if len(_ALIVE) >= _CACHE_SIZE:
            _ALIVE.clear()
        hit = _ALIVE[key] = (terms, tuple(map(tuple, alive)), _peak_of(alive), _host_sum(terms))
    return list(map(list, hit[1])), hit[2], hit[3]


def _alive_entry(terms: tuple) -> tuple:
    """``(terms, alive table, its peak, host bytes)`` of ``terms``; the table is not to be
    changed. The same term objects (the plugins memoise theirs; the cache holds them, so
    their ids are not reused while cached) give the same entry, so it is kept."""
    if not FAST_PATHS:
        alive = _alive(terms)
        return terms, alive, _peak_of(alive), _host_sum(terms)
    key = tuple(map(id, terms))
    hit = _ALIVE.get(key)
    if hit is None:
        alive = _alive(terms)
        if len(_ALIVE) >= _CACHE_SIZE:
            _ALIVE.clear()
        hit = _ALIVE[key] = (terms, tuple(map(tuple, alive)), _peak_of(alive), _host_sum(terms))
    return hit


_CONTINUED: dict = {}   # (id of an _alive_entry, the later terms' ids) -> (entry, terms, peak, host)


def _continued(entry: tuple, terms) -> tuple:
    """The peak and host bytes of ``entry``'s terms followed by ``terms``, continuing its
    table and host sum (the same sums, bit for bit, as counting them all in order); kept
    for the same entry and term objects, as ``_alive_entry``."""
    if FAST_PATHS:
        key = (id(entry), *map(id, terms))
        hit = _CONTINUED.get(key)
        if hit is not None and hit[0] is entry:
            return hit[2], hit[3]
    peak, host = _peak_of(_alive(terms, list(map(list, entry[1])))), _host_sum(terms, entry[3])
    if FAST_PATHS:
        if len(_CONTINUED) >= _CACHE_SIZE:
            _CONTINUED.clear()
        _CONTINUED[key] = (entry, tuple(terms), peak, host)
    return peak, host


def _host_sum(terms, host=0):
    """Host-memory bytes, added in term order (continuing ``host``)."""
    for term in terms:
        if term.tier == HOST:     # (NVMe-tier terms are neither accelerator nor host memory)
            host += term.nbytes
    return host


def _peak_of(alive) -> tuple[str, tuple]:
    best, most = 0, sum(alive[0])
    for p in range(1, len(PHASES)):
        total = sum(alive[p])
        if total > most:      # the earliest phase on a tie
            best, most = p, total
    return PHASES[best], tuple(alive[best])


def _peak(terms) -> tuple[str, tuple]:
    """The phase with the most accelerator bytes alive (the earliest on a tie) and, for it,
    the bytes alive per component, in COMPONENTS order."""
    return _peak_of(_alive(terms))


def _run_pipeline(registry: Registry, plan: TrainingPlan, totals_only: bool = False) -> TrainingMemoryResult:
    """The whole pipeline for one plan. ``totals_only``: return just the accelerator total
    (bytes), not the result object (plan search: every plugin still runs)."""
    selection = _selection(registry, plan)
    if selection.missing:
        info = selection.profile_info
        raise PluginError(
            f"profile '{plan.profile}' ({info.source}) needs plugin(s) {', '.join(selection.missing)}, which "
            "are not loaded (blocked or uninstalled?); unblock them or choose another profile",
            plugin=info.name, source=info.source, hook="mlsysim_profiles")
    cell = [""]     # (_pipeline, inlined: one call less per solve)
    token = _source_cell.set(cell)
    try:
        return _run_steps(selection, plan, totals_only, cell)
    finally:
        _source_cell.reset(token)


def _collect(calls, component: str, plan: TrainingPlan, placement: Placement, extra, cell):
    """The terms of one component's hook implementations, in call order: the plugin's own
    list when one plugin takes part (never changed here), else a new list."""
    if len(calls) == 1:
        info, function, pick, what, hook = calls[0]
        return _terms(info, what, hook, function,
                      (plan, placement) if pick is None else pick((plan, placement, extra)), component, cell)
    return _hook_terms(calls, component, plan, placement, extra, cell)


_SORTED: dict = {}   # the terms' ids -> (the terms, them in (source, label) order)


def _sorted(terms):
    """``terms`` in (source, label) order (a stable sort; the list given is not changed).
    The same term objects (plugins memoise theirs; the cache holds them, so their ids are
    not reused while cached) give the same order, so it is kept."""
    if len(terms) < 2:
        return terms
    if not FAST_PATHS:
        return sorted(terms, key=_term_key)
    key = tuple(map(id, terms))
    hit = _SORTED.get(key)
    if hit is None:
        if len(_SORTED) >= _CACHE_SIZE:
            _SORTED.clear()
        hit = _SORTED[key] = (tuple(terms), tuple(sorted(terms, key=_term_key)))
    return hit[1]


def _pipeline(selection: _Selection, plan: TrainingPlan, totals_only: bool = False) -> TrainingMemoryResult:
    """Steps 3-5 for one plan. Each plugin call names its plugin in this run's provenance
    cell (``terms._source_cell``), set once here and restored at the end."""
    cell = [""]
    token = _source_cell.set(cell)
    try:
        return _run_steps(selection, plan, totals_only, cell)
    finally:
        _source_cell.reset(token)


def _run_steps(selection: _Selection, plan: TrainingPlan, totals_only: bool, cell: list) -> TrainingMemoryResult:
    placement, comm, notes = _place(selection, plan, cell)
    if plan.rank is not None:     # measured grade, parallel layouts: this rank class's own counts
        placement = plan.rank.place(plan, placement)
    calls = selection.calls
    options = plan.options

    # Term lists below may be a plugin's own list: they are never changed, only replaced.
    both = (plan, placement)
    hooks = calls[WEIGHTS]
    if len(hooks) == 1:
        info, function, pick, what, hook = hooks[0]
        weights = _terms(info, what, hook, function, both if pick is None else pick((plan, placement, None)), WEIGHTS,
                         cell)
    else:
        weights = _hook_terms(hooks, WEIGHTS, plan, placement, None, cell)
    if len(weights) > 1:
        weights = _sorted(weights)
    hooks = calls[GRADIENTS]
    if len(hooks) == 1:
        info, function, pick, what, hook = hooks[0]
        gradients = _terms(info, what, hook, function, both if pick is None else pick((plan, placement, None)),
                           GRADIENTS, cell)
    else:
        gradients = _hook_terms(hooks, GRADIENTS, plan, placement, None, cell)
    if len(gradients) > 1:
        gradients = _sorted(gradients)
    info, function, what, hook = selection.optimizer
    optimizer_state = _terms(info, what, hook, function,
                             (plan, placement, options.get(plan.optimizer) if options else None), OPTIMIZER_STATE,
                             cell)
    if calls[OPTIMIZER_STATE]:
        optimizer_state = optimizer_state + _hook_terms(calls[OPTIMIZER_STATE], OPTIMIZER_STATE, plan, placement,
                                                        None, cell)
    if len(optimizer_state) > 1:
        optimizer_state = _sorted(optimizer_state)
    ckpt = plan.activation_checkpointing
    info, function, what, hook = selection.checkpointing
    activations = _terms(info, what, hook, function, (plan, placement, options.get(ckpt) if options else None),
                         ACTIVATIONS, cell)
    if calls[ACTIVATIONS]:
        activations = activations + _hook_terms(calls[ACTIVATIONS], ACTIVATIONS, plan, placement, None, cell)
    if len(activations) > 1:
        activations = _sorted(activations)
    if plan.offload:    # measured grade: what lives in host memory or on NVMe instead
        from .measured.parallel import offload_terms
        weights, gradients, optimizer_state = offload_terms(plan, weights, gradients, optimizer_state)

    # Accelerator bytes per component and host bytes, each added in term order (host bytes
    # in the order of the terms tuple below: weights, gradients, ..., runtime overheads).
    accelerator = ACCELERATOR
    host = w = g = o = a = c = 0
    for term in weights:
        tier = term.tier
        if tier is accelerator or tier == accelerator:
            w += term.nbytes
        elif tier == HOST:
            host += term.nbytes
    for term in gradients:
        tier = term.tier
        if tier is accelerator or tier == accelerator:
            g += term.nbytes
        elif tier == HOST:
            host += term.nbytes
    for term in optimizer_state:
        tier = term.tier
        if tier is accelerator or tier == accelerator:
            o += term.nbytes
        elif tier == HOST:
            host += term.nbytes
    hooks = calls[COMMUNICATION_BUFFERS]
    if hooks:
        model_states = {WEIGHTS: w, GRADIENTS: g, OPTIMIZER_STATE: o}
        if len(hooks) == 1:
            info, function, pick, what, hook = hooks[0]
            hooked = _terms(info, what, hook, function,
                            both if pick is None else pick((plan, placement, model_states)), COMMUNICATION_BUFFERS,
                            cell)
        else:
            hooked = _hook_terms(hooks, COMMUNICATION_BUFFERS, plan, placement, model_states, cell)
        if hooked:
            comm = (*comm, *hooked) if comm else hooked
    if len(comm) > 1:
        comm = _sorted(comm)
    terms = (*weights, *gradients, *optimizer_state, *activations, *comm)
    peak_phase = alive = None
    r = 0
    if selection.combine_peak:   # the largest phase, and what is alive in it (and the host bytes)
        alive = _alive_entry(terms)
        peak_phase, (w, g, o, a, c, r) = alive[2]
        host = alive[3]
    else:
        for term in activations:
            tier = term.tier
            if tier is accelerator or tier == accelerator:
                a += term.nbytes
            elif tier == HOST:
                host += term.nbytes
        for term in comm:
            tier = term.tier
            if tier is accelerator or tier == accelerator:
                c += term.nbytes
            elif tier == HOST:
                host += term.nbytes
    if calls[RUNTIME_OVERHEADS]:
        runtime = _collect(calls[RUNTIME_OVERHEADS], RUNTIME_OVERHEADS, plan, placement, w + g + o + a + c + r,
                           cell)
        if len(runtime) > 1:
            runtime = _sorted(runtime)
        if runtime:
            terms = (*terms, *runtime)
            if selection.combine_peak:
                (peak_phase, (w, g, o, a, c, r)), host = _continued(alive, runtime)
            else:
                host = _host_sum(runtime, host)
                r = _accelerator_sum(runtime)
    # 5. combine: the reference adds the five components left to right, in float64.
    total = w + g + o + a + c
    if r:
        total += r
    if totals_only:
        return total
    capacity = plan.hardware.memory_capacity
    # Feasibility and utilisation are computed in GB, exactly as the reference does.
    total_gb, available_gb = total * 1e-9, capacity * 1e-9
    if not notes:
        rule_notes = ()
    elif len(notes) == 1:
        rule_notes = notes[0][1]
    else:
        rule_notes = tuple(n for axis in _NOTE_ORDER for note_axis, axis_notes in notes
                           if note_axis == axis for n in axis_notes)
    if plan.warnings:
        rule_notes = (*plan.warnings, *rule_notes)
    cp = plan.cp_size
    regime = plan.regime
    # TrainingMemoryResult(...), every field positionally, in its order.
    return _new_result(
        total_gb <= available_gb, total, capacity, total_gb / available_gb, w, g, o, a, c,
        plan.precision, plan.optimizer, ckpt,
        {"dp": plan.dp_size, "tp": plan.tp_size, "pp": plan.pp_size, "ep": plan.ep_size, "cp": cp}
        if cp != 1 else {"dp": plan.dp_size, "tp": plan.tp_size, "pp": plan.pp_size, "ep": plan.ep_size},
        _catalog_notes(plan) + rule_notes, plan.profile, terms, host, plan.model.name, plan.hardware.name, plan.microbatch,
        placement.layers_per_stage, plan.sequence_parallel, selection.selected, peak_phase,
        selection.plugin_sources, r, regime.name if regime is not None else None, (), None)
