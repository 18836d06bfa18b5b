"""Bytes one decoder layer of a Mamba-2 hybrid keeps alive for backward, and its parameters.

Pure Python (no torch, no mlsysim_core): closed forms for transformers' ``bamba`` family (IBM's
Bamba: Mamba-2 mixer layers interleaved with attention layers, a SwiGLU MLP in every layer),
derived op by op from ``transformers/models/bamba/modeling_bamba.py`` of transformers 5.23.0
(line numbers below are that file's) running its pure-torch path on torch 2.13.0 (``mamba_ssm`` and
``causal_conv1d`` not installed, so ``mamba2_chunk_scan`` and ``causal_conv1d_fn`` fall back to their
reference implementations, lines 357-377 and 467-571), checked to the byte against MemTracker in
``validation/mamba2/measurements.json`` (``layer_forward_retained_bytes``; the op-by-op listing is
``validation/mamba2/saved_tensors.py``). Regimes: ``fp32`` and pure ``bf16`` (parameters created in
bf16): ``compute_bytes == residual_bytes`` in {4, 2}. AMP (bf16 autocast on fp32 weights) was not
measured and raises ``NotImplementedError``. No activation checkpointing; no padding mask
(``attention_mask=None``, as in training on packed or unpadded batches).

Same conventions as mlsysim's ``measured/layers.py``: ``saved`` is what the layer's autograd graph keeps
*excluding* the layer's input (the previous layer's output); ``output`` is the layer's output (the
residual stream); ``output_saved_by_next`` says whether the next layer (or the final norm) keeps that
output for its backward. ``saved + output`` is the layer's ``layer_forward_retained_bytes``.

Notation
--------
T = b*s tokens (micro-batch b, sequence s); h hidden; f MLP width (``intermediate_size``);
c = compute (and residual) bytes: 4 fp32, 2 bf16.
Mixer: H = ``mamba_n_heads``, p = ``mamba_d_head``, D = d_inner = H*p (= ``mamba_expand * h``),
n = ``mamba_d_state``, g = ``mamba_n_groups``, K = ``mamba_d_conv``, Q = ``mamba_chunk_size``,
conv_dim = D + 2gn, P = in_proj width = 2D + 2gn + H.
Chunks: nc = ceil(s / Q); Tp = b * nc * Q (tokens padded to whole chunks: the scan pads with zeros).
Attention: a heads, kv heads, d = head_dim, q = a*d, kv = kv_heads*d.

Decoder layer (BambaDecoderLayer.forward, lines 858-898)
--------------------------------------------------------
``residual = x; x = input_layernorm(x); x = mamba(x) or self_attn(x); x = residual + x;
residual = x; x = pre_ff_layernorm(x); x = feed_forward(x); x = residual + x``.

* RMSNorm (lines 829-834) ``w * (x.float() * rsqrt(mean(x^2) + eps)).to(dtype)``: (8h + 4) per token
  in both regimes. fp32: ``.float()`` is a no-op and ``pow`` saves x itself (the layer input, not
  counted); rsqrt 4, the normalized x 4h (saved by ``w *``), the output 4h (saved by the next linear).
  bf16: the fp32 copy of x 4h (saved by ``pow`` and ``mul``), rsqrt 4, the bf16 copy of the normalized
  x 2h (saved by ``w *``), the output 2h.
* The residual after the mixer/attention ("mid", line 891) is saved by ``pre_ff_layernorm``'s ``pow``
  in fp32 (4h); in bf16 that norm saves its fp32 copy instead and the bf16 mid dies with the layer.
  Likewise the layer's output is saved by the next layer's (or the final) norm in fp32 only.
* SwiGLU MLP (line 815) ``down(silu(gate(x)) * up(x))``: gate's output (saved by silu), silu's output
  and up's output (saved by the product), the product (saved by down): 4f per token x c.

Mamba-2 mixer (BambaMixer.forward, lines 655-800; torch path, training, no cache)
--------------------------------------------------------------------------------
Everything from ``mamba2_chunk_scan`` on is fp32 in both regimes (``.float()`` at lines 491-493, 501-502).

* ``projected_states = in_proj(x)`` (line 673): c*T*P. It is split (line 702) into views gate (D),
  xBC (conv_dim), dt (H); the conv input is a transposed view of it (``.to(weight.dtype)`` is a no-op,
  line 368) and fp32's ``silu(gate.to(float32))`` (line 260) saves the gate view, so the whole storage
  stays alive: **c*T*P**.
* ``A = -exp(A_log.float())`` (line 675): exp result and its negation, fp32: 8H per layer.
* ``causal_conv1d_fn`` (lines 357-377, called at line 724): ``conv1d(padding=K-1)`` returns s+K-1
  positions; the slice ``[:, :, :s]`` is a view that ``silu`` saves, so the whole output is kept:
  **c*b*(s+K-1)*conv_dim**.
* x, B, C are views of silu's output (``torch.split``, line 737; the scan is called at line 771).
  fp32: ``x.float()`` is a no-op and ``x * dt`` (line 501) saves x, so silu's whole output stays:
  4*T*conv_dim. bf16: silu's output dies, the fp32 copy ``x.float()`` (line 491) is saved instead: 4*T*D.
* dt (lines 486-489): ``dt + dt_bias`` (saved by softplus) and ``softplus`` (saved by clamp) in the
  compute dtype, 2*c*T*H; then fp32: the clamp output (saved by ``x * dt`` and ``A * dt``), 4*T*H;
  bf16: ``dt[..., None].float()`` and ``dt.float()`` are two separate fp32 copies, 8*T*H.
  (Both regimes: 12*T*H.)
* ``D_residual = D * pad(x)`` (line 498) saves the padded fp32 copy of x: 4*Tp*D.
* ``B.float().repeat_interleave(H // g)`` then ``reshape_into_chunks`` pads it (lines 492, 507): the
  padded B repeated to all heads is saved by ``B * decay_states`` (line 530): 4*Tp*H*n.
* ``segment_sum`` (lines 304-321): two bool masks of Q x Q (saved by the two ``masked_fill``), and for
  the inter-chunk decay (line 542) two of (nc+1) x (nc+1): 2Q^2 + 2(nc+1)^2 per layer.
* ``L = exp(segment_sum(A))`` (line 514): fp32 (b, H, nc, Q, Q) = 4*Tp*H*Q, saved by exp and ``G * L``.
* ``G = einsum(C, B)`` (line 518): einsum copies C and B (heads-repeated, padded) into bmm layout
  (2 x 4*Tp*H*n) and its result G (4*Tp*H*Q) is saved by ``M = G * L``; M (line 521, 4*Tp*H*Q) is
  saved by the ``Y_diag`` bmm (line 525), which also saves an einsum copy of x*dt (4*Tp*D).
* ``decay_states = exp(A_cumsum[..., -1:] - A_cumsum)`` (line 529, 4*Tp*H) is saved by exp and the
  ``B_decay`` multiply; ``states = einsum(B_decay, x*dt)`` (line 532) saves einsum copies of B_decay
  (4*Tp*H*n) and of x*dt (4*Tp*D).
* ``states = cat([zeros, states])`` (line 541): (b, nc+1, H, p, n) fp32, saved by the inter-chunk
  einsum (line 544; at b > 1 as an einsum copy of the same size): 4*b*(nc+1)*H*p*n. Its decay
  ``exp(segment_sum(...))`` (line 542): 4*b*H*(nc+1)^2.
* ``state_decay_out = exp(A_cumsum)`` (line 549): 4*Tp*H. ``C_times_states = einsum(C, states)``
  (line 552) saves einsum copies of C (4*Tp*H*n) and of the chunk-start states (4*b*nc*H*p*n); its
  result (4*Tp*D) is saved by the ``Y_off`` multiply (line 553).
* ``y = (Y_diag + Y_off).contiguous() + D_residual`` (lines 558-564): the last add's result, padded
  (4*Tp*D), is sliced to s (a view, line 568) and saved by the gated norm's multiply.
* Gated RMSNorm (lines 256-267, norm_before_gate=False): bf16 only: ``gate.to(float32)``, 4*T*D, saved
  by silu; then ``silu(gate)`` (saved by the product), ``y * silu(gate)`` (saved by pow and the
  normalizing mul) and the normalized y (saved by ``weight *``): 3 x 4*T*D; rsqrt per group 4*T*g.
  The input dtype of the norm is fp32 (y), so ``weight * y_normed`` is fp32; ``scan_output.to(dtype)``
  (line 799) is the out_proj input that out_proj saves: c*T*D (fp32: the product itself).
* Not kept: x*dt, A*dt, A_cumsum, B and C repeated before padding, Y_diag, the new states, Y_off, the
  out_proj output.

Where s and Q enter
-------------------
* Linear in the chunk size Q: L, G and M are (b, nc, Q, Q, H) tensors, 3 x 4*H*Q bytes per padded token
  (the chunked scan is quadratic only inside a chunk, so per token it is linear in Q, not in s).
* Inverse in Q: the chunk states, 4*H*p*n per chunk for the cat and 4*H*p*n for the einsum copy
  (about 8*H*p*n/Q per token).
* The only s^2 term: the inter-chunk decay and its masks, (4*b*H + 2)*(nc+1)^2 + 2Q^2 bytes per layer
  (nc = s/Q: a few KB).
* Padding: a sequence that is not a multiple of Q pays for Tp = b*ceil(s/Q)*Q tokens in every scan
  tensor (pad(x), B, L, G, M, the einsum copies, C.states, y).
* Everything else is linear in T. Example, Bamba-9B-like shapes (h 4096, f 14336, H 128, p 64, n 128,
  g 1, K 4, Q 256; 32 heads / 8 kv heads) in bf16 at s = 4096: a mixer layer keeps about 1.34 MB per
  token (fp32: 1.51 MB), of which L, G, M are 393 KB and the five heads-repeated (H x n) copies of B
  and C 328 KB; an attention layer about 217 KB (fp32: 385 KB). Q = 128 saves about 164 KB per token
  per mixer layer.

Scope: transformers' *pure-torch* path. With ``mamba_ssm`` installed, a training forward without cache
takes the fused ``mamba_split_conv1d_scan_combined`` kernel instead (BambaMixer.forward, lines 677-700),
which saves far less and recomputes in its backward: these formulas do not describe that path.

Attention layer (BambaAttention, lines 182-246), SDPA
-----------------------------------------------------
Bamba's config hard-codes ``partial_rotary_factor = 0.5`` (configuration_bamba.py line 92): RoPE rotates
half of each head (lines 144-179) and ``torch.cat`` (lines 177-178) rebuilds q and k; cos/sin are
(s, d/2) (the model-level RoPE tables are 2*s*(d/2)*c bytes, half of a Llama's). The saved tensors are
Llama's (q, k after the cat, v: c*(q + 2kv); SDPA output c*q and fp32 logsumexp 4a) plus **one more
c*q**: the cat leaves q contiguous in (b, a, s, d), the CPU flash kernel returns its output in q's
layout, so ``attn_output.transpose(1, 2).contiguous()`` (integrations/sdpa_attention.py) is a copy, and
o_proj saves the copy (a Llama's rotated q keeps the (b, s, a, d) layout and that contiguous is a view).
Eager attention (lines 118-140) saves what a Llama's does: q, the ``repeat_kv`` copies of k and v (3cq),
the fp32 softmax (4*a*s per token; bf16 adds its bf16 copy, 2*a*s), the contiguous output (cq).
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "LayerBytes", "BambaShape", "bamba_shape", "mamba2_mixer_parts", "mamba2_layer_parts", "mamba2_layer_bytes",
    "attention_layer_parts", "attention_layer_bytes", "layer_output", "rmsnorm_parts", "mlp_parts",
    "mamba2_mixer_parameters", "mamba2_layer_parameters", "attention_layer_parameters", "bamba_parameters",
    "bamba_layer_bytes", "rope_table_bytes",
]

MAMBA = "mamba"
ATTENTION = "attention"


@dataclass(frozen=True)
class LayerBytes:
    """Same fields as mlsysim's ``measured.layers.LayerBytes``."""

    saved: int                   # kept for backward; excludes the layer's input
    output: int                  # the layer's output tensor
    output_saved_by_next: bool   # the next layer / final norm saves this output for its backward
    parts: tuple[tuple[str, int], ...] = ()   # named pieces of ``saved`` (bytes, not per token)

    @property
    def retained(self) -> int:
        """Growth of live memory across the layer's forward (``layer_forward_retained_bytes``)."""
        return self.saved + self.output


