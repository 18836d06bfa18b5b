"""Qwen-MoE (``qwen2_moe``, ``qwen3_moe``) and Llama 4 text (``llama4_text``, ``llama4``) families.

Derived op by op from transformers 5.23 (``models/qwen2_moe``, ``models/qwen3_moe``, ``models/llama4``
``modeling_*.py``; ``integrations/moe.py``) on torch 2.13, checked against PyTorch's MemTracker
(``validation/families/moe_2025``). Notation per token: h hidden, a heads, d head_dim, q = a*d,
kv = kv_heads*d, c compute bytes (fp32 4, bf16 and AMP 2), E experts, k experts per token.

Qwen-MoE (Qwen1.5-MoE, Qwen2-57B-A14B; Qwen3-30B-A3B, Qwen3-235B-A22B)
------------------------------------------------------------------------
* Attention as Llama's (q/k/v biases save nothing more: addmm saves its input and weight). Qwen 3's
  QK-norm (``Qwen3MoeRMSNorm`` over head_dim on q and k): ``pow`` saves the fp32 input (fp32: the
  projection's output itself; bf16 and AMP: its fp32 copy), ``mul`` the rsqrt (4 per head) and
  ``weight *`` the normalized input cast back (fp32 4, bf16/AMP 2): 8q + 4a (fp32), 6q + 4a else;
  likewise for k.
* Router (``Qwen*MoeTopKRouter``): ``softmax(dtype=float)`` saves its fp32 output (4E), topk its
  int64 indices (8k); ``norm_topk_prob``: the in-place ``/=`` saves the fp32 sum and result (4 + 4k);
  ``.to(router_logits.dtype)`` makes a 16-bit copy in bf16 and AMP (AMP's logits are bf16).
* Experts: transformers' ``grouped_mm`` (``grouped_mm_experts_forward``), as Mixtral's
  (``layers.mixtral_layer``): indices perm // k, perm, inv_perm (3 x 8k), int32 offsets (4E per
  layer), in the weights' dtype (grouped_mm is not autocast) the gathered input, gate_up, silu,
  product and down outputs (k(2h + 4f)); the gathered routing weights the multiply saves are in the
  router's output dtype (fp32 4k; bf16 and AMP 2k).
* Qwen 2's shared expert (``Qwen2MoeMLP`` of ``shared_expert_intermediate_size`` fs): 4 c fs as
  Llama's MLP; ``sigmoid(shared_expert_gate(x)) * shared``: sigmoid saves its output (c) and the
  product the shared output (c h). Under AMP every linear reading the norm output saves its own bf16
  cast: shared gate and up, router, shared_expert_gate (4 x 2h).
* Dense layers (``mlp_only_layers``, ``decoder_sparse_step``): Llama's MLP of ``intermediate_size``.

Llama 4 text (Scout: MoE every layer; Maverick: every 2nd, ``interleave_moe_layer_step``)
----------------------------------------------------------------------------------------
* RoPE is complex (``apply_rotary_emb``): ``q.float()`` as complex times ``freqs_cis`` (which
  needs no grad) saves only freqs_cis (complex64: 4 s d bytes per model, in every regime); the
  result is cast back (type_as). On RoPE layers the L2 QK-norm (``Llama4TextL2Norm``, no weight)
  saves the fp32 input (the rotated q: fp32 4q, or its fp32 copy) and the rsqrt (4a): 4q + 4a, and
  4kv + 4 kv_heads for k. Every ``no_rope_layer_interval``-th layer has no RoPE, no QK-norm and
  global attention; attention temperature tuning multiplies q by fp32 scales (their s floats are
  saved per layer). RoPE layers use chunked attention (``attention_chunk_size``): at s <= chunk
  the mask is the causal one (SDPA is_causal, no mask tensor).
* SDPA as Llama's. Eager does not upcast the softmax (``eager_attention_forward``): bf16 saves the
  bf16 softmax output only (2S), fp32 4S, AMP (autocast softmax) 4S + the 2S cast.
* MoE (``Llama4TextMoe``): the router linear, topk on the logits (8k indices), sigmoid of the
  scattered scores in fp32 (4E saved), cast back; ``hidden.repeat(E, 1)`` (every token to every
  expert: E x h, saved by the multiply with the scores), the scores transposed into a contiguous
  column (E, fp32 4 or 16-bit 2), the product (c E h, saved by bmm; AMP: its bf16 cast); the
  experts (``Llama4TextExperts``) are two ``torch.bmm`` over ALL experts and all tokens (a dense
  dispatch: the routing only zeroes the inputs): gate_up (2 c E f), silu (c E f), product
  (c E f); the shared expert (``Llama4TextMLP`` of ``intermediate_size``: 4 c f). bmm is autocast:
  under AMP the experts' weights get bf16 copies like any linear's.
* Dense layers: ``Llama4TextMLP`` of ``intermediate_size_mlp``.

Heterogeneous layers (dense and MoE, RoPE and NoPE) are costed as the mean layer: each kind's
saved tensors and weights x its share of the layers (exact for the whole model on one device; a
note says where one layer or one stage counts apart).
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.memo import memoize
from mlsysim_core.terms import ACTIVATIONS, BACKWARD_END, HOST, MemoryTerm

from ..checkpointing import keeps_everything, whole_layers
from ..families import RMS_NORM, ArchitectureFamily, LayerWeight
from .. import term_keys as K
from ..kernels import ALL_GRAD, SDPA, SEPARATE_QKV
from ..layer_ops import qwen_moe_ops
from ..layers import EXPERTS, REPLICATED, LayerBytes, Part, LayerWalk, rms_norm_lora_parts

W = LayerWeight
LLAMA4_LAYOUT = "llama4-separate-qkv"


# --- what a model's config says ----------------------------------------------------------------

@attrs.frozen
class Spec:
    """The facts the formulas read, from the workload and ``model.details`` (defaults said in notes)."""

    arch: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    experts: int
    top_k: int
    expert_ffn: int
    dense_ffn: int
    shared_ffn: int               # 0: no shared expert
    moe: tuple                    # per layer: True for a MoE layer
    rope: tuple                   # per layer: True for a RoPE layer (Llama 4), all True for Qwen
    qkv_bias: bool = False
    qk_norm: bool = False         # Qwen 3: RMSNorm with weight; Llama 4: L2 norm on RoPE layers
    norm_topk: bool = False
    temperature_tuning: bool = False
    chunk: int | None = None
    notes: tuple = ()

    @property
    def moe_layers(self) -> int:
        return sum(self.moe)

    @property
    def rope_layers(self) -> int:
        return sum(self.rope)


def _arch(model) -> str:
    return (model.architecture or "").lower()


def _int_list(value) -> tuple:
    return tuple(int(v) for v in (value or ()))


@memoize
def spec_of(model) -> Spec:
    d = model.details
    arch = _arch(model)
    arch = "llama4_text" if arch == "llama4" else arch      # the nested text_config of a Llama 4 checkpoint
    imported = "model_type" in d          # from_hf_config fills details; a catalog entry may not
    notes = []
    L, h = model.layers, model.hidden_dim
    heads = model.heads
    kv = model.kv_heads or heads
    hd = model.head_dim or h // heads
    E = model.experts
    k = model.active_experts_per_token
    fe = model.expert_ffn_dim or d.get("moe_intermediate_size") or model.ffn_dim
    if arch in ("qwen2_moe", "qwen3_moe"):
        step = int(d.get("decoder_sparse_step", 1) or 1)
        dense_only = set(_int_list(d.get("mlp_only_layers")))
        moe = tuple(i not in dense_only and (i + 1) % step == 0 for i in range(L))
        if not imported and "decoder_sparse_step" not in d:
            notes.append("every layer a MoE layer assumed (decoder_sparse_step 1, no mlp_only_layers: "
                         "model.details has neither)")
        shared = 0
        if arch == "qwen2_moe":
            shared = d.get("shared_expert_intermediate_size") or d.get("shared_expert_ffn_dim")
            if shared is None:
                shared = (model.shared_experts or 0) * fe
                if shared:
                    notes.append(f"shared expert width {shared} = shared_experts x expert_ffn_dim assumed "
                                 "(model.details has no shared_expert_intermediate_size)")
        norm_topk = d.get("norm_topk_prob")
        if norm_topk is None:
            norm_topk = False
            if not imported:
                notes.append("norm_topk_prob false assumed (transformers' default; model.details has no "
                             "norm_topk_prob)")
        qkv_bias = bool(d.get("qkv_bias", arch == "qwen2_moe"))
        return Spec(arch=arch, layers=L, hidden=h, heads=heads, kv_heads=kv, head_dim=hd, vocab=model.vocab_size,
                    tied=bool(model.tied_embeddings), experts=E, top_k=k, expert_ffn=fe,
                    dense_ffn=model.ffn_dim or fe, shared_ffn=int(shared), moe=moe, rope=(True,) * L,
                    qkv_bias=qkv_bias, qk_norm=arch == "qwen3_moe", norm_topk=bool(norm_topk), notes=tuple(notes))
    # Llama 4 text
    step = int(d.get("interleave_moe_layer_step", 1) or 1)
    moe = tuple((i + 1) % step == 0 for i in range(L))
    count = d.get("moe_layers")            # the importer's count (a config's explicit moe_layers list wins)
    if isinstance(count, int) and count != sum(moe):
        moe = tuple(i < count for i in range(L))
        notes.append(f"{count} MoE layers (the config's moe_layers), placed first in the parameter order "
                     "(the mean layer depends only on their number)")
    if "interleave_moe_layer_step" not in d and not imported:
        notes.append("a MoE layer in every layer assumed (Llama 4 Scout; model.details has no "
                     "interleave_moe_layer_step)")
    no_rope = d.get("no_rope_layers")
    if no_rope:
        rope = tuple(bool(v) for v in no_rope)[:L]
    else:
        interval = int(d.get("no_rope_layer_interval", 4) or 4)
        rope = tuple((i + 1) % interval != 0 for i in range(L))
        if "no_rope_layer_interval" not in d and not imported:
            notes.append("every 4th layer without RoPE assumed (no_rope_layer_interval 4; model.details has "
                         "no no_rope_layers)")
    fd = d.get("intermediate_size_mlp")
    if fd is None:
        fd = model.ffn_dim or fe
        if not all(moe):
            notes.append(f"dense layers' MLP width {fd} assumed (model.ffn_dim; model.details has no "
                         "intermediate_size_mlp)")
    if "use_qk_norm" in d:
        qk = bool(d["use_qk_norm"])
    elif "qk_norm" in d:
        qk = bool(d["qk_norm"])
    else:
        qk = not imported
        if not imported:
            notes.append("QK-norm on the RoPE layers assumed (use_qk_norm: Llama 4 Scout; model.details "
                         "does not say)")
    tuning = d.get("attn_temperature_tuning", True)
    chunk = d.get("attention_chunk_size", 8192 if not imported else None)
    return Spec(arch=arch, layers=L, hidden=h, heads=heads, kv_heads=kv, head_dim=hd, vocab=model.vocab_size,
                tied=bool(model.tied_embeddings), experts=E, top_k=k, expert_ffn=fe, dense_ffn=int(fd),
                shared_ffn=fe, moe=moe, rope=rope, qk_norm=qk, temperature_tuning=bool(tuning),
                chunk=int(chunk) if chunk else None, notes=tuple(notes))


def _assumptions(model) -> tuple[str, ...]:
    return spec_of(model).notes


# --- parameters -----------------------------------------------------------------------------------

def _mlp_tensors(h, f):
    return [(f * h, (f, h)), (f * h, (f, h)), (h * f, (h, f))]


def _experts_tensors(E, h, f):
    """An expert stack (E, r, c) as one tensor; ``matrix_shapes`` factors it per expert."""
    return [(E * 2 * f * h, [(2 * f, h)] * E), (E * h * f, [(h, f)] * E)]


def _layer_tensors(s: Spec, i: int) -> list:
    """(elements, (rows, cols) or a list of them) of layer i's parameter tensors in registration order."""
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    out = [(q * h, (q, h))] + ([(q, (q, 0))] if s.qkv_bias else [])
    out += [(kv * h, (kv, h))] + ([(kv, (kv, 0))] if s.qkv_bias else [])
    out += [(kv * h, (kv, h))] + ([(kv, (kv, 0))] if s.qkv_bias else [])
    out += [(h * q, (h, q))]
    if s.arch == "qwen3_moe":
        out += [(s.head_dim, (s.head_dim, 0))] * 2                                   # q_norm, k_norm
    E, f = s.experts, s.expert_ffn
    router = [(E * h, (E, h))]
    if not s.moe[i]:
        out += _mlp_tensors(h, s.dense_ffn)
    elif s.arch == "qwen2_moe":
        out += router + _experts_tensors(E, h, f)
        if s.shared_ffn:
            out += _mlp_tensors(h, s.shared_ffn) + [(h, (1, h))]                    # + shared_expert_gate
    elif s.arch == "qwen3_moe":
        out += _experts_tensors(E, h, f) + router
    else:                                                                               # Llama 4
        out += _experts_tensors(E, h, f) + router + _mlp_tensors(h, s.shared_ffn)
    return out + [(h, (h, 0))] * 2


