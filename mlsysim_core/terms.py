"""Memory terms: the unit every estimate is built from.

A term is one explainable amount of memory: its component (weights, gradients, ...), its
bytes, a short label, the formula with the numbers put in, and the plugin that produced it.
It also carries the facts later profiles need even where the reference profile ignores
them: the phases of an iteration in which the bytes are alive, the pipeline stage or rank
class it belongs to, and the memory tier (accelerator or host).
"""

from __future__ import annotations

import math

import attrs

# Components, in the order the solver assembles and reports them.
WEIGHTS = "weights"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
COMMUNICATION_BUFFERS = "communication_buffers"
COMPONENTS = (WEIGHTS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, COMMUNICATION_BUFFERS)

# Phases of one steady-state training iteration. A term lists those in which it is alive;
# the reference profile sums every term regardless, a measured-grade profile takes the peak.
FORWARD = "forward"
BACKWARD = "backward"
OPTIMIZER_STEP = "optimizer_step"
PHASES = (FORWARD, BACKWARD, OPTIMIZER_STEP)

# Memory tiers.
ACCELERATOR = "accelerator"
HOST = "host"
TIERS = (ACCELERATOR, HOST)


def _finite_non_negative(instance, attribute, value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"MemoryTerm.{attribute.name} must be an int or float number of bytes, "
                        f"got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"MemoryTerm.{attribute.name} must be a finite number of bytes >= 0, "
                         f"got {value!r}")


def _phases(value) -> tuple[str, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class MemoryTerm:
    """One explainable amount of memory.

    ``nbytes`` is exact: an ``int``, or a ``float`` where a formula is fractional (the
    reference profile keeps fractional bytes, as the reference model does). ``source`` is
    stamped by the solver with the name of the plugin that produced the term; whatever a
    plugin puts there is overwritten, so provenance can be trusted.
    """

    component: str = attrs.field(validator=attrs.validators.in_(COMPONENTS))
    label: str = attrs.field(validator=attrs.validators.instance_of(str))
    nbytes: int | float = attrs.field(validator=_finite_non_negative)
    formula: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    source: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    phases: tuple[str, ...] = attrs.field(
        default=PHASES, converter=_phases,
        validator=attrs.validators.deep_iterable(attrs.validators.in_(PHASES)))
    tier: str = attrs.field(default=ACCELERATOR, validator=attrs.validators.in_(TIERS))
    pipeline_stage: int | None = attrs.field(default=None)
    rank: str | None = attrs.field(default=None)

    @property
    def gb(self) -> float:
        """Decimal gigabytes (1 GB = 1e9 bytes)."""
        return self.nbytes * 1e-9

    @property
    def gib(self) -> float:
        """Binary gibibytes (1 GiB = 2**30 bytes)."""
        return self.nbytes / 2**30
