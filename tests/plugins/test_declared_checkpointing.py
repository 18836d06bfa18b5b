"""Declared, not named (issue 24, item 1, checkpointing): the measured physics reads what the
selected ``CheckpointingSpec`` declares (``recomputes``: "nothing", "layers" or "part";
``recomputes_first_layer``), never ``plan.activation_checkpointing``. A third-party strategy
written as docs/writing-plugins.md shows, declaring what a built-in declares, gives the built-in's
bytes: whole-layer recompute as ``full``, no recompute as ``none``, a per-op policy as
``save-list`` / ``op-sac``; on gpt-oss-20b (whose eager masks and first-layer backward are
declaration-keyed terms), llama3-8b and a parallel layout, with the techniques whose physics
asks the declaration (optimizer in the backward, activation offload, checkpointed_layers).
"""

from __future__ import annotations

import functools
import json

import pytest

from mlsysim_core import (ACTIVATIONS, BACKWARD, FORWARD, CheckpointingSpec, MemoryTerm, TrainingMemoryModel,
                          hookimpl)
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.manager import PluginManager
from mlsysim_core.registry import PluginInfo
from mlsysim_plugins import checkpointing_policies
from mlsysim_plugins.measured import checkpointing, model


def _reference(per_token):
    """A reference-grade callable as docs/hooks.md shows (not compared here: the reference
    profile's physics has no declaration to read)."""
    def terms(plan, placement, options):
        s, b, h = plan.seq_len, plan.microbatch, plan.hidden_dim
        nbytes = placement.layers_per_stage * per_token * s * b * h * plan.bytes_per_value / 2
        return [MemoryTerm(component=ACTIVATIONS, label="stored activations", phases=(FORWARD, BACKWARD),
                           nbytes=nbytes / placement.activation_shards, formula=f"{per_token}*s*b*h per layer")]
    return terms


def _keep_everything(plan, placement, options):
    return model.layer_terms(plan, placement)


def _first_layer(plan):
    return True


class AcmeStrategies:
    """What a third party writes from docs/writing-plugins.md: each declares what it recomputes."""

    @hookimpl
    def mlsysim_checkpointing_strategies(self):
        return [
            CheckpointingSpec(name="acme.recompute-layers", description="whole-layer recompute",
                              activation_terms=_reference(2), recomputes="layers",
                              extensions={"measured.activation_terms": checkpointing.whole_layer_terms}),
            CheckpointingSpec(name="acme.keep-all", description="no recompute", requires_heads=True,
                              activation_terms=_reference(34), recomputes="nothing",
                              extensions={"measured.activation_terms": _keep_everything}),
            # A per-op policy on the library's per-op accounting (the default save list: mm, sdpa).
            CheckpointingSpec(name="acme.save-mm", description="per-op: saves mm and sdpa outputs",
                              activation_terms=_reference(22), recomputes="part",
                              recomputes_first_layer=_first_layer,
                              extensions={"measured.activation_terms": checkpointing_policies.per_op_terms}),
            CheckpointingSpec(name="acme.torchtitan", description="torchtitan's op SAC",
                              activation_terms=_reference(20), recomputes="part",
                              recomputes_first_layer=_first_layer,
                              extensions={"measured.activation_terms": functools.partial(
                                  checkpointing_policies.per_op_terms, policy="op-sac")}),
            # The same whole-layer accounting, undeclared (the default "part"): the host cannot know.
            CheckpointingSpec(name="acme.undeclared", description="whole-layer recompute, not declared",
                              activation_terms=_reference(2),
                              extensions={"measured.activation_terms": checkpointing.whole_layer_terms}),
        ]


ACME = PluginInfo(name="acme_checkpointing", distribution="acme-checkpointing", version="1.0")
SAME = {"acme.recompute-layers": "full", "acme.keep-all": "none", "acme.save-mm": "save-list",
        "acme.torchtitan": "op-sac"}


@functools.lru_cache(maxsize=None)
def _solver() -> TrainingMemoryModel:
    builtins = PluginManager.from_environment(autoload=False, blocked=())
    pm = PluginManager()
    for name, plugin in sorted(builtins.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=name, info=builtins.info(name))
    pm.register(AcmeStrategies(), name=ACME.name, info=ACME)
    pm.check()
    return TrainingMemoryModel(plugin_manager=pm)


