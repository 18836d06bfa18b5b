"""Every prediction the installed mlsysim_core makes for a fixed set of cases, as exact numbers.

    python tools/snapshot_predictions.py --out tests/data/predictions_issue13.json [--root TREE]

``tests/data/predictions_issue13.json`` was written by this script with the package as of
commit 98d9a2c (the commit that closed issue 13), installed in a scratch venv from a
worktree; ``tests/validation/test_predictions_unchanged.py`` recomputes every case with the current
code and compares the numbers exactly. To regenerate at that commit::

    git worktree add --detach /tmp/old13 98d9a2c
    python3 -m venv /tmp/old13venv && /tmp/old13venv/bin/pip install -e /tmp/old13 pytest
    cd /tmp && /tmp/old13venv/bin/python /path/to/tools/snapshot_predictions.py \\
        --root /tmp/old13 --out /path/to/tests/data/predictions_issue13.json

(``cd /tmp``: the script must import the package installed in that venv, not a checkout's;
the header of the output names the file it imported and the commit of ``--root``.)

The cases, each solved through the public ``TrainingMemoryModel(profile).solve``, with the
mapping from a run to a solve imported from the code that owns it (never re-derived here):

* ``validation/<id>`` and ``validation-reference/<id>``: every run of
  ``validation/measurements.json`` as ``validation/report.py`` solves it (``measured_result``,
  ``reference_prediction``);
* ``lora/<id>``: ``validation/lora_measurements.json`` as ``tests/measured/test_lora_solve.py`` (``_solve``);
* ``parallel/<id>``, ``parallel-reference/<id>``: ``validation/parallel/measurements.json`` as
  ``validation/parallel/compare.py`` (``predict``, ``reference``);
* ``parity/<n>``: every case of ``tests/data/reference_grid.json`` (mlsysim 0.3.0's grid) as
  ``tests/validation/test_reference_parity.py`` solves it (``_solve``), with ``TrainingMemoryModel()``;
* ``korthikanti/<name>/<recompute>``: the solves of ``validation/published/korthikanti.py``'s
  ``predict``, and ``korthikanti/rows`` (what it reports);
* ``extra/<params>``: a few hundred measured-profile solves spanning the options (``EXTRA``).

Each solve is recorded as its result's numbers (``record``): the totals, every component,
host memory, runtime overheads, the peak phase, every term (component, label, nbytes,
phases, tier, stage, rank), the bytes alive per (tier, component, phase), and the same for
every rank class; numbers are ``repr()`` strings (exact, int and float told apart). A solve
that raises is recorded as ``"<ErrorClass>: <message>"``. ``numbers(record)`` is the part
that must not change in a refactor (labels, sources, notes and rank names may).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import itertools
import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

TOOL_ROOT = Path(__file__).resolve().parent.parent
SCALARS = ("total_memory", "weights", "gradients", "optimizer_state", "activations", "communication_buffers",
           "runtime_overheads", "host_memory", "available_memory", "memory_utilization")
RANK_SCALARS = ("total_memory", "weights", "gradients", "optimizer_state", "activations", "communication_buffers",
                "runtime_overheads", "host_memory", "in_flight")


def num(value) -> str:
    """A number as its exact ``repr`` (``'5'`` and ``'5.0'`` differ on purpose)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not a number: {value!r}")
    return repr(value)


# --------------------------------------------------------------------------- recording

def _term(t) -> list:
    return [t.component, t.label, num(t.nbytes), list(t.phases), t.tier, t.pipeline_stage, t.rank]


def _sums(terms) -> dict:
    """Bytes alive per ``tier/component/phase`` (``math.fsum``: independent of the terms' order)."""
    groups: dict[str, list] = {}
    for t in terms:
        for phase in t.phases:
            groups.setdefault(f"{t.tier}/{t.component}/{phase}", []).append(t.nbytes)
    return {key: num(math.fsum(values) if any(isinstance(v, float) for v in values) else sum(values))
            for key, values in sorted(groups.items())}


