#!/usr/bin/env python
"""torchtune 0.6.1's activation offloading (``enable_activation_offloading``) under LoRA, with full activation
checkpointing, per-block compile and the chunked loss: measured on the CPU with the offload's device/host split
simulated (issue 25, item 2).

    nice -n 10 /tmp/lossvenv/bin/python validation/lora_offload/measure_lora_offload.py [--only ID ...]
    # writes validation/lora_offload/measurements.json; /tmp/lossvenv: torch==2.13.0 (CPU), torchtune==0.6.1,
    # torchao==0.13.0 (validation/compile/measure_blocks.py's environment)

What runs: ``validation/compile/measure_blocks.py``'s harness (torchtune's own ``lora_llama3_2`` builder, the
recipe's order ``training.compile_model``, then ``training.set_activation_checkpointing``; the recipe's
``CEWithChunkedOutputLoss`` with ``compile_loss``; the profiler's memory timeline, two warm-ups, the third
iteration measured) with the model's call wrapped as ``lora_finetune_single_device._loss_step`` wraps it
(recipes/lora_finetune_single_device.py:643-644, ``with self.activations_handling_ctx: logits =
self._model(**batch)``), the context made by torchtune's own ``get_act_offloading_ctx_manager(model, True)``
(torchtune/training/_activation_offloading.py:386-446: the ``NoOpManager`` hooks on the output head, here the
``TiedLinear``'s ``linear``) with its ``OffloadActivations`` replaced by ``SimulatedOffloadActivations``.

``SimulatedOffloadActivations`` is torchtune 0.6.1's ``OffloadActivations`` with ``use_streams=True`` (the default;
``_activation_offloading.py`` lines 66-338) line for line, its CUDA parts replaced, because its constructor calls
``torch.cuda.default_stream()`` (line 90) and its unpack copies to ``"cuda"`` (lines 197, 246):

* the host copy (``torch.empty_like(activation, pin_memory=..., device="cpu")`` + ``copy_``, lines 166-182) is a
  tensor on numpy-allocated memory: the profiler's memory timeline (the CPU allocator's events) does not see it,
  so what the timeline measures is the device's memory; a ledger counts the host bytes (``host`` in the record);
* the copy back (``maybe_gpu_tensor.to("cuda", non_blocking=True)``, line 246) is ``clone()``: a new device tensor
  the timeline sees;
* streams, events, ``wait_event``/``wait_stream`` and ``record_stream`` do nothing (one CPU stream: every copy is
  complete when it returns); the dictionaries that keep tensors alive (``fwd_stash``, ``bwd_tensor_stash``,
  ``bwd_ev_stash``, ``tracker``) and when entries leave them are torchtune's, so what the device holds at every
  moment is what a CUDA run's allocator counts as allocated, the caching allocator's stream-ordered reuse aside.

The record's ``packs`` lists what the pack hook was given in the measured forward (bytes, dtype, whether it was
offloaded), the sequence the fwd_stash rule (``id <= tensor_id - max_fwd_stash_size``, line 156) runs on.
``tests/measured/test_lora_offload.py`` compares every phase with the estimator (no torch).
"""

from __future__ import annotations

import contextlib
import os
import platform
import sys
import types
import weakref

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(VALIDATION, "compile"))
sys.path.insert(0, VALIDATION)

import harness  # noqa: E402  (validation/harness.py)
import measure_blocks  # noqa: E402  (validation/compile/measure_blocks.py)
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.autograd.graph import saved_tensors_hooks  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
DEBUG = False       # True: print every unpack and node hook with the stashes (the trace the derivation was read from)
GENERATOR = "/tmp/lossvenv/bin/python validation/lora_offload/measure_lora_offload.py"

# The README command's LoRA set (llama3_2/3B_lora_single_device.yaml: lora_attn_modules [q_proj, v_proj,
# output_proj], apply_lora_to_mlp True), as torchtune's builder names them and as the profile's LoRAConfig does.
measure_blocks.LORA["readme"] = {"attn": ["q_proj", "v_proj", "output_proj"], "mlp": True,
                                 "targets": ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}


def _cfg(regime, compile="blocks", *, layers=8, b=2, seq=512, vocab=1024, kv=8, lora="readme", rank=8,
         offload=True):
    cfg = measure_blocks._cfg(regime, compile, b=b, seq=seq, layers=layers, kv=kv, vocab=vocab, loss="chunked",
                              policy="full", lora=lora)
    if rank != 8:
        cfg["lora"] = dict(cfg["lora"], rank=rank, alpha=2 * rank)
        cfg["id"] += f"-r{rank}"
    if offload:
        cfg["id"] += "-offload"
        cfg["offload"] = "torchtune"
    return cfg


