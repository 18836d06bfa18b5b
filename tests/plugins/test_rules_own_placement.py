"""Issue 24, item 2: the sharding rules own the placement under every profile.

The measured profile's rank classes select a stage of the rules' placement (``Placement``:
``tensor_shards``, ``sequence_shards``, ``expert_shards``, ``pipeline_stages`` and the shard
factors) and add what is in flight; they never recount the split from ``plan.tp_size`` and
friends. So:

* a third-party rule that declares it shards nothing gives the unsharded bytes under both
  profiles: exactly what the same layout without that axis gives, rank for rank;
* a rule written from scratch that declares what a built-in declares, and a renamed copy of
  each built-in rule, give the built-in's bytes under both profiles;
* the shard factors stay integers on every rank (a mixture-of-experts rank's weighted divisor
  is its own field, never a float in an integer factor).
"""

from __future__ import annotations

import math

import attrs
import pytest

from mlsysim_core import ShardingEffect, ShardingRuleSpec, TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.plan import Placement
from mlsysim_core.registry import PluginInfo
from mlsysim_core.specs import _SHARD_FIELDS

THIRD = PluginInfo(name="acme_rules", distribution="acme-rules", version="1.0")
_BUILTIN_PM = PluginManager.from_environment(autoload=False, blocked=())
_BUILTIN = TrainingMemoryModel(plugin_manager=_BUILTIN_PM)
PROFILES = ("reference", "measured")


def _world(*plugins) -> TrainingMemoryModel:
    """The built-ins plus third-party plugin objects."""
    pm = PluginManager()
    for name, plugin in sorted(_BUILTIN_PM.list_name_plugin()):
        pm.register(plugin, name=name, info=_BUILTIN_PM.info(name))
    for i, plugin in enumerate(plugins):
        info = PluginInfo(name=f"{THIRD.name}{i}", distribution=THIRD.distribution, version=THIRD.version)
        pm.register(plugin, name=info.name, info=info)
    pm.check()
    return TrainingMemoryModel(plugin_manager=pm)


class _Rules:
    """A plugin registering the given sharding rules."""

    def __init__(self, *specs):
        self.specs = specs

    @hookimpl
    def mlsysim_sharding_rules(self):
        return list(self.specs)


def _nothing(plan, options):
    return ShardingEffect()


NOTHING = {axis: ShardingRuleSpec(name=f"acme.replicated-{axis}", axis=axis, apply=_nothing,
                                  description="splits nothing: every rank holds the whole model")
           for axis in ("tp", "cp", "pp", "ep")}
_NOTHING_WORLD = _world(_Rules(*NOTHING.values()))


def _bytes(result) -> dict:
    """Every number of a result that is bytes on a rank (the rank classes' names and counts aside)."""
    out = {k: getattr(result, k) for k in ("total_memory", "weights", "gradients", "optimizer_state",
                                           "activations", "communication_buffers", "runtime_overheads",
                                           "host_memory", "peak_phase")}
    out["terms"] = sorted((t.component, t.nbytes, t.phases) for t in result.terms)
    return out


# --- a rule that shards nothing: the unsharded bytes --------------------------------------------------

# (model, layout with the axis, the same layout without it), batch 16 x 2048 tokens; the
# data-parallel rule shards over dp x cp, so a cp case keeps ZeRO-0 (its DDP buckets exist either way).
UNSHARDED = [
    ("tp", "llama3-8b", dict(tp_size=2, dp_size=2, zero_stage=1), dict(dp_size=2, zero_stage=1)),
    ("tp", "llama3-8b", dict(tp_size=4, dp_size=2, zero_stage=3, sequence_parallel=True),
     dict(dp_size=2, zero_stage=3)),
    ("tp", "qwen3-8b", dict(tp_size=2, pp_size=2, dp_size=2, gradient_accumulation_steps=2),
     dict(pp_size=2, dp_size=2, gradient_accumulation_steps=2)),
    ("tp", "mixtral-8x7b", dict(tp_size=2, ep_size=2, dp_size=2, zero_stage=1),
     dict(ep_size=2, dp_size=2, zero_stage=1)),
    ("pp", "llama3-8b", dict(pp_size=4, dp_size=2, gradient_accumulation_steps=4),
     dict(dp_size=2, gradient_accumulation_steps=4)),
    ("pp", "gpt2", dict(pp_size=2, dp_size=2, gradient_accumulation_steps=2),
     dict(dp_size=2, gradient_accumulation_steps=2)),
    ("cp", "llama3-8b", dict(cp_size=2, dp_size=2), dict(dp_size=2)),
    ("cp", "llama3-8b", dict(cp_size=2, tp_size=2, dp_size=2, sequence_parallel=True),
     dict(tp_size=2, dp_size=2, sequence_parallel=True)),
    ("ep", "mixtral-8x7b", dict(ep_size=2, dp_size=2), dict(dp_size=2)),
]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("axis", "model", "layout", "without"), UNSHARDED,
                         ids=[f"{a}-{m}-{'-'.join(f'{k}{v}' for k, v in lay.items())}" for a, m, lay, _ in UNSHARDED])
