"""Per-rank results of parallel layouts (measured profile): rank classes, pipeline
schedules, tensor/sequence/context parallelism, expert parallelism, data-parallel
sharding and offload; and the published check against Korthikanti et al. 2022, Fig. 1."""

import pathlib

import pytest

from mlsysim_core import InvalidInputError, LayoutError, TrainingMemoryModel, TransformerWorkload
from mlsysim_plugins.measured.layers import megatron_layer_bytes
from mlsysim_plugins.measured.parallel import in_flight, rank_classes, rank_parameters, stage_layer_counts
from mlsysim_core.result import _phase_totals
from scripttools import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]
MEASURED = TrainingMemoryModel("measured")


def solve(model="llama3-8b", batch=64, seq=2048, **kwargs):
    kwargs.setdefault("runtime_overheads", False)
    kwargs.setdefault("precision", "bf16")
    return MEASURED.solve(model, "h100", batch, seq, **kwargs)


# --- published: Korthikanti et al. 2022, Fig. 1 -------------------------------------------------

@pytest.mark.parametrize("row", load_script("validation/published/korthikanti.py").rows(), ids=lambda row: f"{row[0]}-{row[1]}")
def test_korthikanti_fig1_within_5_percent(row):
    name, what, published, predicted = row
    assert abs(predicted / published - 1) <= 0.05, (name, what, published, predicted)


# --- Korthikanti Table 2, per layer, by hand -----------------------------------------------------

S, B, H, A, T8 = 2048, 1, 12288, 96, 8


def _ctx(tp, sp):
    """What the rules split, as the activation formulas' context carries it (tp's split of the
    matrices, and of the residual stream with sequence parallelism)."""
    from types import SimpleNamespace
    return SimpleNamespace(tokens=S * B, seq_len=S, tensor=tp, sequence=1, residual=tp if sp and tp > 1 else 1,
                           expert_tensor=tp)


def _plan(tp, sp, rank_in_flight=1.0):
    class Rank:
        in_flight = rank_in_flight

    from mlsysim_plugins.measured.regimes import REGIMES

    from types import SimpleNamespace

    class Plan:
        tp_size, cp_size, sequence_parallel, rank = tp, 1, sp, Rank
        profile_options = SimpleNamespace(regime=REGIMES["mixed-bf16-main-grad"], expert_tp_size=tp)   # Megatron-Core
    return Plan


@pytest.mark.parametrize("tp,sp,selective,expected", [
    (1, False, False, S * B * H * (34 + 5 * A * S / H)),                  # no parallelism
    (T8, False, False, S * B * H * (10 + 24 / T8 + 5 * A * S / (H * T8))),  # TP only
    (T8, True, False, S * B * H * (34 / T8 + 5 * A * S / (H * T8))),      # TP + SP
    (T8, False, True, S * B * H * (10 + 24 / T8)),                        # TP + selective
    (T8, True, True, S * B * H * 34 / T8),                                # TP + SP + selective
])
def test_megatron_layer_reproduces_table_2(tp, sp, selective, expected):
    from mlsysim_plugins.measured.parallel import rank_layer_saved
    lb = megatron_layer_bytes(style="gpt2", hidden=H, heads=A, kv_heads=A, head_dim=H // A, ffn=4 * H,
                              attention="eager", dropout=True, tokens=S * B, seq_len=S)
    per_layer, _, n = rank_layer_saved(_plan(tp, sp), _ctx(tp, sp), lb, selective)
    assert per_layer == pytest.approx(expected, rel=1e-12) and n == 1


# --- schedules -------------------------------------------------------------------------------------

