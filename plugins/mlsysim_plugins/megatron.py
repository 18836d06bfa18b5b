"""Megatron-Core's distributed optimizer as a data-parallel rule: ``mcore-distopt``.

Megatron-Core (``--use-distributed-optimizer``) keeps every parameter's gradient in one
contiguous buffer per dtype (``megatron/core/distributed/param_and_grad_buffer.py``,
``_ParamAndGradBuffer``: ``self.grad_data = torch.zeros(self.numel, dtype=self.grad_dtype)``),
the whole model's, on every data-parallel rank; the reduce-scatter runs in place inside it. Only
the fp32 main parameters and the Adam moments are sharded over the data-parallel ranks (with
context parallelism: dp x cp, ``data_parallel_group(with_context_parallel=True)``;
``megatron/core/optimizer/distrib_optimizer.py``). Per parameter, with bf16 parameters and fp32
gradients (``docs/user-guide/features/dist_optimizer.md``): ``6 + 12/d`` bytes (2 bf16 weight +
4 fp32 main-grad + (4 master + 4 + 4 Adam) / d), not ZeRO-1's ``2 + 16/d``.

``--grad-reduce-in-bf16`` (``grad_reduce_in_bf16=True``; also Megatron's ``--fp16`` without
``--accumulate-allreduce-grads-in-fp32``) keeps a 16-bit grad buffer (2 B per parameter), and
the optimizer step copies its shard to fp32 (``_copy_model_grads_to_main_grads``:
``shard_main_param.grad = shard_model_grad.float()``, a new 4 B / d tensor, alive from the step
until ``zero_grad`` at the next iteration's start): ``4 + 16/d`` during the step, as the docs'
fp16 row. With fp32 grads ``.float()`` is the buffer's own view: no copy.

The bucket buffers are the grad buffer itself (reduce-scatter in place; the parameter
all-gather in place into the contiguous bf16 ``param_data``): no bytes beyond it. Not
modelled: the alignment padding (each parameter's start at a multiple of 64 elements, each
bucket's end at a multiple of lcm(dp, 128), ``megatron/core/optimizer/param_layout.py``): at
most 63 elements per parameter tensor plus lcm(dp, 128) - 1 per bucket, in the weight and
grad buffers' dtypes (kilobytes on the models here).

Measured grade: needs a regime with Megatron's main-grad buffer (``mixed-bf16-main-grad``).
The rule's options object carries ``main_grad_terms(plan, placement)``, which the measured
profile's optimizer state calls instead of its own main-grad term (``optimizers.master_terms``):
a data-parallel rule that lays the main-grad buffer out its own way declares it there.

``gradient_accumulation_fusion`` (Megatron-LM's default: on unless ``--no-gradient-accumulation-fusion``;
megatron-core's ``ModelParallelConfig`` default and this option's: off): each linear's weight gradient is
written into ``main_grad`` by its GEMM, and the backward returns a dummy instead:
TransformerEngine's ``get_dummy_wgrad`` (NVIDIA/TransformerEngine v2.7
fedd9ddc739a4f28b2ee705df5577d20d33400ec ``transformer_engine/pytorch/module/base.py`` lines
94-107: a ``torch.empty`` in a module-level dict keyed by (rows, cols, dtype), never freed),
returned by TE's ``Linear`` (``module/linear.py`` lines 908-926: ``linear_proj``, ``linear_fc2``)
and ``LayerNormLinear`` (``module/layernorm_linear.py`` lines 956-972: ``linear_qkv``,
``linear_fc1``) in the weight's dtype, and by megatron-core's LM head (NVIDIA/Megatron-LM
core_v0.14.0 23e00ed0963c35382dfe8a5a94fb3cda4d21e133 ``megatron/core/tensor_parallel/layers.py``
lines 573-602, TE's dummy when TE is installed, in the input's dtype). So one 16-bit tensor per
distinct weight shape of the rank, for the process's life: ``dummy_wgrad_terms``. The dummy is
a detached view, so autograd's ``AccumulateGrad`` takes it as ``.grad`` without a copy, and the
DDP hook drops it (``distributed/distributed_data_parallel.py`` lines 519-524: no add once
``grad_added_to_main_grad``).

With tied embeddings on one stage (``language_module.py`` line 193 sets ``zero_out_wgrad`` on the
shared weight: the LM head's dummy is zero-filled), the LM head's dummy waits in autograd's input
buffer of the shared weight until the lookup's gradient arrives; PyTorch adds in place only into
the first arrival and only if it holds its storage alone (pytorch/pytorch 00d40e7f7a11
``torch/csrc/autograd/input_buffer.cpp`` ``accumulate``, ``can_accumulate_inplace``: the storage's
use count 1), which the cached dummy's is not: the sum is a new tensor. New at the end of the
backward: the lookup's 16-bit [V/tp, h] gradient (``embedding_dense_backward``, the weight's
dtype) and the out-of-place sum, 2 x V x h / tp x 2 B, which the DDP hook adds into ``main_grad``
(``tied_gradient_terms``; the measured profile's own term, the fp32 partials and their sum, is
PyTorch's without Megatron's hook).

Source: NVIDIA/Megatron-LM at d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22).
"""

