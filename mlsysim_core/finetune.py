"""Exact parameter and byte counts for LoRA and QLoRA fine-tuning of a transformer.

    >>> from mlsysim_core import TransformerWorkload
    >>> from mlsysim_core.finetune import LoRAConfig, lora_counts
    >>> llama2_7b = TransformerWorkload(name="Llama-2-7B", parameters=6_738_415_616, layers=32,
    ...     hidden_dim=4096, heads=32, ffn_dim=11008, gated_mlp=True, vocab_size=32000)
    >>> lora_counts(llama2_7b, LoRAConfig(rank=8, target_modules=("q_proj", "v_proj"))).trainable_parameters
    4194304

What is counted
===============

The decoder blocks' linear layers are derived from the workload's fields, per layer:

* attention: ``q_proj`` hidden -> heads*head_dim, ``k_proj`` / ``v_proj`` hidden ->
  kv_heads*head_dim, ``o_proj`` heads*head_dim -> hidden (``head_dim`` defaults to
  ``hidden_dim // heads``, ``kv_heads`` to ``heads``);
* a dense MLP: gated (SwiGLU/GeGLU) ``gate_proj`` and ``up_proj`` hidden -> ffn,
  ``down_proj`` ffn -> hidden; not gated: ``up_proj`` and ``down_proj`` only;
* a mixture of experts (``SparseTransformerWorkload``): the MLP linears of every one of the
  ``experts`` routed experts (width ``expert_ffn_dim``, else ``ffn_dim``), the ``router``
  (hidden -> experts) and, when ``shared_experts`` > 0, ONE shared-expert MLP of width
  ``shared_experts * expert_ffn_dim`` (how both Qwen-MoE and DeepSeek build it; see
  ``mlsysim_core.hf``); for ``architecture == "qwen2_moe"`` also the ``shared_expert_gate``
  (hidden -> 1). Every block is taken to be sparse. The layout is the one with one
  ``nn.Linear`` per expert (transformers 4.x, and every checkpoint on disk): transformers
  5 fuses the experts into 3-D parameters, which neither peft's ``target_modules`` nor
  bitsandbytes' Linear replacement reach, so there the expert numbers do not apply.
* GPT-2 (``architecture == "gpt2"``) uses ``Conv1D`` layers with other names: ``c_attn``
  (fused Q/K/V, hidden -> 3*hidden), ``attn.c_proj`` (hidden -> hidden), ``c_fc`` (hidden ->
  ffn) and ``mlp.c_proj`` (ffn -> hidden). peft matches a target name against the end of
  a module's dotted path, so ``"c_proj"`` selects BOTH ``attn.c_proj`` and ``mlp.c_proj``
  (as ``target_modules=["c_proj"]`` does in peft); ``"attn.c_proj"`` / ``"mlp.c_proj"``
  select one. The Llama-style names are refused for GPT-2 (there is no separate
  ``q_proj``) and the GPT-2 names for every other architecture.

``"all-linear"`` adapts every linear of the decoder blocks (router and shared-expert gate
included) and never the output projection ``lm_head``, as peft's ``all-linear`` does.
``"lm_head"`` (peft's name; torchtune's ``apply_lora_to_output``, LitGPT's ``lora_head``) adapts the output
projection, hidden -> vocab, once (not per layer): ``r * (hidden + vocab)`` parameters (with DoRA its ``vocab``
magnitude too), in ``head_modules``. A tied head (``tied_embeddings``) gets its own adapter too: the shared
weight stays frozen and the adapter is the head's alone (peft's ``LoraLayer`` on the ``lm_head`` module).
Architectures whose projections are fused differently (``phi3``, ``gpt_neox``,
``falcon``) and multi-head latent attention (``kv_lora_rank`` set) are refused rather
than counted wrongly. A requested target that the model does not have (``gate_proj`` in a
non-gated MLP) is an error here, where peft would silently skip it if another target
matched.

LoRA (peft ``LoraLayer``): per adapted linear of ``in_features`` x ``out_features``,
``lora_A`` is ``r x in`` and ``lora_B`` is ``out x r``, no bias: ``r * (in + out)``
trainable parameters. ``frozen_parameters`` is the whole base model
(``model.parameters``): peft's ``get_nb_trainable_parameters()`` returns
``(trainable_parameters, trainable_parameters + frozen_parameters)``.

Quantization (bitsandbytes, through transformers' ``BitsAndBytesConfig``): every linear of
the blocks is replaced (transformers' ``replace_with_bnb_linear`` also converts GPT-2's
``Conv1D``); embeddings, norms, biases and ``lm_head`` stay in the compute dtype.
``quantized_parameters`` counts the replaced weights (biases excluded). Per weight
tensor of ``n = in * out`` elements:

* ``nf4`` / ``fp4`` (``bnb.nn.Linear4bit`` / ``Params4bit``, ``bnb.functional.quantize_4bit``
  with the default ``quant_storage=torch.uint8``): packed weight ``(n + 1) // 2`` bytes
  (two 4-bit codes a byte); ``absmax``: one fp32 per block of ``quant_blocksize``
  elements, ``ceil(n / blocksize)`` blocks; ``quant_map``: the 16-entry fp32 code table
  (64 B), a fresh tensor in every ``QuantState`` (``get_4bit_type`` builds it per call)
  and saved per weight in the state dict.
  With ``double_quant`` (``compress_statistics=True``) the absmax are shifted by their
  mean and quantized by ``quantize_blockwise(..., blocksize=256)``: 1 B (uint8) per
  block, plus ``nested_absmax`` one fp32 per 256 blocks, plus ``nested_offset`` (the
  mean: one fp32, 4 B) plus ``nested_quant_map``, a per-tensor copy of the 256-entry
  fp32 dynamic code table (1024 B; ``code.to(device, copy=True)``).
  Not counted: the small uint8 tensor ``quant_state.bitsandbytes__nf4`` that only a
  serialized state dict carries (JSON of shape/dtype/blocksize; 70-180 B).
* ``int8`` (``bnb.nn.Linear8bitLt`` / ``Int8Params``, ``int8_vectorwise_quant``): the
  int8 weight ``CB`` (1 B an element) and ``SCB``, one fp32 scale per output row
  (``4 * out`` bytes). LLM.int8's outlier columns are found at run time and stored
  nowhere.

These layouts were checked against bitsandbytes 0.50.2 on CPU (``quantize_4bit`` and
``int8_vectorwise_quant`` on 4096x4096, 11008x4096, 7x9 and 1000x37 tensors), and the
LoRA counts against peft 0.21.2 with transformers 5.23.0; ``tests/applications/test_finetune.py``
records those numbers.
"""

