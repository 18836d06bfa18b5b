#!/usr/bin/env python
"""Measure whole-model ``torch.compile`` with peft's LoRA (Hugging Face Trainer's ``torch_compile: true``) with
the profiler's memory timeline.

    nice -n 10 /tmp/valvenv/bin/python validation/compile/measure_lora_whole.py [--only ID ...]
    /tmp/valvenv/bin/python validation/compile/measure_lora_whole.py --saved ID [forward,backward]   # the probe
    # writes validation/compile/lora_whole_measurements.json; torch==2.13.0 (CPU), transformers==5.23.0,
    # peft==0.21.2 (validation/measure_lora.py's environment)

The Trainer (transformers 5.23.0, trainer.py ``_accelerator_args``) hands accelerate a ``TorchDynamoPlugin(
backend=args.torch_compile_backend, mode=args.torch_compile_mode, dynamic=None)``; accelerate's
``prepare_model`` then runs ``model = torch.compile(model, **dynamo_plugin.to_kwargs())`` on the model it is
given: the ``PeftModelForCausalLM``. With the defaults (backend inductor, mode None) that is
``torch.compile(peft_model)``, what is measured here. The model is ``validation/measure_lora.py``'s
(``AutoModelForCausalLM.from_config``, ``get_peft_model(LoraConfig(r, lora_alpha=2r, target_modules,
lora_dropout=0, bias="none"))``: peft's defaults, fp32 adapters over a 16-bit base); the optimizer takes the
adapters (AdamW, foreach); the protocol is ``harness.profiled_iteration``'s (two warm-ups, the third
iteration measured by ``torch.profiler.profile(profile_memory=True)``, no dispatch mode anywhere). Each run is
measured eager and compiled; the compiled run records Dynamo's graph count (``graph breaks`` + 1).
"""

from __future__ import annotations

import copy
import gc
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import configs as _configs  # noqa: E402  (validation/configs.py)
import harness  # noqa: E402  (validation/harness.py)
import measure_lora  # noqa: E402  (validation/measure_lora.py: build_model)

import torch  # noqa: E402

QV = ["q_proj", "v_proj"]
ALL = "all-linear"


def _cfg(regime, targets, b, seq, layers, vocab, checkpointing="none", rank=8, quantization=None, kv_heads=8,
         dropout=0.0, small=False):
    base = dict(copy.deepcopy(_configs.LLAMA_SMALL if small else _configs.LLAMA_TINY), num_hidden_layers=layers,
                vocab_size=vocab, num_key_value_heads=kv_heads)
    t = "qv" if targets == QV else "all"
    kv = f"-kv{kv_heads}" if kv_heads != 8 else ""
    q = f"-{quantization}" if quantization else ""
    ck = ("-ckpt" if checkpointing == "full" else "") + (f"-drop{dropout:g}" if dropout else "")
    name = "llama-small" if small else "llama-tiny"
    return {"id": f"hf-{name}-{layers}l-v{vocab}{kv}-{regime}{q}-lora-{t}{ck}-r{rank}-b{b}-s{seq}" if rank != 8 else
            f"hf-{name}-{layers}l-v{vocab}{kv}-{regime}{q}-lora-{t}{ck}-b{b}-s{seq}", "family": "llama",
            "model": f"{name}-{layers}l-v{vocab}{kv}", "hf_config": _configs._hf(base, 0.0),
            "batch_size": b, "seq_len": seq, "regime": regime, "optimizer": "adamw", "optimizer_impl": "foreach",
            "checkpointing": checkpointing, "attention": "sdpa", "dropout": 0.0, "method": "real",
            "lora": {"rank": rank, "target_modules": targets, "quantization": quantization, "double_quant": False},
            "lora_dropout": dropout,
            "compile": {"backend": "inductor", "mode": None, "dynamic": None, "what": "torch.compile(peft_model)"}}


CONFIGS = [
    _cfg("fp32", QV, 2, 512, 3, 1024),
    _cfg("fp32", ALL, 2, 512, 3, 1024),
    _cfg("fp32", QV, 1, 256, 2, 32000),
    _cfg("fp32", QV, 2, 512, 3, 1024, kv_heads=2),
    _cfg("bf16", QV, 1, 256, 3, 1024),
    _cfg("bf16", ALL, 1, 256, 3, 1024),
    _cfg("fp32", QV, 2, 512, 3, 1024, checkpointing="full"),
    # QLoRA (bitsandbytes 0.50.2's CPU backend, nf4, the compute dtype bf16): measured, refused by the profile
    _cfg("bf16", QV, 1, 256, 3, 1024, quantization="nf4"),
    # peft's lora_dropout (axolotl's configs: 0.05): nn.Dropout on lora_A's input, inside the graph
    _cfg("fp32", QV, 2, 512, 3, 1024, dropout=0.05),
    _cfg("bf16", QV, 1, 256, 3, 1024, dropout=0.05),
    # a wider model (configs.py's llama-small: h 512, FFN 1,376), rank 16, every linear
    _cfg("fp32", ALL, 1, 512, 2, 1024, rank=16, small=True),
]


