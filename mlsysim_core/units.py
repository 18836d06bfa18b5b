"""The size and bandwidth reader, ``mlsysim_core.catalog.units`` (what the catalog's files and the CLI read)."""

from .catalog.units import BYTE_UNITS, parse_bandwidth, parse_bytes  # noqa: F401 (re-exported)
