"""Activation offloading to host memory (``activation_offload``), measured grade.

What it stands for, placed as torchtune's recipes place it (``full_finetune_single_device.py``:
``with self.activations_handling_ctx: logits = self._model(**batch)``, the loss computed outside, and
``get_act_offloading_ctx_manager`` wrapping the output head in a ``NoOpManager``): the saved-tensor
hooks run around the base model (embedding, decoder layers, final norm); the LM head and the loss
keep their tensors on the device.

* ``save_on_cpu``: ``torch.autograd.graph.save_on_cpu`` (``torch/autograd/graph.py``): the pack hook
  copies every tensor autograd saves to host memory, once per save, parameters included; the device
  copy is freed once the forward drops it; the unpack hook copies it back for the node that uses it.
* ``torchtune``: torchtune 0.6.1's ``OffloadActivations`` (``torchtune/training/_activation_offloading.py``):
  only tensors of at least ``min_offload_size`` = 1024 bytes that are not ``nn.Parameter`` /
  buffers are copied (lines 150-153), so weights stay on the device and are not copied; with
  ``use_streams`` (the default) the last ``max_fwd_stash_size`` = 5 packed tensors stay referenced on
  the device until a later pack (lines 155-163, ``fwd_stash``), and in the backward the tensors
  brought back for a node are freed only after the next node runs (``bwd_tensor_stash``, lines
  263-338): derived from the source (its streams need CUDA), **unvalidated**.

Device (every phase): the base model's saved tensors leave the device (the decoder layers, the
embedding output, RoPE's tables, the final norm's own saved tensors); its output, which the LM head
saves, stays. RoPE's tables in the family's own form and size (cos/sin or a complex64 freqs_cis, any
``term_keys.ROPE_TABLE_KEYS``: each family's rewrite resizes the host copy as the device's); with every
layer checkpointed they stay on the device, never packed (the checkpointed layer's recompute closure
holds them; measured, ``offload_terms``). Host memory (``result.host_memory``, tier ``host``): what was copied, per rank.
Measured with a simulated GPU (``validation/techniques/offload/``, the pack hook's host copies made
outside the tracker).

Combined with activation checkpointing (torchtune's ``enable_activation_checkpointing`` and
``enable_activation_offloading`` together): a checkpointed layer saves only its input, so that input
is what goes to the host; the recomputed layer's tensors are saved outside the hooks' scope of the
forward and stay on the device (its working set).

Under LoRA (``lora_terms``): torchtune's mode only, as its LoRA recipe runs it (checkpointing required) around
compiled, then checkpointed blocks (``compile="blocks"``, torchtune's order): each layer's input and the final
norm's saves copied to the host, the forward stash (``_stash``) and the backward's copies freed one node late
(``bwd_tensor_stash``) modelled from torchtune 0.6.1's source and measured with its hooks replayed on the CPU
(validation/lora_offload: every phase within 0.5 %, the host bytes exact). Refused: ``save_on_cpu``, no
checkpointing, eager LoRA layers.

In full training around compiled blocks (``full_blocks_terms``: ``compile="blocks"`` in torchtune's order, full
checkpointing, as full_finetune_single_device runs ``compile: True``): the same mechanism, the hook seeing the
embedding's token ids first and the final norm's normalized product last (its weight trains), with and without
``optimizer_in_backward``; measured (validation/offload_full: every phase within 0.25 % but one compile term's
-1.65 %, the host bytes exact). Around eager layers with full checkpointing (``eager_full_terms``) the host and the
end of the forward follow the same packs (measured: exact, and the eager profile's own error); without
checkpointing the derived mode stays unvalidated and undercounts (its note: the matmuls' transposed weights).
"""

from __future__ import annotations

import attrs

from mlsysim_core import _checks
from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, BACKWARD_END, FORWARD, HOST, MemoryTerm

from . import term_keys as K

OPTION = "activation_offload"
MODES = ("save_on_cpu", "torchtune")
SAVED = (FORWARD, BACKWARD)
# Terms of the base model (outside the decoder layers) whose saved tensors the hooks move (their keys).
BASE_MODEL = (K.EMBEDDING_OUTPUT, *K.ROPE_TABLE_KEYS)
LAYERS = (K.LAYERS_SAVED, K.CHECKPOINTED_INPUTS)
MIN_OFFLOAD_BYTES = 1024        # torchtune's min_offload_size
FWD_STASH = 5                   # torchtune's max_fwd_stash_size


