#!/usr/bin/env python
"""Measure activation offloading and the optimizer step fused into the backward, on the CPU.

    /tmp/offloadvenv/bin/python validation/techniques/offload/measure_offload.py [--only ID ...]

Environment (its own, pinned; torchtune 0.6.1 needs torchao <= 0.13)::

    python3 -m venv /tmp/offloadvenv
    /tmp/offloadvenv/bin/pip install torch==2.13.0 transformers==5.23.0
    /tmp/offloadvenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0

Every run is ``validation/harness.py``'s protocol (``run_protocol``: three iterations, the third
measured, every phase's peak from ``PhaseMemTracker``) on the model of ``configs.py``, with the
technique applied as the library does it:

* ``optimizer_in_backward``: torchtune's ``optimizer_in_bwd`` (``torchtune/training/memory.py``,
  ``create_optim_in_bwd_wrapper`` / ``register_optim_in_bwd_hooks``): one optimizer per parameter,
  and ``p.register_post_accumulate_grad_hook`` runs ``opt[p].step(); opt[p].zero_grad()`` as soon as
  the parameter's gradient is accumulated (PyTorch tutorial "How to save memory by fusing the
  optimizer step into the backward pass"). The loop's own ``zero_grad`` and ``step`` do nothing
  (torchtune's recipes skip them), so the "optimizer" phase holds the states only.
* activation offload: see ``measure_activation_offload``.

The runs are written to ``measurements.json`` beside this file with the exact command and
environment; ``tests/measured/test_technique_offload.py`` compares them with the estimator (no torch).
"""

from __future__ import annotations

import gc
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))      # validation/

import harness  # noqa: E402  (validation/harness.py)

CONFIGS = harness.load("offload_configs", os.path.join(HERE, "configs.py")).CONFIGS

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/offloadvenv/bin/python validation/techniques/offload/measure_offload.py"
SETUP = ("python3 -m venv /tmp/offloadvenv && /tmp/offloadvenv/bin/pip install torch==2.13.0 transformers==5.23.0 && "
         "/tmp/offloadvenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0")


def optimizer_in_backward(model, cfg, mt_cell):
    """torchtune's optimizer in the backward (``harness.optimizer_in_backward``), one
    ``validation/harness.py`` optimizer of the run's kind per parameter."""
    return harness.optimizer_in_backward(
        model, lambda params: harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"]), mt_cell)


def measure_run(cfg: dict) -> dict:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, input_ids = harness.build_model(cfg)
        extra, mt_cell = {}, []
        offload = None
        if cfg["technique"] == "optimizer_in_backward":
            optims = optimizer_in_backward(model, cfg, mt_cell)
            loop_optimizer = harness.Nothing()
            tracked = optims
            runner, point = model, None
        elif cfg["technique"] == "save_on_cpu":
            offload = harness.SimulatedSaveOnCpu(mt_cell)
            loop_optimizer = harness.build_optimizer(list(model.parameters()), cfg["optimizer"],
                                                      cfg["optimizer_impl"])
            tracked = [loop_optimizer]
            runner = harness._BaseModelOffloaded(model, offload.ctx)
            point = offload.point
        else:
            raise ValueError(cfg["technique"])
        layers, named = harness._submodules(model)
        mt = harness.PhaseMemTracker()
        mt_cell.append(mt)
        mt.track_external(model, *tracked, input_ids)
        if offload is not None:
            ledger = offload.attach(mt, model)
        alive, t_measured = harness.run_protocol(mt, runner, loop_optimizer, input_ids, point=point)
        if offload is not None:
            extra["host"] = {"peak_by_phase": ledger.peak_by_phase, "end_of_forward": alive["end_of_forward"]["host_bytes"],
                             "packed_in_measured_forward": {k: v for k, v in ledger.packed.items() if k != "detail"}}
        t_end = time.perf_counter()
        record = harness.peak_record(mt)
        harness.fold_backward_sub_phases(record)
        harness.fill_optimizer_phase(record, alive)
        measured = {
            **record,
            "alive": alive,
            "layer_forward_retained_bytes": harness.layer_forward_deltas(mt, layers),
            **harness.model_facts(model),
            "largest_parameter_tensor": max(p.numel() for p in model.parameters()),
            **extra,
            "wall_s": round(time.perf_counter() - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, mt, input_ids
    gc.collect()
    return measured


def _versions() -> dict:
    return harness.versions("transformers", "torchtune", "torchao")


def main(argv=None) -> int:
    return harness.technique_main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure_run,
                         out=OUT, generator=GENERATOR, setup=SETUP, versions=_versions)


if __name__ == "__main__":
    sys.exit(main())
