"""A search with rules' options (issue 27 item 3): ``search_plans(plugin_options=)`` and
``search --option SPEC.FIELD=VALUE``. Each option applies to the layouts that select its spec,
in their memory and their step time; every row equals timing its layout alone with ``time_plan``
and the options that layout selects; the other layouts, and a search without options, unchanged."""

from __future__ import annotations

import json
import math

import pytest

from mlsysim_core.cli import main
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.search import search_plans, time_plan

RUN = dict(devices=8, global_batch=16, seq_len=2048, checkpointing=["full"], data_parallel=["fsdp", "zero1"],
           sequence_parallel=[True], context_parallel=[1, 2], precision="bf16", optimizer="adamw",
           profile="measured", workers=1)
NO_SYNC = {"fsdp": {"gradient_sync": "no_sync"}}
RING = {"cp": {"ring": "transformer-engine"}}


def _alone(found, c, plugin_options):
    """The row's layout timed on its own (`mlsysim-core time --option ...`), with the options it selects."""
    mine = {n: o for n, o in plugin_options.items() if n in ("tp", "cp", "pp", "ep", c.data_parallel)}
    return time_plan(found.model, found.hardware, global_batch=found.global_batch, seq_len=found.seq_len, tp=c.tp,
                     cp=c.cp, pp=c.pp, dp=c.dp, ep=c.ep, data_parallel=c.data_parallel, checkpointing=c.checkpointing,
                     microbatch=c.microbatch, sequence_parallel=c.sequence_parallel, precision=found.run["precision"],
                     optimizer=found.run["optimizer"], profile=found.profile,
                     **({"plugin_options": mine} if mine else {}))


@pytest.fixture(scope="module")
def searches():
    return {name: search_plans("llama3-8b", "h100", **RUN, **({"plugin_options": given} if given else {}))
            for name, given in (("plain", None), ("no_sync", NO_SYNC), ("ring", RING))}


@pytest.mark.parametrize("name, given", [("no_sync", NO_SYNC), ("ring", RING)])
def test_every_row_equals_its_layout_timed_alone_with_the_options(searches, name, given):
    found = searches[name]
    assert found.fits and found.run["plugin_options"] == given      # (the fields not the defaults)
    for c in found.fits:
        alone = _alone(found, c, given)
        assert alone["layout"]["gradient_accumulation_steps"] == c.gradient_accumulation_steps
        assert alone["memory_bytes"] == c.total_memory       # exact
        assert math.isclose(alone["step_s"], c.step_time, rel_tol=1e-12)
        assert alone["components"] == pytest.approx(found.components(c), rel=1e-12)


def test_an_option_changes_only_the_layouts_that_select_its_spec(searches):
    plain = {c[:10]: c for c in searches["plain"].fits}
    for name, changed in (("no_sync", lambda c: c.data_parallel == "fsdp" and c.gradient_accumulation_steps > 1),
                          ("ring", lambda c: c.cp > 1)):
        rows = {c[:10]: c for c in searches[name].fits}
        same = [k for k in plain if k in rows and not changed(plain[k])]
        assert same and all(rows[k] == plain[k] for k in same)     # byte for byte
        moved = [k for k in plain if k in rows and changed(plain[k])]
        assert moved and all(rows[k].step_time != plain[k].step_time for k in moved)
    # FSDP1 under no_sync keeps the unsharded gradients across the micro-batches: more memory, never less
    rows = {c[:10]: c for c in searches["no_sync"].fits}
    assert all(rows[k].total_memory > plain[k].total_memory for k in plain
               if k in rows and plain[k].data_parallel == "fsdp" and plain[k].gradient_accumulation_steps > 1)


def test_no_options_is_the_search_it_was(searches):
    empty = search_plans("llama3-8b", "h100", plugin_options={}, **RUN)
    assert empty.fits == searches["plain"].fits and "plugin_options" not in searches["plain"].run


def test_an_option_no_layout_selects_or_a_bad_field_is_refused():
    with pytest.raises(InvalidInputError) as err:
        search_plans("llama3-8b", "h100", plugin_options={"hsdp": {"replicate": 2}}, **RUN)
    assert err.value.parameter == "plugin_options" and err.value.value == "hsdp"
    assert "fsdp" in str(err.value) and "zero1" in str(err.value)
    with pytest.raises(InvalidInputError) as err:
        search_plans("llama3-8b", "h100", plugin_options={"fsdp": {"gradient_sync": "sometimes"}}, **RUN)
    assert err.value.parameter == "plugin_options['fsdp']"


