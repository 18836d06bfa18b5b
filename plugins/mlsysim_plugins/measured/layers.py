"""Bytes one transformer decoder layer keeps alive after its forward, during training.

Closed forms for Hugging Face decoder layers (transformers 5.23, torch 2.13, CPU kernels), derived
op by op from what autograd saves for backward. Each architecture family (``families.py``) has its
own layer walker here (``llama_layer``, ``gpt2_layer``, ``mixtral_layer``); the attention's part comes
from the attention kernel (``kernels.py``). ``layer_forward_bytes`` returns them as ``LayerBytes``:

* ``saved``  -- what the layer's autograd graph keeps for backward, *excluding* the layer's input
  (the previous layer's output) and AMP's cached bf16 weight copies (see ``amp_weight_copies``);
* ``output`` -- the layer's output tensor (the residual stream);
* ``output_saved_by_next`` -- whether the next layer (or the final norm) keeps that output for
  its own backward; if not, the output dies once the next layer's forward is done.

``saved + output`` (+ ``amp_weight_copies`` under AMP) is the growth of live memory across the
layer's forward, which is what ``validation/measurements.json`` records per decoder layer as
``layer_forward_retained_bytes``. Its ``parts`` are ``Part`` objects: each says how tensor
parallelism splits it (``split``) and whether selective recompute drops it
(``recomputed_by_selective``); the parallel and checkpointing code reads those fields, never names.

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

from .._evolve import evolve
from .._lazy import lazy_module

# (families.py and kernels.py import this module: reached through stand-ins, not imports in the functions)
_families = lazy_module(globals(), "_families", "mlsysim_plugins.measured.families")
_kernels = lazy_module(globals(), "_kernels", "mlsysim_plugins.measured.kernels")

REGIMES = ("fp32", "amp-bf16", "bf16")

# How tensor parallelism splits a saved tensor (Korthikanti et al. 2022, Table 2):
TP = "tp"                   # inside the column/row-parallel region: / tp always
REPLICATED = "replicated"   # the norms, the parallel linears' inputs, what follows the row-parallel
                            # ones: replicated on every tp rank, / tp only with sequence parallelism
EXPERTS = "experts"         # the routed experts' activations: / expert_tp
SPLITS = (TP, REPLICATED, EXPERTS)


def _split(instance, attribute, value):
    if value not in SPLITS:
        raise ValueError(f"Part.split {value!r}; expected one of {SPLITS}")


@attrs.frozen
class Part:
    """A named piece of what a layer saves: its bytes (per token inside a layer walker, per
    layer in ``LayerBytes.parts``), how tensor parallelism splits it, whether selective
    recompute drops it (recomputed in the backward), and whether it is kept only for the
    weight gradient of the linear that reads it (a frozen linear, under LoRA, keeps none).

    ``op``: the aten op(s) whose output the part is ("mm", "sdpa", "mm+silu+mm+mul", ...; "" when
    not tagged) and ``module``: the HF submodule that saves it ("attention", "mlp", or "" for the
    norms and the residual stream); per-op and module checkpointing policies read them
    (``mlsysim_plugins.checkpointing_policies``)."""

    name: str
    nbytes: int | float
    split: str = attrs.field(default=TP, validator=_split, kw_only=True)
    recomputed_by_selective: bool = attrs.field(default=False, kw_only=True)
    weight_gradient_only: bool = attrs.field(default=False, kw_only=True)
    op: str = attrs.field(default="", kw_only=True)
    module: str = attrs.field(default="", kw_only=True)
    # Under LoRA (``lora.generic_layer``): ``inputs_of`` names the linears (module names as the family's
    # layer weights give them, or their last component) that read this tensor as their input; with
    # ``weight_gradient_only`` it is kept only for their weight gradients (under autocast: their casts, one
    # per linear). ``lora``: what this part is made of, for LoRA (sub-parts, so tagged); empty: itself.
    # Neither changes full training's bytes.
    inputs_of: tuple[str, ...] = attrs.field(default=(), converter=tuple, kw_only=True)
    lora: tuple = attrs.field(default=(), converter=tuple, kw_only=True)


def rms_norm_lora_parts(regime: str, hidden: int, tokens: int, readers: tuple[str, ...]) -> tuple[Part, ...]:
    """What an RMSNorm saves, split for LoRA (``Part.lora``): the rsqrt (with the bf16 regime's fp32
    copy of the input), the normalized input its weight's gradient reads and, outside autocast,
    the output the ``readers`` linears keep for their weight gradients (under autocast those keep
    their own casts)."""
    T, h = tokens, hidden
    if regime == "amp-bf16":
        return (Part("rsqrt", 4 * T), Part("normalized (its weight's)", 4 * h * T, weight_gradient_only=True))
    b = 4 if regime == "fp32" else 2
    return (Part("rsqrt" + (" + fp32 copy of the input" if regime == "bf16" else ""),
                 (4 + (4 * h if regime == "bf16" else 0)) * T),
            Part("normalized (its weight's)", b * h * T, weight_gradient_only=True),
            Part("output", b * h * T, weight_gradient_only=True, inputs_of=readers))


@attrs.frozen(kw_only=True)
class LayerBytes:
    saved: int                   # kept for backward; excludes the layer's input and AMP weight copies
    output: int                  # the layer's output tensor
    output_saved_by_next: bool   # the next layer / final norm saves this output for its backward
    parts: tuple[Part, ...] = ()   # the pieces of ``saved``, in bytes per layer

    @property
    def retained(self) -> int:
        """Growth of live memory across the layer's forward (without AMP weight copies)."""
        return self.saved + self.output