def test_a_rule_that_shards_nothing_gives_the_unsharded_bytes(profile, axis, model, layout, without):
    kw = dict(profile=profile, precision="bf16", optimizer="adamw")
    s = 1024 if model == "gpt2" else 2048
    nothing = _NOTHING_WORLD.solve(model, "h100", 16, s, sharding_rules={axis: NOTHING[axis].name}, **kw, **layout)
    builtin = _BUILTIN.solve(model, "h100", 16, s, **kw, **layout)
    unsplit = _BUILTIN.solve(model, "h100", 16, s, **kw, **without)
    assert nothing.selected[f"{axis}_rule"] == NOTHING[axis].name
    if axis != "ep" or profile == "measured":      # (the reference's ep rule spreads every parameter)
        assert nothing.weights >= builtin.weights
    assert nothing.total_memory > builtin.total_memory, (nothing.total_memory / 1e9, builtin.total_memory / 1e9)
    if profile == "measured" and not (model == "mixtral-8x7b" and axis == "tp"):
        # Rank for rank, the bytes of the layout without that axis (the ranks' count aside).
        # (Not with experts beside a tp rule that replicates: its tp ranks are devices that hold the
        # same experts, so the experts' data-parallel group differs from the layout without them.)
        assert _bytes(nothing) == _bytes(unsplit)
        assert [(r.layers, r.in_flight) for r in nothing.ranks] == [(r.layers, r.in_flight) for r in unsplit.ranks]
    elif profile == "measured":
        assert nothing.weights == unsplit.weights
    else:
        assert nothing.weights == unsplit.weights and nothing.gradients == unsplit.gradients
        assert nothing.optimizer_state == unsplit.optimizer_state


# --- rules written from scratch, declaring what the built-ins declare --------------------------------------

def _acme_tp(plan, options):
    t = plan.tp_size
    return ShardingEffect(parameter_shards=t, tensor_shards=t,
                          activation_shards=t if t > 1 and plan.sequence_parallel else 1)


def _acme_pp(plan, options):
    # (its send and receive buffers are what the built-in's are: a rule's own terms, not the split)
    from mlsysim_plugins import pipeline_parallel
    p = plan.pp_size
    return ShardingEffect(parameter_shards=p, pipeline_stages=p, layers_per_stage=math.ceil(plan.model.layers / p),
                          buffer_terms=pipeline_parallel.apply(plan, options).buffer_terms)


def _acme_ep(plan, options):
    from mlsysim_plugins import expert_parallel
    return ShardingEffect(parameter_shards=plan.ep_size, expert_shards=plan.ep_size,
                          notes=expert_parallel.apply(plan, options).notes)


def _acme_cp(plan, options):
    # (its ring-attention buffers are what the built-in's are: a rule's own terms, not the split)
    from mlsysim_plugins import context_parallel
    ring = context_parallel.apply(plan, options).buffer_terms
    return ShardingEffect(activation_shards=plan.cp_size, sequence_shards=plan.cp_size, buffer_terms=ring)


