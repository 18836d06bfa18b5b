"""A rule's declared pairing of its overlapped collectives (issue 27 item 2: EP all-to-all overlap as an
implementation of the EP rule): under the implementation ``"batched"`` (one micro-batch's collectives
beside another micro-batch's compute), which share of each pass's calls runs beside which part of the
paired compute. Megatron-Core's combined 1F1B (``--overlap-moe-expert-parallel-comm``) pairs one
micro-batch's forward of a layer with another's backward of a layer and runs three phases, each a
communication on one stream beside a computation on the other (``TransformerLayerSchedulePlan.run``):

    comm_stream: combine_bwd       | dispatch_fwd->dispatch_bwd  | combine_fwd
    comp_stream: pre_dispatch_fwd  | mlp_bwd->mlp_bwd_dw->mlp_fwd| pre_dispatch_bwd

A rule declares its phases as ``PairedSlot``s under ``PAIRED`` in its extensions (a tuple, or a callable of
its options object); the step time (``steptime._per_layer``) hides each slot's calls behind its compute,
slot by slot, instead of all of them behind a whole layer's compute. The computes a slot names:
``"attention-block-forward"`` / ``"attention-block-backward"`` (the attention kernel and the layer's
GEMMs that are not routed: what Megatron's ``pre_dispatch_computation`` runs) and ``"mlp-block"`` (the
routed GEMMs forward and backward, weight gradients included). The memory-bound ops are counted in
neither (a slot's cover is the GEMMs and attention only: the comparison is conservative).
"""

from __future__ import annotations

import attrs

from mlsysim_plugins.steptime_hookspecs import _declared

PAIRED = "steptime.paired_overlap"
SLOT_COMPUTES = ("attention-block-forward", "mlp-block", "attention-block-backward")


@attrs.frozen(kw_only=True)
class PairedSlot:
    """One phase of a paired forward and backward: ``forward`` and ``backward``, the shares of each pass's
    calls of the rule's overlapped collectives that run in it; ``compute``, what they run beside
    (one of ``SLOT_COMPUTES``)."""
    compute: str = attrs.field(validator=attrs.validators.in_(SLOT_COMPUTES))
    forward: float = 0.0
    backward: float = 0.0


def paired(rule, options=None) -> tuple[PairedSlot, ...] | None:
    """A rule's declared pairing of its ``"batched"`` collectives (None: none declared: hidden behind the
    other micro-batch's whole layer)."""
    declared = _declared(rule, PAIRED, options)
    return None if declared is None else tuple(declared)
