"""Parallel layouts, rank by rank (measured grade).

A parallel layout's ranks are not alike: the first pipeline stage holds the embedding and
the most micro-batches in flight, the last one the LM head and the loss. This module
checks the layout options, names the distinct rank classes and solves each one.

The split itself is the selected rules' (``Placement``: ``tensor_shards``, ``sequence_shards``,
``expert_shards``, ``pipeline_stages``, the activation and state shard factors): a rank class
selects a stage of that placement and adds what is in flight; nothing here recounts the
split from ``plan.tp_size`` and friends. What still reads the layout's sizes reads the
devices themselves (how many ranks a class has, which collectives exist at all, how the
expert ranks are carved out of a stage's devices), each saying so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import attrs

from mlsysim_core.memo import memoize

from mlsysim_core import _checks
from mlsysim_core.plan import Placement
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, LayoutError
from mlsysim_core.terms import BACKWARD_END, GRADIENTS, OPTIMIZER_STEP, MemoryTerm
from .._evolve import evolve
from .._lazy import lazy_module
from ._cache import evolved as _evolved, kinds, layout_of, per_layout
from .families import family_of
from .layers import EXPERTS, REPLICATED, Part
from .schedules import SCHEDULES
from .shapes import ModelShape, shape_of

# model.py imports this module: reached through a stand-in that becomes the module on first use
# (module-level, not in the functions: an import statement in a function costs on every solve).
_model = lazy_module(globals(), "_model", "mlsysim_plugins.measured.model")

OFFLOADABLE = ("optimizer", "gradients", "parameters")
OFFLOAD_TARGETS = ("cpu", "nvme")


def layout_options(plan, schedules=None):
    """The plan with the parallel-layout options of a measured-grade solve checked and with
    defaults; ``pipeline_schedule`` becomes the registered ``PipelineSchedule``."""
    schedules = schedules or SCHEDULES
    o = plan.profile_options
    pipeline_schedule, virtual_stages, expert_tp_size, stage_layers, offload = (
        o.pipeline_schedule, o.virtual_stages, o.expert_tp_size, o.stage_layers, o.offload)
    schedule = schedules[_checks.name("pipeline_schedule", "1f1b" if pipeline_schedule is None else pipeline_schedule,
                                      schedules)]
    v = 1 if virtual_stages is None else _checks.count("virtual_stages", virtual_stages)
    if v > 1 and not schedule.chunked:
        chunked = ", ".join(repr(name) for name, s in schedules.items() if s.chunked)
        raise InvalidInputError("virtual_stages", virtual_stages, f"1 unless pipeline_schedule is {chunked}",
                                f"pipeline_schedule={schedule.name!r}")
    if virtual_stages is None:
        v = schedule.virtual_stages
    heads = plan.model.heads
    if heads and plan.tp_size > 1:
        _check_tp_heads(plan.tp_size, heads, plan.model.kv_heads or heads)
    if plan.model.is_sparse and plan.model.experts % plan.ep_size:
        raise LayoutError("ep_size", plan.ep_size, f"a divisor of the model's {plan.model.experts} experts",
                          "expert parallelism places the same number of experts on every rank")
    # (The layout checks below are about the devices: tp must divide the heads and ep the experts
    # for the layout the user asked for, and expert_tp x ep ranks are carved out of the tp x cp x dp
    # devices of a stage; what the rules split is priced from their placement.)
    etp = plan.tp_size if expert_tp_size is None else _checks.count("expert_tp_size", expert_tp_size)
    if expert_tp_size is not None and not plan.model.is_sparse:      # never silently ignored
        raise LayoutError("expert_tp_size", expert_tp_size, "None for a dense model",
                          f"{plan.model.name!r} has no experts")
    if plan.model.is_sparse:
        group = plan.tp_size * plan.dp_size * plan.cp_size
        if group % (etp * plan.ep_size):
            _expert_layout_error(plan, expert_tp_size, etp, group)
    layers = None
    if stage_layers is not None:
        if isinstance(stage_layers, (str, bytes)) or not hasattr(stage_layers, "__iter__"):
            raise InvalidInputTypeError("stage_layers", stage_layers, "a sequence of layer counts, one per stage")
        layers = tuple(_checks.count(f"stage_layers[{i}]", n, minimum=0) for i, n in enumerate(stage_layers))
        if 0 in layers:
            raise LayoutError("stage_layers", list(layers), "at least 1 layer on every pipeline stage",
                              f"stage {layers.index(0)} (0-based) has none: a stage without layers is not a "
                              f"pipeline stage (use a smaller pp_size)")
        if len(layers) != plan.pp_size or sum(layers) != plan.model.layers:
            raise LayoutError("stage_layers", list(layers),
                              f"{plan.pp_size} counts (one per pipeline stage) adding up to the model's "
                              f"{plan.model.layers} layers")
    elif plan.model.layers < plan.pp_size * v:
        layers, p = plan.model.layers, plan.pp_size
        if layers < p:
            raise LayoutError("pp_size", p, f"at most the model's {layers} layers",
                              "every pipeline stage needs at least one layer")
        if virtual_stages is not None:
            raise LayoutError("virtual_stages", virtual_stages,
                              f"at most {layers // p} model chunks per stage (the model's {layers} layers "
                              f"/ pp_size={p})", "every chunk needs at least one layer")
        raise LayoutError("pp_size", p, f"at most {layers // v} stages with {schedule.name}'s default "
                          f"{v} model chunks per stage, or set virtual_stages",
                          f"{layers} layers in {p} x {v} chunks")
    return _evolved(plan, profile_options=_laid_out(o, kinds(o), schedule, v, None if expert_tp_size is None else etp,
                                                  layers, _offload(offload)))


@memoize
def _laid_out(o, o_kinds: tuple, pipeline_schedule, virtual_stages: int, expert_tp_size, stage_layers, offload):
    """The options with the layout's (one object for the same values, whatever the batch: the
    per-layout memos compare them by identity)."""
    return evolve(o, pipeline_schedule=pipeline_schedule, virtual_stages=virtual_stages,
                  expert_tp_size=expert_tp_size, stage_layers=stage_layers, offload=offload)


def _tp_fits(t: int, heads: int, kv_heads: int) -> bool:
    return heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)


def _check_tp_heads(tp: int, heads: int, kv_heads: int) -> None:
    """tp divides the attention heads, and the key/value heads split evenly over the tp ranks
    or (tp > kv_heads) are replicated a whole number of times, as Megatron and vLLM do."""
    if _tp_fits(tp, heads, kv_heads):
        return
    fits = ", ".join(str(t) for t in range(1, heads + 1) if _tp_fits(t, heads, kv_heads))
    if heads % tp:
        why = "tensor parallelism splits the heads evenly over tp ranks"
    else:
        why = (f"the {kv_heads} key/value heads neither split evenly over {tp} ranks nor replicate a whole "
               f"number of times (tp must divide them, or be a multiple of them)")
    kv = (f" that divides its {kv_heads} key/value heads or is a multiple of them" if kv_heads != heads else "")
    raise LayoutError("tp_size", tp, f"a divisor of the model's {heads} attention heads{kv}: {fits}", why)


def _expert_layout_error(plan, expert_tp_size, etp: int, group: int):
    """expert_tp x ep must divide tp x cp x dp: blame what the user set (ep_size alone, or
    expert_tp_size when given), with the values that would fit."""
    ep, experts = plan.ep_size, plan.model.experts
    why = ("the experts' ranks are carved out of the same tp x cp x dp devices "
           f"(tp={plan.tp_size}, cp={plan.cp_size}, dp={plan.dp_size})")
    if expert_tp_size is None or group % ep:
        fits = [e for e in range(1, group // etp + 1) if (group // etp) % e == 0 and experts % e == 0]
        raise LayoutError("ep_size", ep,
                          f"a divisor of tp x cp x dp / expert_tp_size = {group} / {etp} that divides the "
                          f"{experts} experts: {', '.join(map(str, fits))}; or a dp_size that makes room "
                          f"for them (e.g. dp_size={_dp_for(plan, ep, etp)})", why)
    fits = [t for t in range(1, group // ep + 1) if (group // ep) % t == 0]
    raise LayoutError("expert_tp_size", expert_tp_size,
                      f"a divisor of tp x cp x dp / ep_size = {group} / {ep}: {', '.join(map(str, fits))}", why)


def _dp_for(plan, ep: int, etp: int) -> int:
    """The smallest dp_size that makes room for ep x expert_tp ranks."""
    step = ep * etp // math.gcd(ep * etp, plan.tp_size * plan.cp_size)
    return -(-plan.dp_size // step) * step


def _offload_values() -> tuple[str, ...]:
    """Every string ``offload`` takes, as listed in its errors (its names in any order): the
    optimizer with any of the other names (`_offload`: nothing leaves without the optimizer
    step), and torchao's forms (cpu_offload.py)."""
    import itertools
    from .cpu_offload import TORCHAO_FORMS
    others = OFFLOADABLE[1:]
    return tuple("+".join((OFFLOADABLE[0], *combo)) for k in range(len(others) + 1)
                 for combo in itertools.combinations(others, k)) + TORCHAO_FORMS


