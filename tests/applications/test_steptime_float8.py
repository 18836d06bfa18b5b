"""The float8 implementations' declared casts (steptime.Float8Casts), as layer_gemms counts them: bytes by hand."""

import pytest

from mlsysim_core.errors import InvalidInputError
from mlsysim_plugins import steptime
from mlsysim_plugins.steptime import (TE_CURRENT_SCALING, TE_DELAYED_SCALING, TE_MXFP8, TORCHAO_ROWWISE,
                                             TORCHAO_TENSORWISE, Float8Casts, casts_of)

# q/k/v (N 3072, K 1024), output projection (1024, 1024), MLP up+gate (8192, 1024), down (1024, 4096); 512 tokens
FIG = dict(gemms=((3072, 1024, "n", False), (1024, 1024, "k", False), (8192, 1024, "n", False),
                  (1024, 4096, "k", False)), experts=1, k=1, h=1024, vocab=0)
HW = dict(flops=1e15, fp8=2e15, clock=1.0, memory=3e12, sms=None)
M = 512
INPUTS = [M * k for _, k, _, _ in FIG["gemms"]]
WEIGHTS = [n * k for n, k, _, _ in FIG["gemms"]]
GRADS = [M * n for n, _, _, _ in FIG["gemms"]]


def casts(declared):
    g = steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 1, 1, 1, declared)
    return g["cast_fwd"], g["cast_bwd"], g["cast_step"]


def test_torchao_tensorwise_casts_every_operand_each_pass():
    # amax 2 + cast 3 per input and weight element each forward, per gradient element each backward; the backward's
    # transposed copies of input and weight 1 + 1
    assert casts(TORCHAO_TENSORWISE) == (5 * sum(INPUTS) + 5 * sum(WEIGHTS), 5 * sum(GRADS) + 2 * (sum(INPUTS) + sum(WEIGHTS)), 0)
    assert casts_of(True) is TORCHAO_TENSORWISE


def test_torchao_rowwise_casts_each_gemms_operand_along_its_axis_and_rescales_the_backward():
    # torchao's roofline (roofline_utils.py, rowwise): an input 5 B forward (cast, and its bf16 transposed copy) and 3 B
    # backward (the transposed copy's cast); a weight 3 B forward, 4 + 3 B backward (transposed in bf16, then cast);
    # an output gradient 5 + 3 B. The two backward GEMMs (slow accumulation: cuBLAS tensorwise, then
    # output *= scales) read and write their bf16 outputs once more: the input gradient (M x K, an input's size) and
    # the weight gradient (N x K, a weight's), 2 + 2 B each
    assert casts(TORCHAO_ROWWISE) == pytest.approx((5 * sum(INPUTS) + 3 * sum(WEIGHTS),
                                                    8 * sum(GRADS) + 3 * sum(INPUTS) + 7 * sum(WEIGHTS)
                                                    + 4 * (sum(INPUTS) + sum(WEIGHTS)), 0))
    # 512 tokens through q/k/v (3072 x 1024): forward 5 x 512 x 1024 + 3 x 3072 x 1024 B
    one = dict(FIG, gemms=(FIG["gemms"][0],))
    g = steptime.layer_gemms(one, HW, steptime.DEFAULT, M, 1, 1, 1, TORCHAO_ROWWISE)
    assert (g["cast_fwd"], g["cast_bwd"]) == (2_621_440 + 9_437_184, 8 * 1_572_864 + 7 * 524_288 + 11 * 3_145_728)


def test_transformer_engine_current_scaling():
    # the norm-produced inputs (q/k/v, MLP up) 4 B (amax in the norm), the others 6 B; weights 6 B once a step;
    # gradients 6 B (amax, cast and transpose); no backward transposes
    normed = INPUTS[0] + INPUTS[2]
    assert casts(TE_CURRENT_SCALING) == pytest.approx((4 * normed + 6 * (INPUTS[1] + INPUTS[3]), 6 * sum(GRADS),
                                                       6 * sum(WEIGHTS)))


