"""The published loss implementations beyond the first three (issue 25, item 5), each derived
from its library's source at a commit and registered through ``mlsysim_measured_losses``
(``loss_implementations.py``). Notation as loss.py's: T the rank's tokens, T' the tokens a loss
computes (T x ``loss_token_share`` when it skips ignored tokens), V vocabulary, h hidden, c bytes of
the compute dtype (the logits), w the LM head weight's bytes, g its gradient's, n chunks, t the
tokens of one chunk. Byte counts are per rank, on the last pipeline stage.

* ``torchtune_linear``: torchtune's ``LinearCrossEntropyLoss`` (pytorch/torchtune
  bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1, torchtune/modules/loss/cross_entropy_loss.py, lines
  19-200; mask_ignored_tokens=True, num_output_chunks=8, eager). The model skips its output layer;
  the loss masks the ignored tokens out of the hidden state (``index_select``: a copy, c T' h, which
  the LM head's chunks then save instead of the final norm's output, and the indices, 8 T'), splits
  it in n chunks (``tensor_split``: ceil(T'/n) tokens) and per chunk computes the logits (c t V),
  their fp32 copy (4 t V, freed once its log-softmax exists) and ``F.cross_entropy`` (the fp32
  log-softmax saved, 4 t V, every chunk's: 4 T' V). Each chunk's graph is separate, so the engine
  runs the backward chunk by chunk (last first): the first chunk's nll and log-softmax backward
  (2 x 4 t V) beside every saved log-softmax; then its logits gradient (c t V) and the LM head's
  weight-gradient partial (c V h), the second chunk's partial meeting the first in the engine's
  input buffer (their out-of-place sum: 3 x c V h), each chunk's log-softmax freed as its backward
  ends (the logits gradient is freed when the matmul's backward returns, before the sum).
* ``torchtitan_chunked``: torchtitan's ``ChunkedLossWrapper`` (pytorch/torchtitan
  b5bcd76c66d0acb1a08b176d9639425bc55e0b2a, torchtitan/components/loss.py lines 383-790,
  num_chunks=8): the whole loss and its backward run inside the forward, chunk by chunk
  (``chunk_loss.backward()`` per chunk on detached chunks of the hidden state, which must divide
  into n equal chunks), each chunk's input gradient copied into a ``GradAccumulator`` (``zeros_like``
  in fp32: 4 T h), cast at the end to the hidden state's dtype (c T h, or the buffer itself in fp32)
  and returned by ``_DecoderOutputGradientBackProp`` as the hidden state's gradient in the backward.
  So the LM head saves nothing for the backward (no input, no weight copy); its weight gradient
  exists from the first chunk, in the forward (V h g); per chunk the logits (c t V, held by the
  loop's variable until the next chunk's replace them), the fp32 copy and log-softmax (4 t V each,
  the copy being the logits themselves in fp32) and the cross-entropy backward's two fp32
  temporaries (2 x 4 t V), then the logits gradient (c t V), the weight-gradient partial (c V h)
  and the chunk's input gradient (c t h). The backward adds nothing.
* ``trl_chunked_nll``: TRL's ``loss_type="chunked_nll"`` (huggingface/trl
  f2cd57710ae345ea6428ae95363267fcf38a3dc8, trl/trainer/sft_trainer.py lines 87-230,
  ``_chunked_cross_entropy_loss`` and ``_chunk``, chunk_size 256): the shifted hidden state is
  packed valid tokens first (``hidden[order]``: a copy of every token, c T h, with the labels and
  the order, 2 x 8 T) and only ceil(T'/t) chunks of t = 256 tokens are computed, each under
  non-reentrant activation checkpointing (the chunk's views are all it saves). Per chunk
  ``h.float() @ w.float().t()`` (fp32 copies of the chunk, 4 t h, and of the LM head, 4 V h, where
  they are not fp32 already), the fp32 logits (4 t V), ``log_softmax`` (4 t V), and for the entropy
  metric ``log_p.exp()`` and its product (4 t V each): 4 x 4 t V in the forward. The backward
  recomputes the chunk with its graph (the fp32 copies, log_p and exp saved) and adds the nll and
  log-softmax gradients (2 x 4 t V), the matmul's fp32 gradients (4 t h, 4 V h) and their casts
  back (c t h, w V h); from the second chunk on the LM head's gradient of the chunks done exists
  (w V h) beside them (the recompute's four fp32 t x V tensors or the matmul's backward are the
  moment). Under autocast (the explicit fp32 matmul runs in bf16 all the same, the LM head cast per
  chunk, uncached) and with a frozen LM head (LoRA): ``_trl_autocast_or_frozen_terms``, measured by
  validation/trl_loss/measure.py with TRL 1.10.0 itself.
* ``litgpt_chunked``: LitGPT's ``chunked_cross_entropy`` (Lightning-AI/litgpt
  26857050fe3ff627cd714fe92f5838f51a3d5efa, litgpt/utils.py lines 302-350, chunk_size 128, as
  litgpt/finetune/full.py lines 282-285 calls it: the whole logits, ``logits.split(128)``). The
  logits (c T V) stay alive through the backward and the step (the training loop's variable, replaced
  when the next forward's are assigned); no upcast: each
  chunk's log-softmax is saved in the compute dtype (the chunks are views of ``logits[..., :-1,
  :].reshape(-1, V)``, a copy of c b (s - 1) V with more than one sequence per micro-batch, alive until
  the loss returns) (c T V in all; fp32 under autocast, whose
  log_softmax runs in fp32: 4 T V, with one chunk's fp32 cast, 4 t V, in the forward). The backward
  collects every chunk's logits gradient for the split's concatenation (c T V) and the slice
  ``logits[..., :-1, :]``'s backward writes it into a zero-filled whole (c T V) as the log-softmaxes
  are freed: c T V beyond the saved tensors. Under LoRA (``litgpt finetune_lora``: the frozen LM head
  chunked along the sequence, ``lm_head_chunk_size=128``, and the list path of the same function):
  ``litgpt_lora_terms``, measured by validation/lora_litgpt_chunked.py; refused under autocast. Under 4-bit
  QLoRA the LM head is quantized too (``quantizes_lm_head``: Lightning's BitsandbytesPrecision converts every
  nn.Linear) and each chunk dequantizes it whole (``_quantized_head``); int8 refused.
* ``cut_cross_entropy``: Apple's Cut Cross-Entropy (apple/ml-cross-entropy
  d42911f9b1a1f98289bb601c35c8151562603d74, cut_cross_entropy/cce.py lines 51-170, 280-320,
  cce_lse_forward.py lines 190-205, cce_backward.py lines 386-425): Triton kernels that never
  materialise the logits. The forward keeps the log-sum-exp (fp32, 4 T') and the valid tokens'
  indices (int32, 4 T'; ignored tokens filtered) beside the LM head's input and weight (saved, as
  the LM head's own matmul saves them), with the per-token dot product (4 T') transient; the
  backward recomputes the logits block by block inside the kernel and allocates only the input's
  and weight's gradients (``zeros_like(e)``, ``zeros_like(c)``: what the LM head's backward makes
  anyway). Needs an Ampere GPU (cce.py raises otherwise): derived from source, not measured.
* ``megatron_fused``: Megatron-Core's fused vocab-parallel cross-entropy (NVIDIA/Megatron-LM
  d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/fusions/fused_cross_entropy.py lines
  1-150, megatron/core/tensor_parallel/cross_entropy.py lines 13-200), as Megatron runs it: its four
  functions are decorated with ``jit_fuser``, which is ``torch.compile`` from PyTorch 2.2
  (megatron/core/jit.py; NVIDIA/Megatron-LM 00caa53af30912914981c86f39db123961678bbd, the same at both
  commits). The rank's logits shard (V/tp) is upcast once (``.float()``: 4 T V/tp beside the 16-bit
  logits, c T V/tp, which the model's forward holds until the loss returns), then worked in place: the
  max subtracted, exp taken into the same tensor, divided by the sum: the softmax saved for the
  backward (4 T V/tp) with the target mask (bool, T) and the masked target (int64, 8 T); per-token fp32
  statistics (max, predicted logit and sum of exp concatenated, loss: 4 x 4 T) in the forward. The
  backward (``calculate_gradients``, compiled) subtracts the one-hot on a view of the saved softmax
  (``grad_2d[arange_1d, masked_target_1d] -= softmax_update``, an index_put on the input): Inductor
  does not keep that mutation in place but computes the new value into a fresh fp32 [T, V/tp] buffer
  (4 T V/tp) beside the softmax, and casts the gradient to bf16 (``grad_input.to(torch.bfloat16)``:
  c T V/tp) beside both. Measured compiled (torch 2.13, CPU, the profiler's memory timeline): the
  backward is the eager path's + 4 T V - 12 T (the eager path's arange and float mask, int64 and fp32
  per token, fused away), the forward the eager path's - 8 T. Refused with fp32 logits (Megatron's
  unfused path). Runs under Megatron-Core's regimes with its tensor parallelism (the logits split over
  tp x cp) or on one device.
* ``megatron_vocab_parallel``: Megatron-Core's unfused ``vocab_parallel_cross_entropy``
  (tensor_parallel/cross_entropy.py lines 119-210, ``cross_entropy_loss_fusion=False``, label_smoothing
  0), not compiled: the same steps eagerly, in place (the logits shard upcast once, the softmax made
  in it and saved, 4 T V/tp), the statistics returned apart (no concatenation; ``target.clone()``,
  8 T, instead), and the backward works the one-hot subtraction and the scaling in place in the
  saved softmax and returns it in fp32; autograd casts it to the logits' dtype (c T V/tp) beside it.
  With fp32 logits the upcast is the logits themselves and the gradient is returned in place.
"""

