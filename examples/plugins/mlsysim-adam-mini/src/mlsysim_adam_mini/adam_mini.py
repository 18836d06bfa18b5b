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

Measured grade (``measured_state_terms``, for the ``measured`` profile): what the real
``adam_mini.Adam_mini`` 1.1.1 keeps, checked to the byte against PyTorch
(``validation/examples/``): m and one v per block in the regime's state dtype (the
parameters' dtype: no fp32 copy of its own), the regime's master copy only if it has one,
no step tensors (Python ints), and the temporaries of its step, a Python loop over the
tensors whatever ``optimizer_impl`` says. Exact for Llama-style module names; other
families (GPT-2's fused ``c_attn``, mixture-of-experts, a plugin's family) and LoRA are
refused by name (``NotModelledError``: the CLI then answers with the reference profile
and says why).
"""

from mlsysim_core import (OPTIMIZER_STATE, OPTIMIZER_STEP, InvalidInputError, MemoryTerm,
                          NotModelledError, OptimizerSpec, hookimpl)

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


# --- measured grade -----------------------------------------------------------------------
#
# The measured profile's building blocks (mlsysim_plugins.measured, the profile's plugin API)
# are imported on first use, so a reference-grade solve never loads them.

def _measured():
    from mlsysim_plugins.measured import optimizers, shapes
    return optimizers, shapes


def _refuse(plan, what: str, detail: str):
    raise NotModelledError(
        "optimizer", NAME,
        f"a run whose Adam-mini state the measured profile can derive ({what})",
        detail + "; profile='reference' counts Adam-mini's blocks by the paper's partition")


def measured_tensors(plan) -> tuple[tuple[str, int, int], ...]:
    """(kind, elements n_i, second-moment blocks r_i) of every parameter tensor, in the
    order ``model.named_parameters()`` gives them, which is the order Adam-mini 1.1.1's
    step walks: the embedding (one block per row), per layer q (per head), k (per KV head),
    v, o, gate, up, down (per output row) and the two norms (one block each), the final
    norm, the LM head (per row; absent if tied). Refuses (``NotModelledError``) what its
    name matching is not known for: a family other than the built-in Llama one (GPT-2's
    fused ``c_attn``, mixture-of-experts, a plugin's family) and LoRA adapters."""
    _optimizers, shapes = _measured()
    if plan.profile_options.lora is not None:
        _refuse(plan, "no LoRA", "Adam-mini's partition of LoRA adapters (lora_A/lora_B inside q_proj, ...) "
                                 "is not modelled")
    shape = shapes.shape_of(plan)
    family = shape.family
    if family.name != "llama":
        _refuse(plan, "Llama-style module names",
                f"model {plan.model.name!r} is costed as {family.display}-style layers (family {family.name!r}): "
                "Adam-mini 1.1.1 partitions by parameter name (q_proj/k_proj per head; embed, lm_head, v_proj, "
                "o_proj, mlp per output row; anything else one block per tensor), and which of its names this "
                "family's parameters match is not modelled"
                + (" (routed experts)" if shape.experts else ""))
    h, q, kv, f, V = shape.hidden, shape.q_dim, shape.kv_dim, shape.ffn, shape.vocab
    layer = (("query", h * q, shape.heads), ("key", h * kv, shape.kv_heads), ("value", h * kv, kv),
             ("attention output", q * h, h), ("mlp", h * f, f), ("mlp", h * f, f), ("mlp", f * h, h),
             ("norms", h, 1), ("norms", h, 1))
    tensors = (("embedding", V * h, V),) + layer * shape.layers + (("norms", h, 1),)
    tensors += () if shape.tied else (("output", V * h, V),)
    if tuple(n for _, n, _ in tensors) != shape.parameter_tensors():
        _refuse(plan, "parameter tensors in Llama's order",
                f"family {family.name!r} registers tensors Adam-mini's walk here does not list")
    return tensors


def step_peak(tensors) -> tuple[int, int]:
    """(elements, index of the tensor) of the largest step temporaries of Adam-mini 1.1.1's
    loop. For tensor i: ``grad*grad`` (n_i, freed after ``mean``), ``tmp_lr``, ``h`` and
    ``stepsize`` (r_i each), ``update = m*stepsize`` and ``-update`` (n_i each); the previous
    tensor's locals stay bound until re-assigned. Alive together, the largest of:
    2 n_i + 3 r_i (at ``-update``), n_(i-1) + n_i + 3 r_i (at ``update``, the previous one not
    yet released) and n_(i-1) + 3 r_(i-1) + n_i + r_i (at ``mean``, the previous tensor's
    locals still bound)."""
    worst, at = 0, 0
    previous_n = previous_r = 0
    for i, (_kind, n, r) in enumerate(tensors):
        alive = max(2 * n + 3 * r, previous_n + n + 3 * r, previous_n + 3 * previous_r + n + r)
        if alive > worst:
            worst, at = alive, i
        previous_n, previous_r = n, r
    return worst, at


def measured_state_terms(plan, placement, options):
    """Adam-mini 1.1.1 under a measured-grade profile (see the module docstring)."""
    optimizers, shapes = _measured()
    tensors = measured_tensors(plan)
    regime = plan.profile_options.regime
    b = regime.state
    shards = placement.optimizer_state_shards
    params = placement.trainable_parameters_per_rank / shards
    share = optimizers.tensor_share(plan, placement)
    counts = dict.fromkeys(("embedding", "output", "query", "key", "value", "attention output", "mlp", "norms"), 0)
    for kind, _n, r in tensors:
        counts[kind] += r
    blocks = sum(counts.values())
    kinds = " + ".join(f"{kind} {count:,}" for kind, count in counts.items() if count)
    split = f" x {share:.6g} (this rank's share of the tensors)" if share != 1 else ""
    shape = shapes.shape_of(plan)
    notes = []
    if shape.q_dim != shape.hidden:
        notes.append(f"approximation: q and k counted per head; Adam-mini 1.1.1 views them in rows of "
                     f"dim^2/n_heads elements, which are heads only when heads x head_dim = hidden "
                     f"({shape.heads} x {shape.head_dim} != {shape.hidden})")
    architecture = (plan.model.architecture or "").lower()
    missing = shape.family.approximation(architecture) if architecture else None
    if missing is not None:
        notes.append(f"approximation: architecture {plan.model.architecture!r} costed with Llama's module names"
                     + (f" ({missing} not modelled)" if missing else ""))
    if b != 4:
        notes.append(f"m and v in the {regime.name} state dtype ({b} B); measured in fp32 only")
    said = "".join(f"; {note}" for note in notes)
    worst, at = step_peak(tensors)
    kind, n, r = tensors[at]
    return [
        *optimizers.master_terms(plan, placement),
        MemoryTerm(component=OPTIMIZER_STATE, label=f"adam-mini first moment m ({regime.name}, {b} B)",
                   nbytes=params * b,
                   formula=f"{params:,.0f} trainable params/rank x {b} B (zeros_like the parameter; no master "
                           f"copy of its own, no step tensors: Python ints){said}"),
        MemoryTerm(component=OPTIMIZER_STATE, label=f"adam-mini second moment v ({b} B, one per block)",
                   nbytes=blocks * share * b,
                   formula=f"{b} B x {blocks:,} blocks ({kinds}){split}{said}"),
        MemoryTerm(component=OPTIMIZER_STATE, label="adam-mini step temporaries (per-tensor loop)",
                   nbytes=worst * share * b, phases=(OPTIMIZER_STEP,),
                   formula=f"Adam-mini's step is a Python loop over the tensors whatever optimizer_impl says "
                           f"(optimizer_impl={plan.profile_options.optimizer_impl!r} changes nothing): max over "
                           f"tensors of "
                           f"max(2 n_i + 3 r_i, n_(i-1) + n_i + 3 r_i, n_(i-1) + 3 r_(i-1) + n_i + r_i) = "
                           f"{worst:,} elements (tensor #{at}, {kind}: n = {n:,}, r = {r:,}){split} x {b} B"),
    ]


# --- reference grade ----------------------------------------------------------------------

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
                          description="Adam-mini: fp32 master + m per param, one fp32 v per block",
                          extensions={"measured.state_terms": measured_state_terms})]
