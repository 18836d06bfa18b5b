"""Plan search: every valid parallel layout for a device count, the ones that fit, and the
Pareto front of memory headroom against step time (seconds per optimizer step).

A candidate is (tp, cp, pp, dp, ep, data-parallel rule, checkpointing strategy, sequence
parallelism, micro-batch); dp = devices / (tp x cp x pp), the micro-batch divides
global_batch / dp and gradient accumulation makes up the rest. Every installed
data-parallel rule and checkpointing strategy takes part, third-party ones included.

Validity: tp is a power of two up to the devices of a node (8 when the hardware does not
say) and divides the heads; cp (context parallelism, ring attention) divides seq_len;
pp <= layers; ep divides dp x cp and the experts (MoE only).

No duplicates: layouts that differ only in something that changes nothing are enumerated
once. When dp x cp = 1 every built-in data-parallel rule (``zero1``-``zero3``, ``fsdp``,
``fsdp-grad-op``, ``hsdp``: they shard over dp x cp) is ``zero0``, so such a layout is
enumerated once, as ``zero0`` (a third-party rule, whose effect the search cannot know,
still takes part). Sequence parallelism needs tensor parallelism: at tp = 1 a layout is
enumerated once, with ``sequence_parallel=False``. Repeated names and values in the
``checkpointing``, ``data_parallel`` and ``sequence_parallel`` arguments count once.

**Profile**: every layout is solved under one profile (``profile``, default the solver's:
``reference`` for ``TrainingMemoryModel()``), with the measured-grade options given
(``regime``, ``optimizer_impl``, ``attention``, ``dropout``, ``runtime_overheads``,
``lora``: the run, not the layout). The inputs that do not depend on the layout are checked
first, by one solve per checkpointing strategy at one device: a bad option, or a run the
profile cannot describe (e.g. an optimizer without a measured-grade model, a model without
shapes), raises there, before anything is enumerated. A layout the rules reject counts as
not fitting; an error saying the measured profile cannot describe the run (its
``parameter`` is ``optimizer``, ``activation_checkpointing``, ``precision`` or ``model.*``)
stops the search instead; a layout the profile cannot describe (LoRA split by tp, compile under
a layout it refuses, ...) is left out and counted in a note: one ranking never mixes profiles
(the CLI refuses the search, naming what is not modelled).

**Candidates evaluated** counts every layout enumerated. Each is either solved through the
whole plugin pipeline (``solves``) or pruned: memory grows with the micro-batch while
gradients accumulate (gas >= 2) for every built-in plugin, so once a micro-batch does not fit,
the larger ones of the same layout are counted as not fitting without solving them, but for
the last, gas = 1 (no gradients of an earlier micro-batch are alive in its forward: an
``fsdp-grad-op`` layout can fit only there), which is solved unless the weights, optimizer
state and activations of the micro-batch that did not fit (``without_gradients``, one more
solve) are over already; and once a layout does not fit at
micro-batch 1, its weights, gradients and optimizer state (``state_bytes``, one more solve)
bound every strategy and sequence parallelism of it from below: over the capacity, those are
counted as not fitting unsolved too (``state_pruned``); so does the first last micro-batch
(gas = 1) solved among them, for their last ones (a sibling that fits shows the bound is not
over, without that solve). ``assume_monotone=False`` solves them all. Every layout reported as
fitting was solved.

**Workers**: a large search (``PARALLEL_MIN`` candidates or more, divided by the profile's
declared ``solve_cost``: 500 under the measured profile; or ``workers=N``) is
evaluated in chunks of whole layouts by forked worker processes, each running the same
plugin pipeline; rows are merged in enumeration order, so the result (counts, fits, the
front) is the in-process one, field for field. ``workers=1`` evaluates in-process, which
is also the fallback wherever workers cannot run.

**Step time**: a registered step-time model (``StepTimeSpec``, the hook
``mlsysim_step_time_models``; the built-in ``roofline``, ``mlsysim_plugins.steptime``, is
derived in docs/planner.md) gives every layout that fits seconds per optimizer step, tokens/s
and MFU; layouts are ranked fastest first. Its ``check`` refuses hardware it cannot time (the
built-in: without its topology, or the ``flops``, ``tp_bandwidth``, ``network_bandwidth``
overrides, an error naming the missing fields) before anything is solved. TP and EP groups stay inside a node (tp x ep <= devices per node;
the NVLink domain where the catalog declares one, ``scale_up_domain``) unless
``allow_cross_node_tp`` (both may span nodes) or ``allow_cross_node_ep`` (EP groups may); ``max_tp`` caps tp.

**Opt-in axes** (``search_plans``'s ``allow_cross_node_ep``, ``interleave``, ``allow_compile``,
``allow_float8``; docs/planner.md, "The search space"): each off by default, the search then the
one it always was; on, each layout is also tried with the axis' variants (a group's ``variant``:
vp, compiled, float8 and its index in the search's table of solve options and timings), solved and
timed exactly as ``time_plan`` would, a refused variant counted in ``notes``.
"""

from __future__ import annotations

import array
import functools
import gc
import heapq
import itertools
import math
import operator
import os
import shutil
import sys
import time
from typing import Callable, Mapping, NamedTuple, Sequence

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from .inputs import _catalog_value, check_plan
from .solver import TrainingMemoryModel, solve_plan
from .plan import FrozenMap, TrainingPlan
from .specs import DATA

# A data-parallel rule that shards over dp x cp ranks only, and so does at dp x cp = 1 what the
# unsharded rule (zero0, the contract's zero_stage=0) does, declares it under this key of its
# extensions: the search then enumerates that layout once, as zero0. A rule that declares nothing
# is enumerated as itself (the search cannot know what it does at one rank).
ONE_RANK_UNSHARDED = "search.unsharded_at_one_rank"


def unsharded_at_one_rank(rules) -> tuple[str, ...]:
    """The names of ``rules`` (name -> ShardingRuleSpec) that declare ``ONE_RANK_UNSHARDED``."""
    return tuple(name for name, spec in rules.items() if spec.extensions.get(ONE_RANK_UNSHARDED))


# A regime that needs its data-parallel rule to do something (the measured profile's ``Regime.requires``) says which
# installed rules it refuses wherever dp x cp > 1: the profile options' ``regime`` declares
# ``refused_rules(registry, rules) -> {rule: why}``. The search leaves those rules out of such layouts up front, said in
# one note, instead of preparing each layout to refuse it; at dp x cp = 1 every rule serves, as before.
def refused_rules(options, registry, rules) -> dict[str, str]:
    """{rule: why} for the data-parallel ``rules`` the profile options' regime refuses wherever dp x cp > 1 ({}: none,
    or a regime that declares no ``refused_rules``)."""
    ask = getattr(getattr(options, "regime", None), "refused_rules", None)
    return dict(ask(registry, tuple(rules))) if callable(ask) else {}


def _refused_note(refused: Mapping[str, str], layouts: int) -> str:
    """The note of the rules a regime refuses, grouped by why."""
    by_why: dict[str, list[str]] = {}
    for rule, why in refused.items():
        by_why.setdefault(why, []).append(rule)
    return ("; ".join(f"{why}: {', '.join(rules)} left out" for why, rules in by_why.items())
            + f" of the layouts with dp x cp > 1 ({layouts:,} layouts not enumerated)")


class Candidate(NamedTuple):
    """One layout that fits, with its memory and step time.

    A named tuple (built in C: a search makes tens of thousands of them): fields by name
    or position, compared and hashed as the tuple of its fields."""

    tp: int
    cp: int
    pp: int
    dp: int
    ep: int
    data_parallel: str
    checkpointing: str
    sequence_parallel: bool
    microbatch: int
    gradient_accumulation_steps: int
    total_memory: int | float
    headroom: int | float
    step_time: float        # seconds per optimizer step
    tokens_per_s: float     # the whole run's
    mfu: float              # model FLOPs / (step time x devices x dense bf16 peak)
    bubble: float           # the pipeline's idle share, (pp - 1) / (gas + pp - 1)
    recompute: float        # the share of the forward the backward runs again
    pareto: bool = False
    vp: int = 1             # model chunks per pipeline rank (> 1: interleaved 1F1B; 1 when pp = 1)
    compiled: bool = False  # torch.compile'd blocks (compile="blocks"): memory-bound ops fused
    float8: bool = False    # float8 linears (float8="tensorwise")

    def as_row(self) -> dict:
        return self._asdict()


