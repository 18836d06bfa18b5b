"""The tensor shapes the measured-grade profile needs, read from a workload.

Activations, AMP weight copies and optimizer transients depend on shapes, not only on the
parameter count: hidden size, heads, KV heads, MLP width, vocabulary, experts, whether the
embeddings are tied, and the order of parameter tensors (a for-loop optimizer step's
temporaries follow it). ``ModelShape.of(model)`` derives them once per workload.
"""

from __future__ import annotations


import attrs

from mlsysim_core.memo import memoize

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.types import TransformerWorkload

# Architectures built like GPT-2: LayerNorm with biases, fused qkv, learned positions,
# a plain (not gated) tanh-GELU MLP. Anything else with a gated MLP is built like Llama.
GPT2_LIKE = frozenset({"gpt2", "gpt3", "gpt_neox", "falcon", "olmo", "opt", "bert"})


@attrs.frozen(kw_only=True)
class ModelShape:
    style: str                 # "llama" | "gpt2" | "mixtral"
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
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def embedding_parameters(self) -> int:
        return self.vocab * self.hidden

    def layer_matrices(self) -> tuple[tuple[str, int], ...]:
        """One decoder layer's weight matrices in registration order: (name, elements)."""
        h, f = self.hidden, self.ffn
        if self.style == "gpt2":
            return (("c_attn", 3 * h * h), ("attn.c_proj", h * h), ("c_fc", h * f), ("mlp.c_proj", f * h))
        attention = (("q_proj", h * self.q_dim), ("k_proj", h * self.kv_dim), ("v_proj", h * self.kv_dim),
                     ("o_proj", self.q_dim * h))
        if self.style == "mixtral":
            e = self.experts
            return attention + (("router", e * h), ("experts.gate_up", e * 2 * f * h), ("experts.down", e * h * f))
        return attention + (("gate_proj", h * f), ("up_proj", h * f), ("down_proj", f * h))

    def autocast_matmul_parameters(self) -> int:
        """Weights autocast copies to 16 bits: every nn.Linear of the decoder layers (GPT-2's
        Conv1D biases too) and the LM head (tied or not). Not the embedding lookup or norms, not
        transformers' grouped-mm experts (they run in the weights' own dtype)."""
        per_layer = sum(n for name, n in self.layer_matrices() if not name.startswith("experts."))
        if self.style == "gpt2":   # autocast casts the Conv1D biases too (3h, h, f, h)
            per_layer += 5 * self.hidden + self.ffn
        return self.layers * per_layer + self.embedding_parameters

    def parameter_tensors(self) -> tuple[int, ...]:
        """Element counts of every parameter tensor, in the order the model registers them
        (what a for-loop optimizer step walks through)."""
        h = self.hidden
        if self.style == "gpt2":
            f = self.ffn
            block = (h, h, 3 * h * h, 3 * h, h * h, h, h, h, h * f, f, f * h, h)   # ln_1, c_attn, c_proj, ln_2, mlp
            head = (self.embedding_parameters, self.learned_positions * h)
            return head + block * self.layers + (h, h)
        block = tuple(n for _, n in self.layer_matrices()) + (h, h)                 # + the two RMSNorms
        tail = (h,) if self.tied else (h, self.embedding_parameters)
        return (self.embedding_parameters,) + block * self.layers + tail

    @property
    def tensor_count(self) -> int:
        return len(self.parameter_tensors())

    @property
    def rope_buffer_bytes(self) -> int:
        """RoPE's inv_freq and original_inv_freq buffers (fp32), none for learned positions."""
        return 0 if self.style == "gpt2" else 2 * 4 * (self.head_dim // 2)

    @classmethod
    def of(cls, model: TransformerWorkload) -> "ModelShape":
        return _shape_of(model)


@memoize
def _shape_of(model: TransformerWorkload) -> ModelShape:
    missing = [name for name in ("hidden_dim", "heads", "vocab_size") if getattr(model, name) is None]
    if missing:
        raise NotModelledError(
            f"model.{missing[0]}", None,
            "a value: the measured profile derives activations from the model's shapes "
            f"({', '.join(missing)} missing for {model.name!r})",
            "import the model from its config.json (mlsysim_core.hf.from_hf_config) or use profile='reference'")
    h, heads = model.hidden_dim, model.heads
    assumptions = []
    kv = model.kv_heads or heads
    head_dim = model.head_dim or h // heads
    architecture = (model.architecture or "").lower()
    sparse = model.is_sparse
    if sparse:
        style = "mixtral"
    elif architecture in GPT2_LIKE or model.gated_mlp is False:
        style = "gpt2"
    else:
        style = "llama"
        if model.gated_mlp is None:
            assumptions.append("gated MLP assumed (model.gated_mlp unknown)")
    ffn = (model.expert_ffn_dim if sparse and model.expert_ffn_dim else None) or model.ffn_dim
    if ffn is None:
        ffn = 4 * h
        assumptions.append(f"MLP width 4 x hidden = {ffn} assumed (model.ffn_dim unknown)")
    tied = bool(model.tied_embeddings)
    if model.tied_embeddings is None:
        assumptions.append("untied embeddings assumed (model.tied_embeddings unknown)")
    positions = (model.context_length or 1024) if style == "gpt2" else 0
    return ModelShape(
        style=style, layers=model.layers, hidden=h, heads=heads, kv_heads=kv, head_dim=head_dim, ffn=ffn,
        vocab=model.vocab_size, tied=tied, experts=model.experts if sparse else 0,
        top_k=model.active_experts_per_token if sparse else 0, parameters=model.parameters,
        learned_positions=positions, assumptions=tuple(assumptions))


# Of GPT2_LIKE, the architectures whose positions are rotary (no position table).
ROTARY_GPT2_LIKE = frozenset({"gpt_neox", "falcon", "olmo"})


def position_table_rows(model: TransformerWorkload) -> int | None:
    """The rows of a learned position table (GPT-2 style: ``context_length``, 1024 when
    unknown), the longest sequence such a model can embed; None for rotary positions (RoPE
    runs past the context length with scaling) or a model the profile cannot shape."""
    try:
        shape = _shape_of(model)
    except InvalidInputError:
        return None
    if not shape.learned_positions or (model.architecture or "").lower() in ROTARY_GPT2_LIKE:
        return None
    return shape.learned_positions


def sequence_check(model: TransformerWorkload, seq_len: int) -> tuple[str, ...]:
    """A sequence longer than a learned position table is an error naming seq_len; longer than
    a rotary model's context length, a note (it runs, with RoPE scaling)."""
    rows = position_table_rows(model)
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


def parameter_check(model: TransformerWorkload) -> tuple[str, ...]:
    """The warning notes (none, or one) about ``model.parameters`` for a measured-grade solve;
    an ``InvalidInputError`` naming ``model.parameters`` when the count cannot even hold the
    embedding and one layer its shapes describe (the profile would derive negative bytes)."""
    return _parameter_check(model)


@memoize
def _parameter_check(model: TransformerWorkload) -> tuple[str, ...]:
    shape = ModelShape.of(model)
    implied = implied_parameters(model, shape)
    declared = model.parameters
    h = shape.hidden
    one_layer = sum(n for _, n in shape.layer_matrices()) + (4 * h if shape.style == "gpt2" else 2 * h)
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
    fill = {}
    if model.is_sparse:
        if model.expert_ffn_dim is None:
            fill["expert_ffn_dim"] = shape.ffn
    elif model.ffn_dim is None:
        fill["ffn_dim"] = shape.ffn
    if model.gated_mlp is None:
        fill["gated_mlp"] = shape.style != "gpt2"
    try:
        return count_workload_parameters(model, fill).total
    except (TypeError, ValueError):     # a shape the counter does not know (e.g. MLA without its widths)
        return None


# The architectures whose layers this profile builds as they are, validated against memory
# PyTorch measured (docs/validation.md). Every other family is costed as the nearest style,
# and the result says so: what that style leaves out, per Hugging Face model_type.
MODELLED_ARCHITECTURES = frozenset({"llama", "mistral", "mixtral", "gpt2"})
NOT_MODELLED = {
    "qwen2": "the q/k/v biases",
    "qwen3": "QK-norm (its fp32 copies of q and k)",
    "qwen2_moe": "the shared expert's gate",
    "qwen3_moe": "QK-norm (its fp32 copies of q and k)",
    "gemma": "the fp32 (1+w) norms and the sqrt(hidden) embedding scale",
    "gemma2": "four norms per layer, logit soft-capping (an extra logits tensor; it forces eager "
              "attention) and sliding-window attention",
    "gemma3_text": "four norms per layer, QK-norm and sliding-window attention",
    "phi3": "the fused qkv and gate_up projections",
    "gpt3": "its alternating dense and locally banded attention",
    "gpt_neox": "the parallel residual and partial rotary embeddings",
    "falcon": "parallel attention and MLP and its attention layout",
    "olmo": "its non-parametric layer norms",
    "olmo2": "QK-norm and post-norms",
    "deepseek_v2": "dense first layers",
    "deepseek_v3": "dense first layers and group-limited routing",
}


def approximation_notes(model: TransformerWorkload) -> tuple[str, ...]:
    """What this profile approximates about ``model``, as notes for the result (nothing is
    costed as something else silently): an architecture without a model of its own, features
    it does not model (multi-head latent attention, shared experts), and the shapes it had to
    assume (``ModelShape.assumptions``)."""
    return _approximation_notes(model)


@memoize
def _approximation_notes(model: TransformerWorkload) -> tuple[str, ...]:
    shape = ModelShape.of(model)
    style = {"llama": "Llama", "gpt2": "GPT-2", "mixtral": "Mixtral"}[shape.style]
    arch = (model.architecture or "").lower()
    notes = []
    if not arch:
        notes.append(f"approximation: model.architecture is not given; costed as {style}-style layers")
    elif arch not in MODELLED_ARCHITECTURES:
        missing = NOT_MODELLED.get(arch)
        notes.append(f"approximation: architecture {model.architecture!r} has no measured-grade model of its "
                     f"own; costed as {style}-style layers"
                     + (f" ({missing} not modelled)" if missing else ""))
    if model.kv_lora_rank is not None:
        notes.append(f"approximation: model.kv_lora_rank={model.kv_lora_rank}: multi-head latent attention is "
                     f"not modelled; its attention is costed as multi-head attention ({shape.heads} heads of "
                     f"{shape.head_dim}, {shape.kv_heads} KV heads)")
    shared = getattr(model, "shared_experts", None)
    if shared:
        notes.append(f"approximation: model.shared_experts={shared}: the shared experts' activations are not "
                     "modelled (their weights, in model.parameters, are)")
    notes.extend(f"approximation: {assumed}" for assumed in shape.assumptions)
    return tuple(notes)
