"""The gpt-oss family (gpt-oss-20b, gpt-oss-120b: Hugging Face ``model_type`` "gpt_oss").

What transformers 5.23 builds (``models/gpt_oss/modeling_gpt_oss.py``) and what PyTorch 2.13 keeps for
backward, op by op (notation of ``layers.py``: h hidden, a heads, q = a x head_dim, f intermediate,
E experts, k per token, c compute bytes, r residual bytes; per token unless said):

* ``GptOssRMSNorm``: ``(weight * (x.float() * rsqrt(...))).to(dtype)`` -- unlike Llama the weight
  multiplies the fp32 normalized x, so that multiply saves the fp32 normalized x (4h) in every
  regime; its fp32 product is cast back. fp32: normalized 4h + rsqrt 4 + output 4h (saved by the next
  linears) = 8h + 4; bf16: the fp32 copy of x (saved by ``pow``) 4h + rsqrt + normalized 4h + the
  bf16 output 2h = 10h + 4 (Llama's is 8h + 4); AMP: normalized 4h + rsqrt, each consuming linear
  saving its own bf16 cast. The final norm likewise (``GPT_OSS_NORM``).
* q/k/v/o ``nn.Linear`` with biases (``attention_bias``): an addmm saves its input and weight only,
  so the biases add parameters, not activations.
* Rotary (YaRN; ``_apply_rotary_emb``): halves ``first * cos - second * sin`` and a ``cat``; the
  multiplies save only cos/sin, which are ``head_dim / 2`` wide (``emb = freqs``, no doubling): the
  model's cos/sin tables are half the Llama ones (``adjust_terms``). q_embed, k_embed are new
  tensors (c x q, c x kv; fp32 under AMP: bf16 q times fp32 cos).
* Eager attention with sinks (``eager_attention_forward``): ``matmul(q, repeat_kv(k)^T)`` saves q_embed
  and the repeated k (c x q each); the ``* scaling`` and ``+ mask`` save nothing; ``cat([scores,
  sinks])`` gives a x (s + 1) logits per token; ``max(dim=-1)`` saves its int64 indices (8a); the
  ``softmax(dtype=logits.dtype)`` saves its output (c x a x (s + 1): in bf16 a bf16 softmax, not
  Llama's fp32 one); ``probs[..., :-1]`` is a view that ``matmul(probs, repeat_kv(v))`` saves with the
  repeated v (c x q); o_proj saves the contiguous transposed output (c x q). AMP: the matmul casts q
  and k to bf16 (2q each, saved), the logits become fp32 with the fp32 mask and sinks, softmax is fp32
  (4 x a(s + 1)) and ``.to(v.dtype)`` its bf16 copy (2 x a x s) is what the matmul saves. The
  s x (s + 1) logits exist for sliding-window layers too: eager applies the window through the mask
  only, so sliding and full layers save the same bytes and every layer is alike.
* Router ``F.linear(x, W, b)`` (saves its input: the norm output, AMP its bf16 cast), ``topk`` of the
  logits (int64 indices 8k), ``softmax`` over the k top values in the logits' dtype (its output, c x k).
* Experts (``experts_implementation="grouped_mm"``, transformers' default: ``grouped_mm_experts_forward``
  in ``integrations/moe.py``; not a loop over experts, not a dense bmm over all of them): tokens sorted
  by expert; the gathers save int64 ``perm // k``, ``perm``, ``inv_perm`` and the sorted expert ids
  that gather the per-row biases (4 x 8k), int32 offsets (4E per layer). grouped_mm is not autocast
  (it casts its input to the weights' dtype: under AMP the experts run in fp32), in that dtype ce:
  the gathered input (kh), gate_up output (2kf: both clamps save their strided views of it), the
  clamped SwiGLU ``gate.clamp(max=7)``, ``up.clamp(-7, 7)``, ``glu = gate * sigmoid(1.702 gate)``,
  ``(up + 1) * glu``: clamped gate, sigmoid output, glu, up + 1 (4kf; the clamped up and
  1.702 gate die), the product saved by the down grouped_mm (kf), the down output saved by the
  routing-weight multiply (kh): ce x k x (2h + 7f); the routing weights gathered by ``perm`` (c x k,
  saved by that multiply). The in-place bias adds save nothing.

Outside the layers (``adjust_terms``): the half-width cos/sin tables; under full checkpointing the
eager masks the checkpointed layers keep (one (b, 1, s, s) per layer type); under AMP the final norm's
fp32 output held until the loss; without checkpointing, the first layer's attention backward (three
b x a x s x (s + 1) tensors at ``max``'s backward with every later gradient alive), a higher point of
the backward than its end when the expert gradients are large (gpt-oss-120b).

Fused attention with sinks (``attention="flex_attention"``, or any kernel declaring ``computes="flex"`` and
``sinks="lse"``: ``flex_sinks``): transformers' ``flex_attention_forward`` with ``s_aux`` runs
``flex_attention`` (which keeps q, k, v at their own width, its output and the fp32 log-sum-exp, no scores)
and renormalises the output by the sinks through the log-sum-exp, as the hub's and vLLM's sink kernels do;
sliding-window and full layers alike (the window is in the BlockMask, one per layer type, kept by every
layer: ``adjust_terms``), no additive masks and no s x (s + 1) backward moment. Per token (c the compute
bytes, r the renormalisation's): c(2q + 2kv) + 4a + 4ra + cq against eager's 4cq + 8a + ca(s + 1) (bf16):
gpt-oss-120b in bf16 on a GPU keeps 27,392 B a token and layer whatever s, eager 557,696 B at s = 4,096.
Measured on the CPU in fp32, bf16 and under autocast, with and without full checkpointing
(``validation/families/gpt_oss/measure_flex_sinks.py``, the profiler's memory timeline: flex_attention has
no CPU backward in torch 2.13's public API, the script lifts that guard and transformers' CPU one, and
MemTracker has no rule for its higher-order operator). What only the CPU does is left out where the device is
a GPU: the uncompiled autograd function's row maxima (``flex_sinks``), the fp32 scores its eager
implementation materialises as temporaries (not modelled: the measured runs keep them below the phases'
peaks) and the reference cycles of that path, which hold about 1.3 MB per iteration until Python's
collector runs (1.3 MB, 1.7 MB with full checkpointing, in the measured runs; not modelled).

Under the Megatron-Core regime (``main_grad``) the layers are Megatron-Core's as Megatron-Bridge's gpt-oss recipes
configure them (``_megatron_check``, ``_megatron_terms``): Transformer Engine's fused attention with
``softmax_type="learnable"`` keeps what FlashAttention keeps, q, k, v, the output and the fp32 softmax
statistics, and returns the sinks' gradient from its backward (TransformerEngine ``transformer_engine/pytorch/
attention/dot_product_attention/backends.py`` at d0067d0d, ``FusedAttnFunc``: derived, not measured); the MoE
MLP (TEGroupedMLP with biases, the quick-GELU GLU clamped at 7 with ``glu_linear_offset`` 1, the alltoall
dispatcher with fused permutation) is ``families.megatron_clamped_glu_moe``, measured to the byte
(``validation/megatron_gpt_oss``). Modelled on one device, under tensor parallelism with sequence parallelism and
``expert_tp_size=1`` (the recipes' layout; ``measure_tp.py``: one layer on rank 0 of a group of 2, every saved and held
tensor the rank's share, its T / tp tokens and its heads), under expert parallelism and under pipeline
parallelism (data parallelism allowed; cp = 1, two or more experts a rank: one rank of an expert-parallel
group measured, the router, the permutation map and the held [T, E] tensors per token of the rank, what is per
routed copy per row the rank receives; a pipeline stage's MoE layers under Megatron-Core's 1F1B measured on its
first, a middle and its last stage, ``measure_pp.py``: each in-flight micro-batch's saved tensors, one set of
held tensors a layer, a later stage's last receive buffer held after the backward) without recomputation (or selective
recomputation, which recomputes nothing here) or with Megatron-Core's full recompute (``recompute_granularity="full"``,
method ``uniform``, one layer a chunk; ``measure_recompute.py``: the checkpointed inputs, one recomputed layer in
each micro-batch's backward, each layer's detached input and its gradient held after its backward by the recomputed
probabilities' graph; method ``block``, ``checkpointed_layers``, on one stage: ``measure_tp.py``) or with its selective ``recompute_modules`` ``layernorm`` / ``moe_act`` (the ``selective``
strategy's ``modules``: ``families.megatron_clamped_glu_moe_recomputed``, ``measure_modules.py``), without dropout or
token dropping; the rest is refused by name.

Validated against PyTorch's MemTracker: ``validation/families/gpt_oss``. Under full checkpointing the
backward's peak is also in a recomputed layer's ``max`` backward; the profile's generic recompute
working set (``model.layer_terms``) costs that moment (within 2.1 % of the measured backward). Not modelled, refused by name
(``NotModelledError``): attention kernels other than eager, sdpa and flex_attention with sinks (transformers
5.23 refuses SDPA for gpt-oss, ``_supports_sdpa = False``, and runs eager by default: the family costs
``attention="sdpa"``, the profile's default, as eager with a note; the hub's flash kernels with sinks were
not measured),
dropout > 0, LoRA, and training in MXFP4 (a regime with sub-16-bit weights
for a config whose ``quantization_config`` is MXFP4: gpt-oss trains on dequantized bf16 weights, see
``check``). Assumed: ``output_router_logits`` false (gpt-oss's config; true keeps every layer's router
logits for the auxiliary loss), and the norms' weights in the regime's dtype as ``from_config``
builds them (``from_pretrained(dtype=bfloat16)`` keeps them in fp32, ``_keep_in_fp32_modules``:
(2L + 1) x h x 2 B more weights; the saved activations are the same).
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import ACTIVATIONS, PHASES, MemoryTerm

from ..families import (MEGATRON_LM, RMS_NORM, ArchitectureFamily, LayerWeight, Norm, megatron_alltoall_counts_held,
                        megatron_alltoall_held, megatron_alltoall_map_held, megatron_clamped_glu_moe,
                        megatron_clamped_glu_moe_recomputed)
from .. import term_keys as K
from ..kernels import COMPUTES_FLEX, SINKS_THROUGH_LSE, kernel_of
from ..layers import EXPERTS, REPLICATED, TP, Part, LayerWalk

ARCHITECTURE = "gpt_oss"
LAYOUT = "gpt-oss-sinks"          # the attention layout: q/k/v/o with biases, GQA, sinks concatenated to the scores
HEAD_DIM = 64                     # gpt-oss's head_dim (config.json), used where a model is not given
FLEX_BLOCK = 128                  # BlockMask's block size: torch's _DEFAULT_SPARSE_BLOCK_SIZE (create_block_mask's default)
SWIGLU_SAVED = 7                  # f-wide tensors the experts keep per routed copy besides their input/output: see above


# --- the norm --------------------------------------------------------------------------------------

def _final(kind, c, T, h):
    if kind == "bf16":
        return 10 * T * h + 4 * T, "fp32 copy + fp32 normalized (saved by the weight multiply) + bf16 output + rsqrt"
    if kind == "amp-bf16":
        return 6 * T * h + 4 * T, "normalized (fp32) + bf16 copy for the LM head + rsqrt"
    return 8 * T * h + 4 * T, "normalized + output (fp32) + rsqrt"


GPT_OSS_NORM = Norm(name="RMSNorm (weight x fp32 normalized)", parameters=1, saves_input_in_16bit=False,
                    final_saved=_final, lora_final_saved=RMS_NORM.lora_final_saved)


def _norm_bytes(kind: str, h: int) -> int:
    """One layer norm's saved bytes per token (module docstring), its output included."""
    return {"fp32": 8 * h + 4, "bf16": 10 * h + 4, "amp-bf16": 4 * h + 4}[kind]


