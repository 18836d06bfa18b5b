"""Plain-text and HTML views of a result: the estimate table, a terminal bar chart, the
explanation tree and the notebook table.

Every number shown to a person says its unit: GB is 1e9 bytes, GiB is 2**30 bytes.
Everything here is deterministic: the same result always renders to the same text.
"""

from __future__ import annotations

import html
import math
import re
import textwrap

import attrs

from .errors import InvalidInputError, InvalidInputTypeError
from .plan import PRECISION_BYTES
from .terms import ACCELERATOR, COMPONENTS, PHASES

GIB = 2**30

# What the drawing becomes on a stream that cannot encode it (an ASCII or cp1252 console):
# box and block characters, and the few symbols the text uses, in plain ASCII.
_MEMORY_FIELDS = ("total_memory", "available_memory", "host_memory") + COMPONENTS


class MemoryView:
    """A result's memory fields in GB (``bytes * 1e-9``, as the reference) or GiB (``bytes / 2**30``)."""

    __slots__ = ("_result", "_unit", "_gb")

    def __init__(self, result, unit: str):
        self._result, self._unit, self._gb = result, unit, unit == "GB"

    def __getattr__(self, field: str) -> float:
        if field not in _MEMORY_FIELDS:
            raise AttributeError(f"{field!r} is not a memory field; choose from {', '.join(_MEMORY_FIELDS)}")
        value = getattr(self._result, field)
        return value * 1e-9 if self._gb else value / 2**30

    def as_dict(self) -> dict[str, float]:
        return {f: getattr(self, f) for f in _MEMORY_FIELDS}

    def __repr__(self) -> str:
        return f"MemoryView({self._unit}: " + ", ".join(f"{k}={v:.6g}" for k, v in self.as_dict().items()) + ")"


_ASCII = str.maketrans({
    "█": "#", "▉": "#", "▊": "#", "▋": "#", "▌": ":", "▍": ":", "▎": ".", "▏": ".",
    "│": "|", "─": "-", "┼": "+", "├": "+", "└": "`", "»": ">", "·": "*", "×": "x", "≤": "<=", "≥": ">=",
    "≈": "~", "→": "->", "−": "-", "–": "-", "—": "-", "§": "S", "²": "^2", "³": "^3",
    "⁰": "0", "¹": "1", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8", "⁹": "9", "⁻": "-", "⁺": "+",
    "‘": "'", "’": "'", "“": '"', "”": '"', "…": "...", "µ": "u"})


def printable(text: str, encoding: str | None) -> str:
    """``text`` as it can be written to a stream of ``encoding``: unchanged when it encodes,
    else with the drawing in ASCII (see ``_ASCII``) and anything left replaced."""
    if not encoding:
        return text
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        pass
    import unicodedata
    text = unicodedata.normalize("NFKD", text.translate(_ASCII))
    try:
        return text.encode(encoding, "replace").decode(encoding, "replace")
    except LookupError:
        return text.encode("ascii", "replace").decode("ascii")


def describe_run(run: dict) -> str:
    """What a header says about a run beyond the result's own line (see
    ``Scenario.run_details``): the global batch actually run and how it splits, the
    sequence, and then, one clause each, everything else that changes the numbers."""
    g, mb, dp, gas = run["global_batch"], run["microbatch"], run["dp_size"], run["gradient_accumulation_steps"]
    text = f"global batch {g}"
    if dp != 1 or gas != 1:
        text += f" = micro-batch {mb} x dp {dp} x accumulation {gas}"
    if run.get("requested_global_batch", g) != g:
        text += f" (asked {run['requested_global_batch']}: the micro-batch is rounded up)"
    text += f", seq {run['seq_len']}"
    parts = []
    if run.get("regime"):
        source = f" (from precision {run['precision']})" if run.get("regime_source") == "precision" else ""
        description = f": {run['regime_description']}" if run.get("regime_description") else ""
        parts.append(f"regime {run['regime']}{source}{description}")
    lora = run.get("lora")
    if lora:
        targets = lora.get("target_modules")
        targets = ", ".join(targets) if isinstance(targets, (list, tuple)) else \
            "the attention projections (target_modules not given)" if targets is None else targets
        clause = f"LoRA rank {lora.get('rank')} on {targets}, base frozen"
        if lora.get("quantization"):
            clause = "Q" + clause + f" and quantized {lora['quantization']}" + \
                (" with double quantization" if lora.get("double_quant") else "")
        parts.append(clause)
    if run.get("offload"):
        offload = run["offload"]
        if isinstance(offload, dict):
            offload = ", ".join(f"{k} to {v}" for k, v in offload.items())
        elif isinstance(offload, (list, tuple)):
            offload = ", ".join(offload) + " to cpu"
        else:
            offload = f"{offload} to cpu"
        parts.append(f"offload {offload}")
    if run.get("pipeline_schedule"):
        clause = f"pipeline schedule {run['pipeline_schedule']}"
        if run.get("virtual_stages"):
            clause += f" with {run['virtual_stages']} virtual stages"
        if run.get("stage_layers"):
            clause += f", stage layers {','.join(map(str, run['stage_layers']))}"
        parts.append(clause)
    if run.get("sharding_rules"):
        parts.append("sharding rule " + ", ".join(f"{axis}={name}" for axis, name in run["sharding_rules"].items()))
    if run.get("include_plugins"):
        parts.append("included plugins " + ", ".join(run["include_plugins"]))
    for key, label in (("cp_size", "context parallelism"), ("expert_tp_size", "expert tp"),
                       ("moe_capacity_factor", "MoE capacity factor"), ("attention", "attention"),
                       ("dropout", "dropout"), ("optimizer_impl", "optimizer step"),
                       ("checkpointed_layers", "checkpointed layers"), ("trainable_fraction", "trainable fraction")):
        if key in run:
            parts.append(f"{label} {run[key]}")
    if run.get("runtime_overheads") is False:
        parts.append("no runtime overheads")
    elif isinstance(run.get("runtime_overheads"), dict):
        parts.append("runtime overheads " + ", ".join(f"{k}={v}" for k, v in run["runtime_overheads"].items()))
    if run.get("sequence_parallel") is False:
        parts.append("no sequence parallelism")
    if parts:
        text += "\n" + "; ".join(parts)
    return text



