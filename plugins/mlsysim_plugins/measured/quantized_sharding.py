"""A quantized LoRA base split over data-parallel ranks, as its implementation declares it (``QuantImplementation.
shards``, quantizations.py): what each rank keeps of every quantized linear, and what one layer's all-gather holds.

torchao's NF4Tensor under FSDP2 (torchtune 0.6.1's ``lora_finetune_distributed`` with a ``qlora_*`` builder): each
rank stores its rows' packed codes, int8 scalers and their factors; the weight's mean and lookup table stay whole on
every rank; FSDP2 all-gathers the codes, scalers and factors (``NF4Tensor.fsdp_pre_all_gather``), never a
dequantized weight: one layer's gathered NF4 tensors are its stored bytes less the per-weight mean and table, which
the forward then dequantizes weight by weight as on one device (``QuantImplementation.transient``). Measured:
validation/qlora_fsdp2 (measure.py, measurements.json; compare.py).

An implementation that declares no ``shards`` (``None``) and stores its own layout is refused under a layout that
splits its weights; bitsandbytes (``stored=None``) keeps lora.py's reading (packed codes sharded, QuantState whole).
"""

from __future__ import annotations

from mlsysim_core.errors import NotModelledError

from . import quantizations


def declared(plan):
    """The chosen implementation when it declares how it shards (``shards``), else None."""
    impl = quantizations.chosen(plan.profile_options)
    return impl if impl.stored is not None and impl.shards is not None else None


def _linears(plan):
    from .lora import _quantized_linears
    return _quantized_linears(plan)


def _base(plan) -> int:
    from .lora import base_weight_bytes
    return base_weight_bytes(plan.profile_options.regime)


def per_rank(plan, d: int) -> tuple[int, int, int]:
    """(weight bytes, sharded constant bytes, whole constant bytes) this rank keeps of the model's quantized linears,
    every layer, split over ``d`` ranks as the implementation declares."""
    impl, cfg, base = declared(plan), plan.profile_options.lora, _base(plan)
    w = ks = kw = 0
    for _, i, o in _linears(plan):
        a, b, c = impl.shards(i * o, o, cfg, base, d)
        w, ks, kw = w + a, ks + b, kw + c
    L = plan.model.layers
    return L * w, L * ks, L * kw


def gathered_layer_bytes(plan) -> int:
    """One layer's quantized linears as the all-gather rebuilds them: each weight's gathered part (its codes and the
    constants split with it, ``shards`` at d = 1 less what every rank keeps whole)."""
    impl, cfg, base = declared(plan), plan.profile_options.lora, _base(plan)
    total = 0
    for _, i, o in _linears(plan):
        a, b, _ = impl.shards(i * o, o, cfg, base, 1)
        total += a + b
    return total


def check_replicated(plan, d: int) -> None:
    """A declared implementation under a data-parallel layout that does not shard the weights (DDP, ZeRO-1/2): the
    quantized base replicated on every rank is not measured (torchtune shards it with FSDP2)."""
    impl = declared(plan)
    if impl is not None and d == 1 and plan.dp_size > 1:
        raise NotModelledError("lora.quant_implementation", impl.name, "a data-parallel rule that shards the weights "
                               "(fsdp, hsdp, zero3) with this implementation",
                               f"{impl.name}'s base replicated over dp={plan.dp_size} ranks (DDP, ZeRO-1/2) is not "
                               "measured (validation/qlora_fsdp2 measures FSDP2)")