def test_the_cli_search_takes_option(searches, capsys):
    args = ["search", "-m", "llama3-8b", "-g", "h100", "-n", "8", "--global-batch", "16", "-s", "2048",
            "--precision", "bf16", "--optimizer", "adamw", "--checkpointing", "full", "--cp", "1", "2",
            "--workers", "1", "--no-progress", "--json"]
    assert main([*args, "--option", "fsdp.gradient_sync=no_sync"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run"]["plugin_options"] == NO_SYNC
    rows = {(r["tp"], r["cp"], r["pp"], r["dp"], r["data_parallel"], r["sequence_parallel"], r["microbatch"]): r
            for r in out["fits"]}
    for c in searches["no_sync"].fits:        # the same rows as the Python call's (its data-parallel rules)
        key = (c.tp, c.cp, c.pp, c.dp, c.data_parallel, c.sequence_parallel, c.microbatch)
        assert rows[key]["total_memory"] == c.total_memory and rows[key]["step_time"] == c.step_time
    assert main([*args[:-1], "--rows", "1", "--option", "fsdp.gradient_sync=no_sync"]) == 0
    assert "options fsdp.gradient_sync='no_sync'" in capsys.readouterr().out
    assert main([*args, "--option", "nope.field=1"]) == 2
    assert "plugin_options='nope' is not allowed: options for a spec a layout of this search selects" in \
        capsys.readouterr().err


def test_two_workers_give_the_same_rows_with_options(searches):
    """The worker processes evaluate the layouts with the same options (their context is the search's)."""
    found = search_plans("llama3-8b", "h100", **{**RUN, "workers": 2}, plugin_options=NO_SYNC)
    assert found.fits == searches["no_sync"].fits


def test_a_pipeline_rule_option_under_the_opt_in_axes():
    """pp.p2p / pp.stages (every layout selects the pp rule) with the interleave axis: each row,
    interleaved or not, equals its layout timed alone with the option."""
    given = {"pp": {"p2p": "overlapped", "stages": "ends-one-fewer"}}
    run = {**RUN, "data_parallel": ["zero1"], "context_parallel": [1]}
    found = search_plans("llama3-8b", "h100", interleave=True, plugin_options=given, **run)
    plain = {c[:10] + c[18:]: c for c in search_plans("llama3-8b", "h100", interleave=True, **run).fits}
    assert any(c.vp > 1 for c in found.fits) and any(c.pp == 1 for c in found.fits)
    for c in found.fits:
        alone = time_plan(found.model, found.hardware, global_batch=16, seq_len=2048, tp=c.tp, cp=c.cp, pp=c.pp,
                          dp=c.dp, ep=c.ep, vp=c.vp if c.pp > 1 else None, data_parallel=c.data_parallel,
                          checkpointing=c.checkpointing, microbatch=c.microbatch,
                          sequence_parallel=c.sequence_parallel, precision="bf16", optimizer="adamw",
                          profile="measured", plugin_options=given)
        assert alone["memory_bytes"] == c.total_memory
        assert math.isclose(alone["step_s"], c.step_time, rel_tol=1e-12)
        if c.pp > 1:        # (the stages' sends overlapped, the ends one layer fewer: another step time)
            assert c.step_time != plain[c[:10] + c[18:]].step_time


def test_a_checkpointing_strategy_option_applies_to_its_layouts_only():
    """every-k's k (its recompute share 1/k, read from the one-device plan with the option): the
    every-k rows equal every-k timed alone with k=4; the full rows keep theirs."""
    given = {"every-k": {"k": 4}}
    run = {**RUN, "checkpointing": ["full", "every-k"], "data_parallel": ["zero1"], "context_parallel": [1]}
    found = search_plans("llama3-8b", "h100", plugin_options=given, **run)
    assert found.assumptions["recompute.every-k"] == 0.25 and found.assumptions["recompute.full"] == 1.0
    assert {c.checkpointing for c in found.fits} == {"full", "every-k"}
    for c in found.fits:
        mine = given if c.checkpointing == "every-k" else {}
        alone = time_plan(found.model, found.hardware, global_batch=16, seq_len=2048, tp=c.tp, cp=c.cp, pp=c.pp,
                          dp=c.dp, ep=c.ep, data_parallel=c.data_parallel, checkpointing=c.checkpointing,
                          microbatch=c.microbatch, sequence_parallel=c.sequence_parallel, precision="bf16",
                          optimizer="adamw", profile="measured", **({"plugin_options": mine} if mine else {}))
        assert alone["memory_bytes"] == c.total_memory
        assert math.isclose(alone["step_s"], c.step_time, rel_tol=1e-12)
