"""Parallel-residual families: GPT-NeoX (Pythia, GPT-NeoX-20B) and Falcon (7B, 40B, 180B).

Derived op by op from transformers 5.23 (``models/gpt_neox/modeling_gpt_neox.py``,
``models/falcon/modeling_falcon.py``) on torch 2.13, and checked against what autograd saves
(saved-tensor hooks) and MemTracker (``validation/families/parallel_residual``). Per token,
c = compute bytes (4 fp32, 2 bf16 and AMP), r = residual bytes (4 fp32 and AMP, 2 bf16),
h hidden, q = heads x head_dim, f MLP width, S = heads x seq_len.

GPT-NeoX (``GPTNeoXLayer`` with ``use_parallel_residual``: x + attn(ln1(x)) + mlp(ln2(x)))
* Both LayerNorms read the layer input (the previous layer's output: saved once); each keeps
  mean and rstd (2r). There is no mid residual: the sum saves nothing. (Sequential residual,
  ``use_parallel_residual=False``: the mid residual attn + x is ln2's input, r x h.)
* ``query_key_value`` and ``dense_h_to_4h`` save their inputs (the LN outputs, c x h each; under
  AMP their bf16 casts).
* ``qkv.view(b, s, a, 3d).transpose(1, 2).chunk(3)``: q, k, v are views of the qkv output;
  partial rotary (``apply_rotary_pos_emb``) rotates the first rotary_pct of each head and
  ``cat``s the rest back: q and k are new contiguous (b, a, s, d) tensors (c x q each; under
  AMP SDPA's bf16 casts of them); the rotary multiplies save only the model's cos/sin.
* SDPA (CPU flash, ``is_causal`` without a mask): q, k, the qkv storage (v is a view: 3c x q),
  its output and fp32 logsumexp (c x q + 4a). The output follows q's (b, a, s, d) layout, so
  ``transpose(1, 2).contiguous()`` copies it (c x q), the copy ``dense`` saves.
* Eager: ``matmul(q, k^T)`` saves q and k, ``softmax(dtype=float32)`` its fp32 output (4S), the
  ``.to(q.dtype)`` copy (2S, bf16 and AMP) is what ``matmul(weights, v)`` saves with v (the qkv
  storage); the transposed output made contiguous (c x q) is dense's input.
* MLP ``dense_4h_to_h(gelu(dense_h_to_4h(x)))`` with exact GELU: gelu saves its input, the
  second linear the GELU output: 2c x f.

Falcon (``FalconDecoderLayer``, ``parallel_attn``: x + attn(ln(x)) + mlp(ln'(x)))
* Falcon-7B (``new_decoder_architecture`` False, ``multi_query``): one ``input_layernorm`` whose
  output both ``query_key_value`` and ``dense_h_to_4h`` save (one storage, c x h; under AMP two
  bf16 casts, 2 x 2h). Falcon-40B/180B (``new_decoder_architecture``): ``ln_attn`` and ``ln_mlp``,
  two outputs (2c x h; AMP 2 x 2h). Every LN keeps mean and rstd (2r).
* ``_split_heads`` takes k and v with ``[..., [-2], :]`` and ``[..., [-1], :]``: the index
  copies save their int64 index tensors (2 x 8 B per layer).
* Falcon-7B's SDPA gets q with all heads and k, v with one (no ``enable_gqa``): torch's
  ``check_batch_size_and_num_heads_dense`` (sdp_utils_cpp.h, shared by the CPU and CUDA
  backend choice) refuses every fused kernel, so SDPA runs the math kernel, on a GPU too. The
  math kernel upcasts bf16 to fp32 and keeps fp32 q (scaled), k (scaled), v and the fp32 s x s
  probabilities: 4 x (q + 2kv) + 4S; its output, cast back and permuted, is copied for
  ``dense`` (c x q). Eager is the same graph in the compute dtype: q, k, v (c x (q + 2kv)),
  softmax in the hidden states' dtype (fp32 4S, bf16 2S; AMP 4S + the 2S cast the matmul saves).
* Falcon-40B broadcasts k and v to all heads (``broadcast_to`` + ``flatten`` copies) before
  attention: SDPA gets equal heads and runs fused (CPU flash; a GPU's flash/efficient kernel):
  q, k, v (3c x q), output + fp32 logsumexp (c x q + 4a); the output is already (b, s, a, d),
  so ``dense`` saves a view of it. Falcon materializes its causal mask
  (``create_causal_mask(allow_is_causal_skip=False)``, (b, 1, s, s) in the model dtype): the
  fused kernel saves it, one storage for the whole model (a term outside the layers); under
  AMP SDPA's autocast casts it to bf16 in every layer, and each layer saves its cast (2s per
  token).
* MLP: exact GELU, 2c x f, as GPT-NeoX.

Not modelled, refused by name: dropout > 0, Falcon's ALiBi variants (``alibi``), sequential
Falcon layers (``parallel_attn`` False), Falcon's multi-head old layout (``multi_query`` False
without ``new_decoder_architecture``), LoRA (no walker). Activations other than exact GELU are
costed as GELU with a note.
"""

