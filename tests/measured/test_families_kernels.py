"""Architecture families and attention kernels are objects, registered through the measured
profile's hooks and chosen by dispatch; a layer's parts carry how tensor parallelism splits
them and whether selective recompute drops them (the physics reads those fields, not names)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import attrs
import pytest

from mlsysim_core import HardwareNode, TrainingMemoryModel, TransformerWorkload, hookimpl
from mlsysim_core.catalog import get_model
from mlsysim_core.errors import NotModelledError, PluginConflictError
from mlsysim_core.manager import PluginManager
from mlsysim_plugins.measured import families, kernels
from mlsysim_plugins.measured.families import (BUILTIN_FAMILIES, GPT2, LLAMA, MIXTRAL, ArchitectureFamily,
                                               family_for, family_of)
from mlsysim_plugins.measured.kernels import BUILTIN_KERNELS, EAGER, SDPA, AttentionKernel, kernel_of
from mlsysim_plugins.measured.layers import (EXPERTS, REPLICATED, TP, LayerBytes, Part, layer_forward_bytes,
                                             megatron_layer_bytes)
from mlsysim_plugins.measured.parallel import rank_layer_saved
from mlsysim_plugins.measured.regimes import REGIMES
from mlsysim_plugins.measured.shapes import ModelShape, shape_of

ARCHITECTURES = families.HOOK
KERNELS = "mlsysim_measured_attention_kernels"
GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30)


def manager(builtin_pm, *plugins):
    """The built-in plugins, the built-in families and kernels (whether or not they are
    entry points yet), and ``plugins`` as (plugin, name)."""
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    for module, name in ((families, "test_builtin_families"), (kernels, "test_builtin_kernels")):
        if not pm.is_registered(module):
            pm.register(module, name=name)
    for plugin, name in plugins:
        pm.register(plugin, name=name)
    return pm


def providers(pm, hook=ARCHITECTURES):
    registry = pm.registry
    return {name: registry.providers[(hook, name)].name for name in registry.extensions[hook]}


def toy_family(name="test.toy", architectures=("toyarch",), **changes) -> ArchitectureFamily:
    """A third party's family: Llama's physics under its own name and architecture (not a fallback:
    ``attrs.evolve`` would copy Llama's ``fallback=True``, and two equal fallbacks are a conflict)."""
    return attrs.evolve(LLAMA, name=name, label="Toy", architectures=architectures, approximations={},
                        **{"fallback": False, **changes})


class Registers:
    def __init__(self, *items, hook=ARCHITECTURES):
        self.items, self.hook = items, hook

    @hookimpl
    def mlsysim_measured_architectures(self):
        return list(self.items) if self.hook == ARCHITECTURES else []

    @hookimpl
    def mlsysim_measured_attention_kernels(self):
        return list(self.items) if self.hook == KERNELS else []


def dense(architecture, **kw) -> TransformerWorkload:
    fields = dict(name=f"{architecture}-like", parameters=500_000_000, layers=8, hidden_dim=1024, heads=16,
                  kv_heads=4, vocab_size=32_000, ffn_dim=4096, gated_mlp=True, tied_embeddings=False,
                  architecture=architecture)
    fields.update(kw)
    return TransformerWorkload(**fields)


# --- registration --------------------------------------------------------------------------------------

def test_the_built_in_families_and_kernels_register_themselves():
    assert {f.name: f for f in families.mlsysim_measured_architectures()} == BUILTIN_FAMILIES
    assert set(BUILTIN_FAMILIES) == {"llama", "gpt2", "mixtral"}
    assert {k.name: k for k in kernels.mlsysim_measured_attention_kernels()} == BUILTIN_KERNELS
    assert set(BUILTIN_KERNELS) == {"sdpa", "eager", "flex_attention"}
    assert all(isinstance(f, ArchitectureFamily) for f in BUILTIN_FAMILIES.values())
    assert all(isinstance(k, AttentionKernel) for k in BUILTIN_KERNELS.values())
    hash(LLAMA), hash(SDPA)       # frozen and hashable: a plan holding them is memoised like any other


def test_the_registry_collects_them_through_the_profiles_hooks(builtin_pm):
    from mlsysim_plugins.measured.architectures import family_modules
    registry = manager(builtin_pm).registry
    more = {f.name: f for m in family_modules() for f in m.FAMILIES}
    assert registry.extensions[ARCHITECTURES] == {**BUILTIN_FAMILIES, **more}
    assert registry.extensions[KERNELS] == BUILTIN_KERNELS


@pytest.mark.parametrize("name,family", [("llama3-8b", LLAMA), ("mistralai/mistral-7b-v0.1", LLAMA),
                                         ("openai-community/gpt2", GPT2), ("mixtral-8x7b", MIXTRAL)])
def test_each_built_in_family_claims_its_validated_architectures_without_a_note(name, family):
    model = get_model(name)
    assert family_for(model, BUILTIN_FAMILIES) == (family, ())
    assert ModelShape.of(model).family is family
    assert [f.name for f in BUILTIN_FAMILIES.values() if f.claims_model(model)] == [family.name]


def test_every_architecture_the_hf_import_reads_has_a_family(builtin_pm):
    """(``hf.ARCHITECTURES``: what workloads get; a nested config's is its text model's.)"""
    from mlsysim_core.hf import ARCHITECTURES as READ
    registered = manager(builtin_pm).registry.extensions[ARCHITECTURES]
    listed = {a for f in registered.values() for a in f.architectures}
    assert set(READ) <= listed


# --- choosing a family ---------------------------------------------------------------------------------

def test_a_third_party_family_is_chosen_for_its_architecture(builtin_pm):
    toy = toy_family()
    pm = manager(builtin_pm, (Registers(toy), "test_toy_family"))
    registered = pm.registry.extensions[ARCHITECTURES]
    assert registered["test.toy"] is toy and providers(pm)["test.toy"] == "test_toy_family"
    assert family_for(dense("toyarch"), registered) == (toy, ())
    assert family_for(dense("TOYARCH"), registered)[0] is toy              # HF model_type, any case
    assert family_for(dense("llama"), registered) == (LLAMA, ())           # the others keep theirs
    shape = ModelShape.of(dense("toyarch"), toy)
    assert shape.family is toy and shape.style == "test.toy"
    # A plan whose prepare chose the toy family: the physics reads that object.
    plan = SimpleNamespace(model=dense("toyarch"), profile_options=SimpleNamespace(architecture=toy))
    assert family_of(plan) is toy and shape_of(plan).family is toy
    # Without a choice (a plan prepared before families were registered): the built-in that models it.
    plan = SimpleNamespace(model=dense("toyarch"), profile_options=SimpleNamespace())
    assert family_of(plan) is LLAMA


def test_a_dynamic_claim(builtin_pm):
    toy = toy_family(architectures=(), claims=lambda model: model.name.startswith("toy-"))
    registered = manager(builtin_pm, (Registers(toy), "test_toy_family")).registry.extensions[ARCHITECTURES]
    assert family_for(dense(None, name="toy-1"), registered) == (toy, ())
    assert family_for(dense(None, name="other"), registered)[0] is LLAMA


def test_two_claimants_are_an_error_naming_both_and_how_to_block_one(builtin_pm):
    one, two = toy_family("test.one"), toy_family("test.two")
    pm = manager(builtin_pm, (Registers(one), "test_plugin_one"), (Registers(two), "test_plugin_two"))
    registered = pm.registry.extensions[ARCHITECTURES]
    with pytest.raises(PluginConflictError) as err:
        family_for(dense("toyarch"), registered, providers(pm))
    message = str(err.value)
    assert "'test.one' (plugin test_plugin_one)" in message and "'test.two' (plugin test_plugin_two)" in message
    assert "MLSYSIM_DISABLED_PLUGINS=test_plugin_one or MLSYSIM_DISABLED_PLUGINS=test_plugin_two" in message
    assert err.value.hook == ARCHITECTURES
    # Without the providers: the families, where they are defined, and the variable to set.
    with pytest.raises(PluginConflictError, match=r"'test\.one' \(defined in .*'test\.two'.*"
                                                   r"MLSYSIM_DISABLED_PLUGINS=<plugin>"):
        family_for(dense("toyarch"), registered)


def test_a_third_party_claiming_a_built_in_architecture_conflicts_with_the_built_in(builtin_pm):
    mine = toy_family("test.mine", architectures=("llama",))
    pm = manager(builtin_pm, (Registers(mine), "test_plugin_mine"))
    with pytest.raises(PluginConflictError, match=r"'llama' \(plugin .*'test\.mine' \(plugin test_plugin_mine\)"):
        family_for(dense("llama"), pm.registry.extensions[ARCHITECTURES], providers(pm))


def test_nobody_claims_it_the_structural_fallback_with_a_note():
    family, notes = family_for(dense("bamba"), BUILTIN_FAMILIES)
    assert family is LLAMA
    assert notes == ("approximation: architecture 'bamba' has no measured-grade model of its own; costed as "
                     "Llama-style layers",)
    assert family_for(dense("bamba", gated_mlp=False), BUILTIN_FAMILIES)[0] is GPT2
    assert family_for(dense(None), BUILTIN_FAMILIES)[1] == (
        "approximation: model.architecture is not given; costed as Llama-style layers",)
    sparse = get_model("mixtral-8x7b")
    odd = attrs.evolve(sparse, architecture="bamba")
    assert family_for(odd, BUILTIN_FAMILIES)[0] is MIXTRAL


def test_a_family_does_not_claim_a_model_it_cannot_build():
    """A sparse model whose architecture names a dense family, or a plain MLP under a gated
    family, falls back by structure, as before, now with a note."""
    sparse_llama = attrs.evolve(get_model("mixtral-8x7b"), architecture="llama")
    family, notes = family_for(sparse_llama, BUILTIN_FAMILIES)
    assert family is MIXTRAL
    assert notes == ("approximation: architecture 'llama' is modelled as Llama-style layers, which do not fit "
                     f"{sparse_llama.name!r} (it has routed experts); costed as Mixtral-style layers",)
    family, notes = family_for(dense("llama", gated_mlp=False), BUILTIN_FAMILIES)
    assert family is GPT2 and "(its MLP is not gated)" in notes[0]
    # GPT-2's family costs gated models it names (OLMo) as GPT-2 layers, with what it leaves out.
    family, notes = family_for(dense("olmo"), BUILTIN_FAMILIES)
    assert family is GPT2 and notes == (
        "approximation: architecture 'olmo' has no measured-grade model of its own; costed as GPT-2-style "
        "layers (its non-parametric layer norms not modelled)",)


def test_a_registered_item_that_is_not_a_family_is_refused_by_name():
    from mlsysim_core.errors import PluginContractError
    with pytest.raises(PluginContractError, match="registered str 'odd'; expected an ArchitectureFamily"):
        family_for(dense("llama"), {**BUILTIN_FAMILIES, "odd": "odd"})


def test_family_fields_are_checked():
    with pytest.raises(ValueError, match="positions"):
        attrs.evolve(LLAMA, positions="alibi")
    with pytest.raises(ValueError, match="split"):
        Part("x", 1, split="sideways")


# --- parts as data: the split and recompute flags drive the physics ----------------------------------

# What tensor parallelism did not split without sequence parallelism, by label prefix, before
# parts carried it (parallel.TP_REPLICATED): the flags reproduce it exactly.
OLD_TP_REPLICATED = ("input norm", "post-attention norm", "mid residual", "ln_1", "ln_2", "c_attn input",
                     "c_fc input", "q/k/v input casts", "gate/up input casts", "router", "expert indices",
                     "routing weights", "resid dropout noise", "expert offsets", "layernorm inputs", "qkv input",
                     "dropout masks", "mlp input")
SHAPE = dict(hidden=256, heads=8, kv_heads=2, head_dim=32, ffn=512, experts=4, top_k=2)


def _every_layer():
    # (flex_attention has formulas for gpt-oss's sinks layout only: architectures/gpt_oss.py)
    for family, regime, attention, dropout in itertools.product(BUILTIN_FAMILIES.values(), ("fp32", "amp-bf16", "bf16"),
                                                                (SDPA, EAGER), (False, True)):
        yield layer_forward_bytes(family=family, regime=regime, attention=attention, dropout=dropout, tokens=64,
                                  seq_len=32, **SHAPE)
    for family, attention, dropout in itertools.product(BUILTIN_FAMILIES.values(), (SDPA, EAGER), (False, True)):
        yield megatron_layer_bytes(family=family, attention=attention, dropout=dropout, tokens=64, seq_len=32, **SHAPE)


def test_the_flags_reproduce_the_label_rules_they_replaced():
    seen = set()
    for lb in _every_layer():
        assert lb.saved == sum(p.nbytes for p in lb.parts)
        for p in lb.parts:
            old = EXPERTS if p.name.startswith("experts") else (REPLICATED if p.name.startswith(OLD_TP_REPLICATED)
                                                                else TP)
            assert p.split == old, p
            assert p.recomputed_by_selective == (p.name == "attention scores"), p
            seen.add(p.split)
    assert seen == {TP, REPLICATED, EXPERTS}


def _plan(tp, sp=False, etp=None, regime="mixed-bf16-main-grad"):
    rank = SimpleNamespace(in_flight=1)
    options = SimpleNamespace(regime=REGIMES[regime], expert_tp_size=etp or tp)
    return SimpleNamespace(tp_size=tp, cp_size=1, sequence_parallel=sp, rank=rank, profile_options=options)


def _split(ctx, tp, sp=False, etp=None):
    """The activation formulas' context with what the rules split (tp; with sequence
    parallelism the residual stream too; the experts over etp)."""
    return SimpleNamespace(**vars(ctx), tensor=tp, sequence=1, residual=tp if sp else 1, expert_tensor=etp or tp)


def _with(lb: LayerBytes, name: str, **changes) -> LayerBytes:
    parts = tuple(attrs.evolve(p, **changes) if p.name == name else p for p in lb.parts)
    return attrs.evolve(lb, parts=parts)


def test_a_parts_split_drives_what_tensor_parallelism_divides():
    lb = megatron_layer_bytes(family="mixtral", attention="eager", dropout=True, tokens=64, seq_len=32, **SHAPE)
    ctx = SimpleNamespace(tokens=64, shape=SimpleNamespace(hidden=SHAPE["hidden"]))
    t = 4
    base = rank_layer_saved(_plan(t, etp=2), _split(ctx, t, etp=2), lb, False)[0]
    mlp_input = next(p for p in lb.parts if p.name == "mlp input")
    assert mlp_input.split == REPLICATED
    split = rank_layer_saved(_plan(t, etp=2), _split(ctx, t, etp=2), _with(lb, "mlp input", split=TP), False)[0]
    assert split == pytest.approx(base - mlp_input.nbytes * (1 - 1 / t))
    experts = next(p for p in lb.parts if p.split == EXPERTS)
    as_tp = rank_layer_saved(_plan(t, etp=2), _split(ctx, t, etp=2), _with(lb, experts.name, split=TP), False)[0]
    assert as_tp == pytest.approx(base - experts.nbytes / 2 + experts.nbytes / t)
    # With sequence parallelism every replicated part is divided too: the flag no longer matters.
    sp = rank_layer_saved(_plan(t, sp=True, etp=2), _split(ctx, t, True, 2), lb, False)[0]
    assert rank_layer_saved(_plan(t, sp=True, etp=2), _split(ctx, t, True, 2), _with(lb, "mlp input", split=TP), False)[0] == sp


def test_a_parts_recompute_flag_drives_selective_recompute():
    lb = megatron_layer_bytes(family="llama", attention="eager", dropout=False, tokens=64, seq_len=32, **SHAPE)
    ctx = SimpleNamespace(tokens=64, shape=SimpleNamespace(hidden=SHAPE["hidden"]))
    t = 2
    scores = next(p for p in lb.parts if p.recomputed_by_selective)
    full, selective = (rank_layer_saved(_plan(t), _split(ctx, t), lb, s)[0] for s in (False, True))
    assert full - selective == pytest.approx(scores.nbytes / t)
    qkv = next(p for p in lb.parts if p.name == "q/k/v")
    flagged = _with(lb, "q/k/v", recomputed_by_selective=True)
    assert rank_layer_saved(_plan(t), _split(ctx, t), flagged, True)[0] == pytest.approx(selective - qkv.nbytes / t)
    assert rank_layer_saved(_plan(t), _split(ctx, t), flagged, False)[0] == pytest.approx(full)


# --- kernels ------------------------------------------------------------------------------------------

def test_layers_call_the_kernel_object():
    kw = dict(regime="amp-bf16", dropout=False, tokens=64, seq_len=32, **SHAPE)
    for family in ("llama", "gpt2"):
        assert layer_forward_bytes(family=family, attention="eager", **kw) == \
            layer_forward_bytes(family=family, attention=EAGER, **kw)
    with pytest.raises(ValueError, match="unknown attention 'flash'"):
        layer_forward_bytes(family="llama", attention="flash", **kw)


def test_a_kernel_without_the_familys_layout_says_so():
    partial = AttentionKernel(name="test.partial", description="GPT-2's layout only",
                              layouts={kernels.FUSED_QKV: dict(EAGER.layouts)[kernels.FUSED_QKV]})
    kw = dict(regime="fp32", dropout=False, tokens=8, seq_len=8, **SHAPE)
    layer_forward_bytes(family="gpt2", attention=partial, **kw)
    with pytest.raises(NotModelledError, match=r"'separate-qkv' attention layout.*test\.partial.*fused-qkv"):
        layer_forward_bytes(family="llama", attention=partial, **kw)


def test_kernel_of_reads_the_prepared_kernel_else_the_built_in_by_name():
    assert kernel_of(SimpleNamespace(profile_options=SimpleNamespace(attention="eager"))) is EAGER
    chosen = attrs.evolve(EAGER, name="test.chosen")
    plan = SimpleNamespace(profile_options=SimpleNamespace(attention="test.chosen", attention_kernel=chosen))
    assert kernel_of(plan) is chosen


def test_a_registered_kernel_is_selectable_and_its_flags_drive_selective_recompute(builtin_pm):
    """A third-party kernel: eager's formulas, but its scores are not recomputed by selective
    recompute (say, a kernel that keeps them): the selective solve keeps exactly those bytes."""
    def kept_scores(**kw):
        return tuple(attrs.evolve(p, recomputed_by_selective=False) for p in dict(EAGER.layouts)[kernels.SEPARATE_QKV](**kw))
    keeps = AttentionKernel(name="test.keeps", description="eager, scores kept",
                            layouts={**dict(EAGER.layouts), kernels.SEPARATE_QKV: kept_scores})
    solver = TrainingMemoryModel("measured", plugin_manager=manager(builtin_pm, (Registers(keeps, hook=KERNELS),
                                                                                 "test_kernel")))
    model = get_model("llama3-8b")

    def activations(attention, checkpointing):
        result = solver.solve(model, GPU, 1, 512, attention=attention, activation_checkpointing=checkpointing,
                              runtime_overheads=False)
        return sum(t.nbytes for t in result.terms if t.label == "decoder layers: saved for backward")
    assert activations("test.keeps", "none") == activations("eager", "none")
    dropped = activations("eager", "none") - activations("eager", "selective")
    assert dropped > 0
    assert activations("test.keeps", "selective") == activations("eager", "selective") + dropped
