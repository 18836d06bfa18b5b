"""The launch formats' hook and its spec (added by the ``launch`` plugin, this package's
``__init__``): collected into ``registry.extensions["mlsysim_launch_formats"]``."""

from __future__ import annotations

from typing import Callable, Iterable

import attrs
import pluggy

from mlsysim_core.specs import _callable, _description, _name_field

_hookspec = pluggy.HookspecMarker("mlsysim")


@attrs.frozen(kw_only=True)
class LaunchFormatSpec:
    """A named reader of launch configs: a framework's recipe, trainer arguments, a DeepSpeed
    JSON. ``recognizes(path, document) -> bool`` says whether a parsed file (``document``: what
    json/tomllib/yaml made of it) is of this format; ``read(path, document, context) ->
    LaunchReading`` maps every field to solve arguments, refusals, approximations, ignored fields
    and implicit defaults. ``suffixes``: the file names it reads."""
    name: str = _name_field
    description: str = _description
    framework: str = attrs.field(validator=attrs.validators.instance_of(str))
    suffixes: tuple[str, ...] = attrs.field(converter=tuple)
    recognizes: Callable = attrs.field(validator=_callable)
    read: Callable = attrs.field(validator=_callable)


@_hookspec
def mlsysim_launch_formats() -> Iterable[LaunchFormatSpec]:
    """Register named launch-config readers (``estimate --from FILE``): a framework's recipe,
    trainer arguments, a DeepSpeed JSON, an in-house trainer's config.

    .. versionadded:: plugin API 2.6 (here since 3.1)
    """


HOOK = "mlsysim_launch_formats"
REGISTRATION_HOOK_TYPES = {HOOK: LaunchFormatSpec}     # the plugin manager checks and collects them