def _tensors(s: Spec) -> list:
    V, h = s.vocab, s.hidden
    out = [(V * h, (V, h))]
    for i in range(s.layers):
        out += _layer_tensors(s, i)
    out.append((h, (h, 0)))
    return out + ([] if s.tied else [(V * h, (V, h))])


def parameter_tensors(shape) -> tuple[int, ...]:
    return tuple(n for n, _ in _tensors(spec_of(shape.model)))


def matrix_shapes(shape) -> list:
    out = []
    for _, rc in _tensors(spec_of(shape.model)):
        out += rc if isinstance(rc, list) else [rc]
    return out


def count_parameters(model) -> int:
    return sum(n for n, _ in _tensors(spec_of(model)))


def layer_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None) -> tuple[LayerWeight, ...]:
    """The mean layer's weights (norms apart: ``layer_norms``): attention whole, the MoE block's
    weights x the MoE share of the layers, the dense MLP's x the dense share. Expert stacks are
    split over expert parallelism; grouped_mm (Qwen) is not autocast, Llama 4's bmm is."""
    s = spec_of(model)
    h, L, m = hidden, s.layers, s.moe_layers
    out = [W("q_proj", h * q_dim), W("k_proj", h * kv_dim), W("v_proj", h * kv_dim), W("o_proj", q_dim * h)]
    if s.qkv_bias:
        out += [W("q_proj.bias", q_dim, bias=True), W("k_proj.bias", kv_dim, bias=True),
                W("v_proj.bias", kv_dim, bias=True)]
    if s.arch == "qwen3_moe":
        out.append(W("q_norm, k_norm", 2 * s.head_dim, split=REPLICATED, autocast=False))
    E, f = s.experts, s.expert_ffn
    moe = [W("router", E * h, split=REPLICATED),
           W("experts.gate_up", E * 2 * f * h, split=EXPERTS, autocast=s.arch == "llama4_text"),
           W("experts.down", E * h * f, split=EXPERTS, autocast=s.arch == "llama4_text")]
    if s.shared_ffn:
        fs = s.shared_ffn
        moe += [W("shared_expert.gate_proj", h * fs), W("shared_expert.up_proj", h * fs),
                W("shared_expert.down_proj", fs * h)]
        if s.arch == "qwen2_moe":
            moe.append(W("shared_expert_gate", h, split=REPLICATED))
    fd = s.dense_ffn
    dense = [W("mlp.gate_proj", h * fd), W("mlp.up_proj", h * fd), W("mlp.down_proj", fd * h)]
    out += [attrs.evolve(w, name=f"{w.name} x {m}/{L}", elements=w.elements * m / L) for w in moe if m]
    out += [attrs.evolve(w, name=f"{w.name} x {L - m}/{L}", elements=w.elements * (L - m) / L)
            for w in dense if L - m]
    return tuple(out)


