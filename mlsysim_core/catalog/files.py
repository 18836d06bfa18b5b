"""The model and hardware file readers: a dict read from a JSON file (the CLI's ``--model``
and ``--hardware``, a scenario's model or hardware) turned into a workload or a ``HardwareNode``,
every problem an ``InvalidInputError`` naming ``model.<field>`` or ``hardware.<field>``; and the
helpers of every reader of JSON a user writes (scenarios, a result's JSON read back by ``render``)."""

from __future__ import annotations

import json

import attrs

from ..errors import InvalidInputError
from ..types import HardwareNode
from . import _MODEL_KINDS


def _require(ok, parameter: str, value, allowed: str, detail: str = "") -> None:
    if not ok:
        raise InvalidInputError(parameter, value, allowed, detail)


def parse_json(text, parameter: str, where: str | None = None):
    """``json.loads(text)``, malformed or too deeply nested JSON an ``InvalidInputError`` naming
    ``parameter`` (its value shown as ``where``, e.g. the file's path)."""
    try:
        return json.loads(text)
    except ValueError as err:   # malformed JSON, bytes that are not UTF-8, a number too long to read
        raise InvalidInputError(parameter, where if where is not None else _shown(text), "valid JSON",
                                str(err)) from None
    except RecursionError:
        raise InvalidInputError(parameter, where if where is not None else "(nested too deeply)",
                                "JSON nested less deeply", "nested too deeply to read") from None


def _shown(value):
    """A value for an error message: long strings cut short."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > 80:
        return value[:80] + (b"..." if not isinstance(value, str) else "...")
    return value


# Keys of a Hugging Face config.json that no model file has: such a dict without
# ``model_type`` is an HF config missing its family, not a model file with odd fields.
_HF_KEYS = frozenset(("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "intermediate_size", "architectures", "n_embd", "n_layer", "n_head", "torch_dtype",
                      "max_position_embeddings", "rms_norm_eps", "num_local_experts", "num_experts_per_tok"))


def structure_model(data: dict):
    """A model from a dict (a JSON file), ``kind`` picking dense or sparse; every problem an
    ``InvalidInputError`` naming ``model.<field>`` (a HF config.json without ``model_type`` is told so)."""
    data = dict(_json_object(data, "model", "TransformerWorkload"))
    kind = data.pop("kind", "sparse_transformer" if "experts" in data else "transformer")
    cls = _MODEL_KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise InvalidInputError("model.kind", _shown(kind), "'transformer' or 'sparse_transformer'")
    if "model_type" not in data and _HF_KEYS.intersection(data):
        from ..hf import SUPPORTED_MODEL_TYPES
        raise InvalidInputError(
            "config.model_type", None, f"one of {', '.join(SUPPORTED_MODEL_TYPES)}",
            f"this looks like a Hugging Face config.json ({', '.join(sorted(_HF_KEYS.intersection(data))[:3])}, "
            "...) without model_type, which names its family: add it (as in the model's config.json), "
            f"or write the model with the fields of {cls.__name__}")
    required = ", ".join(f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING)
    return _structure_fields(cls, data, "model", f"a value: a {kind} model needs {required}")


# Fields of a hardware file that may be written with a unit (catalog.units): sizes in
# bytes ("80GB", "24 GiB") and bandwidths in bytes per second ("3.35TB/s"). Numbers are bytes.
SIZE_FIELDS = ("memory_capacity", "host_memory")
BANDWIDTH_FIELDS = ("memory_bandwidth", "intra_node_bandwidth", "inter_node_bandwidth")


def structure_hardware(data: dict):
    """A ``HardwareNode`` from a dict, checked like ``structure_model`` (``hardware.<field>``);
    a size or bandwidth may be a string with a unit (``"memory_capacity": "24GiB"``)."""
    from .units import parse_bandwidth, parse_bytes
    data = dict(_json_object(data, "hardware", "HardwareNode"))
    for fields, parse in ((SIZE_FIELDS, parse_bytes), (BANDWIDTH_FIELDS, parse_bandwidth)):
        for name in fields:
            if isinstance(data.get(name), str):
                data[name] = parse(data[name], f"hardware.{name}")
    return _structure_fields(HardwareNode, data, "hardware",
                             "a value: a hardware file needs name and memory_capacity (bytes, or a size such as "
                             "'80GB' or '24GiB')")


def _json_object(data, parameter: str, cls_name: str) -> dict:
    if not isinstance(data, dict):
        raise InvalidInputError(parameter, _shown(data), f"a JSON object of {cls_name} fields",
                                f"got {type(data).__name__}")
    return data


def _structure_fields(cls, data: dict, prefix: str, needs: str):
    """``cls(**data)``, every problem an ``InvalidInputError`` naming ``<prefix>.<field>``."""
    fields = attrs.fields(cls)
    extra = sorted(set(data) - {f.name for f in fields}, key=str)
    if extra:
        raise InvalidInputError(f"{prefix}.{extra[0]}", _shown(data[extra[0]]),
                                f"a field of {cls.__name__}: {', '.join(f.name for f in fields)}",
                                f"unknown field(s) {', '.join(map(str, extra))}")
    for f in fields:
        _require(f.default is not attrs.NOTHING or f.name in data, f"{prefix}.{f.name}", None, needs,
                 "required field missing")
    try:
        return cls(**data)
    except InvalidInputError as err:     # name the file's field
        raise InvalidInputError(f"{prefix}.{err.parameter.rpartition('.')[2]}", err.value, err.allowed,
                                err.detail) from err
