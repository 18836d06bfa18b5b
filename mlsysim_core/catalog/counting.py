"""Exact parameter counts of transformer configs, as Hugging Face's ``num_parameters()`` gives them.

The curated catalog records each model's parameter count *exactly*. Where the publisher
gives only a rounded figure ("8B", "175.0B"), the count here is computed from the public
``config.json`` with ``count_parameters()``, and a test recomputes every curated entry.

Covered: decoder-only transformers of the Llama family (RMSNorm, SwiGLU, GQA, untied or
tied embeddings), GPT-2-style blocks (LayerNorm with bias, biased projections, learned
position embeddings), Qwen's q/k/v biases, Gemma 2's four norms per layer, Falcon's
parallel attention, OLMo's non-parametric LayerNorm and OLMo 2's QK-norm, mixture-of-experts
layers (routed and shared experts, a router, optional leading dense layers) and DeepSeek's
multi-head latent attention (MLA). Not covered (pass ``extra_per_layer`` or count by hand):
anything else.

Conventions:

* ``total`` is every parameter stored once (tied input/output embeddings count once).
* ``active`` (MoE) is what one token touches: ``total`` minus the routed experts it does
  not use. The embedding matrices, router and shared experts count in full. This is
  Mistral's and Qwen's convention (Mixtral-8x7B: 12.9B); DeepSeek's published figures
  (V3: 37B, V2-Lite: 2.4B) leave out the input embedding matrix.

Example::

    >>> count_parameters(layers=12, hidden_dim=768, heads=12, vocab_size=50257, ffn_dim=3072,
    ...                  gated_mlp=False, tied_embeddings=True, norm="layer", qkv_bias=True,
    ...                  attention_out_bias=True, mlp_bias=True, position_embeddings=1024).total
    124439808
"""

from __future__ import annotations

from typing import Mapping

import attrs

NORMS = ("rms", "layer", "none")


@attrs.frozen
class ParameterCount:
    """``total`` parameters and, for a mixture of experts, ``active`` per token (else = total)."""

    total: int
    active: int


def norm_parameters(dim: int, norm: str = "rms") -> int:
    """One normalisation layer over ``dim``: RMSNorm has a scale, LayerNorm a scale and a bias."""
    if norm not in NORMS:
        raise ValueError(f"norm={norm!r}: one of {NORMS}")
    return {"rms": dim, "layer": 2 * dim, "none": 0}[norm]


def attention_parameters(hidden_dim: int, heads: int, kv_heads: int | None = None,
                         head_dim: int | None = None, *, qkv_bias: bool = False,
                         out_bias: bool = False) -> int:
    """Q, K, V and output projections (MHA, GQA or MQA), with optional biases."""
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim = hidden_dim // heads if head_dim is None else head_dim
    q, kv = heads * head_dim, kv_heads * head_dim
    count = hidden_dim * q + 2 * hidden_dim * kv + q * hidden_dim
    if qkv_bias:
        count += q + 2 * kv
    if out_bias:
        count += hidden_dim
    return count


def mla_attention_parameters(hidden_dim: int, heads: int, *, kv_lora_rank: int,
                             qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int,
                             q_lora_rank: int | None = None, norm: str = "rms") -> int:
    """DeepSeek's multi-head latent attention (V2, V3): low-rank KV (and optionally Q) projections."""
    qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
    if q_lora_rank is None:
        q = hidden_dim * heads * qk_head_dim
    else:
        q = hidden_dim * q_lora_rank + norm_parameters(q_lora_rank, norm) + q_lora_rank * heads * qk_head_dim
    kv = (hidden_dim * (kv_lora_rank + qk_rope_head_dim) + norm_parameters(kv_lora_rank, norm)
          + kv_lora_rank * heads * (qk_nope_head_dim + v_head_dim))
    return q + kv + heads * v_head_dim * hidden_dim


def mlp_parameters(hidden_dim: int, ffn_dim: int, *, gated: bool = True, bias: bool = False) -> int:
    """A feed-forward block: gate, up and down (gated, SwiGLU/GeGLU) or up and down (plain)."""
    count = (3 if gated else 2) * hidden_dim * ffn_dim
    if bias:
        count += (2 if gated else 1) * ffn_dim + hidden_dim
    return count


