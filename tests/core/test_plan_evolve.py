"""TrainingPlan.evolve: attrs.evolve's answer, without __init__ for the fields no derived attribute reads
(the uncached solve evolves a plan about seven times: issue 27, item 5)."""

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.inputs import prepared_plan

LAYOUT = dict(tp_size=2, pp_size=2, dp_size=8, zero_stage=2)


@pytest.fixture(scope="module")
def plan():
    return prepared_plan(TrainingMemoryModel("measured"), "llama3-8b", "h100", 32, 2048, LAYOUT)


@pytest.mark.parametrize("changes", [dict(rank=None), dict(notes=("a note",)), dict(profile_options=None),
                                     dict(notes=(), rank=None)])
def test_evolve_equals_attrs_evolve(plan, changes):
    fast, slow = plan.evolve(**changes), attrs.evolve(plan, **changes)
    assert type(fast) is type(slow)
    assert fast == slow and hash(fast) == hash(slow)
    assert fast.__dict__ == slow.__dict__ | {"_attrs_cached_hash": fast.__dict__["_attrs_cached_hash"]}
    assert (fast.microbatch, fast.bytes_per_value, fast.hidden_dim) == (slow.microbatch, slow.bytes_per_value,
                                                                        slow.hidden_dim)


def test_a_field_a_derived_attribute_reads_goes_through_init(plan):
    # batch_size and dp_size make the micro-batch: __attrs_post_init__ must run again.
    assert plan.microbatch == 32 // 8
    bigger = plan.evolve(batch_size=128)
    assert bigger.microbatch == 128 // 8 and bigger == attrs.evolve(plan, batch_size=128)
    assert plan.evolve(precision="fp32").bytes_per_value == 4


def test_the_original_is_untouched_and_hashes_apart(plan):
    before = (hash(plan), plan.rank, plan.notes)
    other = plan.evolve(notes=plan.notes + ("x",))
    assert (hash(plan), plan.rank, plan.notes) == before
    assert other != plan and hash(other) != hash(plan)


def test_rank_results_equal_a_solve_with_memos_off():
    # The per-rank plans (plan.evolve(rank=...)) and the heaviest rank completed in place give what a
    # fresh solve gives, with every memo off (nothing shared between the calls).
    from mlsysim_core import memo
    solver = TrainingMemoryModel("measured")
    cached = solver.solve("llama3-8b", "h100", 48, 2048, **LAYOUT)
    memo.set_enabled(False)
    try:
        fresh = TrainingMemoryModel("measured").solve("llama3-8b", "h100", 48, 2048, **LAYOUT)
    finally:
        memo.set_enabled(True)
    assert repr(cached) == repr(fresh)
    assert cached.heaviest_rank == "last stage" and len(cached.ranks) == 2 and cached.feasible is fresh.feasible
