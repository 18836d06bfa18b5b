"""Bytes one transformer decoder layer keeps alive after its forward, during training.

Closed forms for Hugging Face decoder layers (transformers 5.23, torch 2.13, CPU kernels), derived
op by op from what autograd saves for backward. ``layer_forward_bytes`` returns them as ``LayerBytes``:

* ``saved``  -- what the layer's autograd graph keeps for backward, *excluding* the layer's input
  (the previous layer's output) and AMP's cached bf16 weight copies (see ``amp_weight_copies``);
* ``output`` -- the layer's output tensor (the residual stream);
* ``output_saved_by_next`` -- whether the next layer (or the final norm) keeps that output for
  its own backward; if not, the output dies once the next layer's forward is done.

``saved + output`` (+ ``amp_weight_copies`` under AMP) is the growth of live memory across the
layer's forward, which is what ``validation/measurements.json`` records per decoder layer as
``layer_forward_retained_bytes``.

Notation, per token: h hidden, a heads, d head_dim, q = a*d, kv = kv_heads*d, f MLP width,
E experts, k experts per token; S = a*s is the number of eager attention scores per token.
Regimes: ``fp32``; ``bf16`` (parameters in bf16); ``amp-bf16`` (fp32 parameters, forward under
``torch.autocast("cpu", torch.bfloat16)``: linears and matmuls run in bf16 on freshly cast inputs,
norms, softmax and the residual stream stay fp32). On CPU, dropout with p > 0 is ``input * noise``
(the noise tensor, in the input's dtype, is what the multiply saves); with p == 0 it is a no-op.

Llama style (Llama, Mistral, Qwen2: RMSNorm, rotary, separate q/k/v/o, gated SiLU MLP)
-------------------------------------------------------------------------------------
* RMSNorm ``w * (x.float() * rsqrt(mean(x**2) + eps)).to(dtype)``: ``pow`` saves its fp32 input
  (the residual itself in fp32/AMP, so nothing new; in bf16 the fp32 copy, 4h), ``mul`` saves
  ``rsqrt`` (4), the ``w *`` multiply saves the normalized x (fp32 4h; bf16 2h after the cast).
  The norm output is saved by the next linear (fp32 4h, bf16 2h); under AMP every consuming
  linear saves its own bf16 cast instead (q, k, v: 3 x 2h; gate, up: 2 x 2h; router: 2h).
* Rotary ``q*cos + rotate_half(q)*sin`` saves only cos/sin (built once per model); its outputs
  q_embed, k_embed are fp32 under AMP (bf16 q times fp32 cos).
* SDPA (CPU flash kernel) saves q, k, v, its output and the fp32 logsumexp (4a); under AMP q, k
  are cast to bf16 first. The output's transpose to (b, s, a, d) is a view: o_proj saves it.
* Eager: ``matmul(q, k^T)`` saves q and the repeat_kv copy of k (a*d each; with kv_heads == heads
  k_embed itself), ``softmax(dtype=float32)`` saves its fp32 output (4S), the ``.to(bf16)`` copy
  (bf16) or the AMP cast (2S) is what ``matmul(weights, v)`` saves, plus repeated v (a*d);
  o_proj saves the transposed output made contiguous (a*d). With dropout the noise (query's
  dtype: fp32 under AMP, S x 2 or 4) is saved and the matmul saves the dropout output (or its cast).
* SDPA with dropout takes the CPU math kernel, which computes in fp32 whatever the inputs: it
  saves fp32 q and heads-expanded k, v (3 x 4q), fp32 softmax, noise and dropout output (12S) and
  no logsumexp; o_proj saves the contiguous output (a*d, compute dtype).
* The residual after attention ("mid") is saved by the second RMSNorm's ``pow`` in fp32/AMP;
  in bf16 that norm saves its fp32 copy instead and the bf16 mid dies with the layer.
* MLP ``down(silu(gate(x)) * up(x))``: silu saves gate's output, the product saves silu's output
  and up's output, down saves the product: 4f in the compute dtype.

GPT-2 style (LayerNorm with bias, fused c_attn Conv1D, tanh-GELU MLP)
---------------------------------------------------------------------
* ``native_layer_norm`` saves input, mean, rstd: mean and rstd are 2 per token in the input's
  dtype (fp32 under AMP, where layer_norm runs in fp32). Its output is saved by the next addmm
  (fp32 4h, bf16 2h, AMP: its bf16 cast 2h).
* c_attn's output qkv (3h) is one storage; q, k, v are views into it, saved as such.
* SDPA: logsumexp 4a and output h (a view that c_proj saves). Eager: softmax (in the scores'
  dtype: fp32 4S, bf16 2S; AMP softmax is fp32, 4S, then ``.type(v.dtype)`` 2S is saved by the
  matmul) and the contiguous transposed output (h) saved by c_proj.
* The residual after attention is saved by ln_2 (input). gelu_new ``0.5x(1+tanh(c(x+0.044715x^3)))``
  saves 4 f-sized tensors; c_proj saves its output: 5f in the compute dtype.
* Dropout p > 0: attention dropout saves its noise (S, scores' dtype after the cast) and its output
  is what the matmul saves; resid dropout after attention and after the MLP each save a noise of h.
  SDPA with dropout takes the fp32 math kernel: contiguous fp32 q, k, v (12h; in bf16/AMP they
  replace the bf16 qkv; in fp32 at batch 1 v stays a view, so qkv 12h + q, k 8h), fp32 softmax,
  noise and dropout output (12S), the contiguous output (h).

Mixtral style (Llama attention, sparse MoE block, experts_implementation="grouped_mm")
--------------------------------------------------------------------------------------
* Router: linear (saves the norm output, AMP: a bf16 cast), ``softmax(logits.float())`` saves the
  fp32 probabilities (4E), topk saves its int64 indices (8k), the renormalizing ``/=`` saves the
  fp32 sum (4) and its fp32 result (4k).
* Experts: tokens are sorted by expert; the gathers save int64 indices perm // k, perm and
  inv_perm (3 x 8k) and int32 offsets (4E bytes per layer, not per token). grouped_mm is not
  autocast: it casts its input to the weight dtype, so under AMP the experts run in fp32.
  Saved, in that dtype: the gathered input (kh), gate_up output (2kf, silu and the product save
  views of it), silu output (kf), product (kf), down output (kh, saved by the routing-weight
  multiply), and the fp32 routing weights (4k).
"""

