"""GLM-4.5 (``glm4_moe``), Ministral (``ministral``) and Ministral 3 (``ministral3``), modelled as
transformers 5.23 builds them (issue 15) where the built-in Llama and Mixtral families only
approximated them. Checked against PyTorch's MemTracker: ``validation/families/glm_ministral``.

Notation of ``layers.py``, per token: h hidden, q = heads x head_dim, kv = kv_heads x head_dim, f MLP
width, c the compute dtype's bytes, s the sequence, b the micro-batch.

GLM-4.5 (``modeling_glm4_moe.py``)
* Attention (``Glm4MoeAttention``) is Llama's GQA with q/k/v biases (``attention_bias``; o_proj has
  none): a bias adds nothing saved (addmm keeps its input and weight), only parameters (and, under
  AMP, their cached bf16 copies), as in Qwen2.
* QK-norm (``use_qk_norm``: GLM-4.5 yes, GLM-4.5-Air no): ``Glm4MoeRMSNorm(head_dim)`` on q and k
  viewed (b, s, heads, head_dim), before rotary, ``weight * hidden.to(input_dtype)`` as Qwen3's:
  fp32 input / copy 4n, rsqrt 4 per head, the normalized tensor after the cast back (fp32 4n, else
  2n) (``llama_variants._qwen3_qk_norm``).
* Partial rotary (``partial_rotary_factor``, 0.5 by default: ``Glm4MoeConfig.__post_init__``):
  ``apply_rotary_pos_emb`` rotates ``q[..., :rotary_dim]`` (``q_rot * cos`` saves only cos; slices,
  ``rotate_half`` and ``cat`` save nothing) and concatenates the pass-through part into a new q and
  k: contiguous, laid out (b, heads, s, head_dim), unlike Llama's rotary output, which keeps q_proj's
  (b, s, heads, head_dim) layout. Eager saves what Llama's does. CPU SDPA's flash kernel lays its
  output out as q is, so ``attn_output.reshape(...)`` of the transposed output copies it: o_proj saves
  the copy, SDPA its own output, c q more than Llama (as ``llama_variants._phi3_sdpa`` found for
  Phi-3); a GPU's flash and memory-efficient kernels write (b, s, heads, head_dim) whatever q's layout,
  so the default (``device="cuda"``) has no copy (not measured: validation ran on CPU). The cos/sin
  tables and inv_freq buffers are rotary_dim wide (``_glm_adjust``).
* The MoE block (``Glm4MoeMoE``, ``Glm4MoeTopkRouter``) is DeepSeek-V3's, line for line (sigmoid
  scores, ``e_score_correction_bias``, group-limited top-k, ``norm_topk_prob``,
  ``routed_scaling_factor``; grouped_mm experts; one shared gated MLP of n_shared x
  moe_intermediate_size): what it saves, its weights and its tensors are DeepSeek's (``deepseek``'s
  ``_add_mlp`` with ``_router_per_token``, ``_mlp_weights``, ``_model_tensors``: imported, private
  there). The first ``first_k_dense_replace`` layers have a dense gated MLP of ``intermediate_size``.
* The layers differ (dense first, then MoE): the family's layer is the MEAN layer (the attention
  whole, the dense MLP x dense/L, the MoE block x MoE/L, their weights likewise), as the DeepSeek
  family's: exact in sum on one device; where one layer or one stage counts (a pipeline stage's
  own mix, full checkpointing's one-layer recompute working set) a note says it is approximate.

Ministral (``modeling_ministral.py``) and Ministral 3 (``modeling_ministral3.py``): Llama layers.
* Sliding windows: Ministral's ``layer_types`` (Ministral-8B: one full-attention layer, then three
  sliding ones; without layer_types ``MinistralConfig.__post_init__`` makes every layer sliding
  when ``sliding_window`` is set); Ministral 3 uses ``create_sliding_window_causal_mask`` for every
  layer when ``sliding_window`` is set (None by default). Under SDPA a sliding layer gets a mask once
  s >= window (``masking_utils._ignore_causal_mask_sdpa``: ``kv_length >= local_attention_size``),
  and with a mask ``sdpa_attention_forward`` repeats k and v to every head (``use_gqa_in_sdpa`` wants
  no mask) and the kernel saves the additive mask in the query's dtype (s x c per token per masked
  layer): ``gemma._attention_parts``, which the Gemma family measured, is reused (imported, private
  there). Eager builds (b, 1, s, s) masks for every layer either way: windows save nothing more.
  Under full checkpointing the masks are inputs of the checkpointed layers and stay alive through
  the backward (``_adjust``): SDPA's bool mask (b s^2, once past the window), eager's additive masks
  (b s^2 x the embeddings' bytes, one per layer type).
* Ministral 3's Llama-4 attention scale (``Ministral3Attention.forward``): ``q * get_llama_4_attn_scale
  (position_ids, beta, original_max_position_embeddings).to(q.dtype)``: the scale needs no grad, so the
  multiply saves it, (1, 1, s, 1) per layer (position_ids are (1, s) whatever the batch): 2 s bytes in
  bf16 (a cast copy), 4 s in fp32 and under AMP (q is fp32 after rotary); q's new product replaces
  rotary's output as what attention saves.

Refused by name: dropout > 0 (not measured), Megatron-Core's layers for GLM-4.5 (main-grad regimes),
attention kernels other than sdpa and eager for the sliding windows' masks. LoRA has no walker.
"""

