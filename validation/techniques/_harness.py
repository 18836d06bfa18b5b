"""Shared plumbing of the technique harnesses (``validation/techniques/*/measure_*.py``): loading a
sibling file as a module, building the run's model, the optimizer step in the backward, the
simulated ``save_on_cpu`` with its host ledger, the phase bookkeeping after
``validation/measure.py``'s ``run_protocol``, and the ``main()`` that runs the configs (all, or
``--only ID ...`` merged into the committed file) and writes ``measurements.json``.

Imported by the scripts (``sys.path`` holding this folder); needs torch and transformers.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys
import traceback
import types

TECHNIQUES = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(TECHNIQUES)
if VALIDATION not in sys.path:
    sys.path.insert(0, VALIDATION)

import measure as _measure  # noqa: E402  (validation/measure.py)
import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402


def load(name, path):
    """The file at ``path`` as a module named ``name`` (the harness folders are not packages)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def versions(*dists) -> dict:
    """torch's version and each distribution's (None where it is not installed)."""
    def ver(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None
    return {"torch": torch.__version__, **{d: ver(d) for d in dists}}


def build_model(cfg, apply_policy=None):
    """The config's Hugging Face model (seed 0, from its config, train mode) and its input ids;
    ``checkpointing == "full"``: Hugging Face's gradient checkpointing; another policy than
    ``"none"``: ``apply_policy(model, policy, cfg["policy_options"])`` where one is given."""
    torch.manual_seed(0)
    kw = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(kw.pop("model_type"), **kw)
    dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
    model.train()
    policy = cfg["checkpointing"]
    if policy == "full":
        model.gradient_checkpointing_enable()
    elif policy != "none" and apply_policy is not None:
        apply_policy(model, policy, cfg["policy_options"])
    input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    return model, input_ids


def autocast_for(cfg):
    """The forward's autocast context factory: bf16 autocast on the CPU under ``amp-bf16``."""
    if cfg["regime"] == "amp-bf16":
        return lambda: torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext


class Nothing:
    """The training loop's ``zero_grad`` and ``step`` under optimizer-in-backward: nothing to do."""

    def zero_grad(self, set_to_none=True):
        pass

    def step(self):
        pass


def optimizer_in_backward(model, make_optimizer, mt_cell):
    """torchtune 0.6.1 ``torchtune/training/memory.py``: ``optim_dict = {p: Optimizer([p]) for p in
    model.parameters()}``; ``register_optim_in_bwd_hooks``: ``optim_step(param)`` =
    ``optim_dict[param].step(); optim_dict[param].zero_grad()`` on every trainable parameter's
    post-accumulate-grad hook. ``make_optimizer([p])`` builds one parameter's optimizer; the
    tracker in ``mt_cell`` (once there) enters ``backward_after_lm_head`` after the LM head's step."""
    optims = {p: make_optimizer([p]) for p in model.parameters() if p.requires_grad}
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


class Examples:
    """validation/examples/measure_examples.py's save_on_cpu as it behaves with a GPU (``SimulatedSaveOnCpu``:
    pack copies each saved tensor into a host tensor made outside the tracker, tallied by ``HostLedger``;
    unpack copies it back to a new tracked "device" tensor), imported, not copied."""

    module = None

    @classmethod
    def get(cls):
        if cls.module is None:
            sys.path.insert(0, os.path.join(VALIDATION, "examples"))
            sys.path.insert(0, os.path.join(VALIDATION, "parallel"))
            cls.module = load("measure_examples", os.path.join(VALIDATION, "examples", "measure_examples.py"))
        return cls.module


class SimulatedSaveOnCpu:
    """The simulated ``save_on_cpu`` of one run: ``ctx()`` the offload context, ``point()`` the
    protocol's point with the ledger's current host bytes; ``attach(mt, model)`` makes the ledger
    once the tracker exists and resets it with the tracker's phase stats (``run_protocol`` resets
    them just before the measured iteration)."""

    def __init__(self, mt_cell):
        self.ex = Examples.get()
        self.mt_cell = mt_cell
        self.ledger = None

    def ctx(self):
        return self.ex.SimulatedSaveOnCpu(self.ledger)

    def point(self):
        d = _measure._point(self.mt_cell[0])
        d["host_bytes"] = self.ledger.current
        return d

    def attach(self, mt, model):
        ledger = self.ledger = self.ex.HostLedger(mt, model)
        reset = mt.reset_phase_stats

        def reset_both():       # run_protocol calls it just before the measured iteration
            reset()
            ledger.reset()
        mt.reset_phase_stats = reset_both
        return ledger


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


def fold_backward_sub_phases(record):
    """The backward split at the LM head's step (``backward_after_lm_head``): both sub-phases kept in
    ``backward_sub_phases``, the backward's peak the larger, the peak phase named ``backward``."""
    phases = record["peak_by_phase"]
    sub = phases.get("backward_after_lm_head")
    if sub is not None:
        record["backward_sub_phases"] = {"backward_to_lm_head_step": phases.get("backward"),
                                         "backward_after_lm_head": phases.pop("backward_after_lm_head")}
        if "backward" not in phases or sub["bytes"] > phases["backward"]["bytes"]:
            phases["backward"] = sub
        if record["peak_phase"] == "backward_after_lm_head":
            record["peak_phase"] = "backward"


def fill_optimizer_phase(record, alive, module="(no op ran: the bytes alive at the step's end)"):
    """No op ran in the loop's step: what is alive at the step's end is the optimizer phase's bytes."""
    phases = record["peak_by_phase"]
    if "optimizer" not in phases:
        end = alive["end_of_step"]
        phases["optimizer"] = {"bytes": end["bytes"], "by_category": end["by_category"], "op": None,
                               "module": module}


def model_facts(model) -> dict:
    return {"parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_tensors": len(list(model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", "")}


def peak_summary(m) -> str:
    return f"peak {m['peak_bytes']:>12,} B in {m['peak_phase']:<9} ({m['peak_op']}) {m['wall_s']:5.1f}s"


def main(argv, *, description, configs, measure_run, out, generator, setup, versions, summary=peak_summary,
         threads=None, id_width=44, incremental=False) -> int:
    """Run every config (or ``--only ID ...``) and write ``out``: the runs in the configs' order, each
    with its ``measured`` record or its ``error``; ``generator``, ``setup`` and the ``versions()``
    beside them. A partial run (``--only``) keeps the file's other runs (``generator`` then says
    ``--only``). ``incremental``: the file's runs are always kept and the file is written after each
    run (``generator`` as given). Exit status 1 when a run failed."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--only", nargs="+", metavar="ID")
    args = ap.parse_args(argv)
    cpus = os.cpu_count() or 1
    torch.set_num_threads(max(1, min(threads, cpus) if threads else cpus))
    by_id = {c["id"]: c for c in configs}
    todo = [by_id[i] for i in args.only] if args.only else configs
    keep = os.path.exists(out) if incremental else bool(args.only)
    previous = _measure.previous_runs(out, versions())[0] if keep else {}
    if not incremental and args.only:
        generator += " --only " + " ".join(args.only)
    results = {}

    def write():
        runs = [results.get(c["id"]) or previous.get(c["id"]) for c in configs]
        doc = {"generator": generator, "environment": setup, "python": platform.python_version(), **versions(),
               "device": "cpu", "runs": [r for r in runs if r is not None]}
        with open(out, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.write("\n")

    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = m = measure_run(cfg)
            msg = summary(m)
        except Exception as e:  # record and go on
            run["error"] = f"{type(e).__name__}: {e}"[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = "ERROR " + run["error"][:300]
        results[cfg["id"]] = run
        print(f"[{n:2d}/{len(todo)}] {cfg['id']:<{id_width}} {msg}", flush=True)
        if incremental:
            write()
    if not incremental:
        write()
    return 0 if all("error" not in r for r in results.values()) else 1
