"""The command line's defaults, and ``estimate()``: the CLI's `estimate` in Python.

``TrainingMemoryModel()`` keeps the reference package's contract (the ``reference``
profile by default). ``estimate()`` answers as the command line does: the ``measured``
profile unless ``profile`` says otherwise, Llama-3.1-8B on an H100 at global batch 8 when
nothing is given, and a run the profile does not model refused (``NotModelledError``),
never answered by another profile.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

DEFAULT_MODEL = "llama3-8b"
DEFAULT_HARDWARE = "h100"
DEFAULT_BATCH = 8
DEFAULT_PROFILE = "measured"     # every command's, unless --profile or the scenario names one


def estimate(model: Any = DEFAULT_MODEL, hardware: Any = DEFAULT_HARDWARE, batch_size: int = DEFAULT_BATCH,
             seq_len: int = 2048, *, profile: str = DEFAULT_PROFILE, plugin_manager=None, **solve_options):
    """``mlsysim-core estimate`` in Python: a ``TrainingMemoryResult``.

    ``model``: a catalog name, a model's JSON file, a Hugging Face ``config.json`` (or the
    folder holding it), or a ``TransformerWorkload``; ``hardware``: a catalog name, a JSON
    file or a ``HardwareNode``. ``batch_size`` is the GLOBAL batch, which must be a whole
    number of micro-batches over ``dp_size`` x ``gradient_accumulation_steps`` (as the CLI
    asks; ``solve`` does too). ``solve_options``: every other keyword of
    ``TrainingMemoryModel.solve`` (``precision``, ``tp_size``, ``zero_stage``, the measured
    profile's ``regime``, ``lora``, ...). ``profile="reference"`` for the textbook
    estimate: ``TrainingMemoryModel().solve`` with the same arguments.
    """
    from ._checks import whole_microbatches
    from .solver import TrainingMemoryModel
    sizes = (batch_size, solve_options.get("dp_size", 1), solve_options.get("gradient_accumulation_steps", 1))
    if all(type(n) is int and n >= 1 for n in sizes):      # (else the solve names the bad one)
        whole_microbatches(*sizes)
    solver = TrainingMemoryModel(profile, plugin_manager=plugin_manager)
    return solver.solve(_model(model), _hardware(hardware), batch_size, seq_len, **solve_options)


def _model(value):
    """Catalog names, model files and checkpoint folders as the CLI reads them; objects as they are."""
    from .cli import _model as read
    return _read(value, read, "model")


def _hardware(value):
    from .cli import _hardware as read
    return _read(value, read, "hardware")


def _read(value, read, parameter: str):
    """A name or path (str or Path) through the CLI's reader, naming ``parameter``; anything else as it is."""
    if isinstance(value, Path):
        value = str(value)
    return read(value, parameter=parameter) if isinstance(value, str) else value
