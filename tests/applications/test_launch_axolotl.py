"""The axolotl launch reader (plugins/mlsysim_plugins/launch/axolotl.py): every copied config read
end to end (an answer or a refusal naming the field, never a traceback), every key accounted
for, hand-derived checks of what the fields became, its deepspeed: JSON, and the CLI."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mlsysim_core.errors import MlsysimError, PluginContractError
from mlsysim_core.manager import get_plugin_manager
from mlsysim_core.scenario import LaunchContext, from_launch, launch_format_for, launch_formats, parse_launch_file

DATA = Path(__file__).resolve().parents[1] / "data" / "launch"
AX = DATA / "axolotl"
FILES = sorted(p for p in (AX / "examples").rglob("*.y*ml"))
REFUSED = {"llama-3/3b-fp8-fsdp2.yaml": "fp8_enable_fsdp_float8_all_gather",     # fp8 is read (float8); FSDP2's fp8 all-gather is not modelled
               # paged_adamw_32bit: not modelled
           "mistral/bigstral/bigstral-ds-zero3.yaml": "unfrozen_parameters"}


def accounted(reading):
    import re
    keys = {re.split(r"[.\[ /]", f.key)[0] for f in reading.fields}
    keys.update(reading.ignored)
    keys.update(n.split("=")[0] for n in reading.notes)
    return keys


def test_enough_files():
    assert len(FILES) >= 12


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(AX / "examples")))
def test_every_file_read_or_refused_naming_the_field(path):
    registry = get_plugin_manager().registry
    document = parse_launch_file(path)
    assert launch_format_for(path, document, registry).name == "axolotl"
    name = str(path.relative_to(AX / "examples"))
    try:
        reading = launch_formats(registry)["axolotl"].read(path, document, LaunchContext(registry=registry))
    except PluginContractError:
        raise
    except MlsysimError as err:
        assert name in REFUSED, f"unexpected refusal: {err}"
        assert str(path) in err.parameter and err.parameter.endswith(REFUSED[name]), err.parameter
        return
    assert name not in REFUSED
    missing = set(document) - accounted(reading)
    assert not missing, f"keys not accounted for: {missing}"
    assert from_launch([path], gpus=1, hardware="h100").scenario.model


def test_full_fine_tune_8b():
    """fft-8b.yaml: bf16 auto -> the model in bf16 (pure bf16 bytes), paged 8-bit AdamW, packed
    8192-token rows, micro-batch 1 x accumulation 8, checkpointing on."""
    launch = from_launch([AX / "examples/llama-3/fft-8b.yaml"], gpus=1, hardware="h100")
    s = launch.scenario
    assert (s.model, s.seq_len, s.batch_size, s.gradient_accumulation_steps) == ("meta-llama/llama-3.1-8b", 8192, 8, 8)
    assert s.optimizer == "paged-adamw-8bit-bnb-hf" and s.activation_checkpointing == "full"
    assert s.profile_options["regime"] == "bf16" and s.profile_options["attention"] == "sdpa"
    result = s.solve()
    params = 8_030_261_248
    assert result.weights == pytest.approx(2 * params, rel=1e-6)     # bf16 weights
    assert result.gradients == pytest.approx(2 * params, rel=1e-6)   # bf16 gradients


def test_defaults_are_the_schemas(tmp_path):
    f = tmp_path / "c.yml"
    f.write_text("base_model: meta-llama/Llama-3.2-1B\ndatasets:\n  - path: x\n    type: alpaca\n")
    launch = from_launch([f], gpus=1, hardware="h100")
    s = launch.scenario
    # sequence_len 512 (no packing: the maximum), micro_batch_size 1, accumulation 1,
    # optimizer adamw_torch_fused, gradient checkpointing off, bf16 auto
    assert (s.seq_len, s.batch_size, s.optimizer, s.activation_checkpointing) == (512, 1, "adamw", "none")
    assert s.profile_options["optimizer_impl"] == "fused" and s.precision == "bf16"
    sources = {d.key: d.source for r in launch.readings for d in r.defaults}
    assert "schemas/config.py:665" in sources["sequence_len"] and "schemas/training.py:122" in sources["optimizer"]
    assert all(d.version == "axolotl 0.18.0" for r in launch.readings for d in r.defaults if d.key != "attn_implementation")


def test_lora_8bit_and_length(tmp_path):
    launch = from_launch([AX / "examples/llama-3/instruct-lora-8b.yml"], gpus=1, hardware="h100", seq_len=1024)
    s = launch.scenario
    assert s.profile_options["lora"] == {"rank": 32, "target_modules": "all-linear", "quantization": "int8",
                                         "dropout": 0.05}      # peft's lora_dropout, priced (issue 25 item 2)
    assert s.seq_len == 1024     # not packed: --seq-len, not the config's 4096
    assert any(f.key == "lora_dropout" and not f.approximated for r in launch.readings for f in r.fields)


def test_modules_to_save_dora_and_compile_read(tmp_path):
    """lora_modules_to_save, peft_use_dora and torch_compile become the measured profile's options."""
    launch = from_launch([AX / "examples/llama-3/lora-8b.yml"], gpus=1, hardware="h100", seq_len=1024)
    assert "modules_to_save" in launch.scenario.profile_options["lora"]
    text = (AX / "examples/llama-3/instruct-lora-8b.yml").read_text() + "\npeft_use_dora: true\ntorch_compile: true\n"
    path = tmp_path / "instruct-lora-8b.yml"
    path.write_text(text)
    s = from_launch([path], gpus=1, hardware="h100", seq_len=1024).scenario
    assert s.profile_options["lora"]["use_dora"] is True and s.profile_options["compile"] is True


