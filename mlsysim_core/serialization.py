"""All cattrs use lives here (imported lazily: cattrs is not needed to solve)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import cattrs
from cattrs.preconf.json import make_converter

from .errors import InvalidInputError, InvalidInputTypeError

_converter = make_converter(forbid_extra_keys=True)

# The version of every JSON document this package writes (results, `estimate --json`,
# `fit --json`, `search --json`, the catalog and plugin listings). Bumped when a key
# changes meaning or goes away; new keys do not bump it.
SCHEMA_VERSION = 1
# Keys a result's JSON may carry beside its fields (derived views, and what the CLI adds
# about the run); ``result_from_dict`` drops them.
_NOT_FIELDS = ("units", "gb", "gib", "constraint_trace", "schema_version", "profile_note", "run")


# cattrs' default hooks call int()/float()/bool(): 4.5 would become 4 and "yes" True.
# Options are user input, so they are checked strictly, like every solve argument.
def _strict_int(value, _type):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _strict_float(value, _type):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return float(value)


def _strict_bool(value, _type):
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, got {value!r}")
    return value


def _strict_str(value, _type):
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


for _type, _hook in ((int, _strict_int), (float, _strict_float), (bool, _strict_bool), (str, _strict_str)):
    _converter.register_structure_hook(_type, _hook)


def _format_exception(exc: BaseException, type_) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    return str(exc) or type(exc).__name__


def unstructure_result(result) -> dict:
    data = _converter.unstructure(result)
    data["schema_version"] = SCHEMA_VERSION
    data["constraint_trace"] = list(result.constraint_trace)
    data["units"] = {"memory": "bytes", "gb": 1e9, "gib": 2**30}
    data["gb"] = result.gb.as_dict()
    data["gib"] = result.gib.as_dict()
    return data


def result_to_json(result, **kwargs) -> str:
    kwargs.setdefault("sort_keys", True)
    return json.dumps(unstructure_result(result), **kwargs)


def result_from_dict(data: dict):
    """The inverse of ``unstructure_result``: the derived unit views are dropped. Anything
    but such a dict raises ``InvalidInputError`` naming the first bad field."""
    from .result import TrainingMemoryResult
    if not isinstance(data, dict):
        raise InvalidInputTypeError("result", _shown(data), "a JSON object written by TrainingMemoryResult.to_json",
                                    f"got {type(data).__name__}")
    if "schema_version" in data:
        version = data["schema_version"]
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidInputTypeError("result.schema_version", _shown(version),
                                        f"an integer in [1, {SCHEMA_VERSION}] (this package writes {SCHEMA_VERSION})",
                                        f"got {type(version).__name__}")
        if not 1 <= version <= SCHEMA_VERSION:
            raise InvalidInputError("result.schema_version", version,
                                    f"an integer in [1, {SCHEMA_VERSION}] (this package writes {SCHEMA_VERSION})",
                                    "written by a newer mlsysim-core" if version > SCHEMA_VERSION else "")
    versioned = "schema_version" in data
    data = {k: v for k, v in data.items() if k not in _NOT_FIELDS}
    _check_present(data, versioned)
    try:
        result = _converter.structure(data, TrainingMemoryResult)
    except RecursionError as err:
        raise InvalidInputError("result", "(nested too deeply)", "a result written by TrainingMemoryResult.to_json",
                                "nested too deeply") from err
    except Exception as err:    # cattrs groups the field errors
        messages = (cattrs.transform_error(err, path="result", format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err) or type(err).__name__])
        parameter, value = _error_path(messages, data)
        if parameter is None:
            field = _first_field(err)
            parameter = f"result.{field}" if field else "result"
            value = _shown(data.get(field)) if field else "(a JSON object)"
        raise InvalidInputError(parameter, value, "a result written by TrainingMemoryResult.to_json",
                                "; ".join(messages[:3]) + (f"; and {len(messages) - 3} more" if len(messages) > 3
                                                           else "")) from err
    _check_result(result)
    return result


def _check_present(data: dict, versioned: bool) -> None:
    """Fields ``to_json`` always writes must be there: every field of each rank, and, in a
    document with a ``schema_version``, every field of the result (an older file without
    one may leave out the fields that have defaults)."""
    from .result import RankReport, TrainingMemoryResult
    if versioned:
        for field in attrs.fields(TrainingMemoryResult):
            if field.name not in data:
                raise InvalidInputError(f"result.{field.name}", None, "present in a result written by "
                                        "TrainingMemoryResult.to_json", "required field missing")
    ranks = data.get("ranks")
    if isinstance(ranks, (list, tuple)):
        for i, rank in enumerate(ranks):
            if isinstance(rank, dict):
                for field in attrs.fields(RankReport):
                    if field.name not in rank:
                        raise InvalidInputError(f"result.ranks[{i}].{field.name}", None,
                                                "present in a rank written by TrainingMemoryResult.to_json",
                                                "required field missing")


_PATH_STEP = None     # compiled on first use: re is not needed to solve


def _error_path(messages, data):
    """The input a cattrs error is about, from the path its first message ends with
    (``... @ result.ranks[1].terms[0]``): as a parameter name (``result.ranks[1].terms[0]``,
    ``result.selected.optimizer``) and the value found there."""
    import re
    global _PATH_STEP
    if _PATH_STEP is None:
        _PATH_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\['([^']*)'\]")
    if not messages or " @ " not in messages[0]:
        return None, None
    path = messages[0].rpartition(" @ ")[2]
    if not path.startswith("result"):
        return None, None
    parameter, value = "result", data
    for match in _PATH_STEP.finditer(path, len("result")):
        attr, index, key = match.groups()
        if index is not None:
            step = int(index)
            if not isinstance(value, (list, tuple)) or step >= len(value):
                break           # the container itself is wrong ("x" for a list): name it
            parameter += f"[{index}]"
            value = value[step]
        else:
            if not isinstance(value, dict):
                break
            name = attr if attr is not None else key
            parameter += f".{name}"
            value = value.get(name)
    if parameter == "result":
        return None, None
    return parameter, _shown(value)


_BYTE_FIELDS = ("total_memory", "weights", "gradients", "optimizer_state", "activations",
                "communication_buffers", "runtime_overheads", "host_memory")


def _check_memory(where: str, report, available) -> None:
    """Memory fields finite and >= 0, the total the components' sum, feasible as the total
    says against ``available`` (in GB, as the solver decides): for the result (``where`` is
    ``result``) and for each rank (``result.ranks[i]``)."""
    import math
    for field in _BYTE_FIELDS:
        value = getattr(report, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InvalidInputError(f"{where}.{field}", value, "a finite number of bytes >= 0")
    parts = (report.weights + report.gradients + report.optimizer_state + report.activations
             + report.communication_buffers + report.runtime_overheads)
    if abs(report.total_memory - parts) > 1e-9 * max(abs(parts), 1.0) + 1e-6:
        raise InvalidInputError(f"{where}.total_memory", report.total_memory,
                                f"the sum of the components and runtime overheads, {parts!r}",
                                "a total is what its components add up to")
    fits = report.total_memory * 1e-9 <= available * 1e-9
    if report.feasible is not fits:
        raise InvalidInputError(f"{where}.feasible", report.feasible, f"{fits}, as the totals say",
                                f"total {report.total_memory * 1e-9:.3f} GB against "
                                f"{available * 1e-9:.3f} GB available")


def _check_result(result) -> None:
    """A result read back must be one a solve could give: memory finite and not negative,
    the total its components' sum, feasible as the totals say (in GB, as the solver decides);
    the same for every rank, whose stages, counts and peak phase must be ones a solve writes;
    the selection consistent with the result's own fields."""
    import math
    from .terms import PHASES
    for field in ("available_memory", "memory_utilization"):
        value = getattr(result, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InvalidInputError(f"result.{field}", value, "a finite number of bytes >= 0"
                                    if field != "memory_utilization" else "a finite number >= 0")
    if result.available_memory <= 0:
        raise InvalidInputError("result.available_memory", result.available_memory, "a number of bytes > 0")
    _check_memory("result", result, result.available_memory)
    if result.peak_phase is not None and result.peak_phase not in PHASES:
        raise InvalidInputError("result.peak_phase", result.peak_phase, f"None or one of {', '.join(PHASES)}")
    for field in ("microbatch", "layers_per_stage"):
        value = getattr(result, field)
        if value < 1:
            raise InvalidInputError(f"result.{field}", value, "an integer >= 1")
    for axis, value in result.parallelism.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInputError(f"result.parallelism.{axis}", value, "an integer >= 1")
    for axis in ("tp", "pp", "dp", "ep"):
        if axis not in result.parallelism:
            raise InvalidInputError(f"result.parallelism.{axis}", None, "present: an integer >= 1",
                                    "required field missing")
    _check_selected(result)
    names = []
    for i, rank in enumerate(result.ranks):
        where = f"result.ranks[{i}]"
        _check_memory(where, rank, result.available_memory)
        if not rank.stages or any(s < 0 for s in rank.stages) or len(set(rank.stages)) != len(rank.stages):
            raise InvalidInputError(f"{where}.stages", list(rank.stages),
                                    "a non-empty list of distinct pipeline stages (0-based)")
        if rank.ranks < 1:
            raise InvalidInputError(f"{where}.ranks", rank.ranks, "an integer >= 1 (devices in this class)")
        if rank.layers < 0:
            raise InvalidInputError(f"{where}.layers", rank.layers, "an integer >= 0")
        if not math.isfinite(rank.in_flight) or rank.in_flight < 0:
            raise InvalidInputError(f"{where}.in_flight", rank.in_flight, "a finite number >= 0")
        if rank.peak_phase is not None and rank.peak_phase not in PHASES:
            raise InvalidInputError(f"{where}.peak_phase", rank.peak_phase, f"None or one of {', '.join(PHASES)}")
        if not rank.terms:
            raise InvalidInputError(f"{where}.terms", [], "the rank's memory terms (a non-empty list)")
        if not rank.name.strip():
            raise InvalidInputError(f"{where}.name", rank.name, "a non-empty string")
        names.append(rank.name)
    if result.ranks:
        if result.heaviest_rank not in names:
            raise InvalidInputError("result.heaviest_rank", result.heaviest_rank,
                                    f"the name of one of the ranks: {', '.join(map(repr, names))}")
        heaviest = result.ranks[names.index(result.heaviest_rank)]
        if abs(heaviest.total_memory - result.total_memory) > 1e-9 * max(result.total_memory, 1.0) + 1e-6:
            raise InvalidInputError("result.total_memory", result.total_memory,
                                    f"the heaviest rank's total, {heaviest.total_memory!r}",
                                    f"the result reports its heaviest rank, {result.heaviest_rank!r}")
    elif result.heaviest_rank is not None:
        raise InvalidInputError("result.heaviest_rank", result.heaviest_rank, "None for a result without ranks")
    utilization = result.total_memory * 1e-9 / (result.available_memory * 1e-9)
    if abs(result.memory_utilization - utilization) > 1e-9 * max(utilization, 1.0):
        raise InvalidInputError("result.memory_utilization", result.memory_utilization,
                                f"total / available = {utilization!r}")


_SELECTED_OWN = ("profile", "optimizer", "activation_checkpointing")
_SELECTED_RULES = ("tp_rule", "pp_rule", "dp_rule", "ep_rule", "cp_rule")


def _check_selected(result) -> None:
    """``selected`` names the profile, optimizer and checkpointing strategy the result names
    in its own fields, and one sharding rule per axis (a rule's name as the registry spells it)."""
    selected = result.selected
    for key in sorted(set(selected) - set(_SELECTED_OWN) - set(_SELECTED_RULES)):
        raise InvalidInputError(f"result.selected.{key}", selected[key],
                                f"one of the keys {', '.join(_SELECTED_OWN + _SELECTED_RULES)}", "unknown key")
    for key in _SELECTED_OWN + _SELECTED_RULES:
        if key not in selected:
            raise InvalidInputError(f"result.selected.{key}", None, "present in a result written by "
                                    "TrainingMemoryResult.to_json", "required field missing")
    for key in _SELECTED_OWN:
        if selected[key] != getattr(result, key):
            raise InvalidInputError(f"result.selected.{key}", selected[key],
                                    f"{getattr(result, key)!r}, the result's {key}")
    try:
        from .manager import get_plugin_manager
        registry = get_plugin_manager().registry
        tables = {"profile": registry.profiles, "optimizer": registry.optimizers,
                  "activation_checkpointing": registry.checkpointing,
                  **dict.fromkeys(_SELECTED_RULES, registry.sharding_rules)}
    except Exception:       # no registry here (a broken plugin): the names cannot be checked
        tables = {}
    for key in _SELECTED_OWN + _SELECTED_RULES:
        name, known = selected[key], tables.get(key)
        if not name.strip() or (known is not None and name not in known):
            raise InvalidInputError(f"result.selected.{key}", name,
                                    "a name the installed plugins provide" + (f": one of {', '.join(sorted(known))}"
                                                                              if known is not None else ""),
                                    "a result names the plugins' specs it was solved with")


def result_from_json(text):
    """``TrainingMemoryResult.from_json``: malformed JSON, or JSON that is not a result, raises
    ``InvalidInputError``."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise InvalidInputTypeError("text", _shown(text), "a JSON string written by TrainingMemoryResult.to_json",
                                    f"got {type(text).__name__}")
    return result_from_dict(parse_json(text, "text"))


def parse_json(text, parameter: str, where: str | None = None):
    """``json.loads(text)``, with malformed or too deeply nested JSON an ``InvalidInputError``
    naming ``parameter`` (its value shown as ``where``, e.g. the file's path)."""
    try:
        return json.loads(text)
    except ValueError as err:   # malformed JSON, bytes that are not UTF-8, a number too long to read
        raise InvalidInputError(parameter, where if where is not None else _shown(text), "valid JSON",
                                str(err)) from None
    except RecursionError:
        raise InvalidInputError(parameter, where if where is not None else "(nested too deeply)",
                                "JSON nested less deeply", "nested too deeply to read") from None


def _shown(value):
    """A value for an error message: long strings and containers cut short."""
    if isinstance(value, (str, bytes, bytearray)) and len(value) > 80:
        return value[:80] + (b"..." if not isinstance(value, str) else "...")
    return value


def _first_field(err: BaseException) -> str | None:
    """The first field named in a cattrs validation error, if any."""
    if isinstance(err, cattrs.ClassValidationError):
        with_notes, without = err.group_exceptions()
        for _exc, note in with_notes:
            name = getattr(note, "name", None)
            if name is not None:
                return str(name)
        for exc in without:
            if isinstance(exc, cattrs.ForbiddenExtraKeysError):
                return sorted(exc.extra_fields)[0]
    return None


def structure_options(parameter: str, spec_name: str, options_type: type, value: Any):
    """Turn a plugin's options (an instance or a dict) into its attrs options object."""
    if isinstance(value, options_type):
        return value
    named = parameter == spec_name     # a solve option of its own (lora=, runtime_overheads=)
    if not isinstance(value, dict):
        raise InvalidInputError(parameter if named else f"{parameter}[{spec_name!r}]", value,
                                f"a dict or a {options_type.__name__} instance")
    try:
        return _converter.structure(value, options_type)
    except Exception as err:  # cattrs wraps validator and type errors in groups
        fields = ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}"
                           for f in attrs.fields(options_type))
        if named:
            raise _field_error(parameter, options_type, value, err, fields) from err
        messages = (cattrs.transform_error(err, path=spec_name, format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err)])
        raise InvalidInputError(f"{parameter}[{spec_name!r}]", value,
                                f"fields of {options_type.__name__} ({fields})",
                                "; ".join(messages)) from err


