"""Expert parallelism: the reference spreads ALL parameters evenly over ep ranks
(an approximation: dense weights are really replicated). Only mixture-of-experts models
can use it, and with at most one rank per expert."""

from mlsysim_core import LayoutError, ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective
from mlsysim_plugins._steptime_paired import PAIRED as STEPTIME_PAIRED, PairedSlot

from mlsysim_core.memo import memoize

from ._lazy import lazy_module

buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")

# The reference's note ends "; routing imbalance is modeled separately by MoERoutingModel.",
# a class of mlsysim that this package does not have: that clause is left out.
MOE_NOTE = "MoE memory approximation: total expert parameters are evenly sharded by expert parallelism."


def apply(plan, options):
    e, model = plan.ep_size, plan.model
    if e > 1 and not model.is_sparse:
        raise LayoutError("ep_size", e, "1 for a dense model",
                          f"{model.name!r} has no experts to distribute")
    if model.is_sparse and e > model.experts:
        raise LayoutError("ep_size", e, f"at most the model's {model.experts} experts")
    return effect(e)


@memoize
def effect(e):
    return ShardingEffect(parameter_shards=e, expert_shards=e, notes=(MOE_NOTE,) if e > 1 else ())


def all_to_all(plan, placement, options):
    """Measured grade: the experts' dispatch and combine buffers."""
    return buffers.expert_all_to_all(plan, placement)


# Declared for the step time: dispatch and combine all-to-alls of the routed tokens (tokens x
# experts per token x hidden) per layer in each forward (recomputed ones too) and two in its
# backward, on the critical path. The implementations a run may choose (the step time applies
# them only when the run says so): "batched", one micro-batch's all-to-all beside another's
# compute (Megatron's --overlap-moe-expert-parallel-comm, Megatron-Bridge's moe_a2a_overlap);
# "node-forwarded", each token sent once to each other node holding one of its experts and
# forwarded there over NVLink (DeepEP's normal kernels, "forwarding data from NVLink domain to
# RDMA domain", deepseek-ai/DeepEP README.md at 0aaa6744c890c5af051f622252975c4393795000;
# Megatron's --moe-token-dispatcher-type flex).
#
# Under sequence parallelism each tensor-parallel rank holds 1/tp of the tokens and sends only its
# own (Megatron-LM megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher:
# the EP all-to-all of the rank's permuted local tokens, then, with expert tensor parallelism,
# gather_from_sequence_parallel_region over the tensor-parallel group, a reduce-scatter before the
# combine; at bed33f89945f41ae792d7b36a0d770b00f61ed42): the all-to-all moves tokens / tp, and the
# experts, split over the tp ranks as the step time's GEMMs are, all-gather the routed tokens
# (reduce-scatter them back) inside the tp group. Without sequence parallelism every tp rank sends
# the micro-batch's tokens. That gather and reduce-scatter run over the expert tensor-parallel group
# (the dispatcher's "self.tp_group = pg_collection.expt_tp", token_dispatcher.py at
# d98e8a64ddf34856e74b24714e3bedb2f5a39553, "if self.tp_size > 1:" around both): declared over "etp", the
# tp group unless a run sets its expert tensor parallelism (expert_tp_size=1: none).
_A2A = dict(kind="all-to-all", volume="routed", group="ep", per="layer", forward=2, backward=2,
            implementations=("batched", "node-forwarded"))
COLLECTIVES = (Collective(**_A2A, sequence_parallel=False),
               Collective(**_A2A, sequence_parallel=True, shard="tp"),
               Collective(kind="all-gather", volume="routed", group="etp", per="layer", forward=1, backward=1,
                          sequence_parallel=True, implementations=("batched",)),
               Collective(kind="reduce-scatter", volume="routed", group="etp", per="layer", forward=1, backward=1,
                          sequence_parallel=True, implementations=("batched",)))


# How the "batched" implementation pairs them (steptime.PairedSlot): Megatron-Core's combined 1F1B
# (--overlap-moe-expert-parallel-comm; Megatron-Bridge's overlap_moe_expert_parallel_comm), one micro-batch's
# forward of a layer beside another's backward of a layer in three phases (NVIDIA/Megatron-LM
# megatron/core/models/common/model_chunk_schedule_plan.py TransformerLayerSchedulePlan.run, at
# d98e8a64ddf34856e74b24714e3bedb2f5a39553: "comm_stream: combine_bwd | dispatch_fwd->dispatch_bwd |
# combine_fwd", "comp_stream: pre_dispatch_fwd | mlp_bwd->mlp_bwd_dw->mlp_fwd | pre_dispatch_bwd"): the backward's
# combine beside the forward's attention block, the forward's and the backward's dispatch beside the routed
# GEMMs' backward (weight gradients included: delay_wgrad_compute runs mlp.backward_dw there) and forward, the
# forward's combine beside the backward's attention block. Each pass has two calls (dispatch, combine): half a
# pass's calls per phase. (Every micro-batch timed as paired: the schedule's unpaired first forward and last
# backward, and a pipeline's warm-up and cool-down, are not modelled.)
PAIRED = (PairedSlot(compute="attention-block-forward", backward=0.5),
          PairedSlot(compute="mlp-block", forward=0.5, backward=0.5),
          PairedSlot(compute="attention-block-backward", forward=0.5))


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="ep", axis="ep", apply=apply, extensions={"measured.buffer_terms": all_to_all,
                                                                           STEPTIME_COLLECTIVES: COLLECTIVES,
                                                                           STEPTIME_PAIRED: PAIRED},
                             description="parameters / ep (mixture-of-experts models only)")]
