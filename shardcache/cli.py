"""The command line: `serve`, `demo`, `url`, `prefetch` and `stats` here; `ls`, `purge`, `check`,
`verify` and following a prefetch batch in `commands/` (this module builds the parser and
dispatches). A bad setting, a mistyped option or an unreachable daemon prints one line on
stderr and exits 2, never a traceback; what a daemon or origin says is printed escaped."""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from shardcache import __version__, config
from shardcache.commands import arguments, batch_progress, cached, check, verify
from shardcache.commands.status_text import format_status
from shardcache.errors import ConfigError, ShardcacheError
from shardcache.loader import client
from shardcache.loader.client import DEFAULT_DAEMON_URL
from shardcache.printable import printable
from shardcache.units import format_size


def _parser() -> argparse.ArgumentParser:
    parser = arguments.Parser(
        prog="shardcache",
        description="A local caching sidecar that serves WebDataset shards off local disk.",
    )
    parser.add_argument("--version", action="version", version=f"shardcache {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = commands.add_parser("serve", help="run the daemon")
    config.add_arguments(serve)
    demo = commands.add_parser(
        "demo", help="write sample WebDataset shards and serve them as origin 'sample'"
    )
    demo.add_argument(
        "--sample-dir",
        default=os.path.join(tempfile.gettempdir(), "shardcache-sample"),
        help="where to write the sample shards (default %(default)s)",
    )
    demo.add_argument(
        "--shards", type=_sample_shards, default=10, help="how many, 1 to 1000 (default 10)"
    )
    config.add_arguments(demo)

    url = commands.add_parser(
        "url", help="rewrite s3://, https:// or file:// shard URLs to the daemon's local URLs"
    )
    url.add_argument("urls", nargs="+", metavar="URL", help="brace patterns are kept intact")
    url.add_argument(
        "--pipe",
        action="store_true",
        help="print `pipe:curl -s -f …` lines ready for WebDataset",
    )
    url.add_argument(
        "--curl-header",
        metavar="FILE",
        help="with --pipe: add `-H @FILE` (a file holding `Authorization: Bearer TOKEN`, for a "
        "daemon run with --require-token-for-reads)",
    )
    _add_daemon_arguments(url)

    stats = commands.add_parser("stats", help="show the running daemon's status")
    stats.add_argument("--json", action="store_true", help="print the /_/status document")
    stats.add_argument(
        "--watch",
        nargs="?",
        type=_interval,
        const=2.0,
        metavar="SECONDS",
        help="refresh every SECONDS (default 2) until interrupted",
    )
    stats.add_argument(
        "--daemon",
        metavar="URL",
        help=f"the daemon (default $SHARDCACHE_URL or {DEFAULT_DAEMON_URL})",
    )
    stats.add_argument(
        "--config", metavar="FILE", help="ask the daemon this TOML file's `listen` names"
    )

    verify.add_parser(commands)

    prefetch = commands.add_parser(
        "prefetch",
        help="warm the running daemon's cache with shards, in the order given",
        description="Fill the cache with these shards before a run (nothing pinned, no "
        "look-ahead budget to wait for). With --lookahead they are queued as a loader's "
        "look-ahead instead: pinned until read, within --prefetch-max-bytes. With --cancel, "
        "drop what is queued instead.",
    )
    prefetch.add_argument(
        "urls",
        nargs="*",
        metavar="URL_OR_PATTERN",
        help="origin URLs, daemon URLs or /NAME/KEY paths; patterns allowed",
    )
    prefetch.add_argument(
        "--wait",
        action="store_true",
        help="show progress until done; exit 1 if any shard failed; Ctrl-C drops the rest",
    )
    prefetch.add_argument(
        "--lookahead",
        action="store_true",
        help="queue as a loader's look-ahead (pinned until read) instead of warming",
    )
    prefetch.add_argument(
        "--cancel",
        nargs="?",
        const="all",
        metavar="BATCH",
        help="drop what is queued (all, or of batch BATCH) and release the look-ahead budget "
        "its prefetched shards hold (they stay cached, unpinned)",
    )
    _add_daemon_arguments(prefetch)
    cached.add_parsers(commands)
    check.add_parser(commands)
    arguments.add_examples(parser)
    return parser


WATCH_MAX_S = 86400.0  # a day between refreshes is the longest that means anything


def _interval(text: str) -> float:
    """`--watch SECONDS`: a finite number of seconds above 0 and at most a day (argparse makes
    a ValueError from here one line and exit 2)."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= WATCH_MAX_S:  # also false for nan
        raise argparse.ArgumentTypeError(
            f"expected seconds above 0 and at most {WATCH_MAX_S:g}, not {printable(text[:40])!r}"
        )
    return seconds


def _add_daemon_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--daemon",
        metavar="URL",
        help=f"the daemon (default $SHARDCACHE_URL or {DEFAULT_DAEMON_URL})",
    )
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="take origins from this TOML file instead of asking the daemon",
    )
    parser.add_argument(
        "--origin",
        action="append",
        metavar="NAME=URL",
        help="an origin, instead of asking the daemon (repeatable)",
    )


def _configured(args: argparse.Namespace) -> tuple[dict[str, str], str | None]:
    """The origins and the URL of the daemon as configured (--origin/--config, or the
    SHARDCACHE_* environment a daemon would read), so `url --config` maps to that daemon, not
    the default port; with no origins configured, the running daemon's."""
    settings = _command_settings(args)
    listen = None if settings is None else _listen_url(settings)
    if settings is not None and settings.origins:
        return {o.name: o.url for o in settings.origins}, listen
    return client.origins(client.daemon_url(args.daemon, listen)), listen


def _command_settings(args: argparse.Namespace) -> config.Settings | None:
    """The settings a daemon started here would have, when anything configures one: flags,
    SHARDCACHE_CONFIG, SHARDCACHE_LISTEN or SHARDCACHE_ORIGIN; else None (ask the daemon)."""
    flags = {"origin": getattr(args, "origin", None), "config": args.config}
    named = ("CONFIG", "LISTEN", "ORIGIN")
    if not any(flags.values()) and not any(os.environ.get(f"SHARDCACHE_{n}") for n in named):
        return None
    return config.load_settings(flags, os.environ, for_daemon=False)


def _listen_url(settings: config.Settings) -> str:
    """The URL a client reaches a daemon with these settings on (a wildcard is loopback)."""
    host = "127.0.0.1" if settings.listen_host in ("0.0.0.0", "::") else settings.listen_host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.listen_port}"


