"""A third party's launch-format reader (docs/launch.md, "Writing a launch-format reader"), as a
plugin author writes it from the docs: what its reading carries is checked before the world size
and the batch are computed from it. Found by helper AUTHORQA (issue 24): a file's micro-batch read
as the string "2", a tensor-parallel size "2", a device count "8" or a misspelled world hint ('gpu')
ended in a TypeError traceback from ``from_launch``'s arithmetic, or in a misleading "the files do
not say how many GPUs"."""

from __future__ import annotations

import pytest

from mlsysim_core import InvalidInputError, PluginContractError
from mlsysim_plugins.launch import LaunchField

from readertools import MODEL, launch_read_by


def _field(key, field, value):
    return LaunchField(key=key, value=value, field=field, becomes=value)


def _launch(tmp_path, fields, world=None):
    """``from_launch`` of one file read by a reader that returns ``fields`` and ``world``."""
    reading = {"fields": [MODEL, *fields], "framework_version": "myorg-trainer 1.2"}
    return launch_read_by(tmp_path, reading if world is None else {**reading, "world": world})[0]


def test_a_whole_micro_batch_gives_the_global_batch(tmp_path):
    launch = _launch(tmp_path, [_field("trainer.micro_batch", "micro_batch_size", 2)])
    assert launch.scenario.batch_size == 2          # micro-batch 2 x dp 1 x accumulation 1
    assert launch.scenario.model == "llama3-8b"


def test_a_float_that_is_whole_is_read_as_the_int(tmp_path):
    """As a scenario file's 16.0 is 16 (JSON and TOML writers write floats)."""
    launch = _launch(tmp_path, [_field("trainer.micro_batch", "micro_batch_size", 2.0),
                                _field("trainer.accum", "gradient_accumulation_steps", 4.0)])
    assert launch.scenario.batch_size == 8 and type(launch.scenario.batch_size) is int
    assert launch.scenario.gradient_accumulation_steps == 4


@pytest.mark.parametrize(("key", "field", "value"), [
    ("trainer.micro_batch", "micro_batch_size", "2"),
    ("trainer.micro_batch", "micro_batch_size", 0),
    ("trainer.micro_batch", "micro_batch_size", 1.5),
    ("trainer.global_batch", "global_batch_size", True),
    ("trainer.accum", "gradient_accumulation_steps", "4"),
])
def test_a_batch_field_that_is_not_a_whole_number_is_named_by_its_key(tmp_path, key, field, value):
    fields = [_field(key, field, value)]
    if field != "micro_batch_size":
        fields.append(_field("trainer.micro_batch", "micro_batch_size", 1))
    with pytest.raises(InvalidInputError) as err:
        _launch(tmp_path, fields)
    assert str(err.value) == (f"{key}={value!r} is not allowed: a whole number >= 1 "
                              f"({field} from {tmp_path / 'run.yaml'}: {key})")


def test_a_parallel_size_that_is_not_a_whole_number_is_named_by_its_key(tmp_path):
    with pytest.raises(InvalidInputError, match=r"^trainer\.tp='2' is not allowed: a whole number >= 1 "
                                                r"\(tp_size from .*run\.yaml: trainer\.tp\)$"):
        _launch(tmp_path, [_field("trainer.tp", "tp_size", "2"), _field("trainer.micro_batch", "micro_batch_size", 1)],
                world={"gpus": ("trainer.gpus", 8)})


def test_a_device_count_that_is_not_a_whole_number_is_named_by_its_key(tmp_path):
    with pytest.raises(InvalidInputError, match=r"^trainer\.gpus='8' is not allowed: a whole number >= 1 "
                                                r"\(.*run\.yaml: the gpus \(myorg\.trainer format\)\)$"):
        _launch(tmp_path, [_field("trainer.micro_batch", "micro_batch_size", 1)], world={"gpus": ("trainer.gpus", "8")})


def test_the_device_count_a_file_gives_is_the_world_size(tmp_path):
    launch = _launch(tmp_path, [_field("trainer.micro_batch", "micro_batch_size", 2)],
                     world={"gpus": ("trainer.gpus", 8)})
    assert (launch.scenario.dp_size, launch.scenario.batch_size) == (8, 16)


def test_an_unknown_world_hint_is_the_readers_bug_named(tmp_path):
    """'gpu' for 'gpus' was silently ignored, and the run refused as if the files gave no device count."""
    with pytest.raises(PluginContractError) as err:
        _launch(tmp_path, [_field("trainer.micro_batch", "micro_batch_size", 1)], world={"gpu": ("trainer.gpus", 8)})
    assert str(err.value) == (
        f"launch format 'myorg.trainer' (plugin myorg_trainer_reader) reading {str(tmp_path / 'run.yaml')!r} returned "
        "unknown world hint(s) 'gpu': LaunchReading.world maps gpus, nodes, gpus_per_node, single_device to "
        "(the file's key, its value)")
    assert (err.value.plugin, err.value.hook) == ("myorg_trainer_reader", "mlsysim_launch_formats")


def test_a_world_hint_that_is_not_a_pair_is_the_readers_bug_named(tmp_path):
    with pytest.raises(PluginContractError, match="returned a world hint that is not a \\(key, value\\) pair"):
        _launch(tmp_path, [_field("trainer.micro_batch", "micro_batch_size", 1)], world={"gpus": 8})


def _reading_of(tmp_path, **reading):
    """``from_launch`` of a reader that returns a LaunchReading built from ``reading``."""
    return launch_read_by(tmp_path, reading)


@pytest.mark.parametrize(("reading", "what"), [
    ({"fields": [MODEL, {"key": "trainer.mb", "field": "micro_batch_size", "value": 2}]},
     "LaunchReading.fields holding dict {'key': 'trainer.mb', 'field': 'micro_batch_size', 'value': 2}; "
     "expected LaunchFields"),
    ({"defaults": ["regime=bf16"]}, "LaunchReading.defaults holding str 'regime=bf16'; expected LaunchDefaults"),
    ({"world": None}, "LaunchReading.world=None; expected a dict (empty: the file gives no device count)"),
])
def test_a_reading_that_breaks_its_contract_is_the_readers_bug_named(tmp_path, reading, what):
    """Were AttributeError ('dict' object has no attribute 'derive', 'str' ... 'field') and TypeError tracebacks."""
    with pytest.raises(PluginContractError) as err:
        _reading_of(tmp_path, **reading)
    assert str(err.value) == (f"launch format 'myorg.trainer' (plugin myorg_trainer_reader) reading "
                              f"{str(tmp_path / 'run.yaml')!r} returned {what}")


def test_a_sequence_length_that_is_not_a_whole_number_is_named_by_its_key(tmp_path):
    with pytest.raises(InvalidInputError) as err:
        _reading_of(tmp_path, fields=[MODEL, _field("trainer.mb", "micro_batch_size", 1),
                                      _field("trainer.seq", "seq_len", "2k")])
    assert str(err.value) == ("trainer.seq='2k' is not allowed: a whole number >= 1 "
                              f"(seq_len from {tmp_path / 'run.yaml'}: trainer.seq)")
