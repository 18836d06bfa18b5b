#!/usr/bin/env python
"""torchtune 0.6.1's distributed QLoRA (``lora_finetune_distributed`` with a ``qlora_*`` builder: torchao's NF4
base under FSDP2), one rank of a fake process-group world, measured with the profiler's memory timeline.

    nice -n 10 /tmp/tvenv/bin/python validation/qlora_fsdp2/measure.py [--only ID ...]
    # writes validation/qlora_fsdp2/measurements.json; /tmp/tvenv: torch==2.13.0 (CPU), torchtune==0.6.1,
    # torchao==0.13.0
    nice -n 10 /tmp/tvenv/bin/python validation/qlora_fsdp2/measure.py --events ID     # where each phase peaks

What runs, as the recipe's ``_setup_model`` runs it (pytorch/torchtune v0.6.1,
a6290a5b40758f13bca61c386bc8756a49ef417e, recipes/lora_finetune_distributed.py), on the fake process group
(validation/fakepg.py: rank r of a world of W; collectives allocate their outputs and move nothing):

* the model built on the meta device in bf16 (``training.set_default_dtype``, ``torch.device("meta")``) by
  ``lora_llama3_1(..., quantize_base=True)`` (torchtune/models/llama3_1/_component_builders.py: every linear of
  the layers a ``LoRALinear`` or ``FrozenNF4Linear`` whose weight is ``to_nf4``'d; embedding, norms and the untied
  LM head bf16), the recipes' set: q_proj, v_proj, output_proj and the MLP adapted (405B_qlora.yaml's), rank 8,
  alpha 16, no dropout;
* ``set_trainable_params(model, get_adapter_params(model))``; with ``enable_activation_checkpointing``
  ``training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})``;
* ``training.shard_model`` with ``get_shard_conditions(names_to_match=custom_sharded_layers)`` (None as the 405B
  and 70B configs have it: each ``layers.i``; ``tok_embeddings``/``output`` in the ``-cs`` runs), then the root,
  ``reshard_after_forward=True`` (``fsdp_reshard_after_forward``'s default), on a 1-D CPU mesh of W ranks;
* the adapters ``to_empty`` + ``initialize_parameters``, ``rope_init``; then
  ``training.load_from_full_model_state_dict(model, full_sd, cpu)`` with a full bf16 state dict (a plain
  ``llama3_1`` of the same shape): torchtune's NF4 path (``to_nf4`` of the whole weight, ``torch.chunk`` over the
  ranks, ``new_zeros`` + ``copy_`` of this rank's rows: each rank keeps its rows' codes, scalers and factors, the
  weight's mean and 16-entry table whole), ``distribute_tensor`` for the rest; the state dict dropped after;
* the loss ``CEWithChunkedOutputLoss`` (``model.set_num_output_chunks``), the recipe's ``_loss_step``
  (measure_blocks.Step); ``torch.optim.AdamW(fused=True)`` (the configs'); the harness's protocol (two warm-ups,
  the third iteration measured: harness.profiled_iteration / memory_timeline).

Per run: the timeline's phases over the bytes alive when it started (``baseline_bytes``: every parameter's local
shard, NF4 inner tensors counted apart, buffers, optimizer state, the inputs: after setup, nothing else is alive),
and the per-weight storage of one sharded NF4 base (``nf4_shard``).
"""

from __future__ import annotations

import contextlib
import gc
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "compile"))

import harness  # noqa: E402  (validation/harness.py)
import torch  # noqa: E402

TINY = dict(vocab_size=1024, num_layers=2, num_heads=8, num_kv_heads=8, embed_dim=256, max_seq_len=512,
            intermediate_dim=512)
