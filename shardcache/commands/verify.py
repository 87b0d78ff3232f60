"""`shardcache verify`: check every cached entry's length and digest, and the index against
the files. Offline it reads the cache directly (`cache.verify`); while a daemon holds the cache
it asks that daemon to check (`POST /_/verify`) and follows its tally, reporting the same way.
Exit 0: clean; 1: damage found; 2: cannot check (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from shardcache import config
from shardcache.errors import ShardcacheError
from shardcache.loader import client
from shardcache.printable import printable
from shardcache.units import format_size

_NOT_DROPPED = "NOT dropped: see the daemon's log"
VERIFY_STALL_S = 60.0  # a live verify whose daemon reports no progress this long is given up on


def add_parser(commands: Any) -> None:
    """Add `verify` to the subcommands `commands` (argparse's subparsers action)."""
    verify = commands.add_parser(
        "verify",
        help="check every cached shard against its digest (a running daemon's: through it)",
        description="Check each entry's length and digest, and the index against the files. "
        "While a daemon runs on the cache, it does the check at full speed and drops what is "
        "damaged (refetched on its next read). "
        "Exit 0: clean; 1: damage found (dropped with --repair); 2: cannot check.",
    )
    verify.add_argument(
        "--cache-dir", metavar="PATH", help="the cache to check (default: as `serve` would use)"
    )
    verify.add_argument("--config", metavar="FILE", help="TOML file to take --cache-dir from")
    verify.add_argument(
        "--repair", action="store_true", help="drop damaged entries, orphans and partial files"
    )
    verify.add_argument("--json", action="store_true", help="print the report as JSON")
    verify.add_argument(
        "--daemon",
        metavar="URL",
        help="the daemon running on the cache (default $SHARDCACHE_URL, else its --listen)",
    )


def run_verify(args: argparse.Namespace) -> int:
    """`shardcache verify`: check the cache offline, or through the daemon that holds it;
    print the report and return the exit status (0 clean, 1 damage, 2 cannot check)."""
    from tqdm import tqdm

    from shardcache.cache.verify import CacheInUse, total_bytes, verify_cache

    flags = {"cache_dir": args.cache_dir, "config": args.config}
    settings = config.load_settings(flags, os.environ)
    directory = settings.cache_dir
    show_progress = sys.stderr.isatty() and not args.json
    try:
        total = total_bytes(directory) if show_progress else 0
        with tqdm(
            total=total, unit="B", unit_scale=True, disable=not show_progress, leave=False
        ) as bar:
            report = verify_cache(directory, repair=args.repair, on_bytes=bar.update)
    except CacheInUse as exc:
        return _verify_live(args, directory, settings.listen, str(exc), show_progress)
    except ShardcacheError as exc:
        print(f"shardcache: error: cannot verify {directory}: {exc}", file=sys.stderr)
        if args.json:
            print(json.dumps({"directory": str(directory), "error": str(exc)}))
        return 2
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(
            f"{directory}: {report.entries} entries, {format_size(report.checked_bytes)} read; "
            f"{report.digest_checked} checked against a digest, {report.length_only} by length"
        )
        for problem in report.problems:
            print(f"  {problem.kind}: {problem.key + ': ' if problem.key else ''}{problem.detail}")
        if report.partial_files:
            done = "removed" if args.repair else "the daemon removes them at start"
            print(f"{len(report.partial_files)} partial files of interrupted fills ({done})")
        if report.problems:
            action = "dropped" if report.repaired else "run with --repair to drop them"
            count = len(report.problems)
            print(f"{count} problem{'s' if count > 1 else ''} found; {action}")
        else:
            print("no damage found")
    return 0 if report.is_clean else 1


def _verify_live(
    args: argparse.Namespace, directory: Path, listen: str, in_use: str, show_progress: bool
) -> int:
    """Ask the daemon that holds `directory` to check it (`POST /_/verify`), and report as
    the offline check does. Any failure is one line and exit 2."""
    from tqdm import tqdm

    host, _, port = listen.rpartition(":")
    host = "127.0.0.1" if host in ("0.0.0.0", "[::]") else host
    daemon = client.daemon_url(args.daemon, f"http://{host}:{port}")
    try:
        serving = Path(client.status(daemon)["cache"]["dir"])
        if serving.resolve() != directory.resolve():
            raise client.ClientError(f"the daemon at {daemon} serves {serving} (pass --daemon)")
        tally = client.verify(daemon)["verify"]
        progressed_at, checked = time.monotonic(), -1
        with tqdm(unit="B", unit_scale=True, disable=not show_progress, leave=False) as bar:
            while not tally["is_finished"]:
                if tally["checked_bytes"] != checked:
                    progressed_at, checked = time.monotonic(), tally["checked_bytes"]
                elif time.monotonic() - progressed_at > VERIFY_STALL_S:
                    raise client.ClientError(f"its check made no progress for {VERIFY_STALL_S} s")
                time.sleep(0.2)
                tally = client.verify_status(daemon)["verify"]
                bar.update(int(tally["checked_bytes"]) - bar.n)
        if tally.get("error"):
            raise client.ClientError(f"the daemon's check failed: {tally['error']}")
        damaged, skipped = int(tally["damaged"]), int(tally.get("skipped", 0))
        summary = (
            f"{directory} (checked by the daemon at {daemon}): {int(tally['entries'])} entries, "
            f"{format_size(int(tally['checked_bytes']))} read; {int(tally['digest_checked'])} "
            f"checked against a digest, {int(tally['length_only'])} by length"
        )
        problems = [
            f"  {problem['kind']}: {problem['key']}: {problem['detail']} "
            f"({'dropped' if problem['dropped'] else _NOT_DROPPED})"
            for problem in tally["problems"]
        ]
    except (client.ClientError, KeyError, TypeError, ValueError, OverflowError) as exc:
        reason = exc if isinstance(exc, client.ClientError) else client.not_understood(daemon, exc)
        message = f"cannot verify {directory}: {in_use}; asking it: {reason}"
        print(printable(f"shardcache: error: {message}"), file=sys.stderr)
        if args.json:
            print(json.dumps({"directory": str(directory), "error": str(reason)}))
        return 2
    if args.json:
        document = {"directory": str(directory), "daemon": daemon, **tally}
        print(json.dumps(document | {"clean": not damaged}, indent=2))
        return 1 if damaged else 2 if skipped else 0
    print(printable(summary))
    for line in problems:
        print(printable(line))
    if skipped:  # not damage, not checked either: say so, and do not call the cache clean
        print(f"{skipped} could not be read now (not damage; the daemon's log says why)")
    print(f"{damaged} damaged, dropped: refetched on next read" if damaged else "no damage found")
    return 1 if damaged else 2 if skipped else 0
