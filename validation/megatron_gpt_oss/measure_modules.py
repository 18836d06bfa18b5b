#!/usr/bin/env python
"""Megatron-Core's selective recompute of modules (``recompute_granularity="selective"``, ``recompute_modules``
``moe_act`` and ``layernorm``, as Megatron-Bridge's GPT-OSS 120B H100 perf recipe sets them) in gpt-oss's pre-MLP
norm and MoE block, measured on the CPU with PyTorch's ``MemTracker`` (eager): the bytes kept for the backward.

    python validation/megatron_gpt_oss/measure_modules.py --megatron-lm DIR [--out FILE]

``DIR`` is a Megatron-LM checkout or bare mirror at ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (as measure_moe.py,
whose MoE block and stand-ins are reused as they are). The recipe: Megatron-Bridge 067f987df03b8355b03192d88d70f1709fedf51a
``src/megatron/bridge/perf_recipes/gpt_oss/h100/gpt_oss.py``, ``gpt_oss_120b_pretrain_64gpu_h100_bf16_config``:
``recompute_modules = ["layernorm", "moe_act"]``, ``recompute_granularity = "selective"`` (tp 1, pp 4, ep 8).

Run from Megatron-Core's source at that commit, exactly as written: ``CheckpointWithoutOutput`` and
``CheckpointWithoutOutputFunction`` (``megatron/core/tensor_parallel/random.py``: the function runs under
``no_grad``, its tensor arguments are saved, ``discard_output_and_register_recompute`` resizes the output's
storage to 0 and recomputes it from a gradient hook), ``_save_args_to_ctx``, ``_load_args_from_ctx``,
``_fork_rng``. Stubbed: the rng states (host ByteTensors on a GPU), Transformer Engine's
``FP8GlobalStateManager`` / ``activation_recompute_forward`` / ``fp8_autocast`` (``CheckpointWithoutOutput()``
takes that path with ``fp8=False``: off in bf16, no bytes), and ``_get_share_storage`` (a C++ extension that points
the discarded output's storage at the recomputed one, zero-copy), here a resize, a copy and the recomputed storage
released: the same bytes (``_share_storage``).

Where Megatron-Core applies them (``experts.py``, ``TEGroupedMLP.forward``; ``transformer_layer.py``):

* ``moe_act``: the bias-activation function (``weighted_bias_quick_geglu_impl``, clamped quick-GEGLU with offset)
  through ``CheckpointWithoutOutput.checkpoint(bias_act_func, fc1_output, bias_parallel, permuted_probs)``, fc2,
  then ``discard_output_and_register_recompute(fc2's output)`` before ``_apply_bias``;
* ``layernorm``: the pre-MLP norm (a ``TENorm``; the input norm is fused into ``linear_qkv`` with TE, an
  ``IdentityOp``, so not recomputed) through ``CheckpointWithoutOutput``, its output discarded after the MLP
  (``discard_output_and_register_recompute(mlp_output_with_bias[0])``). The norm is a stand-in for TE's RMSNorm:
  an autograd function saving its input, weight and fp32 rsigma (TE ``module/_common.py`` / ``ops/basic/rmsnorm.py``
  at d0067d0d save ``x``, ``w``, ``rstdevs``).

Recorded per configuration: ``saved`` (the growth over the start after the forward, less the output; as
measure_moe.py, the held row_id_map that the forward replaced is added back in ``saved_with_row_id_map``),
``after_backward_over_start``, ``received`` rows and ``rebuilt`` (what each recompute, ``_recompute`` run from its
gradient hook in the backward, adds: the module's output refilled and what its function saves under
``enable_grad``; in backward order: ``layernorm``, whose hook is on the MLP's output, then ``moe_act``, on fc2's:
both rebuilt tensors are alive together until the router's backward).
"""

from __future__ import annotations

import contextlib
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

import harness  # noqa: E402  (validation/harness.py)
import measure_moe  # noqa: E402
from measure_moe import MegatronGptOssMoE, _defs, _read, _storage_bytes, megatron_namespace  # noqa: E402
from measure_recompute import _exec  # noqa: E402

