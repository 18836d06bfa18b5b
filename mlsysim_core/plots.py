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

import os
import re

import attrs

from .errors import InvalidInputError, MlsysimError
from .terms import ACCELERATOR, COMPONENTS, PHASES

GB = 1e9
GIB = 2**30
EXTRA_HINT = "pip install 'mlsysim-core[plot]'"

# One colour per component, the same in every picture (matplotlib's tab10).
COLORS = {"weights": "#1f77b4", "gradients": "#ff7f0e", "optimizer_state": "#2ca02c",
          "activations": "#d62728", "communication_buffers": "#9467bd", "runtime_overheads": "#8c564b"}
OTHER_COLOR = "#7f7f7f"     # a component added after these colours were chosen
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


def _checkpointing(result) -> str:     # how the strategy names itself (its explain.label), else by name
    from .render import EXPLAIN_LABEL, _declared
    ckpt = result.activation_checkpointing
    return _declared(None, "checkpointing", ckpt, EXPLAIN_LABEL) or f"{ckpt} checkpointing"


# --- the numbers behind the pictures (no matplotlib) ----------------------------------------

def _layout(result) -> str:
    """``", tp=2 pp=2 dp=2 ep=1, dp rule zero1"`` for a parallel layout; ``""`` for one device."""
    p = result.parallelism
    if all(n == 1 for n in p.values()):
        return ""
    cp = f" cp={p['cp']}" if p.get("cp", 1) != 1 else ""
    return (f", tp={p.get('tp', 1)}{cp} pp={p.get('pp', 1)} dp={p.get('dp', 1)} ep={p.get('ep', 1)}, "
            f"dp rule {result.selected.get('dp_rule', '?')}")


def phase_bytes(result) -> dict[str, dict[str, float]]:
    """Bytes alive in each phase, by component: ``{phase: {component: bytes}}``.

    A term counts in every phase its ``phases`` list; only accelerator-tier terms count.
    ``result`` is a result or one of its rank classes (``result.ranks``). This is
    liveness, whatever the profile's combine rule: the reference profile adds every term
    up whatever its phases, so its total is at least the peak here; a profile that takes
    the peak over phases (``result.peak_phase`` set) has its total in one of these phases.
    """
    alive = {phase: dict.fromkeys(COMPONENTS, 0) for phase in PHASES}
    for term in result.terms:
        if term.tier != ACCELERATOR:
            continue
        for phase in term.phases:
            alive[phase][term.component] += term.nbytes
    return alive


def peak_phase(result) -> tuple[str, float]:
    """The peak phase and the bytes alive in it.

    For a profile that takes the peak over phases it is the phase the profile chose
    (``result.peak_phase``); otherwise the phase with the most bytes alive (the first
    such phase on a tie).
    """
    totals = {phase: sum(by_component.values()) for phase, by_component in phase_bytes(result).items()}
    chosen = getattr(result, "peak_phase", None)
    phase = chosen if chosen in totals else max(PHASES, key=lambda p: totals[p])
    return phase, totals[phase]


def combine_rule(result) -> str:
    """How ``result``'s profile made its total from the terms, in words: the peak over the
    phases of an iteration (naming the phase) or the sum of every term."""
    phase = getattr(result, "peak_phase", None)
    if phase:
        return f"the peak over phases (the {_name(phase)} phase)"
    return "every term summed, whatever its phase"


def caption(results) -> str:
    """One line per profile among ``results``: the profile and its combine rule, naming the
    peak phases (``"measured profile: total = the peak over phases (the backward phase)"``).
    Anything with ``profile`` and ``peak_phase`` will do."""
    results = [results] if not isinstance(results, (list, tuple)) else list(results)
    lines = []
    for profile in dict.fromkeys(r.profile for r in results):
        mine = [r for r in results if r.profile == profile]
        phases = list(dict.fromkeys(r.peak_phase for r in mine if r.peak_phase))
        if not phases:
            rule = combine_rule(mine[0])
        elif all(r.peak_phase for r in mine):
            rule = "the peak over phases (" + " or ".join(f"the {_name(p)}" for p in phases) + " phase)"
        else:
            rule = "the peak over phases where the profile names one, otherwise every term summed"
        lines.append(f"{profile} profile: total = {rule}")
    return "\n".join(lines)


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
    def zero(r):     # how the rule names itself in a sentence (its explain.label), else its name
        from .render import EXPLAIN_LABEL, _declared
        rule = r.selected.get("dp_rule", "?")
        return _declared(None, "sharding_rules", rule, EXPLAIN_LABEL) or rule

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

