"""Low-bit AdamW optimizers: torchao's AdamW8bit, AdamW4bit and AdamWFp8, bitsandbytes'
AdamW8bit and its paged variant (issue 16, item 5).

Names: ``adamw-8bit-torchao``, ``adamw-4bit-torchao``, ``adamw-fp8-torchao``,
``adamw-8bit-bnb``, ``paged-adamw-8bit-bnb``. (``adam-8bit`` is the older bitsandbytes
``Adam8bit`` plugin; its measured numbers are kept as they were, 2 KiB of shared quantization
maps short of bitsandbytes: see ``adamw-8bit-bnb`` for the exact layout.)

Reference grade: an fp32 master 4 B + two moments at the state's bits per parameter
(8-bit and fp8: 6 B, 4-bit: 5 B), as for ``adam-8bit``.

Measured grade, from the libraries' source (torchao 0.18.0, bitsandbytes 0.50.2) and measured
on real CPU runs (validation/techniques/optimizers/):

* torchao (``torchao/optim/adam.py`` ``_AdamBase._new_buffer``): a tensor is quantized only if
  ``numel >= 4096 and numel % block_size == 0``; the others keep ``zeros_like(p)`` moments (the
  parameters' dtype). A quantized moment (``subclass_8bit.py``/``subclass_4bit.py``/
  ``subclass_fp8.py`` ``zeros``) holds its codes (8-bit: 1 B/element uint8; 4-bit: 1/2 B, two
  codes packed per byte; fp8: 1 B float8_e4m3fn), one fp32 scale per block (block 256 for 8-bit
  and fp8, 128 for 4-bit) and, for 8-bit and 4-bit, its own fp32 dynamic quantization map
  (``torch.tensor(create_dynamic_map(...))``: 256 and 16 entries, per moment tensor). Every
  parameter tensor has a 4-byte fp32 ``step`` tensor. No master copy.
  The step (``_AdamBase.step``) runs ``torch.compile(single_param_adam)`` one parameter at a
  time: dequantize, update, requantize. What the compiled step allocates was measured with
  torch.profiler (inductor's CPU code, both moments' fp32 values realized): per quantized tensor
  of n elements, 8-bit 8 n B, fp8 2 n B (0 with 16-bit parameters), 4-bit 26 n B, plus both
  moments' new scale vectors; the largest quantized tensor sets it (full-precision tensors
  allocate nothing). Not modelled, measured: a 3-D expert stack took 10 n (8-bit, bf16) and
  30 n (4-bit, fp32) (validation/techniques/optimizers/README.md). Inductor's CUDA code may
  fuse differently: said in a note.
* bitsandbytes (``bitsandbytes/optim/optimizer.py`` ``Optimizer2State.init_state``): tensors
  with fewer than ``min_8bit_size`` = 4096 elements keep fp32 ``state1``/``state2``; the others
  uint8 states + one fp32 absmax per 256-element block (the last block partial), and the two
  256-entry fp32 quantization maps ``qmap1``/``qmap2`` shared by every tensor (2 KiB in all);
  ``step`` is a Python int. The update is one fused in-place kernel: no temporaries.
* The paged variant keeps the 8-bit moments of tensors of >= 1e5 elements in CUDA unified memory
  (``get_state_buffer``, ``F.get_paged``: a managed allocation viewed with ``torch.frombuffer``),
  outside PyTorch's caching allocator: not in ``torch.cuda.max_memory_allocated`` nor in what the
  allocator needs to fit. They are priced in the host tier (``result.host_memory``), where the
  driver pages them when the device runs short; with room to spare they sit on the device beside
  the allocator's memory (nvidia-smi shows them). torchtune's Llama 3.1 8B full recipe on a 24 GB
  RTX 4090 (PagedAdamW8bit: 16 GB of paged moments) peaks at 18.9 GiB (its README): the allocator's
  part. Not measurable here (CUDA only): unvalidated, said in a note.
"""

from __future__ import annotations

import functools

import attrs