# --- one layer ------------------------------------------------------------------------------------

def _dropout_refused(dropout):
    if dropout:
        raise NotModelledError("dropout", "> 0", "0.0 for a Qwen-MoE or Llama 4 model",
                               "attention dropout was not measured for these families "
                               "(validation/families/moe_2025 runs without it)")


def _norm(regime, h):
    """Llama's RMSNorm (Qwen's and Llama 4's are alike): fp32 and bf16 save the normalized input and
    the output (bf16: + the fp32 copy), AMP the fp32 normalized input; + rsqrt."""
    return {"fp32": 8 * h + 4, "bf16": 8 * h + 4, "amp-bf16": 4 * h + 4}[regime]


def _module(s, module: str) -> str:
    """The module tag of a part (checkpointing's mlp-only / attention-only read it): Qwen3-MoE tags
    its parts; the other architectures of these families do not (the module policies refuse them)."""
    return module if s.arch == "qwen3_moe" else ""


def _scaled(w: LayerWalk, parts, share, label, module=""):
    for p in parts:
        if p.nbytes and share:
            w.parts.append(attrs.evolve(p, name=f"{label}: {p.name}", nbytes=p.nbytes * share, module=module))


def _grouped_experts(regime, *, h, f, E, k, norm_topk) -> list[Part]:
    """A Qwen router and transformers' grouped_mm experts, per token (module docstring)."""
    ce = 2 if regime == "bf16" else 4            # experts run in the weights' dtype
    cr = 4 if regime == "fp32" else 2            # routing weights after .to(router_logits.dtype)
    return [Part("router (softmax fp32, top-k indices" + (", renormalized weights)" if norm_topk else ")"),
                 4 * E + 8 * k + (4 + 4 * k if norm_topk else 0), split=REPLICATED),
            Part("expert indices (perm // k, perm, inv_perm)", 3 * 8 * k, split=REPLICATED),
            Part("experts (input, gate_up, silu, product, down)", ce * k * (2 * h + 4 * f), split=EXPERTS),
            Part("routing weights (gathered)", cr * k, split=REPLICATED)]


