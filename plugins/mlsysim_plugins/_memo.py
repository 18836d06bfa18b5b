"""Memoisation for the built-in plugins (a helper, not a plugin).

Built-in plugins are pure functions of a few numbers, and their results (frozen terms and
effects) are immutable, so each keeps a small cache keyed on exactly the numbers it reads.
Searches and sweeps re-solve with most of those numbers unchanged (model states do not
depend on the micro-batch), so most calls become a dictionary lookup. ``ENABLED = False``
turns every cache off; tests check that results are byte-identical either way.
"""

from __future__ import annotations

import functools

ENABLED = True
CACHE_SIZE = 4096


def memoize(function):
    cached = functools.lru_cache(maxsize=CACHE_SIZE)(function)

    @functools.wraps(function)
    def wrapper(*args):
        return cached(*args) if ENABLED else function(*args)

    wrapper.cache_clear = cached.cache_clear
    wrapper.cache_info = cached.cache_info
    return wrapper