from mlsysim_core import OPTIMIZER_STATE, MemoryTerm, OptimizerSpec, hookimpl
from mlsysim_core.terms import HOST
from ._flat_state import flat_state_terms
from ._fmt import n
from ._lazy import lazy_module
from .measured.optimizer_step import OPTIMIZER_IN_BACKWARD, OptimizerStep
from .measured.optimizer_step import step_of as measured_step

measured = lazy_module(globals(), "measured", "mlsysim_plugins.measured.optimizers")

MIN_QUANTIZED = 4096   # torchao _new_buffer and bitsandbytes min_8bit_size: smaller tensors stay full precision
SCALE_BYTES = 4        # fp32 scale / absmax per block


# name: (label, code bytes per element, block, qmap entries per moment tensor, compiled step bytes per element)
TORCHAO = {
    "adamw-8bit-torchao": ("torchao AdamW8bit", 1.0, 256, 256, 8),
    "adamw-4bit-torchao": ("torchao AdamW4bit", 0.5, 128, 16, 26),
    "adamw-fp8-torchao": ("torchao AdamWFp8", 1.0, 256, 0, 2),
}
BNB_BLOCK = 256
BNB_QMAPS = 2 * 256 * 4   # the signed and unsigned dynamic maps, shared by every tensor
# bitsandbytes 0.50.2 optim/optimizer.py Optimizer8bit.get_state_buffer: "if not self.is_paged or p.numel() < 1e5:
# return torch.zeros_like(...)", else F.get_paged (functional.py: lib.cget_managed_ptr, torch.frombuffer)
PAGED_FROM = 100_000

_TORCHAO_IN_BACKWARD = (
    "torchao's per-parameter step is torch.compile'd (single_param_adam), which dynamo refuses to trace under "
    "MemTracker: its temporaries were measured with torch.profiler outside the backward only "
    "(validation/techniques/optimizers), not inside the post-accumulate-grad hook")
# What the optimizers declare (OptimizerStep): torchao's compiled step is refused inside the backward;
# bitsandbytes' 8-bit update is one in-place kernel per tensor (optimizer_update_8bit_blockwise,
# optimizer_update_32bit under min_8bit_size): no temporary beside the gradient, and each optimizer
# instance fills its two quantization maps once it holds a tensor of >= min_8bit_size elements
# (Optimizer8bit.fill_qmap; measured, validation/techniques/oib_combinations). The paged variant
# keeps the same states.
# The update's traffic (``added_step_time``): both moments read and written at their own bits, 8-bit and
# fp8 4 B per parameter, 4-bit 2 B; torchao's compiled step realizes its temporaries (the docstring's 8,
# 26 and 2 B per element), bitsandbytes' fused kernel none.
# ``fit techniques`` offers the low-bit ones in place of a full-precision AdamW but those declaring why not
# (``OptimizerStep.not_offered``): the paged ones, Hugging Face's setups of bitsandbytes' and AdamWFp8.
_NOT_OFFERED_FP8 = ("torchao marks its FP8 optimizers experimental and requires CUDA compute capability >= 8.9 "
                    "for them (pytorch/ao 36027d82 torchao/optim/README.md lines 7, 30): the ladder, which does not "
                    "know the run's accelerator generation, does not offer it")
_NOT_OFFERED_PAGED = ("paged: what bitsandbytes' paging costs in step time is not priced, and its paged moments "
                      "leave the accelerator's total (the ladder would take them for free)")
_NOT_OFFERED_HF = "adamw-8bit-bnb as Hugging Face's Trainer sets it up (the embeddings' moments in fp32): the ladder offers adamw-8bit-bnb"
TORCHAO_STEPS = {name: OptimizerStep(refused={OPTIMIZER_IN_BACKWARD: _TORCHAO_IN_BACKWARD}, quantized_moments=bits,
                                     moment_traffic=4.0 * TORCHAO[name][1], step_realized=TORCHAO[name][4],
                                     update="adam", not_offered=not_offered)
                 for name, bits, not_offered in (("adamw-8bit-torchao", "8-bit", ""), ("adamw-4bit-torchao", "4-bit", ""),
                                                 ("adamw-fp8-torchao", "fp8", _NOT_OFFERED_FP8))}