from __future__ import annotations

import math
import re

import attrs

from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from .types import SparseTransformerWorkload, TransformerWorkload

__all__ = ["LoRAConfig", "FineTuneCounts", "lora_counts", "TARGET_MODULES", "QUANTIZATIONS",
           "ALL_LINEAR", "default_target_modules", "checkpoint_quantization"]

ALL_LINEAR = "all-linear"
LM_HEAD = "lm_head"      # the output projection (peft's module name), adapted once
_LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
                  "router", "shared_expert_gate")
_GPT2_TARGETS = ("c_attn", "c_proj", "attn.c_proj", "c_fc", "mlp.c_proj")
TARGET_MODULES = _LLAMA_TARGETS + _GPT2_TARGETS + (LM_HEAD, ALL_LINEAR)
QUANTIZATIONS = (None, "nf4", "fp4", "int8")
# peft's autocast_adapter_dtype: True (its default) keeps fp32 adapters over a 16-bit base; False ("base")
# leaves them in the base's dtype (as torchtune's recipes train them)
ADAPTER_DTYPES = ("fp32", "base")
# bitsandbytes.functional.quantize_4bit: "Valid values are 32, 64, ..., 4096"
_4BIT_BLOCKSIZES = (32, 64, 128, 256, 512, 1024, 2048, 4096)
_NESTED_BLOCKSIZE = 256        # quantize_4bit: quantize_blockwise(absmax - offset, blocksize=256)
_FP32 = 4
_4BIT_CODE_BYTES = 16 * _FP32          # quant_map: get_4bit_type("nf4"/"fp4"), 16 fp32
_DYNAMIC_CODE_BYTES = 256 * _FP32      # nested_quant_map: create_dynamic_map(), 256 fp32
_FUSED_ARCHITECTURES = ("phi3", "gpt_neox", "falcon")
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


_DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
_GPT2_DEFAULT_TARGETS = ("c_attn",)      # peft's TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING["gpt2"]


