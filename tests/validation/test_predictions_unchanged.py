"""The numbers are those of commit e1a32f2 (issue 15: the measured profile's tensor parallelism), exactly.

tests/data/predictions_issue15.json.gz was written by tools/snapshot_predictions.py with the
package of that commit (a worktree on the path; how: the tool's docstring): every run of the
validation data (validation/measurements.json, lora_measurements.json, parallel/measurements.json)
solved as the code that owns each mapping solves it, the whole reference parity grid, the
Korthikanti et al. reproduction, and a few hundred measured-profile solves spanning regimes,
optimizers, checkpointing, attention, dropout, layouts, pipeline schedules, offload, MoE capacity
and LoRA. Here every case is solved again with the current code and its numbers compared exactly
(``repr`` of every float): totals, components, host memory, runtime overheads, peak phase, per-rank
results, the bytes alive per tier, component and phase, the multiset of term sizes per component,
and which cases are errors (by class). Term labels and sources, notes, spec names and error
messages may change; numbers may not.

That baseline differs from the previous one (tests/data/predictions_issue13.json.gz, commit
98d9a2c, which closed issue 13) only by three deliberate changes, checked case by case below
(``_intended``): context parallelism alone gets NCCL's buffers (issue 14); the measured profile's
``sequence_parallel`` default is off (PyTorch's and Hugging Face's TP plans; issue 15), which changes
its tensor-parallel cases and the flag every measured result reports; and the activations
outside the layers under PyTorch TP follow the per-rank measurements of validation/parallel/
tp_phases and tp_plans (the embedding's backward counts the rank's V x h/tp share once; with
sequence parallelism the LM head's input is all-gathered and the embedding output's gradient
whole; fp32 gathered logits peak at the all-gather); and under autocast the final norm's fp32
output is alive until the loss (a forward-phase term, issue 15's family validation); and under
recomputation the first layer's late gradients are its share of each parameter, and full
checkpointing's last moment is the larger of layer 0's recomputed MLP backward and the embedding's
backward (the end of the backward only). Any other difference is a regression, or a new baseline that says so in
CHANGELOG.md.
"""

import re
import json
from collections import Counter
from pathlib import Path

import pytest

from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
SNAPSHOT = ROOT / "tests" / "data" / "predictions_issue15.json.gz"
PREVIOUS = ROOT / "tests" / "data" / "predictions_issue13.json.gz"
SHOWN_CASES, SHOWN_FIELDS = 25, 8


def _tool():
    return load_script("tools/snapshot_predictions.py")


@pytest.fixture(scope="module")
def tool():
    return _tool()


@pytest.fixture(scope="module")
def recorded(tool):
    return tool.load(SNAPSHOT)


def test_the_snapshot_is_issue_15s_commit_and_covers_every_case_family(recorded):
    assert recorded["commit"].startswith("e1a32f2")
    groups = Counter(case_id.split("/")[0] for case_id in recorded["cases"])
    assert groups["validation"] == groups["validation-reference"] >= 96
    assert groups["parallel"] == groups["parallel-reference"] >= 65
    assert groups["lora"] >= 15 and groups["parity"] >= 1500 and groups["korthikanti"] == 9
    assert groups["extra"] >= 300
    solved = [e for e in recorded["cases"].values() if "result" in e]
    assert len(solved) >= 2000
    assert sum(bool(e["result"]["ranks"]) for e in solved) >= 200     # parallel layouts: per-rank results


NCCL_BUFFERS = 256 * 2**20     # RuntimeOverheads().nccl_buffers


def _cp_only(params) -> bool:
    """Context parallelism the only parallel axis."""
    return params.get("cp_size", 1) > 1 and all(params.get(f"{a}_size", 1) == 1 for a in ("tp", "pp", "dp", "ep"))


def _tp(case_id, params) -> bool:
    return params.get("tp_size", 1) > 1 or bool(re.search(r"^parallel(-reference)?/(tp|2d-.*tp\d)", case_id))


