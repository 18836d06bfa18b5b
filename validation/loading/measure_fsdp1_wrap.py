#!/usr/bin/env python
"""FSDP1's wrap of a 4-bit QLoRA model, measured on the CPU: what the wrap allocates beyond the model
(the last stages of axolotl_qlora_fsdp_70b.py's table, on a small Llama).

    /tmp/tvenv/bin/python validation/loading/measure_fsdp1_wrap.py     # torch 2.13.0 CPU; ~20 s on 2 cores

Writes validation/loading/fsdp1_wrap.json. The environment: torch==2.13.0 (CPU), transformers==5.23.0,
peft==0.22.0, bitsandbytes==0.50.2 (it quantizes on the CPU); not the stack of axolotl 15f7910d (torch 2.1.2,
README.md here): what is checked is the mechanism the table prices, FSDP1's ``_init_param_handle_from_module``
(``FlatParamHandle.flatten_tensors``: ``torch.cat``, a copy; ``shard``: ``chunk.clone()``, the unsharded storage
freed), unit by unit, children first, the original parameters alive until the unit's handle is built.

The run: rank 0 of a fake process-group world of 2 (../fakepg.py); ../configs.py's ``gqa-tiny`` Llama (h 256,
4 layers, 8 heads, 2 KV heads, MLP 688, vocab 32,000) built in bf16, saved and reloaded with
``BitsAndBytesConfig(load_in_4bit, nf4, double quant, bnb_4bit_quant_storage=bfloat16)`` as axolotl 15f7910d
asks (utils/models.py), ``get_peft_model`` with r 8 on every linear of the layers (``lora_target_linear``),
then ``FullyShardedDataParallel(model, auto_wrap_policy=peft's fsdp_auto_wrap_policy(model),
cpu_offload=CPUOffload(offload_params=True), use_orig_params=False, device_id=cpu)`` as accelerate prepares it.
Differences from the GPU run: ``sync_module_states`` is off (FSDP1 refuses it for CPU tensors: its broadcast
buckets are not measured), and the offload is a move from the CPU to the CPU, so each unit's shard stays where
it was made, as the host copy does on the GPU run.

``torch.profiler.profile(activities=[CPU], profile_memory=True)`` around the wrap records each allocation and
free of the CPU allocator in order (as ../reserved/record_traces.py); the high-water mark of the bytes
allocated during the wrap, over what was allocated before it, is compared with the table's mechanism: at the
root unit (its flat parameter and its shard, with the embeddings, LM head and norm still alive), less what the
earlier units freed (each decoder layer's original parameters, P, for its shard, P / 2).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402
from torch._C._profiler import _EventType  # noqa: E402
from torch.distributed.fsdp import CPUOffload, FullyShardedDataParallel  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import harness  # noqa: E402  (validation/harness.py: write_json, versions)
from configs import GQA_TINY  # noqa: E402  (validation/configs.py)
from fakepg import fake_world  # noqa: E402  (validation/fakepg.py)

OUT = os.path.join(HERE, "fsdp1_wrap.json")
WORLD, RANK = 2, 8
WRAP = "loading::fsdp1_wrap"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _model():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig
    torch.manual_seed(0)
    config = LlamaConfig(**GQA_TINY)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_quant_storage=torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        del model
        model = AutoModelForCausalLM.from_pretrained(tmp, quantization_config=bnb, dtype=torch.bfloat16,
                                                     device_map="cpu")
    return get_peft_model(model, LoraConfig(r=RANK, lora_alpha=2 * RANK, lora_dropout=0.05, target_modules=TARGETS,
                                            task_type="CAUSAL_LM"))


def _padded(nbytes: int, itemsize: int) -> int:
    """A flat parameter's bytes, its numel padded to a multiple of the world size (``flatten_tensors``)."""
    numel = nbytes // itemsize
    return (numel + (-numel) % WORLD) * itemsize


def _prediction(model) -> dict:
    """The table's mechanism on this model: each unit, children first, allocates its flat parameter and its shard
    and frees the flat parameter and its original parameters: each decoder layer's frozen parameters P (codes and
    norms), each adapter's weight (a unit of its own), then the root's R (embeddings, final norm, LM head): the
    high-water mark is the root's R + R / 2 less what the earlier units freed (their originals less their shards)."""
    base = model.get_base_model()
    layers = base.model.layers
    frozen = [sum(p.nbytes for n, p in layer.named_parameters() if "lora_" not in n) for layer in layers]
    root = sum(p.nbytes for n, p in base.named_parameters() if not n.startswith("model.layers."))
    adapters = sum(p.nbytes for n, p in base.named_parameters() if "lora_" in n)
    P = [_padded(b, 2) for b in frozen]
    R = _padded(root, 2)
    lora = [p.nbytes for n, p in base.named_parameters() if "lora_" in n]     # one unit each (peft's policy)
    freed = sum(p - p // WORLD for p in P) + sum(a - a // WORLD for a in lora)
    at_root = R + R // WORLD - freed
    at_first = P[0] + P[0] // WORLD
    return {"layer_flat": P[0], "root_flat": R, "adapters": adapters, "root_params": root,
            "at_first_layer": at_first, "at_root": at_root,
            "high_water": max(at_first, at_root)}


def _high_water(prof) -> tuple[int, int]:
    """(the high-water mark of the bytes allocated inside the ``wrap`` range over those allocated when it began, the
    bytes at its end over the same). The profile spans the model's loading too: the CPU allocator reports no free
    of a block allocated before the profiler started."""
    events = []

    def walk(node):
        if node.tag == _EventType.Allocation and str(node.extra_fields.device) == "cpu":
            events.append((node.start_time_ns, node.extra_fields.alloc_size))
        for child in node.children:
            walk(child)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root)
    (start, end), = [(e.start_ns(), e.start_ns() + e.duration_ns()) for e in prof.profiler.kineto_results.events()
                     if e.name() == WRAP]
    now = 0
    for t, size in sorted(events, key=lambda e: e[0]):
        if t >= start:
            break
        now += size
    base = peak = now
    for t, size in sorted(events, key=lambda e: e[0]):
        if start <= t <= end:
            now += size
            peak = max(peak, now)
    return peak - base, now - base


def main() -> int:
    from peft.utils.other import fsdp_auto_wrap_policy
    with fake_world(0, WORLD, collect=True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                model = _model()
                predicted = _prediction(model)
                policy = fsdp_auto_wrap_policy(model)
                with record_function(WRAP):
                    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=policy,
                                                       cpu_offload=CPUOffload(offload_params=True),
                                                       use_orig_params=False, device_id=torch.device("cpu"))
            peak, end = _high_water(prof)
            del wrapped
    record = {"model": "gqa-tiny", "world_size": WORLD, "rank": 0, "lora_rank": RANK, "predicted": predicted,
              "measured": {"high_water": peak, "at_end": end},
              "environment": {**harness.versions("transformers", "peft", "bitsandbytes"),
                              "python": platform.python_version()}}
    harness.write_json(OUT, record, sort_keys=False)
    print(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
