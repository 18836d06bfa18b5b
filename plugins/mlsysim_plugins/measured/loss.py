"""The loss: Hugging Face's cross-entropy (the default), torchtune's chunked cross-entropy, or
Liger's fused linear cross-entropy (the measured profile's ``loss`` option, issue 16).

Notation: T = micro-batch x sequence tokens, V vocabulary, h hidden, c bytes of the compute
dtype, n = ``loss_chunks``, t the tokens of the largest chunk, w bytes of the LM head's weight.

``cross_entropy`` (``model.model_activation_terms``, unchanged): the LM head's logits (c T V) and
their fp32 copy (``ForCausalLMLoss``: ``logits.float()``, 4 T V) alive at the loss; the fp32
log-softmax saved for the backward (4 T V); the backward's ``nll_loss_backward`` and
``_log_softmax_backward_data`` outputs (2 x 4 T V).

``chunked``: torchtune 0.6.1's ``CEWithChunkedOutputLoss``
(torchtune/modules/loss/ce_chunked_output_loss.py lines 35-83) with the model's
``set_num_output_chunks`` (torchtune/modules/transformer.py lines 482-501: the LM head applied
to ``h.chunk(n, dim=1)``, a list of n logits chunks in the compute dtype), as
recipes/full_finetune_single_device.py runs it (lines 637-652: the loss inside the forward,
then ``del logits`` before the backward). What shrinks to one chunk and what stays whole:

* the logits in the compute dtype: whole (c T V, the list of chunks alive until the loss
  returns; never saved: the fp32 cast keeps no input);
* their fp32 copy (``compute_cross_entropy``: ``logits.float()``, line 42): one chunk (4 t V),
  freed once its log-softmax exists; none in fp32, where ``.float()`` is the chunk itself;
* the fp32 log-softmax (saved by ``F.cross_entropy`` for its backward): whole (4 T V: every
  chunk's, saved until its backward), so chunking saves only the fp32 copy in the forward;
* the cross-entropy backward's fp32 temporaries: one chunk (2 x 4 t V; the engine runs every
  chunk's loss backward before any LM head backward, the chunks' logits gradients (c T V)
  accumulating, each chunk's log-softmax freed as its backward ends);
* then the LM head's backward, one chunk at a time (sequence numbers: the chunks' matmuls were
  recorded before any loss op), each freeing its logits gradient: the second chunk's weight
  gradient partial meets the first's in the engine's input buffer and their out-of-place sum
  makes 3 x V h x c at once (under autocast the partials are bf16, cast to fp32 once at the
  end), beside the n - 2 logits gradients left (c T V (n - 2) / n). The largest of these
  moments and the last chunk's cross-entropy backward is the loss's backward.

LitGPT (litgpt/utils.py ``chunked_cross_entropy``, model.py ``lm_head_chunk_size``) chunks the
same way but casts nothing: in bf16-true its log-softmax is bf16 (c T V saved, not 4 T V). This
option models torchtune's; LitGPT's is not modelled.

``fused_linear``: Liger-Kernel v0.8.2's ``LigerFusedLinearCrossEntropyFunction``
(src/liger_kernel/ops/fused_linear_cross_entropy.py) as its Hugging Face patch calls it
(transformers/model/loss_utils.py ``LigerForCausalLMLoss``). The logits exist one chunk of t =
next_power_of_2(ceil(T / ceil(V / h))) tokens at a time (lines 64-70), overwritten in place by
their gradient (lines 159-197); the gradients of the LM head's input and weight are computed in
the forward (zero-filled buffers, lines 72-81: ``zeros_like(_input)``, T x h in the input's
dtype, and ``zeros_like(weight)``, V x h x w) and saved until the backward returns them (lines
431-435, 467-470), so the LM head keeps no input. Per chunk, beside the logits chunk (c t V):
``grad_logits_chunk @ weight`` (c t h, line 231) and ``torch.mm(grad_logits_chunk.t(),
_input_chunk).float()`` (line 257: c V h and, unless c = 4, its fp32 copy 4 V h) - on a CUDA GPU
of compute capability >= 8 with an fp32 weight and 16-bit logits (autocast) Liger takes
``torch.addmm(..., out_dtype=torch.float32)`` instead (lines 235-255: only the input chunk's
16-bit cast, 2 t h). The LM head's 16-bit copy under autocast is cached until autocast exits
and saved by nothing. Liger cannot run here (triton): derived from its source and measured on
an emulation (validation/techniques/loss/liger_emulation.py), so every result says unvalidated.
"""