def prepare_option(plan, value):
    """Check ``activation_offload`` (``options.prepare``): the plan with it set, and its notes."""
    value = _checks.name(OPTION, value, MODES)
    o = plan.profile_options
    if plan.rank is not None or plan.pp_size * plan.tp_size * plan.cp_size > 1:
        raise NotModelledError(OPTION, value, "no tensor, pipeline or context parallelism",
                               "offloading under model-parallel layouts (several micro-batches in flight, "
                               "split layers) is not measured")
    if o.lora is not None:
        _check_lora(plan, value)
    elif o.compile:
        _check_full_blocks(plan, value)
    if o.regime.main_grad:
        raise NotModelledError(OPTION, value, "a PyTorch regime", "Megatron-Core's layers are not offloaded here")
    notes = []
    if o.lora is not None:
        notes.append(LORA_NOTE)
        if plan.gradient_accumulation_steps > 1:
            notes.append("activation_offload=torchtune with LoRA and gradient accumulation: derived (each micro-batch "
                         "offloads as one step does, the adapters' gradients alive throughout); measured with one "
                         "micro-batch per step")
    elif o.compile:
        notes.append(FULL_NOTE)
        if plan.gradient_accumulation_steps > 1:
            notes.append("activation_offload=torchtune with compiled blocks and gradient accumulation: derived (each "
                         "micro-batch offloads as one step does); measured with one micro-batch per step")
    elif value == "torchtune":
        from .checkpointing import whole_layers
        notes.append("activation_offload=torchtune is derived from torchtune 0.6.1's OffloadActivations source "
                     "(tensors >= 1 KiB that are not parameters; streams need CUDA): unvalidated"
                     + ("; with full checkpointing the host copies and the end of the forward as measured around "
                        "eager layers (validation/offload_full), the top layer's forward with up to 5 inputs "
                        "still stashed not counted" if whole_layers(plan) else
                        "; not counted: the matmuls' transposed weights (F.linear's weight.t(), not an "
                        "nn.Parameter) copied to the host and back, the forward stash of 5 and the backward's "
                        "copies freed one node late (measured around 2 eager layers without checkpointing, "
                        "validation/offload_full: host -38 % bf16, -10 % fp32; backward -26 to -29 %; forward "
                        "-10 to -16 %)"))
    from .checkpointing import recomputes
    if recomputes(plan) not in ("nothing", "layers"):     # declared, not named: none and full measured
        notes.append(f"activation_offload with {plan.activation_checkpointing!r} checkpointing: the strategy's "
                     "saved tensors are offloaded as counted (measured with none only)")
    plan = attrs.evolve(plan, profile_options=attrs.evolve(o, activation_offload=value),
                        notes=plan.notes + tuple(notes))
    return plan


# --- LoRA (torchtune's lora_finetune_single_device with enable_activation_offloading) ----------------------------

LORA_NOTE = ("activation_offload=torchtune with LoRA: torchtune 0.6.1's OffloadActivations around compiled, "
             "checkpointed LoRA blocks (each layer's input and the final norm's saved tensors copied to the host, "
             "the forward stash of 5, the backward's copies freed one node late), measured on the CPU with the "
             "host copies simulated (validation/lora_offload); the CUDA caching allocator's stream-ordered reuse "
             "is not modelled")


def _check_lora(plan, value):
    """What is measured of offloading under LoRA: torchtune's ``OffloadActivations`` as its LoRA recipe runs it
    (``enable_activation_checkpointing`` required, recipes/lora_finetune_single_device.py:167-175), with each
    layer compiled and then checkpointed (``compile=True``: ``compile="blocks"``, torchtune's order) on one device."""
    from .checkpointing import whole_layers
    from .compile import BLOCKS, blocks, outside
    o = plan.profile_options
    if value != "torchtune":
        raise NotModelledError(OPTION, value, "'torchtune' with LoRA",
                               "save_on_cpu around a LoRA model is not measured (validation/lora_offload measures "
                               "torchtune's OffloadActivations)")
    if not whole_layers(plan):
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "'full' (every layer) with activation_offload='torchtune' and LoRA",
                               "torchtune's LoRA recipes raise without enable_activation_checkpointing "
                               "(recipes/lora_finetune_single_device.py:172-175, torchtune 0.6.1)")
    if o.compile != BLOCKS or not blocks(plan) or not outside(plan):
        raise NotModelledError("compile", o.compile, f"{BLOCKS!r} in torchtune's order (compile_checkpoint None or "
                               "'outside') with activation_offload='torchtune' and LoRA",
                               "offloading is measured around torchtune's compiled, then checkpointed LoRA blocks "
                               "(validation/lora_offload); the eager LoRA layers under offloading are not")


def _final_norm_packs(plan) -> tuple[tuple[str, int], ...]:
    """What the final norm's saves hand the pack hook, in order, as (tensor, bytes): torchtune 0.6.1's ``RMSNorm``
    (torchtune/modules/rms_norm.py: ``F.rms_norm(x.float(), normalized_shape, weight=self.scale, eps)``), run as
    its composite (``x.pow(2)`` saves the fp32 x, ``rsqrt`` its output r, ``x * r`` r and x, ``* weight`` the
    weight "w", a parameter): the packs recorded by validation/lora_offload (``packs``), the same in fp32 and bf16
    on the CPU. (In 16 bits the fp32 input and the 16-bit weight differ in dtype, so CUDA runs the composite too;
    an fp32 CUDA run may take the fused kernel, whose node saves x, rstd and the weight: not measured.)"""
    from .shapes import shape_of
    T, h = plan.microbatch * plan.seq_len, shape_of(plan).hidden
    w = plan.profile_options.regime.weight * h
    packs = (("x", 4 * T * h), ("r", 4 * T), ("r", 4 * T), ("x", 4 * T * h), ("w", w))
    if plan.profile_options.lora is None:
        # full training: the weight needs a gradient too, so its multiply saves the normalized fp32 product "xn"
        # after the weight (validation/offload_full: the packs x, r, r, x, w, xn)
        packs += (("xn", 4 * T * h),)
    return packs