def _regime(compute_bytes: int, residual_bytes: int) -> bool:
    """True for fp32, False for pure 16-bit; AMP (16-bit compute on a 4-byte residual) is not derived."""
    if compute_bytes == residual_bytes == 4:
        return True
    if compute_bytes == residual_bytes == 2:
        return False
    raise NotImplementedError(
        f"compute_bytes={compute_bytes}, residual_bytes={residual_bytes}: only fp32 (4, 4) and pure 16-bit (2, 2) "
        "are derived and measured (autocast was not measured for the Mamba-2 mixer)")


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --------------------------------------------------------------------------- pieces shared by both layer kinds
def rmsnorm_parts(*, tokens: int, hidden: int, compute_bytes: int, residual_bytes: int,
                  name: str = "input RMSNorm") -> list[tuple[str, int]]:
    """BambaRMSNorm (lines 829-834): rsqrt + normalized x + output (fp32), or fp32 copy + rsqrt + bf16
    normalized + output (bf16): (8h + 4) per token either way."""
    fp32 = _regime(compute_bytes, residual_bytes)
    what = ("rsqrt, normalized x, output" if fp32 else "fp32 copy of x, rsqrt, bf16 normalized x, output")
    return [(f"{name} ({what})", tokens * (8 * hidden + 4))]


