#!/usr/bin/env python
"""LitGPT's chunked LM head and chunked cross-entropy under LoRA (``litgpt finetune_lora``), measured.

    nice -n 10 /tmp/pplvenv/bin/python validation/lora_litgpt_chunked.py --measure [--only ID ...]
    # writes validation/lora_litgpt_chunked_measurements.json; /tmp/pplvenv: torch==2.13.0 (CPU),
    # transformers==5.23.0, peft==0.21.2 (measure_lora.py's environment)
    python validation/lora_litgpt_chunked.py      # the project's environment, no torch: the measured profile's
    # loss='litgpt_chunked' with LoRA against them, every phase (report_lora_variants.py's comparison)

LitGPT's LoRA fine-tune (Lightning-AI/litgpt 26857050fe3ff627cd714fe92f5838f51a3d5efa, litgpt/finetune/lora.py
lines 355-358) runs::

    logits = model(input_ids, lm_head_chunk_size=128)     # litgpt/model.py 177-179: [lm_head(x_i) for x_i in x.split(128, dim=1)]
    logits[-1] = logits[-1][..., :-1, :]                  # the shift, on the last chunk
    loss = chunked_cross_entropy(logits, targets[..., 1:])  # litgpt/utils.py 302-329: the list path

``chunked_cross_entropy``'s list path (copied below, verbatim but for the name) reshapes each chunk to
[b x 128, V], splits the targets likewise and takes ``F.cross_entropy(..., reduction="none")`` per chunk, then
``torch.cat(loss_chunks).sum() / non_masked``. The LM head is frozen (``lora_head: False``, LitGPT's default: a
``LoRALinear`` with r = 0, i.e. the plain linear). Measured here on measure_lora.py's peft model (the adapters in
the model's dtype, as LitGPT's ``bf16-true`` holds them; q and v adapted, LitGPT's defaults ``lora_query`` and
``lora_value``) with the step above over the base model's hidden state (the LM head as ``F.linear`` on its frozen
weight per chunk: MemTracker refuses a module called several times), the logits list held by the loop's variable
through the backward and the step and replaced when the next forward's is assigned (as measure_published.py's
``litgpt_chunked`` holds them). The harness's protocol (MemTracker, three iterations, the third measured).

QLoRA (``litgpt finetune_lora --quantize bnb.nf4-dq``, the ``litgpt-qlora-*`` runs): measure_lora.py's
bitsandbytes base (transformers' BitsAndBytesConfig quantizes the decoder linears, not the LM head) with the LM
head converted as Lightning's BitsandbytesPrecision converts it (``quantize_lm_head``), each chunk through
``Linear4bit.forward``'s ``bnb.matmul_4bit`` (``_head``), and ``gemm_4bit``'s kernel called op by op
(``_visible_gemm_4bit``) so that MemTracker sees the dequantized weight it allocates. bitsandbytes==0.50.2 in
/tmp/pplvenv (its 4-bit training path runs on the CPU).
"""

from __future__ import annotations

import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

if "--measure" in sys.argv:
    import harness  # noqa: E402  (validation/harness.py)
    import measure_lora_variants as variants  # noqa: E402  (its _cfg, measure and environment)
    import torch  # noqa: E402
    import torch.nn.functional as F  # noqa: E402

PATH = os.path.join(HERE, "lora_litgpt_chunked_measurements.json")

CHUNK = 128      # lm_head_chunk_size=128 and chunked_cross_entropy's chunk_size default
LITGPT = "Lightning-AI/litgpt 26857050fe3ff627cd714fe92f5838f51a3d5efa"


def litgpt_chunked_cross_entropy_list(logits, targets, chunk_size=128, ignore_index=-100):
    """litgpt/utils.py ``chunked_cross_entropy`` at 26857050, its list path (lines 317-329)."""
    assert isinstance(logits, list) and chunk_size != 0
    logit_chunks = [logit_chunk.reshape(-1, logit_chunk.size(-1)) for logit_chunk in logits]
    target_chunks = [target_chunk.reshape(-1) for target_chunk in targets.split(logits[0].size(1), dim=1)]
    loss_chunks = [
        torch.nn.functional.cross_entropy(logit_chunk, target_chunk, ignore_index=ignore_index, reduction="none")
        for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)
    ]
    non_masked_elems = (targets != ignore_index).sum()
    return torch.cat(loss_chunks).sum() / non_masked_elems.maximum(torch.ones_like(non_masked_elems))


