"""The Gemma families: Gemma 1 (``gemma``), Gemma 2 (``gemma2``) and the Gemma 3 text model
(``gemma3_text``, transformers' Gemma3ForCausalLM), as transformers 5.23 builds them and PyTorch
2.13 keeps them alive (derived op by op below, checked against MemTracker:
``validation/families/gemma``).

What differs from a Llama layer (``layers.py``), per token (h hidden, q = heads x head_dim, kv =
kv_heads x head_dim, f MLP width, a heads, S = a x s scores, c compute bytes):

* GemmaRMSNorm (``modeling_gemma.GemmaRMSNorm.forward``): ``out = x.float() * rsqrt(mean(x.float()**2)
  + eps)``; ``out = out * (1.0 + w.float())``; ``out.type_as(x)``. ``pow`` and the first ``mul`` save
  ``x.float()`` (the input itself in fp32; a new fp32 copy, 4h, of a 16-bit input), the first ``mul``
  the rsqrt (4); the second ``mul`` saves the fp32 normalized x (4h, always fp32, unlike Llama's
  cast-then-scale) and ``1 + w`` (4h per norm and layer, not per token). The output is the input's
  dtype: saved by the next linear in fp32 (4h) and bf16 (2h); under AMP the linears save their own
  bf16 casts. So bf16 keeps 2h more per norm than Llama (10h + 4).
* Gemma 2 and 3 have four norms per layer (``Gemma2DecoderLayer.forward``): input and pre-feedforward
  norms on the residual stream (as above), post-attention and post-feedforward norms on the o_proj and
  down_proj outputs. The latter two save an fp32 input (o_proj's fp32 output itself, or a 4h fp32 copy
  of a bf16 one), the normalized x and the rsqrt: 8h + 4 in every regime; their output only feeds the
  residual add (saves nothing) and dies.
* GeGLU ``down(gelu_tanh(gate(x)) * up(x))`` (``activations.GELUTanh``: ``F.gelu(approximate="tanh")``
  saves its input) keeps what SwiGLU keeps: gate, gelu and up outputs, the product: 4cf.
* The embedding's ``* embed_scale`` (sqrt(hidden), ``GemmaTextScaledWordEmbedding.forward``): a
  multiply by a buffer that needs no gradient saves nothing; its output is the residual stream (what
  the first norm saves, as Llama's embedding output). The 0-d buffer is counted with the weights.
* Gemma 3's QK-norm (``Gemma3Attention.forward``: q_norm, k_norm over head_dim before rotary): each a
  GemmaRMSNorm on (b, heads, s, head_dim): the fp32 input (4q; 4kv), the normalized x (4q; 4kv), the
  rsqrt (4a; 4 kv_heads); the rotary multiply then saves only cos/sin. Two ``1 + w`` of head_dim.
* Gemma 3's two rotary embeddings (``Gemma3RotaryEmbedding``: one per layer type): two inv_freq pairs
  of buffers and two cos/sin tables (the profile counts one of each; the family adds the second).
* Sliding windows: under SDPA transformers builds a (b, 1, s, s) bool mask for the sliding layers once
  s >= window (``masking_utils._ignore_causal_mask_sdpa``), and with a mask ``sdpa_attention_forward``
  does not pass ``enable_gqa`` (``use_gqa_in_sdpa`` needs no mask on CUDA and CPU alike): k and v are
  repeated to every head (a x head_dim each, saved by the kernel instead of k and v). The full layers
  pass no mask and keep k, v at kv_heads. PyTorch's CPU runs the flash kernel with the mask
  (``_scaled_dot_product_flash_attention_for_cpu``), which saves it: b s^2 bytes, shared by the layers.
  The layer is the MEAN layer over the model's layers (layers x mean = the exact sum).
  Eager attention builds full (b, 1, s, s) additive masks for every layer type: windows save nothing.
* Gemma 2 attention logit soft-capping (``eager_attention_forward``: scores / cap, tanh, * cap) keeps
  the tanh output (cS) besides eager's scores. transformers 5.23 has no SDPA path for Gemma 2
  (``Gemma2PreTrainedModel._supports_sdpa = False``: ``attn_implementation="sdpa"`` raises; the default
  falls back to eager); the family costs eager attention under either kernel name, with a note.
  Gemma 3 does not pass its ``attn_logit_softcapping`` to the attention: no tanh.
* Final logit soft-capping (``Gemma2ForCausalLM.forward``: logits / cap, tanh, * cap) keeps the tanh
  output (c T V) through the backward, beside the capped logits the loss reads.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from mlsysim_core.errors import InvalidInputError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, FORWARD, HOST, WEIGHTS, MemoryTerm

from ..families import ArchitectureFamily, LayerWeight, Norm, _rms_lora_final
from .. import term_keys as K
from ..kernels import EAGER, SEPARATE_QKV, kernel_of
from ..layers import REPLICATED, LayerBytes, Part, LayerWalk, megatron_gated_mlp

SAVED = (FORWARD, BACKWARD)
GEMMA2_EAGER = "gemma2-eager"     # Gemma 2's own layout: eager attention whatever the kernel's name

# Documented defaults (transformers 5.23's configuration_gemma2 / configuration_gemma3) for a model
# whose details do not say (a catalog entry rather than an imported config.json).
DEFAULTS = {
    "gemma2": {"attn_logit_softcapping": 50.0, "final_logit_softcapping": 30.0, "sliding_window": 4096},
    "gemma3_text": {"attn_logit_softcapping": None, "final_logit_softcapping": None, "sliding_window": 4096},
}


def _details(model) -> Mapping:
    return getattr(model, "details", None) or {}


def _arch(model) -> str:
    return (model.architecture or "").lower()


def _imported(model) -> bool:
    """Were the details read from a config (``mlsysim_core.hf``: they hold its model_type)? Then a
    fact they leave out is the config's null / default, not unknown."""
    return "model_type" in _details(model)


