#!/usr/bin/env python
"""Measure activation offloading and the optimizer step fused into the backward, on the CPU.

    /tmp/offloadvenv/bin/python validation/techniques/offload/measure_offload.py [--only ID ...]

Environment (its own, pinned; torchtune 0.6.1 needs torchao <= 0.13)::

    python3 -m venv /tmp/offloadvenv
    /tmp/offloadvenv/bin/pip install torch==2.13.0 transformers==5.23.0
    /tmp/offloadvenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0

Every run is ``validation/measure.py``'s protocol (``run_protocol``: three iterations, the third
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
environment; ``tests/test_technique_offload.py`` compares them with the estimator (no torch).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.metadata
import json
import os
import platform
import sys
import time
import traceback
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, VALIDATION)

import importlib.util  # noqa: E402

import measure as _measure  # noqa: E402  (validation/measure.py)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIGS = _load("offload_configs", os.path.join(HERE, "configs.py")).CONFIGS

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/offloadvenv/bin/python validation/techniques/offload/measure_offload.py"
SETUP = ("python3 -m venv /tmp/offloadvenv && /tmp/offloadvenv/bin/pip install torch==2.13.0 transformers==5.23.0 && "
         "/tmp/offloadvenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0")


def _build(cfg):
    torch.manual_seed(0)
    kw = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
    model.train()
    if cfg["checkpointing"] == "full":
        model.gradient_checkpointing_enable()
    input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    return model, input_ids


class _Nothing:
    """The training loop's ``zero_grad`` and ``step`` under optimizer-in-backward: nothing to do."""

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


def optimizer_in_backward(model, cfg, mt_cell):
    """torchtune 0.6.1 ``torchtune/training/memory.py``: ``optim_dict = {p: Optimizer([p]) for p in
    model.parameters()}``; ``register_optim_in_bwd_hooks``: ``optim_step(param)`` =
    ``optim_dict[param].step(); optim_dict[param].zero_grad()`` on every trainable parameter's
    post-accumulate-grad hook."""
    optims = {p: _measure.build_optimizer([p], cfg["optimizer"], cfg["optimizer_impl"])
              for p in model.parameters() if p.requires_grad}

    head = model.get_output_embeddings().weight

    def step(param):
        optims[param].step()
        optims[param].zero_grad()
        if param is head and mt_cell and mt_cell[0].phase == "backward":
            # (for the record only: the backward's peak after the LM head's step, the layers' moments)
            mt_cell[0].phase = "backward_after_lm_head"

    for p in optims:
        p.register_post_accumulate_grad_hook(step)
    return list(optims.values())


class _Examples:
    """validation/examples/measure_examples.py's save_on_cpu as it behaves with a GPU (``SimulatedSaveOnCpu``:
    pack copies each saved tensor into a host tensor made outside the tracker, tallied by ``HostLedger``;
    unpack copies it back to a new tracked "device" tensor), imported, not copied."""

    module = None

    @classmethod
    def get(cls):
        if cls.module is None:
            sys.path.insert(0, os.path.join(VALIDATION, "examples"))
            sys.path.insert(0, os.path.join(VALIDATION, "parallel"))
            cls.module = _load("measure_examples", os.path.join(VALIDATION, "examples", "measure_examples.py"))
        return cls.module


class _BaseModelOffloaded(torch.nn.Module):
    """The training step's ``model(input_ids=..., labels=...)``, with the offload context around the base
    model only, as torchtune's recipes place ``activations_handling_ctx``: ``with ctx: logits =
    model(tokens)``, the output head excluded (``get_act_offloading_ctx_manager``'s NoOpManager on
    ``model.output``) and the loss computed outside. Same ops as Hugging Face's ``LlamaForCausalLM.forward``
    (``hidden = self.model(...)``; ``logits = self.lm_head(hidden)``; ``self.loss_function(...)``)."""

    def __init__(self, model, ctx):
        super().__init__()
        self.inner, self.ctx = model, ctx

    def forward(self, input_ids, labels, use_cache=False):
        m = self.inner
        with self.ctx():
            hidden = m.model(input_ids=input_ids, use_cache=use_cache).last_hidden_state
        logits = m.lm_head(hidden)
        del hidden
        loss = m.loss_function(logits=logits, labels=labels, vocab_size=m.config.vocab_size)
        return types.SimpleNamespace(loss=loss)


