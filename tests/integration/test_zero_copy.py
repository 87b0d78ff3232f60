"""Hits and fills really go through sendfile(2) under uvloop: traced with strace, not assumed."""

from __future__ import annotations

import os
import re
import shutil

from tests.integration.helpers import curl, sha256
from tests.origin_server import OriginServer

MiB = 1024 * 1024


def test_body_bytes_leave_through_sendfile(origin: OriginServer, start_daemon, tmp_path) -> None:
    strace = shutil.which("strace")
    assert strace, "strace is required (apt-get install strace; .ci/run installs it)"
    data = os.urandom(24 * MiB)
    origin.put("s.tar", data)
    trace = tmp_path / "trace.txt"
    daemon = start_daemon(
        {"web": origin.url},
        prefix=(
            strace,
            "-f",
            "-qq",
            "-e",
            "trace=sendfile,write,writev,sendto,sendmsg",
            "-e",
            "signal=none",
            "-o",
            str(trace),
        ),
    )
    miss = curl(f"{daemon.url}/web/s.tar")
    hit = curl(f"{daemon.url}/web/s.tar")
    assert miss.sha256 == hit.sha256 == sha256(data)
    assert daemon.stop() == 0

    sent_by_sendfile = _bytes_returned(trace.read_text(), "sendfile")
    copied = sum(
        _bytes_returned(trace.read_text(), call)
        for call in ("write", "writev", "sendto", "sendmsg")
    )
    assert sent_by_sendfile == 2 * len(data)
    assert copied < MiB, f"{copied} bytes went through write-family calls"


def _bytes_returned(trace: str, call: str) -> int:
    """Sum the results of `call` in an strace -f log, including `<... call resumed>` lines."""
    pattern = re.compile(rf"^\d+\s+(?:{call}\(|<\.\.\. {call} resumed>).*\)\s+=\s+(\d+)")
    return sum(int(m.group(1)) for line in trace.splitlines() if (m := pattern.match(line)))
