"""Adam-mini (Zhang et al. 2024, arXiv:2406.16793) as the optimizer ``adammini.adam-mini``.

Adam-mini keeps Adam's fp32 master copy (4 B) and first moment m (4 B) for every
trainable parameter, but only ONE fp32 second moment per block of parameters. The
blocks follow the architecture (the paper's Hessian-based partition, as in the
reference implementation ``adam-mini`` 1.1):

    embedding, output layer   one block per token row       vocab_size each (output only if untied)
    query                     one block per head            heads per layer
    key                       one block per KV head         kv_heads per layer
    value                     one block per output neuron   kv_heads x head_dim per layer
    attention output          one block per output neuron   hidden_dim per layer
    MLP                       one block per output neuron   (2 if gated else 1) x ffn_dim + hidden_dim
                                                            per layer (per expert for MoE, + router rows)
    norms                     one block per norm tensor     2 per layer + the final norm

Per rank, master and m follow the trainable parameters of the rank; the block count is
split like the parameters (tp x pp x ep); all three divide by the ZeRO shards.
"""

from mlsysim_core import (OPTIMIZER_STATE, InvalidInputError, MemoryTerm, OptimizerSpec,
                          hookimpl)

NAME = "adammini.adam-mini"
MASTER_BYTES = 4      # fp32 master copy per trainable parameter
M_BYTES = 4           # fp32 first moment per trainable parameter
V_BYTES = 4           # fp32 second moment per BLOCK


def _need(model, field):
    value = getattr(model, field)
    if value is None:
        raise InvalidInputError(
            f"model.{field}", None,
            f"a known value: {NAME} derives its second-moment blocks from the architecture",
            f"model {model.name!r} does not give {field}")
    return value


def block_counts(model) -> dict[str, int]:
    """Second-moment blocks of the WHOLE model, by kind (before any sharding)."""
    if model.kv_lora_rank is not None:
        raise InvalidInputError("model.kv_lora_rank", model.kv_lora_rank,
                                f"None: {NAME} has no block partition for multi-head latent attention")
    layers = model.layers
    hidden = _need(model, "hidden_dim")
    heads = _need(model, "heads")
    vocab = _need(model, "vocab_size")
    gated = _need(model, "gated_mlp")
    tied = _need(model, "tied_embeddings")
    kv_heads = model.kv_heads or heads              # None: multi-head attention
    head_dim = model.head_dim or hidden // heads
    up_matrices = 2 if gated else 1                 # gate + up (SwiGLU) or one up projection
    if model.is_sparse:
        ffn = model.expert_ffn_dim or _need(model, "ffn_dim")
        experts = model.experts + (model.shared_experts or 0)
        mlp = experts * (up_matrices * ffn + hidden) + model.experts   # + router rows
    else:
        mlp = up_matrices * _need(model, "ffn_dim") + hidden
    return {
        "embedding": vocab,
        "output": 0 if tied else vocab,
        "query": layers * heads,
        "key": layers * kv_heads,
        "value": layers * kv_heads * head_dim,
        "attention output": layers * hidden,
        "mlp": layers * mlp,
        "norms": 2 * layers + 1,
    }


def state_terms(plan, placement, options):
    params = placement.trainable_parameters_per_rank
    shards = placement.optimizer_state_shards
    counts = block_counts(plan.model)
    blocks = sum(counts.values())
    blocks_per_rank = blocks * plan.trainable_fraction / placement.parameter_shards
    zero = f" / {shards} (optimizer state shards)" if shards != 1 else ""
    per_param = f"{params:,.0f} trainable params/rank x 4 B{zero}"
    split = "".join([
        f" x trainable fraction {plan.trainable_fraction}" if plan.trainable_fraction != 1 else "",
        f" / {placement.parameter_shards} (parameter shards)" if placement.parameter_shards != 1 else "",
    ])
    kinds = " + ".join(f"{kind} {count:,}" for kind, count in counts.items() if count)
    return [
        MemoryTerm(component=OPTIMIZER_STATE, label="adam-mini master copy (fp32)",
                   nbytes=params * MASTER_BYTES / shards, formula=per_param),
        MemoryTerm(component=OPTIMIZER_STATE, label="adam-mini first moment m (fp32)",
                   nbytes=params * M_BYTES / shards, formula=per_param),
        MemoryTerm(component=OPTIMIZER_STATE, label="adam-mini second moment v (fp32, one per block)",
                   nbytes=blocks_per_rank * V_BYTES / shards,
                   formula=f"4 B x {blocks:,} blocks ({kinds}){split}{zero}"),
    ]


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name=NAME, state_terms=state_terms,
                          description="Adam-mini: fp32 master + m per param, one fp32 v per block")]
