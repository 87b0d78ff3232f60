"""The command line's manners: a mistyped option gets one line naming the option it was
probably meant to be (difflib), every parse error is one line and exit 2, and each
subcommand's `--help` ends with examples."""

from __future__ import annotations

import argparse
import difflib
from typing import NoReturn

EXAMPLES = {
    "serve": """\
examples:
  shardcache serve --origin lake=s3://my-bucket/datasets --cache-size 500GiB
  shardcache serve --config /etc/shardcache.toml
  SHARDCACHE_CACHE_DIR=/mnt/nvme/shardcache shardcache serve --origin web=https://data.example.com
""",
    "demo": """\
examples:
  shardcache demo
  shardcache demo --shards 100 --listen 127.0.0.1:8471
""",
    "url": """\
examples:
  shardcache url s3://my-bucket/datasets/train-{000000..000999}.tar
  shardcache url --pipe https://data.example.com/shards/train-000000.tar
  shardcache url --config /etc/shardcache.toml s3://my-bucket/datasets/val-000000.tar
""",
    "prefetch": """\
examples:
  shardcache prefetch --wait s3://my-bucket/datasets/train-{000000..000099}.tar
  shardcache prefetch --lookahead /lake/train-000100.tar /lake/train-000101.tar
  shardcache prefetch --cancel      # drop what is queued, release the look-ahead budget
  shardcache prefetch --cancel 12   # only batch 12 (the number a post answered)
""",
    "stats": """\
examples:
  shardcache stats
  shardcache stats --watch 5
  shardcache stats --json --daemon http://127.0.0.1:8470
""",
    "verify": """\
examples:
  shardcache verify
  shardcache verify --cache-dir /mnt/nvme/shardcache --repair
  shardcache verify --json --config /etc/shardcache.toml
""",
    "ls": """\
examples:
  shardcache ls
  shardcache ls lake 'train-0000*.tar'
  shardcache ls lake --limit 0 --json > cached.jsonl
""",
    "purge": """\
examples:
  shardcache purge lake 'val-*.tar' --dry-run
  shardcache purge lake 'val-*.tar'
  shardcache purge lake '*'
""",
    "check": """\
examples:
  shardcache check --config /etc/shardcache.toml
  shardcache check --origin lake=s3://my-bucket/datasets --key lake/train-000000.tar
""",
}


class _Formatter(argparse.HelpFormatter):
    """Wraps descriptions as usual; keeps the examples' lines as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith("examples:"):
            return "".join(indent + line for line in text.splitlines(keepends=True))
        return super()._fill_text(text, width, indent)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit 2."""

    def error(self, message: str) -> NoReturn:
        if "invalid choice" in message and _commands(self):
            message = _suggest_command(self, message)
        self.exit(2, f"{self.prog}: error: {message}\n")


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """`parser`'s subcommands by name (none when it has none)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def add_examples(parser: argparse.ArgumentParser) -> None:
    """Give each subcommand of `parser` its examples (at the end of its `--help`)."""
    for name, sub in _commands(parser).items():
        sub.epilog = EXAMPLES.get(name, sub.epilog)
        sub.formatter_class = _Formatter


def subparser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    """The parser of subcommand `command` (`parser` itself when there is none)."""
    return _commands(parser).get(command or "", parser)


def refuse_extras(parser: argparse.ArgumentParser, extras: list[str]) -> NoReturn:
    """Exit 2 with one line for what `parser` did not recognize, naming the closest option."""
    options = [s for s in extras if s.startswith("-") and s != "-"]
    if not options:
        parser.error(f"unexpected argument {extras[0]!r}")
    given = options[0].split("=", 1)[0]
    known = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    close = difflib.get_close_matches(given, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f" (see {parser.prog} --help)"
    parser.error(f"unknown option {given}{hint}")


def _suggest_command(parser: argparse.ArgumentParser, message: str) -> str:
    """argparse's "invalid choice: 'sreve' (choose from …)" with the likeliest command."""
    given = message.split("'")[1] if message.count("'") >= 2 else ""
    close = difflib.get_close_matches(given, list(_commands(parser)), n=1, cutoff=0.6)
    if not close:
        return message
    return f"unknown command {given!r}; did you mean {close[0]}?"
