"""One test per hook spec (a meta-test checks that none is missing).

Each registers a small plugin directly in a manager that also holds the built-ins, and
checks the bytes it adds, by hand.
"""

import inspect
from pathlib import Path

import pytest

import mlsysim_core
from mlsysim_core import (ACTIVATIONS, COMMUNICATION_BUFFERS, GRADIENTS, HOST, OPTIMIZER_STATE, WEIGHTS,
                          CheckpointingSpec, HardwareNode, MemoryTerm, OptimizerSpec, ProfileSpec,
                          ShardingEffect, ShardingRuleSpec, TrainingMemoryModel, TransformerWorkload, hookimpl)
from mlsysim_core import hookspecs
from mlsysim_core.manager import PluginManager

P = 1_000_000_000
MODEL = TransformerWorkload(name="round", parameters=P, layers=10, hidden_dim=1000, heads=10)
GPU = HardwareNode(name="gpu", memory_capacity=80 * 2**30)


def solver_with(plugin, name="test_plugin", builtin_pm=None):
    pm = PluginManager()
    for plugin_name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(plugin_name), name=plugin_name, info=builtin_pm.info(plugin_name))
    pm.register(plugin, name=name)
    return TrainingMemoryModel(plugin_manager=pm)


def base(solver, **kw):
    return solver.solve(MODEL, GPU, 4, 100, **kw)


def test_every_hook_has_a_test():
    from mlsysim_plugins import steptime_hookspecs                     # built-in plugins' own hooks
    from mlsysim_plugins.launch import hookspecs as launch_hookspecs
    hooks = [n for module in (hookspecs, launch_hookspecs, steptime_hookspecs)
             for n, f in inspect.getmembers(module, inspect.isfunction) if n.startswith("mlsysim_")]
    assert len(hooks) == 16
    catalog_tests = Path(__file__).with_name("test_hooks_catalog.py").read_text(encoding="utf-8")
    missing = [h for h in hooks
               if f"test_hook_{h}" not in globals() and f"def test_hook_{h}(" not in catalog_tests]
    assert not missing, missing


def test_plugin_api_version_is_declared():
    assert mlsysim_core.PLUGIN_API_VERSION == (3, 1)


def test_hook_mlsysim_launch_formats(builtin_pm, tmp_path):
    """A third party's launch format reads a file into the scenario; a file it does not recognize is not its.
    The hook is the ``launch`` plugin's own (mlsysim_plugins.launch), collected like a core hook's items."""
    from mlsysim_core import hookimpl
    from mlsysim_plugins.launch import LaunchFormatSpec
    from mlsysim_core.manager import PluginManager
    from mlsysim_core.scenario import LaunchField, LaunchReading, from_launch, launch_formats

    def read(path, document, context):
        cfg = document["acme_trainer"]
        return LaunchReading(format="acme.trainer", path=str(path), world={"single_device": ("acme_trainer", True)},
                             fields=[LaunchField(key=f"acme_trainer.{k}", value=v, field=f, becomes=v)
                                     for k, f, v in (("model", "model", cfg["model"]), ("mbs", "micro_batch_size",
                                                     cfg["mbs"]), ("seq", "seq_len", cfg["seq"]))])

    class Acme:
        @hookimpl
        def mlsysim_launch_formats(self):
            return [LaunchFormatSpec(name="acme.trainer", description="ACME trainer", framework="acme",
                                     suffixes=(".json",), recognizes=lambda p, d: "acme_trainer" in d, read=read)]

    pm = PluginManager()
    for name, plugin in builtin_pm.list_name_plugin():
        pm.register(plugin, name=name, info=builtin_pm.info(name))
    pm.register(Acme(), name="acme")
    assert launch_formats(pm.registry)["acme.trainer"].framework == "acme"
    assert pm.registry.providers[("mlsysim_launch_formats", "acme.trainer")].name == "acme"
    path = tmp_path / "run.json"
    path.write_text('{"acme_trainer": {"model": "llama3-8b", "mbs": 3, "seq": 512}}')
    s = from_launch([path], registry=pm.registry).scenario
    assert (s.model, s.batch_size, s.seq_len, s.dp_size) == ("llama3-8b", 3, 512, 1)


