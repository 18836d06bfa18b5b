"""The answer of one solve: totals, feasibility and the terms they are made of."""

from __future__ import annotations

import json
from typing import Mapping

import attrs

from .errors import InvalidInputError
from .terms import ACCELERATOR, COMPONENTS, PHASES, MemoryTerm


def _phase_totals(terms, component: str | None = None) -> dict:
    totals = dict.fromkeys(PHASES, 0)
    for term in terms:
        if term.tier == ACCELERATOR and (component is None or term.component == component):
            for phase in term.phases:
                totals[phase] += term.nbytes
    return totals


_PHASE_TOTALS = property(lambda self: _phase_totals(self.terms),     # a result's and a rank's
                         doc="Accelerator bytes alive in each phase of an iteration (whatever the combine rule).")


@attrs.frozen(kw_only=True)
class RankReport:
    """The memory of one rank class of a parallel layout (a stage, or the middle stages alike), in bytes."""

    name: str                       # "first stage", "middle stage 1", "last stage", "every rank"
    stages: tuple[int, ...]         # the pipeline stages (0-based) in this class
    ranks: int                      # devices in this class
    layers: int                     # decoder layers on each of its stages
    in_flight: float                # micro-batches of activations held at the peak
    total_memory: int | float
    weights: int | float
    gradients: int | float
    optimizer_state: int | float
    activations: int | float
    communication_buffers: int | float
    runtime_overheads: int | float
    host_memory: int | float
    peak_phase: str | None
    feasible: bool
    terms: tuple[MemoryTerm, ...] = ()   # every term of this rank: where each byte comes from
    phase_totals = _PHASE_TOTALS


@attrs.frozen(kw_only=True)
class TrainingMemoryResult:
    """Memory of one accelerator for one configuration, in bytes; the reference result's fields."""

    feasible: bool
    total_memory: int | float
    available_memory: int
    memory_utilization: float
    weights: int | float
    gradients: int | float
    optimizer_state: int | float
    activations: int | float
    communication_buffers: int | float
    precision: str
    optimizer: str
    activation_checkpointing: str
    parallelism: Mapping[str, int]
    notes: tuple[str, ...]          # what the sharding rules said; see constraint_trace
    # Beyond the reference: where the bytes come from and what the rules decided.
    profile: str
    terms: tuple[MemoryTerm, ...]
    host_memory: int | float = 0
    model: str = ""
    hardware: str = ""
    microbatch: int = 1
    layers_per_stage: int = 1
    sequence_parallel: bool = True
    selected: Mapping[str, str] = attrs.field(factory=dict)   # role -> spec name
    # A "peak" profile: the phase whose live bytes are the total (and the components). None: summed.
    peak_phase: str | None = None
    plugin_sources: Mapping[str, str] = attrs.field(factory=dict)  # plugin -> "dist version"
    # CUDA context, allocator, workspaces (in total_memory); what the profile says of the run.
    runtime_overheads: int | float = 0
    details: Mapping[str, str] = attrs.field(factory=dict)
    # Parallel layouts (ProfileSpec.ranks): every distinct rank class; the fields above are the heaviest's.
    ranks: tuple["RankReport", ...] = ()
    heaviest_rank: str | None = None

    @property
    def allocated_memory(self) -> int | float:
        """The total without runtime overheads (what ``torch.cuda.max_memory_allocated`` reports)."""
        return self.total_memory - self.runtime_overheads

    @property
    def gb(self):
        """Memory fields in decimal GB (1 GB = 1e9 bytes): a ``render.MemoryView``."""
        from .render import MemoryView
        return MemoryView(self, "GB")

    @property
    def gib(self):
        """Memory fields in binary GiB (1 GiB = 2**30 bytes): a ``render.MemoryView``."""
        from .render import MemoryView
        return MemoryView(self, "GiB")

    phase_totals = _PHASE_TOTALS

    @property
    def constraint_trace(self) -> tuple[str, ...]:
        """The reference's trace: a summary line in GB (with runtime overheads if any), then the rules' notes."""
        from .render import trace_summary
        return (trace_summary(self),) + self.notes

    @property
    def headroom(self) -> int | float:
        """Bytes left on the accelerator (negative when it does not fit)."""
        return self.available_memory - self.total_memory

    def terms_of(self, component: str) -> tuple[MemoryTerm, ...]:
        if component not in COMPONENTS:
            raise InvalidInputError("component", component, f"one of {', '.join(COMPONENTS)}")
        return tuple(t for t in self.terms if t.component == component)

    def to_dict(self) -> dict:     # (the output edge, render.py, writes and reads a result's JSON)
        from .render import unstructure_result
        return unstructure_result(self)

    def to_json(self, **kwargs) -> str:
        return json.dumps(self.to_dict(), **{"sort_keys": True, **kwargs})

    @classmethod
    def from_json(cls, text: str) -> "TrainingMemoryResult":
        """A result written by ``to_json``, checked (``InvalidInputError`` naming the field); without
        ``schema_version`` (older) fields with defaults may be left out."""
        from .render import result_from_json
        return result_from_json(text)

    def explain(self, registry=None) -> str:
        """A plain-text tree of where every byte comes from (``registry``: whose explanations it quotes)."""
        from .render import explain
        return explain(self, registry=registry)

    def to_html(self) -> str:
        """An HTML table: components (GB, GiB, share, plugins), total, capacity, verdict."""
        from .render import to_html
        return to_html(self)

    _repr_html_ = to_html     # Jupyter shows results as this table

