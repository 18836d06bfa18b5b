"""Megatron-Core rules (issue 25 item 4): the distributed optimizer as a data-parallel rule,
grouped-query attention in the non-gated GPT layer. Numbers derived by hand from Megatron-LM's
source at d98e8a64dd (docs/user-guide/features/dist_optimizer.md, param_and_grad_buffer.py,
distrib_optimizer.py)."""

import attrs
import pytest

import mlsysim_core
from mlsysim_core import TransformerWorkload
from mlsysim_core.errors import InvalidInputError, MlsysimError
from mlsysim_core.terms import OPTIMIZER_STEP
from mlsysim_plugins.measured.regimes import REGIMES
from mlsysim_plugins.steptime_hookspecs import collectives

P = 8_030_261_248           # llama3-8b's parameters
MEGATRON = dict(precision="bf16", regime="mixed-bf16-main-grad", optimizer_impl="fused")


def _states(rule, d, **more):
    r = mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=d, data_parallel=rule, **{**MEGATRON, **more})
    steady = [t for t in r.terms if t.component in ("weights", "gradients", "optimizer_state")
              and "step" not in t.label and "RoPE" not in t.label]
    return r, sum(t.nbytes for t in steady) / P


@pytest.mark.parametrize("d", [1, 2, 8])
def test_distributed_optimizer_is_6_plus_12_over_d(d):
    # bf16 weights (2) + the whole fp32 main-grad buffer (4) + (fp32 master 4 + Adam 4 + 4) / d
    _, per_parameter = _states("mcore-distopt", d)
    assert per_parameter == pytest.approx(6 + 12 / d, rel=1e-6)


def test_zero1_unchanged_2_plus_16_over_d():
    # the main-grad regime requires Megatron-Core's rules (Regime.requires): under ZeRO-1 it is refused; a copy
    # that declares nothing keeps ZeRO-1's own count, the main grad sharded with the optimizer state
    with pytest.raises(InvalidInputError, match=r"data_parallel='zero1' is not allowed: a data-parallel rule that "
                                                r"declares 'megatron-main-grad' under regime 'mixed-bf16-main-grad'"):
        _states("zero1", 8)
    anywhere = attrs.evolve(REGIMES["mixed-bf16-main-grad"], requires=())
    _, per_parameter = _states("zero1", 8, regime=anywhere)
    assert per_parameter == pytest.approx(2 + 16 / 8, rel=1e-6)


def test_megatron_ddp_is_18():
    _, per_parameter = _states("mcore-ddp", 8)
    assert per_parameter == pytest.approx(18, rel=1e-6)


def test_grad_reduce_in_bf16():
    r, per_parameter = _states("mcore-distopt", 8,
                               plugin_options={"mcore-distopt": {"grad_reduce_in_bf16": True}})
    assert per_parameter == pytest.approx(2 + 2 + 12 / 8, rel=1e-6)      # a 16-bit grad buffer
    (copy,) = [t for t in r.terms if "fp32 copy of the grad shard" in t.label]
    assert copy.phases == (OPTIMIZER_STEP,) and copy.nbytes == pytest.approx(4 * P / 8)   # .float() of the shard


def test_refused_outside_the_megatron_regime():
    with pytest.raises(MlsysimError, match="mcore-distopt"):
        mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=8, data_parallel="mcore-distopt",
                              precision="bf16", regime="mixed-bf16")


def test_collectives_declared():
    from mlsysim_core.manager import get_plugin_manager
    rules = get_plugin_manager().registry.sharding_rules
    kinds = [(c.kind, c.per, c.overlaps) for c in collectives(rules["mcore-distopt"])]
    assert kinds == [("reduce-scatter", "step", "backward"), ("all-gather", "step", "forward")]
    assert [c.kind for c in collectives(rules["mcore-ddp"])] == ["all-reduce"]


# --- grouped-query attention in the non-gated GPT layer ------------------------------------------

