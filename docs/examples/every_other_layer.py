"""Checkpoint every other decoder layer: half the layers keep everything they save for
backward, the other half only their input (recomputed in the backward).
Select it with activation_checkpointing="myorg.every-other"."""

from mlsysim_core import ACTIVATIONS, BACKWARD, FORWARD, CheckpointingSpec, MemoryTerm, hookimpl
from mlsysim_plugins.measured import model


def activation_terms(plan, placement, options):
    """Reference grade (Korthikanti et al.): a kept layer 34sbh + 5as^2b, a checkpointed one
    2sbh, in fp16 units scaled to the precision."""
    s, b, h, a = plan.seq_len, plan.microbatch, plan.hidden_dim, plan.model.heads
    layers = placement.layers_per_stage
    kept = layers // 2
    scale = plan.bytes_per_value / 2 / placement.activation_shards
    nbytes = (kept * (34 * s * b * h + 5 * a * s * s * b) + (layers - kept) * 2 * s * b * h) * scale
    return [MemoryTerm(component=ACTIVATIONS, label="every other layer checkpointed", nbytes=nbytes,
                       phases=(FORWARD, BACKWARD),
                       formula=f"{kept} layers x (34sbh + 5as^2b) + {layers - kept} layers x 2sbh")]


def measured_activation_terms(plan, placement, options):
    """Measured grade: the profile's decoder-layer accounting with half the layers kept."""
    return model.layer_terms(plan, placement, kept_layers=placement.layers_per_stage // 2)


@hookimpl
def mlsysim_checkpointing_strategies():
    return [CheckpointingSpec(name="myorg.every-other", requires_heads=True,
                              description="checkpoint every other layer",
                              recomputes="part",     # some of the layers (layer 0 kept whole)
                              activation_terms=activation_terms,
                              extensions={"measured.activation_terms": measured_activation_terms})]
