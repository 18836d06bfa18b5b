"""DeepSeek-V2 / V3 (and Kimi K2, a DeepSeek-V3): multi-head latent attention (MLA) and DeepSeek MoE.

Derived op by op from transformers 5.23 (``modeling_deepseek_v2.py``, ``modeling_deepseek_v3.py``;
torch 2.13) and checked to the byte against PyTorch's MemTracker (``validation/families/deepseek``).
Per token, h hidden, a heads, dn / dr / dv = qk_nope / qk_rope / v head dims (dqk = dn + dr: q and
k are dqk wide, v only dv: the two are unequal), qr = q_lora_rank, kvr = kv_lora_rank, c the compute
dtype's bytes (fp32 4, bf16 2), s the sequence.

MLA (``DeepseekV3Attention.forward``)
* The input RMSNorm as in a Llama layer: fp32 8h + 4 (normalized x, output), bf16 8h + 4 (fp32 copy,
  normalized, output, rsqrt). Its output is what q_proj / q_a_proj and kv_a_proj_with_mqa save.
* q: ``q_proj`` (saves the norm output: nothing new) or ``q_a_proj -> q_a_layernorm -> q_b_proj``:
  the RMSNorm over qr saves fp32 12qr + 4 (its input, q_a's output, normalized, output) and bf16
  8qr + 4 (fp32 copy, normalized, output; q_a's bf16 output dies).
* kv: ``kv_a_proj_with_mqa`` -> split (kvr | dr) -> ``kv_a_layernorm`` on the kvr part: fp32 saves
  the split's storage, kvr + dr wide (4(kvr + dr)), rsqrt, normalized and output (8 kvr); bf16 the
  fp32 copy of the kvr view (4 kvr), normalized and output (4 kvr), rsqrt. ``kv_b_proj`` saves the
  norm output. The rotary parts are rotated with cos/sin (V3) or complex freqs_cis (V2), which need
  no grad: the multiplies keep only the tables (``adjust_terms``), not q or k.
* ``kv_b_proj``'s output (a x (dn + dv)) holds k_nope and v: k_nope is copied into key_states
  (``expand_kv``), v stays a view of it.
* Attention (the family's own ``mla`` layout, per kernel and device):
  - SDPA on CPU: unequal q/k and v head sizes take the math kernel, which computes in fp32 whatever
    the inputs: scaled q and k copies (fp32, 8 a dqk), fp32 probabilities (4 a s), v (fp32: a view
    of kv_b_proj's output at batch 1, 4a(dn + dv), else a contiguous copy, 4 a dv; bf16: its fp32
    copy, 4 a dv), and the contiguous output o_proj saves (c a dv).
  - SDPA on a GPU (the default, ``device="cuda"``): no flash kernel for unequal head dims, the
    memory-efficient kernel: q, k (c 2a dqk), v a view of kv_b_proj's output (c a (dn + dv)), its
    output (c a dv: o_proj saves a view of it) and the fp32 logsumexp (a x s rounded up to 32).
    Not measured here (CPU only); never includes the CPU math kernel's s x s probabilities.
    (FlashAttention-2, ``attn_implementation="flash_attention_2"``, pads v to dqk: not modelled.)
  - eager: ``matmul(q, k^T)`` saves q and key_states (c 2a dqk), the fp32 softmax (4 a s; bf16:
    + its bf16 copy 2 a s), ``matmul(weights, v)`` v (a view of kv_b_proj's output at batch 1,
    else its contiguous copy) and o_proj the contiguous output (c a dv).
* The mid residual (fp32 4h; bf16 none: the next norm saves its fp32 copy) and the post-attention
  RMSNorm (8h + 4) as in a Llama layer.

DeepSeek MoE (``DeepseekV3MoE``): the first ``first_k_dense_replace`` layers have a dense gated MLP
of ``intermediate_size`` (4 c f); the others
* a router that runs in fp32: ``F.linear(x.float(), w.float())`` saves the fp32 input (bf16: a copy,
  4h; fp32: the norm output itself) and the fp32 weight (bf16: a copy, 4 E h per layer);
  V3: the weights are ``scores.gather(1, topk_indices)``: the sigmoid output (4E) and the top-k
  indices (8k) stay, and with ``norm_topk_prob`` the normalizing sum (4) and the normalized weights
  (4k); the group-limited selection (e_score_correction_bias, group top-2 sums, top-``topk_group``
  groups, masked scores, their top-k) ends in integer indices, so its autograd nodes and what they
  saved die with the router: group-limited routing keeps nothing per token beyond plain top-k.
  The ``routed_scaling_factor`` multiply saves nothing. V2: softmax output (4E), top-k indices (8k);
  ``group_limited_greedy`` takes the top-k of the masked scores, so masked_fill's mask (E) stays
  (the group maxima only choose groups: freed); V2 does not normalize.
* the routed experts as Mixtral's (transformers' default ``experts_implementation="grouped_mm"``):
  int64 indices 3 x 8k, int32 offsets 4E per layer, c k (2h + 4f), fp32 routing weights 4k;
* the shared experts, one gated MLP of n_shared x moe_intermediate_size (4 c f_shared).

The decoder layers differ (dense first, then MoE): the family's layer is the MEAN layer (the
attention whole, the dense MLP x dense/L, the MoE block x MoE/L; its weights likewise), whose sum
over the model's layers is exact on one device. Where one layer or one stage counts (a pipeline
stage's own mix of layers, full checkpointing's one-layer recompute working set, FSDP's gathered
layer) it is an approximation, said in a note (``check``).

Autocast (``amp-bf16``): the norms keep fp32 normalized x and each consuming linear its bf16 cast
(as in a Llama layer); the latent norms, q, k, v and the attention are pure bf16's; the router's
fp32 linear runs in bf16 under autocast; the experts (grouped_mm) in fp32.

Refused by name: Megatron-Core's layers (main-grad regimes), dropout > 0, attention kernels other than
sdpa and eager. LoRA has no walker (the profile refuses it).
"""