from __future__ import annotations

import math

from mlsysim_core.errors import NotModelledError
from mlsysim_core.terms import ACTIVATIONS, BACKWARD, FORWARD, PHASES, MemoryTerm

from .loss_implementations import LossImplementation
from .term_keys import CHUNK_LOGITS, CHUNKS_LOGITS, LOGITS

SAVED = (FORWARD, BACKWARD)
LAUNCH_S = 5e-6
TORCHTUNE = "pytorch/torchtune bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1 torchtune/modules/loss/cross_entropy_loss.py"
TORCHTITAN = "pytorch/torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a torchtitan/components/loss.py"
TRL = "huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8 trl/trainer/sft_trainer.py"
LITGPT = "Lightning-AI/litgpt 26857050fe3ff627cd714fe92f5838f51a3d5efa litgpt/utils.py"
CCE = "apple/ml-cross-entropy d42911f9b1a1f98289bb601c35c8151562603d74 cut_cross_entropy/cce.py"
MEGATRON = ("NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 megatron/core/fusions/fused_cross_entropy.py, "
            "megatron/core/tensor_parallel/cross_entropy.py; jit_fuser = torch.compile: megatron/core/jit.py at "
            "00caa53af30912914981c86f39db123961678bbd")
MEGATRON_UNFUSED = ("NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 "
                    "megatron/core/tensor_parallel/cross_entropy.py (vocab_parallel_cross_entropy)")


def _n(x) -> str:
    return f"{x:,.0f}"


def _term(label, nbytes, phases, formula, key=""):
    return MemoryTerm(component=ACTIVATIONS, label=label, nbytes=nbytes, phases=phases, formula=formula, key=key)


# --- torchtune LinearCrossEntropyLoss -------------------------------------------------------------

