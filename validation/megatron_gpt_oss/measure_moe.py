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
    ("t128-h64-f48-e8-k4", 128, 64, 48, 8, 4),
    ("t96-h32-f40-e4-k2", 96, 32, 40, 4, 2),
    ("t64-h48-f32-e4-k4", 64, 48, 32, 4, 4),
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

    def __init__(self, ns, hidden, ffn, experts, top_k):
        super().__init__()
        self.ns, self.E, self.k = ns, experts, top_k
        p = lambda *s: torch.nn.Parameter(torch.randn(*s, dtype=torch.bfloat16) * 0.05)  # noqa: E731
        self.router_weight, self.router_bias = p(experts, hidden), p(experts)
        self.fc1_w = torch.nn.ParameterList([p(2 * ffn, hidden) for _ in range(experts)])
        self.fc1_b = torch.nn.ParameterList([p(2 * ffn) for _ in range(experts)])
        self.fc2_w = torch.nn.ParameterList([p(hidden, ffn) for _ in range(experts)])
        self.fc2_b = torch.nn.ParameterList([p(hidden) for _ in range(experts)])
        self.held = {}          # the dispatcher's self.probs, self.routing_map

    def forward(self, x):       # x: [T, h] bf16, the pre-MLP norm's output
        ns = self.ns
        logits = ns["router_gating_linear"](x, self.router_weight, self.router_bias, x.dtype)
        probs, routing_map = ns["topk_routing_with_score_function"](
            logits, self.k, use_pre_softmax=False, score_function="softmax", fused=False)
        self.held = {"probs": probs, "routing_map": routing_map}
        tokens_per_expert = routing_map.sum(dim=0).tolist()
        num_out = x.shape[0] * self.k
        permuted, pprobs, row_id_map = PermuteWithProbs.apply(x, probs, routing_map, num_out)
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


def derived(T, h, f, E, k) -> dict:
    """What the model (``families.megatron_clamped_glu_moe``, ``gpt_oss.adjust_terms``) says, bf16 router:
    the bytes the block keeps from its forward to its backward, and the dispatcher's held tensors (alive in
    every phase: each forward replaces the previous iteration's)."""
    router = T * (8 * k + 4 * k)                        # top-k indices (int64), fp32 softmax of the k values
    permute = T * 4 * (2 * E + 1) + T * k * 2           # row_id_map (int32), permuted probs (bf16)
    sort = T * k * 4 * 2 if E > 1 else 0                # the two chunk sorts' int32 row_id_maps
    experts = T * k * (2 * h + 4 * f + 4 * f + 2 * f)   # fc1 input, fc1 output (the clamps'), the cat, fc2 input
    offset = 2                                          # the linear_offset scalar tensor (bf16; not modelled)
    held = T * (2 * E + 1 * E)                          # dispatcher: dense bf16 probs, bool routing map
    return {"saved": router + permute + sort + experts + offset, "held": held,
            "parts": {"router": router, "permute": permute, "chunk sorts": sort, "experts": experts,
                      "offset scalar": offset}}


def measure(ns, T, h, f, E, k) -> dict:
    """One iteration after two warm-up ones, in the steady state: the dispatcher holds the previous
    iteration's probabilities and routing map when the forward starts. The block's input is not a leaf (a
    layer's input never is: a leaf's AccumulateGrad node would keep it alive through the held probabilities'
    graph), and every tensor alive at the start is shown to the tracker before its start snapshot (it counts a
    storage when an op under it returns a tensor on that storage: ``detach`` shows it one)."""
    torch.manual_seed(0)
    block = MegatronGptOssMoE(ns, h, f, E, k)
    x0 = (torch.randn(T, h) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T, h).to(torch.bfloat16)
    for _ in range(2):      # warm-up (and the state a previous iteration leaves)
        block(x0.clone()).backward(grad)
        x0.grad = None
    held = sum(t.untyped_storage().nbytes() for t in block.held.values())   # the previous iteration's
    mt = MemTracker()
    mt.track_external(block)
    dev = torch.device("cpu")
    with mt:
        for t in (*block.held.values(), grad):
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
    return {"saved": saved, "held": held, "forward_peak_over_start": forward_peak - start,
            "peak_over_start": peak - start,
            "after_backward_over_start": end - start}


NS: dict = {}


def _measure_run(cfg: dict) -> dict:
    args = (cfg["tokens"], cfg["hidden"], cfg["moe_ffn_hidden_size"], cfg["experts"], cfg["top_k"])
    m = measure(NS["megatron"], *args)
    d = derived(*args)
    return {**m, "derived": d, "saved_error": (d["saved"] - m["saved"]) / m["saved"]}


def _summary(m: dict) -> str:
    return (f"saved {m['saved']:,} B measured, {m['derived']['saved']:,} B derived ({100 * m['saved_error']:+.4f} %); "
            f"held {m['held']:,} B measured, {m['derived']['held']:,} B derived; after the backward "
            f"{m['after_backward_over_start']:,} B over the start")


def _document(args, runs, ctx) -> dict:
    return {"command": "python validation/megatron_gpt_oss/measure_moe.py --megatron-lm <Megatron-LM at "
                       f"{COMMIT}>", "megatron_lm_commit": COMMIT, "python": platform.python_version(),
            **harness.versions(), "tracker": "torch.distributed._tools.mem_tracker.MemTracker (eager, CPU)",
            "runs": runs}


def main(argv=None):
    def arguments(ap):
        ap.add_argument("--megatron-lm", required=True, help=f"a Megatron-LM checkout or mirror holding {COMMIT}")

    def before(args):
        NS["megatron"] = megatron_namespace(args.megatron_lm)

    configs = [{"id": cid, "tokens": T, "hidden": h, "moe_ffn_hidden_size": f, "experts": E, "top_k": k}
               for cid, T, h, f, E, k in CONFIGS]
    return harness.main(argv, description=__doc__.splitlines()[0], configs=configs, measure_run=_measure_run,
                        document=_document, out=os.path.join(HERE, "moe_measurements.json"), summary=_summary,
                        threads=1, versions=harness.versions, catch=False, arguments=arguments, before=before)


if __name__ == "__main__":
    sys.exit(main())
