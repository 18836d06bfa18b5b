"""Declared, not named (issue 24, item 1): attention kernels, optimizers and architecture families.

The measured profile reads what a registered object declares (``AttentionKernel.computes``,
``OptimizerSpec.step``, ``ArchitectureFamily.pack_hook_copies`` and ``fallback``), never its
name or identity. So a third party that declares what a built-in declares, under a name of its
own, gets the built-in's bytes, to the byte; one that declares nothing is treated as what it
declares (refused, or costed without the built-in's special cases); and blocking the built-in
families leaves no family behind them.
"""

from __future__ import annotations

import functools

import attrs
import pytest

from mlsysim_core import OptimizerSpec, TrainingMemoryModel, hookimpl
from mlsysim_core.errors import NotModelledError
from mlsysim_core.manager import PluginManager
from mlsysim_plugins import adam
from mlsysim_plugins.measured import architectures
from mlsysim_plugins.measured.families import BUILTIN_FAMILIES
from mlsysim_plugins.measured.kernels import EAGER, SDPA, AttentionKernel
from mlsysim_plugins.measured.optimizer_step import OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD, OptimizerStep

MODELS = ("llama3-8b", "gemma-3-1b-it", "gpt-oss-20b", "deepseek-v2-lite")

# What a third party writes from the docs: its own objects, under its own names, declaring what the
# built-ins declare (new objects, not the built-ins renamed).
MY_SDPA = AttentionKernel(name="acme.fused-attention", description="torch SDPA, as acme runs it",
                          layouts=dict(SDPA.layouts), computes="sdpa")
MY_EAGER = AttentionKernel(name="acme.math-attention", description="matmul + softmax",
                           layouts=dict(EAGER.layouts), computes="eager")
UNDECLARED_SDPA = AttentionKernel(name="acme.undeclared", description="sdpa's formulas, nothing declared",
                                  layouts=dict(SDPA.layouts))
MY_ADAMW = OptimizerSpec(
    name="acme.adamw", description="AdamW, as acme declares it",
    state_terms=functools.partial(adam.state_terms, name="adamw"),
    extensions={"measured.state_terms": functools.partial(adam.measured_state_terms, name="adamw")},
    step=OptimizerStep(moments=2, step_counters=True, foreach=1, loop_current=2, loop_previous=1,
                       measured_with=(OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD)))
UNDECLARED_ADAMW = attrs.evolve(MY_ADAMW, name="acme.adamw-undeclared", step=None)


class _Acme:
    """acme's plugin: kernels, optimizers and (optionally) families of its own."""

    def __init__(self, families=()):
        self.families = list(families)

    @hookimpl
    def mlsysim_measured_attention_kernels(self):
        return [MY_SDPA, MY_EAGER, UNDECLARED_SDPA]

    @hookimpl
    def mlsysim_optimizers(self):
        return [MY_ADAMW, UNDECLARED_ADAMW]

    @hookimpl
    def mlsysim_measured_architectures(self):
        return self.families


def _solver(blocked=(), families=()) -> TrainingMemoryModel:
    pm = PluginManager.from_environment(autoload=False, blocked=list(blocked))
    pm.register(_Acme(families), name="acme_declared")
    return TrainingMemoryModel("measured", plugin_manager=pm)


BUILTIN = TrainingMemoryModel("measured", plugin_manager=PluginManager.from_environment(autoload=False))
ACME = _solver()
# Every built-in family under another name, the built-in families' plugins blocked: a family is
# chosen by its claim and, for what no family claims, by its declared fallback.
RENAMED_FAMILIES = [attrs.evolve(f, name=f"acme.{f.name}")
                    for f in (*BUILTIN_FAMILIES.values(), *architectures.mlsysim_measured_architectures())]
ACME_FAMILIES = _solver(blocked=("measured_families", "measured_architectures"), families=RENAMED_FAMILIES)


