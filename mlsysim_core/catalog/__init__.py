"""The catalog of models and accelerators: built-in JSON data, a user directory, and plugins.

Four sources, each entry stamped with its ``origin``:

* ``"reference"``: every language model and every Cloud and Workstation accelerator of
  mlsysim 0.3.0 (``models.json``, ``hardware.json``), numbers unchanged (textbook round
  numbers: ``mlsysim:llama3-8b`` has 8.03e9 parameters), keyed in the ``mlsysim:``
  namespace. A result built on one says so in its notes.
* ``"curated"``: current models and accelerators with the public source of every number
  (``curated_models.json``, ``curated_hardware.json``). Model keys are Hugging Face repo ids
  (``meta-llama/llama-3.1-8b``, exact count 8,030,261,248); accelerator keys are
  ``vendor/product`` (``nvidia/h100-sxm5-80gb``). Where a curated entry describes the same
  model or card as a reference entry, it answers to the reference's short names
  (``llama3-8b``, ``h100``); reference entries without one keep theirs (``bert-base``).
* ``"user"``: JSON files in ``$MLSYSIM_CATALOG_DIR`` (or ``~/.config/mlsysim-core/catalog/``).
* ``"plugin"``: entries returned by the ``mlsysim_catalog_models`` and
  ``mlsysim_catalog_hardware`` hooks.

Names are looked up case-insensitively, with ``_`` and spaces read as ``-``
(``Llama3_8B`` finds ``llama3-8b``); the key, every alias and the display name all work.
A name none of them matches is then compared without its separators (``-``, ``_``, spaces,
``/``: ``RTX4090`` finds ``rtx-4090``) and against the names without their ``vendor/`` or
``owner/`` prefix (``qwen2.5-7b`` finds ``qwen/qwen2.5-7b``): one entry found is the
answer, two or more are refused, naming them (``gpt-2``: ``gpt2`` or
``openai-community/gpt2``?). A name claimed by two entries is an error that names both
providers; an unknown name gets the closest names (``h10``: did you mean
``nvidia/h100-sxm5-80gb``, ...?). An alias that means something other than what people
usually mean by it carries a note (``alias_note("model", "gpt2")``). Built-in files are
parsed once; the user directory is re-read when its files change. Looking up a built-in or
user name never loads plugins: they are collected (once per plugin manager) only to list
the catalog or to find a name the other sources lack. See docs/catalog.md.
"""

from __future__ import annotations

import difflib
import functools
import json
import os
import re
import stat
import time
import weakref
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Mapping

import attrs

from ..errors import (InvalidInputError, InvalidInputTypeError, MlsysimError, PluginConflictError,
                      PluginContractError)
from ..types import HardwareNode, SparseTransformerWorkload, TransformerWorkload
from .counting import ParameterCount, count_parameters, count_workload_parameters

if TYPE_CHECKING:
    from ..manager import PluginManager

__all__ = [
    "CatalogEntry", "CatalogError", "ENV_CATALOG_DIR", "SCHEMA", "ParameterCount", "alias_note", "clear_cache",
    "count_parameters", "count_workload_parameters", "find_hardware", "find_model", "get_hardware",
    "get_model", "list_hardware", "list_models", "NAMESPACE", "normalise", "provenance_notes",
    "read_catalog_file", "user_catalog_dir",
]

ENV_CATALOG_DIR = "MLSYSIM_CATALOG_DIR"
SCHEMA = 1
MODEL, HARDWARE = "model", "hardware"
ORIGINS = ("reference", "curated", "user", "plugin")
NAMESPACE = "mlsysim:"     # the reference's own catalog data: mlsysim:llama3-8b, mlsysim:h100

_MODEL_FIELDS = tuple(f.name for f in attrs.fields(SparseTransformerWorkload))
_DENSE_FIELDS = tuple(f.name for f in attrs.fields(TransformerWorkload))
_HARDWARE_FIELDS = tuple(f.name for f in attrs.fields(HardwareNode))
_MODEL_KINDS = {"transformer": TransformerWorkload, "sparse_transformer": SparseTransformerWorkload}
# Descriptive keys a row may carry besides the object's fields; they go to ``extra``.
_DESCRIPTIVE = ("notes", "paper", "hf_repo", "counting", "reference_path", "reference_provenance",
                "tier", "node", "memory_capacity_stated", "memory_bandwidth_stated",
                "memory_capacity_reported", "origin", "provided_by", "plugin", "curated_counterpart",
                "alias_notes")