LORA = dict(attn=["q_proj", "v_proj", "output_proj"], mlp=True,
            targets=["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], rank=8, alpha=16)


def _cfg(world, rank=0, *, ac=False, b=2, seq=512, layers=2, kv=8, custom=None):
    tt = dict(TINY, num_layers=layers, num_kv_heads=kv, max_seq_len=seq)
    rid = (f"tt-llama3_1-{layers}l" + (f"-kv{kv}" if kv != 8 else "") + "-bf16-qlora"
           + ("-ac" if ac else "") + ("-cs" if custom else "")
           + (f"-fsdp2-w{world}r{rank}" if world > 1 else "-1dev") + f"-b{b}-s{seq}")
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": tt["embed_dim"],
          "intermediate_size": tt["intermediate_dim"], "num_hidden_layers": layers, "num_attention_heads": 8,
          "num_key_value_heads": kv, "vocab_size": tt["vocab_size"], "tie_word_embeddings": False, "head_dim": 32,
          "max_position_embeddings": seq, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    return {"id": rid, "torchtune": tt, "hf_config": hf, "batch_size": b, "seq_len": seq, "regime": "bf16",
            "lora": LORA, "activation_checkpointing": ac, "custom_sharded_layers": custom,
            "optimizer": "adamw", "optimizer_impl": "fused", "loss": "chunked",
            **({"layout": {"kind": "fsdp2", "world_size": world, "rank": rank}} if world > 1 else {})}


CONFIGS = [
    *(_cfg(w, ac=ac) for w in (2, 4) for ac in (False, True)),
    # the one-device twins (lora_finetune_single_device's setup: the model built on the device, the state dict
    # loaded with load_state_dict(strict=False)): what FSDP2 adds is the difference
    *(_cfg(1, ac=ac) for ac in (False, True)),
    _cfg(4, 3, ac=True),                                       # another rank of the same world
    _cfg(2, ac=True, custom=["tok_embeddings", "output"]),     # the 8B configs' custom_sharded_layers
]


def _nf4_bytes(t) -> dict:
    return {a: getattr(t, a).untyped_storage().nbytes() for a in t.__tensor_flatten__()[0]}


def measure(cfg: dict) -> dict:
    from fakepg import fake_world      # validation/fakepg.py
    if "layout" not in cfg:
        return _measure(cfg)
    lay = cfg["layout"]
    with fake_world(lay["rank"], lay["world_size"], collect=True):
        return _measure(cfg)


def _measure(cfg: dict) -> dict:
    from functools import partial

    from torch.distributed.device_mesh import init_device_mesh
    from torchtune import modules, training
    from torchtune.models.llama3_1._component_builders import llama3_1, lora_llama3_1
    from torchtune.modules.peft import LoRALinear, get_adapter_params, set_trainable_params

    torch.manual_seed(0)
    dtype = torch.bfloat16
    lo, tt = cfg["lora"], cfg["torchtune"]
    with training.set_default_dtype(dtype):
        full_sd = llama3_1(**tt).state_dict()       # the checkpoint's full state dict (bf16)
    if "layout" not in cfg:     # lora_finetune_single_device's _setup_model
        with training.set_default_dtype(dtype), torch.device("cpu"):
            model = lora_llama3_1(lo["attn"], lo["mlp"], False, **tt, lora_rank=lo["rank"], lora_alpha=lo["alpha"],
                                  quantize_base=True)
        model.load_state_dict(full_sd, strict=False)
        del full_sd
        set_trainable_params(model, get_adapter_params(model))
        if cfg["activation_checkpointing"]:
            training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
        gc.collect()
        return _run(cfg, model)
    with training.set_default_dtype(dtype), torch.device("meta"):
        model = lora_llama3_1(lo["attn"], lo["mlp"], False, **tt, lora_rank=lo["rank"], lora_alpha=lo["alpha"],
                              quantize_base=True)
    set_trainable_params(model, get_adapter_params(model))
    if cfg["activation_checkpointing"]:
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
    mesh = init_device_mesh("cpu", (cfg["layout"]["world_size"],))
    training.shard_model(model=model, shard_conditions=[partial(training.get_shard_conditions,
                                                                names_to_match=cfg["custom_sharded_layers"])],
                         cpu_offload=False, reshard_after_forward=True, dp_mesh=mesh)
    with training.set_default_dtype(dtype), torch.device("cpu"):
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.to_empty(device="cpu")
                m.initialize_parameters()
            if hasattr(m, "rope_init"):
                m.rope_init()
    training.load_from_full_model_state_dict(model, full_sd, torch.device("cpu"))
    del full_sd
    training.validate_no_params_on_meta_device(model)
    gc.collect()
    return _run(cfg, model)


def _run(cfg: dict, model) -> dict:
    from measure_blocks import Step      # validation/compile/measure_blocks.py: the recipe's _loss_step
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    tt = cfg["torchtune"]
    loss_fn = CEWithChunkedOutputLoss()
    model.set_num_output_chunks(loss_fn.num_output_chunks)
    step = Step(model, loss_fn)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=3e-4, weight_decay=0.01, fused=True)
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(0, tt["vocab_size"], (cfg["batch_size"], cfg["seq_len"]), generator=g)
    t0 = time.perf_counter()
    prof = harness.profiled_iteration(step, optimizer, input_ids, warmup=2)
    wall = time.perf_counter() - t0
    local = [t.to_local() if hasattr(t, "to_local") else t for t in model.parameters()]
    tensors = [*local, *model.buffers(), input_ids,
               *(v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))]
    tensors = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]      # DTensors: this rank's shard
    nf4 = [t for t in local if type(t).__name__ == "NF4Tensor"]
    tensors = [inner for t in tensors for inner in ([getattr(t, a) for a in t.__tensor_flatten__()[0]]
                                                    if type(t).__name__ == "NF4Tensor" else [t])]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    shard = {name: {"shape": list(q.shape), "global_shape": list(p.shape), **_nf4_bytes(q)}
             for name, p in model.named_parameters() if name.startswith("layers.0.")
             for q in [p.to_local() if hasattr(p, "to_local") else p] if type(q).__name__ == "NF4Tensor"}
    record = harness.memory_timeline(prof)
    del prof
    return {**record, "baseline_bytes": int(sum(storages.values())), "wall_s": round(wall, 1),
            "nf4_bytes": int(sum(sum(_nf4_bytes(t).values()) for t in nf4)), "nf4_shard": shard,
            "parameters": sum(p.numel() for p in model.parameters())}


