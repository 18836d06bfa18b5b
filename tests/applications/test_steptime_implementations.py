"""Implementation choices a sharding rule declares for the step time (issue 27): the ring
attention's (context_parallel.ContextParallelOptions.ring: PyTorch's, Transformer Engine's P2P
ring), each timed by hand from its declarations; the memory the same either way."""

import attrs
import pytest

from mlsysim_core import InvalidInputError, TrainingMemoryModel, TransformerWorkload
from mlsysim_core.search import time_plan
from mlsysim_plugins import context_parallel, steptime
from mlsysim_plugins.steptime_hookspecs import collectives, traffic

CAL = attrs.evolve(steptime.DEFAULT, intra_link=0.5, inter_link=0.8, latency=0.0, hop_intra=0.0, hop_inter=0.0,
                   hop_tree_intra=0.0, nvls_latency=0.0)
HW = {"flops": 1e15, "intra": 400e9, "inter": 50e9, "memory": 3e12}
FIG = steptime.model_figures(TransformerWorkload(name="t", parameters=1_000_000_000, layers=8, hidden_dim=2048,
                                                 heads=16, vocab_size=32000, ffn_dim=8192, gated_mlp=True))
RUN = dict(tp=1, cp=4, pp=1, dp=1, ep=1, rule="zero0", recompute=0.0, sp=False, mb=1, gas=1, seq_len=8192,
           bytes_=2, node=8, optimizer_bytes=36.0)
TE = context_parallel.ContextParallelOptions(ring="transformer-engine")


def _rules(options=None):
    axes, _ = steptime.declarations(options=options)
    return axes


def test_the_default_ring_is_pytorchs():
    spec = context_parallel.mlsysim_sharding_rules()[0]
    assert collectives(spec) == context_parallel.RING and traffic(spec) == context_parallel.TRAFFIC
    assert collectives(spec, TE) == context_parallel.TE_RING and traffic(spec, TE) == context_parallel.TE_TRAFFIC
    assert _rules()["cp"] == context_parallel.RING
    assert _rules({"cp": TE})["cp"] == context_parallel.TE_RING


def test_transformer_engines_p2p_ring_by_hand():
    # T = 8192 / 4 tokens per rank; each step computes 1/4 of the layer's attention
    te = steptime.step_time(FIG, HW, CAL, rules=_rules({"cp": TE}), **RUN)
    T, hq, hkv, n = 2048, FIG["h_q"], FIG["h_kv"], 4
    attn_pass = 2 * T * 8192 * hq / (CAL.attention * 1e15)
    fstep, bstep = attn_pass / n, attn_pass * 2.5 / CAL.attention_backward / n
    send = T * 2 * hkv * 2 / (400e9 * 0.5)              # one bf16 K/V (or dK/dV) buffer to the next rank
    comm = ((n - 1) * steptime.hidden(send, fstep, CAL)               # forward: n - 1 K/V sends, one per step
            + 2 * (n - 1) * steptime.hidden(send, bstep, CAL))        # backward: n - 1 K/V and n - 1 dK/dV sends
    q, kv = T * hq, T * 2 * hkv
    bytes_ = (n - 1) * 6 * q + 8 * q + 4 * kv + (n - 1) * (6 * q + 6 * kv) + 4 * q + 8 * kv
    kernels = (n - 1) * 3 + 6 + (n - 1) * 5 + 3
    assert te["cp"] == pytest.approx(FIG["layers"] * (comm + bytes_ / (CAL.memory * 3e12)
                                                      + kernels * CAL.kernel_overhead))
    # no send is waited for after the loop: a ring whose sends outlast no step exposes only their SM share
    pytorch = steptime.step_time(FIG, HW, CAL, rules=_rules(), **RUN)
    assert te["cp"] < pytorch["cp"]
    assert {k: v for k, v in te.items() if k not in ("cp", "step")} == \
        {k: v for k, v in pytorch.items() if k not in ("cp", "step")}


def test_the_ring_is_a_time_choice_the_memory_does_not_see():
    solver = TrainingMemoryModel("measured")
    run = dict(batch_size=2, seq_len=8192, precision="bf16", optimizer="adamw", activation_checkpointing="full",
               cp_size=2, dp_size=1, tp_size=1, pp_size=1, data_parallel="zero1")
    default = solver.solve("llama3-8b", "h100", **run)
    te = solver.solve("llama3-8b", "h100", plugin_options={"cp": {"ring": "transformer-engine"}}, **run)
    assert te.total_memory == default.total_memory
    with pytest.raises(InvalidInputError, match=r"plugin_options\['cp'\]"):
        solver.solve("llama3-8b", "h100", plugin_options={"cp": {"ring": "nccl"}}, **run)


