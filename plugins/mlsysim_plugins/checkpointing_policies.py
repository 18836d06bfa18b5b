"""Activation-checkpointing policies beyond none/selective/full, as checkpointing strategies:

* ``op-sac`` -- torchtitan's per-op selective activation checkpointing (``selective_ac_option = "op"``):
  every decoder layer is checkpointed with ``torch.utils.checkpoint`` and a policy
  (``create_selective_checkpoint_contexts``) that saves the outputs of the ops in its save list
  (``aten.mm``, the SDPA attention ops, ``aten.max``, ``reduce_scatter``) except every second
  ``aten.mm``, counted per layer. torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce):
  torchtitan/distributed/activation_checkpoint.py lines 98-137 (the policy), models/llama3/infra/
  parallelize.py lines 36-51 (``_op_sac_save_list``). In a Llama layer the mms run q, k, v, o, gate,
  up, down: q, v, gate and down are saved; in a Mixtral layer q, k, v, o, router: q, v, router (the
  experts' ``_grouped_mm`` and the router's ``topk`` are not in v0.2.2's list). On the CPU, SDPA
  dispatches ``_scaled_dot_product_flash_attention_for_cpu``, not in torchtitan's list: the
  validation adds it as the stand-in for the GPU's ``_scaled_dot_product_flash_attention`` (both
  return the attention output and its fp32 logsumexp, the bytes that matter).
* ``save-list`` -- a per-op policy of your own: ``plugin_options={"save-list": {"ops": ["mm", "sdpa"]}}``
  saves every output of the ops named (no alternation) and recomputes the rest. Op names: mm, sdpa,
  bmm, softmax, topk, grouped_mm.
* ``every-k`` -- torchtitan's layer selective AC (``selective_ac_option = "k"``, activation_checkpoint.py
  lines 24-49): full checkpointing of the blocks whose 1-based index is a multiple of k
  (``plugin_options={"every-k": {"k": 2}}``), floor(L / k) of the L layers.
* ``mlp-only`` / ``attention-only`` -- a non-reentrant checkpoint around each layer's MLP (the MoE
  block for Mixtral) or its attention module.

Megatron's selective recompute stays the ``selective`` strategy; full recompute ``full``.

Each declares ``recomputes="part"`` and ``recomputes_first_layer`` (the per-op and module policies:
always; every-k: when k = 1), which the measured profile reads; their callables bind their own
policy (``functools.partial``, ``Recompute``) and never read the plan's strategy name, so the same
spec under another name is the same strategy.

Under a per-op policy a layer keeps its input and the outputs of its saved ops (the policy's cache,
whether or not autograd would save them); the backward recomputes one layer at a time (its working
set: everything the layer saves for backward, as under full recompute). The op outputs come from
the family's declared op sequence (``ArchitectureFamily.op_outputs``, ``measured.layer_ops``: Llama,
Mixtral, Qwen3, Qwen3-MoE, Ministral); other families are refused by name. Under a module policy the
layer keeps every part outside the checkpointed module (``Part.module``) plus the module's input.

Under tensor, context and pipeline parallelism (``split_model``: the rules' placement splits the
model) a rank keeps, per layer and micro-batch in flight, the layer's input and the saved outputs as
the placement splits them (``OpOutput.split``; with sequence parallelism the reduce-scattered
row-parallel outputs a list naming ``reduce_scatter`` keeps), the module policies the parts outside
the module as ``parallel.rank_layer_saved`` splits them; the backward's end is the larger of the
stage's first layer recomputed and the embedding's backward (``_rank_last_moment``). Measured per rank
under the fake process group: validation/parallel/policies/.

Validated against PyTorch's MemTracker on Hugging Face Llama and Mixtral tiny models
(validation/techniques/checkpointing/). ``added_step_time`` prices each policy by the forward
FLOPs it recomputes.
"""

from __future__ import annotations

import functools
from typing import Any

import attrs

from mlsysim_core import ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, CheckpointingSpec, MemoryTerm, hookimpl
from mlsysim_core.terms import ACCELERATOR, HOST
from mlsysim_core.errors import InvalidInputError, NotModelledError

from ._lazy import lazy_module
from .measured.term_keys import rope_table_bytes
from . import _korthikanti

model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")
layers = lazy_module(globals(), "layers", "mlsysim_plugins.measured.layers")
measured_kernels = lazy_module(globals(), "measured_kernels", "mlsysim_plugins.measured.kernels")
parallel = lazy_module(globals(), "parallel", "mlsysim_plugins.measured.parallel")

SAVED = (FORWARD, BACKWARD)
OP_NAMES = ("mm", "sdpa", "bmm", "softmax", "topk", "grouped_mm")
# torchtitan v0.2.2's save list, as op names of the sequence below (its max and reduce_scatter never
# run in these layers; its SDPA variants are "sdpa").
TORCHTITAN_SAVE_LIST = ("mm", "sdpa", "max", "reduce_scatter")


def _n(x) -> str:
    return f"{x:,.0f}"


# --- options --------------------------------------------------------------------------------

