"""Every relative link in README.md, docs/ and config/reference/README.md leads somewhere:
the file exists and, for a Markdown page, so does the heading its `#anchor` names. So
does every place the shipped configuration and deployment files send a reader to in their
comments: `docs/PAGE.md#anchor`, or a section of the README by its title
(`README, "Two commands"`).

`mkdocs build --strict` (`make docs`) checks the links between docs pages; the README's
links into docs/, any link to a file outside docs/ and the comments' pointers are checked
only here.
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
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), ROOT / "config/reference/README.md"]


# In a comment: `docs/vllm.md#claude-code`, `README.md#two-commands`, or a README section by
# its title, `README "Two commands"` / `README, "Two commands"`.
DOC_POINTER = re.compile(r"\b((?:docs/[\w-]+|README)\.md(?:#[\w-]+)?)")
README_SECTION = re.compile(r'\bREADME,? "([^"]+)"')
COMMENT_BREAK = re.compile(r"\s*\n\s*#\s*")


def config_files() -> list[Path]:
    """The shipped configuration and deployment files, whose comments point at the docs."""
    files = [ROOT / "docker-compose.yml"]
    for folder in ("config", "deploy"):
        files.extend(p for p in sorted((ROOT / folder).rglob("*")) if p.suffix in CONFIG_SUFFIXES)
    return files


CONFIG_SUFFIXES = (".yaml", ".yml", ".cfg", ".conf", ".toml", ".env")


def pointers(text: str) -> list[str]:
    """Where TEXT's comments send a reader: a path from the repository's root (`docs/...`,
    `README.md#...`), or `README.md#slug` for a README section named by its title. A title
    may run on over a comment's next line."""
    joined = COMMENT_BREAK.sub(" ", text)
    return [
        *DOC_POINTER.findall(joined),
        *(f"README.md#{slug(title)}" for title in README_SECTION.findall(joined)),
    ]


def test_the_pointers_of_a_comment_are_found() -> None:
    text = (
        '# chains (README "Cloud fallback").\n'
        '    # its set (README, "What a\n    # backend serves"), so (docs/vllm.md#claude-code).\n'
    )
    assert pointers(text) == [
        "docs/vllm.md#claude-code",
        "README.md#cloud-fallback",
        "README.md#what-a-backend-serves",
    ]


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


@pytest.mark.parametrize("path", config_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pointer_of_a_config_file_resolves(path: Path) -> None:
    readme = ROOT / "README.md"
    broken = [
        why
        for target in pointers(path.read_text(encoding="utf-8"))
        if (why := problem(readme, target)) is not None
    ]
    assert broken == []


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 300, "the README is the two commands, the demo and links: the rest is docs/"
