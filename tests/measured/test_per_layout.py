"""What the measured profile keeps per layout (issue 27, item 5) changes no byte.

``_cache.per_layout`` keys the terms that do not depend on the batch (weights, gradients,
optimizer state, the data-parallel buffers) on the plan without its batch; ``prepare`` keeps
the completed options (one object per set of values), the family and the model's notes; the
rank classes and each rank's placement are kept per layout, one layer's bytes per what it reads. A sweep over batch sizes and accumulation steps therefore reuses what the earlier
solves of the same layout made: every one of its results must be exactly the result of the
same solve with every memo off (nothing kept from another solve).
"""

import pytest

from mlsysim_core import TrainingMemoryModel, memo

# (model, solve keywords); each is solved at every (batch size, accumulation steps) of SWEEP
CASES = [
    ("llama3-8b", dict(tp_size=2, pp_size=2, dp_size=8, zero_stage=2)),     # benchmarks/uncached.py's layout
    ("llama3-8b", dict(dp_size=4, zero_stage=3, activation_checkpointing="full")),
    ("llama3-8b", dict(dp_size=2, data_parallel="fsdp", regime="fsdp-bf16", optimizer="adamw")),
    ("llama3-8b", dict(tp_size=4, pp_size=4, sequence_parallel=True, zero_stage=1, optimizer="sgd")),
    ("llama3-8b", dict(dp_size=2, offload="optimizer", zero_stage=2)),
    ("llama3-8b", dict(dp_size=2, lora={"rank": 16})),
    ("llama3-8b", dict(optimizer="adafactor", optimizer_impl="for-loop", attention="eager")),
    ("mixtral-8x7b", dict(tp_size=2, pp_size=4, dp_size=4, ep_size=4, zero_stage=3)),
    ("mixtral-8x7b", dict(pp_size=2, dp_size=8, ep_size=8, zero_stage=1, moe_routing_imbalance="uniform")),
    ("mixtral-8x7b", dict(dp_size=4, ep_size=2, moe_capacity_factor=1.25, cp_size=2)),
    ("gpt2-xl", dict(dp_size=2, zero_stage=0, regime="fp32")),
]
SWEEP = [(8, 1), (16, 1), (16, 2), (48, 1), (48, 3), (64, 4), (8, 1)]


def _solve(solver, model, layout, batch, steps):
    dp = layout.get("dp_size", 1)
    try:
        return solver.solve(model, "h100", batch * dp, 1024, gradient_accumulation_steps=steps, **layout)
    except Exception as err:      # (a refusal must be the same refusal)
        return repr(err)


@pytest.mark.parametrize("model, layout", CASES, ids=[f"{m}-{i}" for i, (m, _) in enumerate(CASES)])
def test_a_sweep_over_the_batch_gives_each_solve_alone(model, layout):
    solver = TrainingMemoryModel("measured")
    memo.set_enabled(True)      # (starts empty: nothing from another test)
    swept = [_solve(solver, model, layout, b, m) for b, m in SWEEP]
    memo.set_enabled(False)
    try:
        alone = [_solve(solver, model, layout, b, m) for b, m in SWEEP]
    finally:
        memo.set_enabled(True)
    assert sum(not isinstance(r, str) for r in alone) >= 2, alone      # the case solves
    for (b, m), one, other in zip(SWEEP, swept, alone):
        assert one == other, (b, m)
        if not isinstance(one, str):
            assert one.to_json() == other.to_json(), (b, m)
