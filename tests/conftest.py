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
