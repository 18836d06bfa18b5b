"""The step-time mechanisms of issue 27 item 2, each by hand (plugins/mlsysim_plugins/steptime.py,
docs/planner.md): GEMM tiles and waves, the power envelope, float8, TP and EP overlap, NCCL's latency;
and one layout timed on its own (item 6: search.time_plan, `mlsysim-core time`) equal to a search's row."""

import json
import math
import runpy
from pathlib import Path

import attrs
import pytest

from mlsysim_core import TransformerWorkload, search
from mlsysim_core.catalog import find_hardware
from mlsysim_core.errors import InvalidInputError
from mlsysim_plugins import steptime

from clitools import error_of, run

ROOT = Path(__file__).resolve().parents[2]
CAL = attrs.evolve(steptime.DEFAULT, matmul=0.5, memory=1.0, latency=0.0, hop_intra=0.0, hop_inter=0.0,
                   hop_tree_intra=0.0, nvls_latency=0.0)
HW = {"flops": 1e15, "fp8": 2e15, "intra": 400e9, "inter": 50e9, "memory": 1e30, "sms": 132, "clock": 1.0}


def test_gemm_tiles_and_waves():
    """A GEMM runs whole 128 x 256 tiles, 132 at a time on an H100: one more tile than a wave costs a wave."""
    k = 4096
    one_wave = steptime.gemm_seconds(128 * 132, 256, k, HW, CAL, 2)
    assert one_wave == pytest.approx(2 * 128 * 132 * 256 * k / (0.5 * 1e15))       # 132 tiles: exactly one wave
    assert steptime.gemm_seconds(128 * 132 + 1, 256, k, HW, CAL, 2) == pytest.approx(2 * one_wave)   # 133 tiles
    assert steptime.gemm_seconds(100, 200, k, HW, CAL, 2) == pytest.approx(one_wave)     # one partial tile: a wave
    no_sms = dict(HW, sms=None)          # without an SM count: the FLOPs at the share of the peak
    assert steptime.gemm_seconds(100, 200, k, no_sms, CAL, 2) == pytest.approx(2 * 100 * 200 * k / 0.5e15)
    slow = dict(no_sms, memory=1e12)     # memory-bound: operands read, bf16 output written
    assert steptime.gemm_seconds(4096, 4096, 8, slow, CAL, 2) == pytest.approx((2 * (4096 * 8 * 2) + 2 * 4096 ** 2) / 1e12)


def test_power_envelope_is_a_sourced_catalog_field():
    entry = find_hardware("h100")
    assert entry.extra["power_limit_watts"] == 700 and entry.extra["streaming_multiprocessors"] == 132
    assert "700W" in entry.sources["power_limit_watts"] and "132 SMs" in entry.sources["streaming_multiprocessors"]
    assert steptime.clock_share(500, 700) == pytest.approx((5 / 7) ** (1 / 3)) == pytest.approx(0.8939, abs=1e-4)
    assert steptime.clock_share(700, 700) == steptime.clock_share(None, 700) == steptime.clock_share(500, None) == 1.0
    hw = steptime.hardware_figures(entry.value, power=500)
    assert hw["clock"] == pytest.approx(0.8939, abs=1e-4) and hw["sms"] == 132 and hw["tdp"] == 700
    # a capped clock slows a compute-bound GEMM by exactly its share
    t700 = steptime.gemm_seconds(8192, 8192, 8192, steptime.hardware_figures(entry.value), CAL, 2)
    assert steptime.gemm_seconds(8192, 8192, 8192, hw, CAL, 2) == pytest.approx(t700 / hw["clock"])


def test_nccl_latency_steps_and_node_boundaries():
    cal = attrs.evolve(steptime.DEFAULT)
    base, intra, inter = 8.4e-6, 3.4e-6, 14.0e-6
    assert steptime.alpha("all-gather", 8, 1, 8, cal) == pytest.approx(base + 7 * intra)             # one node
    assert steptime.alpha("all-gather", 16, 1, 8, cal) == pytest.approx(base + 14 * intra + 1 * inter)   # two nodes
    assert steptime.alpha("all-reduce", 8, 1, 8, cal) == pytest.approx(base + 14 * intra)
    # 64 nodes, 8 per node: the ring's 2 x 63 network steps lose to the tree's 2 log2(64)
    ring = base + (2 * 511 - 126) * intra + 126 * inter
    tree = base + 2 * (7 * 4.0e-6 + 6 * inter)          # (NCCL's tree steps inside a node: 4.0 us)
    assert steptime.alpha("all-reduce", 512, 1, 8, cal) == pytest.approx(min(ring, tree)) == pytest.approx(tree)
    assert steptime.alpha("send-recv", 2, 64, 8, cal) == pytest.approx(base + inter)


