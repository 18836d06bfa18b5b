"""8-bit Adam (Dettmers et al. 2022, bitsandbytes ``Adam8bit``): both moments quantized
block-wise to 8 bits.

Reference grade: fp32 master 4 B + 2 x 1 B moments = 6 B per trainable parameter.
Measured grade (bitsandbytes' layout): per moment 1 B per element plus one fp32 absmax
per block of 256 elements; tensors under 4,096 elements (``min_8bit_size``) keep fp32
moments; the update runs in one fused kernel (no temporary).
"""

from mlsysim_core import OPTIMIZER_STATE, MemoryTerm, OptimizerSpec, hookimpl
from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, OptimizerStep
from ._flat_state import flat_state_terms
from ._fmt import n

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")

BLOCK = 256           # bitsandbytes' block size for optimizer states
MIN_8BIT_SIZE = 4096  # smaller tensors keep 32-bit state


def state_terms(plan, placement, options):
    return flat_state_terms(placement, "adam-8bit master copy (fp32) + 2 x 8-bit moments", 6.0, "6 B (master 4 + m 1 + v 1)")


def measured_state_terms(plan, placement, options):
    tensors = measured.trainable_tensors(plan)
    quantized = sum(t for t in tensors if t >= MIN_8BIT_SIZE)
    small = sum(t for t in tensors if t < MIN_8BIT_SIZE)
    blocks = sum(-(-t // BLOCK) for t in tensors if t >= MIN_8BIT_SIZE)
    share = measured.tensor_share(plan, placement)
    nbytes = 2 * (quantized + 4 * blocks + 4 * small) * share
    return [*measured.master_terms(plan, placement), MemoryTerm(
        component=OPTIMIZER_STATE, label="adam-8bit moments (8-bit, block-wise)", nbytes=nbytes,
        phases=measured.STEADY,
        formula=f"2 moments x ({n(quantized)} x 1 B + {n(blocks)} blocks x 4 B absmax + {n(small)} small x 4 B)")]


@hookimpl
def mlsysim_optimizers():
    return [OptimizerSpec(name="adam-8bit", description="8-bit Adam (bitsandbytes): master + 2 x 1 B, 6 B/param",
                          state_terms=state_terms, extensions={"measured.state_terms": measured_state_terms},
                          step=OptimizerStep(update="adam", quantized_moments="8-bit", moment_traffic=4.0,
                                             refused={OPTIMIZER_IN_BACKWARD: (
                              "bitsandbytes' Adam8bit (the older plugin) is not measured with optimizer_in_backward; "
                              "adamw-8bit-bnb and paged-adamw-8bit-bnb are")},
                                             not_offered="the older bitsandbytes Adam8bit plugin: fit techniques offers "
                                                         "adamw-8bit-bnb, its exact layout"))]
