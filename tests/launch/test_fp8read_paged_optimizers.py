"""bitsandbytes' 32-bit optimizers from launch files (FP8READ, issue 25 item 2): torchtune's
``bitsandbytes.optim.PagedAdamW`` (llama2/7B_full_low_memory.yaml), ``PagedAdam``, ``PagedAdamW32bit``
and the non-paged ``AdamW``/``Adam`` are the registered ``paged-adamw-32bit-bnb`` / ``adamw-32bit-bnb``:
two fp32 moments per parameter (``optim_bits=32``, their default: bitsandbytes optim/adamw.py, adam.py),
the moments of tensors of >= 100,000 elements in CUDA managed memory (optimizer.py ``get_state_buffer`` ->
functional.py ``get_paged``), counted in host memory (lowbit_optimizers.bnb32_state_terms)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlsysim_core.scenario import from_launch

DATA = Path(__file__).resolve().parents[1] / "data" / "launch" / "torchtune"
LOW_MEMORY = DATA / "llama2" / "7B_full_low_memory.yaml"


@pytest.mark.parametrize("component, optimizer", [
    ("bitsandbytes.optim.PagedAdamW", "paged-adamw-32bit-bnb"), ("bitsandbytes.optim.PagedAdam", "paged-adamw-32bit-bnb"),
    ("bitsandbytes.optim.PagedAdamW32bit", "paged-adamw-32bit-bnb"),
    ("bitsandbytes.optim.PagedAdam32bit", "paged-adamw-32bit-bnb"),
    ("bitsandbytes.optim.AdamW", "adamw-32bit-bnb"), ("bitsandbytes.optim.Adam32bit", "adamw-32bit-bnb")])
def test_torchtune_bitsandbytes_32bit_names_are_the_registered_optimizers(component, optimizer):
    launch = from_launch([LOW_MEMORY], gpus=1, seq_len=2048,
                         overrides=[f"optimizer._component_={component}", "optimizer_in_bwd=False"])
    assert launch.scenario.optimizer == optimizer


def test_low_memory_recipe_paged_moments_by_hand():
    """Llama-2-7B: 6,738,415,616 parameters, of which 65 RMSNorm weights of 4,096 elements (< 100,000:
    device memory); every other tensor's two fp32 moments are paged: 2 x 4 B x 6,738,149,376 on the host."""
    launch = from_launch([LOW_MEMORY], gpus=1, seq_len=2048, overrides=["optimizer_in_bwd=False"])
    result = launch.scenario.solve()
    assert result.host_memory >= 2 * 4 * (6_738_415_616 - 65 * 4096)
    paged = [t for t in result.terms if "paged moments" in t.label]
    assert [t.nbytes for t in paged] == [2 * 4 * (6_738_415_616 - 65 * 4096)]
    device = [t for t in result.terms if t.label == "paged-adamw-32bit-bnb moments (fp32)"]
    assert [t.nbytes for t in device] == [2 * 4 * 65 * 4096]


def test_low_memory_recipe_as_written_answers_with_its_step_in_the_backward():
    """As written the recipe also steps the optimizer inside the backward (optimizer_in_bwd: True): bitsandbytes'
    32-bit step declares it (measured: validation/techniques/oib_combinations, the four bnb32 runs exact in every
    phase), so the file answers; the paged moments stay on the host, the norms' on the device."""
    launch = from_launch([LOW_MEMORY], gpus=1, seq_len=2048)
    assert launch.scenario.profile_options["optimizer_in_backward"] is True
    result = launch.scenario.solve()
    paged = [t for t in result.terms if "paged moments" in t.label]
    assert [t.nbytes for t in paged] == [2 * 4 * (6_738_415_616 - 65 * 4096)]
    assert result.optimizer_state == 2 * 4 * 65 * 4096      # (the device part; the paged moments are host memory)
