#!/usr/bin/env python
"""Measure the published loss implementations (issue 25 item 5) with the harness's protocol.

    /tmp/lossvenv/bin/python validation/techniques/loss/measure_published.py [--only ID ...]

Environment (/tmp/lossvenv, as measure_loss.py's): torch==2.13.0 (CPU), transformers==5.23.0.
Each run is the harness's (validation/harness.py: random-weight ``AutoModelForCausalLM.from_config``,
AdamW foreach, three iterations inside MemTracker, the third measured, phases set by the protocol);
only the forward that computes the loss differs, each as its library's recipe calls it, with the
library's own code copied at the cited commit (published_sources.py):

* ``torchtune_linear``: the base model's last hidden state (the model skips its output layer:
  ``set_model_output``), labels shifted with an ignore column (the recipe's ``torch.hstack``),
  ``LinearCrossEntropyLoss(num_output_chunks=8)`` with the LM head as ``F.linear`` on its weight,
  then ``del`` of the hidden state.
* ``torchtitan_chunked``: the last hidden state flattened to [T, D], ``ChunkedLossWrapper``'s loop
  (8 chunks, the chunk's loss and backward in the forward, ``GradAccumulator``,
  ``_DecoderOutputGradientBackProp``), divided by the valid tokens as torchtitan's trainer passes.
* ``trl_chunked_nll``: ``_chunked_cross_entropy_loss(hidden, lm_head.weight, 256, labels=labels)``
  on the base model's output (TRL patches the model's forward to call it).
* ``litgpt_chunked``: the whole logits (``lm_head`` on the hidden state), then
  ``chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])`` (chunk_size 128) as
  litgpt/finetune/full.py calls it; the logits are held by the loop's variable through the
  backward and the step and replaced only when the next forward's are assigned (kept here in a
  holder that the next forward rebinds after its LM head).
* ``megatron_fused``: the logits (``F.linear``), Megatron's fused vocab-parallel cross-entropy at
  tp = 1 on targets shifted by one (Megatron's dataset gives them shifted), mean over tokens, as
  Megatron runs it: its four functions ``torch.compile``d (``jit_fuser``, megatron/core/jit.py). A
  TorchDispatchMode (MemTracker) stops Dynamo, so these runs are measured by the profiler's memory
  timeline instead (``harness.profiled_iteration`` / ``memory_timeline``: two warm-up iterations,
  which compile, then the measured one, every phase), plus what was alive at the timeline's zero
  (``baseline_bytes``: parameters, buffers, optimizer state, inputs; the absolute bytes are their
  sum, as MemTracker's). The first run also measures the same code eagerly by the timeline
  (``eager_timeline``: the eager fused path, what the profile priced before).
* ``megatron_vocab_parallel``: the same with Megatron's unfused ``vocab_parallel_cross_entropy``
  (eager, as Megatron runs it), measured by the same timeline.

``share`` runs ignore the first half of each sequence's labels (-100: a prompt masked out, as in
SFT), solved with ``loss_token_share=0.5``. Writes published_measurements.json; compared by
tests/measured/test_loss_implementations.py (every phase).
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

import harness  # noqa: E402  (validation/harness.py)
from harness import peak_record, run_protocol  # noqa: E402
from configs import _cfg  # noqa: E402
import published_sources as src  # noqa: E402

IGNORE = -100


def _run(model, b, s, regime, loss, share=None):
    cfg = _cfg(f"published-{model}-b{b}-s{s}-{regime}-{loss}" + ("-share50" if share else ""), model, b, s,
               regime=regime)
    cfg["loss"] = loss
    cfg["share"] = share
    cfg["solve_options"] = {"loss": loss, **({"loss_token_share": share} if share else {})}
    return cfg


# gqa-tiny in bf16 for every loss first, then fp32, the share runs, autocast, then a Mixtral (the order measured).
_LOSSES = (("torchtune_linear", ("bf16", "fp32", "amp-bf16")), ("torchtitan_chunked", ("bf16", "fp32", "amp-bf16")),
           ("trl_chunked_nll", ("bf16", "fp32")), ("litgpt_chunked", ("bf16", "fp32", "amp-bf16")),
           ("megatron_fused", ("bf16", "amp-bf16")), ("megatron_vocab_parallel", ("bf16", "amp-bf16")))
TIMELINE = ("megatron_fused", "megatron_vocab_parallel")
CONFIGS = [_run("gqa-tiny", 2, 256, regime, loss) for regime in ("bf16", "fp32") for loss, regimes in _LOSSES
           if regime in regimes]
CONFIGS += [_run("gqa-tiny", 2, 256, "bf16", "torchtune_linear", 0.5),
            _run("gqa-tiny", 2, 256, "bf16", "trl_chunked_nll", 0.5)]
CONFIGS += [_run("gqa-tiny", 2, 256, "amp-bf16", loss) for loss, regimes in _LOSSES if "amp-bf16" in regimes]
CONFIGS += [_run("mixtral-tiny", 2, 256, "bf16", loss) for loss, _ in _LOSSES]


CONFIGS_EAGER_CHECK = "published-gqa-tiny-b2-s256-bf16-megatron_fused"


def _base(model):
    return model.base_model


def _labels(labels, share):
    if not share:
        return labels
    labels = labels.clone()
    labels[:, : labels.shape[1] // 2] = IGNORE          # the prompt's half ignored
    return labels


def _shifted(labels):
    return torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], IGNORE)))


def make_forward(model, cfg):
    weight = model.lm_head.weight
    share = cfg.get("share")
    held = [None]

    def head(x):
        return F.linear(x, weight)     # the LM head's computation (MemTracker refuses a module called per chunk)

    def forward(input_ids, labels, use_cache=False):
        labels = _labels(labels, share)
        hidden = _base(model)(input_ids=input_ids, use_cache=use_cache)[0]
        loss_name = cfg["loss"]
        if loss_name == "torchtune_linear":
            loss = src.LinearCrossEntropyLoss(head, num_output_chunks=8).forward(hidden, _shifted(labels))
        elif loss_name == "torchtitan_chunked":
            flat = hidden.reshape(-1, hidden.shape[-1])
            targets = _shifted(labels).reshape(-1)
            valid = (targets != IGNORE).sum()
            loss = src.titan_chunked_loss(flat, head, targets, num_chunks=8, global_valid_tokens=valid)
        elif loss_name == "trl_chunked_nll":
            loss = src.trl_chunked_cross_entropy_loss(hidden, weight, 256, labels=labels)[0]
        elif loss_name == "litgpt_chunked":
            logits = head(hidden)
            held[0] = logits                 # the loop's `logits = model(input_ids)`: the previous freed now
            loss = src.litgpt_chunked_cross_entropy(logits[..., :-1, :], labels[..., 1:])
        elif loss_name in TIMELINE:
            logits = head(hidden)
            target = torch.cat((labels[:, 1:], labels[:, :1]), dim=1)
            fn = {"megatron_fused": src.CompiledMegatronFusedVocabParallelCrossEntropy,
                  "megatron_vocab_parallel": src.MegatronVocabParallelCrossEntropy,
                  "megatron_fused_eager": src.MegatronFusedVocabParallelCrossEntropy}[cfg.get("variant", loss_name)]
            losses = fn.apply(logits, target)
            loss = losses.sum() / losses.numel()
        else:
            raise ValueError(loss_name)
        del hidden
        return types.SimpleNamespace(loss=loss)
    return forward


def _timeline(cfg: dict, variant=None) -> dict:
    """The profiler's memory timeline of the measured iteration, absolute (+ what was alive at its zero)."""
    with harness.training_run(cfg, tracker=False) as run:
        model = run.model
        step = make_forward(model, {**cfg, **({"variant": variant} if variant else {})})
        prof = harness.profiled_iteration(step, run.optimizer, run.input_ids, autocast=harness.autocast_for(cfg))
        tensors = [*model.parameters(), *model.buffers(), run.input_ids,
                   *(v for st in run.optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))]
        base = int(sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values()))
        tl = harness.memory_timeline(prof)
        del prof
        return {"method": "torch.profiler memory timeline (harness.profiled_iteration)", "baseline_bytes": base,
                "timeline": tl, "peak_bytes": base + tl["peak_bytes"], "peak_phase": tl["peak_phase"],
                "peak_op": None,
                "peak_by_phase": {p: {"bytes": base + v} for p, v in tl["peak_by_phase"].items()},
                "alive": {k: {"bytes": base + v} for k, v in tl["alive"].items()},
                "parameters": int(sum(p.numel() for p in model.parameters())),
                "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                "wall_s": round(time.perf_counter() - run.t0, 1)}


def measure(cfg: dict) -> dict:
    if cfg["loss"] in TIMELINE:
        record = _timeline(cfg)
        if cfg["loss"] == "megatron_fused" and cfg["id"] == CONFIGS_EAGER_CHECK:
            record["eager_timeline"] = _timeline(cfg, "megatron_fused_eager")
        return record
    with harness.training_run(cfg) as run:
        model, mt = run.model, run.mt
        step = make_forward(model, cfg)
        alive, t_measured = run_protocol(mt, step, run.optimizer, run.input_ids, autocast=harness.autocast_for(cfg))
        t_end = time.perf_counter()
        return {**peak_record(mt), "alive": alive,
                "parameters": int(sum(p.numel() for p in model.parameters())),
                "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
                "wall_s": round(t_end - run.t0, 1)}


def _versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def document(args, runs, ctx) -> dict:
    return {"command": "/tmp/lossvenv/bin/python validation/techniques/loss/measure_published.py",
            "environment": "/tmp/lossvenv: torch==2.13.0 (CPU) transformers==5.23.0",
            "sources": {"torchtune": "bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1",
                        "torchtitan": "b5bcd76c66d0acb1a08b176d9639425bc55e0b2a",
                        "trl": "f2cd57710ae345ea6428ae95363267fcf38a3dc8",
                        "litgpt": "26857050fe3ff627cd714fe92f5838f51a3d5efa",
                        "megatron-lm": "d98e8a64ddf34856e74b24714e3bedb2f5a39553",
                        "megatron-lm jit_fuser": "00caa53af30912914981c86f39db123961678bbd megatron/core/jit.py"},
            **_versions(), "runs": runs}


def _summary(m) -> str:
    return (f"peak {m['peak_bytes'] / 2**20:9.2f} MiB ({m['peak_phase']}, {m['peak_op']})  "
            + "  ".join(f"{p} {v['bytes'] / 2**20:.2f}" for p, v in m["peak_by_phase"].items()))


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                 document=document, out=str(HERE / "published_measurements.json"), versions=_versions, threads=2,
                 catch=True, incremental=True, sort_keys=False, atomic=False, summary=_summary,
                 line=lambda n, t, c, msg: f"{c['id']:<55} {msg}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
