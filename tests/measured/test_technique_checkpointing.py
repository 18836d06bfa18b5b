"""Activation-checkpointing policies (plugins/mlsysim_plugins/checkpointing_policies.py): torchtitan's
per-op selective AC (op-sac), a user's save list, every k-th layer, MLP-only and attention-only
recompute, against the PyTorch measurements of validation/techniques/checkpointing (no torch here)."""

import json
import statistics
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError, NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.types import HardwareNode
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "validation" / "techniques" / "checkpointing"
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
POLICIES = ("op-sac", "save-list", "every-k", "mlp-only", "attention-only")


@pytest.fixture(scope="module")
def rows():
    import sys
    sys.path[:0] = [str(ROOT / "validation"), str(ROOT / "validation" / "families")]
    return load_script(HERE / "compare.py").compare()


CONFIGS = load_script(HERE / "configs.py")


def _solve(model="llama-tiny", policy="op-sac", *, options=None, b=2, s=256, regime="fp32", **kw):
    hf = CONFIGS.MODELS[model][1] if isinstance(model, str) else model
    return TrainingMemoryModel().solve(from_hf_config(hf, name="m"), BIG, b, s, "fp32" if regime == "fp32" else "bf16",
                                       "adamw", policy, profile="measured", regime=regime, device="cpu",
                                       runtime_overheads=False, plugin_options=options, **kw)


def _plan(model="llama-tiny", policy="op-sac", options=None):
    from mlsysim_core.inputs import check_plan, profile_plan
    mm = TrainingMemoryModel()
    reg = mm.registry
    plan = check_plan(reg, "measured", from_hf_config(CONFIGS.MODELS[model][1], name="m"), BIG, 2, 256, "fp32",
                      "adamw", policy, 1, 1, 1, 1, 0, 1, 1.0, 0.05, False, None, None, options, (), 1)
    return profile_plan(reg, reg.profiles["measured"], plan, {"regime": "fp32", "device": "cpu"})


def _term(result, label_start):
    return sum(t.nbytes for t in result.terms if t.label.startswith(label_start))


def test_every_policy_and_phase_meets_the_targets(rows):
    runs = json.loads((HERE / "measurements.json").read_text())["runs"]
    assert len(rows) == len(runs) == len(CONFIGS.CONFIGS) and not [r for r in runs if "error" in r]
    # Every policy at two sizes of each family (Llama-style dense, Mixtral-style MoE).
    assert {r["run"]["family"] for r in rows} == {"llama", "mixtral"}
    for family in ("llama", "mixtral"):
        for policy in POLICIES:
            sizes = {r["run"]["model"] for r in rows if r["run"]["family"] == family and r["run"]["checkpointing"] == policy}
            assert len(sizes) >= 2, (family, policy, sizes)
    for family in ("llama", "mixtral"):
        mine = [r for r in rows if r["run"]["family"] == family]
        errors = [abs(e) for r in mine for e in r["errors"].values()]
        peaks = [abs(r["peak_error"]) for r in mine]
        assert statistics.median(peaks) <= 0.03 and max(peaks) <= 0.10, family
        assert statistics.median(errors) <= 0.03 and max(errors) <= 0.10, family
        for r in mine:
            assert set(r["errors"]) == {"forward", "backward", "optimizer"}


def test_op_sac_keeps_the_input_and_every_other_mm_and_the_attention_output():
    # llama-tiny fp32, T = 2 x 256 = 512 tokens, h = q = kv = 256, 8 heads, f = 688, 4 layers.
    # torchtitan's policy over mms q, k, v, o, gate, up, down saves the 1st, 3rd, 5th, 7th: q, v, gate, down;
    # SDPA saves its output (4 x q) and fp32 logsumexp (4 x 8). Per token: input 4h + 4q + 4kv + (4q + 32)
    # + 4f + 4h = 1024 x 5 + 32 + 2752 = 7904 B.
    r = _solve()
    assert _term(r, "op-sac layers") == 4 * 512 * 7904
    # save-list ["sdpa"]: the input and the attention's outputs only: 1024 + 1024 + 32 per token.
    r = _solve(policy="save-list", options={"save-list": {"ops": ["sdpa"]}})
    assert _term(r, "save-list layers") == 4 * 512 * 2080
    # Mixtral (mixtral-tiny, kv = 64 (2 KV heads of 32), 8 experts): mms q, k, v, o, router -> q, v, router saved.
    r = _solve("mixtral-tiny")
    assert _term(r, "op-sac layers") == 4 * 512 * (4 * 256 + 4 * 256 + 4 * 64 + 4 * 256 + 32 + 4 * 8)


