"""Plain-text views of a result: the estimate table and the explanation tree.

Every number shown to a person says its unit: GB is 1e9 bytes, GiB is 2**30 bytes.
"""

from __future__ import annotations

from .terms import COMPONENTS

GIB = 2**30


def _gb(nbytes) -> str:
    return f"{nbytes * 1e-9:,.3f}"


def _gib(nbytes) -> str:
    return f"{nbytes / GIB:,.3f}"


def describe_setup(result, plan_line: str = "") -> str:
    p = result.parallelism
    return (f"{result.model} on {result.hardware}  (profile: {result.profile})\n"
            f"micro-batch {result.microbatch}, {result.precision}, optimizer {result.optimizer}, "
            f"checkpointing {result.activation_checkpointing}, "
            f"tp={p['tp']} pp={p['pp']} dp={p['dp']} ep={p['ep']}, dp rule {result.selected.get('dp_rule', '?')}"
            + (f", {plan_line}" if plan_line else ""))


def estimate_table(result, *, reference=None, plan_line: str = "") -> str:
    """The `estimate` table: one row per component, total, capacity and the verdict.

    With ``reference`` (a second result, e.g. from another profile) its total is shown
    beside this one.
    """
    rows = [("component", "GB (1e9 B)", "GiB (2^30 B)", "share", "from plugin(s)")]
    total = result.total_memory or 1
    for component in COMPONENTS:
        nbytes = getattr(result, component)
        sources = sorted({t.source for t in result.terms_of(component) if t.nbytes})
        rows.append((component.replace("_", " "), _gb(nbytes), _gib(nbytes),
                     f"{100 * nbytes / total:5.1f} %", ", ".join(sources) or "-"))
    rows.append(("total", _gb(result.total_memory), _gib(result.total_memory), "100.0 %", ""))
    rows.append(("available", _gb(result.available_memory), _gib(result.available_memory), "", result.hardware))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [describe_setup(result, plan_line), ""]
    for i, row in enumerate(rows):
        line = "  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:4], widths[1:4])]
                         + [row[4]])
        lines.append(line.rstrip())
        if i == 0 or row[0] == "communication buffers":
            lines.append("-" * (sum(widths) + 8))
    lines.append("")
    lines.append(f"utilization  {100 * result.memory_utilization:.1f} % of {result.hardware}")
    if result.feasible:
        lines.append(f"fits         YES, {_gb(result.headroom)} GB ({_gib(result.headroom)} GiB) to spare")
    else:
        lines.append(f"fits         NO, {_gb(-result.headroom)} GB ({_gib(-result.headroom)} GiB) short")
    if reference is not None:
        lines.append(f"{reference.profile} profile total: {_gb(reference.total_memory)} GB "
                     f"({_gib(reference.total_memory)} GiB), "
                     f"{'fits' if reference.feasible else 'does not fit'}")
    for note in result.constraint_trace[1:]:
        lines.append(f"note         {note}")
    return "\n".join(lines)


def explain(result) -> str:
    """A tree of where every byte comes from: component, term, plugin, formula."""
    lines = [f"{_gb(result.total_memory)} GB ({_gib(result.total_memory)} GiB) per accelerator: "
             f"{result.model} on {result.hardware}, profile {result.profile}"]
    for ci, component in enumerate(COMPONENTS):
        last_c = ci == len(COMPONENTS) - 1
        terms = result.terms_of(component)
        lines.append(f"{'└─' if last_c else '├─'} {component.replace('_', ' ')}: "
                     f"{_gb(getattr(result, component))} GB")
        stem = "   " if last_c else "│  "
        if not terms:
            lines.append(f"{stem}└─ (nothing: no selected plugin puts bytes here)")
        for ti, term in enumerate(terms):
            last_t = ti == len(terms) - 1
            where = result.plugin_sources.get(term.source, "")
            tier = "" if term.tier == "accelerator" else f", on {term.tier} memory"
            lines.append(f"{stem}{'└─' if last_t else '├─'} {term.label}: {_gb(term.nbytes)} GB "
                         f"[plugin {term.source}{' (' + where + ')' if where else ''}{tier}]")
            if term.formula:
                lines.append(f"{stem}{'   ' if last_t else '│  '}   = {term.formula}")
    verdict = "fits" if result.feasible else "does NOT fit"
    lines.append(f"capacity {_gb(result.available_memory)} GB ({_gib(result.available_memory)} GiB): "
                 f"{100 * result.memory_utilization:.1f} % used, {verdict}")
    return "\n".join(lines)
