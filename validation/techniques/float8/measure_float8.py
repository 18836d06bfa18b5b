#!/usr/bin/env python
"""Measure float8 training (torchao) runs with validation/harness.py's protocol.

    /tmp/fp8venv/bin/python validation/techniques/float8/measure_float8.py [--only ID ...]

Environment (its own venv, pinned): ``python3 -m venv /tmp/fp8venv && /tmp/fp8venv/bin/pip install
torch==2.13.0 transformers==5.23.0 torchao==0.18.0``. Each run builds the HF model as harness.py does
(random weights, FakeTensorMode for method=fake), converts it with
``torchao.float8.convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(recipe),
module_filter_fn=<not the LM head>)``, then runs harness.py's three-iteration protocol (``run_protocol``)
inside its ``PhaseMemTracker`` and records ``peak_record`` (every phase's peak). Writes
measurements.json next to this file.
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))          # validation/: harness.py
sys.path.insert(0, HERE)

import harness as M  # noqa: E402  (validation/harness.py; also applies its fake-tensor patches to transformers)
import torch  # noqa: E402
import torchao  # noqa: E402
import transformers  # noqa: E402
from torchao.float8 import Float8LinearConfig, convert_to_float8_training  # noqa: E402
from torchao.float8.float8_linear import Float8Linear  # noqa: E402

from float8_configs import CONFIGS  # noqa: E402

OUT = os.path.join(HERE, "measurements.json")


def not_lm_head(module, fqn: str) -> bool:
    return fqn != "lm_head"


def accelerate_filter(model):
    """accelerate's default filter (huggingface/accelerate@16cb6eb8 src/accelerate/utils/ao.py:32-70, 138-143:
    convert_model_to_fp8_ao with module_filter_func=None): the model's first and last nn.Linear (named_modules
    order: layer 0's q_proj, the LM head) and linears whose sizes are not multiples of 16 stay in high precision."""
    names = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    skip = {names[0], names[-1]}

    def keep(module, fqn: str) -> bool:
        if isinstance(module, torch.nn.Linear) and (module.in_features % 16 or module.out_features % 16):
            return False
        return fqn not in skip
    return keep


def measure(cfg: dict) -> dict:
    converted = []

    def prepare(model):  # torchao's conversion (before the checkpointing, as before)
        if cfg["float8"]:
            keep = accelerate_filter(model) if cfg.get("filter") == "accelerate" else not_lm_head
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(cfg["float8"]),
                                       module_filter_fn=keep)
        converted.extend(sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear)))

    with M.training_run(cfg, prepare=prepare) as run:
        model, mt = run.model, run.mt
        alive, t_measured = M.run_protocol(mt, model, run.optimizer, run.input_ids)
        t_end = time.perf_counter()
        return {
            **M.peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": M.layer_forward_deltas(mt, run.layers),
            "float8_linears": len(converted),
            "float8_linears_layer0": [n for n in converted if ".layers.0." in n],
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "parameter_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
            "wall_s": round(t_end - run.t0, 1),
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }


def _versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__, "torchao": torchao.__version__}


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/fp8venv/bin/python validation/techniques/float8/measure_float8.py",
            "environment": "python3 -m venv /tmp/fp8venv && /tmp/fp8venv/bin/pip install torch==2.13.0 "
                           "transformers==5.23.0 torchao==0.18.0 (CPU)",
            **_versions(), "runs": runs}


def main(argv=None) -> int:
    M.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure, document=document,
           out=OUT, versions=_versions, sort_keys=False, newline=False, atomic=False,
           summary=lambda m: f"peak {m['peak_bytes'] / 2**20:9.2f} MiB in {m['peak_phase']} ({m['peak_op']}) "
                             f"{m['wall_s']}s",
           line=lambda n, t, c, msg: f"[{n}/{t}] {c['id']:<40} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
