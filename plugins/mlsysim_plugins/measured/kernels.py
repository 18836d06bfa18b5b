"""Attention kernels: what one layer's attention saves for backward.

An ``AttentionKernel`` is registered through ``mlsysim_measured_attention_kernels`` and
selected by name (``attention=``). For each attention *layout* it knows it gives the saved
tensors per token as ``layers.Part`` objects (name, bytes, how tensor parallelism splits
them, whether selective recompute drops them). A layout is how a family's layers build
their attention; the built-in ones:

* ``separate-qkv`` -- Llama-like: separate q/k/v projections (GQA: ``kv_dim`` may be
  narrower than ``q_dim``), rotary embeddings, an ``o_proj``;
* ``fused-qkv`` -- GPT-2: one ``c_attn`` output holding q, k and v (``hidden`` wide each),
  a ``c_proj``;
* ``megatron`` -- Megatron-Core's layers (16-bit activations, 1-byte dropout masks); the
  layer counts its own q/k/v, the kernel only what attention itself keeps.

A formula is called with keywords: ``kind`` (the regime's dtype layout: ``"fp32"``,
``"amp-bf16"`` or ``"bf16"``), ``dropout`` (p > 0), ``heads``, ``q_dim``, ``kv_dim``,
``hidden``, ``seq_len``, ``tokens`` (micro-batch x sequence) and ``grads``: which of q, k, v
require grad (all three in full training; LoRA leaves some frozen). It returns the parts
per token, in the order the layer saves them; what the layer's out-projection keeps only
for its own weight gradient is marked ``weight_gradient_only``. See ``layers.py`` for the
derivations (op by op, as PyTorch 2.13 on CPU saves them).

What a kernel *computes* is declared, never read off its name (plugin API 2.3): ``computes``
is ``"sdpa"`` (torch's ``scaled_dot_product_attention``: one fused op that keeps its output
and an fp32 logsumexp, no s x s scores; on the CPU with dropout, or for a layout a GPU runs
in its math kernel, PyTorch's math fallback), ``"eager"`` (``q @ k^T``, softmax, dropout and
``weights @ v`` as separate ops: the s x s scores and an additive mask materialised) or ``""``
(anything else). The physics asks it where the computation matters beyond the formula: a
family's own attention formulas (``ArchitectureFamily.attention_layouts``) and per-op
checkpointing policies are keyed by it, SDPA's sliding-window masks and eager's additive masks
follow it. A kernel under another name that declares ``computes="sdpa"`` and the built-in's
layouts gives the built-in ``sdpa``'s bytes. ``"flex"`` is torch's ``flex_attention``
(``torch/_higher_order_ops/flex_attention.py``, ``FlexAttentionAutogradOp``): one fused op that keeps
q, k and v (k, v at their own heads' width under ``enable_gqa``), its output and the fp32
log-sum-exp per head and token for its backward, no s x s scores (the GPU's Triton kernels; the
CPU's eager ``math_attention`` materialises them as temporaries only), and returns the log-sum-exp
to its caller (``return_aux=AuxRequest(lse=True)``).

A kernel also declares whether it supports learnable attention sinks (``sinks``: gpt-oss's
per-head logit in the softmax's denominator, ``softmax(cat([scores, sink]))[..., :-1]``) without
materialising the scores: ``"lse"``, the caller renormalises the kernel's output with its
log-sum-exp, ``out x exp(lse - logsumexp([lse, sink]))`` (transformers 5.23's
``flex_attention_forward`` with ``s_aux``, as the hub's and vLLM's sink kernels combine them), so
the sinks' gradient flows through that renormalisation and the kernel's saved tensors are its
own; ``""``, none. A family with sinks asks it (``architectures/gpt_oss.py``), never its name.
"""

from __future__ import annotations

from typing import Callable, Mapping

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import NotModelledError

from ._cache import same_object_first
from .layers import Part

SEPARATE_QKV = "separate-qkv"
FUSED_QKV = "fused-qkv"
MEGATRON = "megatron"

ALL_GRAD = (True, True, True)

# What a kernel computes (``AttentionKernel.computes``): machine keys, distinct from kernel names.
COMPUTES_SDPA = "sdpa"
COMPUTES_EAGER = "eager"
COMPUTES_FLEX = "flex"
COMPUTES = (COMPUTES_SDPA, COMPUTES_EAGER, COMPUTES_FLEX, "")
# How a kernel applies learnable attention sinks (``AttentionKernel.sinks``): the module docstring.
SINKS_THROUGH_LSE = "lse"
SINKS = (SINKS_THROUGH_LSE, "")


def _layouts(value) -> tuple[tuple[str, Callable], ...]:
    """A mapping of layout -> formula, kept as sorted pairs (the kernel stays hashable:
    a plan holding it is memoised like any other)."""
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(name), formula) for name, formula in items))