from __future__ import annotations

import math

import attrs

from mlsysim_core import _checks
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, FORWARD, MemoryTerm

from .loss_implementations import LossContext
from . import term_keys as K

LOSSES = ("cross_entropy", "chunked", "fused_linear")     # the first built-ins (loss_implementations.py: all)
DEFAULT_CHUNKS = 8      # torchtune CEWithChunkedOutputLoss(num_output_chunks=8)
SAVED = (FORWARD, BACKWARD)
# model.model_activation_terms' cross-entropy terms, replaced here (by key).
_DEFAULT_KEYS = (K.LOG_SOFTMAX, K.SHIFTED_LABELS, K.CE_BACKWARD, K.LOGITS)
UNVALIDATED = ("loss='fused_linear' is unvalidated: Liger's fused linear cross-entropy needs triton (a GPU); "
               "its bytes are derived from liger-kernel v0.8.2's source and measured on a PyTorch emulation, "
               "not on Liger itself")
# A kernel launch on a GPU: the documented cost of an extra kernel (CUDA launch latency, ~5 us).
LAUNCH_S = 5e-6
_REFUSALS = {   # what a loss implementation does not declare it allows: (allowed, detail)
    "lora": "cross_entropy with LoRA",
    "megatron": "cross_entropy in the Megatron-Core regime",
    "tensor_parallel": "cross_entropy with tensor parallelism",
    "context_parallel": "cross_entropy with context parallelism",
    "softcapping": "cross_entropy with final logit soft-capping",
    "autocast": "a regime without autocast",
    "lora_tensor_parallel": "the default cross-entropy (logits all-gathered) with lora and tp_size > 1, or a loss "
                            "measured over LoRA's tensor-parallel adapters ('megatron_vocab_parallel' under "
                            "Megatron-Core's data-parallel rules (mcore-distopt, mcore-ddp) and "
                            "regime='mixed-bf16-main-grad')",
}


def _n(x) -> str:
    return f"{x:,.0f}"


def implementations(registry) -> dict:
    from .loss_implementations import registered
    return registered(registry)


def prepare(plan, registry=None):
    """Check ``loss``, ``loss_chunks`` and ``loss_token_share`` (called by the loss technique)
    against the registered loss implementations and keep them completed, with the implementation
    itself (``loss_implementation``); refuse what is not modelled, by name."""
    from .loss_implementations import BUILTIN
    impls = implementations(registry) if registry is not None else {i.name: i for i in BUILTIN}
    o = plan.profile_options
    loss = "cross_entropy" if o.loss is None else _checks.name("loss", o.loss, tuple(impls))
    impl = impls[loss]
    chunks = o.loss_chunks
    if chunks is not None:
        chunks = _checks.count("loss_chunks", chunks, minimum=1)
        if impl.chunks is None:
            chunked = [n for n, i in impls.items() if i.chunks is not None]
            raise InvalidInputError("loss_chunks", chunks, f"None unless loss is one of {', '.join(chunked)}",
                                    f"loss={loss!r}")
    elif impl.chunks is not None:
        chunks = impl.chunks
    share = getattr(o, "loss_token_share", None)
    notes = ()
    if share is not None:
        share = _checks.fraction("loss_token_share", share)
        if share == 0:
            raise InvalidInputError("loss_token_share", share, "a share of the tokens in (0, 1]", "no token counted")
        if not impl.token_share:
            notes += (f"loss_token_share={share:g} changes nothing here: loss={loss!r} computes every token's logits "
                      "(its ignored tokens too)",)
    if impl.terms is not None:      # (the default cross-entropy's terms, terms=None, are modelled everywhere)
        _refuse(plan, loss, impl)
    if impl.chunk_unit == "chunks" and chunks is not None and chunks > plan.seq_len:
        raise InvalidInputError("loss_chunks", chunks, f"at most the sequence length {plan.seq_len}",
                                f"{loss} chunks the sequence dimension")
    if impl.check is not None:
        impl.check(plan, chunks)
    if impl.note:
        notes += (impl.note.format(chunks=chunks, share=share if share is not None else 1.0),)
    notes += tuple(impl.notes)
    o = attrs.evolve(o, loss=loss, loss_chunks=chunks, loss_implementation=impl,
                     **({"loss_token_share": share} if share is not None else {}))
    return attrs.evolve(plan, profile_options=o, notes=plan.notes + notes)


