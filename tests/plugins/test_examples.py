"""The three example plugin packages under ``examples/plugins/``, really built and installed.

Each package (``mlsysim-adam-mini``, ``mlsysim-zeropp-hpz``, ``mlsysim-activation-offload``)
is built into a wheel offline with its own hatchling backend and pip-installed into ONE
temporary virtualenv. The virtualenv sees the host's site-packages (pluggy, attrs, cattrs,
pytest and the editable mlsysim-core with its entry points) through a ``.pth`` file, so
nothing is downloaded. Everything then runs in subprocesses with the virtualenv's python,
as a user would: discovery (``plugins --json``), selection by name from Python, from the
CLI and from a scenario file, the numbers (derived by hand below and in each package's
README), provenance, host memory, and finally each package's own test suite, which runs
mlsysim-core's conformance kit against the installed plugin.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from venvtools import Venv, pip_supports_python_option, run

slow = pytest.mark.slow     # the tests that build, install and run the wheels (seconds)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "plugins"
TIMEOUT = 180

# package dir -> (distribution, import package, entry-point name, spec name)
PACKAGES = {
    "mlsysim-adam-mini": ("mlsysim-adam-mini", "mlsysim_adam_mini", "adam_mini", "adammini.adam-mini"),
    "mlsysim-zeropp-hpz": ("mlsysim-zeropp-hpz", "mlsysim_zeropp_hpz", "zeropp_hpz", "zeropp.hpz"),
    "mlsysim-activation-offload": ("mlsysim-activation-offload", "mlsysim_activation_offload",
                                   "activation_offload", "offload.selective-offload"),
}
# package dir -> the plugin module the entry point names
PLUGIN_MODULES = {"mlsysim-adam-mini": "mlsysim_adam_mini.adam_mini",
                  "mlsysim-zeropp-hpz": "mlsysim_zeropp_hpz.hpz",
                  "mlsysim-activation-offload": "mlsysim_activation_offload.offload"}
VERSION = "0.1.0"

# --- hand derivations (each package's README explains them) ------------------------------
# mlsysim:llama3-8b, the reference's Llama-3.1-8B: 8.03e9 params, 32 layers, hidden 4096,
# 32 heads, 8 KV heads of 128, vocabulary 128,256 (untied), SwiGLU MLP of 14,336.
P8B = 8_030_000_000
ADAM_MINI_BLOCKS = (2 * 128_256 + 32 * (32 + 8 + 8 * 128 + 4096 + 2 * 14_336 + 4096) + 2 * 32 + 1)
ADAM_MINI_STATE = 4 * P8B + 4 * P8B + 4 * ADAM_MINI_BLOCKS           # master + m + v blocks
# Llama-3.1-70B (7.06e10 params) over dp = 64: ZeRO-3 + fp16 weights / secondary group.
P70B = 70_600_000_000
HPZ_SECONDARY_8 = P70B * 2 / 8                                      # 17,650,000,000
HPZ_SECONDARY_16 = P70B * 2 / 16                                    # 8,825,000,000
# Selective-recompute activations of one Llama-3.1-8B layer, b = 8, s = 2048, fp16.
LAYER_B8_S2048 = 34 * 2048 * 8 * 4096                               # 2,281,701,376


def test_hand_derivations():
    assert ADAM_MINI_BLOCKS == 1_470_273
    assert ADAM_MINI_STATE == 64_245_881_092
    assert HPZ_SECONDARY_8 == 17_650_000_000
    assert LAYER_B8_S2048 == 2_281_701_376


# --- static checks (no install) ------------------------------------------------------------

def _imports_from_mlsysim(path: Path) -> list[tuple[str, str]]:
    """(module, name) for every `from mlsysim_core... import name` / `import mlsysim...` in a file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mlsysim"):
            found += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [(alias.name, "") for alias in node.names if alias.name.startswith("mlsysim")]
    return found


# The measured profile's plugin API: its package and these modules (their public names).
MEASURED = "mlsysim_plugins.measured"
MEASURED_MODULES = {"buffers", "optimizers", "shapes", "model", "families", "kernels", "regimes", "schedules",
                    "layers"}


