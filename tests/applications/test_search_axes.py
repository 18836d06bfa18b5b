"""The search's opt-in axes (issue 27 item 3): expert parallelism across nodes, the interleave
factor, compile and float8. Each: off by default (the search unchanged), on it adds layouts, and
every row equals solving and timing its layout alone (``time_plan``)."""

from __future__ import annotations

import math

import pytest

from mlsysim_core.errors import InvalidInputError
from mlsysim_core.search import interleave_factors, search_plans, time_plan
from mlsysim_core.solver import TrainingMemoryModel
from mlsysim_plugins import steptime

MEASURED = dict(precision="bf16", optimizer="adamw", profile="measured", workers=1)


def _alone(found, c, **choices):
    """The row's layout solved and timed on its own, as `mlsysim-core time` would."""
    return time_plan(found.model, found.hardware, global_batch=found.global_batch, seq_len=found.seq_len, tp=c.tp,
                     cp=c.cp, pp=c.pp, dp=c.dp, ep=c.ep, data_parallel=c.data_parallel, checkpointing=c.checkpointing,
                     microbatch=c.microbatch, sequence_parallel=c.sequence_parallel, precision=found.run["precision"],
                     optimizer=found.run["optimizer"], profile=found.profile, **choices)


def _same(found, c, memory_options=None, **choices):
    """``memory_options``: solve options time_plan cannot take by name (float8="tensorwise": its
    ``float8`` is the timing's flag), the layout's memory then solved on its own here."""
    alone = _alone(found, c, memory=memory_options is None, **choices)
    assert alone["layout"]["gradient_accumulation_steps"] == c.gradient_accumulation_steps
    if memory_options is not None:
        alone["memory_bytes"] = TrainingMemoryModel().solve(
            found.model, found.hardware, batch_size=found.global_batch, seq_len=found.seq_len,
            precision=found.run["precision"], optimizer=found.run["optimizer"], activation_checkpointing=c.checkpointing,
            tp_size=c.tp, pp_size=c.pp, dp_size=c.dp, ep_size=c.ep, cp_size=c.cp,
            gradient_accumulation_steps=c.gradient_accumulation_steps, sequence_parallel=c.sequence_parallel,
            data_parallel=c.data_parallel, profile=found.profile, **memory_options).total_memory
    assert alone["memory_bytes"] == c.total_memory
    assert math.isclose(alone["step_s"], c.step_time, rel_tol=1e-12)
    assert math.isclose(alone["bubble"], c.bubble, rel_tol=1e-12, abs_tol=1e-15)
    assert alone["components"] == pytest.approx(found.components(c), rel=1e-12)


def _layouts(found):
    return {c[:10] + c[18:]: c for c in found.fits}


# --- expert parallelism across nodes ---------------------------------------------------------

QWEN = dict(devices=16, global_batch=16, seq_len=2048, checkpointing=["full"], data_parallel=["zero1"],
            sequence_parallel=[False], context_parallel=[1], **MEASURED)


@pytest.fixture(scope="module")
def ep_searches():
    inside = search_plans("qwen3-30b-a3b", "h100", **QWEN)
    across = search_plans("qwen3-30b-a3b", "h100", allow_cross_node_ep=True, **QWEN)
    return inside, across


def test_cross_node_ep_is_opt_in_and_adds_only_layouts_across_nodes(ep_searches):
    inside, across = ep_searches
    node = 8
    assert all(c.tp * c.ep <= node for c in inside.fits)
    extra = [c for c in across.fits if c.tp * c.ep > node]
    assert extra and {c.ep for c in extra} >= {16}
    assert all(c.tp <= node for c in across.fits)          # tp stays inside a node (--allow-cross-node-tp)
    # the in-node layouts are the same rows either way
    rows = _layouts(across)
    assert all(rows[key] == c._replace(pareto=rows[key].pareto) for key, c in _layouts(inside).items())
    assert across.candidates > inside.candidates
    assert across.run["allow_cross_node_ep"] and not inside.run["allow_cross_node_ep"]


def test_cross_node_ep_rows_equal_timing_each_layout_alone(ep_searches):
    _, across = ep_searches
    extra = [c for c in across.fits if c.tp * c.ep > 8]
    for c in (extra[0], extra[-1], across.fits[0]):
        _same(across, c)


def test_cross_node_all_to_all_is_priced_on_each_ranks_nic_share():
    hw = {"intra": 450e9, "inter": 50e9}
    cal = steptime.DEFAULT
    volume = 1e9
    # 16 ranks, 8 per node: half of each rank's buffer leaves the node through its own 50 GB/s share
    got = steptime.all_to_all_across_nodes((volume,), 16, 1, 8, hw, cal)
    assert got == pytest.approx(max(8 / 16 * volume / (50e9 * cal.inter_link), 7 / 16 * volume / (450e9 * cal.intra_link)))
    # far slower than a ring's 8 rails would say (min(intra, 8 x inter))
    assert got > 4 * (15 / 16 * volume / steptime.link(16, 1, 8, hw, cal))
    # the step time's EP component across nodes: more than twice the in-node one at the same tokens per rank
    run = dict(global_batch=16, seq_len=2048, precision="bf16", optimizer="adamw", profile="measured",
               checkpointing="full", data_parallel="zero1", memory=False)
    in_node = time_plan("qwen3-30b-a3b", "h100", dp=8, ep=8, **run)["components"]["ep"]
    across = time_plan("qwen3-30b-a3b", "h100", dp=16, ep=16, **run)["components"]["ep"]
    assert across > 2 * in_node


