"""``fit techniques``: the memory-saving techniques that make a run fit, with the least added
step time, printed as a ladder (issue 16, item 8). The measured profile's technique ladder
(``ProfileSpec.techniques``, which ``mlsysim-core fit techniques`` calls; issue 24 moved it
out of ``mlsysim_core``).

The techniques are what is registered through the measured hook ``mlsysim_measured_techniques``
(``techniques.Technique``; the built-ins in ``builtin_techniques.py``), in their ``order``: each
one's ``candidates`` (value, label, numerical caveat; a list, or ``candidates(registry)``: what the
solver's registry holds), offered where its ``offered(value, given,
registry)`` says (default: the run leaves its keyword unset), and priced by its ``added_step_time(plan,
figures)`` (seconds or None, how it was computed) where ``active(plan)``. A third-party technique
registered through the hook is in the ladder as the built-ins are. The built-ins:

==========================  ====================================================================
lever                       alternatives (solve keywords)                  step time priced by
==========================  ====================================================================
activation checkpointing    every strategy declaring measured.saves_rank   recomputed forward FLOPs
                            (selective, attention-only, mlp-only, every-k, / hardware FLOP/s
                            op-sac, full)
loss                        chunked, fused_linear                          extra kernel launches
optimizer in backward       optimizer_in_backward=True                     0 (same arithmetic)
activation offload          save_on_cpu, torchtune                         2 x bytes / host link
offload (host optimizer)    optimizer, optimizer+gradients(+parameters),   state / host memory bw +
                            torchao, torchao+gradients                     (g + w) / host link
low-bit optimizer           every optimizer declaring quantized moments    extra bytes moved /
                            and an update, not not_offered (adamw-8bit-bnb, memory bandwidth
                            adamw-8bit-torchao, adamw-4bit-torchao), from
                            one declaring its update (adam, adamw)
float8                      tensorwise, rowwise                            cast traffic / memory bw
==========================  ====================================================================

A technique that ``replaces`` the run's own value (checkpointing: a policy that saves more) is
priced over the run's own value's time. What is offered is asked of the declarations, never of the
names: a checkpointing strategy declaring a larger ``measured.saves_rank`` than the run's, or any
where the run's recomputes nothing (``builtin_techniques._saves_more``); a low-bit optimizer where
the run's declares the update it quantizes and no quantized moments (``_quantizes_the_update_of``).

The search (``fit_techniques``) is best-first over combinations: the baseline, then each
combination one technique larger than one already visited, visited in order of added step
time (combinations with a step whose time is unknown after every combination whose time is
known; then by memory). The first visited combination that fits is the answer: the cheapest,
as long as switching a technique on never makes a run cheaper (true of the functions above
except that checkpointing shrinks what activation offload moves; the search visits such a
pair through both of its subsets). A combination the profile refuses (NotModelledError,
InvalidInputError: e.g. the optimizer in the backward with a low-bit optimizer) is skipped
and counted. Each solve is memoized.

The ladder is the greedy path from the baseline to that combination: at each step the
remaining technique with the least added time per byte saved is switched on.

Hardware figures: FLOP/s from ``HardwareNode.peak_bf16_flops`` (a peak: the recompute time it gives is a lower bound), the host link from
``extra["performance"]["host_link_bytes_per_s"]`` where an entry records it (none does yet),
the memory bandwidth from ``HardwareNode.memory_bandwidth``; else the caller's options; else
the time is shown as unknown, never guessed. Numerical caveats (8-bit or 4-bit optimizer
states, fp8 matmuls) are shown beside a step, not priced.
"""

from __future__ import annotations

import heapq
import inspect
import math

import attrs

from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from mlsysim_core.inverse import prepared_plan
from mlsysim_core.result import TrainingMemoryResult

MAX_SOLVES = 2000      # combinations evaluated at most (each a memoized solve, a few ms)
GIB = 2**30



def candidates_of(techniques, registry) -> list[tuple]:
    """(lever, solve keyword, value, label, numerical caveat or None) of every registered technique's
    candidates in the world of ``registry`` (``Technique.candidates_in``), in the techniques' order: the
    ladder's closed list no more."""
    return [(t.name, t.ladder_keyword, c.value, c.label, c.caveat) for t in techniques
            for c in t.candidates_in(registry)]


