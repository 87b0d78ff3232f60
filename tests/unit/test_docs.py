"""The documentation stays usable: a README a user reads in five minutes, every relative link
(and `#anchor`) resolving as GitHub renders it, every setting in the configuration reference,
and the README's two set-up commands as the tests and CI run them."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from shardcache.config import OPTIONS

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 300
PAGES = sorted([README, ROOT / "CONTRIBUTING.md", *DOCS.glob("*.md")])

_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.MULTILINE)


def _prose(text: str) -> str:
    """`text` without fenced blocks and code spans: a `[x](y)` inside code is not a link."""
    return _CODE_SPAN.sub("", _FENCE.sub("", text))


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: markup dropped, lower case, punctuation removed
    (letters, digits, `_`, `-` and spaces kept), spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every anchor `page` has, numbered as GitHub numbers repeated headings (`x`, `x-1`)."""
    seen: dict[str, int] = {}
    found: set[str] = set()
    for heading in _HEADING.findall(_FENCE.sub("", page.read_text())):
        slug = github_slug(heading)
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(_prose(page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_github_slugs_match_what_github_renders() -> None:
    assert github_slug("Is it working?") == "is-it-working"
    assert github_slug("Plans: eviction that knows the loaders' order") == (
        "plans-eviction-that-knows-the-loaders-order"
    )
    assert github_slug("`shardcache url`") == "shardcache-url"
    assert github_slug("Two commands") == "two-commands"


def test_the_readme_is_read_in_five_minutes() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) < README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES - 1}): move detail to docs/"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    links = relative_links(page)
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not target.exists():
            broken.append(f"{link}: no such file")
        elif anchor and (target.suffix != ".md" or anchor not in anchors(target)):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert broken == [], broken


def test_the_link_check_finds_broken_links(tmp_path: Path) -> None:
    """The check itself can fail: a missing file and a missing anchor are both caught."""
    (tmp_path / "a.md").write_text(
        "# A\n\n## Real heading\n\n[x](b.md) [y](a.md#nope) `[z](c.md)`\n"
    )
    assert relative_links(tmp_path / "a.md") == ["b.md", "a.md#nope"]
    assert "nope" not in anchors(tmp_path / "a.md") and "real-heading" in anchors(tmp_path / "a.md")


def test_every_docs_page_has_a_title_and_the_readme_links_it() -> None:
    readme_links = {link.partition("#")[0] for link in relative_links(README)}
    for page in DOCS.glob("*.md"):
        assert page.read_text().startswith("# "), f"{page.name}: starts without a # title"
        assert f"docs/{page.name}" in readme_links, f"README.md never links docs/{page.name}"


def test_the_readme_has_the_sections_a_new_user_needs_first() -> None:
    have = anchors(README)
    for section in (
        "contents",
        "two-commands",
        "loader-side-install",
        "pointing-a-loader-at-it",
        "prefetch",
        "key-settings",
        "is-it-working",
        "where-to-read-more",
    ):
        assert section in have, section
    contents = README.read_text().split("## Contents", 1)[1].split("\n## ", 1)[0]
    assert {link.lstrip("#") for link in re.findall(r"\]\((#[^)]+)\)", contents)} >= {
        "two-commands",
        "pointing-a-loader-at-it",
        "prefetch",
        "key-settings",
        "is-it-working",
        "where-to-read-more",
    }


def test_the_readmes_two_commands_are_the_ones_that_run() -> None:
    """The demo's install line and the test suite, exactly as a new user copies them."""
    text = README.read_text()
    demo = (
        "python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt '.[daemon]' "
        "&& .venv/bin/shardcache demo"
    )
    assert f"```sh\n   {demo}\n   ```" in text
    assert "```sh\n   ./scripts/test\n   ```" in text
    assert (ROOT / "constraints.txt").is_file()
    assert os.access(ROOT / "scripts" / "test", os.X_OK)


def test_every_setting_is_in_the_configuration_reference() -> None:
    """One table row per setting: its flag, environment variable, TOML key and default."""
    rows = {
        row.split("|")[1].strip(" `").split()[0]: [cell.strip() for cell in row.split("|")[1:-1]]
        for row in (DOCS / "configuration.md").read_text().splitlines()
        if row.startswith("| `--")
    }
    for option in OPTIONS:
        row = rows.get(option.flag)
        assert row is not None, f"{option.flag} has no row in docs/configuration.md"
        _, env, key, default = row[:4]
        assert option.env in env and key == f"`{option.name}`", row
        if option.is_switch:
            assert default == "off", row
        elif option.default in ("", None):
            assert default == "none", row
        else:
            shown = f"{option.default:g}" if isinstance(option.default, float) else option.default
            assert default == f"`{shown}`", row