from __future__ import annotations

import types

import attrs

from mlsysim_core.errors import NotModelledError

from .. import term_keys as K
from ..families import RMS_NORM, ArchitectureFamily, LayerWeight
from ..kernels import EAGER, SDPA, SEPARATE_QKV, kernel_of
from ..layer_ops import llama_ops
from ..layers import REPLICATED, TP, Part, LayerWalk, megatron_gated_mlp
from .deepseek import (Sizes, _add_mlp, _elements, _matrices, _mlp_weights, _model_tensors, mean_layer_note,
                       score_bias_buffers)
from .gemma import _attention_parts, checkpointed_masks
from .llama_variants import _input_norm, _qwen3_qk_norm

GLM = "glm4_moe"
GLM_ATTENTION = "glm4-moe-concatenated-rotary"   # Llama's GQA, q and k rebuilt by torch.cat after rotary
MINISTRAL, MINISTRAL3 = "ministral", "ministral3"
W = LayerWeight


def _details(model) -> dict:
    return dict(getattr(model, "details", None) or {}) if model is not None else {}


def _imported(model) -> bool:
    return "model_type" in _details(model)


def _c(regime: str) -> int:
    return 4 if regime == "fp32" else 2


# --- GLM-4.5: the model's facts --------------------------------------------------------------------

@attrs.frozen
class Glm:
    """What GLM-4.5's layers need beyond the workload's shapes: the DeepSeek MoE sizes (``Sizes``,
    its MLA fields unused) and GLM's own attention facts."""

    moe: Sizes
    qk_norm: bool
    qkv_bias: bool
    rotary_fraction: float
    assumed: tuple[str, ...] = ()


# transformers 5.23's Glm4MoeConfig defaults, for a model whose details do not say
_GLM_DEFAULTS = {"first_k_dense_replace": 1, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
                 "norm_topk_prob": True, "use_qk_norm": False, "attention_bias": False, "partial_rotary_factor": 0.5}


def glm(model) -> Glm:
    """``model``'s GLM-4.5 facts, from ``model.details`` (imported config keys), else the defaults
    (said in ``assumptions``)."""
    d = _details(model)
    imported = _imported(model)
    assumed = []

    def get(key, *found):
        for value in found:
            if value is not None:
                return value
        if key in d:
            return d[key]
        value = _GLM_DEFAULTS[key]
        if not imported:
            assumed.append(f"{key}={value} assumed (the GLM-4.5 default; not in model.details)")
        return value

    layers = model.layers
    dense = min(int(get("first_k_dense_replace", d.get("dense_layers"))), layers)
    experts = model.experts if model.is_sparse else 0
    top_k = model.active_experts_per_token if model.is_sparse else 0
    expert_ffn = (model.expert_ffn_dim if model.is_sparse else None) or d.get("moe_intermediate_size") or model.ffn_dim
    shared = get("n_shared_experts", getattr(model, "shared_experts", None))
    qk = d.get("qk_norm")
    qk_norm = bool(get("use_qk_norm", None if qk is None else qk == "head"))
    qkv_bias = bool(get("attention_bias", d.get("qkv_bias")))
    fraction = float(get("partial_rotary_factor", d.get("rotary_fraction")))
    z = Sizes(v3=True, hidden=model.hidden_dim, heads=model.heads, layers=layers, vocab=model.vocab_size,
              tied=bool(model.tied_embeddings), q_lora_rank=None, kv_lora_rank=0, nope=0, rope=0, v_dim=0,
              dense_layers=dense, dense_ffn=model.ffn_dim or 0, experts=experts, top_k=top_k, expert_ffn=expert_ffn,
              shared=int(shared or 0), n_group=int(get("n_group") or 1), topk_group=int(get("topk_group") or 1),
              group_limited=True, norm_topk_prob=bool(get("norm_topk_prob")), attention_bias=False, mlp_bias=False)
    return Glm(moe=z, qk_norm=qk_norm, qkv_bias=qkv_bias, rotary_fraction=fraction, assumed=tuple(assumed))


