"""All cattrs use lives here (imported lazily: cattrs is not needed to solve)."""

from __future__ import annotations

import json
import math
import re
from typing import Any

import attrs
import cattrs
from cattrs.preconf.json import make_converter

from .errors import InvalidInputError, InvalidInputTypeError
from .terms import COMPONENTS, PHASES

_converter = make_converter(forbid_extra_keys=True)

# The version of every JSON document this package writes (results, the CLI's --json output,
# the catalog and plugin listings): bumped when a key changes meaning or goes away, not for new keys.
# 2: a result's "regime" is its "details" (the profile's own: {"regime": ...}); version 1 is still read.
SCHEMA_VERSION = 2
# Keys a result's JSON carries beside its fields (derived views, the CLI's additions): dropped on reading.
_NOT_FIELDS = ("units", "gb", "gib", "constraint_trace", "schema_version", "profile_note", "name_notes", "run")
_TO_JSON = "TrainingMemoryResult.to_json"


# cattrs' default hooks call int()/float()/bool() (4.5 would become 4, "yes" True); options are
# user input, so they are checked strictly, like every solve argument.
def _expect(value, allowed: str, ok: bool):
    if not ok:
        raise ValueError(f"expected {allowed}, got {value!r}")
    return value


def _strict_int(value, _type):
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return _expect(value, "an integer", isinstance(value, int) and not isinstance(value, bool))


_converter.register_structure_hook(int, _strict_int)
_converter.register_structure_hook(
    float, lambda v, _: float(_expect(v, "a number", isinstance(v, (int, float)) and not isinstance(v, bool))))
_converter.register_structure_hook(bool, lambda v, _: _expect(v, "true or false", isinstance(v, bool)))
_converter.register_structure_hook(str, lambda v, _: _expect(v, "a string", isinstance(v, str)))


def _format_exception(exc: BaseException, type_) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    return str(exc) or type(exc).__name__


def unstructure_result(result) -> dict:
    return {**_converter.unstructure(result), "schema_version": SCHEMA_VERSION,
            "constraint_trace": list(result.constraint_trace), "units": {"memory": "bytes", "gb": 1e9, "gib": 2**30},
            "gb": result.gb.as_dict(), "gib": result.gib.as_dict()}


def result_from_json(text):
    """``TrainingMemoryResult.from_json``: anything but a result's JSON raises ``InvalidInputError``
    naming the first bad field."""
    from .result import RankReport, TrainingMemoryResult
    if not isinstance(text, (str, bytes, bytearray)):
        raise InvalidInputTypeError("text", _shown(text), f"a JSON string written by {_TO_JSON}",
                                    f"got {type(text).__name__}")
    data = parse_json(text, "text")
    if not isinstance(data, dict):
        raise InvalidInputTypeError("result", _shown(data), f"a JSON object written by {_TO_JSON}",
                                    f"got {type(data).__name__}")
    if versioned := "schema_version" in data:
        version = data["schema_version"]
        allowed = f"an integer in [1, {SCHEMA_VERSION}] (this package writes {SCHEMA_VERSION})"
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidInputTypeError("result.schema_version", _shown(version), allowed,
                                        f"got {type(version).__name__}")
        if not 1 <= version <= SCHEMA_VERSION:
            raise InvalidInputError("result.schema_version", version, allowed,
                                    "written by a newer mlsysim-core" if version > SCHEMA_VERSION else "")
    if (not versioned or data["schema_version"] == 1) and "regime" in data:   # (version 1: its own field)
        data = {**data, "details": {"regime": data["regime"]} if data["regime"] is not None else {}}
        del data["regime"]
    data = {k: v for k, v in data.items() if k not in _NOT_FIELDS}
    # What to_json always writes must be there: every field of each rank, and with a schema_version
    # every field of the result (an older file may leave out those with defaults).
    missing = [(f"result.{f.name}", "result") for f in attrs.fields(TrainingMemoryResult)
               if versioned and f.name not in data]
    ranks = data["ranks"] if isinstance(data.get("ranks"), (list, tuple)) else ()
    missing += [(f"result.ranks[{i}].{f.name}", "rank") for i, rank in enumerate(ranks) if isinstance(rank, dict)
                for f in attrs.fields(RankReport) if f.name not in rank]
    if missing:
        raise InvalidInputError(missing[0][0], None, f"present in a {missing[0][1]} written by {_TO_JSON}",
                                "required field missing")
    try:
        result = _converter.structure(data, TrainingMemoryResult)
    except RecursionError as err:
        raise InvalidInputError("result", "(nested too deeply)", f"a result written by {_TO_JSON}",
                                "nested too deeply") from err
    except Exception as err:    # cattrs groups the field errors
        messages = (cattrs.transform_error(err, path="result", format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err) or type(err).__name__])
        parameter, value = _error_path(messages, data)
        if parameter is None:
            field = _first_field(err)
            parameter = f"result.{field}" if field else "result"
            value = _shown(data.get(field)) if field else "(a JSON object)"
        more = f"; and {len(messages) - 3} more" if len(messages) > 3 else ""
        raise InvalidInputError(parameter, value, f"a result written by {_TO_JSON}",
                                "; ".join(messages[:3]) + more) from err
    _check_result(result)
    return result


