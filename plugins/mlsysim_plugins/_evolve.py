"""``evolve``: ``attrs.evolve`` for the hot paths of a solve (a helper, not a plugin).

``attrs.evolve`` looks the class's fields up and reads them one by one in Python on every
call; the measured options have about 45 fields and are evolved several times per solve
(issue 24: the registered techniques' fields made this a measurable share of an uncached
solve). This reads the same fields with one ``operator.attrgetter`` built once per class and
calls the class the same way, so validators, converters and ``__attrs_post_init__`` run as
they do under ``attrs.evolve``.
"""

from __future__ import annotations

import operator

import attrs

_READERS: dict[type, tuple[tuple[str, ...], operator.attrgetter]] = {}


def _reader(cls: type):
    init = [a for a in attrs.fields(cls) if a.init]
    # attrgetter of one name returns the value, of two or more a tuple: a dummy second read keeps it a tuple
    names = [a.name for a in init] or ["__class__"]
    return tuple(a.alias for a in init), operator.attrgetter(*names, "__class__")


def evolve(inst, **changes):
    """``attrs.evolve(inst, **changes)``: a new instance of ``inst``'s class, ``changes`` applied."""
    cls = type(inst)
    reader = _READERS.get(cls)
    if reader is None:
        reader = _READERS[cls] = _reader(cls)
    aliases, read = reader
    kwargs = dict(zip(aliases, read(inst)))     # (zip stops at the aliases: the dummy read is dropped)
    kwargs.update(changes)
    return cls(**kwargs)