def _attention(w: LayerWalk, attention, s: Spec, regime, tokens, seq_len):
    h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
    amp = regime == "amp-bf16"
    att = _module(s, "attention")
    w.add("input norm", _norm(regime, h), REPLICATED)
    if amp:
        w.add("q/k/v input casts", 3 * 2 * h, REPLICATED, module=att)
    if s.arch == "qwen3_moe":
        per = 8 if regime == "fp32" else 6
        w.add("QK-norm (fp32 input, rsqrt, normalized)", per * (q + kv) + 4 * (s.heads + s.kv_heads), module=att)
    elif s.arch == "llama4_text" and s.qk_norm and s.rope_layers:
        share = s.rope_layers / s.layers
        w.add(f"L2 QK-norm on the RoPE layers x {s.rope_layers}/{s.layers} (fp32 input, rsqrt)",
              share * (4 * (q + kv) + 4 * (s.heads + s.kv_heads)))
    w.extend(attention(kind=regime, dropout=False, heads=s.heads, q_dim=q, kv_dim=kv, hidden=h, seq_len=seq_len,
                       tokens=tokens), module=att)
    if s.arch == "llama4_text" and s.temperature_tuning and s.layers > s.rope_layers:
        share = (s.layers - s.rope_layers) / s.layers
        w.constant.append(Part(f"attention temperature scales (fp32, NoPE layers x {s.layers - s.rope_layers}/"
                               f"{s.layers})", 4 * seq_len * share, split=REPLICATED))
    w.add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, REPLICATED)
    w.add("post-attention norm", _norm(regime, h), REPLICATED)


