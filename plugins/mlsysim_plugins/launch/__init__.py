"""Launch-config readers (``mlsysim-core estimate --from FILE``): one plugin module per
framework, each registering its formats through ``mlsysim_launch_formats`` (docs/launch.md).
Every public module here is a built-in plugin, entry point ``launch_<module>``; ``_common``
holds what the readers share."""
