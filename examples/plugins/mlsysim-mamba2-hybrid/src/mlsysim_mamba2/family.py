"""The Bamba architecture family: Mamba-2 + attention hybrid layers for the measured profile.

Registered through the measured profile's ``mlsysim_measured_architectures`` hook (``plugin.py``);
the profile's ``prepare`` chooses it for a model whose ``architecture`` is ``"bamba"``. The bytes
are ``layer_bytes.py``'s closed forms (derived op by op from transformers 5.23's pure-torch Bamba
path and checked to the byte against ``validation/mamba2/measurements.json``); this module only
says how the profile is to read them.

The measured profile assumes every decoder layer alike (``layer``: one ``LayerBytes``; ``layer_weights``:
one layer's weights, multiplied by the layers on a rank). A Bamba model alternates two kinds, so the
family's layer is the **mean layer**: the parts every layer has (the two RMSNorms, the mid residual,
the SwiGLU MLP) whole, each Mamba-2 mixer part x (Mamba-2 layers / layers) and each attention part
x (attention layers / layers); its weights likewise. Summed over the model's layers that is exactly
the model (what one device holds, and what the measurements cover). Where one layer or one stage
counts it is an approximation, said in a note where the run has it (``check``): a pipeline stage's
own mix of layers, the layers block recompute keeps, full checkpointing's one-layer recompute working
set and first-layer gradients, FSDP's gathered layer.

Tensor parallelism reads each part's ``split``: the norms, the mid residual and the in_proj input
are replicated (as in a Llama layer); the attention's parts are the kernel's; the MLP and the
mixer's per-head tensors are split over the tp ranks, as Megatron-Core's ``MambaMixer`` splits
the mixer by heads (in_proj column-parallel, out_proj row-parallel, conv, scan and gated norm on
each rank's heads). B and C (``2 x n_groups x d_state`` channels of in_proj's output, the conv and
its output) and the segment-sum masks and the gated norm's rsqrt are replicated: a group is shared
by ``n_heads / n_groups`` heads (Bamba-9B has one), which no tp > 1 splits. transformers' Bamba has
no tensor-parallel plan, so this split is not validated: a note says so. Selective recompute drops
the attention kernel's s x s scores only (what its parts mark); no mixer part is recomputed by it.

Not modelled, refused by name (``NotModelledError``): autocast regimes (``amp-bf16``, ``amp-fp16``:
not measured for the mixer), Megatron-Core's layers (the ``*-main-grad`` regimes), dropout > 0
(``attention_dropout``; not measured), LoRA (no walker: the profile refuses it), and a model with
``architecture="bamba"`` that is not a ``BambaWorkload`` (it lacks the mixer's sizes).
"""

from __future__ import annotations

import attrs

from mlsysim_core import InvalidInputError, NotModelledError
from mlsysim_plugins.measured.families import RMS_NORM, ArchitectureFamily, LayerWeight
from mlsysim_plugins.measured.kernels import SEPARATE_QKV
from mlsysim_plugins.measured.layers import REPLICATED, TP, LayerBytes, Part

from . import layer_bytes as lb
from .workload import MAMBA, ROTARY_FRACTION, BambaWorkload

NAME = "mamba2.bamba"
ARCHITECTURE = "bamba"
REGIME_KINDS = ("fp32", "bf16")      # what layer_bytes derives: compute == residual bytes, 4 or 2
CHANNELS = "channels"                # a part over the conv channels: x's share split, B and C's replicated

# How tensor parallelism splits each part of layer_bytes' mixer walk (matched by the start of its name).
MIXER_SPLITS = (
    ("in_proj output", CHANNELS),
    ("A = -exp(A_log)", TP),
    ("conv1d output", CHANNELS),
    ("conv silu output xBC", CHANNELS),
    ("x.float()", TP),
    ("dt + dt_bias", TP),
    ("clamp(dt)", TP),
    ("dt.float() twice", TP),
    ("pad(x)", TP),
    ("B repeated to heads", TP),
    ("segment_sum masks", REPLICATED),
    ("L = exp(segsum(A))", TP),
    ("G = C.B and M = G*L", TP),
    ("einsum copies of C", TP),
    ("einsum copies of x*dt", TP),
    ("decay_states, exp(A_cumsum)", TP),
    ("chunk states incl.", TP),
    ("inter-chunk decay", TP),
    ("einsum copy of the chunk-start states", TP),
    ("C.states", TP),
    ("scan output y", TP),
    ("gate.float()", TP),
    ("gated RMSNorm: silu", TP),
    ("gated RMSNorm rsqrt", REPLICATED),
    ("out_proj input", TP),
)
# ... and the parts every layer has (the input RMSNorm, then layer_bytes' tail: mid residual, norm, MLP).
SHARED_SPLITS = (
    ("input RMSNorm", REPLICATED),
    ("mid residual", REPLICATED),
    ("pre_ff_layernorm", REPLICATED),
    ("MLP", TP),
)


