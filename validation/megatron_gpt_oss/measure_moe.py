#!/usr/bin/env python
"""Megatron-Core's gpt-oss MoE block, as Megatron-Bridge's gpt-oss recipes configure it, measured on the CPU
with PyTorch's ``MemTracker`` (eager): the bytes the block keeps for its backward, per phase.

    python validation/megatron_gpt_oss/measure_moe.py --megatron-lm DIR [--out FILE]

``DIR`` is a Megatron-LM checkout at ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (or a bare mirror: the
sources are read with ``git show COMMIT:PATH``). Needs validation/requirements.txt (torch 2.13.0 CPU; transformers
only because validation/harness.py, whose command line and record this uses, imports it); Megatron-Core is not
imported: the named functions below are taken from its source at that commit and executed as they are.

What Megatron-Bridge's gpt-oss provider and recipes set (Megatron-Bridge 067f987d,
``src/megatron/bridge/models/gpt_oss/gpt_oss_bridge.py``, ``src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py``):
``moe_grouped_gemm=True`` (``TEGroupedMLP``), ``add_bias_linear=True``, ``bias_activation_fusion=True``,
``activation_func=quick_gelu``, ``activation_func_clamp_value=7.0``, ``glu_linear_offset=1.0``,
``moe_token_dispatcher_type="alltoall"``, ``moe_permute_fusion=True``, ``moe_router_fusion=False``,
``moe_router_pre_softmax=False``, ``moe_router_load_balancing_type="none"``, no recomputation, bf16.

Run from Megatron-Core's own source (the pure-PyTorch parts, exactly as written):

* the router: ``RouterGatingLinearFunction`` (saves its input, weight and bias: the norm output and two
  parameters) and ``topk_routing_with_score_function`` (unfused: ``topk`` of the bf16 logits, ``softmax`` over
  the k values in fp32, ``type_as`` the logits, the dense [T, E] probabilities and boolean routing map by
  ``scatter``) -- ``megatron/core/transformer/moe/moe_utils.py``;
* the activation: ``weighted_bias_quick_geglu_impl`` with ``clamp_value=7`` and ``linear_offset=1``
  (``megatron/core/fusions/fused_bias_geglu.py``: the two clamps of views of fc1's output, their ``cat``,
  ``WeightedQuickGeGLUFunction``, which saves the cat, the permuted probabilities and the offset scalar), with
  ``jit_fuser`` the identity (Megatron's ``disable_jit_fuser``: what a jit-fused function computes inside an
  autograd Function's forward is never saved, so the saved bytes are the same; its temporaries are eager);
* fc2's bias scaled by the probabilities: ``TEGroupedMLP._apply_bias`` (``experts.py``; the host-count path
  that ``tokens_per_expert.tolist()`` takes: ``cat([t + b * p])`` in fp32, cast back).

Stand-ins for what runs only on a GPU (Transformer Engine 2.x kernels), each saving what TE's source at
d0067d0d saves (``transformer_engine/pytorch/``):

* ``GroupedLinear`` (``module/grouped_linear.py``, ``_GroupedLinear.forward``): in bf16 with no quantizer the
  inputs are ``torch.split`` views of the input, saved with the weights and biases (``prepare_for_saving(
  *inputmats, *weights_fp8, *saved_weights, *biases)``; ``weights_fp8`` are the bf16 parameters themselves);
  fc1 adds its bias in the GEMM (``skip_bias_add=False``), fc2 returns its biases (``skip_bias_add=True``);
* ``moe_permute_with_probs`` (``permutation.py``, mask map): saves only its int32 ``row_id_map`` of
  ``(num_tokens, 2 x num_experts + 1)``; returns the permuted tokens and probabilities;
* ``moe_sort_chunks_by_index_with_probs`` (the alltoall dispatcher's ``sort_chunks_by_idxs``, run whenever a
  rank holds more than one expert, in dispatch and in combine): saves an int32 ``row_id_map`` of one entry per
  routed copy; returns copies of the tokens and probabilities;
* ``moe_unpermute`` (no merging probabilities: the alltoall dispatcher applies them in the experts): saves
  the permute's ``row_id_map`` (the same tensor).

The alltoall dispatcher (``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher.dispatch_preprocess``) keeps
``self.probs`` (the dense [T, E] probabilities) and ``self.routing_map`` ([T, E] bool) as attributes until the
layer's next forward: the stand-in dispatcher holds them too. On one rank (ep = tp = 1) its all-to-alls return
their input.

Expert parallelism (``EP_CONFIGS``; tp = 1): rank 0 of a group of ``ep`` ranks with ``E / ep`` local experts,
``MoEAlltoAllTokenDispatcher.preprocess`` / ``token_dispatch`` / ``dispatch_postprocess`` / ``combine_preprocess``
/ ``token_combine`` as written at COMMIT, with every rank of the group routing the same tokens (so the token
counts the group gathers are rank 0's, and the rows rank 0 receives, ``sum(output_splits)``, are ep x its own
copies for its local experts: not T x k, which the comparison uses as it is). The all-to-all is a local stand-in
for ``_AllToAll`` (``megatron/core/tensor_parallel/mappings.py``): it allocates what the collective allocates
(``new_empty`` of the output splits' rows, forward and backward) and saves nothing; the chunk sorts run with
the real (source rank, local expert) order. The stand-in dispatcher (one rank and expert-parallel alike) also
holds ``reversed_local_input_permutation_mapping`` (the permute's row_id_map) and ``num_global_tokens_per_local_expert``
(int64, with more than one local expert), which Megatron's dispatcher keeps until the layer's next forward
(``held_other``): the growth over the start then misses the row_id_map that replaced the previous one, added
back in ``saved_with_row_id_map``. The transient peaks (``forward_peak_over_start``, ``peak_over_start``) are
recorded, not compared: they hold the eager activation's temporaries, which one fused kernel avoids on a GPU.
"""