def _dense_mlp(regime, h, f) -> list[Part]:
    c = 4 if regime == "fp32" else 2
    out = [Part("gate/up input casts", 2 * 2 * h, split=REPLICATED)] if regime == "amp-bf16" else []
    return out + [Part("mlp (gate, silu, up, product)", 4 * c * f)]


def _qwen_moe(regime, s: Spec) -> list[Part]:
    h, c = s.hidden, (4 if regime == "fp32" else 2)
    out = []
    if regime == "amp-bf16":
        n = 4 if s.shared_ffn else 1            # shared gate/up, router, shared_expert_gate: each its own cast
        out.append(Part("linear input casts (router" + (", shared expert, its gate)" if s.shared_ffn else ")"),
                        n * 2 * h, split=REPLICATED))
    if s.shared_ffn:
        out.append(Part("shared expert (gate, silu, up, product)", 4 * c * s.shared_ffn))
        out.append(Part("shared expert gate (sigmoid output, shared output)", c + c * h, split=REPLICATED))
    return out + _grouped_experts(regime, h=h, f=s.expert_ffn, E=s.experts, k=s.top_k, norm_topk=s.norm_topk)


def _llama4_moe(regime, s: Spec) -> list[Part]:
    h, f, E, k = s.hidden, s.expert_ffn, s.experts, s.top_k
    c = 4 if regime == "fp32" else 2
    n = 2 if regime == "bf16" else 4             # the norm output's dtype (fp32 under AMP)
    out = []
    if regime == "amp-bf16":
        out.append(Part("linear input casts (router, shared gate/up)", 3 * 2 * h, split=REPLICATED))
    out += [Part("router (top-k indices, fp32 sigmoid, scores column)", 8 * k + 4 * E + c * E, split=REPLICATED),
            Part("hidden repeated to every expert (saved by the score multiply)", n * E * h, split=EXPERTS),
            Part("scored expert input (saved by bmm)", c * E * h, split=EXPERTS),
            Part("experts over all tokens (gate_up, silu, product)", 4 * c * E * f, split=EXPERTS),
            Part("shared expert (gate, silu, up, product)", 4 * c * s.shared_ffn)]
    return out


