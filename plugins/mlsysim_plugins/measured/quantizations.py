"""4-bit implementations of a QLoRA base (issue 25, item 2): who stores the quantized weights and dequantizes
them, each a registration of the measured hook ``mlsysim_measured_quant_implementations``, chosen with
``lora.quant_implementation`` (``--quant-implementation NAME``; ``"bitsandbytes"``, the default, or ``"torchao"``, or
a third party's, e.g. HQQ). The built-ins are registered through that hook exactly as a third party's.

A ``QuantImplementation`` declares its memory; lora.py reads the declaration, never the name:

- ``kinds``: the ``lora.quantization`` values it implements (any other is refused, naming it).
- ``stored(n, rows, config, base) -> (weight bytes, constant bytes)``: one quantized weight of ``n`` elements and
  ``rows`` outputs, ``base`` the bytes of the dtype the model was built in; ``None``: bitsandbytes' layout as
  ``finetune.lora_counts`` counts it (``finetune._tensor_bytes``).
- ``transient(n, c) -> (bytes, how)``: what dequantizing one weight of ``n`` elements to the compute dtype (``c``
  bytes) holds at its peak, beyond the weight's storage (the backward's ``dequantized weight`` term).
- ``compiled_blocks``: its dequantization traces into a compiled block's graph (``compile="blocks"``: the
  partitioner saves the dequantized weight, compile.dequantized_saved); False: refused with compiled blocks.
- ``layout``: its quantization constants in words (the weights term's formula; ``{b}``: the base's bytes).
- ``check(n)``: a weight it cannot quantize (raise ``NotModelledError``), ``None``: any.
- ``block_size``: the block size it always quantizes in (torchao's to_nf4 as torchtune calls it: 64); a
  ``lora.quant_blocksize`` other than it is refused, never ignored. ``None``: it reads ``quant_blocksize``.
- ``shards(n, rows, config, base, d) -> (weight bytes, sharded constant bytes, whole constant bytes)``: one rank's
  part of one stored weight when a data-parallel rule shards the parameters over ``d`` ranks (FSDP2's
  ``fully_shard``, torchtune's ``load_from_full_model_state_dict``): what the rank keeps of the weight and of the
  constants that are split with it, and the constants every rank keeps whole; the gathered weight is (weight +
  sharded constants) x d (what FSDP2 all-gathers; quantized_sharding.py). Raises ``NotModelledError`` for a weight
  that cannot be split over ``d``. ``None``: its split over ranks is not measured (refused under a layout that
  shards the weights); ``stored=None`` implementations are split as finetune counts them (the packed codes sharded,
  the quantization state whole: lora.gathered_layer).
- ``source``: the library, file and version it is derived from.
"""

from __future__ import annotations

from typing import Callable

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError

HOOK = "mlsysim_measured_quant_implementations"
KINDS = ("nf4", "fp4", "int8")      # lora.quantization's values (finetune.QUANTIZATIONS)


def _kinds(value) -> tuple[str, ...]:
    out = (value,) if isinstance(value, str) else tuple(value)
    if not out or any(k not in KINDS for k in out):
        raise ValueError(f"QuantImplementation.kinds: {out!r}; expected one or more of {KINDS}")
    return out


@attrs.frozen(kw_only=True, eq=False)
class QuantImplementation:
    """A 4-bit (or 8-bit) implementation of a quantized LoRA base (the module docstring)."""
    name: str
    description: str = ""
    source: str = ""
    kinds: tuple[str, ...] = attrs.field(converter=_kinds)
    stored: Callable | None = None
    transient: Callable = attrs.field(validator=attrs.validators.is_callable())
    check: Callable | None = None
    compiled_blocks: bool = False
    layout: str = ""
    block_size: int | None = None
    shards: Callable | None = None


def _bnb_transient(n: int, c: int):
    return n * c, f"{n:,} elements x {c} B (dequantize_4bit in the backward's matmul)"


