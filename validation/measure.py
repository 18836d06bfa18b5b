#!/usr/bin/env python
"""Measure the training-memory peak of every configuration in ``configs.py`` with PyTorch's own tracker.

    /tmp/valvenv/bin/python validation/measure.py --out validation/measurements.json [--only ID ...]

Needs ``torch==2.13.0`` (CPU build) and ``transformers==5.23.0`` (see README.md). For each configuration:
build ``AutoModelForCausalLM.from_config`` with random weights (under ``FakeTensorMode`` for ``method=fake``),
the optimizer, and run three training iterations (``zero_grad(set_to_none=True)``; forward with
``labels=input_ids`` so HF computes logits and the cross-entropy; ``backward``; ``step``) inside
``torch.distributed._tools.mem_tracker.MemTracker``. Iterations 1-2 warm up (optimizer state is created in the
first step); the tracker is then left and re-entered, which resets its peak, and iteration 3 is the measured
steady-state iteration.

With ``--only`` the named configurations are measured and merged into an existing ``--out`` file (the others
are kept as they are); without it every configuration is measured and the file is rewritten. The protocol, the
tracker, the records and this command line are ``harness.py``'s (shared by every measurement script).
"""

from __future__ import annotations

import os
import platform
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import harness  # noqa: E402  (validation/harness.py)
from configs import CONFIGS  # noqa: E402

GENERATOR = "/tmp/valvenv/bin/python validation/measure.py --out validation/measurements.json"


def document(args, runs, ctx) -> dict:
    return {"generator": GENERATOR, "environment": harness.ENVIRONMENT, "python": platform.python_version(),
            **harness._versions(), "device": "cpu", "threads": harness.torch.get_num_threads(),
            "total_wall_s": None if args.only else round(ctx.elapsed, 1), "runs": runs}


def main(argv=None) -> int:
    harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=harness.measure,
                 document=document, line=lambda n, t, c, msg: f"[{n:3d}/{t}] {c['method']:<4} {c['id']:<58} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
