"""Small client-side helpers for integration tests: curl as loaders run it, the CLI as a user
runs it, polling for what only the daemon's timing decides, and disk usage."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.readiness import RETRIED


@dataclass
class CurlResult:
    exit_code: int
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.body).hexdigest()


def curl(url: str, *args: str) -> CurlResult:
    """Run `curl -s -f` (what WebDataset's pipe: URLs run) and capture status and headers."""
    process = subprocess.run(
        ["curl", "-s", "-f", "-D", "/dev/stderr", *args, url],
        capture_output=True,
        timeout=120,
    )
    status = 0
    headers: dict[str, str] = {}
    for line in process.stderr.decode(errors="replace").splitlines():
        if line.startswith("HTTP/"):
            status = int(line.split()[1])
            headers = {}
        elif ":" in line:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
    return CurlResult(process.returncode, status, headers, process.stdout)


def disk_usage(path: Path) -> int:
    """Bytes allocated on disk under `path` (files and directories), as `du` counts them.

    A fill's file moves from `partial/` into `index/` when it commits; stat'ing `index/` paths
    before `partial/` ones means a file moving meanwhile is never counted twice.
    """
    found = [os.path.join(d, n) for d, dirs, files in os.walk(path) for n in [*dirs, *files]]
    entries = sorted(found, key=lambda p: "/partial" in p)  # os.walk skips vanished dirs
    total = 0
    for entry in entries:
        try:
            total += os.lstat(entry).st_blocks * 512
        except FileNotFoundError:  # moved or deleted since the listing
            continue
    return total


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`python -m shardcache ARGS`, with no SHARDCACHE_* setting of this environment leaking in
    (only those in `env`)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SHARDCACHE_")}
    return subprocess.run(
        [sys.executable, "-m", "shardcache", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**environ, **(env or {})},
    )


def wait_for(what: str, condition: Callable[[], object], timeout_s: float = 30) -> None:
    """Poll `condition` (a state only the daemon's own timing decides) until it holds.

    A try that raises what a slow or busy daemon's answer raises (refused, reset, timed out:
    OSError, HTTPException) is retried like a False; the failure after `timeout_s` names the
    last such error."""
    last_error = ""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if condition():
                return
        except RETRIED as exc:
            last_error = f" (last try: {type(exc).__name__}: {exc})"
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s{last_error}"
        time.sleep(0.05)
