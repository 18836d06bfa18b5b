"""The example packages' measured grade against what PyTorch measured (no torch needed).

``validation/examples/measurements.json`` holds real training iterations of gqa-tiny (Llama, GQA;
fp32, SDPA, b = 2, s = 256, AdamW foreach baseline), each technique next to a baseline run without
it (``validation/examples/README.md``). Each test below builds the same model from the run's
Hugging Face config, solves it under the measured profile with the example plugin registered
(its module imported from ``examples/plugins/*/src``), and compares phase by phase:

* the **baselines** reproduce their measurements within ``BASELINE_TOLERANCE`` (the measured
  profile's own residual on these runs, the same with and without a technique);
* each **technique's delta** (technique minus baseline, predicted against measured) is exact to
  the byte wherever the package models the mechanism exactly; where it does not (activation
  offload: the tensors outside the decoder layers), the difference is derived in closed form.

Phases: the measured ``forward``, ``backward`` and ``optimizer`` peaks against the predicted
``forward``, ``max(backward, backward_end)`` (both inside PyTorch's backward) and ``optimizer_step``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from mlsysim_core import (HardwareNode, NotModelledError, PluginManager, TrainingMemoryModel,
                          TransformerWorkload)
from mlsysim_core.hf import from_hf_config

ROOT = Path(__file__).resolve().parents[2]
for _package in ("mlsysim-adam-mini", "mlsysim-zeropp-hpz", "mlsysim-activation-offload"):
    _src = str(ROOT / "examples" / "plugins" / _package / "src")
    if _src not in sys.path:
        sys.path.append(_src)

from mlsysim_activation_offload import offload  # noqa: E402
from mlsysim_adam_mini import adam_mini  # noqa: E402
from mlsysim_zeropp_hpz import hpz  # noqa: E402

DATA = json.loads((ROOT / "validation" / "examples" / "measurements.json").read_text(encoding="utf-8"))
RUNS = {run["id"]: run for run in DATA["runs"]}
COMPARISONS = {(c["run"], c["baseline"]): c for c in DATA["comparisons"]}
SHAPES = DATA["model"]["shapes"]          # h, L, a, kv, head_dim, f, V, P, P_layer, T, b, s
E = 4                                     # fp32

# The measured profile's residual on these runs, without any plugin: -4,120 B in the forward (HF's
# padded int64 labels, 8 x b x (s + 1), and the loss scalar, which it does not count), +4,088 B in the
# backward, -6,304 / +1,904 / -136 B for the FSDP2 run. A technique's run has the same residual, so
# its delta is compared exactly.
BASELINE_TOLERANCE = 8 * 1024

BASELINE = "baseline-gqa-tiny-fp32-adamw-foreach-b2-s256"
BASELINE_TIED = "baseline-gqa-tiny-tied-fp32-adamw-foreach-b2-s256"
BASELINE_LOOP = "baseline-gqa-tiny-fp32-adamw-for-loop-b2-s256"
ZERO3 = "fsdp2-gqa-tiny-fp32-w8-raf-true-b2-s256-r0"
OFFLOAD = "offload-save-on-cpu-simulated-gqa-tiny-fp32-b2-s256"
PHASES = ("forward", "backward", "optimizer")


@pytest.fixture(scope="module")
def solver():
    """mlsysim-core's built-ins plus the three example plugins, under their entry-point names."""
    pm = PluginManager()
    pm.load_entrypoints(third_party=False)
    pm.register(adam_mini, name="adam_mini")
    pm.register(hpz, name="zeropp_hpz")
    pm.register(offload, name="activation_offload")
    return TrainingMemoryModel("measured", plugin_manager=pm)


def solve(solver, run_id: str, *, dp_size: int = 1, **kw):
    """The run as measured: its model from its HF config, fp32, SDPA, no recompute, no runtime overheads."""
    run = RUNS[run_id]
    args = dict(precision="fp32", optimizer="adamw", activation_checkpointing="none", regime="fp32",
                optimizer_impl="foreach", attention="sdpa", runtime_overheads=False, dp_size=dp_size)
    args.update(kw)
    model = from_hf_config(run["hf_config"], name=run["model"])
    return solver.solve(model, HardwareNode(name="cpu", memory_capacity=2**40), run["batch_size"] * dp_size,
                        run["seq_len"], **args)


def predicted(result) -> dict[str, float]:
    p = result.phase_totals
    return {"forward": p["forward"], "backward": max(p["backward"], p["backward_end"]),
            "optimizer": p["optimizer_step"]}


