"""A measured-profile search gives exactly what solving each layout alone gives, with the
read-keyed caches on (``memo.read_keyed``); and the read-keyed cache itself: keys typed at
every depth, copies made with ``attrs.evolve`` re-applied to the next object, branches."""

from __future__ import annotations

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, memo, search
from mlsysim_core.catalog import get_hardware, get_model
from mlsysim_core.errors import InvalidInputError

MODEL, GPU = "mixtral-8x7b", "h100"
ARGS = dict(devices=16, global_batch=8, seq_len=1024, profile="measured", checkpointing=["full", "selective"],
            data_parallel=["fsdp", "zero1", "hsdp"], assume_monotone=False)


def _alone(solver, layout, seq_len, global_batch):
    """One layout solved by itself, every memo off (nothing remembered from any other solve)."""
    tp, cp, pp, dp, ep, rule, ckpt, sp, mb = layout
    try:
        return solver.solve(MODEL, GPU, global_batch, seq_len, "fp16", "adam", ckpt, tp, pp, dp, ep, 0,
                            global_batch // dp // mb, sequence_parallel=sp, data_parallel=rule, cp_size=cp,
                            profile="measured")
    except InvalidInputError:
        return None


@pytest.mark.parametrize("workers", [1, 2])
def test_measured_search_fits_equal_each_layout_solved_alone(workers):
    memo.set_enabled(True)
    found = search.search_plans(MODEL, GPU, workers=workers, **ARGS)
    solver = TrainingMemoryModel("measured")
    model, registry = get_model(MODEL), solver.registry
    rules = ARGS["data_parallel"]
    groups = search._enumerate(model, 16, 8, 1024, 8, None, rules, ARGS["checkpointing"], (True, False),
                               search._one_rank_rules(rules, registry.rules_for_axis("dp")),
                               get_hardware(GPU).devices_per_node)
    layouts = [(*g[:-1], mb) for g in groups for mb in g[-1]]
    assert found.candidates == found.solves == len(layouts)
    memo.set_enabled(False)
    try:
        truth = {layout: _alone(solver, layout, 1024, 8) for layout in layouts}
    finally:
        memo.set_enabled(True)
    feasible = {k: r for k, r in truth.items() if r is not None and r.feasible}
    fits = {c[:9]: c for c in found.fits}
    # (rows identical but for the strategy's name are listed once: the search says how many)
    assert set(fits) <= set(feasible) and len(feasible) - len(fits) == _dropped(found)
    for key, row in fits.items():
        assert row.total_memory == feasible[key].total_memory       # exact, float for float
    for axis in ("tp", "cp", "pp", "ep", "dp"):       # every axis above 1 takes part
        assert max(getattr(c, axis) for c in found.fits) > 1
    assert {c.data_parallel for c in found.fits} >= {"fsdp", "zero1", "hsdp"}
    assert {c.checkpointing for c in found.fits} == {"full", "selective"}


def _dropped(found) -> int:
    import re
    for note in found.notes:
        m = re.match(r"([\d,]+) layouts the same as another", note)
        if m:
            return int(m.group(1).replace(",", ""))
    return 0


def test_measured_search_same_with_every_memo_off():
    memo.set_enabled(True)
    cached = search.search_plans(MODEL, GPU, workers=1, **{**ARGS, "assume_monotone": True})
    memo.set_enabled(False)
    try:
        plain = search.search_plans(MODEL, GPU, workers=1, **{**ARGS, "assume_monotone": True})
    finally:
        memo.set_enabled(True)
    assert cached.fits == plain.fits and cached.solves == plain.solves and cached.candidates == plain.candidates


# --- memo.read_keyed ------------------------------------------------------------------------

@attrs.frozen
class Inner:
    x: object = 1


@attrs.frozen
class Thing:
    a: object = 1
    b: object = 2
    inner: Inner = Inner()

    @property
    def total(self):
        return self.a + self.b


def _keyed(function, *objects, values=()):
    return memo.read_keyed(function, function, values, objects)


def test_read_keyed_reuses_only_identical_reads():
    calls = []

    def f(thing):
        calls.append(1)
        return thing.a * 10

    memo.set_enabled(True)
    assert _keyed(f, Thing(a=1, b=2)) == 10
    assert _keyed(f, Thing(a=1, b=99)) == 10 and len(calls) == 1     # b is not read: remembered
    assert _keyed(f, Thing(a=2)) == 20 and len(calls) == 2
    assert _keyed(f, Thing(a=True)) == 10 and len(calls) == 3         # True == 1, but another key
    assert _keyed(f, Thing(a=1.0)) == 10.0 and len(calls) == 4


def test_read_keyed_types_nested_values():
    seen = []

    def f(thing):
        seen.append(type(thing.inner.x))
        return repr(thing.inner.x)

    memo.set_enabled(True)
    assert _keyed(f, Thing(inner=Inner(1))) == "1"
    assert _keyed(f, Thing(inner=Inner(True))) == "True"       # equal objects, other types inside
    assert _keyed(f, Thing(inner=Inner(1))) == "1" and seen == [int, bool]


def test_read_keyed_follows_branches():
    def f(thing):
        return thing.b if thing.a else -1

    memo.set_enabled(True)
    assert _keyed(f, Thing(a=0, b=5)) == -1
    assert _keyed(f, Thing(a=1, b=5)) == 5
    assert _keyed(f, Thing(a=1, b=6)) == 6
    assert _keyed(f, Thing(a=0, b=7)) == -1


def test_read_keyed_reapplies_an_evolved_copy():
    """A function returning ``attrs.evolve(thing, a=...)`` copies b without reading it: the
    remembered answer is the change, applied to the next thing (its own b kept)."""
    calls = []

    def f(thing):
        calls.append(1)
        return attrs.evolve(thing, a=thing.a + 1)

    memo.set_enabled(True)
    assert _keyed(f, Thing(a=1, b=2)) == Thing(a=2, b=2)
    again = _keyed(f, Thing(a=1, b=50))
    assert again == Thing(a=2, b=50) and type(again) is Thing and len(calls) == 1


def test_read_keyed_a_copys_derived_attribute_reads_its_fields():
    def f(thing):
        copy = attrs.evolve(thing, a=5)
        return copy.total           # a + b: b is inherited, so it is read

    memo.set_enabled(True)
    assert _keyed(f, Thing(a=1, b=2)) == 7
    assert _keyed(f, Thing(a=1, b=3)) == 8


def test_read_keyed_values_are_keys_and_errors_are_the_untracked_ones():
    def f(scale, thing):
        if thing.a < 0:
            raise ValueError("negative")
        return scale * thing.a

    memo.set_enabled(True)
    assert _keyed(f, Thing(a=2), values=(3,)) == 6
    assert _keyed(f, Thing(a=2), values=(4,)) == 8
    with pytest.raises(ValueError, match="negative"):
        _keyed(f, Thing(a=-1), values=(3,))


def test_read_keyed_off_calls_through():
    calls = []

    def f(thing):
        calls.append(1)
        return thing.a

    memo.set_enabled(False)
    try:
        _keyed(f, Thing())
        _keyed(f, Thing())
    finally:
        memo.set_enabled(True)
    assert len(calls) == 2
