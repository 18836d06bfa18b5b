"""The measured profile's built-in techniques, registered through its own hook
``mlsysim_measured_techniques`` exactly as a third party registers one (``techniques.py``):
LoRA, the loss, the optimizer step in the backward, activation offload, offload (DeepSpeed's and
FSDP's, and torchao's CPUOffloadOptimizer), float8 and torch.compile; and, for the
ladder of ``fit techniques`` only, the checkpointing policies and the low-bit optimizers (solve's
own keywords, no option of the profile). Each one's physics is in its module; this is what the
profile's ``prepare``, ``relocate`` and the ladder call."""

from __future__ import annotations

import math

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import MlsysimError, PluginContractError
from mlsysim_core.registry import CHECKPOINTING, OPTIMIZER
from mlsysim_core.memo import memoize
from .._lazy import lazy_module
from .options import _LORA_FLAGS, _lora_table, _offload_parts, _option
from .kv_expand import KV_EXPANDED
from .rope import ROPE_CACHE, ROPE_CACHE_DTYPE, ROPE_CACHE_LAYOUT, ROPE_CACHE_PER_LAYER
from .techniques import Candidate, Technique

# Imported on first use (the physics never when the plugins load): module-level stand-ins rather than
# imports in the functions that every solve runs, which cost on each call.
_finetune = lazy_module(globals(), "_finetune", "mlsysim_core.finetune")
_parallel = lazy_module(globals(), "_parallel", "mlsysim_plugins.measured.parallel")

_INTERNAL = {"internal": True}

# --- the options the built-in techniques own (solve keywords, CLI flags, scenario fields) ---------------

LORA = _option("LoRA/QLoRA fine-tuning: a mlsysim_core.finetune.LoRAConfig or a dict of its fields",
    kind=None, flags=_LORA_FLAGS, what="a LoRA/QLoRA run", from_file=_lora_table)
OFFLOAD = _option("what lives in host memory: optimizer, optimizer+gradients or "
    "optimizer+gradients+parameters (DeepSpeed ZeRO-Offload / FSDP CPUOffload; "
    "name=nvme for NVMe, e.g. optimizer=nvme), or {name: cpu|nvme}; or torchao, "
    "torchao+gradients (torchao's CPUOffloadOptimizer, offload_gradients with +gradients)",
    "WHAT", parse=_offload_parts)
LOSS = _option("the loss implementation (a registered name; mlsysim-core plugins lists them): cross_entropy "
    "(default; Hugging Face's, the logits upcast to fp32 whole), chunked (torchtune's chunked cross-entropy: the "
    "fp32 copy and backward temporaries one chunk at a time), fused_linear (Liger's fused linear cross-entropy: the "
    "logits one chunk at a time, the LM head's gradients computed in the forward; unvalidated), torchtune_linear "
    "(torchtune's LinearCrossEntropyLoss), torchtitan_chunked (torchtitan's ChunkedLossWrapper), trl_chunked_nll "
    "(TRL's chunked_nll), litgpt_chunked (LitGPT's chunked_cross_entropy), cut_cross_entropy (Apple's Cut "
    "Cross-Entropy; unvalidated), megatron_fused (Megatron-Core's fused vocab-parallel cross-entropy, torch.compile'd as Megatron runs it), "
    "megatron_vocab_parallel (Megatron-Core's unfused vocab-parallel cross-entropy)",
    "NAME")
LOSS_CHUNKS = _option("with a chunked loss: the number of chunks (default 8, torchtune's num_output_chunks), or "
    "for trl_chunked_nll and litgpt_chunked the tokens per chunk (their chunk_size: 256, 128)",
    "N", kind=int)
LOSS_TOKEN_SHARE = _option("the share of the tokens whose label is not ignored (default 1.0): a loss that skips "
    "ignored tokens (torchtune_linear, trl_chunked_nll, cut_cross_entropy) computes only these", "FRACTION",
    kind=float)