def measure_run(cfg: dict) -> dict:
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, input_ids = _build(cfg)
        extra, mt_cell = {}, []
        if cfg["technique"] == "optimizer_in_backward":
            optims = optimizer_in_backward(model, cfg, mt_cell)
            loop_optimizer = _Nothing()
            tracked = optims
            runner, point = model, None
        elif cfg["technique"] == "save_on_cpu":
            ex = _Examples.get()
            loop_optimizer = _measure.build_optimizer(list(model.parameters()), cfg["optimizer"],
                                                      cfg["optimizer_impl"])
            tracked = [loop_optimizer]
            holder = {}
            runner = _BaseModelOffloaded(model, lambda: ex.SimulatedSaveOnCpu(holder["ledger"]))

            def point():
                d = _measure._point(mt_cell[0])
                d["host_bytes"] = holder["ledger"].current
                return d
        else:
            raise ValueError(cfg["technique"])
        layers, named = _measure._submodules(model)
        mt = _measure.PhaseMemTracker()
        mt_cell.append(mt)
        mt.track_external(model, *tracked, input_ids)
        if cfg["technique"] == "save_on_cpu":
            ledger = holder["ledger"] = ex.HostLedger(mt, model)
            reset = mt.reset_phase_stats

            def reset_both():       # run_protocol calls it just before the measured iteration
                reset()
                ledger.reset()
            mt.reset_phase_stats = reset_both
        alive, t_measured = _measure.run_protocol(mt, runner, loop_optimizer, input_ids, point=point)
        if cfg["technique"] == "save_on_cpu":
            extra["host"] = {"peak_by_phase": ledger.peak_by_phase, "end_of_forward": alive["end_of_forward"]["host_bytes"],
                             "packed_in_measured_forward": {k: v for k, v in ledger.packed.items() if k != "detail"}}
        t_end = time.perf_counter()
        record = _measure.peak_record(mt)
        phases = record["peak_by_phase"]
        sub = phases.get("backward_after_lm_head")
        if sub is not None:       # the backward is both sub-phases
            record["backward_sub_phases"] = {"backward_to_lm_head_step": phases["backward"],
                                             "backward_after_lm_head": phases.pop("backward_after_lm_head")}
            if sub["bytes"] > phases["backward"]["bytes"]:
                phases["backward"] = sub
            if record["peak_phase"] == "backward_after_lm_head":
                record["peak_phase"] = "backward"
        if "optimizer" not in phases:     # no op ran in the loop's step: what is alive is the phase's bytes
            end = alive["end_of_step"]
            phases["optimizer"] = {"bytes": end["bytes"], "by_category": end["by_category"], "op": None,
                                   "module": "(no op ran: the bytes alive at the step's end)"}
        measured = {
            **record,
            "alive": alive,
            "layer_forward_retained_bytes": _measure.layer_forward_deltas(mt, layers),
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_tensors": len(list(model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "largest_parameter_tensor": max(p.numel() for p in model.parameters()),
            **extra,
            "wall_s": round(time.perf_counter() - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, mt, input_ids
    gc.collect()
    return measured


def _versions() -> dict:
    def ver(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"torch": torch.__version__, "transformers": ver("transformers"), "torchtune": ver("torchtune"),
            "torchao": ver("torchao")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    by_id = {c["id"]: c for c in CONFIGS}
    todo = [by_id[i] for i in args.only] if args.only else CONFIGS
    previous = _measure.previous_runs(OUT, _versions())[0] if args.only else {}
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = m = measure_run(cfg)
            msg = f"peak {m['peak_bytes']:>12,} B in {m['peak_phase']:<9} ({m['peak_op']}) {m['wall_s']:5.1f}s"
        except Exception as e:  # record and go on
            run["error"] = f"{type(e).__name__}: {e}"[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = "ERROR " + run["error"][:300]
        results[cfg["id"]] = run
        print(f"[{n:2d}/{len(todo)}] {cfg['id']:<44} {msg}", flush=True)
    runs = [results.get(c["id"]) or previous.get(c["id"]) for c in CONFIGS]
    doc = {"generator": GENERATOR + (" --only " + " ".join(args.only) if args.only else ""),
           "environment": SETUP, "python": platform.python_version(), **_versions(), "device": "cpu",
           "runs": [r for r in runs if r is not None]}
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