def test_transformer_engine_delayed_scaling_and_mxfp8():
    normed = INPUTS[0] + INPUTS[2]
    assert casts(TE_DELAYED_SCALING) == pytest.approx((1 * normed + 4 * (INPUTS[1] + INPUTS[3]), 4 * sum(GRADS),
                                                       4 * sum(WEIGHTS)))
    mx = 4 + 1 / 16
    assert casts(TE_MXFP8) == pytest.approx((mx * sum(INPUTS), mx * sum(GRADS), mx * sum(WEIGHTS)))


def test_a_routed_gemm_input_is_not_the_norms():
    fig = dict(FIG, gemms=((8192, 1024, "n", True),), experts=8, k=2)     # (first, but routed)
    g = steptime.layer_gemms(fig, HW, steptime.DEFAULT, M, 1, 8, 1, TE_CURRENT_SCALING)
    assert g["cast_fwd"] == pytest.approx(6 * M * 2 * 1024)     # T x k x ep / experts tokens, 6 B each


def test_weight_per_is_checked():
    with pytest.raises(InvalidInputError, match="weight_per"):
        Float8Casts(name="x", input=1, normed_input=1, weight=1, weight_per="layer", grad=1, transpose=0)


def test_step_time_amortises_step_casts_over_micro_batches():
    fig = steptime.model_figures(__import__("mlsysim_core.catalog", fromlist=["get_model"]).get_model(
        "meta-llama/meta-llama-3-8b"))
    hw = dict(HW, intra=4.5e11, inter=5e10, sms=None)
    run = dict(tp=1, cp=1, pp=1, dp=1, ep=1, rule="zero1", recompute=0.0, sp=False, mb=1, seq_len=4096, bytes_=2,
               node=8, optimizer_bytes=16, compiled=True)
    one = steptime.step_time(fig, hw, steptime.DEFAULT, gas=1, float8=TE_CURRENT_SCALING, **run)
    four = steptime.step_time(fig, hw, steptime.DEFAULT, gas=4, float8=TE_CURRENT_SCALING, **run)
    g = steptime.layer_gemms(fig, hw, steptime.DEFAULT, 4096, 1, 1, 1, TE_CURRENT_SCALING)
    weights = g["cast_step"] * fig["layers"] / (steptime.DEFAULT.memory * hw["memory"])
    # four micro-batches pay four times the per-micro-batch traffic and the weights' casts once
    assert four["memory"] - 4 * one["memory"] == pytest.approx(weights - 4 * weights)


def test_separate_projections_cast_the_shared_input_once_per_linear_module():
    # torchtitan's wq / wk / wv and w1 / w3: three modules read the q/k/v GEMM's input and two the MLP up's; each
    # Float8Linear casts its own input (forward), its backward's copy of it and rescales its own input gradient
    lin = dict(FIG, linears=(3, 1, 2, 1))
    extra = 2 * INPUTS[0] + 1 * INPUTS[2]       # the input elements cast again: 2 more modules, 1 more
    g = steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 1, 1, 1, TORCHAO_ROWWISE)
    base = casts(TORCHAO_ROWWISE)
    assert (g["cast_fwd"], g["cast_bwd"], g["cast_step"]) == pytest.approx(
        (base[0] + 5 * extra, base[1] + (3 + 4) * extra, 0))
    # 512 tokens, K 1024: the q/k/v's input 524,288 elements cast 3 times (5 B each) and the weight once (3 B)
    one = steptime.layer_gemms(dict(lin, gemms=(FIG["gemms"][0],), linears=(3,)), HW, steptime.DEFAULT, M, 1, 1, 1,
                               TORCHAO_ROWWISE)
    assert one["cast_fwd"] == 3 * 5 * 524_288 + 3 * 3_145_728
    # tensorwise: 5 B forward, the backward's transposed copy 2 B, per module
    g = steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 1, 1, 1, TORCHAO_TENSORWISE)
    t = casts(TORCHAO_TENSORWISE)
    assert (g["cast_fwd"], g["cast_bwd"]) == pytest.approx((t[0] + 5 * extra, t[1] + 2 * extra))
    # the GEMMs' time (FLOPs, tiles) is the fused GEMM's, in bf16 and float8
    for operand_bytes in (2, 1):
        a = steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 1, 1, operand_bytes, TORCHAO_ROWWISE)
        b = steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 1, 1, operand_bytes, TORCHAO_ROWWISE)
        assert (a["fwd"], a["bwd"], a["head"]) == (b["fwd"], b["bwd"], b["head"])


