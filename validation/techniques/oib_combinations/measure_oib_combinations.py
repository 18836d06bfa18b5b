#!/usr/bin/env python
"""Measure the optimizer step in the backward combined with the chunked loss, bitsandbytes' 8-bit
AdamW, activation offloading and the checkpointing policies, on the CPU.

    /tmp/oibcombovenv/bin/python validation/techniques/oib_combinations/measure_oib_combinations.py [--only ID ...]

Environment (its own, pinned; torchtune 0.6.1 needs torchao <= 0.13)::

    python3 -m venv /tmp/oibcombovenv
    /tmp/oibcombovenv/bin/pip install torch==2.13.0 transformers==5.23.0
    /tmp/oibcombovenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0
    /tmp/oibcombovenv/bin/pip install bitsandbytes==0.50.2
    # torchtune's own imports (datasets, omegaconf, ...): the pins of /tmp/lossvenv, --no-deps

Each run is ``validation/harness.py``'s protocol (three iterations, the third measured, every
phase's peak) with the pieces the other technique harnesses already use, imported, not copied:

* the optimizer in the backward: ``../offload/measure_offload.py``'s ``optimizer_in_backward``
  logic (torchtune 0.6.1 ``torchtune/training/memory.py`` ``create_optim_in_bwd_wrapper`` /
  ``register_optim_in_bwd_hooks``: one optimizer per parameter, ``step(); zero_grad()`` in its
  post-accumulate-grad hook), here with any optimizer: ``torch.optim.AdamW`` or bitsandbytes
  0.50.2's ``bnb.optim.AdamW8bit`` (one per parameter, as torchtune builds it with
  ``optimizer_in_bwd=True`` and ``optimizer._component_=bitsandbytes.optim.PagedAdamW8bit``; the
  paged variant falls back to the same states on the CPU). The loop's step and zero_grad do nothing.
  The backward is split at the LM head's hook (``backward_sub_phases``).
* the chunked loss: ``../loss/measure_loss.py``'s ``chunked_forward`` (torchtune 0.6.1's
  ``CEWithChunkedOutputLoss`` on the LM head applied chunk by chunk, ``del logits``).
* activation offloading: ``../offload/measure_offload.py``'s simulated ``save_on_cpu`` around the
  base model (the LM head and the loss outside, as torchtune places its offload context).
* the checkpointing policies: ``../checkpointing/measure_checkpointing.py``'s ``apply_policy``.
"""

from __future__ import annotations

import gc
import os
import sys
import time
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
TECHNIQUES = os.path.dirname(HERE)
sys.path.insert(0, TECHNIQUES)
sys.path.insert(0, os.path.join(TECHNIQUES, "loss"))

sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))      # validation/

import harness  # noqa: E402  (validation/harness.py)

CONFIGS = harness.load("oib_combinations_configs", os.path.join(HERE, "configs.py")).CONFIGS
loss_harness = harness.load("measure_loss", os.path.join(TECHNIQUES, "loss", "measure_loss.py"))
ckpt_harness = harness.load("measure_checkpointing",
                             os.path.join(TECHNIQUES, "checkpointing", "measure_checkpointing.py"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/oibcombovenv/bin/python validation/techniques/oib_combinations/measure_oib_combinations.py"
SETUP = ("python3 -m venv /tmp/oibcombovenv && /tmp/oibcombovenv/bin/pip install torch==2.13.0 transformers==5.23.0 "
         "&& /tmp/oibcombovenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0 && "
         "/tmp/oibcombovenv/bin/pip install bitsandbytes==0.50.2 (+ torchtune's import dependencies --no-deps)")


def _optimizer(params, cfg):
    if cfg["optimizer"] == "adamw-8bit-bnb":
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    if cfg["optimizer"] == "adamw-32bit-bnb":     # (PagedAdamW on CUDA: the same fp32 states, paged)
        import bitsandbytes as bnb
        return bnb.optim.AdamW32bit(params, lr=1e-4)
    return harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])


def optimizer_in_backward(model, cfg, mt_cell):
    """``harness.optimizer_in_backward`` (as ``measure_offload`` uses it) with the run's optimizer class
    (torchtune builds ``{p: config.instantiate(cfg_optimizer, [p]) for p in model.parameters()}``)."""
    return harness.optimizer_in_backward(model, lambda params: _optimizer(params, cfg), mt_cell)


def _forward(model, cfg, ctx):
    """The training step's forward: Hugging Face's (cross-entropy), or torchtune's chunked loss; the
    offload context (if any) around the base model only."""
    if cfg["loss"] == "cross_entropy":
        if ctx is None:
            return model
        return harness._BaseModelOffloaded(model, ctx)
    if ctx is None:
        return loss_harness.chunked_forward(model, cfg["loss_chunks"])
    n = cfg["loss_chunks"]
    loss_fn = loss_harness.CEWithChunkedOutputLoss(num_output_chunks=n, ignore_index=loss_harness.IGNORE)

    def forward(input_ids, labels, use_cache=False):      # chunked_forward with the base model offloaded
        with ctx():
            h = model.base_model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        logits = [F.linear(chunk, model.lm_head.weight) for chunk in h.chunk(n, dim=1)]
        del h
        labels = torch.hstack((labels[..., 1:], torch.full_like(labels[..., :1], loss_harness.IGNORE)))
        loss = loss_fn.forward(logits, labels)
        del logits
        return types.SimpleNamespace(loss=loss)
    return forward


def measure_run(cfg: dict) -> dict:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, input_ids = harness.build_model(cfg, ckpt_harness.apply_policy)
        mt_cell, extra = [], {}
        optims = optimizer_in_backward(model, cfg, mt_cell)
        offload, point = None, None
        if cfg["offload"] == "save_on_cpu":
            offload = harness.SimulatedSaveOnCpu(mt_cell)
            runner = _forward(model, cfg, offload.ctx)
            point = offload.point
        else:
            runner = _forward(model, cfg, None)
        layers, _ = harness._submodules(model)
        mt = harness.PhaseMemTracker()
        mt_cell.append(mt)
        mt.track_external(model, *optims, input_ids)
        if offload is not None:
            offload.attach(mt, model)
        alive, t_measured = harness.run_protocol(mt, runner, harness.Nothing(), input_ids, point=point,
                                                  autocast=harness.autocast_for(cfg))
        if offload is not None:
            extra["host"] = {"end_of_forward": alive["end_of_forward"]["host_bytes"]}
        t_end = time.perf_counter()
        record = harness.peak_record(mt)
        harness.fold_backward_sub_phases(record)
        harness.fill_optimizer_phase(record, alive)
        measured = {
            **record, "alive": alive,
            **harness.model_facts(model),
            **extra,
            "wall_s": round(time.perf_counter() - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, mt, input_ids, optims
    gc.collect()
    return measured


def _versions() -> dict:
    return harness.versions("transformers", "torchtune", "torchao", "bitsandbytes")


def main(argv=None) -> int:
    return harness.technique_main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure_run,
                         out=OUT, generator=GENERATOR, setup=SETUP, versions=_versions, threads=2, id_width=60,
                         incremental=True)


if __name__ == "__main__":
    sys.exit(main())
