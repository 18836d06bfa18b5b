"""Plan search: every valid parallel layout for a device count, the ones that fit, and the
Pareto front of memory headroom against a documented cost proxy.

A candidate is (tp, pp, dp, ep, data-parallel rule, checkpointing strategy, sequence
parallelism, micro-batch); dp = devices / (tp x pp), the micro-batch divides
global_batch / dp and gradient accumulation makes up the rest. Every installed
data-parallel rule and checkpointing strategy takes part, third-party ones included.

Validity: tp is a power of two up to the devices of a node (8 when the hardware does not
say) and divides the heads; pp <= layers; ep divides dp and the experts (MoE only); ZeRO
stages above 0 are skipped when dp = 1 (they change nothing).

**Cost proxy** (seconds per step, one device; lower is better, assumptions overridable):

    compute  = 6 x active_params x tokens_per_step / devices / flops x (1 + recompute)
    bubble   = (pp - 1) / (gas + pp - 1)                      (1F1B / GPipe)
    tp_comm  = 4 x layers/pp x 2(t-1)/t x s x b x h x bytes x gas / tp_bandwidth
    dp_comm  = 2(d-1)/d x gradient bytes (x1.5 for ZeRO-3) / network_bandwidth
    pp_comm  = 2 x s x b x h x bytes x gas / network_bandwidth         (pp > 1)
    ep_comm  = 4 x k x s x b x h x bytes x gas x layers/pp / network_bandwidth (ep > 1)
    cost     = compute / (1 - bubble) + tp_comm + dp_comm + pp_comm + ep_comm

recompute is the extra forward work: 0 (none), 0.03 (selective; Korthikanti et al. 2023
report 2-4 %), 1/3 (full: one more forward pass over fwd + bwd = 3 units); a third-party
strategy counts 0 unless ``recompute`` maps its name. No overlap of communication and
compute is assumed: the proxy ranks layouts, it does not predict seconds.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Callable, Mapping, Sequence

import attrs

from . import _checks
from .errors import InvalidInputError, MlsysimError
from .solver import TrainingMemoryModel, _build_plan, _resolve_hardware, _resolve_model, _run_pipeline
from .specs import DATA

RECOMPUTE = {"none": 0.0, "selective": 0.03, "full": 1 / 3}


@attrs.frozen(kw_only=True)
class Candidate:
    """One layout that fits, with its memory and cost proxy."""

    tp: int
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
    cost: float
    bubble: float
    recompute: float
    communication_bytes: float
    pareto: bool = False

    def as_row(self) -> dict:
        return attrs.asdict(self)


@attrs.frozen(kw_only=True)
class PlanSearch:
    """What a search found: counts, every layout that fits (cheapest first), the Pareto front."""

    model: str
    hardware: str
    devices: int
    global_batch: int
    seq_len: int
    candidates: int          # layouts enumerated
    solves: int              # full solves run (the rest were pruned by monotonicity)
    seconds: float
    fits: tuple[Candidate, ...]
    pareto: tuple[Candidate, ...]
    assumptions: Mapping[str, float]

    def to_dict(self) -> dict:
        return {"model": self.model, "hardware": self.hardware, "devices": self.devices,
                "global_batch": self.global_batch, "seq_len": self.seq_len, "candidates": self.candidates,
                "solves": self.solves, "seconds": self.seconds, "assumptions": dict(self.assumptions),
                "fits": [c.as_row() for c in self.fits], "pareto": [c.as_row() for c in self.pareto]}

    def to_html(self, rows: int = 50, pareto_only: bool = True) -> str:
        """An HTML table of the layouts (the Pareto front by default), for notebooks."""
        from html import escape
        chosen = (self.pareto if pareto_only else self.fits)[:rows]
        head = ("tp", "pp", "dp", "ep", "dp rule", "checkpointing", "seq. parallel", "micro-batch", "grad. accum.",
                "memory GB (1e9 B)", "memory GiB (2^30 B)", "headroom GB", "cost proxy s", "bubble", "Pareto")
        body = "".join(
            "<tr>" + "".join(f"<td>{escape(str(v))}</td>" for v in (
                c.tp, c.pp, c.dp, c.ep, c.data_parallel, c.checkpointing, "yes" if c.sequence_parallel else "no",
                c.microbatch, c.gradient_accumulation_steps, f"{c.total_memory * 1e-9:,.2f}",
                f"{c.total_memory / 2**30:,.2f}", f"{c.headroom * 1e-9:,.2f}", f"{c.cost:.4f}", f"{c.bubble:.3f}",
                "*" if c.pareto else "")) + "</tr>" for c in chosen)
        caption = escape(f"{self.model} on {self.devices} x {self.hardware}, global batch {self.global_batch}, "
                         f"seq {self.seq_len}: {self.candidates:,} layouts, {len(self.fits):,} fit, "
                         f"{len(self.pareto)} on the Pareto front")
        return (f"<table><caption>{caption}</caption><thead><tr>"
                + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr></thead><tbody>{body}</tbody></table>")

    def _repr_html_(self) -> str:   # Jupyter shows a search as this table
        return self.to_html()

    def table(self, rows: int = 20, pareto_only: bool = True) -> str:
        chosen = self.pareto if pareto_only else self.fits
        head = (f"{self.model} on {self.devices} x {self.hardware}, global batch {self.global_batch}, "
                f"seq {self.seq_len}: {self.candidates:,} layouts, {len(self.fits):,} fit, "
                f"{len(self.pareto)} on the Pareto front (headroom vs cost) [{self.seconds:.2f} s]")
        cols = ("tp", "pp", "dp", "ep", "dp rule", "ckpt", "sp", "mb", "gas", "memory GB", "GiB",
                "headroom GB", "cost s", "bubble", "P")
        lines = [head, "  ".join(f"{c:>11}" if i >= 9 else f"{c:>9}" for i, c in enumerate(cols))]
        for c in chosen[:rows]:
            values = (c.tp, c.pp, c.dp, c.ep, c.data_parallel, c.checkpointing, "y" if c.sequence_parallel else "n",
                      c.microbatch, c.gradient_accumulation_steps)
            lines.append("  ".join(f"{v:>9}" for v in values) + "  " + "  ".join((
                f"{c.total_memory * 1e-9:>11.2f}", f"{c.total_memory / 2**30:>11.2f}",
                f"{c.headroom * 1e-9:>11.2f}", f"{c.cost:>11.4f}", f"{c.bubble:>11.3f}",
                f"{'*' if c.pareto else '':>11}")))
        if len(chosen) > rows:
            lines.append(f"... {len(chosen) - rows} more (--json for all)")
        return "\n".join(lines)


def _powers_of_two(limit: int) -> list[int]:
    return [1 << k for k in range(limit.bit_length()) if (1 << k) <= limit]


def _divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _pareto(fits: list[Candidate]) -> set[int]:
    """Indices not dominated on (headroom: more is better, cost: less is better)."""
    order = sorted(range(len(fits)), key=lambda i: (fits[i].cost, -fits[i].headroom))
    front, best = set(), -math.inf
    for i in order:
        if fits[i].headroom > best:
            front.add(i)
            best = fits[i].headroom
    return front


def search_plans(model, hardware, *, devices: int, global_batch: int, seq_len: int = 2048,
                 precision: str = "fp16", optimizer: str = "adam",
                 checkpointing: Sequence[str] | None = None, data_parallel: Sequence[str] | None = None,
                 sequence_parallel: Sequence[bool] = (True, False), max_tp: int | None = None,
                 trainable_fraction: float = 1.0, communication_buffer_fraction: float = 0.05,
                 flops: float = 4e14, tp_bandwidth: float = 450e9, network_bandwidth: float = 50e9,
                 recompute: Mapping[str, float] | None = None, assume_monotone: bool = True,
                 solver: TrainingMemoryModel | None = None,
                 progress: Callable[[int, int], None] | None = None) -> PlanSearch:
    """Enumerate, solve and rank every valid layout (see the module docstring)."""
    started = time.perf_counter()
    solver = solver or TrainingMemoryModel()
    registry = solver.registry
    model = _resolve_model(model)
    hardware = _resolve_hardware(hardware)
    devices = _checks.count("devices", devices)
    global_batch = _checks.count("global_batch", global_batch)
    seq_len = _checks.count("seq_len", seq_len)
    for name, value in (("flops", flops), ("tp_bandwidth", tp_bandwidth), ("network_bandwidth", network_bandwidth)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
            raise InvalidInputError(name, value, "a positive finite number")
    strategies = list(checkpointing) if checkpointing is not None else sorted(registry.checkpointing)
    if model.heads is None:
        strategies = [s for s in strategies if not registry.checkpointing[s].requires_heads]
    dp_rules = list(data_parallel) if data_parallel is not None else sorted(registry.rules_for_axis(DATA))
    recompute = {**RECOMPUTE, **(recompute or {})}
    max_tp = max_tp or hardware.devices_per_node or 8
    layers = model.layers
    experts = model.experts if model.is_sparse else 1
    top_k = model.active_experts_per_token if model.is_sparse else 0
    active = getattr(model, "active_parameters", model.parameters)
    tokens = global_batch * seq_len
    h = model.hidden_dim or 4096

    groups = []   # (tp, pp, dp, ep, rule, ckpt, sp, [micro-batches])
    for tp in _powers_of_two(min(max_tp, devices)):
        if devices % tp or (model.heads and model.heads % tp):
            continue
        for pp in _divisors(devices // tp):
            if pp > layers:
                continue
            dp = devices // (tp * pp)
            if global_batch % dp:
                continue
            micro = _divisors(global_batch // dp)
            for ep in ([e for e in _divisors(dp) if e <= experts and experts % e == 0] if model.is_sparse else [1]):
                for rule in dp_rules:
                    if dp == 1 and rule in ("zero1", "zero2", "zero3"):
                        continue    # nothing to shard over: the same as zero0
                    for ckpt in strategies:
                        for sp in (sequence_parallel if tp > 1 else (True,)):
                            groups.append((tp, pp, dp, ep, rule, ckpt, sp, micro))
    total = sum(len(g[-1]) for g in groups)

    fits: list[Candidate] = []
    solves = done = 0
    last_report = time.perf_counter()
    for tp, pp, dp, ep, rule, ckpt, sp, micro in groups:
        base = None
        for mb in micro:   # ascending: memory grows with the micro-batch
            done += 1
            gas = global_batch // (dp * mb)
            if base is None:
                try:
                    base = _build_plan(registry, solver._profile, model, hardware, global_batch, seq_len,
                                       precision, optimizer, ckpt, tp, pp, dp, ep, 0, gas, trainable_fraction,
                                       communication_buffer_fraction, sp, rule, None, None, ())
                except MlsysimError:
                    done += len(micro) - 1
                    break       # a rule rejects this layout (e.g. an option constraint)
                plan = base
            else:
                plan = attrs.evolve(base, gradient_accumulation_steps=gas)
            try:
                result = _run_pipeline(registry, plan)
            except MlsysimError:
                continue
            solves += 1
            if not result.feasible:
                if assume_monotone:
                    done += len(micro) - micro.index(mb) - 1
                    break
                continue
            bytes_ = plan.bytes_per_value
            layer_share = math.ceil(layers / pp)
            bubble = (pp - 1) / (gas + pp - 1)
            compute = 6 * active * tokens / devices / flops * (1 + recompute.get(ckpt, 0.0))
            act = seq_len * mb * h * bytes_
            tp_comm = 4 * layer_share * 2 * (tp - 1) / tp * act * gas / tp_bandwidth if tp > 1 else 0.0
            grad_bytes = model.parameters / (tp * pp * ep) * bytes_
            dp_comm = (2 * (dp - 1) / dp * grad_bytes * (1.5 if rule == "zero3" else 1.0)) / network_bandwidth
            pp_comm = 2 * act * gas / network_bandwidth if pp > 1 else 0.0
            ep_comm = 4 * top_k * act * gas * layer_share / network_bandwidth if ep > 1 else 0.0
            comm_bytes = (tp_comm * tp_bandwidth + (dp_comm + pp_comm + ep_comm) * network_bandwidth)
            cost = compute / (1 - bubble) + tp_comm + dp_comm + pp_comm + ep_comm
            fits.append(Candidate(tp=tp, pp=pp, dp=dp, ep=ep, data_parallel=rule, checkpointing=ckpt,
                                  sequence_parallel=sp, microbatch=mb, gradient_accumulation_steps=gas,
                                  total_memory=result.total_memory, headroom=result.headroom, cost=cost,
                                  bubble=bubble, recompute=recompute.get(ckpt, 0.0),
                                  communication_bytes=comm_bytes))
        if progress is not None and time.perf_counter() - last_report > 0.2:
            progress(done, total)
            last_report = time.perf_counter()
    if progress is not None:
        progress(total, total)
    front = _pareto(fits)
    marked = [attrs.evolve(c, pareto=True) if i in front else c for i, c in enumerate(fits)]
    marked.sort(key=lambda c: (c.cost, -c.headroom))
    return PlanSearch(model=model.name, hardware=hardware.name, devices=devices, global_batch=global_batch,
                      seq_len=seq_len, candidates=total, solves=solves,
                      seconds=time.perf_counter() - started, fits=tuple(marked),
                      pareto=tuple(c for c in marked if c.pareto),
                      assumptions={"flops": flops, "tp_bandwidth": tp_bandwidth,
                                   "network_bandwidth": network_bandwidth, **{f"recompute.{k}": v for k, v in recompute.items()}})


def text_progress(stream=sys.stderr) -> Callable[[int, int], None]:
    """A progress bar on a terminal: ``[#####.....] 51,234 / 100,000 layouts``."""
    def report(done: int, total: int) -> None:
        width = 30
        filled = int(width * done / total) if total else width
        stream.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done:,} / {total:,} layouts")
        if done >= total:
            stream.write("\n")
        stream.flush()
    return report
