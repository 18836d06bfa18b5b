"""torchtune's activation offloading in full training around compiled, checkpointed blocks (issue 25, items 1-2):
the measured profile against validation/offload_full/measurements.json (torchtune 0.6.1's OffloadActivations around
blocks compiled, then checkpointed, as full_finetune_single_device runs them, measured on the CPU with the host copies
simulated), every phase and the host; hand-derived host bytes; what stays refused."""

from __future__ import annotations

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.terms import BACKWARD, FORWARD, HOST
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROWS = list(load_script("validation/offload_full/compare.py").rows())

# At 256 tokens the top block's backward under optimizer_in_bwd peaks inside its attention's backward (the MLP's
# weight gradients stepped and freed before it), a moment compile.blocks_outside_full_terms does not price: -1.65 %
# offloaded, and its twin without offloading the same (the offload's own terms add none).
ATTENTION = {"tt-llama3_2-3l-v1024-bf16-blocks-full-oib-chunked-b1-s256-offload",
             "tt-llama3_2-3l-v1024-bf16-blocks-full-oib-chunked-b1-s256"}


COMPILED = [r for r in ROWS if "-blocks-" in r[0]]
EAGER = {rid: (pred, meas) for rid, pred, meas in ROWS if "-eager-" in rid}


def _err(pred, meas, phase):
    return (pred[phase] - meas[phase]) / meas[phase]


def test_every_run_measured():
    ids = [rid for rid, _, _ in COMPILED]
    assert sum(rid.endswith("-offload") for rid in ids) >= 7 and sum("-oib-" in rid for rid in ids) >= 5
    assert len(EAGER) >= 6


@pytest.mark.parametrize("rid,pred,meas", COMPILED, ids=[r[0] for r in COMPILED])
def test_every_phase_within_one_percent(rid, pred, meas):
    for phase in ("forward", "backward", "optimizer", "end_of_forward", "end_of_backward"):
        if rid in ATTENTION and phase == "backward":
            assert -0.02 < (pred[phase] - meas[phase]) / meas[phase] < -0.01, (rid, pred[phase], meas[phase])
            continue
        assert abs(pred[phase] - meas[phase]) <= 0.01 * meas[phase], (rid, phase, pred[phase], meas[phase])
    # the host copies: the token ids, each layer's input once, the final norm's packs one copy per save, to the byte
    assert pred["host"] == meas["host"], rid


HF = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 688,
      "num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 1024,
      "tie_word_embeddings": True, "head_dim": 32, "max_position_embeddings": 512, "rms_norm_eps": 1e-5,
      "hidden_act": "silu"}


def _solve(**kw):
    args = dict(profile="measured", regime="bf16", attention="sdpa", device="cpu", runtime_overheads=False,
                compile="blocks", compile_checkpoint="outside", loss="chunked", optimizer_in_backward=True,
                activation_offload="torchtune")
    args.update(kw)
    checkpointing = args.pop("checkpointing", "full")
    return TrainingMemoryModel().solve(from_hf_config(HF, name="tiny"), HardwareNode(name="u", memory_capacity=2**60),
                                       2, 512, "bf16", "adamw", checkpointing, **args)


def test_host_bytes_hand_derived():
    # T = 2 x 512 = 1,024 tokens, h = 256, bf16: 8 layer inputs 8 x 2 T h = 4,194,304 B; the token ids 8 T and the
    # final norm's packs (torchtune's RMSNorm composite, its weight trained: x fp32, r, r, x fp32, the weight not
    # copied, the normalized fp32 product) 3 x 4 T h + 2 x 4 T: 8,192 + 3,153,920 = 3,162,112 B
    r = _solve()
    host = sorted(t.nbytes for t in r.terms if t.tier == HOST)
    assert host == [8 * 1024 + 3 * (4 * 1024 * 256) + 2 * (4 * 1024), 8 * 2 * 1024 * 256]
    assert any(n.startswith("activation_offload=torchtune with compiled blocks") for n in r.notes)


