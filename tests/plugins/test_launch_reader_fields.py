"""A launch-format reader's field names and name lists (issue 24, helper AUTHORQA's leftovers):

- a ``LaunchField`` (or ``LaunchDefault``) whose ``field`` is no Scenario field, profile option or
  batch field was refused as the user's launch file ("launch files='micro_batch' is not allowed:
  known fields: ..."): it is the reader's bug, a PluginContractError naming the format, its plugin,
  the key and the field;
- ``LaunchReading.ignored="lr"`` (and ``notes="..."``, ``LaunchField.derived_from="..."``) was split
  into its characters, silently, as cattrs did to tuple-typed options before 25f2700: refused,
  as those are.
"""

from __future__ import annotations

import pytest

from mlsysim_core import PluginContractError
from mlsysim_plugins.launch import LaunchDefault, LaunchField

from readertools import MODEL, launch_read_by

HOOK = "mlsysim_launch_formats"


def _launch(tmp_path, **reading):
    """``from_launch`` of one file read by a reader returning a LaunchReading of ``reading``."""
    return launch_read_by(tmp_path, {"framework_version": "myorg-trainer 1.2", **reading}, batch_size=8)


def test_known_fields_are_read(tmp_path):
    launch, _ = _launch(tmp_path, fields=[MODEL, LaunchField(key="trainer.mbs", value=2, field="micro_batch_size",
                                                             becomes=2),
                                          LaunchField(key="trainer.offload", value=True, field="activation_offload",
                                                      becomes=True)],
                        ignored=["trainer.lr", "trainer.log_every"], notes=("one note",))
    assert launch.scenario.batch_size == 2 and launch.scenario.activation_offload is True
    assert launch.readings[0].ignored == ("trainer.lr", "trainer.log_every")
    assert launch.readings[0].notes == ("one note",)


@pytest.mark.parametrize("kind", ["field", "default"])
def test_an_unknown_field_is_the_readers_bug(tmp_path, kind):
    item = (LaunchField(key="trainer.mbs", value=2, field="micro_batch", becomes=2) if kind == "field" else
            LaunchDefault(key="trainer.mbs", field="micro_batch", value=2, version="1.2", source="trainer.py:10"))
    with pytest.raises(PluginContractError) as err:
        _launch(tmp_path, **({"fields": [MODEL, item]} if kind == "field" else {"defaults": [item]}))
    assert str(err.value) == (
        f"launch format 'myorg.trainer' (plugin myorg_trainer_reader) reading {str(tmp_path / 'run.yaml')!r} "
        f"returned {type(item).__name__} key='trainer.mbs' for field 'micro_batch', which is no Scenario field, "
        "option of a loaded profile or batch field (micro_batch_size, global_batch_size); did you mean "
        "'micro_batch_size'?")
    assert (err.value.plugin, err.value.hook) == ("myorg_trainer_reader", HOOK)


def test_a_field_that_is_not_a_name_is_the_readers_bug(tmp_path):
    with pytest.raises(PluginContractError, match=r"returned LaunchField key='trainer.x' for field \['tp_size'\], "
                                                  "which is no Scenario field"):
        _launch(tmp_path, fields=[MODEL, LaunchField(key="trainer.x", value=2, field=["tp_size"], becomes=2)])


@pytest.mark.parametrize(("given", "where"), [({"ignored": "lr"}, "LaunchReading.ignored='lr'"),
                                              ({"notes": "a note"}, "LaunchReading.notes='a note'")])
def test_one_str_for_a_list_of_names_is_refused(tmp_path, given, where):
    with pytest.raises(PluginContractError) as err:
        _launch(tmp_path, **given)
    assert str(err.value) == (
        f"launch format 'myorg.trainer' (plugin myorg_trainer_reader) raised TypeError reading "
        f"{str(tmp_path / 'run.yaml')!r}: {where} is a str; expected a tuple (or list) of str (one str would be "
        "read as its characters)")
    assert (err.value.plugin, err.value.hook) == ("myorg_trainer_reader", HOOK)


def test_derived_from_one_str_is_refused():
    with pytest.raises(TypeError, match=r"^LaunchField.derived_from='precision' is a str; expected a tuple"):
        LaunchField(key="k", value=1, field="regime", becomes=None, derived_from="precision",
                    derive=lambda merged: None)
    assert LaunchField(key="k", value=1, field="regime", becomes=None, derived_from=["precision"]).derived_from == (
        "precision",)