def default_target_modules(model) -> tuple[str, ...]:
    """The modules LoRA adapts when ``target_modules`` is not given: the attention
    projections, by the architecture's own names (``q_proj``, ``k_proj``, ``v_proj``,
    ``o_proj``; GPT-2: ``c_attn``, the fused Q/K/V, as peft's default for gpt2).
    ``model``: a ``TransformerWorkload`` or a catalog name (resolved)."""
    model = _workload(model)
    arch = model.architecture
    return _GPT2_DEFAULT_TARGETS if isinstance(arch, str) and arch.lower() == "gpt2" else _DEFAULT_TARGETS


def _workload(model):
    """A model object, or a catalog name resolved to one; anything else is an error naming
    ``model`` (a name is never read as an architecture)."""
    if isinstance(model, str):
        from .catalog import get_model
        return get_model(model)
    if not isinstance(model, TransformerWorkload):
        raise InvalidInputTypeError("model", model, "a TransformerWorkload or a catalog model name "
                                    "(see `mlsysim-core models`)", f"got {type(model).__name__}")
    return model


def _targets(value):
    if isinstance(value, str):
        value = (value,)
    if isinstance(value, list):
        value = tuple(value)
    return value


def _check_rank(instance, attribute, value):
    _checks.count("lora.rank", value, minimum=1)


def _check_targets(instance, attribute, value):
    if value is None:       # not given: the architecture's attention projections
        return
    allowed = f"a non-empty tuple of: {', '.join(TARGET_MODULES)}"
    if not isinstance(value, tuple):
        raise InvalidInputTypeError("lora.target_modules", value, allowed,
                                    f"got {type(value).__name__}")
    if not value:
        raise InvalidInputError("lora.target_modules", value, allowed)
    for name in value:
        if not isinstance(name, str):
            raise InvalidInputTypeError("lora.target_modules", name, allowed,
                                        f"got {type(name).__name__}")
        if name not in TARGET_MODULES and not _MODULE_NAME.fullmatch(name):
            # any module name a family's layers may have (qkv_proj, query_key_value, ...): which ones a
            # model has is checked against the model (lora_counts, the measured profile's family)
            raise InvalidInputError("lora.target_modules", name, allowed + ", or another module name "
                                    "(letters, digits, '_' and '.')")
    if len(set(value)) != len(value):
        raise InvalidInputError("lora.target_modules", value, "each module named once",
                                "a module is listed twice")
    if ALL_LINEAR in value and len(value) > 1:
        raise InvalidInputError("lora.target_modules", value,
                                f"{ALL_LINEAR!r} alone, or a list of module names",
                                "peft takes 'all-linear' as the whole target_modules")
    if value == (LM_HEAD,):
        raise NotModelledError("lora.target_modules", value, f"{LM_HEAD!r} beside decoder-layer targets",
                               "an adapter on the LM head alone (no decoder layer adapted: the backward stops at the "
                               "head) is not modelled")


def _check_quantization(instance, attribute, value):
    if value not in QUANTIZATIONS or isinstance(value, bool):
        allowed = "None, 'nf4', 'fp4' or 'int8'"
        if value is not None and not isinstance(value, str):
            raise InvalidInputTypeError("lora.quantization", value, allowed, f"got {type(value).__name__}")
        raise InvalidInputError("lora.quantization", value, allowed)


def _check_double_quant(instance, attribute, value):
    _checks.flag("lora.double_quant", value)


def _check_blocksize(instance, attribute, value):
    allowed = f"one of {', '.join(map(str, _4BIT_BLOCKSIZES))} (bitsandbytes 4-bit)"
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputTypeError("lora.quant_blocksize", value, allowed, f"got {type(value).__name__}")
    if value not in _4BIT_BLOCKSIZES:
        raise InvalidInputError("lora.quant_blocksize", value, allowed)


def _check_adapter_dtype(value):
    if value not in ADAPTER_DTYPES:
        raise InvalidInputError("lora.adapter_dtype", value, "'fp32' (peft's autocast_adapter_dtype=True) or 'base' "
                                "(autocast_adapter_dtype=False: the base's dtype)")


def _check_modules_to_save(instance, attribute, value):
    if not isinstance(value, tuple) or len(set(value)) != len(value) or not all(
            isinstance(n, str) and _MODULE_NAME.fullmatch(n) for n in value):
        raise InvalidInputError("lora.modules_to_save", value, "distinct module names, e.g. ('embed_tokens', 'lm_head')")