def _gb(nbytes) -> str:
    return f"{nbytes * 1e-9:,.3f}"


def _gib(nbytes) -> str:
    return f"{nbytes / GIB:,.3f}"


def _pct(part, whole) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "0.0 %"


def _name(component: str) -> str:
    return component.replace("_", " ")


def _sources(result, component) -> list[str]:
    return sorted({t.source for t in result.terms_of(component) if t.nbytes})


def describe_setup(result, plan_line: str = "") -> str:
    peak = f"; total = the {result.peak_phase.replace('_', ' ')} phase, the iteration's peak" \
        if result.peak_phase else ""
    rank = f"; the heaviest rank: {result.heaviest_rank}" if result.heaviest_rank else ""
    return (f"{result.model} on {result.hardware}  (profile: {result.profile}{peak}{rank})\n"
            + plan_header(result, plan_line))


def plan_header(result, plan_line: str = "") -> str:
    """The header's plan: micro-batch, regime or precision, optimizer, checkpointing, the
    layout (tp, cp, pp, dp, ep) and the dp rule, then ``plan_line`` (`describe_run`)."""
    p = result.parallelism
    regime = result.details.get("regime")      # (the measured profile's details say its regime)
    regime = f"regime {regime}" if regime else result.precision
    cp = f" cp={p['cp']}" if p.get("cp", 1) != 1 else ""
    return (f"micro-batch {result.microbatch}, {regime}, optimizer {result.optimizer}, "
            f"checkpointing {result.activation_checkpointing}, "
            f"tp={p['tp']}{cp} pp={p['pp']} dp={p['dp']} ep={p['ep']}, dp rule {result.selected.get('dp_rule', '?')}"
            + (f", {plan_line}" if plan_line else ""))


