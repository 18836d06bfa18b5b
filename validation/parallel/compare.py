"""Per-rank predictions of the measured profile against the fake-process-group runs in
measurements.json (no torch needed). Used by validation/report_parallel.py and the tests.

Each run becomes a solve: the model from its Hugging Face config, the global batch =
the per-rank batch x the data-parallel size, AdamW (foreach), SDPA, no recomputation, no
runtime overheads; FSDP2 with reshard_after_forward=True is the ``fsdp`` rule, False is
``fsdp-grad-op``; DTensor tensor parallelism is ``tp_size`` (with ``sequence_parallel`` for
the tp+sp runs); the mixed-precision policy (bf16 params, fp32 reduce) is the ``fsdp-bf16``
regime. The prediction for a run is the rank class that contains its rank.
"""

from __future__ import annotations

REGIMES = {"fp32": "fp32", "bf16": "bf16", "mp-bf16": "fsdp-bf16"}


def layout_kwargs(run: dict) -> dict:
    layout = run["layout"]
    kind, world = layout["kind"], layout["world_size"]
    shape = dict(zip(layout["mesh_dim_names"], layout["mesh_shape"]))
    tp = shape.get("tp", 1)
    dp = world // tp
    kwargs = dict(tp_size=tp, dp_size=dp, sequence_parallel=kind == "tp+sp")
    if dp > 1:
        kwargs["data_parallel"] = "fsdp" if layout.get("reshard_after_forward") else "fsdp-grad-op"
    return kwargs


def predict(run: dict, solver=None):
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    solver = solver or TrainingMemoryModel("measured")
    model = from_hf_config(run["hf_config"], name=run["model"])
    kwargs = layout_kwargs(run)
    batch = run["batch_size"] * kwargs["dp_size"]
    return solver.solve(model, HardwareNode(name="cpu", memory_capacity=2**40), batch, run["seq_len"],
                        precision="fp32", optimizer=run["optimizer"], activation_checkpointing="none",
                        regime=REGIMES[run["regime"]], optimizer_impl=run["optimizer_impl"],
                        attention=run["attention"], runtime_overheads=False, **kwargs)


def reference(run: dict) -> float:
    """The reference profile's total for the same layout (it has no regimes: precision as run)."""
    from mlsysim_core import HardwareNode, TrainingMemoryModel
    from mlsysim_core.hf import from_hf_config
    model = from_hf_config(run["hf_config"], name=run["model"])
    kwargs = layout_kwargs(run)
    precision = "fp32" if run["regime"] == "fp32" else "bf16"
    return TrainingMemoryModel().solve(
        model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"] * kwargs["dp_size"],
        run["seq_len"], precision=precision, optimizer=run["optimizer"], activation_checkpointing="none",
        **kwargs).total_memory


def compare(data: dict) -> list[dict]:
    rows = []
    for run in data["runs"]:
        result = predict(run)
        ref = reference(run)
        measured = run["measured"]["peak_bytes"]
        predicted = result.total_memory
        layout = run["layout"]
        rows.append(dict(id=run["id"], layout=layout["kind"] + (
            f" ({'reshard' if layout.get('reshard_after_forward') else 'no reshard'})" if layout["kind"] != "tp"
            and layout["kind"] != "tp+sp" else ""), world=layout["world_size"], rank=layout["rank"],
            measured=measured, predicted=predicted, error=predicted / measured - 1,
            reference=ref, reference_error=ref / measured - 1,
            measured_phase=run["measured"].get("peak_phase"), predicted_phase=result.peak_phase))
    return rows


if __name__ == "__main__":
    import json
    import statistics
    from pathlib import Path
    rows = compare(json.loads((Path(__file__).parent / "measurements.json").read_text()))
    for r in rows:
        print(f"{r['id']:58} {r['measured'] / 2**20:10.1f} {r['predicted'] / 2**20:10.1f} MiB {r['error']:+8.2%} "
              f"{r['measured_phase']}/{r['predicted_phase']}")
    errors = [abs(r["error"]) for r in rows]
    print(f"median {statistics.median(errors):.2%} max {max(errors):.2%} over {len(rows)} ranks")
