"""The published losses' code, copied from their sources at the commits the measured profile
cites (plugins/mlsysim_plugins/measured/published_losses.py), reduced to the plain-tensor CPU path
(the DTensor, tensor-parallel, FSDP and spmd_types branches dropped; every line that allocates kept
as it is), so that measure_published.py measures the libraries' own allocations without installing
them (torchtune 0.6.1, the harness's, predates LinearCrossEntropyLoss; torchtitan and Megatron-LM
need their distributed stacks; TRL and LitGPT would pull their trainers).

* torchtune LinearCrossEntropyLoss: pytorch/torchtune bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1,
  torchtune/modules/loss/cross_entropy_loss.py lines 19-200.
* torchtitan ChunkedLossWrapper, GradAccumulator, _DecoderOutputGradientBackProp:
  pytorch/torchtitan b5bcd76c66d0acb1a08b176d9639425bc55e0b2a, torchtitan/components/loss.py
  lines 32-63 (cross_entropy_loss), 383-500, 501-720, 770-810.
* TRL chunked_nll: huggingface/trl f2cd57710ae345ea6428ae95363267fcf38a3dc8,
  trl/trainer/sft_trainer.py lines 87-230 (``_chunk``, ``_chunked_cross_entropy_loss``;
  ``maybe_gather_lm_head_ctx`` is a no-op without DeepSpeed ZeRO-3).
* LitGPT chunked_cross_entropy: Lightning-AI/litgpt 26857050fe3ff627cd714fe92f5838f51a3d5efa,
  litgpt/utils.py lines 302-350.
* Megatron-Core fused vocab-parallel cross-entropy: NVIDIA/Megatron-LM
  d98e8a64ddf34856e74b24714e3bedb2f5a39553, megatron/core/tensor_parallel/cross_entropy.py lines
  13-110 (the VocabParallelCrossEntropy steps) and megatron/core/fusions/fused_cross_entropy.py
  lines 1-150 (the fused Function), at tp = 1: the all-reduces over a group of one are identities
  and left out. ``MegatronFusedVocabParallelCrossEntropy`` runs the fused functions eagerly;
  ``CompiledMegatronFusedVocabParallelCrossEntropy`` as Megatron runs them: each of the four decorated
  with ``jit_fuser``, which is ``torch.compile`` from PyTorch 2.2 (megatron/core/jit.py, NVIDIA/Megatron-LM
  00caa53af30912914981c86f39db123961678bbd; fused_cross_entropy.py is the same at both commits).
  ``MegatronVocabParallelCrossEntropy``: the unfused ``_VocabParallelCrossEntropy``
  (tensor_parallel/cross_entropy.py lines 119-210, label_smoothing=0; not compiled): no concatenation,
  the fp32 gradient returned (autograd casts it to the logits' dtype).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


# --- torchtune ------------------------------------------------------------------------------------

class LinearCrossEntropyLoss(torch.nn.Module):
    """torchtune's, the plain-tensor path (mask_ignored_tokens=True)."""

    def __init__(self, linear_projection, num_output_chunks: int = 8, ignore_index: int = -100,
                 mask_ignored_tokens: bool = True):
        super().__init__()
        self.linear_projection = linear_projection
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index
        self.mask_ignored_tokens = mask_ignored_tokens

    def compute_cross_entropy(self, hidden_chunk, target_chunk):
        logits = self.linear_projection(hidden_chunk)  # [num_valid, vocab_size]
        loss = F.cross_entropy(logits.float(), target_chunk, reduction="sum", ignore_index=self.ignore_index)
        return loss

    def mask_inputs(self, hidden, target):
        indices = torch.where(target != self.ignore_index)[0]
        hidden = hidden.index_select(0, indices)
        target = target.index_select(0, indices)
        return hidden, target

    def forward(self, outputs, targets):
        total_valid_tokens = torch.where(targets != self.ignore_index)[0].numel()
        if total_valid_tokens == 0:
            return torch.tensor(0.0, device=targets.device)
        targets = targets.reshape(-1)
        outputs = outputs.reshape(-1, outputs.shape[-1])
        if self.mask_ignored_tokens:
            outputs, targets = self.mask_inputs(outputs, targets)
        hidden_chunks = outputs.tensor_split(self.num_output_chunks, dim=0)
        target_chunks = targets.tensor_split(self.num_output_chunks, dim=0)
        total_loss = torch.tensor(0.0, device=targets.device)
        for hidden_chunk, target_chunk in zip(hidden_chunks, target_chunks):
            loss = self.compute_cross_entropy(hidden_chunk, target_chunk)
            total_loss += loss
        return total_loss / total_valid_tokens


