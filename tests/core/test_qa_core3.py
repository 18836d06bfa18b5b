"""QA findings (third round, library side): errors carry every field the CLI reads, fit devices
counts every rank, search says what changes its numbers, strategies and LoRA targets are checked."""

from __future__ import annotations

import io
import json

import pytest

from mlsysim_core import TrainingMemoryModel, cli, errors, inverse
from mlsysim_core import catalog as catalog_module
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError


def run_cli(*argv) -> str:
    out = io.StringIO()
    assert cli.main(list(argv), out=out) == 0
    return out.getvalue()


# --- 1. every InvalidInputError subclass has parameter, value, allowed and detail -----------------

def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_catalog_error_has_a_detail():
    err = catalog_module.CatalogError("bad file", parameter="catalog", value="x.json", allowed="a list")
    assert err.detail == ""
    assert catalog_module.CatalogError("m", detail="why").detail == "why"


def test_every_invalid_input_error_has_the_four_fields():
    seen = set(_subclasses(InvalidInputError))
    assert catalog_module.CatalogError in seen
    for cls in seen | {InvalidInputError}:
        if cls is catalog_module.CatalogError:
            err = cls("message")
        else:
            err = cls("p", 1, "allowed")
        for field in ("parameter", "value", "allowed", "detail"):
            assert hasattr(err, field), (cls, field)
        assert isinstance(err.detail, str)


# --- 2. fit devices counts tp x cp x pp x dp ---------------------------------------------------

def test_fewest_devices_counts_context_parallel_ranks():
    answer = inverse.fewest_devices("llama3-8b", "h100", 8, solver=TrainingMemoryModel("measured"),
                                    cp_size=2, zero_stage=3)
    assert answer.details["cp"] == 2
    d = answer.details
    assert answer.value == d["tp"] * d["cp"] * d["pp"] * d["dp"]
    assert "cp 2" in answer.describe()


def test_fewest_devices_without_cp_is_unchanged():
    answer = inverse.fewest_devices("llama3-8b", "h100", 8, solver=TrainingMemoryModel("measured"), zero_stage=3)
    assert answer.details["cp"] == 1
    assert answer.value == answer.details["dp"]


def test_fewest_devices_checks_cp_size():
    with pytest.raises(InvalidInputError) as info:
        inverse.fewest_devices("llama3-8b", "h100", 8, cp_size=0)
    assert info.value.parameter == "cp_size"


def test_cli_fit_devices_counts_cp():
    text = run_cli("fit", "devices", "-b", "8", "--cp", "2", "--zero", "3")
    line = next(l for l in text.splitlines() if l.startswith("fewest devices:"))
    assert line.startswith("fewest devices: 4, dp 2"), line
    assert "cp 2" in line
    data = json.loads(run_cli("fit", "devices", "-b", "8", "--cp", "2", "--zero", "3", "--json"))
    assert data["value"] == 4 and data["details"]["cp"] == 2


# --- 3 and 4. search says what changes its numbers, and the notes that hold for all of it ---------

QLORA = ("search", "-n", "1", "--global-batch", "8", "--lora-rank", "16", "--quantization", "nf4",
         "--precision", "bf16", "--attention", "eager", "--no-progress")


def test_search_json_names_the_run():
    data = json.loads(run_cli(*QLORA, "--json"))
    run = data["run"]
    assert data["profile"] == "measured" and run["profile"] == "measured"
    assert run["precision"] == "bf16" and run["regime"] and run["regime_source"] == "precision"
    assert run["optimizer"] == "adam" and run["optimizer_impl"] == "foreach"
    assert run["attention"] == "eager" and run["dropout"] == 0.0 and run["runtime_overheads"] is True
    assert run["lora"]["rank"] == 16 and run["lora"]["quantization"] == "nf4"
    assert run["lora"]["target_modules"] == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert run["checkpointing"] == ["full", "none", "selective"] and run["checkpointing_restricted"] is False
    # the LoRA default-targets note holds for every layout: once, at the top
    assert any(n.startswith("lora.target_modules not given") for n in data["notes"])