def _split_of(name: str, table) -> str:
    for prefix, split in table:
        if name.startswith(prefix):
            return split
    raise RuntimeError(f"layer_bytes part {name!r} has no tensor-parallel split in family.py")   # a code change


# --- the model --------------------------------------------------------------------------------

def bamba_model(model) -> BambaWorkload:
    """``model`` as a ``BambaWorkload``, or a ``NotModelledError`` saying how to build one."""
    if isinstance(model, BambaWorkload):
        return model
    name = getattr(model, "name", None)
    raise NotModelledError(
        "model", name, "a mlsysim_mamba2.BambaWorkload for architecture 'bamba'",
        f"{type(model).__name__} {name!r} has architecture 'bamba' but not the Mamba-2 fields (which layers are "
        "attention, the mixer's heads, state size, groups, conv kernel, chunk size): build it with "
        "mlsysim_mamba2.BambaWorkload(...) or BambaWorkload.from_hf_config(config)")


def _mix(model: BambaWorkload):
    """(mamba share, attention share, their labels) of the layers."""
    L, m = model.layers, model.mamba_layers
    a = L - m
    return m / L, a / L, f"{m}/{L}", f"{a}/{L}"


def _regime(kind: str) -> int:
    """The compute (= residual) bytes of a regime kind the formulas know."""
    if kind not in REGIME_KINDS:
        raise NotModelledError(
            "regime", "autocast (amp-bf16, amp-fp16)" if kind == "amp-bf16" else kind,
            "fp32 or a pure 16-bit regime (fp32, bf16, fp16, mixed-bf16, fsdp-bf16) for a Bamba model",
            "the Mamba-2 layers were derived and measured in fp32 and pure bf16 only (validation/mamba2); under "
            "autocast the mixer's casts around its fp32 scan were not measured")
    return 4 if kind == "fp32" else 2


# --- one layer ----------------------------------------------------------------------------------

def mixer_parts(model: BambaWorkload, *, tokens: int, seq_len: int, compute_bytes: int) -> tuple[Part, ...]:
    """One Mamba-2 mixer's saved tensors (``layer_bytes.mamba2_mixer_parts``, bytes per layer) as
    ``Part``s with their tensor-parallel split; a part over the conv channels is two parts: x's
    channels (tp) and B and C's (replicated)."""
    c, b = compute_bytes, tokens // seq_len
    m = model
    bc = 2 * m.mamba_n_groups * m.mamba_d_state
    widths = {"in_proj output": 2 * m.d_inner + bc + m.mamba_n_heads, "conv1d output": m.d_inner + bc,
              "conv silu output xBC": m.d_inner + bc}
    out = []
    for name, nbytes in lb.mamba2_mixer_parts(
            tokens=tokens, batch=b, seq_len=seq_len, d_inner=m.d_inner, n_heads=m.mamba_n_heads,
            head_dim=m.mamba_d_head, d_state=m.mamba_d_state, n_groups=m.mamba_n_groups, conv_kernel=m.mamba_d_conv,
            chunk_size=m.mamba_chunk_size, compute_bytes=c, residual_bytes=c):
        split = _split_of(name, MIXER_SPLITS)
        if split != CHANNELS:
            out.append(Part(name, nbytes, split=split))
            continue
        width = next(w for prefix, w in widths.items() if name.startswith(prefix))
        replicated, rest = divmod(nbytes * bc, width)
        assert not rest, (name, nbytes, width)
        out.append(Part(f"{name}: x, z, dt channels", nbytes - replicated, split=TP))
        out.append(Part(f"{name}: B, C channels", replicated, split=REPLICATED))
    return tuple(out)


