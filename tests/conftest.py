import json
from pathlib import Path

import pytest

from mlsysim_core import TrainingMemoryModel
from mlsysim_core.catalog import get_hardware, get_model
from mlsysim_core.manager import PluginManager

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="session")
def builtin_pm():
    """A manager with only mlsysim-core's own plugins (whatever else is installed)."""
    return PluginManager.from_environment(autoload=False, blocked=())


@pytest.fixture(scope="session")
def solver(builtin_pm):
    return TrainingMemoryModel(plugin_manager=builtin_pm)


@pytest.fixture(scope="session")
def llama8b():
    """The reference's Llama-3.1-8B (8.03e9 parameters): hand-derived numbers use it."""
    return get_model("mlsysim:llama3-8b")


@pytest.fixture(scope="session")
def h100():
    """The reference's H100 (80 GiB)."""
    return get_hardware("mlsysim:h100")


@pytest.fixture(scope="session")
def reference_grid():
    return json.loads((DATA / "reference_grid.json").read_text())["cases"]


# --- the long tests: deselected by default, run by `pytest --long` (and .ci/run) ----------------
#
# `pytest` runs the quick suite (about a minute on 2 cores). Tests marked `long` (the fuzz, every
# documentation page's commands and the site build, the example packages and plugin installs, the
# plots, whole-search equality checks; every `slow` test, every tests/test_fuzz*.py module) need
# `--long`, or a `-m` expression naming `long` (`-m long`: only them). .ci/run passes `--long`.

def pytest_addoption(parser):
    parser.addoption("--long", action="store_true", default=False,
                     help="also run the tests marked long (the fuzz, documentation pages, examples, plugin "
                          "installs, plots, whole searches, subprocess checks): what .ci/run runs")


def _is_long(item) -> bool:
    """Marked long or slow, or in a fuzz module (tests/test_fuzz*.py: minutes of generated cases)."""
    return (item.get_closest_marker("long") is not None or item.get_closest_marker("slow") is not None
            or item.path.name.startswith("test_fuzz"))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _is_long(item) and item.get_closest_marker("long") is None:
            item.add_marker(pytest.mark.long)
    if config.getoption("--long") or "long" in (config.getoption("markexpr") or ""):
        return
    kept, long_tests = [], []
    for item in items:
        (long_tests if item.get_closest_marker("long") is not None else kept).append(item)
    if long_tests:
        config.hook.pytest_deselected(items=long_tests)
        items[:] = kept
        config._mlsysim_long_deselected = len(long_tests)


def pytest_terminal_summary(terminalreporter, config):
    n = getattr(config, "_mlsysim_long_deselected", 0)
    if n:
        terminalreporter.write_line(f"{n} long tests not run (the fuzz, documentation pages, examples, plugin "
                                    "installs, plots, whole searches, subprocess checks): `pytest --long` runs everything, "
                                    "as .ci/run does")
