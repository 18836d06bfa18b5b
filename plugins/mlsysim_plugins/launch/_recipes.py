"""What the LLaMA-Factory and axolotl readers share (docs/launch-hf.md): the model a recipe names
resolved through the catalog (mirrors and fine-tuned variants of a catalog model said in a
note), a field read with ``yields`` (another file's value wins without a contradiction), and
the LoRA dropout note.
"""

from __future__ import annotations

import re

from mlsysim_core.errors import InvalidInputError
from mlsysim_core.scenario import LaunchField

from ._hf import Reading

# Suffixes of a Hugging Face repository name that name the same architecture (the same bytes):
# instruction/chat tunes, a release date (Qwen's -2507, Mistral's -2410), a re-upload's dtype.
_SUFFIX = re.compile(r"[-_](instruct|chat|it|base|hf|sft|dpo|fp16|bf16|\d{4})$", re.I)
# Pre-quantized checkpoints: the weights are stored quantized by a method the tool does not model.
_PREQUANTIZED = re.compile(r"(gptq|awq|aqlm|exl2|hqq|eetq|gguf|bnb-4bit|fp8)", re.I)


def weak(r: Reading, key, value, field, becomes, note=""):
    """A key read whose value gives way to another file's (a DeepSpeed/FSDP/accelerate config)."""
    r.seen.add(key)
    r.fields.append(LaunchField(key=key, value=value, field=field, becomes=becomes, note=note, yields=True))


def model(r: Reading, key, value, context=None):
    """The catalog name of a Hugging Face id: as given; else the repository's name under any
    organisation (a mirror: NousResearch/Meta-Llama-3-8B is meta-llama's); else without a
    variant suffix (Instruct, a date, a dtype), said. A local folder's config.json is taken as
    is. Neither: refused naming the key, saying that ``-m`` decides (with ``-m``, its model)."""
    r.seen.add(key)
    if context is not None and getattr(context, "model", None) is not None:
        r.notes.append(f"{key}={value!r}: -m {context.model} replaces it")
        return context.model
    if not isinstance(value, str) or not value.strip():
        raise InvalidInputError(f"{r.path}: {key}", value, "a Hugging Face model id or a catalog model name")
    if _PREQUANTIZED.search(value.split("/")[-1]):
        r.refuse(key, value, "a model in bf16/fp16/fp32 (on-the-fly bitsandbytes quantization is modelled: "
                 "quantization_bit / load_in_4bit)", "a pre-quantized checkpoint (GPTQ, AWQ, ...): its storage and "
                 "dequantization kernels are not modelled")
    local = r.path.parent / value
    for candidate in (local / "config.json", local):
        if candidate.is_file() and candidate.name.endswith(".json"):
            r.set(key, value, "model", str(candidate), "a local Hugging Face config.json")
            return str(candidate)
    from mlsysim_core.catalog import find_model
    tried = []
    current, steps = value.strip(), []
    names = [current] + ([current.split("/", 1)[1]] if "/" in current else [])
    for name in names:
        current = name
        while True:
            tried.append(current)
            try:
                entry = find_model(current)
            except Exception:
                entry = None
            if entry is not None:
                note = ""
                if current != value:
                    note = f"{value} resolved as {entry.key} (tried {', '.join(tried)}): " + (
                        "a mirror or fine-tuned variant of the same architecture (the same bytes)")
                r.set(key, value, "model", entry.key, note)
                return entry.key
            stripped = _SUFFIX.sub("", current)
            if stripped == current:
                break
            steps.append(stripped)
            current = stripped
    raise InvalidInputError(f"{r.path}: {key}", value, "a model in the catalog (mlsysim-core models), a Hugging Face "
                            "id of one, or a local config.json; or give -m (a catalog name or the model's config.json)",
                            f"not found (tried {', '.join(tried)}): -m decides the model")


def lora_dropout(r: Reading, key, value):
    """peft's dropout on the adapters' input (the measured profile's ``lora.dropout``: a mask and a
    dropped copy of each adapted linear's input)."""
    try:
        p = float(value or 0)
    except (TypeError, ValueError):
        raise InvalidInputError(f"{r.path}: {key}", value, "a probability") from None
    if p > 0:
        r.set(key, value, "lora", {"dropout": p}, "peft's lora_dropout: a dropout mask and a dropped copy of each "
              "adapted linear's input")
    else:
        r.ignore(key)