from __future__ import annotations

import math

import attrs

from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, HOST, OPTIMIZER_STEP, WEIGHTS, MemoryTerm

from ..families import RMS_NORM, ArchitectureFamily, LayerWeight
from .. import term_keys as K
from ..kernels import kernel_of
from ..layers import EXPERTS, REPLICATED, TP, LayerBytes, Part, LayerWalk

MLA = "mla"
V2, V3 = "deepseek_v2", "deepseek_v3"
ARCHITECTURES = (V2, V3, "kimi_k2")


# --- the model's sizes -------------------------------------------------------------------------

@attrs.frozen
class Sizes:
    """What MLA and DeepSeek MoE need, read from ``model.details`` (raw config keys) and the
    workload fields, with the architecture's documented defaults where a key is missing."""

    v3: bool
    hidden: int
    heads: int
    layers: int
    vocab: int
    tied: bool
    q_lora_rank: int | None
    kv_lora_rank: int
    nope: int
    rope: int
    v_dim: int
    dense_layers: int
    dense_ffn: int
    experts: int
    top_k: int
    expert_ffn: int
    shared: int
    n_group: int
    topk_group: int
    group_limited: bool       # V2: topk_method == "group_limited_greedy"; V3 always
    norm_topk_prob: bool
    attention_bias: bool
    mlp_bias: bool
    assumed: tuple[str, ...] = ()

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers

    @property
    def qk_dim(self) -> int:
        return self.nope + self.rope

    @property
    def shared_ffn(self) -> int:
        return self.shared * self.expert_ffn


# transformers 5.23's DeepseekV2Config / DeepseekV3Config defaults
_DEFAULTS = {
    V2: dict(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
             first_k_dense_replace=0, n_shared_experts=2, n_group=None, topk_group=None, topk_method="greedy"),
    V3: dict(q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
             first_k_dense_replace=3, n_shared_experts=1, n_group=8, topk_group=4, topk_method=None),
}


