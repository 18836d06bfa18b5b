"""Architecture families: how the decoder layers of a kind of model are built, as data and
callables the measured profile's physics asks, never names it compares.

An ``ArchitectureFamily`` is registered through ``mlsysim_measured_architectures``; which
one models a workload is the family's own claim (``family_for``): the family whose
``architectures`` list ``model.architecture`` (Hugging Face ``model_type``) and that fits
the model (experts or not, gated MLP or not), or whose ``claims(model)`` says so. Two
claimants are an error naming both; none, the registered family that declares itself the
``fallback`` for the model's structure (with the built-ins: with experts Mixtral; a plain MLP
GPT-2; else Llama), with a note saying so; no such family registered (``measured_families``
blocked), a ``NotModelledError`` naming the architecture. The physics reads what a family
declares (``pack_hook_copies``, ``fallback``, ``sparse``, ...), never its name or identity.

A family gives: its layer weights (``LayerWeight``: elements, how tensor/expert parallelism
splits them, whether autocast copies them), its parameter tensors in registration order,
its norm (``Norm``), its positions (rotary, a learned table, or none), the saved tensors of
one Hugging Face layer (``layer``: a walker in ``layers.py``, which asks the attention kernel
for the attention's part, in the family's ``attention_layout``), the MLP's part of a
Megatron-Core layer (``megatron_mlp``) and its LoRA walk (``lora_layer``).

This module is imported when the plugin registers (it stays light: attrs, mlsysim_core and
the pure-arithmetic ``layers``); LoRA's walkers are imported on first use.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Callable, Mapping

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import MlsysimError, NotModelledError, PluginConflictError, PluginContractError
from mlsysim_core.memo import memoize

from . import layer_ops, layers
from ._cache import same_object_first
from .kernels import FUSED_QKV, SEPARATE_QKV
from .layers import EXPERTS, REPLICATED, SPLITS, TP, LayerBytes, Part

if TYPE_CHECKING:
    from mlsysim_core.types import TransformerWorkload
    from .kernels import AttentionKernel
    from .shapes import ModelShape

HOOK = "mlsysim_measured_architectures"
POSITIONS = ("rotary", "learned", "none")


# --- what a family is made of ------------------------------------------------------------------

def _weight_split(instance, attribute, value):
    if value not in SPLITS:
        raise ValueError(f"LayerWeight.split {value!r}; expected one of {SPLITS}")


@attrs.frozen
class LayerWeight:
    """One parameter tensor of a decoder layer: ``split`` ``"tp"`` (split over the tensor-
    parallel ranks), ``"replicated"`` (whole on every one: a router, a row-parallel linear's
    bias) or ``"experts"`` (over ep x expert_tp); ``autocast``: torch.autocast casts it to
    16 bits for its matmul (grouped-mm experts run in the weights' own dtype); ``bias``: a
    linear's bias vector (``ModelShape.layer_matrices`` lists the matrices only); ``shape``: the
    matrix's (rows, cols), from which a family that gives no ``matrix_shapes`` has them derived."""

    name: str
    elements: int
    split: str = attrs.field(default=TP, validator=_weight_split, kw_only=True)
    autocast: bool = attrs.field(default=True, kw_only=True)
    bias: bool = attrs.field(default=False, kw_only=True)
    # (rows, cols) of the matrix (out, in features, as nn.Linear stores it), for the parameter
    # description a family derives from its layer weights (``matrix_shapes`` None); a bias is a
    # vector (rows its elements). None: not given (then the family gives ``matrix_shapes``).
    shape: tuple[int, int] | None = attrs.field(default=None, kw_only=True)


@attrs.frozen(kw_only=True)
class Norm:
    """A normalization layer: its parameters per hidden unit (weight, or weight and bias);
    whether it saves its input in pure 16-bit training too (LayerNorm does; RMSNorm then
    saves an fp32 copy instead, so the residual stream it reads is not kept); what the final
    norm keeps for backward in full training (``final_saved(kind, c, tokens, hidden)``) and
    under LoRA, before a frozen LM head (``lora_final_saved(kind, tokens, hidden)``), each
    as (bytes, how)."""

    name: str
    parameters: int
    saves_input_in_16bit: bool
    final_saved: Callable[[str, int, int, int], tuple]
    lora_final_saved: Callable[[str, int, int], tuple]


def _rms_final(kind, c, T, h):
    how = {"fp32": "normalized + output (fp32) + rsqrt", "bf16": "fp32 copy + normalized + output + rsqrt",
           "amp-bf16": "normalized (fp32) + bf16 copy for the LM head + rsqrt"}[kind]
    return (8 if kind != "amp-bf16" else 6) * T * h + 4 * T, how


def _rms_lora_final(kind, T, h):
    if kind == "bf16":
        return (4 * h + 4) * T, "fp32 copy of the input + rsqrt"
    return 4 * T, "rsqrt (the frozen LM head keeps no input)"


def _layer_norm_final(kind, c, T, h):
    return c * T * h + 8 * T, f"output ({c} B, saved by the LM head) + mean and rstd"


def _layer_norm_lora_final(kind, T, h):
    return 2 * (2 if kind == "bf16" else 4) * T, "mean and rstd (the frozen LM head keeps no input)"


RMS_NORM = Norm(name="RMSNorm", parameters=1, saves_input_in_16bit=False, final_saved=_rms_final,
                lora_final_saved=_rms_lora_final)
LAYER_NORM = Norm(name="LayerNorm", parameters=2, saves_input_in_16bit=True, final_saved=_layer_norm_final,
                  lora_final_saved=_layer_norm_lora_final)


def _names(value) -> tuple[str, ...]:
    return tuple(str(v).lower() for v in value)


def _pairs(value) -> tuple[tuple[str, str], ...]:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k).lower(), str(v)) for k, v in items))


def _formulas(value) -> tuple:
    items = value.items() if isinstance(value, Mapping) else value
    return tuple(sorted((str(k), f) for k, f in items))