FIG = steptime.model_figures(TransformerWorkload(name="t", parameters=1_000_000_000, layers=8, hidden_dim=2048,
                                                 heads=16, vocab_size=32000, ffn_dim=8192, gated_mlp=True))
BASE = dict(cp=1, pp=1, dp=1, ep=1, rule="zero0", recompute=0.0, mb=1, gas=1, seq_len=4096, bytes_=2, node=8,
            optimizer_bytes=36.0)
HW_NOSM = dict(HW, sms=None, memory=3e12)


def test_async_tp_exposes_one_chunk_and_hides_the_rest():
    cal = attrs.evolve(CAL, overlap_sm_share=0.0)
    plain = steptime.step_time(FIG, HW_NOSM, cal, tp=4, sp=True, **BASE)
    overlapped = steptime.step_time(FIG, HW_NOSM, cal, tp=4, sp=True, overlap={"tp": "decomposed"}, **BASE)
    per_layer_comm = plain["tp"] / FIG["layers"]
    matmul_layer = plain["matmul"] / FIG["layers"]
    assert per_layer_comm < matmul_layer * 3 / 4          # (this case: the rest hides entirely)
    assert overlapped["tp"] == pytest.approx(plain["tp"] / 4)


def test_async_tp_over_symmetric_memory_sums_the_reduce_scatters_partials_in_a_kernel_of_its_own():
    # torch's fused matmul-reduce-scatter (torch/distributed/_symmetric_memory/__init__.py, stacked_partials then
    # torch.sum over the n partials): per call of a sequence-parallel TP pair, the [T, h] partials read and the
    # [T / tp, h] shard written, bf16, at the memory-bound share of the bandwidth, on the critical path. 8 layers,
    # no recompute: 2 pairs forward and 2 backward a layer; T 4096, h 2048, tp 4, CAL.memory x 3e12 B/s.
    cal = attrs.evolve(CAL, overlap_sm_share=0.0)
    decomposed = steptime.step_time(FIG, HW_NOSM, cal, tp=4, sp=True, overlap={"tp": "decomposed"}, **BASE)
    symm = steptime.step_time(FIG, HW_NOSM, cal, tp=4, sp=True, overlap={"tp": "symmetric-memory"}, **BASE)
    one = 4096 * 2048 * 2 * (1 + 1 / 4) / (CAL.memory * 3e12)
    assert symm["tp"] - decomposed["tp"] == pytest.approx(8 * 4 * one)
    assert {k: v for k, v in symm.items() if k not in ("tp", "step")} == \
        {k: v for k, v in decomposed.items() if k not in ("tp", "step")}
    # vanilla TP (no overlap) and the all-gather half: no such kernel
    from mlsysim_plugins.steptime_hookspecs import Collective
    gather = Collective(kind="all-gather", volume="activations", group="tp", per="layer", forward=1)
    size = dict(groups={"tp": (4, 1)}, volumes={"activations": (4096, 2048, 2)}, hw={"memory": 3e12}, cal=CAL)
    assert steptime._partials_reduction(gather, size) == 0.0
    # a float8 implementation whose async TP does not fuse the reduce-scatter runs NCCL's: no such kernel either
    pair = Collective(kind="all-reduce", volume="activations", group="tp", per="layer", forward=1, in_network=False,
                      sequence_parallel=True)
    assert steptime._partials_reduction(pair, size) == pytest.approx(one)
    assert steptime._partials_reduction(pair, dict(size, tp_fuses=("all-gather",))) == 0.0


def test_time_plan_async_tp_names_the_implementation():
    from mlsysim_core.search import time_plan

    def tp(async_tp):
        return time_plan("llama3-8b", "h100", global_batch=1, seq_len=4096, tp=8, checkpointing="none",
                         precision="bf16", optimizer="adamw", memory=False, async_tp=async_tp)
    decomposed, symm = tp(True), tp("symmetric-memory")
    assert (decomposed["layout"]["async_tp"], symm["layout"]["async_tp"]) == (True, "symmetric-memory")
    # Llama-3.1-8B: 32 layers, h 4096, 4 pairs a layer; T 4096; the H100's bandwidth at the calibration's share
    share = symm["assumptions"]["calibration.memory"] * symm["assumptions"]["memory_bandwidth"]
    assert symm["components"]["tp"] - decomposed["components"]["tp"] == pytest.approx(
        32 * 4 * 4096 * 4096 * 2 * (1 + 1 / 8) / share)
    with pytest.raises(InvalidInputError, match="symmetric-memory"):
        tp("pipelined")


