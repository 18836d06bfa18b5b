"""The built-in catalog of models and accelerators, shipped as JSON data files.

Every number of the reference catalog (mlsysim 0.3.0: every language model, every
Cloud and Workstation accelerator) is here unchanged; where public configs give more
architecture detail, it is recorded with its source. Names are looked up
case-insensitively, with ``_`` and spaces treated as ``-`` (``Llama3_8B`` finds
``llama3-8b``). Files are parsed lazily, once, on first lookup.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from importlib import resources
from typing import Mapping

import attrs

from ..errors import InvalidInputError, InvalidInputTypeError
from ..types import HardwareNode, SparseTransformerWorkload, TransformerWorkload

_MODEL_FIELDS = {f.name for f in attrs.fields(SparseTransformerWorkload)}
_HARDWARE_FIELDS = {f.name for f in attrs.fields(HardwareNode)}


@attrs.frozen(kw_only=True)
class CatalogEntry:
    """One catalog entry: its short key, aliases, the object, and where its numbers come from."""

    key: str
    aliases: tuple[str, ...]
    value: TransformerWorkload | HardwareNode
    sources: Mapping[str, str]
    extra: Mapping[str, object]     # everything else the data file records (tier, notes, ...)


def normalise(name: str) -> str:
    return re.sub(r"[\s_]+", "-", name.strip().lower())


def _read(filename: str) -> dict:
    return json.loads(resources.files(__package__).joinpath(filename).read_text(encoding="utf-8"))


def _index(entries: list[CatalogEntry], what: str) -> dict[str, CatalogEntry]:
    index: dict[str, CatalogEntry] = {}
    for entry in entries:
        for name in (entry.key, *entry.aliases, entry.value.name):
            norm = normalise(name)
            other = index.get(norm)
            if other is not None and other is not entry:
                raise ValueError(f"{what} catalog: name {name!r} is claimed by both "
                                 f"{other.key!r} and {entry.key!r}")
            index[norm] = entry
    return index


def _model_entry(row: dict) -> CatalogEntry:
    kind = row["kind"]
    cls = {"transformer": TransformerWorkload, "sparse_transformer": SparseTransformerWorkload}[kind]
    allowed = {f.name for f in attrs.fields(cls)}
    fields = {k: v for k, v in row.items() if k in allowed and v is not None}
    extra = {k: v for k, v in row.items()
             if k not in _MODEL_FIELDS and k not in ("key", "aliases", "sources", "kind")}
    return CatalogEntry(key=row["key"], aliases=tuple(row.get("aliases", ())), value=cls(**fields),
                        sources=row.get("sources", {}), extra={"kind": kind, **extra})


def _hardware_entry(row: dict) -> CatalogEntry:
    fields = {k: v for k, v in row.items() if k in _HARDWARE_FIELDS and v is not None}
    extra = {k: v for k, v in row.items() if k not in _HARDWARE_FIELDS and k not in ("key", "aliases", "sources")}
    return CatalogEntry(key=row["key"], aliases=tuple(row.get("aliases", ())), value=HardwareNode(**fields),
                        sources=row.get("sources", {}), extra=extra)


@functools.lru_cache(maxsize=None)
def _models() -> tuple[tuple[CatalogEntry, ...], dict[str, CatalogEntry]]:
    entries = [_model_entry(row) for row in _read("models.json")["models"]]
    return tuple(entries), _index(entries, "model")


@functools.lru_cache(maxsize=None)
def _hardware() -> tuple[tuple[CatalogEntry, ...], dict[str, CatalogEntry]]:
    entries = [_hardware_entry(row) for row in _read("hardware.json")["hardware"]]
    return tuple(entries), _index(entries, "hardware")


def _find(parameter: str, name: object, table, command: str) -> CatalogEntry:
    entries, index = table()
    if not isinstance(name, str):
        raise InvalidInputTypeError(parameter, name, f"a catalog name (see `mlsysim-core {command}`)")
    entry = index.get(normalise(name))
    if entry is None:
        keys = [e.key for e in entries]
        close = difflib.get_close_matches(normalise(name), list(index), n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(dict.fromkeys(index[c].key for c in close))}? " if close else ""
        raise InvalidInputError(parameter, name, f"{hint}one of: {', '.join(keys)} "
                                                 f"(or an alias: `mlsysim-core {command} --json` lists them)")
    return entry


def find_model(name: str) -> CatalogEntry:
    return _find("model", name, _models, "models")


def find_hardware(name: str) -> CatalogEntry:
    return _find("hardware", name, _hardware, "hardware")


def get_model(name: str) -> TransformerWorkload:
    """A catalog model by short name, e.g. ``get_model("llama3-8b")``."""
    return find_model(name).value


def get_hardware(name: str) -> HardwareNode:
    """A catalog accelerator by short name, e.g. ``get_hardware("h100")``."""
    return find_hardware(name).value


def list_models() -> tuple[CatalogEntry, ...]:
    return _models()[0]


def list_hardware() -> tuple[CatalogEntry, ...]:
    return _hardware()[0]