def _is_v3(model) -> bool:
    return (model.architecture or "").lower() != V2


def sizes(model) -> Sizes:
    """``model``'s MLA and MoE sizes (see ``Sizes``)."""
    d = model.details
    v3 = _is_v3(model)
    defaults = _DEFAULTS[V3 if v3 else V2]
    assumed = []

    def get(key, fallback=None):
        if key in d:
            return d[key]
        if fallback is not None:
            return fallback
        value = defaults[key]
        if value is not None:
            assumed.append(f"{key}={value} assumed (the {'DeepSeek-V3' if v3 else 'DeepSeek-V2'} default; "
                           f"not in model.details)")
        return value

    # from_hf_config copies the raw keys that are not null: a config's kv_lora_rank without its
    # q_lora_rank said q_lora_rank: null (no query compression: q_proj)
    q_lora = d.get("q_lora_rank") if "q_lora_rank" in d or "kv_lora_rank" in d else get("q_lora_rank")
    kv_lora = get("kv_lora_rank", model.kv_lora_rank)
    rope = get("qk_rope_head_dim", getattr(model, "qk_rope_head_dim", None))
    nope = get("qk_nope_head_dim", (model.head_dim - rope) if model.head_dim and rope else None)
    v_dim = get("v_head_dim")
    layers = model.layers
    dense = d.get("dense_layers")
    if dense is None:
        dense = min(get("first_k_dense_replace"), layers)
    experts = model.experts if model.is_sparse else 0
    top_k = model.active_experts_per_token if model.is_sparse else 0
    expert_ffn = (model.expert_ffn_dim if model.is_sparse else None) or d.get("moe_intermediate_size") or model.ffn_dim
    shared = getattr(model, "shared_experts", None)
    if shared is None:
        shared = get("n_shared_experts")
    method = d.get("topk_method") or defaults["topk_method"]
    group_limited = v3 or method == "group_limited_greedy"
    n_group = get("n_group") if group_limited else None
    topk_group = get("topk_group") if group_limited else None
    norm = d.get("norm_topk_prob")
    if norm is None:
        norm = v3
        if v3:
            assumed.append("norm_topk_prob=True assumed (the DeepSeek-V3 default; not in model.details)")
    return Sizes(v3=v3, hidden=model.hidden_dim, heads=model.heads, layers=layers, vocab=model.vocab_size,
                 tied=bool(model.tied_embeddings), q_lora_rank=q_lora, kv_lora_rank=kv_lora, nope=nope, rope=rope,
                 v_dim=v_dim, dense_layers=dense, dense_ffn=model.ffn_dim or 0, experts=experts, top_k=top_k,
                 expert_ffn=expert_ffn, shared=shared or 0, n_group=n_group or 1, topk_group=topk_group or 1,
                 group_limited=group_limited, norm_topk_prob=bool(norm) and v3,
                 attention_bias=bool(d.get("attention_bias", False)), mlp_bias=bool(d.get("mlp_bias", False)) and not v3,
                 assumed=tuple(assumed))


def _assumptions(model) -> tuple[str, ...]:
    return sizes(model).assumed


# --- parameters ----------------------------------------------------------------------------------