def _packs(plan) -> list[tuple[str, int]]:
    """What one forward hands the pack hook, in order, as (tensor, bytes): in full training first the embedding's
    int64 token ids (``F.embedding`` saves its indices when the weight needs a gradient: 8 T; the batch's own
    tensor, so its device copy costs nothing), then each checkpointed layer's input, then the final norm's packs
    (validation/offload_full and validation/lora_offload record these sequences)."""
    from .shapes import shape_of
    L, T = plan.model.layers, plan.microbatch * plan.seq_len
    c, h = plan.profile_options.regime.compute, shape_of(plan).hidden
    ids = [("ids", 8 * T)] if plan.profile_options.lora is None else []
    return ids + [("layer", c * T * h)] * L + list(_final_norm_packs(plan))


def _stash(plan):
    """The forward stash's rule run over the packs of one forward (torchtune/training/_activation_offloading.py
    lines 135-192: every pack takes the next id; a tensor of at least 1 KiB that is not a parameter is copied to
    the host, and then every stashed device tensor with id <= this id - 5 is dropped): each checkpointed layer's
    input (its one saved tensor: ``torch.utils.checkpoint``'s ``save_inputs``; what the compiled block saves goes
    to the checkpoint's own hooks), then the final norm's packs. Returns (layer inputs stashed while the top
    block runs, layer inputs stashed at the forward's end, the host bytes of the norm's copies, the norm's
    offloaded packs all stashed at the end)."""
    packs = _packs(plan)
    layer = [i for i, (name, _) in enumerate(packs, start=1) if name == "layer"]
    moved = [n >= MIN_OFFLOAD_BYTES and name != "w" for name, n in packs]
    stash, top = [], None
    for i, is_moved in enumerate(moved, start=1):
        if is_moved:
            stash = [j for j in stash if j > i - FWD_STASH] + [i]
        if i == layer[-1]:
            top = sum(1 for j in stash if j in layer)
    L = len(layer)
    if not moved[layer[0] - 1]:        # inputs under 1 KiB stay on the device
        top = L
    end = sum(1 for j in stash if j in layer) if moved[layer[0] - 1] else L
    norm = sum(n for (name, n), m in zip(packs, moved) if m and name != "layer")
    # every tensor of the final norm the hook copied is still stashed by one of its packs (a tensor saved twice
    # is stashed by its later pack)
    kept = all(any(packs[j - 1][0] == name for j in stash)
               for i, ((name, _), m) in enumerate(zip(packs, moved), start=1) if m and i > layer[-1])
    return top, end, norm, kept


def _lora_excess(plan, placement) -> float:
    """The top compiled block's forward beyond what the end of the forward holds in its place, unclipped
    (compile.lora_full_terms' ``excess``, the same arithmetic)."""
    from . import lora as lora_mod
    from .compile import _context, _lora_full_mlp, lora_layer_saved
    ctx, kernel = _context(plan, placement)
    s, regime, T = ctx.shape, ctx.regime, ctx.tokens
    c, h, r = regime.compute, s.hidden, plan.profile_options.lora.rank
    other, out, _ = lora_layer_saved(plan, s, regime, kernel, True)
    mlp, adapted = _lora_full_mlp(plan)
    down = next(op for op in mlp if op.reduced)
    firsts = [op for op in mlp if op.op == "mm" and not op.reduced]
    forward = (max(other - c * r + sum(op.nbytes for op in firsts), other + 2 * down.nbytes) if adapted
               else other + mlp[-2].nbytes + out)
    last = c * T * h if c == 4 else 0
    during = (K.TOKEN_IDS, *K.ROPE_TABLE_KEYS)
    loss_side = sum(t.nbytes for t in lora_mod.model_activation_terms(plan, placement, recompute=True)
                    if FORWARD in t.phases and t.key not in during)
    return forward * T - last - loss_side


