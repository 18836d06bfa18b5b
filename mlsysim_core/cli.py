"""The `mlsysim-core` command: estimate, plot, plugins, models, hardware.

Exit codes: 0 ok; 2 bad input (the message names the parameter, the value and what is
allowed); 3 a plugin failed to load or broke its contract, or the installation is broken. ``--debug`` shows tracebacks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path

from .errors import InvalidInputError, MlsysimError, NotModelledError

from .defaults import DEFAULT_BATCH, DEFAULT_HARDWARE, DEFAULT_MODEL, DEFAULT_PROFILE  # noqa: F401 (re-exported)


def _add_solve_flags(parser: argparse.ArgumentParser, registry) -> None:
    """The flags of one solve, shared by `estimate` and `plot`."""
    # Every solve option defaults to None here, so that a --scenario file fills what the
    # flags leave out; built-in defaults (solve's own) come last.
    parser.add_argument("--scenario", metavar="FILE",
                        help="a .json or .toml scenario file; flags given as well override its values")
    parser.add_argument("--model", "-m",
                        help=f"catalog name (see `models`), a JSON file of model fields, or a Hugging Face "
                             f"config: path/config.json or the directory holding it (default {DEFAULT_MODEL})")
    parser.add_argument("--hardware", "-g",
                        help=f"catalog name (see `hardware`) or a JSON file (default {DEFAULT_HARDWARE})")
    parser.add_argument("--batch-size", "-b", type=int,
                        help=f"GLOBAL batch over all DP replicas and accumulation steps (default {DEFAULT_BATCH})")
    parser.add_argument("--seq-len", "-s", type=int, help="sequence length (default 2048)")
    parser.add_argument("--precision", help="fp32, tf32, bf16, fp16 (default); fp8, int8, int4 under --profile "
                        "reference only (the measured profile's float8 training: --precision bf16 --regime bf16 "
                        "--float8 NAME; its 8- and 4-bit weights: QLoRA, --quantization)")
    parser.add_argument("--optimizer", help="an installed optimizer (see `plugins`; default adam)")
    parser.add_argument("--activation-checkpointing", "--checkpointing", dest="activation_checkpointing",
                        help="none, selective (default), full, or an installed strategy")
    parser.add_argument("--tp-size", "--tp", dest="tp_size", type=int)
    parser.add_argument("--pp-size", "--pp", dest="pp_size", type=int)
    parser.add_argument("--dp-size", "--dp", dest="dp_size", type=int)
    parser.add_argument("--ep-size", "--ep", dest="ep_size", type=int)
    parser.add_argument("--cp-size", "--cp", dest="cp_size", type=int,
                        help="context parallelism: the sequence split over cp ranks (default 1)")
    parser.add_argument("--zero-stage", "--zero", dest="zero_stage", type=int)
    parser.add_argument("--gradient-accumulation-steps", "--grad-accum", dest="gradient_accumulation_steps",
                        type=int)
    parser.add_argument("--trainable-fraction", type=float, help="default 1.0")
    parser.add_argument("--communication-buffer-fraction", "--comm-buffer-fraction",
                        dest="communication_buffer_fraction", type=float, help="default 0.05")
    parser.add_argument("--sequence-parallel", dest="sequence_parallel", action="store_const", const=True,
                        help="with tp > 1, shard the norms' and residual activations over tp too (default: "
                             "the profile's: on for reference, off for measured)")
    parser.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_const", const=False,
                        help="with tp > 1, do not divide the replicated activations by tp")
    parser.add_argument("--data-parallel", metavar="RULE",
                        help="a data-parallel sharding rule by name (instead of --zero-stage)")
    parser.add_argument("--rule", action="append", default=[], metavar="AXIS=RULE",
                        help="replace the default rule of an axis: tp, cp, pp or ep (the data-parallel rule: "
                             "--data-parallel), e.g. --rule cp=cp-ulysses or --rule tp=myorg.tp2d")
    parser.add_argument("--option", action="append", default=[], metavar="SPEC.FIELD=VALUE",
                        help="set a plugin option, e.g. --option demo.galore.rank=64 (repeatable)")
    parser.add_argument("--include-plugin", action="append", default=[], metavar="NAME",
                        help="let this plugin's component hooks add their terms too")
    parser.add_argument("--profile", help=_PROFILE_HELP)
    parser.set_defaults(option_fields=_add_option_flags(parser, registry)[0],
                        defer_conflicts=True)     # (refused by scenario_from_args, an InvalidInputError)


def _add_launch_flags(parser: argparse.ArgumentParser, search: bool = False) -> None:
    """The launch-file flags (docs/launch.md), shared by `estimate`, `fit` and `search`."""
    parser.add_argument("--from", dest="launch_from", action="append", default=[], metavar="FILE",
                        help="a launch config the run is started with (torchtune recipe YAML, LitGPT YAML, "
                             "torchtitan TOML/JSON, ... see docs/launch.md); repeatable: several files make one "
                             "run; flags given as well override its values")
    if not search:
        parser.add_argument("--gpus", type=int, metavar="N", help="with --from: the number of GPUs the run uses "
                            "(the world size; the data-parallel size is N / (tp x pp x cp))")
    parser.add_argument("--nodes", type=int, metavar="N", help="with --from: nodes (x --gpus-per-node: the world size)")
    parser.add_argument("--gpus-per-node", type=int, metavar="N", help="with --from: GPUs per node")
    parser.add_argument("--framework-version", metavar="VERSION",
                        help="with --from: the framework version whose implicit defaults apply (default: the "
                             "version each reader names)")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="with --from: a recipe override, as `tune run ... KEY=VALUE` (repeatable)")


_PROFILE_HELP = ("profile to use (see `plugins`; default measured: a run it does not model is refused, naming "
                 "what is missing; --profile reference gives the textbook estimate)")


# --- the profiles' own options -------------------------------------------------------------
# Each option of an installed profile (`scenario.option_fields`) is a flag of the solve
# commands, made from the field's metadata (e.g. plugins/mlsysim_plugins/measured/options.py):
# help, metavar, choices (argparse's; the help names the profiles); type (int, float, str (the
# default) or a callable whose ValueError is the message; None: no value flag of its own);
# flag (a spelling or a tuple; default --NAME with - for _); flags (more flags that set it,
# dicts with flag, help and "const", the value set, or "key", the table key set, with its own
# type, metavar, choices, const, parse, and "required": what a key no table goes without is;
# "what": what the table asks for); parse (applied to the value given by a flag or a file; its
# errors name the flag); layout (why `search` refuses it); also (a callable of the registry: what the
# option takes beyond its choices with these plugins installed, e.g. float8's implementation names, which
# the help adds; the flag then passes any value to the option's own check). Files: from_file (scenario.py).

def _flags(spec: dict, name: str = "") -> tuple[str, ...]:
    flag = spec.get("flag") or "--" + name.replace("_", "-")
    return (flag,) if isinstance(flag, str) else tuple(flag)


def _flag_of(name: str, field) -> str:
    """The flag that names an option in messages: its own, else the first that sets it."""
    meta = field.metadata
    return next((_flags(f)[0] for f in meta.get("flags") or ()), _flags(meta, name)[0]) \
        if meta.get("type", str) is None else _flags(meta, name)[0]


def _argparse_type(convert):
    if convert in (int, float, str):     # (argparse's own messages)
        return convert

    def typed(text: str):
        try:
            return convert(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
    return typed


def _choice_spelling(convert, choices):
    """``convert``, then the one choice a value spells with case and separators ignored (as
    every other name: ``registry.name_key``); anything else is left for argparse to refuse."""
    from .registry import name_key

    def spelled(text: str):
        value = convert(text)
        if isinstance(value, str) and value not in choices:
            same = [c for c in choices if isinstance(c, str) and name_key(c) == name_key(value)]
            if len(same) == 1:
                return same[0]
        return value
    return spelled


def _add_option_flags(parser: argparse.ArgumentParser, registry, search: bool = False):
    """The flags of every installed profile's options: ``(fields, refused)``. ``search``: only
    the options `search_plans` takes; ``refused`` holds (flags, why, takes a value) of the
    per-layout ones, which `search` refuses by name."""
    from .scenario import option_fields
    from .inputs import options_fields
    fields = option_fields(registry) if registry is not None else {}
    if search:
        import inspect
        from .search import search_plans
        taken = inspect.signature(search_plans).parameters
    refused = []
    for name, field in fields.items():
        meta = field.metadata
        specs = [({**meta, "flag": _flags(meta, name)}, name)] if meta.get("type", str) is not None else []
        specs += [({**spec, "flag": _flags(spec)}, f"{name}.{spec['key']}" if "key" in spec else name)
                  for spec in meta.get("flags") or ()]
        if any(flag in parser._option_string_actions for spec, _ in specs for flag in spec["flag"]):
            continue     # a flag the command has already: never two meanings
        if search and meta.get("layout"):
            refused += [(spec["flag"], f"search enumerates the layout itself; {meta['layout']}", "const" not in spec)
                        for spec, _ in specs]
            continue
        if search and name not in taken:
            continue
        owners = " and ".join(spec.name for spec in registry.profiles.values() if name in options_fields(spec))
        for spec, dest in specs:
            help = f"{owners} profile: {spec.get('help') or f'its option {name}'}".replace("%", "%%")
            if "const" in spec:
                parser.add_argument(*spec["flag"], dest=dest, action="store_const", const=spec["const"], help=help)
                continue
            metavar = spec.get("metavar") or (None if spec.get("choices") else
                                              spec["flag"][0].lstrip("-").replace("-", "_").upper())
            convert = _argparse_type(spec.get("type") or str)
            choices = spec.get("choices")
            if callable(choices):     # the names a registry holds (e.g. --quant-implementation's)
                choices = tuple(choices(registry))
            if callable(spec.get("also")) and (also := spec["also"](registry)):
                # (more names than its choices, read by the option's own check: the flag passes any through)
                metavar, choices = spec.get("metavar") or "NAME", None
                help += f"; {also}".replace("%", "%%")
            if choices:     # a spelling of a choice (case, -, _, space) is that choice
                convert = _choice_spelling(convert, choices)
            parser.add_argument(*spec["flag"], dest=dest, type=convert,
                                choices=choices, metavar=metavar, help=help)
    return fields, refused


def _parsed(spec: dict, value, flag: str):
    """``value`` as the metadata's ``parse`` reads it; a bad one is named by ``flag``."""
    if spec.get("parse") is None:
        return value
    try:
        return spec["parse"](value)
    except InvalidInputError as err:
        raise type(err)(flag, err.value, err.allowed, err.detail) from err


def _option_values(args, data: dict) -> dict:
    """``data`` (a scenario's fields) with the profile options the flags give: a flag replaces
    the scenario's value, a key flag (--lora-rank) the table's key; each read by its ``parse``."""
    data = dict(data)
    for name, field in getattr(args, "option_fields", {}).items():
        if getattr(args, name, None) is not None:
            data[name] = getattr(args, name)
        keys = [spec for spec in field.metadata.get("flags") or () if "key" in spec]
        given = {spec["key"]: (spec, getattr(args, f"{name}.{spec['key']}", None)) for spec in keys}
        given = {key: item for key, item in given.items() if item[1] is not None}
        if given:
            table = {} if data.get(name) is None else data[name]
            if not isinstance(table, dict):      # e.g. --no-runtime-overheads with --allocator
                flag, value = next((_flags(spec)[0], value) for spec, value in given.values())
                raise InvalidInputError(flag, value, f"not given with {_flag_of(name, field)}",
                                        f"{_flag_of(name, field)} sets {name}={table!r}, which has no {flag}")
            for need in (spec for spec in keys if spec.get("required")):
                if need["key"] not in given and need["key"] not in table:    # never a silent default
                    flag, value = next((_flags(spec)[0], value) for spec, value in given.values())
                    raise InvalidInputError(flag, value, f"given with {_flags(need)[0]} {need.get('metavar')} "
                                            f"({need['required']})", f"{flag} describes {field.metadata.get('what')}, "
                                            f"and {_flags(need)[0]} is what asks for one")
            data[name] = {**table, **{key: _parsed(spec, value, _flags(spec)[0])
                                      for key, (spec, value) in given.items()}}
        if data.get(name) is not None:
            data[name] = _parsed(field.metadata, data[name], _flag_of(name, field))
    return data


def _builtin_registry():
    """The built-in plugins' registry (None if they fail to load): whose profiles' options the
    parser's flags are when no other is given (the CLI reference, docs/cli.md)."""
    from .manager import PluginManager
    try:
        pm = PluginManager()
        pm.load_entrypoints(third_party=False)
        return pm.registry
    except MlsysimError:
        return None


# --- flags given twice, or two flags that set one value -------------------------------------
# Every single-valued flag is recorded as it is parsed (`_Parser`'s actions): the same value set
# twice with different values (--sequence-parallel --no-sequence-parallel, --precision bf16
# --precision fp32) is refused, naming both, never the last silently winning. The solve commands
# refuse it in `scenario_from_args` (an InvalidInputError, exit 2); other commands at parse time.

def _record(namespace, action, option_string, value) -> None:
    """``namespace._given[dest] = (flag, value, as typed)``; the first value set twice
    differently is ``namespace._conflict``."""
    given = namespace.__dict__.setdefault("_given", {})
    flag = option_string or action.dest
    typed = flag if action.nargs == 0 else f"{flag} {value}"
    first = given.setdefault(action.dest, (flag, value, typed))
    if not _same_value(first[1], value) and not getattr(namespace, "_conflict", None):
        namespace._conflict = (action.dest, first, (flag, value, typed))


def _same_value(a, b) -> bool:
    """Two values of one flag that say the same: equal, or two spellings of one name (case and
    separators, as every name is read: ``bf16`` and ``BF16``); file paths are compared as written.
    Two NaNs say the same (NaN != NaN: the value's check refuses it, naming the flag once)."""
    if a is b or a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b):
        return True
    if not (isinstance(a, str) and isinstance(b, str)) or any("/" in v or v.endswith((".json", ".toml"))
                                                              for v in (a, b)):
        return False
    from .registry import name_key
    return name_key(a) == name_key(b)