def _attention_tensors(z: Sizes) -> list[tuple[str, tuple[int, int]]]:
    """(name, (rows, cols)) of one layer's attention parameters in registration order (cols 0: a vector)."""
    h, a = z.hidden, z.heads
    out = []
    if z.q_lora_rank is None:
        out.append(("q_proj", (a * z.qk_dim, h)))
    else:
        out.append(("q_a_proj", (z.q_lora_rank, h)))
        if z.attention_bias:
            out.append(("q_a_proj.bias", (z.q_lora_rank, 0)))
        out += [("q_a_layernorm", (z.q_lora_rank, 0)), ("q_b_proj", (a * z.qk_dim, z.q_lora_rank))]
    out.append(("kv_a_proj_with_mqa", (z.kv_lora_rank + z.rope, h)))
    if z.attention_bias:
        out.append(("kv_a_proj_with_mqa.bias", (z.kv_lora_rank + z.rope, 0)))
    out += [("kv_a_layernorm", (z.kv_lora_rank, 0)), ("kv_b_proj", (a * (z.nope + z.v_dim), z.kv_lora_rank)),
            ("o_proj", (h, a * z.v_dim))]
    if z.attention_bias:
        out.append(("o_proj.bias", (h, 0)))
    return out


def _mlp_tensors(z: Sizes, f: int, prefix: str) -> list:
    h, out = z.hidden, []
    for name, shape, bias in (("gate_proj", (f, h), f), ("up_proj", (f, h), f), ("down_proj", (h, f), h)):
        out.append((prefix + name, shape))
        if z.mlp_bias:
            out.append((prefix + name + ".bias", (bias, 0)))
    return out


def _layer_tensors(z: Sizes, moe: bool, attention: list) -> list:
    """One decoder layer's parameters in registration order: self_attn (``attention``), mlp, the
    two norms. Expert stacks (E, r, c) as E matrices (r, c), the way a factored optimizer sees them."""
    h, E, f = z.hidden, z.experts, z.expert_ffn
    out = list(attention)
    if moe:
        out += [("experts.gate_up_proj", (E, 2 * f, h)), ("experts.down_proj", (E, h, f)), ("gate", (E, h))]
        out += _mlp_tensors(z, z.shared_ffn, "shared_experts.")
    else:
        out += _mlp_tensors(z, z.dense_ffn, "")
    return out + [("input_layernorm", (h, 0)), ("post_attention_layernorm", (h, 0))]


def _model_tensors(z: Sizes, attention: list | None = None) -> list:
    """The model's parameters in registration order; ``attention``: one layer's attention tensors
    (default MLA's, ``_attention_tensors``; GLM-4.5 gives its own)."""
    attention = _attention_tensors(z) if attention is None else attention
    out = [("embed_tokens", (z.vocab, z.hidden))]
    for i in range(z.layers):
        out += _layer_tensors(z, i >= z.dense_layers, attention)
    out.append(("norm", (z.hidden, 0)))
    if not z.tied:
        out.append(("lm_head", (z.vocab, z.hidden)))
    return out


def _elements(shape) -> int:
    if len(shape) == 3:
        return shape[0] * shape[1] * shape[2]
    rows, cols = shape
    return rows * cols if cols else rows


def _parameter_tensors(shape) -> tuple[int, ...]:
    return tuple(_elements(s) for _, s in _model_tensors(sizes(shape.model)))


def _matrices(tensors) -> list:
    """(rows, cols) of each matrix of ``tensors`` ((name, shape) pairs), an expert stack as E matrices."""
    out = []
    for _, s in tensors:
        out += [(s[1], s[2])] * s[0] if len(s) == 3 else [s]
    return out


def _matrix_shapes(shape) -> list:
    return _matrices(_model_tensors(sizes(shape.model)))


def _count_parameters(model) -> int:
    return sum(_elements(s) for _, s in _model_tensors(sizes(model)))


W = LayerWeight


def _weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None) -> tuple[LayerWeight, ...]:
    """The mean layer's weights (module docstring): the attention whole, the dense MLP x dense/L,
    the MoE block x MoE/L. Tensor parallelism as Megatron-Core's MLA splits it: the down
    projections (q_a, kv_a) and the latent norms replicated, q_b / q_proj / kv_b column-parallel,
    o_proj row-parallel; the router replicated, the experts over ep x expert_tp."""
    z = sizes(model)
    replicated = {"q_a_proj", "q_a_proj.bias", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_proj_with_mqa.bias",
                  "kv_a_layernorm", "o_proj.bias"}
    out = []
    for name, s in _attention_tensors(z):
        out.append(W(name, _elements(s), split=REPLICATED if name in replicated else TP,
                     autocast=s[1] != 0, bias=name.endswith(".bias")))
    return tuple(out) + _mlp_weights(z)


