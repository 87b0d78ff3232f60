"""The server's one error mapping (`serving.middleware.errors_as_json`), without sockets: every
`ShardcacheError` subclass becomes its status and `{"error": "..."}` with its kind, with the
headers its answer needs (Retry-After, Content-Range, WWW-Authenticate); an aiohttp
`HTTPException` keeps its status and headers but answers JSON; a bug is a bare 500 that quotes
nothing; no known error is a 500; shard failures are counted; an origin's location and
credentials stay out of what a client without the admin token is told."""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import math
import pkgutil
from collections.abc import Iterator
from typing import Any, cast

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from prometheus_client import CollectorRegistry

import shardcache
from shardcache.cache.shard_cache import ShardCache
from shardcache.cache.store import Store
from shardcache.errors import (
    ConfigError,
    OriginError,
    OriginShed,
    OriginThrottled,
    OriginUnavailable,
    QueueFull,
    RangeNotSatisfiable,
    RequestTimeout,
    ShardcacheError,
    ShuttingDown,
    Unauthorized,
)
from shardcache.keys import ERROR_KIND_HEADER
from shardcache.observability.logs import FailureLog
from shardcache.observability.metrics import Metrics
from shardcache.observer import NullObserver
from shardcache.serving.access import AccessPolicy
from shardcache.serving.middleware import errors_as_json
from shardcache.serving.server_state import CONTEXT_KEY, ServingContext
from tests.unit.fakes import FakeOrigin
from tests.unit.policies import make_policy

TOKEN = "s3cr3t-admin-token"
SHARD = {"origin": "fake", "key": "a.tar"}


def _every_error_class() -> list[type[ShardcacheError]]:
    """Every subclass in the package, wherever it is defined (each module imported first)."""
    for module in pkgutil.walk_packages(shardcache.__path__, "shardcache."):
        if not module.name.endswith("__main__"):
            importlib.import_module(module.name)
    found: list[type[ShardcacheError]] = []
    todo: list[type[ShardcacheError]] = [ShardcacheError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return sorted(found, key=lambda cls: cls.__name__)


ERRORS = _every_error_class()
ARGUMENTS: dict[str, Any] = {
    "message": "it failed",
    "size_bytes": 1234,
    "retry_after_s": 7.2,
    "code": "SignatureDoesNotMatch",
}


def instance(cls: type[ShardcacheError]) -> ShardcacheError:
    """One of `cls`, its constructor's required arguments filled in by name."""
    try:
        parameters = inspect.signature(cls).parameters
    except ValueError:  # Exception's own constructor: one message
        return cls("it failed")
    required = [
        name
        for name, parameter in parameters.items()
        if parameter.default is inspect.Parameter.empty
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    ]
    if not required:
        return cls("it failed")
    return cls(**{name: ARGUMENTS[name] for name in required})


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ShardCache]:
    """Only its origins' names are read (is a failed request a shard's?): one for the module."""
    store = Store(tmp_path_factory.mktemp("errors") / "cache", 1 << 20)
    yield ShardCache(store, {"fake": FakeOrigin()}, make_policy(), NullObserver())
    store.close()


@pytest.fixture
def app(cache: ShardCache) -> web.Application:
    """An application with what `errors_as_json` reads of the context (the cache's origin
    names, the metrics, the access policy, the failure log); the rest is never reached."""
    application = web.Application()
    application[CONTEXT_KEY] = ServingContext(
        cache=cache,
        prefetch=cast(Any, None),
        metrics=Metrics(CollectorRegistry(), ["fake"]),
        state=cast(Any, None),
        access=AccessPolicy(None),
        failures=FailureLog(logging.getLogger("test.errors")),
    )
    return application


def _with_access(app: web.Application, access: AccessPolicy) -> None:
    app[CONTEXT_KEY] = dataclasses.replace(app[CONTEXT_KEY], access=access)