def test_time_plan_times_the_ring_the_run_chooses():
    run = dict(global_batch=4, seq_len=65536, tp=1, cp=2, pp=1, dp=4, data_parallel="fsdp", checkpointing="full",
               microbatch=1, precision="bf16", optimizer="adamw", profile="measured", memory=False)
    default = time_plan("llama3-8b", "h100", **run)
    te = time_plan("llama3-8b", "h100", plugin_options={"cp": {"ring": "transformer-engine"}}, **run)
    pytorch = time_plan("llama3-8b", "h100", plugin_options={"cp": {"ring": "pytorch"}}, **run)
    assert pytorch["components"] == default["components"]
    assert te["components"]["cp"] < default["components"]["cp"]
    assert {k: v for k, v in te["components"].items() if k not in ("cp", "step")} == \
        {k: v for k, v in default["components"].items() if k not in ("cp", "step")}


# --- fsdp-grad-op's gradient_sync (the Llama 3 paper's FSDP: fp32 gradients reduce-scattered once per step) ---

from mlsysim_plugins import fsdp  # noqa: E402

STEP = fsdp.GradOpOptions(gradient_sync="step")
ACCUMULATING = dict(batch_size=16, seq_len=2048, precision="bf16", optimizer="adamw", activation_checkpointing="full",
                    dp_size=4, tp_size=2, pp_size=2, data_parallel="fsdp-grad-op", gradient_accumulation_steps=4)


def test_gradient_sync_per_step_declares_one_fp32_reduce_scatter():
    spec = next(s for s in fsdp.mlsysim_sharding_rules() if s.name == "fsdp-grad-op")
    assert collectives(spec) == fsdp.SHARD_GRAD_OP                  # the default: as before
    gather, reduce = collectives(spec, STEP)
    assert gather == fsdp.SHARD_GRAD_OP[0]                          # parameters gathered every micro-batch
    # once per step, in the last micro-batch's backward, in the regime's reduce dtype (here amp-bf16's fp32)
    assert (reduce.kind, reduce.per, reduce.last_micro_batch, reduce.element_bytes) == (
        "reduce-scatter", "step", True, None)
    # by hand: gas micro-batches each gather (behind their forward, the first layer's share exposed); one fp32
    # reduce-scatter of the local shard behind the last one's backward (no other call beside it there)
    # fsdp-bf16's collective bytes (parameters gathered in bf16, gradients reduced in fp32: the Llama 3 paper's)
    run = dict(RUN, cp=1, dp=8, gas=4, seq_len=2048, dp_bytes={"parameters": 2, "gradients": 4})
    _, by_rule = steptime.declarations(options={"fsdp-grad-op": STEP})
    step = steptime.step_time(FIG, HW, CAL, rules=_rules(), **{**run, "rule": by_rule["fsdp-grad-op"]})
    micro = steptime.step_time(FIG, HW, CAL, rules=_rules(), **{**run, "rule": fsdp.SHARD_GRAD_OP})
    local = FIG["parameters"]
    bw = 400e9 * 0.5
    g16, g32 = 7 / 8 * local * 2 / bw, 7 / 8 * local * 4 / bw
    fwd = (step["matmul"] + step["attention"] + step["memory"]) / 4 / 3
    bwd = 2 * fwd
    expected = 4 * (steptime.hidden(g16, fwd, CAL) + g16 / 8) + steptime.hidden(g32, bwd, CAL)
    assert step["dp"] == pytest.approx(expected)
    assert micro["dp"] == pytest.approx(4 * (steptime.hidden(g16, fwd, CAL) + g16 / 8 + steptime.hidden(g32, bwd, CAL)))
    assert step["optimizer"] == micro["optimizer"]                  # both step on the dp shard