def test_qlora_nf4_double_quant_and_fsdp():
    launch = from_launch([AX / "examples/llama-3/qlora-fsdp-70b.yaml"], gpus=2, hardware="h100")
    o = launch.scenario.profile_options
    assert o["lora"]["quantization"] == "nf4" and o["lora"]["double_quant"] is True
    # axolotl stores QLoRA's codes in bf16 (067b021c src/axolotl/loaders/model.py line 720): FSDP's policy over the
    # bf16-stored base, fp32 adapters (fsdp-bf16-stored; not accelerate's fp32 shards of fsdp-bf16-reduce-bf16)
    assert o["regime"] == "fsdp-bf16-stored" and o["offload"] == "optimizer+gradients+parameters"
    assert launch.scenario.data_parallel == "fsdp" and launch.scenario.seq_len == 512


def test_fsdp_config_alone_derives_the_qlora_regime(tmp_path):
    """axolotl's fsdp_config with fsdp_version and no fsdp: list (FSDP2 through its own table): a 4-bit base stored
    in bf16 (067b021c src/axolotl/loaders/model.py line 720) gives fsdp-bf16-stored; the same file without
    load_in_4bit (LoRA over the bf16 base) accelerate's fsdp-bf16-reduce-bf16."""
    import yaml
    doc = yaml.safe_load((AX / "examples/llama-3/qlora-fsdp-70b.yaml").read_text())
    doc.pop("fsdp")
    doc["fsdp_version"] = 2
    doc["fsdp_config"] = {"reshard_after_forward": True, "offload_params": False}
    f = tmp_path / "q.yaml"
    f.write_text(yaml.safe_dump(doc))
    field = next(x for r in from_launch([f], gpus=2, hardware="h100").readings for x in r.fields if x.field == "regime"
                 and x.key.startswith("fsdp_config"))
    assert (field.becomes, field.derived_from) == ("fsdp-bf16-stored", ("precision", "lora"))
    assert from_launch([f], gpus=2, hardware="h100").scenario.profile_options["regime"] == "fsdp-bf16-stored"
    f.write_text(yaml.safe_dump({**doc, "adapter": "lora", "load_in_4bit": False}))
    assert from_launch([f], gpus=2, hardware="h100").scenario.profile_options["regime"] == "fsdp-bf16-reduce-bf16"


def test_liger_fused_linear_loss():
    launch = from_launch([AX / "examples/llama-3/fft-8b-liger-fsdp.yaml"], gpus=8, hardware="h100")
    assert launch.scenario.profile_options["loss"] == "fused_linear"
    field = next(f for r in launch.readings for f in r.fields if f.field == "loss")     # liger_fused_linear_cross_entropy
    assert field.key == "liger_fused_linear_cross_entropy" and not field.approximated     # -> --loss fused_linear
    assert any(n.startswith("liger_rms_norm=") for r in launch.readings for n in r.notes)


