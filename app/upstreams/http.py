"""The data plane's HTTP client: one aiohttp session per upstream, bytes relayed as they come.

`HttpUpstream.open()` sends the request and returns only once the status, the headers and
the first body chunk are in (bounded by `first_byte_s`), so a caller can still choose
another target before the client has seen anything. In a 200 event stream, SSE comments
and blank lines are not content: the first chunk then runs to the start of the first
event (`app.upstreams.sse_comments`), so an error event after keep-alives can still be
judged before anything is relayed. The rest of the body is read chunk
by chunk, each read bounded by `idle_s`; there is no total timeout.

aiohttp exceptions never leave this module: they become `UpstreamUnavailable` or
`UpstreamTimeout` with a bounded `kind`. There are no hidden retries here.

What a client reads names the upstream by its configured name and says what went wrong
in a few words (`backend 'reasoning' did not answer: connection refused`); the address
and the exception (`Cannot connect to host 127.0.0.1:19399 ...`) go to the log and to
`last_error` (shown to the admin in `/status`), never into an answer.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Final, Protocol

import aiohttp

from app.activity import WaitKind, add_wait
from app.errors import UpstreamBadStatus, UpstreamError, UpstreamTimeout, UpstreamUnavailable
from app.settings import TimeoutsConfig
from app.upstreams.idle_watch import IdleWatch
from app.upstreams.sse_comments import MAX_PEEK_BYTES, content_start, may_start_with_comment

logger = logging.getLogger(__name__)

# RFC 9110 7.6.1 hop-by-hop headers, plus those the ASGI server writes itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
_NOT_FROM_UPSTREAM = HOP_BY_HOP | {"server", "date"}
_DROPPED_FROM_UPSTREAM: Final = frozenset(name.encode("latin-1") for name in _NOT_FROM_UPSTREAM)
# A final status a client's HTTP stack can take: uvicorn has no status line for another
# (999 broke the client's connection), and a 1xx (101) is no final answer.
RELAYABLE_STATUS: Final = range(200, 600)
# What a client sends that must not reach the upstream: the gateway's own key (as a bearer
# token or, from Anthropic's SDKs, `x-api-key`), framing, and its `x-request-id`: vLLM
# makes it the request's id (vllm/entrypoints/serve/engine/serving.py `_base_request_id`:
# `chatcmpl-<id>`), and an abort by that id ends every request given it
# (vllm/v1/engine/output_processor.py `abort_requests`): one client must not be able to
# name another's request. Without it vLLM draws a random id.
_NOT_TO_UPSTREAM = HOP_BY_HOP | {
    "host",
    "authorization",
    "x-api-key",
    "content-length",
    "cookie",
    "x-request-id",
}


def forwardable_request_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """Client headers to pass upstream, minus hop-by-hop ones and the gateway's credentials."""
    out: dict[str, str] = {}
    dropped = _connection_tokens(headers)
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name in _NOT_TO_UPSTREAM or name in dropped:
            continue
        out[name] = raw_value.decode("latin-1")
    return out


def upstream_content_type(headers: dict[str, str], body: bytes) -> dict[str, str]:
    """`headers` with the body labelled `application/json` unless it is multipart (a form
    keeps its boundary). vLLM's JSON routes answer 400 to any other label
    (`validate_json_request`), and clients label JSON as they please: curl's `-d` says
    `application/x-www-form-urlencoded`, and with no label aiohttp sends
    `application/octet-stream`. A request without a body is left as it is."""
    if not body:
        return headers
    # Names lower-case (`forwardable_request_headers`, an upstream's own headers): a
    # client that labelled it JSON already, the usual case, sends them as they are.
    sent = headers.get("content-type")
    if sent == "application/json":
        return headers
    out = {k: v for k, v in headers.items() if k.lower() != "content-type"}
    sent = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    multipart = sent.split(";", 1)[0].strip().lower().startswith("multipart/")
    out["content-type"] = sent if multipart else "application/json"
    return out


def _connection_tokens(headers: list[tuple[bytes, bytes]]) -> frozenset[str]:
    """Headers named in `Connection:` are hop-by-hop too (RFC 9110 7.6.1)."""
    tokens: set[str] = set()
    for raw_name, raw_value in headers:
        if raw_name.lower() == b"connection":
            tokens.update(t.strip().lower() for t in raw_value.decode("latin-1").split(","))
    return frozenset(tokens)


