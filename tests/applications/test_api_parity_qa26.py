"""What the CLI says and accepts since issue 26's QA items, the Python API says and accepts too: the
float8 names (one list, read by the measured profile's option and by time_plan/search_plans), the
memory `time --float8` solves (a search's float8 row's), the input notes, the figures a technique
ladder asks for, and where the measured profile's 8-bit training is."""

import json

import pytest

from mlsysim_core import scenario
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.search import float8_implementation, float8_names, search_plans, time_plan
from mlsysim_core.solver import TrainingMemoryModel

SOLVER = TrainingMemoryModel("measured")
FLOAT8_RUN = dict(precision="bf16", regime="bf16", activation_checkpointing="none")
# (tests/applications/test_cli_qa26.py pins the same list in the CLI's errors)
LISTING = ("one of: te-current-scaling, te-delayed-scaling, te-mxfp8, torchao-rowwise, torchao-tensorwise, "
           "tensorwise, rowwise, transformer-engine")


# --- 1. float8: an implementation's name is the memory it declares; a memory value the implementation ------

def test_the_one_list_reads_each_declaration():
    names = float8_names(SOLVER.registry)
    assert {n: (getattr(i, "name", None), m) for n, (i, m) in names.items()} == {
        "te-current-scaling": ("te-current-scaling", None), "te-delayed-scaling": ("te-delayed-scaling", None),
        "te-mxfp8": ("te-mxfp8", None), "torchao-rowwise": ("torchao-rowwise", "rowwise"),
        "torchao-tensorwise": ("torchao-tensorwise", "tensorwise"), "tensorwise": ("torchao-tensorwise", "tensorwise"),
        "rowwise": ("torchao-rowwise", "rowwise"), "transformer-engine": (None, "transformer-engine")}


def test_estimate_takes_an_implementations_name_as_the_memory_it_declares():
    by_value = scenario.estimate("llama3-8b", "h100", 1, 256, float8="tensorwise", **FLOAT8_RUN)
    for name in ("torchao-tensorwise", "Torchao_Tensorwise"):
        by_name = scenario.estimate("llama3-8b", "h100", 1, 256, float8=name, **FLOAT8_RUN)
        assert by_name.total_memory == by_value.total_memory and by_name.notes == by_value.notes
        assert by_name.details["float8"] == "tensorwise"
    assert scenario.estimate("llama3-8b", "h100", 1, 256, float8="torchao-rowwise", **FLOAT8_RUN).details[
        "float8"] == "rowwise"
    # a Scenario (a file's, Python's) says the recipe read in its run details
    run = scenario.Scenario.from_dict({"model": "llama3-8b", "hardware": "h100", "batch_size": 1, "seq_len": 256,
                                       "precision": "bf16", "regime": "bf16", "activation_checkpointing": "none",
                                       "float8": "torchao-rowwise", "profile": "measured"})
    assert run.run_details(run.solve())["float8"] == "rowwise"


def test_estimate_refuses_a_float8_name_naming_what_is_allowed():
    with pytest.raises(NotModelledError) as info:
        scenario.estimate("llama3-8b", "h100", 1, 256, float8="te-mxfp8", **FLOAT8_RUN)
    assert (info.value.parameter, info.value.value) == ("float8", "te-mxfp8")
    assert info.value.allowed == ("a name whose memory is modelled: torchao-rowwise, torchao-tensorwise, tensorwise, "
                                  "rowwise, transformer-engine")
    assert info.value.detail == ("the float8 implementation 'te-mxfp8' declares no memory (Float8Casts.memory): "
                                 "`mlsysim-core time --float8 te-mxfp8` times it")
    with pytest.raises(InvalidInputError) as info:
        scenario.estimate("llama3-8b", "h100", 1, 256, float8="fp8", **FLOAT8_RUN)
    assert (info.value.parameter, info.value.value, info.value.allowed) == ("float8", "fp8", LISTING)
    assert info.value.detail.startswith("tensorwise = torchao-tensorwise, rowwise = torchao-rowwise; memory only: "
                                        "transformer-engine; step time only (memory not modelled): ")


