"""Adam-mini's numbers, derived by hand (see README.md), and the conformance kit.

Run with the package installed: ``pip install -e ".[test]" && pytest``.
"""

import pytest

from mlsysim_core import (InvalidInputError, NotModelledError, PluginManager, TrainingMemoryModel,
                          TransformerWorkload)
from mlsysim_core.testing import assert_plugin_conforms
from mlsysim_adam_mini import adam_mini

NAME = "adammini.adam-mini"

# Llama-3.1-8B: 8.03e9 params, 32 layers, hidden 4096, 32 heads, 8 KV heads (head_dim 128),
# vocabulary 128,256, SwiGLU MLP of width 14,336, untied output layer.
LLAMA8B_BLOCKS = (
    128_256                          # embedding, one block per token
    + 128_256                        # output layer (untied), one block per token
    + 32 * 32                        # query: 32 heads x 32 layers
    + 32 * 8                         # key: 8 KV heads x 32 layers
    + 32 * 8 * 128                   # value: 1,024 output neurons x 32 layers
    + 32 * 4096                      # attention output: 4,096 output neurons x 32 layers
    + 32 * (2 * 14_336 + 4096)       # MLP: gate 14,336 + up 14,336 + down 4,096 neurons x 32 layers
    + 2 * 32 + 1                     # norms: 2 per layer + the final norm
)
LLAMA8B_PARAMS = 8_030_000_000
LLAMA8B_COUNTED = 8_030_261_248     # the curated llama3-8b's exact count (the measured-grade tests' model)
ADAM_MINI_STATE = 8 * LLAMA8B_PARAMS + 4 * LLAMA8B_BLOCKS   # master + m + one v per block


@pytest.fixture
def model():
    """mlsysim-core's built-ins plus this plugin, registered under its entry-point name."""
    pm = PluginManager()
    pm.load_entrypoints(third_party=False)
    pm.register(adam_mini, name="adam_mini")
    return TrainingMemoryModel(plugin_manager=pm)


def test_llama3_8b_blocks_and_bytes(model):
    assert LLAMA8B_BLOCKS == 1_470_273
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME)
    terms = {t.label: t.nbytes for t in r.terms_of("optimizer_state")}
    assert terms == {
        "adam-mini master copy (fp32)": 4 * LLAMA8B_PARAMS,                      # 32,120,000,000
        "adam-mini first moment m (fp32)": 4 * LLAMA8B_PARAMS,                   # 32,120,000,000
        "adam-mini second moment v (fp32, one per block)": 4 * LLAMA8B_BLOCKS,   # 5,881,092
    }
    assert r.optimizer_state == ADAM_MINI_STATE == 64_245_881_092
    assert {t.source for t in r.terms_of("optimizer_state")} == {"adam_mini"}


def test_only_the_optimizer_state_differs_from_adam(model):
    mini = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME)
    adam = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024)
    for field in ("weights", "gradients", "activations", "communication_buffers"):
        assert getattr(mini, field) == getattr(adam, field), field
    assert adam.optimizer_state == 12 * LLAMA8B_PARAMS
    # v shrinks by 99.98 %; the moments (m + v) by almost exactly half.
    assert 1 - 4 * LLAMA8B_BLOCKS / (4 * LLAMA8B_PARAMS) > 0.9998
    assert adam.optimizer_state - mini.optimizer_state == 4 * LLAMA8B_PARAMS - 4 * LLAMA8B_BLOCKS


def test_zero1_shards_every_term(model):
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME, dp_size=8, zero_stage=1)
    assert r.optimizer_state == (8 * LLAMA8B_PARAMS + 4 * LLAMA8B_BLOCKS) / 8


def test_the_readme_example_fits_only_with_adam_mini(model):
    kw = dict(dp_size=2, zero_stage=1)
    mini = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME, **kw)
    adam = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, **kw)
    assert mini.optimizer_state == ADAM_MINI_STATE / 2 == 32_122_940_546
    assert mini.feasible and not adam.feasible
    assert round(mini.gb.total_memory, 3) == 83.300 and round(adam.gb.total_memory, 3) == 99.357


def test_model_parallelism_splits_the_blocks_like_the_parameters(model):
    r = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME, tp_size=2, pp_size=2)
    v = [t for t in r.terms_of("optimizer_state") if "second moment" in t.label]
    assert [t.nbytes for t in v] == [4 * LLAMA8B_BLOCKS / 4]
    assert r.optimizer_state == (8 * LLAMA8B_PARAMS + 4 * LLAMA8B_BLOCKS) / 4