def _intended(case_id, fields, previous, baseline) -> bool:
    """Is this difference between the previous baseline (98d9a2c) and this one deliberate?
    (1, issue 14) a layout whose only parallel axis is context parallelism communicates: its
    total and runtime overheads grew by exactly NCCL's buffers, in every phase; (2, issue 15)
    a measured result not told its ``sequence_parallel`` reports the profile's default, off;
    tensor-parallel cases not told it now run without it (every number may change); (3, issue
    15) any tensor-parallel case: the activations outside the layers (validation/parallel/tp_plans);
    (4, issue 15) any case: the forward phase's activations alone (autocast's final norm output);
    (5, issue 16) any case: the end of the backward alone (the first layer's late gradients; full
    checkpointing's last moment)."""
    old, new = previous[case_id], baseline.get(case_id, {})
    if _cp_only(old["params"]):
        return "result" in old and "result" in new and _grew_by_nccl(old["result"], new["result"]) \
            and len(old["result"]["ranks"]) == len(new["result"]["ranks"]) \
            and all(_grew_by_nccl(a, b) for a, b in zip(old["result"]["ranks"], new["result"]["ranks"]))
    told = "sequence_parallel" in old["params"]
    if all(f.startswith(("sequence_parallel: True -> False", "ranks[")) and "sequence_parallel: True -> False" in f
           for f in fields):
        return not told
    rest = [f for f in fields if told or "sequence_parallel: True -> False" not in f]
    # (where the forward is the peak, the peak's totals grow with it)
    peak_fields = ("activations:", "total_memory:", "memory_utilization:", "runtime_overheads:") \
        if new.get("result", {}).get("peak_phase") == "forward" else ()
    forward_only = all("forward" in f or "term_nbytes.activations" in f or f.startswith(peak_fields) for f in rest)
    # (the end of the backward: the gradients split between it and the step; its totals where it is the peak)
    end_fields = ("gradients:", "total_memory:", "memory_utilization:", "runtime_overheads:", "activations:") \
        if new.get("result", {}).get("peak_phase") == "backward_end" else ()
    end_only = all("backward_end" in f or "term_nbytes." in f or f.startswith(end_fields) for f in rest)
    return _tp(case_id, old["params"]) or forward_only or end_only or _both(rest, peak_fields, end_fields)


def _both(fields, peak_fields, end_fields) -> bool:
    """Changes (4) and (5) together in one case."""
    return all("forward" in f or "backward_end" in f or "term_nbytes." in f or f.startswith(peak_fields + end_fields)
               for f in fields)


def _grew_by_nccl(a: dict, b: dict) -> bool:
    grown = {k: float(b[k]) - float(a[k]) for k in ("total_memory", "runtime_overheads")}
    same = [k for k in a if k not in ("total_memory", "runtime_overheads", "memory_utilization", "sums", "terms",
                                      "feasible", "notes", "ranks", "sequence_parallel")]
    return grown == {"total_memory": NCCL_BUFFERS, "runtime_overheads": NCCL_BUFFERS} and \
        all(b.get(k) == a[k] for k in same)


def _respelled_names(diffs, current) -> list:
    """Issue 23: names resolve case- and separator-insensitively (``registry.resolve_name``),
    so a parity case the reference refused only for a spelling ('Selective', 'adam w') now
    solves, to the very numbers of the name it spells. Those differences, each checked so."""
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.registry import name_key
    solver = TrainingMemoryModel()
    grid = {c["id"]: c for c in json.loads((ROOT / "tests" / "data" / "reference_grid.json").read_text())["cases"]}
    tables = {"optimizer": solver.registry.optimizers, "activation_checkpointing": solver.registry.checkpointing}
    tool = _tool()
    parity = tool._module(ROOT, "tests/validation/test_reference_parity.py", "_respelled_parity")
    explained = []
    for case_id, params, fields in diffs:
        if not (case_id.startswith("parity/") and len(fields) == 1 and fields[0].endswith("-> solved")):
            continue
        case = grid[params["grid_id"]]
        spelled = {k: case["kwargs"][k] for k in tables}
        canonical = {k: next((n for n in tables[k] if name_key(n) == name_key(v)), None) if isinstance(v, str)
                     else None for k, v in spelled.items()}
        if None in canonical.values() or canonical == spelled:
            continue
        as_named = parity._solve(solver, {**case, "kwargs": {**case["kwargs"], **canonical}})
        if tool.record(as_named) == current[case_id]["result"]:
            explained.append(case_id)
    return explained


