"""The daemon's wiring: the listen backlog it asks for (the system's bound unless a setting says
otherwise), and S3 origins whose endpoint is the daemon itself, refused."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from shardcache.config import Settings
from shardcache.config.settings import load_settings
from shardcache.daemon.wiring import ASSUMED_SOMAXCONN, listen_backlog, refuse_own_endpoint
from shardcache.errors import ConfigError


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


def _settings(listen: str, *origins: str) -> Settings:
    return load_settings({"listen": listen, "origin": list(origins)}, {}, for_daemon=False)


@pytest.mark.parametrize(
    ("listen", "endpoint"),
    [
        ("127.0.0.1:8470", "http://127.0.0.1:8470"),
        ("127.0.0.1:8470", "http://localhost:8470/"),
        ("0.0.0.0:9000", "http://127.0.0.1:9000"),
    ],
)
def test_an_s3_origin_whose_endpoint_is_the_daemon_itself_is_refused(
    monkeypatch: pytest.MonkeyPatch, listen: str, endpoint: str
) -> None:
    """The README points S3 clients at the daemon with AWS_ENDPOINT_URL: a daemon started in
    that shell read it too and asked itself for every object (each read stalled 30 s)."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    settings = _settings(listen, "lake=s3://my-bucket/datasets")
    with pytest.raises(ConfigError, match="AWS_ENDPOINT_URL.*own address"):
        refuse_own_endpoint(settings, settings.origins[0])


def test_an_s3_origin_elsewhere_or_a_file_origin_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8470")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")  # boto3 takes this one
    settings = _settings("127.0.0.1:8470", "lake=s3://b", f"files=file://{tmp_path}")
    for spec in settings.origins:
        refuse_own_endpoint(settings, spec)
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    refuse_own_endpoint(settings, settings.origins[1])  # a file origin asks no endpoint
