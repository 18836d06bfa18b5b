"""The EP rule's declared pairing of its overlapped all-to-alls (steptime.PairedSlot; Megatron's combined 1F1B), as
``steptime._per_layer`` times it: each slot's calls hidden behind its own compute. Seconds by hand."""

import pytest

from mlsysim_plugins import expert_parallel, steptime
from mlsysim_plugins.steptime_hookspecs import Collective
from mlsysim_plugins.steptime import PairedSlot

A2A = (Collective(kind="all-to-all", volume="routed", group="ep", per="layer", forward=2, backward=2,
                  implementations=("batched",)),)
COMPUTE = {"attention-block-forward": 0.5, "mlp-block": 3.0, "attention-block-backward": 0.2, "layer": 10.0}


@pytest.fixture
def one_second_calls(monkeypatch):
    monkeypatch.setattr(steptime, "_seconds", lambda c, size, dispatch=None: 1.0)
    monkeypatch.setattr(steptime, "_applies", lambda c, size: True)
    return dict(cal=steptime.DEFAULT)


def test_the_ep_rule_declares_megatrons_three_phases():
    # combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd: half of each pass's two calls per phase
    assert expert_parallel.PAIRED == (PairedSlot(compute="attention-block-forward", backward=0.5),
                                      PairedSlot(compute="mlp-block", forward=0.5, backward=0.5),
                                      PairedSlot(compute="attention-block-backward", forward=0.5))


def test_each_slot_hidden_behind_its_own_compute(one_second_calls):
    s = steptime.DEFAULT.overlap_sm_share
    paired = steptime._per_layer(A2A, 3, 0.0, COMPUTE, one_second_calls, "batched", None, expert_parallel.PAIRED)
    # 1 s beside 0.5 s, 2 s beside 3 s, 1 s beside 0.2 s: what outlasts each, plus the SMs' share while overlapping
    assert paired == pytest.approx(3 * ((0.5 + s * 0.5) + (s * 2.0) + (0.8 + s * 0.2)))
    pooled = steptime._per_layer(A2A, 3, 0.0, COMPUTE, one_second_calls, "batched", None, None)
    assert pooled == pytest.approx(3 * s * 4.0)       # (undeclared: the four calls behind the whole layer)


def test_not_overlapped_runs_on_the_critical_path(one_second_calls):
    assert steptime._per_layer(A2A, 3, 0.0, COMPUTE, one_second_calls, None, None, expert_parallel.PAIRED) == 12.0


def test_the_declaration_reaches_the_step_time():
    axes, _ = steptime.declarations()
    assert axes["ep.paired"] == expert_parallel.PAIRED
