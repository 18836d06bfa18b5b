"""Pipeline schedules: how many micro-batches of activations each stage holds at its peak.

A schedule is registered through ``mlsysim_measured_pipeline_schedules`` and selected by
name (``pipeline_schedule=``). Its ``in_flight(p, stage, m, v)`` is the stage's peak in
units of its whole layer stack (an interleaved schedule holds fractions of it), for ``p``
stages, ``m`` micro-batches per iteration and ``v`` model chunks per rank. Its
``idle_slots(p, m, v)`` is its bubble in units of one micro-batch's forward and backward on a
stage, what the planner's step time adds (None: the planner uses 1F1B's p - 1, and says so).
"""

from __future__ import annotations

from typing import Callable

import attrs

from mlsysim_core import hookimpl


@attrs.frozen(kw_only=True, cache_hash=True)     # (memo keys hash it: once per object)
class PipelineSchedule:
    """``virtual_stages``: the default number of model chunks per rank; ``chunked``: the
    schedule takes more than one (``virtual_stages=`` is refused otherwise)."""

    name: str
    description: str
    in_flight: Callable[[int, int, int, int], float]
    virtual_stages: int = 1
    chunked: bool = False
    idle_slots: Callable[[int, int, int], float] | None = None


def _gpipe(p, stage, m, v):
    return m                         # every forward before the first backward


def _one_f_one_b(p, stage, m, v):
    return min(p - stage, m)         # PipeDream-Flush / Megatron: warm-up of p - stage forwards


def _zb_h2(p, stage, m, v):
    return min(2 * (p - stage) - 1, m)     # twice 1F1B's peak for the bubble it removes


def _interleaved(p, stage, m, v):
    """Megatron-Core's warm-up: 2(p - stage - 1) + (v - 1)p + 1 chunk forwards before the
    first backward, each a v-th of the stage's layers: stage 0 holds p(1 + (p-1)/(pv))
    micro-batches' worth (Korthikanti et al. 2022, §4.2.3)."""
    chunks = 2 * (p - stage - 1) + (v - 1) * p + 1
    return min(chunks, m * v) / v


# The bubbles, in micro-batch slots: GPipe and 1F1B idle p - 1 slots (Narayanan et al. 2021,
# "Efficient Large-Scale Language Model Training on GPU Clusters", §2.2.1: bubble time
# fraction (p - 1) / m); the interleaved schedule divides it by v (§2.2.2: (p - 1) / (v m));
# zero bubble H1 idles (p - 1)(T_F + T_B - T_W) against 1F1B's (p - 1)(T_F + T_B + T_W): with
# T_F = T_B = T_W a third, (p - 1) / 3 slots; H2 fills the bubble with the deferred
# weight-gradient work (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", arXiv 2401.10241, §3).
def _p_minus_1(p, m, v):
    return p - 1


SCHEDULES = {s.name: s for s in (
    PipelineSchedule(name="1f1b", description="one forward, one backward (PipeDream-Flush, Megatron)",
                     in_flight=_one_f_one_b, idle_slots=_p_minus_1),
    PipelineSchedule(name="gpipe", description="all forwards, then all backwards (GPipe)", in_flight=_gpipe,
                     idle_slots=_p_minus_1),
    PipelineSchedule(name="interleaved-1f1b", description="1F1B over v model chunks per rank (Megatron-Core)",
                     in_flight=_interleaved, virtual_stages=2, chunked=True, idle_slots=lambda p, m, v: (p - 1) / v),
    PipelineSchedule(name="zb-h1", description="zero bubble H1 (Qi et al. 2023): 1F1B's memory",
                     in_flight=_one_f_one_b, idle_slots=lambda p, m, v: (p - 1) / 3),
    PipelineSchedule(name="zb-h2", description="zero bubble H2 (Qi et al. 2023): 2(p - stage) - 1 in flight",
                     in_flight=_zb_h2, idle_slots=lambda p, m, v: 0.0),
)}


@hookimpl
def mlsysim_measured_pipeline_schedules():
    return list(SCHEDULES.values())