def shared_parts(model: BambaWorkload, *, tokens: int, compute_bytes: int) -> tuple[Part, ...]:
    """What every Bamba layer saves around its mixer or attention: the input RMSNorm, the mid
    residual (fp32), pre_ff_layernorm and the SwiGLU MLP (``layer_bytes``), bytes per layer."""
    kw = dict(tokens=tokens, hidden=model.hidden_dim, compute_bytes=compute_bytes, residual_bytes=compute_bytes)
    named = lb.rmsnorm_parts(**kw) + lb._tail_parts(ffn=model.ffn_dim, **kw)
    return tuple(Part(name, nbytes, split=_split_of(name, SHARED_SPLITS)) for name, nbytes in named)


def attention_parts(attention, *, kind: str, heads: int, kv_heads: int, head_dim: int, hidden: int, tokens: int,
                    seq_len: int) -> tuple[Part, ...]:
    """One attention layer's own saved tensors: the kernel's (per token, times the tokens), and,
    where the kernel leaves o_proj's input a view of its output (no part kept only for o_proj's
    weight gradient: SDPA), the contiguous copy Bamba makes: its partial-rotary ``cat`` leaves q,
    hence the attention output, in (b, heads, s, d), so ``transpose(1, 2).contiguous()`` copies
    (c x q per token) and o_proj saves the copy."""
    c = 4 if kind == "fp32" else 2
    q = heads * head_dim
    per_token = list(attention(kind=kind, dropout=False, heads=heads, q_dim=q, kv_dim=kv_heads * head_dim,
                               hidden=hidden, seq_len=seq_len, tokens=tokens))
    if not any(p.weight_gradient_only for p in per_token):
        per_token.append(Part("o_proj input: contiguous copy of the attention output (partial-rotary layout)",
                              c * q, split=TP, weight_gradient_only=True))
    return tuple(attrs.evolve(p, nbytes=p.nbytes * tokens) for p in per_token)


def _scaled(parts, share: float, label: str) -> tuple[Part, ...]:
    return tuple(attrs.evolve(p, name=f"{label}: {p.name}", nbytes=p.nbytes * share) for p in parts if p.nbytes)


def bamba_layer(*, attention, hidden, heads, kv_heads, head_dim, ffn, experts, top_k, regime, dropout, tokens,
                seq_len, model=None) -> LayerBytes:
    """The mean Bamba decoder layer (see the module docstring): the shared parts whole, the mixer's
    parts x the Mamba-2 share of the layers, the attention's x the attention share."""
    m = bamba_model(model)
    c = _regime(regime)
    if dropout:
        raise NotModelledError("dropout", "> 0", "0.0 for a Bamba model",
                               "attention dropout was not measured for Bamba (validation/mamba2 runs without it)")
    if tokens % seq_len:
        raise InvalidInputError("tokens", tokens, f"a multiple of seq_len={seq_len}")
    wm, wa, m_label, a_label = _mix(m)
    parts = shared_parts(m, tokens=tokens, compute_bytes=c)
    if wm:
        parts += _scaled(mixer_parts(m, tokens=tokens, seq_len=seq_len, compute_bytes=c), wm, f"Mamba-2 x {m_label}")
    if wa:
        parts += _scaled(attention_parts(attention, kind=regime, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                                         hidden=hidden, tokens=tokens, seq_len=seq_len), wa, f"attention x {a_label}")
    output, saved_by_next = lb.layer_output(tokens=tokens, hidden=hidden, compute_bytes=c, residual_bytes=c)
    return LayerBytes(saved=sum(p.nbytes for p in parts), output=output, output_saved_by_next=saved_by_next,
                      parts=parts)


def megatron_mlp(*, hidden, ffn, experts, top_k):
    raise NotModelledError("regime", "Megatron-Core (main-grad)", "a regime that runs transformers' Bamba layers "
                           "(fp32, bf16, fp16, mixed-bf16, fsdp-bf16)",
                           "Megatron-Core's Mamba-2 layers are not modelled by the mlsysim-mamba2-hybrid family")


