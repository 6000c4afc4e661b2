"""Each configuration its own state directory by default: `var` for the default config
directory (`config/`, as before), `var/<config directory name>` for any other; a flag, the
environment or models.yaml still sets it. State an earlier version left in the shared `var/`
is named at start-up, never silently dropped."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from app.lifecycle.metrics import LifecycleMetrics
from app.lifecycle.store import StateStore, earlier_shared_state
from app.services import Seams, Services
from app.settings import load_settings
from tests.fakes.nvml import NoNvml
from tests.unit.planner.test_model_description import clean_env  # noqa: F401 (autouse)

MODELS = (
    "backends:\n  m:\n    url: http://127.0.0.1:9\n    models: [m]\n    runtime: {kind: external}\n"
)
ZONES = [{"name": "comfy", "gpu": 0, "mib": 12000, "expires_at": None, "stopped": []}]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The working directory, with config/ (the default), config/demo/ and elsewhere/lab/."""
    for name in ("config", "config/demo", "elsewhere/lab"):
        (tmp_path / name).mkdir(parents=True)
        (tmp_path / name / "models.yaml").write_text(MODELS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_two_configurations_keep_their_state_apart(workdir: Path) -> None:
    demo, lab = load_settings("config/demo"), load_settings(workdir / "elsewhere" / "lab")
    assert (demo.state_dir, lab.state_dir) == (Path("var/demo"), Path("var/lab"))
    StateStore(demo.state_dir).save({"zones": ZONES})  # a zone held under config/demo
    assert StateStore(demo.state_dir).load()["zones"] == ZONES
    assert "zones" not in StateStore(lab.state_dir).load()  # not under elsewhere/lab


@pytest.mark.parametrize("config_dir", [None, "config", "./config/", "CWD/config"])
def test_the_default_config_directory_keeps_var(workdir: Path, config_dir: str | None) -> None:
    if config_dir is not None:
        config_dir = config_dir.replace("CWD", str(workdir))
    assert load_settings(config_dir).state_dir == Path("var")


def test_the_environment_names_the_default_config_directory_too(
    workdir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MICROSCHEDULER_CONFIG_DIR", "config/demo")
    assert load_settings().state_dir == Path("var/demo")


def test_a_state_dir_that_is_set_wins(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (workdir / "config/demo/models.yaml").write_text(f"state_dir: st\n{MODELS}", "utf-8")
    assert load_settings("config/demo").state_dir == Path("st")  # models.yaml
    monkeypatch.setenv("MICROSCHEDULER_STATE_DIR", "/srv/state")
    assert load_settings("config/demo").state_dir == Path("/srv/state")  # over the YAML
    assert load_settings("config/demo", state_dir="flag").state_dir == Path("flag")


def test_state_left_in_the_shared_var_is_found_until_there_is_state_of_its_own(
    workdir: Path,
) -> None:
    demo = load_settings("config/demo")
    assert earlier_shared_state(demo.state_dir, demo.config_dir) is None  # nothing anywhere
    StateStore(Path("var")).save({"zones": ZONES})  # what an earlier version kept for all
    assert earlier_shared_state(demo.state_dir, demo.config_dir) == Path("var/state.db")
    default = load_settings()
    assert earlier_shared_state(default.state_dir, default.config_dir) is None  # it uses var
    chosen = load_settings("config/demo", state_dir="var/chosen")
    assert earlier_shared_state(chosen.state_dir, chosen.config_dir) is None  # set: as asked
    StateStore(demo.state_dir).save({"zones": []})
    assert earlier_shared_state(demo.state_dir, demo.config_dir) is None  # its own now


async def test_the_start_up_says_where_the_earlier_state_is_and_how_to_keep_it(
    workdir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    StateStore(Path("var")).save({"zones": ZONES})
    caplog.set_level(logging.WARNING, logger="app.services")
    # NVML as on a machine without one: the probe's own warning (gpu.probe auto) is not this.
    services = Services(load_settings("config/demo"), LifecycleMetrics(), Seams(nvml=NoNvml()))
    await services.close()
    messages = [r.getMessage() for r in caplog.records if r.name == "app.services"]
    (line,) = [m for m in messages if not m.startswith("gpu probe")]
    assert "state of an earlier version not used" in line
    assert "move var/state.db* into var/demo" in line
    assert "MICROSCHEDULER_STATE_DIR=var" in line
    assert StateStore(Path("var")).load()["zones"] == ZONES  # left as it was