_PATH_STEP = re.compile(r"\.(\w+)|\[(\d+)\]|\['([^']*)'\]")


def _error_path(messages, data):
    """The input a cattrs error is about, from the path its first message ends with
    (``... @ result.ranks[1].terms[0]``): its parameter name and the value found there."""
    path = messages[0].rpartition(" @ ")[2] if messages and " @ " in messages[0] else ""
    if not path.startswith("result"):
        return None, None
    parameter, value = "result", data
    for attr, index, key in _PATH_STEP.findall(path, len("result")):
        if index:
            if not isinstance(value, (list, tuple)) or int(index) >= len(value):
                break           # the container itself is wrong ("x" for a list): name it
            parameter, value = f"{parameter}[{index}]", value[int(index)]
        else:
            if not isinstance(value, dict):
                break
            parameter, value = f"{parameter}.{attr or key}", value.get(attr or key)
    return (None, None) if parameter == "result" else (parameter, _shown(value))


def _require(ok, parameter: str, value, allowed: str, detail: str = "") -> None:
    if not ok:
        raise InvalidInputError(parameter, value, allowed, detail)


def _is_bytes(value) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value >= 0


def _check_memory(where: str, report, available) -> None:
    """Memory fields finite and >= 0, the total the components' sum, ``feasible`` as the totals
    say against ``available`` (in GB, as the solver decides): for the result and each rank."""
    for field in ("total_memory", *COMPONENTS, "host_memory"):
        _require(_is_bytes(getattr(report, field)), f"{where}.{field}", getattr(report, field),
                 "a finite number of bytes >= 0")
    parts = (report.weights + report.gradients + report.optimizer_state + report.activations
             + report.communication_buffers + report.runtime_overheads)
    _require(abs(report.total_memory - parts) <= 1e-9 * max(abs(parts), 1.0) + 1e-6, f"{where}.total_memory",
             report.total_memory, f"the sum of the components and runtime overheads, {parts!r}",
             "a total is what its components add up to")
    fits = report.total_memory * 1e-9 <= available * 1e-9
    _require(report.feasible is fits, f"{where}.feasible", report.feasible, f"{fits}, as the totals say",
             f"total {report.total_memory * 1e-9:.3f} GB against {available * 1e-9:.3f} GB available")


def _check_result(result) -> None:
    """A result read back must be one a solve could give (each rank too), ``selected`` consistent."""
    for field, allowed in (("available_memory", "a finite number of bytes >= 0"),
                           ("memory_utilization", "a finite number >= 0")):
        _require(_is_bytes(getattr(result, field)), f"result.{field}", getattr(result, field), allowed)
    _require(result.available_memory > 0, "result.available_memory", result.available_memory, "a number of bytes > 0")
    _check_memory("result", result, result.available_memory)
    phases = f"None or one of {', '.join(PHASES)}"
    _require(result.peak_phase in (None, *PHASES), "result.peak_phase", result.peak_phase, phases)
    for field in ("microbatch", "layers_per_stage"):
        _require(getattr(result, field) >= 1, f"result.{field}", getattr(result, field), "an integer >= 1")
    for axis, value in result.parallelism.items():
        _require(not isinstance(value, bool) and isinstance(value, int) and value >= 1,
                 f"result.parallelism.{axis}", value, "an integer >= 1")
    for axis in ("tp", "pp", "dp", "ep"):
        _require(axis in result.parallelism, f"result.parallelism.{axis}", None, "present: an integer >= 1",
                 "required field missing")
    _check_selected(result)
    for i, rank in enumerate(result.ranks):
        where = f"result.ranks[{i}]"
        _check_memory(where, rank, result.available_memory)
        _require(rank.stages and min(rank.stages) >= 0 and len(set(rank.stages)) == len(rank.stages),
                 f"{where}.stages", list(rank.stages), "a non-empty list of distinct pipeline stages (0-based)")
        _require(rank.ranks >= 1, f"{where}.ranks", rank.ranks, "an integer >= 1 (devices in this class)")
        _require(rank.layers >= 0, f"{where}.layers", rank.layers, "an integer >= 0")
        _require(math.isfinite(rank.in_flight) and rank.in_flight >= 0, f"{where}.in_flight", rank.in_flight,
                 "a finite number >= 0")
        _require(rank.peak_phase in (None, *PHASES), f"{where}.peak_phase", rank.peak_phase, phases)
        _require(rank.terms, f"{where}.terms", [], "the rank's memory terms (a non-empty list)")
        _require(rank.name.strip(), f"{where}.name", rank.name, "a non-empty string")
    names = [rank.name for rank in result.ranks]
    if names:
        _require(result.heaviest_rank in names, "result.heaviest_rank", result.heaviest_rank,
                 f"the name of one of the ranks: {', '.join(map(repr, names))}")
        heaviest = result.ranks[names.index(result.heaviest_rank)].total_memory
        _require(abs(heaviest - result.total_memory) <= 1e-9 * max(result.total_memory, 1.0) + 1e-6,
                 "result.total_memory", result.total_memory, f"the heaviest rank's total, {heaviest!r}",
                 f"the result reports its heaviest rank, {result.heaviest_rank!r}")
    else:
        _require(result.heaviest_rank is None, "result.heaviest_rank", result.heaviest_rank,
                 "None for a result without ranks")
    utilization = result.total_memory * 1e-9 / (result.available_memory * 1e-9)
    _require(abs(result.memory_utilization - utilization) <= 1e-9 * max(utilization, 1.0),
             "result.memory_utilization", result.memory_utilization, f"total / available = {utilization!r}")