def _k(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError("plugin_options['every-k'].k", value, "an integer >= 1 (checkpoint every k-th layer)")


def _ops(value):
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise InvalidInputError("plugin_options['save-list'].ops", value, f"a list of op names: {', '.join(OP_NAMES)}")
    for op in value:
        if op not in OP_NAMES:
            raise InvalidInputError("plugin_options['save-list'].ops", op, f"one of {', '.join(OP_NAMES)}")
    return tuple(dict.fromkeys(value))


@attrs.frozen(kw_only=True)
class EveryKOptions:
    """``k``: checkpoint the layers whose 1-based index is a multiple of k (torchtitan's
    ``selective_ac_option = "k"``; k = 1 is full recompute)."""
    k: int = attrs.field(default=2, validator=_k)


@attrs.frozen(kw_only=True)
class SaveListOptions:
    """``ops``: the ops whose outputs are saved (mm, sdpa, bmm, softmax, topk, grouped_mm)."""
    # Any: _ops reads a string with commas (a structuring hook for tuple would split it into characters)
    ops: Any = attrs.field(default=("mm", "sdpa"), converter=_ops)


# --- the op sequence of a layer -------------------------------------------------------------

from .measured.layer_ops import OpOutput  # noqa: E402  (re-exported: its former home)


def op_sequence(shape, kind: str, kernel, seq_len: int) -> tuple[OpOutput, ...]:
    """The forward ops of one decoder layer whose outputs a per-op policy may save, as the family
    declares them (``ArchitectureFamily.op_outputs``; ``measured.layer_ops``), in forward order."""
    declared = shape.family.op_outputs
    if declared is None:
        raise NotModelledError("activation_checkpointing", "a per-op policy", "a family whose layer ops are tagged "
                               "(ArchitectureFamily.op_outputs)", f"family {shape.family.name!r} has no op sequence")
    return tuple(declared(shape, kind, kernel, seq_len))


def saved_ops(ops, save: tuple[str, ...], alternate_mm: bool) -> tuple[OpOutput, ...]:
    """The op outputs a policy saves: those of the listed ops; with ``alternate_mm`` (torchtitan)
    every second mm of the layer is recomputed instead (its count is per layer: 1st, 3rd... saved)."""
    out, mm = [], 0
    for op in ops:
        if op.op == "mm":
            mm += 1
            if alternate_mm and mm % 2 == 0:
                continue
        if op.op in save:
            out.append(op)
    return tuple(out)


def _policy(policy, plan, options=None):
    """The save list of a per-op ``policy`` ("op-sac": torchtitan's, every other mm recomputed;
    "save-list": the strategy's options). ``policy`` is bound by the spec's callables
    (``functools.partial``), never read from the plan's strategy name."""
    if policy == "op-sac":
        return TORCHTITAN_SAVE_LIST, True
    return (options or _options(plan, policy)).ops, False


def _options(plan, policy):
    """The selected strategy's own options (``plugin_options`` under the name it was selected by),
    or ``policy``'s defaults."""
    opts = plan.options.get(plan.activation_checkpointing) if plan.options else None
    if opts is None:
        return EveryKOptions() if policy == "every-k" else SaveListOptions()
    return opts


# --- what the measured profile cannot describe: refused by name --------------------------------

def _check(plan, *, per_op=False, module=None):
    from .measured.model import megatron
    name = plan.activation_checkpointing
    o = plan.profile_options
    if o.lora is not None:
        raise NotModelledError("activation_checkpointing", name, "none, selective or full under LoRA",
                               "the checkpointing policies are validated for full training only")
    if megatron(o.regime) and (per_op or module):
        raise NotModelledError("activation_checkpointing", name, "none, selective, full or every-k under "
                               "Megatron-Core regimes", "Megatron-Core's layers are not Hugging Face's ops")
    if (per_op or module) and o.dropout:
        raise NotModelledError("activation_checkpointing", name, "dropout 0",
                               "with dropout CPU SDPA runs the math kernel; per-op policies are modelled without it")
    if per_op:
        fam = o.architecture
        if fam.op_outputs is None:
            raise NotModelledError("activation_checkpointing", name, "a family whose layer ops are tagged "
                                   "(ArchitectureFamily.op_outputs: llama, mixtral, qwen3, qwen_moe, ministral, ...)",
                                   f"family {fam.name!r} declares no op outputs (op_outputs)")
        kernel = measured_kernels.kernel_of(plan)
        if not (kernel.sdpa or kernel.eager):     # what the kernel declares it computes, not its name
            raise NotModelledError("activation_checkpointing", name, "attention sdpa or eager",
                                   f"attention kernel {kernel.name!r} has no op outputs (it declares no "
                                   "computes='sdpa' or 'eager')")


# --- measured terms -------------------------------------------------------------------------

def _autocast_copies(ctx, module=None):
    if not ctx.regime.autocast:
        return 0
    att = {"q_proj", "k_proj", "v_proj", "o_proj"}
    return 2 * sum(w.elements for w in ctx.shape.layer_weights() if w.autocast and not w.bias
                   and (module is None or (w.name in att) == (module == "attention")))


def _mlp_backward_peak(ctx, lb, regime, accumulating):
    """The MLP backward's highest moment in layer 0, in bytes above "everything the layer saves
    alive", and how: the MLP's own saved tensors are freed as its backward consumes them, its
    activation gradients and weight gradients are born (the latter stay as .grad unless gradients
    accumulate). Derived op by op from the MemTracker trace of mixtral-tiny op-sac (validation/
    techniques/checkpointing/README.md) and transformers 5.23's integrations/moe.py
    grouped_mm_experts_forward; S = T x top_k routed rows, u the experts' bytes (the weights' dtype),
    c the compute bytes, gb the gradient bytes.

    Dense (Llama) MLP down(silu(gate(x)) * up(x)): down's backward makes its input gradient T f c and
    weight gradient h f gb; the product's backward then holds grad_up and grad_act beside grad_prod
    (the product, saved by down, is gone): 2 T f c + h f gb.

    MoE (grouped_mm experts): weighted_out[inv_perm] backward: the sum's expanded gradient made
    contiguous, zeros and their index_put, 3 S h u; the routing-weight mul: 3 S h u - 8 S (inv_perm
    freed); down's grouped_mm backward: + E h f gb + S f u - 8 S (its output, saved by the mul, freed);
    the silu-mul backward: + 2 S f u + (E h f gb born) - S h u - 8 S; gate_up's grouped_mm backward
    after the cat: its E 2f h gb weight gradient and S h u input gradient, the gate_up output, silu
    and product freed: 2 E f h gb + (E h f gb born) - 2 S f u - 8 S."""
    s = ctx.shape
    T, h, f = ctx.tokens, s.hidden, s.ffn
    gb = regime.gradient or 0
    if s.experts:
        E, S = s.experts, ctx.tokens * max(s.top_k, 1)
        u = 2 if model._regime_kind(regime) == "bf16" else 4
        born = 0 if accumulating else E * h * f * gb      # down's weight gradient, kept as .grad
        moments = {"index backward": 3 * S * h * u,
                   "down grouped_mm backward": E * h * f * gb + S * f * u - 8 * S,
                   "silu-mul backward": born + 2 * S * f * u - S * h * u - 8 * S,
                   "gate_up grouped_mm backward": born + 2 * E * f * h * gb - 2 * S * f * u - 8 * S}
    else:
        c = regime.compute
        born = 0 if accumulating else h * f * gb
        moments = {"down backward": T * f * c + h * f * gb, "silu-mul backward": 2 * T * f * c + born}
    where = max(moments, key=moments.get)
    return moments[where], where


def last_moments(plan, placement, ctx, lb, *, kept=0, not_yet_recomputed=0, unborn_layers=1):
    """The backward's end, the later-or-larger of its two last moments (they never coexist):

    * layer 0's MLP backward (recomputed, or with what the policy kept): the other layers'
      gradients (not the embedding's, not layer 0's except those born here; under every-k the
      lowest recomputed layer k - 1, whose ``unborn_layers`` = k layers have none yet), layer 0's input
      (T h r, the embedding output) and RoPE tables, the gradient of its output (T h r), every
      tensor layer 0 saves (``kept`` more: a module's input, autocast copies), minus what is not
      recomputed yet (``not_yet_recomputed``: the attention under attention-only), plus the MLP
      backward's own peak (``_mlp_backward_peak``);
    * the embedding's backward: every layer's gradients, the embedding gradient being computed and
      the gradient of the embedding output (model_activation_terms' end-of-backward terms).

    Returned as one term: that maximum less what the gradient and model terms already count at the
    backward's end (they describe the embedding's moment, with layer 0's gradients born later)."""
    regime = ctx.regime
    s = ctx.shape
    T, h, r = ctx.tokens, s.hidden, regime.residual
    accumulating = plan.gradient_accumulation_steps > 1
    gb = regime.gradient or 0
    grads = model.gradient_terms(plan, placement, first_layer_late=recomputes_first_layer(plan))
    counted = sum(t.nbytes for t in grads if BACKWARD_END in t.phases)
    acts = model.model_activation_terms(plan, placement, recompute=True)
    end_only = sum(t.nbytes for t in acts if tuple(t.phases) == (BACKWARD_END,))
    # The RoPE tables (cos/sin or freqs_cis) are on the device at layer 0's recompute whatever activation offload
    # says of them: the checkpointed layer's recompute closure holds the tensor itself (transformers 5.23.0
    # modeling_layers.py line 120, GradientCheckpointingLayer: partial(forward, self, **kwargs), position_embeddings
    # among the kwargs), so an offloaded term's bytes (tier host) are counted here as the device's.
    rope = rope_table_bytes(acts, tiers=(ACCELERATOR, HOST))
    per_rank = placement.trainable_parameters_per_rank / parallel.gradient_divisor(placement)
    share = per_rank / plan.model.parameters
    embedding, layer = share * s.embedding_parameters * gb, share * s.layer_parameters() * gb
    if accumulating:      # every gradient alive throughout
        at_layer = at_embedding = counted
    else:
        at_embedding, at_layer = per_rank * gb - embedding, per_rank * gb - embedding - unborn_layers * layer
    peak, where = _mlp_backward_peak(ctx, lb, regime, accumulating)
    mlp = max(peak - not_yet_recomputed, 0)
    in_layer = 2 * r * T * h + rope + lb.saved + kept + mlp
    first = at_layer + in_layer
    second = at_embedding + end_only
    nbytes = max(first, second) - counted - end_only
    which = f"layer {unborn_layers - 1}'s MLP backward" if first >= second else "the embedding's backward"
    formula = (f"max(layer {unborn_layers - 1}'s MLP backward: other layers' gradients {_n(at_layer)} + input and output gradient "
               f"2 x T x h x {r} B {_n(2 * r * T * h)} + RoPE {_n(rope)} + saved {_n(lb.saved)}"
               + (f" + kept {_n(kept)}" if kept else "") + f" + its {where} {_n(mlp)} = {_n(first)}; "
               f"the embedding's backward: layers' gradients {_n(at_embedding)} + its terms {_n(end_only)} = "
               f"{_n(second)}) - gradients {_n(counted)} and end-of-backward terms {_n(end_only)} counted "
               f"elsewhere: {which}")
    return MemoryTerm(component=ACTIVATIONS, label="recompute working set (layer 0's backward or the embedding's)",
                      nbytes=nbytes, phases=(BACKWARD_END,), formula=formula)


def split_model(plan, placement) -> bool:
    """Do the rules split the model itself on this rank (pipeline stages, tensor or context
    parallelism: their placement's ``pipeline_stages``, ``tensor_shards``, ``sequence_shards``)?
    Then the policies' terms are the rank's (``_rank_per_op_terms``, ``_rank_module_terms``):
    data and expert parallelism alone leave a rank the whole model's activations."""
    return plan.rank is not None and \
        placement.pipeline_stages * placement.tensor_shards * placement.sequence_shards > 1


def _on_rank(ctx, nbytes, split):
    """``nbytes`` of one micro-batch as the rules split it on this rank: ``split`` "tp" / the tensor
    shards, "replicated" whole, "residual" / the residual stream's shards (sequence parallelism),
    "experts" / the expert tensor shards; every one / the sequence shards (context parallelism)."""
    div = {"tp": ctx.tensor, "replicated": 1, "residual": ctx.residual, "experts": ctx.expert_tensor}[split]
    return nbytes / div / ctx.sequence


def _working_set(plan, ctx, lb):
    """One layer recomputed in the backward on this rank (per micro-batch): everything it saves,
    as the rules split it (``parallel.rank_layer_saved``), and its MLP's two activation gradients
    (/ the tensor shards, / the expert shards for routed copies)."""
    saved = parallel.rank_layer_saved(plan, ctx, lb, False)[0]
    s = ctx.shape
    split = ctx.expert_tensor if s.experts else ctx.tensor
    mlp_grads = 2 * ctx.tokens * max(s.top_k, 1) * s.ffn * ctx.regime.compute / split / ctx.sequence
    copies = _autocast_copies(ctx) / ctx.tensor
    return saved + mlp_grads + copies, (f"{_n(saved)} saved + MLP activation gradients {_n(mlp_grads)}"
                                        + (f" + autocast copies {_n(copies)}" if copies else ""))


def _rank_terms(plan, placement, ctx, lb, label, per_layer, listed):
    """The layers of this rank's stage (``ctx.layers``) keeping ``per_layer`` bytes each per
    micro-batch in flight, and one layer's recompute working set at the backward's end."""
    n = plan.rank.in_flight
    flying = f" x {n:g} micro-batches in flight" if n != 1 else ""
    L = ctx.layers
    return [MemoryTerm(component=ACTIVATIONS, label=label, nbytes=L * per_layer * n, phases=SAVED,
                       formula=f"{L} layers x ({listed}){flying}"),
            _rank_last_moment(plan, placement, ctx, lb)]


def _rank_last_moment(plan, placement, ctx, lb):
    """The backward's end on one rank of a split model, the larger of its two last moments (as
    ``last_moments`` on one device): the stage's first layer recomputed (its working set,
    ``_working_set``, its input and output gradient, the RoPE tables, every gradient but that
    layer's and the embedding's), or the embedding's backward (every gradient, the end-of-backward
    terms). Returned as one term: that maximum less what the gradient and model terms count there."""
    regime = ctx.regime
    T, h, r = ctx.tokens, ctx.shape.hidden, regime.residual
    grads = parallel.rank_gradient_terms(plan, placement)
    counted = sum(t.nbytes for t in grads if BACKWARD_END in t.phases)
    acts = model.model_activation_terms(plan, placement, recompute=True)
    end_only = sum(t.nbytes for t in acts if tuple(t.phases) == (BACKWARD_END,))
    rope = rope_table_bytes(acts, tiers=(ACCELERATOR, HOST))    # (on the device: last_moments says why)
    gb = regime.gradient or 0
    if plan.gradient_accumulation_steps > 1 or not gb:
        at_layer = counted         # every gradient alive throughout (or none: a main-grad buffer)
    else:
        divisor = parallel.gradient_divisor(placement)
        layer = parallel.layer_parameters_on_rank(plan, placement) / divisor * gb
        embedding = 0.0
        if plan.rank.first:
            embedding = ctx.shape.embedding_parameters / ctx.tensor / divisor * gb
            embedding += sum(t.nbytes for t in grads[1:])      # PyTorch TP: the embedding gradient in full
        at_layer = counted - embedding - layer
    work, how = _working_set(plan, ctx, lb)
    grads_in = 2 * _on_rank(ctx, r * T * h, "residual")
    first = at_layer + grads_in + rope + work
    second = counted + end_only
    nbytes = max(first, second) - counted - end_only
    which = "the first layer's recompute" if first >= second else "the embedding's backward"
    return MemoryTerm(component=ACTIVATIONS, label="recompute working set (the stage's first layer or the "
                      "embedding's backward, this rank)", nbytes=nbytes, phases=(BACKWARD_END,),
                      formula=f"max(first layer recomputed: gradients {_n(at_layer)} + input and output gradient "
                              f"{_n(grads_in)} + RoPE {_n(rope)} + {how} = {_n(first)}; the embedding's backward: "
                              f"gradients {_n(counted)} + its terms {_n(end_only)} = {_n(second)}) - gradients and "
                              f"end-of-backward terms counted elsewhere: {which}")


def _rank_per_op_terms(plan, placement, ctx, ops, save, alternate):
    """A per-op policy on one rank of a split model: each layer keeps its input (the residual
    stream, / its shards) and its saved ops' outputs as the rules split them (``OpOutput.split``);
    with sequence parallelism a row-parallel output (``OpOutput.reduced``) is reduce-scattered,
    and a list naming ``reduce_scatter`` keeps that T x h / tp output too."""
    T, h, r = ctx.tokens, ctx.shape.hidden, ctx.regime.residual
    c = ctx.regime.compute
    kept = list(saved_ops(ops, save, alternate))
    if ctx.residual != 1 and "reduce_scatter" in save:
        kept += [OpOutput("reduce_scatter", f"{o.name} reduce-scattered", c * h, split="residual", module=o.module)
                 for o in ops if o.reduced]
    layer_input = _on_rank(ctx, r * T * h, "residual")
    outputs = [(o, _on_rank(ctx, T * o.nbytes, o.split)) for o in kept]
    per_layer = layer_input + sum(b for _, b in outputs)
    listed = (f"input {_n(layer_input)} + " + (", ".join(f"{o.name} ({o.op}) {_n(b)}" for o, b in outputs)
                                               or "no op outputs"))
    return _rank_terms(plan, placement, ctx, model.layer_bytes(plan, ctx),
                       f"{plan.activation_checkpointing} layers: input and saved op outputs (this rank)",
                       per_layer, listed)


def _rank_module_terms(plan, placement, ctx, lb, module):
    """A module policy on one rank of a split model: each layer keeps the parts outside the
    checkpointed module as the rules split them (``parallel.rank_layer_saved`` over those parts:
    with PyTorch's sequence parallelism the all-gathered inputs of attention and MLP too, the
    module's own being the checkpoint's input), plus the module's input under AMP."""
    outside = attrs.evolve(lb, parts=tuple(p for p in lb.parts if p.module != module))
    kept = parallel.rank_layer_saved(plan, ctx, outside, False)[0]
    T, h = ctx.tokens, ctx.shape.hidden
    module_input = _on_rank(ctx, 4 * T * h, "residual") if ctx.regime.autocast else 0
    per_layer = kept + module_input
    listed = f"{_n(kept)} saved outside the {module}" + (f" + its input {_n(module_input)}" if module_input else "")
    terms = _rank_terms(plan, placement, ctx, lb, f"decoder layers ({module} recomputed): saved for backward (this rank)",
                        per_layer, listed)
    if ctx.regime.autocast:
        other = _autocast_copies(ctx, "mlp" if module == "attention" else "attention") / ctx.tensor
        terms.append(MemoryTerm(component=ACTIVATIONS, label="autocast 16-bit weight copies saved by the modules not "
                                "recomputed", nbytes=ctx.layers * other, phases=(BACKWARD,),
                                formula=f"{ctx.layers} layers x {_n(other)} B"))
    return terms


def per_op_terms(plan, placement, options, *, policy="save-list"):
    """Every layer checkpointed with a per-op policy (``policy``: "op-sac" or "save-list", bound
    by the spec): it keeps its input and its saved ops' outputs; the backward recomputes one layer
    at a time."""
    _check(plan, per_op=True)
    ctx = model.context(plan, placement)
    kind = model._regime_kind(ctx.regime)
    save, alternate = _policy(policy, plan, options)
    try:
        ops = op_sequence(ctx.shape, kind, measured_kernels.kernel_of(plan), ctx.seq_len)
    except NotModelledError as e:
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing, e.allowed,
                               e.detail) from None
    if split_model(plan, placement):
        return _rank_per_op_terms(plan, placement, ctx, ops, save, alternate)
    kept = saved_ops(ops, save, alternate)
    T, h, L = ctx.tokens, ctx.shape.hidden, ctx.layers
    r = ctx.regime.residual
    per_layer = r * T * h + T * sum(o.nbytes for o in kept)
    listed = ", ".join(f"{o.name} ({o.op}) {_n(o.nbytes * T)}" for o in kept) or "no op outputs"
    lb = model.layer_bytes(plan, ctx)
    saved = MemoryTerm(component=ACTIVATIONS, label=f"{plan.activation_checkpointing} layers: input and saved op outputs",
                       nbytes=L * per_layer, phases=SAVED,
                       formula=f"{L} layers x (input T x h x {r} B {_n(r * T * h)} + {listed})")
    terms = [saved,
             # Layer 0 is recomputed whole (its saved tensors, the re-cast autocast copies).
             last_moments(plan, placement, ctx, lb, kept=_autocast_copies(ctx))]
    excess, formula = _top_layer_backward(plan, placement, ctx, lb, saved, T * sum(o.nbytes for o in kept))
    if excess > 0:
        terms.append(MemoryTerm(component=ACTIVATIONS, label="the top layer's MLP backward (beyond the loss's "
                                "moment)", nbytes=excess, phases=(BACKWARD,), formula=formula))
    return terms