def test_search_text_header_names_the_run():
    text = run_cli(*QLORA, "--checkpointing", "full")
    lines = text.splitlines()
    assert "profile measured," in lines[0]
    run = lines[1]
    assert run.startswith("run: ")
    for fragment in ("precision bf16", "regime ", "optimizer adam", "QLoRA rank 16", "nf4", "attention eager",
                     "dropout 0.0", "runtime overheads on", "checkpointing full (as asked)"):
        assert fragment in run, (fragment, run)
    assert lines[2].startswith("note: lora.target_modules not given")
    text = run_cli("search", "-n", "2", "--global-batch", "8", "--no-progress", "--no-runtime-overheads",
                   "--dropout", "0.1", "--optimizer-impl", "fused")
    run = text.splitlines()[1]
    assert "runtime overheads off" in run and "dropout 0.1" in run and "optimizer adam (fused)" in run


def test_search_reference_run_and_catalog_notes():
    from mlsysim_core import search
    found = search.search_plans("mlsysim:llama3-8b", "h100", devices=2, global_batch=8)
    assert found.profile == "reference" and found.run["precision"] == "fp16"
    assert "regime" not in found.run and "attention" not in found.run
    assert any(n.startswith("model: ") and "reference catalog data" in n for n in found.notes)
    table = found.table()
    assert "\nnote: model: " in table and "reference catalog data" in found.to_html()
    assert found.to_dict()["notes"] == list(found.notes)


def test_search_with_lora_on_several_devices_ranks_what_the_measured_profile_describes():
    out = io.StringIO()
    assert cli.main(["search", "-n", "8", "--global-batch", "16", "--lora-rank", "16", "--no-progress", "--json"],
                    out=out) == 0
    found = json.loads(out.getvalue())
    assert found["profile"] == "measured" and found["fits"]      # never the reference's answer
    assert all(r["tp"] == 1 for r in found["fits"])     # LoRA split by tp: left out, said (pp: per stage)
    assert any("cannot describe them: lora:" in n for n in found["notes"])


def test_search_approximation_and_warning_notes_reach_the_header():
    from mlsysim_core import TransformerWorkload, search
    model = TransformerWorkload(name="odd", parameters=9_000_000_000, layers=32, hidden_dim=4096, heads=32,
                                ffn_dim=14336, vocab_size=128256, kv_heads=8, gated_mlp=True, architecture="llama")
    one = TrainingMemoryModel("measured").solve(model, "h100", 8, 2048)
    whole = [n for n in one.notes if n.startswith(search.WHOLE_SEARCH_NOTES)]
    assert whole, one.notes      # (a model whose shapes contradict its parameters)
    found = search.search_plans(model, "h100", devices=2, global_batch=8, profile="measured")
    assert list(found.notes) == whole
    assert all(f"note: {n}" in found.table() for n in whole)


# --- 5. a third-party strategy without a measured-grade model -----------------------------------

@pytest.fixture()
def offload_pm(builtin_pm):
    from mlsysim_core import ACTIVATIONS, CheckpointingSpec, MemoryTerm, hookimpl
    from mlsysim_core.manager import PluginManager

    class Offload:
        @hookimpl
        def mlsysim_checkpointing_strategies(self):
            def acts(plan, placement, options):
                return [MemoryTerm(component=ACTIVATIONS, label="on device", nbytes=1000)]
            return [CheckpointingSpec(name="test.offload", activation_terms=acts)]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Offload(), name="test_offload")
    return pm


def test_search_leaves_out_a_strategy_the_measured_profile_cannot_model(offload_pm):
    from mlsysim_core import search
    solver = TrainingMemoryModel(plugin_manager=offload_pm)
    found = search.search_plans("llama3-8b", "h100", devices=2, global_batch=8, solver=solver, profile="measured")
    assert found.profile == "measured"
    assert {c.checkpointing for c in found.fits} <= {"full", "none", "selective"}
    assert found.run["checkpointing_left_out"] == ["test.offload"]
    assert any("left out: test.offload" in n for n in found.notes)
    assert "left out: test.offload" in found.table()
    # under the reference profile it takes part
    reference = search.search_plans("llama3-8b", "h100", devices=2, global_batch=8, solver=solver)
    assert "test.offload" in {c.checkpointing for c in reference.fits} and not reference.run["checkpointing_left_out"]
    # named explicitly: the measured profile refuses the whole search
    with pytest.raises(errors.NotModelledError) as info:
        search.search_plans("llama3-8b", "h100", devices=2, global_batch=8, solver=solver, profile="measured",
                            checkpointing=["test.offload", "full"])
    assert info.value.parameter == "activation_checkpointing"