def measured(run_id: str) -> dict[str, int]:
    return {phase: RUNS[run_id]["measured"]["peak_by_phase"][phase]["bytes"] for phase in PHASES}


def fsdp(dp_size=8, **kw):
    return dict(dp_size=dp_size, **kw)


# --- the model and the baselines -------------------------------------------------------------

def test_the_model_is_the_measured_one(solver):
    from mlsysim_plugins.measured.shapes import ModelShape
    model = from_hf_config(RUNS[BASELINE]["hf_config"], name="gqa-tiny")
    shape = ModelShape.of(model)
    assert model.parameters == SHAPES["P"] == 19_155_200
    assert shape.layer_parameters() == SHAPES["P_layer"] == 692_736
    assert len(shape.parameter_tensors()) == SHAPES["N_tensors"] == 39
    assert (shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, shape.ffn, shape.vocab, shape.layers) == (
        SHAPES["h"], SHAPES["a"], SHAPES["kv"], SHAPES["head_dim"], SHAPES["f"], SHAPES["V"], SHAPES["L"])
    assert solve(solver, BASELINE).weights == E * SHAPES["P"] + 128     # + the RoPE buffers


@pytest.mark.parametrize("run_id, kw", [
    (BASELINE, {}),
    (BASELINE_TIED, {}),
    (BASELINE_LOOP, {"optimizer_impl": "for-loop"}),
    (ZERO3, fsdp(data_parallel="fsdp")),      # FSDP2 reshard_after_forward=True, the root gathered
], ids=["adamw-foreach", "adamw-foreach-tied", "adamw-for-loop", "fsdp2-zero3-w8"])
def test_the_baselines_reproduce_their_measurements(solver, run_id, kw):
    pred, meas = predicted(solve(solver, run_id, **kw)), measured(run_id)
    for phase in PHASES:
        assert abs(pred[phase] - meas[phase]) <= BASELINE_TOLERANCE, (phase, pred[phase], meas[phase])


# --- Adam-mini -------------------------------------------------------------------------------------

MINI = {"adam-mini-gqa-tiny-fp32-b2-s256": BASELINE, "adam-mini-gqa-tiny-tied-fp32-b2-s256": BASELINE_TIED}
MINI_NAME = "adammini.adam-mini"


def _state(result) -> dict[str, float]:
    return {t.label: t.nbytes for t in result.terms_of("optimizer_state")}


@pytest.mark.parametrize("run_id", list(MINI))
def test_adam_mini_keeps_what_adam_mini_kept(solver, run_id):
    run = RUNS[run_id]
    kept = run["measured"]["adam_mini_state"]
    r = solve(solver, run_id, optimizer=MINI_NAME, optimizer_impl=run["optimizer_impl"])
    state = _state(r)
    model = from_hf_config(run["hf_config"], name=run["model"])
    blocks = sum(adam_mini.block_counts(model).values())
    assert blocks == kept["v_blocks"] == (39_857 if model.tied_embeddings else 71_857)
    assert {k: v for k, v in adam_mini.block_counts(model).items() if v} == kept["v_blocks_by_kind"]
    assert state["adam-mini first moment m (fp32, 4 B)"] == kept["m_bytes"] == E * model.parameters
    assert state["adam-mini second moment v (4 B, one per block)"] == kept["v_bytes"] == E * blocks
    # No master copy (the fp32 weights are the master), no step tensors (Python ints).
    assert not any("master" in label or "step counter" in label for label in state)
    # What is alive between steps is exactly the state the tracker filed as optimizer_state.
    steady = sum(t.nbytes for t in r.terms_of("optimizer_state") if "forward" in t.phases)
    assert steady == run["measured"]["alive"]["after_zero_grad"]["by_category"]["optimizer_state"]
    # The step: the embedding's update and -update, and its three (V, 1) vectors.
    V, h = SHAPES["V"], SHAPES["h"]
    assert state["adam-mini step temporaries (per-tensor loop)"] == E * (2 * V * h + 3 * V) == 65_920_000