from __future__ import annotations

import attrs

STYLES = ("llama", "gpt2", "mixtral")
REGIMES = ("fp32", "amp-bf16", "bf16")
ATTENTIONS = ("eager", "sdpa")


@attrs.frozen(kw_only=True)
class LayerBytes:
    saved: int                   # kept for backward; excludes the layer's input and AMP weight copies
    output: int                  # the layer's output tensor
    output_saved_by_next: bool   # the next layer / final norm saves this output for its backward
    parts: tuple[tuple[str, int], ...] = ()   # named pieces of ``saved``

    @property
    def retained(self) -> int:
        """Growth of live memory across the layer's forward (without AMP weight copies)."""
        return self.saved + self.output


def _check(style: str, regime: str, attention: str) -> None:
    if style not in STYLES:
        raise ValueError(f"unknown layer style {style!r}; expected one of {STYLES}")
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    if attention not in ATTENTIONS:
        raise ValueError(f"unknown attention {attention!r}; expected one of {ATTENTIONS}")


def layer_forward_bytes(*, style: str, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                        regime: str, attention: str, dropout: bool, tokens: int, seq_len: int,
                        experts: int = 0, top_k: int = 0) -> LayerBytes:
    """Bytes one decoder layer keeps alive after its forward (see the module docstring)."""
    _check(style, regime, attention)
    if style == "mixtral" and (experts < 1 or top_k < 1):
        raise ValueError("mixtral style needs experts >= 1 and top_k >= 1")
    h, a, f, k, E = hidden, heads, ffn, top_k, experts
    q = heads * head_dim
    kv = kv_heads * head_dim
    amp = regime == "amp-bf16"
    c = 4 if regime == "fp32" else 2          # compute dtype: linear / matmul outputs
    r = 2 if regime == "bf16" else 4          # residual stream
    S = a * seq_len                           # eager attention scores per token

    parts: list[tuple[str, int]] = []         # bytes per token
    constant: list[tuple[str, int]] = []      # bytes per layer, independent of tokens

    def add(name: str, per_token: int) -> None:
        if per_token:
            parts.append((name, per_token))

    if style == "gpt2":
        ln = 2 * (2 if regime == "bf16" else 4)      # mean + rstd
        add("ln_1 (mean, rstd)", ln)
        add("c_attn input (ln_1 output or its AMP cast)", c * h)
        if attention == "sdpa" and dropout:
            # CPU SDPA with dropout runs the math kernel in fp32: its batched matmuls save contiguous
            # fp32 q, k, v (12h; in bf16/AMP these replace the bf16 qkv). In fp32 with batch 1, v is
            # a view of qkv that needs no copy, so qkv (12h) is saved next to the q, k copies (8h).
            add("q/k/v (fp32, math kernel)", 20 * h if regime == "fp32" and tokens == seq_len else 12 * h)
            add("attention scores", 12 * S)
            add("attention output (contiguous, c_proj input)", c * h)
        elif attention == "sdpa":
            add("qkv (c_attn output)", 3 * c * h)
            add("attention output + logsumexp", c * h + 4 * a)
        else:
            add("qkv (c_attn output)", 3 * c * h)
            scores = (4 if amp else c) * S            # softmax output (fp32 under AMP)
            if dropout:
                scores += 2 * c * S                   # noise + dropout output (saved by the matmul)
            elif amp:
                scores += 2 * S                       # .type(v.dtype): the bf16 copy the matmul saves
            add("attention scores", scores)
            add("attention output (contiguous, c_proj input)", c * h)
        if dropout:
            add("resid dropout noise (attention)", c * h)
        add("mid residual (ln_2 input)", r * h)
        add("ln_2 (mean, rstd)", ln)
        add("c_fc input (ln_2 output or its AMP cast)", c * h)
        add("mlp (gelu_new 4f + c_proj input f)", 5 * c * f)
        if dropout:
            add("resid dropout noise (mlp)", c * h)
        output_saved_by_next = True                   # LayerNorm saves its input in every regime
    else:
        # RMSNorm: fp32 and bf16 save normalized x + output (bf16: + the fp32 copy of x); AMP only
        # the fp32 normalized x (consumers save their own bf16 casts).
        norm = {"fp32": 8 * h + 4, "bf16": 8 * h + 4, "amp-bf16": 4 * h + 4}[regime]
        add("input norm", norm)
        if amp:
            add("q/k/v input casts", 3 * 2 * h)
        if attention == "sdpa" and dropout:
            # CPU SDPA with dropout runs the math kernel in fp32 on heads-expanded k, v.
            add("q/k/v (fp32, math kernel)", 3 * 4 * q)
            add("attention scores", 12 * S)       # softmax, noise, dropout output: all fp32
            add("attention output (contiguous, o_proj input)", c * q)
        elif attention == "sdpa":
            add("q/k/v", c * (q + 2 * kv))
            add("attention output + logsumexp", c * q + 4 * a)
        else:
            add("q/k/v (k, v repeated to all heads)", 3 * c * q)
            scores = 4 * S                            # fp32 softmax output
            if dropout:
                noise = 2 if regime == "bf16" else 4  # dropout runs in query's dtype (fp32 under AMP)
                scores += noise * S + c * S           # noise + what the matmul saves
            elif regime != "fp32":
                scores += 2 * S                       # bf16 copy / AMP cast saved by the matmul
            add("attention scores", scores)
            add("attention output (contiguous, o_proj input)", c * q)
        add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h)
        add("post-attention norm", norm)
        if style == "llama":
            if amp:
                add("gate/up input casts", 2 * 2 * h)
            add("mlp (gate, silu, up, product)", 4 * c * f)
        else:
            ce = 2 if regime == "bf16" else 4         # experts run in the weight dtype
            add("router (input cast, probs, top-k, weights)", (2 * h if amp else 0) + 4 * E + 8 * k + 4 + 4 * k)
            add("expert indices (perm // k, perm, inv_perm)", 3 * 8 * k)
            add("experts (input, gate_up, silu, product, down)", ce * k * (2 * h + 4 * f))
            add("routing weights", 4 * k)
            constant.append(("expert offsets", 4 * E))
        output_saved_by_next = regime != "bf16"       # bf16: the next RMSNorm saves its fp32 copy

    per_layer = tuple((name, n * tokens) for name, n in parts) + tuple(constant)
    saved = sum(n for _, n in per_layer)
    return LayerBytes(saved=saved, output=r * h * tokens, output_saved_by_next=output_saved_by_next,
                      parts=per_layer)