def test_cli_search_default_stays_measured_with_a_third_party_strategy(offload_pm, monkeypatch):
    monkeypatch.setattr(cli, "_manager", lambda args: offload_pm)
    data = json.loads(run_cli("search", "-n", "2", "--global-batch", "8", "--no-progress", "--json"))
    assert data["profile"] == "measured" and data["profile_note"] is None
    assert data["run"]["checkpointing_left_out"] == ["test.offload"]
    assert any("without a measured-grade model left out: test.offload" in n for n in data["notes"])
    out = io.StringIO()     # named, it cannot be left out: refused, never ranked by the reference
    assert cli.main(["search", "-n", "2", "--global-batch", "8", "--no-progress", "--json",
                     "--checkpointing", "test.offload"], out=out) == 2
    assert out.getvalue() == ""


# --- 6. recompute names and repeated cp sizes ---------------------------------------------------

def test_recompute_unknown_strategy_is_named():
    from mlsysim_core import search
    with pytest.raises(InvalidInputError) as info:
        search.search_plans("llama3-8b", "h100", devices=2, global_batch=8, recompute={"Full": 5.0})
    err = info.value
    assert err.parameter == "recompute" and err.value == "Full"
    assert all(f" {name}," in str(err) or f" {name} (" in str(err) for name in ("full", "none", "selective"))   # every installed one
    found = search.search_plans("llama3-8b", "h100", devices=2, global_batch=8, recompute={"full": 5.0})
    assert found.assumptions["recompute.full"] == 5.0


def test_repeated_cp_sizes_count_once():
    once = json.loads(run_cli("search", "-n", "4", "--global-batch", "8", "--cp", "2", "--no-progress", "--json",
                              "--profile", "reference"))
    twice = json.loads(run_cli("search", "-n", "4", "--global-batch", "8", "--cp", "2", "2", "--no-progress",
                               "--json", "--profile", "reference"))
    assert twice["candidates"] == once["candidates"] and len(twice["fits"]) == len(once["fits"])
    assert twice["run"]["context_parallel"] == [2]


# --- 7. LoRA targets need a model; quant_blocksize needs 4-bit quantization ----------------------

def test_default_target_modules_takes_a_model_or_a_catalog_name():
    from mlsysim_core.catalog import get_model
    from mlsysim_core.finetune import LoRAConfig, default_target_modules
    assert default_target_modules("gpt2") == ("c_attn",)
    assert default_target_modules(get_model("gpt2")) == ("c_attn",)
    assert default_target_modules("llama3-8b") == ("q_proj", "k_proj", "v_proj", "o_proj")
    assert LoRAConfig().for_model("gpt2").target_modules == ("c_attn",)
    for bad in (3, None, {"architecture": "gpt2"}):
        for call in (lambda: default_target_modules(bad), lambda: LoRAConfig().for_model(bad),
                     lambda: LoRAConfig(target_modules=("q_proj",)).for_model(bad)):
            with pytest.raises(InvalidInputTypeError) as info:
                call()
            assert info.value.parameter == "model"
    with pytest.raises(InvalidInputError) as info:
        default_target_modules("no-such-model")
    assert info.value.parameter == "model"


def test_quant_blocksize_needs_4bit_quantization():
    from mlsysim_core.finetune import LoRAConfig
    for quantization in (None, "int8"):
        with pytest.raises(InvalidInputError) as info:
            LoRAConfig(rank=8, quantization=quantization, quant_blocksize=128)
        assert info.value.parameter == "lora.quant_blocksize" and "quantization" in str(info.value)
    assert LoRAConfig(rank=8, quantization="nf4", quant_blocksize=128).quant_blocksize == 128
    assert LoRAConfig(rank=8).quant_blocksize == 64
    with pytest.raises(InvalidInputError) as info:
        TrainingMemoryModel("measured").solve("llama3-8b", "h100", 4, lora={"rank": 8, "quant_blocksize": 128})
    assert info.value.parameter == "lora.quant_blocksize"
