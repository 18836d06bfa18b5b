"""Import a model's architecture from a Hugging Face ``config.json``, without transformers.

    >>> from mlsysim_core.hf import from_hf_config
    >>> w = from_hf_config({"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
    ...                     "vocab_size": 50257, "n_positions": 1024})
    >>> w.parameters, w.tied_embeddings, w.ffn_dim
    (124439808, True, 3072)

``from_hf_config()`` returns a ``TransformerWorkload`` (or a ``SparseTransformerWorkload``
for a mixture of experts) whose ``parameters`` equal ``sum(p.numel() for p in
model.parameters())`` of ``AutoModelForCausalLM.from_config(config)``: every weight, bias
and norm, tied embeddings counted once. ``architecture_of()`` returns the facts the
workload has no field for (norm kind, biases, position embeddings, dropout, activation,
RoPE, parallel residual, sliding window, soft-capping, dtype, ...) as an ``HFArchitecture``.

Fields missing from a ``config.json`` (top-level, or in a multimodal config's
``text_config``) take the default the model type's transformers config class declares, read
from ``catalog/hf_defaults.json`` (written by ``tools/make_hf_defaults.py`` from transformers
5.23.0; ``transformers_defaults(model_type)``): ``LlamaConfig``'s 32000-entry vocabulary,
``Gemma3TextConfig``'s 262208. A key set to ``null`` stays null; a size that is null, or that
transformers gives no default (``kimi_k2`` has no transformers class), is refused naming it.

A ``quantization_config`` is read into ``details["quantization"]``: bitsandbytes 4-bit
(nf4, fp4) and 8-bit checkpoints are QLoRA under ``lora=`` (``finetune.checkpoint_quantization``),
gpt-oss's mxfp4 is trained dequantized (the gpt_oss family); every other method is refused
with ``NotModelledError`` naming it.

``ffn_dim`` is ``intermediate_size`` (GPT-2: ``n_inner`` or ``4 * n_embd``), the dense MLP
width. In a mixture of experts whose every block is sparse it is the expert width
(``moe_intermediate_size``), as in the curated catalog; Qwen's shared expert, whose width
is ``shared_expert_intermediate_size``, is recorded as ``shared_experts`` experts of
``expert_ffn_dim`` when it is a multiple of it (Qwen1.5-MoE-A2.7B: 5632 = 4 x 1408), else
as one, and its exact width is ``HFArchitecture.shared_expert_ffn_dim``.

Multimodal configs (``gemma3``, ``llama4``, ``mistral3``) are read through their
``text_config``: the workload is the language model (``architecture`` is the text type,
``gemma3_text``, ``llama4_text``, ``mistral``/``ministral3``), and the vision tower is not
counted. ``kimi_k2`` is read as ``deepseek_v3``. DeepSeek's multi-head latent attention
gives ``kv_heads = heads`` and ``head_dim = qk_nope_head_dim + qk_rope_head_dim``; what
transformers 5.23 does not build (MTP layers) or keeps as a buffer
(``e_score_correction_bias``) is not counted. See docs/hf-import.md.
"""

from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Mapping

import attrs

from .catalog.counting import count_parameters
from . import _checks
from .errors import InvalidInputError, InvalidInputTypeError, NotModelledError
from .types import SparseTransformerWorkload, TransformerWorkload

__all__ = ["from_hf_config", "architecture_of", "load_hf_config", "HFArchitecture",
           "SUPPORTED_MODEL_TYPES", "ARCHITECTURES", "transformers_defaults", "TRANSFORMERS_VERSION",
           "checkpoint_quantization", "QUANTIZATION_METHODS", "defaults_applied", "defaults_note"]

_REQUIRED = object()

# transformers' config defaults of every model type read here (tools/make_hf_defaults.py writes
# them from transformers' config classes; the file says which transformers version).
_DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "catalog", "hf_defaults.json")


@functools.lru_cache(maxsize=1)
def _defaults_table() -> dict:
    with open(_DEFAULTS_FILE, encoding="utf-8") as f:
        return json.load(f)


TRANSFORMERS_VERSION: str = _defaults_table()["transformers_version"]


def transformers_defaults(model_type: str) -> dict | None:
    """The defaults transformers' config class of ``model_type`` declares (a copy of
    ``hf_defaults.json``'s entry: ``config_class``, ``defaults``, ``attribute_map``,
    ``default_theta``, ``sub_configs``), or ``None`` where transformers has no class for the
    type (``kimi_k2``). These fill every key a config.json leaves out."""
    entry = _defaults_table()["model_types"].get(model_type)
    return json.loads(json.dumps(entry)) if entry is not None else None


# The largest size a config.json key may give (layers, widths, heads, vocabulary, experts,
# positions, windows): 2**31 - 1. Far beyond any real model; a larger value is a typo or
# hostile input, and is refused naming its key rather than the parameter count it implies.
MAX_SIZE = 2**31 - 1


@attrs.frozen(kw_only=True)
class HFArchitecture:
    """What a ``config.json`` says about a model beyond ``TransformerWorkload``'s fields.

    ``norm`` is ``"rms"`` (RMSNorm: a scale), ``"layer"`` (LayerNorm: scale and bias) or
    ``"none"`` (OLMo's LayerNorm without parameters); ``norms_per_layer`` counts the norms
    over the hidden width in one block and ``qk_norm`` is ``None``, ``"head"`` (over one
    head's width: Qwen 3, Gemma 3) or ``"full"`` (over all heads: OLMo 2).
    ``position_embedding`` is ``"rotary"``, ``"learned"`` (GPT-2's ``wpe``) or ``"alibi"``;
    ``rotary_fraction`` the share of each head's dimensions RoPE rotates.
    ``sliding_window`` is the window of the layers that use one and
    ``sliding_window_layers`` how many do (0 and ``None`` where no layer does).
    ``moe_layers`` / ``dense_layers`` split the blocks of a mixture of experts.
    ``embedding_parameters`` is the input embedding (plus learned positions),
    ``lm_head_parameters`` the output projection (0 when tied).
    """

    model_type: str
    norm: str
    norms_per_layer: int
    final_norm: bool = True
    norm_eps: float | None = None
    qk_norm: str | None = None
    qkv_bias: bool = False
    attention_out_bias: bool = False
    mlp_bias: bool = False
    fused_qkv: bool = False
    fused_gate_up: bool = False
    hidden_act: str | None = None
    position_embedding: str = "rotary"
    rotary_fraction: float | None = None
    rope_theta: float | None = None
    rope_scaling: Mapping[str, Any] | None = attrs.field(default=None, hash=False)
    parallel_residual: bool = False
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0
    embedding_dropout: float = 0.0
    sliding_window: int | None = None
    sliding_window_layers: int = 0
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    query_pre_attn_scalar: float | None = None
    embedding_scale: bool = False       # Gemma multiplies the embeddings by sqrt(hidden)
    torch_dtype: str | None = None
    router_bias: bool = False
    shared_expert_ffn_dim: int | None = None
    shared_expert_gate: bool = False
    moe_layers: int = 0
    dense_layers: int = 0
    norm_topk_prob: bool | None = None
    attention_sinks: bool = False       # gpt-oss: one learned logit per head joins the softmax
    mla: bool = False                   # DeepSeek's multi-head latent attention (ranks in the raw keys)
    mtp_layers_not_built: int = 0       # num_nextn_predict_layers: in the checkpoint, not in the HF model
    config_model_type: str | None = None   # the config.json's own model_type where it differs
    quantization: Mapping[str, Any] | None = attrs.field(default=None, hash=False)   # checkpoint_quantization()
    embedding_parameters: int = 0
    lm_head_parameters: int = 0


# --- reading a config -------------------------------------------------------------------------

