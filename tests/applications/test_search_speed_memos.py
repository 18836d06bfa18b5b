"""A measured search after other searches answers exactly as a search with every memo off (issue 27,
item 5: what the measured profile keeps per layout, per model and per layer is keyed on things other
than the batch, so a search that meets the same layouts at other batch sizes and accumulation steps
reuses it; none of it may change a row)."""

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
