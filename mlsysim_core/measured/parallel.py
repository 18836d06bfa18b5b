"""Parallel layouts, rank by rank (measured grade).

A parallel layout's ranks are not alike: the first pipeline stage holds the embedding and
the most micro-batches in flight, the last one the LM head and the loss. This module
checks the layout options, names the distinct rank classes and solves each one.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .. import _checks
from ..errors import InvalidInputError, InvalidInputTypeError, LayoutError

SCHEDULES = ("1f1b", "gpipe", "interleaved-1f1b", "zb-h1", "zb-h2")
OFFLOADABLE = ("optimizer", "gradients", "parameters")
OFFLOAD_TARGETS = ("cpu", "nvme")


def layout_options(plan, pipeline_schedule, virtual_stages, expert_tp_size, stage_layers, offload):
    """The parallel-layout options of a measured-grade solve, checked and with defaults."""
    schedule = "1f1b" if pipeline_schedule is None else _checks.name("pipeline_schedule", pipeline_schedule,
                                                                     SCHEDULES)
    v = 1 if virtual_stages is None else _checks.count("virtual_stages", virtual_stages)
    if v > 1 and schedule != "interleaved-1f1b":
        raise InvalidInputError("virtual_stages", virtual_stages, "1 unless pipeline_schedule='interleaved-1f1b'",
                                f"pipeline_schedule={schedule!r}")
    if schedule == "interleaved-1f1b" and virtual_stages is None:
        v = 2
    etp = plan.tp_size if expert_tp_size is None else _checks.count("expert_tp_size", expert_tp_size)
    if expert_tp_size is not None and not plan.model.is_sparse and etp != 1:
        raise LayoutError("expert_tp_size", expert_tp_size, "unset or 1 for a dense model",
                          f"{plan.model.name!r} has no experts")
    if plan.model.is_sparse:
        group = plan.tp_size * plan.dp_size * plan.cp_size
        if group % (etp * plan.ep_size):
            raise LayoutError("expert_tp_size", etp,
                              f"a value with expert_tp_size x ep_size dividing tp x cp x dp = {group}",
                              f"ep_size={plan.ep_size}: the experts' ranks are carved out of the same devices")
    layers = None
    if stage_layers is not None:
        if isinstance(stage_layers, (str, bytes)) or not hasattr(stage_layers, "__iter__"):
            raise InvalidInputTypeError("stage_layers", stage_layers, "a sequence of layer counts, one per stage")
        layers = tuple(_checks.count(f"stage_layers[{i}]", n, minimum=0) for i, n in enumerate(stage_layers))
        if len(layers) != plan.pp_size or sum(layers) != plan.model.layers:
            raise LayoutError("stage_layers", list(layers),
                              f"{plan.pp_size} counts (one per pipeline stage) adding up to the model's "
                              f"{plan.model.layers} layers")
    elif plan.model.layers < plan.pp_size * v:
        raise LayoutError("pp_size", plan.pp_size, f"at most {plan.model.layers // v} stages",
                          f"{plan.model.layers} layers in {v} chunk(s) per stage")
    return attrs.evolve(plan, pipeline_schedule=schedule, virtual_stages=v, expert_tp_size=etp,
                        stage_layers=layers, offload=_offload(offload))


def _offload(value) -> tuple[tuple[str, str], ...]:
    if value is None or value is False:
        return ()
    if isinstance(value, str):
        value = [part.strip() for part in value.split("+") if part.strip()]
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif hasattr(value, "__iter__"):
        pairs = [(name, "cpu") for name in value]
    else:
        raise InvalidInputTypeError("offload", value,
                                    "'optimizer', 'optimizer+gradients', a list of names or {name: 'cpu'|'nvme'}")
    out = {}
    for name, target in pairs:
        what = _checks.name("offload", name, OFFLOADABLE)
        out[what] = _checks.name(f"offload[{what!r}]", target, OFFLOAD_TARGETS)
    return tuple(sorted(out.items(), key=lambda kv: OFFLOADABLE.index(kv[0])))


def is_parallel(plan) -> bool:
    return False


def solve_ranks(plan, run):
    raise NotImplementedError