# torchao 0.13.0 torchao/dtypes/nf4tensor.py (to_nf4: block_size 64, scaler_block_size 256)
TORCHAO_0130 = "torchao 0.13.0 torchao/dtypes/nf4tensor.py (to_nf4, NF4Tensor.get_original_weight, LinearNF4)"
_BLOCK, _SCALER_BLOCK = 64, 256


def _torchao_stored(n: int, rows: int, config, base: int) -> tuple[int, int]:
    """NF4Tensor.from_tensor on a weight of the model's dtype (``base`` bytes): ``quantized_data`` uint8 n / 2 (two
    codes a byte); ``quantized_scalers`` int8, one per 64-element block (n / 64); ``quantization_factor`` one per 256
    scalers in the weight's dtype (``.contiguous()`` of a column: n / 16,384 x base); ``scaler_mean`` a 0-d tensor
    (base); ``nf4``, the 16-entry lookup table built per weight in its dtype (16 x base). A weight of one scaler
    block (n = 16,384) keeps the whole (1, 256) product behind its factor: the column of one row is contiguous
    already, so ``.contiguous()`` copies nothing (256 x base; measured: a 64 x 256 weight's factor holds 512 B
    in bf16)."""
    blocks = n // _BLOCK
    groups = blocks // _SCALER_BLOCK
    factor = (groups if groups > 1 else _SCALER_BLOCK) * base
    return n // 2, blocks + factor + base + 16 * base


def _torchao_transient(n: int, c: int):
    """``weight.to(dtype)`` -> ``get_original_weight`` at its peak (``torch.stack``), all locals alive: the two
    code tensors cast to int64 (n / 2 x 8 B each: 8 n), their table lookups (n / 2 x c each), the scalers
    (n / 64 x c), the scaled halves (n / 2 x c each) and the stacked output (n x c): 8 n + 3 c n + c n / 64."""
    b = 8 * n + 3 * c * n + c * n // _BLOCK
    return b, (f"8 x {n:,} (the int64 codes) + 3 x {c} x {n:,} (lookups, scaled halves, the stacked weight) + "
               f"{c} x {n:,} / 64 (scalers): get_original_weight's peak")


def _torchao_check(n: int):
    if n % (_BLOCK * _SCALER_BLOCK):
        raise NotModelledError("lora.quant_implementation", "torchao", "a base whose linears have a multiple of "
                               "16,384 elements", f"a linear of {n:,} elements: to_nf4 asserts n / 64 blocks divide "
                               "into its 256-scaler blocks")


def _torchao_shards(n: int, rows: int, config, base: int, d: int) -> tuple[int, int, int]:
    """FSDP2 over torchao's NF4Tensor (``fsdp_pre_all_gather``: ``quantized_scalers``, ``quantization_factor``,
    ``quantized_data`` are what is gathered; ``scaler_mean`` and ``nf4`` travel as metadata). torchtune 0.6.1's
    ``load_from_full_model_state_dict`` (torchtune/training/_distributed.py) ``to_nf4``s the whole weight, takes the
    rank's ``torch.chunk`` of its rows (``nf4_split``: every inner tensor split into d equal parts) and copies it
    into ``new_zeros`` of the chunk's size (``nf4_new_zeros``: fresh inner tensors of numel / d): each rank keeps n / 2
    / d code bytes, n / 64 / d int8 scalers and (n / 16,384) / d factors in the weight's dtype, and the weight's mean
    and 16-entry table whole (shared with the full tensor, which is freed). Measured: validation/qlora_fsdp2
    (measurements.json ``nf4_shard``, to the byte at d = 2 and 4)."""
    blocks = n // _BLOCK
    groups = blocks // _SCALER_BLOCK
    if rows % d or groups % d:
        raise NotModelledError("lora.quant_implementation", "torchao", f"a base whose linears split evenly over "
                               f"the {d} ranks: rows and n / 16,384 scaler groups multiples of {d}",
                               f"a linear of {rows:,} rows and {n:,} elements ({groups:,} scaler groups): torchao's "
                               "nf4_split asserts each inner tensor divides into the ranks' chunks (FSDP2 pads no "
                               "NF4 rows)")
    return n // 2 // d, (blocks + groups * base) // d, base + 16 * base


