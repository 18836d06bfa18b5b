"""Hand-derived numbers for every built-in plugin.

A round synthetic model keeps the arithmetic checkable by eye: P = 1e9 parameters,
10 layers, hidden 1000, 10 heads; global batch 4, sequence 100, fp16 (2 B).
"""

import pytest

from mlsysim_core import (ACTIVATIONS, BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, FORWARD, OPTIMIZER_STEP,
                          HardwareNode, SparseTransformerWorkload, TransformerWorkload)

P = 1_000_000_000
MODEL = TransformerWorkload(name="round", parameters=P, layers=10, hidden_dim=1000, heads=10)
MOE = SparseTransformerWorkload(name="round-moe", parameters=P, active_parameters=P // 4, layers=10,
                                hidden_dim=1000, heads=10, experts=8, active_experts_per_token=2)
GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30)


def solve(solver, model=MODEL, **kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("seq_len", 100)
    return solver.solve(model, GPU, **kw)


def only_term(result, component):
    (term,) = result.terms_of(component)
    return term


def test_model_states_fp16(solver):
    r = solve(solver)
    assert r.weights == 2 * P and r.gradients == 2 * P
    w = only_term(r, "weights")
    assert w.source == "model_states" and "1,000,000,000 params/rank x 2 B" in w.formula
    assert only_term(r, "gradients").phases == (BACKWARD, BACKWARD_END, OPTIMIZER_STEP)


@pytest.mark.parametrize("precision,bpp", [("fp32", 4), ("tf32", 4), ("BF16", 2), ("fp8", 1),
                                           ("int8", 1), ("int4", 0.5)])
def test_precision_bytes(solver, precision, bpp):
    r = solve(solver, precision=precision)
    assert r.weights == P * bpp
    assert r.precision == precision.lower()


def test_trainable_fraction_spares_weights(solver):
    r = solve(solver, trainable_fraction=0.5)
    assert r.weights == 2 * P
    assert r.gradients == P            # 0.5 P trainable x 2 B
    assert r.optimizer_state == 6 * P  # 0.5 P x 12 B


@pytest.mark.parametrize("optimizer,per_param,source", [
    ("adam", 12, "adam"), ("AdamW", 12, "adamw"), ("sgd", 4, "sgd")])
def test_optimizers(solver, optimizer, per_param, source):
    r = solve(solver, optimizer=optimizer)
    assert r.optimizer_state == per_param * P
    assert only_term(r, "optimizer_state").source == source


def test_no_optimizer_has_no_state_term(solver):
    r = solve(solver, optimizer="none")
    assert r.optimizer_state == 0 and r.terms_of("optimizer_state") == ()


@pytest.mark.parametrize("strategy,expected,source", [
    ("selective", 10 * 34 * 100 * 4 * 1000, "selective_checkpointing"),                        # 136 MB
    ("full", 10 * 2 * 100 * 4 * 1000, "full_checkpointing"),                                   # 8 MB
    ("none", 10 * (34 * 100 * 4 * 1000 + 5 * 10 * 100 * 100 * 4), "no_checkpointing"),        # 156 MB
])
def test_checkpointing(solver, strategy, expected, source):
    r = solve(solver, activation_checkpointing=strategy)
    assert r.activations == expected
    term = only_term(r, ACTIVATIONS)
    assert term.source == source and term.phases == (FORWARD, BACKWARD)


def test_activations_scale_with_precision(solver):
    assert solve(solver, precision="fp32").activations == 2 * solve(solver).activations


def test_microbatch_rounds_up(solver):
    # Spec §6.4: B=10, dp=2, gas=4 -> ceil(10/8) = 2
    r = solve(solver, batch_size=10, dp_size=2, gradient_accumulation_steps=4)
    assert r.microbatch == 2
    assert r.activations == 10 * 34 * 100 * 2 * 1000
    assert solve(solver, batch_size=1, dp_size=8).microbatch == 1   # clamped to >= 1


def test_tensor_parallel_with_and_without_sequence_parallel(solver):
    r = solve(solver, tp_size=2)
    assert r.weights == P and r.activations == 136_000_000 / 2
    r = solve(solver, tp_size=2, sequence_parallel=False)
    assert r.weights == P and r.activations == 136_000_000


def test_pipeline_parallel(solver):
    r = solve(solver, pp_size=2)
    assert r.weights == P
    assert r.layers_per_stage == 5 and r.activations == 5 * 34 * 100 * 4 * 1000
    (bucket, p2p) = r.terms_of(COMMUNICATION_BUFFERS)
    assert p2p.source == "pipeline_parallel" and p2p.nbytes == 2 * 4 * 100 * 1000 * 2
    assert bucket.nbytes == pytest.approx(0.05 * P)
    r = solve(solver, pp_size=3)
    assert r.layers_per_stage == 4                    # ceil(10 / 3)
    assert r.weights == pytest.approx(2 * P / 3, rel=1e-15)   # fractional, as the reference


def test_expert_parallel(solver):
    r = solve(solver, model=MOE, ep_size=4)
    assert r.weights == 2 * P / 4
    assert "MoE memory approximation" in r.constraint_trace[-1]


@pytest.mark.parametrize("stage,weights,gradients,optimizer", [
    (0, 2 * P, 2 * P, 12 * P), (1, 2 * P, 2 * P, 3 * P), (2, 2 * P, P / 2, 3 * P),
    (3, P / 2, P / 2, 3 * P)])
def test_zero_stages(solver, stage, weights, gradients, optimizer):
    # ZeRO paper Table 1 with N_d = 4: 2+2+12, 2+2+12/4, 2+(2+12)/4, (2+2+12)/4 bytes/param
    r = solve(solver, dp_size=4, zero_stage=stage)
    assert (r.weights, r.gradients, r.optimizer_state) == (weights, gradients, optimizer)
    assert r.selected["dp_rule"] == f"zero{stage}"
    assert any(f"ZeRO-{stage}" in line for line in r.constraint_trace) == (stage > 0)


def test_zero_paper_worked_example(solver):
    """Rajbhandari et al. 2020, Fig. 1: 7.5B params, N_d = 64 -> 120, 31.4, 16.6, 1.9 GB."""
    model = TransformerWorkload(name="7.5B", parameters=7_500_000_000, layers=1, hidden_dim=1, heads=1)
    got = [solver.solve(model, GPU, 64, 1, dp_size=64, zero_stage=z, communication_buffer_fraction=0.0)
           for z in range(4)]
    states = [(r.weights + r.gradients + r.optimizer_state) / 1e9 for r in got]
    assert [round(s, 1) for s in states] == [120.0, 31.4, 16.6, 1.9]


def test_gradient_bucket_follows_sharded_gradients(solver):
    r = solve(solver, dp_size=4, zero_stage=2, communication_buffer_fraction=0.1)
    assert r.communication_buffers == pytest.approx(0.1 * P / 2)
    assert only_term(r, COMMUNICATION_BUFFERS).phases == (BACKWARD, BACKWARD_END)


def test_terms_sum_to_components_and_total(solver):
    r = solve(solver, model=MOE, tp_size=2, pp_size=2, dp_size=2, ep_size=2, zero_stage=1)
    for component in ("weights", "gradients", "optimizer_state", "activations", "communication_buffers"):
        assert sum(t.nbytes for t in r.terms_of(component)) == getattr(r, component)
    assert r.total_memory == sum(t.nbytes for t in r.terms)
    assert r.host_memory == 0 and all(t.tier == "accelerator" for t in r.terms)


def test_result_json_round_trip(solver):
    from mlsysim_core import TrainingMemoryResult
    r = solve(solver, model=MOE, tp_size=2, pp_size=2, dp_size=2, ep_size=2, zero_stage=3)
    again = TrainingMemoryResult.from_json(r.to_json())
    assert again == r and again.to_json() == r.to_json()
    assert r.to_dict()["gib"]["available_memory"] == 80.0
