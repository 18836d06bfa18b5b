#!/usr/bin/env python
"""Measure torchao's CPUOffloadOptimizer on the CPU, its accelerator simulated.

    /tmp/lowbitvenv/bin/python validation/techniques/cpu_offload/measure_cpu_offload.py [--only ID ...]

Environment (its own, pinned)::

    python3 -m venv /tmp/lowbitvenv
    /tmp/lowbitvenv/bin/pip install torch==2.13.0 transformers==5.23.0 torchao==0.18.0

torchao 0.18's ``torchao/optim/cpu_offload.py`` refuses a CPU device (lines 55-59: ``assert
self.device in ["cuda", "xpu"]``) and uses CUDA streams and pinned memory. Its own code runs here
unchanged, with only what it asks of the accelerator stood in for (``_simulated_accelerator``):

* ``get_available_devices()`` answers ``cuda``, and the module's ``torch`` is a proxy whose
  ``cuda`` is a stand-in: ``Stream`` / ``current_stream`` / ``record_event`` / ``synchronize`` do
  nothing (one CPU stream: every copy is complete when it returns), and ``torch.cuda.stream(s)``,
  the side stream on which torchao makes its device-to-host and host-to-device copies (lines
  71-72, 134-135), disables the tracker's dispatch mode: those copies are host work, and in-place
  (``copy_``), so they allocate nothing on the device either way.
* ``torch.empty_like(..., device="cpu", pin_memory=True)`` (lines 99-100: the host parameter
  copy ``p_host`` and its gradient buffer ``p_host.grad``) allocates outside the tracker, without
  pinning (a CPU build has no pinned-memory allocator); the bytes are tallied as host memory.
* ``Tensor.record_stream`` (line 83, with ``offload_gradients=True``) does nothing: on a GPU it
  delays the reuse of the freed gradient's block, not its release from the allocated bytes.
* Each host optimizer's ``step`` (line 128) runs with the tracker's mode disabled, and the
  tracker does not adopt those optimizers' states (``_track_optimizer_states``): they are host
  memory. The device optimizer ``d_opt`` of the tensors under ``minimal_size`` (lines 94-96,
  113-114, 123-124) is tracked like any optimizer.

So the tracker sees exactly what stays on the "device": the model, the activations, the device
gradients (freed one by one after their copy with ``offload_gradients=True``), the small tensors'
optimizer state; the host tensors are counted beside it (``measured.host``). Every run is
``validation/harness.py``'s protocol (three iterations, the third measured).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))      # validation/

import harness  # noqa: E402  (validation/harness.py)

CONFIGS = harness.load("cpu_offload_configs", os.path.join(HERE, "configs.py")).CONFIGS

import torch  # noqa: E402
from torch.utils._python_dispatch import _disable_current_modes  # noqa: E402

import torchao.optim.cpu_offload as _co  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/lowbitvenv/bin/python validation/techniques/cpu_offload/measure_cpu_offload.py"
SETUP = ("python3 -m venv /tmp/lowbitvenv && /tmp/lowbitvenv/bin/pip install torch==2.13.0 transformers==5.23.0 "
         "torchao==0.18.0")


def _nbytes(t) -> int:
    return t.numel() * t.element_size()


class _Event:
    def synchronize(self):
        pass


class _Stream:
    def wait_stream(self, other):
        pass

    def record_event(self):
        return _Event()

    def synchronize(self):
        pass


class _Accelerator:
    """What torchao calls of ``torch.cuda``: streams that do nothing; the side stream's copies run
    outside the tracker (host work)."""
    Stream = _Stream

    @staticmethod
    def current_stream():
        return _Stream()

    @staticmethod
    def stream(_stream):
        return _disable_current_modes()


class _TorchProxy:
    """``torch`` as ``torchao/optim/cpu_offload.py`` sees it: ``cuda`` stood in, ``empty_like`` with
    ``pin_memory`` allocating an untracked host tensor (tallied in ``host``)."""

    def __init__(self, host: list):
        self.cuda = _Accelerator
        self._host = host

    def __getattr__(self, name):
        return getattr(torch, name)

    def empty_like(self, t, *args, pin_memory=False, **kwargs):
        with _disable_current_modes():
            out = torch.empty_like(t, *args, **kwargs)
        if pin_memory:
            self._host.append(out)
        return out


@contextlib.contextmanager
def _simulated_accelerator(host: list):
    saved = (_co.torch, _co.get_available_devices, torch.Tensor.record_stream)
    _co.torch = _TorchProxy(host)
    _co.get_available_devices = lambda: ["cpu", "cuda"]
    torch.Tensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        _co.torch, _co.get_available_devices, torch.Tensor.record_stream = saved


class _Tracker(harness.PhaseMemTracker):
    """The phase tracker, blind to the host optimizers' states, and to a gradient torchao has
    already freed when the tracker's own post-accumulate-grad hook runs (``p.grad`` is None)."""

    def __init__(self, host_optimizers):
        super().__init__()
        self._host_optimizers = host_optimizers

    def _track_optimizer_states(self, reftype, optimizer):
        if any(optimizer is o for o in self._host_optimizers):
            return
        super()._track_optimizer_states(reftype, optimizer)

    def _update_and_maybe_create_winfos(self, t, reftype, update_existing=False):
        if t is None:
            return set()
        return super()._update_and_maybe_create_winfos(t, reftype, update_existing)