def _measured_module(mod: str) -> bool:
    return mod == MEASURED or (mod.startswith(MEASURED + ".") and mod[len(MEASURED) + 1:] in MEASURED_MODULES)


def _private_measured_attributes(path: Path) -> list[str]:
    """``module._name`` reads on a name bound to a measured-profile module (``from
    mlsysim_plugins.measured import buffers`` ... ``buffers._layer_gather``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    bound = {alias.asname or alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
             and node.module == MEASURED for alias in node.names}
    return [f"{node.value.id}.{node.attr}" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name) and node.value.id in bound and node.attr.startswith("_")]


@pytest.mark.parametrize("package", list(PACKAGES))
def test_examples_use_only_the_public_api(package):
    """``mlsysim_core``'s ``__all__``, the conformance kit in the tests, and the measured profile's
    plugin API (``mlsysim_plugins.measured`` and its modules in ``MEASURED_MODULES``, public names)."""
    import mlsysim_core
    _dist, module, _ep, _spec = PACKAGES[package]
    sources = sorted((EXAMPLES / package / "src").rglob("*.py"))
    tests = sorted((EXAMPLES / package / "tests").rglob("*.py"))
    assert sources and tests
    for path in sources + tests:
        for mod, name in _imports_from_mlsysim(path):
            where = f"{path.relative_to(ROOT)}: {mod} {name}"
            if mod == "mlsysim_core":
                assert name in mlsysim_core.__all__, where
            elif mod == "mlsysim_core.testing":
                assert path in tests and name == "assert_plugin_conforms", where
            elif mod == MEASURED and name:                  # from mlsysim_plugins.measured import buffers
                assert name in MEASURED_MODULES, where
            elif _measured_module(mod):                     # from ...measured.buffers import layer_gather,
                assert not name.startswith("_"), where      # import mlsysim_plugins.measured.buffers
            else:
                assert mod == module or mod.startswith(module + "."), where   # the package itself
        assert not _private_measured_attributes(path), f"{path.relative_to(ROOT)}: {_private_measured_attributes(path)}"


def test_the_public_api_check_catches_private_names(tmp_path):
    path = tmp_path / "plugin.py"
    path.write_text("from mlsysim_plugins.measured import buffers, parallel\n"
                    "from mlsysim_plugins.measured._cache import cached_terms\n"
                    "import mlsysim_plugins.measured.lora\n"
                    "x = buffers._layer_gather\n", encoding="utf-8")
    imports = _imports_from_mlsysim(path)
    assert [name in MEASURED_MODULES for mod, name in imports if mod == MEASURED] == [True, False]
    assert not _measured_module("mlsysim_plugins.measured._cache")
    assert not _measured_module("mlsysim_plugins.measured.lora") and _measured_module("mlsysim_plugins.measured.model")
    assert _private_measured_attributes(path) == ["buffers._layer_gather"]


@pytest.mark.parametrize("package", list(PACKAGES))
def test_pyproject_declares_the_entry_point(package):
    tomllib = pytest.importorskip("tomllib")
    dist, _module, entry_point, _spec = PACKAGES[package]
    data = tomllib.loads((EXAMPLES / package / "pyproject.toml").read_text(encoding="utf-8"))
    assert data["build-system"]["build-backend"] == "hatchling.build"
    assert data["project"]["name"] == dist and data["project"]["version"] == VERSION
    assert "mlsysim-core>=0.1" in data["project"]["dependencies"]
    assert data["project"]["entry-points"]["mlsysim_core"] == {entry_point: PLUGIN_MODULES[package]}
    assert (EXAMPLES / package / "README.md").is_file()


def test_walkthrough_code_matches_the_example_package():
    """Code blocks of the guide's walkthrough that name an example file are excerpts of it
    (pieces separated by a `# ...` line), so the guide cannot drift from the package."""
    text = (ROOT / "docs" / "writing-plugins.md").read_text(encoding="utf-8")
    start = text.index("## Walkthrough: the Adam-mini example package, from code to PyPI")
    section = text[start:]
    nxt = re.search(r"^## ", section[3:], flags=re.M)
    section = section[: nxt.start() + 3] if nxt else section
    checked = 0
    for block in re.findall(r"```[a-z]*\n(.*?)```", section, flags=re.S):
        first, _, body = block.partition("\n")
        match = re.fullmatch(r"# (examples/plugins/\S+)", first.strip())
        if not match:
            continue
        source = (ROOT / match.group(1)).read_text(encoding="utf-8")
        for piece in re.split(r"^# \.\.\.\n", body, flags=re.M):
            assert piece.strip() and piece in source, f"{match.group(1)} has no:\n{piece}"
            checked += 1
    assert checked >= 6

# --- the virtualenv ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("examples")


@pytest.fixture(scope="module")
def sources(workdir) -> dict[str, Path]:
    """Copies of the example packages (builds and test runs leave the tree clean)."""
    out = {}
    for package in PACKAGES:
        out[package] = workdir / "src" / package
        shutil.copytree(EXAMPLES / package, out[package],
                        ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "build", "dist",
                                                      "*.egg-info"))
    return out


@pytest.fixture(scope="module")
def wheels(workdir, sources) -> dict[str, Path]:
    """All three wheels, built offline in one pip call:
    ``pip wheel --no-deps --no-build-isolation --no-index -w DIR PKG...``."""
    out = workdir / "wheels"
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
          "--quiet", "-w", out, *sources.values()], cwd=workdir)
    built = {}
    for package, (dist, *_rest) in PACKAGES.items():
        [wheel] = out.glob(f"{dist.replace('-', '_')}-{VERSION}-py3-none-any.whl")
        built[package] = wheel
    return built


@pytest.fixture(scope="module")
def env(workdir, wheels) -> Venv:
    if not pip_supports_python_option():
        pytest.skip("pip >= 22.3 (pip --python) is needed to install into the test virtualenv")
    in_host = []
    for dist, *_rest in PACKAGES.values():
        try:
            importlib.metadata.distribution(dist)
            in_host.append(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    if in_host:   # the venv sees the host's site-packages: the entry points would clash
        pytest.skip(f"{', '.join(in_host)} installed in the host environment; uninstall to test the wheels")
    venv_ = Venv(workdir / "venv")
    venv_.install(*wheels.values())
    return venv_


# --- discovery -----------------------------------------------------------------------------

@slow
def test_wheels_declare_their_entry_points(wheels):
    for package, (_dist, _module, entry_point, _spec) in PACKAGES.items():
        with zipfile.ZipFile(wheels[package]) as wheel:
            [path] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
            text = wheel.read(path).decode()
        assert "[mlsysim_core]" in text
        assert f"{entry_point} = {PLUGIN_MODULES[package]}" in text


@slow
def test_plugins_listing_shows_each_package(env):
    data = json.loads(env.cli("plugins", "--json").stdout)
    by_name = {p["name"]: p for p in data["plugins"]}
    for dist, _module, entry_point, spec in PACKAGES.values():
        entry = by_name[entry_point]
        assert f"{entry['distribution']} {entry['version']}" == f"{dist} {VERSION}"
        assert [name for names in entry["provides"].values() for name in names] == [spec]
    assert by_name["adam_mini"]["hooks"] == ["mlsysim_optimizers"]
    assert by_name["zeropp_hpz"]["hooks"] == ["mlsysim_sharding_rules"]
    assert by_name["activation_offload"]["hooks"] == ["mlsysim_checkpointing_strategies"]
    # Third-party autoload off: all three are skipped, not loaded.
    off = json.loads(env.cli("--no-third-party-plugins", "plugins", "--json").stdout)
    assert not {p["name"] for p in off["plugins"]} & {"adam_mini", "zeropp_hpz", "activation_offload"}
    assert set(off["skipped_third_party"]) >= {"adam_mini", "zeropp_hpz", "activation_offload"}


# --- selection from Python -----------------------------------------------------------------

SOLVE_FROM_PYTHON = """
    import json
    import mlsysim_adam_mini.adam_mini, mlsysim_zeropp_hpz.hpz, mlsysim_activation_offload.offload
    from mlsysim_core import TrainingMemoryModel

    def summary(r):
        return {"total": r.total_memory, "host": r.host_memory,
                **{k: getattr(r, k) for k in ("weights", "gradients", "optimizer_state", "activations",
                                              "communication_buffers")},
                "terms": [[t.component, t.label, t.nbytes, t.source, t.tier] for t in r.terms],
                "plugin_sources": dict(r.plugin_sources), "selected": dict(r.selected),
                "trace": list(r.constraint_trace)}

    m = TrainingMemoryModel()
    out = {
        "files": [mlsysim_adam_mini.adam_mini.__file__, mlsysim_zeropp_hpz.hpz.__file__,
                  mlsysim_activation_offload.offload.__file__],
        "adam": summary(m.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024)),
        "adam_mini": summary(m.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer="adammini.adam-mini")),
        "zero3": summary(m.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, dp_size=64, zero_stage=3,
                                 activation_checkpointing="full")),
        "hpz": summary(m.solve("mlsysim:llama3-70b", "mlsysim:h100", 64, 4096, dp_size=64, data_parallel="zeropp.hpz",
                               activation_checkpointing="full")),
        "selective": summary(m.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048)),
        "offload": summary(m.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048,
                                   activation_checkpointing="offload.selective-offload")),
    }
    print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def solved(env):
    return env.python_json(SOLVE_FROM_PYTHON)


