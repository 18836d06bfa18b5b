"""All cattrs use lives here (imported lazily: cattrs is not needed to solve)."""

from __future__ import annotations

import json
from typing import Any

import attrs
import cattrs
from cattrs.preconf.json import make_converter

from .errors import InvalidInputError

_converter = make_converter(forbid_extra_keys=True)


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
    data["constraint_trace"] = list(result.constraint_trace)
    data["units"] = {"memory": "bytes", "gb": 1e9, "gib": 2**30}
    data["gb"] = result.gb.as_dict()
    data["gib"] = result.gib.as_dict()
    return data


def result_to_json(result, **kwargs) -> str:
    kwargs.setdefault("sort_keys", True)
    return json.dumps(unstructure_result(result), **kwargs)


def result_from_dict(data: dict):
    """The inverse of ``unstructure_result``: the derived unit views are dropped."""
    from .result import TrainingMemoryResult
    data = {k: v for k, v in data.items() if k not in ("units", "gb", "gib", "constraint_trace")}
    return _converter.structure(data, TrainingMemoryResult)


def structure_options(parameter: str, spec_name: str, options_type: type, value: Any):
    """Turn a plugin's options (an instance or a dict) into its attrs options object."""
    if isinstance(value, options_type):
        return value
    if not isinstance(value, dict):
        raise InvalidInputError(f"{parameter}[{spec_name!r}]", value,
                                f"a dict or a {options_type.__name__} instance")
    try:
        return _converter.structure(value, options_type)
    except Exception as err:  # cattrs wraps validator and type errors in groups
        fields = ", ".join(f"{f.name}: {getattr(f.type, '__name__', f.type)}"
                           for f in attrs.fields(options_type))
        messages = (cattrs.transform_error(err, path=spec_name, format_exception=_format_exception)
                    if isinstance(err, cattrs.BaseValidationError) else [str(err)])
        raise InvalidInputError(f"{parameter}[{spec_name!r}]", value,
                                f"fields of {options_type.__name__} ({fields})",
                                "; ".join(messages)) from err


def structure_model(data: dict):
    """A model from a dict (a JSON file): ``kind`` picks dense or sparse."""
    from .types import SparseTransformerWorkload, TransformerWorkload
    data = dict(data)
    kind = data.pop("kind", "sparse_transformer" if "experts" in data else "transformer")
    cls = {"transformer": TransformerWorkload, "sparse_transformer": SparseTransformerWorkload}.get(kind)
    if cls is None:
        raise InvalidInputError("model.kind", kind, "'transformer' or 'sparse_transformer'")
    allowed = {f.name for f in attrs.fields(cls)}
    extra = sorted(set(data) - allowed)
    if extra:
        raise InvalidInputError("model", ", ".join(extra), f"known fields of {cls.__name__}: {', '.join(sorted(allowed))}",
                                "unknown fields")
    return cls(**data)