def record(result) -> dict:
    """A result's numbers and terms (plus, for reading only, its notes and selected specs)."""
    out = {f: num(getattr(result, f)) for f in SCALARS}
    out.update(feasible=result.feasible, peak_phase=result.peak_phase, microbatch=result.microbatch,
               layers_per_stage=result.layers_per_stage, sequence_parallel=result.sequence_parallel,
               parallelism=dict(sorted(result.parallelism.items())), precision=result.precision,
               optimizer=result.optimizer, activation_checkpointing=result.activation_checkpointing,
               regime=result.details.get("regime"), profile=result.profile, heaviest_rank=result.heaviest_rank,
               terms=[_term(t) for t in result.terms], sums=_sums(result.terms),
               notes=list(result.notes), selected=dict(sorted(result.selected.items())))
    out["ranks"] = [dict({f: num(getattr(r, f)) for f in RANK_SCALARS}, name=r.name, stages=list(r.stages),
                         ranks=r.ranks, layers=r.layers, peak_phase=r.peak_phase, feasible=r.feasible,
                         terms=[_term(t) for t in r.terms], sums=_sums(r.terms))
                    for r in result.ranks]
    return out


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _nbytes_by_component(terms: list) -> dict:
    """The multiset of term nbytes per component (labels and order left out)."""
    out: dict[str, list] = {}
    for component, _label, nbytes, *_ in terms:
        out.setdefault(component, []).append(nbytes)
    return {c: sorted(v, key=lambda s: (float(s), s)) for c, v in sorted(out.items())}


def numbers(entry: dict) -> dict:
    """What must not change: every number of a recorded case, without labels, sources,
    notes, spec names or rank names. ``entry`` is one value of the snapshot's ``cases``."""
    if "error" in entry:
        return {"error": entry["error"].split(":", 1)[0]}
    if "values" in entry:
        return {"values": entry["values"]}
    out = {"returned": entry["returned"]} if "returned" in entry else {}
    if "result" not in entry:
        return out
    r = entry["result"]
    out.update({f: r[f] for f in SCALARS})
    for f in ("feasible", "peak_phase", "microbatch", "layers_per_stage", "sequence_parallel", "parallelism",
              "precision", "optimizer", "activation_checkpointing", "regime"):
        out[f] = r[f]
    out["term_nbytes"] = _nbytes_by_component(r["terms"])
    out["sums"] = r["sums"]
    ranks = []
    for rank in sorted(r["ranks"], key=lambda k: k["stages"]):
        ranks.append({f: rank[f] for f in (*RANK_SCALARS, "stages", "ranks", "layers", "peak_phase", "feasible",
                                           "sums")}
                     | {"term_nbytes": _nbytes_by_component(rank["terms"])})
    out["ranks"] = ranks
    return out


def _flatten(value, path=""):
    if isinstance(value, dict):
        for k in sorted(value):
            yield from _flatten(value[k], f"{path}.{k}" if path else str(k))
    elif isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        yield f"{path}.len", len(value)
        for i, v in enumerate(value):
            yield from _flatten(v, f"{path}[{i}]")
    else:
        yield path, value


def _delta(old, new) -> str:
    try:
        a, b = float(old), float(new)
    except (TypeError, ValueError):
        return ""
    if a == b:
        return " (same value, other type)" if old != new else ""
    return f" (delta {b - a:+.6g}" + (f", {b / a - 1:+.3e} relative)" if a else ")")


def differences(old: dict, new: dict) -> list[tuple[str, dict, list[str]]]:
    """``(case id, params, ["field: old -> new (delta)", ...])`` for every case of ``old``
    (a snapshot's ``cases``) whose ``numbers`` differ in ``new``, in case order."""
    out = []
    for case_id, entry in old.items():
        if case_id not in new:
            out.append((case_id, entry["params"], ["case missing from the current cases"]))
            continue
        if ("error" in entry) != ("error" in new[case_id]):    # one outcome is an error: say which, once
            out.append((case_id, entry["params"], [f"outcome: {entry.get('error', 'solved')!s:.400} -> "
                                                   f"{new[case_id].get('error', 'solved')!s:.400}"]))
            continue
        a, b = dict(_flatten(numbers(entry))), dict(_flatten(numbers(new[case_id])))
        fields = []
        for path in sorted(set(a) | set(b)):
            x, y = a.get(path, "<absent>"), b.get(path, "<absent>")
            if x == y:
                continue
            if ".term_nbytes." in f".{path}" and isinstance(x, list) and isinstance(y, list):   # what left, what came
                gone, came = Counter(x) - Counter(y), Counter(y) - Counter(x)
                gone, came = sorted(gone.elements(), key=float), sorted(came.elements(), key=float)
                delta = _delta(gone[0], came[0]) if len(gone) == len(came) == 1 else ""
                fields.append(f"{path}: {len(x)} terms -> {len(y)}; gone {gone}, new {came}{delta}")
            else:
                fields.append(f"{path}: {x} -> {y}{_delta(x, y)}")
        if "error" in entry and fields:     # both errors, of different classes
            fields = [f"{fields[0]} [old: {entry['error']:.400}; new: {new[case_id]['error']:.400}]"]
        if fields:
            out.append((case_id, entry["params"], fields))
    return out


