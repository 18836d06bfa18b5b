"""QA findings of issue 26 (and 24): small user-facing holes of the command line, each test the
command that showed it, asserting the answer or the error's parameter, value and what is allowed."""

import json

from clitools import error_of, run

# one device, pure bf16, no checkpointing: the run the measured profile's torchao float8 models
FLOAT8_RUN = ("-b", "1", "-s", "256", "--precision", "bf16", "--regime", "bf16", "--checkpointing", "none")


def _estimate(*argv):
    code, out = run("estimate", *argv, "--json")
    assert code == 0, out
    return json.loads(out)


# --- 1. estimate --float8 and time --float8 take the same names ----------------------------------

def test_estimate_float8_takes_the_implementations_names_as_their_declared_memory():
    # Was: estimate took tensorwise|rowwise|transformer-engine only ("invalid choice:
    # 'torchao-tensorwise'"), time the implementations' names only. torchao-tensorwise declares
    # memory float8='tensorwise' (Float8Casts.memory): the same answer, the same note.
    for alias, value in (("torchao-tensorwise", "tensorwise"), ("Torchao_Rowwise", "rowwise")):
        by_alias, by_value = _estimate(*FLOAT8_RUN, "--float8", alias), _estimate(*FLOAT8_RUN, "--float8", value)
        assert by_alias["total_memory"] == by_value["total_memory"]
        assert by_alias["notes"] == by_value["notes"] and by_alias["run"]["float8"] == value
        assert any(note.startswith(f"float8={value!r} (torchao convert_to_float8_training") for note in by_alias["notes"])
        assert any(t["label"].startswith("float8 casts: ") and t["label"].endswith(f"({value})")
                   for t in by_alias["terms"])


def test_float8_errors_list_one_list_for_every_command(capsys):
    listing = ("one of: te-current-scaling, te-delayed-scaling, te-mxfp8, torchao-rowwise, torchao-tensorwise, "
               "tensorwise, rowwise, transformer-engine (tensorwise = torchao-tensorwise, rowwise = torchao-rowwise; "
               "memory only: transformer-engine; step time only (memory not modelled): te-current-scaling, "
               "te-delayed-scaling, te-mxfp8)")
    for argv in (("estimate", *FLOAT8_RUN, "--float8", "fp8"), ("time", "--global-batch", "8", "--float8", "fp8"),
                 ("search", "-n", "8", "--global-batch", "8", "--allow-float8", "fp8")):
        code, err = error_of(capsys, *argv)
        flag = "--allow-float8" if argv[0] == "search" else "--float8"
        assert (code, err) == (2, f"mlsysim-core: error: {flag}='fp8' is not allowed: {listing}")


def test_estimate_float8_refuses_an_implementation_whose_memory_is_not_modelled(capsys):
    code, err = error_of(capsys, "estimate", *FLOAT8_RUN, "--float8", "TE_MXFP8")
    assert code == 2
    assert err == ("mlsysim-core: error: --float8='TE_MXFP8' is not allowed: a name whose memory is modelled: "
                   "torchao-rowwise, torchao-tensorwise, tensorwise, rowwise, transformer-engine (the float8 "
                   "implementation 'te-mxfp8' declares no memory (Float8Casts.memory): `mlsysim-core time --float8 "
                   "te-mxfp8` times it)")


def test_time_float8_takes_the_memory_names_as_the_implementation_declaring_them(capsys):
    def timed(*argv):
        code, out = run("time", "--global-batch", "8", *argv, "--json")
        assert code == 0, out
        return json.loads(out)
    by_memory, by_name = timed("--float8", "tensorwise"), timed("--float8", "torchao-tensorwise")
    assert by_memory["step_s"] == by_name["step_s"] and by_memory["components"] == by_name["components"]
    assert "float8 (torchao-tensorwise): the linears timed in float8 GEMMs" in " ".join(by_memory["notes"])
    assert by_memory["step_s"] < timed()["step_s"]
    code, err = error_of(capsys, "time", "--global-batch", "8", "--float8", "transformer-engine")
    assert code == 2
    assert err == ("mlsysim-core: error: --float8='transformer-engine' is not allowed: a name of a float8 "
                   "implementation: te-current-scaling, te-delayed-scaling, te-mxfp8, torchao-rowwise, "
                   "torchao-tensorwise, tensorwise, rowwise (no registered float8 implementation declares "
                   "float8='transformer-engine' as its memory, so its casts are not known to the step time)")


def test_float8_help_says_the_same_list_in_estimate_time_and_search(capsys):
    listing = ("tensorwise=torchao-tensorwise,rowwise=torchao-rowwise;memoryonly:transformer-engine;steptimeonly"
               "(memorynotmodelled):te-current-scaling,te-delayed-scaling,te-mxfp8")    # (help wraps lines)
    for command in ("estimate", "time", "search"):
        capsys.readouterr()
        try:
            run(command, "--help")
        except SystemExit:
            pass
        text = "".join(capsys.readouterr().out.split())
        assert listing in text, command