_ROW_KEYS = ("key", "aliases", "name", "sources", "extra")
_FILE_KEYS = ("schema", "source", "description", "models", "hardware")
_BUILTIN_FILES = {MODEL: (("models.json", "reference"), ("curated_models.json", "curated")),
                  HARDWARE: (("hardware.json", "reference"), ("curated_hardware.json", "curated"))}
_SECTION = {MODEL: "models", HARDWARE: "hardware"}


class CatalogError(InvalidInputError):
    """Catalog data is malformed, or a name is claimed twice. The message names the file(s)."""

    def __init__(self, message: str, *, parameter: str = "catalog", value: object = None,
                 allowed: str = "", detail: str = ""):
        self.parameter, self.value, self.allowed = parameter, value, allowed
        self.detail = detail
        MlsysimError.__init__(self, message)


def normalise(name: str) -> str:
    """The lookup form of a name: stripped, lower case, ``_`` and whitespace read as ``-``."""
    if not isinstance(name, str):
        raise InvalidInputTypeError("name", name, "a model or hardware name (a string)", f"got {type(name).__name__}")
    return re.sub(r"[\s_]+", "-", name.strip().lower())


_SEPARATORS = re.compile(r"[-\s_/]+")


def _compact(norm: str) -> str:
    """A normalised name without its separators (``-``, ``_``, whitespace, ``/``):
    ``nvidia/rtx-4090`` and ``NVIDIA RTX4090`` are both ``nvidiartx4090``."""
    return _SEPARATORS.sub("", norm)


def _tail(norm: str) -> str | None:
    """A normalised name without its ``vendor/`` or ``owner/`` prefix (``None`` if it has none)."""
    return norm.rsplit("/", 1)[1] if "/" in norm else None


