"""The fsdp rule's ``gradient_sync``: FULL_SHARD gradient accumulation without communication (FSDP1's ``no_sync()``,
FSDP2's ``set_requires_gradient_sync(False)``), every phase against PyTorch's tracker on one rank of a fake
process-group world (validation/fsdp_no_sync/measurements.json, made by validation/fsdp_no_sync/measure.py with
torch 2.13.0 CPU and transformers 5.23.0), and the launch readers that select it."""

import json
from pathlib import Path

import pytest

from mlsysim_core import HardwareNode, TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, BACKWARD_END, COMMUNICATION_BUFFERS, FORWARD, OPTIMIZER_STEP

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = ROOT / "validation" / "fsdp_no_sync" / "measurements.json"
LITGPT = ROOT / "tests" / "data" / "launch" / "litgpt"
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
PHASES = {"forward": (FORWARD,), "backward": (BACKWARD, BACKWARD_END), "optimizer": (OPTIMIZER_STEP,)}
HOW = {"fsdp1": "no_sync", "fsdp2": "step", "hsdp1": "no_sync", "hsdp2": "step"}
RULE = {"fsdp1": "fsdp", "fsdp2": "fsdp", "hsdp1": "hsdp", "hsdp2": "hsdp"}
FSDP1 = ("fsdp1", "hsdp1")      # FullyShardedDataParallel: the rule's fsdp_version=1
SHARD_GROUP = 2     # the hsdp runs' (replicate 2, shard 2) mesh
PRECISION = {"fp32": "fp32", "fsdp-fp16-reduce-fp16": "fp16"}     # the runs' precision (else bf16)


def _runs():
    return [run for run in json.loads(MEASUREMENTS.read_text(encoding="utf-8"))["runs"]
            if run.get("measured") and run["kind"] in RULE]


def _solve(run, gradient_sync=None, fsdp_version=None):
    """The run as measured: one rank of ``world_size``, m micro-batches of ``batch_size`` each; FSDP1's runs with
    ``fsdp_version=1`` unless another is given."""
    m, w = run["microbatches"], run["world_size"]
    sync = gradient_sync or (HOW[run["kind"]] if m > 1 else None)
    rule = RULE[run["kind"]]
    version = fsdp_version or (1 if run["kind"] in FSDP1 else None)
    options = {**({"gradient_sync": sync} if sync else {}), **({"shard_group_size": SHARD_GROUP} if rule == "hsdp"
                                                               else {}),
               **({"fsdp_version": version} if version else {})}
    return TrainingMemoryModel("measured").solve(
        from_hf_config(run["hf_config"], name=run["model"]), BIG, run["batch_size"] * w * m, run["seq_len"],
        PRECISION.get(run["regime"], "bf16"), run["optimizer"], "none", regime=run["regime"],
        optimizer_impl=run["optimizer_impl"], attention=run["attention"], runtime_overheads=False, dp_size=w,
        data_parallel=rule, gradient_accumulation_steps=m, plugin_options={rule: options} if options else None)


def _phases(result) -> dict:
    return {name: max(sum(t.nbytes for t in result.terms if p in t.phases) for p in ours)
            for name, ours in PHASES.items()}


def test_measurements_cover_both_apis_with_and_without_accumulation():
    runs = _runs()
    data = json.loads(MEASUREMENTS.read_text(encoding="utf-8"))
    assert "fsdp_no_sync/measure.py" in data["generator"]
    assert data["environment"]["torch"].split("+")[0] == "2.13.0"
    assert {(r["kind"], r["microbatches"]) for r in runs} == {(k, m) for k in RULE for m in (1, 4)}
    assert {r["regime"] for r in runs} == {"fp32", "bf16", "fsdp-bf16-reduce-bf16", "fsdp-fp16-reduce-fp16"}
    # accelerate's bf16 and fp16 policies (param_dtype = reduce_dtype = the 16-bit dtype over fp32 parameters),
    # FSDP1 and FSDP2
    for regime in ("fsdp-bf16-reduce-bf16", "fsdp-fp16-reduce-fp16"):
        assert {(r["kind"], r["microbatches"]) for r in runs if r["regime"] == regime} == {
            (k, m) for k in ("fsdp1", "fsdp2") for m in (1, 4)}