from __future__ import annotations

import ast
import os
import platform
import subprocess
import sys
import textwrap
from typing import List, Optional, Tuple, Union

import torch
import torch.nn.functional as F
from torch.distributed._tools.mem_tracker import MemTracker

COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
import harness  # noqa: E402  (validation/harness.py: the command line and the JSON record)

# (id, tokens, hidden, moe_ffn_hidden_size, experts, top_k): small shapes of gpt-oss's layer (E > k, every
# expert on the one rank, so both chunk sorts run; and E = k, where every token reaches every expert)
CONFIGS = (
    ("t128-h64-f48-e8-k4", 128, 64, 48, 8, 4, 1),
    ("t96-h32-f40-e4-k2", 96, 32, 40, 4, 2, 1),
    ("t64-h48-f32-e4-k4", 64, 48, 32, 4, 4, 1),
)
# (..., ep): one rank (rank 0) of an expert-parallel group of ep ranks, E / ep experts on it: several local experts
# (both chunk sorts run), and one local expert (no chunk sort: num_local_experts == 1)
EP_CONFIGS = (
    ("ep2-t128-h64-f48-e8-k4", 128, 64, 48, 8, 4, 2),
    ("ep4-t96-h32-f40-e8-k2", 96, 32, 40, 8, 2, 4),
    ("ep4-t64-h48-f32-e4-k2", 64, 48, 32, 4, 2, 4),
)


# --- Megatron-Core's source at COMMIT ------------------------------------------------------------------

def _read(repo: str, path: str) -> str:
    full = os.path.join(repo, path)
    if os.path.exists(full):
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        if head != COMMIT:
            raise SystemExit(f"{repo} is at {head or '?'}, not {COMMIT}")
        return open(full).read()
    out = subprocess.run(["git", "--git-dir", repo, "show", f"{COMMIT}:{path}"], capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(out.stderr)
    return out.stdout


def _defs(src: str, names: tuple[str, ...], cls: str | None = None) -> str:
    """The source of the named top-level functions and classes (or the static methods of ``cls``)."""
    tree = ast.parse(src)
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found = {}
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in names:
            seg = ast.get_source_segment(src, node)
            if cls is not None:     # a @staticmethod: its decorator is not part of the segment
                seg = textwrap.dedent(seg)
            found[node.name] = seg
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"not found at {COMMIT}: {sorted(missing)}")
    return "\n\n".join(found[n] for n in names)