# --- entries ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class CatalogEntry:
    """One catalog entry: its short key, aliases, the object, and where its numbers come from.

    ``sources`` maps field names (comma-separated, ``"layers, hidden_dim"``) to where their
    values come from. ``extra`` holds everything else the entry records: ``kind`` (models),
    ``tier``, ``notes``, ``origin`` (``reference``, ``curated``, ``user`` or ``plugin``) and
    ``provided_by`` (the file or plugin it came from). Build one from a dict (a row of a
    catalog file) with ``from_dict``.
    """

    key: str
    aliases: tuple[str, ...] = attrs.field(default=(), converter=lambda a: (a,) if isinstance(a, str) else tuple(a))
    value: TransformerWorkload | HardwareNode
    sources: Mapping[str, str] = attrs.field(factory=dict)
    extra: Mapping[str, object] = attrs.field(factory=dict)

    @property
    def kind(self) -> str:
        """``"model"`` or ``"hardware"``."""
        return HARDWARE if isinstance(self.value, HardwareNode) else MODEL

    @property
    def origin(self) -> str | None:
        return self.extra.get("origin")

    @property
    def provided_by(self) -> str | None:
        return self.extra.get("provided_by")

    @property
    def names(self) -> tuple[str, ...]:
        """Every name the entry answers to: key, aliases, display name."""
        return (self.key, *self.aliases, self.value.name)

    @classmethod
    def from_dict(cls, row: Mapping[str, object], *, kind: str | None = None,
                  where: str = "catalog entry") -> "CatalogEntry":
        """An entry from one row of a catalog file (the JSON schema of docs/catalog.md).

        ``kind`` is ``"model"`` or ``"hardware"``; ``None`` infers it (a row with
        ``memory_capacity`` is hardware, one with ``parameters`` a model). ``name`` defaults
        to ``key``; a model's ``kind`` (``"transformer"`` or ``"sparse_transformer"``)
        defaults to sparse when ``experts`` is given. Unknown fields are rejected; free-form
        metadata goes under ``"extra"``. Raises ``CatalogError`` / ``InvalidInputError``
        naming ``where`` and the field.
        """
        if not isinstance(row, Mapping):
            raise CatalogError(f"{where}: expected an object of fields, got {type(row).__name__}",
                               parameter=where, value=row)
        key = row.get("key")
        label = f"{where} ({key!r})" if isinstance(key, str) and key.strip() else where
        if not isinstance(key, str) or not key.strip():
            raise CatalogError(f"{label}: field 'key' is required: a non-empty string",
                               parameter=f"{where}.key", value=key)
        if kind is None:
            kind = HARDWARE if "memory_capacity" in row else MODEL if "parameters" in row else None
            if kind is None:
                raise CatalogError(f"{label}: cannot tell a model from hardware: give 'parameters' "
                                   "(a model) or 'memory_capacity' (hardware)", parameter=where)
        if kind not in (MODEL, HARDWARE):
            raise InvalidInputError("kind", kind, "'model' or 'hardware'")
        aliases = row.get("aliases", ())
        if isinstance(aliases, str) or not isinstance(aliases, (list, tuple)) or \
                not all(isinstance(a, str) and a.strip() for a in aliases):
            raise CatalogError(f"{label}: field 'aliases' must be a list of non-empty strings, got {aliases!r}",
                               parameter=f"{where}.aliases", value=aliases)
        sources = row.get("sources", {})
        if not isinstance(sources, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in sources.items()):
            raise CatalogError(f"{label}: field 'sources' must map field names to strings, got {sources!r}",
                               parameter=f"{where}.sources", value=sources)
        free = row.get("extra", {})
        if not isinstance(free, Mapping):
            raise CatalogError(f"{label}: field 'extra' must be an object, got {free!r}",
                               parameter=f"{where}.extra", value=free)

        if kind == MODEL:
            model_kind = row.get("kind")
            if model_kind is None:
                model_kind = "sparse_transformer" if row.get("experts") is not None else "transformer"
            if model_kind not in _MODEL_KINDS:
                raise CatalogError(f"{label}: field 'kind' must be 'transformer' or 'sparse_transformer', "
                                   f"got {model_kind!r}", parameter=f"{where}.kind", value=model_kind)
            cls_ = _MODEL_KINDS[model_kind]
            fields, known = (_DENSE_FIELDS if cls_ is TransformerWorkload else _MODEL_FIELDS), _MODEL_FIELDS
            extra_keys = ("kind", *_DESCRIPTIVE)
        else:
            cls_, fields, known, extra_keys = HardwareNode, _HARDWARE_FIELDS, _HARDWARE_FIELDS, _DESCRIPTIVE

        allowed = set(_ROW_KEYS) | set(known) | set(extra_keys)
        unknown = [k for k in row if k not in allowed]
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise CatalogError(f"{label}: unknown field {unknown[0]!r}{hint}. A {kind} entry has: "
                               f"{', '.join(f for f in (*_ROW_KEYS, *known) if f != 'extra')}; "
                               "put anything else under \"extra\"", parameter=f"{where}.{unknown[0]}",
                               value=row[unknown[0]])
        misplaced = [k for k in known if k not in fields and row.get(k) is not None]
        if misplaced:
            raise CatalogError(f"{label}: field {misplaced[0]!r} is only for mixture-of-experts models "
                               "(\"kind\": \"sparse_transformer\")", parameter=f"{where}.{misplaced[0]}",
                               value=row[misplaced[0]])
        values = {k: row[k] for k in fields if row.get(k) is not None}
        values.setdefault("name", key)
        try:
            value = cls_(**values)
        except InvalidInputError as err:
            field = err.parameter.rsplit(".", 1)[-1]
            raise CatalogError(f"{label}: {str(err).replace(err.parameter, field, 1)}",
                               parameter=f"{where}.{field}", value=err.value, allowed=err.allowed) from err
        except TypeError as err:
            missing = re.findall(r"'(\w+)'", str(err)) if "missing" in str(err) else []
            if missing:
                raise CatalogError(f"{label}: required field {missing[0]!r} is missing "
                                   f"(a {cls_.__name__} needs {', '.join(_required(cls_))})",
                                   parameter=f"{where}.{missing[0]}") from err
            bad = re.search(r"'(\w+)' must be", str(err))
            field = bad.group(1) if bad else "?"
            raise CatalogError(f"{label}: field {field!r}: {err}", parameter=f"{where}.{field}",
                               value=row.get(field)) from err
        extra = {k: row[k] for k in row if k in extra_keys}
        if kind == MODEL:
            extra["kind"] = model_kind
        notes = extra.get("alias_notes")
        if notes is not None:
            names = {normalise(n) for n in (key, *aliases, value.name)}
            if not isinstance(notes, Mapping) or not all(
                    isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in notes.items()):
                raise CatalogError(f"{label}: field 'alias_notes' must map names of the entry to notes "
                                   f"(strings), got {notes!r}", parameter=f"{where}.alias_notes", value=notes)
            stray = [k for k in notes if normalise(k) not in names]
            if stray:
                raise CatalogError(f"{label}: field 'alias_notes' names {stray[0]!r}, which is not a name of "
                                   f"this entry (its key, an alias or its display name)",
                                   parameter=f"{where}.alias_notes", value=stray[0])
        extra.update(free)
        return cls(key=key, aliases=tuple(aliases), value=value, sources=dict(sources), extra=extra)

    def to_dict(self) -> dict:
        """The entry as a catalog-file row (``from_dict(entry.to_dict())`` gives it back)."""
        row = {"key": self.key, "aliases": list(self.aliases)}
        row.update({k: v for k, v in attrs.asdict(self.value).items() if v is not None})
        known = {"kind", *_DESCRIPTIVE}
        row.update({k: v for k, v in self.extra.items() if k in known})
        free = {k: v for k, v in self.extra.items() if k not in known}
        row["sources"] = dict(self.sources)
        if free:
            row["extra"] = free
        return row


