"""Shared by the three checkpointing plugins (a helper, not a plugin).

Korthikanti et al. 2023 (Sec. 4.1, Table 2) count activation bytes per transformer layer
for 16-bit activations: 34*s*b*h without recomputation of the attention core (plus
5*a*s^2*b for materialised attention scores), 2*s*b*h when only the layer input is kept.
The reference model scales these by (bytes per value / 2) for other precisions, keeps
one micro-batch for the layers of one pipeline stage, and divides by t with sequence
parallelism.
"""

from mlsysim_core import ACTIVATIONS, BACKWARD, FORWARD, MemoryTerm

from . import _memo
from ._fmt import shard
from ._memo import memoize

_BY_OBJECTS: dict = {}   # (ids of plan and placement, per_token, score_bytes, label) -> (plan, placement, term)


def activation_terms(plan, placement, per_token, score_bytes, label):
    """``layers x (per_token*s*b*h + score_bytes*a*s^2*b) x bytes/2``, divided by tp with SP."""
    if _memo.ENABLED:
        # Plans and placements are frozen and the solver reuses them for repeated inputs: the
        # same two objects give the same numbers, so the term is found without reading them.
        key = (id(plan), id(placement), per_token, score_bytes, label)
        hit = _BY_OBJECTS.get(key)
        if hit is not None and hit[0] is plan and hit[1] is placement:
            return [hit[2]]
    heads = plan.model.heads if score_bytes else None
    term = activation_term(per_token, score_bytes, heads, placement.layers_per_stage, plan.seq_len,
                           plan.microbatch, plan.hidden_dim, plan.bytes_per_value,
                           placement.activation_shards, plan.hidden_dim_note, label)
    if _memo.ENABLED:
        if len(_BY_OBJECTS) >= _memo.CACHE_SIZE:
            _BY_OBJECTS.clear()
        _BY_OBJECTS[key] = (plan, placement, term)   # holds both: their ids are not reused meanwhile
    return [term]


@memoize
def activation_term(per_token, score_bytes, a, layers, s, mb, h, b, shards, note, label):
    scale = b / 2
    # The reference's order of operations, for bit-exact parity.
    if score_bytes:
        per_layer = (per_token * s * mb * h + score_bytes * a * s * s * mb) * scale
        what = f"{per_token}*s*b*h + {score_bytes}*a*s^2*b, a={a}"
    else:
        per_layer = per_token * s * mb * h * scale
        what = f"{per_token}*s*b*h"
    return MemoryTerm(
        component=ACTIVATIONS, label=label, nbytes=layers * per_layer / shards, phases=(FORWARD, BACKWARD),
        formula=(f"{layers} layers x ({what}) x {b}/2 B with s={s}, b={mb}, h={h}{note}"
                 + shard(shards, "sequence parallel over tp")))