def lora_terms(plan, placement, terms, where: str) -> list[MemoryTerm]:
    """The LoRA terms with torchtune's offloading (``_check_lora``): compiled blocks wrapped in the checkpoint,
    inside ``OffloadActivations`` (the LM head in its ``NoOpManager``, the loss outside). Derived from
    torchtune/training/_activation_offloading.py (0.6.1) and measured (validation/lora_offload), T = b x s, c the
    compute dtype's bytes, L layers:

    * **host**: each layer's input, copied once (L x c T h), and the final norm's packs, one copy per save
      (``_final_norm_packs``);
    * **the forward**: the device keeps the stashed layer inputs (``_stash``): at the top block's compiled forward
      the last 5 (min(L, 5)), at the end of the forward those still among the last 5 ids (the final norm's packs
      follow); the final norm's saved tensors are all stashed, so on the device as without offloading;
    * **the backward**: the stash lives until the final norm's first node; from then each layer's backward copies
      its input back (c T h) and frees the previous node's copies after its own node (``bwd_tensor_stash``,
      ``prev_node_ids``): the top block's moment holds its input and the final norm's last copy brought back (its
      fp32 x); a lower block's the input of the block above too, beside the adapters' gradients born
      since (and one RNG state fewer per block), the first block's with its smaller saved set: the largest."""
    from . import lora as lora_mod
    from .compile import _context, lora_layer_saved, _rng
    top, end, norm, kept = _stash(plan)
    if not kept:
        raise NotModelledError(OPTION, "torchtune", "a final norm whose saves fit the forward stash",
                               "its saved tensors would be copied back from the host in the backward: not measured")
    ctx, kernel = _context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, placement.layers_per_stage
    c, h = regime.compute, s.hidden
    x = c * T * h
    moved = x >= MIN_OFFLOAD_BYTES
    if where == "model":
        if not norm:
            return terms
        return terms + [MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM,
                                   label="final norm: its saved tensors (offloaded to host memory)", nbytes=norm,
                                   phases=SAVED, tier=HOST,
                                   formula=f"{_n(norm)} B: one host copy per save (torchtune's RMSNorm, "
                                           f"{len(_final_norm_packs(plan))} packs); the device copies stay "
                                           "stashed until the norm's backward")]
    out = []
    for t in terms:
        if t.key == K.CHECKPOINTED_INPUTS and tuple(t.phases) == SAVED and moved:
            out.append(attrs.evolve(t, nbytes=t.nbytes - (L - end) * x,
                                    label=f"{t.label}: {end} in the forward stash at the forward's end",
                                    formula=f"{t.formula} - {L - end} x {_n(x)} B (copied to the host; {end} still "
                                            "stashed)"))
            out.append(_host(t, L * x, f"{L} x {_n(x)} B: each layer's input, copied once"))
        elif tuple(t.phases) == (FORWARD,) and moved:       # the top compiled block's forward (compile.lora_full_terms)
            out.append(t)
        elif tuple(t.phases) == (BACKWARD_END,) and moved:  # the top block's recompute and MLP backward
            g = regime.gradient or 4
            grow = 0 if plan.gradient_accumulation_steps > 1 else lora_mod.stage_trainable(plan, 1) * g
            rng = _rng(plan)
            other = lora_layer_saved(plan, s, regime, kernel, True)[0]
            first = lora_layer_saved(plan, s, regime, kernel, False)[0]
            stale = 4 * T * h       # the final norm's fp32 x, brought back for its last node (pow's)
            moments = {"top": -(L - 1) * x + stale}
            if L > 2:
                for i in (1, L - 2):
                    moments[f"block {i}"] = -(L - 2) * x + (L - 1 - i) * (grow - rng)
            if L > 1:
                moments["block 0"] = -(L - 2) * x + (L - 1) * (grow - rng) - (other - first) * T
            which = max(moments, key=moments.get)
            nbytes = t.nbytes + moments[which]
            out.append(attrs.evolve(t, nbytes=nbytes, label=f"{t.label} (offloaded inputs: {which}'s moment)",
                                    formula=f"{t.formula}; offloaded: {_n(moments[which])} B at {which}'s moment "
                                            f"({', '.join(f'{k} {_n(v)}' for k, v in moments.items())}: the layers' "
                                            f"inputs on the host, one copied back (c T h = {_n(x)}), the previous "
                                            f"node's copy ({_n(stale)} B after the final norm, {_n(x)} after a "
                                            f"block), {_n(grow)} B of adapter gradients born and one {_n(rng)} B RNG "
                                            f"state freed per block, the first block's saved set "
                                            f"{_n((other - first) * T)} B smaller)"))
        else:
            out.append(t)
    if moved and top > end:
        excess = _lora_excess(plan, placement)
        extra = max(0.0, excess + (top - end) * x) - max(0.0, excess)
        if extra:
            out.append(MemoryTerm(component=ACTIVATIONS, label="layer inputs in the forward stash at the top "
                                  "block's forward", nbytes=extra, phases=(FORWARD,),
                                  formula=f"{top} stashed inputs then, {end} at the forward's end: {top - end} x "
                                          f"{_n(x)} B beyond the end of the forward" + (
                                              "" if excess >= 0 else f", less {_n(-excess)} B the loss's forward "
                                              "holds beyond the top block's")))
    return out


# --- full training around compiled blocks (torchtune's full_finetune_single_device with compile=True) ------------

FULL_NOTE = ("activation_offload=torchtune with compiled blocks: torchtune 0.6.1's OffloadActivations around compiled, "
             "checkpointed blocks in full training (the token ids, each layer's input and the final norm's saved "
             "tensors copied to the host, the forward stash of 5, the backward's copies freed one node late), "
             "measured on the CPU with the host copies simulated (validation/offload_full); the CUDA caching "
             "allocator's stream-ordered reuse is not modelled")