class Relayable(Protocol):
    """What the relay needs of an opened response (`UpstreamResponse` and the provider
    responses built on it)."""

    status: int
    headers: list[tuple[bytes, bytes]]
    first_chunk: bytes

    @property
    def complete(self) -> bool: ...

    @property
    def is_event_stream(self) -> bool: ...

    def rest(self) -> AsyncIterator[bytes]: ...

    def release(self) -> None: ...


class BufferedResponse:
    """A whole response held in memory (a translated answer, a translated error).

    `policy_body` is what the fallback policy reads instead of the body, when the body
    was rewritten (the provider's own error, before translation)."""

    def __init__(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        *,
        policy_body: bytes | None = None,
    ) -> None:
        self.status = status
        self.first_chunk = body
        self.headers: list[tuple[bytes, bytes]] = [(b"content-type", content_type.encode())]
        self.content_type = content_type
        self.policy_body = body if policy_body is None else policy_body

    @property
    def complete(self) -> bool:
        return True

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def rest(self) -> AsyncIterator[bytes]:
        return
        yield  # an empty async generator

    def release(self) -> None:
        pass


class UpstreamResponse:
    """An opened upstream response: status, relayable headers, the first chunk, the rest."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        first_chunk: bytes,
        idle_s: float,
        backend: str,
        on_release: Callable[[], None] | None = None,
        *,
        on_error: Callable[[str, BaseException], None] | None = None,
        role: str = "upstream",
    ) -> None:
        self._response = response
        self._on_release = on_release
        self._on_error = on_error  # the failure's detail, for the log and `last_error`
        self.status = response.status
        self.first_chunk = first_chunk
        self._idle_s = idle_s
        self._backend = backend
        self._role = role
        self._eof = not first_chunk
        # As received (bytes), names lower-cased: no decoding and encoding again.
        dropped = _DROPPED_FROM_UPSTREAM
        if "connection" in response.headers:  # the headers it names are hop-by-hop too
            dropped = dropped | {
                t.strip().lower().encode("latin-1")
                for v in response.headers.getall("connection")
                for t in v.split(",")
            }
        self.headers: list[tuple[bytes, bytes]] = [
            (lower, value)
            for name, value in response.raw_headers
            if (lower := name.lower()) not in dropped
        ]
        self.content_type = response.headers.get("content-type", "")

    @property
    def complete(self) -> bool:
        """True when the first chunk was the whole body (the usual non-streaming case)."""
        if not self._eof and self._response.content.at_eof():
            self._eof = True
        return self._eof

    @property
    def is_event_stream(self) -> bool:
        return self.content_type.startswith("text/event-stream")

    async def rest(self) -> AsyncIterator[bytes]:
        """The body after the first chunk, as it arrives; raises `UpstreamError`."""
        content = self._response.content
        watch = IdleWatch(self._idle_s)  # only the reads count, not the client's writes
        try:
            while not self._eof:
                watch.reading()
                try:
                    chunk = await content.readany()
                except asyncio.CancelledError:
                    if not watch.expired():
                        raise
                    raise UpstreamTimeout(
                        f"{self._role} {self._backend!r} sent nothing for {self._idle_s:g}s "
                        "mid-response",
                        kind="idle_timeout",
                    ) from None
                except aiohttp.ClientError as exc:
                    if self._on_error is not None:
                        self._on_error("disconnected", exc)
                    raise UpstreamUnavailable(
                        f"{self._role} {self._backend!r} broke off the response: {failure(exc)}",
                        kind="disconnected",
                    ) from None
                finally:
                    watch.read()
                if not chunk:
                    self._eof = True
                    return
                yield chunk
        finally:
            watch.close()

    def release(self) -> None:
        """Pool the connection if the body was read to its end; otherwise close it, so the
        upstream sees the request abandoned (client gone, stream broken) and stops."""
        if self._eof:
            self._response.release()
        else:
            self._response.close()
        if self._on_release is not None:
            on_release, self._on_release = self._on_release, None
            on_release()


class PoolObserver(Protocol):
    """Where a wait for a free connection is counted (metrics)."""

    def waiting(self, delta: int) -> None: ...

    def waited(self, seconds: float) -> None: ...


class HttpUpstream:
    """One upstream server (a vLLM instance or a cloud provider) and its connection pool.

    `max_connections` None: as many connections as requests (a vLLM server takes them
    all; the gateway's own limits are the leases). A number caps them: a request beyond
    it waits for a response to end, counted in `pool_waiting` and `observer`, and that
    wait is part of `first_byte_s`."""

    def __init__(
        self,
        name: str,
        base_url: str,
        timeouts: TimeoutsConfig,
        *,
        max_connections: int | None = None,
        extra_headers: dict[str, str] | None = None,
        observer: PoolObserver | None = None,
        role: str = "upstream",
    ) -> None:
        """`role`: what clients are told it is (`backend`, `provider`), with its name."""
        self.name = name
        self.role = role
        self.base_url = base_url
        # The last transport failure in full (address, exception) and when: for the admin.
        self.last_error: str | None = None
        self.timeouts = timeouts
        # Lower-case names, as the client's forwarded ones (`upstream_content_type`).
        self._extra_headers = {k.lower(): v for k, v in (extra_headers or {}).items()}
        self._max_connections = max_connections
        self._slots = asyncio.Semaphore(max_connections) if max_connections else None
        self._observer = observer
        self.pool_waiting = 0  # requests waiting for a free connection now
        self._session: aiohttp.ClientSession | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        # Created lazily so it binds to the running loop.
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0,  # the slots below are the limit, counted
                # Below uvicorn's 5 s keep-alive (vLLM's server), so we never reuse a socket
                # the upstream is about to close.
                keepalive_timeout=4.0,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeouts.connect_s),
                auto_decompress=False,  # relay bytes as sent, content-encoding included
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                raise_for_status=False,
            )
        return self._session

    async def open(
        self,
        path: str,
        body: bytes,
        headers: dict[str, str],
        *,
        first_byte_s: float | None = None,
        method: str = "POST",
    ) -> UpstreamResponse:
        """Send `body` to `path` (POST unless `method` says otherwise); return once status,
        headers and the first chunk are in.

        `first_byte_s` replaces the configured first-byte timeout for this request (a
        fallback chain gives an attempt what is left of its deadline)."""
        session = self._get_session()
        if self._extra_headers:
            headers = {**headers, **self._extra_headers}
        headers = upstream_content_type(headers, body)
        url = self.base_url + path
        response: aiohttp.ClientResponse | None = None
        limit = self.timeouts.first_byte_s if first_byte_s is None else first_byte_s
        slot = False
        first = b""
        try:
            async with asyncio.timeout(limit):
                slot = await self._take_slot()
                response = await session.request(method, url, data=body, headers=headers)
                first = await response.content.readany()
                if may_start_with_comment(first) and _is_ok_event_stream(response):
                    first = await _past_comments(response, first)
        except BaseException as exc:
            if response is not None:
                response.close()
            if slot:
                self._give_slot()
            if isinstance(exc, Exception):
                if not slot and self._slots is not None and isinstance(exc, TimeoutError):
                    raise UpstreamTimeout(
                        f"no free connection to {self.role} {self.name!r} within {limit:g}s "
                        f"(all {self._max_connections} of max_connections in use)",
                        kind="pool_timeout",
                    ) from None
                if first and isinstance(exc, TimeoutError):
                    # Comments only (SSE keep-alives): no content came, as if nothing had.
                    raise UpstreamTimeout(
                        f"{self.role} {self.name!r} sent only SSE comments, no event, within "
                        f"{limit:g}s",
                        kind="first_byte_timeout",
                    ) from None
                raise self._translate(exc, limit) from None
            raise
        if response.status not in RELAYABLE_STATUS:
            response.close()
            if slot:
                self._give_slot()
            raise UpstreamBadStatus(
                f"{self.role} {self.name!r} answered with status {response.status}, which is not "
                f"an HTTP status the gateway can relay ({RELAYABLE_STATUS.start}.."
                f"{RELAYABLE_STATUS.stop - 1})",
                kind="bad_status",
            )
        on_release = self._give_slot if slot else None
        return UpstreamResponse(
            response, first, self.timeouts.idle_s, self.name, on_release,
            on_error=self._failed, role=self.role,
        )  # fmt: skip

    async def _take_slot(self) -> bool:
        """Hold one of `max_connections` (True), waiting for one if all are in use."""
        slots = self._slots
        if slots is None:
            return False
        if not slots.locked():
            await slots.acquire()
            return True
        loop = asyncio.get_running_loop()
        started = loop.time()
        self.pool_waiting += 1
        if self._observer is not None:
            self._observer.waiting(1)
        try:
            await slots.acquire()
        finally:
            self.pool_waiting -= 1
            waited = loop.time() - started
            add_wait(WaitKind.LIMIT, waited)  # the request's own (its activity, its header)
            if self._observer is not None:
                self._observer.waiting(-1)
                self._observer.waited(waited)
        return True

    def _give_slot(self) -> None:
        if self._slots is not None:
            self._slots.release()

    def _translate(self, exc: Exception, first_byte_s: float) -> UpstreamError:
        who = f"{self.role} {self.name!r}"
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            self._failed("connect_timeout", exc)
            return UpstreamTimeout(
                f"connecting to {who} took more than {self.timeouts.connect_s:g}s",
                kind="connect_timeout",
            )
        if isinstance(exc, aiohttp.ClientConnectorError):
            self._failed("connect", exc)
            return UpstreamUnavailable(f"{who} did not answer: {failure(exc)}", kind="connect")
        if isinstance(exc, TimeoutError):
            return UpstreamTimeout(
                f"{who} sent no response within {first_byte_s:g}s",
                kind="first_byte_timeout",
            )
        if isinstance(exc, aiohttp.ClientError | OSError):
            self._failed("disconnected", exc)
            return UpstreamUnavailable(
                f"{who} closed the connection before answering: {failure(exc)}",
                kind="disconnected",
            )
        raise exc

    def _failed(self, kind: str, exc: BaseException) -> None:
        """A transport failure in full: logged, and kept in `last_error` for `/status`."""
        detail = _describe(exc)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.last_error = f"{stamp} {kind}: {detail} ({self.base_url})"
        logger.warning(
            "upstream failed %s=%s kind=%s url=%s error=%s",
            self.role, self.name, kind, self.base_url, detail,
        )  # fmt: skip

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def failure(exc: BaseException) -> str:
    """A transport failure in a few words for a client: what happened, never where (no
    host, port or address; those stay in the log)."""
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "its host name did not resolve"
    if isinstance(exc, aiohttp.ClientConnectorCertificateError | aiohttp.ClientSSLError):
        return "the TLS handshake failed"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return "the server disconnected"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return "the body was cut short"
    code = exc.errno if isinstance(exc, OSError) else None
    if code is None and isinstance(exc, aiohttp.ClientConnectorError):
        code = exc.os_error.errno
    words = _ERRNO_WORDS.get(code) if code is not None else None
    if words is not None:
        return words
    if isinstance(exc, aiohttp.ClientConnectorError):
        return "the connection failed"
    return "the connection failed" if isinstance(exc, OSError) else "the exchange failed"


_ERRNO_WORDS = {
    errno.ECONNREFUSED: "connection refused",
    errno.ECONNRESET: "connection reset",
    errno.ECONNABORTED: "connection aborted",
    errno.EPIPE: "connection closed",
    errno.EHOSTUNREACH: "host unreachable",
    errno.ENETUNREACH: "network unreachable",
    errno.ETIMEDOUT: "connection timed out",
}


def _is_ok_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.status == 200 and response.headers.get("content-type", "").startswith(
        "text/event-stream"
    )


async def _past_comments(response: aiohttp.ClientResponse, first: bytes) -> bytes:
    """`first` and what follows, read until the first line that is not an SSE comment or
    blank begins (`app.upstreams.sse_comments`), the body ends, or `MAX_PEEK_BYTES` are in;
    every byte kept, to be relayed as sent. The caller's first-byte timeout bounds it."""
    buf = first
    while content_start(buf) is None and len(buf) < MAX_PEEK_BYTES:
        more = await response.content.readany()
        if not more:
            break
        buf += more
    return buf


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