def load(path: Path) -> dict:
    """A snapshot file (``.json`` or ``.json.gz``)."""
    data = path.read_bytes()
    if path.suffix == ".gz":
        import gzip
        data = gzip.decompress(data)
    return json.loads(data)


# --------------------------------------------------------------------------- the cases

def _module(root: Path, relative: str, name: str):
    spec = importlib.util.spec_from_file_location(name, root / relative)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def _captured():
    """Every outermost ``TrainingMemoryModel.solve`` result while inside (for the mapping
    functions that return less than the result, or make their own solver)."""
    from mlsysim_core import TrainingMemoryModel
    own = "solve" in TrainingMemoryModel.__dict__
    original = TrainingMemoryModel.solve
    results: list = []
    depth = [0]

    def solve(self, *args, **kwargs):
        depth[0] += 1
        try:
            result = original(self, *args, **kwargs)
        finally:
            depth[0] -= 1
        if depth[0] == 0:
            results.append(result)
        return result

    TrainingMemoryModel.solve = solve
    try:
        yield results
    finally:
        if own:
            TrainingMemoryModel.solve = original
        else:
            del TrainingMemoryModel.solve


def _attempt(call):
    """``{"result": record}`` or ``{"error": ...}``."""
    try:
        return {"result": record(call())}
    except Exception as exc:    # every error is a recorded outcome
        return {"error": _error(exc)}


def _attempt_captured(call, values=None):
    """Solve through a mapping function: record the one solve it made, if any, and ``values``
    of what it returned."""
    with _captured() as results:
        try:
            returned = call()
        except Exception as exc:
            return {"error": _error(exc)}
    if len(results) > 1:
        return {"error": f"SnapshotError: {len(results)} solves captured, expected at most 1"}
    out = {"result": record(results[0])} if results else {}
    if values is not None:
        out["returned"] = values(returned)
    return out


def validation_cases(root: Path):
    from mlsysim_core import TrainingMemoryModel
    report = _module(root, "validation/report.py", "_snapshot_validation_report")
    measured, reference = TrainingMemoryModel("measured"), TrainingMemoryModel("reference")
    for run in report.load_runs(root / "validation" / "measurements.json"):
        params = {"run": run["id"]}
        yield f"validation/{run['id']}", params, lambda run=run: _attempt(lambda: report.measured_result(run, measured))
        yield (f"validation-reference/{run['id']}", params, lambda run=run: _attempt_captured(
            lambda: report.reference_prediction(run, reference), lambda total: None if total is None else num(total)))


def lora_cases(root: Path):
    from mlsysim_core import TrainingMemoryModel
    lora = _module(root, "tests/measured/test_lora_solve.py", "_snapshot_test_lora_solve")
    solver = TrainingMemoryModel("measured")
    runs = json.loads((root / "validation" / "lora_measurements.json").read_text(encoding="utf-8"))["runs"]
    for run in runs:
        if run.get("measured"):
            yield f"lora/{run['id']}", {"run": run["id"]}, lambda run=run: _attempt(lambda: lora._solve(run, solver))


def parallel_cases(root: Path):
    from mlsysim_core import TrainingMemoryModel
    compare = _module(root, "validation/parallel/compare.py", "_snapshot_parallel_compare")
    solver = TrainingMemoryModel("measured")
    data = json.loads((root / "validation" / "parallel" / "measurements.json").read_text(encoding="utf-8"))
    for run in data["runs"]:
        params = {"run": run["id"]}
        yield f"parallel/{run['id']}", params, lambda run=run: _attempt(lambda: compare.predict(run, solver))
        yield (f"parallel-reference/{run['id']}", params,
               lambda run=run: _attempt_captured(lambda: compare.reference(run), num))


