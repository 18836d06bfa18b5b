"""torchtitan's Llama 3.1 8B FSDP + per-op SAC benchmark (docs/performance.md at d4c86e3, Tables 1 and 3, the
"FSDP" rows, reserved GiB): the 128-GPU row within 10 % of reserved memory; the 8-GPU row outside it, for the
reason the script derives (FSDP2's side-stream pools); the allocated bytes exact against the CPU reproduction of
that configuration. No torch (validation/published/torchtitan_llama3_8b.py)."""

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.errors import NotModelledError
from scripttools import load_script

GIB = 2**30


@pytest.fixture(scope="module")
def tt():
    return load_script("validation/published/torchtitan_llama3_8b.py")


@pytest.fixture(scope="module")
def rows(tt):
    return {(r[0], r[1]): r for r in tt.rows()}


def test_the_published_rows_as_shipped(tt):
    assert [(t, n, g, p) for t, n, g, p, _ in tt.ROWS] == [
        ("Table 1", "FSDP", 8, 82.4), ("Table 1", "FSDP + torch.compile", 8, 77.0),
        ("Table 1", "FSDP + torch.compile + Float8", 8, 76.8), ("Table 3", "FSDP", 128, 67.0),
        ("Table 3", "FSDP + torch.compile", 128, 62.0), ("Table 3", "FSDP + torch.compile + Float8", 128, 61.8)]


def test_the_128_gpu_row_within_10_percent_of_reserved(tt, rows):
    error = rows[("Table 3", "FSDP")][6]
    assert abs(error) <= tt.TARGET_RESERVED, error
    assert tt.main() == 0


def test_the_8_gpu_row_misses_by_what_the_side_stream_pools_hold(tt, rows):
    """Not met at 8 GPUs (-12.5 %): the prediction's reserve is 5 % of allocated; FSDP2 of Dec 2024 also keeps
    its reduce-scatter and copy-in streams' pools reserved (8.47 + 1.96 GiB at 8 ranks). With them the gap is
    within 5 % at both sizes, which is the evidence for the mechanism (not part of the prediction)."""
    _, _, gpus, published, allocated, reserved, error, _ = rows[("Table 1", "FSDP")]
    assert -0.14 < error < -0.10
    for key in (("Table 1", "FSDP"), ("Table 3", "FSDP")):
        _, _, gpus, published, allocated, _, _, _ = rows[key]
        explained = allocated + sum(tt.stream_pools(gpus).values()) / GIB
        assert abs(explained / published - 1) < 0.05, (gpus, explained, published)


def test_stream_pools_by_hand(tt):
    # Llama 3.1 8B: root group = 2 x 128,256 x 4,096 + 4,096 = 1,050,677,248 params; one block 218,112,000;
    # 8,030,261,248 in all. Reduce-scatter stream at 8 ranks: fp32 sharded gradients 4 x P / 8 + the root's
    # fp32 input 4 x root + one block's freed fp32 input 4 x block; copy-in stream: the root's bf16 output.
    pools = tt.stream_pools(8)
    assert pools["reduce_scatter_stream"] == 4 * 8_030_261_248 / 8 + 4 * 1_050_677_248 + 4 * 218_112_000
    assert pools["all_gather_copy_in_stream"] == 2 * 1_050_677_248


def test_allocated_bytes_match_the_cpu_reproduction(tt):
    runs = tt.cpu_reproduction()
    assert len(runs) == 3
    for rid, measured, predicted, error in runs:
        assert abs(error) < 1e-5, (rid, measured, predicted)
    # one block's op-SAC bytes: the L3 - L2 difference of the measured peaks, less the block's sharded fp32
    # parameter and AdamW state (12 B x 218,112,000 / 8) and its 9 parameters' fp32 step counters (9 x 4 B): input, q, v, SDPA output (bf16) + logsumexp (fp32),
    # w1 (gate), w2 (down) = (8,192 + 8,192 + 2,048 + 8,192 + 128 + 28,672 + 8,192) B x 16,384 tokens
    by_id = {r[0]: r[1] for r in runs}
    per_block = by_id["tt-llama3-8b-widths-L3-w8-r0"] - by_id["tt-llama3-8b-widths-L2-w8-r0"]
    assert per_block - 12 * 218_112_000 // 8 - 9 * 4 == 63_616 * 16_384


def test_the_compile_rows(tt, rows):
    """FSDP + torch.compile: torchtitan's per-block compile (compile="blocks") with op-SAC and FSDP2: the blocks'
    saved set is the policy's (as eager), FSDP's part the rule's: the prediction is the eager row's but the final
    norm's; both rows within 10 % of reserved. The whole-model compile=True stays refused under FSDP."""
    for table in ("Table 1", "Table 3"):
        eager, compiled = rows[(table, "FSDP")], rows[(table, "FSDP + torch.compile")]
        assert abs(compiled[6]) <= tt.TARGET_RESERVED, compiled
        assert 0 <= compiled[4] - eager[4] < 0.2, (eager, compiled)
    assert rows[("Table 1", "FSDP + torch.compile")][7] == "compared"
    assert "float8" in rows[("Table 1", "FSDP + torch.compile + Float8")][7]
    with pytest.raises(NotModelledError, match="compile"):
        TrainingMemoryModel("measured").solve(tt.MODEL, tt._hardware(), 16, 8192, dp_size=8, compile=True,
                                              **tt.BASE)