def test_in_flight_micro_batches_per_schedule():
    p, m = 8, 64
    assert [in_flight("gpipe", p, i, m) for i in (0, 7)] == [64, 64]
    assert [in_flight("1f1b", p, i, m) for i in range(p)] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert in_flight("1f1b", p, 0, 3) == 3                      # fewer micro-batches than stages
    assert in_flight("zb-h1", p, 0, m) == 8                     # ZB-H1 keeps 1F1B's peak
    assert in_flight("zb-h2", p, 0, m) == 2 * p - 1             # ZB-H2: (2p - 1) M_B
    # Interleaved with v chunks: stage 0 holds p (1 + (p-1)/(p v)) micro-batches (Korthikanti §4.2.3).
    for v in (2, 3, 4):
        assert in_flight("interleaved-1f1b", p, 0, m, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert in_flight("1f1b", 1, 0, m) == 1


def test_rank_classes_first_middle_last():
    result = solve(tp_size=2, pp_size=4, dp_size=8, gradient_accumulation_steps=8)
    names = [r.name for r in result.ranks]
    assert names == ["first stage", "middle stages (heaviest: stage 1)", "last stage"]
    first, middle, last = result.ranks
    assert (first.in_flight, middle.in_flight, last.in_flight) == (4, 3, 1)
    assert middle.stages == (1, 2) and middle.ranks == 2 * 16 and first.ranks == 16
    assert sum(r.ranks for r in result.ranks) == 2 * 4 * 8
    heaviest = max(result.ranks, key=lambda r: r.total_memory)
    assert result.heaviest_rank == heaviest.name and result.total_memory == heaviest.total_memory
    # The embedding lives on the first stage, the LM head and loss on the last.
    assert any("embedding output" in t.label for t in first.terms)
    assert not any("log-softmax" in t.label for t in first.terms)
    assert any("log-softmax" in t.label for t in last.terms)


def test_feasible_only_if_every_rank_fits():
    result = solve(batch=32, seq=8192, tp_size=1, pp_size=4, dp_size=1, gradient_accumulation_steps=32,
                   activation_checkpointing="none")
    assert not result.ranks[0].feasible and not result.feasible
    assert result.heaviest_rank == "first stage"


def test_uneven_stage_layers():
    result = solve(pp_size=4, dp_size=1, gradient_accumulation_steps=8, stage_layers=[5, 9, 10, 8])
    assert [r.layers for r in result.ranks] == [5, 9, 10, 8][:1] + [r.layers for r in result.ranks[1:-1]] + [8]
    middles = [r for r in result.ranks if r.name.startswith("middle")]
    # stage 1 (9 layers, 3 in flight) and stage 2 (10 layers, 2 in flight): neither dominates
    assert sorted(s for r in middles for s in r.stages) == [1, 2] and len(middles) == 2
    with pytest.raises(LayoutError, match=r"stage_layers=\[5, 9, 10, 9\].*adding up to the model's 32 layers"):
        solve(pp_size=4, stage_layers=[5, 9, 10, 9])


def test_default_split_puts_the_remainder_on_middle_stages():
    model = TransformerWorkload(name="t", parameters=10**9, layers=30, hidden_dim=2048, heads=16, vocab_size=32000)

    from types import SimpleNamespace

    class Plan:
        pp_size = 4
        profile_options = SimpleNamespace(stage_layers=None)
    Plan.model = model
    assert stage_layer_counts(Plan, 4) == (7, 8, 8, 7)


def test_parameters_per_rank_add_up_to_the_model():
    """Every stage x every tp (and ep x expert-tp) rank: the model's parameters, with the
    tp-replicated norms and router counted once."""
    import attrs
    from types import SimpleNamespace
    from mlsysim_core.catalog import get_model
    from mlsysim_plugins.measured.shapes import ModelShape
    for name, ep in (("llama3-8b", 1), ("mixtral-8x7b", 8)):
        model = get_model(name)
        plan = SimpleNamespace(model=model, tp_size=2, ep_size=ep, pp_size=4, gradient_accumulation_steps=8,
                               cp_size=1, dp_size=8, profile_options=SimpleNamespace(
                                   expert_tp_size=2, stage_layers=None, virtual_stages=1, pipeline_schedule="1f1b"))
        placement = SimpleNamespace(tensor_shards=2, expert_shards=ep, pipeline_stages=4)     # the rules' split
        total = 0.0
        for rank in rank_classes(plan, placement):
            for stage in rank.stages:
                one = attrs.evolve(rank, stage=stage, layers=stage_layer_counts(plan, 4)[stage])
                groups = rank_parameters(plan, one, placement)
                total += groups["dense"] * plan.tp_size + groups["experts"] * ep * plan.profile_options.expert_tp_size
        shape = ModelShape.of(model)
        replicated = shape.layers * (2 * shape.hidden + shape.experts * shape.hidden) + shape.hidden
        assert total - (plan.tp_size - 1) * replicated == pytest.approx(model.parameters, rel=1e-4), name


# --- tensor, sequence and context parallelism ----------------------------------------------------

def test_sequence_parallelism_splits_what_tp_alone_does_not():
    with_sp = solve(tp_size=8, dp_size=1, sequence_parallel=True)
    without = solve(tp_size=8, dp_size=1)       # the measured profile's default: PyTorch's TP plans
    a_sp = _phase_totals(with_sp.ranks[0].terms, "activations")["forward"]
    a_tp = _phase_totals(without.ranks[0].terms, "activations")["forward"]
    assert a_tp > a_sp * 1.5


def test_context_parallelism_divides_activations_and_adds_ring_buffers():
    one = solve(seq=8192, batch=8, dp_size=8, activation_checkpointing="none")
    cp = solve(seq=8192, batch=8, dp_size=8, cp_size=4, activation_checkpointing="none")
    layers = lambda r: next(t.nbytes for t in r.terms if t.label == "decoder layers: saved for backward")
    assert layers(cp) == pytest.approx(layers(one) / 4)
    ring = next(t for t in cp.terms if t.label == "ring-attention K/V send + receive buffers")
    # 2 (send, recv) x 2 (K, V) x 8192/4 tokens x 8 kv heads x 128 x 2 B
    assert ring.nbytes == 2 * 2 * 2048 * 8 * 128 * 2
    assert cp.parallelism["cp"] == 4
    with pytest.raises(LayoutError, match="cp_size=3 is not allowed: a divisor of seq_len=8192"):
        solve(seq=8192, cp_size=3)


# --- expert parallelism ----------------------------------------------------------------------------

def test_experts_shard_over_ep_and_dense_over_tp():
    from mlsysim_core.catalog import get_model
    from mlsysim_plugins.measured.shapes import ModelShape
    shape = ModelShape.of(get_model("mixtral-8x7b"))
    result = solve("mixtral-8x7b", tp_size=2, dp_size=8, ep_size=8, optimizer="adamw")
    weights = next(t for t in result.terms if t.component == "weights" and t.label.startswith("parameters"))
    h, f, E = shape.hidden, shape.ffn, shape.experts
    attention = h * shape.q_dim * 2 + 2 * h * shape.kv_dim
    per_layer = attention / 2 + E * h + 2 * h + E * 3 * f * h / (8 * 2)
    expected = shape.layers * per_layer + shape.embedding_parameters / 2 * 2 + h
    other = max(0, shape.parameters - (2 * shape.embedding_parameters + shape.layers * (
        sum(n for _, n in shape.layer_matrices()) + 2 * h) + h)) / 2
    assert weights.nbytes == pytest.approx((expected + other) * 4, rel=1e-9)   # amp-bf16: fp32 weights
    assert any(t.label == "expert all-to-all dispatch + combine buffers" for t in result.terms)
    with pytest.raises(LayoutError, match="expert_tp_size"):
        solve("mixtral-8x7b", tp_size=2, dp_size=2, ep_size=8, expert_tp_size=2)


# --- data parallelism and offload --------------------------------------------------------------------

def test_ddp_buckets_zero_sharding_and_gathers():
    ddp = solve(dp_size=8, optimizer="adamw")
    bucket = next(t for t in ddp.terms if t.label == "DDP gradient buckets")
    grads = sum(t.nbytes for t in ddp.terms if t.component == "gradients")
    assert bucket.nbytes == grads
    z3 = solve(dp_size=8, zero_stage=3, optimizer="adamw")
    assert z3.weights == pytest.approx(ddp.weights / 8, rel=1e-3)
    assert any(t.label.startswith("all-gathered parameters of one layer") for t in z3.terms)
    assert not any(t.label == "DDP gradient buckets" for t in z3.terms)


def test_offload_moves_state_to_host_memory():
    on = solve(dp_size=8, zero_stage=2, optimizer="adamw")
    off = solve(dp_size=8, zero_stage=2, optimizer="adamw", offload="optimizer")
    state = sum(t.nbytes for t in on.terms if t.component == "optimizer_state")
    assert off.optimizer_state == 0 and off.host_memory == pytest.approx(state)
    assert off.total_memory < on.total_memory
    nvme = solve(dp_size=8, zero_stage=3, optimizer="adamw", offload={"optimizer": "nvme", "parameters": "cpu"})
    assert nvme.host_memory == pytest.approx(sum(t.nbytes for t in nvme.terms if t.tier == "host"))
    assert any(t.tier == "nvme" for t in nvme.terms) and nvme.weights < 2**30
    with pytest.raises(InvalidInputError, match="offload='activations' is not allowed: 'optimizer', "
                       "'optimizer\\+gradients', .*'activations' is not one of optimizer, gradients, parameters"):
        solve(offload="activations")


# --- errors -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs,message", [
    ({"pipeline_schedule": "dualpipe"}, "pipeline_schedule='dualpipe' is not allowed: one of: 1f1b, gpipe"),
    ({"pipeline_schedule": "1f1b", "virtual_stages": 2}, "virtual_stages=2 is not allowed: 1 unless"),
    ({"pp_size": 4, "stage_layers": "8,8,8,8"}, "stage_layers='8,8,8,8'"),
    ({"expert_tp_size": 2}, "expert_tp_size=2 is not allowed: None for a dense model"),
    ({"expert_tp_size": 1}, "expert_tp_size=1 is not allowed: None for a dense model"),
    ({"tp_size": 3}, "tp_size=3 is not allowed: a divisor of the model's 32 attention heads"),
    ({"model": "mixtral-8x7b", "ep_size": 3, "dp_size": 3}, "ep_size=3 is not allowed: a divisor of the model's 8 experts"),
])
def test_layout_options_are_checked(kwargs, message):
    with pytest.raises(InvalidInputError) as info:
        solve(**kwargs)
    assert message in str(info.value)


