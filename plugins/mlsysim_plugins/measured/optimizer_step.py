"""What an optimizer declares about its state and its step (``OptimizerSpec.step``, plugin API 2.3).

The measured profile's techniques that move or split the optimizer step (``optimizer_in_backward``:
one optimizer per parameter, stepped inside the backward; ``offload="torchao"``: torchao's
CPUOffloadOptimizer wrapping it) read this declaration from the selected spec, never the
optimizer's name: a third-party optimizer that declares what ``adamw`` declares gets ``adamw``'s
bytes. This module is light (attrs only): optimizer plugins import it when they register.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from ._cache import same_object_first

OPTIMIZER_IN_BACKWARD = "optimizer_in_backward"
TORCHAO_OFFLOAD = "torchao_offload"
TECHNIQUES = (OPTIMIZER_IN_BACKWARD, TORCHAO_OFFLOAD)


def _techniques(value) -> tuple[str, ...]:
    value = tuple(value)
    for t in value:
        if t not in TECHNIQUES:
            raise ValueError(f"OptimizerStep: technique {t!r}; expected one of {TECHNIQUES}")
    return value


def _reasons(value) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), str(v)) for k, v in items))


@same_object_first
@attrs.frozen(kw_only=True)
class OptimizerStep:
    """An optimizer's state and step, as it declares them.

    ``moments``: parameter-shaped buffers kept in the regime's state dtype (Adam 2, Lion and SGD
    with momentum 1, SGD 0; None: a state that is not parameter-shaped, quantized or factored);
    ``step_counters``: one 4-byte fp32 ``step`` tensor per parameter tensor (torch's Adam).

    The step's temporaries, in units of a parameter tensor's elements in the state dtype, per
    implementation (``optimizer_impl``; ``optimizers.step_transient`` takes the same numbers):
    ``foreach`` (the multi-tensor step: per tensor it steps), ``loop_current`` and
    ``loop_previous`` (the for-loop: the tensor being stepped, and the previous tensor's last
    temporary, still bound to the loop variable); ``fused`` keeps none.

    ``quantization_maps``: bytes one optimizer instance allocates once it holds a tensor of at
    least ``quantized_from`` elements (bitsandbytes' 8-bit: two 256-entry fp32 maps), which one
    optimizer per parameter repeats.

    ``quantized_moments``: what a low-bit optimizer quantizes, shown as its numerical caveat
    (``"8-bit"``: block-quantized 8-bit moments; ``""``: full precision, the default); its update
    then moves ``moment_traffic`` bytes per parameter reading and writing both moments (a fused
    fp32 AdamW: 16) and realizes ``step_realized`` bytes per quantized element in temporaries that
    it writes and reads back (torchao's compiled step; 0 for one fused kernel). ``fit techniques``
    prices a low-bit optimizer from these, never from its name.

    ``update``: the update rule it computes, whatever its states' precision (``"adam"``: Adam and
    AdamW, full precision or low-bit; ``""``: not declared, the default). ``fit techniques`` offers
    a low-bit optimizer in place of the run's when the run's declares the update the low-bit one
    declares and quantizes none of its moments.

    ``not_offered``: why ``fit techniques`` does not offer it, a low-bit optimizer (quantized moments
    and an update), in place of a full-precision one of its update (``""``: offered, the default): a
    variant of one it offers (a framework's setup of it, paged states whose paging is not priced).

    ``measured_with``: the techniques measured with it (``"optimizer_in_backward"``,
    ``"torchao_offload"``); ``refused``: technique -> why it is not, said when it is refused.
    """

    moments: int | None = None
    step_counters: bool = False
    foreach: int = 0
    loop_current: int = 0
    loop_previous: int = 0
    quantization_maps: int = 0
    quantized_from: int = 4096
    quantized_moments: str = ""
    moment_traffic: float = 16.0
    step_realized: int = 0
    update: str = ""
    not_offered: str = ""
    measured_with: tuple[str, ...] = attrs.field(default=(), converter=_techniques)
    refused: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_reasons)

    def temporaries(self, implementation: str) -> int:
        """One tensor stepped alone (an optimizer per parameter): foreach's temporaries, the
        for-loop's of the current tensor (no previous one), none when fused."""
        return {"foreach": self.foreach, "for-loop": self.loop_current}.get(implementation, 0)

    def why_not(self, technique: str) -> str | None:
        """Why ``technique`` is refused with this optimizer (its own reason, else a general one),
        or None when it is measured with it."""
        if technique in self.measured_with:
            return None
        return dict(self.refused).get(technique)


def step_of(spec) -> OptimizerStep | None:
    """The declaration of an ``OptimizerSpec`` (None: it declares none)."""
    step = getattr(spec, "step", None)
    return step if isinstance(step, OptimizerStep) else None


def measured_with(spec, technique: str) -> bool:
    """Does ``spec`` declare ``technique`` measured with it?"""
    step = step_of(spec)
    return step is not None and technique in step.measured_with
