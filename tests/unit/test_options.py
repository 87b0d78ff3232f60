"""The options tables are the one source: every default, whether a reload applies a setting,
and which keys an `[origins.NAME]` table takes."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import pytest

from shardcache.config import OPTIONS, Settings, load_settings, settings_needing_restart
from shardcache.config.options import default
from shardcache.connections import ConnectionLimits
from shardcache.daemon import Daemon
from shardcache.segments import RetryPolicy

# Settings fields that are not an option of the same name: `listen` is split in two, origins
# have their own table, `config` names the file read.
NOT_OPTIONS = {"listen_host", "listen_port", "origins", "config"}


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


def test_hand_built_values_take_their_defaults_from_the_table() -> None:
    settings = _defaults()
    policy = RetryPolicy()
    assert policy.retries == settings.origin_retries == default("origin_retries")
    assert policy.read_timeout_s == settings.origin_read_timeout
    assert policy.connections == settings.origin_connections
    assert policy.segment_bytes == settings.segment_size == 16 << 20
    with pytest.raises(KeyError):
        default("no_such_option")