def test_deepspeed_json_from_the_config(tmp_path):
    (tmp_path / "deepspeed_configs").mkdir()
    shutil.copy(AX / "deepspeed_configs/zero2.json", tmp_path / "deepspeed_configs/zero2.json")
    f = tmp_path / "c.yml"
    f.write_text("base_model: mistralai/Mistral-7B-v0.1\nsequence_len: 2048\nsample_packing: true\n"
                 "micro_batch_size: 2\ngradient_checkpointing: true\ndeepspeed: deepspeed_configs/zero2.json\n")
    launch = from_launch([f], gpus=4, hardware="h100")
    s = launch.scenario
    assert s.zero_stage == 2 and s.profile_options["regime"] == "mixed-bf16"     # DeepSpeed's engine
    assert s.batch_size == 2 * 4


def test_unknown_key_refused(tmp_path):
    f = tmp_path / "c.yml"
    f.write_text("base_model: meta-llama/Llama-3.2-1B\nfrobnicate: 1\n")
    with pytest.raises(MlsysimError, match="frobnicate"):
        from_launch([f], gpus=1, hardware="h100")


@pytest.mark.long     # (a subprocess check)
def test_cli():
    out = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--from",
                          str(AX / "examples/llama-3/fft-8b.yaml"), "--gpus", "1", "-g", "h100"],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "paged_adamw_8bit" in out.stdout and "from launch files" in out.stdout
    refused = subprocess.run([sys.executable, "-m", "mlsysim_core", "estimate", "--from",
                              str(AX / "examples/llama-3/lora-8b.yml"), "--gpus", "1", "-g", "h100"],
                             capture_output=True, text=True)
    assert refused.returncode == 2 and "lora_modules_to_save" in refused.stderr and "Traceback" not in refused.stderr


def test_cut_cross_entropy_plugin(tmp_path):
    # plugins: [...CutCrossEntropyPlugin] (cut_cross_entropy not false) -> --loss cut_cross_entropy (read)
    import yaml
    doc = yaml.safe_load((AX / "examples/llama-3/fft-8b-liger-fsdp.yaml").read_text())
    for key in [k for k in doc if k.startswith("liger_")]:
        doc.pop(key)
    doc["plugins"] = ["axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin"]
    doc["cut_cross_entropy"] = True
    f = tmp_path / "cce.yaml"
    f.write_text(yaml.safe_dump(doc))
    launch = from_launch([f], gpus=8, hardware="h100")
    field = next(f for r in launch.readings for f in r.fields if f.field == "loss")
    assert (field.key, field.becomes, field.approximated) == ("plugins", "cut_cross_entropy", False)
    assert launch.scenario.solve().total_memory > 0
    # the ministral QLoRA example's CCE plugin: the same mapping (its model is not in the catalog: -m)
    launch = from_launch([AX / "examples/ministral/ministral-small-qlora.yaml"], gpus=1, hardware="h100",
                         model="mistralai/Mistral-7B-v0.1")
    assert launch.scenario.profile_options["loss"] == "cut_cross_entropy"


def test_the_readme_era_configs_read():
    # examples/llama-3/README.md's VRAM lines were written with the configs of 15f7910d (SOURCES.md): read them
    listed = (AX / "SOURCES.md").read_text()
    era = sorted((AX / "readme_15f7910d").rglob("*.y*ml"))
    assert len(era) == 3
    for path in era:
        assert f"`{path.relative_to(AX)}`" in listed and "15f7910d33b41282f8c4fc1c4ca374b1b5965f2b" in listed
        launch = from_launch([path], gpus=2 if "70b" in path.name else 1, hardware="nvidia/l40s")
        assert launch.scenario.seq_len == {"fft-8b.yaml": 8192, "lora-8b.yml": 4096,
                                           "qlora-fsdp-70b.yaml": 512}[path.name]
        launch.scenario.solve()
    lora = from_launch([AX / "readme_15f7910d" / "llama-3" / "lora-8b.yml"], gpus=1).scenario
    assert lora.model == "meta-llama/llama-2-7b-hf" and lora.profile_options["lora"]["quantization"] == "int8"


