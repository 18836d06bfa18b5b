"""The planner's step-time model (the plugin mlsysim_plugins.steptime, docs/planner.md): each
mechanism by hand, the rules' declared collectives, recompute declared by the strategies, the
calibration and what a search says."""

import json
import runpy
from pathlib import Path

import attrs
import pytest

from mlsysim_core import (CheckpointingSpec, HardwareNode, InvalidInputError, TrainingMemoryModel,
                          TransformerWorkload, hookimpl, search)
from mlsysim_core.manager import PluginManager
from mlsysim_plugins import steptime
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES, RingTraffic, collectives

ROOT = Path(__file__).resolve().parents[2]
CAL = attrs.evolve(steptime.DEFAULT, intra_link=0.5, inter_link=0.8, latency=0.0, hop_intra=0.0, hop_inter=0.0,
                   hop_tree_intra=0.0, nvls_latency=0.0)
HW = {"flops": 1e15, "intra": 400e9, "inter": 50e9, "memory": 3e12}


def test_group_bandwidth_inside_and_across_nodes():
    assert steptime.link(8, 1, 8, HW, CAL) == 200e9                 # one node: the intra link
    assert steptime.link(4, 2, 8, HW, CAL) == 200e9                 # 4 ranks 2 apart: still one node
    assert steptime.link(8, 8, 8, HW, CAL) == 40e9                  # one member per node: one rail
    assert steptime.link(16, 2, 8, HW, CAL) == min(200e9, 4 * 40e9)  # four members per node: four rails
    assert steptime.link(64, 1, 8, HW, CAL) == 200e9                # eight rails outrun NVLink: NVLink bounds


def test_ring_collectives_and_overlap():
    assert steptime.ring_time(1e9, 1, 1e9, 1e-3) == 0.0
    assert steptime.ring_time(1e9, 4, 1e9, 1e-3) == pytest.approx(3 / 4 + 1e-3)
    assert steptime.ring_time(1e9, 4, 1e9, 0.0, factor=2) == pytest.approx(1.5)    # an all-reduce
    share = steptime.DEFAULT.overlap_sm_share
    assert share == pytest.approx(24 / 132)
    assert steptime.hidden(1.0, 3.0, steptime.DEFAULT) == pytest.approx(share)               # all hidden
    assert steptime.hidden(3.0, 1.0, steptime.DEFAULT) == pytest.approx(2.0 + share)         # 2 s outlast it