# --- parameters --------------------------------------------------------------------------------

W = LayerWeight


def mixer_weights(model: BambaWorkload) -> tuple[LayerWeight, ...]:
    """One Mamba-2 mixer's parameters, split as tensor parallelism splits them (module docstring)."""
    m, h = model, model.hidden_dim
    D, H, K = m.d_inner, m.mamba_n_heads, m.mamba_d_conv
    bc = 2 * m.mamba_n_groups * m.mamba_d_state
    out = [W("mamba.in_proj (z, x, dt)", h * (2 * D + H)),
           W("mamba.in_proj (B, C)", h * bc, split=REPLICATED),
           W("mamba.conv1d (x channels)", D * K),
           W("mamba.conv1d (B, C channels)", bc * K, split=REPLICATED)]
    if m.mamba_conv_bias:
        out += [W("mamba.conv1d.bias (x channels)", D, autocast=False),
                W("mamba.conv1d.bias (B, C channels)", bc, split=REPLICATED, autocast=False)]
    if m.mamba_proj_bias:
        out += [W("mamba.in_proj.bias (z, x, dt)", 2 * D + H, autocast=False),
                W("mamba.in_proj.bias (B, C)", bc, split=REPLICATED, autocast=False)]
    out += [W("mamba.dt_bias, A_log, D", 3 * H, autocast=False),
            W("mamba.norm (gated RMSNorm)", D, autocast=False),
            W("mamba.out_proj", D * h)]
    if m.mamba_proj_bias:
        out.append(W("mamba.out_proj.bias", h, split=REPLICATED, autocast=False))
    return tuple(out)


def bamba_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None) -> tuple[LayerWeight, ...]:
    """The mean layer's weights: the mixer's x the Mamba-2 share, q/k/v/o x the attention share,
    the MLP whole. The vectors (conv bias, dt_bias, A_log, D, the gated norm) are listed as
    weights, not linear biases: they count with the layer's parameters. The two RMSNorms are the
    family's ``layer_norms``."""
    m = bamba_model(model)
    wm, wa, m_label, a_label = _mix(m)
    h, f = hidden, ffn
    attention = (W("self_attn.q_proj", h * q_dim), W("self_attn.k_proj", h * kv_dim),
                 W("self_attn.v_proj", h * kv_dim), W("self_attn.o_proj", q_dim * h))
    out = [attrs.evolve(w, name=f"{w.name} x {m_label}", elements=w.elements * wm) for w in mixer_weights(m) if wm]
    out += [attrs.evolve(w, name=f"{w.name} x {a_label}", elements=w.elements * wa) for w in attention if wa]
    out += [W("feed_forward.gate_proj", h * f), W("feed_forward.up_proj", h * f), W("feed_forward.down_proj", f * h)]
    return tuple(out)


def _layer_tensors(model: BambaWorkload, kind: str) -> list[tuple[int, tuple[int, int]]]:
    """(elements, (rows, cols)) of one decoder layer's parameter tensors in registration order (cols 0
    for a vector): ``feed_forward`` (gate, up, down), ``input_layernorm``, ``pre_ff_layernorm``, then
    the mixer (its own dt_bias, A_log, D, then conv1d's weight and bias, in_proj, norm, out_proj) or
    q/k/v/o. The depthwise conv weight (conv_dim, 1, K) is factored by torch's Adafactor over its last
    two dimensions: a row factor of conv_dim and a column factor of conv_dim x K elements, given as
    (conv_dim, conv_dim x K). The order is read from transformers' module tree (a module's own
    parameters before its children's); the measurements check the count and the sizes, not the
    order (which only a for-loop optimizer step's transient depends on)."""
    m, h, f = model, model.hidden_dim, model.ffn_dim

    def matrix(rows, cols):
        return rows * cols, (rows, cols)

    def vector(n):
        return n, (n, 0)

    out = [matrix(f, h), matrix(f, h), matrix(h, f), vector(h), vector(h)]
    if kind == MAMBA:
        D, H, K = m.d_inner, m.mamba_n_heads, m.mamba_d_conv
        conv_dim = D + 2 * m.mamba_n_groups * m.mamba_d_state
        proj = D + conv_dim + H
        out += [vector(H), vector(H), vector(H), (conv_dim * K, (conv_dim, conv_dim * K))]
        out += [vector(conv_dim)] if m.mamba_conv_bias else []
        out += [matrix(proj, h)] + ([vector(proj)] if m.mamba_proj_bias else [])
        out += [vector(D), matrix(h, D)] + ([vector(h)] if m.mamba_proj_bias else [])
    else:
        s = m.shape()
        q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
        out += [matrix(q, h), matrix(kv, h), matrix(kv, h), matrix(h, q)]
    return out


