#!/usr/bin/env python
"""Measure float8 training (torchao) runs with validation/measure.py's protocol.

    /tmp/fp8venv/bin/python validation/techniques/float8/measure_float8.py [--only ID ...]

Environment (its own venv, pinned): ``python3 -m venv /tmp/fp8venv && /tmp/fp8venv/bin/pip install
torch==2.13.0 transformers==5.23.0 torchao==0.18.0``. Each run builds the HF model as measure.py does
(random weights, FakeTensorMode for method=fake), converts it with
``torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
module_filter_fn=<not the LM head>)``, then runs measure.py's three-iteration protocol (``run_protocol``)
inside its ``PhaseMemTracker`` and records ``peak_record`` (every phase's peak). Writes
measurements.json next to this file.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))          # validation/: measure.py
sys.path.insert(0, HERE)

import measure as M  # noqa: E402  (also applies its fake-tensor patches to transformers)
import torch  # noqa: E402
import torchao  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

from float8_configs import CONFIGS  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")


def not_lm_head(module, fqn: str) -> bool:
    return fqn != "lm_head"


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf_kwargs = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(hf_kwargs.pop("model_type"), **hf_kwargs)
    fake = cfg["method"] == "fake"
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
        model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
        model.train()
        if cfg["float8"]:
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(cfg["float8"]),
                                       module_filter_fn=not_lm_head)
        converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
        if cfg["checkpointing"] == "full":
            model.gradient_checkpointing_enable()
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = M.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
        input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
        layers, named = M._submodules(model)
        mt = M.PhaseMemTracker()
        mt.track_external(model, optimizer, input_ids)
        alive, t_measured = M.run_protocol(mt, model, optimizer, input_ids)
        t_end = time.perf_counter()
        measured = {
            **M.peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": M.layer_forward_deltas(mt, layers),
            "float8_linears": len(converted),
            "float8_linears_layer0": [n for n in converted if ".layers.0." in n],
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "wall_s": round(t_end - t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
    del model, optimizer, input_ids, mt, params, layers, named
    gc.collect()
    return measured


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    versions = {"torch": torch.__version__, "transformers": transformers.__version__, "torchao": torchao.__version__}
    todo = [c for c in CONFIGS if not args.only or c["id"] in args.only]
    previous = M.previous_runs(OUT, versions)[0] if args.only else {}
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = measure(cfg)
            m = run["measured"]
            msg = f"peak {m['peak_bytes'] / 2**20:9.2f} MiB in {m['peak_phase']} ({m['peak_op']}) {m['wall_s']}s"
        except Exception as e:  # record and go on
            run["error"] = f"{type(e).__name__}: {e}"[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = "ERROR " + run["error"][:200]
        results[cfg["id"]] = run
        print(f"[{n}/{len(todo)}] {cfg['id']:<40} {msg}", flush=True)
    runs = [results.get(c["id"]) or previous.get(c["id"]) for c in CONFIGS]
    doc = {"generator": "/tmp/fp8venv/bin/python validation/techniques/float8/measure_float8.py",
           "environment": "python3 -m venv /tmp/fp8venv && /tmp/fp8venv/bin/pip install torch==2.13.0 "
                          "transformers==5.23.0 torchao==0.18.0 (CPU)",
           **versions, "runs": [r for r in runs if r is not None]}
    with open(OUT, "w") as f:
        json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