def mlp_parts(*, tokens: int, ffn: int, compute_bytes: int) -> list[tuple[str, int]]:
    """BambaMLP (line 815): gate output, silu output, up output, product: 4f per token x c."""
    return [("MLP (gate out, silu out, up out, silu*up)", 4 * compute_bytes * tokens * ffn)]


def layer_output(*, tokens: int, hidden: int, compute_bytes: int, residual_bytes: int) -> tuple[int, bool]:
    """The layer's output (residual stream, T*h*r bytes) and whether the next layer saves it (fp32: its
    RMSNorm's ``pow`` saves x itself; bf16: it saves an fp32 copy and the bf16 output dies)."""
    fp32 = _regime(compute_bytes, residual_bytes)
    return residual_bytes * tokens * hidden, fp32


def _tail_parts(*, tokens, hidden, ffn, compute_bytes, residual_bytes) -> list[tuple[str, int]]:
    """mid residual, pre_ff_layernorm, MLP: identical in both layer kinds."""
    fp32 = _regime(compute_bytes, residual_bytes)
    parts = []
    if fp32:
        parts.append(("mid residual (saved by pre_ff_layernorm)", residual_bytes * tokens * hidden))
    parts += rmsnorm_parts(tokens=tokens, hidden=hidden, compute_bytes=compute_bytes,
                           residual_bytes=residual_bytes, name="pre_ff_layernorm")
    parts += mlp_parts(tokens=tokens, ffn=ffn, compute_bytes=compute_bytes)
    return parts