class _Store(argparse._StoreAction):
    def __call__(self, parser, namespace, values, option_string=None):
        _record(namespace, self, option_string, values)
        super().__call__(parser, namespace, values, option_string)


class _StoreConst(argparse._StoreConstAction):
    def __call__(self, parser, namespace, values, option_string=None):
        _record(namespace, self, option_string, self.const)
        super().__call__(parser, namespace, values, option_string)


class _StoreTrue(argparse._StoreTrueAction):
    def __call__(self, parser, namespace, values, option_string=None):
        _record(namespace, self, option_string, self.const)
        super().__call__(parser, namespace, values, option_string)


class _StoreFalse(argparse._StoreFalseAction):
    def __call__(self, parser, namespace, values, option_string=None):
        _record(namespace, self, option_string, self.const)
        super().__call__(parser, namespace, values, option_string)


def _conflict_error(conflict) -> InvalidInputError:
    """The error for one value given twice: both flags and both values named."""
    dest, (first, one, typed_first), (second, other, typed_second) = conflict
    if first == second:
        return InvalidInputError(second, other, f"{second} once (or twice with one value)",
                                 f"{typed_first} and {typed_second} contradict each other: the last would "
                                 "silently win")
    return InvalidInputError(second, other, f"one of {first} and {second}, not both",
                             f"{typed_first} ({dest}={one!r}) and {typed_second} ({dest}={other!r}) contradict "
                             "each other: the last would silently win")


class _Parser(argparse.ArgumentParser):
    """The command's parsers: flags recorded as parsed (`_record`); a parser whose command
    does not refuse a conflict itself (``defer_conflicts``) refuses it here (exit 2)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, cls in ((None, _Store), ("store", _Store), ("store_const", _StoreConst),
                          ("store_true", _StoreTrue), ("store_false", _StoreFalse)):
            self.register("action", name, cls)

    def parse_known_args(self, args=None, namespace=None):
        namespace, rest = super().parse_known_args(args, namespace)
        if getattr(namespace, "defer_conflicts", False):
            return namespace, rest
        conflict = getattr(namespace, "_conflict", None)
        if conflict:
            self.error(str(_conflict_error(conflict)))
        given = getattr(namespace, "_given", {})
        if "regime" in given and "precision" in given:     # (`search`: no scenario_from_args)
            from .scenario import check_contradictions
            try:
                check_contradictions({dest: (flag, value) for dest, (flag, value, _) in given.items()})
            except InvalidInputError as err:
                self.error(str(err))
        return namespace, rest


def _parser(registry=None) -> argparse.ArgumentParser:
    """The command's parser; the profile-option flags are those of ``registry``'s profiles
    (default: the built-in plugins')."""
    if registry is None:
        registry = _builtin_registry()
    # Plugin-loading flags work before or after the subcommand.
    common = _Parser(add_help=False)
    common.add_argument("--disable-plugin", action="append", metavar="NAME", default=argparse.SUPPRESS,
                        help="skip this plugin (repeatable; also MLSYSIM_DISABLED_PLUGINS=a,b)")
    common.add_argument("--no-third-party-plugins", action="store_true", default=argparse.SUPPRESS,
                        help="load only the built-in plugins (also MLSYSIM_DISABLE_PLUGIN_AUTOLOAD=1)")
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help="show tracebacks")
    parser = _Parser(
        prog="mlsysim-core", parents=[common],
        description="How much memory one accelerator needs to train a model, and does it fit. "
                    "GB = 1e9 bytes, GiB = 2^30 bytes.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    est = sub.add_parser("estimate", parents=[common], help="memory of one accelerator for one configuration",
                         description="Solve one configuration. With no flags: Llama-3.1-8B on an "
                                     "H100, global batch 8, sequence 2048, fp16 Adam, selective "
                                     "checkpointing.")
    _add_solve_flags(est, registry)
    _add_launch_flags(est)
    est.add_argument("--save-scenario", metavar="FILE",
                     help="write the scenario solved to a file: TOML for a .toml name, JSON otherwise")
    est.add_argument("--json", action="store_true", help="print the full result as JSON (bytes)")
    est.add_argument("--explain", action="store_true", help="show where every byte comes from")
    est.add_argument("--no-chart", dest="chart", action="store_false",
                     help="leave out the text bar chart under the table")

    plot = sub.add_parser(
        "plot", parents=[common], help="draw a picture: bars, timeline or sweep (PNG or SVG)",
        description="Draw a picture of one configuration (the same flags as `estimate`). "
                    "bars: stacked components against the capacity, one bar per value of --vary; "
                    "timeline: bytes alive in each phase of one iteration; "
                    "sweep: memory against the micro-batch (--sweep batch) or the sequence length "
                    "(--sweep seq), with the largest value that fits. Needs matplotlib: "
                    "pip install 'mlsysim-core[plot]'.")
    plot.add_argument("kind", choices=("bars", "timeline", "sweep"), help="which picture")
    plot.add_argument("--output", "-o", required=True, metavar="FILE",
                      help="where to write it; .png or .svg")
    plot.add_argument("--sweep", choices=("batch", "seq"),
                      help="sweep: the micro-batch per accelerator (default) or the sequence length")
    plot.add_argument("--vary", metavar="FIELD",
                      help="bars: one bar per value of this scenario field, e.g. zero_stage, hardware, profile")
    plot.add_argument("--values", metavar="V1,V2,...",
                      help="sweep: the values (default 1,2,4,...,64 for batch, 512..32768 for seq); "
                           "bars: the values of --vary (default for --vary profile: reference,measured)")
    plot.add_argument("--title", help="replace the picture's title")
    _add_solve_flags(plot, registry)

    fit = sub.add_parser(
        "fit", parents=[common], help="inverse solves: the largest batch or sequence, the fewest devices",
        description="Search what fits, naming the binding component and the headroom. "
                    "batch: the largest micro-batch (and the global batch it makes); "
                    "seq: the longest sequence at --batch-size; "
                    "devices: the fewest devices for the layout shape --tp/--pp/--ep (dp grows; "
                    "--batch-size is the global batch). Same flags as `estimate`, except the one for the searched value "
                    "(--batch-size for batch, --seq-len for seq, --dp-size for devices), which is refused. "
                    "seq searches only sequences that --cp-size divides. "
                    "techniques: the memory-saving techniques that make the run fit with the least added step "
                    "time, as a ladder (measured profile; docs/profiles.md).")
    fit.add_argument("question", choices=("batch", "seq", "devices", "techniques"), help="what to search")
    for flag, what in (("--flops", "the device's FLOP/s (default: the catalog's peak bf16 dense, if any)"),
                       ("--host-link-gbps", "host-link bandwidth in GB/s (10^9 bytes/s, not gigabits)"),
                       ("--host-memory-gbps", "host-memory bandwidth in GB/s, for a CPU optimizer step")):
        fit.add_argument(flag, type=float, help=f"techniques: {what}")
    fit.add_argument("--multiple-of", type=int, help="seq: only multiples of this (e.g. 128; default 1)")
    fit.add_argument("--json", action="store_true", help="the answer and both bracketing results as JSON")
    _add_solve_flags(fit, registry)
    _add_launch_flags(fit)

    srch = sub.add_parser(
        "search", parents=[common], help="every parallel layout for a device count: what fits, the Pareto front",
        description="Enumerate every valid layout (tp, cp, pp, dp, ep, data-parallel rule, checkpointing, "
                    "sequence parallelism, micro-batch) of --devices accelerators for --global-batch, keep "
                    "those that fit, rank them by step time (seconds per step, tokens/s and MFU: "
                    "the step-time model, docs/planner.md), and show the Pareto front of memory headroom against "
                    "step time. The hardware needs its topology (peak FLOP/s, intra- and inter-node bandwidth, "
                    "devices per node); TP and EP groups stay inside a node unless --allow-cross-node-tp / "
                    "--allow-cross-node-ep. Every layout is solved under one profile (default measured; a run it "
                    "cannot describe is refused, naming what is not modelled, never answered by another profile; "
                    "layouts it cannot describe are left out and counted). The layout flags of `estimate` (--tp, --pp, --dp, --ep, --cp-size, "
                    "--zero-stage, --data-parallel, --grad-accum, --no-sequence-parallel{layout}) are refused: "
                    "search enumerates the layout itself.")
    srch.add_argument("--devices", "-n", "--gpus", type=int, help="number of accelerators (required, except with "
                      "--from: the launch files' world size)")
    srch.add_argument("--global-batch", type=int, help="sequences per optimizer step (required, except with --from)")
    _add_launch_flags(srch, search=True)
    srch.add_argument("--model", "-m", default=DEFAULT_MODEL, help=f"catalog name or JSON file (default {DEFAULT_MODEL})")
    srch.add_argument("--hardware", "-g", default=DEFAULT_HARDWARE, help=f"catalog name or JSON file (default {DEFAULT_HARDWARE})")
    srch.add_argument("--seq-len", "-s", type=int, default=2048, help="sequence length (default 2048)")
    srch.add_argument("--precision", default="fp16", help="default fp16")
    srch.add_argument("--optimizer", default="adam", help="default adam")
    srch.add_argument("--activation-checkpointing", "--checkpointing", dest="checkpointing", nargs="+",
                      metavar="NAME", help="the checkpointing strategies to consider (default: every installed one)")
    srch.add_argument("--profile", help=_PROFILE_HELP)
    fields, layout = _add_option_flags(srch, registry, search=True)
    srch.description = srch.description.replace("{layout}", "".join(", " + flags[0] for flags, _, _ in layout))
    srch.add_argument("--headroom", metavar="GIB|N%", help="memory kept free on top of the total (which already has "
                      "the runtime overheads): GiB (e.g. 4) or a share of the capacity (e.g. 10%%); default 0")
    srch.add_argument("--all", action="store_true", help="list every layout that fits, not only the Pareto front")
    srch.add_argument("--rows", type=int, default=25, help="rows to print (default 25; 0: all of them)")
    srch.add_argument("--json", action="store_true", help="every layout that fits and the front, as JSON")
    srch.add_argument("--max-tp", type=int, metavar="N", help="the largest tensor-parallel size (default: a node's devices)")
    srch.add_argument("--allow-cross-node-tp", action="store_true",
                      help="let tensor- and expert-parallel groups span nodes (default: inside a node)")
    for flag, what in (("--allow-cross-node-ep", "let EP groups span nodes, TP ones not (all-to-all over the NICs)"),
                       ("--interleave", "also try interleaved 1F1B at pp > 1, v chunks per rank dividing a stage's layers"),
                       ("--allow-compile", "also try each layout with compile='blocks' (fused ops), refusals counted")):
        srch.add_argument(flag, action="store_true", help=what + " (docs/planner.md: the search space)")
    from .search import float8_names as names_of, float8_readings
    float8_names = names_of(registry) if registry is not None else {}
    float8s = ", ".join(n for n, (i, _) in float8_names.items() if i is not None and i.name == n) or "none installed"
    readings = (f"; or a name as `estimate --float8` takes it, read as the implementation that declares it as its "
                f"memory: {float8_readings(float8_names)}" if float8_names else "").replace("%", "%%")
    float8s = float8s.replace("%", "%%")
    srch.add_argument("--allow-float8", nargs="?", const=True, default=False, metavar="IMPL",
                      help="also try each layout in float8, timed with IMPL's casts (a registered float8 "
                           f"implementation: {float8s}; bare: torchao-tensorwise, its memory float8='tensorwise'"
                           f"{readings}), "
                           "refusals counted (docs/planner.md: the search space)")
    srch.add_argument("--option", action="append", default=[], metavar="SPEC.FIELD=VALUE",
                      help="a plugin option for the layouts that select its spec (as `time --option`), e.g. "
                           "--option fsdp.gradient_sync=no_sync (the fsdp layouts), --option cp.ring=transformer-engine "
                           "(repeatable)")
    srch.add_argument("--cp", type=int, nargs="+", metavar="N",
                      help="context-parallel sizes to consider (default: every one that divides --seq-len)")
    srch.add_argument("--workers", type=int, default=None, metavar="N",
                      help="processes evaluating layouts (default: every usable CPU for a large search, "
                           "see mlsysim_core.search.PARALLEL_MIN; 1: in this process)")
    srch.add_argument("--progress", dest="progress", action="store_const", const="always", default="auto",
                      help="progress on stderr from the start (default: a bar on a terminal once a search has run "
                           "half a second; elsewhere, e.g. piped, a line every 5 s once it has run 3 s)")
    srch.add_argument("--no-progress", dest="progress", action="store_const", const="never",
                      help="no progress on stderr (also MLSYSIM_NO_PROGRESS=1)")
    # `estimate`'s layout flags: accepted by the parser (hidden) so that cmd_search refuses
    # them by name (exit 2) instead of argparse's "unrecognized arguments".
    refused = []
    for flags, why, kind in (
            (("--tp-size", "--tp"), "search enumerates the tensor-parallel size itself (powers of two up to a "
                                    "node that divide the heads)", int),
            (("--pp-size", "--pp"), "search enumerates the pipeline-parallel size itself", int),
            (("--dp-size", "--dp"), "search enumerates the data-parallel size itself (devices / (tp x cp x pp))",
             int),
            (("--ep-size", "--ep"), "search enumerates the expert-parallel size itself", int),
            (("--cp-size",), "search enumerates the context-parallel size itself; --cp N [N ...] restricts the "
                             "sizes it considers", int),
            (("--zero-stage", "--zero"), "search enumerates the data-parallel rules itself (zero0-zero3, fsdp, "
                                         "...)", int),
            (("--data-parallel",), "search enumerates the data-parallel rules itself (zero0-zero3, fsdp, ...)",
             str),
            (("--gradient-accumulation-steps", "--grad-accum"), "search enumerates the micro-batch itself; "
                                                               "accumulation makes up --global-batch", int),
            (("--no-sequence-parallel",), "search tries sequence parallelism on and off wherever tp > 1", None),
            *layout,
            (("--batch-size", "-b"), "search takes --global-batch (sequences per optimizer step)", int)):
        dest = "refused_" + flags[0].lstrip("-").replace("-", "_")
        if kind is None:
            srch.add_argument(*flags, dest=dest, action="store_const", const=True, help=argparse.SUPPRESS)
        else:
            srch.add_argument(*flags, dest=dest, help=argparse.SUPPRESS)
        refused.append((flags[-1] if flags[-1].startswith("--") else flags[0], dest, why))
    srch.set_defaults(search_refused=tuple(refused), option_fields=fields)

    tim = sub.add_parser(
        "time", parents=[common], help="one layout's step time, every component (as a search times it)",
        description="Time one parallel layout the way `search` times each of its rows (the step-time model, "
                    "docs/planner.md): seconds per optimizer step, tokens/s, MFU and every component (matmul, "
                    "attention, memory-bound ops, kernels, tp, cp, ep, p2p, bubble, dp, optimizer), with the "
                    "layout's memory under the profile. Devices = tp x cp x pp x dp. Implementation choices a search "
                    "does not enumerate (--compiled, --float8, --async-tp, --ep-overlap, --power-limit) are said "
                    "here.")
    tim.add_argument("--model", "-m", default=DEFAULT_MODEL, help=f"catalog name or JSON file (default {DEFAULT_MODEL})")
    tim.add_argument("--hardware", "-g", default=DEFAULT_HARDWARE,
                     help=f"catalog name or JSON file (default {DEFAULT_HARDWARE})")
    tim.add_argument("--global-batch", "--batch-size", "-b", dest="global_batch", type=int, default=8,
                     help="sequences per optimizer step (default 8)")
    tim.add_argument("--seq-len", "-s", type=int, default=2048, help="sequence length (default 2048)")
    tim.add_argument("--precision", default="fp16", help="default fp16")
    tim.add_argument("--regime", help="the measured profile's training regime (default: the precision's; e.g. "
                     "bf16, pure bf16, which --compiled needs: docs/compile.md)")
    tim.add_argument("--optimizer", default="adam", help="default adam")
    tim.add_argument("--profile", help=_PROFILE_HELP)
    for flags, dest, what in ((("--tp-size", "--tp"), "tp", "tensor"), (("--cp-size", "--cp"), "cp", "context"),
                              (("--pp-size", "--pp"), "pp", "pipeline"), (("--dp-size", "--dp"), "dp", "data"),
                              (("--ep-size", "--ep"), "ep", "expert (inside dp x cp)")):
        tim.add_argument(*flags, dest=dest, type=int, default=1, help=f"{what}-parallel size (default 1)")
    tim.add_argument("--vp", "--virtual-stages", dest="vp", type=int,
                     help="model chunks per pipeline rank (interleaved 1F1B unless --pipeline-schedule names another)")
    tim.add_argument("--pipeline-schedule", help="a registered pipeline schedule (default 1f1b)")
    tim.add_argument("--data-parallel", metavar="RULE", help="the data-parallel rule (default zero0, or zero<N> "
                     "with --zero-stage N): zero0-zero3, fsdp, fsdp-grad-op, hsdp, ...")
    tim.add_argument("--zero-stage", "--zero", dest="zero_stage", type=int, help="the rule zero<N>")
    tim.add_argument("--activation-checkpointing", "--checkpointing", dest="checkpointing", default="selective",
                     help="the checkpointing strategy (default selective)")
    tim.add_argument("--micro-batch", "--microbatch", dest="microbatch", type=int,
                     help="sequences per micro-batch (default: global batch / dp, or from --grad-accum)")
    tim.add_argument("--gradient-accumulation-steps", "--grad-accum", dest="grad_accum", type=int,
                     help="micro-batches per step (the micro-batch is global batch / (dp x this))")
    tim.add_argument("--sequence-parallel", dest="sequence_parallel", action="store_const", const=True,
                     help="tensor parallelism with sequence parallelism, as a search's sp=y rows (default: the "
                          "profile's: off for measured)")
    tim.add_argument("--no-sequence-parallel", dest="sequence_parallel", action="store_const", const=False,
                     help="tensor parallelism without sequence parallelism (default: the profile's)")
    tim.add_argument("--compiled", action="store_true", help="each decoder block torch.compile'd (compile='blocks'): "
                     "the memory-bound ops fused, and the memory of the compiled run")
    tim.add_argument("--float8", nargs="?", const=True, default=False, metavar="IMPL",
                     help="the layers' linears timed in float8 (casts counted), IMPL's casts (a registered float8 "
                          f"implementation: {float8s}; bare --float8: torchao-tensorwise{readings}); the memory is "
                          "a search's float8 row's: with the float8= memory IMPL declares (none: the 16-bit run's), "
                          "said in a note")
    tim.add_argument("--async-tp", action="store_true",
                     help="TP collectives decomposed and overlapped with the GEMMs (async TP, TP comm overlap)")
    tim.add_argument("--ep-overlap", action="store_true", help="EP all-to-alls beside another micro-batch's compute")
    tim.add_argument("--power-limit", type=float, metavar="WATTS",
                     help="the run's power limit (default: the catalog's TDP); the clock scales as (P/TDP)^(1/3)")
    tim.add_argument("--option", action="append", default=[], metavar="SPEC.FIELD=VALUE",
                     help="a plugin option, e.g. a rule's implementation: --option cp.ring=transformer-engine, "
                          "--option fsdp-grad-op.gradient_sync=step, --option pp.stages=ends-one-fewer (repeatable)")
    tim.add_argument("--json", action="store_true", help="the whole answer as JSON (seconds, bytes)")

    plug = sub.add_parser("plugins", parents=[common], help="installed plugins: source distribution and what each provides")
    plug.add_argument("--json", action="store_true")
    mod = sub.add_parser("models", parents=[common], help="models in the catalog")
    mod.add_argument("--json", action="store_true")
    hw = sub.add_parser("hardware", parents=[common], help="accelerators in the catalog")
    hw.add_argument("--json", action="store_true")
    return parser


