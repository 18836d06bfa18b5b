"""Shared by the three checkpointing plugins (a helper, not a plugin).

Korthikanti et al. 2023 (Sec. 4.1, Table 2) count activation bytes per transformer layer
for 16-bit activations: 34*s*b*h without recomputation of the attention core (plus
5*a*s^2*b for materialised attention scores), 2*s*b*h when only the layer input is kept.
The reference model scales these by (bytes per value / 2) for other precisions, keeps
one micro-batch for the layers of one pipeline stage, and divides by t with sequence
parallelism.
"""

from mlsysim_core import ACTIVATIONS, BACKWARD, FORWARD, MemoryTerm

from ._fmt import shard
from mlsysim_core.memo import memoize


def activation_terms(plan, placement, per_token, score_bytes, label):
    """``layers x (per_token*s*b*h + score_bytes*a*s^2*b) x bytes/2``, divided by tp with SP."""
    heads = plan.model.heads if score_bytes else None
    return [activation_term(per_token, score_bytes, heads, placement.layers_per_stage, plan.seq_len,
                            plan.microbatch, plan.hidden_dim, plan.bytes_per_value,
                            placement.activation_shards, plan.hidden_dim_note, label)]


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
