"""Plan search: enumeration, exactness against solve, the Pareto front, third-party rules."""

import itertools
import json

import pytest

from mlsysim_core import (HardwareNode, InvalidInputError, ShardingEffect, ShardingRuleSpec,
                          TrainingMemoryModel, TransformerWorkload, hookimpl, search)
from mlsysim_core.manager import PluginManager

MODEL = TransformerWorkload(name="m", parameters=7_000_000_000, layers=32, hidden_dim=4096, heads=32)
GPU = HardwareNode(name="40GB", memory_capacity=40 * 2**30, devices_per_node=8, memory_bandwidth=2 * 10**12,
                   peak_bf16_flops=4 * 10**14, intra_node_bandwidth=300 * 10**9, inter_node_bandwidth=25 * 10**9)


def brute_force(solver, devices, global_batch, seq_len):
    """Every layout the search promises to consider, solved one by one."""
    out = {}
    rules = sorted(solver.registry.rules_for_axis("dp"))
    for tp, cp, pp in itertools.product([1, 2, 4, 8], range(1, devices + 1), range(1, 33)):
        if devices % (tp * cp * pp) or pp > 32 or seq_len % cp:
            continue
        dp = devices // (tp * cp * pp)
        if global_batch % dp:
            continue
        for rule, ckpt, sp, mb in itertools.product(rules, ["full", "none", "selective"], [True, False],
                                                     range(1, global_batch // dp + 1)):
            if (global_batch // dp) % mb or (dp * cp == 1 and rule != "zero0") or (tp == 1 and sp):
                continue    # one rank: every built-in dp rule is zero0; no sequence parallelism without tp
            gas = global_batch // (dp * mb)
            try:
                r = solver.solve(MODEL, GPU, global_batch, seq_len, activation_checkpointing=ckpt, tp_size=tp,
                                 pp_size=pp, dp_size=dp, gradient_accumulation_steps=gas, sequence_parallel=sp,
                                 data_parallel=rule, cp_size=cp)
            except InvalidInputError:      # a rule refuses the layout: counted, never fits
                r = None
            out[(tp, cp, pp, dp, 1, rule, ckpt, sp, mb)] = r
    return out


@pytest.mark.long       # a whole search solved layout by layout (README: whole searches are long)
@pytest.mark.parametrize("workers", [1, 2])     # in-process, and split over two forked worker processes
def test_search_matches_brute_force(solver, workers):
    found = search.search_plans(MODEL, GPU, devices=16, global_batch=32, seq_len=2048, solver=solver, workers=workers)
    truth = brute_force(solver, 16, 32, 2048)
    assert found.candidates == len(truth)
    assert {c.cp for c in found.fits} == {1, 2, 4, 8, 16}      # context parallelism takes part
    fits = {(c.tp, c.cp, c.pp, c.dp, c.ep, c.data_parallel, c.checkpointing, c.sequence_parallel, c.microbatch): c
            for c in found.fits}
    assert set(fits) == {k for k, r in truth.items() if r is not None and r.feasible}
    for key, candidate in fits.items():
        assert candidate.total_memory == truth[key].total_memory       # exact, through the pipeline
        assert candidate.headroom == truth[key].headroom
    assert found.solves <= found.candidates


@pytest.mark.long       # a whole search solved layout by layout (README: whole searches are long)
def test_search_without_monotonicity_solves_every_layout(solver):
    pruned = search.search_plans(MODEL, GPU, devices=8, global_batch=64, seq_len=4096, solver=solver)
    every = search.search_plans(MODEL, GPU, devices=8, global_batch=64, seq_len=4096, solver=solver,
                                assume_monotone=False)
    assert pruned.candidates == every.candidates == every.solves > pruned.solves
    assert pruned.fits == every.fits       # the monotonicity the pruning assumes holds here


def test_context_parallel_axis(solver):
    small = TransformerWorkload(name="s", parameters=1_000_000_000, layers=16, hidden_dim=2048, heads=16,
                                kv_heads=4)
    found = search.search_plans(small, GPU, devices=8, global_batch=8, seq_len=4096, solver=solver,
                                checkpointing=["full"], data_parallel=["zero0"], sequence_parallel=[True])
    (c,) = [c for c in found.fits if (c.tp, c.cp, c.pp, c.dp, c.microbatch) == (1, 8, 1, 1, 8)]
    assert found.components(c)["cp"] >= 0 and c.recompute == 1.0
    assert c.total_memory == solver.solve(small, GPU, 8, 4096, activation_checkpointing="full", cp_size=8).total_memory
    only = search.search_plans(small, GPU, devices=8, global_batch=8, seq_len=4096, solver=solver,
                               checkpointing=["full"], data_parallel=["zero0"], sequence_parallel=[True],
                               context_parallel=[1])
    assert {c.cp for c in only.fits} == {1} and only.candidates < found.candidates
    row = json.loads(json.dumps(found.to_dict()))["fits"][0]
    assert "cp" in row and any(line.split()[:2] == ["tp", "cp"] for line in found.table().splitlines())   # the header


def test_pareto_front_is_not_dominated(solver):
    found = search.search_plans(MODEL, GPU, devices=16, global_batch=64, seq_len=4096, solver=solver)
    assert found.pareto and set(found.pareto) <= set(found.fits)
    for p in found.pareto:
        assert not any(c.step_time <= p.step_time and c.headroom >= p.headroom
                       and (c.step_time, c.headroom) != (p.step_time, p.headroom) for c in found.fits)
    # the front spans from the fastest layout to the one with the most headroom
    assert min(c.step_time for c in found.fits) == found.pareto[0].step_time
    assert max(c.headroom for c in found.fits) == max(p.headroom for p in found.pareto)
    assert found.fits == tuple(sorted(found.fits, key=lambda c: (c.step_time, -c.headroom)))


SHAPED = TransformerWorkload(name="shaped", parameters=1_000_000_000, layers=8, hidden_dim=2048, heads=16,
                             vocab_size=32000, ffn_dim=8192, gated_mlp=True)


def test_step_time_by_hand(solver):
    """One rank, no communication: every component derived by hand (steptime's docstring)."""
    from mlsysim_plugins.steptime import DEFAULT as cal
    found = search.search_plans(SHAPED, GPU, devices=1, global_batch=2, seq_len=1024, solver=solver,
                                checkpointing=["full"], precision="bf16")
    (c,) = [c for c in found.fits if c.microbatch == 1]
    parts = found.components(c)
    T, s, h, L, V, f = 1024, 1024, 2048, 8, 32000, 8192
    layer = (1e9 - 2 * V * h) / L                          # untied: embedding and LM head out
    matmul = (2 * T * layer * L * (3 + 1) + 2 * T * V * h * 3) / (cal.matmul * 4e14)
    # the forward and its full recompute at cal.attention, the backward's 2.5 forwards at 63/73 of it
    # (FlashAttention-2: "up to 73%" forward, "up to 63%" backward)
    attention = 2 * T * s * h * L * (1 + 1 + 2.5 * 73 / 63) / (cal.attention * 4e14)
    # eager memory-bound ops per token and layer pass: two norms of 36 B and two residual adds of
    # 6 B per element of h, RoPE on q and k at 20 B, silu then mul at 10 B per MLP element
    memory = ((2 * 36 * h + 12 * h + 20 * (2 * h) + 10 * f) * T * L * 4 + 16 * T * V) / (cal.memory * 2e12)
    assert parts["matmul"] == pytest.approx(2 * matmul) and parts["attention"] == pytest.approx(2 * attention)
    assert parts["memory"] == pytest.approx(2 * memory)
    assert parts["kernels"] == pytest.approx(2 * 20 * L * 4 * cal.kernel_overhead)
    assert parts["tp"] == parts["cp"] == parts["dp"] == parts["bubble"] == 0
    assert c.step_time == pytest.approx(sum(v for k, v in parts.items() if k != "step"))
    assert c.tokens_per_s == pytest.approx(2 * 1024 / c.step_time)
    mfu = (6 * (1e9 - V * h) + 12 * L * h * s) * 2048 / (c.step_time * 4e14)
    assert c.mfu == pytest.approx(mfu)


def test_tensor_parallel_collectives_by_hand(solver):
    from mlsysim_plugins.steptime import DEFAULT as cal
    found = search.search_plans(SHAPED, GPU, devices=4, global_batch=1, seq_len=1024, solver=solver,
                                checkpointing=["none"], precision="bf16", context_parallel=[1])
    (c,) = [c for c in found.fits if (c.tp, c.pp, c.sequence_parallel) == (4, 1, True)]
    # 4 collectives per layer (all-gather + reduce-scatter pairs: an all-reduce's volume), T x h x 2 bytes,
    # a ring over 4 ranks in a node: 2 x 3/4 of the buffer at intra x efficiency, plus NCCL's latency each
    # (issue 27: a base of 8.4 us and 2 x (4 - 1) ring steps of 3.4 us inside a node)
    one = 2 * 3 / 4 * 1024 * 2048 * 2 / (300e9 * cal.intra_link) + cal.latency + 6 * cal.hop_intra
    assert cal.latency + 6 * cal.hop_intra == pytest.approx(28.8e-6)
    assert found.components(c)["tp"] == pytest.approx(4 * 8 * one)
    (p,) = [c for c in search.search_plans(SHAPED, GPU, devices=4, global_batch=4, seq_len=1024, solver=solver,
                                           checkpointing=["none"], precision="bf16", context_parallel=[1]).fits
            if (c.tp, c.pp, c.microbatch) == (1, 4, 1)]
    assert p.bubble == pytest.approx(3 / (4 + 3)) and p.gradient_accumulation_steps == 4


def test_groups_stay_in_a_node_and_topology_is_required(solver):
    node4 = HardwareNode(name="n4", memory_capacity=80 * 2**30, devices_per_node=4, memory_bandwidth=2 * 10**12,
                         peak_bf16_flops=4 * 10**14, intra_node_bandwidth=300 * 10**9, inter_node_bandwidth=25 * 10**9)
    found = search.search_plans(SHAPED, node4, devices=16, global_batch=16, seq_len=1024, solver=solver,
                                checkpointing=["none"])
    assert max(c.tp for c in found.fits) == 4
    wide = search.search_plans(SHAPED, node4, devices=16, global_batch=16, seq_len=1024, solver=solver,
                               checkpointing=["none"], allow_cross_node_tp=True)
    assert max(c.tp for c in wide.fits) == 16
    assert max(c.tp for c in search.search_plans(SHAPED, node4, devices=16, global_batch=16, seq_len=1024,
                                                 solver=solver, checkpointing=["none"], max_tp=2).fits) == 2
    bare = HardwareNode(name="bare", memory_capacity=80 * 2**30, devices_per_node=8)
    with pytest.raises(InvalidInputError, match="bare has no peak_bf16_flops, intra_node_bandwidth, "
                                                "inter_node_bandwidth"):
        search.search_plans(SHAPED, bare, devices=8, global_batch=8, solver=solver)
    assert search.search_plans(SHAPED, bare, devices=2, global_batch=2, solver=solver, flops=1e14,
                               tp_bandwidth=1e11, network_bandwidth=1e10).fits


def test_experts_stay_in_a_node(solver):
    found = search.search_plans("mixtral-8x7b", "h100", devices=32, global_batch=32, seq_len=1024, solver=solver,
                                checkpointing=["full"], data_parallel=["fsdp"], context_parallel=[1])
    assert found.fits and all(c.tp * c.ep <= 8 for c in found.fits) and max(c.ep for c in found.fits) == 8


def test_third_party_dp_rule_takes_part(builtin_pm):
    class Fsdp:
        @hookimpl
        def mlsysim_sharding_rules(self):
            def apply(plan, options):
                d = plan.dp_size
                return ShardingEffect(weight_shards=d, gradient_shards=d, optimizer_state_shards=d)
            return [ShardingRuleSpec(name="test.fsdp", axis="dp", apply=apply)]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Fsdp(), name="test_fsdp")
    found = search.search_plans(MODEL, GPU, devices=8, global_batch=16, solver=TrainingMemoryModel(plugin_manager=pm))
    ours = [c for c in found.fits if c.data_parallel == "test.fsdp" and c.cp == 1]
    zero3 = {(c.tp, c.pp, c.checkpointing, c.sequence_parallel, c.microbatch): c.total_memory
             for c in found.fits if c.data_parallel == ("zero3" if c.dp > 1 else "zero0") and c.cp == 1}
    assert ours and all(zero3[(c.tp, c.pp, c.checkpointing, c.sequence_parallel, c.microbatch)] == c.total_memory
                        for c in ours)


def test_output_and_errors(solver):
    found = search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=solver)
    data = json.loads(json.dumps(found.to_dict()))
    assert data["candidates"] == found.candidates and len(data["pareto"]) == len(found.pareto)
    assert "on the Pareto front" in found.table()
    with pytest.raises(InvalidInputError, match="devices=0"):
        search.search_plans("llama3-8b", "h100", devices=0, global_batch=16, solver=solver)
    with pytest.raises(InvalidInputError, match="flops=-1"):
        search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=solver, flops=-1)