CONFIGS = [
    # the README's settings scaled down: bf16, compile, full checkpointing, the chunked loss, its LoRA set
    _cfg("bf16"), _cfg("bf16", offload=False),
    _cfg("bf16", layers=3, seq=256, b=1),
    _cfg("bf16", layers=6, kv=2),
    _cfg("fp32"), _cfg("fp32", layers=4, lora="qv"),
    _cfg("bf16", vocab=32000, layers=4, b=1),
    # the adapters' gradients born block by block outgrow the offloaded inputs: the first block's backward is the
    # peak (the README's 3B at rank 64 is such a run: 27 layers' gradients, 6.4 MB each, against 50 MB inputs)
    _cfg("bf16", layers=4, b=1, seq=256, rank=64), _cfg("bf16", layers=16),
    # the rank-64 run's twin without offloading: its lower blocks' backward (their adapters' gradients born, fewer
    # inputs left) against compile.lora_full_terms' top-block moment
    _cfg("bf16", layers=4, b=1, seq=256, rank=64, offload=False),
]


class HostLedger:
    """The host copies alive (bytes) and their maximum since ``reset``."""

    def __init__(self):
        self.current = self.peak = 0

    def reset(self):
        self.peak = self.current

    def add(self, n):
        self.current += n
        self.peak = max(self.peak, self.current)

    def free(self, n):
        self.current -= n


class _Event:
    """A CUDA event on one CPU stream: already complete."""


class _Stream:
    def wait_event(self, ev):
        pass

    def wait_stream(self, s):
        pass

    def record_event(self):
        return _Event()


def _host_empty_like(t, ledger):
    """``torch.empty_like(t, device="cpu")`` on memory numpy allocates (outside the CPU allocator the profiler
    records); the ledger counts its bytes while it lives."""
    n = t.numel() * t.element_size()
    buf = torch.from_numpy(np.empty(n, dtype=np.uint8)).view(t.dtype).view(t.shape)
    ledger.add(n)
    weakref.finalize(buf, ledger.free, n)
    return buf


class SimulatedOffloadActivations(saved_tensors_hooks):
    """torchtune 0.6.1 ``OffloadActivations(use_pin_memory=True, use_streams=True, max_fwd_stash_size=5,
    min_offload_size=1024)`` (torchtune/training/_activation_offloading.py:66-338), its CUDA parts simulated
    (the module docstring). ``packs``: what the last forward's pack hook was given."""

    ledger = None       # set per run

    def __init__(self, use_pin_memory=True, use_streams=True, max_fwd_stash_size=5, min_offload_size=1024):
        assert use_streams, "the recipes' default"
        ledger = SimulatedOffloadActivations.ledger
        self.min_tensor_size_bytes = min_offload_size
        self.tracker = {}
        self.tensor_id = 0
        self.is_first_forward_call = True
        self.is_first_backward_call = True
        self.is_first_forward_pass = True
        self.s0 = _Stream()                     # torch.cuda.default_stream()
        self.s1 = _Stream()                     # torch.cuda.Stream()
        self.fwd_stash = {}
        self.max_fwd_stash_size = max_fwd_stash_size
        self.bwd_tensor_stash = {}
        self.bwd_ev_stash = {}
        self.curr_graph_id = None
        self.curr_autograd_node = None
        self.packs = []

        def pack_tensor(activation):            # lines 135-192
            if self.is_first_forward_call:
                assert len(self.tracker) == 0, "backward pass should have cleared tracker of all tensors"
                self.is_first_forward_call = False
                self.is_first_backward_call = True
                self.packs = []
            num_bytes = activation.element_size() * activation.nelement()
            self.tensor_id += 1
            tensor_id = self.tensor_id
            offload = num_bytes >= self.min_tensor_size_bytes and (
                not isinstance(activation, torch.nn.Parameter) and not isinstance(activation, torch.nn.Buffer))
            self.packs.append([num_bytes, str(activation.dtype).replace("torch.", ""), offload])
            if offload:
                for id in [k for k in self.fwd_stash.keys()]:
                    if id <= tensor_id - self.max_fwd_stash_size:
                        _, ev = self.fwd_stash[id]
                        self.s0.wait_event(ev)
                        del self.fwd_stash[id]
                    else:
                        break
                self.s1.wait_stream(self.s0)
                cpu_tensor = _host_empty_like(activation, ledger)
                cpu_tensor.copy_(activation)
                self.tracker[tensor_id] = (cpu_tensor, True)
                event = self.s1.record_event()
                self.fwd_stash[tensor_id] = (activation, event)
            else:
                self.tracker[tensor_id] = (activation, False)
            return tensor_id

        def unpack_tensor_with_streams(unpack_tensor_id):       # lines 214-338
            if self.is_first_backward_call:
                self.curr_graph_id = torch._C._current_graph_task_id()

                def wait_and_del_remaining_references():
                    for id in [k for k in self.bwd_tensor_stash.keys()]:
                        event = self.bwd_ev_stash[id]
                        self.s1.wait_event(event)
                        del self.bwd_tensor_stash[id]

                torch.autograd.variable.Variable._execution_engine.queue_callback(wait_and_del_remaining_references)
                if self.is_first_forward_pass:
                    self.is_first_forward_pass = False
                self.is_first_backward_call = False
                self.is_first_forward_call = True
            assert unpack_tensor_id in self.tracker, f"untracked tensor with id {unpack_tensor_id}"
            maybe_gpu_tensor, modified = self.tracker[unpack_tensor_id]
            if DEBUG:
                print("unpack", unpack_tensor_id, modified, unpack_tensor_id in self.fwd_stash, sorted(self.fwd_stash),
                      sorted(self.bwd_tensor_stash), torch._C._current_autograd_node().name())
            if modified:
                graph_id = torch._C._current_graph_task_id()
                node = torch._C._current_autograd_node()
                prev_node_ids = []
                if graph_id == self.curr_graph_id and self.curr_autograd_node != node:
                    self.curr_autograd_node = node
                    prev_node_ids = [id for id in self.bwd_tensor_stash.keys()]
                brought_back_from_cpu = True
                if unpack_tensor_id in self.fwd_stash:
                    maybe_gpu_tensor = self.fwd_stash[unpack_tensor_id][0]
                    brought_back_from_cpu = False
                else:
                    maybe_gpu_tensor = maybe_gpu_tensor.clone()      # .to("cuda", non_blocking=True) on s1
                    self.s0.wait_stream(self.s1)
                    self.bwd_tensor_stash[unpack_tensor_id] = maybe_gpu_tensor
                    storage_refcount = torch._C._storage_Use_Count(maybe_gpu_tensor.untyped_storage()._cdata)

                def hook(outputs, inputs):
                    if DEBUG:
                        print("hook", unpack_tensor_id, sorted(self.fwd_stash), sorted(self.bwd_tensor_stash), prev_node_ids)
                    if brought_back_from_cpu:
                        unpacked_tensor = self.bwd_tensor_stash[unpack_tensor_id]
                        if torch._C._storage_Use_Count(unpacked_tensor.untyped_storage()._cdata) > storage_refcount:
                            # unpacked_tensor.record_stream(self.s0): the one stream's work is done
                            del self.bwd_tensor_stash[unpack_tensor_id]
                        else:
                            event = self.s0.record_event()
                            self.bwd_ev_stash[unpack_tensor_id] = event
                    for id in [k for k in self.fwd_stash.keys()]:
                        _, ev = self.fwd_stash[id]
                        self.s0.wait_event(ev)
                        del self.fwd_stash[id]
                    for id in prev_node_ids:
                        event = self.bwd_ev_stash[id]
                        self.s1.wait_event(event)
                        del self.bwd_tensor_stash[id]
                    return outputs

                node.register_hook(hook)
            del self.tracker[unpack_tensor_id]
            return maybe_gpu_tensor

        super().__init__(pack_tensor, unpack_tensor_with_streams)