@attrs.frozen
class Step:
    """One rung: the technique switched on, the run's memory after it, the time it adds."""
    label: str
    keyword: str
    value: object
    result: TrainingMemoryResult
    added_seconds: float | None       # this step's added time (None: unknown)
    total_seconds: float | None       # the combination's added time so far (None: unknown)
    how: tuple[str, ...]              # how each technique's time was computed, at this step
    caveat: str | None


@attrs.frozen
class TechniqueLadder:
    baseline: TrainingMemoryResult
    steps: tuple[Step, ...]           # empty when the baseline fits, or when nothing fits
    fits: bool
    combination: dict                 # the chosen solve keywords (empty: nothing needed / found)
    added_seconds: float | None
    evaluated: int
    refused: int
    alternatives: tuple = ()          # other fitting combinations found: (combination, seconds, GiB)
    figures: dict = attrs.field(factory=dict)     # hardware figures used, and where from
    message: str = ""

    def describe(self) -> str:
        b = self.baseline
        out = [f"baseline: {_mem(b.total_memory)} of {_mem(b.available_memory)} "
               f"({'fits' if b.feasible else 'does not fit'})"]
        for name, (value, where) in self.figures.items():
            out.append(f"{name}: {where}" if value is None else f"{name}: {value:.4g} ({where})")
        if self.message:
            out.append(self.message)
        for i, s in enumerate(self.steps, 1):
            out.append(f"{i}. + {s.label}: {_mem(s.result.total_memory)}"
                       f"{'' if s.result.host_memory == 0 else f', host {_mem(s.result.host_memory)}'}; "
                       f"added {_sec(s.added_seconds)} (total {_sec(s.total_seconds)})"
                       f"{' - fits' if s.result.feasible else ''}")
            out += [f"     time: {h}" for h in s.how]
            if s.caveat:
                out.append(f"     caveat (not priced): {s.caveat}")
        out.append(f"searched {self.evaluated} combinations ({self.refused} refused by the profile)")
        for combo, seconds, gib in self.alternatives:
            out.append(f"also fits: {_combo(combo)}: added {_sec(seconds)}, {gib:,.2f} GiB")
        if unknown := self.unknown_figures():     # (how to give each figure a time was unknown for)
            given = [f"{f['flag']} ({name}; {f['keyword']}= in Python)" for name, f in unknown.items() if f["flag"]]
            out.append("added unknown: give the figures it needs (not given, and none in the catalog for this "
                       "hardware): " + "; ".join(given + [f"{name} ({f['keyword']}= in Python)" for name, f in
                                                          unknown.items() if not f["flag"]]))
        return "\n".join(out)

    def unknown_figures(self) -> dict:
        """``{figure: {"flag", "keyword"}}`` (``FIGURE_INPUTS``) for each figure the ladder lacks where a
        step or an alternative was timed 'unknown': what the user would give (empty: nothing unknown)."""
        if all(s.added_seconds is not None for s in self.steps) and all(t is not None for _, t, _ in self.alternatives):
            return {}
        return {name: dict(zip(("keyword", "flag"), FIGURE_INPUTS.get(name, (None, None))))
                for name, (value, _) in self.figures.items() if value is None}

    def to_dict(self) -> dict:
        return {"fits": self.fits, "combination": self.combination, "added_seconds": self.added_seconds,
                "evaluated": self.evaluated, "refused": self.refused, "message": self.message,
                "figures": {k: {"value": v, "source": w, **dict(zip(("keyword", "flag"), FIGURE_INPUTS.get(k, ())))}
                            for k, (v, w) in self.figures.items()},
                "baseline": {"total_memory": self.baseline.total_memory, "feasible": self.baseline.feasible},
                "steps": [{"technique": s.label, "keyword": s.keyword, "value": s.value,
                           "total_memory": s.result.total_memory, "host_memory": s.result.host_memory,
                           "feasible": s.result.feasible, "added_seconds": s.added_seconds,
                           "total_seconds": s.total_seconds, "how": list(s.how), "caveat": s.caveat}
                          for s in self.steps],
                "alternatives": [{"combination": c, "added_seconds": t, "total_gib": g}
                                 for c, t, g in self.alternatives], "unknown_figures": self.unknown_figures()}