def _field_error(parameter: str, options_type: type, value: dict, err: BaseException,
                 fields: str) -> InvalidInputError:
    """The first bad field of an options dict, named ``parameter.field``: the error a user
    can act on (``lora.rank``, ``runtime_overheads.cuda_context``)."""
    cls = options_type.__name__
    if isinstance(err, cattrs.ClassValidationError):
        with_notes, without = err.group_exceptions()
        if with_notes:            # a type error in one field (the strict structure hooks)
            exc, note = with_notes[0]
            name = getattr(note, "name", None)
            if isinstance(exc, KeyError):
                return InvalidInputError(f"{parameter}.{name}", None, f"a value (fields of {cls}: {fields})",
                                         "required field missing")
            kind = InvalidInputTypeError if isinstance(exc, (ValueError, TypeError)) else InvalidInputError
            message = str(exc)
            if message.startswith("expected ") and ", got " in message:   # the strict hooks' wording
                return kind(f"{parameter}.{name}", value.get(name), message[9:message.index(", got ")],
                            f"got {type(value.get(name)).__name__}")
            field_type = next((f.type for f in attrs.fields(options_type) if f.name == name), None)
            return kind(f"{parameter}.{name}", value.get(name),
                        f"a value of type {getattr(field_type, '__name__', field_type)}", message)
        err = without[0] if without else err
    if isinstance(err, InvalidInputError):     # a field's own validator: rename its parameter
        field = err.parameter.rpartition(".")[2]
        if err.parameter.startswith(f"{parameter}."):
            return err
        return type(err)(f"{parameter}.{field}", err.value, err.allowed, err.detail)
    if isinstance(err, cattrs.ForbiddenExtraKeysError):
        extra = sorted(err.extra_fields)
        return InvalidInputError(f"{parameter}.{extra[0]}", value.get(extra[0]), f"a field of {cls}: {fields}",
                                 f"unknown field(s) {', '.join(extra)}")
    return InvalidInputError(parameter, value, f"fields of {cls} ({fields})", str(err) or type(err).__name__)