def test_lora_8b_readme_figure_is_below_the_configs_floor():
    # docs/launch-hf.md: the README's "11GB" for lora-8b.yml (15f7910d) is below what the file must hold at
    # the loss on its pinned stack (transformers 4.40: fp32 logits, their shifted copy, the log-softmax):
    # weights + 32 checkpointed inputs + three fp32 (T - 1) x V, T = 2 x 4096 packed into one row.
    launch = from_launch([AX / "readme_15f7910d" / "llama-3" / "lora-8b.yml"], gpus=1, hardware="nvidia/l40s")
    result = launch.scenario.solve()
    int8_linears = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)              # 6,476,005,376 B at 1 B
    bf16_frozen = 2 * (2 * 32000 * 4096 + (2 * 32 + 1) * 4096)            # embeddings, LM head, norms
    adapters = 4 * 32 * 32 * (4 * (4096 + 4096) + 3 * (4096 + 11008))    # fp32, rank 32, every linear
    scales = 4 * 32 * (4 * 4096 + 2 * 11008 + 4096)                        # one fp32 per output row
    rope = 2 * 64 * 4                                                       # the inv_freq buffers (fp32)
    assert result.weights == int8_linears + bf16_frozen + adapters + scales + rope == 7_326_081_536
    floor = result.weights + 32 * 8192 * 4096 * 2 + 3 * 4 * 8191 * 32000
    assert floor == 12_618_909_184 and floor / 2**30 > 11.75 > 11
    assert result.allocated_memory >= floor


@pytest.mark.parametrize("checkpointing", [True, False])
def test_torch_compile_with_lora_answers_or_names_the_files_key(tmp_path, checkpointing):
    """axolotl's lora-1b.yml with torch_compile (the HF Trainer compiles the whole peft model): the measured
    profile answers (compile=True with peft's LoRA) or refuses naming a parameter the launch traces to the
    file's key (here the all-linear targets in bf16 and the dropout: refused by name), never a traceback."""
    import yaml
    from mlsysim_core.errors import NotModelledError
    source = DATA / "axolotl" / "examples" / "llama-3" / "lora-1b.yml"
    document = yaml.safe_load(source.read_text())
    document.update(torch_compile=True, gradient_checkpointing=checkpointing)
    path = tmp_path / source.name
    path.write_text(yaml.safe_dump(document))
    launch = from_launch([path], gpus=1, hardware="h100")
    assert launch.scenario.compile is True
    assert any(f.key == "torch_compile" and f.field == "compile" for r in launch.readings for f in r.fields)
    try:
        result = launch.scenario.solve()
    except NotModelledError as err:
        key = launch.sources[str(err.parameter).split(".")[0]]
        assert key.startswith(f"{path}: "), (err, key)
    else:
        assert any("compile" in n for n in result.notes)


def test_fsdp2_reshard_after_forward_false_accumulates_under_set_requires_gradient_sync(tmp_path):
    """axolotl's FSDP2 with reshard_after_forward false (its llama-3/3b-fp8-fsdp2.yaml without fp8 and torch_compile, 4 micro-batches):
    SHARD_GRAD_OP, and accelerate's no_sync under FSDP2 is set_requires_gradient_sync(False) (accelerate 1.16.0
    accelerator.py lines 1126-1131): the fsdp-grad-op rule's gradient_sync='step' (it was dropped)."""
    import yaml
    doc = yaml.safe_load((AX / "examples/llama-3/3b-fp8-fsdp2.yaml").read_text())
    del doc["fp8"], doc["fp8_enable_fsdp_float8_all_gather"], doc["torch_compile"]
    doc["fsdp_config"]["reshard_after_forward"] = False
    doc["gradient_accumulation_steps"] = 4
    path = tmp_path / "3b-fsdp2.yaml"
    path.write_text(yaml.safe_dump(doc))
    s = from_launch([path], gpus=8, hardware="h100").scenario
    assert (s.data_parallel, s.plugin_options) == ("fsdp-grad-op", {"fsdp-grad-op": {"gradient_sync": "step"}})
    assert s.gradient_accumulation_steps == 4
    doc["gradient_accumulation_steps"] = 1      # the option is said, and acts only with accumulation
    path.write_text(yaml.safe_dump(doc))
    launch = from_launch([path], gpus=8, hardware="h100")
    assert not any("accumulated over micro-batches" in t.label for t in launch.scenario.solve().terms)