def _mem(n) -> str:
    return f"{n / GIB:,.2f} GiB ({n * 1e-9:,.2f} GB)"


def _sec(s) -> str:
    return "unknown" if s is None else f"{s:.4g} s"


def _combo(combo: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in combo.items()) or "nothing"


# Each figure a ladder times with: the keyword of ``fit_techniques`` (``ProfileSpec.techniques``) that gives it and
# the `mlsysim-core fit techniques` flag, with its unit, that sets that keyword (None: none; the hardware's own).
FIGURE_INPUTS = {"hardware FLOP/s": ("hardware_flops", "--flops FLOP/s"),
                 "host link B/s": ("host_link_bytes_per_s", "--host-link-gbps GB/s"),
                 "host memory B/s": ("host_memory_bytes_per_s", "--host-memory-gbps GB/s"),
                 "memory bandwidth B/s": ("memory_bandwidth", None)}


def given_as(*figures: str) -> str:
    """How the user gives ``figures`` (names of ``FIGURE_INPUTS``): each keyword, and the flag."""
    said = [f"{FIGURE_INPUTS[f][0]}=" + (f" ({FIGURE_INPUTS[f][1]})" if FIGURE_INPUTS[f][1] else "") for f in figures]
    return "give " + " and ".join(said)


def hardware_figures(hardware, plugin_manager=None, *, hardware_flops=None, host_link_bytes_per_s=None,
                     host_memory_bytes_per_s=None, memory_bandwidth=None) -> dict:
    """{name: (value or None, where it comes from)}: the caller's value, else the catalog's."""
    perf, node = {}, hardware
    if isinstance(hardware, str):
        from mlsysim_core.catalog import find_hardware
        entry = find_hardware(hardware, plugin_manager=plugin_manager)
        perf, node = dict(entry.extra.get("performance") or {}), entry.value
    figures = {}
    for name, given, key, what in (
            ("hardware FLOP/s", hardware_flops, None, "no FLOP/s for this hardware"),
            ("host link B/s", host_link_bytes_per_s, "host_link_bytes_per_s", "no host-link bandwidth for this hardware"),
            ("host memory B/s", host_memory_bytes_per_s, None, "no host-memory bandwidth given"),
            ("memory bandwidth B/s", memory_bandwidth, None, "no memory bandwidth for this hardware")):
        if given is not None:
            if isinstance(given, bool) or not isinstance(given, (int, float)) or not 0 < given < math.inf:
                raise InvalidInputError(FIGURE_INPUTS[name][0], given, f"a positive number of {name.split()[-1]}")
            figures[name] = (float(given), "given")
        elif key and key in perf:
            figures[name] = (float(perf[key]), f"catalog: performance.{key}")
        elif name == "hardware FLOP/s" and getattr(node, "peak_bf16_flops", None):
            figures[name] = (float(node.peak_bf16_flops), "catalog: peak_bf16_flops")
        elif name == "memory bandwidth B/s" and getattr(node, "memory_bandwidth", None):
            figures[name] = (float(node.memory_bandwidth), "catalog: memory_bandwidth")
        else:
            figures[name] = (None, f"unknown ({what}; {given_as(name)})")
    return figures


def step_time(plan, figures, only=None, techniques=None) -> tuple[float | None, list[str], int]:
    """The step time the techniques the prepared plan switches on add (``only``: just those solve
    keywords; ``techniques``: default the plan's, as ``prepare`` put them): (seconds, or None when
    any is unknown; how each was computed; how many unknown). Each registered technique with an
    ``added_step_time`` that is ``active`` in the plan adds its part, in the techniques' order."""
    if techniques is None:
        techniques = getattr(plan.profile_options, "techniques", None) or ()
    parts = [t.added_step_time(plan, figures) for t in techniques
             if t.added_step_time is not None and t.active is not None
             and (only is None or t.ladder_keyword in only) and t.active(plan)]
    unknown = sum(1 for s, _ in parts if s is None)
    return (None if unknown else sum(s for s, _ in parts)), [how for _, how in parts], unknown


@attrs.frozen
class _Node:
    combo: tuple            # indices into the candidate techniques, sorted
    result: TrainingMemoryResult
    seconds: float | None   # added over the baseline (None: unknown)
    unknown: int            # techniques whose time is unknown
    how: tuple