def _terms(summary, source):
    return {label: (nbytes, tier) for _c, label, nbytes, src, tier in summary["terms"] if src == source}


@slow
def test_plugins_come_from_the_installed_wheels(env, solved):
    for path in solved["files"]:
        assert Path(path).resolve().is_relative_to(env.site_packages.resolve()), path


@slow
def test_adam_mini_from_python(solved):
    r, adam = solved["adam_mini"], solved["adam"]
    assert r["selected"]["optimizer"] == "adammini.adam-mini"
    assert r["optimizer_state"] == ADAM_MINI_STATE
    assert _terms(r, "adam_mini") == {
        "adam-mini master copy (fp32)": (4 * P8B, "accelerator"),
        "adam-mini first moment m (fp32)": (4 * P8B, "accelerator"),
        "adam-mini second moment v (fp32, one per block)": (4 * ADAM_MINI_BLOCKS, "accelerator"),
    }
    assert r["plugin_sources"]["adam_mini"] == f"mlsysim-adam-mini {VERSION}"
    for key in ("weights", "gradients", "activations", "communication_buffers"):
        assert r[key] == adam[key], key
    assert adam["optimizer_state"] - r["optimizer_state"] == 4 * P8B - 4 * ADAM_MINI_BLOCKS


@slow
def test_hpz_from_python(solved):
    r, zero3 = solved["hpz"], solved["zero3"]
    assert r["selected"]["dp_rule"] == "zeropp.hpz"
    assert (r["weights"], r["gradients"], r["optimizer_state"]) == (P70B * 2 / 64, P70B * 2 / 64,
                                                                     P70B * 12 / 64)
    assert _terms(r, "zeropp_hpz") == {"hpZ secondary weight partition (fp16)": (HPZ_SECONDARY_8, "accelerator")}
    assert r["communication_buffers"] == zero3["communication_buffers"] + HPZ_SECONDARY_8
    assert r["total"] == pytest.approx(zero3["total"] + HPZ_SECONDARY_8, rel=1e-15)
    assert r["plugin_sources"]["zeropp_hpz"] == f"mlsysim-zeropp-hpz {VERSION}"
    assert any(line.startswith("ZeRO++ hpZ: secondary fp16 weight partition over 8 ranks")
               for line in r["trace"])