def test_gradient_sync_per_step_keeps_the_unsharded_fp32_gradients():
    solver = TrainingMemoryModel("measured")
    default = solver.solve("llama3-8b", "h100", **ACCUMULATING)
    stated = solver.solve("llama3-8b", "h100", plugin_options={"fsdp-grad-op": {"gradient_sync": "micro-batch"}},
                          **ACCUMULATING)
    assert stated.total_memory == default.total_memory              # the default option is the rule as before
    step = solver.solve("llama3-8b", "h100", plugin_options={"fsdp-grad-op": {"gradient_sync": "step"}},
                        **ACCUMULATING)
    [term] = [t for t in step.terms if "accumulated over micro-batches" in t.label]
    rank = 8_030_535_680 // 4        # the heaviest rank's tp x pp share of llama3-8b's parameters (2,007,633,920)
    # in reduce_dtype (amp-bf16: fp32), less the rank's fp32 shard the gradient terms count (dp 4)
    assert term.nbytes == rank * 4 - rank / 4 * 4 and term.phases == ("forward", "backward")
    assert step.total_memory > default.total_memory
    # one micro-batch: nothing accumulates, the run is the default's
    one = {**ACCUMULATING, "gradient_accumulation_steps": 1, "batch_size": 4}
    assert solver.solve("llama3-8b", "h100", plugin_options={"fsdp-grad-op": {"gradient_sync": "step"}},
                        **one).total_memory == solver.solve("llama3-8b", "h100", **one).total_memory
    with pytest.raises(InvalidInputError, match=r"plugin_options\['fsdp-grad-op'\]"):
        solver.solve("llama3-8b", "h100", plugin_options={"fsdp-grad-op": {"gradient_sync": "never"}}, **ACCUMULATING)


def test_time_plan_times_the_gradient_sync_the_run_chooses():
    run = dict(global_batch=64, seq_len=4096, tp=8, pp=4, dp=4, data_parallel="fsdp-grad-op", checkpointing="full",
               microbatch=1, precision="bf16", optimizer="adamw", profile="measured", memory=False)
    default = time_plan("llama3-70b", "h100", **run)
    step = time_plan("llama3-70b", "h100", plugin_options={"fsdp-grad-op": {"gradient_sync": "step"}}, **run)
    assert step["components"]["dp"] < default["components"]["dp"]
    assert {k: v for k, v in step["components"].items() if k not in ("dp", "step")} == \
        {k: v for k, v in default["components"].items() if k not in ("dp", "step")}


# --- the pipeline rule's stages (the Llama 3 paper's: one layer fewer on the first and last stages) ---

from mlsysim_plugins import pipeline_parallel  # noqa: E402


def test_end_stages_one_layer_fewer_time_the_slower_stage():
    spec = pipeline_parallel.mlsysim_sharding_rules()[0]
    from mlsysim_plugins.steptime_hookspecs import stages
    assert stages(spec) == "even"
    assert stages(spec, pipeline_parallel.PipelineOptions(stages="ends-one-fewer")) == "ends-one-fewer"
    run = dict(RUN, cp=1, pp=4, dp=1, gas=8, seq_len=2048)
    even = steptime.step_time(FIG, HW, CAL, rules=_rules(), **run)
    fewer_rules = _rules({"pp": pipeline_parallel.PipelineOptions(stages="ends-one-fewer")})
    assert fewer_rules["pp.stages"] == "ends-one-fewer"
    fewer = steptime.step_time(FIG, HW, CAL, rules=fewer_rules, **run)
    # 8 layers over 4 stages: even, 2 a stage and the head on the last; ends one fewer, ceil(10 / 4) = 3 in the
    # middle (no head) and 2 + the head on the last: the slower of the two
    middle = steptime.step_time(FIG, HW, CAL, rules=fewer_rules, **run, _stage=(3, False))
    last = steptime.step_time(FIG, HW, CAL, rules=fewer_rules, **run, _stage=(2, True))
    assert last == even
    assert fewer == max(middle, last, key=lambda p: p["step"])
    # the middle stage: 3 layers' matmuls and no LM head, no logits
    g = steptime.layer_gemms(FIG, HW, CAL, 2048, 1, 1, 2)
    layer = 2 * 2048 * FIG["layer_active"] * (g["fwd"] + 2 * g["bwd"])
    assert middle["matmul"] == pytest.approx(8 * 3 * layer)
    head = 2 * 2048 * FIG["head"] * 3 * g["head"]
    assert even["matmul"] == pytest.approx(8 * (2 * layer + head))
    assert steptime.step_time(FIG, HW, CAL, rules=fewer_rules, **dict(run, pp=1)) == \
        steptime.step_time(FIG, HW, CAL, rules=_rules(), **dict(run, pp=1))        # one stage: nothing to split


def test_time_plan_times_the_stages_the_run_chooses_and_the_memory_is_unchanged():
    run = dict(global_batch=64, seq_len=4096, tp=8, pp=4, dp=2, data_parallel="zero1", checkpointing="full",
               microbatch=1, precision="bf16", optimizer="adamw", profile="measured")
    even = time_plan("llama3-70b", "h100", **run)
    fewer = time_plan("llama3-70b", "h100", plugin_options={"pp": {"stages": "ends-one-fewer"}}, **run)
    assert fewer["memory_bytes"] == even["memory_bytes"]
    # 80 layers over 4: even 20 + the head; ends one fewer: 21 in the middle stages, 20 + the head on the last
    assert fewer["step_s"] != even["step_s"]
    with pytest.raises(InvalidInputError, match=r"plugin_options\['pp'\]"):
        time_plan("llama3-70b", "h100", plugin_options={"pp": {"stages": "uneven"}}, **run)


