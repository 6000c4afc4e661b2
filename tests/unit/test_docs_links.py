"""Every relative link in README.md and docs/ leads somewhere: the file exists and, for a
Markdown page, so does the heading its `#anchor` names.

`mkdocs build --strict` (`make docs`) checks the links between docs pages; the README's
links into docs/ (and any link to a file outside docs/) are checked only here.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

from tests.docs import DOCS, ROOT, expand, headings

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
INLINE_CODE = re.compile(r"`[^`]*`")
MARKUP = re.compile(r"[`*_]|\[([^\]]*)\]\([^)]*\)")


def slug(title: str) -> str:
    """Python-Markdown's toc slug (what MkDocs uses), which GitHub's matches for headings of
    words, spaces, hyphens and the punctuation both drop."""
    text = MARKUP.sub(lambda m: m.group(1) or "", title)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def links(path: Path) -> list[str]:
    """The link targets of a Markdown file (and of what it includes), outside fenced code
    and inline code."""
    found: list[str] = []
    fence = False
    for line in expand(path.read_text(encoding="utf-8")).splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            found.extend(LINK.findall(INLINE_CODE.sub("", line)))
    return found


def anchors(path: Path) -> set[str]:
    return {slug(title) for _, _, title in headings(expand(path.read_text(encoding="utf-8")))}


def problem(source: Path, target: str) -> str | None:
    """Why TARGET, linked from SOURCE, leads nowhere (None: it resolves)."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not checked offline
        return None
    file_part, _, anchor = target.partition("#")
    resolved = (source.parent / file_part).resolve() if file_part else source
    if not resolved.exists():
        return f"{target}: no such file"
    if anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
        return f"{target}: no heading #{anchor} in {resolved.name}"
    return None


def markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def test_the_slug_is_mkdocs_one() -> None:
    assert slug("Hosts: the Docker and GPUs of other machines") == (
        "hosts-the-docker-and-gpus-of-other-machines"
    )
    assert slug("Activity and `microscheduler ps`") == "activity-and-microscheduler-ps"
    assert slug("Anthropic's Messages API") == "anthropics-messages-api"


def test_the_readme_links_into_the_docs() -> None:
    targets = links(ROOT / "README.md")
    assert "docs/vllm.md#claude-code" in targets
    assert {t.split("#")[0] for t in targets if t.startswith("docs/")} == {
        f"docs/{p.name}" for p in DOCS.glob("*.md") if p.name != "index.md"
    }, "every page but the index is linked from the README"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A part\n")
    assert problem(page, "page.md#a-part") is None
    assert problem(page, "#title") is None
    assert problem(page, "gone.md") == "gone.md: no such file"
    assert problem(page, "page.md#nope") is not None


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path: Path) -> None:
    broken = [why for target in links(path) if (why := problem(path, target)) is not None]
    assert broken == []


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, "the README is the two commands, the demo and links: the rest is docs/"