@pytest.mark.parametrize("run", _runs(), ids=lambda r: r["id"])
def test_every_phase_within_one_percent(run):
    """Every phase within 1 % (FULL_SHARD and HYBRID_SHARD, FSDP1 and FSDP2, with and without accumulation); in
    fact within 0.003 % (at most 6.3 kB off)."""
    predicted = _phases(_solve(run))
    measured = {name: run["measured"]["peak_by_phase"][name]["bytes"] for name in PHASES}
    for name in PHASES:
        assert abs(predicted[name] / measured[name] - 1) < 0.01, (name, predicted[name], measured[name])
        assert abs(predicted[name] - measured[name]) <= 0.00003 * measured[name], (name, predicted, measured)


@pytest.mark.parametrize("run", [r for r in _runs() if r["kind"] in FSDP1], ids=lambda r: r["id"])
def test_fsdp1_forward_holds_no_gathered_layer(run):
    """FSDP1 frees every unit but the root after its forward (torch 2.13 _runtime_utils.py _post_forward_reshard):
    with ``fsdp_version=1`` the forward holds one decoder layer's gathered parameters less than FSDP2's (the
    default), by hand: the layer's parameters on the rank before sharding x the gathered bytes; the backward and the
    step do not move. Priced as FSDP2 the measured forward is over by that layer (+0.43 to +1.05 %)."""
    one, two = _solve(run), _solve(run, fsdp_version=2)
    p1, p2 = _phases(one), _phases(two)
    hf = run["hf_config"]
    h, i, heads, kv = hf["hidden_size"], hf["intermediate_size"], hf["num_attention_heads"], hf["num_key_value_heads"]
    d = h // heads
    layer = h * heads * d + 2 * h * kv * d + heads * d * h + 3 * h * i     # q, k, v, o and the gated MLP
    assert p2["forward"] - p1["forward"] == layer * (4 if run["regime"] == "fp32" else 2)
    assert (p1["backward"], p1["optimizer"]) == (p2["backward"], p2["optimizer"])
    measured = run["measured"]["peak_by_phase"]["forward"]["bytes"]
    assert 0.0043 < p2["forward"] / measured - 1 < 0.0106
    [term] = [t for t in one.terms if "fsdp_version=1" in t.formula]
    assert term.phases == (BACKWARD,)


def test_fsdp_version_refused_outside_one_and_two():
    with pytest.raises(InvalidInputError, match="fsdp_version"):
        TrainingMemoryModel("measured").solve("llama3-8b", BIG, 16, 1024, dp_size=8, data_parallel="fsdp",
                                              plugin_options={"fsdp": {"fsdp_version": 3}})


@pytest.mark.parametrize("run", [r for r in _runs() if r["microbatches"] > 1], ids=lambda r: r["id"])
def test_accumulation_adds_the_unsharded_gradients_exactly(run):
    """What four micro-batches without sync add over one, phase by phase, measured and predicted to the byte (the
    forward and backward hold the whole unsharded gradient instead of the shard; the step is unchanged)."""
    one = next(r for r in _runs() if r["id"] == run["id"].replace("-m4-", "-m1-"))
    p4, p1 = _phases(_solve(run)), _phases(_solve(one))
    for name in PHASES:
        measured = run["measured"]["peak_by_phase"][name]["bytes"] - one["measured"]["peak_by_phase"][name]["bytes"]
        predicted = p4[name] - p1[name]
        assert predicted == measured, (name, predicted, measured)      # to the byte


def test_the_term_by_hand():
    """gqa-tiny (fp32), 4 ranks: the trainable parameters held before sharding x 4 B, less the shard the
    gradient terms count (params / 4 x 4 B), alive in the forward and backward only."""
    run = next(r for r in _runs() if r["kind"] == "fsdp1" and r["microbatches"] == 4 and r["regime"] == "fp32")
    result = _solve(run)
    params = run["measured"]["parameters_global"]
    [term] = [t for t in result.terms if t.component == COMMUNICATION_BUFFERS and "accumulated" in t.label]
    assert term.nbytes == params * 4 - params / 4 * 4
    assert term.phases == (FORWARD, BACKWARD)
    assert any("gradient_sync='no_sync'" in n for n in result.notes)


