"""Llama variants: Qwen2 (q/k/v biases), Qwen3 (per-head QK-norm), OLMo 2 (full-width QK-norm,
post-norms, no input norm) and Phi-3 (fused qkv_proj and gate_up_proj), each modelled as it is
(issue 15) where the built-in Llama family only approximated them.

What each layer saves for backward, op by op (transformers 5.23 ``modeling_<type>.py``, torch 2.13
CPU kernels; notation of ``layers.py``: h hidden, q = heads x head_dim, kv = kv_heads x head_dim,
f MLP width, c the compute dtype's bytes, all per token):

Qwen2 (``Qwen2Attention``: ``nn.Linear(..., bias=True)`` for q, k, v; o_proj without)
  A linear's bias adds nothing saved (addmm saves its input and weight; the bias gradient is a
  sum over the output gradient). The layer saves what Llama's does. The biases (q + 2 kv per
  layer) are parameters: weights, gradients, optimizer state (model.parameters counts them), and
  under AMP autocast caches their bf16 copies with the weights'; a for-loop optimizer walks them
  as tensors of their own (registration order: q_proj.weight, q_proj.bias, k_proj.weight, ...).

Qwen3 (``Qwen3Attention``: ``q_norm``/``k_norm`` = ``Qwen3RMSNorm(head_dim)`` on the projections
viewed (b, s, heads, head_dim), before rotary; ``weight * hidden.to(input_dtype)``)
  Per norm over width n (q, or kv) with g groups (heads, or kv_heads): ``pow`` saves its fp32
  input (fp32: the projection's output itself; bf16 and AMP, where the projection is bf16: the
  fp32 copy) 4n, ``mul`` saves rsqrt 4g, the ``weight *`` saves the normalized tensor after the
  cast back (fp32 4n, bf16/AMP 2n). The norm's output is read by rotary (``q * cos`` saves only
  cos), so it is not kept: fp32 8n + 4g, bf16/AMP 6n + 4g. head_dim is the config's (128 by
  default), independent of hidden: q may be wider than hidden (Qwen3-1.7B: q 2048 = h, 0.6B: 2048 > 1024).

OLMo 2 (``Olmo2DecoderLayer``: no input norm; ``x + post_attention_layernorm(attn(x))``,
``mid + post_feedforward_layernorm(mlp(mid))``; ``q_norm`` over q, ``k_norm`` over kv, on the
projections' outputs; ``Olmo2RMSNorm`` returns ``(weight * normalized).to(input_dtype)``)
  * q, k, v read the layer input: fp32 and bf16 save it (the previous layer's output, counted as
    ``output_saved_by_next``); AMP saves its three bf16 casts (3 x 2h) and not the input.
  * Olmo2RMSNorm multiplies the weight by the fp32 normalized tensor, so it keeps that (4n) in
    every regime: fp32 copy or input 4n + rsqrt 4 + normalized 4n = 8n + 4 per norm (q_norm,
    k_norm, and the two post-norms over h, whose inputs are o_proj's and down_proj's outputs).
  * The mid residual is read by gate and up: fp32 4h, bf16 2h, AMP their two casts 2 x 2h.
  * Rotary's cos and sin are fp32 in every regime (``Olmo2RotaryEmbedding.forward`` does not cast
    them; ``apply_rotary_pos_emb`` casts q and k back): in bf16 the tables are 4 B, not 2.
  * The final norm (``Olmo2RMSNorm``): fp32 normalized + output 8h + 4 (its input is the last
    layer's output, counted); bf16: fp32 copy + fp32 normalized + bf16 output 10h + 4, where the
    last layer's bf16 output is not kept by it (the walker counts every layer's output as kept
    by the next: in bf16 the embedding output, kept by layer 1's q/k/v, is the same size); AMP:
    fp32 normalized + the LM head's bf16 cast 6h + 4, its fp32 input (the last layer's output)
    being the size of the embedding output the model counts (kept in fp32/AMP by the first norm
    in Llama; in OLMo 2 AMP the embedding output is not kept, the last output is).

Phi-3 (``Phi3Attention``: ``qkv = qkv_proj(x)``, q, k, v slices of it; ``Phi3MLP``:
``gate, up = gate_up_proj(x).chunk(2)``)
  * v is a view of the fused qkv storage and SDPA saves v: the whole qkv output (c (q + 2kv))
    stays alive next to rotary's new q and k (c (q + kv)): c (q + kv) more than Llama; and the
    attention output is copied once more (c q: see ``_phi3_sdpa``). Eager: the same c (q + kv)
    only at batch 1 without GQA (``_phi3_eager``).
  * gate and up are views of one 2f storage, saved by silu and the product: 4cf as Llama.
  * Under AMP one input cast per fused linear (qkv_proj, gate_up_proj: 2 x 2h instead of 5 x 2h).
  * partial_rotary_factor (Phi-4-mini 0.75): rotary concatenates the rotated and passed parts
    into new q, k (nothing more saved); the cos/sin tables and inv_freq buffers are that share
    of head_dim.
  * Phi-3's sliding window (2047 in Phi-3-mini) needs no mask while seq_len < window; from it on
    transformers passes SDPA a mask (SDPA then loses its GQA path and repeats k and v): refused
    under SDPA (eager builds a mask of the same size either way).

GQA under SDPA: transformers passes ``enable_gqa=True`` when there is no mask (every run here:
causal, no padding), so the CPU flash kernel runs on the kv_heads-wide k and v (kernels.py's
``separate-qkv`` formula). Eager repeats k and v to every head (``repeat_kv``).
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import NotModelledError

from .. import term_keys as K
from ..families import RMS_NORM, ArchitectureFamily, LayerWeight, Norm
from ..kernels import EAGER, SDPA, SEPARATE_QKV, kernel_of
from ..layer_ops import llama_ops
from ..layers import REPLICATED, Part, LayerWalk, megatron_gated_mlp, rms_norm_lora_parts

W = LayerWeight


def _c(regime: str) -> int:
    return 4 if regime == "fp32" else 2


def _r(regime: str) -> int:
    return 2 if regime == "bf16" else 4


def _details(model) -> dict:
    return dict(getattr(model, "details", None) or {}) if model is not None else {}


# --- weights and parameter tensors -----------------------------------------------------------------

def _qwen2_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    # Column-parallel q, k, v: their biases split with them.
    return (W("q_proj", h * q_dim), W("k_proj", h * kv_dim), W("v_proj", h * kv_dim), W("o_proj", q_dim * h),
            W("gate_proj", h * f), W("up_proj", h * f), W("down_proj", f * h),
            W("q_proj.bias", q_dim, bias=True), W("k_proj.bias", kv_dim, bias=True),
            W("v_proj.bias", kv_dim, bias=True))


def _llama_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    return (W("q_proj", h * q_dim), W("k_proj", h * kv_dim), W("v_proj", h * kv_dim), W("o_proj", q_dim * h),
            W("gate_proj", h * f), W("up_proj", h * f), W("down_proj", f * h))


def _phi3_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    return (W("qkv_proj", h * (q_dim + 2 * kv_dim)), W("o_proj", q_dim * h), W("gate_up_proj", h * 2 * f),
            W("down_proj", f * h))


def _tensors(shape, block):
    """Embedding, the layers' tensors, the final norm, an untied LM head (registration order)."""
    tail = (shape.hidden,) if shape.tied else (shape.hidden, shape.embedding_parameters)
    return (shape.embedding_parameters,) + tuple(block) * shape.layers + tail