def _required(cls) -> list[str]:
    return [f.name for f in attrs.fields(cls) if f.default is attrs.NOTHING]


def _stamp(entry: CatalogEntry, origin: str, provided_by: str, **more) -> CatalogEntry:
    return attrs.evolve(entry, extra={**entry.extra, "origin": origin, "provided_by": provided_by, **more})


# --- catalog files ------------------------------------------------------------------------


def _parse_file(text: str, where: str) -> dict[str, list[CatalogEntry]]:
    try:
        data = json.loads(text)
    except ValueError as err:     # malformed JSON, or a number too long to read
        raise CatalogError(f"{where}: not valid JSON: {err}", parameter=where) from None
    except RecursionError:
        raise CatalogError(f"{where}: not valid JSON: nested too deeply to read", parameter=where) from None
    if not isinstance(data, dict):
        raise CatalogError(f"{where}: expected a JSON object with \"schema\": {SCHEMA} and a "
                           "\"models\" and/or \"hardware\" list", parameter=where)
    unknown = [k for k in data if k not in _FILE_KEYS]
    if unknown:
        raise CatalogError(f"{where}: unknown top-level field {unknown[0]!r}; a catalog file has "
                           f"{', '.join(_FILE_KEYS)}", parameter=f"{where}.{unknown[0]}")
    if data.get("schema") != SCHEMA:
        raise CatalogError(f"{where}: field 'schema' must be {SCHEMA}, got {data.get('schema')!r}",
                           parameter=f"{where}.schema", value=data.get("schema"))
    out: dict[str, list[CatalogEntry]] = {MODEL: [], HARDWARE: []}
    for kind, section in _SECTION.items():
        rows = data.get(section, [])
        if not isinstance(rows, list):
            raise CatalogError(f"{where}: field {section!r} must be a list of entries",
                               parameter=f"{where}.{section}")
        out[kind] = [CatalogEntry.from_dict(row, kind=kind, where=f"{where}, {section}[{i}]")
                     for i, row in enumerate(rows)]
    return out


def read_catalog_file(path: str | os.PathLike) -> dict[str, list[CatalogEntry]]:
    """Parse and check one catalog file: ``{"model": [...], "hardware": [...]}``.

    Useful to validate a user catalog file; raises ``CatalogError`` naming the file and field.
    """
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidInputTypeError("path", path, "a path to a catalog file (a string or os.PathLike)",
                                    f"got {type(path).__name__}")
    try:
        path = Path(path)
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as err:
        raise CatalogError(f"catalog file {path}: not UTF-8 text: {err}", parameter=str(path)) from None
    except (OSError, ValueError) as err:    # (a path with a NUL byte is a ValueError)
        raise CatalogError(f"catalog file {path}: cannot be read: {err}", parameter=str(path)) from None
    return _parse_file(text, f"catalog file {path}")


@functools.lru_cache(maxsize=None)
def _builtin(kind: str) -> tuple[CatalogEntry, ...]:
    entries = []
    for filename, origin in _BUILTIN_FILES[kind]:
        text = resources.files(__package__).joinpath(filename).read_text(encoding="utf-8")
        provider = f"mlsysim-core built-in catalog ({filename})"
        entries += [_stamp(e, origin, provider) for e in _parse_file(text, provider)[kind]]
    for entry in entries:
        if entry.origin == "reference":
            _PROVENANCE[id(entry.value)] = (entry.value, _provenance_note(entry))
    return tuple(entries)


# id(a reference entry's value) -> (the value, its note). The value is held, so its id is
# not reused while it is here; kept across clear_cache() (objects from before stay reference data).
_PROVENANCE: dict[int, tuple[object, str]] = {}


def _provenance_note(entry: CatalogEntry) -> str:
    counterpart = entry.extra.get("curated_counterpart")
    what, numbers = ("model", " (textbook numbers)") if entry.kind == MODEL else ("hardware", "")
    tail = f"; `{entry.key[len(NAMESPACE):]}` is the curated {counterpart}" if counterpart else ""
    return f"{what}: {entry.key} is mlsysim 0.3.0's reference catalog data{numbers}{tail}"


