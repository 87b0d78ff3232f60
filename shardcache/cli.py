"""The command line: `shardcache serve` and `shardcache demo`.

A bad setting prints one line naming it on stderr and exits 2; never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from shardcache import __version__, config
from shardcache.errors import ConfigError, ShardcacheError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
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
    demo.add_argument("--shards", type=int, default=10, help="how many (default 10)")
    config.add_arguments(demo)
    return parser


def _serve(args: argparse.Namespace, extra_origins: Sequence[str] = ()) -> int:
    from shardcache import daemon, logs  # imported here so `--help` stays fast

    flags = vars(args) | {"origin": [*(args.origin or []), *extra_origins]}
    settings = config.load_settings(flags, os.environ)
    logs.configure(settings.log_level, settings.log_format)
    daemon.run(settings)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from shardcache.sample import write_sample_shards

    directory = Path(args.sample_dir).resolve()
    write_sample_shards(directory, shards=args.shards)
    last = args.shards - 1
    host, port = config.load_settings(vars(args), os.environ).listen.rsplit(":", 1)
    base = f"http://{host}:{port}/sample"
    print(
        f"wrote {args.shards} sample shards to {directory}\n"
        f"try, in another shell:\n"
        f"  curl -sf {base}/shards_000.tar | tar t | head\n"
        f'  python -c "import webdataset as wds; '
        f"print(sum(1 for _ in wds.WebDataset('pipe:curl -s -f {base}/shards_{{000..{last:03d}}}"
        f".tar', shardshuffle=False)))\"\n",
        flush=True,
    )
    return _serve(args, [f"sample=file://{directory}"])


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "demo":
            return _demo(args)
        parser.print_help()
        return 2
    except ConfigError as exc:
        print(f"shardcache: error: {exc}", file=sys.stderr)
        return 2
    except ShardcacheError as exc:
        print(f"shardcache: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
