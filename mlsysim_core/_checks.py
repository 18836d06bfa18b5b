"""Input checks shared by the types and the solver: the normalised value, or an ``InvalidInputError``."""

from __future__ import annotations

import math
import numbers

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


def name(parameter: str, value: object, choices) -> str:
    """A name from ``choices``, case and separators ignored (``registry.resolve_name``)."""
    if type(value) is str and value in choices:   # already canonical: the common case
        return value
    from .registry import resolve_name
    return resolve_name(parameter, value, choices)


def attrs_count(minimum: int = 1, maximum: int = MAX_COUNT, optional: bool = False):
    """An attrs validator: ``count`` (``optional``: or None) naming ``Class.field``."""
    def validate(instance, attribute, value):
        if not (optional and value is None):
            count(f"{type(instance).__name__}.{attribute.name}", value, minimum=minimum, maximum=maximum)
    return validate


def attrs_optional_flag(instance, attribute, value):
    if value is not None:
        flag(f"{type(instance).__name__}.{attribute.name}", value)


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