SCRATCH = {"tp": _acme_tp, "pp": _acme_pp, "ep": _acme_ep, "cp": _acme_cp}
def _all_to_all(plan, placement, options):      # the experts' dispatch and combine buffers, as the built-in's
    from mlsysim_plugins.measured import buffers
    return buffers.expert_all_to_all(plan, placement)


_SCRATCH_WORLD = _world(_Rules(*(ShardingRuleSpec(name=f"acme.{axis}", axis=axis, apply=apply,
                                                  extensions={"measured.buffer_terms": _all_to_all if axis == "ep" else None})
                                 for axis, apply in SCRATCH.items())))

LAYOUTS = [
    ("llama3-8b", dict(tp_size=2, dp_size=2, zero_stage=1)),
    ("llama3-8b", dict(tp_size=4, cp_size=2, dp_size=2, zero_stage=2, sequence_parallel=True)),
    ("llama3-8b", dict(pp_size=4, dp_size=2, gradient_accumulation_steps=8, activation_checkpointing="full")),
    ("llama3-8b", dict(tp_size=2, pp_size=2, dp_size=2, data_parallel="fsdp", gradient_accumulation_steps=4)),
    ("gemma-2-2b", dict(tp_size=2, cp_size=2, activation_checkpointing="full")),
    ("mixtral-8x7b", dict(ep_size=4, tp_size=2, dp_size=4, zero_stage=1)),
    ("mixtral-8x7b", dict(ep_size=2, dp_size=4, data_parallel="fsdp", expert_tp_size=2)),
    ("deepseek-v2-lite", dict(ep_size=2, pp_size=3, dp_size=2, gradient_accumulation_steps=3)),
]
_LAYOUT_IDS = [m + "-" + "-".join(k.split("_")[0] + str(v) for k, v in lay.items()) for m, lay in LAYOUTS]


def _same(a, b) -> None:
    assert _bytes(a) == _bytes(b)
    assert [(r.name, r.stages, r.ranks, r.layers, r.in_flight, r.total_memory) for r in a.ranks] == \
        [(r.name, r.stages, r.ranks, r.layers, r.in_flight, r.total_memory) for r in b.ranks]


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("model", "layout"), LAYOUTS, ids=_LAYOUT_IDS)
def test_rules_written_from_scratch_give_the_builtins_bytes(profile, model, layout):
    kw = dict(profile=profile, precision="bf16", optimizer="adamw", **layout)
    if profile == "reference":
        kw.pop("expert_tp_size", None)
    want = _BUILTIN.solve(model, "h100", 48, 2048, **kw)
    got = _SCRATCH_WORLD.solve(model, "h100", 48, 2048, sharding_rules={axis: f"acme.{axis}" for axis in SCRATCH},
                               **kw)
    assert {got.selected[f"{axis}_rule"] for axis in SCRATCH} == {f"acme.{axis}" for axis in SCRATCH}
    _same(want, got)