def chosen(options):
    """The loss implementation ``options`` (a plan's profile options) chose, or None for the default
    cross-entropy: none chosen, or one that declares no terms of its own (``terms=None``: the default's),
    whatever its name."""
    impl = getattr(options, "loss_implementation", None)
    return None if impl is None or impl.terms is None else impl


def _refuse(plan, loss, impl):
    from .model import megatron
    o = plan.profile_options
    what = f"loss={loss!r}"
    allows = impl.allows
    if o.lora is not None and "lora" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["lora"],
                               f"{what} under LoRA: lora.model_activation_terms keeps the default cross-entropy")
    if o.lora is not None and plan.pp_size > 1 and impl.terms is not None:
        raise NotModelledError("loss", loss, "the default cross-entropy with lora and pp_size > 1",
                               f"pp_size={plan.pp_size}: a chunked or fused loss on the last stage under LoRA is not "
                               "measured")
    if o.lora is not None and plan.tp_size > 1 and "lora_tensor_parallel" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["lora_tensor_parallel"],
                               f"{what} under LoRA over tp={plan.tp_size}: measured, Megatron's unfused vocab-parallel "
                               "cross-entropy on the rank's V/tp logits (validation/lora_parallel/"
                               "measure_lora_tp_loss.py); its fused (torch.compile'd) variant and other losses are not")
    if megatron(o.regime) and "megatron" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["megatron"],
                               "Megatron-Core's cross-entropy is vocabulary-parallel and fused already"
                               " (loss='megatron_fused' models it)")
    if plan.tp_size > 1 and "tensor_parallel" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["tensor_parallel"],
                               f"{what} over tp={plan.tp_size}: the gathered or loss_parallel logits are not "
                               "modelled chunked or fused")
    if plan.cp_size > 1 and "context_parallel" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["context_parallel"],
                               f"{what} over cp={plan.cp_size} is not modelled")
    details = getattr(plan.model, "details", None) or {}
    if details.get("final_logit_softcapping") and "softcapping" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["softcapping"],
                               f"{what}: the soft-capped logits (Gemma 2) are not modelled chunked or fused")
    if o.regime is not None and getattr(o.regime, "autocast", False) and "autocast" not in allows:
        raise NotModelledError("loss", loss, _REFUSALS["autocast"],
                               f"{what} under autocast ({o.regime.name}) is not modelled")


def fused_chunk_tokens(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's chunk (fused_linear_cross_entropy.py lines 68-69): next_power_of_2(ceil(T /
    ceil(V / h))) tokens, at most T."""
    inc = -(-vocab // hidden)
    rows = -(-tokens // inc)
    return min(1 << (rows - 1).bit_length(), tokens)


def chunk_tokens(plan, chunks: int) -> int:
    """torchtune's largest chunk: ``h.chunk(n, dim=1)`` gives ceil(s / n) positions per chunk."""
    return plan.microbatch * math.ceil(plan.seq_len / chunks)