# --- attention ----------------------------------------------------------------------------------------

def _dropout_refused(dropout):
    if dropout:
        raise NotModelledError("dropout", "> 0", "0.0 for a gpt-oss model",
                               "attention dropout on the sink-softmax's sliced probabilities was not measured "
                               "(validation/families/gpt_oss runs without it; gpt-oss's attention_dropout is 0.0)")


def eager_sinks(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads=(True, True, True),
                device="cuda"):
    """Eager attention with sinks (``eager_attention_forward``), per token: see the module docstring.
    The same on CPU and GPU (no fused kernel involved)."""
    _dropout_refused(dropout)
    q, a, s = q_dim, heads, seq_len
    if kind == "amp-bf16":
        return (Part("q, repeated k (bf16 casts of the fp32 rotary outputs)", 2 * 2 * q),
                Part("repeated v", 2 * q),
                Part("max indices of the logits + sink (int64)", 8 * a),
                Part("attention probabilities with the sink (fp32) + their bf16 copy",
                     4 * a * (s + 1) + 2 * a * s, recomputed_by_selective=True),
                Part("attention output (contiguous, o_proj input)", 2 * q, weight_gradient_only=True))
    c = 4 if kind == "fp32" else 2
    return (Part("q, repeated k and v", 3 * c * q),
            Part("max indices of the logits + sink (int64)", 8 * a),
            Part("attention probabilities with the sink", c * a * (s + 1), recomputed_by_selective=True),
            Part("attention output (contiguous, o_proj input)", c * q, weight_gradient_only=True))


def _gqa_expanded(heads: int) -> bool:
    """transformers' ``flex_attention_forward`` repeats k and v to the query heads (``repeat_kv``) when the
    local query heads are not a power of two ("When running TP this helps"), else passes ``enable_gqa=True``."""
    return heads & (heads - 1) != 0


def flex_sinks(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads=(True, True, True),
               device="cuda"):
    """``flex_attention`` with the sinks through its log-sum-exp (transformers 5.23's ``flex_attention_forward``
    with ``s_aux``; a kernel declaring ``computes="flex"``, ``sinks="lse"``), per token; c the compute bytes
    (2 under autocast too: autocast runs flex_attention on bf16 casts of the fp32 rotary outputs), r the
    renormalisation's (4 in fp32 and under autocast, whose ``logsumexp``/``exp`` run in fp32, else 2):

    * ``FlexAttentionAutogradOp`` saves q and k (the rotary outputs, or their bf16 casts: c x q, c x kv), v
      (c x kv; k and v at their own heads' width under ``enable_gqa``, repeated to c x q each when the heads
      are not a power of two), its output (c x q) and the fp32 log-sum-exp (4a), no scores; uncompiled (the
      CPU: ``device="cpu"``) it also saves the fp32 row maxima its backward never reads (4a), which
      Inductor's partition of the compiled op (a GPU) drops;
    * the sinks: ``lse.to(v.dtype)`` (fp32: the same tensor; else a copy nothing saves), ``cat([lse, sinks])``
      (saved by ``logsumexp``: r x 2a), ``logsumexp`` (its output, r x a), ``exp(lse - combined)`` (its
      output, r x a, saved by exp and by the multiply), ``output * renorm`` (saves the output and the
      factor, both counted): 4 x r x a;
    * o_proj's input, the contiguous transposed product (c x q; under autocast the linear's bf16 cast).

    The sinks' gradient flows through the renormalisation (``exp``, ``logsumexp``, ``expand``): nothing more is
    saved for it. Measured on the CPU (validation/families/gpt_oss/measure_flex_sinks.py)."""
    _dropout_refused(dropout)
    c, q, a = 4 if kind == "fp32" else 2, q_dim, heads
    r = 2 if kind == "bf16" else 4
    kv = q if _gqa_expanded(heads) else kv_dim
    maxima = 4 * a if device == "cpu" else 0
    return (Part("q, k, v (flex_attention's inputs)", c * (q + 2 * kv)),
            Part("flex_attention output + fp32 log-sum-exp" + (" + row maxima (uncompiled)" if maxima else ""),
                 c * q + 4 * a + maxima),
            Part("sink renormalisation (cat of lse and sink, logsumexp, exp)", 4 * r * a),
            Part("attention output (contiguous, o_proj input)", c * q, weight_gradient_only=True))