OPTIMIZER_IN_BACKWARD = _option(
    "the optimizer step fused into the backward (torchtune's optimizer_in_bwd: one optimizer per parameter, "
    "stepped by its post-accumulate-grad hook): gradients freed parameter by parameter (one device, no "
    "gradient accumulation)", kind=None,
    flags=({"flag": "--optimizer-in-backward", "const": True,
            "help": "fuse the optimizer step into the backward (torchtune's optimizer_in_bwd)"},))
ACTIVATION_OFFLOAD = _option(
    "activation offloading to host memory: save_on_cpu (torch.autograd.graph.save_on_cpu around the model) or "
    "torchtune (torchtune's OffloadActivations: tensors >= 1 KiB that are not parameters, the LM head and "
    "loss left on the device, the last tensors in flight kept on the device)",
    choices=("save_on_cpu", "torchtune"))
FLOAT8 = _option("float8 training: tensorwise or rowwise (torchao convert_to_float8_training, the LM head "
    "left in high precision; pure bf16 or fp32, one device) or transformer-engine "
    "(TransformerEngine FP8 under Megatron-Core, regime mixed-bf16-main-grad only; unvalidated)",
    choices=("tensorwise", "rowwise", "transformer-engine"), also=lambda registry: _float8_also(registry))
COMPILE = _option("torch.compile with Inductor's default options: True, the whole model (HF torch_compile): "
    "AOTAutograd's partitioner's saved set, the fused loss; one device, checkpointing none or full; 'blocks', each "
    "decoder block apart (torchtune compile: True, torchtitan compile.enable): the loss and LM head eager (torchtune's "
    "compiled chunked loss), checkpointing none, op-sac or full; data, pipeline and tensor parallelism (no sequence "
    "parallelism); plain LoRA on one device (compile.py); 'blocks+loss', the blocks and the loss function (torchtitan's "
    "compile.components ['model', 'loss']); fp32 or bf16",
    kind=None,
    flags=({"flag": "--compile", "const": True,
            "help": "torch.compile the model (Inductor, default options; see docs/compile.md)"},
           {"flag": "--compile-blocks", "const": "blocks",
            "help": "torch.compile each decoder block apart (torchtune, torchtitan; see docs/compile.md)"}))
COMPILE_CHECKPOINT = _option("with compile='blocks' and full checkpointing: where each layer's checkpoint sits "
    "relative to its compiled block: inside (torchtitan's apply_ac, then apply_compile: the checkpoint inside the "
    "compiled graph; the default without LoRA) or outside (torchtune's compile_model, then "
    "set_activation_checkpointing wraps each compiled layer; the default with LoRA, the only one measured with it)",
    choices=("inside", "outside"))


# --- LoRA / QLoRA (lora.py) -------------------------------------------------------------------------

def _lora(plan, registry):
    o = plan.profile_options
    if o.lora is not None:
        from .lora import lora_option
        return lora_option(plan, o.lora, registry)
    _full_training(plan.model)     # a quantized checkpoint trains only adapters: full training is refused
    return plan


@memoize
def _full_training(model) -> bool:
    """``checkpoint_quantization(model, None)``: refused (its ``NotModelledError``, raised again on every
    solve: an error is never kept) for a quantized checkpoint; True, kept per model, for any other."""
    _finetune.checkpoint_quantization(model, None)
    return True


def _lora_relocate(plan, weights, gradients, optimizer_state):
    if plan.profile_options.lora is None:      # the modules_to_save copies' state in their own dtype (lora.py)
        return weights, gradients, optimizer_state
    from .lora import relocate
    return relocate(plan, weights, gradients, optimizer_state)


# --- the loss (loss.py) -----------------------------------------------------------------------------

def _loss(plan, registry):
    o = plan.profile_options
    if o.loss is None and o.loss_chunks is None and o.loss_token_share is None:
        return plan
    from .loss import prepare
    return prepare(plan, registry)


def _chosen_loss(plan):
    """The loss implementation chosen, or None for the default cross-entropy's terms (declared, not named)."""
    from .loss import chosen
    return chosen(plan.profile_options)