# --- torchtitan -----------------------------------------------------------------------------------

def titan_cross_entropy_loss(pred, labels):
    return torch.nn.functional.cross_entropy(pred.float(), labels, reduction="sum", ignore_index=IGNORE_INDEX)


class GradAccumulator:
    def __init__(self, reference, *, num_chunks: int, seq_dim: int = 0, dtype):
        self.num_chunks = num_chunks
        self.seq_dim = seq_dim
        self._next_idx = 0
        self._buffer = torch.zeros_like(reference, dtype=dtype)

    def add(self, chunk_grad):
        if chunk_grad.dtype != self._buffer.dtype:
            chunk_grad = chunk_grad.to(self._buffer.dtype)
        chunk_seq_len = chunk_grad.shape[self.seq_dim]
        start = self._next_idx * chunk_seq_len
        end = start + chunk_seq_len
        slices = [slice(None)] * self._buffer.ndim
        slices[self.seq_dim] = slice(start, end)
        self._buffer[tuple(slices)] = chunk_grad
        self._next_idx += 1

    def result(self):
        return self._buffer


class _DecoderOutputGradientBackProp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_states, accumulated_grad, loss):
        ctx.save_for_backward(accumulated_grad)
        return loss.detach()

    @staticmethod
    def backward(ctx, grad_output):
        (accumulated_grad,) = ctx.saved_tensors
        return accumulated_grad, None, None


def titan_chunked_loss(hidden_states, lm_head, labels, num_chunks=8, global_valid_tokens=None):
    """ChunkedLossWrapper.__call__, plain tensors, no FSDP: ``hidden_states`` [T, D] (tokens on dim 0)."""
    requires_grad = hidden_states.requires_grad

    def _chunk_local(t):
        seq_len = t.shape[0]
        torch._check(seq_len % num_chunks == 0, lambda: "sequence length must be divisible by num_chunks")
        chunk_len = seq_len // num_chunks
        return tuple(c.contiguous() for c in torch.split(t, [chunk_len] * num_chunks, dim=0))

    h_chunks = [c.detach().requires_grad_(requires_grad) for c in _chunk_local(hidden_states)]
    label_chunks = list(_chunk_local(labels))
    grad_accumulator = GradAccumulator(hidden_states, num_chunks=num_chunks, dtype=torch.float32) \
        if requires_grad else None
    total_loss = hidden_states.new_zeros((), dtype=torch.float32)
    for h_chunk, label_chunk in zip(h_chunks, label_chunks):
        logits = lm_head(h_chunk)
        chunk_loss = titan_cross_entropy_loss(logits, label_chunk)
        if global_valid_tokens is not None:
            chunk_loss = chunk_loss / global_valid_tokens
        total_loss = total_loss + chunk_loss.detach()
        if requires_grad:
            chunk_loss.backward()
            grad_accumulator.add(h_chunk.grad)
            h_chunk.grad = None
    if not requires_grad:
        return total_loss
    accumulated_grad = grad_accumulator.result().to(hidden_states.dtype)
    return _DecoderOutputGradientBackProp.apply(hidden_states, accumulated_grad, total_loss)


# --- TRL ------------------------------------------------------------------------------------------

def _trl_chunk(h, w, b, lbl, logit_scale, final_logit_softcapping):
    logits = h.float() @ w.float().t()
    if b is not None:
        logits = logits + b.float()
    if logit_scale != 1.0:
        logits = logits * logit_scale
    if final_logit_softcapping is not None:
        logits = final_logit_softcapping * torch.tanh(logits / final_logit_softcapping)
    log_p = F.log_softmax(logits, dim=-1)
    chunk_loss = F.nll_loss(log_p, lbl, ignore_index=-100, reduction="sum")
    valid = lbl != -100
    chunk_correct = ((logits.argmax(dim=-1) == lbl) & valid).sum().float()
    chunk_entropy = (-(log_p.exp() * log_p).sum(dim=-1) * valid).sum()
    return chunk_loss, chunk_correct, chunk_entropy