def test_progress_is_reported(solver):
    seen = []
    search.search_plans(MODEL, GPU, devices=8, global_batch=8, solver=solver, progress=lambda d, t: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]


def test_search_renders_as_html(solver):
    from html.parser import HTMLParser
    found = search.search_plans(MODEL, GPU, devices=8, global_batch=16, solver=solver)
    cells = []

    class Cells(HTMLParser):
        def handle_data(self, data):
            cells.append(data)
    Cells().feed(found._repr_html_())
    assert "memory GiB (2^30 B)" in cells and f"{len(found.pareto)} on the Pareto front" in " ".join(cells)
    assert cells.count("*") == len(found.pareto)


def _same_search(a, b):
    assert (a.candidates, a.solves, a.fits, a.pareto) == (b.candidates, b.solves, b.fits, b.pareto)
    assert all(type(x.total_memory) is type(y.total_memory) for x, y in zip(a.fits, b.fits))
    assert a.to_dict() | {"seconds": 0} == b.to_dict() | {"seconds": 0}


@pytest.mark.long     # four whole searches in forked workers: `pytest --long`, .ci/run
def test_parallel_search_is_the_in_process_search(solver):
    """Chunks evaluated by forked workers, merged in enumeration order: field for field the same."""
    kwargs = dict(devices=16, global_batch=32, seq_len=4096, solver=solver, context_parallel=[1, 2])
    here = search.search_plans("mixtral-8x7b", "h100", workers=1, **kwargs)
    for workers in (None, 2, 3):
        _same_search(here, search.search_plans("mixtral-8x7b", "h100", workers=workers, **kwargs))
    two = search.search_plans("mixtral-8x7b", "h100", workers=2, **kwargs)
    fits = {c.microbatch for c in two.fits}
    assert len(two.fits) > 100 and len(fits) > 1
    for c in two.fits[::97]:        # the numbers are the pipeline's own
        r = solver.solve("mixtral-8x7b", "h100", 32, 4096, activation_checkpointing=c.checkpointing,
                         tp_size=c.tp, pp_size=c.pp, dp_size=c.dp, ep_size=c.ep, cp_size=c.cp,
                         gradient_accumulation_steps=c.gradient_accumulation_steps,
                         sequence_parallel=c.sequence_parallel, data_parallel=c.data_parallel)
        assert r.total_memory == c.total_memory and r.headroom == c.headroom


