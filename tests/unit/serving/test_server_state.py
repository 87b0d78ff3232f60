"""One serving edge: the application holds one typed `ServingContext` under one key, and
serving reports metrics through `Metrics` methods, never a family's `.labels()` (issue 38,
item 5)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, cast

from prometheus_client import CollectorRegistry

from shardcache.observability.metrics import Metrics
from shardcache.origins.base import Timeouts
from shardcache.serving.access import AccessPolicy
from shardcache.serving.server import make_app
from shardcache.serving.server_state import CONTEXT_KEY, ServerState, ServingContext

PACKAGE = Path(__file__).resolve().parents[3] / "shardcache"


def _calls(folder: Path, attribute: str) -> list[str]:
    """`path:line` of every call of a method or function named `attribute` under `folder`."""
    found = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == attribute
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    return found


def test_the_application_holds_the_context_and_nothing_beside_it() -> None:
    state = ServerState(
        origin_timeouts=Timeouts(connect_s=1.0, read_s=1.0),
        client_body_timeout_s=1.0,
        client_send_timeout_s=1.0,
        check_ready=lambda: None,
        status=dict,
        origins=cast(Any, None),
    )
    context = ServingContext(
        cache=cast(Any, None),
        prefetch=cast(Any, None),
        metrics=Metrics(CollectorRegistry(), ["o"]),
        state=state,
        access=AccessPolicy(None),
    )
    app = make_app(context)
    assert app[CONTEXT_KEY] is context
    assert list(app) == [CONTEXT_KEY]


def test_one_application_key_in_the_package() -> None:
    places = [where.partition(":")[0] for where in _calls(PACKAGE, "AppKey")]
    assert places == ["serving/server_state.py"]


def test_serving_never_labels_a_metric_family_itself() -> None:
    assert _calls(PACKAGE / "serving", "labels") == []
    assert _calls(PACKAGE / "daemon", "labels") == []
