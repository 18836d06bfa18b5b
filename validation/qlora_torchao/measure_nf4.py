#!/usr/bin/env python
"""torchao's NF4Tensor, one weight at a time: its stored bytes and what dequantizing it holds (torchtune's QLoRA base,
``LoRALinear(quantize_base=True)`` / ``FrozenNF4Linear``: ``to_nf4`` and ``linear_nf4``).

    nice -n 10 /tmp/tvenv/bin/python validation/qlora_torchao/measure_nf4.py
    # writes validation/qlora_torchao/nf4_measurements.json; /tmp/tvenv: torch==2.13.0 (CPU), torchao==0.13.0

Per weight (out x in; bf16 and fp32, the dtype the model is built in): the storage bytes of each inner tensor of
``to_nf4(w)`` (``__tensor_flatten__``), and the peak of the tensors alive (a dispatch mode that adds each new
storage when an op returns it and takes it off when its tensor is freed) during ``w.to(dtype)`` (the forward's and
the backward's dequantization: ``LinearNF4.forward`` ``F.linear(x, w.to(x.dtype))``, ``backward``
``g @ w.to(g.dtype)``), and of one ``linear_nf4`` forward and backward (T tokens) beyond its input, output and
gradients. The model's declaration is plugins/mlsysim_plugins/measured/quantizations.py (tests/measured/
test_lora_torchao.py compares)."""

from __future__ import annotations

import os
import sys
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
SHAPES = ((704, 256), (256, 704), (256, 256), (64, 256), (128, 256), (4096, 4096), (1024, 4096), (14336, 4096))


def main() -> int:
    import torch
    import torchao
    sys.path.insert(0, os.path.dirname(HERE))
    import harness  # (validation/harness.py: write_json)
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4

    class Live(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.now = self.peak = 0
            self.seen = set()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and type(t) is torch.Tensor:
                    st = t.untyped_storage()
                    key, n = st.data_ptr(), st.nbytes()
                    if n == 0 or key in self.seen:
                        continue
                    self.seen.add(key)
                    self.now += n
                    self.peak = max(self.peak, self.now)

                    def free(key=key, n=n):
                        self.now -= n
                        self.seen.discard(key)
                    weakref.finalize(t, free)
            return out

    runs = []
    for dtype in (torch.bfloat16, torch.float32):
        for out_f, in_f in SHAPES:
            torch.manual_seed(0)
            w = to_nf4(torch.randn(out_f, in_f, dtype=dtype))
            names, _ = w.__tensor_flatten__()
            stored = {n: getattr(w, n).untyped_storage().nbytes() for n in names}
            mode = Live()
            with mode:
                d = w.to(dtype)
            to_peak, to_kept = mode.peak, mode.now
            del d
            row = {"dtype": str(dtype).split(".")[-1], "out": out_f, "in": in_f, "stored": stored,
                   "stored_total": sum(stored.values()), "to_dtype_peak": to_peak, "to_dtype_kept": to_kept}
            if out_f * in_f <= 704 * 256:
                T = 128
                x = torch.randn(T, in_f, dtype=dtype, requires_grad=True)
                mode = Live()
                with mode:
                    y = linear_nf4(x, w)
                    fwd = mode.peak
                    mode.peak = mode.now
                    y.backward(torch.ones_like(y))
                    bwd = mode.peak
                row.update(tokens=T, forward_peak=fwd, backward_peak=bwd)
            runs.append(row)
            print(row)
    doc = {"generator": "/tmp/tvenv/bin/python validation/qlora_torchao/measure_nf4.py", "torch": torch.__version__,
           "torchao": torchao.__version__, "runs": runs}
    harness.write_json(os.path.join(HERE, "nf4_measurements.json"), doc, sort_keys=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
