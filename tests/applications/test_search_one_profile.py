"""Plan search under one profile (issue 13, items 1, 11 and 13 for `search`).

Every row of a search is a standalone solve of that layout under the search's profile and
options; the header and the JSON name the profile (and the CLI's fallback note); a run the
measured profile cannot describe is searched on the reference profile as a whole, never
mixed; layouts that differ only in something that changes nothing are enumerated once.
"""

import io
import itertools
import json

import pytest

from mlsysim_core.errors import LayoutError

from mlsysim_core import (InvalidInputError, OptimizerSpec, TrainingMemoryModel, TransformerWorkload, hookimpl,
                          search)
from mlsysim_core.cli import main
from mlsysim_core.manager import PluginManager

OPTIONS = dict(regime="bf16", optimizer_impl="fused", attention="eager", dropout=0.1, runtime_overheads=False)
SHAPELESS = TransformerWorkload(name="shapeless", parameters=7_000_000_000, layers=32)


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def key(c):
    return (c.tp, c.cp, c.pp, c.dp, c.ep, c.data_parallel, c.checkpointing, c.sequence_parallel, c.microbatch)


def standalone(solver, model, hardware, global_batch, seq_len, c, **kwargs):
    return solver.solve(model, hardware, global_batch, seq_len, activation_checkpointing=c.checkpointing,
                        tp_size=c.tp, pp_size=c.pp, dp_size=c.dp, ep_size=c.ep, cp_size=c.cp,
                        gradient_accumulation_steps=c.gradient_accumulation_steps,
                        sequence_parallel=c.sequence_parallel, data_parallel=c.data_parallel, **kwargs)


def _with_optimizer_without_measured_model(builtin_pm):
    class Plugin:
        @hookimpl
        def mlsysim_optimizers(self):
            return [OptimizerSpec(name="test.reference-only", state_terms=lambda plan, placement, options: [])]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Plugin(), name="test_reference_only")
    return pm


# --- Python: one profile, options passed through, every row a standalone solve -------------

@pytest.mark.long     # a whole search, each row solved again: `pytest --long`, .ci/run
@pytest.mark.parametrize("workers", [1, 2])
def test_every_row_is_a_standalone_solve_under_the_search_profile(solver, workers):
    found = search.search_plans("llama3-8b", "h100", devices=4, global_batch=8, seq_len=1024, solver=solver,
                                profile="measured", workers=workers, **OPTIONS)
    assert found.profile == "measured" and found.profile_note is None and len(found.fits) > 50
    for c in found.fits:
        r = standalone(solver, "llama3-8b", "h100", 8, 1024, c, profile="measured", **OPTIONS)
        assert r.profile == "measured"
        assert c.total_memory == r.total_memory and c.headroom == r.headroom
    plain = search.search_plans("llama3-8b", "h100", devices=4, global_batch=8, seq_len=1024, solver=solver,
                                profile="measured", workers=workers)
    assert {key(c): c.total_memory for c in plain.fits} != {key(c): c.total_memory for c in found.fits}
    assert found.candidates == plain.candidates        # the options change the numbers, not the layouts


def test_profile_defaults_to_the_solvers_and_is_named_everywhere(solver):
    reference = search.search_plans("llama3-8b", "h100", devices=4, global_batch=8, solver=solver)
    assert reference.profile == "reference"       # TrainingMemoryModel() keeps the reference default
    measured = search.search_plans("llama3-8b", "h100", devices=4, global_batch=8, solver=solver,
                                   profile="measured")
    also = search.search_plans("llama3-8b", "h100", devices=4, global_batch=8,
                               solver=TrainingMemoryModel("measured", plugin_manager=solver.plugin_manager))
    assert measured.fits == also.fits and also.profile == "measured"
    for found, name in ((reference, "reference"), (measured, "measured")):
        assert f"profile {name}," in found.table().splitlines()[0]
        assert f"profile {name}," in found.to_html()
        data = json.loads(json.dumps(found.to_dict()))
        assert data["profile"] == name and data["profile_note"] is None
        assert type(data["schema_version"]) is int and data["schema_version"] >= 1
    for c in reference.fits[::41]:
        assert c.total_memory == standalone(solver, "llama3-8b", "h100", 8, 2048, c).total_memory


@pytest.mark.parametrize("kwargs, parameter", [
    (dict(optimizer="no-such-optimizer"), "optimizer"),
    (dict(checkpointing=["bogus"]), "checkpointing"),
    (dict(checkpointing=[]), "checkpointing"),
    (dict(data_parallel="zero1"), "data_parallel"),
    (dict(data_parallel=["zero9"]), "data_parallel"),
    (dict(sequence_parallel=[]), "sequence_parallel"),
    (dict(sequence_parallel=["yes"]), "sequence_parallel"),
    (dict(regime="bf16"), "regime"),                          # a measured option under the reference profile
    (dict(profile="measured", regime="no-such-regime"), "regime"),
    (dict(profile="measured", dropout=1.5), "dropout"),
    (dict(profile="no-such-profile"), "profile"),
])
def test_bad_inputs_raise_before_the_search_instead_of_nothing_fitting(solver, kwargs, parameter):
    with pytest.raises(InvalidInputError) as err:
        search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=solver, **kwargs)
    assert err.value.parameter == parameter


