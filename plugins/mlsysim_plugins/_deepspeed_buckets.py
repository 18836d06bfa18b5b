"""DeepSpeed's ZeRO buffers and FSDP's all-gather limits as options of their sharding rules
(issue 25, item 5): ``--option zero2.reduce_bucket_size=2e8``, ``plugin_options={"zero3":
{"stage3_prefetch_bucket_size": 5e7}}``, ``--option fsdp.prefetch_layers=2``.

Sizes are **elements, as DeepSpeed counts them** (its config's ``reduce_bucket_size: 5e8`` is
500,000,000 gradient values, not bytes); a size with a byte unit (``"1GiB"``) is refused. The
bytes are the elements times the dtype DeepSpeed allocates them in (the model's 16-bit
parameter dtype: ``dtype=self.dtype``). Not given (the default), nothing changes: the reference
profile keeps ``communication_buffer_fraction``'s gradient bucket and the measured profile its
own buffers. Any option of a rule given, the rule prices DeepSpeed's buffers with DeepSpeed's
defaults for the rest, replacing the fraction's bucket (``replaces_communication_buffer_fraction``,
read by ``communication_buffers``), and a note says so.

Derived from DeepSpeed at commit edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (deepspeedai/DeepSpeed):

ZeRO-1/2 (deepspeed/runtime/zero/stage_1_and_2.py):

* ``contiguous_gradients`` (default True, runtime/zero/config.py line 102): ``setup_buckets``
  (lines 2493-2514) allocates ``torch.empty(int(self.reduce_bucket_size), dtype=self.dtype)`` per
  communication dtype at the backward's first gradient hook, and a second one when
  ``overlap_comm`` ("Use double buffers to avoid data access conflict"); ``_release_ipg_buffers``
  (lines 828-835) frees them at the backward's epilogue: alive in the backward and at its end,
  at their full size whatever the model's. ZeRO-1 takes the same path (the hooks are made when
  ``contiguous_gradients``, line 639).
* ``contiguous_gradients=False``: no ipg buffer; the bucket's gradients are flattened once to be
  reduced (``buffered_reduce_fallback``): one bucket, at most ``reduce_bucket_size`` elements
  (or the rank's gradients, if fewer), at the backward's end.
* ``allgather_bucket_size`` (default 5e8): allocates nothing. The updated partitions are
  gathered in place into the flat 16-bit groups (``all_gather_dp_groups``, runtime/utils.py
  lines 1016-1051: ``all_gather_into_tensor`` when the backend has it, else
  ``dist.all_gather`` into narrowed views of the flat buffer); it sets only how many pieces.
* ``overlap_comm``: default False for stages 1 and 2 (config.py lines 383-386: True only for
  stage 3).

ZeRO-3 (deepspeed/runtime/zero/stage3.py, partitioned_param_coordinator.py, parameter_offload.py):

* ``reduce_bucket_size`` with ``contiguous_gradients``: one ipg buffer of ``reduce_bucket_size``
  elements per communication dtype, allocated at initialisation (stage3.py lines 731-735) and
  never freed: every phase. ``overlap_comm`` (default True for stage 3) only moves the reduction to
  a side stream (stage3.py line 336): no buffer of its own, accepted for the DeepSpeed config's sake.
* ``stage3_prefetch_bucket_size`` (default 5e7) and ``stage3_max_live_parameters`` (1e9): after
  fetching a submodule's parameters, the coordinator all-gathers the next ones in the trace
  while fewer than ``min(max_live - available, prefetch_bucket_size)`` elements are in flight
  (partitioned_param_coordinator.py lines 451-476): modelled as that many elements of the next
  layers beside the current layer (at most the rank's other layers).
* ``stage3_max_reuse_distance`` (default 1e9): a submodule's parameters are not released when
  they are used again within that many elements of the trace (``__params_to_release``, lines
  634-662). The forward's top layers are used again by their backward after the layers above
  them (forward and backward) and the LM head: layer j from the top is kept when
  2 x j x layer + head < max_reuse_distance; modelled as those layers' gathered parameters
  (beside the current one) in the forward's end and the backward's start.
* ``stage3_param_persistence_threshold`` (default 1e5): parameters of at most that many
  elements are gathered once and never released (``mark_persistent_parameters``,
  parameter_offload.py lines 311-325: norms, biases): every phase, from the family's parameter
  tensors (measured profile).

FSDP (fsdp, hsdp): ``prefetch_layers`` (FSDP2's ``set_modules_to_forward_prefetch`` /
``set_modules_to_backward_prefetch`` depth; its implicit prefetch is one layer on a GPU) or
``limit_all_gathers`` (FSDP1: True, the default, lets one all-gather run ahead of the current
layer's; False lets the CPU issue every layer's ahead: at most the rank's whole stack). Each
adds that many layers' gathered parameters beside the one the measured profile prices (the CPU
measurements gather one at a time). Priced by the measured profile (the reference has no
per-layer gather: a note says so).

Unvalidated: none of these runs on the CPU harness (DeepSpeed's buckets live on a CUDA device;
the CPU's FSDP2 has no prefetch stream). Every result that uses them says so.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import attrs

from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_core.terms import (BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, FORWARD, PHASES, MemoryTerm)

COMMIT = "edaa7221267243c7be7fb49c5d5f5c4fb97b4641"
DEFAULTS = {    # DeepSpeed's defaults (runtime/zero/config.py at COMMIT), elements
    "reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000, "contiguous_gradients": True,
    "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000, "stage3_param_persistence_threshold": 100_000,
}
UNVALIDATED = ("DeepSpeed's buckets are derived from its source (commit {}); unvalidated: the CPU harness "
               "runs no DeepSpeed").format(COMMIT[:10])
_MAX = 2**53


def _fmt(x) -> str:
    return f"{x:,.0f}"


def elements(name: str, value: object) -> int:
    """A count of elements as DeepSpeed's config gives it: an int, an integral float (``5e8``,
    ``2e8``) or a string of one (``"5e8"``); >= 0. A byte unit is refused (DeepSpeed counts
    elements)."""
    allowed = "a whole number of elements >= 0, as DeepSpeed counts them (e.g. 5e8 or 500000000; not bytes)"
    raw = value
    if isinstance(value, bool):
        raise InvalidInputTypeError(name, value, allowed, "bools are not sizes")
    if isinstance(value, str):
        try:
            value = float(value.replace("_", "")) if any(c in value for c in ".eE") else int(value.replace("_", ""))
        except ValueError:
            detail = ("a byte size: DeepSpeed's bucket sizes are elements" if any(c.isalpha() for c in raw)
                      else "not a number")
            raise InvalidInputError(name, raw, allowed, detail) from None
    if not isinstance(value, numbers.Real):
        raise InvalidInputTypeError(name, raw, allowed, f"got {type(raw).__name__}")
    if not math.isfinite(value) or value < 0:
        raise InvalidInputError(name, raw, allowed, "negative" if math.isfinite(value) and value < 0
                                else "not a finite number")
    if not float(value).is_integer():
        raise InvalidInputError(name, raw, allowed, "not a whole number of elements")
    if value > _MAX:
        raise InvalidInputError(name, raw, allowed, "too large (beyond 2**53)")
    return int(value)


def _size(name):
    return attrs.field(default=None, converter=lambda v: None if v is None else elements(name, v))


def _flag(name):
    def convert(value):
        if value is None or isinstance(value, bool):
            return value
        raise InvalidInputTypeError(name, value, "true or false", f"got {type(value).__name__}")
    return attrs.field(default=None, converter=convert)


def _given(options) -> dict:
    return {f.name: getattr(options, f.name) for f in type(options).__attrs_attrs__   # (attrs.fields, cheaper)
            if getattr(options, f.name) is not None}


@attrs.frozen(kw_only=True)
class ZeroBucketOptions:
    """ZeRO-1/2 (``zero1``, ``zero2``): DeepSpeed's ``reduce_bucket_size`` and
    ``allgather_bucket_size`` (elements), ``overlap_comm``, ``contiguous_gradients``. None: not
    given (DeepSpeed's default when another is given; nothing changes when none is)."""
    reduce_bucket_size: Any = _size("reduce_bucket_size")
    allgather_bucket_size: Any = _size("allgather_bucket_size")
    overlap_comm: Any = _flag("overlap_comm")
    contiguous_gradients: Any = _flag("contiguous_gradients")

    @property
    def replaces_communication_buffer_fraction(self) -> bool:
        """Declared for ``communication_buffers``: the rule prices its own gradient buckets."""
        return bool(_given(self))

    def allocator_model_states(self, plan, placement, tensors):
        """DeepSpeed ZeRO-1/2's flat model states, for the caching allocator's rounding
        (``runtime_overheads.allocator="segments"``; ``measured/allocator.py``)."""
        from mlsysim_plugins.measured.allocator import deepspeed_flat_states
        return deepspeed_flat_states(plan, placement, tensors)


@attrs.frozen(kw_only=True)
class Zero3BucketOptions:
    """ZeRO-3 (``zero3``): DeepSpeed's ``reduce_bucket_size``, ``contiguous_gradients``,
    ``overlap_comm`` and the ``stage3_*`` limits, by their DeepSpeed JSON names (elements)."""
    reduce_bucket_size: Any = _size("reduce_bucket_size")
    contiguous_gradients: Any = _flag("contiguous_gradients")
    overlap_comm: Any = _flag("overlap_comm")
    stage3_prefetch_bucket_size: Any = _size("stage3_prefetch_bucket_size")
    stage3_max_live_parameters: Any = _size("stage3_max_live_parameters")
    stage3_max_reuse_distance: Any = _size("stage3_max_reuse_distance")
    stage3_param_persistence_threshold: Any = _size("stage3_param_persistence_threshold")

    @property
    def replaces_communication_buffer_fraction(self) -> bool:
        return bool(_given(self))

    def allocator_model_states(self, plan, placement, tensors):
        """DeepSpeed ZeRO-3's kept blocks, for the caching allocator's rounding
        (``runtime_overheads.allocator="segments"``; ``measured/allocator.py``)."""
        from mlsysim_plugins.measured.allocator import deepspeed_zero3_states
        return deepspeed_zero3_states(plan, placement, tensors, int(_value(self, "reduce_bucket_size")),
                                      bool(_value(self, "contiguous_gradients")),
                                      int(_value(self, "stage3_param_persistence_threshold")))


def _value(options, name):
    v = getattr(options, name, None)
    return DEFAULTS.get(name, False) if v is None else v


def given_note(rule: str, options) -> str:
    said = ", ".join(f"{k}={v:,}" if type(v) is int else f"{k}={v}" for k, v in _given(options).items())
    return (f"{rule}: DeepSpeed buckets given ({said}; DeepSpeed's defaults for the rest): its buffers replace "
            f"communication_buffer_fraction's gradient bucket for this rule. {UNVALIDATED}")


def zero12_terms(options, value_bytes: int | float, gradient_elements: float) -> list[MemoryTerm]:
    """ZeRO-1/2's buffers for options given (``[]`` when none is): ``value_bytes`` the 16-bit
    parameter dtype's bytes, ``gradient_elements`` the rank's gradients before sharding."""
    if not _given(options):
        return []
    r, overlap = _value(options, "reduce_bucket_size"), bool(_value(options, "overlap_comm"))
    if _value(options, "contiguous_gradients"):
        n = 2 if overlap else 1
        return [MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="DeepSpeed ipg gradient bucket" + (" (double: overlap_comm)"
                                                                                        if overlap else ""),
            nbytes=n * r * value_bytes, phases=(BACKWARD, BACKWARD_END),
            formula=f"{n} x reduce_bucket_size {_fmt(r)} elements x {value_bytes} B (stage_1_and_2.py setup_buckets: "
                    "allocated whole at the backward's first hook, freed at its epilogue)")]
    flat = min(r, gradient_elements)
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="DeepSpeed reduce bucket, flattened (contiguous_gradients=False)",
        nbytes=flat * value_bytes, phases=(BACKWARD_END,),
        formula=f"min(reduce_bucket_size {_fmt(r)}, {_fmt(gradient_elements)} gradient elements) x {value_bytes} B "
                "(one bucket's gradients flattened to be reduced)")]


