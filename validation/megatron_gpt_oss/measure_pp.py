#!/usr/bin/env python
"""One pipeline stage of Megatron-Core's gpt-oss MoE decoder under the 1F1B schedule, measured on the CPU with
PyTorch's ``MemTracker`` (eager): the activations the stage holds at its peak, per phase, and what outlives the
iteration (issue 25 item 4: gpt-oss under Megatron-Core with pipeline parallelism).

    python validation/megatron_gpt_oss/measure_pp.py --megatron-lm DIR [--out FILE]

``DIR`` is a Megatron-LM checkout or bare mirror at ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (as
measure_moe.py; its MoE layer, dispatcher and stand-ins are reused as they are).

The stage: ``layers`` decoder layers, each ``x + MoE(x)`` with measure_moe.py's ``MegatronGptOssMoE`` (router,
alltoall dispatcher on one rank or rank 0 of an expert-parallel group, TEGroupedMLP, combine). The attention
(Transformer Engine's fused attention: GPU only, derived, not measured) and the layer norms are not run: the
router keeps the layer's input (as the pre-MLP norm's output is kept in the model), the residual add saves
nothing. The first stage's input stands for the embedding's output (a fresh non-leaf tensor of the residual
stream's shape); a later stage's input is what ``P2PCommunicator._communicate`` allocates for a receive
(``torch.empty(..., requires_grad=True)``, megatron/core/pipeline_parallel/p2p_communication.py). The last
stage's loss is ``output.sum()`` (the LM head and loss are the profile's generic last-stage terms, not measured
here); an earlier stage's backward starts from a received gradient of its output's shape.

The schedule is ``forward_backward_pipelining_without_interleaving`` of Megatron-LM at COMMIT
(megatron/core/pipeline_parallel/schedules.py): ``min(p - stage - 1, m)`` warm-up forwards, then one forward and
one backward per remaining micro-batch, then the cool-down backwards; every forward's input and output are kept
in ``input_tensors`` / ``output_tensors`` until its backward, the output pseudo-freed by
``deallocate_output_tensor`` (``deallocate_pipeline_outputs=True``, Megatron-Bridge's default) and the backward
run by ``custom_backward``: both taken from that source and executed as written. Every micro-batch routes the
same tokens (so each holds the same bytes and the ratio of the peak to one micro-batch is the number in flight).

Recorded per configuration: ``one_microbatch`` (the growth over the start after the stage's first forward),
``forward_peak`` (the most the stage holds after a forward step: its peak of saved activations),
``before_backward_peak`` (the most held when a backward step starts), ``after_iteration`` (the growth over the
start after the last backward: the dispatcher's held tensors of this iteration replace the previous one's),
``held`` (the dispatcher's held [T, E] probabilities and routing maps, every layer), ``held_other`` (its held
permutation maps and token counts after the iteration, every layer), ``held_input`` / ``held_input_after`` (a
later stage's last receive buffer, alive before / after the iteration: a leaf whose ``AccumulateGrad`` node the
held probabilities' graph reaches, so it lives until every layer's next forward replaces them), ``received`` (rows a layer's
experts receive per micro-batch). The growth over the start misses each layer's held permutation map that the
first forward replaced (``held_row_id_map``), as in measure_moe.py.
"""

from __future__ import annotations

import gc
import weakref
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch.autograd import Variable  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402

import harness  # noqa: E402  (validation/harness.py)
import measure_moe  # noqa: E402
from measure_moe import MegatronGptOssMoE, _defs, _read, _storage_bytes, megatron_namespace  # noqa: E402

# (id, pipeline stages p, stage, micro-batches m, layers on the stage, ep); tokens 64 a micro-batch, h 64, f 48,
# 8 experts, top-2 (the tiny gpt-oss of tests/measured/test_megatron_gpt_oss.py)
T, H, F_, E, K = 64, 64, 48, 8, 2
CONFIGS = (
    ("pp2-stage0-m4-l2", 2, 0, 4, 2, 1),
    ("pp2-stage1-m4-l2", 2, 1, 4, 2, 1),
    ("pp4-stage0-m4-l1", 4, 0, 4, 1, 1),
    ("pp4-stage1-m4-l1", 4, 1, 4, 1, 1),
    ("pp4-stage3-m4-l1", 4, 3, 4, 1, 1),
    ("pp4-stage0-m2-l1", 4, 0, 2, 1, 1),       # fewer micro-batches than stages: min(p - stage, m) = 2
    ("ep2-pp2-stage0-m4-l2", 2, 0, 4, 2, 2),
    ("ep2-pp3-stage1-m4-l2", 3, 1, 4, 2, 2),
    ("ep2-pp2-stage1-m4-l2", 2, 1, 4, 2, 2),
)
NS: dict = {}


def schedule_namespace(repo: str) -> dict:
    """``deallocate_output_tensor`` and ``custom_backward`` of schedules.py at COMMIT, as written."""
    ns = {"torch": torch, "Variable": Variable}
    exec(_defs(_read(repo, "megatron/core/pipeline_parallel/schedules.py"),
               ("deallocate_output_tensor", "custom_backward")), ns)
    return ns


class _NoModules:
    """Stands for the tracker's ``ModTracker`` (as validation/lora_parallel/measure_lora_pp.py's): a stage runs
    its modules once per micro-batch, which the tracker's per-module bookkeeping refuses ("multiple iterative
    calls"); the bytes are the stock tracker's (every live tracked storage after every op)."""

    is_bw = False
    parents = {"Global"}

    def register_user_hooks(self, *hooks):
        pass

    def clear_user_hooks(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *args):
        pass


