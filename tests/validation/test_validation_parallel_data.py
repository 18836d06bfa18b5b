"""The committed per-rank measurements of sharded training (validation/parallel/measurements.json) are well-formed
and internally consistent. No torch needed: these check the data against itself, against the single-device
baselines measured in the same file, and against hand counts from the model configurations."""

import json
import math
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[2] / "validation" / "parallel" / "measurements.json"
DOC = json.loads(PATH.read_text())
RUNS = DOC["runs"]
SINGLE = {r["id"]: r for r in DOC["single_device"]}
BY_ID = {r["id"]: r for r in RUNS}

MEM_CATS = {"parameter", "buffer", "gradient", "activation", "temp", "optimizer_state", "other"}
FSDP_CATS = {"sharded_param", "unsharded_param", "buffer", "sharded_grad", "unsharded_grad", "activation", "temp",
             "all_gather", "reduce_scatter", "optimizer_state", "inputs"}
ELEM = {"fp32": 4, "bf16": 2, "mp-bf16": 4}  # bytes of a sharded parameter / its optimizer state
COMPUTE_ELEM = {"fp32": 4, "bf16": 2, "mp-bf16": 2}  # bytes of an unsharded (compute) parameter
PHASES = {"start", "zero_grad", "forward", "backward", "optimizer"}
POINTS = {"start", "after_zero_grad", "end_of_forward", "end_of_backward", "end_of_step"}


def _ids(runs):
    return [r["id"] for r in runs]


def _fsdp(r):
    return r["layout"]["kind"] in ("fsdp2", "2d")


def _tp_size(r):
    lay = r["layout"]
    return lay["mesh_shape"][lay["mesh_dim_names"].index("tp")] if "tp" in lay["mesh_dim_names"] else 1


def _dp_size(r):
    lay = r["layout"]
    return lay["mesh_shape"][lay["mesh_dim_names"].index("dp")] if "dp" in lay["mesh_dim_names"] else 1


def _hidden(hf):
    return hf.get("hidden_size", hf.get("n_embd"))


def _snapshots(m):
    yield "peak", m["peak_bytes"], m["by_category_at_peak"]
    for ph, v in m["peak_by_phase"].items():
        yield f"phase {ph}", v["bytes"], v["by_category"]
    for pt, v in m["alive"].items():
        yield f"alive {pt}", v["bytes"], v["by_category"]


# --------------------------------------------------------------------------- shape of the file
def test_header():
    assert DOC["torch"].startswith("2.13.0") and DOC["transformers"] == "5.23.0"
    assert "measure_parallel.py" in DOC["generator"] and "--out" in DOC["generator"]
    assert DOC["device"] == "cpu"
    assert len(RUNS) >= 20
    assert len(BY_ID) == len(RUNS) and not set(BY_ID) & set(SINGLE)
    kinds = {r["layout"]["kind"] for r in RUNS}
    assert kinds == {"fsdp2", "tp", "tp+sp", "2d"}
    assert {r["layout"]["world_size"] for r in RUNS} >= {2, 4, 8}


@pytest.mark.parametrize("run", RUNS + list(SINGLE.values()), ids=_ids(RUNS) + list(SINGLE))
def test_no_errors_and_integer_bytes(run):
    assert "error" not in run, run.get("error")
    m = run["measured"]
    for where, total, cats in _snapshots(m):
        assert isinstance(total, int) and not isinstance(total, bool) and total > 0, where
        for k, v in cats.items():
            assert isinstance(v, int) and not isinstance(v, bool) and v >= 0, (where, k, v)


@pytest.mark.parametrize("run", RUNS, ids=_ids(RUNS))
def test_layout_is_consistent(run):
    lay = run["layout"]
    assert lay["kind"] in ("fsdp2", "tp", "tp+sp", "2d")
    assert math.prod(lay["mesh_shape"]) == lay["world_size"]
    assert 0 <= lay["rank"] < lay["world_size"]
    assert len(lay["mesh_dim_names"]) == len(lay["mesh_shape"])
    expected = {"fsdp2": ["dp"], "tp": ["tp"], "tp+sp": ["tp"], "2d": ["dp", "tp"]}[lay["kind"]]
    assert lay["mesh_dim_names"] == expected
    assert (lay["reshard_after_forward"] is None) == (lay["kind"] in ("tp", "tp+sp"))
    assert (lay["mp_policy"] is not None) == (run["regime"] == "mp-bf16")
    assert run["optimizer"] == "adamw" and run["optimizer_impl"] == "foreach"
    assert run["single_device_id"] in SINGLE
    assert f"-w{lay['world_size']}-" in run["id"] and run["id"].endswith(f"-r{lay['rank']}")
    cats = set(run["measured"]["by_category_at_peak"])
    assert cats == (FSDP_CATS if _fsdp(run) else MEM_CATS)
    assert run["measured"]["tracker"] == ("FSDPMemTracker" if _fsdp(run) else "MemTracker")