def zero3_ipg(options, value_bytes) -> list[MemoryTerm]:
    if not _given(options) or not _value(options, "contiguous_gradients"):
        return []
    r = _value(options, "reduce_bucket_size")
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="DeepSpeed ZeRO-3 ipg gradient bucket", nbytes=r * value_bytes,
        phases=PHASES, formula=f"reduce_bucket_size {_fmt(r)} elements x {value_bytes} B (stage3.py: allocated at "
                               "initialisation, never freed)")]


def zero3_prefetch_elements(options, layer: float, other_layers: float) -> float:
    """Elements prefetched beside the current layer: min(prefetch, max_live - layer), at most
    the rank's other layers."""
    prefetch, live = _value(options, "stage3_prefetch_bucket_size"), _value(options, "stage3_max_live_parameters")
    return max(0, min(prefetch, live - layer, other_layers))


def zero3_kept_layers(options, layer: float, head: float, layers: int) -> int:
    """Top layers (beside the current one) whose parameters stay gathered from their forward to
    their backward: layer j from the top is kept when 2 j layer + head < max_reuse_distance."""
    reuse = _value(options, "stage3_max_reuse_distance")
    kept = sum(1 for j in range(layers) if 2 * j * layer + head < reuse)
    return max(0, kept - 1)


def zero3_terms(options, value_bytes, gathered_bytes, layer: float, layers: int, head: float,
                tensors=()) -> list[MemoryTerm]:
    """ZeRO-3's buffers beside the one gathered layer (measured profile): the ipg bucket, the
    prefetched parameters, the layers kept for reuse, the persistent parameters."""
    if not _given(options):
        return []
    terms = zero3_ipg(options, value_bytes)
    p = zero3_prefetch_elements(options, layer, (layers - 1) * layer)
    if p:
        terms.append(MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="DeepSpeed ZeRO-3 prefetched parameters", nbytes=p * gathered_bytes,
            phases=(FORWARD, BACKWARD),
            formula=f"min(stage3_prefetch_bucket_size, stage3_max_live_parameters - {_fmt(layer)}, {layers - 1} other "
                    f"layers) = {_fmt(p)} elements x {gathered_bytes} B"))
    k = zero3_kept_layers(options, layer, head, layers)
    if k:
        terms.append(MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="DeepSpeed ZeRO-3 top layers kept for reuse",
            nbytes=k * layer * gathered_bytes, phases=(FORWARD, BACKWARD),
            formula=f"{k} layers x {_fmt(layer)} elements x {gathered_bytes} B (2 x j x layer + head {_fmt(head)} < "
                    f"stage3_max_reuse_distance {_fmt(_value(options, 'stage3_max_reuse_distance'))})"))
    threshold = _value(options, "stage3_param_persistence_threshold")
    persistent = sum(t for t in tensors if t <= threshold)
    if persistent:
        terms.append(MemoryTerm(
            component=COMMUNICATION_BUFFERS, label="DeepSpeed ZeRO-3 persistent parameters (never released)",
            nbytes=persistent * gathered_bytes, phases=PHASES,
            formula=f"{_fmt(persistent)} elements of the tensors of at most stage3_param_persistence_threshold "
                    f"{_fmt(threshold)} x {gathered_bytes} B"))
    return terms