def _one_of(choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(f"ArchitectureFamily.{attribute.name} {value!r}; expected one of {choices}")
    return check


@same_object_first
@attrs.frozen(kw_only=True, cache_hash=True)
class ArchitectureFamily:
    """How one kind of decoder-only transformer is built, for the measured profile.

    Choosing: ``architectures`` (``model.architecture`` / HF ``model_type`` values it models;
    ``approximations``: those of them it models only approximately, with what it leaves out,
    said in a note), ``claims`` (an optional dynamic claim on a model), ``sparse`` (routed
    experts) and ``gated_mlp`` (a gated MLP: such a family does not claim a model whose MLP
    is known to be plain). ``label`` names its layers in notes ("costed as Llama-style layers").

    Physics: ``layer_weights(hidden=, q_dim=, kv_dim=, ffn=, experts=)`` -> ``LayerWeight``s in
    registration order; ``parameter_tensors(shape)`` -> every parameter tensor's elements in
    registration order (what a for-loop optimizer walks); ``matrix_shapes(shape)`` -> (rows,
    cols) of every parameter tensor, cols 0 for vectors (factored optimizers); ``norm``;
    ``layer_norms`` per layer; ``positions`` (``"rotary"``, ``"learned"``: a table of
    ``context_length`` rows, or ``"none"``) and ``rotary_architectures`` (costed with a learned
    table though their own positions are rotary: no sequence cap); ``attention_layout`` (the
    kernels' formula its layers use); ``layer(attention=, hidden=, heads=, kv_heads=, head_dim=,
    ffn=, experts=, top_k=, regime=, dropout=, tokens=, seq_len=)`` -> ``LayerBytes`` of one
    Hugging Face layer in PyTorch (``attention``: the kernel's formula for ``attention_layout``);
    ``megatron_mlp(hidden=, ffn=, experts=, top_k=)`` -> the MLP's ``Part``s of a Megatron-Core
    layer; ``megatron_recompute_modules(modules, hidden=, ffn=, experts=, top_k=)`` -> the ``Part``s per token
    that Megatron-Core's selective ``recompute_modules`` (other than ``core_attn``) release from that layer,
    raising ``NotModelledError`` for a module it does not describe (None: none is described); ``lora_layer(walk, grad_in, attention)`` -> one layer under LoRA (``lora.py``), None
    where LoRA is not modelled; ``assumptions(model)`` -> what the family assumes about fields
    the model leaves unknown (notes).

    One description: ``layer_weights`` is the source; ``parameter_tensors`` and ``matrix_shapes``
    default to ``derived_parameter_tensors`` and ``derived_matrix_shapes`` (from the weights and
    their ``shape``), and every description is checked against the others and ``count_parameters``
    when the family is chosen (``check_description``). Required: ``name``, ``architectures``,
    ``layer_weights``, ``layer``; the rest has defaults (an RMSNorm, rotary, separate q/k/v
    family with its Megatron-Core MLP by structure).
    """

    name: str
    description: str = ""
    architectures: tuple[str, ...] = attrs.field(converter=_names)
    claims: Callable[[TransformerWorkload], bool] | None = None
    sparse: bool = False
    gated_mlp: bool = True
    label: str = ""
    approximations: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    norm: Norm = RMS_NORM
    layer_norms: int = 2
    positions: str = attrs.field(default="rotary", validator=_one_of(POSITIONS))
    rotary_architectures: tuple[str, ...] = attrs.field(default=(), converter=_names)
    rotary_fraction: float = 1.0     # the share of head_dim that rotary embeddings rotate (partial rotary)
    attention_layout: str = SEPARATE_QKV
    layer_weights: Callable[..., tuple[LayerWeight, ...]]
    layer: Callable[..., LayerBytes]
    # None: derived from the layer weights (``derived_parameter_tensors``, ``derived_matrix_shapes``):
    # the embedding, a learned position table, each layer's weights then its norms, the final norm,
    # the LM head unless tied; give them where the model registers its tensors otherwise.
    parameter_tensors: Callable[[ModelShape], tuple[int, ...]] | None = None
    matrix_shapes: Callable[[ModelShape], list] | None = None
    # None: the MLP's parts by structure (routed experts, a gated or a plain MLP: ``layers.megatron_*``).
    megatron_mlp: Callable[..., tuple[Part, ...]] | None = None
    # Megatron-Core's selective recompute_modules (other than core_attn): what each releases, per token.
    megatron_recompute_modules: Callable[..., tuple[Part, ...]] | None = None
    lora_layer: Callable | None = None
    # Under LoRA, the layer weights peft's ``target_modules`` cannot adapt, with why: (weight name, why).
    # Weights split over the experts (transformers 5's fused 3-D expert parameters) are excluded without
    # being listed. The other matrices of ``layer_weights`` are the linears LoRA may adapt (``lora.py``:
    # a target name selects a weight whose module name is it or ends with ``.<target>``, as peft
    # matches). ``lora_default_targets``: what LoRA adapts when no target is given (None: the linears
    # one of whose sides is the attention's q or kv width and neither the MLP's).
    lora_excluded: tuple[tuple[str, str], ...] = attrs.field(default=(), converter=_pairs)
    lora_default_targets: tuple[str, ...] | None = None
    # The model's token embedding and LM head as peft's ``modules_to_save`` names them (``lora.py``).
    embedding_module: str = "embed_tokens"
    lm_head_module: str = "lm_head"
    assumptions: Callable[[TransformerWorkload], tuple[str, ...]] | None = None
    # The exact parameter count of a model the family builds (None: the transformer counter of
    # catalog.counting), against which model.parameters is checked.
    count_parameters: Callable[[TransformerWorkload], int] | None = None
    # What the family says about one run (a plan, after its layout is checked): notes to show,
    # or a NotModelledError for what it does not model (a layout, a strategy, a regime).
    check: Callable[..., tuple[str, ...]] | None = None
    # What the family changes outside its decoder layers: ``adjust_terms(kind, plan, placement,
    # terms)`` -> the terms to use, for kind ``"weights"`` (parameters, buffers) and
    # ``"model_activations"`` (embedding, final norm, logits and loss: Gemma's soft-capped
    # logits, a scaled embedding). None: the Llama/GPT-2 model around the layers as it is.
    adjust_terms: Callable[..., list] | None = None
    # Attention formulas for a layout of the family's own (MLA, sinks, soft-capped scores), per
    # what a kernel computes (``AttentionKernel.computes``: "sdpa", "eager"): used when the chosen
    # kernel has no formula for ``attention_layout``.
    attention_layouts: tuple[tuple[str, Callable[..., tuple]], ...] = attrs.field(default=(), converter=_formulas)
    # ``pack_hook_copies(shape, tokens, seq_len)`` -> the elements a saved-tensor pack hook copies per
    # decoder layer, one copy per op that saves a tensor (``activation_offload``), in fp32 with a
    # kernel that computes SDPA, no dropout, no recompute; None: not derived (the offload counts each
    # saved tensor once, said as an approximation). Plugin API 2.3.
    pack_hook_copies: Callable[[ModelShape, int, int], int] | None = None
    # Offered as the fallback for a model no registered family claims, when its structure fits
    # (routed experts as ``sparse``; a gated MLP, or unknown, as ``gated_mlp``): Llama, GPT-2 and
    # Mixtral declare it. Plugin API 2.3.
    fallback: bool = False
    # ``op_outputs(shape, kind, kernel, seq_len)`` -> the forward ops of one layer whose outputs a
    # per-op checkpointing policy may save (``layer_ops.OpOutput``, in forward order); None: the
    # family declares none and op-sac / save-list are refused for it by name (``layer_ops``).
    op_outputs: Callable[..., tuple] | None = None

    @property
    def display(self) -> str:
        """The name notes give its layers."""
        return self.label or self.name

    def approximation(self, architecture: str) -> str | None:
        """What the family leaves out of ``architecture`` ("" when unsaid), None when it
        models it as it is."""
        for name, missing in self.approximations:
            if name == architecture:
                return missing
        return None

    def misfit(self, model: TransformerWorkload) -> str | None:
        """Why this family cannot model ``model`` whatever its architecture says, or None."""
        if bool(model.is_sparse) != self.sparse:
            return "it has routed experts" if model.is_sparse else "it has no routed experts"
        if self.gated_mlp and model.gated_mlp is False:
            return "its MLP is not gated"
        return None

    def claims_model(self, model: TransformerWorkload) -> bool:
        """Does this family model ``model``? Its ``claims``, or its ``architectures`` list the
        model's architecture and the model fits the family."""
        if self.claims is not None and self.claims(model):
            return True
        return _architecture(model) in self.architectures and self.misfit(model) is None

    def layer_bytes(self, *, kernel: AttentionKernel, device: str = "cuda", **shape_and_run) -> LayerBytes:
        """One Hugging Face layer's ``LayerBytes`` with ``kernel``'s attention (the family's own
        formula for its layout under that kernel, when the kernel has none) on ``device``."""
        return self.layer(attention=self.attention_of(kernel, device), **shape_and_run)

    def attention_of(self, kernel: AttentionKernel, device: str = "cuda") -> Callable[..., tuple]:
        """``kernel``'s attention formula for this family's layout, as a callable of keywords.
        A family's own formula (``attention_layouts``) also gets ``device`` (``"cuda"`` or
        ``"cpu"``): CPU SDPA falls back to the math kernel for layouts a GPU runs fused."""
        return _attention_of(self, kernel, device)

    def conformance_failures(self, models) -> tuple[str, ...]:
        """What the conformance kit (``mlsysim_core.testing``) reports about this family: for each of
        ``models`` (the catalog's) the family claims and can shape, where its descriptions of the
        model's parameters disagree (``description_disagreements``)."""
        from .shapes import ModelShape
        failures = []
        for model in models:
            if not self.claims_model(model):
                continue
            try:
                ModelShape.of(model, self)
            except MlsysimError:
                continue
            failures += [f"on {model.name!r}: {found}" for found in description_disagreements(self, model)]
        return tuple(failures)

    def megatron_mlp_parts(self, **shape) -> tuple[Part, ...]:
        """The MLP's parts of a Megatron-Core layer: the family's ``megatron_mlp``, else by its
        structure (routed experts, a gated MLP, a plain one)."""
        if self.megatron_mlp is not None:
            return tuple(self.megatron_mlp(**shape))
        default = (layers.megatron_moe_mlp if self.sparse else
                   layers.megatron_gated_mlp if self.gated_mlp else layers.megatron_plain_mlp)
        return default(**shape)

    def adjusted(self, kind: str, plan, placement, terms: list) -> list:
        """``terms`` as the family changes them (``adjust_terms``), else as they are; then with the run's RoPE
        storage (``rope.stored``: Hugging Face's per-forward tables, or torchtune's persistent cache)."""
        from . import rope
        terms = terms if self.adjust_terms is None else list(self.adjust_terms(kind, plan, placement, terms))
        return rope.stored(kind, plan, terms)


@memoize     # (every solve walks a layer with it)
def _attention_of(family: ArchitectureFamily, kernel: AttentionKernel, device: str) -> Callable[..., tuple]:
    if not any(name == family.attention_layout for name, _ in kernel.layouts) and kernel.computes:
        for computes, formula in family.attention_layouts:
            if computes == kernel.computes:     # what the kernel declares it computes, never its name
                return functools.partial(_own_attention, formula, device=device)
    return functools.partial(kernel.saved, family.attention_layout)


# --- what a family derives from its layer weights ------------------------------------------------------

def derived_parameter_tensors(shape: ModelShape) -> tuple[int, ...]:
    """Every parameter tensor's elements, derived from the family's layer weights (a family that
    gives no ``parameter_tensors``): the embedding, a learned position table, per layer its weights
    (matrices and biases, as ``layer_weights`` lists them) then ``layer_norms`` norms of
    ``norm.parameters`` vectors, the final norm, the LM head unless tied."""
    h, norm = shape.hidden, shape.family.norm
    head = (shape.embedding_parameters,) + ((shape.learned_positions * h,) if shape.learned_positions else ())
    block = tuple(w.elements for w in shape.layer_weights()) + (h,) * (shape.family.layer_norms * norm.parameters)
    tail = (h,) * norm.parameters + (() if shape.tied else (shape.embedding_parameters,))
    return head + block * shape.layers + tail


def derived_matrix_shapes(shape: ModelShape) -> list:
    """(rows, cols) of the tensors ``derived_parameter_tensors`` lists, from the layer weights'
    ``shape`` (a bias a vector); a layer weight without one is a ``PluginContractError`` naming the
    family (give ``LayerWeight.shape`` or the family's ``matrix_shapes``)."""
    h, V, norm = shape.hidden, shape.vocab, shape.family.norm
    block = []
    for w in shape.layer_weights():
        if w.bias:
            block.append((w.elements, 0))
        elif w.shape is None:
            raise PluginContractError(
                f"{HOOK}: architecture family {shape.family.name!r} gives no matrix_shapes and its layer weight "
                f"{w.name!r} no shape: give LayerWeight(..., shape=(rows, cols)) or ArchitectureFamily.matrix_shapes",
                hook=HOOK)
        else:
            block.append(tuple(w.shape))
    block += [(h, 0)] * (shape.family.layer_norms * norm.parameters)
    head = [(V, h)] + ([(shape.learned_positions, h)] if shape.learned_positions else [])
    return head + block * shape.layers + [(h, 0)] * norm.parameters + ([] if shape.tied else [(V, h)])


# --- one family, one description: its layer weights, parameter tensors, matrices and count agree -------

def description_disagreements(family: ArchitectureFamily, model: TransformerWorkload) -> tuple[str, ...]:
    """Where ``family``'s descriptions of ``model``'s parameters disagree, as sentences (none: they
    agree). A family describes the same tensors up to four times: its ``layer_weights`` (one decoder
    layer: elements and the tensor-parallel split), ``parameter_tensors`` (every tensor's elements,
    what the optimizers walk), ``matrix_shapes`` (what factored optimizers and Muon read) and
    ``count_parameters`` (the exact count). Checked:

    * ``matrix_shapes`` against ``parameter_tensors``: one entry per tensor (a vector, cols 0, of its
      elements; a matrix's factors no larger than it: an expert stack or a convolution is given as a
      factored optimizer factors it, over its last two dimensions), or, where a stack is listed as
      one matrix per expert, the same total;
    * ``count_parameters`` (when the family gives one) equal to the sum of ``parameter_tensors``;
    * the layer weights inside the parameter tensors: ``layers`` x (one layer's weights and norms)
      plus the embedding no more than their sum.

    (The catalog's transformer counter, used when ``count_parameters`` is None, is an approximation
    that leaves biases out: it is not compared; ``shapes.parameter_check`` warns about a model whose
    declared count is far from it.)"""
    from .shapes import ModelShape
    shape = ModelShape.of(model, family)
    tensors = tuple(shape.parameter_tensors())
    matrices = list(shape.matrix_shapes())
    total = sum(tensors)
    found = []
    if len(matrices) == len(tensors):
        for i, (n, (rows, cols)) in enumerate(zip(tensors, matrices)):
            if (rows != n) if not cols else not (0 < rows <= n and cols <= n):
                found.append(f"parameter tensor {i} has {n:,} elements but matrix_shapes gives it ({rows}, {cols})"
                             + (": a vector's rows are its elements" if not cols else ": a factor larger than it"))
                break
    else:
        listed = sum(rows * cols if cols else rows for rows, cols in matrices)
        if listed != total:
            found.append(f"matrix_shapes lists {len(matrices)} tensors of {listed:,} elements, parameter_tensors "
                         f"{len(tensors)} of {total:,}")
    try:
        counted = None if family.count_parameters is None else family.count_parameters(model)
    except (TypeError, ValueError, ArithmeticError):
        counted = None      # a model the count cannot take (a missing width): parameter_check says so
    if counted is not None:
        if counted != total:
            found.append(f"count_parameters gives {counted:,}, parameter_tensors sum to {total:,} "
                         f"({counted - total:+,})")
    inside = shape.layers * shape.layer_parameters() + shape.embedding_parameters
    if inside > total * (1 + 1e-9):
        found.append(f"its layer weights ({shape.layers} layers x {shape.layer_parameters():,} with norms) and the "
                     f"embedding ({shape.embedding_parameters:,}) come to {inside:,.0f}, more than the "
                     f"{total:,} of parameter_tensors")
    return tuple(found)


@memoize
def check_description(family: ArchitectureFamily, model: TransformerWorkload, plugin: str | None = None) -> None:
    """A ``PluginContractError`` naming ``family``, its ``plugin`` and the disagreement when its
    descriptions of ``model``'s parameters disagree (``description_disagreements``); run once per
    family and model (memoised) when ``family_for`` chooses the family."""
    from .shapes import ModelShape
    try:
        ModelShape.of(model, family)
    except MlsysimError:
        return          # a model the family cannot shape: prepare says so with its own error
    found = description_disagreements(family, model)
    if found:
        where = f"plugin {plugin}" if plugin else f"defined in {family.layer.__module__}"
        raise PluginContractError(
            f"{HOOK}: architecture family {family.name!r} ({where}) describes the parameters of {model.name!r} "
            f"inconsistently: {'; '.join(found)}", plugin=plugin, hook=HOOK)


def _own_attention(formula, *, grads=(True, True, True), **keywords) -> tuple:
    return tuple(formula(grads=grads, **keywords))


def _architecture(model) -> str:
    return (model.architecture or "").lower()


# --- Megatron-Core MoE MLPs a family may declare (``megatron_mlp``) ---------------------------------------

MEGATRON_LM = "NVIDIA/Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553"
TRANSFORMER_ENGINE = "NVIDIA/TransformerEngine d0067d0da6cb01811b8072a7d304f0e00344ce2b"


def megatron_clamped_glu_moe(*, hidden, ffn, experts, top_k, recompute_modules=()) -> tuple[Part, ...]:
    """Per token, what Megatron-Core's MoE layer keeps for the backward as Megatron-Bridge's gpt-oss recipes
    configure it (Megatron-Bridge 067f987d, ``models/gpt_oss/gpt_oss_bridge.py``, ``recipes/gpt_oss/h100/``):
    ``TEGroupedMLP`` (``moe_grouped_gemm``) with biases, ``bias_activation_fusion`` with the quick-GELU GLU
    clamped (``activation_func_clamp_value``) and offset (``glu_linear_offset``), the alltoall dispatcher with
    ``moe_permute_fusion``, the unfused softmax top-k router (``moe_router_pre_softmax=False``, no load-balancing
    loss, the logits in the input's bf16: ``moe_router_dtype`` unset), bf16, every expert on the device or
    ``experts / ep`` (two or more) on each rank of an expert-parallel group
    (source: Megatron-LM and TransformerEngine at ``MEGATRON_LM``, ``TRANSFORMER_ENGINE``). h hidden, f the
    expert FFN width, E experts, k top-k:

    * router (``moe_utils.py``): ``RouterGatingLinearFunction`` saves its input (the pre-MLP norm's output, the
      layer's "mlp input") and its parameters; ``topk`` of the logits saves its int64 indices (8k; ``scatter``
      saves the same tensor); ``softmax(dtype=float32)`` of the k values its fp32 output (4k): 12k;
    * ``moe_permute_with_probs`` (TE ``permutation.py``, mask map) saves its int32 ``row_id_map`` of
      (tokens, 2E + 1): 4(2E + 1); ``moe_unpermute`` saves the same map;
    * per routed copy: the permuted bf16 probabilities (2; saved by ``WeightedQuickGeGLUFunction`` and by
      ``_apply_bias``'s ``b * p``) and, with more than one expert on the rank, the int32 ``row_id_map`` of
      each of the two ``sort_chunks_by_idxs`` (dispatch and combine: 4 + 4), whose copies replace the
      permuted tokens;
    * the experts (``experts.py``, ``fused_bias_geglu.py``): TE's ``GroupedLinear`` keeps its input (fc1: 2h;
      fc2: the activation's output, 2f; the bias is added in fc1's GEMM); the clamps of the two halves of
      fc1's output (views) save them, so the 2 x 2f output is kept; their ``cat`` (2 x 2f) is what
      ``WeightedQuickGeGLUFunction`` saves: k(2h + 10f). fc2's biases scaled by the probabilities
      (``_apply_bias``: ``cat([t + b * p])`` in fp32, cast back) save nothing new.

    Under expert parallelism (``token_dispatcher.py``, ``MoEAlltoAllTokenDispatcher``; tp = 1) the router, the
    permutation and its map cover the rank's tokens and all E experts; "per routed copy" is per row the rank
    receives from the all-to-all (T x k when balanced: the profile's EXPERTS split and routing imbalance);
    ``_AllToAll`` (``tensor_parallel/mappings.py``) saves nothing (its ctx holds the split lists). E here is the
    model's experts, so the sorts are assumed: a caller with one expert a rank (no ``sort_chunks_by_idxs``) refuses
    that layout (``gpt_oss._megatron_check``).

    Not counted: the bf16 ``linear_offset`` scalar the activation saves (2 B a layer) and the activation's
    fp32 temporaries (``jit_fuser``: one fused kernel on a GPU). The dispatcher's held probabilities and routing
    map are not saved tensors but alive in every phase (``megatron_alltoall_held``). Measured, to the byte, with
    Megatron-Core's own router, activation and bias code (``validation/megatron_gpt_oss/measure_moe.py``).

    ``recompute_modules`` with ``"moe_act"`` (Megatron-Core's selective recompute, ``TEGroupedMLP.forward``:
    ``CheckpointWithoutOutput`` around the bias-activation function, its output discarded after fc2 and
    recomputed from a gradient hook; Megatron-Bridge's GPT-OSS 120B H100 perf recipe): the activation runs under
    ``no_grad`` and saves nothing, the checkpoint saves its inputs (fc1's output, 4f a copy; the probabilities,
    counted), fc2's input is released: k(2h + 4f), and no offset scalar. Measured, to the byte
    (``validation/megatron_gpt_oss/measure_modules.py``). Other modules change nothing here (``"layernorm"``: the
    pre-MLP norm's output, the layer's "mlp input", ``megatron_pre_mlp_norm_recomputed``)."""
    h, f, E, k = hidden, ffn, experts, top_k
    sorts = 8 if E > 1 else 0
    experts_part = (Part("experts (fc1 input, fc1 output saved by the moe_act checkpoint)", k * (2 * h + 4 * f),
                         split=EXPERTS) if "moe_act" in recompute_modules else
                    Part("experts (fc1 input, fc1 output kept by the clamps, their cat, fc2 input)",
                         k * (2 * h + 10 * f), split=EXPERTS))
    return (Part("router (top-k indices int64, fp32 softmax of the k logits)", 12 * k, split=REPLICATED),
            Part("permute row_id_map (int32, 2E + 1 per token)", 4 * (2 * E + 1), split=REPLICATED),
            Part("permuted probabilities (bf16)" + (" + chunk sorts' row_id_maps (int32)" if sorts else ""),
                 k * (2 + sorts), split=EXPERTS),
            experts_part)


MEGATRON_MODULES = ("core_attn", "layernorm", "moe_act")    # the recompute_modules the profile reads


def megatron_clamped_glu_moe_recomputed(modules, *, hidden, ffn, experts, top_k) -> tuple[Part, ...]:
    """What Megatron-Core's selective ``recompute_modules`` release per token from a gpt-oss layer
    (``ArchitectureFamily.megatron_recompute_modules``): ``layernorm`` the pre-MLP norm's output
    (``megatron_pre_mlp_norm_recomputed``, the layer's "mlp input"), ``moe_act`` the clamps' views of fc1's output,
    their cat and fc2's input, 6f a routed copy (``megatron_clamped_glu_moe`` with and without it); both measured
    (``validation/megatron_gpt_oss/measure_modules.py``). ``core_attn`` is the profile's selective recompute (the
    parts ``recomputed_by_selective``), not listed here; any other module is refused."""
    out = []
    for module in modules:
        if module == "layernorm":
            out.append(Part("pre-MLP norm output (recompute module layernorm)", megatron_pre_mlp_norm_recomputed(
                hidden=hidden), split=REPLICATED))
        elif module == "moe_act":
            kept, released = (megatron_clamped_glu_moe(hidden=hidden, ffn=ffn, experts=experts, top_k=top_k,
                                                       recompute_modules=m)[-1].nbytes for m in ((), ("moe_act",)))
            out.append(Part("experts' activation tensors (recompute module moe_act)", kept - released, split=EXPERTS))
        elif module != "core_attn":
            raise NotModelledError("plugin_options['selective'].modules", module,
                                   "core_attn, layernorm or moe_act for gpt-oss under Megatron-Core",
                                   f"Megatron-Core's recompute module {module!r} was not measured for gpt-oss's layer")
    return tuple(out)


def megatron_pre_mlp_norm_recomputed(*, hidden) -> int:
    """Bytes per token and layer that Megatron-Core's ``"layernorm"`` recompute module releases in a gpt-oss layer
    (``transformer_layer.py``: the pre-MLP ``TENorm`` through ``CheckpointWithoutOutput``, its output discarded
    after the MLP; the input norm is fused into ``linear_qkv`` with Transformer Engine, an ``IdentityOp``, not
    recomputed): the norm's bf16 output, saved by the router (the layer's "mlp input", 2h). The checkpoint saves the
    norm's input, which the norm saves anyway; its fp32 rsigma (4 B, not among the layer's counted parts) is not
    saved either. Measured: ``validation/megatron_gpt_oss/measure_modules.py``."""
    return 2 * hidden


def megatron_alltoall_held(*, experts) -> int:
    """Bytes per token and layer that Megatron-Core's alltoall dispatcher holds as attributes
    (``MoEAlltoAllTokenDispatcher.dispatch_preprocess``: ``self.probs``, the dense bf16 [T, E] routing
    probabilities, and ``self.routing_map``, [T, E] bool) until the layer's next forward replaces them: alive in
    every phase, the optimizer step included (measured: ``validation/megatron_gpt_oss/measure_moe.py``)."""
    return 3 * experts


def megatron_alltoall_map_held(*, experts) -> int:
    """Bytes per token and layer of the permute's int32 row_id_map, (tokens, 2E + 1), which the alltoall dispatcher
    also keeps as ``self.reversed_local_input_permutation_mapping`` (``dispatch_preprocess``) until the layer's next
    forward: a saved tensor (``megatron_clamped_glu_moe``) until the layer's backward, then alive through the rest
    of the backward and the optimizer step (measured: ``validation/megatron_gpt_oss/measure_moe.py``)."""
    return 4 * (2 * experts + 1)


def megatron_alltoall_counts_held(*, experts, local_experts) -> int:
    """Bytes per layer of the dispatcher's ``self.num_global_tokens_per_local_expert`` (``preprocess``: int64, the
    group's token counts for the rank's experts, [tp, ep, E / ep] with tp = 1: E entries; on one rank the [E]
    counts' view), kept on the device with ``moe_permute_fusion`` when the rank holds more than one expert, until
    the layer's next forward: alive in every phase (measured: ``validation/megatron_gpt_oss/measure_moe.py``)."""
    return 8 * experts if local_experts > 1 else 0


# --- the built-in families ---------------------------------------------------------------------------

W = LayerWeight


def _attention_weights(h, q, kv):
    return (W("q_proj", h * q, shape=(q, h)), W("k_proj", h * kv, shape=(kv, h)), W("v_proj", h * kv, shape=(kv, h)),
            W("o_proj", q * h, shape=(h, q)))


def _llama_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f = hidden, ffn
    return _attention_weights(h, q_dim, kv_dim) + (W("gate_proj", h * f, shape=(f, h)), W("up_proj", h * f, shape=(f, h)),
                                                   W("down_proj", f * h, shape=(h, f)))


def _mixtral_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    h, f, e = hidden, ffn, experts
    return _attention_weights(h, q_dim, kv_dim) + (
        W("router", e * h, split=REPLICATED),
        W("experts.gate_up", e * 2 * f * h, split=EXPERTS, autocast=False),
        W("experts.down", e * h * f, split=EXPERTS, autocast=False))


def _gpt2_weights(*, hidden, q_dim, kv_dim, ffn, experts, model=None):
    """Conv1D weights, then their biases: the column-parallel ones' (c_attn, c_fc) split with
    them, the row-parallel ones' (the two c_proj) replicated."""
    h, f, qkv = hidden, ffn, q_dim + 2 * kv_dim      # (grouped-query attention: kv_dim = kv_heads x head_dim)
    return (W("c_attn", h * qkv), W("attn.c_proj", q_dim * h), W("c_fc", h * f), W("mlp.c_proj", f * h),
            W("c_attn.bias", qkv, bias=True), W("attn.c_proj.bias", h, split=REPLICATED, bias=True),
            W("c_fc.bias", f, bias=True), W("mlp.c_proj.bias", h, split=REPLICATED, bias=True))


def _gpt2_parameter_tensors(shape):
    h, f, qkv, q = shape.hidden, shape.ffn, shape.q_dim + 2 * shape.kv_dim, shape.q_dim
    # ln_1, c_attn, c_proj, ln_2, mlp; c_attn has q + 2 kv columns (grouped-query attention: kv_heads)
    block = (h, h, h * qkv, qkv, q * h, h, h, h, h * f, f, f * h, h)
    head = (shape.embedding_parameters, shape.learned_positions * h)
    # an output layer of its own only where the model says so (Megatron's
    # --untie-embeddings-and-output-weights); GPT-2 ties it
    untied = (shape.embedding_parameters,) if shape.model.tied_embeddings is False else ()
    return head + block * shape.layers + (h, h) + untied


def _gpt2_matrix_shapes(shape):
    h, f, V, qkv, q = shape.hidden, shape.ffn, shape.vocab, shape.q_dim + 2 * shape.kv_dim, shape.q_dim
    block = [(h, 0), (h, 0), (h, qkv), (qkv, 0), (q, h), (h, 0), (h, 0), (h, 0), (h, f), (f, 0),
             (f, h), (h, 0)]
    untied = [(V, h)] if shape.model.tied_embeddings is False else []
    return [(V, h), (shape.learned_positions, h)] + block * shape.layers + [(h, 0), (h, 0)] + untied


def _rms_matrix_shapes(mlp):
    def shapes(shape):
        h, V = shape.hidden, shape.vocab
        block = [(shape.q_dim, h), (shape.kv_dim, h), (shape.kv_dim, h), (h, shape.q_dim)]
        block += mlp(shape) + [(h, 0), (h, 0)]
        out = [(V, h)] + block * shape.layers + [(h, 0)]
        return out + ([] if shape.tied else [(V, h)])
    return shapes


def _moe_mlp_shapes(shape):
    """The router, then the expert stacks (E, r, c) factored over their last two dimensions."""
    e, f, h = shape.experts, shape.ffn, shape.hidden
    return [(e, h)] + [(2 * f, h)] * e + [(h, f)] * e


def _gpt2_lora(walk, grad_in, attention):
    from .lora import gpt2_layer
    return gpt2_layer(walk, grad_in, attention)


def _llama_lora(walk, grad_in, attention):
    from .lora import llama_layer
    return llama_layer(walk, grad_in, attention)


def _llama_pack_hook_copies(shape, tokens, seq_len) -> int:
    """Llama's fp32 SDPA layer, one copy per save (``offload_activations.host_layers``): each RMSNorm
    3 T h + 2 T; q, k, v each save the normed input; RoPE cos and sin for q and for k; SDPA q, k, v,
    output, the fp32 logsumexp; o_proj its input; the MLP 2 T h + 4 T f."""
    T, h, q, kv, a, f = tokens, shape.hidden, shape.q_dim, shape.kv_dim, shape.heads, shape.ffn
    return 11 * T * h + 3 * T * q + 2 * T * kv + T * a + 4 * T + 4 * T * f + 4 * seq_len * shape.rotary_dim


def _gated_mlp_assumed(model) -> tuple[str, ...]:
    return ("gated MLP assumed (model.gated_mlp unknown)",) if model.gated_mlp is None else ()


LLAMA = ArchitectureFamily(
    name="llama", label="Llama",
    description="RMSNorm, rotary positions, separate q/k/v/o projections (GQA), gated SiLU MLP "
                "(Llama, Mistral; validated against PyTorch's MemTracker)",
    architectures=("llama", "mistral", "ministral", "ministral3"),
    # (Qwen 2/3, Gemma 1-3, Phi-3/4 and OLMo 2 have families of their own: architectures/.)
    approximations={
        "ministral": "the masks SDPA saves in its sliding-window layers when seq_len reaches the window",
        "ministral3": "the Llama-4 attention scale on q and the masks SDPA saves with a sliding window",
    },
    # its parameter tensors and matrix shapes derived from its layer weights (one description)
    norm=RMS_NORM, positions="rotary", attention_layout=SEPARATE_QKV, layer_weights=_llama_weights,
    layer=layers.llama_layer, megatron_mlp=layers.megatron_gated_mlp, lora_layer=_llama_lora,
    assumptions=_gated_mlp_assumed, pack_hook_copies=_llama_pack_hook_copies, fallback=True,
    op_outputs=layer_ops.llama_ops)

GPT2 = ArchitectureFamily(
    name="gpt2", label="GPT-2", gated_mlp=False,
    description="LayerNorm with biases, fused c_attn Conv1D with biases, learned positions, tanh-GELU MLP "
                "(GPT-2; validated against PyTorch's MemTracker)",
    architectures=("gpt2", "gpt3", "olmo", "opt", "bert"),
    # (GPT-NeoX and Falcon have families of their own: architectures/parallel_residual.py.)
    approximations={
        "gpt3": "its alternating dense and locally banded attention",
        "olmo": "its non-parametric layer norms",
        "opt": "", "bert": "",
    },
    norm=LAYER_NORM, positions="learned", rotary_architectures=("olmo",),
    attention_layout=FUSED_QKV, layer_weights=_gpt2_weights, parameter_tensors=_gpt2_parameter_tensors,
    matrix_shapes=_gpt2_matrix_shapes, layer=layers.gpt2_layer, megatron_mlp=layers.megatron_plain_mlp,
    lora_layer=_gpt2_lora, embedding_module="wte", fallback=True)

MIXTRAL = ArchitectureFamily(
    name="mixtral", label="Mixtral", sparse=True,
    description="Llama attention and a sparse MoE block of gated experts (transformers' grouped_mm) "
                "(Mixtral; validated against PyTorch's MemTracker)",
    architectures=("mixtral", "glm4_moe"),
    # (Qwen-MoE, DeepSeek and Llama 4 have families of their own: architectures/.)
    approximations={
        "glm4_moe": "its dense first layers, shared expert, sigmoid group-limited routing, partial rotary "
                    "embeddings, attention biases and QK-norm",
    },
    # its parameter tensors derived from its layer weights; the expert stacks' matrices one per expert
    norm=RMS_NORM, positions="rotary", attention_layout=SEPARATE_QKV, layer_weights=_mixtral_weights,
    matrix_shapes=_rms_matrix_shapes(_moe_mlp_shapes),
    layer=layers.mixtral_layer, megatron_mlp=layers.megatron_moe_mlp, lora_layer=_llama_lora, fallback=True,
    op_outputs=layer_ops.mixtral_ops)

# transformers 5.23's MixtralTopKRouter holds its weight as an nn.Parameter, not an nn.Linear
MIXTRAL = attrs.evolve(MIXTRAL, lora_excluded={"router": "MixtralTopKRouter holds its weight as a Parameter, not an "
                                                         "nn.Linear: peft's target_modules does not adapt it"})

BUILTIN_FAMILIES: Mapping[str, ArchitectureFamily] = {f.name: f for f in (LLAMA, GPT2, MIXTRAL)}


def _fallback(model, families: Mapping[str, ArchitectureFamily], providers) -> ArchitectureFamily:
    """Who models what no family claims: among the registered families that declare ``fallback``,
    the nearest by structure (routed experts as the model's; then a gated MLP as the model's, an
    unknown one counted as gated). With the built-ins that is Mixtral for experts, GPT-2 for a
    plain MLP, else Llama. Two equally near: a ``PluginConflictError``; none: a
    ``NotModelledError`` naming the architecture (the built-in families blocked, say)."""
    sparse, gated = bool(model.is_sparse), model.gated_mlp is not False
    fits = [f for f in families.values() if f.fallback and f.sparse == sparse]
    nearest = [f for f in fits if f.gated_mlp == gated] or fits
    if len(nearest) == 1:
        return nearest[0]
    if nearest:
        raise _conflict(model, nearest, providers, "is claimed by no architecture family, and more than one "
                        "declares itself the fallback for its structure")
    known = sorted({a for f in families.values() for a in f.architectures})
    arch = model.architecture or "(not given)"
    raise NotModelledError(
        "model.architecture", arch,
        "an architecture a registered family claims" + (f" ({', '.join(known)})" if known else ""),
        f"no registered architecture family claims {model.name!r}, and none declares itself the fallback for "
        f"a model {'with' if sparse else 'without'} routed experts (ArchitectureFamily.fallback; the built-in "
        "families, plugin measured_families, declare it: is it blocked?)")


# --- choosing ------------------------------------------------------------------------------------------

def family_for(model: TransformerWorkload, families: Mapping[str, ArchitectureFamily],
               providers: Mapping[str, str] | None = None) -> tuple[ArchitectureFamily, tuple[str, ...]]:
    """The family that models ``model`` among ``families`` (the registered ones, by name),
    and the approximation notes that choice carries (nothing is costed as something else
    silently). More than one claimant is a ``PluginConflictError`` naming them (and, from
    ``providers``, family name -> plugin name, the plugins to block); none, the nearest
    registered family that declares ``fallback`` (``_fallback``), with a note, or a
    ``NotModelledError`` when none is registered."""
    for name, f in families.items():
        if not isinstance(f, ArchitectureFamily):
            raise PluginContractError(f"{HOOK} registered {type(f).__name__} {name!r}; expected an ArchitectureFamily",
                                      plugin=(providers or {}).get(name), hook=HOOK)
    claimants = [f for f in families.values() if f.claims_model(model)]
    exact = [f for f in claimants if f.approximation(_architecture(model)) is None]
    if len(claimants) > 1 and len(exact) == 1:
        claimants = exact       # a family that models the architecture as it is beats approximations of it
    if len(claimants) > 1:
        raise _conflict(model, claimants, providers or {})
    family = claimants[0] if claimants else _fallback(model, families, providers or {})
    check_description(family, model, (providers or {}).get(family.name))    # once per family and model
    return family, architecture_notes(model, family, families)


def _conflict(model, claimants, providers, what="is claimed by more than one architecture family") \
        -> PluginConflictError:
    def who(f):
        plugin = providers.get(f.name)
        return f"{f.name!r} (" + (f"plugin {plugin}" if plugin else f"defined in {f.layer.__module__}") + ")"
    # Only third-party plugins are offered for blocking (``providers`` names no built-in: blocking
    # the built-in families would take every one of them away).
    plugins = [providers[f.name] for f in claimants if providers.get(f.name)]
    block = " or ".join(f"MLSYSIM_DISABLED_PLUGINS={p}" for p in plugins) or "MLSYSIM_DISABLED_PLUGINS=<plugin>"
    arch = model.architecture or "(not given)"
    return PluginConflictError(
        f"architecture {arch!r} of model {model.name!r} {what}: "
        f"{', '.join(who(f) for f in claimants)}. One family models an architecture: block the plugin of the "
        f"one not wanted ({block}, or --disable-plugin), or uninstall it",
        plugin=plugins[-1] if plugins else None, hook=HOOK)


def architecture_notes(model: TransformerWorkload, family: ArchitectureFamily,
                       families: Mapping[str, ArchitectureFamily] | None = None) -> tuple[str, ...]:
    """What costing ``model`` as ``family`` approximates about its architecture, as notes:
    no architecture given, one the family models only approximately, or one no family
    claims (``families``: the registered ones, to say which would, were the model built
    like it)."""
    arch = _architecture(model)
    style = family.display
    if family.claims_model(model):
        missing = family.approximation(arch)
        if missing is None:
            return ()
        return (f"approximation: architecture {model.architecture!r} has no measured-grade model of its own; "
                f"costed as {style}-style layers" + (f" ({missing} not modelled)" if missing else ""),)
    if not arch:
        return (f"approximation: model.architecture is not given; costed as {style}-style layers",)
    for other in (families or BUILTIN_FAMILIES).values():
        reason = other.misfit(model) if arch in other.architectures and other is not family else None
        if reason:
            return (f"approximation: architecture {model.architecture!r} is modelled as {other.display}-style "
                    f"layers, which do not fit {model.name!r} ({reason}); costed as {style}-style layers",)
    return (f"approximation: architecture {model.architecture!r} has no measured-grade model of its own; "
            f"costed as {style}-style layers",)


@memoize
def default_family(model: TransformerWorkload) -> ArchitectureFamily:
    """The built-in family that models ``model`` (no plugin's families)."""
    return family_for(model, BUILTIN_FAMILIES)[0]


def family_of(plan) -> ArchitectureFamily:
    """The family a prepared plan uses: the one ``prepare`` chose
    (``profile_options.architecture``), else the built-in that models the plan's model."""
    family = getattr(plan.profile_options, "architecture", None)
    return family if family is not None else default_family(plan.model)


def resolve_family(family) -> ArchitectureFamily:
    """A family object as is, or a built-in one by name (a ``ValueError`` for another name)."""
    if isinstance(family, ArchitectureFamily):
        return family
    try:
        return BUILTIN_FAMILIES[family]
    except (KeyError, TypeError):
        raise ValueError(f"unknown layer style {family!r}; expected one of {tuple(BUILTIN_FAMILIES)}") from None


@hookimpl
def mlsysim_measured_architectures():
    return list(BUILTIN_FAMILIES.values())
