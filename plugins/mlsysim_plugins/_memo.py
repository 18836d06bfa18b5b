"""Memoisation for the built-in plugins (a helper, not a plugin).

Built-in plugins are pure functions of a few numbers, and their results (frozen terms and
effects) are immutable, so each keeps a small cache keyed on exactly the numbers it reads.
Searches and sweeps re-solve with most of those numbers unchanged (model states do not
depend on the micro-batch), so most calls become a dictionary lookup.

``set_enabled(False)`` turns every cache off (tests check that results are byte-identical
either way): each memoised function's name in its module is bound to the plain function
instead of the cached one, so the cached path costs no switch on every call.
"""

from __future__ import annotations

import functools

ENABLED = True
CACHE_SIZE = 4096

_MEMOISED: list = []    # (the defining module's globals, name, plain function, cached function)


def memoize(function):
    """The function, cached by its (positional) arguments. Call it by its module-level name:
    that name is what ``set_enabled`` rebinds."""
    cached = functools.lru_cache(maxsize=CACHE_SIZE)(function)
    _MEMOISED.append((function.__globals__, function.__name__, function, cached))
    return cached if ENABLED else function


def set_enabled(enabled: bool) -> None:
    """Every built-in plugin's memo on (the default) or off."""
    global ENABLED
    ENABLED = bool(enabled)
    for namespace, name, plain, cached in _MEMOISED:
        cached.cache_clear()
        namespace[name] = cached if ENABLED else plain
