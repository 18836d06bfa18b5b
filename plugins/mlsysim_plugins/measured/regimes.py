"""Training regimes: which dtype each kind of tensor has.

A regime is what the measured-grade profile asks instead of one ``precision``: weights,
gradients, an optional fp32 master copy, optimizer state, the dtype matmuls produce
(``compute``) and the residual stream between layers. Bytes per element throughout.
"""

from __future__ import annotations

from typing import Mapping

import attrs

from mlsysim_core import hookimpl
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError, NotModelledError


@attrs.frozen(kw_only=True, cache_hash=True)     # (memo keys hash it: once per object)
class Regime:
    """How one training regime stores and computes.

    ``autocast`` marks torch.autocast regimes: matmuls consume cached 16-bit copies of
    their (fp32) weights, which backward keeps alive (2 B per matmul parameter), while
    the residual stream and norms stay in fp32. ``master`` is an fp32 copy of the weights
    kept by the optimizer (Megatron/DeepSpeed mixed precision), 0 when the weights are
    the master. ``main_grad`` is Megatron's fp32 gradient-accumulation buffer (0: none).
    ``gather``: the bytes a parameter is all-gathered in (FSDP's ``param_dtype``; 0: ``weight``);
    ``reduce``: the bytes a gradient is reduced in across data-parallel ranks (FSDP's
    ``reduce_dtype``, Megatron's ``grad_reduce_in_fp32``; 0: the gradient's own, ``gradient``,
    else ``main_grad``). The step time reads both (``collective_bytes``). ``precision``: the
    solve ``precision`` it runs at when its 16-bit compute is one dtype (``"bf16"``, ``"fp16"``); empty:
    any precision of ``compute`` bytes (``scenario.regime_precisions`` reads it). ``requires``: the capabilities
    (``CAPABILITIES``) its data-parallel rule must declare (``extensions["measured.provides"]``) wherever the run has
    more than one data-parallel rank (``check_rule``); empty (the default): any rule.
    """

    name: str
    description: str
    weight: int
    gradient: int
    master: int
    state: int
    compute: int
    residual: int
    autocast: bool = False
    main_grad: int = 0
    gather: int = 0        # bytes of a parameter all-gathered for compute (FSDP's param_dtype); 0: ``weight``
    reduce: int = 0        # bytes of a gradient reduced across data-parallel ranks (FSDP's reduce_dtype); 0: its own
    frozen: int = 0        # LoRA: bytes of the frozen base as stored where ``weight`` is the adapters' (0: see lora.py)
    precision: str = ""    # the 16-bit dtype it computes in, "bf16" or "fp16" ("": any of its compute bytes)
    requires: tuple = ()   # capabilities its data-parallel rule declares (CAPABILITIES; (): any rule, as before)

    @property
    def pure_16bit(self) -> bool:
        """Everything 16-bit: norms copy their input to fp32 first, so the residual stream
        between layers is not kept for backward."""
        return self.compute == 2 and self.residual == 2

    def collective_bytes(self) -> dict[str, int]:
        """Bytes per element of the data-parallel collectives, by what they move (``steptime``'s
        ``Collective.volume``): ``parameters`` all-gathered (``gather``, else the stored ``weight``),
        ``gradients`` reduce-scattered or all-reduced (``reduce``, else the gradient's own dtype:
        ``gradient``, or Megatron's ``main_grad`` when the model keeps none)."""
        out = {"parameters": self.gather or self.weight}
        grad = self.reduce or self.gradient or self.main_grad
        if grad:
            out["gradients"] = grad
        return out

    def refused_rules(self, registry, rules) -> dict[str, str]:
        """Which of the data-parallel ``rules`` (installed names) this regime refuses wherever dp x cp > 1
        (``check_rule``), each with why: {rule: "regime R needs a data-parallel rule that declares C"}; {} when it
        requires nothing. A search asks it (``search.refused_rules``) to leave those rules out of its layouts with
        more than one data-parallel rank up front, instead of preparing each such layout to refuse it."""
        out = {}
        for rule in rules if self.requires else ():
            missing = [c for c in self.requires if c not in declared(registry, rule)]
            if missing:
                out[rule] = f"regime {self.name!r} needs a data-parallel rule that declares {', '.join(map(repr, missing))}"
        return out


