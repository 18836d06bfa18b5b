"""torchtune's optimisation ladder for Llama 3.2 3B on an A100, against the measured profile.

    python validation/published/torchtune_ladder.py      # prints the table; no torch needed

Source: the README shipped in the torchtune 0.6.1 wheel's metadata (``pip download
torchtune==0.6.1 --no-deps`` then ``unzip -p torchtune-0.6.1-py3-none-any.whl '*/METADATA'``),
section "Optimization flags": "Baseline uses Recipe=full_finetune_single_device, Model=Llama 3.2
3B, Batch size=2, Max sequence length=4096, Precision=bf16, Hardware=A100"; "Each technique is
added on top of the previous one, except for LoRA and QLoRA, which do not use optimizer_in_bwd or
AdamW8bit". Its metric is "Peak Memory Active (GiB)": ``torch.cuda.memory_stats()
["active_bytes.all.peak"]`` (torchtune/training/memory.py ``get_memory_stats``), i.e. allocated
memory, so the prediction is solved without runtime overheads.

The model: the catalog's ``meta-llama/llama-3.2-3b`` (its config.json: 28 layers, hidden 3072,
24 heads, 8 KV heads, FFN 8192, vocabulary 128,256, tied embeddings; 3,212,749,824 parameters).
``dtype: bf16`` in torchtune is pure bf16 (weights, gradients and AdamW state): regime ``bf16``.

Which rows the tool can express:

* Baseline: no. The dataset is not packed: each batch is alpaca samples padded to the batch's
  longest, so the sequence length is data-dependent and the table does not state it (4096 is
  only the tokenizer's cap).
* + Packed Dataset: yes. Every sequence is 4096 tokens; the optimizer is ``torch.optim.AdamW``
  (the ladder adds 8-bit AdamW later), AC off, the loss torch's cross-entropy on the whole
  logits, no compile. The peak is in the backward, so foreach or fused AdamW predict the same.
* + Compile: yes, ``compile="blocks"``. torchtune 0.6.1's recipe compiles each
  ``TransformerSelfAttentionLayer`` in place (``training.compile_model``: ``m.compile()``); its
  attention takes no mask (SDPA ``is_causal``) and expands grouped k and v to the query heads
  (torchtune/modules/attention.py:285-291); the embedding, the final norm, the LM head
  (``self.output(h).float()``) run eagerly. The loss is NOT compiled on this row: the recipe calls
  ``training.compile_loss(self._loss_fn)`` and discards the returned module
  (recipes/full_finetune_single_device.py:293-294); ``compile_loss`` compiles in place only the chunked
  losses' ``compute_cross_entropy``. So the row's loss is the eager ``nn.CrossEntropyLoss`` on the fp32
  logits. Measured on torchtune's own builders (validation/compile/measure_blocks.py, docs/compile.md).
* + Chunked Cross Entropy: yes, ``compile="blocks"`` + ``loss="chunked"``: ``compile_loss`` compiles
  ``CEWithChunkedOutputLoss.compute_cross_entropy`` in place (torchtune/training/_compile.py:76-79): each
  chunk's graph saves the chunk's bf16 logits and a per-token max and log-sum-exp, no fp32 log-softmax.
* + Activation Checkpointing: yes, ``compile="blocks"``, ``loss="chunked"``, full checkpointing in torchtune's
  order, ``compile_checkpoint="outside"`` (recipes/full_finetune_single_device.py ``_setup_model``:
  ``training.compile_model``, then ``training.set_activation_checkpointing`` wraps each compiled layer;
  validation/compile/measure_blocks_order.py). Its peak is the backward's end, the tied embedding's
  gradient (the LM head's partial, the lookup's and their sum), the same in either order. From this row on the
  optimizer step can reach the peak, so the AdamW implementation matters, and the README does not name it:
  the row is compared with ``optimizer_impl="fused"``. Two reasons: torchtune 0.6.1's configs that name
  ``torch.optim.AdamW`` set ``fused: True`` in 118 of 123 (recipes/configs, the README's final-row
  config llama3_2/3B_qlora_single_device.yaml among them); and foreach's step allocates one parameter-sized
  temporary set (torch/optim/adam.py ``_multi_tensor_adam``: ``exp_avg_sq_sqrt =
  torch._foreach_sqrt(device_exp_avg_sqs)``), which puts that step at 29.92 GiB (23.93 GiB of weights,
  gradients and bf16 AdamW state + 5.98 GiB), 20 % above the published peak. The recipe reads the peak after
  the step, so a foreach run could not have recorded 24.9 GiB. The foreach prediction is in the note.
* + Fuse optimizer step into backward: yes, the row above with ``optimizer_in_backward=True`` (torchtune's
  ``optimizer_in_bwd``: one optimizer per parameter, stepped by its post-accumulate-grad hook), measured with
  compiled blocks in torchtune's order (measure_blocks_order.py's ``-oib-`` runs): every gradient is freed by its
  step, so the first compiled block's recompute and MLP backward (every layer's input still alive) is the layers'
  largest moment; the row's peak is the chunked loss's LM head backward, the same for foreach and fused.
* + Activation Offloading: yes, the row above with ``activation_offload="torchtune"``: torchtune 0.6.1's
  ``OffloadActivations`` around compiled, checkpointed blocks in full training, measured with the host copies
  simulated (validation/offload_full): the token ids, the 28 layers' inputs (1.31 GiB) and the final norm's saved
  tensors copied to the host, the forward stash of 5, the backward's copies freed one node late. The peak stays the
  chunked loss's LM head backward, 1.31 GiB (the layers' inputs) below the row above.
* + 8-bit AdamW: not compared. Which optimizer: the README says the LoRA rows "do not use ``optimizer_in_bwd`` or
  ``AdamW8bit`` optimizer", and the row links to the memory tutorial's "Lower Precision Optimizers", which names
  ``torchao.prototype.low_bit_optim.AdamW8bit`` and ``bitsandbytes.optim.PagedAdamW8bit`` ("higher memory savings
  from bnb's PagedAdamW8bit but higher training speed from torchao's AdamW8bit"; torchtune v0.6.1
  docs/source/tutorials/memory_optimizations.rst:171-173); the table was added by pytorch/torchtune#2003
  (1814feb1), whose thread and commit give the final row's command only. Not the paged one: bitsandbytes keeps the
  moments of tensors of >= 1e5 elements in CUDA unified memory (``F.get_paged``, cudaMallocManaged), outside the
  caching allocator whose ``active_bytes`` the row reports, which leaves 10.00 GiB, 43 % under 17.6. A non-paged
  ``AdamW8bit`` then: bitsandbytes' (``adamw-8bit-bnb``: one in-place kernel per tensor, no temporary; measured
  under ``optimizer_in_bwd``) gives 15.98 GiB, 9 % under, the previous row less the bf16 moments' 5.9 GiB saving;
  the 1.6 GiB it lacks is what a step temporary would add, and bitsandbytes' has none. torchao's (the tutorial's
  first, and the row's 4.7 % throughput loss fits it better than paging) runs ``torch.compile(single_param_adam)``
  per parameter: under ``optimizer_in_bwd`` the tied embedding's step (394,002,432 elements) runs at the backward's
  end, on its gradient, and its fp32 temporaries set that moment: 8 B an element as inductor's CPU code realizes
  them (measured, validation/techniques/optimizers) puts it near 16.0 GiB; 17.6 GiB needs about 12 B an element
  (three fp32 copies), which inductor's CUDA code may realize. The profile refuses torchao's compiled step inside the
  backward hook (not measured there; CUDA only, no GPU lent), so the row is refused with it; the two bitsandbytes
  readings are shown beside it.
* QLoRA: no. The LoRA row's settings (compile, full checkpointing, the chunked loss, activation offloading) over
  torchtune's ``quantize_base=True`` (torchao's NF4Tensor: ``quant_implementation="torchao"``). QLoRA with compiled
  blocks is modelled (docs/compile.md), but activation offloading around compiled QLoRA blocks is not measured and
  is refused by name; the eager prediction of the same settings is shown beside it.
* LoRA: yes, the README's command (README.md:149; tools/launch_validation.py reads it from the config): rank 64
  on q, v, output_proj and the MLP, adapters in bf16, ``compile="blocks"`` and full checkpointing in torchtune's
  order, the chunked loss, fused AdamW, ``activation_offload="torchtune"``: torchtune 0.6.1's
  ``OffloadActivations`` around compiled, checkpointed LoRA blocks, measured with the host copies simulated
  (validation/lora_offload). Its peak is the chunked loss's backward (every chunk's 16-bit logits, one chunk's
  compiled cross-entropy backward), with the final norm's saved tensors and one layer's input still in the
  offload's forward stash; the 28 layers' inputs (1.31 GiB) are on the host. The layers' backward stays 0.83 GiB
  below it (the first block's moment, the largest: the 27 upper layers' adapter gradients, 6.4 MB each, born).

On the one row compared, the model is torchtune's, not Hugging Face's: the same ops in the
decoder layers (RMSNorm upcast, SwiGLU, SDPA/flex attention keeping output and log-sum-exp);
torchtune's RoPE saves its fp32 view of q and k (4 B per element) where HF's saves q and
rotate_half(q) in bf16 (2 + 2 B): the same bytes. At the LM head torchtune returns
``self.output(h).float()`` (the fp32 logits are the output; the bf16 ones are freed) and
HF returns the bf16 logits and upcasts inside the loss: the prediction is HF's, which holds the
bf16 logits (1.96 GiB) where torchtune does not.
"""

