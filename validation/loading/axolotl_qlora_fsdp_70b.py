"""What one GPU holds while axolotl 15f7910d loads and wraps examples/llama-3/qlora-fsdp-70b.yaml.

    python validation/loading/axolotl_qlora_fsdp_70b.py           # the table, per rank, in bytes, GB and GiB
    python validation/loading/axolotl_qlora_fsdp_70b.py --write   # rewrite its block in docs/launch-hf.md
    python validation/loading/axolotl_qlora_fsdp_70b.py --check   # exit 1 if docs/launch-hf.md differs

Derived from source, not measured (no GPU, and the stack of April 2024 cannot be installed here:
README.md of this folder). The code path, at the versions axolotl 15f7910d's requirements.txt pins
(transformers read at the 4.40.0 release, the pin being git 43d17c18 of the same week; peft 0.10.0,
bitsandbytes 0.43.0, accelerate 0.28.0; torch 2.1.2, the version of axolotl's Docker images then):

1. axolotl ``utils/config/__init__.py`` ``normalize_config``: two processes make ``cfg.ddp`` true and
   ``cfg.device_map = {"": LOCAL_RANK}``. ``utils/models.py`` ``load_model``: a ``llama`` model takes
   the ``LlamaForCausalLM.from_pretrained(..., device_map, quantization_config=BitsAndBytesConfig(nf4,
   double quant, bnb_4bit_quant_storage=bfloat16))`` branch; the FSDP-QLoRA loader of
   ``model_shard_quant.py`` (``load_sharded_model_quant``, Answer.AI's) is taken for ``dbrx`` only.
2. transformers ``modeling_utils.py`` ``_load_state_dict_into_meta_model``: with a quantizer every rank
   loads every weight (the rank-0-only path is ``not is_quantized``); ``Bnb4BitHfQuantizer
   .create_quantized_param`` quantizes each linear on the GPU (``Params4bit._quantize``: the bf16 weight
   ``.cuda()``, ``quantize_4bit``) and, FSDP being enabled, moves its codes to the CPU
   (``value.data.to("cpu")``); the ``QuantState`` stays on the GPU. The embeddings, the LM head and the
   norms are not quantized and go where the device map says: the GPU.
3. peft 0.10.0 ``LoraLayer.update_layer``: ``self.to(weight.device, dtype=weight.dtype)`` on the
   adapted module, the base weight being on the CPU: the adapters are created there in bf16, and
   ``Params4bit.to`` moves the ``QuantState`` to the CPU too (``QuantState.to`` moves absmax, offset
   and the nested state, not the 16-entry code table).
4. axolotl ``load_model`` lines 797-803: ``cfg.ddp and not load_in_8bit and not (cfg.rl and
   cfg.load_in_4bit) and not skip_move_to_device`` (the llama branch never sets it) ->
   ``model.to(f"cuda:{cfg.local_rank}")``: ``Params4bit.to`` on quantized parameters moves their codes
   and ``QuantState`` to the GPU: the whole quantized model, on every rank.
5. transformers ``Trainer._inner_training_loop`` starts with ``self.accelerator.free_memory()``
   (accelerate ``release_memory``: ``gc.collect()``, ``torch.cuda.empty_cache()``): what loading freed
   is returned to the driver; what is alive stays.
6. ``accelerator.prepare`` -> ``FSDP(model, device_id=..., sync_module_states=True,
   cpu_offload=CPUOffload(True), auto_wrap_policy=peft's fsdp_auto_wrap_policy)``; torch 2.1.2
   ``_init_param_handle_from_module`` per unit, children first: parameters on the CPU moved to the
   device (none here: all are on the GPU), states broadcast from rank 0 in 250 MiB buckets
   (``_sync_module_params_and_buffers``), ``FlatParamHandle.flatten_tensors`` (``torch.cat``: a copy),
   ``shard`` (``chunk.clone()``; the unsharded storage freed), ``flat_param_to(cpu)`` (offload). The
   live bytes fall unit by unit; nothing empties the cache afterwards, so the pool keeps the high-water
   mark of stage 4 plus the first unit's copies, and the root unit's copies (larger than any freed block)
   take new segments, unless a cudaMalloc fails first (the allocator then releases its cached blocks and
   retries: ``DeviceCachingAllocator::malloc``).

axolotl removed stage 4 for this path in a4a5bf05 (2024-07-13, "fixes to prevent vram spike when
train starts", #1742: ``skip_move_to_device`` and no device map in the llama branch under QLoRA + FSDP
with ``fsdp_cpu_ram_efficient_loading``).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "validation"))
from report import update_doc, write_table  # noqa: E402  (validation/report.py: the compare scripts' --doc)

DOC = ROOT / "docs" / "launch-hf.md"
BEGIN, END = "<!-- loading-70b: begin -->", "<!-- loading-70b: end -->"
MODEL = "meta-llama/llama-3.1-70b"      # what the axolotl reader maps casperhansen/llama-3-70b-fp16 to
RANK, WORLD, BLOCK, NESTED = 8, 2, 64, 256
PUBLISHED_GIB = 21                      # axolotl 15f7910d examples/llama-3/README.md:13 "Dual GPU @ 21GB VRAM"


def _linears(w):
    """(name, in, out) of one decoder layer's linears (bitsandbytes replaces each, peft adapts each:
    ``lora_target_linear: true``)."""
    hd = w.head_dim or w.hidden_dim // w.heads
    h, q, kv, f = w.hidden_dim, w.heads * hd, w.kv_heads * hd, w.ffn_dim
    return [("q_proj", h, q), ("k_proj", h, kv), ("v_proj", h, kv), ("o_proj", q, h),
            ("gate_proj", h, f), ("up_proj", h, f), ("down_proj", f, h)]


def _codes(n: int) -> int:
    """quantize_4bit's packed output with quant_storage bfloat16: bf16[(n + 1) // 4], in bytes."""
    return (n + 1) // 4 * 2


