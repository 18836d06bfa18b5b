"""Scenario files: one solve, written down (JSON, or TOML on Python 3.11+).

A scenario names everything ``solve`` takes, so a configuration can be versioned,
shared, and re-run from Python (``Scenario.load(path).solve()``) or the CLI
(``mlsysim-core estimate --scenario path``). Plugin options round-trip: what a
plugin's options class unstructures to is what the file holds. A profile's own options
(the fields of its ``options_type``: the measured profile's ``regime``, ``lora``, ...) are
top-level fields of the file, held in ``Scenario.profile_options``.

    {"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "seq_len": 1024,
     "zero_stage": 1, "dp_size": 8,
     "plugin_options": {"demo.hpz": {"secondary_group": 4}}}

``model`` is a catalog name, an object of ``TransformerWorkload`` fields, or a Hugging
Face ``config.json`` object (recognised by its ``model_type``); ``hardware`` a catalog
name or an object of ``HardwareNode`` fields.

``model`` and ``hardware`` may also name files, as the CLI's ``--model`` and
``--hardware`` do: a ``.json`` file, or (``model``) a folder holding a Hugging Face
``config.json``. A relative path in a scenario file is relative to the scenario file's own
folder, not to the working directory: `Scenario.load` makes it absolute (see
`anchored`), and ``mlsysim-core estimate --save-scenario`` writes the paths it was given
as absolute paths. Catalog names stay names.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from pathlib import Path
from typing import Any

import attrs

from .errors import InvalidInputError, InvalidInputTypeError

# The command line's defaults (and estimate()'s): the measured profile unless --profile or the
# scenario names one; Llama-3.1-8B on an H100 at global batch 8 when nothing is given.
DEFAULT_MODEL = "llama3-8b"
DEFAULT_HARDWARE = "h100"
DEFAULT_BATCH = 8
DEFAULT_PROFILE = "measured"     # every command's, unless --profile or the scenario names one

SOLVE_FIELDS = ("batch_size", "seq_len", "precision", "optimizer", "activation_checkpointing",
                "tp_size", "pp_size", "dp_size", "ep_size", "zero_stage",
                "gradient_accumulation_steps", "trainable_fraction", "communication_buffer_fraction")
KEYWORD_FIELDS = ("sequence_parallel", "data_parallel", "sharding_rules", "plugin_options",
                  "include_plugins", "profile", "cp_size")


def option_fields(registry=None) -> dict[str, attrs.Attribute]:
    """The options of every profile of ``registry`` (default: the installed plugins'), by name:
    the fields of their ``options_type`` that are keywords of solve, CLI flags and top-level
    fields of a scenario file. A name two profiles declare is listed once (the first's field)."""
    if registry is None:
        from .manager import get_plugin_manager
        registry = get_plugin_manager().registry
    from .inputs import options_fields
    fields: dict[str, attrs.Attribute] = {}
    for spec in registry.profiles.values():
        for name, field in options_fields(spec).items():
            fields.setdefault(name, field)
    return fields


def unloaded_options(names, manager=None, loaded=None) -> str:
    """Why fields no loaded profile takes (``names``) are unknown, when an installed plugin that
    is not loaded declares them as options (a registered item's ``options``, or a profile's):
    ``"'x' is an option of plugin 'p' (dist 1.0), blocked by MLSYSIM_DISABLED_PLUGINS / --disable-plugin"``;
    ``""`` when no installed plugin declares any. ``manager``: the run's (default: the process-wide
    one); ``loaded``: the run's options (default: its profiles'), whose names are not unknown."""
    import warnings
    from collections.abc import Mapping
    from .manager import ENV_DISABLE_AUTOLOAD, ENV_DISABLED_PLUGINS, PluginManager, get_plugin_manager
    from .registry import PROFILE
    from .inputs import options_fields
    try:
        with warnings.catch_warnings():     # (the run's own load said it once already)
            warnings.simplefilter("ignore")
            everything = PluginManager()
            everything.load_entrypoints(third_party=True, blocked=())
            with everything.allowing_broken():
                registry = everything.registry
        offered = option_fields(registry)
    except Exception:     # the plugins the run left out may be the very ones that break
        return ""
    manager = manager or get_plugin_manager()
    loaded = option_fields(manager.registry) if loaded is None else loaded
    blocked = {i.name for i in manager.blocked_entry_points}
    skipped = {i.name for i in manager.skipped_third_party}
    said = []
    for name in dict.fromkeys(n for n in names if n in offered and n not in loaded):
        owners = [registry.providers.get((hook, key)) for hook, items in registry.extensions.items()
                  for key, item in items.items()
                  if isinstance(getattr(item, "options", None), Mapping) and name in item.options]
        owners += [registry.providers.get((PROFILE, key)) for key, spec in registry.profiles.items()
                   if name in options_fields(spec)]
        owners = list({o.name: o for o in owners if o is not None}.values())
        for o in [o for o in owners if o.name in blocked | skipped] or owners[:1]:
            why = (f"blocked by {ENV_DISABLED_PLUGINS} / --disable-plugin" if o.name in blocked else
                   f"not loaded: third-party plugins are off ({ENV_DISABLE_AUTOLOAD} / --no-third-party-plugins)"
                   if o.name in skipped else "installed but not loaded for this run (blocked by --disable-plugin, "
                   "or left out of the plugin manager given)")
            said.append(f"{name!r} is an option of plugin {o.name!r} ({o.source}), {why}")
    return "; ".join(said)


def _given(options) -> dict[str, Any]:
    return {name: value for name, value in dict(options).items() if value is not None}


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
    sequence_parallel: bool | None = None   # None: the profile's default
    data_parallel: str | None = None
    sharding_rules: dict[str, str] = attrs.field(factory=dict)
    plugin_options: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    include_plugins: list[str] = attrs.field(factory=list)
    profile: str | None = None          # None: the TrainingMemoryModel's own profile
    cp_size: int = 1
    # The profile's own options (its ProfileSpec.options_type; the measured profile's regime,
    # lora, offload, ...), by name: keywords of solve, top-level fields of a file. None: the default.
    profile_options: dict[str, Any] = attrs.field(factory=dict, converter=_given)
    description: str = ""

    def __getattr__(self, name: str):
        """A profile option, as ``scenario.regime``: its value, or None when not given."""
        if name.startswith("_") or name == "profile_options":
            raise AttributeError(name)
        if name in self.profile_options:
            return self.profile_options[name]
        try:
            known = name in option_fields()
        except Exception:     # (no installed plugins to ask)
            known = False
        if known:
            return None
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    # --- reading and writing ------------------------------------------------------------

    @classmethod
    def from_dict(cls, data: dict, *, where: str = "scenario", options=None) -> "Scenario":
        """The scenario of a file's table. A field that is a profile's option goes to
        ``profile_options``; ``options`` (name -> attrs field, as `option_fields` gives) are the
        options a file may set (default: those of the installed profiles)."""
        if not isinstance(data, dict):
            raise InvalidInputError(where, data, "a table/object of solve arguments")
        own = {f.name for f in attrs.fields(cls)} - {"profile_options"}
        if options is None:
            options = option_fields() if set(data) - own else {}
        unknown = sorted(set(data) - own - set(options))
        if unknown:
            unloaded = unloaded_options(unknown, loaded=options)     # (a blocked plugin's option: said so)
            raise InvalidInputError(where, ", ".join(unknown), f"known fields: {', '.join(sorted({*own, *options}))}",
                                    "unknown field(s)" + (f"; {unloaded}" if unloaded else ""))
        missing = [name for name in ("model", "hardware", "batch_size") if name not in data]
        if missing:
            flags = "" if where == "scenario" else " (flags override a file's values, they do not complete it)"
            raise InvalidInputError(f"{where}'s {missing[0]}", None, "a value: model, hardware and batch_size are "
                                    f"required{flags}", f"missing: {', '.join(missing)}")
        _check_fields(data, where, options)
        check_contradictions({name: (f"{where}'s {name}" if where != "scenario" else name, data[name])
                              for name in data})
        # Values are checked by solve() itself, with the same messages as from Python.
        data = _normalised(data, options, where)
        return cls(**{k: v for k, v in data.items() if k in own},
                   profile_options={k: v for k, v in data.items() if k not in own})

    @classmethod
    def from_launch(cls, paths, **kwargs) -> "Launch":
        """The scenario of a run's launch files (a torchtune recipe, a torchtitan TOML, ...):
        `from_launch` (``.scenario``, and how each value was found)."""
        return from_launch(paths, **kwargs)

    @classmethod
    def load(cls, path: str | Path, *, options=None) -> "Scenario":
        data, where = read_table(path)
        return cls.from_dict(data, where=where, options=options)

    def to_dict(self) -> dict:
        """The file's table: the profile options top-level, as `from_dict` reads them."""
        data = attrs.asdict(self)
        options, description = data.pop("profile_options"), data.pop("description")
        data = {**data, **options, "description": description}
        if isinstance(options.get("regime"), str) and data["precision"] == _DEFAULT_PRECISION:
            regime = _registered_regime(options["regime"])     # the default precision is not what it runs at:
            if regime is not None and data["precision"] not in regime_precisions(regime):     # left out, as given
                del data["precision"]
        return {k: v for k, v in data.items() if v not in (None, {}, [], "") or k in ("model", "hardware")}

    def dump(self, path: str | Path) -> None:
        """Write this scenario to ``path``: TOML for a ``.toml`` name, JSON otherwise."""
        path = _path(path, "path")
        if path.is_dir():
            raise InvalidInputError("path", str(path), "a file name (.json or .toml)", "it is a directory")
        if path.suffix.lower() == ".toml":
            text = to_toml(self.to_dict())
        else:
            text = json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"
        try:
            path.write_text(text, encoding="utf-8")
        except OSError as err:
            detail = err.strerror or str(err)
            if not path.parent.is_dir():
                detail = f"the folder {str(path.parent)!r} does not exist"
            raise InvalidInputError("path", str(path), "a writable file in an existing folder", detail) from None

    def _model_for_details(self):
        """The model object, where it can be found without side effects (a catalog name, a
        table of fields or a config.json file or folder); None otherwise."""
        try:
            if isinstance(self.model, str):
                from pathlib import Path
                path = Path(self.model)
                if path.is_dir() or self.model.endswith(".json"):
                    from .hf import from_hf_config
                    from .catalog.files import structure_model
                    from .catalog.files import parse_json
                    path = path / "config.json" if path.is_dir() else path
                    data = parse_json(path.read_text(encoding="utf-8-sig"), "model", where=str(path))
                    return from_hf_config(data) if "model_type" in data else structure_model(data)
                from .catalog import get_model
                return get_model(self.model)
            return self.resolve_model()
        except Exception:     # (solve reports a bad model; here it only names defaults)
            return None

    def run_details(self, result=None) -> dict:
        """Everything about this run that changes the numbers, with defaults filled in where
        they are known: the global batch actually run (micro-batch x dp x accumulation, from
        ``result`` when given), the regime behind the precision (measured-grade profiles),
        LoRA/QLoRA, offload, the pipeline schedule, context and expert parallelism. What a
        header and a JSON output show beside the result."""
        per_step = self.dp_size * self.gradient_accumulation_steps
        microbatch = result.microbatch if result is not None else max(1, -(-self.batch_size // per_step))
        details: dict[str, Any] = {
            "profile": result.profile if result is not None else self.profile,
            "global_batch": microbatch * per_step, "requested_global_batch": self.batch_size,
            "microbatch": microbatch, "dp_size": self.dp_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps, "seq_len": self.seq_len,
            "precision": getattr(result, "precision", None) or self.precision}   # (the name it resolved to)
        o = self.profile_options
        regime = (result.details.get("regime") if result is not None else None) or o.get("regime")
        if regime is not None:
            details["regime"] = regime
            details["regime_source"] = "regime" if "regime" in o else "precision"
            spec = _registered_regime(regime)       # (the profile's regimes, through the registry)
            if spec is not None:
                details["regime_description"] = spec.description
        if "lora" in o:
            from .finetune import LoRAConfig
            try:
                config = LoRAConfig(**o["lora"])
                model = self._model_for_details()
                if model is not None:      # the targets a LoRA without target_modules adapts
                    config = config.for_model(model)
                details["lora"] = {"rank": config.rank, "target_modules": list(config.target_modules),
                                   "quantization": config.quantization, "double_quant": config.double_quant}
            except Exception:     # (solve reports a bad one; here only what was asked)
                details["lora"] = dict(o["lora"])
        if "offload" in o:
            details["offload"] = o["offload"]
        if self.pp_size > 1 or "pipeline_schedule" in o:
            measured = details.get("regime") is not None
            details["pipeline_schedule"] = o.get("pipeline_schedule") or ("1f1b" if measured else None)
            if "virtual_stages" in o or details["pipeline_schedule"] == "interleaved-1f1b":
                details["virtual_stages"] = o.get("virtual_stages") or 2
            if "stage_layers" in o:
                details["stage_layers"] = list(o["stage_layers"])
        if self.cp_size != 1:
            details["cp_size"] = self.cp_size
        if self.sharding_rules:     # the rule each axis ran under, where one was asked for
            selected = getattr(result, "selected", None) or {}
            details["sharding_rules"] = {axis: selected.get(f"{axis}_rule", name)
                                         for axis, name in sorted(self.sharding_rules.items())}
        if self.include_plugins:
            details["include_plugins"] = sorted(self.include_plugins)
        shown = ("lora", "offload", "pipeline_schedule", "virtual_stages", "stage_layers", "runtime_overheads")
        read = getattr(result, "details", None) or {}     # (an option as the profile read it: float8's name)
        details.update({name: read.get(name, value) for name, value in o.items()
                        if name not in details and name not in shown})
        if o.get("runtime_overheads", True) is not True:
            details["runtime_overheads"] = o["runtime_overheads"]
        if self.sequence_parallel is not None and self.tp_size > 1:
            details["sequence_parallel"] = self.sequence_parallel
        if self.trainable_fraction != 1.0:
            details["trainable_fraction"] = self.trainable_fraction
        return details

    # --- solving ----------------------------------------------------------------------------

    def resolve_model(self):
        if isinstance(self.model, dict) and "model_type" in self.model:   # a Hugging Face config.json
            from .hf import from_hf_config
            return from_hf_config(self.model)
        if isinstance(self.model, dict):    # every problem named model.<field>
            from .catalog.files import structure_model
            return structure_model(self.model)
        return self.model

    def resolve_hardware(self):
        if isinstance(self.hardware, dict):    # every problem named hardware.<field>
            from .catalog.files import structure_hardware
            return structure_hardware(self.hardware)
        return self.hardware

    def solve_kwargs(self) -> dict:
        kwargs = {name: getattr(self, name) for name in SOLVE_FIELDS}
        kwargs.update({name: getattr(self, name) for name in KEYWORD_FIELDS})
        kwargs["sharding_rules"] = kwargs["sharding_rules"] or None
        kwargs["plugin_options"] = kwargs["plugin_options"] or None
        kwargs["include_plugins"] = tuple(kwargs["include_plugins"])
        kwargs.update(self.profile_options)
        return kwargs

    def solve(self, model=None):
        """Solve this scenario (with ``model``, a ``TrainingMemoryModel``, if given)."""
        from .solver import TrainingMemoryModel
        if model is not None and not isinstance(model, TrainingMemoryModel):
            raise InvalidInputTypeError("model", model, "a TrainingMemoryModel (the solver to use), or None for "
                                        "a new one", f"got {type(model).__name__}; the scenario names its own "
                                        "model (the workload)")
        solver = TrainingMemoryModel() if model is None else model
        with _naming_unloaded(self.profile_options, solver):
            result = solver.solve(self.resolve_model(), self.resolve_hardware(), **self.solve_kwargs())
        return with_input_notes(result, self.input_notes())

    def input_notes(self) -> list[str]:
        """What this scenario's input left to an assumption (``input_notes``)."""
        return input_notes(self.model, self.sequence_parallel, self.tp_size)


_DEFAULT_PRECISION = "fp16"     # (Scenario.precision's default)


# --- inputs that contradict each other --------------------------------------------------

REGIMES_HOOK = "mlsysim_measured_regimes"     # (the measured profile's regimes, by name)


def regime_precisions(regime) -> tuple[str, ...]:
    """The ``precision`` values that agree with a training regime (a ``Regime``): those whose
    bytes are the regime's compute bytes, and of those the one it declares (``Regime.precision``:
    ``mixed-bf16`` bf16, ``amp-fp16`` fp16; ``fp32`` declares none: fp32 or tf32)."""
    from .plan import PRECISION_BYTES
    fits = tuple(p for p, size in PRECISION_BYTES.items() if size == getattr(regime, "compute", None))
    declared = getattr(regime, "precision", "")
    return (declared,) if declared in fits else fits


def check_contradictions(given: dict[str, tuple[str, Any]], registry=None) -> None:
    """Refuse inputs that contradict each other, each given explicitly: ``given`` maps a
    field to ``(how it was given, value)``, e.g. ``{"precision": ("--precision", "fp32"),
    "regime": ("--regime", "bf16")}``. The pairs: ``regime`` and a ``precision`` it does not
    run at (the regime decides the dtypes: the precision would be silently ignored). (A
    ``zero_stage`` beside ``data_parallel`` is refused by solve.) The error names both inputs
    and their values."""
    def refuse(first: str, second: str, allowed: str, why: str):
        (label, value), (other, other_value) = given[first], given[second]
        raise InvalidInputError(label, value, allowed, f"{label}={value!r} and {other}={other_value!r} contradict "
                                f"each other: {why}")

    if isinstance(given.get("regime", (0, None))[1], str) and isinstance(given.get("precision", (0, None))[1], str):
        regime = _registered_regime(given["regime"][1], registry)
        if regime is not None:
            from .plan import PRECISION_BYTES
            from .registry import resolve_name
            try:
                precision = resolve_name("precision", given["precision"][1], PRECISION_BYTES)
            except InvalidInputError:
                precision = None     # (solve names a bad precision)
            agree = regime_precisions(regime)
            if precision is not None and precision not in agree:
                refuse("precision", "regime", f"{' or '.join(agree) or 'none'} with regime {regime.name!r}, or leave "
                       "one of them out", f"regime {regime.name!r} decides every dtype ({regime.description}), "
                       f"and precision {precision!r} would be ignored")


def _registered_regime(name: str, registry=None):
    """The registered regime ``name`` resolves to (None: not one; solve says so)."""
    if registry is None:
        try:
            from .manager import get_plugin_manager
            registry = get_plugin_manager().registry
        except Exception:     # (no installed plugins to ask)
            return None
    regimes = registry.extensions.get(REGIMES_HOOK) or {}
    from .registry import resolve_name
    try:
        return regimes[resolve_name("regime", name, regimes)]
    except InvalidInputError:
        return None


def read_table(path: str | Path) -> tuple[Any, str]:
    """``(table, where)``: a scenario file's table as written (a UTF-8 BOM and CRLF line ends
    allowed), its relative file paths made absolute against its folder (`anchored`), and the
    name its errors use (``"scenario NAME"``). ``Scenario.load`` checks it (``from_dict``)."""
    path = _path(path, "scenario")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InvalidInputError("scenario", str(path), "a readable .json or .toml file",
                                err.strerror or str(err)) from None
    try:
        text = raw.decode("utf-8-sig")     # a BOM is allowed (Windows editors write one); CRLF too
    except UnicodeDecodeError as err:
        raise InvalidInputError("scenario", str(path), "a UTF-8 text file (.json or .toml)",
                                f"byte {err.start} is not UTF-8: {err.reason}") from None
    if path.suffix.lower() == ".toml":
        try:
            import tomllib
        except ImportError as err:  # Python 3.10
            raise InvalidInputError("scenario", str(path), "a .json file (TOML needs Python 3.11+)") from err
        try:
            data = tomllib.loads(text)
        except RecursionError:
            raise InvalidInputError("scenario", str(path), "TOML nested at most a few hundred levels deep",
                                    "too deeply nested") from None
        except ValueError as err:     # TOMLDecodeError, or an integer too long to read
            raise InvalidInputError("scenario", str(path), "valid TOML", _parse_error(err)) from None
    else:
        try:
            data = json.loads(text)
        except RecursionError:
            raise InvalidInputError("scenario", str(path), "JSON nested at most a few hundred levels deep",
                                    "too deeply nested") from None
        except ValueError as err:     # JSONDecodeError, or an integer over Python's 4300 digits
            raise InvalidInputError("scenario", str(path), "valid JSON", _parse_error(err)) from None
    if isinstance(data, dict):     # relative file paths: relative to the scenario's own folder
        folder = path.absolute().parent
        data = {**data, **{name: anchored(data[name], folder) for name in ("model", "hardware")
                           if name in data}}
    return data, f"scenario {path.name}"


def anchored(value, folder: str | Path):
    """``value`` (a scenario's ``model`` or ``hardware``) with a relative file path made
    absolute against ``folder``: a name ending in ``.json``, or a folder holding a
    ``config.json`` (a Hugging Face checkpoint). Anything else (a catalog name, a table of
    fields, an absolute path) is returned as it is."""
    if not isinstance(value, str) or not value.strip():
        return value
    relative = Path(value)
    if relative.is_absolute():
        return value
    candidate = Path(folder).absolute() / relative
    if value.endswith(".json") or (candidate / "config.json").is_file():
        return str(candidate)
    return value


def _parse_error(err: ValueError) -> str:
    """What a JSON/TOML reader's ValueError says, in a user's words."""
    text = str(err)
    if "integer string conversion" in text:     # Python's limit on int() of a long digit string
        return "a number with more than 4300 digits; no field takes one"
    return text


def _path(path, parameter: str) -> Path:
    """``path`` as a Path, or an error naming ``parameter`` (None, a number, ...)."""
    import os
    if isinstance(path, bytes) or not isinstance(path, (str, os.PathLike)):
        raise InvalidInputTypeError(parameter, path, "a file path (str or pathlib.Path)",
                                    f"got {type(path).__name__}")
    if not str(path).strip():
        raise InvalidInputError(parameter, path, "a file path", "an empty name")
    return Path(path)


# Whole-number fields: a file's 16.0 is read as 16 (JSON and TOML writers often write
# floats), so that headers and saved scenarios show what was meant.
_INT_FIELDS = ("batch_size", "seq_len", "tp_size", "pp_size", "dp_size", "ep_size", "zero_stage",
               "gradient_accumulation_steps", "cp_size")


def _whole(value):
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _normalised(data: dict, options: dict, where: str) -> dict:
    """``data`` with whole numbers as ints, and each profile option as its field's metadata
    ``from_file(value, where)`` reads it (checked and normalised; errors name the field)."""
    data = dict(data)
    for name, value in data.items():
        meta = options[name].metadata if name in options else {}
        if name in _INT_FIELDS or meta.get("type") is int:
            data[name] = _whole(value)
        elif meta.get("from_file") is not None and value is not None:
            data[name] = meta["from_file"](value, where)
    return data


# --- checking a file's fields ---------------------------------------------------------------

# Fields whose None ("null" in JSON) means something: the default (the profiles' options, the
# data-parallel rule) or the model's own profile.
_NULLABLE = frozenset(("data_parallel", "profile"))


MAX_DEPTH = 64     # tables and lists nested deeper than this are refused (no file needs it)


def nesting_depth(value, limit: int = MAX_DEPTH) -> int:
    """How deeply ``value`` nests dicts and lists, counted without recursion; stops
    counting past ``limit``."""
    depth, level = 0, [value]
    while level and depth <= limit:
        children = []
        for item in level:
            if isinstance(item, dict):
                children.extend(item.values())
            elif isinstance(item, (list, tuple)):
                children.extend(item)
        if not children and not any(isinstance(item, (dict, list, tuple)) for item in level):
            break
        depth += 1
        level = children
    return depth


def _check_fields(data: dict, where: str, options=()) -> None:
    """What the file itself must get right before solve() sees it: no null where null is
    not a value, and the tables and lists in the shapes the scenario holds them."""
    for name, value in data.items():
        if isinstance(value, (dict, list)) and nesting_depth(value) > MAX_DEPTH:
            raise InvalidInputError(name, "(nested tables/lists)", f"at most {MAX_DEPTH} levels of nesting",
                                    f"{where}: {name} is nested too deeply")
        if value is None and name not in _NULLABLE and name not in options:
            raise InvalidInputError(name, None, "a value (leave the field out for its default)",
                                    f"{where}: null is not a value of {name}")
    rules = data.get("sharding_rules", {})
    if not isinstance(rules, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in rules.items()):
        raise InvalidInputError("sharding_rules", rules, "a table of axis = rule name, e.g. {\"tp\": \"tp\"}",
                                where)
    options = data.get("plugin_options", {})
    if not isinstance(options, dict) or not all(isinstance(k, str) and isinstance(v, dict)
                                                for k, v in options.items()):
        raise InvalidInputError("plugin_options", options, "a table of spec name = table of option fields",
                                where)
    include = data.get("include_plugins", [])
    if not isinstance(include, list) or not all(isinstance(name, str) for name in include):
        raise InvalidInputError("include_plugins", include, "a list of plugin names", where)
    for name in ("model", "hardware"):
        if name in data and not isinstance(data[name], (str, dict)):
            raise InvalidInputError(name, data[name], "a catalog name or a table of fields", where)
    if "description" in data and not isinstance(data["description"], str):
        raise InvalidInputError("description", data["description"], "a string", where)


# --- TOML, written (Python reads it with tomllib) ----------------------------------------

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def _toml_key(key) -> str:
    key = str(key)
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _toml_value(value, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        text = repr(value)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v, where) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {_toml_value(v, where)}"
                               for k, v in value.items() if v is not None) + "}"
    if value is None:
        raise InvalidInputError(where, value, "a value TOML can hold", "TOML has no null (in a list)")
    raise InvalidInputError(where, value, "a string, number, boolean, list or table")


def to_toml(data: dict) -> str:
    """A TOML document of ``data`` (str, int, float, bool, lists and nested tables; a None
    in a table is left out, as TOML has no null). ``tomllib.loads`` gives ``data`` back."""
    lines: list[str] = []

    def table(values: dict, prefix: tuple[str, ...]) -> None:
        scalars = [(k, v) for k, v in values.items() if v is not None and not isinstance(v, dict)]
        tables = [(k, v) for k, v in values.items() if isinstance(v, dict)]
        if prefix and (scalars or not tables):
            lines.append("")
            lines.append("[" + ".".join(prefix) + "]")
        for key, value in scalars:
            lines.append(f"{_toml_key(key)} = {_toml_value(value, '.'.join((*prefix, str(key))))}")
        for key, value in tables:
            table(value, (*prefix, _toml_key(key)))

    table(data, ())
    return "\n".join(lines).lstrip("\n") + "\n"


# --- launch configs: the files users already launch with (estimate --from) -------------------
# A launch format (a LaunchFormatSpec registered through ``mlsysim_launch_formats``) reads one
# parsed file into a `LaunchReading`: every field it read and what it became, the fields it
# approximated (with a note), the fields it ignored as not changing memory, the implicit
# defaults it applied (with the framework version assumed and a source). `from_launch` merges
# the readings of several files into one Scenario (docs/launch.md).

# Fields a reading may set besides Scenario's and the profiles' options: the batch as the
# frameworks write it (a per-device micro-batch, or a global batch with a micro-batch), which
# `from_launch` turns into the global ``batch_size`` once the data-parallel size is known.
LAUNCH_BATCH_FIELDS = ("micro_batch_size", "global_batch_size")
# World-size hints a reading may carry (``LaunchReading.world``): the file's own device counts.
LAUNCH_WORLD_HINTS = ("gpus", "nodes", "gpus_per_node", "single_device")


def _strings(where: str):
    """``tuple``, as a converter of a field of names, refusing one str (which it would split into its
    characters, as ``ignored="lr"`` became ``("l", "r")``): a reader's bug, named by ``from_launch``."""
    def convert(value):
        if isinstance(value, str):
            raise TypeError(f"{where}={value!r:.80} is a str; expected a tuple (or list) of str (one str would "
                            "be read as its characters)")
        return tuple(value)
    return convert


@attrs.frozen(kw_only=True)
class LaunchField:
    """One field of a launch file and what it became: ``key`` (dotted, as in the file, e.g.
    ``optimizer._component_``) had ``value``; it set the scenario field or profile option
    ``field`` to ``becomes``. ``approximated``: the run's memory is close to, not exactly, what
    ``becomes`` describes; ``note`` says how (or, when not approximated, anything worth saying).
    ``yields``: read from the file, but another file's value for the same field wins without a
    contradiction (e.g. the trainer's bf16 regime, which a DeepSpeed or FSDP config recasts); it
    still beats an implicit default. ``derive``: the value is a function of other fields as all the
    files give them (``derived_from``, e.g. the precision the Trainer's bf16 or accelerate's
    mixed_precision sets): ``derive(merged)`` (``merged``: those fields' merged values, one no file
    gives absent) returns the attributes that change (``becomes``, ``note``, ``approximated``), or
    None when the key then sets nothing; `from_launch` calls it after merging the other fields and
    merges the result by the same rules (its source says what it was derived from). ``becomes``
    is what the file alone gives (None: nothing)."""
    key: str
    value: Any
    field: str
    becomes: Any
    note: str = ""
    approximated: bool = False
    yields: bool = False
    derived_from: tuple[str, ...] = attrs.field(default=(), converter=_strings("LaunchField.derived_from"))
    derive: Any = attrs.field(default=None, eq=False, repr=False)

    def to_dict(self) -> dict:
        data = {"key": self.key, "value": self.value, "field": self.field, "becomes": self.becomes}
        data.update({name: shown for name, shown in (("note", self.note), ("approximated", self.approximated),
                     ("yields", self.yields), ("derived_from", list(self.derived_from))) if shown})
        return data


@attrs.frozen(kw_only=True)
class LaunchDefault:
    """An implicit default the framework applies when ``key`` is absent from the file: the
    scenario ``field`` becomes ``value``, as ``framework`` ``version`` does (``source``: where
    that default is written, e.g. a file and line of the framework's repository)."""
    key: str
    field: str
    value: Any
    version: str
    source: str
    note: str = ""

    def to_dict(self) -> dict:
        data = {"key": self.key, "field": self.field, "value": self.value, "version": self.version,
                "source": self.source}
        if self.note:
            data["note"] = self.note
        return data


@attrs.frozen(kw_only=True)
class LaunchReading:
    """What one launch format made of one file (``LaunchFormatSpec.read`` returns it).

    ``fields``: every memory-relevant key read (`LaunchField`), the model included (field
    ``model``). ``defaults``: the implicit defaults applied (`LaunchDefault`). ``ignored``: keys
    that do not change memory (logging, paths, learning rate...), listed once. ``world``: the
    file's device-count hints (``gpus``, ``nodes``, ``gpus_per_node``: ``(key, value)``;
    ``single_device``: ``(key, True)`` for a recipe that runs on one device by construction).
    ``framework_version``: the framework version its defaults assume. ``notes``: anything else
    the user should read. A key that changes memory but is not modelled is never here: the reader
    raises ``NotModelledError`` naming the file, the key and the value."""
    format: str
    path: str
    fields: tuple[LaunchField, ...] = attrs.field(default=(), converter=tuple)
    defaults: tuple[LaunchDefault, ...] = attrs.field(default=(), converter=tuple)
    ignored: tuple[str, ...] = attrs.field(default=(), converter=_strings("LaunchReading.ignored"))
    world: dict[str, tuple[str, Any]] = attrs.field(factory=dict)
    framework_version: str = ""
    notes: tuple[str, ...] = attrs.field(default=(), converter=_strings("LaunchReading.notes"))

    @property
    def model(self) -> LaunchField | None:
        """The field that named the model (None: the file does not say)."""
        return next((f for f in self.fields if f.field == "model"), None)

    def values(self) -> dict[str, Any]:
        """field -> value: the defaults, then the fields read (a field read wins)."""
        return _values([(d, d.value) for d in self.defaults] + [(f, f.becomes) for f in self.fields
                                                               if f.derive is None or f.becomes is not None])

    def to_dict(self) -> dict:
        return {"format": self.format, "path": self.path, "framework_version": self.framework_version,
                "fields": [f.to_dict() for f in self.fields], "defaults": [d.to_dict() for d in self.defaults],
                "ignored": list(self.ignored), "world": {k: list(v) for k, v in self.world.items()},
                "notes": list(self.notes)}


def _values(items) -> dict[str, Any]:
        data: dict[str, Any] = {}
        for item, value in items:
            if isinstance(value, dict) and isinstance(data.get(item.field), dict):
                data[item.field] = {**data[item.field], **value}     # (a table built from several keys)
            else:
                data[item.field] = value
        return data


@attrs.define(kw_only=True)
class LaunchContext:
    """What a reader is told beside the file: the ``--gpus``/``-g``/``--framework-version``/
    ``--seq-len`` given (None: not given), ``model`` (``-m``, which replaces the files' model: a
    reader need not resolve its own then), the ``overrides`` (``key=value`` strings, as
    ``tune run ... key=value``; a reader that applies them calls `take_overrides`), and the
    registry (the installed plugins)."""
    gpus: int | None = None
    hardware: Any = None
    framework_version: str | None = None
    seq_len: int | None = None
    overrides: tuple[str, ...] = ()
    registry: Any = None
    taken: list = attrs.field(factory=list)
    model: Any = None     # -m: replaces the files' model (a reader need not resolve its own then)

    def take_overrides(self, path) -> list[tuple[str, str]]:
        """The overrides as ``(dotted key, value text)``, marked applied to ``path``."""
        pairs = []
        for item in self.overrides:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise InvalidInputError("--override", item, "KEY=VALUE, e.g. batch_size=4 (as `tune run ... "
                                        "key=value`)")
            pairs.append((key.strip(), value.strip()))
        if self.overrides:
            self.taken.append(str(path))
        return pairs


@attrs.frozen(kw_only=True)
class Launch:
    """`from_launch`'s answer: the ``scenario`` and how every value of it was found.
    ``readings``: one per file; ``sources``: scenario field -> where its value came from (a file
    and key, ``"default (...)"``, or a flag); ``notes``: what the merge said (the world size,
    the batch, the sequence)."""
    scenario: Scenario
    readings: tuple[LaunchReading, ...]
    sources: dict[str, str] = attrs.field(factory=dict)
    notes: tuple[str, ...] = ()
    overridden: tuple[tuple[str, Any, str, Any], ...] = ()     # (field, file value, flag, value)

    def with_overrides(self, overridden) -> "Launch":
        return attrs.evolve(self, overridden=tuple(overridden))

    def to_dict(self) -> dict:
        return {"files": [r.to_dict() for r in self.readings], "sources": dict(self.sources),
                "notes": list(self.notes),
                "overridden": [{"field": f, "file_value": v, "flag": flag, "value": new}
                               for f, v, flag, new in self.overridden]}

    def describe(self) -> str:
        """The "from launch files" section of a text answer."""
        lines = ["from launch files:"]
        for r in self.readings:
            version = f", defaults of {r.framework_version}" if r.framework_version else ""
            lines.append(f"  {r.path}  ({r.format}{version})")
            for f in r.fields:
                if f.approximated:
                    continue
                lines.append(f"    {f.key} = {_short(f.value)}  ->  {f.field} = {_short(f.becomes)}"
                             + (f"  ({f.note})" if f.note else ""))
            approximated = [f for f in r.fields if f.approximated]
            if approximated:
                lines.append("    approximated:")
                lines += [f"      {f.key} = {_short(f.value)}  ->  {f.field} = {_short(f.becomes)}: {f.note}"
                          for f in approximated]
            if r.defaults:
                lines.append("    implicit defaults:")
                lines += [f"      {d.key} (absent)  ->  {d.field} = {_short(d.value)}  ({d.version}; {d.source}"
                          + (f"; {d.note}" if d.note else "") + ")" for d in r.defaults]
            if r.ignored:
                lines.append(f"    ignored (no effect on memory): {', '.join(r.ignored)}")
            lines += [f"    note: {n}" for n in r.notes]
        lines += [f"  {n}" for n in self.notes]
        lines += [f"  {flag} {_short(new)} overrides {field} = {_short(old)} from the files"
                  for field, old, flag, new in self.overridden]
        return "\n".join(lines)


def _short(value) -> str:
    text = json.dumps(value, default=str) if isinstance(value, (dict, list, tuple, bool)) or value is None \
        else str(value)
    return text if len(text) <= 120 else text[:117] + "..."


RAW_TEXT_SUFFIXES = (".sh", ".bash", ".args")     # launch scripts: handed to the readers as text


def parse_launch_file(path: str | Path) -> Any:
    """A launch file parsed by its suffix: ``.json`` (json), ``.toml`` (tomllib), a launch script
    (``.sh``, ``.bash``, ``.args``: an argument list, not a document) as its raw text for the
    reader that recognizes it (Megatron's ``read_arguments``), else YAML (PyYAML's ``safe_load``,
    imported here: a run without ``--from`` never loads it). A ``.py`` file is refused: a
    framework's Python is never executed."""
    path = _path(path, "--from")
    suffix = path.suffix.lower()
    if suffix == ".py":
        raise InvalidInputError("--from", str(path), "a resolved config the framework writes (YAML, TOML or JSON)",
                                "a Python file is never executed: dump the resolved config instead (torchtitan: "
                                "--job.print_config / debug.save_config_file; Megatron-Bridge: --dryrun or "
                                "save_config_filepath; torchtune: tune cp then the YAML)")
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except OSError as err:
        raise InvalidInputError("--from", str(path), "a readable launch file", err.strerror or str(err)) from None
    except UnicodeDecodeError as err:
        raise InvalidInputError("--from", str(path), "a UTF-8 text file", f"byte {err.start}: {err.reason}") from None
    if suffix in RAW_TEXT_SUFFIXES:
        return text
    try:
        if suffix == ".json":
            return json.loads(text)
        if suffix == ".toml":
            import tomllib
            return tomllib.loads(text)
        import yaml     # libyaml's safe loader where PyYAML was built with it (the same documents, 10x faster)
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except RecursionError:
        raise InvalidInputError("--from", str(path), "a file nested at most a few hundred levels deep",
                                "too deeply nested") from None
    except ImportError as err:
        raise InvalidInputError("--from", str(path), "a .json file (TOML needs Python 3.11+, YAML needs PyYAML)",
                                str(err)) from None
    except Exception as err:     # JSONDecodeError, TOMLDecodeError, yaml.YAMLError
        kind = {".json": "JSON", ".toml": "TOML"}.get(suffix, "YAML")
        raise InvalidInputError("--from", str(path), f"valid {kind}", _parse_error(err)) from None


LAUNCH_FORMAT = "mlsysim_launch_formats"     # the hook, added by the built-in plugin ``launch``


def launch_formats(registry) -> dict:
    """The registered launch formats by name (``LaunchFormatSpec``s, mlsysim_plugins.launch)."""
    return registry.extensions.get(LAUNCH_FORMAT, {})


def launch_format_for(path, document, registry):
    """The one registered launch format that recognizes ``document`` (parsed ``path``): none is
    an error listing the formats, two an error naming both (and their plugins)."""
    from .errors import PluginContractError
    formats = launch_formats(registry)
    claims = []
    for name, spec in sorted(formats.items()):
        try:
            if spec.recognizes(Path(path), document):
                claims.append(name)
        except Exception as err:     # a reader that breaks on a file it does not read is the reader's bug
            info = registry.providers.get((LAUNCH_FORMAT, name))
            raise PluginContractError(f"launch format {name!r} (plugin {getattr(info, 'name', '?')}) raised "
                                      f"{type(err).__name__} in recognizes({str(path)!r}): {err}",
                                      plugin=getattr(info, "name", None), hook="mlsysim_launch_formats") from err
    listing = "; ".join(f"{n} ({s.framework}: {s.description})" for n, s in sorted(formats.items())) or "(none installed)"
    if not claims:
        raise InvalidInputError("--from", str(path), f"a file one of the installed launch formats reads: {listing}",
                                "no launch format recognizes it" + (": the file is empty" if not document else ""))
    if len(claims) > 1:
        who = " and ".join(f"{n!r} (plugin {getattr(registry.providers.get((LAUNCH_FORMAT, n)), 'name', '?')})"
                           for n in claims)
        raise InvalidInputError("--from", str(path), "a file exactly one launch format recognizes",
                                f"{who} both recognize it: two readers claim one file")
    return formats[claims[0]]


def _read_one(path, spec, context, registry, document=None) -> LaunchReading:
    from .errors import MlsysimError, PluginContractError
    if document is None:
        document = parse_launch_file(path)
    try:
        reading = spec.read(Path(path), document, context)
    except MlsysimError:
        raise
    except Exception as err:     # never a traceback: the reader's bug, named
        info = registry.providers.get((LAUNCH_FORMAT, spec.name))
        raise PluginContractError(f"launch format {spec.name!r} (plugin {getattr(info, 'name', '?')}) raised "
                                  f"{type(err).__name__} reading {str(path)!r}: {err}",
                                  plugin=getattr(info, "name", None), hook="mlsysim_launch_formats") from err
    if not isinstance(reading, LaunchReading):
        info = registry.providers.get((LAUNCH_FORMAT, spec.name))
        raise PluginContractError(f"launch format {spec.name!r} (plugin {getattr(info, 'name', '?')}) returned "
                                  f"{type(reading).__name__} from read(), not a LaunchReading",
                                  plugin=getattr(info, "name", None), hook="mlsysim_launch_formats")
    what = _malformed(reading)
    if what:
        info = registry.providers.get((LAUNCH_FORMAT, spec.name))
        raise PluginContractError(f"launch format {spec.name!r} (plugin {getattr(info, 'name', '?')}) reading "
                                  f"{str(path)!r} returned {what}",
                                  plugin=getattr(info, "name", None), hook="mlsysim_launch_formats")
    _check_field_names(reading, spec, registry)
    for hint in ("gpus", "nodes", "gpus_per_node"):     # the file's values: bad input, named by their key
        if hint in reading.world and not _is_whole(reading.world[hint][1]):
            key, value = reading.world[hint]
            raise InvalidInputError(key, value, "a whole number >= 1", f"{path}: the {hint} ({spec.name} format)")
    return reading


def _check_field_names(reading, spec, registry) -> None:
    """Each field a reading sets is a Scenario field, an installed profile's option or a batch field
    (`LAUNCH_BATCH_FIELDS`): another name is the reader's bug (PluginContractError naming the format,
    its plugin and the key), unless a plugin that is not loaded declares it as its option (the
    user's run needs it: said, as an InvalidInputError naming the file and key)."""
    from .errors import PluginContractError
    known = {f.name for f in attrs.fields(Scenario)} - {"profile_options"} | {*option_fields(registry),
                                                                              *LAUNCH_BATCH_FIELDS}
    item = next((i for i in (*reading.fields, *reading.defaults) if not isinstance(i.field, str) or i.field not in known),
                None)
    if item is None:
        return
    unloaded = unloaded_options([item.field]) if isinstance(item.field, str) else ""
    if unloaded:
        raise InvalidInputError("--from", reading.path, "a file whose keys the loaded plugins model",
                                f"{item.key} sets {item.field!r}: {unloaded}")
    import difflib
    close = difflib.get_close_matches(str(item.field), sorted(known), n=1)
    info = registry.providers.get((LAUNCH_FORMAT, spec.name))
    raise PluginContractError(f"launch format {spec.name!r} (plugin {getattr(info, 'name', '?')}) reading "
                              f"{reading.path!r} returned {type(item).__name__} key={item.key!r} for field "
                              f"{item.field!r}, which is no Scenario field, option of a loaded profile or "
                              f"batch field ({', '.join(LAUNCH_BATCH_FIELDS)})" +
                              (f"; did you mean {close[0]!r}?" if close else ""),
                              plugin=getattr(info, "name", None), hook="mlsysim_launch_formats")


def _malformed(reading) -> str:
    """What in a reading breaks `LaunchReading`'s contract (empty: nothing)."""
    for name, kind in (("fields", LaunchField), ("defaults", LaunchDefault)):
        wrong = [item for item in getattr(reading, name) if not isinstance(item, kind)]
        if wrong:
            return f"LaunchReading.{name} holding {type(wrong[0]).__name__} {wrong[0]!r:.80}; expected {kind.__name__}s"
    if not isinstance(reading.world, dict):
        return f"LaunchReading.world={reading.world!r:.80}; expected a dict (empty: the file gives no device count)"
    unknown = [k for k in reading.world if k not in LAUNCH_WORLD_HINTS]
    if unknown or not all(isinstance(v, tuple) and len(v) == 2 for v in reading.world.values()):
        return ((f"unknown world hint(s) {', '.join(map(repr, unknown))}" if unknown else
                 "a world hint that is not a (key, value) pair") +
                f": LaunchReading.world maps {', '.join(LAUNCH_WORLD_HINTS)} to (the file's key, its value)")
    return ""


# Fields of a launch reading that count ranks, steps, sequences or tokens: whole numbers >= 1.
_WHOLE_FIELDS = ("tp_size", "pp_size", "cp_size", "ep_size", "dp_size", "gradient_accumulation_steps", "seq_len",
                 *LAUNCH_BATCH_FIELDS)


def _is_whole(value) -> bool:
    return type(value) is int and value >= 1


def from_launch(paths, *, gpus: int | None = None, hardware=None, framework_version: str | None = None,
                seq_len: int | None = None, overrides=(), registry=None, model=None,
                batch_size: int | None = None, searched: str | None = None) -> Launch:
    """The Scenario of a run described by its launch files (``paths``: one or several files that
    make one run), with how each value was found (`Launch`).

    Each file is parsed (JSON, TOML, YAML), recognized by exactly one registered launch format
    and read. Values that two files give differently are refused, naming both files and keys.
    The world size is ``gpus`` (``--gpus``), else the files' own device counts, else 1 for a
    recipe that is single-device by construction; else refused. The data-parallel size is the
    world over tp x pp x cp (unless a file gives it); the global batch is the per-device
    micro-batch x dp x accumulation. ``hardware``: ``-g`` (default: the CLI's, h100, said).
    ``model``: ``-m``, replacing the files' model (said). ``seq_len``: ``--seq-len``, which a
    reader uses where the file's length is data-dependent (no packing). ``batch_size``: ``-b``, the
    global batch where no file gives one (an accelerate or DeepSpeed config alone). ``searched``:
    ``"batch_size"`` or ``"seq_len"``, the value the caller searches (`fit batch`, `fit seq`): where no
    file gives it, its smallest (one micro-batch per data-parallel rank; cp tokens), said."""
    if registry is None:
        from .manager import get_plugin_manager
        registry = get_plugin_manager().registry
    if isinstance(paths, (str, Path)):
        paths = [paths]
    paths = list(paths)
    if not paths:
        raise InvalidInputError("--from", paths, "one or more launch files")
    for name, value in (("--gpus", gpus), ("--seq-len", seq_len), ("--batch-size", batch_size)):
        if value is not None and (type(value) is not int or value < 1):
            raise InvalidInputError(name, value, "a whole number >= 1")
    context = LaunchContext(gpus=gpus, hardware=hardware, framework_version=framework_version, seq_len=seq_len,
                            overrides=tuple(overrides), registry=registry, model=model)
    readings = []
    for path in paths:
        document = parse_launch_file(path)      # parsed once: recognized, then read
        spec = launch_format_for(path, document, registry)
        readings.append(_read_one(path, spec, context, registry, document))
    if context.overrides and not context.taken:
        raise InvalidInputError("--override", list(context.overrides), "with a launch file whose format takes "
                                "key=value overrides (torchtune)", "no file's reader applies them")
    # Merge: a value two files give differently is refused; an explicit value beats a default; a
    # value read with ``yields`` gives way to another file's (said in the notes). Derived values
    # (``LaunchField.derive``) are resolved from the others' merged values, then merged alike.
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    where: dict[str, tuple[str, str]] = {}
    yielding: set[str] = set()
    notes: list[str] = []
    for r in readings:
        for d in r.defaults:
            if d.field not in where:
                values.setdefault(d.field, d.value)
                sources.setdefault(d.field, f"default ({r.path}: {d.key} absent; {d.version})")

    def merge(r, fields):     # (a field's table completed by the reading's own defaults, as LaunchReading.values)
        path, given = r.path, _values([(d, d.value) for d in r.defaults] + [(f, f.becomes) for f in fields])
        for field, value in ((f, given[f]) for f in dict.fromkeys(f.field for f in fields)):
            explicit = [f for f in fields if f.field == field]
            key = "/".join(dict.fromkeys(f.key for f in explicit))
            weak = all(f.yields for f in explicit)
            if field in where and not _same(values[field], value):
                (other, other_key) = where[field]
                if weak and field not in yielding:
                    notes.append(f"{field}: {path}'s {key}={value!r} yields to {other}'s {other_key}="
                                 f"{values[field]!r}")
                    continue
                if not weak and field in yielding:
                    notes.append(f"{field}: {other}'s {other_key}={values[field]!r} yields to {path}'s "
                                 f"{key}={value!r}")
                else:
                    raise InvalidInputError("--from", path, f"files that agree on {field}",
                                            f"{other}'s {other_key}={values[field]!r} and {path}'s {key}="
                                            f"{value!r} contradict each other")
            elif field in where and weak:
                continue
            values[field], where[field] = value, (path, key)
            sources[field] = f"{path}: {key}" + "".join(f.note[f.note.rfind(" (derived from "):]
                                                        for f in explicit[-1:] if f.derived_from)
            (yielding.add if weak else yielding.discard)(field)
    derived = [[f.derive is not None or bool(f.derived_from) for f in r.fields] for r in readings]
    for r, marks in zip(readings, derived):
        merge(r, [f for f, d in zip(r.fields, marks) if not d])
    readings = [attrs.evolve(r, fields=[_derived(f, values, sources) for f in r.fields]) for r in readings]
    for r, marks in zip(readings, derived):
        merge(r, [f for f, d in zip(r.fields, marks) if d and f.becomes is not None])
    for name in _WHOLE_FIELDS:      # checked before the world size and the batch are computed from them
        if name in values:
            values[name] = _whole(values[name])     # a file's 16.0 is 16, as in scenario files
        if values.get(name) is not None and not _is_whole(values[name]):
            key = where[name][1] if name in where else name
            raise InvalidInputError(key, values[name], "a whole number >= 1", f"{name} from {sources.get(name, '?')}")
    # Hardware and model.
    if hardware is not None:
        values["hardware"], sources["hardware"] = hardware, "-g/--hardware"
    else:
        values["hardware"], sources["hardware"] = DEFAULT_HARDWARE, "default (launch files name no hardware; -g)"
        notes.append(f"hardware: the default {DEFAULT_HARDWARE} (launch files do not name the accelerator; give -g)")
    if model is not None:
        if "model" in values:
            notes.append(f"-m {model} replaces the model {values['model']!r} from {sources['model']}")
        values["model"], sources["model"] = model, "-m/--model"
    if "model" not in values:
        raise InvalidInputError("--from", ", ".join(str(p) for p in paths), "launch files that name the model, or -m",
                                "none of the files names a model")
    # World size.
    world, world_source = _world_size(readings, gpus)
    tp, pp, cp = (values.get(n, 1) for n in ("tp_size", "pp_size", "cp_size"))
    if world is None:
        if any(values.get(n, 1) != 1 for n in ("tp_size", "pp_size", "cp_size", "ep_size")) or "dp_size" in values:
            world = values.get("dp_size", 1) * tp * pp * cp
            world_source = "the files' parallel sizes (dp x tp x pp x cp)"
        else:
            raise InvalidInputError("--gpus", None, "the number of GPUs the run uses (or --nodes x --gpus-per-node)",
                                    f"{', '.join(str(p) for p in paths)}: a distributed recipe whose files do not say "
                                    "how many GPUs")
    model_parallel = tp * pp * cp
    if world % model_parallel:
        raise InvalidInputError("--gpus", world, f"a multiple of tp x pp x cp = {model_parallel}",
                                f"world size {world} from {world_source}")
    dp = world // model_parallel
    if "dp_size" in values and values["dp_size"] != dp:
        raise InvalidInputError("--gpus", world, f"{values['dp_size'] * model_parallel} GPUs (dp {values['dp_size']} "
                                f"from {sources['dp_size']} x tp {tp} x pp {pp} x cp {cp})",
                                f"world size {world} from {world_source}")
    values["dp_size"] = dp
    sources.setdefault("dp_size", f"world size {world} ({world_source}) / (tp {tp} x pp {pp} x cp {cp})")
    notes.append(f"world size {world} GPUs ({world_source}): dp {dp} x tp {tp} x pp {pp} x cp {cp}")
    # The batch: the global batch solve takes.
    accum = values.get("gradient_accumulation_steps", 1)
    micro, global_batch = values.pop("micro_batch_size", None), values.pop("global_batch_size", None)
    if micro is not None and global_batch is not None and "gradient_accumulation_steps" not in where:
        if global_batch % (micro * dp):
            raise InvalidInputError("--from", global_batch, f"a global batch that is a multiple of micro-batch {micro} "
                                    f"x dp {dp}", f"{sources.get('global_batch_size')}")
        accum = global_batch // (micro * dp)
        values["gradient_accumulation_steps"] = accum
        sources["gradient_accumulation_steps"] = f"global batch {global_batch} / (micro-batch {micro} x dp {dp})"
    if micro is not None:
        values["batch_size"] = micro * dp * accum
        sources["batch_size"] = f"micro-batch {micro} ({sources.pop('micro_batch_size', '')}) x dp {dp} x accumulation {accum}"
    elif global_batch is not None:
        values["batch_size"] = global_batch
        sources["batch_size"] = sources.pop("global_batch_size", "")
    sources.pop("global_batch_size", None)
    if "batch_size" not in values and batch_size is not None:
        values["batch_size"], sources["batch_size"] = batch_size, "-b/--batch-size"
    if "batch_size" not in values and searched == "batch_size":
        values["batch_size"], sources["batch_size"] = dp * accum, "searched (the files give none)"
    if "batch_size" not in values:
        raise InvalidInputError("--from", ", ".join(str(p) for p in paths), "launch files that give the batch size, "
                                "or -b (the global batch)", "none of the files gives one")
    notes.append(f"global batch {values['batch_size']} = micro-batch {values['batch_size'] // (dp * accum)} x dp {dp}"
                 f" x accumulation {accum}")
    if "seq_len" not in values and seq_len is None and searched == "seq_len":
        values["seq_len"], sources["seq_len"] = cp, "searched (the files give none)"
    if "seq_len" not in values:
        if seq_len is None:
            raise InvalidInputError("--seq-len", None, "the sequence length (the files give none)",
                                    "the memory depends on the longest batch")
        values["seq_len"], sources["seq_len"] = seq_len, "--seq-len"
    if "profile" not in values:     # the readers describe the run in the measured profile's options
        values["profile"], sources["profile"] = "measured", "the launch formats' (their options are the measured profile's)"
    unset = [f"{name} ({attrs.fields_dict(Scenario)[name].default!r})" for name in
             ("precision", "optimizer", "activation_checkpointing") if name not in values]
    if unset:
        notes.append(f"not given by the files (mlsysim's defaults): {', '.join(unset)}")
    scenario = Scenario.from_dict(values, where="launch files", options=option_fields(registry))
    return Launch(scenario=scenario, readings=tuple(readings), sources=sources, notes=tuple(notes))


def _derived(f: LaunchField, values: dict, sources: dict) -> LaunchField:
    """A derived field resolved from the merged ``values`` (`LaunchField.derive`), its note saying from what."""
    if f.derive is None:
        return f
    merged = {name: values[name] for name in f.derived_from if name in values}
    change = f.derive(merged) or {"becomes": None}
    given = "; ".join(f"{n}={v!r} from {sources.get(n)}" for n, v in merged.items())
    given = given or ", ".join(f.derived_from) + ": none given"
    return attrs.evolve(f, **{**change, "note": f"{change.get('note', f.note)} (derived from {given})"}, derive=None)


def _same(a, b) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        from .registry import name_key
        return name_key(a) == name_key(b)
    return a == b


def _world_size(readings, gpus) -> tuple[int | None, str]:
    """``(world size, where it came from)``: ``--gpus``, else the files' device counts (two files
    that disagree are refused), else 1 for a single-device recipe; ``(None, "")`` when unknown."""
    hinted = []
    for r in readings:
        w = r.world
        if "gpus" in w:
            hinted.append((w["gpus"][1], f"{r.path}: {w['gpus'][0]}"))
        elif "nodes" in w and "gpus_per_node" in w:
            hinted.append((w["nodes"][1] * w["gpus_per_node"][1],
                           f"{r.path}: {w['nodes'][0]} x {w['gpus_per_node'][0]}"))
    single = [r for r in readings if "single_device" in r.world]
    if single and gpus not in (None, 1):
        raise InvalidInputError("--gpus", gpus, "1, or leave --gpus out", f"{single[0].path}: "
                                f"{single[0].world['single_device'][0]} is a single-device recipe")
    if gpus is not None:
        for value, where in hinted:
            if value != gpus:
                raise InvalidInputError("--gpus", gpus, f"{value} (what {where} says), or leave --gpus out",
                                        f"--gpus {gpus} and {where} = {value} contradict each other")
        return gpus, "--gpus"
    if hinted:
        values = {v for v, _ in hinted}
        if len(values) > 1:
            raise InvalidInputError("--from", hinted[1][1], f"files that agree on the device count ({hinted[0][1]} "
                                    f"says {hinted[0][0]})", "they contradict each other")
        return hinted[0][0], hinted[0][1]
    if single:
        return 1, f"{single[0].path}: {single[0].world['single_device'][0]} (a single-device recipe)"
    return None, ""


# --- estimate(): the CLI's `estimate` in Python ------------------------------------------------------
# ``TrainingMemoryModel()`` keeps the reference package's contract (the ``reference`` profile by
# default); ``estimate()`` answers as the command line does: the ``measured`` profile unless
# ``profile`` says otherwise, and a run the profile does not model refused (``NotModelledError``),
# never answered by another profile.


# --- what the input left to an assumption: said beside every answer ----------------------------
# (``estimate`` and ``Scenario.solve`` put them first in the result's notes, so its JSON and explain
# carry them; the CLI prints them first and in its JSON's ``input_notes``)

SP_AT_TP1 = ("--sequence-parallel with tp 1 does nothing: sequence parallelism splits the norms' and residual "
             "activations over the tensor-parallel group (Megatron-LM turns it off at tp 1)")


def input_notes(model, sequence_parallel=None, tp_size=1) -> list[str]:
    """What a run's input left to an assumption: the transformers defaults a Hugging Face
    config.json's missing fields took (``model_notes``), and ``sequence_parallel=True`` at tp 1,
    which does nothing (accepted, as Megatron-LM's validate_args turns it off there: "Disabling
    sequence parallelism because tensor model parallelism is disabled", megatron/training/arguments.py;
    so does the megatron reader)."""
    notes = model_notes(model)
    if sequence_parallel is True and tp_size == 1:
        notes.append(SP_AT_TP1)
    return notes


def model_notes(model) -> list[str]:
    """The transformers defaults a Hugging Face config.json model (its fields, a config.json path or
    the folder holding one) took (``hf.defaults_note``), if any; any other model: none."""
    config = _hf_config(model)
    if config is None:
        return []
    from .hf import defaults_note
    try:
        text = defaults_note(config)
    except InvalidInputError:
        return []     # (solving refuses the config, naming why)
    return [text] if text else []


def _hf_config(model):
    """The Hugging Face config ``model`` is (its fields, or a config.json path or folder, as the CLI's
    ``--model`` reads them), else None."""
    if isinstance(model, Path):
        model = str(model)
    if isinstance(model, dict):
        return model if "model_type" in model else None
    if not isinstance(model, str) or not model.strip():
        return None
    path = Path(model)
    try:
        if not model.endswith(".json") and path.is_dir():
            path = path / "config.json"
        if path.name.endswith(".json") and path.is_file():
            data = json.loads(path.read_text(encoding="utf-8-sig"))
            return data if isinstance(data, dict) and "model_type" in data else None
    except (OSError, ValueError, RecursionError):     # (solving names what is wrong with it)
        return None
    return None


def with_input_notes(result, notes):
    """``result`` with ``notes`` first among its notes (its JSON and explain say them)."""
    return attrs.evolve(result, notes=(*notes, *result.notes)) if notes else result


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
    estimate: ``TrainingMemoryModel().solve`` with the same arguments. What the input left to an
    assumption (``input_notes``: a partial config.json's transformers defaults, ``sequence_parallel``
    at tp 1) comes first in the result's notes.
    """
    from ._checks import whole_microbatches
    from .solver import TrainingMemoryModel
    sizes = (batch_size, solve_options.get("dp_size", 1), solve_options.get("gradient_accumulation_steps", 1))
    if all(type(n) is int and n >= 1 for n in sizes):      # (else the solve names the bad one)
        whole_microbatches(*sizes)
    solver = TrainingMemoryModel(profile, plugin_manager=plugin_manager)
    with _naming_unloaded(solve_options, solver):
        result = solver.solve(_cli_model(model), _cli_hardware(hardware), batch_size, seq_len, **solve_options)
    return with_input_notes(result, input_notes(model, solve_options.get("sequence_parallel"),
                                                solve_options.get("tp_size", 1)))


@contextlib.contextmanager
def _naming_unloaded(given, solver):
    """A keyword solve refuses (``given``'s) that a plugin not loaded declares: the error says so."""
    try:
        yield
    except InvalidInputError as err:
        unloaded = unloaded_options([err.parameter], solver.plugin_manager) if err.parameter in given else ""
        if not unloaded:
            raise
        try:
            new = type(err)(err.parameter, err.value, err.allowed, "; ".join(filter(None, (err.detail, unloaded))))
        except TypeError:     # a subclass with its own signature
            raise err from None
        raise new from err


def _cli_model(value):
    """Catalog names, model files and checkpoint folders as the CLI reads them; objects as they are."""
    from .cli import _model as read
    return _cli_read(value, read, "model")


def _cli_hardware(value):
    from .cli import _hardware as read
    return _cli_read(value, read, "hardware")


def _cli_read(value, read, parameter: str):
    """A name or path (str or Path) through the CLI's reader, naming ``parameter``; anything else as it is."""
    if isinstance(value, Path):
        value = str(value)
    return read(value, parameter=parameter) if isinstance(value, str) else value