# What a regime may need its data-parallel rule to do (``Regime.requires``), and so what a rule declares it does:
# a tuple of these names under its spec's ``extensions[PROVIDES]`` (docs/hooks.md). The regime asks what the rule
# declares, never its name: a rule registered under another name that declares the capability serves as well.
PROVIDES = "measured.provides"
# FSDP's mixed precision (MixedPrecisionPolicy, FSDP1's MixedPrecision): the rule shards the parameters as stored
# (``weight``) and all-gathers each unit cast to the policy's param_dtype (``gather``), reducing the gradients in its
# reduce_dtype (``reduce``). DeepSpeed's ZeRO and DDP gather (or keep) the parameters in the dtype they are stored in:
# an fp32 shard gathered in bf16 is not a run they can make.
FSDP_MIXED_PRECISION = "fsdp-mixed-precision"
# Megatron-Core's main-grad buffer (megatron.py): the rule lays it out (its options' ``main_grad_terms``: whole on
# every data-parallel rank), as DDP and ZeRO, which count a regime's ``main_grad`` as a copy sharded with the optimizer
# state, do not. mcore-ddp and mcore-distopt declare it; mixed-bf16-main-grad requires it (under zero1 its main grad
# would be sharded as Megatron never lays it out: llama3-8b, dp 8, 47.6 GB where mcore-distopt gives 77.1 GB).
MEGATRON_MAIN_GRAD = "megatron-main-grad"
CAPABILITIES = {FSDP_MIXED_PRECISION: "shards the stored parameters and all-gathers them cast to a param_dtype of "
                                      "their own, FSDP's MixedPrecisionPolicy",
                MEGATRON_MAIN_GRAD: "lays out Megatron-Core's main-grad buffer, whole on every data-parallel rank"}


# The data-parallel collectives' dtypes (``gather``, ``reduce``; ``collective_bytes``):
# * FSDP2 (pytorch/pytorch torch/distributed/fsdp/_fully_shard at v2.13.0, cf30153c4c131c8164ee7798e5022d810682e2cb):
#   _fsdp_api.py MixedPrecisionPolicy, "param_dtype ... the dtype for forward/backward computation and the parameter
#   all-gather. If this is ``None``, then the unsharded parameter uses the original dtype"; "reduce_dtype ... the dtype
#   for gradient reduction (i.e. reduce-scatter or all-reduce). If this is ``None`` but ``param_dtype`` is not
#   ``None``, then the reduction uses the compute dtype"; _fsdp_collectives.py foreach_reduce "reduce_dtype =
#   reduce_dtype or grad_dtype". fsdp-bf16 (torchtitan's param bf16, reduce fp32): gathered in 2 B, reduced in 4 B.
#   Under torch.autocast (amp-*) no policy: the fp32 parameters gathered and their fp32 gradients reduced, 4 B each
#   (as PyTorch DDP all-reduces the fp32 ``.grad`` it buckets).
# * Megatron-Core (NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel.py at
#   001199898c4badd01eaf0785c212d8ed7ce83042): "grad_dtype = torch.float if self.ddp_config.grad_reduce_in_fp32 else
#   param.dtype", the _ParamAndGradBuffer(param_dtype, grad_dtype, ...) whose grad buckets are reduced and whose
#   param buffer (bf16 parameters) the distributed optimizer all-gathers: mixed-bf16-main-grad (Megatron-Bridge's
#   bf16_mixed, grad_reduce_in_fp32=True) reduces in 4 B and gathers in 2 B.
REGIMES: Mapping[str, Regime] = {r.name: r for r in (
    Regime(name="fp32", description="fp32 everything", weight=4, gradient=4, master=0, state=4,
           compute=4, residual=4),
    Regime(name="amp-bf16", description="torch.autocast bf16: fp32 weights, gradients and optimizer "
           "state; bf16 matmuls with cached bf16 weight copies", weight=4, gradient=4, master=0, state=4,
           compute=2, residual=4, autocast=True, precision="bf16"),
    Regime(name="amp-fp16", description="torch.autocast fp16 (with a GradScaler): as amp-bf16 in bytes",
           weight=4, gradient=4, master=0, state=4, compute=2, residual=4, autocast=True, precision="fp16"),
    Regime(name="bf16", description="pure bf16: weights, gradients, optimizer state and activations",
           weight=2, gradient=2, master=0, state=2, compute=2, residual=2, precision="bf16"),
    Regime(name="fp16", description="pure fp16: as bf16 in bytes", weight=2, gradient=2, master=0,
           state=2, compute=2, residual=2, precision="fp16"),
    Regime(name="mixed-bf16", description="Megatron/DeepSpeed mixed precision: bf16 weights and "
           "gradients, fp32 master copy and optimizer state", weight=2, gradient=2, master=4, state=4,
           compute=2, residual=2, precision="bf16"),
    Regime(name="fsdp-bf16", description="FSDP2 MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): "
           "fp32 sharded parameters, gradients and optimizer state; bf16 gathered parameters and activations",
           weight=4, gradient=4, master=0, state=4, compute=2, residual=2, gather=2, reduce=4, precision="bf16",
           requires=(FSDP_MIXED_PRECISION,)),
    Regime(name="mixed-bf16-main-grad", description="mixed-bf16 with Megatron's fp32 main-grad "
           "accumulation buffer (gradients accumulate in fp32)", weight=2, gradient=0, master=4, state=4,
           compute=2, residual=2, main_grad=4, reduce=4, precision="bf16", requires=(MEGATRON_MAIN_GRAD,)),
)}

