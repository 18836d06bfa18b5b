"""search_plans(headroom=...) and `search --headroom` (issue 17, item 6): a margin kept free on top of
the total, which already has the runtime overheads; "fits" means fits with that margin."""

import pytest

from mlsysim_core import search
from mlsysim_core.errors import InvalidInputError, InvalidInputTypeError

from clitools import run as run_cli

CAPACITY = 80 * 2**30      # the catalog's h100: 80 GiB
KW = dict(devices=8, global_batch=64, seq_len=2048, profile="measured", workers=1)


@pytest.fixture(scope="module")
def plain():
    return search.search_plans("llama3-8b", "h100", **KW)


@pytest.mark.long     # five whole searches (about 7 s): `pytest --long` and .ci/run
@pytest.mark.parametrize("headroom,margin", [("10GiB", 10 * 2**30), ("8 GB", 8e9), ("25%", CAPACITY / 4),
                                             (2**33, 2**33), ("0B", 0)])
def test_the_margin_is_kept_free_and_nothing_else_changes(plain, headroom, margin):
    found = search.search_plans("llama3-8b", "h100", headroom=headroom, **KW)
    assert found.run["headroom"] == pytest.approx(margin)
    # Every layout that fits with the margin fits without it, with the same numbers; those that fit
    # without it and have at least the margin free (in GB, the reference's comparison) are all kept.
    assert set(found.fits) <= set(plain.fits)
    kept = {c for c in plain.fits if c.total_memory * 1e-9 <= (CAPACITY - margin) * 1e-9}
    assert set(found.fits) == kept
    assert all(c.headroom >= margin - 1e3 for c in found.fits)       # (within the GB comparison's rounding)
    if margin:
        assert len(found.fits) < len(plain.fits)
        assert f"headroom {margin / 2**30:.2f} GiB kept free" in found.describe_run()


@pytest.mark.parametrize("bad,error,fragment", [
    ("x", InvalidInputError, "not a number followed by an optional unit"), ("10", InvalidInputError, "say the unit"),
    ("-1GiB", InvalidInputError, "negative"), ("4.5 parsecs", InvalidInputError, "unknown unit 'parsecs'"),
    ("120%", InvalidInputError, "below the capacity"), (True, InvalidInputTypeError, "headroom=True"),
])
def test_a_bad_headroom_names_the_parameter(bad, error, fragment):
    with pytest.raises(error, match="headroom") as info:
        search.search_plans("llama3-8b", "h100", headroom=bad, **KW)
    assert fragment in str(info.value)


@pytest.mark.long     # three whole measured searches from the CLI: `pytest --long`, .ci/run
def test_the_cli_flag_reads_gib_or_a_share():
    code, out = run_cli("search", "-n", "8", "--global-batch", "64", "-m", "llama3-8b", "--headroom", "10",
                        "--workers", "1", "--no-progress")
    assert code == 0, out
    assert "headroom 10.00 GiB kept free" in out
    code, out = run_cli("search", "-n", "8", "--global-batch", "64", "-m", "llama3-8b", "--headroom", "25%",
                        "--workers", "1", "--no-progress")
    assert code == 0 and "headroom 20.00 GiB kept free" in out