def test_separate_projections_is_read_from_the_models_details():
    from mlsysim_core.catalog import get_model
    from mlsysim_core.errors import InvalidInputTypeError
    import attrs
    model = get_model("meta-llama/llama-3.1-8b")
    assert steptime.model_figures(model)["linears"] == (1, 1, 1, 1)
    separate = attrs.evolve(model, details={"separate_projections": True})
    assert steptime.model_figures(separate)["linears"] == (3, 1, 2, 1)       # gated MLP: gate and up
    with pytest.raises(InvalidInputTypeError, match="separate_projections"):
        steptime.model_figures(attrs.evolve(model, details={"separate_projections": "yes"}))


def test_float8_tensor_parallelism_casts_the_gathered_input_once_on_the_ranks_shard():
    # torchao's Float8ColwiseParallel / PrepareFloat8ModuleInput (torchtitan under tensorwise TP): the q/k/v's and the
    # MLP up's input cast once, on the rank's 512 / 4 = 128 tokens, before the all-gather, whatever modules read it;
    # Float8RowwiseParallel: the output projection's and MLP down's output gradient cast on 128 tokens. tp 4:
    # q/k/v N 768 (3 modules), out-proj K 256, up N 2048 (2 modules), down K 1024
    lin = dict(FIG, linears=(3, 1, 2, 1))
    g = steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 4, 1, 1, TORCHAO_TENSORWISE, True)
    assert TORCHAO_TENSORWISE.tp_gather == 1
    fwd = (5 * (128 * 1024 + 768 * 1024) + 5 * (512 * 256 + 1024 * 256) + 5 * (128 * 1024 + 2048 * 1024)
           + 5 * (512 * 1024 + 1024 * 1024))
    # output gradients 5 B (q/k/v and up on their own 512 x N / tp), the backward's transposed float8 copies 1 + 1 B
    # of each module's gathered input (512 x 1024, 3 and 2 modules) and of each weight
    bwd = (5 * (512 * 768 + 128 * 1024 + 512 * 2048 + 128 * 1024)
           + 2 * (3 * 512 * 1024 + 768 * 1024) + 2 * (512 * 256 + 1024 * 256)
           + 2 * (2 * 512 * 1024 + 2048 * 1024) + 2 * (512 * 1024 + 1024 * 1024))
    assert (g["cast_fwd"], g["cast_bwd"], g["cast_step"]) == (fwd, bwd, 0)
    assert (g["cast_fwd"], g["cast_bwd"]) == (25_559_040, 23_461_888)
    # without it: each module casts the whole gathered input (3 x 5 x 512 x 1024 for q/k/v) and every rank the whole
    # gathered gradient (5 x 512 x 1024 for out-proj and down)
    plain = steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 4, 1, 1, TORCHAO_TENSORWISE, False)
    assert plain["cast_fwd"] - g["cast_fwd"] == 5 * (3 * 512 - 128) * 1024 + 5 * (2 * 512 - 128) * 1024
    assert plain["cast_bwd"] - g["cast_bwd"] == 2 * 5 * (512 - 128) * 1024
    # one rank (tp 1) has nothing gathered: the same casts with or without it
    assert (steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 1, 1, 1, TORCHAO_TENSORWISE, True)
            == steptime.layer_gemms(lin, HW, steptime.DEFAULT, M, 1, 1, 1, TORCHAO_TENSORWISE, False))


