"""One plugin world (issue 24, item 7): a built-in is a registration a third party could make.

- **Renamed, not changed.** Every built-in optimizer, checkpointing strategy, sharding rule,
  architecture family, attention kernel, training regime and pipeline schedule, registered
  again by a third-party plugin under another name (the same object, ``attrs.evolve(item,
  name=...)``, through the hook the built-in uses), gives byte-identical results: over a
  sample of the reference grid (reference profile), single-device runs of every family's
  catalog models and the family validation runs (measured profile), and parallel layouts
  (tp/sp/pp/cp/ep/dp, ZeRO 0-3, FSDP; both profiles). Only the name may differ: the
  result is compared as ``to_dict()`` with the new name written back as the old one, the
  third-party plugin as the built-in's and its distribution as mlsysim-core's, and terms
  compared as a set (their order is by source name). Every number, every phase total,
  every rank, every note and every error is compared.
- **A family** is chosen by its claim, not by name: its copy claims the same architectures,
  so the plugin that provides the original is replaced by one that provides the same
  families with that one renamed (two claimants would be a conflict).
- **A rule that shards nothing** changes the answer, under both profiles.
- **Blocking a built-in** plugin either removes what it provides (a solve naming it fails
  with an error naming it) or is refused with an error naming it; never silently still works.
- **Techniques** (offload, LoRA, loss, float8, optimizer-in-backward) are registrations.

``STILL_NAMED`` lists what fails today, each with the difference measured: those tests are
``xfail(strict=True)``, so whoever fixes one must delete its entry (the test then asserts).
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

import attrs
import pytest

from familytools import BIG, FAMILIES_DIR, PRECISION, run_model
from mlsysim_core import (HardwareNode, ShardingEffect, ShardingRuleSpec, SparseTransformerWorkload,
                          TrainingMemoryModel, TransformerWorkload, hookimpl)
from mlsysim_core.catalog import get_model
from mlsysim_core.scenario import LAUNCH_FORMAT, launch_formats
from mlsysim_core.errors import MlsysimError, PluginError
from mlsysim_core.manager import OWN_DISTRIBUTION, PluginManager
from mlsysim_core.registry import CHECKPOINTING, OPTIMIZER, PROFILE, SHARDING, PluginInfo
from mlsysim_core.search import FLOAT8_HOOK as FLOAT8, STEP_TIME_HOOK as STEP_TIME

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = "mlsysim_measured_architectures"
KERNELS = "mlsysim_measured_attention_kernels"
REGIMES = "mlsysim_measured_regimes"
SCHEDULES = "mlsysim_measured_pipeline_schedules"

# What fails today, (kind, built-in name) -> the difference measured (tests/plugins/test_one_plugin_world.py
# prints it on failure). Delete an entry once its test passes: strict xfail fails on a pass.
STILL_NAMED: dict[tuple[str, str], str] = {
}

# --- the built-in world ----------------------------------------------------------------------------

_BUILTIN_PM = PluginManager.from_environment(autoload=False, blocked=())
_REGISTRY = _BUILTIN_PM.registry
_SOLVER = TrainingMemoryModel(plugin_manager=_BUILTIN_PM)
_OWN_SOURCE = next(i.source for i in _REGISTRY.plugins.values() if i.distribution == OWN_DISTRIBUTION)

# kind -> (the registration hook, the registry's table, the registry's kind for providers)
KINDS = {
    "optimizer": ("mlsysim_optimizers", _REGISTRY.optimizers, OPTIMIZER),
    "checkpointing": ("mlsysim_checkpointing_strategies", _REGISTRY.checkpointing, CHECKPOINTING),
    "rule": ("mlsysim_sharding_rules", _REGISTRY.sharding_rules, SHARDING),
    "kernel": (KERNELS, _REGISTRY.extensions[KERNELS], KERNELS),
    "regime": (REGIMES, _REGISTRY.extensions[REGIMES], REGIMES),
    "schedule": (SCHEDULES, _REGISTRY.extensions[SCHEDULES], SCHEDULES),
    "family": (FAMILIES, _REGISTRY.extensions[FAMILIES], FAMILIES),
}


def _builtin(kind: str, name: str) -> bool:
    hook, table, registry_kind = KINDS[kind]
    return _REGISTRY.provider(registry_kind, name).distribution == OWN_DISTRIBUTION


BUILTINS = [(kind, name) for kind, (_, table, _) in KINDS.items() for name in sorted(table) if _builtin(kind, name)]
THIRD = PluginInfo(name="acme_world", distribution="acme-world", version="1.0")


def _new_name(kind: str, name: str) -> str:
    """Another name, sharing no part of the old one (a check on a substring would show)."""
    return f"acme-{kind[:3]}-{BUILTINS.index((kind, name)):02d}x"


def _marked(key, *, prefix=""):
    """The case's parameters; every renamed built-in but the first of its kind runs under ``--long`` (CI runs
    them all; the quick suite keeps one per kind)."""
    reason = STILL_NAMED.get(key)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    if key in BUILTINS and key != next(k for k in BUILTINS if k[0] == key[0]):
        marks.append(pytest.mark.long)
    return pytest.param(*key, marks=marks, id=f"{prefix}{key[0]}-{key[1]}")


# --- worlds with one item renamed -------------------------------------------------------------------

class _Module:
    """A plugin object with one hook implementation (what a third-party module would be)."""

    def __init__(self, hook: str, items):
        setattr(self, hook, hookimpl(lambda: list(items)))


def _renamed_world(kind: str, name: str) -> PluginManager:
    """The built-ins plus a third-party plugin registering ``name``'s item again under
    ``_new_name``; for a family, the plugin that provides it is replaced by one providing the
    same families with that one renamed (a family is chosen by its claim)."""
    hook, table, registry_kind = KINDS[kind]
    copy = attrs.evolve(table[name], name=_new_name(kind, name))
    pm = PluginManager()
    replaced = _REGISTRY.provider(registry_kind, name).name if kind == "family" else None
    for plugin_name, plugin in sorted(_BUILTIN_PM.list_name_plugin()):
        if plugin is not None and plugin_name != replaced:
            pm.register(plugin, name=plugin_name, info=_BUILTIN_PM.info(plugin_name))
    if replaced:
        provided = getattr(_BUILTIN_PM.get_plugin(replaced), hook)()
        items = [copy if item.name == name else item for item in provided]
    else:
        items = [copy]
    pm.register(_Module(hook, items), name=THIRD.name, info=THIRD)
    pm.check()
    return pm


@functools.lru_cache(maxsize=None)
def _renamed_solver(kind: str, name: str) -> TrainingMemoryModel:
    return TrainingMemoryModel(plugin_manager=_renamed_world(kind, name))


# --- cases ---------------------------------------------------------------------------------------------

@attrs.frozen
class Case:
    label: str
    model: object
    hardware: object
    batch: int
    seq: int
    kwargs: dict = attrs.field(converter=dict, eq=False, hash=False)

    @property
    def profile(self) -> str:
        return self.kwargs.get("profile", "reference")

    def size(self, axis: str) -> int:
        return self.kwargs.get(f"{axis}_size", 1)


def _grid_cases(every: int = 40) -> list[Case]:
    """A sample of tests/data/reference_grid.json (reference profile), every ``every``-th
    solvable case."""
    cases = json.loads((ROOT / "tests" / "data" / "reference_grid.json").read_text())["cases"]
    out = []
    for case in cases[::every]:
        if case["kind"] != "ok":
            continue
        fields = {k: v for k, v in case["model"].items() if v is not None and k != "kind"}
        cls = SparseTransformerWorkload if case["model"]["kind"] == "sparse_transformer" else TransformerWorkload
        model = cls(**fields)
        kw = dict(case["kwargs"])
        if kw["pp_size"] > model.layers or kw["ep_size"] > getattr(model, "experts", 1):
            continue
        out.append(Case(f"grid{case['id']}", model, HardwareNode(name="hw", memory_capacity=case["memory_capacity"]),
                        kw.pop("batch_size"), kw.pop("seq_len"), {**kw, "profile": "reference"}))
    return out


# One catalog model per family (at least): single-device measured runs on an H100.
MODELS = ("llama3-8b", "gpt2", "olmo-7b-hf", "mixtral-8x7b", "qwen3-8b", "qwen2.5-0.5b", "phi-3-mini-4k-instruct",
          "olmo-2-1124-7b", "falcon-7b", "gemma-2-2b", "gemma-3-1b-it", "gpt-oss-20b", "deepseek-v2-lite",
          "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "llama-4-maverick-17b-128e")


LONG_SEQUENCE_MODELS = ("llama3-8b", "gpt2", "mixtral-8x7b", "gemma-3-1b-it", "gpt-oss-20b", "deepseek-v2-lite")


def _single_cases() -> list[Case]:
    """Each model with AdamW at a short sequence (the optimizer step's peak); some also with SGD
    at a long one (the backward's)."""
    short = [Case(f"{m}-1dev", m, "h100", 4, 1024, dict(profile="measured", precision="bf16", optimizer="adamw"))
             for m in MODELS]
    return short + [Case(f"{m}-1dev-long", m, "h100", 8, 4096, dict(profile="measured", precision="bf16",
                                                                      optimizer="sgd")) for m in LONG_SEQUENCE_MODELS]


def _family_run_cases() -> list[Case]:
    """validation/families/*: the first run of each architecture (model_type), solved as
    tests/familytools.py solves them (CPU, no runtime overheads)."""
    out, seen = [], set()
    for path in sorted(FAMILIES_DIR.glob("*/measurements.json")):
        for run in json.loads(path.read_text(encoding="utf-8"))["runs"]:
            arch = run["hf_config"].get("model_type")
            if arch in seen:
                continue
            seen.add(arch)
            kwargs = dict(profile="measured", precision=PRECISION[run["regime"]], optimizer=run["optimizer"],
                          activation_checkpointing=run["checkpointing"], regime=run["regime"],
                          optimizer_impl=run["optimizer_impl"], attention=run["attention"],
                          dropout=run.get("dropout", 0.0), device="cpu", runtime_overheads=False,
                          **run.get("solve_options", {}))
            out.append(Case(run["id"], run_model(run), BIG, run["batch_size"], run["seq_len"], kwargs))
    return out


PARALLEL_REGIMES = {"fp32": "fp32", "bf16": "bf16", "mp-bf16": "fsdp-bf16"}   # validation/parallel/compare.py
_LAYOUTS = {   # model -> layouts (global batch 16, sequence 2048)
    "llama3-8b": [dict(tp_size=2), dict(tp_size=2, sequence_parallel=True),
                  dict(pp_size=2, gradient_accumulation_steps=4),
                  dict(pp_size=4, dp_size=2, gradient_accumulation_steps=8, activation_checkpointing="full"),
                  dict(tp_size=4, cp_size=2, dp_size=2, zero_stage=2, sequence_parallel=True),
                  dict(dp_size=4, zero_stage=1), dict(dp_size=4, zero_stage=2), dict(dp_size=4, zero_stage=3),
                  dict(dp_size=4, data_parallel="fsdp"), dict(cp_size=2, dp_size=2),
                  dict(tp_size=2, pp_size=2, dp_size=2, zero_stage=1, gradient_accumulation_steps=4)],
    "gpt2": [dict(tp_size=2, dp_size=2, zero_stage=2), dict(pp_size=2, dp_size=2, gradient_accumulation_steps=2)],
    "mixtral-8x7b": [dict(ep_size=2, dp_size=2), dict(ep_size=4, tp_size=2, dp_size=4, zero_stage=1)],
    "qwen3-8b": [dict(tp_size=2, pp_size=2, dp_size=2, zero_stage=3, gradient_accumulation_steps=2)],
    "deepseek-v2-lite": [dict(ep_size=2, pp_size=3, dp_size=2, gradient_accumulation_steps=3)],
}


def _parallel_cases() -> list[Case]:
    """The layouts above under both profiles, and every fourth run of validation/parallel (FSDP2,
    DTensor tp and tp+sp, as validation/parallel/compare.py solves them)."""
    out = []
    runs = json.loads((ROOT / "validation" / "parallel" / "measurements.json").read_text())["runs"]
    for run in runs[::4]:
        layout = dict(zip(run["layout"]["mesh_dim_names"], run["layout"]["mesh_shape"]))
        tp = layout.get("tp", 1)
        dp = run["layout"]["world_size"] // tp
        kwargs = dict(profile="measured", tp_size=tp, dp_size=dp, sequence_parallel=run["layout"]["kind"] == "tp+sp",
                      precision="fp32", optimizer=run["optimizer"], activation_checkpointing="none",
                      regime=PARALLEL_REGIMES[run["regime"]], optimizer_impl=run["optimizer_impl"],
                      attention=run["attention"], runtime_overheads=False)
        if dp > 1:
            kwargs["data_parallel"] = "fsdp" if run["layout"].get("reshard_after_forward") else "fsdp-grad-op"
        out.append(Case(run["id"], run_model({**run, "id": run["model"]}),
                        HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"] * dp, run["seq_len"],
                        kwargs))
    for model, layouts in _LAYOUTS.items():
        for layout in layouts:
            tag = "-".join(f"{k.split('_')[0]}{v}" for k, v in layout.items())
            for profile in ("reference", "measured"):
                out.append(Case(f"{model}-{tag}-{profile}", model, "h100", 16, 2048,
                                dict(profile=profile, precision="bf16", **layout)))
    return out


@functools.lru_cache(maxsize=None)
def _family_parallel_cases() -> tuple[Case, ...]:
    """Each catalog model of MODELS split over 4 ranks (tp2 dp2 ZeRO-3, or ep2 dp2 with experts),
    measured: compared for the families only (the rest have the layouts above)."""
    out = []
    for m in MODELS:
        layout = dict(ep_size=2, dp_size=2) if get_model(m).is_sparse else dict(tp_size=2, dp_size=2, zero_stage=3)
        out.append(Case(f"{m}-4ranks", m, "h100", 8, 2048, dict(profile="measured", precision="bf16", **layout)))
    return tuple(out)


@functools.lru_cache(maxsize=None)
def _all_cases() -> tuple[Case, ...]:
    return (*_grid_cases(), *_single_cases(), *_family_run_cases(), *_parallel_cases())


def _claims(family_name: str, case: Case) -> bool:
    model = get_model(case.model) if isinstance(case.model, str) else case.model
    return _REGISTRY.extensions[FAMILIES][family_name].claims_model(model)


def _cases_for(kind: str, name: str) -> list[tuple[Case, dict, dict]]:
    """(case, the built-in's keywords, the copy's keywords) of every case that uses ``name``."""
    new = _new_name(kind, name)
    out = []
    for case in _all_cases():
        kw, measured = case.kwargs, case.profile == "measured"
        if kind == "optimizer":
            pair = {"optimizer": name}, {"optimizer": new}
        elif kind == "checkpointing":
            pair = {"activation_checkpointing": name}, {"activation_checkpointing": new}
        elif kind == "rule":
            axis = KINDS["rule"][1][name].axis
            if case.size(axis) < 2:
                continue
            if axis == "dp":
                base = {"zero_stage": 0, "data_parallel": name}
                pair = base, {**base, "data_parallel": new}
            else:
                pair = {"sharding_rules": {axis: name}}, {"sharding_rules": {axis: new}}
        elif kind == "kernel" and measured:
            pair = {"attention": name}, {"attention": new}
        elif kind == "regime" and measured:
            pair = {"regime": name}, {"regime": new}
        elif kind == "schedule" and measured and case.size("pp") > 1:
            pair = {"pipeline_schedule": name}, {"pipeline_schedule": new}
        elif kind == "family" and measured and _claims(name, case):
            pair = {}, {}
        else:
            continue
        out.append((case, {**kw, **pair[0]}, {**kw, **pair[1]}))
    if kind == "family":
        out += [(case, case.kwargs, case.kwargs) for case in _family_parallel_cases() if _claims(name, case)]
    return out


# --- comparing ------------------------------------------------------------------------------------------

def _normaliser(kind: str, name: str):
    """A function writing the copy's name back as the built-in's, the third-party plugin as the
    built-in plugin and its distribution as mlsysim-core's, in every string of a result."""
    new, plugin = _new_name(kind, name), _REGISTRY.provider(KINDS[kind][2], name).name
    pattern = re.compile("|".join(map(re.escape, (new, THIRD.source, THIRD.name))))
    back = {new: name, THIRD.source: _OWN_SOURCE, THIRD.name: plugin}

    def norm(value):
        if isinstance(value, str):
            return pattern.sub(lambda m: back[m.group(0)], value)
        if isinstance(value, dict):
            return {norm(k): norm(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            items = [norm(v) for v in value]
            if items and all(isinstance(v, dict) and "nbytes" in v for v in items):   # terms: as a set
                items.sort(key=lambda v: json.dumps(v, sort_keys=True, default=str))
            return items
        return value
    return norm


def _outcome(solver, case: Case, kwargs: dict, norm):
    try:
        result = solver.solve(case.model, case.hardware, case.batch, case.seq, **kwargs)
    except MlsysimError as err:
        return ("error", type(err).__name__, norm(str(err)))
    return ("ok", norm(result.to_dict()))


def _numbers(value, path="result"):
    """Every number of an outcome, by path (terms are sorted, so paths line up)."""
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, (int, float)):
        yield path, value
    elif isinstance(value, dict):
        for k in sorted(value, key=str):
            yield from _numbers(value[k], f"{path}.{k}")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}[{i}]")


def _first_difference(a, b, path="result"):
    """Where two values first differ."""
    if type(a) is not type(b):
        return f"{path}: {str(a)[:160]!s} != {str(b)[:160]!s}"
    if isinstance(a, dict):
        for k in sorted(set(a) | set(b), key=str):
            if a.get(k) != b.get(k):
                return _first_difference(a.get(k), b.get(k), f"{path}.{k}")
    if isinstance(a, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return _first_difference(x, y, f"{path}[{i}]")
    return f"{path}: {str(a)[:200]} != {str(b)[:200]}"


def _describe(want, got) -> str:
    """How the copy's outcome differs from the built-in's: the totals (GB), else the first
    number, else the first text."""
    if want[0] != "ok" or got[0] != "ok":
        said = lambda o: "solved" if o[0] == "ok" else f"{o[1]}: {o[2][:150]}" if len(o) > 2 else str(o)[:150]
        return f"built-in {said(want)}; renamed {said(got)}"
    a, b = want[1], got[1]
    if a["total_memory"] != b["total_memory"]:
        return f"total {a['total_memory'] / 1e9:.3f} GB (built-in) vs {b['total_memory'] / 1e9:.3f} GB (renamed)"
    na, nb = list(_numbers(a)), list(_numbers(b))
    for (pa, va), (pb, vb) in zip(na, nb):
        if (pa, va) != (pb, vb):
            return f"same total; {pa} = {va} (built-in) vs {pb} = {vb} (renamed)"
    return "same numbers; text differs: " + _first_difference(a, b)


def _differences(kind: str, name: str) -> tuple[int, list[str]]:
    """(how many cases solved, what differed in each case that differed)."""
    solver, norm, solved, diffs = _renamed_solver(kind, name), _normaliser(kind, name), 0, []
    for case, builtin_kw, copy_kw in _cases_for(kind, name):
        want = _outcome(_SOLVER, case, builtin_kw, norm)
        try:
            got = _outcome(solver, case, copy_kw, norm)
        except Exception as err:     # a crash on the copy only is a difference too
            got = ("crash", f"{type(err).__name__}: {err}")
        solved += want[0] == "ok"
        if got != want:
            diffs.append(f"{case.label}: {_describe(want, got)}")
    return solved, diffs


# --- the tests ------------------------------------------------------------------------------------------

def test_every_kind_has_builtins():
    """The parametrisation below is over something: every kind has built-ins, and each has cases."""
    kinds = {kind for kind, _ in BUILTINS}
    assert kinds == set(KINDS)
    assert len(BUILTINS) >= 60
    for key in BUILTINS:
        assert _cases_for(*key), key


@pytest.mark.parametrize(("kind", "name"), [_marked(key) for key in BUILTINS])
def test_renamed_builtin_gives_identical_results(kind, name):
    solved, diffs = _differences(kind, name)
    assert solved >= 1, f"no case solved with {kind} {name!r}: the comparison would prove nothing"
    assert not diffs, f"{kind} {name!r} renamed {_new_name(kind, name)!r} differs in {len(diffs)} case(s):\n" + \
        "\n".join(diffs[:8])


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_the_copy_is_what_the_renamed_world_holds():
    """The comparison compares something: in each renamed world the copy is registered (and a
    family's original is gone, so the copy is the one that claims its models)."""
    for kind, name in BUILTINS:
        hook, _, registry_kind = KINDS[kind]
        registry = _renamed_world(kind, name).registry
        table = {"optimizer": registry.optimizers, "checkpointing": registry.checkpointing,
                 "rule": registry.sharding_rules}.get(kind) or registry.extensions[hook]
        assert table[_new_name(kind, name)] == attrs.evolve(KINDS[kind][1][name], name=_new_name(kind, name))
        assert registry.provider(registry_kind, _new_name(kind, name)) == THIRD
        assert (name not in table) == (kind == "family"), (kind, name)


# --- a rule that shards nothing ---------------------------------------------------------------------------

class _ShardsNothing:
    """A third-party tensor-parallel rule whose effect splits nothing."""

    @staticmethod
    def apply(plan, options):
        return ShardingEffect()

    @hookimpl
    def mlsysim_sharding_rules(self):
        return [ShardingRuleSpec(name="acme-replicated-tp", axis="tp", apply=self.apply,
                                 description="every rank holds the whole model")]


@pytest.mark.parametrize(("kind", "name"), [_marked(("shards-nothing", "reference")),
                                            _marked(("shards-nothing", "measured"))])
def test_a_rule_that_shards_nothing_changes_the_answer(kind, name):
    pm = PluginManager()
    for plugin_name, plugin in sorted(_BUILTIN_PM.list_name_plugin()):
        pm.register(plugin, name=plugin_name, info=_BUILTIN_PM.info(plugin_name))
    pm.register(_ShardsNothing(), name=THIRD.name, info=THIRD)
    kwargs = dict(profile=name, precision="bf16", tp_size=2, dp_size=2, zero_stage=1)
    builtin = _SOLVER.solve("llama3-8b", "h100", 16, 2048, **kwargs)
    nothing = TrainingMemoryModel(plugin_manager=pm).solve("llama3-8b", "h100", 16, 2048,
                                                           sharding_rules={"tp": "acme-replicated-tp"}, **kwargs)
    assert nothing.selected["tp_rule"] == "acme-replicated-tp"
    assert nothing.weights > builtin.weights, (nothing.weights, builtin.weights)
    assert nothing.total_memory > builtin.total_memory, (nothing.total_memory / 1e9, builtin.total_memory / 1e9)


# --- blocking a built-in ------------------------------------------------------------------------------------

ENTRY_POINTS = sorted(name for name, _ in _BUILTIN_PM.list_name_plugin() if name in _BUILTIN_PM._entry_point_names)
_AXIS_SIZES = {"tp": dict(tp_size=2), "cp": dict(cp_size=2), "pp": dict(pp_size=2), "dp": dict(dp_size=2),
               "ep": dict(ep_size=2)}


def _naming(kind: str, name: str):
    """(model, keywords) of a solve that names the registered item ``name`` of ``kind``."""
    profile = dict(profile="measured")
    if kind == OPTIMIZER:
        return "llama3-8b", dict(optimizer=name, profile="reference")
    if kind == CHECKPOINTING:
        return "llama3-8b", dict(activation_checkpointing=name, profile="reference")
    if kind == SHARDING:
        axis = _REGISTRY.sharding_rules[name].axis
        rule = dict(data_parallel=name) if axis == "dp" else dict(sharding_rules={axis: name})
        return ("mixtral-8x7b" if axis == "ep" else "llama3-8b"), dict(profile="reference", **_AXIS_SIZES[axis], **rule)
    if kind == PROFILE:
        return "llama3-8b", dict(profile=name)
    if kind == KERNELS:
        return "llama3-8b", dict(attention=name, **profile)
    if kind == REGIMES:
        return "llama3-8b", dict(regime=name, **profile)
    if kind == SCHEDULES:
        return "llama3-8b", dict(pipeline_schedule=name, pp_size=2, gradient_accumulation_steps=4, **profile)
    if kind == STEP_TIME:       # (named by a search, not a solve)
        return "llama3-8b", dict(step_time_model=name)
    if kind == FLOAT8:          # (named by a step time, not a solve)
        return "llama3-8b", dict(float8=name)
    if kind == LAUNCH_FORMAT:   # (asked by --from, not a solve: gone from the registry)
        return None, {}
    raise AssertionError(kind)


def _family_model(family: str):
    """A model the family claims: a catalog model, else a family validation run's."""
    for case in (*_single_cases(), *_family_run_cases()):
        if _claims(family, case):
            return case.model
    raise AssertionError(f"no model claimed by family {family!r}")


@pytest.mark.parametrize(("kind", "name"), [_marked(("blocked", ep)) for ep in ENTRY_POINTS])
def test_blocking_a_builtin_removes_it_or_is_refused(kind, name):
    """Blocked, a built-in plugin is gone (every solve naming what it provides fails with an error
    naming that item or the plugin, or for a measured hook's items the hook; a model its family
    claims is refused or costed otherwise) or the block is refused with an error naming the
    plugin; a profile's component plugin blocked makes its profile fail naming it. Never
    silently still there."""
    try:
        pm = PluginManager.from_environment(autoload=False, blocked=(name,))
        pm.registry
    except PluginError as err:
        assert name in str(err), f"refused, but the error does not name {name!r}: {err}"
        return
    solver = TrainingMemoryModel(plugin_manager=pm)
    provided = sorted(key for key, info in _REGISTRY.providers.items() if info.name == name)
    used_by = sorted(p for p, spec in _REGISTRY.profiles.items() if name in spec.component_plugins)
    checks = [(kind_, item, *_naming(kind_, item)) for kind_, item in provided if kind_ != FAMILIES]
    checks += [(PROFILE, name, "llama3-8b", dict(profile=p)) for p in used_by]
    families = [item for kind_, item in provided if kind_ == FAMILIES]
    assert checks or families, f"{name!r} provides nothing a solve could name"
    still = []
    for kind_, item, model, kwargs in checks:
        if kind_ == LAUNCH_FORMAT:
            if item in launch_formats(pm.registry):
                still.append(f"{kind_} {item!r} is still registered")
            continue
        try:
            if kind_ == STEP_TIME:
                from mlsysim_core.search import search_plans
                search_plans(model, "h100", devices=2, global_batch=2, solver=solver, **kwargs)
            elif kind_ == FLOAT8:
                from mlsysim_core.search import time_plan
                time_plan(model, "h100", global_batch=2, solver=solver, memory=False, **kwargs)
            else:
                solver.solve(model, "h100", 16, 2048, **kwargs)
        except MlsysimError as err:
            # the item or the plugin; for a measured hook's items, the hook (none left registered)
            if not any(said in str(err) for said in (item, name, *[kind_] * kind_.startswith("mlsysim_"))):
                still.append(f"{kind_} {item!r}: the error names neither it, its kind nor the plugin: {err}")
            continue
        still.append(f"{kind_} {item!r} still solves")
    for family in families:
        model = _family_model(family)
        before = _SOLVER.solve(model, "h100", 4, 1024, profile="measured")
        try:
            after = solver.solve(model, "h100", 4, 1024, profile="measured")
        except MlsysimError:
            continue
        if after.to_dict() == before.to_dict():
            still.append(f"family {family!r}: {getattr(model, 'name', model)} solves exactly as before")
    assert not still, f"blocked {name!r}, and yet:\n" + "\n".join(still[:8])


# --- techniques -----------------------------------------------------------------------------------------------

TECHNIQUES = ("offload", "lora", "loss", "float8", "optimizer_in_backward")
TECHNIQUE_RUNS = {   # technique -> the options of a measured llama3-8b run (h100, 4 x 1024, bf16 AdamW) using it
    "offload": [dict(offload="optimizer+gradients"), dict(offload="torchao")],
    "lora": [dict(lora={"rank": 16, "quantization": "nf4"})],
    "loss": [dict(loss="chunked", loss_chunks=4), dict(loss="fused_linear")],
    "float8": [dict(float8="rowwise", regime="bf16", activation_checkpointing="none")],
    "optimizer_in_backward": [dict(optimizer_in_backward=True)],
}


@pytest.mark.parametrize(("kind", "name"), [_marked(("technique", t)) for t in TECHNIQUES])
def test_a_technique_is_a_registration(kind, name):
    """A technique is an item of a measured hook (item 3): registered again under another name by a
    third party (the built-in techniques' plugin replaced by one providing the same items, that one
    renamed), it gives byte-identical results (tests/measured/test_techniques_registered.py does every one,
    and the ladder)."""
    hooks = [h for h in _REGISTRY.profiles["measured"].registration_hooks if "technique" in h]
    assert hooks, "the measured profile has no hook registering techniques"
    names = {n.replace("-", "_") for h in hooks for n in _REGISTRY.extensions.get(h, {})}
    assert name in names, f"technique {name!r} is not registered (registered: {sorted(names)})"
    hook, new = hooks[0], f"acme-tec-{TECHNIQUES.index(name):02d}x"     # sharing no part of the old name
    provider = _REGISTRY.provider(hook, name).name
    items = [attrs.evolve(t, name=new) if t.name == name else t for t in _REGISTRY.extensions[hook].values()]
    pm = PluginManager()
    for plugin_name, plugin in sorted(_BUILTIN_PM.list_name_plugin()):
        if plugin is not None and plugin_name != provider:
            pm.register(plugin, name=plugin_name, info=_BUILTIN_PM.info(plugin_name))
    pm.register(_Module(hook, items), name=THIRD.name, info=THIRD)
    renamed = TrainingMemoryModel(plugin_manager=pm)
    assert new in renamed.registry.extensions[hook] and name not in renamed.registry.extensions[hook]
    for options in TECHNIQUE_RUNS[name]:
        kwargs = dict(profile="measured", precision="bf16", optimizer="adamw", **options)
        before = _SOLVER.solve("llama3-8b", "h100", 4, 1024, **kwargs).to_dict()
        after = renamed.solve("llama3-8b", "h100", 4, 1024, **kwargs).to_dict()
        assert json.dumps(after, sort_keys=True, default=str).replace(THIRD.name, provider) == \
            json.dumps(before, sort_keys=True, default=str), f"{name} renamed {new!r}: {options}"