class OffloadStep(measure_blocks.Step):
    """``measure_blocks.Step`` with the model's call inside the recipe's ``activations_handling_ctx``
    (recipes/lora_finetune_single_device.py:484-486 and 643-644)."""

    def __init__(self, model, loss_fn, ignore_index=-100):
        super().__init__(model, loss_fn, ignore_index)
        from torchtune.training import _activation_offloading as tt_offload
        real = tt_offload.OffloadActivations
        tt_offload.OffloadActivations = SimulatedOffloadActivations
        try:
            self.ctx = tt_offload.get_act_offloading_ctx_manager(model, True)
        finally:
            tt_offload.OffloadActivations = real
        assert isinstance(self.ctx, SimulatedOffloadActivations)
        self.host = {}

    def forward(self, input_ids, labels, use_cache=False):
        ledger = SimulatedOffloadActivations.ledger
        ledger.reset()
        with self.ctx:
            logits = self.model(input_ids)
        self.host = {"end_of_forward": ledger.current, "forward_peak": ledger.peak}
        ignore = torch.full((labels.shape[0], 1), self.ignore_index, dtype=labels.dtype, device=labels.device)
        labels = torch.hstack((labels[..., 1:], ignore))
        if not isinstance(logits, list):
            labels = labels.reshape(-1)
            logits = logits.reshape(-1, logits.size(-1))
        loss = self.loss_fn(logits, labels)
        del logits
        return types.SimpleNamespace(loss=loss)


def measure(cfg: dict) -> dict:
    if not cfg.get("offload"):
        return measure_blocks.measure(cfg)
    ledger = SimulatedOffloadActivations.ledger = HostLedger()
    steps = []

    class _Step(OffloadStep):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            steps.append(self)

    real = measure_blocks.Step
    measure_blocks.Step = _Step
    try:
        record = measure_blocks.measure(cfg)
    finally:
        measure_blocks.Step = real
    step = steps[-1]
    record["host"] = {**step.host, "after_backward": ledger.current}
    record["packs"] = step.ctx.packs
    return record


def document(args, runs, ctx) -> dict:
    import torchtune
    return {"generator": GENERATOR, "python": platform.python_version(), "torch": torch.__version__,
            "torchtune": torchtune.__version__, "device": "cpu", "threads": torch.get_num_threads(),
            "timeline": "harness.profiled_iteration / memory_timeline; host copies outside the CPU allocator",
            "runs": runs}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=OUT, incremental=True, keep_previous="always",
                        summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<70} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