def zero3_reference_terms(options, value_bytes, parameters: float) -> list[MemoryTerm]:
    """ZeRO-3 under the reference profile: the ipg bucket and the prefetch bucket (at most the
    rank's parameters); reuse and persistence need the layers (measured profile)."""
    if not _given(options):
        return []
    p = max(0, min(_value(options, "stage3_prefetch_bucket_size"), _value(options, "stage3_max_live_parameters"),
                   parameters))
    return zero3_ipg(options, value_bytes) + ([MemoryTerm(
        component=COMMUNICATION_BUFFERS, label="DeepSpeed ZeRO-3 prefetched parameters", nbytes=p * value_bytes,
        phases=(FORWARD, BACKWARD), formula=f"min(stage3_prefetch_bucket_size, stage3_max_live_parameters, "
                                            f"{_fmt(parameters)} params) = {_fmt(p)} elements x {value_bytes} B")]
        if p else [])


# --- FSDP's all-gather limits -------------------------------------------------------------------

def _layers_option(value):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) and not (
            isinstance(value, float) and value.is_integer()):
        raise InvalidInputTypeError("prefetch_layers", value, "a whole number of layers >= 0",
                                    f"got {type(value).__name__}")
    if value < 0:
        raise InvalidInputError("prefetch_layers", value, "a whole number of layers >= 0", "negative")
    return int(value)