def test_float8_tensor_parallelism_gathers_one_byte_and_reduce_scatters_the_runs_precision():
    # 4 ranks at 1 GB/s, no latency; 1e9 tokens x 1 hidden x 2 B: an all-gather of 2e9 B moves 3/4 of it (1.5 s), in
    # float8 half that (0.75 s); a sequence-parallel all-reduce is a gather (1 B) and a reduce-scatter (2 B): 2.25 s
    # against bf16's 3 s; a reduce-scatter stays 1.5 s; another group's collective is not the TP's
    import attrs
    from mlsysim_plugins.steptime_hookspecs import Collective
    cal = attrs.evolve(steptime.DEFAULT, intra_link=1.0, latency=0.0, hop_intra=0.0, hop_inter=0.0)
    size = dict(groups={"tp": (4, 1), "cp": (4, 4)}, volumes={"activations": (1e9, 1, 2)}, node=16,
                hw={"intra": 1e9, "inter": 1e9}, cal=cal, sp=True)

    def seconds(kind, gather, group="tp"):
        c = Collective(kind=kind, volume="activations", group=group, per="layer", forward=1, in_network=False)
        return steptime._seconds(c, dict(size, tp_gather=gather))
    assert [seconds(k, None) for k in ("all-gather", "all-reduce", "reduce-scatter")] == pytest.approx([1.5, 3, 1.5])
    assert [seconds(k, 1) for k in ("all-gather", "all-reduce", "reduce-scatter")] == pytest.approx([0.75, 2.25, 1.5])
    assert seconds("all-gather", 1, "cp") == pytest.approx(1.5)


def test_float8_tensor_parallelism_is_what_the_implementation_declares_under_sequence_parallelism():
    # torchtitan's rowwise recipe runs plain TP (bf16 gathers: parallelize_llama.py at 820504e lines 56-65), torchao
    # tensorwise its float8 styles: the step's tp component 3/4 of bf16's bandwidth term for tensorwise, bf16's for
    # rowwise; without sequence parallelism (all-reduces, no gather) neither moves
    import attrs
    from mlsysim_core.search import time_plan
    assert TORCHAO_ROWWISE.tp_gather is None

    def tp(float8, sp=True):
        return time_plan("llama3-8b", "h100", global_batch=8, seq_len=4096, tp=8, dp=1, checkpointing="full",
                         precision="bf16", optimizer="adamw", memory=False, sequence_parallel=sp,
                         float8=float8, calibration=attrs.evolve(steptime.DEFAULT, latency=0.0, hop_intra=0.0,
                                                                 hop_inter=0.0))["components"]["tp"]
    assert tp("torchao-tensorwise") == pytest.approx(0.75 * tp(False))
    assert tp("torchao-rowwise") == pytest.approx(tp(False))
    assert tp("torchao-tensorwise", sp=False) == pytest.approx(tp(False, sp=False))


