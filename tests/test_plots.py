"""Pictures: the numbers behind them (no matplotlib needed), the files (matplotlib), the CLI."""

import io
import json
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from mlsysim_core import BACKWARD, FORWARD, OPTIMIZER_STEP, PHASES
from mlsysim_core.catalog import get_hardware, get_model
from mlsysim_core.cli import main
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.scenario import Scenario
from mlsysim_core import plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


def is_png(path):
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def is_svg(path):
    return path.is_file() and ET.parse(path).getroot().tag == "{http://www.w3.org/2000/svg}svg"


def largest_fitting_micro_batch(model, hardware, seq, candidates):
    """Independently of the solver: the reference's fp16 Adam, selective checkpointing, one
    rank. Fixed 2+2+12 B per parameter plus a 5 % gradient bucket; 34*s*b*h B per layer."""
    p, layers, h = model.parameters, model.layers, model.hidden_dim
    fixed = 16 * p + 0.05 * 2 * p
    per_sequence = layers * 34 * seq * h
    fits = [b for b in candidates if (fixed + b * per_sequence) * 1e-9 <= hardware.memory_capacity * 1e-9]
    return max(fits, default=None)


def largest_fitting_seq(model, hardware, micro_batch, candidates):
    p, layers, h = model.parameters, model.layers, model.hidden_dim
    fixed = 16 * p + 0.05 * 2 * p
    fits = [s for s in candidates
            if (fixed + layers * 34 * s * micro_batch * h) * 1e-9 <= hardware.memory_capacity * 1e-9]
    return max(fits, default=None)


# --- the numbers (no matplotlib) --------------------------------------------------------------

def test_phase_bytes_follow_term_liveness(solver):
    r = solver.solve("llama3-70b", "h100", 64, 4096, tp_size=8, pp_size=4, dp_size=2, zero_stage=1,
                     gradient_accumulation_steps=4)
    alive = plots.phase_bytes(r)
    assert list(alive) == list(PHASES)
    buffers = {t.label: t.nbytes for t in r.terms_of("communication_buffers")}
    pipeline, bucket = buffers["pipeline send + receive buffers"], buffers["gradient bucket"]
    assert alive[FORWARD] == {"weights": r.weights, "gradients": 0, "optimizer_state": r.optimizer_state,
                              "activations": r.activations, "communication_buffers": pipeline,
                              "runtime_overheads": 0}
    assert alive[BACKWARD] == {"weights": r.weights, "gradients": r.gradients,
                               "optimizer_state": r.optimizer_state, "activations": r.activations,
                               "communication_buffers": pipeline + bucket, "runtime_overheads": 0}
    assert alive["backward_end"] == {"weights": r.weights, "gradients": r.gradients,
                                     "optimizer_state": r.optimizer_state, "activations": 0,
                                     "communication_buffers": bucket, "runtime_overheads": 0}
    assert alive[OPTIMIZER_STEP] == {"weights": r.weights, "gradients": r.gradients,
                                     "optimizer_state": r.optimizer_state, "activations": 0,
                                     "communication_buffers": 0, "runtime_overheads": 0}
    assert plots.peak_phase(r) == (BACKWARD, pytest.approx(r.total_memory))


def test_sweep_batch_finds_the_largest_micro_batch_that_fits(solver):
    model, hardware = get_model("llama3-8b"), get_hardware("h200")
    values = [1, 2, 3, 4, 5, 6, 8, 16]
    scenario = Scenario(model="llama3-8b", hardware="h200", batch_size=8, seq_len=1024)
    data = plots.sweep(scenario, "batch", values, solver=solver)
    assert data.values == tuple(values)
    assert [r.microbatch for r in data.results] == values
    expected = largest_fitting_micro_batch(model, hardware, 1024, values)
    assert expected is not None and expected < max(values)      # the sweep crosses the capacity
    assert data.largest_fitting == expected
    totals = [r.total_memory for r in data.results]
    assert totals == sorted(totals)


def test_sweep_batch_keeps_dp_and_accumulation(solver):
    scenario = Scenario(model="llama3-8b", hardware="h100", batch_size=1, seq_len=1024, dp_size=8,
                        zero_stage=3, gradient_accumulation_steps=2)
    data = plots.sweep(scenario, "batch", [1, 2, 4], solver=solver)
    assert [r.microbatch for r in data.results] == [1, 2, 4]
    assert data.results[2].total_memory == solver.solve("llama3-8b", "h100", 64, 1024, dp_size=8, zero_stage=3,
                                                        gradient_accumulation_steps=2).total_memory


def test_sweep_seq_and_nothing_fits(solver):
    model, hardware = get_model("llama3-8b"), get_hardware("h200")
    values = [512, 1024, 2048, 4096, 8192, 16384]
    data = plots.sweep(Scenario(model="llama3-8b", hardware="h200", batch_size=1), "seq", values, solver=solver)
    assert data.largest_fitting == largest_fitting_seq(model, hardware, 1, values) == 4096
    none = plots.sweep(Scenario(model="llama3-70b", hardware="h100", batch_size=1), "seq", [512, 1024],
                       solver=solver)
    assert none.largest_fitting is None and none.fitting == ()


@pytest.mark.parametrize("parameter,values", [("depth", [1]), ("batch", []), ("batch", [0]),
                                              ("seq", [1.5]), ("batch", [True])])