def _fact(model, key):
    """A config fact from ``model.details``; absent from an imported config's details: None (the
    details keep only what differs from its default); absent otherwise (a catalog entry): the
    architecture's documented default (``assumptions`` says so)."""
    d = _details(model)
    if key in d:
        return d[key]
    return None if _imported(model) else DEFAULTS.get(_arch(model), {}).get(key)


def _sliding_layers(model) -> int:
    """Sliding-window layers: from details, else the default pattern (Gemma 2: every other layer
    from the first; Gemma 3: five of every six)."""
    d = _details(model)
    if "sliding_window_layers" in d:
        return int(d["sliding_window_layers"] or 0)
    if "layer_types" in d:
        return sum(1 for t in d["layer_types"] if t == "sliding_attention")
    if _imported(model):
        return 0
    L, arch = model.layers, _arch(model)
    if arch == "gemma2":
        return (L + 1) // 2
    if arch == "gemma3_text":
        return sum(1 for i in range(L) if (i + 1) % 6)
    return 0


# --- the norm -----------------------------------------------------------------------------------

def _norm_bytes(kind: str, h: int, *, input_saved: bool, output_saved: bool) -> int:
    """One GemmaRMSNorm on a width-h tensor, per token: the fp32 input when it is a new copy
    (``input_saved``: a 16-bit input, or an fp32 input nobody else keeps), the fp32 normalized x,
    the rsqrt, and the output when the next linear saves it (fp32 4h, bf16 2h; AMP: casts)."""
    out = 4 * h + 4 + (4 * h if input_saved else 0)
    if output_saved and kind != "amp-bf16":
        out += (4 if kind == "fp32" else 2) * h
    return out


def _final_saved(kind, c, T, h):
    # The residual input is the last layer's output (fp32/AMP: counted with the layers); bf16 adds
    # its fp32 copy. The LM head saves the output (fp32, bf16) or its autocast cast (2h).
    per_token = {"fp32": 8 * h + 4, "bf16": 10 * h + 4, "amp-bf16": 6 * h + 4}[kind]
    how = {"fp32": "normalized + output (fp32) + rsqrt", "bf16": "fp32 copy + fp32 normalized + bf16 output + rsqrt",
           "amp-bf16": "normalized (fp32) + bf16 copy for the LM head + rsqrt"}[kind]
    return per_token * T + 4 * h, how + " + (1 + w) in fp32"


