"""Techniques: what a measured run switches on (offload, LoRA, a chunked loss, float8, ...), each a
registration of the measured hook ``mlsysim_measured_techniques`` (issue 24, item 3).

A ``Technique`` declares, with nothing the profile recognises by name:

- ``options``: the option fields it owns (``attrs.field`` with the metadata that ``solve``
  keywords, CLI flags and scenario fields are made from: help, metavar, type, choices, flag,
  flags, parse, from_file, layout, what; see ``options._option``). The profile's options type
  is assembled from the registered techniques' fields (``options_type``), so a third-party
  technique adds a keyword, a flag and a scenario field. Two techniques owning one field, or a
  technique owning one of the profile's own fields, is an error naming both.
- ``apply``: ``apply(plan, registry) -> plan``, the plan with its options checked and completed
  (notes, refusals), at one or more of the stages of the profile's ``prepare`` (``STAGES``); a
  callable alone runs at ``"optimizer"``. Called whatever its options' values: a technique that
  is off returns the plan as it is.
- ``relocate``: ``relocate(plan, weights, gradients, optimizer_state) -> (weights, gradients,
  optimizer_state)``: what it moves to the host (or frees), the plan's terms as they are when off.
- ``order``: where it runs among the techniques, at each stage and in the ladder (lower first,
  then by name), so a technique registered again under another name runs where it did.
- for ``fit techniques``: ``keyword`` (the solve keyword the ladder sets; default its first
  option), ``candidates`` (``Candidate(value, label, caveat)``: a list, or a callable
  ``candidates(registry)`` returning them, to enumerate what the solver's registry holds: the
  built-in checkpointing policies and low-bit optimizers), ``offered(value, given,
  registry)`` (``given`` the run's value of the keyword, ``registry`` the solver's, to resolve
  both values to the specs they name and ask what those declare; a callable of two parameters,
  ``offered(value, given)``, is called without it, as before; default: only when
  the run leaves the keyword unset), ``active(plan)`` (is it on in a
  prepared plan), ``added_step_time(plan, figures) -> (seconds or None, how)`` (``figures``:
  ``technique_fit.hardware_figures``), and ``replaces`` (its value replaces the run's own, whose
  time is taken off: checkpointing).
- ``with_compile``: how it combines with ``compile`` (compile.py asks every technique that owns options and is
  on: ``active(plan)``, else any of its options set): a callable ``with_compile(plan, value)`` (``value`` the
  plan's ``compile``) that returns for what was measured with it and raises ``NotModelledError`` for the rest,
  or a string, the reason it is not modelled with compile (refused naming its option). ``None``, declaring
  nothing: refused with compile, naming its option (its reshaping of the compiled backward is not known).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any, Callable, Mapping

import attrs

from mlsysim_core.errors import MlsysimError, PluginContractError
from mlsysim_core.specs import _name_field

HOOK = "mlsysim_measured_techniques"

STAGES = ("given", "completed", "optimizer", "last")
"""The stages of ``prepare`` at which a technique's ``apply`` runs: ``given`` (the options as
given, before the profile checks and completes them), ``completed`` (the regime, kernel, family
and checkpointing completed), ``optimizer`` (the MoE and loss-parallel options checked, the
optimizer's spec on the options) and ``last`` (after every technique's ``optimizer`` step)."""


@attrs.frozen
class Candidate:
    """One value the ladder may switch on: the value, its label, a numerical caveat (not priced)."""
    value: Any
    label: str
    caveat: str | None = None


def _stages(value) -> dict[str, Callable]:
    if value is None:
        return {}
    if callable(value):
        return {"optimizer": value}
    stages = dict(value)
    for stage, function in stages.items():
        if stage not in STAGES or not callable(function):
            raise ValueError(f"Technique.apply: stage {stage!r} -> {function!r}; expected one of {STAGES} -> a "
                             "callable")
    return stages


def _candidates(value):
    """A callable ``candidates(registry)`` as it is; anything else a tuple of ``Candidate``."""
    return value if callable(value) else tuple(value)


def _asks_registry(offered) -> bool:
    """Does ``offered`` take the registry, a third positional argument (``offered(value, given, registry)``)?
    A callable of two, ``offered(value, given)``, is called without it."""
    if offered is None:
        return False
    try:
        inspect.signature(offered).bind(None, None, None)
    except (TypeError, ValueError):      # two parameters; or no signature to read (called as before)
        return False
    return True


@attrs.frozen(kw_only=True, eq=False)
class Technique:
    """A technique of the measured profile (the module docstring)."""
    name: str = _name_field     # a spec name: built-ins un-dotted, third parties dotted (myorg.host_state)
    description: str = ""
    options: Mapping[str, Any] = attrs.field(factory=dict, converter=dict)
    after: str | None = None             # the option its fields follow in the listing (default: the end)
    apply: Mapping[str, Callable] = attrs.field(default=None, converter=_stages)
    relocate: Callable | None = None
    order: float = 100.0
    keyword: str | None = None
    candidates: tuple[Candidate, ...] | Callable = attrs.field(default=(), converter=_candidates)
    offered: Callable | None = None
    active: Callable | None = None
    added_step_time: Callable | None = None
    replaces: bool = False
    with_compile: Callable | str | None = None
    # Whether ``offered`` takes the registry: read from its signature once, when the technique is made.
    _offered_asks_registry: bool = attrs.field(init=False, repr=False, default=attrs.Factory(
        lambda self: _asks_registry(self.offered), takes_self=True))

    @property
    def ladder_keyword(self) -> str | None:
        """The solve keyword the ladder sets for it (None: not in the ladder: no candidates, neither a list
        nor a callable)."""
        if not self.candidates:
            return None
        return self.keyword or next(iter(self.options), None)

    def candidates_in(self, registry) -> tuple[Candidate, ...]:
        """Its candidates in the world of ``registry`` (``candidates(registry)`` where it is a callable)."""
        if not callable(self.candidates):
            return self.candidates
        found = tuple(self.candidates(registry))
        for c in found:
            if not isinstance(c, Candidate):
                raise PluginContractError(f"technique {self.name!r}: candidates(registry) returned {c!r}; "
                                          "expected Candidate(value, label, caveat) items", hook=HOOK)
        return found

    def is_offered(self, value, given: Mapping[str, Any], registry=None) -> bool:
        """Is candidate ``value`` offered to a run whose keywords are ``given`` (``offered``, with
        ``registry`` where it takes it; default: when the run leaves the keyword unset)?"""
        key = self.ladder_keyword
        if self.offered is None:
            return key not in given
        if self._offered_asks_registry:
            return bool(self.offered(value, given.get(key), registry))
        return bool(self.offered(value, given.get(key)))


def registered(registry) -> list[Technique]:
    """The registered techniques, in the order they run (``order``, then name)."""
    found = registry.extensions.get(HOOK) or {}
    if any(not isinstance(t, Technique) for t in found.values()):
        from .options import check_items
        check_items(registry, HOOK, found)
    techniques = _in_order(tuple(found.values()))
    for t in techniques:      # (who provides each, for an error that names it where no registry is at hand)
        if t not in _PROVIDERS:
            _PROVIDERS[t] = registry.provider(HOOK, t.name)
    return list(techniques)


_PROVIDERS: "weakref.WeakKeyDictionary[Technique, Any]" = weakref.WeakKeyDictionary()


# Every solve asks for the techniques in order and for each stage's functions: worked out once per
# set of techniques (a tuple of them: hashed and compared by identity, Technique being eq=False).
@functools.lru_cache(maxsize=16)
def _in_order(techniques: tuple) -> tuple:
    return tuple(sorted(techniques, key=lambda t: (t.order, t.name)))


@functools.lru_cache(maxsize=64)
def _stage_functions(techniques: tuple, stage: str) -> tuple[tuple[Technique, Callable], ...]:
    return tuple((t, t.apply[stage]) for t in techniques if t.apply.get(stage) is not None)


@functools.lru_cache(maxsize=16)
def _relocations(techniques: tuple) -> tuple[tuple[Technique, Callable], ...]:
    return tuple((t, t.relocate) for t in techniques if t.relocate is not None)


def run_stage(plan, registry, stage: str, techniques=None):
    """``plan`` through every registered technique's ``apply`` at ``stage``."""
    for technique, function in _stage_functions(tuple(registered(registry) if techniques is None else techniques),
                                                stage):
        given = plan
        try:
            plan = function(given, registry)
        except MlsysimError:
            raise
        except Exception as err:      # the technique's bug, named: never the profile's prepare
            raise _broken(technique, registry, f"apply at stage {stage!r} raised {type(err).__name__}: {err}") from err
        if type(plan) is not type(given):
            raise _broken(technique, registry, f"apply at stage {stage!r} returned {type(plan).__name__}; expected "
                                               f"the {type(given).__name__} (attrs.evolve(plan, ...), or the plan "
                                               "as it is)")
    return plan


