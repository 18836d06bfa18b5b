"""The measured profile: architecture-aware, phase by phase, validated against memory
PyTorch measures (``validation/``, ``docs/validation.md``).

This plugin gives the terms that belong to no optimizer or checkpointing strategy:
weights and gradients in the regime's dtypes, the activations outside the decoder layers
(embedding, final norm, logits and cross-entropy, AMP's weight copies, the end of the
backward) and the runtime overheads. What the selected optimizer, strategy and rules declare
under the measured profile's keys of their ``extensions`` (``CALLABLES``: ``measured.state_terms``,
``measured.activation_terms``, ``measured.buffer_terms``) does the rest; the total is the peak phase.
"""

from mlsysim_core import ProfileSpec, hookimpl
from .._lazy import lazy_module
from . import hookspecs
from .checkpointing import recomputes_first_layer
from .techniques import relocate
from .loss_implementations import mlsysim_measured_losses  # noqa: F401  (the built-in loss implementations)
from .quantizations import mlsysim_measured_quant_implementations  # noqa: F401  (the built-in 4-bit implementations)
from .quant_bnb_legacy import legacy_bnb_quant_implementations  # noqa: F401  (bitsandbytes < 0.43.2)
from .options import MeasuredOptions, assemble, prepare

model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")
parallel = lazy_module(globals(), "parallel", "mlsysim_plugins.measured.parallel")
buffers = lazy_module(globals(), "buffers", "mlsysim_plugins.measured.buffers")


def _recomputes(plan) -> bool:
    """Is layer 0 recomputed at the backward's end? What the selected strategy declares."""
    return recomputes_first_layer(plan)


@hookimpl
def mlsysim_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(hookspecs)


@hookimpl
def mlsysim_profiles():
    return [ProfileSpec(name="measured", combine="peak",
                        description="architecture-aware, peak over the phases of an iteration; validated "
                                    "against PyTorch's MemTracker",
                        component_plugins=("measured_profile",), options_type=MeasuredOptions,
                        registration_hooks=hookspecs.HOOKS, assemble=assemble,
                        prepare=prepare, ranks=_ranks, relocate=_offload,
                        # PyTorch's and Hugging Face's TP plans keep the norms' activations replicated
                        # (validation/parallel/tp_phases: the forward and backward exact without SP).
                        sequence_parallel=False,
                        # what it declares (plugin API 2.4): the specs' measured.* extensions; its prepare
                        # refuses runs it cannot describe, per micro-batch; whole micro-batches only; a
                        # learned position table caps the sequence; a solve costs ~16 reference ones
                        callables=CALLABLES, checks_layouts=True, exact_batch=True,
                        sequence_limit=_sequence_limit, solve_cost=16.0, techniques=_fit_techniques,
                        details=_details)]


# The keys of a spec's extensions the measured profile calls (plugin API 3.0; docs/hooks.md): an
# optimizer's state terms, a strategy's activation terms, a rule's buffers (replacing its effect's).
CALLABLES = {"optimizer": "measured.state_terms", "checkpointing": "measured.activation_terms",
             "sharding": "measured.buffer_terms"}
NOTES = "measured.notes"     # an optimizer's notes(plan): what a result with it says (unvalidated, ...)


def _details(plan):
    """What a measured result says beyond the core's fields: the regime it ran in, and the float8
    recipe its memory is (a float8 implementation's name given is read as the one it declares)."""
    o = plan.profile_options
    return {"regime": o.regime.name, **({"float8": o.float8} if o.float8 is not None else {})}


def _fit_techniques(*args, **kwargs):
    """The technique ladder (``fit techniques``): ``technique_fit.fit_techniques``."""
    from .technique_fit import fit_techniques
    return fit_techniques(*args, **kwargs)


def _sequence_limit(model):
    """The rows of the model's learned position table (None: no table, no limit)."""
    from .shapes import position_table_rows
    return position_table_rows(model)


def _ranks(plan, placement):
    """The distinct ranks of a parallel layout (first, middle and last pipeline stages of the
    rules' placement); None for one device."""
    return parallel.rank_classes(plan, placement) if parallel.is_parallel(plan) else None


def _offload(plan, weights, gradients, optimizer_state):
    """What the techniques move to the host or free (``Technique.relocate``, in their order)."""
    return relocate(plan, weights, gradients, optimizer_state)


@hookimpl
def mlsysim_weight_terms(plan, placement):
    return model.weight_terms(plan, placement)


def _split_model(plan, placement) -> bool:
    """Do the rules split the model itself (pipeline stages, tensor or context parallelism)?
    Data and expert parallelism alone leave every rank the whole model's activations and loss."""
    return plan.rank is not None and \
        placement.pipeline_stages * placement.tensor_shards * placement.sequence_shards > 1


@hookimpl
def mlsysim_gradient_terms(plan, placement):
    if _split_model(plan, placement):     # a parallel layout: this rank's own stage
        return parallel.rank_gradient_terms(plan, placement)
    return model.gradient_terms(plan, placement, first_layer_late=_recomputes(plan))


@hookimpl
def mlsysim_activation_terms(plan, placement):
    return model.model_activation_terms(plan, placement, recompute=_recomputes(plan))


@hookimpl
def mlsysim_communication_buffer_terms(plan, placement, model_states):
    """Offload's staging buffers (the data-parallel and expert-parallel rules own theirs)."""
    return buffers.offload_staging(plan, placement) if plan.profile_options.offload else []


@hookimpl
def mlsysim_runtime_overhead_terms(plan, placement, allocated):
    if plan.profile_options.runtime_overheads is None:
        return []
    return model.runtime_terms(plan, plan.profile_options.runtime_overheads, allocated, placement)
