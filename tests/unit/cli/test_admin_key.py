"""Where the CLI's admin key comes from (`app.cli.admin_key`): `--admin-key-file`, then
`$MICROSCHEDULER_ADMIN_KEY`, then `$MICROSCHEDULER_ADMIN_KEY_FILE`, then the user's
`~/.config/microscheduler/admin.key`; a named file that cannot be used is an error, and
the key never shows in what is printed of it."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.cli.admin_key import AdminKey, KeyFileError, admin_key, default_key_file


def test_no_source_is_no_key(tmp_path: Path) -> None:
    assert admin_key(None, {"XDG_CONFIG_HOME": str(tmp_path)}) is None


def test_the_default_file_follows_xdg_config_home_else_home(tmp_path: Path) -> None:
    xdg = {"XDG_CONFIG_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")}
    assert default_key_file(xdg) == tmp_path / "xdg" / "microscheduler" / "admin.key"
    home = {"HOME": str(tmp_path / "home")}
    assert default_key_file(home) == tmp_path / "home" / ".config" / "microscheduler" / "admin.key"


def test_the_first_source_wins(tmp_path: Path) -> None:
    flag, named, default = tmp_path / "flag.key", tmp_path / "named.key", tmp_path / "default"
    flag.write_text("from-flag\n")
    named.write_text("  from-named-file  \n")
    (default / "microscheduler").mkdir(parents=True)
    (default / "microscheduler" / "admin.key").write_text("from-default")
    environ = {
        "MICROSCHEDULER_ADMIN_KEY": "from-env",
        "MICROSCHEDULER_ADMIN_KEY_FILE": str(named),
        "XDG_CONFIG_HOME": str(default),
    }
    assert admin_key(flag, environ) == AdminKey("from-flag", f"--admin-key-file {flag}")
    assert admin_key(None, environ) == AdminKey("from-env", "MICROSCHEDULER_ADMIN_KEY")
    del environ["MICROSCHEDULER_ADMIN_KEY"]
    assert admin_key(None, environ) == AdminKey(
        "from-named-file", f"MICROSCHEDULER_ADMIN_KEY_FILE {named}"
    )
    del environ["MICROSCHEDULER_ADMIN_KEY_FILE"]
    found = default / "microscheduler" / "admin.key"
    assert admin_key(None, environ) == AdminKey("from-default", str(found))


def test_a_named_file_that_cannot_be_used_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match=r"cannot read the admin key file .*No such file"):
        admin_key(tmp_path / "missing", {})
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    with pytest.raises(KeyFileError, match="is empty"):
        admin_key(None, {"MICROSCHEDULER_ADMIN_KEY_FILE": str(empty)})


def test_the_key_never_shows_in_its_repr() -> None:
    assert "sk-secret" not in repr(AdminKey("sk-secret", "MICROSCHEDULER_ADMIN_KEY"))