@slow
def test_offload_from_python_reports_host_memory(solved):
    r, selective = solved["offload"], solved["selective"]
    assert r["selected"]["activation_checkpointing"] == "offload.selective-offload"
    assert _terms(r, "activation_offload") == {
        "activations kept on device (selective recompute)": (LAYER_B8_S2048, "accelerator"),
        "offload staging buffer (one layer in flight)": (LAYER_B8_S2048, "accelerator"),
        "activations offloaded to host memory": (31 * LAYER_B8_S2048, "host"),
    }
    assert r["activations"] == 2 * LAYER_B8_S2048
    assert r["host"] == 31 * LAYER_B8_S2048 == 70_732_742_656
    assert selective["host"] == 0 and selective["activations"] == 32 * LAYER_B8_S2048
    assert selective["total"] - r["total"] == pytest.approx(30 * LAYER_B8_S2048, rel=1e-15)
    assert r["plugin_sources"]["activation_offload"] == f"mlsysim-activation-offload {VERSION}"


# --- selection from the CLI ----------------------------------------------------------------

def _sources(result: dict, source: str) -> dict:
    return {t["label"]: t for t in result["terms"] if t["source"] == source}


@slow
def test_adam_mini_from_the_cli(env):
    r = env.cli_json("-m", "mlsysim:llama3-8b", "-g", "mlsysim:h100", "-b", "8", "-s", "1024",
                     "--optimizer", "adammini.adam-mini", "--profile", "reference")
    assert r["optimizer_state"] == ADAM_MINI_STATE
    assert r["plugin_sources"]["adam_mini"] == f"mlsysim-adam-mini {VERSION}"
    assert len(_sources(r, "adam_mini")) == 3