class LayerWalk:
    """The parts of one layer, per token (and per layer: ``constant``), as a walker adds them: the
    public helper a family's ``layer`` walker builds its ``LayerBytes`` with (the built-in walkers
    below and every family in ``architectures/`` use it)::

        w = LayerWalk()
        w.add("input norm", 4 * hidden + 4, REPLICATED, op="rsqrt")      # bytes per token, TP split
        w.extend(attention(kind=regime, ...), module="attention")         # the kernel's parts
        w.add("mlp", 4 * c * ffn, op="mm+silu+mm+mul", module="mlp")
        w.constant.append(Part("expert offsets", 4 * experts, split=REPLICATED))   # per layer
        return w.layer(tokens, output_bytes, output_saved_by_next)

    ``add`` skips a zero part; ``layer(tokens, output, output_saved_by_next)`` multiplies the per-token
    parts by ``tokens`` and sums them into ``LayerBytes.saved``."""

    def __init__(self):
        self.parts: list[Part] = []
        self.constant: list[Part] = []

    def add(self, name: str, per_token, split: str = TP, *, op: str = "", module: str = "",
            lora=()) -> None:
        if per_token:      # (``Part(...)``, its checks made here: a walker adds a part per op, every solve)
            self.parts.append(_make(name, per_token, split, False, False, op, module, (), lora)
                              if split in SPLITS and type(lora) is tuple else
                              Part(name, per_token, split=split, op=op, module=module, lora=lora))

    def extend(self, parts, module: str = "") -> None:
        self.parts.extend((_make(p.name, p.nbytes, p.split, p.recomputed_by_selective, p.weight_gradient_only, p.op,
                                 module, p.inputs_of, p.lora) if type(p) is Part else evolve(p, module=module))
                          if module and not p.module else p for p in parts if p.nbytes)

    def layer(self, tokens: int, output: int, output_saved_by_next: bool) -> LayerBytes:
        per_layer = tuple(_per_layer(p, tokens) for p in self.parts) + tuple(self.constant)
        return LayerBytes(saved=sum(p.nbytes for p in per_layer), output=output,
                          output_saved_by_next=output_saved_by_next, parts=per_layer)


_new = object.__new__
# (``_make`` sets every field of ``Part``: a field added to ``Part`` is added there too.)
assert tuple(a.name for a in attrs.fields(Part)) == ("name", "nbytes", "split", "recomputed_by_selective",
                                                     "weight_gradient_only", "op", "module", "inputs_of", "lora")
