"""The optimizer step's traffic is what is alive in the optimizer step, whatever phase the peak is in:
a search's row and ``time_plan`` agree on every strategy (issue 27 item 6), not only the first searched."""

from mlsysim_core import search
from mlsysim_core.catalog import get_model
from mlsysim_core.solver import TrainingMemoryModel
from mlsysim_core.terms import ACCELERATOR, OPTIMIZER_STEP
from mlsysim_plugins.steptime import optimizer_step_bytes


def test_the_bytes_are_the_optimizer_steps_not_the_peaks():
    solver = TrainingMemoryModel("measured")
    result = solver.solve("llama3-8b", "h100", 2, 2048, activation_checkpointing="none", regime="bf16")
    assert result.peak_phase != OPTIMIZER_STEP      # the peak is elsewhere: its components would differ
    alive = {"weights": 0, "gradients": 0, "optimizer_state": 0}
    for term in result.terms:
        if term.component in alive and term.tier == ACCELERATOR and OPTIMIZER_STEP in term.phases:
            alive[term.component] += term.nbytes
    parameters = get_model("llama3-8b").parameters
    assert result.gradients == 0 and alive["gradients"] == 2 * parameters   # at the peak none; the step reads them
    expected = (2 * alive["optimizer_state"] + 2 * alive["weights"] + alive["gradients"]) / parameters
    assert optimizer_step_bytes(result, parameters) == expected
    full = solver.solve("llama3-8b", "h100", 2, 2048, activation_checkpointing="full", regime="bf16")
    assert optimizer_step_bytes(full, parameters) == expected       # checkpointing moves no optimizer byte


def test_a_summed_result_counts_every_term():
    result = TrainingMemoryModel().solve("llama3-8b", "h100", 2, 2048)
    assert result.peak_phase is None
    assert optimizer_step_bytes(result, 10) == (2 * result.optimizer_state + 2 * result.weights
                                                + result.gradients) / 10


def test_search_rows_and_time_plan_agree_for_every_strategy():
    r = search.search_plans("llama3-8b", "h100", devices=2, global_batch=8, seq_len=2048, profile="measured",
                            regime="bf16")
    strategies = {c.checkpointing for c in r.fits}
    assert len(strategies) > 1
    for c in r.fits[:12]:
        t = search.time_plan("llama3-8b", "h100", global_batch=8, seq_len=2048, tp=c.tp, cp=c.cp, pp=c.pp, dp=c.dp,
                             ep=c.ep, data_parallel=c.data_parallel, checkpointing=c.checkpointing,
                             microbatch=c.microbatch, sequence_parallel=c.sequence_parallel, profile="measured",
                             regime="bf16")
        assert r.components(c) == t["components"]
