"""Checkpointing policies under every parallelism (issue 25 item 3): per-rank checks against the PyTorch
measurements of validation/parallel/policies (fake process group, one rank, every phase; no torch here), the
same bytes for a third-party family that declares the built-in's op tags, refusals naming the family and the
policy, the families that now tag their ops, and search --from a torchtitan config with per-op SAC."""

import json
import statistics
from pathlib import Path

import attrs
import pytest

from mlsysim_core import HardwareNode, TrainingMemoryModel, hookimpl
from mlsysim_core.errors import NotModelledError
from mlsysim_core.hf import from_hf_config
from mlsysim_core.manager import PluginManager
from mlsysim_plugins.measured import layers
from mlsysim_plugins.measured.families import LLAMA
from mlsysim_plugins.measured.layer_ops import llama_ops
from scripttools import load_script

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "validation" / "parallel" / "policies"
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
POLICIES = ("op-sac", "save-list", "every-k", "mlp-only", "attention-only", "none", "selective", "full")
COMPARE = load_script("validation/parallel/policies/compare_policies.py")


@pytest.fixture(scope="module")
def rows():
    return COMPARE.rows()


def _family_config(family, arch):
    runs = json.loads((ROOT / "validation" / "families" / family / "measurements.json").read_text())["runs"]
    return next(r["hf_config"] for r in runs if r["hf_config"]["model_type"] == arch and r.get("method") == "real")


LLAMA_POL = json.loads((HERE / "measurements.json").read_text())["runs"][0]["hf_config"]


def _solve(config=LLAMA_POL, policy="op-sac", *, solver=None, model=None, options=None, b=1, s=2048, **layout):
    model = model or from_hf_config(config, name="m")
    b *= layout.get("dp_size", 1) * layout.get("gradient_accumulation_steps", 1)     # b: the micro-batch
    kw = dict(profile="measured", regime="bf16", attention="sdpa", device="cpu", runtime_overheads=False,
              optimizer_impl="foreach")
    kw.update(layout)
    return (solver or TrainingMemoryModel()).solve(model, BIG, b, s, "fp32", "adamw", policy,
                                                   plugin_options=options, **kw)


# --- against the measurements ------------------------------------------------------------------------

def test_every_run_was_measured_with_the_regenerating_command():
    data = json.loads((HERE / "measurements.json").read_text())
    assert "measure_policies.py" in data["generator"] and data["torch"].startswith("2.13.0")
    runs = data["runs"]
    assert {(r["checkpointing"], r["tp"], r["plan"]["sequence_parallel"]) for r in runs} >= {
        ("op-sac", 2, True), ("op-sac", 4, True), ("op-sac", 2, False), ("op-sac", 4, False)}
    assert all("backward_first_layer" in r["measured"]["peak_by_phase"] for r in runs)


@pytest.mark.parametrize("phase", ["forward", "backward", "optimizer_step"])
def test_per_rank_phases_within_one_percent(rows, phase):
    errors = [abs(r["errors"][phase]) for r in rows]
    assert max(errors) <= 0.01, [(r["id"], r["errors"][phase]) for r in rows]


def test_per_rank_peak_within_one_percent(rows):
    assert max(abs(r["peak_error"]) for r in rows) <= 0.01
    assert statistics.median(abs(r["peak_error"]) for r in rows) <= 0.01


def test_the_backward_end_is_bounded_and_its_gap_stated(rows):
    """The backward's end (from the first layer's backward, its recompute included, to the embedding's) is
    NOT within the targets under tensor parallelism: the first layer's backward moment there (the RMSNorm
    backward's fp32 temporaries without sequence parallelism, the MLP backward with it) is not modelled for
    any strategy, ``none`` included (-11 % / -17 % here). Bounded so that a regression shows; op-SAC with
    sequence parallelism is within 5 %."""
    for r in rows:
        assert abs(r["errors"]["backward_end"]) <= 0.21, (r["id"], r["errors"])
        if r["policy"] == "op-sac" and r["sequence_parallel"]:
            assert abs(r["errors"]["backward_end"]) <= 0.05, (r["id"], r["errors"])


# --- what the rank classes read -----------------------------------------------------------------------

@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("layout", [dict(tp_size=2), dict(tp_size=2, sequence_parallel=True), dict(cp_size=2),
                                    dict(pp_size=2, gradient_accumulation_steps=4), dict(tp_size=2, dp_size=2)],
                         ids=["tp", "tp+sp", "cp", "pp", "tp+dp"])
def test_every_policy_solves_under_every_parallelism(policy, layout):
    result = _solve(policy=policy, **layout)
    assert result.ranks and all(r.total_memory > 0 for r in result.ranks)


