"""The sliding windows behind a key's limits, and keys.yaml's validation."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from app.errors import ModelNotAllowed, RateLimited
from app.keys.limits import DailyTokens, RequestWindow, TokenWindow, duration_text
from app.keys.metrics import KeyMetrics
from app.keys.ring import KeyRing
from app.settings import ConfigError, Settings, load_settings
from app.settings.keys import KeyConfig, KeysConfig, Priority


def test_a_request_window_slides() -> None:
    window = RequestWindow(2)
    window.add(0.0)
    window.add(10.0)
    assert window.used(10.0) == 2
    assert window.reset_in(10.0) == 50.0  # when the first leaves
    assert window.reset_in(60.0) == 0.0  # it left at 60 s
    assert window.used(60.0) == 1
    window.add(60.0)
    assert window.reset_in(61.0) == 9.0  # the one from 10 s leaves at 70 s
    assert window.empty_in(61.0) == 59.0  # when the one from 60 s leaves


def test_a_token_window_counts_tokens_until_they_leave() -> None:
    window = TokenWindow(100)
    window.add(0.0, 60)
    window.add(20.0, 60)
    assert window.used(20.0) == 120
    # Under the limit again once the first 60 tokens leave, at 60 s.
    assert window.reset_in(20.0) == 40.0
    assert window.used(60.0) == 60
    assert window.reset_in(60.0) == 0.0
    window.add(61.0, 0)  # nothing to count
    assert window.used(61.0) == 60
    assert window.empty_in(61.0) == 19.0


def test_a_token_window_at_its_limit_refuses_until_enough_leave() -> None:
    window = TokenWindow(100)
    for at in (0.0, 1.0, 2.0):
        window.add(at, 50)
    # 150 used: under 100 only once 0 s and 1 s have left.
    assert window.reset_in(2.0) == pytest.approx(59.0)


def test_daily_tokens_start_again_at_midnight_utc() -> None:
    day = DailyTokens(10)
    noon = 86400 * 100 + 43200
    day.add(noon, 12)
    assert day.exhausted(noon)
    assert day.spent(noon) == 12
    assert day.reset_in(noon) == 43200
    assert not day.exhausted(noon + 43200)  # the next UTC day
    assert day.spent(noon + 43200) == 0


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0.25, "250ms"), (0.0, "0ms"), (1.0, "1s"), (1.5, "1.5s"), (59.9, "59.9s"),
     (60.0, "1m0s"), (360.0, "6m0s"), (3725.0, "1h2m5s")],
)  # fmt: skip
def test_reset_times_are_worded_as_openai_words_them(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


def test_priority_order_and_vllm_values() -> None:
    assert [p.rank for p in Priority] == [0, 1, 2]
    assert [p.vllm for p in Priority] == [-1, 0, 1]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({}, "exactly one of key_env"),
        ({"key_env": "A", "key_sha256": "0" * 64}, "exactly one of key_env"),
        ({"key_sha256": "xyz"}, "64 hex digits"),
        ({"key_env": "A", "priority": "urgent"}, "priority"),
        ({"key_env": "A", "rpm": 0}, "rpm"),
        ({"key_env": "A", "models": []}, "models"),
        ({"key_env": "A", "budget": 3}, "budget"),
    ],
)
def test_a_bad_key_entry_is_refused(fields: dict[str, object], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        KeyConfig.model_validate(fields)


def test_key_names_are_plain() -> None:
    with pytest.raises(ValueError, match="pattern"):
        KeysConfig.model_validate({"keys": {"a key with spaces": {"key_env": "A"}}})


def write(tmp_path: Path, keys_yaml: str) -> None:
    (tmp_path / "models.yaml").write_text(
        "backends:\n  m:\n    url: http://127.0.0.1:9\n    models: [m]\n    aliases: [mm]\n"
    )
    (tmp_path / "keys.yaml").write_text(keys_yaml)


def test_keys_yaml_is_read_from_the_config_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("A_KEY", "sk-a")
    write(tmp_path, "keys:\n  a:\n    key_env: A_KEY\n    models: [mm]\n    tpm: 10\n")
    settings = load_settings(tmp_path)
    assert settings.client_keys is not None
    assert settings.client_keys.keys["a"].models == ["mm"]
    assert settings.has_client_keys


@pytest.mark.parametrize(
    ("keys_yaml", "problem"),
    [
        ("keys:\n  a:\n    key_env: UNSET_VAR_XYZ\n",
         "keys.yaml: keys.a.key_env: UNSET_VAR_XYZ is not set"),
        ("keys:\n  a:\n    key_env: A_KEY\n    models: [nope]\n",
         "keys.yaml: keys.a.models: no model or alias 'nope'"),
        ("keys:\n  a:\n    key_env: A_KEY\n    rpm: -1\n", "keys.yaml: keys.a.rpm:"),
        ("keys:\n  a:\n    key_env: A_KEY\n    weight: 0\n",
         "keys.yaml: keys.a.weight: Input should be greater than or equal to 1"),
        ("keys:\n  a:\n    key_env: A_KEY\n    weight: 1.5\n",
         "keys.yaml: keys.a.weight: Input should be a valid integer"),
        ("keys:\n  a:\n    key_env: A_KEY\n  b:\n    key_env: A_KEY\n",
         "keys.yaml: keys a and b have the same secret"),
    ],
)  # fmt: skip
def test_keys_yaml_problems_name_the_file_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys_yaml: str, problem: str
) -> None:
    monkeypatch.setenv("A_KEY", "sk-a")
    write(tmp_path, keys_yaml)
    with pytest.raises(ConfigError) as info:
        load_settings(tmp_path)
    assert any(problem in line for line in info.value.problems), info.value.problems


def ring(**keys: dict[str, object]) -> KeyRing:
    config = KeysConfig.model_validate({"keys": keys})
    now = [0.0]
    built = KeyRing.build(
        (), config, KeyMetrics(CollectorRegistry()), ["m"],
        environ={"K": "sk-k"}, clock=lambda: now[0], wall=lambda: 0.0,
    )  # fmt: skip
    built.now = now  # type: ignore[attr-defined]
    return built


def test_a_key_is_found_by_its_secret_or_its_sha256() -> None:
    keys = ring(a={"key_env": "K"}, b={"key_sha256": hashlib.sha256(b"sk-b").hexdigest()})
    assert keys.anonymous is None
    found_a, found_b = keys.identify(b"sk-k"), keys.identify(b"sk-b")
    assert found_a is not None
    assert found_a.name == "a"
    assert found_b is not None
    assert found_b.name == "b"
    assert keys.identify(b"sk-c") is None


def test_scope_and_concurrency_limits() -> None:
    keys = ring(a={"key_env": "K", "models": ["m"], "max_concurrent": 1})
    key = keys.identify(b"sk-k")
    assert key is not None
    key.check_model("m")
    with pytest.raises(ModelNotAllowed):
        key.check_model("other")
    use = key.admit()
    with pytest.raises(RateLimited) as info:
        key.admit()
    assert info.value.headers["retry-after"] == "1"
    use.finish("served")
    use.finish("served")  # a second finish does nothing
    assert key.in_flight == 0
    key.admit().finish("error")
    assert key.view()["requests"] == {
        "served": 1, "error": 1, "cancelled": 0, "rate_limited": 1, "forbidden": 1
    }  # fmt: skip


def test_a_refused_request_does_not_use_up_the_window() -> None:
    keys = ring(a={"key_env": "K", "rpm": 1})
    key = keys.identify(b"sk-k")
    assert key is not None
    key.admit().finish("served")
    for _ in range(3):
        with pytest.raises(RateLimited) as info:
            key.admit()
    assert info.value.headers["retry-after"] == "60"
    keys.now[0] = 60.0  # type: ignore[attr-defined]
    key.admit().finish("served")


def test_status_shows_a_keys_priority_and_weight() -> None:
    keys = ring(a={"key_env": "K", "priority": "low", "weight": 3})
    key = keys.identify(b"sk-k")
    assert key is not None
    assert (key.view()["priority"], key.view()["weight"]) == ("low", 3)


def test_env_keys_and_no_keys() -> None:
    metrics = KeyMetrics(CollectorRegistry())
    open_ring = KeyRing.build((), None, metrics, ["m"])
    assert open_ring.anonymous is not None
    assert open_ring.anonymous.name == "anonymous"
    env = KeyRing.build(["sk-1", "sk-2"], None, KeyMetrics(CollectorRegistry()), ["m"])
    second = env.identify(b"sk-2")
    assert second is not None
    assert second.name == "api-key-2"
    assert not second.counts_tokens
    assert not second.rate_limited
    settings_fields = {"backends": {"m": {"url": "http://127.0.0.1:9", "models": ["m"]}}}
    assert not Settings(**settings_fields).has_client_keys  # type: ignore[arg-type]


def test_a_spent_daily_budget_keeps_the_key_off_the_cloud_and_counts_when_it_mattered() -> None:
    keys = ring(a={"key_env": "K", "daily_cloud_tokens": 10})
    key = keys.identify(b"sk-k")
    assert key is not None
    use = key.admit()
    assert use.cloud
    use.count("cloud", True, 4, 8)  # 12 tokens from a provider: the budget is spent
    use.count("local", False, 100, 100)  # local tokens do not count against it
    use.finish("served")
    assert key.view()["cloud_tokens_today"] == 12
    later = key.admit()
    assert not later.cloud
    assert later.budget_spent
    assert key.view()["limited"]["daily_cloud_tokens"] == 0  # a local-only request: no loss
    later.kept_off_cloud()  # a chain passed its providers over
    assert key.view()["limited"]["daily_cloud_tokens"] == 1
    later.finish("served")


def test_a_reload_that_changes_a_keys_budget_carries_todays_spend_over() -> None:
    before = ring(a={"key_env": "K", "daily_cloud_tokens": 30})
    key = before.identify(b"sk-k")
    assert key is not None
    use = key.admit()
    use.count("cloud", True, 10, 15)
    use.finish("served")
    after = ring(a={"key_env": "K", "daily_cloud_tokens": 50}).keeping(before)
    again = after.identify(b"sk-k")
    assert again is not None
    assert again is not key  # new settings: a new object...
    assert again.view()["cloud_tokens_today"] == 25  # ...that knows what was spent today
    assert again.view()["daily_cloud_tokens"] == 50
