#!/usr/bin/env python
"""Measure one rank of LoRA training under tensor and pipeline parallelism together (issue 25 item 2): one pipeline
stage of a Hugging Face Llama split by torch's DTensor TP (with or without sequence parallelism), Megatron-Bridge's
adapters on it, run under Megatron-LM's 1F1B order.

    /tmp/pplvenv/bin/python validation/lora_parallel/measure_lora_tp_pp.py --out validation/lora_parallel/tp_pp_measurements.json

The two measured harnesses composed, neither copied: the tensor-parallel model of ``measure_lora_tp.py`` (the fake
process group, one rank of a tp world; ``../parallel/measure_parallel.py``'s ``apply_tp``, then ``measure_lora_tp.
add_adapters``: Megatron-Bridge's ``ParallelLinearAdapter`` re-implemented, on its sequence-parallel path with
``tp+sp``), cut to one stage and run by ``measure_lora_pp.py``'s ``Stage`` and ``run_stage`` (1F1B, what a receive
allocates: a fresh tensor of the stage input's shape with ``requires_grad=True``, a received gradient of the output's;
``StageMemTracker``, which counts the adapters' gradients apart). What a receive allocates on a tensor-parallel rank
is the residual stream as the layers hold it: whole without SP (every tp rank receives the replicated activation),
the rank's s / tp chunk with SP (Megatron-LM's p2p_communication sends the sequence-parallel shard). Position ids are
passed whole under SP (as ``measure_parallel`` does). Needs torch==2.13.0 (CPU), transformers==5.23.0.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import measure_lora_tp as tp  # noqa: E402  (puts validation/ and validation/parallel/ on sys.path)
import measure_lora_pp as pp  # noqa: E402
import measure_parallel as mp  # noqa: E402
import harness  # noqa: E402
from fakepg import fake_world  # noqa: E402  (validation/fakepg.py)

import torch  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402


def _cfg(regime, t, p, stage, m, *, kind="tp", rank=16, targets="all-linear", b=2, s=256, model="llama-tiny"):
    c = tp._cfg(regime, t, kind=kind, rank=rank, targets=targets, b=b, s=s, model=model)
    c["id"] = c["id"].replace("-r0", "") + f"-pp{p}-stage{stage}-m{m}"
    c["layout"].update(pp_size=p, stage=stage, microbatches=m, schedule="1f1b", tp_size=t)
    c["checkpointing"] = "none"
    return c


CONFIGS = [
    # llama-tiny's four layers on two stages of two, tp 2; 1F1B with m = 2 (stage 0 holds 2 micro-batches, stage 1 one)
    _cfg("fp32", 2, 2, 0, 2),
    _cfg("fp32", 2, 2, 1, 2),
    _cfg("bf16", 2, 2, 0, 2, targets=["q_proj", "v_proj"]),
    _cfg("bf16", 2, 2, 1, 2, targets=["q_proj", "v_proj"]),
    # tp 4, four stages of one layer, m = 4 (in flight 4, 3, 2, 1): the first and the last stage
    _cfg("fp32", 4, 4, 0, 4, rank=8),
    _cfg("fp32", 4, 4, 3, 4, rank=8),
    # with sequence parallelism
    _cfg("fp32", 2, 2, 0, 2, kind="tp+sp"),
    _cfg("fp32", 2, 2, 1, 2, kind="tp+sp"),
    _cfg("bf16", 2, 2, 0, 2, kind="tp+sp", targets=["q_proj", "v_proj"]),
    _cfg("bf16", 2, 2, 1, 2, kind="tp+sp", targets=["q_proj", "v_proj"]),
    # b = 1 (DTensor's reduce-scatter over the sequence, dim 1 of Hugging Face's (b, s, h), still copies the whole
    # partial output first: torch/distributed/_functional_collectives.py reduce_scatter_single, scatter_dim != 0:
    # _chunk_or_narrow_cat; Megatron's (s, b, h) reduce-scatters on dim 0 without it)
    _cfg("bf16", 2, 2, 0, 2, kind="tp+sp", targets=["q_proj", "v_proj"], b=1),
    _cfg("bf16", 2, 2, 1, 2, kind="tp+sp", targets=["q_proj", "v_proj"], b=1),
]


def measure(cfg: dict) -> dict:
    lay = cfg["layout"]
    t, p, stage = lay["tp_size"], lay["pp_size"], lay["stage"]
    sp = lay["kind"] == "tp+sp"
    with fake_world(0, t, collect=True):
        mesh = init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))
        model, ids = harness.build_model(cfg)
        plan = mp.apply_tp(model, mesh, sp)
        info = tp.add_adapters(model, cfg, t)
        L = model.config.num_hidden_layers
        per = L // p
        kwargs = {"position_ids": torch.arange(cfg["seq_len"]).unsqueeze(0)} if sp else {}
        net = pp.Stage(model, stage * per, (stage + 1) * per, stage == 0, stage == p - 1, kwargs)
        del model
        b, s, h = cfg["batch_size"], cfg["seq_len"], net.model.config.hidden_size
        out = pp.run_stage(cfg, net, ids, (b, s // t if sp else s, h), pp.StageMemTracker)
        out.update(tp_plan=plan, lora=info)
        return out


document = tp.document_for("measure_lora_tp_pp.py")


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.splitlines()[1], configs=CONFIGS, measure_run=measure,
                        document=document, out=os.path.join(HERE, "tp_pp_measurements.json"),
                        keep_previous="only")


if __name__ == "__main__":
    sys.exit(main())
