"""`shardcache ls` rows keep their columns in line whatever the "verified against" and
"pinned" values' lengths (a long one pushed that row's KEY out of line)."""

from __future__ import annotations

import argparse

import pytest

from shardcache.commands import cached


def _entry(key: str, verified: list[str], pinned: list[str] | None = None) -> dict[str, object]:
    return {
        "key": key,
        "size_bytes": 1_177_600,
        "age_s": 30.0,
        "stored_at": 970.0,
        "read_at": 990.0,
        "verified_by": verified,
        "pinned_by": pinned or [],
    }


def _key_columns(out: str) -> set[int]:
    """Where each line's KEY (its last column) starts."""
    lines = out.splitlines()
    assert lines[0].endswith("KEY")
    return {lines[0].index("KEY")} | {line.index("web/") for line in lines[1:]}


def test_a_long_verified_against_value_keeps_every_column_in_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    table = cached._Table(now=1000.0, as_json=False)
    table.add("web", _entry("a.tar", ["length"]))
    long = ["length", "x-amz-checksum-crc64nvme", "Content-MD5 (home)", "etag"]
    table.add("web", _entry("b.tar", long, ["look-ahead", "plan"]))
    table.add("web", _entry("c.tar", []))
    table.flush()
    out = capsys.readouterr().out
    assert len(_key_columns(out)) == 1, out
    assert "length, x-amz-checksum-crc64nvme, Content-MD5 (home), etag" in out  # whole
    assert out.count("\n") == 4


def test_a_value_past_the_cap_or_wider_than_the_first_page_ends_in_an_ellipsis(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cached, "PAGE", 2)  # the widths are the first page's
    table = cached._Table(now=1000.0, as_json=False)
    table.add("web", _entry("a.tar", ["length"]))
    table.add("web", _entry("b.tar", ["length", "x" * 200]))
    table.add("web", _entry("c.tar", ["length", "Content-MD5"] * 3))  # a later page
    table.flush()
    out = capsys.readouterr().out
    assert len(_key_columns(out)) == 1, out
    rows = out.splitlines()[1:]
    assert "x" * 50 in rows[1] and "x" * 200 not in rows[1] and "…" in rows[1]
    assert "…" not in rows[0]
    assert len(max(rows, key=len)) < 140


def test_json_rows_are_whole_and_print_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    table = cached._Table(now=1000.0, as_json=True)
    table.add("web", _entry("b.tar", ["length", "x" * 200]))
    assert '"origin": "web"' in capsys.readouterr().out and not table.flush()


def test_the_summary_says_one_entry_not_one_entries(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cached, "_entries", lambda origin, pattern, daemon: [_entry("a.tar", [])])
    args = argparse.Namespace(origin_name="web", pattern="*", json=False, limit=0)
    assert cached._ls(args, "http://127.0.0.1:1") == 0
    assert capsys.readouterr().err == "1 entry, 1.12 MiB\n"