def test_numbers_without_accumulation_do_not_move():
    run = next(r for r in _runs() if r["kind"] == "fsdp1" and r["microbatches"] == 1)
    plain = _solve(run)
    for how in ("no_sync", "step"):
        assert _solve(run, how).total_memory == plain.total_memory
        assert [t.nbytes for t in _solve(run, how).terms] == [t.nbytes for t in plain.terms]


def test_bf16_no_sync_in_param_dtype_and_step_in_reduce_dtype():
    """Under FSDP2's mixed precision (fsdp-bf16: bf16 gathered, fp32 reduced) FSDP1's no_sync keeps the
    gradients in param_dtype (2 B), FSDP2's set_requires_gradient_sync(False) in reduce_dtype (4 B)."""
    solve = TrainingMemoryModel("measured").solve
    kw = dict(regime="fsdp-bf16", dp_size=8, data_parallel="fsdp", gradient_accumulation_steps=2,
              runtime_overheads=False)

    def term(how):
        r = solve("llama3-8b", BIG, 16, 1024, plugin_options={"fsdp": {"gradient_sync": how}}, **kw)
        return next(t for t in r.terms if "accumulated over micro-batches" in t.label)
    params = 8_030_261_248
    assert term("no_sync").nbytes == params * 2 - params / 8 * 4
    assert term("step").nbytes == params * 4 - params / 8 * 4


def test_accelerate_policy_accumulates_in_bf16_under_fsdp2():
    """accelerate's FSDP mixed precision (fsdp-bf16-reduce-bf16: param_dtype = reduce_dtype = bf16 over fp32
    shards, accelerate 1.16.0 utils/dataclasses.py lines 2008-2013): FSDP2's unsynced accumulation keeps the
    unsharded gradients in reduce_dtype, 2 B, not fsdp-bf16's 4 B; FSDP1's no_sync in param_dtype, 2 B, as
    fsdp-bf16; the rank's fp32 shard (4 B) counted with the gradients. The step's collectives move 2 B each."""
    from mlsysim_plugins.measured.regimes import REGIMES
    solve = TrainingMemoryModel("measured").solve

    def term(how):
        r = solve("llama3-8b", BIG, 16, 1024, regime="fsdp-bf16-reduce-bf16", dp_size=8, data_parallel="fsdp",
                  gradient_accumulation_steps=2, runtime_overheads=False,
                  plugin_options={"fsdp": {"gradient_sync": how}})
        return next(t for t in r.terms if "accumulated over micro-batches" in t.label).nbytes
    params = 8_030_261_248
    assert term("step") == params * 2 - params / 8 * 4
    assert term("no_sync") == params * 2 - params / 8 * 4
    assert REGIMES["fsdp-bf16-reduce-bf16"].collective_bytes() == {"parameters": 2, "gradients": 2}


def test_unknown_value_refused_and_lora_approximated():
    solve = TrainingMemoryModel("measured").solve
    with pytest.raises(InvalidInputError, match="gradient_sync"):
        solve("llama3-8b", BIG, 16, 1024, dp_size=8, data_parallel="fsdp",
              plugin_options={"fsdp": {"gradient_sync": "never"}})
    # LoRA: the adapters' gradient shard (the LoRA gradient terms) x (8 - 1) more; FSDP1's no_sync measured
    # (tests/measured/test_lora_fsdp1.py: the fp32 adapters' unsharded gradients in their param_dtype, 4 B, less the
    # shard), FSDP2's step said approximated
    for how in ("no_sync", "step"):
        r = solve("llama3-8b", BIG, 16, 1024, dp_size=8, data_parallel="fsdp", gradient_accumulation_steps=2,
                  lora={"rank": 8}, regime="bf16", plugin_options={"fsdp": {"gradient_sync": how}})
        shard = sum(t.nbytes for t in r.terms if t.component == "gradients")
        [term] = [t for t in r.terms if "accumulated over micro-batches" in t.label]
        assert shard == 6_815_744 * 4 / 8 and term.nbytes == shard * 7
        assert any("approximated" in n for n in r.notes) == (how == "step")


