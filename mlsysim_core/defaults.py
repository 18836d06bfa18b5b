"""The command line's defaults and ``estimate()``, which live with ``Scenario`` (``mlsysim_core.scenario``)."""

from .scenario import DEFAULT_BATCH, DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_PROFILE, estimate  # noqa: F401
