"""The transient area: look-ahead prefetches held under admission until they are read once.

This object only keeps the books (bytes held and reserved, which entries were read, what was
kept and dropped); the store decides, under its lock. `unpinned` runs on the event loop without
that lock: its set and dict operations are atomic under the GIL."""

from __future__ import annotations


class TransientArea:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.area_bytes = 0  # what ordinary fills leave free now
        self.kept = 0  # read once, then admitted as ordinary entries
        self.dropped = 0  # read once, then dropped: no room without evicting in-use entries
        self._entries: dict[str, int] = {}  # committed look-ahead entries → size
        self._read: set[str] = set()  # of those, read once: settled at the next reservation
        self._reserved_bytes = 0

    def held_bytes(self) -> int:
        """Look-ahead entries held (unread, or read and not yet settled) and being filled."""
        return sum(self._entries.values()) + self._reserved_bytes

    def free_bytes(self) -> int:
        """The part of the area transient entries do not use now."""
        return max(0, self.area_bytes - self.held_bytes())

    def holds(self, key: str) -> bool:
        return key in self._entries

    def reserved(self, size_bytes: int) -> None:
        """A transient fill reserved `size_bytes`: the area grows to cover it, up to its cap."""
        self._reserved_bytes += size_bytes
        self.area_bytes = min(self.max_bytes, max(self.area_bytes, self.held_bytes()))

    def released(self, size_bytes: int) -> None:
        self._reserved_bytes -= size_bytes

    def committed(self, key: str, size_bytes: int) -> None:
        """A transient fill committed: hold it until it is read (`unpinned`)."""
        self._entries[key] = size_bytes

    def unpinned(self, key: str) -> None:
        """`key` was read (its pin dropped): settle it at the next reservation."""
        if key in self._entries:
            self._read.add(key)

    def forget(self, key: str) -> None:
        """`key` left the cache."""
        self._entries.pop(key, None)
        self._read.discard(key)

    def take_read(self) -> str | None:
        """Stop counting one read entry as transient and return its key, for the store to keep
        or drop; None when none is left to settle."""
        while self._read:
            key = self._read.pop()
            if self._entries.pop(key, None) is not None:
                return key
        return None
