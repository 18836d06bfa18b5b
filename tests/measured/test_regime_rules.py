"""A regime declares what it needs of its data-parallel rule (``Regime.requires``), and a rule declares what it
does (``extensions["measured.provides"]``): FSDP's mixed-precision regimes (fp32 shards gathered in bf16) under
DDP or ZeRO describe a run no such rule makes, and are refused by name, as contradicting inputs (issues 24, 26)."""

from pathlib import Path

import attrs
import pytest

from mlsysim_core import LayoutError, TrainingMemoryModel, hookimpl
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_core.manager import PluginManager, get_plugin_manager
from mlsysim_plugins.measured.regimes import FSDP_MIXED_PRECISION, MEGATRON_MAIN_GRAD, PROVIDES, REGIMES

MODEL, GPU = "llama3-8b", "h100"
FSDP_REGIMES = ("fsdp-bf16", "fsdp-bf16-stored", "fsdp-bf16-reduce-bf16", "fsdp-fp16-reduce-fp16", "fsdp-fp16-stored")
FSDP_RULES = ("fsdp", "fsdp-grad-op", "hsdp")
MEASURED = TrainingMemoryModel("measured")


def _solver(*plugins):
    pm = PluginManager.from_environment()
    for name, plugin in plugins:
        pm.register(plugin, name)
    return TrainingMemoryModel("measured", plugin_manager=pm)


def _solve(solver, regime, rule, dp=8, **kw):
    return solver.solve(MODEL, GPU, dp, 2048, dp_size=dp, data_parallel=rule, regime=regime,
                        precision=REGIMES[regime].precision if isinstance(regime, str) and regime in REGIMES else "bf16",
                        **kw)


def test_the_built_in_declarations():
    """The FSDP regimes need FSDP's mixed precision; the rules that declare it are FSDP's (and no other built-in);
    the main-grad regime (every regime with a main-grad buffer) needs Megatron-Core's rules; every other built-in
    regime needs nothing."""
    assert {n for n, r in REGIMES.items() if r.requires} == {*FSDP_REGIMES, "mixed-bf16-main-grad"}
    assert all(REGIMES[n].requires == (FSDP_MIXED_PRECISION,) for n in FSDP_REGIMES)
    assert {n for n, r in REGIMES.items() if r.main_grad} == {"mixed-bf16-main-grad"}
    assert REGIMES["mixed-bf16-main-grad"].requires == (MEGATRON_MAIN_GRAD,)
    rules = get_plugin_manager().registry.sharding_rules
    assert sorted(n for n, s in rules.items() if FSDP_MIXED_PRECISION in (s.extensions.get(PROVIDES) or ())) \
        == sorted(FSDP_RULES)
    assert sorted(n for n, s in rules.items() if MEGATRON_MAIN_GRAD in (s.extensions.get(PROVIDES) or ())) \
        == ["mcore-ddp", "mcore-distopt"]


def test_fsdp_bf16_under_the_default_ddp_rule_is_refused_naming_the_regime_the_rule_and_what_is_allowed():
    """QA's case: `estimate -m llama3-8b --regime fsdp-bf16 --dp 8` ran under zero0 and printed "fp32 sharded
    parameters"."""
    with pytest.raises(InvalidInputError) as err:
        MEASURED.solve(MODEL, GPU, 8, 2048, dp_size=8, regime="fsdp-bf16", precision="bf16")
    e = err.value
    assert not isinstance(e, LayoutError)      # (no other data-parallel size makes the pair possible)
    assert (e.parameter, e.value) == ("data_parallel", "zero0")
    assert str(e) == (
        "data_parallel='zero0' is not allowed: a data-parallel rule that declares 'fsdp-mixed-precision' under "
        "regime 'fsdp-bf16' (installed: fsdp, fsdp-grad-op, hsdp), or a regime that needs no such rule (regime "
        "'fsdp-bf16' needs a rule that declares 'fsdp-mixed-precision': one that shards the stored parameters and "
        "all-gathers them cast to a param_dtype of their own, FSDP's MixedPrecisionPolicy; rule 'zero0' declares "
        "none, and dp x cp = 8)")