def _load_json_file(parameter: str, path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))     # (a BOM is allowed)
    except (OSError, ValueError) as err:     # (ValueError: bad JSON, not UTF-8, a 5000-digit number)
        from .scenario import _parse_error
        raise InvalidInputError(parameter, path, "a catalog name or a readable JSON file",
                                _parse_error(err) if isinstance(err, ValueError) else str(err)) from err
    except RecursionError as err:
        raise InvalidInputError(parameter, path, "a JSON file nested at most a few hundred levels deep",
                                "too deeply nested") from err
    if not isinstance(data, dict):
        raise InvalidInputError(parameter, path, "a JSON object of fields")
    from .scenario import MAX_DEPTH, nesting_depth
    if nesting_depth(data) > MAX_DEPTH:
        raise InvalidInputError(parameter, path, f"a JSON file nested at most {MAX_DEPTH} levels deep",
                                "too deeply nested")
    return data


def _model(text: str, parameter: str = "--model"):
    if not text.strip():
        raise InvalidInputError(parameter, text, "a catalog name (see `models`), a JSON file, or a directory "
                                "holding a Hugging Face config.json", "an empty name")
    path = Path(text)
    if not text.endswith(".json") and path.is_dir():      # a Hugging Face checkpoint's directory
        if not (path / "config.json").is_file():
            raise InvalidInputError(parameter, text, "a catalog name, a JSON file, or a directory holding a "
                                    "Hugging Face config.json", f"{path / 'config.json'} does not exist")
        path = path / "config.json"
        text = str(path)
    if not text.endswith(".json") and ("/" in text or "\\" in text) and not path.exists():
        from .catalog import get_model
        try:
            return get_model(text)     # a name with a slash: a catalog key such as meta-llama/llama-3.1-8b
        except InvalidInputError as err:
            hint = str(err.allowed).split("?")[0] + "?" if str(err.allowed).startswith("did you mean") else ""
            raise InvalidInputError(parameter, text, "a catalog name (see `models`), a JSON file, or a directory "
                                    "holding a Hugging Face config.json",
                                    "no such file or directory, and not a catalog name"
                                    + (f"; {hint}" if hint else "")) from err
    if text.endswith(".json") and not path.is_file():
        raise InvalidInputError(parameter, text, "a readable JSON file (a model's fields or a Hugging Face "
                                "config.json)", "no such file" if not path.exists() else "not a file")
    if text.endswith(".json"):
        from .catalog.files import structure_model
        data = _load_json_file(parameter, text)
        if "model_type" in data:     # a Hugging Face config.json
            from .hf import from_hf_config
            # named after its checkpoint folder (docs/hf-import.md), or a renamed file after itself
            name = Path(text).parent.name if Path(text).name == "config.json" else Path(text).stem
            return from_hf_config(data, name=name or None)
        return structure_model(data)     # every problem named model.<field>
    from .catalog import get_model
    return get_model(text)


def _hardware(text: str, parameter: str = "--hardware"):
    if not text.strip():
        raise InvalidInputError(parameter, text, "a catalog name (see `hardware`) or a JSON file",
                                "an empty name")
    if text.endswith(".json"):
        from .catalog.files import structure_hardware
        return structure_hardware(_load_json_file(parameter, text))   # errors name hardware.<field>
    from .catalog import get_hardware
    return get_hardware(text)


def _parse_options(items: list[str]) -> dict[str, dict]:
    options: dict[str, dict] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        spec, dot, field = key.strip().rpartition(".")
        if not sep or not dot or not spec or not field:
            raise InvalidInputError("--option", item, "SPEC.FIELD=VALUE, e.g. demo.galore.rank=64")
        try:
            value = json.loads(raw)
        except RecursionError:
            raise InvalidInputError("--option", item, "SPEC.FIELD=VALUE with a JSON value nested less deeply") \
                from None
        except json.JSONDecodeError:
            value = raw
        except ValueError:     # a number of more than 4300 digits
            raise InvalidInputError("--option", item, "SPEC.FIELD=VALUE with a number of at most 4300 digits") \
                from None
        if field in options.get(spec, {}):     # the last would silently win
            raise InvalidInputError("--option", item, "each SPEC.FIELD once", f"{key.strip()} is given twice")
        options.setdefault(spec, {})[field] = value
    return options


def _parse_rules(items: list[str]) -> dict[str, str]:
    from .specs import DEFAULT_RULES
    rules = {}
    for item in items:
        axis, sep, name = item.partition("=")
        if not sep or not name:
            raise InvalidInputError("--rule", item, f"AXIS=RULE with AXIS one of {', '.join(DEFAULT_RULES)}, "
                                    "e.g. cp=cp-ulysses (the data-parallel rule: --data-parallel)")
        if axis.strip() not in DEFAULT_RULES:
            hint = "; for dp use --data-parallel RULE (or --zero-stage)" if axis.strip() == "dp" else ""
            raise InvalidInputError("--rule", item, f"AXIS=RULE with AXIS one of {', '.join(DEFAULT_RULES)}",
                                    f"{axis.strip()!r} is not an axis with a replaceable rule{hint}")
        if axis.strip() in rules:     # the last would silently win
            raise InvalidInputError("--rule", item, "each AXIS once", f"{axis.strip()} is given twice, first as "
                                    f"{axis.strip()}={rules[axis.strip()]}")
        rules[axis.strip()] = name.strip()
    return rules


def _manager(args):
    """The command's plugin manager (one per command: the same one names a blocked plugin
    when an error needs it, see `_attributed`)."""
    pm = getattr(args, "_plugin_manager", None)
    if pm is None:
        from .manager import PluginManager
        pm = PluginManager.from_environment(autoload=False if args.no_third_party_plugins else None,
                                            blocked=args.disable_plugin)
        args._plugin_manager = pm
    return pm


def _attributed(err, args):
    """``err`` as the user should read it: a model or hardware name that came from the
    scenario file is named as the file's field, not as the flag; and a name that only a
    blocked plugin provides says that the plugin is blocked."""
    original = (getattr(err, "parameter", ""), getattr(err, "detail", "") or "")
    parameter, detail = original
    from_scenario = getattr(args, "_from_scenario", ())
    for flag, field in (("--model", "model"), ("--hardware", "hardware")):
        if parameter == flag and field in from_scenario:
            parameter = field
            detail = f"the scenario {args.scenario}'s {field}" + (f"; {detail}" if detail else "")
    blocked = _blocked_provider(err, args)
    if blocked:
        detail = (f"{detail}; " if detail else "") + blocked
    given = getattr(args, "_given", {})
    if parameter == "data_parallel" and "zero_stage" in given and "data_parallel" not in given:
        detail = (f"{detail}; " if detail else "") + f"given as {given['zero_stage'][2]}"     # (the rule zeroN)
    launch = getattr(args, "_launch", None)     # a value from a launch file: the file and key named
    # (never a value a flag replaced: --rope-cache 1024 is the flag's)
    root = str(parameter).split(".")[0]
    source = launch.sources.get(root) if launch is not None and not {root, str(parameter)} & set(given) else None
    if source and root not in ("hardware",):
        detail = (f"{detail}; " if detail else "") + f"{parameter} comes from {source}"
    if launch is not None:      # the other fields the allowed values name (e.g. "1 with lora and tp_size > 1")
        import re
        named = {str(parameter).split(".")[0], "hardware"}
        for word in re.findall(r"[A-Za-z_]\w*", str(getattr(err, "allowed", "") or "")):
            if word not in named and word not in given and launch.sources.get(word):
                named.add(word)
                detail = (f"{detail}; " if detail else "") + f"{word} comes from {launch.sources[word]}"
    if (parameter, detail) == original:
        return err
    try:
        new = type(err)(parameter, err.value, err.allowed, detail)
    except TypeError:     # a subclass with its own signature
        return err
    new.__cause__ = err
    return new


