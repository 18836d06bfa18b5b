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

Each run is ``validation/measure.py``'s protocol (three iterations, the third measured, every
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

import argparse
import contextlib
import gc
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
import types
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
TECHNIQUES = os.path.dirname(HERE)
VALIDATION = os.path.dirname(TECHNIQUES)
sys.path.insert(0, VALIDATION)
sys.path.insert(0, os.path.join(TECHNIQUES, "loss"))

import measure as _measure  # noqa: E402  (validation/measure.py)


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CONFIGS = _load("oib_combinations_configs", os.path.join(HERE, "configs.py")).CONFIGS
offload_harness = _load("measure_offload", os.path.join(TECHNIQUES, "offload", "measure_offload.py"))
loss_harness = _load("measure_loss", os.path.join(TECHNIQUES, "loss", "measure_loss.py"))
ckpt_harness = _load("measure_checkpointing", os.path.join(TECHNIQUES, "checkpointing", "measure_checkpointing.py"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")
GENERATOR = "/tmp/oibcombovenv/bin/python validation/techniques/oib_combinations/measure_oib_combinations.py"
SETUP = ("python3 -m venv /tmp/oibcombovenv && /tmp/oibcombovenv/bin/pip install torch==2.13.0 transformers==5.23.0 "
         "&& /tmp/oibcombovenv/bin/pip install --no-deps torchtune==0.6.1 torchao==0.13.0 && "
         "/tmp/oibcombovenv/bin/pip install bitsandbytes==0.50.2 (+ torchtune's import dependencies --no-deps)")


def _build(cfg):
    torch.manual_seed(0)
    kw = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
    model.train()
    policy = cfg["checkpointing"]
    if policy == "full":
        model.gradient_checkpointing_enable()
    elif policy != "none":
        ckpt_harness.apply_policy(model, policy, cfg["policy_options"])
    input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    return model, input_ids


def _optimizer(params, cfg):
    if cfg["optimizer"] == "adamw-8bit-bnb":
        import bitsandbytes as bnb
        return bnb.optim.AdamW8bit(params, lr=1e-4)
    return _measure.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])


def optimizer_in_backward(model, cfg, mt_cell):
    """``measure_offload.optimizer_in_backward`` with the run's optimizer class (torchtune builds
    ``{p: config.instantiate(cfg_optimizer, [p]) for p in model.parameters()}``)."""
    optims = {p: _optimizer([p], cfg) for p in model.parameters() if p.requires_grad}
    head = model.get_output_embeddings().weight

    def step(param):
        optims[param].step()
        optims[param].zero_grad()
        if param is head and mt_cell and mt_cell[0].phase == "backward":
            mt_cell[0].phase = "backward_after_lm_head"

    for p in optims:
        p.register_post_accumulate_grad_hook(step)
    return list(optims.values())


def _forward(model, cfg, ctx):
    """The training step's forward: Hugging Face's (cross-entropy), or torchtune's chunked loss; the
    offload context (if any) around the base model only."""
    if cfg["loss"] == "cross_entropy":
        if ctx is None:
            return model
        return offload_harness._BaseModelOffloaded(model, ctx)
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
        model, input_ids = _build(cfg)
        mt_cell, extra = [], {}
        optims = optimizer_in_backward(model, cfg, mt_cell)
        holder, point, ex = {}, None, None
        if cfg["offload"] == "save_on_cpu":
            ex = offload_harness._Examples.get()
            runner = _forward(model, cfg, lambda: ex.SimulatedSaveOnCpu(holder["ledger"]))

            def point():
                d = _measure._point(mt_cell[0])
                d["host_bytes"] = holder["ledger"].current
                return d
        else:
            runner = _forward(model, cfg, None)
        layers, _ = _measure._submodules(model)
        mt = _measure.PhaseMemTracker()
        mt_cell.append(mt)
        mt.track_external(model, *optims, input_ids)
        if ex is not None:
            ledger = holder["ledger"] = ex.HostLedger(mt, model)
            reset = mt.reset_phase_stats

            def reset_both():
                reset()
                ledger.reset()
            mt.reset_phase_stats = reset_both
        autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if cfg["regime"] == "amp-bf16"
                    else contextlib.nullcontext)
        alive, t_measured = _measure.run_protocol(mt, runner, offload_harness._Nothing(), input_ids, point=point,
                                                  autocast=autocast)
        if ex is not None:
            extra["host"] = {"end_of_forward": alive["end_of_forward"]["host_bytes"]}
        t_end = time.perf_counter()
        record = _measure.peak_record(mt)
        phases = record["peak_by_phase"]
        sub = phases.get("backward_after_lm_head")
        if sub is not None:
            record["backward_sub_phases"] = {"backward_to_lm_head_step": phases.get("backward"),
                                             "backward_after_lm_head": phases.pop("backward_after_lm_head")}
            if "backward" not in phases or sub["bytes"] > phases["backward"]["bytes"]:
                phases["backward"] = sub
            if record["peak_phase"] == "backward_after_lm_head":
                record["peak_phase"] = "backward"
        if "optimizer" not in phases:
            end = alive["end_of_step"]
            phases["optimizer"] = {"bytes": end["bytes"], "by_category": end["by_category"], "op": None,
                                   "module": "(no op ran: the bytes alive at the step's end)"}
        measured = {
            **record, "alive": alive,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_tensors": len(list(model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            **extra,
            "wall_s": round(time.perf_counter() - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, mt, input_ids, optims
    gc.collect()
    return measured


def _versions() -> dict:
    def ver(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"torch": torch.__version__, "transformers": ver("transformers"), "torchtune": ver("torchtune"),
            "torchao": ver("torchao"), "bitsandbytes": ver("bitsandbytes")}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    by_id = {c["id"]: c for c in CONFIGS}
    todo = [by_id[i] for i in args.only] if args.only else CONFIGS
    previous = _measure.previous_runs(OUT, _versions())[0] if os.path.exists(OUT) else {}
    results = {}
    ok = True
    for k, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = m = measure_run(cfg)
            msg = f"peak {m['peak_bytes']:>12,} B in {m['peak_phase']:<9} ({m['peak_op']}) {m['wall_s']:5.1f}s"
        except Exception as e:  # record and go on
            ok = False
            run["error"] = f"{type(e).__name__}: {e}"[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = "ERROR " + run["error"][:300]
        results[cfg["id"]] = run
        print(f"[{k:2d}/{len(todo)}] {cfg['id']:<60} {msg}", flush=True)
        merged = {**previous, **results}
        doc = {"generator": GENERATOR, "environment": SETUP, "python": platform.python_version(), **_versions(),
               "device": "cpu", "runs": [merged[c["id"]] for c in CONFIGS if c["id"] in merged]}
        with open(OUT, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
