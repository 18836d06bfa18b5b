"""Every scenario file under examples/scenarios/ solves through the CLI (one per training
regime, plus LoRA and QLoRA; referenced from docs/profiles.md)."""

import io
import json
from pathlib import Path

import pytest

from mlsysim_core.cli import main
from mlsysim_core.scenario import Scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "examples" / "scenarios").glob("*.json"))


def test_there_is_one_per_regime_and_for_lora():
    names = {p.stem for p in SCENARIOS}
    assert {"fp32", "amp-bf16", "bf16", "mixed-bf16", "lora", "qlora"} <= names
    for path in SCENARIOS:
        scenario = Scenario.load(path)
        assert scenario.description and scenario.profile == "measured"
        if path.stem in ("fp32", "amp-bf16", "bf16", "mixed-bf16"):
            assert scenario.regime == path.stem


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_example_scenario_solves(path):
    out = io.StringIO()
    assert main(["estimate", "--scenario", str(path), "--json"], out=out) == 0
    result = json.loads(out.getvalue())
    assert result["profile"] == "measured"
    assert result["total_memory"] > 0
    assert result["feasible"] is True