def top_layer_backward(plan, placement, options=None, *, policy="save-list"):
    """A per-op ``policy``'s top-layer MLP backward on one device (``_top_layer_backward``) as the signed excess over
    the backward's other terms (negative: the loss's moment is higher), or None on a split model. Read by the FSDP2
    moments (``buffers.fsdp2_eager_checkpointed``) through the spec's ``measured.top_layer_backward`` extension."""
    ctx = model.context(plan, placement)
    if split_model(plan, placement):
        return None
    save, alternate = _policy(policy, plan, options)
    ops = op_sequence(ctx.shape, model._regime_kind(ctx.regime), measured_kernels.kernel_of(plan), ctx.seq_len)
    kept = saved_ops(ops, save, alternate)
    T, h, r = ctx.tokens, ctx.shape.hidden, ctx.regime.residual
    saved = ctx.layers * (r * T * h + T * sum(o.nbytes for o in kept))
    return _top_layer_backward(plan, placement, ctx, model.layer_bytes(plan, ctx), saved,
                               T * sum(o.nbytes for o in kept))[0]


def _top_layer_backward(plan, placement, ctx, lb, saved, saved_ops):
    """The top layer's MLP backward under a per-op policy (one device): every layer's saved set (``saved``: each
    layer's input and the ops the policy declares it saves, ``saved_ops`` bytes of them per layer) still alive, the
    top layer's recompute of what the policy does not save (its saved tensors ``lb.saved`` and autocast copies less
    ``saved_ops``), the gradient of its output (T h r), the MLP backward's own peak (``_mlp_backward_peak``, its
    weight gradient born), the gradients born above the layers (the LM head's: the tied embedding's, or the untied
    head's, and the final norm's) and what the model keeps while the layers run (token ids, RoPE tables, the
    embedding output); the loss's and the final norm's saved tensors are freed by then. Measured:
    validation/compile/blocks_fsdp_sac_measurements.json's op-SAC twins (their backward peak is this moment).
    Returned as (the excess over the backward's other terms, the loss's moment: signed, how), ``saved`` the saved
    term or its bytes."""
    from .measured import term_keys as K
    regime, s = ctx.regime, ctx.shape
    T, h, r, L = ctx.tokens, s.hidden, regime.residual, ctx.layers
    accumulating = plan.gradient_accumulation_steps > 1
    gb = regime.gradient or 0
    grads = model.gradient_terms(plan, placement, first_layer_late=recomputes_first_layer(plan))
    counted = sum(t.nbytes for t in grads if BACKWARD in t.phases)
    acts = model.model_activation_terms(plan, placement, recompute=True)
    in_backward = sum(t.nbytes for t in acts if BACKWARD in t.phases)
    during = sum(t.nbytes for t in acts if BACKWARD in t.phases
                 and t.key in (K.TOKEN_IDS, *K.ROPE_TABLE_KEYS, K.EMBEDDING_OUTPUT))
    if accumulating or not gb:
        born = counted      # every gradient alive throughout (or none)
    else:
        share = placement.trainable_parameters_per_rank / parallel.gradient_divisor(placement) / plan.model.parameters
        total = placement.trainable_parameters_per_rank / parallel.gradient_divisor(placement) * gb
        born = total - share * gb * (L * s.layer_parameters() + (0 if s.tied else s.embedding_parameters))
    recompute = max(lb.saved + _autocast_copies(ctx) - saved_ops, 0)
    mlp, where = _mlp_backward_peak(ctx, lb, regime, accumulating)
    saved = getattr(saved, "nbytes", saved)
    moment = saved + during + born + recompute + r * T * h + mlp
    return moment - saved - in_backward - counted, (
        f"the layers' saved sets {_n(saved)} + kept while the layers run {_n(during)} + gradients born above the "
        f"layers {_n(born)} + the top layer's recompute (saved {_n(lb.saved + _autocast_copies(ctx))} - its saved ops "
        f"{_n(saved_ops)}) {_n(recompute)} + its output's gradient T x h x {r} B {_n(r * T * h)} + its {where} "
        f"{_n(mlp)} = {_n(moment)} - the backward's other terms {_n(saved + in_backward + counted)}")


