"""What torchtune 0.6.1's model builders put on the device at model init (issue 26, TTBUILDERS): each builder the
torchtune reader maps, built on the meta device under ``set_default_dtype(bfloat16)`` as the recipes build it
(``training.set_default_dtype(self._dtype)``): its parameters' and buffers' bytes by dtype, its rope modules (how many,
their cache and theta shapes), its attention's heads. The LoRA builders get the LoRA arguments of
tests/data/launch/torchtune/qwen2_5/3B_lora_single_device.yaml (q, v, output_proj and the MLP at rank 8), the same
that test_torchtune_builders_measured.py reads through the reader. Also the saved tensors of one MultiHeadAttention
call of torchtune's gemma component builder at 1, 2 and 4 key/value heads (4 query heads; CPU, bf16): what SDPA keeps
of k and v (the expand + flatten of one key/value head is a view).

    /tmp/tvenv/bin/python validation/torchtune_builders/measure_builders.py   # torch 2.13.0 (CPU), torchtune 0.6.1

writes builders_measurements.json beside this file. Nothing here needs a GPU: shapes and dtypes of a meta model are
those of the device model; the saved-tensor check runs on the CPU.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import torch

BUILDERS = [
    "gemma.gemma_2b", "gemma.lora_gemma_2b", "gemma.gemma_7b", "gemma.lora_gemma_7b",
    "qwen2.qwen2_1_5b", "qwen2.lora_qwen2_1_5b", "qwen2.qwen2_7b", "qwen2.lora_qwen2_7b",
    "qwen2_5.qwen2_5_3b", "qwen2_5.lora_qwen2_5_3b", "qwen2_5.qwen2_5_7b_base", "qwen2_5.qwen2_5_7b_instruct",
    "qwen2_5.lora_qwen2_5_7b_instruct", "llama3.llama3_8b", "llama3.lora_llama3_8b", "mistral.mistral_7b",
    "mistral.lora_mistral_7b", "llama2.llama2_7b", "llama2.lora_llama2_7b",
]
LORA = dict(lora_attn_modules=["q_proj", "v_proj", "output_proj"], apply_lora_to_mlp=True, lora_rank=8,
            lora_alpha=16, lora_dropout=0.0)


def _bytes(tensors):
    out = {}
    for t in tensors:
        key = str(t.dtype).removeprefix("torch.")
        out[key] = out.get(key, 0) + t.numel() * t.element_size()
    return out


def builder(path: str) -> dict:
    module, name = path.split(".")
    fn = getattr(importlib.import_module(f"torchtune.models.{module}"), name)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("meta"):
            model = fn(**LORA) if name.startswith("lora_") else fn()
    finally:
        torch.set_default_dtype(torch.float32)
    ropes = {}
    for m in model.modules():
        if hasattr(m, "rope_init"):
            ropes[id(m)] = {"class": type(m).__name__,
                            "cache": list(m.cache.shape) if hasattr(m, "cache") else None,
                            "theta": list(m.theta.shape) if hasattr(m, "theta") else None}
    attn = model.layers[0].attn
    return {"builder": f"torchtune.models.{path}", "lora": LORA if name.startswith("lora_") else None,
            "parameters": sum(p.numel() for p in model.parameters()),
            "parameter_bytes": _bytes(model.parameters()), "buffer_bytes": _bytes(model.buffers()),
            "buffers": len(list(model.buffers())), "rope_modules": len(ropes),
            "rope_shapes": sorted({json.dumps(v, sort_keys=True) for v in ropes.values()}),
            "layers": len(model.layers), "num_heads": attn.num_heads, "num_kv_heads": attn.num_kv_heads,
            "head_dim": attn.head_dim, "attention": type(attn).__name__}


def saved_kv() -> list[dict]:
    from torchtune.models.gemma._component_builders import gemma
    rows = []
    for kv in (1, 2, 4):
        torch.manual_seed(0)
        model = gemma(vocab_size=64, num_layers=1, num_heads=4, head_dim=16, num_kv_heads=kv, embed_dim=32,
                      intermediate_dim=64, max_seq_len=32).to(torch.bfloat16)
        attn = model.layers[0].attn
        sdpa, seen = torch.nn.functional.scaled_dot_product_attention, []

        def spy(q, k, v, *args, **kwargs):
            seen.append({"k_shape": list(k.shape), "k_stride": list(k.stride()),
                         "k_storage": k.untyped_storage().nbytes(), "v_storage": v.untyped_storage().nbytes()})
            return sdpa(q, k, v, *args, **kwargs)

        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        x = torch.randn(2, 8, 32, dtype=torch.bfloat16, requires_grad=True)
        torch.nn.functional.scaled_dot_product_attention = spy
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                attn(x, x)
        finally:
            torch.nn.functional.scaled_dot_product_attention = sdpa
        rows.append({"num_heads": 4, "num_kv_heads": kv, "head_dim": 16, "batch": 2, "seq_len": 8, "dtype": "bf16",
                     "sdpa_input": seen[0], "saved_storage_bytes": sorted(storages.values())})
    return rows


def main():
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import harness  # (validation/harness.py: write_json)
    import torchtune
    out = {"torch": torch.__version__, "torchtune": torchtune.__version__,
           "builders": [builder(b) for b in BUILDERS], "saved_kv": saved_kv()}
    path = Path(__file__).with_name("builders_measurements.json")
    harness.write_json(path, out, sort_keys=False)
    print(path)


if __name__ == "__main__":
    main()