def test_hook_mlsysim_float8_implementations(builtin_pm):
    """A third party's float8 implementation, chosen by name, is timed by the casts it declares: one that
    casts nothing saves torchao tensorwise's cast traffic, by hand (llama3-8b, tp 2: per layer and 2048-token
    micro-batch, inputs M x K 2048 x 17408, weights N x K 109,051,904, gradients M x N 2048 x 25600; forward
    5 B of inputs and weights, backward 5 B of gradients and 2 B of inputs and weights; 32 layers, 2
    micro-batches, at 0.8 of 3.35 TB/s)."""
    from mlsysim_core import search
    from mlsysim_plugins.steptime_hookspecs import Float8Casts

    class Free:
        @hookimpl
        def mlsysim_float8_implementations(self):
            return [Float8Casts(name="test.no-casts", input=0, normed_input=0, weight=0, weight_per="step", grad=0,
                                transpose=0)]
    solver = solver_with(Free(), builtin_pm=builtin_pm)
    assert "test.no-casts" in solver.registry.extensions["mlsysim_float8_implementations"]
    # (without sequence parallelism: torchao tensorwise's float8 tensor parallelism, Float8Casts.tp_gather, casts
    # before the all-gathers under it, which this third party does not declare)
    run = dict(global_batch=8, tp=2, dp=4, memory=False, solver=solver, sequence_parallel=False)
    free = search.time_plan("llama3-8b", "h100", float8="test.no-casts", **run)["components"]
    torchao = search.time_plan("llama3-8b", "h100", float8=True, **run)["components"]
    per_layer = 5 * (2048 * 17408 + 109_051_904) + 5 * 2048 * 25600 + 2 * (2048 * 17408 + 109_051_904)
    assert torchao["memory"] - free["memory"] == pytest.approx(2 * 32 * per_layer / (0.8 * 3.35e12), rel=1e-12)
    assert {k: v for k, v in free.items() if k not in ("memory", "step")} == {
        k: v for k, v in torchao.items() if k not in ("memory", "step")}


def test_hook_mlsysim_step_time_models(builtin_pm):
    """A third party's step-time model, selected by name, ranks the search; its check refuses first."""
    from mlsysim_core import InvalidInputError, search
    from mlsysim_plugins.steptime_hookspecs import StepTimeSpec

    def check(hardware, overrides, calibration):
        if calibration is not None:
            raise InvalidInputError("calibration", calibration, "None: this model has none")

    def prepare(*, model, seq_len, **run):
        return dict(calibrated=False, notes=("test: one second a step",), assumptions={"test.seconds": 1.0},
                    flops_per_token=6 * model.parameters, peak=1e15, idle=None, chunks=1)

    class Flat:
        @hookimpl
        def mlsysim_step_time_models(self):
            return [StepTimeSpec(name="test.flat", check=check, prepare=prepare, components=("all",),
                                 time=lambda timing, **layout: {"all": 1.0 * layout["gas"], "step": 1.0 * layout["gas"]})]
    solver = solver_with(Flat(), builtin_pm=builtin_pm)
    assert set(solver.registry.extensions["mlsysim_step_time_models"]) == {"roofline", "test.flat"}
    found = search.search_plans("llama3-8b", "h100", devices=2, global_batch=4, solver=solver,
                                step_time_model="test.flat", workers=1)
    assert found.fits and all(c.step_time == c.gradient_accumulation_steps for c in found.fits)
    assert "test: one second a step" in found.notes and found.assumptions["test.seconds"] == 1.0
    assert found.components(found.fits[0]) == {"all": 1.0 * found.fits[0].gradient_accumulation_steps,
                                               "step": found.fits[0].step_time}
    with pytest.raises(InvalidInputError, match="calibration"):
        search.search_plans("llama3-8b", "h100", devices=2, global_batch=4, solver=solver,
                            step_time_model="test.flat", calibration=0.5)
    default = search.search_plans("llama3-8b", "h100", devices=2, global_batch=4, solver=solver, workers=1)
    assert default.timing["cal"].calibrated      # the built-in roofline, when none is named