def quantize_lm_head(model, lora):
    """QLoRA as LitGPT runs it: Lightning's ``BitsandbytesPrecision`` (Lightning-AI/pytorch-lightning 2d347d0b,
    src/lightning/fabric/plugins/precision/bitsandbytes.py, ``_convert_layers`` with no ``ignore_modules``)
    replaces every ``nn.Linear``, the LM head's too, by bitsandbytes' ``Linear4bit`` (``nf4-dq``: nf4 with
    ``compress_statistics``; the compute dtype the model's). transformers' ``BitsAndBytesConfig`` (measure_lora.py's
    QLoRA) keeps the LM head unquantized: it is converted here, as ``Linear4bit`` would hold it (``Params4bit``,
    blocksize 64, uint8 storage), before peft wraps the model."""
    import bitsandbytes as bnb
    head = model.lm_head
    dtype = head.weight.dtype
    q = bnb.nn.Linear4bit(head.in_features, head.out_features, bias=False, compute_dtype=dtype,
                          compress_statistics=lora["double_quant"], quant_type=lora["quantization"],
                          quant_storage=torch.uint8, device="meta")
    q.weight = bnb.nn.Params4bit(head.weight.data, requires_grad=False, compress_statistics=lora["double_quant"],
                                 quant_type=lora["quantization"], blocksize=64,
                                 quant_storage=torch.uint8)._quantize("cpu")
    model.lm_head = q
    del head
    return model


def _head(base):
    """The LM head's matmul per chunk: ``F.linear`` on the frozen weight, or ``Linear4bit.forward``'s
    ``bnb.matmul_4bit`` (bitsandbytes 0.50.2 bitsandbytes/nn/modules.py; the input already in the compute
    dtype) over a quantized head (MemTracker refuses a module called several times: the functions, not the
    module)."""
    w = base.lm_head.weight
    if getattr(w, "quant_state", None) is None:
        return lambda x_i: F.linear(x_i, w)
    import bitsandbytes as bnb
    return lambda x_i: bnb.matmul_4bit(x_i, w, quant_state=w.quant_state)


def litgpt_lora_step(model):
    base = model.get_base_model()
    held = [None]
    head = _head(base)

    def forward(input_ids, labels, use_cache=False):
        x = base.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        logits = [head(x_i) for x_i in x.split(CHUNK, dim=1)]
        del x
        held[0] = logits                       # the loop's `logits = model(...)`: the previous iteration's freed now
        logits[-1] = logits[-1][..., :-1, :]
        loss = litgpt_chunked_cross_entropy_list(logits, labels[..., 1:])
        return types.SimpleNamespace(loss=loss)
    return forward


def _cfg(model, b, s, regime, qlora=None):
    import measure_lora_variants as variants
    cfg = variants._cfg(f"litgpt-{'q' + qlora if qlora else 'lora'}-{model}-{regime}-r8-qv-base-b{b}-s{s}", model,
                        b, s, rank=8, targets=["q_proj", "v_proj"], regime=regime, adapter_dtype="base",
                        loss="litgpt_chunked", loss_chunks=CHUNK, quantization="nf4" if qlora else None)
    cfg["litgpt"] = {"source": LITGPT, "lm_head_chunk_size": CHUNK}
    if qlora:            # LitGPT's --quantize bnb.nf4 / bnb.nf4-dq: the LM head quantized too (quantize_lm_head)
        cfg["lora"]["double_quant"] = qlora == "lora-nf4-dq"
        cfg["litgpt"]["quantize"] = "bnb." + qlora[len("lora-"):]
    return cfg