def fit_techniques(model, hardware, batch_size, seq_len=2048, *, solver=None, hardware_flops=None,
                   host_link_bytes_per_s=None, host_memory_bytes_per_s=None, memory_bandwidth=None,
                   techniques=None, max_solves: int = MAX_SOLVES, **solve_kwargs) -> TechniqueLadder:
    """The combination of techniques that makes a run fit with the least added step time, as a
    ladder (module docstring). ``solve_kwargs`` are ``solve``'s (the run as it is, under the
    measured profile by default); ``techniques``: the solve keywords to consider (default all:
    activation_checkpointing, loss, optimizer_in_backward, activation_offload, offload,
    optimizer, float8); the figures (per second) override the catalog's."""
    from mlsysim_core.inverse import _check_keywords, _solver
    solver = _solver(solver)
    solve_kwargs.setdefault("profile", "measured")
    _check_keywords(solve_kwargs, (), solver)
    spec = solver.registry.profiles.get(solve_kwargs["profile"])
    from mlsysim_core.inputs import options_fields
    from .techniques import registered
    registrations = registered(solver.registry)     # every technique registered (techniques.py), in order
    keywords = sorted({t.ladder_keyword for t in registrations if t.ladder_keyword})    # the ladder's levers
    own = set(inspect.signature(type(solver).solve).parameters)     # solve's own keywords (not options)
    options = set(keywords) - own
    if spec is None or not options <= set(options_fields(spec)):
        raise NotModelledError("profile", solve_kwargs["profile"], "a profile whose options are the techniques' "
                               f"({', '.join(sorted(options))}): the measured-grade one, measured",
                               "the techniques are options of the measured profile")
    if techniques is not None:
        if isinstance(techniques, str) or not all(isinstance(t, str) for t in techniques):
            raise InvalidInputTypeError("techniques", techniques, f"a list of: {', '.join(keywords)}")
        for name in techniques:
            if name not in keywords:
                raise InvalidInputError("techniques", name, f"one of: {', '.join(keywords)}")
    max_solves = int(max_solves) if not isinstance(max_solves, bool) and isinstance(max_solves, int) else None
    if max_solves is None or max_solves < 1:
        raise InvalidInputError("max_solves", max_solves, "an integer >= 1")
    figures = hardware_figures(hardware, solver.plugin_manager, hardware_flops=hardware_flops,
                               host_link_bytes_per_s=host_link_bytes_per_s,
                               host_memory_bytes_per_s=host_memory_bytes_per_s, memory_bandwidth=memory_bandwidth)
    base_kwargs = dict(solve_kwargs)
    baseline = solver.solve(model, hardware, batch_size, seq_len, **base_kwargs)    # errors here are the user's
    base_plan = prepared_plan(solver, model, hardware, batch_size, seq_len, base_kwargs)
    replaced = {t.ladder_keyword for t in registrations if t.replaces and t.candidates}
    base_times = {k: step_time(base_plan, figures, only=(k,), techniques=registrations)[0]
                  for k in replaced}     # a replaced value's time: replaced, not added to
    if baseline.feasible:
        return TechniqueLadder(baseline=baseline, steps=(), fits=True, combination={}, added_seconds=0.0,
                               evaluated=1, refused=0, figures=figures, message="the run fits as it is")
    # The candidates: the levers the run leaves at their defaults (a given value is kept).
    given = {k: v for k, v in base_kwargs.items() if v is not None}
    lever = {t.name: t for t in registrations}
    for t in registrations:      # solve's own keywords the run leaves unset: as the result resolved them
        if t.offered is not None and t.ladder_keyword not in given and hasattr(baseline, t.ladder_keyword):
            given[t.ladder_keyword] = getattr(baseline, t.ladder_keyword)
    candidates = [c for c in candidates_of(registrations, solver.registry)
                  if (techniques is None or c[1] in techniques)
                  and lever[c[0]].is_offered(c[2], given, solver.registry)]
    evaluated, refused = 1, 0

    def evaluate(combo):
        nonlocal evaluated, refused
        kwargs = dict(base_kwargs)
        for i in combo:
            kwargs[candidates[i][1]] = candidates[i][2]
        evaluated += 1
        switched = {candidates[i][1] for i in combo}
        try:
            result = solver.solve(model, hardware, batch_size, seq_len, **kwargs)
            seconds, how, unknown = step_time(prepared_plan(solver, model, hardware, batch_size, seq_len, kwargs),
                                              figures, only=switched, techniques=registrations)
        except (NotModelledError, InvalidInputError):
            refused += 1
            return None
        for k in sorted(replaced & switched):
            if base_times[k] is None and seconds is not None:
                seconds, unknown = None, unknown + 1      # the run's own value's time is unknown: so is the change
            elif seconds is not None:
                seconds -= base_times[k]
        return _Node(combo, result, seconds, unknown, tuple(how))

    def key(node):     # known times first, then the least time, the fewest techniques, the least memory
        return (node.unknown, node.seconds or 0.0, len(node.combo), node.result.total_memory, node.combo)

    start = _Node((), baseline, 0.0, 0, ())
    # A technique that changes no phase of this run (e.g. selective checkpointing under fused
    # attention, which keeps no scores) is left out: it can only add steps.
    alone = {j: evaluate((j,)) for j in range(len(candidates))}
    useless = {j for j, n in alone.items() if n is not None and n.result.phase_totals == baseline.phase_totals}
    heap, seen, found = [(key(start), start)], {()}, []
    while heap and evaluated < max_solves:
        _, node = heapq.heappop(heap)
        if node.result.feasible:
            found.append(node)
            if len(found) == 4:
                break
            continue
        levers = {candidates[i][0] for i in node.combo}
        for j, c in enumerate(candidates):
            combo = tuple(sorted((*node.combo, j)))
            if c[0] in levers or j in useless or combo in seen or evaluated >= max_solves:
                continue
            seen.add(combo)
            child = evaluate(combo)
            if child is not None:
                heapq.heappush(heap, (key(child), child))
    found += [n for _, n in sorted(heap) if n.result.feasible][:max(0, 4 - len(found))]   # others seen fitting
    if not found:
        why = (f"no combination of the techniques fits within the {max_solves} combinations searched"
               if evaluated >= max_solves else "no combination of the techniques fits")
        return TechniqueLadder(baseline=baseline, steps=(), fits=False, combination={}, added_seconds=None,
                               evaluated=evaluated, refused=refused, figures=figures, message=why)
    best = found[0]
    steps = _ladder(best.combo, candidates, evaluate, start)
    combination = {candidates[i][1]: candidates[i][2] for i in best.combo}
    alternatives = tuple(({candidates[i][1]: candidates[i][2] for i in n.combo}, n.seconds,
                          n.result.total_memory / GIB) for n in found[1:])
    return TechniqueLadder(baseline=baseline, steps=steps, fits=True, combination=combination,
                           added_seconds=best.seconds, evaluated=evaluated, refused=refused,
                           alternatives=alternatives, figures=figures)