def provenance_notes(*objects) -> tuple[str, ...]:
    """The notes a result carries for the objects it was built on: one for each model or
    accelerator that is the reference's catalog data (an ``mlsysim:`` entry's own object, as
    ``get_model("mlsysim:llama3-8b")`` returns it; an equal object built by hand has none)."""
    notes = ()
    for obj in objects:
        hit = _PROVENANCE.get(id(obj))
        if hit is not None and hit[0] is obj:
            notes += (hit[1],)
    return notes


def user_catalog_dir() -> Path | None:
    """The user catalog directory: ``$MLSYSIM_CATALOG_DIR`` if set, else
    ``$XDG_CONFIG_HOME/mlsysim-core/catalog`` (``~/.config/...``) if it exists, else ``None``.

    A directory named by the environment variable must exist.
    """
    named = os.environ.get(ENV_CATALOG_DIR, "").strip()
    if named:
        path = Path(named).expanduser()
        if not path.is_dir():
            raise CatalogError(f"{ENV_CATALOG_DIR}={named!r} is not a directory: set it to a directory "
                               "of catalog JSON files, or unset it", parameter=ENV_CATALOG_DIR, value=named)
        return path
    config = os.environ.get("XDG_CONFIG_HOME", "").strip() or os.path.join("~", ".config")
    path = Path(config).expanduser() / "mlsysim-core" / "catalog"
    return path if path.is_dir() else None


_dir_paths: dict = {}     # (env values) -> (named by the variable?, the directory's path as a str)
_listings: dict = {}      # directory path -> (its st_mtime_ns, the paths of its *.json files, sorted)
_RACY_NS = 2_000_000_000  # a directory changed this recently is listed again (coarse timestamps)
# os.environ keeps its variables in a dict (encoded keys and values), updated by every
# assignment to or deletion from os.environ; it is read directly where it is there.
_ENV_RAW = getattr(os.environ, "_data", None)
try:
    _ENV_KEYS = tuple(os.environ.encodekey(k) for k in (ENV_CATALOG_DIR, "XDG_CONFIG_HOME", "HOME"))
except Exception:     # not CPython's os.environ: read it the ordinary way
    _ENV_RAW = None
if not isinstance(_ENV_RAW, dict):
    _ENV_RAW = None


def _user_directory() -> tuple[bool, str]:
    """Where the user catalog would be, from the environment (no file system access):
    (named by $MLSYSIM_CATALOG_DIR?, the directory's path)."""
    key = None
    if _ENV_RAW is not None:     # the environment's own table: three lookups, no decoding
        get = _ENV_RAW.get
        key = (get(_ENV_KEYS[0]), get(_ENV_KEYS[1]), get(_ENV_KEYS[2]))
        found = _dir_paths.get(key)
        if found is not None:
            return found
    environ = os.environ
    named = environ.get(ENV_CATALOG_DIR, "").strip()
    if named:
        found = (True, str(Path(named).expanduser()))
    else:
        config = environ.get("XDG_CONFIG_HOME", "").strip() or os.path.join("~", ".config")
        found = (False, str(Path(config).expanduser() / "mlsysim-core" / "catalog"))
    if key is not None:
        if len(_dir_paths) > 64:
            _dir_paths.clear()
        _dir_paths[key] = found
    return found


def _scan(directory: str, mtime_ns: int) -> tuple[str, ...]:
    paths = tuple(item.path for item in sorted(os.scandir(directory), key=lambda e: e.name)
                  if item.name.endswith(".json") and item.is_file())
    _listings[directory] = (mtime_ns, paths)
    return paths


def _user_signature() -> tuple:
    """``(path, mtime_ns, size)`` of every ``*.json`` file in the user catalog directory.

    Looked up on every catalog lookup, so it is cheap: the directory's listing is kept
    while the directory's own mtime is unchanged (adding, removing or renaming a file
    changes it; a directory changed in the last two seconds is listed again, for file
    systems with coarse timestamps), and each listed file is stat'ed (an edit in place
    changes its mtime or size). A directory created or removed is noticed at once."""
    named, directory = _user_directory()
    try:
        st = os.stat(directory)
    except OSError:
        st = None
    if st is None or not stat.S_ISDIR(st.st_mode):
        if named:
            user_catalog_dir()      # raises the error that explains it
        return ()
    mtime = st.st_mtime_ns
    listed = _listings.get(directory)
    if listed is not None and listed[0] == mtime and time.time_ns() - mtime > _RACY_NS:
        paths = listed[1]
    else:
        paths = _scan(directory, mtime)
    files = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            info = None
        if info is None or not stat.S_ISREG(info.st_mode):     # changed under us: list it again
            _listings.pop(directory, None)
            return _user_signature()
        files.append((path, info.st_mtime_ns, info.st_size))
    return tuple(files)


