"""Measure training iterations with the low-bit and new optimizers (configs.py), every phase.

    /tmp/lowbitvenv/bin/python validation/techniques/optimizers/measure_optimizers.py [--only ID ...]

Environment (torchao and bitsandbytes pinned, torch 2.13.0 CPU build):
    python3 -m venv /tmp/lowbitvenv && /tmp/lowbitvenv/bin/pip install torch==2.13.0 \
        transformers==5.23.0 torchao==0.18.0 bitsandbytes==0.50.2

Each run uses validation/harness.py's protocol (three iterations inside MemTracker, the third
measured, every phase's peak). torchao's optimizers ``torch.compile`` their per-parameter step,
which cannot be traced under MemTracker (a TorchDispatchMode; dynamo refuses to trace it), so for
them the tracked run takes the step eagerly (``torch.compile`` replaced by the identity: the
same state tensors, the eager step's temporaries recorded as ``optimizer_eager``), and the
compiled step's temporaries are measured on their own, in the same process after two compiled
warm-up iterations, by the harness's memory timeline (``harness.profiled_iteration``:
``torch.profiler`` with ``profile_memory=True`` records every CPU allocation and free of the
iteration; the optimizer phase's peak of their running sum above the end of the backward is the
step's transient). The
optimizer phase of the record is then the bytes alive at the end of the backward (MemTracker)
plus that transient (inductor's CPU code; see README.md).
"""

from __future__ import annotations

import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import harness  # noqa: E402  (validation/harness.py)

CONFIGS = harness.load("optimizer_configs", os.path.join(HERE, "configs.py")).CONFIGS

import torch  # noqa: E402
import transformers  # noqa: E402

_COMPILE = torch.compile
TORCHAO = {"adamw-8bit-torchao": "AdamW8bit", "adamw-4bit-torchao": "AdamW4bit", "adamw-fp8-torchao": "AdamWFp8"}


IMPL_KW = {"foreach": {"foreach": True}, "fused": {"fused": True}, "for-loop": {"foreach": False}}


def muon_split(model):
    """torch.optim.Muon for every 2-D hidden matrix; the embedding, the LM head, the norms,
    biases and 3-D (fused expert) weights go to AdamW (Muon accepts only 2-D parameters)."""
    head = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    hidden, rest = [], []
    for p in model.parameters():
        (hidden if p.ndim == 2 and id(p) not in head else rest).append(p)
    return hidden, rest


class Pair:
    """Muon then AdamW, stepped and zeroed together."""

    def __init__(self, *optimizers):
        self.optimizers = optimizers

    def zero_grad(self, set_to_none=True):
        for o in self.optimizers:
            o.zero_grad(set_to_none=set_to_none)

    def step(self):
        for o in self.optimizers:
            o.step()


def build(cfg, model):
    name = cfg["optimizer"]
    params = [p for p in model.parameters() if p.requires_grad]
    if name in TORCHAO:
        import torchao.optim
        return getattr(torchao.optim, TORCHAO[name])(params, lr=1e-4), None
    if name in ("adamw-8bit-bnb", "adam-8bit", "adamw-32bit-bnb", "lion-32bit-bnb"):
        import bitsandbytes as bnb
        cls = {"adamw-8bit-bnb": bnb.optim.AdamW8bit, "adam-8bit": bnb.optim.Adam8bit,
               "adamw-32bit-bnb": bnb.optim.AdamW32bit, "lion-32bit-bnb": bnb.optim.Lion32bit}[name]
        return cls(params, lr=1e-4), None
    if name == "adamw-8bit-bnb-hf":
        # as transformers 5.23.0 trainer.py create_optimizer sets up an 8-bit bitsandbytes optimizer: after
        # building it, every nn.Embedding weight gets optim_bits=32 through GlobalOptimManager
        import bitsandbytes as bnb
        opt = bnb.optim.AdamW(params, lr=1e-4, optim_bits=8)
        manager = bnb.optim.GlobalOptimManager.get_instance()
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                manager.register_module_override(module, "weight", {"optim_bits": 32})
        return opt, None
    if name == "muon":
        hidden, rest = muon_split(model)
        pair = (torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=1e-4, **IMPL_KW[cfg["optimizer_impl"]]))
        return Pair(*pair), pair
    raise ValueError(name)


def compiled_step_transient(model, optimizer, input_ids) -> int:
    """The peak of one compiled ``optimizer.step()``'s own allocations (the profiler's memory timeline,
    ``harness.profiled_iteration``: two compiled warm-up iterations, then the measured one; its
    ``optimizer`` phase above the bytes alive at the end of the backward)."""
    torch.compile = _COMPILE
    timeline = harness.memory_timeline(harness.profiled_iteration(model, optimizer, input_ids))
    return int(timeline["peak_by_phase"]["optimizer"] - timeline["alive"]["end_of_backward"])


def measure(cfg: dict) -> dict:
    compiled = cfg["optimizer"] in TORCHAO
    if compiled:
        torch.compile = lambda fn, **_: fn          # the tracked run: the step eagerly
    box = {}

    def optimizer(run):
        opt, box["parts"] = build(cfg, run.model)
        return opt

    def track(run):
        run.mt.track_external(run.model, *(box["parts"] or (run.optimizer,)), run.input_ids)

    try:
        with harness.training_run(cfg, optimizer=optimizer, track=track) as run:
            model, mt, input_ids = run.model, run.mt, run.input_ids
            alive, _ = harness.run_protocol(mt, model, run.optimizer, input_ids)
            record = harness.peak_record(mt)
            params = [p for p in model.parameters()]
            record.update(alive=alive, parameters=sum(p.numel() for p in params), parameter_tensors=len(params),
                          parameter_dtype=str(params[0].dtype).replace("torch.", ""))
            if compiled:
                transient = compiled_step_transient(model, run.optimizer, input_ids)
                phases = record["peak_by_phase"]
                phases["optimizer_eager"] = phases.pop("optimizer")
                phases["optimizer"] = {"bytes": alive["end_of_backward"]["bytes"] + transient,
                                       "how": "end_of_backward (MemTracker) + compiled step transient (torch.profiler)"}
                record["compiled_step_transient_bytes"] = transient
                record["peak_bytes"] = max(phases["forward"]["bytes"], phases["backward"]["bytes"],
                                           phases["optimizer"]["bytes"])
            record["wall_s"] = round(time.perf_counter() - run.t0, 1)
            return record
    finally:
        torch.compile = _COMPILE


def _versions() -> dict:
    import importlib.metadata as md
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "torchao": md.version("torchao"), "bitsandbytes": md.version("bitsandbytes")}


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/lowbitvenv/bin/python validation/techniques/optimizers/measure_optimizers.py",
            "environment": "python3 -m venv /tmp/lowbitvenv && /tmp/lowbitvenv/bin/pip install torch==2.13.0 "
                           "transformers==5.23.0 torchao==0.18.0 bitsandbytes==0.50.2",
            "python": platform.python_version(), **_versions(), "device": "cpu", "runs": runs}


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure, document=document,
                 out=os.path.join(HERE, "measurements.json"), versions=_versions, keep_previous="always",
                 incremental=True, summary=lambda m: f"peak {m['peak_bytes']:,} B {m['wall_s']}s",
                 line=lambda n, t, c, msg: f"[{n}/{t}] {c['id']:<34} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
