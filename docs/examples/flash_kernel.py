"""An attention kernel for the measured profile: FlashAttention-2 (the flash_attn package).
It saves q, k and v (k and v not repeated to every head), its output and the fp32
log-sum-exp per head; with dropout it keeps the RNG state, not a mask, so dropout adds
nothing. Select it with attention="myorg.flash2"."""

from mlsysim_core import hookimpl
from mlsysim_plugins.measured.kernels import FUSED_QKV, SEPARATE_QKV, AttentionKernel
from mlsysim_plugins.measured.layers import Part


def _bytes(kind):
    return 4 if kind == "fp32" else 2          # the compute dtype: q, k, v and the output


def separate_qkv(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    """Llama-like layers: separate q/k/v projections (kv_dim may be narrower: GQA)."""
    c = _bytes(kind)
    return (Part("q/k/v", c * (q_dim + 2 * kv_dim)),
            Part("attention output + logsumexp", c * q_dim + 4 * heads))


def fused_qkv(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    """GPT-2-like layers: one c_attn output holds q, k and v."""
    c = _bytes(kind)
    return (Part("qkv (c_attn output)", 3 * c * hidden),
            Part("attention output + logsumexp", c * hidden + 4 * heads))


FLASH2 = AttentionKernel(name="myorg.flash2",
                         description="FlashAttention-2: no s x s tensors, no dropout mask (RNG state only)",
                         layouts={SEPARATE_QKV: separate_qkv, FUSED_QKV: fused_qkv})


@hookimpl
def mlsysim_measured_attention_kernels():
    return [FLASH2]