def parity_cases(root: Path):
    from mlsysim_core import TrainingMemoryModel
    parity = _module(root, "tests/validation/test_reference_parity.py", "_snapshot_test_reference_parity")
    solver = TrainingMemoryModel()
    grid = json.loads((root / "tests" / "data" / "reference_grid.json").read_text(encoding="utf-8"))["cases"]
    for case in grid:
        yield f"parity/{case['id']:04d}", {"grid_id": case["id"]}, lambda case=case: _attempt(
            lambda: parity._solve(solver, case))


def korthikanti_cases(root: Path):
    korthikanti = _module(root, "validation/published/korthikanti.py", "_snapshot_korthikanti")
    for name in korthikanti.RUNS:
        for recompute in ("none", "selective"):
            yield (f"korthikanti/{name}/{recompute}", {"run": name, "recompute": recompute},
                   lambda name=name, recompute=recompute: _attempt_captured(
                       lambda: korthikanti.predict(name, recompute), lambda pair: [num(x) for x in pair]))

    def rows():
        try:
            return {"values": [[name, what, num(published), num(predicted)]
                               for name, what, published, predicted in korthikanti.rows()]}
        except Exception as exc:
            return {"error": _error(exc)}
    yield "korthikanti/rows", {}, rows


# --- extra: measured-profile solves spanning the options -------------------------------------

MODELS = {"llama3-8b": 32, "mixtral-8x7b": 32, "openai-community/gpt2": 12}   # name: layers
HARDWARE = "h100"
REGIMES = ("fp32", "amp-bf16", "bf16", "mixed-bf16", "mixed-bf16-main-grad", "fsdp-bf16")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adafactor", "lion", "adam-8bit")
CHECKPOINTING = (("none", None), ("selective", None), ("full", None), ("full", 4))
DENSE_LAYOUTS = (   # tp, pp, dp, cp, data-parallel rule, sequence_parallel, gradient_accumulation_steps
    dict(tp_size=2), dict(tp_size=2, sequence_parallel=False), dict(tp_size=4), dict(pp_size=2),
    dict(pp_size=4, gradient_accumulation_steps=4), dict(dp_size=2), dict(dp_size=4, zero_stage=1),
    dict(dp_size=4, zero_stage=2), dict(dp_size=8, zero_stage=3), dict(dp_size=8, data_parallel="fsdp"),
    dict(dp_size=8, data_parallel="fsdp-grad-op"),
    dict(dp_size=16, data_parallel="hsdp", plugin_options={"hsdp": {"shard_group_size": 8}}),
    dict(cp_size=2), dict(cp_size=2, tp_size=2), dict(tp_size=2, pp_size=2, dp_size=2, zero_stage=1),
    dict(tp_size=4, pp_size=2, dp_size=4, zero_stage=3), dict(tp_size=2, cp_size=2, pp_size=2, dp_size=2, zero_stage=2),
    dict(tp_size=8, pp_size=4, dp_size=2, zero_stage=1, gradient_accumulation_steps=8),
    dict(tp_size=2, dp_size=4, data_parallel="fsdp", gradient_accumulation_steps=2),
)
MOE_LAYOUTS = (
    dict(ep_size=2, dp_size=2), dict(ep_size=8, dp_size=8), dict(ep_size=4, dp_size=8, zero_stage=1),
    dict(tp_size=2, ep_size=4, expert_tp_size=1, dp_size=4), dict(ep_size=8, pp_size=2, dp_size=8, data_parallel="fsdp"),
    dict(tp_size=2, ep_size=2, dp_size=2, zero_stage=3, sequence_parallel=False),
)
SCHEDULES = (("1f1b", None), ("gpipe", None), ("interleaved-1f1b", 2), ("zb-h1", None), ("zb-h2", None))
OFFLOADS = ("optimizer", "optimizer+gradients", "optimizer+gradients+parameters", {"optimizer": "nvme"},
            {"optimizer": "cpu", "gradients": "cpu", "parameters": "nvme"})
OFFLOAD_LAYOUTS = (dict(), dict(dp_size=4, zero_stage=1), dict(dp_size=8, zero_stage=3),
                   dict(dp_size=8, data_parallel="fsdp"))