def _qwen2_tensors(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    return _tensors(s, (h * q, q, h * kv, kv, h * kv, kv, q * h, h * f, h * f, f * h, h, h))


def _qwen3_tensors(s):
    h, q, kv, f, d = s.hidden, s.q_dim, s.kv_dim, s.ffn, s.head_dim
    return _tensors(s, (h * q, h * kv, h * kv, q * h, d, d, h * f, h * f, f * h, h, h))


def _olmo2_tensors(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    return _tensors(s, (h * q, h * kv, h * kv, q * h, q, kv, h * f, h * f, f * h, h, h))


def _phi3_tensors(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    return _tensors(s, (h * (q + 2 * kv), q * h, 2 * f * h, f * h, h, h))


def _shapes(block):
    def shapes(s):
        h, V = s.hidden, s.vocab
        out = [(V, h)] + block(s) * s.layers + [(h, 0)]
        return out + ([] if s.tied else [(V, h)])
    return shapes


def _qwen2_matrices(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    return [(q, h), (q, 0), (kv, h), (kv, 0), (kv, h), (kv, 0), (h, q), (f, h), (f, h), (h, f), (h, 0), (h, 0)]


def _qwen3_matrices(s):
    h, q, kv, f, d = s.hidden, s.q_dim, s.kv_dim, s.ffn, s.head_dim
    return [(q, h), (kv, h), (kv, h), (h, q), (d, 0), (d, 0), (f, h), (f, h), (h, f), (h, 0), (h, 0)]


def _olmo2_matrices(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    return [(q, h), (kv, h), (kv, h), (h, q), (q, 0), (kv, 0), (f, h), (f, h), (h, f), (h, 0), (h, 0)]


def _phi3_matrices(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    return [(q + 2 * kv, h), (h, q), (2 * f, h), (h, f), (h, 0), (h, 0)]


def _count(block):
    """The exact parameter count: the family's tensors with the model's shapes."""
    def count(model):
        from ..shapes import ModelShape
        return sum(block(ModelShape.of(model, _BY_ARCH[(model.architecture or "").lower()])))
    return count


# --- the layers -------------------------------------------------------------------------------------

def _input_norm(regime: str, h: int) -> int:
    # layers.py: RMSNorm saves normalized x + output (bf16: + the fp32 copy) and rsqrt; AMP the fp32
    # normalized x and rsqrt (each consuming linear saves its own bf16 cast).
    return {"fp32": 8 * h + 4, "bf16": 8 * h + 4, "amp-bf16": 4 * h + 4}[regime]


def _qwen3_qk_norm(regime: str, q: int, kv: int, heads: int, kv_heads: int) -> int:
    """Qwen3RMSNorm over head_dim on q and k: fp32 input/copy 4n + normalized (fp32 4n, else
    2n after the cast back) + rsqrt per head 4."""
    normalized = 4 if regime == "fp32" else 2
    return (4 + normalized) * (q + kv) + 4 * (heads + kv_heads)


def _pre_norm_layer(arch):
    """Qwen2, Qwen3, Phi-3: Llama's pre-norm layer with the variant's additions."""
    def layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
              seq_len, model=None):
        h, c, r = hidden, _c(regime), _r(regime)
        q, kv = heads * head_dim, kv_heads * head_dim
        amp = regime == "amp-bf16"
        fused = arch == "phi3"
        att, mlp = ("attention", "mlp") if arch == "qwen3" else ("", "")     # Qwen3 tags its modules
        w = LayerWalk()
        w.add("input norm", _input_norm(regime, h), REPLICATED)
        if amp:
            w.add("qkv_proj input cast" if fused else "q/k/v input casts", (1 if fused else 3) * 2 * h, REPLICATED,
                  module=att)
        if arch == "qwen3":
            w.add("QK-norm (fp32 q, k; normalized; rsqrt per head)", _qwen3_qk_norm(regime, q, kv, heads, kv_heads),
                  module=att)
        w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=q, kv_dim=kv, hidden=h,
                           seq_len=seq_len, tokens=tokens), module=att)
        w.add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, REPLICATED)
        w.add("post-attention norm", _input_norm(regime, h), REPLICATED)
        if amp:
            w.add("gate_up_proj input cast" if fused else "gate/up input casts", (1 if fused else 2) * 2 * h,
                  REPLICATED, module=mlp)
        w.add("mlp (gate" + ("_up storage 2f" if fused else ", up") + ", silu, product)", 4 * c * ffn, module=mlp)
        return w.layer(tokens, r * h * tokens, regime != "bf16")   # bf16: the next norm saves its fp32 copy
    return layer


PHI3_QKV = "phi3-fused-qkv"


def _phi3_sdpa(*, kind, grads, device="cuda", **shape):
    """SDPA saves v, a view of qkv_proj's output: the q and k parts of that storage stay alive
    beside rotary's new q and k. q being a slice of qkv (not dense), rotary's q is laid out
    (b, heads, s, d); SDPA's output follows it, so ``transpose(1, 2).contiguous()`` copies it:
    o_proj saves the copy, SDPA its own output (one more c q than Llama, whose q keeps the
    (b, s, heads, d) layout of q_proj's output). (Dropout's CPU math kernel: refused for Phi-3.)"""
    c, q, kv = _c(kind), shape["q_dim"], shape["kv_dim"]
    return SDPA.saved(SEPARATE_QKV, kind=kind, grads=grads, **shape) + (
        Part("qkv_proj output (kept whole by v's view)", c * (q + kv)),
        Part("attention output (contiguous copy, o_proj input)", c * q, weight_gradient_only=True))


def _phi3_eager(*, kind, grads, device="cuda", **shape):
    """Eager attention's matmuls save heads-expanded k and v (as Llama's). Without GQA v is not
    repeated: matmul reshapes the (b, heads, s, d) view of qkv, a copy for b > 1 but a view at
    batch 1, which keeps the whole qkv storage (its q and k parts: c (q + kv) more)."""
    c, q, kv = _c(kind), shape["q_dim"], shape["kv_dim"]
    parts = EAGER.saved(SEPARATE_QKV, kind=kind, grads=grads, **shape)
    if q == kv and shape["tokens"] == shape["seq_len"]:
        parts += (Part("qkv_proj output (kept whole by v's view at batch 1)", c * (q + kv)),)
    return parts


def _olmo2_norm(n: int) -> int:
    """Olmo2RMSNorm over n: fp32 input or copy, fp32 normalized (kept by the weight multiply), rsqrt."""
    return 8 * n + 4


def olmo2_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                seq_len, model=None):
    """OLMo 2: q/k/v on the raw residual, full-width QK-norm, post-norms after attention and MLP."""
    h, c, r = hidden, _c(regime), _r(regime)
    q, kv = heads * head_dim, kv_heads * head_dim
    amp = regime == "amp-bf16"
    w = LayerWalk()
    if amp:
        w.add("q/k/v input casts", 3 * 2 * h, REPLICATED)
    w.add("q_norm, k_norm (full width)", _olmo2_norm(q) + _olmo2_norm(kv))
    w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=q, kv_dim=kv, hidden=h, seq_len=seq_len,
                       tokens=tokens))
    w.add("post-attention norm", _olmo2_norm(h), REPLICATED)
    w.add("gate/up input casts" if amp else "mid residual (gate/up input)", 4 * h if amp else r * h, REPLICATED)
    w.add("mlp (gate, silu, up, product)", 4 * c * ffn)
    w.add("post-feedforward norm", _olmo2_norm(h), REPLICATED)
    # fp32, bf16: the next layer's q/k/v keep this output; AMP: only their bf16 casts of it.
    return w.layer(tokens, r * h * tokens, not amp)