# FSDP's MixedPrecision over a model stored in 16 bits: HF Trainer's QLoRA under FSDP (the base loaded in bf16 with
# bnb_4bit_quant_storage=bfloat16; transformers' update_fsdp_plugin_peft sets the policy in that dtype), peft's fp32
# adapters (``lora.lora_regime``) gathered and reduced in bf16. Measured: validation/lora_fsdp1 (the qlora-* runs).
REGIMES = {**REGIMES, "fsdp-bf16-stored": Regime(
    name="fsdp-bf16-stored", description="FSDP MixedPrecision(param_dtype=bf16, reduce_dtype=bf16) over bf16-stored "
    "parameters: bf16 weights, gradients, optimizer state, gathers, reductions and activations",
    weight=2, gradient=2, master=0, state=2, compute=2, residual=2, gather=2, reduce=2, precision="bf16",
    requires=(FSDP_MIXED_PRECISION,))}

# accelerate's FSDP mixed precision (accelerate 1.16.0): FullyShardedDataParallelPlugin.set_mixed_precision
# (utils/dataclasses.py lines 2008-2013) builds MixedPrecision / MixedPrecisionPolicy(param_dtype=dtype,
# reduce_dtype=dtype) from the run's "bf16"/"fp16" (FSDP1's buffer_dtype too), so gradients are reduced in 16 bits,
# not fp32 as torchtitan's fsdp-bf16; the trainable parameters are upcast to fp32 before sharding "if
# mixed_precision != 'no'" (accelerator.py line 1970 for FSDP1, utils/fsdp_utils.py line 801 for FSDP2), so the
# shards, their gradients and the optimizer state stay fp32. Under FSDP2's unsynced accumulation the unsharded
# gradients accumulate in reduce_dtype (fsdp.py's "step"), 2 B here; measured in validation/fsdp_no_sync.
ACCELERATE_FSDP = Regime(
    name="fsdp-bf16-reduce-bf16", description="FSDP MixedPrecision(param_dtype=bf16, reduce_dtype=bf16), "
    "accelerate's: fp32 sharded parameters, gradients and optimizer state; bf16 gathered parameters, reduced "
    "gradients and activations", weight=4, gradient=4, master=0, state=4, compute=2, residual=2, gather=2, reduce=2,
    precision="bf16", requires=(FSDP_MIXED_PRECISION,))
REGIMES = {**REGIMES, ACCELERATE_FSDP.name: ACCELERATE_FSDP}