def _mlp_weights(z: Sizes) -> tuple[LayerWeight, ...]:
    """The mean layer's dense MLP x dense/L and MoE block x MoE/L weights (the router replicated,
    the experts over ep x expert_tp, not autocast: grouped_mm)."""
    dense, moe = z.dense_layers / z.layers, z.moe_layers / z.layers
    out = []
    if dense:
        out += [W(f"dense mlp x {z.dense_layers}/{z.layers}: {n}", _elements(s) * dense,
                  split=REPLICATED if n == "down_proj.bias" else TP, bias=n.endswith(".bias"))
                for n, s in _mlp_tensors(z, z.dense_ffn, "")]
    if moe:
        label = f"moe x {z.moe_layers}/{z.layers}"
        out += [W(f"{label}: router", z.experts * z.hidden * moe, split=REPLICATED),
                W(f"{label}: experts.gate_up", z.experts * 2 * z.expert_ffn * z.hidden * moe, split=EXPERTS,
                  autocast=False),
                W(f"{label}: experts.down", z.experts * z.hidden * z.expert_ffn * moe, split=EXPERTS, autocast=False)]
        out += [W(f"{label}: {n}", _elements(s) * moe, split=REPLICATED if n.endswith("down_proj.bias") else TP,
                  bias=n.endswith(".bias"))
                for n, s in _mlp_tensors(z, z.shared_ffn, "shared_experts.")]
    return tuple(out)


# --- attention (the "mla" layout) ------------------------------------------------------------

def _c(kind: str) -> int:
    return 4 if kind == "fp32" else 2


def _v_parts(kind, a, nope, v, batch1, *, fp32_copy_in_bf16: bool):
    """v as the batched matmul saves it: a view of kv_b_proj's output (a x (dn + dv) wide) when
    (b, a, s, dv) flattens to (b*a, s, dv) without a copy (batch 1), else a contiguous copy."""
    c = _c(kind)
    if kind != "fp32" and fp32_copy_in_bf16:
        return Part("v (fp32 copy, math kernel)", 4 * a * v)
    if batch1:
        return Part("v (a view of kv_b_proj's output: k_nope and v)", c * a * (nope + v))
    return Part("v (contiguous copy for the batched matmul)", c * a * v)


def _mla_sdpa(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads, device="cuda", mla=None):
    nope, rope, v = mla
    a, c, dqk = heads, _c(kind), nope + rope
    if device == "cpu":
        # CPU: unequal q/k and v head dims -> the math kernel, in fp32 whatever the inputs.
        return (Part("q, k (fp32 scaled copies, math kernel)", 8 * a * dqk),
                Part("attention probabilities (fp32, s x s, math kernel)", 4 * a * seq_len,
                     recomputed_by_selective=True),
                _v_parts(kind, a, nope, v, tokens == seq_len, fp32_copy_in_bf16=True),
                Part("attention output (contiguous, o_proj input)", c * a * v, weight_gradient_only=True))
    # A GPU: the memory-efficient kernel (no flash kernel for unequal head dims); its logsumexp is
    # padded to a multiple of 32 positions.
    lse = 4 * a * (math.ceil(seq_len / 32) * 32) / seq_len
    return (Part("q, k", c * 2 * a * dqk),
            Part("v (a view of kv_b_proj's output: k_nope and v)", c * a * (nope + v)),
            Part("attention output (o_proj input) + logsumexp (fp32)", c * a * v + lse))


