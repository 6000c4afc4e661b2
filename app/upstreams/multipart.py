"""Just enough of `multipart/form-data` (RFC 7578, framing of RFC 2046 5.1) to route an
upload: read a few text fields (`model`, `stream`) wherever they sit in the form, and put
another model name in. Pure: no I/O. The body is relayed unchanged otherwise: files are
never decoded, copied part by part or buffered twice.

A field is a part whose `Content-Disposition` has a `name` and no `filename` (a file). Parts are
found by the delimiter `CRLF--boundary`; a body that does not frame its parts that way
simply has no fields (the request is then refused for a missing `model`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

_BOUNDARY: Final = re.compile(r'boundary=(?:"([^"]+)"|([^;\s]+))', re.IGNORECASE)
_NAME: Final = re.compile(rb'(?:^|;)\s*name="([^"]*)"', re.IGNORECASE)
_FILENAME: Final = re.compile(rb";\s*filename\*?=", re.IGNORECASE)


def boundary_of(content_type: str) -> bytes | None:
    """The boundary of a `multipart/form-data` content type, or None for any other type."""
    if not content_type.lower().startswith("multipart/form-data"):
        return None
    match = _BOUNDARY.search(content_type)
    if match is None:
        return None
    return (match.group(1) or match.group(2)).encode("latin-1")


def form_fields(body: bytes, boundary: bytes, names: frozenset[str]) -> dict[str, str]:
    """The text values of the fields named in `names` (the first of each name wins)."""
    found: dict[str, str] = {}
    for name, start, end, is_file in _parts(body, boundary):
        if not is_file and name in names and name not in found:
            found[name] = body[start:end].decode("utf-8", errors="replace")
    return found


def replace_field(body: bytes, boundary: bytes, name: str, value: str) -> bytes:
    """The body with the first field `name` holding `value` (unchanged if there is none)."""
    for field, start, end, is_file in _parts(body, boundary):
        if not is_file and field == name:
            return body[:start] + value.encode() + body[end:]
    return body


def part_names(body: bytes, boundary: bytes) -> set[str]:
    """The names of every part, files included."""
    return {name for name, _, _, _ in _parts(body, boundary)}


def _parts(body: bytes, boundary: bytes) -> Iterator[tuple[str, int, int, bool]]:
    """(name, start, end, is_file) of each named part's content in `body`."""
    delimiter = b"--" + boundary
    pos = body.find(delimiter)
    while pos != -1:
        after = pos + len(delimiter)
        if body.startswith(b"--", after):  # the close delimiter
            return
        line_end = body.find(b"\r\n", after)
        if line_end == -1:
            return
        headers_end = body.find(b"\r\n\r\n", line_end)
        if headers_end == -1:
            return
        start = headers_end + 4
        end = body.find(b"\r\n" + delimiter, start)
        if end == -1:
            return
        disposition = _disposition(body[line_end + 2 : headers_end])
        match = _NAME.search(disposition) if disposition is not None else None
        if disposition is not None and match is not None:
            name = match.group(1).decode("utf-8", errors="replace")
            yield name, start, end, _FILENAME.search(disposition) is not None
        pos = end + 2


def _disposition(headers: bytes) -> bytes | None:
    for line in headers.split(b"\r\n"):
        name, sep, value = line.partition(b":")
        if sep and name.strip().lower() == b"content-disposition":
            return value
    return None