def test_sweep_rejects_bad_input(solver, parameter, values):
    with pytest.raises(InvalidInputError):
        plots.sweep(Scenario(model="gpt2", hardware="h100", batch_size=1), parameter, values, solver=solver)


def test_default_labels_name_what_differs(solver):
    results = [solver.solve("llama3-8b", "h100", 64, 1024, dp_size=8, zero_stage=z) for z in (0, 3)]
    assert plots.default_labels(results) == ["ZeRO-0", "ZeRO-3"]
    assert plots.default_labels(results[:1]) == [results[0].model]


def test_importing_plots_does_not_import_matplotlib():
    code = "import sys, mlsysim_core.plots; sys.exit('matplotlib' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_missing_matplotlib_names_the_extra(monkeypatch, solver, tmp_path, capsys):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib -> ImportError
    with pytest.raises(plots.PlotExtraMissingError, match=r"pip install 'mlsysim-core\[plot\]'"):
        plots.plot_bars([solver.solve("gpt2", "h100", 1)])
    code, _ = run("plot", "bars", "-m", "gpt2", "-o", str(tmp_path / "x.png"))
    assert code == 3
    assert "pip install 'mlsysim-core[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


# --- the pictures (matplotlib) -------------------------------------------------------------

@pytest.fixture(scope="module")
def mpl():
    return pytest.importorskip("matplotlib")


def test_bars_png_and_svg(mpl, solver, tmp_path):
    results = [solver.solve("llama3-8b", "h100", 64, 1024, dp_size=8, zero_stage=z) for z in range(4)]
    fig = plots.plot_bars(results, path=tmp_path / "zero.png")
    assert is_png(tmp_path / "zero.png")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    assert ax.get_ylabel() == "GB (1e9 bytes)"
    assert any(a.get_ylabel() == "GiB (2^30 bytes)" for a in ax.child_axes)
    # the capacity line is at the H100's 85.899 GB
    assert any(list(line.get_ydata()) == [results[0].available_memory / 1e9] * 2 for line in ax.get_lines())
    plots.save(fig, tmp_path / "zero.svg")
    assert is_svg(tmp_path / "zero.svg")
    with pytest.raises(InvalidInputError, match="ending in .png or .svg"):
        plots.save(fig, tmp_path / "zero.pdf")
    with pytest.raises(InvalidInputError, match="one label per result"):
        plots.plot_bars(results, labels=["a"])


def test_timeline_marks_the_peak(mpl, solver, tmp_path):
    r = solver.solve("llama3-8b", "h100", 8, 2048, dp_size=8, zero_stage=3)
    fig = plots.plot_timeline(r, path=tmp_path / "timeline.svg")
    assert is_svg(tmp_path / "timeline.svg")
    ax = fig.axes[0]
    assert "alive per phase" in ax.get_title()
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == ["forward", "backward\n(peak)", "backward end", "optimizer step"]
    assert any(t.get_text().startswith("peak: ") for t in ax.texts)


def test_sweep_plot_marks_the_largest_that_fits(mpl, solver, tmp_path):
    values = [1, 2, 4, 8, 16]
    data = plots.sweep(Scenario(model="llama3-8b", hardware="h200", batch_size=1, seq_len=1024), "batch",
                       values, solver=solver)
    fig = plots.plot_sweep(data, path=tmp_path / "sweep.png")
    assert is_png(tmp_path / "sweep.png")
    best = largest_fitting_micro_batch(get_model("llama3-8b"), get_hardware("h200"), 1024, values)
    assert any(t.get_text().startswith(f"largest micro-batch that fits: {best}") for t in fig.axes[0].texts)


def test_plot_command(mpl, tmp_path):
    code, text = run("plot", "sweep", "-g", "h200", "-s", "1024", "--values", "1,2,4,8,16",
                     "-o", str(tmp_path / "s.svg"))
    assert code == 0 and is_svg(tmp_path / "s.svg")
    best = largest_fitting_micro_batch(get_model("llama3-8b"), get_hardware("h200"), 1024, [1, 2, 4, 8, 16])
    assert f"largest micro-batch that fits: {best}\n" in text
    scenario = tmp_path / "run.json"
    scenario.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 64,
                                    "seq_len": 1024, "dp_size": 8}))
    code, text = run("plot", "bars", "--scenario", str(scenario), "--vary", "zero_stage", "--values", "0,1,2,3",
                     "-o", str(tmp_path / "b.png"))
    assert code == 0 and is_png(tmp_path / "b.png") and text.startswith("wrote ")


@pytest.mark.parametrize("argv,fragment", [
    (["plot", "bars", "-o", "x.pdf"], "--output='x.pdf'"),
    (["plot", "timeline", "--values", "1,2", "-o", "x.png"], "--values='1,2'"),
    (["plot", "timeline", "--vary", "seq_len", "-o", "x.png"], "--vary='seq_len'"),
    (["plot", "bars", "--vary", "colour", "--values", "1", "-o", "x.png"], "--vary='colour'"),
    (["plot", "bars", "--vary", "zero_stage", "-o", "x.png"], "--values=None"),
    (["plot", "sweep", "--values", "1,a", "-o", "x.png"], "--values='1,a'"),
    (["plot", "sweep", "--values", "1,,2", "-o", "x.png"], "--values='1,,2'"),
])
def test_plot_command_errors(mpl, capsys, argv, fragment, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _ = run(*argv)
    err = capsys.readouterr().err
    assert code == 2 and fragment in err, err
    assert not list(tmp_path.iterdir())