# --- GLM-4.5: parameters ------------------------------------------------------------------------------

def _glm_attention_tensors(model, g: Glm) -> list:
    """(name, shape) of one layer's attention parameters in registration order (``Glm4MoeAttention``)."""
    h, d = model.hidden_dim, _head_dim(model)
    q, kv = model.heads * d, (model.kv_heads or model.heads) * d
    out = []
    for name, rows in (("q_proj", q), ("k_proj", kv), ("v_proj", kv)):
        out.append((name, (rows, h)))
        if g.qkv_bias:
            out.append((name + ".bias", (rows, 0)))
    out.append(("o_proj", (h, q)))
    if g.qk_norm:
        out += [("q_norm", (d, 0)), ("k_norm", (d, 0))]
    return out


def _head_dim(model) -> int:
    return model.head_dim or model.hidden_dim // model.heads


def _glm_model_tensors(model) -> list:
    """DeepSeek's model tensors (``deepseek._model_tensors``: its layers' mlp, ``Glm4MoeMoE``'s experts,
    gate, shared_experts or a dense MLP, and the two norms) with GLM's attention."""
    g = glm(model)
    return _model_tensors(g.moe, _glm_attention_tensors(model, g))


def _glm_parameter_tensors(shape) -> tuple[int, ...]:
    return tuple(_elements(s) for _, s in _glm_model_tensors(shape.model))


def _glm_matrix_shapes(shape) -> list:
    return _matrices(_glm_model_tensors(shape.model))


def _glm_count(model) -> int:
    return sum(_elements(s) for _, s in _glm_model_tensors(model))


def _glm_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None) -> tuple[LayerWeight, ...]:
    """The mean layer's weights: the attention whole (column-parallel q/k/v and their biases, the
    QK-norm weights replicated and not autocast), the dense MLP x dense/L, the MoE block x MoE/L
    (``deepseek._mlp_weights``: the router replicated, the experts over ep x expert_tp, not autocast)."""
    g = glm(model)
    out = []
    for name, s in _glm_attention_tensors(model, g):
        norm = name in ("q_norm", "k_norm")
        out.append(W(name, _elements(s), split=REPLICATED if norm else TP, autocast=not norm,
                     bias=name.endswith(".bias")))
    return tuple(out) + _mlp_weights(g.moe)


# --- GLM-4.5: the (mean) layer ---------------------------------------------------------------------

def glm_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens, seq_len,
              model=None):
    """The mean GLM-4.5 decoder layer (module docstring)."""
    if dropout:
        raise _dropout_refused(GLM)
    g = glm(model)
    h = hidden
    q, kv = heads * head_dim, kv_heads * head_dim
    amp = regime == "amp-bf16"
    w = LayerWalk()
    w.add("input norm", _input_norm(regime, h), REPLICATED)
    if amp:
        w.add("q/k/v input casts", 3 * 2 * h, REPLICATED)
    if g.qk_norm:
        w.add("QK-norm (fp32 q, k; normalized; rsqrt per head)", _qwen3_qk_norm(regime, q, kv, heads, kv_heads))
    w.extend(attention(kind=regime, dropout=False, heads=heads, q_dim=q, kv_dim=kv, hidden=h, seq_len=seq_len,
                       tokens=tokens))
    w.add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, REPLICATED)
    w.add("post-attention norm", _input_norm(regime, h), REPLICATED)
    _add_mlp(w, g.moe, regime, h)    # deepseek.deepseek_layer's dense MLP and MoE block (Glm4MoeMoE is DeepseekV3MoE)
    r = 2 if regime == "bf16" else 4
    return w.layer(tokens, r * h * tokens, regime != "bf16")   # bf16: the next norm saves its fp32 copy


