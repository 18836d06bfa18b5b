"""A real third-party plugin, really installed: wheel -> pip -> entry points -> solve.

The two fixture packages under ``tests/fixtures/`` (``mlsysim-demo-optimizer`` and
``mlsysim-demo-conflict``) are built into wheels offline with their own hatchling backend
and pip-installed into temporary virtualenvs. Each virtualenv sees the host's
site-packages (pluggy, attrs, cattrs and the editable mlsysim-core with its entry points)
through a ``.pth`` file, so nothing is downloaded. Everything then runs in a subprocess
with the virtualenv's python, exactly as a user would.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from venvtools import Venv, build_wheels

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORE_DIR = Path(__file__).resolve().parents[2] / "mlsysim_core"
TIMEOUT = 180

# Hand derivation (see tests/fixtures/mlsysim-demo-optimizer/README.md), Llama-3.1-8B
# (8.03e9 params, 32 layers, hidden 4096), rank 64, no parallelism:
GALORE_MASTER = 4.0 * 8_030_000_000                 # 32,120,000,000 B
GALORE_MOMENTS = 8 * 64 * 4096 * 7 * 32             # 469,762,048 B
GALORE_STATE = GALORE_MASTER + GALORE_MOMENTS       # 32,589,762,048 B


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("plugin_install")


@pytest.fixture(scope="module")
def wheels(workdir) -> dict[str, Path]:
    """Both fixture packages built into wheels, offline, from copies (the tree stays clean)."""
    out = workdir / "wheels"
    built = {}
    for package in ("mlsysim-demo-optimizer", "mlsysim-demo-conflict"):
        src = workdir / "src" / package
        shutil.copytree(FIXTURES / package, src,
                        ignore=shutil.ignore_patterns("__pycache__", "build", "dist", "*.egg-info"))
        build_wheels([src], out, cwd=workdir)
        [wheel] = out.glob(package.replace("-", "_") + "-0.1.0-*.whl")
        built[package] = wheel
    return built


@pytest.fixture(scope="module")
def galore_venv(workdir, wheels) -> Venv:
    env = Venv(workdir / "venv-galore")
    env.install(wheels["mlsysim-demo-optimizer"])
    return env


@pytest.fixture(scope="module")
def conflict_venv(workdir, wheels) -> Venv:
    env = Venv(workdir / "venv-conflict")
    env.install(wheels["mlsysim-demo-optimizer"])
    env.install(wheels["mlsysim-demo-conflict"])
    return env


def _require_cli():
    if not (CORE_DIR / "cli.py").is_file() or not (CORE_DIR / "__main__.py").is_file():
        pytest.skip("mlsysim_core/cli.py (or __main__.py) is missing: no `python -m mlsysim_core` "
                    "CLI to check `plugins --json` with")


SOLVE_GALORE = """
    import json
    import mlsysim_core, mlsysim_demo_optimizer
    from mlsysim_core import TrainingMemoryModel
    r = TrainingMemoryModel().solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer="demo.galore",
                                    plugin_options={"demo.galore": {"rank": 64}})
    adam = TrainingMemoryModel().solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024)
    print(json.dumps({
        "optimizer_state": r.optimizer_state, "weights": r.weights, "gradients": r.gradients,
        "activations": r.activations, "communication_buffers": r.communication_buffers,
        "adam": {k: getattr(adam, k) for k in ("weights", "gradients", "activations",
                                               "communication_buffers", "optimizer_state")},
        "terms": [[t.label, t.source, t.nbytes, t.formula] for t in r.terms_of("optimizer_state")],
        "plugin_sources": dict(r.plugin_sources), "selected": dict(r.selected),
        "plugin_file": mlsysim_demo_optimizer.__file__, "core_file": mlsysim_core.__file__,
    }))