def _loss_time(plan, figures):
    from .loss import added_step_time
    return added_step_time(plan)


# --- the RoPE tables' storage (rope.py) ---------------------------------------------------------------

def _rope_cache(plan, registry):
    from .rope import prepare
    return prepare(plan, registry)


def _kv_expanded(plan, registry):
    from .kv_expand import prepare
    return prepare(plan, registry)


# --- the optimizer step in the backward (optimizer_in_backward.py) ----------------------------------

def _oib(plan, registry):
    value = plan.profile_options.optimizer_in_backward
    if value is None:
        return plan
    from .optimizer_in_backward import prepare_option
    return prepare_option(plan, value, registry.optimizers)


def _oib_relocate(plan, weights, gradients, optimizer_state):
    if not plan.profile_options.optimizer_in_backward:     # gradients freed one by one
        return weights, gradients, optimizer_state
    from .optimizer_in_backward import relocate
    return relocate(plan, weights, gradients, optimizer_state)


def _oib_time(plan, figures):
    from .optimizer_in_backward import added_step_time
    return added_step_time(plan)


# --- activation offload (offload_activations.py) ----------------------------------------------------

def _activation_offload(plan, registry):
    value = plan.profile_options.activation_offload
    if value is None:
        return plan
    from .offload_activations import prepare_option
    return prepare_option(plan, value)


def _activation_offload_time(plan, figures):
    from .offload_activations import added_step_time
    return added_step_time(plan, host_link_bytes_per_s=figures["host link B/s"][0])


# --- offload: DeepSpeed ZeRO-Offload / FSDP CPUOffload (parallel.py), torchao's (cpu_offload.py) ----

def _offload_given(plan, registry):
    """``offload=torchao[+gradients]``: torchao's optimizer, its own machinery (``cpu_offload.take_option``)."""
    if plan.profile_options.offload is None:
        return plan
    from .cpu_offload import is_torchao, take_option
    return take_option(plan) if is_torchao(plan.profile_options.offload) else plan


def _offload_last(plan, registry):
    """torchao's refusals and note (``cpu_offload.prepare_option``)."""
    if plan.profile_options.cpu_offload_optimizer is None:
        return plan
    from .cpu_offload import prepare_option
    return prepare_option(plan, registry.optimizers)


def _offload_relocate(plan, weights, gradients, optimizer_state):
    if plan.profile_options.cpu_offload_optimizer:
        from .cpu_offload import relocate
        return relocate(plan, weights, gradients, optimizer_state)
    return _parallel.offload_terms(plan, weights, gradients, optimizer_state)


def _offload_on(plan) -> bool:
    o = plan.profile_options
    return bool(o.offload or o.cpu_offload_optimizer)


def _offload_time(plan, figures):
    link, host = figures["host link B/s"][0], figures["host memory B/s"][0]
    if plan.profile_options.cpu_offload_optimizer:
        from .cpu_offload import added_step_time
        return added_step_time(plan, host_link_bytes_per_s=link, host_memory_bytes_per_s=host)
    from .offload_activations import optimizer_offload_step_time
    return optimizer_offload_step_time(plan, host_memory_bytes_per_s=host, host_link_bytes_per_s=link)


# --- float8 (float8.py) and torch.compile (compile.py) ---------------------------------------

def _float8(plan, registry):
    value = plan.profile_options.float8
    if value is None:
        return plan
    from .float8 import check, memory_named     # (a float8 implementation's name: the memory it declares)
    return check(plan, memory_named(registry, value))


def _float8_also(registry):
    from .float8 import also_named
    return also_named(registry)


def _float8_time(plan, figures):
    from .float8 import added_step_time
    return added_step_time(plan, memory_bandwidth=figures["memory bandwidth B/s"][0])


def _with_compile(name: str):
    """A built-in's declaration of how it combines with compile: compile.py's function ``name``."""
    def call(plan, value):
        from . import compile as compile_mod
        return getattr(compile_mod, name)(plan, value)
    call.__name__ = name
    return call


