"""DeepSpeed's ZeRO buffers and FSDP's all-gather limits as options of their rules (issue 25
item 5; plugins/mlsysim_plugins/_deepspeed_buckets.py): hand-derived bytes per option, every
phase, the default unchanged, bad values refused naming the option and the value."""

from __future__ import annotations

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.terms import BACKWARD, BACKWARD_END, FORWARD, OPTIMIZER_STEP, PHASES
from mlsysim_plugins import _deepspeed_buckets as ds

MODEL, HW, BATCH, SEQ = "llama3-8b", "h100", 8, 2048


def solve(profile, rule_kw, options=None, **kw):
    extra = {"plugin_options": options} if options else {}
    return TrainingMemoryModel(profile).solve(MODEL, HW, BATCH, SEQ, dp_size=8, **rule_kw, **extra, **kw)


def buffers(result):
    return {t.label: t for t in result.terms if t.component == "communication_buffers"}


def phase_bytes(result, label):
    """The term's bytes in each phase (0 where it is not alive)."""
    term = buffers(result)[label]
    return {p: (term.nbytes if p in term.phases else 0) for p in PHASES}


@pytest.mark.parametrize("profile", ["reference", "measured"])
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_default_unchanged(profile, stage):
    """No option given: the same result as an empty options dict (and as before: the
    predictions-unchanged test covers the numbers)."""
    a = solve(profile, {"zero_stage": stage})
    b = solve(profile, {"zero_stage": stage}, {f"zero{stage}": {}})
    assert a.total_memory == b.total_memory and buffers(a).keys() == buffers(b).keys()
    assert not any("DeepSpeed buckets" in n for n in a.notes)


@pytest.mark.parametrize("profile", ["reference", "measured"])
@pytest.mark.parametrize("stage", [1, 2])
def test_reduce_bucket(profile, stage):
    """reduce_bucket_size elements x 2 B (bf16), one buffer, the backward and its end; the
    fraction's gradient bucket is gone and a note says so."""
    r = solve(profile, {"zero_stage": stage}, {f"zero{stage}": {"reduce_bucket_size": 2e8}}, precision="bf16")
    assert "gradient bucket" not in buffers(r)
    assert phase_bytes(r, "DeepSpeed ipg gradient bucket") == {
        FORWARD: 0, BACKWARD: 400_000_000, BACKWARD_END: 400_000_000, OPTIMIZER_STEP: 0}
    assert any("DeepSpeed buckets given (reduce_bucket_size=200,000,000" in n and "communication_buffer_fraction"
               in n for n in r.notes)


def test_overlap_comm_doubles_the_ipg_buffers():
    r = solve("measured", {"zero_stage": 2}, {"zero2": {"overlap_comm": True}}, precision="bf16")
    term = buffers(r)["DeepSpeed ipg gradient bucket (double: overlap_comm)"]
    assert term.nbytes == 2 * 500_000_000 * 2          # DeepSpeed's default reduce_bucket_size, twice
    assert term.phases == (BACKWARD, BACKWARD_END)


def test_contiguous_gradients_off_flattens_one_bucket():
    r = solve("reference", {"zero_stage": 2}, {"zero2": {"contiguous_gradients": False, "reduce_bucket_size": 1000}},
              precision="bf16")
    term = buffers(r)["DeepSpeed reduce bucket, flattened (contiguous_gradients=False)"]
    assert term.nbytes == 1000 * 2 and term.phases == (BACKWARD_END,)


def test_allgather_bucket_allocates_nothing():
    """allgather_bucket_size gathers in place into the flat 16-bit groups: only the ipg bucket
    (DeepSpeed's default 5e8) replaces the fraction."""
    r = solve("reference", {"zero_stage": 1}, {"zero1": {"allgather_bucket_size": 1e6}}, precision="bf16")
    assert {k: t.nbytes for k, t in buffers(r).items()} == {"DeepSpeed ipg gradient bucket": 1_000_000_000}


def test_measured_total_moves_by_the_bucket():
    base = solve("measured", {"zero_stage": 2}, precision="bf16")
    r = solve("measured", {"zero_stage": 2}, {"zero2": {"reduce_bucket_size": "1e8"}}, precision="bf16")
    # the backward's peak gains the bucket exactly (and the allocator's share of it: runtime overheads)
    assert (r.total_memory - r.runtime_overheads) - (base.total_memory - base.runtime_overheads) == \
        pytest.approx(2e8, abs=1)