def amp_weight_copies(*, style: str, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                      experts: int = 0) -> int:
    """Bytes of the bf16 copies autocast caches for one layer's matmul weights (AMP only).

    Every linear's weight and bias is cast once per forward and cached while autocast is on:
    q/k/v/o and the MLP (Llama), c_attn/c_proj/c_fc/c_proj with biases (GPT-2), q/k/v/o and the
    router (Mixtral: grouped_mm is not autocast, the expert weights are not copied).
    """
    h, f = hidden, ffn
    q, kv = heads * head_dim, kv_heads * head_dim
    if style == "gpt2":
        params = (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h)
    else:
        params = h * q + 2 * h * kv + q * h
        params += 3 * h * f if style == "llama" else h * experts
    return 2 * params


def megatron_layer_bytes(*, style: str, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                         attention: str, dropout: bool, tokens: int, seq_len: int, experts: int = 0,
                         top_k: int = 0) -> LayerBytes:
    """Bytes one decoder layer saves for backward under Megatron-Core mixed precision
    (16-bit activations, 1-byte dropout masks): Korthikanti et al. 2022 §4.1, whose
    34*s*b*h + 5*a*s^2*b per GPT layer this reproduces exactly, generalised to GQA (K and V
    kv_heads wide), gated MLPs (fc1 output 2f wide + the activation's f-wide output) and
    FlashAttention (the output and the fp32 log-sum-exp instead of the s x s scores).

    Part names say which tensors tensor parallelism splits without sequence parallelism
    (see ``parallel.TP_REPLICATED``): the norm inputs, the QKV and MLP inputs and the dropout
    masks after the row-parallel linears are replicated; the rest lives inside the
    column/row-parallel region."""
    h, a, f = hidden, heads, ffn
    q, kv = heads * head_dim, kv_heads * head_dim
    parts: list[tuple[str, int]] = []

    def add(name, per_token):
        if per_token:
            parts.append((name, per_token))

    add("layernorm inputs", 2 * 2 * h)
    add("qkv input", 2 * h)
    add("q/k/v", 2 * (q + 2 * kv))
    if attention == "eager":
        add("attention scores", a * seq_len * (2 + (1 + 2 if dropout else 0)))   # softmax (+ mask, dropout out)
    else:
        add("attention logsumexp (fp32)", 4 * a)
    add("out-proj input", 2 * q)
    if dropout:
        add("dropout masks (attention, mlp)", 2 * h)
    add("mlp input", 2 * h)
    if style == "mixtral":
        add("router (probabilities, fp32)", 4 * experts)
        add("experts (dispatched input, fc1 output, fc2 input)", top_k * (2 * h + 6 * f))
    else:
        add("mlp (fc1 output, fc2 input)", (6 if style == "llama" else 4) * f)
    per_layer = tuple((name, n * tokens) for name, n in parts)
    return LayerBytes(saved=sum(n for _, n in per_layer), output=2 * h * tokens, output_saved_by_next=False,
                      parts=per_layer)