@functools.lru_cache(maxsize=8)
def _user_entries(signature: tuple) -> dict[str, tuple[CatalogEntry, ...]]:
    out: dict[str, list[CatalogEntry]] = {MODEL: [], HARDWARE: []}
    for path, _, _ in signature:
        provider = f"user catalog file {path}"
        for kind, entries in read_catalog_file(path).items():
            out[kind] += [_stamp(e, "user", provider) for e in entries]
    return {kind: tuple(entries) for kind, entries in out.items()}


# --- plugins ------------------------------------------------------------------------------

_plugin_cache: "weakref.WeakKeyDictionary[PluginManager, dict]" = weakref.WeakKeyDictionary()


def _hook_signature(pm, kind: str) -> tuple:
    from ..hookspecs import CATALOG_HOOKS
    caller = getattr(pm.hook, CATALOG_HOOKS[kind], None)
    if caller is None:
        return ()
    return tuple(sorted((impl.plugin_name, id(impl.function)) for impl in caller.get_hookimpls()))


def _plugin_entries(pm, kind: str) -> tuple[CatalogEntry, ...]:
    """The entries a manager's plugins add, collected once per manager (and plugin set)."""
    signature = _hook_signature(pm, kind)
    cached = _plugin_cache.setdefault(pm, {}).get(kind)
    if cached is not None and cached[0] == signature:
        return cached[1]
    entries = _collect(pm, kind) if signature else ()
    _plugin_cache[pm][kind] = (signature, entries)
    return entries


def _collect(pm, kind: str) -> tuple[CatalogEntry, ...]:
    from ..hookspecs import CATALOG_HOOKS
    hook = CATALOG_HOOKS[kind]
    expected = "a TransformerWorkload" if kind == MODEL else "a HardwareNode"
    entries = []
    for impl in sorted(getattr(pm.hook, hook).get_hookimpls(), key=lambda i: i.plugin_name):
        info = pm.info(impl.plugin_name) if hasattr(pm, "info") else None
        label = info.describe() if info else f"plugin '{impl.plugin_name}'"
        source = info.source if info else None

        def fail(message, _label=label, _name=impl.plugin_name, _source=source):
            return PluginContractError(f"{_label} hook {hook} {message}", plugin=_name, source=_source, hook=hook)

        if impl.wrapper or impl.hookwrapper:
            raise fail("is a wrapper; catalog hooks return entries and cannot be wrappers")
        try:
            result = impl.function()
            items = [] if result is None else result
            if isinstance(items, (str, bytes, Mapping, CatalogEntry)) or not isinstance(items, Iterable):
                raise fail(f"returned {type(result).__name__}; expected a list of CatalogEntry")
            items = list(items)     # a generator runs plugin code here
        except PluginContractError:
            raise
        except Exception as err:
            raise fail(f"raised {type(err).__name__}: {err}") from err
        for item in items:
            if not isinstance(item, CatalogEntry):
                tip = " (build one with CatalogEntry.from_dict(row))" if isinstance(item, Mapping) else ""
                raise fail(f"returned {type(item).__name__} {item!r}; expected a CatalogEntry{tip}")
            if item.kind != kind:
                raise fail(f"returned entry {item.key!r} whose value is a {type(item.value).__name__}; "
                           f"expected {expected}")
            entries.append(_stamp(item, "plugin", label, plugin=impl.plugin_name))
    return tuple(entries)


# --- tables -------------------------------------------------------------------------------


@attrs.frozen
class _Table:
    entries: tuple[CatalogEntry, ...]
    index: Mapping[str, CatalogEntry]
    # compact form (no separators) of every name and of every name's part after its
    # "vendor/" -> the entries, each with the name that gave it
    fuzzy: Mapping[str, tuple[tuple[str, CatalogEntry], ...]] = attrs.field(factory=dict)