# --- the interleave factor -------------------------------------------------------------------

LLAMA = dict(devices=8, global_batch=16, seq_len=2048, checkpointing=["full"], data_parallel=["zero1"],
             sequence_parallel=[True], context_parallel=[1], **MEASURED)


def test_interleave_factors():
    assert interleave_factors(32, 1) == ()
    assert interleave_factors(32, 4) == (2, 4, 8)
    assert interleave_factors(32, 32) == ()
    # Llama 3 405B (126 layers): the published interleaved layouts are in the search space
    assert 8 in interleave_factors(126, 8)       # Megatron-Bridge: tp8 cp2 pp8 vp8
    assert 2 in interleave_factors(126, 16)      # the Llama 3 paper's pp16 (interleave not stated)
    assert all(16 * v <= 126 for v in interleave_factors(126, 16))


@pytest.fixture(scope="module")
def vp_searches():
    plain = search_plans("llama3-8b", "h100", **LLAMA)
    interleaved = search_plans("llama3-8b", "h100", interleave=True, **LLAMA)
    return plain, interleaved


def test_interleave_is_opt_in_and_adds_interleaved_layouts(vp_searches):
    plain, interleaved = vp_searches
    assert all(c.vp == 1 for c in plain.fits)
    chunked = [c for c in interleaved.fits if c.vp > 1]
    assert chunked and all(c.pp > 1 and 32 % (c.pp * c.vp) == 0 for c in chunked)
    assert {(c.pp, c.vp) for c in chunked} >= {(2, 2), (4, 2), (4, 8)}
    rows = _layouts(interleaved)
    assert all(rows[key] == c._replace(pareto=rows[key].pareto) for key, c in _layouts(plain).items())
    # the interleaved schedule's bubble is (pp - 1) / v slots
    for c in chunked:
        idle = (c.pp - 1) / c.vp
        assert c.bubble == pytest.approx(idle / (c.gradient_accumulation_steps + idle))
    assert "vp" in interleaved.table(pareto_only=False, rows=None, width=400).splitlines()[3]
    assert "vp" not in plain.table(width=400).splitlines()[3]


def test_interleaved_rows_equal_timing_each_layout_alone(vp_searches):
    _, interleaved = vp_searches
    chunked = [c for c in interleaved.fits if c.vp > 1]
    for c in (chunked[0], chunked[-1], max(chunked, key=lambda c: c.vp)):
        _same(interleaved, c, vp=c.vp)
    plain_pp = next(c for c in interleaved.fits if c.vp == 1 and c.pp > 1)
    _same(interleaved, plain_pp)


def test_interleave_with_a_schedule_named_is_an_error():
    with pytest.raises(InvalidInputError) as err:
        search_plans("llama3-8b", "h100", interleave=True, pipeline_schedule="zb-h1", **LLAMA)
    assert err.value.parameter == "pipeline_schedule" and "interleave" in err.value.allowed
    with pytest.raises(InvalidInputError) as err:
        search_plans("llama3-8b", "h100", interleave="yes", **LLAMA)
    assert err.value.parameter == "interleave"


# --- compile and float8 ----------------------------------------------------------------------

PURE = dict(regime="bf16", checkpointing=["none"], data_parallel=["fsdp"], sequence_parallel=[True],
            context_parallel=[1], precision="bf16", optimizer="adamw", profile="measured", workers=1)


@pytest.fixture(scope="module")
def compile_searches():
    run = dict(devices=8, global_batch=8, seq_len=2048, **PURE)
    return search_plans("llama3-8b", "h100", **run), search_plans("llama3-8b", "h100", allow_compile=True, **run)


def test_compile_is_opt_in_and_refusals_are_counted(compile_searches):
    eager, both = compile_searches
    assert not any(c.compiled for c in eager.fits)
    compiled = [c for c in both.fits if c.compiled]
    # compile="blocks" composes with data and pipeline parallelism: tp (and cp, ep) are refused and counted
    assert compiled and all(c.tp == c.cp == 1 for c in compiled)
    refusals = [n for n in both.notes if n.startswith(tuple(f"{k:,} layouts left out" for k in range(1, 10**4)))
                and "compile='blocks'" in n]
    assert refusals, both.notes
    refused = sum(int(n.split(" ")[0].replace(",", "")) for n in refusals)
    assert both.candidates == 2 * eager.candidates and refused > 0
    rows = _layouts(both)
    assert all(rows[key] == c._replace(pareto=rows[key].pareto) for key, c in _layouts(eager).items())
    fused = {c[:10]: c for c in compiled}
    plain = {c[:10]: c for c in eager.fits}
    assert any(fused[k].step_time < plain[k].step_time for k in fused if k in plain)   # fused ops are faster
    assert "compile" in both.table(pareto_only=False, rows=None, width=400)


