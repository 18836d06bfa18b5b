"""What a float8 implementation's casts read and write, declared per implementation (issue 27 item 2:
float8 matmuls and casts). The step time (``steptime.layer_gemms``) times a float8 GEMM's operands'
casts as memory-bound traffic: bytes per element of its input (M x K), weight (N x K) and output
gradient (M x N), and of the copies the backward transposes. An implementation is chosen by passing its
declaration or its registered name as ``float8`` (``time_plan(float8="te-current-scaling")``; the
plugin ``steptime`` registers these five under ``mlsysim_float8_implementations``); ``float8=True`` is
torchao's tensorwise Float8Linear, as before.

Each figure is derived from the implementation's source at a commit, never from its name:

* torchao tensorwise (``TORCHAO_TENSORWISE``, the planner's float8 since it had one): per operand an amax
  pass (read 2 B) and a scaled cast (read 2, write 1): 5 B an element of the input and the weight each
  forward, of the output gradient each backward; the backward's transposed float8 copies of the input and
  the weight read 1, write 1 (torchao Float8Linear, tensorwise dynamic scaling).
* torchao rowwise (``TORCHAO_ROWWISE``, torchtitan's ``--quantize.linear.float8.recipe_name rowwise``; pytorch/ao
  at 6243040807b9ceee889a58cba8e68c5fc4e2ebd8, 2025-06-13, the day of torchtitan's async-TP benchmark file):
  - ``Float8LinearConfig.from_recipe_name(ROWWISE)`` (torchao/float8/config.py) scales input, weight and output
    gradient axiswise; each GEMM needs its operand scaled along its own reduction axis, so the copies the
    backward reads are cast again from bf16, not transposed from the forward's float8 ones. Bytes per element
    as torchao's own roofline counts them (torchao/testing/float8/roofline_utils.py,
    ``get_tensor_memory_traffic_ovhd_s``, ``float8_recipe_name == "rowwise"``, unfused with the previous op):
    an input (and a gradient) kernel 1 "x_bf16_dim0 -> x_float8_dim0, x_bf16_dim1" (read 2, write 1 and a 2 B
    transposed bf16 copy: 5 B) and kernel 2 "x_bf16_dim1 -> x_float8_dim1" (read 2, write 1: 3 B); a weight
    kernel 1 (forward, 3 B), kernel 2 "x_bf16_dim0 -> x_bf16_dim1" (4 B) and kernel 3 (3 B) in the backward.
    So: an input 5 B each forward and 3 B (its dim-1 cast) each backward; a weight 3 B each forward and 7 B
    each backward; an output gradient 5 + 3 = 8 B each backward.
  - the two backward GEMMs run without fast accumulation (config.py: ``gemm_config_grad_input`` and
    ``gemm_config_grad_weight`` default ``Float8GemmConfig()``, ``use_fast_accum=False``), and for rowwise
    scales without it torchao calls the tensorwise cuBLAS GEMM with unit scales and scales its output after
    (torchao/float8/float8_ops.py ``addmm_float8_unwrapped``: "The rowwise CUTLASS-based kernel is so slow
    without fast-accum that we'd rather use the tensorwise cuBLAS-based kernel and do the scaling manually
    afterwards", ``output *= post_inverse_scale``; "at least one extra triton kernel *per GEMM* ... just for the
    rescaling", pytorch/ao issue 2184): the bf16 input and weight gradients read and written once more, 4 B
    an element (``rescale``).
  - under async TP (torch's micro-pipeline TP, torchtitan's ``enable_async_tensor_parallel``) only the
    matmul-reduce-scatters fuse with rowwise-scaled GEMMs; the all-gather-matmuls do not, so each all-gather (the
    input's forward, the output gradient's backward) runs whole before its GEMM, as under vanilla TP
    (``async_tp_fuses=("reduce-scatter",)``): pytorch/pytorch issue 149990, "[Async TP] all-gather-matmuls not
    fusing properly when rowwise scales are used" (2025-03-25, open in the stored copy): "the matmul-reduce-scatters
    were being fused properly ... however, the all-gather-matmul patterns were NOT being fused properly" (after
    pytorch/pytorch PR 149247 added rowwise scales to the matmul-reduce-scatter fusion); torchtitan's 2025-06 table,
    run on torch 38410cf9, shows async TP's gain with rowwise at 1.04 / 1.06 against 1.09-1.16 for bf16 and
    tensorwise. No fix between the issue and that table was found.
  - not modelled: the forward GEMM's rowwise-scaled CUTLASS kernel (``_scaled_mm`` with fast accumulation)
    against cuBLAS's tensorwise one ("Most shapes are within 90-100% of tensor-wise efficiency, but there's a
    long tail going down to 50%", pytorch/pytorch issue 147971: no figure per shape), timed as tensorwise's.
* Transformer Engine (NVIDIA/TransformerEngine at d0067d0da6cb01811b8072a7d304f0e00344ce2b):
  - a Linear's input is quantized once in the forward with both usages (module/linear.py and
    module/layernorm_linear.py ``_forward``: ``input_quantizer.set_usage(rowwise=True,
    columnwise=backward_needs_input)``): the rowwise copy and the column-wise (transposed on Hopper) copy the
    weight-gradient GEMM reads are both written then and saved; the backward transposes nothing.
  - the weight is quantized only on the step's first micro-batch and cached (layernorm_linear.py ``_forward``:
    ``update_ws = is_first_microbatch is None or is_first_microbatch``, ``quantize_weight(...,
    update_workspace=update_ws)``; Megatron-Core sets is_first_microbatch at each step's first micro-batch):
    once a step, both usages.
  - current scaling (``Float8CurrentScalingQuantizer``; csrc/quantizer.cpp ``quantize_impl``:
    ``nvte_compute_amax`` then ``nvte_quantize_v2``): amax (read 2) + cast (read 2, write 1 + 1) = 6 B; an
    input a norm produces (LayerNormLinear: q/k/v, a dense MLP's up projection) has its amax computed inside
    the norm kernel (csrc/extensions/normalization.cpp ``norm_fwd``: ``Impl::FUSED_NORM_AMAX_FP8``, then
    ``quantize_with_amax``): read 2, write 1 + 1 = 4 B.
  - delayed scaling (``Float8Quantizer``, the scale from the amax history; the amax recorded by the cast
    itself): cast and transpose in one pass, read 2, write 1 + 1 = 4 B; a norm-produced input is quantized by
    the norm kernel itself (normalization.cpp: ``Impl::FULLY_FUSED`` for Float8 quantizers): the norm writes
    its 1-byte output in place of its bf16 one (-1 B), the transposed copy assumed a separate pass (read 1,
    write 1): 1 B.
  - MXFP8 block scaling (``MXFP8Quantizer``: 32-element blocks, an E8M0 scale each, no amax pass): read 2,
    write 1 + 1 and the scales (2 / 32) = 4.0625 B; the norm is not fused with it by default
    (normalization.cpp: FULLY_FUSED only under NVTE_NORM_FWD_USE_CUDNN with 128 x 128 tiles; otherwise
    ``Impl::UNFUSED``: the norm's bf16 output quantized after).
  - the output gradient: both usages in one pass (dgrad reads it rowwise, wgrad column-wise): current
    scaling 6 B, delayed 4 B, MXFP8 4.0625 B.
  - under tensor parallelism with sequence parallelism (``tp_gather=1``, ``tp_input``, ``tp_grad``,
    ``tp_transpose``), delayed and current scaling gather float8, as torchao's tensorwise parallel styles do, but
    make the transposed copies after the gathers: a column-parallel LayerNormLinear (q/k/v, fc1) quantizes the norm's
    output on the rank's T / tp tokens, rowwise only ("All-gather is not supported with FP8 column-wise data":
    ``input_quantizer.supports_only_rowwise_all_gather()``, true for Float8Quantizer and
    Float8CurrentScalingQuantizer, tensor/float8_tensor.py lines 190-194 and 396-400; module/layernorm_linear.py
    lines 230-232), and all-gathers it in float8 (lines 282-315, ``gather_along_first_dim(ln_out, tp_group,
    quantizer=quantizer)``); it saves the shard (lines 472-485) and in the backward gathers it again in float8
    (lines 766-795) and makes the column-wise copy of the gathered tensor (lines 989-993, ``update_usage(
    columnwise_usage=True)``; module/_common.py lines 47-49: "Per-tensor FP8 gathers rowwise data and synthesizes
    its transpose"). A row-parallel module's output gradient arrives sequence-sharded: it is quantized on the
    shard and gathered in float8 (module/base.py ``grad_output_preprocess`` lines 1719-1751; distributed.py
    ``_all_gather_fp8`` lines 1011-1030: rowwise only, then ``_create_transpose()`` on the gathered tensor, lines
    1070-1077). So on the shard: delayed scaling's norm writes 1 B in place of 2 (``tp_input`` -1), current
    scaling's quantize reads the norm's 2 B output and writes 1 B (3 B: the amax from the norm kernel); the
    gradient delayed 3 B (read 2, write 1), current 5 B (amax 2 and 2 + 1); and each backward, on all the tokens,
    a transposed copy of the gathered input and of the gathered gradient (read 1, write 1: ``tp_transpose`` 2).
    The all-gathers move 1 B an element (``tp_gather``), the reduce-scatters bf16. MXFP8 (which gathers its
    column-wise data itself, ``_all_gather_mxfp8``) is left as before: no ``tp_gather`` (its rows run on
    Blackwell, whose tensor cores need no transposed copy).
  The memory a search solves a float8 row with is what each declares (``memory``): torchao tensorwise's is
  the measured profile's ``float8="tensorwise"`` (measured/float8.py, torchao's Float8Linear measured);
  Transformer Engine's is not modelled (None: the 16-bit run's memory, said in a note).
  Every declaration is per linear module, as torchao converts them (each nn.Linear a Float8Linear whose
  ``matmul_with_hp_or_float8_args.forward`` casts its own ``input_hp`` and saves the bf16 input for the backward's
  casts; torchao/float8/float8_linear.py at 6243040): a GEMM the model runs as several modules reading one input
  (``details["separate_projections"]``: torchtitan's wq, wk, wv and w1, w3; steptime.model_figures' ``linears``)
  pays the input's casts, its backward's copies of it and its gradient's rescale once per module. The wk and wv
  of a grouped-query model read the same M x K input as wq for a tenth of its FLOPs: pytorch/torchtitan issue 1207
  ("float8 rowwise vanilla TP low throughput", closed by torchtitan PR 1319) found "attention.wk and attention.wv
  layers were so small that float8 rowwise conversion resulted in significant slowdown (approx 40%) for those
  layers", and pytorch/ao PR 2410's ``_auto_filter_for_recipe`` now leaves such linears in bf16 (rowwise: any
  with N <= 2048). Not modelled: a compiler's deduplication of identical casts across the modules. Under float8
  tensor parallelism the gathered input is cast once for all its modules (below).
  Not timed: current scaling's amax all-reduce over the tensor-parallel group under sequence parallelism
  (``set_quantizer_amax_reduction_group``: one scalar per quantized tensor, latency only); on Blackwell a
  tensorwise float8 GEMM needs no transposed copy (its column-wise write is counted all the same).
* torchao's float8 tensor parallelism (``Float8Casts.tp_gather``; torchao/float8/float8_tensor_parallel.py at
  6243040): ``PrepareFloat8ModuleInput._prepare_input_arg`` (lines 218-241) casts the attention's and the
  feed-forward's input to float8 (``hp_tensor_to_float8_dynamic``) on the rank's sequence shard and only then
  redistributes it Shard(1) -> Replicate, "so that if there are multiple float8 users of the input activation, we
  perform fp8 allgather only once" (lines 175-179); each ``Float8ColwiseParallel`` module (wq, wk, wv, w1, w3) finds
  its input ``tensor_already_casted_to_fp8`` (lines 59-65), and so does ``Float8Linear``'s forward
  (float8_linear.py lines 82-83), which saves that float8 input for its backward (line 76) and uses it there as it
  is (lines 225-227; transposed per module, as before). ``Float8RowwiseParallel._prepare_output_fn`` (lines
  137-153: wo, w2) reduce-scatters the bf16 output, then ``NoopFwToFloat8BwDynamic`` casts its gradient on the
  rank's shard, before the backward's all-gather. So under sequence parallelism: the gathered input cast once on
  T / tp tokens (not once per module on T), the row-parallel GEMM's output gradient cast on T / tp tokens, and both
  all-gathers (forward: the input; backward: the output gradient) move 1 byte an element; the reduce-scatters move
  bf16. torchtitan applies these styles whenever float8 is on and (820504e) the recipe is not rowwise:
  torchtitan/parallelisms/parallelize_llama.py at 9dec370 lines 148-162 (``enable_float8``: Float8RowwiseParallel,
  Float8ColwiseParallel, PrepareFloat8ModuleInput) and 174-193 (the plan); torchtitan/models/llama3/
  parallelize_llama.py at 820504e lines 56-65: "For now, float8 all-gather with TP is only supported for
  tensorwise float8 scaling recipes. For rowwise recipes, we use regular TP and all-gather happens in high
  precision" (``enable_float8_tensorwise_tp``); float8_tensor_parallel.py's classes "currently assume tensorwise
  scaling". So ``TORCHAO_TENSORWISE`` declares ``tp_gather=1``, ``TORCHAO_ROWWISE`` none (bf16 gathers, each module
  casting). Not timed: the cast's amax all-reduce over the tensor-parallel group (one scalar, latency only).
"""