def _computes(instance, attribute, value):
    if value not in COMPUTES:
        raise ValueError(f"AttentionKernel.computes {value!r}; expected one of {COMPUTES}")


def _sinks(instance, attribute, value):
    if value not in SINKS:
        raise ValueError(f"AttentionKernel.sinks {value!r}; expected one of {SINKS}")


@same_object_first
@attrs.frozen(kw_only=True, cache_hash=True)
class AttentionKernel:
    """An attention implementation: per attention layout, what it saves for backward, and
    what it computes (``computes``: ``"sdpa"``, ``"eager"``, ``"flex"`` or ``""``) and how it applies
    learnable attention sinks (``sinks``: ``"lse"`` or ``""``; the module docstring)."""

    name: str
    description: str
    layouts: tuple[tuple[str, Callable[..., tuple]], ...] = attrs.field(converter=_layouts)
    computes: str = attrs.field(default="", validator=_computes)
    sinks: str = attrs.field(default="", validator=_sinks)

    @property
    def sdpa(self) -> bool:
        """Does it run torch's fused ``scaled_dot_product_attention`` (output + logsumexp kept)?"""
        return self.computes == COMPUTES_SDPA

    @property
    def eager(self) -> bool:
        """Does it run attention as separate ops, materialising the s x s scores and the mask?"""
        return self.computes == COMPUTES_EAGER

    def formula(self, layout: str) -> Callable[..., tuple]:
        """The formula for ``layout``; a ``NotModelledError`` naming the kernel, the layout
        and the layouts it knows when it has none."""
        for name, formula in self.layouts:
            if name == layout:
                return formula
        known = ", ".join(name for name, _ in self.layouts) or "none"
        raise NotModelledError("attention", self.name,
                               f"a kernel with a formula for the {layout!r} attention layout",
                               f"kernel {self.name!r} knows the layouts: {known}")

    def saved(self, layout: str, *, kind: str, dropout: bool, heads: int, q_dim: int, kv_dim: int, hidden: int,
              seq_len: int, tokens: int, grads: tuple[bool, bool, bool] = ALL_GRAD) -> tuple:
        """The attention's saved parts per token (``layers.Part``) for ``layout``."""
        return tuple(self.formula(layout)(kind=kind, dropout=dropout, heads=heads, q_dim=q_dim, kv_dim=kv_dim,
                                          hidden=hidden, seq_len=seq_len, tokens=tokens, grads=grads))


def _c(kind: str) -> int:
    """Bytes of the compute dtype (linear and matmul outputs)."""
    return 4 if kind == "fp32" else 2


# --- SDPA ---------------------------------------------------------------------------------

