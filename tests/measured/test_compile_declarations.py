"""compile asks declarations, never names (issue 24, item 1; issue 25, item 1): a loss implementation's compiled form
(``LossImplementation.compiled_blocks``) and its moment before the step in the backward
(``with_optimizer_in_backward``), a checkpointing strategy's ``recomputes`` and its ``measured.compiled_blocks``
extension, a technique's ``with_compile``. Each built-in registered again under another name solves (or refuses) as
the built-in; a third party's that declares nothing is refused, naming its parameter."""

from __future__ import annotations

import attrs
import pytest

from familytools import BIG
from worldtools import BUILTIN_PM as _BUILTIN_PM, world
from mlsysim_core import TrainingMemoryModel
from mlsysim_core.catalog import get_model
from mlsysim_core.errors import NotModelledError
from mlsysim_core.registry import PluginInfo

_SOLVER = TrainingMemoryModel(plugin_manager=_BUILTIN_PM)
ACME = PluginInfo(name="acme_again", distribution="acme-again", version="1.0")
LLAMA = "meta-llama/llama-3.2-1b"


def _world(hook: str, items, replace: str | None = None) -> TrainingMemoryModel:
    """The built-ins (less the plugin ``replace``) and a third party registering ``items`` on ``hook``."""
    return world(hook, items, info=ACME, replace=replace)


def _solve(solver, *, checkpointing="none", regime="bf16", **options):
    precision = "fp32" if regime == "fp32" else "bf16"
    return solver.solve(get_model(LLAMA), BIG, 2, 256, precision, "adamw", checkpointing, profile="measured",
                        regime=regime, device="cpu", dropout=0.0, runtime_overheads=False, **options)


def _outcome(solver, alias=("", ""), **options):
    """Every term's bytes (in label order: a strategy's own order of the terms aside), or the refusal: its type and
    the parameter it names (``alias``: a name in the labels read as another, a strategy's name in its layers'
    label)."""
    try:
        result = _solve(solver, **options)
    except NotModelledError as err:
        return type(err).__name__, err.parameter
    return sorted((t.component, t.label.replace(*alias), t.nbytes, tuple(t.phases), t.tier) for t in result.terms), \
        result.total_memory


# --- the loss: its compiled form and its moment before the step in the backward --------------------------------

def _chunked():
    from mlsysim_plugins.measured.loss_implementations import BUILTIN
    return next(i for i in BUILTIN if i.compiled_blocks is not None)


LOSS_CASES = [
    dict(compile="blocks"),
    dict(compile="blocks", regime="fp32"),
    dict(compile="blocks", lora={"rank": 8, "adapter_dtype": "base"}),
    dict(compile="blocks", lora={"rank": 8, "adapter_dtype": "base"}, checkpointing="full"),
    dict(optimizer_in_backward=True),
    dict(compile=True),                     # refused (loss), as the built-in
    dict(compile="blocks+loss"),            # refused (loss), as the built-in
]