@slow
def test_hpz_from_the_cli_with_an_option(env):
    r = env.cli_json("-m", "mlsysim:llama3-70b", "-b", "64", "-s", "4096", "--dp", "64", "--checkpointing", "full",
                     "--data-parallel", "zeropp.hpz", "--option", "zeropp.hpz.secondary_group=16",
                     "--profile", "reference")
    [term] = _sources(r, "zeropp_hpz").values()
    assert term["nbytes"] == HPZ_SECONDARY_16
    assert r["weights"] == P70B * 2 / 64
    assert r["plugin_sources"]["zeropp_hpz"] == f"mlsysim-zeropp-hpz {VERSION}"
    bad = env.cli("estimate", "-m", "mlsysim:llama3-70b", "-b", "64", "--dp", "64", "--data-parallel", "zeropp.hpz",
                  "--option", "zeropp.hpz.secondary_group=3", "--profile", "reference", check=False)
    assert bad.returncode == 2, bad.stderr
    assert "secondary_group=3 is not allowed: a divisor of dp_size=64" in bad.stderr


@slow
def test_offload_from_the_cli_with_an_option(env):
    args = ("-m", "mlsysim:llama3-8b", "-b", "8", "-s", "2048", "--checkpointing", "offload.selective-offload",
            "--option", "offload.selective-offload.layers_on_device=4", "--profile", "reference")
    r = env.cli_json(*args)
    assert r["activations"] == 5 * LAYER_B8_S2048
    assert r["host_memory"] == 28 * LAYER_B8_S2048
    host = _sources(r, "activation_offload")["activations offloaded to host memory"]
    assert host["tier"] == "host"
    explained = env.cli("estimate", *args, "--explain").stdout
    [line] = [line for line in explained.splitlines() if "activations offloaded to host memory" in line]
    assert "activation_offload (mlsysim-activation-offload 0.1.0)" in line
    assert "host memory" in line.split("activations offloaded to host memory", 1)[1]


# --- selection from a scenario file --------------------------------------------------------

# All three at once: Adam-mini, hpZ over groups of 4, offload keeping 2 layers;
# Llama-3.1-8B, dp = 8, global batch 64 (micro-batch 8), s = 4096, fp16.
SCENARIO = {
    "model": "mlsysim:llama3-8b", "hardware": "mlsysim:h100", "batch_size": 64, "seq_len": 4096, "dp_size": 8,
    "optimizer": "adammini.adam-mini", "data_parallel": "zeropp.hpz",
    "activation_checkpointing": "offload.selective-offload",
    "plugin_options": {"zeropp.hpz": {"secondary_group": 4},
                       "offload.selective-offload": {"layers_on_device": 2}},
    "profile": "reference",
}
LAYER_B8_S4096 = 34 * 4096 * 8 * 4096
SCENARIO_EXPECTED = {
    "weights": P8B * 2 / 8,
    "gradients": P8B * 2 / 8,
    "optimizer_state": (8 * P8B + 4 * ADAM_MINI_BLOCKS) / 8,
    "activations": (2 + 1) * LAYER_B8_S4096,
    "host_memory": 30 * LAYER_B8_S4096,
    "communication_buffers": 0.05 * (P8B * 2 / 8) + P8B * 2 / 4,
}