def _constants(n: int) -> tuple[int, int]:
    """(bytes QuantState.to moves, bytes it leaves): nf4, double quant (blocksize 64, nested 256):
    absmax uint8[blocks], offset fp32, nested absmax fp32[ceil(blocks / 256)] and code fp32[256];
    the nf4 code table fp32[16] is the one QuantState.to does not move."""
    blocks = math.ceil(n / BLOCK)
    return blocks + 4 + 4 * math.ceil(blocks / NESTED) + 256 * 4, 16 * 4


def stages(model: str = MODEL) -> list[tuple[str, int, str]]:
    """(stage, bytes alive on one rank's GPU, what) in the order the run goes through them."""
    from mlsysim_core import catalog
    w = catalog.get_model(model)
    L, h, V = w.layers, w.hidden_dim, w.vocab_size
    lin = _linears(w)
    codes = L * sum(_codes(i * o) for _, i, o in lin)
    moved = L * sum(_constants(i * o)[0] for _, i, o in lin)
    kept = L * sum(_constants(i * o)[1] for _, i, o in lin)
    plain = 2 * (2 * V * h + (2 * L + 1) * h)                  # embeddings, LM head, norms: bf16
    lora = 2 * L * RANK * sum(i + o for _, i, o in lin)        # bf16 (peft casts to the base weight's dtype)
    n = max(i * o for _, i, o in lin)
    quantizing = 2 * n + _codes(n) + 4 * math.ceil(n / BLOCK)  # bf16 weight, codes, fp32 absmax
    layer_flat = sum(_codes(i * o) for _, i, o in lin) + 2 * 2 * h
    root_flat = 2 * (2 * V * h + h)                            # the root unit: embeddings, final norm, LM head
    first = plain + moved + kept + codes + lora + layer_flat + layer_flat // WORLD
    return [
        ("from_pretrained, the largest linear being quantized", plain + moved + kept + quantizing,
         f"at most: embeddings, LM head and norms ({plain:,} B), every QuantState ({moved + kept:,} B), and "
         f"the bf16 weight, codes and fp32 absmax of a {n:,}-element linear ({quantizing:,} B)"),
        ("after get_peft_model", plain + kept,
         "the QuantStates followed the codes to the CPU (peft's self.to(weight.device)); the nf4 code tables stay"),
        ("after model.to(cuda) (axolotl models.py:803)", plain + moved + kept + codes + lora,
         f"the whole quantized model: codes {codes:,} B, QuantStates, embeddings, LM head, norms, "
         f"bf16 adapters {lora:,} B"),
        ("FSDP wrap, the first decoder layer", first,
         f"+ its flat parameter ({layer_flat:,} B, torch.cat) and its shard ({layer_flat // WORLD:,} B), "
         "before the shard goes to the CPU (broadcast buckets of up to 250 MiB not counted)"),
        ("FSDP wrap, the root unit (last)", plain + moved + kept + root_flat + root_flat // WORLD,
         f"the layers' codes and the adapters are on the CPU; the embeddings, LM head and norm, their flat parameter "
         f"({root_flat:,} B) and shard ({root_flat // WORLD:,} B). No freed block is that large (the largest: a "
         f"layer's flat parameter), so both take new segments: the pool reaches at least "
         f"{first + root_flat + root_flat // WORLD:,} B where the card has room; where it has not, the allocator "
         "releases its wholly free segments and retries, the pool starting again from what is alive"),
    ]


def table() -> str:
    lines = ["| stage (one rank) | alive on the GPU | GB | GiB | what |", "|---|---:|---:|---:|---|"]
    for name, nbytes, what in stages():
        lines.append(f"| {name} | {nbytes:,} B | {nbytes / 1e9:.2f} | {nbytes / 2**30:.2f} | {what} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = table()
    if "--check" in argv:
        if update_doc(f"{BEGIN}\n\n{text}\n\n{END}", DOC, begin=BEGIN, end=END) != DOC.read_text(encoding="utf-8"):
            print(f"{DOC} differs: run python validation/loading/axolotl_qlora_fsdp_70b.py --write", file=sys.stderr)
            return 1
        return 0
    if "--write" in argv:
        write_table(text, BEGIN, END, DOC)
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