def layer_saved_ops(plan, placement, options=None, *, policy="save-list"):
    """What a per-op ``policy`` (bound by the spec) declares for one layer: (the layer's ops in forward order, the
    ones it saves). Read by the FSDP2 moments (``buffers.fsdp2_eager_checkpointed``) through the spec's
    ``measured.saved_ops`` extension."""
    ctx = model.context(plan, placement)
    save, alternate = _policy(policy, plan, options)
    ops = op_sequence(ctx.shape, model._regime_kind(ctx.regime), measured_kernels.kernel_of(plan), ctx.seq_len)
    return ops, saved_ops(ops, save, alternate)


def module_terms(plan, placement, options, *, module="mlp"):
    """A checkpoint around each layer's MLP or attention (``module``, bound by the spec): the layer
    keeps every part outside the module, plus the module's input where nothing else keeps it (under
    AMP the norm's fp32 output, whose consumers otherwise save their own bf16 casts)."""
    _check(plan, module=True)
    ctx = model.context(plan, placement)
    lb = model.layer_bytes(plan, ctx)
    if not any(p.module for p in lb.parts):
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "a family whose layer parts name their module (Part.module: llama, mixtral, qwen3, "
                               "qwen_moe's Qwen3-MoE, ministral, ...)",
                               f"family {ctx.shape.family.name!r} does not tag its parts")
    if split_model(plan, placement):
        return _rank_module_terms(plan, placement, ctx, lb, module)
    T, h, L = ctx.tokens, ctx.shape.hidden, ctx.layers
    inside = sum(p.nbytes for p in lb.parts if p.module == module)
    module_input = 4 * T * h if ctx.regime.autocast else 0
    out = lb.output if lb.output_saved_by_next else 0
    per_layer = lb.saved - inside + module_input + out
    terms = [MemoryTerm(component=ACTIVATIONS, label=f"decoder layers ({module} recomputed): saved for backward",
                        nbytes=L * per_layer, phases=SAVED,
                        formula=f"{L} layers x ({_n(lb.saved)} saved - {_n(inside)} in the {module} + its input "
                                f"{_n(module_input)} + output {_n(out)})")]
    if ctx.regime.autocast:
        # The modules not recomputed keep their matmuls' bf16 weight copies into the backward.
        other = _autocast_copies(ctx, "mlp" if module == "attention" else "attention")
        terms.append(MemoryTerm(component=ACTIVATIONS, label="autocast 16-bit weight copies saved by the modules not "
                                "recomputed", nbytes=L * other, phases=(BACKWARD,),
                                formula=f"{L} layers x {_n(other)} B"))
    # Layer 0's backward: its module recomputed (with its autocast copies) beside the rest of the
    # layer; under attention-only the MLP's backward runs before the attention is recomputed.
    copies = _autocast_copies(ctx, module)
    later = inside + copies if module == "attention" else 0
    terms.append(last_moments(plan, placement, ctx, lb, kept=module_input + copies, not_yet_recomputed=later))
    return terms