def _gpt(kv_heads, tied=True):
    # Megatron GPT: L=2, h=256, 8 heads of 32, --num-query-groups kv_heads, ffn 1024, V=1024,
    # learned positions 512, LayerNorm, biases.
    return TransformerWorkload(name="megatron-gqa", parameters=1, layers=2, hidden_dim=256, heads=8,
                               kv_heads=kv_heads, vocab_size=1024, ffn_dim=1024, gated_mlp=False,
                               tied_embeddings=tied, context_length=512, architecture="gpt2")


def _tensors(model):
    from mlsysim_plugins.measured.families import BUILTIN_FAMILIES
    from mlsysim_plugins.measured.shapes import ModelShape
    return sum(ModelShape.of(model, BUILTIN_FAMILIES["gpt2"]).parameter_tensors())


def test_gqa_parameter_count_by_hand():
    # per layer: LN 2h=512; qkv h(q+2kv)=256x(256+2x64)=98,304 + bias 384; proj qh=65,536 + 256;
    # LN 512; fc1 262,144 + 1,024; fc2 262,144 + 256 -> 691,072
    layer = 512 + 98_304 + 384 + 65_536 + 256 + 512 + 262_144 + 1_024 + 262_144 + 256
    assert layer == 691_072
    total = 1024 * 256 + 512 * 256 + 2 * layer + 512          # embedding, positions, layers, final LN
    assert _tensors(_gpt(2)) == total == 1_775_872
    assert _tensors(_gpt(2, tied=False)) == total + 1024 * 256    # Megatron's untied output layer
    # full heads: GPT-2's 3h x h, unchanged
    assert _tensors(_gpt(8)) == 1024 * 256 + 512 * 256 + 2 * (layer + 2 * (256 - 64) * 256 + 2 * (256 - 64)) + 512


def test_gqa_reader_count_matches_family():
    from mlsysim_plugins.launch.megatron import read_arguments
    reading = read_arguments("--num-layers 2 --hidden-size 256 --num-attention-heads 8 --group-query-attention "
                             "--num-query-groups 2 --ffn-hidden-size 1024 --vocab-size 1024 --make-vocab-size-divisible-by 1 "
                             "--seq-length 512 --max-position-embeddings 512 --micro-batch-size 1 --bf16")
    assert reading.model.becomes["parameters"] == 1_775_872 and reading.model.becomes["kv_heads"] == 2


def test_gqa_megatron_activations_use_kv_heads():
    from mlsysim_plugins.measured.layers import megatron_layer_bytes
    from mlsysim_plugins.measured.kernels import SDPA
    kw = dict(style="gpt2", hidden=256, heads=8, head_dim=32, ffn=1024, attention=SDPA, dropout=False, tokens=512,
              seq_len=512)
    full, gqa = megatron_layer_bytes(kv_heads=8, **kw), megatron_layer_bytes(kv_heads=2, **kw)
    assert full.saved - gqa.saved == 512 * 2 * 2 * (8 - 2) * 32      # K and V, 16-bit, per token


def test_gqa_fused_layer_pytorch_path():
    from mlsysim_plugins.measured.kernels import EAGER, FUSED_QKV, SDPA
    kw = dict(kind="bf16", heads=8, q_dim=256, kv_dim=64, hidden=256, seq_len=512, tokens=512)
    parts = SDPA.saved(FUSED_QKV, dropout=False, **kw)
    assert parts[0].nbytes == 2 * (256 + 2 * 64)                      # c_attn's output: q + 2 kv columns
    # eager: k and v expanded to the query heads (two q-wide copies), as Llama's repeat_kv
    assert EAGER.saved(FUSED_QKV, dropout=False, **kw)[0].nbytes == 2 * (256 + 2 * 64) + 2 * 2 * 256
    # full heads: GPT-2's 3h, unchanged
    full = dict(kw, kv_dim=256)
    assert EAGER.saved(FUSED_QKV, dropout=False, **full)[0].nbytes == SDPA.saved(FUSED_QKV, dropout=False,
                                                                                 **full)[0].nbytes == 3 * 2 * 256