CUBLAS_SM90, CUBLAS_OTHER = 32 * 2**20, 8 * 2**20 + 128 * 2**10


def _cublas_workspaces(params, fields) -> bool:
    """The deliberate changes of the cuBLAS workspaces (pytorch/pytorch 26a39059
    aten/src/ATen/cuda/CublasHandlePool.cpp): PyTorch's default by the GPU's compute capability (an A100,
    8.0: 8 MiB + 128 KiB where 32 MiB was priced), and one per thread that runs GEMMs (the forward's and the
    autograd engine's device thread: two where one was priced). A case whose only difference is that
    workspace, in the runtime overheads and the totals."""
    new = 2 * (CUBLAS_OTHER if "a100" in str(params.get("hardware", "")).lower() else CUBLAS_SM90)
    delta = f"delta {new - CUBLAS_SM90:+g}"
    swapped = f"gone ['{CUBLAS_SM90}'], new ['{new}']"
    return any(swapped in f for f in fields) and all(
        delta in f or swapped in f or f.startswith("memory_utilization:") for f in fields)


def _halved_embedding_gradient(case_id, params, fields) -> bool:
    """The deliberate change of issue 25 (G's finding): under Megatron-Core's main-grad regime the
    embedding lookup's gradient is made in the weight's dtype (bf16, 2 B; the DDP hook adds it to the
    fp32 main_grad and drops it), where 4 B was priced: the one backward_end term halved, and what
    adds it up (with the cuBLAS workspaces' change beside it where that case has it)."""
    if not (params.get("regime") == "mixed-bf16-main-grad" or case_id.startswith("korthikanti/")):
        return False
    halved = False
    for f in fields:
        swap = re.search(r"term_nbytes\.activations: .*gone \['([0-9.e+]+)'\], new \['([0-9.e+]+)'\]", f)
        if swap:
            if float(swap.group(1)) != 2 * float(swap.group(2)):
                return False
            halved = True
        elif not ("activations/backward_end" in f or "runtime_overheads" in f
                  or f.split(": ")[0].split(".")[-1] in ("total_memory", "memory_utilization", "activations")):
            return False
    return halved and _cublas_or_none(params, fields)


def _bottom_layer_backward(case_id, params, fields) -> bool:
    """The deliberate change of issue 25 item 2 (LORACKPT): eager LoRA with every layer checkpointed prices the
    backward's end as the bottom layer's backward (lora._bottom_layer_backward: the top layer's moment with the first
    layer's own saved set; over a 4-bit base less the dequantized weight, which is its own term) where the recompute
    working set of a later layer was priced: one activations term at backward_end swapped, and its sums (the
    totals too where the end is the peak). Of the recorded cases only lora/lora-llama-tiny-fp32-r16-all-ckpt-b4-s256
    (the first layer's saved set 4,096 B smaller: -4,096 B at backward_end, not the peak)."""
    if not (case_id.startswith("lora/") and "-ckpt-" in case_id) and not (
            params.get("lora") and params.get("checkpointing") == "full"):
        return False
    swaps = [f for f in fields if re.fullmatch(r"term_nbytes\.activations: (\d+) terms -> \1; gone \['[0-9.e+]+'\], "
                                               r"new \['[0-9.e+]+'\].*", f)]
    return len(swaps) == 1 and all(
        f in swaps or "activations/backward_end" in f
        or f.split(": ")[0].split(".")[-1] in ("total_memory", "memory_utilization", "activations") for f in fields)


def _cublas_or_none(params, fields) -> bool:
    """The runtime overheads moved only as the cuBLAS workspaces' change moves them (or not at all)."""
    overheads = [f for f in fields if "runtime_overheads" in f]
    return not overheads or _cublas_workspaces(params, overheads)