def loss_terms(plan, ctx, terms: list[MemoryTerm], *, lm_head_trainable: bool = True) -> list[MemoryTerm]:
    """The rank's model activation terms with the default cross-entropy's replaced by the
    chosen loss implementation's (the last pipeline stage only; ``model.model_activation_terms``
    calls it, and ``lora.model_activation_terms`` with ``lm_head_trainable=False`` for a frozen LM
    head): its declared terms, the LM head's input and autocast weight copy taken off where it
    declares it saves them not."""
    o = plan.profile_options
    impl = getattr(o, "loss_implementation", None)
    if impl is None or impl.terms is None or (plan.rank is not None and not plan.rank.last):
        return terms
    keep = [t for t in terms if t.key not in _DEFAULT_KEYS]
    if len(terms) - len(keep) != 4:      # never silently: the default's four terms are what is replaced
        raise RuntimeError(f"loss={o.loss!r}: expected the default cross-entropy's four terms, found "
                           f"{len(terms) - len(keep)}")
    s, regime = ctx.shape, ctx.regime
    T, h, V, c = ctx.tokens, s.hidden, s.vocab, regime.compute
    from .model import megatron
    split = ctx.tensor if megatron(regime) else 1      # Megatron's vocabulary-parallel logits
    if ctx.sequence != 1:                                # context parallelism: the rank's tokens
        T = T / ctx.sequence
    share = getattr(o, "loss_token_share", None) if impl.token_share else None
    valid = T if share is None else max(1, math.ceil(T * share))
    lctx = LossContext(plan=plan, tokens=T, valid=valid, hidden=h, vocab=V / split if split != 1 else V, compute=c,
                       weight=regime.weight,
                       gradient=regime.gradient or 4, chunks=o.loss_chunks, regime=regime, shape=s,
                       lm_head_trainable=lm_head_trainable)
    if not impl.casts_lm_head_once:      # its own casts, per matmul, in its terms: no cached or saved copy
        keep = [t for t in keep if t.key != K.LM_HEAD_AUTOCAST_COPY]
    if (not impl.saves_lm_head_input and lm_head_trainable) or not impl.saves_lm_head_weight_copy:
        # (a frozen LM head's input is in no term: lora.model_activation_terms)
        keep = _lm_head_kept(keep, impl, T, h, c, bool(regime.autocast), input_kept=lm_head_trainable)
    return keep + list(impl.terms(lctx))


def _lm_head_kept(keep, impl, T, h, c, autocast, input_kept=True) -> list[MemoryTerm]:
    """``keep`` without the LM head's saved input (the final norm's output, c x T x h: alive until
    the loss unless autocast's fp32 output holds it) or its autocast weight copy's saving."""
    out = []
    for term in keep:
        if term.key == K.FINAL_NORM and not impl.saves_lm_head_input and input_kept:
            out.append(attrs.evolve(term, nbytes=term.nbytes - c * T * h,
                                    formula=term.formula + f" - {c} x T x h (the {impl.name} loss keeps no LM head "
                                                           "input)" if impl.name != "fused_linear" else
                                    term.formula + f" - {c} x T x h (the fused loss keeps no LM head input)"))
            if not autocast:
                out.append(MemoryTerm(component=ACTIVATIONS, key=K.FINAL_NORM_OUTPUT,
                                      label="final norm output (alive until the loss)",
                                      nbytes=c * T * h, phases=(FORWARD,), formula=f"{c} x T x h (the last hidden state)"))
        elif term.key == K.LM_HEAD_AUTOCAST_COPY and not impl.saves_lm_head_weight_copy:
            out.append(attrs.evolve(term, phases=(FORWARD,), formula=term.formula.replace(
                "saved by the LM head matmul", "cached until autocast exits; the fused loss saves no weight")))
        else:
            out.append(term)
    return out


def chunked_terms(ctx) -> list[MemoryTerm]:
    """torchtune 0.6.1's CEWithChunkedOutputLoss (the module docstring)."""
    return _chunked(ctx.plan, ctx.tokens, ctx.hidden, ctx.vocab, ctx.compute, ctx.chunks, ctx.regime,
                    trainable=ctx.lm_head_trainable)


def fused_terms(ctx) -> list[MemoryTerm]:
    """Liger's fused linear cross-entropy (the module docstring)."""
    return _fused(ctx.plan, ctx.tokens, ctx.hidden, ctx.vocab, ctx.compute, ctx.regime)


def chunked_freed_before_step(plan, T, h, V, c, regime) -> tuple[float, str]:
    """The chunked loss's ``with_optimizer_in_backward``: its backward moment, freed before the LM head's hooked
    step (every chunk's log-softmax 4 T V, the labels 8 T and its backward term), and how."""
    x = _chunked(plan, T, h, V, c, plan.profile_options.loss_chunks, regime)[-1].nbytes
    return 4 * T * V + 8 * T + x, "the chunked loss's backward moment: 4 T V + 8 T + its backward term"