def test_transformer_engine_under_sequence_parallelism_casts_on_the_shard_and_transposes_what_it_gathers():
    # Transformer Engine (d0067d0) at tp 4 with sequence parallelism, 512 tokens, 128 a rank: a LayerNormLinear (q/k/v
    # N 768, MLP up N 2048, K 1024) quantizes the norm's output on the rank's 128 tokens, rowwise only, and gathers it
    # in float8 (layernorm_linear.py lines 230-232, 282-315); in the backward it gathers it again and makes the
    # transposed copy on all 512 (lines 766-795, 989-993: read 1, write 1). A row-parallel module's output gradient
    # (out-proj N 1024 over K 256, down N 1024 over K 1024) is quantized on its 128 rows, gathered in float8 and
    # transposed on 512 (base.py grad_output_preprocess, distributed.py _all_gather_fp8). Current scaling: the
    # shard's input 3 B (read the norm's 2 B, write 1; amax from the norm), gradient 5 B (amax 2, read 2, write 1);
    # a local input 6 B, a local gradient 6 B (both usages); weights 6 B once a step
    assert (TE_CURRENT_SCALING.tp_gather, TE_CURRENT_SCALING.tp_input, TE_CURRENT_SCALING.tp_grad,
            TE_CURRENT_SCALING.tp_transpose) == (1, 3, 5, 2)
    g = steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 4, 1, 1, TE_CURRENT_SCALING, True)
    fwd = 3 * 128 * 1024 + 6 * 512 * 256 + 3 * 128 * 1024 + 6 * 512 * 1024
    bwd = (6 * 512 * 768 + 2 * 512 * 1024 + 5 * 128 * 1024 + 2 * 512 * 1024
           + 6 * 512 * 2048 + 2 * 512 * 1024 + 5 * 128 * 1024 + 2 * 512 * 1024)
    step = 6 * (768 * 1024 + 1024 * 256 + 2048 * 1024 + 1024 * 1024)
    assert (g["cast_fwd"], g["cast_bwd"], g["cast_step"]) == (fwd, bwd, step) == (4_718_592, 14_155_776, 25_165_824)
    # delayed scaling: the norm kernel writes the shard's float8 in place of its bf16 (-1 B), the gradient's cast
    # 3 B (read 2, write 1; the amax from history), a local input 4 B, a local gradient 4 B
    g = steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 4, 1, 1, TE_DELAYED_SCALING, True)
    assert (g["cast_fwd"], g["cast_bwd"]) == (
        -128 * 1024 + 4 * 512 * 256 - 128 * 1024 + 4 * 512 * 1024,
        4 * 512 * 768 + 3 * 128 * 1024 + 4 * 512 * 2048 + 3 * 128 * 1024 + 4 * 2 * 512 * 1024) == (2_359_296, 10_747_904)
    # without sequence parallelism (nothing gathered) and at tp 1, the unsharded casts, as before
    for casts_ in (TE_CURRENT_SCALING, TE_DELAYED_SCALING):
        assert (steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 1, 1, 1, casts_, True)
                == steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 1, 1, 1, casts_, False))
    plain = steptime.layer_gemms(FIG, HW, steptime.DEFAULT, M, 4, 1, 1, TE_CURRENT_SCALING, False)
    assert (plain["cast_fwd"], plain["cast_bwd"]) == (4 * 512 * 1024 + 6 * 512 * 256 + 4 * 512 * 1024
                                                      + 6 * 512 * 1024,
                                                      6 * (512 * 768 + 512 * 1024 + 512 * 2048 + 512 * 1024))


def test_transformer_engine_gathers_float8_under_sequence_parallelism():
    # its tp component is torchao tensorwise's: the all-gathers at 1 B, the reduce-scatters bf16 (3/4 of bf16's
    # bandwidth term); MXFP8 declares no float8 gather (as before: bf16's)
    import attrs
    from mlsysim_core.search import time_plan

    def tp(float8):
        return time_plan("llama3-8b", "h100", global_batch=8, seq_len=4096, tp=8, dp=1, checkpointing="full",
                         precision="bf16", optimizer="adamw", memory=False, sequence_parallel=True,
                         float8=float8, calibration=attrs.evolve(steptime.DEFAULT, latency=0.0, hop_intra=0.0,
                                                                 hop_inter=0.0))["components"]["tp"]
    for name in ("te-current-scaling", "te-delayed-scaling"):
        assert tp(name) == pytest.approx(0.75 * tp(False))
    assert tp("te-mxfp8") == pytest.approx(tp(False))