from __future__ import annotations

from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, FORWARD, MemoryTerm

from .. import term_keys as K
from ..families import LAYER_NORM, ArchitectureFamily, LayerWeight
from ..layers import REPLICATED, Part, LayerWalk, megatron_plain_mlp

W = LayerWeight
NEOX_LAYOUT = "gpt-neox-qkv"
FALCON_LAYOUT = "falcon-qkv"
NEOX_ROTARY = 0.25          # Pythia's and GPT-NeoX-20B's rotary_pct (the family's default)


def _c(kind: str) -> int:
    return 4 if kind == "fp32" else 2


def _r(kind: str) -> int:
    return 2 if kind == "bf16" else 4


def _details(model) -> dict:
    return dict(getattr(model, "details", None) or {}) if model is not None else {}


def _parallel(model, raw_key: str) -> bool | None:
    """Parallel residual or not; None when the model does not say (no details). ``from_hf_config``
    lists ``parallel_residual`` only when it is True (its default is False) and copies the raw
    config key (``use_parallel_residual``, ``parallel_attn``) when present."""
    d = _details(model)
    if "parallel_residual" in d:
        return bool(d["parallel_residual"])
    if raw_key in d:
        return bool(d[raw_key])
    return False if "model_type" in d else None


def _no_dropout(dropout: bool) -> None:
    if dropout:
        raise NotModelledError("dropout", "> 0", "0.0 for GPT-NeoX and Falcon models",
                               "attention and hidden dropout were not measured for the parallel-residual "
                               "families (validation/families/parallel_residual runs without dropout)")


# --- attention: GPT-NeoX -------------------------------------------------------------------------

def _neox_sdpa(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads, device):
    """CPU flash SDPA on the rotary outputs; the same fused kernel on a GPU (is_causal, equal heads)."""
    _no_dropout(dropout)
    c, q = _c(kind), q_dim
    return (Part("q, k (rotary cat outputs, SDPA inputs)", 2 * c * q),
            Part("qkv (query_key_value output; v is a view)", 3 * c * q),
            Part("attention output + logsumexp (fp32)", c * q + 4 * heads),
            Part("attention output transposed contiguous (dense input)", c * q, weight_gradient_only=True))


def _neox_eager(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads, device):
    _no_dropout(dropout)
    c, q, S = _c(kind), q_dim, heads * seq_len
    scores = 4 * S + (2 * S if c == 2 else 0)       # fp32 softmax + its 16-bit copy (bf16, AMP)
    return (Part("q, k (rotary cat outputs)", 2 * c * q),
            Part("qkv (query_key_value output; v is a view)", 3 * c * q),
            Part("attention scores", scores, recomputed_by_selective=True),
            Part("attention output transposed contiguous (dense input)", c * q, weight_gradient_only=True))


# --- attention: Falcon ------------------------------------------------------------------------------

def _falcon_sdpa(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads, device):
    """Unequal heads (Falcon-7B's one KV head, no enable_gqa): the math kernel on CPU and CUDA
    alike (the fused kernels' head check is shared), so ``device`` does not change the choice.
    Equal heads (Falcon-40B's broadcast k, v): the fused kernel."""
    _no_dropout(dropout)
    c, q, kv, S = _c(kind), q_dim, kv_dim, heads * seq_len
    if kv != q:
        return (Part("q, k, v (fp32, scaled; math kernel)", 4 * (q + 2 * kv)),
                Part("attention probabilities (fp32, math kernel)", 4 * S, recomputed_by_selective=True),
                Part("attention output permuted contiguous (dense input)", c * q, weight_gradient_only=True))
    parts = (Part("q, k, v (k, v broadcast to all heads)", 3 * c * q),
             Part("attention output + logsumexp (fp32; dense reads a view)", c * q + 4 * heads))
    if kind == "amp-bf16":
        # autocast casts the fp32 mask to bf16 for SDPA in every layer; each layer saves its cast
        parts += (Part("causal mask (bf16 autocast copy)", 2 * seq_len, split=REPLICATED),)
    return parts