def test_hook_mlsysim_optimizers(builtin_pm):
    class Lion:
        @hookimpl
        def mlsysim_optimizers(self):
            def state(plan, placement, options):
                return [MemoryTerm(component=OPTIMIZER_STATE, label="master + momentum",
                                   nbytes=placement.trainable_parameters_per_rank * 8 / placement.optimizer_state_shards)]
            return [OptimizerSpec(name="test.lion", state_terms=state)]
    solver = solver_with(Lion(), builtin_pm=builtin_pm)
    assert base(solver, optimizer="test.lion").optimizer_state == 8 * P
    assert base(solver, optimizer="test.lion", dp_size=4, zero_stage=1).optimizer_state == 2 * P


def test_hook_mlsysim_checkpointing_strategies(builtin_pm):
    class Offload:
        @hookimpl
        def mlsysim_checkpointing_strategies(self):
            def acts(plan, placement, options):
                per_layer = 34 * plan.seq_len * plan.microbatch * plan.hidden_dim * plan.bytes_per_value / 2
                return [MemoryTerm(component=ACTIVATIONS, label="on device", nbytes=per_layer),
                        MemoryTerm(component=ACTIVATIONS, label="on host", tier=HOST,
                                   nbytes=(placement.layers_per_stage - 1) * per_layer)]
            return [CheckpointingSpec(name="test.offload", activation_terms=acts)]
    r = base(solver_with(Offload(), builtin_pm=builtin_pm), activation_checkpointing="test.offload")
    assert r.activations == 34 * 100 * 4 * 1000          # one layer on the device
    assert r.host_memory == 9 * 34 * 100 * 4 * 1000      # nine on the host
    assert r.total_memory == 2 * P + 2 * P + 12 * P + r.activations + r.communication_buffers


def test_hook_mlsysim_sharding_rules(builtin_pm):
    class Fsdp:
        @hookimpl
        def mlsysim_sharding_rules(self):
            def apply(plan, options):
                d = plan.dp_size
                return ShardingEffect(weight_shards=d, gradient_shards=d, optimizer_state_shards=d,
                                      notes=("test: fully sharded",))
            return [ShardingRuleSpec(name="test.fsdp", axis="dp", apply=apply)]
    r = base(solver_with(Fsdp(), builtin_pm=builtin_pm), dp_size=8, data_parallel="test.fsdp")
    assert (r.weights, r.gradients, r.optimizer_state) == (P / 4, P / 4, 1.5 * P)
    assert r.constraint_trace[-1] == "test: fully sharded" and r.selected["dp_rule"] == "test.fsdp"


def test_hook_mlsysim_profiles(builtin_pm):
    class Lean:
        @hookimpl
        def mlsysim_profiles(self):
            return [ProfileSpec(name="test.lean", component_plugins=("model_states",))]
    r = base(solver_with(Lean(), builtin_pm=builtin_pm), profile="test.lean")
    assert r.communication_buffers == 0 and r.profile == "test.lean"   # no gradient bucket plugin


def _component_plugin(hook, component, nbytes):
    def impl(self, plan, placement):
        return [MemoryTerm(component=component, label="extra", nbytes=nbytes)]
    impl.__name__ = hook
    return type("Extra", (), {hook: hookimpl(impl)})()


@pytest.mark.parametrize("hook,component", [
    ("mlsysim_weight_terms", WEIGHTS), ("mlsysim_gradient_terms", GRADIENTS),
    ("mlsysim_optimizer_state_terms", OPTIMIZER_STATE), ("mlsysim_activation_terms", ACTIVATIONS)])
