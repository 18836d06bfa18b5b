"""QA findings of a new user's hour with the tool (the README's and docs' commands, every file
under tests/data/launch with --from, bad input on the newest options): each test the command
that showed the bug, asserting the answer or the error's parameter, value and what is allowed."""

import json

import pytest
from clitools import error_of, run

ACCELERATE_ZERO3 = "tests/data/launch/accelerate/trl/zero3.yaml"     # no batch, no model, no sequence


def test_from_a_config_without_a_batch_takes_b(capsys):
    # An accelerate config gives the world size and ZeRO stage but no batch: -b gives it, as
    # -m gives the model (was refused whatever -b said: "launch files that give the batch size").
    code, out = run("estimate", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-b", "16", "-s", "2048", "--json")
    assert code == 0
    doc = json.loads(out)
    assert (doc["run"]["global_batch"], doc["run"]["dp_size"], doc["run"]["microbatch"]) == (16, 8, 2)
    assert doc["launch"]["sources"]["batch_size"] == "-b/--batch-size"
    code, err = error_of(capsys, "estimate", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-s", "2048")
    assert code == 2
    assert err == (f"mlsysim-core: error: --from='{ACCELERATE_ZERO3}' is not allowed: launch files that give the "
                   "batch size, or -b (the global batch) (none of the files gives one)")
    code, err = error_of(capsys, "estimate", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-b", "0", "-s", "2048")
    assert code == 2 and "--batch-size=0 is not allowed: a whole number >= 1" in err


def test_search_from_a_config_without_a_batch_takes_global_batch():
    code, out = run("search", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "--global-batch", "16", "-s", "2048",
                    "--json")
    assert code == 0
    assert json.loads(out)["global_batch"] == 16


def _json(*argv):
    code, out = run("estimate", *argv, "--json")
    assert code == 0, out
    return json.loads(out)


def _total(*argv):
    return _json(*argv)["total_memory"]


def test_option_lists_as_text_are_names_not_characters(capsys):
    # --option VALUE that is not JSON stays a string; a tuple-typed options field split it into
    # characters: "--option selective.modules=core_attn" said modules='c' is not allowed, and
    # save-list's comma list (its converter reads one) never reached it ('m' is not allowed).
    assert _total("--checkpointing", "selective", "--option", "selective.modules=core_attn") == \
        _total("--checkpointing", "selective")
    gpt_oss = ("-m", "gpt-oss-120b", "--regime", "mixed-bf16-main-grad", "--checkpointing", "selective")
    listed = _json(*gpt_oss, "--option", 'selective.modules=["layernorm","moe_act"]')["terms"]
    assert _json(*gpt_oss, "--option", "selective.modules=layernorm,moe_act")["terms"] == listed
    assert "recompute modules layernorm, moe_act: one layer's rebuilt in its backward" in [t["label"] for t in listed]
    assert _total("--checkpointing", "save-list", "--option", "save-list.ops=mm,sdpa") == \
        _total("--checkpointing", "save-list")
    assert _total("--checkpointing", "save-list", "--option", "save-list.ops=mm") != \
        _total("--checkpointing", "save-list")
    code, err = error_of(capsys, "estimate", "--checkpointing", "selective", "--option",
                         "selective.modules=core_attn,mlp")
    assert code == 2 and "plugin_options['selective'].modules='mlp' is not allowed: one of core_attn, layernorm, " \
        "moe_act" in err
    code, err = error_of(capsys, "estimate", "--checkpointing", "selective", "--option", "selective.modules=")
    assert code == 2 and "plugin_options['selective'].modules=() is not allowed: a non-empty list of Megatron-Core " \
        "recompute modules: core_attn, layernorm, moe_act" in err
    code, err = error_of(capsys, "estimate", "--checkpointing", "save-list", "--option", "save-list.ops=mm,foo")
    assert code == 2 and "plugin_options['save-list'].ops='foo' is not allowed: one of mm, sdpa, bmm" in err


def test_fit_techniques_refuses_multiple_of(capsys):
    # `fit batch --multiple-of` was refused, `fit techniques --multiple-of -3` silently ignored.
    for value in ("128", "-3"):
        code, err = error_of(capsys, "fit", "techniques", "--multiple-of", value)
        assert code == 2
        assert err == (f"mlsysim-core: error: --multiple-of={value} is not allowed: only with `fit seq` "
                       "(`fit techniques` searches no sequence length)")


def test_time_refuses_a_bad_power_limit(capsys):
    # `time --power-limit -5` was a TypeError traceback (a complex clock share); 0 and nan answered.
    for value, shown in (("-5", "-5.0"), ("0", "0.0"), ("nan", "nan"), ("inf", "inf")):
        code, err = error_of(capsys, "time", "--power-limit", value)
        assert code == 2
        assert err == (f"mlsysim-core: error: --power-limit={shown} is not allowed: a positive finite number of "
                       "watts (default: the hardware's TDP)")
    code, out = run("time", "--power-limit", "500", "--json")
    assert code == 0 and json.loads(out)["assumptions"]["clock_share"] == (500 / 700) ** (1 / 3)


def test_time_names_the_flag_the_user_gave(capsys):
    # `time --grad-accum 0` answered as 1; `time -b 7 --dp 2` named --grad-accum=1, never given.
    code, err = error_of(capsys, "time", "--grad-accum", "0")
    assert code == 2 and err == "mlsysim-core: error: --grad-accum=0 is not allowed: an integer >= 1"
    code, err = error_of(capsys, "time", "-b", "7", "--dp", "2")
    assert code == 2 and err == ("mlsysim-core: error: --global-batch=7 is not allowed: --global-batch a multiple of "
                                 "--dp x --grad-accum = 2 x 1 (7 / 2 is not a whole micro-batch)")
    code, err = error_of(capsys, "time", "--grad-accum", "3")
    assert code == 2 and err.startswith("mlsysim-core: error: --grad-accum=3 is not allowed: --global-batch a multiple")


def test_time_says_the_run_it_timed():
    # `time` printed the model and hardware as typed and no precision, profile, batch or sequence;
    # its JSON had neither the run nor units nor a schema version (search's JSON has all three).
    argv = ("time", "-m", "Llama-3.1-8b", "-g", "H100", "--precision", "bf16", "--regime", "bf16", "-s", "1024")
    code, text = run(*argv)
    assert code == 0
    first, second = text.splitlines()[:2]
    assert first.startswith("meta-llama/Llama-3.1-8B on 1 x NVIDIA H100 SXM5 80GB: tp 1")
    assert second == "profile measured, precision bf16, regime bf16, optimizer adam, global batch 8, seq 1024"
    code, out = run(*argv, "--json")
    doc = json.loads(out)
    assert doc["run"] == {"model": "meta-llama/Llama-3.1-8B", "hardware": "NVIDIA H100 SXM5 80GB", "global_batch": 8,
                          "seq_len": 1024, "precision": "bf16", "regime": "bf16", "optimizer": "adam",
                          "profile": "measured"}
    assert doc["units"]["step_s"] == doc["units"]["components"] == "seconds per optimizer step"
    assert doc["units"]["memory_bytes"] == "bytes (the heaviest rank)" and doc["schema_version"] == 2


@pytest.mark.long     # seconds of whole fits/searches/ladders: `pytest --long`, .ci/run
def test_fit_json_states_its_units():
    # `fit ... --json` had top-level numbers (headroom, value, added_seconds) with no unit stated.
    for question, value_unit in (("batch", "sequences per micro-batch"), ("seq", "tokens per sequence")):
        code, out = run("fit", question, "--json")
        assert code == 0
        units = json.loads(out)["units"]
        assert units["value"] == value_unit and units["headroom"] == "bytes (capacity - total at the answer)"
    code, out = run("fit", "techniques", "--json")
    assert code == 0
    units = json.loads(out)["units"]
    assert units["memory"] == "bytes (total_memory, host_memory)"
    assert units["seconds"] == "added_seconds, total_seconds: seconds per optimizer step"


def test_a_scenario_file_missing_a_required_field_names_it(capsys, tmp_path):
    # was: "scenario run.json='hardware' is not allowed: ..." (the field shown as the file's value),
    # and -g given beside it did not say why it was still refused.
    path = tmp_path / "run.json"
    path.write_text('{"model": "llama3-8b", "batch_size": 8}')
    code, err = error_of(capsys, "estimate", "--scenario", str(path), "-g", "h100")
    assert code == 2
    assert err == ("mlsysim-core: error: scenario run.json's hardware=None is not allowed: a value: model, hardware "
                   "and batch_size are required (flags override a file's values, they do not complete it) "
                   "(missing: hardware)")
    from mlsysim_core.errors import InvalidInputError
    from mlsysim_core.scenario import Scenario
    with pytest.raises(InvalidInputError) as info:
        Scenario.from_dict({"model": "llama3-8b"})
    assert info.value.parameter == "scenario's hardware" and info.value.value is None
    assert str(info.value).endswith("required (missing: hardware, batch_size)")


@pytest.mark.parametrize("value", ["-1", "abc", "nan", "inf"])
def test_search_headroom_bad_number_named_as_given(capsys, value):
    # was: headroom='-1GiB' / 'abcGiB' is not allowed (the text with the CLI's GiB appended).
    code, err = error_of(capsys, "search", "-n", "8", "--global-batch", "64", "--headroom", value)
    assert code == 2
    assert err == (f"mlsysim-core: error: --headroom='{value}' is not allowed: GiB >= 0 (a number), or a size such as "
                   "8GB, 8GiB or 10% (of the capacity)")


def test_estimate_explain_with_json_carries_the_explanation():
    # `estimate --explain --json` dropped the explanation silently (the JSON was --json's alone).
    code, text = run("estimate", "--explain", "--dp", "8", "-b", "64")
    assert code == 0
    code, out = run("estimate", "--explain", "--dp", "8", "-b", "64", "--json")
    assert code == 0
    explanation = json.loads(out)["explanation"]
    assert len(explanation.splitlines()) > 10 and "\n" + explanation.strip() + "\n" in text
    code, out = run("estimate", "--json")
    assert "explanation" not in json.loads(out)


def test_fit_from_a_config_without_the_searched_value(capsys):
    # `fit batch --from` a file with no batch was refused asking for -b, which `fit batch` refuses
    # (it searches the micro-batch); `fit seq` likewise with the sequence length.
    code, out = run("fit", "batch", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-s", "2048", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["value"] == 4 and doc["launch"]["sources"]["batch_size"] == "searched (the files give none)"
    assert doc["value"] == json.loads(run("fit", "batch", "-m", "llama3-8b", "-s", "2048", "--dp", "8", "--zero-stage",
                                          "3", "--precision", "bf16", "--regime", "mixed-bf16", "--json")[1])["value"]
    code, text = run("fit", "batch", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-s", "2048")
    assert code == 0 and "is left out" not in text      # (no file value was left out)
    code, out = run("fit", "seq", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-b", "8", "--json")
    assert code == 0 and json.loads(out)["launch"]["sources"]["seq_len"] == "searched (the files give none)"
    code, err = error_of(capsys, "estimate", "--from", ACCELERATE_ZERO3, "-m", "llama3-8b", "-b", "8")
    assert code == 2 and "--seq-len=None is not allowed: the sequence length (the files give none)" in err


@pytest.mark.parametrize("figure, value", [("power", -5), ("power", 0), ("memory_bandwidth", float("nan")),
                                           ("flops", float("inf")), ("tp_bandwidth", True), ("network_bandwidth", -1)])
def test_time_plan_refuses_a_figure_that_is_not_positive_and_finite(figure, value):
    # time_plan(power=-5) from Python was a TypeError deep in the step time (QA); search_plans already refused it
    from mlsysim_core.errors import InvalidInputError
    from mlsysim_core.search import time_plan
    with pytest.raises(InvalidInputError) as err:
        time_plan("llama3-8b", "h100", global_batch=8, **{figure: value})
    assert err.value.parameter == figure
    assert str(err.value).endswith("is not allowed: a positive finite number, or None for the hardware's own")


def test_a_search_with_no_valid_layout_says_why(capsys):
    # 100,000 devices cannot make tp x cp x pp x dp for a global batch of 8 (dp divides it): the search enumerated
    # nothing, and said "No layout of the 0 enumerated fits (none could be solved)" (QA)
    code, out = run("search", "-n", "100000", "--global-batch", "8")
    assert code == 0
    assert out.rstrip().splitlines()[-1] == (
        "No valid layout of 100,000 devices: tp x cp x pp x dp must make the devices, with tp within a node, pp at "
        "most the layers, cp dividing seq 2,048 and dp dividing global batch 8 (docs/planner.md, 'The search "
        "space'): give fewer devices or a larger global batch.")