@pytest.mark.parametrize("workers", [1, 2])
def test_a_run_the_measured_profile_cannot_describe_is_raised_never_mixed(builtin_pm, solver, workers):
    with pytest.raises(InvalidInputError) as err:
        search.search_plans(SHAPELESS, "h100", devices=8, global_batch=16, solver=solver, profile="measured",
                            workers=workers)
    assert err.value.parameter.startswith("model.")
    other = TrainingMemoryModel(plugin_manager=_with_optimizer_without_measured_model(builtin_pm))
    with pytest.raises(InvalidInputError) as err:
        search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=other, profile="measured",
                            optimizer="test.reference-only", workers=workers)
    assert err.value.parameter == "optimizer"
    # LoRA passes the one-device check; the layouts it is not modelled for (split by tp, cp or ep)
    # are left out and counted in a note (from a worker's chunk too), never answered by another
    # profile; the data-parallel and pipeline ones are ranked, each as solve answers it alone
    found = search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=solver, profile="measured",
                                lora={"rank": 16}, workers=workers)
    assert found.fits and all(c.tp == c.cp == c.ep == 1 for c in found.fits)
    assert any("the profile cannot describe them: lora:" in n for n in found.notes)
    assert all(c.total_memory == standalone(solver, "llama3-8b", "h100", 16, 2048, c, profile="measured",
                                            lora={"rank": 16}).total_memory for c in found.fits[:20])
    one = search.search_plans("llama3-8b", "h100", devices=1, global_batch=4, solver=solver, profile="measured",
                              lora={"rank": 16})
    assert one.fits and all(c.total_memory == standalone(solver, "llama3-8b", "h100", 4, 2048, c,
                                                         profile="measured", lora={"rank": 16}).total_memory
                            for c in one.fits)


# --- item 11: no duplicate layouts ----------------------------------------------------------

def _sharding_rules():
    """The installed dp rules that declare they are zero0 at one rank (every built-in but zero0)."""
    from mlsysim_core.manager import PluginManager
    return search.unsharded_at_one_rank(PluginManager.from_environment(autoload=False).registry.rules_for_axis("dp"))


SHARDING_DP_RULES = _sharding_rules()


def test_every_builtin_dp_rule_but_zero0_declares_it_is_zero0_at_one_rank():
    assert set(SHARDING_DP_RULES) == {"zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "hsdp", "mcore-distopt",
                                      "mcore-ddp"}


def _effective(tp, cp, dp, rule, sp):
    return ("zero0" if dp * cp == 1 and rule in SHARDING_DP_RULES else rule), (sp and tp > 1)