def _blocked_provider(err, args) -> str:
    """``"the plugin 'adam' that provides it is blocked by ..."`` when the name ``err``
    rejects would be provided by a plugin that MLSYSIM_DISABLED_PLUGINS / --disable-plugin
    blocked; else ``""``."""
    pm = getattr(args, "_plugin_manager", None)
    if pm is None or not pm.blocked_names or not pm.blocked_entry_points:
        return ""
    value = err.value
    if err.parameter == "zero_stage" and type(value) is int:
        value = f"zero{value}"
    if not isinstance(value, str) or not value.strip():
        return ""
    names = {value.strip(), value.strip().lower()}
    blocked_eps = {info.name for info in pm.blocked_entry_points}
    providers = set(names & blocked_eps) if err.parameter in ("include_plugins", "--include-plugin") else set()
    if not providers:
        registry = _every_installed_registry()
        if registry is None:
            return ""
        providers = {info.name for (_kind, name), info in registry.providers.items()
                     if name in names and info.name in blocked_eps}
    if not providers:
        return ""
    which = ", ".join(f"'{p}'" for p in sorted(providers))
    return (f"the plugin {which} that provides it is blocked by MLSYSIM_DISABLED_PLUGINS / --disable-plugin"
            if len(providers) == 1 else
            f"the plugins {which} that provide it are blocked by MLSYSIM_DISABLED_PLUGINS / --disable-plugin")


def _every_installed_registry():
    """The registry of every installed plugin, nothing blocked, third parties too (for naming
    what a blocked or unloaded plugin would provide: error paths only); None if they fail to load."""
    import warnings
    from .manager import PluginManager
    try:
        with warnings.catch_warnings():     # (said once already, by the command's own load)
            warnings.simplefilter("ignore")
            everything = PluginManager()
            everything.load_entrypoints(third_party=True, blocked=())
            with everything.allowing_broken():
                return everything.registry
    except Exception:     # the unblocked set may hold the very plugin that was blocked for breaking
        return None


@contextlib.contextmanager
def _naming_unloaded(args, data, options):
    """A scenario's unknown fields (``data``'s that no option of ``options`` takes) that a plugin
    this command did not load declares: the refusal says why with the command's own manager
    (--disable-plugin is this command's, not the process-wide manager's)."""
    try:
        yield
    except InvalidInputError as err:
        import attrs
        from .scenario import Scenario, unloaded_options
        own = {f.name for f in attrs.fields(Scenario)} - {"profile_options"}
        unknown = sorted(set(data) - own - set(options)) if isinstance(data, dict) and options is not None else []
        pm = getattr(args, "_plugin_manager", None) or (
            _manager(args) if hasattr(args, "disable_plugin") and hasattr(args, "no_third_party_plugins") else None)
        if not unknown or err.value != ", ".join(unknown) or pm is None:
            raise
        unloaded = unloaded_options(unknown, pm, loaded=options)
        if not unloaded:
            raise
        raise type(err)(err.parameter, err.value, err.allowed, f"unknown field(s); {unloaded}") from err