@pytest.mark.parametrize("options", LOSS_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_the_chunked_loss_under_another_name_solves_as_the_chunked_loss(options):
    world = _world("mlsysim_measured_losses", [attrs.evolve(_chunked(), name="acme_chunked")])
    assert _outcome(world, loss="acme_chunked", **options) == _outcome(_SOLVER, loss="chunked", **options)


def test_a_loss_declaring_no_compiled_form_is_refused_with_compile_naming_the_loss():
    plain = attrs.evolve(_chunked(), name="acme_plain", compiled_blocks=None, with_optimizer_in_backward=None)
    world = _world("mlsysim_measured_losses", [plain])
    _solve(world, loss="acme_plain")            # eager: its terms (the chunked loss's declaration)
    with pytest.raises(NotModelledError) as err:
        _solve(world, loss="acme_plain", compile="blocks")
    assert err.value.parameter == "loss" and err.value.value == "acme_plain"
    assert "cross_entropy or chunked with compile='blocks'" in str(err.value)     # those declaring one
    assert "compiled forms of the other loss implementations are not modelled" in str(err.value)
    with pytest.raises(NotModelledError) as err:
        _solve(world, loss="acme_plain", optimizer_in_backward=True)
    assert err.value.parameter == "optimizer_in_backward" and "with loss='acme_plain' is not measured" in str(err.value)


# --- checkpointing: what the strategy declares --------------------------------------------------------------

def _spec(name):
    return _BUILTIN_PM.registry.checkpointing[name]


CHECKPOINTING_CASES = [
    ("op-sac", dict(compile="blocks")),
    ("op-sac", dict(compile="blocks", regime="fp32")),
    ("op-sac", dict(compile=True)),                                 # refused (activation_checkpointing)
    ("op-sac", dict(compile="blocks", tp_size=2)),                  # refused (activation_checkpointing)
    ("none", dict(compile="blocks", tp_size=2)),                    # before: refused by the name
    ("none", dict(compile="blocks", pp_size=2)),
    ("none", dict(compile="blocks", lora={"rank": 8, "adapter_dtype": "base"})),
    ("none", dict(compile=True, lora={"rank": 8}, regime="fp32")),
    ("full", dict(compile="blocks", lora={"rank": 8, "adapter_dtype": "base"})),
    ("full", dict(compile="blocks", tp_size=2)),                    # refused (activation_checkpointing)
]


@pytest.mark.parametrize("name, options", CHECKPOINTING_CASES,
                         ids=lambda v: v if isinstance(v, str) else "-".join(f"{k}={x}" for k, x in v.items()))
def test_a_checkpointing_strategy_under_another_name_solves_as_the_built_in(name, options):
    again = attrs.evolve(_spec(name), name=f"acme-{name}")
    world = _world("mlsysim_checkpointing_strategies", [again])
    assert (_outcome(world, checkpointing=f"acme-{name}", alias=(f"acme-{name}", name), **options)
            == _outcome(_SOLVER, checkpointing=name, **options))


def test_a_per_op_strategy_not_declaring_its_compiled_saved_set_is_refused_with_compiled_blocks():
    from mlsysim_plugins.measured.compile import COMPILED_BLOCKS
    spec = _spec("op-sac")
    assert spec.extensions.get(COMPILED_BLOCKS) is True
    plain = attrs.evolve(spec, name="acme-sac", extensions={k: v for k, v in spec.extensions.items()
                                                            if k != COMPILED_BLOCKS})
    world = _world("mlsysim_checkpointing_strategies", [plain])
    _solve(world, checkpointing="acme-sac")     # eager: the policy's terms
    with pytest.raises(NotModelledError) as err:
        _solve(world, checkpointing="acme-sac", compile="blocks")
    assert err.value.parameter == "activation_checkpointing" and err.value.value == "acme-sac"


# --- techniques: Technique.with_compile ----------------------------------------------------------------------

def _techniques(**renamed):
    from mlsysim_plugins.measured.builtin_techniques import TECHNIQUES
    return [attrs.evolve(t, name=renamed[t.name]) if t.name in renamed else t for t in TECHNIQUES]


TECHNIQUE_CASES = [
    dict(compile="blocks", lora={"rank": 8, "adapter_dtype": "base"}, checkpointing="full", loss="chunked",
         activation_offload="torchtune"),
    dict(compile="blocks", lora={"rank": 8, "adapter_dtype": "base"}, checkpointing="full"),
    dict(compile="blocks", checkpointing="full", compile_checkpoint="outside", activation_offload="torchtune"),
    dict(compile="blocks", optimizer_in_backward=True, checkpointing="full", compile_checkpoint="outside"),
    dict(compile="blocks", optimizer_in_backward=True),             # refused (optimizer_in_backward)
    dict(compile=True, float8="tensorwise"),                        # refused (float8)
    dict(compile="blocks", offload="optimizer"),                    # refused (offload)
    dict(compile=True, activation_offload="save_on_cpu"),           # refused (activation_offload)
    dict(compile=True, lora={"rank": 8, "quantization": "nf4"}),    # refused (lora)
]


@pytest.mark.parametrize("options", TECHNIQUE_CASES, ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_the_built_in_techniques_under_other_names_combine_with_compile_as_before(options):
    names = ("lora", "loss", "optimizer_in_backward", "activation_offload", "offload", "compile", "float8")
    world = _world("mlsysim_measured_techniques", _techniques(**{n: f"acme_{n}" for n in names}),
                   replace="measured_techniques")
    assert _outcome(world, **options) == _outcome(_SOLVER, **options)


def _knob_world(**declaration) -> TrainingMemoryModel:
    from mlsysim_plugins.measured.options import _option
    from mlsysim_plugins.measured.techniques import Technique
    knob = Technique(name="acme_knob", description="a third party's knob",
                     options={"acme_knob": _option("an acme knob", "N", kind=int)}, **declaration)
    return _world("mlsysim_measured_techniques", [knob])


def test_a_technique_declaring_nothing_is_refused_with_compile_naming_its_option():
    world = _knob_world()
    assert _outcome(world, acme_knob=1) == _outcome(_SOLVER)        # no apply, no relocate: nothing changes
    assert _outcome(world, compile="blocks") == _outcome(_SOLVER, compile="blocks")     # off: not asked
    with pytest.raises(NotModelledError) as err:
        _solve(world, compile="blocks", acme_knob=1)
    assert (err.value.parameter, err.value.value, err.value.allowed) == ("acme_knob", 1, "acme_knob off with "
                                                                          "compile=True")
    assert "technique 'acme_knob' declares nothing of how it combines with compile" in err.value.detail


def test_a_technique_declares_its_reason_or_what_it_was_measured_with():
    with pytest.raises(NotModelledError) as err:
        _solve(_knob_world(with_compile="acme's kernels are not traced"), compile=True, acme_knob=2)
    assert (err.value.parameter, err.value.detail) == ("acme_knob", "acme's kernels are not traced")
    seen = []
    world = _knob_world(with_compile=lambda plan, value: seen.append(value))
    assert _outcome(world, compile="blocks", acme_knob=3) == _outcome(_SOLVER, compile="blocks")
    assert seen == ["blocks"]
