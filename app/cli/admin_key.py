"""The admin key the CLI sends (as a bearer token) to a gateway that has one, and where it
came from. The first of:

1. `--admin-key-file PATH` (every command that calls a gateway): the file must be readable
   and hold the key;
2. `$MICROSCHEDULER_ADMIN_KEY`;
3. `$MICROSCHEDULER_ADMIN_KEY_FILE`: a file, as `--admin-key-file`;
4. the file `admin.key` of the user's configuration directory,
   `$XDG_CONFIG_HOME/microscheduler/admin.key` (default `~/.config/microscheduler/admin.key`),
   when it exists.

A file holds the key alone (surrounding whitespace and a final newline are ignored). A
file is what a program started without the user's shell environment gets the key from:
Steam's launch options (`microscheduler yield -- %command%`), a desktop entry, a systemd
unit. Without any, the gateway accepts admin calls from loopback only (when it has no
admin key) or refuses them (401). The key is never printed: messages name its source.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

ADMIN_KEY_ENV: Final = "MICROSCHEDULER_ADMIN_KEY"
ADMIN_KEY_FILE_ENV: Final = "MICROSCHEDULER_ADMIN_KEY_FILE"
KEY_FILE_NAME: Final = "admin.key"


class KeyFileError(OSError):
    """A key file that was named (`--admin-key-file`, `$MICROSCHEDULER_ADMIN_KEY_FILE`)
    cannot be read or is empty."""


@dataclass(frozen=True)
class AdminKey:
    """The key and where it came from (`source`, what messages show instead of it)."""

    value: str
    source: str

    def __repr__(self) -> str:  # never the key, even in a traceback
        return f"AdminKey(source={self.source!r})"


def default_key_file(environ: Mapping[str, str] = os.environ) -> Path:
    """`$XDG_CONFIG_HOME/microscheduler/admin.key`, default `~/.config/...`."""
    base = environ.get("XDG_CONFIG_HOME", "").strip()
    root = Path(base) if base else Path(environ.get("HOME") or Path.home()) / ".config"
    return root / "microscheduler" / KEY_FILE_NAME


def _read(path: Path, source: str) -> AdminKey:
    try:
        key = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise KeyFileError(f"cannot read the admin key file {path} ({source}): {why}") from None
    if not key:
        raise KeyFileError(f"the admin key file {path} ({source}) is empty")
    return AdminKey(key, f"{source} {path}" if source != str(path) else source)


def admin_key(
    key_file: Path | None = None, environ: Mapping[str, str] = os.environ
) -> AdminKey | None:
    """The key to send, from the first source that has one (module docstring), or None.
    Raises `KeyFileError` for a named file that is unreadable or empty."""
    if key_file is not None:
        return _read(key_file, "--admin-key-file")
    key = environ.get(ADMIN_KEY_ENV, "").strip()
    if key:
        return AdminKey(key, ADMIN_KEY_ENV)
    named = environ.get(ADMIN_KEY_FILE_ENV, "").strip()
    if named:
        return _read(Path(named).expanduser(), ADMIN_KEY_FILE_ENV)
    default = default_key_file(environ)
    if default.is_file():
        return _read(default, str(default))
    return None


def where_keys_come_from(environ: Mapping[str, str] = os.environ) -> str:
    """The ways to give the CLI the key, for a message about a refused call."""
    return (
        f"set {ADMIN_KEY_ENV}, write the key to {default_key_file(environ)} "
        "or pass --admin-key-file PATH"
    )