@attrs.frozen(kw_only=True)
class LoRAConfig:
    """A LoRA adapter and, for QLoRA, how the base model is quantized.

    ``target_modules`` are names as peft matches them (``("q_proj", "v_proj")``, or
    ``"all-linear"`` alone); a single string is taken as a one-name tuple. ``None`` (the
    default) means the model's attention projections, by its architecture's names
    (``default_target_modules``: ``q_proj, k_proj, v_proj, o_proj``; GPT-2 ``c_attn``);
    ``for_model(model)`` gives the config with them filled in. Errors name the fields
    ``lora.<field>``, as the ``lora=`` option of a solve does.
    ``quantization`` is ``None`` (base in its own dtype), ``"nf4"``/``"fp4"``
    (bitsandbytes 4-bit, ``bnb_4bit_quant_type``) or ``"int8"`` (LLM.int8).
    ``double_quant`` is ``bnb_4bit_use_double_quant``; ``quant_blocksize`` the 4-bit
    block size (64); ``quant_implementation`` who stores it (``"bitsandbytes"``; ``"torchao"``: quantizations.py).
    ``dropout`` is peft's ``lora_dropout`` (0.0, peft's
    default; below 1): it changes the saved activations, not the counts. ``adapter_dtype``:
    ``"fp32"`` (peft's default ``autocast_adapter_dtype=True``: fp32 adapters over a 16-bit
    base) or ``"base"`` (``autocast_adapter_dtype=False``: the base's dtype). ``use_dora``: DoRA; ``modules_to_save``:
    peft's trainable copies of the embedding (``embed_tokens``/``wte``) and the LM head (``lm_head``).
    """

    rank: int = attrs.field(default=16, converter=_checks.to_int, validator=_check_rank)
    target_modules: tuple[str, ...] | None = attrs.field(
        default=None, converter=_targets, validator=_check_targets)
    quantization: str | None = attrs.field(default=None, validator=_check_quantization)
    double_quant: bool = attrs.field(default=False, validator=_check_double_quant)
    quant_blocksize: int = attrs.field(default=64, validator=_check_blocksize)
    quant_implementation: str = attrs.field(default="bitsandbytes")   # checked by the profile that prices it
    dropout: float = attrs.field(default=0.0, converter=lambda v: _checks.fraction("lora.dropout", v))
    adapter_dtype: str = attrs.field(default="fp32", validator=lambda i, a, v: _check_adapter_dtype(v))
    use_dora: bool = attrs.field(default=False, validator=lambda i, a, v: _checks.flag("lora.use_dora", v))
    modules_to_save: tuple[str, ...] = attrs.field(default=(), converter=lambda v: _targets(v) or (),
                                                   validator=_check_modules_to_save)

    def __attrs_post_init__(self):
        if self.double_quant and self.quantization not in ("nf4", "fp4"):
            raise InvalidInputError("lora.double_quant", self.double_quant,
                                    "False unless quantization is 'nf4' or 'fp4'",
                                    f"quantization={self.quantization!r}")
        if self.dropout == 1.0:
            raise InvalidInputError("lora.dropout", self.dropout, "a probability in [0.0, 1.0)",
                                    "1.0 drops every input to the adapters")
        if self.quant_blocksize != 64 and self.quantization not in ("nf4", "fp4"):
            raise InvalidInputError("lora.quant_blocksize", self.quant_blocksize,
                                    "the default 64 unless quantization is 'nf4' or 'fp4'",
                                    f"quantization={self.quantization!r}: the block size is bitsandbytes "
                                    "4-bit's; nothing else reads it")

    def for_model(self, model) -> "LoRAConfig":
        """This config with ``target_modules`` filled in for ``model`` when not given;
        ``model`` a ``TransformerWorkload`` or a catalog name (checked either way)."""
        model = _workload(model)
        if self.target_modules is not None:
            return self
        return attrs.evolve(self, target_modules=default_target_modules(model))


@attrs.frozen(kw_only=True)
class FineTuneCounts:
    """Exact counts for one model and one ``LoRAConfig`` (see the module docstring).

    ``per_module`` has one row per adapted linear kind:
    ``(module, in_features, out_features, LoRA parameters in one layer)``; for the experts
    of a mixture the last number covers all ``experts`` copies (with DoRA: and the magnitude vector).
    ``head_modules``: the same rows for the adapted output projection (``lm_head``), counted once.
    """

    trainable_parameters: int
    frozen_parameters: int
    adapted_linear_parameters: int
    quantized_parameters: int
    quantized_weight_bytes: int
    quantization_constant_bytes: int
    per_module: tuple[tuple[str, int, int, int], ...]
    saved_modules: tuple[tuple[str, int], ...] = ()
    head_modules: tuple[tuple[str, int, int, int], ...] = ()

    @property
    def total_parameters(self) -> int:
        """Base plus adapters: peft's ``get_nb_trainable_parameters()[1]``."""
        return self.trainable_parameters + self.frozen_parameters