def every_k_terms(plan, placement, options):
    """torchtitan's layer SAC: floor(L / k) layers (the k-th, 2k-th, ...) fully checkpointed, the
    others keep everything. With k > 1 layer 0 is not recomputed: the backward's last moment has
    no recompute; the lowest checkpointed layer (k - 1) is recomputed while layers 0..k-2 still
    hold their activations and the gradients of layers 0..k-1 are not born yet."""
    _check(plan)
    k = (options or _options(plan, "every-k")).k
    L = placement.layers_per_stage
    ckpt = L // k
    terms = list(model.layer_terms(plan, placement, kept_layers=L - ckpt))
    if k == 1 or not ckpt or split_model(plan, placement):
        # (A pipeline stage, or a tensor/context split: the layers' terms per rank, with the
        # micro-batches in flight, and one layer's recompute working set, as under full.)
        return terms
    terms = [t for t in terms if t.phases != (BACKWARD_END,)]
    ctx = model.context(plan, placement)
    lb = model.layer_bytes(plan, ctx)
    out = lb.output if lb.output_saved_by_next else 0
    # Layer k - 1's backward, layers 0..k-2 still saved (their outputs: the next layers' inputs),
    # the gradients of layers 0..k-1 not yet born.
    below = (k - 1) * (lb.saved + out)
    terms.append(last_moments(plan, placement, ctx, lb, kept=below + _autocast_copies(ctx), unborn_layers=k))
    return terms


