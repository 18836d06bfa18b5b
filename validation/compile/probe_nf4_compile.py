#!/usr/bin/env python
"""Does torchtune's QLoRA linear (torchao's NF4 base) compile correctly here? The check before measuring compiled
QLoRA blocks the way measure_blocks.py measures compiled LoRA ones.

    nice -n 10 /tmp/tvenv/bin/python validation/compile/probe_nf4_compile.py                         # torchao 0.13.0
    PYTHONPATH=/tmp/ao17 nice -n 10 /tmp/tvenv/bin/python validation/compile/probe_nf4_compile.py  # torchao 0.17.0
    # (pip install --no-deps --target /tmp/ao17 torchao==0.17.0); each run adds its torchao version's record to
    # validation/compile/probe_nf4_compile.json

torchtune 0.6.1's ``LoRALinear(quantize_base=True)`` (its base weight ``to_nf4``'d: torchao's ``NF4Tensor``, blocks
of 64, scalers in blocks of 256; the forward ``linear_nf4(x, weight)``, torchao's ``LinearNF4`` autograd function,
whose backward is ``grad_output @ weight.to(grad_output.dtype)``), bf16, ``lora_b`` zero as torchtune initialises
it (so the input's gradient is the base's alone: ``g W``, W the dequantized weight). Eager, and under
``torch.compile`` (Inductor, what ``training.compile_model`` does to each layer), on a square (256 x 256) and a
non-square (256 -> 1,024) linear: the input's gradient against ``g W`` and ``g W^T``; each with the NF4 base
requiring grad (``LoRALinear`` registers ``nn.Parameter(to_nf4(...))``, requires_grad True) and frozen
(``base_requires_grad`` False: what the recipes run, ``set_trainable_params`` before ``compile_model``).

Found (torchao 0.13.0): the miscompile needs the NF4 base to require grad; frozen, as the recipes freeze it before
compiling, the compiled gradient equals eager's for both shapes. Why (traced with ``backend="aot_eager"``): with
the weight requiring grad, the backward body's ``weight.to(grad_output.dtype)`` (the weight's own dtype) does not
reach NF4Tensor's dequantizing ``__torch_function__`` (6 of 7 calls reached), so the NF4Tensor reaches ``@`` and
torchao's NF4 ``aten.mm`` handler, ``linear_nf4(a, b)``, computes ``a @ b^T`` (docs/compile.md). (The 0.17.0 record predates the frozen case: its
linears require grad.)
"""

from __future__ import annotations

import json
import os
import platform

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "probe_nf4_compile.json")


def probe(in_dim, out_dim, frozen):
    from torchtune.modules.peft import LoRALinear
    torch.manual_seed(0)
    lin = LoRALinear(in_dim, out_dim, rank=8, alpha=16, quantize_base=True).to(torch.bfloat16)
    if frozen:      # the recipe: set_trainable_params(model, adapter_params) before compile_model
        lin.weight.requires_grad_(False)
    w = lin.weight.get_original_weight().float()      # the dequantized base, (out, in)
    x = torch.randn(1, 64, in_dim, dtype=torch.bfloat16)
    record = {"in": in_dim, "out": out_dim, "weight_type": type(lin.weight).__name__,
              "base_requires_grad": lin.weight.requires_grad}
    for name, fn in (("eager", lin), ("compiled", torch.compile(lin))):
        xi = x.clone().requires_grad_()
        try:
            y = fn(xi)
            g = torch.ones_like(y)
            y.backward(g)
        except Exception as err:      # noqa: BLE001  (recorded: the failure is the finding)
            lines = [ln for ln in str(err).splitlines() if ln.strip()]
            cause = next((ln for ln in lines if ln.startswith(("RuntimeError", "TorchRuntimeError"))), lines[0])
            record[name] = {"error": f"{type(err).__name__}: {cause[:200]}"}
            torch._dynamo.reset()
            continue
        got = xi.grad.float()
        gw = g.float() @ w
        out = {"max_abs_grad": got.abs().max().item(), "max_diff_vs_gW": (got - gw).abs().max().item()}
        if in_dim == out_dim:
            out["max_diff_vs_gWT"] = (got - g.float() @ w.t()).abs().max().item()
        record[name] = out
        torch._dynamo.reset()
    return record


def trace(requires_grad: bool) -> dict:
    """The mechanism: NF4Tensor's dequantizing ``Tensor.to`` override and its ``aten.mm`` handler counted while
    ``torch.compile(..., backend="aot_eager")`` traces a 256 -> 512 LoRALinear (fp32) and runs its backward."""
    import torchao.dtypes.nf4tensor as nf
    from torchtune.modules.peft import LoRALinear
    calls = {"to": 0, "mm": [], "error": None}
    to, mm = nf.NF4_TORCH_FUNCTIONS[torch.Tensor.to], nf.NF4_OPS_TABLE[torch.ops.aten.mm.default]

    def counted_to(*a, **k):
        calls["to"] += 1
        return to(*a, **k)

    def counted_mm(func, *a, **k):
        calls["mm"].append([list(x.shape) for x in a[0]])
        return mm(func, *a, **k)
    nf.NF4_TORCH_FUNCTIONS[torch.Tensor.to], nf.NF4_OPS_TABLE[torch.ops.aten.mm.default] = counted_to, counted_mm
    try:
        torch.manual_seed(0)
        lin = LoRALinear(256, 512, rank=8, alpha=16, quantize_base=True)
        lin.weight.requires_grad_(requires_grad)
        x = torch.randn(4, 256, requires_grad=True)
        torch.compile(lin, backend="aot_eager")(x).sum().backward()
    except Exception as err:      # noqa: BLE001  (recorded: the failure is the finding)
        calls["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160]}"
    finally:
        nf.NF4_TORCH_FUNCTIONS[torch.Tensor.to], nf.NF4_OPS_TABLE[torch.ops.aten.mm.default] = to, mm
        torch._dynamo.reset()
    return {"base_requires_grad": requires_grad, "nf4_to_calls": calls["to"], "nf4_mm_calls": calls["mm"],
            "error": calls["error"]}


def main() -> int:
    import torchao
    import torchtune
    torch.set_num_threads(min(2, os.cpu_count() or 1))
    doc = {"generator": "validation/compile/probe_nf4_compile.py", "runs": {}}
    if os.path.exists(OUT):
        with open(OUT) as f:
            doc = json.load(f)
    doc["runs"][torchao.__version__] = {
        "torch": torch.__version__, "torchtune": torchtune.__version__, "torchao": torchao.__version__,
        "python": platform.python_version(), "device": "cpu",
        "linears": [probe(i, o, frozen) for frozen in (False, True) for i, o in ((256, 256), (256, 1024))],
        "trace_aot_eager": [trace(True), trace(False)]}
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    print(json.dumps(doc["runs"][torchao.__version__], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