_NOT_COMPILED = "a technique that reshapes the compiled backward is not modelled with it"   # (compile.REFUSED)


def _compile(plan, registry):
    value = plan.profile_options.compile
    if (value is None or value is False) and plan.profile_options.compile_checkpoint is None:
        return plan
    from .compile import prepare     # what is modelled, checked; the rest refused by name
    return prepare(plan, registry)


# --- the ladder's levers that are solve's own keywords ----------------------------------------------

SAVES_RANK = "measured.saves_rank"
"""The ``CheckpointingSpec.extensions`` key that places a strategy in ``fit techniques``' ladder: a positive
number, the larger the more it saves (the built-ins: selective 1, attention-only 2, mlp-only 3, every-k 4,
op-sac 5, full 6; a strategy of one's own may sit between, 4.5). A strategy that declares none is not
offered (none, save-list)."""


def saves_rank(spec) -> float | None:
    """Where checkpointing strategy ``spec`` sits in the ladder (``SAVES_RANK``), None where it declares nothing."""
    rank = spec.extensions.get(SAVES_RANK)
    if rank is None:
        return None
    if isinstance(rank, bool) or not isinstance(rank, (int, float)) or not 0 < rank < math.inf:
        raise PluginContractError(
            f"checkpointing strategy {spec.name!r} declares extensions[{SAVES_RANK!r}] = {rank!r}; expected a positive "
            "number (the larger, the more it saves: selective 1 ... full 6) or nothing (not in fit techniques' ladder)",
            hook="mlsysim_checkpointing_strategies")
    return rank


def _checkpointing_candidates(registry) -> list[Candidate]:
    """Every registered strategy that declares where it sits (``SAVES_RANK``), the least saving first, then by
    name: with the built-ins, selective, attention-only, mlp-only, every-k, op-sac, full."""
    ranked = sorted((rank, name) for name, spec in registry.checkpointing.items()
                    if (rank := saves_rank(spec)) is not None)
    return [Candidate(name, f"activation checkpointing: {name}") for _, name in ranked]


def _spec(table: dict, kind: str, parameter: str, registry, value):
    """The spec ``value`` selects in ``table`` (a registry's), resolved as a solve resolves it; None if none."""
    try:
        return table[registry.resolve(kind, parameter, value)]
    except (MlsysimError, KeyError):
        return None


def _saves_more(value, given, registry) -> bool:
    """Only a policy that saves more than the run's own, asked of what the strategies declare: a run whose
    strategy recomputes nothing (``CheckpointingSpec.recomputes == "nothing"``) is offered every strategy of
    the ladder; one that declares where it sits (``SAVES_RANK``: the same declaration under any name), the
    strategies that declare a larger rank; any other (``save-list``, a third party's strategy declaring no
    rank: where it sits is not declared), none. (The recomputed share, ``recompute(plan)``, does not order
    the ladder: on Llama-3.1-8B at 2,048 tokens mlp-only reruns 0.78 of the layers' forward, every-k 0.5
    and op-sac 0.35, which are offered to it.)"""
    table = registry.checkpointing
    own = _spec(table, CHECKPOINTING, "activation_checkpointing", registry, given)
    candidate = _spec(table, CHECKPOINTING, "activation_checkpointing", registry, value)
    if own is None or candidate is None or (rank := saves_rank(candidate)) is None:
        return False
    if own.recomputes == "nothing":
        return True
    mine = saves_rank(own)
    return mine is not None and mine < rank


def _checkpointing_on(plan) -> bool:
    from .checkpointing import keeps_everything
    return not keeps_everything(plan)     # declared, not named


def _checkpointing_time(plan, figures):
    from mlsysim_plugins.checkpointing_policies import added_step_time
    s, how = added_step_time(plan, hardware_flops=figures["hardware FLOP/s"][0])
    peak = " (at peak FLOP/s: a lower bound)" if s and figures["hardware FLOP/s"][1] != "given" else ""
    return s, f"checkpointing {plan.activation_checkpointing}: {how}{peak}"


