"""The options tables are the one source: every default, whether a reload applies a setting,
and which keys an `[origins.NAME]` table takes."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import pytest

from shardcache.config import (
    OPTIONS,
    ORIGIN_OPTIONS,
    OriginOption,
    OriginSpec,
    Settings,
    load_settings,
    settings_needing_restart,
)
from shardcache.config.options import default
from shardcache.daemon.lifecycle import Daemon
from shardcache.daemon.wiring import fetch_policy
from shardcache.errors import ConfigError
from shardcache.fetch.policy import FetchPolicy
from shardcache.origins.base import Timeouts
from shardcache.serving.connections import ConnectionLimits

DOCS = Path(__file__).resolve().parents[3] / "docs"
# Settings fields that are not an option of the same name: `listen` is split in two, origins
# have their own table, `config` names the file read, `s3_access_keys` is read from
# `s3_access_keys_file`.
NOT_OPTIONS = {"listen_host", "listen_port", "origins", "config", "s3_access_keys"}


def _defaults() -> Settings:
    return load_settings({}, {})


def test_every_option_is_a_settings_attribute_and_every_field_an_option() -> None:
    names = {option.name for option in OPTIONS}
    fields = {f.name for f in dataclasses.fields(Settings)}
    assert fields - NOT_OPTIONS == names - {"listen"}
    settings = _defaults()
    for option in OPTIONS:
        getattr(settings, option.name)  # `listen` too, as a property


def test_settings_has_no_default_of_its_own() -> None:
    """Only the loader builds Settings, from the table: a field default would be a second copy."""
    with_default = [
        f.name
        for f in dataclasses.fields(Settings)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    ]
    assert with_default == []
    assert [
        f.name for f in dataclasses.fields(ConnectionLimits) if f.default is not dataclasses.MISSING
    ] == []


def test_every_option_says_whether_a_reload_applies_it() -> None:
    assert all(isinstance(option.reloads, bool) for option in OPTIONS)
    assert "reloads" in {f.name for f in dataclasses.fields(OPTIONS[0])}
    with pytest.raises(TypeError, match="reloads"):  # no default: a new row must say
        type(OPTIONS[0])("x", str, "", "help")  # type: ignore[call-arg]


def test_a_reload_reports_exactly_the_settings_the_table_says_it_cannot_apply() -> None:
    """Each option changed alone: the reload's report names it unless its row `reloads`."""
    old = _defaults()
    for option in OPTIONS:
        changed: dict[str, Any] = (
            {"listen_port": old.listen_port + 1}
            if option.name == "listen"
            else {option.name: object()}  # unequal to any value
        )
        new = dataclasses.replace(old, **changed)
        expected = [] if option.reloads else [option.name]
        assert settings_needing_restart(old, new) == expected, option.name
    assert settings_needing_restart(old, old) == []


def test_the_settings_a_reload_applies_are_applied_by_the_daemons_reload() -> None:
    """A row marked `reloads` must be read from the new settings in `Daemon.reload`; a row the
    reload applies but the table calls restart-only would be reported wrongly."""
    source = inspect.getsource(Daemon.reload)
    reloadable = {option.name for option in OPTIONS if option.reloads}
    assert reloadable == {"log_level", "log_format", "receivers"}
    for name in reloadable:
        assert f"new.{name}" in source, f"Daemon.reload does not apply {name}"
    applied = {name for name in (o.name for o in OPTIONS) if f"new.{name}" in source}
    assert applied == reloadable


def test_the_fetch_policy_has_no_defaults_and_carries_the_settings() -> None:
    """The daemon builds it from Settings (`wiring.fetch_policy`); a default written into the
    dataclass would be a second copy of the table's, free to drift from it."""
    assert not [
        field.name
        for field in dataclasses.fields(FetchPolicy)
        if field.default is not dataclasses.MISSING
        or field.default_factory is not dataclasses.MISSING
    ]
    settings = dataclasses.replace(
        _defaults(), origin_read_timeout=7.0, origin_min_speed=1000, origin_connect_timeout=2.0
    )
    policy = fetch_policy(settings)
    assert policy.retries == settings.origin_retries == default("origin_retries")
    assert policy.timeouts == Timeouts(2.0, 7.0, 1000) and policy.read_timeout_s == 7.0
    assert policy.connections == settings.origin_connections
    assert policy.segment_bytes == settings.segment_size == 16 << 20
    assert policy.first_segment_bytes == 2 << 20
    small = fetch_policy(dataclasses.replace(settings, segment_size=1 << 20))
    assert small.first_segment_bytes == 1 << 20  # never more than a segment
    with pytest.raises(KeyError):
        default("no_such_option")


def test_an_origin_takes_exactly_the_keys_of_its_table(tmp_path: Path) -> None:
    keys = {option.key for option in ORIGIN_OPTIONS}
    assert keys >= {"url", "urls", "headers", "tier", "max_requests", "ca_file"}
    config = tmp_path / "shardcache.toml"
    config.write_text('[origins.a]\nurl = "http://example.com"\nmax_request = 4\n')
    with pytest.raises(ConfigError, match=r"\[origins\.a\]: unknown key\(s\) max_request$"):
        load_settings({}, {}, str(config))


def test_an_origin_without_a_key_gets_the_tables_default(tmp_path: Path) -> None:
    config = tmp_path / "shardcache.toml"
    config.write_text('[origins.a]\nurl = "http://example.com"\n')
    (spec,) = load_settings({}, {}, str(config)).origins
    by_key = {option.key: option for option in ORIGIN_OPTIONS}
    assert spec.follow_redirects is by_key["follow_redirects"].default is False
    assert spec.tier_refresh_s == by_key["tier_refresh"].default == 30.0
    assert spec == OriginSpec("a", "http://example.com")  # a hand-built one: the same defaults


@pytest.mark.parametrize(
    "option", [o for o in ORIGIN_OPTIONS if o.parse is not None], ids=lambda o: o.key
)
def test_a_wrong_value_for_any_origin_key_is_one_line_naming_it(
    option: OriginOption, tmp_path: Path
) -> None:
    """Hostile input for every key the table parses: a list where a value belongs."""
    config = tmp_path / "shardcache.toml"
    config.write_text(f'[origins.a]\nurl = "http://example.com"\n{option.key} = [[1], "x"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings({}, {}, str(config))
    message = str(caught.value)
    assert f"[origins.a]: {option.key}: " in message and "\n" not in message


def test_a_tier_key_without_a_tier_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "shardcache.toml"
    for option in (o for o in ORIGIN_OPTIONS if o.needs_tier):
        value = '{ X = "y" }' if option.key == "tier_headers" else '"b"'
        if option.key == "tier_refresh":
            value = "5"
        config.write_text(f'[origins.a]\nurl = "http://example.com"\n{option.key} = {value}\n')
        with pytest.raises(ConfigError, match=f"{option.key} without a tier"):
            load_settings({}, {}, str(config))


def test_every_origin_key_is_documented() -> None:
    docs = "\n".join(page.read_text() for page in DOCS.glob("*.md"))
    undocumented = [o.key for o in ORIGIN_OPTIONS if f"`{o.key}" not in docs]
    assert undocumented == []