@pytest.mark.parametrize("regime", FSDP_REGIMES)
@pytest.mark.parametrize("rule", ("zero0", "zero1", "zero2", "zero3", "mcore-ddp", "mcore-distopt"))
def test_every_fsdp_regime_under_every_other_data_parallel_rule_is_refused(regime, rule):
    with pytest.raises(InvalidInputError, match=rf"data_parallel='{rule}' is not allowed: .*regime '{regime}' needs a rule "
                                          rf"that declares 'fsdp-mixed-precision'"):
        _solve(MEASURED, regime, rule)


@pytest.mark.parametrize("regime", FSDP_REGIMES)
@pytest.mark.parametrize("rule", FSDP_RULES)
def test_every_fsdp_regime_under_an_fsdp_rule_solves_as_the_same_regime_declaring_nothing(regime, rule):
    """The declaration refuses; it never changes a number: the built-in pair and a copy of the regime that declares
    nothing (a third party's, before this) give the same bytes, term by term."""
    undeclared = attrs.evolve(REGIMES[regime], name=f"myorg.{regime}", requires=())
    a, b = _solve(MEASURED, regime, rule), _solve(MEASURED, undeclared, rule)
    assert a.total_memory == b.total_memory
    assert [(t.component, t.label, t.nbytes) for t in a.terms] \
        == [(t.component, t.label.replace("myorg.", ""), t.nbytes) for t in b.terms]


def test_one_data_parallel_rank_takes_any_rule():
    """dp x cp = 1: no rule shards or communicates (a search enumerates that layout once, as zero0), so the regime
    solves under zero0, as before; with cp > 1 the rule shards again, and is asked."""
    assert _solve(MEASURED, "fsdp-bf16", "zero0", dp=1).total_memory > 0
    with pytest.raises(InvalidInputError, match=r"data_parallel='zero0' .*dp x cp = 2\)"):
        MEASURED.solve(MODEL, GPU, 1, 4096, cp_size=2, regime="fsdp-bf16", precision="bf16")


def test_a_regime_that_declares_nothing_is_accepted_under_any_rule():
    """A third party's regime without ``requires`` keeps today's behaviour."""
    class Plugin:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["fsdp-bf16"], name="myorg.fsdp-like", requires=())]
    solver = _solver(("myorg_regimes", Plugin()))
    assert _solve(solver, "myorg.fsdp-like", "zero1").details["regime"] == "myorg.fsdp-like"


def test_a_third_party_regime_with_the_declaration_is_refused_the_same_way():
    class Plugin:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["bf16"], name="myorg.sharded-bf16", requires=(FSDP_MIXED_PRECISION,))]
    solver = _solver(("myorg_regimes", Plugin()))
    with pytest.raises(InvalidInputError, match=r"data_parallel='zero2' is not allowed: a data-parallel rule that declares "
                                          r"'fsdp-mixed-precision' under regime 'myorg.sharded-bf16' \(installed: "
                                          r"fsdp, fsdp-grad-op, hsdp\)"):
        _solve(solver, "myorg.sharded-bf16", "zero2")
    assert _solve(solver, "myorg.sharded-bf16", "fsdp").details["regime"] == "myorg.sharded-bf16"


def test_a_regime_may_require_megatron_cores_rules():
    """Megatron-Core's rules declare the main-grad buffer they lay out: a regime that requires it (a third party's
    here, as the built-in mixed-bf16-main-grad does) runs under mcore-distopt and is refused under ZeRO-1, whose
    main-grad copy is sharded with the optimizer state."""
    class Plugin:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["mixed-bf16-main-grad"], name="myorg.megatron",
                                 requires=(MEGATRON_MAIN_GRAD,))]
    solver = _solver(("myorg_regimes", Plugin()))
    mine, builtin = _solve(solver, "myorg.megatron", "mcore-distopt"), _solve(solver, "mixed-bf16-main-grad",
                                                                               "mcore-distopt")
    assert mine.total_memory == builtin.total_memory
    with pytest.raises(InvalidInputError, match=r"data_parallel='zero1' is not allowed: a data-parallel rule that declares "
                                          r"'megatron-main-grad' under regime 'myorg.megatron' \(installed: mcore-ddp, "
                                          r"mcore-distopt\).*one that lays out Megatron-Core's main-grad buffer"):
        _solve(solver, "myorg.megatron", "zero1")


# llama3-8b on 8 H100s, global batch 8, seq 2048, dp 8, mixed-bf16-main-grad, the defaults otherwise: total bytes
# at 446984e (before the regime required Megatron-Core's rules), recorded by hand
MAIN_GRAD_BEFORE = {"mcore-distopt": 77_071_322_903.2, "mcore-ddp": 186_358_886_111.8}


