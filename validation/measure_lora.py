#!/usr/bin/env python
"""Measure LoRA and QLoRA training iterations with PyTorch's own tracker (as ``measure.py`` does).

    python3 -m venv --system-site-packages /tmp/ftvenv
    /tmp/ftvenv/bin/pip install --no-deps peft==0.21.2 bitsandbytes==0.50.2
    /tmp/ftvenv/bin/python validation/measure_lora.py --out validation/lora_measurements.json [--only ID ...]

Needs torch==2.13.0 (CPU build) and transformers==5.23.0 (validation/requirements.txt) plus
peft==0.21.2 and bitsandbytes==0.50.2. Every model is built from its config with random weights (nothing
is downloaded): ``AutoModelForCausalLM.from_config``; for QLoRA the model is saved to a temporary
directory and reloaded with ``BitsAndBytesConfig`` (bitsandbytes quantizes on the CPU). Then
``peft.get_peft_model(model, LoraConfig(r, lora_alpha=2r, target_modules, lora_dropout, bias="none"))``
(peft's defaults otherwise: ``autocast_adapter_dtype=True`` keeps the adapters in fp32 over a 16-bit
base). The optimizer takes the trainable parameters (the adapters) and the protocol is measure.py's:
three iterations in ``MemTracker``, the third measured (steady state).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from configs import GPT2_TINY, GQA_TINY, LLAMA_TINY, _hf  # noqa: E402
from measure import PhaseMemTracker, _submodules  # noqa: E402
from measure import build_optimizer, layer_forward_deltas, peak_record, previous_runs, run_protocol  # noqa: E402

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402



class FrozenAwareMemTracker(PhaseMemTracker):
    """``MemTracker`` registers a gradient hook on every parameter, which raises for the frozen base of a
    LoRA model (``cannot register a hook on a tensor that doesn't require gradient``): hooks go on the
    trainable parameters only; everything else is the stock tracker's."""

    def _track_module_params_and_buffers(self, module, install_grad_hooks: bool = True):
        out = super()._track_module_params_and_buffers(module, install_grad_hooks=False)
        if install_grad_hooks:
            from torch.distributed._tools.mem_tracker import _MemRefType

            def _grad_hook(grad):
                self._update_and_maybe_create_winfos(grad, _MemRefType.GRAD)

            for param in module.parameters():
                if param.requires_grad and self._param_to_grad_hook_handles.get(param) is None:
                    self._param_to_grad_hook_handles[param] = (
                        param.register_hook(_grad_hook),
                        param.register_post_accumulate_grad_hook(lambda p: _grad_hook(p.grad)))
        return out


MODELS = {"llama-tiny": ("llama", LLAMA_TINY), "gqa-tiny": ("llama-gqa", GQA_TINY),
          "gpt2-tiny": ("gpt2", GPT2_TINY)}


def _cfg(id, model, batch_size, seq_len, *, rank, targets, regime="fp32", quantization=None,
         double_quant=False, lora_dropout=0.0, optimizer="adamw", optimizer_impl="foreach",
         checkpointing="none", attention="sdpa"):
    family, base = MODELS[model]
    return {"id": id, "family": family, "model": model, "hf_config": _hf(base, 0.0),
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


def build_model(cfg: dict):
    """The base model (quantized for QLoRA) wrapped by peft."""
    from peft import LoraConfig, get_peft_model
    hf_kwargs = dict(cfg["hf_config"])
    hf_config = AutoConfig.for_model(hf_kwargs.pop("model_type"), **hf_kwargs)
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
    targets = lora["target_modules"]
    config = LoraConfig(r=lora["rank"], lora_alpha=2 * lora["rank"], lora_dropout=cfg["lora_dropout"],
                        target_modules=targets, bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    model.train()
    if cfg["checkpointing"] == "full":
        model.gradient_checkpointing_enable()
    return model, hf_config


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    amp = cfg["regime"] == "amp-bf16"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, hf_config = build_model(cfg)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
        input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
        layers, named = _submodules(model.get_base_model())

        mt = FrozenAwareMemTracker()
        mt.track_external(model, optimizer, input_ids)
        autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if amp else contextlib.nullcontext
        alive, _ = run_protocol(mt, model, optimizer, input_ids, autocast=autocast)
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
        quant = {}
        for mod in model.modules():
            qs = getattr(getattr(mod, "weight", None), "quant_state", None)
            if qs is None:
                continue
            for t in (qs.absmax, qs.code, getattr(qs, "offset", None),
                      getattr(getattr(qs, "state2", None), "absmax", None),
                      getattr(getattr(qs, "state2", None), "code", None)):
                if isinstance(t, torch.Tensor):
                    st = t.untyped_storage()
                    quant[st.data_ptr()] = st.nbytes()
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
            "wall_s": round(t_end - t0, 1),
        }
    gc.collect()
    return measured


def _versions() -> dict:
    import bitsandbytes
    import peft
    return {"torch": torch.__version__, "transformers": transformers.__version__, "peft": peft.__version__,
            "bitsandbytes": bitsandbytes.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="measurements JSON to write")
    ap.add_argument("--only", nargs="+", metavar="ID", help="measure only these configuration ids (merge into --out)")
    args = ap.parse_args(argv)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    by_id = {c["id"]: c for c in CONFIGS}
    todo = [by_id[i] for i in args.only] if args.only else list(CONFIGS)
    previous = previous_runs(args.out, _versions())[0] if args.only else {}
    t0 = time.perf_counter()
    results = {}
    for n, cfg in enumerate(todo, 1):
        run = dict(cfg)
        try:
            run["measured"] = m = measure(cfg)
            gc.collect()
            msg = f"peak {m['peak_bytes'] / 2**20:9.2f} MiB in {m['peak_phase']:<9} ({m['peak_op']}) {m['wall_s']:5.1f}s"
        except Exception as e:  # record and go on
            run["error"] = f"{type(e).__name__}: {e}".strip()[:2000]
            run["error_traceback_tail"] = traceback.format_exc().strip().splitlines()[-6:]
            msg = f"ERROR {run['error'][:200]}"
        results[cfg["id"]] = run
        print(f"[{n:2d}/{len(todo)}] {cfg['id']:<48} {msg}", flush=True)
    runs = [results.get(c["id"]) or previous.get(c["id"]) for c in CONFIGS]
    runs = [r for r in runs if r is not None]
    doc = {
        "generator": "/tmp/ftvenv/bin/python validation/measure_lora.py --out validation/lora_measurements.json",
        "environment": "python3 -m venv --system-site-packages /tmp/ftvenv && /tmp/ftvenv/bin/pip install "
                       "--no-deps peft==0.21.2 bitsandbytes==0.50.2 (torch==2.13.0, transformers==5.23.0 "
                       "from validation/requirements.txt)",
        "python": platform.python_version(), **_versions(), "device": "cpu",
        "total_wall_s": None if args.only else round(time.perf_counter() - t0, 1),
        "runs": runs,
    }
    with open(args.out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)
    print(f"wrote {args.out}: {len(runs)} runs, {sum(1 for r in runs if r.get('error'))} errors", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
