"""What the launch-format readers share (docs/launch.md, "Writing a launch-format reader").

``flatten`` gives a nested document's dotted keys; ``catalog_model`` resolves a model name or
Hugging Face id through the catalog (or refuses naming the key); ``sequence`` applies the
data-dependent length rule; ``regime_of`` maps a dtype name to the measured profile's regime;
``refuse_unknown`` refuses a key the reader does not know. ``Reading`` collects a reading.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.scenario import LaunchDefault, LaunchField, LaunchReading


def flatten(document: Any, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists and scalars are leaves; an empty table is a leaf."""
    if not isinstance(document, dict) or (not document and prefix):
        return {prefix: document}
    out: dict[str, Any] = {}
    for key, value in document.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, name))
        else:
            out[name] = value
    return out


class Reading:
    """A reading being built: ``set`` (a key read), ``approx`` (read, approximated), ``default``
    (an implicit default), ``ignore`` (no effect on memory), ``note``; ``done`` makes the
    `LaunchReading`."""

    def __init__(self, format: str, path, version: str):
        self.format, self.path, self.version = format, str(path), version
        self.fields: list[LaunchField] = []
        self.defaults: list[LaunchDefault] = []
        self.ignored: list[str] = []
        self.notes: list[str] = []
        self.world: dict[str, tuple[str, Any]] = {}

    def set(self, key: str, value, field: str, becomes, note: str = "") -> None:
        self.fields.append(LaunchField(key=key, value=value, field=field, becomes=becomes, note=note))

    def approx(self, key: str, value, field: str, becomes, note: str) -> None:
        self.fields.append(LaunchField(key=key, value=value, field=field, becomes=becomes, note=note,
                                       approximated=True))

    def default(self, key: str, field: str, value, source: str, note: str = "") -> None:
        self.defaults.append(LaunchDefault(key=key, field=field, value=value, version=self.version,
                                           source=source, note=note))

    def ignore(self, key: str) -> None:
        if key not in self.ignored:
            self.ignored.append(key)

    def note(self, text: str) -> None:
        self.notes.append(text)

    def values_of(self, field: str):
        """The value a field has so far (a key read, else a default; None: neither)."""
        for f in reversed(self.fields):
            if f.field == field:
                return f.becomes
        return next((d.value for d in self.defaults if d.field == field), None)

    def has(self, field: str) -> bool:
        return any(f.field == field for f in self.fields)

    def done(self) -> LaunchReading:
        return LaunchReading(format=self.format, path=self.path, fields=self.fields, defaults=self.defaults,
                             ignored=self.ignored, world=self.world, framework_version=self.version,
                             notes=self.notes)


def refuse_unknown(path, key: str, value, known: str) -> None:
    """An unknown key: refused, never dropped."""
    raise InvalidInputError(key, value, f"a key this reader knows ({known})",
                            f"{path}: {key} is not a key this reader knows; it is refused rather than dropped, as it "
                            "may change memory")


def not_modelled(path, key: str, value, allowed: str, why: str = "") -> NotModelledError:
    return NotModelledError(key, value, allowed, f"{path}: {why}" if why else str(path))


# Hugging Face repository suffixes that name a variant of the same architecture (same bytes).
_VARIANTS = re.compile(r"[-_](instruct|chat|it|base|hf|sft|dpo)$", re.I)


def catalog_model(name: str, key: str, path, *, context=None) -> tuple[str, str]:
    """``(catalog name, note)`` of a model name or Hugging Face id; an instruct/chat variant is its
    base model's architecture (said in the note). A local ``config.json`` (or its folder) is kept
    as a path. Unknown: an error naming ``key``. With ``-m`` (``context.model``), that model."""
    from mlsysim_core.catalog import find_model
    if context is not None and getattr(context, "model", None) is not None:
        return context.model, f"-m {context.model} replaces {name}"
    if not isinstance(name, str) or not name.strip():
        raise InvalidInputError(key, name, "a model name: a catalog name or Hugging Face id", str(path))
    candidate = Path(name).expanduser()
    if not candidate.is_absolute():
        candidate = Path(path).parent / candidate
    if candidate.is_file() and candidate.name.endswith(".json"):
        return str(candidate), "a local Hugging Face config.json"
    if (candidate / "config.json").is_file():
        return str(candidate / "config.json"), "a local Hugging Face checkpoint's config.json"
    tried, current, note = [], name.strip(), ""
    while True:
        tried.append(current)
        try:
            entry = find_model(current)
            return entry.names[0], note
        except InvalidInputError:
            pass
        stripped = _VARIANTS.sub("", current)
        if stripped == current:
            break
        note = f"{name} has the architecture of {stripped} (a fine-tuned variant: the same bytes)"
        current = stripped
    raise InvalidInputError(key, name, "a model in the catalog (mlsysim-core models), a Hugging Face id of one, "
                            "or a local config.json; or give -m", f"{path}: not found (tried {', '.join(tried)})")


