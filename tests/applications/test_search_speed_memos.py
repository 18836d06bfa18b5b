"""A measured search after other searches answers exactly as a search with every memo off (issue 27,
item 5: what the measured profile keeps per layout, per model and per layer is keyed on things other
than the batch, so a search that meets the same layouts at other batch sizes and accumulation steps
reuses it; none of it may change a row)."""

import pytest

from mlsysim_core import memo, search

KWARGS = dict(devices=4, seq_len=1024, profile="measured", workers=1, data_parallel=["zero1", "zero3"],
              checkpointing=["selective", "full"])


def _rows(found):
    return [tuple(c) for c in found.fits], [tuple(c) for c in found.pareto], found.candidates, found.solves


def test_a_search_after_others_equals_one_with_every_memo_off():
    memo.set_enabled(True)
    for batch in (16, 64):      # the same layouts at other micro-batches and accumulation steps first
        search.search_plans("llama3-8b", "h100", global_batch=batch, **KWARGS)
    warm = _rows(search.search_plans("llama3-8b", "h100", global_batch=32, **KWARGS))
    memo.set_enabled(False)
    try:
        cold = _rows(search.search_plans("llama3-8b", "h100", global_batch=32, **KWARGS))
    finally:
        memo.set_enabled(True)
    assert warm[0], "no layout fits: the case tests nothing"
    assert warm == cold



@pytest.mark.long       # a whole search (about 2 s)
def test_a_step_time_met_again_in_a_search_is_the_one_computed_for_the_row(monkeypatch):
    """A search times a layout once per step-time call (strategies that recompute the same share, e.g.
    none and selective with fused attention, make the same call): every row's step time is its own
    call's, before one row per answer (which drops such a row where its memory is the same too) and
    in the interleaved variants."""
    before = []
    one_row = search._one_row_per_answer
    monkeypatch.setattr(search, "_one_row_per_answer", lambda fits: before.extend(fits) or one_row(fits))
    found = search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, seq_len=1024, profile="measured",
                                workers=1, data_parallel=["zero1"], checkpointing=["none", "selective"],
                                interleave=True)
    calls = [(c.tp, c.cp, c.pp, c.dp, c.ep, c.vp, c.sequence_parallel, c.microbatch, c.recompute) for c in before]
    assert len(set(calls)) < len(calls) and any(c.vp > 1 for c in before) and found.fits
    assert all(c.step_time == found.components(c)["step"] for c in before)
