"""The uncached measured solve (issue 27, item 5): a grid of solves, each at a batch size the memos have
not seen on a layout they have, gives every solve's own answer, term by term.

``benchmarks/uncached.py`` times exactly this case (Llama-3.1-8B, H100, tp2 pp2 dp8 ZeRO-2, a new batch
every call): whatever is kept per layout, per model, per layer or per object between its solves must not
change a byte. Each result is compared with the same solve with every memo cleared and off
(``memo.set_enabled(False)``), rank by rank and term by term: every field of every term, the type of its
bytes (an int that became a float, or the reverse, is a difference ``==`` would not see), the totals and
their types. The grid includes one micro-batch (``tokens == seq_len``: the kernels' case of its own) and
micro-batches past any seen before.
"""

import attrs
import pytest

from mlsysim_core import TrainingMemoryModel, memo

# (model, solve keywords)
LAYOUTS = [
    ("llama3-8b", dict(tp_size=2, pp_size=2, dp_size=8, zero_stage=2)),     # benchmarks/uncached.py's
    ("llama3-8b", dict(tp_size=2, dp_size=2, sequence_parallel=True, activation_checkpointing="full",
                       attention="eager", regime="amp-bf16")),
    ("mixtral-8x7b", dict(tp_size=2, pp_size=2, dp_size=4, ep_size=2, zero_stage=1)),
]
# micro-batches, each new to the memos when solved in this order (1: tokens == seq_len), then one again
MICRO_BATCHES = [3, 1, 2, 5, 8, 13, 2]
SEQ = 2048


def _terms(result):
    return [(*(getattr(t, f.name) for f in attrs.fields(type(t))), type(t.nbytes)) for t in result.terms]


def _snapshot(result):
    """Everything a result says, with the types of its numbers: per rank, each term's every field."""
    if isinstance(result, str):
        return result
    totals = {f: (getattr(result, f), type(getattr(result, f))) for f in (
        "total_memory", "weights", "gradients", "optimizer_state", "activations", "communication_buffers",
        "runtime_overheads", "host_memory", "feasible", "peak_phase", "microbatch", "layers_per_stage")}
    ranks = [(r.name, r.total_memory, type(r.total_memory), r.peak_phase,
              [(*(getattr(t, f.name) for f in attrs.fields(type(t))), type(t.nbytes)) for t in r.terms])
             for r in (result.ranks or ())]
    return totals, _terms(result), ranks, result.notes, result.to_json()


def _solve(solver, model, layout, micro):
    try:
        return solver.solve(model, "h100", micro * layout.get("dp_size", 1), SEQ, **layout)
    except Exception as err:      # (a refusal must be the same refusal)
        return repr(err)


@pytest.mark.parametrize("model, layout", LAYOUTS, ids=[f"{m}-{i}" for i, (m, _) in enumerate(LAYOUTS)])
def test_new_batch_sizes_equal_the_solves_with_every_memo_cleared(model, layout):
    solver = TrainingMemoryModel("measured")
    memo.set_enabled(True)      # (starts empty)
    _solve(solver, model, layout, 4)      # the layout seen once: what is kept per layout is there
    uncached = [_snapshot(_solve(solver, model, layout, m)) for m in MICRO_BATCHES]
    memo.set_enabled(False)
    try:
        alone = [_snapshot(_solve(solver, model, layout, m)) for m in MICRO_BATCHES]
    finally:
        memo.set_enabled(True)
    assert sum(not isinstance(r, str) for r in alone) >= 4, alone      # the layout solves
    for m, one, other in zip(MICRO_BATCHES, uncached, alone):
        assert one == other, m