def _chunked(plan, T, h, V, c, n, regime, trainable=True) -> list[MemoryTerm]:
    t = chunk_tokens(plan, n)
    copy = 4 * t * V if c != 4 else 0
    out = [MemoryTerm(component=ACTIVATIONS, key=K.CHUNKS_LOG_SOFTMAX,
                      label="log-softmax of every chunk's logits (fp32)", nbytes=4 * T * V,
                      phases=SAVED, formula=f"4 x T x V = 4 x {_n(T)} x {_n(V)} (each chunk's, saved by cross_entropy)"),
           MemoryTerm(component=ACTIVATIONS, key=K.SHIFTED_LABELS,
                      label="shifted labels (int64)", nbytes=8 * T, phases=SAVED,
                      formula="T x 8 B (torchtune's hstack; saved by nll_loss)"),
           MemoryTerm(component=ACTIVATIONS, key=K.CHUNKS_LOGITS,
                      label=f"logits, every chunk ({c} B)" + (" + one chunk's fp32 copy" if copy else ""),
                      nbytes=c * T * V + copy, phases=(FORWARD,),
                      formula=f"{c} x T x V" + (f" + 4 x t x V, t = {_n(t)} tokens of {n} chunks" if copy else "")
                              + " (the list is freed after the loss: the recipe's del logits)")]
    # The backward: the last chunk's cross-entropy backward (every chunk's log-softmax still saved,
    # 2 x 4 t V of temporaries), or the LM head's backward once every log-softmax is freed (-4 T V):
    # chunk by chunk the weight-gradient partial (V h c) then the input gradient (t h c); the
    # second chunk's partial meets the first in the engine's input buffer and their out-of-place
    # sum makes three V x h at once, with n - 2 chunks' logits gradients still waiting.
    ce = 8 * t * V
    if not trainable:
        # a frozen LM head (LoRA): no weight-gradient partials; its backward's moment is the logits
        # gradients and one chunk's input gradient
        moments = [c * T * V + c * t * h]
    else:
        moments = [c * T * V + V * h * c + c * t * h]
    if n >= 2 and trainable:
        moments += [c * T * V * (n - 1) / n + 2 * V * h * c + 2 * c * t * h,
                    c * T * V * (n - 2) / n + 3 * V * h * c + 2 * c * t * h]
    head = max(moments) - 4 * T * V
    label, how = "cross-entropy backward temporaries, one chunk (fp32)", f"2 x 4 x t x V, t = {_n(t)}"
    nbytes = ce
    if head > ce:
        nbytes = head
        k = moments.index(max(moments))
        label = "LM head backward: the chunks' logits gradients and the weight gradient partials"
        how = (f"{c} x T x V x {n - k}/{n} (logits gradients left) + {k + 1} x V x h x {c} (weight gradient "
               f"partials{', their sum' if k == 2 else ''}) + {min(k + 1, 2)} x t x h x {c} (input gradients) "
               "- 4 x T x V (every log-softmax freed)")
    out.append(MemoryTerm(component=ACTIVATIONS, key=K.CHUNKS_BACKWARD,
                          label=label, nbytes=nbytes, phases=(BACKWARD,), formula=how))
    if not trainable and regime.autocast and n > 1:
        # autocast caches the casts of weights that require grad only: each chunk's matmul casts the frozen
        # LM head afresh and saves its cast for the input's gradient (the model's term counts the first)
        out.append(MemoryTerm(component=ACTIVATIONS, label="autocast 16-bit casts of the frozen LM head, one per "
                              "further chunk", nbytes=(n - 1) * 2 * V * h, phases=SAVED,
                              formula=f"({n} - 1) chunks x V x h x 2 B (each chunk's matmul saves its own cast)"))
    return out