def test_reference_profile_refuses_per_rank_options():
    with pytest.raises(InvalidInputError, match="pipeline_schedule='gpipe' is not allowed: under profile 'reference', which has no such option"):
        TrainingMemoryModel().solve("llama3-8b", "h100", 8, pipeline_schedule="gpipe")


def test_per_rank_report_is_up_to_date():
    module = load_script("validation/report_parallel.py")
    assert module.main(["--check"]) == 0, "docs/validation.md is stale: run python validation/report_parallel.py"


def test_fsdp_rules():
    ref = TrainingMemoryModel()
    z3 = ref.solve("llama3-8b", "h100", 64, dp_size=16, zero_stage=3)
    fsdp = ref.solve("llama3-8b", "h100", 64, dp_size=16, data_parallel="fsdp")
    assert (fsdp.weights, fsdp.gradients, fsdp.optimizer_state) == (z3.weights, z3.gradients, z3.optimizer_state)
    hsdp = ref.solve("llama3-8b", "h100", 64, dp_size=16, data_parallel="hsdp")   # H100 nodes of 8
    assert hsdp.weights == pytest.approx(z3.weights * 2)
    four = ref.solve("llama3-8b", "h100", 64, dp_size=16, data_parallel="hsdp",
                     plugin_options={"hsdp": {"shard_group_size": 4}})
    assert four.weights == pytest.approx(z3.weights * 4)
    with pytest.raises(LayoutError, match=r"shard_group_size=3 is not allowed: a divisor of the data-parallel size"):
        ref.solve("llama3-8b", "h100", 64, dp_size=16, data_parallel="hsdp",
                  plugin_options={"hsdp": {"shard_group_size": 3}})
    # Measured: SHARD_GRAD_OP keeps the gathered parameters between forward and backward.
    full = solve(dp_size=16, data_parallel="fsdp", optimizer="adamw")
    grad_op = solve(dp_size=16, data_parallel="fsdp-grad-op", optimizer="adamw")
    kept = next(t for t in grad_op.terms if t.label == "unsharded parameters kept from forward to backward")
    assert kept.nbytes == pytest.approx(8_030_261_248 * 4, rel=1e-6)   # every parameter gathered, fp32 (amp)
    assert grad_op.total_memory > full.total_memory


