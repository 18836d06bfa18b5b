"""A plugin world for tests: the built-in plugins (less one, if asked) and a third party registering items
on one hook, as a pip-installed package would."""

from __future__ import annotations

from mlsysim_core import TrainingMemoryModel, hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.registry import PluginInfo

BUILTIN_PM = PluginManager.from_environment(autoload=False, blocked=())


class HookModule:
    """A plugin object with one hook implementation (what a third-party module would be)."""

    def __init__(self, hook: str, items):
        setattr(self, hook, hookimpl(lambda: list(items)))


def world(hook: str, items, *, info: PluginInfo, replace: str | None = None) -> TrainingMemoryModel:
    """The built-ins (less the plugin ``replace``) and the plugin ``info`` registering ``items`` on ``hook``."""
    pm = PluginManager()
    for name, plugin in sorted(BUILTIN_PM.list_name_plugin()):
        if plugin is not None and name != replace:
            pm.register(plugin, name=name, info=BUILTIN_PM.info(name))
    pm.register(HookModule(hook, items), name=info.name, info=info)
    pm.check()
    return TrainingMemoryModel(plugin_manager=pm)