def test_component_hooks_add_only_when_included(builtin_pm, hook, component):
    solver = solver_with(_component_plugin(hook, component, 12345), builtin_pm=builtin_pm)
    plain, included = base(solver), base(solver, include_plugins=["test_plugin"])
    assert getattr(included, component) - getattr(plain, component) == 12345
    bucket = 0.05 * 12345 if component == GRADIENTS else 0   # the 5 % gradient bucket grows too
    assert included.total_memory - plain.total_memory == pytest.approx(12345 + bucket)
    (extra,) = [t for t in included.terms if t.source == "test_plugin"]
    assert extra.label == "extra" and extra.component == component


def test_hook_mlsysim_weight_terms(builtin_pm):
    class Ema:   # an exponential moving average of the weights, fp32
        @hookimpl
        def mlsysim_weight_terms(self, placement):       # opt-in: fewer arguments than the spec
            return [MemoryTerm(component=WEIGHTS, label="EMA copy (fp32)",
                               nbytes=placement.parameters_per_rank * 4)]
    r = base(solver_with(Ema(), builtin_pm=builtin_pm), include_plugins=["test_plugin"])
    assert r.weights == 2 * P + 4 * P


def test_hook_mlsysim_gradient_terms(builtin_pm):
    class MainGrad:   # Megatron's fp32 main_grad buffer
        @hookimpl
        def mlsysim_gradient_terms(self, plan, placement):
            return [MemoryTerm(component=GRADIENTS, label="fp32 main_grad",
                               nbytes=placement.trainable_parameters_per_rank * 4 / placement.gradient_shards)]
    r = base(solver_with(MainGrad(), builtin_pm=builtin_pm), include_plugins=["test_plugin"], dp_size=2,
             zero_stage=2)
    assert r.gradients == P + 2 * P


def test_hook_mlsysim_optimizer_state_terms(builtin_pm):
    class StepBuffer:
        @hookimpl
        def mlsysim_optimizer_state_terms(self, placement):
            return [MemoryTerm(component=OPTIMIZER_STATE, label="step transient", nbytes=1000)]
    r = base(solver_with(StepBuffer(), builtin_pm=builtin_pm), include_plugins=["test_plugin"])
    assert r.optimizer_state == 12 * P + 1000


def test_hook_mlsysim_activation_terms(builtin_pm):
    class Logits:
        @hookimpl
        def mlsysim_activation_terms(self, plan):
            return [MemoryTerm(component=ACTIVATIONS, label="fp32 logits",
                               nbytes=plan.seq_len * plan.microbatch * 32000 * 4)]
    r = base(solver_with(Logits(), builtin_pm=builtin_pm), include_plugins=["test_plugin"])
    assert r.activations == 10 * 34 * 100 * 4 * 1000 + 100 * 4 * 32000 * 4


def test_hook_mlsysim_communication_buffer_terms(builtin_pm):
    class Nccl:
        @hookimpl
        def mlsysim_communication_buffer_terms(self, model_states):
            return [MemoryTerm(component=COMMUNICATION_BUFFERS, label="all-gather",
                               nbytes=model_states["weights"] / 10)]
    r = base(solver_with(Nccl(), builtin_pm=builtin_pm), include_plugins=["test_plugin"])
    assert r.communication_buffers == pytest.approx(0.05 * 2 * P + 0.2 * P)


def test_hook_implementation_with_unknown_argument_is_rejected(builtin_pm):
    class Bad:
        @hookimpl
        def mlsysim_weight_terms(self, plan, colour):
            return []
    with pytest.raises(mlsysim_core.PluginContractError, match="colour"):
        solver_with(Bad(), builtin_pm=builtin_pm)