# --- the readers ------------------------------------------------------------------------------------------------

def test_litgpt_full_finetune_on_four_devices_accumulates_under_no_sync():
    from mlsysim_core.scenario import from_launch
    launch = from_launch([LITGPT / "finetune/llama-3-8b/full.yaml"], gpus=4, hardware="a10g")
    assert launch.scenario.plugin_options == {"fsdp": {"gradient_sync": "no_sync", "fsdp_version": 1}}
    assert launch.scenario.gradient_accumulation_steps == 4
    field = next(f for f in launch.readings[0].fields if f.field == "plugin_options")
    assert field.key == "train.global_batch_size" and "finetune/full.py line 281" in field.note
    assert "FSDP1's FullyShardedDataParallel" in field.note
    result = launch.scenario.solve()
    assert any("gradient_sync='no_sync'" in n for n in result.notes)
    assert not result.feasible     # the published OOM on a 24 GB A10G
    # the unsharded bf16 gradients: Llama-3-8B's 8,030,261,248 parameters (its embeddings untied already) x 2 B,
    # less the rank's quarter counted with the gradients
    [term] = [t for t in result.terms if "accumulated over micro-batches" in t.label]
    params = 8_030_261_248
    assert term.nbytes == params * 2 - params / 4 * 2


def test_litgpt_without_accumulation_has_no_option(tmp_path):
    import yaml
    from mlsysim_core.scenario import from_launch
    doc = yaml.safe_load((LITGPT / "finetune/llama-3-8b/full.yaml").read_text())
    doc["train"]["global_batch_size"] = 16      # 4 devices x micro-batch 4
    path = tmp_path / "full.yaml"
    path.write_text(yaml.safe_dump(doc))
    launch = from_launch([path], gpus=4, hardware="a10g")
    assert launch.scenario.plugin_options == {"fsdp": {"fsdp_version": 1}}     # FSDPStrategy: FSDP1's forward
    assert launch.scenario.gradient_accumulation_steps == 1
    field = next(f for f in launch.readings[0].fields if f.field == "plugin_options")
    assert field.key == "devices" and "fsdp_version=1" in field.note


def test_litgpt_lora_on_several_devices_accumulates_under_set_requires_gradient_sync(tmp_path):
    import yaml
    from mlsysim_core.scenario import from_launch
    doc = yaml.safe_load((LITGPT / "finetune/llama-3.2-1B/lora.yaml").read_text())
    doc["devices"] = 2
    path = tmp_path / "lora.yaml"
    path.write_text(yaml.safe_dump(doc))
    launch = from_launch([path], hardware="h100")
    assert launch.scenario.plugin_options == {"fsdp": {"gradient_sync": "step"}}
    assert launch.scenario.gradient_accumulation_steps == 4
    field = next(f for f in launch.readings[0].fields if f.field == "plugin_options")
    assert "set_requires_gradient_sync" in field.note


def test_accelerate_fsdp_says_the_trainer_accumulates_without_sync():
    from mlsysim_core.scenario import from_launch
    data = ROOT / "tests" / "data" / "launch"
    launch = from_launch([data / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml",
                          data / "accelerate/alignment-handbook/fsdp.yaml"], hardware="h100")
    assert launch.scenario.plugin_options == {"fsdp": {"gradient_sync": "no_sync", "fsdp_version": 1}}
    default = next(d for r in launch.readings for d in r.defaults if d.field == "plugin_options")
    assert "sync_each_batch" in default.source and "fsdp_version 1" in default.source   # accelerate's default