GEMMA_NORM = Norm(name="GemmaRMSNorm", parameters=1, saves_input_in_16bit=False, final_saved=_final_saved,
                  lora_final_saved=_rms_lora_final)


# --- the layers -----------------------------------------------------------------------------------

def _scaled(parts, share: float, suffix: str) -> list[Part]:
    return [attrs.evolve(p, name=p.name + suffix, nbytes=p.nbytes * share) for p in parts if p.nbytes]


def _attention_parts(attention, model, *, regime, dropout, heads, kv_heads, head_dim, hidden, seq_len, tokens):
    """The kernel's attention parts, as the mean over the layers. Sliding layers past their window
    get a (b, 1, s, s) bool mask under SDPA (``masking_utils._ignore_causal_mask_sdpa``: s >= window),
    and with a mask ``sdpa_attention_forward`` repeats k and v to every head (``use_gqa_in_sdpa`` wants
    no mask). ``repeat_kv`` (expand + reshape) copies them for 1 < kv_heads < heads; for one KV head
    the reshape is a view (stride 0 over the heads): nothing new, except under AMP, where autocast's
    bf16 cast of the fp32 rotary k materializes it at every head. SDPA turns the bool mask into an
    additive one in the query's dtype (``convert_boolean_attn_mask``) that the kernel saves: s x c per
    token in every such layer. A kernel that keeps k and v at every head anyway (eager, the math
    kernel with dropout) sees no difference: then nothing changes."""
    q, kv = heads * head_dim, kv_heads * head_dim
    keywords = dict(kind=regime, dropout=dropout, heads=heads, q_dim=q, hidden=hidden, seq_len=seq_len,
                    tokens=tokens)
    plain = list(attention(kv_dim=kv, **keywords))
    window = _fact(model, "sliding_window") if model is not None else None
    sliding = _sliding_layers(model) if model is not None else 0
    if not (window and sliding and seq_len >= window):
        return plain
    repeated = list(attention(kv_dim=q, **keywords)) if kv < q else plain
    if kv < q and repeated == plain:      # the kernel keeps k, v at every head anyway (eager)
        return plain
    c = 4 if regime == "fp32" else 2
    masked = list(plain if kv_heads == 1 else repeated)
    if kv_heads == 1 and kv < q and regime == "amp-bf16":
        masked.append(Part("k's bf16 cast at every head (AMP, of the repeated view)", 2 * (q - kv)))
    masked.append(Part("additive attention mask (query dtype, saved by SDPA)", c * seq_len,
                       recomputed_by_selective=True))
    L = model.layers
    if sliding >= L:
        return masked
    how = "k, v repeated" if kv_heads > 1 and kv < q else "mask"
    return (_scaled(masked, sliding / L, f" [sliding layers, masked ({how}): {sliding} of {L}]")
            + _scaled(plain, (L - sliding) / L, f" [full layers: {L - sliding} of {L}]"))


