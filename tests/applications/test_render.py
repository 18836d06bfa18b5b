"""Text and HTML views of a result: the explanation, the terminal bar chart, the notebook table."""

import io
import re
from html.parser import HTMLParser

import attrs
import pytest

from mlsysim_core import COMPONENTS, HOST, MemoryTerm
from mlsysim_core.cli import main
from mlsysim_core.render import CAPACITY_MARK, OVERFLOW_MARK, bar_chart, explain, why

GIB = 2**30


def run(*argv):
    out = io.StringIO()
    code = main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture(scope="module")
def default(solver):
    return solver.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048)     # the reference's numbers


# --- explain ----------------------------------------------------------------------------------

def test_explain_is_deterministic_and_names_every_term(solver, default):
    text = explain(default)
    assert text == default.explain() == explain(solver.solve("mlsysim:llama3-8b", "mlsysim:h100", 8, 2048))
    for term in default.terms:
        assert term.label in text and term.formula in text
        assert f"[plugin {term.source} (" in text


def test_explain_shows_gb_gib_and_share_of_every_component(default):
    text = default.explain()
    total = default.total_memory
    for component in COMPONENTS:
        nbytes = getattr(default, component)
        head = (f"{component.replace('_', ' ')}: {nbytes * 1e-9:,.3f} GB ({nbytes / GIB:,.3f} GiB), "
                f"{100 * nbytes / total:.1f} %")
        assert head in text, head
    # Llama-3.1-8B, batch 8, seq 2048 on an H100: 202.297 GB = 188.404 GiB, 235.5 % of 80 GiB
    assert text.splitlines()[0].startswith("202.297 GB (188.404 GiB) per accelerator")
    assert "optimizer state: 96.360 GB (89.742 GiB), 47.6 %" in text
    assert "largest part: optimizer state, 47.6 % of the total" in text
    lines = text.splitlines()
    verdict = next(i for i, line in enumerate(lines) if line.startswith("capacity "))
    assert lines[verdict] == ("capacity 85.899 GB (80.000 GiB): 235.5 % used, does NOT fit, "
                              "116.398 GB (108.404 GiB) short")
    # then every note of the result (here: the catalog data is the reference's), never silent
    notes = " ".join(line.removeprefix("note: ").strip() for line in lines[verdict + 1:])
    assert notes == " ".join(default.notes) and "mlsysim 0.3.0's reference catalog data" in notes


