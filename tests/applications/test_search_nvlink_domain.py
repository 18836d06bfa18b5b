"""Collective groups placed by the accelerator's NVLink domain where its catalog entry declares one
(search.scale_up_domain, docs/planner.md "Topology"): GB200 NVL72's 72 GPUs, its node the 4-GPU tray."""

import attrs
import pytest

from mlsysim_core import HardwareNode
from mlsysim_core.catalog import find_hardware, get_hardware
from mlsysim_core.search import scale_up_domain, search_plans, time_plan
from mlsysim_plugins import steptime

# no latency: the collectives' seconds are their bytes over the link
CAL = attrs.evolve(steptime.DEFAULT, latency=0.0, hop_intra=0.0, hop_inter=0.0, hop_tree_intra=0.0, nvls_latency=0.0)
NVLINK = 900e9 * CAL.intra_link          # GB200's intra_node_bandwidth at the collective's share
NETWORK = 50e9 * CAL.inter_link          # 4 x 400G ConnectX-7 per 4-GPU tray: 50e9 B/s per GPU


def test_the_domain_is_read_from_the_catalog_entry():
    entry = find_hardware("nvidia/gb200")
    assert entry.value.devices_per_node == 4 and entry.extra["performance"]["nvlink_domain_devices"] == 72
    assert entry.value.inter_node_bandwidth == 50 * 10**9
    assert "4x NVIDIA ConnectX-7 single port 400G OSFP NIC" in entry.sources["inter_node_bandwidth"]
    assert scale_up_domain(entry.value) == 72
    # a memory variant keeps its chip's domain; hardware that declares none keeps its node
    assert scale_up_domain(attrs.evolve(entry.value, memory_capacity=96 * 2**30)) == 72
    for key in ("nvidia/h100-sxm5-80gb", "nvidia/h200-sxm-141gb", "nvidia/a100-sxm4-80gb", "nvidia/b200"):
        assert scale_up_domain(get_hardware(key)) == 8
    # the same name with another topology is not the catalog's object: its own node
    other = attrs.evolve(entry.value, devices_per_node=2)
    assert scale_up_domain(other) == 2
    mine = HardwareNode(name="my accelerator", memory_capacity=2**36, devices_per_node=16)
    assert scale_up_domain(mine) == 16


def test_tp_8_inside_the_domain_at_nvlink_speed():
    # Llama 3.1 8B, tp 8 without sequence parallelism: 2 all-reduces of T x h x 2 bytes per layer in the
    # forward, 2 in the backward, a ring's 2 (n - 1) / n of the buffer each, 32 layers, 8 micro-batches
    r = time_plan("llama3-8b", "gb200", global_batch=8, seq_len=4096, tp=8, precision="bf16", checkpointing="none",
                  sequence_parallel=False, calibration=CAL, memory=False)
    T, h = 4096, 4096
    assert r["components"]["tp"] == pytest.approx(8 * 32 * 4 * 2 * 7 / 8 * T * h * 2 / NVLINK, rel=1e-12)
    assert r["assumptions"]["devices_per_node"] == 72
    assert any("72-device NVLink domain" in n for n in r["notes"])


def _qwen(ep, **kw):
    return time_plan("qwen3-30b-a3b", "gb200", global_batch=ep, seq_len=4096, dp=ep, ep=ep, precision="bf16",
                     checkpointing="none", calibration=CAL, memory=False, **kw)


def test_ep_16_inside_the_domain_and_128_across_it():
    # Qwen3-30B-A3B (48 layers, hidden 2048, 8 experts per token), one micro-batch of T = 4096 tokens: 2 all-to-alls
    # of the routed tokens (T x 8 x 2048 x 2 bytes) in the forward, 2 in the backward, per layer
    routed = 4096 * 8 * 2048 * 2
    assert _qwen(16)["components"]["ep"] == pytest.approx(48 * 4 * 15 / 16 * routed / NVLINK, rel=1e-12)
    # 128 ranks, 72 in a domain: (128 - 72) / 128 of the buffer leaves through the rank's own NIC share,
    # 71 / 128 goes over NVLink at the same time; the network's part is the slower
    across = (128 - 72) / 128 * routed / NETWORK
    assert across > 71 / 128 * routed / NVLINK
    assert _qwen(128)["components"]["ep"] == pytest.approx(48 * 4 * across, rel=1e-12)


def test_a_gb200_search_places_ep_16_and_tp_8_in_the_domain():
    found = search_plans("qwen3-30b-a3b", "gb200", devices=16, global_batch=16, seq_len=4096, precision="bf16",
                         checkpointing=["none"], data_parallel=["zero1"], sequence_parallel=[False],
                         context_parallel=[1], calibration=CAL, workers=1)
    shapes = {(c.tp, c.ep) for c in found.fits}
    assert (1, 16) in shapes and (8, 2) in shapes          # tp x ep up to 72, not the tray's 4
    assert all(c.tp * c.ep <= 72 for c in found.fits)
    row = next(c for c in found.fits if (c.tp, c.pp, c.ep) == (1, 1, 16))
    alone = _qwen(16, microbatch=row.microbatch, data_parallel="zero1", sequence_parallel=False)
    assert found.components(row) == pytest.approx(alone["components"], rel=1e-12)
    assert found.components(row)["ep"] == pytest.approx(48 * 4 * 15 / 16 * (4096 * 8 * 2048 * 2) / NVLINK, rel=1e-12)
