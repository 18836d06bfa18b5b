"""What the uncached solve's shortcuts (issue 27, item 5) must keep: TrainingPlan.evolve is attrs.evolve's
answer without __init__ for the fields no derived attribute reads; the heaviest rank completed in place;
the profile's options object memoised on the options given and their types."""

import attrs
import pytest

from mlsysim_core import ProfileSpec, TrainingMemoryModel, hookimpl
from mlsysim_core.errors import PluginError
from mlsysim_core.inverse import prepared_plan
from mlsysim_core.manager import PluginManager

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


# The profile's options object, memoised on the options given (inputs._profile_options): one object per
# options and their values' types; an options class that raises still names the plugin and hook every time.
SEEN = []


def _warp(instance, attribute, value):
    if value == 13:
        raise ValueError("13 is unlucky")


@attrs.frozen(kw_only=True)
class _ToyOptions:
    warp_factor: object = attrs.field(default=None, validator=_warp)


class _Toy:
    @hookimpl
    def mlsysim_profiles(self):
        return [ProfileSpec(name="toy", component_plugins=("model_states",), options_type=_ToyOptions,
                            prepare=lambda plan, registry: SEEN.append(plan.profile_options) or plan)]


@pytest.fixture
def toy_solver(builtin_pm):
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(_Toy(), name="toy_plugin")
    SEEN.clear()
    return TrainingMemoryModel("toy", plugin_manager=pm)


def test_one_options_object_per_options_and_their_types(toy_solver):
    for batch, warp in ((8, 2), (16, 2), (8, 1), (16, True), (24, (1,)), (32, (True,))):
        toy_solver.solve("llama3-8b", "h100", batch, 1024, warp_factor=warp)
    same, other = SEEN[0], SEEN[2]
    assert SEEN[1] is same and same.warp_factor == 2      # a new batch: the same object
    assert other.warp_factor == 1 and type(SEEN[3].warp_factor) is bool and SEEN[3] is not other
    assert type(SEEN[5].warp_factor[0]) is bool and SEEN[5] is not SEEN[4]


def test_an_options_error_names_the_plugin_and_hook_every_time(toy_solver):
    for batch in (8, 16):
        with pytest.raises(PluginError) as err:
            toy_solver.solve("llama3-8b", "h100", batch, 1024, warp_factor=13)
        assert err.value.plugin == "toy_plugin" and err.value.hook == "mlsysim_profiles"
        assert "options_type raised ValueError: 13 is unlucky" in str(err.value)