# --- gradient_accumulation_fusion: TransformerEngine's cached dummy weight gradients -----------------
# (plugins/mlsysim_plugins/megatron.py: TE v2.7 base.py get_dummy_wgrad, one bf16 tensor per distinct weight
# shape; megatron-core core_v0.14.0 tensor_parallel/layers.py for the LM head)

FUSED = {"mcore-distopt": {"gradient_accumulation_fusion": True}}


def _llama3_8b_dummies(tp, head=True):
    # llama3-8b: h 4096, 32 heads x 128, 8 KV heads, ffn 14336 (SwiGLU: fc1 2 x 14336), V 128,256, untied
    h, q, kv, f, V = 4096, 32 * 128, 8 * 128, 14336, 128256
    shapes = [((q + 2 * kv) // tp, h), (h, q // tp), (2 * f // tp, h), (h, f // tp)] + ([(V // tp, h)] if head else [])
    return 2 * sum(r * c for r, c in shapes)


@pytest.mark.parametrize("tp", [1, 2])
def test_dummy_wgrads_by_hand(tp):
    r = mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=8, tp_size=tp, data_parallel="mcore-distopt",
                              plugin_options=FUSED, **MEGATRON)
    (dummy,) = [t for t in r.terms if "dummy weight gradients" in t.label]
    assert dummy.nbytes == _llama3_8b_dummies(tp)
    assert dummy.phases == ("forward", "backward", "backward_end", "optimizer_step")


def test_dummy_wgrads_lm_head_on_the_last_stage_only():
    r = mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=4, pp_size=2, data_parallel="mcore-distopt",
                              plugin_options=FUSED, **MEGATRON)
    first, last = r.ranks[0], r.ranks[-1]
    (a,) = [t for t in first.terms if "dummy weight gradients" in t.label]
    (b,) = [t for t in last.terms if "dummy weight gradients" in t.label]
    assert (a.nbytes, b.nbytes) == (_llama3_8b_dummies(1, head=False), _llama3_8b_dummies(1))


def test_fusion_off_by_default_changes_nothing():
    plain = mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=8, data_parallel="mcore-distopt", **MEGATRON)
    off = mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=8, data_parallel="mcore-distopt",
                                plugin_options={"mcore-distopt": {"gradient_accumulation_fusion": False}}, **MEGATRON)
    assert [(t.label, t.nbytes) for t in plain.terms] == [(t.label, t.nbytes) for t in off.terms]
    assert not [t for t in plain.terms if "dummy" in t.label]


def test_fusion_refused_without_the_main_grad_buffer():
    with pytest.raises(MlsysimError, match="gradient_accumulation_fusion"):
        mlsysim_core.estimate("llama3-8b", "h100", 64, 1024, dp_size=1, data_parallel="mcore-ddp",
                              plugin_options={"mcore-ddp": {"gradient_accumulation_fusion": True}},
                              precision="bf16", regime="mixed-bf16")


def test_tied_gradient_with_the_fusion_by_hand():
    # llama3.2-1b (tied, V 128,256, h 2048) on one stage: the lookup's bf16 [V, h] gradient and its out-of-place
    # sum with the LM head's held dummy (2 x V x h x 2 B) instead of the profile's 3 [V, h] (the LM head's and the
    # lookup's gradients and their sum, each made in the bf16 weights' dtype)
    V, h = 128256, 2048
    kw = dict(dp_size=8, data_parallel="mcore-distopt", **MEGATRON)
    on = mlsysim_core.estimate("llama3.2-1b", "h100", 64, 1024, plugin_options=FUSED, **kw)
    off = mlsysim_core.estimate("llama3.2-1b", "h100", 64, 1024, **kw)
    (a,) = [t for t in on.terms if t.label.startswith("tied embedding gradient")]
    (b,) = [t for t in off.terms if t.label.startswith("tied embedding gradient")]
    assert (a.nbytes, b.nbytes) == (2 * V * h * 2, 3 * V * h * 2)
    assert a.phases == b.phases == ("backward_end",)