def test_time_plan_and_search_take_a_memory_value_as_the_implementation_declaring_it():
    registry = SOLVER.registry
    assert float8_implementation(registry, "tensorwise").name == "torchao-tensorwise"
    assert float8_implementation(registry, "ROWWISE").name == "torchao-rowwise"
    layout = dict(global_batch=8, tp=2, dp=4, microbatch=2, profile="measured", solver=SOLVER)
    by_value, by_name = (time_plan("llama3-8b", "h100", float8=f, **layout) for f in ("tensorwise", "torchao-tensorwise"))
    assert by_value["components"] == by_name["components"] and by_value["layout"]["float8"] == "torchao-tensorwise"
    with pytest.raises(NotModelledError) as info:
        time_plan("llama3-8b", "h100", float8="transformer-engine", **layout)
    assert (info.value.parameter, info.value.value) == ("float8", "transformer-engine")
    assert info.value.detail == ("no registered float8 implementation declares float8='transformer-engine' as its "
                                 "memory, so its casts are not known to the step time")
    with pytest.raises(InvalidInputError) as info:
        search_plans("llama3-8b", "h100", devices=8, global_batch=8, allow_float8="fp8", solver=SOLVER)
    assert (info.value.parameter, info.value.allowed) == ("allow_float8", LISTING)


# --- 2. time_plan's memory with float8 is the search's float8 row's -----------------------------------------

def _tiny():
    import importlib.util
    from pathlib import Path
    path = Path(__file__).resolve().parents[2] / "validation" / "techniques" / "float8" / "float8_configs.py"
    spec = importlib.util.spec_from_file_location("float8_configs", path)
    configs = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(configs)
    cfg = next(c for c in configs.CONFIGS if c["id"] == "llama-a-bf16-tensorwise")
    return from_hf_config(cfg["hf_config"], name=cfg["id"])


def test_time_float8_memory_is_the_search_rows_memory():
    # A tiny Llama under SGD (no optimizer-step peak): float8's casts set the peak, 2,553,360 B more than
    # the 16-bit run. Was: time_plan said the 16-bit run's 12,111,616 B, the search's float8 row 14,664,976 B.
    model = _tiny()
    run = dict(precision="bf16", regime="bf16", optimizer="sgd", runtime_overheads=False)
    sixteen = scenario.estimate(model, "h100", 2, 128, activation_checkpointing="none", **run).total_memory
    eight = scenario.estimate(model, "h100", 2, 128, activation_checkpointing="none", float8="tensorwise",
                              **run).total_memory
    assert (sixteen, eight) == (12_111_616, 14_664_976)
    found = search_plans(model, "h100", devices=1, global_batch=2, seq_len=128, checkpointing=["none"],
                         allow_float8=True, profile="measured", workers=1, solver=SOLVER, **run)
    rows = {c.float8: c for c in found.fits if c.microbatch == 2}
    assert (rows[False].total_memory, rows[True].total_memory) == (sixteen, eight)
    for float8, row in sorted(rows.items()):
        timed = time_plan(model, "h100", global_batch=2, seq_len=128, checkpointing="none", microbatch=2,
                          float8=float8, profile="measured", solver=SOLVER, **run)
        assert timed["memory_bytes"] == row.total_memory and timed["step_s"] == row.step_time
    assert "the memory solved with float8='tensorwise', as a search's float8 row" in " ".join(timed["notes"])


def test_time_float8_memory_not_modelled_is_said_as_the_search_leaves_the_row_out():
    timed = time_plan("llama3-8b", "h100", global_batch=8, float8=True, profile="measured", solver=SOLVER)
    assert timed["memory_bytes"] is None and timed["fits"] is None and timed["step_s"] > 0
    assert any(n.startswith("memory not solved: float8='tensorwise' is not allowed") for n in timed["notes"])
    # an implementation that declares no memory: the 16-bit run's, said; a profile without the option: the same
    te = time_plan("llama3-8b", "h100", global_batch=8, float8="te-mxfp8", profile="measured", solver=SOLVER)
    plain = time_plan("llama3-8b", "h100", global_batch=8, profile="measured", solver=SOLVER)
    assert te["memory_bytes"] == plain["memory_bytes"]
    assert any("the memory is the 16-bit run's (the implementation declares no float8 memory" in n for n in te["notes"])
    ref = time_plan("llama3-8b", "h100", global_batch=8, float8=True, profile="reference", solver=SOLVER)
    assert any("the memory is the 16-bit run's (profile 'reference' has no float8 option)" in n for n in ref["notes"])


# --- 3. input notes: estimate's result (its JSON, explain) carries them ---------------------------------------

PARTIAL = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "vocab_size": 128256}


