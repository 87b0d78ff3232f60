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
        "--dry-run", action="store_true", help="list what would be purged; purge nothing"
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
    shown, total, now = 0, 0, time.time()
    for origin in origins:
        for entry in _entries(origin, args.pattern, daemon):
            if shown == 0 and not args.json:  # after the first answer: an error comes alone
                print(_HEADER)
            if args.limit and shown == args.limit:
                print(
                    f"shardcache: showed the first {shown} entries (--limit); more are cached: "
                    "--limit 0 shows all",
                    file=sys.stderr,
                )
                return 0
            _show(origin, entry, args.json, now)
            shown, total = shown + 1, total + int(entry["size_bytes"])
    print(f"{shown} entries, {format_size(total)}", file=sys.stderr)
    return 0


def run_purge(args: argparse.Namespace, daemon: str) -> int:
    with client.reading_answer(daemon):  # the pages are the daemon's answers
        return _purge(args, daemon)


def _purge(args: argparse.Namespace, daemon: str) -> int:
    origin, pattern = args.origin_name, args.pattern
    if args.dry_run:
        count, total, now = 0, 0, time.time()
        for entry in _entries(origin, pattern, daemon):
            if count == 0:
                print(_HEADER)
            _show(origin, entry, False, now)
            count, total = count + 1, total + int(entry["size_bytes"])
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


_HEADER = f"{'SIZE':>10}  {'AGE':>6}  {'READ':>8}  {'VERIFIED AGAINST':<28}  {'PINNED':<15}  KEY"


def _show(origin: str, entry: dict[str, Any], as_json: bool, now: float) -> None:
    if as_json:
        print(json.dumps({"origin": origin, **entry}))
        return
    verified = printable(", ".join(entry["verified_by"]) or "-")
    pinned = printable(", ".join(entry["pinned_by"]) or "-")
    print(
        f"{format_size(entry['size_bytes']):>10}  {_ago(entry['age_s']):>6}  "
        f"{_ago(now - entry['read_at']) + ' ago':>8}  {verified:<28}  {pinned:<15}  "
        f"{printable(origin)}/{printable(entry['key'])}"
    )


def _ago(seconds: float) -> str:
    """`45s`, `12m`, `3h`, `2d`: how long ago, to the unit that matters."""
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _entries_count(count: int) -> str:
    return f"{count} entry" if count == 1 else f"{count} entries"