def _index(entries: Iterable[CatalogEntry], kind: str) -> _Table:
    entries = tuple(entries)
    claims: dict[str, list[tuple[str, CatalogEntry]]] = defaultdict(list)
    for entry in entries:
        for name in entry.names:
            norm = normalise(name)
            if not any(e is entry for _, e in claims[norm]):
                claims[norm].append((name, entry))
    for norm, claimants in claims.items():
        if len(claimants) > 1:
            who = "; ".join(f"{e.provided_by or 'unknown'} (key {e.key!r}, as {n!r})" for n, e in claimants)
            message = (f"{kind} catalog: the name {norm!r} is claimed by more than one entry: {who}. "
                       "Rename the key or alias in one of them")
            plugins = [e for _, e in claimants if e.origin == "plugin"]
            if plugins:
                from ..hookspecs import CATALOG_HOOKS
                raise PluginConflictError(message + " (or block the plugin with MLSYSIM_DISABLED_PLUGINS)",
                                          plugin=plugins[-1].extra.get("plugin"), hook=CATALOG_HOOKS[kind])
            raise CatalogError(message, parameter=f"{kind} name", value=norm)
    fuzzy: dict[str, list[tuple[str, CatalogEntry]]] = defaultdict(list)
    for norm, claimants in claims.items():
        entry = claimants[0][1]
        tail = _tail(norm)
        for form in (norm, tail):
            if form is None:
                continue
            bucket = fuzzy[_compact(form)]
            if not any(e is entry for _, e in bucket):
                bucket.append((claimants[0][0], entry))
    return _Table(entries, {norm: claimants[0][1] for norm, claimants in claims.items()},
                  {form: tuple(found) for form, found in fuzzy.items()})


@functools.lru_cache(maxsize=16)
def _static_table(kind: str, user_signature: tuple) -> _Table:
    return _index((*_builtin(kind), *_user_entries(user_signature)[kind]), kind)


_full_cache: dict = {}


def _full_table(kind: str, pm) -> _Table:
    user = _user_signature()
    static = _static_table(kind, user)
    plugin_entries = _plugin_entries(pm, kind)
    if not plugin_entries:
        return static
    cache_key = (kind, user, id(plugin_entries))
    cached = _full_cache.get(cache_key)
    if cached is not None and cached[0] is plugin_entries:
        return cached[1]
    if len(_full_cache) > 32:
        _full_cache.clear()
    table = _index((*static.entries, *plugin_entries), kind)
    _full_cache[cache_key] = (plugin_entries, table)   # holds the tuple: its id stays unique
    return table


def _manager(plugin_manager):
    if plugin_manager is not None:
        return plugin_manager
    from ..manager import get_plugin_manager
    return get_plugin_manager()


def clear_cache() -> None:
    """Forget every parsed file and collected plugin entry (they are re-read on next use)."""
    _builtin.cache_clear()
    _user_entries.cache_clear()
    _static_table.cache_clear()
    _plugin_cache.clear()
    _full_cache.clear()
    _listings.clear()
    _dir_paths.clear()


# --- lookups ------------------------------------------------------------------------------


def _find(kind: str, name: object, plugin_manager, command: str) -> CatalogEntry:
    if not isinstance(name, str):
        raise InvalidInputTypeError(kind, name, f"a catalog name (see `mlsysim-core {command}`)")
    norm = normalise(name)
    entry = _static_table(kind, _user_signature()).index.get(norm)
    if entry is not None:
        return entry
    table = _full_table(kind, _manager(plugin_manager))
    entry = table.index.get(norm)
    if entry is not None:
        return entry
    found = table.fuzzy.get(_compact(norm), ()) if norm else ()
    if len(found) == 1:
        return found[0][1]
    if found:
        which = ", ".join(f"{e.key} (as {n!r})" if normalise(n) != e.key else e.key for n, e in found)
        raise InvalidInputError(kind, name, f"a name that means one entry; {name!r} could be any of: "
                                            f"{which}: give one of those names")
    keys = [e.key for e in table.entries]
    close = _close_keys(norm, table)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise InvalidInputError(kind, name, f"{hint}one of: {', '.join(keys)} "
                                        f"(or an alias: `mlsysim-core {command} --json` lists them)")


_MAX_SUGGESTIONS = 6


def _close_keys(norm: str, table: _Table) -> list[str]:
    """The keys of the entries whose names are closest to ``norm``: first those with a name
    that begins with it (``h10``: the H100s), then the most similar names; names are
    compared without separators, whole and without their ``vendor/``, ``owner/`` or
    ``mlsysim:`` prefix (``l40`` finds ``nvidia/l40s``, ``rtx4009`` ``nvidia/rtx-4090``).
    Curated, user and plugin entries come before the reference's ``mlsysim:`` ones."""
    keys = _prefixed_keys(norm, table) + _similar_keys(norm, table)
    return list(dict.fromkeys(keys))[:_MAX_SUGGESTIONS]


