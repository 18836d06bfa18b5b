"""The validated inputs of one solve (``TrainingPlan``) and what the rules made of them
(``Placement``). Plugins receive these two objects; neither ever holds an unchecked value.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import attrs

from .types import HardwareNode, TransformerWorkload

# Bytes per element of each precision, as in the reference model (core/units.py).
# Weights, gradients, activations and pipeline buffers all use this size.
PRECISION_BYTES: Mapping[str, int | float] = {
    "fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5,
}

# The reference model's stand-in for a missing hidden size (spec §6.2).
FALLBACK_HIDDEN_DIM = 4096


@attrs.frozen(kw_only=True, slots=False)
class TrainingPlan:
    """Everything a solve was asked, normalised and checked.

    Names are canonical (lowercase); counts are ints. Four derived values are plain
    attributes, computed once when the plan is made (plugins read them on every solve):
    ``bytes_per_value``, ``microbatch`` and ``hidden_dim`` (the values the reference model
    uses) and ``hidden_dim_note``. They are not fields: equality, hashing and
    ``attrs.evolve`` see only the inputs, and a plan made by ``attrs.evolve`` derives them
    afresh.
    """

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
    rules: Mapping[str, str]            # axis -> selected sharding rule name
    options: Mapping[str, Any]          # spec name -> its options object
    include_plugins: tuple[str, ...] = ()
    cp_size: int = 1                    # context parallelism: the sequence split over cp ranks
    # Measured-grade profiles only (None / defaults under the reference profile):
    regime: Any = None                  # mlsysim_core.measured.regimes.Regime
    optimizer_impl: str = "foreach"     # PyTorch's optimizer implementation: foreach | fused | for-loop
    attention: str = "sdpa"             # attention kernel: sdpa (fused, no s x s) | eager
    dropout: float = 0.0                # dropout probability in the layers
    checkpointed_layers: int | None = None   # block recompute: how many layers recompute (None: the strategy's)
    runtime_overheads: Any = None       # mlsysim_core.measured.model.RuntimeOverheads, or None: none
    lora: Any = None                    # mlsysim_core.finetune.LoRAConfig: LoRA/QLoRA fine-tuning, or None
    pipeline_schedule: str = "1f1b"     # gpipe | 1f1b | interleaved-1f1b | zb-h1 | zb-h2
    virtual_stages: int = 1             # model chunks per pipeline rank (interleaved-1f1b)
    expert_tp_size: int | None = None   # tensor parallelism inside the experts (None: tp_size)
    stage_layers: tuple[int, ...] | None = None   # decoder layers on each pipeline stage (None: even split)
    offload: tuple[tuple[str, str], ...] = ()   # (what, "cpu" | "nvme"): optimizer, gradients, parameters
    moe_capacity_factor: float | None = None   # experts' capacity factor (token dropping); None: dropless
    rank: Any = None                    # mlsysim_core.measured.parallel.RankClass: which rank this solve describes
    warnings: tuple[str, ...] = ()      # notes the result carries first (e.g. a parameter count off its shapes)

    def __attrs_post_init__(self):
        # The derived attributes. The class keeps a __dict__ (slots=False) so they can live
        # beside the fields; a frozen class is written through it, once, before anyone sees the plan.
        derived = self.__dict__
        derived["bytes_per_value"] = PRECISION_BYTES[self.precision]
        derived["microbatch"] = _microbatch(self.batch_size, self.dp_size, self.gradient_accumulation_steps)
        hidden = self.model.hidden_dim
        derived["hidden_dim"] = hidden or FALLBACK_HIDDEN_DIM
        derived["hidden_dim_note"] = "" if hidden else \
            f" (model has no hidden_dim; {FALLBACK_HIDDEN_DIM} assumed, as the reference does)"

    def with_accumulation(self, gradient_accumulation_steps: int) -> "TrainingPlan":
        """This plan with another number of accumulation steps (a positive int, not checked
        again): what a plan search makes for each micro-batch of one layout. Equal to
        ``attrs.evolve(plan, gradient_accumulation_steps=n)``, at a tenth of the cost."""
        fields = self.__dict__.copy()
        fields["gradient_accumulation_steps"] = gradient_accumulation_steps
        fields["microbatch"] = _microbatch(self.batch_size, self.dp_size, gradient_accumulation_steps)
        plan = _new(type(self))
        _set(plan, "__dict__", fields)
        return plan

    def options_for(self, spec_name: str):
        return self.options.get(spec_name)


def _microbatch(batch_size: int, dp_size: int, gradient_accumulation_steps: int) -> int:
    """Local micro-batch: the global batch over DP replicas and accumulation steps, rounded
    up and at least 1 (reference §6.2)."""
    return max(1, math.ceil(batch_size / (dp_size * gradient_accumulation_steps)))


_new = object.__new__
_set = object.__setattr__


@attrs.frozen(kw_only=True)
class Placement:
    """How the selected sharding rules split the model over ranks, for one rank.

    Shard factors are integer products over all selected rules; the per-rank parameter
    counts are divided once (``parameters / parameter_shards``), keeping fractional
    parameters as the reference model does.
    """

    parameter_shards: int
    parameters_per_rank: float
    trainable_parameters_per_rank: float
    layers_per_stage: int
    activation_shards: int
    weight_shards: int
    gradient_shards: int
    optimizer_state_shards: int
    shard_sources: Mapping[str, tuple[str, ...]]   # quantity -> rules that split it
