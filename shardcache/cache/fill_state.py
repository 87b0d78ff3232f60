"""The lifecycle of a `Fill` (`fill`): its states and the transitions between them.

Lifecycle (an illegal transition raises; FAILED, PASSTHROUGH, COMMITTED, DISCARDED are final):

    STARTING ──► FILLING ──► VERIFIED ──► COMMITTED     indexed: later requests are hits
        │           │            ├──────► DISCARDED     verified, not indexed (cannot be, or purged)
        │           │            └──────► FAILED        a bug while committing
        │           └──────────────────► FAILED        origin/verification/disk failure
        ├──────────────────────────────► FAILED        failed before the first byte
        └──────────────────────────────► PASSTHROUGH   not cacheable: the starter streams it

FAILED is reachable from every non-final state, so no failure can strand a fill (or its file
descriptor) half way.
"""

from __future__ import annotations

import enum


class FillState(enum.Enum):
    STARTING = "starting"
    FILLING = "filling"
    VERIFIED = "verified"
    COMMITTED = "committed"
    DISCARDED = "discarded"
    PASSTHROUGH = "passthrough"
    FAILED = "failed"

    @property
    def is_final(self) -> bool:
        """No transition leaves it: the fill's `run` is over, or about to be."""
        return not TRANSITIONS[self]

    @property
    def is_body_complete(self) -> bool:
        """Every byte is on disk and verified (VERIFIED, COMMITTED or DISCARDED)."""
        return self in BODY_COMPLETE

    @property
    def is_fetching(self) -> bool:
        """The body is still to come from the origin (STARTING or FILLING)."""
        return self in (FillState.STARTING, FillState.FILLING)


TRANSITIONS: dict[FillState, frozenset[FillState]] = {
    FillState.STARTING: frozenset({FillState.FILLING, FillState.PASSTHROUGH, FillState.FAILED}),
    FillState.FILLING: frozenset({FillState.VERIFIED, FillState.FAILED}),
    FillState.VERIFIED: frozenset({FillState.COMMITTED, FillState.DISCARDED, FillState.FAILED}),
    FillState.COMMITTED: frozenset(),
    FillState.DISCARDED: frozenset(),
    FillState.PASSTHROUGH: frozenset(),
    FillState.FAILED: frozenset(),
}
BODY_COMPLETE = frozenset({FillState.VERIFIED, FillState.COMMITTED, FillState.DISCARDED})


class IllegalTransition(RuntimeError):
    pass


def check_transition(old: FillState, new: FillState, what: str) -> FillState:
    """Return `new` if the table allows `old -> new`; raise IllegalTransition (naming `what`,
    the fill's key) if not: a fill that breaks its lifecycle stops at once, loudly."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransition(f"{old.name} -> {new.name} for {what}")
    return new


__all__ = ["BODY_COMPLETE", "TRANSITIONS", "FillState", "IllegalTransition", "check_transition"]