def check_output(path, parameter: str = "output") -> Path:
    """``path`` if a picture can be written there, else `InvalidInputError` naming
    ``parameter``: it must end in .png or .svg, not be a folder, and be in a folder that
    exists and is writable. (Nothing is created: a missing folder is a typo as often as
    not.)"""
    text = str(path)
    path = Path(path)
    if path.is_dir():
        raise InvalidInputError(parameter, text, "a file name ending in .png or .svg",
                                "it is a folder; name a file in it, e.g. " + str(path / "plot.png"))
    if FORMATS.get(path.suffix.lower()) is None:
        raise InvalidInputError(parameter, text, "a file name ending in .png or .svg")
    folder = path.parent
    if not folder.exists():
        raise InvalidInputError(parameter, text, "a file in a folder that exists",
                                f"folder {str(folder)!r} does not exist; create it first")
    if not folder.is_dir():
        raise InvalidInputError(parameter, text, "a file in a folder that exists",
                                f"{str(folder)!r} is not a folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise InvalidInputError(parameter, text, "a writable file", "the file exists and is not writable")
    if not path.exists() and not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidInputError(parameter, text, "a file in a writable folder",
                                f"folder {str(folder)!r} is not writable")
    return path


def save(fig, path, *, parameter: str = "output") -> Path:
    """Save ``fig`` to ``path``: PNG or SVG by its extension. A path that cannot be
    written (see `check_output`) is an `InvalidInputError` naming ``parameter``."""
    path = check_output(path, parameter)
    fmt = FORMATS[path.suffix.lower()]
    # A fixed SVG hash salt and no date metadata: the same picture gives the same file.
    metadata = {"Date": None} if fmt == "svg" else {"Software": None}
    import matplotlib
    try:
        with matplotlib.rc_context({"svg.hashsalt": "mlsysim-core"}):
            fig.savefig(path, format=fmt, dpi=120, metadata=metadata)
    except OSError as err:     # e.g. a read-only file system, a full disk
        raise InvalidInputError(parameter, str(path), "a writable file",
                                f"writing it failed: {err.strerror or err}") from None
    return path


def _figure(figsize):
    """A figure with constrained layout and its own Agg canvas (no pyplot), so that
    ``fig.canvas.draw()`` works and text extents can be measured."""
    Figure = _matplotlib()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _wrap(text: str, width: int) -> str:
    """Break each line of ``text`` to at most ``width`` characters where it can: after a
    space or '=' first, else after '/', else after '-' or ',' (a catalog name such as
    nvidia/h100-sxm5-80gb has no spaces)."""
    def pack(pieces, joined=""):
        lines, current = [], ""
        for piece in pieces:
            if current and len(current) + len(piece.rstrip()) > width:
                lines.append(current.rstrip())
                current = piece
            else:
                current += piece
        return lines + [current.rstrip()]

    def split(line, delimiters):
        if len(line) <= width or not delimiters:
            return [line]
        pieces = [p for p in re.split(f"(?<=[{re.escape(delimiters[0])}])", line) if p]
        return [part for packed in pack(pieces) for part in split(packed, delimiters[1:])]

    return "\n".join(part for line in str(text).split("\n") for part in split(line, [" =", "/", "-,"]))


def _overlap(a, b, pad: float = 1.0) -> bool:
    return a.x0 < b.x1 + pad and b.x0 < a.x1 + pad and a.y0 < b.y1 + pad and b.y0 < a.y1 + pad


def _fit_xticklabels(fig, ax, positions, labels, fontsize=None):
    """Put ``labels`` at ``positions`` so that no two overlap: as they are, else turned by
    30, 60 and then 90 degrees, else upright with those that would overlap the one before left blank."""
    ax.set_xticks(positions, labels, fontsize=fontsize)
    for rotation in (0, 30, 60, 90):
        if rotation:
            for t in ax.get_xticklabels():
                t.set_rotation(rotation)
                t.set_horizontalalignment("right" if rotation < 90 else "center")
                t.set_rotation_mode("anchor" if rotation < 90 else "default")
        fig.draw_without_rendering()
        if not _overlapping(ax.get_xticklabels()):
            return
    # Still too many: keep, from the left, each label that clears the last one kept.
    renderer = fig.canvas.get_renderer()
    kept, last = [], None
    for text, label in zip(ax.get_xticklabels(), labels):
        box = text.get_window_extent(renderer)
        if last is None or not _overlap(last, box):
            kept.append(label)
            last = box
        else:
            kept.append("")
    ax.set_xticks(positions, kept, fontsize=fontsize, rotation=90)


def _overlapping(texts) -> bool:
    renderer = texts[0].figure.canvas.get_renderer() if texts else None
    boxes = [t.get_window_extent(renderer) for t in texts if t.get_visible() and t.get_text()]
    return any(_overlap(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _title(ax, fig, text: str):
    ax.set_title(text, fontsize=11)


def _narrow(fig, text):
    """Re-wrap ``text`` (a Text artist) until it is no wider than the figure."""
    renderer = fig.canvas.get_renderer()
    limit = fig.bbox.width * 0.96
    original = text.get_text()
    width = max(len(line) for line in original.split("\n"))
    while text.get_window_extent(renderer).width > limit and width > 16:
        width = int(width * 0.85)
        text.set_text("\n".join(_wrap(line, width) for line in original.split("\n")))


def _legend(fig, handles, ncols):
    """The legend under the axes, in as many columns (at most ``ncols``) as fit the width."""
    renderer = fig.canvas.get_renderer()
    while True:
        legend = fig.legend(handles=handles, loc="outside lower center", ncols=ncols, fontsize=8.5, frameon=False)
        if ncols == 1 or legend.get_window_extent(renderer).width <= fig.bbox.width * 0.96:
            return legend
        legend.remove()
        ncols -= 1


def _fit_texts(fig, ax):
    """Title and caption no wider than the figure."""
    _narrow(fig, ax.title)
    _narrow(fig, ax.xaxis.label)


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


def _color(component: str) -> str:
    return COLORS.get(component, OTHER_COLOR)


def _legend_handles(present: Sequence[str]) -> list:
    from matplotlib.patches import Patch
    return [Patch(facecolor=_color(c), label=_name(c)) for c in present]


def _caption_text(text: str, fig) -> str:
    width = max(60, int(fig.get_figwidth() * 14))
    return "\n".join(_wrap(part, width) for part in text.split("\n"))


_LABEL_BOX = {"boxstyle": "round,pad=0.3", "facecolor": "white", "edgecolor": "none", "alpha": 0.95}


# --- (a) stacked bars ------------------------------------------------------------------------

@attrs.frozen
class _Bar:
    label: str
    parts: dict           # component -> bytes
    total: float
    capacity: float
    feasible: bool
    profile: str
    peak_phase: str | None


def _bars(results, labels) -> list[_Bar]:
    if len(results) == 1 and len(results[0].ranks) > 1 and labels is None:
        # one parallel layout: a bar per rank class (first, middle and last stages)
        r = results[0]
        return [_Bar(f"{k.name}\n({k.ranks:,} devices" + ("; heaviest of all)" if k.name == r.heaviest_rank else ")"),
                     {c: getattr(k, c) for c in COMPONENTS}, k.total_memory, r.available_memory, k.feasible,
                     r.profile, k.peak_phase) for k in r.ranks]
    labels = list(labels) if labels is not None else default_labels(results)
    if len(labels) != len(results):
        raise InvalidInputError("labels", labels, f"one label per result ({len(results)})")
    return [_Bar(str(label) + (f"\n({r.heaviest_rank}, the heaviest)" if len(r.ranks) > 1 else ""),
                 {c: getattr(r, c) for c in COMPONENTS}, r.total_memory, r.available_memory, r.feasible,
                 r.profile, r.peak_phase) for label, r in zip(labels, results)]


def plot_bars(results, labels: Sequence[str] | None = None, *, title: str | None = None,
              path=None, figsize=None):
    """Stacked bars of the components, one bar per result, with the capacity.

    ``results`` is one result or a list (several configurations, ZeRO stages, ...);
    ``labels`` name the bars (by default, the settings in which the results differ).
    One result of a parallel layout with several rank classes (``result.ranks``, the
    measured profile) gets one bar per rank class; with several results, each bar is its
    result's heaviest rank class, named under it. The capacity is a dashed line (one per
    bar when the accelerators differ); each bar is topped by its total and its percentage
    of the capacity. The caption under the axis names each profile and how it made its
    total (every term summed, or the peak over phases and which phase).
    """
    _matplotlib()
    from matplotlib.lines import Line2D
    results = [results] if not isinstance(results, (list, tuple)) else list(results)
    if not results:
        raise InvalidInputError("results", results, "at least one result")
    bars = _bars(results, labels)
    n = len(bars)
    fig = _figure(figsize or (min(16.0, max(6.4, 1.5 * n + 4.0)), 5.8))
    ax = fig.add_subplot()
    _style(ax)
    x = list(range(n))
    bottoms = [0.0] * n
    present = [c for c in COMPONENTS if any(b.parts.get(c) for b in bars)]
    for component in present:
        heights = [b.parts.get(component, 0) / GB for b in bars]
        ax.bar(x, heights, 0.6, bottom=bottoms, color=_color(component), edgecolor="white",
               linewidth=0.6, label=_name(component))
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    capacities = {b.capacity for b in bars}
    top = max(max(b.total / GB for b in bars), max(c / GB for c in capacities))
    notes = []
    for xi, b in zip(x, bars):
        pct = 100 * b.total / b.capacity if b.capacity else float("inf")
        notes.append(ax.annotate(f"{b.total / GB:,.1f} GB\n{pct:.0f} % of cap.", (xi, b.total / GB),
                                 xytext=(0, 3), textcoords="offset points", ha="center", va="bottom",
                                 fontsize=8.5, color="#222222" if b.feasible else "#b00020", bbox=_LABEL_BOX,
                                 zorder=5))
    handles = _legend_handles(present)
    tick_labels = [_wrap(b.label, 22) for b in bars]
    if len(capacities) == 1:
        ax.axhline(bars[0].capacity / GB, color=CAPACITY_COLOR, linestyle="--", linewidth=1.4)
        handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--", label=_capacity_label(results[0])))
    else:
        for xi, b in zip(x, bars):
            ax.hlines(b.capacity / GB, xi - 0.42, xi + 0.42, color=CAPACITY_COLOR,
                      linestyle="--", linewidth=1.4)
        handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--",
                              label="capacity of each bar's accelerator"))
        tick_labels = [f"{label}\ncap. {b.capacity / GB:,.1f} GB = {b.capacity / GIB:,.1f} GiB"
                       for label, b in zip(tick_labels, bars)]
    ax.set_xlim(-0.6, n - 0.4)
    ax.set_ylim(0, top * 1.2)
    _gib_axis(ax)
    first = results[0]
    same_model, same_hw = len({r.model for r in results}) == 1, len({r.hardware for r in results}) == 1
    default_title = ("Memory per accelerator"
                     + (f": {first.model}" if same_model else "")
                     + (f" on {first.hardware}" if same_hw else ""))
    if len(results) == 1 and len(first.ranks) > 1:
        default_title += "\none bar per rank class of " + " ".join(
            f"{k}={v}" for k, v in first.parallelism.items() if v != 1)
    _title(ax, fig, title or default_title)
    ax.set_xlabel(_caption_text(caption(bars), fig), fontsize=8.5, color="#444444")
    _legend(fig, handles, 3)
    _fit_texts(fig, ax)
    _fit_xticklabels(fig, ax, x, tick_labels)
    if _overlapping(notes):      # many bars: the totals stand upright, on one line each
        for note, b in zip(notes, bars):
            note.set_text(note.get_text().replace("\n", ", ").replace(" of cap.", ""))
            note.set_rotation(90)
        ax.set_ylim(0, top * 1.45)
        fig.draw_without_rendering()
    return _finish(fig, path)


# --- (b) timeline over one iteration ------------------------------------------------------

def _rank(result, rank):
    """The rank class to draw: ``rank`` (a name of ``result.ranks``, or one of them), or the
    result itself (the heaviest rank class of a parallel layout)."""
    if rank is None:
        return result, None
    names = [k.name for k in result.ranks]
    for k in result.ranks:
        if rank is k or rank == k.name:
            return k, k.name
    raise InvalidInputError("rank", rank, "one of " + ", ".join(names) if names
                            else "None: this result has no rank classes (one device, or the reference profile)")


def plot_timeline(result, *, title: str | None = None, path=None, figsize=(8.4, 6.0), rank=None):
    """Bytes alive in each phase of one iteration (forward, backward, backward end,
    optimizer step), stacked by component, with the peak phase marked and the capacity.

    This is *alive per phase* from each term's liveness (``MemoryTerm.phases``). The
    profile's total is the dotted line: the reference profile adds every term up whatever
    its phases; a profile that takes the peak over phases (the measured one) has its
    total in the peak phase, named in the caption. ``rank`` picks a rank class of a
    parallel layout by name (default: the heaviest, which is the result's own terms).
    Host-memory terms are left out.
    """
    _matplotlib()
    from matplotlib.lines import Line2D
    source, rank_name = _rank(result, rank)
    alive = phase_bytes(source)
    peak, peak_bytes = peak_phase(source)
    fig = _figure(figsize)
    ax = fig.add_subplot()
    _style(ax)
    x = list(range(len(PHASES)))
    bottoms = [0.0] * len(PHASES)
    present = [c for c in COMPONENTS if any(alive[p][c] for p in PHASES)]
    for component in present:
        heights = [alive[p][component] / GB for p in PHASES]
        ax.bar(x, heights, 0.62, bottom=bottoms, color=_color(component), edgecolor="white", linewidth=0.6,
               label=_name(component))
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
    total = source.total_memory / GB
    ax.axhline(cap, color=CAPACITY_COLOR, linestyle="--", linewidth=1.4)
    ax.axhline(total, color="#666666", linestyle=":", linewidth=1.4)
    ax.set_xlim(-0.6, len(PHASES) - 0.4)
    ax.set_ylim(0, max(cap, total, peak_bytes / GB) * 1.15)
    _gib_axis(ax)
    rule = combine_rule(source)
    handles = _legend_handles(present)
    handles.append(Line2D([], [], color=CAPACITY_COLOR, linestyle="--", label=_capacity_label(result)))
    handles.append(Line2D([], [], color="#666666", linestyle=":",
                          label=f"{result.profile} profile total, "
                                + (f"peak over phases ({_name(source.peak_phase)})" if source.peak_phase
                                   else "all terms summed") + f": {total:,.1f} GB"))
    if rank_name is None and len(result.ranks) > 1:
        rank_name = f"{result.heaviest_rank}, the heaviest"
    _title(ax, fig, title or (f"Memory alive per phase (from term liveness)\n{result.model} on {result.hardware}"
                              + (f" ({rank_name})" if rank_name else "")
                              + f", micro-batch {result.microbatch}, {_checkpointing(result)}"))
    _legend(fig, handles, 2)
    text = ("phase of one training iteration: each bar adds the terms alive in it (MemoryTerm.phases)\n"
            f"{result.profile} profile: total = {rule}")
    if getattr(source, "peak_phase", None):
        text += f", {total:,.1f} GB"
    if source.host_memory:
        text += f"; host-memory terms ({source.host_memory / GB:,.1f} GB) are not shown"
    ax.set_xlabel(_caption_text(text, fig), fontsize=8.5, color="#444444")
    _fit_texts(fig, ax)
    _fit_xticklabels(fig, ax, x, [_name(p) + ("\n(peak)" if p == peak else "") for p in PHASES])
    return _finish(fig, path)


# --- (c) sweep ----------------------------------------------------------------------------

def plot_sweep(data: Sweep, *, title: str | None = None, path=None, figsize=(8.0, 5.8),
               exact: int | None = None, exact_is_bound: bool = False):
    """Memory against the swept value (a `Sweep` from `sweep`), stacked by
    component, with the capacity line and the largest value that fits marked.
    For a parallel layout each value shows its heaviest rank class. ``exact`` is the
    exact largest value that fits (``mlsysim_core.inverse``, as `fit` finds it; the sweep
    only samples): when given and different, the mark says both (``exact_is_bound``: it is
    the search limit, a lower bound)."""
    _matplotlib()
    from matplotlib.lines import Line2D
    results, values = data.results, data.values
    fig = _figure(figsize)
    ax = fig.add_subplot()
    _style(ax)
    present = [c for c in COMPONENTS if any(getattr(r, c) for r in results)]
    ax.stackplot(values, *[[getattr(r, c) / GB for r in results] for c in present],
                 colors=[_color(c) for c in present], alpha=0.85, linewidth=0, labels=[_name(c) for c in present])
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
    ax.minorticks_off()
    if len(values) > 1:
        ax.set_xlim(values[0], values[-1])
    quantity = data.label + (" per accelerator" if data.parameter == "batch" else "")
    ax.set_xlabel(_caption_text(f"{quantity}\n{caption(list(results))}", fig), fontsize=9)
    top = max(max(totals), cap)
    ax.set_ylim(0, top * 1.12)
    best = data.largest_fitting
    if best is not None:
        i = values.index(best)
        ax.axvline(best, color="#1a7f37", linewidth=1.2, linestyle="-.")
        if exact is None or (exact == best and not exact_is_bound):
            said = f"largest {data.label} that fits: {best:,}"
        else:
            said = (f"largest drawn that fits: {best:,}\n(exact largest: "
                    f"{'at least ' if exact_is_bound else ''}{exact:,})")
        ax.annotate(f"{said}\n({totals[i]:,.1f} GB = "
                    f"{results[i].total_memory / GIB:,.1f} GiB)", (best, totals[i]),
                    xytext=(0.03, 0.95), textcoords="axes fraction", fontsize=9, color="#1a7f37",
                    fontweight="bold", ha="left", va="top", bbox=_LABEL_BOX, zorder=6,
                    arrowprops={"arrowstyle": "->", "color": "#1a7f37", "linewidth": 1.2})
    else:
        ax.text(0.02, 0.96, "none of these values fits" + (
                    f" (exact largest that fits: {exact:,})" if exact is not None else ""),
                transform=ax.transAxes, color="#b00020", fontsize=9, fontweight="bold", va="top")
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
    heaviest = "; each value: its heaviest rank class" if any(len(r.ranks) > 1 for r in results) else ""
    _title(ax, fig, title or f"Memory vs {data.label}: {first.model} on {first.hardware}"
                             + (f"\n{fixed}, {first.details.get('regime') or first.precision}, {first.optimizer}, "
                                f"{_checkpointing(first)}{_layout(first)}{heaviest}" if fixed else heaviest))
    _legend(fig, handles, 3)
    _fit_texts(fig, ax)
    _fit_xticklabels(fig, ax, list(values), [f"{v:,}" for v in values])
    return _finish(fig, path)
