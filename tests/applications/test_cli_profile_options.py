"""A profile's options type is where its solve keywords, CLI flags and scenario fields come
from: a third-party profile (here a toy one, registered on a manager built in the test) gets
all three for free, as the measured profile's regime, lora, ... do."""

import json

import attrs
import pytest

from mlsysim_core import ProfileSpec, TrainingMemoryModel, cli, hookimpl, memo
from mlsysim_core.errors import InvalidInputError
from mlsysim_core.manager import PluginManager
from mlsysim_core.scenario import Scenario, option_fields

from clitools import error_of, run

SEEN = []     # what the toy profile's prepare received: (warp_factor, colour)


@attrs.frozen(kw_only=True)
class ToyOptions:
    warp_factor: int = attrs.field(default=None, metadata={"help": "how far to warp (default none)",
                                                           "metavar": "W", "type": int})
    colour: str = "red"      # no metadata at all: --colour COLOUR, a string


def _prepare(plan, extensions):
    SEEN.append((plan.profile_options.warp_factor, plan.profile_options.colour))
    return plan


class Toy:
    @hookimpl
    def mlsysim_profiles(self):
        return [ProfileSpec(name="toy", component_plugins=("model_states",), options_type=ToyOptions,
                            prepare=_prepare)]


@pytest.fixture
def toy_pm(builtin_pm, monkeypatch):
    pm = PluginManager()
    for name in sorted(builtin_pm.registry.plugins):
        pm.register(builtin_pm.get_plugin(name), name=name, info=builtin_pm.info(name))
    pm.register(Toy(), name="toy_plugin")
    monkeypatch.setattr(cli, "_manager", lambda args: pm)      # the CLI's plugins: these
    SEEN.clear()
    memo.set_enabled(False)      # every solve reaches prepare
    yield pm
    memo.set_enabled(True)


def test_solve_takes_the_option_as_a_keyword(toy_pm):
    TrainingMemoryModel(plugin_manager=toy_pm).solve("llama3-8b", "h100", 8, 1024, profile="toy", warp_factor=9)
    assert SEEN == [(9, "red")]


def test_the_cli_has_a_flag_for_each_option(toy_pm, capsys):
    with pytest.raises(SystemExit):
        cli.main(["estimate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--warp-factor W toy profile: how far to warp (default none)" in text
    assert "--colour COLOUR toy profile: its option colour" in text
    assert "--regime REGIME measured profile:" in text      # the built-in profile's, as before
    code, out = run("estimate", "--profile", "toy", "--warp-factor", "7", "--colour", "blue", "--json")
    assert code == 0 and SEEN[-1] == (7, "blue")
    data = json.loads(out)
    assert data["profile"] == "toy" and data["run"]["warp_factor"] == 7 and data["run"]["colour"] == "blue"
    for question in ("batch", "seq", "devices"):     # the inverse solves take them too
        assert run("fit", question, "--profile", "toy", "--warp-factor", "4", "--json")[0] == 0
        assert SEEN[-1] == (4, "red")
    with pytest.raises(SystemExit) as exit_:
        run("estimate", "--profile", "toy", "--warp-factor", "x")
    assert exit_.value.code == 2 and "argument --warp-factor: invalid int value: 'x'" in capsys.readouterr().err
    assert error_of(capsys, "estimate", "--warp-factor", "2")[1] == (    # the measured profile has no such option
        "mlsysim-core: error: warp_factor=2 is not allowed: under profile 'measured', which has no such option "
        "(use profile='toy')")


def test_a_scenario_field_reaches_the_profile(toy_pm, tmp_path):
    path = tmp_path / "toy.json"
    path.write_text(json.dumps({"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "profile": "toy",
                                "warp_factor": 5}), encoding="utf-8")
    assert run("estimate", "--scenario", str(path), "--json")[0] == 0 and SEEN[-1] == (5, "red")
    assert run("estimate", "--scenario", str(path), "--warp-factor", "6", "--json")[0] == 0    # a flag wins
    assert SEEN[-1] == (6, "red")
    # From Python: the option lives in profile_options, reads as an attribute, round-trips top-level.
    options = option_fields(toy_pm.registry)
    scenario = Scenario.load(path, options=options)
    assert scenario.profile_options == {"warp_factor": 5} and scenario.warp_factor == 5
    scenario.solve(TrainingMemoryModel(plugin_manager=toy_pm))
    assert SEEN[-1] == (5, "red")
    for name in ("again.json", "again.toml"):
        scenario.dump(tmp_path / name)
        assert Scenario.load(tmp_path / name, options=options) == scenario
    assert json.loads((tmp_path / "again.json").read_text())["warp_factor"] == 5
    saved = tmp_path / "saved.toml"
    assert run("estimate", "--scenario", str(path), "--save-scenario", str(saved), "--no-chart")[0] == 0
    assert "warp_factor = 5" in saved.read_text().splitlines()


def test_an_unknown_field_lists_the_profiles_options(toy_pm, tmp_path):
    data = {"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "warp_factr": 5}
    with pytest.raises(InvalidInputError) as info:
        Scenario.from_dict(data, options=option_fields(toy_pm.registry))
    assert info.value.value == "warp_factr" and "warp_factor" in info.value.allowed
    assert "regime" in info.value.allowed and "profile_options" not in info.value.allowed


def test_the_reference_stand_in_leaves_the_option_out_by_its_flag(toy_pm):
    scenario = Scenario(model="llama3-8b", hardware="h100", batch_size=8, profile="toy",
                        profile_options={"warp_factor": 3, "regime": "bf16"})
    plain, said = cli.reference_stand_in(scenario, toy_pm.registry)
    assert plain.profile == "reference" and plain.profile_options == {}
    assert said == "measured-profile options left out: --regime, --warp-factor"


def test_measured_options_are_scenario_attributes_and_keywords():
    scenario = Scenario.from_dict({"model": "llama3-8b", "hardware": "h100", "batch_size": 8, "regime": "bf16",
                                   "lora": {"rank": 8.0}, "virtual_stages": 2.0, "dropout": None})
    assert scenario.profile_options == {"regime": "bf16", "lora": {"rank": 8}, "virtual_stages": 2}
    assert (scenario.regime, scenario.dropout, scenario.offload) == ("bf16", None, None)
    kwargs = scenario.solve_kwargs()
    assert kwargs["regime"] == "bf16" and kwargs["lora"] == {"rank": 8} and "dropout" not in kwargs
    with pytest.raises(AttributeError):
        scenario.no_such_option