def _mla_eager(*, kind, dropout, heads, q_dim, kv_dim, hidden, seq_len, tokens, grads, device="cuda", mla=None):
    nope, rope, v = mla
    a, c, dqk = heads, _c(kind), nope + rope
    scores = 4 * a * seq_len + (2 * a * seq_len if kind != "fp32" else 0)   # fp32 softmax (+ its bf16 copy)
    return (Part("q, k (query_states, key_states)", c * 2 * a * dqk),
            Part("attention scores", scores, recomputed_by_selective=True),
            _v_parts(kind, a, nope, v, tokens == seq_len, fp32_copy_in_bf16=False),
            Part("attention output (contiguous, o_proj input)", c * a * v, weight_gradient_only=True))


# --- one (mean) layer --------------------------------------------------------------------------

def _router_per_token(z: Sizes, kind: str) -> float:
    """What the router keeps per token. Only the graph the routing weights hang from survives
    the forward: V3's group selection (group top-2 sums, group top-k, the masked scores and their
    top-k) yields integer indices, so its nodes and what they saved die with the router; the
    weights are ``scores.gather(1, topk_indices)``: sigmoid's output and the gather's index stay.
    Under autocast the router's ``F.linear(x.float(), w.float())`` runs in bf16 (a bf16 cast of
    the input; V3's sigmoid, sum and weights in bf16; V2's softmax is fp32 by its dtype)."""
    E, k = z.experts, z.top_k
    amp = kind == "amp-bf16"
    b = {"fp32": 0, "bf16": 4 * z.hidden, "amp-bf16": 2 * z.hidden}[kind]    # the router input's copy / cast
    s = 2 if amp and z.v3 else 4                       # the scores' dtype
    b += s * E + 8 * k                                 # sigmoid / softmax output, top-k indices
    if z.v3:
        if z.norm_topk_prob:
            b += s + s * k                             # the sum and the normalized weights
    elif z.group_limited:
        b += E                                         # masked_fill's mask (the weights are the masked top-k)
    return b


def deepseek_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                   seq_len, model=None) -> LayerBytes:
    """The mean DeepSeek decoder layer (module docstring)."""
    z = sizes(model)
    if dropout:
        raise _dropout_refused()
    amp = regime == "amp-bf16"
    h = hidden
    # RMSNorm: fp32 / bf16 keep the normalized x and the output (bf16: + its fp32 copy); AMP the fp32
    # normalized x only, every consuming linear its own bf16 cast of the output.
    norm = 4 * h + 4 if amp else 8 * h + 4
    w = LayerWalk()
    w.add("input norm", norm, REPLICATED)
    if amp:
        w.add("q / kv_a input casts", 2 * 2 * h, REPLICATED)
    if z.q_lora_rank is not None:
        w.add("q_a_layernorm", (12 if regime == "fp32" else 8) * z.q_lora_rank + 4, REPLICATED)
    kvr = z.kv_lora_rank
    w.add("kv_a_layernorm", (4 * (kvr + z.rope) + 8 * kvr if regime == "fp32" else 8 * kvr) + 4, REPLICATED)
    try:
        # under autocast q, k, v are bf16 (linear outputs): the attention is pure bf16's
        parts = attention(kind="bf16" if amp else regime, dropout=False, heads=heads, q_dim=heads * z.qk_dim,
                          kv_dim=heads * z.v_dim, hidden=h, seq_len=seq_len, tokens=tokens,
                          mla=(z.nope, z.rope, z.v_dim))
    except TypeError:
        raise NotModelledError("attention", "a kernel without an MLA formula",
                               "sdpa or eager for multi-head latent attention",
                               "the attention kernel has no formula for DeepSeek's MLA layout") from None
    w.extend(parts)
    w.add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, REPLICATED)
    w.add("post-attention norm", norm, REPLICATED)
    _add_mlp(w, z, regime, h)
    r = 2 if regime == "bf16" else 4
    return w.layer(tokens, r * h * tokens, regime != "bf16")