def load_hf_config(config) -> dict:
    """A ``config.json`` as a dict: from a dict, a path to the file or its directory, or a
    transformers ``PretrainedConfig`` (anything with ``to_dict()``)."""
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        path = os.fspath(config)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8-sig") as f:
                data = json.load(f)
        except OSError as exc:
            raise InvalidInputError("config", os.fspath(config), "a readable config.json file",
                                    str(exc)) from None
        except UnicodeDecodeError as exc:
            raise InvalidInputError("config", os.fspath(config), "a JSON document (UTF-8 text)",
                                    f"not UTF-8: {exc}") from None
        except ValueError as exc:      # malformed JSON, a number too long to read, a NUL in the path
            raise InvalidInputError("config", os.fspath(config), "a JSON document", str(exc)) from None
        except RecursionError:
            raise InvalidInputError("config", os.fspath(config), "a JSON document",
                                    "nested too deeply to read") from None
        if not isinstance(data, dict):
            raise InvalidInputError("config", os.fspath(config), "a JSON object")
        return data
    if hasattr(config, "to_dict"):
        return dict(config.to_dict())
    raise InvalidInputError("config", type(config).__name__,
                            "a dict, a path to config.json or a transformers config")


class _Config:
    """Typed access to a config dict with transformers' defaults and clear errors.

    A key the config sets (under any of the names a reader tries) wins; a key it leaves out
    takes ``defaults``, the declared default of the model type's transformers config class
    (``hf_defaults.json``); a key it sets to ``null`` stays null (DeepSeek-V2-Lite's
    ``q_lora_rank``: no query compression), so a size set to null is refused. ``defaults`` is
    ``None`` for a type transformers has no class for (``kimi_k2``): nothing is filled in.
    """

    def __init__(self, data: Mapping[str, Any], model_type: str, prefix: str = "config",
                 entry: Mapping[str, Any] | None = None, config_type: str | None = None):
        self.config_type = config_type or model_type     # the config.json's own (kimi_k2, read as deepseek_v3)
        entry = entry or {}
        aliases = entry.get("attribute_map") or {}
        if any(alias in data and real not in data for alias, real in aliases.items()):
            data = dict(data)       # GPT-2's hidden_size is its n_embd: the key a reader tries first
            for alias, real in aliases.items():
                if alias in data and real not in data:
                    data[real] = data[alias]
        self.data = data
        self.model_type = model_type
        self.prefix = prefix        # "config.text_config" for a multimodal config's language model
        self.defaults = entry.get("defaults")      # None: no transformers class, nothing filled in
        self.config_class = entry.get("config_class")
        self.default_theta = entry.get("default_theta")
        self.defaulted: dict[str, Any] = {}    # the class's fields the config leaves out -> the value taken

    def _taken(self, keys, value):
        """``value`` taken for ``keys`` (the first of the class's fields among them) where the config
        names none of them: recorded for ``defaults_applied``."""
        if value is not None and self.defaults is not None and not any(k in self.data for k in keys):
            key = next((k for k in keys if k in self.defaults), None)
            if key is not None:
                self.defaulted.setdefault(key, value)
        return value

    def _missing(self, key):
        if key in self.data:        # set to null: a size cannot be null
            default = (self.defaults or {}).get(key)
            return InvalidInputError(f"{self.prefix}.{key}", None, "an integer of at least 1",
                                     "the config sets it to null"
                                     + (f" (left out, it would take transformers {TRANSFORMERS_VERSION}'s "
                                        f"{self.config_class} default, {default})" if default is not None else ""))
        if self.defaults is None:
            return InvalidInputError(f"{self.prefix}.{key}", None, f"present in a {self.config_type!r} config.json",
                                     f"transformers {TRANSFORMERS_VERSION} has no {self.config_type!r} config class "
                                     "to take a default from, and this field defines the model's size")
        return InvalidInputError(f"{self.prefix}.{key}", None, f"present in a {self.model_type!r} config.json",
                                 f"transformers {TRANSFORMERS_VERSION}'s {self.config_class} has no default for it, "
                                 "and this field defines the model's size")

    def given(self, key) -> bool:
        """Whether the config itself sets ``key`` (not null)."""
        return self.data.get(key) is not None

    def _values(self, keys):
        """The candidate values of ``keys`` in order: those the config sets, then (when the
        config names none of them, not even as null) their transformers defaults."""
        set_ = [(k, self.data[k]) for k in keys if self.data.get(k) is not None]
        if set_ or any(k in self.data for k in keys) or not self.defaults:
            return set_
        return [(k, self.defaults[k]) for k in keys if self.defaults.get(k) is not None]

    def get(self, key):
        """The config's value of ``key``, else its transformers default (``None`` if neither)."""
        values = self._values((key,))
        return self._taken((key,), values[0][1]) if values else None

    def raw(self, key, default=None):
        value = self.get(key)
        return self._taken((key,), default) if value is None else value

    def count(self, *keys, default=_REQUIRED, minimum=1):
        """The first of ``keys`` that is set (else defaulted), as a positive int (``minimum`` 0 allows 0)."""
        for key, value in self._values(keys):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                if isinstance(value, float) and value.is_integer() and value >= minimum:
                    value = int(value)
                else:
                    raise InvalidInputError(f"{self.prefix}.{key}", value,
                                            f"an integer of at least {minimum}")
            if value > MAX_SIZE:
                raise InvalidInputError(f"{self.prefix}.{key}", value, f"an integer in [{minimum}, {MAX_SIZE:,}]",
                                        "too large for a model size: no real model comes near 2**31")
            return self._taken(keys, value)
        if default is _REQUIRED:
            raise self._missing(keys[0])
        return self._taken(keys, default)

    def flag(self, key, default: bool) -> bool:
        value = self.get(key)
        if value is None:
            return self._taken((key,), default)
        if not isinstance(value, bool):
            raise InvalidInputError(f"{self.prefix}.{key}", value, "true or false")
        return value

    def number(self, *keys, default=None):
        for key, value in self._values(keys):
            if not isinstance(value, bool) and isinstance(value, (int, float)):
                return self._taken(keys, value)
        return self._taken(keys, default)

    def int_list(self, key) -> list:
        value = self.get(key) or []
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) for v in value):
            raise InvalidInputError(f"{self.prefix}.{key}", value, "a list of layer indices")
        return list(value)

    def whence(self, key) -> str:
        """How an error names where a value came from: the config, or transformers' default."""
        if self.given(key):
            return ""
        return f" (the config leaves {key} out: transformers {TRANSFORMERS_VERSION}'s {self.config_class} default)"


# --- per-family readers -----------------------------------------------------------------------
#
# Each returns (workload fields, count_parameters() arguments, HFArchitecture fields). The
# shared pieces: `_llama_like` reads the Llama-style keys every rotary decoder uses.

def _rope(c: _Config):
    params = c.data.get("rope_parameters")
    params = params if isinstance(params, Mapping) else {}
    theta = c.number("rope_theta") or params.get("rope_theta") or _default_theta(c)
    scaling = c.data.get("rope_scaling")
    if not isinstance(scaling, Mapping):
        scaling = None
        if params.get("rope_type") not in (None, "default"):
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return {"rope_theta": theta, "rope_scaling": dict(scaling) if scaling else None}


def _default_theta(c: _Config):
    """The class's RoPE base when the config gives none (``default_theta``; Gemma 3 has one per
    attention type: the full-attention layers' ``global``)."""
    theta = c.default_theta
    if isinstance(theta, Mapping):
        theta = theta.get("global", theta.get("full_attention"))
    return theta


def _dtype(c: _Config):
    value = c.data.get("torch_dtype") or c.data.get("dtype")
    return str(value).replace("torch.", "") if value is not None else None


