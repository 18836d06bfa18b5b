"""The one reader of sizes and bandwidths a user writes: ``"24GiB"``, ``"80 GB"``, ``"1.5TB"``,
``"3.35TB/s"``, or a plain number of bytes. GB, TB, ... are powers of 10 (1 GB = 1e9 bytes);
GiB, TiB, ... powers of 2 (1 GiB = 2**30 bytes), as everywhere in mlsysim-core. The result is
a whole number of bytes (bytes per second): ``"1.5KiB"`` is 1536, ``"1.1KiB"`` (1126.4 bytes)
is refused, never rounded. Every refusal is an ``InvalidInputError`` naming the parameter.
"""

from __future__ import annotations

import math
import numbers
import re
from fractions import Fraction

from ..errors import InvalidInputError, InvalidInputTypeError

# Bytes per unit; a unit is read case-insensitively ("gib", "GB", "kB").
BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15,
              "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
_BY_KEY = {unit.lower(): scale for unit, scale in BYTE_UNITS.items()}

_SIZE = re.compile(r"\s*(?P<number>[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+\.)\s*(?P<unit>[A-Za-z]*)\s*")


def parse_bytes(value: object, parameter: str = "size", *, maximum: int | None = None,
                whole: bool = True) -> int | float:
    """``value`` as a whole number of bytes >= 0: an int, an integral float, or a string of a
    number and an optional unit (B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB; a space
    between them is allowed). ``parse_bytes("24GiB") == 24 * 2**30``. ``whole=False``: an
    amount rather than a size (a margin, ``"4.3GiB"``), a float where it is not whole."""
    return _parse(value, parameter, "", maximum, whole)


def parse_bandwidth(value: object, parameter: str = "bandwidth", *, maximum: int | None = None) -> int:
    """``value`` as a whole number of bytes per second: an int, or a string such as
    ``"3.35TB/s"``, ``"900 GB/s"`` or ``"64GiB/s"`` (the ``/s`` may be left out)."""
    return _parse(value, parameter, "/s", maximum)


def _allowed(per: str) -> str:
    example = "'3.35TB/s', '900 GB/s'" if per else "'24GiB', '80 GB', '1.5TB'"
    return (f"a whole number of bytes{' per second' if per else ''} >= 0, or a string like {example} "
            f"(units {', '.join(unit + per for unit in BYTE_UNITS)}; GB = 1e9 B, GiB = 2^30 B)")


def _parse(value: object, parameter: str, per: str, maximum: int | None, whole: bool = True) -> int | float:
    allowed = _allowed(per) if whole else _allowed(per).replace("a whole number of bytes", "a number of bytes")
    if isinstance(value, bool) or not isinstance(value, (str, numbers.Real)):
        raise InvalidInputTypeError(parameter, value, allowed, f"got {type(value).__name__}")
    if isinstance(value, str):
        amount = _from_text(value, parameter, per, allowed)
    else:
        if not math.isfinite(value):
            raise InvalidInputError(parameter, value, allowed, "not a finite number")
        amount = Fraction(value)
    if amount < 0:
        raise InvalidInputError(parameter, value, allowed, "negative")
    if amount.denominator != 1 and whole:
        raise InvalidInputError(parameter, value, allowed, f"{float(amount):,} is not a whole number of bytes")
    if maximum is not None and amount > maximum:
        raise InvalidInputError(parameter, value, allowed, f"larger than {maximum:,} bytes{per}")
    return int(amount) if amount.denominator == 1 else float(amount)


def _from_text(text: str, parameter: str, per: str, allowed: str) -> Fraction:
    body = text.strip()
    if per and body.lower().endswith(per):
        body = body[:-len(per)]
    if body.startswith("-"):
        raise InvalidInputError(parameter, text, allowed, "negative")
    if body.lstrip("+").strip().lower().startswith(("nan", "inf")):
        raise InvalidInputError(parameter, text, allowed, "not a finite number")
    match = _SIZE.fullmatch(body.lstrip("+"))
    if match is None:
        raise InvalidInputError(parameter, text, allowed, "not a number followed by an optional unit")
    unit = match["unit"]
    scale = _BY_KEY.get(unit.lower()) if unit else 1
    if scale is None:
        raise InvalidInputError(parameter, text, allowed, f"unknown unit {unit!r}")
    if len(match["number"]) > 100:
        raise InvalidInputError(parameter, text, allowed, "a number of more than 100 characters")
    number = Fraction(match["number"])
    if number.numerator and abs(math.log10(number.numerator) - math.log10(number.denominator)) > 60:
        raise InvalidInputError(parameter, text, allowed, "out of range")
    return number * scale