def _olmo2_final(kind, c, T, h):
    how = {"fp32": "normalized + output (fp32) + rsqrt",
           "bf16": "fp32 copy + fp32 normalized + bf16 output + rsqrt",
           "amp-bf16": "fp32 normalized + bf16 copy for the LM head + rsqrt"}[kind]
    return {"fp32": 8, "bf16": 10, "amp-bf16": 6}[kind] * T * h + 4 * T, how


def _olmo2_lora_final(kind, T, h):
    return 4 * T, "rsqrt (LoRA is not modelled for OLMo 2)"


OLMO2_NORM = Norm(name="Olmo2RMSNorm", parameters=1, saves_input_in_16bit=False, final_saved=_olmo2_final,
                  lora_final_saved=_olmo2_lora_final)


# --- around the layers, checks and notes ----------------------------------------------------------

def _rotary_fraction(model) -> float:
    value = _details(model).get("rotary_fraction")
    if value is None:
        value = _details(model).get("partial_rotary_factor", 1.0)
    return float(value or 1.0)


def _olmo2_adjust(kind, plan, placement, terms):
    """Olmo2RotaryEmbedding returns cos and sin in fp32 whatever the model's dtype (no
    ``.to(x.dtype)``; apply_rotary_pos_emb casts q and k back): in 16-bit training the tables
    are twice what the model counts for Llama's 16-bit tables."""
    if kind != "model_activations" or plan.profile_options.regime.residual == 4:
        return terms
    return [attrs.evolve(t, nbytes=2 * t.nbytes, formula=t.formula.replace(" x 2 B", " x 4 B") + " (fp32 in OLMo 2)")
            if t.key == K.ROPE_TABLES else t for t in terms]    # (an offloaded host copy too)