def megatron_namespace(repo: str) -> dict:
    ns = {"torch": torch, "F": F, "Optional": Optional, "Tuple": Tuple, "List": List, "Union": Union,
          "jit_fuser": lambda f: f,                     # megatron.core.jit.disable_jit_fuser
          "HAVE_TE": False, "te_general_gemm": None, "fused_topk_with_score_function": None,
          "is_batch_invariant_mode_enabled": lambda: False}
    moe_utils = _read(repo, "megatron/core/transformer/moe/moe_utils.py")
    exec(_defs(moe_utils, ("RouterGatingLinearFunction", "router_gating_linear",
                           "topk_routing_with_score_function")), ns)
    geglu = _read(repo, "megatron/core/fusions/fused_bias_geglu.py")
    exec(_defs(geglu, ("quick_gelu", "quick_geglu", "weighted_quick_geglu", "quick_geglu_back",
                       "weighted_quick_geglu_back", "WeightedQuickGeGLUFunction", "weighted_bias_quick_geglu",
                       "weighted_bias_quick_geglu_back", "WeightedBiasQuickGeGLUFunction",
                       "weighted_bias_quick_geglu_impl")), ns)
    experts = _read(repo, "megatron/core/transformer/moe/experts.py")
    holder: dict = {"torch": torch}
    exec(_defs(experts, ("_apply_packed_bias", "_apply_bias"), cls="TEGroupedMLP"), holder)
    ns["TEGroupedMLP"] = type("TEGroupedMLP", (), {"_apply_packed_bias": staticmethod(holder["_apply_packed_bias"]),
                                                   "_apply_bias": staticmethod(holder["_apply_bias"])})
    return ns


# --- stand-ins for Transformer Engine's GPU kernels (see the module docstring) ------------------------------

class GroupedLinear(torch.autograd.Function):
    """TE's ``_GroupedLinear`` in bf16: saves the input (split views), the weights and the biases."""

    @staticmethod
    def forward(ctx, inp, m_splits, add_bias, *weights_and_biases):
        n = len(m_splits)
        weights, biases = weights_and_biases[:n], weights_and_biases[n:]
        inputmats = torch.split(inp, m_splits)
        out = torch.empty(inp.shape[0], weights[0].shape[0], dtype=inp.dtype)
        for i, (x, w) in enumerate(zip(inputmats, weights)):
            part = out.narrow(0, sum(m_splits[:i]), m_splits[i])
            torch.mm(x, w.t(), out=part)
            if add_bias:
                part.add_(biases[i])
        ctx.save_for_backward(*inputmats, *weights, *biases)
        ctx.n, ctx.m_splits, ctx.add_bias = n, m_splits, add_bias
        return out

    @staticmethod
    def backward(ctx, grad):
        saved = ctx.saved_tensors
        n = ctx.n
        xs, ws = saved[:n], saved[n:2 * n]
        gs = torch.split(grad, ctx.m_splits)
        dx = torch.cat([g @ w for g, w in zip(gs, ws)])
        dws = [g.t() @ x for g, x in zip(gs, xs)]
        dbs = [g.sum(0) for g in gs] if ctx.add_bias else [None] * n
        return (dx, None, None, *dws, *dbs)


