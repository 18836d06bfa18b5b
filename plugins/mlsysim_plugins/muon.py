"""Muon (``torch.optim.Muon``, torch 2.13) with the standard split: Muon for the 2-D hidden
matrices, AdamW for the rest (issue 16, item 5).

``torch.optim.Muon`` accepts only 2-D parameters (``_single_tensor_muon``: "Param gradient must
be a 2D matrix"), so a run pairs it with an AdamW: optimizer ``muon`` means Muon over every 2-D
weight of the decoder layers (attention projections, MLP matrices, a MoE router) and AdamW over
the embedding, the LM head, the norms, the biases and 3-D fused expert stacks (HF's MoE experts
are one (E, r, c) tensor each, which Muon refuses).

Reference grade: fp32 master 4 B + Muon's momentum 4 B on the hidden matrices, + AdamW's two
moments 8 B on the rest.

Measured grade (torch/optim/_muon.py, measured in validation/techniques/optimizers/):

* state: one ``momentum_buffer`` per Muon matrix (``zeros_like(p.grad)``: the gradients'
  dtype, i.e. the regime's state dtype), no step tensor; AdamW's two moments and fp32 ``step``
  per tensor on the rest; a mixed regime's fp32 master copy of everything.
* step: Muon has only the single-tensor implementation (``foreach`` raises), one matrix at a
  time: ``update = grad.lerp(buf, momentum)`` (nesterov, the default: n elements in the
  gradients' dtype), then ``_zeropower_via_newtonschulz``: ``X = update.bfloat16()`` (a copy
  unless already bf16), then ``ns_steps`` = 5 quintic iterations, each ``A = X @ X.T`` (r x r, r
  = the smaller side), ``B = addmm(A, A, A)`` and ``X = addmm(X, B, X)`` in bf16. The peak is at
  the new X of an iteration: ``update`` + the current X + the new X + A + B
  = (b + 4) n + 4 r^2 bytes (b: the gradients' bytes; for bf16 gradients the first X is
  ``update`` itself, and from the second iteration on three n-sized tensors are alive anyway).
  The largest matrix sets it. Then AdamW steps the rest (``optimizer_impl``: foreach
  one temporary over all its parameters, fused none, for-loop per tensor); the step's transient
  is the larger of the two.
"""

from __future__ import annotations

from mlsysim_core import OPTIMIZER_STATE, MemoryTerm, OptimizerSpec, hookimpl
from mlsysim_core.errors import NotModelledError
from ._flat_state import flat_state_terms
from ._fmt import n
from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, OptimizerStep

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")

NS_STEPS = 5   # torch.optim._muon.DEFAULT_NS_STEPS
DESCRIPTION = ("Muon (torch.optim.Muon) on the 2-D hidden matrices + AdamW on embeddings, LM head, norms, biases "
               "and 3-D expert stacks (the standard split; Muon accepts only 2-D parameters)")


def split(plan):
    """(Muon matrices as (rows, cols) per model, AdamW tensors' elements in registration
    order): the decoder layers' 2-D non-expert weights are Muon's, everything else AdamW's."""
    if plan.profile_options.lora is not None:
        raise NotModelledError("optimizer", "muon", "an optimizer other than muon with lora",
                               "Muon's split of LoRA adapters is not modelled")
    from .measured.shapes import shape_of
    shape = shape_of(plan)
    tensors = list(shape.parameter_tensors())
    matrices = shape.matrix_shapes()
    weights = [w for w in shape.layer_weights()]
    layers = shape.layers
    head = 1 if shape.tied else 2          # the embedding first; the LM head last unless tied
    per_layer, rest = divmod(len(matrices) - 1 - (head - 1) - 1, layers) if layers else (0, 1)
    if layers == 0 or rest:
        raise NotModelledError("optimizer", "muon", "a family whose layers' parameter shapes are listed",
                               f"{shape.family.name}'s matrix shapes do not split into {layers} layers")
    block = list(matrices[1:1 + per_layer])
    muon_layer, adamw_layer = [], []
    for w in weights:
        vector = next((i for i, (r, c) in enumerate(block) if not c and r == w.elements), None)
        if w.bias or (vector is not None and not any(c and r * c == w.elements for r, c in block)):
            # 1-D (a bias, a q/k norm, attention sinks): AdamW's; its vector leaves the block
            adamw_layer.append(block.pop(vector)[0] if vector is not None else w.elements)
            continue
        if w.split == "experts":          # one (E, r, c) tensor: AdamW; its E matrices leave the block
            adamw_layer.append(w.elements)
            taken = 0
            while taken < w.elements and block:
                r, c = block.pop(0)
                taken += r * c
            continue
        at = next((i for i, (r, c) in enumerate(block) if c and r * c == w.elements), None)
        if at is None:
            raise NotModelledError("optimizer", "muon", "a family whose layers' matrix shapes are listed",
                                   f"no (rows, cols) for {shape.family.name}'s {w.name}")
        muon_layer.append(block.pop(at))
    adamw_layer += [r for r, c in block]                      # the norms (vectors)
    muon = muon_layer * layers
    muon_elements = sum(r * c for r, c in muon)
    adamw = [t for t in tensors]
    # AdamW's tensors in order: the embedding, each layer's non-Muon tensors, the tail
    ordered = [tensors[0]] + adamw_layer * layers + tensors[len(tensors) - head:]
    if sum(ordered) + muon_elements != sum(adamw):
        raise NotModelledError("optimizer", "muon", "a family whose parameter tensors are the listed shapes",
                               f"{shape.family.name}: the Muon/AdamW split does not add up to its parameters")
    return muon, ordered


