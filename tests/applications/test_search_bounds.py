"""What a search may leave unsolved (issue 27 item 5), each bound stated and checked against
full solves: the state lower bound (``search.state_bytes``: weights, gradients and optimizer
state, the same for every checkpointing strategy and sequence parallelism of a layout, never
above its total), memory growing with the micro-batch while gradients accumulate (gas >= 2;
gas = 1 holds no accumulated gradients and can fit where a smaller micro-batch does not), and
the last micro-batch bounded by a smaller one's weights, optimizer state and activations
(``search.without_gradients``). A pruned search equals the one that solves every layout, row
for row, note for note."""

import itertools

import pytest

from mlsysim_core import search
from mlsysim_core.errors import InvalidInputError

# (model, devices, global batch, seq); (tp, cp, pp, dp, ep) layouts of each
GRID = {("mixtral-8x7b", 16, 16, 1024): [(1, 1, 1, 16, 8), (2, 1, 2, 4, 4), (1, 2, 4, 2, 2), (4, 1, 4, 1, 1),
                                         (2, 2, 1, 4, 8)],
        ("llama3-8b", 8, 16, 2048): [(1, 1, 1, 8, 1), (2, 1, 2, 2, 1), (1, 2, 2, 2, 1), (8, 1, 1, 1, 1)]}
RULES = ("zero0", "zero1", "zero3", "fsdp", "fsdp-grad-op", "hsdp", "mcore-distopt")


def _solve(solver, model, batch, seq, layout, rule, ckpt, sp, gas):
    tp, cp, pp, dp, ep = layout
    try:
        return solver.solve(model, "h100", batch, seq, "fp16", "adam", ckpt, tp, pp, dp, ep, 0, gas,
                            sequence_parallel=sp, data_parallel=rule, cp_size=cp, profile="measured")
    except InvalidInputError:
        return None


