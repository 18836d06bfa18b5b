"""Memory terms: the unit every estimate is built from.

A term is one explainable amount of memory: its component (weights, gradients, ...), its
bytes, a short label, the formula with the numbers put in, and the plugin that produced it.
It also carries the facts later profiles need even where the reference profile ignores
them: the phases of an iteration in which the bytes are alive, the pipeline stage or rank
class it belongs to, and the memory tier (accelerator or host).
"""

from __future__ import annotations

import contextvars
import numbers

import attrs

# Components, in the order the solver assembles and reports them.
WEIGHTS = "weights"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
COMMUNICATION_BUFFERS = "communication_buffers"
RUNTIME_OVERHEADS = "runtime_overheads"   # CUDA context, allocator, library workspaces (measured profile)
COMPONENTS = (WEIGHTS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, COMMUNICATION_BUFFERS, RUNTIME_OVERHEADS)

# Phases of one steady-state training iteration, as instants where memory peaks. A term
# lists those in which it is alive; the reference profile sums every term regardless, a
# measured-grade profile takes the peak.
#   forward        the end of the forward: the loss computed, every saved activation alive
#   backward       the first backward ops: activations still alive, the loss gradients on top
#   backward_end   the end of the backward: every gradient alive, activations freed
#   optimizer_step the optimizer step: gradients, state and the step's temporaries
FORWARD = "forward"
BACKWARD = "backward"
BACKWARD_END = "backward_end"
OPTIMIZER_STEP = "optimizer_step"
PHASES = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)

# Memory tiers.
ACCELERATOR = "accelerator"
HOST = "host"
NVME = "nvme"
TIERS = (ACCELERATOR, HOST, NVME)


_COMPONENT_SET = frozenset(COMPONENTS)
_PHASE_SET = frozenset(PHASES)
_TIER_SET = frozenset(TIERS)
_INF = float("inf")

# While the solver calls a plugin, this names it: terms the plugin creates are stamped
# with it by default, so provenance costs nothing on the hot path (and a term made
# elsewhere, or claiming another source, is re-stamped by the solver).
_current_source: contextvars.ContextVar[str] = contextvars.ContextVar("mlsysim_term_source", default="")
# The solver's pipeline sets this once per run to a one-item list and writes the name of
# the plugin it calls into it before each call (a list store, not a context change per
# call); outside a pipeline it is None and ``_current_source`` names the source.
_source_cell: contextvars.ContextVar[list | None] = contextvars.ContextVar("mlsysim_term_source_cell",
                                                                           default=None)
_get_cell = _source_cell.get


def _default_source() -> str:
    cell = _get_cell()
    return cell[0] if cell is not None else _current_source.get()


@attrs.frozen(kw_only=True)
class MemoryTerm:
    """One explainable amount of memory.

    ``nbytes`` is exact: an ``int``, or a ``float`` where a formula is fractional (the
    reference profile keeps fractional bytes, as the reference model does); it must be
    finite and >= 0. ``source`` is stamped by the solver with the name of the plugin that
    produced the term; whatever a plugin puts there is overwritten, so provenance can be
    trusted. ``phases`` lists the phases of an iteration in which the bytes are alive;
    ``tier`` is ``"accelerator"`` or ``"host"``; ``pipeline_stage`` and ``rank`` say which
    stage or rank class the term belongs to (``None``: every one alike).
    """

    component: str
    label: str
    nbytes: int | float
    formula: str = ""
    source: str = attrs.field(factory=_default_source)
    phases: tuple[str, ...] = PHASES
    tier: str = ACCELERATOR
    pipeline_stage: int | None = None
    rank: str | None = None

    # Hand-written checks instead of attrs validators: terms are built on every solve.
    def __attrs_post_init__(self):
        nbytes = self.nbytes
        kind = type(nbytes)
        if kind is not float and kind is not int:
            if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
                raise TypeError(f"MemoryTerm.nbytes must be an int or float number of bytes, "
                                f"got {kind.__name__} {nbytes!r}")
            object.__setattr__(self, "nbytes", float(nbytes) if not isinstance(nbytes, numbers.Integral)
                               else int(nbytes))
            nbytes = self.nbytes
        if not 0 <= nbytes < _INF:   # also false for NaN
            raise ValueError(f"MemoryTerm.nbytes must be a finite number of bytes >= 0, got {nbytes!r} "
                             f"(term {self.label!r})")
        if self.component not in _COMPONENT_SET:
            raise ValueError(f"MemoryTerm.component={self.component!r} is not one of {', '.join(COMPONENTS)}")
        if type(self.label) is not str or type(self.formula) is not str or type(self.source) is not str:
            raise TypeError(f"MemoryTerm.label, formula and source must be str, got {self.label!r}, "
                            f"{self.formula!r}, {self.source!r}")
        if self.phases is not PHASES:
            phases = tuple(self.phases)
            if not _PHASE_SET.issuperset(phases):
                raise ValueError(f"MemoryTerm.phases={phases!r}: each must be one of {', '.join(PHASES)}")
            object.__setattr__(self, "phases", phases)
        if self.tier is not ACCELERATOR and self.tier not in _TIER_SET:
            raise ValueError(f"MemoryTerm.tier={self.tier!r} is not one of {', '.join(TIERS)}")

    @property
    def gb(self) -> float:
        """Decimal gigabytes (1 GB = 1e9 bytes)."""
        return self.nbytes * 1e-9

    @property
    def gib(self) -> float:
        """Binary gibibytes (1 GiB = 2**30 bytes)."""
        return self.nbytes / 2**30