def _check_full_blocks(plan, value):
    """What is measured of offloading around compiled blocks in full training: torchtune's ``OffloadActivations``
    with every layer compiled, then checkpointed (``compile="blocks"``, ``compile_checkpoint="outside"``: torchtune's
    order, recipes/full_finetune_single_device.py ``_setup_model``) on one device (validation/offload_full)."""
    from .checkpointing import whole_layers
    from .compile import BLOCKS, blocks, outside
    o = plan.profile_options
    if value != "torchtune":
        raise NotModelledError(OPTION, value, "'torchtune' with compile",
                               "save_on_cpu around compiled blocks is not measured (validation/offload_full measures "
                               "torchtune's OffloadActivations)")
    if o.compile != BLOCKS or not blocks(plan):
        raise NotModelledError("compile", o.compile, f"{BLOCKS!r} with activation_offload='torchtune'",
                               "offloading is measured around torchtune's per-block compile (validation/offload_full), "
                               "not around a whole compiled model or a compiled loss function")
    if not whole_layers(plan) or not outside(plan):
        raise NotModelledError("activation_checkpointing", plan.activation_checkpointing,
                               "'full' (every layer) in torchtune's order (compile_checkpoint='outside') with "
                               "compile='blocks' and activation_offload='torchtune'",
                               "offloading around compiled blocks is measured with torchtune's full checkpointing "
                               "wrapped around each compiled block (validation/offload_full)")
    if plan.profile_options.regime.compute * plan.microbatch * plan.seq_len * _hidden(plan) < MIN_OFFLOAD_BYTES:
        raise NotModelledError("seq_len", plan.seq_len, "a layer input of at least 1 KiB (torchtune's "
                               "min_offload_size)", "layer inputs kept on the device are not measured")


def full_blocks_terms(plan, placement, terms) -> list[MemoryTerm]:
    """The compiled blocks' terms in full training (compile.blocks_outside_full_terms: the layers' inputs, the top
    block's forward, the backward's top) with torchtune's offloading (``_check_full_blocks``). Derived from
    torchtune/training/_activation_offloading.py (0.6.1) and measured (validation/offload_full: the hooks replayed
    on the CPU), T = b x s, c the compute dtype's bytes, x = c T h a layer's input, L layers:

    * **host**: the token ids the embedding saves (8 T), each layer's input (L x), the final norm's packs, one copy
      per save (``_final_norm_packs``: the fp32 x twice, rsqrt twice, the normalized product once);
    * **the forward**: the stash (``_stash``) keeps min(L, 5) layer inputs while the top block's compiled forward
      runs and none at the forward's end (the final norm's 5 offloaded packs follow them); the final norm's tensors
      are all stashed (on the device as without offloading) until its first backward node;
    * **the backward**: each layer's backward copies its input back (x) and frees the previous node's copies after
      its own node (``bwd_tensor_stash``): the top block's moment holds its input and the final norm's fp32 x
      brought back (4 T h) in place of every layer's input; layer 0's the input of layer 1 beside its own (as
      ``kept`` in ``checkpointing_policies.last_moments``); the embedding's backward the token ids brought back
      (8 T) and layer 0's input, not yet freed. With ``optimizer_in_backward`` the larger of the top block's and
      the end's moments (compile.blocks_outside_full_terms' choice), without it the end's."""
    from . import model
    from ..checkpointing_policies import _mlp_backward_peak, last_moments
    from .compile import _context, _ops, _rng, layer_saved
    top, end, other, kept = _stash(plan)
    if not kept:
        raise NotModelledError(OPTION, "torchtune", "a final norm whose saves fit the forward stash",
                               "its saved tensors would be copied back from the host in the backward: not measured")
    ctx, kernel = _context(plan, placement)
    s, regime, T, L = ctx.shape, ctx.regime, ctx.tokens, ctx.layers
    c, h, g, r = regime.compute, s.hidden, regime.gradient or 4, regime.residual
    x = r * T * h
    rng = _rng(plan)
    # compile.blocks_outside_full_terms' quantities (the same arithmetic)
    per_token, how = layer_saved(s, regime, kernel, plan.seq_len, ctx.tensor)
    ops = _ops(s, regime, kernel, plan.seq_len)
    product = max((prev.nbytes for prev, op in zip(ops, ops[1:]) if op.reduced and prev.op == "mm"), default=0)
    output = ops[-1].nbytes if ops[-1].reduced else 0
    accumulating = plan.gradient_accumulation_steps > 1
    tied = s.embedding_parameters * g if s.tied and not accumulating else 0
    work = (per_token - output + product) * T + product // c * h * g + tied
    acts = model.model_activation_terms(plan, placement, recompute=True)
    during = (K.TOKEN_IDS, *K.ROPE_TABLE_KEYS, K.EMBEDDING_OUTPUT)
    later = sum(t.nbytes for t in acts if FORWARD in t.phases and t.key not in during)
    last = c * T * h if c == 4 else 0
    end_only = sum(t.nbytes for t in acts if tuple(t.phases) == (BACKWARD_END,))
    rope = K.rope_table_bytes(acts)
    out = []
    for t in terms:
        if t.key == K.CHECKPOINTED_INPUTS and tuple(t.phases) == SAVED:
            out.append(attrs.evolve(t, nbytes=end * x, label=f"{t.label}: {end} in the forward stash at the "
                                    "forward's end", formula=f"{end} x T x h x {r} B ({L - end} copied to the host)"))
            out.append(_host(t, L * x, f"{L} x {_n(x)} B: each layer's input, copied once"))
        elif tuple(t.phases) in ((FORWARD,), (BACKWARD_END,)):
            continue        # the top block's forward and the backward's top: below
        else:
            out.append(t)
    out.append(_ids_and_norm_on_host(other))
    forward = per_token * T + L * rng + (top - end) * x - later - last
    if forward > 0:
        out.append(MemoryTerm(component=ACTIVATIONS, label="the top compiled block's forward (its saved set before the "
                              "checkpoint drops it; layer inputs in the forward stash)", nbytes=forward,
                              phases=(FORWARD,),
                              formula=f"T x {_n(per_token)} B ({how}; the block's whole compiled set)"
                                      + (f" + {L} x {rng:,} B (CPU RNG states)" if rng else "")
                                      + f" + {top - end} x {_n(x)} (stashed layer inputs then, {end} at the forward's "
                                      f"end) - {_n(later)} B (the final norm's, the logits' and the loss's forward "
                                      "terms, not yet)" + (" - T x h x 4 (the top block's output, counted as the "
                                                           "final norm's input)" if last else "")))
    lb = model.layer_bytes(plan, ctx)
    eager_mlp, _ = _mlp_backward_peak(ctx, lb, regime, accumulating)
    lb = attrs.evolve(lb, saved=work - eager_mlp)
    stale = x if L > 1 else 4 * T * h
    layer0 = last_moments(plan, placement, ctx, lb, kept=stale, unborn_layers=1)
    # the embedding's moment alone (layer 0's priced below any): its backward holds the ids brought back and layer
    # 0's input, freed after it
    embedding = last_moments(plan, placement, ctx, lb, kept=float("-inf"), unborn_layers=1).nbytes + x + 8 * T
    moments = {"layer 0's recompute and MLP backward (layer 1's input not yet freed)": layer0.nbytes,
               "the embedding's backward (the token ids and layer 0's input brought back)": embedding}
    if getattr(plan.profile_options, "optimizer_in_backward", None):
        moments["the top block's recompute and MLP backward (optimizer in backward: no other gradient alive)"] = (
            x + 4 * T * h + (L - 1) * rng + r * T * h + rope + work - end_only)
    which = max(moments, key=moments.get)
    out.append(MemoryTerm(component=ACTIVATIONS, label=f"offloaded inputs: {which}", nbytes=moments[which],
                          phases=(BACKWARD_END,),
                          formula="; ".join(f"{k}: {_n(v)}" for k, v in moments.items()) + f" (top: its input "
                                  f"{_n(x)} + the final norm's fp32 x brought back {_n(4 * T * h)} + its output's "
                                  f"gradient + RoPE {_n(rope)} + its recompute and MLP backward {_n(work)} - the "
                                  f"end-of-backward terms {_n(end_only)}; layer 0: " + layer0.formula + ")"))
    return out


