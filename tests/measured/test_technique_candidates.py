"""``fit techniques``' candidates come from what is registered, by declaration (issue 24 item 3).

- **Checkpointing**: every registered strategy that declares ``extensions["measured.saves_rank"]`` (a
  positive number, the larger the more it saves), ordered by (rank, name); the built-ins declare selective
  1, attention-only 2, mlp-only 3, every-k 4, op-sac 5, full 6, so their ladder is the one the name table
  gave. A third party's copy is offered and priced as the built-in; a blocked built-in is not offered.
- **Low-bit optimizer**: every registered optimizer whose ``OptimizerStep`` declares ``quantized_moments``
  and an ``update``, but one declaring ``not_offered``, ordered by ``moment_traffic`` (the most first), then
  name; its label is its description up to the first colon, its caveat its moments' bits.
"""

from __future__ import annotations

import json

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import PluginContractError
from mlsysim_core.manager import PluginManager
from mlsysim_core.registry import PluginInfo
from mlsysim_plugins.measured.builtin_techniques import TECHNIQUES
from mlsysim_plugins.measured.optimizer_step import OptimizerStep
from mlsysim_plugins.measured.technique_fit import fit_techniques
from mlsysim_plugins.measured.techniques import Candidate, Technique

from worldtools import BUILTIN_PM, world

ACME = PluginInfo(name="acme_ladder", distribution="acme-ladder", version="1.0")
CHECKPOINTING = next(t for t in TECHNIQUES if t.name == "activation_checkpointing")
LOW_BIT = next(t for t in TECHNIQUES if t.name == "low_bit_optimizer")
REGISTRY = BUILTIN_PM.registry
POLICIES = ("attention-only", "every-k", "mlp-only", "op-sac", "save-list")     # checkpointing_policies.py's
LOW_BITS = ("adamw-8bit-bnb", "adamw-8bit-torchao", "adamw-4bit-torchao")
CAVEAT = "{} block-quantized moments: convergence may differ from fp32 AdamW"

# The docs' run (docs/profiles.md): Llama 3.2 3B, b = 2, s = 4096, pure bf16 AdamW, 61.3 GiB on a 40 GiB A100.
MODEL, GPU = "meta-llama/llama-3.2-3b", "nvidia/a100-sxm4-40gb"
RUN = dict(precision="bf16", optimizer="adamw", activation_checkpointing="none", regime="bf16")


def _ladder(solver, **kwargs) -> str:
    found = fit_techniques(MODEL, GPU, 2, 4096, solver=solver, hardware_flops=312e12, host_link_bytes_per_s=32e9,
                           **{**RUN, **kwargs})
    return json.dumps(found.to_dict(), default=str)


def _values(technique, registry) -> list:
    return [c.value for c in technique.candidates_in(registry)]


def test_the_builtins_candidates_in_their_declared_order():
    assert CHECKPOINTING.candidates_in(REGISTRY) == tuple(
        Candidate(n, f"activation checkpointing: {n}")
        for n in ("selective", "attention-only", "mlp-only", "every-k", "op-sac", "full"))
    # moment_traffic 4, 4, 2 B per parameter: the 8-bit ones (by name), then the 4-bit one
    assert LOW_BIT.candidates_in(REGISTRY) == (
        Candidate("adamw-8bit-bnb", "bitsandbytes AdamW8bit", CAVEAT.format("8-bit")),
        Candidate("adamw-8bit-torchao", "torchao AdamW8bit", CAVEAT.format("8-bit")),
        Candidate("adamw-4bit-torchao", "torchao AdamW4bit", CAVEAT.format("4-bit")))