def _url(args: argparse.Namespace) -> int:
    known, listen = _configured(args)
    daemon = client.daemon_url(args.daemon, listen)
    for url in args.urls:
        local = printable(client.map_url(url, known, daemon))  # origin names: from the daemon
        header = f"-H @{args.curl_header} " if args.curl_header else ""
        print(f"pipe:curl -s -f {header}{local}" if args.pipe else local)
    return 0


def _prefetch(args: argparse.Namespace) -> int:
    if args.cancel is not None:
        return _cancel_prefetch(args, _daemon(args))
    if not args.urls:
        raise ConfigError("prefetch: give the shards to fetch, or --cancel [BATCH]")
    known, listen = _configured(args)
    daemon = client.daemon_url(args.daemon, listen)
    paths = [client.local_path(client.map_url(u, known, daemon), daemon) for u in args.urls]
    answer = client.prefetch(paths, daemon, warm=not args.lookahead)
    with client.reading_answer(daemon):
        batch = int(answer["batch"])
        print(
            printable(
                f"batch {batch}: queued {answer['queued']}, already cached {answer['cached']}, "
                f"already in flight {answer['in_flight']}"
            ),
            file=sys.stderr,
        )
    if not args.wait:
        return 0
    try:
        return batch_progress.wait_for_batch(batch, daemon)
    except KeyboardInterrupt:
        # Waiting was the point: what is still queued of this batch goes too.
        dropped = printable(client.cancel_prefetch(batch, daemon).get("dropped", "?"))
        print(f"interrupted: dropped {dropped} queued shards of batch {batch}", file=sys.stderr)
        return 130


def _cancel_prefetch(args: argparse.Namespace, daemon: str) -> int:
    """`prefetch --cancel [BATCH]`: drop what is queued and release the look-ahead budget."""
    if args.urls or args.wait or args.lookahead:
        raise ConfigError("prefetch --cancel takes a batch number at most, no shards or flags")
    batch: int | None = None
    if args.cancel != "all":
        if re.fullmatch(r"[0-9]{1,18}", args.cancel) is None:
            raise ConfigError(f"prefetch --cancel: expected a batch number, got {args.cancel!r}")
        batch = int(args.cancel)
    answer = client.cancel_prefetch(batch, daemon)
    with client.reading_answer(daemon):
        dropped, released = int(answer["dropped"]), int(answer["released_bytes"])
    which = "queued" if batch is None else f"queued of batch {batch}"
    print(
        f"dropped {dropped} shards {which}; released {format_size(released)} of look-ahead "
        "budget (prefetched shards stay cached)",
        file=sys.stderr,
    )
    return 0


def _daemon(args: argparse.Namespace) -> str:
    """The daemon a command asks: --daemon, $SHARDCACHE_URL, its --config's `listen`, or the
    default."""
    settings = _command_settings(args)
    return client.daemon_url(args.daemon, None if settings is None else _listen_url(settings))