def eager_full_terms(plan, terms) -> list[MemoryTerm]:
    """Eager layers under full checkpointing with torchtune's offloading in full training: the mechanism of
    ``full_blocks_terms`` (the hook sees the token ids, each checkpointed layer's input and the final norm's saves;
    measured: the same packs, validation/offload_full's eager runs) on the eager terms: the layers' inputs leave the
    device but the stashed ones (none at the forward's end), the final norm's tensors stay on it (stashed until its
    backward; RoPE's tables are inside torchtune's layers, not seen by the hook), the host holds the ids, every
    input and the norm's per-save copies. The backward is as without offloading: an eager layer's backward is many
    nodes, and the input of the layer above, brought back, is freed after the first of them, before the MLP's
    backward (measured: the backward's peak the same to the byte with and without offloading). Not counted: the top
    layer's forward with min(L, 5) inputs still stashed (the eager profile does not price a layer's forward
    transient; with 3 fp32 layers it is the forward's peak, -6.8 % there)."""
    from .shapes import shape_of
    top, end, other, kept = _stash(plan)
    if not kept:
        raise NotModelledError(OPTION, "torchtune", "a final norm whose saves fit the forward stash",
                               "its saved tensors would be copied back from the host in the backward: not measured")
    regime, T, h = plan.profile_options.regime, plan.microbatch * plan.seq_len, shape_of(plan).hidden
    L = plan.model.layers
    x = regime.residual * T * h
    if x < MIN_OFFLOAD_BYTES:
        return terms
    out = []
    for t in terms:
        if t.key == K.CHECKPOINTED_INPUTS and tuple(t.phases) == SAVED:
            out.append(attrs.evolve(t, nbytes=end * x, label=f"{t.label}: {end} in the forward stash at the "
                                    "forward's end", formula=f"{end} x T x h x {regime.residual} B ({L - end} copied "
                                    "to the host)"))
            out.append(_host(t, L * x, f"{L} x {_n(x)} B: each layer's input, copied once"))
        else:
            out.append(t)
    out.append(_ids_and_norm_on_host(other))
    return out


def _ids_and_norm_on_host(nbytes) -> MemoryTerm:
    """Full training's token ids and final norm packs, copied to the host once per save."""
    return MemoryTerm(component=ACTIVATIONS, label="token ids and final norm: their saved tensors (offloaded to "
                      "host memory)", nbytes=nbytes, phases=SAVED, tier=HOST,
                      formula=f"8 T (the embedding's int64 indices) + the final norm's packs, one copy per save "
                              f"(2 x 4 T h fp32 x, 2 x 4 T rsqrt, 4 T h the normalized product) = {_n(nbytes)} B; "
                              "the device copies stay stashed until the norm's backward")


