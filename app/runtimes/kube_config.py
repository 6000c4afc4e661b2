"""Where the Kubernetes API server is and how to authenticate to it.

In order: `kubernetes.kubeconfig`, else `$KUBECONFIG` (its first file), else in-cluster (the
pod's ServiceAccount: `https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT`, the
token and CA in `/var/run/secrets/kubernetes.io/serviceaccount/`). `kubernetes.api_url`
replaces the server of either; with neither a kubeconfig nor a ServiceAccount it is used
without credentials (`kubectl proxy`).

Of a kubeconfig only what a gateway needs is read, from its current context: the cluster's
`server`, `certificate-authority(-data)`, `insecure-skip-tls-verify`, and the user's
`token`, `tokenFile`, or `client-certificate(-data)` + `client-key(-data)`. Relative file
paths are relative to the kubeconfig's directory, as kubectl reads them. Other auth (exec
credential plugins, auth-provider, username/password) is refused by name: run the gateway
with a ServiceAccount token, or point `api_url` at `kubectl proxy`.

A token read from a file (a ServiceAccount's projected token, a `tokenFile`) is read again
every `TOKEN_REREAD_S` and after a 401 (bound tokens are rotated, about hourly).
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from app.runtimes.base import RuntimeFailure
from app.settings import KubernetesConfig

SERVICE_ACCOUNT_DIR: Final = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_REREAD_S: Final = 60.0
_UNSUPPORTED_USER: Final = {
    "exec": "exec credential plugins (as EKS, GKE and AKS kubeconfigs use)",
    "auth-provider": "auth-provider plugins",
    "username": "basic auth (username/password)",
    "password": "basic auth (username/password)",
}


class KubeConfigError(RuntimeFailure):
    """The API server's location or credentials cannot be worked out; says what to fix."""


@dataclass
class Connection:
    """How to reach the API server; `source` says where that came from (for messages)."""

    server: str
    source: str
    verify: ssl.SSLContext | bool = True
    token: str | None = None
    token_file: Path | None = None
    _read_at: float = field(default=-TOKEN_REREAD_S, repr=False)

    def bearer(self, *, reread: bool = False) -> str | None:
        """The token to send; one from a file is re-read when stale or when `reread`."""
        if self.token_file is None:
            return self.token
        now = time.monotonic()
        if reread or self.token is None or now - self._read_at >= TOKEN_REREAD_S:
            try:
                self.token = self.token_file.read_text().strip()
            except OSError as exc:
                raise KubeConfigError(
                    f"cannot read the API token {self.token_file} ({self.source}): "
                    f"{exc.strerror or exc}"
                ) from None
            self._read_at = now
        return self.token

    @property
    def rereadable(self) -> bool:
        return self.token_file is not None


def load_connection(config: KubernetesConfig, env: Mapping[str, str] | None = None) -> Connection:
    """The connection the settings (and environment) describe; raises `KubeConfigError`."""
    env = os.environ if env is None else env
    path = config.kubeconfig
    if path is None and env.get("KUBECONFIG"):
        path = Path(env["KUBECONFIG"].split(os.pathsep)[0])
    if path is not None:
        connection = from_kubeconfig(path)
    elif env.get("KUBERNETES_SERVICE_HOST") and (SERVICE_ACCOUNT_DIR / "token").exists():
        connection = in_cluster(env)
    elif config.api_url is not None:
        return Connection(server=config.api_url, source="kubernetes.api_url, no credentials")
    else:
        raise KubeConfigError(
            "no Kubernetes API server configured: set kubernetes.kubeconfig or $KUBECONFIG, "
            "run the gateway in a pod with a ServiceAccount, or set kubernetes.api_url "
            "(for example http://127.0.0.1:8001 behind kubectl proxy)"
        )
    if config.api_url is not None:
        connection.server = config.api_url
    return connection