# Keys of a Hugging Face config.json that no model file has: such a dict without
# ``model_type`` is an HF config missing its family, not a model file with odd fields.
_HF_KEYS = frozenset(("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                      "intermediate_size", "architectures", "n_embd", "n_layer", "n_head", "torch_dtype",
                      "max_position_embeddings", "rms_norm_eps", "num_local_experts", "num_experts_per_tok"))


def structure_model(data: dict):
    """A model from a dict (a JSON file): ``kind`` picks dense or sparse. Every problem is an
    ``InvalidInputError`` (a ``ValueError``, also for a field of the wrong type) naming
    ``model.<field>``; a Hugging Face config.json without ``model_type`` is told so."""
    from .types import SparseTransformerWorkload, TransformerWorkload
    if not isinstance(data, dict):
        raise InvalidInputError("model", _shown(data), "a JSON object of TransformerWorkload fields",
                                f"got {type(data).__name__}")
    data = dict(data)
    kind = data.pop("kind", "sparse_transformer" if "experts" in data else "transformer")
    cls = {"transformer": TransformerWorkload, "sparse_transformer": SparseTransformerWorkload}.get(kind) \
        if isinstance(kind, str) else None
    if cls is None:
        raise InvalidInputError("model.kind", _shown(kind), "'transformer' or 'sparse_transformer'")
    if "model_type" not in data and _HF_KEYS.intersection(data):
        from .hf import SUPPORTED_MODEL_TYPES
        raise InvalidInputError(
            "config.model_type", None, f"one of {', '.join(SUPPORTED_MODEL_TYPES)}",
            f"this looks like a Hugging Face config.json ({', '.join(sorted(_HF_KEYS.intersection(data))[:3])}, "
            "...) without model_type, which names its family: add it (as in the model's config.json), "
            f"or write the model with the fields of {cls.__name__}")
    required = ", ".join(f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING)
    return _structure_fields(cls, data, "model", f"a value: a {kind} model needs {required}")