def test_a_peak_profile_takes_the_largest_phase(builtin_pm):
    """combine="peak": the total is the phase with the most live bytes, and the components
    are what is alive then (the reference profile sums every term instead)."""
    class Peak:
        @hookimpl
        def mlsysim_profiles(self):
            return [ProfileSpec(name="test.peak", component_plugins=("model_states", "communication_buffers"),
                                combine="peak")]
    solver = solver_with(Peak(), builtin_pm=builtin_pm)
    summed, peak = base(solver), base(solver, profile="test.peak")
    acts, bucket = 10 * 34 * 100 * 4 * 1000, 0.05 * 2 * P
    # forward: weights + optimizer state + activations; backward: + gradients + bucket;
    # optimizer step: weights + gradients + optimizer state (activations are gone)
    assert summed.phase_totals == {"forward": 2 * P + 12 * P + acts,
                                   "backward": 2 * P + 2 * P + 12 * P + acts + bucket,
                                   "backward_end": 2 * P + 2 * P + 12 * P + bucket,
                                   "optimizer_step": 2 * P + 2 * P + 12 * P}
    assert summed.peak_phase is None and summed.total_memory == 16 * P + acts + bucket
    assert peak.peak_phase == "backward" and peak.total_memory == pytest.approx(16 * P + acts + bucket)
    # with the largest activations gone (full recompute is small) backward still peaks; with
    # no bucket and optimizer state dominating, the step phase ties backward minus activations
    r = base(solver, profile="test.peak", communication_buffer_fraction=0.0, activation_checkpointing="full")
    assert r.peak_phase == "backward" and r.activations == 10 * 2 * 100 * 4 * 1000
    assert r.total_memory == r.weights + r.gradients + r.optimizer_state + r.activations + r.communication_buffers


def test_a_dp_rule_can_see_the_model_parallel_split(builtin_pm):
    seen = []

    class Hpz:
        @hookimpl
        def mlsysim_sharding_rules(self):
            def apply(plan, options, split):
                seen.append(split)
                d = plan.dp_size
                extra = MemoryTerm(component=COMMUNICATION_BUFFERS, label="secondary copy",
                                   nbytes=split.parameters_per_rank * plan.bytes_per_value / 4)
                return ShardingEffect(weight_shards=d, gradient_shards=d, optimizer_state_shards=d,
                                      buffer_terms=[extra])
            return [ShardingRuleSpec(name="test.hpz", axis="dp", apply=apply)]
    r = base(solver_with(Hpz(), builtin_pm=builtin_pm), tp_size=2, pp_size=5, dp_size=8, data_parallel="test.hpz")
    (split,) = seen
    assert (split.parameter_shards, split.parameters_per_rank, split.layers_per_stage) == (10, P / 10, 2)
    assert [t.nbytes for t in r.terms_of(COMMUNICATION_BUFFERS) if t.label == "secondary copy"] == [P / 10 * 2 / 4]


def test_hook_mlsysim_runtime_overhead_terms(builtin_pm):
    """A runtime-overhead hook sees the peak of the other components (``allocated``); its
    terms are part of the total and kept apart in ``runtime_overheads``."""
    seen = []

    class Context:
        @hookimpl
        def mlsysim_profiles(self):
            return [ProfileSpec(name="test.ctx", component_plugins=("model_states", "test-ctx"), combine="peak")]

        @hookimpl
        def mlsysim_runtime_overhead_terms(self, plan, placement, allocated):
            seen.append(allocated)
            return [MemoryTerm(component="runtime_overheads", label="context", nbytes=2**29),
                    MemoryTerm(component="runtime_overheads", label="reserve", nbytes=allocated / 10)]
    solver = solver_with(Context(), builtin_pm=builtin_pm, name="test-ctx")
    r = base(solver, profile="test.ctx")
    assert seen == [r.weights + r.gradients + r.optimizer_state + r.activations + r.communication_buffers]
    assert r.runtime_overheads == 2**29 + seen[0] / 10
    assert r.total_memory == seen[0] + r.runtime_overheads
    assert r.allocated_memory == seen[0]
    # the reference profile does not call it
    assert base(solver).runtime_overheads == 0 and len(seen) == 1


