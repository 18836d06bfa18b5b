"""Loss implementations: what computes the loss from the LM head's input, each a registration of
the measured hook ``mlsysim_measured_losses`` (issue 25, item 5), chosen with ``loss=NAME``
(``--loss NAME``). The built-ins are registered through that hook exactly as a third party's.

A ``LossImplementation`` declares its memory, with nothing the profile recognises by name:

- ``terms(ctx) -> [MemoryTerm]``: what it keeps for the backward (phases forward and backward),
  its forward temporaries (forward) and its backward temporaries (backward), in place of the
  default cross-entropy's four terms (the logits, their fp32 log-softmax, the shifted labels and
  the backward's two fp32 temporaries). ``ctx`` is a ``LossContext``: the rank's tokens ``T``,
  the tokens it computes (``valid``: ``T`` x ``loss_token_share`` when it skips ignored tokens),
  hidden ``h``, vocabulary ``V``, compute bytes ``c``, the LM head weight's and gradient's bytes,
  ``chunks``, the regime and the plan. ``None``: the default cross-entropy's terms, unchanged.
- ``saves_lm_head_input``: False when the LM head's matmul does not keep its input (the final
  norm's output) for the backward (a fused loss computes the gradients in the forward, or saves
  its own copy, declared in its terms): the profile takes it off the final norm's term.
- ``saves_lm_head_weight_copy``: False when, under autocast, the LM head's 16-bit weight copy is
  not saved for the backward (it lives only while autocast caches it: the forward).
- ``casts_lm_head_once``: False when under autocast the loss casts the LM head's weight itself, per matmul, with
  no copy that autocast caches or that outlives the matmul (TRL's ``w.float().t()``: a view, which autocast does
  not cache), its casts in its terms: the profile takes off the LM head's autocast copy.
- ``chunks``: the default of ``loss_chunks`` (None: it takes none); ``chunk_unit``: ``"chunks"``
  (a count) or ``"tokens"`` (tokens per chunk, as TRL's and LitGPT's ``chunk_size``).
- ``token_share``: it computes only the tokens whose label is not ignored (``loss_token_share``).
- ``allows``: what it runs under beyond one device's plain layout: ``"tensor_parallel"``,
  ``"context_parallel"``, ``"lora"``, ``"softcapping"``, ``"autocast"`` (default: autocast only),
  ``"lora_tensor_parallel"`` (measured under LoRA over tensor-parallel adapters: lora.py lets it through),
  ``"lora_head"`` (measured with a LoRA adapter on the LM head, ``target_modules`` naming ``lm_head``: lora.py lets
  it through); anything else is refused naming the implementation. ``check(plan)`` refuses more (raise).
- ``lm_head_chunks``: the model applies its LM head to one chunk of the loss at a time (torchtune's
  ``set_num_output_chunks``): an adapted head's own forward transients are a chunk's (lora.py).
- ``quantizes_lm_head``: under a quantized LoRA base (QLoRA) the recipe's quantization converts the LM head too
  (LitGPT's: Lightning's ``BitsandbytesPrecision`` converts every ``nn.Linear``): lora.py stores it quantized and
  the terms price its dequantization. False (the default): the LM head stays in the base's dtype (peft's QLoRA).
- ``compiled_blocks``: its compiled form with ``compile="blocks"`` (torchtune's ``compile_loss``):
  ``compiled_blocks(plan, placement, terms, trainable=True) -> [MemoryTerm]``, the terms with its eager ones
  replaced (``trainable``: the LM head trains). ``None``: refused with ``compile`` (the default cross-entropy,
  ``terms=None``, has compile's own terms).
- ``with_optimizer_in_backward``: the loss's backward moment that the LM head's step in the backward
  (``optimizer_in_backward``) follows: ``with_optimizer_in_backward(plan, T, h, V, c, regime) -> (bytes freed
  by then, how)``. ``None``: refused with ``optimizer_in_backward`` (the default cross-entropy: its own moments).
- ``note`` (what every result with it says first), ``notes`` (more: unvalidated, ...),
  ``source`` (the library, file and commit it is derived from), ``added_step_time(plan)``.

``loss_terms`` (loss.py) applies the declaration; the ladder of ``fit techniques`` offers the
built-in ``chunked`` and ``fused_linear`` (the loss technique's candidates).
"""

from __future__ import annotations

from typing import Any, Callable

import attrs

from mlsysim_core import hookimpl

HOOK = "mlsysim_measured_losses"
ALLOWS = ("tensor_parallel", "context_parallel", "lora", "softcapping", "autocast", "megatron", "lora_tensor_parallel",
          "lora_head")


def _allows(value) -> frozenset:
    out = frozenset(value)
    unknown = out - set(ALLOWS)
    if unknown:
        raise ValueError(f"LossImplementation.allows: {sorted(unknown)}; expected some of {ALLOWS}")
    return out