from __future__ import annotations

import attrs

from mlsysim_core import LayoutError, ShardingEffect, ShardingRuleSpec, hookimpl
from mlsysim_core.errors import NotModelledError
from mlsysim_core.memo import memoize
from mlsysim_core.terms import ACTIVATIONS, BACKWARD_END, OPTIMIZER_STATE, OPTIMIZER_STEP, PHASES, MemoryTerm
from mlsysim_plugins.steptime_hookspecs import COLLECTIVES as STEPTIME_COLLECTIVES, Collective
from mlsysim_plugins.measured.term_keys import TIED_EMBEDDING_GRAD

NAME = "mcore-distopt"
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"


def _fmt(x) -> str:
    return f"{x:,.0f}"


@attrs.frozen(kw_only=True)
class DistOptOptions:
    """``grad_reduce_in_bf16``: Megatron's ``--grad-reduce-in-bf16`` (a 16-bit grad buffer; the
    step copies the rank's shard to fp32). False: the fp32 main-grad buffer (bf16 training's
    default, ``accumulate_allreduce_grads_in_fp32``)."""

    grad_reduce_in_bf16: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    # Megatron's gradient_accumulation_fusion: the weight gradients written into main_grad by the
    # GEMMs, TransformerEngine's cached dummies returned (off: megatron-core's ModelParallelConfig
    # default, core_v0.14.0 megatron/core/model_parallel_config.py line 145).
    gradient_accumulation_fusion: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def main_grad_terms(self, plan, placement) -> list[MemoryTerm]:
        """The grad buffer, whole on every rank, and (16-bit buffer) the step's fp32 copy of
        this rank's shard; with ``gradient_accumulation_fusion`` TransformerEngine's cached dummy
        weight gradients. Called by the measured profile's optimizer state."""
        from mlsysim_plugins.measured.parallel import gradient_divisor, optimizer_state_divisor
        regime = plan.profile_options.regime
        if self.gradient_accumulation_fusion and not regime.main_grad:
            raise NotModelledError(
                "gradient_accumulation_fusion", True,
                "a regime with Megatron's main-grad buffer (regime='mixed-bf16-main-grad')",
                f"the fused weight-gradient accumulation writes into main_grad; regime {regime.name!r} has none")
        if not regime.main_grad:
            if placement.optimizer_state_shards == 1:
                return []       # one rank, no main-grad buffer: nothing of its own (zero0)
            raise NotModelledError(
                "data_parallel", NAME,
                "a regime with Megatron's main-grad buffer (regime='mixed-bf16-main-grad')",
                f"regime {regime.name!r} has no main-grad buffer: Megatron-Core always accumulates into one")
        params = placement.trainable_parameters_per_rank / gradient_divisor(placement)
        b = 2 if self.grad_reduce_in_bf16 else regime.main_grad
        terms = [MemoryTerm(
            component=OPTIMIZER_STATE, label=f"main-grad buffer ({8 * b}-bit, whole on every data-parallel rank)",
            phases=PHASES, nbytes=params * b,
            formula=f"{_fmt(params)} trainable params/rank x {b} B (Megatron-Core's grad buffer, not sharded "
                    "by the distributed optimizer)")]
        if b < 4:
            shard = placement.trainable_parameters_per_rank / optimizer_state_divisor(placement)
            terms.append(MemoryTerm(
                component=OPTIMIZER_STATE, label="fp32 copy of the grad shard (optimizer step)",
                phases=(OPTIMIZER_STEP,), nbytes=shard * 4,
                formula=f"{_fmt(shard)} params/rank (the rank's shard) x 4 B (shard_main_param.grad = "
                        "shard_model_grad.float())"))
        return terms + self.dummy_wgrad_terms(plan)

    def dummy_wgrad_terms(self, plan) -> list[MemoryTerm]:
        """TransformerEngine's cached dummy weight gradients (module docstring): one tensor in the
        weights' dtype per distinct per-rank shape of Megatron's fused modules, ``linear_qkv``
        [(heads + 2 kv_heads) x head_dim / tp, h], ``linear_proj`` [h, heads x head_dim / tp],
        ``linear_fc1`` [(2 if gated) x ffn / tp, h], ``linear_fc2`` [h, ffn / tp], and on the stage
        with the LM head [V / tp, h]; alive from the first backward on (every phase of a step). Booked
        beside the main-grad buffer, as optimizer state (the regime's gradients are that buffer)."""
        if not self.gradient_accumulation_fusion:
            return []
        shapes = dummy_wgrad_shapes(plan)
        b = plan.profile_options.regime.weight
        nbytes = sum(r * c for r, c in shapes) * b
        return [MemoryTerm(
            component=OPTIMIZER_STATE, label="TransformerEngine's dummy weight gradients (gradient_accumulation_fusion)",
            phases=PHASES, nbytes=nbytes,
            formula="(" + " + ".join(f"{r:,} x {c:,}" for r, c in shapes) + f") x {b} B (get_dummy_wgrad: one cached "
                    "tensor per distinct weight shape, never freed)")]

    def tied_gradient_terms(self, plan, placement) -> list[MemoryTerm] | None:
        """The tied embedding's gradient at the end of the backward, when the LM head and the
        lookup share one stage (module docstring); None: the measured profile's own term."""
        if not self.gradient_accumulation_fusion:
            return None
        from mlsysim_plugins.measured.shapes import shape_of
        shape = shape_of(plan)
        tp = plan.tp_size
        E = shape.vocab * shape.hidden // tp
        b = plan.profile_options.regime.weight
        on_tp = f" / tp={tp}" if tp != 1 else ""
        return [MemoryTerm(
            component=ACTIVATIONS, key=TIED_EMBEDDING_GRAD,
            label="tied embedding gradient: the lookup's and its sum with the LM head's dummy",
            phases=(BACKWARD_END,), nbytes=2 * E * b,
            formula=f"2 x V x h{on_tp} x {b} B (embedding_dense_backward's output, then its out-of-place sum with "
                    "the cached zero dummy; the LM head's part is in main_grad)")]