def test_gradient_sync_per_step_with_lora_is_refused():
    from mlsysim_core import NotModelledError
    with pytest.raises(NotModelledError, match=r"plugin_options\['fsdp-grad-op'\]\.gradient_sync='step'.*LoRA"):
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", plugin_options={"fsdp-grad-op": {
            "gradient_sync": "step"}}, lora={"rank": 16}, **{**ACCUMULATING, "tp_size": 1, "pp_size": 1})


def test_a_chunk_of_one_layer_under_ends_one_fewer_the_llama3_papers_v():
    # The Llama 3 paper's pipeline in miniature: 14 layers over pp 4, one fewer on the end stages (3, 4, 4, 3) and
    # one layer a chunk: v = ceil((14 + 2) / 4) = 4 chunks per rank, the first stage's first chunk the embedding
    # only. An even split refuses it (4 x 4 chunks need 16 layers); said as stage_layers (the memory side's
    # split) it is laid out, and the step time times its bubble as interleaved 1F1B's (pp - 1) / v slots.
    model = TransformerWorkload(name="t14", parameters=1_400_000_000, layers=14, hidden_dim=2048, heads=16,
                                vocab_size=32000, ffn_dim=8192, gated_mlp=True, architecture="llama")
    run = dict(global_batch=16, seq_len=2048, tp=1, pp=4, dp=1, data_parallel="zero1", checkpointing="none",
               microbatch=1, precision="bf16", optimizer="adamw", profile="measured", memory=False,
               plugin_options={"pp": {"stages": "ends-one-fewer"}})
    from mlsysim_core import LayoutError
    with pytest.raises(LayoutError, match=r"virtual_stages=4 .*at most 3 model chunks per stage"):
        time_plan(model, "h100", vp=4, **run)
    v4 = time_plan(model, "h100", vp=4, stage_layers=(3, 4, 4, 3), **run)
    v1 = time_plan(model, "h100", stage_layers=(3, 4, 4, 3), **run)
    assert v4["layout"]["vp"] == 4 and v1["layout"]["vp"] == 1
    gas = 16
    for timed, idle in ((v4, 3 / 4), (v1, 3)):
        c = timed["components"]
        micro = (c["step"] - c["bubble"] - c["dp"] - c["optimizer"]) / gas
        assert c["bubble"] == pytest.approx(idle * micro)
        assert timed["bubble"] == pytest.approx(idle / (gas + idle))
    # the same stage times but the sends: v per micro-batch slot at v chunks
    a, b = v4["components"], v1["components"]
    assert a["p2p"] == pytest.approx(4 * b["p2p"])
    assert {k: a[k] for k in ("matmul", "attention", "memory", "tp", "dp")} == \
        {k: b[k] for k in ("matmul", "attention", "memory", "tp", "dp")}
    # stage_layers is the pipeline's own option: the one-device solve (recompute, optimizer bytes) takes none, and a
    # split equal to the even one times as no split at all
    even = dict(run, plugin_options=None)
    assert time_plan(model, "h100", stage_layers=(3, 4, 4, 3), **even)["step_s"] == \
        time_plan(model, "h100", **even)["step_s"]


