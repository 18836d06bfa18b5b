"""mlsysim-activation-offload: activation offloading to host memory as an mlsysim-core plugin.

The plugin module is :mod:`mlsysim_activation_offload.offload`, declared under the
``mlsysim_core`` entry-point group as ``activation_offload``; it registers the
checkpointing strategy ``offload.selective-offload``.
"""

__version__ = "0.1.0"
