"""The conformance kit on the two kinds of plugin it could not check (issue 24, a plugin author's
first hour, helper AUTHORQA): a measured technique (``mlsysim_measured_techniques``, written from
docs/writing-plugins.md's "A technique") and a launch-format reader (``mlsysim_launch_formats``,
docs/launch.md's "Writing a launch-format reader"). Both failed ``assert_plugin_conforms`` with "no
layout to solve it in; give layouts={...: [...]}", whatever they did: the kit now solves a technique
with each value it offers, and checks a reader's ``recognizes`` on documents of other formats and
reads the files its layouts name."""

from __future__ import annotations

import types

import attrs
import pytest

from mlsysim_core import hookimpl
from mlsysim_core.manager import PluginManager
from mlsysim_core.terms import HOST
from mlsysim_core.testing import ConformanceError, assert_plugin_conforms, check_plugin
from mlsysim_plugins.launch import LaunchField, LaunchFormatSpec, LaunchReading
from mlsysim_plugins.measured.techniques import Candidate, Technique

LAUNCH = "mlsysim_launch_formats"
TECHNIQUES = "mlsysim_measured_techniques"


def _manager(module, name):
    pm = PluginManager.from_environment(autoload=False, blocked=())
    pm.register(module, name=name)
    return pm


def _plugin(name, hook, items):
    module = types.ModuleType(name)
    impl = hookimpl(lambda: list(items))
    impl.__name__ = hook
    setattr(module, hook, impl)
    return module


# --- a technique: docs/writing-plugins.md's, keeping the optimizer state on the host -------------------

def _host_state(apply=None):
    def relocate(plan, weights, gradients, optimizer_state):
        if plan.profile_options.myorg_state_host != "yes":
            return weights, gradients, optimizer_state
        return weights, gradients, [attrs.evolve(t, tier=HOST) for t in optimizer_state]

    return Technique(
        name="myorg.host_state", order=45, relocate=relocate, apply=apply or (lambda plan, registry: plan),
        options={"myorg_state_host": attrs.field(default=None, metadata={
            "help": "keep the optimizer state in host memory", "metavar": "yes|no", "choices": ("yes", "no")})},
        candidates=[Candidate("yes", "optimizer state on the host", "a caveat shown, not priced")],
        active=lambda plan: plan.profile_options.myorg_state_host == "yes")


def test_a_technique_is_solved_with_each_value_it_offers():
    pm = _manager(_plugin("myorg_host_state", TECHNIQUES, [_host_state()]), "myorg_host_state")
    report = assert_plugin_conforms("myorg_host_state", plugin_manager=pm, allow_direct_registration=True)
    assert report.provides == {TECHNIQUES: ("myorg.host_state",)}
    assert report.solves == 1           # myorg_state_host='yes' under the measured profile


def test_a_technique_that_breaks_when_it_is_on_fails_the_kit():
    def apply(plan, registry):
        if plan.profile_options.myorg_state_host == "yes":
            raise RuntimeError("boom")
        return plan

    pm = _manager(_plugin("myorg_host_state", TECHNIQUES, [_host_state(apply)]), "myorg_host_state")
    report = check_plugin("myorg_host_state", plugin_manager=pm, allow_direct_registration=True)
    assert len(report.failures) == 1
    assert report.failures[0].startswith(
        f'{TECHNIQUES} \'myorg.host_state\' with {{"model": "llama3-8b", "myorg_state_host": "yes", '
        '"profile": "measured"}: solve failed: PluginContractError: ')
    assert "boom" in report.failures[0]


def test_the_builtin_techniques_conform(builtin_pm):
    report = assert_plugin_conforms("measured_techniques", plugin_manager=builtin_pm)
    assert "lora" in report.provides[TECHNIQUES] and report.solves >= 9


# --- a launch-format reader: docs/launch.md's ------------------------------------------------------------

