"""mlsysim-adam-mini: the Adam-mini optimizer (Zhang et al. 2024) as an mlsysim-core plugin.

The plugin module is :mod:`mlsysim_adam_mini.adam_mini`, declared under the
``mlsysim_core`` entry-point group as ``adam_mini``; it registers the optimizer
``adammini.adam-mini``.
"""

__version__ = "0.1.0"
