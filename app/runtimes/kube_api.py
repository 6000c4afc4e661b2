"""A small async client for the Kubernetes API: get, merge-patch, list, watch and a pod's
log (text/plain, chunked while it follows).

Plain httpx, like the Docker client: four kinds of call are all the runtime needs, and a
generated client would bring a second HTTP stack (docs/reference/scale_out.md, "Python
client"). The connection (server, CA, token) is worked out on first use
(`kube_config.load_connection`) and kept; a token read from a file is re-read every minute
and, after a 401, once more before the call is retried once.

Every request has an explicit timeout. Every failure is a `KubeError` (a `RuntimeFailure`)
whose message says what to fix. The API server answers errors with a `Status` object
(`{"kind":"Status","status":"Failure","message":...,"reason":"Forbidden","code":403}`);
its `reason` is kept, its message quoted:

    Unauthorized  401: the token was refused (expired, revoked, wrong cluster)
    Forbidden     403: the Role lacks a verb on a resource (the message names both)
    NotFound      404: no such workload or Service in the namespace
    Expired/Gone  410: a watch's resourceVersion is too old (the caller lists again)
    Conflict, Invalid, UnsupportedMediaType, InternalError, ...: as the server said
    unreachable, timeout, unexpected: no (usable) answer
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any

from app.runtimes.base import RuntimeFailure, read_refusal
from app.runtimes.kube_config import Connection, load_connection
from app.settings import KubernetesConfig
from app.tasks import OwnedTasks
from app.upstreams.control_http import (
    AsyncBaseTransport,
    AsyncClient,
    ConnectError,
    HTTPError,
    Response,
    Timeout,
    TimeoutException,
    async_client,
)

logger = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
_MAX_ERROR_TEXT = 300
_RBAC_HINT = "grant it in the gateway's Role (deploy/kubernetes/rbac.yaml)"


class KubeError(RuntimeFailure):
    """A Kubernetes API call failed; `reason` is the Status reason (or a short name for a
    transport failure) and `status` the HTTP status when there was an answer."""

    def __init__(self, message: str, *, reason: str, status: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.status = status

    @property
    def expired(self) -> bool:
        """A watch's resourceVersion is too old: list again (410 Gone, reason Expired)."""
        return self.status == 410 or self.reason in ("Expired", "Gone")


@dataclass(frozen=True, slots=True)
class Call:
    """What a call does, in RBAC terms, for messages: `patch` on `deployments/scale`
    named `vllm` in namespace `llm`."""

    verb: str
    resource: str
    namespace: str
    name: str | None = None
    group: str = ""

    def describe(self) -> str:
        what = f"{self.resource} {self.name!r}" if self.name else self.resource
        return f"{self.verb} {what} in namespace {self.namespace!r}"


