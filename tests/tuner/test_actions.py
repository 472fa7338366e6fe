"""Masks: no action may oversubscribe the CPU budget, starve an operator, or grow past the memory limit."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from dlrm_platform.tuner.actions import (
    K_MAX,
    N_ACTIONS,
    action_mask,
    apply_action,
    grow_tied_pair,
    is_feasible,
    project,
    used_cpus,
    vetoed_actions,
)
from dlrm_platform.tuner.spec import OpSpec, TunerSpec

SPECS = [OpSpec("read", 1.0), OpSpec("parse", 0.5), OpSpec("hash", 2.0)]


def test_every_masked_in_action_stays_feasible():
    budget = 8.0
    for n in itertools.product(range(1, 6), range(1, 8), range(1, 4)):
        alloc = dict(zip(["read", "parse", "hash"], n))
        if not is_feasible(alloc, SPECS, budget):
            continue
        caps = {"read": 10.0 * n[0], "parse": 3.0 * n[1], "hash": 7.0 * n[2]}
        mask = action_mask(alloc, SPECS, budget, capacities=caps)
        assert mask[0]
        for a in np.flatnonzero(mask):
            new = apply_action(int(a), alloc, SPECS, budget, caps)
            assert is_feasible(new, SPECS, budget), (alloc, a, new)
            assert used_cpus(new, SPECS) <= budget + 1e-9


def test_grow_takes_from_the_op_with_most_spare_capacity_when_the_budget_is_full():
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0)]
    alloc = {"a": 2, "b": 2, "c": 2}
    caps = {"a": 100.0, "b": 10.0, "c": 50.0}
    new = apply_action(2, alloc, specs, 6.0, caps)  # +1 b
    assert new == {"a": 1, "b": 3, "c": 2}


def test_cannot_starve_an_operator_below_its_minimum():
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0)]
    alloc = {"a": 1, "b": 1}
    mask = action_mask(alloc, specs, 2.0)
    assert not mask[1] and not mask[2]          # no free CPU, no donor above minimum
    assert not mask[1 + K_MAX] and not mask[2 + K_MAX]  # cannot go below 1
    assert apply_action(1 + K_MAX, alloc, specs, 2.0) == alloc


def test_memory_limit_masks_growth_but_a_slot_may_move_downstream():
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0)]
    alloc = {"a": 1, "b": 1, "c": 1}
    mask = action_mask(alloc, specs, 8.0, mem_fraction=1.05)  # 5 CPUs free, none may be taken
    assert mask[0] and not mask[1:1 + K_MAX].any()
    alloc = {"a": 3, "b": 2, "c": 1}
    mask = action_mask(alloc, specs, 8.0, mem_fraction=1.05)
    assert mask[1 + K_MAX]  # shrinking is still allowed
    assert not mask[1] and mask[2] and mask[3]  # a has nothing upstream; b and c may take a's (or b's) slot
    caps = {"a": 300.0, "b": 100.0, "c": 50.0}
    assert apply_action(2, alloc, specs, 8.0, caps, memory_bound=True) == {"a": 2, "b": 3, "c": 1}
    assert apply_action(3, alloc, specs, 8.0, caps, memory_bound=True) == {"a": 2, "b": 2, "c": 2}
    assert apply_action(3, alloc, specs, 8.0, caps) == {"a": 3, "b": 2, "c": 2}  # below the limit: a free CPU


def test_padded_operators_are_masked():
    mask = action_mask({"a": 1}, [OpSpec("a", 1.0)], 4.0)
    assert mask.shape == (N_ACTIONS,)
    assert not mask[2:1 + K_MAX].any() and not mask[2 + K_MAX:].any()


def test_project_repairs_an_oversubscribed_allocation():
    out = project({"read": 10, "parse": 10, "hash": 10}, SPECS, 8.0, {"read": 5.0, "parse": 50.0, "hash": 1.0})
    assert is_feasible(out, SPECS, 8.0)
    out = project({"read": 0, "parse": -3, "hash": 1}, SPECS, 8.0)
    assert out["read"] == 1 and out["parse"] == 1


def test_spec_rejects_minimums_over_budget_and_unknown_policy():
    with pytest.raises(ValueError, match="minimum allocation"):
        TunerSpec("x", "static", 1.0, [OpSpec("a", 1.0), OpSpec("b", 1.0)])
    with pytest.raises(ValueError, match="unknown tuner policy"):
        TunerSpec("x", "magic", 4.0, [OpSpec("a", 1.0)])


def test_shield_vetoes_moves_the_measured_rates_call_harmful_or_useless():
    from dlrm_platform.tuner.actions import vetoed_actions

    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0)]
    alloc = {"a": 2, "b": 2, "c": 2}
    caps = {"a": 100.0, "b": 200.0, "c": 300.0}  # a is the bottleneck; c has the most to spare
    mask = action_mask(alloc, specs, 6.0, capacities=caps)
    bad = vetoed_actions(mask, alloc, specs, 6.0, caps, min_gain=0.02)
    plus, minus = (lambda k: 1 + k), (lambda k: 1 + K_MAX + k)
    assert not bad[0]                               # hold is never vetoed
    assert not bad[plus(0)]                         # +1 a (from c): the bottleneck 100 -> 150
    assert bad[plus(1)]                             # +1 b: a stays at 100, no gain
    assert bad[minus(0)]                            # -1 a: the bottleneck drops to 50
    assert not bad[minus(2)]                        # -1 c: 150 left, the bottleneck is unchanged
    # at a balanced allocation nothing the linear model can see helps: the shield leaves only hold
    even = {"a": 2, "b": 2, "c": 2}
    flat = {"a": 200.0, "b": 200.0, "c": 200.0}
    bad = vetoed_actions(action_mask(even, specs, 6.0, capacities=flat), even, specs, 6.0, flat)
    assert bad[1:1 + 3].all() and bad[1 + K_MAX:1 + K_MAX + 3].all()
    # no measurement yet: nothing to judge by, nothing vetoed
    none = {"a": None, "b": None, "c": None}
    assert not vetoed_actions(mask, alloc, specs, 6.0, none).any()


def test_a_donor_past_its_measured_limit_gives_slots_down_to_it_at_no_cost():
    """Live, storage_saturated's read at 5 slots past its limit of 4 read ~9,900 samples/s at both counts; on
    the linear model its fifth slot was a fifth of its capacity, so "+1 hash" (the bottleneck at 8,900, its
    only donor the read) predicted a loss and the shield held the hash for 12 s. Past its limit the read runs
    no faster than at the limit: the slot costs nothing and the move gains 12%."""
    from dlrm_platform.tuner.actions import grow_while_it_pays, predicted_bottleneck, scaled_capacity, vetoed_actions

    assert scaled_capacity(10_000.0, 5, 4) == 8_000.0  # linear
    assert scaled_capacity(10_000.0, 5, 4, limit=4) == 10_000.0  # flat past the limit
    assert scaled_capacity(10_000.0, 5, 2, limit=4) == 5_000.0  # linear below it
    assert scaled_capacity(10_000.0, 4, 5, limit=4) == 12_500.0  # at or below its limit: linear as before
    specs = [OpSpec("read", 1.0), OpSpec("hash", 1.0)]
    alloc = {"read": 5, "hash": 4}
    caps = {"read": 10_000.0, "hash": 8_900.0}
    mask = action_mask(alloc, specs, 9.0, capacities=caps)
    plus_hash = 2
    assert vetoed_actions(mask, alloc, specs, 9.0, caps, min_gain=0.05)[plus_hash]
    limits = {"read": 4}
    assert not vetoed_actions(mask, alloc, specs, 9.0, caps, min_gain=0.05, limits=limits)[plus_hash]
    after = {"read": 4, "hash": 5}
    assert predicted_bottleneck(alloc, caps, after, limits) == pytest.approx(10_000.0)
    # the move stops where the read, at its limit, binds: a second slot would cost the read a quarter
    assert grow_while_it_pays(plus_hash, alloc, specs, 9.0, caps, max_slots=4, limits=limits) == after


def test_two_operators_tied_at_the_bottleneck_grow_together():
    """a and b both at 800 samples/s: a slot more for either leaves the other binding, so the shield vetoes
    each "+1"; one more for each (from c, which has slack) raises the bottleneck to 900."""
    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0)]
    alloc = {"a": 8, "b": 4, "c": 4}
    caps = {"a": 800.0, "b": 805.0, "c": 3200.0}
    assert vetoed_actions(action_mask(alloc, specs, 16.0), alloc, specs, 16.0, caps)[1:3].all()
    new, first, second = grow_tied_pair(alloc, specs, 16.0, caps, {"a", "b", "c"})
    assert (first, second) == ("a", "b") and new == {"a": 9, "b": 5, "c": 2}
    assert grow_tied_pair(alloc, specs, 16.0, caps, {"a", "c"}) is None  # b may not grow (limit, unmeasured)
    assert grow_tied_pair(alloc, specs, 16.0, {**caps, "b": 1000.0}, {"a", "b", "c"}) is None  # no tie: "+1 a" pays
    assert grow_tied_pair(alloc, specs, 16.0, {**caps, "c": 900.0}, {"a", "b", "c"}) is None  # no donor with slack


def test_a_grown_move_carries_on_to_the_next_bottlenecks_while_it_pays():
    """a grew 4 -> 5 (100 samples/s a slot: 500), tied with b at 500, c at 520 close behind. The chain gives
    a and b a slot each (together they raise the bottleneck), then c, a, b, from d's slack, while the
    predicted bottleneck rises, until d would bind; it stops where an operator may grow no further, and
    keeps nothing a stretch of which did not pay."""
    from dlrm_platform.tuner.actions import grow_next_bottlenecks, predicted_bottleneck

    specs = [OpSpec("a", 1.0), OpSpec("b", 1.0), OpSpec("c", 1.0), OpSpec("d", 1.0)]
    alloc = {"a": 4, "b": 4, "c": 4, "d": 8}
    caps = {"a": 400.0, "b": 500.0, "c": 520.0, "d": 4000.0}
    grown = {"a": 5, "b": 4, "c": 4, "d": 7}
    most = {"a": 8, "b": 8, "c": 8, "d": 16}
    new, chain = grow_next_bottlenecks(alloc, grown, specs, 20.0, caps, most, max_slots=6)
    assert chain == ["a", "b", "c", "a", "b"]
    assert new == {"a": 7, "b": 6, "c": 5, "d": 2} and used_cpus(new, specs) <= 20.0  # from d's slack
    assert predicted_bottleneck(alloc, caps, new) >= 1.02 * predicted_bottleneck(alloc, caps, grown)
    # b may not grow (a limit, or not measured steady): the chain stops at it, and a alone paid nothing more
    assert grow_next_bottlenecks(alloc, grown, specs, 20.0, caps, {**most, "b": 4}, max_slots=6) == (grown, [])
    # no slack anywhere: a donor would bind at once
    tight = {**caps, "d": 700.0}
    assert grow_next_bottlenecks(alloc, grown, specs, 20.0, tight, most, max_slots=6) == (grown, [])
    # at most max_slots in all
    assert len(grow_next_bottlenecks(alloc, grown, specs, 20.0, caps, most, max_slots=2)[1]) <= 2