@attrs.frozen
class _Linear:
    module: str             # the name reported in per_module
    in_features: int
    out_features: int
    copies: int             # per layer (experts)
    selectors: frozenset    # the target names that adapt it


def _need(model, field_name: str, value=None):
    value = getattr(model, field_name) if value is None else value
    if value is None:     # valid, but unknown: the adapters cannot be sized (a NotModelledError: refused)
        raise NotModelledError(f"model.{field_name}", None,
                               "known: " + ("true or false (a gated MLP has 3 matrices, a plain one 2)"
                                            if field_name == "gated_mlp" else "a positive integer"),
                               f"needed to size the linear layers the LoRA targets adapt; {model.name!r} "
                               f"does not give its {field_name}")
    return value


def _attention(model, arch: str | None):
    hidden = _need(model, "hidden_dim")
    heads = _need(model, "heads")
    if arch == "gpt2":
        return [_Linear("c_attn", hidden, 3 * hidden, 1, frozenset({"c_attn"})),
                _Linear("attn.c_proj", hidden, hidden, 1, frozenset({"c_proj", "attn.c_proj"}))]
    head_dim = model.head_dim if model.head_dim is not None else hidden // heads
    if head_dim < 1:
        raise InvalidInputError("model.head_dim", None,
                                "set, or hidden_dim >= heads", "hidden_dim // heads is 0")
    kv = model.kv_heads if model.kv_heads is not None else heads
    return [_Linear("q_proj", hidden, heads * head_dim, 1, frozenset({"q_proj"})),
            _Linear("k_proj", hidden, kv * head_dim, 1, frozenset({"k_proj"})),
            _Linear("v_proj", hidden, kv * head_dim, 1, frozenset({"v_proj"})),
            _Linear("o_proj", heads * head_dim, hidden, 1, frozenset({"o_proj"}))]


def _mlp_linears(prefix: str, hidden: int, ffn: int, gated: bool, copies: int):
    out = []
    if gated:
        out.append(_Linear(prefix + "gate_proj", hidden, ffn, copies, frozenset({"gate_proj"})))
    out.append(_Linear(prefix + "up_proj", hidden, ffn, copies, frozenset({"up_proj"})))
    out.append(_Linear(prefix + "down_proj", ffn, hidden, copies, frozenset({"down_proj"})))
    return out


def _mlp(model, arch: str | None):
    hidden = _need(model, "hidden_dim")
    if arch == "gpt2":
        ffn = _need(model, "ffn_dim")
        return [_Linear("c_fc", hidden, ffn, 1, frozenset({"c_fc"})),
                _Linear("mlp.c_proj", ffn, hidden, 1, frozenset({"c_proj", "mlp.c_proj"}))]
    gated = _need(model, "gated_mlp")
    if not isinstance(model, SparseTransformerWorkload):
        return _mlp_linears("", hidden, _need(model, "ffn_dim"), gated, 1)
    expert_ffn = model.expert_ffn_dim if model.expert_ffn_dim is not None else model.ffn_dim
    expert_ffn = _need(model, "expert_ffn_dim", expert_ffn)
    out = [_Linear("router", hidden, model.experts, 1, frozenset({"router"}))]
    out += _mlp_linears("experts.", hidden, expert_ffn, gated, model.experts)
    if model.shared_experts:
        out += _mlp_linears("shared_expert.", hidden, model.shared_experts * expert_ffn, gated, 1)
        if arch == "qwen2_moe":
            out.append(_Linear("shared_expert_gate", hidden, 1, 1,
                               frozenset({"shared_expert_gate"})))
    return out


def _check_model(model):
    if not isinstance(model, TransformerWorkload):
        raise InvalidInputTypeError("model", model,
                                    "a TransformerWorkload or SparseTransformerWorkload",
                                    f"got {type(model).__name__}")
    arch = model.architecture.lower() if model.architecture else None
    if model.kv_lora_rank is not None:
        raise NotModelledError("model.kv_lora_rank", model.kv_lora_rank,
                               "None: multi-head latent attention projections are not modelled")
    if arch in _FUSED_ARCHITECTURES:
        raise NotModelledError("model.architecture", model.architecture,
                               "an architecture with separate q/k/v (and gate/up) linears, or 'gpt2'",
                               "its fused projections are not modelled")
    if arch == "gpt2" and model.is_sparse:
        raise InvalidInputError("model.architecture", model.architecture,
                                "a dense model for 'gpt2'")
    return arch