OFFLOAD_VALUES = _offload_values()
_OFFLOAD_FORMS = (", ".join(map(repr, OFFLOAD_VALUES)) + " (names in any order; each but torchao's may name its "
                  f"tier: name={' or name='.join(OFFLOAD_TARGETS)}, e.g. 'optimizer=nvme+gradients'), a list of "
                  f"names, {{name: {'|'.join(map(repr, OFFLOAD_TARGETS))}}}, or None for none")


def check_option_values(pipeline_schedule, virtual_stages, offload, schedules=None) -> None:
    """The layout options' own values (names, counts, offload targets), before anything
    about the model is asked: a bad value is an error even where the profile then finds it
    cannot describe the run."""
    if pipeline_schedule is not None:
        _checks.name("pipeline_schedule", pipeline_schedule, schedules or SCHEDULES)
    if virtual_stages is not None:
        _checks.count("virtual_stages", virtual_stages)
    _offload(offload)


def _offload(value) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    given = value
    if isinstance(value, str):
        value = [part.strip() for part in value.split("+")]
        if not all(value):      # "optimizer++gradients", "optimizer+", "+optimizer", ""
            raise InvalidInputError("offload", given, f"{_OFFLOAD_FORMS}: names joined by single '+'",
                                    "an empty name between '+' signs" if len(value) > 1 else "an empty name")
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif hasattr(value, "__iter__") and not isinstance(value, (bytes, bytearray, set, frozenset)):
        pairs = [(name, "cpu") for name in value]
        if not pairs:    # "" or []: not "no offload" (that is None), a mistake
            raise InvalidInputError("offload", given, f"{_OFFLOAD_FORMS} (at least one name)")
    else:
        raise InvalidInputTypeError("offload", given, _OFFLOAD_FORMS, f"got {type(given).__name__}")
    out = {}
    for name, target in pairs:
        try:
            what = _checks.name("offload", name, OFFLOADABLE)
        except InvalidInputError as err:     # the values offload= takes, not only its names
            raise InvalidInputError("offload", given, _OFFLOAD_FORMS,
                                    f"{name!r} is not one of {', '.join(OFFLOADABLE)}"
                                    + (f"; {err.detail}" if err.detail else "")) from err
        where = _checks.name(f"offload.{what}", target, OFFLOAD_TARGETS)
        if what in out:         # twice (to one target or two): a mistake, never the last one silently
            raise InvalidInputError("offload", given, f"{_OFFLOAD_FORMS}, each name once",
                                    f"{what!r} is named twice" + (f" (to {out[what]!r} and {where!r})"
                                                                  if out[what] != where else ""))
        out[what] = where
    # What runs move: the optimizer step runs where its state lives, and gradients and
    # parameters leave the accelerator only with it (DeepSpeed's ZeRO-Offload/Infinity:
    # offload_optimizer, with offload_param; FSDP's CPUOffload steps the optimizer on the
    # host). Gradients alone would leave the step on the accelerator reading them back.
    if out and "optimizer" not in out:      # ({} means nothing offloaded)
        raise InvalidInputError("offload", given, _OFFLOAD_FORMS,
                                "gradients and parameters go to host memory only with the optimizer step")
    return tuple(sorted(out.items(), key=lambda kv: OFFLOADABLE.index(kv[0])))