# Each slot's own setter (``Part`` is a slotted attrs class; ``object.__setattr__(q, name, value)`` looks the
# slot up by name each time): a walk makes a part per op and per token count, every uncached solve.
(_name, _nbytes, _split_of, _recomputed, _weight_gradient_only, _op, _module, _inputs_of, _lora) = (
    Part.__dict__[a.name].__set__ for a in attrs.fields(Part))


def _per_layer(p: Part, tokens: int) -> Part:
    """``evolve(p, nbytes=p.nbytes * tokens, lora=<its LoRA sub-parts' bytes x tokens>)``: the part for
    ``tokens`` tokens (every uncached solve: issue 27, item 5)."""
    return _with(p, p.nbytes * tokens, tuple(_with(q, q.nbytes * tokens, q.lora) for q in p.lora) if p.lora else ())


def _with(p: Part, nbytes, lora: tuple) -> Part:
    """``evolve(p, nbytes=nbytes, lora=lora)`` (``lora`` a tuple). A ``Part`` itself (checked when it
    was made; ``nbytes`` has no check) is copied field by field, without ``Part``'s checks and
    converters; anything else (a subclass) goes through ``evolve``."""
    if type(p) is not Part:
        return evolve(p, nbytes=nbytes, lora=lora)
    return _make(p.name, nbytes, p.split, p.recomputed_by_selective, p.weight_gradient_only, p.op, p.module,
                 p.inputs_of, lora)


def _make(name, nbytes, split, recomputed_by_selective, weight_gradient_only, op, module, inputs_of, lora) -> Part:
    """A ``Part`` of these fields, set one by one through each slot's setter: for values ``Part``'s checks
    and converters would leave as they are (``split`` one of ``SPLITS``, ``inputs_of`` and ``lora`` tuples)."""
    q = _new(Part)
    _name(q, name)
    _nbytes(q, nbytes)
    _split_of(q, split)
    _recomputed(q, recomputed_by_selective)
    _weight_gradient_only(q, weight_gradient_only)
    _op(q, op)
    _module(q, module)
    _inputs_of(q, inputs_of)
    _lora(q, lora)
    return q


_Walk = LayerWalk       # its former, private name (kept for families written against it)


def layer_forward_bytes(*, family=None, style=None, hidden: int, heads: int, kv_heads: int, head_dim: int,
                        ffn: int, regime: str, attention, dropout: bool, tokens: int, seq_len: int,
                        experts: int = 0, top_k: int = 0, model=None, device: str = "cuda") -> LayerBytes:
    """Bytes one decoder layer keeps alive after its forward (see the module docstring).

    ``family``: an ``ArchitectureFamily`` or a built-in one's name (``style`` is the same, by
    its old name); ``attention``: an ``AttentionKernel`` or a built-in one's name; ``device``:
    ``"cuda"`` or ``"cpu"`` (a family's own attention formulas may differ by device)."""
    family, kernel = _resolve(family, style, attention)
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; expected one of {REGIMES}")
    if family.sparse and (experts < 1 or top_k < 1):
        raise ValueError(f"{family.name} style needs experts >= 1 and top_k >= 1")
    return family.layer_bytes(kernel=kernel, device=device, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                              ffn=ffn, experts=experts, top_k=top_k, regime=regime, dropout=dropout, tokens=tokens,
                              seq_len=seq_len, model=model)


def _resolve(family, style, attention):
    return _families.resolve_family(family if family is not None else style), _kernels.resolve(attention)


# --- Hugging Face layers, family by family ----------------------------------------------------

def gpt2_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
               seq_len, model=None) -> LayerBytes:
    """GPT-2 style: LayerNorm with bias, fused c_attn, tanh-GELU MLP, resid dropouts."""
    h, f = hidden, ffn
    c = 4 if regime == "fp32" else 2          # compute dtype: linear / matmul outputs
    r = 2 if regime == "bf16" else 4          # residual stream
    w = LayerWalk()
    ln = 2 * (2 if regime == "bf16" else 4)   # mean + rstd
    w.add("ln_1 (mean, rstd)", ln, REPLICATED)
    w.add("c_attn input (ln_1 output or its AMP cast)", c * h, REPLICATED)
    w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=heads * head_dim,
                       kv_dim=kv_heads * head_dim, hidden=h, seq_len=seq_len, tokens=tokens))
    if dropout:
        w.add("resid dropout noise (attention)", c * h, REPLICATED)
    w.add("mid residual (ln_2 input)", r * h, REPLICATED)
    w.add("ln_2 (mean, rstd)", ln, REPLICATED)
    w.add("c_fc input (ln_2 output or its AMP cast)", c * h, REPLICATED)
    w.add("mlp (gelu_new 4f + c_proj input f)", 5 * c * f)
    if dropout:
        w.add("resid dropout noise (mlp)", c * h, REPLICATED)
    return w.layer(tokens, r * h * tokens, True)      # LayerNorm saves its input in every regime


