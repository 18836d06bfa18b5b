"""One description of a family's parameters (issue 24, item 4): a family's layer weights, parameter
tensors, matrix shapes and parameter count are checked against each other, once per family and
model, when the family is chosen; a family whose descriptions disagree is refused naming it and its
plugin; every built-in family passes on every catalog model it claims; the conformance kit runs a
third party's family through the same check; the optional fields have defaults; the layer walker is
public."""

from __future__ import annotations

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, TransformerWorkload, hookimpl
from mlsysim_core.catalog import list_models
from mlsysim_core.errors import PluginContractError
from mlsysim_core.manager import PluginManager
from mlsysim_core.testing import check_plugin
from mlsysim_plugins.measured import layers
from mlsysim_plugins.measured.families import (GPT2, LLAMA, MIXTRAL, RMS_NORM, ArchitectureFamily, LayerWeight,
                                               derived_matrix_shapes, derived_parameter_tensors,
                                               description_disagreements)
from mlsysim_plugins.measured.kernels import SEPARATE_QKV
from mlsysim_plugins.measured.shapes import ModelShape

ARCHITECTURES = "mlsysim_measured_architectures"
CATALOG = [entry.value for entry in list_models(plugins=False)]


def registered_families(builtin_pm):
    return builtin_pm.registry.extensions[ARCHITECTURES]


def model(architecture="toyarch", **kw) -> TransformerWorkload:
    fields = dict(name="toy-1b", parameters=0, layers=4, hidden_dim=512, heads=8, kv_heads=2, vocab_size=1000,
                  ffn_dim=2048, gated_mlp=True, tied_embeddings=False, architecture=architecture)
    fields.update(kw)
    m = TransformerWorkload(**{**fields, "parameters": 1})
    return attrs.evolve(m, parameters=sum(ModelShape.of(m, LLAMA).parameter_tensors()))


def toy(**overrides) -> ArchitectureFamily:
    """A Llama-like third-party family: its tensors derived from its layer weights."""
    return ArchitectureFamily(**{"name": "toy", "architectures": ("toyarch",), "layer_weights": LLAMA.layer_weights,
                                 "layer": layers.llama_layer, **overrides})


class Registers:
    def __init__(self, *items):
        self.items = items

    @hookimpl
    def mlsysim_measured_architectures(self):
        return list(self.items)


def manager_with(builtin_pm, family, name="toy_family"):
    pm = PluginManager()
    for n in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(n), name=n, info=builtin_pm.info(n))
    pm.register(Registers(family), name=name)
    return pm


def solve(pm, m):
    return TrainingMemoryModel(plugin_manager=pm).solve(model=m, hardware="h100", batch_size=1, seq_len=128,
                                                         profile="measured")


# --- every built-in family agrees with itself on every catalog model it claims -------------------------

def test_every_built_in_family_agrees_on_every_catalog_model_it_claims(builtin_pm):
    checked = 0
    for family in registered_families(builtin_pm).values():
        assert family.conformance_failures(CATALOG) == (), family.name
        for m in CATALOG:
            if family.claims_model(m):
                assert description_disagreements(family, m) == (), (family.name, m.name)
                checked += 1
    assert checked >= 45       # the catalog's Hugging Face models, each claimed by a family


def test_the_derived_description_is_the_validated_one():
    """Llama's tensors and matrices, Mixtral's tensors are derived from their layer weights, and
    count exactly what Hugging Face's models hold (the catalog's counts from the checkpoints)."""
    assert LLAMA.parameter_tensors is None and LLAMA.matrix_shapes is None and MIXTRAL.parameter_tensors is None
    n = 0
    for m in CATALOG:
        for family in (LLAMA, MIXTRAL):
            if family.claims_model(m) and m.name.count("/"):
                shape = ModelShape.of(m, family)
                assert sum(derived_parameter_tensors(shape)) == m.parameters, m.name
                if family is LLAMA:
                    assert sum(r * (c or 1) for r, c in derived_matrix_shapes(shape)) == m.parameters
                n += 1
    assert n >= 10


# --- a family whose descriptions disagree is refused, naming it -------------------------------------------

