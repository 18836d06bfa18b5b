"""The one caching mechanism: a memo keyed on every argument of a pure function, and on each
argument's type (``True == 1``, but a check may refuse one), so it cannot go stale by omission;
and ``read_keyed``, the same keyed on what a function read of its objects (a plan, a
placement) instead of their whole value (below). ``set_enabled(False)`` switches both off
(tests check that answers are identical either way).
"""

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
        if not _enabled or (_depth and (_Tracked in map(type, args) or _Tracked in map(type, kwargs.values()))):
            return function(*args, **kwargs)    # (a tracking view is no key: read_keyed records its reads)
        key = (*args, *map(type, args))      # the values and their types, flat (one tuple to hash)
        if kwargs:
            key += (_KEYWORDS, *kwargs.items(), *(type(v) for v in kwargs.values()))
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


def set_enabled(enabled: bool) -> None:
    """Every memo on (the default) or off; either way they start empty."""
    global _enabled
    _enabled = bool(enabled)
    for table in _memos:
        table.clear()
    _SITES.clear()
    _TOKENS.clear()


# --- Read-keyed caching --------------------------------------------------------------------
#
# ``read_keyed(site, function, values, objects)`` calls ``function(*values, *objects)`` and
# remembers its result keyed on exactly what it read: each value in ``values`` whole, and
# every attribute it read of each object in ``objects`` (a plan, a placement), recorded on a
# tracking view of the object while the function ran. The key is the sequence of
# (attribute, value read) in the order the function read them, stored as a tree: a
# deterministic function given the same values for its first k reads makes the same
# (k+1)-th read, so a lookup walks the tree reading the new objects' attributes and finds
# the earlier result exactly when every value the function read is equal (and of the same
# type). It cannot go stale by omission: what the function did not read cannot change its
# result. Nothing is cached when the function read something unhashable, raised, or
# returned a tracking view inside a container; a function that raises while tracked is run
# again on the real objects, so its error (or its answer) is the untracked one.
#
# A function that copies an object with ``attrs.evolve`` does not read the fields it copies:
# the copy is itself a tracking view, whose copied fields are reads of the original and
# whose changed fields are not reads. Returning such a copy caches the changes only, applied
# to the next call's object with ``attrs.evolve``. While a function is tracked, ``memoize``
# calls straight through (a memo key would hash the view, i.e. read everything).

import itertools
import sys
import types

_depth = 0                      # > 0 while a function runs tracked
_getframe = sys._getframe
_get = object.__getattribute__
_EVOLVE_CODE = None             # attrs.evolve's code object (set on first use)
_MISS = object()
_ALL = object()                 # "every inherited field" (a derived view's derived attribute)
READ_KEYED_MAX = 20000          # results per call site; beyond it the site starts again
READ_KEYED_TRIAL = 1000         # calls after which a site with under 10 % hits is called untracked


def _fields_of(cls) -> frozenset:
    names = _FIELDS.get(cls)
    if names is None:
        import attrs
        names = _FIELDS[cls] = frozenset(f.name for f in attrs.fields(cls)) if attrs.has(cls) else frozenset()
    return names


_FIELDS: dict = {}


class _Log:
    __slots__ = ("reads", "seen", "active", "evolving", "copied")

    def __init__(self):
        self.reads, self.seen, self.active, self.evolving, self.copied = [], set(), True, None, None

    def read(self, index, name, value):
        if (index, name) not in self.seen:
            self.seen.add((index, name))
            self.reads.append((index, name, value))


