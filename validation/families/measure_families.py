"""Measure the architecture families' training iterations with PyTorch's own tracker.

Each family has a directory here with a ``configs.py`` whose ``CONFIGS`` list has the schema
of ``validation/configs.py`` (``id``, ``family``, ``model``, ``hf_config``, ``batch_size``,
``seq_len``, ``regime``, ``optimizer``, ``optimizer_impl``, ``checkpointing``, ``attention``,
``dropout``, ``method``: ``real`` at small sizes, ``fake`` (FakeTensorMode) at public shapes).
Each run is measured with ``validation/harness.py``'s protocol (three iterations, the third
measured; every phase's peak) and written to that directory's ``measurements.json``.

    /tmp/valvenv/bin/python validation/families/measure_families.py gemma
    /tmp/valvenv/bin/python validation/families/measure_families.py gemma --only ID [ID ...]

(``python3 -m venv /tmp/valvenv && /tmp/valvenv/bin/pip install -r validation/requirements.txt``:
torch==2.13.0 CPU build, transformers==5.23.0.)
"""

from __future__ import annotations

import platform
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import harness  # noqa: E402  (validation/harness.py)


def family_configs(family: str) -> list[dict]:
    return list(harness.load(f"family_configs_{family}", HERE / family / "configs.py").CONFIGS)


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("family", help="the family directory under validation/families/")

    def before(args):  # the file defaults to the family's own
        args.out = args.out or str(HERE / args.family / "measurements.json")

    def document(args, runs, ctx):
        return {"generator": f"/tmp/valvenv/bin/python validation/families/measure_families.py {args.family}",
                "environment": harness.ENVIRONMENT, "python": platform.python_version(), **harness._versions(),
                "runs": runs}

    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=lambda a: family_configs(a.family),
                        measure_run=harness.measure, document=document, arguments=arguments, before=before,
                        atomic=False,
                        line=lambda n, t, c, msg: f"[{n:3d}/{t}] {c['method']:<4} {c['id']:<50} {msg}")


if __name__ == "__main__":
    sys.exit(main())