# --------------------------------------------------------------------------- the tracker's arithmetic
@pytest.mark.parametrize("run", RUNS + list(SINGLE.values()), ids=_ids(RUNS) + list(SINGLE))
def test_totals_are_sums_of_categories(run):
    for where, total, cats in _snapshots(run["measured"]):
        assert total == sum(cats.values()), where


@pytest.mark.parametrize("run", RUNS + list(SINGLE.values()), ids=_ids(RUNS) + list(SINGLE))
def test_peak_is_the_maximum(run):
    m = run["measured"]
    phases = m["peak_by_phase"]
    assert set(phases) <= PHASES and {"forward", "backward", "optimizer"} <= set(phases)
    assert set(m["alive"]) == POINTS
    assert m["peak_bytes"] == max(max(v["bytes"] for v in phases.values()), m["alive"]["start"]["bytes"])
    assert m["peak_phase"] in phases and phases[m["peak_phase"]]["bytes"] == m["peak_bytes"]
    for pt, v in m["alive"].items():
        assert v["bytes"] <= m["peak_bytes"], pt


@pytest.mark.parametrize("run", RUNS, ids=_ids(RUNS))
def test_steady_state(run):
    """The measured iteration starts and ends with the same state: params + grads + optimizer state."""
    a = run["measured"]["alive"]
    assert a["start"] == a["end_of_step"]
    assert a["end_of_backward"]["bytes"] == a["start"]["bytes"]
    grad = "sharded_grad" if _fsdp(run) else "gradient"
    assert a["after_zero_grad"]["by_category"][grad] == 0
    assert a["after_zero_grad"]["bytes"] == a["start"]["bytes"] - a["start"]["by_category"][grad]


# --------------------------------------------------------------------------- parameters
@pytest.mark.parametrize("run", RUNS, ids=_ids(RUNS))
def test_global_parameters_match_single_device(run):
    m, single = run["measured"], SINGLE[run["single_device_id"]]["measured"]
    assert m["parameters_global"] == single["parameters"]
    assert m["parameters_global"] == m["global_parameters_sharded"] + m["global_parameters_replicated"]
    assert m["parameter_tensors"] == single["parameter_tensors"]


@pytest.mark.parametrize("run", [r for r in RUNS if r["layout"]["kind"] == "fsdp2"],
                         ids=_ids([r for r in RUNS if r["layout"]["kind"] == "fsdp2"]))
