"""Subcommands beyond `cli.py`'s own (serve, demo, url, prefetch, stats, verify), one module
per job: `arguments` (the parser's manners: "did you mean", examples in `--help`), `cached`
(`ls` and `purge`, through a running daemon's `/_/cache`), `batch_progress` (`prefetch
--wait` following its batch), `check` (every configured origin asked before a job, without a
daemon), `status_text` (`stats` as text). `cli.py` builds the parser and dispatches; these
modules add their subparsers and run them.

`cached` and `batch_progress` talk to the daemon only through `client` (what it holds, pins
included, lives in the daemon); `check` builds origins as the daemon does
(`daemon.wiring.build_origins`). None knows the store, the cache or HTTP routes.
"""