def torchtune_linear_terms(ctx) -> list[MemoryTerm]:
    T, Tv, h, V, c, n = ctx.tokens, ctx.valid, ctx.hidden, ctx.vocab, ctx.compute, ctx.chunks
    t = math.ceil(Tv / n)
    copy = 4 * t * V if c != 4 else 0
    out = []
    if ctx.autocast:   # the masked hidden state is the final norm's fp32 output; each chunk's bf16 cast is saved
        out.append(_term("masked hidden state (index_select, fp32)", 4 * Tv * h, (FORWARD,),
                         f"4 x T' x h, T' = {_n(Tv)} (alive until the loss returns)"))
    frozen = not ctx.lm_head_trainable       # LoRA: the chunks' matmuls save no input, no weight-gradient partials
    if not frozen:
        out.append(_term("LM head input: the masked hidden state", c * Tv * h, SAVED,
                         f"{c} x T' x h, T' = {_n(Tv)} tokens not ignored (index_select's copy, saved by the chunks' "
                         "matmuls)"))
    elif not ctx.autocast:
        out.append(_term("masked hidden state (index_select)", c * Tv * h, (FORWARD,),
                         f"{c} x T' x h, T' = {_n(Tv)} (alive until the loss returns; a frozen LM head saves no input)"))
    if frozen and ctx.autocast and n > 1:
        out.append(_term("autocast 16-bit casts of the frozen LM head, one per further chunk", (n - 1) * 2 * V * h,
                         SAVED, f"({n} - 1) chunks x V x h x 2 B (each chunk's matmul saves its own cast)"))
    out += [
        _term("log-softmax of every chunk's logits (fp32)", 4 * Tv * V, SAVED,
              f"4 x T' x V = 4 x {_n(Tv)} x {_n(V)} (each chunk's, saved by cross_entropy)"),
        _term("labels: shifted, masked and their indices (int64)", 8 * T + 16 * Tv, SAVED,
              "8 x T (the recipe's shifted labels) + 8 x T' (index_select of the targets) + 8 x T' (the indices)"),
        _term(f"logits, one chunk ({c} B)" + (" + its fp32 copy" if copy else ""), c * t * V + copy, (FORWARD,),
              f"{c} x t x V" + (" + 4 x t x V" if copy else "") + f", t = ceil(T'/{n}) = {_n(t)} tokens",
              key=CHUNK_LOGITS)]
    moments = [8 * t * V, c * t * V + (0 if frozen else V * h * c) + c * t * h - 4 * t * V]
    if n >= 2 and not frozen:
        moments.append(3 * V * h * c + 2 * c * t * h - 8 * t * V)
    k = moments.index(max(moments))
    how = ("the first chunk's nll and log-softmax backward: 2 x 4 x t x V" if k == 0 else
           f"{c} x t x V (the chunk's logits gradient) + "
           + ("" if frozen else f"V x h x {c} (its weight-gradient partial) + ")
           + f"t x h x {c} - 4 x t x V (its log-softmax freed)" if k == 1 else
           f"3 x V x h x {c} (two weight-gradient partials and their out-of-place sum, the logits gradient freed) "
           f"+ 2 x t x h x {c} - 8 x t x V (two log-softmaxes freed)")
    out.append(_term("chunked linear cross-entropy backward, one chunk at a time", max(max(moments), 0), (BACKWARD,),
                     how))
    return out


# --- torchtitan ChunkedLossWrapper ----------------------------------------------------------------

def _titan_check(plan, chunks):
    T = plan.microbatch * plan.seq_len
    if T % chunks:
        from mlsysim_core.errors import InvalidInputError
        raise InvalidInputError("loss_chunks", chunks, f"a divisor of the micro-batch's {T} tokens",
                                "torchtitan's ChunkedLossWrapper splits the tokens into equal chunks (torch._check)")


def torchtitan_chunked_terms(ctx) -> list[MemoryTerm]:
    T, h, V, c, n, g = ctx.tokens, ctx.hidden, ctx.vocab, ctx.compute, ctx.chunks, ctx.gradient
    t = T // n
    x = 4 if ctx.autocast else c        # the hidden state's dtype: the accumulated gradient's
    chunk_a = c * t * V + 12 * t * V
    chunk_b = 2 * c * t * V + V * h * c + c * t * h
    if g != c:       # the partial cast to the gradient's dtype once the chunk's logits gradient is freed
        chunk_b = max(chunk_b, c * t * V + V * h * c + V * h * g + c * t * h)
    out = [
        _term("chunked loss: the hidden state's gradient (accumulated in the forward)", x * T * h, SAVED,
              f"{x} x T x h (GradAccumulator's result, returned by the backward)"),
        _term("chunked loss: the LM head's weight gradient (from the first chunk, in the forward)", V * h * g,
              (FORWARD,), f"V x h x {g} B (lm_head.weight.grad, accumulated chunk by chunk)"),
        _term("chunked loss: labels (int64)", 8 * T, SAVED, "8 x T (the data loader's labels)"),
        _term("chunked loss: one chunk's forward and backward", max(chunk_a, chunk_b), (FORWARD,),
              f"max({c} x t x V + 12 x t x V (logits, fp32 copy, log-softmax, two backward temporaries), "
              f"2 x {c} x t x V + V x h x {c} + {c} x t x h (logits, their gradient, weight and input gradients)"
              + (f", {c} x t x V + V x h x {c} + V x h x {g} + {c} x t x h (the partial's cast)" if g != c else "")
              + f"), t = T/{n} = {_n(t)}")]
    if x != 4:
        out.append(_term("chunked loss: GradAccumulator's fp32 buffer", 4 * T * h, (FORWARD,),
                         "4 x T x h (zeros_like(hidden, float32), cast to the hidden dtype at the end)"))
    return out


# --- TRL chunked_nll ------------------------------------------------------------------------------

TRL_CHUNK = 256


def trl_chunked_nll_terms(ctx) -> list[MemoryTerm]:
    if ctx.autocast or not ctx.lm_head_trainable:
        return _trl_autocast_or_frozen_terms(ctx)
    T, Tv, h, V, c, w = ctx.tokens, ctx.valid, ctx.hidden, ctx.vocab, ctx.compute, ctx.weight
    t = min(ctx.chunks, T)                    # hidden[start:start + chunk_size]
    n = math.ceil(Tv / ctx.chunks)            # the chunks computed: ceil(valid / chunk_size)
    up_h = 4 * t * h if c != 4 else 0
    up_w = 4 * V * h if w != 4 else 0
    # From the second chunk on, the LM head's gradient of the chunks already done exists (w V h: the
    # gradients' term counts it only from the backward's end).
    grad = w * V * h if n >= 2 else 0
    fwd = max(up_h + up_w + 4 * t * V, 16 * t * V)
    recompute = up_h + up_w + 16 * t * V + grad
    matmul = up_h + up_w + 12 * t * V + 4 * t * h + 4 * V * h + grad
    cast = up_h + up_w + 8 * t * V + 4 * V * h + (w * V * h if w != 4 else 0) + 4 * t * h + grad
    return [
        _term("packed hidden state (hidden[order], every shifted token)", c * T * h, SAVED,
              f"{c} x T x h (the chunks' checkpointed inputs)"),
        _term("packed labels and the sort order (int64)", 16 * T, SAVED, "2 x 8 x T"),
        _term("chunked nll: one checkpointed chunk's forward", fwd, (FORWARD,),
              f"max(fp32 copies {_n(up_h + up_w)} + 4 x t x V, 4 x 4 x t x V (logits, log_p, exp, product)), "
              f"t = {_n(t)}, {n} chunk{'s' if n != 1 else ''} of {_n(Tv)} tokens computed"),
        _term("chunked nll: one chunk recomputed and its backward", max(recompute, matmul, cast), (BACKWARD,),
              f"max(the recompute: 4 x 4 x t x V, the matmul's backward: 3 x 4 x t x V + 4 x t x h + 4 x V x h, "
              f"the casts back) + the fp32 copies {_n(up_h + up_w)}"
              + (f" + the LM head's gradient of the chunks done ({w} x V x h)" if grad else "") + f", t = {_n(t)}")]


