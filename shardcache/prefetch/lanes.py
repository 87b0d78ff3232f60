"""What the prefetch queue holds: batches (one post's work), items, and the lanes they wait in.

A lane's pending entries are tuples of atoms only (floats, ints, strings, bools), which the
garbage collector stops tracking, naming their batch by id: 200,000 queued keys must not be
objects every full collection walks on the event loop. Knows nothing of fills or the budget."""

from __future__ import annotations

import asyncio
import heapq
import operator
from collections.abc import Callable
from dataclasses import dataclass, field

from shardcache.cache.unread import Hold
from shardcache.prefetch.item_state import BEFORE_ADMISSION, TRANSITIONS, ItemState, check_move

NO_BATCH = 0  # the batch id of an entry no post made (read-ahead); batch ids start at 1


@dataclass
class Batch:
    """One POST's worth of work, so `shardcache prefetch --wait` can follow its own progress.

    It stays in the queue's table while it is unfinished (`total` counts each entry of it still
    pending), so an entry's batch id always finds it."""

    id: int
    total: int
    is_warming: bool = False
    done: int = 0
    failed: int = 0
    not_cached: int = 0  # done, but streamed through: larger than the cache, or no room
    bytes_done: int = 0
    failures: list[dict[str, str]] = field(default_factory=list)
    pinned: set[str] = field(default_factory=set)  # look-ahead: its shards pinned until read

    @property
    def is_finished(self) -> bool:
        return self.done + self.failed >= self.total

    def as_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "total": self.total,
            "done": self.done,
            "failed": self.failed,
            "bytes_done": self.bytes_done,
            "failures": self.failures,
            "is_finished": self.is_finished,
            "warm": self.is_warming,
            "not_cached": self.not_cached,
        }


@dataclass(frozen=True, slots=True)
class Item:
    """A key a dispatcher took from its lane, on its way to a fill."""

    origin: str
    key: str
    batch: Batch | None = None
    is_readahead: bool = False

    @property
    def is_warming(self) -> bool:
        return self.batch is not None and self.batch.is_warming


# A pending key, a lane's heap entry: (deadline, order, origin, key, batch id, is read-ahead),
# `heapq` ordering it by (deadline, order) (`order` is unique: ties between deadlines go to the
# earlier post; the batch id is NO_BATCH for read-ahead). A plain tuple: a NamedTuple is a tuple
# subclass, and the collector untracks exact tuples only.
PendingKey = tuple[float, int, str, str, int, bool]


# The (origin, key) an entry names, and its batch id: C-level getters, for 200,000 entries at once.
entry_key: Callable[[PendingKey], tuple[str, str]] = operator.itemgetter(2, 3)
entry_batch: Callable[[PendingKey], int] = operator.itemgetter(4)


@dataclass(eq=False)
class Start:
    """One item on its way from the queue to a fill: sized, admitted, started (`item_state`)."""

    item: Item
    state: ItemState = ItemState.SIZING
    hold: Hold | None = None  # look-ahead budget it holds until its fill pins the shard
    size_bytes: int | None = None  # once its HEAD has answered

    def move(self, new: ItemState) -> None:
        """Move to `new`; raise IllegalMove where the transition table has no such move."""
        self.state = check_move(self.state, new, f"/{self.item.origin}/{self.item.key}")

    def drop(self) -> bool:
        """Let the item go, uncounted, unless it was dropped already or its fill started;
        return whether it was dropped now."""
        if ItemState.DROPPED not in TRANSITIONS[self.state]:
            return False
        self.state = ItemState.DROPPED
        return True

    @property
    def is_dropped(self) -> bool:
        return self.state is ItemState.DROPPED

    @property
    def is_owed(self) -> bool:
        """Taken and not admitted yet (sized or not): the budget still owes it room."""
        return self.state in BEFORE_ADMISSION


class Lane:
    """One dispatcher's queue, earliest deadline first (warming: in the order posted). Look-ahead
    items may wait for the budget; warming items never do, and have a lane of their own so that
    they never wait behind one that does."""

    def __init__(self, is_warming: bool) -> None:
        self.is_warming = is_warming
        self.pending: list[PendingKey] = []  # a heap
        self.starting: dict[Start, None] = {}  # items being sized (HEAD) or admitted, in order
        self.busy = 0  # slots its items hold: each lane has the limit to itself
        self.has_work = asyncio.Event()

    def push(self, entry: PendingKey) -> None:
        heapq.heappush(self.pending, entry)
        self.has_work.set()

    def pop(self) -> PendingKey:
        return heapq.heappop(self.pending)

    def keep_only(self, keep: Callable[[PendingKey], bool] | None) -> list[PendingKey]:
        """Drop the pending entries `keep` refuses (every one when `keep` is None); return
        them."""
        if keep is None:
            dropped, self.pending = self.pending, []
            return dropped
        dropped = [entry for entry in self.pending if not keep(entry)]
        if dropped:
            self.pending = [entry for entry in self.pending if keep(entry)]
            heapq.heapify(self.pending)
        return dropped