def _tensors(shape) -> list[tuple[int, tuple[int, int]]]:
    """Every parameter tensor of ``BambaForCausalLM`` in registration order: the embedding, the
    layers (each by its own kind), the final norm, the LM head unless tied."""
    m = bamba_model(shape.model)
    V, h = shape.vocab, shape.hidden
    out = [(V * h, (V, h))]
    for kind in m.layer_types:
        out += _layer_tensors(m, kind)
    out.append((h, (h, 0)))
    return out + ([] if shape.tied else [(V * h, (V, h))])


def parameter_tensors(shape) -> tuple[int, ...]:
    """Element counts of every parameter tensor, in registration order (what a for-loop optimizer
    step walks; their count is Adam's step counters)."""
    return tuple(n for n, _ in _tensors(shape))


def matrix_shapes(shape) -> list[tuple[int, int]]:
    """(rows, cols) of every parameter tensor, in registration order (factored optimizers)."""
    return [rc for _, rc in _tensors(shape)]


# --- notes -----------------------------------------------------------------------------------

def check(plan) -> tuple[str, ...]:
    """What costing this run with the mean layer and the head split approximates (the profile
    asks the family once the layout is known): nothing on one device, where the mean layer is
    exact; a note where some layers count apart, or the mixer is split."""
    m = bamba_model(plan.model)
    notes = []
    L, n_m = m.layers, m.mamba_layers
    apart = plan.pp_size > 1 or plan.activation_checkpointing == "full" or plan.dp_size * plan.cp_size > 1
    if 0 < n_m < L and apart:
        notes.append(
            f"Bamba layers are costed as their mean: {n_m} Mamba-2 and {L - n_m} attention layers, each kind's saved "
            f"tensors and weights x its share of the {L} layers; exact for the whole model on one device (validated "
            "against PyTorch, validation/mamba2), approximate where some layers count apart: a pipeline stage's own "
            "mix of layers, the layers block recompute keeps (checkpointed_layers), full checkpointing's one-layer "
            "recompute working set and first-layer gradients, FSDP's gathered layer")
    if n_m and plan.tp_size * plan.cp_size > 1:
        g = m.mamba_n_groups
        notes.append(
            "Bamba's Mamba-2 mixer under tensor parallelism is split by heads as Megatron-Core's MambaMixer (in_proj "
            f"column-, out_proj row-parallel; B and C of its {g} group{'s' if g != 1 else ''} replicated on every "
            "rank), not validated (transformers' Bamba has no tensor-parallel plan); context parallelism splits its "
            "activations by the sequence, without the scan's state exchange")
    return tuple(f"approximation: {n}" for n in notes)


def count_parameters(model) -> int:
    """Every parameter of ``BambaForCausalLM`` with the model's shapes: what the profile checks
    ``model.parameters`` against."""
    return bamba_model(model).count_parameters()


BAMBA = ArchitectureFamily(
    name=NAME, label="Bamba",
    description="Mamba-2 + attention hybrid (transformers' bamba, pure-torch path): RMSNorm, a Mamba-2 mixer or "
                "GQA attention with partial rotary 0.5, a SwiGLU MLP in every layer; costed as the mean layer "
                "(validated against PyTorch's MemTracker: validation/mamba2)",
    architectures=(ARCHITECTURE,), gated_mlp=True, norm=RMS_NORM, layer_norms=2, positions="rotary",
    rotary_fraction=ROTARY_FRACTION, attention_layout=SEPARATE_QKV, layer_weights=bamba_weights,
    parameter_tensors=parameter_tensors, matrix_shapes=matrix_shapes, layer=bamba_layer, megatron_mlp=megatron_mlp,
    lora_layer=None, count_parameters=count_parameters, check=check)