from __future__ import annotations

from mlsysim_core.errors import InvalidInputTypeError
from mlsysim_plugins.steptime_hookspecs import Float8Casts

# model_figures' GEMMs (q/k/v, output projection, MLP up (+gate), MLP down): the ones whose input a norm
# produces, when not routed (a routed GEMM reads the dispatched tokens)
NORMED_GEMMS = (0, 2)


TORCHAO_TENSORWISE = Float8Casts(name="torchao-tensorwise", input=5, normed_input=5, weight=5,
                                 weight_per="micro-batch", grad=5, transpose=2, tp_gather=1, memory="tensorwise",
                                 source="torchao Float8Linear, tensorwise dynamic scaling; under tensor parallelism "
                                        "torchao's float8 parallel styles (float8_tensor_parallel.py at 6243040), as "
                                        "torchtitan applies them")
TORCHAO_ROWWISE = Float8Casts(name="torchao-rowwise", input=5, normed_input=5, weight=3, weight_per="micro-batch",
                              grad=8, transpose=3, transpose_weight=7, rescale=4, async_tp_fuses=("reduce-scatter",),
                              memory="rowwise",
                              source="torchao Float8Linear, rowwise (axiswise) dynamic scaling (pytorch/ao 6243040: "
                                     "torchao/testing/float8/roofline_utils.py's rowwise casts; float8_ops.py's "
                                     "rescaled backward GEMMs); under async TP only the matmul-reduce-scatters fuse "
                                     "(pytorch/pytorch issue 149990)")
