"""Scenario files: one solve, written down (JSON, or TOML on Python 3.11+).

A scenario names everything ``solve`` takes, so a configuration can be versioned,
shared, and re-run from Python (``Scenario.load(path).solve()``) or the CLI
(``mlsysim-core estimate --scenario path``). Plugin options round-trip: what a
plugin's options class unstructures to is what the file holds.

    {"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "seq_len": 1024,
     "zero_stage": 1, "dp_size": 8,
     "plugin_options": {"demo.hpz": {"secondary_group": 4}}}

``model`` is a catalog name, an object of ``TransformerWorkload`` fields, or a Hugging
Face ``config.json`` object (recognised by its ``model_type``); ``hardware`` a catalog
name or an object of ``HardwareNode`` fields.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs

from .errors import InvalidInputError

SOLVE_FIELDS = ("batch_size", "seq_len", "precision", "optimizer", "activation_checkpointing",
                "tp_size", "pp_size", "dp_size", "ep_size", "zero_stage",
                "gradient_accumulation_steps", "trainable_fraction", "communication_buffer_fraction")
KEYWORD_FIELDS = ("sequence_parallel", "data_parallel", "sharding_rules", "plugin_options",
                  "include_plugins", "profile", "cp_size")
# Measured-grade profiles only; passed to solve only when set.
MEASURED_FIELDS = ("regime", "optimizer_impl", "attention", "dropout", "checkpointed_layers",
                   "runtime_overheads", "pipeline_schedule", "virtual_stages", "expert_tp_size", "stage_layers",
                   "offload", "moe_capacity_factor", "lora")


@attrs.frozen(kw_only=True)
class Scenario:
    """Every argument of one ``solve``; defaults are ``solve``'s own."""

    model: str | dict[str, Any]
    hardware: str | dict[str, Any]
    batch_size: int
    seq_len: int = 2048
    precision: str = "fp16"
    optimizer: str = "adam"
    activation_checkpointing: str = "selective"
    tp_size: int = 1
    pp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    zero_stage: int = 0
    gradient_accumulation_steps: int = 1
    trainable_fraction: float = 1.0
    communication_buffer_fraction: float = 0.05
    sequence_parallel: bool = True
    data_parallel: str | None = None
    sharding_rules: dict[str, str] = attrs.field(factory=dict)
    plugin_options: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    include_plugins: list[str] = attrs.field(factory=list)
    profile: str | None = None          # None: the TrainingMemoryModel's own profile
    cp_size: int = 1
    # Measured-grade profiles (see TrainingMemoryModel.solve): None means the default.
    regime: str | None = None
    optimizer_impl: str | None = None
    attention: str | None = None
    dropout: float | None = None
    checkpointed_layers: int | None = None
    runtime_overheads: bool | dict[str, Any] | None = None
    pipeline_schedule: str | None = None
    virtual_stages: int | None = None
    expert_tp_size: int | None = None
    stage_layers: list[int] | None = None
    offload: str | list[str] | dict[str, str] | None = None
    moe_capacity_factor: float | None = None
    lora: dict[str, Any] | None = None  # mlsysim_core.finetune.LoRAConfig fields (LoRA / QLoRA)
    description: str = ""

    # --- reading and writing ------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "scenario") -> "Scenario":
        if not isinstance(data, dict):
            raise InvalidInputError(where, data, "a table/object of solve arguments")
        allowed = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(data) - allowed)
        if unknown:
            raise InvalidInputError(where, ", ".join(unknown), f"known fields: {', '.join(sorted(allowed))}",
                                    "unknown field(s)")
        missing = [name for name in ("model", "hardware", "batch_size") if name not in data]
        if missing:
            raise InvalidInputError(where, ", ".join(missing), "model, hardware and batch_size are required",
                                    "missing field(s)")
        # Values are checked by solve() itself, with the same messages as from Python.
        return cls(**data)

    @classmethod
    def load(cls, path: str | Path) -> "Scenario":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as err:
            raise InvalidInputError("scenario", str(path), "a readable .json or .toml file", str(err)) from err
        if path.suffix.lower() == ".toml":
            try:
                import tomllib
            except ImportError as err:  # Python 3.10
                raise InvalidInputError("scenario", str(path), "a .json file (TOML needs Python 3.11+)") from err
            try:
                data = tomllib.loads(text)
            except tomllib.TOMLDecodeError as err:
                raise InvalidInputError("scenario", str(path), "valid TOML", str(err)) from err
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as err:
                raise InvalidInputError("scenario", str(path), "valid JSON", str(err)) from err
        return cls.from_dict(data, where=f"scenario {path.name}")

    def to_dict(self) -> dict:
        data = attrs.asdict(self)
        return {k: v for k, v in data.items() if v not in (None, {}, [], "") or k in ("model", "hardware")}

    def dump(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    # --- solving ----------------------------------------------------------------------------

    def resolve_model(self):
        if isinstance(self.model, dict) and "model_type" in self.model:   # a Hugging Face config.json
            from .hf import from_hf_config
            return from_hf_config(self.model)
        if isinstance(self.model, dict):
            from .serialization import structure_model
            try:
                return structure_model(self.model)
            except TypeError as err:
                raise InvalidInputError("scenario.model", self.model, "name, parameters and layers at least",
                                        str(err)) from err
        return self.model

    def resolve_hardware(self):
        if isinstance(self.hardware, dict):
            from .types import HardwareNode
            allowed = {f.name for f in attrs.fields(HardwareNode)}
            unknown = sorted(set(self.hardware) - allowed)
            if unknown:
                raise InvalidInputError("scenario.hardware", self.hardware,
                                        f"known fields: {', '.join(sorted(allowed))}", "unknown field(s)")
            try:
                return HardwareNode(**self.hardware)
            except TypeError as err:
                raise InvalidInputError("scenario.hardware", self.hardware,
                                        "name and memory_capacity (bytes) at least", str(err)) from err
        return self.hardware

    def solve_kwargs(self) -> dict:
        kwargs = {name: getattr(self, name) for name in SOLVE_FIELDS}
        kwargs.update({name: getattr(self, name) for name in KEYWORD_FIELDS})
        kwargs["sharding_rules"] = kwargs["sharding_rules"] or None
        kwargs["plugin_options"] = kwargs["plugin_options"] or None
        kwargs["include_plugins"] = tuple(kwargs["include_plugins"])
        kwargs.update({name: getattr(self, name) for name in MEASURED_FIELDS if getattr(self, name) is not None})
        return kwargs

    def solve(self, model=None):
        """Solve this scenario (with ``model``, a ``TrainingMemoryModel``, if given)."""
        from .solver import TrainingMemoryModel
        solver = model or TrainingMemoryModel()
        return solver.solve(self.resolve_model(), self.resolve_hardware(), **self.solve_kwargs())