def _structure_fields(cls, data: dict, prefix: str, needs: str):
    """``cls(**data)`` for a file's object, every problem an ``InvalidInputError`` naming
    ``<prefix>.<field>`` (an unknown field, a missing one, a bad value; never a TypeError)."""
    fields = attrs.fields(cls)
    extra = sorted(set(data) - {f.name for f in fields}, key=str)
    if extra:
        raise InvalidInputError(f"{prefix}.{extra[0]}", _shown(data[extra[0]]),
                                f"a field of {cls.__name__}: {', '.join(f.name for f in fields)}",
                                f"unknown field(s) {', '.join(map(str, extra))}")
    for f in fields:
        if f.default is attrs.NOTHING and f.name not in data:
            raise InvalidInputError(f"{prefix}.{f.name}", None, needs, "required field missing")
    try:
        return cls(**data)
    except InvalidInputError as err:     # name the file's field
        field = err.parameter.rpartition(".")[2]
        raise InvalidInputError(f"{prefix}.{field}", err.value, err.allowed, err.detail) from err


def structure_hardware(data: dict):
    """A ``HardwareNode`` from a dict (a JSON file or a scenario's ``hardware`` object), checked
    like ``structure_model``: every problem an ``InvalidInputError`` (never a ``TypeError``)
    naming ``hardware.<field>``; a ``memory_capacity`` under 1 MiB suggests GiB."""
    from .types import HardwareNode
    if not isinstance(data, dict):
        raise InvalidInputError("hardware", _shown(data), "a JSON object of HardwareNode fields",
                                f"got {type(data).__name__}")
    return _structure_fields(HardwareNode, data, "hardware",
                             "a value: a hardware file needs name and memory_capacity (bytes)")
