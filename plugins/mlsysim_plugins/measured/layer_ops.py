"""The forward ops of one decoder layer whose outputs a per-op checkpointing policy may save, as a
family declares them (``ArchitectureFamily.op_outputs``).

A family that declares ``op_outputs(shape, kind, kernel, seq_len)`` gets the per-op policies
(``op-sac``, ``save-list``; ``mlsysim_plugins.checkpointing_policies``) on one device and under every
parallelism; one that does not is refused by name. ``kind``: fp32 / amp-bf16 / bf16 (AMP: the
matmuls' outputs are bf16; grouped-mm experts run in the weights' dtype); ``kernel``: the
``AttentionKernel``, whose declared ``computes`` ("sdpa" or "eager") gives the attention's ops.

Each ``OpOutput`` says how a parallel layout splits it (``split``: ``"tp"`` inside the column-parallel
region, / tp; ``"replicated"``: whole on every tensor-parallel rank (a row-parallel linear's partial
sum before its reduction, the router); ``"experts"``: / expert_tp) and whether it is a row-parallel
linear's output that the tensor-parallel ranks reduce afterwards (``reduced``: with sequence
parallelism a reduce-scatter whose T x h / tp output is itself an op a save list may name,
``reduce_scatter``). Built-in declarations: Llama-style layers (Llama, Mistral, Qwen3's QK-norm layer,
Ministral: the QK-norm and sliding-window masks are not op outputs a list names) and Mixtral-style
layers (Mixtral, Qwen3-MoE without shared experts).
"""

from __future__ import annotations

import attrs

from mlsysim_core.errors import NotModelledError

TP, REPLICATED, EXPERTS = "tp", "replicated", "experts"


@attrs.frozen
class OpOutput:
    """One forward op of a decoder layer whose output a per-op policy may save: its op name,
    what it computes, its output bytes per token, its tensor-parallel split, its module
    (attention / mlp) and whether the tensor-parallel ranks reduce it afterwards (row-parallel)."""
    op: str
    name: str
    nbytes: float
    split: str = TP
    module: str = ""
    reduced: bool = False


def _attention_ops(shape, kind, kernel, seq_len) -> list[OpOutput]:
    c = 4 if kind == "fp32" else 2
    h, q, kv, a = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.heads
    S = a * seq_len
    att = "attention"
    ops = [OpOutput("mm", "q_proj", c * q, module=att), OpOutput("mm", "k_proj", c * kv, module=att),
           OpOutput("mm", "v_proj", c * kv, module=att)]
    if kernel.sdpa:     # declared, not named
        # CPU: _scaled_dot_product_flash_attention_for_cpu; GPU: _scaled_dot_product_flash_attention.
        ops.append(OpOutput("sdpa", "attention output + logsumexp (fp32)", c * q + 4 * a, module=att))
    else:   # eager: q @ k^T (bmm), softmax in fp32, weights @ v (bmm)
        ops += [OpOutput("bmm", "scores q @ k^T", c * S, module=att),
                OpOutput("softmax", "softmax (fp32)", 4 * S, module=att),
                OpOutput("bmm", "weights @ v", c * q, module=att)]
    ops.append(OpOutput("mm", "o_proj", c * h, split=REPLICATED, module=att, reduced=True))
    return ops


def llama_ops(shape, kind, kernel, seq_len) -> tuple[OpOutput, ...]:
    """A Llama-style HF decoder layer (transformers 5.23, torch 2.13), in forward order: q, k, v,
    the attention, o, gate, up, down."""
    c = 4 if kind == "fp32" else 2
    h, f = shape.hidden, shape.ffn
    return tuple(_attention_ops(shape, kind, kernel, seq_len) + [
        OpOutput("mm", "gate_proj", c * f, module="mlp"), OpOutput("mm", "up_proj", c * f, module="mlp"),
        OpOutput("mm", "down_proj", c * h, split=REPLICATED, module="mlp", reduced=True)])


def _moe_ops(kind, h, f, E, k) -> list[OpOutput]:
    c = 4 if kind == "fp32" else 2
    ce = 2 if kind == "bf16" else 4
    return [OpOutput("mm", "router logits", c * E, split=REPLICATED, module="mlp"),
            OpOutput("softmax", "router probabilities (fp32)", 4 * E, split=REPLICATED, module="mlp"),
            OpOutput("topk", "top-k weights (fp32) and indices (int64)", 12 * k, split=REPLICATED, module="mlp"),
            OpOutput("grouped_mm", "experts gate_up", ce * k * 2 * f, split=EXPERTS, module="mlp"),
            OpOutput("grouped_mm", "experts down", ce * k * h, split=EXPERTS, module="mlp")]


def mixtral_ops(shape, kind, kernel, seq_len) -> tuple[OpOutput, ...]:
    """A Mixtral-style layer (experts_implementation="grouped_mm"): Llama's attention, the router
    (mm, fp32 softmax, top-k) and the experts' two grouped mms."""
    return tuple(_attention_ops(shape, kind, kernel, seq_len)
                 + _moe_ops(kind, shape.hidden, shape.ffn, shape.experts, shape.top_k))


def qwen_moe_ops(shape, kind, kernel, seq_len) -> tuple[OpOutput, ...]:
    """Qwen3-MoE (every layer sparse, no shared expert): Mixtral's ops with the experts' own width.
    Qwen2-MoE's shared expert and models mixing dense and sparse layers are refused by name."""
    from .architectures.moe_2025 import spec_of
    s = spec_of(shape.model)
    if s.arch != "qwen3_moe" or s.shared_ffn or s.moe_layers != s.layers:
        why = ("its shared expert's ops are not declared" if s.shared_ffn else
               "its dense and sparse layers are not declared apart" if s.moe_layers != s.layers else
               f"{s.arch}'s ops are not declared")
        raise NotModelledError("activation_checkpointing", "a per-op policy",
                               "a family whose layer ops are tagged", f"family {shape.family.name!r}: {why}")
    return tuple(_attention_ops(shape, kind, kernel, seq_len) + _moe_ops(kind, s.hidden, s.expert_ffn, s.experts,
                                                                        s.top_k))
