"""The new backend as YAML text, and models.yaml's text with it added under `backends:`.
Pure: text in, text out. The user's comments and layout are kept; only lines are added
(and an empty flow mapping, `backends: {}`, becomes a block).
"""

from __future__ import annotations

import re

import yaml

_TOP_KEY = re.compile(r"backends\s*:(?P<rest>.*)$")


def backend_block(name: str, data: dict[str, object], *, indent: int, comment: str) -> str:
    """`name:` and its mapping, indented by `indent` spaces, with `comment` above it."""
    text = yaml.safe_dump(
        {name: data}, sort_keys=False, default_flow_style=None, width=100, allow_unicode=True
    )
    pad = " " * indent
    lines = [f"{pad}# {comment}"] + [f"{pad}{line}" if line else line for line in text.splitlines()]
    return "\n".join(lines) + "\n"


def _strip_comment(rest: str) -> str:
    return rest.split(" #", 1)[0].strip() if not rest.lstrip().startswith("#") else ""


def _is_top_level(line: str) -> bool:
    """A line that starts another top-level key (or ends the document)."""
    return bool(line) and not line[0].isspace() and not line.startswith("#")


def insert_backend(text: str, name: str, data: dict[str, object], *, comment: str) -> str:
    """`text` (models.yaml; empty for a new file) with the backend added at the end of
    its `backends:` mapping, or a new `backends:` at the end. `ValueError` when
    `backends:` is written in a form lines cannot be added to (a non-empty flow mapping)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _TOP_KEY.fullmatch(line)), None)
    if start is None:
        prefix = text if not text or text.endswith("\n") else text + "\n"
        gap = "\n" if prefix.strip() else ""
        return f"{prefix}{gap}backends:\n{backend_block(name, data, indent=2, comment=comment)}"
    match = _TOP_KEY.fullmatch(lines[start])
    assert match is not None
    rest = _strip_comment(match.group("rest"))
    if rest in ("{}", "null", "~"):
        lines[start] = "backends:"
    elif rest:
        raise ValueError(
            f"line {start + 1}: `backends:` is written on one line ({rest[:40]}); write it as "
            "a block (one backend per indented key) so a backend can be added"
        )
    end = next((i for i in range(start + 1, len(lines)) if _is_top_level(lines[i])), len(lines))
    # Comments and blank lines right before the next key belong to it.
    while end > start + 1 and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
        end -= 1
    indent = next(
        (
            len(line) - len(line.lstrip(" "))
            for line in lines[start + 1 : end]
            if line.strip() and not line.lstrip().startswith("#")
        ),
        2,
    )
    block = backend_block(name, data, indent=indent, comment=comment).splitlines()
    before, after = lines[:end], lines[end:]
    if before and before[-1].strip() and end > start + 1:
        block.insert(0, "")
    if after and after[0].strip():
        block.append("")
    return "\n".join([*before, *block, *after]) + "\n"