@pytest.mark.parametrize("rule", ["zero0", "zero1", "zero2", "zero3", "fsdp", "hsdp"])
def test_the_main_grad_regime_under_a_rule_without_megatrons_buffer_is_refused(rule):
    with pytest.raises(InvalidInputError) as err:
        _solve(MEASURED, "mixed-bf16-main-grad", rule)
    e = err.value
    assert type(e) is InvalidInputError and (e.parameter, e.value) == ("data_parallel", rule)
    assert str(e).startswith(
        f"data_parallel={rule!r} is not allowed: a data-parallel rule that declares 'megatron-main-grad' under regime "
        "'mixed-bf16-main-grad' (installed: mcore-ddp, mcore-distopt), or a regime that needs no such rule (regime "
        "'mixed-bf16-main-grad' needs a rule that declares 'megatron-main-grad': one that lays out Megatron-Core's "
        f"main-grad buffer, whole on every data-parallel rank; rule {rule!r} declares ")
    assert str(e).endswith(", and dp x cp = 8)")


@pytest.mark.parametrize("rule", ["mcore-distopt", "mcore-ddp"])
def test_the_main_grad_regime_under_megatrons_rules_is_unchanged(rule):
    """The requirement changes no byte where it is met: the totals recorded before it, and every term the same as
    under a copy of the regime that declares nothing."""
    builtin = _solve(MEASURED, "mixed-bf16-main-grad", rule)
    assert builtin.total_memory == MAIN_GRAD_BEFORE[rule]
    anywhere = _solve(MEASURED, attrs.evolve(REGIMES["mixed-bf16-main-grad"], requires=()), rule)
    assert [(t.label, t.nbytes, t.phases) for t in builtin.terms] == [(t.label, t.nbytes, t.phases) for t in anywhere.terms]
    # one data-parallel rank: any rule, as before (zero1 there is the unsharded run)
    assert _solve(MEASURED, "mixed-bf16-main-grad", "zero1", dp=1).total_memory > 0


def test_a_capability_no_rule_declares_is_refused_naming_none_installed():
    class Plugin:
        @hookimpl
        def mlsysim_measured_regimes(self):
            return [attrs.evolve(REGIMES["bf16"], name="myorg.needs-magic", requires=("myorg.magic",))]
    with pytest.raises(InvalidInputError, match=r"declares 'myorg.magic' under regime 'myorg.needs-magic' \(installed: "
                                          r"none\).*needs a rule that declares 'myorg.magic'; rule 'fsdp' declares "
                                          r"'fsdp-mixed-precision'"):
        _solve(_solver(("myorg_regimes", Plugin())), "myorg.needs-magic", "fsdp")


def test_a_third_party_rule_that_declares_the_capability_serves_whatever_its_name():
    """The regime asks what the rule declares, never its name: zero3's sharding registered under another name with
    FSDP's declaration takes fsdp-bf16; without it, it is refused."""
    zero3 = get_plugin_manager().registry.sharding_rules["zero3"]

    class Rules:
        @hookimpl
        def mlsysim_sharding_rules(self):
            return [attrs.evolve(zero3, name="myorg.casting-zero3",
                                 extensions={**zero3.extensions, PROVIDES: (FSDP_MIXED_PRECISION,)}),
                    attrs.evolve(zero3, name="myorg.plain-zero3")]
    solver = _solver(("myorg_rules", Rules()))
    assert _solve(solver, "fsdp-bf16", "myorg.casting-zero3").total_memory > 0
    with pytest.raises(InvalidInputError, match=r"data_parallel='myorg.plain-zero3' .*\(installed: fsdp, fsdp-grad-op, "
                                          r"hsdp, myorg.casting-zero3\)"):
        _solve(solver, "fsdp-bf16", "myorg.plain-zero3")


@pytest.mark.parametrize("provides", ["fsdp-mixed-precision-ish", ("fsdp-mixed-precision", 1)])
def test_a_rules_declaration_that_is_not_a_tuple_of_names_is_its_plugins_error(provides):
    """A bare string would match a capability by substring: refused, naming the plugin and the hook."""
    from mlsysim_core.errors import PluginContractError
    fsdp = get_plugin_manager().registry.sharding_rules["fsdp"]

    class Rules:
        @hookimpl
        def mlsysim_sharding_rules(self):
            return [attrs.evolve(fsdp, name="myorg.fsdp", extensions={**fsdp.extensions, PROVIDES: provides})]
    with pytest.raises(PluginContractError, match=r"plugin 'myorg_rules' .*declares sharding rule 'myorg.fsdp' with "
                                                  r"extensions\['measured.provides'\]="):
        _solve(_solver(("myorg_rules", Rules())), "fsdp-bf16", "myorg.fsdp")


