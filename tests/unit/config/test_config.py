"""Settings precedence (flag > env > file > default) and readable errors."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from shardcache.config import load_settings, read_config_file
from shardcache.config.settings import CONFIG_FILE_MAX_BYTES
from shardcache.errors import ConfigError


def test_defaults() -> None:
    settings = load_settings({}, {})
    assert (settings.listen_host, settings.listen_port) == ("127.0.0.1", 8470)
    assert settings.cache_size == 20 * 2**30
    assert settings.origin_connect_timeout == 10 and settings.origin_read_timeout == 30
    assert settings.origins == ()
    assert settings.prefetch_concurrency is None  # auto: tuned
    assert settings.eviction == "auto"
    assert load_settings({"prefetch_concurrency": "auto"}, {}).prefetch_concurrency is None
    assert load_settings({}, {"SHARDCACHE_PREFETCH_CONCURRENCY": "3"}).prefetch_concurrency == 3
    assert settings.listen_backlog is None  # auto: the system's somaxconn
    assert load_settings({"listen_backlog": "8192"}, {}).listen_backlog == 8192


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        'cache_size = "1GiB"\nlog_level = "warning"\nlisten = "0.0.0.0:9000"\n'
        '[origins.a]\nurl = "s3://bucket/prefix"\nendpoint_url = "http://minio:9000"\n'
        'headers = { Authorization = "Bearer ${TOKEN}" }\n'
        '[origins.b]\nurl = "file:///data"\n'
    )
    env = {
        "SHARDCACHE_CACHE_SIZE": "2GiB",
        "SHARDCACHE_LOG_LEVEL": "debug",
        "TOKEN": "s3cr3t",
        "SHARDCACHE_ORIGIN": "c=https://cdn.example.com/x",
        "SHARDCACHE_ADMIN_TOKEN": "an-admin-token-0123456789",  # 0.0.0.0 needs one
    }
    flags = {"config": str(config), "cache_size": "3GiB", "origin": ["b=file:///other"]}
    settings = load_settings(flags, env)
    assert settings.admin_token == "an-admin-token-0123456789"
    assert "an-admin-token" not in repr(settings)
    assert settings.cache_size == 3 * 2**30
    assert settings.log_level == "debug"
    assert settings.listen == "0.0.0.0:9000"
    by_name = {o.name: o for o in settings.origins}
    assert by_name["a"].endpoint_url == "http://minio:9000"
    assert by_name["a"].headers == (("Authorization", "Bearer s3cr3t"),)
    assert "s3cr3t" not in repr(settings)
    assert by_name["b"].url == "file:///other"
    assert by_name["c"].url == "https://cdn.example.com/x"


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"cache_size": "x"}, {}, "--cache-size: cannot read 'x'"),
        ({}, {"SHARDCACHE_ORIGIN_READ_TIMEOUT": "-1"}, "SHARDCACHE_ORIGIN_READ_TIMEOUT: must be"),
        ({"origin": ["a=gs://b"]}, {}, "unknown scheme"),
        ({"origin": ["a=file://relative"]}, {}, "file:///ABSOLUTE/PATH"),
        ({"origin": ["healthz=s3://b"]}, {}, "reserved"),
        ({"log_level": "loud"}, {}, "--log-level: expected one of"),
        ({"prefetch_concurrency": "0"}, {}, "--prefetch-concurrency: expected auto or a whole"),
        ({}, {"SHARDCACHE_PREFETCH_CONCURRENCY": "-1"}, "from 1 to 256, got '-1'"),
        ({"prefetch_concurrency": "999999"}, {}, "from 1 to 256, got '999999'"),
        ({"prefetch_concurrency": "1.5"}, {}, "expected auto or a whole number"),
        ({"listen_backlog": "0"}, {}, "--listen-backlog: must be at least 1"),
        ({}, {"SHARDCACHE_LISTEN_BACKLOG": "70000"}, "must be at most 65535"),
    ],
)
def test_errors_name_the_setting(
    flags: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        load_settings(flags, env)


def test_file_errors(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text("cache_sise = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        load_settings({"config": str(config)}, {})
    config.write_text('[origins.a]\nurl = "s3://b"\nheaders = { X = "${MISSING}" }\n')
    with pytest.raises(ConfigError, match="MISSING is not set"):
        load_settings({"config": str(config)}, {})
    config.write_text("not toml [")
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings({"config": str(config)}, {})


def test_a_config_file_that_is_no_settings_file_is_refused_by_name(tmp_path: Path) -> None:
    """A FIFO (would hang), a device (/dev/zero: would fill memory), a directory, a file over
    1 MiB, bytes that are not UTF-8, TOML nested 100,000 deep (the parser's recursion)."""
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    (tmp_path / "binary.toml").write_bytes(b"listen = '\xff'\n")
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000)
    (tmp_path / "large.toml").write_text("# padding\n" * 120_000)
    (tmp_path / "exactly.toml").write_bytes(b"#" * (CONFIG_FILE_MAX_BYTES - 1) + b"\n")
    cases = {
        str(fifo): "is not a regular file",
        "/dev/zero": "is not a regular file",
        str(tmp_path): "is not a regular file",
        str(tmp_path / "binary.toml"): r"is not UTF-8 text \(byte 10\)",
        str(tmp_path / "deep.toml"): "nested too deep",
        str(tmp_path / "large.toml"): "is larger than 1 MiB",
    }
    for path, problem in cases.items():
        with pytest.raises(
            ConfigError, match=f"^--config: (cannot read )?{re.escape(path)}.*{problem}"
        ):
            read_config_file(Path(path))
    assert read_config_file(tmp_path / "exactly.toml") == {}  # 1 MiB is still read


