"""The lifecycle of a prefetch item from its lane to its fill (`lanes.Start`): states and moves.

ENDED (counted once) is reachable from every non-final state, DROPPED (let go, uncounted) from
every state before its fill started; both are final, and an illegal move raises, as a fill's
lifecycle does (`cache.fill_state`)."""

from __future__ import annotations

import enum


class ItemState(enum.Enum):
    SIZING = "sizing"  # taken from its lane: asked whether it is still wanted, its HEAD out
    WAITING = "waiting"  # sized: waits for room in the look-ahead budget
    ADMITTED = "admitted"  # holds its budget (warming needs none): its fill about to start
    STARTED = "started"  # its fill started, or one in flight joined: followed to its end
    ENDED = "ended"  # counted: done, fetched, failed, cached or not admitted
    DROPPED = "dropped"  # cleared or unwanted before its fill started: let go, uncounted


#   SIZING ──► WAITING ──► ADMITTED ──► STARTED ──► ENDED
#   SIZING ──► ADMITTED             room at once, or warming (no budget)
#   SIZING ──► STARTED              a fill in flight joined when sized
#   any state not final ──► ENDED   cached, not admitted, or a failure: counted
#   SIZING, WAITING, ADMITTED ──► DROPPED   cleared, or no loader will read it
TRANSITIONS: dict[ItemState, frozenset[ItemState]] = {
    ItemState.SIZING: frozenset(
        {
            ItemState.WAITING,
            ItemState.ADMITTED,
            ItemState.STARTED,
            ItemState.ENDED,
            ItemState.DROPPED,
        }
    ),
    ItemState.WAITING: frozenset({ItemState.ADMITTED, ItemState.ENDED, ItemState.DROPPED}),
    ItemState.ADMITTED: frozenset({ItemState.STARTED, ItemState.ENDED, ItemState.DROPPED}),
    ItemState.STARTED: frozenset({ItemState.ENDED}),
    ItemState.ENDED: frozenset(),
    ItemState.DROPPED: frozenset(),
}
FINAL = frozenset({ItemState.ENDED, ItemState.DROPPED})
BEFORE_ADMISSION = frozenset({ItemState.SIZING, ItemState.WAITING})  # owed budget, not held


class IllegalMove(RuntimeError):
    pass


def check_move(old: ItemState, new: ItemState, what: str) -> ItemState:
    """Return `new` if the table allows `old -> new`; raise IllegalMove (naming `what`, the
    item's origin and key) if not."""
    if new not in TRANSITIONS[old]:
        raise IllegalMove(f"{old.name} -> {new.name} for {what}")
    return new


__all__ = ["BEFORE_ADMISSION", "FINAL", "TRANSITIONS", "IllegalMove", "ItemState", "check_move"]