def _bytes(result, rename=("acme.adamw", "adamw")) -> tuple:
    """Every number of a result that says how much memory: the totals, each rank's peak, and every
    term (component, label, bytes, phases, tier) as a set (a label naming the optimizer selected
    names the built-in's name)."""
    terms = sorted((t.component, t.label.replace(*rename), t.nbytes, tuple(t.phases), t.tier) for t in result.terms)
    ranks = tuple((k.name, k.total_memory) for k in (result.ranks or ()))
    return result.total_memory, result.host_memory, ranks, tuple(terms)


def _solve(solver, model, **kw):
    base = dict(optimizer="adamw", runtime_overheads=False)
    return solver.solve(model, "h100", 1, 1024, **{**base, **kw})


# model, keywords: the default, eager attention, full and per-op checkpointing, optimizer in the
# backward (one device, fp32: no master copy), activation offload (fp32, SDPA: Llama's exact count)
OPTIONS = [
    dict(),
    dict(precision="bf16", activation_checkpointing="full"),
    dict(precision="fp32", optimizer_in_backward=True, optimizer_impl="for-loop"),
    dict(precision="fp32", optimizer_in_backward=True, optimizer_impl="foreach", activation_checkpointing="full"),
    dict(precision="fp32", activation_offload="save_on_cpu", activation_checkpointing="none"),
    dict(precision="fp32", activation_offload="torchtune", activation_checkpointing="full"),
]


def _outcome(solver, model, **kw):
    try:
        return ("ok", _bytes(_solve(solver, model, **kw)))
    except NotModelledError as err:
        return ("refused", type(err).__name__)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_a_kernel_declaring_what_sdpa_declares_gets_its_bytes(model, options):
    want = _outcome(BUILTIN, model, attention="sdpa", **options)
    assert _outcome(ACME, model, attention="acme.fused-attention", **options) == want


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("options", [dict(), dict(precision="bf16", activation_checkpointing="full"),
                                     dict(precision="fp32", optimizer_in_backward=True)],
                         ids=("default", "full", "oib"))
def test_a_kernel_declaring_what_eager_declares_gets_its_bytes(model, options):
    want = _outcome(BUILTIN, model, attention="eager", **options)
    assert want[0] == "ok"
    assert _outcome(ACME, model, attention="acme.math-attention", **options) == want


@pytest.mark.parametrize("policy", ["op-sac", "save-list"])
@pytest.mark.parametrize(("builtin", "mine"), [("sdpa", "acme.fused-attention"), ("eager", "acme.math-attention")])
def test_per_op_policies_read_what_the_kernel_computes(policy, builtin, mine):
    want = _solve(BUILTIN, "llama3-8b", precision="bf16", activation_checkpointing=policy, attention=builtin)
    got = _solve(ACME, "llama3-8b", precision="bf16", activation_checkpointing=policy, attention=mine)
    assert _bytes(got) == _bytes(want)


def test_the_declaration_is_what_counts_not_the_formulas():
    """sdpa's formulas with nothing declared: DeepSeek's MLA and the per-op policies refuse the
    kernel; activation offload no longer counts Llama's exact per-save copies."""
    with pytest.raises(NotModelledError, match="acme.undeclared"):
        _solve(ACME, "deepseek-v2-lite", attention="acme.undeclared")
    with pytest.raises(NotModelledError, match="has no op outputs"):
        _solve(ACME, "llama3-8b", precision="bf16", activation_checkpointing="op-sac", attention="acme.undeclared")
    offload = dict(precision="fp32", activation_offload="save_on_cpu", activation_checkpointing="none")
    declared = _solve(ACME, "llama3-8b", attention="acme.fused-attention", **offload)
    undeclared = _solve(ACME, "llama3-8b", attention="acme.undeclared", **offload)
    assert undeclared.host_memory != declared.host_memory
    assert declared.host_memory == _solve(BUILTIN, "llama3-8b", **offload).host_memory


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("options", OPTIONS[:4] + [dict(precision="fp32", offload="torchao"),
                                                   dict(precision="fp32", offload="torchao+gradients",
                                                        optimizer_impl="for-loop")],
                         ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()) or "default")