def _stats(args: argparse.Namespace) -> int:
    daemon = _daemon(args)
    while True:
        document = client.status(daemon)
        with client.reading_answer(daemon):
            text = json.dumps(document, indent=2) if args.json else format_status(document)
        if args.watch:
            print("\033[2J\033[H", end="")  # clear the terminal between refreshes
        print(text, flush=True)
        if not args.watch:
            return 0
        time.sleep(args.watch)


def _serve(
    args: argparse.Namespace,
    extra_origins: Sequence[str] = (),
    on_ready: Callable[[], None] | None = None,
) -> int:
    # Until the daemon's loop takes the signals over, a stop is only noted, then honoured as a
    # clean stop (exit 0) as soon as it can be: an exception raised from a handler would land
    # in whatever code ran then (a background task swallowed it and the daemon served on, or
    # an import wrapped it in a RuntimeError). systemd may stop a unit that is still starting.
    stops: list[int] = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda signum, frame: stops.append(signum))
    from shardcache.daemon import lifecycle  # imported here so `--help` stays fast
    from shardcache.observability import logs

    flags = vars(args) | {"origin": [*(args.origin or []), *extra_origins]}
    settings = config.load_settings(flags, os.environ)
    logs.configure(settings.log_level, settings.log_format)
    if stops:
        return 0

    def reload() -> config.Settings:
        return config.load_settings(flags, os.environ)

    lifecycle.run(settings, reload, on_ready, stop_requested=lambda: bool(stops))
    return 0


MAX_SAMPLE_SHARDS = 1000  # shards_000 to shards_999: the names and the printed pattern


def _sample_shards(text: str) -> int:
    """`--shards`: 0 wrote nothing and printed a loop over shards_{000..-01}.tar."""
    if not text.isdigit() or not 1 <= int(text) <= MAX_SAMPLE_SHARDS:
        raise argparse.ArgumentTypeError(f"expected 1 to {MAX_SAMPLE_SHARDS}, not {text[:40]!r}")
    return int(text)


def _demo(args: argparse.Namespace) -> int:
    from shardcache.daemon import lifecycle  # noqa: F401  (first: no shards written where it cannot run)
    from shardcache.loader.sample import write_sample_shards

    directory = Path(args.sample_dir).resolve()
    write_sample_shards(directory, shards=args.shards)
    last = args.shards - 1
    host, port = config.load_settings(vars(args), os.environ).listen.rsplit(":", 1)
    base = f"http://{host}:{port}/sample"
    python = sys.executable  # the Python shardcache runs in (a venv's), with pip for webdataset
    hints = (
        f"wrote {args.shards} sample shards to {directory}\n"
        f"serving them; try, in another shell:\n"
        f"  curl -sf {base}/shards_000.tar | tar t | head\n"
        f'  {python} -m pip install -q webdataset && {python} -c "import webdataset as wds; '
        f"print(sum(1 for _ in wds.WebDataset('pipe:curl -s -f {base}/shards_{{000..{last:03d}}}"
        f".tar', shardshuffle=False)))\"\n"
    )
    # Printed once the port is bound: a busy port shows its error, not hints that cannot work.
    return _serve(args, [f"sample=file://{directory}"], lambda: print(hints, flush=True))


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extras = parser.parse_known_args(argv)
    if extras:
        arguments.refuse_extras(arguments.subparser(parser, args.command), extras)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "demo":
            return _demo(args)
        if args.command == "url":
            return _url(args)
        if args.command == "prefetch":
            return _prefetch(args)
        if args.command == "stats":
            return _stats(args)
        if args.command == "verify":
            return verify.run_verify(args)
        if args.command == "ls":
            return cached.run_ls(args, _daemon(args))
        if args.command == "purge":
            return cached.run_purge(args, _daemon(args))
        if args.command == "check":
            return check.run_check(args)
        parser.print_help()
        return 2
    except ConfigError as exc:
        print(f"shardcache: error: {printable(exc)}", file=sys.stderr)
        return 2
    except ShardcacheError as exc:
        print(f"shardcache: {printable(exc)}", file=sys.stderr)
        return 1
    except client.ClientError as exc:  # the daemon unreachable, refusing, or not understood
        print(f"shardcache: error: {printable(exc)}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        if not exc.name or exc.name.partition(".")[0] == "shardcache":
            raise
        # The loader-only install (`pip install shardcache`) has the client commands, not the
        # daemon's dependencies: say what to install, not a traceback.
        print(
            f"shardcache: error: `shardcache {args.command}` needs the daemon's dependencies "
            f"({exc.name} is not installed): from a clone of shardcache, "
            "pip install -c constraints.txt '.[daemon]' (see docs/deploying.md)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `shardcache stats --watch | head`: the reader has what it wanted. Point stdout at
        # /dev/null so the interpreter's final flush does not raise a second time.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