def test_compiled_rows_equal_timing_each_layout_alone(compile_searches):
    _, both = compile_searches
    compiled = [c for c in both.fits if c.compiled]
    for c in (compiled[0], compiled[-1]):
        _same(both, c, compiled=True, compile="blocks", regime="bf16")


def test_float8_on_one_device_equals_timing_alone():
    run = dict(devices=1, global_batch=2, seq_len=2048, **PURE)
    plain = search_plans("llama3-8b", "h200", **run)
    both = search_plans("llama3-8b", "h200", allow_float8=True, **run)
    assert not any(c.float8 for c in plain.fits)
    fp8 = [c for c in both.fits if c.float8]
    assert fp8 and all(c.gradient_accumulation_steps == 1 for c in fp8)    # float8 is modelled without accumulation
    assert any("float8='tensorwise'" in n and "layouts left out" in n for n in both.notes)
    for c in fp8:
        _same(both, c, memory_options=dict(float8="tensorwise", regime="bf16"), float8=True, regime="bf16")


def test_compile_under_a_profile_without_it_is_an_error():
    with pytest.raises(InvalidInputError) as err:
        search_plans("llama3-8b", "h100", devices=8, global_batch=8, seq_len=2048, profile="reference",
                     allow_compile=True, workers=1)
    assert err.value.parameter == "allow_compile" and "measured" in err.value.allowed


# --- the CLI ---------------------------------------------------------------------------------

def test_cli_flags_reach_the_search(capsys):
    import io
    import json

    from mlsysim_core import cli
    out = io.StringIO()
    code = cli.main(["search", "-m", "llama3-8b", "-g", "h100", "-n", "8", "--global-batch", "16", "-s", "2048",
                     "--precision", "bf16", "--optimizer", "adamw", "--checkpointing", "full", "--cp", "1",
                     "--workers", "1", "--no-progress", "--interleave", "--allow-cross-node-ep", "--allow-compile",
                     "--allow-float8", "--json"], out=out)
    assert code == 0
    found = json.loads(out.getvalue())
    assert {k: found["run"][k] for k in ("interleave", "allow_cross_node_ep", "allow_compile", "allow_float8")} == dict(
        interleave=True, allow_cross_node_ep=True, allow_compile=True, allow_float8=True)
    assert any(row["vp"] > 1 for row in found["fits"])
    assert any("compile='blocks'" in n for n in found["notes"])
    with pytest.raises(SystemExit):
        cli.main(["search", "--help"])
    text = capsys.readouterr().out
    assert all(flag in text for flag in ("--allow-cross-node-ep", "--interleave", "--allow-compile", "--allow-float8"))


@pytest.mark.long     # worker processes (about 2 s of the quick suite)
def test_axes_in_worker_processes_equal_in_process():
    run = dict(devices=8, global_batch=16, seq_len=2048, precision="bf16", optimizer="adamw", profile="measured",
               regime="bf16", checkpointing=["none"], data_parallel=["zero1", "fsdp"], interleave=True,
               allow_compile=True)
    alone = search_plans("llama3-8b", "h100", workers=1, **run)
    forked = search_plans("llama3-8b", "h100", workers=2, **run)
    assert any(c.vp > 1 for c in alone.fits) and any(c.compiled for c in alone.fits)
    assert (forked.fits, forked.notes, forked.solves, forked.candidates) == (
        alone.fits, alone.notes, alone.solves, alone.candidates)


def test_nothing_fits_names_the_variant_of_the_closest():
    found = search_plans("llama3-70b", "h100", devices=2, global_batch=2, seq_len=4096, precision="bf16",
                         optimizer="adamw", profile="measured", interleave=True, workers=1)
    assert not found.fits and found.closest
    assert all({"vp", "compiled", "float8"} <= set(c) for c in found.closest)
    assert "No layout of the" in found.table()


def test_a_published_interleaved_layout_is_a_row_and_ranks_higher_than_its_1f1b_twin():
    """Megatron-Bridge's Llama 3 70B on 64 H100 (tp 4, pp 8, vp 5; validation/steptime/published.py):
    80 layers, 10 a stage, so v in 2, 5, 10."""
    found = search_plans("llama3-70b", "h100", devices=64, global_batch=256, seq_len=8192, checkpointing=["full"],
                         data_parallel=["zero1"], sequence_parallel=[True], context_parallel=[1], interleave=True,
                         **MEASURED)
    rank = {(c.tp, c.pp, c.dp, c.vp, c.microbatch): i for i, c in reversed(list(enumerate(found.fits)))}
    assert rank[(4, 8, 2, 5, 1)] < rank[(4, 8, 2, 1, 1)]
    row = found.fits[rank[(4, 8, 2, 5, 1)]]
    twin = found.fits[rank[(4, 8, 2, 1, 1)]]
    assert row.bubble < twin.bubble and row.step_time < twin.step_time
    _same(found, row, vp=5)
