#!/usr/bin/env python
"""Measure the loss-technique runs of ``loss_configs.py`` with validation/harness.py's protocol.

    /tmp/lossvenv/bin/python validation/techniques/loss/measure_loss.py [--only ID ...]

Environment (/tmp/lossvenv): torch==2.13.0 (CPU), transformers==5.23.0, torchtune==0.6.1,
torchao==0.13.0 (torchtune 0.6.1 needs torchao <= 0.13). Each run is validation/harness.py's
(random-weight ``AutoModelForCausalLM.from_config``, AdamW foreach, three iterations inside
MemTracker, the third measured); only the forward that computes the loss differs:

* ``cross_entropy``: Hugging Face's own (``model(input_ids, labels=input_ids).loss``: the LM
  head over every token, ``ForCausalLMLoss`` upcasts the logits to fp32).
* ``chunked``: torchtune 0.6.1's recipe applied to the HF model: the base model's last hidden
  state, the LM head on each of ``loss_chunks`` sequence chunks
  (torchtune/modules/transformer.py ``TransformerDecoder.chunked_output``: ``h.chunk(n, dim=1)``),
  the labels shifted with an ignore column (recipes/full_finetune_single_device.py
  ``torch.hstack``), torchtune's own ``CEWithChunkedOutputLoss`` (imported, not copied), then
  ``del logits`` before the backward (the recipe's "free logits otherwise it peaks backward memory").
* ``fused_linear``: Liger-Kernel v0.8.2's fused linear cross-entropy as its HF patch calls it
  (``LigerForCausalLMLoss`` on the base model's last hidden state and ``lm_head.weight``),
  emulated in PyTorch by ``liger_emulation.py`` (liger-kernel needs triton).
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))       # validation/
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import transformers  # noqa: E402
import torchtune  # noqa: E402
from torchtune.modules.loss import CEWithChunkedOutputLoss  # noqa: E402

import harness  # noqa: E402  (validation/harness.py)
from harness import peak_record, run_protocol  # noqa: E402
from loss_configs import CONFIGS  # noqa: E402
from liger_emulation import liger_causal_lm_loss  # noqa: E402

IGNORE = -100


def _base(model):
    return model.base_model


def chunked_forward(model, n):
    loss_fn = CEWithChunkedOutputLoss(num_output_chunks=n, ignore_index=IGNORE)

    def forward(input_ids, labels, use_cache=False):
        h = _base(model)(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        # chunked_output; F.linear is nn.Linear.forward (no bias): MemTracker refuses a module called
        # several times in one iteration.
        logits = [F.linear(chunk, model.lm_head.weight) for chunk in h.chunk(n, dim=1)]
        del h
        labels = torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], IGNORE)))
        # loss_fn.forward, not loss_fn(...): MemTracker's module hooks would keep every chunk's logits
        # gradient alive until the last arrives (a multi-grad hook on the module's inputs), which a
        # run without the tracker never does; the computation is torchtune's own.
        loss = loss_fn.forward(logits, labels)
        del logits                                                          # the recipe's `del logits`
        return types.SimpleNamespace(loss=loss)
    return forward


def fused_forward(model):
    def forward(input_ids, labels, use_cache=False):
        outputs = _base(model)(input_ids=input_ids, use_cache=use_cache)
        hidden = outputs[0]
        loss = liger_causal_lm_loss(hidden, model.lm_head.weight, labels, model.config.hidden_size, IGNORE)
        return types.SimpleNamespace(loss=loss)
    return forward


def measure(cfg: dict) -> dict:
    with harness.training_run(cfg) as run:
        model, mt = run.model, run.mt
        step = {"cross_entropy": lambda: model, "chunked": lambda: chunked_forward(model, cfg["loss_chunks"]),
                "fused_linear": lambda: fused_forward(model)}[cfg["loss"]]()
        alive, t_measured = run_protocol(mt, step, run.optimizer, run.input_ids, autocast=harness.autocast_for(cfg))
        t_end = time.perf_counter()
        return {**peak_record(mt), "alive": alive,
                "parameters": int(sum(p.numel() for p in model.parameters())),
                "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                "wall_s": round(t_end - run.t0, 1)}


def _versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__, "torchtune": torchtune.__version__}


def document(args, runs, ctx) -> dict:
    return {"command": "/tmp/lossvenv/bin/python validation/techniques/loss/measure_loss.py",
            "environment": "/tmp/lossvenv: torch==2.13.0 (CPU) transformers==5.23.0 torchtune==0.6.1 torchao==0.13.0",
            **_versions(), "runs": runs}


def _summary(m) -> str:
    return (f"peak {m['peak_bytes'] / 2**20:9.2f} MiB ({m['peak_phase']}, {m['peak_op']})  "
            + "  ".join(f"{p} {v['bytes'] / 2**20:.2f}" for p, v in m["peak_by_phase"].items()))


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                 document=document, out=str(HERE / "measurements.json"), versions=_versions, threads=2,
                 catch=False, incremental=True, sort_keys=False, atomic=False, summary=_summary,
                 line=lambda n, t, c, msg: f"{c['id']:<45} {msg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