# --------------------------------------------------------------------------- Mamba-2 mixer
def mamba2_mixer_parts(*, tokens: int, batch: int, seq_len: int, d_inner: int, n_heads: int, head_dim: int,
                       d_state: int, n_groups: int, conv_kernel: int, chunk_size: int, compute_bytes: int,
                       residual_bytes: int) -> list[tuple[str, int]]:
    """What the Mamba-2 mixer alone (in_proj through out_proj's input) keeps for backward, in bytes.

    The derivation of every term is in the module docstring. ``tokens`` must be ``batch * seq_len``.
    """
    if tokens != batch * seq_len:
        raise ValueError(f"tokens={tokens} != batch*seq_len={batch * seq_len}")
    if d_inner != n_heads * head_dim:
        raise ValueError(f"d_inner={d_inner} != n_heads*head_dim={n_heads * head_dim}")
    if n_heads % n_groups:
        raise ValueError(f"n_groups={n_groups} must divide n_heads={n_heads}")
    fp32 = _regime(compute_bytes, residual_bytes)
    c, T, b, s = compute_bytes, tokens, batch, seq_len
    D, H, p, n, g, K, Q = d_inner, n_heads, head_dim, d_state, n_groups, conv_kernel, chunk_size
    conv_dim = D + 2 * g * n
    proj = 2 * D + 2 * g * n + H
    nc = _ceil_div(s, Q)
    Tp = b * nc * Q
    parts = [
        ("in_proj output [gate | xBC | dt] (kept whole by the gate and conv-input views)", c * T * proj),
        ("A = -exp(A_log): exp and neg (fp32, per layer)", 8 * H),
        ("conv1d output, s+K-1 positions (saved by silu)", c * b * (s + K - 1) * conv_dim),
    ]
    if fp32:
        parts.append(("conv silu output xBC (x view saved by x*dt)", 4 * T * conv_dim))
    else:
        parts.append(("x.float(): fp32 copy of the conv x (saved by x*dt)", 4 * T * D))
    parts.append(("dt + dt_bias, softplus(dt) (compute dtype)", 2 * c * T * H))
    if fp32:
        parts.append(("clamp(dt) (saved by x*dt and A*dt)", 4 * T * H))
    else:
        parts.append(("dt.float() twice (fp32 copies saved by x*dt and A*dt)", 8 * T * H))
    parts += [
        ("pad(x) for the D skip (fp32, padded)", 4 * Tp * D),
        ("B repeated to heads, padded (fp32, saved by B*decay_states)", 4 * Tp * H * n),
        ("segment_sum masks: 2 bool QxQ + 2 bool (nc+1)^2 (per layer)", 2 * Q * Q + 2 * (nc + 1) ** 2),
        ("L = exp(segsum(A)) (fp32, b x H x nc x Q x Q)", 4 * Tp * H * Q),
        ("G = C.B and M = G*L (fp32, b x nc x Q x Q x H, two tensors)", 2 * 4 * Tp * H * Q),
        ("einsum copies of C (G, C.states), B (G), B*decay (states) (fp32, H x d_state)", 4 * 4 * Tp * H * n),
        ("einsum copies of x*dt (Y_diag, states) (fp32)", 2 * 4 * Tp * D),
        ("decay_states, exp(A_cumsum) (fp32, per head)", 2 * 4 * Tp * H),
        ("chunk states incl. zero initial state (fp32, b x (nc+1) x H x p x n)", 4 * b * (nc + 1) * H * p * n),
        ("inter-chunk decay exp(segsum) (fp32, b x H x (nc+1)^2)", 4 * b * H * (nc + 1) ** 2),
        ("einsum copy of the chunk-start states (fp32, b x nc x H x p x n)", 4 * b * nc * H * p * n),
        ("C.states (fp32, saved by the Y_off multiply)", 4 * Tp * D),
        ("scan output y = Y_diag + Y_off + D*x (fp32, padded)", 4 * Tp * D),
    ]
    if not fp32:
        parts.append(("gate.float() (fp32 copy, saved by silu)", 4 * T * D))
    parts += [
        ("gated RMSNorm: silu(gate), y*silu(gate), normalized (fp32)", 3 * 4 * T * D),
        ("gated RMSNorm rsqrt (fp32, per group)", 4 * T * g),
        ("out_proj input (compute dtype)", c * T * D),
    ]
    return parts


