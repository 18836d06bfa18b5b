#!/usr/bin/env python
"""Measure LoRA and QLoRA training iterations with PyTorch's own tracker (as ``harness.py`` does).

    python3 -m venv --system-site-packages /tmp/ftvenv
    /tmp/ftvenv/bin/pip install --no-deps peft==0.21.2 bitsandbytes==0.50.2
    /tmp/ftvenv/bin/python validation/measure_lora.py --out validation/lora_measurements.json [--only ID ...]

Needs torch==2.13.0 (CPU build) and transformers==5.23.0 (validation/requirements.txt) plus
peft==0.21.2 and bitsandbytes==0.50.2. Every model is built from its config with random weights (nothing
is downloaded): ``AutoModelForCausalLM.from_config``; for QLoRA the model is saved to a temporary
directory and reloaded with ``BitsAndBytesConfig`` (bitsandbytes quantizes on the CPU). Then
``peft.get_peft_model(model, LoraConfig(r, lora_alpha=2r, target_modules, lora_dropout, bias="none"))``
(peft's defaults otherwise: ``autocast_adapter_dtype=True`` keeps the adapters in fp32 over a 16-bit
base). The optimizer takes the trainable parameters (the adapters) and the protocol is harness.py's:
three iterations in ``MemTracker``, the third measured (steady state).
"""

from __future__ import annotations

import os
import platform
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from configs import GPT2_TINY, GQA_TINY, LLAMA_TINY, _hf, _llama  # noqa: E402
import harness  # noqa: E402  (validation/harness.py)
from harness import PhaseMemTracker, _submodules, layer_forward_deltas, peak_record, run_protocol  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402