# The fp16 counterparts of the FSDP regimes the launch readers choose (a run with fp16 mixed precision: V100, T4,
# A10). accelerate 1.16.0's set_mixed_precision("fp16") gives param_dtype = reduce_dtype = fp16 (utils/dataclasses.py
# lines 2008-2013; transformers' update_fsdp_plugin_peft the QLoRA storage dtype): every tensor the bf16 regime keeps
# in 2 B is kept in 2 B, so the bytes are bf16's. fp16 adds accelerate's loss scaler (accelerator.py lines 536-555:
# FSDP1 torch's ShardedGradScaler, FSDP2 torch.amp.GradScaler), whose tensors are scalars (torch 2.13
# amp/grad_scaler.py and distributed/fsdp/sharded_grad_scaler.py: the fp32 scale and int32 growth tracker kept, 8 B;
# found_inf, 4 B, through the step; inv_scale freed when unscale_ returns; the scaled loss replaces the loss) and
# which unscales the gradients in place (_amp_foreach_non_finite_check_and_unscale_): not priced (8 B, 12 B in the
# step; measured in validation/fsdp_no_sync, the fsdp-fp16-reduce-fp16 runs: every phase the bf16 run's plus those).
REGIMES = {**REGIMES, **{r.name: r for r in (
    Regime(name="fsdp-fp16-reduce-fp16", description="FSDP MixedPrecision(param_dtype=fp16, reduce_dtype=fp16), "
           "accelerate's, with its loss scaler: fp32 sharded parameters, gradients and optimizer state; fp16 gathered "
           "parameters, reduced gradients and activations (bytes as fsdp-bf16-reduce-bf16)",
           weight=4, gradient=4, master=0, state=4, compute=2, residual=2, gather=2, reduce=2, precision="fp16",
           requires=(FSDP_MIXED_PRECISION,)),
    Regime(name="fsdp-fp16-stored", description="FSDP MixedPrecision(param_dtype=fp16, reduce_dtype=fp16) over "
           "fp16-stored parameters, with a loss scaler: fp16 weights, gradients, optimizer state, gathers, reductions "
           "and activations (bytes as fsdp-bf16-stored)",
           weight=2, gradient=2, master=0, state=2, compute=2, residual=2, gather=2, reduce=2, precision="fp16",
           requires=(FSDP_MIXED_PRECISION,)),
)}}

# The measured profile's regime when only the reference's ``precision`` is given: 16-bit
# training with Adam in PyTorch is almost always autocast (AMP).
DEFAULT_FOR_PRECISION = {"fp32": "fp32", "tf32": "fp32", "bf16": "amp-bf16", "fp16": "amp-fp16"}


def regime_for(regime, precision: str, regimes: Mapping[str, Regime] = REGIMES) -> Regime:
    """The regime named ``regime`` among ``regimes`` (the registered ones), or the default for
    ``precision`` when it is None; a ``Regime`` object is checked, not trusted."""
    if regime is None:
        name = DEFAULT_FOR_PRECISION.get(precision)
        if name is None or name not in regimes:
            raise NotModelledError(
                "precision", precision,
                f"one of {', '.join(DEFAULT_FOR_PRECISION)} for the measured profile, or name a regime "
                f"with regime= ({', '.join(regimes)})",
                "8- and 4-bit training regimes are not modelled yet; the measured profile's 8-bit training is float8 "
                "linears over 16-bit weights (precision='bf16', regime='bf16', float8=NAME; --precision bf16 --regime "
                "bf16 --float8 NAME), and its 8- and 4-bit weights are QLoRA's (lora={'rank': N, 'quantization': "
                "'nf4'|'fp4'|'int8'}; --lora-rank N --quantization nf4|fp4|int8)")
        return regimes[name]
    if isinstance(regime, Regime):
        return check_modelled(regime)
    from mlsysim_core.registry import resolve_name     # case and separators ignored, a likely name said
    return check_modelled(regimes[resolve_name("regime", regime, regimes, f"one of {', '.join(regimes)}")])


# The dtype layouts the activation formulas describe: (compute, residual, autocast).
MODELLED_LAYOUTS = {(4, 4, False): "fp32", (2, 4, True): "autocast", (2, 2, False): "16-bit"}