def _sliding(c: _Config, layers: int, *, default_all: bool = False):
    """(window, number of layers using it) from ``layer_types`` or the family's rule."""
    window = c.count("sliding_window", default=None, minimum=0) or None     # 0: no window
    types = c.data.get("layer_types")
    if isinstance(types, (list, tuple)) and types:
        n = sum(1 for t in types if t == "sliding_attention")
        return (window if n else None), n
    if window is None:
        return None, 0
    if "use_sliding_window" in c.data or c.model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if not c.flag("use_sliding_window", False):
            return None, 0
        first = c.count("max_window_layers", default=0, minimum=0)
        n = max(0, layers - first)
        return (window if n else None), n
    if default_all:
        return window, layers
    return None, 0


def _llama_like(c: _Config, *, tie_default: bool = False, head_dim_default: int | None = None,
                qkv_bias=None, out_bias=None, mlp_bias=None, norm: str = "rms",
                norms_per_layer: int = 2, qk_norm: str | None = None,
                sliding_all: bool = False, act_key: str = "hidden_act", attention_bias_default: bool = False):
    layers = c.count("num_hidden_layers")
    hidden = c.count("hidden_size")
    heads = c.count("num_attention_heads")
    kv_heads = c.count("num_key_value_heads", default=heads)
    if c.get("head_dim") is None and not head_dim_default and heads > hidden:
        raise InvalidInputError(f"{c.prefix}.num_attention_heads", heads, f"at most hidden_size={hidden}, or set head_dim",
                                "each head is hidden_size / num_attention_heads wide")
    head_dim = c.count("head_dim", default=head_dim_default or hidden // heads)
    vocab = c.count("vocab_size")
    ffn = c.count("intermediate_size")
    tied = c.flag("tie_word_embeddings", tie_default)
    attention_bias = c.flag("attention_bias", attention_bias_default)
    qkv_b = attention_bias if qkv_bias is None else qkv_bias
    out_b = attention_bias if out_bias is None else out_bias
    mlp_b = c.flag("mlp_bias", False) if mlp_bias is None else mlp_bias
    window, sliding_layers = _sliding(c, layers, default_all=sliding_all)
    workload = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=kv_heads,
                    head_dim=head_dim, vocab_size=vocab, ffn_dim=ffn, gated_mlp=True,
                    tied_embeddings=tied,
                    context_length=c.count("max_position_embeddings", default=None))
    counting = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=kv_heads,
                    head_dim=head_dim, vocab_size=vocab, ffn_dim=ffn, gated_mlp=True,
                    tied_embeddings=tied, norm=norm, norms_per_layer=norms_per_layer,
                    qkv_bias=qkv_b, attention_out_bias=out_b, mlp_bias=mlp_b,
                    qk_norm={None: False, "head": "head", "full": True}[qk_norm])
    arch = dict(norm=norm, norms_per_layer=norms_per_layer,
                norm_eps=c.number("rms_norm_eps", "layer_norm_eps"), qk_norm=qk_norm,
                qkv_bias=qkv_b, attention_out_bias=out_b, mlp_bias=mlp_b,
                hidden_act=c.raw(act_key) or c.raw("hidden_act"), position_embedding="rotary",
                rotary_fraction=c.number("partial_rotary_factor", default=1.0),
                attention_dropout=float(c.number("attention_dropout", default=0.0)),
                sliding_window=window, sliding_window_layers=sliding_layers, **_rope(c))
    return workload, counting, arch


def _llama(c):
    return _llama_like(c)


def _mistral(c):
    return _llama_like(c, qkv_bias=False, out_bias=False, mlp_bias=False, sliding_all=True)


def _qwen2(c):
    return _llama_like(c, qkv_bias=True, out_bias=False, mlp_bias=False)


def _qwen3(c):
    return _llama_like(c, head_dim_default=128, mlp_bias=False, qk_norm="head")


def _gemma(c):
    w, k, a = _llama_like(c, tie_default=True, head_dim_default=256, mlp_bias=False,
                          act_key="hidden_activation")
    a.update(embedding_scale=True)
    return w, k, a


def _gemma2(c):
    w, k, a = _llama_like(c, tie_default=True, head_dim_default=256, mlp_bias=False,
                          norms_per_layer=4, act_key="hidden_activation")
    layers = w["layers"]
    if c.data.get("layer_types") is None and a["sliding_window"] is None:     # (null: transformers fills it too)
        window = c.count("sliding_window", default=4096)
        a.update(sliding_window=window, sliding_window_layers=(layers + 1) // 2)
    a.update(embedding_scale=True, attn_logit_softcapping=c.number("attn_logit_softcapping"),
             final_logit_softcapping=c.number("final_logit_softcapping"),
             query_pre_attn_scalar=c.number("query_pre_attn_scalar", default=256))
    return w, k, a


def _gemma3_text(c):
    w, k, a = _llama_like(c, tie_default=True, head_dim_default=256, mlp_bias=False,
                          norms_per_layer=4, qk_norm="head", act_key="hidden_activation")
    layers = w["layers"]
    if c.data.get("layer_types") is None:      # omitted or null: transformers fills in the pattern
        pattern = c.count("sliding_window_pattern", default=6)
        window = c.count("sliding_window", default=4096)
        n = sum(1 for i in range(layers) if (i + 1) % pattern)
        a.update(sliding_window=window if n else None, sliding_window_layers=n)
    a.update(embedding_scale=True, attn_logit_softcapping=c.number("attn_logit_softcapping"),
             final_logit_softcapping=c.number("final_logit_softcapping"),
             query_pre_attn_scalar=c.number("query_pre_attn_scalar", default=256))
    return w, k, a


def _phi3(c):
    w, k, a = _llama_like(c, qkv_bias=False, out_bias=False, mlp_bias=False, sliding_all=True)
    a.update(fused_qkv=True, fused_gate_up=True,
             hidden_dropout=float(c.number("resid_pdrop", default=0.0)),
             embedding_dropout=float(c.number("embd_pdrop", default=0.0)))
    return w, k, a


def _olmo(c):
    w, k, a = _llama_like(c, mlp_bias=False, norm="none")
    a.update(norm_eps=None)
    return w, k, a


def _olmo2(c):
    # no input norm: the two norms sit after attention and after the MLP; QK-norm over all heads
    return _llama_like(c, mlp_bias=False, qk_norm="full")


def _gpt2(c):
    layers = c.count("n_layer", "num_hidden_layers")
    hidden = c.count("n_embd", "hidden_size")
    heads = c.count("n_head", "num_attention_heads")
    vocab = c.count("vocab_size")
    positions = c.count("n_positions", "max_position_embeddings")
    ffn = c.count("n_inner", default=4 * hidden)
    tied = c.flag("tie_word_embeddings", True)
    # GPT2LMHeadModel adds a cross-attention (and its LayerNorm) to every block when asked
    cross = (4 * hidden * hidden + 4 * hidden + 2 * hidden) if c.flag("add_cross_attention", False) else 0
    workload = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=heads,
                    head_dim=hidden // heads, vocab_size=vocab, ffn_dim=ffn, gated_mlp=False,
                    tied_embeddings=tied, context_length=positions)
    counting = dict(layers=layers, hidden_dim=hidden, heads=heads, vocab_size=vocab, ffn_dim=ffn,
                    gated_mlp=False, tied_embeddings=tied, norm="layer", qkv_bias=True,
                    attention_out_bias=True, mlp_bias=True, position_embeddings=positions,
                    extra_per_layer=cross)
    arch = dict(norm="layer", norms_per_layer=2, norm_eps=c.number("layer_norm_epsilon"),
                qkv_bias=True, attention_out_bias=True, mlp_bias=True, fused_qkv=True,
                hidden_act=c.raw("activation_function", "gelu_new"), position_embedding="learned",
                attention_dropout=float(c.number("attn_pdrop", default=0.1)),
                hidden_dropout=float(c.number("resid_pdrop", default=0.1)),
                embedding_dropout=float(c.number("embd_pdrop", default=0.1)))
    return workload, counting, arch