class PermuteWithProbs(torch.autograd.Function):
    """TE's ``moe_permute_with_probs`` (mask map): saves its int32 row_id_map (num_tokens, 2E + 1)."""

    @staticmethod
    def forward(ctx, tokens, probs, routing_map, num_out):
        T, E = routing_map.shape
        flat = routing_map.t().reshape(-1).nonzero().squeeze(1)        # expert-major routed copies
        rows = flat % T
        row_id_map = torch.full((T, 2 * E + 1), -1, dtype=torch.int32)
        row_id_map[rows, flat // T] = torch.arange(num_out, dtype=torch.int32)
        out, pprobs = tokens.index_select(0, rows), probs.t().reshape(-1)[flat]
        del flat, rows
        ctx.save_for_backward(row_id_map)
        ctx.E = E
        ctx.mark_non_differentiable(row_id_map)
        return out, pprobs, row_id_map

    @staticmethod
    def backward(ctx, g_out, g_probs, _):
        (row_id_map,) = ctx.saved_tensors
        dest = row_id_map[:, :ctx.E].long()
        mask = dest >= 0
        d_tokens = (g_out[dest.clamp(min=0)] * mask.unsqueeze(-1)).sum(1)
        d_probs = torch.where(mask, g_probs[dest.clamp(min=0)], torch.zeros((), dtype=g_probs.dtype))
        return d_tokens, d_probs, None, None


class SortChunks(torch.autograd.Function):
    """TE's ``moe_sort_chunks_by_index_with_probs``: saves an int32 row_id_map (one entry per row); returns
    copies. On one rank the chunk order is the identity (``sort_input_by_local_experts``)."""

    @staticmethod
    def forward(ctx, tokens, probs):
        row_id_map = torch.arange(tokens.shape[0], dtype=torch.int32)
        ctx.save_for_backward(row_id_map)
        ctx.with_probs = probs is not None
        return tokens.clone(), (probs.clone() if probs is not None else None)

    @staticmethod
    def backward(ctx, g_tokens, g_probs):
        (row_id_map,) = ctx.saved_tensors
        idx = row_id_map.long()
        return g_tokens[idx], (g_probs[idx] if ctx.with_probs else None)


def _exchange(inp, output_split_sizes):
    """The all-to-all's output on rank 0: ``inp.new_empty([sum(output_split_sizes), ...])``, each source's chunk
    filled with the first rows of ``inp`` (the group routes alike; the values do not change the bytes)."""
    out = inp.new_empty([sum(output_split_sizes)] + list(inp.shape[1:]))
    at = 0
    for n in output_split_sizes:
        m = min(n, inp.shape[0])
        out.narrow(0, at, m).copy_(inp.narrow(0, 0, m))
        out.narrow(0, at + m, n - m).zero_()
        at += n
    return out


class AllToAll(torch.autograd.Function):
    """Megatron-Core's ``_AllToAll`` (``megatron/core/tensor_parallel/mappings.py``) on rank 0 of a group whose
    every rank routes the same tokens: the forward allocates ``input.new_empty([sum(output_split_sizes), ...])``,
    the backward (the reverse all-to-all) ``[sum(input_split_sizes), ...]``; nothing is saved (the ctx holds the
    split lists)."""

    @staticmethod
    def forward(ctx, inp, output_split_sizes, input_split_sizes):
        ctx.input_split_sizes = input_split_sizes
        return _exchange(inp.contiguous(), output_split_sizes)

    @staticmethod
    def backward(ctx, g):
        return _exchange(g.contiguous(), ctx.input_split_sizes), None, None


class SortChunksBy(torch.autograd.Function):
    """TE's ``moe_sort_chunks_by_index_with_probs`` with a real chunk order (``split_sizes``, ``sorted_idxs``):
    saves an int32 row_id_map, one entry per row; returns gathered copies."""

    @staticmethod
    def forward(ctx, tokens, probs, split_sizes, sorted_idxs):
        starts = [sum(split_sizes[:i]) for i in range(len(split_sizes))]
        order = [r for i in sorted_idxs for r in range(starts[i], starts[i] + split_sizes[i])]
        row_id_map = torch.tensor(order, dtype=torch.int32)
        ctx.save_for_backward(row_id_map)
        ctx.with_probs = probs is not None
        idx = row_id_map.long()
        return tokens[idx], (probs[idx] if probs is not None else None)

    @staticmethod
    def backward(ctx, g_tokens, g_probs):
        (row_id_map,) = ctx.saved_tensors
        idx = row_id_map.long()
        gt = torch.empty_like(g_tokens)
        gt[idx] = g_tokens
        gp = None
        if ctx.with_probs:
            gp = torch.empty_like(g_probs)
            gp[idx] = g_probs
        return gt, gp, None, None


class Unpermute(torch.autograd.Function):
    """TE's ``moe_unpermute`` without merging probabilities: saves the permute's row_id_map."""

    @staticmethod
    def forward(ctx, permuted, row_id_map, E):
        dest = row_id_map[:, :E].long()
        mask = (dest >= 0).unsqueeze(-1)
        out = (permuted[dest.clamp(min=0)] * mask).sum(1).to(permuted.dtype)
        ctx.save_for_backward(row_id_map)
        ctx.E, ctx.rows = E, permuted.shape[0]
        return out

    @staticmethod
    def backward(ctx, g):
        (row_id_map,) = ctx.saved_tensors
        dest = row_id_map[:, :ctx.E].long()
        gp = torch.zeros(ctx.rows, g.shape[1], dtype=g.dtype)
        for e in range(ctx.E):
            sel = dest[:, e] >= 0
            gp[dest[sel, e]] = g[sel]
        return gp, None, None


# --- the block ------------------------------------------------------------------------------------------

class MegatronGptOssMoE(torch.nn.Module):
    """Router, alltoall dispatcher (one rank), TEGroupedMLP (bias-activation fusion, clamped quick-GEGLU with
    offset 1), combine: ``MoELayer.forward`` of Megatron-Core at COMMIT with the recipe's options."""

    def __init__(self, ns, hidden, ffn, experts, top_k, ep=1):
        super().__init__()
        self.ns, self.E, self.k, self.ep = ns, experts, top_k, ep
        self.local = experts // ep      # num_local_experts: rank 0 holds experts 0 .. local - 1
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, dtype=torch.bfloat16) * 0.05)  # noqa: E731
        self.router_weight, self.router_bias = p(experts, hidden), p(experts)
        self.fc1_w = torch.nn.ParameterList([p(2 * ffn, hidden) for _ in range(self.local)])
        self.fc1_b = torch.nn.ParameterList([p(2 * ffn) for _ in range(self.local)])
        self.fc2_w = torch.nn.ParameterList([p(hidden, ffn) for _ in range(self.local)])
        self.fc2_b = torch.nn.ParameterList([p(hidden) for _ in range(self.local)])
        self.held = {}          # the dispatcher's self.probs, self.routing_map
        self.held_other = {}    # ep > 1: its reversed_local_input_permutation_mapping, num_global_tokens_per_local_expert

    def forward(self, x):
        if self.ep == 1:
            return self.forward_one_rank(x)
        return self.forward_ep(x)

    def forward_ep(self, x):
        """``MoELayer.forward`` on rank 0 of the expert-parallel group (tp = 1): ``preprocess`` (the token counts:
        ``gather_from_sequence_parallel_region`` of the [E] int64 counts over the group, here every rank's
        counts equal rank 0's), the permute, the two all-to-alls (tokens, probabilities), ``sort_chunks_by_idxs``
        from (source rank, local expert) to (local expert, source rank) order when num_local_experts > 1, the
        experts, the reverse sort, the combine all-to-all, the unpermute. The dispatcher holds ``probs``,
        ``routing_map``, ``reversed_local_input_permutation_mapping`` and (num_local_experts > 1)
        ``num_global_tokens_per_local_expert`` until the layer's next forward."""
        ns, E, L, ep = self.ns, self.E, self.local, self.ep
        logits = ns["router_gating_linear"](x, self.router_weight, self.router_bias, x.dtype)
        probs, routing_map = ns["topk_routing_with_score_function"](
            logits, self.k, use_pre_softmax=False, score_function="softmax", fused=False)
        self.held = {"probs": probs, "routing_map": routing_map}
        num_local_tokens_per_expert = routing_map.sum(dim=0).long()
        input_splits = num_local_tokens_per_expert.reshape(ep, L).sum(dim=1).tolist()
        num_global_tokens_per_expert = num_local_tokens_per_expert.repeat(ep).reshape(ep, 1, E).transpose(0, 1)
        num_global_tokens_per_local_expert = num_global_tokens_per_expert[:, :, 0:L].contiguous()
        output_splits = num_global_tokens_per_local_expert.sum(dim=2)[0].tolist()
        self.received = sum(output_splits)
        tokens_per_expert = num_global_tokens_per_local_expert.sum(dim=(0, 1)).tolist()
        del num_local_tokens_per_expert, num_global_tokens_per_expert
        num_out = x.shape[0] * self.k
        permuted, pprobs, row_id_map = PermuteWithProbs.apply(x, probs, routing_map, num_out)
        held_other = {"row_id_map": row_id_map}
        tokens = AllToAll.apply(permuted, output_splits, input_splits)
        del permuted
        gprobs = AllToAll.apply(pprobs, output_splits, input_splits)
        del pprobs
        chunks = num_global_tokens_per_local_expert.view(-1, L)
        if L > 1:
            held_other["num_global_tokens_per_local_expert"] = chunks
            idx = torch.arange(E).reshape(-1, L)        # sort_input_by_local_experts over ep x L chunks
            sort_in, restore = idx[:ep].T.ravel().tolist(), idx[:ep].reshape(L, -1).T.ravel().tolist()
            tokens, gprobs = SortChunksBy.apply(tokens, gprobs, chunks.ravel().tolist(), sort_in)
        self.held_other = held_other
        gprobs = gprobs.unsqueeze(-1)
        fc1 = GroupedLinear.apply(tokens, tokens_per_expert, True, *self.fc1_w, *self.fc1_b)
        del tokens
        act = ns["weighted_bias_quick_geglu_impl"](fc1, None, gprobs, False, 1.0, 7.0)
        del fc1
        fc2 = GroupedLinear.apply(act, tokens_per_expert, False, *self.fc2_w)
        del act
        out = ns["TEGroupedMLP"]._apply_bias(fc2, list(self.fc2_b), tokens_per_expert, gprobs)
        del fc2, gprobs
        if L > 1:
            out, _ = SortChunksBy.apply(out, None, chunks.T.ravel().tolist(), restore)
        back = AllToAll.apply(out, input_splits, output_splits)
        del out
        return Unpermute.apply(back, row_id_map, E)

    def forward_one_rank(self, x):       # x: [T, h] bf16, the pre-MLP norm's output
        ns = self.ns
        logits = ns["router_gating_linear"](x, self.router_weight, self.router_bias, x.dtype)
        probs, routing_map = ns["topk_routing_with_score_function"](
            logits, self.k, use_pre_softmax=False, score_function="softmax", fused=False)
        self.held = {"probs": probs, "routing_map": routing_map}
        # preprocess with ep = tp = 1: num_global_tokens_per_local_expert is the [E] int64 counts (a view),
        # held by the dispatcher when num_local_experts > 1
        num_local_tokens_per_expert = routing_map.sum(dim=0).long()
        tokens_per_expert = num_local_tokens_per_expert.tolist()
        self.received = x.shape[0] * self.k
        num_out = x.shape[0] * self.k
        permuted, pprobs, row_id_map = PermuteWithProbs.apply(x, probs, routing_map, num_out)
        held_other = {"row_id_map": row_id_map}
        if self.E > 1:
            held_other["num_global_tokens_per_local_expert"] = num_local_tokens_per_expert.view(-1, self.E)
        del num_local_tokens_per_expert
        self.held_other = held_other
        if self.E > 1:      # num_local_experts > 1: sort_chunks_by_idxs (fused)
            permuted, pprobs = SortChunks.apply(permuted, pprobs)
        pprobs = pprobs.unsqueeze(-1)
        fc1 = GroupedLinear.apply(permuted, tokens_per_expert, True, *self.fc1_w, *self.fc1_b)
        act = ns["weighted_bias_quick_geglu_impl"](fc1, None, pprobs, False, 1.0, 7.0)
        fc2 = GroupedLinear.apply(act, tokens_per_expert, False, *self.fc2_w)
        out = ns["TEGroupedMLP"]._apply_bias(fc2, list(self.fc2_b), tokens_per_expert, pprobs)
        if self.E > 1:
            out, _ = SortChunks.apply(out, None)
        return Unpermute.apply(out, row_id_map, self.E)


