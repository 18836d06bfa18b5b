"""`fit techniques` (mlsysim_plugins.measured.technique_fit): the ladder on a hand-checkable case, the
hardware figures' sources, and errors for bad input. No torch."""

import io
import json

import pytest

from mlsysim_core import HardwareNode, TrainingMemoryModel
from mlsysim_core.cli import main
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from mlsysim_plugins.measured.technique_fit import fit_techniques, hardware_figures

MODEL, GPU = "meta-llama/llama-3.2-3b", "nvidia/a100-sxm4-40gb"
RUN = dict(precision="bf16", optimizer="adamw", activation_checkpointing="none", regime="bf16")
FLOPS, LINK = 312e12, 32e9      # A100 bf16 dense peak (as the catalog's) and a PCIe 4 x16 link (the catalog has none), given


def run(*argv):
    out = io.StringIO()
    return main(list(argv), out=out), out.getvalue()


@pytest.fixture(scope="module")
def ladder():
    return fit_techniques(MODEL, GPU, 2, 4096, hardware_flops=FLOPS, host_link_bytes_per_s=LINK, **RUN)


def test_the_ladder_by_hand(ladder):
    """Llama 3.2 3B, b = 2, s = 4096, pure bf16 AdamW on a 40 GiB A100 needs 61.3 GiB. The
    cheapest way in: bitsandbytes' AdamW8bit (no extra bytes moved over a fused AdamW: 0 s; its
    8-bit moments a caveat, not a price), then torchtitan's per-op SAC, which recomputes every
    other matmul: k_proj (3072 x 1024), o_proj (3072 x 3072), up_proj (3072 x 8192) =
    37,748,736 weights, 2 x T x 37,748,736 FLOPs with T = 8192 tokens, x 28 layers =
    1.7317e13 FLOPs / 312e12 FLOP/s = 0.0555 s."""
    assert not ladder.baseline.feasible and ladder.fits
    assert [s.label for s in ladder.steps] == ["bitsandbytes AdamW8bit", "activation checkpointing: op-sac"]
    assert ladder.combination == {"optimizer": "adamw-8bit-bnb", "activation_checkpointing": "op-sac"}
    first, second = ladder.steps
    assert first.added_seconds == 0.0 and "8-bit" in first.caveat
    flops = 28 * 2 * 8192 * (3072 * 1024 + 3072 * 3072 + 3072 * 8192)
    assert second.added_seconds == pytest.approx(flops / FLOPS, rel=1e-12)
    assert ladder.added_seconds == pytest.approx(flops / FLOPS, rel=1e-12)
    assert second.caveat is None and not first.result.feasible and second.result.feasible
    # Each rung's memory is the solve of that combination.
    m = TrainingMemoryModel("measured")
    for step, extra in zip(ladder.steps, ({"optimizer": "adamw-8bit-bnb"},
                                          {"optimizer": "adamw-8bit-bnb", "activation_checkpointing": "op-sac"})):
        assert step.result.total_memory == m.solve(MODEL, GPU, 2, 4096, **{**RUN, **extra}).total_memory
    # Nothing cheaper fits: every single technique with a known time that is cheaper does not.
    assert all(t >= ladder.added_seconds for _, t, _ in ladder.alternatives)


def test_a_run_that_fits_needs_no_step():
    fitted = fit_techniques(MODEL, "nvidia/a100-sxm4-80gb", 1, 1024, **RUN)
    assert fitted.fits and fitted.steps == () and fitted.combination == {} and "fits as it is" in fitted.describe()


def test_unknown_times_are_said_never_guessed():
    """A device without FLOP/s or host link in the catalog: the recompute and offload times are unknown,
    and combinations with an unknown time are ranked after every one whose time is known."""
    bare = HardwareNode(name="A100-like, no figures", memory_capacity=40 * 2**30)
    fitted = fit_techniques(MODEL, bare, 2, 4096, **RUN)
    assert fitted.figures["hardware FLOP/s"] == (None, "unknown (no FLOP/s for this hardware; give hardware_flops= "
                                                       "(--flops FLOP/s))")
    assert fitted.fits and fitted.added_seconds is None
    assert "added unknown" in fitted.describe() and "no FLOP/s for this hardware" in fitted.describe()


def test_hardware_figures_come_from_the_catalog_else_the_caller():
    figures = hardware_figures("nvidia/b200")
    assert figures["hardware FLOP/s"] == (2.25e15, "catalog: peak_bf16_flops")
    assert figures["memory bandwidth B/s"][1] == "catalog: memory_bandwidth"
    assert hardware_figures("nvidia/b200", hardware_flops=1e15)["hardware FLOP/s"] == (1e15, "given")
    node = HardwareNode(name="x", memory_capacity=40 * 2**30)
    assert hardware_figures(node)["memory bandwidth B/s"][0] is None


def test_a_technique_the_run_already_uses_is_not_offered():
    fitted = fit_techniques(MODEL, GPU, 2, 4096, hardware_flops=FLOPS, **{**RUN, "loss": "chunked"})
    assert "loss" not in fitted.combination


def test_bad_input_is_an_error_naming_it():
    with pytest.raises(InvalidInputError, match="techniques"):
        fit_techniques(MODEL, GPU, 2, 4096, techniques=["compile"], **RUN)
    with pytest.raises(InvalidInputTypeError, match="techniques"):
        fit_techniques(MODEL, GPU, 2, 4096, techniques="loss", **RUN)
    with pytest.raises(InvalidInputError, match=r"^hardware_flops=-1 is not allowed: a positive number of FLOP/s"):
        fit_techniques(MODEL, GPU, 2, 4096, hardware_flops=-1, **RUN)     # (the keyword: was "hardware FLOP/s")
    with pytest.raises(InvalidInputError, match="max_solves"):
        fit_techniques(MODEL, GPU, 2, 4096, max_solves=0, **RUN)
    with pytest.raises(InvalidInputError, match="batchsize"):
        fit_techniques(MODEL, GPU, 2, 4096, batchsize=3, **RUN)
    with pytest.raises(NotModelledError, match="measured-grade"):
        fit_techniques(MODEL, GPU, 2, 4096, profile="reference", precision="bf16")
    with pytest.raises(InvalidInputError, match="activation_checkpointing"):     # the run's own error
        fit_techniques(MODEL, GPU, 2, 4096, **{**RUN, "activation_checkpointing": "sometimes"})


def test_only_the_techniques_asked_for():
    fitted = fit_techniques(MODEL, GPU, 2, 4096, techniques=["loss"], **RUN)
    assert not fitted.fits and fitted.steps == () and "no combination" in fitted.message


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_cli():
    flags = ("-m", MODEL, "-g", GPU, "--batch-size", "2", "--seq-len", "4096", "--precision", "bf16",
             "--optimizer", "adamw", "--checkpointing", "none", "--regime", "bf16", "--flops", "312e12")
    code, text = run("fit", "techniques", *flags)
    assert code == 0 and "1. + bitsandbytes AdamW8bit" in text and "2. + activation checkpointing: op-sac" in text
    code, text = run("fit", "techniques", *flags, "--json")
    data = json.loads(text)
    assert code == 0 and data["combination"] == {"optimizer": "adamw-8bit-bnb", "activation_checkpointing": "op-sac"}
    assert data["run"] and data["profile"] == "measured"
    code, _ = run("fit", "batch", "-m", MODEL, "--flops", "1e12")
    assert code == 2