def test_tied_embeddings_and_a_plain_mlp():
    # GPT-2 small: 12 layers, hidden 768, 12 heads (MHA, head_dim 64), vocab 50,257,
    # plain GELU MLP of width 3,072, output layer tied to the embedding.
    per_layer = 12 + 12 + 12 * 64 + 768 + (3072 + 768)
    expected = 50_257 + 12 * per_layer + 2 * 12 + 1
    gpt2 = TransformerWorkload(name="gpt2-small", parameters=124_000_000, layers=12, hidden_dim=768,
                               heads=12, vocab_size=50_257, ffn_dim=3072, gated_mlp=False,
                               tied_embeddings=True)
    assert sum(adam_mini.block_counts(gpt2).values()) == expected == 115_082


def test_mixture_of_experts_counts_every_expert_and_the_router(model):
    # Mixtral-8x7B: 8 experts of width 14,336 (SwiGLU), router of 8 rows per layer.
    expected = 2 * 32_000 + 32 * (32 + 8 + 8 * 128 + 4096 + 8 * (2 * 14_336 + 4096) + 8) + 65
    r = model.solve("mixtral-8x7b", "mlsysim:h100", 16, 1024, optimizer=NAME, ep_size=4, dp_size=4,
                    zero_stage=1)
    [v] = [t for t in r.terms_of("optimizer_state") if "second moment" in t.label]
    assert v.nbytes == 4 * expected / 4 / 4 == 2_154_512.25


@pytest.mark.parametrize("field", ["vocab_size", "ffn_dim", "gated_mlp", "tied_embeddings", "heads"])
def test_a_missing_architecture_field_is_named(model, field):
    fields = dict(name="partial", parameters=1_000_000_000, layers=16, hidden_dim=2048, heads=16,
                  vocab_size=32_000, ffn_dim=5632, gated_mlp=True, tied_embeddings=False)
    fields[field] = None
    with pytest.raises(InvalidInputError) as err:
        model.solve(TransformerWorkload(**fields), "mlsysim:h100", 8, 1024, optimizer=NAME)
    assert err.value.parameter == f"model.{field}"
    assert NAME in str(err.value)


# --- measured grade (Adam-mini 1.1.1 as PyTorch measured it: validation/examples/) -----------------

V, H = 128_256, 4096     # Llama-3.1-8B's embedding and LM head: V x h each, the largest tensors


@pytest.fixture
def measured(model):
    return TrainingMemoryModel("measured", plugin_manager=model.plugin_manager)


def _state(result):
    return {t.label: (t.nbytes, t.phases) for t in result.terms_of("optimizer_state")}


def test_measured_grade_keeps_m_and_one_v_per_block_in_the_parameters_dtype(measured):
    r = measured.solve("llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME, precision="fp32",
                       regime="fp32")
    steady = ("forward", "backward", "backward_end", "optimizer_step")
    assert _state(r) == {
        "adam-mini first moment m (fp32, 4 B)": (4 * LLAMA8B_COUNTED, steady),           # no master copy
        "adam-mini second moment v (4 B, one per block)": (4 * LLAMA8B_BLOCKS, steady),  # no step tensors
        # The embedding's update and -update, and its three (V, 1) vectors: 4 x (2 V h + 3 V).
        "adam-mini step temporaries (per-tensor loop)": (4 * (2 * V * H + 3 * V), ("optimizer_step",)),
    }


def test_measured_grade_follows_the_regime(measured):
    bf16 = _state(measured.solve("llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME, precision="bf16",
                                 regime="bf16"))
    assert bf16["adam-mini first moment m (bf16, 2 B)"][0] == 2 * LLAMA8B_COUNTED
    assert bf16["adam-mini second moment v (2 B, one per block)"][0] == 2 * LLAMA8B_BLOCKS
    mixed = _state(measured.solve("llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME,
                                  precision="bf16", regime="mixed-bf16"))
    assert mixed["fp32 master weights"][0] == 4 * LLAMA8B_COUNTED


@pytest.mark.parametrize("impl", ["foreach", "fused", "for-loop"])
def test_measured_grade_loops_whatever_the_implementation(measured, impl):
    r = measured.solve("llama3-8b", "mlsysim:h100", 8, 1024, optimizer=NAME, optimizer_impl=impl)
    [step] = [t for t in r.terms_of("optimizer_state") if "step" in t.label]
    assert step.nbytes == 4 * (2 * V * H + 3 * V) and "changes nothing" in step.formula


@pytest.mark.parametrize("model_name, family", [("mixtral-8x7b", "Mixtral"), ("gpt2", "GPT-2")])
def test_measured_grade_refuses_names_it_does_not_know(measured, model_name, family):
    with pytest.raises(NotModelledError) as err:
        measured.solve(model_name, "mlsysim:h100", 8, 1024, optimizer=NAME)
    assert err.value.parameter == "optimizer" and f"{family}-style layers" in str(err.value)


def test_the_installed_plugin_conforms():
    """The conformance kit, against the plugin as pip installed it (entry point `adam_mini`)."""
    report = assert_plugin_conforms("adam_mini")
    assert [name for names in report.provides.values() for name in names] == [NAME]
    assert report.source == "mlsysim-adam-mini 0.1.0"