def test_an_optimizer_declaring_what_adamw_declares_gets_its_bytes(model, options):
    want = _outcome(BUILTIN, model, **options)
    assert _outcome(ACME, model, **{**options, "optimizer": "acme.adamw"}) == want


def test_an_optimizer_declaring_no_step_is_refused_by_the_techniques_that_need_it():
    with pytest.raises(NotModelledError, match=r"optimizer_in_backward.*optimizer one of \[.*'acme\.adamw'"):
        _solve(ACME, "llama3-8b", precision="fp32", optimizer="acme.adamw-undeclared", optimizer_in_backward=True)
    with pytest.raises(NotModelledError, match=r"optimizer one of acme\.adamw, adam, adamw"):
        _solve(ACME, "llama3-8b", precision="fp32", optimizer="acme.adamw-undeclared", offload="torchao")
    # Its own state is priced as declared by its callables, as before.
    plain = _solve(ACME, "llama3-8b", optimizer="acme.adamw-undeclared")
    assert _bytes(plain) == _bytes(_solve(BUILTIN, "llama3-8b"))


def test_builtin_optimizers_declare_their_step():
    optimizers = BUILTIN.plugin_manager.registry.optimizers
    measured = sorted(n for n, s in optimizers.items() if s.step and OPTIMIZER_IN_BACKWARD in s.step.measured_with)
    assert measured == ["adam", "adamw", "adamw-32bit-bnb", "adamw-8bit-bnb", "lion", "paged-adamw-32bit-bnb", "paged-adamw-8bit-bnb",
                        "sgd", "sgd-momentum"]
    assert all("torchao" in optimizers[n].step.why_not(OPTIMIZER_IN_BACKWARD)
               for n in ("adamw-8bit-torchao", "adamw-4bit-torchao", "adamw-fp8-torchao"))
    assert optimizers["adamw"].step.temporaries("for-loop") == 2 and optimizers["lion"].step.temporaries("for-loop") == 1


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("options", [OPTIONS[0], OPTIONS[2], OPTIONS[4], dict(attention="eager"),
                                     dict(precision="bf16", activation_checkpointing="full")],
                         ids=("default", "oib", "offload", "eager", "full"))
def test_families_renamed_with_the_builtins_blocked_give_the_same_bytes(model, options):
    assert _outcome(ACME_FAMILIES, model, **options) == _outcome(BUILTIN, model, **options)


def test_a_model_no_family_claims_is_refused_whoever_registered_the_families():
    """An architecture nobody claims is refused by name (issue 23: never costed as another
    family behind a note), under the built-ins and a renamed copy of them alike."""
    from mlsysim_core.catalog import get_model
    odd = attrs.evolve(get_model("llama3-8b"), architecture="acme_unknown")
    for solver in (BUILTIN, ACME_FAMILIES):
        with pytest.raises(NotModelledError) as info:
            _solve(solver, odd)
        assert info.value.parameter == "model.architecture" and info.value.value == "acme_unknown"
        assert "no registered family models 'acme_unknown'" in str(info.value)


def test_blocking_the_builtin_families_removes_them():
    """docs/writing-plugins.md: blocking measured_families removes every built-in family, the
    fallback with them: a model no remaining family claims is refused, naming its architecture."""
    solver = TrainingMemoryModel("measured", plugin_manager=PluginManager.from_environment(
        autoload=False, blocked=["measured_families"]))
    with pytest.raises(NotModelledError, match=r"model\.architecture='llama'.*measured_families"):
        _solve(solver, "llama3-8b")
    assert _bytes(_solve(solver, "gemma-3-1b-it")) == _bytes(_solve(BUILTIN, "gemma-3-1b-it"))