def _extra(model, batch=None, seq=None, precision="bf16", optimizer="adamw", checkpointing="selective", **kw):
    """One extra case's parameters: the solve's first seven arguments and its keywords."""
    seq = seq or (1024 if model == "openai-community/gpt2" else 2048)
    micro = kw.get("dp_size", 1) * kw.get("gradient_accumulation_steps", 1)
    return dict(model=model, hardware=HARDWARE, batch_size=batch or 2 * micro, seq_len=seq, precision=precision,
                optimizer=optimizer, activation_checkpointing=checkpointing, **kw)


def extra_params() -> list[dict]:
    out = []
    models = list(MODELS)
    # regimes x optimizers, one device (fsdp-bf16: FSDP over 2 ranks), default runtime overheads
    for model, regime, optimizer in itertools.product(models, REGIMES, OPTIMIZERS):
        kw = dict(dp_size=2, data_parallel="fsdp") if regime == "fsdp-bf16" else {}
        out.append(_extra(model, 4 if not kw else 8, precision="fp32" if regime == "fp32" else "bf16",
                          optimizer=optimizer, checkpointing="none", regime=regime, **kw))
    # precision alone (the regime from it), and the 16-bit float regimes
    for model, precision in itertools.product(models, ("fp32", "bf16", "fp16")):
        out.append(_extra(model, 4, precision=precision, runtime_overheads=False))
    for model, regime in itertools.product(models, ("amp-fp16", "fp16")):
        out.append(_extra(model, 4, precision="fp16", regime=regime, runtime_overheads=False))
    # checkpointing x attention x dropout; the optimizer step implementations
    for model, (ckpt, blocks), attention, dropout in itertools.product(models, CHECKPOINTING, ("sdpa", "eager"),
                                                                       (0.0, 0.1)):
        kw = {} if blocks is None else {"checkpointed_layers": blocks}
        out.append(_extra(model, 2, checkpointing=ckpt, regime="bf16", attention=attention, dropout=dropout,
                          runtime_overheads=False, **kw))
    for model, impl in itertools.product(models, ("foreach", "fused", "for-loop")):
        out.append(_extra(model, 2, regime="amp-bf16", optimizer_impl=impl, checkpointing="full",
                          runtime_overheads=False))
    out.append(_extra("llama3-8b", 2, checkpointing="full", checkpointed_layers=0, runtime_overheads=False))
    out.append(_extra("llama3-8b", 2, checkpointing="full", checkpointed_layers=32, regime="mixed-bf16",
                      runtime_overheads=False))
    # layouts (MoE layouts on Mixtral), default runtime overheads
    for model, layout in itertools.product(models, DENSE_LAYOUTS):
        out.append(_extra(model, regime="mixed-bf16", **layout))
    for layout in MOE_LAYOUTS:
        out.append(_extra("mixtral-8x7b", regime="mixed-bf16", **layout))
        out.append(_extra("mixtral-8x7b", regime="bf16", checkpointing="full", runtime_overheads=False, **layout))
    # pipeline schedules
    for model, (schedule, v), pp in itertools.product(models, SCHEDULES, (2, 4)):
        kw = {} if v is None else {"virtual_stages": v}
        out.append(_extra(model, regime="mixed-bf16-main-grad", tp_size=2, pp_size=pp, gradient_accumulation_steps=8,
                          pipeline_schedule=schedule, runtime_overheads=False, **kw))
    out.append(_extra("llama3-8b", pp_size=4, gradient_accumulation_steps=8, stage_layers=[6, 10, 10, 6],
                      runtime_overheads=False))
    out.append(_extra("llama3-8b", pp_size=4, gradient_accumulation_steps=8, pipeline_schedule="interleaved-1f1b",
                      virtual_stages=4, runtime_overheads=False))
    # offload
    for model, offload, layout in itertools.product(("llama3-8b", "mixtral-8x7b"), OFFLOADS, OFFLOAD_LAYOUTS):
        out.append(_extra(model, regime="mixed-bf16", offload=offload, **layout))
    # MoE token dropping
    for cf, ep in itertools.product((1.0, 1.25, 2.0), (1, 2, 8)):
        out.append(_extra("mixtral-8x7b", regime="bf16", moe_capacity_factor=cf, ep_size=ep, dp_size=ep,
                          runtime_overheads=False))
    out.append(_extra("llama3-8b", moe_capacity_factor=1.25, runtime_overheads=False))
    # LoRA / QLoRA on catalog models
    for model, lora in itertools.product(("llama3-8b", "openai-community/gpt2"), (
            {"rank": 16}, {"rank": 8, "target_modules": "all-linear"}, {"rank": 16, "quantization": "nf4"},
            {"rank": 16, "quantization": "nf4", "double_quant": True}, {"rank": 4, "quantization": "int8"})):
        out.append(_extra(model, 4, regime="amp-bf16", lora=lora, runtime_overheads=False))
    # sequence lengths, micro-batches, a different accelerator
    for model, seq, batch in itertools.product(models, (512, 1024), (1, 16)):
        out.append(_extra(model, batch, seq, regime="bf16", checkpointing="none", runtime_overheads=False))
    for model in models:
        out.append(dict(_extra(model, 8, regime="bf16", tp_size=2), hardware="a100"))
    return out


