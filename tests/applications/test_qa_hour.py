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