def test_ep_overlap_hides_the_all_to_all_behind_the_layer():
    moe = steptime.model_figures(_moe())
    cal = attrs.evolve(CAL, overlap_sm_share=0.0)
    plain = steptime.step_time(moe, HW_NOSM, cal, tp=1, sp=False, **{**BASE, "ep": 8, "dp": 8})
    hidden = steptime.step_time(moe, HW_NOSM, cal, tp=1, sp=False, overlap={"ep": "batched"}, **{**BASE, "ep": 8, "dp": 8})
    layer = (plain["matmul"] + plain["attention"] + plain["memory"]) / moe["layers"]
    assert plain["ep"] > 0
    assert hidden["ep"] == pytest.approx(moe["layers"] * max(0.0, plain["ep"] / moe["layers"] - layer))


def _moe():
    from mlsysim_core import SparseTransformerWorkload
    return SparseTransformerWorkload(name="m", parameters=8_000_000_000, active_parameters=2_000_000_000, layers=8,
                                     hidden_dim=2048, heads=16, vocab_size=32000, ffn_dim=8192, gated_mlp=True,
                                     experts=32, active_experts_per_token=2)


def test_float8_halves_compute_bound_gemms_and_pays_its_casts():
    bf16 = steptime.step_time(FIG, HW_NOSM, CAL, tp=1, sp=False, **BASE)
    f8 = steptime.step_time(FIG, HW_NOSM, CAL, tp=1, sp=False, float8=True, **BASE)
    g = steptime.layer_gemms(FIG, HW_NOSM, CAL, 4096, 1, 1, 1)
    # every layer GEMM compute-bound here: float8 halves the layers' share; the LM head stays bf16
    head = 2 * 4096 * FIG["head"] * 3 / (0.5 * 1e15)
    assert f8["matmul"] - head == pytest.approx((bf16["matmul"] - head) / 2)
    # casts: 5 B per element of each input and weight forward, 5 B per output element and 2 B per transposed
    # input and weight element backward
    T, h, f, q, kv = 4096, 2048, 8192, 2048, 2048
    shapes = [(q + 2 * kv, h), (h, q), (2 * f, h), (h, f)]
    fwd = sum(5 * (T * k + n * k) for n, k in shapes)
    bwd = sum(5 * T * n + 2 * (T * k + n * k) for n, k in shapes)
    assert (g["cast_fwd"], g["cast_bwd"]) == (fwd, bwd)
    assert f8["memory"] - bf16["memory"] == pytest.approx(FIG["layers"] * (fwd + bwd) / 3e12)


def test_pipeline_send_under_sequence_parallelism_moves_its_shard():
    no_sp = steptime.step_time(FIG, HW_NOSM, CAL, tp=4, sp=False, **{**BASE, "pp": 2, "gas": 4})
    sp = steptime.step_time(FIG, HW_NOSM, CAL, tp=4, sp=True, **{**BASE, "pp": 2, "gas": 4})
    assert sp["p2p"] == pytest.approx(no_sp["p2p"] / 4)


def test_one_layout_timed_alone_equals_the_search_row(solver):
    found = search.search_plans("llama3-8b", "h100", devices=16, global_batch=32, seq_len=2048, solver=solver,
                                checkpointing=["full"], data_parallel=["zero1"], context_parallel=[1], workers=1)
    row = next(c for c in found.fits if c.tp == 2 and c.pp == 2)
    alone = search.time_plan("llama3-8b", "h100", global_batch=32, seq_len=2048, tp=row.tp, cp=row.cp, pp=row.pp,
                             dp=row.dp, data_parallel=row.data_parallel, checkpointing=row.checkpointing,
                             microbatch=row.microbatch, sequence_parallel=row.sequence_parallel, solver=solver)
    assert alone["components"] == found.components(row)
    assert alone["step_s"] == row.step_time and alone["mfu"] == pytest.approx(row.mfu)
    assert alone["memory_bytes"] == row.total_memory and alone["fits"] is True
    assert alone["bubble"] == pytest.approx(row.bubble)


