"""The one cache: a memo keyed on every argument and its type (``True == 1``, but a check may
refuse one); ``set_enabled(False)`` switches every memo off."""

from __future__ import annotations

import functools

MAX_ENTRIES = 4096
_enabled = True
_memos: list[dict] = []
_KEYWORDS = object()     # separates positional from keyword arguments in a key


def memoize(function):
    """``function``, memoised on its positional and keyword arguments (all of them)."""
    table: dict = {}
    _memos.append(table)

    @functools.wraps(function)
    def memoised(*args, **kwargs):
        if not _enabled:
            return function(*args, **kwargs)
        key = (*args, *map(type, args))      # the values and their types, flat (one tuple to hash)
        if kwargs:
            key += (_KEYWORDS, *kwargs.items(), *map(type, kwargs.values()))
        try:
            return table[key]
        except KeyError:
            pass
        except TypeError:        # an unhashable argument: nothing to remember it by
            return function(*args, **kwargs)
        value = function(*args, **kwargs)
        if len(table) >= MAX_ENTRIES:
            table.clear()
        table[key] = value
        return value
    return memoised


def kinds(value):
    """A value's type, and its items' for a tuple: part of a memo's key (``(True,) == (1,)``)."""
    return (tuple, *map(kinds, value)) if type(value) is tuple else type(value)


def set_enabled(enabled: bool) -> None:
    """Every memo on (the default) or off; either way they start empty."""
    global _enabled
    _enabled = bool(enabled)
    for table in _memos:
        table.clear()