def _n(x) -> str:
    return f"{x:,.0f}"


def _host(term, nbytes, how) -> MemoryTerm:
    return attrs.evolve(term, tier=HOST, nbytes=nbytes, label=f"{term.label} (offloaded to host memory)",
                        formula=f"{term.formula}; {how}")


def offload_terms(plan, terms, where: str, placement=None) -> list[MemoryTerm]:
    """``terms`` of the decoder layers (``where="layers"``) or outside them (``"model"``) with the
    base model's saved tensors in host memory (LoRA's: ``lora_terms``, with the placement)."""
    if plan.profile_options.lora is not None:
        return lora_terms(plan, placement, terms, where)
    if plan.profile_options.compile:      # (_check_full_blocks: compiled blocks in torchtune's order)
        return full_blocks_terms(plan, placement, terms) if where == "layers" else terms
    from .checkpointing import whole_layers
    if plan.profile_options.activation_offload == "torchtune" and whole_layers(plan):
        return eager_full_terms(plan, terms) if where == "layers" else terms
    # Every layer checkpointed: the RoPE tables stay on the device and are never packed. Hugging Face's checkpointed
    # layer binds them into the recompute closure (transformers 5.23.0 modeling_layers.py line 120:
    # partial(forward, self, **kwargs), position_embeddings among the kwargs), which holds the tensor itself until
    # the layer's backward; the checkpoint's hooks see the layer's saves, save_on_cpu only the hidden states it
    # saves as the checkpoint's input. Measured (validation/techniques/offload, save-on-cpu-gqa-tiny-fp32-ckpt):
    # each layer packs T x h x 4 B, no table; the device holds the table in the forward and the backward.
    rope_on_device = where == "model" and whole_layers(plan)
    out = []
    for t in terms:
        if rope_on_device and t.key in K.ROPE_TABLE_KEYS:
            out.append(t)
            continue
        moved = (where == "layers" and t.key in LAYERS) or (where == "model" and t.key in BASE_MODEL)
        if moved and tuple(t.phases) == SAVED and t.key == K.LAYERS_SAVED:
            nbytes, how = host_layers(plan, t.nbytes)
            out.append(_host(t, nbytes, how))
        elif moved and tuple(t.phases) == SAVED:
            if where == "model" and _exact(plan):
                continue        # copied by the first layer's norm and each layer's rotary: in the layers' count
            out.append(_host(t, t.nbytes, "copied by the pack hook, freed on the device"))
        elif where == "model" and t.key == K.FINAL_NORM and tuple(t.phases) == SAVED:
            # The final norm's output is the LM head's input, saved by the LM head outside the hooks.
            regime = plan.profile_options.regime
            kept = regime.compute * plan.microbatch * plan.seq_len * _hidden(plan)
            out.append(attrs.evolve(t, label="final norm output (saved by the LM head, on the device)",
                                    key=K.FINAL_NORM_OUTPUT,
                                    nbytes=kept, formula=f"c x T x h = {kept:,.0f} B"))
            if _exact(plan):    # the norm's 3 T h + 2 T (and its weight) and the embedding's int64 ids, per save
                T, h = plan.microbatch * plan.seq_len, _hidden(plan)
                w = h if plan.profile_options.activation_offload == "save_on_cpu" else 0
                out.append(_host(t, 4 * (3 * T * h + 2 * T + w) + 8 * T,
                                 f"4 x (3 T h + 2 T{' + h' if w else ''}) (the final norm, per save) + 8 T (the "
                                 "embedding's int64 ids) copied by the pack hook"))
            else:
                out.append(_host(t, t.nbytes - kept, "the norm's own saved tensors, copied by the pack hook"))
        else:
            out.append(t)
    return out


def _exact(plan) -> bool:
    """fp32 layers of a family that declares its per-save copies (``ArchitectureFamily.pack_hook_copies``:
    Llama's) with a kernel that declares it computes SDPA, no dropout, no recompute: the per-save host
    count measured to the byte (validation/techniques/offload, and validation/examples for save_on_cpu
    around the whole model). Declarations, never a family's or a kernel's name."""
    from .kernels import kernel_of
    from .shapes import shape_of
    from .checkpointing import keeps_everything
    o, shape = plan.profile_options, shape_of(plan)
    architecture = (plan.model.architecture or "").lower()
    regime = o.regime
    return (shape.family.pack_hook_copies is not None
            and not (architecture and shape.family.approximation(architecture))
            and (regime.weight, regime.compute, regime.residual, regime.autocast) == (4, 4, 4, False)
            and kernel_of(plan).sdpa and not o.dropout and keeps_everything(plan))