def test_offload_moves_the_layer_inputs_off_the_device():
    on, off = _solve(), _solve(activation_offload=None)
    x = 2 * 1024 * 256
    # the end of the forward: all 8 inputs left the device (the final norm's 5 offloaded packs pushed them out of
    # the stash of 5); the loss's backward (the peak) holds none of them
    eof = {name: sum(t.nbytes for t in res.terms if t.tier != HOST and FORWARD in t.phases and BACKWARD in t.phases)
           for name, res in (("on", on), ("off", off))}
    assert eof["off"] - eof["on"] == 8 * x
    assert off.phase_totals[BACKWARD] - on.phase_totals[BACKWARD] == 8 * x
    for phase, total in off.phase_totals.items():
        assert on.phase_totals[phase] <= total


@pytest.mark.parametrize("kw,name,message", [
    (dict(activation_offload="save_on_cpu"), "activation_offload", "'torchtune' with compile"),
    (dict(compile_checkpoint="inside"), "activation_checkpointing", "torchtune's order"),
    (dict(checkpointing="none", compile_checkpoint=None, optimizer_in_backward=False), "activation_checkpointing",
     "torchtune's order"),
])
def test_what_is_not_measured_is_refused(kw, name, message):
    with pytest.raises(NotModelledError) as err:
        _solve(**kw)
    assert err.value.parameter == name and message in str(err.value)


def test_eager_full_training_keeps_its_derived_path():
    r = _solve(compile=None, compile_checkpoint=None, loss=None, optimizer_in_backward=False)
    assert any("unvalidated" in n and "as measured around eager layers" in n for n in r.notes)
    r = _solve(compile=None, compile_checkpoint=None, loss=None, optimizer_in_backward=False, checkpointing="none")
    assert any("unvalidated" in n and "transposed weights" in n for n in r.notes)


def test_eager_layers_with_full_checkpointing():
    """Eager layers, full checkpointing (the derived mode, item 2): the hook sees what it sees around compiled blocks
    (the same packs), so the host is exact; every device phase is off by what the eager profile is off by without
    offloading (the bf16 twin: the same bytes short in the forward, the end of the forward and the backward), but
    the 3-layer fp32 forward: its peak is the top layer's MLP forward with the 3 inputs still stashed, a layer's
    forward transient the eager profile does not price (-6.8 %)."""
    twin = EAGER["tt-llama3_2-4l-v1024-kv2-bf16-eager-full-chunked-b2-s512"]
    on = EAGER["tt-llama3_2-4l-v1024-kv2-bf16-eager-full-chunked-b2-s512-offload"]
    for phase in ("forward", "backward", "end_of_forward"):
        assert abs((on[0][phase] - on[1][phase]) - (twin[0][phase] - twin[1][phase])) <= 0.001 * on[1][phase], phase
    for rid, (pred, meas) in EAGER.items():
        if "-full-" not in rid:
            continue
        assert pred["host"] == meas["host"], rid
        for phase in ("optimizer", "end_of_backward"):
            assert abs(_err(pred, meas, phase)) <= 0.01, (rid, phase)
    pred, meas = EAGER["tt-llama3_2-3l-v1024-fp32-eager-full-chunked-b2-s512-offload"]
    assert -0.07 < _err(pred, meas, "forward") < -0.06 and abs(_err(pred, meas, "end_of_forward")) <= 0.01


def test_eager_layers_without_checkpointing_undercount_as_noted():
    """Without checkpointing the hook sees every saved tensor, the matmuls' transposed weight views included (not
    nn.Parameter): the derived mode counts neither those copies nor the stash and the late frees (its note)."""
    for rid, (pred, meas) in EAGER.items():
        if "-full-" in rid:
            continue
        assert pred["host"] < 0.91 * meas["host"], rid
        assert -0.30 < _err(pred, meas, "backward") < -0.25, rid
        assert -0.17 < _err(pred, meas, "forward") < -0.10, rid