def _falcon_eager(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads, device):
    _no_dropout(dropout)
    c, q, kv, S = _c(kind), q_dim, kv_dim, heads * seq_len
    # softmax(dtype=hidden_states.dtype): fp32 in fp32 and AMP (+ the bf16 cast the AMP matmul saves), bf16 in bf16
    scores = {"fp32": 4 * S, "bf16": 2 * S, "amp-bf16": 6 * S}[kind]
    return (Part("q, k, v (rotary outputs, v)", c * (q + 2 * kv)),
            Part("attention scores", scores, recomputed_by_selective=True),
            Part("attention output merged heads (dense input)", c * q, weight_gradient_only=True))


# --- layers ----------------------------------------------------------------------------------------

def _activation_note(model) -> tuple[str, ...]:
    act = _details(model).get("hidden_act", "gelu")
    if act != "gelu":
        return (f"hidden_act {act!r} costed as exact GELU (its input and output saved; validated for 'gelu')",)
    return ()


def neox_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
               seq_len, model=None):
    """One GPTNeoXLayer (parallel residual unless ``use_parallel_residual`` is False)."""
    _no_dropout(dropout)
    h, f, c, r = hidden, ffn, _c(regime), _r(regime)
    sequential = _parallel(model, "use_parallel_residual") is False
    w = LayerWalk()
    w.add("input_layernorm (mean, rstd)", 2 * r, REPLICATED)
    w.add("query_key_value input (input_layernorm output or its AMP cast)", c * h, REPLICATED)
    w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=heads * head_dim,
                       kv_dim=kv_heads * head_dim, hidden=h, seq_len=seq_len, tokens=tokens))
    if sequential:
        w.add("mid residual (post_attention_layernorm input)", r * h, REPLICATED)
    w.add("post_attention_layernorm (mean, rstd)", 2 * r, REPLICATED)
    w.add("dense_h_to_4h input (post_attention_layernorm output or its AMP cast)", c * h, REPLICATED)
    w.add("mlp (gelu input, dense_4h_to_h input)", 2 * c * f)
    return w.layer(tokens, r * h * tokens, True)       # both LayerNorms of the next layer save it


def _falcon_layout(model) -> tuple[bool, int]:
    """(new_decoder_architecture, norms per layer), or a NotModelledError for what is not modelled."""
    d = _details(model)
    if d.get("position_embedding") == "alibi":
        raise NotModelledError("model.details.alibi", True, "a rotary Falcon (alibi False)",
                               "Falcon's ALiBi attention (Falcon-RW) was not measured")
    if _parallel(model, "parallel_attn") is False:
        raise NotModelledError("model.details.parallel_attn", False, "parallel attention (parallel_attn True)",
                               "sequential Falcon layers were not measured")
    new = bool(d.get("new_decoder_architecture", False))
    if not new and d.get("multi_query", True) is False:
        raise NotModelledError("model.details.multi_query", False,
                               "multi_query True or new_decoder_architecture True",
                               "Falcon's multi-head old layout (q, k, v interleaved views) was not measured")
    return new, int(d.get("norms_per_layer", 2 if new else 1))


def falcon_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                 seq_len, model=None):
    """One FalconDecoderLayer with parallel attention (see the module docstring)."""
    _no_dropout(dropout)
    new, norms = _falcon_layout(model)
    h, f, c, r = hidden, ffn, _c(regime), _r(regime)
    q = heads * head_dim
    w = LayerWalk()
    w.add("layer norms (mean, rstd)", norms * 2 * r, REPLICATED)
    if regime == "amp-bf16":
        w.add("query_key_value and dense_h_to_4h input casts (bf16)", 2 * 2 * h, REPLICATED)
    else:
        w.add("layer norm outputs (query_key_value and dense_h_to_4h inputs)", norms * c * h, REPLICATED)
    # new_decoder_architecture broadcasts k and v to all heads before attention
    w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=q, kv_dim=q if new else kv_heads * head_dim,
                       hidden=h, seq_len=seq_len, tokens=tokens))
    w.add("mlp (gelu input, dense_4h_to_h input)", 2 * c * f)
    w.constant.append(Part("k, v index tensors (int64)", 2 * 8, split=REPLICATED))
    return w.layer(tokens, r * h * tokens, True)