def test_accelerate_fsdp_version_read_as_a_field():
    """TRL's fsdp1.yaml says fsdp_version: 1: a field of its own (the FSDP1 forward and its no_sync together);
    fsdp2.yaml's fsdp_version: 2 is FSDP2, the rule's default (only the accumulation default)."""
    from mlsysim_core.scenario import from_launch
    data = ROOT / "tests" / "data" / "launch"
    trainer = data / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml"
    launch = from_launch([trainer, data / "accelerate/trl/fsdp1.yaml"], hardware="h100")
    assert launch.scenario.plugin_options == {"fsdp": {"gradient_sync": "no_sync", "fsdp_version": 1}}
    [field] = [f for r in launch.readings for f in r.fields if f.field == "plugin_options"]
    assert field.key == "fsdp_config.fsdp_version" and field.value == 1 and "FSDP1" in field.note
    one = launch.scenario.solve()
    launch = from_launch([trainer, data / "accelerate/trl/fsdp2.yaml"], hardware="h100")
    assert launch.scenario.plugin_options == {"fsdp": {"gradient_sync": "step"}}
    assert "fsdp_config.fsdp_version" in [k for r in launch.readings for k in r.ignored]
    two = launch.scenario.solve()
    # Zephyr-7B (Mistral 7B: h 4096, 8 KV heads of 128, MLP 14336) on 8 ranks, bf16 gathered: one layer's gathered
    # parameters held in the backward only under FSDP1, in the forward and backward under FSDP2
    layer = 4096 * 4096 * 2 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    [gathered] = [t for t in one.terms if "fsdp_version=1" in t.formula]
    assert gathered.nbytes == layer * 2 and gathered.phases == (BACKWARD,)
    assert [t.phases for t in two.terms if t.label == gathered.label] == [(FORWARD, BACKWARD)]