from __future__ import annotations

import sys

import attrs

GIB = 2**30
TARGET = 0.05
MODEL, HARDWARE = "meta-llama/llama-3.2-3b", "nvidia/a100-sxm4-80gb"
# rope_cache: llama3_2_3b's one RoPE module keeps a cache of its max_seq_len (131,072) positions, fp32, the whole run
# (torchtune/models/llama3_2/_model_builders.py; measured/rope.py), as the reader sets it; kv_expanded: its attention
# (MultiHeadAttention, 24 query heads over 8 key/value heads) expands k and v to every query head before SDPA, which
# saves the copies in the eager layers (measured/kv_expand.py; compiled blocks save them narrow), as the reader sets it
BASE = dict(batch_size=2, seq_len=4096, precision="bf16", optimizer="adamw", activation_checkpointing="none",
            regime="bf16", runtime_overheads=False, rope_cache=131_072, kv_expanded=True)
COMPILE = 'compile=True carried from "+ Compile": '
BLOCKS = {"compile": "blocks"}
# torchtune's order: compile_model, then set_activation_checkpointing wraps each compiled layer
CKPT = {"activation_checkpointing": "full", "compile_checkpoint": "outside"}
FUSED = {"optimizer_impl": "fused"}     # the AdamW implementation of the rows whose step reaches the peak (docstring)


