"""The architecture families beyond the first three (Llama, GPT-2, Mixtral: ``families.py``),
one module per kind of model: Gemma, QK-norm variants, parallel residuals, multi-head
latent attention, the 2025-26 mixtures of experts.

Each module defines ``FAMILIES``, a tuple of ``ArchitectureFamily`` objects, built from the
same pieces a third-party package would use (``families``, ``layers``, ``kernels``); this
package registers them all through ``mlsysim_measured_architectures``, found through the
``mlsysim`` entry-point group like any plugin. A family here that models an architecture as
it is wins over a built-in family that only approximates it (``families.family_for``).
"""

from __future__ import annotations

import importlib
import pkgutil

from mlsysim_core import hookimpl


def family_modules() -> list:
    """This package's family modules, by name."""
    names = sorted(i.name for i in pkgutil.iter_modules(__path__) if not i.name.startswith("_"))
    return [importlib.import_module(f"{__name__}.{name}") for name in names]


@hookimpl
def mlsysim_measured_architectures():
    return [family for module in family_modules() for family in getattr(module, "FAMILIES", ())]