def configs():
    return [_cfg("gqa-tiny", 2, 256, "bf16"), _cfg("gqa-tiny", 1, 256, "bf16"), _cfg("llama-tiny", 2, 384, "fp32"),
            _cfg("gqa-tiny", 3, 200, "fp32"),
            _cfg("gqa-tiny", 2, 256, "bf16", qlora="lora-nf4-dq"), _cfg("gqa-tiny", 1, 256, "bf16", qlora="lora-nf4-dq"),
            _cfg("llama-tiny", 2, 384, "fp32", qlora="lora-nf4-dq"), _cfg("gqa-tiny", 1, 256, "bf16", qlora="lora-nf4")]


def _visible_gemm_4bit():
    """``MatMul4Bit.forward`` calls ``torch.ops.bitsandbytes.gemm_4bit``, a custom op whose CPU (and large-M CUDA)
    kernel is bitsandbytes' Python ``_gemm_4bit_default_impl`` (bitsandbytes 0.50.2
    bitsandbytes/backends/default/ops.py: the nested absmax dequantized to fp32 plus the offset,
    ``dequantize_4bit`` of the whole weight to the compute dtype, ``F.linear``). MemTracker (a dispatch mode)
    sees a custom op's outputs only, not the temporaries its kernel allocates: the same function is called
    in its place here, so that its ops (the dequantized weight among them) are dispatched, and seen, one by one.
    Returns the restore."""
    from bitsandbytes.backends.default.ops import _gemm_4bit_default_impl
    ns = torch.ops.bitsandbytes
    original = ns.gemm_4bit
    setattr(ns, "gemm_4bit", types.SimpleNamespace(default=_gemm_4bit_default_impl))
    return lambda: setattr(ns, "gemm_4bit", original)


def measure(cfg: dict) -> dict:
    import peft
    original = peft.get_peft_model       # the adapters in the model's dtype (measure_lora_variants.measure's)
    lora = cfg["lora"]
    peft.get_peft_model = lambda model, config, **kw: original(
        quantize_lm_head(model, lora) if lora["quantization"] else model, config, autocast_adapter_dtype=False, **kw)
    restore = _visible_gemm_4bit() if lora["quantization"] else (lambda: None)
    try:
        return variants.measure_lora.measure(cfg, step=litgpt_lora_step)
    finally:
        peft.get_peft_model = original
        restore()


def document(args, runs, ctx) -> dict:
    doc = {**variants.document(args, runs, ctx),
           "generator": "/tmp/pplvenv/bin/python validation/lora_litgpt_chunked.py --measure", "litgpt": LITGPT,
           "environment": "/tmp/pplvenv: torch==2.13.0 (CPU), transformers==5.23.0, peft==0.21.2, "
                          "bitsandbytes==0.50.2"}
    doc.pop("torchtune_loss", None)
    return doc


def compare(path: str = PATH) -> list[dict]:
    """report_lora_variants.compare over the recorded runs: per run its errors per phase and at the forward's end."""
    import json

    import report_lora_variants
    with open(path) as f:
        runs = [r for r in json.load(f)["runs"] if r.get("measured")]
    return report_lora_variants.compare(runs)


def table(path: str = PATH) -> str:
    out = ["| run | forward | backward | optimizer | end of forward | peak |", "|---|---:|---:|---:|---:|---:|"]
    for row in compare(path):
        if "refused" in row:
            out.append(f"| {row['run']['id']} | refused: {row['refused']} | | | | |")
            continue
        e = row["errors"]
        out.append(f"| {row['run']['id']} | " + " | ".join(f"{100 * e[p]:+.2f} %" for p in ("forward", "backward",
                   "optimizer")) + f" | {100 * row['end_of_forward']:+.2f} % | {100 * row['peak']:+.2f} % |")
    return "\n".join(out)


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=configs(), measure_run=measure,
                 document=document, out=PATH,
                 versions=variants._versions, summary=harness.mib_summary(9, 2, wall=5), incremental=True,
                 keep_previous="always", line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<48} {msg}")
    return 0


if __name__ == "__main__":
    if "--measure" in sys.argv:
        raise SystemExit(main([a for a in sys.argv[1:] if a != "--measure"]))
    print(table())
