"""Input checks shared by the types and the solver: the normalised value, or an ``InvalidInputError``."""

from __future__ import annotations

import difflib
import math
import numbers
import re
from typing import Iterable

from .errors import InvalidInputError, InvalidInputTypeError

# The largest count accepted: every integer up to it is exact as a float64, so bytes stay exact.
MAX_COUNT = 2**53


def count(name: str, value: object, *, minimum: int = 1, maximum: int = MAX_COUNT) -> int:
    """An integer count in [minimum, maximum]; integral floats (``2.0``) are accepted as ints."""
    if type(value) is int and minimum <= value <= maximum:   # the common case, first
        return value
    allowed, given = f"an integer >= {minimum}", value
    if isinstance(value, bool):
        raise InvalidInputTypeError(name, value, allowed, "bools are not counts")
    if not isinstance(value, numbers.Real):
        raise InvalidInputTypeError(name, value, allowed, f"got {type(value).__name__}")
    if not isinstance(value, numbers.Integral) and not (math.isfinite(value) and float(value).is_integer()):
        raise InvalidInputError(name, value, allowed, "not a whole number")
    value = int(value)
    if value < minimum:
        raise InvalidInputError(name, given, allowed)
    if value > maximum:
        raise InvalidInputError(name, given, f"an integer in [{minimum:,}, {maximum:,}]",
                                "too large: beyond 2**53 counts and the bytes made from them are no longer exact"
                                if maximum == MAX_COUNT else "too large")
    return value


def fraction(name: str, value: object) -> float:
    """A finite real number in [0.0, 1.0]."""
    if type(value) is float and 0.0 <= value <= 1.0:
        return value
    allowed = "a number in [0.0, 1.0]"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise InvalidInputTypeError(name, value, allowed, f"got {type(value).__name__}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise InvalidInputError(name, value, allowed)
    return float(value) if not isinstance(value, (int, float)) else value


def flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidInputTypeError(name, value, "True or False", f"got {type(value).__name__}")
    return value


def attrs_check(check, allow_none: bool = False, **limits):
    """An attrs validator: ``check`` (``allow_none``: or None) naming ``Class.field``."""
    def validate(instance, attribute, value):
        if not (allow_none and value is None):
            check(f"{type(instance).__name__}.{attribute.name}", value, **limits)
    return validate


def to_int(value):
    """attrs converter: integral floats become ints; everything else (None too) is left for validators."""
    return int(value) if isinstance(value, float) and math.isfinite(value) and value.is_integer() else value


def whole_microbatches(batch_size: int, dp_size: int, gradient_accumulation_steps: int, note: str = "") -> None:
    """The global batch must be whole micro-batches (a multiple of dp_size x accumulation steps)."""
    per_step = dp_size * gradient_accumulation_steps
    if batch_size % per_step == 0:
        return
    below = batch_size // per_step * per_step
    above = below + per_step
    raise InvalidInputError(
        "batch_size", batch_size, f"a multiple of dp_size x gradient_accumulation_steps = {dp_size} x "
        f"{gradient_accumulation_steps} = {per_step}, e.g. {f'{below} or ' if below else ''}{above}",
        f"global batch size {batch_size} over {dp_size} data-parallel rank(s) and {gradient_accumulation_steps} "
        f"accumulation step(s) is not a whole number of micro-batches (rounding it up would run a global "
        f"batch of {above})" + note)


_SEPARATORS = re.compile(r"[-_ ]+")


def name_key(name: str) -> str:
    """What two spellings of one name share: case and the separators ``-``, ``_``, space ignored."""
    return _SEPARATORS.sub("", name.casefold())


def resolve_name(parameter: str, value: object, choices: Iterable[str], allowed: str | None = None) -> str:
    """The one lookup of a name a user gives: ``value`` if in ``choices``, else the one choice it
    names with case and separators ignored (never whitespace around it); else an ``InvalidInputError``
    listing ``allowed`` and the likely choice."""
    if type(value) is str and value in choices:     # already canonical: the common case
        return value
    names = sorted(choices)
    allowed = allowed if allowed is not None else "one of: " + (", ".join(names) or "(none installed)")
    if not isinstance(value, str):
        raise InvalidInputTypeError(parameter, value, allowed, f"got {type(value).__name__}")
    by_key: dict[str, list[str]] = {}
    for name in names:
        by_key.setdefault(name_key(name), []).append(name)
    key = name_key(value)
    same = by_key.get(key, []) if value == value.strip() else []
    if len(same) == 1:
        return same[0]
    if len(same) > 1:
        raise InvalidInputError(parameter, value, allowed,
                                f"ambiguous: it names {' and '.join(map(repr, same))} (give one exactly)")
    close = [name for k in difflib.get_close_matches(key, list(by_key), n=3, cutoff=0.6) for name in by_key[k]]
    detail = "surrounding whitespace is not ignored" if value != value.strip() and key in by_key else ""
    if close:
        detail += ("; " if detail else "") + f"did you mean {' or '.join(map(repr, close))}?"
    raise InvalidInputError(parameter, value, allowed, detail)


name = resolve_name     # a name from choices (plugins call it _checks.name)
