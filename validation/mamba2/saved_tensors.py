#!/usr/bin/env python
"""List, op by op, the storages one Bamba decoder layer leaves alive after its forward.

    /tmp/m2venv/bin/python validation/mamba2/saved_tensors.py ID [LAYER] [--all]

``ID`` is a configuration of ``measure_mamba2.py`` (its model, regime, micro-batch, sequence and
attention); ``LAYER`` the decoder layer (default 1, a Mamba-2 mixer layer; 2 is the attention layer).
One forward (with labels) is run under a ``TorchDispatchMode`` that records every storage the layer's
ops create (in creation order; a view of an existing storage is not a new storage). After the forward
the layer's autograd graph is walked from its output back to its input, and every tensor a node saved
for backward (``grad_fn._saved_*``) is mapped to its storage. Printed: the created storages that are
saved (``*``, with the nodes that save them) or are the layer's output; with ``--all`` also the
temporaries. The sum is what ``layer_forward_retained_bytes`` of ``measurements.json`` records for that
layer (MemTracker: storage bytes of what the layer's forward left alive), and the script says whether
the two agree. This is the derivation aid behind ``layer_bytes.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from measure_mamba2 import CONFIGS  # noqa: E402


def _storages(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


class Created(TorchDispatchMode):
    """Records the storages created while ``on`` (keeps them alive so that addresses stay unique)."""

    def __init__(self):
        super().__init__()
        self.on = False
        self.created: dict[int, tuple] = {}
        self._keep = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.on:
            inputs = {t.untyped_storage().data_ptr() for t in _storages((args, kwargs))}
            for t in _storages(out):
                st = t.untyped_storage()
                ptr = st.data_ptr()
                if ptr in inputs or ptr in self.created:      # a view (or in-place result): nothing new
                    continue
                self._keep.append(st)
                self.created[ptr] = (len(self.created), str(func).replace("aten.", ""), tuple(t.shape),
                                     str(t.dtype).replace("torch.", ""), st.nbytes())
        return out


def saved_storages(y: torch.Tensor, x: torch.Tensor) -> dict[int, list[str]]:
    """storage address -> the graph nodes (``Node._saved_*``) that keep it, between x and y."""
    seen, stack, saved = set(), [y.grad_fn], {}
    while stack:
        node = stack.pop()
        if node is None or node in seen or node is x.grad_fn:
            continue
        seen.add(node)
        stack.extend(nx for nx, _ in node.next_functions)
        for attr in dir(node):
            if not attr.startswith("_saved_"):
                continue
            for t in _storages(getattr(node, attr)):
                saved.setdefault(t.untyped_storage().data_ptr(), []).append(f"{node.name()}.{attr[7:]}")
    return saved


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("id")
    ap.add_argument("layer", nargs="?", type=int, default=1)
    ap.add_argument("--all", action="store_true", help="also list the temporaries")
    ap.add_argument("--measurements", default=os.path.join(HERE, "measurements.json"))
    args = ap.parse_args(argv)
    cfg = {c["id"]: c for c in CONFIGS}[args.id]
    torch.manual_seed(0)
    hf = dict(cfg["hf_config"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(hf.pop("model_type"), **hf), attn_implementation=cfg["attention"],
            dtype=torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32)
    model.train()
    layer = model.model.layers[args.layer]
    rec, io = Created(), {}

    def pre(mod, a, kw):
        rec.on = True

    def post(mod, a, kw, out):
        rec.on = False
        io["x"] = a[0] if a else kw["hidden_states"]
        io["y"] = out[0] if isinstance(out, tuple) else out

    layer.register_forward_pre_hook(pre, with_kwargs=True)
    layer.register_forward_hook(post, with_kwargs=True)
    ids = torch.randint(0, hf["vocab_size"], (cfg["batch_size"], cfg["seq_len"]))
    with rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    saved = saved_storages(io["y"], io["x"])
    out_ptr = io["y"].untyped_storage().data_ptr()
    total = 0
    print(f"{cfg['id']} layer {args.layer} ({layer.block_type})")
    for ptr, (i, op, shape, dtype, nbytes) in sorted(rec.created.items(), key=lambda kv: kv[1][0]):
        kept = ptr in saved or ptr == out_ptr
        total += nbytes if kept else 0
        if kept or args.all:
            who = "OUTPUT " * (ptr == out_ptr) + ",".join(sorted(set(saved.get(ptr, []))))
            print(f"{'*' if kept else ' '}{i:4d} {op:34.34s} {str(shape):24s} {dtype:8s} {nbytes:10,d}  {who}")
    print(f"saved + output: {total:,d} B")
    if os.path.exists(args.measurements):
        runs = {r["id"]: r for r in json.load(open(args.measurements))["runs"]}
        if args.id in runs and "measured" in runs[args.id]:
            got = runs[args.id]["measured"]["layer_forward_retained_bytes"][args.layer]
            print(f"measured layer_forward_retained_bytes[{args.layer}]: {got:,d} B "
                  f"({'equal' if got == total else f'differs by {got - total:+,d}'})")
    del loss
    return 0


if __name__ == "__main__":
    sys.exit(main())
