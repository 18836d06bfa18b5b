"""A launch file naming a model the catalog does not know: refused naming the file, the key and the
value (not "none of the files names a model"); with -m the file's name is replaced and said."""

from pathlib import Path

import pytest

from mlsysim_core.errors import InvalidInputError
from mlsysim_core.scenario import from_launch

# (SmolLM2-1.7B, the first example, is in the catalog since issue 26; StarCoder2 has no architecture family)
STARCODER2 = Path(__file__).resolve().parents[1] / "data" / "launch" / "hf_trainer" / "alignment-handbook" \
    / "starchat2-15b" / "sft" / "config_v0.1.yaml"


def test_an_unknown_model_is_refused_naming_the_key_and_value():
    with pytest.raises(InvalidInputError) as err:
        from_launch([STARCODER2], gpus=8, hardware="h100")
    assert err.value.parameter == f"{STARCODER2}: model_name_or_path"
    assert err.value.value == "bigcode/starcoder2-15b"
    assert "or give -m" in str(err.value) and "none of the files names a model" not in str(err.value)


def test_with_m_the_model_is_replaced_and_said():
    launch = from_launch([STARCODER2], gpus=8, hardware="h100", model="llama3.2-1b")
    assert launch.scenario.model == "llama3.2-1b"
    notes = [n for r in launch.readings for n in r.notes]
    assert "model_name_or_path='bigcode/starcoder2-15b' is not in the catalog (mlsysim-core models): " \
           "-m llama3.2-1b is taken" in notes
