"""Lazy imports for the built-in plugins (a helper, not a plugin).

The measured profile's modules (``mlsysim_core.measured.*``, ~30 ms to import) are needed
only when a measured-grade solve runs. Plugins that offer a measured-grade function next
to their reference one bind them with ``name = lazy_module(globals(), "name", "module")``:
the global is a stand-in that imports the module on its first attribute read and then puts the
module itself in its place, so later reads cost what any global read costs.

(The stand-in answers no dunder attribute: pluggy inspects every global of a plugin
module when it registers it, which must not import anything.)
"""

from __future__ import annotations

import importlib


class _Deferred:
    __slots__ = ("_namespace", "_global", "_module")

    def __init__(self, namespace: dict, name: str, module: str):
        self._namespace, self._global, self._module = namespace, name, module

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        module = importlib.import_module(self._module)
        if self._namespace.get(self._global) is self:
            self._namespace[self._global] = module
        return getattr(module, attr)

    def __repr__(self) -> str:
        return f"<module {self._module!r}, imported on first use>"


def lazy_module(namespace: dict, name: str, module: str):
    """``model = lazy_module(globals(), "model", "mlsysim_plugins.measured.model")``: the
    module, imported on first use (at once if it is imported already)."""
    import sys
    loaded = sys.modules.get(module)
    return loaded if loaded is not None else _Deferred(namespace, name, module)
