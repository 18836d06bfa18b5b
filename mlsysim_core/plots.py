"""Pictures of results: stacked bars, a timeline over one iteration, and sweeps.

matplotlib is an optional extra (``pip install 'mlsysim-core[plot]'``); it is imported
only inside the drawing functions, so ``import mlsysim_core.plots`` always works and the
numbers behind every picture (`phase_bytes`, `peak_phase`, `sweep`)
need no matplotlib at all.

Every drawing function returns a ``matplotlib.figure.Figure`` (no pyplot, no global
state) and, given ``path``, also saves it: PNG or SVG by the file's extension. Memory
axes are in GB (1e9 bytes) on the left and GiB (2**30 bytes) on the right.

    >>> from mlsysim_core import TrainingMemoryModel
    >>> from mlsysim_core.plots import plot_bars
    >>> solver = TrainingMemoryModel()
    >>> results = [solver.solve("llama3-8b", "h100", 64, 1024, dp_size=8, zero_stage=z)
    ...            for z in range(4)]
    >>> fig = plot_bars(results, labels=[f"ZeRO-{z}" for z in range(4)], path="zero.png")
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

import attrs

from .errors import InvalidInputError, MlsysimError
from .terms import ACCELERATOR, COMPONENTS, PHASES

GB = 1e9
GIB = 2**30
EXTRA_HINT = "pip install 'mlsysim-core[plot]'"

# One colour per component, the same in every picture (matplotlib's tab10).
COLORS = {"weights": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c",
          "activations": "#d62728", "communication_buffers": "#9467bd"}
CAPACITY_COLOR = "#222222"
FORMATS = {".png": "png", ".svg": "svg"}
SWEEPS = {"batch": "micro-batch", "seq": "sequence length"}


class PlotExtraMissingError(MlsysimError, ImportError):
    """matplotlib is not installed; the message says how to install the extra."""


def _matplotlib():
    try:
        import matplotlib
        from matplotlib.figure import Figure
    except ImportError as err:
        raise PlotExtraMissingError(
            f"plotting needs matplotlib, which is not installed: {EXTRA_HINT}") from err
    major, minor = (int(x) for x in matplotlib.__version__.split(".")[:2])
    if (major, minor) < (3, 7):
        raise PlotExtraMissingError(
            f"plotting needs matplotlib >= 3.7, found {matplotlib.__version__}: {EXTRA_HINT}")
    return Figure


def _name(component: str) -> str:
    return component.replace("_", " ")


def _checkpointing(result) -> str:
    ckpt = result.activation_checkpointing
    return "no activation checkpointing" if ckpt == "none" else f"{ckpt} checkpointing"


# --- the numbers behind the pictures (no matplotlib) ----------------------------------------

def phase_bytes(result) -> dict[str, dict[str, float]]:
    """Bytes alive in each phase, by component: ``{phase: {component: bytes}}``.

    A term counts in every phase its ``phases`` list; only accelerator-tier terms count.
    This is liveness, not the profile's total: the reference profile adds every term up
    whatever its phases, so its total is at least the peak here.
    """
    alive = {phase: dict.fromkeys(COMPONENTS, 0) for phase in PHASES}
    for term in result.terms:
        if term.tier != ACCELERATOR:
            continue
        for phase in term.phases:
            alive[phase][term.component] += term.nbytes
    return alive


def peak_phase(result) -> tuple[str, float]:
    """The phase with the most bytes alive, and those bytes (the first such phase on a tie)."""
    totals = {phase: sum(by_component.values()) for phase, by_component in phase_bytes(result).items()}
    phase = max(PHASES, key=lambda p: totals[p])
    return phase, totals[phase]


@attrs.frozen
class Sweep:
    """Results of one scenario solved at several values of one parameter.

    ``parameter`` is ``"batch"`` (the values are micro-batches per accelerator; the global
    batch solved is value x dp x gradient-accumulation steps) or ``"seq"`` (sequence
    lengths).
    """

    parameter: str
    values: tuple[int, ...]
    results: tuple  # TrainingMemoryResult, one per value
    scenario: object = None

    @property
    def fitting(self) -> tuple[int, ...]:
        """The values whose configuration fits."""
        return tuple(v for v, r in zip(self.values, self.results) if r.feasible)

    @property
    def largest_fitting(self) -> int | None:
        """The largest value that fits, or None if none does."""
        return max(self.fitting, default=None)

    @property
    def label(self) -> str:
        return SWEEPS[self.parameter]


def sweep(scenario, parameter: str, values: Iterable[int], *, solver=None, model=None,
          hardware=None) -> Sweep:
    """Solve ``scenario`` (a `~mlsysim_core.scenario.Scenario`) at each value.

    ``parameter`` is ``"batch"`` (micro-batch per accelerator) or ``"seq"`` (sequence
    length). ``solver`` is a ``TrainingMemoryModel`` (a new one by default); ``model``
    and ``hardware`` replace the scenario's (e.g. objects already read from files).
    """
    if parameter not in SWEEPS:
        raise InvalidInputError("sweep", parameter, "batch (micro-batch) or seq (sequence length)")
    values = tuple(values)
    if not values:
        raise InvalidInputError("values", values, "at least one value")
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise InvalidInputError("values", v, "whole numbers >= 1")
    values = tuple(sorted(set(values)))
    if solver is None:
        from .solver import TrainingMemoryModel
        solver = TrainingMemoryModel()
    model = scenario.resolve_model() if model is None else model
    hardware = scenario.resolve_hardware() if hardware is None else hardware
    results = []
    for v in values:
        if parameter == "batch":
            changed = attrs.evolve(scenario, batch_size=v * scenario.dp_size * scenario.gradient_accumulation_steps)
        else:
            changed = attrs.evolve(scenario, seq_len=v)
        results.append(solver.solve(model, hardware, **changed.solve_kwargs()))
    return Sweep(parameter=parameter, values=values, results=tuple(results), scenario=scenario)


def default_labels(results: Sequence) -> list[str]:
    """Labels for several results: the settings in which they differ (or their position)."""
    def zero(r):
        rule = r.selected.get("dp_rule", "?")
        return f"ZeRO-{rule[4:]}" if rule in ("zero0", "zero1", "zero2", "zero3") else rule

    def par(r):
        return " ".join(f"{k}={v}" for k, v in sorted(r.parallelism.items()) if v != 1) or "1 rank"

    facets = [("model", lambda r: r.model), ("hardware", lambda r: r.hardware),
              ("profile", lambda r: r.profile), ("precision", lambda r: r.precision),
              ("optimizer", lambda r: r.optimizer), ("ckpt", lambda r: r.activation_checkpointing),
              ("mb", lambda r: f"mb={r.microbatch}"), ("dp rule", zero), ("layout", par)]
    differing = [f for _, f in facets if len({f(r) for r in results}) > 1]
    if not differing:
        return [f"#{i + 1}" for i in range(len(results))] if len(results) > 1 else [results[0].model]
    return ["\n".join(str(f(r)) for f in differing) for r in results]


# --- drawing helpers ----------------------------------------------------------------------

def save(fig, path) -> Path:
    """Save ``fig`` to ``path``: PNG or SVG by its extension."""
    path = Path(path)
    fmt = FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise InvalidInputError("output", str(path), "a file name ending in .png or .svg")
    path.parent.mkdir(parents=True, exist_ok=True)
    # A fixed SVG hash salt and no date metadata: the same picture gives the same file.
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    import matplotlib
    with matplotlib.rc_context({"svg.hashsalt": "mlsysim-core"}):
        fig.savefig(path, format=fmt, dpi=120, metadata=metadata)
    return path


def _gib_axis(ax):
    """A secondary y axis on the right in GiB for a primary axis in GB."""
    sec = ax.secondary_yaxis("right", functions=(lambda gb: gb * GB / GIB, lambda gib: gib * GIB / GB))
    sec.set_ylabel("GiB (2^30 bytes)")
    return sec


def _style(ax):
    ax.set_ylabel("GB (1e9 bytes)")
    ax.grid(axis="y", color="#dddddd", linewidth=0.8)
    ax.set_axisbelow(True)
    ax.spines["top"].set_visible(False)


def _capacity_label(result) -> str:
    cap = result.available_memory
    return f"capacity {result.hardware}: {cap / GB:,.1f} GB = {cap / GIB:,.1f} GiB"


def _finish(fig, path):
    if path is not None:
        save(fig, path)
    return fig


def _legend_handles(present: Sequence[str]) -> list:
    from matplotlib.patches import Patch
    return [Patch(facecolor=COLORS[c], label=_name(c)) for c in present]


_LABEL_BOX = {"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "none", "alpha": 0.95}


# --- (a) stacked bars ------------------------------------------------------------------------

def plot_bars(results, labels: Sequence[str] | None = None, *, title: str | None = None,
              path=None, figsize=None):
    """Stacked bars of the five components, one bar per result, with the capacity.

    ``results`` is one result or a list (several configurations, ZeRO stages, ...);
    ``labels`` name the bars (by default, the settings in which the results differ).
    The capacity is a dashed line (one per bar when the accelerators differ); each bar
    is topped by its total and its percentage of the capacity.
    """
    Figure = _matplotlib()
    from matplotlib.lines import Line2D
    results = [results] if not isinstance(results, (list, tuple)) else list(results)
    if not results:
        raise InvalidInputError("results", results, "at least one result")
    labels = list(labels) if labels is not None else default_labels(results)
    if len(labels) != len(results):
        raise InvalidInputError("labels", labels, f"one label per result ({len(results)})")
    n = len(results)
    fig = Figure(figsize=figsize or (max(6.4, 1.3 * n + 4.2), 5.4), layout="constrained")
    ax = fig.add_subplot()
    _style(ax)
    x = list(range(n))
    bottoms = [0.0] * n
    present = [c for c in COMPONENTS if any(getattr(r, c) for r in results)]
    for component in present:
        heights = [getattr(r, component) / GB for r in results]
        ax.bar(x, heights, 0.6, bottom=bottoms, color=COLORS[component], edgecolor="white",
               linewidth=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    capacities = {r.available_memory for r in results}
    top = max(max(bottoms), max(c / GB for c in capacities))
    for xi, r in zip(x, results):
        pct = 100 * r.memory_utilization
        ax.annotate(f"{r.total_memory / GB:,.1f} GB\n{pct:.0f} % of cap.", (xi, r.total_memory / GB),
                    xytext=(0, 3), textcoords="offset points", ha="center", va="bottom", fontsize=8.5,
                    color="#222222" if r.feasible else "#b00020", bbox=_LABEL_BOX, zorder=5)
    handles = _legend_handles(present)
    if len(capacities) == 1:
        cap = results[0].available_memory / GB
        ax.axhline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.4)
        handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--", label=_capacity_label(results[0])))
    else:
        for xi, r in zip(x, results):
            ax.hlines(r.available_memory / GB, xi - 0.42, xi + 0.42, color=CAPACITY_COLOR,
                      linestyle="--", linewidth=1.4)
        handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--",
                              label="capacity of each bar's accelerator"))
        labels = [f"{label}\ncap. {r.available_memory / GB:,.1f} GB = {r.available_memory / GIB:,.1f} GiB"
                  for label, r in zip(labels, results)]
    ax.set_xticks(x, labels)
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, top * 1.18)
    _gib_axis(ax)
    first = results[0]
    same_model, same_hw = len({r.model for r in results}) == 1, len({r.hardware for r in results}) == 1
    ax.set_title(title or ("Memory per accelerator"
                           + (f": {first.model}" if same_model else "")
                           + (f"{' on' if same_model else ': on'} {first.hardware}" if same_hw else "")),
                 fontsize=11)
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8.5, frameon=False)
    return _finish(fig, path)


# --- (b) timeline over one iteration ------------------------------------------------------

def plot_timeline(result, *, title: str | None = None, path=None, figsize=(7.6, 5.6)):
    """Bytes alive in each phase of one iteration (forward, backward, optimizer step),
    stacked by component, with the peak phase marked and the capacity line.

    This is *alive per phase* from each term's liveness (``MemoryTerm.phases``); the
    reference profile's total adds every term up whatever its phases, and is drawn as a
    dotted line for comparison. Host-memory terms are left out.
    """
    Figure = _matplotlib()
    from matplotlib.lines import Line2D
    alive = phase_bytes(result)
    peak, peak_bytes = peak_phase(result)
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    _style(ax)
    x = list(range(len(PHASES)))
    bottoms = [0.0] * len(PHASES)
    present = [c for c in COMPONENTS if any(alive[p][c] for p in PHASES)]
    for component in present:
        heights = [alive[p][component] / GB for p in PHASES]
        ax.bar(x, heights, 0.62, bottom=bottoms, color=COLORS[component], edgecolor="white", linewidth=0.6)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    peak_i = PHASES.index(peak)
    ax.bar([peak_i], [bottoms[peak_i]], 0.62, fill=False, edgecolor="#000000", linewidth=2.0)
    for xi, phase in enumerate(PHASES):
        text = f"{bottoms[xi]:,.1f} GB"
        if phase == peak:
            text = f"peak: {text}"
        ax.annotate(text, (xi, bottoms[xi]), xytext=(0, 3), textcoords="offset points", ha="center",
                    va="bottom", fontsize=9, fontweight="bold" if phase == peak else "normal",
                    bbox=_LABEL_BOX, zorder=5)
    cap = result.available_memory / GB
    total = result.total_memory / GB
    ax.axhline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.4)
    ax.axhline(total, color="#666666", linestyle=":", linewidth=1.4)
    ax.set_xticks(x, [_name(p) + ("\n(peak)" if p == peak else "") for p in PHASES])
    ax.set_xlim(-0.6, len(PHASES) - 0.4)
    ax.set_ylim(0, max(cap, total, peak_bytes / GB) * 1.15)
    _gib_axis(ax)
    handles = _legend_handles(present)
    handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--", label=_capacity_label(result)))
    handles.append(Line2D([], [], color="#666666", linestyle=":",
                          label=f"{result.profile} profile total (all terms summed): {total:,.1f} GB"))
    ax.set_title(title or f"Memory alive per phase (from term liveness)\n{result.model} on {result.hardware}, "
                          f"micro-batch {result.microbatch}, {_checkpointing(result)}",
                 fontsize=11)
    fig.legend(handles=handles, loc="outside lower center", ncols=2, fontsize=8.5, frameon=False)
    caption = ("phase of one training iteration: each bar adds the terms alive in it (MemoryTerm.phases);\n"
               f"the {result.profile} profile's total adds every term, whatever its phase")
    if result.host_memory:
        caption += f"; host-memory terms ({result.host_memory / GB:,.1f} GB) are not shown"
    ax.set_xlabel(caption, fontsize=8.5, color="#444444")
    return _finish(fig, path)


# --- (c) sweep ----------------------------------------------------------------------------

def plot_sweep(data: Sweep, *, title: str | None = None, path=None, figsize=(7.6, 5.4)):
    """Memory against the swept value (a `Sweep` from `sweep`), stacked by
    component, with the capacity line and the largest value that fits marked."""
    Figure = _matplotlib()
    from matplotlib.lines import Line2D
    results, values = data.results, data.values
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    _style(ax)
    present = [c for c in COMPONENTS if any(getattr(r, c) for r in results)]
    ax.stackplot(values, *[[getattr(r, c) / GB for r in results] for c in present],
                 colors=[COLORS[c] for c in present], alpha=0.85, linewidth=0)
    totals = [r.total_memory / GB for r in results]
    ax.plot(values, totals, color="#000000", linewidth=1.2, zorder=3)
    fits = [r.feasible for r in results]
    ax.scatter([v for v, f in zip(values, fits) if f], [t for t, f in zip(totals, fits) if f],
               marker="o", color="#1a7f37", edgecolor="white", s=42, zorder=4, clip_on=False)
    ax.scatter([v for v, f in zip(values, fits) if not f], [t for t, f in zip(totals, fits) if not f],
               marker="X", color="#b00020", edgecolor="white", s=52, zorder=4, clip_on=False)
    cap = results[0].available_memory / GB
    ax.axhline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.4)
    if len(values) > 1 and values[-1] / values[0] >= 8:
        ax.set_xscale("log", base=2)
    ax.set_xticks(values, [f"{v:,}" for v in values])
    ax.minorticks_off()
    if len(values) > 1:
        ax.set_xlim(values[0], values[-1])
    ax.set_xlabel(data.label + (" per accelerator" if data.parameter == "batch" else ""))
    top = max(max(totals), cap)
    ax.set_ylim(0, top * 1.12)
    best = data.largest_fitting
    if best is not None:
        i = values.index(best)
        ax.axvline(best, color="#1a7f37", linewidth=1.2, linestyle="-.")
        ax.annotate(f"largest {data.label} that fits: {best:,}\n({totals[i]:,.1f} GB = "
                    f"{results[i].total_memory / GIB:,.1f} GiB)", (best, totals[i]),
                    xytext=(0.03, 0.95), textcoords="axes fraction", fontsize=9, color="#1a7f37",
                    fontweight="bold", ha="left", va="top", bbox=_LABEL_BOX, zorder=6,
                    arrowprops={"arrowstyle": "->", "color": "#1a7f37", "linewidth": 1.2})
    else:
        ax.text(0.02, 0.96, "none of these values fits", transform=ax.transAxes, color="#b00020",
                fontsize=9, fontweight="bold", va="top")
    _gib_axis(ax)
    handles = _legend_handles(present)
    handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--", label=_capacity_label(results[0])))
    handles.append(Line2D([], [], color="#000000", marker="o", markerfacecolor="#1a7f37", markeredgecolor="white",
                          label="total, fits"))
    handles.append(Line2D([], [], color="#000000", marker="X", markerfacecolor="#b00020", markeredgecolor="white",
                          label="total, does not fit"))
    first = results[0]
    fixed = (f"sequence length {data.scenario.seq_len:,}" if data.parameter == "batch" and data.scenario
             else f"micro-batch {first.microbatch}" if data.parameter == "seq" else "")
    ax.set_title(title or f"Memory vs {data.label}: {first.model} on {first.hardware}"
                          + (f"\n{fixed}, {first.precision}, {first.optimizer}, "
                             f"{_checkpointing(first)}" if fixed else ""),
                 fontsize=11)
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8.5, frameon=False)
    return _finish(fig, path)