def _ns_peak(rows, cols, b):
    r = min(rows, cols)
    return (b + 4) * rows * cols + 4 * r * r


def measured_state_terms(plan, placement, options):
    muon, adamw = split(plan)
    share = measured.tensor_share(plan, placement)
    b = plan.profile_options.regime.state
    m_elems, a_elems = sum(r * c for r, c in muon), sum(adamw)
    terms = [*measured.master_terms(plan, placement),
             MemoryTerm(component=OPTIMIZER_STATE, label="muon momentum buffers", phases=measured.STEADY,
                        nbytes=m_elems * b * share,
                        formula=f"{n(m_elems)} elements of {len(muon)} hidden matrices x {b} B"),
             MemoryTerm(component=OPTIMIZER_STATE, label="muon's adamw state (2 moments)", phases=measured.STEADY,
                        nbytes=2 * a_elems * b * share,
                        formula=f"{n(a_elems)} embedding/head/norm/bias/expert elements x 2 x {b} B"),
             MemoryTerm(component=OPTIMIZER_STATE, label="muon's adamw step counters", phases=measured.STEADY,
                        nbytes=round(len(adamw) * share) * 4,
                        formula=f"{len(adamw)} AdamW parameter tensors x 4 B")]
    rows, cols = max(muon, key=lambda rc: _ns_peak(*rc, b))
    ns = _ns_peak(rows, cols, b)
    impl = plan.profile_options.optimizer_impl
    if impl == "foreach":
        adam, how = a_elems * b, f"AdamW foreach: {n(a_elems)} x {b} B"
    elif impl == "fused":
        adam, how = 0, "AdamW fused: none"
    else:
        worst = max(2 * t + p for t, p in zip(adamw, [0] + adamw[:-1]))
        adam, how = worst * b, f"AdamW for-loop: max 2 n_i + n_(i-1) = {n(worst)} x {b} B"
    r = min(rows, cols)
    terms.append(MemoryTerm(
        component=OPTIMIZER_STATE, label="muon step temporaries (Newton-Schulz / AdamW)",
        phases=(measured.OPTIMIZER_STEP,), nbytes=max(ns, adam) * share,
        formula=f"max(Newton-Schulz on the largest {rows} x {cols} matrix: update {b} B + 2 bf16 X + 2 bf16 "
                f"{r} x {r} = {n(ns)} B; {how})"))
    return terms


def state_terms(plan, placement, options):
    return flat_state_terms(placement, "muon master copy + momentum / AdamW moments (fp32)", 8.0,
                            "~8-12 B (master 4 + Muon momentum 4 on hidden matrices, AdamW m + v 8 on the rest; "
                            "costed at 8)")


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None):
    """Extra step time of Muon's Newton-Schulz iterations: (seconds or None, how).

    ``_zeropower_via_newtonschulz`` (torch/optim/_muon.py) runs ``ns_steps`` = 5 iterations per
    matrix of r x c (r <= c after the transpose): ``X @ X.T`` (2 r^2 c FLOPs), ``addmm(A, A, A)``
    (2 r^3) and ``addmm(X, B, X)`` (2 r^2 c). Time = 5 x sum over Muon matrices of
    (4 r^2 c + 2 r^3) / ``hardware_flops`` (bf16 matmul FLOP/s); ``None`` without it.
    """
    muon, _ = split(plan)
    flops = NS_STEPS * sum(4 * min(r, c) ** 2 * max(r, c) + 2 * min(r, c) ** 3 for r, c in muon)
    how = f"Newton-Schulz: 5 x (4 r^2 c + 2 r^3) over {len(muon)} matrices = {flops:.3g} FLOPs / hardware FLOP/s"
    if not hardware_flops:
        return None, how + " (no FLOP/s given)"
    return flops / hardware_flops, how


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="muon", description=DESCRIPTION, state_terms=state_terms,
                          extensions={"measured.state_terms": measured_state_terms},
                          step=OptimizerStep(refused={OPTIMIZER_IN_BACKWARD: (
                              "torch.optim.Muon with its AdamW part: the Newton-Schulz step per matrix inside the "
                              "backward is not measured")}))]