@pytest.mark.parametrize("requires", ["fsdp-mixed-precision", ("",), (1,), ["fsdp-mixed-precision"]])
def test_requires_must_be_a_tuple_of_capability_names(requires):
    bad = attrs.evolve(REGIMES["bf16"], name="myorg.bad", requires=requires)
    with pytest.raises(InvalidInputTypeError, match=r"regime='myorg.bad' is not allowed: requires: a tuple of "
                                                    r"capability names .*requires="):
        MEASURED.solve(MODEL, GPU, 8, 2048, regime=bad)


def test_the_search_leaves_out_the_refused_pairs():
    """A search in fsdp-bf16 ranks FSDP layouts (and one-rank layouts, as zero0) only: no ZeRO layout with dp > 1."""
    from mlsysim_core.search import search_plans
    found = search_plans(MODEL, GPU, devices=8, global_batch=8, seq_len=2048, precision="bf16", profile="measured",
                         regime="fsdp-bf16", checkpointing=["full"], data_parallel=["zero1", "fsdp"])
    assert found.fits
    assert {c.data_parallel for c in found.fits if c.dp * c.cp > 1} == {"fsdp"}
    assert {c.data_parallel for c in found.fits if c.dp * c.cp == 1} == {"zero0"}


def test_the_torchtitan_reader_reads_a_replicate_only_run_as_torchtitan_runs_it(tmp_path):
    """torchtitan without FSDP (DDP: data_parallel_replicate_degree only) does not apply its MixedPrecisionPolicy:
    maybe_enable_amp autocasts in mixed_precision_param, or, with tp or pp, disables mixed precision; a cp run is an
    FSDP run (fsdp_enabled: dp_shard or cp). No reading pairs fsdp-bf16 with a rule that refuses it."""
    from mlsysim_core.scenario import Scenario
    base = (Path(__file__).parents[1] / "data/launch/torchtitan/llama3/llama3_8b.toml").read_text()

    def read(gpus, **degrees):
        text = base
        for key, value in degrees.items():
            text = text.replace(f"{key} = {'-1' if key == 'data_parallel_shard_degree' else '1'}\n",
                                f"{key} = {value}\n")
        path = tmp_path / "run.toml"
        path.write_text(text)
        sc = Scenario.from_launch(path, gpus=gpus, hardware="h100").scenario
        return sc.profile_options.get("regime"), sc.data_parallel, sc.zero_stage

    assert read(8, data_parallel_replicate_degree=8, data_parallel_shard_degree=1) == ("amp-bf16", None, 0)
    assert read(16, data_parallel_replicate_degree=8, data_parallel_shard_degree=1, tensor_parallel_degree=2) \
        == ("fp32", None, 0)
    assert read(2, data_parallel_shard_degree=1, context_parallel_degree=2) == ("fsdp-bf16", "fsdp", 0)
    assert read(8) == ("fsdp-bf16", "fsdp", 0)


def test_fit_devices_says_the_contradiction_instead_of_nothing_fits():
    """fewest_devices skips a data-parallel size a rule refuses (a LayoutError) and grows dp: here every dp > 1 is
    refused alike, so it says why."""
    from mlsysim_core.inverse import fewest_devices
    with pytest.raises(InvalidInputError, match=r"data_parallel='zero0' is not allowed: .*regime 'fsdp-bf16'"):
        fewest_devices(MODEL, GPU, 64, solver=MEASURED, regime="fsdp-bf16", precision="bf16")
    fits = fewest_devices(MODEL, GPU, 64, solver=MEASURED, regime="fsdp-bf16", precision="bf16", data_parallel="fsdp")
    assert fits.value == 16 and fits.details["dp"] == 16


def test_the_cli_refuses_the_pair_qa_found(capsys):
    from mlsysim_core.cli import main
    assert main(["estimate", "-m", MODEL, "--regime", "fsdp-bf16", "--dp", "8"]) == 2
    err = capsys.readouterr().err
    assert "data_parallel='zero0' is not allowed" in err and "regime 'fsdp-bf16'" in err
