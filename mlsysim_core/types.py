"""The things a solve is about: a model (workload) and an accelerator (hardware node).

All are frozen attrs classes with keyword-only fields, so fields can be added later
without breaking anyone's constructor calls. Counts are ints; memory is in bytes (ints).
"""

from __future__ import annotations

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError

MIB = 2**20     # a device with less memory than this is a unit mistake (bytes, not GiB)


def _str(instance, attribute, value):
    """A non-empty string (a name)."""
    parameter = f"{type(instance).__name__}.{attribute.name}"
    if not isinstance(value, str):
        raise InvalidInputTypeError(parameter, value, "a non-empty string", f"got {type(value).__name__}")
    if not value.strip():
        raise InvalidInputError(parameter, value, "a non-empty string")


def _opt_str(instance, attribute, value):
    if value is not None and not isinstance(value, str):
        raise InvalidInputTypeError(f"{type(instance).__name__}.{attribute.name}", value, "a string or None",
                                    f"got {type(value).__name__}")


def _count(minimum=1):
    return attrs.field(converter=_checks.to_int, validator=_checks.attrs_count(minimum))


def _optional_count(minimum=1, maximum=_checks.MAX_COUNT):
    return attrs.field(default=None, converter=_checks.to_optional_int,
                       validator=_checks.attrs_optional_count(minimum, maximum))


def _optional_flag():
    return attrs.field(default=None, validator=_checks.attrs_optional_flag)


@attrs.frozen(kw_only=True)
class TransformerWorkload:
    """A dense decoder/encoder transformer.

    Only ``name``, ``parameters`` and ``layers`` are required. ``parameters`` is the
    TOTAL count, embeddings included. The reference profile reads ``parameters``,
    ``layers``, ``hidden_dim`` and ``heads``; the other architecture fields are recorded
    for architecture-aware profiles (``None`` means unknown).
    """

    name: str = attrs.field(validator=_str)
    parameters: int = _count()
    layers: int = _count()
    hidden_dim: int | None = _optional_count()
    heads: int | None = _optional_count()
    kv_heads: int | None = _optional_count()        # GQA/MQA; None = same as heads
    head_dim: int | None = _optional_count()        # None = hidden_dim // heads
    vocab_size: int | None = _optional_count()
    ffn_dim: int | None = _optional_count()         # MLP intermediate width
    gated_mlp: bool | None = _optional_flag()       # SwiGLU/GeGLU (3 matrices) vs plain (2)
    tied_embeddings: bool | None = _optional_flag()
    context_length: int | None = _optional_count()
    kv_lora_rank: int | None = _optional_count()     # MLA (DeepSeek)
    qk_rope_head_dim: int | None = _optional_count()
    architecture: str | None = attrs.field(default=None, validator=_opt_str)

    def __attrs_post_init__(self):
        heads = self.heads
        if heads is None:
            return
        if self.kv_heads is not None and (self.kv_heads > heads or heads % self.kv_heads):
            raise InvalidInputError(f"{type(self).__name__}.kv_heads", self.kv_heads,
                                    f"at most heads={heads} and a divisor of it",
                                    "grouped-query attention shares each key/value head among the same "
                                    "number of query heads")
        if self.head_dim is None and self.hidden_dim is not None and self.hidden_dim % heads:
            raise InvalidInputError(f"{type(self).__name__}.hidden_dim", self.hidden_dim,
                                    f"a multiple of heads={heads} (hidden_dim = heads x head_dim), "
                                    "or set head_dim",
                                    f"without head_dim each head would be {self.hidden_dim / heads:g} wide")

    @property
    def is_sparse(self) -> bool:
        return False


@attrs.frozen(kw_only=True)
class SparseTransformerWorkload(TransformerWorkload):
    """A mixture-of-experts transformer.

    ``parameters`` is the total over all experts; ``active_parameters`` what one token
    uses. ``experts`` routed experts per MoE layer, ``active_experts_per_token`` of them
    (top-k) per token.
    """

    active_parameters: int = _count()
    experts: int = _count()
    active_experts_per_token: int = attrs.field(
        default=1, converter=_checks.to_int, validator=_checks.attrs_count())
    shared_experts: int | None = _optional_count(minimum=0)
    expert_ffn_dim: int | None = _optional_count()

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        cls = type(self).__name__
        if self.active_parameters > self.parameters:
            raise InvalidInputError(f"{cls}.active_parameters", self.active_parameters,
                                    f"at most parameters={self.parameters}")
        if self.active_experts_per_token > self.experts:
            raise InvalidInputError(f"{cls}.active_experts_per_token",
                                    self.active_experts_per_token,
                                    f"at most experts={self.experts}")

    @property
    def is_sparse(self) -> bool:
        return True


@attrs.frozen(kw_only=True)
class HardwareNode:
    """One accelerator: how much memory a single device has.

    ``memory_capacity`` is in bytes (e.g. ``80 * 2**30`` for an 80 GiB H100).
    ``devices_per_node`` and ``host_memory`` (bytes of CPU memory per node) matter for
    hierarchical sharding variants and offload.
    """

    name: str = attrs.field(validator=_str)
    # (Capacities are compared, not multiplied: up to 16 EiB, beyond any device or host.)
    memory_capacity: int = attrs.field(converter=_checks.to_int, validator=_checks.attrs_count(1, 2**64))
    memory_bandwidth: int | None = _optional_count(maximum=10**30)     # bytes per second (not a count of bytes)
    devices_per_node: int | None = _optional_count()
    host_memory: int | None = _optional_count(maximum=2**64)
    vendor: str | None = attrs.field(default=None, validator=_opt_str)

    def __attrs_post_init__(self):
        capacity = self.memory_capacity
        if capacity < MIB:
            raise InvalidInputError(
                f"{type(self).__name__}.memory_capacity", capacity,
                f"bytes, at least 1 MiB = {MIB}",
                f"memory_capacity is in bytes: for {capacity} GiB write {capacity * 2**30} "
                f"({capacity} * 2**30); for {capacity} GB, {capacity * 10**9}")
