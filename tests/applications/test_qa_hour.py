"""QA findings of a new user's hour with the tool (the README's and docs' commands, every file
under tests/data/launch with --from, bad input on the newest options): each test the command
that showed the bug, asserting the answer or the error's parameter, value and what is allowed."""

import json

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