def _trl_autocast_or_frozen_terms(ctx) -> list[MemoryTerm]:
    """TRL's chunked NLL under autocast or with a frozen LM head (LoRA, QLoRA: the LM head stays in the base's
    dtype), measured by validation/trl_loss/measure.py (trl 1.10.0, whose sft_trainer.py lines 87-235 are
    f2cd577's). The hidden state's dtype x: fp32 under autocast (the final norm's output), else c.

    * Under autocast ``h.float() @ w.float().t()`` runs in bf16 all the same (matmul is on autocast's lower-precision
      list): ``.float()`` of fp32 tensors returns them, and autocast casts both operands back, 2 t h and 2 V h. The
      weight's cast is of the view ``w.t()``, which autocast does not cache (only leaves): every chunk casts the LM
      head afresh, and its recompute again; no copy outlives a chunk (``casts_lm_head_once=False``: the model's
      cached copy is not there). The logits are bf16 (2 t V). On the CPU ``log_softmax`` and ``exp`` stay bf16 and
      ``nll_loss`` (fp32 list) casts log_p to fp32 (4 t V, saved): the forward's chunk holds the logits, log_p, the
      fp32 copy (or exp and its product) = 8 t V; the backward's recompute 12 t V (logits, log_p, its fp32 copy,
      exp, the product) beside the two casts (the input's only where the weight trains). On a CUDA device
      (autocast_mode.h: ``log_softmax`` and ``sum`` take fp32 (``FP32_SET_OPT_DTYPE``), ``exp`` and ``nll_loss``
      fp32) log_p, exp and the product are fp32: 14 t V in both (derived from the lists, not measured).
    * Without autocast and a frozen LM head (LoRA over a 16-bit base): the fp32 copies of the chunk (4 t h) and of
      the LM head (4 V h) in the forward; the recompute keeps ``w.float()`` (saved by the matmul for the input's
      gradient) beside the four fp32 t x V tensors, and no weight gradient exists.
    * The backward's gradient of the packed hidden state is one buffer of every row (x T h, the chunks' slices
      written into it) beside the second chunk's recompute on; with a trainable LM head (autocast) its fp32
      gradient of the chunks done (w V h) too. With a frozen LM head the final norm's output (x T h) is held by the
      patched forward until the loss returns (the model's LoRA terms price none).
    """
    T, Tv, h, V, c, wb = ctx.tokens, ctx.valid, ctx.hidden, ctx.vocab, ctx.compute, ctx.weight
    t = min(ctx.chunks, T)
    n = math.ceil(Tv / ctx.chunks)
    trains = ctx.lm_head_trainable
    if not trains:          # the frozen LM head is in the base's dtype (LoRA's regime is the adapters')
        from .lora import base_weight_bytes
        wb = base_weight_bytes(ctx.regime)
    x = 4 if ctx.autocast else c
    out = [
        _term("packed hidden state (hidden[order], every shifted token)", x * T * h, SAVED,
              f"{x} x T x h (the chunks' checkpointed inputs" + (", fp32 under autocast)" if ctx.autocast else ")")),
        _term("packed labels and the sort order (int64)", 16 * T, SAVED, "2 x 8 x T")]
    if not trains:
        out.append(_term("final norm output (held until the loss returns)", x * T * h, (FORWARD,),
                         f"{x} x T x h (the patched forward's hidden_states; a frozen LM head saves none of it)"))
    buf = x * T * h if n >= 2 else 0
    grad = wb * V * h if n >= 2 and trains else 0
    after = (f" + the hidden state's gradient buffer {x} x T x h" if buf else "") + (
        f" + the LM head's gradient of the chunks done ({wb} x V x h)" if grad else "")
    if ctx.autocast:
        cuda = (ctx.plan.profile_options.device or "cuda") == "cuda"
        k, where = (14, "CUDA's autocast lists: log_p, exp and the product fp32") if cuda else (
            12, "the CPU's: log_p, exp and the product bf16, nll_loss's fp32 copy of log_p")
        kf = 14 if cuda else 8
        casts = 2 * V * h + 2 * t * h
        fwd = max(kf * t * V, casts + 2 * t * V)
        bwd = k * t * V + 2 * V * h + (2 * t * h if trains else 0) + buf + grad
        out += [
            _term("chunked nll: one checkpointed chunk's forward (autocast)", fwd, (FORWARD,),
                  f"max({kf} x t x V (bf16 logits and the loss's tensors: {where}), 2 x V x h + 2 x t x h + 2 x t x V "
                  f"(the matmul's bf16 casts, not cached: w.t() is a view, and the logits)), t = {_n(t)}, "
                  f"{n} chunk{'s' if n != 1 else ''} of {_n(Tv)} tokens computed"),
            _term("chunked nll: one chunk recomputed and its backward (autocast)", bwd, (BACKWARD,),
                  f"{k} x t x V (the recompute: {where}) + 2 x V x h (the LM head's bf16 cast, saved)"
                  + (" + 2 x t x h (the chunk's bf16 cast, saved for the weight's gradient)" if trains else "")
                  + after + f", t = {_n(t)}")]
        return out
    up_h = 4 * t * h if c != 4 else 0
    up_w = 4 * V * h if wb != 4 else 0
    out += [
        _term("chunked nll: one checkpointed chunk's forward", max(up_h + up_w + 4 * t * V, 16 * t * V), (FORWARD,),
              f"max(fp32 copies {_n(up_h + up_w)} + 4 x t x V, 4 x 4 x t x V (logits, log_p, exp, product)), "
              f"t = {_n(t)}, {n} chunk{'s' if n != 1 else ''} of {_n(Tv)} tokens computed"),
        _term("chunked nll: one chunk recomputed and its backward (frozen LM head)", 16 * t * V + up_w + buf,
              (BACKWARD,), "4 x 4 x t x V (the recompute)" + (" + 4 x V x h (w.float(), saved by the matmul for the "
                                                                "input's gradient)" if up_w else "")
              + after + f", t = {_n(t)}")]
    return out