def rank_table(result) -> str:
    """One row per rank class of a parallel layout (measured-grade profiles): the stages it
    covers, its devices, layers and micro-batches in flight, its total and verdict."""
    if not result.ranks:
        return ""
    rows = [("rank class", "stages", "devices", "layers", "in flight", "GB (1e9 B)", "GiB (2^30 B)", "peak phase",
             "fits")]
    for r in result.ranks:
        stages = f"{r.stages[0]}" if len(r.stages) == 1 else f"{r.stages[0]}-{r.stages[-1]}"
        rows.append((r.name + (" *" if r.name == result.heaviest_rank else ""), stages, str(r.ranks), str(r.layers),
                     f"{r.in_flight:g}", _gb(r.total_memory), _gib(r.total_memory),
                     (r.peak_phase or "-").replace("_", " "), "yes" if r.feasible else "NO"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for i, row in enumerate(rows):
        lines.append("  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]).rstrip())
        if i == 0:
            lines.append("-" * (sum(widths) + 2 * (len(widths) - 1)))
    lines.append("* the heaviest rank: the components above are its own; the layout fits only if every rank fits")
    return "\n".join(lines)


def estimate_table(result, *, reference=None, plan_line: str = "", chart: bool = True) -> str:
    """The `estimate` table: one row per component, total, capacity and the verdict.

    With ``reference`` (a second result, e.g. from another profile) its total is shown
    beside this one. With ``chart`` (the default) a text bar chart against the capacity
    follows the table (see `bar_chart`).
    """
    rows = [("component", "GB (1e9 B)", "GiB (2^30 B)", "share", "from plugin(s)")]
    total = result.total_memory or 1
    for component in COMPONENTS:
        nbytes = getattr(result, component)
        if component == COMPONENTS[-1] and not nbytes and not _sources(result, component):
            continue   # runtime overheads: only profiles that model them show the row
        rows.append((_name(component), _gb(nbytes), _gib(nbytes),
                     f"{100 * nbytes / total:5.1f} %", ", ".join(_sources(result, component)) or "-"))
    rows.append(("total", _gb(result.total_memory), _gib(result.total_memory), "100.0 %", ""))
    rows.append(("available", _gb(result.available_memory), _gib(result.available_memory), "", result.hardware))
    if result.host_memory:   # offloaded bytes: needed on the host, not on the accelerator
        host_sources = sorted({t.source for t in result.terms if t.tier == "host"})
        rows.append(("host memory", _gb(result.host_memory), _gib(result.host_memory), "",
                     "not in the total; from " + ", ".join(host_sources)))
    nvme = sum(t.nbytes for t in result.terms if t.tier == "nvme")
    if nvme:
        rows.append(("NVMe", _gb(nvme), _gib(nvme), "", "not in the total; offloaded to NVMe"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = [describe_setup(result, plan_line), ""]
    for i, row in enumerate(rows):
        line = "  ".join([row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:4], widths[1:4])]
                         + [row[4]])
        lines.append(line.rstrip())
        if i == 0 or (i + 1 < len(rows) and rows[i + 1][0] == "total"):
            lines.append("-" * (sum(widths) + 8))
    if result.ranks:
        lines.append("")
        lines.extend(rank_table(result).splitlines())
    if chart:
        lines.append("")
        lines.extend(bar_chart(result).splitlines())
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
    lines.extend(note_lines(result.constraint_trace[1:]))
    return "\n".join(lines)


def note_lines(notes) -> list[str]:
    """A result's notes (``result.notes``: warnings, approximations, catalog data, what the
    rules decided) as the ``note ...`` lines every command prints after its answer."""
    return [f"note         {note}" for note in notes]


# --- the terminal bar chart ----------------------------------------------------------------

_EIGHTHS = " ▏▎▍▌▋▊▉"   # 0/8 .. 7/8 of a cell
_FULL = "█"
CAPACITY_MARK = "│"
OVERFLOW_MARK = "»"
# Beyond this multiple of the capacity the axis stops and bars end in OVERFLOW_MARK, so
# that a configuration 30x too big still shows where the capacity is.
_MAX_AXIS = 2.0


def _bar(fraction_of_axis: float, cells: int) -> str:
    """A bar of ``fraction_of_axis`` (0..1) of ``cells`` cells, in eighths of a cell."""
    eighths = round(max(0.0, min(1.0, fraction_of_axis)) * cells * 8)
    full, rest = divmod(eighths, 8)
    text = _FULL * full + (_EIGHTHS[rest] if rest else "")
    return text.ljust(cells)


def bar_chart(result, *, width: int = 80) -> str:
    """A text bar chart, one bar per component and one for the total, against the capacity.

    The axis runs from 0 to the larger of the total and the capacity (at most twice the
    capacity; longer bars end in ``»``). ``│`` marks the capacity on every row. The right
    column is each bar as a percentage of the capacity. Pure text (Unicode block
    characters), at most ``width`` columns.
    """
    capacity = result.available_memory
    shown = [c for c in COMPONENTS if c != COMPONENTS[-1] or getattr(result, c) or _sources(result, c)]
    labels = [_name(c) for c in shown] + ["total"]
    values = [getattr(result, c) for c in shown] + [result.total_memory]
    pct = [f"{100 * v / capacity:.1f} %" if capacity else "-" for v in values]
    label_w = max(len(s) for s in labels)
    pct_w = max(len(s) for s in pct)
    cells = width - label_w - pct_w - 3          # label, space, bar, space, mark, space, pct
    cells = max(10, cells)
    axis = max(result.total_memory, capacity) or 1
    axis = min(axis, _MAX_AXIS * capacity) if capacity else axis
    cap_col = min(cells - 1, round(cells * capacity / axis)) if capacity else None

    lines = textwrap.wrap(f"bars vs capacity {CAPACITY_MARK} = {_gb(capacity)} GB ({_gib(capacity)} GiB); "
                          "% of capacity at right", width)
    for label, value, p in zip(labels, values, pct):
        bar = list(_bar(value / axis, cells))
        overflow = value > axis
        if overflow:
            bar[-1] = OVERFLOW_MARK
        if cap_col is not None:
            bar[cap_col] = CAPACITY_MARK
        lines.append(f"{label.ljust(label_w)} {''.join(bar)} {p.rjust(pct_w)}")
        if label == _name(COMPONENTS[-1]):
            lines.append(" " * (label_w + 1) + "".join(
                "┼" if i == cap_col else "─" for i in range(cells)))
    if result.total_memory > axis:
        lines.extend(textwrap.wrap(f"{OVERFLOW_MARK} = longer than shown (the axis ends at {_MAX_AXIS:g}x "
                                   "the capacity)", width))
    return "\n".join(line.rstrip() for line in lines)


# --- the explanation -----------------------------------------------------------------------

# What a plugin says about itself in the explanation (``explain``), under these keys of its spec's
# ``extensions`` (docs/hooks.md): read from the registered spec, never keyed on its name.
EXPLAIN_WHY = "explain.why"          # optimizer: a sentence; checkpointing strategy: (what is kept, how much)
EXPLAIN_SHARDS = "explain.shards"    # data-parallel rule: the components it shards over every dp rank
EXPLAIN_LABEL = "explain.label"      # dp rule, strategy: how a sentence or a plot names it ("ZeRO-2")


def _declared(registry, kind: str, name: str | None, key: str):
    """What ``registry``'s (None: the installed plugins') ``kind`` spec (``optimizers``,
    ``checkpointing``, ``sharding_rules``) named ``name`` declares under ``key``; None when
    nothing is (or no such spec is registered)."""
    try:
        if registry is None:
            from .manager import get_plugin_manager
            registry = get_plugin_manager().registry
        spec = getattr(registry, kind).get(name)
    except Exception:       # (a broken installation: the explanation stays generic)
        return None
    return None if spec is None else spec.extensions.get(key)


def _model_parallel_share(result) -> str:
    p = result.parallelism
    parts = []
    if p.get("tp", 1) > 1:
        parts.append(f"tensor parallelism splits every matrix over {p['tp']} accelerators")
    if p.get("pp", 1) > 1:
        parts.append(f"pipeline parallelism keeps 1/{p['pp']} of them on each stage")
    if p.get("ep", 1) > 1:
        parts.append(f"expert parallelism spreads them over {p['ep']} accelerators")
    return "; ".join(parts)


def _sharded_by_rule(result, component: str, what: str, registry=None) -> str:
    """The data-parallel rule's sharding of ``component``, as its spec declares it."""
    rule, dp = result.selected.get("dp_rule"), result.parallelism.get("dp", 1)
    if dp > 1 and component in (_declared(registry, "sharding_rules", rule, EXPLAIN_SHARDS) or ()):
        label = _declared(registry, "sharding_rules", rule, EXPLAIN_LABEL) or f"the data-parallel rule '{rule}'"
        return f" {label} shards {what} over the {dp} data-parallel ranks."
    return ""


def why(result, component: str, registry=None) -> str:
    """One or two plain sentences: what this component is and why it takes memory (what the
    selected plugins declare under ``explain.*`` in ``registry``, default the installed ones)."""
    precision = result.precision
    b = PRECISION_BYTES.get(precision)
    per_value = f" ({b:g} B per value)" if b is not None else ""
    share = _model_parallel_share(result)
    share_text = f" Only this accelerator's share counts: {share}." if share else ""
    regime = result.details.get("regime")
    if regime:      # measured grade: the regime, not the precision, sets the dtypes
        copy, per_value = f"stored as the {regime} regime keeps them", ""
    else:
        copy = f"one {precision} copy"
    if result.heaviest_rank:
        share_text = (f" Only this rank's share counts (the {result.heaviest_rank}, the heaviest rank): "
                      "the layers of its pipeline stage, split by tensor and expert parallelism.")
    if component == "weights":
        return (f"The model's parameters, {copy}{per_value}, read by every "
                f"forward and backward pass." + share_text
                + _sharded_by_rule(result, "weights", "them", registry))
    if component == "gradients":
        what = f"One gradient per trainable parameter ({regime} regime)" if regime else \
            f"One {precision} gradient{per_value} per trainable parameter"
        return (f"{what}: written by the backward pass, read by the optimizer step." + share_text
                + _sharded_by_rule(result, "gradients", "them", registry))
    if component == "optimizer_state":
        text = _declared(registry, "optimizers", result.optimizer, EXPLAIN_WHY) or (
            f"The state the optimizer '{result.optimizer}' keeps between steps; its terms below say how it is counted.")
        if regime:    # the measured grade's dtypes differ from the textbook's 12 B
            text = (f"The state the optimizer '{result.optimizer}' keeps between steps, in the {regime} "
                    "regime's dtypes (an fp32 master copy only where the weights are 16-bit), and what its step "
                    "allocates while it runs; the terms below count each.")
        return text + _sharded_by_rule(result, "optimizer_state", "it", registry)
    if component == "activations":
        ckpt = result.activation_checkpointing
        what, how = _declared(registry, "checkpointing", ckpt, EXPLAIN_WHY) or (
            f"the tensors the forward pass keeps for the backward pass, as the checkpointing "
            f"strategy '{ckpt}' decides", "its terms below say how they are counted.")
        layers, mb = result.layers_per_stage, result.microbatch
        heaviest = next((r for r in result.ranks if r.name == result.heaviest_rank), None)
        if heaviest is not None:
            layers = heaviest.layers
        text = (f"{what[0].upper()}{what[1:]}, for the {layers} layer{'s' if layers != 1 else ''} on this "
                f"accelerator and one micro-batch of {mb} sequence{'s' if mb != 1 else ''}: {how} "
                "They grow with the micro-batch and the sequence length.")
        tp = result.parallelism.get("tp", 1)
        if tp > 1 and result.sequence_parallel:
            text += f" Sequence parallelism divides them over the {tp} tensor-parallel ranks."
        return text
    if component == "communication_buffers":
        text = ("Staging memory for moving data between accelerators: the bucket that gathers "
                "gradients for the data-parallel all-reduce")
        if result.parallelism.get("pp", 1) > 1:
            text += ", and the pipeline's send and receive buffers for one boundary activation"
        if regime:
            text += ("; under the measured profile also what the data-parallel and expert-parallel machinery "
                     "allocates (DDP buckets, ZeRO-3/FSDP gathered layers, all-to-all buffers): see the terms")
        return text + "."
    return ""


def _phases(phases) -> str:
    if tuple(phases) == PHASES:
        return "the whole iteration (" + ", ".join(p.replace("_", " ") for p in PHASES) + ")"
    return ", ".join(_name(p) for p in phases) or "no phase"


def _wrap(text: str, prefix: str, width: int) -> list[str]:
    return [prefix + line for line in textwrap.wrap(text, max(30, width - len(prefix)),
                                                      break_on_hyphens=False)]


def explain(result, *, width: int = 100, registry=None) -> str:
    """A tree of where every byte comes from, in plain language.

    For each component: its bytes (GB and GiB), its share of the total, one or two
    sentences on what it is and why; under it each term with the plugin that produced it,
    the formula with the numbers put in, and the phases of an iteration in which it is
    alive. Terms on host memory are shown but are not part of the accelerator total.
    """
    total = result.total_memory
    lines = [f"{_gb(total)} GB ({_gib(total)} GiB) per accelerator: "
             f"{result.model} on {result.hardware}, profile {result.profile}"
             + (f", the heaviest rank ({result.heaviest_rank})" if result.heaviest_rank else ""),
             "(GB = 1e9 bytes, GiB = 2^30 bytes; % = share of this accelerator's total)"]
    peak = result.peak_phase
    if peak:    # a component counts only its terms alive at the peak: say so, and mark the rest
        lines.append(f"(the total is the {_name(peak)} phase, the iteration's peak: a term not alive then "
                     "is listed, marked 'not in the total')")
    if result.ranks:
        lines.extend(rank_table(result).splitlines())
        lines.append("The tree below is the heaviest rank's.")
    for ci, component in enumerate(COMPONENTS):
        last_c = ci == len(COMPONENTS) - 1
        terms = result.terms_of(component)
        nbytes = getattr(result, component)
        host = sum(t.nbytes for t in terms if t.tier != ACCELERATOR)
        head = (f"{'└─' if last_c else '├─'} {_name(component)}: {_gb(nbytes)} GB "
                f"({_gib(nbytes)} GiB), {_pct(nbytes, total)}")
        if host:
            head += f"; plus {_gb(host)} GB ({_gib(host)} GiB) on host memory"
        lines.append(head)
        stem = "   " if last_c else "│  "
        lines.extend(_wrap(why(result, component, registry), stem + "│  ", width))
        if not terms:
            lines.append(f"{stem}└─ (nothing: no selected plugin puts bytes here)")
        for ti, term in enumerate(terms):
            last_t = ti == len(terms) - 1
            where = result.plugin_sources.get(term.source, "")
            on_host = term.tier != ACCELERATOR
            tier = f", on {term.tier} memory" if on_host else ""
            amount = f"{_gb(term.nbytes)} GB ({_gib(term.nbytes)} GiB"
            if on_host:
                amount += ", not in the total)"
            elif peak and peak not in term.phases:
                amount += f", not in the total: not alive in the {_name(peak)} phase, the peak)"
            else:
                amount += f", {_pct(term.nbytes, total)})"
            lines.append(f"{stem}{'└─' if last_t else '├─'} {term.label}: {amount} "
                         f"[plugin {term.source}{' (' + where + ')' if where else ''}{tier}]")
            inner = stem + ("   " if last_t else "│  ") + "   "
            if term.formula:
                lines.append(f"{inner}= {term.formula}")
            lines.append(f"{inner}alive during {_phases(term.phases)}")
    if total:
        biggest = max(COMPONENTS, key=lambda c: getattr(result, c))
        lines.append(f"largest part: {_name(biggest)}, {_pct(getattr(result, biggest), total)} of the total")
    if result.profile == "reference":
        lines.extend(_wrap("The reference profile adds every term up, whatever its phases; "
                           "`mlsysim-core plot timeline` shows what is alive in each phase.", "", width))
    verdict = "fits" if result.feasible else "does NOT fit"
    gap = (f"{_gb(result.headroom)} GB ({_gib(result.headroom)} GiB) to spare" if result.feasible
           else f"{_gb(-result.headroom)} GB ({_gib(-result.headroom)} GiB) short")
    lines.append(f"capacity {_gb(result.available_memory)} GB ({_gib(result.available_memory)} GiB): "
                 f"{100 * result.memory_utilization:.1f} % used, {verdict}, {gap}")
    for note in result.notes:   # warnings, approximations and what the rules decided: never silent
        wrapped = textwrap.wrap(note, max(30, width - 6), break_on_hyphens=False)
        lines.extend(("note: " if i == 0 else "      ") + line for i, line in enumerate(wrapped))
    return "\n".join(lines)


# --- HTML, for notebooks -------------------------------------------------------------------

def to_html(result) -> str:
    """An HTML table of a result (what Jupyter shows): one row per component with GB,
    GiB, share and plugins, then the total, the capacity and the verdict. All text is
    escaped."""
    e = html.escape
    total = result.total_memory
    p = result.parallelism
    caption = (f"{result.model} on {result.hardware} (profile {result.profile}): micro-batch "
               f"{result.microbatch}, {result.precision}, {result.optimizer}, checkpointing "
               f"{result.activation_checkpointing}, tp={p.get('tp')} pp={p.get('pp')} dp={p.get('dp')} "
               f"ep={p.get('ep')}, dp rule {result.selected.get('dp_rule', '?')}")
    num = 'style="text-align:right"'
    rows = [f"<tr><th>component</th><th {num}>GB (1e9 B)</th><th {num}>GiB (2^30 B)</th>"
            f"<th {num}>share</th><th>from plugin(s)</th></tr>"]
    for component in COMPONENTS:
        nbytes = getattr(result, component)
        rows.append(f"<tr><td>{e(_name(component))}</td><td {num}>{_gb(nbytes)}</td>"
                    f"<td {num}>{_gib(nbytes)}</td><td {num}>{_pct(nbytes, total)}</td>"
                    f"<td>{e(', '.join(_sources(result, component)) or '-')}</td></tr>")
    rows.append(f"<tr style=\"font-weight:bold\"><td>total</td><td {num}>{_gb(total)}</td>"
                f"<td {num}>{_gib(total)}</td><td {num}>100.0 %</td><td></td></tr>")
    rows.append(f"<tr><td>capacity</td><td {num}>{_gb(result.available_memory)}</td>"
                f"<td {num}>{_gib(result.available_memory)}</td>"
                f"<td {num}>{100 * result.memory_utilization:.1f} % used</td><td>{e(result.hardware)}</td></tr>")
    if result.host_memory:
        rows.append(f"<tr><td>host memory (not in the total)</td><td {num}>{_gb(result.host_memory)}</td>"
                    f"<td {num}>{_gib(result.host_memory)}</td><td></td><td></td></tr>")
    if result.feasible:
        verdict = (f"fits: YES, {_gb(result.headroom)} GB ({_gib(result.headroom)} GiB) to spare")
    else:
        verdict = (f"fits: NO, {_gb(-result.headroom)} GB ({_gib(-result.headroom)} GiB) short")
    color = "#1a7f37" if result.feasible else "#cf222e"
    rows.append(f"<tr><td colspan=\"5\" style=\"color:{color};font-weight:bold\">{e(verdict)}</td></tr>")
    notes = "".join(f"<tr><td colspan=\"5\"><em>note: {e(n)}</em></td></tr>" for n in result.notes)
    return (f"<table class=\"mlsysim-result\">\n<caption>{e(caption)}</caption>\n"
            + "\n".join(rows) + ("\n" + notes if notes else "") + "\n</table>")


# --- a result as JSON, and read back (TrainingMemoryResult.to_dict, to_json, from_json) -----------------

# Keys a result's JSON carries beside its fields (derived views, the CLI's additions): dropped on reading.
_NOT_FIELDS = ("units", "gb", "gib", "constraint_trace", "schema_version", "profile_note", "name_notes", "input_notes",
               "run", "launch", "reference_profile")
_TO_JSON = "TrainingMemoryResult.to_json"



def unstructure_result(result) -> dict:
    """``TrainingMemoryResult.to_dict``: its fields, with the unit views and the trace."""
    from .serialization import SCHEMA_VERSION, _converter
    return {**_converter.unstructure(result), "schema_version": SCHEMA_VERSION,
            "constraint_trace": list(result.constraint_trace), "units": {"memory": "bytes", "gb": 1e9, "gib": 2**30},
            "gb": result.gb.as_dict(), "gib": result.gib.as_dict()}


def result_from_json(text):
    """``TrainingMemoryResult.from_json``: anything but a result's JSON raises ``InvalidInputError``
    naming the first bad field."""
    import cattrs
    from .result import RankReport, TrainingMemoryResult
    from .catalog.files import _shown, parse_json
    from .serialization import SCHEMA_VERSION, _converter, _format_exception
    if not isinstance(text, (str, bytes, bytearray)):
        raise InvalidInputTypeError("text", _shown(text), f"a JSON string written by {_TO_JSON}",
                                    f"got {type(text).__name__}")
    data = parse_json(text, "text")
    if not isinstance(data, dict):
        raise InvalidInputTypeError("result", _shown(data), f"a JSON object written by {_TO_JSON}",
                                    f"got {type(data).__name__}")
    if versioned := "schema_version" in data:
        version = data["schema_version"]
        allowed = f"an integer in [1, {SCHEMA_VERSION}] (this package writes {SCHEMA_VERSION})"
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidInputTypeError("result.schema_version", _shown(version), allowed,
                                        f"got {type(version).__name__}")
        if not 1 <= version <= SCHEMA_VERSION:
            raise InvalidInputError("result.schema_version", version, allowed,
                                    "written by a newer mlsysim-core" if version > SCHEMA_VERSION else "")
    if (not versioned or data["schema_version"] == 1) and "regime" in data:   # (version 1: its own field)
        data = {**data, "details": {"regime": data["regime"]} if data["regime"] is not None else {}}
        del data["regime"]
    data = {k: v for k, v in data.items() if k not in _NOT_FIELDS}
    # What to_json always writes must be there: every field of each rank, and with a schema_version
    # every field of the result (an older file may leave out those with defaults).
    missing = [(f"result.{f.name}", "result") for f in attrs.fields(TrainingMemoryResult)
               if versioned and f.name not in data]
    ranks = data["ranks"] if isinstance(data.get("ranks"), (list, tuple)) else ()
    missing += [(f"result.ranks[{i}].{f.name}", "rank") for i, rank in enumerate(ranks) if isinstance(rank, dict)
                for f in attrs.fields(RankReport) if f.name not in rank]
    if missing:
        raise InvalidInputError(missing[0][0], None, f"present in a {missing[0][1]} written by {_TO_JSON}",
                                "required field missing")
    try:
        result = _converter.structure(data, TrainingMemoryResult)
    except RecursionError as err:
        raise InvalidInputError("result", "(nested too deeply)", f"a result written by {_TO_JSON}",
                                "nested too deeply") from err
    except Exception as err:    # cattrs groups the field errors
        messages = (cattrs.transform_error(err, path="result", format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err) or type(err).__name__])
        parameter, value = _error_path(messages, data)
        if parameter is None:
            field = _first_field(err)
            parameter = f"result.{field}" if field else "result"
            value = _shown(data.get(field)) if field else "(a JSON object)"
        more = f"; and {len(messages) - 3} more" if len(messages) > 3 else ""
        raise InvalidInputError(parameter, value, f"a result written by {_TO_JSON}",
                                "; ".join(messages[:3]) + more) from err
    _check_result(result)
    return result


_PATH_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\['([^']*)'\]")


def _error_path(messages, data):
    """The input a cattrs error is about, from the path its first message ends with
    (``... @ result.ranks[1].terms[0]``): its parameter name and the value found there."""
    from .catalog.files import _shown
    path = messages[0].rpartition(" @ ")[2] if messages and " @ " in messages[0] else ""
    if not path.startswith("result"):
        return None, None
    parameter, value = "result", data
    for attr, index, key in _PATH_STEP.findall(path, len("result")):
        if index:
            if not isinstance(value, (list, tuple)) or int(index) >= len(value):
                break           # the container itself is wrong ("x" for a list): name it
            parameter, value = f"{parameter}[{index}]", value[int(index)]
        else:
            if not isinstance(value, dict):
                break
            parameter, value = f"{parameter}.{attr or key}", value.get(attr or key)
    return (None, None) if parameter == "result" else (parameter, _shown(value))


def _is_bytes(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _check_memory(where: str, report, available) -> None:
    """Memory fields finite and >= 0, the total the components' sum, ``feasible`` as the totals
    say against ``available`` (in GB, as the solver decides): for the result and each rank."""
    from .catalog.files import _require
    for field in ("total_memory", *COMPONENTS, "host_memory"):
        _require(_is_bytes(getattr(report, field)), f"{where}.{field}", getattr(report, field),
                 "a finite number of bytes >= 0")
    parts = (report.weights + report.gradients + report.optimizer_state + report.activations
             + report.communication_buffers + report.runtime_overheads)
    _require(abs(report.total_memory - parts) <= 1e-9 * max(abs(parts), 1.0) + 1e-6, f"{where}.total_memory",
             report.total_memory, f"the sum of the components and runtime overheads, {parts!r}",
             "a total is what its components add up to")
    fits = report.total_memory * 1e-9 <= available * 1e-9
    _require(report.feasible is fits, f"{where}.feasible", report.feasible, f"{fits}, as the totals say",
             f"total {report.total_memory * 1e-9:.3f} GB against {available * 1e-9:.3f} GB available")


def _check_result(result) -> None:
    """A result read back must be one a solve could give (each rank too), ``selected`` consistent."""
    from .catalog.files import _require
    for field, allowed in (("available_memory", "a finite number of bytes >= 0"),
                           ("memory_utilization", "a finite number >= 0")):
        _require(_is_bytes(getattr(result, field)), f"result.{field}", getattr(result, field), allowed)
    _require(result.available_memory > 0, "result.available_memory", result.available_memory, "a number of bytes > 0")
    _check_memory("result", result, result.available_memory)
    phases = f"None or one of {', '.join(PHASES)}"
    _require(result.peak_phase in (None, *PHASES), "result.peak_phase", result.peak_phase, phases)
    for field in ("microbatch", "layers_per_stage"):
        _require(getattr(result, field) >= 1, f"result.{field}", getattr(result, field), "an integer >= 1")
    for axis, value in result.parallelism.items():
        _require(not isinstance(value, bool) and isinstance(value, int) and value >= 1,
                 f"result.parallelism.{axis}", value, "an integer >= 1")
    for axis in ("tp", "pp", "dp", "ep"):
        _require(axis in result.parallelism, f"result.parallelism.{axis}", None, "present: an integer >= 1",
                 "required field missing")
    _check_selected(result)
    for i, rank in enumerate(result.ranks):
        where = f"result.ranks[{i}]"
        _check_memory(where, rank, result.available_memory)
        _require(rank.stages and min(rank.stages) >= 0 and len(set(rank.stages)) == len(rank.stages),
                 f"{where}.stages", list(rank.stages), "a non-empty list of distinct pipeline stages (0-based)")
        _require(rank.ranks >= 1, f"{where}.ranks", rank.ranks, "an integer >= 1 (devices in this class)")
        _require(rank.layers >= 0, f"{where}.layers", rank.layers, "an integer >= 0")
        _require(math.isfinite(rank.in_flight) and rank.in_flight >= 0, f"{where}.in_flight", rank.in_flight,
                 "a finite number >= 0")
        _require(rank.peak_phase in (None, *PHASES), f"{where}.peak_phase", rank.peak_phase, phases)
        _require(rank.terms, f"{where}.terms", [], "the rank's memory terms (a non-empty list)")
        _require(rank.name.strip(), f"{where}.name", rank.name, "a non-empty string")
    names = [rank.name for rank in result.ranks]
    if names:
        _require(result.heaviest_rank in names, "result.heaviest_rank", result.heaviest_rank,
                 f"the name of one of the ranks: {', '.join(map(repr, names))}")
        heaviest = result.ranks[names.index(result.heaviest_rank)].total_memory
        _require(abs(heaviest - result.total_memory) <= 1e-9 * max(result.total_memory, 1.0) + 1e-6,
                 "result.total_memory", result.total_memory, f"the heaviest rank's total, {heaviest!r}",
                 f"the result reports its heaviest rank, {result.heaviest_rank!r}")
    else:
        _require(result.heaviest_rank is None, "result.heaviest_rank", result.heaviest_rank,
                 "None for a result without ranks")
    utilization = result.total_memory * 1e-9 / (result.available_memory * 1e-9)
    _require(abs(result.memory_utilization - utilization) <= 1e-9 * max(utilization, 1.0),
             "result.memory_utilization", result.memory_utilization, f"total / available = {utilization!r}")


_SELECTED_OWN = ("profile", "optimizer", "activation_checkpointing")
_SELECTED_RULES = ("tp_rule", "pp_rule", "dp_rule", "ep_rule", "cp_rule")


def _check_selected(result) -> None:
    """``selected`` names the result's own profile, optimizer and checkpointing strategy, and
    one sharding rule per axis, each as the installed plugins spell it."""
    from .catalog.files import _require
    selected, keys = result.selected, _SELECTED_OWN + _SELECTED_RULES
    for key in sorted(set(selected) - set(keys)):
        raise InvalidInputError(f"result.selected.{key}", selected[key], f"one of the keys {', '.join(keys)}",
                                "unknown key")
    for key in keys:
        _require(key in selected, f"result.selected.{key}", None, f"present in a result written by {_TO_JSON}",
                 "required field missing")
    for key in _SELECTED_OWN:
        _require(selected[key] == getattr(result, key), f"result.selected.{key}", selected[key],
                 f"{getattr(result, key)!r}, the result's {key}")
    try:
        from .manager import get_plugin_manager
        registry = get_plugin_manager().registry
        tables = {"profile": registry.profiles, "optimizer": registry.optimizers,
                  "activation_checkpointing": registry.checkpointing,
                  **dict.fromkeys(_SELECTED_RULES, registry.sharding_rules)}
    except Exception:       # no registry here (a broken plugin): the names cannot be checked
        tables = {}
    for key in keys:
        name, known = selected[key], tables.get(key)
        listing = f": one of {', '.join(sorted(known))}" if known is not None else ""
        _require(name.strip() and (known is None or name in known), f"result.selected.{key}", name,
                 f"a name the installed plugins provide{listing}",
                 "a result names the plugins' specs it was solved with")


def _first_field(err: BaseException) -> str | None:
    """The unknown top-level field a cattrs error names (a field's own errors carry their path)."""
    import cattrs
    if isinstance(err, cattrs.ClassValidationError):
        for exc in err.group_exceptions()[1]:
            if isinstance(exc, cattrs.ForbiddenExtraKeysError):
                return sorted(exc.extra_fields)[0]
    return None


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def format_gb(nbytes) -> str:
    """The reference's rendering of bytes in GB (pint's ``~P``): the float's repr, ``×10⁻⁵`` exponents."""
    text = repr(float(nbytes * 1e-9))
    if "e" in text:
        mantissa, exponent = text.split("e")
        text = f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"
    return f"{text} GB"


def trace_summary(result) -> str:
    """``constraint_trace``'s first line: the components in GB (runtime overheads when there are any)."""
    return (f"Training Memory: weights={format_gb(result.weights)}, gradients={format_gb(result.gradients)}, "
            f"optimizer={format_gb(result.optimizer_state)}, activations={format_gb(result.activations)}, "
            f"buffers={format_gb(result.communication_buffers)}"
            + (f", runtime overheads={format_gb(result.runtime_overheads)}" if result.runtime_overheads else "") + ".")
