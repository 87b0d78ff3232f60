"""Subcommands beyond `cli.py`'s own (serve, demo, url, prefetch, stats), one module per job:
`arguments` (the parser's manners: "did you mean", examples in `--help`), `cached` (`ls` and
`purge`, through a running daemon's `/_/cache`), `batch_progress` (`prefetch --wait` following
its batch), `check` (every configured origin asked before a job, without a daemon), `verify`
(every cached entry checked, offline or through the daemon that holds the cache),
`status_text` (`stats` as text). `cli.py` builds the parser and dispatches; these modules add
their subparsers and run them.

`cached` and `batch_progress` talk to the daemon only through `client` (what it holds, pins
included, lives in the daemon); `check` builds origins as the daemon does
(`daemon.wiring.build_origins`); `verify` runs `cache.verify` on a cache no daemon holds, and
asks the daemon that holds one. None knows the store or HTTP routes.
"""