def recomputes_first_layer(plan) -> bool:
    """Is layer 0 (or a module of it) recomputed at the end of the backward? Then its gradients are
    born after the recompute (``model.gradient_terms(first_layer_late=True)``) and AMP's cached weight
    copies die with the forward. What the selected strategy declares
    (``measured.checkpointing.recomputes_first_layer``)."""
    from .measured.checkpointing import recomputes_first_layer as declared
    return declared(plan)


def _always(plan) -> bool:
    """Per-op and module policies: every layer, layer 0 included, is recomputed (in part)."""
    return True


def _every_k_first_layer(plan) -> bool:
    """every-k: layer 0 (1-based index 1) is checkpointed only when k = 1."""
    return _options(plan, "every-k").k == 1


# --- reference grade (Korthikanti et al.'s 16-bit GPT layer, bytes per s*b*h) ----------------------

def _reference(per_token, label):
    def terms(plan, placement, options):
        return _korthikanti.activation_terms(plan, placement, per_token, 0, label)
    return terms


def _every_k_reference(plan, placement, options):
    k = (options or EveryKOptions()).k
    L = placement.layers_per_stage
    ckpt = L // k
    per_token = (34 * (L - ckpt) + 2 * ckpt) / L if L else 2
    return _korthikanti.activation_terms(plan, placement, per_token, 0, f"every-{k} layer checkpointing "
                                         "(34 B kept, 2 B checkpointed per s*b*h; flash attention)")


