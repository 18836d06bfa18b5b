"""Every error mlsysim-core raises on purpose.

Two families: a user gave bad input (``InvalidInputError``, a ``ValueError``; its
``InvalidInputTypeError`` variant is also a ``TypeError``), or a plugin misbehaved
(``PluginError`` and its subclasses, which always name the plugin, its distribution and
the hook). Catch ``MlsysimError`` to catch both.
"""

from __future__ import annotations


class MlsysimError(Exception):
    """Base class of every error raised on purpose by mlsysim-core."""


class InvalidInputError(MlsysimError, ValueError):
    """An input is out of range, unknown or inconsistent.

    ``parameter`` names the input, ``value`` is what was given and ``allowed`` says what
    would have been accepted. The message repeats all three.
    """

    def __init__(self, parameter: str, value: object, allowed: str, detail: str = ""):
        self.parameter = parameter
        self.value = value
        self.allowed = allowed
        self.detail = detail
        message = f"{parameter}={_safe_repr(value)} is not allowed: {allowed}"
        if detail:
            message += f" ({detail})"
        super().__init__(message)


_REPR_LIMIT = 1000


def _safe_repr(value: object) -> str:
    """``repr(value)``, bounded: a deeply nested or huge value (from a hostile file) must not
    turn the error message itself into a RecursionError or a megabyte of text."""
    try:
        text = repr(value)
    except RecursionError:
        return f"<{type(value).__name__} nested too deeply to show>"
    except Exception as err:   # a broken __repr__ of a user's object
        return f"<{type(value).__name__} (repr failed: {type(err).__name__})>"
    if len(text) > _REPR_LIMIT:
        text = text[:_REPR_LIMIT] + f"... ({len(text)} characters)"
    return text


class InvalidInputTypeError(InvalidInputError, TypeError):
    """An input has the wrong type (a bool where a count is expected, a number for a name)."""


class NotModelledError(InvalidInputError):
    """The input is valid, but the profile asked for does not model it (an optimizer without
    a measured-grade model, an 8-bit training regime, a model without the shapes a profile
    derives bytes from). Not a mistake in the input: the CLI, when no profile was named,
    falls back to the reference profile and prints why; Python raises it. ``parameter``
    names the input the profile cannot describe."""


class LayoutError(InvalidInputError):
    """A parallel layout that cannot exist (EP on a dense model, more stages than layers).

    Sharding-rule plugins raise it from their ``apply`` callable; the solver passes it
    through unchanged instead of blaming the plugin.
    """


class NotInstalledError(MlsysimError):
    """mlsysim-core's own entry points are missing: the package is not installed."""


class PluginError(MlsysimError):
    """A plugin could not be loaded or broke its contract."""

    def __init__(self, message: str, *, plugin: str | None = None, source: str | None = None,
                 hook: str | None = None):
        self.plugin = plugin
        self.source = source
        self.hook = hook
        super().__init__(message)


class PluginLoadError(PluginError):
    """A plugin's entry point could not be imported."""


class PluginConflictError(PluginError):
    """Two plugins claim the same name (an entry point, an optimizer, a strategy or a rule)."""


class PluginContractError(PluginError):
    """A plugin implemented an unknown hook, returned the wrong type, or produced bad bytes."""