def in_cluster(env: Mapping[str, str], account_dir: Path = SERVICE_ACCOUNT_DIR) -> Connection:
    """The pod's ServiceAccount, as client-go's `rest.InClusterConfig` finds it."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        raise KubeConfigError(
            "in-cluster config needs KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT "
            "(set by the kubelet in every pod)"
        )
    if ":" in host:
        host = f"[{host}]"  # IPv6
    ca = account_dir / "ca.crt"
    connection = Connection(
        server=f"https://{host}:{port}",
        source=f"the pod's ServiceAccount ({account_dir})",
        verify=_ssl_context(cafile=ca, what="the ServiceAccount CA"),
        token_file=account_dir / "token",
    )
    connection.bearer()
    return connection


def from_kubeconfig(path: Path) -> Connection:
    """The current context of the kubeconfig at `path`."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeConfigError(f"cannot read kubeconfig {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise KubeConfigError(f"kubeconfig {path} is not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeConfigError(f"kubeconfig {path} is not a kubeconfig (no mapping)")
    context_name = doc.get("current-context")
    if not context_name:
        raise KubeConfigError(f"kubeconfig {path} has no current-context")
    context = _named(doc, "contexts", context_name, "context", path)
    cluster = _named(doc, "clusters", context.get("cluster"), "cluster", path)
    user_name = context.get("user")
    user = _named(doc, "users", user_name, "user", path) if user_name else {}
    source = f"kubeconfig {path}, context {context_name!r}"
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise KubeConfigError(f"{source}: cluster {context.get('cluster')!r} has no server")
    base = path.parent
    for key, what in _UNSUPPORTED_USER.items():
        if user.get(key):
            raise KubeConfigError(
                f"{source}: user {user_name!r} uses {what} ({key}:), which the gateway does "
                "not support; give it a ServiceAccount token (token: or tokenFile:) or a "
                "client certificate, or set kubernetes.api_url to a kubectl proxy"
            )
    connection = Connection(server=server.rstrip("/"), source=source)
    if cluster.get("insecure-skip-tls-verify"):
        connection.verify = False
    elif server.startswith("https:"):
        ca_data = cluster.get("certificate-authority-data")
        ca_file = cluster.get("certificate-authority")
        connection.verify = _ssl_context(
            cadata=_b64(ca_data, "certificate-authority-data", source) if ca_data else None,
            cafile=base / ca_file if ca_file else None,
            what=f"{source}: the cluster's CA",
        )
    if user.get("tokenFile"):
        connection.token_file = base / str(user["tokenFile"])
        connection.bearer()
    elif user.get("token"):
        connection.token = str(user["token"])
    cert_data, key_data = user.get("client-certificate-data"), user.get("client-key-data")
    cert_file, key_file = user.get("client-certificate"), user.get("client-key")
    if cert_data or cert_file or key_data or key_file:
        if not isinstance(connection.verify, ssl.SSLContext):
            connection.verify = _ssl_context(what=f"{source}: TLS")
        cert_pem = _b64(cert_data, "client-certificate-data", source) if cert_data else None
        key_pem = _b64(key_data, "client-key-data", source) if key_data else None
        _load_client_cert(
            connection.verify,
            cert_pem or (base / cert_file if cert_file else None),
            key_pem or (base / key_file if key_file else None),
            source,
        )
    return connection


def _named(doc: dict[str, Any], section: str, name: Any, key: str, path: Path) -> dict[str, Any]:
    for entry in doc.get(section) or []:
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get(key) or {}
            if isinstance(value, dict):
                return value
    raise KubeConfigError(f"kubeconfig {path}: no {key} named {name!r} in {section}:")


def _b64(value: Any, key: str, source: str) -> str:
    try:
        return base64.b64decode(str(value), validate=True).decode()
    except (ValueError, UnicodeDecodeError):
        raise KubeConfigError(f"{source}: {key} is not base64 PEM") from None


def _ssl_context(
    *, cadata: str | None = None, cafile: Path | None = None, what: str
) -> ssl.SSLContext:
    try:
        if cadata is None and cafile is None:
            return ssl.create_default_context()
        return ssl.create_default_context(
            cafile=str(cafile) if cafile is not None else None, cadata=cadata
        )
    except (OSError, ssl.SSLError) as exc:
        raise KubeConfigError(f"cannot load {what} ({cafile or 'inline data'}): {exc}") from None


def _load_client_cert(
    context: ssl.SSLContext, cert: str | Path | None, key: str | Path | None, source: str
) -> None:
    """Load a client certificate and key, each a file or inline PEM (written to a private
    temporary directory only for `load_cert_chain`, which reads files, then removed)."""
    if cert is None or key is None:
        raise KubeConfigError(f"{source}: a client certificate needs both a certificate and key")
    with tempfile.TemporaryDirectory(prefix="microscheduler-kube-") as tmp:
        files = []
        for name, value in (("cert.pem", cert), ("key.pem", key)):
            if isinstance(value, Path):
                files.append(value)
                continue
            file = Path(tmp) / name
            file.touch(mode=0o600)
            file.write_text(value)
            files.append(file)
        try:
            context.load_cert_chain(files[0], files[1])
        except (OSError, ssl.SSLError) as exc:
            raise KubeConfigError(f"{source}: cannot load the client certificate: {exc}") from None