def _phi3_adjust(kind, plan, placement, terms):
    """Partial rotary: RoPE's tables and inv_freq buffers are that share of head_dim (the
    family's rotary_fraction is 1: the model's own factor scales them here)."""
    fraction = _rotary_fraction(plan.model)
    if fraction == 1.0:
        return terms
    from ..shapes import shape_of
    d = shape_of(plan).head_dim
    rotary = int(d * fraction)
    rotary -= rotary % 2
    out = []
    for t in terms:
        if t.key in (K.ROPE_BUFFERS, K.ROPE_TABLES):    # (an offloaded host copy too)
            t = attrs.evolve(t, nbytes=t.nbytes * rotary / d,
                             formula=t.formula + f" x {rotary}/{d} (partial_rotary_factor {fraction:g})")
        out.append(t)
    return out


def _check(arch):
    def check(plan) -> tuple[str, ...]:
        model, o = plan.model, plan.profile_options
        details = _details(model)
        layers = details.get("sliding_window_layers") or 0
        window = details.get("sliding_window")
        if arch == "phi3":
            # masking_utils._ignore_causal_mask_sdpa: no mask while kv_length < sliding_window.
            if window and plan.seq_len >= window and not kernel_of(plan).eager:    # declared, not named
                raise NotModelledError(
                    "seq_len", plan.seq_len, f"below the sliding window {window} of {model.name!r} (or eager attention)",
                    "from the window on transformers passes SDPA a mask (which also turns its GQA path into "
                    "repeated k and v); the phi3 family models the unmasked causal attention")
        elif layers:
            raise NotModelledError(
                "model.details.sliding_window_layers", layers, "0 for the " + arch + " family",
                "its sliding-window layers (an attention mask; SDPA then repeats k and v) are not modelled")
        if arch == "phi3" and o.dropout > 0:
            raise NotModelledError("dropout", o.dropout, "0.0 for the phi3 family",
                                   "Phi-3's residual and embedding dropouts are not modelled")
        if arch == "qwen3" and details.get("qkv_bias"):
            raise NotModelledError("model.details.qkv_bias", True, "False for the qwen3 family",
                                   "Qwen3 with attention_bias is not modelled")
        notes = []
        if o.regime.main_grad:
            notes.append(f"approximation: {arch} under Megatron-Core is costed as Megatron's Llama layers"
                         + (" (its QK-norm's saved tensors not modelled)" if arch in ("qwen3", "olmo2") else ""))
        if arch == "olmo2" and plan.tp_size > 1:
            notes.append("approximation: OLMo 2's full-width QK-norm under tensor parallelism is costed as split "
                         "over the ranks with q and k (its all-reduce of the norm statistics is not modelled)")
        return tuple(notes)
    return check


