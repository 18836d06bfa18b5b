"""Every error raised on purpose: bad input (``InvalidInputError``) or a plugin's (``PluginError``)."""

from __future__ import annotations


class MlsysimError(Exception):
    """Base class of every error raised on purpose by mlsysim-core."""


class InvalidInputError(MlsysimError, ValueError):
    """An input out of range, unknown or inconsistent: names ``parameter``, ``value`` and ``allowed``."""

    def __init__(self, parameter: str, value: object, allowed: str, detail: str = ""):
        self.parameter, self.value, self.allowed, self.detail = parameter, value, allowed, detail
        super().__init__(f"{parameter}={_safe_repr(value)} is not allowed: {allowed}{f' ({detail})' if detail else ''}")


def _safe_repr(value: object, limit: int = 1000) -> str:
    """``repr(value)``, bounded: a hostile value must not make the message itself fail or huge."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply to show>"
    except Exception as err:   # a broken __repr__ of a user's object
        return f"<{type(value).__name__} (repr failed: {type(err).__name__})>"
    return text[:limit] + f"... ({len(text)} characters)" if len(text) > limit else text


class InvalidInputTypeError(InvalidInputError, TypeError):
    """An input has the wrong type (a bool where a count is expected, a number for a name)."""


class NotModelledError(InvalidInputError):
    """A valid input the selected profile does not model (refused: never another profile's answer)."""


class LayoutError(InvalidInputError):
    """A parallel layout that cannot exist (raised by sharding rules)."""


class NotInstalledError(MlsysimError):
    """mlsysim-core's own entry points are missing: the package is not installed."""


class PluginError(MlsysimError):
    """A plugin could not be loaded or broke its contract."""

    def __init__(self, message: str, *, plugin: str | None = None, source: str | None = None, hook: str | None = None):
        self.plugin, self.source, self.hook = plugin, source, hook
        super().__init__(message)


class PluginLoadError(PluginError):
    """A plugin's entry point could not be imported."""


class PluginConflictError(PluginError):
    """Two plugins claim the same name (an entry point, an optimizer, a strategy or a rule)."""


class PluginContractError(PluginError):
    """A plugin implemented an unknown hook, returned the wrong type, or produced bad bytes."""
