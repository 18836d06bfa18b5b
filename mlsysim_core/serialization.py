"""The cattrs converter (imported lazily): options objects from dicts, strictly checked."""

from __future__ import annotations

from typing import Any

import attrs
import cattrs
from cattrs.gen import make_dict_unstructure_fn, override
from cattrs.preconf.json import make_converter

from .errors import InvalidInputError, InvalidInputTypeError
from .terms import MemoryTerm

_converter = make_converter(forbid_extra_keys=True)
# The version of every JSON document written: bumped when a key changes meaning or goes away.
# 2: a result's "regime" is its "details"; version 1 is still read.
SCHEMA_VERSION = 2


# Strict: cattrs' default hooks call int()/float()/bool() (4.5 would become 4, "yes" True).
def _expect(value, allowed: str, ok: bool):
    if not ok:
        raise ValueError(f"expected {allowed}, got {value!r}")
    return value


_converter.register_structure_hook(int, lambda v, _: int(v) if isinstance(v, float) and v.is_integer()
                                   else _expect(v, "an integer", isinstance(v, int) and not isinstance(v, bool)))
_converter.register_structure_hook(
    float, lambda v, _: float(_expect(v, "a number", isinstance(v, (int, float)) and not isinstance(v, bool))))
_converter.register_structure_hook(bool, lambda v, _: _expect(v, "true or false", isinstance(v, bool)))
_converter.register_structure_hook(str, lambda v, _: _expect(v, "a string", isinstance(v, str)))
_converter.register_unstructure_hook(MemoryTerm, make_dict_unstructure_fn(    # a term's "key" only where it has one
    MemoryTerm, _converter, key=override(omit_if_default=True)))


def _message(exc: BaseException) -> str:
    """An exception's message; attrs' validators raise ValueError(message, attribute, ...)."""
    args = exc.args
    return args[0] if len(args) > 1 and isinstance(args[0], str) else str(exc) or type(exc).__name__


def _format_exception(exc: BaseException, type_) -> str:
    if isinstance(exc, KeyError):
        return "required field missing"
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unknown field(s) {', '.join(sorted(exc.extra_fields))}"
    return _message(exc)


def structure_options(parameter: str, spec_name: str, options_type: type, value: Any):
    """Turn a plugin's options (an instance or a dict) into its attrs options object."""
    if isinstance(value, options_type):
        return value
    named = parameter == spec_name     # a solve option of its own (lora=, runtime_overheads=)
    where = parameter if named else f"{parameter}[{spec_name!r}]"
    if not isinstance(value, dict):
        raise InvalidInputError(where, value, f"a dict or a {options_type.__name__} instance")
    for f in attrs.fields(attrs.resolve_types(options_type)):     # cattrs splits a str for a tuple into characters
        if isinstance(value.get(f.name), str) and (f.type is tuple or getattr(f.type, "__origin__", None) is tuple):
            raise InvalidInputTypeError(f"{where}.{f.name}", value[f.name], "a list", "got str")
    try:
        return _converter.structure(value, options_type)
    except Exception as err:  # cattrs wraps validator and type errors in groups
        fields = ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}" for f in attrs.fields(options_type))
        if named:
            raise _field_error(parameter, options_type, value, err, fields) from err
        messages = (cattrs.transform_error(err, path=spec_name, format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err)])
        raise InvalidInputError(where, value, f"fields of {options_type.__name__} ({fields})", "; ".join(messages)) from err


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
            message = _message(exc)
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
    return InvalidInputError(parameter, value, f"fields of {cls} ({fields})", _message(err))