def mamba2_layer_parts(*, tokens: int, batch: int, seq_len: int, hidden: int, d_inner: int, n_heads: int,
                       head_dim: int, d_state: int, n_groups: int, conv_kernel: int, chunk_size: int,
                       compute_bytes: int, residual_bytes: int, ffn: int) -> list[tuple[str, int]]:
    """A whole Bamba Mamba-2 decoder layer: input RMSNorm, mixer, mid residual, pre_ff_layernorm, MLP.
    The sum is ``saved`` (the output is ``layer_output``)."""
    parts = rmsnorm_parts(tokens=tokens, hidden=hidden, compute_bytes=compute_bytes, residual_bytes=residual_bytes)
    parts += mamba2_mixer_parts(tokens=tokens, batch=batch, seq_len=seq_len, d_inner=d_inner, n_heads=n_heads,
                                head_dim=head_dim, d_state=d_state, n_groups=n_groups, conv_kernel=conv_kernel,
                                chunk_size=chunk_size, compute_bytes=compute_bytes, residual_bytes=residual_bytes)
    parts += _tail_parts(tokens=tokens, hidden=hidden, ffn=ffn, compute_bytes=compute_bytes,
                         residual_bytes=residual_bytes)
    return parts


def mamba2_layer_bytes(**kw) -> LayerBytes:
    """``mamba2_layer_parts`` (same keywords) as a ``LayerBytes``."""
    parts = mamba2_layer_parts(**kw)
    out, by_next = layer_output(tokens=kw["tokens"], hidden=kw["hidden"], compute_bytes=kw["compute_bytes"],
                                residual_bytes=kw["residual_bytes"])
    return LayerBytes(saved=sum(b for _, b in parts), output=out, output_saved_by_next=by_next, parts=tuple(parts))


