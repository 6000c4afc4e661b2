"""Who may call what. Keys are compared in constant time and never logged.

- `/v1/*`: when client keys are configured (`MICROSCHEDULER_API_KEYS`, keys.yaml),
  `Authorization: Bearer <one of them>`; `check_client` says which key it is
  (`app.keys.ring`), or `anonymous` when none is configured.
- Admin endpoints (state changes): `MICROSCHEDULER_ADMIN_KEY` when set, else loopback
  clients only, naming the gateway in `Host` (`app.access.origins.OriginPolicy.host_trusted`:
  a web page that rebinds its own name to 127.0.0.1 is a loopback client too).
- `/metrics` (every client key's name and usage): as admin endpoints when the gateway
  listens beyond loopback (`Settings.metrics_admin_only`: the admin key, or without one
  loopback clients only), else open (on a loopback listener, to a `Host` naming the
  gateway).
- `/health` and `/ready` are open.
- Browser pages of other sites: `app.api.origin_guard.OriginGuard`, on every route.

`exposure_warnings` says at start-up what this leaves open on a non-loopback address.
(Listening there with no client key while chains reach paid providers is refused by the
configuration itself: `Settings._not_open_to_spend`.)
"""

from __future__ import annotations

import hmac

from pydantic import SecretStr

from app.access.origins import OriginPolicy, host_refused
from app.errors import AuthenticationFailed, PermissionDenied
from app.keys.ring import ClientKey, KeyRing
from app.settings.root import is_loopback


class Authenticator:
    def __init__(
        self, keys: KeyRing, admin_key: SecretStr | None, origins: OriginPolicy | None = None
    ) -> None:
        self.keys = keys
        self._admin_key = admin_key.get_secret_value().encode() if admin_key else None
        self._origins = origins or OriginPolicy()

    def check_client(self, authorization: str | None) -> ClientKey:
        """The client's key, from `Authorization: Bearer <key>`; 401 for none or an unknown
        one (`anonymous` when the gateway has no client keys)."""
        anonymous = self.keys.anonymous
        if anonymous is not None:
            return anonymous
        token = _bearer(authorization)
        if token is None:
            raise AuthenticationFailed(
                "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
            )
        key = self.keys.identify(token)
        if key is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return key

    def check_admin(
        self, authorization: str | None, client_host: str | None, host: str | None = None
    ) -> None:
        """The admin key when set; else a loopback client whose `Host` names the gateway
        (with a key, `Host` is not checked: a rebinding page does not have the key)."""
        if self._admin_key is None:
            if not is_loopback(client_host):
                raise PermissionDenied(
                    "Admin endpoints accept only loopback clients while "
                    "MICROSCHEDULER_ADMIN_KEY is unset."
                )
            if not self._origins.host_trusted(host):
                raise PermissionDenied(host_refused(host or ""))
            return
        token = _bearer(authorization)
        if token is None or not _matches_any(token, (self._admin_key,)):
            raise AuthenticationFailed("This endpoint needs the admin key as a Bearer token.")

    def check_local_read(self, host: str | None) -> None:
        """An open route whose data names clients (`/metrics`) on a loopback listener: a
        `Host` naming the gateway, so a page that rebinds its name to 127.0.0.1 cannot
        read it."""
        if not self._origins.host_trusted(host):
            raise PermissionDenied(host_refused(host or ""))


def _bearer(authorization: str | None) -> bytes | None:
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip().encode()


def _matches_any(token: bytes, keys: tuple[bytes, ...]) -> bool:
    # Compare with every key, so timing does not tell which (or whether an early one) matched.
    found = False
    for key in keys:
        found |= hmac.compare_digest(token, key)
    return found


def exposure_warnings(host: str, *, api_keys: bool, admin_key: bool) -> list[str]:
    """What a start-up on `host` leaves open, in one line each (empty on loopback)."""
    if is_loopback(host):
        return []
    warnings = []
    if not api_keys:
        warnings.append(
            f"listening on {host} without MICROSCHEDULER_API_KEYS: anyone who reaches the "
            "port may use the models"
        )
    if not admin_key:
        warnings.append(
            f"listening on {host} without MICROSCHEDULER_ADMIN_KEY: admin endpoints accept "
            "loopback clients only, and behind a reverse proxy on this machine every client "
            "looks like loopback; set MICROSCHEDULER_ADMIN_KEY (see SECURITY.md)"
        )
    return warnings