def test_zero3_measured_terms():
    """ZeRO-3, measured: ipg (every phase), prefetch min(prefetch, max_live - layer, other
    layers), the top layers kept for reuse, the persistent tensors, by hand."""
    opts = {"reduce_bucket_size": 1e8, "stage3_prefetch_bucket_size": 3e8, "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 2e9, "stage3_param_persistence_threshold": 1e5}
    r = solve("measured", {"zero_stage": 3}, {"zero3": opts}, precision="bf16", regime="mixed-bf16")
    b = buffers(r)
    layer = b["all-gathered parameters of one layer"].nbytes / 2
    assert layer == 218_103_808                       # llama3-8b: 2 x 4096^2 + 2 x 4096 x 1024 + 3 x 4096 x 14336
    ipg = b["DeepSpeed ZeRO-3 ipg gradient bucket"]
    assert ipg.nbytes == 2e8 and ipg.phases == PHASES
    assert b["DeepSpeed ZeRO-3 prefetched parameters"].nbytes == 2 * 3e8      # min(3e8, 1e9 - layer, 31 layers)
    head = 128_256 * 4096 + 4096
    kept = sum(1 for j in range(32) if 2 * j * layer + head < 2e9) - 1
    assert kept == 3          # j = 0..3: 2 j layer + head < 2e9; the current one is priced already
    assert b["DeepSpeed ZeRO-3 top layers kept for reuse"].nbytes == kept * layer * 2
    norms = 65 * 4096                                 # 2 per layer + the final norm, each 4096 <= 1e5
    assert b["DeepSpeed ZeRO-3 persistent parameters (never released)"].nbytes == norms * 2


def test_zero3_max_live_caps_the_prefetch():
    r = solve("measured", {"zero_stage": 3}, {"zero3": {"stage3_max_live_parameters": 3e8,
                                                          "stage3_prefetch_bucket_size": 3e8}}, precision="bf16",
              regime="mixed-bf16")
    assert buffers(r)["DeepSpeed ZeRO-3 prefetched parameters"].nbytes == 2 * (3e8 - 218_103_808)


def test_zero3_reference():
    r = solve("reference", {"zero_stage": 3}, {"zero3": {"reduce_bucket_size": 1e8}}, precision="bf16")
    assert {k: t.nbytes for k, t in buffers(r).items()} == {
        "DeepSpeed ZeRO-3 ipg gradient bucket": 2e8, "DeepSpeed ZeRO-3 prefetched parameters": 2 * 5e7}


@pytest.mark.parametrize("rule", ["fsdp", "hsdp"])
def test_fsdp_prefetch(rule):
    base = solve("measured", {"data_parallel": rule}, precision="bf16")
    layer = buffers(base)["all-gathered parameters of one layer"].nbytes
    for opts, n in (({"prefetch_layers": 2}, 2), ({"limit_all_gathers": True}, 1), ({"limit_all_gathers": False}, 31)):
        r = solve("measured", {"data_parallel": rule}, {rule: opts}, precision="bf16")
        label = f"FSDP prefetched parameters ({n} layer{'s' if n != 1 else ''} ahead)"
        assert phase_bytes(r, label) == {FORWARD: n * layer, BACKWARD: n * layer, BACKWARD_END: 0, OPTIMIZER_STEP: 0}
        assert any("all-gather limit given" in note for note in r.notes)
    r = solve("measured", {"data_parallel": rule}, {rule: {"prefetch_layers": 0}}, precision="bf16")
    assert r.total_memory == base.total_memory


@pytest.mark.parametrize("rule, field, value", [
    ("zero2", "reduce_bucket_size", "1GiB"), ("zero2", "reduce_bucket_size", -1), ("zero1", "overlap_comm", "yes"),
    ("zero2", "allgather_bucket_size", 2.5), ("zero3", "stage3_prefetch_bucket_size", True),
    ("zero3", "stage3_max_live_parameters", "many"), ("fsdp", "prefetch_layers", -2),
    ("fsdp", "limit_all_gathers", 1)])
def test_bad_values_refused(rule, field, value):
    kw = {"zero_stage": int(rule[-1])} if rule.startswith("zero") else {"data_parallel": rule}
    with pytest.raises(InvalidInputError) as err:
        solve("measured", kw, {rule: {field: value}})
    assert field in str(err.value) and repr(value) in str(err.value)


def test_both_fsdp_limits_refused():
    with pytest.raises(InvalidInputError, match="prefetch_layers"):
        solve("measured", {"data_parallel": "fsdp"}, {"fsdp": {"prefetch_layers": 1, "limit_all_gathers": True}})


def test_elements_reader():
    assert ds.elements("x", "5e8") == 500_000_000 == ds.elements("x", 5e8) == ds.elements("x", "500_000_000")
    assert ds.elements("x", 0) == 0


def test_cli_option(capsys):
    from mlsysim_core.cli import main
    main(["estimate", "--model", MODEL, "--hardware", HW, "--batch-size", "8", "--dp-size", "8", "--zero-stage", "2",
          "--precision", "bf16", "--option", "zero2.reduce_bucket_size=2e8", "--option", "zero2.overlap_comm=true"])
    out = capsys.readouterr().out
    assert "DeepSpeed buckets given (reduce_bucket_size=200,000,000, overlap_comm=True" in out
