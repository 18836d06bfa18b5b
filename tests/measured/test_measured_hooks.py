"""The measured profile's own hooks, used as a third party would: a regime, a pipeline
schedule and sharding-rule buffers added by a plugin registered next to the built-ins,
selected by name, priced by the profile; conflicts and what is not modelled said by name.
(Architecture families and attention kernels: tests/measured/test_families_kernels.py.)"""

import attrs
import pytest

from mlsysim_core import (COMMUNICATION_BUFFERS, FORWARD, MemoryTerm, NotModelledError, PluginConflictError,
                          ShardingEffect, ShardingRuleSpec, TrainingMemoryModel, hookimpl)
from mlsysim_core.manager import PluginManager
from mlsysim_plugins.measured.regimes import REGIMES
from mlsysim_plugins.measured.schedules import PipelineSchedule

MODEL, GPU = "llama3-8b", "h100"


def _solver(*plugins):
    pm = PluginManager.from_environment()
    for name, plugin in plugins:
        pm.register(plugin, name)
    return TrainingMemoryModel("measured", plugin_manager=pm)


class FP8Master:
    """A regime that is bf16 in every byte but named otherwise: priced exactly as bf16."""

    @hookimpl
    def mlsysim_measured_regimes(self):
        return [attrs.evolve(REGIMES["bf16"], name="myorg.bf16-copy", description="bf16, renamed")]


def test_a_registered_regime_is_selected_by_name_and_priced_by_its_bytes():
    solver = _solver(("myorg_regimes", FP8Master()))
    mine = solver.solve(MODEL, GPU, 8, 2048, regime="myorg.bf16-copy")
    bf16 = solver.solve(MODEL, GPU, 8, 2048, regime="bf16")
    assert mine.total_memory == bf16.total_memory and mine.details["regime"] == "myorg.bf16-copy"


def test_two_plugins_registering_one_regime_name_is_an_error_naming_both():
    class Dup:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["bf16"], description="mine")]
    with pytest.raises(PluginConflictError, match=r"'bf16' is provided by more than one plugin: plugin "
                                                  r"'measured_regimes' .*plugin 'myorg_dup'.*MLSYSIM_DISABLED_PLUGINS="
                                                  r"myorg_dup"):
        _solver(("myorg_dup", Dup())).solve(MODEL, GPU, 8, 2048, regime="bf16")


@pytest.mark.parametrize("field,value", [("compute", 1), ("residual", 1)])
def test_a_regime_outside_the_modelled_dtype_layouts_is_refused_by_name(field, value):
    """An 8-bit compute regime, hand-built or registered, is not costed as bf16."""
    fp8 = attrs.evolve(REGIMES["bf16"], name="fp8-compute", **{field: value})
    with pytest.raises(NotModelledError, match=rf"regime='fp8-compute' .*{field}={value} B"):
        TrainingMemoryModel("measured").solve(MODEL, GPU, 8, 2048, regime=fp8)

    class Plugin:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [fp8]
    with pytest.raises(NotModelledError, match="regime='fp8-compute'"):
        _solver(("myorg_fp8", Plugin())).solve(MODEL, GPU, 8, 2048, regime="fp8-compute")


class AllForward:
    """A toy schedule: every stage holds all m micro-batches (as GPipe), under its own name."""

    @hookimpl
    def mlsysim_measured_pipeline_schedules(self):
        return [PipelineSchedule(name="myorg.all-forward", description="every forward first",
                                 in_flight=lambda p, stage, m, v: m)]


def test_a_registered_pipeline_schedule_decides_the_micro_batches_in_flight():
    solver = _solver(("myorg_schedules", AllForward()))
    layout = dict(pp_size=4, dp_size=2, gradient_accumulation_steps=8)
    mine = solver.solve(MODEL, GPU, 16, 2048, pipeline_schedule="myorg.all-forward", **layout)
    gpipe = solver.solve(MODEL, GPU, 16, 2048, pipeline_schedule="gpipe", **layout)
    assert [r.in_flight for r in mine.ranks] == [8, 8, 8] == [r.in_flight for r in gpipe.ranks]
    assert mine.total_memory == gpipe.total_memory
    with pytest.raises(Exception, match="virtual_stages"):      # not a chunked schedule
        solver.solve(MODEL, GPU, 16, 2048, pipeline_schedule="myorg.all-forward", virtual_stages=2, **layout)


