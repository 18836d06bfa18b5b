#!/usr/bin/env python
"""The tensors made during the measured (third) iteration that are alive at its backward peak, for one
validation/measure_lora.py --checkpointed configuration (HF + peft, every layer checkpointed): what a moment of
lora.py's checkpointed moments must hold, op by op.

    PYTHONPATH=<peft 0.21.2> python validation/lora_ckpt_trace.py lora-ckpt-hf-llama-wide-bf16-r16-all-b4-s256

Needs torch 2.13.0, transformers 5.23.0, peft 0.21.2 (measure_lora.py's environment; a torchao older than peft wants
is hidden from it). A dispatch mode records each op's output storages (StorageWeakRef) not alive before the iteration
(parameters, buffers, optimizer state); at each backward op it sums the live ones and keeps the largest set. No
MemTracker, so no residue of the previous iteration (validation/lora_ckpt_compare.py), and adapter gradients count.

Found (issue 25 item 4, left): bf16 with peft's fp32 adapters, every linear adapted, llama-wide 4 x 256: the backward's
peak (44,558,344 B made in the iteration) is the bottom layer's recompute at up_proj's adapter (``lora_B(lora_A(x)) *
scaling``): lora_B's fp32 output and its scaled copy (2 x 8,388,608 B) beside gate's output, silu(gate) and up's base
output (3 x 4,194,304 B bf16), the adapters' fp32 input copies (1,048,576 B each), the bottom layer's checkpointed input
and output gradient, and the top layer's adapter gradients; lora._bottom_layer_backward prices the MLP's backward and
the recompute at down_proj instead (4.2 MB short there; now priced: lora._layer_backward's moment at up_proj's
adapter). fp32 q/v: the top layer's MLP backward, as priced. amp-bf16, every linear adapted (45,713,416 B): the
recompute at down_proj's adapter, peft's fp32 copy of the 16-bit product before autocast casts it back (now priced).
"""

from __future__ import annotations

import os
import sys

sys.modules["torchao"] = None        # peft 0.21.2's dispatcher refuses torchao < 0.16 (measure_lora.py's env has none)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import harness  # noqa: E402
import measure_lora  # noqa: E402


class Track(TorchDispatchMode):
    """Every op's output storages not in ``before``; at each backward op the live ones' bytes, the largest set kept."""

    def __init__(self, before: set):
        super().__init__()
        self.before, self.live, self.peak, self.peak_bytes, self.n, self.phase = before, {}, {}, 0, 0, "forward"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.n += 1
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor):
                s = t.untyped_storage()
                w = StorageWeakRef(s)
                if w.cdata not in self.live and w.cdata not in self.before:
                    self.live[w.cdata] = (w, s.nbytes(), f"{func.__name__} {tuple(t.shape)} {t.dtype} #{self.n} "
                                                         f"{self.phase}")
        for k in [k for k, v in self.live.items() if v[0].expired()]:
            del self.live[k]
        total = sum(v[1] for v in self.live.values())
        if self.phase == "backward" and total > self.peak_bytes:
            self.peak_bytes, self.peak_op = total, f"{func.__name__} #{self.n}"
            self.peak = {k: v[1:] for k, v in self.live.items()}
        return out


def main(rid: str) -> None:
    cfg = next(c for c in measure_lora.CKPT_CONFIGS if c["id"] == rid)
    torch.manual_seed(0)
    model, hf = measure_lora.build_model(cfg)
    ids = torch.randint(0, hf.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, foreach=True)
    autocast = harness.autocast_for(cfg)      # the forward under bf16 autocast for amp-bf16, as the harness runs it

    def loss():
        with autocast():
            return model(input_ids=ids, labels=ids).loss
    for _ in range(2):      # warm-up: the optimizer's state exists
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    before = {StorageWeakRef(t.untyped_storage()).cdata for t in [*model.parameters(), *model.buffers()]}
    before |= {StorageWeakRef(v.untyped_storage()).cdata for st in opt.state.values() for v in st.values()
               if isinstance(v, torch.Tensor)}
    tr = Track(before)
    with tr:
        value = loss()
        tr.phase = "backward"
        value.backward()
    print(f"backward peak (made in this iteration) {tr.peak_bytes:,} B at {tr.peak_op}")
    for nbytes, what in sorted(tr.peak.values(), key=lambda x: -x[0]):
        if nbytes >= 8192:
            print(f"  {nbytes:>12,} {what}")


if __name__ == "__main__":
    main(sys.argv[1])