def test_third_party_checkpointing_policies_are_offered_and_priced_as_the_builtins():
    """checkpointing_policies.py's five strategies removed, registered by a third party as ``acme-<name>``
    (the same declarations): the ladder is the built-ins', byte for byte, the names written back."""
    copies = [attrs.evolve(REGISTRY.checkpointing[n], name=f"acme-{n}") for n in POLICIES]
    solver = world("mlsysim_checkpointing_strategies", copies, info=ACME, replace="checkpointing_policies")
    assert _values(CHECKPOINTING, solver.registry) == [
        "selective", "acme-attention-only", "acme-mlp-only", "acme-every-k", "acme-op-sac", "full"]
    text = _ladder(solver)
    assert "acme-op-sac" in text
    for name in POLICIES:
        text = text.replace(f"acme-{name}", name)
    assert text == _ladder(TrainingMemoryModel(plugin_manager=BUILTIN_PM))


def test_a_third_party_policy_declaring_a_rank_of_its_own_sits_there():
    """op-SAC's declarations at rank 4.5 (between every-k and op-sac), beside the built-ins."""
    spec = REGISTRY.checkpointing["op-sac"]
    mine = attrs.evolve(spec, name="acme.sac", extensions={**spec.extensions, "measured.saves_rank": 4.5})
    solver = world("mlsysim_checkpointing_strategies", [mine], info=ACME)
    assert _values(CHECKPOINTING, solver.registry) == [
        "selective", "attention-only", "mlp-only", "every-k", "acme.sac", "op-sac", "full"]
    offered = {c.value for c in CHECKPOINTING.candidates_in(solver.registry)
               if CHECKPOINTING.is_offered(c.value, {"activation_checkpointing": "acme.sac"}, solver.registry)}
    assert offered == {"op-sac", "full"}


def test_third_party_low_bit_optimizers_are_offered_and_priced_as_the_builtins():
    """lowbit_optimizers.py removed, its three offered optimizers registered by a third party under other
    names (``adamw-8bit-myvendor``, ...): the ladder is the built-ins', byte for byte, the names written back."""
    names = {"adamw-8bit-bnb": "adamw-8bit-myvendor-b", "adamw-8bit-torchao": "adamw-8bit-myvendor",
             "adamw-4bit-torchao": "adamw-4bit-myvendor"}
    copies = [attrs.evolve(REGISTRY.optimizers[n], name=new) for n, new in names.items()]
    solver = world("mlsysim_optimizers", copies, info=ACME, replace="lowbit_optimizers")
    assert _values(LOW_BIT, solver.registry) == ["adamw-8bit-myvendor", "adamw-8bit-myvendor-b",
                                                 "adamw-4bit-myvendor"]
    text = _ladder(solver)
    assert "adamw-8bit-myvendor-b" in text
    for old, new in names.items():
        text = text.replace(new, old)
    assert text == _ladder(TrainingMemoryModel(plugin_manager=BUILTIN_PM))


def test_a_third_party_low_bit_optimizer_is_labelled_and_ordered_by_what_it_declares():
    """Beside the built-ins: an 8-bit AdamW of its own (bitsandbytes' terms, its own description), a 2-bit
    one (moment_traffic 1 B: after the 4-bit), a Lion-update one (offered only in place of a Lion-update
    optimizer) and one declaring why it is not offered."""
    bnb = REGISTRY.optimizers["adamw-8bit-bnb"]
    step = bnb.step
    mine = [attrs.evolve(bnb, name="adamw-8bit-myvendor", description="myvendor AdamW8bit: fused, 8-bit moments"),
            attrs.evolve(bnb, name="aa-adamw-2bit", description="",
                         step=attrs.evolve(step, quantized_moments="2-bit", moment_traffic=1.0)),
            attrs.evolve(bnb, name="lion-8bit-myvendor", description="myvendor Lion8bit",
                         step=attrs.evolve(step, update="lion")),
            attrs.evolve(bnb, name="adamw-8bit-hidden", step=attrs.evolve(step, not_offered="a variant"))]
    solver = world("mlsysim_optimizers", mine, info=ACME)
    found = LOW_BIT.candidates_in(solver.registry)
    assert [c.value for c in found] == ["adamw-8bit-bnb", "adamw-8bit-myvendor", "adamw-8bit-torchao",
                                        "lion-8bit-myvendor", "adamw-4bit-torchao", "aa-adamw-2bit"]
    by = {c.value: c for c in found}
    assert by["adamw-8bit-myvendor"] == Candidate("adamw-8bit-myvendor", "myvendor AdamW8bit", CAVEAT.format("8-bit"))
    assert by["aa-adamw-2bit"] == Candidate("aa-adamw-2bit", "aa-adamw-2bit", CAVEAT.format("2-bit"))
    assert by["lion-8bit-myvendor"].caveat == "8-bit block-quantized moments: convergence may differ from fp32 lion"
    offered = {c.value for c in found if LOW_BIT.is_offered(c.value, {"optimizer": "adamw"}, solver.registry)}
    assert offered == {"adamw-8bit-bnb", "adamw-8bit-myvendor", "adamw-8bit-torchao", "adamw-4bit-torchao",
                       "aa-adamw-2bit"}
    lion = attrs.evolve(REGISTRY.optimizers["lion"], name="acme.lion", step=OptimizerStep(moments=1, update="lion"))
    with_lion = world("mlsysim_optimizers", [*mine, lion], info=ACME)
    assert {c.value for c in LOW_BIT.candidates_in(with_lion.registry)
            if LOW_BIT.is_offered(c.value, {"optimizer": "acme.lion"}, with_lion.registry)} == {"lion-8bit-myvendor"}


