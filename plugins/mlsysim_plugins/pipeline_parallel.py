"""Pipeline parallelism: parameters split evenly over pp stages, ceil(layers/pp) layers on
a stage, and one send plus one receive buffer of a boundary activation (2*b*s*h values).

Its option ``stages`` (``PipelineOptions``) declares, for the step time only, how the layers are
split: ``"even"`` (the default) or ``"ends-one-fewer"`` (the first and last stages one layer fewer,
so the embedding and the LM head do not load them: the Llama 3 paper's pipeline, section 3.3.2);
its option ``p2p`` how the sends run: ``"blocking"`` (the default) or ``"overlapped"`` (each
beside one model chunk's compute).
The memory is the same either way: every stage's ceil(layers/pp) layers (on the end stages one
more than they hold under ``"ends-one-fewer"``)."""

import math

import attrs

from mlsysim_core import (BACKWARD, COMMUNICATION_BUFFERS, FORWARD, LayoutError, MemoryTerm,
                          ShardingEffect, ShardingRuleSpec, hookimpl)
from mlsysim_plugins.steptime_hookspecs import (COLLECTIVES as STEPTIME_COLLECTIVES, STAGE_SPLITS,
                                                 STAGES as STEPTIME_STAGES, Collective)

from mlsysim_core.memo import memoize


@memoize
def effect(p, layers, mb, s, h, b, note):
    buffers = ()
    if p > 1:
        buffers = (MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="pipeline send + receive buffers",
            nbytes=2 * mb * s * h * b, phases=(FORWARD, BACKWARD),
            formula=f"2 x b={mb} x s={s} x h={h} x {b} B{note}"),)
    return ShardingEffect(parameter_shards=p, pipeline_stages=p, layers_per_stage=max(1, math.ceil(layers / p)),
                          buffer_terms=buffers)


def apply(plan, options):
    p, layers = plan.pp_size, plan.model.layers
    if p > layers:
        raise LayoutError("pp_size", p, f"at most the model's {layers} layers",
                          f"a pipeline stage needs at least one layer of {plan.model.name!r}")
    if p == 1:   # the boundary buffers do not exist: the effect depends on the layer count only
        return effect(1, layers, 0, 0, 0, 0, "")
    return effect(p, layers, plan.microbatch, plan.seq_len, plan.hidden_dim, plan.bytes_per_value,
                  plan.hidden_dim_note)


# Declared for the step time: the stage boundary's activation sent forward and its gradient sent
# back, per micro-batch (and model chunk), on the critical path.
COLLECTIVES = (Collective(kind="send-recv", volume="activations", group="pp", per="micro-batch", forward=1,
                          backward=1),)
# The option p2p="overlapped": each send and receive posted asynchronously and waited for only before the next
# chunk that needs it, so that it runs beside one chunk's compute: Megatron-Core's interleaved schedule with
# overlap_p2p_comm (megatron/core/pipeline_parallel/schedules.py at NVIDIA/Megatron-LM
# 000c4ac24f61159c138b0975def722c65245983c, forward_backward_pipelining_with_interleaving: pp_post_forward posts
# send_forward_recv_forward(..., overlap_p2p_comm=True) after a chunk's forward and pp_pre_forward waits for its
# recv_prev handle before the next forward, the backward chunk of the same 1F1B step running between them;
# pp_post_backward / pp_pre_backward the same for the gradients, beside the next forward chunk). The activation's
# send hides behind one chunk's backward, the gradient's behind one chunk's forward.
OVERLAPPED = (Collective(kind="send-recv", volume="activations", group="pp", per="micro-batch", forward=1,
                         overlaps="backward"),
              Collective(kind="send-recv", volume="activations", group="pp", per="micro-batch", backward=1,
                         overlaps="forward"))
P2P = ("blocking", "overlapped")


@attrs.frozen(kw_only=True)
class PipelineOptions:
    """``stages``: how the step time splits the layers over the stages: ``"even"`` (ceil(L/pp) a
    stage, the LM head beside the last stage's) or ``"ends-one-fewer"`` (the first and last stages
    one layer fewer than the others, ceil((L + 2)/pp): "To balance the pipeline, we reduce one
    Transformer layer each from the first and the last stages, respectively", The Llama 3 Herd of
    Models, arXiv 2407.21783, section 3.3.2). ``p2p``: how the stages' sends run, ``"blocking"``
    (each on the critical path) or ``"overlapped"`` (posted asynchronously, each beside one model
    chunk's compute: Megatron's ``overlap_p2p_comm``, its default under the interleaved schedule; the
    Llama 3 paper's "asynchronous point-to-point communication in PP", section 3.3.2). The memory is
    the same either way."""

    stages: str = attrs.field(default="even", validator=attrs.validators.in_(STAGE_SPLITS))
    p2p: str = attrs.field(default="blocking", validator=attrs.validators.in_(P2P))


def stage_split(options):
    return "even" if options is None else options.stages


def sends(options):
    """The sends the step time times under the run's ``p2p``: ``"blocking"`` (the default: each on the critical
    path) or ``"overlapped"`` (each beside one model chunk's compute, ``OVERLAPPED``)."""
    return OVERLAPPED if options is not None and options.p2p == "overlapped" else COLLECTIVES


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(name="pp", axis="pp", apply=apply, options_type=PipelineOptions,
                             extensions={STEPTIME_COLLECTIVES: sends, STEPTIME_STAGES: stage_split},
                             description="parameters / pp; ceil(layers/pp) layers per stage; p2p buffers")]