def _sentence(text: str, component: str) -> str:
    """The plain-language lines under a component's heading, joined."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if re.match(rf"[├└]─ {component.replace('_', ' ')}:", line))
    out = []
    for line in lines[start + 1:]:
        m = re.match(r"^[│ ]  │  (.*)$", line)
        if not m:
            break
        out.append(m.group(1))
    return " ".join(out)


def test_explain_says_in_plain_language_what_each_component_is(default):
    text = default.explain()
    assert _sentence(text, "weights").startswith("The model's parameters, one fp16 copy (2 B per value)")
    assert "written by the backward pass, read by the optimizer step" in _sentence(text, "gradients")
    assert _sentence(text, "optimizer_state").startswith(
        "Adam keeps an fp32 master copy of every trainable parameter and two fp32 moments")
    acts = _sentence(text, "activations")
    assert "for the 32 layers on this accelerator and one micro-batch of 8 sequences" in acts
    assert "34·s·b·h bytes per layer" in acts and "recomputed" in acts
    assert "gradients for the data-parallel all-reduce" in _sentence(text, "communication_buffers")
    assert "alive during backward, backward end, optimizer step" in text           # gradients' phases
    assert "alive during the whole iteration" in text                # weights'


@pytest.mark.parametrize("kwargs,component,fragment", [
    ({"optimizer": "sgd"}, "optimizer_state", "SGD without momentum keeps only an fp32 master copy"),
    ({"optimizer": "adamw"}, "optimizer_state", "AdamW (Adam with decoupled weight decay)"),
    ({"optimizer": "none"}, "optimizer_state", "No optimizer is selected"),
    ({"activation_checkpointing": "full"}, "activations", "nly the input of each layer, for the 32 layers"),
    ({"activation_checkpointing": "none"}, "activations", "attention scores included"),
    ({"zero_stage": 1, "dp_size": 8}, "optimizer_state", "ZeRO-1 shards it over the 8 data-parallel ranks"),
    ({"zero_stage": 3, "dp_size": 8}, "weights", "ZeRO-3 shards them over the 8 data-parallel ranks"),
    ({"tp_size": 4}, "activations", "Sequence parallelism divides them over the 4 tensor-parallel ranks"),
    ({"tp_size": 4}, "weights", "tensor parallelism splits every matrix over 4 accelerators"),
    ({"pp_size": 4}, "communication_buffers", "the pipeline's send and receive buffers"),
    ({"precision": "fp32"}, "weights", "one fp32 copy (4 B per value)"),
])
def test_the_sentences_follow_the_configuration(solver, kwargs, component, fragment):
    result = solver.solve("llama3-8b", "h100", 64, 1024, **kwargs)
    assert fragment in why(result, component)
    assert fragment in _sentence(result.explain(), component)


def test_unknown_specs_get_a_generic_sentence(default):
    other = attrs.evolve(default, optimizer="myorg.lion", activation_checkpointing="myorg.offload")
    assert "The state the optimizer 'myorg.lion' keeps between steps" in why(other, "optimizer_state")
    assert "the checkpointing strategy 'myorg.offload' decides" in why(other, "activations")


def test_host_terms_are_shown_but_not_counted(default):
    host = MemoryTerm(component="activations", label="activations offloaded", nbytes=4 * GIB,
                      formula="4 GiB", source="offload", phases=("forward", "backward"), tier=HOST)
    result = attrs.evolve(default, terms=(*default.terms, host), host_memory=4 * GIB,
                          plugin_sources={**default.plugin_sources, "offload": "myorg 1.0"})
    text = result.explain()
    assert "plus 4.295 GB (4.000 GiB) on host memory" in text
    assert ("activations offloaded: 4.295 GB (4.000 GiB, not in the total) "
            "[plugin offload (myorg 1.0), on host memory]") in text
    assert "activations: 73.014 GB (68.000 GiB), 36.1 %" in text     # unchanged


def test_cli_explain_keeps_the_table_and_adds_the_tree():
    code, text = run("estimate", "--explain", "-s", "1024")
    assert code == 0
    assert text.index("component ") < text.index("per accelerator: meta-llama/Llama-3.1-8B")
    assert "The state the optimizer 'adam' keeps between steps, in the amp-fp16 regime's dtypes" in text


# --- the terminal bar chart ------------------------------------------------------------------

def _cells(bar: str) -> float:
    eighths = {" ": 0, "▏": 1, "▎": 2, "▍": 3, "▌": 4, "▋": 5, "▊": 6, "▉": 7, "█": 8}
    return sum(eighths.get(ch, 8 if ch in (CAPACITY_MARK, OVERFLOW_MARK) else 0) for ch in bar) / 8


def _rows(chart: str) -> dict[str, str]:
    rows = {}
    for line in chart.splitlines():
        for label in [c.replace("_", " ") for c in COMPONENTS] + ["total"]:
            if line.startswith(label + " ") and re.search(r"%$", line):
                rows[label] = line
    return rows


@pytest.mark.parametrize("model,hardware,batch", [
    ("llama3-8b", "h100", 8),        # 235 %: off the scale
    ("llama3-8b", "h200", 1),        # fits
    ("gpt2", "h100", 1),             # a sliver of the capacity
    ("gpt3", "t4", 64),              # thousands of percent
])
def test_bar_chart_fits_80_columns_and_marks_the_capacity(solver, model, hardware, batch):
    result = solver.solve(model, hardware, batch, 2048)
    chart = bar_chart(result)
    assert all(len(line) <= 80 for line in chart.splitlines())
    rows = _rows(chart)
    # the reference profile models no runtime overheads: that row is left out
    shown = [c for c in COMPONENTS if c != "runtime_overheads"]
    assert set(rows) == {c.replace("_", " ") for c in shown} | {"total"}
    label_w = len("communication buffers") + 1
    columns = {line.index(CAPACITY_MARK) for line in rows.values()}
    assert len(columns) == 1                                       # one capacity column
    cells = len(next(iter(rows.values()))) - label_w - len(rows["total"].split()[-2]) - 3
    capacity = result.available_memory
    axis = min(max(result.total_memory, capacity), 2 * capacity)
    for component in shown:
        line = rows[component.replace("_", " ")]
        value = getattr(result, component)
        assert line.endswith(f"{100 * value / capacity:.1f} %")
        bar = line[label_w:label_w + cells]
        if value > axis:
            assert bar.rstrip().endswith(OVERFLOW_MARK)
        else:   # the capacity mark replaces one cell of a bar that crosses it
            assert abs(_cells(bar.replace(CAPACITY_MARK, " ")) - value / axis * cells) <= 1.01
    assert (OVERFLOW_MARK in rows["total"]) == (result.total_memory > axis)


def test_estimate_shows_the_chart_unless_asked_not_to():
    code, text = run("estimate", "--profile", "reference")
    assert code == 0
    assert "bars vs capacity │ = 85.899 GB (80.000 GiB)" in text
    assert "235.5 %" in _rows(text)["total"]
    code, text = run("estimate", "--no-chart", "--profile", "reference")
    assert code == 0 and "bars vs capacity" not in text and "fits         NO, 116.402 GB" in text


# --- HTML for notebooks ------------------------------------------------------------------------

class _Table(HTMLParser):
    def __init__(self):
        super().__init__()
        self.rows, self.caption, self._in, self.tags = [], "", None, []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th", "caption"):
            self._in = tag
            if tag != "caption":
                self.rows[-1].append("")

    def handle_endtag(self, tag):
        if tag in ("td", "th", "caption"):
            self._in = None

    def handle_data(self, data):
        if self._in == "caption":
            self.caption += data
        elif self._in:
            self.rows[-1][-1] += data


def _parse(text):
    table = _Table()
    table.feed(text)
    table.close()
    return table


def test_repr_html_is_a_table_with_the_numbers(default):
    text = default._repr_html_()
    assert text == default.to_html()
    table = _parse(text)
    assert table.tags[0] == "table" and "script" not in table.tags
    assert table.caption.startswith("mlsysim:Llama-3.1-8B on mlsysim:NVIDIA H100 (profile reference)")
    by_name = {row[0]: row for row in table.rows}
    assert by_name["component"] == ["component", "GB (1e9 B)", "GiB (2^30 B)", "share", "from plugin(s)"]
    assert by_name["optimizer state"] == ["optimizer state", "96.360", "89.742", "47.6 %", "adam"]
    assert by_name["total"][:3] == ["total", "202.297", "188.404"]
    assert by_name["capacity"] == ["capacity", "85.899", "80.000", "235.5 % used", "mlsysim:NVIDIA H100"]
    assert ["fits: NO, 116.398 GB (108.404 GiB) short"] in table.rows


def test_repr_html_escapes_text(default):
    evil = attrs.evolve(default, model="<script>alert('x')</script>", hardware="A&B <GPU>",
                        notes=("<b>note</b>",))
    text = evil.to_html()
    assert "<script>" not in text and "<b>note" not in text
    table = _parse(text)
    assert "script" not in table.tags and "b" not in table.tags
    assert table.caption.startswith("<script>alert('x')</script> on A&B <GPU>")
    assert ["note: <b>note</b>"] in table.rows


def test_estimate_table_shows_host_memory(builtin_pm):
    """Offloaded bytes get their own row, outside the accelerator total."""
    from mlsysim_core import (ACTIVATIONS, HOST, CheckpointingSpec, HardwareNode, MemoryTerm,
                              TrainingMemoryModel, TransformerWorkload, hookimpl)
    from mlsysim_core.manager import PluginManager
    from mlsysim_core.render import estimate_table

    class Offload:
        @hookimpl
        def mlsysim_checkpointing_strategies(self):
            def terms(plan, placement, options):
                return [MemoryTerm(component=ACTIVATIONS, label="on device", nbytes=10**9),
                        MemoryTerm(component=ACTIVATIONS, label="offloaded", nbytes=3 * 10**9, tier=HOST)]
            return [CheckpointingSpec(name="test.offload", activation_terms=terms)]
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Offload(), name="test_offload")
    model = TransformerWorkload(name="m", parameters=10**9, layers=4, hidden_dim=64, heads=4)
    r = TrainingMemoryModel(plugin_manager=pm).solve(model, HardwareNode(name="gpu", memory_capacity=80 * 2**30), 8,
                                                     activation_checkpointing="test.offload")
    line = next(l for l in estimate_table(r, chart=False).splitlines() if l.startswith("host memory"))
    assert "3.000" in line and "2.794" in line and "not in the total; from test_offload" in line