def _save_list_reference(plan, placement, options):
    # Korthikanti's GPT layer (fused qkv 6, proj 2, fc1 8, fc2 2 B per s*b*h as mm outputs; flash
    # attention output 2) plus the layer input 2.
    ops = (options or SaveListOptions()).ops
    per_token = 2 + (18 if "mm" in ops else 0) + (2 if "sdpa" in ops else 0)
    return _korthikanti.activation_terms(plan, placement, per_token, 0, f"save-list {','.join(ops)}")


# --- step time ----------------------------------------------------------------------------

def recomputed_flops(plan, policy: str | None = None) -> tuple[float, str]:
    """Forward FLOPs the backward recomputes per micro-batch and rank under the plan's policy:
    2 x tokens x weights of each recomputed matmul (Mixtral's experts: the top-k routed copies), and
    the attention core 4 x T x s x q_dim / 2 (QK^T and PV, causal) where it is recomputed.
    ``policy``: which built-in policy (bound by its spec's ``Recompute``); None: the selected
    strategy's declared ``recompute`` (its FLOPs if it is a ``Recompute``, else its share of the
    forward)."""
    if policy is None:
        return _declared_flops(plan)
    from .measured.shapes import shape_of
    shape = shape_of(plan)
    T, s = plan.microbatch * plan.seq_len, plan.seq_len
    L = plan.model.layers
    q = shape.heads * shape.head_dim
    mats = {w.name: w.elements for w in shape.layer_weights() if not w.bias}
    if shape.experts:
        for name in ("experts.gate_up", "experts.down"):
            if name in mats:
                mats[name] = mats[name] * shape.top_k / shape.experts
    core = 2 * T * s * q         # 4 x T x s x q / 2 (causal)
    mm = {n: 2 * T * e for n, e in mats.items()}
    att = {"q_proj", "k_proj", "v_proj", "o_proj"}
    name = policy
    o = plan.profile_options     # eager: the kernel declares it materialises the scores (not its name)
    eager = measured_kernels.kernel_of(plan).eager if o and o.attention is not None else False
    if name == "none":
        return 0.0, "no recomputation"
    if name == "selective":
        f = L * core if eager else 0.0
        return f, "the attention core (eager scores) of every layer" if eager else "nothing (fused attention keeps no scores)"
    layer = sum(mm.values()) + core
    if name == "full":
        return L * layer, f"{L} layers' forward"
    if name == "every-k":
        k = _options(plan, name).k
        return (L // k) * layer, f"{L // k} layers' forward (every {k}-th)"
    if name == "mlp-only":
        return L * sum(v for n, v in mm.items() if n not in att), f"{L} layers' MLP"
    if name == "attention-only":
        return L * (sum(v for n, v in mm.items() if n in att) + core), f"{L} layers' attention"
    save, alternate = _policy(policy, plan)
    order = [n for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "router")
             if n in mats]
    recomputed, count = [], 0
    for n in order:
        count += 1
        if "mm" not in save or (alternate and count % 2 == 0):
            recomputed.append(n)
    f = sum(mm[n] for n in recomputed)
    if "grouped_mm" not in save:
        f += sum(mm.get(n, 0) for n in ("experts.gate_up", "experts.down"))
        recomputed += [n for n in ("experts.gate_up", "experts.down") if n in mats]
    if "sdpa" not in save or eager:
        f += core
        recomputed.append("attention core")
    return L * f, f"{L} layers x ({', '.join(recomputed) or 'no matmul'})"