def _add_mlp(w: LayerWalk, z: Sizes, regime: str, h: int) -> None:
    """The mean layer's dense MLP x dense/L and MoE block x MoE/L (router, grouped_mm experts,
    shared experts) added to ``w`` (module docstring); ``h`` the hidden size."""
    amp, c = regime == "amp-bf16", _c(regime)
    dense, moe = z.dense_layers / z.layers, z.moe_layers / z.layers
    casts = 2 * 2 * h if amp else 0                   # gate / up input casts under autocast
    if dense:
        w.add(f"dense mlp x {z.dense_layers}/{z.layers} (input casts, gate, silu, up, product)",
              (casts + 4 * c * z.dense_ffn) * dense)
    if moe:
        E, k, f = z.experts, z.top_k, z.expert_ffn
        ce = 2 if regime == "bf16" else 4              # grouped_mm runs in the weights' dtype
        label = f"moe x {z.moe_layers}/{z.layers}"
        w.add(f"{label}: router ({'sigmoid, group-limited top-k' if z.v3 else 'softmax top-k'})",
              _router_per_token(z, regime) * moe, REPLICATED)
        w.add(f"{label}: expert indices (perm // k, perm, inv_perm)", 3 * 8 * k * moe, REPLICATED)
        w.add(f"{label}: experts (input, gate_up, silu, product, down)", ce * k * (2 * h + 4 * f) * moe, EXPERTS)
        w.add(f"{label}: routing weights", (2 if amp and z.v3 else 4) * k * moe, REPLICATED)
        if z.shared:
            w.add(f"{label}: shared experts (input casts, gate, silu, up, product)",
                  (casts + 4 * c * z.shared_ffn) * moe)
        w.constant.append(Part(f"{label}: expert offsets", 4 * E * moe, split=REPLICATED))
        if regime == "bf16":
            w.constant.append(Part(f"{label}: router weight's fp32 copy", 4 * E * h * moe, split=REPLICATED))


def _megatron_mlp(*, hidden, ffn, experts, top_k):
    raise NotModelledError("regime", "Megatron-Core (main-grad)",
                           "a regime that runs transformers' DeepSeek layers (fp32, bf16, fp16, mixed-bf16, fsdp-bf16)",
                           "Megatron-Core's MLA and DeepSeek MoE layers are not modelled")


def _dropout_refused():
    return NotModelledError("dropout", "> 0", "0.0 for a DeepSeek model",
                            "attention dropout was not measured for MLA (validation/families/deepseek runs without)")


# --- the run and the terms outside the layers ------------------------------------------------

def _check(plan) -> tuple[str, ...]:
    o = plan.profile_options
    regime = o.regime
    if regime.main_grad:
        raise _megatron_mlp(hidden=0, ffn=0, experts=0, top_k=0)
    if o.dropout:
        raise _dropout_refused()
    kernel = kernel_of(plan)
    if not (kernel.sdpa or kernel.eager):       # what the kernel declares it computes, not its name
        raise NotModelledError("attention", kernel.name, "sdpa or eager for a DeepSeek model",
                               "multi-head latent attention has formulas for those kernels only (a kernel "
                               "declaring computes='sdpa' or 'eager')")
    z = sizes(plan.model)
    notes = []
    if kernel.sdpa:
        notes.append("MLA attention under sdpa: " + (
            "the CPU math kernel (unequal q/k and v head dims: fp32 q, k, v and s x s probabilities)"
            if o.device == "cpu" else
            "the memory-efficient kernel (no flash kernel for unequal q/k and v head dims; not measured: "
            "validation ran on CPU)"))
    if z.dense_layers and z.moe_layers:
        notes += mean_layer_note(plan, "DeepSeek", f"{z.dense_layers} dense, {z.moe_layers} MoE")
    return tuple(notes)