def _read(path, document, context):
    cfg = document["myorg_trainer"]
    fields = [LaunchField(key="myorg_trainer.model", value=cfg["model"], field="model", becomes=cfg["model"]),
              LaunchField(key="myorg_trainer.micro_batch", value=cfg["micro_batch"], field="micro_batch_size",
                          becomes=cfg["micro_batch"])]
    return LaunchReading(format="myorg.trainer", path=str(path), fields=fields, defaults=[], ignored=[],
                         framework_version="myorg-trainer 1.2", world={"single_device": ("myorg_trainer", True)})


def _reader(recognizes=lambda path, document: isinstance(document, dict) and "myorg_trainer" in document):
    spec = LaunchFormatSpec(name="myorg.trainer", framework="myorg-trainer", suffixes=(".yaml",),
                            recognizes=recognizes, read=_read)
    return _manager(_plugin("myorg_trainer", LAUNCH, [spec]), "myorg_trainer")


@pytest.fixture
def run_yaml(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("myorg_trainer:\n  model: llama3-8b\n  micro_batch: 2\n")
    return path


def test_a_reader_reads_its_files_into_scenarios_that_solve(run_yaml):
    report = assert_plugin_conforms("myorg_trainer", plugin_manager=_reader(), allow_direct_registration=True,
                                    layouts={LAUNCH: [{"launch": run_yaml, "seq_len": 1024}]})
    assert report.provides == {LAUNCH: ("myorg.trainer",)} and report.solves == 1


def test_a_reader_without_a_file_is_asked_for_one():
    report = check_plugin("myorg_trainer", plugin_manager=_reader(), allow_direct_registration=True)
    assert report.failures == (
        f"{LAUNCH} 'myorg.trainer': no file to read; give layouts={{'{LAUNCH}': [{{'launch': 'PATH', "
        "'seq_len': 2048}]} (a launch file of this format, and from_launch's keywords: gpus, seq_len, ...)",)


def test_a_file_the_reader_refuses_is_a_failure_naming_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("myorg_trainer:\n  model: llama3-8b\n  micro_batch: two\n")
    with pytest.raises(ConformanceError, match=r"reading '.*run\.yaml' failed: InvalidInputError: "
                                               r"myorg_trainer\.micro_batch='two' is not allowed: a whole number >= 1"):
        assert_plugin_conforms("myorg_trainer", plugin_manager=_reader(), allow_direct_registration=True,
                               layouts={LAUNCH: [{"launch": path, "seq_len": 1024}]})


def test_a_recognizes_that_raises_on_another_formats_document_fails(run_yaml):
    """``"myorg_trainer" in document`` raises TypeError for a scalar document (a TOML or YAML scalar)."""
    report = check_plugin("myorg_trainer", plugin_manager=_reader(lambda path, document: "myorg_trainer" in document),
                          allow_direct_registration=True, layouts={LAUNCH: [{"launch": run_yaml, "seq_len": 1024}]})
    assert report.failures == (
        f"{LAUNCH} 'myorg.trainer': recognizes() raised TypeError on a document of another format (0): "
        "argument of type 'int' is not iterable; it must return False",
        f"{LAUNCH} 'myorg.trainer': recognizes() raised TypeError on a document of another format (None): "
        "argument of type 'NoneType' is not iterable; it must return False")


def test_a_recognizes_that_returns_no_bool_fails(run_yaml):
    report = check_plugin("myorg_trainer", plugin_manager=_reader(
        lambda path, document: document.get("myorg_trainer") if isinstance(document, dict) else False),
        allow_direct_registration=True, layouts={LAUNCH: [{"launch": run_yaml, "seq_len": 1024}]})
    assert report.failures == tuple(
        f"{LAUNCH} 'myorg.trainer': recognizes() returned None for {doc!r}; expected a bool"
        for doc in ({}, {"model": "llama3-8b"}, {"optimizer": {"lr": 1e-4}}))


def test_a_builtin_reader_conforms_with_its_files(builtin_pm):
    report = assert_plugin_conforms("launch_torchtune", plugin_manager=builtin_pm, layouts={LAUNCH: [
        {"launch": "tests/data/launch/torchtune/llama3_1/8B_full.yaml", "gpus": 8, "seq_len": 2048}]})
    assert report.solves == 1
