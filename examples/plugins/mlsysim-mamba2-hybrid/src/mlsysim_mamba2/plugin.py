"""The plugin module (entry point ``mamba2_hybrid`` in the ``mlsysim_core`` group).

Two hooks: the measured profile's ``mlsysim_measured_architectures`` (the Bamba family,
``family.BAMBA``) and mlsysim-core's ``mlsysim_catalog_models`` (Bamba-9B and the two validation
shapes, ``catalog.py``). Both import their modules when called, so loading the plugin stays cheap.
"""

from __future__ import annotations

from mlsysim_core import hookimpl


@hookimpl
def mlsysim_measured_architectures():
    from .family import BAMBA
    return [BAMBA]


@hookimpl
def mlsysim_catalog_models():
    from .catalog import entries
    return entries()