TE_CURRENT_SCALING = Float8Casts(name="te-current-scaling", input=6, normed_input=4, weight=6, weight_per="step",
                                 grad=6, transpose=0, tp_gather=1, tp_input=3, tp_grad=5, tp_transpose=2,
                                 source="Transformer Engine Float8CurrentScalingQuantizer (d0067d0); under sequence "
                                        "parallelism its float8 all-gathers (layernorm_linear.py, distributed.py)")
TE_DELAYED_SCALING = Float8Casts(name="te-delayed-scaling", input=4, normed_input=1, weight=4, weight_per="step",
                                 grad=4, transpose=0, tp_gather=1, tp_input=-1, tp_grad=3, tp_transpose=2,
                                 source="Transformer Engine Float8Quantizer (d0067d0); under sequence parallelism its "
                                        "float8 all-gathers (layernorm_linear.py, distributed.py)")
TE_MXFP8 = Float8Casts(name="te-mxfp8", input=4 + 2 / 32, normed_input=4 + 2 / 32, weight=4 + 2 / 32,
                       weight_per="step", grad=4 + 2 / 32, transpose=0,
                       source="Transformer Engine MXFP8Quantizer (d0067d0)")


BUILTIN = (TORCHAO_TENSORWISE, TORCHAO_ROWWISE, TE_CURRENT_SCALING, TE_DELAYED_SCALING, TE_MXFP8)   # what the plugin registers


def casts_of(float8) -> Float8Casts:
    """The declaration a run's ``float8`` gives: a Float8Casts itself, or True (or False, for the
    16-bit run's GEMMs, which read none): torchao tensorwise, the default implementation."""
    if isinstance(float8, Float8Casts):
        return float8
    if isinstance(float8, bool):
        return TORCHAO_TENSORWISE
    raise InvalidInputTypeError("float8", float8, "True (torchao tensorwise), False or a Float8Casts (a registered "
                                "float8 implementation, steptime_hookspecs.Float8Casts)")