def _ladder(combo, candidates, evaluate, start) -> tuple[Step, ...]:
    """The greedy path to ``combo``: each step the remaining technique with the least added time
    per byte saved (an unknown time, or no bytes saved, after those; then the most bytes saved).
    Where the profile refuses every next subset (e.g. one technique needs another), the rest is
    switched on together."""
    steps, node, left = [], start, list(combo)
    while left:
        options = []
        for i in left:
            child = evaluate(tuple(sorted((*node.combo, i))))
            if child is None:
                continue
            saved = node.result.total_memory - child.result.total_memory
            dt = None if child.seconds is None or node.seconds is None else child.seconds - node.seconds
            priced = dt is not None and saved > 0
            options.append(((not priced, dt / saved if priced else 0.0, -saved, i), child, (i,)))
        if not options:
            options = [((), evaluate(tuple(sorted((*node.combo, *left)))), tuple(left))]
        _, child, switched = min(options, key=lambda o: o[0])
        for i in switched:
            left.remove(i)
        dt = None if child.seconds is None or node.seconds is None else child.seconds - node.seconds
        c = candidates[switched[0]]
        how = tuple(h for h in child.how if h not in node.how)    # what this step adds or changes
        steps.append(Step(label=" + ".join(candidates[i][3] for i in switched), keyword=c[1], value=c[2],
                          result=child.result, added_seconds=dt, total_seconds=child.seconds, how=how,
                          caveat="; ".join(candidates[i][4] for i in switched if candidates[i][4]) or None))
        node = child
    return tuple(steps)
