"""Faults against `microscheduler serve` as a real uvicorn process: upstream bodies that
are garbage or cut off (a raw socket server plays the upstream, so the bytes are exactly
the broken ones), and SIGTERM with streams in flight."""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fakes.processes import (
    ROOT,
    GatewayProcess,
    fake_vllm_process,
    free_port,
    gateway_process,
    port_is_open,
    wait_for,
)
from tests.fakes.waits import until_sync

pytestmark = pytest.mark.e2e

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
CHUNK = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
         "choices": [{"index": 0, "delta": {"content": "tok"}, "finish_reason": None}]}  # fmt: skip
EVENT = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"


def chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def head(content_type: str, *extra: str) -> bytes:
    lines = ["HTTP/1.1 200 OK", f"content-type: {content_type}", *extra, "", ""]
    return "\r\n".join(lines).encode()


# What the raw upstream answers, by the request's model; the socket is closed after it.
REPLIES: dict[str, bytes] = {
    # 200 with a body that is not JSON (a proxy's error page, say), complete.
    "garbage-json": head("application/json", "content-length: 29")
    + b"<html>upstream crashed</html>",
    # A chunked JSON body cut mid-way: no terminating chunk, the socket closes.
    "cut-json": head("application/json", "transfer-encoding: chunked")
    + chunk(b'{"id":"x","object":"chat.completion","choices":[{"index":0,'),
    # An SSE stream cut mid-way: two events, no terminating chunk, no [DONE].
    "cut-sse": head("text/event-stream", "transfer-encoding: chunked")
    + chunk(EVENT)
    + chunk(EVENT),
    # An SSE stream whose body ends cleanly (terminating chunk) but without [DONE].
    "sse-no-done": head("text/event-stream", "transfer-encoding: chunked")
    + chunk(EVENT)
    + chunk(EVENT)
    + b"0\r\n\r\n",
    # An SSE stream delimited by the connection close (no length, not chunked), cut.
    "sse-eof": head("text/event-stream", "connection: close") + EVENT + EVENT,
}


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return data
        data += more
    header, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in header.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(body) < length:
        more = conn.recv(65536)
        if not more:
            break
        body += more
    return header + b"\r\n\r\n" + body