def test_the_split_comes_from_the_rules_placement():
    """tp 4 keeps about a quarter of tp 1's... no: the op outputs inside the tensor-parallel region / 4,
    the row-parallel partial sums whole, the layer input whole without sequence parallelism, / 4 with."""
    def layers_term(**layout):
        rank = _solve(**layout).ranks[0]
        return next(t.nbytes for t in rank.terms if t.label.startswith("op-sac layers"))
    h, T, f, L = LLAMA_POL["hidden_size"], 2048, LLAMA_POL["intermediate_size"], LLAMA_POL["num_hidden_layers"]
    q, kv, a = h, LLAMA_POL["num_key_value_heads"] * h // LLAMA_POL["num_attention_heads"], \
        LLAMA_POL["num_attention_heads"]
    # bf16: input 2Th; saved q, v (mm: 1st, 3rd), sdpa out + lse, gate (5th), down (7th: row-parallel, whole)
    inside = 2 * T * (q + kv) + T * (2 * q + 4 * a) + 2 * T * f
    assert layers_term(tp_size=2) == L * (2 * T * h + inside / 2 + 2 * T * h)
    # with SP: the input / 2, and torchtitan's list saves the reduce-scatters of o and down (T h / 2 each)
    assert layers_term(tp_size=2, sequence_parallel=True) == L * (2 * T * h / 2 + inside / 2 + 2 * T * h
                                                                    + 2 * (2 * T * h / 2))


def test_pipeline_stages_hold_their_micro_batches_in_flight():
    """every-k under PP: per stage, the layers' terms x the schedule's micro-batches in flight (1F1B: stage 0
    of 2 holds 2, the last 1)."""
    result = _solve(policy="every-k", options={"every-k": {"k": 2}}, pp_size=2, gradient_accumulation_steps=4)
    first, last = result.ranks[0], result.ranks[-1]
    kept = [next(t.nbytes for t in r.terms if t.label.startswith("decoder layers")) for r in (first, last)]
    assert (first.in_flight, last.in_flight) == (2, 1) if hasattr(first, "in_flight") else True
    assert kept[0] == 2 * kept[1]


# --- families --------------------------------------------------------------------------------------------

class _AcmeFamily:
    """A third party's copy of the Llama family: its own layer walker and op declaration (wrappers that
    return what the built-in's return) under its own name and architecture."""

    @hookimpl
    def mlsysim_measured_architectures(self):
        def layer(**kw):
            return layers.llama_layer(**kw)

        def ops(shape, kind, kernel, seq_len):
            return llama_ops(shape, kind, kernel, seq_len)
        return [attrs.evolve(LLAMA, name="acme.llama", architectures=("acme_llama",), layer=layer, op_outputs=ops,
                             fallback=False)]


@pytest.mark.parametrize("policy", ["op-sac", "save-list", "mlp-only", "attention-only", "every-k"])
@pytest.mark.parametrize("layout", [dict(tp_size=2, sequence_parallel=True), dict(tp_size=4), dict(pp_size=2)],
                         ids=["tp2+sp", "tp4", "pp2"])
def test_a_third_party_family_with_tags_gets_the_builtin_bytes(policy, layout):
    pm = PluginManager.from_environment()
    pm.register(_AcmeFamily(), "acme_family")
    builtin = from_hf_config(LLAMA_POL, name="m")
    acme = attrs.evolve(builtin, architecture="acme_llama")
    mine = _solve(policy=policy, model=acme, solver=TrainingMemoryModel("measured", plugin_manager=pm), **layout)
    theirs = _solve(policy=policy, model=builtin, **layout)
    assert [dict(r.phase_totals) for r in mine.ranks] == [dict(r.phase_totals) for r in theirs.ranks]
    assert mine.total_memory == theirs.total_memory


@pytest.mark.parametrize("family, arch", [("llama_variants", "qwen2")])
@pytest.mark.parametrize("policy", ["op-sac", "save-list", "mlp-only", "attention-only"])
@pytest.mark.parametrize("layout", [{}, dict(tp_size=2)], ids=["one device", "tp2"])
def test_a_family_without_tags_is_refused_naming_family_and_policy(family, arch, policy, layout):
    config = {**_family_config("llama_variants", "qwen3"), "model_type": arch}
    config.pop("head_dim", None)
    with pytest.raises(NotModelledError) as err:
        _solve(config, policy, b=2, s=256, **layout)
    assert policy in str(err.value) and arch in str(err.value)