def _llama_attention(w: LayerWalk, attention, *, hidden, heads, kv_heads, head_dim, regime, dropout, tokens,
                     seq_len) -> None:
    """The input RMSNorm, attention and the post-attention RMSNorm of a Llama-style layer."""
    h = hidden
    amp = regime == "amp-bf16"
    # RMSNorm: fp32 and bf16 save normalized x + output (bf16: + the fp32 copy of x); AMP only
    # the fp32 normalized x (consumers save their own bf16 casts).
    norm = {"fp32": 8 * h + 4, "bf16": 8 * h + 4, "amp-bf16": 4 * h + 4}[regime]
    norm_ops = "_to_copy+pow+rsqrt+mul+mul"
    w.add("input norm", norm, REPLICATED, op=norm_ops)
    if amp:
        w.add("q/k/v input casts", 3 * 2 * h, REPLICATED, op="_to_copy", module="attention")
    w.extend(attention(kind=regime, dropout=dropout, heads=heads, q_dim=heads * head_dim,
                       kv_dim=kv_heads * head_dim, hidden=h, seq_len=seq_len, tokens=tokens), module="attention")
    w.add("mid residual (post-attention norm input)", 0 if regime == "bf16" else 4 * h, REPLICATED, op="add")
    w.add("post-attention norm", norm, REPLICATED, op=norm_ops)


def llama_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                seq_len, model=None) -> LayerBytes:
    """Llama style: RMSNorm, rotary, separate q/k/v/o, gated SiLU MLP."""
    c = 4 if regime == "fp32" else 2
    r = 2 if regime == "bf16" else 4
    w = LayerWalk()
    _llama_attention(w, attention, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     regime=regime, dropout=dropout, tokens=tokens, seq_len=seq_len)
    if regime == "amp-bf16":
        w.add("gate/up input casts", 2 * 2 * hidden, REPLICATED, op="_to_copy", module="mlp")
    w.add("mlp (gate, silu, up, product)", 4 * c * ffn, op="mm+silu+mm+mul", module="mlp")
    return w.layer(tokens, r * hidden * tokens, regime != "bf16")   # bf16: the next RMSNorm saves its fp32 copy


def mixtral_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                  seq_len, model=None) -> LayerBytes:
    """Mixtral style: Llama attention, a sparse MoE block (experts_implementation="grouped_mm")."""
    h, f, k, E = hidden, ffn, top_k, experts
    r = 2 if regime == "bf16" else 4
    w = LayerWalk()
    _llama_attention(w, attention, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                     regime=regime, dropout=dropout, tokens=tokens, seq_len=seq_len)
    ce = 2 if regime == "bf16" else 4         # experts run in the weight dtype
    w.add("router (input cast, probs, top-k, weights)",
          (2 * h if regime == "amp-bf16" else 0) + 4 * E + 8 * k + 4 + 4 * k, REPLICATED,
          op="_to_copy+_softmax+topk+sum+div", module="mlp")
    w.add("expert indices (perm // k, perm, inv_perm)", 3 * 8 * k, REPLICATED, op="sort+floor_divide+argsort",
          module="mlp")
    w.add("experts (input, gate_up, silu, product, down)", ce * k * (2 * h + 4 * f), EXPERTS,
          op="index+_grouped_mm+silu+mul+_grouped_mm", module="mlp")
    w.add("routing weights", 4 * k, REPLICATED, op="index", module="mlp")
    w.constant.append(Part("expert offsets", 4 * E, split=REPLICATED, op="cumsum", module="mlp"))
    return w.layer(tokens, r * h * tokens, regime != "bf16")