def _assumptions(arch):
    def assumptions(model) -> tuple[str, ...]:
        if arch == "qwen3" and model.head_dim is None:
            return ("head_dim 128 assumed (Qwen3's default; model.head_dim unknown)",)
        return ()
    return assumptions


def _family(arch, *, description, weights, tensors, matrices, layer, norm=RMS_NORM, adjust=None,
            layout=SEPARATE_QKV, layouts=(), op_outputs=None):
    return ArchitectureFamily(
        name=arch, label={"qwen2": "Qwen2", "qwen3": "Qwen3", "olmo2": "OLMo 2", "phi3": "Phi-3"}[arch],
        description=description, architectures=(arch,), norm=norm, positions="rotary",
        attention_layout=layout, attention_layouts=layouts, layer_weights=weights, parameter_tensors=tensors,
        matrix_shapes=_shapes(matrices), layer=layer, megatron_mlp=megatron_gated_mlp, lora_layer=None,
        assumptions=_assumptions(arch), count_parameters=_count(tensors), check=_check(arch), adjust_terms=adjust,
        op_outputs=op_outputs)


QWEN2 = _family("qwen2", description="Llama layers with q/k/v biases (Qwen2, Qwen2.5; validated against "
                                     "PyTorch's MemTracker)",
                weights=_qwen2_weights, tensors=_qwen2_tensors, matrices=_qwen2_matrices,
                layer=_pre_norm_layer("qwen2"))
