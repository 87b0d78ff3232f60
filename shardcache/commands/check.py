"""`shardcache check`: ask every configured origin, before a job and without a daemon, whether
the daemon could read from it (reachable, TLS trusted, credentials accepted, bucket and each
`--key` there).

Origins are built as the daemon builds them (`wiring.build_origins`), one at a time, each asked
with a HEAD (of PROBE_KEY when no key is given: its "not found" shows the origin answered)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
from typing import TYPE_CHECKING, Any

from shardcache import config
from shardcache.errors import (
    BucketNotFound,
    ConfigError,
    InvalidKey,
    OriginDenied,
    OriginError,
    OriginHeadUnsupported,
    OriginNotFound,
    OriginThrottled,
    OriginTimeout,
    OriginUntrusted,
)
from shardcache.keys import validate_key
from shardcache.printable import printable
from shardcache.units import format_size

if TYPE_CHECKING:
    from shardcache.origins.receivers import ReceiverPool

PROBE_KEY = ".shardcache-check/no-such-key"
SLACK_S = 5.0  # beyond the origin's connect and read timeouts, for one HEAD


def add_parser(commands: Any) -> None:
    """Add `check` to the subcommands `commands` (argparse's subparsers action)."""
    check = commands.add_parser(
        "check",
        help="ask every configured origin whether it can be read (no daemon needed)",
        description="Build the origins as `serve` would (from --config or --origin, and the "
        "SHARDCACHE_* variables) and ask each with a HEAD: reachable, TLS certificate trusted, "
        "credentials accepted, bucket there, and each --key found. Exit 0 with one OK line "
        "per origin; 1 with one line per problem (on stderr); 2 for a bad setting.",
    )
    check.add_argument("--config", metavar="FILE", help="TOML file with the origins")
    check.add_argument(
        "--origin", action="append", metavar="NAME=URL", help="an origin (repeatable)"
    )
    check.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="ORIGIN/KEY",
        help="an example key to HEAD at that origin (repeatable)",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """One origin's answer: what was found (`found`) or what is wrong (`problems`)."""

    origin: str
    url: str
    found: list[str]
    problems: list[str]


def run_check(args: argparse.Namespace) -> int:
    # Imported here, as `serve` imports the daemon: `shardcache --help` stays fast.
    from shardcache.observability.logs import redact
    from shardcache.origins.receivers import ReceiverPool

    settings = config.load_settings(
        {"config": args.config, "origin": args.origin}, os.environ, for_daemon=False
    )
    if not settings.origins:
        raise ConfigError(
            "no origins configured: give --origin NAME=URL, SHARDCACHE_ORIGIN or --config FILE"
        )
    keys = _example_keys(args.key, [spec.name for spec in settings.origins])
    pool = ReceiverPool(1)  # HTTP(S) and S3 origins receive through it, as in the daemon
    try:
        verdicts = asyncio.run(_check_all(settings, keys, pool))
    finally:
        pool.close()
    for verdict in verdicts:  # problems quote origins' answers (status texts, messages)
        for problem in verdict.problems:
            print(printable(redact(f"{verdict.origin}: {problem}")), file=sys.stderr)
        if not verdict.problems:
            found = "; ".join(verdict.found)
            print(printable(redact(f"{verdict.origin}: OK ({verdict.url}: {found})")))
    return 1 if any(v.problems for v in verdicts) else 0


def _example_keys(given: list[str], names: list[str]) -> dict[str, list[str]]:
    """`--key ORIGIN/KEY` values by origin; ConfigError names one that cannot be used."""
    keys: dict[str, list[str]] = {name: [] for name in names}
    for text in given:
        name, _, key = text.partition("/")
        if name not in keys:
            known = ", ".join(names)
            raise ConfigError(f"--key {text[:200]!r}: no origin named {name!r} (have: {known})")
        try:
            keys[name].append(validate_key(key))
        except InvalidKey as exc:
            raise ConfigError(f"--key {text[:200]!r}: {exc}") from None
    return keys


async def _check_all(
    settings: config.Settings, keys: dict[str, list[str]], receivers: ReceiverPool
) -> list[Verdict]:
    checks = [_check_one(settings, spec, keys[spec.name], receivers) for spec in settings.origins]
    return list(await asyncio.gather(*checks))


async def _check_one(
    settings: config.Settings, spec: config.OriginSpec, keys: list[str], receivers: ReceiverPool
) -> Verdict:
    from shardcache.daemon.wiring import build_origins

    verdict = Verdict(spec.name, spec.url, [], [])
    try:
        one = dataclasses.replace(settings, origins=(spec,))
        origin = build_origins(one, receivers)[spec.name]
    except ConfigError as exc:
        verdict.problems.append(f"cannot be built: {exc}")
        return verdict
    budget_s = settings.origin_connect_timeout + settings.origin_read_timeout + SLACK_S
    try:
        for key in keys or [PROBE_KEY]:
            try:
                async with asyncio.timeout(budget_s):
                    info = await origin.head(key)
                verdict.found.append(f"{key}: {format_size(info.size_bytes)}")
            except BucketNotFound as exc:
                verdict.problems.append(f"bucket missing: {exc}")
                break  # every key would say the same
            except OriginNotFound as exc:
                if keys:
                    verdict.problems.append(f"example key not found: {exc}")
                else:  # the probe key is absent, as it should be: the origin answered
                    verdict.found.append(_answered(spec))
            except OriginHeadUnsupported:  # the origin answered; the daemon GETs instead
                verdict.found.append(f"{key}: answered (no HEAD: checked by GET when read)")
            except TimeoutError:
                verdict.problems.append(f"unreachable: no answer to a HEAD in {budget_s:g} s")
                break
            except OriginError as exc:  # denied, untrusted, down: every key would say the same
                verdict.problems.append(_problem(exc, spec, bool(keys)))
                break
    finally:
        await origin.aclose()
    return verdict


def _answered(spec: config.OriginSpec) -> str:
    if spec.scheme == "s3":
        return "credentials accepted, bucket exists"
    return "answered" + ("; TLS certificate trusted" if spec.scheme == "https" else "")


def _problem(exc: OriginError, spec: config.OriginSpec, has_keys: bool) -> str:
    """One line naming what is wrong with an origin, from the error its HEAD raised."""
    if isinstance(exc, OriginUntrusted):
        return f"TLS certificate not trusted: {exc}"
    if isinstance(exc, OriginDenied):
        hint = ""
        if spec.scheme == "s3" and not has_keys and "no AWS credentials" not in str(exc):
            hint = (
                " (S3 also answers 403 for a missing key when the credentials may not list "
                "the bucket: give --key ORIGIN/KEY of a key that exists)"
            )
        return f"access denied, check the credentials: {exc}{hint}"
    if isinstance(exc, OriginThrottled):
        return f"throttling: {exc}"
    if isinstance(exc, OriginTimeout):
        return f"unreachable (timed out): {exc}"
    return f"unreachable: {exc}"