def moe_2025_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                   seq_len, model=None) -> LayerBytes:
    """The mean decoder layer of a Qwen-MoE or Llama 4 text model (module docstring)."""
    _dropout_refused(dropout)
    if model is None:
        raise InvalidInputError("model", None, "the workload (the layer reads model.details)")
    s = spec_of(model)
    _check_chunk(s, seq_len)
    w = LayerWalk()
    _attention(w, attention, s, regime, tokens, seq_len)
    L, m = s.layers, s.moe_layers
    moe = _llama4_moe(regime, s) if s.arch == "llama4_text" else _qwen_moe(regime, s)
    mlp = _module(s, "mlp")
    _scaled(w, moe, m / L, f"MoE x {m}/{L}", mlp)
    _scaled(w, _dense_mlp(regime, s.hidden, s.dense_ffn), (L - m) / L, f"dense MLP x {L - m}/{L}", mlp)
    if s.arch != "llama4_text" and m:
        w.constant.append(Part(f"expert offsets (int32) x {m}/{L}", 4 * s.experts * m / L, split=REPLICATED,
                               module=mlp))
    r = 2 if regime == "bf16" else 4
    return w.layer(tokens, r * s.hidden * tokens, regime != "bf16")


def _check_chunk(s: Spec, seq_len: int):
    if s.arch == "llama4_text" and s.chunk and seq_len > s.chunk and s.rope_layers:
        raise NotModelledError(
            "seq_len", seq_len, f"at most attention_chunk_size={s.chunk} for a Llama 4 model",
            "past one chunk, Llama 4's RoPE layers attend within chunks through an explicit mask, which was "
            "not measured (at most one chunk the mask is the causal one and no mask tensor exists)")


def megatron_mlp(*, hidden, ffn, experts, top_k):
    raise NotModelledError("regime", "Megatron-Core (main-grad)",
                           "a regime that runs transformers' layers (fp32, bf16, fp16, mixed-bf16, fsdp-bf16)",
                           "Megatron-Core's layers are not modelled for Qwen-MoE and Llama 4 (shared experts, "
                           "QK-norm and Llama 4's dense expert dispatch differ from its MoE layer)")


# --- Llama 4's attention formulas and the terms around the layers ----------------------------------

def _llama4_sdpa(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads=ALL_GRAD, device="cuda"):
    return SDPA.saved(SEPARATE_QKV, kind=kind, dropout=dropout, heads=heads, q_dim=q_dim, kv_dim=kv_dim,
                      hidden=hidden, seq_len=seq_len, tokens=tokens, grads=grads)


def _llama4_eager(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads=ALL_GRAD, device="cuda"):
    """Eager attention without the fp32 softmax upcast (modeling_llama4.eager_attention_forward)."""
    c, q, S = (4 if kind == "fp32" else 2), q_dim, heads * seq_len
    scores = {"fp32": 4 * S, "bf16": 2 * S, "amp-bf16": 4 * S + 2 * S}[kind]
    return (Part("q/k/v (k, v repeated to all heads)", 3 * c * q),
            Part("attention scores (softmax in the scores' dtype)", scores, recomputed_by_selective=True),
            Part("attention output (contiguous, o_proj input)", c * q, weight_gradient_only=True))