class Variant:
    """A ZeRO-3 variant whose measured buffers are its own: one extra gathered copy of the
    layer (a toy prefetch), priced in the regime's bytes, replacing its reference estimate."""

    @staticmethod
    def apply(plan, options):
        d = plan.dp_size
        reference = MemoryTerm(component=COMMUNICATION_BUFFERS, label="reference estimate", nbytes=1e9)
        return ShardingEffect(optimizer_state_shards=d, gradient_shards=d, weight_shards=d,
                              buffer_terms=(reference,))

    @staticmethod
    def measured(plan, placement, options):
        from mlsysim_plugins.measured import buffers
        layer = buffers.layer_parameters(plan) * buffers.gathered_bytes(plan)
        return [*buffers.layer_gather(plan, placement),
                MemoryTerm(component=COMMUNICATION_BUFFERS, label="prefetched next layer", nbytes=layer,
                           phases=(FORWARD,))]

    @hookimpl
    def mlsysim_sharding_rules(self):
        return [ShardingRuleSpec(name="myorg.zero3-prefetch", axis="dp", apply=self.apply,
                                 extensions={"measured.buffer_terms": self.measured})]


def test_a_third_party_zero_variant_owns_its_measured_buffers():
    solver = _solver(("myorg_zero", Variant()))
    kw = dict(dp_size=8, regime="bf16", runtime_overheads=False)
    mine = solver.solve(MODEL, GPU, 8, 2048, data_parallel="myorg.zero3-prefetch", **kw)
    zero3 = solver.solve(MODEL, GPU, 8, 2048, zero_stage=3, **kw)
    buffers = {t.label: t for t in mine.terms if t.component == COMMUNICATION_BUFFERS}
    assert "reference estimate" not in buffers            # the measured buffers replace the effect's
    assert {t.source for t in buffers.values()} == {"myorg_zero"}
    gathered = buffers["all-gathered parameters of one layer"].nbytes
    assert buffers["prefetched next layer"].nbytes == gathered       # bf16: 2 B per layer parameter
    assert mine.phase_totals["forward"] == zero3.phase_totals["forward"] + gathered
    reference = TrainingMemoryModel(plugin_manager=solver.plugin_manager).solve(
        MODEL, GPU, 8, 2048, dp_size=8, data_parallel="myorg.zero3-prefetch")
    assert any(t.label == "reference estimate" for t in reference.terms)     # the reference profile keeps it


def test_the_conformance_kit_checks_plugins_of_the_measured_hooks():
    """A plugin that only registers a regime or a schedule is solved with it, under the
    measured profile; a family needs a model it claims, which the kit asks for by name."""
    from mlsysim_core.testing import check_plugin
    from mlsysim_plugins.measured.families import LLAMA
    for name, plugin in (("myorg_regimes", FP8Master()), ("myorg_schedules", AllForward())):
        pm = PluginManager.from_environment()
        pm.register(plugin, name)
        report = check_plugin(name, plugin_manager=pm, allow_direct_registration=True)
        assert report.ok and report.solves >= 1, report.failures

    class Family:
        @hookimpl
        def mlsysim_measured_architectures(self):
            return [attrs.evolve(LLAMA, name="myorg.llama-like", architectures=("myorg_arch",))]
    pm = PluginManager.from_environment()
    pm.register(Family(), "myorg_family")
    report = check_plugin("myorg_family", plugin_manager=pm, allow_direct_registration=True)
    assert any("no layout to solve it in; give layouts={'mlsysim_measured_architectures'" in f
               for f in report.failures)
    from mlsysim_core import TransformerWorkload
    model = TransformerWorkload(name="mine", parameters=1_100_000_000, layers=22, hidden_dim=2048, heads=32,
                                kv_heads=4, vocab_size=32000, ffn_dim=5632, gated_mlp=True, tied_embeddings=False,
                                architecture="myorg_arch")
    fields = {k: v for k, v in attrs.asdict(model).items() if v is not None}
    report = check_plugin("myorg_family", plugin_manager=pm, allow_direct_registration=True, layouts={
        "mlsysim_measured_architectures": [{"model": fields, "profile": "measured"}]})
    assert report.ok and report.solves == 1, report.failures


def test_a_misspelt_profile_option_is_named_with_the_option_meant():
    from mlsysim_core import InvalidInputTypeError
    with pytest.raises(InvalidInputTypeError, match=r"regim='bf16' is not allowed: a keyword of solve .*did you mean "
                                                    r"'regime'\?"):
        TrainingMemoryModel().solve(MODEL, GPU, 8, regim="bf16")
    with pytest.raises(InvalidInputTypeError, match=r"pipline_schedule=.*did you mean 'pipeline_schedule'\?"):
        TrainingMemoryModel("measured").solve(MODEL, GPU, 8, pipline_schedule="gpipe")
