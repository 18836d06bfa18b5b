"""mlsysim-zeropp-hpz: ZeRO++ hierarchical partitioning (hpZ) as an mlsysim-core plugin.

The plugin module is :mod:`mlsysim_zeropp_hpz.hpz`, declared under the ``mlsysim_core``
entry-point group as ``zeropp_hpz``; it registers the data-parallel rule ``zeropp.hpz``.
"""

__version__ = "0.1.0"