def _glm_sdpa(*, device="cuda", **keywords):
    """SDPA on q laid out (b, heads, s, head_dim) (module docstring): on CPU the output's contiguous
    copy for o_proj (c q) beside the kernel's own output; on a GPU, Llama's."""
    parts = SDPA.saved(SEPARATE_QKV, **keywords)
    if device == "cpu" and not keywords["dropout"]:
        parts += (Part("attention output (contiguous copy for o_proj: CPU flash output laid out as q)",
                       _c(keywords["kind"]) * keywords["q_dim"], weight_gradient_only=True),)
    return parts


def _glm_eager(*, device="cuda", **keywords):
    return EAGER.saved(SEPARATE_QKV, **keywords)


def _glm_megatron(*, hidden, ffn, experts, top_k):
    raise NotModelledError("regime", "Megatron-Core (main-grad)",
                           "a regime that runs transformers' GLM-4.5 layers (fp32, bf16, fp16, mixed-bf16, fsdp-bf16)",
                           "Megatron-Core's GLM-4.5 layers (first-k dense, shared expert) are not modelled")


def _dropout_refused(arch):
    return NotModelledError("dropout", "> 0", f"0.0 for a {arch} model",
                            "attention dropout was not measured for this family (validation/families/glm_ministral "
                            "runs without)")


def _glm_check(plan) -> tuple[str, ...]:
    o = plan.profile_options
    if o.regime.main_grad:
        raise _glm_megatron(hidden=0, ffn=0, experts=0, top_k=0)
    if o.dropout:
        raise _dropout_refused(GLM)
    z = glm(plan.model).moe
    if z.dense_layers and z.moe_layers:
        return tuple(mean_layer_note(plan, "GLM-4.5", f"{z.dense_layers} dense, {z.moe_layers} MoE"))
    return ()


def _glm_assumptions(model) -> tuple[str, ...]:
    return glm(model).assumed


def _glm_adjust(kind, plan, placement, terms):
    """Partial rotary: the RoPE tables and inv_freq buffers are rotary_dim = head_dim x
    partial_rotary_factor wide (``Glm4MoeRotaryEmbedding.compute_default_rope_parameters``); the
    routers' fp32 ``e_score_correction_bias`` buffers (E per MoE layer, ``_keep_in_fp32_modules_strict``)."""
    g = glm(plan.model)
    terms = list(terms)
    from ..shapes import shape_of
    d = shape_of(plan).head_dim
    rotary = int(d * g.rotary_fraction)
    out = []
    for t in terms:
        if t.key in (K.ROPE_BUFFERS, K.ROPE_TABLES) and rotary != d:    # (an offloaded host copy too)
            t = attrs.evolve(t, nbytes=t.nbytes * rotary / d,
                             formula=t.formula + f" x {rotary}/{d} (partial_rotary_factor {g.rotary_fraction:g})")
        out.append(t)
    z = g.moe
    if kind == "weights" and z.moe_layers:
        out.append(score_bias_buffers(z.experts, z.moe_layers * placement.layers_per_stage / z.layers))
    return out


# --- Ministral, Ministral 3 ---------------------------------------------------------------------------

def _arch(model) -> str:
    return (model.architecture or "").lower() if model is not None else ""


def sliding(model) -> tuple[int | None, int]:
    """(window, sliding layers) as transformers 5.23 builds the model (module docstring): the raw
    ``layer_types`` / ``sliding_window`` of an imported config (``hf.from_hf_config``'s
    ``sliding_window_layers`` counts a window only where layer_types list it), else the details'
    ``sliding_window_layers``."""
    d = _details(model)
    window = d.get("sliding_window") or None
    if not window:
        return None, 0
    types_ = d.get("layer_types")
    if _arch(model) == MINISTRAL and isinstance(types_, (list, tuple)) and types_:
        return window, sum(1 for t in types_ if t == "sliding_attention")
    if _imported(model):
        return window, model.layers           # MinistralConfig.__post_init__; Ministral3Model.forward
    return window, int(d.get("sliding_window_layers", model.layers) or 0)


