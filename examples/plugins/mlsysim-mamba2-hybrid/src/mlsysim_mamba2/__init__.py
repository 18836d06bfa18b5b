"""mlsysim-mamba2-hybrid: Mamba-2 + attention hybrids (transformers' ``bamba``) for mlsysim-core's
measured profile.

* :mod:`mlsysim_mamba2.plugin` -- the plugin (entry point ``mamba2_hybrid``): registers the
  architecture family ``mamba2.bamba`` and adds ``ibm-fms/bamba-9b`` (``bamba-9b``) and the two
  validation shapes to the catalog;
* :mod:`mlsysim_mamba2.workload` -- ``BambaWorkload``, a ``TransformerWorkload`` with the Mamba-2 fields;
* :mod:`mlsysim_mamba2.family` -- the ``ArchitectureFamily`` (the mean layer, tensor-parallel splits);
* :mod:`mlsysim_mamba2.layer_bytes` -- the closed forms (pure Python), checked against PyTorch.
"""

__version__ = "0.1.0"


def __getattr__(name):     # BambaWorkload without importing it (and mlsysim_core) at package import
    if name == "BambaWorkload":
        from .workload import BambaWorkload
        return BambaWorkload
    raise AttributeError(name)
