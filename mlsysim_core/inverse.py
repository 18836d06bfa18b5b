"""Inverse solves: the largest batch or sequence that fits, the fewest devices that fit.

Each answer is found by exponential then binary search over ``solve`` (memory grows with
the micro-batch and the sequence, and shrinks as data parallelism grows, for every
built-in plugin; a search checks the property at the points it visits and says so if a
plugin breaks it). Each answer names the *binding* component, the one whose growth
makes the next step not fit, and the headroom left at the answer.
"""

from __future__ import annotations

import inspect
import math
from typing import Callable

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError, LayoutError
from .inputs import check_plan, profile_plan
from .result import TrainingMemoryResult
from .solver import TrainingMemoryModel
from .terms import COMPONENTS

MAX_MICROBATCH = 1 << 20
MAX_SEQUENCE = 1 << 24
MAX_DP = 1 << 20


@attrs.frozen(kw_only=True)
class InverseAnswer:
    """The answer to one inverse question.

    ``value`` is the largest (or smallest) value that fits, or ``None`` when none does;
    ``result`` the solve at that value; ``limit`` the solve at the first value that does
    not fit (``None`` if the search bound was reached); ``binding`` the component that
    grows most from ``result`` to ``limit`` (the one that runs out of room);
    ``headroom`` the bytes left at the answer.
    """

    question: str
    value: int | None
    result: TrainingMemoryResult | None
    limit: TrainingMemoryResult | None
    binding: str | None
    headroom: int | float | None
    solves: int
    details: dict = attrs.field(factory=dict)
    # The search reached its bound (MAX_MICROBATCH, MAX_SEQUENCE) and every value up to it
    # fits: ``value`` is a lower bound, not the largest value that fits.
    at_search_limit: bool = False
    # How ``describe`` names the value beyond the answer, whose need ``limit`` is.
    beyond: str = "at the next step"

    def describe(self) -> str:
        if self.value is None:
            over = self.limit
            return (f"{self.question}: nothing fits; at the smallest value the total is "
                    f"{over.gb.total_memory:,.3f} GB ({over.gib.total_memory:,.3f} GiB) against "
                    f"{over.gb.available_memory:,.3f} GB ({over.gib.available_memory:,.3f} GiB); largest component: "
                    f"{self.binding}")
        value = f"at least {self.value:,} (search limit)" if self.at_search_limit else f"{self.value:,}"
        text = (f"{self.question}: {value}"
                + "".join(f", {k} {v:,}" for k, v in self.details.items())
                + f" ({self.result.gb.total_memory:,.3f} GB of {self.result.gb.available_memory:,.3f} GB = "
                  f"{self.result.gib.total_memory:,.3f} GiB of {self.result.gib.available_memory:,.3f} GiB; "
                  f"{self.headroom * 1e-9:,.3f} GB = {self.headroom / 2**30:,.3f} GiB headroom)")
        if self.at_search_limit:
            text += "; every value up to the search limit fits, so the answer is a lower bound"
        if self.limit is not None:
            text += (f"; {self.beyond} it needs {self.limit.gb.total_memory:,.3f} GB ({self.limit.gib.total_memory:,.3f} GiB), "
                     f"bound by "
                     f"{self.binding.replace('_', ' ')}")
        return text


def _binding(fits: TrainingMemoryResult | None, over: TrainingMemoryResult | None) -> str | None:
    if over is None:
        return None
    if fits is None:   # nothing fits: the largest component
        return max(COMPONENTS, key=lambda c: getattr(over, c))
    return max(COMPONENTS, key=lambda c: getattr(over, c) - getattr(fits, c))