def test_estimate_of_a_partial_config_says_the_defaults_taken(tmp_path):
    from mlsysim_core.hf import defaults_note
    note = defaults_note(PARTIAL)
    assert note.startswith("the config.json leaves out 11 fields the model is read from; ")
    (tmp_path / "config.json").write_text(json.dumps(PARTIAL))
    for model in (str(tmp_path), tmp_path / "config.json"):
        result = scenario.estimate(model, "h100", 8, 1024)
        assert result.notes[0] == note
        assert json.loads(result.to_json())["notes"][0] == note
        assert " ".join(note.split()) in " ".join(result.explain().split())     # (explain wraps its lines)
    assert scenario.estimate("tests/data/hf_configs/Llama-3.2-1B.json", "h100", 8, 1024).notes == \
        scenario.estimate("tests/data/hf_configs/Llama-3.2-1B.json", "h100", 8, 1024, sequence_parallel=False).notes
    run = scenario.Scenario.from_dict({"model": PARTIAL, "hardware": "h100", "batch_size": 8, "seq_len": 1024})
    assert run.input_notes() == [note] and run.solve().notes[0] == note


def test_sequence_parallel_at_tp_1_is_said_by_estimate_and_time_plan():
    plain = scenario.estimate("llama3-8b", "h100", 8, 1024)
    sp = scenario.estimate("llama3-8b", "h100", 8, 1024, sequence_parallel=True)
    assert sp.total_memory == plain.total_memory
    assert sp.notes == (scenario.SP_AT_TP1, *plain.notes)
    assert scenario.SP_AT_TP1 not in scenario.estimate("llama3-8b", "h100", 8, 1024, sequence_parallel=True,
                                                       tp_size=2).notes
    assert scenario.SP_AT_TP1 in time_plan("llama3-8b", "h100", global_batch=8, sequence_parallel=True)["notes"]
    assert scenario.SP_AT_TP1 not in time_plan("llama3-8b", "h100", global_batch=8, tp=2,
                                               sequence_parallel=True)["notes"]


# --- 4. the ladder's unknown figures name the Python keyword beside the flag ---------------------------------

@pytest.mark.long     # two whole technique ladders
def test_fit_techniques_unknown_figures_name_keyword_and_flag():
    from mlsysim_plugins.measured.technique_fit import fit_techniques
    ladder = fit_techniques("llama3-8b", "h100", 8, 2048, solver=SOLVER)
    figures = ladder.to_dict()["figures"]
    assert figures["host link B/s"] == {
        "value": None, "keyword": "host_link_bytes_per_s", "flag": "--host-link-gbps GB/s",
        "source": "unknown (no host-link bandwidth for this hardware; give host_link_bytes_per_s= "
                  "(--host-link-gbps GB/s))"}
    assert figures["memory bandwidth B/s"]["keyword"] == "memory_bandwidth"
    assert figures["memory bandwidth B/s"]["flag"] is None
    assert any("host_memory_bytes_per_s= (--host-memory-gbps GB/s) and host_link_bytes_per_s= (--host-link-gbps "
               "GB/s)" in how for step in ladder.steps for how in step.how)
    # what the CLI prints and writes after the ladder is the ladder's own (describe, to_dict)
    assert ladder.to_dict()["unknown_figures"] == {
        "host link B/s": {"keyword": "host_link_bytes_per_s", "flag": "--host-link-gbps GB/s"},
        "host memory B/s": {"keyword": "host_memory_bytes_per_s", "flag": "--host-memory-gbps GB/s"}}
    assert ladder.describe().splitlines()[-1] == (
        "added unknown: give the figures it needs (not given, and none in the catalog for this hardware): "
        "--host-link-gbps GB/s (host link B/s; host_link_bytes_per_s= in Python); --host-memory-gbps GB/s "
        "(host memory B/s; host_memory_bytes_per_s= in Python)")
    timed = fit_techniques("llama3-8b", "h100", 8, 2048, solver=SOLVER, host_link_bytes_per_s=25e9,
                           host_memory_bytes_per_s=100e9)
    assert timed.unknown_figures() == {} and "added unknown" not in timed.describe()


# --- 5. precision fp8/int8/int4: the refusal says where the measured profile's 8-bit training is -------------

def test_precision_fp8_refusal_points_to_float8_and_qlora():
    with pytest.raises(NotModelledError) as info:
        scenario.estimate("llama3-8b", "h100", 8, 1024, precision="int8")
    assert (info.value.parameter, info.value.value) == ("precision", "int8")
    assert info.value.detail == (
        "8- and 4-bit training regimes are not modelled yet; the measured profile's 8-bit training is float8 linears "
        "over 16-bit weights (precision='bf16', regime='bf16', float8=NAME; --precision bf16 --regime bf16 --float8 "
        "NAME), and its 8- and 4-bit weights are QLoRA's (lora={'rank': N, 'quantization': 'nf4'|'fp4'|'int8'}; "
        "--lora-rank N --quantization nf4|fp4|int8)")
