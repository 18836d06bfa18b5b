#!/usr/bin/env python
"""Megatron-Core's full recomputation of gpt-oss's MoE decoder layers (``recompute_granularity="full"``,
``recompute_method="uniform"``, ``recompute_num_layers=1``), measured on the CPU with PyTorch's ``MemTracker``
(eager) on one device and on the stages of a 1F1B pipeline, with and without expert parallelism (issue 25 item 4).

    python validation/megatron_gpt_oss/measure_recompute.py --megatron-lm DIR [--out FILE]

``DIR`` is a Megatron-LM checkout or bare mirror at ``d98e8a64ddf34856e74b24714e3bedb2f5a39553`` (as
measure_moe.py and measure_pp.py, whose MoE layer, dispatcher, stand-ins and 1F1B schedule are reused as they are).

Run from Megatron-Core's source at that commit, exactly as written:

* ``checkpointed_forward`` (``megatron/core/recompute.py``: the uniform method, one layer a chunk, each chunk
  through ``tensor_parallel.checkpoint`` with ``(hidden_states, attention_mask, context, context_mask,
  rotary_pos_emb_local, rotary_pos_emb_global, padding_mask)``);
* ``checkpoint`` and ``CheckpointFunction`` (``megatron/core/tensor_parallel/random.py``): the forward runs the
  layer under ``no_grad`` and ``save_for_backward(*args)`` (the layer's input: the residual stream, and the shared
  rotary table); the backward detaches the saved inputs (``torch.utils.checkpoint.detach_variable``: new leaves on
  the same storage, ``requires_grad`` as the input's), recomputes the layer under ``enable_grad``, runs
  ``torch.autograd.backward(outputs, args)`` and returns the detached inputs' ``.grad``;
* ``_fork_rng``, ``_set_checkpointing`` / ``_unset_checkpointing`` as written; ``_get_all_rng_states`` /
  ``_set_all_rng_states`` are stubbed: the states they copy (``torch.get_rng_state()``,
  ``torch.cuda.get_rng_state()``, the tracker's) are host ByteTensors on a GPU, no device memory; the
  ``cuda_graphs`` checks (``is_graph_capturing``, ``is_graph_warmup``) return False.

The layer is measure_pp.py's: ``x + MoE(x)`` (``TransformerLayer`` stand-in returning ``(hidden_states,
context)``), the attention and norms not run (derived in the profile: with full recompute each is part of the
one recomputed layer). The alltoall dispatcher's held ``probs`` (and routing map, permutation map, token counts)
are replaced by every forward of the layer: by the ``no_grad`` forward with tensors that have no graph, by the
backward's recompute with tensors whose graph reaches the detached input's ``AccumulateGrad`` node, which holds
the detached input (the checkpointed input's storage) and, after the backward, its ``.grad`` (the gradient the
checkpoint returned). So after a layer's backward its input and the input's gradient stay alive until the
layer's next forward (``held_graph``: found by walking each layer's held probabilities' graph to its non-parameter
leaves).

Recorded per configuration (bytes over the start of the measured iteration; the start holds the previous
iteration's held tensors, shown to the tracker): ``after_forward`` / ``before_backward`` (each forward and
backward step of the schedule), ``after_recompute`` (each layer's recompute, under ``enable_grad``, before its
backward: the moment the recomputed layer's saved tensors all exist), ``peak_over_start`` (the tracker's peak:
with the eager activation's temporaries and the backward's transient gradients, recorded, not compared),
``after_iteration``; ``held``, ``held_other`` (as measure_pp.py), ``held_graph`` (the previous iteration's
detached inputs and their gradients the held graphs keep, before the iteration: ``inputs``, ``input_grads``,
and the same after it: ``inputs_after``, ``input_grads_after``), ``received`` (rows a layer's experts receive a
micro-batch).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import types
from typing import List, Optional, Set, Tuple, Union

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker  # noqa: E402
from torch.utils.checkpoint import detach_variable  # noqa: E402

import harness  # noqa: E402  (validation/harness.py)
import measure_moe  # noqa: E402
import measure_pp  # noqa: E402
from measure_moe import MegatronGptOssMoE, _defs, _read, _storage_bytes, megatron_namespace  # noqa: E402
from measure_pp import E, F_, H, K, T, _NoModules, run_iteration, schedule_namespace  # noqa: E402

# (id, pipeline stages p, stage, micro-batches m, layers on the stage, ep); p = 1 is one device (Megatron's
# forward_backward_no_pipelining: a forward and a backward per micro-batch, as 1F1B with one stage)
CONFIGS = (
    ("pp1-m2-l2", 1, 0, 2, 2, 1),
    ("pp1-m1-l3", 1, 0, 1, 3, 1),
    ("pp2-stage0-m4-l2", 2, 0, 4, 2, 1),
    ("pp2-stage1-m4-l2", 2, 1, 4, 2, 1),
    ("pp4-stage0-m4-l1", 4, 0, 4, 1, 1),
    ("pp4-stage1-m4-l2", 4, 1, 4, 2, 1),
    ("pp4-stage3-m4-l1", 4, 3, 4, 1, 1),
    ("ep2-pp1-m2-l2", 1, 0, 2, 2, 2),
    ("ep2-pp2-stage0-m4-l2", 2, 0, 4, 2, 2),
    ("ep2-pp3-stage1-m4-l2", 3, 1, 4, 2, 2),
)
NS: dict = {}


def _exec(src: str, ns: dict) -> None:
    # (the sources' annotations name types this namespace does not import: postponed, as random.py's own
    # ``from __future__ import annotations`` postpones them)
    exec(compile("from __future__ import annotations\n" + src, "<megatron>", "exec"), ns)


def recompute_namespace(repo: str) -> dict:
    """``CheckpointFunction``, ``checkpoint``, ``_fork_rng``, ``_set_checkpointing``, ``_unset_checkpointing``
    (random.py) and ``checkpointed_forward`` (recompute.py) at COMMIT, as written, with the stubs of the module
    docstring."""
    graphs = types.ModuleType("megatron.core.transformer.cuda_graphs")
    graphs.is_graph_capturing = graphs.is_graph_warmup = lambda: False
    for name in ("megatron", "megatron.core", "megatron.core.transformer"):
        sys.modules.setdefault(name, types.ModuleType(name))
    sys.modules["megatron.core.transformer.cuda_graphs"] = graphs
    ns = {"torch": torch, "contextlib": contextlib, "detach_variable": detach_variable, "IS_CHECKPOINTING": False,
          "_get_all_rng_states": lambda: (None, None, None),       # host ByteTensors on a GPU (stubbed)
          "_set_all_rng_states": lambda *states: None}
    _exec(_defs(_read(repo, "megatron/core/tensor_parallel/random.py"),
                ("_fork_rng", "_set_checkpointing", "_unset_checkpointing", "CheckpointFunction", "checkpoint")), ns)
    ns["_fork_rng"] = contextlib.contextmanager(ns["_fork_rng"])     # (its decorator, not part of the segment)
    block = {"torch": torch, "Tensor": torch.Tensor, "Optional": Optional, "Set": Set, "List": List,
             "Tuple": Tuple, "Union": Union, "nullcontext": contextlib.nullcontext,
             "tensor_parallel": types.SimpleNamespace(checkpoint=ns["checkpoint"]), "TransformerLayer": Layer,
             "te_checkpoint": None, "get_fp8_context": None, "get_fp4_context": None}
    _exec(_defs(_read(repo, "megatron/core/recompute.py"), ("checkpointed_forward",)), block)
    ns["checkpointed_forward"] = block["checkpointed_forward"]
    return ns


class Layer(torch.nn.Module):
    """The ``TransformerLayer`` stand-in: ``x + MoE(x)``, returning ``(hidden_states, context)``; records the
    bytes alive after each recompute (a forward under ``enable_grad``, inside ``CheckpointFunction.backward``)."""

    def __init__(self, ns, ep, moments):
        super().__init__()
        self.moe = MegatronGptOssMoE(ns, H, F_, E, K, ep)
        self.moments = moments

    def forward(self, hidden_states, attention_mask=None, context=None, context_mask=None, rotary_pos_emb=None,
                attention_bias=None, inference_context=None, packed_seq_params=None, padding_mask=None):
        out = hidden_states + self.moe(hidden_states)
        if torch.is_grad_enabled():
            self.moments["recompute"].append(self.moments["now"]())
        return out, context


class Stage(torch.nn.Module):
    """A stage's ``TransformerBlock`` under ``recompute_granularity="full"``, ``recompute_method="uniform"``,
    ``recompute_num_layers=1`` (``checkpointed_forward``, as ``TransformerBlock.forward`` calls it)."""

    def __init__(self, ns, layers, ep):
        super().__init__()
        self.moments = {"now": lambda: 0, "recompute": []}
        self.layers = torch.nn.ModuleList(Layer(ns, ep, self.moments) for _ in range(layers))
        self.config = types.SimpleNamespace(recompute_method="uniform", recompute_num_layers=1, fp8=False,
                                            fp4=False, distribute_saved_activations=False)
        self.num_layers_per_pipeline_rank = layers
        self.pg_collection = None
        self.ns = ns
        self.rope = torch.randn(T, 1, 1, 16)        # the shared rotary table (saved by every checkpoint, no grad)
        self.last_input = lambda: None

    def forward(self, x):
        return self.ns["checkpointed_forward"](self, x, None, None, None, self.rope, None, None, False)


def held_graph(stage) -> tuple[list, list]:
    """The non-parameter leaves (and their ``.grad``) reachable from the layers' held probabilities' graphs."""
    params = {id(p) for p in stage.parameters()}
    seen, leaves = set(), {}
    todo = [layer.moe.held["probs"].grad_fn for layer in stage.layers]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        var = getattr(node, "variable", None)
        if var is not None and id(var) not in params:
            leaves[id(var)] = var
        todo.extend(n for n, _ in node.next_functions)
    inputs = list(leaves.values())
    return inputs, [v.grad for v in inputs if v.grad is not None]


def measure(cfg: dict) -> dict:
    p, i, m, layers, ep = (cfg[n] for n in ("pp", "stage", "microbatches", "layers", "ep"))
    torch.manual_seed(0)
    stage = Stage(NS["recompute"], layers, ep)
    x0 = (torch.randn(T, H) * 0.5).to(torch.bfloat16).requires_grad_(True)
    grad = torch.randn(T, H).to(torch.bfloat16)
    for _ in range(2):      # warm-up iterations (as measure_pp.py)
        run_iteration(stage, NS["schedule"], p, i, m, x0, grad)
    gc.collect()
    held_row_id_map = sum(_storage_bytes([layer.moe.held_other["row_id_map"]]) for layer in stage.layers)
    inputs, input_grads = held_graph(stage)
    before = {"inputs": _storage_bytes(inputs), "input_grads": _storage_bytes(input_grads)}
    previous = stage.last_input()
    mt = MemTracker()
    mt._mod_tracker = _NoModules()
    mt.track_external(stage)
    dev = torch.device("cpu")
    with mt:
        for layer in stage.layers:
            for t in (*layer.moe.held.values(), *layer.moe.held_other.values()):
                t.detach()
        for t in (x0, grad, x0.grad, previous, stage.rope, *inputs, *input_grads, *stage.parameters(),
                  *(q.grad for q in stage.parameters())):
            if t is not None:
                t.detach()
        del previous, inputs, input_grads
        start = mt.get_tracker_snapshot("current")[dev]["Total"]
        stage.moments["now"] = lambda: mt.get_tracker_snapshot("current")[dev]["Total"] - start
        stage.moments["recompute"] = []
        after_forward, before_backward = run_iteration(stage, NS["schedule"], p, i, m, x0, grad, mt, start)
        gc.collect()
        end = mt.get_tracker_snapshot("current")[dev]["Total"] - start
        peak = mt.get_tracker_snapshot("peak")[dev]["Total"] - start
    stage.moments["now"] = lambda: 0
    inputs, input_grads = held_graph(stage)
    return {"one_microbatch": after_forward[0], "forward_peak": max(after_forward),
            "before_backward_peak": max(before_backward), "after_forward": after_forward,
            "before_backward": before_backward, "after_recompute": list(stage.moments["recompute"]),
            "recompute_peak": max(stage.moments["recompute"]), "peak_over_start": peak, "after_iteration": end,
            "held": sum(_storage_bytes(layer.moe.held.values()) for layer in stage.layers),
            "held_other": {n: sum(_storage_bytes([layer.moe.held_other[n]]) for layer in stage.layers)
                           for n in stage.layers[0].moe.held_other},
            "held_row_id_map": held_row_id_map,
            "held_graph": {**before, "inputs_after": _storage_bytes(inputs),
                           "input_grads_after": _storage_bytes(input_grads)},
            "received": [layer.moe.received for layer in stage.layers]}


def _summary(m: dict) -> str:
    g = m["held_graph"]
    return (f"one micro-batch {m['one_microbatch']:,} B, forward peak {m['forward_peak']:,} B, before a backward "
            f"{m['before_backward_peak']:,} B, recompute {m['recompute_peak']:,} B, after the iteration "
            f"{m['after_iteration']:,} B; held {m['held']:,} B, graph-held inputs {g['inputs']:,} B + grads "
            f"{g['input_grads']:,} B")


def _document(args, runs, ctx) -> dict:
    return measure_moe.record("measure_recompute.py", runs, recompute={"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1},
                              shape={"tokens": T, "hidden": H, "moe_ffn_hidden_size": F_, "experts": E, "top_k": K})


def main(argv=None):
    arguments = measure_moe.megatron_lm_argument

    def before(args):
        NS["megatron"] = megatron_namespace(args.megatron_lm)
        NS["schedule"] = schedule_namespace(args.megatron_lm)
        NS["recompute"] = {**NS["megatron"], **recompute_namespace(args.megatron_lm)}
        measure_moe.NS["megatron"] = measure_pp.NS["megatron"] = NS["megatron"]

    configs = [{"id": cid, "pp": p, "stage": i, "microbatches": m, "layers": n, "ep": ep}
               for cid, p, i, m, n, ep in CONFIGS]
    return harness.main(argv, description=__doc__.splitlines()[0], configs=configs, measure_run=measure,
                        document=_document, out=os.path.join(HERE, "recompute_measurements.json"), summary=_summary,
                        threads=1, versions=harness.versions, catch=False, arguments=arguments, before=before)


if __name__ == "__main__":
    sys.exit(main())