def _fused(plan, T, h, V, c, regime) -> list[MemoryTerm]:
    autocast = bool(regime.autocast)
    x = 4 if autocast else c                 # the LM head's input: the final norm's output (fp32 under autocast)
    w = regime.weight                        # zeros_like(weight): the LM head's weight dtype
    t = fused_chunk_tokens(T, h, V)
    out = []
    cuda_addmm = autocast and (plan.profile_options.device or "cuda") == "cuda" and w == 4
    if cuda_addmm:
        step, how = 2 * t * h, "2 x t x h (addmm out_dtype fp32: the input chunk's bf16 cast)"
    else:
        step = V * h * c + (4 * V * h if c != 4 else 0)
        how = f"{c} x V x h" + (" + 4 x V x h" if c != 4 else "") + " (torch.mm(grad_logits.t(), input).float())"
    step = max(step, c * t * h)
    out += [
        MemoryTerm(component=ACTIVATIONS, label="fused loss: LM head input gradient (computed in the forward)",
                   nbytes=x * T * h, phases=SAVED, formula=f"{x} x T x h (zeros_like(_input), saved for the backward)"),
        MemoryTerm(component=ACTIVATIONS, label="fused loss: LM head weight gradient (computed in the forward)",
                   nbytes=w * V * h, phases=SAVED, formula=f"{w} x V x h (zeros_like(weight), saved for the backward)"),
        MemoryTerm(component=ACTIVATIONS, label="fused loss: shifted labels, per-token loss, one logits chunk",
                   nbytes=8 * T + 4 * T + c * t * V + step, phases=(FORWARD,),
                   formula=f"8 x T (labels) + 4 x T (loss_1d) + {c} x t x V (t = {_n(t)} tokens) + {how}")]
    return out


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """The loss option's added step time: ``(seconds or None, how)``.

    * ``cross_entropy``: 0.
    * ``chunked``: no extra FLOPs (the LM head's 2 x T x h x V forward and 4 x T x h x V backward
      FLOPs are split over n chunks, not repeated); n - 1 more of each chunked kernel: per chunk
      forward the LM head matmul, the fp32 cast, log-softmax, nll_loss and the running sum, and
      backward their five backward kernels and the two matmuls, plus one weight-gradient sum:
      about 13 (n - 1) launches of ~5 us each.
    * ``fused_linear`` (Liger): no extra FLOPs either - the gradients of the LM head's input and
      weight are computed in the forward (2 x T x h x V each, beside the logits' 2 x T x h x V), and
      the backward only returns them (grad_output 1.0), so the total stays 6 x T x h x V; Cut
      Cross-Entropy, which recomputes the logits in its backward, would add 2 x T x h x V FLOPs
      (not this option). Its extra launches: per chunk the logits matmul, the cross-entropy kernel,
      the two gradient matmuls, the fp32 cast and sum of the weight-gradient partial (6 per
      chunk), against the default's ~8 kernels: about 6 x chunks launches; the fused kernel also
      skips reading and writing the T x V logits several times (a saving not priced here).
    ``host_link_bytes_per_s`` is unused (nothing moves over the host link)."""
    o = plan.profile_options
    loss = getattr(o, "loss", None) or "cross_entropy"
    impl = getattr(o, "loss_implementation", None)
    if impl is None:
        from .loss_implementations import BUILTIN
        impl = next((i for i in BUILTIN if i.name == loss), None)
    if impl is not None and impl.terms is None:      # the default cross-entropy's terms: declared, not named
        return 0.0, "the default cross-entropy: nothing added"
    if impl is None or impl.added_step_time is None:
        return None, f"loss={loss!r} declares no added step time"
    return impl.added_step_time(plan)


def chunked_step_time(plan):
    """torchtune's chunked cross-entropy: ``added_step_time``'s ``chunked``."""
    o = plan.profile_options
    n = o.loss_chunks or DEFAULT_CHUNKS
    launches = 13 * (n - 1)
    return launches * LAUNCH_S, (f"no extra FLOPs; {launches} more kernel launches (13 x (n - 1), n = {n}) "
                                 f"x {LAUNCH_S * 1e6:g} us")


def fused_step_time(plan):
    """Liger's fused linear cross-entropy: ``added_step_time``'s ``fused_linear``."""
    from .shapes import shape_of
    s = shape_of(plan)
    T = plan.microbatch * plan.seq_len
    chunks = -(-T // fused_chunk_tokens(T, s.hidden, s.vocab))
    launches = 6 * chunks
    return launches * LAUNCH_S, (f"no extra FLOPs (Liger computes the LM head's gradients in the forward: 6 x T x h x V "
                                 f"in all, as unfused); {launches} kernel launches (6 x {chunks} chunks) x "
                                 f"{LAUNCH_S * 1e6:g} us (unvalidated)")