# (id, tokens, hidden, moe_ffn_hidden_size, experts, top_k, ep, recompute_modules)
SHAPES = (("t128-h64-f48-e8-k4", 128, 64, 48, 8, 4, 1), ("ep2-t128-h64-f48-e8-k4", 128, 64, 48, 8, 4, 2))
MODULES = ((), ("moe_act",), ("layernorm",), ("layernorm", "moe_act"))
CONFIGS = tuple((f"{sid}-{'+'.join(mods) or 'none'}", T, h, f, E, k, ep, mods)
                for sid, T, h, f, E, k, ep in SHAPES for mods in MODULES)
NS: dict = {}


def _share_storage(output, recomputed):
    """Stands for random.py's share_storage extension (zero-copy: the discarded output's StorageImpl takes the
    recomputed data): the output's storage refilled by a copy, the recomputed storage then released, so that one
    buffer holds the output, as with the extension (the recomputed tensor's data is never read again: it is the
    root of the activation's backward, which reads its saved tensors)."""
    st = output.untyped_storage()
    st.resize_(recomputed.untyped_storage().nbytes())
    st.copy_(recomputed.untyped_storage())
    recomputed.untyped_storage().resize_(0)


def modules_namespace(repo: str) -> dict:
    graphs = types.ModuleType("megatron.core.transformer.cuda_graphs")
    graphs.is_graph_capturing = graphs.is_graph_warmup = lambda: False
    for name in ("megatron", "megatron.core", "megatron.core.transformer"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["megatron.core.transformer.cuda_graphs"] = graphs
    ns = {"torch": torch, "contextlib": contextlib,
          "_get_all_rng_states": lambda: (None, None, None),       # host ByteTensors on a GPU (stubbed)
          "_set_all_rng_states": lambda *states: None,
          "FP8GlobalStateManager": types.SimpleNamespace(is_fp8_enabled=lambda: False, get_fp8_recipe=lambda: None),
          "activation_recompute_forward": lambda **kw: contextlib.nullcontext(),
          "fp8_autocast": lambda **kw: contextlib.nullcontext(),
          "_get_share_storage": lambda: _share_storage}
    _exec(_defs(_read(repo, "megatron/core/tensor_parallel/random.py"),
                ("_fork_rng", "_save_args_to_ctx", "_load_args_from_ctx", "CheckpointWithoutOutputFunction",
                 "CheckpointWithoutOutput")), ns)
    ns["_fork_rng"] = contextlib.contextmanager(ns["_fork_rng"])     # (its decorator, not part of the segment)
    return ns


class RMSNorm(torch.autograd.Function):
    """Transformer Engine's RMSNorm in bf16: saves its input, its weight and the fp32 rsigma."""

    @staticmethod
    def forward(ctx, x, w):
        rsigma = torch.rsqrt(x.float().pow(2).mean(-1) + 1e-5)
        out = (x.float() * rsigma.unsqueeze(-1)).to(x.dtype) * w
        ctx.save_for_backward(x, w, rsigma)
        return out

    @staticmethod
    def backward(ctx, g):
        x, w, rsigma = ctx.saved_tensors
        xn = x.float() * rsigma.unsqueeze(-1)
        gw = (g.float() * xn).sum(0).to(w.dtype)
        gx = g.float() * w.float()
        gx = rsigma.unsqueeze(-1) * (gx - xn * (gx * xn).mean(-1, keepdim=True))
        return gx.to(x.dtype), gw


class Block(torch.nn.Module):
    """The pre-MLP norm and the MoE block of a gpt-oss layer (``TransformerLayer._forward_mlp``), with the
    recompute modules as Megatron-Core applies them."""

    def __init__(self, megatron, ckpt, hidden, ffn, experts, top_k, ep, modules):
        super().__init__()
        self.modules_ = modules
        self.ckpt = ckpt
        ns = dict(megatron)
        if "moe_act" in modules:
            act, grouped = megatron["weighted_bias_quick_geglu_impl"], megatron["TEGroupedMLP"]
            state = {}

            def checkpointed_act(fc1_output, bias_parallel, permuted_probs, fp8_store, offset, clamp):
                def bias_act_func(intermediate_parallel, bias_parallel, permuted_probs):
                    return act(intermediate_parallel, bias_parallel, permuted_probs, fp8_store, offset, clamp)
                state["c"] = ckpt["CheckpointWithoutOutput"]()
                return state["c"].checkpoint(bias_act_func, fc1_output, bias_parallel, permuted_probs)

            def apply_bias(output, *args):      # TEGroupedMLP.forward: discard after fc2, then _apply_bias
                state.pop("c").discard_output_and_register_recompute(output)
                return grouped._apply_bias(output, *args)

            ns["weighted_bias_quick_geglu_impl"] = checkpointed_act
            ns["TEGroupedMLP"] = type("TEGroupedMLP", (), {"_apply_bias": staticmethod(apply_bias)})
        self.moe = MegatronGptOssMoE(ns, hidden, ffn, experts, top_k, ep)
        self.norm_weight = torch.nn.Parameter(torch.ones(hidden, dtype=torch.bfloat16))

    def forward(self, residual):
        if "layernorm" in self.modules_:
            c = self.ckpt["CheckpointWithoutOutput"]()
            y = c.checkpoint(RMSNorm.apply, residual, self.norm_weight)
            out = self.moe(y)
            c.discard_output_and_register_recompute(out)
            return out
        return self.moe(RMSNorm.apply(residual, self.norm_weight))


def _recording(ckpt: dict, now, rebuilt: list) -> dict:
    """``ckpt`` with ``CheckpointWithoutOutput._recompute`` (the gradient hook) recording the bytes it adds."""
    base = ckpt["CheckpointWithoutOutput"]

    class Recording(base):
        def _recompute(self, _):
            before = now()
            super()._recompute(_)
            rebuilt.append(now() - before)

    return {**ckpt, "CheckpointWithoutOutput": Recording}


def measure(cfg: dict) -> dict:
    T, h, f, E, k, ep = (cfg[n] for n in ("tokens", "hidden", "moe_ffn_hidden_size", "experts", "top_k", "ep"))
    torch.manual_seed(0)
    clock = {"now": lambda: 0}
    rebuilt: list = []
    ckpt = _recording(NS["modules"], lambda: clock["now"](), rebuilt)
    block = Block(NS["megatron"], ckpt, h, f, E, k, ep, tuple(cfg["recompute_modules"]))
    x0 = (torch.randn(T, h) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T, h).to(torch.bfloat16)
    for _ in range(2):
        block(x0.clone()).backward(grad)
        x0.grad = None
    moe = block.moe
    held = _storage_bytes(moe.held.values())
    held_other = {n: _storage_bytes([t]) for n, t in moe.held_other.items()}
    mt = MemTracker()
    mt.track_external(block)
    dev = torch.device("cpu")
    with mt:
        for t in (*moe.held.values(), *moe.held_other.values(), grad):
            t.detach()
        x = x0.clone()
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        clock["now"] = lambda: mt.get_tracker_snapshot("current")[dev]["Total"]
        rebuilt.clear()
        out = block(x)
        after_forward = mt.get_tracker_snapshot("current")[dev]["Total"]
        saved = after_forward - start - out.numel() * out.element_size()
        out.backward(grad)
        del out, x
        end = mt.get_tracker_snapshot("current")[dev]["Total"]
    clock["now"] = lambda: 0
    return {"saved": saved, "saved_with_row_id_map": saved + held_other["row_id_map"], "held": held,
            "held_other": held_other, "after_backward_over_start": end - start, "received": moe.received,
            "rebuilt": list(rebuilt)}


def _summary(m: dict) -> str:
    return (f"{m['received']:,} rows received; saved {m['saved_with_row_id_map']:,} B; after the backward "
            f"{m['after_backward_over_start']:,} B over the start")


def _document(args, runs, ctx) -> dict:
    return measure_moe.record("measure_modules.py", runs)


def main(argv=None):
    arguments = measure_moe.megatron_lm_argument

    def before(args):
        NS["megatron"] = megatron_namespace(args.megatron_lm)
        NS["modules"] = modules_namespace(args.megatron_lm)
        measure_moe.NS["megatron"] = NS["megatron"]

    configs = [{"id": cid, "tokens": T, "hidden": h, "moe_ffn_hidden_size": f, "experts": E, "top_k": k, "ep": ep,
                "recompute_modules": list(mods)} for cid, T, h, f, E, k, ep, mods in CONFIGS]
    return harness.main(argv, description=__doc__.splitlines()[0], configs=configs, measure_run=measure,
                        document=_document, out=os.path.join(HERE, "modules_measurements.json"), summary=_summary,
                        threads=1, versions=harness.versions, catch=False, arguments=arguments, before=before)


if __name__ == "__main__":
    sys.exit(main())
