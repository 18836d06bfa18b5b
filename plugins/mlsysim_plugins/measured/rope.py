"""How a model's RoPE tables live (issue 25): Hugging Face's per-forward tables, or a persistent cache.

Hugging Face's rotary embedding (``LlamaRotaryEmbedding``: one per model) keeps two fp32 buffers,
``inv_freq`` and ``original_inv_freq`` (head_dim/2 values each: ``ModelShape.rope_buffer_bytes``), and
computes the cos/sin tables in every forward (``2 x s x head_dim``, saved by every layer:
``term_keys.ROPE_TABLES``). That is the default.

torchtune 0.6.1's ``RotaryPositionalEmbeddings`` and Llama 3.1's ``Llama3ScaledRoPE``
(torchtune/modules/position_embeddings.py, torchtune/models/llama3_1/_position_embeddings.py:
``rope_init``, ``build_rope_cache``) instead register, at model init, ``theta`` (head_dim/2 values)
and ``cache``: ``stack([cos, sin], -1)`` over ``max_seq_len`` positions, ``max_seq_len x head_dim/2
x 2`` values. Both are computed in fp32 whatever the default dtype (``theta`` from ``.float()``,
``torch.tensor(new_freqs, dtype=freqs.dtype)``), so a recipe that builds the model under
``set_default_dtype(bf16)`` keeps them fp32; a model cast after init (``model.to(bf16)``) casts them.
The builders build ONE rope module and pass it to every layer's attention
(``llama3_1``/``llama3_2`` component builders: ``rope = Llama3ScaledRoPE(...)``, ``pos_embeddings=rope``),
so there is one cache per model, alive the whole iteration (a weights term). Its forward slices it
(``self.cache[:seq_len]``, a view): no per-forward table.

``rope_cache=N`` (the builder's ``max_seq_len``; ``rope_cache_dtype`` the dtype the buffers are in;
``rope_cache_layout`` ``"concatenated"`` for Qwen2's and Phi-3's, twice the values per position)
selects torchtune's: the weights carry ``theta`` and the cache in place of HF's two ``inv_freq``
buffers, and the activations no RoPE tables. ``rope_cache_per_layer`` (off by default): a cache and theta in every
decoder layer rather than one shared: torchtune 0.6.1's LoRA builders whose ``lora_<family>_self_attention``
builds its own rope module (llama2 line 417, llama3 418, mistral 399, qwen2 393, gemma 345, gemma2 392 of
``torchtune/models/<family>/_component_builders.py``; counted on the meta device: ``lora_qwen2_1_5b`` has 28
``Qwen2RotaryPositionalEmbeddings``, ``qwen2_1_5b`` one), where the full builders and ``lora_llama3_1``/
``lora_llama3_2`` pass one to every layer. Measured: validation/compile/blocks*_measurements.json
(torchtune's own builders): every run's end of backward was short by exactly cache + theta - 128 B
(HF's two buffers at head_dim 32): -65,472 B fp32 at 512 positions, -32,672 B bf16-cast, -32,704 B
fp32 cache in a bf16 QLoRA run at 256 (tests/measured/test_rope_cache.py).
"""

from __future__ import annotations

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.terms import PHASES as ALL, WEIGHTS, MemoryTerm

from . import term_keys as K
from .options import _option

DTYPES = {"fp32": 4, "bf16": 2, "fp16": 2}
# Values per position, per rotated head dimension, of each cache layout: RotaryPositionalEmbeddings and
# Llama3ScaledRoPE stack cos and sin over head_dim/2 frequencies ([max_seq_len, head_dim/2, 2]: 1 per dimension);
# Qwen2RotaryPositionalEmbeddings and Phi3RotaryPositionalEmbeddings concatenate cos and sin over the frequencies
# repeated twice (cat([cos(f), sin(f)]), f = cat([theta, theta]): [max_seq_len, 2 x head_dim]: 2 per dimension).
LAYOUTS = {"pairs": 1, "concatenated": 2}

ROPE_CACHE = _option(
    "a persistent RoPE cache of this many positions in place of Hugging Face's per-forward cos/sin tables: "
    "torchtune's RotaryPositionalEmbeddings (the model builder's max_seq_len x head_dim/2 x (cos, sin), built "
    "once at model init, one shared by every layer; default: Hugging Face's tables)", "N", kind=int)
ROPE_CACHE_DTYPE = _option(
    "with rope_cache: the dtype of the cache and its theta: fp32 (default: torchtune computes them in fp32 "
    "whatever the default dtype), or bf16/fp16 for a model cast after init (model.to(dtype))",
    choices=tuple(DTYPES))
ROPE_CACHE_LAYOUT = _option(
    "with rope_cache: the cache's layout: pairs (default; torchtune's RotaryPositionalEmbeddings and "
    "Llama3ScaledRoPE: max_seq_len x head_dim/2 x (cos, sin)) or concatenated (torchtune's Qwen2 and Phi-3 "
    "RoPE: max_seq_len x 2 head_dim, cos and sin of the frequencies repeated twice)", choices=tuple(LAYOUTS))