class Recompute:
    """A built-in strategy's ``CheckpointingSpec.recompute``: ``recompute(plan)`` is the share of
    the layers' forward FLOPs the backward recomputes (``recomputed_flops`` over every matmul and the
    attention core of every layer), ``flops(plan)`` those FLOPs and what they are, for ``policy``."""

    def __init__(self, policy: str):
        self.policy = policy

    def flops(self, plan) -> tuple[float, str]:
        return recomputed_flops(plan, self.policy)

    def __call__(self, plan) -> float:
        flops = self.flops(plan)[0]
        if not flops:
            return 0.0
        return flops / _forward_flops(plan)

    def __repr__(self):
        return f"Recompute({self.policy!r})"


none_share, selective_share, full_share = Recompute("none"), Recompute("selective"), Recompute("full")


def _declared_flops(plan) -> tuple[float, str]:
    from .measured.checkpointing import spec_of
    declared = spec_of(plan).recompute
    if isinstance(declared, Recompute):
        return declared.flops(plan)
    if declared is None:
        return 0.0, "no recompute share declared (CheckpointingSpec.recompute is None)"
    share = float(declared(plan))
    return share * _forward_flops(plan), f"the declared share {share:g} of the layers' forward"


def recompute_share(plan) -> float:
    """The share of the layers' forward FLOPs the backward recomputes under the selected strategy
    (its ``CheckpointingSpec.recompute``; 0 where it declares none)."""
    from .measured.checkpointing import spec_of
    declared = spec_of(plan).recompute
    return float(declared(plan)) if declared is not None else 0.0


def _forward_flops(plan) -> float:
    from .measured.shapes import shape_of
    shape = shape_of(plan)
    T, s = plan.microbatch * plan.seq_len, plan.seq_len
    total = 2 * T * s * shape.heads * shape.head_dim
    for w in shape.layer_weights():
        if not w.bias:
            routed = w.name in ("experts.gate_up", "experts.down") and shape.experts
            total += 2 * T * w.elements * (shape.top_k / shape.experts if routed else 1)
    return plan.model.layers * total


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """Seconds the policy adds to one optimizer step: recomputed forward FLOPs x micro-batches
    (gradient accumulation) / ``hardware_flops`` (the device's achieved FLOP/s). ``None`` seconds
    when ``hardware_flops`` is not given (the FLOPs are in ``how``). No host traffic."""
    flops, what = recomputed_flops(plan)
    flops *= plan.gradient_accumulation_steps
    how = f"recomputed forward FLOPs {flops:.3e} ({what}) per step"
    if not flops:
        return 0.0, how
    if not hardware_flops:
        return None, how + "; give hardware_flops (FLOP/s) for seconds"
    return flops / hardware_flops, how + f" / {hardware_flops:.3e} FLOP/s"


@hookimpl
def mlsysim_checkpointing_strategies():
    return [
        CheckpointingSpec(name="op-sac", description="torchtitan per-op selective AC: saves attention outputs and "
                          "every other matmul's output, recomputes the rest (measured: Llama, Mixtral)",
                          activation_terms=_reference(20, "op-sac (input, qkv and fc1 matmuls, flash attention "
                                                          "output: 20*s*b*h)"),
                          extensions={"measured.activation_terms": functools.partial(per_op_terms, policy="op-sac"),
                                      "measured.saved_ops": functools.partial(layer_saved_ops, policy="op-sac"),
                                      "measured.top_layer_backward": functools.partial(top_layer_backward,
                                                                                       policy="op-sac"),
                                      "measured.saves_rank": 5,     # fit techniques' ladder, after every-k
                                      # its saved set inside a compiled block: the partitioner honours the SAC tags
                                      # (measured compiled: compile.COMPILED_BLOCKS, validation/compile)
                                      "measured.compiled_blocks": True},
                          searched=False, recompute=Recompute("op-sac"), recomputes="part",
                          recomputes_first_layer=_always),
        CheckpointingSpec(name="save-list", description="per-op selective AC saving the outputs of the ops in "
                          "plugin_options ops (mm, sdpa, bmm, softmax, topk, grouped_mm)",
                          activation_terms=_save_list_reference, options_type=SaveListOptions,
                          extensions={"measured.activation_terms": functools.partial(per_op_terms, policy="save-list"),
                                      "measured.saved_ops": functools.partial(layer_saved_ops, policy="save-list"),
                                      "measured.top_layer_backward": functools.partial(top_layer_backward,
                                                                                       policy="save-list")},
                          searched=False, recompute=Recompute("save-list"), recomputes="part",
                          recomputes_first_layer=_always),
        CheckpointingSpec(name="every-k", description="full recompute of every k-th layer (torchtitan's layer SAC; "
                          "plugin_options k, default 2)", activation_terms=_every_k_reference,
                          options_type=EveryKOptions,
                          extensions={"measured.activation_terms": every_k_terms, "measured.saves_rank": 4},
                          searched=False,
                          recompute=Recompute("every-k"), recomputes="part",
                          recomputes_first_layer=_every_k_first_layer),
        CheckpointingSpec(name="mlp-only", description="recompute each layer's MLP (MoE block) only",
                          activation_terms=_reference(17, "layers, MLP recomputed (17*s*b*h)"),
                          extensions={"measured.activation_terms": functools.partial(module_terms, module="mlp"),
                                      "measured.saves_rank": 3},
                          searched=False, recompute=Recompute("mlp-only"), recomputes="part",
                          recomputes_first_layer=_always),
        CheckpointingSpec(name="attention-only", description="recompute each layer's attention module only",
                          activation_terms=_reference(25, "layers, attention recomputed (25*s*b*h)"),
                          extensions={"measured.activation_terms": functools.partial(module_terms, module="attention"),
                                      "measured.saves_rank": 2},
                          searched=False, recompute=Recompute("attention-only"), recomputes="part",
                          recomputes_first_layer=_always),
    ]