def sequence(reading: Reading, key: str, value, *, packed: bool, context, packed_key: str = "") -> None:
    """The sequence length: packed -> the fixed packed length; otherwise the memory depends on
    the longest batch: ``--seq-len`` if given, else the config's maximum ``value`` (said)."""
    if packed:
        reading.set(key, value, "seq_len", value, f"packed ({packed_key}): every sequence is {value} tokens")
        return
    if context is not None and context.seq_len is not None:
        reading.set(key, value, "seq_len", context.seq_len,
                    f"not packed: the longest batch decides; --seq-len {context.seq_len} taken"
                    + (f" (the config's maximum is {value})" if value is not None else ""))
        return
    if value is None:
        raise InvalidInputError("--seq-len", None, "a sequence length (the longest batch's): the file gives no "
                                f"maximum ({key} is not set) and no packing",
                                f"{reading.path}: without packing the memory depends on the longest batch")
    reading.set(key, value, "seq_len", value, "not packed: the longest batch decides; the config's maximum taken "
                "(an upper bound; --seq-len gives another)")


_REGIMES = {"bf16": "bf16", "bfloat16": "bf16", "torch.bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
            "half": "fp16", "torch.float16": "fp16", "fp32": "fp32", "float32": "fp32", "float": "fp32",
            "torch.float32": "fp32", "32": "fp32", "32-true": "fp32", "bf16-true": "bf16", "16-true": "fp16",
            "bf16-mixed": "amp-bf16", "16-mixed": "amp-fp16", "transformer-engine": None}


def regime_of(dtype, key: str, path) -> str:
    """The measured profile's regime of a dtype name (pure ``bf16``; ``bf16-mixed`` autocast ...)."""
    regime = _REGIMES.get(str(dtype).strip().lower())
    if regime is None:
        raise NotModelledError(key, dtype, f"one of {', '.join(k for k, v in _REGIMES.items() if v)}",
                               f"{path}: a dtype the measured profile's regimes do not describe")
    return regime


PRECISION_OF_REGIME = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "amp-bf16": "bf16", "amp-fp16": "fp16",
                       "fsdp-bf16": "bf16", "fsdp-bf16-reduce-bf16": "bf16", "mixed-bf16": "bf16"}


def as_bool(value, key: str, path) -> bool:
    """A YAML/override boolean (true/false, True/False strings)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if value is None:
        return False
    raise InvalidInputError(key, value, "true or false", str(path))


def as_int(value, key: str, path, minimum: int = 1) -> int:
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    if type(value) is float and value.is_integer():
        value = int(value)
    if type(value) is not int or value < minimum:
        raise InvalidInputError(key, value, f"a whole number >= {minimum}", str(path))
    return value


def sink_kernel(context=None) -> str | None:
    """The name of the registered measured attention kernel that declares torch's flex_attention
    (``computes="flex"``) with learnable sinks applied through its log-sum-exp (``sinks="lse"``), asked
    of each kernel's declaration, never its name (the built-in ``flex_attention``); None if none is
    registered. ``context``'s registry, else the installed plugins'."""
    from ..measured.kernels import COMPUTES_FLEX, SINKS_THROUGH_LSE
    registry = getattr(context, "registry", None)
    if registry is None:
        from mlsysim_core.manager import get_plugin_manager
        registry = get_plugin_manager().registry
    for name, kernel in (registry.extensions.get("mlsysim_measured_attention_kernels") or {}).items():
        if getattr(kernel, "computes", None) == COMPUTES_FLEX and getattr(kernel, "sinks", None) == SINKS_THROUGH_LSE:
            return name
    return None


def declares_sinks(model) -> bool:
    """Does ``model`` (a reading's model: a catalog name, a local config.json path or its fields) declare
    learnable attention sinks (its catalog details' ``attention_sinks``, from config.json: gpt-oss)? Unknown: False."""
    import json
    from mlsysim_core.errors import MlsysimError
    try:
        if isinstance(model, (str, Path)) and str(model).endswith(".json") and Path(str(model)).is_file():
            model = json.loads(Path(str(model)).read_text())
        if isinstance(model, dict):
            from mlsysim_core.hf import from_hf_config
            workload = from_hf_config(model)
        elif isinstance(model, str):
            from mlsysim_core.catalog import find_model
            workload = find_model(model).value
        else:
            workload = model
    except (MlsysimError, OSError, ValueError):
        return False
    details = getattr(workload, "details", None)
    return bool(isinstance(details, dict) and details.get("attention_sinks"))