def _check_scenario_result(r: dict):
    for key, value in SCENARIO_EXPECTED.items():
        assert r[key] == pytest.approx(value, rel=1e-15), key
    assert r["plugin_sources"]["adam_mini"] == f"mlsysim-adam-mini {VERSION}"
    assert r["plugin_sources"]["zeropp_hpz"] == f"mlsysim-zeropp-hpz {VERSION}"
    assert r["plugin_sources"]["activation_offload"] == f"mlsysim-activation-offload {VERSION}"
    assert {t["source"] for t in r["terms"]} >= {"adam_mini", "zeropp_hpz", "activation_offload"}


@slow
def test_all_three_from_a_scenario_file(env, workdir):
    path = workdir / "scenario.json"
    path.write_text(json.dumps(SCENARIO, indent=2))
    _check_scenario_result(env.cli_json("--scenario", str(path)))
    from_python = env.python_json(f"""
        import json
        from mlsysim_core.scenario import Scenario
        print(Scenario.load({str(path)!r}).solve().to_json())
    """)
    _check_scenario_result(from_python)


# --- the measured profile (the CLI's default): each package is measured grade, no fallback ---

# Llama-3.1-8B's embedding and LM head (V x h), for Adam-mini's step temporaries.
V8B, H8B = 128_256, 4096
# One Llama-3.1-70B layer (h 8192, 64 heads and 8 KV heads of 128, SwiGLU 28,672): matrices and norms.
LAYER_70B = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28_672 + 2 * 8192


def _measured_without_fallback(r: dict) -> None:
    """Solved under the measured profile, with no note that it fell back to the reference one."""
    assert r["profile"] == "measured", r.get("profile_note")
    assert r["profile_note"] is None
    assert not any("profile reference" in note for note in r["notes"]), r["notes"]


@slow
def test_adam_mini_under_the_measured_profile(env):
    # (the curated Llama-3.1-8B: the measured profile refuses mlsysim:llama3-8b, which gives no architecture)
    r = env.cli_json("-m", "llama3-8b", "-b", "8", "-s", "1024", "--optimizer", "adammini.adam-mini")
    _measured_without_fallback(r)
    assert {label: t["nbytes"] for label, t in _sources(r, "adam_mini").items()} == {
        "adam-mini first moment m (amp-fp16, 4 B)": 4 * 8_030_261_248,     # fp16 -> autocast: fp32 parameters
        "adam-mini second moment v (4 B, one per block)": 4 * ADAM_MINI_BLOCKS,
        "adam-mini step temporaries (per-tensor loop)": 4 * (2 * V8B * H8B + 3 * V8B),
    }
    assert _sources(r, "adam_mini")["adam-mini step temporaries (per-tensor loop)"]["phases"] == ["optimizer_step"]


@slow
def test_hpz_under_the_measured_profile(env):
    r = env.cli_json("-m", "llama3-70b", "-b", "64", "-s", "4096", "--dp", "64", "--checkpointing", "full",
                     "--data-parallel", "zeropp.hpz")
    _measured_without_fallback(r)
    terms = _sources(r, "zeropp_hpz")
    assert set(terms) == {"all-gathered parameters of one layer", "hpZ secondary partition of the layers (amp-fp16, 4 B)",
                          "reduce-scatter input: one layer's unsharded gradients"}
    # Every layer's secondary shard in the gathered dtype (fp32 weights under autocast), not fp16.
    assert terms["hpZ secondary partition of the layers (amp-fp16, 4 B)"]["nbytes"] == 80 * LAYER_70B / 8 * 4


@slow
def test_offload_under_the_measured_profile(env):
    r = env.cli_json("-m", "llama3-8b", "-b", "8", "-s", "2048", "--checkpointing", "offload.selective-offload")
    _measured_without_fallback(r)
    terms = _sources(r, "activation_offload")
    host = terms["activations offloaded to host memory"]
    staging = terms["offload staging buffer (one layer in flight)"]
    assert host["tier"] == "host" and r["host_memory"] == host["nbytes"] == 31 * staging["nbytes"] > 0
    assert "approximation (regime amp-fp16)" in host["formula"]      # measured in fp32 only: said
    assert staging["phases"] == ["backward_end"]
    assert terms["activations kept on device (selective recompute)"]["phases"] == ["forward", "backward"]