# --- one decoder layer -------------------------------------------------------------------------------

def gpt_oss_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                  seq_len, model=None):
    """One ``GptOssDecoderLayer`` (every layer alike: see the module docstring)."""
    _dropout_refused(dropout)
    h, f, k, E = hidden, ffn, top_k, experts
    amp, bf16 = regime == "amp-bf16", regime == "bf16"
    c = 4 if regime == "fp32" else 2           # linears, the router, the attention
    ce = 2 if bf16 else 4                      # the experts run in the weights' dtype
    r = 2 if bf16 else 4                       # the residual stream
    w = LayerWalk()
    w.add("input norm", _norm_bytes(regime, h), REPLICATED)
    if amp:
        w.add("q/k/v input casts", 3 * 2 * h, REPLICATED)
    w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=heads * head_dim, kv_dim=kv_heads * head_dim,
                       hidden=h, seq_len=seq_len, tokens=tokens))
    w.add("mid residual (post-attention norm input)", 0 if bf16 else 4 * h, REPLICATED)
    w.add("post-attention norm", _norm_bytes(regime, h), REPLICATED)
    w.add("router (input cast, top-k indices, softmax of the top-k)", (2 * h if amp else 0) + 8 * k + c * k,
          REPLICATED)
    w.add("expert indices (perm // k, perm, inv_perm, sorted expert ids)", 4 * 8 * k, REPLICATED)
    w.add("experts (input, gate_up, clamped SwiGLU, down input, down output)",
          ce * k * (2 * h + SWIGLU_SAVED * f), EXPERTS)
    w.add("routing weights (gathered)", c * k, REPLICATED)
    w.constant.append(Part("expert offsets (int32)", 4 * E, split=REPLICATED))
    return w.layer(tokens, r * h * tokens, not bf16)   # bf16: the next norm saves its fp32 copy instead


# Megatron-Core's gpt-oss MoE MLP (Megatron-Bridge's gpt-oss recipes: TEGroupedMLP, the quick-GELU GLU clamped at
# 7 with glu_linear_offset 1 under bias_activation_fusion, the alltoall dispatcher with moe_permute_fusion):
# families.megatron_clamped_glu_moe, measured in validation/megatron_gpt_oss.
megatron_mlp = megatron_clamped_glu_moe


# --- parameters ----------------------------------------------------------------------------------------

W = LayerWeight


def _attention_bias(model) -> bool:
    details = getattr(model, "details", None) or {}
    return bool(details.get("attention_bias", True))


def gpt_oss_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    """One layer's parameters in registration order. The vectors (biases, sinks) are listed as
    weights, not ``bias=True``: they count with the layer's parameters and split as their linear."""
    h, f, e = hidden, ffn, experts
    heads = model.heads if model is not None else q_dim // HEAD_DIM
    out = [W("self_attn.sinks", heads, autocast=False)]
    biased = _attention_bias(model)
    for name, rows, split in (("q_proj", q_dim, TP), ("k_proj", kv_dim, TP), ("v_proj", kv_dim, TP)):
        out.append(W(f"self_attn.{name}", h * rows))
        if biased:
            out.append(W(f"self_attn.{name}.bias", rows))
    out.append(W("self_attn.o_proj", q_dim * h))
    if biased:
        out.append(W("self_attn.o_proj.bias", h, split=REPLICATED))
    out += [W("mlp.router.weight", e * h, split=REPLICATED), W("mlp.router.bias", e, split=REPLICATED),
            W("mlp.experts.gate_up_proj", e * h * 2 * f, split=EXPERTS, autocast=False),
            W("mlp.experts.gate_up_proj_bias", e * 2 * f, split=EXPERTS, autocast=False),
            W("mlp.experts.down_proj", e * f * h, split=EXPERTS, autocast=False),
            W("mlp.experts.down_proj_bias", e * h, split=EXPERTS, autocast=False)]
    return tuple(out)


def _tensors(shape) -> list[tuple[int, tuple[int, int]]]:
    """(elements, (rows, cols)) of every parameter of ``GptOssForCausalLM`` in registration order
    (``named_parameters``: a module's own before its children's): the embedding; per layer the
    attention's sinks, then q/k/v/o (weight, bias), the router (weight, bias), the experts
    (gate_up, its bias, down, its bias), the two norms; the final norm; the LM head unless tied.
    The expert stacks are given as Adafactor factors them, over their last two dimensions."""
    h, V, q, kv, f, e = shape.hidden, shape.vocab, shape.q_dim, shape.kv_dim, shape.ffn, shape.experts
    biased = _attention_bias(shape.model)
    layer = [(shape.heads, (shape.heads, 0))]
    for rows, cols in ((q, h), (kv, h), (kv, h), (h, q)):
        layer.append((rows * cols, (rows, cols)))
        if biased:
            layer.append((rows, (rows, 0)))
    layer += [(e * h, (e, h)), (e, (e, 0)), (e * h * 2 * f, (h, 2 * f)), (e * 2 * f, (e, 2 * f)),
              (e * f * h, (f, h)), (e * h, (e, h)), (h, (h, 0)), (h, (h, 0))]
    out = [(V * h, (V, h))] + layer * shape.layers + [(h, (h, 0))]
    return out + ([] if shape.tied else [(V * h, (V, h))])


def parameter_tensors(shape) -> tuple[int, ...]:
    return tuple(n for n, _ in _tensors(shape))


def matrix_shapes(shape) -> list[tuple[int, int]]:
    return [rc for _, rc in _tensors(shape)]


def count_parameters(model) -> int:
    """``sum(p.numel())`` of ``GptOssForCausalLM.from_config`` with the model's shapes."""
    h, heads = model.hidden_dim, model.heads
    kv, d = model.kv_heads or heads, model.head_dim or h // heads
    q, kvd = heads * d, kv * d
    f = model.expert_ffn_dim or model.ffn_dim
    e = model.experts
    attention = heads + h * q + 2 * h * kvd + q * h + ((q + 2 * kvd + h) if _attention_bias(model) else 0)
    moe = e * h + e + e * (h * 2 * f + 2 * f + f * h + h)
    layer = attention + moe + 2 * h
    embeddings = model.vocab_size * h * (1 if model.tied_embeddings else 2)
    return embeddings + model.layers * layer + h


# --- outside the layers -------------------------------------------------------------------------------

def _mask_kinds(model) -> int:
    """How many distinct eager masks the layers use: one per layer type (``layer_types``; gpt-oss
    alternates sliding and full layers, its config's default)."""
    types = (getattr(model, "details", None) or {}).get("layer_types")
    if types:
        return len(set(types))
    return 2 if model.layers > 1 else 1