def derived(T, h, f, E, k, ep=1, received=None) -> dict:
    """What the model (``families.megatron_clamped_glu_moe``, ``gpt_oss.adjust_terms``) says, bf16 router:
    the bytes the block keeps from its forward to its backward, and the dispatcher's held tensors (alive in
    every phase: each forward replaces the previous iteration's). Under expert parallelism (``ep`` > 1) the
    per-copy tensors are per routed copy the rank receives (``received``; T x k when balanced), the rest per
    token of the rank; the chunk sorts run when the rank holds more than one expert. The permute's row_id_map,
    also held by the dispatcher (``reversed_local_input_permutation_mapping``) after the backward, and the
    per-layer int64 token counts (8E B with more than one local expert) are ``held_other``."""
    R = T * k if received is None else received
    local = E // ep
    router = T * (8 * k + 4 * k)                        # top-k indices (int64), fp32 softmax of the k values
    permute = T * 4 * (2 * E + 1) + R * 2               # row_id_map (int32), permuted probs (bf16)
    sort = R * 4 * 2 if local > 1 else 0                # the two chunk sorts' int32 row_id_maps
    experts = R * (2 * h + 4 * f + 4 * f + 2 * f)       # fc1 input, fc1 output (the clamps'), the cat, fc2 input
    offset = 2                                          # the linear_offset scalar tensor (bf16; not modelled)
    held = T * (2 * E + 1 * E)                          # dispatcher: dense bf16 probs, bool routing map
    out = {"saved": router + permute + sort + experts + offset, "held": held,
           "parts": {"router": router, "permute": permute, "chunk sorts": sort, "experts": experts,
                     "offset scalar": offset}}
    out["held_other"] = {"row_id_map": T * 4 * (2 * E + 1),
                         "num_global_tokens_per_local_expert": 8 * E if local > 1 else 0}
    return out


