"""Settings: one frozen, typed object, validated once at load time.

Every setting has a flag (`--cache-size`), an environment variable (`SHARDCACHE_CACHE_SIZE`) and a
TOML key (`cache_size`) of the same name, all generated from `OPTIONS`, where every default lives.
Precedence: flag > environment > file > default. Origins merge by name with the same precedence.
This package is the only one that reads `os.environ` for the daemon.
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from shardcache.config.options import ENV_PREFIX, OPTIONS
from shardcache.config.origins import OriginSpec, merge_origin, origin_from_pair, origins_from_file
from shardcache.config.parsers import parse_token
from shardcache.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Settings:
    """Every setting, parsed. No field has a default: only `load_settings` builds one, from
    the OPTIONS table, so a default lives in one place (`options.default` reads one)."""

    listen_host: str  # `listen` (HOST:PORT), split
    listen_port: int
    cache_dir: Path
    cache_size: int
    origins: tuple[OriginSpec, ...]
    log_level: str
    log_format: Literal["text", "json"]
    origin_connect_timeout: float
    origin_read_timeout: float
    origin_retries: int
    origin_min_speed: int
    prefetch_concurrency: int | None  # None: auto, tuned to what the origin delivers
    prefetch_max_bytes: int | None  # None: a quarter of cache_size
    readahead: int
    prefetch_pin_max_seconds: float
    eviction: str
    origin_connections: int
    segment_size: int
    worker_threads: int
    receivers: int  # receiving processes; 0: one per core available (origins.receivers)
    shutdown_grace: float
    client_idle_timeout: float
    client_header_timeout: float
    client_body_timeout: float
    client_send_timeout: float
    max_connections: int
    max_connections_per_client: int
    listen_backlog: int | None  # None: the system's bound (net.core.somaxconn)
    admin_token: str | None = field(repr=False)  # never shown, never logged
    admin_token_file: Path | None  # the setting as given (read into admin_token if it wins)
    require_token_for_reads: bool
    insecure_no_token: bool
    s3_access_keys_file: Path | None  # the setting as given (read into s3_access_keys)
    s3_access_keys: Mapping[str, str] = field(repr=False)  # key id -> secret, never shown
    scrub_rate: int  # bytes/s, 0: off
    verify_hits: bool  # hits checked per block before their last byte
    verify_hits_window: float  # seconds a checked block counts as checked (0: every hit)
    s3_buckets_on_demand: int  # buckets made origins on an S3 client's first use (0: none)
    config: Path | None  # the TOML file read, if any

    @property
    def prefetch_budget_bytes(self) -> int:
        return self.prefetch_max_bytes or self.cache_size // 4

    @property
    def is_loopback(self) -> bool:
        """Whether only this machine can reach the listen address (127.0.0.0/8, ::1)."""
        if self.listen_host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.listen_host).is_loopback
        except ValueError:
            return False  # a host name: it may resolve to anything

    @property
    def listen(self) -> str:
        host = f"[{self.listen_host}]" if ":" in self.listen_host else self.listen_host
        return f"{host}:{self.listen_port}"


CONFIG_FILE_MAX_BYTES = 1 << 20  # a settings file is a few KiB; /dev/zero is not one


def read_config_file(path: Path) -> dict[str, Any]:
    """Return the parsed TOML at `path`; raise ConfigError with the file and problem.

    Only a regular file of at most CONFIG_FILE_MAX_BYTES, UTF-8, is read: a FIFO would hang
    the command, a device or a huge file take all memory, and TOML nested thousands deep
    exhausts the parser's recursion."""
    try:
        # O_NONBLOCK: opening a FIFO for reading waits for a writer; fstat then refuses it.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(f"--config: {path} does not exist") from None
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ConfigError(f"--config: {path} is not a regular file")
        with os.fdopen(fd, "rb") as stream:
            data = stream.read(CONFIG_FILE_MAX_BYTES + 1)  # st_size lies for /proc files
    except OSError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc.strerror or exc}") from None
    if len(data) > CONFIG_FILE_MAX_BYTES:
        raise ConfigError(f"--config: {path} is larger than 1 MiB: not a settings file")
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"--config: {path} is not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"--config: cannot read {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"--config: cannot read {path}: nested too deep") from None