def test_per_rank_memo_is_byte_identical():
    from mlsysim_core import memo
    layouts = [dict(tp_size=2, pp_size=4, dp_size=8, gradient_accumulation_steps=8),
               dict(model="mixtral-8x7b", tp_size=2, pp_size=2, dp_size=8, ep_size=4, zero_stage=1,
                    pipeline_schedule="interleaved-1f1b", gradient_accumulation_steps=4),
               dict(dp_size=16, data_parallel="fsdp", cp_size=2, offload="optimizer")]
    cached = [solve(**kw).to_json() for kw in layouts]
    memo.set_enabled(False)
    try:
        plain = [solve(**kw).to_json() for kw in layouts]
    finally:
        memo.set_enabled(True)
    assert cached == plain


def test_fake_process_group_ranks_within_targets():
    """Every rank measured under PyTorch's fake process group (FSDP2, TP, TP+SP, 2-D):
    median within 5 %, max within 10 % (issue #4's targets)."""
    import json
    import statistics
    compare = load_script("validation/parallel/compare.py")
    rows = compare.compare(json.loads((ROOT / "validation/parallel/measurements.json").read_text()))
    assert len(rows) >= 60
    errors = [abs(r["error"]) for r in rows]
    assert statistics.median(errors) <= 0.05 and max(errors) <= 0.10, max(rows, key=lambda r: abs(r["error"]))
    kinds = {r["layout"].split(" ")[0] for r in rows}
    assert kinds == {"fsdp2", "tp", "tp+sp", "2d"}
    # The peak phase is predicted as measured wherever the measured peak is the loss backward.
    same = [r for r in rows if r["measured_phase"] == "backward"]
    assert all(r["predicted_phase"] == "backward" for r in same)