def _untracked_step(optimizer):
    step = optimizer.step

    def host_step(*args, **kwargs):
        with _disable_current_modes():
            return step(*args, **kwargs)
    optimizer.step = host_step


def _host_bytes(opt) -> dict:
    params = sum(_nbytes(p) for p in opt.param_d2h_map.values())
    grads = sum(_nbytes(p.grad) for p in opt.param_d2h_map.values())
    state = [v for o in opt.optim_dict.values() for s in o.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
    return {"parameter_copies": params, "gradient_buffers": grads, "optimizer_state": sum(_nbytes(t) for t in state),
            "optimizer_state_tensors": len(state), "total": params + grads + sum(_nbytes(t) for t in state)}


def measure_run(cfg: dict) -> dict:
    t0 = time.perf_counter()
    opts = cfg["technique_options"]
    host: list = []
    with warnings.catch_warnings(), _simulated_accelerator(host):
        warnings.simplefilter("ignore")
        model, input_ids = harness.build_model(cfg)
        opt = _co.CPUOffloadOptimizer(list(model.parameters()), torch.optim.AdamW,
                                      offload_gradients=opts["offload_gradients"], minimal_size=opts["minimal_size"],
                                      lr=1e-4, weight_decay=0.01, **opts["optimizer_kwargs"])
        for o in opt.optim_dict.values():
            _untracked_step(o)
        layers, _ = harness._submodules(model)
        mt = _Tracker(list(opt.optim_dict.values()))
        mt.track_external(model, input_ids, *([opt.d_opt] if opt.d_opt is not None else []))
        alive, t_measured = harness.run_protocol(mt, model, opt, input_ids, autocast=harness.autocast_for(cfg))
        t_end = time.perf_counter()
        record = harness.peak_record(mt)
        # no op ran on the device in the step: the bytes alive are the phase's
        harness.fill_optimizer_phase(record, alive, "(no device op ran: the bytes alive at the step's end)")
        small = [p for p in model.parameters() if p.numel() < opts["minimal_size"]]
        measured = {
            **record,
            "alive": alive,
            "host": {**_host_bytes(opt), "pinned_allocations": len(host),
                     "pinned_bytes": sum(_nbytes(t) for t in host)},
            "device_optimizer": {
                "tensors": len(small), "elements": sum(p.numel() for p in small),
                "state_bytes": sum(_nbytes(v) for s in (opt.d_opt.state.values() if opt.d_opt else ())
                                   for v in s.values() if isinstance(v, torch.Tensor))},
            "layer_forward_retained_bytes": harness.layer_forward_deltas(mt, layers),
            **harness.model_facts(model),
            "offloaded_tensors": len(opt.param_d2h_map),
            "wall_s": round(time.perf_counter() - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, mt, input_ids, opt
    gc.collect()
    return measured


def _versions() -> dict:
    return harness.versions("transformers", "torchao")


def _summary(m) -> str:
    return (f"peak {m['peak_bytes']:>12,} B in {m['peak_phase']:<9} host {m['host']['total']:>12,} B "
            f"{m['wall_s']:5.1f}s")


def main(argv=None) -> int:
    return harness.technique_main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure_run,
                         out=OUT, generator=GENERATOR, setup=SETUP, versions=_versions, summary=_summary)


if __name__ == "__main__":
    sys.exit(main())
