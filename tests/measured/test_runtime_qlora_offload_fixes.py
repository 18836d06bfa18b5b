"""Three mechanisms, by hand (no torch): PyTorch's default cuBLAS workspace by the accelerator's compute
capability (pytorch/pytorch 26a39059ec580351411f180816c47e2ef5134ae1 aten/src/ATen/cuda/CublasHandlePool.cpp,
parseChosenWorkspaceSize), QLoRA's frozen layer gathered as stored under FSDP (bitsandbytes Params4bit), and
the gradient offload's staging under LoRA (the adapters' gradients only)."""

from __future__ import annotations

import pytest

from mlsysim_core import HardwareNode, TrainingMemoryModel
from mlsysim_core.catalog import find_hardware

SM90 = 8 * 4096 * 1024                       # ":4096:8"
OTHER = 2 * 4096 * 1024 + 8 * 16 * 1024      # ":4096:2:16:8" = 8,519,680 B


def _workspace(result):
    return [t.nbytes for t in result.terms if t.label == "cuBLAS workspaces"]


def _solve(hardware, **kw):
    return TrainingMemoryModel("measured").solve("llama3-8b", hardware, 8, 2048, "bf16", **kw)


@pytest.mark.parametrize("hardware, cc, nbytes", [
    ("h100", "9.0", SM90), ("nvidia/h200", "9.0", SM90), ("a100-80gb", "8.0", OTHER), ("nvidia/a100-40gb", "8.0", OTHER),
    ("b200", "10.0", OTHER), ("l40s", "8.9", OTHER)])
def test_cublas_workspace_is_pytorchs_default_for_the_compute_capability(hardware, cc, nbytes):
    assert find_hardware(hardware).extra["compute_capability"] == cc
    assert "compute_capability" in find_hardware(hardware).sources
    assert SM90 == 33_554_432 and OTHER == 8_519_680
    r = _solve(hardware)
    assert _workspace(r) == [2 * nbytes]        # one per thread that runs GEMMs: the forward's, autograd's device thread
    assert not any("records no compute capability" in n for n in r.notes)


def test_cublas_workspace_unsaid_keeps_32_mib_with_a_note():
    node = HardwareNode(name="my accelerator", memory_capacity=2**40)
    r = _solve(node)
    assert _workspace(r) == [2 * SM90]
    assert any("records no compute capability" in n for n in r.notes)
    mi300 = _solve("mi300x")          # the catalog says nothing of an AMD part's CUDA capability
    assert _workspace(mi300) == [2 * SM90] and any("records no compute capability" in n for n in mi300.notes)


def test_cublas_workspace_given_wins():
    r = _solve("a100-80gb", runtime_overheads={"cublas_workspace": 2**20})
    assert _workspace(r) == [2**20]
    assert _workspace(_solve("a100-80gb", runtime_overheads={"cublas_workspace": 0})) == []


LAYER = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336      # Llama 3 8B, one layer's matrices
ADAPTERS = 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024))            # q/k/v/o at rank 16, one layer


def test_qlora_under_fsdp_gathers_the_packed_codes():
    """nf4: (n + 1) // 2 bytes of codes per linear (all seven of a layer quantized); the quantization state is a
    module attribute, not gathered; the fp32 adapters beside them."""
    r = _solve("h100", lora={"rank": 16, "quantization": "nf4", "double_quant": True}, regime="bf16", dp_size=8,
               data_parallel="fsdp")
    terms = {t.label: t.nbytes for t in r.terms}
    codes = 2 * (4096 * 4096 // 2) + 2 * (4096 * 1024 // 2) + 3 * (4096 * 14336 // 2)
    assert codes == LAYER // 2
    assert terms["all-gathered parameters of one layer"] == codes + ADAPTERS * 4
    plain = _solve("h100", lora={"rank": 16}, regime="bf16", dp_size=8, data_parallel="fsdp")
    assert {t.label: t.nbytes for t in plain.terms}["all-gathered parameters of one layer"] == LAYER * 2 + ADAPTERS * 4


def test_gradient_offload_staging_under_lora_is_the_adapters():
    r = _solve("h100", lora={"rank": 16}, regime="bf16", offload="optimizer+gradients")
    staging = [t for t in r.terms if t.label == "gradient offload staging (one layer)"]
    assert [t.nbytes for t in staging] == [ADAPTERS * 4]          # fp32 adapter gradients (peft's autocast dtype)
    full = _solve("h100", regime="bf16", offload="optimizer+gradients")
    assert [t.nbytes for t in full.terms if t.label == "gradient offload staging (one layer)"] == [LAYER * 2]


def test_qlora_under_shard_grad_op_keeps_the_packed_codes():
    """reshard_after_forward=False: every layer stays gathered, its quantized linears as stored (1/2 B), the
    embeddings, norms and LM head at 2 B, the fp32 adapters beside them."""
    r = _solve("h100", lora={"rank": 16, "quantization": "nf4"}, regime="bf16", dp_size=8,
               data_parallel="fsdp-grad-op")
    kept = {t.label: t.nbytes for t in r.terms}["unsharded parameters kept from forward to backward"]
    base, quantized = 8_030_261_248, 32 * LAYER
    assert kept == pytest.approx(quantized // 2 + (base - quantized) * 2 + 32 * ADAPTERS * 4, abs=1e-3)
    assert int(kept) == 5_646_065_664


def test_qlora_parameter_offload_keeps_the_quantization_state_on_the_device():
    """FSDP1's CPUOffload(offload_params=True) moves the sharded FlatParameters (torch FlatParamHandle) and
    DeepSpeed's offload_param the partitioned parameters: bitsandbytes' QuantState tensors (absmax, nested
    statistics, code tables) are module attributes, not parameters, and stay where the model was quantized, whole on
    every rank; the packed codes, the 16-bit base and the adapters go to the host."""
    from mlsysim_core.terms import ACCELERATOR, HOST

    def constants(n):     # one nf4 linear, double quant: uint8 absmax per 64, fp32 per 256 of them, offset, codes
        blocks = n // 64
        return blocks + 4 * -(-blocks // 256) + 4 + 256 * 4 + 16 * 4
    state_bytes = 32 * (2 * constants(4096 * 4096) + 2 * constants(4096 * 1024) + 3 * constants(4096 * 14336))
    lora = {"rank": 16, "quantization": "nf4", "double_quant": True}
    r = _solve("h100", lora=lora, regime="fsdp-bf16-stored", dp_size=2, data_parallel="fsdp",
               offload="optimizer+gradients+parameters")
    weights = [t for t in r.terms if t.component == "weights"]
    state = [t for t in weights if t.label == "quantization constants"]
    assert [(t.nbytes, t.tier) for t in state] == [(state_bytes, ACCELERATOR)]
    assert state_bytes == 111_000_448
    assert all(t.tier == HOST and t.label.endswith("(offloaded to cpu)") for t in weights if t not in state)
    assert sum(t.nbytes for t in weights if t.tier == ACCELERATOR) == state_bytes
    kept = _solve("h100", lora=lora, regime="fsdp-bf16-stored", dp_size=2, data_parallel="fsdp")
    assert [t.nbytes for t in kept.terms if t.label == "quantization constants"] == [state_bytes]