def mean_layer_note(plan, layers: str, mix: str) -> list[str]:
    """The note, if any, that ``layers`` layers (``mix``: the kinds mixed) costed as their mean are
    an approximation: where one stage's own mix or one layer's recompute working set counts."""
    where = []
    if plan.pp_size > 1:
        where.append("a pipeline stage holds the mean of the model's layers, not its own mix")
    from ..checkpointing import keeps_everything
    if not keeps_everything(plan):
        where.append("the one-layer recompute working set is the mean layer's")
    if not where:
        return []
    return [f"approximation: the {layers} layers are costed as their mean ({mix}: exact in sum on one device); "
            + "; ".join(where)]


def score_bias_buffers(experts: int, layers: float) -> MemoryTerm:
    """The routers' fp32 ``e_score_correction_bias`` buffers: E per MoE layer (``layers`` on this stage)."""
    return MemoryTerm(component=WEIGHTS, label="routers' e_score_correction_bias buffers (fp32)",
                      nbytes=4 * experts * layers, phases=(FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP),
                      formula=f"{layers:g} MoE layers x {experts} experts x 4 B")


def _adjust(kind, plan, placement, terms):
    """RoPE: DeepSeek rotates qk_rope_head_dim dimensions (config.head_dim), not the q/k head:
    its inv_freq buffers (fp32, 2 x dr/2) and the tables: V3 cos and sin (2 x s x dr in the
    embeddings' dtype), V2 one complex64 freqs_cis (s x dr/2 x 8 B). V3 routers keep an fp32
    ``e_score_correction_bias`` buffer (E per MoE layer)."""
    z = sizes(plan.model)
    out = []
    for t in terms:
        if t.key == K.ROPE_BUFFERS:
            t = attrs.evolve(t, nbytes=4 * z.rope, formula=f"2 x qk_rope_head_dim/2 = {z.rope // 2} x 4 B (fp32)")
        elif t.key == K.ROPE_TABLES:    # (an offloaded host copy too: the pack hook copies the table as it is)
            cp = placement.sequence_shards
            if z.v3:
                b = 4 if plan.profile_options.regime.residual == 4 else 2
                nbytes, formula = 2 * plan.seq_len * z.rope * b, f"cos, sin: 2 x s x qk_rope_head_dim x {b} B"
            else:
                nbytes, formula = 4 * plan.seq_len * z.rope, "freqs_cis: s x qk_rope_head_dim/2 x 8 B (complex64)"
            host = " (offloaded to host memory)" if t.tier == HOST else ""
            t = attrs.evolve(t, label="RoPE tables" + host if not z.v3 else t.label, nbytes=nbytes / cp,
                             key=t.key if z.v3 else K.ROPE_FREQS_CIS,    # V2's complex64 table: not cos/sin
                             formula=formula + (f" / cp={cp}" if cp != 1 else ""))
        out.append(t)
    if kind == "weights" and z.v3 and z.moe_layers:
        share = placement.layers_per_stage / z.layers
        out.append(score_bias_buffers(z.experts, z.moe_layers * share))
    return out


FAMILIES = (
    ArchitectureFamily(
        name="deepseek", label="DeepSeek", sparse=True,
        description="multi-head latent attention (q/kv low-rank projections, unequal q/k and v head dims) and "
                    "DeepSeek MoE (first-k dense layers, shared experts, softmax or sigmoid group-limited routing) "
                    "(DeepSeek-V2/V3, Kimi K2; validated against PyTorch's MemTracker)",
        architectures=ARCHITECTURES,
        norm=RMS_NORM, positions="rotary", attention_layout=MLA, layer_weights=_weights,
        parameter_tensors=_parameter_tensors, matrix_shapes=_matrix_shapes, layer=deepseek_layer,
        megatron_mlp=_megatron_mlp, assumptions=_assumptions, count_parameters=_count_parameters, check=_check,
        adjust_terms=_adjust, attention_layouts={"sdpa": _mla_sdpa, "eager": _mla_eager},
        # LoRA without targets: the latent attention's projections (those the model has)
        lora_default_targets=("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")),
)
