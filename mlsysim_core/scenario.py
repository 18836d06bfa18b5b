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

import json
import math
import re
from pathlib import Path
from typing import Any

import attrs

from .errors import InvalidInputError, InvalidInputTypeError

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
            raise InvalidInputError(where, ", ".join(unknown), f"known fields: {', '.join(sorted({*own, *options}))}",
                                    "unknown field(s)")
        missing = [name for name in ("model", "hardware", "batch_size") if name not in data]
        if missing:
            raise InvalidInputError(where, ", ".join(missing), "model, hardware and batch_size are required",
                                    "missing field(s)")
        _check_fields(data, where, options)
        check_contradictions({name: (f"{where}'s {name}" if where != "scenario" else name, data[name])
                              for name in data})
        # Values are checked by solve() itself, with the same messages as from Python.
        data = _normalised(data, options, where)
        return cls(**{k: v for k, v in data.items() if k in own},
                   profile_options={k: v for k, v in data.items() if k not in own})

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
                    from .serialization import parse_json
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
        regime = getattr(result, "regime", None) or o.get("regime")
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
        details.update({name: value for name, value in o.items() if name not in details and name not in shown})
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
        return solver.solve(self.resolve_model(), self.resolve_hardware(), **self.solve_kwargs())


_DEFAULT_PRECISION = "fp16"     # (Scenario.precision's default)


# --- inputs that contradict each other --------------------------------------------------

REGIMES_HOOK = "mlsysim_measured_regimes"     # (the measured profile's regimes, by name)


def regime_precisions(regime) -> tuple[str, ...]:
    """The ``precision`` values that agree with a training regime (a ``Regime``): those whose
    bytes are the regime's compute bytes, and of the 16-bit ones only the one its name says
    (``mixed-bf16``: bf16; ``fp32``: fp32 or tf32; ``amp-fp16``: fp16)."""
    from .plan import PRECISION_BYTES
    from .registry import name_key
    fits = tuple(p for p, size in PRECISION_BYTES.items() if size == getattr(regime, "compute", None))
    named = tuple(p for p in fits if p in ("bf16", "fp16") and p in name_key(str(getattr(regime, "name", ""))))
    return named or fits


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
