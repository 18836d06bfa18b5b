"""bitsandbytes before 0.43.2 as a 4-bit implementation of a QLoRA base (issue 25 item 3): derived, not measured.

Registered through the measured hook ``mlsysim_measured_quant_implementations`` as a third party's would be
(``quantizations.QuantImplementation``), selectable as ``lora.quant_implementation = "bitsandbytes-0.43.1"``
(``--quant-implementation bitsandbytes-0.43.1``).

What differs from bitsandbytes >= 0.43.2 (bitsandbytes-foundation/bitsandbytes, tag 0.43.1 =
4a6fb352cfb90b17820391f0db18aeda98774f0a, bitsandbytes/autograd/_functions.py:488-520)::

    class MatMul4Bit(torch.autograd.Function):
        def forward(ctx, A, B, out=None, bias=None, quant_state=None):
            output = torch.nn.functional.linear(A, F.dequantize_4bit(B, quant_state).to(A.dtype).t(), bias)
            ...
            if any(ctx.needs_input_grad[:2]):
                ctx.tensors = (A, B)

Commit 9e75374104cec965d9a4a630a68ce4e2b77b066f ("fix QLoRA mem bug: delete useless buffered activation
(#1270)", 2024-07-16, first released in 0.43.2 = ce53caf3c358ec3f81db6a9edc0b6fc2f17d9503) made it
``ctx.tensors = (None, B)``: the backward never read A (the weight is frozen; grad_A needs B only).

So before 0.43.2 every 4-bit linear whose input requires grad keeps that input ``A`` (what ``Linear4bit.forward``
passes: ``x.to(self.compute_dtype)``, nn/modules.py:463-468; the same tensor when x is already in the compute
dtype, else a copy per linear). ``ctx.tensors`` is a plain attribute of the autograd node, not
``save_for_backward``: no saved-tensor hook sees it (activation checkpointing does not drop it, offloading does not
move it) and it is not released when the node's backward runs, only when the node itself is freed with the graph.

The weights, their quantization constants and the dequantization transient are bitsandbytes' (0.43.1's
``quantize_4bit``, functional.py:1120-1262, has the layout ``finetune._tensor_bytes`` counts: (n + 1) // 2 code
bytes, an fp32 absmax per block and the 16-entry code, double quantization's nested state; ``dequantize_4bit`` in
the backward): ``stored`` is that count, the transient bitsandbytes'.

``saves_input`` declares the held inputs; ``held_inputs`` derives them for a Llama-style layer by hand. The measured
profile's LoRA layer walk reads the declaration (``lora.Walk.hold_input``: after each 4-bit linear whose input
requires grad, that input once where nothing else keeps it; the inputs kept under checkpointing and at the
backward's end). Derived, not measured (the old version has no CPU kernels).
"""

from __future__ import annotations

import attrs

from mlsysim_core import hookimpl

from .quantizations import QuantImplementation, _bnb_transient

NAME = "bitsandbytes-0.43.1"
SOURCE = ("bitsandbytes 0.43.1 (4a6fb352) bitsandbytes/autograd/_functions.py:488-520 MatMul4Bit.forward "
          "'ctx.tensors = (A, B)'; removed by 9e753741 (#1270), released in 0.43.2")
NOTE = ("derived, not measured (bitsandbytes 0.43.1 has no CPU kernels): each 4-bit linear whose input requires "
        "grad keeps that input as a ctx attribute until the graph is freed")


@attrs.frozen(kw_only=True, eq=False)
class InputHoldingImplementation(QuantImplementation):
    """A quantized-base implementation whose matmul keeps its input beyond what autograd saves.

    ``saves_input``: each quantized linear whose input requires grad keeps it (in the compute dtype: the tensor
    itself when the input already is, else its own cast copy). ``input_lifetime``: ``"graph"``, kept until the
    autograd graph is freed (a node attribute: not released by the node's backward, not seen by saved-tensor
    hooks)."""
    saves_input: bool = True
    input_lifetime: str = "graph"


def held_inputs(shape, tokens: int, c: int, *, inputs_in_compute_dtype: bool = True) -> tuple[tuple[str, int], ...]:
    """(what, bytes) one Llama-style decoder layer's 4-bit linears keep when every input requires grad: q/k/v read
    the input norm's output, o_proj the attention output, gate/up the post-attention norm's output, down_proj
    silu(gate) x up. One tensor per distinct input when it is already in the compute dtype (``c`` bytes); with
    ``inputs_in_compute_dtype=False`` each linear keeps its own cast copy (``Linear4bit.forward``'s
    ``x.to(compute_dtype)``)."""
    h, q, f, kv = shape.hidden, shape.q_dim, shape.ffn, shape.kv_dim
    if inputs_in_compute_dtype:
        parts = (("q/k/v_proj input (input norm output)", h), ("o_proj input (attention output)", q),
                 ("gate/up_proj input (post-attention norm output)", h), ("down_proj input (silu(gate) x up)", f))
    else:
        parts = (("q_proj input (its cast)", h), ("k_proj input (its cast)", h), ("v_proj input (its cast)", h),
                 ("o_proj input (attention output)", q), ("gate_proj input (its cast)", h),
                 ("up_proj input (its cast)", h), ("down_proj input (silu(gate) x up)", f))
    del kv      # (k/v_proj read the same input as q_proj: their widths do not enter)
    return tuple((name, tokens * width * c) for name, width in parts)


def _stored(n: int, rows: int, config, base: int) -> tuple[int, int]:
    from mlsysim_core.finetune import _tensor_bytes
    return _tensor_bytes(n, rows, config)


LEGACY = InputHoldingImplementation(
    name=NAME, description="bitsandbytes < 0.43.2's Linear4bit: MatMul4Bit keeps each linear's input (ctx.tensors "
    "= (A, B)) until the graph is freed; weights and dequantization as bitsandbytes' (" + NOTE + ")",
    source=SOURCE, kinds=("nf4", "fp4"), stored=_stored, transient=_bnb_transient,
    layout="bitsandbytes' quantize_4bit (0.43.1): an fp32 absmax per block + the 16-entry code, per weight")


@hookimpl(specname="mlsysim_measured_quant_implementations")
def legacy_bnb_quant_implementations():
    return [LEGACY]