@pytest.fixture(scope="module")
def grid(solver):
    """{(model, layout, rule, gas): {(strategy, sp): result}} over GRID, gas the largest and 1."""
    out = {}
    for (model, _, batch, seq), layouts in GRID.items():
        for layout, rule in itertools.product(layouts, RULES):
            dp = layout[3]
            for gas in sorted({batch // dp, 1}):
                for ckpt, sp in itertools.product(("none", "selective", "full"), (False, True)):
                    if sp and layout[0] == 1:
                        continue
                    result = _solve(solver, model, batch, seq, layout, rule, ckpt, sp, gas)
                    if result is not None:
                        out.setdefault((model, layout, rule, gas), {})[(ckpt, sp)] = result
    return out


def test_state_bytes_never_exceeds_the_total(grid):
    results = [r for siblings in grid.values() for r in siblings.values()]
    assert len(results) > 300
    assert all(0 < search.state_bytes(r) <= r.total_memory for r in results)
    # (a bound with substance: at least the weights and optimizer state of the heaviest rank's peak)
    assert all(search.state_bytes(r) >= r.weights + r.optimizer_state for r in results if r.peak_phase != "forward")


def test_state_bytes_is_the_same_for_every_strategy_and_sequence_parallelism(grid):
    """What lets a search bound a sibling (another strategy or sp, the same micro-batch) by one solve."""
    compared = 0
    for key, siblings in grid.items():
        bounds = {search.state_bytes(r) for r in siblings.values()}
        assert len(bounds) == 1, (key, bounds)
        compared += len(siblings) - 1
    assert compared > 250


def test_state_bytes_by_hand(solver):
    """One device, zero0, fp16 Adam under autocast: fp32 weights (4 B), fp32 gradients (4 B), two fp32
    moments (8 B), all alive at the optimizer step; the optimizer's foreach temporaries beside them."""
    r = solver.solve("llama3-8b", "h100", 1, 512, "fp16", "adam", "full", profile="measured")
    terms = [t for t in r.terms if t.component in ("weights", "gradients", "optimizer_state")
             and "optimizer_step" in t.phases and t.tier == "accelerator"]
    assert search.state_bytes(r) == sum(t.nbytes for t in terms)
    params = r.weights / 4
    assert search.state_bytes(r) >= 16 * params


def test_memory_grows_with_the_micro_batch_while_gradients_accumulate(solver):
    checked = 0
    for (model, _, batch, seq), layouts in GRID.items():
        for layout, rule in itertools.product(layouts[:3], ("zero1", "fsdp", "fsdp-grad-op")):
            samples = batch // layout[3]
            for ckpt in ("none", "full"):
                totals = [r.total_memory for mb in search._divisors(samples) if samples // mb >= 2
                          if (r := _solve(solver, model, batch, seq, layout, rule, ckpt, False, samples // mb))]
                assert totals == sorted(totals), (model, layout, rule, ckpt, totals)
                checked += len(totals)
    assert checked > 60


def test_without_gradients_at_a_smaller_micro_batch_bounds_the_last(solver):
    """What lets a search skip the last micro-batch (gas = 1) after a smaller one did not fit: that one's
    weights, optimizer state and activations alive in one phase of one rank are at most the last's total."""
    checked = 0
    for (model, _, batch, seq), layouts in GRID.items():
        for layout, rule in itertools.product(layouts, ("zero1", "zero3", "fsdp", "fsdp-grad-op", "hsdp")):
            samples = batch // layout[3]
            for ckpt, sp in (("none", False), ("full", False), ("selective", layout[0] > 1)):
                last = _solve(solver, model, batch, seq, layout, rule, ckpt, sp, 1)
                if last is None:
                    continue
                for mb in search._divisors(samples)[:-1]:
                    smaller = _solve(solver, model, batch, seq, layout, rule, ckpt, sp, samples // mb)
                    assert search.without_gradients(smaller) <= last.total_memory, (model, layout, rule, ckpt, mb)
                    checked += 1
    assert checked > 150
    assert search.without_gradients(None) == 0


def test_without_accumulation_a_larger_micro_batch_can_fit(solver):
    """fsdp-grad-op keeps the accumulated (unsharded) gradients alive through the next micro-batch's
    forward; at gas = 1 there are none: micro-batch 8 fits where 2 and 4 do not (which is why a search
    always solves the last micro-batch)."""
    totals = {mb: _solve(solver, "mixtral-8x7b", 8, 1024, (1, 4, 4, 1, 2), "fsdp-grad-op", "none", False, 8 // mb)
              for mb in (1, 2, 4, 8)}
    assert [totals[mb].feasible for mb in (1, 2, 4, 8)] == [True, False, False, True]
    assert totals[8].gradients == 0 < totals[4].gradients


ARGS = dict(profile="measured", workers=1, checkpointing=["full", "none"])


@pytest.mark.parametrize("model, devices, batch, seq, rules", [
    ("llama3-70b", 8, 8, 4096, ["zero0", "zero3", "fsdp-grad-op"]),      # none fits: the closest
    ("mixtral-8x7b", 8, 8, 2048, ["zero1", "fsdp-grad-op"]),             # none fits, MoE
])
@pytest.mark.long       # whole searches, pruned and unpruned
def test_a_pruned_search_where_none_fits_is_the_unpruned_one(model, devices, batch, seq, rules):
    pruned, every = (search.search_plans(model, "h100", devices=devices, global_batch=batch, seq_len=seq,
                                         data_parallel=rules, assume_monotone=flag, **ARGS) for flag in (True, False))
    assert pruned.candidates == every.candidates == every.solves and every.state_pruned == 0
    assert pruned.state_pruned > 0 and pruned.solves < every.solves
    assert (pruned.fits, pruned.closest, pruned.notes) == (every.fits, every.closest, every.notes)
    assert len(pruned.closest) == search.CLOSEST


@pytest.mark.long       # about 10 s
def test_a_pruned_search_is_the_unpruned_one_and_keeps_the_gas_1_rows(solver):
    args = dict(devices=16, global_batch=8, seq_len=1024, data_parallel=["fsdp-grad-op", "zero1", "zero0"], **ARGS)
    pruned = search.search_plans("mixtral-8x7b", "h100", assume_monotone=True, **args)
    every = search.search_plans("mixtral-8x7b", "h100", assume_monotone=False, **args)
    assert pruned.state_pruned > 0 and pruned.solves < every.solves == every.candidates
    assert (pruned.fits, pruned.pareto, pruned.notes) == (every.fits, every.pareto, every.notes)
    # rows that fit only without accumulation: the micro-batch before theirs does not
    alone = [c for c in pruned.fits if c.gradient_accumulation_steps == 1 and c.data_parallel == "fsdp-grad-op" and c.microbatch > 1
             and not _solve(solver, "mixtral-8x7b", 8, 1024, (c.tp, c.cp, c.pp, c.dp, c.ep), c.data_parallel,
                            c.checkpointing, c.sequence_parallel, 2).feasible]
    assert alone
    for c in pruned.fits[::25] + tuple(alone):      # each row is its layout solved alone
        r = _solve(solver, "mixtral-8x7b", 8, 1024, (c.tp, c.cp, c.pp, c.dp, c.ep), c.data_parallel,
                   c.checkpointing, c.sequence_parallel, c.gradient_accumulation_steps)
        assert r.total_memory == c.total_memory


@pytest.mark.long       # whole searches, pruned and unpruned
def test_the_pruning_is_the_same_with_workers():
    args = dict(devices=8, global_batch=8, seq_len=2048, data_parallel=["zero1", "fsdp-grad-op"],
                checkpointing=["full", "none"], profile="measured")
    alone = search.search_plans("mixtral-8x7b", "h100", workers=1, **args)
    forked = search.search_plans("mixtral-8x7b", "h100", workers=2, **args)
    # (a chunk holds each layout's strategies and sp whole: its bounds, and so its solves, are the in-process ones)
    assert alone.state_pruned > 0
    assert (forked.fits, forked.closest, forked.notes, forked.solves, forked.state_pruned) == (
        alone.fits, alone.closest, alone.notes, alone.solves, alone.state_pruned)


def test_the_closest_pruned_layouts_are_solved_when_they_could_be_among_the_closest(monkeypatch):
    """A search where none fits keeps micro-batch 1's bound of each pruned layout and solves those whose
    bound is below the CLOSEST-th total found (their totals are at least their bounds)."""
    resolved = []
    resolve = search._resolve_closest
    monkeypatch.setattr(search, "_resolve_closest", lambda *a: resolved.append(resolve(*a)) or resolved[-1])
    found = search.search_plans("llama3-70b", "h100", devices=8, global_batch=8, seq_len=4096,
                                data_parallel=["zero0", "zero3"], **ARGS)
    assert not found.fits and found.state_pruned > 0 and resolved[0] > 0
    every = search.search_plans("llama3-70b", "h100", devices=8, global_batch=8, seq_len=4096,
                                data_parallel=["zero0", "zero3"], **{**ARGS, "assume_monotone": False})
    assert found.closest == every.closest


SIBLINGS = dict(devices=32, global_batch=64, seq_len=4096, data_parallel=["zero1", "fsdp-grad-op", "zero3"],
                profile="measured", workers=1)     # Llama-3-70B: rows, and layouts whose state decides


def _logged_search(monkeypatch):
    """A search and every solve it ran, in order: (layout and rule, (strategy, sp), gas, total, result or None)."""
    solves, solve = [], search.solve_plan

    def logged(registry, plan, options, total_only=False):
        result = solve(registry, plan, options, total_only=total_only)
        layout = (plan.tp_size, plan.cp_size, plan.pp_size, plan.dp_size, plan.ep_size, plan.rules)
        solves.append((layout, (plan.activation_checkpointing, plan.sequence_parallel),
                       plan.gradient_accumulation_steps, result if total_only else result.total_memory,
                       None if total_only else result))
        return result
    monkeypatch.setattr(search, "solve_plan", logged)
    return search.search_plans("llama3-70b", "h100", **SIBLINGS), solves


@pytest.mark.long       # a whole search (about 3 s)
def test_a_sibling_that_fits_or_is_over_at_gas_1_spares_solves(monkeypatch):
    """state_bytes <= total and is the same for every strategy and sp of a layout at one micro-batch and gas:
    after a sibling fit there, no other sibling is solved a second time for its bound; after a sibling's
    result at gas = 1 had it over the limit, no other sibling's last micro-batch (gas = 1) is solved."""
    found, solves = _logged_search(monkeypatch)
    limit = 80 * 2**30
    assert found.fits and found.state_pruned > 0
    spared = bounded = 0
    for index, (layout, sibling, gas, total, result) in enumerate(solves):
        later = [(s, g) for lay, s, g, _, _ in solves[index + 1:] if lay == layout and g == gas and s != sibling]
        if total <= limit:
            over_after = {s for s, _ in later if any(
                lay == layout and x == s and g == gas and t > limit for lay, x, g, t, _ in solves[index + 1:])}
            for s in over_after:     # solved once: its total, no second solve for the bound
                assert sum(lay == layout and x == s and g == gas for lay, x, g, _, _ in solves) == 1, (layout, s)
            spared += len(over_after)
        if gas == 1 and result is not None and search.state_bytes(result) > limit:
            assert not later, (layout, sibling, later)
            bounded += 1
    assert spared > 10 and bounded > 5
    assert found.run["checkpointing"] == ["full", "none", "selective"]     # (each layout: three siblings at least)


@pytest.mark.long       # whole searches, pruned and unpruned (about 10 s)
def test_a_search_with_siblings_bounds_is_the_unpruned_one():
    pruned = search.search_plans("llama3-70b", "h100", **SIBLINGS)
    every = search.search_plans("llama3-70b", "h100", assume_monotone=False, **SIBLINGS)
    assert pruned.state_pruned > 0 and pruned.solves < every.solves == every.candidates
    assert (pruned.fits, pruned.pareto, pruned.notes, pruned.closest) == (every.fits, every.pareto, every.notes,
                                                                          every.closest)
