"""Inverse solves, checked against brute force and hand derivations."""

import pytest

from mlsysim_core import HardwareNode, InvalidInputError, TransformerWorkload, inverse

P = 1_000_000_000
MODEL = TransformerWorkload(name="round", parameters=P, layers=10, hidden_dim=1000, heads=10)
# 16 GB of model states (2+2+12 B/param) leaves 4 GB: selective activations are
# 10 x 34 x s x b x 1000 B = 340,000 x s x b B, plus a 0.1 GB gradient bucket.
GPU = HardwareNode(name="20GB", memory_capacity=20_000_000_000 + 100_000_000)


def test_largest_batch_by_hand(solver):
    a = inverse.largest_batch(MODEL, GPU, solver=solver, seq_len=1000)
    # 4e9 / (340,000 x 1000) = 11.76 -> 11
    assert a.value == 11 and a.details == {"global batch": 11}
    assert a.result.microbatch == 11 and a.limit.microbatch == 12 and not a.limit.feasible
    assert a.binding == "activations"
    assert a.headroom == GPU.memory_capacity - a.result.total_memory > 0


def test_largest_batch_matches_brute_force(solver):
    kwargs = dict(seq_len=2048, dp_size=8, zero_stage=2, gradient_accumulation_steps=2)
    a = inverse.largest_batch("llama3-8b", "h100", solver=solver, **kwargs)
    fits = [mb for mb in range(1, 64) if solver.solve("llama3-8b", "h100", mb * 16, **kwargs).feasible]
    assert a.value == max(fits) and a.details["global batch"] == max(fits) * 16
    assert a.solves < 20


def test_longest_sequence_by_hand(solver):
    a = inverse.longest_sequence(MODEL, GPU, 1, solver=solver)
    assert a.value == 11764     # 4e9 / 340,000 = 11,764.7
    b = inverse.longest_sequence(MODEL, GPU, 1, solver=solver, multiple_of=1024)
    assert b.value == 11 * 1024 and b.binding == "activations"


def test_fewest_devices(solver):
    kwargs = dict(seq_len=4096, tp_size=8, pp_size=4, zero_stage=1, gradient_accumulation_steps=8)
    a = inverse.fewest_devices("llama3-70b", "h100", 512, solver=solver, **kwargs)
    brute = min(d for d in (1, 2, 4, 8, 16, 32, 64, 128, 256)
                if solver.solve("llama3-70b", "h100", 512, dp_size=d, **kwargs).feasible)
    assert a.details["dp"] == brute and a.value == 8 * 4 * brute
    assert a.limit is not None and not a.limit.feasible and a.result.feasible
    assert "fewer devices" in a.describe()


def test_nothing_fits(solver):
    a = inverse.largest_batch("llama3-405b", "t4", solver=solver)
    assert a.value is None and a.result is None and a.binding == "optimizer_state"
    assert "nothing fits" in a.describe()


def test_searched_argument_cannot_be_given(solver):
    with pytest.raises(InvalidInputError, match="batch_size=8 .*what is searched"):
        inverse.largest_batch(MODEL, GPU, solver=solver, batch_size=8)
    with pytest.raises(InvalidInputError, match="multiple_of=0"):
        inverse.longest_sequence(MODEL, GPU, 1, solver=solver, multiple_of=0)