class FrozenAwareMemTracker(PhaseMemTracker):
    """``MemTracker`` registers a gradient hook on every parameter, which raises for the frozen base of a
    LoRA model (``cannot register a hook on a tensor that doesn't require gradient``) and, under FSDP1's
    ``use_orig_params=True``, for the original parameters it sets as views of its flat parameter ("post accumulate
    grad hooks cannot be registered on non-leaf tensors"; lora_fsdp1/measure.py): hooks go on the trainable leaf
    parameters only (which only name a tensor's category ``gradient``); everything else is the stock tracker's (its
    dispatch mode sees every allocation: only some gradients are categorized ``temp``)."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        out = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            from torch.distributed._tools.mem_tracker import _MemRefType

            def _grad_hook(grad):
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

            for param in module.parameters():
                if param.requires_grad and param.is_leaf and self._param_to_grad_hook_handles.get(param) is None:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(_grad_hook),
                        param.register_post_accumulate_grad_hook(lambda p: _grad_hook(p.grad)))
        return out


MODELS = {"llama-tiny": ("llama", LLAMA_TINY), "gqa-tiny": ("llama-gqa", GQA_TINY),
          "gpt2-tiny": ("gpt2", GPT2_TINY),
          # a wide MLP and a small vocabulary: the top layer's backward, not the loss, is the backward's peak
          "llama-wide": ("llama", _llama(256, 2048, 2, 8, 8, 1024)),
          "gqa-wide": ("llama-gqa", _llama(256, 2048, 2, 8, 2, 1024))}


def _cfg(id, model, batch_size, seq_len, *, rank, targets, regime="fp32", quantization=None,
         double_quant=False, lora_dropout=0.0, optimizer="adamw", optimizer_impl="foreach",
         checkpointing="none", attention="sdpa", gc_kwargs=None, prepare_kbit=False):
    family, base = MODELS[model]
    extra = {}
    if gc_kwargs is not None:           # CHECKPOINTED: gradient_checkpointing_enable(gradient_checkpointing_kwargs=...)
        extra["gradient_checkpointing_kwargs"] = gc_kwargs
    if prepare_kbit:
        extra["prepare_model_for_kbit_training"] = True
    return {"id": id, **extra, "family": family, "model": model, "hf_config": _hf(base, 0.0),
            "batch_size": batch_size, "seq_len": seq_len, "regime": regime, "optimizer": optimizer,
            "optimizer_impl": optimizer_impl, "checkpointing": checkpointing, "attention": attention,
            "dropout": 0.0, "method": "real", "sweep": None,
            "lora": {"rank": rank, "target_modules": targets, "quantization": quantization,
                     "double_quant": double_quant},
            "lora_dropout": lora_dropout}


QV = ["q_proj", "v_proj"]
ALL = "all-linear"
CONFIGS = [
    _cfg("lora-llama-tiny-fp32-r8-qv-b4-s256", "llama-tiny", 4, 256, rank=8, targets=QV),
    _cfg("lora-llama-tiny-fp32-r16-all-b4-s256", "llama-tiny", 4, 256, rank=16, targets=ALL),
    _cfg("lora-llama-tiny-fp32-r8-qv-eager-b2-s256", "llama-tiny", 2, 256, rank=8, targets=QV, attention="eager"),
    _cfg("lora-gqa-tiny-amp-r8-qv-b4-s256", "gqa-tiny", 4, 256, rank=8, targets=QV, regime="amp-bf16"),
    _cfg("lora-gqa-tiny-amp-r16-all-b4-s256", "gqa-tiny", 4, 256, rank=16, targets=ALL, regime="amp-bf16"),
    _cfg("lora-llama-tiny-bf16-r8-qv-b4-s256", "llama-tiny", 4, 256, rank=8, targets=QV, regime="bf16"),
    _cfg("lora-llama-tiny-bf16-r16-all-b4-s256", "llama-tiny", 4, 256, rank=16, targets=ALL, regime="bf16"),
    _cfg("lora-gpt2-tiny-fp32-r8-cattn-b4-s256", "gpt2-tiny", 4, 256, rank=8, targets=["c_attn"]),
    _cfg("lora-gpt2-tiny-amp-r16-all-b4-s256", "gpt2-tiny", 4, 256, rank=16, targets=ALL, regime="amp-bf16"),
    _cfg("lora-gpt2-tiny-bf16-r8-cattn-cproj-b4-s256", "gpt2-tiny", 4, 256, rank=8, targets=["c_attn", "c_proj"],
         regime="bf16"),
    _cfg("lora-llama-tiny-fp32-r16-all-ckpt-b4-s256", "llama-tiny", 4, 256, rank=16, targets=ALL,
         checkpointing="full"),
    _cfg("lora-gqa-tiny-bf16-r8-qv-adafactor-loop-b2-s256", "gqa-tiny", 2, 256, rank=8, targets=QV, regime="bf16",
         optimizer="adafactor", optimizer_impl="for-loop"),
    _cfg("lora-gpt2-tiny-amp-r8-cattn-sgdm-eager-b2-s256", "gpt2-tiny", 2, 256, rank=8, targets=["c_attn"],
         regime="amp-bf16", optimizer="sgd-momentum", attention="eager"),
    _cfg("qlora-llama-tiny-bf16-nf4-dq-r16-all-b4-s256", "llama-tiny", 4, 256, rank=16, targets=ALL, regime="bf16",
         quantization="nf4", double_quant=True),
    _cfg("qlora-gqa-tiny-fp32-fp4-r8-qv-b4-s256", "gqa-tiny", 4, 256, rank=8, targets=QV, regime="fp32",
         quantization="fp4"),
]

# Eager QLoRA with every layer checkpointed as Hugging Face's Trainer and axolotl run it (issue 25/26: the
# checkpointed moments lora._dequantized_in_forward / _top_layer_backward were derived on torchtune + torchao):
#     /tmp/ftvenv/bin/python validation/measure_lora.py --checkpointed --out validation/lora_ckpt_measurements.json
# * "hf": get_peft_model, then model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant":
#   False}) (the Trainer's call with TrainingArguments(gradient_checkpointing=True, gradient_checkpointing_kwargs=
#   {"use_reentrant": False}), axolotl's default: src/axolotl/core/builders/base.py:599-610 at 067b021c).
# * "axolotl": axolotl 067b021c's loader for a QLoRA config with gradient_checkpointing: true
#   (src/axolotl/loaders/model.py:447-476, 1015-1023): gradient_checkpointing_enable(kwargs None), peft's
#   prepare_model_for_kbit_training(use_gradient_checkpointing=True) (every non-4-bit parameter to fp32,
#   enable_input_require_grads: the embedding output requires grad), the norms and embed_tokens/lm_head back to
#   bf16 (_convert_embedding_modules_dtype), then the adapters and the Trainer's non-reentrant checkpointing.
NR = {"use_reentrant": False}
CKPT_CONFIGS = [
    _cfg("qlora-ckpt-hf-llama-tiny-bf16-nf4-dq-r8-qv-b4-s256", "llama-tiny", 4, 256, rank=8, targets=QV,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-llama-tiny-bf16-nf4-dq-r8-qv-b4-s512", "llama-tiny", 4, 512, rank=8, targets=QV,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-llama-tiny-bf16-nf4-dq-r16-all-b4-s256", "llama-tiny", 4, 256, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-llama-tiny-bf16-nf4-dq-r16-all-b4-s512", "llama-tiny", 4, 512, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-gqa-tiny-bf16-nf4-dq-r8-qv-b4-s256", "gqa-tiny", 4, 256, rank=8, targets=QV,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-gqa-tiny-bf16-nf4-dq-r16-all-b4-s512", "gqa-tiny", 4, 512, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-axolotl-llama-tiny-bf16-nf4-dq-r16-all-b4-s512", "llama-tiny", 4, 512, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR,
         prepare_kbit=True),
    _cfg("qlora-ckpt-hf-llama-wide-bf16-nf4-dq-r8-qv-b4-s256", "llama-wide", 4, 256, rank=8, targets=QV,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-llama-wide-bf16-nf4-dq-r8-qv-b4-s512", "llama-wide", 4, 512, rank=8, targets=QV,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-llama-wide-bf16-nf4-dq-r16-all-b4-s256", "llama-wide", 4, 256, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-llama-wide-bf16-nf4-dq-r16-all-b4-s512", "llama-wide", 4, 512, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-hf-gqa-wide-bf16-nf4-dq-r16-all-b4-s512", "gqa-wide", 4, 512, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR),
    _cfg("qlora-ckpt-axolotl-llama-wide-bf16-nf4-dq-r16-all-b4-s512", "llama-wide", 4, 512, rank=16, targets=ALL,
         regime="bf16", quantization="nf4", double_quant=True, checkpointing="full", gc_kwargs=NR,
         prepare_kbit=True),
    # plain LoRA (a 16-bit or fp32 base, no quantization) with every layer checkpointed, the same way (issue 25
    # item 2: the top layer's checkpointed moments without the dequantization): peft's fp32 adapters over the base
    _cfg("lora-ckpt-hf-llama-wide-fp32-r8-qv-b4-s256", "llama-wide", 4, 256, rank=8, targets=QV,
         regime="fp32", checkpointing="full", gc_kwargs=NR),
    _cfg("lora-ckpt-hf-llama-wide-fp32-r16-all-b4-s256", "llama-wide", 4, 256, rank=16, targets=ALL,
         regime="fp32", checkpointing="full", gc_kwargs=NR),
    _cfg("lora-ckpt-hf-llama-wide-bf16-r8-qv-b4-s256", "llama-wide", 4, 256, rank=8, targets=QV,
         regime="bf16", checkpointing="full", gc_kwargs=NR),
    _cfg("lora-ckpt-hf-llama-wide-bf16-r16-all-b4-s256", "llama-wide", 4, 256, rank=16, targets=ALL,
         regime="bf16", checkpointing="full", gc_kwargs=NR),
    _cfg("lora-ckpt-hf-gqa-wide-fp32-r16-all-b4-s512", "gqa-wide", 4, 512, rank=16, targets=ALL,
         regime="fp32", checkpointing="full", gc_kwargs=NR),
    # under autocast (bf16): the frozen weights' fresh 16-bit casts in the checkpointed forward and the recompute
    _cfg("lora-ckpt-hf-llama-wide-amp-r8-qv-b4-s256", "llama-wide", 4, 256, rank=8, targets=QV,
         regime="amp-bf16", checkpointing="full", gc_kwargs=NR),
    _cfg("lora-ckpt-hf-llama-wide-amp-r16-all-b4-s256", "llama-wide", 4, 256, rank=16, targets=ALL,
         regime="amp-bf16", checkpointing="full", gc_kwargs=NR),
]


def _axolotl_prepare(model, dtype):
    """axolotl 067b021c's QLoRA loading steps before the adapters (CKPT_CONFIGS' "axolotl")."""
    from peft import prepare_model_for_kbit_training
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=None)
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    for name, module in model.named_modules():      # _convert_embedding_modules_dtype(before_kbit...=False)
        if "norm" in name or (any(m in name for m in ("embed_tokens", "lm_head")) and hasattr(module, "weight")):
            module.to(dtype)
    return model


def build_model(cfg: dict):
    """The base model (quantized for QLoRA) wrapped by peft."""
    from peft import LoraConfig, get_peft_model
    hf_config = harness.hf_config_of(cfg)
    dtype = torch.bfloat16 if cfg["regime"] == "bf16" else torch.float32
    lora = cfg["lora"]
    model = AutoModelForCausalLM.from_config(hf_config, attn_implementation=cfg["attention"], dtype=dtype)
    if lora["quantization"] is not None:
        from transformers import BitsAndBytesConfig
        if lora["quantization"] == "int8":
            bnb = BitsAndBytesConfig(load_in_8bit=True)
        else:
            bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=lora["quantization"],
                                     bnb_4bit_use_double_quant=lora["double_quant"], bnb_4bit_compute_dtype=dtype)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            del model
            model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=dtype,
                                                         attn_implementation=cfg["attention"], device_map="cpu")
    if cfg.get("prepare_model_for_kbit_training"):
        model = _axolotl_prepare(model, dtype)
    targets = lora["target_modules"]
    variants = {k: lora[k] for k in ("use_dora", "modules_to_save") if lora.get(k)}    # measure_lora_variants.py
    config = LoraConfig(r=lora["rank"], lora_alpha=2 * lora["rank"], lora_dropout=cfg["lora_dropout"],
                        target_modules=targets, bias="none", task_type="CAUSAL_LM", **variants)
    model = get_peft_model(model, config)
    model.train()
    if cfg["checkpointing"] == "full" and "gradient_checkpointing_kwargs" in cfg:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=cfg["gradient_checkpointing_kwargs"])
    elif cfg["checkpointing"] == "full":
        model.gradient_checkpointing_enable()
    return model, hf_config


def measure(cfg: dict, step=None) -> dict:
    """One run; ``step(model)``: what the protocol calls instead of the peft model (a loss of its own:
    measure_lora_variants.py)."""
    cell = {}

    def build(cfg):
        model, cell["hf_config"] = build_model(cfg)
        return model, torch.randint(0, cell["hf_config"].vocab_size, (cfg["batch_size"], cfg["seq_len"]))

    torch.manual_seed(0)
    with harness.training_run(cfg, build=build, tracker=FrozenAwareMemTracker) as run:
        model, mt, params = run.model, run.mt, run.params
        layers, _ = _submodules(model.get_base_model())
        alive, _ = run_protocol(mt, model if step is None else step(model), run.optimizer, run.input_ids,
                                autocast=harness.autocast_for(cfg))
        t_end = time.perf_counter()

        storage = {}
        for p in model.parameters():
            s = p.untyped_storage()
            storage[s.data_ptr()] = s.nbytes()
        for b in model.buffers():
            s = b.untyped_storage()
            storage[s.data_ptr()] = s.nbytes()
        # bitsandbytes' QuantState tensors (absmax, code tables, nested statistics) are attributes of the
        # packed weights, neither parameters nor buffers: the tracker never sees them. Recorded here.
        quant = harness.quant_state_storages(model)
        measured = {
            "quant_state_bytes": int(sum(quant.values())),
            **peak_record(mt),
            "alive": alive,
            "layer_forward_retained_bytes": layer_forward_deltas(mt, layers),
            "parameters_and_buffers_bytes": int(sum(storage.values())),
            "trainable_parameters": int(sum(p.numel() for p in params)),
            "trainable_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in params}),
            "parameter_tensors": len(params),
            "peft_trainable_total": list(model.get_nb_trainable_parameters()),
            "wall_s": round(t_end - run.t0, 1),
        }
        return measured


def _versions() -> dict:
    import bitsandbytes
    import peft
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "bitsandbytes": bitsandbytes.__version__}


def document(args, runs, ctx) -> dict:
    generator = ("/tmp/ftvenv/bin/python validation/measure_lora.py --checkpointed --out "
                 "validation/lora_ckpt_measurements.json" if args.checkpointed else
                 "/tmp/ftvenv/bin/python validation/measure_lora.py --out validation/lora_measurements.json")
    return {
        "generator": generator,
        "environment": "python3 -m venv --system-site-packages /tmp/ftvenv && /tmp/ftvenv/bin/pip install "
                       "--no-deps peft==0.21.2 bitsandbytes==0.50.2 (torch==2.13.0, transformers==5.23.0 "
                       "from validation/requirements.txt)",
        "python": platform.python_version(), **_versions(), "device": "cpu",
        "total_wall_s": None if args.only else round(ctx.elapsed, 1),
        "runs": runs,
    }


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--checkpointed", action="store_true", help="the checkpointed QLoRA and LoRA runs (CKPT_CONFIGS)")

    harness.main(argv, description=__doc__.split("\n\n")[0], arguments=arguments,
                 configs=lambda args: CKPT_CONFIGS if args.checkpointed else CONFIGS, measure_run=measure,
                 document=document, versions=_versions, summary=harness.mib_summary(9, 2, wall=5),
                 line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<48} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
