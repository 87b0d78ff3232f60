"""REDbot (`redbot`, lint for HTTP) run on the daemon's object answers: a miss, a hit and a 404.

REDbot's command line takes a URL and no request headers; for each URL it also sends its own
ranged request and its If-None-Match and If-Modified-Since revalidations, so a range and the
304s are checked too (their notes are asserted present). No note may be at REDbot's error
level ("BAD").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.daemon_process import Daemon
from tests.integration.helpers import curl, wait_for
from tests.origin_server import OriginServer

KiB = 1024
LAST_MODIFIED = "Tue, 14 Nov 2023 22:13:20 GMT"
# What REDbot says when its ranged request and both revalidations were answered right.
RANGE_AND_304 = {"RANGE_CORRECT", "INM_304", "IMS_304"}


def _redbot() -> str:
    """The `redbot` command of this Python's environment (pip installs it beside python)."""
    beside = Path(sys.executable).parent / "redbot"
    found = str(beside) if beside.exists() else shutil.which("redbot")
    assert found, "redbot is not installed: pip install -c constraints.txt -e '.[test]'"
    return found


def _lint(url: str) -> tuple[int, dict[str, str], list[dict[str, str]]]:
    """Run REDbot on `url`; return the status and headers it got, and its notes."""
    done = subprocess.run(
        [_redbot(), "-o", "har", url], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    try:
        har = json.loads(done.stdout)
        (entry,) = har["log"]["entries"]
        response = entry["response"]
        headers = {h["name"].lower(): h["value"].strip() for h in response["headers"]}
        notes = list(entry["_red_messages"])
    except (ValueError, KeyError) as exc:
        raise AssertionError(f"unreadable REDbot output ({exc}):\n{done.stdout[:4000]}") from exc
    return int(response["status"]), headers, notes


def _errors(notes: list[dict[str, str]]) -> list[str]:
    return [f"{n['note_id']}: {n['summary']}" for n in notes if n.get("level") == "BAD"]


def test_redbot_finds_no_error_on_a_miss_a_hit_a_range_a_304_and_a_404(
    origin: OriginServer, start_daemon, tmp_path: Path
) -> None:
    origin.put("s.tar", os.urandom(300 * KiB), last_modified=LAST_MODIFIED)
    daemon: Daemon = start_daemon({"web": origin.url}, "--readahead", "0")
    url = f"{daemon.url}/web/s.tar"

    status, headers, notes = _lint(url)
    assert (status, headers["x-shardcache"]) == (200, "miss")
    assert _errors(notes) == [], notes
    assert RANGE_AND_304 <= {n["note_id"] for n in notes}, notes

    wait_for("a hit", lambda: curl(url).headers.get("x-shardcache") == "hit")
    status, headers, notes = _lint(url)
    assert (status, headers["x-shardcache"]) == (200, "hit")
    assert headers["last-modified"] == LAST_MODIFIED
    assert _errors(notes) == [], notes
    assert RANGE_AND_304 <= {n["note_id"] for n in notes}, notes

    status, _, notes = _lint(f"{daemon.url}/web/missing.tar")
    assert status == 404
    assert _errors(notes) == [], notes