async def answer(
    app: web.Application,
    raised: BaseException,
    path: str = "/fake/a.tar",
    headers: dict[str, str] | None = None,
) -> web.Response:
    """The response `errors_as_json` makes of a handler raising `raised`."""
    match_info = SHARD if path == "/fake/a.tar" else {}
    request = make_mocked_request("GET", path, headers, match_info=match_info, app=app)

    async def handler(request: web.Request) -> web.StreamResponse:
        raise raised

    response = await errors_as_json(request, handler)
    assert isinstance(response, web.Response)
    return response


def error_of(response: web.Response) -> str:
    assert response.content_type == "application/json"
    assert isinstance(response.body, bytes)
    document = json.loads(response.body)
    assert list(document) == ["error"] and isinstance(document["error"], str)
    assert document["error"]
    return str(document["error"])


def shard_errors(app: web.Application) -> float:
    value = app[CONTEXT_KEY].metrics.registry.get_sample_value(
        "shardcache_requests_total", {"origin": "fake", "result": "error"}
    )
    return value or 0.0


def test_every_error_class_is_covered() -> None:
    assert len(ERRORS) > 30
    assert {OriginThrottled, RangeNotSatisfiable, Unauthorized, RequestTimeout} <= set(ERRORS)


@pytest.mark.parametrize("cls", ERRORS, ids=lambda cls: cls.__name__)
async def test_each_error_class_maps_to_its_status_and_a_json_body(
    app: web.Application, cls: type[ShardcacheError]
) -> None:
    exc = instance(cls)
    response = await answer(app, exc)
    # Throttling is passed on as what it is (503 with the hint), whatever the class says.
    expected = 503 if isinstance(exc, OriginThrottled) else exc.status
    assert response.status == expected
    if cls not in (ShardcacheError, ConfigError):
        assert response.status != 500, "a known error answered as a bug"
    message = error_of(response)
    assert str(exc) in message or cls is RangeNotSatisfiable
    kind = response.headers.get(ERROR_KIND_HEADER)
    assert kind in (None, exc.kind)
    if isinstance(exc, OriginError) or exc.status >= 500:
        assert kind == exc.kind, "a tier member reads the kind of a failure from this header"
    assert "Traceback" not in message


async def test_throttling_and_a_busy_origin_pass_on_their_hint(app: web.Application) -> None:
    shed = (OriginShed("booked", 61.0), OriginShed("turn too far off", 9.5, "throttled"))
    for exc in (OriginThrottled("slow down", 7.2), *shed):
        response = await answer(app, exc)
        assert response.status == 503
        assert response.headers["Retry-After"] == str(math.ceil(exc.retry_after_s or 0))
        assert response.headers[ERROR_KIND_HEADER] == exc.kind  # a tier reads "throttled"
    no_hint = await answer(app, OriginThrottled("slow down"))
    assert no_hint.status == 503 and "Retry-After" not in no_hint.headers
    endless = await answer(app, OriginThrottled("slow down", 1e9))
    assert endless.headers["Retry-After"] == "3600"  # bounded to an hour


@pytest.mark.parametrize("exc", [ShuttingDown("stopping"), QueueFull("full")], ids=str)
async def test_shutdown_and_a_full_queue_ask_to_come_back(
    app: web.Application, exc: ShardcacheError
) -> None:
    response = await answer(app, exc)
    assert (response.status, response.headers["Retry-After"]) == (exc.status, "5")


async def test_a_range_past_the_end_names_the_length(app: web.Application) -> None:
    response = await answer(app, RangeNotSatisfiable(1234))
    assert response.status == 416
    assert response.headers["Content-Range"] == "bytes */1234"  # RFC 9110 §15.5.17


