"""The gateway's listener: uvicorn's server with an accept loop of our own, so that the
connection cap can stop accepting (`pause`) and leave newcomers in the kernel's backlog.

Neither asyncio's nor uvloop's `Server` can pause accepting (only close, which closes the
socket), so the listening sockets are watched here with the loop's public `add_reader`
and each accepted socket is handed to `loop.connect_accepted_socket`, both in asyncio and
uvloop. Everything else (the lifespan, signals, the graceful shutdown) stays uvicorn's.
vLLM's API server does the same to balance its workers (`super().startup(sockets=[])`,
then `sock.accept()` and `connect_accepted_socket` with uvicorn's protocol:
`vllm/entrypoints/launchers/launcher.py:84-140`, vLLM 0.33.0).

While paused, the kernel completes handshakes into the listen queue (`server.backlog`,
capped by `net.core.somaxconn`): the client is connected and its request waits unread;
past a full queue the kernel drops SYNs, which the client resends (1 s, 3 s, ...).

The server also sets the cyclic GC's pace (`GC_THRESHOLDS`) once the app has started.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import logging
import socket
from collections.abc import Callable

import uvicorn

from app.api.connections import Slots
from app.tasks import OwnedTasks

logger = logging.getLogger(__name__)

# The cyclic GC's thresholds while serving: a young-generation pass every 20,000 container
# allocations rather than Python's 700. A request allocates a few hundred (coroutines,
# futures, messages, its context), nearly all freed by reference counting, so the default
# ran a pass every couple of requests for little garbage; what start-up built is frozen
# out of every pass (`app.main`). Measured beside the default (bench/README.md, "CPU per
# request against a bare relay"): 10-15% less gateway CPU per request.
GC_THRESHOLDS = (20_000, 20, 100)

# Accepted per wake-up at least; more while the cap has room for them (`room`): the cap's
# pause is seen only once their connections are made, on the loop's next turn.
MIN_BATCH = 16
FULL_BACKOFF_S = 1.0  # out of files (EMFILE): stop accepting this long, as asyncio does
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Acceptor:
    """Accepts on listening sockets and hands each connection to `protocol` until
    `pause()`; `resume()` takes the backlog up again. Owns the sockets and the tasks that
    set each connection up."""

    def __init__(
        self,
        sockets: list[socket.socket],
        protocol: Callable[[], asyncio.Protocol],
        *,
        backlog: int,
        loop: asyncio.AbstractEventLoop,
        room: Callable[[], int] = lambda: MIN_BATCH,
    ) -> None:
        """`room`: how many more connections the cap takes now (`Slots.room`)."""
        self._sockets = sockets
        self._protocol = protocol
        self._backlog = backlog
        self._loop = loop
        self._room = room
        self._tasks = OwnedTasks()
        self._connecting = 0  # accepted, their connections not made yet
        self._paused = False
        self._closed = False
        self._backoff: asyncio.TimerHandle | None = None
        self._watched = False

    def start(self) -> None:
        for sock in self._sockets:
            sock.listen(self._backlog)
            sock.setblocking(False)
        self._sync()

    def pause(self) -> None:
        self._paused = True
        self._sync()

    def resume(self) -> None:
        self._paused = False
        self._sync()

    async def close(self) -> None:
        """Stop accepting and close the listening sockets; what is connected stays."""
        self._closed = True
        self._sync()
        if self._backoff is not None:
            self._backoff.cancel()
        for sock in self._sockets:
            sock.close()
        await self._tasks.close()

    def _sync(self) -> None:
        want = not (self._paused or self._closed or self._backoff is not None)
        if want == self._watched:
            return
        self._watched = want
        for sock in self._sockets:
            if want:
                self._loop.add_reader(sock.fileno(), self._ready, sock)
            else:
                self._loop.remove_reader(sock.fileno())

    def _ready(self, sock: socket.socket) -> None:
        for _ in range(max(MIN_BATCH, self._room() - self._connecting)):
            if not self._watched:  # paused by the connection just set up, or closed
                return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # reset by the client before the accept
                continue
            except OSError as exc:
                if exc.errno not in _OUT_OF_FILES:
                    raise
                logger.error(
                    "cannot accept connections: %s; retrying in %g s (see the connection cap "
                    "in GET /status and the file limit, ulimit -n)",
                    exc.strerror, FULL_BACKOFF_S,
                )  # fmt: skip
                self._backoff = self._loop.call_later(FULL_BACKOFF_S, self._backed_off)
                self._sync()
                return
            conn.setblocking(False)
            if conn.family in (socket.AF_INET, socket.AF_INET6):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._connecting += 1
            self._tasks.spawn(self._connect(conn), name="accept")

    def _backed_off(self) -> None:
        self._backoff = None
        self._sync()

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._protocol, conn)
        except asyncio.CancelledError:  # the server is closing
            conn.close()
            raise
        except Exception:  # gone before its transport was made
            logger.debug("an accepted connection failed to start", exc_info=True)
            conn.close()
        finally:
            self._connecting -= 1


class GatewayServer(uvicorn.Server):
    """uvicorn's server on sockets bound beforehand (`serve`), accepted by an `Acceptor`
    the connection cap (`slots`) can pause."""

    def __init__(self, config: uvicorn.Config, sockets: list[socket.socket], slots: Slots) -> None:
        super().__init__(config)
        self._listening = sockets
        self._slots = slots
        self.acceptor: Acceptor | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=[])  # the lifespan; no listener of uvicorn's
        if not self.started:
            return
        gc.set_threshold(*GC_THRESHOLDS)
        loop = asyncio.get_running_loop()
        config = self.config

        def protocol() -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config,
                server_state=self.server_state,
                app_state=self.lifespan.state,
                _loop=loop,
            )

        self.acceptor = Acceptor(
            self._listening, protocol, backlog=config.backlog, loop=loop, room=self._slots.room
        )
        self._slots.acceptor = self.acceptor
        self.acceptor.start()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.acceptor is not None:
            self._slots.acceptor = None
            await self.acceptor.close()
        await super().shutdown()