"""


def test_installed_optimizer_is_selectable_and_attributed(galore_venv):
    out = galore_venv.python_json(SOLVE_GALORE)
    # The plugin really comes from the installed wheel, mlsysim-core from the host.
    assert Path(out["plugin_file"]).resolve().is_relative_to(galore_venv.site_packages.resolve())
    assert Path(out["core_file"]).resolve().parent == CORE_DIR
    assert GALORE_MOMENTS == 469_762_048
    assert out["optimizer_state"] == GALORE_STATE == 32_589_762_048.0
    assert out["terms"] == [
        ["demo.galore fp32 master copy", "demo_galore", GALORE_MASTER,
         "4 B x 8,030,000,000 trainable params/rank"],
        ["demo.galore low-rank moments m, v (fp32, rank 64)", "demo_galore", GALORE_MOMENTS,
         "8 B x rank 64 x hidden_dim 4096 x 7 matrices/layer x 32 layers / 1 (parameter shards)"],
    ]
    assert out["plugin_sources"]["demo_galore"] == "mlsysim-demo-optimizer 0.1.0"
    assert out["selected"]["optimizer"] == "demo.galore"
    # Only the optimizer state differs from the built-in Adam solve.
    for key in ("weights", "gradients", "activations", "communication_buffers"):
        assert out[key] == out["adam"][key], key
    assert out["adam"]["optimizer_state"] == 12.0 * 8_030_000_000


def test_installed_optimizer_rejects_bad_options(galore_venv):
    out = galore_venv.python_json("""
        import json
        from mlsysim_core import InvalidInputError, TrainingMemoryModel
        try:
            TrainingMemoryModel().solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer="demo.galore",
                                        plugin_options={"demo.galore": {"rank": 0}})
        except InvalidInputError as err:
            print(json.dumps({"type": type(err).__name__, "parameter": err.parameter}))
        else:
            print(json.dumps({"type": None}))
    """)
    assert out == {"type": "InvalidInputError", "parameter": "plugin_options['demo.galore']"}


def test_cli_lists_the_installed_plugin(galore_venv):
    _require_cli()
    proc = galore_venv.cli("plugins", "--json")
    data = json.loads(proc.stdout)
    assert "demo_galore" in proc.stdout
    [entry] = [p for p in data["plugins"] if p["name"] == "demo_galore"]
    assert f"{entry['distribution']} {entry['version']}" == "mlsysim-demo-optimizer 0.1.0"
    assert entry["provides"] == {"optimizer": ["demo.galore"]}
    assert "mlsysim_optimizers" in entry["hooks"]
    # The CLI solves with it too.
    est = galore_venv.cli("estimate", "--model", "mlsysim:llama3-8b", "--hardware", "mlsysim:h100", "-b", "8",
                          "-s", "1024", "--optimizer", "demo.galore", "--option", "demo.galore.rank=64",
                          "--json", "--profile", "reference")     # (reference-grade only: asked for by name)
    assert json.loads(est.stdout)["optimizer_state"] == GALORE_STATE
    # Without third-party autoload the plugin is listed as skipped, not loaded.
    off = json.loads(galore_venv.cli("--no-third-party-plugins", "plugins", "--json").stdout)
    assert "demo_galore" not in [p["name"] for p in off["plugins"]]
    assert off["skipped_third_party"] == ["demo_galore"]


def test_installed_conflicting_plugin_names_both_providers(conflict_venv):
    out = conflict_venv.python_json("""
        import json
        from mlsysim_core import PluginConflictError, TrainingMemoryModel
        try:
            TrainingMemoryModel().solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024)
        except PluginConflictError as err:
            print(json.dumps({"type": type(err).__name__, "message": str(err),
                              "plugin": err.plugin, "source": err.source}))
        else:
            print(json.dumps({"type": None}))
    """)
    assert out["type"] == "PluginConflictError"
    msg = out["message"]
    assert "optimizer 'adam' is provided by more than one plugin" in msg
    assert "plugin 'adam' (mlsysim-core 0.1.0)" in msg
    assert "plugin 'demo_conflict' (mlsysim-demo-conflict 0.1.0)" in msg
    assert "MLSYSIM_DISABLED_PLUGINS" in msg
    assert (out["plugin"], out["source"]) == ("demo_conflict", "mlsysim-demo-conflict 0.1.0")


def test_blocking_the_conflicting_plugin_restores_the_solve(conflict_venv):
    out = conflict_venv.python_json("""
        import json
        from mlsysim_core import PluginManager, TrainingMemoryModel
        pm = PluginManager.from_environment(blocked=["demo_conflict"])
        model = TrainingMemoryModel(plugin_manager=pm)
        adam = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024)
        galore = model.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 1024, optimizer="demo.galore",
                             plugin_options={"demo.galore": {"rank": 64}})
        print(json.dumps({"adam": adam.optimizer_state, "galore": galore.optimizer_state,
                          "adam_source": adam.plugin_sources["adam"]}))
    """)
    assert out == {"adam": 12.0 * 8_030_000_000, "galore": GALORE_STATE,
                   "adam_source": "mlsysim-core 0.1.0"}


def test_cli_reports_the_conflict(conflict_venv):
    _require_cli()
    proc = conflict_venv.cli("plugins", "--json", check=False)
    assert proc.returncode == 3, proc.stderr
    assert "mlsysim-demo-conflict 0.1.0" in proc.stderr
    assert "mlsysim-core 0.1.0" in proc.stderr
