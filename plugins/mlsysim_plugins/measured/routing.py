"""Routing imbalance in dropless mixtures of experts under expert parallelism.

Without token dropping (no capacity factor) every routed copy of a token is computed, and an
expert-parallel rank computes the copies its experts receive: T x k on average (T tokens per
rank, top-k), more on the busiest rank. Its experts' activations and its all-to-all receive
buffer scale with that load (the send buffer does not: a rank sends its own T x k copies).

``moe_routing_imbalance`` is that busiest rank's load over the mean: a number >= 1 (from a
router's statistics: max over mean tokens per expert-parallel rank), or ``"uniform"``: the
expected maximum when every token picks k distinct experts uniformly at random, which is a
lower bound for real routers (trained routers are skewed, load-balancing losses only reduce it).

Under uniform routing the copies one token sends to one rank (holding E/ep of the E experts)
are hypergeometric: mean k/ep, variance k (1/ep)(1 - 1/ep)(E - k)/(E - 1). A rank's load sums
that over the T x ep tokens of its expert-parallel group: mean T k, variance
T k (1 - 1/ep)(E - k)/(E - 1); the expected maximum of ep such (near-normal) loads is
mean + sigma x E[max of ep standard normals].
"""

from __future__ import annotations

import math

from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError
from mlsysim_core.memo import memoize
from mlsysim_core.plan import Placement

from .parallel import residual_shards

UNIFORM = "uniform"


@memoize
def expected_max_standard_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by numerical integration of
    x n phi(x) Phi(x)^(n-1) over [-10, 10] (midpoint rule, 4,000 steps: exact to ~1e-9)."""
    if n <= 1:
        return 0.0
    steps, lo, hi = 4000, -10.0, 10.0
    dx = (hi - lo) / steps
    total = 0.0
    for i in range(steps):
        x = lo + (i + 0.5) * dx
        phi = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * phi * cdf ** (n - 1) * dx
    return total


def uniform_imbalance(tokens: float, top_k: int, experts: int, ep: int) -> float:
    """The busiest expert-parallel rank's expected load over the mean under uniform top-k
    routing (see the module docstring)."""
    if ep <= 1 or experts <= top_k:
        return 1.0
    mean = tokens * top_k
    variance = tokens * top_k * (1 - 1 / ep) * (experts - top_k) / (experts - 1)
    return 1 + math.sqrt(variance) * expected_max_standard_normal(ep) / mean


def imbalance_value(value) -> float | str:
    """The option as given: ``"uniform"`` or a number >= 1 (a numeric string from the CLI too)."""
    if isinstance(value, str):
        if value.strip().lower() == UNIFORM:
            return UNIFORM
        try:
            value = float(value)
        except ValueError:
            raise InvalidInputError("moe_routing_imbalance", value,
                                    "a number >= 1 (the busiest rank's load over the mean) or 'uniform'") from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputTypeError("moe_routing_imbalance", value, "a number >= 1 or 'uniform'")
    if not 1 <= value < 1e6:
        raise InvalidInputError("moe_routing_imbalance", value,
                                "a number >= 1 (the busiest rank's load over the mean; 1 = balanced) or 'uniform'")
    return float(value)


def imbalance_factor(plan, split=None) -> float:
    """The factor the busiest rank's expert load carries for a prepared plan (1: balanced).
    ``split``: what the rules split (a ``Placement``, or the activation formulas' ``Context``);
    ``None`` only for the note ``prepare`` writes before any rule has run, which reads the
    layout's sizes."""
    o = plan.profile_options
    value = getattr(o, "moe_routing_imbalance", None)
    if split is None:
        t = plan.tp_size
        e, c, r = plan.ep_size, plan.cp_size, t if plan.sequence_parallel and t > 1 else 1
    elif isinstance(split, Placement):
        e, c, r = split.expert_shards, split.sequence_shards, residual_shards(split)
    else:
        e, c, r = split.experts, split.sequence, split.residual
    if value is None or e == 1:
        return 1.0
    if value != UNIFORM:
        return float(value)
    from .shapes import shape_of
    shape = shape_of(plan)
    tokens = plan.microbatch * plan.seq_len / c / r
    return uniform_imbalance(tokens, shape.top_k, shape.experts, e)