def test_predictions_unchanged(tool, recorded):
    """Every recorded case's numbers, recomputed now, exactly (every case: the whole run takes seconds),
    but for the deliberate change of issue 23 (``_respelled_names``)."""
    current = tool.snapshot(ROOT)
    diffs = tool.differences(recorded["cases"], current)
    respelled = set(_respelled_names(diffs, current))
    assert len(respelled) == 8      # the grid's 'Selective', 'NONE', 'None', 'FULL', 'Full', 'adam w', 'adam8bit'
    diffs = [d for d in diffs if d[0] not in respelled and not _cublas_workspaces(d[1], d[2])
             and not _halved_embedding_gradient(*d) and not _bottom_layer_backward(*d)]
    if not diffs:
        return
    by_group = Counter(case_id.split("/")[0] for case_id, _, _ in diffs)
    lines = [f"{len(diffs)} of {len(recorded['cases'])} cases differ from commit e1a32f2 "
             f"({', '.join(f'{g}: {n}' for g, n in sorted(by_group.items()))}); the first {SHOWN_CASES}:"]
    for case_id, params, fields in diffs[:SHOWN_CASES]:
        lines.append(case_id if case_id.startswith("extra/") else f"{case_id} {json.dumps(params, sort_keys=True)}")
        lines += [f"    {field}" for field in fields[:SHOWN_FIELDS]]
        if len(fields) > SHOWN_FIELDS:
            lines.append(f"    ... and {len(fields) - SHOWN_FIELDS} more fields")
    lines.append("(all of them: python tools/snapshot_predictions.py --compare tests/data/predictions_issue15.json.gz)")
    pytest.fail("\n".join(lines), pytrace=False)


def test_differences_are_found(tool, recorded):
    """The comparison itself: a relabelled term is no difference; a term one byte larger, or an
    error that now solves, is."""
    cases = recorded["cases"]
    ranked = next(k for k, e in cases.items() if k.startswith("extra/") and e.get("result", {}).get("ranks"))
    failed = next(k for k, e in cases.items() if "error" in e)
    old = {k: cases[k] for k in (ranked, failed)}
    relabelled = json.loads(json.dumps(old))
    for term in relabelled[ranked]["result"]["terms"] + relabelled[ranked]["result"]["ranks"][-1]["terms"]:
        term[1] = "a new label"
    assert tool.differences(old, relabelled) == []
    changed = json.loads(json.dumps(relabelled))
    term = changed[ranked]["result"]["ranks"][-1]["terms"][0]
    term[2] = repr(float(term[2]) + 1)
    changed[failed] = {"params": changed[failed]["params"], "result": cases[ranked]["result"]}
    diffs = {case_id: fields for case_id, _, fields in tool.differences(old, changed)}
    assert set(diffs) == {ranked, failed}
    assert diffs[failed] == [f"outcome: {old[failed]['error']:.400} -> solved"]
    assert [f for f in diffs[ranked] if f.startswith("ranks[") and "term_nbytes" in f and "(delta +1" in f], diffs[ranked]
    assert tool.differences(old, {ranked: old[ranked]}) == [(failed, old[failed]["params"],
                                                             ["case missing from the current cases"])]


def test_this_baseline_differs_from_the_previous_only_by_the_intended_changes(tool, recorded):
    """The two snapshot files, compared case by case: every difference is one of the three
    deliberate changes (``_intended``), and each of the three happened."""
    previous = tool.load(PREVIOUS)["cases"]
    diffs = tool.differences(previous, recorded["cases"])
    unexplained = [(c, f[:3]) for c, _, f in diffs if not _intended(c, f, previous, recorded["cases"])]
    assert not unexplained, unexplained[:5]
    ids = {c for c, _, _ in diffs}
    assert len([c for c in ids if _cp_only(previous[c]["params"])]) >= 3
    assert len([c for c in ids if _tp(c, previous[c]["params"]) and "sequence_parallel" not in previous[c]["params"]]) >= 20
    told = [c for c in ids if c.startswith("parallel/tp-")]
    assert len(told) >= 5      # the embedding backward: V x h/tp fewer bytes at backward_end