def _normal(result, name: str, builtin: str) -> str:
    """The result as JSON with only the name and the providing plugin taken out: every number,
    phase, rank, note and term size stays."""
    d = result.to_dict()
    for key in ("plugin_sources", "constraint_trace"):
        d.pop(key, None)

    def strip(terms):
        return sorted(json.dumps({k: v for k, v in t.items() if k != "source"}, sort_keys=True) for t in terms)

    d["terms"] = strip(d["terms"])
    for rank in d.get("ranks") or ():
        rank["terms"] = strip(rank["terms"])
    return json.dumps(d, sort_keys=True).replace(name, builtin)


# (model, batch, seq, solve keywords): one device (gpt-oss-20b: eager masks and the first layer's
# backward; llama3-8b: the one-device backward's end), a parallel layout, and the techniques.
LONG = dict(precision="bf16", optimizer="sgd", profile="measured")
CASES = {
    "gpt-oss-20b": ("gpt-oss-20b", 1, 8192, LONG),
    "gpt-oss-20b-adamw": ("gpt-oss-20b", 2, 2048, dict(LONG, optimizer="adamw")),
    "llama3-8b": ("llama3-8b", 1, 8192, LONG),
    "llama3-8b-amp": ("llama3-8b", 4, 4096, dict(profile="measured")),
    "llama3-8b-tp2-pp2-dp2": ("llama3-8b", 8, 4096, dict(LONG, tp_size=2, pp_size=2, dp_size=2)),
    "llama3-8b-dp4-zero3": ("llama3-8b", 8, 4096, dict(LONG, dp_size=4, zero_stage=3)),
    "llama3-8b-optimizer-in-backward": ("llama3-8b", 2, 4096, dict(LONG, optimizer="adamw",
                                                                   optimizer_in_backward=True)),
    "llama3-8b-offload": ("llama3-8b", 1, 4096, dict(profile="measured", precision="fp32", regime="fp32",
                                                     activation_offload="save_on_cpu")),
}


def _solve(name, case):
    m, batch, seq, kw = CASES[case]
    return _solver().solve(m, "h100", batch, seq, activation_checkpointing=name, **kw)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(SAME))
def test_a_declared_third_party_strategy_gives_the_builtins_bytes(name, case):
    builtin = SAME[name]
    if builtin in ("save-list", "op-sac") and case.startswith("gpt-oss"):     # (gpt-oss declares no op outputs)
        with pytest.raises(InvalidInputError) as builtin_err:
            _solve(builtin, case)
        with pytest.raises(type(builtin_err.value)):
            _solve(name, case)
        return
    mine, theirs = _solve(name, case), _solve(builtin, case)
    assert _normal(mine, name, builtin) == _normal(theirs, builtin, builtin)


@pytest.mark.parametrize("m", ["gpt-oss-20b", "llama3-8b"])
@pytest.mark.parametrize("blocks", [0, 5, 12])
def test_checkpointed_layers_follows_the_declaration(m, blocks):
    kw = dict(LONG, checkpointed_layers=blocks)
    mine = _solver().solve(m, "h100", 1, 8192, activation_checkpointing="acme.recompute-layers", **kw)
    theirs = _solver().solve(m, "h100", 1, 8192, activation_checkpointing="full", **kw)
    assert _normal(mine, "acme.recompute-layers", "full") == _normal(theirs, "full", "full")


@pytest.mark.parametrize("name", ["acme.keep-all", "acme.save-mm", "acme.undeclared", "selective"])
def test_checkpointed_layers_is_refused_unless_whole_layers_are_declared(name):
    with pytest.raises(InvalidInputError, match="recomputes='layers'"):
        _solver().solve("llama3-8b", "h100", 1, 2048, activation_checkpointing=name, checkpointed_layers=4, **LONG)