def test_fsdp_local_parameters(run):
    m, w, rank = run["measured"], run["layout"]["world_size"], run["layout"]["rank"]
    units = m["fsdp_units"]
    assert sum(u["parameters"] for u in units) == m["parameters_global"]
    assert sum(u["tensors"] for u in units) == m["parameter_tensors"]
    assert sum(u["local_parameters"] for u in units) == m["local_parameters"]
    assert m["global_parameters_replicated"] == 0
    for u in units:
        padded = u["padded_sharded_parameters"]
        assert padded * w >= u["parameters"] and u["local_parameters"] <= padded
        # each tensor pads dim 0 up to a multiple of W: less than one row per rank per tensor
        assert padded * w - u["parameters"] < w * u["tensors"] * max(u["parameters"] // u["tensors"], 1)
        if rank == 0:
            assert u["local_parameters"] == padded  # rank 0 always holds a full chunk
    # rank 0 holds the rounded-up chunks, the last rank what is left
    if rank == 0:
        assert m["local_parameters"] * w >= m["parameters_global"]
    if rank == w - 1:
        assert m["local_parameters"] * w <= m["parameters_global"]
    assert m["local_parameters"] <= math.ceil(m["parameters_global"] / w) + sum(u["tensors"] for u in units) * 2048
    # the sharded storage is padded: every rank holds padded chunks, whatever its local (view) size
    padded_total = sum(u["padded_sharded_parameters"] for u in units)
    assert m["local_parameter_storage_bytes"] == padded_total * ELEM[run["regime"]]
    assert m["alive"]["start"]["by_category"]["sharded_param"] == m["local_parameter_storage_bytes"]


def test_fsdp_two_ranks_add_up():
    """At W=2 the two ranks' local parameters are the whole model, exactly (padding is not local)."""
    pairs = 0
    for r in RUNS:
        lay = r["layout"]
        if lay["kind"] == "fsdp2" and lay["world_size"] == 2 and lay["rank"] == 0:
            other = BY_ID.get(r["id"][:-len("-r0")] + "-r1")
            if other:
                pairs += 1
                assert r["measured"]["local_parameters"] + other["measured"]["local_parameters"] == \
                    r["measured"]["parameters_global"]
    assert pairs >= 2


def test_fsdp_padding_is_seen():
    """GPT-2's vocabulary (50257) does not split evenly: the last rank's local view is smaller than rank 0's."""
    r0 = BY_ID["fsdp2-gpt2-tiny-fp32-w8-zero3-b2-s256-r0"]["measured"]
    r7 = BY_ID["fsdp2-gpt2-tiny-fp32-w8-zero3-b2-s256-r7"]["measured"]
    assert r7["local_parameters"] < r0["local_parameters"]
    assert r7["local_parameter_storage_bytes"] == r0["local_parameter_storage_bytes"]


@pytest.mark.parametrize("run", [r for r in RUNS if r["layout"]["kind"] in ("tp", "tp+sp")],
                         ids=_ids([r for r in RUNS if r["layout"]["kind"] in ("tp", "tp+sp")]))
def test_tp_local_parameters(run):
    m, w = run["measured"], run["layout"]["world_size"]
    hf = run["hf_config"]
    assert m["global_parameters_sharded"] % w == 0
    assert m["local_parameters"] == m["global_parameters_replicated"] + m["global_parameters_sharded"] // w
    # only the RMSNorm weights are replicated: (2 per layer + the final one) x hidden
    assert m["global_parameters_replicated"] == (2 * hf["num_hidden_layers"] + 1) * hf["hidden_size"]
    assert m["local_parameter_storage_bytes"] == m["local_parameters"] * ELEM[run["regime"]]
    assert m["alive"]["start"]["by_category"]["parameter"] == m["local_parameter_storage_bytes"]


@pytest.mark.parametrize("run", [r for r in RUNS if r["layout"]["kind"] == "2d"],
                         ids=_ids([r for r in RUNS if r["layout"]["kind"] == "2d"]))
def test_2d_local_parameters(run):
    m, w, tp = run["measured"], run["layout"]["world_size"], _tp_size(run)
    hf = run["hf_config"]
    norms = (2 * hf["num_hidden_layers"] + 1) * hf["hidden_size"]
    # TP shards everything but the norms over tp, FSDP shards the rest over dp
    assert m["local_parameters"] == (m["parameters_global"] - norms) // w + norms // (w // tp)


# --------------------------------------------------------------------------- optimizer state and gradients
@pytest.mark.parametrize("run", RUNS, ids=_ids(RUNS))
def test_adamw_state_is_two_local_copies(run):
    """exp_avg + exp_avg_sq of the LOCAL (unpadded) shard in the sharded parameter's dtype, + a 4-byte step each."""
    m = run["measured"]
    expected = 2 * m["local_parameters"] * ELEM[run["regime"]] + 4 * m["parameter_tensors"]
    assert m["alive"]["end_of_step"]["by_category"]["optimizer_state"] == expected
    assert m["optimizer_state_tensors"] == 3 * m["parameter_tensors"]
    if m["peak_phase"] != "optimizer":
        assert m["by_category_at_peak"]["optimizer_state"] == expected


@pytest.mark.parametrize("run", RUNS, ids=_ids(RUNS))
def test_foreach_transient_is_one_local_copy(run):
    """foreach AdamW's _foreach_sqrt allocates one tensor the size of the local parameters at the step's peak."""
    m = run["measured"]
    opt = m["peak_by_phase"]["optimizer"]
    assert opt["op"] == "aten._foreach_sqrt.default"
    extra = opt["by_category"]["optimizer_state"] - m["alive"]["end_of_step"]["by_category"]["optimizer_state"]
    assert extra == m["local_parameters"] * ELEM[run["regime"]]


@pytest.mark.parametrize("run", [r for r in RUNS if _fsdp(r)], ids=_ids([r for r in RUNS if _fsdp(r)]))
def test_fsdp_gradients_are_sharded(run):
    m = run["measured"]
    end = m["alive"]["end_of_backward"]["by_category"]
    # reduce-scattered into the PADDED local shard (the grad is a view of it), in the sharded parameter's dtype
    # (fp32 under the mp policy); where nothing is padded that is exactly the local parameters
    padded = sum(u["padded_sharded_parameters"] for u in m["fsdp_units"])
    assert end["sharded_grad"] == padded * ELEM[run["regime"]]
    assert end["sharded_grad"] == m["alive"]["start"]["by_category"]["sharded_param"]  # same dtype, same padding
    assert end["unsharded_grad"] == 0 and end["unsharded_param"] == 0 and end["all_gather"] == 0


@pytest.mark.parametrize("run", [r for r in RUNS if r["layout"]["kind"] in ("tp", "tp+sp")],
                         ids=_ids([r for r in RUNS if r["layout"]["kind"] in ("tp", "tp+sp")]))
def test_tp_embedding_gradient_is_full_size(run):
    """The vocab-sharded embedding's gradient is a full V x h tensor on every rank (its local shard is a view)."""
    m, w, hf = run["measured"], run["layout"]["world_size"], run["hf_config"]
    e = ELEM[run["regime"]]
    end = m["alive"]["end_of_backward"]["by_category"]
    vh = hf["vocab_size"] * hf["hidden_size"]
    assert end["gradient"] == m["local_parameters"] * e + (vh - vh // w) * e


# --------------------------------------------------------------------------- unsharded parameters (FSDP)
@pytest.mark.parametrize("run", [r for r in RUNS if _fsdp(r)], ids=_ids([r for r in RUNS if _fsdp(r)]))
def test_fsdp_unsharded_after_forward(run):
    """After forward: ZeRO-3 layers are resharded and only the root group stays unsharded (unless its own
    reshard_after_forward is True); ZeRO-2 keeps every group unsharded. Unsharded = unpadded, compute dtype."""
    m, lay = run["measured"], run["layout"]
    units = {u["unit"]: u for u in m["fsdp_units"]}
    # the unsharded parameters are views of the padded all-gather output: padded chunk x dp (for 2-D this is the
    # TP-local size of the unit)
    tp, dp = _tp_size(run), _dp_size(run)
    unsh = {u: units[u]["padded_sharded_parameters"] * dp for u in units}
    for u, v in unsh.items():
        assert v * tp >= units[u]["parameters"]
        if tp == 1:
            assert v - units[u]["parameters"] < dp * units[u]["tensors"] * 4096  # < one row per rank per tensor
    root = unsh["<root>"]
    total = sum(unsh.values())
    c = COMPUTE_ELEM[run["regime"]]
    unsharded = m["alive"]["end_of_forward"]["by_category"]["unsharded_param"]
    if lay["reshard_after_forward"] is False:
        assert unsharded == total * c
    elif lay["root_reshard_after_forward"] is True:
        assert unsharded == 0
    else:
        assert unsharded == root * c


# --------------------------------------------------------------------------- activations vs one device
@pytest.mark.parametrize("run", [r for r in RUNS if r["layout"]["kind"] == "fsdp2"],
                         ids=_ids([r for r in RUNS if r["layout"]["kind"] == "fsdp2"]))
def test_fsdp_activations_equal_single_device(run):
    """FSDP does not shard activations: what the forward leaves alive is the single-device run's, to the byte."""
    single = SINGLE[run["single_device_id"]]["measured"]
    fw = run["measured"]["alive"]["end_of_forward"]["by_category"]["activation"]
    assert fw == single["alive"]["end_of_forward"]["by_category"]["activation"]


@pytest.mark.parametrize("run", [r for r in RUNS if r["layout"]["kind"] in ("tp", "tp+sp")],
                         ids=_ids([r for r in RUNS if r["layout"]["kind"] in ("tp", "tp+sp")]))
def test_tp_layer_activations_shrink(run):
    """Per decoder layer, TP keeps less than one device, SP less again, and never less than 1/W of it."""
    m, w = run["measured"], run["layout"]["world_size"]
    single = SINGLE[run["single_device_id"]]["measured"]["layer_forward_retained_bytes"]
    layers = m["layer_forward_retained_bytes"]
    assert len(layers) == len(single) and len(set(layers)) == 1
    assert single[0] / w <= layers[0] < single[0]
    if run["layout"]["kind"] == "tp+sp":
        twin = BY_ID.get(run["id"].replace("tpsp-", "tp-", 1))
        if twin:
            assert layers[0] < twin["measured"]["layer_forward_retained_bytes"][0]


# --------------------------------------------------------------------------- ranks and twins
def test_tp_ranks_are_identical():
    pairs = 0
    for r in RUNS:
        lay = r["layout"]
        if lay["kind"] in ("tp", "tp+sp") and lay["rank"] == 0:
            last = BY_ID.get(r["id"][:-len("-r0")] + f"-r{lay['world_size'] - 1}")
            if last:
                pairs += 1
                a, b = r["measured"], last["measured"]
                assert a["peak_bytes"] == b["peak_bytes"]
                assert a["by_category_at_peak"] == b["by_category_at_peak"]
    assert pairs >= 4


def test_more_ranks_less_memory():
    """For the same model and layout, the per-rank peak falls as the world grows."""
    series = {}
    for r in RUNS:
        lay = r["layout"]
        if lay["rank"] == 0 and r["method"] == "real" and lay["kind"] != "2d" and lay["root_reshard_after_forward"] \
                == "default":
            key = (r["model"], lay["kind"], lay["reshard_after_forward"], r["regime"], r["batch_size"], r["seq_len"])
            series.setdefault(key, {})[lay["world_size"]] = r["measured"]["peak_bytes"]
    checked = 0
    for key, by_w in series.items():
        ws = sorted(by_w)
        if len(ws) >= 2:
            checked += 1
            assert all(by_w[a] > by_w[b] for a, b in zip(ws, ws[1:])), key
    assert checked >= 4


def test_zero2_keeps_more_than_zero3():
    pairs = 0
    for r in RUNS:
        if "-zero2-" in r["id"]:
            z3 = BY_ID.get(r["id"].replace("-zero2-", "-zero3-"))
            if z3:
                pairs += 1
                a, b = r["measured"]["alive"]["end_of_forward"], z3["measured"]["alive"]["end_of_forward"]
                assert a["bytes"] > b["bytes"]
                assert a["by_category"]["unsharded_param"] > b["by_category"]["unsharded_param"]
    assert pairs >= 4


FAKE = [r for r in RUNS if r["method"] == "fake" and r["id"].replace("-fake", "") in BY_ID]


def test_fake_twins_exist():
    assert {r["layout"]["kind"] for r in FAKE} == {"fsdp2", "tp", "tp+sp", "2d"}


@pytest.mark.parametrize("run", FAKE, ids=_ids(FAKE))
def test_fake_twin_agrees_to_the_byte(run):
    real = BY_ID[run["id"].replace("-fake", "")]["measured"]
    fake = run["measured"]
    assert fake["peak_bytes"] == real["peak_bytes"]
    assert fake["by_category_at_peak"] == real["by_category_at_peak"]
    assert fake["alive"] == real["alive"]
    assert {k: v["bytes"] for k, v in fake["peak_by_phase"].items()} == \
        {k: v["bytes"] for k, v in real["peak_by_phase"].items()}


def test_hidden_sizes_known():
    for r in RUNS:
        assert _hidden(r["hf_config"]) > 0


LOSS_PEAK = [r for r in RUNS if r["layout"]["kind"] == "fsdp2"
             and r["measured"]["peak_op"] == "aten._log_softmax_backward_data.default"]


@pytest.mark.parametrize("run", LOSS_PEAK, ids=_ids(LOSS_PEAK))
def test_fsdp_loss_backward_peak_composition(run):
    """At the loss-backward peak: unsharded root (ZeRO-3) or everything (ZeRO-2), the last layer's all-gather
    (ZeRO-3 only), and the single-device run's activations and loss temporaries at the same op, to the byte."""
    m, lay = run["measured"], run["layout"]
    single = SINGLE[run["single_device_id"]]["measured"]["peak_by_phase"]["backward"]
    assert single["op"] == m["peak_op"]
    c, w, ec = m["by_category_at_peak"], lay["world_size"], COMPUTE_ELEM[run["regime"]]
    units = m["fsdp_units"]
    unsharded = [u["padded_sharded_parameters"] * w * ec for u in units]
    if lay["reshard_after_forward"]:
        assert c["unsharded_param"] == unsharded[0] and c["all_gather"] == unsharded[-1]
    else:
        assert c["unsharded_param"] == sum(unsharded) and c["all_gather"] == 0
    assert c["activation"] == single["by_category"]["activation"]
    assert c["temp"] == single["by_category"]["temp"] == 8 * run["batch_size"] * run["seq_len"] * \
        run["hf_config"]["vocab_size"]
    assert c["sharded_grad"] == c["unsharded_grad"] == c["reduce_scatter"] == 0
    assert len(LOSS_PEAK) >= 25
