"""Record the allocation trace of small training steps on the CPU, for replay through the caching allocator.

    python validation/reserved/record_traces.py [ID ...]   # torch 2.13.0 CPU (+ deepspeed 0.19.8); ~5 min on 2 cores

Writes ``validation/reserved/traces/<id>.json.gz`` (every allocation and free, in order, from before the
model is built to the end of the third iteration, with the phase markers of each iteration) and
``validation/reserved/traces.json`` (the configurations, environment and what each trace holds).
``replay_traces.py`` replays them through ``mlsysim_plugins.measured.allocator.CachingAllocator``
(no torch needed) and compares with the measured profile's reserve mechanism.

How: ``torch.profiler.profile(activities=[CPU], profile_memory=True)`` around the whole run records each
allocation of the CPU allocator (``_EventType.Allocation``: its address and ``alloc_size``, negative for a
free), in time order, with no dispatch mode; the phases are ``record_function("phase::<iteration>:<name>")``
ranges (``zero_grad``, ``forward``, ``backward``, ``optimizer``) of harness.py's protocol (two warm-ups, the
third measured: ``zero_grad(set_to_none=True)``, forward with the loss, backward, ``del loss``, step).
A free is paired with the latest allocation at its address. What the CPU trace cannot show: the CUDA
kernels' own workspaces and the CUDA SDPA kernels' temporaries (the CPU runs PyTorch's CPU kernels), and the
streams' timing. The FSDP2 run tags each allocation with the stream FSDP2 entered (``_Streams``). The
tensor-parallel run (``TP_CONFIGS``) and the DeepSpeed ZeRO-1/2 runs (``ZERO_CONFIGS``: the engine's forward,
backward and step) are rank 0 of a fake process group of 2.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import platform
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch._C._profiler import _EventType  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import harness  # noqa: E402  (validation/harness.py)

PREFIX = "phase::"


def llama(hidden, layers, heads, kv, ffn, vocab):
    return {"model_type": "llama", "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "intermediate_size": ffn, "vocab_size": vocab,
            "max_position_embeddings": 4096, "tie_word_embeddings": False}


# Widths chosen so the tensors fall in each of the allocator's size classes: at most 1 MiB (small pool),
# 1-10 MiB (split from 20 MiB segments) and above 10 MiB (a segment each, rounded to 2 MiB).
CONFIGS = [
    {"id": "llama-h1024-l2-fp32-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000), "regime": "fp32",
     "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256, "attention": "sdpa"},
    {"id": "llama-h512-l4-fp32-b4-s256-forloop", "hf_config": llama(512, 4, 8, 8, 1376, 16000), "regime": "fp32",
     "optimizer": "adamw", "optimizer_impl": "for-loop", "batch_size": 4, "seq_len": 256, "attention": "sdpa"},
    {"id": "llama-h1024-l2-fp32-b2-s256-full-ckpt", "hf_config": llama(1024, 2, 16, 4, 2816, 16000),
     "regime": "fp32", "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 2, "seq_len": 256,
     "attention": "sdpa", "checkpointing": "full"},
]


# FSDP2 on rank 0 of a fake process group (``init_process_group("fake")``: collectives allocate their outputs,
# move no data), real CPU tensors, MixedPrecisionPolicy(bf16, fp32) (regime fsdp-bf16), every layer and the
# root fully_shard'ed (the root kept unsharded after forward, torch's default for it).
FSDP_CONFIGS = [
    {"id": "fsdp2-w2-llama-h1024-l2-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000), "regime": "fp32",
     "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256, "attention": "sdpa",
     "world_size": 2, "fsdp": "mp-bf16"},
]

# Tensor parallelism on rank 0 of a fake process group of 2 (validation/parallel/measure_parallel.py's apply_tp:
# DTensor ColwiseParallel q/k/v/gate/up, RowwiseParallel o/down, vocabulary-parallel embedding and LM head, norms
# replicated), real CPU tensors, fp32, AdamW foreach over the DTensors: the rank's parameter shards. The model is
# built whole and then distributed (the shards are new tensors, the whole ones freed in the build).
TP_CONFIGS = [
    {"id": "tp2-llama-h1024-l2-fp32-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000), "regime": "fp32",
     "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256, "attention": "sdpa",
     "world_size": 2, "tp": 2},
]

# DeepSpeed ZeRO-1 and ZeRO-2 (deepspeed 0.19.8, DeepSpeedZeroOptimizer, DS_ACCELERATOR=cpu) on rank 0 of a fake
# process group of 2, real CPU tensors, fp32 (bf16 off; one ZeRO-2 run with bf16 on), DeepSpeed's defaults otherwise (contiguous_gradients,
# reduce_bucket_size 5e8, overlap_comm off), torch AdamW; the engine's forward, backward and step (its step zeroes
# the gradients: the zero_grad phase is empty).
ZERO_CONFIGS = [
    {"id": f"zero{stage}-w2-llama-h1024-l2-fp32-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000),
     "regime": "fp32", "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256,
     "attention": "sdpa", "world_size": 2, "zero_stage": stage, "deepspeed": "0.19.8"}
    for stage in (1, 2)
] + [
    # DeepSpeed's bf16 mixed precision (bf16.enabled: the engine casts the fp32-built model to bf16; ZeRO-2 keeps a
    # bf16 flat buffer, the fp32 master partition and fp32 moments): the profile's mixed-bf16 regime
    {"id": "zero2-w2-llama-h1024-l2-mixed-bf16-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000),
     "regime": "mixed-bf16", "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256,
     "attention": "sdpa", "world_size": 2, "zero_stage": 2, "deepspeed": "0.19.8"},
    {"id": "zero3-w2-llama-h1024-l2-fp32-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000),
     "regime": "fp32", "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256,
     "attention": "sdpa", "world_size": 2, "zero_stage": 3, "deepspeed": "0.19.8"},
]

# LoRA (peft, validation/measure_lora.py's build_model: LoraConfig(r, lora_alpha=2r, target_modules, bias="none")),
# fp32, r 16 on every linear of the layers, AdamW foreach over the adapters: the frozen base's tensors, then many
# small adapters (r x in and out x r: the small pool's 2 MiB segments) and their gradients and moments.
LORA_CONFIGS = [
    {"id": "lora-r16-all-llama-h1024-l2-fp32-b1-s256", "hf_config": llama(1024, 2, 16, 4, 2816, 16000),
     "regime": "fp32", "optimizer": "adamw", "optimizer_impl": "foreach", "batch_size": 1, "seq_len": 256,
     "attention": "sdpa", "checkpointing": "none", "lora_dropout": 0.0,
     "lora": {"rank": 16, "target_modules": "all-linear", "quantization": None}},
]

STREAM = "stream::"


class _Streams:
    """``torch.cpu.stream`` wrapped so that each ``with device_handle.stream(s)`` FSDP2 enters is a profiler range
    ``stream::<id>``: an allocation inside it was made on that stream (FSDP2 on the CPU uses ``torch.cpu``'s
    device-agnostic Stream objects, one per role, as on CUDA)."""

    def __init__(self):
        self.original = torch.cpu.stream

    def __enter__(self):
        import contextlib

        @contextlib.contextmanager
        def stream(s):
            with self.original(s), record_function(f"{STREAM}{id(s)}"):
                yield
        torch.cpu.stream = stream
        return self

    def __exit__(self, *exc):
        torch.cpu.stream = self.original


def _build_fsdp(cfg):
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg["world_size"])
    model, input_ids = harness.build_model(cfg)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.model.layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    return model, input_ids


def _build_tp(cfg):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "parallel"))
    from measure_parallel import apply_tp
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg["world_size"])
    mesh = init_device_mesh("cpu", (cfg["tp"],), mesh_dim_names=("tp",))
    return harness.build_model(cfg, prepare=lambda model: apply_tp(model, mesh, sp=False))


def _build_zero(cfg):
    """A DeepSpeed engine over the model (its optimizer the engine's: step and zero_grad go through it)."""
    os.environ.update(DS_ACCELERATOR="cpu", LOCAL_RANK="0", RANK="0", WORLD_SIZE=str(cfg["world_size"]))
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=cfg["world_size"])
    import deepspeed
    model, input_ids = harness.build_model(cfg)
    ds = {"train_micro_batch_size_per_gpu": cfg["batch_size"], "gradient_accumulation_steps": 1,
          "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "weight_decay": 0.01, "torch_adam": True}},
          "zero_optimization": {"stage": cfg["zero_stage"]}, "bf16": {"enabled": cfg["regime"] == "mixed-bf16"}}
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds,
                                                   dist_init_required=False)
    return engine, optimizer, input_ids