def amp_weight_copies(*, family=None, style=None, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int,
                      experts: int = 0) -> int:
    """Bytes of the bf16 copies autocast caches for one layer's matmul weights (AMP only).

    Every linear's weight and bias is cast once per forward and cached while autocast is on:
    q/k/v/o and the MLP (Llama), c_attn/c_proj/c_fc/c_proj with biases (GPT-2), q/k/v/o and the
    router (Mixtral: grouped_mm is not autocast, the expert weights are not copied): the
    family's layer weights marked ``autocast``.
    """
    from .families import resolve_family
    weights = resolve_family(family if family is not None else style).layer_weights(
        hidden=hidden, q_dim=heads * head_dim, kv_dim=kv_heads * head_dim, ffn=ffn, experts=experts)
    return 2 * sum(w.elements for w in weights if w.autocast)


# --- Megatron-Core layers ------------------------------------------------------------------------

def megatron_layer_bytes(*, family=None, style=None, hidden: int, heads: int, kv_heads: int, head_dim: int,
                         ffn: int, attention, dropout: bool, tokens: int, seq_len: int, experts: int = 0,
                         top_k: int = 0) -> LayerBytes:
    """Bytes one decoder layer saves for backward under Megatron-Core mixed precision
    (16-bit activations, 1-byte dropout masks): Korthikanti et al. 2022 §4.1, whose
    34*s*b*h + 5*a*s^2*b per GPT layer this reproduces exactly, generalised to GQA (K and V
    kv_heads wide), gated MLPs (fc1 output 2f wide + the activation's f-wide output) and
    FlashAttention (the output and the fp32 log-sum-exp instead of the s x s scores).

    Each part says how tensor parallelism splits it without sequence parallelism: the norm
    inputs, the QKV and MLP inputs and the dropout masks after the row-parallel linears are
    replicated; the rest lives inside the column/row-parallel region. The MLP's parts are
    the family's (``ArchitectureFamily.megatron_mlp``), the attention's the kernel's."""
    from .kernels import MEGATRON
    family, kernel = _resolve(family, style, attention)
    h, f = hidden, ffn
    q, kv = heads * head_dim, kv_heads * head_dim
    w = LayerWalk()
    w.add("layernorm inputs", 2 * 2 * h, REPLICATED)
    w.add("qkv input", 2 * h, REPLICATED)
    w.add("q/k/v", 2 * (q + 2 * kv))
    w.extend(kernel.saved(MEGATRON, kind="bf16", dropout=dropout, heads=heads, q_dim=q, kv_dim=kv, hidden=h,
                          seq_len=seq_len, tokens=tokens))
    w.add("out-proj input", 2 * q)
    if dropout:
        w.add("dropout masks (attention, mlp)", 2 * h, REPLICATED)
    w.add("mlp input", 2 * h, REPLICATED)
    w.extend(family.megatron_mlp_parts(hidden=h, ffn=f, experts=experts, top_k=top_k))
    return w.layer(tokens, 2 * h * tokens, False)


def megatron_gated_mlp(*, hidden, ffn, experts, top_k) -> tuple[Part, ...]:
    """A gated MLP's fc1 output (2f) and the activation's output (f), 16-bit."""
    return (Part("mlp (fc1 output, fc2 input)", 6 * ffn),)


def megatron_plain_mlp(*, hidden, ffn, experts, top_k) -> tuple[Part, ...]:
    """A plain MLP's fc1 output and the GELU's output, 16-bit."""
    return (Part("mlp (fc1 output, fc2 input)", 4 * ffn),)


def megatron_moe_mlp(*, hidden, ffn, experts, top_k) -> tuple[Part, ...]:
    """The router's fp32 probabilities and, per routed copy, the dispatched input and a gated
    expert MLP's fc1 output and activation."""
    return (Part("router (probabilities, fp32)", 4 * experts, split=REPLICATED),
            Part("experts (dispatched input, fc1 output, fc2 input)", top_k * (2 * hidden + 6 * ffn), split=EXPERTS))
