"""Measure training iterations with the low-bit and new optimizers (configs.py), every phase.

    /tmp/lowbitvenv/bin/python validation/techniques/optimizers/measure_optimizers.py [--only ID ...]

Environment (torchao and bitsandbytes pinned, torch 2.13.0 CPU build):
    python3 -m venv /tmp/lowbitvenv && /tmp/lowbitvenv/bin/pip install torch==2.13.0 \
        transformers==5.23.0 torchao==0.18.0 bitsandbytes==0.50.2

Each run uses validation/measure.py's protocol (three iterations inside MemTracker, the third
measured, every phase's peak). torchao's optimizers ``torch.compile`` their per-parameter step,
which cannot be traced under MemTracker (a TorchDispatchMode; dynamo refuses to trace it), so for
them the tracked run takes the step eagerly (``torch.compile`` replaced by the identity: the
same state tensors, the eager step's temporaries recorded as ``optimizer_eager``), and the
compiled step's temporaries are measured on their own, in the same process after two compiled
warm-up steps: ``torch.profiler`` with ``profile_memory=True`` records every CPU allocation and
free of one ``optimizer.step()``; the peak of their running sum is the step's transient. The
optimizer phase of the record is then the bytes alive at the end of the backward (MemTracker)
plus that transient (inductor's CPU code; see README.md).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)

import measure as harness  # noqa: E402  (validation/measure.py)
import importlib.util  # noqa: E402

_spec = importlib.util.spec_from_file_location("optimizer_configs", os.path.join(HERE, "configs.py"))
_configs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_configs)
CONFIGS = _configs.CONFIGS

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

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
    if name in ("adamw-8bit-bnb", "adam-8bit"):
        import bitsandbytes as bnb
        cls = bnb.optim.AdamW8bit if name == "adamw-8bit-bnb" else bnb.optim.Adam8bit
        return cls(params, lr=1e-4), None
    if name == "muon":
        hidden, rest = muon_split(model)
        pair = (torch.optim.Muon(hidden, lr=0.02), torch.optim.AdamW(rest, lr=1e-4, **IMPL_KW[cfg["optimizer_impl"]]))
        return Pair(*pair), pair
    raise ValueError(name)


def compiled_step_transient(model, optimizer, input_ids) -> int:
    """The peak of one compiled ``optimizer.step()``'s own allocations (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    torch.compile = _COMPILE

    def fwd_bwd():
        optimizer.zero_grad(set_to_none=True)
        model(input_ids=input_ids, labels=input_ids, use_cache=False).loss.backward()

    for _ in range(2):
        fwd_bwd()
        optimizer.step()
    fwd_bwd()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        optimizer.step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    alive = peak = 0
    for e in events:
        alive += e.nbytes()
        peak = max(peak, alive)
    return int(peak)


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    kw = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    compiled = cfg["optimizer"] in TORCHAO
    if compiled:
        torch.compile = lambda fn, **_: fn          # the tracked run: the step eagerly
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
        model.train()
        optimizer, parts = build(cfg, model)
        input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
        mt = harness.PhaseMemTracker()
        mt.track_external(model, *(parts or (optimizer,)), input_ids)
        alive, _ = harness.run_protocol(mt, model, optimizer, input_ids)
        record = harness.peak_record(mt)
        params = [p for p in model.parameters()]
        record.update(alive=alive, parameters=sum(p.numel() for p in params), parameter_tensors=len(params),
                      parameter_dtype=str(params[0].dtype).replace("torch.", ""))
        if compiled:
            transient = compiled_step_transient(model, optimizer, input_ids)
            phases = record["peak_by_phase"]
            phases["optimizer_eager"] = phases.pop("optimizer")
            phases["optimizer"] = {"bytes": alive["end_of_backward"]["bytes"] + transient,
                                   "how": "end_of_backward (MemTracker) + compiled step transient (torch.profiler)"}
            record["compiled_step_transient_bytes"] = transient
            record["peak_bytes"] = max(phases["forward"]["bytes"], phases["backward"]["bytes"],
                                       phases["optimizer"]["bytes"])
        record["wall_s"] = round(time.perf_counter() - t0, 1)
    torch.compile = _COMPILE
    del model, optimizer, mt
    gc.collect()
    return record


def _versions() -> dict:
    import importlib.metadata as md
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "torchao": md.version("torchao"), "bitsandbytes": md.version("bitsandbytes")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID")
    ap.add_argument("--out", default=os.path.join(HERE, "measurements.json"))
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    by_id = {c["id"]: c for c in CONFIGS}
    todo = [by_id[i] for i in args.only] if args.only else list(CONFIGS)
    previous = harness.previous_runs(args.out, _versions())[0]
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = measure(cfg)
            msg = f"peak {run['measured']['peak_bytes']:,} B {run['measured']['wall_s']}s"
        except Exception as e:  # record and go on
            torch.compile = _COMPILE
            run["error"] = f"{type(e).__name__}: {e}"[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = "ERROR " + run["error"][:200]
        results[cfg["id"]] = run
        print(f"[{n}/{len(todo)}] {cfg['id']:<34} {msg}", flush=True)
        runs = [results.get(c["id"]) or previous.get(c["id"]) for c in CONFIGS]
        doc = {"generator": "/tmp/lowbitvenv/bin/python validation/techniques/optimizers/measure_optimizers.py",
               "environment": "python3 -m venv /tmp/lowbitvenv && /tmp/lowbitvenv/bin/pip install torch==2.13.0 "
                              "transformers==5.23.0 torchao==0.18.0 bitsandbytes==0.50.2",
               "python": platform.python_version(), **_versions(), "device": "cpu",
               "runs": [r for r in runs if r]}
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
        os.replace(args.out + ".tmp", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