# --- rank classes -------------------------------------------------------------------------

@attrs.frozen(cache_hash=True)     # (memo keys hash it: once per object)
class RankClass:
    """One kind of rank of a parallel layout: a pipeline stage (or the stages that are
    alike) with every tensor-, context-, expert- and data-parallel rank inside it.

    ``in_flight`` is how many micro-batches of activations the stage holds at its peak
    (1F1B: ``min(p - stage, m)``), in units of the stage's whole layer stack (interleaved
    schedules hold fractions of it); ``first``/``last``: the stage has the embedding /
    the final norm, LM head and loss.
    """

    name: str
    stage: int
    stages: tuple[int, ...]
    layers: int
    in_flight: float
    first: bool
    last: bool
    ranks: int                     # devices in this class

    def place(self, plan, placement):
        """This rank's own placement, a stage of the rules' one: its parameters (by group) and
        layers. The rules' shard factors stay as they are (integers); on a mixture-of-experts
        rank the experts' states shard over their own data-parallel group, so the divisor of
        the rank's parameters is a weighted one (``RankPlacement``, read with ``divisor``)."""
        return _rank_placement(self, layout_of(plan), placement)


@memoize
def _rank_placement(rank: RankClass, layout, placement):
    """``RankClass.place``, kept per layout (a rank's parameters do not depend on the batch)."""
    plan = layout.plan
    groups = rank_parameters(plan, rank, placement)
    dense, experts = groups["dense"], groups["experts"]
    total = dense + experts
    if not experts:
        trainable = total * plan.trainable_fraction
        if plan.profile_options.lora is not None and (placement.pipeline_stages > 1 or placement.tensor_shards > 1):
            from .lora import stage_trainable      # a stage's own adapters (the frozen embedding and head train none)
            trainable = stage_trainable(plan, rank.layers, placement.tensor_shards)
        return attrs.evolve(placement, parameters_per_rank=total, trainable_parameters_per_rank=trainable,
                            layers_per_stage=rank.layers)
    edp = expert_data_parallel(plan, placement)
    # A rule sharding over the whole data-parallel group of a stage (the dp x cp ranks the
    # ZeRO/FSDP collectives span: the layout's devices) shards the experts over the whole
    # expert-data-parallel group; a smaller group (HSDP) at most over that.
    whole = plan.dp_size * plan.cp_size

    def effective(factor):
        if factor == 1:
            return factor
        expert_factor = edp if factor == whole else min(factor, edp)
        return total / (dense / factor + experts / expert_factor)

    return RankPlacement(
        **{f.name: getattr(placement, f.name) for f in attrs.fields(type(placement))
           if f.name in _PLACEMENT_FIELDS},
        parameters_per_rank=total, trainable_parameters_per_rank=total * plan.trainable_fraction,
        layers_per_stage=rank.layers, weight_divisor=effective(placement.weight_shards),
        gradient_divisor=effective(placement.gradient_shards),
        optimizer_state_divisor=effective(placement.optimizer_state_shards))