class Stage(torch.nn.Module):
    def __init__(self, ns, layers, ep):
        super().__init__()
        self.layers = torch.nn.ModuleList(MegatronGptOssMoE(ns, H, F_, E, K, ep) for _ in range(layers))
        self.last_input = lambda: None

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(x)
        return x


def run_iteration(stage, sched, p, i, m, x0, grad, mt=None, start=None):
    """One iteration of forward_backward_pipelining_without_interleaving on stage ``i`` of ``p``; with a tracker,
    the growth over ``start`` after every forward and before every backward step."""
    first, last = i == 0, i == p - 1
    dev = torch.device("cpu")
    now = (lambda: mt.get_tracker_snapshot("current")[dev]["Total"] - start) if mt is not None else (lambda: 0)
    after_forward, before_backward = [], []

    def forward():
        if first:
            inp = None
            x = x0.clone()                      # the embedding's output (a non-leaf)
        else:
            inp = torch.empty(T, H, dtype=torch.bfloat16, requires_grad=True)   # the receive buffer
            with torch.no_grad():
                inp.copy_(x0)
            x = inp
            stage.last_input = weakref.ref(inp)     # (does not keep it alive)
        out = stage(x)
        del x
        if last:
            out = out.sum()                     # the loss (stand-in)
        return inp, out

    def backward(inp, out):
        before_backward.append(now())
        sched["custom_backward"](out, None if last else grad.clone())    # (a received gradient)
        if inp is not None:
            inp.grad = None                     # sent back, then dropped

    warmup = min(p - i - 1, m)
    inputs, outputs = [], []
    for _ in range(warmup):
        inp, out = forward()
        inputs.append(inp)
        outputs.append(out)
        sched["deallocate_output_tensor"](out, True)
        del inp, out
        after_forward.append(now())
    for _ in range(m - warmup):
        inp, out = forward()
        inputs.append(inp)
        outputs.append(out)
        sched["deallocate_output_tensor"](out, True)
        del inp, out
        after_forward.append(now())
        backward(inputs.pop(0), outputs.pop(0))
    for _ in range(warmup):
        backward(inputs.pop(0), outputs.pop(0))
    return after_forward, before_backward


def measure(cfg: dict) -> dict:
    p, i, m, layers, ep = (cfg[n] for n in ("pp", "stage", "microbatches", "layers", "ep"))
    torch.manual_seed(0)
    stage = Stage(NS["megatron"], layers, ep)
    x0 = (torch.randn(T, H) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T, H).to(torch.bfloat16)
    for _ in range(2):      # warm-up iterations: the held tensors of a previous one, and the gradients, which
        run_iteration(stage, NS["schedule"], p, i, m, x0, grad)     # later backwards accumulate in place (they
    gc.collect()                                                     # stand for the preallocated main-grad buffer)
    held_row_id_map = sum(_storage_bytes([layer.held_other["row_id_map"]]) for layer in stage.layers)
    # a later stage: the previous iteration's last receive buffer, a leaf whose AccumulateGrad node the held
    # probabilities' graph still reaches (alive until every layer's next forward replaces them)
    previous = stage.last_input()
    held_input = 0 if previous is None else _storage_bytes([previous])
    mt = MemTracker()
    mt._mod_tracker = _NoModules()
    mt.track_external(stage)
    dev = torch.device("cpu")
    with mt:
        for layer in stage.layers:
            for t in (*layer.held.values(), *layer.held_other.values()):
                t.detach()
        for t in (x0, grad, x0.grad, previous, *stage.parameters(), *(q.grad for q in stage.parameters())):
            if t is None:
                continue
            t.detach()
        del previous
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        after_forward, before_backward = run_iteration(stage, NS["schedule"], p, i, m, x0, grad, mt, start)
        gc.collect()
        end = mt.get_tracker_snapshot("current")[dev]["Total"] - start
    last = stage.last_input()
    return {"one_microbatch": after_forward[0], "forward_peak": max(after_forward),
            "before_backward_peak": max(before_backward), "after_forward": after_forward,
            "before_backward": before_backward, "after_iteration": end,
            "held": sum(_storage_bytes(layer.held.values()) for layer in stage.layers),
            "held_other": {n: sum(_storage_bytes([layer.held_other[n]]) for layer in stage.layers)
                           for n in stage.layers[0].held_other},
            "held_row_id_map": held_row_id_map, "held_input": held_input,
            "held_input_after": 0 if last is None else _storage_bytes([last]),
            "received": [layer.received for layer in stage.layers]}


def _summary(m: dict) -> str:
    return (f"one micro-batch {m['one_microbatch']:,} B, forward peak {m['forward_peak']:,} B, before a backward "
            f"{m['before_backward_peak']:,} B, after the iteration {m['after_iteration']:,} B; held {m['held']:,} B")


def _document(args, runs, ctx) -> dict:
    return measure_moe.record("measure_pp.py", runs, shape={"tokens": T, "hidden": H, "moe_ffn_hidden_size": F_, "experts": E, "top_k": K})


def main(argv=None):
    arguments = measure_moe.megatron_lm_argument

    def before(args):
        NS["megatron"] = megatron_namespace(args.megatron_lm)
        NS["schedule"] = schedule_namespace(args.megatron_lm)
        measure_moe.NS["megatron"] = NS["megatron"]

    configs = [{"id": cid, "pp": p, "stage": i, "microbatches": m, "layers": n, "ep": ep}
               for cid, p, i, m, n, ep in CONFIGS]
    return harness.main(argv, description=__doc__.splitlines()[0], configs=configs, measure_run=measure,
                        document=_document, out=os.path.join(HERE, "pp_measurements.json"), summary=_summary,
                        threads=1, versions=harness.versions, catch=False, arguments=arguments, before=before)


if __name__ == "__main__":
    sys.exit(main())