@pytest.mark.parametrize(("path", "scheme"), [("/_/status", "Bearer"), ("/_/", "Basic")])
async def test_unauthorized_carries_the_challenge(
    app: web.Application, path: str, scheme: str
) -> None:
    response = await answer(app, Unauthorized("token needed"), path)
    assert response.status == 401
    assert response.headers["WWW-Authenticate"] == f'{scheme} realm="shardcache"'


async def test_a_slow_request_body_closes_the_connection_and_is_counted(
    app: web.Application,
) -> None:
    registry = app[CONTEXT_KEY].metrics.registry
    response = await answer(app, RequestTimeout("body too slow"), "/_/prefetch")
    assert response.status == 408
    assert response.headers["Connection"] == "close" and not response.keep_alive
    assert registry.get_sample_value("shardcache_client_timeouts_total", {"phase": "body"}) == 1


async def test_shard_failures_are_counted_and_other_paths_are_not(app: web.Application) -> None:
    await answer(app, OriginUnavailable("reset"))
    await answer(app, OriginThrottled("slow down", 1.0))
    await answer(app, ConfigError("bad"))
    assert shard_errors(app) == 3
    await answer(app, OriginUnavailable("reset"), "/_/status")
    assert shard_errors(app) == 3


@pytest.mark.parametrize(
    ("exc", "kept"),
    [
        (web.HTTPNotFound(), {}),
        (web.HTTPMethodNotAllowed("PUT", ["GET", "HEAD"]), {"Allow": "GET,HEAD"}),
        (web.HTTPRequestEntityTooLarge(max_size=10, actual_size=20), {}),
        (web.HTTPBadRequest(headers={"X-Extra": "kept"}), {"X-Extra": "kept"}),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else "",
)
async def test_an_aiohttp_error_keeps_its_status_and_headers_and_answers_json(
    app: web.Application, exc: web.HTTPException, kept: dict[str, str]
) -> None:
    response = await answer(app, exc, "/_/status")
    assert response.status == exc.status
    assert error_of(response) == exc.reason
    for name, value in kept.items():
        assert response.headers[name] == value


async def test_an_aiohttp_answer_that_is_not_an_error_goes_through(app: web.Application) -> None:
    with pytest.raises(web.HTTPFound):
        await answer(app, web.HTTPFound("/_/"), "/_/status")
    already = web.HTTPConflict(text='{"error": "own"}', content_type="application/json")
    with pytest.raises(web.HTTPConflict):
        await answer(app, already, "/_/status")


async def test_a_bug_is_a_500_that_quotes_nothing(
    app: web.Application, caplog: pytest.LogCaptureFixture
) -> None:
    response = await answer(app, KeyError("secret-internal-detail"))
    assert response.status == 500
    assert "secret-internal-detail" not in error_of(response)
    assert "unhandled error" in caplog.text  # the daemon's log has it, with its traceback


@pytest.mark.parametrize("exc", [asyncio.CancelledError(), ConnectionResetError()], ids=repr)
async def test_a_cancelled_request_or_a_gone_client_is_not_answered(
    app: web.Application, exc: BaseException
) -> None:
    with pytest.raises(type(exc)):
        await answer(app, exc)


def origin_failure() -> OriginUnavailable:
    return OriginUnavailable(
        "https://user:hunter2@origin.internal/datasets/a.tar: connection reset"
    )


async def test_credentials_in_an_origin_failure_are_masked(app: web.Application) -> None:
    message = error_of(await answer(app, origin_failure()))
    assert "hunter2" not in message and "origin.internal" in message


@pytest.mark.parametrize("authorized", [False, True])
async def test_behind_a_token_an_origin_failure_hides_the_origin_from_others(
    app: web.Application, authorized: bool
) -> None:
    _with_access(app, AccessPolicy(TOKEN))
    headers = {"Authorization": f"Bearer {TOKEN}"} if authorized else None
    response = await answer(app, origin_failure(), headers=headers)
    assert response.status == 502
    message = error_of(response)
    assert ("origin.internal" in message) is authorized
    assert "hunter2" not in message