RULES = ["tp", "cp", "cp-ulysses", "pp", "ep", "zero0", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hsdp"]


# --- renamed copies of every built-in rule ------------------------------------------------------------

RULES = {"tp": "tp", "cp": "cp", "cp-ulysses": "cp", "pp": "pp", "ep": "ep", "zero0": "dp", "zero1": "dp",
         "zero2": "dp", "zero3": "dp", "fsdp": "dp", "fsdp-grad-op": "dp", "hsdp": "dp"}


@pytest.mark.parametrize("name", list(RULES))
def test_a_renamed_copy_of_each_builtin_rule_gives_its_bytes(name):
    """The same spec under another name (a third party's registration): byte-identical under
    both profiles on every layout of LAYOUTS that uses its axis."""
    axis = RULES[name]
    copy = attrs.evolve(_BUILTIN_PM.registry.sharding_rules[name], name=f"acme.copy-{name}")
    world = _world(_Rules(copy))
    compared = 0
    for model, layout in LAYOUTS:
        if layout.get(f"{axis}_size", 1) < 2:
            continue
        for profile in PROFILES:
            kw = dict(profile=profile, precision="bf16", optimizer="adamw", **layout)
            if profile == "reference":
                kw.pop("expert_tp_size", None)
            if axis == "dp":
                kw.update(zero_stage=0, data_parallel=name)
                want = _BUILTIN.solve(model, "h100", 48, 2048, **kw)
                got = world.solve(model, "h100", 48, 2048, **{**kw, "data_parallel": copy.name})
            else:
                want = _BUILTIN.solve(model, "h100", 48, 2048, sharding_rules={axis: name}, **kw)
                got = world.solve(model, "h100", 48, 2048, sharding_rules={axis: copy.name}, **kw)
            _same(want, got)
            compared += 1
    assert compared >= 2


# --- integer factors stay integers ------------------------------------------------------------------------

class _Recorder:
    """A component-hook plugin that keeps every placement the measured physics sees."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def mlsysim_weight_terms(self, plan, placement):
        self.seen.append((plan.rank, placement))
        return []


@pytest.mark.parametrize(("model", "layout"), LAYOUTS, ids=_LAYOUT_IDS)
def test_the_shard_factors_stay_integers_on_every_rank(model, layout):
    recorder = _Recorder()
    world = _world(recorder)
    result = world.solve(model, "h100", 48, 2048, profile="measured", precision="bf16", optimizer="adamw",
                         include_plugins=["acme_rules0"], **layout)
    assert len(recorder.seen) == len(result.ranks) >= 1
    for rank, placement in recorder.seen:
        for field in _SHARD_FIELDS:
            value = getattr(placement, field)
            assert type(value) is int and value >= 1, (rank.name, field, value)
        assert placement.layers_per_stage == rank.layers and type(rank.layers) is int
        assert placement.tensor_shards == layout.get("tp_size", 1)
        assert placement.pipeline_stages == layout.get("pp_size", 1)
        assert placement.expert_shards == layout.get("ep_size", 1)
        assert placement.sequence_shards == layout.get("cp_size", 1)


def test_a_mixture_of_experts_rank_keeps_its_weighted_divisor_apart():
    """Experts shard over their own data-parallel group: the rank's weighted divisor is a field of
    its own (``RankPlacement``), the rules' factors stay the integers they multiplied to."""
    from mlsysim_plugins.measured.parallel import RankPlacement, optimizer_state_divisor
    recorder = _Recorder()
    _world(recorder).solve("mixtral-8x7b", "h100", 48, 2048, profile="measured", precision="bf16",
                           optimizer="adamw", ep_size=4, tp_size=2, dp_size=4, zero_stage=1,
                           include_plugins=["acme_rules0"])
    (_, placement), = recorder.seen
    assert type(placement) is RankPlacement
    assert placement.optimizer_state_shards == 4
    assert 1 < optimizer_state_divisor(placement) < 4     # experts over ep x etp: fewer replicas to shard over


# --- the declarations -----------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["tensor_shards", "sequence_shards", "expert_shards", "pipeline_stages"])
@pytest.mark.parametrize("value", [0, 2.0, True, "2"])
def test_a_declared_split_is_an_int_of_at_least_one(field, value):
    with pytest.raises(ValueError, match=field):
        ShardingEffect(**{field: value})


def test_the_placement_multiplies_the_declarations():
    """The solver multiplies each declaration over the rules (two rules both splitting the
    matrices: their product), and names the rules that made it."""
    def half_tp(plan, options):
        return ShardingEffect(parameter_shards=plan.tp_size, tensor_shards=plan.tp_size)

    def also_splits_matrices(plan, options):       # an ep rule that also splits every matrix
        return ShardingEffect(tensor_shards=2)

    recorder = _Recorder()
    world = _world(_Rules(ShardingRuleSpec(name="acme.tp", axis="tp", apply=half_tp),
                          ShardingRuleSpec(name="acme.odd-ep", axis="ep", apply=also_splits_matrices)), recorder)
    world.solve("llama3-8b", "h100", 16, 2048, profile="reference", tp_size=2, dp_size=2,
                sharding_rules={"tp": "acme.tp", "ep": "acme.odd-ep"}, include_plugins=["acme_rules1"])
    (_, placement), = recorder.seen
    assert placement.tensor_shards == 4 and type(placement.tensor_shards) is int
    assert placement.shard_sources["tensor_shards"] == ("acme.tp", "acme.odd-ep")
    assert isinstance(placement, Placement)
