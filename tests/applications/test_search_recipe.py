"""A search of a published run as its source states the recipe (issue 27: the published layout in its own
search): the card's memory variant keeps the chip's step-time envelope, and the search takes the
measured profile's ``loss_parallel`` as ``solve`` does."""

import attrs
import pytest

from mlsysim_core import search
from mlsysim_core.catalog import get_hardware
from mlsysim_plugins import steptime


H100 = get_hardware("h100")
# torchtitan's H100 files: "Each H100 GPU is equipped with 96GB HBM2e with 2.4 TB/sec peak memory bandwidth"
GRAND_TETON = attrs.evolve(H100, memory_capacity=96 * 2**30, memory_bandwidth=2_400_000_000_000)


def test_a_memory_variant_keeps_the_chips_envelope():
    assert steptime.envelope(H100) == {"power_limit_watts": 700, "streaming_multiprocessors": 132}
    assert steptime.envelope(GRAND_TETON) == steptime.envelope(H100)
    # anything else changed is another chip: no envelope (timed without tiles and waves, and said)
    assert steptime.envelope(attrs.evolve(H100, peak_bf16_flops=500e12)) == {}
    assert steptime.envelope(attrs.evolve(GRAND_TETON, intra_node_bandwidth=100e9)) == {}
    hw = steptime.hardware_figures(GRAND_TETON, power=500)
    assert hw["sms"] == 132 and hw["clock"] == pytest.approx((5 / 7) ** (1 / 3)) and hw["memory"] == 2.4e12


def test_search_takes_loss_parallel_as_solve_does():
    """With tp > 1, PyTorch's loss_parallel keeps the logits sharded over the vocabulary: the search's
    row is the memory ``solve`` gives with the option, and less than without it."""
    kw = dict(devices=2, global_batch=8, seq_len=1024, precision="bf16", optimizer="adamw", profile="measured",
              checkpointing=["full"], data_parallel=["zero1"], sequence_parallel=[True], context_parallel=[1],
              workers=1)
    rows = {lp: {(c.tp, c.pp, c.dp, c.microbatch): c
                 for c in search.search_plans("llama3.2-1b", "h100", loss_parallel=lp, **kw).fits}
            for lp in (None, True)}
    with_lp, without = rows[True][(2, 1, 1, 1)], rows[None][(2, 1, 1, 1)]
    assert with_lp.total_memory < without.total_memory
    from mlsysim_core import TrainingMemoryModel
    solved = TrainingMemoryModel("measured").solve(
        "llama3.2-1b", "h100", batch_size=8, seq_len=1024, precision="bf16", optimizer="adamw",
        activation_checkpointing="full", tp_size=2, dp_size=1, gradient_accumulation_steps=8,
        sequence_parallel=True, data_parallel="zero1", loss_parallel=True)
    assert with_lp.total_memory == solved.total_memory
    assert with_lp.step_time == without.step_time     # (the step time already times the logits split over tp)
    # at tp = 1 the option changes nothing
    one = [key for key in rows[None] if key[0] == 1]
    assert one and all(rows[True][key] == rows[None][key] for key in one)


def test_search_at_a_power_limit_times_every_row_as_time_plan_does():
    """torchtitan's H100s ran at 500 W: a search given the run's power limit times each row as
    ``time_plan(power=)`` does (the tensor cores at (500/700)^(1/3) of their clock)."""
    kw = dict(devices=8, global_batch=16, seq_len=2048, precision="bf16", optimizer="adamw", profile="measured",
              checkpointing=["full"], data_parallel=["fsdp"], context_parallel=[1], max_tp=1, workers=1)
    capped = search.search_plans("llama3.2-1b", GRAND_TETON, power=500, **kw)
    full = search.search_plans("llama3.2-1b", GRAND_TETON, **kw)
    assert capped.assumptions["power_limit_watts"] == 500 and full.assumptions["power_limit_watts"] == 700
    c = next(r for r in capped.fits if (r.pp, r.dp) == (1, 8))
    alone = search.time_plan("llama3.2-1b", GRAND_TETON, global_batch=16, seq_len=2048, dp=8, data_parallel="fsdp",
                             checkpointing="full", microbatch=c.microbatch, precision="bf16", optimizer="adamw",
                             profile="measured", power=500)
    assert alone["step_s"] == c.step_time and alone["components"] == capped.components(c)
    twin = next(r for r in full.fits if r[:10] == c[:10])
    assert twin.total_memory == c.total_memory and twin.step_time < c.step_time
    with pytest.raises(search.InvalidInputError, match="power"):
        search.search_plans("llama3.2-1b", "h100", power=0, **kw)