@pytest.mark.parametrize("impl", ["for-loop", "foreach", "fused"])
@pytest.mark.parametrize("run_id", list(MINI))
def test_adam_mini_phase_by_phase(solver, run_id, impl):
    """Adam-mini minus AdamW (foreach), predicted = measured, to the byte in every phase; Adam-mini
    loops tensor by tensor whatever optimizer_impl says."""
    base = MINI[run_id]
    mini = predicted(solve(solver, run_id, optimizer=MINI_NAME, optimizer_impl=impl))
    adamw = predicted(solve(solver, base))
    meas, meas_base = measured(run_id), measured(base)
    for phase in PHASES:
        assert mini[phase] - adamw[phase] == meas[phase] - meas_base[phase], phase
        assert abs(mini[phase] - meas[phase]) <= BASELINE_TOLERANCE, phase
    for phase, row in COMPARISONS[run_id, base]["phases"].items():      # the measurement's closed forms
        if phase.startswith("peak_"):
            assert mini[phase.removeprefix("peak_")] - adamw[phase.removeprefix("peak_")] == row["predicted_delta"]


def test_adam_mini_against_adamw_for_loop(solver):
    run_id = "adam-mini-gqa-tiny-fp32-b2-s256"
    mini = predicted(solve(solver, run_id, optimizer=MINI_NAME))
    loop = predicted(solve(solver, BASELINE_LOOP, optimizer_impl="for-loop"))
    meas, meas_loop = measured(run_id), measured(BASELINE_LOOP)
    assert mini["optimizer"] - loop["optimizer"] == meas["optimizer"] - meas_loop["optimizer"] == -75_950_552


def test_adam_mini_follows_the_regime(solver):
    """Not measured (fp32 only): m and v in the regime's state dtype, the master copy of a mixed regime."""
    P, blocks = SHAPES["P"], 71_857
    bf16 = _state(solve(solver, BASELINE, optimizer=MINI_NAME, regime="bf16", precision="bf16"))
    assert bf16["adam-mini first moment m (bf16, 2 B)"] == 2 * P
    assert bf16["adam-mini second moment v (2 B, one per block)"] == 2 * blocks
    mixed = _state(solve(solver, BASELINE, optimizer=MINI_NAME, regime="mixed-bf16", precision="bf16"))
    assert mixed["fp32 master weights"] == 4 * P
    assert mixed["adam-mini first moment m (mixed-bf16, 4 B)"] == 4 * P
    zero1 = _state(solve(solver, ZERO3, optimizer=MINI_NAME, **fsdp(zero_stage=1)))
    assert zero1["adam-mini second moment v (4 B, one per block)"] == 4 * blocks / 8


@pytest.mark.parametrize("model, what", [
    ("mixtral-8x7b", "Mixtral-style layers"),
    ("gpt2", "GPT-2-style layers"),
])
def test_adam_mini_refuses_what_it_cannot_model(solver, model, what):
    with pytest.raises(NotModelledError) as err:
        solver.solve(model, "h100", 8, 1024, optimizer=MINI_NAME)
    assert err.value.parameter == "optimizer" and what in str(err.value)


def test_adam_mini_refuses_lora(solver):
    with pytest.raises(NotModelledError, match="LoRA"):
        solver.solve("llama3-8b", "h100", 8, 1024, optimizer=MINI_NAME, lora={"rank": 16})


def test_adam_mini_says_what_it_approximates(solver):
    """Heads x head_dim != hidden: q and k are counted per head, which Adam-mini's view is not."""
    model = TransformerWorkload(name="wide-heads", parameters=1_300_000_000, layers=16, hidden_dim=2048,
                                heads=16, kv_heads=4, head_dim=256, vocab_size=32_000, ffn_dim=5632,
                                gated_mlp=True, tied_embeddings=False, architecture="llama")
    r = solver.solve(model, "h100", 8, 1024, optimizer=MINI_NAME)
    [v] = [t for t in r.terms_of("optimizer_state") if "second moment" in t.label]
    assert "approximation: q and k counted per head" in v.formula


# --- hpZ (FSDP2 reshard_after_forward=R, the measured stand-in) -------------------------------------

HPZ = {"fsdp2-gqa-tiny-fp32-w8-raf-2-b2-s256-r0": 2, "fsdp2-gqa-tiny-fp32-w8-raf-2-b2-s256-r7": 2,
       "fsdp2-gqa-tiny-fp32-w8-raf-4-b2-s256-r0": 4}
HPZ_NAME = "zeropp.hpz"


def _hpz(solver, run_id, group, **kw):
    return solve(solver, run_id, **fsdp(data_parallel=HPZ_NAME,
                                        plugin_options={HPZ_NAME: {"secondary_group": group}}, **kw))


