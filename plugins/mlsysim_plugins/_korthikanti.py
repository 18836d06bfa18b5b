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


def activation_term(plan, placement, per_layer, per_layer_formula, label):
    layers = placement.layers_per_stage
    nbytes = layers * per_layer / placement.activation_shards
    s, mb, h = plan.seq_len, plan.microbatch, plan.hidden_dim
    return MemoryTerm(
        component=ACTIVATIONS, label=label, nbytes=nbytes, phases=(FORWARD, BACKWARD),
        formula=(f"{layers} layers x ({per_layer_formula}) x {plan.bytes_per_value}/2 B"
                 f" with s={s}, b={mb}, h={h}{plan.hidden_dim_note}"
                 + shard(placement.activation_shards, "sequence parallel over tp")))