def check_modelled(regime: Regime) -> Regime:
    """A regime (built-in, registered by a plugin or built by hand) whose activations the
    profile can describe: 16- or 32-bit matmul outputs and residual stream, autocast only
    over an fp32 residual stream. Anything else (8-bit compute, say) is refused by name,
    never costed as the nearest known layout."""
    layout = (regime.compute, regime.residual, regime.autocast)
    if layout not in MODELLED_LAYOUTS:
        raise NotModelledError(
            "regime", regime.name,
            "a regime whose compute and residual bytes and autocast are one of: "
            + "; ".join(f"compute={c} B, residual={r} B, autocast={a} ({what})"
                        for (c, r, a), what in MODELLED_LAYOUTS.items()),
            f"regime {regime.name!r} has compute={regime.compute} B, residual={regime.residual} B, "
            f"autocast={regime.autocast}: its activations are not modelled")
    for field in ("weight", "gradient", "master", "state", "main_grad", "gather", "reduce", "frozen"):
        value = getattr(regime, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 8:
            raise NotModelledError("regime", regime.name, f"{field} in bytes per element, 0 to 8",
                                   f"regime {regime.name!r} has {field}={value!r}")
    needs = regime.requires
    if not isinstance(needs, tuple) or not all(isinstance(c, str) and c for c in needs):
        raise InvalidInputTypeError("regime", regime.name, "requires: a tuple of capability names a data-parallel "
                                    f"rule declares (e.g. ({FSDP_MIXED_PRECISION!r},)), or () for any rule",
                                    f"regime {regime.name!r} has requires={needs!r}")
    return regime


def check_rule(plan, registry) -> None:
    """Refuse a regime under a data-parallel rule that does not declare what the regime needs (``Regime.requires``,
    read against the rule's ``extensions[PROVIDES]``): inputs that contradict each other, an ``InvalidInputError``
    naming the regime, the rule and the installed rules that would do, as the regime/precision contradiction is
    (``scenario.check_contradictions``). Not a ``LayoutError``: no other data-parallel size makes the pair possible,
    so ``fit devices`` says this instead of skipping every size; a search does not enumerate the rule's layouts with
    dp x cp > 1 (``Regime.refused_rules``). On one data-parallel rank (dp x cp = 1) no rule shards or communicates, so every rule serves (the
    search enumerates that layout once, as zero0: ``search.unsharded_at_one_rank``)."""
    regime = plan.profile_options.regime
    needs = regime.requires
    if not needs or plan.dp_size * plan.cp_size == 1:
        return
    name = plan.rules["dp"]
    provides = declared(registry, name)
    missing = [c for c in needs if c not in provides]
    if missing:
        rules = [n for n, spec in registry.sharding_rules.items() if spec.axis == "dp"
                 and all(c in declared(registry, n) for c in needs)]
        what = "; ".join(f"declares {c!r}" + (f": one that {CAPABILITIES[c]}" if c in CAPABILITIES else "") for c in missing)
        raise InvalidInputError("data_parallel", name,
                                f"a data-parallel rule that declares {', '.join(map(repr, needs))} under regime "
                                f"{regime.name!r} (installed: {', '.join(rules) or 'none'}), or a regime that needs "
                                "no such rule",
                                f"regime {regime.name!r} needs a rule that {what}; rule {name!r} declares "
                                + (', '.join(map(repr, provides)) if provides else "none")
                                + f", and dp x cp = {plan.dp_size * plan.cp_size}")


def declared(registry, rule: str) -> tuple:
    """The capabilities sharding rule ``rule`` declares (``extensions[PROVIDES]``; none: ``()``); a declaration that
    is not a tuple of names (a bare string would match by substring) is the rule's plugin's error, named."""
    value = registry.sharding_rules[rule].extensions.get(PROVIDES) or ()
    if not isinstance(value, (tuple, list, frozenset)) or not all(isinstance(c, str) for c in value):
        from mlsysim_core.registry import SHARDING
        raise registry.provider(SHARDING, rule).error(
            f"declares sharding rule {rule!r} with extensions[{PROVIDES!r}]={value!r}: a tuple of capability names, "
            f"e.g. ({FSDP_MIXED_PRECISION!r},)", "mlsysim_sharding_rules")
    return tuple(value)


@hookimpl
def mlsysim_measured_regimes():
    return list(REGIMES.values())