def _masked_attention(attention, model, **shape):
    """The kernel's attention as the mean over the layers, the sliding ones masked past the window
    (``gemma._attention_parts``, fed this family's window and sliding layers)."""
    if model is None:
        return _attention_parts(attention, None, **shape)
    window, n = sliding(model)
    proxy = types.SimpleNamespace(architecture=model.architecture, layers=model.layers,
                                  details={"model_type": _arch(model), "sliding_window": window,
                                           "sliding_window_layers": n})
    return _attention_parts(attention, proxy, **shape)


def _ministral_layer(version: int):
    def layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens, seq_len,
              model=None):
        if dropout:
            raise _dropout_refused(MINISTRAL3 if version == 3 else MINISTRAL)
        h, c = hidden, _c(regime)
        w = LayerWalk()
        w.add("input norm", _input_norm(regime, h), REPLICATED)
        if regime == "amp-bf16":
            w.add("q/k/v input casts", 3 * 2 * h, REPLICATED, module="attention")
        w.extend(_masked_attention(attention, model, regime=regime, dropout=False, heads=heads, kv_heads=kv_heads,
                                   head_dim=head_dim, hidden=h, seq_len=seq_len, tokens=tokens), module="attention")
        if version == 3:
            # the Llama-4 scale (1, 1, s, 1), saved by q's multiply: a bf16 cast in bf16, fp32 otherwise
            w.constant.append(Part("Llama-4 attention scale (1 x 1 x s x 1, saved by q's multiply)",
                                   (2 if regime == "bf16" else 4) * seq_len, split=REPLICATED))
        w.add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, REPLICATED)
        w.add("post-attention norm", _input_norm(regime, h), REPLICATED)
        if regime == "amp-bf16":
            w.add("gate/up input casts", 2 * 2 * h, REPLICATED, module="mlp")
        w.add("mlp (gate, silu, up, product)", 4 * c * ffn, module="mlp")
        return w.layer(tokens, (2 if regime == "bf16" else 4) * h * tokens, regime != "bf16")
    return layer


def _ministral_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    return (W("q_proj", h * q_dim), W("k_proj", h * kv_dim), W("v_proj", h * kv_dim), W("o_proj", q_dim * h),
            W("gate_proj", h * f), W("up_proj", h * f), W("down_proj", f * h))


def _ministral_tensors(s):
    h, q, kv, f = s.hidden, s.q_dim, s.kv_dim, s.ffn
    block = (h * q, h * kv, h * kv, q * h, h * f, h * f, f * h, h, h)
    tail = (h,) if s.tied else (h, s.embedding_parameters)
    return (s.embedding_parameters,) + block * s.layers + tail


def _ministral_matrices(s):
    h, q, kv, f, V = s.hidden, s.q_dim, s.kv_dim, s.ffn, s.vocab
    block = [(q, h), (kv, h), (kv, h), (h, q), (f, h), (f, h), (h, f), (h, 0), (h, 0)]
    return [(V, h)] + block * s.layers + [(h, 0)] + ([] if s.tied else [(V, h)])


def _ministral_count(model) -> int:
    from ..shapes import ModelShape
    return sum(_ministral_tensors(ModelShape.of(model, _BY_ARCH[_arch(model)])))


def _ministral_check(version: int):
    arch = MINISTRAL3 if version == 3 else MINISTRAL

    def check(plan) -> tuple[str, ...]:
        o = plan.profile_options
        if o.dropout:
            raise _dropout_refused(arch)
        window, n = sliding(plan.model)
        kernel = kernel_of(plan)     # what it declares it computes, not its name
        if n and window and plan.seq_len >= window and not (kernel.sdpa or kernel.eager):
            raise NotModelledError("attention", kernel.name, f"sdpa or eager for {plan.model.name!r} at seq_len >= its "
                                   f"sliding window {window}", "the sliding-window masks are modelled for those "
                                   "kernels only")
        notes = []
        L = plan.model.layers
        if 0 < n < L and window and plan.seq_len >= window and kernel.sdpa and not o.regime.main_grad:
            notes += mean_layer_note(plan, arch, f"{n} masked sliding-window, {L - n} full")
        if o.regime.main_grad:
            notes.append(f"approximation: {arch} under Megatron-Core is costed as Megatron's Llama layers"
                         + (" (its sliding-window masks not modelled)" if n and window and plan.seq_len >= window
                            else "") + (" (its Llama-4 attention scale not modelled)" if version == 3 else ""))
        return tuple(notes)
    return check


