"""Launch-config readers (``mlsysim-core estimate --from FILE``): one plugin module per
framework, each registering its formats through ``mlsysim_launch_formats`` (docs/launch.md).
Every public module here is a built-in plugin, entry point ``launch_<module>``; ``_common``
holds what the readers share.

This package is itself a plugin (entry point ``launch``): it adds the hook and its spec,
``LaunchFormatSpec``, which a third-party reader imports from here with the reading types
(``from mlsysim_plugins.launch import LaunchFormatSpec, LaunchReading, LaunchField, ...``)."""

from __future__ import annotations

from mlsysim_core import hookimpl
from mlsysim_core.scenario import LaunchContext, LaunchDefault, LaunchField, LaunchReading

from . import hookspecs
from .hookspecs import HOOK, LaunchFormatSpec

__all__ = ["HOOK", "LaunchContext", "LaunchDefault", "LaunchField", "LaunchFormatSpec", "LaunchReading"]


@hookimpl
def mlsysim_addhooks(pluginmanager):
    pluginmanager.add_hookspecs(hookspecs)
