"""Measured-grade term lists, memoised with ``mlsysim_core.memo`` (the one mechanism): the
key is every argument (the frozen plan and placement, whole), so it cannot go stale."""

from __future__ import annotations

import functools

from mlsysim_core.memo import memoize


def cached_terms(fn):
    """``fn(plan, placement, *extra, **kw)``, memoised; each call gets a new list."""
    frozen = memoize(lambda *args, **kw: tuple(fn(*args, **kw)))

    @functools.wraps(fn)
    def wrapper(*args, **kw):
        return list(frozen(*args, **kw))
    return wrapper