def adjust_terms(kind, plan, placement, terms):
    """Llama 4: its RoPE table is one complex64 freqs_cis (b=1 positions: s x d/2 x 8 B) in every
    regime, not cos and sin in the residual dtype. Full checkpointing: the recomputed MoE layer's
    backward also holds the activation gradients of what the profile's working set leaves out
    (it counts two intermediates of one routed expert per token): the shared expert's (2 x fs) and,
    for Llama 4's dense dispatch, every expert's (2 x E x f instead of 2 x f)."""
    if kind != "model_activations":
        return terms
    s = spec_of(plan.model)
    out = list(terms)
    if s.arch == "llama4_text":
        cp = placement.sequence_shards
        out = [attrs.evolve(t, label="RoPE freqs_cis (complex64)" + (" (offloaded to host memory)" if t.tier == HOST else ""),
                            key=K.ROPE_FREQS_CIS,
                            nbytes=4 * plan.seq_len * s.head_dim / cp,
                            formula="s x head_dim/2 x 8 B (complex64)" + (f" / cp={cp}" if cp != 1 else ""))
               if t.key == K.ROPE_TABLES else t for t in out]     # (an offloaded host copy too)
    if whole_layers(plan) and s.moe_layers and plan.profile_options.lora is None:
        c = plan.profile_options.regime.compute
        T = plan.microbatch * plan.seq_len
        widths = (s.experts - s.top_k) * s.expert_ffn if s.arch == "llama4_text" else 0
        widths += s.shared_ffn
        if widths:
            extra = 2 * T * widths * c / placement.activation_shards
            out.append(MemoryTerm(
                component=ACTIVATIONS, label="recompute working set: the MoE block's other activation gradients",
                nbytes=extra, phases=(BACKWARD_END,),
                formula=f"2 x T x {widths} x {c} B (" + ("every expert's and " if s.arch == "llama4_text" else "")
                        + "the shared expert's intermediates, beyond one routed expert's)"))
    return out


def check(plan) -> tuple[str, ...]:
    s = spec_of(plan.model)
    _check_chunk(s, plan.seq_len)
    mixed = 0 < s.moe_layers < s.layers or (s.arch == "llama4_text" and 0 < s.rope_layers < s.layers)
    apart = plan.pp_size > 1 or not keeps_everything(plan) or plan.dp_size * plan.cp_size > 1
    notes = []
    if mixed and apart:
        notes.append(
            f"approximation: the {s.layers} layers ({s.moe_layers} MoE, {s.layers - s.moe_layers} dense"
            + (f"; {s.rope_layers} RoPE, {s.layers - s.rope_layers} NoPE" if s.arch == "llama4_text" else "")
            + ") are costed as their mean layer: exact for the whole model on one device, approximate where one "
              "layer or one stage counts apart (a pipeline stage's own mix, the layers recompute keeps, the "
              "one-layer recompute working set, FSDP's gathered layer)")
    return tuple(notes)


def _llama4_claims(model) -> bool:
    return _arch(model) == "llama4" and bool(model.is_sparse)


QWEN_MOE = ArchitectureFamily(
    name="qwen_moe", label="Qwen-MoE", sparse=True,
    description="Qwen1.5/2 MoE (shared expert with a sigmoid gate, q/k/v biases) and Qwen 3 MoE (QK-norm): "
                "transformers' grouped_mm experts, dense layers by mlp_only_layers / decoder_sparse_step "
                "(validated against PyTorch's MemTracker: validation/families/moe_2025)",
    architectures=("qwen2_moe", "qwen3_moe"), norm=RMS_NORM, positions="rotary", attention_layout=SEPARATE_QKV,
    layer_weights=layer_weights, parameter_tensors=parameter_tensors, matrix_shapes=matrix_shapes,
    layer=moe_2025_layer, megatron_mlp=megatron_mlp, lora_layer=None, assumptions=_assumptions,
    count_parameters=count_parameters, check=check, adjust_terms=adjust_terms, op_outputs=qwen_moe_ops)

