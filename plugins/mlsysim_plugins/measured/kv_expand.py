"""Keys and values expanded to every query head before the attention kernel (issue 25).

Hugging Face's Llama-style attention hands the kernel k and v at their own heads' width under SDPA
(transformers 5.23's ``use_gqa_in_sdpa``: ``enable_gqa``; ``repeat_kv`` where it cannot, which the
formulas price as measured), so SDPA saves q + 2 kv per token. torchtune 0.6.1's ``MultiHeadAttention.forward``
(torchtune/modules/attention.py; Gemma 2's attention the same way) expands them first when
``num_heads != num_kv_heads``::

    k = k.unsqueeze(2).expand(b, n_kv, q_per_kv, s, d).flatten(1, 2)   # flatten of an expanded view: a copy
    v = v.unsqueeze(2).expand(b, n_kv, q_per_kv, s, d).flatten(1, 2)

and SDPA keeps those copies for its backward: k and v of ``heads x head_dim`` each per token. The un-expanded
k (the rotary embedding's output) and v (a view of v_proj's output) are saved by nothing (the rope's multiply
keeps its cache operand, the expand and the copy nothing), so they are freed at once: the saved set holds
q + 2 q per token in place of q + 2 kv, 2 (q - kv) x c bytes more per token and layer.

``kv_expanded=True`` (the torchtune reader sets it for its grouped-query builders) declares it: the attention
kernel's formula for separate q/k/v projections is called with ``kv_dim = q_dim`` wherever the eager layer
walk asks it (the full-training layer, ``model.layer_bytes``; LoRA's walk, ``lora._layer``). Under ``compile``
the blocks are Inductor's graphs, priced by ``compile.py`` (``layer_saved``), whose set already holds k and v at the
query heads' width (SDPA saves the repeated copies; validation/compile/blocks_measurements.json's kv2 compiled runs,
torchtune-built, match it), so the declaration changes nothing there and is not applied. A model whose key/value
heads equal its query heads expands nothing. Off by default: every number unchanged.
"""

from __future__ import annotations

from functools import lru_cache

import attrs

from mlsysim_core.errors import InvalidInputError

from .kernels import SEPARATE_QKV, AttentionKernel, kernel_of
from .options import _option

KV_EXPANDED = _option(
    "keys and values expanded to every query head before the attention kernel, which saves the expanded copies "
    "(torchtune's MultiHeadAttention with num_kv_heads < num_heads: k, v of heads x head_dim each per token "
    "saved, not kv_heads x head_dim); the eager layers (a compiled block's set holds them so already); default: "
    "off (Hugging Face's attention: enable_gqa / repeat_kv as measured)",
    kind=None, flags=({"flag": "--kv-expanded", "const": True,
                       "help": "keys and values expanded to every query head before the attention kernel, the "
                               "copies saved (torchtune's grouped-query attention)"},))


def expanded(plan) -> bool:
    """Does the run's eager attention receive (and save) k and v expanded to every query head?"""
    if not getattr(plan.profile_options, "kv_expanded", None):
        return False
    from .compile import on
    return not on(plan)


def _wide(formula):
    def saved(*, q_dim, kv_dim, **keywords):
        return formula(q_dim=q_dim, kv_dim=q_dim, **keywords)
    saved.__name__ = getattr(formula, "__name__", "formula") + "_kv_expanded"
    return saved


@lru_cache(maxsize=None)
def expanded_kernel(kernel: AttentionKernel) -> AttentionKernel:
    """``kernel`` handed k and v at the query heads' width: its separate-q/k/v formula called with
    ``kv_dim = q_dim`` (one object per kernel, so the memoised layer walks meet the same one)."""
    layouts = tuple((name, _wide(formula) if name == SEPARATE_QKV else formula) for name, formula in kernel.layouts)
    return attrs.evolve(kernel, layouts=layouts)


def kernel_for(plan) -> AttentionKernel:
    """The attention kernel the eager layer walks ask: the plan's, with k/v expanded where it declares so."""
    kernel = kernel_of(plan)
    return expanded_kernel(kernel) if expanded(plan) else kernel


def prepare(plan, registry=None):
    """The option checked: True, False or None."""
    value = getattr(plan.profile_options, "kv_expanded", None)
    if value is not None and not isinstance(value, bool):
        raise InvalidInputError("kv_expanded", value, "True, False or None (default: off)")
    return plan
