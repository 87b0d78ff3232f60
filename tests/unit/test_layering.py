"""The house, checked: folders point one way, the modules inside a folder point one way, and
each vendor stays in the folder that owns it. Walks every module's imports with `ast`, so a
stray import fails here, not in review. This file is the source of truth for the house plan
(the engineers' style guide's folder table) and CONTRIBUTING's code map."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "shardcache"

# The package's parts, top to bottom: each may import only the parts after it. Parts that
# share a rank (a tuple of several) may not import each other. `cli` is `cli.py`,
# `__main__.py` and `commands/`; `foundation` is every other module at the package root.
LAYERS: list[tuple[str, ...]] = [
    ("cli",),
    ("daemon",),
    ("serving",),
    ("prefetch",),
    ("observability",),
    ("cache",),
    ("fetch", "cluster"),
    ("origins",),
    ("config",),
    ("loader",),
    ("foundation",),
]

# Inside each part, its modules top to bottom: each may import only those after it. A new
# module fails `test_every_module_has_a_place` until it is given its place here.
ORDER: dict[str, list[str]] = {
    "cli": [
        "__main__",
        "cli",
        "commands.check",
        "commands.verify",
        "commands.cached",
        "commands.batch_progress",
        "commands.arguments",
        "commands.status_text",
        "commands",
    ],
    "daemon": [
        "daemon.lifecycle",
        "daemon.wiring",
        "daemon.buckets",
        "daemon.origin_factory",
        "daemon.readouts",
        "daemon.notify",
        "daemon",
    ],
    "serving": [
        "serving.server",
        "serving.s3_api",
        "serving.hit_lane",
        "serving.hit_answer",
        "serving.lane_requests",
        "serving.objects",
        "serving.object_headers",
        "serving.admin",
        "serving.status_page",
        "serving.s3_errors",
        "serving.middleware",
        "serving.status_page_html",
        "serving.server_state",
        "serving.body",
        "serving.ranges",
        "serving.conditionals",
        "serving.connections",
        "serving.access",
        "serving.targets",
        "serving.s3_names",
        "serving.s3_signatures",
        "serving.s3_buckets",
        "serving",
    ],
    "prefetch": [
        "prefetch.queue",
        "prefetch.dispatch",
        "prefetch.sweep",
        "prefetch.read_ahead",
        "prefetch.backlog",
        "prefetch.tally",
        "prefetch.slots",
        "prefetch.budget",
        "prefetch.pins",
        "prefetch.tuning",
        "prefetch.lanes",
        "prefetch.item_state",
        "prefetch.missing",
        "prefetch",
    ],
    "observability": [
        "observability.metrics",
        "observability.cache_metrics",
        "observability.receiver_metrics",
        "observability.scrub_metrics",
        "observability.upstream_metrics",
        "observability.status",
        "observability.stall",
        "observability.logs",
        "observability",
    ],
    # The miss pipeline top down (drawn in cache/__init__): the facade, single flight, the
    # fill, the store over the evictor over the policies, the diskcache adapter at the bottom.
    "cache": [
        "cache.shard_cache",
        "cache.fill_runner",
        "cache.lease",
        "cache.purge",
        "cache.flights",
        "cache.fill",
        "cache.body_check",
        "cache.fill_readers",
        "cache.fill_state",
        "cache.passthrough",
        "cache.hit_check",
        "cache.scrub",
        "cache.scrub_check",
        "cache.verify",
        "cache.catalog",
        "cache.unread",
        "cache.store",
        "cache.walks",
        "cache.evictor",
        "cache.eviction",
        "cache.directory",
        "cache.entry",
        "cache.blocks",
        "cache.transient",
        "cache.index",
        "cache.space",
        "cache.admission",
        "cache.plans",
        "cache",
    ],
    "fetch": [
        "fetch.segments",
        "fetch.origin_table",
        "fetch.gate",
        "fetch.throttle",
        "fetch.second_opinion",
        "fetch.checksum_trust",
        "fetch.policy",
        "fetch",
    ],
    "cluster": [
        "cluster.upstreams",
        "cluster.tier",
        "cluster.breaker",
        "cluster.rendezvous",
        "cluster",
    ],
    # Backends over the receive path: the daemon's pool, then the receiving process's side.
    "origins": [
        "origins.s3",
        "origins.s3_checksums",
        "origins.http",
        "origins.receivers",
        "origins.receiver_handle",
        "origins.receiver",
        "origins.landing",
        "origins.splice",
        "origins.responses",
        "origins.pool",
        "origins.threads",
        "origins.wire",
        "origins.file",
        "origins.file_listing",
        "origins.listing",
        "origins.location",
        "origins.streams",
        "origins.base",
        "origins",
    ],
    "config": [
        "config",
        "config.settings",
        "config.origins",
        "config.options",
        "config.parsers",
    ],
    "loader": [
        "loader.webdataset",
        "loader.pipeline_order",
        "loader.client",
        "loader.sample",
        "loader",
    ],
    "foundation": [
        "keys",
        "patterns",
        "crc_spans",
        "checksums",
        "errors",
        "observer",
        "printable",
        "units",
        "log_limit",
        "backoff",
        "__init__",
    ],
}

# Third parties, each confined to the parts (or modules) named: what a vendor may change
# touches one folder.
VENDORS: dict[str, set[str]] = {
    "boto3": {"origins.s3"},
    "botocore": {"origins.s3"},
    "diskcache": {"cache.index"},
    "prometheus_client": {"observability", "daemon.lifecycle"},
    "uvloop": {"daemon"},
    # The access line is an aiohttp `AbstractAccessLogger`: the one use outside serving/.
    "aiohttp": {"serving", "daemon", "observability.logs"},
}
# Run in dataloader workers, and all the loader-only install (`pip install shardcache`, no
# extra) can run: stdlib and each other only.
LOADER_SIDE = {
    "loader",
    "loader.client",
    "loader.webdataset",
    "loader.pipeline_order",
    "loader.sample",
    "printable",
}
# What the `shardcache` command imports before it knows the subcommand: the loader-only install
# runs `url`, `prefetch` and `stats` with it, so its module-level closure is stdlib only too.
LIGHT_ENTRY_POINTS = {"__init__", "__main__", "cli", *LOADER_SIDE}
MODULES = {module for modules in ORDER.values() for module in modules}


def _module_name(path: Path) -> str:
    relative = path.relative_to(PACKAGE).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _part_of(module: str) -> str:
    return next(part for part, modules in ORDER.items() if module in modules)


def _rank_of(part: str) -> int:
    return next(rank for rank, parts in enumerate(LAYERS) if part in parts)


def _package_module(package: str, name: str) -> str:
    """What `from shardcache<package> import <name>` imports: the module `name` when it is
    one, else the package's own module (its `__init__`)."""
    candidate = f"{package}.{name}".lstrip(".")
    if candidate in MODULES:
        return candidate
    return package.lstrip(".") or "__init__"