@attrs.frozen(kw_only=True, eq=False)
class LossImplementation:
    """A loss implementation of the measured profile (the module docstring)."""
    name: str
    description: str = ""
    source: str = ""
    terms: Callable[[Any], list] | None = None
    saves_lm_head_input: bool = True
    saves_lm_head_weight_copy: bool = True
    casts_lm_head_once: bool = True
    chunks: int | None = None
    chunk_unit: str = attrs.field(default="chunks", validator=attrs.validators.in_(("chunks", "tokens")))
    token_share: bool = False
    allows: frozenset = attrs.field(default=("autocast",), converter=_allows)
    quantizes_lm_head: bool = False
    lm_head_chunks: bool = False
    check: Callable | None = None
    note: str = ""
    notes: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    added_step_time: Callable | None = None
    compiled_blocks: Callable | None = None
    with_optimizer_in_backward: Callable | None = None


@attrs.frozen(kw_only=True)
class LossContext:
    """What a loss implementation's ``terms`` receives (the rank's last stage)."""
    plan: Any
    tokens: int            # T: the rank's tokens (micro-batch x sequence)
    valid: int             # the tokens it computes: T, or ceil(T x loss_token_share) with token_share
    hidden: int            # h
    vocab: float           # V on this rank (split over tp under Megatron's vocabulary-parallel loss)
    compute: int           # c: bytes of the compute dtype (the logits)
    weight: int            # bytes of the LM head weight
    gradient: int          # bytes of the LM head weight's gradient
    chunks: int | None
    regime: Any
    shape: Any
    lm_head_trainable: bool = True     # False under LoRA: the LM head is frozen (no weight gradient)

    @property
    def autocast(self) -> bool:
        return bool(self.regime.autocast)


def registered(registry) -> dict[str, LossImplementation]:
    found = dict((registry.extensions.get(HOOK) or {}))
    if any(not isinstance(item, LossImplementation) for item in found.values()):
        from .options import check_items      # the plugin named, never an AttributeError where it is used
        check_items(registry, HOOK, found)
    return found


# --- the built-ins (loss.py: cross_entropy, chunked, fused_linear; published_losses.py: the rest) ---

def _lazy(module: str, name: str):
    def call(*args, **kwargs):
        import importlib
        return getattr(importlib.import_module(f"mlsysim_plugins.measured.{module}"), name)(*args, **kwargs)
    call.__name__ = name
    return call


LIGER = "liger-kernel v0.8.2 src/liger_kernel/ops/fused_linear_cross_entropy.py"
TORCHTUNE_061 = "torchtune 0.6.1 torchtune/modules/loss/ce_chunked_output_loss.py"

BUILTIN = (
    LossImplementation(
        name="cross_entropy", description="Hugging Face's ForCausalLMLoss (the default): the logits upcast to fp32 "
        "whole, the fp32 log-softmax saved, two fp32 temporaries in the backward",
        source="transformers loss/loss_utils.py ForCausalLMLoss", terms=None,
        allows=("autocast", "tensor_parallel", "context_parallel", "lora", "softcapping", "megatron",
                "lora_head")),     # lora_head: validation/lora_head (torchtune's LoRALinear output, frozen base)
    LossImplementation(
        name="chunked", description="torchtune's CEWithChunkedOutputLoss: the fp32 copy and backward temporaries one "
        "chunk at a time", source=TORCHTUNE_061, terms=_lazy("loss", "chunked_terms"), chunks=8,
        allows=("autocast", "lora", "lora_head"), lm_head_chunks=True,     # (the model's output per chunk:
        # torchtune 0.6.1 modules/transformer.py TransformerDecoder.chunked_output; lora_head: validation/lora_head)
        note="loss: torchtune's chunked cross-entropy ({chunks} chunks): the fp32 copy of the logits and the "
             "cross-entropy backward's temporaries shrink to one chunk; the 16-bit logits and the fp32 "
             "log-softmax stay whole",
        added_step_time=_lazy("loss", "chunked_step_time"),
        # torchtune's compile_loss compiles its compute_cross_entropy per chunk (compile.py, measured:
        # validation/compile/measure_blocks.py); the LM head's step in the backward follows its backward moment
        # (optimizer_in_backward.py, measured: validation/techniques/oib_combinations)
        compiled_blocks=_lazy("compile", "compiled_chunked_terms"),
        with_optimizer_in_backward=_lazy("loss", "chunked_freed_before_step")),
    LossImplementation(
        name="fused_linear", description="Liger's fused linear cross-entropy: the logits one chunk at a time, the LM "
        "head's gradients computed in the forward; unvalidated", source=LIGER, terms=_lazy("loss", "fused_terms"),
        saves_lm_head_input=False, saves_lm_head_weight_copy=False,
        note="loss: fused linear cross-entropy (Liger): the logits exist one chunk at a time; the LM head's weight "
             "and input gradients are computed in the forward and held until the backward",
        notes=("loss='fused_linear' is unvalidated: Liger's fused linear cross-entropy needs triton (a GPU); its "
               "bytes are derived from liger-kernel v0.8.2's source and measured on a PyTorch emulation, not on "
               "Liger itself",),
        added_step_time=_lazy("loss", "fused_step_time")),
)


def _published():
    from .published_losses import PUBLISHED
    return PUBLISHED


@hookimpl
def mlsysim_measured_losses():
    return list(BUILTIN) + list(_published())
