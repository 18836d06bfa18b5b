"""A QLoRA base's 4-bit implementation is a registration (issue 24 items 1/7, issue 25 item 2, helper QUANTHOOK):
``mlsysim_measured_quant_implementations``, through which the measured profile's plugin registers bitsandbytes'
and torchao's. Registered again under other names by a third party they give the same bytes; a third party's own
(docs/hooks.md's HQQ-like layout) is priced from its declaration alone, by hand; what breaks the contract is named
with its plugin; an unknown name lists the registered ones, the third party's included."""

from __future__ import annotations

import json
import types

import attrs
import pytest

from mlsysim_core import PluginContractError, TrainingMemoryModel, hookimpl
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.manager import PluginManager
from mlsysim_plugins.measured import quantizations
from mlsysim_plugins.measured.quantizations import QuantImplementation

HOOK = "mlsysim_measured_quant_implementations"
BUILTIN = {q.name: q for q in quantizations.BUILTIN}

# docs/hooks.md, mlsysim_measured_quant_implementations: a third party's layout, HQQ's (one scale and one zero
# point per 64-element group in the base's dtype)
HQQ = QuantImplementation(
    name="acme.hqq", kinds=("nf4",), source="hqq 0.2 (illustrative)",
    stored=lambda n, rows, config, base: (n // 2, 2 * (n // 64) * base),
    transient=lambda n, c: (n * c, f"{n:,} elements x {c} B (the dequantized weight)"),
    layout="one {b} B scale and one {b} B zero point per 64-element group")

# llama3-8b's quantized linears per layer (q, k, v, o, gate, up, down: in x out), 32 layers
LINEARS = [4096 * 4096, 4096 * 1024, 4096 * 1024, 4096 * 4096, 4096 * 14336, 4096 * 14336, 14336 * 4096]
LAYERS = 32


def _world(items) -> TrainingMemoryModel:
    module = types.ModuleType("acme_quant")
    impl = hookimpl(lambda: list(items))
    impl.__name__ = HOOK
    setattr(module, HOOK, impl)
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(module, name="acme_quant")
    return TrainingMemoryModel("measured", plugin_manager=pm)


def _solve(solver, implementation, precision="bf16", **kw):
    lora = {"rank": 16, "quantization": "nf4", "quant_implementation": implementation, **kw.pop("lora", {})}
    return solver.solve("llama3-8b", "h100", 1, 1024, precision, lora=lora, **kw)


def _plain(result, rename=("", "")) -> str:
    text = json.dumps(result.to_dict(), sort_keys=True, default=str)
    return text.replace(*rename) if rename[0] else text


@pytest.mark.parametrize("name", ["bitsandbytes", "torchao"])
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_a_builtin_registered_again_under_another_name_gives_its_bytes(name, precision):
    copy = attrs.evolve(BUILTIN[name], name=f"acme.{name}")
    solver = _world([copy])
    builtin, renamed = _solve(solver, name, precision), _solve(solver, f"acme.{name}", precision)
    assert renamed.total_memory == builtin.total_memory
    assert _plain(renamed, (f"acme.{name}", name)) == _plain(builtin)
    assert _plain(builtin) == _plain(_solve(TrainingMemoryModel("measured"), name, precision))


def test_a_renamed_builtin_keeps_its_refusals():
    solver = _world([attrs.evolve(BUILTIN["torchao"], name="acme.nf4")])
    with pytest.raises(NotModelledError, match=r"lora\.quant_implementation.*'bitsandbytes' under a parallel layout.*"
                                               r"acme\.nf4's 4-bit base split or gathered over ranks"):
        _solve(solver, "acme.nf4", pp_size=2)
    # its declared split (QuantImplementation.shards) comes with it: under FSDP it answers as torchao does
    lora = {"rank": 16, "quantization": "nf4"}
    fsdp, ref = (s.solve("llama3-8b", "h100", 2, 1024, "bf16", dp_size=2, data_parallel="fsdp",
                         lora={**lora, "quant_implementation": name})
                 for s, name in ((solver, "acme.nf4"), (TrainingMemoryModel("measured"), "torchao")))
    assert fsdp.total_memory == ref.total_memory
    with pytest.raises(NotModelledError, match=r"acme\.nf4 implements nf4"):
        _solve(solver, "acme.nf4", lora={"quantization": "fp4"})


def test_the_third_party_layout_from_the_docs_is_priced_from_its_declaration():
    """By hand, regime bf16 (base 2 B, compute 2 B): codes n / 2 and constants 2 x n / 64 x 2 per linear; the backward's
    transient is the largest linear (gate, 4096 x 14336) dequantized to 2 B."""
    result = _solve(_world([HQQ]), "acme.hqq", regime="bf16")
    terms = {t.label: t for t in result.terms}
    n = LAYERS * sum(LINEARS)
    assert n == 6_979_321_856
    assert terms["quantized base linears (4-bit nf4)"].nbytes == n // 2 == 3_489_660_928
    constants = terms["quantization constants"]
    assert constants.nbytes == 2 * (n // 64) * 2 == 436_207_616
    assert constants.formula == "one 2 B scale and one 2 B zero point per 64-element group"
    transient = terms["dequantized weight (transient, one 4-bit linear)"]
    assert transient.nbytes == 4096 * 14336 * 2 == 117_440_512
    assert transient.formula == "the largest quantized linear, 58,720,256 elements x 2 B (the dequantized weight)"
    # every other term is bitsandbytes' (its codes and its transient, n x c, are the same; its constants are not)
    ours = {t.label: t.nbytes for t in _solve(_world([HQQ]), "acme.hqq", regime="bf16", runtime_overheads=False).terms}
    bnb = {t.label: t.nbytes for t in _solve(TrainingMemoryModel("measured"), "bitsandbytes", regime="bf16",
                                             runtime_overheads=False).terms}
    assert ours.keys() == bnb.keys()
    assert {label for label in ours if ours[label] != bnb[label]} == {"quantization constants"}


def test_an_unknown_name_lists_the_registered_ones_the_third_partys_included():
    with pytest.raises(InvalidInputError) as err:
        _solve(_world([HQQ]), "hqq")
    assert err.value.parameter == "lora.quant_implementation"
    assert err.value.allowed == "one of 'acme.hqq', 'bitsandbytes', 'bitsandbytes-0.43.1', 'torchao' (the registered implementations)"


def test_another_class_through_the_hook_is_named_with_its_plugin():
    with pytest.raises(PluginContractError) as err:
        _solve(_world([types.SimpleNamespace(name="acme.thing")]), "acme.thing")
    assert str(err.value) == (f"plugin 'acme_quant' (registered directly) hook {HOOK} registered SimpleNamespace "
                              "'acme.thing'; expected mlsysim_plugins.measured.quantizations.QuantImplementation")
    assert (err.value.plugin, err.value.hook) == ("acme_quant", HOOK)


def test_two_plugins_registering_one_name_is_a_conflict_naming_both():
    with pytest.raises(Exception, match=r"'torchao' is provided by more than one plugin: .*acme_quant"):
        _solve(_world([attrs.evolve(BUILTIN["torchao"], description="mine")]), "torchao")


@pytest.mark.parametrize(("fields", "error"), [
    ({"kinds": ("nf5",)}, r"QuantImplementation.kinds: \('nf5',\); expected one or more of \('nf4', 'fp4', 'int8'\)"),
    ({"kinds": ()}, r"QuantImplementation.kinds: \(\); expected one or more"),
    ({"transient": None}, r"'transient' must be callable"),
])
def test_a_broken_declaration_is_refused_when_built(fields, error):
    with pytest.raises((ValueError, TypeError), match=error):
        attrs.evolve(HQQ, **fields)



# --- the CLI: --quant-implementation beside --quantization, its choices the registry's -------------------------

def _flag(parser, flag):
    return next(a for sub in parser._subparsers._group_actions for p in sub.choices.values()
                for a in p._actions if flag in a.option_strings)


def test_the_flag_offers_the_registered_implementations():
    from mlsysim_core import cli
    assert _flag(cli._parser(), "--quant-implementation").choices == ("bitsandbytes", "bitsandbytes-0.43.1", "torchao")
    registry = _world([HQQ]).registry
    assert _flag(cli._parser(registry), "--quant-implementation").choices == ("acme.hqq", "bitsandbytes", "bitsandbytes-0.43.1", "torchao")


def test_the_flag_solves_what_the_python_keyword_does(capsys):
    from mlsysim_core import cli
    args = ["estimate", "-m", "llama3-8b", "-g", "h100", "-b", "1", "-s", "1024", "--profile", "measured",
            "--precision", "bf16", "--regime", "bf16",
            "--lora-rank", "16", "--quantization", "nf4", "--json"]
    assert cli.main([*args, "--quant-implementation", "torchao"]) == 0
    torchao = json.loads(capsys.readouterr().out)
    assert cli.main(args) == 0
    bnb = json.loads(capsys.readouterr().out)
    python = _solve(TrainingMemoryModel("measured"), "torchao", regime="bf16")
    assert torchao["total_memory"] == python.total_memory != bnb["total_memory"]
    with pytest.raises(SystemExit) as exit:
        cli.main([*args, "--quant-implementation", "hqq"])
    assert exit.value.code == 2
    assert "invalid choice: 'hqq' (choose from 'bitsandbytes', 'bitsandbytes-0.43.1', 'torchao')" in capsys.readouterr().err