@pytest.mark.long     # two whole searches: `pytest --long`, .ci/run
def test_parallel_search_falls_back_in_process(solver, monkeypatch):
    import multiprocessing
    here = search.search_plans(MODEL, GPU, devices=16, global_batch=32, solver=solver, workers=1)

    def no_fork(method=None):
        raise ValueError("no fork here")
    monkeypatch.setattr(multiprocessing, "get_context", no_fork)
    _same_search(here, search.search_plans(MODEL, GPU, devices=16, global_batch=32, solver=solver, workers=2))


def _builtins_and(builtin_pm, plugin, name: str) -> TrainingMemoryModel:
    """A solver over the built-in plugins plus ``plugin`` (registered as ``name``)."""
    pm = PluginManager()
    for builtin in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(builtin), name=builtin, info=builtin_pm.info(builtin))
    pm.register(plugin, name=name)
    return TrainingMemoryModel(plugin_manager=pm)


@pytest.mark.long     # whole searches in forked workers: `pytest --long`, .ci/run
def test_parallel_progress_and_third_party_rules(builtin_pm, tmp_path):
    import os
    pids = set()

    class Fsdp:
        @hookimpl
        def mlsysim_sharding_rules(self):
            def apply(plan, options):
                if os.getpid() not in pids:      # which processes ran the rule
                    pids.add(os.getpid())
                    with open(tmp_path / "pids", "a") as fh:
                        fh.write(f"{os.getpid()}\n")
                d = plan.dp_size
                return ShardingEffect(weight_shards=d, gradient_shards=d, optimizer_state_shards=d)
            return [ShardingRuleSpec(name="test.fsdp", axis="dp", apply=apply)]
    solver = _builtins_and(builtin_pm, Fsdp(), "test_fsdp")
    seen = []
    two = search.search_plans(MODEL, GPU, devices=16, global_batch=32, solver=solver, workers=2,
                              progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (two.candidates, two.candidates)
    assert any(c.data_parallel == "test.fsdp" for c in two.fits)
    ran = set((tmp_path / "pids").read_text().split())
    assert len(ran - {str(os.getpid())}) == 2       # two forked workers ran the third-party rule
    _same_search(two, search.search_plans(MODEL, GPU, devices=16, global_batch=32, solver=solver, workers=1))


@pytest.mark.parametrize("workers", [0, -1, True, 1.5, "2"])
def test_workers_must_be_a_positive_integer(solver, workers):
    with pytest.raises(InvalidInputError, match="workers"):
        search.search_plans(MODEL, GPU, devices=8, global_batch=8, solver=solver, workers=workers)


@pytest.mark.parametrize("workers", [1, 2])
def test_a_broken_rule_stops_the_search_and_is_named(builtin_pm, workers):
    """A rule that crashes is a broken plugin, not a layout that does not fit: the search
    must not count its layouts as rejected and carry on."""
    from mlsysim_core import PluginContractError

    class Broken:
        @hookimpl
        def mlsysim_sharding_rules(self):
            def apply(plan, options):
                if plan.microbatch > 1:
                    raise ZeroDivisionError("boom")
                return ShardingEffect()
            return [ShardingRuleSpec(name="test.broken", axis="dp", apply=apply)]
    solver = _builtins_and(builtin_pm, Broken(), "test_broken")
    with pytest.raises(PluginContractError, match=r"test_broken.*test\.broken.*ZeroDivisionError: boom") as err:
        search.search_plans(MODEL, GPU, devices=16, global_batch=32, solver=solver, workers=workers,
                            data_parallel=["test.broken"])
    assert err.value.plugin == "test_broken" and err.value.hook == "apply"


def test_rows_travel_as_columns_exactly():
    """What a worker sends back (all-float and all-int columns as arrays) becomes the rows
    it found, as Candidates, values and types kept (an int too large for an array too)."""
    rows = [(2, 1, 4, 8, 1, "zero1", "selective", True, 1, 8, 10**20, 7, 3.5, 1e5, 0.4, 0.25, 0.03, False),
            (1, 2, 1, 8, 2, "fsdp", "none", False, 2, 4, 5.0, 8.0, 4.0, 2e5, 0.5, 0.0, 0.0, False)]
    back = search._candidates(search._columns(rows))
    assert back == rows and all(type(c) is search.Candidate for c in back)
    assert [tuple(map(type, c)) for c in back] == [tuple(map(type, r)) for r in rows]
    assert back[1].data_parallel == "fsdp" and back[0].total_memory == 10**20
    assert search._candidates(search._columns([])) == []
