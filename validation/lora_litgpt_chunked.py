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


def litgpt_lora_step(model):
    base = model.get_base_model()
    held = [None]

    def forward(input_ids, labels, use_cache=False):
        x = base.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        logits = [F.linear(x_i, base.lm_head.weight) for x_i in x.split(CHUNK, dim=1)]
        del x
        held[0] = logits                       # the loop's `logits = model(...)`: the previous iteration's freed now
        logits[-1] = logits[-1][..., :-1, :]
        loss = litgpt_chunked_cross_entropy_list(logits, labels[..., 1:])
        return types.SimpleNamespace(loss=loss)
    return forward


def _cfg(model, b, s, regime):
    import measure_lora_variants as variants
    cfg = variants._cfg(f"litgpt-lora-{model}-{regime}-r8-qv-base-b{b}-s{s}", model, b, s, rank=8,
                        targets=["q_proj", "v_proj"], regime=regime, adapter_dtype="base",
                        loss="litgpt_chunked", loss_chunks=CHUNK)
    cfg["litgpt"] = {"source": LITGPT, "lm_head_chunk_size": CHUNK}
    return cfg


def configs():
    return [_cfg("gqa-tiny", 2, 256, "bf16"), _cfg("gqa-tiny", 1, 256, "bf16"), _cfg("llama-tiny", 2, 384, "fp32"),
            _cfg("gqa-tiny", 3, 200, "fp32")]


def measure(cfg: dict) -> dict:
    import peft
    original = peft.get_peft_model       # the adapters in the model's dtype (measure_lora_variants.measure's)
    peft.get_peft_model = lambda model, config, **kw: original(model, config, autocast_adapter_dtype=False, **kw)
    try:
        return variants.measure_lora.measure(cfg, step=litgpt_lora_step)
    finally:
        peft.get_peft_model = original


def document(args, runs, ctx) -> dict:
    doc = {**variants.document(args, runs, ctx),
           "generator": "/tmp/pplvenv/bin/python validation/lora_litgpt_chunked.py --measure", "litgpt": LITGPT,
           "environment": "/tmp/pplvenv: torch==2.13.0 (CPU), transformers==5.23.0, peft==0.21.2"}
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
