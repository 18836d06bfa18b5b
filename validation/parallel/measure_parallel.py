#!/usr/bin/env python
"""Measure the per-rank training-memory peak of SHARDED training (FSDP2, tensor parallelism, 2-D) in one process.

    python3 validation/parallel/measure_parallel.py --out validation/parallel/measurements.json [--only ID ...]

Needs ``torch==2.13.0`` (CPU build) and ``transformers==5.23.0`` (see ../README.md). Each configuration plays ONE
rank ``r`` of a world of ``W`` ranks: ``torch.distributed.init_process_group("fake", store=FakeStore(), rank=r,
world_size=W)`` (PyTorch's fake process group: collectives allocate their outputs but move no data), a CPU device
mesh, a Hugging Face model built from its config with random weights, the parallelism applied to it, and the
training protocol of ``../harness.py`` (AdamW foreach, ``zero_grad(set_to_none=True)``, ``loss = model(input_ids,
labels=input_ids).loss``, ``backward``, ``step``; iterations 1-2 warm up, the 3rd is measured) inside
``FSDPMemTracker`` (FSDP2 and 2-D) or ``MemTracker`` (tensor parallelism). The process group is destroyed after
every configuration. It also measures, with ``../harness.py``'s own ``measure()``, the single-device run of every
(model, regime, micro-batch, sequence) used, so that each rank can be compared to one device.

With ``--only`` the named configurations (parallel or single-device ids) are measured and merged into an existing
``--out`` file; without it everything is measured and the file is rewritten. ``--list`` prints the ids.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
VALIDATION = os.path.dirname(HERE)
sys.path.insert(0, VALIDATION)

import configs as _configs  # noqa: E402
import harness  # noqa: E402  (validation/harness.py; also installs its HF patches for fake tensors)
from fakepg import fake_world  # noqa: E402  (validation/fakepg.py)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState, _FSDPRefType  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType  # noqa: E402
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh  # noqa: E402
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (  # noqa: E402
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

TOTAL = "Total"
MEM_CATEGORY = {  # MemTracker (tensor parallelism)
    _MemRefType.PARAM: "parameter",
    _MemRefType.BUFFER: "buffer",
    _MemRefType.GRAD: "gradient",
    _MemRefType.ACT: "activation",
    _MemRefType.TEMP: "temp",
    _MemRefType.OPT: "optimizer_state",
    _MemRefType.OTH: "other",
}
FSDP_CATEGORY = {  # FSDPMemTracker (FSDP2, 2-D)
    _FSDPRefType.SHARDED_PARAM: "sharded_param",
    _FSDPRefType.UNSHARDED_PARAM: "unsharded_param",
    _FSDPRefType.BUFFER: "buffer",
    _FSDPRefType.SHARDED_GRAD: "sharded_grad",
    _FSDPRefType.UNSHARDED_GRAD: "unsharded_grad",
    _FSDPRefType.ACT: "activation",
    _FSDPRefType.TEMP: "temp",
    _FSDPRefType.ALL_GATHER: "all_gather",
    _FSDPRefType.REDUCE_SCATTER: "reduce_scatter",
    _FSDPRefType.OPT: "optimizer_state",
    _FSDPRefType.INP: "inputs",
}

# --------------------------------------------------------------------------- patch for fake 2-D runs
# FSDP2 over TP DTensors (2-D) concatenates the dp and tp meshes while sharding each parameter; the DeviceMesh
# constructor indexes a small int32 rank tensor, which FakeTensorMode refuses ("Please convert all Tensors to
# FakeTensors"). Device-mesh bookkeeping allocates nothing on the tracked device: run it outside fake mode.
from torch._subclasses.fake_tensor import unset_fake_temporarily  # noqa: E402

_orig_concatenate = DeviceMesh._concatenate


def _concatenate_unfaked(device_mesh_list):
    with unset_fake_temporarily():
        return _orig_concatenate(device_mesh_list)


DeviceMesh._concatenate = staticmethod(_concatenate_unfaked)

# --------------------------------------------------------------------------- models
# configs.py shapes, plus one GQA model whose 4 KV heads split over 4 tensor-parallel ranks (gqa-tiny has 2).
GQA_KV4 = _configs._llama(512, 1376, 4, 8, 4, 32000)  # ~40M, 8 heads, 4 KV heads
MODELS = dict(_configs.MODELS)
MODELS["gqa-kv4"] = ("llama-gqa", GQA_KV4)


def _hf_config(model: str) -> dict:
    return _configs._hf(MODELS[model][1], 0.0)


# --------------------------------------------------------------------------- configurations
FAKE_ONLY_MODELS = ("tinyllama-1.1b",)  # measured under FakeTensorMode only (single-device baseline included)


def _single_id(model: str, regime: str, b: int, s: int) -> str:
    return f"single-{model}-{regime}-b{b}-s{s}"


def _cfg(kind, model, world, rank, *, raf=None, regime="fp32", b=2, s=256, tp=None, root_raf="default",
         method="real", note=None):
    """One rank of one layout.

    kind: ``fsdp2`` | ``tp`` | ``tp+sp`` | ``2d`` (TP without SP on the inner mesh dim, FSDP2 on the outer).
    regime: ``fp32`` | ``bf16`` (parameters created in bf16) | ``mp-bf16`` (FSDP2 MixedPrecisionPolicy(param_dtype=
    bf16, reduce_dtype=fp32) over fp32 sharded parameters).
    raf: reshard_after_forward of the decoder layers (FSDP2 / 2-D). root_raf: ``default`` (not passed: FSDP2 keeps
    the root unsharded after forward) or a bool passed to the root's fully_shard too.
    """
    if kind in ("tp", "tp+sp"):
        mesh_shape, names = [world], ["tp"]
    elif kind == "fsdp2":
        mesh_shape, names = [world], ["dp"]
    elif kind == "2d":
        mesh_shape, names = [world // tp, tp], ["dp", "tp"]
    else:
        raise ValueError(kind)
    parts = [kind.replace("+", ""), model, regime, f"w{world}"]
    if kind == "2d":
        parts.append(f"dp{world // tp}tp{tp}")
    if raf is not None:
        parts.append("zero3" if raf else "zero2")
    if root_raf != "default":
        parts.append(f"rootraf{int(root_raf)}")
    parts += [f"b{b}", f"s{s}"]
    if method == "fake":
        parts.append("fake")
    parts.append(f"r{rank}")
    return {
        "id": "-".join(parts),
        "model": model,
        "family": MODELS[model][0],
        "hf_config": _hf_config(model),
        "layout": {
            "kind": kind,
            "world_size": world,
            "mesh_shape": mesh_shape,
            "mesh_dim_names": names,
            "rank": rank,
            "reshard_after_forward": raf,
            "root_reshard_after_forward": root_raf,
            "mp_policy": {"param_dtype": "bfloat16", "reduce_dtype": "float32"} if regime == "mp-bf16" else None,
        },
        "regime": regime,
        "optimizer": "adamw",
        "optimizer_impl": "foreach",
        "batch_size": b,
        "seq_len": s,
        "attention": "sdpa",
        "method": method,
        "single_device_id": _single_id(model, "bf16" if regime == "mp-bf16" else regime, b, s),
        "note": note,
    }


def _ranks(world: int) -> list[int]:
    return [0, world - 1]


def _build_configs() -> list[dict]:
    out = []
    # FSDP2, ZeRO-3-like (layers reshard after forward) and ZeRO-2-like, fp32, W = 2, 4, 8, first and last rank.
    for raf in (True, False):
        for w in (2, 4, 8):
            for r in _ranks(w):
                out.append(_cfg("fsdp2", "gqa-tiny", w, r, raf=raf))
    out.append(_cfg("fsdp2", "gqa-tiny", 4, 0, raf=True, root_raf=True,
                    note="root's fully_shard also gets reshard_after_forward=True"))
    for raf in (True, False):
        for r in _ranks(4):
            out.append(_cfg("fsdp2", "llama-small", 4, r, raf=raf))
    # GPT-2: tied embedding, vocab 50257 and 1024 positions: uneven dim-0 shards (padding) on every world size.
    for w in (2, 8):
        for r in _ranks(w):
            out.append(_cfg("fsdp2", "gpt2-tiny", w, r, raf=True))
    out.append(_cfg("fsdp2", "gpt2-tiny", 4, 3, raf=False))
    # pure bf16 and mixed precision (bf16 compute over fp32 sharded parameters, fp32 reduce)
    for r in _ranks(4):
        out.append(_cfg("fsdp2", "gqa-tiny", 4, r, raf=True, regime="bf16"))
        out.append(_cfg("fsdp2", "gqa-tiny", 4, r, raf=True, regime="mp-bf16"))
    out.append(_cfg("fsdp2", "gqa-tiny", 4, 0, raf=False, regime="mp-bf16"))
    out.append(_cfg("fsdp2", "llama-small", 2, 0, raf=False, regime="bf16"))
    # larger: SmolLM-like GQA (tied, 9 heads), llama-110m at a longer sequence
    for r in _ranks(8):
        out.append(_cfg("fsdp2", "gqa-small", 8, r, raf=True))
    out.append(_cfg("fsdp2", "llama-110m", 4, 0, raf=True, b=1, s=512))
    # Tensor parallelism (Megatron-style plan), without and with sequence parallelism.
    for kind in ("tp", "tp+sp"):
        for w in (2, 4, 8):
            for r in _ranks(w):
                out.append(_cfg(kind, "llama-tiny", w, r))
        out.append(_cfg(kind, "gqa-tiny", 2, 0))
        out.append(_cfg(kind, "gqa-kv4", 4, 0))
        out.append(_cfg(kind, "llama-tiny", 4, 0, regime="bf16"))
        out.append(_cfg(kind, "llama-110m", 4, 0, b=1, s=512))
    # 2-D: TP (no SP) inside, FSDP2 (ZeRO-3) across.
    for r in (0, 3):
        out.append(_cfg("2d", "llama-tiny", 4, r, raf=True, tp=2))
    out.append(_cfg("2d", "llama-tiny", 8, 7, raf=True, tp=2))
    # FakeTensorMode: twins of real configurations (must agree to the byte), then ~1B models.
    out.append(_cfg("fsdp2", "gqa-tiny", 4, 0, raf=True, method="fake"))
    out.append(_cfg("fsdp2", "gqa-tiny", 4, 3, raf=False, method="fake"))
    out.append(_cfg("tp", "llama-tiny", 2, 0, method="fake"))
    out.append(_cfg("tp+sp", "llama-tiny", 4, 0, method="fake"))
    out.append(_cfg("2d", "llama-tiny", 4, 3, raf=True, tp=2, method="fake"))
    big = dict(b=1, s=1024, method="fake")
    out.append(_cfg("fsdp2", "tinyllama-1.1b", 8, 0, raf=True, **big))
    out.append(_cfg("fsdp2", "tinyllama-1.1b", 8, 7, raf=False, **big))
    out.append(_cfg("fsdp2", "tinyllama-1.1b", 8, 0, raf=True, regime="mp-bf16", **big))
    out.append(_cfg("tp", "tinyllama-1.1b", 4, 0, **big))
    out.append(_cfg("tp+sp", "tinyllama-1.1b", 4, 0, **big))
    out.append(_cfg("2d", "tinyllama-1.1b", 8, 0, raf=True, tp=4, **big))
    return out


CONFIGS = _build_configs()


def _single_configs() -> list[dict]:
    seen, out = set(), []
    for c in CONFIGS:
        sid = c["single_device_id"]
        if sid in seen:
            continue
        seen.add(sid)
        regime = "bf16" if c["regime"] == "mp-bf16" else c["regime"]
        single = _configs._cfg(sid, c["model"] if c["model"] in _configs.MODELS else "gqa-tiny", c["batch_size"],
                               c["seq_len"], regime=regime, optimizer="adamw", optimizer_impl="foreach",
                               attention="sdpa", method="fake" if c["model"] in FAKE_ONLY_MODELS else "real")
        single["model"] = c["model"]
        single["family"] = c["family"]
        single["hf_config"] = c["hf_config"]
        out.append(single)
    return out


SINGLE_CONFIGS = _single_configs()


def _check() -> None:
    ids = [c["id"] for c in CONFIGS] + [c["id"] for c in SINGLE_CONFIGS]
    assert len(ids) == len(set(ids)), "duplicate ids"


_check()


# --------------------------------------------------------------------------- tracker with phases
class PhaseMemTracker(harness.PhaseTracking, MemTracker):
    def __init__(self) -> None:
        MemTracker.__init__(self)
        self._phase_init()


class PhaseFSDPMemTracker(harness.PhaseTracking, FSDPMemTracker):
    def __init__(self, mod, optm=None) -> None:
        FSDPMemTracker.__init__(self, mod, optm)
        self._phase_init()


def _one_device(snapshot: dict) -> dict | None:
    if len(snapshot) > 1:
        raise RuntimeError(f"tracked memory on several devices: {list(snapshot)}")
    return next(iter(snapshot.values())) if snapshot else None


def _cats(dev_snap: dict | None, names: dict) -> dict:
    dev_snap = dev_snap or {}
    return {name: int(dev_snap.get(ref, 0)) for ref, name in names.items()}


# --------------------------------------------------------------------------- parallelism
class ReplicateParallel(SequenceParallel):
    """Replicated parameters as DTensors (``Replicate()``), local tensors in and out.

    Used for the RMSNorms of tensor parallelism WITHOUT sequence parallelism: the norm's input (the residual stream)
    is replicated, so its weight gradient is the same on every rank. Making the weight a DTensor keeps all the
    parameters DTensors, which foreach AdamW needs (it refuses a mix of DTensor and plain tensors in one group).
    """

    def __init__(self) -> None:
        super().__init__(use_local_output=True)
        self.sequence_sharding = (Replicate(),)


def _decoder(model):
    base = getattr(model, "model", None) or getattr(model, "transformer")
    return base, list(getattr(base, "layers", None) or getattr(base, "h"))


def apply_tp(model, mesh, sp: bool) -> dict:
    """Megatron-style TP on a HF Llama: column-parallel q/k/v/gate/up, row-parallel o/down, vocab-parallel
    embedding (RowwiseParallel: rows = vocabulary) and LM head (ColwiseParallel, logits all-gathered: replicated).
    With ``sp``, torchtitan's Llama plan: the residual stream and norms sharded on the sequence (SequenceParallel),
    all-gathered (PrepareModuleInput -> Replicate) before attention and MLP, reduce-scattered (RowwiseParallel
    output Shard(1)) after them.
    """
    base, layers = _decoder(model)
    if not sp:
        for layer in layers:
            parallelize_module(layer, mesh, {
                "input_layernorm": ReplicateParallel(),
                "post_attention_layernorm": ReplicateParallel(),
                "self_attn.q_proj": ColwiseParallel(),
                "self_attn.k_proj": ColwiseParallel(),
                "self_attn.v_proj": ColwiseParallel(),
                "self_attn.o_proj": RowwiseParallel(),
                "mlp.gate_proj": ColwiseParallel(),
                "mlp.up_proj": ColwiseParallel(),
                "mlp.down_proj": RowwiseParallel(),
            })
        parallelize_module(model, mesh, {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate()),
            "model.norm": ReplicateParallel(),
            "lm_head": ColwiseParallel(output_layouts=Replicate()),
        })
        return {"embedding": "RowwiseParallel(input_layouts=Replicate()) (vocab-sharded, output all-reduced)",
                "norms": "ReplicateParallel (replicated DTensor weight, local in/out)",
                "attention": "ColwiseParallel q/k/v, RowwiseParallel o (all-reduce)",
                "mlp": "ColwiseParallel gate/up, RowwiseParallel down (all-reduce)",
                "lm_head": "ColwiseParallel(output_layouts=Replicate()) (logits all-gathered, full on every rank)"}
    for layer in layers:
        parallelize_module(layer, mesh, {
            "input_layernorm": SequenceParallel(),
            "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                            desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            "self_attn.q_proj": ColwiseParallel(),
            "self_attn.k_proj": ColwiseParallel(),
            "self_attn.v_proj": ColwiseParallel(),
            "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            "post_attention_layernorm": SequenceParallel(),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp.gate_proj": ColwiseParallel(),
            "mlp.up_proj": ColwiseParallel(),
            "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    parallelize_module(model, mesh, {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    return {"embedding": "RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)) (reduce-scatter)",
            "norms": "SequenceParallel (input/output sharded on the sequence)",
            "attention": "PrepareModuleInput Shard(1)->Replicate (all-gather), ColwiseParallel q/k/v, "
                         "RowwiseParallel(output_layouts=Shard(1)) o (reduce-scatter)",
            "mlp": "PrepareModuleInput Shard(1)->Replicate, ColwiseParallel gate/up, RowwiseParallel(output Shard(1)) down",
            "lm_head": "ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())",
            "position_ids": "passed explicitly (arange(s)): HF derives them from the embedding output's local "
                            "length s/W otherwise"}


def apply_fsdp(model, mesh, raf: bool, root_raf, mp_policy) -> None:
    _, layers = _decoder(model)
    kw = {"mesh": mesh}
    if mp_policy is not None:
        kw["mp_policy"] = mp_policy
    for layer in layers:
        fully_shard(layer, reshard_after_forward=raf, **kw)
    if root_raf == "default":
        if raf:
            fully_shard(model, **kw)  # None: True for non-root, but the root is kept unsharded after forward
        else:
            fully_shard(model, reshard_after_forward=False, **kw)
    else:
        fully_shard(model, reshard_after_forward=root_raf, **kw)


def _local(p) -> torch.Tensor:
    return p.to_local() if isinstance(p, DTensor) else p


def _param_stats(model, world: int, fsdp: bool) -> dict:
    params = list(model.parameters())
    local_numel = sum(_local(p).numel() for p in params)
    global_numel = sum(p.numel() for p in params)
    storages = {}
    for p in params:
        st = _local(p).untyped_storage()
        storages[st.data_ptr() if not _is_fake(p) else id(st)] = st.nbytes()
    out = {
        "parameters_global": int(global_numel),
        "local_parameters": int(local_numel),
        "local_parameter_storage_bytes": int(sum(storages.values())),
        "parameter_tensors": len(params),
        "parameter_dtype": str(_local(params[0]).dtype).replace("torch.", ""),
    }
    repl = shard = 0
    for p in params:
        if isinstance(p, DTensor) and any(isinstance(pl, Shard) for pl in p.placements):
            shard += p.numel()
        else:
            repl += p.numel()
    out["global_parameters_sharded"] = int(shard)
    out["global_parameters_replicated"] = int(repl)
    if fsdp:
        units = []
        for name, mod in model.named_modules():
            if not isinstance(mod, FSDPModule):
                continue
            group = mod._get_fsdp_state()._fsdp_param_group
            if group is None:
                continue
            orig = sum(fp._orig_size.numel() for fp in group.fsdp_params)
            padded = sum(fp.padded_sharded_param_size.numel() for fp in group.fsdp_params)
            local = sum(fp.sharded_size.numel() for fp in group.fsdp_params)
            units.append({"unit": name or "<root>", "parameters": int(orig), "tensors": len(group.fsdp_params),
                          "local_parameters": int(local), "padded_sharded_parameters": int(padded)})
        out["fsdp_units"] = units
    return out


def _is_fake(t) -> bool:
    from transformers.utils.import_utils import is_fake_tensor
    return is_fake_tensor(_local(t))


# --------------------------------------------------------------------------- one configuration
def measure_parallel(cfg: dict, extra_point=None) -> dict:
    """One rank of one layout. ``extra_point(model)``: more fields of every alive point."""
    t0 = time.perf_counter()
    lay = cfg["layout"]
    world, rank, kind = lay["world_size"], lay["rank"], lay["kind"]
    with fake_world(rank, world, collect=True):
        return _measure_in_pg(cfg, kind, world, t0, extra_point)


def _measure_in_pg(cfg: dict, kind: str, world: int, t0: float, extra_point=None) -> dict:
    lay = cfg["layout"]
    mesh = init_device_mesh("cpu", tuple(lay["mesh_shape"]), mesh_dim_names=tuple(lay["mesh_dim_names"]))
    # sub-meshes are sliced outside FakeTensorMode (slicing builds small int tensors)
    tp_mesh = mesh["tp"] if "tp" in lay["mesh_dim_names"] else None
    dp_mesh = mesh["dp"] if "dp" in lay["mesh_dim_names"] else None
    fake = cfg["method"] == "fake"
    mode = FakeTensorMode() if fake else contextlib.nullcontext()
    fsdp = kind in ("fsdp2", "2d")
    plan = {}

    def prepare(model):  # the layout, between the build and the optimizer
        plan["tp"] = None
        if tp_mesh is not None:
            plan["tp"] = apply_tp(model, tp_mesh, sp=kind == "tp+sp")
        if fsdp:
            mp = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
                  if cfg["regime"] == "mp-bf16" else None)
            apply_fsdp(model, dp_mesh, lay["reshard_after_forward"],
                       lay["root_reshard_after_forward"], mp)

    with mode, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, input_ids = harness.build_model(cfg, prepare=prepare)
        tp_plan = plan["tp"]
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = harness.build_optimizer(params, cfg["optimizer"], cfg["optimizer_impl"])
        extra = {}
        if kind == "tp+sp":
            extra["position_ids"] = torch.arange(cfg["seq_len"]).unsqueeze(0)
        _, layers = _decoder(model)
        pstats = _param_stats(model, world, fsdp)

        if fsdp:
            mt = PhaseFSDPMemTracker(model, optimizer)
            mt.track_inputs((input_ids, *extra.values()))
            names = FSDP_CATEGORY
        else:
            mt = PhaseMemTracker()
            mt.track_external(model, optimizer, input_ids, *extra.values())
            names = MEM_CATEGORY

        def point() -> dict:
            snap = _one_device(mt.get_tracker_snapshot("current"))
            d = {"bytes": int(snap[TOTAL]) if snap else 0, "by_category": _cats(snap, names)}
            if extra_point is not None:
                d.update(extra_point(model))
            return d

        alive, t_measured = harness.run_protocol(mt, model, optimizer, input_ids, point=point, model_kwargs=extra)
        t_end = time.perf_counter()

        measured = {
            **harness.peak_record(mt, lambda snapshot: _cats(snapshot, names)),
            "alive": alive,
            **pstats,
            "optimizer_state_tensors": int(sum(
                1 for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor))),
            "tracker": type(mt).__mro__[2].__name__,
            "tp_plan": tp_plan,
            "wall_s": None,
            "measured_iteration_wall_s": round(t_end - t_measured, 1),
        }
        if fsdp:
            measured["fsdp_unit_snapshots"] = _fsdp_unit_snapshots(mt, model, layers)
        else:
            measured["layer_forward_retained_bytes"] = harness.layer_forward_deltas(mt, layers)
        measured["wall_s"] = round(time.perf_counter() - t0, 1)
    return measured  # the model, optimizer and tracker die with this frame (gc.collect() in the caller)


def _fsdp_unit_snapshots(mt, model, layers) -> dict:
    """Totals at the FSDP states of the root, the first and the last layer (first occurrence in the iteration);
    categories at 'After Pre-Forward' (what the unit's all-gather left) and 'Before Post-Backward'."""
    states = [_FSDPModState.BEF_PRE_FW, _FSDPModState.AFT_PRE_FW, _FSDPModState.BEF_POST_FW,
              _FSDPModState.AFT_POST_FW, _FSDPModState.BEF_PRE_BW, _FSDPModState.AFT_PRE_BW,
              _FSDPModState.BEF_POST_BW, _FSDPModState.AFT_POST_BW]
    out = {}
    for name, mod in (("root", model), ("layer_first", layers[0]), ("layer_last", layers[-1])):
        stats = mt.memory_tracking.get(mod)
        if stats is None:
            continue
        d = {}
        for st in states:
            snaps = stats.snapshots.get(st)
            if snaps:
                dev = _one_device(snaps[0])
                d[st.value] = {"bytes": int(dev[TOTAL]) if dev else 0}
                if st in (_FSDPModState.AFT_PRE_FW, _FSDPModState.BEF_POST_BW) and dev:
                    d[st.value]["by_category"] = _cats(dev, FSDP_CATEGORY)
        out[name] = d
    return out


def measure_single(cfg: dict) -> dict:
    m = harness.measure(cfg)
    keep = ("peak_bytes", "by_category_at_peak", "peak_phase", "peak_op", "peak_module", "peak_by_phase", "alive",
            "layer_forward_retained_bytes", "parameters", "parameter_tensors", "parameter_dtype", "wall_s",
            "measured_iteration_wall_s")
    return {k: m[k] for k in keep}


# --------------------------------------------------------------------------- main
def _versions() -> dict:
    return {"torch": torch.__version__, "transformers": transformers.__version__}


def _run_isolated(cfg: dict) -> dict:
    """2-D configurations run in a subprocess: after one 2-D run, the next one in the same process fails in
    DTensor with "Could not resolve the process group registered under the name 3" (state cached across
    destroy_process_group). Standalone they run, and their bytes do not depend on isolation."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "m.json")
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", cfg["id"], out],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"child failed: {proc.stderr.strip()[-1500:]}")
        with open(out) as f:
            return json.load(f)


GENERATOR = "python3 validation/parallel/measure_parallel.py --out validation/parallel/measurements.json"


def measure_any(cfg: dict) -> dict:
    if cfg["id"] in SINGLE_IDS:
        return measure_single(cfg)
    if cfg["layout"]["kind"] == "2d":
        return _run_isolated(cfg)
    try:
        return measure_parallel(cfg)
    except Exception:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise


SINGLE_IDS = {c["id"] for c in SINGLE_CONFIGS}


def document(args, runs, ctx) -> dict:
    return {
        "generator": GENERATOR,
        "environment": "system python3 with torch==2.13.0 (CPU build) and transformers==5.23.0 "
                       "(or the venv of validation/README.md)",
        "python": platform.python_version(),
        **_versions(),
        "device": "cpu",
        "process_group": "fake (torch.testing._internal.distributed.fake_pg.FakeStore), one rank per configuration",
        "threads": torch.get_num_threads(),
        "total_wall_s": round(ctx.elapsed, 1) if not args.only else (ctx.previous.get("total_wall_s")
                                                                     if ctx.previous.get("runs") else None),
        "single_device": [r for r in runs if r["id"] in SINGLE_IDS],
        "runs": [r for r in runs if r["id"] not in SINGLE_IDS],
    }


def main(argv=None) -> int:
    def arguments(ap):
        ap.add_argument("--list", action="store_true", help="print the ids and exit")
        ap.add_argument("--child", nargs=2, metavar=("ID", "JSON"), help=argparse.SUPPRESS)

    def before(args):
        if args.child:  # one 2-D configuration in a fresh process (see _run_isolated)
            torch.set_num_threads(max(1, os.cpu_count() or 1))
            cfg = next(c for c in CONFIGS if c["id"] == args.child[0])
            with open(args.child[1], "w") as f:
                json.dump(measure_parallel(cfg), f)
            return 0
        if args.list:
            for c in SINGLE_CONFIGS + CONFIGS:
                print(c["id"])
            print(f"{len(CONFIGS)} parallel configurations, {len(SINGLE_CONFIGS)} single-device baselines")
            return 0
        return None

    harness.main(argv, description=__doc__.split("\n\n")[0], configs=SINGLE_CONFIGS + CONFIGS,
                 measure_run=measure_any, document=document, arguments=arguments, before=before,
                 sections=("single_device", "runs"), versions=_versions, tail=8,
                 summary=harness.mib_summary(9, 2),
                 line=lambda n, t, c, msg: f"[{n:3d}/{t}] {c['id']:<52} {msg}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