def _secondary(result):
    return [t for t in result.terms_of("communication_buffers") if t.label.startswith("hpZ")]


@pytest.mark.parametrize("run_id", list(HPZ))
def test_hpz_secondary_shard_is_the_measured_one(solver, run_id):
    R = HPZ[run_id]
    [term] = _secondary(_hpz(solver, run_id, R))
    secondary = COMPARISONS[run_id, ZERO3]["secondary_shard_bytes_at_end_of_forward"]
    assert term.nbytes == secondary == E * SHAPES["L"] * SHAPES["P_layer"] / R
    assert term.phases == ("forward", "backward") and term.source == "zeropp_hpz"


@pytest.mark.parametrize("run_id", list(HPZ))
def test_hpz_phase_by_phase(solver, run_id):
    """hpZ minus ZeRO-3, predicted = measured (FSDP2 reshard_after_forward=R minus True), to the byte:
    the secondary shards in the forward and backward peaks, nothing in the step."""
    R = HPZ[run_id]
    pred = predicted(_hpz(solver, run_id, R))
    zero3 = predicted(solve(solver, ZERO3, **fsdp(zero_stage=3)))
    meas, meas_zero3 = measured(run_id), measured(ZERO3)
    for phase in PHASES:
        assert pred[phase] - zero3[phase] == meas[phase] - meas_zero3[phase], phase
    assert pred["forward"] - zero3["forward"] == E * SHAPES["L"] * SHAPES["P_layer"] / R
    # The absolute peaks: ZeRO-3 has no root kept gathered, FSDP2 (the measured baseline) does.
    root = predicted(solve(solver, ZERO3, **fsdp(data_parallel="fsdp")))
    for phase in PHASES:
        assert abs(pred[phase] + root[phase] - zero3[phase] - meas[phase]) <= BASELINE_TOLERANCE, phase


def test_hpz_uses_the_gathered_dtype_not_the_precision(solver):
    run_id = "fsdp2-gqa-tiny-fp32-w8-raf-2-b2-s256-r0"
    [term] = _secondary(_hpz(solver, run_id, 2, regime="mixed-bf16", precision="bf16"))    # (DeepSpeed's bf16: 16-bit
    assert term.nbytes == 2 * SHAPES["L"] * SHAPES["P_layer"] / 2                       # weights; fsdp-bf16 needs FSDP)
    assert term.label == "hpZ secondary partition of the layers (mixed-bf16, 2 B)"
    [term] = _secondary(_hpz(solver, run_id, 2, regime="amp-bf16", precision="bf16"))
    assert term.nbytes == 4 * SHAPES["L"] * SHAPES["P_layer"] / 2     # autocast: fp32 weights gathered


def test_hpz_group_of_one_is_zero3(solver):
    run_id = "fsdp2-gqa-tiny-fp32-w8-raf-2-b2-s256-r0"
    r = _hpz(solver, run_id, 1)
    zero3 = solve(solver, ZERO3, **fsdp(zero_stage=3))
    assert _secondary(r) == [] and r.phase_totals == zero3.phase_totals


def test_hpz_pipeline_and_tensor_parallel_split_the_secondary(solver):
    """Per rank: the stage's layers, each layer's tensor-parallel shard (norms replicated)."""
    from mlsysim_plugins.measured.shapes import ModelShape
    model = from_hf_config(RUNS[ZERO3]["hf_config"], name="gqa-tiny")
    shape = ModelShape.of(model)
    r = solver.solve(model, HardwareNode(name="cpu", memory_capacity=2**40), 64, 256, precision="fp32",
                     regime="fp32", optimizer="adamw", activation_checkpointing="none", tp_size=2, pp_size=2,
                     dp_size=8, data_parallel=HPZ_NAME, plugin_options={HPZ_NAME: {"secondary_group": 4}},
                     runtime_overheads=False)
    matrices = sum(n for _, n in shape.layer_matrices())
    per_layer = matrices / 2 + shape.layer_norm_parameters
    for rank in r.ranks:
        [term] = [t for t in rank.terms if t.label.startswith("hpZ")]
        assert term.nbytes == 2 * per_layer / 4 * 4          # 2 layers per stage, group 4, 4 B


# --- activation offload (save_on_cpu) ---------------------------------------------------------------

OFFLOAD_NAME = "offload.selective-offload"