# --------------------------------------------------------------------------- attention layer
def attention_layer_parts(*, tokens: int, seq_len: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                          ffn: int, attention: str, compute_bytes: int, residual_bytes: int) -> list[tuple[str, int]]:
    """A whole Bamba attention decoder layer (no dropout): input RMSNorm, attention, mid, pre_ff_layernorm, MLP."""
    c, T = compute_bytes, tokens
    fp32 = _regime(compute_bytes, residual_bytes)
    q, kv = heads * head_dim, kv_heads * head_dim
    parts = rmsnorm_parts(tokens=T, hidden=hidden, compute_bytes=c, residual_bytes=residual_bytes)
    if attention == "sdpa":
        parts += [
            ("q, k (after the partial-rotary cat), v", c * T * (q + 2 * kv)),
            ("SDPA output + logsumexp (fp32)", c * T * q + 4 * T * heads),
            ("o_proj input: contiguous copy of the SDPA output", c * T * q),
        ]
    elif attention == "eager":
        S = heads * seq_len                   # scores per token
        parts += [
            ("q and repeat_kv copies of k, v", 3 * c * T * q),
            ("attention probabilities: fp32 softmax" + ("" if fp32 else " + bf16 copy"), (4 if fp32 else 6) * T * S),
            ("o_proj input: contiguous attention output", c * T * q),
        ]
    else:
        raise ValueError(f"attention must be 'sdpa' or 'eager', not {attention!r}")
    parts += _tail_parts(tokens=T, hidden=hidden, ffn=ffn, compute_bytes=c, residual_bytes=residual_bytes)
    return parts


def attention_layer_bytes(**kw) -> LayerBytes:
    """``attention_layer_parts`` (same keywords) as a ``LayerBytes``."""
    parts = attention_layer_parts(**kw)
    out, by_next = layer_output(tokens=kw["tokens"], hidden=kw["hidden"], compute_bytes=kw["compute_bytes"],
                                residual_bytes=kw["residual_bytes"])
    return LayerBytes(saved=sum(b for _, b in parts), output=out, output_saved_by_next=by_next, parts=tuple(parts))


# --------------------------------------------------------------------------- parameters
def mamba2_mixer_parameters(*, hidden: int, d_inner: int, n_heads: int, d_state: int, n_groups: int,
                            conv_kernel: int, proj_bias: bool = False, conv_bias: bool = True) -> int:
    """BambaMixer.__init__ (lines 595-645): in_proj h x (2D + 2gn + H) [+ bias], depthwise conv1d
    conv_dim x K [+ conv_dim bias], dt_bias, A_log, D (H each), the gated norm's weight (D),
    out_proj D x h [+ h bias]."""
    D, H, g, n = d_inner, n_heads, n_groups, d_state
    conv_dim = D + 2 * g * n
    proj = 2 * D + 2 * g * n + H
    return (hidden * proj + (proj if proj_bias else 0)
            + conv_dim * conv_kernel + (conv_dim if conv_bias else 0)
            + 3 * H + D
            + D * hidden + (hidden if proj_bias else 0))


def _mlp_and_norms(hidden: int, ffn: int, mlp_bias: bool) -> int:
    return 3 * hidden * ffn + ((2 * ffn + hidden) if mlp_bias else 0) + 2 * hidden