_LOWBIT_CAVEAT = "{} block-quantized moments: convergence may differ from fp32 {}"
_UPDATE_NAMES = {"adam": "AdamW"}     # how the caveat names a declared update (``OptimizerStep.update``); else as declared


def _lowbit_candidates(registry) -> list[Candidate]:
    """Every registered optimizer whose step declares quantized moments and an update
    (``OptimizerStep.quantized_moments``, ``update``), but one that declares why it is not offered
    (``not_offered``): the most bytes its moments move first (``moment_traffic``: the least saving first),
    then by name. Its label is its description up to the first colon (else its name); its caveat, its
    moments' bits. ``_quantizes_the_update_of`` offers those of the run's update."""
    from .optimizer_step import step_of
    found = []
    for name, spec in registry.optimizers.items():
        step = step_of(spec)
        if step is None or not step.quantized_moments or not step.update or step.not_offered:
            continue
        label = spec.description.split(":", 1)[0].strip() or name
        caveat = _LOWBIT_CAVEAT.format(step.quantized_moments, _UPDATE_NAMES.get(step.update, step.update))
        found.append((-step.moment_traffic, name, Candidate(name, label, caveat)))
    return [c for *_, c in sorted(found, key=lambda f: f[:2])]


def _lowbit_on(plan) -> bool:
    """The selected optimizer declares quantized moments (``OptimizerStep.quantized_moments``)."""
    from .optimizer_step import step_of
    step = step_of(plan.profile_options.optimizer_spec)
    return step is not None and bool(step.quantized_moments)


def _quantizes_the_update_of(value, given, registry) -> bool:
    """A low-bit optimizer is offered in place of the run's when the run's declares the update it quantizes
    (``OptimizerStep.update``, e.g. ``"adam"``: Adam, AdamW) and quantizes none of its own moments."""
    from .optimizer_step import step_of
    table = registry.optimizers
    own = step_of(_spec(table, OPTIMIZER, "optimizer", registry, given))
    candidate = step_of(_spec(table, OPTIMIZER, "optimizer", registry, value))
    return (own is not None and candidate is not None and bool(own.update)
            and own.update == candidate.update and not own.quantized_moments)


def _lowbit_time(plan, figures):
    from mlsysim_plugins.lowbit_optimizers import added_step_time
    return added_step_time(plan, memory_bandwidth=figures["memory bandwidth B/s"][0])


_FP8 = "fp8 matmuls: numerics differ from bf16"