def _key(params: dict) -> str:
    return json.dumps(params, sort_keys=True, separators=(",", ":"))


def extra_cases(root: Path):
    from mlsysim_core import TrainingMemoryModel
    solver = TrainingMemoryModel("measured")
    seen = set()
    for params in extra_params():
        key = _key(params)
        if key in seen:
            continue
        seen.add(key)

        def call(p=params):
            p = dict(p)
            positional = [p.pop(k) for k in ("model", "hardware", "batch_size", "seq_len", "precision", "optimizer",
                                             "activation_checkpointing")]
            return _attempt(lambda: solver.solve(*positional, **p))
        yield f"extra/{key}", params, call


GROUPS = {"validation": validation_cases, "lora": lora_cases, "parallel": parallel_cases, "parity": parity_cases,
          "korthikanti": korthikanti_cases, "extra": extra_cases}


def cases(root: Path = TOOL_ROOT, groups=None):
    """``(case id, params, thunk)`` for every case; the thunk returns the case's entry."""
    for name, make in GROUPS.items():
        if groups is None or name in groups:
            yield from make(root)


def snapshot(root: Path = TOOL_ROOT, groups=None, select=None) -> dict:
    """``{case id: {"params": ..., "result"|"error"|"values": ...}}``; ``select(case id)`` picks a subset."""
    out = {}
    for case_id, params, thunk in cases(root, groups):
        if select is not None and not select(case_id):
            continue
        if case_id in out:
            raise RuntimeError(f"duplicate case id {case_id}")
        out[case_id] = {"params": params, **thunk()}
    return out


def _commit(root: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the JSON file to write (.gz: gzip)")
    parser.add_argument("--compare", metavar="SNAPSHOT", help="print the cases whose numbers differ from SNAPSHOT")
    parser.add_argument("--root", default=str(TOOL_ROOT),
                        help="the tree whose validation/ and tests/ data and mapping code are used")
    args = parser.parse_args(argv)
    import mlsysim_core
    root = Path(args.root).resolve()
    package = Path(mlsysim_core.__file__).resolve()
    if root not in package.parents:
        print(f"warning: mlsysim_core is imported from {package}, not from --root {root}", file=sys.stderr)
    entries = snapshot(root)
    if args.compare:
        diffs = differences(load(Path(args.compare))["cases"], entries)
        for case_id, params, fields in diffs:
            print(case_id if case_id.startswith("extra/") else f"{case_id} {json.dumps(params, sort_keys=True)}")
            for field in fields:
                print(f"    {field}")
        print(f"{len(diffs)} cases differ")
        if not args.out:
            return 1 if diffs else 0
    if not args.out:
        parser.error("--out or --compare is needed")
    doc = {"generator": "tools/snapshot_predictions.py", "commit": _commit(root),
           "python": f"{sys.version_info.major}.{sys.version_info.minor}", "cases": entries}
    text = json.dumps(doc, sort_keys=True, indent=0, separators=(",", ":"), ensure_ascii=True) + "\n"
    out = Path(args.out)
    if out.suffix == ".gz":
        import gzip
        out.write_bytes(gzip.compress(text.encode("ascii"), mtime=0))
    else:
        out.write_text(text, encoding="ascii")
    errors = sum("error" in e for e in entries.values())
    print(f"{len(entries)} cases ({errors} errors) from mlsysim_core at {package.parent} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