@attrs.frozen(kw_only=True)
class PlanSearch:
    """What a search found: counts, every layout that fits (cheapest first), the Pareto front."""

    model: str
    hardware: str
    devices: int
    global_batch: int
    seq_len: int
    candidates: int          # layouts enumerated (evaluated: solved or pruned)
    solves: int              # full solves run (the rest were pruned by monotonicity or by state_bytes)
    seconds: float
    fits: tuple[Candidate, ...]
    pareto: tuple[Candidate, ...]
    assumptions: Mapping[str, float]
    profile: str = "reference"          # the profile every layout was solved under
    profile_note: str | None = None     # a note on the profile from the caller, if anything to say
    # Everything about the run that changes the numbers and is the same for every layout
    # (precision and regime, optimizer, LoRA/QLoRA, the measured options, the strategies and
    # rules searched, strategies left out): see ``search_plans``.
    run: Mapping[str, object] = attrs.field(factory=dict)
    # The notes that hold for the whole search (the model's and the run's, the same for every
    # layout: "WARNING:", "approximation:", catalog provenance, LoRA's default targets).
    notes: tuple[str, ...] = ()
    # What the step-time model read (model figures, hardware, calibration): components() uses it.
    timing: Mapping[str, object] = attrs.field(factory=dict, eq=False, repr=False)
    # When no layout fits: the CLOSEST ones (least memory first), each a mapping of its layout,
    # its total and how much it is over the capacity less the headroom (bytes).
    closest: tuple[Mapping[str, object], ...] = ()
    state_pruned: int = 0    # layouts counted as not fitting, unsolved, by a bound: state_bytes, without_gradients

    def components(self, candidate: Candidate) -> dict:
        """The candidate's step time, every component in seconds (the step-time model's)."""
        c = candidate
        timing = _variant_timing(self.timing, c)
        return timing["time"](timing, tp=c.tp, cp=c.cp, pp=c.pp, dp=c.dp, ep=c.ep, rule=c.data_parallel,
                                   recompute=c.recompute, sp=c.sequence_parallel, mb=c.microbatch,
                                   gas=c.gradient_accumulation_steps)

    def _row(self, candidate: Candidate) -> dict:
        row = candidate.as_row()
        row["step_time_components"] = self.components(candidate) if self.timing else {}
        row["profile"], row["units"] = self.profile, ROW_UNITS
        return row

    def to_dict(self) -> dict:
        from .serialization import SCHEMA_VERSION
        return {"schema_version": SCHEMA_VERSION, "profile": self.profile, "profile_note": self.profile_note,
                "model": self.model, "hardware": self.hardware, "devices": self.devices,
                "global_batch": self.global_batch, "seq_len": self.seq_len, "candidates": self.candidates,
                "solves": self.solves, "seconds": self.seconds, "assumptions": dict(self.assumptions),
                "run": dict(self.run), "notes": list(self.notes), "units": UNITS,
                "calibrated": bool(self.timing) and self.timing["calibrated"],
                "fits": [self._row(c) for c in self.fits], "pareto": [self._row(c) for c in self.pareto],
                "closest": [dict(c) for c in self.closest]}

    def describe_run(self) -> str:
        """One line: what changes the numbers beside the layout (``run``), in words."""
        return describe_search_run(self.run)

    def _summary(self) -> str:
        return (f"{self.model} on {self.devices} x {self.hardware}, profile {self.profile}, global batch "
                f"{self.global_batch}, seq {self.seq_len}: {self.candidates:,} layouts, {len(self.fits):,} fit, "
                f"{len(self.pareto)} on the Pareto front")

    def to_html(self, rows: int | None = 50, pareto_only: bool = True) -> str:
        """An HTML table of the layouts (the Pareto front by default), for notebooks;
        ``rows=None``: all of them."""
        from html import escape
        chosen = (self.pareto if pareto_only else self.fits)[:_rows(rows)]
        head = ("tp", "cp", "pp", "dp", "ep", "vp", "impl", "dp rule", "checkpointing", "seq. parallel", "micro-batch", "grad. accum.",
                "memory GB (1e9 B)", "memory GiB (2^30 B)", "headroom GB", "step s", "tokens/s", "MFU", "bubble",
                "Pareto")
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
                c.tp, c.cp, c.pp, c.dp, c.ep, c.vp, _AXIS_COLUMNS[1][1](c), c.data_parallel, c.checkpointing,
                "yes" if c.sequence_parallel else "no",
                c.microbatch, c.gradient_accumulation_steps, f"{c.total_memory * 1e-9:,.2f}",
                f"{c.total_memory / 2**30:,.2f}", f"{c.headroom * 1e-9:,.2f}", f"{c.step_time:.3f}",
                f"{c.tokens_per_s:,.0f}", f"{c.mfu:.1%}", f"{c.bubble:.3f}",
                "*" if c.pareto else "")) + "</tr>" for c in chosen)
        caption = escape(self._summary() + f". {self.describe_run()}"
                         + "".join(f". note: {n}" for n in self.notes)
                         + (f". {self.profile_note}" if self.profile_note else ""))
        return (f"<table><caption>{caption}</caption><thead><tr>"
                + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr></thead><tbody>{body}</tbody></table>")

    def _repr_html_(self) -> str:   # Jupyter shows a search as this table
        return self.to_html()

    def table(self, rows: int | None = 20, pareto_only: bool = True, width: int | None = None) -> str:
        """The CLI's table: the note on the profile (if any), a header naming the profile,
        then ``rows`` layouts (``None``: all of them) of the front (or of every fit), in at most
        ``width`` characters (default: the terminal's, ``COLUMNS``, else 120): the columns a
        narrower table cannot hold are left out, least useful first, and named under it."""
        rows = _rows(rows)
        chosen = self.pareto if pareto_only else self.fits
        if rows is None:
            rows = len(chosen)
        head = f"{self._summary()} (headroom vs step time) [{self.seconds:.2f} s]\n{self.describe_run()}"
        head += "".join(f"\nnote: {n}" for n in self.notes)
        if self.profile_note:
            head = f"{self.profile_note}\n\n{head}"
        if not chosen:
            return head + "\n" + _nothing_fits(self)
        shown = chosen[:rows]
        spec = list(_TABLE_COLUMNS)
        at = 5      # (after "ep")
        for name, cell, priority, off_default in _AXIS_COLUMNS:
            if any(map(off_default, shown)):
                spec.insert(at, (name, cell, priority))
                at += 1
        columns = [(name, [cell(c) for c in shown]) for name, cell, _ in spec]
        widths = [max(len(name), *map(len, cells)) for name, cells in columns]
        limit = max(width if width is not None else shutil.get_terminal_size((120, 24)).columns, 20)
        dropped: list[str] = []
        for i in sorted(range(len(columns)), key=lambda i: spec[i][2]):
            if sum(w for j, w in enumerate(widths) if columns[j][0] not in dropped) + 2 * (
                    len(columns) - len(dropped) - 1) <= limit or spec[i][2] >= _KEEP:
                break
            dropped.append(columns[i][0])
        kept = [(name, cells, w) for (name, cells), w in zip(columns, widths) if name not in dropped]
        lines = [head, "  ".join(f"{name:>{w}}" for name, _, w in kept)]
        lines += ["  ".join(f"{cells[r]:>{w}}" for _, cells, w in kept) for r in range(len(shown))]
        if len(chosen) > rows:
            lines.append(f"... {len(chosen) - rows} more (--json for all)")
        if dropped:
            lines.append(f"(left out to fit {limit} columns: {', '.join(dropped)}; --json has every field, "
                         "COLUMNS sets the width)")
        return "\n".join(lines)


# The text table's columns: (header, cell, priority); the lowest priority is left out first
# when the table is wider than the terminal, and nothing below _KEEP ever is.
_TABLE_COLUMNS = (
    ("tp", lambda c: str(c.tp), 9), ("cp", lambda c: str(c.cp), 9), ("pp", lambda c: str(c.pp), 9),
    ("dp", lambda c: str(c.dp), 9), ("ep", lambda c: str(c.ep), 9),
    ("dp rule", lambda c: c.data_parallel, 9), ("ckpt", lambda c: c.checkpointing, 9),
    ("sp", lambda c: "y" if c.sequence_parallel else "n", 5), ("mb", lambda c: str(c.microbatch), 9),
    ("gas", lambda c: str(c.gradient_accumulation_steps), 6),
    ("memory GB", lambda c: f"{c.total_memory * 1e-9:.2f}", 9), ("GiB", lambda c: f"{c.total_memory / 2**30:.2f}", 2),
    ("headroom GB", lambda c: f"{c.headroom * 1e-9:.2f}", 7), ("step s", lambda c: f"{c.step_time:.3f}", 9),
    ("tokens/s", lambda c: f"{c.tokens_per_s:,.0f}", 4), ("MFU", lambda c: f"{c.mfu:.1%}", 3),
    ("bubble", lambda c: f"{c.bubble:.3f}", 1), ("P", lambda c: "*" if c.pareto else "", 8),
)
# The searched axes' columns, shown only when a shown row is off their default (a search without
# --interleave, --allow-compile or --allow-float8 prints the table it always did): placed after "ep".
_AXIS_COLUMNS = (
    ("vp", lambda c: str(c.vp), 9, lambda c: c.vp != 1),
    ("impl", lambda c: "+".join(n for n, on in (("compile", c.compiled), ("fp8", c.float8)) if on) or "eager", 9,
     lambda c: c.compiled or c.float8),
)
_KEEP = 9


CLOSEST = 5     # layouts a search where none fits shows
NEAR = 10 * CLOSEST     # the layouts each evaluation keeps to choose them from
TERMS_AT = 0.6      # a micro-batch is solved with its terms where the one before had this share of the limit


def state_bytes(result) -> int | float:
    """A lower bound on the total of every layout that differs from ``result``'s only in its
    checkpointing strategy and sequence parallelism: the most accelerator bytes of weights,
    gradients and optimizer state that are alive in one phase of one rank. Every term is
    >= 0, so a rank's total (its peak phase's terms, or all of them, plus its runtime overheads)
    is at least that phase's state terms; and a strategy's callable adds activations only
    (the solver checks the component), while no built-in state term reads the strategy or
    sequence parallelism (tests/applications/test_search_bounds.py checks it on a grid). A
    search counts such a sibling as not fitting, unsolved, when this exceeds the capacity less
    the headroom (``assume_monotone=False`` solves it)."""
    from .terms import GRADIENTS, OPTIMIZER_STATE, WEIGHTS
    return _most_alive(result, (WEIGHTS, GRADIENTS, OPTIMIZER_STATE))


def _most_alive(result, components) -> int | float:
    """The most accelerator bytes of ``components`` alive in one phase of one rank of ``result``."""
    from .terms import ACCELERATOR, PHASES
    return max(max(sum(t.nbytes for t in terms if t.tier == ACCELERATOR and t.component in components
                       and phase in t.phases) for phase in PHASES)
               for terms in [r.terms for r in result.ranks or ()] or [result.terms])


def without_gradients(result) -> int | float:
    """A lower bound on the total of the same layout at its last micro-batch (gas = 1), from ``result``
    at a smaller one: the most accelerator bytes of weights, optimizer state and activations alive in
    one phase of one rank. Weights and optimizer state do not depend on the micro-batch, activations grow
    with it (a stage's in-flight micro-batches, min(stages, gas), times the micro-batch); the gradients,
    which gas = 1 does not accumulate, the buffers and the runtime overheads are left out (checked on a
    grid of full solves in tests/applications/test_search_bounds.py). None: 0."""
    from .terms import ACTIVATIONS, OPTIMIZER_STATE, WEIGHTS
    return 0 if result is None else _most_alive(result, (WEIGHTS, OPTIMIZER_STATE, ACTIVATIONS))


def _closest(near: list, capacity: int, margin: float) -> tuple[dict, ...]:
    """The ``near`` heap's layouts, least memory first, as mappings."""
    keys = ("tp", "cp", "pp", "dp", "ep", "data_parallel", "checkpointing", "sequence_parallel", "microbatch",
            "gradient_accumulation_steps", "vp", "compiled", "float8")
    best, seen = [], set()
    for e in sorted(near, key=lambda e: (-e[0], e[1:])):
        if (e[0], e[1:7]) not in seen and len(best) < CLOSEST:   # (one row per layout and memory)
            seen.add((e[0], e[1:7]))
            best.append(e)
    return tuple({**dict(zip(keys, e[1:])), "total_memory": -e[0], "over": -e[0] - (capacity - margin)}
                 for e in best)


def _resolve_closest(near: list, bounded: list, context: tuple, margin: float) -> int:
    """Add to ``near`` the layouts ``bounded`` holds (micro-batch 1 pruned by its lower bound) that
    could be among the CLOSEST, least bound first, each solved (its total >= its bound): stop at a
    bound above the CLOSEST-th total ``near`` has. Returns the solves."""
    solves, capacity = 0, context[5].memory_capacity
    unpruned = context[:12] + (False,) + context[13:]      # (assume_monotone off: nothing bounded again)
    for bound, group in sorted(bounded, key=lambda e: (e[0], e[1][:8])):
        best = _closest(near, capacity, margin)
        if len(best) == CLOSEST and bound * (1 - 1e-9) > best[-1]["total_memory"]:
            break
        extra: list = []
        solves += _evaluate([group], [], unpruned, 0, None, extra, {})[0]
        near += extra
    return solves


def _nothing_fits(found: "PlanSearch") -> str:
    """What a search where no layout fits says instead of an empty table: the closest layouts,
    by how much each is over, and the `fit` command that explains one."""
    if not found.candidates:
        return (f"No valid layout of {found.devices:,} devices: tp x cp x pp x dp must make the devices, with tp within "
                f"a node, pp at most the layers, cp dividing seq {found.seq_len:,} and dp dividing global batch "
                f"{found.global_batch:,} (docs/planner.md, 'The search space'): give fewer devices or a larger global "
                "batch.")
    if not found.closest:
        return f"No layout of the {found.candidates:,} enumerated fits (none could be solved)."
    lines = [f"No layout of the {found.candidates:,} enumerated fits. The closest (micro-batch 1 each):",
             f"{'tp':>4}{'cp':>4}{'pp':>4}{'dp':>6}{'ep':>4}  {'dp rule':<12}{'ckpt':<12}{'sp':>3}"
             f"{'memory GB':>11}{'over GB':>9}{'GiB over':>9}"]
    for c in found.closest:
        lines.append(f"{c['tp']:>4}{c['cp']:>4}{c['pp']:>4}{c['dp']:>6}{c['ep']:>4}  {c['data_parallel']:<12}"
                     f"{c['checkpointing']:<12}{'y' if c['sequence_parallel'] else 'n':>3}"
                     f"{c['total_memory'] * 1e-9:>11.2f}{c['over'] * 1e-9:>9.2f}{c['over'] / 2**30:>9.2f}")
    c = found.closest[0]
    import shlex
    command = ["mlsysim-core", "fit", "techniques", "-m", found.model, "-g", found.hardware, "-b",
               str(found.global_batch), "-s", str(found.seq_len), "--tp-size", str(c["tp"]), "--cp-size", str(c["cp"]),
               "--pp-size", str(c["pp"]), "--dp-size", str(c["dp"]), "--ep-size", str(c["ep"]), "--data-parallel",
               c["data_parallel"], "--activation-checkpointing", c["checkpointing"],
               "--sequence-parallel" if c["sequence_parallel"] else "--no-sequence-parallel",
               "--profile", found.profile]
    if c.get("vp", 1) > 1:
        command += ["--pipeline-schedule", "interleaved-1f1b", "--virtual-stages", str(c["vp"])]
    if c.get("compiled"):
        command.append("--compile-blocks")
    if c.get("float8"):     # (the memory option the row was solved with: none for an implementation that declares none)
        memory = FLOAT8_RECIPE if found.run.get("allow_float8") is True else found.run.get("float8_memory")
        command += ["--float8", memory] if memory else []
    lines.append("What would make the closest fit, with the least added step time (the run's other "
                 f"options as given to search):\n  {shlex.join(command)}")
    return "\n".join(lines)


# The units of a search's JSON rows (what a number means without reading the code).
UNITS = {"total_memory": "bytes", "headroom": "bytes (capacity - total)", "step_time": "seconds per optimizer step",
         "tokens_per_s": "tokens per second, the whole run", "mfu": "share of the dense bf16 peak (0-1)",
         "bubble": "share of the pipeline idle (0-1)", "recompute": "share of the forward run again (0-1)",
         "step_time_components": "seconds per optimizer step", "assumptions": "FLOP/s, bytes/s, seconds, shares"}


ROW_UNITS = "memory in bytes, times in seconds per step, tokens per second; mfu, bubble, recompute: shares (0-1)"


def _rows(rows):
    """A row count: a whole number >= 1, or None (every row)."""
    if rows is None:
        return None
    if isinstance(rows, bool) or not isinstance(rows, int):
        raise InvalidInputTypeError("rows", rows, "a whole number of rows >= 1, or None for all of them")
    if rows < 1:
        raise InvalidInputError("rows", rows, "a whole number of rows >= 1, or None for all of them")
    return rows


# A row (a tuple of Candidate's fields in order) as a Candidate, without a Python-level call.
_candidate = functools.partial(tuple.__new__, Candidate)


SEARCH_MAX = 2**40     # devices and global batch a search takes (their divisors are enumerated)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if (1 << k) <= limit]


@functools.lru_cache(maxsize=1024)
def _divisors(n: int) -> tuple[int, ...]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(sorted(set(small + [n // d for d in small])))


def _one_rank_rules(dp_rules: Sequence[str], installed) -> list[str]:
    """The data-parallel rules to enumerate when dp x cp = 1: those that declare they are
    zero0 there (ONE_RANK_UNSHARDED) count once, as zero0; the others stay as themselves."""
    if "zero0" not in installed:
        return list(dp_rules)
    out = []
    for rule in dp_rules:
        rule = "zero0" if installed[rule].extensions.get(ONE_RANK_UNSHARDED) else rule
        if rule not in out:
            out.append(rule)
    return out


def _variant_timing(timing: Mapping, c: Candidate) -> Mapping:
    """The timing a row was timed with: the base one, or its variant's (interleave factor,
    compile, float8: ``search_plans``'s opt-in axes)."""
    v = c.vp if c.vp > 1 and timing.get("chunks", 1) == 1 else None
    key = (v, bool(c.compiled), bool(c.float8))
    if key == (None, False, False):
        return timing
    return timing["variants"][key]


def _float8_label(float8) -> str:
    """How a search's float8 axis is said: float8='tensorwise' (True: the default implementation, the memory
    profile's recipe), else the implementation's name and the memory option it declares."""
    if float8 is True:
        return f"float8={FLOAT8_RECIPE!r}"
    memory = getattr(float8, "memory", None)
    return (f"float8={float8.name!r}" + (f" (memory as float8={memory!r})" if memory
                                         else " (memory: the 16-bit run's, not modelled)"))


def _float8_memory(float8) -> dict:
    """The solve option a float8 row's memory is solved with: the default's FLOAT8_RECIPE, else the one
    the implementation declares (``memory``; None: none, the 16-bit run's memory)."""
    memory = FLOAT8_RECIPE if float8 is True else getattr(float8, "memory", None)
    return {"float8": memory} if memory else {}


def _variant_note(interleave: bool, allow_compile: bool, allow_float8: bool, float8=True) -> str:
    axes = []
    if interleave:
        axes.append("the interleave factor (interleaved 1F1B with v model chunks per rank, v dividing a stage's layers; "
                    "column vp)")
    if allow_compile:
        axes.append(f"compile={COMPILE_MODE!r} (memory-bound ops timed fused)")
    if allow_float8:
        axes.append(f"{_float8_label(float8)} (float8 GEMMs and casts)")
    return "searched as axes: " + "; ".join(axes) + " (column impl: eager, compile, fp8)"


def _variant_table(*, interleave, allow_compile, allow_float8, model, timer, base, base_chunks, base_schedule,
                   casts=True,
                   options, strategies, one=None,
                   solver, hardware, global_batch, seq_len, precision, optimizer, profile, trainable_fraction,
                   communication_buffer_fraction, prepare):
    """The opt-in axes' variants: (table, variants) where table[i] = (solve options, timing, label,
    key) (table[0] the base, unused) and ``variants(pp)`` the (vp, compiled, float8, index) of a
    layout of pp stages. An option the profile does not take at all (not a refusal of one layout)
    is an error naming the axis."""
    impls = [(False, False)]
    if allow_compile:
        impls.append((True, False))
    if allow_float8:
        impls.append((False, True))
    if allow_compile and allow_float8:
        impls.append((True, True))
    vps = [None]
    if interleave:
        vps += sorted({v for pp in range(2, model.layers + 1) for v in interleave_factors(model.layers, pp)})
    for flag, name, on, extra in (("allow_compile", "compile", allow_compile, {"compile": COMPILE_MODE}),
                                  ("allow_float8", "float8", allow_float8, _float8_memory(casts))):
        if not on or not extra:
            continue
        try:    # (one device, one micro-batch: what a layout can refuse is counted per layout)
            solver.solve(model, hardware, global_batch, seq_len, precision, optimizer, strategies[0], 1, 1, 1, 1, 0,
                         1, trainable_fraction, communication_buffer_fraction, profile=profile,
                         **{**(one or options), **extra})
        except NotModelledError:
            pass
        except InvalidInputError as err:
            raise InvalidInputError(flag, True, f"a profile that models {name}= (the measured profile; this search's "
                                    f"is {profile!r})", f"{name}={extra[name]!r} was refused: {err}") from None
    table: list = [(options, base, None, (None, False, False))]
    index: dict = {}
    for v in vps:
        for compiled, float8 in impls:
            if v is None and not (compiled or float8):
                continue
            extra = {}
            if v is not None:
                extra.update(pipeline_schedule="interleaved-1f1b", virtual_stages=v)
            if compiled:
                extra["compile"] = COMPILE_MODE
            if float8:
                extra.update(_float8_memory(casts))
            chunks, schedule = base_chunks, base_schedule
            if v is not None:
                from .inverse import prepared_plan
                plan = prepared_plan(solver, model, hardware, 1, seq_len, dict(
                    precision=precision, optimizer=optimizer, activation_checkpointing=strategies[0], profile=profile,
                    **(one or options), pipeline_schedule="interleaved-1f1b", virtual_stages=v))
                schedule, chunks = plan.profile_options.pipeline_schedule, v
            # the optimizer step's bytes from the one-device solve of the variant's options, as time_plan
            # reads them (compile="blocks" changes them); a variant refused there keeps the base run's
            implementation = {k: v for k, v in extra.items() if k in ("compile", "float8")}
            result = prepare["result"]
            if implementation:
                try:
                    result = solver.solve(model, hardware, global_batch, seq_len, precision, optimizer, strategies[0],
                                          1, 1, 1, 1, 0, global_batch, trainable_fraction,
                                          communication_buffer_fraction, profile=profile,
                                          **{**(one or options), **implementation})
                except NotModelledError:
                    pass
            timing = dict(timer.prepare(**{**prepare, "result": result}, schedule=schedule, chunks=chunks,
                                        compiled=compiled, float8=casts if float8 else False),
                          time=timer.time, schedule=schedule)
            label = ", ".join(([f"compile={COMPILE_MODE!r}"] if compiled else [])
                              + ([_float8_label(casts)] if float8 else [])) or None
            index[(v, compiled, float8)] = len(table)
            table.append(({**options, **extra}, timing, label, (v, compiled, float8)))

    def variants(pp: int) -> tuple:
        row_vp = base_chunks if pp > 1 else 1
        out = []
        for v in [None, *interleave_factors(model.layers, pp)] if interleave else [None]:
            for compiled, float8 in impls:
                out.append((v or row_vp, compiled, float8, index.get((v, compiled, float8), 0)))
        return tuple(out)
    return table, variants


BASE_VARIANT = (1, False, False, 0)     # (vp, compiled, float8, index into the search's variant table)


def _enumerate(model, devices, global_batch, seq_len, max_tp, cp_allowed, dp_rules, strategies,
               sequence_parallel, one_rank_rules=None, node=None, variants=None, ep_node=None) -> list[tuple]:
    """Every valid layout, grouped by all but the micro-batch (see the module docstring).
    ``node``: tp x ep stays inside it (None: no limit); ``ep_node``: when given, the limit
    ``node`` puts on tp x ep is lifted (expert parallelism across nodes: ep any divisor of
    dp x cp and the experts). ``variants(pp)``: the (vp, compiled, float8, index) variants
    of a layout with pp stages (default: the base one only), innermost but for the micro-batch."""
    if variants is None:
        variants = _base_variants
    layers = model.layers
    experts = model.experts if model.is_sparse else 1
    if one_rank_rules is None:
        one_rank_rules = dp_rules
    no_tp_sp = (False,)     # sequence parallelism needs tp > 1
    groups = []   # (tp, cp, pp, dp, ep, rule, ckpt, sp, [micro-batches])
    for tp in _powers_of_two(min(max_tp, devices)):
        if devices % tp or (model.heads and model.heads % tp):
            continue
        for cp in _divisors(devices // tp):
            if seq_len % cp or (cp_allowed is not None and cp not in cp_allowed):
                continue
            for pp in _divisors(devices // (tp * cp)):
                if pp > layers:
                    continue
                dp = devices // (tp * cp * pp)
                if global_batch % dp:
                    continue
                micro = _divisors(global_batch // dp)
                eps = ([e for e in _divisors(dp * cp) if e <= experts and experts % e == 0
                        and (node is None or ep_node is not None or tp * e <= node)] if model.is_sparse else [1])
                rules = one_rank_rules if dp * cp == 1 else dp_rules    # nothing to shard over: zero0
                sps = sequence_parallel if tp > 1 else no_tp_sp
                kinds = variants(pp)
                for ep in eps:
                    for rule in rules:
                        for ckpt in strategies:
                            for sp in sps:
                                for variant in kinds:
                                    groups.append((tp, cp, pp, dp, ep, rule, ckpt, sp, variant, micro))
    return groups


def _base_variants(pp: int) -> tuple:
    return (BASE_VARIANT,)


FLOAT8_RECIPE = "tensorwise"    # what --allow-float8 tries: torchao's dynamic tensorwise scaling (what the step time models)
COMPILE_MODE = "blocks"         # what --allow-compile tries: torch.compile per decoder block (data parallelism composes)


def interleave_factors(layers: int, pp: int) -> tuple[int, ...]:
    """The interleave factors (model chunks per pipeline rank, > 1) the search tries at ``pp``
    stages of ``layers`` layers: the divisors of a stage's layers ceil(layers / pp) (the step
    time's L_s) with at least one layer in each of the pp x v chunks; none at pp = 1."""
    if pp <= 1:
        return ()
    return tuple(v for v in _divisors(-(-layers // pp)) if v > 1 and pp * v <= layers)


NVLINK_DOMAIN = "nvlink_domain_devices"     # a catalog entry's extra["performance"] key: the scale-up domain


def scale_up_domain(hardware) -> int | None:
    """The devices whose collectives run at ``intra_node_bandwidth``: the planner's node. The NVLink
    domain the accelerator's catalog entry declares (``extra["performance"]["nvlink_domain_devices"]``)
    where it is larger than ``devices_per_node`` (GB200 NVL72: 72 GPUs in one NVLink domain, the node
    the 4-GPU compute tray that the host-memory model reads), else ``devices_per_node``: groups inside
    it are NVLink's, groups crossing it the network's (``inter_node_bandwidth``, then the rate between
    domains). Hardware outside the catalog, or not the catalog's object (but for its memory, as
    steptime.envelope reads it), declares none."""
    from .catalog import find_hardware
    try:
        entry = find_hardware(hardware.name)
    except (InvalidInputError, InvalidInputTypeError):      # (not in the catalog: a user's HardwareNode)
        return hardware.devices_per_node
    if entry.value != hardware and attrs.evolve(entry.value, memory_capacity=hardware.memory_capacity,
                                                memory_bandwidth=hardware.memory_bandwidth) != hardware:
        return hardware.devices_per_node
    domain = (entry.extra.get("performance") or {}).get(NVLINK_DOMAIN)
    if isinstance(domain, int) and not isinstance(domain, bool) and domain > (hardware.devices_per_node or 0):
        return domain
    return hardware.devices_per_node


def _domain_notes(hardware, node) -> tuple[str, ...]:
    if node == hardware.devices_per_node:
        return ()
    return (f"collective groups placed in {hardware.name}'s {node}-device NVLink domain (its catalog entry's "
            f"{NVLINK_DOMAIN}): inside it at intra_node_bandwidth, across domains at inter_node_bandwidth; "
            f"devices_per_node {hardware.devices_per_node} stays the node the memory sees",)


def _positive_figures(**figures) -> None:
    """Each figure given (not None) is a positive finite number: the hardware's own figure replaced."""
    for name, value in figures.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not value > 0 or math.isinf(value)):
            raise InvalidInputError(name, value, "a positive finite number, or None for the hardware's own")


def search_plans(model, hardware, *, devices: int, global_batch: int, seq_len: int = 2048,
                 precision: str = "fp16", optimizer: str = "adam",
                 checkpointing: Sequence[str] | None = None, data_parallel: Sequence[str] | None = None,
                 sequence_parallel: Sequence[bool] = (True, False), max_tp: int | None = None,
                 context_parallel: Sequence[int] | None = None,
                 trainable_fraction: float = 1.0, communication_buffer_fraction: float = 0.05,
                 flops: float | None = None, tp_bandwidth: float | None = None,
                 network_bandwidth: float | None = None,
                 recompute: Mapping[str, float] | None = None, assume_monotone: bool = True,
                 solver: TrainingMemoryModel | None = None, workers: int | None = None,
                 progress: Callable[[int, int], None] | None = None, profile: str | None = None,
                 regime: str | None = None, optimizer_impl: str | None = None, attention: str | None = None,
                 dropout: float | None = None, runtime_overheads=None, lora=None, pipeline_schedule: str | None = None,
                 loss_parallel: bool | None = None, headroom: float | str | None = None, allow_cross_node_tp: bool = False,
                 power: float | None = None, calibration=None, step_time_model: str | None = None,
                 allow_cross_node_ep: bool = False,
                 interleave: bool = False, allow_compile: bool = False, allow_float8: bool = False,
                 plugin_options: Mapping[str, object] | None = None) -> PlanSearch:
    """Enumerate, solve and rank every valid layout (see the module docstring).

    ``context_parallel``: the cp sizes to consider (default: every one the layout allows,
    i.e. each divisor of devices / tp that divides seq_len; ``[1]`` leaves cp out).
    ``progress(done, total)`` is called about every 0.2 s and once at the end.
    ``workers``: processes evaluating layouts (None: one per usable CPU when the search has
    at least PARALLEL_MIN candidates; 1: in this process).
    ``profile``: the profile every layout is solved under (default: the solver's).
    ``headroom``: a margin kept free on top of the total (which already has the runtime
    overheads): bytes, or a string ``"8GiB"``, ``"8GB"`` or ``"10%"`` (of the capacity); a layout
    fits when total + margin <= capacity (default 0).
    ``regime``, ``optimizer_impl``, ``attention``, ``dropout``, ``runtime_overheads``,
    ``lora``, ``pipeline_schedule``, ``loss_parallel``: measured-grade options, passed to every ``solve`` (as
    ``solve`` reads them); the schedule's ``idle_slots`` is the step time's bubble.
    ``flops``, ``tp_bandwidth``, ``network_bandwidth``: override the hardware's dense bf16 peak
    FLOP/s and its intra- and inter-node bandwidth (B/s per device, one direction). ``power``: the
    run's power limit in watts, every layout timed at it (as ``time_plan``'s; default the board's TDP).
    ``recompute``: overrides a strategy's declared recompute share. ``calibration``: the
    step-time efficiencies (default: the accelerator's fitted ones, else ``steptime.DEFAULT``).
    ``step_time_model``: a registered one's name (default: the only one, else ``roofline``).

    The opt-in axes (each off by default: the search is then the one it always was; docs/planner.md,
    "The search space"): ``allow_cross_node_ep``: expert-parallel groups may span nodes (tp stays
    inside one unless ``allow_cross_node_tp``, which lifts both limits). ``interleave``: every
    pp > 1 layout also runs the interleaved 1F1B schedule with v model chunks per rank, v each of
    ``interleave_factors(layers, pp)`` (``pipeline_schedule`` must then be None or ``"1f1b"``,
    the schedule of v = 1). ``allow_compile``: every layout is also tried with
    ``compile="blocks"`` (timed with fused memory-bound ops); ``allow_float8``: with
    ``float8="tensorwise"`` (timed with float8 GEMMs and casts; True: torchao tensorwise; a
    registered float8 implementation's name or declaration: timed with its casts, its memory solved
    with the ``float8=`` option it declares, none: the 16-bit run's, said in a note); both: also with both. A variant
    the profile refuses for a layout is left out and counted in ``notes`` by reason.

    ``plugin_options``: {spec name: options} (a dict or its options object, as ``solve`` takes
    them), for a spec some layout of the search selects (the optimizer, a checkpointing strategy,
    the tp, cp, pp or ep rule, a data-parallel rule): each applies to the layouts that select that
    spec (a data-parallel rule's only to its own layouts), in their solve and their step time (the
    rule's declarations under its options), as ``time_plan`` times one layout with them; the other
    layouts keep the spec's defaults.
    """
    started = time.perf_counter()
    if solver is None:
        solver = TrainingMemoryModel()
    elif not isinstance(solver, TrainingMemoryModel):
        raise InvalidInputTypeError("solver", solver, "a TrainingMemoryModel, or None for TrainingMemoryModel()",
                                    f"got {type(solver).__name__}")
    if progress is not None and not callable(progress):
        raise InvalidInputTypeError("progress", progress, "a callable progress(done, total), or None",
                                    f"got {type(progress).__name__}")
    assume_monotone = _checks.flag("assume_monotone", assume_monotone)
    registry = solver.registry
    model, hardware = _catalog_value(model, "model"), _catalog_value(hardware, "hardware")
    # (Bounded below the solver's 2**53: the search enumerates their divisors.)
    devices = _checks.count("devices", devices, maximum=SEARCH_MAX)
    global_batch = _checks.count("global_batch", global_batch, maximum=SEARCH_MAX)
    seq_len = _checks.count("seq_len", seq_len)
    _positive_figures(flops=flops, tp_bandwidth=tp_bandwidth, network_bandwidth=network_bandwidth, power=power)
    allow_cross_node_tp = _checks.flag("allow_cross_node_tp", allow_cross_node_tp)
    allow_cross_node_ep = _checks.flag("allow_cross_node_ep", allow_cross_node_ep)
    interleave = _checks.flag("interleave", interleave)
    allow_compile = _checks.flag("allow_compile", allow_compile)
    float8 = float8_implementation(registry, allow_float8, "allow_float8")     # (True, a registered one's declaration, or False)
    allow_float8 = bool(float8)
    if interleave and pipeline_schedule not in (None, "1f1b"):
        raise InvalidInputError("pipeline_schedule", pipeline_schedule, "None or '1f1b' with interleave=True "
                                "(--interleave)", "the interleave axis runs each pp > 1 layout under 1F1B (v = 1) "
                                "and interleaved 1F1B (v > 1): it chooses the schedule itself")
    timer = step_time_model_named(registry, step_time_model)      # (the step time's physics is a plugin's)
    timer.check(hardware, {"peak_bf16_flops": flops, "intra_node_bandwidth": tp_bandwidth,
                           "inter_node_bandwidth": network_bandwidth}, calibration)
    cp_allowed = None
    if context_parallel is not None:
        cp_allowed = _context_sizes(context_parallel, devices, seq_len)
    if max_tp is not None:
        max_tp = _checks.count("max_tp", max_tp)
    recompute = _recompute(recompute, registry.checkpointing)
    strategies = (_names("checkpointing", checkpointing, registry.checkpointing) if checkpointing is not None
                  else sorted(n for n, s in registry.checkpointing.items() if s.searched))
    if model.heads is None:
        strategies = [s for s in strategies if not registry.checkpointing[s].requires_heads]
    installed_rules = registry.rules_for_axis(DATA)
    dp_rules = (_names("data_parallel", data_parallel, installed_rules) if data_parallel is not None
                else sorted(installed_rules))
    sequence_parallel = _flags("sequence_parallel", sequence_parallel)
    given_options = _search_plugin_options(registry, plugin_options, optimizer, strategies, dp_rules)
    bytes_ = precision_bytes(precision)
    node = scale_up_domain(hardware)     # (the NVLink domain where the catalog declares one: groups placed in it)
    max_tp = max_tp or (devices if allow_cross_node_tp else node)
    if not allow_cross_node_tp:
        max_tp = min(max_tp, node)
    tokens = global_batch * seq_len
    profile = _checks.name("profile", solver._profile if profile is None else profile, registry.profiles)
    measured = registry.profiles[profile].checks_layouts    # (declared: it refuses runs it cannot describe)
    options = {name: value for name, value in (
        ("regime", regime), ("optimizer_impl", optimizer_impl), ("attention", attention), ("dropout", dropout),
        ("runtime_overheads", runtime_overheads), ("lora", lora), ("pipeline_schedule", pipeline_schedule),
        ("loss_parallel", loss_parallel)) if value is not None}
    # What does not depend on the layout is checked now, once per strategy at one device:
    # a bad option or a run the profile cannot describe raises here, not as "no layout fits".
    # Under a measured-grade profile, a strategy the profile cannot model is left out (and
    # said) when the strategies were not named; a named one stops the search (the CLI then
    # refuses it, naming what is not modelled).
    first = None
    left_out: list[str] = []
    refusal = None
    undeclared: list[str] = []
    shapeless: list[str] = []
    # a strategy's prepared one-device plan (what its recompute and the pipeline schedule read), made once
    # (a one-device solve selects the optimizer and the strategy, none of a layout's rules: their options only)
    one = functools.cache(lambda ckpt: _one_device_options(registry, given_options, ckpt, options))
    prepared = functools.cache(lambda ckpt: _one_device_plan(solver, model, hardware, seq_len, precision, optimizer,
                                                             ckpt, profile, one(ckpt)))
    for ckpt in strategies:
        try:
            checked = solver.solve(model, hardware, global_batch, seq_len, precision, optimizer, ckpt, 1, 1, 1, 1,
                                   0, global_batch, trainable_fraction, communication_buffer_fraction,
                                   profile=profile, **one(ckpt))
        except NotModelledError as err:
            if not (measured and checkpointing is None and err.parameter == "activation_checkpointing"
                    and err.value == ckpt):
                raise
            left_out.append(ckpt)
            refusal = refusal or err
            continue
        if first is None:
            first = checked
        if ckpt not in recompute:
            declared = registry.checkpointing[ckpt].recompute
            if declared is None:
                undeclared.append(ckpt)
            try:
                recompute[ckpt] = float(declared(prepared(ckpt))) if declared else 0.0
            except NotModelledError:    # (its share needs the model's shapes): whole-layer recompute is 1, else 0
                recompute[ckpt] = 1.0 if registry.checkpointing[ckpt].recomputes == "layers" else 0.0
                shapeless.append(ckpt)
    if first is None and refusal is not None:    # no strategy the profile models: say why, for the first
        raise refusal
    if left_out:
        strategies = [s for s in strategies if s not in left_out]
    notes = _whole_search_notes(first) + _domain_notes(hardware, node)
    if undeclared:
        notes += (f"checkpointing {', '.join(undeclared)} declares no recompute (CheckpointingSpec.recompute): "
                  "its step time counts none (recompute= sets it)",)
    if shapeless:
        notes += (f"checkpointing {', '.join(shapeless)}: its recompute share needs the model's shapes; counted as "
                  "1 for full, 0 otherwise",)
    # The measured profile's pipeline schedule (its PipelineSchedule: idle slots, model chunks)
    schedule_options = prepared(strategies[0]).profile_options
    timing = dict(timer.prepare(model=model, hardware=hardware, registry=registry, result=first, seq_len=seq_len,
                                precision_bytes=bytes_, node=node, flops=flops, intra=tp_bandwidth,
                                inter=network_bandwidth, calibration=calibration, attention=options.get("attention"),
                                schedule=getattr(schedule_options, "pipeline_schedule", None), dp_rules=dp_rules,
                                chunks=getattr(schedule_options, "virtual_stages", None) or 1,
                                # (the rules' options the run gives: each rule's declarations under its own)
                                **({"rule_options": given_options} if given_options else {}),
                                **({"power": power} if power is not None else {})), time=timer.time)
    notes += timing["notes"]
    refused_dp = refused_rules(schedule_options, registry, dp_rules)     # (the regime's: wherever dp x cp > 1)
    base_chunks = timing["chunks"]
    table, variants = _variant_table(
        interleave=interleave, allow_compile=allow_compile, allow_float8=allow_float8, casts=float8, model=model,
        timer=timer,
        base=timing, base_chunks=base_chunks, base_schedule=getattr(schedule_options, "pipeline_schedule", None),
        options=options, one=one(strategies[0]), strategies=strategies, solver=solver,
        hardware=hardware, global_batch=global_batch, seq_len=seq_len, precision=precision, optimizer=optimizer,
        profile=profile, trainable_fraction=trainable_fraction,
        communication_buffer_fraction=communication_buffer_fraction,
        prepare=dict(model=model, hardware=hardware, registry=registry, result=first, seq_len=seq_len,
                     precision_bytes=bytes_, node=node, flops=flops, intra=tp_bandwidth, inter=network_bandwidth,
                     calibration=calibration, attention=options.get("attention"), dp_rules=dp_rules,
                     **({"rule_options": given_options} if given_options else {}),
                     **({"power": power} if power is not None else {})))
    for entry in table[1:]:
        notes += tuple(n for n in entry[1]["notes"] if n not in notes)
    if len(table) > 1:
        notes += (_variant_note(interleave, allow_compile, allow_float8, float8),)
    if left_out:
        notes += (f"strategies without a measured-grade model left out: {', '.join(left_out)} "
                  f"(the reference profile models them: profile='reference', --profile reference)",)
    run = _run_details(first, registry=registry, profile=profile, measured=measured, precision=precision,
                       optimizer=optimizer, options=options, model=model, trainable_fraction=trainable_fraction,
                       communication_buffer_fraction=communication_buffer_fraction, strategies=strategies,
                       checkpointing=checkpointing, left_out=left_out, dp_rules=dp_rules,
                       data_parallel=data_parallel, cp_allowed=cp_allowed, sequence_parallel=sequence_parallel,
                       max_tp=max_tp)
    run["allow_cross_node_ep"] = allow_cross_node_ep or allow_cross_node_tp
    run["interleave"] = interleave
    if given_options:       # (the fields that differ from each spec's defaults)
        run["plugin_options"] = _changed_fields(given_options)
    run["allow_compile"] = allow_compile
    run["allow_float8"] = float8 if isinstance(float8, bool) else getattr(float8, "name", float8)
    if not isinstance(float8, bool):
        run["float8_memory"] = _float8_memory(float8).get("float8")

    margin = headroom_bytes(headroom, hardware.memory_capacity)
    run["headroom"] = margin
    rows: list[tuple] = []       # the layouts that fit, as Candidate fields in order
    context = (registry, profile, measured, solver, model, hardware, global_batch, seq_len, precision, optimizer,
               trainable_fraction, communication_buffer_fraction, assume_monotone, recompute, tokens,
               devices, node, options, margin, timing, allow_cross_node_tp, table, given_options)
    collecting = gc.isenabled()
    gc.disable()    # (the cyclic collector would walk every row and plan built so far, again and again)
    try:
        enumerate_ = functools.partial(_enumerate, model, devices, global_batch, seq_len, max_tp, cp_allowed)
        rest = (strategies, sequence_parallel, _one_rank_rules(dp_rules, installed_rules),
                None if allow_cross_node_tp else node, variants, node if allow_cross_node_ep else None)
        groups = enumerate_([r for r in dp_rules if r not in refused_dp], *rest)
        total = sum(len(g[-1]) for g in groups)
        if refused_dp:
            notes += (_refused_note(refused_dp, sum(len(g[-1]) for g in enumerate_(dp_rules, *rest)) - total),)
        pool_size = _pool_size(workers, total, registry.profiles[profile].solve_cost)
        near: list[tuple] = []
        bounded: list[tuple] = []
        refused: dict[str, int] = {}
        found = (_evaluate_parallel(groups, context, pool_size, total, progress, near, refused, bounded)
                 if pool_size > 1 else None)
        if found is not None:
            fits, solves, done, pruned = found
        else:
            near.clear()
            bounded.clear()
            refused.clear()
            solves, done, pruned = _evaluate(groups, rows, context, total, progress, near, refused, bounded)
            fits = list(map(_candidate, rows))      # (each row ends with pareto=False)
            del rows
        notes += tuple(f"{count:,} layouts left out, the profile cannot describe them: {reason}"
                       for reason, count in sorted(refused.items()))
        if progress is not None:
            progress(total, total)
        if not fits:
            solves += _resolve_closest(near, bounded, context, margin)
        fits, same = _one_row_per_answer(fits)
        if same:
            notes += (f"{same:,} layouts the same as another but for the checkpointing strategy's name (the same "
                      "memory and step time, e.g. selective with a fused attention kernel, which recomputes nothing) "
                      "are listed once, under the first strategy",)
        # Fastest first, then the most headroom: two stable sorts with keys read in C (the
        # same order as one sort on (step time, -headroom), ties kept in enumeration order).
        fits.sort(key=operator.itemgetter(11), reverse=True)
        fits.sort(key=operator.itemgetter(12))
        # The Pareto front of (headroom: more is better, step time: less is better): in step-time
        # order, each layout with more headroom than every faster one (running maxima, in C).
        headroom = list(map(operator.itemgetter(11), fits))
        best_before = [-math.inf, *itertools.accumulate(headroom, max)][:-1]
        for index in itertools.compress(itertools.count(), map(operator.gt, headroom, best_before)):
            fits[index] = fits[index]._replace(pareto=True)
        fits = tuple(fits)
    finally:
        if collecting:
            gc.enable()
    return PlanSearch(model=model.name, hardware=hardware.name, devices=devices, global_batch=global_batch,
                      seq_len=seq_len, candidates=total, solves=solves, state_pruned=pruned,
                      seconds=time.perf_counter() - started, fits=fits,
                      pareto=tuple(c for c in fits if c[17]), profile=profile, run=run, notes=notes,
                      assumptions={**timing["assumptions"], **{f"recompute.{k}": v for k, v in recompute.items()}},
                      timing={**timing, "variants": {key: t for _, t, _, key in table[1:]}},
                      closest=() if fits else _closest(near, hardware.memory_capacity, margin))


# The notes of a result that hold for the whole search (the model's, the accelerator's and
# the run's, the same for every layout), by how they start; the others (a sharding rule's)
# belong to a layout.
WHOLE_SEARCH_NOTES = ("approximation:", "WARNING:", "model:", "hardware:", "lora.", "seq_len ")


def _one_row_per_answer(fits: list) -> tuple[list, int]:
    """The rows without those identical to an earlier one in everything but the strategy's
    name (layout, micro-batch, memory and step time); how many were dropped."""
    seen, out = set(), []
    for c in fits:
        key = (c[:6], c[7:13], c[18:])
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out, len(fits) - len(out)


def _search_plugin_options(registry, given, optimizer, strategies, dp_rules) -> dict:
    """A search's ``plugin_options`` structured: {spec name: its options object}, each naming a spec
    some layout selects (the optimizer, a strategy, the default tp, cp, pp or ep rule, a
    data-parallel rule searched); anything else is an error naming it."""
    if given is None:
        return {}
    if not isinstance(given, Mapping):
        raise InvalidInputTypeError("plugin_options", given, "a mapping of spec name -> options, or None",
                                    f"got {type(given).__name__}")
    from .serialization import structure_options
    from .specs import DEFAULT_RULES
    rules = registry.sharding_rules
    selectable = {**({optimizer: registry.optimizers[optimizer]} if optimizer in registry.optimizers else {}),
                  **{s: registry.checkpointing[s] for s in strategies},
                  **{n: rules[n] for n in DEFAULT_RULES.values() if n in rules}, **{r: rules[r] for r in dp_rules}}
    out = {}
    for name, value in given.items():
        if name not in selectable:
            raise InvalidInputError("plugin_options", name, "options for a spec a layout of this search selects: "
                                    + ", ".join(sorted(selectable)),
                                    "the search's optimizer, checkpointing strategies, tp/cp/pp/ep rules and "
                                    "data-parallel rules (--data-parallel, --checkpointing choose them)")
        spec = selectable[name]
        if spec.options_type is None:
            raise InvalidInputError(f"plugin_options[{name!r}]", value, f"nothing: '{name}' declares no options")
        out[name] = structure_options("plugin_options", name, spec.options_type, value)
    return out


def _changed_fields(given: dict) -> dict:
    """{spec name: {field: value}}: the fields of each options object that differ from its type's
    defaults (every field where the type has required ones)."""
    out = {}
    for name, value in given.items():
        fields = attrs.asdict(value)
        try:
            default = attrs.asdict(type(value)())
        except TypeError:
            default = {}
        out[name] = {f: v for f, v in fields.items() if f not in default or default[f] != v}
    return out


def _one_device_options(registry, given: dict, ckpt: str, options: dict) -> dict:
    """A one-device solve's options: the search's, with the given plugin options of the optimizer
    and ``ckpt`` (as ``time_plan``'s one-device plan: it selects none of a layout's rules)."""
    if not given:
        return options
    mine = {n: o for n, o in given.items()
            if n not in registry.sharding_rules and (n not in registry.checkpointing or n == ckpt)}
    return {**options, "plugin_options": FrozenMap(mine)} if mine else options


def _layout_options(registry, given: dict, ckpt: str, rule: str):
    """The given plugin options a layout of strategy ``ckpt`` and data-parallel rule ``rule`` selects
    (a FrozenMap, as ``check_plan`` takes them; None: none)."""
    from .specs import DATA as _DATA
    mine = {n: o for n, o in given.items()
            if not ((n in registry.checkpointing and n != ckpt)
                    or (n in registry.sharding_rules and registry.sharding_rules[n].axis == _DATA and n != rule))}
    return FrozenMap(mine) if mine else None


def _one_device_plan(solver, model, hardware, seq_len, precision, optimizer, ckpt, profile, options):
    """The prepared one-device plan a strategy's ``recompute(plan)`` reads (its share does not
    depend on the layout)."""
    from .inverse import prepared_plan
    return prepared_plan(solver, model, hardware, 1, seq_len, dict(
        precision=precision, optimizer=optimizer, activation_checkpointing=ckpt, profile=profile, **options))


def _whole_search_notes(result) -> tuple[str, ...]:
    if result is None:
        return ()
    out = []
    for note in result.notes:
        if note.startswith(WHOLE_SEARCH_NOTES) and note not in out:
            out.append(note)
    return tuple(out)


def _jsonable(value):
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, Mapping):
        return dict(value)
    return value


def _run_details(result, *, registry, profile, measured, precision, optimizer, options, model, trainable_fraction,
                 communication_buffer_fraction, strategies, checkpointing, left_out, dp_rules, data_parallel,
                 cp_allowed, sequence_parallel, max_tp) -> dict:
    """What changes the numbers beside the layout, the same for every layout (``PlanSearch.run``)."""
    run: dict = {"profile": profile, "precision": precision, "optimizer": optimizer}
    regime = result.details.get("regime") if result is not None else None
    if measured:
        if regime is not None:
            from .scenario import _registered_regime
            run["regime"] = regime
            run["regime_source"] = "regime" if options.get("regime") is not None else "precision"
            spec = _registered_regime(regime, registry)
            if spec is not None:
                run["regime_description"] = spec.description
        run["optimizer_impl"] = options.get("optimizer_impl") or "foreach"
        run["attention"] = options.get("attention") or "sdpa"
        run["dropout"] = float(options.get("dropout") or 0.0)
        overheads = options.get("runtime_overheads")
        run["runtime_overheads"] = True if overheads is None else _jsonable(overheads)
        lora = options.get("lora")
        if lora is not None:
            from .finetune import _config
            config = _config(lora)
            if config.target_modules is None:
                config = config.for_model(model)
            run["lora"] = {"rank": config.rank,
                           "target_modules": list(config.target_modules),
                           "quantization": config.quantization, "double_quant": config.double_quant,
                           "quant_blocksize": config.quant_blocksize}
    else:
        run["communication_buffer_fraction"] = communication_buffer_fraction
    run["trainable_fraction"] = trainable_fraction
    run["checkpointing"] = list(strategies)
    run["checkpointing_restricted"] = checkpointing is not None
    run["checkpointing_left_out"] = list(left_out)
    run["data_parallel"] = list(dp_rules)
    run["data_parallel_restricted"] = data_parallel is not None
    run["context_parallel"] = sorted(cp_allowed) if cp_allowed is not None else None
    run["sequence_parallel"] = list(sequence_parallel)
    run["max_tp"] = max_tp
    return run


def precision_words(precision, regime, registry=None) -> str:
    """``"precision bf16, "`` beside a regime, or nothing where the regime decides the dtypes and the
    precision is the default it does not run at (``--regime mixed-bf16-main-grad`` alone: not "precision
    fp16"; a precision given against the regime is refused, `check_contradictions`)."""
    from .scenario import _registered_regime, regime_precisions
    spec = _registered_regime(regime, registry) if isinstance(regime, str) else None
    return "" if spec is not None and precision not in regime_precisions(spec) else f"precision {precision}, "


def describe_search_run(run: Mapping) -> str:
    """``PlanSearch.run`` in words: one line for a header."""
    if not run:
        return "run: (not recorded)"
    parts = [f"precision {run.get('precision')}"]
    if run.get("regime"):
        source = " (from the precision)" if run.get("regime_source") == "precision" else ""
        description = f": {run['regime_description']}" if run.get("regime_description") else ""
        parts = [f"{precision_words(run.get('precision'), run['regime'])}regime {run['regime']}{source}{description}"]
    optimizer = f"optimizer {run.get('optimizer')}"
    if run.get("optimizer_impl"):
        optimizer += f" ({run['optimizer_impl']})"
    parts.append(optimizer)
    lora = run.get("lora")
    if lora:
        clause = f"LoRA rank {lora.get('rank')} on {', '.join(lora.get('target_modules') or ())}, base frozen"
        if lora.get("quantization"):
            clause = ("Q" + clause + f" and quantized {lora['quantization']} (block {lora.get('quant_blocksize')})"
                      + (" with double quantization" if lora.get("double_quant") else ""))
        parts.append(clause)
    if "attention" in run:
        overheads = run.get("runtime_overheads")
        overheads = "on" if overheads is True else "off" if overheads is False else f"{overheads}"
        parts.append(f"attention {run['attention']}, dropout {run.get('dropout')}, runtime overheads {overheads}")
    if run.get("trainable_fraction", 1.0) != 1.0:
        parts.append(f"trainable fraction {run['trainable_fraction']:.6g}")
    if run.get("communication_buffer_fraction", 0.05) != 0.05:
        parts.append(f"communication buffer fraction {run['communication_buffer_fraction']}")
    ckpt = f"checkpointing {', '.join(run.get('checkpointing') or ())}"
    ckpt += " (as asked)" if run.get("checkpointing_restricted") else " (every strategy searched by default"
    if not run.get("checkpointing_restricted"):
        left = run.get("checkpointing_left_out")
        ckpt += f"; left out: {', '.join(left)})" if left else ")"
    parts.append(ckpt)
    if run.get("headroom"):
        parts.append(f"headroom {run['headroom'] / 2**30:.2f} GiB kept free")
    if run.get("data_parallel_restricted"):
        parts.append(f"data-parallel rules {', '.join(run.get('data_parallel') or ())}")
    if run.get("context_parallel") is not None:
        parts.append(f"cp {', '.join(map(str, run['context_parallel']))}")
    if run.get("allow_cross_node_ep"):
        parts.append("expert parallelism across nodes")
    if list(run.get("sequence_parallel") or ()) not in ([True, False], [False, True]):
        parts.append(f"sequence parallel {'on' if run.get('sequence_parallel') == [True] else 'off'}")
    if run.get("plugin_options"):       # (each applies to the layouts that select its spec)
        parts.append("options " + ", ".join(f"{spec}.{field}={value!r}" for spec, fields in run["plugin_options"].items()
                                            for field, value in fields.items()))
    return "run: " + "; ".join(parts)


def _context_sizes(values, devices: int, seq_len: int) -> set[int]:
    """The ``context_parallel`` sizes: a list of counts, each one that some layout can use (it
    divides both the device count and seq_len); a size no layout can use is an error, not
    an empty search."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (list, tuple, set, frozenset, range)):
        raise InvalidInputTypeError("context_parallel", values, "a list of context-parallel sizes (e.g. [1, 2]), "
                                    "or None for every size", f"got {type(values).__name__}")
    sizes = {_checks.count("context_parallel", c) for c in values}
    if not sizes:
        raise InvalidInputError("context_parallel", values, "at least one size, or None for every size")
    for c in sorted(sizes):
        if devices % c or seq_len % c:
            common = math.gcd(devices, seq_len)
            usable = ", ".join(map(str, _divisors(common))) if common <= 10**10 else f"the divisors of {common}"
            raise InvalidInputError("context_parallel", c,
                                    f"a size that divides both devices={devices} and seq_len={seq_len}: {usable}",
                                    "context parallelism splits the sequence over cp of the devices")
    return sizes


def _recompute(values, known=None) -> dict[str, float]:
    """``recompute``: None, or {strategy name: extra forward work, a finite number >= 0};
    each name one of ``known`` (the installed strategies), exactly as they are spelt."""
    if values is None:
        return {}
    if not isinstance(values, Mapping):
        raise InvalidInputTypeError("recompute", values, "a mapping of strategy name -> extra work (e.g. "
                                    "{'selective': 0.03}), or None", f"got {type(values).__name__}")
    out = {}
    for name, value in values.items():
        if not isinstance(name, str):
            raise InvalidInputTypeError("recompute", name, "strategy names (strings) as keys",
                                        f"got {type(name).__name__}")
        if known is not None and name not in known:
            raise InvalidInputError("recompute", name, f"an installed checkpointing strategy: {', '.join(sorted(known))}",
                                    f"recompute maps strategy names to their extra work; {name!r} is none of them")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InvalidInputTypeError(f"recompute[{name!r}]", value, "a finite number >= 0",
                                        f"got {type(value).__name__}")
        if not math.isfinite(value) or value < 0:
            raise InvalidInputError(f"recompute[{name!r}]", value, "a finite number >= 0")
        out[name] = float(value)
    return out


def _names(parameter: str, values, installed) -> list[str]:
    """Installed names, each once, in the order given (at least one)."""
    if isinstance(values, str) or not isinstance(values, (list, tuple)):
        raise InvalidInputTypeError(parameter, values, "a list of installed names, or None for all of them",
                                    f"got {type(values).__name__}")
    out = []
    for value in values:
        name = _checks.name(parameter, value, installed)
        if name not in out:
            out.append(name)
    if not out:
        raise InvalidInputError(parameter, values, "at least one name, or None for all of them")
    return out


def _flags(parameter: str, values) -> tuple[bool, ...]:
    """True and/or False, each once, in the order given."""
    if not isinstance(values, (list, tuple)):
        raise InvalidInputTypeError(parameter, values, "a list of True and/or False", f"got {type(values).__name__}")
    out = []
    for value in values:
        if value is not True and value is not False:
            raise InvalidInputTypeError(parameter, values, "a list of True and/or False")
        if value not in out:
            out.append(value)
    if not out:
        raise InvalidInputError(parameter, values, "at least one of True, False")
    return tuple(out)


def _not_modelled_reason(err: InvalidInputError) -> str:
    """What a layout's ``NotModelledError`` says is not modelled, without the layout's own sizes
    (one reason for every layout it refuses)."""
    reason = f"{err.parameter}: {err.allowed}"
    return reason if len(reason) <= 200 else reason[:197] + "..."


def _cannot_describe(err: InvalidInputError) -> bool:
    """Does this error, raised for a layout, mean "the profile cannot describe this run"
    (not a layout the rules reject)? A ``NotModelledError``, e.g. the measured profile's
    "LoRA/QLoRA with a parallel layout is not modelled yet"."""
    return isinstance(err, NotModelledError)


# Parallel evaluation. A search of at least PARALLEL_MIN candidates is split into chunks of
# whole layouts, evaluated by forked worker processes (each runs the same code, the same
# plugin pipeline, every selected plugin called, in its own copy of this process), and the
# rows are merged in enumeration order: the result is the in-process one, field for field.
PARALLEL_MIN = 8000      # candidates; below this, starting the workers costs more than it saves
_CHUNKS_PER_WORKER = 16  # more chunks: finer progress and load balance; fewer: less overhead
_JOB = None              # (groups, context) while a pool runs: forked workers inherit it


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _pool_size(workers, total: int, solve_cost: float = 1.0) -> int:
    """How many worker processes: ``workers`` when given (1: in-process), else the CPUs this
    process may use when the search has at least PARALLEL_MIN candidates, divided by the
    profile's declared ``solve_cost`` (the measured profile's 16: 500)."""
    if workers is not None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise InvalidInputError("workers", workers, "a positive integer (1: in-process) or None (automatic)")
        return workers
    return _usable_cpus() if total >= PARALLEL_MIN / solve_cost else 1


def _evaluate_chunk(bounds: tuple[int, int]):
    """In a worker: evaluate ``_JOB``'s groups[start:stop]; never raises (an error is
    reported, and the parent evaluates in-process, where it is raised as usual)."""
    start, stop = bounds
    groups, context = _JOB
    rows: list[tuple] = []
    near: list[tuple] = []
    bounded: list[tuple] = []
    refused: dict[str, int] = {}
    try:
        solves, done, pruned = _evaluate(groups[start:stop], rows, context, 0, None, near, refused, bounded)
    except InvalidInputError as err:    # the parent re-evaluates this chunk, which raises it
        return start, _RAISES if _cannot_describe(err) else None, 0, 0, [], {}, 0, []
    except BaseException:       # noqa: BLE001 (re-raised by the in-process run)
        return start, None, 0, 0, [], {}, 0, []
    return start, _columns(rows), solves, done, near, refused, pruned, bounded


_RAISES = "raises"      # a chunk whose evaluation stops the search (re-run in the parent to raise)


def _columns(rows: list[tuple]) -> list:
    """Rows as columns for the trip back to the parent: a column of only floats (only ints)
    travels as one array of doubles (of 64-bit ints), not as tens of thousands of objects
    (unpickling those cost the parent about 0.2 s per 75,000 rows); any other column as it
    is. ``_candidates`` turns them back into the same rows, types included."""
    columns = []
    for column in zip(*rows):
        kinds = set(map(type, column))
        try:
            if kinds == {float}:
                column = array.array("d", column)
            elif kinds == {int}:
                column = array.array("q", column)
        except OverflowError:   # an int beyond 64 bits: sent as it is
            pass
        columns.append(column)
    return columns


def _candidates(columns: list) -> list[Candidate]:
    """The rows of ``_columns``, as Candidates (built in C, without intermediate tuples)."""
    return list(map(_candidate, zip(*columns)))


def _chunks(groups, pieces: int) -> list[tuple[int, int]]:
    """Consecutive ranges of ``groups`` with about equal candidate counts, each layout's strategies, sp
    and variants in one (they share a state_bytes bound: the solves are the in-process ones)."""
    total = sum(len(g[-1]) for g in groups)
    step = max(1, -(-total // pieces))
    bounds, start, count = [], 0, 0
    for index, group in enumerate(groups):
        count += len(group[-1])
        if count >= step and (index + 1 == len(groups) or groups[index + 1][:6] != group[:6]):
            bounds.append((start, index + 1))
            start, count = index + 1, 0
    if start < len(groups):
        bounds.append((start, len(groups)))
    return bounds


def _evaluate_parallel(groups, context, workers: int, total: int, progress, near: list, refused: dict,
                       bounded: list):
    """(the fitting layouts as Candidates in enumeration order, solves, done) from forked
    workers, or None when they cannot run here (no
    fork start method, a daemon process, the pool fails to start or a worker fails)."""
    global _JOB
    import multiprocessing
    if multiprocessing.current_process().daemon:
        return None     # (daemon processes may not have children)
    try:
        fork = multiprocessing.get_context("fork")
    except ValueError:
        return None
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool
    bounds = _chunks(groups, workers * _CHUNKS_PER_WORKER)
    results: dict[int, list] = {}
    solves = done = pruned = 0
    last_report = time.perf_counter()
    _JOB = (groups, context)
    pool = None
    try:
        pool = ProcessPoolExecutor(max_workers=min(workers, len(bounds)), mp_context=fork)
        pending = {pool.submit(_evaluate_chunk, b) for b in bounds}
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                start, rows, chunk_solves, chunk_done, chunk_near, chunk_refused, chunk_pruned, chunk_bounded = (
                    future.result())
                near += chunk_near
                bounded += chunk_bounded
                for reason, count in chunk_refused.items():
                    refused[reason] = refused.get(reason, 0) + count
                if isinstance(rows, str):     # _RAISES
                    stop = dict(bounds)[start]
                    _evaluate(groups[start:stop], [], context, 0, None)    # raises the error
                    return None
                if rows is None:
                    return None
                results[start] = _candidates(rows)
                solves += chunk_solves
                done += chunk_done
                pruned += chunk_pruned
            if progress is not None and time.perf_counter() - last_report > 0.2:
                progress(done, total)
                last_report = time.perf_counter()
    except (OSError, BrokenProcessPool):
        return None
    finally:
        _JOB = None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
    fits = []
    for start, _ in bounds:
        fits += results[start]
    return fits, solves, done, pruned


_PLAN_FIELDS = tuple(field.name for field in attrs.fields(TrainingPlan))


def _evaluate(groups, rows, context, total, progress, near=None, refused=None, bounded=None) -> tuple[int, int, int]:
    """Solve the layouts of ``groups`` (micro-batches ascending), append those that fit to
    ``rows``; return (solves, layouts evaluated, layouts pruned by ``state_bytes``). ``near`` (a list, kept as a heap): the
    CLOSEST layouts that do not fit, as (-total memory, layout fields), for a search where none does.
    ``refused`` (a dict): the layouts the profile cannot describe (a ``NotModelledError`` for this
    layout, e.g. LoRA split by tensor parallelism), left out and counted by what is not modelled;
    without it such a layout stops the search. ``bounded`` (a list): the groups whose micro-batch 1 was
    pruned by ``state_bytes`` while ``near`` was kept, as (bound, group), for ``_resolve_closest``."""
    (registry, profile, measured, solver, model, hardware, global_batch, seq_len, precision, optimizer,
     trainable_fraction, communication_buffer_fraction, assume_monotone, recompute, tokens,
     devices, node, options, margin, timing, cross_node, table, given_options) = context
    solves = done = pruned = 0
    last_report = time.perf_counter()
    capacity = hardware.memory_capacity
    limit_gb = (capacity - margin) * 1e-9       # the headroom kept free (0 by default)
    step_time, peak = timing["time"], timing["peak"]
    mfu_scale = timing["flops_per_token"] * tokens / (devices * peak)
    base_options, base_timing = options, timing
    chosen: dict = {}       # (rule, strategy) -> the given plugin options its layouts select (None: none)
    layout_options = None
    over: dict = {}     # a layout but for strategy, sp and micro-batch -> its state_bytes when over the limit, else None
    times: dict = {}    # step_time's arguments -> its step (seconds)
    for tp, cp, pp, dp, ep, rule, ckpt, sp, variant, micro in groups:
        if given_options:
            key = (rule, ckpt)
            if key not in chosen:
                chosen[key] = _layout_options(registry, given_options, ckpt, rule)
            layout_options = chosen[key]
        n, plan = len(micro), None
        vp, compiled, float8, which = variant
        if which:
            options, timing, label, _ = table[which]
        else:
            options, timing, label = base_options, base_timing, None
        rec = recompute.get(ckpt, 0.0)
        samples = global_batch // dp        # b x gas
        stages = pp - 1
        last, fields, total_memory = n - 1, None, 0
        # state_bytes of a sibling (another strategy or sp) at micro-batch 1 bounds this one's there; when over,
        # so are the micro-batches but the last (memory grows with it while gas >= 2), and the last if the bound at
        # gas = 1 (a sibling's last) is over too (micro-batch 1's bound kept for the closest of a search where none
        # fits: _resolve_closest)
        state_key = (tp, cp, pp, dp, ep, rule, which, layout_options)
        bound = over.get((state_key, samples == 1))
        heavy = bound is not None       # (the state weighs: the last solved with its terms, for theirs at gas = 1)
        skip = 0
        if bound is not None:
            skip = n if last == 0 or over.get((state_key, True)) is not None else last
            done += skip
            pruned += skip
            if near is not None and bounded is not None and not rows:
                bounded.append((bound, (tp, cp, pp, dp, ep, rule, ckpt, sp, variant, micro[:1])))
        for index, mb in enumerate(micro):   # ascending: memory grows with the micro-batch while gas >= 2
            if index < skip:
                continue
            done += 1
            gas = samples // mb
            try:     # every selected plugin called; the layout checked once, for its first micro-batch solved
                if fields is None:
                    plan = check_plan(registry, profile, model, hardware, global_batch, seq_len, precision,
                                      optimizer, ckpt, tp, pp, dp, ep, 0, gas, trainable_fraction,
                                      communication_buffer_fraction, sp, rule, None, layout_options, (), cp)
                    fields = {name: getattr(plan, name) for name in _PLAN_FIELDS}
                else:       # attrs.evolve(plan, gradient_accumulation_steps=gas), at a third of the cost
                    fields["gradient_accumulation_steps"] = gas
                    plan = TrainingPlan(**fields)
                # (its terms too where the micro-batch before came within TERMS_AT of the limit: if this one does not
                # fit, they may rule out the last one, without_gradients; and at the last (gas = 1) where no sibling's
                # last gave its state bound yet: it bounds theirs)
                full = assume_monotone and (index > skip and total_memory * 1e-9 > limit_gb * TERMS_AT or (
                    index == last > 0 and heavy and (state_key, True) not in over))
                terms = solve_plan(registry, plan, options, total_only=not full)
                total_memory, terms = (terms.total_memory, terms) if full else (terms, None)
            except InvalidInputError as err:   # a layout the rules reject; a broken plugin's error goes up
                if measured and _cannot_describe(err):
                    if refused is None:
                        raise       # one ranking never mixes profiles: the caller decides (the CLI refuses)
                    reason = _not_modelled_reason(err)
                    if label:
                        reason = f"{label}: {reason}"
                        if plan is not None:    # (an implementation choice may depend on the micro-batch, e.g.
                            refused[reason] = refused.get(reason, 0) + 1    # float8 without accumulation)
                            continue
                    refused[reason] = refused.get(reason, 0) + n - index
                    done += n - index - 1
                    break
                if index == skip and (plan is None or not measured):
                    done += n - index - 1       # the layout itself is rejected (e.g. an option constraint)
                    break
                continue
            solves += 1
            if not total_memory * 1e-9 <= limit_gb:     # feasibility in GB, as the reference
                if near is not None and index == 0 and not rows:
                    entry = (-total_memory, tp, cp, pp, dp, ep, rule, ckpt, sp, mb, gas, vp, compiled, float8)
                    (heapq.heappush if len(near) < NEAR else heapq.heappushpop)(near, entry)
                if not assume_monotone:
                    continue
                # one more solve, for its terms: the state bound at micro-batch 1 (and at the last where micro-batch
                # 1's was over; where solved with its terms, at no cost); the last one's bound (without_gradients)
                bounds = (state_key, gas == 1) not in over and (
                    index == 0 or index == last and (over.get((state_key, False)) is not None or terms is not None))
                if bounds and terms is None:
                    terms = solve_plan(registry, plan, options)
                    solves += 1
                if bounds:
                    bound = state_bytes(terms)
                    over[(state_key, gas == 1)] = bound if bound * 1e-9 > limit_gb * (1 + 1e-9) else None
                if index < last:     # on to the last micro-batch: gas = 1 accumulates nothing
                    done += last - 1 - index
                    skip = last
                    heavy = terms is not None and state_bytes(terms) * 1e-9 > limit_gb * TERMS_AT
                    if over.get((state_key, True)) is not None or without_gradients(terms) * 1e-9 > limit_gb * (
                            1 + 1e-9):
                        done += 1
                        pruned += 1
                        break
                continue
            if assume_monotone and (index == 0 or index == last):   # state_bytes <= total <= limit: no sibling's
                over.setdefault((state_key, gas == 1), None)        # bound here is over (none solved for it)
            seconds = times.get(called := (which, tp, cp, pp, dp, ep, rule, rec, sp, mb, gas))     # (strategies that
            if seconds is None:     # recompute the same share: the same call, the same time; once per chunk)
                seconds = times[called] = step_time(timing, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, rule=rule, recompute=rec,
                                                 sp=sp, mb=mb, gas=gas)["step"]
            idle = timing["idle"](pp, gas, timing["chunks"]) if timing["idle"] and pp > 1 else stages
            rows.append((tp, cp, pp, dp, ep, rule, ckpt, sp, mb, gas, total_memory, capacity - total_memory, seconds,
                         tokens / seconds, mfu_scale / seconds, idle / (gas + idle) if idle else 0.0, rec, False,
                         vp, compiled, float8))
        if progress is not None and time.perf_counter() - last_report > 0.2:
            progress(done, total)
            last_report = time.perf_counter()
    return solves, done, pruned


def headroom_bytes(headroom, capacity: int) -> float:
    """``headroom`` as bytes: a number of bytes, a size ("8GiB", "8GB": ``units.parse_bytes``)
    or a share of ``capacity`` ("10%")."""
    if headroom is None:
        return 0
    allowed = "bytes >= 0, or a string like '8GiB', '8GB' or '10%' (of the capacity), below the capacity"
    if isinstance(headroom, str) and headroom.strip().endswith("%"):
        try:
            value = float(headroom.strip()[:-1]) * capacity / 100
        except ValueError:
            raise InvalidInputError("headroom", headroom, allowed) from None
    else:
        from .units import parse_bytes
        if isinstance(headroom, str) and not headroom.strip()[-1:].isalpha():    # "10": 10 what?
            raise InvalidInputError("headroom", headroom, allowed, "say the unit: GiB, GB, B or %")
        try:
            value = parse_bytes(headroom, "headroom", whole=False)
        except InvalidInputError as err:
            raise type(err)("headroom", headroom, allowed, err.detail) from None
    if not 0 <= value < capacity:
        raise InvalidInputError("headroom", headroom, allowed, f"the capacity is {capacity:,} B")
    return value


def precision_bytes(precision: str) -> int | float:
    from .plan import PRECISION_BYTES
    return PRECISION_BYTES[_checks.name("precision", precision, PRECISION_BYTES)]


def text_progress(stream=sys.stderr, delay: float = 0.5, bar: bool | None = None,
                  every: float = 5.0) -> Callable[[int, int], None]:
    """A progress report, drawn only once the search has run ``delay`` seconds (a quick search
    prints nothing): on a terminal (``bar``; default: whether ``stream`` is one) a bar redrawn in
    place, ``[#####.....] 51,234 / 100,000 layouts``; elsewhere (a pipe, a CI log) one line
    every ``every`` seconds and at the end, which a log keeps readable."""
    started = time.perf_counter()
    if bar is None:
        bar = bool(getattr(stream, "isatty", lambda: False)())
    last, ended = [None], [False]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if ended[0] or now - started < delay or (not bar and done < total and last[0] is not None
                                                 and now - last[0] < every):
            return
        if last[0] is None and not bar and done >= total:
            return      # (a search that ended before its first line: nothing to say)
        last[0], ended[0] = now, done >= total      # (the end is said once, however often it is reported)
        if not bar:
            stream.write(f"searched {done:,} / {total:,} layouts ({done / total if total else 1:.0%}, "
                         f"{now - started:.0f} s)\n")
            stream.flush()
            return
        width = 30
        filled = int(width * done / total) if total else width
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done:,} / {total:,} layouts")
        if done >= total:
            stream.write("\n")
        stream.flush()
    return report


def time_plan(model, hardware, *, global_batch: int, seq_len: int = 2048, tp: int = 1, cp: int = 1, pp: int = 1,
              dp: int = 1, ep: int = 1, vp: int | None = None, data_parallel: str = "zero0",
              checkpointing: str = "selective", microbatch: int = 1, sequence_parallel: bool | None = None,
              precision: str = "fp16", optimizer: str = "adam", profile: str | None = None,
              pipeline_schedule: str | None = None, compiled: bool = False, float8=False,
              async_tp: bool | str = False, ep_overlap: bool = False, ep_dispatch: str | None = None,
              power: float | None = None, memory_bandwidth: float | None = None, flops: float | None = None, tp_bandwidth: float | None = None,
              network_bandwidth: float | None = None, recompute: float | None = None, calibration=None,
              step_time_model: str | None = None, solver: TrainingMemoryModel | None = None,
              memory: bool = True, **options) -> dict:
    """One layout timed on its own, as ``search_plans`` times it (issue 27 item 6): the same
    one-device solve, recompute share, step-time ``prepare`` and ``time``, so its ``components``
    equal ``PlanSearch.components`` for that row. ``vp``: model chunks per pipeline rank (an
    interleaved schedule, ``interleaved-1f1b`` unless ``pipeline_schedule`` names another);
    ``microbatch`` sequences per micro-batch, ``global_batch / (dp x microbatch)`` of them per step.
    What a search does not enumerate, said by the caller: ``compiled`` (memory-bound ops fused),
    ``float8`` (float8 GEMMs and casts: True the default implementation, torchao tensorwise; a
    registered implementation's name, ``mlsysim_float8_implementations``; or its declaration),
    ``async_tp`` (TP collectives decomposed and overlapped: True, the reduce-scatters reducing inside their own
    kernels, as Megatron's TP communication overlap; ``"symmetric-memory"``, torch's micro-pipeline TP, which sums a
    fused reduce-scatter's partials in a kernel of its own), ``ep_overlap`` (EP all-to-alls beside another micro-batch's compute), ``ep_dispatch``
    (``"node-forwarded"``: DeepEP-style, once per destination node), ``power`` (the run's
    power limit, W) and ``memory_bandwidth`` (B/s). ``memory``: also solve the layout's memory
    (the heaviest rank's total, as ``estimate``; a run the profile cannot describe is said in
    ``notes``, its memory None). Returns {"step_s", "tokens_per_s", "tokens_per_s_per_device",
    "mfu", "components" (seconds), "bubble", "memory_bytes", "fits", "calibrated", "notes",
    "layout", "assumptions"}."""
    if solver is None:
        solver = TrainingMemoryModel()
    registry = solver.registry
    model, hardware = _catalog_value(model, "model"), _catalog_value(hardware, "hardware")
    tp, cp, pp, dp, ep = (_checks.count(n, v) for n, v in (("tp", tp), ("cp", cp), ("pp", pp), ("dp", dp), ("ep", ep)))
    global_batch = _checks.count("global_batch", global_batch)
    seq_len = _checks.count("seq_len", seq_len)
    microbatch = _checks.count("microbatch", microbatch)
    _positive_figures(power=power, memory_bandwidth=memory_bandwidth, flops=flops, tp_bandwidth=tp_bandwidth,
                      network_bandwidth=network_bandwidth)
    if global_batch % (dp * microbatch):
        raise InvalidInputError("microbatch", microbatch, f"a micro-batch that with dp={dp} divides global_batch="
                                f"{global_batch}", f"{global_batch} / ({dp} x {microbatch}) is not whole")
    gas = global_batch // (dp * microbatch)
    # A run compiled for the memory is timed so too, as a search's row is; a timing choice the memory
    # does not share is said.
    compiled = bool(compiled) or bool(options.get("compile"))
    said = ([f"compiled: the memory-bound ops timed as compiled kernels; the memory is the eager run's "
             f"(compile={COMPILE_MODE!r} prices the compiled one)"] if compiled and not options.get("compile") else [])
    float8 = float8_implementation(registry, float8)
    if vp is not None:
        vp = _checks.count("vp", vp)
        options["virtual_stages"] = vp
        if vp > 1 and pipeline_schedule is None:
            pipeline_schedule = "interleaved-1f1b"
    if pipeline_schedule is not None:
        options["pipeline_schedule"] = pipeline_schedule
    timer = step_time_model_named(registry, step_time_model)
    timer.check(hardware, {"peak_bf16_flops": flops, "intra_node_bandwidth": tp_bandwidth,
                           "inter_node_bandwidth": network_bandwidth}, calibration)
    profile = _checks.name("profile", solver._profile if profile is None else profile, registry.profiles)
    # float8's memory: the option a search's float8 row is solved with (the one its implementation declares)
    from .inputs import options_fields
    memory8 = _float8_memory(float8) if float8 else {}
    implementation = "" if float8 is True else f" ({getattr(float8, 'name', float8)})"
    if memory8 and FLOAT8_OPTION not in options_fields(registry.profiles[profile]):
        said.append(f"float8{implementation}: the linears timed in float8 GEMMs with their casts; the memory is the "
                    f"16-bit run's (profile {profile!r} has no float8 option)")
        memory8 = {}
    elif float8:
        said.append(f"float8{implementation}: the linears timed in float8 GEMMs with their casts; " + (
            f"the memory solved with float8={memory8[FLOAT8_OPTION]!r}, as a search's float8 row" if memory8 else
            "the memory is the 16-bit run's (the implementation declares no float8 memory; a search's float8 row's "
            "too)"))
    rule = _checks.name("data_parallel", data_parallel, registry.rules_for_axis(DATA))
    ckpt = _checks.name("checkpointing", checkpointing, registry.checkpointing)
    sp = (registry.profiles[profile].sequence_parallel if sequence_parallel is None
          else _checks.flag("sequence_parallel", sequence_parallel)) and tp > 1
    if sequence_parallel is True and tp == 1:     # (accepted, as Megatron-LM does; said: scenario.input_notes)
        from .scenario import input_notes
        said += input_notes(None, sequence_parallel, tp)
    notes: list[str] = said
    # the one-device plan (recompute share, optimizer bytes), as search_plans makes it (the layout's own options, the
    # pipeline's schedule, chunks and layers per stage and the experts' tensor parallelism, describe no one-device plan)
    one = {k: v for k, v in options.items()
           if k not in ("virtual_stages", "pipeline_schedule", "stage_layers", "expert_tp_size")}
    if one.get("plugin_options"):   # (the layout's rules' options: the one-device plan selects none of its rules)
        one["plugin_options"] = {n: o for n, o in one["plugin_options"].items()
                                 if n not in registry.sharding_rules} or None
    first = solver.solve(model, hardware, global_batch, seq_len, precision, optimizer, ckpt, 1, 1, 1, 1, 0,
                         global_batch, profile=profile, **one)
    if memory8:     # (the optimizer step's bytes with float8's memory, as a search's float8 row reads them)
        try:
            first = solver.solve(model, hardware, global_batch, seq_len, precision, optimizer, ckpt, 1, 1, 1, 1, 0,
                                 global_batch, profile=profile, **one, **memory8)
        except NotModelledError:
            pass
    if recompute is None:
        declared = registry.checkpointing[ckpt].recompute
        try:
            recompute = float(declared(_one_device_plan(solver, model, hardware, seq_len, precision, optimizer,
                                                        ckpt, profile, one))) if declared else 0.0
        except NotModelledError:
            recompute = 1.0 if registry.checkpointing[ckpt].recomputes == "layers" else 0.0
            notes.append(f"checkpointing {ckpt}: its recompute share needs the model's shapes; counted as "
                         f"{recompute:g}")
        if declared is None:
            notes.append(f"checkpointing {ckpt} declares no recompute: its step time counts none")
    layout = dict(batch_size=global_batch, seq_len=seq_len, precision=precision, optimizer=optimizer,
                  activation_checkpointing=ckpt, tp_size=tp, pp_size=pp, dp_size=dp, ep_size=ep,
                  gradient_accumulation_steps=gas, sequence_parallel=sp, data_parallel=rule, cp_size=cp,
                  profile=profile, **options)
    schedule, chunks, total, prepared = None, vp or 1, None, None
    try:
        from .inverse import prepared_plan
        prepared = prepared_plan(solver, model, hardware, global_batch, seq_len,
                                 {k: v for k, v in layout.items() if k not in ("batch_size", "seq_len")})
        schedule = getattr(prepared.profile_options, "pipeline_schedule", None)
        chunks = getattr(prepared.profile_options, "virtual_stages", None) or chunks
        if memory:
            result = solver.solve(model, hardware, **layout, **memory8)
            total = result.total_memory
    except NotModelledError as err:
        notes.append(f"memory not solved: {err}")
    extras = {k: v for k, v in (("compiled", compiled), ("float8", float8), ("power", power),
                                ("memory_bandwidth", memory_bandwidth),
                                ("overlap", {**({"tp": async_tp if isinstance(async_tp, str) else "decomposed"} if async_tp else {}),
                                             **({"ep": "batched"} if ep_overlap else {})}),
                                ("dispatch", {"ep": ep_dispatch} if ep_dispatch else {}),
                                # (the expert tensor parallelism a run sets, which its collectives' etp group is)
                                ("expert_tp", getattr(getattr(prepared, "profile_options", None), "expert_tp_size",
                                                      None))) if v}
    node = scale_up_domain(hardware)     # (the NVLink domain where the catalog declares one, as search_plans)
    notes += _domain_notes(hardware, node)
    timing = dict(timer.prepare(model=model, hardware=hardware, registry=registry, result=first, seq_len=seq_len,
                                precision_bytes=precision_bytes(precision), node=node,
                                flops=flops, intra=tp_bandwidth, inter=network_bandwidth, calibration=calibration,
                                attention=options.get("attention"), schedule=schedule, dp_rules=[rule],
                                chunks=chunks, **extras,
                                # (the rules' options a run gives: an implementation a rule lets it choose)
                                **({"rule_options": prepared.options}
                                   if prepared is not None and options.get("plugin_options") else {})))
    parts = dict(timer.time(timing, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, rule=rule, recompute=recompute, sp=sp,
                            mb=microbatch, gas=gas))
    step = parts["step"]
    devices = tp * cp * pp * dp
    tokens = global_batch * seq_len
    idle = timing["idle"](pp, gas, chunks) if timing.get("idle") and pp > 1 else pp - 1
    return {"step_s": step, "tokens_per_s": tokens / step, "tokens_per_s_per_device": tokens / step / devices,
            "mfu": timing["flops_per_token"] * tokens / (step * devices * timing["peak"]),
            "components": parts, "bubble": idle / (gas + idle) if idle else 0.0, "memory_bytes": total,
            "fits": None if total is None else total <= hardware.memory_capacity,
            "calibrated": timing["calibrated"], "notes": tuple(notes) + tuple(timing["notes"]),
            "layout": dict(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, vp=chunks, data_parallel=rule, checkpointing=ckpt,
                           microbatch=microbatch, gradient_accumulation_steps=gas, sequence_parallel=sp,
                           devices=devices, recompute=recompute, compiled=compiled,
                           float8=float8 if isinstance(float8, bool) else getattr(float8, "name", float8),
                           async_tp=async_tp, ep_overlap=ep_overlap, ep_dispatch=ep_dispatch),
            "assumptions": timing["assumptions"]}


STEP_TIME_HOOK = "mlsysim_step_time_models"     # the hook, added by the built-in plugin ``steptime``
FLOAT8_HOOK = "mlsysim_float8_implementations"  # the float8 implementations' hook, added by ``steptime`` too


FLOAT8_OPTION = "float8"   # the memory profile's option a Float8Casts.memory names a value of (a row: {"float8": memory})


def float8_names(registry) -> dict:
    """The one list of float8 names every entry point takes (``time_plan(float8=)``, ``search_plans(
    allow_float8=)``, the measured profile's ``float8=`` option, the CLI's flags and scenario files):
    ``{name: (implementation or None, option value or None)}``, each registered float8 implementation
    (``FLOAT8_HOOK``) with the value of the profile option ``float8`` it declares as its memory
    (``Float8Casts.memory``; None: none, or a value no installed profile takes), then each value of that
    option (its declared choices) no implementation is named, with the one implementation declaring it
    as its memory (None: none, or several). Empty where neither is installed."""
    from .scenario import option_fields
    implementations = registry.extensions.get(FLOAT8_HOOK, {})
    field = option_fields(registry).get(FLOAT8_OPTION)
    values = tuple(field.metadata.get("choices") or ()) if field is not None else ()
    names = {name: (i, getattr(i, "memory", None) if getattr(i, "memory", None) in values else None)
             for name, i in implementations.items()}
    for value in values:
        owners = [i for i in implementations.values() if getattr(i, "memory", None) == value]
        names.setdefault(value, (owners[0] if len(owners) == 1 else None, value))
    return names


def float8_readings(names: dict) -> str:
    """How each name of ``float8_names`` is read by the other kind of entry point (the memory's
    option, the step time's implementation)."""
    pairs = [f"{n} = {i.name}" for n, (i, m) in names.items() if i is not None and m == n]
    memory_only = [n for n, (i, _) in names.items() if i is None]
    time_only = [n for n, (_, m) in names.items() if m is None]
    return "; ".join(filter(None, (", ".join(pairs),
                                   memory_only and f"memory only: {', '.join(memory_only)}",
                                   time_only and f"step time only (memory not modelled): {', '.join(time_only)}")))


def float8_implementation(registry, float8, parameter: str = "float8"):
    """A run's ``float8``: False or True (the step-time model's default implementation) as given; a
    name of ``float8_names`` (case and separators ignored): a registered implementation's name, or a
    value of the memory option ``float8`` (``"tensorwise"``) read as the one implementation that
    declares it as its memory (``Float8Casts.memory``), resolved to that declaration (``Float8Casts``,
    mlsysim_plugins.steptime_hookspecs); or a declaration itself (the step-time model checks it). A
    name not in the list is an error listing it and how each is read; a memory value no implementation
    (or several) declares is refused naming them."""
    if isinstance(float8, bool) or float8 is None:
        return bool(float8)
    if not isinstance(float8, str):
        return float8
    from ._checks import name_key
    implementations = registry.extensions.get(FLOAT8_HOOK, {})
    if not implementations:
        raise InvalidInputError(parameter, float8, "a registered float8 implementation: (none installed)",
                                "the built-in plugin 'steptime' registers them; is it blocked?")
    names = float8_names(registry)
    found = [n for n in names if name_key(n) == name_key(float8)]
    if not found:
        raise InvalidInputError(parameter, float8, f"one of: {', '.join(names)}", float8_readings(names))
    implementation, _ = names[found[0]]
    if implementation is None:
        owners = [i.name for i in implementations.values() if getattr(i, "memory", None) == found[0]]
        if len(owners) > 1:
            raise InvalidInputError(parameter, float8, f"one of: {', '.join(owners)}", f"{len(owners)} float8 "
                                    f"implementations declare float8={found[0]!r} as their memory: name one")
        raise NotModelledError(parameter, float8, "a name of a float8 implementation: " + ", ".join(
            n for n, (i, _) in names.items() if i is not None),
            f"no registered float8 implementation declares float8={found[0]!r} as its memory, so its casts are "
            "not known to the step time")
    return implementation


def step_time_model_named(registry, name: str | None):
    """The registered step-time model ``name`` (``StepTimeSpec``, mlsysim_plugins.steptime_hookspecs);
    None: the only one installed, else ``roofline``. None installed is an error saying so."""
    models = registry.extensions.get(STEP_TIME_HOOK, {})
    if not models:
        raise InvalidInputError("step_time_model", name, "an installed step-time model: (none installed)",
                                "the planner needs one (the built-in plugin 'steptime' registers 'roofline'; "
                                "is it blocked?)")
    default = next(iter(models)) if len(models) == 1 else "roofline"
    return models[_checks.name("step_time_model", name or default, models)]