def _offload(solver, run_id=OFFLOAD, layers_on_device=0, **kw):
    return solve(solver, run_id, activation_checkpointing=OFFLOAD_NAME,
                 plugin_options={OFFLOAD_NAME: {"layers_on_device": layers_on_device}}, **kw)


def _outside_the_layers(phase: str) -> int:
    """What save_on_cpu (around the whole forward and the loss) also moves to the host but the package,
    which offloads decoder layers only, leaves where the profile counts it, on the device: the embedding
    output (saved by layer 0's first norm), RoPE's cos and sin, the final norm's saved tensors
    (normalized, output, rsqrt: 8 T h + 4 T); in the forward, the final norm's output (T h) is still
    referenced by the model, so it stays on the device in the measurement too. Nothing in the step."""
    T, h, s, d = SHAPES["T"], SHAPES["h"], SHAPES["s"], SHAPES["head_dim"]
    outside = E * T * h + 2 * s * d * E + (8 * T * h + 4 * T)
    return {"forward": outside - E * T * h, "backward": outside, "optimizer": 0}[phase]


def test_offload_host_memory_is_the_decoder_layers_measured(solver):
    r = _offload(solver)
    packed = RUNS[OFFLOAD]["measured"]["offload"]["packed_in_measured_forward"]["by_module"]
    layers = sum(v["bytes"] for k, v in packed.items() if k.startswith("layers."))
    host = COMPARISONS[OFFLOAD, BASELINE]["host"]
    assert r.host_memory == layers == SHAPES["L"] * host["host_layer"] == 4 * 16_164_864
    [term] = [t for t in r.terms if t.tier == "host"]
    assert term.source == "activation_offload" and "measured to the byte" in term.formula
    # The rest of what save_on_cpu copied (the loss region's log-softmax twice, the LM head's weight and
    # input, the final norm, the int64 ids) is outside the decoder layers: not offloaded by the package.
    outside = sum(v["bytes"] for k, v in packed.items() if not k.startswith("layers."))
    assert r.host_memory + outside == host["measured_peak"] == 230_609_924


def test_offload_phase_by_phase(solver):
    """Device bytes: predicted - measured = the baseline's residual + what lies outside the decoder
    layers (``_outside_the_layers``), to the byte; the step unchanged."""
    pred, meas = predicted(_offload(solver)), measured(OFFLOAD)
    base, meas_base = predicted(solve(solver, BASELINE)), measured(BASELINE)
    for phase in PHASES:
        assert pred[phase] - meas[phase] == base[phase] - meas_base[phase] + _outside_the_layers(phase), phase
    # The decoder layers' share of the delta: every layer's saved tensors leave the device.
    retained = RUNS[BASELINE]["measured"]["layer_forward_retained_bytes"]
    assert base["forward"] - pred["forward"] == sum(retained) == 4 * 10_113_024


def test_offload_keeps_one_layer_in_flight_at_the_backward_end(solver):
    r = _offload(solver)
    [staging] = [t for t in r.terms if t.label == "offload staging buffer (one layer in flight)"]
    assert staging.nbytes == COMPARISONS[OFFLOAD, BASELINE]["host"]["host_layer"] and staging.phases == ("backward_end",)
    # Not at the measured peaks: the loss region dominates them (forward and backward), as measured.
    assert r.peak_phase == "backward"


@pytest.mark.parametrize("kept", [1, 2, 4, 9])
def test_offload_kept_layers_stay_on_the_device(solver, kept):
    r = _offload(solver, layers_on_device=kept)
    layer = RUNS[BASELINE]["measured"]["layer_forward_retained_bytes"][0]
    offloaded = max(SHAPES["L"] - kept, 0)
    assert r.host_memory == offloaded * COMPARISONS[OFFLOAD, BASELINE]["host"]["host_layer"]
    on_device = sum(t.nbytes for t in r.terms_of("activations") if t.source == "activation_offload"
                    and t.tier == "accelerator" and "forward" in t.phases)
    assert on_device == min(kept, SHAPES["L"]) * layer


def test_offload_says_what_it_approximates(solver):
    """Outside the measured case (Llama-style fp32 layers, SDPA, one device) the host bytes are the
    profile's saved bytes plus the weights, and the formula says so."""
    for kw, why in [(dict(regime="amp-bf16", precision="bf16"), "regime amp-bf16"),
                    (dict(attention="eager"), "attention eager")]:
        r = _offload(solver, **kw)
        [term] = [t for t in r.terms if t.tier == "host"]
        assert f"approximation ({why})" in term.formula
