"""The benchmark suite's quick mode as a smoke test: every scenario runs against its real peers
(nginx, wrk, the aws CLI, WebDataset) and yields a row with figures. The figures themselves are
not checked here: tiny sizes on a shared machine say nothing about speed."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIO_ROWS = [
    "hit, one shard, curl",
    "miss, unthrottled loopback origin",
    "CPU per GB served, hit",
    "CPU per GB served, miss",
    "cold miss, origin capped 100 MB/s per connection",
    "S3 miss from the simulated S3 origin",
    "4 clients ask for one cold shard",
    "64 KiB objects, 32 connections (wrk), hits",
    "16 concurrent streams",
    "WebDataset epoch",
    "8 WebDataset workers in DataLoader order",
]


def test_every_scenario_runs_in_quick_mode(tmp_path: Path) -> None:
    report = tmp_path / "BENCHMARKS.md"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--output", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    table = report.read_text()
    for name in SCENARIO_ROWS:
        rows = [line for line in table.splitlines() if line.startswith(f"| {name}")]
        assert rows, f"no row for {name!r}"
        for row in rows:
            cells = [c.strip() for c in row.strip("|").split("|")]
            assert re.match(r"-?\d", cells[2]), f"{name}: no shardcache figure in {row}"
            assert re.match(r"-?\d", cells[4]), f"{name}: no peer figure in {row}"