def test_the_declaration_is_what_the_physics_reads():
    """The same callables, undeclared (the default "part"), lose what whole-layer recompute adds
    outside the strategy's own terms: on gpt-oss-20b the eager masks the checkpointed layers keep
    and layer 0's late gradients."""
    declared = _solve("acme.recompute-layers", "gpt-oss-20b")
    undeclared = _solve("acme.undeclared", "gpt-oss-20b")
    full = _solve("full", "gpt-oss-20b")
    assert declared.total_memory == full.total_memory
    assert undeclared.total_memory != full.total_memory
    assert not any("eager attention masks" in t.label for t in undeclared.terms)
    assert any("eager attention masks" in t.label for t in declared.terms)
    # the figures docs/writing-plugins.md quotes
    assert (round(undeclared.total_memory / 1e9, 1), round(full.total_memory / 1e9, 1)) == (208.3, 204.9)


def test_builtins_declare_what_they_recompute():
    registry = PluginManager.from_environment(autoload=False, blocked=()).registry
    declared = {name: spec.recomputes for name, spec in registry.checkpointing.items()}
    assert declared == {"none": "nothing", "full": "layers", "selective": "part", "op-sac": "part",
                        "save-list": "part", "every-k": "part", "mlp-only": "part", "attention-only": "part"}
    first = {name: spec.recomputes_first_layer is not None for name, spec in registry.checkpointing.items()}
    assert first == {"none": False, "full": False, "selective": False, "op-sac": True, "save-list": True,
                     "every-k": True, "mlp-only": True, "attention-only": True}


def test_an_unknown_declaration_is_refused():
    with pytest.raises(ValueError, match="recomputes='everything'"):
        CheckpointingSpec(name="acme.bad", activation_terms=_reference(2), recomputes="everything")


def test_the_step_time_reads_the_declared_share():
    """technique_fit's checkpointing step time: a built-in's FLOPs as before, a third party's
    declared share of the forward (not a built-in's guessed from its name)."""
    from mlsysim_core.inverse import prepared_plan as _prepared
    solver = _solver()
    kw = dict(precision="bf16", optimizer="sgd", profile="measured")
    full = _prepared(solver, "llama3-8b", "h100", 1, 4096, dict(kw, activation_checkpointing="full"))
    flops, how = checkpointing_policies.recomputed_flops(full)
    assert flops == checkpointing_policies.recomputed_flops(full, "full")[0] > 0 and "layers' forward" in how
    assert checkpointing_policies.recompute_share(full) == pytest.approx(1.0)
    mine = _prepared(solver, "llama3-8b", "h100", 1, 4096, dict(kw, activation_checkpointing="acme.recompute-layers"))
    assert checkpointing_policies.recomputed_flops(mine) == (0.0, "no recompute share declared "
                                                             "(CheckpointingSpec.recompute is None)")


class _IgnoresBlocks:
    @hookimpl
    def mlsysim_checkpointing_strategies(self):
        return [CheckpointingSpec(name="acme.layers-ignoring-blocks", recomputes="layers",
                                  activation_terms=_reference(2),
                                  extensions={"measured.activation_terms": lambda plan, placement, options:
                                              model.layer_terms(plan, placement, kept_layers=0)})]


def test_the_conformance_kit_checks_a_whole_layer_declaration():
    """A strategy declaring recomputes='layers' whose terms ignore checkpointed_layers is flagged;
    the built-in full, whose terms honour it, conforms."""
    from mlsysim_core.testing import _declared_checkpointing
    builtins = PluginManager.from_environment(autoload=False, blocked=())
    pm = PluginManager()
    for name, plugin in sorted(builtins.list_name_plugin()):
        if plugin is not None:
            pm.register(plugin, name=name, info=builtins.info(name))
    bad = PluginInfo(name="acme_bad", distribution="acme-bad", version="1.0")
    pm.register(_IgnoresBlocks(), name=bad.name, info=bad)
    solver = TrainingMemoryModel(plugin_manager=pm)
    failures = _declared_checkpointing("acme_bad", ["acme.layers-ignoring-blocks"], pm.registry, solver, ["measured"])
    assert len(failures) == 1 and "checkpointed_layers=0" in failures[0]
    assert _declared_checkpointing("full_checkpointing", ["full"], pm.registry, solver, ["measured"]) == []
    assert _declared_checkpointing(ACME.name, sorted(SAME), _solver().registry, _solver(), ["measured"]) == []
