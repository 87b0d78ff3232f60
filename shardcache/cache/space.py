"""The room the cache has, as arithmetic over figures the store gathers (statvfs, the index's
sizes): what start-up warns about, and whether an object could fit at all before anything is
evicted for it. Evicting for an object that cannot fit empties the cache and streams the
object through all the same. Pure: no I/O, no diskcache, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass

from shardcache.units import format_size


@dataclass(frozen=True, slots=True)
class Room:
    capacity_bytes: int  # --cache-size
    free_bytes: int  # on the filesystem, for an unprivileged writer
    entry_bytes: int  # the entries' files, with their per-entry overhead
    index_bytes: int  # the index's own files, with what its write-ahead log may grow to
    headroom_bytes: int  # kept free beyond a reservation, so the index stays writable


def startup_warnings(room: Room, directory: object) -> list[str]:
    """What to warn about at start: a bound larger than the filesystem has room for (free
    space plus what the cache holds), or one that the index by itself fills (then nothing can
    be cached). The entries cached already do not count against the second: a nearly full
    cache is no sign of a bound too small."""
    warnings = []
    held = room.entry_bytes + room.index_bytes
    if room.free_bytes + held < room.capacity_bytes:
        warnings.append(
            f"--cache-size {format_size(room.capacity_bytes)} is more than the "
            f"{format_size(room.free_bytes + held)} the filesystem under {directory} has room "
            f"for ({format_size(room.free_bytes)} free, {format_size(held)} already cached): "
            "the free space will bound the cache instead"
        )
    if room.capacity_bytes <= room.index_bytes + room.headroom_bytes:
        warnings.append(
            f"--cache-size {format_size(room.capacity_bytes)} is no more than the cache's "
            f"index takes by itself ({format_size(room.index_bytes + room.headroom_bytes)}): "
            "nothing can be cached; give it at least a few shards' worth"
        )
    return warnings


def cannot_fit(size_bytes: int, room: Room, reserved_bytes: int) -> str | None:
    """Why an object of `size_bytes` cannot be cached even if every entry were evicted, or
    None when evicting could make room. Asked before evicting anything for it."""
    if room.index_bytes + reserved_bytes + size_bytes > room.capacity_bytes:
        return (
            f"no room for {size_bytes} bytes: the bound is {room.capacity_bytes}, and the "
            f"index and fills under way hold {room.index_bytes + reserved_bytes}"
        )
    if room.free_bytes + room.entry_bytes < size_bytes + room.headroom_bytes:
        return (
            f"no room for {size_bytes} bytes: the filesystem has {room.free_bytes} free and "
            f"the cache's entries take {room.entry_bytes}; evicting them all would not do"
        )
    return None