def scenario_from_args(args):
    """The scenario file (if any), overridden by every flag given on the command line."""
    from .scenario import SOLVE_FIELDS, Scenario, read_table
    if args.scenario is not None and not args.scenario.strip():
        raise InvalidInputError("--scenario", args.scenario, "a .json or .toml scenario file",
                                "an empty name; leave --scenario out for the built-in default")
    conflict = getattr(args, "_conflict", None)
    if conflict:     # one value given twice, differently: never the last silently
        raise _conflict_error(conflict)
    options = getattr(args, "option_fields", None)
    data, where = read_table(args.scenario) if args.scenario else ({}, "")
    if args.scenario:
        with _naming_unloaded(args, data, options):
            Scenario.from_dict(data, where=where, options=options)     # the file's own errors, named by it
        data = {name: value for name, value in data.items() if name != "description"}
    launch = _launch(args)
    if launch is not None:     # the launch files' run, as a scenario file's fields
        data, where = {k: v for k, v in launch.scenario.to_dict().items() if k != "description"}, "launch files"
    args._scenario_fields = set(data) - {n for n, source in (launch.sources if launch else {}).items()
                                         if source.startswith("searched")}     # what the file itself set
    args._from_scenario = {name for name in ("model", "hardware")
                           if name in data and getattr(args, name) is None}
    data.setdefault("model", DEFAULT_MODEL)
    data.setdefault("hardware", DEFAULT_HARDWARE)
    data.setdefault("batch_size", DEFAULT_BATCH)
    for name in ("model", "hardware"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    for name in (*SOLVE_FIELDS, "sequence_parallel", "data_parallel", "profile", "cp_size"):
        if getattr(args, name, None) is not None:
            data[name] = getattr(args, name)
    data = _option_values(args, data)
    if args.rule:
        data["sharding_rules"] = {**data.get("sharding_rules", {}), **_parse_rules(args.rule)}
    for spec, fields in _parse_options(args.option).items():
        data.setdefault("plugin_options", {}).setdefault(spec, {}).update(fields)
    if args.include_plugin:
        data["include_plugins"] = sorted({*data.get("include_plugins", ()), *args.include_plugin})
    _check_given(args, data, where)
    with _naming_unloaded(args, data, options):
        scenario = Scenario.from_dict(data, options=options)
    if launch is not None:
        _check_launch_layout(args, launch.scenario, scenario)
    if launch is not None:     # the flags that replaced a file's value, said
        flags = {dest: flag for dest, (flag, _value, _typed) in getattr(args, "_given", {}).items()}
        before = launch.scenario.to_dict()
        after = scenario.to_dict()
        args._launch = launch.with_overrides(
            (name, before.get(name), flags.get(name, f"--{name.replace('_', '-')}"), after.get(name))
            for name in sorted(set(before) | set(after))
            if name not in ("model", "hardware", "description") and before.get(name) != after.get(name))
    return scenario


_LAUNCH_LAYOUT = ("tp_size", "pp_size", "cp_size", "dp_size")


def _check_launch_layout(args, before, after) -> None:
    """Flags that change a launch's parallel sizes or accumulation. The files' dp is the world size
    over tp x pp x cp, and their global batch the per-device micro-batch x dp x accumulation
    (docs/launch.md), both derived with the files' values: a flag that changes the world size, or
    dp or the accumulation without a global batch of its own, would answer for another run than
    the one the launch section describes. Refused, naming what to give. `fit devices` searches the
    world size and `fit batch` the micro-batch: those are not checked."""
    question = getattr(args, "question", None)
    if question == "devices":
        return
    given = getattr(args, "_given", {})
    old, new = ({n: getattr(s, n) or 1 for n in (*_LAUNCH_LAYOUT, "gradient_accumulation_steps")}
                for s in (before, after))
    changed = [n for n in (*_LAUNCH_LAYOUT, "gradient_accumulation_steps")
               if n in given and old[n] != new[n]]
    if not changed:
        return
    flag, value, _typed = given[changed[0]]
    world, ran = (s["tp_size"] * s["pp_size"] * s["cp_size"] * s["dp_size"]
                  for s in (old, new))
    if ran != world:
        model_parallel = ran // new["dp_size"]
        hint = (f"give --dp {world // model_parallel} with it" if world % model_parallel == 0 and "dp_size" not in given
                else f"sizes whose product is {world}")
        raise InvalidInputError(flag, value, f"a layout of the launch's {world} GPUs (tp x pp x cp x dp = {world}): "
                                f"{hint}", f"the files' dp {old['dp_size']} was derived from the world size "
                                f"with tp {old['tp_size']}, pp {old['pp_size']}, cp "
                                f"{old['cp_size']}; the run would have {ran} GPUs")
    dp, accum = old["dp_size"], old["gradient_accumulation_steps"]
    batch_changed = [n for n in changed if n in ("dp_size", "gradient_accumulation_steps")]
    if "batch_size" not in given and batch_changed and question != "batch":
        flag, value, _typed = given[batch_changed[0]]
        raise InvalidInputError(flag, value, "with -b/--batch-size (the global batch)",
                                f"the files' global batch {before.batch_size} = micro-batch "
                                f"{before.batch_size // (dp * accum)} x dp {dp} x accumulation {accum}: a changed "
                                "dp or accumulation would change the micro-batch the files set")


def _launch(args):
    """The `Launch` of ``--from`` files (None without them): read with --gpus (or --nodes x
    --gpus-per-node), -g, -m, --seq-len, --framework-version and --override."""
    paths = getattr(args, "launch_from", None) or []
    if not paths:
        for flag, dest in (("--gpus", "gpus"), ("--nodes", "nodes"), ("--gpus-per-node", "gpus_per_node"),
                           ("--framework-version", "framework_version")):
            if getattr(args, dest, None) is not None:
                raise InvalidInputError(flag, getattr(args, dest), "given with --from FILE (a launch config)",
                                        f"{flag} describes the run of a launch file")
        if getattr(args, "override", None):
            raise InvalidInputError("--override", args.override, "given with --from FILE (a launch config)")
        return None
    if getattr(args, "scenario", None):
        raise InvalidInputError("--from", paths, "one of --scenario and --from, not both",
                                "each describes the whole run")
    from .scenario import from_launch
    return from_launch(paths, gpus=_launch_gpus(args), hardware=args.hardware, model=args.model,
                       framework_version=args.framework_version, seq_len=getattr(args, "seq_len", None),
                       overrides=args.override, registry=_manager(args).registry,
                       batch_size=getattr(args, "batch_size", None),
                       searched={"batch": "batch_size", "seq": "seq_len"}.get(getattr(args, "question", None)))


def _launch_gpus(args) -> int | None:
    """--gpus, or --nodes x --gpus-per-node (both or neither; with --gpus, agreeing with it)."""
    gpus, nodes, per_node = getattr(args, "gpus", None), args.nodes, args.gpus_per_node
    for flag, value in (("--gpus", gpus), ("--nodes", nodes), ("--gpus-per-node", per_node)):
        if value is not None and value < 1:
            raise InvalidInputError(flag, value, "a whole number >= 1")
    if (nodes is None) != (per_node is None):
        flag, value = ("--nodes", nodes) if nodes is not None else ("--gpus-per-node", per_node)
        raise InvalidInputError(flag, value, "--nodes with --gpus-per-node (the world size is their product)")
    if nodes is not None:
        if gpus is not None and gpus != nodes * per_node:
            raise InvalidInputError("--gpus", gpus, f"{nodes * per_node} (--nodes {nodes} x --gpus-per-node "
                                    f"{per_node}), or one of them")
        gpus = nodes * per_node
    return gpus


def _with_launch(document: dict, args) -> dict:
    """A JSON answer with the launch files' provenance under ``launch`` (when --from was given)."""
    launch = getattr(args, "_launch", None)
    if launch is not None:
        document["launch"] = launch.to_dict()
    return document


def _launch_section(args) -> str:
    launch = getattr(args, "_launch", None)
    return "" if launch is None else "\n" + launch.describe() + "\n"


def _check_given(args, data: dict, where: str) -> None:
    """Inputs given explicitly (a flag, or the scenario file's field) that contradict each
    other (`scenario.check_contradictions`), each named as it was given; and --zero-stage beside
    --data-parallel naming another rule."""
    from .scenario import check_contradictions
    flags = {dest: flag for dest, (flag, _value, _typed) in getattr(args, "_given", {}).items()}
    given = {name: (flags.get(name) or f"{where}'s {name}", value) for name, value in data.items()
             if name in flags or name in args._scenario_fields}
    check_contradictions(given, _manager(args).registry)
    if "zero_stage" in flags and "data_parallel" in flags and isinstance(args.data_parallel, str):
        from .registry import name_key
        if name_key(args.data_parallel.strip()) != f"zero{args.zero_stage}":
            raise InvalidInputError(flags["zero_stage"], args.zero_stage, f"one of {flags['zero_stage']} and "
                                    "--data-parallel (which names the data-parallel rule itself)",
                                    f"{flags['zero_stage']} {args.zero_stage} (the rule zero{args.zero_stage}) and "
                                    f"--data-parallel {args.data_parallel} contradict each other")


def _resolved(scenario):
    """The scenario's model and hardware: catalog names stay names, .json paths are read."""
    model = _model(scenario.model) if isinstance(scenario.model, str) else scenario.resolve_model()
    hardware = _hardware(scenario.hardware) if isinstance(scenario.hardware, str) else scenario.resolve_hardware()
    return model, hardware


def _solve(solver, scenario):
    model, hardware = _resolved(scenario)
    return solver.solve(model, hardware, **scenario.solve_kwargs())


def not_modelled_refusal(err: NotModelledError, model=None) -> NotModelledError:
    """``err`` as the CLI says it when the user named no profile: the run is refused (never
    answered by another profile), naming what the default profile does not model, the
    nearest thing it does (``err.allowed``), and ``--profile reference`` spelled out for
    those who want the textbook number."""
    hint = (f"refused under the default profile, {DEFAULT_PROFILE}: no other profile answers for it; "
            "--profile reference gives the textbook estimate")
    counterpart = _curated_counterpart(model)
    if counterpart:
        hint = (f"{model!r} is the reference package's entry, without architecture facts: -m {counterpart} "
                f"is the curated entry of the same model; " + hint)
    detail = f"{err.detail}; {hint}" if err.detail else hint
    new = NotModelledError(err.parameter, err.value, err.allowed, detail)
    new.__cause__ = err
    return new


def _curated_counterpart(model) -> str | None:
    """For a catalog name of the reference package's own data (``mlsysim:NAME``, no
    architecture facts), the name of the curated entry for the same model, if any."""
    from .catalog import find_model
    if not isinstance(model, str):
        return None
    try:
        entry = find_model(model)
        if entry.origin != "reference":
            return None
        for name in entry.names:
            bare = name.split(":", 1)[-1]
            if find_model(bare).origin == "curated":
                return bare
    except InvalidInputError:
        pass
    return None


def resolve_profile(solver, scenario, *, probe=None):
    """The profile every command solves under: ``(scenario, note)``.

    A scenario that names its profile (``--profile`` or the file's ``profile``) keeps it.
    Otherwise the measured profile; a run it cannot describe (a ``NotModelledError``: a
    third-party optimizer without a measured-grade model, a model without architecture
    facts, ...) is refused with ``not_modelled_refusal``: never answered by another
    profile. ``probe`` is the scenario to ask first (default: ``scenario`` at one
    micro-batch per replica, so a question that searches the batch or the sequence is
    refused before it searches), or a callable that asks the whole question of the
    scenario (``fit devices``: a rule may refuse some dp). The note is always ``""`` (kept
    for the callers' signature).
    """
    import attrs
    if scenario.profile is not None:
        return scenario, ""
    chosen = attrs.evolve(scenario, profile=DEFAULT_PROFILE)
    if probe is None:
        probe, sizes = scenario, (scenario.dp_size, scenario.gradient_accumulation_steps)
        if all(type(n) is int and n >= 1 for n in sizes):   # else the solve names the bad one
            probe = attrs.evolve(scenario, batch_size=sizes[0] * sizes[1])
    try:
        if callable(probe):    # the question itself, asked under the measured profile
            probe(chosen)
        else:
            _solve(solver, attrs.evolve(probe, profile=DEFAULT_PROFILE))
    except NotModelledError as err:
        raise not_modelled_refusal(err, scenario.model) from err
    return chosen, ""


def reference_stand_in(scenario, registry=None):
    """``(scenario, said)``: the scenario under the reference profile, which has none of the
    measured-grade options: they are left out, and LoRA/QLoRA stands in as the trainable
    fraction of its adapters (nothing quantized). ``said`` names what was left out or stood
    in, by flag, for the note (empty when nothing was). ``registry``: whose profiles' options
    (default: the installed plugins')."""
    import attrs
    from .scenario import option_fields
    from .inputs import options_fields
    if registry is None:
        from .manager import get_plugin_manager
        registry = get_plugin_manager().registry
    fields, options = option_fields(registry), scenario.profile_options
    kept = options_fields(registry.profiles["reference"]) if "reference" in registry.profiles else {}
    plain = attrs.evolve(scenario, profile="reference",
                         profile_options={k: v for k, v in options.items() if k in kept})
    said = []
    lora = options.get("lora")
    if lora:
        from .catalog import get_model
        from .finetune import trainable_fraction
        model = _resolved(scenario)[0]
        model = get_model(model) if isinstance(model, str) else model
        fraction = trainable_fraction(model, lora)
        plain = attrs.evolve(plain, trainable_fraction=fraction)
        quantization = lora.get("quantization") if isinstance(lora, dict) else getattr(lora, "quantization", None)
        said.append(f"QLoRA stands in as trainable fraction {fraction:.6g} (its {quantization} quantization "
                    "left out: the base weights count at the run's precision)" if quantization else
                    f"LoRA stands in as trainable fraction {fraction:.6g}")
    left_out = [_flag_of(name, fields[name]) if name in fields else name
                for name in sorted(options, key=[*fields, *options].index) if name not in kept and name != "lora"]
    if left_out:
        said.append(f"measured-profile options left out: {', '.join(left_out)}")
    return plain, "; ".join(said)


def check_global_batch(scenario, given: bool = True) -> None:
    """The CLI never rounds: the global batch must be a whole number of micro-batches over
    dp x accumulation (under every profile). ``given``: whether the batch was asked for
    (else the message says it is the default)."""
    from ._checks import whole_microbatches
    sizes = (scenario.batch_size, scenario.dp_size, scenario.gradient_accumulation_steps)
    if not all(type(n) is int and n >= 1 for n in sizes):
        return     # solve() names the bad one
    whole_microbatches(*sizes, note="" if given else f"; --batch-size was not given: the default is {DEFAULT_BATCH}")


def _batch_given(args) -> bool:
    return args.batch_size is not None or bool(args.scenario) or bool(getattr(args, "launch_from", None))


def _profile_note_lines(note: str, scenario=None) -> str:
    """What a text answer says first: a note on the profile, what a catalog name the user
    typed means where it differs from a common meaning (``-m gpt2``: GPT-2 XL), and what was
    assumed of the input (``input_notes``)."""
    lines = [note] if note else []
    lines += [f"note: {text}" for text in (*alias_notes(scenario), *input_notes(scenario))]
    return "\n".join(lines) + "\n\n" if lines else ""


def input_notes(scenario) -> list[str]:
    """What the input left to an assumption (``Scenario.input_notes``), said first and in the JSON."""
    return [] if getattr(scenario, "input_notes", None) is None else scenario.input_notes()


def alias_notes(scenario) -> list[str]:
    """The catalog's notes on the model and hardware names a scenario gives (``alias_note``)."""
    from .catalog import alias_note
    notes = []
    for kind in ("model", "hardware"):
        name = getattr(scenario, kind, None)
        if isinstance(name, str):
            try:
                text = alias_note(kind, name)
            except InvalidInputError:
                text = None
            if text:
                notes.append(text)
    return notes


def _json_document(data: dict, scenario, note: str, result=None) -> dict:
    """What every JSON output of `estimate` and `fit` carries beside its answer: the schema
    version, the profile, the note on it, and what was solved (``Scenario.run_details``)."""
    from .serialization import SCHEMA_VERSION
    data = dict(data)
    data["schema_version"] = SCHEMA_VERSION
    data["profile"] = result.profile if result is not None else scenario.profile
    data["profile_note"] = note or None
    data["name_notes"] = alias_notes(scenario)
    data["input_notes"] = input_notes(scenario)
    data["run"] = scenario.run_details(result)
    return data


def _check_save_path(text: str | None) -> Path | None:
    """Where --save-scenario writes, checked before anything is solved."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise InvalidInputError("--save-scenario", text, "a file name (.json or .toml)", "it is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise InvalidInputError("--save-scenario", text, "a file in an existing folder",
                                f"the folder {str(parent)!r} does not exist")
    return path


def cmd_estimate(args, out) -> int:
    import attrs
    from .render import describe_run, estimate_table
    from .solver import TrainingMemoryModel
    save = _check_save_path(args.save_scenario)
    scenario = scenario_from_args(args)
    check_global_batch(scenario, _batch_given(args))
    solver = TrainingMemoryModel(plugin_manager=_manager(args))
    scenario, note = resolve_profile(solver, scenario)
    result = _solve(solver, scenario)
    if save is not None:     # file paths absolute: the scenario is read from its own folder, not this one
        from .scenario import anchored
        saved = attrs.evolve(scenario, model=anchored(scenario.model, Path.cwd()),
                             hardware=anchored(scenario.hardware, Path.cwd()))
        try:
            saved.dump(save)
        except OSError as err:
            raise InvalidInputError("--save-scenario", args.save_scenario, "a writable file", str(err)) from err
    reference, refused = None, None
    if result.profile != "reference":   # the reference profile's total beside it, when it has one
        try:
            reference = _solve(solver, reference_stand_in(scenario, solver.registry)[0])
        except InvalidInputError as err:  # (the answer stands; the comparison is left out, and said)
            refused = str(err)
    if args.json:
        document = _json_document(result.to_dict(), scenario, note, result)
        document["reference_profile"] = None if result.profile == "reference" else {
            "total_memory": reference.total_memory if reference else None,
            "feasible": reference.feasible if reference else None, "refused": refused}
        if args.explain:     # (the text --explain prints; the terms above carry the same formulas)
            document["explanation"] = result.explain(solver.registry)
        out.write(json.dumps(_with_launch(document, args), indent=2, sort_keys=True) + "\n")
        return 0
    out.write(_profile_note_lines(note, scenario))
    no_reference = "" if refused is None else \
        f"(no reference-profile total beside it: the reference profile refuses this run: {refused})\n"
    out.write(estimate_table(result, reference=reference, chart=args.chart,
                             plan_line=describe_run(scenario.run_details(result))) + "\n" + no_reference)
    if args.explain:
        out.write("\n" + result.explain(solver.registry) + "\n")
    out.write(_launch_section(args))
    return 0


# Scenario fields `plot bars --vary` accepts (one value each; the rest are tables or lists).
VARY_FIELDS = ("model", "hardware", "profile", "data_parallel", "sequence_parallel")


# An example of --values for each --vary field (in the error when --values is missing).
_VARY_EXAMPLES = {"model": "llama3-8b,llama3-70b", "hardware": "h100,a100", "profile": "reference,measured",
                  "data_parallel": "zero1,zero3,fsdp", "sequence_parallel": "true,false",
                  "batch_size": "8,16,32", "seq_len": "1024,2048,4096", "precision": "fp16,bf16,fp32",
                  "optimizer": "adam,sgd,adafactor", "activation_checkpointing": "none,selective,full",
                  "zero_stage": "0,1,2,3", "tp_size": "1,2,4,8", "pp_size": "1,2,4", "dp_size": "1,2,4,8",
                  "ep_size": "1,2,4", "gradient_accumulation_steps": "1,2,4",
                  "trainable_fraction": "1.0,0.1,0.01", "communication_buffer_fraction": "0.05,0.1"}


def _split_values(text: str, parameter: str = "--values") -> list[str]:
    items = [item.strip() for item in text.split(",")]
    if not text.strip() or not all(items):
        raise InvalidInputError(parameter, text, "comma-separated values, e.g. 1,2,4,8")
    return items


def _vary_value(field: str, raw: str):
    if field in ("model", "hardware", "profile", "data_parallel", "activation_checkpointing", "optimizer",
                 "precision"):
        return raw
    if field in ("trainable_fraction", "communication_buffer_fraction"):     # numbers, never words
        import math
        try:
            number = float(raw)
        except ValueError:
            return raw   # solve() rejects it with a message naming the field
        if not math.isfinite(number):
            raise InvalidInputError(field, raw, "a finite number", f"from --values of --vary {field}")
        return number
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError):
        return raw   # solve() rejects it with a message naming the field
    except ValueError:     # a number of more than 4300 digits
        raise InvalidInputError("--values", raw, f"values of {field} (numbers of at most 4300 digits)") from None
    if isinstance(value, float) and not (value == value and abs(value) != float("inf")):
        raise InvalidInputError(field, raw, "a finite number", f"from --values of --vary {field}")
    return value


def _check_distinct(raws: list[str], values: list, parameter: str = "--values", text: str = "") -> None:
    """Each value once: a value given twice would draw the same bar twice."""
    seen: dict[str, str] = {}
    for raw, value in zip(raws, values):
        key = value.strip().lower() if isinstance(value, str) else repr(value)
        if key in seen:
            raise InvalidInputError(parameter, text or ",".join(raws), "each value once",
                                    f"{raw!r} repeats {seen[key]!r}")
        seen[key] = raw


def _result_notes(results, labels=None) -> list[str]:
    """The results' own notes (warnings, approximations, catalog data), each once, as
    ``note ...`` lines; a note that only some results carry names them."""
    from .render import note_lines
    labels = list(labels) if labels else [""] * len(results)
    said: dict[str, list[str]] = {}
    for result, label in zip(results, labels):
        for note in result.notes:
            said.setdefault(note, []).append(label)
    notes = []
    for note, which in said.items():
        if len(which) < len(results) and all(which):
            note = f"({', '.join(which)}) {note}"
        notes.append(note)
    return note_lines(notes)


def _varied_bars(args, solver, scenario, out):
    """`plot bars --vary FIELD`: ``(results, labels)``. One picture, one profile: when the
    measured profile cannot describe one of the values, the picture is refused
    (`not_modelled_refusal`). ``--vary profile`` draws each profile asked for; a profile that
    cannot describe the run is left out, and a note says why."""
    import attrs
    from .scenario import SOLVE_FIELDS
    allowed = (*SOLVE_FIELDS, *VARY_FIELDS)
    if args.vary not in allowed:
        raise InvalidInputError("--vary", args.vary, f"one of {', '.join(allowed)}")
    if args.values is None and args.vary == "profile":     # the two profiles side by side
        args.values = "reference,measured"
    if args.values is None:
        raise InvalidInputError("--values", None, f"the values of --vary {args.vary}, e.g. "
                                + _VARY_EXAMPLES.get(args.vary, "1,2,4"))
    raws = _split_values(args.values)
    values = [_vary_value(args.vary, raw) for raw in raws]
    _check_distinct(raws, values, text=args.values)
    scenarios = [attrs.evolve(scenario, **{args.vary: value}) for value in values]
    labels = [f"{args.vary}={raw}" for raw in raws]
    for s in scenarios:
        check_global_batch(s, _batch_given(args) or args.vary == "batch_size")
    if args.vary == "profile":
        from .inputs import options_fields
        results, kept = [], []
        for s, label in zip(scenarios, labels):
            spec = solver.registry.profiles.get(s.profile) if isinstance(s.profile, str) else None
            if spec is not None and not set(s.profile_options) <= set(options_fields(spec)):   # it lacks some
                plain, said = reference_stand_in(s, solver.registry)
                if said:
                    out.write(f"note: {label}: {said} (the {s.profile} profile has none of the measured-profile "
                              "options)\n")
                results.append(_solve(solver, attrs.evolve(plain, profile=s.profile)))
            else:
                try:
                    results.append(_solve(solver, s))
                except NotModelledError as err:
                    out.write(f"note: {label} is left out: the {s.profile} profile cannot describe this run: "
                              f"{err}\n")
                    continue
            kept.append(label)
        if not results:
            raise InvalidInputError("--values", args.values, "profiles that can describe this run",
                                    "none of them can; see the notes above")
        return results, kept
    if scenario.profile is not None:
        return [_solve(solver, s) for s in scenarios], labels
    results = []
    for s, label in zip(scenarios, labels):
        try:
            results.append(_solve(solver, attrs.evolve(s, profile=DEFAULT_PROFILE)))
        except NotModelledError as err:     # one picture, one profile: never another one's bars
            raise not_modelled_refusal(err, s.model) from err
    return results, labels


def _sweep_values(args, scenario, solver, model, checked: bool = True) -> list[int]:
    """The values `plot sweep` draws: --values, or by default powers of two (micro-batches
    1-64, sequences 512-32,768); a default sequence past the model's context length is left
    out (and said), one given in --values is refused naming --values (``checked``: against
    the model's context length, under the scenario's profile)."""
    from .inverse import _position_rows
    if args.values is None:
        values = [2**i for i in range(7)] if args.sweep == "batch" else [2**i for i in range(9, 16)]
    else:
        values = []
        for raw in _split_values(args.values):
            try:
                values.append(int(raw))
            except ValueError:
                raise InvalidInputError("--values", args.values, "whole numbers >= 1, e.g. 1,2,4,8") from None
            if values[-1] < 1:
                raise InvalidInputError("--values", args.values, "whole numbers >= 1, e.g. 1,2,4,8")
        _check_distinct([str(v) for v in values], values, text=args.values)
    if args.sweep != "seq" or not checked:
        return values
    cap = _position_rows(solver, model, scenario.profile)
    past = [v for v in values if cap is not None and v > cap]
    if not past:
        return values
    if args.values is not None:
        raise InvalidInputError("--values", args.values, f"sequence lengths of at most {cap:,}, the model's "
                                "context length", f"{', '.join(map(str, past))} past it: the model has learned "
                                "position embeddings")
    kept = [v for v in values if v <= cap]
    if not kept:
        raise InvalidInputError("--values", None, f"sequence lengths of at most {cap:,}, the model's context "
                                "length (no default value is)")
    args._sweep_note = (f"note: the default sequence lengths {', '.join(f'{v:,}' for v in past)} are left out: "
                        f"past the model's context length {cap:,} (learned position embeddings)")
    return kept


# The flag of the value each `plot sweep` draws: giving it is a mistake (the sweep sets it).
_SWEEP_SET = {"batch": ("--batch-size", "batch_size", "`plot sweep --sweep batch` draws the micro-batch"),
              "seq": ("--seq-len", "seq_len", "`plot sweep --sweep seq` draws the sequence length")}


def cmd_plot(args, out) -> int:
    from . import plots
    from .solver import TrainingMemoryModel
    output = plots.check_output(args.output, "--output")     # before solving anything
    if args.vary and args.kind != "bars":
        raise InvalidInputError("--vary", args.vary, "only with `plot bars`")
    if args.sweep is not None and args.kind != "sweep":
        raise InvalidInputError("--sweep", args.sweep, "only with `plot sweep`",
                                f"`plot {args.kind}` draws no sweep")
    args.sweep = args.sweep or "batch"
    if args.kind == "sweep":
        flag, dest, why = _SWEEP_SET[args.sweep]
        if getattr(args, dest, None) is not None:
            raise InvalidInputError(flag, getattr(args, dest), f"not given: {why}",
                                    f"leave out {flag} (--values chooses the values drawn)")
    scenario = scenario_from_args(args)
    if args.values is not None and args.kind == "timeline":
        raise InvalidInputError("--values", args.values, "only with `plot bars --vary` or `plot sweep`")
    if args.kind == "bars" and args.values is not None and not args.vary:
        raise InvalidInputError("--values", args.values, "with --vary FIELD (the field they are values of)")
    plots._matplotlib()     # fail early, with the extra's name, before solving anything
    solver = TrainingMemoryModel(plugin_manager=_manager(args))
    if args.kind == "bars" and args.vary:      # each bar is a scenario of its own
        results, labels = _varied_bars(args, solver, scenario, out)
        fig = plots.plot_bars(results, labels, title=args.title)
        for line in _result_notes(results, labels):
            out.write(line + "\n")
        path = plots.save(fig, output, parameter="--output")
        names = list(dict.fromkeys(r.profile for r in results))
        out.write(f"wrote {path} ({'profile' if len(names) == 1 else 'profiles'} {', '.join(names)})\n")
        return 0
    if not (args.kind == "sweep" and args.sweep == "batch"):    # (a batch sweep sets the batch itself)
        check_global_batch(scenario, _batch_given(args))
    probe = None
    if args.kind == "sweep" and args.sweep == "seq":     # the sequence is drawn: ask at the first one drawn
        import attrs
        first = min(_sweep_values(args, scenario, solver, None, checked=False))
        probe = attrs.evolve(scenario, seq_len=first, batch_size=scenario.dp_size
                             * scenario.gradient_accumulation_steps) \
            if all(type(n) is int and n >= 1 for n in (scenario.dp_size, scenario.gradient_accumulation_steps)) \
            else attrs.evolve(scenario, seq_len=first)
    scenario, note = resolve_profile(solver, scenario, probe=probe)
    out.write(_profile_note_lines(note, scenario))
    if args.kind == "bars":
        results = [_solve(solver, scenario)]
        fig = plots.plot_bars(results, None, title=args.title)
    elif args.kind == "timeline":
        results = [_solve(solver, scenario)]
        fig = plots.plot_timeline(results[0], title=args.title)
    else:
        model, hardware = _resolved(scenario)
        values = _sweep_values(args, scenario, solver, model)
        if getattr(args, "_sweep_note", None):
            out.write(args._sweep_note + "\n")
        data = plots.sweep(scenario, args.sweep, values, solver=solver, model=model, hardware=hardware)
        exact = _exact_largest(solver, scenario, args.sweep, model, hardware)
        fig = plots.plot_sweep(data, title=args.title, exact=exact.value, exact_is_bound=exact.at_search_limit)
        out.write(f"{data.label}: " + ", ".join(
            f"{v:,} {'fits' if r.feasible else 'does not fit'} ({r.total_memory * 1e-9:,.3f} GB)"
            for v, r in zip(data.values, data.results)) + "\n")
        out.write(_sweep_answer_line(data, exact, args.sweep) + "\n")
        results = list(data.results)
    for line in _result_notes(results):
        out.write(line + "\n")
    path = plots.save(fig, output, parameter="--output")
    out.write(f"wrote {path} (profile {scenario.profile})\n")
    return 0


def _exact_largest(solver, scenario, question: str, model, hardware):
    """What `fit batch` / `fit seq` answers for ``scenario`` (the sweep samples only some
    values; this is the exact largest, with the same solver, profile and options)."""
    import math
    from . import inverse
    kwargs = scenario.solve_kwargs()
    if question == "batch":
        kwargs.pop("batch_size")
        return inverse.largest_batch(model, hardware, solver=solver, **kwargs)
    kwargs.pop("seq_len")
    batch = kwargs.pop("batch_size")
    cp = scenario.cp_size if type(scenario.cp_size) is int and scenario.cp_size >= 1 else 1
    return inverse.longest_sequence(model, hardware, batch, solver=solver, multiple_of=math.lcm(1, cp), **kwargs)


def _sweep_answer_line(data, exact, question: str) -> str:
    """The sweep's answer, honest about sampling: the largest of the values drawn that
    fits, and the exact largest that `fit` finds when it differs."""
    best = data.largest_fitting
    command = f"`mlsysim-core fit {question}`"
    if exact.value is None:
        found = "nothing fits at all"
    elif exact.at_search_limit:
        found = f"at least {exact.value:,} (search limit)"
    else:
        found = f"{exact.value:,}"
    if best is None:
        drawn = f"no {data.label} of {', '.join(map(str, data.values))} fits"
        return drawn if exact.value is None else f"{drawn} ({command} finds the exact largest: {found})"
    if exact.value == best and not exact.at_search_limit:
        return f"largest {data.label} that fits: {best:,} (the exact largest, as {command} finds)"
    return f"largest of the values drawn that fits: {best:,} ({command} finds the exact largest: {found})"


def plugin_listing(pm) -> list[dict]:
    """Every loaded plugin: source distribution, hooks it implements, specs it provides."""
    registry = pm.registry
    provides: dict[str, dict[str, list[str]]] = {}
    for (kind, name), info in sorted(registry.providers.items()):
        provides.setdefault(info.name, {}).setdefault(kind, []).append(name)
    listing = []
    for name, info in sorted(registry.plugins.items()):
        plugin = pm.get_plugin(name)
        hooks = sorted(caller.name for caller in pm.get_hookcallers(plugin) or ())
        listing.append({"name": name, "distribution": info.distribution, "version": info.version,
                        "hooks": hooks, "provides": provides.get(name, {})})
    return listing


def cmd_plugins(args, out) -> int:
    pm = _manager(args)
    with pm.allowing_broken():     # a plugin whose registration fails is listed, marked, not fatal
        listing = plugin_listing(pm)
    broken = pm.broken_plugins()
    for p in listing:
        p["error"] = str(broken[p["name"]]) if p["name"] in broken else None
    if args.json:
        out.write(json.dumps({"schema_version": _schema_version(), "plugins": listing, "blocked": list(pm.blocked_names),
                              "unknown_blocked": {n: list(c) for n, c in pm.unknown_blocked.items()},
                              "blocked_entry_points": [i.name for i in pm.blocked_entry_points],
                              "skipped_third_party": [i.name for i in pm.skipped_third_party]},
                             indent=2, sort_keys=True) + "\n")
    else:
        width = max(len(p["name"]) for p in listing)
        for p in listing:
            provided = "; ".join(f"{kind.removeprefix('mlsysim_').replace('_', ' ')}: {', '.join(names)}"
                                 for kind, names in p["provides"].items())     # (a profile's hooks: by name)
            hooks = [h for h in p["hooks"] if h.endswith("_terms")]
            what = provided or ("component hooks: " + ", ".join(hooks) if hooks else "")
            what = what or ("adds hook specs (mlsysim_addhooks)" if "mlsysim_addhooks" in p["hooks"] else "")
            what = f"BROKEN: {p['error']}" if p["error"] else what
            out.write(f"{p['name'].ljust(width)}  {p['distribution']} {p['version']}  {what}\n")
        for name in pm.blocked_names:
            out.write(f"{name.ljust(width)}  {describe_blocked(pm, name)}\n")
        for info in pm.skipped_third_party:
            out.write(f"{info.name.ljust(width)}  {info.source}  (skipped: third-party autoload disabled)\n")
    for err in dict.fromkeys(broken.values()):     # exit 3: the other commands fail until it is fixed
        print(f"mlsysim-core: error: {err}", file=sys.stderr)
    return 3 if broken else 0


def cmd_models(args, out) -> int:
    from .catalog import list_models
    entries = list_models(plugin_manager=_manager(args))
    if args.json:
        out.write(json.dumps({"schema_version": _schema_version(), "models": [_catalog_row(e) for e in entries]},
                             indent=2) + "\n")
        return 0
    kw, nw = _key_and_name_widths(entries)
    ow = _origin_width(entries)
    out.write(f"{'key':<{kw}} {'name':<{nw}} {'parameters':>18} {'layers':>6} {'hidden':>6} {'heads':>5}  "
              f"{'experts':<12} {'origin':<{ow}}  aliases\n")
    for e in entries:
        m = e.value
        experts = f"{m.experts} (top-{m.active_experts_per_token})" if m.is_sparse else "-"
        out.write(f"{e.key:<{kw}} {m.name:<{nw}} {m.parameters:>18,} {m.layers:>6} {m.hidden_dim or '-':>6} "
                  f"{m.heads or '-':>5}  {experts:<12} {e.origin:<{ow}}  {_aliases(e)}\n")
    return 0


def _schema_version() -> int:
    from .serialization import SCHEMA_VERSION
    return SCHEMA_VERSION


def _key_and_name_widths(entries) -> tuple[int, int]:
    return max(len(e.key) for e in entries), max(len(e.value.name) for e in entries)


def _origin_width(entries) -> int:
    return max(len("origin"), *(len(e.origin) for e in entries))


def _aliases(entry) -> str:
    """The other names an entry answers to (`llama3-8b`, `h100`: the names the docs use)."""
    return ", ".join(entry.aliases) or "-"


def _catalog_row(entry) -> dict:
    """One catalog entry for --json: its fields, names, origin, provider and sources."""
    import attrs
    return {"key": entry.key, "aliases": list(entry.aliases), **attrs.asdict(entry.value),
            "kind": entry.extra.get("kind"), "tier": entry.extra.get("tier"), "origin": entry.origin,
            "provided_by": entry.provided_by, "sources": dict(entry.sources)}


def cmd_hardware(args, out) -> int:
    from .catalog import list_hardware
    entries = list_hardware(plugin_manager=_manager(args))
    if args.json:
        out.write(json.dumps({"schema_version": _schema_version(), "hardware": [_catalog_row(e) for e in entries]},
                             indent=2) + "\n")
        return 0
    kw, nw = _key_and_name_widths(entries)
    ow = _origin_width(entries)
    out.write(f"{'key':<{kw}} {'name':<{nw}} {'memory (bytes)':>18} {'GB':>10} {'GiB':>9}  {'origin':<{ow}}  aliases\n")
    for e in entries:
        h = e.value
        out.write(f"{e.key:<{kw}} {h.name:<{nw}} {h.memory_capacity:>18,} {h.memory_capacity * 1e-9:>10.3f} "
                  f"{h.memory_capacity / 2**30:>9.2f}  {e.origin:<{ow}}  {_aliases(e)}\n")
    return 0


# The flag that names what each `fit` question searches: giving it is a mistake.
_FIT_SEARCHED = {"batch": ("--batch-size", "batch_size", "`fit batch` searches the micro-batch (the global batch "
                                                         "is micro-batch x dp x accumulation)"),
                 "seq": ("--seq-len", "seq_len", "`fit seq` searches the sequence length"),
                 "devices": ("--dp-size", "dp_size", "`fit devices` searches the data-parallel size (the devices "
                                                     "are tp x pp x dp)")}


def _check_fit_flags(args) -> None:
    """`fit` refuses the flag of the value it searches, and --multiple-of outside `fit seq`."""
    for name in ("flops", "host_link_gbps", "host_memory_gbps"):
        if args.question != "techniques" and getattr(args, name) is not None:
            raise InvalidInputError(f"--{name.replace('_', '-')}", getattr(args, name), "only with `fit techniques`")
    if args.multiple_of is not None:     # (`fit techniques` too: it searches no sequence length)
        if args.question != "seq":
            raise InvalidInputError("--multiple-of", args.multiple_of, "only with `fit seq`",
                                    f"`fit {args.question}` searches no sequence length")
        if args.multiple_of < 1:
            raise InvalidInputError("--multiple-of", args.multiple_of, "an integer >= 1 (e.g. 128)")
    if args.question == "techniques":
        return
    flag, dest, why = _FIT_SEARCHED[args.question]
    if getattr(args, dest) is not None:
        raise InvalidInputError(flag, getattr(args, dest), f"not given: {why}", f"leave out {flag}")


def cmd_fit(args, out) -> int:
    import attrs
    from . import inverse
    from .solver import TrainingMemoryModel
    _check_fit_flags(args)
    if args.question == "techniques":
        return _fit_techniques(args, out)
    scenario = scenario_from_args(args)
    flag, searched, why = _FIT_SEARCHED[args.question]
    left_out = ""      # a scenario file's value of the searched field: left out, and said
    if searched in getattr(args, "_scenario_fields", ()):
        left_out = (f"note: {why}: the scenario's {searched}={getattr(scenario, searched)!r} is left out "
                    "(the search starts from its smallest value)")
    if args.question == "seq":       # the batch is a given: whole micro-batches
        check_global_batch(scenario, _batch_given(args))
    solver = TrainingMemoryModel(plugin_manager=_manager(args))
    probe = None
    cp = scenario.cp_size     # (a bad one is named by the solve)
    unit = inverse.sequence_unit(args.multiple_of or 1, cp) if type(cp) is int and cp >= 1 else args.multiple_of or 1
    if args.question == "seq":       # the sequence is searched: ask at its first candidate
        probe = attrs.evolve(scenario, seq_len=unit)

    def fewest_devices(scenario):
        kwargs = scenario.solve_kwargs()
        batch = kwargs.pop("batch_size")
        kwargs.pop("dp_size")
        return inverse.fewest_devices(*_resolved(scenario), batch, solver=solver, exact_batch=True, **kwargs)

    if args.question == "devices":   # dp is searched, and a rule may refuse some dp: ask the whole question
        probe = fewest_devices
    scenario, note = resolve_profile(solver, scenario, probe=probe)
    model, hardware = _resolved(scenario)
    kwargs = scenario.solve_kwargs()
    if args.question == "batch":
        kwargs.pop("batch_size")
        answer = inverse.largest_batch(model, hardware, solver=solver, **kwargs)
    elif args.question == "seq":
        kwargs.pop("seq_len")
        batch = kwargs.pop("batch_size")
        answer = inverse.longest_sequence(model, hardware, batch, solver=solver, multiple_of=unit, **kwargs)
    else:
        answer = fewest_devices(scenario)
    solved = answer.result or answer.limit    # the answer's own solve, or the smallest that does not fit
    if solved is not None:     # the run that solve describes, for the header and "run"
        changed = {"batch": {"batch_size": solved.microbatch * scenario.dp_size
                             * scenario.gradient_accumulation_steps},
                   "seq": {"seq_len": answer.value if answer.result is not None else unit},
                   "devices": {"dp_size": solved.parallelism.get("dp", scenario.dp_size)}}[args.question]
        scenario = attrs.evolve(scenario, **changed)
    if args.json:
        data = {"question": answer.question, "value": answer.value, "binding": answer.binding,
                "headroom": answer.headroom, "solves": answer.solves, "details": answer.details,
                "at_search_limit": answer.at_search_limit,
                "result": answer.result.to_dict() if answer.result else None,
                "limit": answer.limit.to_dict() if answer.limit else None,
                "units": {"value": {"batch": "sequences per micro-batch", "seq": "tokens per sequence",
                                    "devices": "devices (tp x pp x cp x dp)"}[args.question],
                          "headroom": "bytes (capacity - total at the answer)", "memory": "bytes (result, limit)"}}
        if args.question == "seq":
            data["multiple_of"] = unit
        if left_out:
            data["scenario_note"] = left_out
        out.write(json.dumps(_with_launch(_json_document(data, scenario, note, solved), args), indent=2,
                             sort_keys=True) + "\n")
    else:
        from .render import describe_run, note_lines, plan_header
        out.write(_profile_note_lines(note, scenario))
        if left_out:
            out.write(left_out + "\n")
        out.write(f"{solved.model} on {solved.hardware}  (profile: {solved.profile})\n")
        out.write(plan_header(solved, describe_run(scenario.run_details(solved))) + "\n")
        if args.question == "seq" and unit != (args.multiple_of or 1):
            out.write(f"searched sequences that are multiples of {unit} (context parallelism {scenario.cp_size} "
                      "splits each one evenly)\n")
        out.write(answer.describe() + "\n")
        for line in note_lines(solved.notes):     # the answer's own notes, as `estimate` prints them
            out.write(line + "\n")
        out.write(_launch_section(args))
    return 0


def _headroom(text):
    """``--headroom 4`` is 4 GiB, ``--headroom 10%`` a tenth of the capacity (search.headroom_bytes)."""
    if text is None or text.strip().endswith(("%", "B")):
        return text
    try:
        number = float(text)
    except ValueError:
        number = float("nan")
    if not 0 <= number < float("inf"):     # (search would name "headroom" and the text with GiB appended)
        raise InvalidInputError("--headroom", text, "GiB >= 0 (a number), or a size such as 8GB, 8GiB or 10% (of "
                                "the capacity)")
    return text.strip() + "GiB"


def _fit_techniques(args, out) -> int:
    """`fit techniques` (the profile's ladder, ProfileSpec.techniques): the ladder, or its JSON."""
    from .solver import TrainingMemoryModel
    scenario = scenario_from_args(args)
    kwargs = scenario.solve_kwargs()
    kwargs["profile"] = kwargs.get("profile") or "measured"
    spec = _manager(args).registry.profiles.get(kwargs["profile"])
    fit_techniques = getattr(spec, "techniques", None)
    if fit_techniques is None:
        raise NotModelledError("profile", kwargs["profile"], "a profile with a technique ladder (ProfileSpec."
                               "techniques): the measured-grade one, measured", "the techniques are its options")
    for name, unit in (("flops", "FLOP/s"), ("host_link_gbps", "GB/s (10^9 bytes/s)"),
                       ("host_memory_gbps", "GB/s (10^9 bytes/s)")):    # (named as typed, in the flag's unit)
        if getattr(args, name) is not None and not 0 < getattr(args, name) < float("inf"):
            raise InvalidInputError(f"--{name.replace('_', '-')}", getattr(args, name), f"a positive number of {unit}")
    gbps = {name: None if getattr(args, name) is None else getattr(args, name) * 1e9
            for name in ("host_link_gbps", "host_memory_gbps")}
    model, hardware = _resolved(scenario)
    if isinstance(scenario.hardware, str):      # a catalog name: its entry's performance figures count
        hardware = scenario.hardware
    ladder = fit_techniques(model, hardware, kwargs.pop("batch_size"), kwargs.pop("seq_len"),
                            solver=TrainingMemoryModel(plugin_manager=_manager(args)), hardware_flops=args.flops,
                            host_link_bytes_per_s=gbps["host_link_gbps"],
                            host_memory_bytes_per_s=gbps["host_memory_gbps"], **kwargs)
    if args.json:
        units = {"memory": "bytes (total_memory, host_memory)", "seconds": "added_seconds, total_seconds: seconds per "
                 "optimizer step", "figures": "FLOP/s and bytes/s, as each key names"}
        out.write(json.dumps(_with_launch(_json_document({**ladder.to_dict(), "units": units},
                                                         scenario, None, ladder.baseline), args),
                             indent=2, sort_keys=True, default=str) + "\n")
    else:
        b = ladder.baseline
        out.write(_profile_note_lines("", scenario))
        out.write(f"{b.model} on {b.hardware}  (profile: {b.profile})\n{ladder.describe()}\n")
        out.write(_launch_section(args))
    return 0


def cmd_search(args, out) -> int:
    """Every layout under one profile: measured by default (a run it does not model is
    refused, never ranked under another profile), or the one --profile names."""
    from . import search
    from .solver import TrainingMemoryModel
    for flag, dest, why in args.search_refused:
        value = getattr(args, dest)
        if value is not None:
            raise InvalidInputError(flag, value, "not a `search` flag", why)
    if args.rows < 0:
        raise InvalidInputError("--rows", args.rows, "a whole number of rows >= 1, or 0 for all of them")
    options = _option_values(args, {})
    if args.launch_from:
        options = _search_from_launch(args, options)
    for flag, dest in (("--devices", "devices"), ("--global-batch", "global_batch")):
        if getattr(args, dest) is None:
            raise InvalidInputError(flag, None, "a whole number (required, except with --from FILE)")
    model, hardware = _model(args.model), _hardware(args.hardware)
    solver = TrainingMemoryModel(plugin_manager=_manager(args))
    # auto: a bar on a terminal after 0.5 s; in a pipe a line every 5 s after 3 s; MLSYSIM_NO_PROGRESS=1: none
    show = args.progress == "always" or (args.progress == "auto" and not os.environ.get("MLSYSIM_NO_PROGRESS"))
    tty = sys.stderr.isatty()

    def run(profile, options, trainable_fraction=1.0):
        delay = 0.0 if args.progress == "always" else 0.5 if tty else 3.0
        progress = search.text_progress(delay=delay, bar=tty) if show else None
        return search.search_plans(model, hardware, devices=args.devices, global_batch=args.global_batch,
                                   seq_len=args.seq_len, precision=args.precision, optimizer=args.optimizer,
                                   checkpointing=args.checkpointing, solver=solver, context_parallel=args.cp,
                                   max_tp=args.max_tp, allow_cross_node_tp=args.allow_cross_node_tp,
                                   allow_cross_node_ep=args.allow_cross_node_ep, interleave=args.interleave,
                                   allow_compile=args.allow_compile,
                                   allow_float8=args.allow_float8,
                                   workers=args.workers, progress=progress, profile=profile,
                                   trainable_fraction=trainable_fraction, headroom=_headroom(args.headroom),
                                   **({"plugin_options": _parse_options(args.option)} if args.option else {}),
                                   **options)

    if args.cp is not None:    # checked here, so that the error names the flag
        for size in args.cp:
            if size < 1:
                raise InvalidInputError("--cp", size, "context-parallel sizes >= 1, e.g. --cp 1 2 4")
    if args.profile is not None:
        found = run(args.profile, options)
    else:
        try:
            found = run(DEFAULT_PROFILE, options)
        except NotModelledError as err:     # never answered by another profile
            raise not_modelled_refusal(err, args.model) from err
    from .scenario import model_notes
    said = model_notes(args.model)     # (what the model's config.json left to transformers' defaults)
    if args.json:
        out.write(json.dumps(_with_launch({**found.to_dict(), "input_notes": said}, args), indent=2,
                             sort_keys=True) + "\n")
    else:
        out.write("".join(f"note: {text}\n\n" for text in said))
        out.write(found.table(rows=args.rows or None, pareto_only=not args.all) + "\n")
        out.write(_launch_section(args))
    return 0


def _search_from_launch(args, options: dict) -> dict:
    """`search --from`: the launch files give the device count, the global batch, the model, the
    sequence, precision, optimizer, checkpointing and the profile options search takes; flags given
    override them (said); the files' layout (tp, pp, dp, ZeRO...) is left to the search (said)."""
    from .scenario import from_launch
    given = {dest: flag for dest, (flag, _value, _typed) in getattr(args, "_given", {}).items()}
    args.gpus = args.devices
    launch = from_launch(args.launch_from, gpus=_launch_gpus(args), model=args.model if "model" in given else None,
                         hardware=args.hardware if "hardware" in given else None,
                         framework_version=args.framework_version,
                         seq_len=args.seq_len if "seq_len" in given else None, overrides=args.override,
                         registry=_manager(args).registry,
                         batch_size=args.global_batch if "global_batch" in given else None)
    sc = launch.scenario
    world = sc.dp_size * sc.tp_size * sc.pp_size * sc.cp_size
    overridden, notes = [], []
    for dest, value in (("devices", world), ("global_batch", sc.batch_size), ("model", sc.model),
                        ("hardware", sc.hardware), ("seq_len", sc.seq_len), ("precision", sc.precision),
                        ("optimizer", sc.optimizer), ("checkpointing", [sc.activation_checkpointing])):
        if dest not in given:
            setattr(args, dest, value)
        elif getattr(args, dest) != value:     # (model, hardware, devices: given to from_launch)
            overridden.append((dest, value, given[dest], getattr(args, dest)))
    import inspect
    from .search import search_plans
    taken = inspect.signature(search_plans).parameters
    merged = dict(options)
    for name, value in sc.profile_options.items():
        if name not in args.option_fields or name not in taken:
            notes.append(f"{name}={value!r} from the files is left to the search (it enumerates the layout)")
        elif name in options and options[name] != value:
            overridden.append((name, value, name, options[name]))
        else:
            merged.setdefault(name, value)
    layout = {n: getattr(sc, n) for n in ("tp_size", "pp_size", "cp_size", "ep_size", "zero_stage",
                                         "data_parallel", "gradient_accumulation_steps") if getattr(sc, n) not in (1, 0, None)}
    if layout:
        notes.append(f"the files' layout {layout} is not imposed: search enumerates every layout of {world} devices")
    import attrs
    args._launch = attrs.evolve(launch.with_overrides(overridden), notes=(*launch.notes, *notes))
    return merged


def cmd_time(args, out) -> int:
    """One layout timed as a search times it (mlsysim_core.search.time_plan)."""
    from . import search
    from .solver import TrainingMemoryModel
    if args.data_parallel is not None and args.zero_stage is not None:
        raise InvalidInputError("--zero-stage", args.zero_stage, "one of --data-parallel and --zero-stage, not both")
    rule = args.data_parallel or (f"zero{args.zero_stage}" if args.zero_stage is not None else "zero0")
    if args.microbatch is not None and args.grad_accum is not None:
        raise InvalidInputError("--grad-accum", args.grad_accum, "one of --micro-batch and --grad-accum, not both")
    if args.power_limit is not None and not 0 < args.power_limit < float("inf"):     # (nan too)
        raise InvalidInputError("--power-limit", args.power_limit, "a positive finite number of watts (default: the "
                                "hardware's TDP)")
    dp = max(args.dp, 1)
    microbatch = args.microbatch
    if microbatch is None:
        steps = 1 if args.grad_accum is None else args.grad_accum
        if steps < 1:
            raise InvalidInputError("--grad-accum", steps, "an integer >= 1")
        if args.global_batch >= 1 and args.global_batch % (dp * steps):
            flag, value = ("--grad-accum", steps) if args.grad_accum is not None else ("--global-batch",
                                                                                          args.global_batch)
            raise InvalidInputError(flag, value, f"--global-batch a multiple of --dp x --grad-accum = {dp} x {steps}",
                                    f"{args.global_batch} / {dp * steps} is not a whole micro-batch")
        microbatch = args.global_batch // (dp * steps)
    solver = TrainingMemoryModel(plugin_manager=_manager(args))
    # --compiled: the run is compiled block by block for its memory too, as the search's --allow-compile
    # rows are (a run the profile cannot describe compiled is refused, naming why).
    run = {**({"compile": search.COMPILE_MODE} if args.compiled else {}),
           **({"regime": args.regime} if args.regime else {}),
           **({"plugin_options": _parse_options(args.option)} if args.option else {})}
    r = search.time_plan(_model(args.model), _hardware(args.hardware), global_batch=args.global_batch,
                         seq_len=args.seq_len, tp=args.tp, cp=args.cp, pp=args.pp, dp=args.dp, ep=args.ep, vp=args.vp,
                         data_parallel=rule, checkpointing=args.checkpointing, microbatch=microbatch,
                         sequence_parallel=args.sequence_parallel, precision=args.precision,
                         optimizer=args.optimizer, profile=args.profile or DEFAULT_PROFILE,
                         pipeline_schedule=args.pipeline_schedule, compiled=args.compiled,
                         float8=args.float8,
                         async_tp=args.async_tp, ep_overlap=args.ep_overlap, power=args.power_limit, solver=solver,
                         **run)
    from .scenario import model_notes
    r["notes"] = [*r["notes"], *model_notes(args.model)]
    model, hardware = _model(args.model).name, _hardware(args.hardware).name
    run = {"model": model, "hardware": hardware, "global_batch": args.global_batch, "seq_len": args.seq_len,
           "precision": args.precision, "regime": args.regime, "optimizer": args.optimizer,
           "profile": args.profile or DEFAULT_PROFILE}
    if args.json:
        units = {"step_s": "seconds per optimizer step", "components": "seconds per optimizer step",
                 "memory_bytes": "bytes (the heaviest rank)", "tokens_per_s": "tokens per second, the whole run",
                 "tokens_per_s_per_device": "tokens per second per device", "bubble": "share of the step (0-1)",
                 "mfu": "share of the dense bf16 peak (0-1)"}
        out.write(json.dumps({**r, "run": run, "units": units, "schema_version": _schema_version()}, indent=2,
                             sort_keys=True, default=str) + "\n")
        return 0
    L = r["layout"]
    lines = [f"{model} on {L['devices']} x {hardware}: tp {L['tp']}, cp {L['cp']}, pp {L['pp']}"
             + (f" (vp {L['vp']})" if L["vp"] > 1 else "") + f", dp {L['dp']} ({L['data_parallel']}), ep {L['ep']}, "
             f"{L['checkpointing']} checkpointing (recompute {L['recompute']:.2f}), micro-batch {L['microbatch']} x "
             f"{L['gradient_accumulation_steps']}" + (", sequence parallel" if L["sequence_parallel"] else ""),
             f"profile {run['profile']}, "
             + (f"{search.precision_words(args.precision, args.regime)}regime {args.regime}" if args.regime
                else f"precision {args.precision}") + f", optimizer {args.optimizer}, global batch "
             f"{args.global_batch}, seq {args.seq_len}",
             f"step {r['step_s']:.4g} s   {r['tokens_per_s']:,.0f} tokens/s ({r['tokens_per_s_per_device']:,.0f} per "
             f"device)   MFU {r['mfu']:.1%}   bubble {r['bubble']:.1%}"
             + ("" if r["calibrated"] else "   (uncalibrated)")]
    if r["memory_bytes"] is not None:
        lines.append(f"memory {r['memory_bytes'] / 1e9:.2f} GB ({r['memory_bytes'] / 2**30:.2f} GiB) on the heaviest "
                     f"rank: {'fits' if r['fits'] else 'does NOT fit'}")
    lines.append("")
    lines.append(f"{'component':<10} {'seconds':>12} {'share':>7}")
    for name, value in r["components"].items():
        if name != "step":
            lines.append(f"{name:<10} {value:>12.4g} {value / r['step_s']:>7.1%}")
    lines.append(f"{'step':<10} {r['step_s']:>12.4g}")
    for note in r["notes"]:
        lines.append(f"note: {note}")
    out.write("\n".join(lines) + "\n")
    return 0


COMMANDS = {"estimate": cmd_estimate, "plot": cmd_plot, "fit": cmd_fit, "search": cmd_search, "plugins": cmd_plugins, "models": cmd_models,
            "hardware": cmd_hardware, "time": cmd_time}


class _Printable:
    """A text stream that never raises UnicodeEncodeError: what its encoding cannot hold
    (an ASCII or cp1252 console) is written with ASCII drawing (``render.printable``)."""

    def __init__(self, stream):
        self._stream = stream
        self.encoding = getattr(stream, "encoding", None)

    def write(self, text: str) -> int:
        from .render import printable
        try:
            return self._stream.write(printable(text, self.encoding))
        except BrokenPipeError:
            raise
        except OSError as err:     # a full disk (> /dev/full), a closed pipe's cousins
            raise _OutputError(err) from err

    def flush(self) -> None:
        flush = getattr(self._stream, "flush", None)
        if flush is None:
            return
        try:
            flush()
        except BrokenPipeError:
            raise
        except OSError as err:
            raise _OutputError(err) from err

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _OutputError(Exception):
    """Writing the command's output failed (an OSError other than a broken pipe)."""

    def __init__(self, error: OSError):
        self.error = error
        super().__init__(str(error))


def _say(message: str) -> None:
    """One line on stderr, if there is a stderr that takes it (never raises)."""
    stream = sys.stderr
    if stream is None:
        return
    try:
        _Printable(stream).write(message + "\n")
        stream.flush()
    except Exception:     # a closed or full stderr: nothing more can be said
        pass


def _discard_stdout() -> None:
    """Point fd 1 at /dev/null so that the interpreter's final flush of what is still
    buffered cannot fail again (a traceback-free exit after a broken or full stdout)."""
    import os
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass


def _tolerant_std_streams() -> None:
    """sys.stdout and sys.stderr (argparse's help and errors, our messages) replace what
    their encoding cannot hold instead of raising."""
    for stream in (sys.stdout, sys.stderr):
        encoding = getattr(stream, "encoding", None)
        reconfigure = getattr(stream, "reconfigure", None)
        if not encoding or reconfigure is None:
            continue
        try:
            "\u2502\u2588\u00d7\u2264".encode(encoding)
        except (UnicodeEncodeError, LookupError):
            try:
                reconfigure(errors="replace")
            except (ValueError, OSError):
                pass


class _Lenient(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


def _flags_registry(argv: list[str]):
    """``(registry, known)``: the plugin-loading flags, read first and alone (the full parse
    names any mistake in them), and the registry of the plugins they load, whose profiles'
    options are flags (its manager is kept for the command); None, for the built-in plugins',
    when those fail to load (the command then says why)."""
    pre = _Lenient(add_help=False)
    pre.add_argument("--disable-plugin", action="append", default=[])
    pre.add_argument("--no-third-party-plugins", action="store_true")
    try:
        known = pre.parse_known_args(argv)[0]
        with _manager(known).allowing_broken() as pm:
            return pm.registry, known
    except (ValueError, MlsysimError, OSError):     # (OSError: a stderr that cannot take a warning)
        return None, argparse.Namespace()


def describe_blocked(pm, name: str) -> str:
    """What a blocked name did, for listings (``(blocked)``, ``(blocked: distribution, ...)``, ...)."""
    from .manager import _normalise_dist
    if name in pm.unknown_blocked:
        close = pm.unknown_blocked[name]
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        return f"(blocked: matches no installed plugin or distribution, blocks nothing{hint})"
    by_dist = sorted({i.name for i in pm.blocked_entry_points
                      if _normalise_dist(i.distribution) == _normalise_dist(name)})
    if by_dist and name not in {i.name for i in pm.blocked_entry_points}:
        return f"(blocked: distribution, entry point(s) {', '.join(by_dist)})"
    return "(blocked)"


@contextlib.contextmanager
def plugin_warnings_to_stderr():
    """Each ``PluginWarning`` printed once on stderr, as the command line does."""
    import warnings
    from .manager import PluginWarning
    with warnings.catch_warnings():
        warnings.simplefilter("always", PluginWarning)
        previous, seen = warnings.showwarning, set()

        def show(message, category, filename, lineno, file=None, line=None):
            if not issubclass(category, PluginWarning):
                return previous(message, category, filename, lineno, file, line)
            if str(message) not in seen:
                seen.add(str(message))
                print(f"mlsysim-core: warning: {message}", file=sys.stderr)

        warnings.showwarning = show
        yield


def main(argv: list[str] | None = None, out=None) -> int:
    if sys.stderr is None:     # `2>&-`: messages go nowhere, exit codes stay right
        import os
        sys.stderr = open(os.devnull, "w", encoding="utf-8")
    _tolerant_std_streams()
    real_stdout = out is None
    argv = list(sys.argv[1:] if argv is None else argv)
    with plugin_warnings_to_stderr():    # e.g. an unknown --disable-plugin name: warned, not fatal
        misplaced = _flag_before_command(argv)
        if misplaced is not None:
            _say(f"mlsysim-core: error: {misplaced}")
            return 2
        registry, known = _flags_registry(argv)
        parser = _parser(registry)
        args = _parse_args(parser, argv, registry, known)
        if args.command is None:   # bare `mlsysim-core` runs the default estimate
            args = _parse_args(parser, [*argv, "estimate"], registry, known)
        # (not set_defaults: parent-parser actions are shared, and defaults would clobber values)
        for name, default in (("disable_plugin", []), ("no_third_party_plugins", False), ("debug", False)):
            if not hasattr(args, name):
                setattr(args, name, default)
        if hasattr(known, "_plugin_manager") and (args.disable_plugin, args.no_third_party_plugins) == (
                known.disable_plugin, known.no_third_party_plugins):
            args._plugin_manager = known._plugin_manager
        return _run(args, out, real_stdout)


def _parse_args(parser, argv, registry, known):
    """``parser.parse_args(argv)``; where it would refuse "unrecognized arguments", a flag that the
    options of an installed plugin this command did not load (blocked, or third parties off) would
    add is named with its plugin and why (exit 2)."""
    from gettext import gettext as _     # (argparse's own message, translated as argparse does)
    args, rest = parser.parse_known_args(argv)
    if rest:
        message = _("unrecognized arguments: %s") % " ".join(rest)
        unloaded = _unloaded_flags(rest, registry, known) if hasattr(args, "option_fields") else ""
        parser.error(f"{message} ({unloaded})" if unloaded else message)
    return args


def _unloaded_flags(rest, registry, known) -> str:
    """What the flags among ``rest`` (argparse's unrecognized arguments) are, where an installed
    plugin that the command's manager (``known``'s) left out declares them as an option's flag:
    ``"--x: 'x' is an option of plugin 'p' (dist 1.0), blocked by ..."``; ``""`` if none is."""
    pm = getattr(known, "_plugin_manager", None)
    given = {arg.split("=", 1)[0] for arg in rest if arg.startswith("--")}
    if pm is None or registry is None or not given:
        return ""
    everything = _every_installed_registry()     # (an error path only: every installed plugin loaded)
    if everything is None:
        return ""
    from .scenario import option_fields, unloaded_options
    loaded = option_fields(registry)
    said = []
    for name, field in option_fields(everything).items():
        meta = field.metadata
        flags = (_flags(meta, name) if meta.get("type", str) is not None else ()) + tuple(
            flag for spec in meta.get("flags") or () for flag in _flags(spec))
        for flag in (f for f in flags if f in given and name not in loaded):
            why = unloaded_options([name], pm, loaded=loaded)
            if why:
                said.append(f"{flag}: {why}")
    return "; ".join(said)


def _flag_before_command(argv) -> InvalidInputError | None:
    """A command's flag given before any command (`mlsysim-core -m llama3-70b`): argparse would
    read the flag's value as the command. The error names the command to give."""
    i = 0
    while i < len(argv) and (argv[i] in ("--disable-plugin", "--no-third-party-plugins", "--debug")
                             or argv[i].startswith("--disable-plugin=")):
        i += 2 if argv[i] == "--disable-plugin" else 1
    rest = argv[i:]
    if not rest or not rest[0].startswith("-") or rest[0] in ("-h", "--help") or any(a in COMMANDS for a in rest):
        return None
    return InvalidInputError("COMMAND", rest[0], f"a command first ({', '.join(COMMANDS)}), then its flags",
                             f"e.g. mlsysim-core estimate {' '.join(rest)}")


def _run(args, out, real_stdout: bool) -> int:
    if out is None and sys.stdout is None:     # `>&-`: nowhere to write the answer
        _say("mlsysim-core: error: standard output is closed: there is nowhere to write the output")
        return 2
    out = _Printable(out or sys.stdout)
    try:
        code = COMMANDS[args.command](args, out)
        out.flush()     # a full disk fails here, while it can still be reported
        return code
    except MlsysimError as err:
        if args.debug:
            raise
        if isinstance(err, InvalidInputError):
            err = _attributed(err, args)
        _say(f"mlsysim-core: error: {err}")
        return 2 if isinstance(err, InvalidInputError) else 3
    except UnicodeEncodeError as err:     # a stream we did not wrap: say so, never a traceback
        if args.debug:
            raise
        _say(f"mlsysim-core: error: the output could not be written in the stream's encoding ({err.encoding}); "
             "set PYTHONIOENCODING=utf-8")
        return 2
    except BrokenPipeError:   # `mlsysim-core models | head`: the reader left; not an error
        if real_stdout:
            _discard_stdout()
        return 0
    except _OutputError as err:     # e.g. `> /dev/full`
        if args.debug:
            raise err.error
        if real_stdout:
            _discard_stdout()
        _say(f"mlsysim-core: error: writing the output failed: {err.error.strerror or err.error}")
        return 2
    except OSError as err:     # e.g. a stderr that cannot take a warning
        if args.debug:
            raise
        _say(f"mlsysim-core: error: {err}")
        return 2