def host_layers(plan, device_bytes) -> tuple[float, str]:
    """Host bytes of the decoder layers' copies, and how. The pack hook copies a tensor once per op
    that saves it, and ``save_on_cpu`` copies the weights the matmuls and norms save too (torchtune's
    OffloadActivations skips parameters). Llama-style fp32 SDPA layers, per layer (T = b x s)::

        4 B x (11 T h + 3 T q + 2 T kv + T a + 4 T + 4 T f + 4 s d_rot)  [+ 4 B x P_layer, save_on_cpu]

    (each RMSNorm 3 T h + 2 T; q, k, v each save the normed input; RoPE cos and sin for q and for k;
    SDPA q, k, v, output, the fp32 logsumexp; o_proj its input; the MLP 2 T h + 4 T f): the formula of
    the example package mlsysim-activation-offload, measured to the byte again here. Elsewhere the
    profile's count (each tensor once) plus the weights, an approximation the formula says."""
    from .shapes import shape_of
    shape, L = shape_of(plan), plan.model.layers
    weights = shape.layer_parameters() if plan.profile_options.activation_offload == "save_on_cpu" else 0
    wb = plan.profile_options.regime.weight
    if _exact(plan):
        elements = shape.family.pack_hook_copies(shape, plan.microbatch * plan.seq_len, plan.seq_len)
        total = L * 4 * (elements + weights)
        return total, (f"{L} layers x 4 B x ({elements:,} saved elements, one copy per save"
                       + (f" + {weights:,} weights" if weights else "") + f") = {total:,.0f} B on the host")
    total = device_bytes + L * weights * wb
    return total, (f"{device_bytes:,.0f} B (the profile's count, each tensor once)"
                   + (f" + {L} x {weights:,} weights x {wb} B" if weights else "")
                   + f" = {total:,.0f} B on the host; approximation: the per-save copies are measured only for "
                   "Llama-style fp32 SDPA layers (about 1.3 x the profile's count there)")


def _hidden(plan) -> int:
    from .shapes import shape_of
    return shape_of(plan).hidden


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """Seconds the offload adds to a step, and how: the bytes copied to the host in the forward and
    back in the backward, over the host link, ``2 x host bytes / host_link_bytes_per_s``; exposed in
    full (the copies are assumed not overlapped with compute: an upper bound; torchtune's streams hide
    part of it). ``(None, why)`` without a link bandwidth."""
    if host_link_bytes_per_s is None:
        from .technique_fit import given_as
        return None, f"activation offload: needs the host link's bandwidth (bytes/s: {given_as('host link B/s')})"
    host = offloaded_bytes(plan)
    seconds = 2 * host / host_link_bytes_per_s
    return seconds, (f"activation offload: 2 x {host:,.0f} B (to the host in the forward, back in the backward) / "
                     f"{host_link_bytes_per_s:,.0f} B/s, not overlapped with compute (an upper bound; torchtune's "
                     "second stream hides part of it behind compute)")


def offloaded_bytes(plan) -> float:
    """The bytes the hooks copy to the host in one step of a prepared one-device plan: every decoder
    layer's saved tensors (a checkpointed layer's input), the embedding output and RoPE's tables."""
    from . import model
    from .shapes import shape_of
    shape, regime = shape_of(plan), plan.profile_options.regime
    T = plan.microbatch * plan.seq_len
    ctx = model.Context(shape=shape, tokens=T, seq_len=plan.seq_len, layers=plan.model.layers, shards=1,
                        regime=regime)
    lb = model.layer_bytes(plan, ctx)
    from .checkpointing import whole_layers
    per_layer = (regime.residual * T * shape.hidden if whole_layers(plan)
                 else lb.saved + (lb.output if lb.output_saved_by_next else 0))
    rope = 2 * plan.seq_len * shape.rotary_dim * (4 if regime.residual == 4 else 2)
    return plan.model.layers * per_layer + regime.residual * T * shape.hidden + rope


def optimizer_offload_step_time(plan, host_memory_bytes_per_s=None, host_link_bytes_per_s=None):
    """Seconds the ``offload`` option's host-side optimizer step adds, and how (DeepSpeed
    ZeRO-Offload, torchao's CPUOffloadOptimizer): the CPU step streams the state through host memory,
    ``state bytes / host_memory_bytes_per_s`` (read and written once: x 2), and the gradients go
    down and the updated parameters come up over the host link, ``(g + w) x params /
    host_link_bytes_per_s``; assumed not overlapped with compute (an upper bound: torchao copies each
    gradient as soon as it is ready). ``(None, why)`` without the bandwidths."""
    if not plan.profile_options.offload or host_memory_bytes_per_s is None or host_link_bytes_per_s is None:
        from .technique_fit import given_as
        return None, ("optimizer offload: needs offload and the host memory and host link bandwidths (bytes/s: "
                      f"{given_as('host memory B/s', 'host link B/s')})")
    regime = plan.profile_options.regime
    params = plan.model.parameters
    state = params * ((regime.master or 0) + 2 * regime.state)        # master copy and Adam's two moments
    link = params * ((regime.gradient or 4) + regime.weight)
    seconds = 2 * state / host_memory_bytes_per_s + link / host_link_bytes_per_s
    return seconds, (f"optimizer offload: 2 x {state:,.0f} B of state through host memory / "
                     f"{host_memory_bytes_per_s:,.0f} B/s + {link:,.0f} B of gradients down and parameters up / "
                     f"{host_link_bytes_per_s:,.0f} B/s, not overlapped (Adam-style state assumed)")