def _build_lora(cfg):
    from measure_lora import build_model   # validation/measure_lora.py
    model, hf_config = build_model(cfg)
    return model, torch.randint(0, hf_config.vocab_size, (cfg["batch_size"], cfg["seq_len"]))


def _stream_names(model) -> dict:
    """id(stream) -> its role, from the FSDP state's communication context."""
    ctx = model._get_fsdp_state()._comm_ctx
    names = ("all_gather_copy_in_stream", "all_gather_stream", "reduce_scatter_stream", "all_reduce_stream")
    return {str(id(getattr(ctx, n))): n.removesuffix("_stream").replace("_", "-") for n in names}


def record(cfg: dict) -> dict:
    torch.manual_seed(0)
    fsdp = "fsdp" in cfg
    streams = _Streams() if fsdp else contextlib.nullcontext()
    with streams, profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        if "zero_stage" in cfg:
            _run_zero(cfg)
        else:
            model = _run(cfg, fsdp)
    return _events(prof, _stream_names(model) if fsdp else {})


def _run(cfg, fsdp):
    with record_function(PREFIX + "build"):
        model, input_ids = (_build_fsdp(cfg) if fsdp else _build_tp(cfg) if "tp" in cfg
                            else _build_lora(cfg) if "lora" in cfg else harness.build_model(cfg))
        optimizer = harness.build_optimizer([p for p in model.parameters() if p.requires_grad], cfg["optimizer"],
                                            cfg["optimizer_impl"])
    for it in range(3):
        with record_function(f"{PREFIX}{it}:zero_grad"):
            optimizer.zero_grad(set_to_none=True)
        with record_function(f"{PREFIX}{it}:forward"):
            loss = model(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        with record_function(f"{PREFIX}{it}:backward"):
            loss.backward()
            del loss
        with record_function(f"{PREFIX}{it}:optimizer"):
            optimizer.step()
    return model


def _run_zero(cfg):
    with record_function(PREFIX + "build"):
        engine, _, input_ids = _build_zero(cfg)
    for it in range(3):
        with record_function(f"{PREFIX}{it}:zero_grad"):
            pass
        with record_function(f"{PREFIX}{it}:forward"):
            loss = engine(input_ids=input_ids, labels=input_ids, use_cache=False).loss
        with record_function(f"{PREFIX}{it}:backward"):
            engine.backward(loss)
            del loss
        with record_function(f"{PREFIX}{it}:optimizer"):
            engine.step()


def _events(prof, names) -> dict:
    allocations = []

    def walk(node):
        if node.tag == _EventType.Allocation and str(node.extra_fields.device) == "cpu":
            allocations.append((node.start_time_ns, node.extra_fields.ptr, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    kineto = prof.profiler.kineto_results.events()
    phases = sorted((e.start_ns(), e.name()[len(PREFIX):]) for e in kineto if e.name().startswith(PREFIX))
    ranges = sorted((e.start_ns(), e.start_ns() + e.duration_ns(), names.get(e.name()[len(STREAM):], "other"))
                    for e in kineto if e.name().startswith(STREAM))

    def stream_at(t):       # the innermost (latest-starting) stream range holding t; the default stream else
        inside = [r for r in ranges if r[0] <= t <= r[1]]
        return max(inside)[2] if inside else None

    marks = [(t, 0, name) for t, name in phases]
    timeline = sorted([(t, 1, (ptr, n, t)) for t, ptr, n in allocations] + marks, key=lambda r: (r[0], r[1]))
    events, live, next_key = [], {}, 0
    unknown_frees = 0
    for _, kind, what in timeline:
        if kind == 0:
            events.append(["phase", what])
            continue
        ptr, n, t = what
        if n > 0:
            live[ptr] = next_key
            stream = stream_at(t) if ranges else None
            events.append(["alloc", next_key, int(n)] + ([stream] if stream else []))
            next_key += 1
        else:
            key = live.pop(ptr, None)
            if key is None:
                unknown_frees += 1
                continue
            events.append(["free", key])
    return {"events": events, "allocations": next_key, "frees_of_unknown_blocks": unknown_frees,
            "alive_at_end": len(live)}


def main() -> None:
    os.makedirs(os.path.join(HERE, "traces"), exist_ok=True)
    torch.set_num_threads(2)
    summary = []
    only = sys.argv[1:]
    for cfg in CONFIGS + FSDP_CONFIGS + TP_CONFIGS + ZERO_CONFIGS + LORA_CONFIGS:
        if only and cfg["id"] not in only:
            continue
        t0 = time.perf_counter()
        rec = record(cfg)
        path = os.path.join(HERE, "traces", cfg["id"] + ".json.gz")
        with gzip.GzipFile(path, "wb", mtime=0) as f:
            f.write(json.dumps(rec["events"], separators=(",", ":")).encode())
        summary.append({**cfg, "trace": os.path.relpath(path, HERE), "allocations": rec["allocations"],
                        "frees_of_unknown_blocks": rec["frees_of_unknown_blocks"],
                        "alive_at_end": rec["alive_at_end"], "wall_s": round(time.perf_counter() - t0, 1)})
        print(cfg["id"], rec["allocations"], "allocations", f"{time.perf_counter() - t0:.1f} s", flush=True)
    kept = []
    listing = os.path.join(HERE, "traces.json")
    if only and os.path.exists(listing):       # the runs not re-recorded stay, in the configurations' order
        with open(listing) as f:
            kept = [r for r in json.load(f)["runs"] if r["id"] not in only]
    order = [c["id"] for c in CONFIGS + FSDP_CONFIGS + TP_CONFIGS + ZERO_CONFIGS + LORA_CONFIGS]
    runs = sorted(kept + summary, key=lambda r: order.index(r["id"]))
    doc = {"generator": "python validation/reserved/record_traces.py [ID ...]",
           "environment": {"torch": torch.__version__, "python": platform.python_version(),
                           **harness.versions("transformers")},
           "runs": runs}
    with open(os.path.join(HERE, "traces.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
