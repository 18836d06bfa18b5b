"""The LLaMA-Factory and axolotl readers (and PEFT's method comparison) against the memory those
projects published (issue 26).

    python tools/launch_validation_hf.py          # the markdown table docs/launch-hf.md records
    python tools/launch_validation_hf.py --write  # rewrite that table in docs/launch-hf.md
    python tools/launch_validation_hf.py --check  # exit 1 if docs/launch-hf.md differs (the tests run it)

Each row reads a real config (tests/data/launch/...) with the device count the published run
used, solves it under the measured profile, and compares like with like:

* "VRAM" (axolotl's READMEs: what nvidia-smi shows, the driver's view: the CUDA context plus
  PyTorch's reserved pool) against the prediction's total, runtime overheads included;
* PyTorch's ``max_memory_reserved`` (PEFT's ``accelerator_memory_max``: the reserved pool, no
  CUDA context) against the total less the CUDA context;
* LLaMA-Factory's README table is the project's own *estimate* (its "Hardware Requirement",
  marked "estimated"), not a measurement: those rows are a comparison of two estimates.

A run the tool cannot describe is listed with the field that switches it on (the refusal's
parameter). A run whose sequence length is data-dependent (no packing) is predicted at the
config's maximum length and marked not comparable.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "launch"
DOC = ROOT / "docs" / "launch-hf.md"
BEGIN, END = "<!-- validation-table: begin -->", "<!-- validation-table: end -->"

AX = "axolotl-ai-cloud/axolotl@067b021c"
AX_README = "axolotl-ai-cloud/axolotl@15f7910d"     # the README's lines 7-13, unchanged since
LF = "hiyouga/LLaMA-Factory@ff6d4d12 README.md"
PEFT = "huggingface/peft@5d602fdb method_comparison/MetaMathQA/results"
VRAM = "VRAM (nvidia-smi-like: reserved + CUDA context)"
ESTIMATE = "LLaMA-Factory's estimate (not a measurement)"

# (source, what was published, config files, gpus, hardware, -m, metric, value, unit)
ROWS = [
    # The README's figures were written with the configs of 15f7910d (2024-04-18): those are read
    # (tests/data/launch/axolotl/SOURCES.md); lora-8b.yml was then a Llama-2-7B 8-bit LoRA.
    (f"{AX_README} examples/llama-3/README.md:7", "Llama-3 8B full fine-tune, single GPU",
     ["axolotl/readme_15f7910d/llama-3/fft-8b.yaml"], 1, "nvidia/l40s", None, VRAM, 48, "GiB"),
    (f"{AX_README} examples/llama-3/README.md:9", "\"Llama-3 8B LoRA\" (the config then: Llama-2-7B, 8-bit base), single GPU",
     ["axolotl/readme_15f7910d/llama-3/lora-8b.yml"], 1, "nvidia/l40s", None, VRAM, 11, "GiB"),
    (f"{AX_README} examples/llama-3/README.md:13", "Llama-3 70B QLoRA + FSDP, two GPUs",
     ["axolotl/readme_15f7910d/llama-3/qlora-fsdp-70b.yaml"], 2, "nvidia/l40s", None, VRAM, 21, "GiB"),
    (f"{AX} examples/ministral/README.md:30", "Ministral 8B QLoRA (\"about 8.76 GiB VRAM\")",
     ["axolotl/examples/ministral/ministral-small-qlora.yaml"], 1, "h100", None, VRAM, 8.76, "GiB"),
    (f"{LF}:509", "7B full (bf16), README table: the full example (ZeRO-3 on one GPU)",
     ["llamafactory/examples/train_full/qwen3_full_sft.yaml"], 1, "h100", "meta-llama/llama-2-7b-hf", ESTIMATE, 120,
     "GB"),
    (f"{LF}:511", "7B LoRA, README table", ["llamafactory/examples/train_lora/qwen3_lora_sft.yaml"], 1, "h100",
     "meta-llama/llama-2-7b-hf", ESTIMATE, 16, "GB"),
    (f"{LF}:513", "7B QLoRA 4-bit, README table", ["llamafactory/examples/train_qlora/qwen3_lora_sft_otfq.yaml"], 1,
     "h100", "meta-llama/llama-2-7b-hf", ESTIMATE, 6, "GB"),
    (f"{LF}:511", "8B LoRA (the example's own model), README table's 7-8B row",
     ["llamafactory/examples/extras/loraplus/llama3_lora_sft.yaml"], 1, "h100", None, ESTIMATE, 16, "GB"),
    (f"{LF}:513", "8B QLoRA 4-bit (the example's own model), README table's 7-8B row",
     ["llamafactory/examples/extras/fsdp_qlora/llama3_lora_sft.yaml"], 1, "h100", None, ESTIMATE, 6, "GB"),
]

# A published figure below what the config must hold at its peak, whatever the implementation: the
# verdict says so, with the floor. axolotl 15f7910d's lora-8b.yml (Llama-2-7B, LLM.int8 base, LoRA r32 on
# every linear, sample_packing + pad_to_sequence_len: 2 x 4096 = 8,192 tokens a step, flash attention,
# gradient checkpointing) ran on the stack its requirements.txt pins: transformers 4.40 (git 43d17c18),
# peft 0.10.0, bitsandbytes 0.43.0. transformers 4.40.0 src/transformers/models/llama/modeling_llama.py
# lines 1228-1236: ``logits = logits.float()``, ``shift_logits = logits[..., :-1, :].contiguous()``,
# ``CrossEntropyLoss()``: at ``_log_softmax_backward_data`` three fp32 (T - 1) x V tensors are alive (the
# saved log-softmax, nll_loss's gradient, the new gradient; in the forward: the fp32 logits, their shifted
# copy, the log-softmax), beside the weights and the 32 checkpointed layer inputs (T x h x 2 B each).
_AX_T, _AX_H, _AX_V, _AX_L = 2 * 4096, 4096, 32000, 32


def _lora_8b_floor(result) -> int:
    """The weights (int8 linears, bf16 embeddings/norms/LM head, fp32 adapters: the prediction's own
    weight terms), the checkpoints and the loss's three fp32 tensors, in bytes: no optimizer state (it
    exists from the second step), no gradient, no recompute, no CUDA context, no allocator reserve."""
    return int(result.weights) + _AX_L * _AX_T * _AX_H * 2 + 3 * 4 * (_AX_T - 1) * _AX_V


def _qlora_fsdp_70b_loading_floor(result) -> int:
    """What each GPU holds after axolotl 15f7910d's ``model.to(f"cuda:{cfg.local_rank}")`` (models.py lines
    797-803: two processes make ``cfg.ddp`` true and the llama branch never sets ``skip_move_to_device``): the
    whole 4-bit model, its quantization states, the bf16 embeddings, LM head, norms and adapters, before FSDP
    shards and offloads it; derived from source by validation/loading/axolotl_qlora_fsdp_70b.py (its stages)."""
    import importlib.util
    path = ROOT / "validation" / "loading" / "axolotl_qlora_fsdp_70b.py"
    spec = importlib.util.spec_from_file_location("axolotl_qlora_fsdp_70b", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return max(nbytes for name, nbytes, _ in module.stages() if name.startswith("after model.to"))


# source -> (the floor in bytes from the result, the verdict's words for it)
FLOORS = {
    f"{AX_README} examples/llama-3/README.md:9": (
        _lora_8b_floor, "floor, {floor} allocated before the CUDA context: the weights, 32 checkpointed inputs "
                        "and the loss's three fp32 T x V"),
    f"{AX_README} examples/llama-3/README.md:13": (
        _qlora_fsdp_70b_loading_floor, "loading floor at 15f7910d, {floor} alive on each GPU after axolotl's "
                                       "model.to(cuda), before FSDP shards it: the whole 4-bit model, before the "
                                       "CUDA context (validation/loading/)"),
}

# PEFT's method comparison (MetaMathQA): its configs are PEFT's own (adapter_config.json +
# training_params.json over default_training_params.json), not a launch format read here; the
# run is expressed as the same Scenario: Llama-3.2-3B in bf16 without autocast (dtype bfloat16,
# use_amp false), batch 4, sequences up to max_seq_length 768 (data-dependent: not packed), no
# gradient checkpointing, torch AdamW. accelerator_memory_max is torch's max_memory_reserved over
# the whole run, evaluation (generation) included.
PEFT_ROWS = [
    ("full-finetuning--llama-3.2-3B-lr_0.00001.json", "Llama-3.2-3B full fine-tune (PEFT baseline)", None,
     38868615168),
    ("lora--llama-3.2-3B-rank32.json", "Llama-3.2-3B LoRA r32 q_proj,v_proj", {"rank": 32,
     "target_modules": ("q_proj", "v_proj")}, 22292725760),
    ("lora--llama-3.2-3B-rank64.json", "Llama-3.2-3B LoRA r64 q_proj,v_proj", {"rank": 64,
     "target_modules": ("q_proj", "v_proj")}, 22552772608),
]


def _context_bytes(result) -> float:
    return sum(t.nbytes for t in getattr(result, "terms", ()) if "CUDA context" in str(getattr(t, "label", "")))


def row(source, what, files, gpus, hardware, model, metric, value, unit) -> str:
    from mlsysim_core.errors import MlsysimError
    from mlsysim_core.scenario import from_launch
    shown = " + ".join(f"`{f}`" for f in files) + (f" `-m {model}`" if model else "") + f" `--gpus {gpus}`"
    try:
        launch = from_launch([DATA / f for f in files], gpus=gpus, hardware=hardware, model=model)
        result = launch.scenario.solve()
    except MlsysimError as err:
        field = str(getattr(err, "parameter", "?")).split(": ")[-1]
        return (f"| {what} | {shown} | {value} {unit} ({metric}) | refused: `{field}`="
                f"{_short(getattr(err, 'value', ''))} | not modelled | {source} |")
    scale = 2**30 if unit == "GiB" else 1e9
    predicted = result.total_memory / scale
    label = "total, with runtime overheads"
    approximated = sorted({f.key for r in launch.readings for f in r.fields if f.approximated})
    extra = f"; approximated: {', '.join(approximated)}" if approximated else ""
    not_packed = any("no packing" in f.note or "not packed" in f.note for r in launch.readings for f in r.fields
                     if f.field == "seq_len")
    error = (predicted - value) / value * 100
    verdict = f"{error:+.1f} %"
    if source in FLOORS:
        floor, words = FLOORS[source]
        verdict += f" (not comparable: below this config's {words.format(floor=f'{floor(result) / scale:.2f} {unit}')})"
    if metric == ESTIMATE:
        verdict += " (estimate vs estimate)"
    if not_packed:
        verdict += " (not like-for-like: no packing, predicted at the config's maximum length)"
    return (f"| {what} | {shown} | {value} {unit} ({metric}) | {predicted:.2f} {unit} ({label}{extra}) | {verdict} "
            f"| {source} |")


def peft_row(name, what, lora, published) -> str:
    from mlsysim_core.scenario import Scenario
    values = {"model": "meta-llama/llama-3.2-3b", "hardware": "h100", "batch_size": 4, "seq_len": 768,
              "precision": "bf16", "optimizer": "adamw", "activation_checkpointing": "none", "profile": "measured",
              "regime": "bf16", "attention": "sdpa", **({"lora": lora} if lora else {})}
    result = Scenario.from_dict(values, where="PEFT method comparison").solve()
    predicted = (result.total_memory - _context_bytes(result)) / 2**30
    value = published / 2**30
    error = (predicted - value) / value * 100
    return (f"| {what} | PEFT's `{name}` as a Scenario (not a launch file): bf16, batch 4, seq 768, no checkpointing, "
            f"AdamW | {value:.2f} GiB (max_memory_reserved, whole run incl. evaluation) | {predicted:.2f} GiB (total "
            f"less the CUDA context) | {error:+.1f} % (not like-for-like: data-dependent lengths up to 768, the max "
            f"spans evaluation) | {PEFT}/{name} |")


def _short(value) -> str:
    text = repr(value)
    return f"`{text if len(text) <= 60 else text[:57] + '...'}`"


def table() -> str:
    lines = ["| run | config | published | predicted (measured profile) | error | source |", "|---|---|---|---|---|---|"]
    lines += [row(*spec) for spec in ROWS]
    lines += [peft_row(*spec) for spec in PEFT_ROWS]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = table()
    if "--check" in argv:
        doc = DOC.read_text()
        current = doc.split(BEGIN)[1].split(END)[0].strip() if BEGIN in doc else ""
        if current != text:
            print(f"{DOC} differs from this tool's table: run python tools/launch_validation_hf.py --write",
                  file=sys.stderr)
            return 1
        return 0
    if "--write" in argv:
        head, rest = DOC.read_text().split(BEGIN)
        _, tail = rest.split(END)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
        return 0
    print(text)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