class KubeApi:
    def __init__(
        self,
        config: KubernetesConfig,
        *,
        transport: AsyncBaseTransport | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._config = config
        self._transport = transport
        self._env = env
        self._connection: Connection | None = None
        self._client: AsyncClient | None = None
        self._tasks = OwnedTasks()  # the EndpointSlice watches

    @property
    def url(self) -> str:
        if self._connection is not None:
            return self._connection.server
        return self._config.api_url or "the Kubernetes API server"

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """A background task (a watch) that `aclose` cancels; a failure is logged."""
        return self._tasks.spawn(coro, name)

    async def aclose(self) -> None:
        await self._tasks.close()
        if self._client is not None:
            await self._client.aclose()

    def _connect(self) -> tuple[Connection, AsyncClient]:
        if self._connection is None or self._client is None:
            connection = load_connection(self._config, self._env)
            self._client = async_client(
                base_url=connection.server,
                verify=connection.verify,
                transport=self._transport,
                timeout=self._config.timeout_s,
            )
            self._connection = connection
            logger.info("kubernetes api server=%s via=%s", connection.server, connection.source)
        return self._connection, self._client

    # -- calls ----------------------------------------------------------------------------

    async def get(self, path: str, call: Call, params: Mapping[str, str] | None = None) -> Any:
        """GET `path` (a single object or a list); its JSON."""
        return await self._json("GET", path, call, params=params)

    async def merge_patch(self, path: str, body: dict[str, Any], call: Call) -> Any:
        """PATCH with `application/merge-patch+json` (RFC 7386)."""
        content = json.dumps(body).encode()
        headers = {"Content-Type": MERGE_PATCH}
        return await self._json("PATCH", path, call, content=content, headers=headers)

    async def watch(
        self, path: str, call: Call, params: Mapping[str, str], timeout_s: int
    ) -> AsyncIterator[dict[str, Any]]:
        """Watch events (`{"type": "ADDED", "object": {...}}`, one JSON object a line) until
        the server ends the watch (after `timeout_s`). An `ERROR` event is raised as a
        `KubeError` (a 410 one is `expired`)."""
        connection, client = self._connect()
        query = {**params, "watch": "1", "timeoutSeconds": str(timeout_s)}
        timeout = Timeout(self._config.timeout_s, read=timeout_s + self._config.timeout_s)
        for attempt in (0, 1):
            headers = self._auth(connection, reread=attempt > 0)
            try:
                async with client.stream(
                    "GET", path, params=query, headers=headers, timeout=timeout
                ) as response:
                    if response.status_code == 401 and attempt == 0 and connection.rereadable:
                        continue
                    if response.status_code >= 400:
                        await response.aread()
                        raise self._failure(response, call, connection)
                    async for line in response.aiter_lines():
                        if not line.strip():
                            continue
                        event = _event(line, call)
                        if event.get("type") == "ERROR":
                            raise _status_failure(event.get("object"), None, call, connection)
                        yield event
                    return
            except HTTPError as exc:
                raise _transport_failure(exc, call, self.url) from None

    async def text_stream(
        self, path: str, call: Call, params: Mapping[str, str], *, follow: bool
    ) -> AsyncIterator[bytes]:
        """Open a text/plain GET (a pod's log) and return its bytes as they come; a
        followed one has no read timeout (it ends when the container stops or the caller
        stops reading)."""
        connection, client = self._connect()
        read = None if follow else self._config.timeout_s
        timeout = Timeout(self._config.timeout_s, read=read)
        request = client.build_request(
            "GET", path, params=dict(params), headers=self._auth(connection, reread=False),
            timeout=timeout,
        )  # fmt: skip
        try:
            response = await client.send(request, stream=True)
        except HTTPError as exc:
            raise _transport_failure(exc, call, self.url) from None
        if response.status_code >= 400:
            await read_refusal(response)
            raise self._failure(response, call, connection)
        return self._body(response, call)

    async def _body(self, response: Response, call: Call) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except HTTPError as exc:
            raise _transport_failure(exc, call, self.url) from None
        finally:
            await response.aclose()

    async def _json(self, method: str, path: str, call: Call, **kwargs: Any) -> Any:
        connection, client = self._connect()
        response: Response | None = None
        for attempt in (0, 1):
            headers = {**kwargs.pop("headers", {}), **self._auth(connection, reread=attempt > 0)}
            try:
                response = await client.request(method, path, headers=headers, **kwargs)
            except HTTPError as exc:
                raise _transport_failure(exc, call, self.url) from None
            if response.status_code == 401 and attempt == 0 and connection.rereadable:
                logger.warning("kubernetes api 401, re-reading the token and retrying once")
                kwargs["headers"] = {k: v for k, v in headers.items() if k != "Authorization"}
                continue
            break
        assert response is not None
        if response.status_code >= 400:
            raise self._failure(response, call, connection)
        try:
            return response.json()
        except ValueError:
            raise KubeError(
                f"the Kubernetes API answered {call.describe()} with something that is not "
                f"JSON: {response.text[:_MAX_ERROR_TEXT]!r}",
                reason="unexpected",
                status=response.status_code,
            ) from None

    def _auth(self, connection: Connection, *, reread: bool) -> dict[str, str]:
        token = connection.bearer(reread=reread)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _failure(self, response: Response, call: Call, connection: Connection) -> KubeError:
        try:
            body = response.json()
        except ValueError:
            body = None
        return _status_failure(body, response, call, connection)


def _event(line: str, call: Call) -> dict[str, Any]:
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict) or "type" not in event:
        raise KubeError(
            f"the watch for {call.describe()} sent a line that is no watch event: "
            f"{line[:_MAX_ERROR_TEXT]!r}",
            reason="unexpected",
        )
    return event


def _status_failure(
    body: Any, response: Response | None, call: Call, connection: Connection
) -> KubeError:
    """A `Status` object (an error answer, or a watch's ERROR event) as an operator message."""
    status: dict[str, Any] = body if isinstance(body, dict) else {}
    code = status.get("code")
    if not isinstance(code, int):
        code = response.status_code if response is not None else 500
    reason = str(status.get("reason") or f"HTTP {code}")
    said = str(status.get("message") or (response.text if response is not None else ""))
    said = said[:_MAX_ERROR_TEXT]
    if code == 401:
        message = (
            f"the Kubernetes API server refused the credentials from {connection.source} "
            f"(401 {reason}) to {call.describe()}: the token may have expired or been "
            "revoked, or belongs to another cluster"
        )
    elif code == 403:
        group = f" in API group {call.group!r}" if call.group else " in the core API group"
        message = (
            f"the gateway may not {call.verb} {call.resource}{group} in namespace "
            f"{call.namespace!r}: {_RBAC_HINT} (Kubernetes said: {said})"
        )
    elif code == 404:
        what = f"{call.resource.split('/')[0]} {call.name!r}" if call.name else call.resource
        message = (
            f"no {what} in namespace {call.namespace!r} (404, needed to {call.describe()}): "
            "check the backend's runtime namespace and workload name"
        )
    elif code == 410:
        message = f"{call.describe()}: resourceVersion too old (410 {reason}: {said})"
    else:
        message = f"the Kubernetes API refused to {call.describe()} ({code} {reason}): {said}"
    return KubeError(message, reason=reason, status=code)


def _transport_failure(exc: HTTPError, call: Call, url: str) -> KubeError:
    if isinstance(exc, TimeoutException):
        return KubeError(
            f"the Kubernetes API server at {url} did not answer in time to {call.describe()} "
            "(kubernetes.timeout_s)",
            reason="timeout",
        )
    if isinstance(exc, ConnectError):
        return KubeError(
            f"cannot reach the Kubernetes API server at {url} to {call.describe()}: {exc} "
            "(kubernetes.kubeconfig / kubernetes.api_url, or the pod's network policy)",
            reason="unreachable",
        )
    return KubeError(
        f"the connection to the Kubernetes API server at {url} failed while trying to "
        f"{call.describe()}: {type(exc).__name__}: {exc}",
        reason="unexpected",
    )
