"""A training regime for the measured profile: bf16 weights, gradients and activations,
with the optimizer's state kept in fp32 and no fp32 master copy (an optimizer that keeps
its moments in fp32 over bf16 parameters). Select it with regime="myorg.bf16-fp32-state"."""

from mlsysim_core import hookimpl
from mlsysim_plugins.measured.regimes import Regime, check_modelled

BF16_FP32_STATE = check_modelled(Regime(   # check_modelled: refuse a layout the profile cannot describe, now
    name="myorg.bf16-fp32-state",
    description="bf16 weights, gradients and activations; fp32 optimizer state; no master copy",
    weight=2,        # bytes per parameter
    gradient=2,      # bytes per gradient element
    master=0,        # no fp32 master copy
    state=4,         # each optimizer moment, per element
    compute=2,       # matmul outputs (the activations' dtype)
    residual=2,      # the residual stream between layers
))


@hookimpl
def mlsysim_measured_regimes():
    return [BF16_FP32_STATE]