def _ministral_assumptions(version: int):
    def assumptions(model) -> tuple[str, ...]:
        d = _details(model)
        if _imported(model) or "sliding_window" in d:
            return ()
        if version == 3:
            return ("no sliding window assumed (Ministral 3's default; model.details has no sliding_window)",)
        return ("no sliding window assumed (model.details has no sliding_window; Ministral-8B's is 32768 in three "
                "of every four layers)",)
    return assumptions


def _ministral_adjust(kind, plan, placement, terms):
    """Under full checkpointing the attention masks are the checkpointed layers' inputs, alive
    through the backward (without checkpointing they die with the model's forward, before the
    logits): SDPA's sliding-window bool mask once s >= window; eager's additive masks, one per
    layer type, in the embeddings' dtype."""
    terms = list(terms)
    from ..checkpointing import whole_layers
    if kind != "model_activations" or not whole_layers(plan) or plan.profile_options.regime.main_grad:
        return terms
    from ..model import context
    ctx = context(plan, placement)
    s = ctx.seq_len
    window, n = sliding(plan.model)
    return terms + checkpointed_masks(plan, placement, eager=kernel_of(plan).eager,
                                      layer_types=2 if 0 < n < plan.model.layers else 1,
                                      masked=bool(n and window and s >= window), s=s)


# --- the families ------------------------------------------------------------------------------------

GLM4_MOE = ArchitectureFamily(
    name=GLM, label="GLM-4.5", sparse=True,
    description="GQA with q/k/v biases, optional QK-norm and partial rotary, then DeepSeek-V3's MoE (first-k dense "
                "layers, shared experts, sigmoid group-limited routing) (GLM-4.5, GLM-4.5-Air; validated against "
                "PyTorch's MemTracker)",
    architectures=(GLM,), norm=RMS_NORM, positions="rotary", attention_layout=GLM_ATTENTION,
    attention_layouts={"sdpa": _glm_sdpa, "eager": _glm_eager},
    layer_weights=_glm_weights, parameter_tensors=_glm_parameter_tensors, matrix_shapes=_glm_matrix_shapes,
    layer=glm_layer, megatron_mlp=_glm_megatron, lora_layer=None, assumptions=_glm_assumptions,
    count_parameters=_glm_count, check=_glm_check, adjust_terms=_glm_adjust)


def _ministral_family(version: int, *, name, label, description):
    return ArchitectureFamily(
        name=name, label=label, description=description, architectures=(name,), norm=RMS_NORM, positions="rotary",
        attention_layout=SEPARATE_QKV, layer_weights=_ministral_weights, parameter_tensors=_ministral_tensors,
        matrix_shapes=_ministral_matrices, layer=_ministral_layer(version), megatron_mlp=megatron_gated_mlp,
        lora_layer=None, assumptions=_ministral_assumptions(version), count_parameters=_ministral_count,
        check=_ministral_check(version), adjust_terms=_ministral_adjust, op_outputs=llama_ops)


MINISTRAL_FAMILY = _ministral_family(
    1, name=MINISTRAL, label="Ministral",
    description="Mistral layers with interleaved full and sliding-window attention (layer_types; SDPA masks and "
                "repeats k, v in the sliding layers past the window) (Ministral-8B; validated against PyTorch's "
                "MemTracker)")
MINISTRAL3_FAMILY = _ministral_family(
    3, name=MINISTRAL3, label="Ministral 3",
    description="Llama layers with the Llama-4 attention scale on q and an optional sliding window (Ministral 3; "
                "validated against PyTorch's MemTracker)")

FAMILIES = (GLM4_MOE, MINISTRAL_FAMILY, MINISTRAL3_FAMILY)
_BY_ARCH = {f.name: f for f in FAMILIES}
