"""Pictures: the numbers behind them (no matplotlib needed), the files (matplotlib), the CLI."""

import io
import json
import os
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

# Long (about 25 s: sweeps and matplotlib renderings): `pytest --long` and .ci/run run them.
pytestmark = pytest.mark.long

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
                     "-o", str(tmp_path / "s.svg"), "--profile", "reference")
    assert code == 0 and is_svg(tmp_path / "s.svg")
    best = largest_fitting_micro_batch(get_model("llama3-8b"), get_hardware("h200"), 1024, [1, 2, 4, 8, 16])
    assert f"largest micro-batch that fits: {best} (the exact largest, as `mlsysim-core fit batch` finds)\n" in text
    scenario = tmp_path / "run.json"
    scenario.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 64,
                                    "seq_len": 1024, "dp_size": 8}))
    code, text = run("plot", "bars", "--scenario", str(scenario), "--vary", "zero_stage", "--values", "0,1,2,3",
                     "-o", str(tmp_path / "b.png"))
    assert code == 0 and is_png(tmp_path / "b.png") and text.splitlines()[-1].startswith("wrote ")
    assert "note         (zero_stage=1) ZeRO-1" in text     # the results' own notes, naming their bar


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


# --- both profiles, every --vary field, parallel layouts (issue 13, item 2) ------------------

COMPONENT_FIELDS = ("weights", "gradients", "optimizer_state", "activations", "communication_buffers",
                    "runtime_overheads")


def bar_heights(ax):
    """{component: [GB per bar]} read back from the drawn stacked bars."""
    heights = {}
    for container in ax.containers:
        label = container.get_label()
        if label and not label.startswith("_"):
            heights[label.replace(" ", "_")] = [patch.get_height() for patch in container.patches]
    return heights


def assert_bars_are_components(ax, reports):
    """Each bar's stacked heights are its report's components in GB, runtime overheads too."""
    drawn = bar_heights(ax)
    for component in COMPONENT_FIELDS:
        expected = [getattr(r, component) / 1e9 for r in reports]
        if any(expected):
            assert drawn[component] == pytest.approx(expected), component
        else:
            assert component not in drawn
    totals = [sum(column) for column in zip(*drawn.values())]
    assert totals == pytest.approx([r.total_memory / 1e9 for r in reports])


def _visible_ticklabels(axis, limits):
    lo, hi = sorted(limits)
    return [t.label1 for t in axis.get_major_ticks() if lo - 1e-9 <= t.get_loc() <= hi + 1e-9]


def figure_texts(fig):
    """Every piece of text drawn: titles, axis labels, tick labels in view, annotations,
    the secondary axis and the legend."""
    texts = []
    for ax in fig.axes:
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
        texts += _visible_ticklabels(ax.xaxis, ax.get_xlim()) + _visible_ticklabels(ax.yaxis, ax.get_ylim())
        for child in ax.child_axes:
            lo, hi = sorted(child.get_ylim())
            texts += [child.yaxis.label] + [t.label2 for t in child.yaxis.get_major_ticks()
                                            if lo - 1e-9 <= t.get_loc() <= hi + 1e-9]
    for legend in fig.legends:
        texts += legend.get_texts()
    return [t for t in texts if t.get_visible() and t.get_text().strip()]


