"""The repository's scripts that are not packages (validation/, tools/, docs/examples/, examples/...), loaded by
their path for the tests: ``load_script("validation/lora_parallel/compare_tp.py")`` is that script's module.

Several scripts share a file name (validation/compile/compare.py and validation/parallel/compare.py, ...), so
none is imported by its bare name from ``sys.path``: each becomes a module named after its whole path
(``script_validation__lora_parallel__compare_tp``), put in ``sys.modules`` before it runs (as ``import`` does, so
that dataclasses, attrs and ``typing`` find the module of what it defines), and run once: every test that loads
the same path gets the same module."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def _file(path: str | Path) -> Path:
    file = (ROOT / path).resolve()
    if file.suffix != ".py" or not file.is_file() or not file.is_relative_to(ROOT):
        raise FileNotFoundError(f"load_script: path={str(path)!r} is not a .py file in the repository ({ROOT}); "
                                "give it relative to the repository root, e.g. 'validation/report.py'")
    return file


def script_name(path: str | Path) -> str:
    """The module name a script is loaded under: ``script_`` and its path from the root, folders joined by
    ``__`` (``validation/report.py`` -> ``script_validation__report``)."""
    parts = _file(path).relative_to(ROOT).with_suffix("").parts
    return "script_" + "__".join(re.sub(r"\W", "_", part) for part in parts)


def load_script(path: str | Path) -> ModuleType:
    """The module of the script at ``path`` (relative to the repository root, or absolute inside it), run the first
    time it is asked for; a script that raises while it runs is not kept (the next call runs it again)."""
    file = _file(path)
    name = script_name(file)
    module = sys.modules.get(name)
    if module is not None:
        if Path(module.__file__).resolve() != file:
            raise ImportError(f"load_script: {file} and {module.__file__} both map to the module name {name!r}")
        return module
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