def _gpt_neox(c):
    layers = c.count("num_hidden_layers")
    hidden = c.count("hidden_size")
    heads = c.count("num_attention_heads")
    vocab = c.count("vocab_size")
    ffn = c.count("intermediate_size")
    tied = c.flag("tie_word_embeddings", False)
    bias = c.flag("attention_bias", True)
    rope = _rope(c)
    params = c.data.get("rope_parameters") if isinstance(c.data.get("rope_parameters"), Mapping) else {}
    fraction = c.number("rotary_pct", "partial_rotary_factor",
                        default=params.get("partial_rotary_factor", 0.25))
    if rope["rope_theta"] is None:
        rope["rope_theta"] = c.number("rotary_emb_base", default=10000)
    workload = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=heads,
                    head_dim=hidden // heads, vocab_size=vocab, ffn_dim=ffn, gated_mlp=False,
                    tied_embeddings=tied, context_length=c.count("max_position_embeddings", default=None))
    counting = dict(layers=layers, hidden_dim=hidden, heads=heads, vocab_size=vocab, ffn_dim=ffn,
                    gated_mlp=False, tied_embeddings=tied, norm="layer", qkv_bias=bias,
                    attention_out_bias=bias, mlp_bias=True)
    arch = dict(norm="layer", norms_per_layer=2, norm_eps=c.number("layer_norm_eps"),
                qkv_bias=bias, attention_out_bias=bias, mlp_bias=True, fused_qkv=True,
                hidden_act=c.raw("hidden_act", "gelu"), position_embedding="rotary",
                rotary_fraction=fraction, parallel_residual=c.flag("use_parallel_residual", True),
                attention_dropout=float(c.number("attention_dropout", default=0.0)),
                hidden_dropout=float(c.number("hidden_dropout", default=0.0)), **rope)
    return workload, counting, arch


def _falcon(c):
    layers = c.count("num_hidden_layers", "n_layer")
    hidden = c.count("hidden_size", "n_embed")
    heads = c.count("num_attention_heads", "n_head")
    vocab = c.count("vocab_size")
    new_arch = c.flag("new_decoder_architecture", False)
    if new_arch:
        kv_heads = c.count("num_kv_heads", "n_head_kv", default=heads)
    elif c.flag("multi_query", True):
        kv_heads = 1
    else:
        kv_heads = heads
    ffn = c.count("ffn_hidden_size", default=4 * hidden)
    bias = c.flag("bias", False)
    tied = c.flag("tie_word_embeddings", True)
    parallel = c.flag("parallel_attn", True)
    n_ln = c.count("num_ln_in_parallel_attn", default=2 if new_arch else 1)
    norms = 2 if (not parallel or n_ln == 2) else 1
    alibi = c.flag("alibi", False)
    workload = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=kv_heads,
                    head_dim=hidden // heads, vocab_size=vocab, ffn_dim=ffn, gated_mlp=False,
                    tied_embeddings=tied, context_length=c.count("max_position_embeddings", default=None))
    counting = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=kv_heads, vocab_size=vocab,
                    ffn_dim=ffn, gated_mlp=False, tied_embeddings=tied, norm="layer",
                    norms_per_layer=norms, qkv_bias=bias, attention_out_bias=bias, mlp_bias=bias)
    arch = dict(norm="layer", norms_per_layer=norms, norm_eps=c.number("layer_norm_epsilon"),
                qkv_bias=bias, attention_out_bias=bias, mlp_bias=bias, fused_qkv=True,
                hidden_act=c.raw("activation", "gelu"),
                position_embedding="alibi" if alibi else "rotary",
                rotary_fraction=None if alibi else 1.0, parallel_residual=parallel,
                attention_dropout=float(c.number("attention_dropout", default=0.0)),
                hidden_dropout=float(c.number("hidden_dropout", default=0.0)),
                **({"rope_theta": None, "rope_scaling": None} if alibi else _rope(c)))
    return workload, counting, arch


def _moe_layers(c: _Config, layers: int, experts: int):
    """How many blocks have a sparse MLP: Qwen's ``mlp_only_layers`` and ``decoder_sparse_step``."""
    if experts == 0:
        return 0
    only_dense = set(c.int_list("mlp_only_layers"))
    step = c.count("decoder_sparse_step", default=1)
    return sum(1 for i in range(layers) if i not in only_dense and (i + 1) % step == 0)


def _top_k(c: _Config, experts: int) -> int:
    """``num_experts_per_tok``: each token's experts, at most the experts there are."""
    top_k = c.count("num_experts_per_tok")
    if top_k > experts:
        key = next((k for k in ("num_local_experts", "num_experts", "n_routed_experts")
                    if c.data.get(k) is not None), "num_experts")
        raise InvalidInputError(f"{c.prefix}.num_experts_per_tok", top_k, f"at most {key}={experts}",
                                "a token is routed to top-k of the experts" + c.whence("num_experts_per_tok"))
    return top_k


def _mixtral(c):
    w, k, a = _llama_like(c, qkv_bias=False, out_bias=False, mlp_bias=False, sliding_all=True)
    experts = c.count("num_local_experts", "num_experts")
    top_k = _top_k(c, experts)
    w.update(experts=experts, active_experts_per_token=top_k, shared_experts=0,
             expert_ffn_dim=w["ffn_dim"])
    k.update(experts=experts, active_experts_per_token=top_k, expert_ffn_dim=w["ffn_dim"])
    a.update(moe_layers=w["layers"])
    return w, k, a