# --- weights and parameters --------------------------------------------------------------------------

def _neox_bias(model) -> bool:
    return bool(_details(model).get("qkv_bias", True))


def neox_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    out = [W("query_key_value", h * 3 * q_dim), W("dense", q_dim * h), W("dense_h_to_4h", h * f),
           W("dense_4h_to_h", f * h)]
    if _neox_bias(model):
        out += [W("query_key_value.bias", 3 * q_dim, bias=True), W("dense.bias", h, split=REPLICATED, bias=True)]
    out += [W("dense_h_to_4h.bias", f, bias=True), W("dense_4h_to_h.bias", h, split=REPLICATED, bias=True)]
    return tuple(out)


def _neox_block(shape):
    h, f, q = shape.hidden, shape.ffn, shape.q_dim
    bias = _neox_bias(shape.model)
    ln = [(h, 0), (h, 0)]
    attn = [(h, 3 * q)] + ([(3 * q, 0)] if bias else []) + [(q, h)] + ([(h, 0)] if bias else [])
    return ln + ln + attn + [(h, f), (f, 0), (f, h), (h, 0)]


def neox_matrix_shapes(shape):
    V, h = shape.vocab, shape.hidden
    out = [(V, h)] + _neox_block(shape) * shape.layers + [(h, 0), (h, 0)]
    return out + ([] if shape.tied else [(V, h)])


def neox_parameter_tensors(shape):
    return tuple(r * c if c else r for r, c in neox_matrix_shapes(shape))


def _falcon_bias(model) -> bool:
    return bool(_details(model).get("qkv_bias", False))


def falcon_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    qkv = q_dim + 2 * kv_dim
    out = [W("query_key_value", h * qkv), W("dense", q_dim * h), W("dense_h_to_4h", h * f), W("dense_4h_to_h", f * h)]
    if _falcon_bias(model):
        # FalconLinear adds its bias outside the matmul: autocast does not copy it
        out += [W("query_key_value.bias", qkv, bias=True, autocast=False),
                W("dense.bias", h, split=REPLICATED, bias=True, autocast=False),
                W("dense_h_to_4h.bias", f, bias=True, autocast=False),
                W("dense_4h_to_h.bias", h, split=REPLICATED, bias=True, autocast=False)]
    return tuple(out)


def falcon_matrix_shapes(shape):
    h, f, V = shape.hidden, shape.ffn, shape.vocab
    qkv = shape.q_dim + 2 * shape.kv_dim
    bias = _falcon_bias(shape.model)
    new, norms = _falcon_layout(shape.model)
    # registration order: self_attention (query_key_value, dense), mlp, then the layer norms
    block = [(h, qkv)] + ([(qkv, 0)] if bias else []) + [(shape.q_dim, h)] + ([(h, 0)] if bias else [])
    block += [(h, f)] + ([(f, 0)] if bias else []) + [(f, h)] + ([(h, 0)] if bias else [])
    block += [(h, 0), (h, 0)] * norms
    out = [(V, h)] + block * shape.layers + [(h, 0), (h, 0)]
    return out + ([] if shape.tied else [(V, h)])


def falcon_parameter_tensors(shape):
    return tuple(r * c if c else r for r, c in falcon_matrix_shapes(shape))


# --- outside the layers --------------------------------------------------------------------------------

def _rotary_fraction(model, default: float) -> float:
    value = _details(model).get("rotary_fraction")
    return default if value is None else float(value)