def _flip(evaluate: Callable[[int], TrainingMemoryResult], start: int, bound: int,
          first: TrainingMemoryResult | None = None):
    """Where feasibility flips, for a predicate monotone over the integers start..bound.

    Exponential search from ``start`` (start, 2 start, 4 start, ...; 0, 1, 2, 4, ... from 0)
    to the first value whose feasibility differs from ``start``'s, then binary search.
    Returns ``(last, last_result, first_flipped_result or None, solves)``: ``last`` is the
    last value with ``start``'s feasibility (``bound`` if it never flips). ``first`` is
    the result at ``start`` when the caller already has it.
    """
    solves = 0
    if first is None:
        first, solves = evaluate(start), 1
    state = first.feasible
    last, last_result, flipped, flipped_result = start, first, None, None
    n = start
    while flipped is None:
        if n == bound:
            return last, last_result, None, solves
        n = min(max(2 * n, n + 1), bound)
        r = evaluate(n)
        solves += 1
        if r.feasible == state:
            last, last_result = n, r
        else:
            flipped, flipped_result = n, r
    while flipped - last > 1:
        mid = (last + flipped) // 2
        r = evaluate(mid)
        solves += 1
        if r.feasible == state:
            last, last_result = mid, r
        else:
            flipped, flipped_result = mid, r
    return last, last_result, flipped_result, solves


def _largest(fits_at: Callable[[int], TrainingMemoryResult], start: int, bound: int):
    """Largest n in [start, bound] with fits_at(n).feasible, for a monotone predicate:
    ``(n, result, first_result_that_does_not_fit, solves)``; n is None if start does not fit."""
    first = fits_at(start)
    if not first.feasible:
        return None, None, first, 1
    last, last_result, over, solves = _flip(fits_at, start, bound, first)
    return last, last_result, over, solves + 1


def _answer(question, value, result, limit, solves, **details) -> InverseAnswer:
    return InverseAnswer(question=question, value=value, result=result, limit=limit,
                         binding=_binding(result, limit), headroom=result.headroom if result else None,
                         solves=solves, details=details, at_search_limit=value is not None and limit is None)


def _solver(solver) -> TrainingMemoryModel:
    """``solver``: a TrainingMemoryModel, or None for ``TrainingMemoryModel()`` (nothing else,
    falsy values included, means the default)."""
    if solver is None:
        return TrainingMemoryModel()
    if not isinstance(solver, TrainingMemoryModel):
        raise InvalidInputTypeError("solver", solver, "a TrainingMemoryModel, or None for TrainingMemoryModel()",
                                    f"got {type(solver).__name__}")
    return solver


_SOLVE_KEYWORDS: tuple = ()


def prepared_plan(solver, model, hardware, batch_size, seq_len, kwargs):
    """The plan ``solver.solve(model, hardware, batch_size, seq_len, **kwargs)`` prices, prepared (for
    the planners: search, fit techniques)."""
    bound = inspect.signature(solver.solve).bind(model, hardware, batch_size, seq_len, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)      # solve's parameters, named as check_plan's
    options, profile, registry = a.pop("profile_options"), a.pop("profile") or solver._profile, solver.registry
    if isinstance(model, str) or isinstance(hardware, str):
        from .catalog import get_hardware, get_model
        pm = solver.plugin_manager
        a["model"] = get_model(model, plugin_manager=pm) if isinstance(model, str) else model
        a["hardware"] = get_hardware(hardware, plugin_manager=pm) if isinstance(hardware, str) else hardware
    if type(a["include_plugins"]) is list:
        a["include_plugins"] = tuple(a["include_plugins"])
    return profile_plan(registry, registry.profiles[profile], check_plan(registry, profile, **a), options)


