"""A prefetch item's lifecycle (`prefetch.item_state`, `lanes.Start`): every move the table
allows is taken, every other one raises and leaves the state as it was; ENDED is reachable from
every non-final state, DROPPED from every state before the fill started; both are final."""

from __future__ import annotations

import itertools

import pytest

from shardcache.prefetch.item_state import (
    FINAL,
    TRANSITIONS,
    IllegalMove,
    ItemState,
    check_move,
)
from shardcache.prefetch.lanes import Item, Start

ALLOWED = {
    (ItemState.SIZING, ItemState.WAITING),
    (ItemState.SIZING, ItemState.ADMITTED),
    (ItemState.SIZING, ItemState.STARTED),
    (ItemState.SIZING, ItemState.ENDED),
    (ItemState.SIZING, ItemState.DROPPED),
    (ItemState.WAITING, ItemState.ADMITTED),
    (ItemState.WAITING, ItemState.ENDED),
    (ItemState.WAITING, ItemState.DROPPED),
    (ItemState.ADMITTED, ItemState.STARTED),
    (ItemState.ADMITTED, ItemState.ENDED),
    (ItemState.ADMITTED, ItemState.DROPPED),
    (ItemState.STARTED, ItemState.ENDED),
}
EVERY_PAIR = list(itertools.product(ItemState, ItemState))
# The path from a new item to each state, through allowed moves only.
PATH_TO = {
    ItemState.SIZING: [],
    ItemState.WAITING: [ItemState.WAITING],
    ItemState.ADMITTED: [ItemState.WAITING, ItemState.ADMITTED],
    ItemState.STARTED: [ItemState.ADMITTED, ItemState.STARTED],
    ItemState.ENDED: [ItemState.ENDED],
    ItemState.DROPPED: [ItemState.DROPPED],
}


def _start_in(state: ItemState) -> Start:
    start = Start(Item("o", "k.tar"))
    for step in PATH_TO[state]:
        start.move(step)
    assert start.state is state
    return start


def test_the_table_is_the_one_written_here() -> None:
    table = {(old, new) for old, targets in TRANSITIONS.items() for new in targets}
    assert table == ALLOWED
    assert set(TRANSITIONS) == set(ItemState)


@pytest.mark.parametrize(("old", "new"), sorted(ALLOWED, key=str), ids=str)
def test_every_allowed_move_is_taken(old: ItemState, new: ItemState) -> None:
    start = _start_in(old)
    start.move(new)
    assert start.state is new
    assert check_move(old, new, "k") is new


@pytest.mark.parametrize(
    ("old", "new"), [pair for pair in EVERY_PAIR if pair not in ALLOWED], ids=str
)
def test_every_other_move_raises_and_changes_nothing(old: ItemState, new: ItemState) -> None:
    start = _start_in(old)
    with pytest.raises(IllegalMove, match=f"{old.name} -> {new.name} for /o/k.tar"):
        start.move(new)
    assert start.state is old


def test_ended_from_every_non_final_state_and_final_states_go_nowhere() -> None:
    for state in ItemState:
        if state in FINAL:
            assert TRANSITIONS[state] == frozenset()
        else:
            assert ItemState.ENDED in TRANSITIONS[state]


@pytest.mark.parametrize("state", list(ItemState), ids=str)
def test_drop_lets_go_only_an_item_whose_fill_has_not_started(state: ItemState) -> None:
    start = _start_in(state)
    assert start.is_owed is (state in {ItemState.SIZING, ItemState.WAITING})  # budget owed
    droppable = state in {ItemState.SIZING, ItemState.WAITING, ItemState.ADMITTED}
    assert start.drop() is droppable
    assert start.is_dropped is (droppable or state is ItemState.DROPPED)
    assert start.drop() is False  # dropped once at most
    assert not start.is_owed or not start.is_dropped