def _rescale_rope(terms, model, family_fraction: float, head_dim: int):
    """RoPE's cos/sin tables and inv_freq buffers for the model's own rotary fraction (the
    profile sizes them with the family's default)."""
    fraction = _rotary_fraction(model, family_fraction)
    if fraction == family_fraction:
        return terms
    old, new = int(head_dim * family_fraction), int(head_dim * fraction)
    out = []
    for t in terms:
        if t.key == K.ROPE_TABLES:      # (an offloaded host copy too)
            t = MemoryTerm(component=t.component, key=t.key, tier=t.tier,
                           label=t.label, nbytes=t.nbytes * new / old, phases=t.phases,
                           formula=t.formula + f" (rotary_dim {new} of head_dim {head_dim})")
        elif t.key == K.ROPE_BUFFERS:
            t = MemoryTerm(component=t.component, key=t.key,
                           label=t.label, nbytes=2 * 4 * (new // 2), phases=t.phases,
                           formula=f"2 x rotary_dim/2 = {new // 2} x 4 B (fp32)")
        out.append(t)
    return out


def _shape(plan):
    from ..shapes import shape_of
    return shape_of(plan)


def neox_adjust(kind, plan, placement, terms):
    s = _shape(plan)
    return _rescale_rope(terms, plan.model, NEOX_ROTARY, s.head_dim)


def falcon_adjust(kind, plan, placement, terms):
    """Falcon-40B's materialized causal mask, saved once by the fused SDPA kernel of every layer
    (fp32 or bf16 as the model; under AMP each layer saves its own bf16 cast instead)."""
    if kind != "model_activations":
        return terms
    from ..kernels import kernel_of
    from ..model import _regime_kind
    new, _ = _falcon_layout(plan.model)
    regime = _regime_kind(plan.profile_options.regime)
    rank = plan.rank
    if not new or not kernel_of(plan).sdpa or regime == "amp-bf16" or (rank is not None and not rank.last
                                                                              and not rank.first):
        return terms
    b = 4 if regime == "fp32" else 2
    s = plan.seq_len
    nbytes = b * plan.microbatch * s * s / placement.sequence_shards
    return list(terms) + [MemoryTerm(
        component=ACTIVATIONS, label="causal mask (materialized; saved by the fused SDPA)", nbytes=nbytes,
        phases=(FORWARD, BACKWARD), formula=f"b x 1 x s x s x {b} B = {plan.microbatch} x {s}^2 x {b}")]


# --- families ----------------------------------------------------------------------------------------------

def _neox_assumptions(model):
    d = _details(model)
    out = list(_activation_note(model))
    if "rotary_fraction" not in d:
        out.append(f"rotary_pct {NEOX_ROTARY} assumed (Pythia's; model.details has no rotary_fraction)")
    if _parallel(model, "use_parallel_residual") is None:
        out.append("parallel residual assumed (model.details does not say)")
    return tuple(out)


def _falcon_assumptions(model):
    d = _details(model)
    out = list(_activation_note(model))
    if "new_decoder_architecture" not in d and "multi_query" not in d:
        out.append("Falcon-7B's layout assumed (multi-query, one shared LayerNorm; model.details has no "
                   "new_decoder_architecture or multi_query)")
    return tuple(out)


def _falcon_check(plan):
    _falcon_layout(plan.model)
    return ()


GPT_NEOX = ArchitectureFamily(
    name="gpt_neox", label="GPT-NeoX", gated_mlp=False,
    description="LayerNorm with biases, fused query_key_value (per-head interleaved), partial rotary, parallel "
                "residual, exact-GELU MLP, untied embed_out (Pythia, GPT-NeoX-20B; validated against PyTorch's "
                "MemTracker)",
    architectures=("gpt_neox",), norm=LAYER_NORM, layer_norms=2, positions="rotary", rotary_fraction=NEOX_ROTARY,
    attention_layout=NEOX_LAYOUT, attention_layouts={"sdpa": _neox_sdpa, "eager": _neox_eager},
    layer_weights=neox_weights, parameter_tensors=neox_parameter_tensors, matrix_shapes=neox_matrix_shapes,
    layer=neox_layer, megatron_mlp=megatron_plain_mlp, assumptions=_neox_assumptions, adjust_terms=neox_adjust)

FALCON = ArchitectureFamily(
    name="falcon", label="Falcon", gated_mlp=False,
    description="Parallel attention and MLP, LayerNorm (one shared, or ln_attn and ln_mlp), fused "
                "query_key_value (multi-query or grouped KV heads), rotary, GELU MLP (Falcon-7B/40B/180B; "
                "validated against PyTorch's MemTracker)",
    architectures=("falcon",), norm=LAYER_NORM, layer_norms=1, positions="rotary",
    attention_layout=FALCON_LAYOUT, attention_layouts={"sdpa": _falcon_sdpa, "eager": _falcon_eager},
    layer_weights=falcon_weights, parameter_tensors=falcon_parameter_tensors, matrix_shapes=falcon_matrix_shapes,
    layer=falcon_layer, megatron_mlp=megatron_plain_mlp, assumptions=_falcon_assumptions, check=_falcon_check,
    adjust_terms=falcon_adjust)

FAMILIES = (GPT_NEOX, FALCON)