# bitsandbytes' 32-bit update (optimizer_update_32bit, in place): no temporaries; moments not in the regime's
# state dtype (always fp32), so ``moments=None``. AdamW32bit measured inside the backward too (one optimizer per
# parameter, as torchtune's optimizer_in_bwd builds PagedAdamW: validation/techniques/oib_combinations, the four
# bnb32 runs exact in every phase); Lion32bit not. Every AdamW here computes Adam's update (``update="adam"``:
# ``fit techniques`` offers the low-bit ones in place of the 32-bit AdamW).
BNB32_STEP = OptimizerStep()
BNB32_ADAM_STEP = OptimizerStep(update="adam", measured_with=(OPTIMIZER_IN_BACKWARD,))
BNB_STEP = OptimizerStep(quantization_maps=BNB_QMAPS, quantized_from=MIN_QUANTIZED,
                         measured_with=(OPTIMIZER_IN_BACKWARD,), quantized_moments="8-bit", moment_traffic=4.0,
                         update="adam")
PAGED_BNB_STEP = attrs.evolve(BNB_STEP, not_offered=_NOT_OFFERED_PAGED)
# As Hugging Face's Trainer sets it up (no optimizer in the backward there: not measured with it).
BNB_HF_STEP = OptimizerStep(quantization_maps=BNB_QMAPS, quantized_from=MIN_QUANTIZED, quantized_moments="8-bit",
                            moment_traffic=4.0, update="adam", not_offered=_NOT_OFFERED_HF)
PAGED_BNB_HF_STEP = attrs.evolve(BNB_HF_STEP, not_offered=f"{_NOT_OFFERED_HF}; {_NOT_OFFERED_PAGED}")

UNVALIDATED_PAGED = ("{name} is unvalidated: bitsandbytes' paging needs CUDA unified memory; "
                     "the moments of tensors of >= 100,000 elements live there, outside PyTorch's allocator "
                     "(not in torch.cuda.memory_allocated): they are counted in host memory, where the driver "
                     "pages them under memory pressure, not in the accelerator's total; with room to spare "
                     "they stay on the accelerator beside it (the paging costs step time, not priced)")
COMPILED_NOTE = ("{name}: the step's temporaries are those of torchao's torch.compile'd per-parameter step as "
                 "inductor's CPU code allocates them (measured); CUDA code may fuse differently")


def _torchao_layout(plan, name):
    label, code, block, qmap, _ = TORCHAO[name]
    tensors = measured.trainable_tensors(plan)
    quantized = [t for t in tensors if t >= MIN_QUANTIZED and t % block == 0]
    small = sum(t for t in tensors if not (t >= MIN_QUANTIZED and t % block == 0))
    return tensors, quantized, small