def _timeline(cfg, compile: bool) -> dict:
    torch.manual_seed(0)
    model, hf_config = measure_lora.build_model(cfg)
    input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    run = torch.compile(model) if compile else model
    t0 = time.perf_counter()
    prof = harness.profiled_iteration(run, optimizer, input_ids, warmup=2)
    wall = time.perf_counter() - t0
    tensors = [*model.parameters(), *model.buffers(), input_ids,
               *(v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    record = harness.memory_timeline(prof)
    out = {**record, "baseline_bytes": int(sum(storages.values())), "compiled": compile, "wall_s": round(wall, 1)}
    if compile:
        c = torch._dynamo.utils.counters
        out["graphs"] = int(c["stats"].get("unique_graphs", 0))
        out["graph_breaks"] = {str(k): int(v) for k, v in c["graph_break"].items()}
    del prof, run, model, optimizer
    torch._dynamo.reset()
    gc.collect()
    return out


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    out = {"eager": _timeline(cfg, False), "compiled": _timeline(cfg, True)}
    out["peak_bytes"] = out["compiled"]["peak_bytes"]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    return out


def document(args, runs, ctx) -> dict:
    import peft
    return {"generator": "nice -n 10 /tmp/valvenv/bin/python validation/compile/measure_lora_whole.py",
            "environment": harness.ENVIRONMENT + " + peft==0.21.2 (validation/measure_lora.py)",
            "python": platform.python_version(), **harness._versions(), "peft": peft.__version__,
            "device": "cpu", "threads": torch.get_num_threads(),
            "timeline": "torch.profiler.profile(activities=[CPU], profile_memory=True, record_shapes=True): "
                        "[memory] events after zero_grad, phases in record_function('phase::NAME') ranges; bytes "
                        "above what is alive after zero_grad", "runs": runs}


def _summary(m) -> str:
    e, c = m["eager"], m["compiled"]
    return (f"eager {e['peak_bytes']:>12,} B compiled {c['peak_bytes']:>12,} B graphs {c.get('graphs')} "
            f"{m['wall_s']:6.1f}s")


def probe(cfg: dict, phase: str | None = None):
    """The partitioner's saved tensors of the compiled peft model (``saved_for_backward.py``'s wrapper of
    ``min_cut_rematerialization_partition``), or with ``phase`` the compiled iteration's allocations and frees
    in that phase (bytes, running total above the timeline's zero). Run with ``TORCHINDUCTOR_FX_GRAPH_CACHE=0
    TORCHINDUCTOR_AUTOGRAD_CACHE=0`` so that a cached graph does not skip the partitioner."""
    import torch._inductor.compile_fx as cfx
    from saved_for_backward import _describe
    torch.manual_seed(0)
    model, hf_config = measure_lora.build_model(cfg)
    input_ids = torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))
    if phase:
        optimizer = harness.build_optimizer([p for p in model.parameters() if p.requires_grad], "adamw", "foreach")
        prof = harness.profiled_iteration(torch.compile(model), optimizer, input_ids)
        events = prof.profiler.kineto_results.events()
        ranges = {e.name()[len(harness.PHASE_PREFIX):]: (e.start_ns(), e.start_ns() + e.duration_ns())
                  for e in events if e.name().startswith(harness.PHASE_PREFIX)}
        mem = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]"
                     and e.device_type().name.lower() == "cpu")
        for ph in phase.split(","):
            print(f"phase {ph}")
            total = 0
            for t, n in mem:
                total += n
                if ranges[ph][0] <= t <= ranges[ph][1]:
                    print(f"{n:>14,} {total:>14,}")
        return
    original = cfx.min_cut_rematerialization_partition

    def partition(joint, inputs, **kwargs):
        fw, bw = original(joint, inputs, **kwargs)
        n_out = kwargs.get("num_fwd_outputs")
        outs = next(n for n in fw.graph.nodes if n.op == "output").args[0]
        saved = [_describe(n) for n in outs[n_out:] if hasattr(n, "meta")]
        print(f"graph: {len(saved)} saved tensors, {sum(x['bytes'] for x in saved):,} B")
        for x in saved:
            print(f"  {x['name']:<28} {x['op']:<44} {str(x['shape']):<22} {x['dtype']:<9} {x['bytes']:>12,}")
        return fw, bw

    cfx.min_cut_rematerialization_partition = partition
    try:
        loss = torch.compile(model)(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        loss.backward()
    finally:
        cfx.min_cut_rematerialization_partition = original


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--saved"]:        # --saved ID [PHASE]
        probe(next(c for c in CONFIGS if c["id"] == argv[1]), argv[2] if len(argv) > 2 else None)
        return 0
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "lora_whole_measurements.json"),
                        incremental=True, keep_previous="always", summary=_summary,
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<46} {msg}")


if __name__ == "__main__":
    sys.exit(main())
