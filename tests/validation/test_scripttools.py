"""tests/scripttools.py's load_script: a script by its path, once, under a name made from its whole path."""

import sys

import pytest

from scripttools import ROOT, load_script, script_name


def test_a_script_is_run_once_and_registered_under_its_path_name():
    module = load_script("validation/lora_parallel/compare_tp.py")
    assert module.__name__ == "script_validation__lora_parallel__compare_tp"
    assert sys.modules[module.__name__] is module
    assert module.__file__ == str(ROOT / "validation" / "lora_parallel" / "compare_tp.py")
    assert load_script(ROOT / "validation" / "lora_parallel" / "compare_tp.py") is module


def test_scripts_of_the_same_file_name_stay_apart():
    parallel, offload = load_script("validation/parallel/compare.py"), load_script("validation/offload_full/compare.py")
    assert parallel is not offload
    assert (parallel.__name__, offload.__name__) == ("script_validation__parallel__compare",
                                                      "script_validation__offload_full__compare")
    assert hasattr(parallel, "layout_kwargs") and not hasattr(offload, "layout_kwargs")


def test_a_name_that_is_not_an_identifier_part_is_folded():
    assert script_name("examples/plugins/mlsysim-mamba2-hybrid/compare_measurements.py") == \
        "script_examples__plugins__mlsysim_mamba2_hybrid__compare_measurements"


@pytest.mark.parametrize("path", ["validation/no_such_script.py", "validation/measurements.json", "validation",
                                  "/etc/hostname"])
def test_what_is_not_a_script_in_the_repository_is_refused_by_path(path):
    with pytest.raises(FileNotFoundError, match=rf"load_script: path='{path}' is not a \.py file in the repository"):
        load_script(path)


def test_a_script_that_raises_is_not_kept(tmp_path, monkeypatch):
    import scripttools
    monkeypatch.setattr(scripttools, "ROOT", tmp_path)
    (tmp_path / "broken.py").write_text("COUNT = 1\nraise RuntimeError('half-run')\n")
    for _ in range(2):             # run again each time: no half-run module is left in sys.modules
        with pytest.raises(RuntimeError, match="half-run"):
            load_script("broken.py")
        assert "script_broken" not in sys.modules