def test_trainer_sync_each_batch_with_accumulation_refused_naming_it(tmp_path):
    import yaml
    from mlsysim_core.scenario import from_launch
    data = ROOT / "tests" / "data" / "launch"
    doc = yaml.safe_load((data / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml").read_text())
    doc["gradient_accumulation_steps"] = 4
    doc["accelerator_config"] = {"gradient_accumulation_kwargs": {"sync_each_batch": True}}
    path = tmp_path / "config_full.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(NotModelledError, match="sync_each_batch"):
        from_launch([path, data / "accelerate/alignment-handbook/fsdp.yaml"], hardware="h100")
    doc["gradient_accumulation_steps"] = 1      # no accumulation: nothing to sync, read
    path.write_text(yaml.safe_dump(doc))
    assert from_launch([path, data / "accelerate/alignment-handbook/fsdp.yaml"], hardware="h100").scenario


def test_hsdp_keeps_the_unsharded_gradients_too():
    """HYBRID_SHARD frees its parameters and keeps the unsharded gradients under no_sync as FULL_SHARD does
    (the same source; measured: the hsdp runs above): the shard is the shard group's."""
    r = TrainingMemoryModel("measured").solve(
        "llama3-8b", BIG, 32, 1024, regime="bf16", dp_size=16, data_parallel="hsdp", gradient_accumulation_steps=2,
        runtime_overheads=False, plugin_options={"hsdp": {"gradient_sync": "no_sync", "shard_group_size": 8}})
    [term] = [t for t in r.terms if "accumulated over micro-batches" in t.label]
    params = 8_030_261_248
    assert term.nbytes == params * 2 - params / 8 * 2
    assert any("FSDP (HYBRID_SHARD), gradient_sync='no_sync'" in n for n in r.notes)


def test_accelerate_hsdp_names_the_hsdp_rule():
    """accelerate's parallelism_config makes the FSDP table's rule hsdp after the table is read: the accumulation
    default follows it (FSDP2: "step")."""
    from mlsysim_core.scenario import from_launch
    data = ROOT / "tests" / "data" / "launch"
    launch = from_launch([data / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml",
                          data / "accelerate/accelerate/tp_hsdp.yaml"], hardware="h100")
    assert launch.scenario.data_parallel == "hsdp"
    assert launch.scenario.plugin_options == {"hsdp": {"gradient_sync": "step"}}


# --- SHARD_GRAD_OP under FSDP1's no_sync() (the fsdp-grad-op rule's gradient_sync="no_sync") ----------------------

def _grad_op_runs(kind):
    return [run for run in json.loads(MEASUREMENTS.read_text(encoding="utf-8"))["runs"]
            if run.get("measured") and run["kind"] == kind]


def _solve_grad_op(run, gradient_sync=None):
    m, w = run["microbatches"], run["world_size"]
    options = {"gradient_sync": gradient_sync} if gradient_sync else None
    return TrainingMemoryModel("measured").solve(
        from_hf_config(run["hf_config"], name=run["model"]), BIG, run["batch_size"] * w * m, run["seq_len"],
        "fp32" if run["regime"] == "fp32" else "bf16", run["optimizer"], "none", regime=run["regime"],
        optimizer_impl=run["optimizer_impl"], attention=run["attention"], runtime_overheads=False, dp_size=w,
        data_parallel="fsdp-grad-op", gradient_accumulation_steps=m,
        plugin_options={"fsdp-grad-op": options} if options else None)


def test_grad_op_measured_with_fsdp1_and_fsdp2():
    for kind in ("gradop1", "gradop2"):
        runs = _grad_op_runs(kind)
        assert {(r["regime"], r["microbatches"]) for r in runs} == {(g, m) for g in ("fp32", "bf16") for m in (1, 4)}


@pytest.mark.parametrize("run", _grad_op_runs("gradop1"), ids=lambda r: r["id"])
def test_grad_op_no_sync_every_phase_within_one_percent(run):
    """FSDP1 SHARD_GRAD_OP, 1 and 4 micro-batches (the first three inside no_sync()): every phase within 1 %."""
    predicted = _phases(_solve_grad_op(run, "no_sync" if run["microbatches"] > 1 else None))
    measured = {name: run["measured"]["peak_by_phase"][name]["bytes"] for name in PHASES}
    for name in PHASES:
        assert abs(predicted[name] / measured[name] - 1) < 0.01, (name, predicted[name], measured[name])


@pytest.mark.parametrize("run", [r for r in _grad_op_runs("gradop1") if r["microbatches"] > 1], ids=lambda r: r["id"])
def test_grad_op_no_sync_adds_the_unsharded_gradients_exactly(run):
    """What FSDP1's SHARD_GRAD_OP adds over 4 micro-batches inside no_sync(), to the byte: the unsharded gradients
    (param_dtype) less the shard, in the forward and backward (the gathered parameters it keeps were already kept
    from each forward to its backward); priced as syncing every micro-batch, the forward was 9.8 to 15.0 % low."""
    one = next(r for r in _grad_op_runs("gradop1") if r["id"] == run["id"].replace("-m4-", "-m1-"))
    p4, p1 = _phases(_solve_grad_op(run, "no_sync")), _phases(_solve_grad_op(one))
    for name in PHASES:
        measured = run["measured"]["peak_by_phase"][name]["bytes"] - one["measured"]["peak_by_phase"][name]["bytes"]
        assert p4[name] - p1[name] == measured, name
    params = run["measured"]["parameters_global"]
    b = 4 if run["regime"] == "fp32" else 2
    # the whole unsharded gradient: the shard the gradient terms count alive under accumulation, and the term
    assert p4["forward"] - p1["forward"] == params * b
    [term] = [t for t in _solve_grad_op(run, "no_sync").terms if "accumulated over micro-batches" in t.label]
    assert term.nbytes == params * b - params / 4 * b
    synced = _phases(_solve_grad_op(run))
    assert synced["forward"] < 0.91 * run["measured"]["peak_by_phase"]["forward"]["bytes"]


@pytest.mark.parametrize("run", [r for r in _grad_op_runs("gradop2") if r["microbatches"] == 1], ids=lambda r: r["id"])
def test_fsdp2_grad_op_without_accumulation_within_one_percent(run):
    """FSDP2 with reshard_after_forward=False (one micro-batch): every phase within 1 %; the forward holds 0.5 to
    0.9 % more than priced (not explained here; the same bytes under accumulation, below)."""
    predicted = _phases(_solve_grad_op(run))
    measured = {name: run["measured"]["peak_by_phase"][name]["bytes"] for name in PHASES}
    for name in PHASES:
        assert abs(predicted[name] / measured[name] - 1) < 0.01, (name, predicted[name], measured[name])


@pytest.mark.parametrize("run", [r for r in _grad_op_runs("gradop2") if r["microbatches"] > 1], ids=lambda r: r["id"])
def test_fsdp2_grad_op_step_every_phase_within_one_percent(run):
    """FSDP2 SHARD_GRAD_OP (reshard_after_forward=False), 4 micro-batches, the first three under
    set_requires_gradient_sync(False) (gradient_sync="step"): every phase within 1 % (forward -0.72 % fp32,
    -0.47 % bf16: the one-micro-batch run's residual; backward +3,972 B; step -116 B). Priced before at a fixed
    4 B plus the shard: forward +4.2 % (fp32) and +15.8 % (bf16)."""
    predicted = _phases(_solve_grad_op(run, "step"))
    measured = {name: run["measured"]["peak_by_phase"][name]["bytes"] for name in PHASES}
    for name in PHASES:
        assert abs(predicted[name] / measured[name] - 1) < 0.01, (name, predicted[name], measured[name])


@pytest.mark.parametrize("run", [r for r in _grad_op_runs("gradop2") if r["microbatches"] > 1], ids=lambda r: r["id"])
def test_fsdp2_grad_op_step_adds_the_unsharded_gradients_exactly(run):
    """What FSDP2's SHARD_GRAD_OP adds over 4 micro-batches under set_requires_gradient_sync(False), to the byte:
    the unsharded gradients in reduce_dtype (here no MixedPrecisionPolicy: the model's dtype, 4 B fp32, 2 B bf16)
    in the forward and backward, the shard counted once (the term is the unsharded gradient less the shard the
    gradient terms count)."""
    one = next(r for r in _grad_op_runs("gradop2") if r["id"] == run["id"].replace("-m4-", "-m1-"))
    result = _solve_grad_op(run, "step")
    p4, p1 = _phases(result), _phases(_solve_grad_op(one))
    for name in PHASES:
        measured = run["measured"]["peak_by_phase"][name]["bytes"] - one["measured"]["peak_by_phase"][name]["bytes"]
        assert p4[name] - p1[name] == measured, name
    params = run["measured"]["parameters_global"]
    b = 4 if run["regime"] == "fp32" else 2
    assert p4["forward"] - p1["forward"] == params * b
    [term] = [t for t in result.terms if "accumulated over micro-batches" in t.label]
    assert term.nbytes == params * b - params / 4 * b and term.phases == (FORWARD, BACKWARD)
    assert any("FSDP (SHARD_GRAD_OP), gradient_sync='step'" in n and "reduce_dtype" in n for n in result.notes)


def test_grad_op_step_in_the_regimes_reduce_dtype():
    """fsdp-bf16 (param bf16, reduce fp32: the Llama 3 paper's FSDP) accumulates in 4 B, pure bf16 in 2 B; the
    rank's shard (in the gradients' bytes) counted once."""
    solve = TrainingMemoryModel("measured").solve

    def term(regime):
        r = solve("llama3-8b", BIG, 16, 1024, regime=regime, dp_size=8, data_parallel="fsdp-grad-op",
                  gradient_accumulation_steps=2, runtime_overheads=False,
                  plugin_options={"fsdp-grad-op": {"gradient_sync": "step"}})
        return next(t for t in r.terms if "accumulated over micro-batches" in t.label).nbytes
    params = 8_030_261_248
    assert term("fsdp-bf16") == params * 4 - params / 8 * 4
    assert term("bf16") == params * 2 - params / 8 * 2


def test_accelerate_fsdp1_shard_grad_op_accumulates_under_no_sync(tmp_path):
    """FSDP1 SHARD_GRAD_OP (TRL's fsdp1.yaml with that strategy): the fsdp-grad-op rule's gradient_sync='no_sync'
    and fsdp_version=1 (the same bytes in full training; under LoRA with a 16-bit param_dtype FSDP1 keeps each
    adapter's input copy, lora.fsdp1_adapter_input_cast); FSDP2's reshard_after_forward false:
    gradient_sync='step' (accelerate 1.16.0 Accelerator.no_sync under FSDP2: set_requires_gradient_sync(False))."""
    import yaml
    from mlsysim_core.scenario import from_launch
    data = ROOT / "tests" / "data" / "launch"
    trainer = data / "hf_trainer/alignment-handbook/zephyr-7b-beta/sft/config_full.yaml"
    doc = yaml.safe_load((data / "accelerate/trl/fsdp1.yaml").read_text())
    doc["fsdp_config"]["fsdp_reshard_after_forward"] = "SHARD_GRAD_OP"
    path = tmp_path / "fsdp1.yaml"
    path.write_text(yaml.safe_dump(doc))
    launch = from_launch([trainer, path], hardware="h100")
    assert launch.scenario.data_parallel == "fsdp-grad-op"
    assert launch.scenario.plugin_options == {"fsdp-grad-op": {"gradient_sync": "no_sync", "fsdp_version": 1}}
    doc = yaml.safe_load((data / "accelerate/trl/fsdp2.yaml").read_text())
    doc["fsdp_config"]["fsdp_reshard_after_forward"] = False
    path.write_text(yaml.safe_dump(doc))
    launch = from_launch([trainer, path], hardware="h100")
    assert launch.scenario.data_parallel == "fsdp-grad-op"
    assert launch.scenario.plugin_options == {"fsdp-grad-op": {"gradient_sync": "step"}}


# --- accelerate's fp16 policy with its loss scaler (fsdp-fp16-reduce-fp16) ----------------------------------------

FP16 = "fsdp-fp16-reduce-fp16"


@pytest.mark.parametrize("run", [r for r in _runs() if r["regime"] == FP16], ids=lambda r: r["id"])
def test_fp16_policy_is_the_bf16_policy_plus_the_scalers_scalars(run):
    """FSDP MixedPrecision(Policy)(param_dtype = reduce_dtype = fp16) over fp32 parameters, with the scaler accelerate
    1.16.0 builds (accelerator.py lines 536-555: FSDP1 ShardedGradScaler, FSDP2 torch.amp.GradScaler) driven as the
    Trainer drives it (scale(loss).backward(), unscale_, step, update). Every phase measured is the bf16 policy's
    run plus the scaler's scalars, by hand from torch 2.13's amp/grad_scaler.py and sharded_grad_scaler.py: the fp32
    scale and the int32 growth tracker (4 + 4 B) in every phase; in the step the fp32 found_inf too (4 B; inv_scale
    is freed when unscale_ returns, before the optimizer's peak); the scaled loss replaces the loss (no byte more);
    unscale_ divides the gradients in place (no copy). The profile prices the two regimes to the byte alike (the
    scaler unpriced: 8 to 12 B)."""
    bf16 = next(r for r in _runs() if r["id"] == run["id"].replace(FP16, "fsdp-bf16-reduce-bf16"))
    scaler = run["measured"]["grad_scaler"]
    assert scaler["class"] == ("ShardedGradScaler" if run["kind"] == "fsdp1" else "GradScaler")
    assert (scaler["steps"], scaler["skipped_steps"], scaler["scale"]) == (3, 0, 2.0 ** 16)     # no step skipped
    measured = {name: run["measured"]["peak_by_phase"][name]["bytes"] - bf16["measured"]["peak_by_phase"][name]["bytes"]
                for name in PHASES}
    scale, growth_tracker, found_inf = 4, 4, 4
    assert measured == {"forward": scale + growth_tracker, "backward": scale + growth_tracker,
                        "optimizer": scale + growth_tracker + found_inf}
    one, two = _solve(run), _solve(bf16)
    assert [t.nbytes for t in one.terms] == [t.nbytes for t in two.terms]


def test_fp16_regimes_bytes_are_the_bf16_counterparts():
    """Declared, not named: fsdp-fp16-reduce-fp16 and fsdp-fp16-stored hold every byte field of their bf16
    counterparts (2 B either way), and their collectives move the same bytes."""
    import attrs
    from mlsysim_plugins.measured.regimes import REGIMES
    for fp16, bf16 in (("fsdp-fp16-reduce-fp16", "fsdp-bf16-reduce-bf16"), ("fsdp-fp16-stored", "fsdp-bf16-stored")):
        a, b = REGIMES[fp16], REGIMES[bf16]
        assert attrs.evolve(a, name=b.name, description=b.description, precision=b.precision) == b
        assert (a.precision, b.precision) == ("fp16", "bf16")     # the one field apart: the 16-bit dtype declared
        assert a.collective_bytes() == b.collective_bytes() == {"parameters": 2, "gradients": 2}
