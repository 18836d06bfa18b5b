#!/usr/bin/env python
"""torchtitan's Llama 3.1 8B FSDP + per-op SAC benchmark configuration, reproduced on the CPU at reduced depth.

    /tmp/valvenv/bin/python validation/published/torchtitan_measure.py [--only ID ...]
    # writes validation/published/torchtitan_measurements.json; torch==2.13.0 CPU, transformers==5.23.0

What the published row ran (torchtitan 9dec370ad26b5f8e9a7333a0e36165018262644b, the commit its performance table
names): train_configs/llama3_8b.toml (seq_len 8192, selective AC ``op``, compile false) with local batch 2;
parallelisms/parallelize_llama.py ``apply_ac`` (checkpoint_wrapper(block, context_fn=SAC policy,
preserve_rng_state=False) around every block, BEFORE fully_shard), ``_save_list`` (mm, flash/efficient SDPA,
reduce_scatter, abs, max; every second mm recomputed), ``apply_fsdp`` (MixedPrecisionPolicy(param_dtype=bf16,
reduce_dtype=fp32) from config_manager.py's defaults; every block ``reshard_after_forward = layer_id < n_layers - 1``:
the LAST block keeps its gathered parameters into the backward; the root fully_shard with
reshard_after_forward=True, which torch of that date (Dec 2024) overrode for the root: root parameters stay gathered
from forward to backward, as torch 2.13 does when the root's option is left to its default); train.py ``loss_fn``
(cross_entropy(pred.flatten(0, 1).float(), labels), ``del pred`` before backward).

Here: Hugging Face's Llama (LlamaForCausalLM, the same ops: RMSNorm upcast, SwiGLU, SDPA, GQA; HF's loss upcasts the
bf16 logits with ``.float()`` and returns only the loss, so the bf16 logits are freed before backward, as with
``del pred``) at the 8B's public widths (hidden 4096, FFN 14336, 32 heads, 8 KV heads, vocabulary 128,256) with
2 or 3 layers (the per-layer bytes are the difference), b = 2, s = 8192, under FakeTensorMode, as rank 0 of a fake
process group of 8 (or 128) ranks; each block wrapped with torch's checkpoint_wrapper and torchtitan's policy
(validation/techniques/checkpointing: the CPU SDPA kernel stands in for the GPU's flash attention), then
fully_shard'ed exactly as apply_fsdp does; AdamW foreach; validation/harness.py's protocol (iteration 3 measured)
inside FSDPMemTracker. What this cannot show: the CUDA caching allocator's reserved bytes, and the all-gather /
reduce-scatter streams' overlap (the fake process group runs collectives synchronously).
"""

from __future__ import annotations

import platform
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "parallel"))
sys.path.insert(0, str(HERE.parent))

import harness  # noqa: E402  (validation/harness.py: the protocol, the records, the command line)
from fakepg import fake_world  # noqa: E402  (validation/fakepg.py)
import measure_parallel as mp  # noqa: E402  (its FSDP tracker; imports the harness's fake-tensor patches)
import torch  # noqa: E402
import transformers  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.utils.checkpoint import create_selective_checkpoint_contexts  # noqa: E402

ckpt = harness.load("measure_checkpointing", HERE.parent / "techniques" / "checkpointing" / "measure_checkpointing.py")

OUT = HERE / "torchtitan_measurements.json"
# meta-llama/Llama-3.1-8B config.json widths (torchtitan's "8B" ModelArgs: dim 4096, 32 heads, 8 KV heads,
# ffn_dim_multiplier 1.3, multiple_of 1024 -> 14336; vocabulary 128,256 from its tiktoken tokenizer).
HF_CONFIG = dict(model_type="llama", hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                 num_key_value_heads=8, vocab_size=128256, rms_norm_eps=1e-5, rope_theta=500000.0,
                 max_position_embeddings=8192, tie_word_embeddings=False, use_cache=False,
                 attention_dropout=0.0, hidden_act="silu")


def _cfg(layers: int, world: int) -> dict:
    return {"id": f"tt-llama3-8b-widths-L{layers}-w{world}-r0", "hf_config": {**HF_CONFIG, "num_hidden_layers": layers},
            "layers": layers, "world_size": world, "rank": 0, "batch_size": 2, "seq_len": 8192,
            "regime": "mp-bf16", "optimizer": "adamw", "optimizer_impl": "foreach", "attention": "sdpa",
            "checkpointing": "op-sac", "method": "fake"}


CONFIGS = [_cfg(2, 8), _cfg(3, 8), _cfg(2, 128)]


def apply_torchtitan(model, mesh) -> None:
    """parallelize_llama.apply_ac (op SAC) then apply_fsdp, on HF's decoder layers."""
    layers = model.model.layers
    n = len(layers)
    for i in range(n):
        layers[i] = checkpoint_wrapper(
            layers[i], preserve_rng_state=False,
            context_fn=lambda: create_selective_checkpoint_contexts(
                ckpt.torchtitan_policy(ckpt.torchtitan_save_list())))
    mpp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for i in range(n):
        fully_shard(layers[i], mesh=mesh, mp_policy=mpp, reshard_after_forward=i < n - 1)
    # torchtitan passes True; torch of Dec 2024 kept the root gathered regardless, as 2.13's default does.
    fully_shard(model, mesh=mesh, mp_policy=mpp)


def measure(cfg: dict) -> dict:
    t0 = time.perf_counter()
    with fake_world(cfg["rank"], cfg["world_size"], collect=True):
        mesh = init_device_mesh("cpu", (cfg["world_size"],), mesh_dim_names=("dp",))
        with FakeTensorMode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model, input_ids = harness.build_model(cfg, prepare=lambda m: apply_torchtitan(m, mesh),
                                                   dtype=torch.float32)
            params = [p for p in model.parameters() if p.requires_grad]
            optimizer = harness.build_optimizer(params, "adamw", "foreach")
            mt = mp.PhaseFSDPMemTracker(model, optimizer)
            mt.track_inputs((input_ids,))

            def point() -> dict:
                snap = mp._one_device(mt.get_tracker_snapshot("current"))
                return {"bytes": int(snap[mp.TOTAL]) if snap else 0, "by_category": mp._cats(snap, mp.FSDP_CATEGORY)}

            alive, _ = harness.run_protocol(mt, model, optimizer, input_ids, point=point)
            out = {**harness.peak_record(mt, lambda s: mp._cats(s, mp.FSDP_CATEGORY)), "alive": alive,
                   "parameters": int(sum(mp._local(p).numel() for p in model.parameters())),
                   "wall_s": round(time.perf_counter() - t0, 1)}
        return out


def document(args, runs, ctx) -> dict:
    return {"generator": "/tmp/valvenv/bin/python validation/published/torchtitan_measure.py",
            "environment": {"torch": torch.__version__, "transformers": transformers.__version__,
                            "python": platform.python_version()},
            "runs": runs}


def main(argv=None) -> int:
    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS, measure_run=measure,
                        document=document, out=str(OUT), threads=1, keep_previous="always", catch=False,
                        sort_keys=False, atomic=False, versions=dict,
                        summary=lambda m: f"peak {m['peak_bytes'] / 2**30:8.3f} GiB in {m['peak_phase']} "
                                          f"({m['peak_op']}) {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"{c['id']:40} {msg}")


if __name__ == "__main__":
    sys.exit(main())
