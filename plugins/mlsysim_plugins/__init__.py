"""mlsysim-core's built-in plugins.

Each module is one plugin, declared in mlsysim-core's ``pyproject.toml`` under the
``mlsysim_core`` entry-point group, exactly as a third-party package declares its own.
Modules whose names start with ``_`` are shared helpers, not plugins.
"""
