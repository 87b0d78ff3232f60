"""`shardcache ls` and `shardcache purge`: what a running daemon caches, and dropping it.

Both ask the daemon (`GET` and `DELETE /_/cache`, the admin token as every command sends it)
rather than reading the cache dir: the pins live in the daemon, and a purge must go through
the cache that serves the entries. The daemon answers a page at a time from a bounded scan of
its index; these commands follow the `next` cursor, so a huge cache streams out in pages.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from typing import Any

from shardcache.loader import client
from shardcache.printable import printable
from shardcache.units import format_size

PAGE = 1000  # entries asked per request (the daemon's most)
DEFAULT_LIMIT = 1000


def add_parsers(commands: Any) -> None:
    """Add `ls` and `purge` to the subcommands `commands` (argparse's subparsers action)."""
    ls = commands.add_parser(
        "ls",
        help="list what the running daemon caches",
        description="List cached entries: size, age (since stored), last read, what each was "
        "verified against, and what pins it (look-ahead: prefetched, unread; plan: a loader's "
        "plan reads it soon). PATTERN is a glob over keys ('*' matches '/' too).",
    )
    # dest `origin_name`: `origin` is the --origin flag's, which `cli` reads as NAME=URL
    ls.add_argument("origin_name", nargs="?", metavar="ORIGIN", help="one origin (default: all)")
    ls.add_argument("pattern", nargs="?", default="*", metavar="PATTERN", help="default '*'")
    ls.add_argument(
        "--limit",
        type=_count,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N entries (default {DEFAULT_LIMIT}; 0: all)",
    )
    ls.add_argument("--json", action="store_true", help="one JSON object per entry and line")
    _add_daemon_arguments(ls)

    purge = commands.add_parser(
        "purge",
        help="drop cached entries of an origin whose keys match a glob",
        description="Purge the entries `shardcache ls ORIGIN PATTERN` lists, through the "
        "running daemon (a client reading one finishes its read; the next read refetches), "
        "and the fills of matching keys in flight (their readers finish; nothing is kept).",
    )
    purge.add_argument("origin_name", metavar="ORIGIN")
    purge.add_argument("pattern", metavar="PATTERN", help="a glob over keys; '*' for all")
    purge.add_argument(
        "--dry-run",
        action="store_true",
        help="list the entries it would purge (not the fills in flight it reaches); purge nothing",
    )
    _add_daemon_arguments(purge)


def _add_daemon_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--daemon",
        metavar="URL",
        help=f"the daemon (default $SHARDCACHE_URL or {client.DEFAULT_DAEMON_URL})",
    )
    parser.add_argument(
        "--config", metavar="FILE", help="ask the daemon this TOML file's `listen` names"
    )


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text[:40]!r}")
    return int(text)


def run_ls(args: argparse.Namespace, daemon: str) -> int:
    with client.reading_answer(daemon):  # entries are the daemon's answers, read as they come
        return _ls(args, daemon)


def _ls(args: argparse.Namespace, daemon: str) -> int:
    origins = [args.origin_name] if args.origin_name else sorted(client.origins(daemon))
    shown, total = 0, 0
    table = _Table(time.time(), as_json=args.json)
    for origin in origins:
        for entry in _entries(origin, args.pattern, daemon):
            if args.limit and shown == args.limit:
                table.flush()
                print(
                    f"shardcache: showed the first {shown} entries (--limit); more are cached: "
                    "--limit 0 shows all",
                    file=sys.stderr,
                )
                return 0
            table.add(origin, entry)
            shown, total = shown + 1, total + int(entry["size_bytes"])
    table.flush()
    print(f"{_entries_count(shown)}, {format_size(total)}", file=sys.stderr)
    return 0


def run_purge(args: argparse.Namespace, daemon: str) -> int:
    with client.reading_answer(daemon):  # the pages are the daemon's answers
        return _purge(args, daemon)


def _purge(args: argparse.Namespace, daemon: str) -> int:
    origin, pattern = args.origin_name, args.pattern
    if args.dry_run:
        count, total = 0, 0
        table = _Table(time.time(), as_json=False)
        for entry in _entries(origin, pattern, daemon):
            table.add(origin, entry)
            count, total = count + 1, total + int(entry["size_bytes"])
        table.flush()
        print(
            f"would purge {_entries_count(count)} ({format_size(total)}) of origin {origin} "
            f"matching {pattern!r}; nothing purged (--dry-run)",
            file=sys.stderr,
        )
        return 0
    count, total, not_kept, after = 0, 0, 0, ""
    while True:
        answer = client.purge_cached(origin, pattern, after, daemon)
        count, total = count + len(answer["deleted"]), total + int(answer["deleted_bytes"])
        not_kept += len(answer.get("fills_not_kept", ()))  # absent from an older daemon's
        if not answer["next"]:
            break
        after = _advanced(answer["next"], after, daemon)
    print(
        f"purged {_entries_count(count)} ({format_size(total)}) of origin {origin} "
        f"matching {pattern!r}" + _not_kept(not_kept)
    )
    return 0