def _gemma_layer(version: int):
    def layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
              seq_len, model=None) -> LayerBytes:
        h, q, kv = hidden, heads * head_dim, kv_heads * head_dim
        c = 4 if regime == "fp32" else 2
        r = 2 if regime == "bf16" else 4
        bf16, amp = regime == "bf16", regime == "amp-bf16"
        w = LayerWalk()
        # input norm: its fp32 input is the layer's input, except in bf16 (a copy)
        w.add("input norm (GemmaRMSNorm, fp32)", _norm_bytes(regime, h, input_saved=bf16, output_saved=True),
              REPLICATED)
        if amp:
            w.add("q/k/v input casts", 3 * 2 * h, REPLICATED)
        if version == 3:
            # q_norm, k_norm: fp32 input + normalized (per head_dim) + rsqrt per head
            w.add("QK-norm (fp32 inputs, normalized, rsqrt)", 8 * (q + kv) + 4 * (heads + kv_heads))
        w.extend(_attention_parts(attention, model, regime=regime, dropout=dropout, heads=heads, kv_heads=kv_heads,
                                  head_dim=head_dim, hidden=h, seq_len=seq_len, tokens=tokens))
        if version == 2 and (model is None or _fact(model, "attn_logit_softcapping")):
            # tanh(scores / cap) saves its output, in the scores' dtype (bf16 under AMP)
            w.parts.append(Part("attention logit soft-capping (tanh output)", c * heads * seq_len,
                                recomputed_by_selective=True))
        if version == 1:
            w.add("mid residual (post-attention norm input)", 0 if bf16 else 4 * h, REPLICATED)
            w.add("post-attention norm (GemmaRMSNorm, fp32)",
                  _norm_bytes(regime, h, input_saved=bf16, output_saved=True), REPLICATED)
        else:
            w.add("post-attention norm of o_proj's output (fp32 input, normalized, rsqrt)", 8 * h + 4, REPLICATED)
            w.add("mid residual (pre-feedforward norm input)", 0 if bf16 else 4 * h, REPLICATED)
            w.add("pre-feedforward norm (GemmaRMSNorm, fp32)",
                  _norm_bytes(regime, h, input_saved=bf16, output_saved=True), REPLICATED)
        if amp:
            w.add("gate/up input casts", 2 * 2 * h, REPLICATED)
        w.add("mlp (gate, gelu_tanh, up, product)", 4 * c * ffn)
        if version > 1:
            w.add("post-feedforward norm of down_proj's output (fp32 input, normalized, rsqrt)", 8 * h + 4,
                  REPLICATED)
        norms = 2 if version == 1 else 4
        w.constant.append(Part(f"(1 + w) of the {norms} norms (fp32)", 4 * h * norms, split=REPLICATED))
        if version == 3:
            w.constant.append(Part("(1 + w) of q_norm and k_norm (fp32)", 2 * 4 * head_dim, split=REPLICATED))
        return w.layer(tokens, r * h * tokens, not bf16)   # bf16: the next norm saves its fp32 copy
    return layer


def _gemma2_eager(*, device="cuda", **keywords):
    """Gemma 2's attention under any kernel name: eager (no SDPA path in transformers 5.23)."""
    return EAGER.saved(SEPARATE_QKV, **keywords)


# --- weights, parameters ----------------------------------------------------------------------------

W = LayerWeight


def _weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    return (W("q_proj", h * q_dim), W("k_proj", h * kv_dim), W("v_proj", h * kv_dim), W("o_proj", q_dim * h),
            W("gate_proj", h * f), W("up_proj", h * f), W("down_proj", f * h))


def _norms(version):
    return 2 if version == 1 else 4


def _tensors(version):
    """Registration order (``GemmaDecoderLayer.__init__``): self_attn (q, k, v, o; Gemma 3: q_norm,
    k_norm), mlp (gate, up, down), then the norms; the final norm; an untied LM head."""
    def tensors(shape):
        h = shape.hidden
        attn = [n for _, n in shape.layer_matrices()]
        qk = [shape.head_dim, shape.head_dim] if version == 3 else []
        block = tuple(attn[:4] + qk + attn[4:] + [h] * _norms(version))
        tail = (h,) if shape.tied else (h, shape.embedding_parameters)
        return (shape.embedding_parameters,) + block * shape.layers + tail
    return tensors


def _matrices(version):
    def shapes(shape):
        h, V, f, d = shape.hidden, shape.vocab, shape.ffn, shape.head_dim
        block = [(shape.q_dim, h), (shape.kv_dim, h), (shape.kv_dim, h), (h, shape.q_dim)]
        block += [(d, 0), (d, 0)] if version == 3 else []
        block += [(f, h), (f, h), (h, f)] + [(h, 0)] * _norms(version)
        return [(V, h)] + block * shape.layers + [(h, 0)] + ([] if shape.tied else [(V, h)])
    return shapes


def _count(version):
    def count(model) -> int:
        from ..shapes import ModelShape
        return sum(_tensors(version)(ModelShape.of(model, FAMILY_OF_VERSION[version])))
    return count


# --- the run: notes and refusals ---------------------------------------------------------------------