@pytest.mark.parametrize("family, arch", [("llama_variants", "qwen3"), ("moe_2025", "qwen3_moe"),
                                          ("glm_ministral", "ministral")])
@pytest.mark.parametrize("policy", ["op-sac", "save-list", "mlp-only", "attention-only"])
@pytest.mark.parametrize("layout", [{}, dict(tp_size=2), dict(tp_size=2, sequence_parallel=True)],
                         ids=["one device", "tp2", "tp2+sp"])
def test_qwen3_qwen3_moe_and_ministral_tag_their_parts(family, arch, policy, layout):
    config = _family_config(family, arch)
    none = _solve(config, "none", b=2, s=256, regime="fp32", **layout).total_memory
    assert 0 < _solve(config, policy, b=2, s=256, regime="fp32", **layout).total_memory < none


# --- search ----------------------------------------------------------------------------------------------

def test_search_from_torchtitan_op_sac_includes_tensor_parallel_layouts():
    from mlsysim_core.cli import main
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["search", "--from", str(ROOT / "tests/data/launch/torchtitan/llama3/llama3_8b.toml"),
                     "--nodes", "1", "--gpus-per-node", "8"])
    text = out.getvalue()
    assert code in (0, None), text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert any(int(r[0]) > 1 and "op-sac" in r for r in rows), text


# --- the RoPE tables, whatever their form and tier (issue 24 item 1 follow-up) ---------------------------------------

class _CisFamily:
    """A third party's Llama whose RoPE table is keyed as a complex64 freqs_cis (term_keys.ROPE_FREQS_CIS, as Llama
    4's and DeepSeek-V2's are) and relabelled, the same bytes: every selector of "the RoPE tables" must find it."""

    @hookimpl
    def mlsysim_measured_architectures(self):
        from mlsysim_plugins.measured import term_keys as K

        def adjust(kind, plan, placement, terms):
            return [attrs.evolve(t, key=K.ROPE_FREQS_CIS, label="RoPE freqs_cis") if t.key == K.ROPE_TABLES else t
                    for t in terms]
        return [attrs.evolve(LLAMA, name="acme.llama_cis", architectures=("acme_llama_cis",), op_outputs=llama_ops,
                             adjust_terms=adjust, fallback=False)]


@pytest.mark.parametrize("policy, options", [("op-sac", None), ("mlp-only", None), ("every-k", None),
                                             ("op-sac", {"tp_size": 2, "sequence_parallel": True})],
                         ids=["op-sac", "mlp-only", "every-k", "op-sac-tp2+sp"])
def test_a_freqs_cis_table_is_counted_where_cos_sin_is(policy, options):
    """The policies' last moments (layer 0 recomputed with the tables, one device and a split model) select the
    tables by key set (term_keys.ROPE_TABLE_KEYS): a freqs_cis table of the same bytes gives the same phases (the
    cos/sin key alone missed it: the backward's end was short by the table). (compile=True refuses a family that
    adjusts terms, so its selectors are reached by the built-in cos/sin tables only.)"""
    pm = PluginManager.from_environment()
    pm.register(_CisFamily(), "acme_cis_family")
    builtin = from_hf_config(LLAMA_POL, name="m")
    cis = attrs.evolve(builtin, architecture="acme_llama_cis")
    mine = _solve(policy=policy, model=cis, solver=TrainingMemoryModel("measured", plugin_manager=pm),
                  **(options or {}))
    theirs = _solve(policy=policy, model=builtin, **(options or {}))
    assert any(t.key == "rope_freqs_cis" for t in [*mine.terms, *(t for r in mine.ranks for t in r.terms)])
    assert dict(mine.phase_totals) == dict(theirs.phase_totals)
    assert [dict(r.phase_totals) for r in mine.ranks] == [dict(r.phase_totals) for r in theirs.ranks]


@pytest.mark.parametrize("policy", ["op-sac", "mlp-only", "every-k"])
def test_the_policies_count_the_tables_on_the_device_under_offload(policy):
    """Under activation offload the model's RoPE term is the host copy, but at layer 0's recompute the table is on
    the device: the checkpointed layer's recompute closure holds the tensor itself (transformers 5.23.0
    modeling_layers.py line 120: partial(forward, self, **kwargs), position_embeddings among the kwargs). The
    policies' backward-end moment is the same with and without save_on_cpu (the table's bytes counted either way)."""
    def moment(**options):
        r = _solve(policy=policy, **options)
        return [t.nbytes for t in r.terms if t.label.startswith("recompute working set (layer 0's")]
    plain, offloaded = moment(), moment(activation_offload="save_on_cpu")
    assert plain and offloaded == plain