def test_ministral_qlora_reads_the_catalog_model_and_prices_cce_under_lora():
    """examples/ministral/ministral-small-qlora.yaml: base_model Ministral-8B-Instruct-2410 is in the curated
    catalog (its config.json: 36 layers, hidden 4096, MLP 12288, vocab 131072, untied; 8,019,808,256
    parameters); the file is read, and its CutCrossEntropyPlugin under LoRA is priced with the classifier frozen
    (published_losses.cut_cross_entropy_terms: e saved, no dc): no T x V tensor; with the default cross-entropy
    the same run holds the fp32 logits of 2 x 2048 tokens x 131072."""
    from mlsysim_core.catalog import get_model
    launch = from_launch([AX / "examples/ministral/ministral-small-qlora.yaml"], gpus=1, hardware="h100")
    s = launch.scenario
    assert s.model == "mistralai/ministral-8b-instruct-2410"
    m = get_model(s.model)
    assert (m.layers, m.hidden_dim, m.ffn_dim, m.vocab_size, m.tied_embeddings) == (36, 4096, 12288, 131072, False)
    assert m.parameters == 36 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 12288 + 2 * 4096) \
        + 2 * 131072 * 4096 + 4096 == 8_019_808_256
    assert (s.batch_size, s.seq_len, s.gradient_accumulation_steps) == (8, 2048, 4)
    assert s.profile_options["loss"] == "cut_cross_entropy"
    r = s.solve()
    T, h, V = 2 * 2048, 4096, 131072
    cce = {t.label: t.nbytes for t in r.terms if t.label.startswith("CCE")}
    assert cce["CCE: the LM head's input e (saved; the classifier frozen)"] == 2 * T * h
    assert cce["CCE: per-vocabulary logit average (fp32)"] == 4 * V
    assert not any(n >= T * V for n in cce.values()) and any("unvalidated" in n for n in r.notes)
    from mlsysim_core.scenario import Scenario
    plain = Scenario.from_dict({k: v for k, v in s.to_dict().items() if k != "loss"}).solve()
    assert any(t.label == "log-softmax of the logits (fp32)" for t in plain.terms)
    assert plain.total_memory - r.total_memory > 4 * T * V      # at least the fp32 logits


@pytest.mark.parametrize("name, regime", [("fft-8b-liger-fsdp.yaml", "fsdp-fp16-reduce-fp16"),
                                          ("qlora-fsdp-70b.yaml", "fsdp-fp16-stored")])
def test_fp16_with_fsdp_takes_the_fp16_regime_with_bf16s_bytes(tmp_path, name, regime):
    """fp16: true (bf16: false) with fsdp: (before: refused, the fp16 precision against a bf16 regime): accelerate's
    FSDP policy in fp16 (1.16.0 utils/dataclasses.py lines 2008-2013) with its loss scaler; a full fine-tune
    fsdp-fp16-reduce-fp16, QLoRA fsdp-fp16-stored (axolotl stores the codes in bf16, model.py line 720, and the
    policy follows the storage: 2 B either way). Every term's bytes equal the bf16 run's."""
    import yaml
    doc = yaml.safe_load((AX / "examples/llama-3" / name).read_text())
    path = tmp_path / name
    path.write_text(yaml.safe_dump({**doc, "bf16": False, "fp16": True}))
    s = from_launch([path], gpus=8, hardware="v100").scenario
    assert (s.profile_options["regime"], s.precision, s.data_parallel) == (regime, "fp16", "fsdp")
    field = next(x for r in from_launch([path], gpus=8, hardware="v100").readings for x in r.fields
                 if x.field == "regime" and x.key == "fsdp")
    assert field.becomes == regime and not field.approximated and "loss scaler" in field.note
    path.write_text(yaml.safe_dump({**doc, "bf16": True}))
    b = from_launch([path], gpus=8, hardware="v100").scenario
    assert b.profile_options["regime"] == regime.replace("fp16", "bf16")
    one, two = s.solve(), b.solve()
    assert [t.nbytes for t in one.terms] == [t.nbytes for t in two.terms] and one.total_memory == two.total_memory