@slow
def test_the_measured_runs_from_the_cli(env, workdir):
    """The runs of validation/examples/measurements.json, from the installed wheels and the CLI: the
    model from its Hugging Face config.json, fp32, SDPA, no runtime overheads."""
    data = json.loads((ROOT / "validation" / "examples" / "measurements.json").read_text(encoding="utf-8"))
    runs = {run["id"]: run for run in data["runs"]}
    config = workdir / "gqa-tiny" / "config.json"
    config.parent.mkdir(exist_ok=True)
    config.write_text(json.dumps(data["model"]["hf_config"]), encoding="utf-8")
    common = ("-m", str(config), "-s", "256", "--precision", "fp32", "--regime", "fp32", "--attention", "sdpa",
              "--no-runtime-overheads")
    mini = env.cli_json(*common, "-b", "2", "--checkpointing", "none", "--optimizer", "adammini.adam-mini")
    _measured_without_fallback(mini)
    steady = sum(t["nbytes"] for t in _sources(mini, "adam_mini").values() if "forward" in t["phases"])
    kept = runs["adam-mini-gqa-tiny-fp32-b2-s256"]["measured"]["alive"]["after_zero_grad"]["by_category"]
    assert steady == kept["optimizer_state"] == 76_908_228
    hpz_ = env.cli_json(*common, "-b", "16", "--dp", "8", "--checkpointing", "none", "--optimizer", "adamw",
                        "--data-parallel", "zeropp.hpz", "--option", "zeropp.hpz.secondary_group=2")
    _measured_without_fallback(hpz_)
    [secondary] = [t for t in _sources(hpz_, "zeropp_hpz").values() if t["label"].startswith("hpZ")]
    [comparison] = [c for c in data["comparisons"] if c["run"] == "fsdp2-gqa-tiny-fp32-w8-raf-2-b2-s256-r0"]
    assert secondary["nbytes"] == comparison["secondary_shard_bytes_at_end_of_forward"] == 5_541_888
    off = env.cli_json(*common, "-b", "2", "--optimizer", "adamw", "--checkpointing", "offload.selective-offload",
                       "--option", "offload.selective-offload.layers_on_device=0")
    _measured_without_fallback(off)
    packed = runs["offload-save-on-cpu-simulated-gqa-tiny-fp32-b2-s256"]["measured"]["offload"]
    layers = sum(v["bytes"] for k, v in packed["packed_in_measured_forward"]["by_module"].items()
                 if k.startswith("layers."))
    assert off["host_memory"] == layers == 64_659_456


@slow
def test_all_three_from_a_scenario_file_under_the_measured_profile(env, workdir):
    path = workdir / "scenario-measured.json"
    measured = {k: v for k, v in SCENARIO.items() if k != "profile"}
    measured["model"] = "llama3-8b"      # (the curated entry: the measured profile refuses mlsysim:llama3-8b)
    path.write_text(json.dumps(measured, indent=2))
    r = env.cli_json("--scenario", str(path))
    _measured_without_fallback(r)
    assert {t["source"] for t in r["terms"]} >= {"adam_mini", "zeropp_hpz", "activation_offload"}
    for plugin in ("adam_mini", "zeropp_hpz", "activation_offload"):
        assert r["plugin_sources"][plugin].endswith(VERSION)
    assert r["host_memory"] > 0


# --- each package's own tests (the conformance kit included), against the installed wheel ---

@slow
@pytest.mark.parametrize("package", list(PACKAGES))
def test_package_tests_pass_against_the_installed_plugin(env, sources, package):
    proc = run([env.python, "-m", "pytest", sources[package] / "tests", "-v", "-p", "no:cacheprovider",
                 "-rs"], cwd=sources[package], check=False)
    assert proc.returncode == 0, f"{package} tests failed:\n{proc.stdout}\n{proc.stderr}"
    summary = proc.stdout.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, summary
    conformance = [line for line in proc.stdout.splitlines() if "test_the_installed_plugin_conforms" in line]
    assert conformance and all("PASSED" in line for line in conformance), proc.stdout
