"""A measured-profile search gives exactly what solving each layout alone gives (every memo
off for the truth), in-process and with two workers."""

from __future__ import annotations

import pytest

from mlsysim_core import TrainingMemoryModel, memo, search
from mlsysim_core.catalog import get_hardware, get_model
from mlsysim_core.errors import InvalidInputError

# Long (about 13 s: whole searches, each layout solved again): `pytest --long` and .ci/run run them.
pytestmark = pytest.mark.long

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
    assert all(g[8] == search.BASE_VARIANT for g in groups)     # (no opt-in axis: the base variant only)
    layouts = [(*g[:8], mb) for g in groups for mb in g[-1]]
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