def _bare(form: str) -> str:
    """A name without its ``vendor/`` part and ``mlsysim:`` namespace."""
    form = form.rsplit("/", 1)[-1]
    return form[len(NAMESPACE):] if form.startswith(NAMESPACE) else form


def _prefixed_keys(norm: str, table: _Table) -> list[str]:
    """Keys of the entries one of whose names begins with ``norm`` (whole, or without its
    prefix), compared without separators; nothing for fewer than two characters."""
    short, bare_short = _compact(norm), _compact(_bare(norm))
    if len(bare_short) < 2:
        return []
    found = []
    for form, entries in table.fuzzy.items():
        bare = _bare(form)
        if form.startswith(short) or bare.startswith(bare_short):
            found += [(e.key.startswith(NAMESPACE), len(bare), e.key) for _, e in entries]
    return [key for *_, key in sorted(found)]


def _similar_keys(norm: str, table: _Table, cutoff: float = 0.8) -> list[str]:
    """Keys of the entries with a name similar to ``norm`` (difflib ratio at least ``cutoff``,
    whole or without prefixes, without separators), the most similar first."""
    whole, bare = _compact(norm), _compact(_bare(norm))
    scored = []
    for form, entries in table.fuzzy.items():
        best = 0.0
        for query, name in ((whole, form), (bare, _bare(form))):
            matcher = difflib.SequenceMatcher(None, query, name)
            if matcher.real_quick_ratio() >= cutoff and matcher.quick_ratio() >= cutoff:
                best = max(best, matcher.ratio())
        if best >= cutoff:
            scored += [(-best, e.key.startswith(NAMESPACE), e.key) for _, e in entries]
    return [key for *_, key in sorted(scored)]


def find_model(name: str, *, plugin_manager: "PluginManager | None" = None) -> CatalogEntry:
    """The ``CatalogEntry`` of a model, by key, alias or display name."""
    return _find(MODEL, name, plugin_manager, "models")


def find_hardware(name: str, *, plugin_manager: "PluginManager | None" = None) -> CatalogEntry:
    """The ``CatalogEntry`` of an accelerator, by key, alias or display name."""
    return _find(HARDWARE, name, plugin_manager, "hardware")


def alias_note(kind: str, name: str, *, plugin_manager: "PluginManager | None" = None) -> str | None:
    """What a short name means when that is not what people usually mean by it, else ``None``.

    ``kind`` is ``"model"`` or ``"hardware"``; ``name`` is looked up as ``find_model`` /
    ``find_hardware`` do (an unknown name raises the same error). The note comes from the
    entry's ``alias_notes`` (a name of the entry -> the note), matched without case or
    separators: ``alias_note("model", "gpt2")`` is "'gpt2' is GPT-2 XL (1.5B parameters,
    openai-community/gpt2-xl); the 124M GPT-2 is 'gpt2-small' (openai-community/gpt2)".
    """
    if kind not in (MODEL, HARDWARE):
        raise InvalidInputError("kind", kind, "'model' or 'hardware'")
    entry = _find(kind, name, plugin_manager, "models" if kind == MODEL else "hardware")
    notes = entry.extra.get("alias_notes")
    if not notes:
        return None
    given = _compact(normalise(name))
    for alias, note in notes.items():
        if _compact(normalise(alias)) == given:
            return note
    return None


def get_model(name: str, *, plugin_manager: "PluginManager | None" = None) -> TransformerWorkload:
    """A catalog model by name, e.g. ``get_model("llama3-8b")``."""
    return find_model(name, plugin_manager=plugin_manager).value


def get_hardware(name: str, *, plugin_manager: "PluginManager | None" = None) -> HardwareNode:
    """A catalog accelerator by name, e.g. ``get_hardware("h100")``."""
    return find_hardware(name, plugin_manager=plugin_manager).value


def list_models(*, plugin_manager: "PluginManager | None" = None,
                plugins: bool = True) -> tuple[CatalogEntry, ...]:
    """Every model entry: reference, curated, user, then plugin entries (``plugins=False``
    leaves those out and loads no plugin)."""
    if not plugins:
        return _static_table(MODEL, _user_signature()).entries
    return _full_table(MODEL, _manager(plugin_manager)).entries


def list_hardware(*, plugin_manager: "PluginManager | None" = None,
                  plugins: bool = True) -> tuple[CatalogEntry, ...]:
    """Every accelerator entry, in the same order as ``list_models()``."""
    if not plugins:
        return _static_table(HARDWARE, _user_signature()).entries
    return _full_table(HARDWARE, _manager(plugin_manager)).entries