class _Tracked:
    """A read-only view of an object that records the attributes read (see above)."""

    __slots__ = ("_t", "_log", "_i", "_changed", "_seen")

    def __init__(self, target, log, index, changed=frozenset()):
        object.__setattr__(self, "_t", target)
        object.__setattr__(self, "_log", log)
        object.__setattr__(self, "_i", index)
        object.__setattr__(self, "_changed", changed)
        object.__setattr__(self, "_seen", {})     # name -> what a read returned (recorded already)

    def __getattribute__(self, name):
        seen = _get(self, "_seen")
        if name in seen:        # (read and recorded before: the same value)
            return seen[name]
        target = _get(self, "_t")
        log = _get(self, "_log")
        if name == "__class__":
            if log.active and _getframe(1).f_code is _EVOLVE_CODE:    # attrs.evolve(view, ...) begins
                log.evolving, log.copied = self, set()
                return _evolved_class(type(target))
            return type(target)
        value = getattr(target, name)
        if not log.active:
            return value
        if log.evolving is self and _getframe(1).f_code is _EVOLVE_CODE:   # a field evolve copies
            log.copied.add(name)
            return value
        if type(value) is types.MethodType and value.__self__ is target:
            value = seen[name] = types.MethodType(value.__func__, self)    # its own reads are tracked
            return value
        changed = _get(self, "_changed")
        if name in _fields_of(type(target)):
            if name not in changed:
                log.read(_get(self, "_i"), name, value)
        elif changed:       # e.g. a derived attribute of a copy: it may depend on any field
            _Tracked._read_inherited(self)
        else:
            log.read(_get(self, "_i"), name, value)
        seen[name] = value
        return value

    def _read_inherited(self):
        target, log, index, changed = (_get(self, n) for n in ("_t", "_log", "_i", "_changed"))
        for name in sorted(_fields_of(type(target)) - changed):
            log.read(index, name, getattr(target, name))

    def _whole(self):
        if _get(self, "_changed"):
            _Tracked._read_inherited(self)
        elif _get(self, "_log").active:
            _get(self, "_log").read(_get(self, "_i"), None, _get(self, "_t"))
        return _get(self, "_t")

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot set {name!r}: a read-only view")

    def __hash__(self):
        return hash(_Tracked._whole(self))

    def __eq__(self, other):
        if type(other) is _Tracked:
            other = _Tracked._whole(other)
        return _Tracked._whole(self) == other

    def __ne__(self, other):
        return not _Tracked.__eq__(self, other)

    def __repr__(self):
        return repr(_Tracked._whole(self))


_EVOLVED: dict = {}


def _evolved_class(cls):
    """A subclass of ``cls`` whose construction (by ``attrs.evolve`` of a view) builds the real
    object and returns it as a view: the fields evolve copied stay reads of the original."""
    made = _EVOLVED.get(cls)
    if made is None:
        made = _EVOLVED[cls] = type(f"_Evolved{cls.__name__}", (cls,),
                                    {"__new__": _make_evolved(cls), "__slots__": ()})
    return made


def _make_evolved(cls):
    def __new__(klass, **changes):
        # (called by attrs.evolve(view, ...): the view is its ``inst``; its log, not a global,
        # so a tracked call in another thread cannot be mixed up with this one)
        log = _get(_getframe(1).f_locals["inst"], "_log")
        view, copied = log.evolving, log.copied
        log.evolving = log.copied = None
        real = cls(**changes)
        changed = _get(view, "_changed") | (changes.keys() - copied)
        return _Tracked(real, log, _get(view, "_i"), frozenset(changed))
    return __new__




# The key of a value read: a primitive as (type, value); any other object as a token (an int)
# standing for its typed structure: its type and, recursively, its fields' (an attrs
# instance), items' (a tuple, a read-only mapping) keys, or the object itself (anything
# else: a function, a class; equal only to itself). So ``True`` and ``1``, or ``1`` and
# ``1.0``, are other keys at any depth (``MeasuredOptions(checkpointed_layers=True)`` is not
# ``...=1``), as the memo's keys are. A token is computed once per object (kept by identity;
# the objects read are frozen); a mutable container (list, dict, set) has no key.
_PRIMITIVE = frozenset((int, float, str, bool, type(None), bytes, complex))
_MUTABLE = (list, dict, set, bytearray)
_TOKENS: dict = {}              # id(object) -> (object, token)
_INTERNED: dict = {}            # typed structure -> token
TOKENS_MAX = 200000
INTERNED_MAX = 500000
_TOKEN_NUMBERS = itertools.count()


def _key(value):
    kind = type(value)
    if kind in _PRIMITIVE:
        return kind, value
    known = _TOKENS.get(id(value))
    if known is not None and known[0] is value:
        return known[1]
    return _token(value)


def _structure(value):
    kind = type(value)
    if kind in _PRIMITIVE:
        return kind, value
    if kind is tuple or kind is frozenset:
        return kind, tuple(map(_structure, value))
    from .plan import FrozenMap
    if kind is FrozenMap or kind is types.MappingProxyType:
        return kind, tuple((_structure(k), _structure(v)) for k, v in value.items())
    if isinstance(value, _MUTABLE):
        raise TypeError(f"a mutable {kind.__name__} has no key")
    fields = getattr(kind, "__attrs_attrs__", None)
    if fields is not None and kind.__eq__ is not object.__eq__:     # (eq=False: compared by identity)
        return kind, tuple(_structure(getattr(value, f.name)) for f in fields)
    return kind, _Identity(value)


class _Identity:
    """An object that is equal only to itself (a function, a class, an unknown object)."""
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        return type(other) is _Identity and other.value is self.value

    def __hash__(self):
        return id(self.value)