def test_follow_redirects_is_a_per_origin_toml_setting(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[origins.a]\nurl = "https://cdn.example/x"\nfollow_redirects = true\n'
        '[origins.b]\nurl = "https://cdn.example/y"\n'
    )
    by_name = {o.name: o for o in load_settings({"config": str(config)}, {}).origins}
    assert by_name["a"].follow_redirects and not by_name["b"].follow_redirects
    flags = {"config": str(config), "origin": ["a=https://cdn.example/x", "c=http://h/z"]}
    by_name = {o.name: o for o in load_settings(flags, {}).origins}
    assert by_name["a"].follow_redirects and not by_name["c"].follow_redirects
    for bad, message in (
        ('url = "https://h/x"\nfollow_redirects = "yes"', "true or false"),
        ('url = "s3://bucket"\nfollow_redirects = true', "http\\(s\\) origins only"),
        ('url = "file:///data"\nfollow_redirects = true', "http\\(s\\) origins only"),
    ):
        config.write_text(f"[origins.a]\n{bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_settings({"config": str(config)}, {})


def test_the_admin_token_follows_the_precedence_of_every_setting(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("token-from-the-file-0123\n")
    env_token = {"SHARDCACHE_ADMIN_TOKEN": "token-from-the-environment"}
    # A flag beats the environment, whichever of the two forms each uses.
    settings = load_settings({"admin_token_file": str(token_file)}, env_token)
    assert settings.admin_token == "token-from-the-file-0123"
    settings = load_settings(
        {"admin_token": "token-from-a-flag-000"}, {"SHARDCACHE_ADMIN_TOKEN_FILE": str(token_file)}
    )
    assert settings.admin_token == "token-from-a-flag-000"
    # Both forms at one level: one would be ignored, so neither is.
    both = {**env_token, "SHARDCACHE_ADMIN_TOKEN_FILE": str(token_file)}
    with pytest.raises(ConfigError, match="SHARDCACHE_ADMIN_TOKEN and SHARDCACHE_ADMIN_TOKEN_FILE"):
        load_settings({}, both)
    # An error names where the setting came from.
    missing = {"SHARDCACHE_ADMIN_TOKEN_FILE": str(tmp_path / "nope")}
    with pytest.raises(ConfigError, match="^SHARDCACHE_ADMIN_TOKEN_FILE: cannot read"):
        load_settings({}, missing)


@pytest.mark.parametrize("value", ["12345678901234567890", '["a-list-of-one-token-000"]'])
def test_a_toml_token_must_be_a_string(tmp_path: Path, value: str) -> None:
    config = tmp_path / "c.toml"
    config.write_text(f"admin_token = {value}\n")
    with pytest.raises(ConfigError, match="admin_token in .*: must be a string"):
        load_settings({"config": str(config)}, {})


def test_upstreams_tier_and_caps_are_per_origin_toml_settings(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        "[origins.laion]\n"
        'urls = ["http://tier.rack7:8470/laion", "s3://bucket/laion"]\n'
        'tier = ["http://sc-0.sc:8470", "http://sc-1.sc:8470/"]\n'
        'tier_origin = "laion-s3"\n'
        'tier_headers = { Authorization = "Bearer ${TIER_TOKEN}" }\n'
        "tier_refresh = 5\n"
        "max_requests = 64\n"
        "max_requests_per_second = 2500\n"
        "[origins.dns]\n"
        'url = "s3://bucket/dns"\n'
        'tier = "http://sc.default.svc.cluster.local:8470"\n'
    )
    settings = load_settings({"config": str(config)}, {"TIER_TOKEN": "t0k"})
    by_name = {o.name: o for o in settings.origins}
    laion = by_name["laion"]
    assert laion.tier_headers == (("Authorization", "Bearer t0k"),) and laion.headers == ()
    assert laion.url == "s3://bucket/laion"  # the home: names objects in the cache
    assert laion.urls == ("http://tier.rack7:8470/laion", "s3://bucket/laion")
    assert laion.tier == ("http://sc-0.sc:8470", "http://sc-1.sc:8470")
    assert (laion.tier_origin, laion.tier_refresh_s) == ("laion-s3", 5.0)
    assert (laion.max_requests, laion.max_requests_per_second) == (64, 2500.0)
    assert by_name["dns"].tier_dns == "http://sc.default.svc.cluster.local:8470"
    assert by_name["dns"].tier == () and by_name["dns"].has_upstreams
    for bad, message in (
        ('url = "s3://b"\nurls = ["s3://b"]', "has both url and urls"),
        ('endpoint_url = "http://x"', "needs url"),
        ('url = "s3://b"\ntier = ["http://sc-0:8470/laion"]', "has a path"),
        ('url = "s3://b"\ntier = [" http://sc-0:8470"]', "not an http"),
        ('url = "s3://b"\ntier_origin = "x"', "tier_origin without a tier"),
        ('url = "s3://b"\ntier = "http://sc:1"\ntier_refresh = "nan"', "must be positive"),
        ("urls = []", "list of 1 to 64"),
        ('urls = ["s3://b", "s3://b"]', "same URL twice"),
        ('urls = ["http://h/x", "ftp://h/y"]', "unknown scheme"),
        ('urls = ["http://h/x", "file:///data"]', "not file://"),
        ('url = "s3://b"\ntier = ["sc-0:8470"]', "not an http\\(s\\)://HOST:PORT URL"),
        ('url = "s3://b"\ntier = ["http://sc-0:99999"]', "bad port"),
        ('url = "s3://b"\ntier = []', "list of 1 to 64"),
        ('url = "s3://b"\ntier = ["http://a:1", "http://a:1/"]', "same member twice"),
        ('url = "s3://b"\ntier = ["http://A", "http://a:80"]', "same member twice"),
        ('url = "s3://b"\ntier = ["http://localhost:1", "http://127.0.0.1:1"]', "twice"),
        ('url = "s3://b"\ntier = ["http://127.0.0.1:1", "http://127.0.0.01:1"]', "twice"),
        ('url = "s3://b"\ntier = ["http://127.0.0.1:1", "http://2130706433:1"]', "twice"),
        ('url = "s3://b"\ntier = ["http://127.0.0.1:1", "http://127.1:1"]', "twice"),
        ('url = "s3://b"\ntier = ["http://[::1]:1", "http://[0:0::1]:1"]', "twice"),
        ('urls = ["http://127.1:1/x", "http://127.0.0.1:1/x/"]', "same URL twice"),
        ('url = "s3://b"\ntier = ["http://a:1#x"]', "not an http"),
        ('url = "s3://b"\ntier = "http://sc:1"\ntier_origin = "../x"', "tier_origin"),
        ('url = "s3://b"\nmax_requests = 0', "max_requests: expected a whole number"),
        ('url = "s3://b"\nmax_requests_per_second = "fast"', "expected requests a second"),
        ('url = "s3://b"\ntier = "http://sc:1"\ntier_refresh = -1', "must be positive"),
        ('url = "s3://b"\ntier = "http://sc:1"\ntier_headers = { X = 1 }', "a table of strings"),
    ):
        config.write_text(f"[origins.a]\n{bad}\n")
        with pytest.raises(ConfigError, match=message):
            load_settings({"config": str(config)}, {})


@pytest.mark.parametrize(
    ("value", "expected"),
    [("16KiB", 16384), ("0", 0), ("1MB", 1_000_000), (4096, 4096)],
)
def test_origin_min_speed_reads_a_floor_or_zero(value: object, expected: int) -> None:
    assert load_settings({"origin_min_speed": value}, {}).origin_min_speed == expected


@pytest.mark.parametrize("value", ["-1", "abc", "1e9999", "nan", "99999999999999999999", "１６"])
def test_origin_min_speed_refuses_what_no_floor_can_be(value: str) -> None:
    with pytest.raises(ConfigError, match="origin.min.speed"):
        load_settings({"origin_min_speed": value}, {})


def test_s3_access_keys_are_read_from_their_file_and_never_shown(tmp_path: Path) -> None:
    keys = tmp_path / "s3-keys"
    keys.write_text("# jobs\nAKIAJOBS00000001  secret/one+x=\n\nreader secret-two\n")
    flags = {
        "s3_access_keys_file": str(keys),
        "require_token_for_reads": True,
        "admin_token": "token-from-a-flag-000",
    }
    settings = load_settings(flags, {})
    assert settings.s3_access_keys == {"AKIAJOBS00000001": "secret/one+x=", "reader": "secret-two"}
    assert "secret" not in repr(settings)
    from_env = load_settings(
        {"require_token_for_reads": True, "admin_token": "token-from-a-flag-000"},
        {"SHARDCACHE_S3_ACCESS_KEYS_FILE": str(keys)},
    )
    assert from_env.s3_access_keys == settings.s3_access_keys
    assert load_settings({}, {}).s3_access_keys == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("AKIA1 secret extra\n", "line 1: expected `KEY_ID SECRET`"),
        ("AKIA1\n", "line 1: expected `KEY_ID SECRET`"),
        ("# only a comment\n", "holds no access key"),
        ("AKIA1 s1\nAKIA1 s2\n", "line 2: key id AKIA1 is given twice"),
        ("AKIA/1 s1\n", "line 1: expected"),
        ("AKIA1 s\u00e9cret\n", "not ASCII text"),
    ],
)
def test_a_bad_s3_access_keys_file_is_one_line_without_the_secret(
    tmp_path: Path, text: str, message: str
) -> None:
    keys = tmp_path / "s3-keys"
    keys.write_text(text)
    flags = {
        "s3_access_keys_file": str(keys),
        "require_token_for_reads": True,
        "admin_token": "token-from-a-flag-000",
    }
    with pytest.raises(ConfigError, match=re.escape(message)) as caught:
        load_settings(flags, {})
    assert "s1" not in str(caught.value) and "s2" not in str(caught.value)
    assert "--s3-access-keys-file" in str(caught.value)


def test_s3_access_keys_need_reads_behind_the_token(tmp_path: Path) -> None:
    keys = tmp_path / "s3-keys"
    keys.write_text("AKIA1 s1\n")
    with pytest.raises(ConfigError, match="--require-token-for-reads"):
        token = "token-from-a-flag-000"
        load_settings({"s3_access_keys_file": str(keys), "admin_token": token}, {})
    with pytest.raises(ConfigError, match="does not exist|cannot read"):
        load_settings({"s3_access_keys_file": str(tmp_path / "missing")}, {})