def test_moe_capacity_factor_scales_expert_activations():
    a = solve("mixtral-8x7b", tp_size=2, dp_size=8, ep_size=8, activation_checkpointing="none")
    b = solve("mixtral-8x7b", tp_size=2, dp_size=8, ep_size=8, activation_checkpointing="none",
              moe_capacity_factor=1.25)
    layers = lambda r: next(t.nbytes for t in r.terms if t.label == "decoder layers: saved for backward")
    experts = (layers(b) - layers(a)) / 0.25          # the experts' share of the layers' bytes
    assert 0 < experts < layers(a)
    a2a = lambda r: next(t.nbytes for t in r.terms if t.label.startswith("expert all-to-all"))
    assert a2a(b) == pytest.approx(1.25 * a2a(a))
    with pytest.raises(InvalidInputError, match="moe_capacity_factor=1.25 is not allowed: None for a dense model"):
        solve(moe_capacity_factor=1.25)
    with pytest.raises(InvalidInputError, match="moe_capacity_factor=0 is not allowed: a number > 0"):
        solve("mixtral-8x7b", moe_capacity_factor=0)


def test_ulysses_context_parallelism():
    r = solve(seq=8192, batch=8, dp_size=8, cp_size=4, sharding_rules={"cp": "cp-ulysses"})
    term = next(t for t in r.terms if t.label.startswith("Ulysses all-to-all"))
    # 2 (send, recv) x 8192/4 tokens x (2 x 4096 q/output + 2 x 1024 k/v) x 2 B
    assert term.nbytes == 2 * 2048 * (2 * 4096 + 2 * 1024) * 2
    with pytest.raises(LayoutError, match="cp_size=3 is not allowed"):
        solve(seq=6144, cp_size=3, tp_size=2, sharding_rules={"cp": "cp-ulysses"})


