"""Dependencies point one way (server → cache → store/origins) and vendors stay confined.
Walks every module's imports with `ast`, so a stray import fails here, not in review."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "shardcache"

# module → package modules it may import (besides itself); "*" means anything.
ALLOWED: dict[str, set[str]] = {
    "observability": set(),
    "fetch": set(),
    "cluster": set(),
    "errors": set(),
    "units": set(),
    "keys": {"errors"},
    "serving.ranges": {"errors"},
    "checksums": {"errors"},
    # config/: the options table, then origins, then Settings and its loader; the package's
    # __init__ re-exports them (`from shardcache.config import Settings`).
    "config": {"config.options", "config.origins", "config.settings"},
    "config.options": {"units"},
    "config.origins": {"config.options", "errors", "keys"},
    "config.settings": {"config.options", "config.origins", "errors"},
    "observer": set(),
    "origins.base": {"checksums", "errors"},
    "origins": {
        "cluster.breaker",
        "config",
        "errors",
        "keys",
        "origins.base",
        "fetch.capped",
        "origins.s3",
        "origins.http",
        "origins.file",
        "cluster.upstreams",
    },
    "fetch.capped": {"errors", "origins.base"},
    "cluster.upstreams": {
        "cluster.breaker",
        "checksums",
        "errors",
        "origins.base",
        "cluster.rendezvous",
    },
    "cluster.breaker": set(),
    "cluster.rendezvous": set(),
    "origins.file": {"config", "errors", "keys", "origins.base"},
    "origins.threads": set(),
    "origins.pool": {"origins.threads"},
    "origins.responses": {
        "checksums",
        "errors",
        "keys",
        "origins.base",
        "origins.pool",
        "origins.threads",
    },
    "origins.http": {
        "__init__",
        "config",
        "errors",
        "keys",
        "origins",
        "origins.base",
        "origins.pool",
        "origins.receivers",
        "origins.responses",
        "origins.threads",
        "checksums",
    },
    # The receive path: the daemon's pool and its wire, and the receiving process, which
    # imports only what lands a body (no cache, no config, no event loop).
    "origins.wire": {"errors"},
    "origins.receivers": {"errors", "origins.receiver_handle", "origins.wire", "origins.threads"},
    "origins.receiver_handle": {"errors", "origins.wire"},
    "origins.landing": {
        "checksums",
        "errors",
        "origins.base",
        "origins.pool",
        "origins.responses",
    },
    "origins.receiver": {
        "errors",
        "origins.landing",
        "origins.pool",
        "origins.responses",
        "origins.threads",
        "origins.wire",
    },
    "origins.s3": {
        "config",
        "errors",
        "origins",
        "origins.base",
        "origins.http",
        "origins.s3_checksums",
        "checksums",
    },
    "origins.s3_checksums": {"checksums"},
    "fetch.checksum_trust": {"checksums", "observer"},
    "fetch.second_opinion": {"fetch.checksum_trust", "checksums", "errors"},
    # The cache, bottom up: values and pure rules; the diskcache adapter (the only module that
    # imports diskcache) and the directory; the evictor over the policies; the store over all.
    "cache": set(),
    "cache.entry": {"errors", "cache.plans"},
    "cache.space": {"units"},
    "cache.eviction": {"cache.admission", "cache.entry", "errors", "cache.plans"},
    "cache.transient": set(),
    "cache.index": {"errors"},
    "cache.directory": {"cache.entry", "cache.index", "errors"},
    "cache.evictor": {
        "cache.admission",
        "cache.entry",
        "cache.eviction",
        "cache.index",
        "cache.transient",
        "errors",
        "cache.plans",
    },
    "cache.store": {
        "cache.admission",
        "cache.directory",
        "cache.entry",
        "cache.evictor",
        "cache.index",
        "cache.space",
        "errors",
        "cache.plans",
    },
    "fetch.segments": {
        "origins.base",
        "config.options",
        "errors",
        "fetch.limiter",
        "observer",
        "checksums",
    },
    "fetch.limiter": {"errors"},
    "fetch.origin_table": {"fetch.limiter", "observer", "origins.base"},
    "cache.fill": {
        "fetch.checksum_trust",
        "fetch.second_opinion",
        "cache.entry",
        "cache.store",
        "origins.base",
        "checksums",
        "errors",
        "fetch.limiter",
        "observer",
        "cache.fill_state",
        "cache.passthrough",
        "fetch.segments",
    },
    "cache.fill_state": set(),
    "cache.passthrough": {"checksums", "errors", "origins.base", "fetch.segments"},
    "cache.flights": {"cache.fill"},
    "cache.shard_cache": {
        "fetch.checksum_trust",
        "cache.fill",
        "cache.flights",
        "cache.entry",
        "cache.store",
        "origins.base",
        "errors",
        "keys",
        "observer",
        "fetch.origin_table",
        "fetch.segments",
        "checksums",
    },
    "serving.body": {"cache.fill", "checksums", "errors", "origins.base"},
    "observability.metrics": {
        "__init__",
        "checksums",
        "observability.receiver_metrics",
        "observability.scrub_metrics",
        "observability.stall",
        "observability.status",
        "observability.upstream_metrics",
    },
    "observability.scrub_metrics": set(),
    "observability.receiver_metrics": set(),
    # Each origin's upstreams, read at scrape time from their breakers.
    "observability.upstream_metrics": {"cluster.breaker"},
    "observability.stall": set(),
    "observability.status": set(),
    "serving.middleware": {
        "serving.access",
        "cache.shard_cache",
        "serving.connections",
        "errors",
        "keys",
        "observability.logs",
        "observability.metrics",
        "prefetch.queue",
        "serving.server_state",
    },
    "serving.server_state": {"cache.scrub"},
    "serving": set(),
    "serving.status_page": {"serving.status_page_html"},
    "serving.status_page_html": set(),
    # The (origin, key) targets a prefetch or plans body names: request parsing, pure.
    "serving.targets": {"errors", "keys", "patterns"},
    "serving.admin": {
        "cache.catalog",
        "errors",
        "serving.middleware",
        "cache.plans",
        "prefetch.queue",
        "cache.scrub",
        "serving.targets",
    },
    # What the cache holds, by origin and glob (the index's key order): below the routes.
    "cache.catalog": {"errors", "origins.base", "cache.store"},
    "serving.server": {
        "serving.access",
        "serving.admin",
        "serving.body",
        "cache.shard_cache",
        "checksums",
        "serving.connections",
        "errors",
        "keys",
        "observability.logs",
        "observability.metrics",
        "serving.middleware",
        "prefetch.queue",
        "serving.ranges",
        "serving.server_state",
        "serving.status_page",
    },
    "serving.access": set(),
    "cache.admission": set(),
    "cache.plans": set(),
    "serving.connections": set(),
    # prefetch/: the queue over the look-ahead budget and the slots; they over the lanes, and
    # the slots over the concurrency tuner (pure).
    "prefetch": set(),
    "prefetch.queue": {
        "cache.shard_cache",
        "cache.fill",
        "errors",
        "observability.logs",
        "patterns",
        "prefetch.budget",
        "prefetch.lanes",
        "prefetch.slots",
    },
    "prefetch.budget": {"cache.shard_cache", "prefetch.lanes", "units"},
    "prefetch.slots": {"cache.fill", "prefetch.lanes", "prefetch.tuning"},
    "prefetch.lanes": set(),
    "prefetch.tuning": set(),
    "patterns": {"errors"},
    "client": {"printable"},
    "printable": set(),
    "webdataset": {"client"},
    "observability.logs": {"printable"},
    "sample": set(),
    "notify": set(),
    # The daemon's wiring (origins and store from Settings), below the daemon so that `check`
    # builds origins as it does without importing the server.
    "wiring": {
        "cache.admission",
        "cache.store",
        "config",
        "errors",
        "observability.metrics",
        "origins",
        "origins.file",
        "cache.plans",
    },
    # What `/_/status` and the scrape-time gauges read of the started parts (observability's
    # job, beside `status`, which shapes the document): above every part it reads.
    "readouts": {
        "__init__",
        "cluster.breaker",
        "cache.entry",
        "cache.shard_cache",
        "cache.store",
        "serving.connections",
        "observability.metrics",
        "origins.base",
        "fetch.capped",
        "origins.receivers",
        "cluster.upstreams",
        "prefetch.queue",
        "cache.scrub",
        "observability.scrub_metrics",
        "observability.status",
    },
    "daemon": {"*"},
    "cli": {
        "__init__",
        "observability",
        "commands",
        "config",
        "daemon",
        "errors",
        "observability.logs",
        "printable",
        "sample",
        "client",
        "commands.status_text",
        "units",
        "cache.verify",
    },
    # Subcommands in their own modules: ls/purge only through the daemon's HTTP API (client),
    # check through the daemon's own origin construction (`wiring`).
    "commands": set(),
    "commands.arguments": set(),
    "commands.cached": {"client", "printable", "units"},
    "commands.batch_progress": {"client", "printable", "units"},
    "commands.check": {
        "config",
        "errors",
        "keys",
        "observability.logs",
        "origins.receivers",
        "printable",
        "units",
        "wiring",
    },
    "commands.status_text": {"printable", "units"},
    "cache.verify": {"cache.directory", "cache.entry", "cache.store", "checksums", "errors"},
    "cache.scrub": {"cache.entry", "cache.store", "errors", "cache.scrub_check"},
    "cache.scrub_check": {"cache.entry", "cache.store", "checksums", "errors", "cache.verify"},
    "__init__": set(),
    "__main__": {"cli"},
}
VENDORS = {
    "boto3": {"origins.s3"},
    "botocore": {"origins.s3"},
    "diskcache": {"cache.index"},
    "prometheus_client": {
        "observability.metrics",
        "observability.receiver_metrics",
        "observability.scrub_metrics",
        "observability.upstream_metrics",
        "daemon",
    },
    "uvloop": {"daemon"},
}
AIOHTTP_WEB = {
    "serving.server",
    "serving.middleware",
    "serving.admin",
    "daemon",
    "observability.logs",
    "serving.status_page",
}
# Run in dataloader workers, and all the loader-only install (`pip install shardcache`, no
# extra) can run: stdlib and each other only.
LOADER_SIDE = {"client", "printable", "webdataset", "sample"}
# What the `shardcache` command imports before it knows the subcommand: the loader-only install
# runs `url`, `prefetch` and `stats` with it, so its module-level closure is stdlib only too.
LIGHT_ENTRY_POINTS = {"__init__", "__main__", "cli", *LOADER_SIDE}


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "shardcache":
            # `from shardcache import config, __version__`: modules, or names from __init__
            names |= {
                f"shardcache.{a.name}" if a.name in ALLOWED else "shardcache" for a in node.names
            }
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_every_module_imports_only_what_its_layer_allows() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        assert module in ALLOWED, f"new module {module}: add its layer to this test"
        for name in _imports(path):
            if name.startswith("shardcache"):
                target = name.removeprefix("shardcache").lstrip(".") or "__init__"
                if (
                    target != module
                    and "*" not in ALLOWED[module]
                    and target not in ALLOWED[module]
                ):
                    problems.append(f"{module} imports {target}")
            top = name.split(".")[0]
            if top in VENDORS and module not in VENDORS[top]:
                problems.append(f"{module} imports {name}")
            if name.startswith("aiohttp.web") and module not in AIOHTTP_WEB:
                problems.append(f"{module} imports {name}")
            if module in LOADER_SIDE and top in {"aiohttp", "boto3", "botocore", "diskcache"}:
                problems.append(f"{module} imports {name}")
    assert problems == []


def _module_level_imports(path: Path) -> set[str]:
    """The imports a module runs when it is imported (not those inside functions, nor those
    under `if TYPE_CHECKING:`), as absolute names."""
    names: set[str] = set()
    statements = list(ast.parse(path.read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "shardcache":
            names |= {
                f"shardcache.{a.name}" if a.name in ALLOWED else "shardcache" for a in node.names
            }
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            statements += node.body + node.orelse
        elif isinstance(node, ast.Try):
            statements += node.body + node.orelse + node.finalbody
            statements += [s for handler in node.handlers for s in handler.body]
    return names


def _path_of(module: str) -> Path:
    if module == "__init__":
        return PACKAGE / "__init__.py"
    as_file = PACKAGE.joinpath(*module.split(".")).with_suffix(".py")
    return as_file if as_file.exists() else PACKAGE.joinpath(*module.split("."), "__init__.py")


def test_the_loader_side_and_the_command_import_only_the_standard_library() -> None:
    """The loader-only install has no dependency: whatever the loader modules import, and what
    the `shardcache` command imports at start, must be the standard library (the daemon's
    modules are imported inside the commands that need them)."""
    problems = []
    for module in sorted(LOADER_SIDE):
        for name in _imports(_path_of(module)):
            target = name.removeprefix("shardcache").lstrip(".") or "__init__"
            if name.startswith("shardcache") and target not in LOADER_SIDE | {"__init__"}:
                problems.append(f"loader-side {module} imports shardcache.{target}")
            elif not name.startswith("shardcache"):
                if name.split(".")[0] not in sys.stdlib_module_names:
                    problems.append(f"loader-side {module} imports {name}")
    seen: set[str] = set()
    todo = sorted(LIGHT_ENTRY_POINTS)
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _module_level_imports(_path_of(module)):
            if name.startswith("shardcache"):
                todo.append(name.removeprefix("shardcache").lstrip(".") or "__init__")
            elif name.split(".")[0] not in sys.stdlib_module_names:
                problems.append(f"{module} (imported by the command at start) imports {name}")
    assert problems == []