TECHNIQUES = (
    Technique(name="activation_checkpointing", order=0, keyword="activation_checkpointing", replaces=True,
              description="activation checkpointing (solve's activation_checkpointing): in the ladder only",
              candidates=_checkpointing_candidates,
              offered=_saves_more, active=_checkpointing_on, added_step_time=_checkpointing_time),
    Technique(name="lora", order=5, after="runtime_overheads", apply={"completed": _lora}, relocate=_lora_relocate,
              description="LoRA/QLoRA fine-tuning (lora.py)",
              options={"lora": LORA, "quant_spec": attrs.field(default=None, metadata=_INTERNAL)},
              with_compile=_with_compile("lora_with_compile")),
    Technique(name="loss", order=10, apply=_loss,
              description="the loss implementation: chunked, fused and published losses (loss.py, registered through "
                          "mlsysim_measured_losses: loss_implementations.py)",
              options={"loss": LOSS, "loss_chunks": LOSS_CHUNKS, "loss_token_share": LOSS_TOKEN_SHARE,
                       "loss_implementation": attrs.field(default=None, metadata=_INTERNAL)},
              candidates=[Candidate("chunked", "chunked cross-entropy (torchtune)"),
                          Candidate("fused_linear", "fused linear cross-entropy (Liger)")],
              active=lambda plan: _chosen_loss(plan) is not None,
              added_step_time=_loss_time, with_compile=_with_compile("accepted_with_compile")),
    Technique(name="optimizer_in_backward", order=20, apply=_oib, relocate=_oib_relocate,
              description="the optimizer step in the backward (optimizer_in_backward.py)",
              options={"optimizer_in_backward": OPTIMIZER_IN_BACKWARD},
              candidates=[Candidate(True, "optimizer step in the backward")],
              active=lambda plan: bool(plan.profile_options.optimizer_in_backward), added_step_time=_oib_time,
              with_compile=_with_compile("optimizer_in_backward_with_compile")),
    Technique(name="activation_offload", order=30, apply=_activation_offload,
              description="activation offload to host memory (offload_activations.py)",
              options={"activation_offload": ACTIVATION_OFFLOAD},
              candidates=[Candidate("save_on_cpu", "activation offload: save_on_cpu"),
                          Candidate("torchtune", "activation offload: torchtune")],
              active=lambda plan: bool(plan.profile_options.activation_offload),
              added_step_time=_activation_offload_time,
              with_compile=_with_compile("activation_offload_with_compile")),
    Technique(name="offload", order=35, after="stage_layers", apply={"given": _offload_given, "last": _offload_last},
              relocate=_offload_relocate,
              description="optimizer state, gradients, parameters in host memory (parallel.py; torchao's "
                          "CPUOffloadOptimizer: cpu_offload.py)",
              options={"offload": OFFLOAD, "cpu_offload_optimizer": attrs.field(default=None, metadata=_INTERNAL)},
              candidates=[Candidate("optimizer", "optimizer state on the host (CPU step)"),
                          Candidate("optimizer+gradients", "optimizer state and gradients on the host"),
                          Candidate("optimizer+gradients+parameters", "optimizer, gradients, parameters on the host"),
                          Candidate("torchao", "torchao CPUOffloadOptimizer (host states and parameter copies)"),
                          Candidate("torchao+gradients", "torchao CPUOffloadOptimizer, offload_gradients=True")],
              active=_offload_on, added_step_time=_offload_time,
              with_compile=_with_compile("offload_with_compile")),
    Technique(name="low_bit_optimizer", order=37, keyword="optimizer",
              description="a low-bit AdamW (solve's optimizer, in place of one declaring its update, adam or adamw): "
                          "in the ladder only",
              candidates=_lowbit_candidates,
              offered=_quantizes_the_update_of,
              active=_lowbit_on, added_step_time=_lowbit_time),
    Technique(name="compile", order=40, after="float8", apply=_compile, options={"compile": COMPILE,
                                                                        "compile_checkpoint": COMPILE_CHECKPOINT},
              description="torch.compile (Inductor): the partitioner's saved set and the fused loss (compile.py)",
              with_compile=_with_compile("accepted_with_compile")),
    Technique(name="rope_cache", order=3, after="device", apply={"completed": _rope_cache},
              description="torchtune's persistent RoPE cache in place of Hugging Face's per-forward tables (rope.py)",
              options={"rope_cache": ROPE_CACHE, "rope_cache_dtype": ROPE_CACHE_DTYPE,
                       "rope_cache_layout": ROPE_CACHE_LAYOUT, "rope_cache_per_layer": ROPE_CACHE_PER_LAYER},
              with_compile=_with_compile("accepted_with_compile")),
    Technique(name="kv_expanded", order=3.5, after="rope_cache_layout", apply={"completed": _kv_expanded},
              description="keys and values expanded to every query head before the attention kernel, the copies "
                          "saved (torchtune's grouped-query attention; kv_expand.py)",
              options={"kv_expanded": KV_EXPANDED},
              with_compile=_with_compile("accepted_with_compile")),
    Technique(name="float8", order=50, apply=_float8, description="torchao float8 / TransformerEngine FP8 (float8.py)",
              options={"float8": FLOAT8},
              candidates=[Candidate("tensorwise", "float8 training: tensorwise", _FP8),
                          Candidate("rowwise", "float8 training: rowwise", _FP8)],
              active=lambda plan: bool(plan.profile_options.float8), added_step_time=_float8_time,
              with_compile=_NOT_COMPILED),
)


@hookimpl
def mlsysim_measured_techniques():
    return list(TECHNIQUES)