def _token(value):
    structure = _structure(value)
    token = _INTERNED.get(structure)
    if token is None:
        if len(_INTERNED) >= INTERNED_MAX:     # (numbers are never reused: a tree keyed on an old one misses)
            _INTERNED.clear()
        token = _INTERNED[structure] = next(_TOKEN_NUMBERS)
    if len(_TOKENS) >= TOKENS_MAX:
        _TOKENS.clear()
    _TOKENS[id(value)] = (value, token)
    return token


class _Node:
    __slots__ = ("index", "name", "children", "last", "next", "leaf", "result")

    def __init__(self):
        self.index = self.name = self.result = None
        self.children = None
        self.last = self.next = _MISS
        self.leaf = False


_SITES: dict = {}


def _lookup(node, objects):
    while not node.leaf:
        if node.children is None:
            return _MISS
        obj = objects[node.index]
        name = node.name
        value = obj if name is None else getattr(obj, name)
        if value is node.last:
            node = node.next
            continue
        kind = type(value)
        if kind in _PRIMITIVE:
            key = kind, value
        else:
            known = _TOKENS.get(id(value))
            if known is not None and known[0] is value:
                key = known[1]
            else:
                try:
                    key = _token(value)
                except TypeError:
                    return _MISS
        child = node.children.get(key)
        if child is None:
            return _MISS
        node.last, node.next = value, child
        node = child
    return node.result


def _insert(root, reads, result) -> bool:
    node = root
    for index, name, value in reads:
        try:
            key = _key(value)
        except TypeError:
            return False
        if node.leaf:
            return False
        if node.children is None:
            node.index, node.name, node.children = index, name, {}
        elif node.index != index or node.name != name:
            return False        # not deterministic: remember nothing
        child = node.children.get(key)
        if child is None:
            child = node.children[key] = _Node()
        node = child
    if node.leaf or node.children is not None:
        return False
    node.leaf, node.result = True, result
    return True


def _contains_view(value) -> bool:
    if type(value) is _Tracked:
        return True
    if type(value) in (list, tuple):
        return any(type(v) is _Tracked or (type(v) in (list, tuple) and _contains_view(v)) for v in value)
    if type(value) is dict:
        return _contains_view(list(value.values()))
    return False


def read_keyed(site, function, values: tuple, objects: tuple):
    """``function(*values, *objects)``, cached on ``values`` and what it reads of ``objects``
    (see above); ``site`` names the call site (hashable: the function and what it stands for)."""
    global _depth, _EVOLVE_CODE
    if not _enabled or _depth:
        return function(*values, *objects)
    entry = _SITES.get(site)
    if entry is None:
        entry = _SITES[site] = [_Node(), 0, 0, 0]     # tree, results, calls, hits
    elif entry[2] >= READ_KEYED_TRIAL and entry[3] * 10 < entry[2]:
        return function(*values, *objects)      # a site that (almost) never repeats: not worth tracking
    entry[2] += 1
    everything = (*values, *objects)
    result = _lookup(entry[0], everything)
    if result is not _MISS:
        entry[3] += 1
        if type(result) is _Delta:
            from .plan import replaced     # (attrs.evolve, faster for a plan's rank or options)
            return replaced(everything[result.index], **result.changes)
        return result
    if _EVOLVE_CODE is None:
        import attrs
        _EVOLVE_CODE = attrs.evolve.__code__
    log = _Log()
    offset = len(values)
    for index, value in enumerate(values):
        log.read(index, None, value)
    views = tuple(_Tracked(obj, log, offset + i) for i, obj in enumerate(objects))
    _depth += 1
    try:
        result = function(*values, *views)
    except Exception:
        failed = True
    else:
        failed = False
    finally:
        log.active = False
        _depth -= 1
    if failed:
        return function(*values, *objects)     # the untracked run decides (and raises)
    stored = result
    if type(result) is _Tracked:
        real = _get(result, "_t")
        stored = _Delta(_get(result, "_i"), {name: getattr(real, name) for name in _get(result, "_changed")})
        result = real
    elif _contains_view(result):
        return function(*values, *objects)
    if entry[1] >= READ_KEYED_MAX:
        entry[0], entry[1], entry[2], entry[3] = _Node(), 0, 0, 0
    if _insert(entry[0], log.reads, stored):
        entry[1] += 1
    return result


class _Delta:
    """A cached result that is the call's object (``index``) with ``changes`` (attrs.evolve)."""
    __slots__ = ("index", "changes")

    def __init__(self, index, changes):
        self.index, self.changes = index, changes
