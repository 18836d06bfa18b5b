"""Matmul efficiency by operand dtype (steptime.float8_matmul_share): the accelerator's measured maximum achievable
matmul throughput per dtype, as its catalog entry records it (stas00/ml-engineering's MAMF tables), sets the share of
the float8 peak a float8 GEMM reaches against the bf16 GEMMs' fitted share. Values by hand from the table's rows."""

import math

import attrs
import pytest

from mlsysim_core import HardwareNode
from mlsysim_core.catalog import find_hardware, get_hardware
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_plugins import steptime


def test_h100_float8_gemms_reach_less_of_their_peak_than_bf16_ones():
    # the table's H100 SXM rows: bf16 794.5 of 989 TFLOP/s (80.3 %), float8 1,402.6 of 1,979 (70.9 %)
    assert steptime.achievable_matmul(get_hardware("h100")) == {"bf16": 794.5e12, "fp8": 1402.6e12}
    share = 1402.6 * 989 / (1979 * 794.5)
    assert share == pytest.approx(0.88225, abs=5e-6)
    assert steptime.hardware_figures(get_hardware("h100"))["fp8_matmul"] == pytest.approx(share, rel=1e-12)
    # H200: the bf16 row is H100's ('H200 is the same'), float8 1,453.4; B200 and GB200 their own rows
    for name, bf16, fp8, peak_bf16, peak_fp8 in (("h200", 794.5, 1453.4, 989, 1979), ("b200", 1745.0, 3432.5, 2250, 4500),
                                                 ("gb200", 1822.0, 3615.6, 2500, 5000)):
        assert steptime.hardware_figures(get_hardware(name))["fp8_matmul"] == pytest.approx(
            (fp8 / peak_fp8) / (bf16 / peak_bf16), rel=1e-12)      # 0.914, 0.984, 0.992
    # cited in the entry's sources, at the commit
    assert "7bc7c3054eb93c277a4755c597ae0864d77a63f1" in find_hardware("h100").sources["max_achievable_matmul_flops"]


def test_a_float8_gemm_is_timed_at_that_share_of_the_float8_peak():
    hw = steptime.hardware_figures(get_hardware("h100"))
    cal = steptime.CALIBRATIONS["nvidia/h100-sxm5-80gb"]
    # one full wave of 128 x 256 tiles (132 SMs), K 4096: compute-bound in both dtypes (bf16 65 us against 56 us of
    # memory traffic at 0.8 x 3.35 TB/s; float8 37 us against 29 us)
    m, n, k = 128 * 132, 256, 4096
    flops = 2 * m * n * k
    bf16 = steptime.gemm_seconds(m, n, k, hw, cal, 2)
    fp8 = steptime.gemm_seconds(m, n, k, hw, cal, 1)
    assert bf16 == pytest.approx(flops / (989e12 * cal.matmul), rel=1e-12)
    assert fp8 == pytest.approx(flops / (1979e12 * hw["fp8_matmul"] * cal.matmul), rel=1e-12)
    assert bf16 / fp8 == pytest.approx(1979 * 1402.6 * 989 / (1979 * 794.5) / 989, rel=1e-12)   # 1.765, not 2.001


def test_hardware_without_a_record_times_float8_at_the_bf16_share_and_says_so():
    from mlsysim_core.search import time_plan
    pcie = get_hardware("h100-pcie")        # its entry states peaks, no measured GEMM throughput
    assert steptime.achievable_matmul(pcie) == {}
    hw = steptime.hardware_figures(pcie)
    assert hw["fp8_matmul"] is None
    cal = steptime.DEFAULT
    assert steptime.gemm_seconds(128 * 114, 1024, 4096, {**hw, "sms": None}, cal, 1) == pytest.approx(
        2 * 128 * 114 * 1024 * 4096 / (pcie.peak_fp8_flops * cal.matmul), rel=1e-12)
    run = dict(global_batch=8, seq_len=2048, dp=1, precision="bf16", optimizer="adamw", memory=False)
    # (the planner's topology added: the PCIe entry states no node)
    node = attrs.evolve(pcie, inter_node_bandwidth=50e9, devices_per_node=8)
    notes = time_plan("llama3-8b", node, float8=True, **run)["notes"]
    assert any("records no max_achievable_matmul_flops" in note for note in notes)
    assert not any("max_achievable_matmul_flops" in note for note in time_plan("llama3-8b", node, **run)["notes"])
    assert not any("max_achievable_matmul_flops" in note
                   for note in time_plan("llama3-8b", "h100", float8=True, **run)["notes"])


def test_a_memory_variant_keeps_the_chips_record_and_a_users_node_has_none():
    h100 = get_hardware("h100")
    grand_teton = attrs.evolve(h100, memory_capacity=96 * 2**30, memory_bandwidth=2_400_000_000_000)
    assert steptime.achievable_matmul(grand_teton) == steptime.achievable_matmul(h100)
    faster = attrs.evolve(h100, peak_bf16_flops=2 * h100.peak_bf16_flops)      # not the catalog's chip any more
    assert steptime.achievable_matmul(faster) == {}
    mine = HardwareNode(name="my accelerator", memory_capacity=80 * 2**30, peak_bf16_flops=1e15, peak_fp8_flops=2e15)
    assert steptime.hardware_figures(mine)["fp8_matmul"] is None


def test_bf16_gemms_are_unchanged_by_the_record():
    hw = steptime.hardware_figures(get_hardware("h100"))
    cal = steptime.CALIBRATIONS["nvidia/h100-sxm5-80gb"]
    assert steptime.gemm_seconds(4096, 4096, 4096, hw, cal, 2) == steptime.gemm_seconds(
        4096, 4096, 4096, {**hw, "fp8_matmul": None}, cal, 2)


@pytest.mark.parametrize("measured, parameter, error", [
    ("794.5e12", "max_achievable_matmul_flops", InvalidInputTypeError),
    ({"bf16": -1.0, "fp8": 1e15}, "max_achievable_matmul_flops['bf16']", InvalidInputError),
    ({"bf16": 1e15, "fp8": math.nan}, "max_achievable_matmul_flops['fp8']", InvalidInputError),
    ({"bf16": 1e15, "fp8": True}, "max_achievable_matmul_flops['fp8']", InvalidInputError),
    ({"fp16": 1e15}, "max_achievable_matmul_flops['fp16']", InvalidInputError),
])
def test_a_malformed_record_is_refused_by_name(measured, parameter, error):
    with pytest.raises(error) as err:
        steptime.float8_matmul_share(measured, 989e12, 1979e12)
    assert err.value.parameter == parameter
    assert "{'bf16': FLOP/s, 'fp8': FLOP/s}" in str(err.value)


def test_either_figure_or_peak_missing_gives_no_share():
    assert steptime.float8_matmul_share({"bf16": 794.5e12}, 989e12, 1979e12) is None
    assert steptime.float8_matmul_share({"bf16": 794.5e12, "fp8": 1402.6e12}, 989e12, None) is None
    assert steptime.float8_matmul_share(None, 989e12, 1979e12) is None