@contextlib.contextmanager
def raw_upstream() -> Iterator[str]:
    """A socket server on 127.0.0.1 that answers each request from REPLIES and closes."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stopping = threading.Event()
    held: list[socket.socket] = []  # "silent": accepted, read, never answered

    def serve() -> None:
        while not stopping.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.settimeout(5)
            request = read_request(conn)
            first, _, rest = request.partition(b"\r\n")
            if first.startswith(b"GET"):
                conn.sendall(head("application/json", "content-length: 2") + b"{}")
            else:
                model = json.loads(rest.partition(b"\r\n\r\n")[2] or b"{}").get("model", "")
                if model == "silent":
                    held.append(conn)
                    continue
                conn.sendall(REPLIES.get(model, head("text/plain", "content-length: 0")))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stopping.set()
        thread.join(5)
        server.close()
        for conn in held:
            conn.close()


@pytest.fixture(scope="module")
def broken_gw() -> Iterator[GatewayProcess]:
    with raw_upstream() as url:
        # One backend per reply: a backend sends its first model id upstream.
        timeouts = {"first_byte_s": 5, "idle_s": 5}
        backends = {name: {"url": url, "models": [name], "timeouts": timeouts} for name in REPLIES}
        silent_timeouts = {"first_byte_s": SILENT_FIRST_BYTE_S}
        backends["silent"] = {"url": url, "models": ["silent"], "timeouts": silent_timeouts}
        config = {"backends": backends}
        with gateway_process(config) as gw:
            yield gw


SILENT_FIRST_BYTE_S = 1.0


@pytest.mark.parametrize("stream", [False, True])
def test_an_upstream_that_accepts_and_never_answers_is_504_at_first_byte_s(
    broken_gw: GatewayProcess, stream: bool
) -> None:
    began = time.monotonic()
    response = httpx.post(
        broken_gw.url + "/v1/chat/completions",
        json={"model": "silent", "messages": MESSAGES, "stream": stream},
        timeout=10,
    )
    took = time.monotonic() - began
    print(f"504 after {took:.2f}s (first_byte_s {SILENT_FIRST_BYTE_S}, stream={stream})")
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "upstream_timeout"
    assert f"sent no response within {SILENT_FIRST_BYTE_S:g}s" in error["message"]
    assert SILENT_FIRST_BYTE_S <= took < SILENT_FIRST_BYTE_S + 1


def client(gw: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="none", max_retries=0, timeout=10)


def test_a_non_json_200_reaches_the_client_as_an_error_not_an_answer(
    broken_gw: GatewayProcess,
) -> None:
    began = time.monotonic()
    response = httpx.post(
        broken_gw.url + "/v1/chat/completions",
        json={"model": "garbage-json", "messages": MESSAGES},
        timeout=10,
    )
    # The gateway relays bytes (it does not re-parse bodies): the upstream's 200 and body.
    assert response.status_code == 200
    assert response.content == b"<html>upstream crashed</html>"
    # What a client sees: the SDK fails to parse it, visibly (a bare JSONDecodeError,
    # not an openai.APIError: the gateway does not turn it into a 502).
    with client(broken_gw) as sdk, pytest.raises(json.JSONDecodeError):
        sdk.chat.completions.create(model="garbage-json", messages=MESSAGES)
    assert time.monotonic() - began < 5


def test_a_json_body_cut_mid_way_is_cut_for_the_client_too(broken_gw: GatewayProcess) -> None:
    # The status line is out when the cut shows: the gateway closes the connection
    # without the terminating chunk, so the client sees a truncated body, not a short one.
    with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
        httpx.post(
            broken_gw.url + "/v1/chat/completions",
            json={"model": "cut-json", "messages": MESSAGES},
            timeout=10,
        )


def stream_events(gw: GatewayProcess, model: str) -> list[str]:
    response = httpx.post(
        gw.url + "/v1/chat/completions",
        json={"model": model, "messages": MESSAGES, "stream": True},
        timeout=10,
    )
    assert response.status_code == 200
    return [e for e in response.text.split("\n\n") if e]


def test_an_sse_stream_cut_mid_way_ends_with_an_in_band_error(broken_gw: GatewayProcess) -> None:
    events = stream_events(broken_gw, "cut-sse")
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert error["code"] == "upstream_unavailable"
    assert "broke off the response" in error["message"]
    assert events[:-2] == [EVENT.decode().strip()] * 2


@pytest.mark.parametrize("model", ["sse-no-done", "sse-eof"])
def test_an_sse_stream_that_ends_without_done_ends_with_an_in_band_error(
    broken_gw: GatewayProcess, model: str
) -> None:
    events = stream_events(broken_gw, model)
    assert events[-1] == "data: [DONE]"
    assert '"error"' in events[-2]


# -- SIGTERM with streams in flight ----------------------------------------------------------

# A paced fake vLLM: 20 tokens/s, so a stream of N tokens takes about N/20 s.
TOKENS_PER_S = 20


@contextlib.contextmanager
def draining_gateway(upstream: str, grace_s: float) -> Iterator[GatewayProcess]:
    config = {"backends": {"b": {"url": upstream, "models": ["paced"]}}}
    env = {"MICROSCHEDULER_SHUTDOWN_GRACE_S": str(grace_s)}
    with gateway_process(config, env=env) as gw:
        yield gw


@pytest.fixture(scope="module")
def paced() -> Iterator[str]:
    with fake_vllm_process("paced", "--tokens-per-second", str(TOKENS_PER_S)) as url:
        yield url


class Stream:
    """A streaming request read on a thread; `first` is set at the first event."""

    def __init__(self, gw: GatewayProcess, max_tokens: int) -> None:
        self.first = threading.Event()
        self.text = ""
        self.error: BaseException | None = None
        body = {"model": "paced", "messages": MESSAGES, "stream": True, "max_tokens": max_tokens}
        self._thread = threading.Thread(target=self._run, args=(gw.url, body), daemon=True)
        self._thread.start()
        assert self.first.wait(10), "the stream did not begin"

    def _run(self, url: str, body: dict[str, Any]) -> None:
        try:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as r:
                for text in r.iter_text():
                    self.text += text
                    self.first.set()
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.first.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the stream neither finished nor failed"


def sigterm(gw: GatewayProcess) -> float:
    gw.proc.send_signal(signal.SIGTERM)
    return time.monotonic()


def exited_after(gw: GatewayProcess, sent: float, timeout_s: float) -> float:
    try:
        gw.proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the gateway did not exit within {timeout_s}s of SIGTERM:\n{gw.log()}")
    return time.monotonic() - sent


def test_sigterm_lets_streams_finish_refuses_new_connections_and_exits(paced: str) -> None:
    grace = 5.0
    with (
        draining_gateway(paced, grace) as gw,
        httpx.Client(base_url=gw.url, timeout=2) as pooled,
    ):
        assert pooled.get("/health").status_code == 200  # an idle keep-alive connection
        streams = [Stream(gw, max_tokens=30) for _ in range(2)]  # about 1.5 s each
        sent = sigterm(gw)
        # uvicorn closes its listening socket as it handles the signal: from then on a
        # new connection is refused (a load balancer or client retries elsewhere) rather
        # than answered 503; idle keep-alive connections are closed, so a client reusing
        # one reconnects and is refused. (A connection accepted before the handler ran is
        # served as usual.)
        until_sync(lambda: "Shutting down" in gw.log(), timeout_s=5)
        with pytest.raises(httpx.ConnectError):
            httpx.post(gw.url + "/v1/chat/completions", json={"model": "paced"}, timeout=2)
        with pytest.raises(httpx.ConnectError):
            pooled.get("/health")
        refused_at = time.monotonic() - sent
        for stream in streams:
            stream.join(grace + 5)
            assert stream.error is None, stream.error
            assert stream.text.rstrip().endswith("data: [DONE]")
            assert '"error"' not in stream.text
        took = exited_after(gw, sent, grace + 5)
        print(f"new connections refused {refused_at:.2f}s after SIGTERM; streams finished "
              f"and the gateway exited {took:.2f}s after it")  # fmt: skip
        assert took < grace
        assert gw.proc.returncode in (0, -signal.SIGTERM)


def test_sigterm_ends_streams_before_the_grace_deadline_and_exits(paced: str) -> None:
    grace = 2.0
    with draining_gateway(paced, grace) as gw:
        stream = Stream(gw, max_tokens=400)  # about 20 s: outlives the grace
        sent = sigterm(gw)
        stream.join(grace + 10)
        took = exited_after(gw, sent, grace + 10)
        print(f"stream ended; the gateway exited {took:.2f}s after SIGTERM (grace {grace}s)")
        assert grace - 1.5 <= took < grace + 1
        # Ended with the in-band error a second before the grace is over (more streams,
        # and the Messages API: tests/e2e/test_shutdown_streams.py), never silently short.
        assert stream.error is None, stream.error
        events = [e for e in stream.text.split("\n\n") if e.strip()]
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "gateway_stopping"


def test_a_grace_under_a_second_still_lets_a_short_stream_finish(paced: str) -> None:
    grace = 0.9
    with draining_gateway(paced, grace) as gw:
        stream = Stream(gw, max_tokens=8)  # about 0.4 s
        sent = sigterm(gw)
        stream.join(grace + 5)
        exited_after(gw, sent, grace + 5)
        assert stream.error is None, stream.error
        assert stream.text.rstrip().endswith("data: [DONE]")


# -- a backend killed mid-stream ---------------------------------------------------------------


def test_a_backend_killed_mid_stream_ends_it_in_band_and_releases_the_lease() -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.sim.vllm", "--port", str(port), "--model", "doomed",
         "--tokens-per-second", str(TOKENS_PER_S), "--max-tokens", "400"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(url + "/health", timeout_s=20, proc=proc)
        with gateway_process({"backends": {"doomed": {"url": url, "models": ["doomed"]}}}) as gw:
            body = {"model": "doomed", "messages": MESSAGES, "stream": True}
            with (
                httpx.Client(base_url=gw.url, timeout=10) as http,
                http.stream("POST", "/v1/chat/completions", json=body) as response,
            ):
                lines = response.iter_lines()
                assert next(lines).startswith("data: ")
                assert backend_in_flight(gw) == 1
                proc.kill()  # SIGKILL: the socket is reset, no goodbye
                killed = time.monotonic()
                rest = [line for line in lines if line]
                ended = time.monotonic() - killed
            print(f"stream ended {ended:.2f}s after the backend was killed")
            assert rest[-1] == "data: [DONE]"
            error = json.loads(rest[-2].removeprefix("data: "))["error"]
            assert error["code"] == "upstream_unavailable"
            assert "'doomed' broke off the response" in error["message"]
            assert ended < 2
            until_sync(lambda: backend_in_flight(gw) == 0, timeout_s=5)
            metrics = httpx.get(gw.url + "/metrics").text
            assert 'upstream_errors_total{backend="doomed",kind="disconnected"} 1.0' in metrics
    finally:
        proc.kill()
        proc.wait(5)


def backend_in_flight(gw: GatewayProcess) -> int:
    views = httpx.get(gw.url + "/backends", timeout=5).json()["backends"]
    return int(next(v for v in views if v["name"] == "doomed")["in_flight"])


# -- SIGTERM: what else bounds the exit -------------------------------------------------------


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["clean-stop", "ignores-sigterm"])
def test_sigterm_with_a_managed_backend_exits_after_the_drain_and_its_stop(
    ignores_sigterm: bool,
) -> None:
    """The drain deadline bounds the streams; stopping the backends the gateway runs comes
    after it, bounded by their own `stop_grace_s` (then SIGKILL): exit <= both."""
    grace, stop_grace = 2.0, 2.0
    port = free_port()
    flags = ["--tokens-per-second", str(TOKENS_PER_S), "--max-tokens", "400"]
    if ignores_sigterm:
        flags.append("--ignore-sigterm")
    backend = {
        "url": f"http://127.0.0.1:{port}",
        "models": ["paced"],
        "runtime": {"kind": "process", "cwd": str(ROOT), "stop_grace_s": stop_grace,
                    "command": ["{python}", "-m", "app.sim.vllm", "--port", str(port),
                                "--model", "paced", *flags]},
    }  # fmt: skip
    env = {"MICROSCHEDULER_SHUTDOWN_GRACE_S": str(grace)}
    with gateway_process({"backends": {"b": backend}}, env=env, wait_ready=True) as gw:
        stream = Stream(gw, max_tokens=400)
        sent = sigterm(gw)
        took = exited_after(gw, sent, grace + stop_grace + 10)
        stream.join(5)
        print(f"exited {took:.2f}s after SIGTERM (grace {grace}s, backend stop_grace_s "
              f"{stop_grace}s, backend ignores SIGTERM: {ignores_sigterm})")  # fmt: skip
        assert took >= grace - 1.5  # the stream is ended in-band a second before the grace
        assert took < grace + (stop_grace if ignores_sigterm else 0) + 2
        assert not port_is_open(port), "the backend the gateway ran is stopped"


def test_an_open_status_stream_does_not_hold_the_shutdown(paced: str) -> None:
    grace = 4.0
    with draining_gateway(paced, grace) as gw:
        ended = threading.Event()
        text: list[str] = []

        def watch() -> None:
            with (
                contextlib.suppress(httpx.HTTPError),
                httpx.stream("GET", gw.url + "/status/stream", timeout=30) as response,
            ):
                for part in response.iter_text():
                    text.append(part)
            ended.set()

        threading.Thread(target=watch, daemon=True).start()
        until_sync(lambda: bool(text), timeout_s=10)
        sent = sigterm(gw)
        took = exited_after(gw, sent, grace + 5)
        assert ended.wait(5)
        print(f"exited {took:.2f}s after SIGTERM with /status/stream open (grace {grace}s)")
        assert took < 1.5
        assert "event: shutdown" in "".join(text)
