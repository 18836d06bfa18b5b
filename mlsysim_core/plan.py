"""What plugins receive: the checked inputs of a solve (``TrainingPlan``) and the rules' ``Placement``."""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs

from .types import HardwareNode, TransformerWorkload

# Bytes per element of each precision, as in the reference model (weights, gradients, activations).
PRECISION_BYTES: Mapping[str, int | float] = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1,
                                               "int8": 1, "int4": 0.5}
# The reference model's stand-in for a missing hidden size (spec §6.2).
FALLBACK_HIDDEN_DIM = 4096


class FrozenMap(dict):
    """A read-only, hashable dict (the plan's mappings: a plan is a memo key)."""

    __slots__ = ("_hash",)

    def __hash__(self):
        try:
            return self._hash
        except AttributeError:       # computed once: the mapping never changes
            self._hash = hash(tuple(self.items()))
            return self._hash

    def _read_only(self, *args, **kwargs):
        raise TypeError("a plan's mappings are read-only")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _read_only


@attrs.frozen(kw_only=True, slots=False, cache_hash=True)
class TrainingPlan:
    """Everything a solve was asked, checked and hashable; ``bytes_per_value``, ``microbatch``,
    ``hidden_dim`` and ``hidden_dim_note`` are derived attributes, not fields."""

    model: TransformerWorkload
    hardware: HardwareNode
    batch_size: int
    seq_len: int
    precision: str
    optimizer: str
    activation_checkpointing: str
    tp_size: int
    pp_size: int
    dp_size: int
    ep_size: int
    zero_stage: int
    gradient_accumulation_steps: int
    trainable_fraction: float
    communication_buffer_fraction: float
    sequence_parallel: bool
    profile: str
    rules: FrozenMap                    # axis -> selected sharding rule name
    options: FrozenMap                  # spec name -> its options object
    include_plugins: tuple[str, ...] = ()
    cp_size: int = 1                    # context parallelism: the sequence split over cp ranks
    profile_options: Any = None         # the profile's own options object (ProfileSpec.options_type), checked
    rank: Any = None                    # which rank of a parallel layout this solve describes (ProfileSpec.ranks)
    notes: tuple[str, ...] = ()         # what the result says first (e.g. an approximation, a parameter count off)

    def __attrs_post_init__(self):   # the derived attributes, written once through __dict__ (slots=False)
        derived = self.__dict__
        derived["bytes_per_value"] = PRECISION_BYTES[self.precision]
        # The local micro-batch, rounded up and at least 1 (reference §6.2).
        derived["microbatch"] = max(1, math.ceil(self.batch_size / (self.dp_size * self.gradient_accumulation_steps)))
        hidden = self.model.hidden_dim
        derived["hidden_dim"] = hidden or FALLBACK_HIDDEN_DIM
        derived["hidden_dim_note"] = "" if hidden else \
            f" (model has no hidden_dim; {FALLBACK_HIDDEN_DIM} assumed, as the reference does)"

    _UNDERIVED = frozenset(("profile_options", "rank", "notes"))    # (read by no derived attribute, no validator)
    def evolve(self, **changes) -> "TrainingPlan":
        """``attrs.evolve(self, **changes)``; for fields no derived attribute reads, without ``__init__``."""
        if not self._UNDERIVED.issuperset(changes):
            return attrs.evolve(self, **changes)
        (plan := object.__new__(type(self))).__dict__.update(self.__dict__, **changes, _attrs_cached_hash=None)
        return plan

    def options_for(self, spec_name: str):
        return self.options.get(spec_name)


@attrs.frozen(kw_only=True)
class Shards:
    """What the rules split for one rank: integer factors (1: not split), multiplied over the rules;
    the fields ``ShardingEffect``, ``SplitSoFar`` and ``Placement`` share."""

    parameter_shards: int = 1
    activation_shards: int = 1
    weight_shards: int = 1
    gradient_shards: int = 1
    optimizer_state_shards: int = 1
    tensor_shards: int = 1      # ranks each weight matrix is split over (as its tensor class says)
    sequence_shards: int = 1    # ranks each sequence's tokens are split over (context parallel)
    expert_shards: int = 1      # ranks the routed experts are spread over
    pipeline_stages: int = 1    # stages the layer stack is split into


@attrs.frozen(kw_only=True, cache_hash=True)
class Placement(Shards):
    """How the selected rules split the model for one rank: integer products over the rules."""

    parameters_per_rank: float
    trainable_parameters_per_rank: float
    layers_per_stage: int
    shard_sources: Mapping[str, tuple[str, ...]]   # quantity -> rules that split it