BUILTIN = (
    QuantImplementation(name="bitsandbytes", description="bitsandbytes' Linear4bit / Linear8bitLt (peft, "
                        "transformers' BitsAndBytesConfig, axolotl, LLaMA-Factory)",
                        source="bitsandbytes 0.50.2 bitsandbytes/functional.py (quantize_4bit)",
                        kinds=("nf4", "fp4", "int8"), stored=None, transient=_bnb_transient),
    QuantImplementation(name="torchao", description="torchao's NF4Tensor (to_nf4, linear_nf4: torchtune's "
                        "quantize_base=True): blocks of 64, scalers quantized to int8 in blocks of 256; eager "
                        "dequantization through int64 code tensors", source=TORCHAO_0130, kinds=("nf4",),
                        stored=_torchao_stored, transient=_torchao_transient, check=_torchao_check,
                        # measured: validation/compile/measure_blocks_qlora.py (torchtune 0.6.1's qlora builders)
                        compiled_blocks=True, block_size=_BLOCK, shards=_torchao_shards,
                        layout="torchao's NF4Tensor: int8 scalers per 64-element block, a {b} B factor per 256 of them "
                               "(a whole 256 for a weight of one such block), a {b} B mean and the 16-entry table in "
                               "{b} B, per weight"),
)


@hookimpl
def mlsysim_measured_quant_implementations():
    return list(BUILTIN)


def registered(registry) -> dict[str, QuantImplementation]:
    """The implementations registered through ``HOOK`` (every plugin's, built-ins included), each checked to be a
    ``QuantImplementation`` (another class is named with its plugin)."""
    found = dict(registry.extensions.get(HOOK) or {})
    if any(not isinstance(item, QuantImplementation) for item in found.values()):
        from .options import check_items
        check_items(registry, HOOK, found)
    return found


def of(config, registry) -> QuantImplementation:
    """The registered declaration ``config.quant_implementation`` names, checked against ``config.quantization``."""
    impls = registered(registry)
    name = config.quant_implementation
    allowed = f"one of {', '.join(map(repr, impls))} (the registered implementations)" if impls else \
        "a registered implementation (none is installed: is the built-in plugin blocked?)"
    if not isinstance(name, str):
        raise InvalidInputTypeError("lora.quant_implementation", name, allowed, f"got {type(name).__name__}")
    impl = impls.get(name)
    if impl is None:
        raise InvalidInputError("lora.quant_implementation", name, allowed)
    if config.quantization is not None and config.quantization not in impl.kinds:
        raise NotModelledError("lora.quant_implementation", name, f"an implementation of {config.quantization!r}",
                               f"{name} implements {', '.join(impl.kinds)}")
    if impl.block_size is not None and config.quantization is not None and config.quant_blocksize != impl.block_size:
        raise NotModelledError("lora.quant_blocksize", config.quant_blocksize, f"{impl.block_size} with "
                               f"quant_implementation={name!r}, or leave it out", f"{name} quantizes in blocks of "
                               f"{impl.block_size} whatever quant_blocksize says ({impl.source or impl.description})")
    return impl


def chosen(options) -> QuantImplementation:
    """The implementation the LoRA technique resolved for these options (``lora.lora_option``: the registry's entry
    ``lora.quant_implementation`` names, kept as the internal option ``quant_spec``)."""
    impl = options.quant_spec
    if impl is None:
        raise NotModelledError("lora.quant_implementation", options.lora.quant_implementation,
                               "a quantized base the LoRA technique has resolved", "read before the LoRA technique ran")
    return impl