def test_time_command_answers_as_the_python_call(solver, capsys):
    code, out = run(*["time", "-m", "llama3-8b", "-g", "h100", "-b", "16", "-s", "8192", "--dp", "8",
                              "--data-parallel", "fsdp", "--checkpointing", "op-sac", "--precision", "bf16",
                              "--regime", "bf16", "--optimizer", "adamw", "--compiled", "--power-limit", "500",
                              "--json"])
    assert code == 0
    data = json.loads(out)
    alone = search.time_plan("llama3-8b", "h100", global_batch=16, seq_len=8192, dp=8, data_parallel="fsdp",
                             checkpointing="op-sac", microbatch=2, precision="bf16", optimizer="adamw",
                             profile="measured", compiled=True, power=500, solver=solver, regime="bf16",
                             compile="blocks")      # --compiled: the compiled run's memory too
    assert data["step_s"] == pytest.approx(alone["step_s"]) and data["layout"]["microbatch"] == 2
    assert data["memory_bytes"] == alone["memory_bytes"]
    assert data["assumptions"]["clock_share"] == pytest.approx((5 / 7) ** (1 / 3))
    code, text = run("time", "-m", "llama3-8b", "--tp", "2", "--pp", "2", "--dp", "2", "-b", "8", "--vp", "2",
                     "--zero-stage", "1")
    assert code == 0
    assert "tp 2, cp 1, pp 2 (vp 2), dp 2 (zero1)" in text and "bubble" in text and "matmul" in text
    code, err = error_of(capsys, "time", "--data-parallel", "fsdp", "--zero-stage", "1")
    assert code == 2 and "--zero-stage" in err


def test_the_calibration_split_is_recorded_and_every_other_run_held_out():
    """calibrate.py names its fitted runs; they are few, in published.py, and the rest is reported held out."""
    calibrate = runpy.run_path(str(ROOT / "validation" / "steptime" / "calibrate.py"), run_name="calibrate")
    ids = {c["id"] for c in calibrate["CASES"]}
    fit = calibrate["FIT"]
    assert set(fit) == {"h100", "a100"} and all(set(runs) <= ids for runs in fit.values())
    assert sum(len(r) for r in fit.values()) == 5 and calibrate["FITTED"] == {"h100": ("matmul", "intra_link"),
                                                                              "a100": ("matmul",)}
    comparable = [c for c in calibrate["CASES"] if calibrate["comparable"](c) is None]
    assert len(comparable) >= 180


def test_published_rows_cite_their_source_and_dimensions():
    cases = runpy.run_path(str(ROOT / "validation" / "steptime" / "published.py"))["CASES"]
    mpt = [c for c in cases if c["id"].startswith("llmfoundry-mpt-")]
    assert len(mpt) == 18 + 52 + 7 + 61
    for c in mpt:
        assert "8c8dd48f72168c5d51e2f7b151595892a8fba43d" in c["source"] and c["model_dims"]["source"]
        assert c["micro_batch"] * c["devices"] <= c["global_batch"]
    seven = next(c for c in cases if c["id"] == "llmfoundry-mpt-7b-8xh100-seq2048")
    d = seven["model_dims"]
    assert seven["tokens_per_s_per_gpu"] == 10643 and d["parameters"] == 6658859008     # the row's NumParams
    assert (d["layers"], d["hidden_dim"], d["heads"], d["vocab_size"]) == (32, 4096, 32, 50368)   # mpt-7b.yaml
    # the matmuls are 99.7 % of it: 32 x 12 x 4096^2 + the tied 50,368 x 4096 table + the 2048 x 4096 positions
    assert 32 * 12 * 4096 ** 2 + 50368 * 4096 + 2048 * 4096 == pytest.approx(6658859008, rel=3e-4)
    assert math.isclose(sum(1 for c in cases if c["power_watts"] == 500), 30)


def test_narayanan_rows_reproduce_the_papers_parameter_counts():
    """Table 1's GPT models from their stated shapes: the paper's P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
    gives the billions the table prints."""
    cases = runpy.run_path(str(ROOT / "validation" / "steptime" / "published.py"))["CASES"]
    rows = [c for c in cases if c["id"].startswith("narayanan2021-table1-")]
    assert len(rows) == 10
    stated = {"1.7b": 1.7, "145.6b": 145.6, "1008b": 1008.0, "529.6b": 529.6}
    for c in rows:
        size = c["id"].split("-gpt-")[1].split("-")[0]
        if size in stated:
            assert c["model_dims"]["parameters"] / 1e9 == pytest.approx(stated[size], rel=0.03), c["id"]
        assert c["tp"] * c["pp"] * c["dp_replicate"] == c["devices"]


# --- issue 27: the EP all-to-all's implementations, attention per pass, sliding windows ----------