def test_async_tp_decomposes_only_the_halves_the_float8_implementation_fuses():
    # pytorch/pytorch issue 149990: under async TP with rowwise scales only the matmul-reduce-scatters fuse. One
    # sequence-parallel all-reduce a forward (an all-gather and a reduce-scatter of 1e9 x 2 B over 4 ranks at 1 GB/s:
    # 1.5 s each, 3 s the pair), one layer, no recompute, 100 s of matmuls, no SMs taken while hidden. Both halves
    # fused (a 16-bit run, tensorwise): the first chunk's 1/4 exposed, 0.75 s. Rowwise: the all-gather whole (1.5 s)
    # and the reduce-scatter's first chunk (0.375 s): 1.875 s. With a float8 gather (1 B, 0.75 s) and only the
    # reduce-scatter fused: 0.75 + 1.5 / 4 = 1.125 s.
    import attrs
    from mlsysim_plugins.steptime_hookspecs import Collective
    assert TORCHAO_ROWWISE.async_tp_fuses == ("reduce-scatter",)
    assert TORCHAO_TENSORWISE.async_tp_fuses == ("all-gather", "reduce-scatter")
    cal = attrs.evolve(steptime.DEFAULT, intra_link=1.0, latency=0.0, hop_intra=0.0, hop_inter=0.0,
                       overlap_sm_share=0.0)
    c = Collective(kind="all-reduce", volume="activations", group="tp", per="layer", forward=1, in_network=False,
                   sequence_parallel=True)
    size = dict(groups={"tp": (4, 1)}, volumes={"activations": (1e9, 1, 2)}, node=16, hw={"intra": 1e9, "inter": 1e9},
                cal=cal, sp=True, tp_gather=None)

    def exposed(fuses, gather=None):
        return steptime._per_layer((c,), 1, 0.0, {"matmul": 100.0}, dict(size, tp_fuses=fuses, tp_gather=gather),
                                   "decomposed")
    assert exposed(None) == pytest.approx(0.75)
    assert exposed(("all-gather", "reduce-scatter")) == pytest.approx(0.75)
    assert exposed(("reduce-scatter",)) == pytest.approx(1.875)
    assert exposed(("reduce-scatter",), gather=1) == pytest.approx(1.125)
    assert exposed(()) == pytest.approx(3.0)
    # vanilla TP (no overlap): the pair whole, whatever the implementation fuses
    assert steptime._per_layer((c,), 1, 0.0, {"matmul": 100.0}, dict(size, tp_fuses=("reduce-scatter",))) \
        == pytest.approx(3.0)
    with pytest.raises(ValueError, match="async_tp_fuses"):
        Float8Casts(name="x", input=1, normed_input=1, weight=1, weight_per="step", grad=1, transpose=0,
                    async_tp_fuses=("all-reduce",))


def test_rowwise_async_tp_exposes_the_all_gathers_in_a_step():
    # time_plan, Llama-3.1-8B on 8 H100, tp 8 with sequence parallelism: async TP hides less under rowwise than it
    # would if rowwise's GEMMs fused both halves (the same declaration with both): the difference is the gathers'
    # (n - 1) / n, on the critical path again, less what the SMs lost to hiding them
    import attrs
    from mlsysim_core.search import time_plan

    def step(float8, async_tp=True):
        return time_plan("llama3-8b", "h100", global_batch=8, seq_len=4096, tp=8, dp=1, checkpointing="full",
                         precision="bf16", optimizer="adamw", memory=False, float8=float8,
                         async_tp=async_tp)["components"]
    both = attrs.evolve(TORCHAO_ROWWISE, name="rowwise-both-fused", async_tp_fuses=("all-gather", "reduce-scatter"))
    rowwise, fused, vanilla = step(TORCHAO_ROWWISE), step(both), step(TORCHAO_ROWWISE, async_tp=False)
    assert fused["tp"] < rowwise["tp"] < vanilla["tp"]
    # the gathers are half of vanilla's bytes: rowwise exposes them whole and the reduce-scatters as fused does
    assert rowwise["tp"] == pytest.approx(vanilla["tp"] / 2 + fused["tp"] / 2, rel=0.05)