def count_parameters(*, layers: int, hidden_dim: int, heads: int, vocab_size: int,
                     ffn_dim: int | None = None, kv_heads: int | None = None,
                     head_dim: int | None = None, gated_mlp: bool = True,
                     tied_embeddings: bool = False, norm: str = "rms", norms_per_layer: int = 2,
                     final_norm: bool = True, qkv_bias: bool = False,
                     attention_out_bias: bool = False, mlp_bias: bool = False, qk_norm: bool | str = False,
                     position_embeddings: int = 0, extra_per_layer: int = 0,
                     experts: int | None = None, active_experts_per_token: int | None = None,
                     expert_ffn_dim: int | None = None, shared_experts: int = 0,
                     dense_layers: int = 0, router_bias: bool = False,
                     shared_expert_gate: bool = False, shared_expert_ffn_dim: int | None = None,
                     kv_lora_rank: int | None = None,
                     q_lora_rank: int | None = None, qk_nope_head_dim: int | None = None,
                     qk_rope_head_dim: int | None = None, v_head_dim: int | None = None,
                     extra_parameters: int = 0) -> ParameterCount:
    """The exact parameter count of a decoder-only transformer config.

    Arguments are ``config.json``'s, under this package's field names: ``ffn_dim`` is
    ``intermediate_size`` (the dense MLP width), ``norms_per_layer`` counts the norm layers
    over ``hidden_dim`` in each block (2 for Llama, 4 for Gemma 2, 1 for Falcon-7B's
    parallel attention), ``qk_norm`` adds OLMo 2's norms over the full query and key
    widths, ``position_embeddings`` is the number of learned positions (GPT-2's
    ``n_positions``; 0 for RoPE). A mixture of experts gives ``experts`` routed experts of
    width ``expert_ffn_dim`` per MoE layer, ``shared_experts`` always-on experts of that
    width, a router (``hidden_dim x experts``, plus a bias vector with ``router_bias``)
    and, with ``shared_expert_gate``, Qwen's scalar gate on the shared expert;
    ``shared_expert_ffn_dim`` gives the shared experts their own width (Qwen's
    ``shared_expert_intermediate_size``: one shared expert of that width). ``dense_layers``
    layers use a dense MLP of width ``ffn_dim`` instead (the first ones in DeepSeek; where
    they sit, e.g. Qwen's ``mlp_only_layers``, does not change the count). ``kv_lora_rank``
    switches the attention to MLA. ``extra_parameters`` is added once, to ``total`` and
    ``active`` alike (biases that differ between dense and MoE blocks, for instance).
    """
    kv_heads = heads if kv_heads is None else kv_heads
    head_dim = hidden_dim // heads if head_dim is None else head_dim
    if kv_lora_rank is not None:
        attention = mla_attention_parameters(
            hidden_dim, heads, kv_lora_rank=kv_lora_rank, q_lora_rank=q_lora_rank,
            qk_nope_head_dim=qk_nope_head_dim, qk_rope_head_dim=qk_rope_head_dim,
            v_head_dim=v_head_dim, norm=norm)
    else:
        attention = attention_parameters(hidden_dim, heads, kv_heads, head_dim, qkv_bias=qkv_bias,
                                         out_bias=attention_out_bias)
    if qk_norm == "head":
        attention += 2 * norm_parameters(head_dim, norm)
    elif qk_norm:
        attention += norm_parameters(heads * head_dim, norm) + norm_parameters(kv_heads * head_dim, norm)
    block = attention + norms_per_layer * norm_parameters(hidden_dim, norm) + extra_per_layer

    embeddings = vocab_size * hidden_dim * (1 if tied_embeddings else 2) + position_embeddings * hidden_dim
    outside = embeddings + (norm_parameters(hidden_dim, norm) if final_norm else 0) + extra_parameters

    if experts is None:
        if ffn_dim is None:
            raise ValueError("ffn_dim is required for a dense model")
        total = layers * (block + mlp_parameters(hidden_dim, ffn_dim, gated=gated_mlp, bias=mlp_bias)) + outside
        return ParameterCount(total, total)

    if expert_ffn_dim is None or active_experts_per_token is None:
        raise ValueError("a mixture of experts needs expert_ffn_dim and active_experts_per_token")
    expert = mlp_parameters(hidden_dim, expert_ffn_dim, gated=gated_mlp, bias=mlp_bias)
    shared = expert if shared_expert_ffn_dim is None else mlp_parameters(
        hidden_dim, shared_expert_ffn_dim, gated=gated_mlp, bias=mlp_bias)
    moe_common = (block + shared_experts * shared + hidden_dim * experts + (experts if router_bias else 0)
                  + (hidden_dim if shared_expert_gate else 0))
    dense = 0
    if dense_layers:
        if ffn_dim is None:
            raise ValueError("dense_layers needs ffn_dim (the dense MLP width)")
        dense = dense_layers * (block + mlp_parameters(hidden_dim, ffn_dim, gated=gated_mlp, bias=mlp_bias))
    moe_layers = layers - dense_layers
    total = dense + moe_layers * (moe_common + experts * expert) + outside
    active = dense + moe_layers * (moe_common + active_experts_per_token * expert) + outside
    return ParameterCount(total, active)


# Fields of a catalog model passed to count_parameters as they are.
_WORKLOAD_ARGS = ("layers", "hidden_dim", "heads", "kv_heads", "head_dim", "vocab_size", "ffn_dim",
                  "gated_mlp", "tied_embeddings", "kv_lora_rank", "qk_rope_head_dim", "experts",
                  "active_experts_per_token", "shared_experts", "expert_ffn_dim")


def count_workload_parameters(workload, counting: Mapping[str, object] | None = None) -> ParameterCount:
    """``count_parameters()`` for a ``TransformerWorkload``; ``counting`` gives what it lacks.

    Curated catalog entries record those extra arguments under ``extra["counting"]``, so
    ``count_workload_parameters(entry.value, entry.extra["counting"])`` recomputes them.
    """
    args = {name: getattr(workload, name, None) for name in _WORKLOAD_ARGS}
    args = {k: v for k, v in args.items() if v is not None}
    if not getattr(workload, "is_sparse", False):
        for name in ("experts", "active_experts_per_token", "shared_experts", "expert_ffn_dim"):
            args.pop(name, None)
    args.update(counting or {})
    return count_parameters(**args)
