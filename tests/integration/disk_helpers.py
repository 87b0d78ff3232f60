"""Helpers for tests that break the cache's disk: tmpfs mounts, ballast, the offline `verify`,
and what the daemon's files and log say about it."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.integration.helpers import CurlResult

MiB = 1024 * 1024
_ACCESS = re.compile(r"aiohttp\.access: [A-Z]+ (\S+) (\d{3}) ")


@contextlib.contextmanager
def tmpfs(mount_point: Path, size_bytes: int) -> Iterator[Path]:
    """Mount a tmpfs of `size_bytes` at `mount_point` for the block; always unmount after.

    Skips the test (only here) when this machine cannot mount one (not root, no privilege).
    """
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip() or mounted.returncode}")
    try:
        yield mount_point
    finally:
        # A daemon the test left running still holds files: detach lazily rather than leak it.
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


@contextlib.contextmanager
def read_only(directory: Path) -> Iterator[Path]:
    """Make `directory` read-only for the block: a read-only bind mount of it onto itself.

    Everything reached through the path (creating, renaming, deleting files; `access(W_OK)`)
    fails with EROFS. Descriptors opened before keep their writable mount: a filesystem with
    writers open cannot be remounted read-only (EBUSY), so this is the nearest outside fault.
    Skips the test (only here) when this machine cannot bind-mount.
    """
    bound = subprocess.run(
        ["mount", "--bind", str(directory), str(directory)], capture_output=True, text=True
    )
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount here: {bound.stderr.strip() or bound.returncode}")
    try:
        subprocess.run(
            ["mount", "-o", "remount,bind,ro", str(directory)], check=True, capture_output=True
        )
        yield directory
    finally:
        subprocess.run(["umount", str(directory)], check=True)


def free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fill_up(path: Path) -> int:
    """Write zeros to `path` until the filesystem is full (ENOSPC); return the bytes written."""
    written = 0
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for chunk in (bytes(MiB), bytes(4096), bytes(512)):
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


def entry_files(cache_dir: Path) -> list[Path]:
    """The cached objects' files: everything under v1/index except the SQLite index."""
    index = cache_dir / "v1" / "index"
    return [p for p in index.rglob("*") if p.is_file() and not p.name.startswith("cache.db")]


def index_db_bytes(cache_dir: Path) -> int:
    return sum(p.stat().st_size for p in (cache_dir / "v1" / "index").glob("cache.db*"))


def partial_files(cache_dir: Path) -> list[Path]:
    partial = cache_dir / "v1" / "partial"
    return list(partial.iterdir()) if partial.is_dir() else []


def has_written_bytes(path: Path) -> bool:
    """Whether a (preallocated, zero-filled) partial file has received data: the objects the
    tests serve are random, so a fill's first bytes are never all zero."""
    try:
        with path.open("rb") as file:
            return any(file.read(4096))
    except FileNotFoundError:
        return False


def verify(cache_dir: Path) -> tuple[int, dict[str, object], str]:
    """Run `shardcache verify --cache-dir DIR --json` (offline); return (exit code, report,
    stderr). The report is {} when stdout is not JSON (the stderr then says why)."""
    process = subprocess.run(
        [sys.executable, "-m", "shardcache", "verify", "--cache-dir", str(cache_dir), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    try:
        report = json.loads(process.stdout)
    except ValueError:
        report = {}
    return process.returncode, report, process.stderr


def count(value: object) -> int:
    """`verify`'s `entries`, whether reported as a number or as a list of entries."""
    return value if isinstance(value, int) else len(value)  # type: ignore[arg-type]


def readyz(url: str) -> tuple[int, dict[str, object]]:
    try:
        with urllib.request.urlopen(url + "/readyz", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def statuses(log: str) -> list[tuple[str, int]]:
    """(path, status) of every request in the daemon's access log."""
    return [(m.group(1), int(m.group(2))) for m in _ACCESS.finditer(log)]


def assert_no_crash(log: str, results: Sequence[CurlResult] = ()) -> None:
    """No traceback in the daemon's log, and no request answered 500 (by the access log and by
    what the clients saw)."""
    assert "Traceback" not in log, log[-6000:]
    errors = [(path, status) for path, status in statuses(log) if status == 500]
    assert not errors, errors
    assert all(r.status != 500 for r in results), [r.status for r in results]


def flip_byte(path: Path, at: int) -> None:
    """Damage one byte of a cached file in place, as bit rot would."""
    with open(path, "r+b") as file:
        file.seek(at)
        byte = file.read(1)
        file.seek(at)
        file.write(bytes([byte[0] ^ 0x10]))
