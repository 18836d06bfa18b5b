"""Megatron-LM functional tests' ``mem-max-allocated-bytes`` golden values against the measured
profile's prediction for the same rank (issue 26, docs/launch-megatron.md).

Each ``tests/data/launch/megatron/<case>.model_config.yaml`` is read with ``--from`` (8 GPUs: one
DGX node, as the functional tests run) and solved; the golden value is the peak allocated memory
(``torch.cuda.memory_stats()["allocated_bytes.all.peak"]``) that the tensorboard writer's rank logs:
the last rank (``args.rank == world_size - 1``, megatron/training/global_vars.py), which is on the
last pipeline stage. Compared like with like: allocated bytes, without the runtime overheads that
``max_memory_allocated`` does not count (CUDA context, NCCL buffers, allocator reserve), with the one it
counts: the cuBLAS workspaces, which PyTorch allocates through its caching allocator
(pytorch/pytorch 26a39059ec580351411f180816c47e2ef5134ae1 aten/src/ATen/cuda/CublasHandlePool.cpp,
``getNewWorkspace``: ``CUDACachingAllocator::get()->allocate``; TransformerEngine's by ``torch.empty``), as the
reader prices them (PyTorch's per thread, sized by CUBLAS_WORKSPACE_CONFIG or the GPU's default, plus TE's, which
depends on the compute capability): each row is solved on the golden's machine
(``dev_dgx_a100``: an A100 SXM4 80GB, ``dev_dgx_h100``: an H100 SXM5). The golden files also log
``mem-allocated-bytes`` (allocated after the step: weights, gradients, optimizer state), so each
row is split: that static part against the prediction's, and the peak above it against the
prediction's.

    python tools/launch_validation_megatron.py            # the Markdown table
    python tools/launch_validation_megatron.py --check    # exit 1 if docs/launch-megatron.md differs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "launch" / "megatron"
DOC = ROOT / "docs" / "launch-megatron.md"
BEGIN, END = "<!-- validation-table: begin -->", "<!-- validation-table: end -->"
GPUS = 8


def cases():
    for config in sorted(DATA.glob("*.model_config.yaml")):
        name = config.name.removesuffix(".model_config.yaml")
        golden = sorted(DATA.glob(f"{name}.golden_values_*.json"))
        yield name, config, (golden[0] if golden else None)


def golden_value(path: Path, metric: str = "mem-max-allocated-bytes") -> tuple[float, str]:
    data = json.loads(path.read_text())[metric]
    values = {int(k): v for k, v in data["values"].items() if isinstance(v, (int, float))}
    step = max(values)
    machine = path.name.removesuffix(".json").split("golden_values_")[1]
    return float(values[step]), f"{machine}, step {step}"


def allocated(rank) -> tuple[float, float]:
    """(allocated at the peak, static: weights + gradients + optimizer state), in bytes: the runtime
    overheads left out but the cuBLAS workspace, which PyTorch's caching allocator counts."""
    workspace = sum(t.nbytes for t in rank.terms if t.component == "runtime_overheads" and "cuBLAS" in t.label)
    static = rank.weights + rank.gradients + rank.optimizer_state + workspace
    return rank.total_memory - rank.runtime_overheads + workspace, static


# The golden's machine -> the catalog's accelerator (a DGX A100 node's GPUs are A100 SXM4; 40 and 80 GB alike
# have compute capability 8.0, and the allocated bytes do not depend on the capacity).
MACHINES = {"dev_dgx_a100": "nvidia/a100-sxm4-80gb", "dev_dgx_h100": "h100"}


def predict(config: Path, hardware: str = "h100"):
    import os
    os.chdir(ROOT)
    import mlsysim_core
    from mlsysim_core.scenario import from_launch
    launch = from_launch([config.relative_to(ROOT)], gpus=GPUS, hardware=hardware)
    s = launch.scenario
    result = mlsysim_core.TrainingMemoryModel("measured").solve(s.resolve_model(), s.resolve_hardware(),
                                                                **{k: v for k, v in s.solve_kwargs().items()
                                                                   if k not in ("model", "hardware")})
    ranks = result.ranks or ()
    last = ranks[-1] if ranks else result
    return last, launch


def rows():
    from mlsysim_core.errors import MlsysimError
    out = []
    for name, config, golden in cases():
        if golden is None:
            continue
        value, where = golden_value(golden)
        static, _ = golden_value(golden, "mem-allocated-bytes")
        try:
            rank, launch = predict(config, MACHINES[where.split(",")[0]])
        except MlsysimError as err:
            out.append((name, where, value, static, None, None, f"refused: {str(err).splitlines()[0][:160]}"))
            continue
        s = launch.scenario
        layout = f"tp{s.tp_size} pp{s.pp_size} cp{s.cp_size} dp{s.dp_size}, mb {s.batch_size // (s.dp_size * s.gradient_accumulation_steps)}"
        peak, predicted_static = allocated(rank)
        out.append((name, where, value, static, peak, predicted_static,
                    layout + f", {getattr(rank, 'name', 'every rank')}"))
    return out


def _err(predicted, value) -> str:
    return f"{(predicted - value) / value * 100:+.1f} %"


def table() -> str:
    lines = ["| functional test (model_config.yaml) | golden (machine, step) | golden GB | predicted GB allocated "
             "(last rank) | error | static: golden / predicted GB | above static: golden / predicted GB (error) "
             "| layout, rank |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for name, where, value, static, predicted, predicted_static, what in rows():
        if predicted is None:
            lines.append(f"| {name} | {where} | {value / 1e9:.3f} | — | — | {static / 1e9:.3f} / — | — | {what} |")
        else:
            lines.append(f"| {name} | {where} | {value / 1e9:.3f} | {predicted / 1e9:.3f} | {_err(predicted, value)} "
                         f"| {static / 1e9:.3f} / {predicted_static / 1e9:.3f} | {(value - static) / 1e9:.3f} / "
                         f"{(predicted - predicted_static) / 1e9:.3f} ({_err(predicted - predicted_static, value - static)})"
                         f" | {what} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = table()
    if "--check" in argv:
        doc = DOC.read_text()
        current = doc.split(BEGIN)[1].split(END)[0].strip() if BEGIN in doc else ""
        if current != text.strip():
            print("docs/launch-megatron.md's validation table is stale: run python tools/launch_validation_megatron.py "
                  "--write", file=sys.stderr)
            return 1
        return 0
    if "--write" in argv:
        doc = DOC.read_text()
        head, rest = doc.split(BEGIN)
        _, tail = rest.split(END)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