def _storage_bytes(tensors) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors)


def measure(ns, T, h, f, E, k, ep=1) -> dict:
    """One iteration after two warm-up ones, in the steady state: the dispatcher holds the previous
    iteration's probabilities and routing map when the forward starts. The block's input is not a leaf (a
    layer's input never is: a leaf's AccumulateGrad node would keep it alive through the held probabilities'
    graph), and every tensor alive at the start is shown to the tracker before its start snapshot (it counts a
    storage when an op under it returns a tensor on that storage: ``detach`` shows it one)."""
    torch.manual_seed(0)
    block = MegatronGptOssMoE(ns, h, f, E, k, ep)
    x0 = (torch.randn(T, h) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T, h).to(torch.bfloat16)
    for _ in range(2):      # warm-up (and the state a previous iteration leaves)
        block(x0.clone()).backward(grad)
        x0.grad = None
    held = _storage_bytes(block.held.values())                       # the previous iteration's
    held_other = {n: _storage_bytes([t]) for n, t in block.held_other.items()}
    mt = MemTracker()
    mt.track_external(block)
    dev = torch.device("cpu")
    with mt:
        for t in (*block.held.values(), *block.held_other.values(), grad):
            t.detach()      # (a view's storage is the tensor's: counted from now on)
        x = x0.clone()
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        out = block(x)
        del x
        after_forward = mt.get_tracker_snapshot("current")[dev]["Total"]
        forward_peak = mt.get_tracker_snapshot("peak")[dev]["Total"]
        out_bytes = out.numel() * out.element_size()
        saved = after_forward - start - out_bytes
        out.backward(grad)
        del out
        end = mt.get_tracker_snapshot("current")[dev]["Total"]
        peak = mt.get_tracker_snapshot("peak")[dev]["Total"]
    out = {"saved": saved, "held": held, "forward_peak_over_start": forward_peak - start,
           "peak_over_start": peak - start,
           "after_backward_over_start": end - start}
    # the rows this rank received (its experts' routed copies); the held row_id_map and token counts of the
    # previous iteration are freed when this forward replaces them, so "saved" (the growth over the start)
    # is the block's saved bytes less the row_id_map
    out["received"] = block.received
    out["held_other"] = held_other
    return out


