"""Liger-Kernel v0.8.2's fused linear cross-entropy, re-implemented in PyTorch to measure its
memory on the CPU (liger-kernel needs triton, which needs a GPU).

``fused_linear_cross_entropy_forward`` below follows
``src/liger_kernel/ops/fused_linear_cross_entropy.py`` (tag v0.8.2) line by line, for the options
Hugging Face's patched ``lce_forward`` uses (no bias, no class weights, no soft-capping, no
z-loss, reduction "mean"): the chunk size (lines 64-70), the zero-filled gradient buffers
(72-86), per chunk the logits ``_input_chunk @ weight.t()`` (114), the cross-entropy kernel
that overwrites the logits with their gradient in place (163-197), ``grad_input[...] =
grad_logits_chunk @ weight`` (231) and ``grad_weight += torch.mm(grad_logits_chunk.t(),
_input_chunk).float()`` (257: the path every device but a CUDA GPU of compute capability >= 8
with an fp32 ``grad_weight`` and 16-bit logits takes), then ``grad_weight.to(weight.dtype)``
(286) and ``ctx.save_for_backward(grad_input, grad_weight)`` (431-435). The backward (292-336,
467-470) returns the saved gradients untouched when the loss's gradient is 1.0.

What differs from Liger: the triton kernel ``liger_cross_entropy_kernel`` (ops/cross_entropy.py)
is replaced by in-place PyTorch ops on the logits chunk (a few chunk-length vectors more, where
the kernel keeps its row statistics in registers); the numbers are the same up to rounding.
This measures the algorithm's allocations, not Liger itself: the profile marks the option
unvalidated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def chunk_rows(tokens: int, hidden: int, vocab: int) -> int:
    """Liger's chunk size (lines 68-69): next_power_of_2(cdiv(BT, cdiv(V, H)))."""
    return _next_power_of_2(_cdiv(tokens, _cdiv(vocab, hidden)))


def _ce_grad_in_place(logits, target, loss_out, n_non_ignore, ignore_index):
    """What liger_cross_entropy_kernel does to one chunk (reduction "mean"): writes each row's
    loss into ``loss_out`` and overwrites the logits with d loss / d logits."""
    valid = target != ignore_index
    safe = torch.where(valid, target, torch.zeros_like(target))
    picked = logits.gather(1, safe[:, None]).float()
    m = logits.amax(dim=1, keepdim=True)
    logits.sub_(m).exp_()
    s = logits.sum(dim=1, keepdim=True, dtype=torch.float32)
    loss_out.copy_(torch.where(valid, (s.log() + m.float() - picked).squeeze(1), torch.zeros_like(loss_out))
                   / n_non_ignore)
    logits.div_(s.to(logits.dtype))
    logits.scatter_add_(1, safe[:, None], -torch.ones_like(picked, dtype=logits.dtype))
    logits.mul_((valid.to(logits.dtype) / n_non_ignore)[:, None])


def fused_linear_cross_entropy_forward(_input, weight, target, ignore_index=-100):
    BT, H = _input.shape
    V = weight.shape[0]
    chunk_size = chunk_rows(BT, H, V)
    num_chunks = _cdiv(BT, chunk_size)
    grad_input = torch.zeros_like(_input)
    grad_weight = torch.zeros_like(weight) if weight.requires_grad else None
    loss_1d = torch.zeros(BT, dtype=torch.float32)
    target_mask = target != ignore_index
    total_n_non_ignore = target_mask.sum().item()
    for chunk_id in range(num_chunks):
        start_idx = chunk_id * chunk_size
        end_idx = min((chunk_id + 1) * chunk_size, BT)
        _input_chunk = _input[start_idx:end_idx]
        logits_chunk = _input_chunk @ weight.t()
        target_chunk = target[start_idx:end_idx]
        loss_1d_slice = loss_1d[start_idx:end_idx]
        logits_chunk = logits_chunk.contiguous()
        target_chunk = target_chunk.contiguous()
        _ce_grad_in_place(logits_chunk, target_chunk, loss_1d_slice, total_n_non_ignore, ignore_index)
        grad_logits_chunk = logits_chunk
        grad_input[start_idx:end_idx] = grad_logits_chunk @ weight
        if grad_weight is not None:
            grad_weight += torch.mm(grad_logits_chunk.t(), _input_chunk).float()
    loss = torch.sum(loss_1d)
    grad_weight = grad_weight.to(weight.dtype) if grad_weight is not None else None
    return loss, grad_input, grad_weight


class FusedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu")      # liger: amp_custom_fwd (torch.amp.custom_fwd, its device)
    def forward(ctx, _input, weight, target, ignore_index=-100):
        loss, grad_input, grad_weight = fused_linear_cross_entropy_forward(_input, weight, target, ignore_index)
        ctx.save_for_backward(grad_input.detach(), grad_weight.detach() if grad_weight is not None else None)
        return loss

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad_output):
        grad_input, grad_weight = ctx.saved_tensors
        if not torch.equal(grad_output, torch.tensor(1.0, device=grad_output.device)):   # lines 294-335
            grad_input.mul_(grad_output)
            if grad_weight is not None:
                grad_weight.mul_(grad_output)
        return grad_input, grad_weight, None, None


def liger_causal_lm_loss(hidden_states, lm_head_weight, labels, hidden_size, ignore_index=-100):
    """liger_kernel/transformers/model/loss_utils.py LigerForCausalLMLoss (v0.8.2, lines 85-105)."""
    labels = F.pad(labels, (0, 1), value=ignore_index)
    shift_labels = labels[..., 1:].contiguous()
    hidden_states = hidden_states.view(-1, hidden_size)
    shift_labels = shift_labels.view(-1)
    return FusedLinearCrossEntropy.apply(hidden_states, lm_head_weight, shift_labels, ignore_index)