def _lora():
    """The README command's LoRA (llama3_2/3B_lora_single_device.yaml at v0.6.1: rank 64, alpha 128, no dropout,
    lora_attn_modules [q_proj, v_proj, output_proj], apply_lora_to_mlp True, the adapters in the model's dtype;
    the same as tools/launch_validation.py's reader makes of it)."""
    from mlsysim_core.finetune import LoRAConfig
    return LoRAConfig(rank=64, target_modules=("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
                      adapter_dtype="base")


LORA = _lora()
# the README's QLoRA: the same adapters over torchtune's quantize_base=True (torchao's NF4Tensor, as the reader reads it)
QLORA = attrs.evolve(LORA, quantization="nf4", quant_implementation="torchao")

# The other readings of a row that is not compared (technique: ((label, settings over the row's), ...)), shown
# beside it: the 8-bit row's "AdamW8bit" as bitsandbytes' classes (the docstring).
READINGS = {"+ 8-bit AdamW": (("bitsandbytes AdamW8bit", {"optimizer": "adamw-8bit-bnb"}),
                              ("bitsandbytes PagedAdamW8bit", {"optimizer": "paged-adamw-8bit-bnb"}))}

# (technique, published GiB, solve settings over BASE, why it is not compared or None)
ROWS = (
    ("Baseline", 25.5, None, "unpacked dataset: the sequence length is data-dependent and not stated"),
    ("+ Packed Dataset", 60.0, {}, None),
    ("+ Compile", 51.0, {**BLOCKS}, None),
    ("+ Chunked Cross Entropy", 42.9, {**BLOCKS, "loss": "chunked"}, None),
    ("+ Activation Checkpointing", 24.9, {**BLOCKS, **CKPT, "loss": "chunked", **FUSED}, None),
    ("+ Fuse optimizer step into backward", 23.1,
     {**BLOCKS, **CKPT, "loss": "chunked", **FUSED, "optimizer_in_backward": True}, None),
    ("+ Activation Offloading", 21.8, {**BLOCKS, **CKPT, "loss": "chunked",
                                       "optimizer_in_backward": True, "activation_offload": "torchtune"}, None),
    ("+ 8-bit AdamW", 17.6, {**BLOCKS, **CKPT, "loss": "chunked",
                             "optimizer_in_backward": True, "activation_offload": "torchtune",
                             "optimizer": "adamw-8bit-torchao"},
     "the README's AdamW8bit, the tutorial's torchao AdamW8bit: its compiled per-parameter step inside the backward "
     "is not measured (the docstring)"),
    ("LoRA", 8.5, {**BLOCKS, **CKPT, "loss": "chunked", **FUSED, "activation_offload": "torchtune", "lora": LORA},
     None),
    ("QLoRA", 4.6, {**BLOCKS, **CKPT, "loss": "chunked", **FUSED, "activation_offload": "torchtune",
                    "lora": QLORA},
     "the LoRA row's settings over torchao's NF4 base: activation offload with compiled QLoRA blocks is not "
     "measured (the docstring)"),
)


def predict(settings: dict):
    """The measured profile's peak (bytes) for a row's settings, or the profile's refusal."""
    from mlsysim_core import TrainingMemoryModel
    from mlsysim_core.errors import MlsysimError
    kw = {**BASE, **settings}
    try:
        return TrainingMemoryModel("measured").solve(MODEL, HARDWARE, kw.pop("batch_size"), **kw).total_memory
    except MlsysimError as err:
        return err


def rows():
    """(technique, published GiB, predicted GiB or None, error or None, note)."""
    out = []
    for name, published, settings, why in ROWS:
        got = predict(settings) if settings is not None else None
        if why is None:
            note = "compared"
            if settings.get("optimizer_impl") == "fused":
                foreach = predict({**settings, "optimizer_impl": "foreach"}) / GIB
                note += (f" (fused AdamW, as torchtune's AdamW configs set it; with foreach: {foreach:.2f} GiB, "
                         f"{foreach / published - 1:+.1%})")
            out.append((name, published, got / GIB, got / GIB / published - 1, note))
        elif settings is not None and not isinstance(got, (int, float)) and name in READINGS:
            others = "; ".join(f"{label}: {v / GIB:.2f} GiB ({v / GIB / published - 1:+.1%})"
                               for label, extra in READINGS[name] for v in [predict({**settings, **extra})])
            out.append((name, published, None, None, f"not compared ({why}; the profile: {type(got).__name__}); "
                        f"read as {others}"))
        elif settings is not None and not isinstance(got, (int, float)) and settings.get("compile"):
            eager = predict({k: v for k, v in settings.items() if k not in ("compile", "compile_checkpoint")})
            shown = eager / GIB if isinstance(eager, (int, float)) else None
            out.append((name, published, shown, None, f"not compared ({why}; the profile: {type(got).__name__}: "
                        f"{got}); " + ("the eager prediction of the same settings shown" if shown is not None else
                                       f"eager, the same settings are refused too ({eager.parameter})")))
        elif isinstance(got, (int, float)):
            out.append((name, published, got / GIB, None, f"not compared ({why}); prediction shown"))
        else:
            out.append((name, published, None, None, f"not compared ({why})"
                        + (f"; {type(got).__name__}: {got}" if got is not None else "")))
    return out


def main() -> int:
    print("| technique | published GiB | predicted GiB | error | |\n|---|---:|---:|---:|---|")
    bad = 0
    for name, published, predicted, error, note in rows():
        shown = "-" if predicted is None else f"{predicted:.2f}"
        print(f"| {name} | {published:.1f} | {shown} | {'-' if error is None else f'{error:+.1%}'} | {note} |")
        bad += error is not None and abs(error) > TARGET
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
