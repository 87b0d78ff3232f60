"""The error tree drawn in `shardcache/errors.py`'s docstring is the code's: every subclass of
`ShardcacheError` in the package, its parent, its HTTP status and its metric kind, and where it
is defined. A class added, moved or relabelled without redrawing the tree fails here."""

from __future__ import annotations

import importlib
import pkgutil
import re

import shardcache
from shardcache import errors
from shardcache.errors import ShardcacheError

# One drawn row: the tree's lines, the class name, its status and kind, then a comment that may
# open with `[in MODULE]` for a class defined outside errors.py.
_ROW = re.compile(r"^(?P<tree>[ │├└─]*)(?P<name>[A-Z]\w+)\s+(?P<status>\d{3})\s+(?P<kind>[a-z_]+)")
_MARK = re.compile(r"\[in (\w+)\]")
Row = tuple[str | None, int, str, str]  # parent, status, kind, defining module (last part)


def _drawn() -> dict[str, Row]:
    """The tree as drawn: each class's row, its parent found by its indentation."""
    doc = errors.__doc__ or ""
    lines = doc.split("\n")
    headers = [i for i, line in enumerate(lines) if line.split()[:3] == ["class", "status", "kind"]]
    assert headers, "errors.py's docstring has no drawing headed `class  status  kind`"
    header = headers[0]
    rows: dict[str, Row] = {}
    parents: list[str] = []  # parents[d] is the class last drawn at depth d
    for line in lines[header + 1 :]:
        if not line.strip():
            break  # the drawing ends at the first blank line
        match = _ROW.match(line)
        assert match, f"cannot read the drawn row {line!r}"
        name = match["name"]
        depth = (len(match["tree"]) - 4) // 4  # the root at 4 spaces, each level 4 more
        del parents[depth:]
        assert name not in rows, f"{name} is drawn twice"
        mark = _MARK.search(line[match.end() :])
        module = mark.group(1) if mark else "errors"
        rows[name] = (parents[-1] if parents else None, int(match["status"]), match["kind"], module)
        parents.append(name)
    return rows


def _coded() -> dict[str, Row]:
    """The tree in the code: every module imported (a subclass may live anywhere), then walked."""
    for module in pkgutil.walk_packages(shardcache.__path__, "shardcache."):
        if not module.name.endswith("__main__"):  # that one runs the command
            importlib.import_module(module.name)
    rows: dict[str, Row] = {}
    todo: list[tuple[type[ShardcacheError], str | None]] = [(ShardcacheError, None)]
    while todo:
        cls, parent = todo.pop()
        assert cls.__name__ not in rows, f"two classes named {cls.__name__}"
        rows[cls.__name__] = (parent, cls.status, cls.kind, cls.__module__.rsplit(".", 1)[-1])
        todo += [(sub, cls.__name__) for sub in cls.__subclasses__()]
    return rows


def test_the_drawn_error_tree_is_the_code() -> None:
    drawn, coded = _drawn(), _coded()
    assert len(drawn) > 30  # the whole drawing was read, not a prefix of it
    missing = sorted(set(coded) - set(drawn))
    assert missing == [], f"not drawn in errors.py: {missing}"
    extra = sorted(set(drawn) - set(coded))
    assert extra == [], f"drawn in errors.py but not in the code: {extra}"
    wrong = {
        name: {"drawn": drawn[name], "code": coded[name]}
        for name in coded
        if drawn[name] != coded[name]
    }
    assert wrong == {}, "rows as (parent, status, kind, module)"


def test_the_reader_of_the_drawing_follows_indentation() -> None:
    """The parser itself: a grandchild's parent is its drawn parent, not the root."""
    drawn = _drawn()
    assert drawn["ShardcacheError"][0] is None
    assert drawn["OriginTooSlow"][0] == "OriginTimeout"
    assert drawn["OriginThrottled"][0] == "OriginUnavailable"
    assert drawn["OriginChanged"][0] == "OriginError"
    assert drawn["CacheError"][0] == "ShardcacheError"