def torchao_state_terms(plan, placement, options, *, name):
    label, code, block, qmap, per_element = TORCHAO[name]
    tensors, quantized, small = _torchao_layout(plan, name)
    share = measured.tensor_share(plan, placement)
    b = plan.profile_options.regime.state
    q = sum(quantized)
    blocks = sum(t // block for t in quantized)
    per_moment = q * code + blocks * SCALE_BYTES + len(quantized) * qmap * 4 + small * b
    terms = [*measured.master_terms(plan, placement), MemoryTerm(
        component=OPTIMIZER_STATE, label=f"{name} moments ({label}, block-wise)", phases=measured.STEADY,
        nbytes=2 * per_moment * share,
        formula=f"2 moments x ({n(q)} quantized x {code:g} B + {n(blocks)} blocks of {block} x 4 B scale"
                + (f" + {len(quantized)} tensors x {qmap} x 4 B map" if qmap else "")
                + f" + {n(small)} unquantized x {b} B)"),
        MemoryTerm(component=OPTIMIZER_STATE, label=f"{name} step counters", phases=measured.STEADY,
                   nbytes=round(len(tensors) * share) * 4,
                   formula=f"{len(tensors)} parameter tensors x 4 B (one fp32 step tensor each)")]
    if name == "adamw-fp8-torchao" and b < 4:
        per_element = 0     # measured: with 16-bit parameters inductor writes the fp8 codes in place
    if quantized:
        big = max(quantized)
        step = per_element * big + 2 * (big // block) * SCALE_BYTES
        terms.append(MemoryTerm(
            component=OPTIMIZER_STATE, label=f"{name} compiled step temporaries", phases=(measured.OPTIMIZER_STEP,),
            nbytes=step * share,
            formula=f"largest quantized tensor {n(big)} x {per_element} B + 2 x {big // block} new scales x 4 B"))
    return terms


def bnb_state_terms(plan, placement, options, *, name, paged=False, embeddings_32bit=False):
    """bitsandbytes' 8-bit states. ``paged`` (PagedAdamW8bit): ``get_state_buffer`` puts the 8-bit
    moments of each tensor of at least ``PAGED_FROM`` elements in CUDA unified memory (``F.get_paged``:
    ``cget_managed_ptr``, a ``torch.frombuffer`` view), which PyTorch's caching allocator never sees
    and the driver pages to the host under memory pressure; the absmax blocks and the smaller
    tensors' states are ordinary device tensors. ``embeddings_32bit``: the embedding tables
    (``nn.Embedding`` weights: the token embedding, a learned position table) keep fp32 moments, as
    Hugging Face's Trainer sets them up (``GlobalOptimManager.register_module_override(module,
    "weight", {"optim_bits": 32})`` for every ``nn.Embedding`` when ``optim_bits == 8``; transformers
    5.23.0 trainer.py ``create_optimizer``), paged too when ``paged``."""
    tensors = list(measured.trainable_tensors(plan))
    tables = []
    if embeddings_32bit and plan.profile_options.lora is None:    # (LoRA trains adapters, no embedding)
        shape = measured.shape_of(plan)
        for table in (shape.embedding_parameters, shape.learned_positions * shape.hidden):
            if table:
                tensors.remove(table)
                tables.append(table)
    quantized = sum(t for t in tensors if t >= MIN_QUANTIZED)
    small = sum(t for t in tensors if t < MIN_QUANTIZED)
    blocks = sum(-(-t // BNB_BLOCK) for t in tensors if t >= MIN_QUANTIZED)
    share = measured.tensor_share(plan, placement)
    unified = sum(t for t in tensors if t >= PAGED_FROM) if paged else 0
    paged_tables = sum(t for t in tables if t >= PAGED_FROM) if paged else 0
    terms = [*measured.master_terms(plan, placement), MemoryTerm(
        component=OPTIMIZER_STATE, label=f"{name} moments (8-bit, block-wise)", phases=measured.STEADY,
        nbytes=2 * (quantized - unified + 4 * blocks + 4 * small) * share,
        formula=f"2 moments x ({n(quantized)} x 1 B + {n(blocks)} blocks x 4 B absmax + {n(small)} small x 4 B fp32)"
                + (f" - the paged {n(unified)} x 1 B" if unified else ""))]
    if sum(tables) - paged_tables:
        terms.append(MemoryTerm(
            component=OPTIMIZER_STATE, label=f"{name} embedding moments (fp32: Hugging Face Trainer's override)",
            phases=measured.STEADY, nbytes=2 * 4 * (sum(tables) - paged_tables) * share,
            formula=f"2 moments x {n(sum(tables) - paged_tables)} embedding elements x 4 B"))
    if unified or paged_tables:
        terms.append(MemoryTerm(
            component=OPTIMIZER_STATE, tier=HOST, phases=measured.STEADY,
            nbytes=2 * (unified + 4 * paged_tables) * share,
            label=f"{name} paged moments (CUDA unified memory, outside PyTorch's allocator)",
            formula=f"2 moments x ({n(unified)} elements x 1 B" + (f" + {n(paged_tables)} embedding elements x 4 B"
                                                                      if paged_tables else "")
                    + f") of tensors >= {PAGED_FROM:,} elements (get_state_buffer)"))
    if quantized:
        terms.append(MemoryTerm(component=OPTIMIZER_STATE, label=f"{name} quantization maps", phases=measured.STEADY,
                                nbytes=BNB_QMAPS, formula="2 dynamic maps x 256 x 4 B (shared by all tensors)"))
    return terms


def bnb32_state_terms(plan, placement, options, *, name, paged=False, moments=2):
    """bitsandbytes' 32-bit optimizers (``AdamW32bit``, ``PagedAdamW32bit``: ``Optimizer2State``;
    ``Lion32bit``, ``PagedLion32bit``: ``Optimizer1State``, one moment; ``init_state`` with
    ``optim_bits=32``): fp32 moments per parameter whatever its dtype, no absmax, no maps; paged as
    the 8-bit one (tensors of at least ``PAGED_FROM`` elements)."""
    tensors = measured.trainable_tensors(plan)
    share = measured.tensor_share(plan, placement)
    unified = sum(t for t in tensors if t >= PAGED_FROM) if paged else 0
    rest = sum(tensors) - unified
    terms = [*measured.master_terms(plan, placement), MemoryTerm(
        component=OPTIMIZER_STATE, label=f"{name} moments (fp32)", phases=measured.STEADY,
        nbytes=moments * 4 * rest * share, formula=f"{moments} moment(s) x {n(rest)} x 4 B")]
    if unified:
        terms.append(MemoryTerm(
            component=OPTIMIZER_STATE, tier=HOST, phases=measured.STEADY, nbytes=moments * 4 * unified * share,
            label=f"{name} paged moments (CUDA unified memory, outside PyTorch's allocator)",
            formula=f"{moments} moment(s) x {n(unified)} elements of tensors >= {PAGED_FROM:,} elements x 4 B "
                    f"(get_state_buffer)"))
    return terms


def notes(plan, *, name=None) -> tuple[str, ...]:
    """What a measured result with one of these optimizers says (its ``measured.notes`` extension):
    ``name`` is bound by the spec (the optimizer it describes, whatever it is selected as)."""
    name = plan.optimizer if name is None else name
    if name in TORCHAO:
        return (COMPILED_NOTE.format(name=name),)
    if name.startswith("paged-"):      # (the spec's own name, bound when it registers)
        return (UNVALIDATED_PAGED.format(name=name),)
    return ()


def added_step_time(plan, hardware_flops=None, host_link_bytes_per_s=None, memory_bandwidth=None):
    """Extra step time over a fused fp32 AdamW: (seconds or None, how).

    The update is memory-bound. A fused fp32 AdamW reads and writes both moments at 4 B each
    (16 B per parameter); a low-bit one moves them at their own bits (8-bit and fp8: 4 B,
    4-bit: 2 B). torchao's compiled step also writes and reads back its realized temporaries
    (the module docstring: 8, 26 and 2 B per element), bitsandbytes' fused kernel none. So
    ``extra B/param = 2 x realized - (16 - low-bit moment traffic)`` and the time is
    ``max(0, extra) x trainable parameters / memory bandwidth`` (``memory_bandwidth`` in B/s,
    else the plan's hardware's; ``None`` without one). Paged states that were paged out cost
    host-link traffic as well: not priced (it depends on the memory pressure).
    """
    step = measured_step(plan.profile_options.optimizer_spec)
    if step is None or not step.quantized_moments:
        return 0.0, f"{plan.optimizer}: declares no quantized moments"
    realized, moments = step.step_realized, step.moment_traffic
    extra = max(0.0, 2 * realized - (16 - moments))
    params = plan.model.parameters * plan.trainable_fraction
    how = (f"{plan.optimizer}: {extra:g} B more moved per trainable parameter than a fused fp32 AdamW "
           f"(2 x {realized} B realized temporaries - {16 - moments:g} B saved on the moments) / memory bandwidth")
    bandwidth = memory_bandwidth or getattr(plan.hardware, "memory_bandwidth", None)
    if not extra:
        return 0.0, how
    if not bandwidth:
        return None, how + " (no memory bandwidth known)"
    return extra * params / bandwidth, how


@hookimpl
def mlsysim_optimizers():
    specs = []
    ref = {"adamw-8bit-torchao": (6.0, "6 B (master 4 + m 1 + v 1)"),
           "adamw-4bit-torchao": (5.0, "5 B (master 4 + m 0.5 + v 0.5)"),
           "adamw-fp8-torchao": (6.0, "6 B (master 4 + m 1 + v 1)")}
    for name, (label, code, block, qmap, _) in TORCHAO.items():
        bpp, how = ref[name]
        specs.append(OptimizerSpec(
            name=name,
            description=f"{label}: block-wise {'fp8' if 'fp8' in name else label[-4:]} moments (block {block}), "
                        f"tensors < 4096 or not a block multiple in full precision; compiled step",
            state_terms=_flat(name, bpp, how),
            extensions={"measured.state_terms": functools.partial(torchao_state_terms, name=name),
                        "measured.notes": functools.partial(notes, name=name)}, step=TORCHAO_STEPS[name]))
    specs.append(OptimizerSpec(
        name="adamw-8bit-bnb",
        description="bitsandbytes AdamW8bit: 8-bit moments, 256-block fp32 absmax, fp32 under 4096 elements",
        state_terms=_flat("adamw-8bit-bnb", 6.0, "6 B (master 4 + m 1 + v 1)"),
        extensions={"measured.state_terms": functools.partial(bnb_state_terms, name="adamw-8bit-bnb")},
        step=BNB_STEP))
    specs.append(OptimizerSpec(
        name="paged-adamw-8bit-bnb",
        description="bitsandbytes PagedAdamW8bit (unvalidated: CUDA unified memory): states as adamw-8bit-bnb, "
                    "the large tensors' moments paged (host tier, outside the allocator)",
        state_terms=_flat("paged-adamw-8bit-bnb", 6.0, "6 B (master 4 + m 1 + v 1)"),
        extensions={"measured.state_terms": functools.partial(bnb_state_terms, name="paged-adamw-8bit-bnb", paged=True),
                    "measured.notes": functools.partial(notes, name="paged-adamw-8bit-bnb")}, step=PAGED_BNB_STEP))
    for name, paged in (("adamw-8bit-bnb-hf", False), ("paged-adamw-8bit-bnb-hf", True)):
        specs.append(OptimizerSpec(
            name=name,
            description=f"bitsandbytes {'Paged' if paged else ''}AdamW8bit as Hugging Face's Trainer sets it up "
                        "(adamw_bnb_8bit, paged_adamw_8bit): the embedding tables' moments in fp32"
                        + (" (unvalidated: CUDA unified memory)" if paged else ""),
            state_terms=_flat(name, 6.0, "6 B (master 4 + m 1 + v 1)"),
            extensions={"measured.state_terms": functools.partial(bnb_state_terms, name=name, paged=paged,
                                                                  embeddings_32bit=True),
                        **({"measured.notes": functools.partial(notes, name=name)} if paged else {})},
            step=PAGED_BNB_HF_STEP if paged else BNB_HF_STEP))
    for name, cls, paged, moments, step in (("adamw-32bit-bnb", "AdamW32bit", False, 2, BNB32_ADAM_STEP),
                                            ("paged-adamw-32bit-bnb", "PagedAdamW32bit", True, 2, BNB32_ADAM_STEP),
                                            ("lion-32bit-bnb", "Lion32bit", False, 1, BNB32_STEP),
                                            ("paged-lion-32bit-bnb", "PagedLion32bit", True, 1, BNB32_STEP)):
        specs.append(OptimizerSpec(
            name=name,
            description=f"bitsandbytes {cls}: fp32 moment{'s' if moments > 1 else ''}, one fused kernel"
                        + (" (unvalidated: CUDA unified memory): the large tensors' moments paged (host tier, "
                           "outside the allocator)" if paged else ""),
            state_terms=_flat(name, 4.0 + 4 * moments, f"{4 + 4 * moments} B (master 4 + {moments} x 4)"),
            extensions={"measured.state_terms": functools.partial(bnb32_state_terms, name=name, paged=paged,
                                                                  moments=moments),
                        **({"measured.notes": functools.partial(notes, name=name)} if paged else {})},
            step=step))
    return specs


def _flat(name, bpp, how):
    def state_terms(plan, placement, options):
        return flat_state_terms(placement, f"{name} master copy (fp32) + 2 low-bit moments", bpp, how)
    return state_terms