def lora_counts(model, config: LoRAConfig) -> FineTuneCounts:
    """Trainable (adapter) and frozen parameters, and the quantized base's bytes.

    ``model`` is a ``TransformerWorkload`` or ``SparseTransformerWorkload``; raises
    ``InvalidInputError`` naming the model field that is missing, a target the model
    does not have, or a model whose linears alone exceed its ``parameters``.
    """
    if not isinstance(config, LoRAConfig):
        raise InvalidInputTypeError("config", config, "a LoRAConfig",
                                    f"got {type(config).__name__}")
    arch = _check_model(model)
    config = config.for_model(model)
    own = _GPT2_TARGETS if arch == "gpt2" else _LLAMA_TARGETS
    all_linear = config.target_modules == (ALL_LINEAR,)
    head = head_modules(model, config)
    for name in config.target_modules:
        if name not in (ALL_LINEAR, LM_HEAD) and name not in own:
            kind = "GPT-2 (architecture='gpt2')" if arch == "gpt2" else "this architecture"
            raise InvalidInputError("lora.target_modules", name,
                                    f"for {kind} one of: {', '.join(own)}, {LM_HEAD}, {ALL_LINEAR}",
                                    "GPT-2 fuses Q, K and V into c_attn" if arch == "gpt2" else
                                    "c_attn, c_fc and c_proj are GPT-2's names")
    attention_only = {"q_proj", "k_proj", "v_proj", "o_proj", "c_attn", "attn.c_proj", LM_HEAD}
    # the MLP's fields are needed only when an MLP linear is adapted or quantized
    wants_mlp = (all_linear or config.quantization is not None
                 or any(n not in attention_only for n in config.target_modules))
    linears = _attention(model, arch) + (_mlp(model, arch) if wants_mlp else [])

    names = set(config.target_modules) - {LM_HEAD}
    adapted = [lin for lin in linears if all_linear or lin.selectors & names]
    for name in names - {ALL_LINEAR}:
        if not any(name in lin.selectors for lin in linears):
            have = sorted({s for lin in linears for s in lin.selectors} | {ALL_LINEAR})
            raise InvalidInputError("lora.target_modules", name,
                                    f"a module this model has: {', '.join(have)}",
                                    f"{model.name!r} has no {name}")

    layers, r = model.layers, config.rank
    _check_rank_fits(r, adapted)
    per_module = tuple((lin.module, lin.in_features, lin.out_features,
                        lin.copies * adapter_parameters(lin, r, config)) for lin in adapted)
    saved = saved_modules(model, config, "wte" if arch == "gpt2" else "embed_tokens", "lm_head")
    trainable = layers * sum(row[3] for row in per_module) + sum(n for _, n in saved) + sum(row[3] for row in head)
    adapted_params = layers * sum(lin.copies * lin.in_features * lin.out_features for lin in adapted)

    quantized = weight_bytes = constant_bytes = 0
    if config.quantization is not None:
        for lin in linears:
            tensors = layers * lin.copies
            n = lin.in_features * lin.out_features
            w, c = _tensor_bytes(n, lin.out_features, config)
            quantized += tensors * n
            weight_bytes += tensors * w
            constant_bytes += tensors * c
    linear_total = layers * sum(lin.copies * lin.in_features * lin.out_features for lin in linears)
    if wants_mlp and linear_total > model.parameters:
        raise InvalidInputError("model.parameters", model.parameters,
                                f"at least {linear_total}",
                                "the linear layers its fields describe hold more parameters")
    if adapted_params > model.parameters:
        raise InvalidInputError("model.parameters", model.parameters,
                                f"at least {adapted_params}",
                                "the adapted linear layers alone hold more parameters")
    return FineTuneCounts(trainable_parameters=trainable, frozen_parameters=model.parameters,
                          adapted_linear_parameters=adapted_params, quantized_parameters=quantized,
                          quantized_weight_bytes=weight_bytes,
                          quantization_constant_bytes=constant_bytes, per_module=per_module, saved_modules=saved,
                          head_modules=head)


