#!/usr/bin/env python
"""torchtune's Llama 3.1 8B LoRA on one RTX 4090 (README "Memory and training speed", 16.2 GiB), scaled down and
measured, and the published row's arithmetic.

    nice -n 10 /tmp/lossvenv/bin/python validation/published/torchtune_lora_8b.py --measure [--only ID ...]
    # writes validation/published/torchtune_lora_8b_measurements.json; /tmp/lossvenv: torch==2.13.0 (CPU),
    # torchtune==0.6.1, torchao==0.13.0 (validation/compile/measure_blocks.py's environment)
    python validation/published/torchtune_lora_8b.py     # the project's environment: both tables below

What is measured (``measure_blocks.measure``: the profiler's memory timeline, no dispatch mode, two warm-ups and
the third iteration measured): the recipe ``lora_finetune_single_device`` as ``8B_lora_single_device.yaml`` runs it
with ``compile=True``, the 8B's own vocabulary (128,256, untied, the LM head frozen: ``apply_lora_to_output:
False``) and its LoRA set (``lora_attn_modules: [q_proj, v_proj, output_proj]``, ``apply_lora_to_mlp: True``,
rank 8, alpha 16), torchtune's order (``training.compile_model``, then ``set_activation_checkpointing`` wraps each
compiled layer), ``CEWithChunkedOutputLoss`` with ``compile_loss`` (8 chunks), on two decoder layers whose head
dimension (128) and grouping (4 query heads per key/value head) are the 8B's and whose widths are a quarter of
it (hidden 1,024, FFN 3,584). fp32: this CPU's bf16 matmuls run at ~0.1 GFLOP/s (an EPYC without AVX512-BF16), so
a bf16 cell at this vocabulary does not finish; what bf16 changes (the compiled chunks save the 16-bit logits, not
an fp32 copy) is measured at vocabulary 32,000 in validation/compile/blocks_extra_measurements.json
(``tt-llama3_2-2l-v32000-bf16-blocks-full-chunked-lora-qv-b1-s512``: every phase within 0.42 %).
"""

from __future__ import annotations

import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PATH = os.path.join(HERE, "torchtune_lora_8b_measurements.json")

# The 8B config's adapters (torchtune v0.6.1 recipes/configs/llama3_1/8B_lora_single_device.yaml), as torchtune's
# builder names them and as the profile's LoRAConfig names them
ATTN = ["q_proj", "v_proj", "output_proj"]
TARGETS = ["q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _cfg(layers=2, hidden=1024, ffn=3584, heads=8, kv=2, vocab=128256, b=2, seq=512, regime="fp32"):
    tt = dict(vocab_size=vocab, num_layers=layers, num_heads=heads, num_kv_heads=kv, embed_dim=hidden,
              max_seq_len=seq, intermediate_dim=ffn, tie_word_embeddings=False)
    hf = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
          "intermediate_size": ffn, "num_hidden_layers": layers, "num_attention_heads": heads,
          "num_key_value_heads": kv, "vocab_size": vocab, "tie_word_embeddings": False, "head_dim": hidden // heads,
          "max_position_embeddings": seq, "rms_norm_eps": 1e-5, "hidden_act": "silu"}
    return {"id": f"tt-8b-lora-{layers}l-h{hidden}-f{ffn}-kv{kv}-v{vocab}-untied-{regime}-blocks-full-chunked"
                  f"-b{b}-s{seq}",
            "torchtune": tt, "hf_config": hf, "batch_size": b, "seq_len": seq, "regime": regime, "compile": "blocks",
            "loss": "chunked", "policy": "full", "optimizer": "adamw", "optimizer_impl": "foreach",
            "lora": {"attn": ATTN, "mlp": True, "targets": TARGETS, "rank": 8, "alpha": 16}}


CONFIGS = [_cfg(), _cfg(layers=3, seq=256)]


def measure_main(argv) -> int:
    sys.path.insert(0, os.path.join(ROOT, "validation"))
    sys.path.insert(0, os.path.join(ROOT, "validation", "compile"))
    import harness  # noqa: E402  (validation/harness.py)
    import measure_blocks  # noqa: E402  (validation/compile/measure_blocks.py)

    def document(args, runs, ctx):
        return {**measure_blocks.document(args, runs, ctx),
                "generator": "/tmp/lossvenv/bin/python validation/published/torchtune_lora_8b.py --measure"}

    return harness.main(argv, description=__doc__.split("\n\n")[0], configs=CONFIGS,
                        measure_run=measure_blocks.measure, document=document, out=PATH, incremental=True,
                        keep_previous="always", summary=lambda m: f"peak {m['peak_bytes']:>12,} B {m['wall_s']}s",
                        line=lambda n, t, c, msg: f"[{n:2d}/{t}] {c['id']:<70} {msg}")


