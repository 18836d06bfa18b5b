"""Number formatting for the formulas that terms carry (a helper, not a plugin)."""


def n(x) -> str:
    """A count with thousands separators; fractional values keep up to 6 significant decimals."""
    if isinstance(x, float) and not x.is_integer():
        return f"{x:,.6g}" if abs(x) < 1e6 else f"{x:,.3f}"
    return f"{int(x):,}"


def shard(divisor: int, what: str) -> str:
    return f" / {divisor} ({what})" if divisor != 1 else ""