def adapter_parameters(linear, rank: int, config: LoRAConfig) -> int:
    """One linear's (``in_features``, ``out_features``): ``lora_A``, ``lora_B`` and with DoRA the magnitude."""
    return rank * (linear.in_features + linear.out_features) + (linear.out_features if config.use_dora else 0)


def head_modules(model, config: LoRAConfig) -> tuple[tuple[str, int, int, int], ...]:
    """``((lm_head, hidden, vocab, adapter parameters),)`` when ``target_modules`` names ``lm_head``, else ``()``:
    the output projection's adapter, one for the model (``r * (hidden + vocab)``, with DoRA ``+ vocab``). A head that
    is also a ``modules_to_save`` copy is refused (two trainable versions of one module)."""
    if LM_HEAD not in (config.target_modules or ()):
        return ()
    if LM_HEAD in config.modules_to_save:
        raise InvalidInputError("lora.modules_to_save", config.modules_to_save, f"without {LM_HEAD!r} when "
                                f"target_modules names {LM_HEAD!r}", "the LM head is either adapted or a trainable "
                                "copy, not both")
    head = _Linear(LM_HEAD, _need(model, "hidden_dim"), _need(model, "vocab_size"), 1, frozenset({LM_HEAD}))
    _check_rank_fits(config.rank, [head])
    return ((LM_HEAD, head.in_features, head.out_features, adapter_parameters(head, config.rank, config)),)


def saved_modules(model, config: LoRAConfig, embedding: str, lm_head: str) -> tuple[tuple[str, int], ...]:
    """``(module, vocab x hidden)`` per ``modules_to_save`` copy (tied too: its own parameter); others refused."""
    for name in config.modules_to_save:
        if name not in (embedding, lm_head):
            raise NotModelledError("lora.modules_to_save", name, f"{embedding!r} (the embedding) or {lm_head!r}",
                                   f"a trainable copy of {name!r} is not modelled")
    return tuple((n, _need(model, "vocab_size") * _need(model, "hidden_dim")) for n in config.modules_to_save)


# Linears whose output is a handful of gate values (the MoE router, Qwen's shared-expert
# gate): peft adapts them at the model's rank like any other, so they do not bound it.
_GATES = ("router", "shared_expert_gate")


def _check_rank_fits(rank: int, adapted) -> None:
    """A rank above an adapted matrix's smaller side gives an adapter with more parameters
    than the full-rank update it approximates: refuse it, naming the rank and its range."""
    sides = [(min(lin.in_features, lin.out_features), lin.module) for lin in adapted if lin.module not in _GATES]
    if not sides:
        return
    most, module = min(sides)
    if rank > most:
        raise InvalidInputError("lora.rank", rank, f"an integer in [1, {most}]",
                                f"{module} is {_dims(adapted, module)}: a rank above its smaller side is no "
                                "longer low-rank (the adapter would outgrow the matrix it adapts)")


def _dims(adapted, module: str) -> str:
    lin = next(lin for lin in adapted if lin.module == module)
    return f"{lin.in_features} x {lin.out_features}"


def _tensor_bytes(n: int, rows: int, config: LoRAConfig) -> tuple[int, int]:
    """(weight bytes, constant bytes) of one quantized weight of n elements and rows outputs."""
    if config.quantization == "int8":
        # Linear8bitLt / Int8Params._quantize -> int8_vectorwise_quant: CB int8 [out, in],
        # SCB fp32 [out]
        return n, _FP32 * rows
    # Linear4bit / Params4bit -> quantize_4bit (quant_storage uint8):
    # out = uint8[(n + 1) // 2], absmax = fp32[ceil(n / blocksize)], code = 16 fp32
    blocks = math.ceil(n / config.quant_blocksize)
    if not config.double_quant:
        return (n + 1) // 2, _FP32 * blocks + _4BIT_CODE_BYTES
    # compress_statistics: offset = absmax.mean() (fp32 scalar);
    # quantize_blockwise(absmax - offset, blocksize=256) -> uint8[blocks] and a nested
    # QuantState with fp32[ceil(blocks / 256)] absmax and a copied 256-entry fp32 code
    nested_blocks = math.ceil(blocks / _NESTED_BLOCKSIZE)
    return (n + 1) // 2, (blocks + _FP32 * nested_blocks + _FP32 + _DYNAMIC_CODE_BYTES
                          + _4BIT_CODE_BYTES)


