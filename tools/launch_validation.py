"""The launch readers against the memory the frameworks published for their own configs (issue 26).

    python tools/launch_validation.py            # the markdown table docs/launch.md records

Each row reads a real config (tests/data/launch/...) with the overrides the published run used,
solves it under the measured profile, and compares like with like: allocated (or active, which
PyTorch counts from the same blocks) against the prediction without runtime overheads
(``allocated_memory``: what ``torch.cuda.max_memory_allocated`` counts); reserved against the
total. A run the profile cannot describe is listed with the field that switches it on.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "launch"

TT = "pytorch/torchtune v0.6.1 README.md"
TT_E2E = "pytorch/torchtune v0.6.1 docs/source/tutorials/e2e_flow.rst"
INIT = "allocated after model init"     # torchtune's "Memory stats after model init": the weights and buffers
TT_PACKED = ["dataset.packed=True", "batch_size=2", "gradient_accumulation_steps=1", "compile=True"]
LIT = "Lightning-AI/litgpt 26857050 config_hub/finetune/README.md"
TITAN = "pytorch/torchtitan b5bcd76c benchmarks/llama3_h100_202412_torchtitan.md"
BRIDGE = "verdimrc/playground-nemo-2.0-gh 6129a1ad 05-byoc-te-mb/with-ngc-pytorch-25.06-cleanup.md"

# The environment a published run had that its config does not carry ("env:NAME=VALUE" among the overrides), as the
# measured profile's setting that prices it: expandable segments -> the caching allocator's mechanism
# (runtime_overheads.allocator='segments', measured/allocator.py; the launch readers keep the fraction, since a
# config file does not say the environment it runs in).
EXPANDABLE = "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
ENV = {EXPANDABLE: {"runtime_overheads": {"allocator": "segments", "expandable_segments": True}}}

# (source and line, what was published, config file, overrides, gpus, hardware, metric, value, unit)
ROWS = [
    (f"{TT}:119", "Llama 3.1 8B full, 1x 4090", "torchtune/llama3_1/8B_full_single_device.yaml",
     [*TT_PACKED, "tokenizer.max_seq_len=2048"], None, "rtx-4090", "peak (unspecified)", 18.9, "GiB"),
    (f"{TT}:121", "Llama 3.1 8B LoRA, 1x 4090", "torchtune/llama3_1/8B_lora_single_device.yaml",
     [*TT_PACKED, "tokenizer.max_seq_len=2048"], None, "rtx-4090", "peak (unspecified)", 16.2, "GiB"),
    (f"{TT}:141", "Llama 3.2 3B baseline (not packed), A100", "torchtune/llama3_2/3B_full_single_device.yaml",
     ["batch_size=2", "tokenizer.max_seq_len=4096", "loss._component_=torch.nn.CrossEntropyLoss",
      "enable_activation_checkpointing=False", "optimizer_in_bwd=False", "optimizer._component_=torch.optim.AdamW"],
     None, "a100", "active", 25.5, "GiB"),
    (f"{TT}:142", "Llama 3.2 3B + packed dataset, A100", "torchtune/llama3_2/3B_full_single_device.yaml",
     ["dataset.packed=True", "batch_size=2", "tokenizer.max_seq_len=4096", "loss._component_=torch.nn.CrossEntropyLoss",
      "enable_activation_checkpointing=False", "optimizer_in_bwd=False", "optimizer._component_=torch.optim.AdamW",
      "gradient_accumulation_steps=1"], None, "a100", "active", 60.0, "GiB"),
    (f"{TT}:143", "Llama 3.2 3B + compile, A100", "torchtune/llama3_2/3B_full_single_device.yaml",
     ["dataset.packed=True", "batch_size=2", "tokenizer.max_seq_len=4096", "loss._component_=torch.nn.CrossEntropyLoss",
      "enable_activation_checkpointing=False", "optimizer_in_bwd=False", "optimizer._component_=torch.optim.AdamW",
      "compile=True"], None, "a100", "active", 51.0, "GiB"),
    (f"{TT}:144", "Llama 3.2 3B + chunked cross-entropy, A100", "torchtune/llama3_2/3B_full_single_device.yaml",
     ["dataset.packed=True", "batch_size=2", "tokenizer.max_seq_len=4096",
      "loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss", "enable_activation_checkpointing=False",
      "optimizer_in_bwd=False", "optimizer._component_=torch.optim.AdamW", "compile=True"], None, "a100", "active",
     42.9, "GiB"),
    # + activation checkpointing: torchtune's order (compile_model, then set_activation_checkpointing); the AdamW
    # implementation is not stated and from this row on the step can set the peak: fused, as torchtune's configs that
    # name torch.optim.AdamW set it (validation/published/torchtune_ladder.py says why)
    (f"{TT}:145", "Llama 3.2 3B + activation checkpointing, A100", "torchtune/llama3_2/3B_full_single_device.yaml",
     ["dataset.packed=True", "batch_size=2", "tokenizer.max_seq_len=4096",
      "loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss", "enable_activation_checkpointing=True",
      "optimizer_in_bwd=False", "optimizer._component_=torch.optim.AdamW", "optimizer.fused=True", "compile=True"],
     None, "a100", "active", 24.9, "GiB"),
    (f"{TT}:146", "Llama 3.2 3B + optimizer step in the backward, A100", "torchtune/llama3_2/3B_full_single_device.yaml",
     ["dataset.packed=True", "batch_size=2", "tokenizer.max_seq_len=4096",
      "loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss", "enable_activation_checkpointing=True",
      "optimizer_in_bwd=True", "optimizer._component_=torch.optim.AdamW", "optimizer.fused=True", "compile=True"],
     None, "a100", "active", 23.1, "GiB"),
    # The ladder adds each technique on top of the previous one (LoRA without optimizer_in_bwd and 8-bit AdamW): the
    # README's command for its last rows (README.md:156-170) sets activation offloading and no accumulation too
    (f"{TT}:149", "Llama 3.2 3B LoRA (README's command), A100", "torchtune/llama3_2/3B_lora_single_device.yaml",
     ["dataset.packed=True", "compile=True", "loss._component_=torchtune.modules.loss.CEWithChunkedOutputLoss",
      "enable_activation_checkpointing=True", "optimizer_in_bwd=False", "enable_activation_offloading=True",
      "optimizer._component_=torch.optim.AdamW", "tokenizer.max_seq_len=4096", "gradient_accumulation_steps=1",
      "epochs=1", "batch_size=2"], None, "a100", "active", 8.5, "GiB"),
    (f"{LIT}:46", "llama-3.2-1b full, 1x A10G", "litgpt/finetune/llama-3.2-1B/full.yaml", [], None, "a10g",
     "allocated", 8.70, "GB"),
    (f"{LIT}:51", "llama-3.2-3b full, 1x A10G", "litgpt/finetune/llama-3.2-3B/full.yaml", [], None, "a10g",
     "allocated", 16.51, "GB"),
    (f"{LIT}:66", "Phi-3-mini full, 1x A10G", "litgpt/finetune/phi-3/full.yaml", [], None, "a10g", "allocated",
     17.01, "GB"),
    (f"{LIT}:47", "llama-3.2-1b LoRA, 1x A10G", "litgpt/finetune/llama-3.2-1B/lora.yaml", [], None, "a10g",
     "allocated", 4.49, "GB"),
    (f"{LIT}:52", "llama-3.2-3b QLoRA, 1x A10G", "litgpt/finetune/llama-3.2-3B/qlora.yaml", [], None, "a10g",
     "allocated", 10.30, "GB"),
    (f"{LIT}:33", "llama-3-8b full, 4x A10G", "litgpt/finetune/llama-3-8b/full.yaml", [], None, "a10g", "OOM",
     None, ""),
    (f"{LIT}:38", "llama-3.1-8b full (README: 1x A10G; the config: devices 4)", "litgpt/finetune/llama-3.1-8b/full.yaml",
     [], None, "a10g", "OOM", None, ""),
    (f"{TT}:123", "Llama 3.1 8B QLoRA, 1x 4090", "torchtune/llama3_1/8B_qlora_single_device.yaml",
     [*TT_PACKED, "tokenizer.max_seq_len=2048"], None, "rtx-4090", "peak (unspecified)", 7.4, "GiB"),
    (f"{LIT}:27", "llama-2-7b full, 4x A10G", "litgpt/finetune/llama-2-7b/full.yaml", [], None, "a10g", "OOM",
     None, ""),
    # The README's 8x A100 rows (lines 117-126: batch 2, no accumulation, packed to 2048, compile on), read from the
    # configs the README's table names (recipes/configs/llama3_1/70B_lora.yaml, 405B_qlora.yaml: FSDP2 over 8 GPUs,
    # full checkpointing, fused AdamW, the chunked loss); "44.8 GB" as printed.
    (f"{TT}:125", "Llama 3.1 70B LoRA, 8x A100", "torchtune/llama3_1/70B_lora.yaml",
     [*TT_PACKED, "tokenizer.max_seq_len=2048"], 8, "a100", "peak (unspecified)", 27.6, "GiB"),
    (f"{TT}:126", "Llama 3.1 405B QLoRA, 8x A100", "torchtune/llama3_1/405B_qlora.yaml",
     [*TT_PACKED, "tokenizer.max_seq_len=2048"], 8, "a100", "peak (unspecified)", 44.8, "GB"),
    # not like-for-like: the same run with compile off (eager NF4: get_original_weight's int64 codes, which compile fuses)
    (f"{TT}:126", "Llama 3.1 405B QLoRA, 8x A100, compile off (not like-for-like)", "torchtune/llama3_1/405B_qlora.yaml",
     [*TT_PACKED[:-1], "compile=False", "tokenizer.max_seq_len=2048"], 8, "a100", "peak (unspecified)", 44.8, "GB"),
    # torchtune's end-to-end tutorial logs the recipe's "Memory stats after model init" (GPU peak memory allocation)
    # for its default LoRA config: the model's parameters and buffers, before any batch (its length does not
    # matter: 2048 given since the file sets no maximum), compared with the prediction's weights.
    (f"{TT_E2E}:116", "Llama 3.2 3B LoRA, after model init", "torchtune/llama3_2/3B_lora_single_device.yaml", [],
     None, "rtx-4090", INIT, 6.21, "GiB"),
    # torchtitan's Table 1 "FSDP" row (no compile, no float8): Llama 3.1 8B, 8 GPUs, local batch 2, selective
    # (per-op) AC; run at torchtitan 9dec370 with train_configs/llama3_8b.toml (batch_size 1 there, 2 in the
    # table; its keys renamed in v0.2: training.batch_size -> training.local_batch_size). Its "Memory(GiB)" is
    # torchtitan's logged max_reserved_gib: reserved, against the total less the CUDA context.
    (f"{TITAN}:27", "Llama 3.1 8B FSDP (no compile), 8x H100 (96 GB)", "torchtitan/llama3/llama3_8b.toml",
     ["training.local_batch_size=2"], 8, "h100", "reserved", 82.4, "GiB"),
    # The same run with the environment it had: torchtitan 9dec370's run_llama_train.sh exports
    # PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True" (validation/published/torchtitan_llama3_8b.py), which the
    # TOML does not carry: given here as the run's environment (ENV below).
    (f"{TITAN}:27", "Llama 3.1 8B FSDP (no compile), 8x H100 (96 GB), the launcher's allocator setting",
     "torchtitan/llama3/llama3_8b.toml", ["training.local_batch_size=2", f"env:{EXPANDABLE}"], 8, "h100",
     "reserved", 82.4, "GiB"),
    # Megatron-Bridge's llama32_1b_pretrain_config (seq 1024, tp 1, dp 8) on 8 H100 80GB: the resolved
    # ConfigContainer its log prints, and its report_memory line after 10 iterations ("MB" is MiB:
    # torch.cuda.max_memory_allocated() / 2**20; tests/data/launch/megatron_bridge/SOURCE.md).
    (f"{BRIDGE}:1330", "Llama 3.2 1B pretrain (Megatron-Bridge), 8x H100", "megatron_bridge/llama32_1b_pretrain_h100x8.yaml",
     [], 8, "h100", "allocated", 12003.60400390625, "MiB"),
    (f"{BRIDGE}:1330", "Llama 3.2 1B pretrain (Megatron-Bridge), 8x H100", "megatron_bridge/llama32_1b_pretrain_h100x8.yaml",
     [], 8, "h100", "reserved", 12232.0, "MiB"),
]


def row(source, what, file, overrides, gpus, hardware, metric, value, unit) -> str:
    from mlsysim_core.errors import MlsysimError
    from mlsysim_core.scenario import from_launch
    import attrs
    path = DATA / file
    environment = [item[4:] for item in overrides if item.startswith("env:")]
    given = overrides
    overrides = [item for item in overrides if not item.startswith("env:")]
    if path.suffix == ".toml" and overrides:     # torchtitan takes no key=value overrides: the same TOML, edited,
        import json                              # read as the JSON --job.save_config_file would write
        import tempfile
        import tomllib
        document = tomllib.loads(path.read_text())
        for item in overrides:
            key, _, text = item.partition("=")
            *parents, last = key.split(".")
            table = document
            for name in parents:
                table = table.setdefault(name, {})
            table[last] = int(text) if text.lstrip("-").isdigit() else text
        edited = Path(tempfile.mkdtemp()) / (path.stem + ".json")
        edited.write_text(json.dumps(document))
        path, overrides_given = edited, []
    else:
        overrides_given = overrides
    launch = None
    try:
        launch = from_launch([path], gpus=gpus, hardware=hardware, overrides=overrides_given,
                             seq_len=2048 if metric == INIT else None)
        scenario = launch.scenario
        if environment:
            from mlsysim_core.scenario import Scenario
            document = scenario.to_dict()
            for item in environment:
                document.update(ENV[item])
            scenario = Scenario.from_dict(document)
        result = scenario.solve()
    except MlsysimError as err:
        field = getattr(err, "parameter", "?")
        # a profile's refusal names a scenario field: the file's key it came from said beside it
        key = launch.sources.get(str(field).split(".")[0]) if launch is not None else None
        key = f" (from {key.split(': ', 1)[1]})" if key and ": " in key and not key.startswith("default") else ""
        return (f"| {what} | `{file}` {' '.join(overrides) or ''} | {value or 'OOM'} {unit} ({metric}) | refused: "
                f"`{field}`={getattr(err, 'value', '')!r}{key} | - | {source} |")
    scale = {"GiB": 2**30, "MiB": 2**20}.get(unit, 1e9)
    if metric == "OOM":
        fits = "fits" if result.feasible else "does not fit"
        return (f"| {what} | `{file}` | OOM | {result.total_memory / 2**30:.2f} GiB total: {fits} in "
                f"{result.hardware} | {'agrees' if not result.feasible else 'disagrees'} | {source} |")
    unexpressed = "not packed" in " ".join(f.note for r in launch.readings for f in r.fields if f.field == "seq_len")
    if metric == INIT:       # before any batch: the weights (parameters and buffers), whatever the data
        predicted, label, unexpressed = result.weights / scale, "weights: parameters and buffers", False
    elif metric in ("allocated", "active") or metric.startswith("peak"):
        # torchtune's README "Peak Memory" does not say which counter; its recipes log the caching allocator's
        # (training/memory.py get_memory_stats: active, allocated, reserved) and the same table's ladder rows name
        # "active": the allocator's counters, the CUDA context and the reserve excluded, are compared
        predicted = result.allocated_memory / scale
        label = "allocated"
    elif metric == "reserved":       # reserved: the total less the CUDA context (not PyTorch's)
        context = sum(t.nbytes for t in result.terms if t.component == "runtime_overheads" and t.label == "CUDA context")
        predicted = (result.total_memory - context) / scale
        label = "total less the CUDA context"
    else:
        predicted = result.total_memory / scale
        label = "total"
    del attrs
    if unexpressed:     # the longest batch is the data's: no like-with-like comparison
        return (f"| {what} | `{file}` {' '.join(overrides)} | {value} {unit} ({metric}) | {predicted:.2f} {unit} "
                f"({label}) at the config's maximum length | not comparable: not packed, the peak is the longest "
                f"batch of the data | {source} |")
    error = (predicted - value) / value * 100
    return (f"| {what} | `{file}` {' '.join(given)} | {value} {unit} ({metric}) | {predicted:.2f} {unit} "
            f"({label}) | {error:+.1f} % | {source} |")


def main() -> int:
    print("| run | config and overrides | published | predicted (measured profile) | error | source |")
    print("|---|---|---|---|---|---|")
    for spec in ROWS:
        print(row(*spec))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