def _trl_check(plan, chunks):
    lora = plan.profile_options.lora
    if lora is not None and (lora.modules_to_save or lora.use_dora):
        raise NotModelledError("loss", "trl_chunked_nll", "LoRA or QLoRA with the LM head frozen (no DoRA or "
                               "modules_to_save)", "TRL's chunked NLL under LoRA is measured with peft's plain "
                               "adapters and a frozen LM head (validation/trl_loss/measure.py)")


# --- LitGPT chunked_cross_entropy -----------------------------------------------------------------

def litgpt_chunked_terms(ctx) -> list[MemoryTerm]:
    if not ctx.lm_head_trainable:
        return litgpt_lora_terms(ctx)
    T, V, c, t = ctx.tokens, ctx.vocab, ctx.compute, min(ctx.chunks, ctx.tokens)
    lsm = 4 if ctx.autocast else c
    out = [
        _term(f"logits ({c} B, held through the backward and the step)", c * T * V, PHASES,
              f"{c} x T x V (the training loop's logits, replaced only by the next forward's: the previous "
              "iteration's are freed when the new ones are assigned, a moment no larger than the log-softmax's)",
              key=LOGITS),
        _term(f"log-softmax of every chunk ({lsm} B)", lsm * T * V, SAVED,
              f"{lsm} x T x V (no upcast" + ("; autocast runs log_softmax in fp32" if ctx.autocast else "") + ")"),
        _term("shifted targets (int64) and per-token losses", 8 * T + lsm * T, SAVED, f"8 x T + {lsm} x T"),
        _term("chunks' logits gradients and their concatenation", c * T * V, (BACKWARD,),
              f"{c} x T x V beyond the saved tensors (the split's and the slice's backward make the whole "
              "gradient as the log-softmaxes are freed)")]
    b = ctx.plan.microbatch
    if b > 1:    # logits[..., :-1, :] is not contiguous across the batch: reshape(-1, V) copies it
        out.append(_term(f"the shifted logits' copy ({c} B, reshape of logits[..., :-1, :])", c * (T - b) * V,
                         (FORWARD,), f"{c} x b (s - 1) x V, b = {b} (freed when the loss returns)"))
    if ctx.autocast:
        out.append(_term("one chunk's fp32 cast", 4 * t * V, (FORWARD,), f"4 x t x V, t = {_n(t)}"))
    return out