def _check(version):
    def check(plan) -> tuple[str, ...]:
        model, o = plan.model, plan.profile_options
        sliding = _sliding_layers(model)
        if not 0 <= sliding <= model.layers:
            raise InvalidInputError("model.details.sliding_window_layers", sliding, f"0 to {model.layers}, the "
                                    f"layers of {model.name!r}", "the sliding-window layers are some of its layers")
        notes = []
        if o.regime.main_grad:
            notes.append("approximation: Gemma under Megatron-Core is costed as Megatron's layers (its extra "
                         "norms" + (", QK-norm" if version == 3 else "") + " and soft-capping not modelled)")
        if version == 2 and not kernel_of(plan).eager:     # what the kernel declares it computes
            notes.append(f"Gemma 2 has no {kernel_of(plan).name} attention in transformers 5.23 "
                         "(Gemma2PreTrainedModel._supports_sdpa = False: SDPA has no logit soft-capping; "
                         "attn_implementation='sdpa' raises, the default falls back to eager): costed as eager "
                         "attention, with its s x s scores")
        if version == 3 and _fact(model, "attn_logit_softcapping") is not None:
            notes.append("Gemma 3's attn_logit_softcapping is not passed to the attention by transformers 5.23 "
                         "(Gemma3Attention.forward): no soft-capping is costed, as none runs")
        return tuple(notes)
    return check


def _assumptions(version):
    def assumptions(model) -> tuple[str, ...]:
        arch, d = _arch(model), _details(model)
        if _imported(model):
            return ()
        out = [f"{key} = {value} assumed ({arch}'s default; model.details has none)"
               for key, value in DEFAULTS.get(arch, {}).items() if key not in d]
        if version > 1 and "sliding_window_layers" not in d and "layer_types" not in d:
            out.append(f"{_sliding_layers(model)} of {model.layers} sliding-window layers assumed ({arch}'s "
                       "default pattern; model.details has none)")
        return tuple(out)
    return assumptions


# --- outside the layers ----------------------------------------------------------------------------------

def checkpointed_masks(plan, placement, *, eager: bool, layer_types: int, masked: bool, s: int) -> list[MemoryTerm]:
    """The attention masks full checkpointing keeps as the checkpointed layers' inputs: ``eager``'s
    additive masks, one per layer type, in the embeddings' dtype; else, where the sliding layers are
    ``masked`` (past the window), SDPA's bool mask (b x s x s)."""
    b, cp = plan.microbatch, placement.sequence_shards
    if eager:
        r = plan.profile_options.regime.residual
        return [MemoryTerm(component=ACTIVATIONS, label="eager attention masks (kept by the checkpoints)",
                           nbytes=layer_types * b * s * s * r / cp, phases=SAVED,
                           formula=f"{layer_types} x b x s x s x {r} B")]
    if masked:
        return [MemoryTerm(component=ACTIVATIONS, label="sliding-window mask (bool, kept by the checkpoints)",
                           nbytes=b * s * s / cp, phases=SAVED, formula=f"b x s x s = {b} x {s} x {s} x 1 B")]
    return []