def test_hook_mlsysim_addhooks():
    """A plugin adds hook specs of its own; another plugin implements them, before or after
    it is registered (pluggy checks pending implementations when the specs arrive)."""
    import types
    import pluggy
    from mlsysim_core.manager import PluginManager

    spec = types.ModuleType("myorg_specs")
    marker = pluggy.HookspecMarker("mlsysim")

    @marker
    def myorg_widgets():
        """Register widgets."""
    spec.myorg_widgets = myorg_widgets

    class Early:
        @mlsysim_core.hookimpl
        def myorg_widgets(self):
            return ["early"]

    class Owner:
        @mlsysim_core.hookimpl
        def mlsysim_addhooks(self, pluginmanager):
            pluginmanager.add_hookspecs(spec)

    class Late:
        @mlsysim_core.hookimpl
        def myorg_widgets(self):
            return ["late"]

    pm = PluginManager()
    pm.register(Early(), "early")
    pm.register(Owner(), "owner")
    pm.register(Late(), "late")
    assert sorted(w for ws in pm.hook.myorg_widgets() for w in ws) == ["early", "late"]
    pm.check()     # no pending implementation: the hook has its spec


@pytest.mark.parametrize(("name", "home"), [("LaunchFormatSpec", "mlsysim_plugins.launch"),
                                           ("StepTimeSpec", "mlsysim_plugins.steptime_hookspecs"),
                                           ("Collective", "mlsysim_plugins.steptime_hookspecs")])
def test_moved_specs_still_import_with_a_warning(name, home):
    """Plugin API 3.1: these specs are their plugins'; the core's old names still work, and warn."""
    import importlib
    import warnings
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = getattr(mlsysim_core, name)
    assert old is getattr(importlib.import_module(home), name)
    assert [str(w.message) for w in caught] == [
        f"mlsysim_core.{name} moved to {home} (plugin API 3.1); import it from there"]
    assert all(w.category is DeprecationWarning for w in caught)
    assert name not in mlsysim_core.__all__


def test_a_plugins_own_registration_hook_is_collected_and_checked():
    """A hook-spec module's REGISTRATION_HOOK_TYPES: items collected into registry.extensions, each
    checked to be the declared type (the error names the plugin and the hook), providers recorded."""
    import types
    import attrs
    import pluggy
    from mlsysim_core.manager import PluginManager

    @attrs.frozen
    class Widget:
        name: str

    specs = types.ModuleType("myorg_widget_specs")

    @pluggy.HookspecMarker("mlsysim")
    def myorg_widgets():
        """Register widgets."""
    specs.myorg_widgets, specs.REGISTRATION_HOOK_TYPES = myorg_widgets, {"myorg_widgets": Widget}

    class Owner:
        @mlsysim_core.hookimpl
        def mlsysim_addhooks(self, pluginmanager):
            pluginmanager.add_hookspecs(specs)

    class Good:
        @mlsysim_core.hookimpl
        def myorg_widgets(self):
            return [Widget("myorg.gear")]

    class Bad:
        @mlsysim_core.hookimpl
        def myorg_widgets(self):
            return ["not a widget"]

    pm = PluginManager()
    for plugin, name in ((Owner(), "owner"), (Good(), "good")):
        pm.register(plugin, name)
    assert pm.registry.extensions["myorg_widgets"] == {"myorg.gear": Widget("myorg.gear")}
    assert pm.registry.providers[("myorg_widgets", "myorg.gear")].name == "good"
    pm.register(Bad(), "bad")
    with pytest.raises(mlsysim_core.PluginContractError, match=r"plugin 'bad' .*hook myorg_widgets returned str "
                                                               r"'not a widget'; expected Widget"):
        pm.registry
