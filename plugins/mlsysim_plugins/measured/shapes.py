"""The tensor shapes the measured-grade profile needs, read from a workload.

Activations, AMP weight copies and optimizer transients depend on shapes, not only on the
parameter count: hidden size, heads, KV heads, MLP width, vocabulary, experts, whether the
embeddings are tied, and the order of parameter tensors (a for-loop optimizer step's
temporaries follow it). ``ModelShape.of(model, family)`` derives them once per workload and
architecture family (``families.py``: which layers, norms and positions the model has); the
family is the one ``prepare`` chose (``shape_of(plan)``), or the built-in one that models the
model when none is given.
"""

from __future__ import annotations


import attrs

from mlsysim_core.memo import memoize

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.types import TransformerWorkload

from .families import (BUILTIN_FAMILIES, ArchitectureFamily, LayerWeight, architecture_notes, default_family,
                       derived_matrix_shapes, derived_parameter_tensors, family_of)


@attrs.frozen(kw_only=True, cache_hash=True)
class ModelShape:
    family: ArchitectureFamily
    model: TransformerWorkload          # the workload (a family may read fields of its own workload type)
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool
    experts: int               # 0 for a dense model
    top_k: int
    parameters: int            # the workload's total
    learned_positions: int     # context length of a learned position table (GPT-2), else 0
    assumptions: tuple[str, ...] = ()

    @property
    def style(self) -> str:
        """The family's name (what this field was called before families were objects)."""
        return self.family.name

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    def layer_weights(self) -> tuple[LayerWeight, ...]:
        """One decoder layer's weights (matrices, then biases) in registration order, with
        how parallelism splits each and whether autocast copies it."""
        return _layer_weights(self)

    def layer_matrices(self) -> tuple[tuple[str, int], ...]:
        """One decoder layer's weight matrices in registration order: (name, elements)."""
        return tuple((w.name, w.elements) for w in self.layer_weights() if not w.bias)

    @property
    def layer_norm_parameters(self) -> int:
        """One decoder layer's norm parameters."""
        return self.family.layer_norms * self.family.norm.parameters * self.hidden

    def layer_parameters(self) -> int:
        """One decoder layer's matrices and norms."""
        return sum(n for _, n in self.layer_matrices()) + self.layer_norm_parameters

    def autocast_matmul_parameters(self) -> int:
        """Weights autocast copies to 16 bits: every nn.Linear of the decoder layers (GPT-2's
        Conv1D biases too) and the LM head (tied or not). Not the embedding lookup or norms, not
        transformers' grouped-mm experts (they run in the weights' own dtype)."""
        per_layer = sum(w.elements for w in self.layer_weights() if w.autocast)
        return self.layers * per_layer + self.embedding_parameters

    def parameter_tensors(self) -> tuple[int, ...]:
        """Element counts of every parameter tensor, in the order the model registers them
        (what a for-loop optimizer step walks through)."""
        given = self.family.parameter_tensors
        return tuple(derived_parameter_tensors(self) if given is None else given(self))

    def matrix_shapes(self) -> list[tuple[int, int]]:
        """(rows, cols) of every parameter tensor, cols 0 for vectors (factored optimizers)."""
        given = self.family.matrix_shapes
        return list(derived_matrix_shapes(self) if given is None else given(self))

    @property
    def tensor_count(self) -> int:
        return len(self.parameter_tensors())

    @property
    def rope_buffer_bytes(self) -> int:
        """RoPE's inv_freq and original_inv_freq buffers (fp32), none for other positions."""
        return 2 * 4 * (self.rotary_dim // 2) if self.family.positions == "rotary" else 0

    @property
    def rotary_dim(self) -> int:
        """The head dimensions rotary embeddings rotate (partial rotary: a fraction of them)."""
        return int(self.head_dim * self.family.rotary_fraction)

    @classmethod
    def of(cls, model: TransformerWorkload, family: ArchitectureFamily | None = None) -> "ModelShape":
        """``model``'s shapes as ``family`` builds its layers (the built-in family that
        models it when None)."""
        return _shape_of(model, default_family(model) if family is None else family)


@memoize
def _layer_weights(shape: ModelShape) -> tuple[LayerWeight, ...]:
    return tuple(shape.family.layer_weights(hidden=shape.hidden, q_dim=shape.q_dim, kv_dim=shape.kv_dim,
                                            ffn=shape.ffn, experts=shape.experts, model=shape.model))


def shape_of(plan) -> ModelShape:
    """The shapes of a plan's model, as the family ``prepare`` chose builds them."""
    return ModelShape.of(plan.model, family_of(plan))


@memoize
def _shape_of(model: TransformerWorkload, family: ArchitectureFamily) -> ModelShape:
    missing = [name for name in ("hidden_dim", "heads", "vocab_size") if getattr(model, name) is None]
    if missing:
        raise NotModelledError(
            f"model.{missing[0]}", None,
            "a value: the measured profile derives activations from the model's shapes "
            f"({', '.join(missing)} missing for {model.name!r})",
            "import the model from its config.json (mlsysim_core.hf.from_hf_config) or use profile='reference'")
    h, heads = model.hidden_dim, model.heads
    assumptions = list(family.assumptions(model)) if family.assumptions is not None else []
    kv = model.kv_heads or heads
    head_dim = model.head_dim or h // heads
    sparse = model.is_sparse
    ffn = (model.expert_ffn_dim if sparse and model.expert_ffn_dim else None) or model.ffn_dim
    if ffn is None:
        ffn = 4 * h
        assumptions.append(f"MLP width 4 x hidden = {ffn} assumed (model.ffn_dim unknown)")
    tied = bool(model.tied_embeddings)
    if model.tied_embeddings is None:
        assumptions.append("untied embeddings assumed (model.tied_embeddings unknown)")
    positions = (model.context_length or 1024) if family.positions == "learned" else 0
    return ModelShape(
        family=family, model=model, layers=model.layers, hidden=h, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn,
        vocab=model.vocab_size, tied=tied, experts=model.experts if sparse else 0,
        top_k=model.active_experts_per_token if sparse else 0, parameters=model.parameters,
        learned_positions=positions, assumptions=tuple(assumptions))


def position_table_rows(model: TransformerWorkload, family: ArchitectureFamily | None = None) -> int | None:
    """The rows of a learned position table (GPT-2 style: ``context_length``, 1024 when
    unknown), the longest sequence such a model can embed; None for rotary positions (RoPE
    runs past the context length with scaling; also for the architectures a family costs
    with a table though theirs are rotary) or a model the profile cannot shape."""
    try:
        shape = ModelShape.of(model, family)
    except InvalidInputError:
        return None
    if not shape.learned_positions or (model.architecture or "").lower() in shape.family.rotary_architectures:
        return None
    return shape.learned_positions


def sequence_check(model: TransformerWorkload, seq_len: int,
                   family: ArchitectureFamily | None = None) -> tuple[str, ...]:
    """A sequence longer than a learned position table is an error naming seq_len; longer than
    a rotary model's context length, a note (it runs, with RoPE scaling)."""
    rows = position_table_rows(model, family)
    if rows is not None:
        if seq_len > rows:
            raise InvalidInputError(
                "seq_len", seq_len, f"at most {rows:,}, the model's context length",
                f"{model.name!r} has learned position embeddings: its position table has {rows:,} rows and "
                "no position past them")
        return ()
    context = model.context_length
    if context is not None and seq_len > context:
        return (f"seq_len {seq_len:,} exceeds the model's context length {context:,}: training past it needs "
                "position scaling (e.g. RoPE scaling such as YaRN) or a longer-context checkpoint; the memory "
                "is estimated for the sequence asked",)
    return ()


# A declared parameter count this far from the one the shapes imply gets a warning note.
PARAMETER_TOLERANCE = 0.05


def parameter_check(model: TransformerWorkload, family: ArchitectureFamily | None = None) -> tuple[str, ...]:
    """The warning notes (none, or one) about ``model.parameters`` for a measured-grade solve;
    an ``InvalidInputError`` naming ``model.parameters`` when the count cannot even hold the
    embedding and one layer its shapes describe (the profile would derive negative bytes)."""
    return _parameter_check(model, default_family(model) if family is None else family)


@memoize
def _parameter_check(model: TransformerWorkload, family: ArchitectureFamily) -> tuple[str, ...]:
    shape = ModelShape.of(model, family)
    implied = implied_parameters(model, shape)
    declared = model.parameters
    one_layer = shape.layer_parameters()
    floor = shape.embedding_parameters + one_layer
    if declared < floor:
        raise InvalidInputError(
            "model.parameters", declared,
            f"at least {floor:,}: the embedding and one of the {model.layers} layers its shapes describe"
            + (f" (the shapes imply {implied:,} in all)" if implied else ""),
            "the measured profile derives bytes from the model's shapes (hidden_dim, heads, ffn_dim, "
            "vocab_size, ...): check parameters (the TOTAL count) against them")
    if implied and abs(declared - implied) > PARAMETER_TOLERANCE * implied:
        return (f"WARNING: model.parameters = {declared:,} is {100 * (declared - implied) / implied:+.1f} % off "
                f"the {implied:,} implied by the shapes of {model.name!r} (layers, hidden_dim, heads, kv_heads, "
                f"ffn_dim, vocab_size{', experts' if model.is_sparse else ''}); the measured profile sizes "
                "weights, gradients and optimizer state from parameters and activations from the shapes, so "
                "one of them is probably wrong",)
    return ()


def implied_parameters(model: TransformerWorkload, shape: ModelShape | None = None) -> int | None:
    """The parameter count the model's shapes imply (``catalog.counting``), with what the
    measured profile assumes for unknown fields; ``None`` where it cannot be counted (MLA)."""
    from mlsysim_core.catalog.counting import count_workload_parameters
    shape = ModelShape.of(model) if shape is None else shape
    if shape.family.count_parameters is not None:
        return shape.family.count_parameters(model)
    fill = {}
    if model.is_sparse:
        if model.expert_ffn_dim is None:
            fill["expert_ffn_dim"] = shape.ffn
    elif model.ffn_dim is None:
        fill["ffn_dim"] = shape.ffn
    if model.gated_mlp is None:
        fill["gated_mlp"] = shape.family.gated_mlp
    try:
        return count_workload_parameters(model, fill).total
    except (TypeError, ValueError):     # a shape the counter does not know (e.g. MLA without its widths)
        return None


# The architectures the built-in families model as they are (validated against memory PyTorch
# measured, docs/validation.md), and those they cost approximately with what they leave out,
# per Hugging Face model_type (each family's ``approximations``; notes say it for every solve).
MODELLED_ARCHITECTURES = frozenset(a for f in BUILTIN_FAMILIES.values() for a in f.architectures
                                   if f.approximation(a) is None)
NOT_MODELLED = {a: missing for f in BUILTIN_FAMILIES.values() for a, missing in f.approximations if missing}


def approximation_notes(model: TransformerWorkload, family: ArchitectureFamily | None = None,
                        families=None) -> tuple[str, ...]:
    """What this profile approximates about ``model``, as notes for the result (nothing is
    costed as something else silently): costing its architecture as ``family``'s layers
    (``families.architecture_notes``; ``families``: the registered ones, the built-ins when
    None), features it does not model (multi-head latent attention, shared experts), and
    the shapes it had to assume (``ModelShape.assumptions``)."""
    family = default_family(model) if family is None else family
    if families is None:
        return _approximation_notes(model, family)
    return architecture_notes(model, family, families) + _model_notes(model, family)


@memoize
def _approximation_notes(model: TransformerWorkload, family: ArchitectureFamily) -> tuple[str, ...]:
    return architecture_notes(model, family, BUILTIN_FAMILIES) + _model_notes(model, family)


def _model_notes(model: TransformerWorkload, family: ArchitectureFamily) -> tuple[str, ...]:
    shape = ModelShape.of(model, family)
    notes = []
    # A family that claims the architecture as it is models its attention and experts itself.
    exact = family.claims_model(model) and family.approximation((model.architecture or "").lower()) is None \
        and bool(model.architecture)
    if model.kv_lora_rank is not None and not exact:
        notes.append(f"approximation: model.kv_lora_rank={model.kv_lora_rank}: multi-head latent attention is "
                     f"not modelled; its attention is costed as multi-head attention ({shape.heads} heads of "
                     f"{shape.head_dim}, {shape.kv_heads} KV heads)")
    shared = getattr(model, "shared_experts", None)
    if shared and not exact:
        notes.append(f"approximation: model.shared_experts={shared}: the shared experts' activations are not "
                     "modelled (their weights, in model.parameters, are)")
    notes.extend(f"approximation: {assumed}" for assumed in shape.assumptions)
    return tuple(notes)