def _adjust(version):
    def adjust(kind, plan, placement, terms):
        from ..model import context, megatron
        from ..shapes import shape_of
        terms = list(terms)
        shape = shape_of(plan)
        regime = plan.profile_options.regime
        model = plan.model
        if kind == "weights":
            b = regime.weight
            terms.append(MemoryTerm(component=WEIGHTS, label="embedding scale buffer (sqrt(hidden), 0-d)", nbytes=b,
                                    phases=tuple(terms[0].phases), formula=f"1 x {b} B"))
            if version == 3 and 0 < _sliding_layers(model) < model.layers:
                terms.append(MemoryTerm(component=WEIGHTS, key=K.ROPE_BUFFERS,
                                        label="RoPE frequency buffers (second rotary: local "
                                        "and global layers)", nbytes=shape.rope_buffer_bytes,
                                        phases=tuple(terms[0].phases),
                                        formula=f"2 x head_dim/2 = {shape.head_dim // 2} x 4 B (fp32)"))
            return terms
        if megatron(regime):
            return terms
        from ..checkpointing import whole_layers
        ctx = context(plan, placement)
        T, s, V = ctx.tokens, ctx.seq_len, shape.vocab
        rank = plan.rank
        last = True if rank is None else rank.last
        cp = ctx.sequence
        c = regime.compute
        b = plan.microbatch
        sliding = _sliding_layers(model) if version > 1 else 0
        if version == 3 and 0 < sliding < model.layers:
            # Gemma3TextModel.forward: cos/sin for each layer type (local and global rotary).
            for t in [t for t in terms if t.key == K.ROPE_TABLES]:     # (an offloaded host copy too)
                terms.append(attrs.evolve(t, label="RoPE cos/sin tables (second rotary: local and global layers)"
                                          + (" (offloaded to host memory)" if t.tier == HOST else "")))
        if whole_layers(plan):     # declared (recomputes="layers"), not named
            # The masks are the checkpointed layers' inputs: kept through the backward (without
            # checkpointing they die with the model's forward, before the logits). Eager builds
            # additive masks in the embeddings' dtype, one per layer type (full and sliding); SDPA only
            # the sliding layers' bool mask, past the window.
            window = _fact(model, "sliding_window")
            terms += checkpointed_masks(plan, placement, eager=kernel_of(plan).eager or version == 2,
                                        layer_types=2 if 0 < sliding < model.layers else 1,
                                        masked=bool(sliding and window and s >= window), s=s)
            terms = _tied_partials_after_recompute(plan, placement, shape, terms)
        # (Under autocast the final norm's fp32 output, held until the loss, is model.py's, as for every family.)
        softcap = _fact(model, "final_logit_softcapping")
        if last and softcap:
            vocab = cp
            terms.append(MemoryTerm(component=ACTIVATIONS, label="final logit soft-capping: tanh output (saved)",
                                    nbytes=c * T * V / vocab, phases=SAVED,
                                    formula=f"{c} x T x V = {c} x {T:,} x {V:,} (tanh(logits / {softcap:g}), kept "
                                            "for its backward)"))
        return terms
    return adjust


def _tied_partials_after_recompute(plan, placement, shape, terms):
    """With recomputation and tied embeddings, the profile's end of the backward holds both the
    recompute working set of one layer and the tied embedding's two partials and their sum (3 V h).
    They are not alive together: the LM head's partial (V h) waits in autograd's input buffer of the
    shared weight from the start of the backward, but the lookup's partial and the sum come after
    the last layer's backward, once its recomputed tensors are freed. Alive at the end of the backward:
    the larger of working set + one partial and the three; the term keeps what that adds to the
    working set (the profile counts the working set itself)."""
    from ..model import layer_terms
    if not shape.tied:
        return terms
    layers = placement.layers_per_stage
    k = plan.profile_options.checkpointed_layers
    kept = 0 if k is None else layers - min(k, layers)
    work = sum(t.nbytes for t in layer_terms(plan, placement, kept_layers=kept)
               if t.key == K.RECOMPUTE_WORKING_SET)
    out = []
    for t in terms:
        if t.key == K.TIED_EMBEDDING_GRAD and work:
            partial = t.nbytes / 3
            alive = max(work + partial, t.nbytes) - work
            t = attrs.evolve(t, nbytes=alive, formula=t.formula + f"; after the recompute working set ({work:,.0f} B) "
                             f"is freed: max(working set + one partial, three) - working set = {alive:,.0f} B")
        out.append(t)
    return out


# --- the families ------------------------------------------------------------------------------------------

def _family(version, *, name, label, description, layout=SEPARATE_QKV, layouts=()):
    return ArchitectureFamily(
        name=name, label=label, description=description, architectures=(name,), norm=GEMMA_NORM,
        layer_norms=_norms(version), positions="rotary", attention_layout=layout, attention_layouts=layouts,
        layer_weights=_weights, parameter_tensors=_tensors(version), matrix_shapes=_matrices(version),
        layer=_gemma_layer(version), megatron_mlp=megatron_gated_mlp, lora_layer=None,
        assumptions=_assumptions(version), count_parameters=_count(version), check=_check(version),
        adjust_terms=_adjust(version))


GEMMA = _family(
    1, name="gemma", label="Gemma",
    description="Gemma: fp32 (1 + w) RMSNorms, sqrt(hidden) embedding scale, GeGLU (gelu_tanh), tied "
                "embeddings, head_dim x heads != hidden (validated against PyTorch's MemTracker)")