def dummy_wgrad_shapes(plan) -> tuple[tuple[int, int], ...]:
    """The distinct (rows, cols) of the weights whose backward returns TransformerEngine's dummy
    on this rank (``DistOptOptions.dummy_wgrad_terms``), in first-use order."""
    from mlsysim_plugins.measured.shapes import shape_of
    shape = shape_of(plan)
    if shape.experts:
        raise NotModelledError("gradient_accumulation_fusion", True, "a dense model",
                               "the dummy weight gradients of Megatron's expert layers are not derived")
    tp, h = plan.tp_size, shape.hidden
    f = shape.ffn * (2 if shape.family.gated_mlp else 1)
    shapes = [((shape.q_dim + 2 * shape.kv_dim) // tp, h), (h, shape.q_dim // tp), (f // tp, h), (h, shape.ffn // tp)]
    rank = plan.rank
    if rank is None or rank.last:       # the LM head (megatron-core's ColumnParallelLinear)
        shapes.append((shape.vocab // tp, h))
    return tuple(dict.fromkeys(shapes))


@attrs.frozen(kw_only=True)
class DDPOptions(DistOptOptions):
    """Megatron-Core's DDP without the distributed optimizer: the same grad buffer; the fp32
    master weights and Adam state whole on every rank (18 B per parameter with bf16 weights)."""


@memoize
def effect(d):
    notes = (f"Megatron-Core distributed optimizer: fp32 master weights and optimizer state sharded over "
             f"{d} data-parallel ranks; the main-grad buffer and the 16-bit weights whole on every rank.",) \
        if d > 1 else ()
    return ShardingEffect(optimizer_state_shards=d, notes=notes)


def _megatron_regime(plan, name):
    """Megatron-Core always accumulates into its main-grad buffer: under a profile with regimes
    (measured), a regime without one is not a Megatron run, refused as a layout this rule cannot
    place (a search leaves the rule out there, as any impossible layout). On one data-parallel
    rank nothing is sharded: the rule is zero0, as every built-in dp rule (it declares
    search.unsharded_at_one_rank)."""
    regime = getattr(plan.profile_options, "regime", None)
    if plan.dp_size * plan.cp_size > 1 and regime is not None and not getattr(regime, "main_grad", 0):
        raise LayoutError("data_parallel", name, "a regime with Megatron's main-grad buffer "
                          f"(regime='mixed-bf16-main-grad'); regime {regime.name!r} has none")


def apply(plan, options):
    _megatron_regime(plan, NAME)
    return effect(plan.dp_size * plan.cp_size)


def _dp(kind, overlaps):     # (the all-gather moves the updated bf16 parameters, the reductions the main grads)
    return Collective(kind=kind, volume="parameters" if kind == "all-gather" else "gradients", group="dp", per="step", overlaps=overlaps, **{overlaps: 1})


# With --overlap-grad-reduce the buckets are reduce-scattered beside the last micro-batch's
# backward; with --overlap-param-gather the updated shards are all-gathered beside the next
# forward (distributed_data_parallel.py, distrib_optimizer.py): once per step each.
COLLECTIVES = (_dp("reduce-scatter", "backward"), _dp("all-gather", "forward"))


def ddp_apply(plan, options):
    _megatron_regime(plan, "mcore-ddp")
    return ShardingEffect()


DDP_COLLECTIVES = (_dp("all-reduce", "backward"),)


# What the measured profile's regimes may ask of the rule (measured/regimes.py, Regime.requires): Megatron-Core's
# main-grad buffer, laid out by the rule (its options' main_grad_terms: whole on every data-parallel rank).
MEASURED_PROVIDES = ("megatron-main-grad",)


@hookimpl
def mlsysim_sharding_rules():
    return [ShardingRuleSpec(
        name="mcore-ddp", axis="dp", apply=ddp_apply, options_type=DDPOptions,
        extensions={"search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: DDP_COLLECTIVES,
                    "measured.provides": MEASURED_PROVIDES},
        description="Megatron-Core DDP (no distributed optimizer): nothing sharded; gradients all-reduced in "
                    "place in the main-grad buffer (no bucket copies)"), ShardingRuleSpec(
        name=NAME, axis="dp", apply=apply, options_type=DistOptOptions,
        extensions={"search.unsharded_at_one_rank": True, STEPTIME_COLLECTIVES: COLLECTIVES,
                    "measured.provides": MEASURED_PROVIDES},
        description="Megatron-Core distributed optimizer: fp32 master weights and Adam state / dp; the whole "
                    "main-grad buffer on every rank (6 + 12/d B per parameter, bf16 weights, fp32 grads)")]