def test_remote_nodes_is_the_hypergeometric_expectation_enumerated():
    """E[other nodes a token's top-k experts lie on] = (N - 1)(1 - C(E - E/N, k) / C(E, k)), checked
    against every k-subset of a small case, and against math.comb on the Qwen3 shapes."""
    import itertools
    E, k, N = 8, 3, 4                   # experts 0-1 on node 0 (the token's), 2-3 on node 1, ...
    subsets = list(itertools.combinations(range(E), k))
    mean = sum(len({e // (E // N) for e in s} - {0}) for s in subsets) / len(subsets)
    assert steptime.remote_nodes(E, k, N) == pytest.approx(mean)
    assert steptime.remote_nodes(E, k, N) == pytest.approx((N - 1) * (1 - math.comb(E - E // N, k) / math.comb(E, k)))
    # Qwen3 (128 experts, top 8) on 2 nodes: nearly always the other one; on 8 nodes 4.67 of 7
    assert steptime.remote_nodes(128, 8, 2) == pytest.approx(1 - math.comb(64, 8) / math.comb(128, 8))
    assert steptime.remote_nodes(128, 8, 8) == pytest.approx(7 * (1 - math.comb(112, 8) / math.comb(128, 8)))
    assert steptime.remote_nodes(128, 8, 8) == pytest.approx(4.672, abs=1e-3)
    assert steptime.remote_nodes(128, 8, 1) == 0.0


def test_node_forwarded_all_to_all_crosses_the_network_once_per_node():
    hw, cal = {"intra": 450e9, "inter": 50e9}, steptime.DEFAULT
    T, k, h, b = 4096, 8, 2048, 2
    volume = T * k * h * b
    plain = steptime.all_to_all_across_nodes((T, k, h, b), 16, 1, 8, hw, cal)
    forwarded = steptime.all_to_all_across_nodes((T, k, h, b), 16, 1, 8, hw, cal, (128, 8))
    assert plain == pytest.approx(8 / 16 * volume / (50e9 * cal.inter_link))        # 4 of 8 copies leave the node
    # once per token to the other node (if it holds one of the 8 experts), then NVLink: 7/8 of the copies
    across = T * h * b * steptime.remote_nodes(128, 8, 2) / (50e9 * cal.inter_link)
    assert forwarded == pytest.approx(max(across, 7 / 8 * volume / (450e9 * cal.intra_link))) == pytest.approx(across)
    assert plain / forwarded == pytest.approx(4 / steptime.remote_nodes(128, 8, 2))   # about 4x fewer bytes


def _qwen_like():
    from mlsysim_core import SparseTransformerWorkload
    return SparseTransformerWorkload(name="q", parameters=30_000_000_000, active_parameters=3_000_000_000, layers=8,
                                     hidden_dim=2048, heads=32, kv_heads=4, head_dim=128, vocab_size=32000,
                                     ffn_dim=768, gated_mlp=True, experts=128, active_experts_per_token=8)


def test_the_run_chooses_node_forwarding_and_the_rule_must_declare_it():
    from mlsysim_plugins.expert_parallel import COLLECTIVES
    from mlsysim_plugins.steptime_hookspecs import Collective
    moe = steptime.model_figures(_qwen_like())
    cal = attrs.evolve(CAL, overlap_sm_share=0.0)
    axes, _ = steptime.declarations()
    run = dict(tp=1, sp=False, **{**BASE, "ep": 16, "dp": 16})
    plain = steptime.step_time(moe, HW_NOSM, cal, **run)
    fwd = steptime.step_time(moe, HW_NOSM, cal, dispatch={"ep": "node-forwarded"}, **run)
    T, h, b, layers = 4096, 2048, 2, moe["layers"]
    one = T * h * b * steptime.remote_nodes(128, 8, 2) / (50e9 * cal.inter_link)      # (CAL: no latency)
    assert fwd["ep"] == pytest.approx(layers * 4 * one)                    # 2 forward + 2 backward per layer
    assert plain["ep"] == pytest.approx(layers * 4 * (T * 8 * h * b / 2 / (50e9 * cal.inter_link)))
    # a rule that does not declare the implementation is not deduplicated
    bare = {**axes, "ep": (attrs.evolve(COLLECTIVES[0], implementations=()),)}
    assert steptime.step_time(moe, HW_NOSM, cal, rules=bare, dispatch={"ep": "node-forwarded"}, **run)["ep"] == \
        pytest.approx(plain["ep"])
    assert all(isinstance(c, Collective) for c in COLLECTIVES)
    with pytest.raises(steptime.InvalidInputError, match="node-forwarded"):
        steptime.prepare(model=_qwen_like(), hardware=find_hardware("h100").value, registry=_registry(),
                         result=None, seq_len=4096, precision_bytes=2, node=8, dispatch={"ep": "dedup"})


def _registry():
    from mlsysim_core.manager import get_plugin_manager
    return get_plugin_manager().registry


def test_ep_all_to_all_under_sequence_parallelism_moves_the_ranks_own_tokens():
    """Megatron's all-to-all dispatcher: each tp rank sends its 1/tp of the tokens, then the experts
    (split over tp) all-gather them in the tp group and reduce-scatter them back."""
    moe = steptime.model_figures(_qwen_like())
    cal = attrs.evolve(CAL, overlap_sm_share=0.0)
    run = dict(**{**BASE, "ep": 8, "dp": 8, "node": 64})      # (one 64-device node: every group on NVLink)
    no_sp = steptime.step_time(moe, HW_NOSM, cal, tp=2, sp=False, **run)
    sp = steptime.step_time(moe, HW_NOSM, cal, tp=2, sp=True, **run)
    T, k, h, b, layers = 4096, 8, 2048, 2, moe["layers"]
    a2a = 7 / 8 * T * k * h * b / (400e9 * cal.intra_link)
    assert no_sp["ep"] == pytest.approx(layers * 4 * a2a)
    gather = 1 / 2 * T * k * h * b / (400e9 * cal.intra_link)                 # a ring all-gather (and reduce-scatter) over 2 ranks
    assert sp["ep"] == pytest.approx(layers * (4 * a2a / 2 + 4 * gather))


def test_attention_backward_runs_at_63_73_of_the_forward():
    """FlashAttention-2 (Dao 2023, section 1): up to 73 % of the peak forward, 63 % backward."""
    assert steptime.ATTENTION_BACKWARD == pytest.approx(63 / 73)
    assert steptime.DEFAULT.attention_backward == steptime.CALIBRATIONS["nvidia/h100-sxm5-80gb"].attention_backward
    run = dict(tp=1, sp=False, **BASE)
    same = attrs.evolve(CAL, attention_backward=1.0)
    slow = steptime.step_time(FIG, HW_NOSM, CAL, **run)["attention"]
    flat = steptime.step_time(FIG, HW_NOSM, same, **run)["attention"]
    assert flat == pytest.approx(2 * 4096 * 4096 * 2048 * 8 * 3.5 / (CAL.attention * 1e15))
    assert slow / flat == pytest.approx((1 + 2.5 * 73 / 63) / 3.5)


def test_sliding_window_layers_are_timed_over_their_window():
    fig = dict(FIG, window=128, windowed=4)           # half the 8 layers windowed
    s, w = 4096, 128
    windowed = 2 * (w * (w + 1) / 2 + (s - w) * w) / s    # the first w queries see 1..w keys, the rest w
    assert steptime.attention_span(fig, s) == pytest.approx((4 * s + 4 * windowed) / 8)
    assert steptime.attention_span(FIG, s) == s and steptime.attention_span(dict(fig, window=8192), s) == s
    run = dict(tp=1, sp=False, **BASE)
    ratio = steptime.step_time(fig, HW_NOSM, CAL, **run)["attention"] / steptime.step_time(FIG, HW_NOSM, CAL, **run)["attention"]
    assert ratio == pytest.approx((s + windowed) / (2 * s))
    from mlsysim_core.catalog import get_model
    gpt_oss = steptime.model_figures(get_model("openai/gpt-oss-120b"))
    assert (gpt_oss["window"], gpt_oss["windowed"], gpt_oss["layers"]) == (128, 18, 36)


def test_a_dense_model_pays_no_expert_collectives():
    """The expert rule's collectives move routed tokens; a dense model under TP and SP has none."""
    dense = steptime.step_time(FIG, HW_NOSM, CAL, tp=4, sp=True, **BASE)
    assert dense["ep"] == 0.0 and dense["tp"] > 0


# --- issue 27 round 2: the attention kernel's declared speed ---------------------------------------------


def test_a_kernel_declares_its_attention_speed():
    """The Triton FlashAttention kernel (llm-foundry's attn_impl 'triton'): FlashAttention-2 is 'around 1.3-1.5x
    faster ... in the forward pass and around 2x faster in the backward pass' (Dao 2023, section 4.1)."""
    t = steptime.FLASH_ATTENTION_TRITON
    assert (t.forward, t.backward) == (pytest.approx(1 / 1.4), 0.5)
    run = dict(tp=1, sp=False, **BASE)
    fa2 = steptime.step_time(FIG, HW_NOSM, CAL, **run)
    tri = steptime.step_time(FIG, HW_NOSM, CAL, attention_speed=(t.forward, t.backward), **run)
    forward = 2 * 4096 * 4096 * 2048 * 8 / (CAL.attention * 1e15)          # one forward pass, all 8 layers
    assert fa2["attention"] == pytest.approx(forward * (1 + 2.5 / CAL.attention_backward))
    assert tri["attention"] == pytest.approx(forward * (1.4 + 2.5 * 2 / CAL.attention_backward))
    assert {k: v for k, v in tri.items() if k not in ("attention", "step")} == \
        {k: v for k, v in fa2.items() if k not in ("attention", "step")}
    with pytest.raises(Exception, match="AttentionTiming.forward"):
        steptime.AttentionTiming(forward=0, backward=1)


def test_calibration_times_llmfoundry_rows_with_their_triton_kernel():
    """published.py's llm-foundry rows state attn_impl 'triton' (submit_benchmarks.py's default at the commits
    that wrote the tables); calibrate.py times them with a kernel that declares FLASH_ATTENTION_TRITON and keeps
    SDPA's bytes, through the public time_plan."""
    cal = runpy.run_path(str(ROOT / "validation/steptime/calibrate.py"), run_name="calibrate_test")
    lf = [c for c in cal["CASES"] if c["source"].startswith("mosaicml/llm-foundry")]
    assert lf and all(c["attn_impl"] == "triton" for c in lf)
    assert all(c["attn_impl"] is None for c in cal["CASES"] if c not in lf)
    case = next(c for c in lf if c["id"] == "llmfoundry-mpt-1b-8xh100-seq32768")
    shipped = cal["shipped"]("h100")
    timed = cal["predict"](case, shipped)
    plain = dict(case, attn_impl=None)
    fa2 = cal["predict"](plain, shipped)
    ratio = timed["components"]["attention"] / fa2["components"]["attention"]
    b = shipped.attention_backward
    assert ratio == pytest.approx((1.4 + 5 / b) / (1 + 2.5 / b))            # no recompute: one forward pass
    assert timed["components"]["matmul"] == fa2["components"]["matmul"]


def test_calibration_times_transformer_engines_attention_on_hopper_as_cudnns():
    """Megatron-LM's and Megatron-Bridge's rows run Megatron-Core's TE spec, whose DotProductAttention picks cuDNN's
    fused attention on Hopper (TransformerEngine d0067d0 utils.py lines 1647-1653); calibrate.py times their H100 rows
    with a kernel declaring CUDNN_FUSED_ATTENTION: FlashAttention-3's Fig. 5-6 (H100, head dim 128, seq 8k), cuDNN
    529 / 518 TFLOP/s forward / backward against FlashAttention-2's 333 / 318. Blackwell rows (not measured) keep
    FlashAttention-2's shares."""
    t = steptime.CUDNN_FUSED_ATTENTION
    assert (t.forward, t.backward) == (529 / 333, 518 / 318)
    cal = runpy.run_path(str(ROOT / "validation/steptime/calibrate.py"), run_name="calibrate_test")
    case = next(c for c in cal["CASES"] if c["id"] == "megatron-examples-llama3-70b-64xh100-fp8")
    assert cal["layout"](case)["attention"] == "te.cudnn-fused-attention"
    shipped = cal["shipped"]("h100")
    timed = cal["predict"](case, shipped)["components"]
    other = dict(case, source="elsewhere")      # (a source that does not run Transformer Engine: FlashAttention-2)
    assert "attention" not in cal["layout"](other)
    fa2 = cal["predict"](other, shipped)["components"]
    b = shipped.attention_backward
    # no recompute: one forward pass at 333/529 of FlashAttention-2's time, the backward's 2.5 at 318/518
    assert timed["attention"] / fa2["attention"] == pytest.approx((333 / 529 + 2.5 / b * 318 / 518) / (1 + 2.5 / b))
    assert timed["matmul"] == fa2["matmul"]
    blackwell = [c for c in cal["CASES"] if c["source"].startswith("NVIDIA-NeMo/Megatron-Bridge")
                 and c["hardware"] in ("b200", "gb200") and cal["comparable"](c) is None]
    assert blackwell and all("attention" not in cal["layout"](c) for c in blackwell)


def test_repeated_kv_widens_what_the_context_parallel_ring_moves():
    """A model that repeats K and V to the query heads before the kernel (details['repeated_kv'], torchtitan's
    repeat_kv) sends and accumulates query-wide K/V in the ring: its cp component is the one of the same model with
    as many K/V heads as query heads (MHA), whose attention is the same; without the declaration it is not."""
    gqa = TransformerWorkload(name="gqa", parameters=8_000_000_000, layers=32, hidden_dim=4096, heads=32, kv_heads=8,
                              ffn_dim=14336, vocab_size=128256, gated_mlp=True)
    mha = attrs.evolve(gqa, kv_heads=32)
    repeated = attrs.evolve(gqa, details={"repeated_kv": True})
    assert steptime.model_figures(repeated)["h_kv_kernel"] == 4096 and steptime.model_figures(gqa)["h_kv_kernel"] == 1024
    run = dict(tp=1, cp=4, pp=1, dp=2, ep=1, rule="fsdp", recompute=1.0, sp=False, mb=1, gas=1, seq_len=131072,
               bytes_=2, node=8, optimizer_bytes=16.0, compiled=True)
    parts = {name: steptime.step_time(steptime.model_figures(m), HW, CAL, **run)
             for name, m in (("gqa", gqa), ("mha", mha), ("repeated", repeated))}
    assert parts["repeated"]["cp"] == pytest.approx(parts["mha"]["cp"], rel=1e-12)
    assert parts["repeated"]["attention"] == parts["gqa"]["attention"] == parts["mha"]["attention"]
    assert parts["repeated"]["cp"] > parts["gqa"]["cp"]
    # the GEMMs stay the model's own (K and V projected 1024 wide)
    assert parts["repeated"]["matmul"] == parts["gqa"]["matmul"]
    from mlsysim_core.errors import InvalidInputTypeError
    with pytest.raises(InvalidInputTypeError, match="repeated_kv"):
        steptime.model_figures(attrs.evolve(gqa, details={"repeated_kv": 1}))


def test_expert_parallel_group_is_expert_tp_ranks_apart():
    """Megatron-Core orders the expert ranks tp-ep-dp-pp with tp = expert_tensor_parallel_size: with expert tensor
    parallelism 1 under tp 2, an EP group of 8 is 8 neighbouring ranks, one node of 8 (its all-to-all on NVLink, as on
    a 16-GPU node); without expert_tp it is tp = 2 ranks apart and spans two nodes of 8."""
    from mlsysim_core import SparseTransformerWorkload
    moe = SparseTransformerWorkload(name="moe", parameters=30_000_000_000, layers=48, hidden_dim=2048, heads=32,
                                    kv_heads=4, ffn_dim=768, vocab_size=151936, gated_mlp=True, experts=128,
                                    active_experts_per_token=8, active_parameters=3_000_000_000)
    fig = steptime.model_figures(moe)
    run = dict(tp=2, cp=1, pp=1, dp=8, ep=8, rule="zero1", recompute=0.0, sp=True, mb=1, gas=1, seq_len=4096,
               bytes_=2, optimizer_bytes=16.0, compiled=True)
    one_node = steptime.step_time(fig, HW, CAL, **run, node=8, expert_tp=1)["ep"]
    assert one_node == steptime.step_time(fig, HW, CAL, **run, node=16, expert_tp=1)["ep"]
    spread = steptime.step_time(fig, HW, CAL, **run, node=8)["ep"]
    assert spread > steptime.step_time(fig, HW, CAL, **run, node=16)["ep"]      # (2 nodes: the network's share)


def test_calibration_times_each_sources_async_tp_as_its_stack_runs_it():
    # torchtitan's async TP is torch's micro-pipeline TP over symmetric memory (calibrate.ASYNC_TP); Megatron's TP
    # communication overlap (Transformer Engine's userbuffers) the decomposed default; a run without async TP neither
    from scripttools import load_script
    calibrate = load_script("validation/steptime/calibrate.py")
    cases = {c["id"]: c for c in calibrate.CASES}
    layout = calibrate.layout
    assert layout(cases["torchtitan-2506-asynctp-llama3-8b-64xh100-float8-tensorwise-asynctp"])["async_tp"] \
        == "symmetric-memory"
    assert layout(cases["torchtitan-2412-llama3.1-70b-256xh100-fsdp32-tp8-asynctp"])["async_tp"] == "symmetric-memory"
    assert layout(cases["megatron-bridge-2604-llama3-70b-64xh100-fp8"])["async_tp"] is True
    assert layout(cases["torchtitan-2506-asynctp-llama3-8b-64xh100-float8-tensorwise-vanillatp"])["async_tp"] is False