def trl_chunked_cross_entropy_loss(hidden_states, lm_head_weight, chunk_size, labels=None, shift_labels=None,
                                   num_items_in_batch=None, logit_scale=1.0, final_logit_softcapping=None,
                                   lm_head_bias=None):
    if shift_labels is not None:
        hidden = hidden_states.reshape(-1, hidden_states.size(-1))
        labels = shift_labels.reshape(-1)
    else:
        hidden = hidden_states[..., :-1, :].reshape(-1, hidden_states.size(-1))
        labels = labels[..., 1:].reshape(-1)
    valid = labels != -100
    n_valid_tensor = valid.sum()
    correct = hidden.new_zeros((), dtype=torch.float32)
    entropy_sum = hidden.new_zeros((), dtype=torch.float32)
    order = valid.to(torch.int8).argsort(descending=True, stable=True)
    hidden = hidden[order]
    labels = labels[order]
    n_padded = (n_valid_tensor / chunk_size).ceil().to(torch.int64) * chunk_size
    loss = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, n_padded, chunk_size):
        h_chunk = hidden[start: start + chunk_size]
        lbl_chunk = labels[start: start + chunk_size]
        chunk_loss, chunk_correct, chunk_entropy = torch.utils.checkpoint.checkpoint(
            _trl_chunk, h_chunk, lm_head_weight, lm_head_bias, lbl_chunk, logit_scale, final_logit_softcapping,
            use_reentrant=False)
        loss = loss + chunk_loss
        correct = correct + chunk_correct
        entropy_sum = entropy_sum + chunk_entropy
    if num_items_in_batch is None:
        loss = loss / n_valid_tensor
    else:
        loss = loss / num_items_in_batch
    return loss, correct, entropy_sum, n_valid_tensor


# --- LitGPT ---------------------------------------------------------------------------------------

def litgpt_chunked_cross_entropy(logits, targets, chunk_size=128, ignore_index=-100):
    if isinstance(logits, list):
        raise NotImplementedError("the chunked LM head (lm_head_chunk_size) path: LoRA recipes, not modelled")
    logits = logits.reshape(-1, logits.size(-1))
    targets = targets.reshape(-1)
    if chunk_size == 0:
        return torch.nn.functional.cross_entropy(logits, targets, ignore_index=ignore_index)
    logit_chunks = logits.split(chunk_size)
    target_chunks = targets.split(chunk_size)
    loss_chunks = [
        torch.nn.functional.cross_entropy(logit_chunk, target_chunk, ignore_index=ignore_index, reduction="none")
        for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)
    ]
    non_masked_elems = (targets != ignore_index).sum()
    return torch.cat(loss_chunks).sum() / non_masked_elems.maximum(torch.ones_like(non_masked_elems))


# --- Megatron-Core --------------------------------------------------------------------------------

def _calculate_logits_max(vocab_parallel_logits):
    vocab_parallel_logits = vocab_parallel_logits.float()
    logits_max = torch.max(vocab_parallel_logits, dim=-1)[0]
    return vocab_parallel_logits, logits_max


def _calculate_predicted_logits(vocab_parallel_logits, target, logits_max, vocab_start_index, vocab_end_index):
    vocab_parallel_logits -= logits_max.unsqueeze(dim=-1)
    target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
    masked_target = target.clone() - vocab_start_index
    masked_target[target_mask] = 0
    partition_vocab_size = vocab_parallel_logits.size()[-1]
    logits_2d = vocab_parallel_logits.view(-1, partition_vocab_size)
    masked_target_1d = masked_target.view(-1)
    arange_1d = torch.arange(start=0, end=logits_2d.size()[0], device=logits_2d.device)
    predicted_logits_1d = logits_2d[arange_1d, masked_target_1d]
    predicted_logits_1d = predicted_logits_1d.clone().contiguous()
    predicted_logits = predicted_logits_1d.view_as(target)
    predicted_logits[target_mask] = 0.0
    exp_logits = vocab_parallel_logits
    torch.exp(vocab_parallel_logits, out=exp_logits)
    sum_exp_logits = exp_logits.sum(dim=-1)
    # fused_cross_entropy.calculate_predicted_logits: the two all-reduced statistics concatenated
    predicted_logits_sum_exp_logits = torch.cat((predicted_logits, sum_exp_logits))
    return target_mask, masked_target_1d, predicted_logits_sum_exp_logits, exp_logits


def _calculate_cross_entropy_loss(exp_logits, predicted_logits_sum_exp_logits):
    split_val = predicted_logits_sum_exp_logits.size()[0] // 2
    predicted_logits, sum_exp_logits = torch.split(predicted_logits_sum_exp_logits, split_val)
    loss = torch.log(sum_exp_logits) - predicted_logits
    exp_logits.div_(sum_exp_logits.unsqueeze(dim=-1))
    return exp_logits, loss


def _calculate_gradients(softmax, grad_output, target_mask, masked_target_1d):
    grad_input = softmax
    partition_vocab_size = softmax.size()[-1]
    grad_2d = grad_input.view(-1, partition_vocab_size)
    arange_1d = torch.arange(start=0, end=grad_2d.size()[0], device=grad_2d.device)
    softmax_update = 1.0 - target_mask.view(-1).float()
    grad_2d[arange_1d, masked_target_1d] -= softmax_update
    grad_input.mul_(grad_output.unsqueeze(dim=-1))
    grad_input = grad_input.to(torch.bfloat16)
    return grad_input


