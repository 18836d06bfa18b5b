"""The things a solve is about: a model and an accelerator, frozen; counts are ints, memory bytes."""

from __future__ import annotations

from typing import Mapping

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError

MIB = 2**20     # a device with less memory than this is a unit mistake (bytes, not GiB)


def _string(name: str, value: object, optional: bool = False) -> None:   # a name; optional: any string (or None)
    allowed = "a string or None" if optional else "a non-empty string"
    if not isinstance(value, str):
        raise InvalidInputTypeError(name, value, allowed, f"got {type(value).__name__}")
    if not (optional or value.strip()):
        raise InvalidInputError(name, value, allowed)


def _count(minimum=1, maximum=_checks.MAX_COUNT, default=attrs.NOTHING):   # default=None: optional
    return attrs.field(default=default, converter=_checks.to_int,
                       validator=_checks.attrs_check(_checks.count, default is None, minimum=minimum, maximum=maximum))


_name = attrs.field(validator=_checks.attrs_check(_string))
_optional_str = attrs.field(default=None, validator=_checks.attrs_check(_string, True, optional=True))
_optional_flag = attrs.field(default=None, validator=_checks.attrs_check(_checks.flag, allow_none=True))


@attrs.frozen(kw_only=True, cache_hash=True)     # (memo keys hash it: once per object)
class TransformerWorkload:
    """A dense transformer: ``name``, ``parameters`` (total) and ``layers`` required; None: unknown."""

    name: str = _name
    parameters: int = _count()
    layers: int = _count()
    hidden_dim: int | None = _count(default=None)
    heads: int | None = _count(default=None)
    kv_heads: int | None = _count(default=None)   # GQA/MQA; None = same as heads
    head_dim: int | None = _count(default=None)   # None = hidden_dim // heads
    vocab_size: int | None = _count(default=None)
    ffn_dim: int | None = _count(default=None)    # MLP intermediate width
    gated_mlp: bool | None = _optional_flag   # SwiGLU/GeGLU (3 matrices) vs plain (2)
    tied_embeddings: bool | None = _optional_flag
    context_length: int | None = _count(default=None)
    kv_lora_rank: int | None = _count(default=None)   # MLA (DeepSeek)
    qk_rope_head_dim: int | None = _count(default=None)
    architecture: str | None = _optional_str
    # What an architecture family reads beyond these fields (HF config keys), read-only.
    details: Mapping = attrs.field(factory=dict, converter=lambda v: _frozen(v or {}))

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
                                    f"a multiple of heads={heads} (hidden_dim = heads x head_dim), or set head_dim",
                                    f"without head_dim each head would be {self.hidden_dim / heads:g} wide")

    is_sparse = False     # a class attribute, not a field


def _frozen(value):     # a hashable copy of a JSON-like value: read-only maps, tuples
    from .plan import FrozenMap
    if isinstance(value, Mapping):
        return FrozenMap((str(k), _frozen(v)) for k, v in value.items())
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


@attrs.frozen(kw_only=True, cache_hash=True)     # (memo keys hash it: once per object)
class SparseTransformerWorkload(TransformerWorkload):
    """A mixture-of-experts transformer: ``parameters`` over all experts, ``active_parameters`` per token."""

    active_parameters: int = _count()
    experts: int = _count()
    active_experts_per_token: int = _count(default=1)
    shared_experts: int | None = _count(0, default=None)
    expert_ffn_dim: int | None = _count(default=None)

    def __attrs_post_init__(self):
        super().__attrs_post_init__()
        for field, limit in ("active_parameters", "parameters"), ("active_experts_per_token", "experts"):
            if getattr(self, field) > getattr(self, limit):
                raise InvalidInputError(f"{type(self).__name__}.{field}", getattr(self, field),
                                        f"at most {limit}={getattr(self, limit)}")

    is_sparse = True


@attrs.frozen(kw_only=True, cache_hash=True)     # (memo keys hash it: once per object)
class HardwareNode:
    """One accelerator: memory in bytes, peak FLOP/s dense, bandwidths in bytes/s per device one way."""

    name: str = _name
    memory_capacity: int = _count(1, 2**64)   # compared, not multiplied: up to 16 EiB
    memory_bandwidth: int | None = _count(maximum=10**30, default=None)   # bytes per second (not a count of bytes)
    devices_per_node: int | None = _count(default=None)
    host_memory: int | None = _count(maximum=2**64, default=None)
    vendor: str | None = _optional_str
    peak_bf16_flops: int | None = _count(maximum=10**30, default=None)    # FLOP/s, dense
    peak_fp8_flops: int | None = _count(maximum=10**30, default=None)
    intra_node_bandwidth: int | None = _count(maximum=10**30, default=None)   # B/s per device, one way
    inter_node_bandwidth: int | None = _count(maximum=10**30, default=None)

    def __attrs_post_init__(self):
        capacity = self.memory_capacity
        if capacity < MIB:
            raise InvalidInputError(
                f"{type(self).__name__}.memory_capacity", capacity, f"bytes, at least 1 MiB = {MIB}",
                f"memory_capacity is in bytes: for {capacity} GiB write {capacity * 2**30} "
                f"({capacity} * 2**30); for {capacity} GB, {capacity * 10**9}")