@attrs.frozen(kw_only=True, cache_hash=True)
class RankPlacement(Placement):
    """A mixture-of-experts rank's placement: the rules' (integer) factors unchanged, and what
    the rank's parameters divide by, dense and expert groups weighted
    (``dense + experts`` over ``dense / factor + experts / expert_factor``)."""

    weight_divisor: float
    gradient_divisor: float
    optimizer_state_divisor: float


_PLACEMENT_FIELDS = frozenset(f.name for f in attrs.fields(Placement)) - {
    "parameters_per_rank", "trainable_parameters_per_rank", "layers_per_stage"}


def weight_divisor(placement):
    """What this rank's parameters divide by for its weight bytes: the rules' ``weight_shards``,
    or on a mixture-of-experts rank the weighted divisor (``RankPlacement``)."""
    return placement.weight_divisor if type(placement) is RankPlacement else placement.weight_shards


def gradient_divisor(placement):
    """As ``weight_divisor``, for the gradients."""
    return placement.gradient_divisor if type(placement) is RankPlacement else placement.gradient_shards


def optimizer_state_divisor(placement):
    """As ``weight_divisor``, for the optimizer state."""
    return placement.optimizer_state_divisor if type(placement) is RankPlacement else placement.optimizer_state_shards


def expert_tensor_shards(plan, placement) -> int:
    """Ranks each expert's matrices are split over: ``expert_tp_size`` as given, else what the
    rules split every matrix over (``placement.tensor_shards``)."""
    return plan.profile_options.expert_tp_size or placement.tensor_shards


