"""An architecture family for the measured profile: Llama's attention (RMSNorm, rotary
positions, separate q/k/v/o projections, GQA) with a plain squared-ReLU MLP,
down(relu(up(x))^2). It models the workloads whose architecture is "myorg_relu2"
(TransformerWorkload(architecture="myorg_relu2", gated_mlp=False, ...)).

Its layer is derived for the pure 16-bit and fp32 regimes only; under autocast it says so
(NotModelledError) instead of guessing."""

from mlsysim_core import NotModelledError, hookimpl
from mlsysim_plugins.measured import layers
from mlsysim_plugins.measured.families import RMS_NORM, ArchitectureFamily, LayerWeight
from mlsysim_plugins.measured.kernels import SEPARATE_QKV
from mlsysim_plugins.measured.layers import REPLICATED, LayerBytes, Part


def layer_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    """One layer's parameter tensors, in registration order (all split by tensor parallelism)."""
    h = hidden
    return (LayerWeight("q_proj", h * q_dim), LayerWeight("k_proj", h * kv_dim), LayerWeight("v_proj", h * kv_dim),
            LayerWeight("o_proj", q_dim * h), LayerWeight("up_proj", h * ffn), LayerWeight("down_proj", ffn * h))


def parameter_tensors(shape):
    """Every parameter tensor's elements, in registration order: the embedding, per layer
    the matrices then the two norms, the final norm, the LM head (unless tied)."""
    h = shape.hidden
    per_layer = tuple(n for _, n in shape.layer_matrices()) + (h, h)
    return (shape.embedding_parameters,) + per_layer * shape.layers + (h,) + (
        () if shape.tied else (shape.embedding_parameters,))


def matrix_shapes(shape):
    """(rows, cols) of the same tensors; cols 0 for a vector (factored optimizers read it)."""
    h, f, V = shape.hidden, shape.ffn, shape.vocab
    per_layer = [(shape.q_dim, h), (shape.kv_dim, h), (shape.kv_dim, h), (h, shape.q_dim), (f, h), (h, f),
                 (h, 0), (h, 0)]
    return [(V, h)] + per_layer * shape.layers + [(h, 0)] + ([] if shape.tied else [(V, h)])


def layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens, seq_len,
          model=None):
    """What one layer keeps for backward, per token, then per layer (``regime``: "fp32",
    "bf16" or "amp-bf16", the dtype layout of the run)."""
    if regime == "amp-bf16":
        raise NotModelledError("regime", "autocast (amp-bf16, amp-fp16)",
                               "a pure 16-bit or fp32 regime: bf16, fp16, mixed-bf16, fp32",
                               "myorg.relu2's layer is not derived under autocast")
    c = 4 if regime == "fp32" else 2          # bytes of a matmul output
    h = hidden
    per_token = (
        # RMSNorm (as Llama's): its input's fp32 copy (4h; in fp32 the input itself), rsqrt (4),
        # the normalized x and its output, saved by the next linear (2 x c x h).
        Part("input norm", 8 * h + 4, split=REPLICATED),
        # the attention's part comes from the selected kernel (sdpa, eager, a plugin's)
        *attention(kind=regime, dropout=dropout, heads=heads, q_dim=heads * head_dim,
                   kv_dim=kv_heads * head_dim, hidden=h, seq_len=seq_len, tokens=tokens),
        Part("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, split=REPLICATED),
        Part("post-attention norm", 8 * h + 4, split=REPLICATED),
        # relu saves its output, pow(2) the same tensor, down_proj its input (the square)
        Part("mlp (relu output, its square)", 2 * c * ffn),
    )
    parts = tuple(Part(p.name, p.nbytes * tokens, split=p.split, recomputed_by_selective=p.recomputed_by_selective,
                       weight_gradient_only=p.weight_gradient_only) for p in per_token if p.nbytes)
    residual = 2 if regime == "bf16" else 4
    return LayerBytes(saved=sum(p.nbytes for p in parts), output=residual * h * tokens,
                      output_saved_by_next=regime != "bf16",   # bf16: the next norm keeps its fp32 copy instead
                      parts=parts)


RELU2 = ArchitectureFamily(
    name="myorg.relu2", label="ReLU²",
    description="Llama attention with a plain squared-ReLU MLP",
    architectures=("myorg_relu2",),     # the model.architecture (HF model_type) values it claims
    gated_mlp=False,                    # a plain MLP: it also claims models that say gated_mlp=False
    norm=RMS_NORM, positions="rotary", attention_layout=SEPARATE_QKV,
    layer_weights=layer_weights, parameter_tensors=parameter_tensors, matrix_shapes=matrix_shapes,
    layer=layer,
    megatron_mlp=layers.megatron_plain_mlp)   # Megatron-Core: costed as a plain MLP (fc1 output + activation)


@hookimpl
def mlsysim_measured_architectures():
    return [RELU2]
