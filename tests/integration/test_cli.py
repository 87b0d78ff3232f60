"""The command line as users meet it: help, version, and one clear line for a bad setting."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from shardcache import __version__


def _run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardcache", *args], capture_output=True, text=True, timeout=timeout
    )


def test_version_and_help() -> None:
    assert _run("--version").stdout.strip() == f"shardcache {__version__}"
    help_text = _run("serve", "--help").stdout
    for flag in (
        "--listen",
        "--cache-dir",
        "--cache-size",
        "--origin",
        "--config",
        "--log-level",
        "--origin-connect-timeout",
        "--origin-read-timeout",
    ):
        assert flag in help_text


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--cache-size", "lots"], "--cache-size: cannot read 'lots' as a size"),
        (["--origin", "x=ftp://host/p"], "--origin: origin 'x' has unknown scheme"),
        (["--origin", "metrics=file:///tmp"], "reserved"),
        (["--origin", "novalue"], "expected NAME=URL"),
        (["--listen", "localhost"], "--listen: expected HOST:PORT"),
        (
            ["--origin", "d=file:///does/not/exist"],
            "--origin d: /does/not/exist is not a directory",
        ),
        (["--config", "/does/not/exist.toml"], "--config: /does/not/exist.toml does not exist"),
    ],
)
def test_bad_settings_give_one_line_and_exit_2(
    tmp_path: Path, args: list[str], needle: str
) -> None:
    result = _run("serve", "--cache-dir", str(tmp_path / "c"), *args)
    assert result.returncode == 2
    assert needle in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_unwritable_cache_dir_and_port_in_use(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    result = _run("serve", "--cache-dir", str(blocker / "cache"))
    assert result.returncode == 2 and result.stderr.startswith("shardcache: error: --cache-dir:")

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = _run("serve", "--cache-dir", str(tmp_path / "c"), "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2
    assert result.stderr.startswith("shardcache: error: --listen: cannot listen on")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_env_and_file_settings_apply_with_precedence(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('cache_size = "1GiB"\nlisten = "127.0.0.1:1"\n')
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "shardcache",
            "serve",
            "--config",
            str(config),
            "--cache-dir",
            str(tmp_path / "c"),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"SHARDCACHE_CACHE_SIZE": "bad", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2
    assert "SHARDCACHE_CACHE_SIZE: cannot read 'bad'" in result.stderr


def test_url_with_a_config_maps_to_the_daemon_that_config_listens_on(tmp_path: Path) -> None:
    from tests.integration.helpers import run_cli

    config = tmp_path / "c.toml"
    config.write_text('listen = "127.0.0.1:8472"\n[origins.lake]\nurl = "http://127.0.0.1:9/d"\n')
    mapped = run_cli("url", "--config", str(config), "http://127.0.0.1:9/d/s_000.tar")
    assert mapped.returncode == 0, mapped.stderr
    assert mapped.stdout.strip() == "http://127.0.0.1:8472/lake/s_000.tar"
    told = run_cli(
        "url", "--config", str(config), "--daemon", "http://h:1", "http://127.0.0.1:9/d/x"
    )
    assert told.stdout.strip() == "http://h:1/lake/x"  # a --daemon flag still wins


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["serve", "--cache-sise", "1G"],
            "shardcache serve: error: unknown option --cache-sise; did you mean --cache-size?",
        ),
        (
            ["serve", "--cache-sise=1G"],
            "shardcache serve: error: unknown option --cache-sise; did you mean --cache-size?",
        ),
        (
            ["ls", "--limt", "3"],
            "shardcache ls: error: unknown option --limt; did you mean --limit?",
        ),
        (
            ["purge", "d", "*", "--dryrun"],
            "shardcache purge: error: unknown option --dryrun; did you mean --dry-run?",
        ),
        (["sreve"], "shardcache: error: unknown command 'sreve'; did you mean serve?"),
        (
            ["stats", "--zzzz"],
            "shardcache stats: error: unknown option --zzzz (see shardcache stats --help)",
        ),
        (
            ["ls", "--limit", "x"],
            "shardcache ls: error: argument --limit: expected a whole number, not 'x'",
        ),
        (["url"], "shardcache url: error: the following arguments are required: URL"),
        (
            ["demo", "--shards", "0"],
            "shardcache demo: error: argument --shards: expected 1 to 1000, not '0'",
        ),
        (
            ["demo", "--shards", "1001"],
            "shardcache demo: error: argument --shards: expected 1 to 1000, not '1001'",
        ),
    ],
)
def test_a_mistyped_option_is_one_line_naming_the_likely_one_and_exit_2(
    args: list[str], line: str
) -> None:
    result = _run(*args)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [line]


def test_every_subcommand_help_ends_with_examples() -> None:
    for command in ("serve", "demo", "url", "prefetch", "stats", "verify", "ls", "purge", "check"):
        help_text = _run(command, "--help").stdout
        examples = help_text.split("examples:\n", 1)[1].splitlines()
        assert examples and all(f"shardcache {command}" in e for e in examples), help_text


def test_ls_without_a_daemon_is_one_line_and_exit_2() -> None:
    from tests.integration.helpers import run_cli
    from tests.ports import free_port

    result = run_cli("ls", "--daemon", f"http://127.0.0.1:{free_port()}")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("shardcache: error: cannot reach the shardcache daemon")
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_s3_origin_boto3_cannot_set_up_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    from tests.integration.helpers import run_cli

    result = run_cli(
        "serve",
        "--cache-dir",
        str(tmp_path / "c"),
        "--origin",
        "lake=s3://bucket/data",
        env={"AWS_PROFILE": "no-such-profile"},
    )
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "shardcache: error: origin 'lake': cannot make an S3 client: "
        "The config profile (no-such-profile) could not be found"
    )
