"""The fourth example plugin package, ``examples/plugins/mlsysim-mamba2-hybrid``: an architecture
family (Mamba-2 + attention, transformers' ``bamba``) added through the measured profile's hooks.

No torch: every run of ``validation/mamba2/measurements.json`` is solved with the package's family
registered (its ``src`` on ``sys.path``, its plugin module registered next to mlsysim-core's own
plugins) and compared phase by phase with what MemTracker measured: exact where the profile is
exact, off by the bytes the profile leaves out for every architecture where it is not (stated per
phase in ``compare_measurements.expected_offset`` and the package README), bounded where the
backward peaks inside a mixer layer's backward (transients the README says are not modelled).
The ``slow`` test builds the wheel offline, installs it into a fresh virtualenv and runs the CLI
and the package's own tests there.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import sys
from pathlib import Path

import attrs
import pytest
from venvtools import Venv, build_wheels, pip_supports_python_option
from venvtools import run as run_command

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "examples" / "plugins" / "mlsysim-mamba2-hybrid"
SRC = PACKAGE / "src"
MEASUREMENTS = ROOT / "validation" / "mamba2" / "measurements.json"
VERSION = "0.1.0"

if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))

from mlsysim_core import HardwareNode, InvalidInputError, NotModelledError, TrainingMemoryModel  # noqa: E402
from mlsysim_core import TransformerWorkload  # noqa: E402
from mlsysim_core.manager import PluginManager  # noqa: E402
from mlsysim_mamba2 import layer_bytes as lb  # noqa: E402
from mlsysim_mamba2 import plugin  # noqa: E402
from mlsysim_mamba2.catalog import BAMBA_9B, BAMBA_G1, BAMBA_TINY, MODELS  # noqa: E402
from mlsysim_mamba2.family import (BAMBA, attention_parts, bamba_weights, mixer_parts, mixer_weights,  # noqa: E402
                                   parameter_tensors, shared_parts)
from mlsysim_mamba2.workload import BambaWorkload  # noqa: E402
from mlsysim_plugins.measured.families import family_for  # noqa: E402
from mlsysim_plugins.measured.kernels import BUILTIN_KERNELS, SEPARATE_QKV  # noqa: E402
from mlsysim_plugins.measured.layers import REPLICATED, TP  # noqa: E402
from mlsysim_plugins.measured.shapes import ModelShape  # noqa: E402
from scripttools import load_script  # noqa: E402


compare = load_script(PACKAGE / "compare_measurements.py")
RUNS = compare.load_runs(MEASUREMENTS)
BY_ID = {run["id"]: run for run in RUNS}
BIG = HardwareNode(name="unbounded", memory_capacity=2**60)
SHAPES = {"bamba-tiny": BAMBA_TINY, "bamba-g1": BAMBA_G1}


@pytest.fixture(scope="module")
def pm(builtin_pm):
    """mlsysim-core's own plugins and the package's plugin, under its entry-point name."""
    out = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        out.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    out.register(plugin, name="mamba2_hybrid")
    return out


@pytest.fixture(scope="module")
def measured(pm):
    return TrainingMemoryModel("measured", plugin_manager=pm)


def _workload(run) -> BambaWorkload:
    return BambaWorkload.from_hf_config(run["hf_config"], name=run["model"])


def _kernel(name):
    return functools.partial(BUILTIN_KERNELS[name].saved, SEPARATE_QKV)


# --- the data ------------------------------------------------------------------------------------

def test_the_measurements_are_the_packages_shapes():
    assert len(RUNS) == 17 and all(run["measured"]["peak_bytes"] for run in RUNS)
    for run in RUNS:
        w = _workload(run)
        shape = SHAPES[run["model"]]          # the catalog's validation shapes (a -q run: another chunk size)
        assert attrs.evolve(w, mamba_chunk_size=shape.mamba_chunk_size) == shape, run["id"]
        assert w.count_parameters() == w.parameters == run["measured"]["parameters"]
        kinds = {"linear_attention": "mamba", "full_attention": "attention"}
        assert [kinds[t] for t in run["measured"]["layer_types"]] == list(w.layer_types)


# --- one layer: the family's parts against every measured layer -------------------------------------

@pytest.mark.parametrize("run_id", list(BY_ID))
def test_every_layer_of_every_run(run_id):
    """Each layer's parts as the family builds them (shared + the mixer's, or + the kernel's
    attention with Bamba's contiguous o_proj copy), plus its output, is the measured growth of
    live memory across that layer's forward, to the byte; the family's mean layer x L is their sum."""
    run = BY_ID[run_id]
    w = _workload(run)
    b, s = run["batch_size"], run["seq_len"]
    T, kind = b * s, run["regime"]
    c = 4 if kind == "fp32" else 2
    shape = w.shape()
    own = {"mamba": mixer_parts(w, tokens=T, seq_len=s, compute_bytes=c),
           "attention": attention_parts(_kernel(run["attention"]), kind=kind, heads=shape.heads,
                                        kv_heads=shape.kv_heads, head_dim=shape.head_dim, hidden=shape.hidden,
                                        tokens=T, seq_len=s)}
    shared = shared_parts(w, tokens=T, compute_bytes=c)
    output = c * T * shape.hidden
    formulas = lb.bamba_layer_bytes(shape, batch=b, seq_len=s, compute_bytes=c, residual_bytes=c,
                                    attention=run["attention"])
    for i, (layer_type, got) in enumerate(zip(w.layer_types, run["measured"]["layer_forward_retained_bytes"])):
        parts = shared + own[layer_type]
        assert sum(p.nbytes for p in parts) + output == got == formulas[i].retained, (run_id, i, layer_type)
    mean = BAMBA.layer_bytes(kernel=BUILTIN_KERNELS[run["attention"]], hidden=shape.hidden, heads=shape.heads,
                             kv_heads=shape.kv_heads, head_dim=shape.head_dim, ffn=shape.ffn, experts=0, top_k=0,
                             regime=kind, dropout=False, tokens=T, seq_len=s, model=w)
    assert w.layers * (mean.saved + mean.output) == sum(run["measured"]["layer_forward_retained_bytes"])
    assert mean.output_saved_by_next == (kind == "fp32")


def test_the_mixer_formula_as_the_readme_writes_it():
    """The README's summary of a Mamba-2 layer's mixer, term by term, against layer_bytes."""
    for run in RUNS:
        w = _workload(run)
        b, s = run["batch_size"], run["seq_len"]
        T, c = b * s, (4 if run["regime"] == "fp32" else 2)
        D, H, p, n, g, K, Q = (w.d_inner, w.mamba_n_heads, w.mamba_d_head, w.mamba_d_state, w.mamba_n_groups,
                               w.mamba_d_conv, w.mamba_chunk_size)
        nc = -(-s // Q)
        Tp = b * nc * Q
        readme = (c * T * (2 * D + 2 * g * n + H) + c * b * (s + K - 1) * (D + 2 * g * n)
                  + (4 * T * (D + 2 * g * n) if c == 4 else 4 * T * D) + 12 * T * H
                  + 4 * Tp * (5 * D + 5 * H * n + 3 * H * Q + 2 * H)
                  + 4 * b * H * p * n * (2 * nc + 1) + 4 * b * H * (nc + 1) ** 2 + 2 * Q * Q + 2 * (nc + 1) ** 2 + 8 * H
                  + 12 * T * D + (4 * T * D if c == 2 else 0) + 4 * T * g + c * T * D)
        assert readme == sum(p.nbytes for p in mixer_parts(w, tokens=T, seq_len=s, compute_bytes=c)), run["id"]


def test_tensor_parallel_splits_of_a_mixer_layer():
    """Replicated in a Mamba-2 layer: the two RMSNorms and the mid residual (as in a Llama layer),
    B and C's channels (in_proj output, conv output, fp32 silu output), the segment-sum masks and
    the gated norm's rsqrt; everything else is split over the tp ranks. No mixer part is dropped
    by selective recompute."""
    for run in RUNS:
        w = _workload(run)
        b, s = run["batch_size"], run["seq_len"]
        T, c = b * s, (4 if run["regime"] == "fp32" else 2)
        h, g, n, K, Q = w.hidden_dim, w.mamba_n_groups, w.mamba_d_state, w.mamba_d_conv, w.mamba_chunk_size
        nc = -(-s // Q)
        parts = shared_parts(w, tokens=T, compute_bytes=c) + mixer_parts(w, tokens=T, seq_len=s, compute_bytes=c)
        replicated = (2 * T * (8 * h + 4) + (4 * T * h if c == 4 else 0)                      # norms, mid residual
                      + c * T * 2 * g * n + c * b * (s + K - 1) * 2 * g * n + (4 * T * 2 * g * n if c == 4 else 0)
                      + 2 * Q * Q + 2 * (nc + 1) ** 2 + 4 * T * g)
        assert sum(p.nbytes for p in parts if p.split == REPLICATED) == replicated, run["id"]
        assert {p.split for p in parts} == {TP, REPLICATED}
        assert not any(p.recomputed_by_selective for p in parts)
    # eager attention's s x s scores are what selective recompute drops (the kernel says so)
    eager = attention_parts(_kernel("eager"), kind="fp32", heads=8, kv_heads=2, head_dim=32, hidden=256,
                            tokens=64, seq_len=64)
    assert [p.name for p in eager if p.recomputed_by_selective] == ["attention scores"]


# --- parameters -----------------------------------------------------------------------------------

@pytest.mark.parametrize("model", [BAMBA_TINY, BAMBA_G1, BAMBA_9B], ids=lambda m: m.name)
def test_parameters_and_tensors(model):
    shape = ModelShape.of(model, BAMBA)
    tensors = parameter_tensors(shape)
    assert sum(tensors) == model.parameters == model.count_parameters()
    # the mean layer's weights and norms x L + embedding, LM head, final norm: the whole model
    assert model.layers * shape.layer_parameters() + 2 * shape.embedding_parameters + shape.hidden \
        == pytest.approx(model.parameters, rel=1e-15)
    s = model.shape()
    mixer = lb.mamba2_layer_parameters(hidden=s.hidden, d_inner=s.d_inner, n_heads=s.n_heads, d_state=s.d_state,
                                       n_groups=s.n_groups, conv_kernel=s.conv_kernel, ffn=s.ffn)
    assert sum(w.elements for w in mixer_weights(model)) + 3 * s.hidden * s.ffn + 2 * s.hidden == mixer
    assert len(shape.matrix_shapes()) == len(tensors)
    weights = bamba_weights(hidden=s.hidden, q_dim=shape.q_dim, kv_dim=shape.kv_dim, ffn=s.ffn, experts=0, model=model)
    assert {w.split for w in weights} <= {TP, REPLICATED}


def test_the_tensor_count_is_the_measured_one():
    for run in RUNS:
        shape = ModelShape.of(_workload(run), BAMBA)
        assert shape.tensor_count == run["measured"]["parameter_tensors"]
        assert shape.rope_buffer_bytes == run["measured"]["by_category_at_peak"]["buffer"]   # rotary over d/2


# --- every phase of every run ------------------------------------------------------------------------

@pytest.mark.parametrize("run_id", list(BY_ID))
def test_every_phase_of_every_run(run_id, measured):
    """predicted - measured per phase: the known offsets where the profile is exact up to bytes it
    leaves out for every architecture (the loss scalars, the label copies: compare_measurements.
    expected_offset), exactly; a backward that peaks inside a Mamba-2 layer's backward is bounded:
    below the measurement by at most 5 % (the mixer's backward transients are not modelled)."""
    run = BY_ID[run_id]
    rows = compare.compare(run, measured)
    for phase, (want, got) in rows.items():
        offset = compare.expected_offset(run, phase)
        if offset is None:
            peak = run["measured"]["peak_by_phase"]["backward"]
            assert compare.backward_in_a_mixer(run) and ".mamba" in peak["module"], peak
            assert 0 < want - got <= compare.MIXER_TRANSIENT_TOLERANCE * want, (phase, want, got)
        else:
            assert got - want == offset, (phase, want, got, offset)
    result = compare.solve(run, measured)
    named = {"optimizer_step": "optimizer", "backward_end": "backward"}
    assert named.get(result.peak_phase, result.peak_phase) == run["measured"]["peak_phase"]
    if run["measured"]["peak_phase"] == "optimizer":
        assert result.total_memory == run["measured"]["peak_bytes"]


def test_the_readme_table_is_current():
    text = (PACKAGE / "README.md").read_text(encoding="utf-8")
    start = text.index("<!-- table: generated by compare_measurements.py")
    body = text[text.index("\n", start) + 1:text.index("<!-- table end -->")].strip()
    assert body == compare.table(RUNS)


# --- choosing, notes and refusals ---------------------------------------------------------------------

def test_the_family_claims_bamba_only(pm):
    families = pm.registry.extensions["mlsysim_measured_architectures"]
    assert families["mamba2.bamba"] is BAMBA
    assert pm.registry.providers[("mlsysim_measured_architectures", "mamba2.bamba")].name == "mamba2_hybrid"
    assert family_for(BAMBA_9B, families)[0] is BAMBA
    llama = TransformerWorkload(name="l", parameters=10**9, layers=8, hidden_dim=1024, heads=16, vocab_size=32000,
                                ffn_dim=4096, gated_mlp=True, tied_embeddings=False, architecture="llama")
    assert family_for(llama, families)[0].name == "llama"


def test_nothing_changes_for_other_models(pm, builtin_pm):
    with_plugin = TrainingMemoryModel("measured", plugin_manager=pm)
    without = TrainingMemoryModel("measured", plugin_manager=builtin_pm)
    for name, kw in (("llama3-8b", {}), ("mixtral-8x7b", {"tp_size": 2, "ep_size": 2, "dp_size": 2})):
        a, b = (solver.solve(name, "h100", 8, 1024, **kw).to_json() for solver in (with_plugin, without))
        assert a == b, name


def test_approximations_are_said_in_estimate_explain_and_json(measured):
    one = measured.solve("bamba-9b", "h100", 1, 4096, regime="bf16")      # one device: the mean layer is exact
    assert not any("costed as their mean" in n or "tensor parallelism" in n for n in one.notes)
    r = measured.solve("bamba-9b", "h100", 1, 4096, regime="bf16", tp_size=2, pp_size=2)
    mean = [n for n in r.notes if n.startswith("approximation: Bamba layers are costed as their mean")]
    tp = [n for n in r.notes if n.startswith("approximation: Bamba's Mamba-2 mixer under tensor parallelism")]
    assert len(mean) == len(tp) == 1
    assert "29 Mamba-2 and 3 attention layers" in mean[0]
    for what in ("pipeline stage", "block recompute", "recompute working set", "FSDP's gathered layer"):
        assert what in mean[0]
    assert set(json.loads(r.to_json())["notes"]) >= {mean[0], tp[0]}
    flat = re.sub(r"\s+", " ", r.explain())
    assert "costed as their mean" in flat and "not validated" in flat
    assert not any("costed as Llama" in n or "profile reference" in n for n in r.notes)


def test_the_parameter_check_counts_bamba_layers(measured):
    """The profile checks model.parameters against the family's own count
    (ArchitectureFamily.count_parameters: BambaWorkload.count_parameters()), not the
    transformer counter: the catalog's Bamba models are silent, a count 20 % off is said."""
    r = measured.solve("bamba-9b", "h100", 1, 4096, regime="bf16")
    assert not any("WARNING" in n for n in r.notes), r.notes
    wrong = attrs.evolve(BAMBA_TINY, parameters=int(BAMBA_TINY.parameters * 1.2))
    r = measured.solve(wrong, BIG, 1, 64, regime="fp32")
    assert any("WARNING" in n and "+20.0 % off the 4,526,216 implied" in n for n in r.notes), r.notes


def test_parallel_layouts_solve_and_split(measured):
    one = measured.solve("bamba-9b", "h100", 1, 4096, regime="bf16")
    tp = measured.solve("bamba-9b", "h100", 1, 4096, regime="bf16", tp_size=2)
    layers = lambda r: sum(t.nbytes for t in (r.ranks[0].terms if r.ranks else r.terms)  # noqa: E731
                           if t.label == "decoder layers: saved for backward")
    assert layers(one) / 2 < layers(tp) < layers(one) * 0.6      # split, but norms and B, C replicated
    for kw in ({"pp_size": 2}, {"activation_checkpointing": "full"},
               {"activation_checkpointing": "full", "checkpointed_layers": 16},
               {"dp_size": 2, "zero_stage": 3, "batch_size": 2}):
        args = {"batch_size": 1, **kw}
        r = measured.solve("bamba-9b", "h100", args.pop("batch_size"), 4096, regime="bf16", **args)
        assert r.total_memory > 0 and any("costed as their mean" in n for n in r.notes)


@pytest.mark.parametrize("kw, parameter", [
    ({"regime": "amp-bf16"}, "regime"),
    ({"regime": "mixed-bf16-main-grad"}, "regime"),
    ({"regime": "fp32", "dropout": 0.1}, "dropout"),
    ({"regime": "fp32", "lora": {"rank": 8}}, "lora"),
])
def test_what_is_not_modelled_is_refused_by_name(measured, kw, parameter):
    with pytest.raises(NotModelledError) as err:
        measured.solve(BAMBA_TINY, BIG, 1, 64, **kw)
    assert err.value.parameter == parameter


def test_a_plain_transformer_called_bamba_is_refused(measured):
    plain = TransformerWorkload(name="bamba-as-llama", parameters=BAMBA_TINY.parameters, layers=4, hidden_dim=256,
                                heads=8, kv_heads=2, vocab_size=2048, ffn_dim=640, gated_mlp=True,
                                tied_embeddings=False, architecture="bamba")
    with pytest.raises(NotModelledError, match="BambaWorkload") as err:
        measured.solve(plain, BIG, 1, 64, regime="fp32")
    assert err.value.parameter == "model"


@pytest.mark.parametrize("changes, field", [
    ({"attention_layers": (4,)}, "attention_layers"),
    ({"attention_layers": (1, 1)}, "attention_layers"),
    ({"mamba_d_head": 32}, "mamba_d_head"),
    ({"mamba_n_groups": 3}, "mamba_n_groups"),
    ({"ffn_dim": None}, "ffn_dim"),
    ({"mamba_d_state": 0}, "mamba_d_state"),
])
def test_a_bad_workload_names_the_field(changes, field):
    with pytest.raises(InvalidInputError) as err:
        attrs.evolve(BAMBA_TINY, **changes)
    assert err.value.parameter == f"BambaWorkload.{field}"


def test_the_catalog_entries(pm):
    from mlsysim_core.catalog import get_model, list_models
    assert get_model("bamba-9b", plugin_manager=pm) == BAMBA_9B
    assert get_model("ibm-fms/Bamba-9B", plugin_manager=pm) == BAMBA_9B
    entries = {e.key: e for e in list_models(plugin_manager=pm) if e.extra.get("plugin") == "mamba2_hybrid"}
    assert set(entries) == {key for key, *_ in MODELS}
    bamba = entries["ibm-fms/bamba-9b"]
    covered = {f.strip() for fields in bamba.sources for f in fields.split(",")}
    assert covered >= {"parameters", "layers", "hidden_dim", "heads", "kv_heads", "vocab_size", "ffn_dim",
                       "attention_layers", "mamba_n_heads", "mamba_d_head", "mamba_d_state", "mamba_n_groups",
                       "mamba_d_conv", "mamba_chunk_size", "context_length"}
    assert "not verified" in bamba.extra["notes"].lower() or "unverified" in bamba.extra["notes"].lower()
    assert BAMBA_9B.count_parameters() == 9_780_235_392


# --- the package, built and installed --------------------------------------------------------------

slow = pytest.mark.slow


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Venv, Path]:
    if not pip_supports_python_option():
        pytest.skip("pip >= 22.3 (pip --python) is needed to install into the test virtualenv")
    try:
        import importlib.metadata
        importlib.metadata.distribution("mlsysim-mamba2-hybrid")
        pytest.skip("mlsysim-mamba2-hybrid is installed in the host environment; uninstall to test the wheel")
    except importlib.metadata.PackageNotFoundError:
        pass
    work = tmp_path_factory.mktemp("mamba2")
    source = work / "src" / PACKAGE.name
    shutil.copytree(PACKAGE, source, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "build", "dist",
                                                                   "*.egg-info"))
    build_wheels([source], work / "wheels", work)
    [wheel] = (work / "wheels").glob(f"mlsysim_mamba2_hybrid-{VERSION}-py3-none-any.whl")
    env = Venv(work / "venv")
    env.install(wheel)
    return env, source