def test_the_backward_end_is_layer_0s_moe_backward_or_the_embeddings_not_both():
    # mixtral-tiny op-sac fp32: T = 512, h = 256, f = 512, E = 8, top-2: S = 1024 routed rows, 4 B everywhere.
    # Layer 0's gate_up grouped_mm backward (MemTracker's backward peak): its weight gradient 2 E f h and the
    # down weight gradient E h f born, the gate_up output, silu and product freed (-2 S f), inv_perm and the
    # routing weights freed, their gradient born (-8 S): 4 x (3 x 8 x 512 x 256 - 2 x 1024 x 512) - 8 x 1024.
    moe = 4 * (3 * 8 * 512 * 256 - 2 * 1024 * 512) - 8 * 1024
    assert moe == 8_380_416
    # + the layer's saved tensors 14,497,824, its input and output gradient 2 x T h 4, RoPE 2 x s x 32 x 4, and the
    # gradients of every layer but 0 and of the LM head (17,344,768 - 2,048,000 - 3,312,128 params x 4 B); the
    # embedding's gradient (V h 4) is not born yet. With the weights, AdamW state and input ids:
    layer0 = moe + 14_497_824 + 2 * 512 * 256 * 4 + 2 * 256 * 32 * 4 + (17_344_768 - 2_048_000 - 3_312_128) * 4
    r = _solve("mixtral-tiny")
    end = sum(t.nbytes for t in r.terms if "backward_end" in [str(p) for p in t.phases])
    assert end == 17_344_768 * 4 + 128 + 17_344_768 * 8 + 156 + 512 * 8 + layer0
    # Measured 280,074,564 B: 2,056 B more (position ids, loss scalars).
    assert 280_074_564 - end == 2_056


def test_every_k_checkpoints_floor_l_over_k_layers():
    none = _solve(policy="none")
    full = _solve(policy="full")
    two = _solve(policy="every-k", options={"every-k": {"k": 2}})
    kept = _term(none, "decoder layers: saved") / 4
    assert _term(two, "decoder layers: saved") == 2 * kept            # layers 0 and 2 keep everything
    assert _term(two, "checkpointed layers") == 2 * 4 * 512 * 256     # layers 1 and 3: their fp32 inputs
    one = _solve(policy="every-k", options={"every-k": {"k": 1}})
    assert one.total_memory == full.total_memory
    assert _solve(policy="every-k", options={"every-k": {"k": 5}}).total_memory == none.total_memory


def test_module_policies_drop_the_module_parts():
    none = _solve(policy="none")
    mlp = _solve(policy="mlp-only")
    # fp32 Llama: the MLP saves 4 x 4f per token (gate, silu, up, product); its input (the norm output) is kept.
    assert _term(none, "decoder layers: saved") - _term(mlp, "decoder layers (mlp") == 4 * 512 * 16 * 688


def test_added_step_time_prices_the_recomputed_matmuls():
    from mlsysim_plugins.checkpointing_policies import added_step_time
    plan = _plan()
    seconds, how = added_step_time(plan, hardware_flops=1e12)
    # k, o, up recomputed: 2 x T x (h kv + q h + h f) per layer, 4 layers.
    flops = 4 * 2 * 512 * (256 * 256 + 256 * 256 + 256 * 688)
    assert seconds == pytest.approx(flops / 1e12) and "k_proj" in how
    assert added_step_time(plan)[0] is None


@pytest.mark.parametrize("options, match", [({"every-k": {"k": 0}}, "k"), ({"save-list": {"ops": ["gemm"]}}, "gemm")])
def test_bad_options_are_errors(options, match):
    policy = next(iter(options))
    with pytest.raises(InvalidInputError, match=match):
        _solve(policy=policy, options=options)


def test_what_is_not_modelled_is_refused_by_name():
    gpt2 = dict(model_type="gpt2", vocab_size=8000, n_positions=1024, n_embd=256, n_layer=4, n_head=4,
                tie_word_embeddings=True, use_cache=False)
    with pytest.raises(NotModelledError, match="gpt2"):
        _solve(gpt2, "op-sac")
    with pytest.raises(NotModelledError, match="dropout"):
        _solve(policy="op-sac", dropout=0.1)
    with pytest.raises(NotModelledError, match="LoRA"):
        _solve(policy="mlp-only", lora={"rank": 8})
    # (Under tensor, context and pipeline parallelism the policies are modelled: test_policies_parallel.py.)


def test_the_policies_are_registered():
    assert set(POLICIES) <= set(TrainingMemoryModel().registry.checkpointing)