def _imports(path: Path) -> set[str]:
    """Every import in the module (functions' too), as absolute names; a package module as
    its dotted name under shardcache with a `shardcache:` prefix."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "shardcache" or node.module.startswith("shardcache."):
                package = node.module.removeprefix("shardcache")
                names |= {f"shardcache:{_package_module(package, a.name)}" for a in node.names}
            else:
                names.add(node.module)
    return names


def _allowed(module: str, target: str) -> bool:
    part, target_part = _part_of(module), _part_of(target)
    if part != target_part:
        return _rank_of(target_part) > _rank_of(part)
    order = ORDER[part]
    return order.index(target) > order.index(module)


def _confined(module: str, where: set[str]) -> bool:
    return module in where or _part_of(module) in where or module.split(".")[0] in where


def test_every_module_has_a_place() -> None:
    on_disk = {_module_name(path) for path in PACKAGE.rglob("*.py")}
    assert on_disk - MODULES == set(), "new modules: give each its place in ORDER"
    assert MODULES - on_disk == set(), "ORDER names modules that are gone"
    for part in ORDER:
        assert sum(part in parts for parts in LAYERS) == 1, part


def test_every_module_imports_only_what_its_layer_allows() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        for name in _imports(path):
            if name.startswith("shardcache:"):
                target = name.removeprefix("shardcache:")
                if target != module and not _allowed(module, target):
                    problems.append(f"{module} imports {target}")
                continue
            top = name.split(".")[0]
            if top in VENDORS and not _confined(module, VENDORS[top]):
                problems.append(f"{module} imports {name}")
    assert problems == []


def test_the_rules_catch_what_they_forbid() -> None:
    """The checks above can fail: an import back up, across peers, up inside a folder, and a
    vendor outside its folder are each refused."""
    assert not _allowed("cache.store", "serving.server")
    assert not _allowed("fetch.segments", "cluster.upstreams")
    assert not _allowed("cache.store", "cache.fill")
    assert not _allowed("loader.client", "config.settings")
    assert _allowed("cache.fill", "cache.store") and _allowed("serving.body", "cache.fill")
    assert not _confined("cache.store", VENDORS["diskcache"])
    assert _confined("observability.metrics", VENDORS["prometheus_client"])


def _module_level_imports(path: Path) -> set[str]:
    """The imports a module runs when it is imported (not those inside functions, nor those
    under `if TYPE_CHECKING:`), as absolute names."""
    names: set[str] = set()
    statements = list(ast.parse(path.read_text()).body)
    while statements:
        node = statements.pop()
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module == "shardcache" or node.module.startswith("shardcache."):
                package = node.module.removeprefix("shardcache")
                names |= {f"shardcache:{_package_module(package, a.name)}" for a in node.names}
            else:
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
            target = name.removeprefix("shardcache:")
            if name.startswith("shardcache:") and target not in LOADER_SIDE | {"__init__"}:
                problems.append(f"loader-side {module} imports shardcache.{target}")
            elif not name.startswith("shardcache:"):
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
            if name.startswith("shardcache:"):
                todo.append(name.removeprefix("shardcache:"))
            elif name.split(".")[0] not in sys.stdlib_module_names:
                problems.append(f"{module} (imported by the command at start) imports {name}")
    assert problems == []


def test_the_code_map_has_one_row_per_folder() -> None:
    """CONTRIBUTING's code map names every folder the package has, and no folder it lost."""
    text = (PACKAGE.parent / "CONTRIBUTING.md").read_text()
    layout = text.split("## Layout of the code", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in layout.splitlines() if line.startswith("| `")]
    named = {name.strip(" `/") for row in rows for name in row.split("|")[1].split(",")}
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders - named == set() and named - folders == {"cli.py"}