NS: dict = {}


def _measure_run(cfg: dict) -> dict:
    args = (cfg["tokens"], cfg["hidden"], cfg["moe_ffn_hidden_size"], cfg["experts"], cfg["top_k"])
    ep = cfg.get("ep", 1)
    m = measure(NS["megatron"], *args, ep=ep)
    d = derived(*args, ep=ep, received=m["received"])
    # the growth over the start does not show the row_id_map that replaced the previous iteration's: add it back
    m["saved_with_row_id_map"] = m["saved"] + m["held_other"]["row_id_map"]
    return {**m, "derived": d,
            "saved_error": (d["saved"] - m["saved_with_row_id_map"]) / m["saved_with_row_id_map"]}


def _summary(m: dict) -> str:
    saved = m.get("saved_with_row_id_map", m["saved"])
    return (f"{m['received']:,} rows received; saved {saved:,} B measured, {m['derived']['saved']:,} B derived ({100 * m['saved_error']:+.4f} %); "
            f"held {m['held']:,} B measured, {m['derived']['held']:,} B derived; after the backward "
            f"{m['after_backward_over_start']:,} B over the start")


def record(script: str, runs, **fields) -> dict:
    """The JSON record of one of this directory's scripts: its command, the Megatron-LM commit, the environment
    and the tracker, then ``fields`` and the runs (every measure_*.py here writes this header)."""
    return {"command": f"python validation/megatron_gpt_oss/{script} --megatron-lm <Megatron-LM at {COMMIT}>",
            "megatron_lm_commit": COMMIT, "python": platform.python_version(), **harness.versions(),
            "tracker": "torch.distributed._tools.mem_tracker.MemTracker (eager, CPU)", **fields, "runs": runs}


def megatron_lm_argument(ap) -> None:
    """Every script's one argument: where Megatron-LM's source is."""
    ap.add_argument("--megatron-lm", required=True, help=f"a Megatron-LM checkout or mirror holding {COMMIT}")


def _document(args, runs, ctx) -> dict:
    return record("measure_moe.py", runs)


def main(argv=None):
    arguments = megatron_lm_argument

    def before(args):
        NS["megatron"] = megatron_namespace(args.megatron_lm)

    configs = [{"id": cid, "tokens": T, "hidden": h, "moe_ffn_hidden_size": f, "experts": E, "top_k": k}
               for cid, T, h, f, E, k, _ in CONFIGS]
    configs += [{"id": cid, "tokens": T, "hidden": h, "moe_ffn_hidden_size": f, "experts": E, "top_k": k, "ep": ep}
                for cid, T, h, f, E, k, ep in EP_CONFIGS]
    return harness.main(argv, description=__doc__.splitlines()[0], configs=configs, measure_run=_measure_run,
                        document=_document, out=os.path.join(HERE, "moe_measurements.json"), summary=_summary,
                        threads=1, versions=harness.versions, catch=False, arguments=arguments, before=before)


if __name__ == "__main__":
    sys.exit(main())