@attrs.frozen(kw_only=True)
class FsdpGatherOptions:
    """FSDP's all-gather limits: ``prefetch_layers`` (FSDP2's explicit prefetch depth) or
    ``limit_all_gathers`` (FSDP1: True one layer ahead, False every layer ahead)."""
    prefetch_layers: Any = attrs.field(default=None, converter=_layers_option)
    limit_all_gathers: Any = _flag("limit_all_gathers")

    def allocator_streams(self, plan, placement):
        """FSDP2's side-stream allocations, for the caching allocator's per-stream pools
        (``runtime_overheads.allocator="segments"``; ``measured/allocator.py``)."""
        from mlsysim_plugins.measured.allocator import fsdp2_streams
        return fsdp2_streams(plan, placement)

    def __attrs_post_init__(self):
        if self.prefetch_layers is not None and self.limit_all_gathers is not None:
            raise InvalidInputError("limit_all_gathers", self.limit_all_gathers,
                                    "not beside prefetch_layers (FSDP1's limit or FSDP2's depth, one of them)",
                                    f"prefetch_layers={self.prefetch_layers} is given too")


def prefetched_layers(options, layers: int) -> int | None:
    """Layers gathered ahead of the current one (None: no option given)."""
    depth = getattr(options, "prefetch_layers", None)
    limit = getattr(options, "limit_all_gathers", None)
    if depth is None and limit is None:
        return None
    n = depth if depth is not None else (1 if limit else layers - 1)
    return min(n, max(layers - 1, 0))


def fsdp_prefetch_terms(options, layer: float, layers: int, gathered_bytes) -> list[MemoryTerm]:
    n = prefetched_layers(options, layers)
    if not n:
        return []
    how = (f"prefetch_layers={options.prefetch_layers}" if options.prefetch_layers is not None
           else f"limit_all_gathers={options.limit_all_gathers}")
    return [MemoryTerm(
        component=COMMUNICATION_BUFFERS, label=f"FSDP prefetched parameters ({n} layer{'s' if n != 1 else ''} ahead)",
        nbytes=n * layer * gathered_bytes, phases=(FORWARD, BACKWARD),
        formula=f"{n} x {_fmt(layer)} params of one layer x {gathered_bytes} B ({how}; at most the rank's other "
                f"{max(layers - 1, 0)} layers)")]


def fsdp_note(rule: str, options) -> tuple[str, ...]:
    if prefetched_layers(options, 2) is None:
        return ()
    return (f"{rule}: all-gather limit given ({'prefetch_layers' if options.prefetch_layers is not None else 'limit_all_gathers'}"
            "): the prefetched layers are priced by the measured profile (the reference has no per-layer gather); "
            "unvalidated (the CPU harness's FSDP2 gathers one layer at a time)",)