def _qwen_moe(c, *, shared: bool, qk_norm=None):
    if shared:
        w, k, a = _llama_like(c, qkv_bias=c.flag("qkv_bias", True), out_bias=False, mlp_bias=False)
    else:
        w, k, a = _llama_like(c, head_dim_default=128, mlp_bias=False, qk_norm="head")
    layers = w["layers"]
    experts = c.count("num_experts", "num_local_experts", minimum=0)
    top_k = _top_k(c, experts) if experts else c.count("num_experts_per_tok")
    expert_ffn = c.count("moe_intermediate_size")
    moe_layers = _moe_layers(c, layers, experts)
    a.update(moe_layers=moe_layers, dense_layers=layers - moe_layers,
             norm_topk_prob=c.flag("norm_topk_prob", False))
    if moe_layers == 0:            # every block dense: an ordinary transformer
        return w, k, a
    shared_ffn = c.count("shared_expert_intermediate_size", minimum=0) if shared else 0
    n_shared = 1 if shared_ffn else 0
    # the workload's shared_experts counts experts of expert_ffn_dim's width
    shared_workload = (shared_ffn // expert_ffn if shared_ffn % expert_ffn == 0 else 1) if n_shared else 0
    w.update(experts=experts, active_experts_per_token=top_k, shared_experts=shared_workload,
             expert_ffn_dim=expert_ffn)
    if moe_layers == layers:       # the catalog's convention: no dense MLP, ffn_dim = expert width
        w["ffn_dim"] = expert_ffn
    k.update(experts=experts, active_experts_per_token=top_k, expert_ffn_dim=expert_ffn,
             dense_layers=layers - moe_layers, shared_experts=1 if shared else 0,
             shared_expert_ffn_dim=shared_ffn if shared else None, shared_expert_gate=shared)
    a.update(shared_expert_ffn_dim=shared_ffn or None, shared_expert_gate=shared)
    return w, k, a


def _qwen2_moe(c):
    return _qwen_moe(c, shared=True)


def _qwen3_moe(c):
    return _qwen_moe(c, shared=False)


def _first_k_moe(c: _Config, w, k, a, *, first_k_default: int, shared_default: int,
                 expert_bias: bool = False):
    """DeepSeek / GLM-4.5 MoE blocks: the first ``first_k_dense_replace`` blocks have a dense
    MLP of ``intermediate_size``, the others ``n_routed_experts`` routed experts of
    ``moe_intermediate_size``, a router without bias (``e_score_correction_bias`` is a buffer in
    transformers 5.23, not a parameter) and one shared MLP of ``n_shared_experts x
    moe_intermediate_size`` (as many parameters as that many experts). transformers builds
    ``DecoderLayer.mlp`` as MoE for ``layer_idx >= first_k_dense_replace`` (modeling_deepseek_v3.py)."""
    layers = w["layers"]
    experts = c.count("n_routed_experts", "num_local_experts", "num_experts")
    top_k = _top_k(c, experts)
    expert_ffn = c.count("moe_intermediate_size")
    shared = c.count("n_shared_experts", default=shared_default, minimum=0)
    first_k = c.count("first_k_dense_replace", default=first_k_default, minimum=0)
    dense_layers = min(first_k, layers)
    moe_layers = layers - dense_layers
    a.update(moe_layers=moe_layers, dense_layers=dense_layers,
             norm_topk_prob=c.flag("norm_topk_prob", a.pop("_norm_topk_default", False)),
             shared_expert_ffn_dim=(shared * expert_ffn) or None)
    if moe_layers == 0:            # every block dense: an ordinary transformer
        return w, k, a
    w.update(experts=experts, active_experts_per_token=top_k, shared_experts=shared,
             expert_ffn_dim=expert_ffn)
    if dense_layers == 0:          # the catalog's convention: no dense MLP, ffn_dim = expert width
        w["ffn_dim"] = expert_ffn
    k.update(experts=experts, active_experts_per_token=top_k, expert_ffn_dim=expert_ffn,
             dense_layers=dense_layers, shared_experts=shared)
    return w, k, a


def _deepseek(c, *, v3: bool):
    """DeepSeek-V2 / V3 (and Kimi K2, a V3): MLA attention, first-k dense then MoE blocks.

    MLA (modeling_deepseek_v3.py, DeepseekV3Attention): ``q_proj`` (hidden -> heads x
    (qk_nope + qk_rope)) or, with ``q_lora_rank``, ``q_a_proj`` + ``q_a_layernorm`` +
    ``q_b_proj``; ``kv_a_proj_with_mqa`` (hidden -> kv_lora_rank + qk_rope), ``kv_a_layernorm``,
    ``kv_b_proj`` (kv_lora_rank -> heads x (qk_nope + v_head_dim)) and ``o_proj``.
    ``attention_bias`` biases ``q_a_proj``, ``kv_a_proj_with_mqa`` and ``o_proj`` only.
    The MTP modules (``num_nextn_predict_layers``) are not built by ``AutoModelForCausalLM``
    (transformers ignores their weights, ``model.layers.61.*``), so they are not counted."""
    layers = c.count("num_hidden_layers")
    hidden = c.count("hidden_size")
    heads = c.count("num_attention_heads")
    vocab = c.count("vocab_size")
    ffn = c.count("intermediate_size")
    if "q_lora_rank" not in c.data and (c.defaults or {}).get("q_lora_rank") is None:
        raise c._missing("q_lora_rank")          # null (no query compression) must be said
    q_lora = c.count("q_lora_rank", default=None)
    kv_lora = c.count("kv_lora_rank")
    nope, rope_dim, v_dim = (c.count("qk_nope_head_dim"), c.count("qk_rope_head_dim"),
                             c.count("v_head_dim"))
    tied = c.flag("tie_word_embeddings", False)
    bias = c.flag("attention_bias", False)
    mlp_bias = c.flag("mlp_bias", False) if not v3 else False     # V2 only: dense and shared MLPs
    qk_dim = nope + rope_dim
    # every head gets its own keys and values (kv_b_proj): kv_heads = heads, keys qk_dim wide
    workload = dict(layers=layers, hidden_dim=hidden, heads=heads, kv_heads=heads, head_dim=qk_dim,
                    vocab_size=vocab, ffn_dim=ffn, gated_mlp=True, tied_embeddings=tied,
                    context_length=c.count("max_position_embeddings", default=None),
                    kv_lora_rank=kv_lora, qk_rope_head_dim=rope_dim)
    mla_bias = ((q_lora or 0) + kv_lora + rope_dim + hidden) if bias else 0
    counting = dict(layers=layers, hidden_dim=hidden, heads=heads, vocab_size=vocab, ffn_dim=ffn,
                    gated_mlp=True, tied_embeddings=tied, norm="rms", kv_lora_rank=kv_lora,
                    q_lora_rank=q_lora, qk_nope_head_dim=nope, qk_rope_head_dim=rope_dim,
                    v_head_dim=v_dim, extra_per_layer=mla_bias)
    arch = dict(norm="rms", norms_per_layer=2, norm_eps=c.number("rms_norm_eps"),
                qkv_bias=bias, attention_out_bias=bias, mlp_bias=mlp_bias, mla=True,
                hidden_act=c.raw("hidden_act"), position_embedding="rotary", rotary_fraction=1.0,
                attention_dropout=float(c.number("attention_dropout", default=0.0)),
                mtp_layers_not_built=c.count("num_nextn_predict_layers", "num_mtp_layers",
                                             default=0, minimum=0),
                _norm_topk_default=v3, **_rope(c))
    w, k, a = _first_k_moe(c, workload, counting, arch, first_k_default=3 if v3 else 0,
                           shared_default=1 if v3 else 2)
    if mlp_bias:       # DeepseekV2MLP biases: the dense MLPs and the shared MLP, not the experts
        dense, moe = a["dense_layers"], a["moe_layers"]
        shared_ffn = a["shared_expert_ffn_dim"] or 0
        k["extra_parameters"] = dense * (2 * ffn + hidden) + moe * (2 * shared_ffn + hidden)
    return w, k, a


def _deepseek_v2(c):
    return _deepseek(c, v3=False)


def _deepseek_v3(c):
    return _deepseek(c, v3=True)


def _glm4_moe(c):
    """GLM-4.5 (modeling_glm4_moe.py): Llama-style GQA with q/k/v biases (``attention_bias``),
    an unbiased ``o_proj``, optional per-head QK-norm (``use_qk_norm``), partial RoPE (0.5 by
    default) and DeepSeek-V3's MoE blocks. MTP layers (``num_nextn_predict_layers``) are not
    built by ``AutoModelForCausalLM``."""
    qk = "head" if c.flag("use_qk_norm", False) else None
    w, k, a = _llama_like(c, out_bias=False, mlp_bias=False, qk_norm=qk)
    params = c.data.get("rope_parameters") if isinstance(c.data.get("rope_parameters"), Mapping) else {}
    a.update(rotary_fraction=c.number("partial_rotary_factor",
                                      default=params.get("partial_rotary_factor", 0.5)),
             mtp_layers_not_built=c.count("num_nextn_predict_layers", "num_mtp_layers",
                                          default=0, minimum=0),
             _norm_topk_default=True)
    return _first_k_moe(c, w, k, a, first_k_default=1, shared_default=1)


def _gpt_oss(c):
    """gpt-oss (modeling_gpt_oss.py): every block MoE; q/k/v/o biases (``attention_bias``,
    true by default), one attention-sink logit per head (``sinks``), a router with a bias,
    experts with biases (``gate_up_proj_bias``, ``down_proj_bias``), sliding-window attention
    on alternate layers (``layer_types``; by default the even-indexed ones)."""
    w, k, a = _llama_like(c, head_dim_default=64, mlp_bias=True, attention_bias_default=True)
    layers, heads = w["layers"], w["heads"]
    experts = c.count("num_local_experts", "num_experts")
    top_k = _top_k(c, experts)
    ffn = w["ffn_dim"]
    if not isinstance(c.data.get("layer_types"), (list, tuple)):
        window = c.count("sliding_window", default=128, minimum=0) or None
        n = (layers + 1) // 2 if window else 0
        a.update(sliding_window=window if n else None, sliding_window_layers=n)
    w.update(experts=experts, active_experts_per_token=top_k, shared_experts=0, expert_ffn_dim=ffn)
    k.update(experts=experts, active_experts_per_token=top_k, expert_ffn_dim=ffn, router_bias=True,
             extra_per_layer=heads)      # sinks: one parameter per head
    a.update(moe_layers=layers, router_bias=True, attention_sinks=True)
    return w, k, a


def _llama4_text(c):
    """Llama 4's language model (modeling_llama4.py): MoE blocks (``moe_layers``, else every
    ``interleave_moe_layer_step``-th) with ``num_local_experts`` routed experts and one shared
    expert, all ``intermediate_size`` wide, and a router without bias; dense blocks use
    ``intermediate_size_mlp``. The QK-norm is an L2 norm without parameters (``use_qk_norm``,
    on the RoPE layers only: ``no_rope_layers``)."""
    w, k, a = _llama_like(c, head_dim_default=128, mlp_bias=False)
    layers = w["layers"]
    experts = c.count("num_local_experts", "num_experts")
    top_k = _top_k(c, experts)
    expert_ffn = w["ffn_dim"]
    listed = c.data.get("moe_layers")
    if listed is not None:
        chosen = set(c.int_list("moe_layers"))
    else:
        step = c.count("interleave_moe_layer_step", default=1)
        chosen = set(range(step - 1, layers, step))
    moe_layers = sum(1 for i in range(layers) if i in chosen)
    dense_layers = layers - moe_layers
    dense_ffn = c.count("intermediate_size_mlp") if dense_layers else None
    a.update(moe_layers=moe_layers, dense_layers=dense_layers,
             qk_norm="l2" if c.flag("use_qk_norm", True) else None)
    if moe_layers == 0:
        w["ffn_dim"] = k["ffn_dim"] = dense_ffn
        return w, k, a
    w.update(experts=experts, active_experts_per_token=top_k, shared_experts=1, expert_ffn_dim=expert_ffn,
             ffn_dim=dense_ffn or expert_ffn)
    k.update(experts=experts, active_experts_per_token=top_k, expert_ffn_dim=expert_ffn, shared_experts=1,
             dense_layers=dense_layers, ffn_dim=dense_ffn or expert_ffn)
    a.update(shared_expert_ffn_dim=expert_ffn)
    return w, k, a


def _ministral(c):
    # MinistralForCausalLM / Ministral3ForCausalLM: Mistral's blocks; the window where layer_types
    # says, else (a sliding_window without layer_types) in every layer, as transformers builds them
    return _llama_like(c, qkv_bias=False, out_bias=False, mlp_bias=False, sliding_all=True)


_FAMILIES: dict[str, Callable] = {
    "llama": _llama, "mistral": _mistral, "qwen2": _qwen2, "qwen3": _qwen3,
    "gemma": _gemma, "gemma2": _gemma2, "gemma3_text": _gemma3_text, "phi3": _phi3,
    "gpt2": _gpt2, "gpt_neox": _gpt_neox, "falcon": _falcon, "olmo": _olmo, "olmo2": _olmo2,
    "mixtral": _mixtral, "qwen2_moe": _qwen2_moe, "qwen3_moe": _qwen3_moe,
    "deepseek_v2": _deepseek_v2, "deepseek_v3": _deepseek_v3, "glm4_moe": _glm4_moe,
    "gpt_oss": _gpt_oss, "llama4_text": _llama4_text, "ministral": _ministral, "ministral3": _ministral,
}

# Config model_types read as another: Kimi K2's config.json says "kimi_k2" (its own remote code,
# architectures DeepseekV3ForCausalLM); transformers 5.23 has no kimi_k2 type.
_ALIASES = {"kimi_k2": "deepseek_v3"}

# Multimodal configs whose language model is their text_config: read that, as its own type
# (the default type of each text_config in transformers 5.23's config classes).
_NESTED = {"gemma3": "gemma3_text", "llama4": "llama4_text", "mistral3": "mistral"}

# The config.json model_types read, and the architectures the workloads get (no multimodal
# wrapper or alias: gemma3 -> gemma3_text, kimi_k2 -> deepseek_v3).
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(sorted({*_FAMILIES, *_ALIASES, *_NESTED}))
ARCHITECTURES: tuple[str, ...] = tuple(sorted(_FAMILIES))


def _model_type(data, where: str, allowed) -> str:
    model_type = data.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise InvalidInputTypeError(f"{where}.model_type", model_type, f"one of {', '.join(allowed)}",
                                    f"a string, got {type(model_type).__name__}")
    if model_type is None:
        raise InvalidInputError(f"{where}.model_type", None, f"one of {', '.join(allowed)}",
                                "config.json has no model_type")
    if model_type not in allowed:
        raise InvalidInputError(f"{where}.model_type", model_type, f"one of {', '.join(allowed)}",
                                "no exact parameter count for this family yet")
    return model_type


def _read(config, taken: dict | None = None):
    """(outer config, the language model's config, its key prefix, workload fields, count, arch);
    ``taken`` (a dict) gets the transformers defaults applied (``defaults_applied``)."""
    data = load_hf_config(config)
    outer_type = _model_type(data, "config", SUPPORTED_MODEL_TYPES)
    text, prefix = data, "config"
    if outer_type in _NESTED:
        text, prefix = data.get("text_config"), "config.text_config"
        if not isinstance(text, Mapping):
            raise InvalidInputError(prefix, text, "an object: the language model's config",
                                    f"a {outer_type!r} config.json keeps its language model there")
        text = dict(text)
        if text.get("model_type") is None:     # the type the outer class reads a text_config as
            text["model_type"] = _NESTED[outer_type]
        model_type = _model_type(text, prefix, tuple(sorted(_FAMILIES)))
        entry = transformers_defaults(model_type)
    else:
        model_type = _ALIASES.get(outer_type, outer_type)
        entry = transformers_defaults(outer_type)      # kimi_k2: none (no transformers class)
    c = _Config(text, model_type, prefix, entry, config_type=text.get("model_type") if text is not data else outer_type)
    workload, counting, arch = _FAMILIES[model_type](c)
    if workload["hidden_dim"] % workload["heads"] and model_type in ("gpt2", "gpt_neox", "falcon", "deepseek_v2"):
        key = next((k for k in ("num_attention_heads", "n_head") if c.given(k)), "num_attention_heads")
        raise InvalidInputError(f"{prefix}.{key}", workload["heads"],
                                f"a divisor of the hidden size {workload['hidden_dim']}", c.whence(key).strip() or None)
    if workload["kv_heads"] > workload["heads"] or workload["heads"] % workload["kv_heads"]:
        raise InvalidInputError(f"{prefix}.num_key_value_heads", workload["kv_heads"],
                                f"a divisor of num_attention_heads={workload['heads']}"
                                + c.whence("num_attention_heads"), c.whence("num_key_value_heads").strip() or None)
    count = count_parameters(**counting)
    if count.total > _checks.MAX_COUNT:
        _blame_oversized(text, prefix, workload, count.total)
    hidden, vocab = workload["hidden_dim"], workload["vocab_size"]
    positions = counting.get("position_embeddings", 0)
    arch.setdefault("torch_dtype", _dtype(c) or _dtype(_Config(data, outer_type)))
    arch.update(model_type=model_type, embedding_parameters=(vocab + positions) * hidden,
                lm_head_parameters=0 if workload["tied_embeddings"] else vocab * hidden,
                config_model_type=outer_type if outer_type != model_type else None,
                quantization=_quantization(data, text, prefix, model_type, workload["layers"]))
    if taken is not None:
        taken.update({f"{prefix}.{key}": value for key, value in c.defaulted.items()})
    return data, text, prefix, workload, count, HFArchitecture(**arch)


# --- quantized checkpoints ------------------------------------------------------------------------
#
# A config.json's quantization_config says how the checkpoint's weights are stored. The measured
# profile models two kinds, and every other is refused by name (never read as the unquantized model):
#
# * bitsandbytes 4-bit (nf4, fp4) and 8-bit (LLM.int8): the storage mlsysim_core.finetune counts for
#   QLoRA (packed codes, absmax, nested statistics, code tables; int8 weights and row scales) and the
#   4-bit dequantization transient of measured/lora.py. Such a checkpoint trains only adapters: with
#   lora= it is QLoRA (measured.lora.lora_option applies the checkpoint's quantization); full training
#   is refused (finetune.check_checkpoint_quantization).
# * mxfp4, gpt-oss's own: transformers trains it on weights dequantized to bf16 (the gpt_oss family's
#   check says so, and refuses sub-16-bit weights).

QUANTIZATION_METHODS = ("bitsandbytes", "mxfp4")
_LINEAR_PATHS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                 "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
_GPT2_PATHS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
_ALLOWED_QUANTIZATION = ("a bitsandbytes checkpoint (load_in_4bit with bnb_4bit_quant_type 'nf4' or 'fp4', or "
                         "load_in_8bit), fine-tuned with LoRA (QLoRA); an 'mxfp4' gpt-oss checkpoint (trained on its "
                         "weights dequantized to bf16); or no quantization_config (the model in its own dtype)")


def _quantization(data, text, prefix, model_type, layers) -> dict | None:
    """The checkpoint's quantization, read from ``quantization_config`` (the outer config's, or
    the language model's): a dict (``method`` and what the measured profile models) or None.
    Methods the measured profile cannot model are refused with ``NotModelledError``."""
    q, where = data.get("quantization_config"), "config.quantization_config"
    if q is None and text is not data:
        q, where = text.get("quantization_config"), f"{prefix}.quantization_config"
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise InvalidInputTypeError(where, q, "an object (a transformers quantization config)",
                                    f"got {type(q).__name__}")
    table = _defaults_table()["quantization"]
    method = q.get("quant_method")
    if q.get("load_in_4bit") is True or q.get("load_in_8bit") is True:
        method = "bitsandbytes"        # transformers' AutoQuantizationConfig: the load flags decide
    if method is None:
        raise InvalidInputError(f"{where}.quant_method", None, f"one of {', '.join(table['methods'])}",
                                "a quantization_config without quant_method (or a bitsandbytes load_in_4bit / "
                                "load_in_8bit) does not say how the weights are stored")
    if not isinstance(method, str):
        raise InvalidInputTypeError(f"{where}.quant_method", method, "a string", f"got {type(method).__name__}")
    if method not in table["methods"]:
        raise InvalidInputError(f"{where}.quant_method", method,
                                f"one of transformers {TRANSFORMERS_VERSION}'s: {', '.join(table['methods'])}",
                                "an unknown quantization method")
    if method == "mxfp4" and model_type == "gpt_oss":
        return {"method": "mxfp4"}
    if method != "bitsandbytes":
        raise NotModelledError(
            f"{where}.quant_method", method, _ALLOWED_QUANTIZATION,
            f"the measured profile has no formula for {method!r} weights (their storage, scales and dequantization); "
            "never costed as the unquantized model. Without quantization_config the config is read as the model in "
            "its own dtype (full training, or LoRA of the 16-bit base)")
    return _bitsandbytes(q, where, table["bitsandbytes"], layers)


def _bitsandbytes(q, where, spec, layers) -> dict:
    """A bitsandbytes quantization_config, its omitted keys at BitsAndBytesConfig's defaults."""
    cfg = dict(spec["defaults"])
    cfg.update((k, v) for k, v in q.items() if k in cfg)

    def flag(key):
        if not isinstance(cfg[key], bool):
            raise InvalidInputError(f"{where}.{key}", cfg[key], "true or false")
        return cfg[key]

    four, eight = flag("load_in_4bit"), flag("load_in_8bit")
    if four and eight:
        raise InvalidInputError(f"{where}.load_in_8bit", True, "false when load_in_4bit is true",
                                "BitsAndBytesConfig refuses both: a checkpoint is 4-bit or 8-bit")
    if not (four or eight):
        raise InvalidInputError(f"{where}.load_in_4bit", cfg["load_in_4bit"],
                                "true (or load_in_8bit true) for quant_method 'bitsandbytes'",
                                "neither load_in_4bit nor load_in_8bit: transformers cannot tell the bit width")
    skipped = cfg["llm_int8_skip_modules"] or []
    if not isinstance(skipped, (list, tuple)) or not all(isinstance(m, str) for m in skipped):
        raise InvalidInputError(f"{where}.llm_int8_skip_modules", skipped, "a list of module names, or null")
    paths = [f"{base}.{i}.{part}" for i in range(layers)
             for base, parts in (("model.layers", _LINEAR_PATHS), ("model.language_model.layers", _LINEAR_PATHS),
                                 ("transformer.h", _GPT2_PATHS)) for part in parts]
    for name in skipped:            # transformers keeps a module unquantized when a listed name is in its path
        hit = next((path for path in paths if name in path), None)
        if hit is not None:
            raise NotModelledError(
                f"{where}.llm_int8_skip_modules", name,
                "modules outside the decoder blocks' linears (lm_head, a vision tower, a projector), or null",
                f"{name!r} keeps linears of the decoder blocks unquantized ({hit}, ...): the measured profile's "
                "QLoRA quantizes every linear of the blocks, and a checkpoint that mixes 16-bit and quantized "
                "block linears is not modelled")
    out = {"method": "bitsandbytes"}
    if eight:
        if flag("llm_int8_has_fp16_weight"):
            raise NotModelledError(f"{where}.llm_int8_has_fp16_weight", True, "false (int8 weights)",
                                   "LLM.int8 with fp16 weights keeps a 16-bit copy of every weight beside the "
                                   "int8 one for training: not modelled")
        out.update(quantization="int8")
        return out
    quant_type = cfg["bnb_4bit_quant_type"]
    if quant_type not in ("nf4", "fp4"):
        raise InvalidInputError(f"{where}.bnb_4bit_quant_type", quant_type, "'nf4' or 'fp4'")
    storage = cfg["bnb_4bit_quant_storage"] or "uint8"
    if storage != "uint8":
        raise NotModelledError(f"{where}.bnb_4bit_quant_storage", storage, "'uint8' (bitsandbytes' default), or null",
                               "the 4-bit storage modelled (and measured) packs two codes a byte in uint8 tensors; "
                               "another storage dtype (FSDP-QLoRA's) is not modelled")
    out.update(quantization=quant_type, double_quant=flag("bnb_4bit_use_double_quant"),
               quant_blocksize=64, compute_dtype=str(cfg["bnb_4bit_compute_dtype"] or "float32").replace("torch.", ""))
    return out


def checkpoint_quantization(model) -> dict | None:
    """The quantization of the checkpoint a workload was imported from (``from_hf_config``
    records it as ``details["quantization"]``): ``{"method": "bitsandbytes", "quantization":
    "nf4" | "fp4" | "int8", "double_quant": ..., "quant_blocksize": 64, "compute_dtype": ...}``,
    ``{"method": "mxfp4"}`` (gpt-oss), or None for an unquantized model."""
    details = getattr(model, "details", None) or {}
    q = details.get("quantization")
    return dict(q) if isinstance(q, Mapping) else None


def defaults_applied(config) -> dict:
    """The transformers defaults ``from_hf_config`` applies to ``config``: ``{key: value}`` for each
    field of the model type's transformers config class that the config leaves out (not even
    null) and the reader takes (``hf_defaults.json``'s value, or the class's rule where it declares
    None: ``num_key_value_heads`` is ``num_attention_heads``), keys named as in errors
    (``config.intermediate_size``, ``config.text_config.head_dim``), in the order read. Empty
    for a config that gives every field read, and for a type transformers has no class for."""
    taken: dict = {}
    _read(config, taken)
    return taken


def defaults_note(config) -> str | None:
    """What ``defaults_applied`` found, as a note (None: nothing applied): the fields left out and
    the values taken, naming the transformers version and config class they come from."""
    taken = defaults_applied(config)
    if not taken:
        return None
    data = load_hf_config(config)
    text = data.get("text_config") if isinstance(data.get("text_config"), Mapping) else data
    model_type = text.get("model_type") or data.get("model_type")
    entry = transformers_defaults(model_type) or transformers_defaults(data.get("model_type")) or {}
    source = f"transformers {TRANSFORMERS_VERSION}'s {entry.get('config_class') or model_type} defaults"
    return (f"the config.json leaves out {len(taken)} field{'s' if len(taken) > 1 else ''} the model is read from; "
            f"{source} taken: " + ", ".join(f"{key.split('.')[-1]}={value!r}" for key, value in taken.items())
            + " (give them in the config.json if the model differs)")


def architecture_of(config) -> HFArchitecture:
    """The architecture facts of a ``config.json`` (dict, path or transformers config)."""
    return _read(config)[5]


def from_hf_config(config, *, name: str | None = None) -> TransformerWorkload | SparseTransformerWorkload:
    """A workload from a Hugging Face ``config.json``: a dict, a path (file or directory) or
    a transformers config object. ``parameters`` is exact (``sum(p.numel())`` of
    ``AutoModelForCausalLM.from_config``); a mixture of experts also gets
    ``active_parameters`` (embeddings, router and shared experts in full, ``top-k`` of the
    routed experts). Raises ``InvalidInputError`` for an unsupported ``model_type`` or a
    missing size."""
    data, text, prefix, workload, count, arch = _read(config)
    if name is None:
        name = data.get("_name_or_path")
        if name is not None and not isinstance(name, str):
            raise InvalidInputTypeError("config._name_or_path", name, "a string (the model's name)",
                                        f"got {type(name).__name__}")
        name = name if name and name.strip() else data["model_type"]   # "" (a config made from scratch)
    if not isinstance(name, str):
        raise InvalidInputTypeError("name", name, "a non-empty string", f"got {type(name).__name__}")
    if not name.strip():
        raise InvalidInputError("name", name, "a non-empty string")
    fields = dict(workload, name=name, parameters=count.total, architecture=arch.model_type,
                  details=details_of(text, arch))
    try:
        if "experts" in workload:
            return SparseTransformerWorkload(active_parameters=count.active, **fields)
        return TransformerWorkload(**fields)
    except InvalidInputError as err:     # name the config.json key the bad field came from
        field = err.parameter.rpartition(".")[2]
        keys = [k for k in _CONFIG_KEYS.get(field, ()) if text.get(k) is not None]
        if not keys:
            raise
        raise InvalidInputError(f"{prefix}.{keys[0]}", text[keys[0]], err.allowed,
                                err.detail or f"it gives the workload's {field}") from err


# Config keys an architecture family may read, copied verbatim into ``workload.details`` when
# present (beside the ``HFArchitecture`` facts that differ from their defaults).
RAW_DETAIL_KEYS = (
    "layer_types", "sliding_window", "sliding_window_pattern", "attention_chunk_size", "no_rope_layers",
    "no_rope_layer_interval", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
    "v_head_dim", "first_k_dense_replace", "moe_layer_freq", "n_shared_experts", "n_routed_experts",
    "n_group", "topk_group", "topk_method", "moe_intermediate_size", "interleave_moe_layer_step",
    "intermediate_size_mlp", "num_local_experts", "num_experts_per_tok", "shared_expert_intermediate_size",
    "decoder_sparse_step", "mlp_only_layers", "partial_rotary_factor", "rotary_pct", "use_parallel_residual",
    "parallel_attn", "new_decoder_architecture", "multi_query", "num_kv_heads", "attention_bias", "mlp_bias",
    "head_dim", "query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
    "router_aux_loss_coef", "swiglu_limit", "quantization_config", "torch_dtype", "dtype",
    "num_nextn_predict_layers", "routed_scaling_factor", "scoring_func", "rope_interleave", "use_qk_norm",
    "attn_temperature_tuning", "floor_scale", "attn_scale", "rope_local_base_freq", "router_jitter_noise")


def details_of(data: Mapping[str, Any], arch: HFArchitecture) -> dict:
    """What ``workload.details`` holds for a config: the ``HFArchitecture`` facts that differ
    from their defaults, and the config's ``RAW_DETAIL_KEYS`` that are present (not None)."""
    out = {a.name: getattr(arch, a.name) for a in attrs.fields(HFArchitecture)
           if a.default is attrs.NOTHING or getattr(arch, a.name) != a.default}
    out.update((k, data[k]) for k in RAW_DETAIL_KEYS if data.get(k) is not None)
    return out


# A generous size of each shape (for blaming the key that makes a parameter count overflow).
_TYPICAL = {"layers": 128, "hidden_dim": 16384, "heads": 128, "kv_heads": 128, "head_dim": 256,
            "vocab_size": 262144, "ffn_dim": 65536, "experts": 256, "expert_ffn_dim": 65536}


def _blame_oversized(data, prefix, workload, total):
    """The shapes imply more than 2**53 parameters: name the config key furthest beyond a
    real model's size (each key alone is at most ``MAX_SIZE``; their product is not)."""
    ratios = sorted(((workload[f] or 0) / typical, f) for f, typical in _TYPICAL.items()
                    if workload.get(f) is not None and (f != "head_dim" or data.get("head_dim") is not None))
    for _, field in reversed(ratios):
        keys = [k for k in _CONFIG_KEYS.get(field, ()) if data.get(k) is not None]
        if keys:
            key = keys[0]
            raise InvalidInputError(
                f"{prefix}.{key}", data[key], f"a size whose model has at most {_checks.MAX_COUNT:,} parameters",
                f"the sizes imply {total:,} parameters; {key} is the furthest beyond a real model's")
    raise InvalidInputError(prefix, "<config.json>", f"sizes of a model with at most {_checks.MAX_COUNT:,} parameters",
                            f"the sizes imply {total:,} parameters")


# The config.json keys each workload field is read from (for errors).
_CONFIG_KEYS = {
    "layers": ("num_hidden_layers", "n_layer"), "hidden_dim": ("hidden_size", "n_embd"),
    "heads": ("num_attention_heads", "n_head"), "kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "head_dim": ("head_dim", "num_attention_heads"), "vocab_size": ("vocab_size",),
    "ffn_dim": ("intermediate_size", "n_inner", "ffn_hidden_size"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "active_experts_per_token": ("num_experts_per_tok",), "shared_experts": ("n_shared_experts",),
    "kv_lora_rank": ("kv_lora_rank",), "qk_rope_head_dim": ("qk_rope_head_dim",),
    "expert_ffn_dim": ("moe_intermediate_size", "intermediate_size"),
    "context_length": ("max_position_embeddings", "n_positions"),
}