def compare_rows(path: str = PATH):
    """(id, predicted phases, measured phases, baseline) as validation/compile/compare_blocks.py solves them."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("compile_compare_blocks",
                                                  os.path.join(ROOT, "validation", "compile", "compare_blocks.py"))
    compare_blocks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(compare_blocks)
    return list(compare_blocks.rows(path, torchtune_rope=True)), compare_blocks      # (torchtune's RoPE cache)


# The README's rows and the configs that produced them. The table was added by pytorch/torchtune 30b8519e8
# ("Readme Updates (#1664)", 2024-09-24) and is unchanged in v0.6.1 (README.md:119-125): "batch size 2 (without
# gradient accumulation), a dataset packed to sequence length 2048, and torch compile enabled", metric "Peak Memory
# per GPU". The recipe logs only PyTorch's allocator counters (torchtune/training/memory.py get_memory_stats:
# active_bytes.all.peak, max_memory_allocated, max_memory_reserved, reset after each log), none of which holds the
# CUDA context: the like-with-like prediction is the allocated one (active counts the same blocks). At 30b8519e8
# recipes/configs/llama3_1/8B_lora_single_device.yaml adapted q_proj and v_proj only (lora_attn_modules: ['q_proj',
# 'v_proj'], apply_lora_to_mlp: False); v0.6.1's adds output_proj and the MLP. Every other memory-relevant key is the
# same (batch_size 2, bf16, AdamW fused, CEWithChunkedOutputLoss, enable_activation_checkpointing True, offloading
# False; compile and the accumulation are the README's overrides).
CONFIG = "tests/data/launch/torchtune/llama3_1/8B_lora_single_device.yaml"      # v0.6.1
README = ["dataset.packed=True", "batch_size=2", "gradient_accumulation_steps=1", "compile=True",
          "tokenizer.max_seq_len=2048"]
AT_30B8519 = ["model.lora_attn_modules=[q_proj,v_proj]", "model.apply_lora_to_mlp=False"]
PUBLISHED = [
    # (what, overrides, hardware, published GiB)
    ("1x 4090, v0.6.1's config (the launch table's row)", README, "rtx-4090", 16.2),
    ("1x 4090, the config at 30b8519e8 (q, v adapted)", README + AT_30B8519, "rtx-4090", 16.2),
    ("1x A6000, the config at 30b8519e8 (q, v adapted)", README + AT_30B8519, "rtx-a6000", 30.3),
    ("1x A6000, the config at 30b8519e8, activation checkpointing off", README + AT_30B8519 +
     ["enable_activation_checkpointing=False"], "rtx-a6000", 30.3),
]


def published(rows=PUBLISHED):
    """Per row: (what, published GiB, allocated GiB, total GiB, {label: bytes} of the peak's activations) and the
    floor of the 4090 row: what is alive when the loss's backward starts."""
    from pathlib import Path
    from mlsysim_core.scenario import from_launch
    out = []
    for what, overrides, hardware, value in rows:
        r = from_launch([Path(ROOT) / CONFIG], hardware=hardware, overrides=overrides).scenario.solve()
        out.append((what, value, r.allocated_memory, r.total_memory, r))
    return out


def floor_bytes(r) -> dict:
    """What no schedule of the step can free before the loss's backward starts (bytes): the weights and buffers,
    the adapters' AdamW state, every checkpointed layer's input and every chunk's 16-bit logits (the compiled
    cross-entropy's inputs, saved for its backward)."""
    keep = ("checkpointed layers: their inputs", "every chunk's logits")
    return {"weights": r.weights, "optimizer state": r.optimizer_state,
            **{t.label: t.nbytes for t in r.terms if t.label.startswith(keep)}}


if __name__ == "__main__":
    if "--measure" in sys.argv:
        with contextlib.suppress(KeyboardInterrupt):
            sys.exit(measure_main([a for a in sys.argv[1:] if a != "--measure"]))
    rows, compare_blocks = compare_rows()
    print(compare_blocks.table(PATH, torchtune_rope=True))
    print()
    print("| run | published (peak per GPU) | predicted allocated (error) | predicted total (error) |")
    print("|---|---:|---:|---:|")
    results = published()
    for what, value, alloc, total, _r in results:
        print(f"| {what} | {value} GiB | {alloc / 2**30:.2f} GiB ({(alloc / 2**30 - value) / value:+.1%}) | "
              f"{total / 2**30:.2f} GiB ({(total / 2**30 - value) / value:+.1%}) |")
    parts = floor_bytes(results[1][4])
    print("\nThe 4090 row at 30b8519e8, alive when the loss's backward starts: " + " + ".join(
        f"{k} {v / 2**30:.3f}" for k, v in parts.items()) + f" = {sum(parts.values()) / 2**30:.3f} GiB")