def _sdpa_separate(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    c, q = _c(kind), q_dim
    if dropout:
        # CPU SDPA with dropout runs the math kernel in fp32 on heads-expanded k, v:
        # softmax, noise and dropout output all fp32.
        return (Part("q/k/v (fp32, math kernel)", 3 * 4 * q, op="_to_copy"),
                Part("attention scores", 12 * heads * seq_len, recomputed_by_selective=True, op="_softmax+dropout"),
                Part("attention output (contiguous, o_proj input)", c * q, weight_gradient_only=True, op="clone"))
    # q, k: the rotary embedding's outputs (add); v: a view of v_proj's mm output.
    return (Part("q/k/v", c * (q + 2 * kv_dim), op="add+add+mm"),
            Part("attention output + logsumexp", c * q + 4 * heads, op="sdpa"))


def _expanded_kv(c, q_dim, kv_dim):
    """A fused c_attn with fewer key/value heads than query heads (a Megatron GPT's
    ``num_query_groups``) under attention that runs on all query heads (eager, the CPU math
    kernel): k and v expanded to the query heads' width, two contiguous copies the matmuls keep
    (as Llama's eager ``repeat_kv``). Derived, not measured: no Hugging Face layer runs it."""
    return 2 * c * q_dim if kv_dim != q_dim else 0


def _sdpa_fused(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    c = _c(kind)
    if dropout:
        # CPU SDPA with dropout runs the math kernel in fp32: its batched matmuls save contiguous
        # fp32 q, k, v (12h; in bf16/AMP these replace the bf16 qkv). In fp32 with batch 1, v is
        # a view of qkv that needs no copy, so qkv (12h) is saved next to the q, k copies (8h).
        # (Fewer kv heads: k, v expanded to the query heads, q_dim wide; GPT-2: q_dim = h.)
        q = q_dim
        qkv = 4 * (q + 2 * kv_dim) + 8 * q if kind == "fp32" and tokens == seq_len else 12 * q
        return (Part("q/k/v (fp32, math kernel)", qkv),
                Part("attention scores", 12 * heads * seq_len, recomputed_by_selective=True),
                Part("attention output (contiguous, c_proj input)", c * q, weight_gradient_only=True))
    # c_attn's output: q + 2 kv columns (GPT-2: 3h); the output has the query heads' width
    return (Part("qkv (c_attn output)", c * (q_dim + 2 * kv_dim)),
            Part("attention output + logsumexp", c * q_dim + 4 * heads))


def _flash_megatron(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    return (Part("attention logsumexp (fp32)", 4 * heads),)


# --- eager ----------------------------------------------------------------------------------

def _eager_separate(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    c, q, S = _c(kind), q_dim, heads * seq_len
    q_grad, k_grad, _ = grads
    # q @ k^T keeps k for q's gradient and q for k's; weights @ v keeps v (all heads-expanded)
    # when the weights need a gradient (q's or k's).
    qkv = c * q * (int(q_grad) + int(k_grad) + int(q_grad or k_grad))
    scores = 4 * S                            # fp32 softmax output
    if dropout:
        noise = 2 if kind == "bf16" else 4    # dropout runs in query's dtype (fp32 under AMP)
        scores += noise * S + c * S           # noise + what the matmul saves
    elif kind != "fp32":
        scores += 2 * S                       # bf16 copy / AMP cast saved by the matmul
    return (Part("q/k/v (k, v repeated to all heads)", qkv, op="add+clone+clone"),
            Part("attention scores", scores, recomputed_by_selective=True, op="_softmax+_to_copy"),
            Part("attention output (contiguous, o_proj input)", c * q, weight_gradient_only=True, op="clone"))


def _eager_fused(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    c, S = _c(kind), heads * seq_len
    amp = kind == "amp-bf16"
    scores = (4 if amp else c) * S            # softmax output (fp32 under AMP)
    if dropout:
        scores += 2 * c * S                   # noise + dropout output (saved by the matmul)
    elif amp:
        scores += 2 * S                       # .type(v.dtype): the bf16 copy the matmul saves
    return (Part("qkv (c_attn output)", c * (q_dim + 2 * kv_dim) + _expanded_kv(c, q_dim, kv_dim)),
            Part("attention scores", scores, recomputed_by_selective=True),
            Part("attention output (contiguous, c_proj input)", c * q_dim, weight_gradient_only=True))


def _eager_megatron(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads):
    # softmax (+ the 1-byte dropout mask and the dropout output), 16-bit
    return (Part("attention scores", heads * seq_len * (2 + (1 + 2 if dropout else 0)),
                 recomputed_by_selective=True),)


SDPA = AttentionKernel(
    name="sdpa", description="torch scaled_dot_product_attention (fused: no s x s scores; with dropout on CPU "
                             "the fp32 math kernel), FlashAttention under Megatron-Core",
    layouts={SEPARATE_QKV: _sdpa_separate, FUSED_QKV: _sdpa_fused, MEGATRON: _flash_megatron},
    computes=COMPUTES_SDPA)
EAGER = AttentionKernel(
    name="eager", description="eager attention: q @ k^T, softmax and its s x s scores kept for backward",
    layouts={SEPARATE_QKV: _eager_separate, FUSED_QKV: _eager_fused, MEGATRON: _eager_megatron},
    computes=COMPUTES_EAGER)

# No formula of its own: a family whose layout it runs gives one (``ArchitectureFamily.attention_layouts``,
# keyed "flex": gpt-oss's, validation/families/gpt_oss/measure_flex_sinks.py); any other is refused by name.
FLEX_ATTENTION = AttentionKernel(
    name="flex_attention", description="torch flex_attention (fused: q, k, v, output and the fp32 log-sum-exp kept, "
                                       "no s x s scores), learnable sinks through its log-sum-exp (transformers' "
                                       "flex_attention_forward)",
    layouts={}, computes=COMPUTES_FLEX, sinks=SINKS_THROUGH_LSE)

BUILTIN_KERNELS: Mapping[str, AttentionKernel] = {k.name: k for k in (SDPA, EAGER, FLEX_ATTENTION)}


def kernel_of(plan) -> AttentionKernel:
    """The attention kernel a prepared plan uses: the object ``prepare`` chose
    (``profile_options.attention_kernel``), else the built-in named ``attention``."""
    o = plan.profile_options
    kernel = getattr(o, "attention_kernel", None)
    return kernel if kernel is not None else resolve(o.attention)


def resolve(attention, kernels: Mapping[str, AttentionKernel] | None = None) -> AttentionKernel:
    """``attention`` as a kernel: a kernel object as is, a name looked up in ``kernels``
    (the registered ones; the built-ins when None). An unknown name is a ``ValueError``."""
    if isinstance(attention, AttentionKernel):
        return attention
    kernels = BUILTIN_KERNELS if kernels is None else kernels
    try:
        return kernels[attention]
    except (KeyError, TypeError):
        raise ValueError(f"unknown attention {attention!r}; expected one of {tuple(kernels)}") from None


@hookimpl
def mlsysim_measured_attention_kernels():
    return list(BUILTIN_KERNELS.values())