def assert_no_text_overlaps(fig):
    """Measured with the Agg renderer: no two texts share a pixel, and all lie in the figure."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in figure_texts(fig)]
    assert len(boxes) > 10
    clashes = [(a, b) for i, (a, box_a) in enumerate(boxes) for b, box_b in boxes[i + 1:] if box_a.overlaps(box_b)]
    assert not clashes
    width, height = fig.canvas.get_width_height()
    outside = [text for text, box in boxes if box.x0 < 0 or box.y0 < 0 or box.x1 > width or box.y1 > height]
    assert not outside


@pytest.fixture()
def drawn(monkeypatch):
    """Run `plot` for real but keep the figures and results instead of rasterizing them."""
    record = {"figures": [], "results": [], "paths": []}
    real_bars, real_timeline, real_sweep = plots.plot_bars, plots.plot_timeline, plots.plot_sweep

    def bars(results, labels=None, **kw):
        record["results"] = list(results)
        return real_bars(results, labels, **kw)

    def timeline(result, **kw):
        record["results"] = [result]
        return real_timeline(result, **kw)

    def sweep(data, **kw):
        record["results"] = list(data.results)
        return real_sweep(data, **kw)

    def save(fig, path, **kw):
        record["figures"].append(fig)
        record["paths"].append(plots.check_output(path, kw.get("parameter", "output")))
        return path

    monkeypatch.setattr(plots, "plot_bars", bars)
    monkeypatch.setattr(plots, "plot_timeline", timeline)
    monkeypatch.setattr(plots, "plot_sweep", sweep)
    monkeypatch.setattr(plots, "save", save)
    return record


@pytest.mark.parametrize("profile", ["reference", "measured"])
@pytest.mark.parametrize("kind", ["bars", "timeline", "sweep"])
def test_every_plot_kind_under_both_profiles(mpl, tmp_path, profile, kind):
    # measured: KeyError 'runtime_overheads' before (no colour for the sixth component)
    argv = ["plot", kind, "--profile", profile, "-m", "llama3-8b", "-s", "1024", "-o", str(tmp_path / "p.png")]
    argv += [] if kind == "sweep" else ["-b", "8"]     # (a batch sweep refuses -b: it draws the batch)
    code, text = run(*(argv + (["--values", "1,2,4"] if kind == "sweep" else [])))
    assert code == 0 and is_png(tmp_path / "p.png"), text


def test_bars_under_the_measured_profile_draw_runtime_overheads(mpl, solver):
    r = solver.solve("llama3-8b", "h100", 8, 2048, profile="measured")
    assert r.runtime_overheads > 0 and r.peak_phase
    fig = plots.plot_bars([r])
    assert_bars_are_components(fig.axes[0], [r])
    assert "runtime overheads" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert fig.axes[0].get_xlabel() == f"measured profile: total = the peak over phases (the {r.peak_phase} phase)"


def test_vary_profile_reference_and_measured(mpl, tmp_path, drawn):
    code, text = run("plot", "bars", "-m", "llama3-8b", "-b", "8", "-s", "1024", "--vary", "profile",
                     "--values", "reference,measured", "-o", str(tmp_path / "v.png"))
    assert code == 0, text
    reference, measured = drawn["results"]
    assert (reference.profile, measured.profile) == ("reference", "measured")
    assert reference.runtime_overheads == 0 < measured.runtime_overheads
    ax = drawn["figures"][0].axes[0]
    assert_bars_are_components(ax, [reference, measured])
    assert ax.get_xlabel().split("\n") == [
        "reference profile: total = every term summed, whatever its phase",
        f"measured profile: total = the peak over phases (the {measured.peak_phase.replace('_', ' ')} phase)"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["profile=reference", "profile=measured"]


def test_vary_profile_leaves_measured_options_out_of_the_reference_bar(mpl, tmp_path, drawn):
    # --no-runtime-overheads is a measured-only option: the reference bar used to be an error
    code, text = run("plot", "bars", "-m", "llama3-8b", "-b", "8", "-s", "1024", "--no-runtime-overheads",
                     "--vary", "profile", "--values", "reference,measured", "-o", str(tmp_path / "v.png"))
    assert code == 0, text
    assert "note: profile=reference: measured-profile options left out: --no-runtime-overheads" in text
    reference, measured = drawn["results"]
    assert measured.runtime_overheads == 0 and measured.peak_phase
    assert reference.total_memory == main_solve_total("llama3-8b", 8, 1024)


def main_solve_total(model, batch, seq):
    from mlsysim_core import TrainingMemoryModel
    return TrainingMemoryModel().solve(model, "h100", batch, seq).total_memory


@pytest.mark.parametrize("overheads", [[], ["--no-runtime-overheads"]])
def test_timeline_caption_states_the_measured_combine_rule(mpl, tmp_path, drawn, overheads):
    code, _ = run("plot", "timeline", "--profile", "measured", "-m", "llama3-8b", "-b", "8", *overheads,
                  "-o", str(tmp_path / "t.png"))
    assert code == 0
    (r,), ax = drawn["results"], drawn["figures"][0].axes[0]
    phase = r.peak_phase.replace("_", " ")
    caption = ax.get_xlabel().replace("\n", " ")
    assert f"measured profile: total = the peak over phases (the {phase} phase)" in caption
    assert "summed" not in caption
    legend = [t.get_text() for t in drawn["figures"][0].legends[0].get_texts()]
    assert f"measured profile total, peak over phases ({phase}): {r.total_memory / 1e9:,.1f} GB" in legend
    assert ("runtime overheads" in legend) == (not overheads)
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks[PHASES.index(r.peak_phase)].endswith("(peak)")
    # the peak bar is the profile's total
    assert plots.peak_phase(r) == (r.peak_phase, pytest.approx(r.total_memory))


def test_timeline_caption_under_the_reference_profile(mpl, solver):
    r = solver.solve("llama3-8b", "h100", 8, 2048)
    ax = plots.plot_timeline(r).axes[0]
    assert "reference profile: total = every term summed, whatever its phase" in ax.get_xlabel().replace("\n", " ")
    assert plots.combine_rule(r) == "every term summed, whatever its phase"


VARY_CASES = [   # field, values, extra flags: every field `plot bars --vary` allows
    ("batch_size", "8,16,32", []), ("seq_len", "512,1024,2048", []), ("precision", "fp32,bf16,fp16", []),
    ("optimizer", "adam,sgd", []), ("activation_checkpointing", "none,selective,full", []),
    ("tp_size", "1,2,4", []), ("pp_size", "1,2", []), ("dp_size", "1,2,4", []),
    ("ep_size", "1,2", ["-m", "mixtral-8x7b", "--dp", "2"]), ("zero_stage", "0,1,2,3", ["--dp", "4"]),
    ("gradient_accumulation_steps", "1,2,4", []), ("trainable_fraction", "1.0,0.5", []),
    ("communication_buffer_fraction", "0.0,0.1", ["--dp", "2"]),
    ("model", "llama3-8b,llama3-70b", []), ("hardware", "t4,h100,h200", []), ("profile", "reference,measured", []),
    ("data_parallel", "zero0,zero3", ["--dp", "4"]), ("sequence_parallel", "true,false", ["--tp", "2"]),
]


def test_vary_cases_cover_every_allowed_field():
    from mlsysim_core.cli import VARY_FIELDS
    from mlsysim_core.scenario import SOLVE_FIELDS
    assert sorted(field for field, _, _ in VARY_CASES) == sorted({*SOLVE_FIELDS, *VARY_FIELDS})


@pytest.mark.parametrize("profile", ["reference", "measured"])
@pytest.mark.parametrize("field,values,extra", VARY_CASES, ids=[c[0] for c in VARY_CASES])
def test_every_vary_field_under_both_profiles(mpl, tmp_path, drawn, profile, field, values, extra, capsys):
    model = [] if "-m" in extra else ["-m", "llama3-8b"]      # (a flag given twice differently is refused)
    argv = ["plot", "bars", "--profile", profile, *model, "-b", "16", "-s", "1024", *extra,
            "--vary", field, "--values", values, "-o", str(tmp_path / "v.png")]
    if field == "communication_buffer_fraction" and profile == "measured":    # the reference's knob
        code, _ = run(*argv)
        assert code == 2 and "communication_buffer_fraction=0.0 is not allowed" in capsys.readouterr().err
        return
    code, text = run(*argv)
    assert code == 0, text
    results, (fig,) = drawn["results"], drawn["figures"]
    assert len(results) == len(values.split(","))
    if field != "profile":
        assert {r.profile for r in results} == {profile}
    assert_bars_are_components(fig.axes[0], results)
    for r in results:
        assert (r.peak_phase is not None) == (r.profile == "measured")
    assert all(f"{r.profile} profile: total = " in fig.axes[0].get_xlabel() for r in results)
    if field in LONG_LABELS:     # rendering takes a while; the fields with the longest labels
        assert_no_text_overlaps(fig)


LONG_LABELS = ("hardware", "model", "profile", "data_parallel", "activation_checkpointing")


def test_one_parallel_layout_gets_a_bar_per_rank_class(mpl, tmp_path, drawn):
    code, text = run("plot", "bars", "--profile", "measured", "-m", "llama3-70b", "-b", "64", "-s", "4096",
                     "--tp", "8", "--pp", "4", "--dp", "2", "--zero", "1", "--grad-accum", "8", "--checkpointing",
                     "full", "--precision", "bf16", "--sequence-parallel", "-o", str(tmp_path / "r.png"))
    assert code == 0, text
    (r,), (fig,) = drawn["results"], drawn["figures"]
    assert [k.name for k in r.ranks] == ["first stage", "middle stages (heaviest: stage 1)", "last stage"]
    ax = fig.axes[0]
    assert_bars_are_components(ax, r.ranks)
    ticks = [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()]
    assert ticks[0] == "first stage (16 devices)"
    assert ticks[[k.name for k in r.ranks].index(r.heaviest_rank)].endswith("devices; heaviest of all)")
    assert "one bar per rank class of" in ax.get_title()
    assert_no_text_overlaps(fig)


def test_parallel_results_side_by_side_show_their_heaviest_rank(mpl, solver):
    kw = dict(profile="measured", precision="bf16", gradient_accumulation_steps=8, zero_stage=1,
              activation_checkpointing="full")
    results = [solver.solve("llama3-70b", "h100", 64, 4096, tp_size=8, pp_size=pp, dp_size=8 // pp, **kw)
               for pp in (4, 2)]
    fig = plots.plot_bars(results)
    assert_bars_are_components(fig.axes[0], results)
    for tick, r in zip(fig.axes[0].get_xticklabels(), results):
        assert f"({r.heaviest_rank}, the heaviest)" in tick.get_text().replace("\n", " ")
    assert_no_text_overlaps(fig)


def test_timeline_of_a_parallel_layout_and_of_one_rank_class(mpl, solver):
    r = solver.solve("llama3-70b", "h100", 64, 4096, tp_size=8, pp_size=4, dp_size=2, zero_stage=1,
                     gradient_accumulation_steps=8, precision="bf16", activation_checkpointing="full",
                     profile="measured")
    fig = plots.plot_timeline(r)
    assert f"({r.heaviest_rank}, the heaviest)" in fig.axes[0].get_title().replace("\n", " ")
    first = r.ranks[0]
    fig = plots.plot_timeline(r, rank="first stage")
    ax = fig.axes[0]
    assert "(first stage)" in ax.get_title()
    drawn_totals = [sum(p.get_height() for c in ax.containers[:-1] for p in c.patches[i:i + 1])
                    for i in range(len(PHASES))]
    assert drawn_totals == pytest.approx([first.phase_totals[p] / 1e9 for p in PHASES])
    assert f"the peak over phases (the {first.peak_phase.replace('_', ' ')} phase)" in \
        ax.get_xlabel().replace("\n", " ")
    with pytest.raises(InvalidInputError) as err:
        plots.plot_timeline(r, rank="stage 7")
    assert err.value.parameter == "rank"
    assert_no_text_overlaps(fig)


def test_sweep_under_the_measured_profile(mpl, solver):
    data = plots.sweep(Scenario(model="llama3-8b", hardware="h200", batch_size=1, seq_len=1024,
                                profile="measured"), "batch", [1, 2, 4, 8], solver=solver)
    assert all(r.profile == "measured" and r.runtime_overheads > 0 for r in data.results)
    fig = plots.plot_sweep(data)
    caption = fig.axes[0].get_xlabel().replace("\n", " ")
    phases = {r.peak_phase.replace("_", " ") for r in data.results}
    assert caption.startswith("micro-batch per accelerator measured profile: total = the peak over phases (")
    assert all(f"the {p}" in caption for p in phases)
    assert "runtime overheads" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert_no_text_overlaps(fig)


def test_long_labels_do_not_overlap(mpl, solver):
    names = ["nvidia/h100-sxm5-80gb", "nvidia/a100-sxm4-80gb", "nvidia/h200-sxm-141gb", "nvidia/b200"]
    results = [solver.solve("llama3-8b", h, 8, 1024, profile="measured") for h in names]
    fig = plots.plot_bars(results, labels=[f"hardware={h}" for h in names])
    ticks = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert ticks[0].startswith("hardware=\nnvidia/h100-sxm5-80gb\ncap. ")
    assert_no_text_overlaps(fig)
    # many long labels: turned and still apart; many bars: the totals stand upright
    fig = plots.plot_bars(results * 3, labels=[f"hardware={h}" for h in names * 3])
    assert fig.axes[0].get_xticklabels()[0].get_rotation() > 0
    assert_no_text_overlaps(fig)
    many = [solver.solve("llama3-8b", "h100", b, 1024) for b in range(1, 21)]
    fig = plots.plot_bars(many, labels=[f"batch_size={b}" for b in range(1, 21)])
    assert fig.get_figwidth() <= 16
    assert_no_text_overlaps(fig)


def test_crowded_sweep_ticks_do_not_overlap(mpl, solver):
    data = plots.sweep(Scenario(model="llama3-8b", hardware="h100", batch_size=1), "seq",
                       [1000, 1024, 1100, 2048, 4000, 4096], solver=solver)
    fig = plots.plot_sweep(data)
    shown = [t.get_text() for t in fig.axes[0].get_xticklabels() if t.get_text()]
    assert shown[0] == "1,000" and "2,048" in shown
    assert_no_text_overlaps(fig)


# --- the output path (issue 13, item 6) ----------------------------------------------------

@pytest.fixture()
def no_solving(monkeypatch):
    from mlsysim_core.solver import TrainingMemoryModel

    def solve(*args, **kwargs):
        raise AssertionError("solved before checking --output")

    monkeypatch.setattr(TrainingMemoryModel, "solve", solve)


@pytest.mark.parametrize("where,detail", [
    ("missing/x.png", "folder '{tmp}/missing' does not exist"),
    ("missing/deeper/x.svg", "folder '{tmp}/missing/deeper' does not exist"),
    ("folder.png", "it is a folder"),
    (".", "it is a folder"),
    ("afile.png/x.png", "is not a folder"),
])
def test_output_path_errors_before_solving(mpl, tmp_path, capsys, no_solving, where, detail):
    (tmp_path / "folder.png").mkdir()
    (tmp_path / "afile.png").write_text("")
    target = str(tmp_path / where) if where != "." else str(tmp_path)
    for kind in ("bars", "timeline", "sweep"):
        code, _ = run("plot", kind, "--profile", "measured", "-o", target)
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"--output={target!r} is not allowed" in err and detail.format(tmp=tmp_path) in err
        assert "Traceback" not in err
    assert not (tmp_path / "missing").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile.png", "folder.png"]


@pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")
def test_unwritable_output_is_an_input_error(mpl, capsys):
    code, _ = run("plot", "bars", "-m", "llama3-8b", "-o", "/proc/mlsysim-core-test.png")
    err = capsys.readouterr().err
    assert code == 2 and "--output='/proc/mlsysim-core-test.png' is not allowed" in err
    assert "Traceback" not in err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_folder_is_refused_before_solving(mpl, tmp_path, capsys, no_solving):
    folder = tmp_path / "ro"
    folder.mkdir(mode=0o500)
    try:
        code, _ = run("plot", "bars", "-o", str(folder / "x.png"))
    finally:
        folder.chmod(0o700)
    err = capsys.readouterr().err
    assert code == 2 and "is not writable" in err


def test_check_output_and_save_name_the_parameter(mpl, tmp_path, solver):
    assert plots.check_output(tmp_path / "x.svg") == tmp_path / "x.svg"
    with pytest.raises(InvalidInputError) as err:
        plots.check_output(tmp_path / "nope" / "x.png", "--output")
    assert err.value.parameter == "--output"
    fig = plots.plot_bars([solver.solve("llama3-8b", "h100", 1)])
    with pytest.raises(InvalidInputError) as err:
        plots.save(fig, tmp_path / "nope" / "x.png")
    assert err.value.parameter == "output" and not (tmp_path / "nope").exists()