@slow
def test_the_installed_wheel_estimates_bamba_9b(venv):
    env, _ = venv
    proc = env.cli("estimate", "-m", "bamba-9b", "-g", "h100", "-b", "1", "-s", "4096", "--regime", "bf16")
    out = proc.stdout
    assert "ibm-fms/Bamba-9B" in out and "(profile: measured;" in out
    assert "profile reference, because" not in out + proc.stderr
    assert "costed as their mean" not in re.sub(r"\s+", " ", out)      # one device: exact
    data = json.loads(env.cli("estimate", "-m", "bamba-9b", "-g", "h100", "-b", "2", "-s", "4096", "--regime",
                              "bf16", "--pp", "2", "--json").stdout)
    assert data["profile"] == "measured" and data["model"] == "ibm-fms/Bamba-9B"
    assert any("costed as their mean" in n for n in data["notes"])
    listing = env.cli("plugins").stdout
    [line] = [line for line in listing.splitlines() if line.startswith("mamba2_hybrid")]
    assert f"mlsysim-mamba2-hybrid {VERSION}" in line and "mamba2.bamba" in line
    plugins = json.loads(env.cli("plugins", "--json").stdout)["plugins"]
    [entry] = [p for p in plugins if p["name"] == "mamba2_hybrid"]
    assert entry["provides"] == {"mlsysim_measured_architectures": ["mamba2.bamba"]}
    files = env.python_json("""
        import json, mlsysim_mamba2.plugin
        print(json.dumps([mlsysim_mamba2.plugin.__file__]))
    """)
    assert Path(files[0]).resolve().is_relative_to(env.site_packages.resolve())


@slow
def test_the_package_tests_pass_against_the_installed_wheel(venv):
    env, source = venv
    proc = run_command([env.python, "-m", "pytest", source / "tests", "-v", "-p", "no:cacheprovider", "-rxs"],
                       cwd=source, check=False)
    assert proc.returncode == 0, f"package tests failed:\n{proc.stdout}\n{proc.stderr}"
    summary = proc.stdout.strip().splitlines()[-1]
    assert re.search(r"\b6 passed\b|\b5 passed, 1 xfailed\b", summary), summary
    assert not re.search(r"\b\d+ (failed|skipped|error)", summary), summary
    # the conformance kit runs; mlsysim-core 0.1.0's kit cannot check a profile hook's item (KeyError): xfail
    conformance = [line for line in proc.stdout.splitlines() if "test_the_installed_plugin_conforms" in line]
    assert conformance and all("PASSED" in line or "XFAIL" in line for line in conformance), proc.stdout