def _not_kept(fills: int) -> str:
    """What a purge says of the fills in flight it reached (nothing when none)."""
    if not fills:
        return ""
    if fills == 1:
        return "; 1 fill in flight finishes for its readers and is not kept"
    return f"; {fills} fills in flight finish for their readers and are not kept"


def _entries(origin: str, pattern: str, daemon: str) -> Iterator[dict[str, Any]]:
    """Every entry of `origin` matching `pattern`, a page per request."""
    after = ""
    while True:
        page = client.cached(origin, pattern, after, PAGE, daemon)
        yield from page["entries"]
        if not page["next"]:
            return
        after = _advanced(page["next"], after, daemon)


def _advanced(cursor: object, after: str, daemon: str) -> str:
    """The `next` cursor of a page, which must come after the one asked with: the daemon
    pages in key order, and a cursor that does not advance would page forever."""
    if not isinstance(cursor, str) or cursor <= after:
        raise client.not_understood(
            daemon, f"a `next` cursor that does not advance ({cursor!r} after {after!r})"
        )
    return cursor


# The text columns grow from their least width to the widest value of the first page shown,
# up to their most; a wider value (a later page's, or past the most) ends in "…" (`--json`
# has every value whole).
VERIFIED_MIN_CHARS, VERIFIED_MAX_CHARS = 28, 64
PINNED_MIN_CHARS, PINNED_MAX_CHARS = 15, 32


class _Table:
    """`ls` rows with their columns in line: the first page of entries is held until its
    widest "verified against" and "pinned" values are known, then the header and the rows
    print, and later rows keep those widths. With `as_json`, one JSON object per entry."""

    def __init__(self, now: float, as_json: bool) -> None:
        self._now = now
        self._as_json = as_json
        self._held: list[tuple[str, dict[str, Any]]] = []
        self._widths: tuple[int, int] | None = None

    def add(self, origin: str, entry: dict[str, Any]) -> None:
        if self._as_json:
            print(json.dumps({"origin": origin, **entry}))
        elif self._widths is not None:
            self._print(origin, entry)
        else:
            self._held.append((origin, entry))
            if len(self._held) >= PAGE:
                self.flush()

    def flush(self) -> None:
        """Print what is held (the header first, once there is an entry to show)."""
        if self._as_json or not self._held:
            return
        if self._widths is None:
            texts = [_texts(entry) for _, entry in self._held]
            verified = max([VERIFIED_MIN_CHARS, *(len(v) for v, _ in texts)])
            pinned = max([PINNED_MIN_CHARS, *(len(p) for _, p in texts)])
            self._widths = (min(verified, VERIFIED_MAX_CHARS), min(pinned, PINNED_MAX_CHARS))
            print(
                f"{'SIZE':>10}  {'AGE':>6}  {'READ':>8}  {'VERIFIED AGAINST':<{self._widths[0]}}"
                f"  {'PINNED':<{self._widths[1]}}  KEY"
            )
        for origin, entry in self._held:
            self._print(origin, entry)
        self._held = []

    def _print(self, origin: str, entry: dict[str, Any]) -> None:
        assert self._widths is not None
        verified_width, pinned_width = self._widths
        verified, pinned = _texts(entry)
        print(
            f"{format_size(entry['size_bytes']):>10}  {_ago(entry['age_s']):>6}  "
            f"{_ago(self._now - entry['read_at']) + ' ago':>8}  "
            f"{_fit(verified, verified_width):<{verified_width}}  "
            f"{_fit(pinned, pinned_width):<{pinned_width}}  "
            f"{printable(origin)}/{printable(entry['key'])}"
        )


def _texts(entry: dict[str, Any]) -> tuple[str, str]:
    """An entry's "verified against" and "pinned" columns, printable."""
    return (
        printable(", ".join(entry["verified_by"]) or "-"),
        printable(", ".join(entry["pinned_by"]) or "-"),
    )


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _ago(seconds: float) -> str:
    """`45s`, `12m`, `3h`, `2d`: how long ago, to the unit that matters."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _entries_count(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"