def _check_keywords(solve_kwargs: dict, searched: tuple[str, ...], solver: TrainingMemoryModel) -> None:
    """Every extra keyword must be one of ``solve``'s (not one this search sets itself) or an
    option of an installed profile (``solve`` checks those): a mistyped name is an error
    naming it, not a TypeError from inside the search."""
    global _SOLVE_KEYWORDS
    if not _SOLVE_KEYWORDS:
        _SOLVE_KEYWORDS = tuple(name for name, p in inspect.signature(TrainingMemoryModel.solve).parameters.items()
                                if p.kind is not p.VAR_KEYWORD)[1:]    # (without self and **profile_options)
    from .inputs import options_fields
    options = {name for spec in solver.registry.profiles.values() for name in options_fields(spec)}
    for name in solve_kwargs:
        if (name not in _SOLVE_KEYWORDS or name in ("model", "hardware")) and name not in options:
            usable = [k for k in _SOLVE_KEYWORDS if k not in ("model", "hardware") and k not in searched]
            raise InvalidInputError(name, solve_kwargs[name], f"a keyword of solve: {', '.join(usable)}",
                                    f"{name!r} is not a parameter of TrainingMemoryModel.solve")


def largest_batch(model, hardware, *, solver: TrainingMemoryModel | None = None, **solve_kwargs) -> InverseAnswer:
    """The largest micro-batch that fits, and the global batch it makes.

    ``solve_kwargs`` are ``solve``'s (without ``batch_size``). The global batch is
    micro-batch x dp_size x gradient_accumulation_steps.
    """
    if "batch_size" in solve_kwargs:
        raise InvalidInputError("batch_size", solve_kwargs["batch_size"], "not given: it is what is searched")
    solver = _solver(solver)
    _check_keywords(solve_kwargs, ("batch_size",), solver)
    # Checked here, before they scale the searched batch (else a dp of 0 would blame batch_size).
    per_micro = (_checks.count("dp_size", solve_kwargs.get("dp_size", 1))
                 * _checks.count("gradient_accumulation_steps", solve_kwargs.get("gradient_accumulation_steps", 1)))
    if per_micro > _checks.MAX_COUNT:     # (no global batch of even one micro-batch per replica and step)
        raise InvalidInputError("gradient_accumulation_steps", solve_kwargs.get("gradient_accumulation_steps", 1),
                                f"dp_size x gradient_accumulation_steps at most {_checks.MAX_COUNT:,}",
                                f"dp_size x gradient_accumulation_steps = {per_micro:,}")
    value, result, limit, solves = _largest(
        lambda mb: solver.solve(model, hardware, mb * per_micro, **solve_kwargs), 1,
        min(MAX_MICROBATCH, _checks.MAX_COUNT // per_micro))
    details = {"global batch": value * per_micro} if value else {}
    return _answer("largest micro-batch", value, result, limit, solves, **details)


def sequence_unit(multiple_of: int = 1, cp_size: int = 1) -> int:
    """The step of a sequence search: the multiples of ``multiple_of`` that context
    parallelism divides (each of the ``cp_size`` ranks holds a whole share of the sequence),
    i.e. multiples of lcm(multiple_of, cp_size)."""
    return math.lcm(multiple_of, cp_size)


def longest_sequence(model, hardware, batch_size, *, solver: TrainingMemoryModel | None = None,
                     multiple_of: int = 1, **solve_kwargs) -> InverseAnswer:
    """The longest sequence that fits at ``batch_size``: a multiple of ``multiple_of`` and,
    with context parallelism, of ``cp_size`` (multiples of their lcm, ``sequence_unit``)."""
    if "seq_len" in solve_kwargs:
        raise InvalidInputError("seq_len", solve_kwargs["seq_len"], "not given: it is what is searched")
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, int):
        raise InvalidInputTypeError("multiple_of", multiple_of, "an integer >= 1", f"got {type(multiple_of).__name__}")
    multiple_of = _checks.count("multiple_of", multiple_of, maximum=MAX_SEQUENCE)
    solver = _solver(solver)
    _check_keywords(solve_kwargs, ("seq_len",), solver)
    if "cp_size" in solve_kwargs:      # checked here, before it scales the searched sequence
        unit = sequence_unit(multiple_of, _checks.count("cp_size", solve_kwargs["cp_size"], maximum=MAX_SEQUENCE))
        if unit > MAX_SEQUENCE:
            raise InvalidInputError("multiple_of", multiple_of, f"a value with lcm(multiple_of, cp_size) at most "
                                    f"{MAX_SEQUENCE:,}", f"lcm({multiple_of}, {solve_kwargs['cp_size']}) = {unit:,}")
        multiple_of = unit
    bound, cap = MAX_SEQUENCE, _position_rows(solver, model, solve_kwargs.get("profile"))
    if cap is not None:      # a learned position table: no sequence past its rows (the measured profile says so)
        bound = cap
        if multiple_of > cap:
            raise InvalidInputError("multiple_of", multiple_of, f"at most the model's context length {cap:,}",
                                    "the model has learned position embeddings: no sequence past its context length")
    value, result, limit, solves = _largest(
        lambda k: solver.solve(model, hardware, batch_size, k * multiple_of, **solve_kwargs),
        1, bound // multiple_of)
    answer = _answer("longest sequence", value * multiple_of if value else None, result, limit, solves)
    if cap is not None and answer.at_search_limit:     # the context length, not the search, ends it
        answer = attrs.evolve(answer, at_search_limit=False,
                              details={"capped at the model's context length": cap})
    return answer


def _position_rows(solver: TrainingMemoryModel, model, profile) -> int | None:
    """The longest sequence the profile accepts for the model, as it declares it
    (``ProfileSpec.sequence_limit``: the measured profile's learned position table), else None."""
    registry = solver.registry
    spec = registry.profiles.get(profile if profile is not None else solver._profile) \
        if isinstance(profile, (str, type(None))) else None
    if spec is None or spec.sequence_limit is None:
        return None
    if isinstance(model, str):
        from .catalog import get_model
        model = get_model(model, plugin_manager=solver.plugin_manager)
    from .types import TransformerWorkload
    if not isinstance(model, TransformerWorkload):
        return None     # (solve says what is wrong with it)
    return spec.sequence_limit(model)


def refuses_dp(err: LayoutError) -> bool:
    """Does ``err`` refuse a layout for its data-parallel size, so that another dp may be
    accepted (an HSDP shard group that does not divide dp x cp, expert ranks that do not fit
    in tp x cp x dp)? ``fewest_devices`` skips such sizes instead of stopping."""
    text = f"{err.parameter} {err.allowed} {err.detail}"
    return "dp" in text.replace("dp_rule", "")


def fewest_devices(model, hardware, batch_size, *, solver: TrainingMemoryModel | None = None,
                   tp_size: int = 1, pp_size: int = 1, ep_size: int = 1, powers_of_two: bool = True,
                   exact_batch: bool | None = None, **solve_kwargs) -> InverseAnswer:
    """The fewest devices (tp x cp x pp x dp; expert parallelism lies inside them) that fit,
    for a layout shape: ``tp_size``, ``pp_size``, ``ep_size`` and ``cp_size`` (a keyword of
    ``solve``, 1 by default) fixed, data parallelism grown (ZeRO shards over it and the
    micro-batch shrinks). ``batch_size`` is the global batch; with ``powers_of_two`` only
    dp = 1, 2, 4, ... is tried. ``ep_size`` must divide dp. With ``exact_batch`` only a dp
    whose replicas take whole micro-batches (``batch_size`` a multiple of dp x
    gradient_accumulation_steps) is tried; the default is what the profile declares
    (``ProfileSpec.exact_batch``: the measured profile never rounds the micro-batch; the
    reference rounds)."""
    for name in ("dp_size",):
        if name in solve_kwargs:
            raise InvalidInputError(name, solve_kwargs[name], "not given: it is what is searched")
    solver = _solver(solver)
    _check_keywords(solve_kwargs, ("batch_size", "dp_size", "tp_size", "pp_size", "ep_size"), solver)
    tp_size = _checks.count("tp_size", tp_size)
    pp_size = _checks.count("pp_size", pp_size)
    ep_size = _checks.count("ep_size", ep_size)
    cp_size = _checks.count("cp_size", solve_kwargs.get("cp_size", 1))     # ranks too: counted
    powers_of_two = _checks.flag("powers_of_two", powers_of_two)
    if exact_batch is not None:
        exact_batch = _checks.flag("exact_batch", exact_batch)
    steps = [d for d in (1 << k for k in range(21)) if d % ep_size == 0] if powers_of_two else \
        [d for d in range(1, MAX_DP + 1) if d % ep_size == 0]
    if not steps:     # e.g. ep_size=3 with powers of two: no dp to try; say so, naming ep_size
        raise InvalidInputError("ep_size", ep_size,
                                "a power of two (with powers_of_two=True, dp is a power of two that ep_size "
                                "must divide)" if powers_of_two else f"at most {MAX_DP}")
    if exact_batch is None:
        spec = solver.registry.profiles.get(solve_kwargs.get("profile") or solver._profile)
        exact_batch = spec is not None and spec.exact_batch
    gas = solve_kwargs.get("gradient_accumulation_steps", 1)
    if exact_batch and type(batch_size) is int and type(gas) is int and gas >= 1:
        steps = [d for d in steps if batch_size % (d * gas) == 0]
        if not steps:
            unit = ep_size * gas
            raise InvalidInputError("batch_size", batch_size,
                                    f"a multiple of ep_size x gradient_accumulation_steps = {unit}",
                                    "no data-parallel size that is a multiple of ep_size splits it into whole "
                                    "micro-batches")

    solves = 0
    refused: list[LayoutError] = []

    def valid_at(i: int, end: int):
        """The first step in [i, end) whose layout the rules accept, and its result: a dp
        that a rule refuses (an HSDP shard group that does not divide it, expert ranks that
        do not fit in it) is skipped, not taken as "does not fit"."""
        nonlocal solves
        for j in range(i, end):
            solves += 1
            try:
                return j, solver.solve(model, hardware, batch_size, tp_size=tp_size, pp_size=pp_size,
                                       ep_size=ep_size, dp_size=steps[j], **solve_kwargs)
            except LayoutError as err:
                if not refuses_dp(err):
                    raise
                refused.append(err)
        return None, None

    # Memory shrinks as dp grows: the first valid step that fits. Exponential search over
    # the steps, then binary search; ``top`` bounds the steps not yet known to be refused.
    n = len(steps)
    lo, lo_result = valid_at(0, n)
    if lo is None:          # no data-parallel size the rules accept: say why, for the smallest
        raise refused[0]
    hi = hi_result = None
    if lo_result.feasible:
        hi, hi_result, lo, lo_result = lo, lo_result, None, None
    else:
        while hi is None:
            probe = min(2 * lo + 1, n - 1) if lo < n - 1 else None
            j, r = (None, None) if probe is None else valid_at(probe, n)
            if j is None:
                if probe is not None and probe > lo + 1:     # refused up to the end: look below the probe
                    j, r = valid_at(lo + 1, probe)
                if j is None:           # even the largest valid step does not fit
                    return InverseAnswer(question="fewest devices", beyond="with fewer devices", value=None,
                                         result=None, limit=lo_result, binding=_binding(None, lo_result), headroom=None, solves=solves)
            if r.feasible:
                hi, hi_result = j, r
            else:
                lo, lo_result = j, r
        top = hi
        while top - lo > 1:
            mid = (lo + top) // 2
            j, r = valid_at(mid, top)
            if j is None:           # every step in [mid, top) refused
                top = mid
            elif r.feasible:
                hi, hi_result, top = j, r, j
            else:
                lo, lo_result = j, r
    dp = steps[hi]
    binding = None if lo_result is None else max(
        COMPONENTS, key=lambda c: getattr(lo_result, c) - getattr(hi_result, c))
    return InverseAnswer(question="fewest devices", beyond="with fewer devices",
                         value=tp_size * cp_size * pp_size * dp, result=hi_result, limit=lo_result, binding=binding, headroom=hi_result.headroom, solves=solves,
                         details={"dp": dp, "tp": tp_size, "pp": pp_size, "ep": ep_size, "cp": cp_size})