def test_data_parallel_rules_by_hand(solver):
    """Each built-in data-parallel rule's declared collectives (extensions["steptime.collectives"]), timed."""
    cal = attrs.evolve(CAL, overlap_sm_share=0.0)
    rules = solver.registry.sharding_rules

    def dp(name, d=4):
        size = dict(groups={"dp": (d, 1), "dp-node": (min(d, 8), 1), "dp-across": (d // min(d, 8), min(d, 8))},
                    volumes={"gradients": (4e9,), "parameters": (4e9,)}, node=8, hw={"intra": 2e9, "inter": 50e9}, cal=cal, sp=False)
        return steptime._data_parallel(collectives(rules[name]), 3, 10, {"forward": 1.0, "backward": 2.0}, size)
    once = 3 / 4 * 4e9 / 1e9           # 3 s: one gather or reduce-scatter of the shard
    assert dp("zero0") == pytest.approx(2 * once - 2.0)                     # one all-reduce, beside a backward
    assert dp("zero1") == pytest.approx((once - 2.0) + (once - 1.0))
    assert dp("zero2") == pytest.approx(3 * (once - 2.0) + (once - 1.0))
    assert dp("fsdp") == pytest.approx(3 * ((once - 1.0) + (2 * once - 2.0) + once / 10))
    assert dp("zero3") == dp("fsdp") == pytest.approx(dp("hsdp"))          # (4 ranks: one shard group)
    assert dp("fsdp-grad-op") == pytest.approx(3 * ((once - 1.0) + (once - 2.0) + once / 10))
    assert dp("zero0", d=1) == 0.0


def test_the_step_time_reads_declarations_never_names(builtin_pm):
    """Every rule registered again under another name (the same declarations) is timed the same;
    a data-parallel rule that declares nothing is timed as fsdp's, and said."""
    class Renamed:
        @hookimpl
        def mlsysim_sharding_rules(self):
            rules = builtin_pm.registry.sharding_rules
            return [attrs.evolve(rules[n], name=f"test.{n}") for n in ("zero1", "fsdp", "hsdp")] + [
                attrs.evolve(rules["fsdp"], name="test.silent",
                             extensions={k: v for k, v in rules["fsdp"].extensions.items() if k != COLLECTIVES})]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Renamed(), name="test_renamed")
    args = dict(devices=32, global_batch=64, seq_len=2048, solver=TrainingMemoryModel(plugin_manager=pm),
                checkpointing=["full"], context_parallel=[1], max_tp=2, workers=1)
    found = search.search_plans("llama3-8b", "h100", data_parallel=["zero1", "fsdp", "hsdp", "test.zero1",
                                                                     "test.fsdp", "test.hsdp", "test.silent"], **args)
    rows = {}
    for c in found.fits:
        rows.setdefault((c.tp, c.pp, c.dp, c.sequence_parallel, c.microbatch), {})[c.data_parallel] = c.step_time
    assert len(rows) > 10 and any(r.get("hsdp") != r.get("fsdp") for r in rows.values())
    for by_rule in rows.values():
        if "fsdp" not in by_rule:       # (one data-parallel rank: the search enumerates built-ins once, as zero0)
            continue
        for name in ("zero1", "fsdp", "hsdp"):
            assert by_rule.get(f"test.{name}") == by_rule.get(name)
        assert by_rule.get("test.silent") == by_rule.get("fsdp")
    assert any("data-parallel rules test.silent: the step time counts their communication as fsdp's" in n
               for n in found.notes)


def test_search_reaches_the_step_time_through_the_registry():
    text = (ROOT / "mlsysim_core" / "search.py").read_text(encoding="utf-8")
    assert "from mlsysim_plugins" not in text and "import mlsysim_plugins" not in text and "steptime import" not in text
    assert not (ROOT / "mlsysim_core" / "steptime.py").exists()


FIG = steptime.model_figures(TransformerWorkload(name="t", parameters=1_000_000_000, layers=8, hidden_dim=2048,
                                                 heads=16, vocab_size=32000, ffn_dim=8192, gated_mlp=True))


def _time(**layout):
    base = dict(tp=1, cp=1, pp=1, dp=1, ep=1, rule="zero0", recompute=0.0, sp=False, mb=1, gas=1, seq_len=1024,
                bytes_=2, node=8, optimizer_bytes=36.0)
    return steptime.step_time(FIG, HW, CAL, **{**base, **layout})


def test_pipeline_bubble_and_p2p():
    one = _time(pp=4, gas=8)
    micro = sum(one[k] for k in ("matmul", "attention", "memory", "kernels", "tp", "cp", "ep", "p2p")) / 8
    assert one["bubble"] == pytest.approx(3 * micro)
    assert one["p2p"] == pytest.approx(8 * 2 * 1024 * 2048 * 2 / (400e9 * 0.5))      # stages in one node
    across = _time(pp=4, gas=8, dp=8)            # stages 8 ranks apart: another node
    assert across["p2p"] == pytest.approx(8 * 2 * 1024 * 2048 * 2 / (50e9 * 0.8))


def test_recompute_costs_a_forward_and_its_collectives():
    none, full = _time(tp=2), _time(tp=2, recompute=1.0)
    assert full["matmul"] - none["matmul"] == pytest.approx(2 * 1024 * FIG["layer_active"] / 2 * 8 / (CAL.matmul * 1e15))
    assert full["tp"] / none["tp"] == pytest.approx(6 / 4)        # the recomputed forward's two all-reduces


def test_context_parallel_ring_as_pytorch_runs_it():
    # the cp rule's declarations (context_parallel.RING, TRAFFIC), by hand: T = 8192 / 4 tokens per rank
    cp = _time(cp=4, mb=1, seq_len=8192)
    T, hq, hkv, n = 2048, FIG["h_q"], FIG["h_kv"], 4
    attn_pass = 2 * T * 8192 * hq / (CAL.attention * 1e15)                # one layer's forward attention
    fstep, bstep = attn_pass / n, attn_pass * 2.5 / CAL.attention_backward / n
    gather = (n - 1) * T * 2 * hkv * 2 / (400e9 * 0.5)                     # K/V all-gathered: n - 1 chunks in
    send = T * 2 * hkv * 4 / (400e9 * 0.5)                                 # dK/dV in float32 to the next rank
    comm = (steptime.hidden(gather, fstep, CAL) + steptime.hidden(gather, bstep, CAL)
            + (n - 1) * steptime.hidden(send, bstep, CAL) + send)          # the last dK/dV send is waited for
    q, kv = T * hq, T * 2 * hkv
    traffic = ((n - 1) * (38 * q + 4 * kv) + 12 * q + (n - 1) * (10 * q + 22 * kv) + 20 * q + 32 * kv)
    kernels = (n - 1) * 12 + 4 + (n - 1) * 8 + 10
    expected = FIG["layers"] * (comm + traffic / (CAL.memory * 3e12) + kernels * CAL.kernel_overhead)
    assert cp["cp"] == pytest.approx(expected)
    # full recompute runs the ring's forward again: another gather, the forward's traffic and kernels again
    full = _time(cp=4, mb=1, seq_len=8192, recompute=1.0)
    again = (steptime.hidden(gather, fstep, CAL) + ((n - 1) * (38 * q + 4 * kv) + 12 * q) / (CAL.memory * 3e12)
             + ((n - 1) * 12 + 4) * CAL.kernel_overhead)
    assert full["cp"] - cp["cp"] == pytest.approx(FIG["layers"] * again)
    assert _time(cp=1, mb=1, seq_len=8192)["cp"] == 0.0


def test_the_ring_is_timed_as_the_rule_declares_it():
    # read from the declarations: a rule that declares no traffic pays none; one that declares it is timed
    axes, _ = steptime.declarations()
    assert isinstance(axes["cp.traffic"], RingTraffic)
    run = dict(tp=1, cp=4, pp=1, dp=1, ep=1, rule="zero0", recompute=0.0, sp=False, mb=1, gas=1, seq_len=8192,
               bytes_=2, node=8, optimizer_bytes=36.0)
    bare = {k: v for k, v in axes.items() if k != "cp.traffic"}
    with_, without = (steptime.step_time(FIG, HW, CAL, rules=r, **run)["cp"] for r in (axes, bare))
    q, kv = 2048 * FIG["h_q"], 2048 * 2 * FIG["h_kv"]
    traffic = 3 * (38 * q + 4 * kv) + 12 * q + 3 * (10 * q + 22 * kv) + 20 * q + 32 * kv
    assert with_ - without == pytest.approx(FIG["layers"] * (traffic / (CAL.memory * 3e12) + 74 * CAL.kernel_overhead))


def test_strategies_declare_their_recompute(solver):
    from mlsysim_core.inverse import prepared_plan as _prepared
    shares = {}
    for ckpt in ("none", "selective", "full", "every-k", "mlp-only", "attention-only"):
        plan = _prepared(solver, "llama3-8b", "h100", 1, 2048, dict(activation_checkpointing=ckpt, profile="measured"))
        shares[ckpt] = solver.registry.checkpointing[ckpt].recompute(plan)
    assert shares["none"] == shares["selective"] == 0.0          # sdpa keeps no scores to recompute
    assert shares["full"] == 1.0 and shares["every-k"] == 0.5
    assert shares["mlp-only"] + shares["attention-only"] == pytest.approx(1.0)


def test_a_strategy_without_recompute_is_said(builtin_pm):
    class Mine:
        @hookimpl
        def mlsysim_checkpointing_strategies(self):
            return [CheckpointingSpec(name="test.mine", activation_terms=lambda plan, placement, options: [])]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Mine(), name="test_mine")
    found = search.search_plans("llama3-8b", "h100", devices=2, global_batch=2, solver=TrainingMemoryModel(plugin_manager=pm),
                                checkpointing=["test.mine"])
    assert any("test.mine declares no recompute" in n for n in found.notes)
    assert all(c.recompute == 0.0 for c in found.fits)


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_calibration_and_uncalibrated_hardware(solver):
    h100 = search.search_plans("llama3-8b", "h100", devices=8, global_batch=8, solver=solver)
    assert h100.timing["cal"] is steptime.CALIBRATIONS["nvidia/h100-sxm5-80gb"] and h100.timing["cal"].calibrated
    assert not any("uncalibrated" in n for n in h100.notes)
    b200 = search.search_plans("llama3-8b", "b200", devices=8, global_batch=8, solver=solver)
    assert any(n.startswith("step time uncalibrated for NVIDIA B200") for n in b200.notes)
    data = json.loads(json.dumps(b200.to_dict()))
    assert data["calibrated"] is False and data["units"]["step_time"] == "seconds per optimizer step"
    row = data["fits"][0]
    assert set(steptime.COMPONENTS) | {"step"} == set(row["step_time_components"])
    assert row["step_time_components"]["step"] == pytest.approx(row["step_time"])
    assert data["assumptions"]["peak_bf16_flops"] == 2.25e15 and "calibration.matmul" in data["assumptions"]
    with pytest.raises(InvalidInputError, match="calibration"):
        search.search_plans("llama3-8b", "h100", devices=8, global_batch=8, solver=solver, calibration=0.5)


