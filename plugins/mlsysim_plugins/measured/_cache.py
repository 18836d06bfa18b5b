"""Measured-grade term lists, memoised with ``mlsysim_core.memo`` (the one mechanism).

``cached_terms``: keyed on every argument (the frozen plan and placement, whole), so it cannot
go stale. ``per_layout``: for the terms that do not depend on the batch (weights, gradients,
optimizer state, the data-parallel buffers), keyed on the plan without its batch: a sweep or a
search that changes only the batch size or the micro-batch reuses them (issue 27, item 5)."""

from __future__ import annotations

import functools
import operator

import attrs

from mlsysim_core.memo import memoize
from .._evolve import evolve as _evolve
from mlsysim_core.plan import TrainingPlan
from mlsysim_core.terms import ACCELERATOR, PHASES, MemoryTerm, _get_cell


def cached_terms(fn):
    """``fn(plan, placement, *extra, **kw)``, memoised; each call gets a new list."""
    frozen = memoize(lambda *args, **kw: tuple(fn(*args, **kw)))

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        return list(frozen(*args, **kw))
    return wrapper


# What a per-layout term may read of the plan: every field but the batch.
_BATCH_FIELDS = ("batch_size", "gradient_accumulation_steps")
_LAYOUT_FIELDS = operator.attrgetter(*(f.name for f in attrs.fields(TrainingPlan) if f.name not in _BATCH_FIELDS))


class Layout:
    """A plan without its batch, as a memo key: every field of the plan but ``batch_size`` and
    ``gradient_accumulation_steps``, and whether there is more than one accumulation step (what
    a gradient's lifetime depends on). Hashed once; ``plan`` (not part of the key) is the plan
    it was made from."""

    __slots__ = ("fields", "plan", "_hash")

    def __init__(self, plan):
        if type(plan) is TrainingPlan:
            self.fields = (*_LAYOUT_FIELDS(plan), plan.gradient_accumulation_steps > 1)
        else:       # a stand-in for a plan (a test's namespace): itself, by identity (``plan`` keeps it alive)
            self.fields = (id(plan),)
        self.plan = plan
        self._hash = hash(self.fields)

    def __hash__(self):
        return self._hash

    def __eq__(self, other):
        return type(other) is Layout and self.fields == other.fields


def evolved(plan, **changes):
    """``evolve(plan, **changes)``: a ``TrainingPlan``'s own ``evolve`` (no ``__init__`` for the fields no
    derived attribute reads), anything else (a test's stand-in) through ``_evolve.evolve``."""
    return plan.evolve(**changes) if type(plan) is TrainingPlan else _evolve(plan, **changes)


def same_object_first(cls):
    """``cls`` (an attrs class) whose ``==`` answers at once for the same object: attrs compares
    field by field, and a family's or a kernel's fields are dozens of callables and tables (the
    memos compare the options that hold them on every solve)."""
    fields_equal = cls.__eq__
    cls.__eq__ = lambda self, other: self is other or fields_equal(self, other)
    return cls


_last: tuple = (None, None)     # (a plan, its Layout): a rank's pipeline asks for the same plan's several times


def layout_of(plan) -> Layout:
    """The plan's ``Layout``, made once per plan object (the last one asked for is kept)."""
    global _last
    last_plan, layout = _last
    if plan is not last_plan:
        layout = Layout(plan)
        _last = (plan, layout)
    return layout


@functools.cache
def _values_of(cls) -> operator.attrgetter:
    return operator.attrgetter(*(f.name for f in attrs.fields(cls)), "__class__")    # (always a tuple)


_kinds_of: dict[int, tuple] = {}     # id(options) -> (the options, their kinds): a solve asks for three objects'


def kinds(options) -> tuple:
    """The types of an options object's values: part of the key of a memo on options (``True == 1``
    for the memo, but a check may refuse one: the memo keys every argument's type, not its fields').
    The last options objects asked for keep their answer, by identity (an options object is frozen and
    kept alive here; the same tuple also makes the memo's key comparison an identity check)."""
    known = _kinds_of.get(id(options))
    if known is not None and known[0] is options:
        return known[1]
    answer = tuple(map(type, _values_of(type(options))(options)))
    if len(_kinds_of) >= 64:
        _kinds_of.clear()
    _kinds_of[id(options)] = (options, answer)
    return answer


def per_layout(fn):
    """``fn(plan, placement, *extra, **kw)``, memoised on the plan's ``Layout`` (the plan
    without its batch), the placement and the rest; each call gets a new list.

    Only for functions whose terms, and whatever they call (a family's ``adjust_terms`` for
    the weights, a data-parallel rule's ``main_grad_terms``), read neither ``batch_size``,
    ``microbatch`` nor the number of accumulation steps beyond whether it is more than one:
    the model's states and the buffers sized by them (``tests/measured/test_per_layout.py``)."""
    frozen = memoize(lambda layout, *args, **kw: tuple(fn(layout.plan, *args, **kw)))

    @functools.wraps(fn)
    def wrapper(plan, *args, **kw):
        return list(frozen(layout_of(plan), *args, **kw))
    return wrapper


_new, _INF = object.__new__, float("inf")
# Each slot's own setter (``MemoryTerm`` is a slotted attrs class): a term per formula, every solve, and
# ``object.__setattr__(t, name, value)`` looks the slot up by name each time (half of ``term``'s cost).
_SLOT_SETTERS = tuple(MemoryTerm.__dict__[name].__set__ for name in (
    "component", "label", "nbytes", "formula", "source", "phases", "tier", "pipeline_stage", "rank", "key"))
(_component, _label, _nbytes, _formula, _source, _phases, _tier, _pipeline_stage, _rank, _key) = _SLOT_SETTERS
# (``term`` sets every field of ``MemoryTerm``: a field added to it is added there too.)
assert tuple(a.name for a in attrs.fields(MemoryTerm)) == ("component", "label", "nbytes", "formula", "source",
                                                           "phases", "tier", "pipeline_stage", "rank", "key")


def term(*, component: str, label: str, nbytes, formula: str = "", phases: tuple = PHASES,
         key: str = "") -> MemoryTerm:
    """``MemoryTerm(...)`` for the profile's own formulas (issue 27, item 5: a term per formula, every
    solve): the same object, built without ``MemoryTerm``'s checks where they cannot fail, i.e. for a
    ``component`` from ``terms.COMPONENTS``, a str ``label`` and ``formula``, ``phases`` a tuple of
    ``terms.PHASES``, ``key`` a ``term_keys`` constant (the callers pass constants) and ``nbytes`` an int
    or float in [0, inf), checked here; any other ``nbytes`` goes through ``MemoryTerm`` and its errors. A
    plugin's own terms are never built here: the solver checks every term a hook returns as before.
    Every slot is set through its own setter (``_SLOT_SETTERS``), the values ``MemoryTerm(...)`` sets."""
    kind = type(nbytes)
    if (kind is int or kind is float) and 0 <= nbytes < _INF:
        t = _new(MemoryTerm)
        _component(t, component)
        _label(t, label)
        _nbytes(t, nbytes)
        _formula(t, formula)
        cell = _get_cell()      # (``_default_source``, inlined: a term per formula)
        _source(t, cell[0] if cell is not None else "")
        _phases(t, phases)
        _tier(t, ACCELERATOR)
        _pipeline_stage(t, None)
        _rank(t, None)
        _key(t, key)
        return t
    return MemoryTerm(component=component, label=label, nbytes=nbytes, formula=formula, phases=phases, key=key)
