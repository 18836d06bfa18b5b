"""QA findings (third round, library side): errors carry every field the CLI reads, fit devices
counts every rank, search says what changes its numbers, strategies and LoRA targets are checked."""

from __future__ import annotations

import inspect
import io
import json

import pytest

from mlsysim_core import TrainingMemoryModel, cli, errors, inverse
from mlsysim_core import catalog as catalog_module
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError


def run_cli(*argv) -> str:
    out = io.StringIO()
    assert cli.main(list(argv), out=out) == 0
    return out.getvalue()


# --- 1. every InvalidInputError subclass has parameter, value, allowed and detail -----------------

def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_catalog_error_has_a_detail():
    err = catalog_module.CatalogError("bad file", parameter="catalog", value="x.json", allowed="a list")
    assert err.detail == ""
    assert catalog_module.CatalogError("m", detail="why").detail == "why"


def test_every_invalid_input_error_has_the_four_fields():
    seen = set(_subclasses(InvalidInputError))
    assert catalog_module.CatalogError in seen
    for cls in seen | {InvalidInputError}:
        if cls is catalog_module.CatalogError:
            err = cls("message")
        else:
            err = cls("p", 1, "allowed")
        for field in ("parameter", "value", "allowed", "detail"):
            assert hasattr(err, field), (cls, field)
        assert isinstance(err.detail, str)


# --- 2. fit devices counts tp x cp x pp x dp ---------------------------------------------------

def test_fewest_devices_counts_context_parallel_ranks():
    answer = inverse.fewest_devices("llama3-8b", "h100", 8, solver=TrainingMemoryModel("measured"),
                                    cp_size=2, zero_stage=3)
    assert answer.details["cp"] == 2
    d = answer.details
    assert answer.value == d["tp"] * d["cp"] * d["pp"] * d["dp"]
    assert "cp 2" in answer.describe()


def test_fewest_devices_without_cp_is_unchanged():
    answer = inverse.fewest_devices("llama3-8b", "h100", 8, solver=TrainingMemoryModel("measured"), zero_stage=3)
    assert answer.details["cp"] == 1
    assert answer.value == answer.details["dp"]


def test_fewest_devices_checks_cp_size():
    with pytest.raises(InvalidInputError) as info:
        inverse.fewest_devices("llama3-8b", "h100", 8, cp_size=0)
    assert info.value.parameter == "cp_size"


def test_cli_fit_devices_counts_cp():
    text = run_cli("fit", "devices", "-b", "8", "--cp", "2", "--zero", "3")
    line = text.strip().splitlines()[-1]
    assert line.startswith("fewest devices: 4, dp 2"), line
    assert "cp 2" in line
    data = json.loads(run_cli("fit", "devices", "-b", "8", "--cp", "2", "--zero", "3", "--json"))
    assert data["value"] == 4 and data["details"]["cp"] == 2
