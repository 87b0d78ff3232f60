"""Configuration: flags, `SHARDCACHE_*` variables, a TOML file and defaults, read once into one
frozen `Settings`. Its parts, each importing only the ones before it:

- `parsers`: the value parsers the tables name (seconds, listen addresses, switches, choices,
  counts, paths, speeds, tokens; a plain size is `units.parse_size`) and the bounds they hold
  a value to;
- `options`: the OPTIONS table (flag, environment variable, TOML key, default, parser, whether a
  reload applies it) and the flags it generates; the only place a setting's default lives;
- `origins`: `OriginSpec` and the table of per-origin keys (`[origins.NAME]` in the file);
- `settings`: the frozen `Settings`, `load_settings` (precedence flag > env > file > default)
  and which changed settings a reload cannot apply.

It knows nothing of what the settings drive: no origin client, store or server is built here.
"""

from __future__ import annotations

from shardcache.config.options import (
    ENV_PREFIX,
    EVICTION_POLICIES,
    LOG_LEVELS,
    OPTIONS,
    Option,
    add_arguments,
)
from shardcache.config.origins import (
    MAX_UPSTREAMS,
    ORIGIN_OPTIONS,
    ORIGIN_SCHEMES,
    OriginOption,
    OriginSpec,
    parse_origin_url,
)
from shardcache.config.parsers import (
    MAX_MIN_SPEED,
    MAX_PREFETCH_CONCURRENCY,
    MAX_RECEIVERS,
    MIN_TOKEN_CHARS,
)
from shardcache.config.settings import (
    Settings,
    load_settings,
    read_config_file,
    settings_needing_restart,
)

__all__ = [
    "ENV_PREFIX",
    "EVICTION_POLICIES",
    "LOG_LEVELS",
    "MAX_MIN_SPEED",
    "MAX_PREFETCH_CONCURRENCY",
    "MAX_RECEIVERS",
    "MAX_UPSTREAMS",
    "MIN_TOKEN_CHARS",
    "OPTIONS",
    "ORIGIN_OPTIONS",
    "ORIGIN_SCHEMES",
    "Option",
    "OriginOption",
    "OriginSpec",
    "Settings",
    "add_arguments",
    "load_settings",
    "parse_origin_url",
    "read_config_file",
    "settings_needing_restart",
]