class MegatronFusedVocabParallelCrossEntropy(torch.autograd.Function):
    """fused_cross_entropy._VocabParallelCrossEntropy at tp = 1 (vocabulary [0, V))."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        vocab_parallel_logits, logits_max = _calculate_logits_max(vocab_parallel_logits)
        vocab_start_index, vocab_end_index = 0, vocab_parallel_logits.size()[-1]
        (target_mask, masked_target_1d, predicted_logits_sum_exp_logits, exp_logits) = _calculate_predicted_logits(
            vocab_parallel_logits, target, logits_max, vocab_start_index, vocab_end_index)
        exp_logits, loss = _calculate_cross_entropy_loss(exp_logits, predicted_logits_sum_exp_logits)
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = _calculate_gradients(softmax, grad_output, target_mask, masked_target_1d)
        return grad_input, None


class MegatronVocabParallelCrossEntropy(torch.autograd.Function):
    """tensor_parallel/cross_entropy._VocabParallelCrossEntropy at tp = 1, label_smoothing = 0 (eager)."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        vocab_parallel_logits, logits_max = _calculate_logits_max(vocab_parallel_logits)
        vocab_start_index, vocab_end_index = 0, vocab_parallel_logits.size()[-1]
        # VocabParallelCrossEntropy.calculate_predicted_logits (no torch.cat)
        vocab_parallel_logits -= logits_max.unsqueeze(dim=-1)
        target_mask = (target < vocab_start_index) | (target >= vocab_end_index)
        masked_target = target.clone() - vocab_start_index
        masked_target[target_mask] = 0
        partition_vocab_size = vocab_parallel_logits.size()[-1]
        logits_2d = vocab_parallel_logits.view(-1, partition_vocab_size)
        masked_target_1d = masked_target.view(-1)
        arange_1d = torch.arange(start=0, end=logits_2d.size()[0], device=logits_2d.device)
        predicted_logits_1d = logits_2d[arange_1d, masked_target_1d]
        predicted_logits_1d = predicted_logits_1d.clone().contiguous()
        predicted_logits = predicted_logits_1d.view_as(target)
        predicted_logits[target_mask] = 0.0
        exp_logits = vocab_parallel_logits
        torch.exp(vocab_parallel_logits, out=exp_logits)
        sum_exp_logits = exp_logits.sum(dim=-1)
        # VocabParallelCrossEntropy.calculate_cross_entropy_loss
        loss = torch.log(sum_exp_logits) - predicted_logits
        exp_logits.div_(sum_exp_logits.unsqueeze(dim=-1))
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = softmax
        partition_vocab_size = softmax.size()[-1]
        grad_2d = grad_input.view(-1, partition_vocab_size)
        arange_1d = torch.arange(start=0, end=grad_2d.size()[0], device=grad_2d.device)
        softmax_update = 1.0 - target_mask.view(-1).float()
        grad_2d[arange_1d, masked_target_1d] -= softmax_update
        grad_input.mul_(grad_output.unsqueeze(dim=-1))
        return grad_input, None


_COMPILED = {}


def _compiled(fn):
    """``jit_fuser`` = ``torch.compile`` (megatron/core/jit.py), made once per function."""
    if fn not in _COMPILED:
        _COMPILED[fn] = torch.compile(fn)
    return _COMPILED[fn]


class CompiledMegatronFusedVocabParallelCrossEntropy(torch.autograd.Function):
    """fused_cross_entropy._VocabParallelCrossEntropy at tp = 1, its four functions torch.compile'd."""

    @staticmethod
    def forward(ctx, vocab_parallel_logits, target):
        vocab_parallel_logits, logits_max = _compiled(_calculate_logits_max)(vocab_parallel_logits)
        vocab_start_index, vocab_end_index = 0, vocab_parallel_logits.size()[-1]
        (target_mask, masked_target_1d, predicted_logits_sum_exp_logits, exp_logits) = _compiled(
            _calculate_predicted_logits)(vocab_parallel_logits, target, logits_max, vocab_start_index, vocab_end_index)
        exp_logits, loss = _compiled(_calculate_cross_entropy_loss)(exp_logits, predicted_logits_sum_exp_logits)
        ctx.save_for_backward(exp_logits, target_mask, masked_target_1d)
        return loss

    @staticmethod
    def backward(ctx, grad_output):
        softmax, target_mask, masked_target_1d = ctx.saved_tensors
        grad_input = _compiled(_calculate_gradients)(softmax, grad_output, target_mask, masked_target_1d)
        return grad_input, None