def mamba2_layer_parameters(*, hidden: int, d_inner: int, n_heads: int, d_state: int, n_groups: int,
                            conv_kernel: int, ffn: int, proj_bias: bool = False, conv_bias: bool = True,
                            mlp_bias: bool = False) -> int:
    """One Bamba Mamba-2 decoder layer: the mixer, two RMSNorms (2h) and the SwiGLU MLP (3hf [+ 2f + h])."""
    return (mamba2_mixer_parameters(hidden=hidden, d_inner=d_inner, n_heads=n_heads, d_state=d_state,
                                    n_groups=n_groups, conv_kernel=conv_kernel, proj_bias=proj_bias,
                                    conv_bias=conv_bias)
            + _mlp_and_norms(hidden, ffn, mlp_bias))


def attention_layer_parameters(*, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                               attention_bias: bool = False, mlp_bias: bool = False) -> int:
    """One Bamba attention decoder layer: q, k, v, o (lines 190-206), two RMSNorms, the MLP."""
    q, kv = heads * head_dim, kv_heads * head_dim
    attn = hidden * q + 2 * hidden * kv + q * hidden + ((q + 2 * kv + hidden) if attention_bias else 0)
    return attn + _mlp_and_norms(hidden, ffn, mlp_bias)


# --------------------------------------------------------------------------- the HF config
@dataclass(frozen=True)
class BambaShape:
    """The shape numbers of a Bamba config (field names of the formulas above)."""

    vocab: int
    hidden: int
    ffn: int
    layer_types: tuple[str, ...]          # "mamba" or "attention", one per decoder layer
    heads: int
    kv_heads: int
    head_dim: int                         # attention head_dim
    rotary_dim: int                       # rotated part of each attention head (Bamba: head_dim / 2)
    d_inner: int
    n_heads: int                          # mamba heads
    mamba_head_dim: int
    d_state: int
    n_groups: int
    conv_kernel: int
    chunk_size: int
    proj_bias: bool = False
    conv_bias: bool = True
    attention_bias: bool = False
    mlp_bias: bool = False
    tied: bool = False
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def layers(self) -> int:
        return len(self.layer_types)

    @property
    def mamba_layers(self) -> int:
        return self.layer_types.count(MAMBA)

    @property
    def attention_layers(self) -> int:
        return self.layer_types.count(ATTENTION)


# Defaults of transformers 5.23's BambaConfig (configuration_bamba.py), used for keys a config.json omits.
_DEFAULTS = dict(
    vocab_size=128000, tie_word_embeddings=False, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
    num_attention_heads=32, num_key_value_heads=8, attn_layer_indices=None, mamba_n_heads=128, mamba_d_head="auto",
    mamba_n_groups=1, mamba_d_state=256, mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=256,
    mamba_conv_bias=True, mamba_proj_bias=False, attention_bias=False, mlp_bias=False,
)
_TYPE_NAMES = {"mamba": MAMBA, "linear_attention": MAMBA, "attention": ATTENTION, "full_attention": ATTENTION}