ROPE_CACHE_PER_LAYER = _option(
    "with rope_cache: a cache (and theta) in every decoder layer rather than one shared by every layer: torchtune's "
    "LoRA builders whose attention builds its own rope module (lora_<family>_self_attention: llama2, llama3, mistral, "
    "qwen2, gemma, gemma2 in 0.6.1); default: one shared",
    kind=None, flags=({"flag": "--rope-cache-per-layer", "const": True,
                       "help": "with --rope-cache: one cache per decoder layer (torchtune's LoRA builders that build "
                               "a rope module in each layer's attention)"},))


def cached(plan) -> bool:
    """Does the run keep a persistent RoPE cache (torchtune's) instead of per-forward tables?"""
    return bool(getattr(plan.profile_options, "rope_cache", None))


def cache_bytes(rows: int, rotary_dim: int, dtype: str = "fp32", layout: str = "pairs") -> tuple[int, int]:
    """(cache, theta) bytes: ``rows x rotary_dim/2 x 2`` (``"pairs"``; ``"concatenated"``: ``rows x 2
    rotary_dim``) and ``rotary_dim/2`` values of ``dtype``."""
    b = DTYPES[dtype]
    return rows * (rotary_dim // 2) * 2 * LAYOUTS[layout] * b, (rotary_dim // 2) * b


def cache_terms(shape, plan) -> list[MemoryTerm]:
    """The cache and its theta: one per model, every phase (buffers built at model init on the device: a parameter
    offload leaves them there, ``term_keys.NOT_PARAMETERS``)."""
    o = plan.profile_options
    dtype, layout = o.rope_cache_dtype or "fp32", getattr(o, "rope_cache_layout", None) or "pairs"
    cache, theta = cache_bytes(o.rope_cache, shape.rotary_dim, dtype, layout)
    row = (f"head_dim/2={shape.rotary_dim // 2} x 2 (cos, sin)" if layout == "pairs" else
           f"2 x head_dim={shape.rotary_dim} (cos, sin of the frequencies twice)")
    per_layer = bool(getattr(o, "rope_cache_per_layer", None))
    modules = shape.layers if per_layer else 1
    how = f"{modules} x (" if per_layer else ""
    return [MemoryTerm(component=WEIGHTS, key=K.ROPE_CACHE, label="RoPE cache and theta (torchtune)"
                       + (", one per layer" if per_layer else ""), phases=ALL, nbytes=modules * (cache + theta),
                       formula=f"{how}max_seq_len={o.rope_cache:,} x {row} + head_dim/2 (theta), x {DTYPES[dtype]} B "
                               f"({dtype})" + (f"): one in each of the {modules} layers" if per_layer else
                                               "; one shared by every layer"))]


def prepare(plan, registry):
    """The option checked: a whole number of positions, at least the run's sequence; rotary positions only."""
    o = plan.profile_options
    rows, dtype, layout = o.rope_cache, o.rope_cache_dtype, o.rope_cache_layout
    per_layer = getattr(o, "rope_cache_per_layer", None)
    if rows is None:
        for name, value in (("rope_cache_dtype", dtype), ("rope_cache_layout", layout),
                            ("rope_cache_per_layer", per_layer)):
            if value is not None:
                raise InvalidInputError(name, value, "None unless rope_cache is set", "no RoPE cache to describe")
        return plan
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise InvalidInputError("rope_cache", rows, "a whole number of positions >= 1 (the builder's max_seq_len)")
    if rows < plan.seq_len:
        raise InvalidInputError("rope_cache", rows, f"at least the sequence length {plan.seq_len}",
                                "torchtune's rope slices cache[:seq_len]: a longer input fails in its forward")
    if dtype is not None and dtype not in DTYPES:
        raise InvalidInputError("rope_cache_dtype", dtype, "one of " + ", ".join(DTYPES))
    if layout is not None and layout not in LAYOUTS:
        raise InvalidInputError("rope_cache_layout", layout, "one of " + ", ".join(LAYOUTS))
    if per_layer is not None and not isinstance(per_layer, bool):
        raise InvalidInputError("rope_cache_per_layer", per_layer, "True or False")
    if per_layer and plan.pp_size > 1:
        raise NotModelledError("rope_cache_per_layer", True, "with pp_size 1",
                               f"pp_size={plan.pp_size}: a stage's share of the per-layer caches is not modelled "
                               "(torchtune, whose LoRA builders build them, has no pipeline parallelism)")
    from .shapes import shape_of
    shape = shape_of(plan)
    if shape.family.positions != "rotary":
        raise NotModelledError("rope_cache", rows, "None for a model without rotary positions",
                               f"{shape.family.display} positions are {shape.family.positions}")
    return plan


def stored(kind: str, plan, terms: list) -> list:
    """``terms`` (a family's ``"weights"`` or ``"model_activations"``, after its own ``adjust_terms``) with the
    run's RoPE storage: with ``rope_cache`` the frequency buffers replaced by the cache and theta, the per-forward
    tables (cos/sin, freqs_cis, and any host copy of them) gone; as they are otherwise."""
    if not cached(plan):
        return terms
    if kind == "weights":
        from .shapes import shape_of
        return [t for t in terms if t.key != K.ROPE_BUFFERS] + cache_terms(shape_of(plan), plan)
    if kind == "model_activations":
        return [t for t in terms if t.key not in K.ROPE_TABLE_KEYS]
    return terms