def relocate(plan, weights, gradients, optimizer_state):
    """The terms with what each technique of the prepared plan moves (``Technique.relocate``), in order."""
    for technique, function in _relocations(tuple(plan.profile_options.techniques or ())):
        try:
            moved = function(plan, weights, gradients, optimizer_state)
        except MlsysimError:
            raise
        except Exception as err:
            raise _broken(technique, None, f"relocate raised {type(err).__name__}: {err}") from err
        if not (isinstance(moved, (tuple, list)) and len(moved) == 3
                and all(isinstance(terms, (tuple, list)) for terms in moved)):
            shape = (f"a {type(moved).__name__} of {len(moved)}" if isinstance(moved, (tuple, list))
                     else type(moved).__name__)
            raise _broken(technique, None, f"relocate returned {shape}; expected (weights, gradients, "
                                           "optimizer_state): three lists of MemoryTerm")
        weights, gradients, optimizer_state = moved
    return weights, gradients, optimizer_state


def _broken(technique, registry, what) -> PluginContractError:
    """A technique that broke its contract, named with its plugin where ``registry`` says it."""
    info = registry.provider(HOOK, technique.name) if registry is not None else _PROVIDERS.get(technique)
    return PluginContractError(f"{info.describe() + ' ' if info else ''}technique {technique.name!r} {what}",
                               hook=HOOK, plugin=info and info.name, source=info and info.source)
