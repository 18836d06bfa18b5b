"""A third party's launch-format reader for tests: one file read by an in-house format ("myorg.trainer")
whose reading the test gives, registered on a plugin manager of its own, as docs/launch.md's
"Writing a launch-format reader" has it."""

from __future__ import annotations

import types

from mlsysim_core import hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.scenario import from_launch
from mlsysim_plugins.launch import LaunchField, LaunchFormatSpec, LaunchReading

MODEL = LaunchField(key="trainer.model", value="llama3-8b", field="model", becomes="llama3-8b")


def launch_read_by(tmp_path, reading: dict, **given):
    """``(from_launch of run.yaml, its path)``, the reader returning ``LaunchReading(**reading)`` over a
    model field and a single-device world (``reading`` replaces either); ``given``: from_launch's keywords
    beside ``seq_len=1024``."""
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  model: llama3-8b\n")

    def read(p, document, context):
        return LaunchReading(**{"format": "myorg.trainer", "path": str(p), "fields": [MODEL],
                                "world": {"single_device": ("trainer", True)}, **reading})

    plugin = types.ModuleType("myorg_trainer_reader")

    @hookimpl
    def mlsysim_launch_formats():
        return [LaunchFormatSpec(name="myorg.trainer", framework="myorg-trainer", suffixes=(".yaml",),
                                 recognizes=lambda p, d: isinstance(d, dict) and "trainer" in d, read=read)]

    plugin.mlsysim_launch_formats = mlsysim_launch_formats
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(plugin, name="myorg_trainer_reader")
    return from_launch([path], registry=pm.registry, **{"seq_len": 1024, **given}), path
