"""torchao's NF4 base under FSDP2 (torchtune 0.6.1's distributed QLoRA; issue 25 item 2): the measured profile against
validation/qlora_fsdp2/measurements.json (one rank of a fake world, torchtune's own lora_finetune_distributed setup),
the declared split by hand, the refusals that stay, and torchtune's distributed configs answering."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.finetune import LoRAConfig
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, FORWARD
from mlsysim_core.types import HardwareNode

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "validation" / "qlora_fsdp2"
_spec = importlib.util.spec_from_file_location("qlora_fsdp2_compare", DIR / "compare.py")
compare = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare)

RUNS = {r["id"]: r for r in json.loads((DIR / "measurements.json").read_text(encoding="utf-8"))["runs"]}
ROWS = {rid: (pred, meas) for rid, pred, meas in compare.rows()}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
W2, W2_AC, ONE_AC = ("tt-llama3_1-2l-bf16-qlora-fsdp2-w2r0-b2-s512", "tt-llama3_1-2l-bf16-qlora-ac-fsdp2-w2r0-b2-s512",
                     "tt-llama3_1-2l-bf16-qlora-ac-1dev-b2-s512")
# one layer's all-gather, by hand: codes 4 x 65,536 / 2 + 3 x 131,072 / 2 = 327,680 B; int8 scalers 4 x 1,024 + 3 x 2,048
# = 10,240 B; bf16 factors (4 x 4 + 3 x 8) x 2 = 80 B; the adapters (q, v, o: 3 x 8 x 512; w1, w2, w3: 3 x 8 x 768)
# 30,720 x 2 B = 61,440 B
G = 327_680 + 10_240 + 80 + 61_440
ROOT_GROUP = (2 * 1024 * 256 + 256) * 2      # embedding + untied LM head + final norm, bf16


def _err(rid, phase):
    pred, meas = ROWS[rid]
    return (pred[phase] - meas[phase]) / meas[phase]


def test_every_run_is_answered_and_the_states_to_the_byte():
    """After setup (the rank's shards, the mean and table whole, adapters, AdamW state), the forward's and the
    backward's ends and the step: within 0.15 % on every run, w2 and w4, ranks 0 and 3 (what is left: tens of
    bytes, the fused step's scalars)."""
    assert set(ROWS) == set(RUNS) and len(ROWS) == 8
    for rid, (pred, meas) in ROWS.items():
        assert isinstance(pred, dict), (rid, pred)
        for phase in ("setup", "end_of_forward", "end_of_backward", "optimizer"):
            assert abs(_err(rid, phase)) < 0.0015, (rid, phase, _err(rid, phase))
        assert abs(pred["setup"] - meas["setup"]) <= 72


def test_without_checkpointing_every_peak():
    for rid in ROWS:
        if "-ac-" not in rid:
            assert abs(_err(rid, "forward")) < 0.001 and abs(_err(rid, "backward")) < 0.001, rid


def test_rank_3_of_4_is_rank_0():
    a, b = ROWS["tt-llama3_1-2l-bf16-qlora-ac-fsdp2-w4r0-b2-s512"], ROWS["tt-llama3_1-2l-bf16-qlora-ac-fsdp2-w4r3-b2-s512"]
    assert a == b


def test_checkpointed_backward_holds_the_prefetched_layer():
    """Inside a checkpointed layer's backward FSDP2 holds the layer below's all-gather, prefetched by the pre-backward
    hook (lora._fsdp2_in_layer: one more gathered layer, G, with >= 2 layers on the rank) beside the rule's layer and
    root: priced in the top layer's backward. What FSDP2 leaves of the shortfall: 2,096 B (the gathered parameters'
    padding, 400,464 B a layer as measured against G); the rest is the one-device twin's own (-1.61 %, unchanged).
    Before: -3.8 % (w2) and -3.9 % (w4), the FSDP2 part G + 2,096 B."""
    pred, meas = ROWS[W2_AC]
    one_pred, one_meas = ROWS[ONE_AC]
    fsdp_part = (pred["backward"] - meas["backward"]) - (one_pred["backward"] - one_meas["backward"])
    assert fsdp_part == -2_096
    for rid in (W2_AC, "tt-llama3_1-2l-bf16-qlora-ac-fsdp2-w4r0-b2-s512"):
        assert -0.017 < _err(rid, "backward") < -0.015, rid
    assert -0.017 < _err(ONE_AC, "backward") < -0.016
    term = next(t for t in compare.solve(RUNS[W2_AC]).terms if t.label.startswith("the top layer's backward"))
    assert f"+ FSDP2: {G:,} B (the layer below's all-gather, prefetched" in term.formula


def _held(run, **kw):
    import re
    r = compare.solve(run) if not kw else kw["solve"]()
    term = next(t for t in r.terms if t.label.startswith("a checkpointed layer's forward"))
    return int(re.match(r"max\(0, ([\d,]+) B", term.formula).group(1).replace(",", "")), term


def test_checkpointed_forward_holds_the_gathered_layer_and_root():
    """The top layer's forward moment (inside the model's forward) holds what the rule frees when the model's forward
    returns (root_reshard_after_forward: the root and the gathered layer, G + root) and the layer's all-gather output,
    kept until the next all-gather (G): 2 G + root beyond the one-device twin's moment. The measured peak is there
    (the profiler's events: up_proj's lora_b matmul in the top layer), beyond the model's moment by one a = c T ffn
    and 12,368 B: on the CPU the bf16 mm first writes an fp32 output (T x ffn x 4 = 2a, with torch 2.13's MKL build)
    where the model has the scaled copy (a), a kernel-internal buffer the tracker-measured one-device HF runs cannot
    see (pricing it there moved them from -7.9 % to +18 %: not priced in the eager walk, compile.py prices it for
    compiled blocks), and the checkpoints' CPU RNG states (2 x 5,056 B) and padding. So the moment stays below the
    loss's in the model, and the forward peak -7.5 % (w2) / -7.9 % (w4) as before."""
    held, term = _held(RUNS[W2_AC])
    one, _ = _held(RUNS[ONE_AC])
    assert held - one == 2 * G + ROOT_GROUP
    assert term.nbytes == 0 and "root_reshard_after_forward" in term.formula
    m = RUNS[W2_AC]["measured"]
    a = 2 * 1024 * 512
    inputs = 2 * 1024 * 256 * 2        # the two checkpointed layers' inputs
    assert 0 < m["peak_by_phase"]["forward"] - (inputs + held + a) == 12_368
    for rid in (W2_AC, "tt-llama3_1-2l-bf16-qlora-ac-fsdp2-w4r0-b2-s512"):
        assert -0.08 < _err(rid, "forward") < -0.07, rid


def test_without_root_reshard_the_forward_adds_the_all_gather_output_alone():
    """torchtitan's root (kept gathered after the forward: the rule's forward terms hold it and the layer): the top
    layer's moment adds the last all-gather's output, G, alone."""
    run = RUNS[W2_AC]

    def solve():
        return TrainingMemoryModel().solve(
            from_hf_config(run["hf_config"], name="x"), BIG, 4, 512, "bf16", "adamw", "full", profile="measured",
            regime="bf16", attention="sdpa", device="cpu", runtime_overheads=False, optimizer_impl="fused",
            loss="chunked", lora=LoRAConfig(rank=8, target_modules=tuple(run["lora"]["targets"]), adapter_dtype="base",
                                            quantization="nf4", quant_implementation="torchao"),
            rope_cache=512, rope_cache_dtype="fp32", kv_expanded=True, dp_size=2, data_parallel="fsdp")
    held, term = _held(run, solve=solve)
    one, _ = _held(RUNS[ONE_AC])
    assert held - one == G and "root_reshard_after_forward" not in term.formula


def test_the_declared_split_is_what_each_rank_keeps():
    """QuantImplementation.shards against every sharded NF4 weight the harness read (inner tensors' storages)."""
    from mlsysim_plugins.measured.quantizations import BUILTIN
    torchao = next(q for q in BUILTIN if q.shards is not None)
    seen = 0
    for run in RUNS.values():
        d = run.get("layout", {}).get("world_size", 1)
        for name, w in run["measured"]["nf4_shard"].items():
            rows, cols = w["global_shape"]
            weight, split, whole = torchao.shards(rows * cols, rows, None, 2, d)
            assert weight == w["quantized_data"], name
            assert split == w["quantized_scalers"] + w["quantization_factor"], name
            assert whole == w["scaler_mean"] + w["nf4"] == 34, name
            assert w["shape"] == [rows // d, cols]
            seen += 1
    assert seen == 7 * 8


def test_the_terms_by_hand():
    r = compare.solve(RUNS[W2])
    term = {t.label: t for t in r.terms}
    assert term["quantized base linears (4-bit nf4)"].nbytes == 2 * (4 * 65_536 + 3 * 131_072) // 2 // 2
    # per weight (n / 64 + n / 16,384 x 2 B) / 2 ranks + 34 B whole: q, k, v, o 550 B; w1, w2, w3 1,066 B
    assert term["quantization constants"].nbytes == 2 * (4 * 550 + 3 * 1_066) == 10_796
    assert term["all-gathered parameters of one layer"].nbytes == G
    # torchtune's shard_model: the root and the layer freed when the model's forward returns
    assert term["root group unsharded (embedding, LM head, final norm)"].nbytes == ROOT_GROUP
    for label in ("root group unsharded (embedding, LM head, final norm)", "all-gathered parameters of one layer"):
        assert term[label].phases == (BACKWARD,)


def test_root_reshard_after_forward_is_what_the_forward_end_loses():
    run = RUNS[W2]
    default = compare.solve(run)
    kept = TrainingMemoryModel().solve(
        from_hf_config(run["hf_config"], name="x"), BIG, 4, 512, "bf16", "adamw", "none", profile="measured",
        regime="bf16", attention="sdpa", device="cpu", runtime_overheads=False, optimizer_impl="fused",
        loss="chunked", lora=LoRAConfig(rank=8, target_modules=tuple(run["lora"]["targets"]), adapter_dtype="base",
                                        quantization="nf4", quant_implementation="torchao"),
        rope_cache=512, rope_cache_dtype="fp32", kv_expanded=True, dp_size=2, data_parallel="fsdp")
    end = compare.predicted(kept)["end_of_forward"] - compare.predicted(default)["end_of_forward"]
    assert end == ROOT_GROUP + G
    root = next(t for t in kept.terms if t.label.startswith("root group"))
    assert root.phases == (FORWARD, BACKWARD)


def _tiny(lora=None, **kw):
    run = RUNS[W2]
    lora = lora or LoRAConfig(rank=8, adapter_dtype="base", quantization="nf4", quant_implementation="torchao")
    return TrainingMemoryModel().solve(from_hf_config(run["hf_config"], name="x"), BIG, 6, 512, "bf16", "adamw",
                                       "none", profile="measured", regime="bf16", lora=lora, **kw)


@pytest.mark.parametrize("kw, parameter, says", [
    (dict(tp_size=2), "lora.quantization", "a quantized base split by tensor parallelism is not measured"),
    (dict(pp_size=2), "lora.quant_implementation", r"split or gathered over ranks is not measured \(dp=1, tp=1, pp=2\)"),
    (dict(dp_size=2, data_parallel="zero0"), "lora.quant_implementation",
     r"torchao's base replicated over dp=2 ranks \(DDP, ZeRO-1/2\) is not measured"),
    (dict(dp_size=3, data_parallel="fsdp"), "lora.quant_implementation",
     "a linear of 256 rows and 65,536 elements .4 scaler groups.: torchao's nf4_split asserts"),
])
def test_refused_by_name(kw, parameter, says):
    with pytest.raises(NotModelledError, match=says) as e:
        _tiny(**kw)
    assert e.value.parameter == parameter


def test_an_implementation_that_declares_no_split_stays_refused_under_fsdp():
    import attrs
    from mlsysim_plugins.measured import quantizations
    torchao = next(q for q in quantizations.BUILTIN if q.shards is not None)
    plain = attrs.evolve(torchao, shards=None)
    registry_impls = quantizations.registered

    def patched(registry):
        return {**registry_impls(registry), "torchao": plain}
    quantizations.registered = patched
    try:
        with pytest.raises(NotModelledError, match=r"not measured \(dp=2, tp=1, pp=1\)"):
            _tiny(dp_size=2, data_parallel="fsdp")
    finally:
        quantizations.registered = registry_impls


@pytest.mark.parametrize("name", ["405B_qlora", "70B_lora"])
def test_torchtunes_distributed_configs_answer(name):
    from mlsysim_core.scenario import from_launch
    launch = from_launch([ROOT / "tests/data/launch/torchtune/llama3_1" / f"{name}.yaml"], gpus=8, hardware="a100",
                         seq_len=2048)
    assert launch.scenario.to_dict()["plugin_options"]["fsdp"] == {"root_reshard_after_forward": True}
    r = launch.scenario.solve()
    assert r.feasible
    if name == "405B_qlora":
        # 126 layers x (2 x 16,384^2 + 2 x 1,024 x 16,384 + 3 x 53,248 x 16,384) / 2 B / 8 ranks
        n = 2 * 16_384 ** 2 + 2 * 1_024 * 16_384 + 3 * 53_248 * 16_384
        assert next(t for t in r.terms if t.label == "quantized base linears (4-bit nf4)").nbytes == 126 * n // 16
