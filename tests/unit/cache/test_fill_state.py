"""A fill's lifecycle table (`cache.fill_state`): what `Fill` is allowed to do, checked pure."""

from __future__ import annotations

import itertools

import pytest

from shardcache.cache.fill_state import (
    TRANSITIONS,
    FillState,
    IllegalTransition,
    check_transition,
)

FINAL = {FillState.COMMITTED, FillState.DISCARDED, FillState.PASSTHROUGH, FillState.FAILED}


@pytest.mark.parametrize(("old", "new"), list(itertools.product(FillState, FillState)))
def test_each_pair_is_allowed_exactly_when_the_table_says(old: FillState, new: FillState) -> None:
    if new in TRANSITIONS[old]:
        assert check_transition(old, new, "k.tar") is new
    else:
        with pytest.raises(IllegalTransition, match=f"{old.name} -> {new.name} for k.tar"):
            check_transition(old, new, "k.tar")


def test_failed_is_reachable_from_every_state_that_is_not_final() -> None:
    """No failure can strand a fill half way (`cache.fill_state`'s docstring)."""
    for state in set(FillState) - FINAL:
        assert FillState.FAILED in TRANSITIONS[state], state
    for state in FINAL:
        assert TRANSITIONS[state] == frozenset(), state


def test_a_committed_fill_was_verified_first() -> None:
    """Only VERIFIED leads to COMMITTED: nothing unverified is ever indexed."""
    assert [s for s in FillState if FillState.COMMITTED in TRANSITIONS[s]] == [FillState.VERIFIED]


def test_the_state_predicates_follow_the_table() -> None:
    """What `Fill`'s users ask of its state (`fill.state.is_final`, ...) is the table's answer."""
    assert {s for s in FillState if s.is_final} == FINAL
    assert {s for s in FillState if s.is_fetching} == {FillState.STARTING, FillState.FILLING}
    complete = {FillState.VERIFIED, FillState.COMMITTED, FillState.DISCARDED}
    assert {s for s in FillState if s.is_body_complete} == complete
