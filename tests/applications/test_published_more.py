"""validation/steptime/published_more.py: Megatron-Bridge's B200 and GB200 rows (issue 27 item 4), held out on
uncalibrated accelerators, and the catalog fields they are timed with."""

import runpy
from pathlib import Path

import pytest

from mlsysim_core.catalog import find_hardware
from mlsysim_core.search import scale_up_domain
from mlsysim_plugins import steptime

ROOT = Path(__file__).resolve().parents[2]
COMMIT = "067f987df03b8355b03192d88d70f1709fedf51a"


@pytest.fixture(scope="module")
def calibrate():
    return runpy.run_path(str(ROOT / "validation" / "steptime" / "calibrate.py"), run_name="calibrate")


def more():
    cases = runpy.run_path(str(ROOT / "validation" / "steptime" / "published.py"), run_name="published")["CASES"]
    return [c for c in cases if c["hardware"] in ("b200", "gb200") and c["id"].startswith("megatron-bridge-")]


def test_rows_cite_the_archive_row_they_transcribe():
    rows = more()
    assert len(rows) == 24 and {r["hardware"] for r in rows} == {"b200", "gb200"}
    assert all(r["id"].startswith("megatron-bridge-") for r in rows)
    for r in rows:
        src = r["source"]
        assert src.startswith("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary-archive.md") and COMMIT in src
        # the row's own cells: its throughput, TFLOP/s and layout, as the table prints them
        assert f"| {r['tokens_per_s_per_gpu']}" in src and f"| {r['tflops_per_gpu']}" in src, r["id"]
        assert f"| {r['tp']} | {r['pp']} | {r['cp']} |" in src, r["id"]
        assert r["tp"] * r["cp"] * r["pp"] * r["dp_shard"] * r["dp_replicate"] == r["devices"]
    # FSDP 64 is Megatron FSDP (sharding over #GPUs / (TP x PP)); FSDP 0 the distributed optimizer
    fsdp = next(r for r in rows if r["id"] == "megatron-bridge-2604-llama3-70b-64xgb200-fp8")
    assert (fsdp["dp_shard"], fsdp["dp_replicate"], fsdp["sharding"], fsdp["micro_batch"]) == (64, 1, None, 2)
    mx = [r for r in rows if "mxfp8" in r["id"]]
    assert mx and all(r["float8"] and "MXFP8 timed as float8" in r["notes"] for r in mx)
    assert all(r["network_bandwidth"] == 50e9 for r in rows if r["hardware"] == "gb200")


def test_published_step_by_hand(calibrate):
    """Llama 3 8B on 8 B200 (25.11): GBS 128 x 8192 tokens at 30,624 tokens/s/GPU on 8 GPUs."""
    case = next(c for c in calibrate["CASES"] if c["id"] == "megatron-bridge-2511-llama3-8b-8xb200-fp8-cs")
    assert calibrate["published_step"](case) == pytest.approx(128 * 8192 / (30624 * 8))
    assert 128 * 8192 / (30624 * 8) == pytest.approx(4.2801, abs=1e-4)


def test_rows_are_held_out_uncalibrated_and_gb200_is_timed_on_its_nvlink_domain(calibrate):
    cases = {c["id"]: c for c in calibrate["CASES"]}
    assert calibrate["shipped"]("b200") is steptime.DEFAULT and not steptime.DEFAULT.calibrated
    gb = cases["megatron-bridge-2511-llama3-8b-8xgb200-fp8-cs"]
    assert calibrate["comparable"](gb) is None
    # timed on the catalog's entry, its groups placed in the NVLink domain it declares (search.scale_up_domain)
    assert scale_up_domain(find_hardware(gb["hardware"]).value) == 72
    assert find_hardware("nvidia/gb200").extra["performance"]["nvlink_domain_devices"] == 72
    assert find_hardware("nvidia/gb200").value.devices_per_node == 4          # the catalog's node stays the tray
    p = calibrate["predict"](gb, calibrate["shipped"]("gb200"))
    assert p["calibrated"] is False
    assert p["assumptions"]["devices_per_node"] == 72 and p["assumptions"]["inter_node_bandwidth"] == 50e9
    b = cases["megatron-bridge-2511-llama3-8b-8xb200-fp8-cs"]
    assert calibrate["predict"](b, calibrate["shipped"]("b200"))["assumptions"]["devices_per_node"] == 8
    rows = calibrate["rows"]("gb200")
    assert len(rows) == 15 and all(role == "held out" for *_, role in rows)
    assert calibrate["summary"]("b200")["held_out"] == 9


def test_catalog_power_envelopes_are_cited():
    for key, watts, quoted in (("nvidia/b200", 1000, "1,000 W"), ("nvidia/gb200", 1200, "1,200 W"),
                               ("amd/mi300x", 750, "750W")):
        entry = find_hardware(key)
        assert entry.extra["power_limit_watts"] == watts and quoted in entry.sources["power_limit_watts"]
        assert steptime.envelope(entry.value) == {"power_limit_watts": watts}
    # a run at the board's power keeps the full clock; one capped below it, P^(1/3)
    assert steptime.clock_share(1000, 1000) == 1.0
    assert steptime.clock_share(800, 1000) == pytest.approx(0.8 ** (1 / 3))
