"""The measured profile: architecture-aware, phase by phase, validated against memory that
PyTorch measures (``validation/``, ``docs/validation.md``). A plugin subpackage of the
project's own distribution, found through the same entry-point group as every plugin.

Its plugin modules (entry-point name -> module of this package) are below; the rest of
the package is the physics they share, imported on a measured solve's first use.
"""

PLUGIN_MODULES = {
    "measured_architectures": "architectures",
    "measured_families": "families",
    "measured_kernels": "kernels",
    "measured_profile": "profile",
    "measured_regimes": "regimes",
    "measured_schedules": "schedules",
    "measured_techniques": "builtin_techniques",
}
