"""A regime that needs its data-parallel rule to do something (``Regime.requires``) says which rules it refuses
wherever dp x cp > 1 (``Regime.refused_rules``): the search leaves them out of those layouts up front, in one note
naming the regime and the rules, instead of enumerating each layout and preparing it to refuse it. The rows are the
ones it ranked before (issues 24, 26)."""

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.search import search_plans
from mlsysim_plugins.measured.regimes import REGIMES, Regime

pytestmark = pytest.mark.long     # whole searches (about 3 s of the quick suite)

RUN = dict(devices=8, global_batch=8, seq_len=2048, precision="bf16", profile="measured", workers=1)
MODEL, GPU = "llama3.1-8b", "h100"


@attrs.frozen(kw_only=True)
class Silent(Regime):
    """The same regime, saying nothing of the rules it refuses: the search then prepares each layout and the
    profile refuses it there (the search before ``refused_rules``)."""

    def refused_rules(self, registry, rules):
        return {}


def silent(name):
    return Silent(**attrs.asdict(REGIMES[name], recurse=False))


def rows(found):
    return [tuple(c) for c in found.fits]


@pytest.mark.parametrize("name, capability, refused", [
    ("fsdp-bf16", "fsdp-mixed-precision", "mcore-ddp, mcore-distopt, zero0, zero1, zero2, zero3"),
    ("mixed-bf16-main-grad", "megatron-main-grad", "fsdp, fsdp-grad-op, hsdp, zero0, zero1, zero2, zero3"),
])
def test_the_refused_rules_are_not_enumerated_and_the_rows_are_the_same(name, capability, refused):
    found = search_plans(MODEL, GPU, regime=name, **RUN)
    before = search_plans(MODEL, GPU, regime=silent(name), **RUN)
    assert rows(found) == rows(before) and [tuple(c) for c in found.pareto] == [tuple(c) for c in before.pareto]
    assert found.solves == before.solves
    # 10 installed rules; at dp x cp > 1 each has the same 216 layouts here (the search's own count, 2028 in all)
    left_out = before.candidates - found.candidates
    assert before.candidates == 2028 and left_out == 216 * len(refused.split(", "))
    note = (f"regime {name!r} needs a data-parallel rule that declares {capability!r}: {refused} left out of the "
            f"layouts with dp x cp > 1 ({left_out:,} layouts not enumerated)")
    assert [n for n in found.notes if n not in before.notes] == [note]
    assert {c.data_parallel for c in found.fits if c.dp * c.cp > 1}.isdisjoint(refused.split(", "))
    assert {c.data_parallel for c in found.fits if c.dp * c.cp == 1} == {"zero0"}     # one rank: any rule


def test_a_regime_that_requires_nothing_enumerates_every_rule_as_before():
    found = search_plans(MODEL, GPU, regime="mixed-bf16", **RUN)
    assert found.candidates == 2028
    assert not any("layouts not enumerated" in n for n in found.notes)
    assert REGIMES["mixed-bf16"].refused_rules(TrainingMemoryModel().registry, ["zero1", "fsdp"]) == {}


def test_the_named_rules_only_are_asked():
    """data_parallel= narrows what the regime is asked about: only the named rules it refuses are in the note."""
    found = search_plans(MODEL, GPU, regime="fsdp-bf16", data_parallel=["zero1", "fsdp"], **RUN)
    assert [n for n in found.notes if "not enumerated" in n] == [
        "regime 'fsdp-bf16' needs a data-parallel rule that declares 'fsdp-mixed-precision': zero1 left out of the "
        "layouts with dp x cp > 1 (216 layouts not enumerated)"]
    assert {c.data_parallel for c in found.fits} == {"fsdp", "zero0"}


def test_a_capability_no_rule_declares_leaves_the_one_rank_layouts_only():
    class Plugin:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["bf16"], name="myorg.needs-magic", requires=("myorg.magic",))]
    pm = PluginManager.from_environment()
    pm.register(Plugin(), "myorg_regimes")
    solver = TrainingMemoryModel("measured", plugin_manager=pm)
    found = search_plans(MODEL, GPU, regime="myorg.needs-magic", solver=solver, **RUN)
    rules = sorted(solver.registry.rules_for_axis("dp"))
    assert [n for n in found.notes if "not enumerated" in n] == [
        f"regime 'myorg.needs-magic' needs a data-parallel rule that declares 'myorg.magic': {', '.join(rules)} left "
        f"out of the layouts with dp x cp > 1 ({216 * len(rules):,} layouts not enumerated)"]
    assert found.fits and all(c.dp * c.cp == 1 for c in found.fits)
