from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry
from pydantic import SecretStr

from app.access.auth import Authenticator
from app.errors import AuthenticationFailed, PermissionDenied
from app.keys.metrics import KeyMetrics
from app.keys.ring import KeyRing


def keys(*values: str) -> KeyRing:
    return KeyRing.build(values, None, KeyMetrics(CollectorRegistry()), ["backend"])


def test_without_keys_clients_are_anonymous() -> None:
    assert Authenticator(keys(), None).check_client(None).name == "anonymous"


@pytest.mark.parametrize(
    ("header", "name"),
    [("Bearer k1", "api-key-1"), ("Bearer k2", "api-key-2"), ("bearer k2", "api-key-2"),
     ("Bearer  k1 ", "api-key-1")],
)  # fmt: skip
def test_any_configured_key_is_accepted(header: str, name: str) -> None:
    assert Authenticator(keys("k1", "k2"), None).check_client(header).name == name


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "You didn't provide an API key"),
        ("", "You didn't provide an API key"),
        ("Basic k1", "You didn't provide an API key"),
        ("Bearer ", "You didn't provide an API key"),
        ("Bearer k3", "Incorrect API key provided"),
        ("Bearer k1k2", "Incorrect API key provided"),
    ],
)
def test_missing_or_wrong_keys_are_401(header: str | None, message: str) -> None:
    with pytest.raises(AuthenticationFailed) as info:
        Authenticator(keys("k1", "k2"), None).check_client(header)
    assert info.value.status == 401
    assert message in info.value.message
    assert "k1" not in info.value.message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.5.0.1", "::1", "localhost"])
def test_without_admin_key_loopback_is_admin(host: str) -> None:
    Authenticator(keys(), None).check_admin(None, host)


@pytest.mark.parametrize("host", ["10.0.0.2", "172.18.0.1", "::ffff:8.8.8.8", None, "testclient"])
def test_without_admin_key_other_clients_are_403(host: str | None) -> None:
    with pytest.raises(PermissionDenied):
        Authenticator(keys(), None).check_admin(None, host)


def test_with_admin_key_only_the_key_counts() -> None:
    auth = Authenticator(keys("client"), SecretStr("admin"))
    auth.check_admin("Bearer admin", "10.0.0.2")
    for header in (None, "Bearer client", "Bearer admin2"):
        with pytest.raises(AuthenticationFailed):
            auth.check_admin(header, "127.0.0.1")