def litgpt_lora_terms(ctx) -> list[MemoryTerm]:
    """LitGPT's LoRA fine-tune (litgpt/finetune/lora.py lines 355-358 at 26857050): the frozen LM head chunked
    along the sequence (``model(input_ids, lm_head_chunk_size=128)``: ``[lm_head(x_i) for x_i in x.split(128,
    dim=1)]``, model.py lines 177-179), the last chunk shifted (``logits[-1] = logits[-1][..., :-1, :]``) and
    ``chunked_cross_entropy``'s list path (utils.py lines 317-329) over ``targets[..., 1:]``. The chunks hold
    b x C positions (C = ``loss_chunks``, 128), R = b (s - 1) rows in all:

    * the chunks' logits (c T V) are the loop's variable, alive through the backward and the step;
    * each chunk's log-softmax is saved in the compute dtype (c R V: no upcast), with its targets (int64, 8 R:
      ``reshape(-1)`` of ``targets[..., 1:]``'s chunks copies them when b > 1; one sequence: views);
    * the forward's top is the last chunk's cross-entropy: with b > 1 its shifted logits are not contiguous and
      ``reshape(-1, V)`` copies them (c b (C_last - 1) V, freed when the loss returns), beside the per-token
      losses (c R, their concatenation);
    * the LM head's last chunk is a moment of its own: the previous iteration's logits are freed only when the new
      list is assigned, beside the head's input (c T h): larger than the loss's with one sequence;
    * the backward runs every chunk's cross-entropy backward first (their nodes are younger than the LM head's),
      last chunk first: a chunk's nll gradient (c t V) and log-softmax gradient (c t V) beside the log-softmaxes
      not yet freed and the logits gradients already made (c R V in all), and the targets of the chunks not yet
      reached: 2 c t V at the last whole chunk reached (t = b C), after which the LM head's backward frees each
      logits gradient as it returns the chunk's input gradient;
    * QLoRA (a 4-bit LM head, ``_quantized_head``): each chunk's matmul dequantizes the whole head (c V h, with
      double quantization beside its fp32 absmax): the LM head's last chunk in the forward, and in the backward
      the first LM head backward (the last chunk's) beside every chunk's logits gradient (c T V), where they
      exceed the loss's moments. Measured (validation/lora_litgpt_chunked.py, peft's LoRA on Llama, bf16 and fp32,
      one to three sequences; nf4-dq with the LM head converted as Lightning does): every phase to within 24 B."""
    T, V, c, C = ctx.tokens, ctx.vocab, ctx.compute, ctx.chunks
    b = ctx.plan.microbatch
    s = T // b
    R = T - b
    n = -(-s // C)                           # x.split(C): ceil(s / C) chunks
    last = s - C * (n - 1)                   # the last chunk's positions (the remainder, or C)
    t = b * min(C, s)
    targets = 8 * R if b > 1 else 0
    # the engine runs the chunks' backward last first; at chunk k's log-softmax backward the targets of chunks < k
    # are still saved (8 b C each when b > 1): the top is the last whole chunk, k = n - 2 (or the only one)
    k = max(n - 2, 0)
    top = 2 * c * (t if n > 1 else b * (last - 1)) * V - targets + (8 * b * C * k if b > 1 else 0)
    copy = c * b * (last - 1) * V if b > 1 else 0
    # the LM head's moment: the previous iteration's logits are freed only when the new list is assigned, after the
    # last chunk's logits, beside the head's input (the final norm's output, c T h, freed when the model returns)
    head = c * T * V + c * T * ctx.hidden
    deq = _quantized_head(ctx)
    head += deq[0] + deq[1]
    at_loss = c * R * V + 2 * c * R + copy + targets      # (the targets' copies are made by the loss, after the head)
    out = [
        _term(f"logits, every chunk ({c} B, held through the backward and the step)", c * T * V, PHASES,
              f"{c} x T x V (the loop's logits list, the frozen LM head's chunks of {C} positions; replaced only "
              "by the next forward's)", key=CHUNKS_LOGITS),
        _term(f"log-softmax of every chunk ({c} B)", c * R * V, SAVED,
              f"{c} x R x V, R = b (s - 1) = {_n(R)} rows (no upcast)"),
        _term("shifted targets (int64)", 8 * R if b > 1 else 0, SAVED,
              "8 x R (each chunk's reshape(-1) of targets[..., 1:] copies when b > 1)" if b > 1 else
              "0 (one sequence: the targets' chunks are views)"),
        _term(f"per-token losses and their concatenation ({c} B)", 2 * c * R, (FORWARD,),
              f"2 x {c} x R (each chunk's reduction='none' losses, torch.cat of them)"),
        _term("chunked cross-entropy backward, one chunk at a time", top, (BACKWARD,),
              f"2 x {c} x t x V (the first chunk's nll and log-softmax gradients, the engine's last), t = b x "
              f"{min(C, s)} = {_n(t)} rows" + (f" - 8 x R + 8 x b x {C} x {k} (the targets of the {k} chunks before "
                                                  "it still saved, the others released)" if b > 1 else ""))]
    if b > 1:
        out.append(_term(f"the last chunk's shifted logits copy ({c} B)", copy, (FORWARD,),
                         f"{c} x b x ({last} - 1) x V (reshape of logits[-1][..., :-1, :]; freed when the loss "
                         "returns)"))
    deq_how = (f" + {c} x V x h (the last chunk's dequantized LM head)"
               + (f" + 4 x {_n(deq[1] // 4)} (its blocks' absmax, dequantized to fp32)" if deq[1] else "")
               if deq[0] else "")
    if head > at_loss:
        out.append(_term("the LM head's moment beyond the loss's: the previous iteration's logits"
                         + (" and the dequantized head" if deq[0] else ""), head - at_loss,
                         (FORWARD,), f"{c} x T x V (the previous logits, until the new list is assigned) + {c} x T x h "
                         f"(the head's input)" + deq_how + f" - ({c} x R x V + 2 x {c} x R"
                         + (f" + the copy {_n(copy)} + the targets 8 x R" if copy else "") + ") (the loss's moment)"))
    if deq[0]:
        # the LM head's backward (after every chunk's cross-entropy backward), its last chunk first: every chunk's
        # logits gradient (c T V: the last one zero-filled back to its b x C_last rows by the shift's slice), the
        # weight dequantized again (MatMul4Bit.backward: F.dequantize_4bit, then the input gradient's matmul)
        grad_in = c * b * last * ctx.hidden
        head_b = c * T * V + deq[0] + max(deq[1], grad_in)
        at_ce = c * R * V + targets + top
        if head_b > at_ce:
            out.append(_term("the quantized LM head's backward beyond the loss's: its weight dequantized again",
                             head_b - at_ce, (BACKWARD,),
                             f"{c} x T x V (every chunk's logits gradient) + {c} x V x h (MatMul4Bit.backward's "
                             f"dequantized weight) + max(4 x blocks (the absmax in fp32), {c} x b x {last} x h (the "
                             f"last chunk's input gradient)) - ({c} x R x V + the targets + the cross-entropy's "
                             "backward moment)"))
    return out


def _quantized_head(ctx) -> tuple[int, int]:
    """(the dequantized weight, the fp32 absmax beside it) of a 4-bit LM head (LitGPT's QLoRA: Lightning's
    BitsandbytesPrecision converts every nn.Linear, Lightning-AI/pytorch-lightning 2d347d0b
    src/lightning/fabric/plugins/precision/bitsandbytes.py ``_convert_layers``), (0, 0) otherwise. Each chunk's
    ``Linear4bit`` runs ``MatMul4Bit``: in the forward ``gemm_4bit``'s kernel (bitsandbytes 0.50.2
    bitsandbytes/backends/default/ops.py ``_gemm_4bit_default_impl``, the CPU's and the large-M CUDA path) and
    in the backward ``F.dequantize_4bit`` (bitsandbytes/autograd/_functions.py ``MatMul4Bit.backward``)
    dequantize the whole V x h weight to the compute dtype, freed when the chunk's matmul returns; with double
    quantization the absmax first (4 B a block of ``quant_blocksize``). Measured:
    validation/lora_litgpt_chunked.py's QLoRA runs."""
    from .lora import quantized_lm_head
    if ctx.plan.profile_options.lora is None or not quantized_lm_head(ctx.plan):
        return 0, 0
    cfg = ctx.plan.profile_options.lora
    V, h = ctx.vocab, ctx.hidden
    blocks = -(-V * h // cfg.quant_blocksize)
    return ctx.compute * V * h, 4 * blocks if cfg.double_quant else 0


def _litgpt_check(plan, chunks):
    o = plan.profile_options
    if o.lora is None:
        return
    if o.regime.autocast:
        raise NotModelledError("loss", "litgpt_chunked", "no autocast with LoRA (LitGPT's bf16-true or 32-true)",
                               "LitGPT's chunked LM head and loss under LoRA are measured without autocast "
                               "(validation/lora_litgpt_chunked.py)")
    if o.lora.quantization == "int8" or o.lora.modules_to_save or o.lora.use_dora:
        raise NotModelledError("loss", "litgpt_chunked", "LoRA or 4-bit QLoRA (no int8, DoRA or modules_to_save)",
                               "LitGPT's chunked LM head is measured frozen, unquantized or 4-bit (QLoRA: Lightning's "
                               "BitsandbytesPrecision converts every nn.Linear, the LM head too; "
                               "validation/lora_litgpt_chunked.py); its int8 Linear8bitLt LM head is not measured")


# --- Cut Cross-Entropy ----------------------------------------------------------------------------

def cut_cross_entropy_terms(ctx) -> list[MemoryTerm]:
    """Cut Cross-Entropy (the module docstring). The classifier frozen (``ctx.lm_head_trainable`` False: LoRA's LM
    head): ``LinearCrossEntropyFunction.forward`` still saves ``e`` (``ctx.save_for_backward(e, c, bias, lse, ...)``,
    cce.py line 141), the LM head's input, which a frozen nn.Linear would not keep (lora.py prices none): c x T x h,
    the final norm's output in a 16-bit regime, its ``e.to(autocast dtype)`` copy under autocast (line 72); ``c`` is
    the parameter (under autocast its 16-bit copy, the frozen head's autocast term). The backward allocates no
    weight-gradient accumulator (cce_backward.py line 394: ``dc = torch.zeros_like(c) if c_info.requires_grad else
    None``, no ``dc_locks``, line 464) and only the input's gradient (``zeros_like(e)``, line 391), as a frozen LM
    head's backward makes it. ``logit_avg`` (cce_lse_forward.py line 201: V fp32, made and saved whenever a gradient
    is needed with the default ``filter_eps="auto"``, cce.py line 62) with or without."""
    T, Tv, V = ctx.tokens, ctx.valid, ctx.vocab
    out = [
        _term("CCE: log-sum-exp (fp32) and the valid tokens' indices (int32)", 8 * Tv, SAVED,
              f"4 x T' + 4 x T', T' = {_n(Tv)}"),
        _term("CCE: shifted labels (int64)", 8 * T, SAVED, "8 x T (the targets, saved)"),
        _term("CCE: per-vocabulary logit average (fp32)", 4 * V, SAVED,
              f"4 x V = 4 x {_n(V)} (logit_avg, saved for the backward's vocabulary ordering)"),
        _term("CCE: per-token dot product (fp32)", 4 * Tv, (FORWARD,), "4 x T'"),
        _term("CCE: backward's per-token scale (fp32)", 4 * Tv, (BACKWARD,),
              "4 x T' (the logits are recomputed block by block inside the kernel)")]
    if not ctx.lm_head_trainable:
        c, h = ctx.compute, ctx.hidden
        out.insert(0, _term("CCE: the LM head's input e (saved; the classifier frozen)", c * T * h, SAVED,
                            f"{c} x T x h = {c} x {_n(T)} x {_n(h)} (save_for_backward(e, c, ...): the logits are "
                            "recomputed from it; a frozen nn.Linear LM head would keep none; no weight-gradient "
                            "accumulator dc)"))
    return out


# --- Megatron-Core vocab-parallel cross-entropy, fused (compiled) and unfused ---------------------

def _megatron_terms(ctx, *, fused: bool) -> list[MemoryTerm]:
    T, V, c = ctx.tokens, ctx.vocab, ctx.compute
    on = " (the rank's vocabulary shard)" if V != ctx.shape.vocab else ""
    up = 4 * T * V if c != 4 else 0
    stats = ("max, predicted logit and sum of exp concatenated, loss" if fused else
             "max, predicted logit, sum of exp, loss (target.clone() beside them)")
    cast = "grad_input.to(torch.bfloat16)" if fused else "autograd's cast of the fp32 gradient to the logits' dtype"
    out = [
        _term("softmax, made in place in the logits' fp32 copy (saved)", 4 * T * V, SAVED,
              f"4 x T x V{on} (upcast once, max subtracted, exp and divide in place)"),
        _term("target mask (bool) and masked target (int64)", 9 * T, SAVED, "T + 8 x T"),
        _term(f"logits ({c} B, held until the loss returns)", c * T * V if c != 4 else 0, (FORWARD,),
              f"{c} x T x V{on}" if c != 4 else "0 (fp32: the upcast is the logits themselves)", key=LOGITS),
        _term(f"per-token statistics (fp32): {stats}", 16 * T, (FORWARD,), "4 x 4 x T"),
        _term(f"logits gradient cast to {'bf16' if fused else 'the logits dtype'} beside the softmax",
              c * T * V if up else 0, (BACKWARD,),
              f"{c} x T x V{on} ({cast})" if up else "0 (fp32: the gradient in place)")]
    if fused:
        out.append(_term("compiled calculate_gradients: Inductor's fresh fp32 buffer for the one-hot subtraction",
                         4 * T * V, (BACKWARD,),
                         f"4 x T x V{on} (jit_fuser = torch.compile: the index_put on the saved softmax's view is "
                         "computed into a new [T, V] buffer beside the softmax and the bf16 gradient, not in place)"))
    return out


def megatron_fused_terms(ctx) -> list[MemoryTerm]:
    return _megatron_terms(ctx, fused=True)


def megatron_vocab_parallel_terms(ctx) -> list[MemoryTerm]:
    return _megatron_terms(ctx, fused=False)


def _megatron_tp_check(name, plan):
    from .model import megatron
    if plan.tp_size > 1 and not megatron(plan.profile_options.regime):
        raise NotModelledError("loss", name, "a Megatron-Core regime (regime='mixed-bf16-main-grad') under tp > 1",
                               "Megatron's vocabulary-parallel cross-entropy splits the logits its own way")


def _megatron_check(plan, chunks):
    if plan.profile_options.regime.compute == 4:
        raise NotModelledError("loss", "megatron_fused", "16-bit logits (bf16 or fp16 compute)",
                               "the fused cross-entropy casts its gradient to bf16 (fused_cross_entropy.py "
                               "calculate_gradients); Megatron runs fp32 logits through the unfused path "
                               "(loss='megatron_vocab_parallel')")
    _megatron_tp_check("megatron_fused", plan)


def _megatron_unfused_check(plan, chunks):
    _megatron_tp_check("megatron_vocab_parallel", plan)


def _launches(per_chunk, chunks_of):
    def added(plan):
        n = chunks_of(plan)
        launches = per_chunk * max(n - 1, 0)
        return launches * LAUNCH_S, (f"no extra FLOPs; {launches} more kernel launches ({per_chunk} x (chunks - 1), "
                                     f"{n} chunks) x {LAUNCH_S * 1e6:g} us")
    return added


def _count(plan):
    return plan.profile_options.loss_chunks or 8


def _tokens_per(plan):
    T = plan.microbatch * plan.seq_len
    return math.ceil(T / (plan.profile_options.loss_chunks or 1))


UNVALIDATED_CCE = ("loss='cut_cross_entropy' is unvalidated: Cut Cross-Entropy's kernels are Triton and need an "
                   "Ampere GPU; its bytes are derived from apple/ml-cross-entropy's source, not measured")

PUBLISHED = (
    LossImplementation(
        name="torchtune_linear", source=TORCHTUNE, terms=torchtune_linear_terms, chunks=8, token_share=True,
        saves_lm_head_input=False, allows=("autocast", "lora"),
        description="torchtune's LinearCrossEntropyLoss: ignored tokens masked out, the LM head and cross-entropy "
                    "chunk by chunk",
        note="loss: torchtune's LinearCrossEntropyLoss ({chunks} chunks, {share:g} of the tokens not ignored): the "
             "logits and their fp32 copy one chunk at a time; the fp32 log-softmax of the tokens not ignored saved",
        added_step_time=_launches(11, _count)),
    LossImplementation(
        name="torchtitan_chunked", source=TORCHTITAN, terms=torchtitan_chunked_terms, chunks=8,
        saves_lm_head_input=False, saves_lm_head_weight_copy=False, check=_titan_check,
        description="torchtitan's ChunkedLossWrapper: the LM head, loss and their backward chunk by chunk inside "
                    "the forward",
        note="loss: torchtitan's ChunkedLossWrapper ({chunks} chunks): the loss and the LM head's backward run in "
             "the forward chunk by chunk; the hidden state's gradient is held until the backward",
        added_step_time=_launches(13, _count)),
    LossImplementation(
        name="trl_chunked_nll", source=TRL, terms=trl_chunked_nll_terms, chunks=TRL_CHUNK, chunk_unit="tokens",
        token_share=True, saves_lm_head_input=False, casts_lm_head_once=False, check=_trl_check,
        allows=("autocast", "lora"),      # measured: validation/trl_loss/measure.py
        description="TRL's chunked_nll: valid tokens packed first, chunks of 256 under activation checkpointing",
        note="loss: TRL's chunked_nll ({chunks} tokens per chunk, {share:g} of the tokens not ignored): one "
             "checkpointed chunk of fp32 logits at a time",
        added_step_time=lambda plan: (None, "TRL's chunked_nll recomputes each chunk's LM head in the backward "
                                            "(2 x T' x h x V more FLOPs): not priced")),
    LossImplementation(
        name="litgpt_chunked", source=LITGPT, terms=litgpt_chunked_terms, chunks=128, chunk_unit="tokens",
        allows=("autocast", "lora"), check=_litgpt_check, quantizes_lm_head=True,
        description="LitGPT's chunked_cross_entropy (chunk_size 128): no upcast, the logits held through the "
                    "backward",
        note="loss: LitGPT's chunked_cross_entropy ({chunks} tokens per chunk): the log-softmax in the compute "
             "dtype, the logits held through the backward",
        added_step_time=_launches(5, _tokens_per)),
    LossImplementation(
        name="cut_cross_entropy", source=CCE, terms=cut_cross_entropy_terms, token_share=True,
        allows=("autocast", "lora"),     # lora: the frozen classifier's terms (cut_cross_entropy_terms)
        description="Apple's Cut Cross-Entropy: the logits never materialised (Triton; unvalidated)",
        note="loss: Cut Cross-Entropy: no logits in memory; the log-sum-exp per token saved, the logits recomputed "
             "in the backward's kernel",
        notes=(UNVALIDATED_CCE,),
        added_step_time=lambda plan: (None, "Cut Cross-Entropy recomputes the logits in its backward (2 x T' x h x V "
                                            "more FLOPs): not priced")),
    LossImplementation(
        name="megatron_fused", source=MEGATRON, terms=megatron_fused_terms, check=_megatron_check,
        # lora: the loss works on the logits alone; a frozen LM head (megatron-core's LinearWithFrozenWeight,
        # core_v0.14.0 megatron/core/tensor_parallel/layers.py: saves the weight only) keeps no input, which
        # lora.model_activation_terms' frozen-head terms already say (Megatron-Bridge's PEFT, launch/megatron_bridge.py)
        allows=("autocast", "tensor_parallel", "context_parallel", "megatron", "lora"),
        description="Megatron-Core's fused vocab-parallel cross-entropy, torch.compile'd as Megatron runs it "
                    "(jit_fuser): upcast once, softmax in place; the compiled backward's fresh fp32 buffer",
        note="loss: Megatron-Core's fused vocab-parallel cross-entropy (jit_fuser = torch.compile): the logits "
             "upcast once and worked in place (the softmax saved); the compiled backward computes the one-hot "
             "subtraction into a fresh fp32 buffer beside the softmax and the bf16 gradient",
        added_step_time=lambda plan: (0.0, "Megatron's fused cross-entropy: no extra FLOPs or launches")),
    LossImplementation(
        name="megatron_vocab_parallel", source=MEGATRON_UNFUSED, terms=megatron_vocab_parallel_terms,
        check=_megatron_unfused_check, allows=("autocast", "tensor_parallel", "context_parallel", "megatron", "lora",
                                                "lora_tensor_parallel"),      # (measure_lora_tp_loss.py)
        description="Megatron-Core's unfused vocab-parallel cross-entropy (not compiled): upcast once, softmax "
                    "and gradient in place",
        note="loss: Megatron-Core's unfused vocab-parallel cross-entropy: the logits upcast once and worked in "
             "place (the softmax saved); the backward's gradient made in place, cast to the logits' dtype beside it",
        added_step_time=lambda plan: (0.0, "Megatron's vocab-parallel cross-entropy: no extra FLOPs or launches")),
)