def residual_shards(placement):
    """The tensor-parallel ranks' split of the residual stream (sequence parallelism): the
    rules' activation split beyond the sequence split (1 without sequence parallelism)."""
    a, c = placement.activation_shards, placement.sequence_shards
    return a // c if a % c == 0 else a / c


def expert_data_parallel(plan, placement) -> int:
    """Ranks that hold the same experts: the tp x cp x dp devices of a stage (the layout's) over
    the ranks the rules split an expert over (expert_tp x ep)."""
    return max(1, plan.tp_size * plan.cp_size * plan.dp_size
               // (expert_tensor_shards(plan, placement) * placement.expert_shards))


def stage_layer_counts(plan, stages: int) -> tuple[int, ...]:
    """Decoder layers on each of the rules' ``stages`` pipeline stages: ``stage_layers`` as
    given, else an even split whose remainder goes to the middle stages (then the last): the
    first stage already holds the embedding and the most micro-batches in flight."""
    given = plan.profile_options.stage_layers
    if given is not None:
        if len(given) != stages:
            raise LayoutError("stage_layers", list(given), f"{stages} counts, one per pipeline stage of the "
                              f"selected pipeline rule '{plan.rules.get('pp', 'pp')}'")
        return given
    p, L = stages, plan.model.layers
    counts = [L // p] * p
    order = list(range(1, p - 1)) + [p - 1, 0] if p > 2 else list(range(p - 1, -1, -1))
    for i in order[:L % p]:
        counts[i] += 1
    return tuple(counts)


def in_flight(schedule, p: int, stage: int, m: int, v: int = 1) -> float:
    """Micro-batches whose activations stage ``stage`` (0-based) of ``p`` holds at its peak
    (``schedule``: a ``PipelineSchedule``, or a built-in one's name)."""
    if p == 1:
        return 1
    if isinstance(schedule, str):
        schedule = SCHEDULES[schedule]
    return schedule.in_flight(p, stage, m, v)


def rank_classes(plan, placement) -> tuple[RankClass, ...]:
    """The distinct ranks of the layout: the first stage, the heaviest middle stages (those
    no other middle stage dominates in both layers and micro-batches in flight) and the last
    stage of the rules' placement (``placement.pipeline_stages``). Every tp x cp x dp rank
    inside a stage is alike (experts split evenly)."""
    return _rank_classes(layout_of(plan), plan.gradient_accumulation_steps, placement)


@memoize
def _rank_classes(layout, m: int, placement) -> tuple[RankClass, ...]:
    """``rank_classes``, kept per layout and number of micro-batches ``m`` (what the stages hold)."""
    plan = layout.plan
    p, v = placement.pipeline_stages, plan.profile_options.virtual_stages
    counts = stage_layer_counts(plan, p)
    width = plan.tp_size * plan.cp_size * plan.dp_size       # (the devices of one stage: RankClass.ranks)
    flight = [in_flight(plan.profile_options.pipeline_schedule, p, i, m, v) for i in range(p)]
    if p == 1:
        return (RankClass(name="every rank", stage=0, stages=(0,), layers=counts[0], in_flight=1, first=True,
                          last=True, ranks=width),)
    classes = [RankClass(name="first stage", stage=0, stages=(0,), layers=counts[0], in_flight=flight[0],
                         first=True, last=False, ranks=width)]
    middle = list(range(1, p - 1))
    if middle:
        keep = [i for i in middle if not any((counts[j], flight[j]) != (counts[i], flight[i]) and counts[j] >= counts[i]
                                             and flight[j] >= flight[i] for j in middle)]
        # Middle stages alike in (layers, in flight) are one class; report the first of each.
        seen = {}
        for i in keep:
            seen.setdefault((counts[i], flight[i]), i)
        for (layers, flying), i in sorted(seen.items(), key=lambda kv: kv[1]):
            alike = tuple(j for j in middle if (counts[j], flight[j]) == (layers, flying))
            dominated = tuple(j for j in middle if j not in keep)
            stages = alike + (dominated if i == keep[0] else ())
            label = f"middle stage {i}" if len(stages) == 1 else f"middle stages (heaviest: stage {i})"
            classes.append(RankClass(name=label, stage=i, stages=tuple(sorted(stages)), layers=layers,
                                     in_flight=flying, first=False, last=False, ranks=width * len(stages)))
    classes.append(RankClass(name="last stage", stage=p - 1, stages=(p - 1,), layers=counts[-1],
                             in_flight=flight[-1], first=False, last=True, ranks=width))
    return tuple(classes)


# --- parameters of one rank --------------------------------------------------------------

def rank_parameters(plan, rank: RankClass, placement) -> dict:
    """``{"dense": ..., "experts": ...}``: the parameters one rank of this class holds
    before data-parallel sharding, as the rules split them (see ``_rank_parameters``;
    cached, do not modify)."""
    return _rank_parameters(plan.model, family_of(plan), placement.tensor_shards, placement.expert_shards,
                            expert_tensor_shards(plan, placement), rank.layers, rank.first, rank.last)


@memoize
def _rank_parameters(model, family, t, e, etp, layers, first, last) -> dict:
    """Parameters one rank holds before data-parallel sharding, by group: ``dense``
    (attention / tp, dense MLP / tp, norms and router replicated, the vocabulary-parallel
    embedding and LM head / tp on the first and last stage) and ``experts`` (the routed
    experts of the stage / (ep x expert_tp)), for ``model`` built as ``family`` builds it."""
    shape = ModelShape.of(model, family)
    h = shape.hidden
    per_layer_dense, per_layer_experts = _layer_matrices_on_rank(shape, t, e, etp)
    norms = shape.layer_norm_parameters
    biases = [w for w in shape.layer_weights() if w.bias]
    if biases:
        # The linears' biases: the column-parallel ones' / tp, the row-parallel ones' whole
        # (added as all / tp + the replicated ones - their / tp share: the order the numbers
        # were first computed in, so that they agree to the last bit).
        replicated = sum(w.elements for w in biases if w.split == REPLICATED)
        per_layer_dense += sum(w.elements for w in biases) / t + replicated
        per_layer_dense -= replicated / t
    per_layer_dense += norms
    # What the shapes do not name (e.g. shared experts, extra biases): spread like the layers.
    named = shape.embedding_parameters * (1 if shape.tied else 2) + shape.layers * (
        sum(n for _, n in shape.layer_matrices()) + norms) + h + shape.learned_positions * h
    other = max(0, shape.parameters - named) / shape.layers / t
    dense = layers * (per_layer_dense + other)
    experts = layers * per_layer_experts
    if first:
        dense += shape.embedding_parameters / t + shape.learned_positions * h
    if last:
        dense += h * shape.family.norm.parameters                # final norm
        if not shape.tied or not first:                         # untied head, or a tied copy on the last stage
            dense += shape.embedding_parameters / t
    return {"dense": dense, "experts": experts}


# --- solving every rank class --------------------------------------------------------------

def is_parallel(plan) -> bool:
    """Does this measured-grade solve describe a parallel layout (rank classes, NCCL
    communicators)? Every axis counts, context parallelism too. (The layout's device
    counts, not the rules' split: ranks that replicate everything still communicate.)"""
    return plan.tp_size * plan.cp_size * plan.pp_size * plan.dp_size * plan.ep_size > 1


# --- activations and gradients of one rank ------------------------------------------------

def rank_layer_saved(plan, ctx, lb, selective: bool):
    """One layer's saved bytes on one rank, and the micro-batches in flight: each part as its
    ``split`` says (Korthikanti et al. 2022, Table 2): inside the tensor-parallel region / tp,
    replicated (the norms, the column-parallel linears' inputs, what follows the row-parallel
    ones) / tp only with sequence parallelism, expert activations / expert_tp; everything
    / cp (the sequence split). ``selective`` drops the parts ``recomputed_by_selective``."""
    t, c, r, etp = ctx.tensor, ctx.sequence, ctx.residual, ctx.expert_tensor
    sp = r != 1
    gathers = sp and not _model.megatron(plan.profile_options.regime)
    if sp and not gathers:
        # Megatron-Core's MoE layer routes the rank's sequence shard (T / tp tokens); its dispatcher all-gathers
        # them only over the expert-tensor-parallel group, whose ranks each hold 1 / etp of an expert: T x k / tp
        # copies a rank with etp = 1 (token_dispatcher.py; validation/megatron_gpt_oss/measure_tp.py), the
        # experts' share / etp = / tp with etp = tp (the default)
        etp = r
    global _last_saved
    # Kept for the last layer asked for, on everything read below (the ranks of a layout share the memoised layer).
    key = (lb, selective, t, c, r, etp) + ((plan.profile_options.regime.compute, ctx.tokens, ctx.shape.hidden)
                                           if gathers else ())
    if _last_saved[0] is lb and _last_saved[1] == key:
        return (*_last_saved[2], plan.rank.in_flight)
    total = 0.0
    if gathers:
        # PyTorch's sequence parallelism (DTensor, torchtitan's plan) keeps the all-gathered
        # inputs of attention and of the MLP for the weight gradients: 2 x T x h replicated.
        gathered = 2 * plan.profile_options.regime.compute * ctx.tokens * ctx.shape.hidden
        total += gathered
        lb = attrs.evolve(lb, parts=lb.parts + (Part("gathered inputs", -gathered),))
    for part in lb.parts:
        if selective and part.recomputed_by_selective:
            continue
        if part.split == EXPERTS:
            total += part.nbytes / etp
        elif part.split == REPLICATED:
            total += part.nbytes / r
        else:
            total += part.nbytes / t
    if lb.output_saved_by_next:
        total += lb.output / r
    total /= c
    how = []
    if t > 1:
        how.append(f"tp={t} splits " + ("everything (sequence parallel)" if sp else
                                        "the parallel region; norms and residual stream replicated"))
    if c > 1:
        how.append(f"/ cp={c}")
    _last_saved = (key[0], key, (total, " [" + "; ".join(how) + "]" if how else ""))
    return (*_last_saved[2], plan.rank.in_flight)


_last_saved: tuple = (None, None, None)    # (a LayerBytes, rank_layer_saved's key, its total and text)


@per_layout
def rank_gradient_terms(plan, placement):
    """Gradients of one rank's trainable parameters. With more than one micro-batch per
    iteration (accumulation, or a pipeline's m micro-batches) they are accumulated, so
    they are alive in every phase; with one, they are born in the backward."""
    if plan.profile_options.lora is not None:      # the stage's adapters (lora.py)
        from .lora import gradient_terms
        return gradient_terms(plan, placement)
    regime = plan.profile_options.regime
    b = regime.gradient
    if not b:
        return []      # accumulated straight into an fp32 main-grad buffer (optimizer state)
    params = placement.trainable_parameters_per_rank / gradient_divisor(placement)
    accumulating = plan.gradient_accumulation_steps > 1
    phases = _model.ALL if accumulating else (BACKWARD_END, OPTIMIZER_STEP)
    terms = [MemoryTerm(component=GRADIENTS, label=f"gradients ({regime.name}, {b} B)", nbytes=params * b,
                        phases=phases, formula=f"{params:,.0f} trainable params/rank x {b} B"
                        + (" (accumulated over micro-batches: alive throughout)" if accumulating else ""))]
    t = placement.tensor_shards
    if plan.rank.first and t > 1 and not _model.megatron(regime) and placement.gradient_shards == 1:
        # DTensor's row-sharded embedding receives its gradient as a full V x h tensor, and
        # it stays that way in .grad: every rank holds the whole embedding gradient.
        extra = shape_of(plan).embedding_parameters * (1 - 1 / t)
        terms.append(MemoryTerm(component=GRADIENTS, label="embedding gradient, replicated on every tp rank",
                                nbytes=extra * b, phases=phases,
                                formula=f"V x h x (1 - 1/tp={t}) = {extra:,.0f} x {b} B (PyTorch tensor "
                                        "parallelism: the row-sharded embedding's gradient arrives in full)"))
    return terms


# --- buffers of the data-parallel, expert-parallel and offload machinery -----------------

def _layer_matrices_on_rank(shape, t, e, etp) -> tuple[float, float]:
    """One decoder layer's matrices on a rank, as each weight's ``split`` says: (dense:
    attention and MLP / tp, the replicated ones (a router) whole; routed experts / (ep x
    expert_tp))."""
    dense = experts = 0
    for w in shape.layer_weights():
        if w.bias:
            continue
        if w.split == EXPERTS:
            experts += w.elements / (e * etp)
        elif w.split == REPLICATED:
            dense += w.elements
        else:
            dense += w.elements / t
    return dense, experts


def layer_parameters_on_rank(plan, placement=None) -> float:
    """One decoder layer's matrix parameters on a rank, as the rules split them (before
    data-parallel sharding). Without ``placement`` (the form of plugin API 2.3 and earlier) the
    layout's tp and ep sizes stand for the rules' split, as they did then."""
    if placement is None:
        t = plan.tp_size
        return sum(_layer_matrices_on_rank(shape_of(plan), t, plan.ep_size, plan.profile_options.expert_tp_size or t))
    return sum(_layer_matrices_on_rank(shape_of(plan), placement.tensor_shards, placement.expert_shards,
                                       expert_tensor_shards(plan, placement)))


def offload_terms(plan, weights, gradients, optimizer_state):
    """Move the offloaded components' terms to host memory (``cpu``) or NVMe. A parameter offload moves parameters
    only: the weights' terms keyed as module attributes (``term_keys.NOT_PARAMETERS``: bitsandbytes' QuantState,
    which FSDP1's CPUOffload (FlatParameters) and DeepSpeed's offload_param (partitioned parameters) never see) stay
    on the accelerator."""
    if not plan.profile_options.offload:
        return weights, gradients, optimizer_state
    from mlsysim_core.terms import HOST, NVME
    from .term_keys import NOT_PARAMETERS
    tiers = {"cpu": HOST, "nvme": NVME}
    moved = {"parameters": weights, "gradients": gradients, "optimizer": optimizer_state}
    for what, target in plan.profile_options.offload:
        moved[what] = [term if what == "parameters" and term.key in NOT_PARAMETERS else
                       attrs.evolve(term, tier=tiers[target], label=f"{term.label} (offloaded to {target})")
                       for term in moved[what]]
    return moved["parameters"], moved["gradients"], moved["optimizer"]