@pytest.mark.long     # whole searches without the monotone shortcut: `pytest --long`, .ci/run
@pytest.mark.parametrize("profile", ["reference", "measured"])
def test_no_two_rows_are_the_same_layout(solver, profile):
    found = search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, seq_len=1024, solver=solver,
                                profile=profile, assume_monotone=False)
    effective = [(c.tp, c.cp, c.pp, c.dp, c.ep, *_effective(c.tp, c.cp, c.dp, c.data_parallel, c.sequence_parallel),
                  c.checkpointing, c.microbatch) for c in found.fits]
    assert len(effective) == len(set(effective)) == len(found.fits)
    assert not any(c.tp == 1 and c.sequence_parallel for c in found.fits)
    assert not any(c.dp * c.cp == 1 and c.data_parallel != "zero0" for c in found.fits)
    placeable = set()       # the rules that can place this run at all (Megatron's need its main-grad regime)
    for rule in SHARDING_DP_RULES:
        try:
            solver.solve("llama3-8b", "h100", 16, 1024, dp_size=8, data_parallel=rule, profile=profile)
            placeable.add(rule)
        except LayoutError:
            pass
    assert placeable >= {"zero1", "zero2", "zero3", "fsdp"}
    assert {c.data_parallel for c in found.fits if c.dp * c.cp > 1} >= placeable
    # the count reported is the deduplicated count: every layout once, by its effective key
    rules = sorted(solver.registry.rules_for_axis("dp"))
    layouts = set()
    for tp, cp, pp in itertools.product([1, 2, 4, 8], [1, 2, 4, 8], [1, 2, 4, 8]):
        if tp * cp * pp > 8 or 8 % (tp * cp * pp):
            continue
        dp = 8 // (tp * cp * pp)
        for rule, ckpt, sp, mb in itertools.product(rules, ["full", "none", "selective"], [True, False],
                                                     range(1, 16 // dp + 1)):
            if (16 // dp) % mb == 0:
                layouts.add((tp, cp, pp, dp, *_effective(tp, cp, dp, rule, sp), ckpt, mb))
    assert found.candidates == len(layouts)
    # every layout is solved but those of a rule that cannot place the run (refused, never ranked)
    refused = [layout for layout in layouts if layout[4] not in placeable and layout[4] in SHARDING_DP_RULES]
    assert found.solves == len(layouts) - len(refused)


def test_dropped_duplicates_are_truly_the_same_memory(solver):
    for profile in ("reference", "measured"):
        for tp, cp, pp in ((1, 1, 8), (2, 1, 4), (8, 1, 1)):
            base = dict(tp_size=tp, cp_size=cp, pp_size=pp, dp_size=1, gradient_accumulation_steps=4, profile=profile)
            zero0 = solver.solve("llama3-8b", "h100", 8, 1024, data_parallel="zero0", **base).total_memory
            for rule in SHARDING_DP_RULES:
                assert solver.solve("llama3-8b", "h100", 8, 1024, data_parallel=rule, **base).total_memory == zero0
        one = dict(tp_size=1, pp_size=8, gradient_accumulation_steps=4, profile=profile)
        assert solver.solve("llama3-8b", "h100", 8, 1024, sequence_parallel=True, **one).total_memory == \
            solver.solve("llama3-8b", "h100", 8, 1024, sequence_parallel=False, **one).total_memory


def test_restricted_rules_and_flags_keep_one_rank_layouts_and_count_once(solver):
    found = search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=solver,
                                data_parallel=["zero3", "fsdp", "zero3"], sequence_parallel=[False, False],
                                checkpointing=["full", "full"])
    one_rank = [c for c in found.fits if c.dp * c.cp == 1]
    assert one_rank and {c.data_parallel for c in one_rank} == {"zero0"}    # dp x cp = 1 layouts stay, as zero0
    assert {c.data_parallel for c in found.fits if c.dp * c.cp > 1} == {"zero3", "fsdp"}
    assert {c.checkpointing for c in found.fits} == {"full"} and not any(c.sequence_parallel for c in found.fits)
    assert len({key(c) for c in found.fits}) == len(found.fits)


def test_rows_must_be_a_positive_count_or_none(solver):
    found = search.search_plans("llama3-8b", "h100", devices=8, global_batch=16, solver=solver)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidInputError) as err:
            found.table(rows=bad)
        assert err.value.parameter == "rows"
    every = found.table(rows=None, pareto_only=False, width=1000).splitlines()
    assert len(every) == 3 + len(found.fits) and "more" not in every[-1]     # summary, run, columns
    one = found.table(rows=1, width=1000).splitlines()
    assert len(one) == 5 and one[-1] == f"... {len(found.pareto) - 1} more (--json for all)"
    assert found.to_html(rows=None, pareto_only=False).count("<tr>") == 1 + len(found.fits)


# --- the command ----------------------------------------------------------------------------

@pytest.mark.long       # whole searches from the command line
def test_cli_defaults_to_the_measured_profile_and_names_it(solver):
    code, text = run("search", "-n", "4", "--global-batch", "8", "-s", "1024", "--no-progress", "--json",
                     "--regime", "bf16", "--attention", "eager", "--dropout", "0.1", "--optimizer-impl", "fused",
                     "--no-runtime-overheads")
    assert code == 0
    data = json.loads(text)
    assert data["profile"] == "measured" and data["profile_note"] is None and type(data["schema_version"]) is int
    for row in data["fits"][::7]:
        c = search.Candidate(**{k: v for k, v in row.items() if k not in ("step_time_components", "profile", "units")})
        assert row["total_memory"] == standalone(solver, "llama3-8b", "h100", 8, 1024, c, profile="measured",
                                                 **OPTIONS).total_memory
    code, text = run("search", "-n", "4", "--global-batch", "8", "-s", "1024", "--no-progress")
    assert code == 0 and "profile measured," in text.splitlines()[0] and not text.startswith("note:")
    code, text = run("search", "-n", "4", "--global-batch", "8", "-s", "1024", "--no-progress", "--profile",
                     "reference", "--json")
    data = json.loads(text)
    reference = search.search_plans("llama3-8b", "h100", devices=4, global_batch=8, seq_len=1024, solver=solver)
    assert data["profile"] == "reference" and len(data["fits"]) == len(reference.fits)
    assert [r["total_memory"] for r in data["fits"]] == [c.total_memory for c in reference.fits]


def test_cli_refuses_a_search_the_measured_profile_cannot_describe(tmp_path, solver, capsys):
    model = tmp_path / "shapeless.json"
    model.write_text(json.dumps({"name": "shapeless", "parameters": 7_000_000_000, "layers": 32}))
    code, text = run("search", "-n", "8", "--global-batch", "16", "-m", str(model), "--no-progress")
    err = capsys.readouterr().err
    assert code == 2 and text == "" and "model.hidden_dim=None" in err and "--profile reference" in err
    # asked for by name, the reference profile ranks it
    code, text = run("search", "-n", "8", "--global-batch", "16", "-m", str(model), "--no-progress", "--json",
                     "--profile", "reference")
    data = json.loads(text)
    reference = search.search_plans(SHAPELESS, "h100", devices=8, global_batch=16, solver=solver)
    assert data["profile"] == "reference" and data["profile_note"] is None
    assert [r["total_memory"] for r in data["fits"]] == [c.total_memory for c in reference.fits]


def test_cli_refuses_a_third_party_optimizer_without_a_measured_model(builtin_pm, monkeypatch, capsys):
    from mlsysim_core import cli
    pm = _with_optimizer_without_measured_model(builtin_pm)
    monkeypatch.setattr(cli, "_manager", lambda args: pm)
    code, text = run("search", "-n", "8", "--global-batch", "16", "--optimizer", "test.reference-only",
                     "--no-progress", "--json", "--regime", "bf16")
    err = capsys.readouterr().err
    assert code == 2 and text == "" and "optimizer='test.reference-only'" in err and "--profile reference" in err


def test_cli_lora_layouts_the_profile_cannot_describe_are_left_out_and_said(capsys):
    code, text = run("search", "-n", "8", "--global-batch", "16", "--lora-rank", "16", "--no-progress", "--json")
    found = json.loads(text)
    assert code == 0 and found["fits"] and found["profile"] == "measured"
    # LoRA is modelled for data-parallel layouts and pipeline stages: the others are left out, counted, said
    assert all(r["tp"] == r["cp"] == r["ep"] == 1 for r in found["fits"])
    (note,) = [n for n in found["notes"] if "the profile cannot describe them: lora:" in n]
    left_out = int(note.split(" layouts")[0].replace(",", ""))
    assert 0 < left_out < found["candidates"]
    code, text = run("search", "-n", "1", "--global-batch", "4", "--lora-rank", "16", "--no-progress", "--json")
    assert json.loads(text)["profile"] == "measured"       # one device: the measured profile models it


@pytest.mark.parametrize("argv, flag", [
    (["--tp", "2"], "--tp"), (["--tp-size", "2"], "--tp"), (["--pp", "2"], "--pp"), (["--dp", "2"], "--dp"),
    (["--ep", "2"], "--ep"), (["--cp-size", "2"], "--cp-size"), (["--zero-stage", "3"], "--zero"),
    (["--data-parallel", "fsdp"], "--data-parallel"), (["--grad-accum", "2"], "--grad-accum"),
    (["--no-sequence-parallel"], "--no-sequence-parallel"), (["--virtual-stages", "2"], "--virtual-stages"),
    (["--expert-tp-size", "2"], "--etp"), (["--stage-layers", "16,16"], "--stage-layers"),
    (["-b", "8"], "--batch-size"),
])
def test_cli_refuses_layout_flags_by_name(capsys, argv, flag):
    code, text = run("search", "-n", "8", "--global-batch", "16", *argv)
    err = capsys.readouterr().err
    assert code == 2 and text == ""
    assert err.startswith(f"mlsysim-core: error: {flag}=") and "search" in err and "Traceback" not in err


@pytest.mark.long       # whole searches from the command line
def test_cli_rows_and_checkpointing(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "1000")     # every column kept: no "left out to fit" line
    code, _ = run("search", "-n", "8", "--global-batch", "16", "--rows", "-1", "--profile", "reference")
    assert code == 2 and "--rows=-1" in capsys.readouterr().err
    code, text = run("search", "-n", "8", "--global-batch", "16", "--json", "--profile", "reference",
                     "--checkpointing", "full", "none")
    data = json.loads(text)
    assert {r["checkpointing"] for r in data["fits"]} == {"full", "none"}
    code, text = run("search", "-n", "8", "--global-batch", "16", "--rows", "0", "--all", "--profile", "reference",
                     "--checkpointing", "full", "none")
    lines = text.splitlines()
    assert code == 0 and len(lines) == 3 + len(data["fits"]) and "more" not in lines[-1]     # summary, run, columns
    code, text = run("search", "-n", "8", "--global-batch", "16", "--rows", "1", "--profile", "reference")
    assert text.splitlines()[-1].endswith("more (--json for all)") and len(text.splitlines()) == 5
    code, _ = run("search", "-n", "8", "--global-batch", "16", "--quantization", "nf4")
    assert code == 2 and "--quantization='nf4'" in capsys.readouterr().err