_SELECTED_OWN = ("profile", "optimizer", "activation_checkpointing")
_SELECTED_RULES = ("tp_rule", "pp_rule", "dp_rule", "ep_rule", "cp_rule")


def _check_selected(result) -> None:
    """``selected`` names the result's own profile, optimizer and checkpointing strategy, and
    one sharding rule per axis, each as the installed plugins spell it."""
    selected, keys = result.selected, _SELECTED_OWN + _SELECTED_RULES
    for key in sorted(set(selected) - set(keys)):
        raise InvalidInputError(f"result.selected.{key}", selected[key], f"one of the keys {', '.join(keys)}",
                                "unknown key")
    for key in keys:
        _require(key in selected, f"result.selected.{key}", None, f"present in a result written by {_TO_JSON}",
                 "required field missing")
    for key in _SELECTED_OWN:
        _require(selected[key] == getattr(result, key), f"result.selected.{key}", selected[key],
                 f"{getattr(result, key)!r}, the result's {key}")
    try:
        from .manager import get_plugin_manager
        registry = get_plugin_manager().registry
        tables = {"profile": registry.profiles, "optimizer": registry.optimizers,
                  "activation_checkpointing": registry.checkpointing,
                  **dict.fromkeys(_SELECTED_RULES, registry.sharding_rules)}
    except Exception:       # no registry here (a broken plugin): the names cannot be checked
        tables = {}
    for key in keys:
        name, known = selected[key], tables.get(key)
        listing = f": one of {', '.join(sorted(known))}" if known is not None else ""
        _require(name.strip() and (known is None or name in known), f"result.selected.{key}", name,
                 f"a name the installed plugins provide{listing}",
                 "a result names the plugins' specs it was solved with")


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


def _first_field(err: BaseException) -> str | None:
    """The unknown top-level field a cattrs error names (a field's own errors carry their path)."""
    if isinstance(err, cattrs.ClassValidationError):
        for exc in err.group_exceptions()[1]:
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
        fields = ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}" for f in attrs.fields(options_type))
        if named:
            raise _field_error(parameter, options_type, value, err, fields) from err
        messages = (cattrs.transform_error(err, path=spec_name, format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err)])
        raise InvalidInputError(f"{parameter}[{spec_name!r}]", value, f"fields of {options_type.__name__} ({fields})",
                                "; ".join(messages)) from err


def _field_error(parameter: str, options_type: type, value: dict, err: BaseException,
                 fields: str) -> InvalidInputError:
    """The first bad field of an options dict, named ``parameter.field`` (``lora.rank``)."""
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
        if err.parameter.startswith(f"{parameter}."):
            return err
        return type(err)(f"{parameter}.{err.parameter.rpartition('.')[2]}", err.value, err.allowed, err.detail)
    if isinstance(err, cattrs.ForbiddenExtraKeysError):
        extra = sorted(err.extra_fields)
        return InvalidInputError(f"{parameter}.{extra[0]}", value.get(extra[0]), f"a field of {cls}: {fields}",
                                 f"unknown field(s) {', '.join(extra)}")
    return InvalidInputError(parameter, value, f"fields of {cls} ({fields})", str(err) or type(err).__name__)