def trainable_fraction(model, value) -> float:
    """The adapters' share of the base parameters (``trainable / model.parameters``) for a
    ``LoRAConfig`` or a dict of its fields: the reference profile's rough stand-in for LoRA."""
    config = _config(value)
    return _exact_fraction(lora_counts(model, config).trainable_parameters, model.parameters)


_LORA_FIELDS = frozenset(a.name for a in attrs.fields(LoRAConfig))


def _shown_dict(value: dict) -> str:
    from .errors import _safe_repr
    return _safe_repr(value)


def _config(value) -> LoRAConfig:
    if isinstance(value, LoRAConfig):
        return value
    if isinstance(value, dict):
        from .serialization import structure_options
        if "rank" not in value and all(key in _LORA_FIELDS for key in value):
            # never a silent rank-16 LoRA (LoRAConfig() keeps its documented default; an unknown
            # key is named first, below)
            raise InvalidInputError("lora.rank", None, "an integer >= 1: the adapters' rank, e.g. {'rank': 16}",
                                    f"lora={_shown_dict(value)} has no rank; a dict of LoRAConfig fields must name it")
        value = dict(value)
        for key in [k for k in ("target_modules", "modules_to_save") if isinstance(value.get(k), str)]:
            value[key] = [value[key]]     # "all-linear" or one name
        return structure_options("lora", "lora", LoRAConfig, value)
    raise InvalidInputTypeError("lora", value, "a LoRAConfig or a dict of its fields")


def checkpoint_quantization(model, config: LoRAConfig | None) -> tuple[LoRAConfig | None, tuple[str, ...]]:
    """``(config, notes)``: the LoRA configuration a run of ``model`` trains with, given the
    quantization of the checkpoint it was imported from (``hf.checkpoint_quantization``,
    ``details["quantization"]``), never ignored.

    A bitsandbytes checkpoint (4-bit nf4/fp4, 8-bit int8) trains only adapters: ``config``
    ``None`` (full training) is refused with ``NotModelledError``; a ``LoRAConfig`` without
    ``quantization`` takes the checkpoint's (QLoRA: its quantization, ``double_quant`` and
    bitsandbytes' 64-element blocks), with a note; one that names another quantization,
    double quantization or block size is refused, naming the field. An mxfp4 checkpoint
    (gpt-oss: trained dequantized to bf16, the gpt_oss family's note) changes nothing here;
    an unquantized model returns ``config`` unchanged."""
    from .hf import checkpoint_quantization as of_model
    q = of_model(model)
    if q is None or q.get("method") != "bitsandbytes":
        return config, ()
    kind = q["quantization"]
    said = (f"bitsandbytes {kind}" + (" with double quantization" if q.get("double_quant") else "")
            + (f", compute dtype {q['compute_dtype']}" if q.get("compute_dtype") else ""))
    name = getattr(model, "name", "the model")
    if config is None:
        raise NotModelledError(
            "lora", None, f"a LoRA configuration (lora=LoRAConfig(rank=...), --lora-rank): {name!r} is a {said} "
            "checkpoint, which fine-tunes as QLoRA",
            "full training of a quantized checkpoint is not modelled: its quantized weights are frozen (bitsandbytes "
            "has no gradients for them) and transformers refuses to train a purely quantized model without adapters; "
            "drop the config's quantization_config to cost full training of the model in its own dtype")
    wanted = {"quantization": kind, "double_quant": bool(q.get("double_quant", False)),
              "quant_blocksize": q.get("quant_blocksize", 64)}
    if config.quantization is None:
        config = attrs.evolve(config, **wanted)
        return config, (f"the checkpoint's quantization_config ({said}) is applied: QLoRA, its base linears "
                        f"stored as {kind}" + (", 64-element blocks" if kind != "int8" else ""),)
    for field, value in wanted.items():
        if getattr(config, field) != value:
            raise InvalidInputError(f"lora.{field}", getattr(config, field),
                                    f"{value!r} (the checkpoint's), or lora.quantization left out to take it",
                                    f"{name!r} is a {said} checkpoint: its weights are stored that way")
    return config, ()


def _exact_fraction(part: int, whole: int) -> float:
    """A float f with ``whole * f == part`` exactly where one exists near ``part / whole``,
    so that ``placement.trainable_parameters_per_rank`` is the adapter count to the unit."""
    f = part / whole
    for _ in range(8):
        product = whole * f
        if product == part:
            break
        f = math.nextafter(f, math.inf if product < part else -math.inf)
    return f if whole * f == part else part / whole