def _blocked(name: str) -> TrainingMemoryModel:
    return TrainingMemoryModel(plugin_manager=PluginManager.from_environment(autoload=False, blocked=(name,)))


def test_a_blocked_builtin_is_not_offered():
    """Blocked through pluggy, checkpointing_policies.py's strategies are not offered (the name table offered
    attention-only, mlp-only, every-k and op-sac, which no longer resolved: 270 combinations searched, 114
    refused, where now 202 and 46); lowbit_optimizers.py blocked, no low-bit optimizer is (adam-8bit, left,
    declares why not)."""
    solver = _blocked("checkpointing_policies")
    assert _values(CHECKPOINTING, solver.registry) == ["selective", "full"]
    text = _ladder(solver)
    assert json.loads(text)["fits"] and not any(name in text for name in POLICIES)
    solver = _blocked("lowbit_optimizers")
    assert "adam-8bit" in solver.registry.optimizers and _values(LOW_BIT, solver.registry) == []
    text = _ladder(solver)
    assert json.loads(text)["fits"] and not any(name in text for name in LOW_BITS)


@pytest.mark.parametrize("rank", ["high", 0, -1.0, True, float("nan"), float("inf")])
def test_a_strategy_declaring_a_bad_rank_is_refused_naming_it(rank):
    spec = REGISTRY.checkpointing["op-sac"]
    bad = attrs.evolve(spec, name="acme.bad", extensions={**spec.extensions, "measured.saves_rank": rank})
    solver = world("mlsysim_checkpointing_strategies", [bad], info=ACME)
    with pytest.raises(PluginContractError, match=r"checkpointing strategy 'acme.bad' declares "
                                                  r"extensions\['measured.saves_rank'\] = .*; expected a positive number"):
        CHECKPOINTING.candidates_in(solver.registry)


def test_candidates_a_list_or_a_callable_of_the_registry():
    listed = Technique(name="acme.listed", keyword="x", candidates=[Candidate(1, "one")])
    assert listed.candidates_in(None) == (Candidate(1, "one"),) and listed.ladder_keyword == "x"
    seen = []
    called = Technique(name="acme.called", keyword="x",
                       candidates=lambda registry: seen.append(registry) or [Candidate(2, "two")])
    assert called.candidates_in(REGISTRY) == (Candidate(2, "two"),) and seen == [REGISTRY]
    assert called.ladder_keyword == "x"
    wrong = Technique(name="acme.wrong", keyword="x", candidates=lambda registry: [2])
    with pytest.raises(PluginContractError, match=r"technique 'acme.wrong': candidates\(registry\) returned 2; "
                                                  r"expected Candidate\(value, label, caveat\) items"):
        wrong.candidates_in(REGISTRY)
