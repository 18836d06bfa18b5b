"""torchtitan v0.2.2 job configs and torchtitan 0.3.0's resolved dumps read by the built-in `torchtitan`
launch format (issue 26)."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest

from mlsysim_core.errors import InvalidInputError, MlsysimError, NotModelledError
from mlsysim_core.scenario import from_launch

from clitools import run

DATA = Path(__file__).resolve().parents[1] / "data" / "launch" / "torchtitan"
FILES = sorted(DATA.rglob("*.toml"))
RESOLVED = sorted((DATA / "resolved_0.3.0").glob("*.json"))


def test_the_copies_are_listed_with_their_source():
    listed = (DATA / "SOURCES.md").read_text()
    assert len(FILES) >= 6
    for path in FILES:
        rel = path.relative_to(DATA)
        assert f"| {rel} | torchtitan/models/{rel.parent}/train_configs/{rel.name} |" in listed


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(DATA)))
def test_every_config_reads_end_to_end(path):
    try:
        launch = from_launch([path], gpus=64)
    except MlsysimError as err:
        assert isinstance(err, InvalidInputError), err
        assert err.parameter.split(".")[-1] in path.read_text() or err.parameter == "model.flavor", err
        return
    try:
        launch.scenario.solve()
    except NotModelledError as err:
        assert err.parameter.split(".")[0] in launch.sources, err


def test_llama3_70b_hand_derived():
    launch = from_launch([DATA / "llama3" / "llama3_70b.toml"], gpus=64)
    s = launch.scenario
    # tp 8, dp_shard -1 -> 64 / 8 = 8; local batch 8 per dp rank -> global 64; FSDP2 + fp32 params, bf16 compute
    assert (s.model, s.tp_size, s.dp_size, s.batch_size, s.seq_len) == ("meta-llama/llama-3.1-70b", 8, 8, 64, 8192)
    assert s.data_parallel == "fsdp" and s.activation_checkpointing == "full" and s.sequence_parallel is True
    o = s.profile_options
    assert o["regime"] == "fsdp-bf16" and o["loss_parallel"] is True and o["optimizer_impl"] == "fused"
    defaults = {d.key: d for r in launch.readings for d in r.defaults}
    assert defaults["optimizer.implementation"].version == "torchtitan 0.2.2"
    assert "job" in launch.readings[0].ignored


def test_selective_op_and_default_every_k():
    s = from_launch([DATA / "llama3" / "llama3_8b.toml"], gpus=8).scenario
    assert s.activation_checkpointing == "op-sac"     # selective_ac_option = "op"
    with pytest.raises(InvalidInputError, match="--gpus"):
        from_launch([DATA / "llama3" / "llama3_8b.toml"])     # data_parallel_shard_degree = -1 needs the world


def test_refusals_name_the_key(tmp_path):
    launch = from_launch([DATA / "llama3" / "llama3_405b.toml"], gpus=512)   # compile.components ["model", "loss"]
    assert launch.scenario.profile_options["compile"] == "blocks+loss"      # the blocks and the loss compiled
    with pytest.raises(NotModelledError) as err:      # ... under tp 8: the compiled loss is measured under dp only
        launch.scenario.solve()
    assert err.value.parameter == "tp_size" and "compile='blocks+loss'" in str(err.value)
    blocks = tmp_path / "llama3_8b.toml"      # the blocks alone: modelled (compile="blocks", docs/compile.md)
    blocks.write_text((DATA / "llama3" / "llama3_8b.toml").read_text().replace(
        'enable=false\ncomponents = ["model", "loss"]', 'enable=true\ncomponents = ["model"]'))
    launch = from_launch([blocks], gpus=8)
    assert launch.scenario.profile_options["compile"] == "blocks"
    assert any(f.key == "compile.enable" and f.becomes == "blocks" for r in launch.readings for f in r.fields)
    with pytest.raises(NotModelledError) as err:
        from_launch([DATA / "llama3" / "debug_model.toml"], gpus=8)
    assert err.value.parameter == "model.flavor"


def test_compiled_loss_is_answered(tmp_path):
    """compile.enable with torchtitan's default components ["model", "loss"] (the blocks and build_cross_entropy_loss's
    torch.compile(loss_fn)): compile='blocks+loss', the compiled loss's terms in place of the eager cross-entropy's
    (validation/compile/blocks_extra_measurements.json); components ["model"]: the blocks alone, a larger peak (the
    fp32 log-softmax and the backward's fp32 temporaries); ["loss"] alone: refused, naming compile.components."""
    text = (DATA / "llama3" / "llama3_8b.toml").read_text()
    assert 'enable=false\ncomponents = ["model", "loss"]' in text
    both, model, loss = (tmp_path / f"{name}.toml" for name in ("both", "model", "loss"))
    both.write_text(text.replace("enable=false", "enable=true"))
    model.write_text(text.replace('enable=false\ncomponents = ["model", "loss"]', 'enable=true\ncomponents = ["model"]'))
    loss.write_text(text.replace('enable=false\ncomponents = ["model", "loss"]', 'enable=true\ncomponents = ["loss"]'))
    launch = from_launch([both], gpus=8)
    assert launch.scenario.profile_options["compile"] == "blocks+loss"
    field = next(f for r in launch.readings for f in r.fields if f.field == "compile")
    assert field.key == "compile.components" and field.value == ["model", "loss"]
    compiled = launch.scenario.solve()
    blocks = from_launch([model], gpus=8).scenario.solve()
    assert compiled.total_memory < blocks.total_memory
    assert any(t.label == "logits (saved by the compiled loss)" for t in compiled.terms)
    assert not any(t.label == "log-softmax of the logits (fp32)" for t in compiled.terms)
    with pytest.raises(NotModelledError) as err:
        from_launch([loss], gpus=8)
    assert err.value.parameter == "compile.components" and err.value.value == ["loss"]


def test_saved_json_reads_as_the_toml(tmp_path):
    import tomllib
    path = DATA / "llama3" / "llama3_70b.toml"
    saved = tmp_path / "job_config.json"
    saved.write_text(json.dumps(tomllib.loads(path.read_text())))
    assert from_launch([saved], gpus=64).scenario == from_launch([path], gpus=64).scenario
    main = tmp_path / "resolved.json"      # a model_spec that is not the flavor's: refused, naming the key
    main.write_text(json.dumps({"model_spec": {"name": "llama3", "flavor": "8B", "model": {}}, "parallelism": {}}))
    with pytest.raises(NotModelledError, match="model_spec.model"):
        from_launch([main], gpus=8)


# --- torchtitan 0.3.0's resolved dumps (written by torchtitan itself; SOURCES.md) --------------------------

def test_the_dumps_are_listed_with_their_command():
    listed = (DATA / "SOURCES.md").read_text()
    assert len(RESOLVED) >= 10
    for path in RESOLVED:
        assert f"| resolved_0.3.0/{path.name} |" in listed
        assert json.loads(path.read_text())["debug"]["save_config_file"] == path.name     # torchtitan's own dump


@pytest.mark.parametrize("path", RESOLVED, ids=lambda p: p.name)
def test_every_dump_reads_end_to_end(path):
    try:
        launch = from_launch([path], gpus=64)
    except MlsysimError as err:
        assert isinstance(err, (InvalidInputError, NotModelledError)), err
        assert err.parameter in ("model_spec.flavor", "compile.components") or ".attention.wo." in err.parameter or \
            err.parameter.endswith(".attention.inner_attention"), err
        return
    try:
        launch.scenario.solve()
    except NotModelledError as err:
        assert err.parameter.split(".")[0] in launch.sources, err


def test_llama3_8b_dump_hand_derived():
    launch = from_launch([DATA / "resolved_0.3.0" / "llama3_8b.json"], gpus=8)
    s, o = launch.scenario, launch.scenario.profile_options
    # llama3_8b(): local batch 1, seq 8192, SelectiveAC (per-op), ChunkedLossWrapper(num_chunks=8), FSDP over 8
    assert (s.model, s.dp_size, s.batch_size, s.seq_len) == ("meta-llama/llama-3.1-8b", 8, 8, 8192)
    assert s.data_parallel == "fsdp" and s.activation_checkpointing == "op-sac"
    assert o["loss"] == "torchtitan_chunked" and o["loss_chunks"] == 8 and o["regime"] == "fsdp-bf16"
    reading = launch.readings[0]
    assert reading.framework_version == "torchtitan 0.3.0" and not reading.defaults     # resolved: no defaults
    approx = [f for f in reading.fields if f.approximated]
    assert [f.key for f in approx] == ["training.disable_cuda_graphs"]     # CUDA graphs on by default in 0.3.0
    assert "debug" in reading.ignored and "profiler" in reading.ignored
    s.solve()


def test_the_dump_and_the_v0_2_toml_of_one_run_agree_but_the_loss():
    toml = from_launch([DATA / "llama3" / "llama3_8b.toml"], gpus=8).scenario
    dump = from_launch([DATA / "resolved_0.3.0" / "llama3_8b.json"], gpus=8).scenario
    for field in ("model", "dp_size", "batch_size", "seq_len", "data_parallel", "activation_checkpointing"):
        assert getattr(toml, field) == getattr(dump, field), field
    assert (toml.profile_options["loss"], dump.profile_options["loss"]) == ("cross_entropy", "torchtitan_chunked")


def test_a_profile_refusal_names_the_dumps_key(capsys):
    # ChunkedLossWrapper under tp 2: the measured profile refuses the combination, naming where loss came from
    code, _ = run("estimate", "--from", str(DATA / "resolved_0.3.0" / "llama3_8b_tp2_noac.json"), "--gpus", "8")
    err = capsys.readouterr().err
    assert code == 2 and "loss comes from" in err and "llama3_8b_tp2_noac.json: loss" in err


def test_dump_with_cli_overrides_and_full_ac():
    s = from_launch([DATA / "resolved_0.3.0" / "llama3_8b_tp2_noac.json"], gpus=8).scenario
    assert (s.tp_size, s.dp_size, s.batch_size, s.activation_checkpointing, s.sequence_parallel) == (
        2, 4, 8, "none", True)
    s = from_launch([DATA / "resolved_0.3.0" / "llama3_70b.json"], gpus=64).scenario
    assert (s.tp_size, s.activation_checkpointing) == (8, "full")     # FullAC: the base fields only


def test_dump_refusals_name_the_key(tmp_path):
    lora = DATA / "resolved_0.3.0" / "llama3_debugmodel_float8_emulate_lora.json"
    with pytest.raises(NotModelledError, match=r"model_spec\.model\.layers\.0\.attention\.wo\."):
        from_launch([lora], gpus=8, model="meta-llama/Llama-3.1-8B")     # -m does not skip the key check
    with pytest.raises(NotModelledError) as err:
        from_launch([DATA / "resolved_0.3.0" / "deepseek_v3_671b.json"], gpus=64)
    assert err.value.parameter == "compile.components"     # ["loss"]: a compiled loss, not modelled
    doc = json.loads((DATA / "resolved_0.3.0" / "qwen3_0_6b.json").read_text())
    doc["model_spec"]["model"]["layers"] = doc["model_spec"]["model"]["layers"][:-1]
    doc["override"]["imports"] = []
    changed = tmp_path / "qwen3.json"
    changed.write_text(json.dumps(doc))
    with pytest.raises(NotModelledError) as err:
        from_launch([changed], gpus=8)
    assert err.value.parameter == "model_spec.model.layers"
    doc = json.loads((DATA / "resolved_0.3.0" / "qwen3_0_6b.json").read_text())
    doc["activation_checkpoint"] = {"preserve_rng_state": True, "determinism_check": "default", "debug": False,
                                    "memory_budget": 0.5, "visualize_memory_budget_pareto": False}
    changed.write_text(json.dumps(doc))
    with pytest.raises(NotModelledError, match="memory_budget"):
        from_launch([changed], gpus=8)


def test_cli_search_from():
    code, out = run("estimate", "--from", str(DATA / "llama3" / "llama3_70b.toml"), "--gpus", "64", "--json")
    assert code == 0 and json.loads(out)["launch"]["files"][0]["format"] == "torchtitan"


def test_the_loss_is_v0_2_2s_cross_entropy():
    # torchtitan v0.2.2 has no loss section: components/loss.py cross_entropy_loss upcasts the whole logits and
    # calls F.cross_entropy -> loss='cross_entropy', an implicit default with its source
    launch = from_launch([DATA / "llama3" / "llama3_70b.toml"], gpus=64)
    assert launch.scenario.profile_options["loss"] == "cross_entropy"
    default = next(d for r in launch.readings for d in r.defaults if d.field == "loss")
    assert "v0.2.2 torchtitan/components/loss.py" in default.source


def test_the_launchers_allocator_setting_said_not_assumed():
    """torchtitan's launcher exports expandable_segments:True, which a job config does not carry: the reader
    keeps the profile's fraction and says so, naming the setting that prices it on an FSDP-only layout. Given
    (as tools/launch_validation.py gives it for the published run), Llama 3.1 8B over 8 ranks: the reduce-scatter
    pool holds the fp32 gradient shards, 32 layers of 218,112,000 / 8 and the root group (the untied embedding
    and head, 2 x 128,256 x 4,096, and the final norm, 4,096) / 8, each a multiple of 512 B, the expandable
    segment mapped in 20 MiB pages (CUDACachingAllocator's kLargeBuffer)."""
    from mlsysim_core.scenario import Scenario
    launch = from_launch([DATA / "llama3" / "llama3_8b.toml"], gpus=8, hardware="h100")
    reading = launch.readings[0]
    assert not [d for d in reading.defaults if d.field == "runtime_overheads"]
    assert any("expandable_segments:True" in n and "'allocator': 'segments'" in n for n in reading.notes)
    plain = launch.scenario.solve()
    assert not any(t.label.startswith("allocator:") for t in plain.terms)
    document = launch.scenario.to_dict()
    document["runtime_overheads"] = {"allocator": "segments", "expandable_segments": True}
    result = Scenario.from_dict(document).solve()
    pool = next(t.nbytes for t in result.terms if t.label == "allocator: reduce-scatter stream pool")
    shards = 32 * (218_112_000 // 8 * 4) + (2 * 128_256 * 4_096 + 4_096) // 8 * 4
    assert shards == 4_015_130_624
    assert pool == -(-shards // (20 * 2**20)) * 20 * 2**20 == 4_026_531_840
    assert result.allocated_memory == plain.allocated_memory


def test_the_allocator_setting_noted_where_the_layout_is_not_described():
    """llama3_70b.toml on 16 GPUs: tensor parallel 8 under FSDP2 (shard 2), whose stream pools the allocator
    mechanism does not describe on a tp rank: the fraction, said in a note, no default. On 8 GPUs (shard 1: no
    FSDP) the mechanism describes tp 8, and the note says so."""
    alone = from_launch([DATA / "llama3" / "llama3_70b.toml"], gpus=8, hardware="h100").readings[0]
    assert any("runtime_overheads={'allocator': 'segments'" in n for n in alone.notes)
    assert not any("does not describe" in n for n in alone.notes)
    launch = from_launch([DATA / "llama3" / "llama3_70b.toml"], gpus=16, hardware="h100")
    reading = launch.readings[0]
    assert not [d for d in reading.defaults if d.field == "runtime_overheads"]
    assert any("expandable_segments" in n and "tp_size=8" in n for n in reading.notes)
    result = launch.scenario.solve()
    assert not any(t.label.startswith("allocator:") for t in result.terms)


def _edited(tmp_path, name, **sets):
    """A real TOML with some keys set, as the JSON --job.save_config_file writes (the reader takes no
    key=value overrides)."""
    import tomllib
    document = tomllib.loads((DATA / name).read_text())
    for dotted, value in sets.items():
        *parents, last = dotted.split("__")
        table = document
        for part in parents:
            table = table.setdefault(part, {})
        table[last] = value
    out = tmp_path / (Path(name).stem + ".json")
    out.write_text(json.dumps(document))
    return out


def test_compiled_blocks_under_pipeline_parallelism(tmp_path):
    """compile.enable with the blocks only (components ["model"]) under pipeline_parallel_degree 2, without
    checkpointing: the measured profile describes it (compile='blocks' under pp)."""
    path = _edited(tmp_path, "llama3/llama3_8b.toml", compile__enable=True, compile__components=["model"],
                   parallelism__pipeline_parallel_degree=2, activation_checkpoint__mode="none")
    launch = from_launch([path], gpus=8, hardware="h100")
    s = launch.scenario
    assert (s.pp_size, s.compile, s.activation_checkpointing) == (2, "blocks", "none")
    result = s.solve()
    assert any(n.startswith("compile='blocks'") for n in result.notes)
    # pp: the allocator mechanism does not describe it; the fraction, said
    assert any("pp_size=2" in n for n in launch.readings[0].notes)


def test_compiled_blocks_with_full_checkpointing_is_torchtitans_order(tmp_path):
    """activation_checkpoint.mode full + compile: apply_ac, then apply_compile (the profile's priced order) on
    one device and under FSDP2 (apply_fsdp after them: compile.fsdp2_around_blocks, measured in
    validation/compile/measure_blocks_fsdp.py's -full-in- runs); with an all-gather prefetch limit the profile
    refuses it, naming activation_checkpointing, which the launch traces to activation_checkpoint.mode."""
    path = _edited(tmp_path, "llama3/llama3_8b.toml", compile__enable=True, compile__components=["model"],
                   activation_checkpoint__mode="full")
    one = from_launch([path], gpus=1, hardware="h100")
    result = one.scenario.solve()
    assert any(n.startswith("compile='blocks' with full checkpointing: torchtitan's order") for n in result.notes)
    eight = from_launch([path], gpus=8, hardware="h100")
    result = eight.scenario.solve()
    assert any(n.startswith("compile='blocks' with full checkpointing under data parallelism") for n in result.notes)
    assert any(t.label == "FSDP2 around the compiled blocks' recompute and backward" for t in result.terms)
    prefetching = attrs.evolve(eight.scenario, plugin_options={"fsdp": {"prefetch_layers": 2}})
    with pytest.raises(NotModelledError) as err:
        prefetching.solve()
    assert err.value.parameter == "activation_checkpointing" and err.value.value == "full"
    assert eight.sources["activation_checkpointing"].endswith("activation_checkpoint.mode")


def test_compiled_blocks_under_torchtitans_tp_plan_refused_naming_sequence_parallel(tmp_path):
    """torchtitan's TP plan is always sequence-parallel: compiled blocks with it are not measured."""
    path = _edited(tmp_path, "llama3/llama3_8b.toml", compile__enable=True, compile__components=["model"],
                   parallelism__tensor_parallel_degree=2, activation_checkpoint__mode="none")
    launch = from_launch([path], gpus=8, hardware="h100")
    with pytest.raises(NotModelledError) as err:
        launch.scenario.solve()
    assert err.value.parameter == "sequence_parallel" and err.value.value is True
    assert "tensor_parallel_degree" in launch.sources["sequence_parallel"]


# --- gpt-oss: FlexAttention with the sinks through its log-sum-exp (torchtitan's model code) -----------------

def test_gpt_oss_flex_dump_priced_by_the_kernel_declaring_flex_and_lse():
    """gpt_oss_20b with model_registry's attn_backend="flex" (a dump torchtitan 0.3.0 wrote, SOURCES.md): every
    layer's inner attention has FlexAttention.Config's fields, so attention is the registered kernel declaring
    computes='flex', sinks='lse' (the built-in flex_attention), approximated (the sigmoid renormalisation's
    bytes, said). Hand-derived: the BlockMasks, 2 layer types (sliding and full) x 4 int32 tensors x b 1 x
    (64^2 + 64) x 4 B at s 8192 (64 blocks of 128) = 133,120 B; no eager scores or masks."""
    launch = from_launch([DATA / "resolved_0.3.0" / "gpt_oss_20b_flex.json"], gpus=8, hardware="h100")
    s = launch.scenario
    assert (s.model, s.seq_len, s.batch_size, s.activation_checkpointing) == ("openai/gpt-oss-20b", 8192, 8, "full")
    assert s.profile_options["attention"] == "flex_attention"
    field = next(f for r in launch.readings for f in r.fields if f.field == "attention")
    assert field.key == "model_spec.model.layers.0.attention.inner_attention" and field.approximated
    assert field.value == {"block_size": 128, "kernel_options": {}}
    assert "sigmoid(lse - sink)" in field.note and "computes='flex', sinks='lse'" in field.note
    assert launch.sources["attention"].endswith("gpt_oss_20b_flex.json: " + field.key)
    result = s.solve()
    masks = [t.nbytes for t in result.terms if t.label == "flex_attention block masks (saved by every layer)"]
    assert masks == [2 * 4 * 1 * (64 * 64 + 64) * 4] == [133_120]
    assert not any("eager attention masks" in t.label or "with the sink" in t.label for t in result.terms)


def test_gpt_oss_kernel_chosen_by_declaration_not_name():
    """The reader asks each registered kernel what it computes: the flex kernel registered under another name
    is chosen by that name; with no kernel declaring computes='flex', sinks='lse' the dump is refused naming
    its key."""
    import attrs
    from mlsysim_core.manager import get_plugin_manager
    from mlsysim_plugins.measured.kernels import FLEX_ATTENTION, SDPA
    registry = get_plugin_manager().registry
    hook = "mlsysim_measured_attention_kernels"
    path = DATA / "resolved_0.3.0" / "gpt_oss_20b_flex.json"
    renamed = attrs.evolve(registry, extensions={**registry.extensions, hook: {
        "sdpa": SDPA, "sink-fused": attrs.evolve(FLEX_ATTENTION, name="sink-fused")}})
    assert from_launch([path], gpus=8, registry=renamed).scenario.profile_options["attention"] == "sink-fused"
    none = attrs.evolve(registry, extensions={**registry.extensions, hook: {"sdpa": SDPA}})
    with pytest.raises(NotModelledError) as err:
        from_launch([path], gpus=8, registry=none)
    assert err.value.parameter == "model_spec.model.layers.0.attention.inner_attention"
    assert "computes='flex' and sinks='lse'" in str(err.value)


def test_gpt_oss_varlen_dump_refused_naming_the_inner_attention():
    """torchtitan 0.3.0's gpt_oss_20b as the registry writes it: VarlenAttention (model_registry's default
    backend: window_size, no block_size), which no registered kernel declares: refused naming the key, never
    priced as eager."""
    path = DATA / "resolved_0.3.0" / "gpt_oss_20b.json"
    with pytest.raises(NotModelledError) as err:
        from_launch([path], gpus=8)
    assert err.value.parameter == "model_spec.model.layers.0.attention.inner_attention"
    assert err.value.value == {"window_size": [127, 0]} and "VarlenAttention" in str(err.value)
    code, _ = run("estimate", "--from", str(path), "--gpus", "8", "-g", "h100")
    assert code == 2


def test_gpt_oss_v0_2_toml_is_flex_attention():
    """v0.2.2's gpt-oss runs FlexAttention only (model/args.py attn_type "flex"): the real debug_model.toml
    with -m (its debugmodel flavor is not in the catalog) maps model.name to the flex kernel."""
    path = DATA / "gpt_oss" / "debug_model.toml"
    with pytest.raises(NotModelledError) as err:
        from_launch([path], gpus=8)
    assert err.value.parameter == "model.flavor"
    launch = from_launch([path], gpus=8, model="openai/gpt-oss-20b", hardware="h100")
    assert launch.scenario.profile_options["attention"] == "flex_attention"
    assert launch.sources["attention"].endswith("debug_model.toml: model.name")
    launch.scenario.solve()


def test_cli_estimate_from_the_gpt_oss_flex_dump():
    code, out = run("estimate", "--from", str(DATA / "resolved_0.3.0" / "gpt_oss_20b_flex.json"), "--gpus", "8",
                    "-g", "h100", "--json")
    assert code == 0
    document = json.loads(out)
    fields = [f for f in document["launch"]["files"][0]["fields"] if f["field"] == "attention"]
    assert fields[0]["becomes"] == "flex_attention"


def test_deepseek_16b_flavor_and_the_compiled_chunked_loss_refused(tmp_path):
    """The 16B flavor is DeepSeek-V2-Lite's architecture (checked field by field against the catalog's); the
    dump's compile.enable with components ["loss"] compiles ChunkedLossWrapper's inner CrossEntropyLoss, which
    the measured profile has no form of: refused naming compile.components."""
    path = DATA / "resolved_0.3.0" / "deepseek_v3_16b.json"
    with pytest.raises(NotModelledError) as err:
        from_launch([path], gpus=8)
    assert err.value.parameter == "compile.components" and err.value.value == ["loss"]
    assert "ChunkedLossWrapper's inner CrossEntropyLoss" in str(err.value)
    document = json.loads(path.read_text())
    document["compile"]["enable"] = False      # the chunked loss eager: read, the flavor the catalog's V2-Lite
    eager = tmp_path / "deepseek_v3_16b.json"
    eager.write_text(json.dumps(document))
    s = from_launch([eager], gpus=8).scenario
    assert s.model == "deepseek-ai/deepseek-v2-lite" and s.profile_options["loss"] == "torchtitan_chunked"


def test_pipeline_stages_split_as_torchtitan_splits_them(tmp_path):
    """1F1B/GPipe: generate_llm_fqn_per_model_part counts the embedding and the output as one layer each by default
    (pipeline_parallel_first/last_stage_less_layers = 1): llama4_17bx128e.toml, 48 layers over pp 4: 50 effective,
    12 each and the first two stages 13: [13 - 1, 13, 12, 12 - 1] = [12, 13, 12, 11], an implicit default with its
    source. Given weights: llama3_8b (32 layers) over pp 2 with 0 and 2: 34 / 2 = 17 each, [17, 15]. A weight
    above a stage's share is refused naming the key; an interleaved schedule keeps the even split, said."""
    launch = from_launch([DATA / "llama4" / "llama4_17bx128e.toml"], gpus=256)
    assert launch.scenario.profile_options["stage_layers"] == [12, 13, 12, 11]
    default = next(d for r in launch.readings for d in r.defaults if d.field == "stage_layers")
    assert "generate_llm_fqn_per_model_part" in default.source
    path = _edited(tmp_path, "llama3/llama3_8b.toml", parallelism__pipeline_parallel_degree=2,
                   parallelism__pipeline_parallel_first_stage_less_layers=0,
                   parallelism__pipeline_parallel_last_stage_less_layers=2)
    launch = from_launch([path], gpus=8)
    assert launch.scenario.profile_options["stage_layers"] == [17, 15]
    assert launch.sources["stage_layers"].endswith(
        "parallelism.pipeline_parallel_first_stage_less_layers/parallelism.pipeline_parallel_last_stage_less_layers")
    path = _edited(tmp_path, "llama3/llama3_8b.toml", parallelism__pipeline_parallel_degree=8,
                   parallelism__pipeline_parallel_last_stage_less_layers=5)      # 38 / 8: 4 a stage, 5 > 4
    with pytest.raises(InvalidInputError) as err:
        from_launch([path], gpus=8)
    assert err.value.parameter == "parallelism.pipeline_parallel_last_stage_less_layers"
    path = _edited(tmp_path, "llama3/llama3_8b.toml", parallelism__pipeline_parallel_degree=2,
                   parallelism__pipeline_parallel_schedule="Interleaved1F1B")
    launch = from_launch([path], gpus=8)
    assert "stage_layers" not in launch.scenario.profile_options
    assert any("generate_llm_fqn_per_model_part" in n for n in launch.readings[0].notes)
