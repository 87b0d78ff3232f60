"""Small client-side helpers for integration tests: curl as loaders run it, and disk usage."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path


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
    """Bytes allocated on disk under `path`, as `du` counts them."""
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(directory, name)).st_blocks * 512
            except FileNotFoundError:
                continue
    return total


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