def document(args, runs, ctx) -> dict:
    import torchao
    import torchtune
    return {"generator": "nice -n 10 /tmp/tvenv/bin/python validation/qlora_fsdp2/measure.py",
            "python": platform.python_version(), "torch": torch.__version__, "torchtune": torchtune.__version__,
            "torchao": torchao.__version__, "device": "cpu", "threads": torch.get_num_threads(),
            "timeline": "harness.profiled_iteration / memory_timeline", "runs": runs}


def events(run_id: str) -> None:
    """Where each phase of one configuration peaks: the running total at its peak and the ops around that moment
    (the profiler's events that contain it, outermost first)."""
    cfg = next(c for c in CONFIGS if c["id"] == run_id)
    captured = {}
    original = harness.memory_timeline

    def keep(prof, device_type="cpu"):
        captured["events"] = [(e.name(), e.start_ns(), e.start_ns() + e.duration_ns(), e.nbytes(),
                               e.device_type().name.lower()) for e in prof.profiler.kineto_results.events()]
        return original(prof, device_type)

    harness.memory_timeline = keep
    rec = measure(cfg)
    ev = captured["events"]
    mem = sorted((s, n) for name, s, e, n, d in ev if name == "[memory]" and d == "cpu")
    for phase, s0, e0 in sorted(((n[len(harness.PHASE_PREFIX):], s, e) for n, s, e, _, _ in ev
                                 if n.startswith(harness.PHASE_PREFIX)), key=lambda r: r[1]):
        total, best = 0, (None, -1)
        for t, n in mem:
            total += n
            if s0 <= t <= e0 and total > best[1]:
                best = (t, total)
        t = best[0]
        ops = sorted(((s, name) for name, s, e, _, _ in ev if name != "[memory]" and t is not None and s <= t <= e),
                     key=lambda r: r[0])
        print(f"{phase}: peak {best[1]:,} at", " > ".join(name for _, name in ops[-14:]))
    print({k: rec[k] for k in ("peak_by_phase", "alive", "baseline_bytes")})


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--events"]:
        events(argv[1])
        return 0
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "measurements.json"), incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<50} {msg}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
