"""Another organisation's family for the same architecture: it claims "myorg_relu2" too,
so a solve of such a model cannot tell which family to use."""

import attrs

from mlsysim_core import hookimpl
from mlsysim_plugins.measured.families import GPT2

RIVAL = attrs.evolve(GPT2, name="otherorg.relu2", label="other ReLU²", architectures=("myorg_relu2",),
                     approximations={}, fallback=False)     # GPT-2's own declaration, not copied


@hookimpl
def mlsysim_measured_architectures():
    return [RIVAL]