LLAMA4 = ArchitectureFamily(
    name="llama4_text", label="Llama 4", sparse=True,
    description="Llama 4 text (Scout, Maverick): a shared expert and top-1 sigmoid-scored experts run densely "
                "over every token (bmm), interleaved dense layers, complex RoPE with L2 QK-norm, NoPE layers with "
                "temperature tuning (validated against PyTorch's MemTracker: validation/families/moe_2025)",
    architectures=("llama4_text",), claims=_llama4_claims, norm=RMS_NORM, positions="rotary",
    attention_layout=LLAMA4_LAYOUT, attention_layouts={"sdpa": _llama4_sdpa, "eager": _llama4_eager},
    layer_weights=layer_weights, parameter_tensors=parameter_tensors, matrix_shapes=matrix_shapes,
    layer=moe_2025_layer, megatron_mlp=megatron_mlp, lora_layer=None, assumptions=_assumptions,
    count_parameters=count_parameters, check=check, adjust_terms=adjust_terms)

FAMILIES = (QWEN_MOE, LLAMA4)


# --- under LoRA: what each part is made of (lora.generic_layer reads it) ------------------------------

_QKV = ("q_proj", "k_proj", "v_proj")


def _lora_tagged(layer):
    """The Qwen-MoE layer with its parts split for LoRA, bytes unchanged (the router and the experts frozen):
    a RMSNorm keeps its normalized x (fp32 4h, bf16 2h) only for its weight's gradient and its output for the
    next linears' (q/k/v after the input norm; after the post-attention norm the router's, a dense layer's
    gate/up's, the shared expert's: the experts' gather needs no input); the QK-norm's normalized q and k are
    its weights'; of the grouped_mm experts' ce x k x (2h + 4f) the gathered input (h) and the product (f) are
    their weights' (the gate_up output, silu output and down output stay: SiLU's and the routing weights'
    gradients); a dense MLP's product is down_proj's input. The shared expert (Qwen 1.5/2) and Llama 4's dense
    experts are not split (their parts stay whole: an upper bound)."""
    def tagged(**kw):
        lb = layer(**kw)
        regime, h, T = kw["regime"], kw["hidden"], kw["tokens"]
        q, kv = kw["heads"] * kw["head_dim"], kw["kv_heads"] * kw["head_dim"]
        readers_mid = ("router", "gate_proj", "up_proj", "shared_expert_gate")

        def norm(readers):
            return rms_norm_lora_parts(regime, h, T, readers)

        def split(p):
            n = p.name.split(": ", 1)[-1]
            if n == "input norm":
                return norm(_QKV)
            if n == "post-attention norm":
                return norm(readers_mid)
            if n == "q/k/v input casts":
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=_QKV),)
            if n.startswith("QK-norm"):
                normalized = (4 if regime == "fp32" else 2) * (q + kv) * T
                return (attrs.evolve(p, nbytes=p.nbytes - normalized),
                        Part("QK-norm normalized (its weights')", normalized, weight_gradient_only=True))
            if n.startswith("linear input casts (router") or n == "gate/up input casts":
                return (attrs.evolve(p, weight_gradient_only=True, inputs_of=readers_mid),)
            if n.startswith("experts (input, gate_up, silu, product, down)"):
                f = kw["ffn"]
                gone = p.nbytes * (h + f) / (2 * h + 4 * f)
                return (attrs.evolve(p, nbytes=p.nbytes - gone),
                        Part("experts' gathered input and product (their weights')", gone,
                             weight_gradient_only=True, split=EXPERTS))
            if n.startswith("mlp ("):
                return (attrs.evolve(p, nbytes=p.nbytes * 3 / 4),
                        Part("product (down_proj's input)", p.nbytes / 4, weight_gradient_only=True,
                             inputs_of=("down_proj",)))
            if p.weight_gradient_only:
                return (attrs.evolve(p, inputs_of=("o_proj",)),)
            return ()
        return attrs.evolve(lb, parts=tuple(attrs.evolve(p, lora=split(p)) for p in lb.parts))
    return tagged


_ROUTER = ("a TopKRouter holding its weight as a Parameter (F.linear), not an nn.Linear: peft's target_modules "
           "does not adapt it")
QWEN_MOE = attrs.evolve(QWEN_MOE, layer=_lora_tagged(QWEN_MOE.layer), lora_excluded={"router": _ROUTER})
LLAMA4 = attrs.evolve(LLAMA4, lora_excluded={"router": _ROUTER})
FAMILIES = (QWEN_MOE, LLAMA4)