def test_accumulated_gradients_are_alive_in_every_phase():
    one = solve(batch=8, dp_size=1, runtime_overheads=False)
    four = solve(batch=32, dp_size=1, gradient_accumulation_steps=4, runtime_overheads=False)
    assert one.microbatch == four.microbatch == 8
    grads = sum(t.nbytes for t in four.terms if t.component == "gradients")
    assert four.phase_totals["forward"] == pytest.approx(one.phase_totals["forward"] + grads)
    assert all(t.phases == ("forward", "backward", "backward_end", "optimizer_step")
               for t in four.terms if t.component == "gradients")


def test_caches_never_return_another_configurations_terms():
    """Solve a shuffled mix of configurations with the memo on, then each alone with it off:
    a memo keyed on too little would hand one configuration another's terms."""
    import random
    from mlsysim_core import memo as _memo
    rng = random.Random(7)
    configs = []
    for _ in range(15):
        gas, dp = rng.choice([1, 2, 4]), rng.choice([1, 2, 4])
        kw = dict(batch=rng.choice([1, 2, 4]) * gas * dp, seq=rng.choice([1024, 2048]),
                  gradient_accumulation_steps=gas, dp_size=dp,
                  tp_size=rng.choice([1, 2]), pp_size=rng.choice([1, 2, 4]), zero_stage=rng.choice([0, 1, 3]),
                  activation_checkpointing=rng.choice(["none", "selective", "full"]),
                  precision=rng.choice(["bf16", "fp32"]), optimizer=rng.choice(["adam", "adamw", "sgd"]))
        if rng.random() < 0.5:
            kw["runtime_overheads"] = None
        configs.append(kw)
        # ... and neighbours that differ from it in one input only, so that a key missing
        # that input would collide.
        for field, values in (("gradient_accumulation_steps", [1, 2, 4]), ("precision", ["bf16", "fp32"]),
                              ("zero_stage", [0, 1, 3]), ("optimizer", ["adam", "adamw"])):
            other = rng.choice([v for v in values if v != kw[field]])
            neighbour = {**kw, field: other}
            if field == "gradient_accumulation_steps":    # the same micro-batch, more of them
                neighbour["batch"] = kw["batch"] // kw[field] * other
            configs.append(neighbour)
    rng.shuffle(configs)
    cached = [solve(**kw).to_json() for kw in configs]
    _memo.set_enabled(False)
    try:
        plain = [solve(**kw).to_json() for kw in configs]
    finally:
        _memo.set_enabled(True)
    assert cached == plain
    reference = TrainingMemoryModel()
    fast = [reference.solve("llama3-8b", "h100", kw["batch"], kw["seq"], **{
        k: v for k, v in kw.items() if k not in ("batch", "seq", "runtime_overheads")}).to_json() for kw in configs]
    _memo.set_enabled(False)
    try:
        slow = [reference.solve("llama3-8b", "h100", kw["batch"], kw["seq"], **{
            k: v for k, v in kw.items() if k not in ("batch", "seq", "runtime_overheads")}).to_json()
                for kw in configs]
    finally:
        _memo.set_enabled(True)
    assert fast == slow