def bamba_shape(config: dict) -> BambaShape:
    """Read a Bamba ``config.json`` (dict) into the formulas' shape numbers.

    Layer kinds: ``layers_block_type`` (or ``layer_types``) when the dict has it (values ``"mamba"`` /
    ``"attention"`` as older transformers wrote them, or ``"linear_attention"`` / ``"full_attention"`` as
    5.x names them), else ``attn_layer_indices`` (a layer is attention iff its index is listed, as
    ``BambaConfig.layers_block_type`` computes it). ``mamba_d_head: "auto"`` is
    ``mamba_expand * hidden_size // mamba_n_heads``. The attention head_dim is ``head_dim`` if given, else
    ``hidden_size // num_attention_heads``; RoPE rotates half of it (``partial_rotary_factor`` = 0.5,
    hard-coded by BambaConfig).
    """
    if config.get("model_type", "bamba") != "bamba":
        raise ValueError(f"not a bamba config: model_type={config.get('model_type')!r}")
    cfg = {**_DEFAULTS, **{k: v for k, v in config.items() if v is not None or k == "attn_layer_indices"}}
    h = int(cfg["hidden_size"])
    L = int(cfg["num_hidden_layers"])
    types = cfg.get("layers_block_type") or cfg.get("layer_types")
    if types:
        try:
            layer_types = tuple(_TYPE_NAMES[t] for t in types)
        except KeyError as e:
            raise ValueError(f"unknown layer type {e.args[0]!r} in layers_block_type") from None
        if len(layer_types) != L:
            raise ValueError(f"{len(layer_types)} layer types for num_hidden_layers={L}")
    else:
        attn = set(cfg.get("attn_layer_indices") or ())
        layer_types = tuple(ATTENTION if i in attn else MAMBA for i in range(L))
    d_inner = int(cfg["mamba_expand"] * h)
    H = int(cfg["mamba_n_heads"])
    p = cfg["mamba_d_head"]
    p = cfg["mamba_expand"] * h // H if p == "auto" else int(p)
    if p * H != d_inner:
        raise ValueError(f"mamba_d_head*mamba_n_heads={p * H} != mamba_expand*hidden_size={d_inner}")
    heads = int(cfg["num_attention_heads"])
    kv = cfg.get("num_key_value_heads") or heads
    head_dim = int(cfg.get("head_dim") or h // heads)
    return BambaShape(
        vocab=int(cfg["vocab_size"]), hidden=h, ffn=int(cfg["intermediate_size"]), layer_types=layer_types,
        heads=heads, kv_heads=int(kv), head_dim=head_dim, rotary_dim=int(head_dim * 0.5),
        d_inner=d_inner, n_heads=H, mamba_head_dim=p, d_state=int(cfg["mamba_d_state"]),
        n_groups=int(cfg["mamba_n_groups"]), conv_kernel=int(cfg["mamba_d_conv"]),
        chunk_size=int(cfg["mamba_chunk_size"]), proj_bias=bool(cfg["mamba_proj_bias"]),
        conv_bias=bool(cfg["mamba_conv_bias"]), attention_bias=bool(cfg["attention_bias"]),
        mlp_bias=bool(cfg["mlp_bias"]), tied=bool(cfg["tie_word_embeddings"]),
    )


def bamba_parameters(shape: BambaShape) -> int:
    """All parameters of ``BambaForCausalLM``: embedding V x h, the layers, the final norm h, the LM head
    V x h unless tied."""
    s = shape
    mamba = mamba2_layer_parameters(hidden=s.hidden, d_inner=s.d_inner, n_heads=s.n_heads, d_state=s.d_state,
                                    n_groups=s.n_groups, conv_kernel=s.conv_kernel, ffn=s.ffn,
                                    proj_bias=s.proj_bias, conv_bias=s.conv_bias, mlp_bias=s.mlp_bias)
    attn = attention_layer_parameters(hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim,
                                      ffn=s.ffn, attention_bias=s.attention_bias, mlp_bias=s.mlp_bias)
    return (s.vocab * s.hidden * (1 if s.tied else 2) + s.hidden
            + s.mamba_layers * mamba + s.attention_layers * attn)


def bamba_layer_bytes(shape: BambaShape, *, batch: int, seq_len: int, compute_bytes: int, residual_bytes: int,
                      attention: str = "sdpa") -> list[LayerBytes]:
    """``LayerBytes`` of every decoder layer of the model, in order."""
    s, T = shape, batch * seq_len
    out = []
    for kind in s.layer_types:
        if kind == MAMBA:
            out.append(mamba2_layer_bytes(
                tokens=T, batch=batch, seq_len=seq_len, hidden=s.hidden, d_inner=s.d_inner, n_heads=s.n_heads,
                head_dim=s.mamba_head_dim, d_state=s.d_state, n_groups=s.n_groups, conv_kernel=s.conv_kernel,
                chunk_size=s.chunk_size, compute_bytes=compute_bytes, residual_bytes=residual_bytes, ffn=s.ffn))
        else:
            out.append(attention_layer_bytes(
                tokens=T, seq_len=seq_len, hidden=s.hidden, heads=s.heads, kv_heads=s.kv_heads,
                head_dim=s.head_dim, ffn=s.ffn, attention=attention, compute_bytes=compute_bytes,
                residual_bytes=residual_bytes))
    return out


def rope_table_bytes(shape: BambaShape, *, seq_len: int, compute_bytes: int) -> int:
    """The model-level RoPE cos/sin tables (built once per forward, alive until backward): 2 x s x
    rotary_dim in the compute dtype -- half of a Llama's, since Bamba rotates half of each head."""
    return 2 * seq_len * shape.rotary_dim * compute_bytes
