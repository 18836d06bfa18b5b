"""Memory terms, the unit every estimate is built from, and the component, phase and tier names."""

from __future__ import annotations

import contextvars
import numbers
import re

import attrs

# Components, in the order the solver assembles and reports them.
WEIGHTS = "weights"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
COMMUNICATION_BUFFERS = "communication_buffers"
RUNTIME_OVERHEADS = "runtime_overheads"   # CUDA context, allocator, library workspaces (measured profile)
COMPONENTS = (WEIGHTS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS, COMMUNICATION_BUFFERS, RUNTIME_OVERHEADS)
# Phases of one iteration, the instants where memory peaks: the forward's end, the first backward ops,
# the backward's end, the optimizer step.
FORWARD = "forward"
BACKWARD = "backward"
BACKWARD_END = "backward_end"
OPTIMIZER_STEP = "optimizer_step"
PHASES = (FORWARD, BACKWARD, BACKWARD_END, OPTIMIZER_STEP)
ACCELERATOR = "accelerator"    # memory tiers
HOST = "host"
NVME = "nvme"
TIERS = (ACCELERATOR, HOST, NVME)
_COMPONENT_SET, _PHASE_SET, _TIER_SET = frozenset(COMPONENTS), frozenset(PHASES), frozenset(TIERS)
# The solver writes the name of each plugin it calls here: terms it creates are stamped with it.
_source_cell = contextvars.ContextVar("mlsysim_term_source_cell", default=None)   # [plugin name] or None
_get_cell = _source_cell.get
_key_match = re.compile(r"[a-z][a-z0-9_]*(?:\.[a-z][a-z0-9_]*)*").fullmatch    # "rope_tables", "myplugin.kv_cache"


def _default_source() -> str:
    cell = _get_cell()
    return cell[0] if cell is not None else ""


@attrs.frozen(kw_only=True)
class MemoryTerm:
    """One explainable amount of memory: component, exact bytes, label (for people), formula, the plugin that
    made it; ``phases``: when alive; ``tier``: where; ``key``: the stable machine id code selects it by ("": none)."""

    component: str
    label: str
    nbytes: int | float
    formula: str = ""
    source: str = attrs.field(factory=_default_source)
    phases: tuple[str, ...] = PHASES
    tier: str = ACCELERATOR
    pipeline_stage: int | None = None
    rank: str | None = None
    key: str = ""

    # Hand-written checks instead of attrs validators: terms are built on every solve.
    def __attrs_post_init__(self):
        nbytes, kind = self.nbytes, type(self.nbytes)
        if kind is not float and kind is not int:
            if isinstance(nbytes, bool) or not isinstance(nbytes, numbers.Real):
                raise TypeError(f"MemoryTerm.nbytes must be an int or float number of bytes, "
                                f"got {kind.__name__} {nbytes!r}")
            nbytes = int(nbytes) if isinstance(nbytes, numbers.Integral) else float(nbytes)
            object.__setattr__(self, "nbytes", nbytes)
        if not 0 <= nbytes < float("inf"):   # also false for NaN
            raise ValueError(f"MemoryTerm.nbytes must be a finite number of bytes >= 0, got {nbytes!r} "
                             f"(term {self.label!r})")
        if self.component not in _COMPONENT_SET:
            raise ValueError(f"MemoryTerm.component={self.component!r} is not one of {', '.join(COMPONENTS)}")
        if (type(self.label) is not str or type(self.formula) is not str or type(self.source) is not str
                or type(self.key) is not str):
            raise TypeError(f"MemoryTerm.label, formula, source and key must be str, got {self.label!r}, "
                            f"{self.formula!r}, {self.source!r}, {self.key!r}")
        if self.key and _key_match(self.key) is None:
            raise ValueError(f"MemoryTerm.key={self.key!r}: '' or lowercase words joined by '_' or '.' ('rope_tables')")
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