def load_settings(
    flags: Mapping[str, Any],
    environ: Mapping[str, str],
    config_path: str | None = None,
    for_daemon: bool = True,
) -> Settings:
    """Return validated Settings from flags (None = unset), the environment and a TOML file.

    `for_daemon=False`: a command only reads where the daemon listens and its origins, so the
    rules for serving (an admin token beyond loopback) are not its to enforce.
    Raises ConfigError whose message names the offending setting and where it came from.
    """
    path_text = config_path or flags.get("config") or environ.get(ENV_PREFIX + "CONFIG")
    path = Path(path_text) if path_text else None
    file_values = read_config_file(path) if path else {}
    known = {o.name for o in OPTIONS} | {"origins"}
    unknown = set(file_values) - known
    if unknown:
        raise ConfigError(f"{path}: unknown setting(s) {', '.join(sorted(unknown))}")

    values: dict[str, Any] = {}
    sources: dict[str, tuple[int, str]] = {}  # option → (precedence level, where it was set)
    for option in OPTIONS:
        candidates = (
            (flags.get(option.name), option.flag),
            (environ.get(option.env), option.env),
            (file_values.get(option.name), f"{option.name} in {path}"),
            (option.default, f"default {option.name}"),
        )
        level, raw, where = next((i, v, w) for i, (v, w) in enumerate(candidates) if v is not None)
        sources[option.name] = (level, where)
        try:
            values[option.name] = option.parse(raw)
        except ValueError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    origins = origins_from_file(file_values.get("origins", {}), environ, str(path))
    env_origins = environ.get(ENV_PREFIX + "ORIGIN", "")
    env_pairs = re.split(r"[,\s]+", env_origins.strip()) if env_origins.strip() else []
    for pairs, where in (
        (env_pairs, ENV_PREFIX + "ORIGIN"),
        (flags.get("origin") or [], "--origin"),
    ):
        given: set[str] = set()
        for pair in pairs:
            spec = origin_from_pair(pair, where)
            if spec.name in given:  # one source naming it twice: which one was meant?
                raise ConfigError(f"{where}: origin {spec.name!r} is given twice")
            given.add(spec.name)
            origins[spec.name] = merge_origin(origins.get(spec.name), spec)

    host, port = values.pop("listen")
    values["admin_token"] = _admin_token(
        (values.pop("admin_token"), *sources["admin_token"]),
        (values["admin_token_file"], *sources["admin_token_file"]),
    )
    keys_file = values["s3_access_keys_file"]
    values["s3_access_keys"] = (
        read_access_keys(keys_file, sources["s3_access_keys_file"][1]) if keys_file else {}
    )
    settings = Settings(
        listen_host=host,
        listen_port=port,
        origins=tuple(origins.values()),
        config=path,
        **values,
    )
    if for_daemon:
        _check_access(settings)
    return settings


def _check_access(settings: Settings) -> None:
    """Refuse a daemon that anyone on the network could drive with the node's credentials,
    and S3 access keys that would check nothing (reads open to all without them)."""
    if settings.s3_access_keys and not settings.require_token_for_reads:
        raise ConfigError(
            "--s3-access-keys-file: S3 signatures are checked only where reads need the "
            "token; add --require-token-for-reads (and an admin token)"
        )
    if settings.admin_token is not None:
        return
    if settings.require_token_for_reads:
        raise ConfigError("--require-token-for-reads: needs --admin-token-file or --admin-token")
    if not settings.is_loopback and not settings.insecure_no_token:
        raise ConfigError(
            f"--listen {settings.listen}: other machines can reach this address, so an admin "
            "token is required (--admin-token-file FILE or SHARDCACHE_ADMIN_TOKEN); "
            "--insecure-no-token runs without one"
        )


def _admin_token(
    token: tuple[str | None, int, str], token_file: tuple[Path | None, int, str]
) -> str | None:
    """The token from the one of the two settings given with the higher precedence (flag >
    environment > file); both at the same level is an error, since one would be ignored."""
    value, level, where = token
    path, file_level, file_where = token_file
    if path is not None and (value is None or file_level < level):
        return _read_token_file(path, file_where)
    if path is not None and file_level == level:
        raise ConfigError(f"{where} and {file_where}: give one, not both")
    return value


def _read_token_file(path: Path, where: str) -> str:
    """The token in `path` (a Kubernetes Secret, a systemd credential), stripped of space."""
    try:
        text = path.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not ASCII text"
        raise ConfigError(f"{where}: cannot read {path}: {reason}") from None
    try:
        token = parse_token(text)
    except ValueError as exc:
        raise ConfigError(f"{where} {path}: the token {exc}") from None
    if token is None:
        raise ConfigError(f"{where}: {path} is empty")
    return token


def settings_needing_restart(old: Settings, new: Settings) -> list[str]:
    """The settings changed from `old` to `new` that a reload does not apply (the `reloads`
    column of OPTIONS), in the table's order: `Daemon.reload` reports them as needing a
    restart. Every option is a `Settings` attribute of its own name (`listen` a property)."""
    return [
        option.name
        for option in OPTIONS
        if not option.reloads and getattr(new, option.name) != getattr(old, option.name)
    ]


ACCESS_KEYS_MAX_BYTES = 1 << 20
_KEY_ID = re.compile(r"[A-Za-z0-9_.-]{1,128}")


def read_access_keys(path: Path, where: str) -> dict[str, str]:
    """The S3 access keys in `path`: one `KEY_ID SECRET` a line (blank lines and `#` comments
    skipped), key ids unique. A message names the line, never a secret."""
    try:
        with path.open("rb") as stream:
            data = stream.read(ACCESS_KEYS_MAX_BYTES + 1)
        text = data.decode("ascii")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not ASCII text"
        raise ConfigError(f"{where}: cannot read {path}: {reason}") from None
    if len(data) > ACCESS_KEYS_MAX_BYTES:
        raise ConfigError(f"{where}: {path} is larger than 1 MiB: not a key file")
    keys: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2 or not _KEY_ID.fullmatch(words[0]):
            raise ConfigError(
                f"{where} {path} line {number}: expected `KEY_ID SECRET` (a key id of letters, "
                "digits, `_.-`, then its secret, no spaces)"
            )
        key_id, secret = words
        if not all(33 <= ord(c) < 127 for c in secret):
            raise ConfigError(f"{where} {path} line {number}: the secret is not printable ASCII")
        if key_id in keys:
            raise ConfigError(f"{where} {path} line {number}: key id {key_id} is given twice")
        keys[key_id] = secret
    if not keys:
        raise ConfigError(f"{where}: {path} holds no access key")
    return keys