def test_overlapped_pipeline_sends_hide_behind_one_chunk_each_by_hand():
    # The pp rule's option p2p: "blocking" (default) keeps each send on the critical path; "overlapped" (Megatron's
    # overlap_p2p_comm, the Llama 3 paper's asynchronous P2P) hides the activation's send behind one chunk's backward
    # and the gradient's behind one chunk's forward, each paying what outlasts it and the SMs it holds
    spec = pipeline_parallel.mlsysim_sharding_rules()[0]
    over = pipeline_parallel.PipelineOptions(p2p="overlapped")
    assert collectives(spec) == pipeline_parallel.COLLECTIVES
    assert collectives(spec, over) == pipeline_parallel.OVERLAPPED
    run = dict(RUN, cp=1, pp=4, dp=1, gas=8, seq_len=2048, chunks=2, idle_slots=3 / 2)
    blocking = steptime.step_time(FIG, HW, CAL, rules=_rules(), **run)
    overlapped = steptime.step_time(FIG, HW, CAL, rules=_rules({"pp": over}), **run)
    gas, v, r = 8, 2, 0.0
    send = blocking["p2p"] / (gas * v * 2)          # one send: T h bytes to the next stage, in the node (tp x dp = 1)
    assert send == pytest.approx(2048 * FIG["h"] * 2 / (HW["intra"] * CAL.intra_link))
    fwd = (blocking["matmul"] + blocking["attention"] + blocking["memory"]) / gas / (3 + r)
    bwd = fwd * (2 + r)

    def hidden(c, k):
        return max(0.0, c - k) + CAL.overlap_sm_share * min(c, k)
    assert overlapped["p2p"] == pytest.approx(gas * v * (hidden(send, bwd / v) + hidden(send, fwd / v)))
    assert overlapped["p2p"] == pytest.approx(blocking["p2p"] * CAL.overlap_sm_share)   # (each send shorter than a chunk)
    # the bubble's slots carry the micro-batch's own sends: the same (pp - 1) / v slots of a shorter micro-batch
    micro = lambda p: (p["step"] - p["bubble"] - p["dp"] - p["optimizer"]) / gas   # noqa: E731
    assert overlapped["bubble"] == pytest.approx(1.5 * micro(overlapped))
    assert micro(blocking) - micro(overlapped) == pytest.approx((blocking["p2p"] - overlapped["p2p"]) / gas)
    with pytest.raises(ValueError, match="p2p"):
        pipeline_parallel.PipelineOptions(p2p="async")


def test_the_routed_tokens_gather_over_the_expert_tensor_parallel_group_by_hand():
    # The EP rule's all-gather and reduce-scatter of the routed tokens run over the expert tensor-parallel group
    # (Megatron-Core's dispatcher: tp_group = expt_tp, both under "if self.tp_size > 1"): the tp group by default,
    # none at expert_tp = 1 (the Qwen3-235B recipe's), expert_tp ranks otherwise; the all-to-all the same
    from mlsysim_core import SparseTransformerWorkload
    from mlsysim_plugins import expert_parallel
    assert [c.group for c in expert_parallel.COLLECTIVES] == ["ep", "ep", "etp", "etp"]
    moe = steptime.model_figures(SparseTransformerWorkload(
        name="m", parameters=2_000_000_000, active_parameters=500_000_000, layers=8, hidden_dim=2048, heads=16,
        vocab_size=32000, ffn_dim=1024, gated_mlp=True, experts=32, active_experts_per_token=2))
    # (a 16-GPU node: the EP group of 8, tp = 2 or expert_tp = 1 rank apart, inside it either way, so its all-to-all
    # is the same: test_steptime_mechanisms times the group's placement)
    run = dict(RUN, tp=2, cp=1, pp=1, dp=8, ep=8, rule="zero1", sp=True, mb=1, gas=1, seq_len=4096, node=16)
    default = steptime.step_time(moe, HW, CAL, rules=_rules(), **run)
    as_tp = steptime.step_time(moe, HW, CAL, rules=_rules(), **run, expert_tp=2)
    none = steptime.step_time(moe, HW, CAL, rules=_rules(), **run, expert_tp=1)
    assert as_tp == default
    # per layer, forward and backward: one all-gather and one reduce-scatter each of (2 - 1) / 2 x T k h x 2 B inside
    # the node (tp ranks 1 apart), T = 4096 tokens, k = 2, h = 2048; CAL's latencies are 0
    one = (2 - 1) / 2 * 4096 * 2 * 2048 * 2 / (HW["intra"] * CAL.intra_link)
    assert default["ep"] - none["ep"] == pytest.approx(8 * 2 * 2 * one)
    assert {k: v for k, v in none.items() if k not in ("ep", "step")} == \
        {k: v for k, v in default.items() if k not in ("ep", "step")}


def test_time_plan_times_the_expert_tensor_parallelism_the_run_sets():
    run = dict(global_batch=16, seq_len=4096, tp=2, pp=1, dp=8, ep=8, data_parallel="zero1", checkpointing="full",
               microbatch=1, precision="bf16", optimizer="adamw", profile="measured", memory=False,
               sequence_parallel=True)
    default = time_plan("qwen/qwen3-30b-a3b", "h100", **run)
    same = time_plan("qwen/qwen3-30b-a3b", "h100", expert_tp_size=2, **run)
    one = time_plan("qwen/qwen3-30b-a3b", "h100", expert_tp_size=1, **run)
    assert same["components"] == default["components"]
    assert one["components"]["ep"] < default["components"]["ep"]
    assert {k: v for k, v in one["components"].items() if k not in ("ep", "step")} == \
        {k: v for k, v in default["components"].items() if k not in ("ep", "step")}
