"""The listen backlog the daemon asks for: the system's bound unless a setting says otherwise."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardcache.daemon.wiring import ASSUMED_SOMAXCONN, listen_backlog


def test_the_backlog_is_the_systems_bound_unless_set(tmp_path: Path) -> None:
    somaxconn = tmp_path / "somaxconn"
    somaxconn.write_text("4096\n")
    assert listen_backlog(None, somaxconn) == 4096
    assert listen_backlog(512, somaxconn) == 512


def test_a_system_that_does_not_say_gets_linuxs_default(tmp_path: Path) -> None:
    assert listen_backlog(None, tmp_path / "absent") == ASSUMED_SOMAXCONN
    (tmp_path / "garbled").write_text("many")
    assert listen_backlog(None, tmp_path / "garbled") == ASSUMED_SOMAXCONN


def test_a_backlog_above_the_systems_bound_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The kernel caps it at somaxconn without a word: the log says what to raise."""
    somaxconn = tmp_path / "somaxconn"
    somaxconn.write_text("128\n")
    with caplog.at_level(logging.WARNING, logger="shardcache.daemon"):
        assert listen_backlog(4096, somaxconn) == 4096
    assert "net.core.somaxconn=128" in caplog.text
    assert "sysctl -w net.core.somaxconn=4096" in caplog.text