QWEN3 = _family("qwen3", description="Llama layers with per-head QK-norm and head_dim 128 (Qwen3; validated "
                                     "against PyTorch's MemTracker)",
                weights=_llama_weights, tensors=_qwen3_tensors, matrices=_qwen3_matrices,
                layer=_pre_norm_layer("qwen3"), op_outputs=llama_ops)
OLMO2 = _family("olmo2", description="full-width QK-norm, norms after attention and MLP, no input norm "
                                     "(OLMo 2; validated against PyTorch's MemTracker)",
                weights=_llama_weights, tensors=_olmo2_tensors, matrices=_olmo2_matrices, layer=olmo2_layer,
                norm=OLMO2_NORM, adjust=_olmo2_adjust)
PHI3 = _family("phi3", description="Llama layers with fused qkv_proj and gate_up_proj, partial rotary "
                                   "(Phi-3, Phi-4; validated against PyTorch's MemTracker)",
               weights=_phi3_weights, tensors=_phi3_tensors, matrices=_phi3_matrices, layer=_pre_norm_layer("phi3"),
               adjust=_phi3_adjust, layout=PHI3_QKV, layouts={"sdpa": _phi3_sdpa, "eager": _phi3_eager})



# --- under LoRA: what each part is made of (lora.generic_layer reads it) ------------------------------

def _lora_tagged(layer, arch):
    """The pre-norm layer (Qwen2, Qwen3, Phi-3) with its parts split for LoRA, bytes unchanged: a
    RMSNorm keeps its normalized x only for its weight's gradient and its output for the q/k/v (or
    gate/up) weights' (fp32 8h + 4 = normalized 4h + output 4h + rsqrt; bf16 = fp32 copy 4h + rsqrt +
    normalized 2h + output 2h; AMP = normalized 4h + rsqrt, the consumers' casts apart); the QK-norm's
    normalized q, k (fp32 4n, else 2n) are its weight's; the MLP's product is down_proj's input (c f of
    its 4 c f); the attention kernel's part kept only for o_proj's weight is o_proj's input. The same
    ops as llama_layer's LoRA walk (lora.py), validated against peft (validation/lora_family_measurements.json)."""
    fused = arch == "phi3"
    qkv = ("qkv_proj",) if fused else ("q_proj", "k_proj", "v_proj")
    gate_up = ("gate_up_proj",) if fused else ("gate_proj", "up_proj")

    def tagged(**kw):
        lb = layer(**kw)
        regime, h, T = kw["regime"], kw["hidden"], kw["tokens"]
        q, kv = kw["heads"] * kw["head_dim"], kw["kv_heads"] * kw["head_dim"]
        c = _c(regime)

        def norm(readers):
            return rms_norm_lora_parts(regime, h, T, readers)

        def split(p):
            n = p.name
            if n == "input norm":
                return norm(qkv)
            if n == "post-attention norm":
                return norm(gate_up)
            if n in ("q/k/v input casts", "qkv_proj input cast"):
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=qkv),)
            if n in ("gate/up input casts", "gate_up_proj input cast"):
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=gate_up),)
            if n.startswith("QK-norm"):
                normalized = (4 if regime == "fp32" else 2) * (q + kv) * T
                return (attrs.evolve(p, nbytes=p.nbytes - normalized),
                        Part("QK-norm normalized (its weights')", normalized, weight_gradient_only=True))
            if n.startswith("mlp ("):
                return (attrs.evolve(p, nbytes=p.nbytes * 3 / 4),
                        Part("product (down_proj's input)", c * kw["ffn"] * T, weight_gradient_only=True,
                             inputs_of=("down_proj",)))
            if p.weight_gradient_only:
                return (attrs.evolve(p, inputs_of=("o_proj",)),)
            return ()
        return attrs.evolve(lb, parts=tuple(attrs.evolve(p, lora=split(p)) for p in lb.parts))
    return tagged


QWEN2, QWEN3, PHI3 = (attrs.evolve(f, layer=_lora_tagged(f.layer, f.name)) for f in (QWEN2, QWEN3, PHI3))

FAMILIES = (QWEN2, QWEN3, OLMO2, PHI3)
_BY_ARCH = {f.name: f for f in FAMILIES}