def test_hardware_without_memory_bandwidth_is_timed_with_a_note(solver):
    gpu = HardwareNode(name="no-hbm-figure", memory_capacity=80 * 2**30, devices_per_node=8,
                       peak_bf16_flops=10**15, intra_node_bandwidth=4 * 10**11, inter_node_bandwidth=5 * 10**10)
    found = search.search_plans("llama3-8b", gpu, devices=2, global_batch=2, solver=solver)
    assert "step time: no-hbm-figure has no memory_bandwidth: 1e+12 B/s" in found.notes
    assert found.timing["hw"]["memory"] == steptime.ASSUMED_MEMORY_BANDWIDTH == 10**12


def test_published_measurements_are_cited():
    cases = runpy.run_path(str(ROOT / "validation" / "steptime" / "published.py"))["CASES"]
    assert len({c["id"] for c in cases}) == len(cases) >= 60
    for c in cases:
        assert len(c["source"]) > 40, c["id"]
        if None not in (c["tp"], c["cp"], c["pp"], c["dp_shard"]):
            assert c["tp"] * c["cp"] * c["pp"] * c["dp_shard"] * (c["dp_replicate"] or 1) == c["devices"], c["id"]


@pytest.mark.long     # the planner page regenerated: `pytest --long`, .ci/run
def test_calibration_table_is_current():
    """docs/planner.md's tables are what calibrate.py computes with the shipped constants, and the
    shipped H100 and A100 constants are the fit on the recorded split."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("calibrate", ROOT / "validation" / "steptime" / "calibrate.py")
    calibrate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(calibrate)
    for acc, fitted in calibrate.FITTED.items():
        cal = calibrate.fit(acc)
        assert all(getattr(cal, k) == getattr(calibrate.shipped(acc), k) for k in fitted), acc
    assert calibrate.table() in (ROOT / "docs" / "planner.md").read_text(encoding="utf-8")
    # the held-out compiled FSDP run on 128 GPUs: step time within 10 %
    case = next(c for c in calibrate.CASES if c["id"] == "torchtitan-2412-llama3.1-8b-128xh100-fsdp-compile")
    assert abs(calibrate.predict(case, calibrate.shipped("h100"))["step_s"] / calibrate.published_step(case) - 1) < 0.1


def test_the_pipeline_schedule_sets_the_bubble_and_the_memory(solver):
    """Interleaved 1F1B idles (pp - 1)/v slots (and sends v times as often), zero bubble H1 a
    third of 1F1B's; each layout's memory is the measured solve under that schedule."""
    args = dict(devices=8, global_batch=16, seq_len=1024, profile="measured", checkpointing=["full"],
                data_parallel=["zero1"], context_parallel=[1], max_tp=1)
    rows = {}
    for schedule in ("1f1b", "interleaved-1f1b", "zb-h1"):
        found = search.search_plans("llama3-8b", "h100", solver=solver, pipeline_schedule=schedule, **args)
        rows[schedule] = next(c for c in found.fits if (c.pp, c.microbatch) == (4, 1))
        c = rows[schedule]
        assert c.total_memory == solver.solve("llama3-8b", "h100", 16, 1024, activation_checkpointing="full", pp_size=4,
                                              dp_size=2, zero_stage=1, gradient_accumulation_steps=8,
                                              profile="measured", pipeline_schedule=schedule).total_memory
        parts = found.components(c)
        micro = sum(parts[k] for k in ("matmul", "attention", "memory", "kernels", "tp", "cp", "ep", "p2p")) / 8
        slots = {"1f1b": 3, "interleaved-1f1b": 3 / 2, "zb-h1": 1}[schedule]
        assert parts["bubble"] == pytest.approx(slots * micro) and c.bubble == pytest.approx(slots / (8 + slots))
    assert found.components(rows["zb-h1"])["p2p"] * 2 == pytest.approx(
        search.search_plans("llama3-8b", "h100", solver=solver, pipeline_schedule="interleaved-1f1b", **args)
        .components(rows["interleaved-1f1b"])["p2p"])
    assert rows["interleaved-1f1b"].total_memory > rows["1f1b"].total_memory


def test_time_plan_says_when_the_memory_is_not_the_timed_run():
    """A compiled run's memory is timed compiled too; a timing-only choice (compiled, float8) is said."""
    common = dict(global_batch=16, seq_len=1024, dp=8, data_parallel="fsdp", checkpointing="none", microbatch=2,
                  precision="bf16", profile="measured")
    both = search.time_plan("llama3-8b", "h100", regime="bf16", compile="blocks", **common)
    assert both["layout"]["compiled"] is True and not any("compiled:" in n for n in both["notes"])
    eager = search.time_plan("llama3-8b", "h100", regime="bf16", **common)
    assert both["memory_bytes"] != eager["memory_bytes"]          # the compiled run's memory
    timed = search.time_plan("llama3-8b", "h100", regime="bf16", compiled=True, float8=True, **common)
    # float8's memory is a search's float8 row's (float8='tensorwise', which dp 8 is not modelled under: said, as the
    # search leaves that row out); an implementation declaring no memory keeps the 16-bit run's, said
    assert timed["memory_bytes"] is None
    assert any(n.startswith("memory not solved: float8='tensorwise' is not allowed") for n in timed["notes"])
    assert any(n.startswith("compiled: ") and "eager run's" in n for n in timed["notes"])
    assert any(n.startswith("float8: ") and "as a search's float8 row" in n for n in timed["notes"])
    assert timed["components"]["step"] < both["components"]["step"]     # float8 GEMMs on top of compile
    te = search.time_plan("llama3-8b", "h100", regime="bf16", compiled=True, float8="te-mxfp8", **common)
    assert te["memory_bytes"] == eager["memory_bytes"]
    assert any(n.startswith("float8 (te-mxfp8): ") and "16-bit run's" in n for n in te["notes"])