def adjust_terms(kind, plan, placement, terms):
    """What gpt-oss keeps outside its layers beyond the Llama-style terms (``model.py``):

    * its rotary cos/sin are head_dim / 2 wide (``GptOssRotaryEmbedding.forward``: ``emb = freqs``):
      half the tables the Llama-style term counts;
    * under full checkpointing, the eager masks: ``GptOssModel.forward`` builds one (b, 1, s, s) additive
      mask per layer type (``create_causal_mask``, ``create_sliding_window_causal_mask``) in the
      embeddings' dtype; the checkpointed layers keep them as inputs (without checkpointing they die
      when the decoder returns, before the loss's peak);
    * under autocast, the final norm's fp32 output (4 x T x h): the LM head saves its bf16 cast,
      but ``GptOssForCausalLM.forward`` still holds the output while it computes the loss.
    """
    if kind != "model_activations":
        return terms
    if plan.profile_options.regime.main_grad:
        return _megatron_terms(plan, placement, terms)
    from mlsysim_core.terms import BACKWARD, FORWARD
    out = []
    for t in terms:
        if t.key == K.ROPE_TABLES:      # (an offloaded host copy too)
            t = attrs.evolve(t, nbytes=t.nbytes / 2,
                             formula=t.formula.replace("head_dim", "head_dim/2") + " (gpt-oss: emb = freqs, not doubled)")
        out.append(t)
    o = plan.profile_options
    regime = o.regime
    r = regime.residual
    b, s = plan.microbatch, plan.seq_len
    from ..checkpointing import keeps_everything, whole_layers
    if fused_sinks(kernel_of(plan)):
        n = _mask_kinds(plan.model)
        blocks = -(-s // FLEX_BLOCK)
        out.append(MemoryTerm(component=ACTIVATIONS, label="flex_attention block masks (saved by every layer)",
                              nbytes=n * 4 * b * (blocks * blocks + blocks) * 4, phases=(FORWARD, BACKWARD),
                              formula=f"{n} layer type(s) x 4 x b x (n^2 + n) x 4 B, n = ceil(s / {FLEX_BLOCK}) = "
                                      f"{blocks} (BlockMask's int32 kv/q block counts and indices, full and partial)"))
        return out      # no scores, no additive masks: the eager terms below do not exist
    if whole_layers(plan) and (o.checkpointed_layers is None or o.checkpointed_layers < placement.layers_per_stage):
        n = _mask_kinds(plan.model)
        out.append(MemoryTerm(component=ACTIVATIONS, label="eager attention masks (kept by the checkpointed layers)",
                              nbytes=n * b * s * s * r, phases=(FORWARD, BACKWARD),
                              formula=f"{n} layer type(s) x b x s x s x {r} B (one additive (b, 1, s, s) mask each)"))
    if keeps_everything(plan):
        out += _first_layer_backward(plan, placement, out)
    # (Under autocast the final norm's fp32 output, held until the loss, is model.py's, as for every family.)
    return out


def _megatron_terms(plan, placement, terms) -> list:
    """Megatron-Core's gpt-oss (the regime's layers, ``_megatron_check``: one device, expert and pipeline
    parallelism, no, selective or full recompute)
    outside its layers:
    its rotary table is head_dim wide (``YarnRotaryEmbedding.forward``: ``emb = torch.cat((freqs, freqs))``), so
    the model's term stands; its final norm is Transformer Engine's RMSNorm, costed as every family's under
    this regime (``RMS_NORM``), not transformers' gpt-oss norm; no eager masks, BlockMasks or s x (s + 1)
    scores exist (fused attention). The alltoall dispatcher's held probabilities and routing map
    (``families.megatron_alltoall_held``) and its int64 token counts (``megatron_alltoall_counts_held``, two or
    more experts a rank) are alive in every phase, one set per layer; the permute's row_id_map, a saved part until
    the layer's backward, is held after it (``megatron_alltoall_map_held``: the end of the backward and the
    optimizer step)."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP
    from ..checkpointing import whole_layers
    from ..shapes import shape_of
    shape = shape_of(plan)
    # the rank's tokens: under sequence parallelism (tp > 1, as Megatron-Core requires for an MoE layer) the norms,
    # the router and the dispatcher see the rank's T / tp shard of the sequence (measure_tp.py)
    shards = placement.activation_shards
    T = plan.microbatch * plan.seq_len
    T = T // shards if T % shards == 0 else T / shards
    full = whole_layers(plan)      # (one layer a chunk: _megatron_check refuses the rest)
    # Megatron-Core's block recompute (recompute_method "block", recompute_num_layers n: checkpointed_layers): the
    # stage's first n layers checkpointed, the others keep everything (one stage only: _megatron_check)
    blocks = plan.profile_options.checkpointed_layers if full else None
    if blocks is not None and min(blocks, placement.layers_per_stage) < placement.layers_per_stage:
        if blocks == 0:
            full = False        # (nothing recomputed: every layer keeps everything)
        else:
            return _megatron_block_terms(plan, placement, terms, T, min(blocks, placement.layers_per_stage))
    r = plan.profile_options.regime.residual        # the residual stream's dtype: a layer's input
    layer_input = plan.microbatch * plan.seq_len * shape.hidden * r / shards
    layers = placement.layers_per_stage
    out = _megatron_stage_terms(terms, shape, T, layers)
    # The permute's row_id_map is a saved part until the layer's backward; the dispatcher keeps it after that.
    per_token = megatron_alltoall_map_held(experts=shape.experts)
    if not full:
        out.append(MemoryTerm(
            component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held permutation map (after the backward)",
            nbytes=layers * T * per_token, phases=(BACKWARD_END, OPTIMIZER_STEP),
            formula=f"{layers} layers x T x 4(2E + 1) B (the permute's int32 row_id_map, saved until the layer's "
                    f"backward, then held as reversed_local_input_permutation_mapping until its next forward) = "
                    f"{layers * T * per_token:,} B"))
    else:
        # Under full recompute the no-grad forward saves nothing: every layer's map is held by the dispatcher from
        # its forward on; while a layer is recomputed its (new) map is one of the working set's saved tensors.
        out.append(MemoryTerm(
            component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held permutation map",
            nbytes=layers * T * per_token, phases=(FORWARD, OPTIMIZER_STEP),
            formula=f"{layers} layers x T x 4(2E + 1) B (the permute's int32 row_id_map, held as "
                    f"reversed_local_input_permutation_mapping from the no-grad forward until the recompute "
                    f"replaces it) = {layers * T * per_token:,} B"))
        if layers > 1:
            out.append(MemoryTerm(
                component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held permutation map (the layers "
                                             "not being recomputed)",
                nbytes=(layers - 1) * T * per_token, phases=(BACKWARD, BACKWARD_END),
                formula=f"({layers} - 1) layers x T x 4(2E + 1) B (the recomputed layer's map is in its working "
                        f"set) = {(layers - 1) * T * per_token:,} B"))
    out += _held_token_counts(shape, placement, layers)
    layers_input = layers * layer_input
    if full:
        # Megatron-Core's CheckpointFunction.backward detaches the saved input (detach_variable: a leaf on the
        # same storage) and recomputes the layer; the recompute replaces the dispatcher's held probabilities with
        # tensors whose graph reaches that leaf's AccumulateGrad node, which keeps the leaf and, once
        # torch.autograd.backward has run, its .grad (the input gradient the checkpoint returns) until the
        # layer's next forward replaces them (measured: validation/megatron_gpt_oss/recompute_measurements.json,
        # held_graph). A micro-batch's backward keeps the gradients of the layers above the recomputed one.
        # Every micro-batch's backward recomputes its layers one at a time (CheckpointFunction.backward): the
        # first backward of a stage does it with every in-flight micro-batch's checkpointed inputs alive (the
        # profile's recompute working set is the backward's end only). The same working set as model.layer_terms'
        # (one layer's saved tensors, its output, its MLP's activation gradients), less the input norm's saved
        # input: the checkpoint's saved input (a detached alias, the same storage), counted with those.
        from .. import model
        ctx = model.context(plan, placement)
        lb = model.layer_bytes(plan, ctx)
        mlp_grads = 2 * ctx.tokens * max(shape.top_k, 1) * shape.ffn * ctx.regime.compute
        work = (lb.saved + lb.output + mlp_grads) / ctx.shards - layer_input
        out.append(MemoryTerm(
            component=ACTIVATIONS, label="recompute working set in a micro-batch's backward (one layer)",
            nbytes=work, phases=(BACKWARD,),
            formula=f"the recompute working set ({(lb.saved + lb.output + mlp_grads) / ctx.shards:,.0f} B) less the "
                    f"layer's input its input norm saves ({layer_input:,.0f} B, the checkpoint's: counted with the "
                    f"checkpointed inputs) = {work:,.0f} B"))
        if layers > 1:
            grads = (layers - 1) * layer_input
            out.append(MemoryTerm(
                component=ACTIVATIONS, label="recomputed layers' input gradients held by the dispatcher's "
                                             "probabilities (in a micro-batch's backward)",
                nbytes=grads, phases=(BACKWARD,),
                formula=f"({layers} - 1) layers above the recomputed one x T x h x {r} B (each detached input's "
                        f".grad, its AccumulateGrad node reached by the recomputed probabilities' graph) = "
                        f"{grads:,.0f} B"))
            # The backward's end: layer 0's recompute (the last micro-batch's), with that micro-batch's L inputs
            # and the L - 1 upper layers' input gradients alive; layer 0's input is in the working set's saved
            # tensors (its input norm's), counted there.
            end = (2 * layers - 2) * layer_input
            out.append(MemoryTerm(
                component=ACTIVATIONS, label="checkpointed inputs and input gradients held by the dispatcher's "
                                             "probabilities (at the first layer's recompute)",
                nbytes=end, phases=(BACKWARD_END,),
                formula=f"({layers} - 1) layers' inputs + ({layers} - 1) input gradients x T x h x {r} B (the first "
                        f"layer's input is the working set's) = {end:,.0f} B"))
        held = 2 * layers_input
        out.append(MemoryTerm(
            component=ACTIVATIONS, label="checkpointed inputs and their gradients held by the dispatcher's "
                                         "probabilities (after the backward)",
            nbytes=held, phases=(OPTIMIZER_STEP,),
            formula=f"{layers} layers x 2 x T x h x {r} B (the last micro-batch's detached input of each layer and "
                    f"its .grad, reached by the recomputed probabilities' graph; alive until the layer's next "
                    f"forward) = {held:,.0f} B"))
    rank = plan.rank
    if rank is not None and not rank.first and not full:    # (under full recompute: the first layer's input)
        # A later pipeline stage's input is the receive buffer P2PCommunicator._communicate allocates (a leaf,
        # requires_grad=True; megatron/core/pipeline_parallel/p2p_communication.py at MEGATRON_LM). Its
        # AccumulateGrad node is reachable from the held probabilities' graph, so the last micro-batch's buffer
        # outlives its backward until the next iteration's forward replaces them (measured:
        # validation/megatron_gpt_oss/pp_measurements.json, held_input_after). Before its backward it is the
        # first layer's saved input, counted there.
        r = plan.profile_options.regime.residual        # the residual stream's dtype: what a stage sends
        nbytes = T * shape.hidden * r
        out.append(MemoryTerm(
            component=ACTIVATIONS, label="pipeline receive buffer held by the dispatcher's probabilities (after "
                                         "the backward)",
            nbytes=nbytes, phases=(BACKWARD_END, OPTIMIZER_STEP),
            formula=f"T x h x {r} B (the last micro-batch's stage input, a leaf the held probabilities' graph "
                    f"reaches; alive until the next forward) = {nbytes:,} B"))
    return out


def _megatron_stage_terms(terms, shape, T, layers: int) -> list:
    """The stage's terms with the final norm costed as Megatron-Core's RMSNorm, and the alltoall dispatcher's routing
    probabilities and map each layer holds until its next forward."""
    out = []
    for t in terms:
        if t.key == K.FINAL_NORM:
            final, how = RMS_NORM.final_saved("bf16", 2, T, shape.hidden)
            t = attrs.evolve(t, nbytes=final, formula=f"{how} = {final:,} B (Megatron-Core: costed as RMSNorm)")
        out.append(t)
    held = megatron_alltoall_held(experts=shape.experts)
    out.append(MemoryTerm(
        component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held routing probabilities and map",
        nbytes=layers * T * held, phases=PHASES,
        formula=f"{layers} layers x T x 3E B (bf16 probs + bool map, [T, E] each; held until the layer's next "
                f"forward) = {layers * T * held:,} B"))
    return out


def _held_token_counts(shape, placement, layers: int) -> list[MemoryTerm]:
    """The alltoall dispatcher's int64 tokens per local expert, held by each layer until its next forward."""
    local = shape.experts // placement.expert_shards
    counts = megatron_alltoall_counts_held(experts=shape.experts, local_experts=local)
    return [MemoryTerm(
        component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held token counts (int64)",
        nbytes=layers * counts, phases=PHASES,
        formula=f"{layers} layers x 8E B (num_global_tokens_per_local_expert, {local} experts a rank; held "
                f"until the layer's next forward) = {layers * counts:,} B")] if counts else []


def _megatron_block_terms(plan, placement, terms, T, n) -> list:
    """``_megatron_terms`` under Megatron-Core's block recompute (``recompute_method="block"``,
    ``recompute_num_layers`` n, one stage): the first n layers of the stage run through ``CheckpointFunction``, the
    L - n above them keep everything (the generic terms: ``checkpointing.whole_layer_terms`` with
    ``checkpointed_layers``). The backward runs the kept layers first, then recomputes the checkpointed ones one at a
    time, layer n - 1 first. Measured (validation/megatron_gpt_oss/measure_tp.py, ``*-block*`` runs, tp 1 and 2):

    * the dispatcher's held probabilities, routing map and token counts: every layer, every phase;
    * the permutation map: a kept layer's is a saved part until its backward, then held (the backward's end, the
      optimizer step); a checkpointed layer's is held from its no-grad forward on, its recompute's new map one of the
      working set's saved tensors (n - 1 held at the bottom layer's recompute);
    * at the bottom layer's recompute (the backward's end): the n - 1 checkpointed inputs above it and the gradients
      their graphs keep (n - 1), or with one checkpointed layer the gradient it receives from the kept layers (1);
    * after the backward: each checkpointed layer's detached input and its gradient (2n x T x h x 2 B), kept by the
      recomputed probabilities' graph; a kept layer's graph keeps no input of its own (its input is no leaf)."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP
    from ..shapes import shape_of
    shape = shape_of(plan)
    layers = placement.layers_per_stage
    kept = layers - n
    r = plan.profile_options.regime.residual
    X = plan.microbatch * plan.seq_len * shape.hidden * r / placement.activation_shards
    out = _megatron_stage_terms(terms, shape, T, layers)
    per_token = megatron_alltoall_map_held(experts=shape.experts)
    out.append(MemoryTerm(
        component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held permutation map (the layers kept, "
                                     "after their backward)",
        nbytes=kept * T * per_token, phases=(BACKWARD_END, OPTIMIZER_STEP),
        formula=f"{kept} layers x T x 4(2E + 1) B (the permute's int32 row_id_map, saved until the layer's backward, "
                f"then held until its next forward) = {kept * T * per_token:,} B"))
    out.append(MemoryTerm(
        component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held permutation map (the checkpointed "
                                     "layers)",
        nbytes=n * T * per_token, phases=(FORWARD, BACKWARD, OPTIMIZER_STEP),
        formula=f"{n} layers x T x 4(2E + 1) B (held from the no-grad forward until the recompute replaces it) = "
                f"{n * T * per_token:,} B"))
    if n > 1:
        out.append(MemoryTerm(
            component=ACTIVATIONS, label="Megatron-Core alltoall dispatcher's held permutation map (the checkpointed "
                                         "layers not being recomputed)",
            nbytes=(n - 1) * T * per_token, phases=(BACKWARD_END,),
            formula=f"({n} - 1) layers x T x 4(2E + 1) B (the recomputed layer's map is in its working set) = "
                    f"{(n - 1) * T * per_token:,} B"))
    out += _held_token_counts(shape, placement, layers)
    grads = max(n - 1, 1)
    end = (n - 1 + grads) * X
    out.append(MemoryTerm(
        component=ACTIVATIONS, label="checkpointed inputs and input gradients held by the dispatcher's probabilities "
                                     "(at the first layer's recompute)",
        nbytes=end, phases=(BACKWARD_END,),
        formula=f"({n} - 1) checkpointed inputs above the first layer + {grads} input gradient{'s' * (grads > 1)} "
                f"(those the graphs of the checkpointed layers above keep, or the one the kept layers pass down) x T x "
                f"h x {r} B = {end:,.0f} B"))
    after = 2 * n * X
    out.append(MemoryTerm(
        component=ACTIVATIONS, label="checkpointed inputs and their gradients held by the dispatcher's "
                                     "probabilities (after the backward)",
        nbytes=after, phases=(OPTIMIZER_STEP,),
        formula=f"{n} checkpointed layers x 2 x T x h x {r} B (each one's detached input and its .grad, reached by "
                f"the recomputed probabilities' graph; alive until the layer's next forward) = {after:,.0f} B"))
    return out


def _first_layer_backward(plan, placement, terms) -> list:
    """The backward's other high point: the first layer's ``max`` backward, with every later gradient
    alive. The end-of-backward terms (``terms``' end-only ones: the embedding's gradient being
    computed, the embedding output's) do not exist yet then; the first layer still holds what its
    attention's backward reads (the input norm, q and the repeated k, the max indices), and three
    b x a x s x (s + 1) tensors coexist: softmax's input gradient (waiting for the cat's backward),
    the zeros ``max``'s backward scatters into, and the scatter's output. Counted as what this moment
    adds over the end of the backward (the phase is the larger of the two)."""
    from mlsysim_core.terms import BACKWARD, BACKWARD_END
    from ..model import _regime_kind
    from ..shapes import shape_of
    shape = shape_of(plan)
    kind = _regime_kind(plan.profile_options.regime)
    c = 4 if kind == "fp32" else 2
    a, q, s = shape.heads, shape.q_dim, plan.seq_len
    cast = 2 * 2 * q if kind == "amp-bf16" else 2 * c * q            # q and repeated k (AMP: their bf16 casts)
    scores = 4 if kind == "amp-bf16" else c                          # the logits + sink are fp32 under AMP
    per_token = _norm_bytes(kind, shape.hidden) + cast + 8 * a + 3 * scores * a * (s + 1)
    working = per_token * plan.microbatch * s / placement.activation_shards
    end = sum(t.nbytes for t in terms if BACKWARD_END in t.phases and BACKWARD not in t.phases)   # end-only
    extra = working - end
    if extra <= 0:
        return []
    return [MemoryTerm(component=ACTIVATIONS, label="first layer's attention backward (over the backward's end)",
                       nbytes=extra, phases=(BACKWARD_END,),
                       formula=f"T x (input norm + q, k + max indices 8a + 3 x {scores} x a x (s + 1)) = {working:,.0f} B, "
                               f"less the end-of-backward terms it precedes ({end:,.0f} B)")]


# --- the run ----------------------------------------------------------------------------------------------

def _quantization(model):
    q = (getattr(model, "details", None) or {}).get("quantization_config")
    if isinstance(q, dict) and str(q.get("quant_method", "")).lower() == "mxfp4":
        return q
    return None


def fused_sinks(kernel) -> bool:
    """Does ``kernel`` run gpt-oss's attention fused, the sinks through its log-sum-exp (what it declares:
    ``computes == "flex"`` and ``sinks == "lse"``, never its name)? Then no scores and no additive masks
    exist (``flex_sinks``, ``adjust_terms``)."""
    return kernel.computes == COMPUTES_FLEX and kernel.sinks == SINKS_THROUGH_LSE


def check(plan) -> tuple[str, ...]:
    """Refuse what transformers cannot run or the profile has not measured; say what the MXFP4
    checkpoint means for training."""
    o = plan.profile_options
    kernel = kernel_of(plan)
    name = kernel.name
    own = any(layout == LAYOUT for layout, _ in kernel.layouts)   # a kernel that knows sinks
    notes = []
    if getattr(o.regime, "main_grad", 0):
        return _megatron_check(plan, kernel)
    if kernel.computes == COMPUTES_FLEX and not own and not fused_sinks(kernel):
        raise NotModelledError(
            "attention", name, "a flex_attention kernel that declares sinks='lse' for a gpt-oss model",
            f"kernel {name!r} computes flex_attention but declares no support for attention sinks "
            f"(sinks={kernel.sinks!r}): gpt-oss's sinks need the log-sum-exp renormalisation")
    if own or fused_sinks(kernel):    # (flex with sinks: fp32, bf16 and autocast measured, measure_flex_sinks.py)
        pass
    elif kernel.sdpa:     # what the kernel declares it computes, not its name
        notes.append(
            "gpt-oss has no SDPA attention in transformers 5.23 (GptOssPreTrainedModel._supports_sdpa = False: SDPA "
            "has no attention sinks; attn_implementation='sdpa' raises, the default falls back to eager): costed as "
            "eager attention, with its s x (s + 1) scores (the hub's flash-attention kernels with sinks keep no scores "
            "and are not modelled)")
    elif not kernel.eager:
        raise NotModelledError(
            "attention", name, "'eager' (or 'sdpa', costed as the eager attention transformers falls back to) for a "
            "gpt-oss model",
            f"kernel {name!r} has no formula for gpt-oss's attention with sinks ({LAYOUT!r}); transformers 5.23 runs "
            "gpt-oss with eager, flex_attention or the hub's flash-attention kernels, of which eager and "
            "flex_attention (a kernel declaring computes='flex', sinks='lse') are modelled")
    regime = o.regime
    q = _quantization(plan.model)
    if q is not None:
        if regime.weight < 2:
            raise NotModelledError(
                "regime", regime.name, "a regime with 16- or 32-bit weights for a gpt-oss MXFP4 checkpoint",
                "gpt-oss ships its experts in MXFP4 (quantization_config quant_method 'mxfp4') for inference; "
                "transformers has no MXFP4 training: it trains on weights dequantized to bf16 "
                "(Mxfp4Config(dequantize=True)). Cost that with regime='bf16' (or amp-bf16, fp32)")
        notes.append(
            f"gpt-oss's quantization_config (quant_method 'mxfp4') is for inference: training runs on weights "
            f"dequantized to bf16 (transformers: Mxfp4Config(dequantize=True)); the weights, gradients and optimizer "
            f"state are costed as regime {regime.name!r} says ({regime.weight:g} B per weight), not as MXFP4")
    if plan.tp_size * plan.cp_size * plan.pp_size * plan.ep_size > 1:
        notes.append("approximation: gpt-oss under model parallelism splits its saved tensors as Mixtral's (attention "
                     "per head, experts per expert-parallel rank, the router and norms replicated); validated on one "
                     "device only (validation/families/gpt_oss)")
    return tuple(notes)


def _every_layer_checkpointed(plan) -> bool:
    """Every layer of the stage recomputed, one a chunk (Megatron-Core's ``recompute_method="uniform"`` with
    ``recompute_num_layers=1``): no ``checkpointed_layers`` (block recompute) given."""
    return plan.profile_options.checkpointed_layers is None


def _megatron_check(plan, kernel) -> tuple[str, ...]:
    """gpt-oss under the Megatron-Core regime: what was derived and measured is Megatron-Bridge's gpt-oss recipe
    on one device and on one rank of an expert-parallel group with two or more local experts
    (``families.megatron_clamped_glu_moe``); everything else is refused by name."""
    o = plan.profile_options
    regime = o.regime.name
    if not kernel.sdpa:
        raise NotModelledError(
            "attention", kernel.name, "a kernel declaring computes='sdpa' (Transformer Engine's fused attention, "
            "as Megatron-Core runs gpt-oss) for a gpt-oss model under the Megatron-Core regime",
            "Megatron-Core's unfused attention with learnable softmax offsets and flex_attention are not derived "
            "for gpt-oss")
    if plan.cp_size > 1:
        raise NotModelledError(
            "cp_size", plan.cp_size, f"1 for gpt-oss under {regime!r} (data, tensor, expert and pipeline "
            "parallelism allowed)",
            "Megatron-Core's gpt-oss layer was measured on one device, under tensor parallelism with sequence "
            "parallelism, on one rank of an expert-parallel group and on the stages of a 1F1B pipeline "
            "(validation/megatron_gpt_oss): context parallelism (the a2a exchange the recipes set, cp_comm_type "
            "'a2a', with learnable softmax offsets) is not derived")
    if plan.tp_size > 1:
        if not plan.sequence_parallel:
            raise NotModelledError(
                "sequence_parallel", False, f"True with tp_size > 1 for gpt-oss under {regime!r}",
                f"tp_size={plan.tp_size}: Megatron-Core refuses to train an MoE layer under tensor parallelism "
                "without sequence parallelism (MoELayer.forward raises ValueError); Megatron-Bridge's gpt-oss "
                "recipes with tp > 1 set sequence_parallel True")
        if o.expert_tp_size != 1:
            raise NotModelledError(
                "expert_tp_size", o.expert_tp_size, f"1 with tp_size > 1 for gpt-oss under {regime!r}",
                f"tp_size={plan.tp_size}: Megatron-Bridge's gpt-oss recipes set expert_tensor_parallel_size 1 "
                "(measured: validation/megatron_gpt_oss/measure_tp.py); Megatron-Core's default (None: the "
                "tensor-parallel size) all-gathers the tokens over the expert-tensor-parallel group and splits "
                "each expert (TEGroupedMLP's tensor-parallel split), which was not derived")
    schedule = o.pipeline_schedule
    if plan.pp_size > 1 and getattr(schedule, "chunked", False):
        raise NotModelledError(
            "pipeline_schedule", schedule.name, f"a schedule with one model chunk per stage (chunked=False) for "
                                                f"gpt-oss under {regime!r}",
            f"pp_size={plan.pp_size}: a non-first model chunk on a stage receives its input, which the held "
            "probabilities' graph keeps after the backward (one receive buffer per such chunk): measured only with "
            "one chunk a stage (validation/megatron_gpt_oss/measure_pp.py runs 1F1B)")
    experts, ep = plan.model.experts, plan.ep_size
    if ep > 1 and experts // ep == 1:
        raise NotModelledError(
            "ep_size", ep, f"a divisor of the {experts} experts below {experts} (two or more experts on a rank) for "
                           f"gpt-oss under {regime!r}",
            "with one local expert Megatron-Core's alltoall dispatcher skips both chunk sorts "
            "(num_local_experts > 1 in dispatch_postprocess / combine_preprocess): measured "
            "(validation/megatron_gpt_oss) but not in the layer's parts, which assume the sorts")
    if (o.expert_tp_size or 1) > 1:
        raise NotModelledError("expert_tp_size", o.expert_tp_size, f"1 for gpt-oss under {regime!r}",
                               "Megatron-Bridge's gpt-oss recipes set expert_tensor_parallel_size 1; the experts' "
                               "tensor-parallel split of TEGroupedMLP was not derived")
    from ..checkpointing import PART, keeps_everything, spec_of, whole_layers
    spec = spec_of(plan)
    # Selective recompute (Korthikanti's: the attention core) drops only the parts marked
    # recomputed_by_selective, of which the fused attention and the MoE layer have none: it keeps what 'none'
    # keeps. Allowed as declared: a partial recompute that reruns no layer's first part (recomputes_first_layer
    # None); whole layers (every layer, one a chunk, or the first checkpointed_layers of the stage: Megatron-Core's
    # block recompute, one stage); every k-th layer and the other policies are refused.
    if not (keeps_everything(plan) or (spec.recomputes == PART and spec.recomputes_first_layer is None)
            or whole_layers(plan)):
        raise NotModelledError(
            "activation_checkpointing", spec.name,
            f"'none', 'selective' or 'full' (every layer, or the first checkpointed_layers) for gpt-oss under "
            f"{regime!r} (selective recomputes nothing with fused attention; full is Megatron-Core's "
            "recompute_granularity 'full', method 'uniform' with one layer a chunk, or with checkpointed_layers its "
            "method 'block')",
            "Megatron-Core has no every k-th layer recompute; its uniform method with more than one layer a chunk was "
            "not measured (its selective recompute_modules moe_act and layernorm are: 'selective' with "
            "plugin_options {'selective': {'modules': [...]}})")
    if whole_layers(plan) and not _every_layer_checkpointed(plan) and plan.pp_size > 1:
        raise NotModelledError(
            "checkpointed_layers", o.checkpointed_layers, f"None (every layer) with pp_size > 1 for gpt-oss under "
                                                          f"{regime!r}",
            f"pp_size={plan.pp_size}: Megatron-Core's block recompute was measured on one stage "
            "(validation/megatron_gpt_oss/measure_tp.py): under 1F1B a micro-batch's recompute runs with the other "
            "in-flight micro-batches' kept layers alive, which was not derived")
    if o.dropout:
        raise NotModelledError("dropout", o.dropout, f"0.0 for gpt-oss under {regime!r}",
                               "gpt-oss's recipes set hidden_dropout 0 and attention_dropout 0; dropout masks in its "
                               "MoE layer were not derived")
    if o.moe_capacity_factor is not None:
        raise NotModelledError("moe_capacity_factor", o.moe_capacity_factor,
                               f"None (dropless) for gpt-oss under {regime!r}",
                               "Megatron-Bridge's gpt-oss recipes route dropless; token dropping and padding to "
                               "capacity were not derived for its MoE layer")
    if getattr(o, "float8", None):
        raise NotModelledError("float8", o.float8, f"none for gpt-oss under {regime!r}",
                               "Transformer Engine's FP8 grouped GEMMs and the fp8 activation store "
                               "(activation_func_fp8_input_store) were not derived for gpt-oss's MoE layer")
    notes = [
        "Megatron-Core gpt-oss as Megatron-Bridge's recipes configure it (TEGroupedMLP with biases, the quick-GELU "
        "GLU clamped at 7 with glu_linear_offset 1 under bias_activation_fusion, the alltoall dispatcher with "
        f"moe_permute_fusion, the unfused router in bf16; {MEGATRON_LM}): the MoE layer's saved tensors and the "
        "dispatcher's held probabilities, routing map, permutation map and token counts measured to the byte "
        "(validation/megatron_gpt_oss); the "
        "attention is Transformer Engine's fused attention with learnable softmax offsets, derived from its "
        "source (q, k, v, the output and the fp32 softmax statistics kept, the sinks a parameter), not measured; "
        "not counted: the activation's bf16 offset scalar and TE's rng state (2 + 16 B a layer)"]
    if ep > 1:
        notes.append(
            f"Megatron-Core gpt-oss under expert parallelism (ep {ep}, {experts // ep} experts a rank; measured on one "
            "rank of an expert-parallel group, validation/megatron_gpt_oss): the router, the permute's row_id_map and "
            "the dispatcher's held [T, E] probabilities and map cover all the rank's tokens and every expert; the "
            "permuted probabilities, the two chunk sorts' maps and the experts' tensors are per routed copy the rank "
            "receives (T x k balanced; moe_routing_imbalance sets the busiest rank's load); the all-to-all's send and "
            "receive buffers are the profile's generic transient term (not measured)")
    if plan.tp_size > 1:
        notes.append(
            f"Megatron-Core gpt-oss under tensor parallelism with sequence parallelism (tp {plan.tp_size}, "
            "expert_tensor_parallel_size 1, as Megatron-Bridge's gpt-oss 20B H100 recipe sets them; one layer measured "
            "on rank 0 of a group of 2 with Megatron-Core's sequence-parallel linear and reduce-scatter, "
            "validation/megatron_gpt_oss/measure_tp.py, without recompute, under full and block recompute, with "
            "the recompute modules layernorm and moe_act and on 1F1B stages): every saved "
            "and held tensor is the rank's share, T / tp tokens of the "
            "norms, the column-parallel input, the router, the dispatcher and the experts, the rank's heads of q, k, v, "
            "the sinks and the softmax statistics; not counted: the local (TE-free) layer spec's GlobalMemoryBuffer "
            "'mpu' all-gather buffer (T x h x 2 B, alive from the first forward; Transformer Engine's linears, which "
            "the recipes run, gather into their own transient buffer); the attention is TE's fused attention, derived "
            "(a stand-in in the measurement)")
    if whole_layers(plan) and _every_layer_checkpointed(plan):
        notes.append(
            "Megatron-Core gpt-oss under full recompute (recompute_granularity 'full', method 'uniform', one layer a "
            "chunk: tensor_parallel.checkpoint's CheckpointFunction saves the layer's input; measured on one device "
            "and on 1F1B stages, validation/megatron_gpt_oss/measure_recompute.py): each micro-batch's backward "
            "recomputes one layer at a time; the recompute's held probabilities reach the detached input's "
            "AccumulateGrad node, so each layer's input and its gradient stay alive after its backward until its "
            "next forward (L x 2 x T x h x 2 B after the backward); the recomputed attention is derived, not "
            "measured")
    if whole_layers(plan) and not _every_layer_checkpointed(plan):
        notes.append(
            f"Megatron-Core gpt-oss under block recompute (recompute_method 'block', recompute_num_layers "
            f"{o.checkpointed_layers}: the stage's first layers checkpointed, the others keep everything; measured on "
            "one stage at tp 1 and 2, validation/megatron_gpt_oss/measure_tp.py): the kept layers' backward runs "
            "first, the checkpointed layers are recomputed at the backward's end with the gradient the kept layers "
            "pass down; each checkpointed layer's input and its gradient stay alive after the backward")
    if plan.pp_size > 1:
        notes.append(
            f"Megatron-Core gpt-oss under pipeline parallelism (pp {plan.pp_size}): a stage's MoE layers under "
            "1F1B (forward_backward_pipelining_without_interleaving) measured on a first, middle and last stage "
            "(validation/megatron_gpt_oss/measure_pp.py; at tp 2 a first and a last stage, measure_tp.py; another "
            "schedule with one model chunk a stage is priced "
            "by the micro-batches in flight it declares): min(p - stage, m) micro-batches' saved tensors, the "
            "dispatcher's held tensors once a layer (the latest forward's), a later stage's last receive buffer "
            "held after the backward by their graph; the attention, the embedding and the LM head and loss "
            "of the first and last stages are the profile's terms, not measured under pipelining; not counted: "
            "the 2 B each pseudo-freed output (deallocate_output_tensor) keeps")
    if _quantization(plan.model) is not None:
        notes.append("gpt-oss's quantization_config (quant_method 'mxfp4') is for inference: Megatron-Bridge loads "
                     "the checkpoint dequantized; the weights are costed as the regime says, not as MXFP4")
    return tuple(notes)


def assumptions(model) -> tuple[str, ...]:
    details = getattr(model, "details", None) or {}
    out = []
    if "attention_bias" not in details:
        out.append("q/k/v/o biases assumed (gpt-oss's attention_bias = true; model.details has no attention_bias)")
    return tuple(out)


GPT_OSS = ArchitectureFamily(
    name="gpt_oss", label="gpt-oss",
    description="gpt-oss: GQA attention with biases and learned sinks (eager), alternating sliding-window and full "
                "layers, YaRN rotary, RMSNorm, a biased router and biased experts with a clamped SwiGLU "
                "(transformers' grouped_mm) (validated against PyTorch's MemTracker: validation/families/gpt_oss)",
    architectures=(ARCHITECTURE,), sparse=True, gated_mlp=True, norm=GPT_OSS_NORM, layer_norms=2,
    positions="rotary", attention_layout=LAYOUT, attention_layouts={"eager": eager_sinks, "sdpa": eager_sinks, "flex": flex_sinks},
    layer_weights=gpt_oss_weights, parameter_tensors=parameter_tensors, matrix_shapes=matrix_shapes,
    layer=gpt_oss_layer, megatron_mlp=megatron_mlp, megatron_recompute_modules=megatron_clamped_glu_moe_recomputed,
    lora_layer=None, assumptions=assumptions,
    count_parameters=count_parameters, check=check, adjust_terms=adjust_terms,
    lora_excluded={"mlp.router": "GptOssTopKRouter holds its weight as a Parameter (F.linear), not an nn.Linear: "
                                 "peft's target_modules does not adapt it"})


# --- under LoRA: what each part is made of (lora.generic_layer reads it) ------------------------------

_QKV = ("q_proj", "k_proj", "v_proj")


def _lora_tagged(layer):
    """The gpt-oss layer with its parts split for LoRA, bytes unchanged (the ops of the module docstring,
    with the router and the experts frozen): a norm keeps its fp32 normalized x only for its weight's
    gradient (4h) and its output for the next linears' (fp32 4h, bf16 2h; AMP: their casts): q/k/v after
    the input norm, the router after the post-attention norm (the experts' gather needs no input); the
    router's input cast (AMP) is its weight's; of the experts' ce x k x (2h + 7f) the gathered input (h,
    gate_up's weight) and the product (f, down's weight) go, the gate_up output, the clamped SwiGLU's four
    f-wide tensors and the down output (the routing weights' gradient) stay; the contiguous attention
    output is o_proj's input."""
    def tagged(**kw):
        lb = layer(**kw)
        regime, h, T, f, k = kw["regime"], kw["hidden"], kw["tokens"], kw["ffn"], kw["top_k"]
        ce = 2 if regime == "bf16" else 4

        def norm(p, readers):
            out = 0 if regime == "amp-bf16" else (4 if regime == "fp32" else 2) * h * T
            parts = [attrs.evolve(p, nbytes=p.nbytes - 4 * h * T - out),
                     Part("normalized (its weight's)", 4 * h * T, weight_gradient_only=True)]
            if out:
                parts.append(Part("output", out, weight_gradient_only=True, inputs_of=readers))
            return tuple(parts)

        def split(p):
            n = p.name
            if n == "input norm":
                return norm(p, _QKV)
            if n == "post-attention norm":
                return norm(p, ("router",))
            if n == "q/k/v input casts":
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=_QKV),)
            if n.startswith("router (") and regime == "amp-bf16":
                return (attrs.evolve(p, nbytes=p.nbytes - 2 * h * T),
                        Part("router input cast (its weight's)", 2 * h * T, weight_gradient_only=True,
                             inputs_of=("router",)))
            if n.startswith("experts ("):
                return (attrs.evolve(p, nbytes=p.nbytes - ce * k * (h + f) * T),
                        Part("experts' gathered input and product (their weights')", ce * k * (h + f) * T,
                             weight_gradient_only=True, split=EXPERTS))
            if p.weight_gradient_only:
                return (attrs.evolve(p, inputs_of=("o_proj",)),)
            return ()
        return attrs.evolve(lb, parts=tuple(attrs.evolve(p, lora=split(p)) for p in lb.parts))
    return tagged


GPT_OSS = attrs.evolve(GPT_OSS, layer=_lora_tagged(GPT_OSS.layer))

FAMILIES = (GPT_OSS,)