def test_a_count_that_disagrees_is_refused_naming_the_family_and_plugin(builtin_pm):
    off_by_one = toy(count_parameters=lambda m: sum(ModelShape.of(m, LLAMA).parameter_tensors()) + 1)
    m = model()
    assert "count_parameters gives" in description_disagreements(off_by_one, m)[0]
    with pytest.raises(PluginContractError) as err:
        solve(manager_with(builtin_pm, off_by_one), m)
    assert "'toy'" in str(err.value) and "toy_family" in str(err.value) and "count_parameters" in str(err.value)
    assert err.value.plugin == "toy_family" and err.value.hook == ARCHITECTURES
    assert solve(manager_with(builtin_pm, toy()), m).total_memory > 0     # the consistent one solves


def test_matrix_shapes_that_disagree_with_the_tensors_are_refused(builtin_pm):
    drops_the_head = toy(matrix_shapes=lambda s: derived_matrix_shapes(s)[:-1])     # one tensor fewer
    found = description_disagreements(drops_the_head, model())
    assert len(found) == 1 and "matrix_shapes lists" in found[0]
    vector_wrong = toy(matrix_shapes=lambda s: [(s.vocab, s.hidden)] + [(1, 0)] * (len(s.parameter_tensors()) - 1))
    assert "a vector's rows are its elements" in description_disagreements(vector_wrong, model())[0]
    with pytest.raises(PluginContractError, match="'toy'.*matrix_shapes"):
        solve(manager_with(builtin_pm, drops_the_head), model())


def test_layer_weights_larger_than_the_tensors_are_refused():
    small = toy(parameter_tensors=lambda s: (s.embedding_parameters, 10, 10))
    assert any("layer weights" in f for f in description_disagreements(small, model()))


def test_the_conformance_kit_runs_a_family_through_the_check(builtin_pm):
    bad = toy(architectures=("llama",), count_parameters=lambda m: 7)      # claims the catalog's Llamas
    report = check_plugin("toy_family", plugin_manager=manager_with(builtin_pm, bad),
                          allow_direct_registration=True)
    found = [f for f in report.failures if "count_parameters gives 7" in f]
    assert found and all(f.startswith(f"{ARCHITECTURES} 'toy' on ") for f in found)
    good = check_plugin("toy_family", plugin_manager=manager_with(builtin_pm, toy(architectures=("llama",))),
                        allow_direct_registration=True)
    assert not [f for f in good.failures if " on '" in f]


# --- optional fields, the public walker -----------------------------------------------------------------------

def test_optional_fields_have_defaults():
    family = toy()
    required = [a.name for a in attrs.fields(ArchitectureFamily) if a.default is attrs.NOTHING]
    assert required == ["name", "architectures", "layer_weights", "layer"]
    assert (family.description, family.norm, family.positions, family.attention_layout) == \
        ("", RMS_NORM, "rotary", SEPARATE_QKV)
    # the Megatron MLP by structure when not given
    kw = dict(hidden=64, ffn=256, experts=4, top_k=2)
    assert family.megatron_mlp_parts(**kw) == layers.megatron_gated_mlp(**kw)
    assert toy(gated_mlp=False).megatron_mlp_parts(**kw) == layers.megatron_plain_mlp(**kw)
    assert toy(sparse=True).megatron_mlp_parts(**kw) == layers.megatron_moe_mlp(**kw)
    assert GPT2.megatron_mlp_parts(**kw) == layers.megatron_plain_mlp(**kw)


def test_a_family_without_matrix_shapes_needs_its_weights_shapes():
    no_shapes = toy(layer_weights=lambda **k: tuple(attrs.evolve(w, shape=None) for w in LLAMA.layer_weights(**k)))
    shape = ModelShape.of(model(), no_shapes)
    assert sum(shape.parameter_tensors()) == model().parameters
    with pytest.raises(PluginContractError, match="'toy'.*no shape"):
        shape.matrix_shapes()


def test_the_layer_walker_is_public():
    assert layers.LayerWalk is layers._Walk
    w = layers.LayerWalk()
    w.add("a", 3, layers.REPLICATED)
    w.add("nothing", 0)
    w.constant.append(layers.Part("per layer", 5))
    out = w.layer(tokens=10, output=7, output_saved_by_next=True)
    assert out.saved == 35 and [p.name for p in out.parts] == ["a", "per layer"]
    assert LayerWeight("w", 6, shape=(2, 3)).shape == (2, 3)