GEMMA2 = _family(
    2, name="gemma2", label="Gemma 2", layout=GEMMA2_EAGER,
    layouts={"sdpa": _gemma2_eager, "eager": _gemma2_eager},
    description="Gemma 2: four fp32 (1 + w) RMSNorms per layer, GeGLU, eager attention with logit "
                "soft-capping, sliding windows, final logit soft-capping (validated against PyTorch's MemTracker)")
GEMMA3 = _family(
    3, name="gemma3_text", label="Gemma 3",
    description="Gemma 3 text: four fp32 (1 + w) RMSNorms per layer, QK-norm, GeGLU, local and global rotary "
                "embeddings, sliding windows (SDPA repeats k, v where masked) (validated against PyTorch's "
                "MemTracker)")



# --- under LoRA: what each part is made of (lora.generic_layer reads it) ------------------------------

_QKV, _GATE_UP = ("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")


def _lora_tagged(layer):
    """The Gemma layer with its parts split for LoRA, bytes unchanged. A GemmaRMSNorm multiplies the fp32
    normalized x by ``1 + w``: with w frozen the normalized x (4 B) is kept only for w's gradient (``1 + w``,
    kept for x's, is the per-layer constant); its rsqrt (and, where the input is a new fp32 copy, that copy)
    stays; its output is the next linears' input (q/k/v after the input norm, gate/up after the pre-feedforward
    norm; none after the post-norms, whose output joins the residual); under AMP those linears' casts. The
    QK-norm's normalized q and k (4 B) are its weights'. The GeGLU's product is down_proj's input (c f of its
    4 c f). The attention kernel's part kept only for o_proj's weight is o_proj's input."""
    def tagged(**kw):
        lb = layer(**kw)
        regime, h, T = kw["regime"], kw["hidden"], kw["tokens"]
        q, kv = kw["heads"] * kw["head_dim"], kw["kv_heads"] * kw["head_dim"]
        c = 4 if regime == "fp32" else 2

        def norm(p, readers):
            out = 0 if regime == "amp-bf16" or not readers else c * h * T
            parts = [attrs.evolve(p, nbytes=p.nbytes - 4 * h * T - out),
                     Part("normalized (its weight's)", 4 * h * T, weight_gradient_only=True)]
            if out:
                parts.append(Part("output", out, weight_gradient_only=True, inputs_of=readers))
            return tuple(parts)

        def split(p):
            n = p.name
            if n.startswith("input norm"):
                return norm(p, _QKV)
            if n.startswith(("pre-feedforward norm", "post-attention norm (GemmaRMSNorm")):
                return norm(p, _GATE_UP)
            if n.startswith(("post-attention norm of", "post-feedforward norm of")):
                return norm(p, ())
            if n == "q/k/v input casts":
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=_QKV),)
            if n == "gate/up input casts":
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=_GATE_UP),)
            if n.startswith("QK-norm"):
                return (attrs.evolve(p, nbytes=p.nbytes - 4 * (q + kv) * T),
                        Part("QK-norm normalized (its weights')", 4 * (q + kv) * T, weight_gradient_only=True))
            if n.startswith("mlp ("):
                return (attrs.evolve(p, nbytes=p.nbytes * 3 / 4),
                        Part("product (down_proj's input)", c * kw["ffn"] * T, weight_gradient_only=True,
                             inputs_of=("down_proj",)))
            if p.weight_gradient_only:
                return (attrs.evolve(p, inputs_of=("o_proj",)),)
            return ()
        return attrs.evolve(lb, parts=tuple(attrs.evolve(p, lora=split(p)) for p in lb.parts))
    return tagged


GEMMA, GEMMA2, GEMMA3 = (attrs.evolve(f, layer=_lora_tagged(f.layer)) for f in (GEMMA, GEMMA2, GEMMA3))

FAMILY_OF_VERSION = {1: GEMMA, 2: GEMMA2, 3: GEMMA3}
FAMILIES = (GEMMA, GEMMA2, GEMMA3)
