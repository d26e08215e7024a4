"""An HTTP/1.1 loopback server on one asyncio event loop, answering with http.server-style handlers
(`http_handler.CountingHandler`): the emulated S3 and GCS stores. A CONNECT tunnel's handler may turn
the connection into a TLS server's (`start_tls`), as the GCS store does for TF's `gs://` client.

Why: the emulated store shares the cores with the training it serves, so its CPU per request is part of
what every emulated run measures. With 128 GETs in flight (the `tuned` pipeline on JPEGs in s3://), a
thread per connection spent about half of the store's 0.4-0.5 ms of CPU per 75 KB GET in the kernel,
switching among those threads and handing the GIL between them. Here every connection is a protocol
object on one loop: a request's latency is a timer, not a sleeping thread, and headers are parsed
without `email`'s parser.

Each request is read whole (headers, then its body by Content-Length or chunked framing), waits out the
latency counted from when its headers arrived, and is then answered by a handler object that does not
know it runs here: its `rfile` is the body, its `wfile` collects the response head, and a body given to
`send_body` goes out as fast as the peer takes it: up to 256 KB in one send with the head, a larger
part of a file by `os.sendfile` (over TLS, in 128 KB pieces through the transport).

Measured with `python benchmarks/s3_reader.py --latency 10 --repeats 3` on 2 cores, the store's CPU per
75 KB GET with 16 obstore GETs in flight went from 0.38 ms (a thread per connection) to 0.14-0.17 ms, and
with 128 in flight (`--in-flight 128`) from 0.40 to 0.11 ms; per MiB of 16 MB blocks it is as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import io
import logging
import socket
import ssl
import threading
from typing import Iterator

from stallscope.storage.emulator.counters import SharedCounters
from stallscope.storage.emulator.http_handler import IDLE_TIMEOUT_S, CountingHandler, listening_socket
from stallscope.storage.emulator.folder_bucket import FileRange

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024  # request line and headers; larger is refused (431), as a real store would
JOINED_BODY_BYTES = 256 * 1024  # a body up to this size goes out in the same send as its headers
SEND_PIECE_BYTES = 128 * 1024  # larger bodies go to the transport in pieces this size
WRITE_BUFFER_BYTES = 1 << 20  # a body waits for the peer once this much is queued (asyncio's default: 64 KB)
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


class RequestError(Exception):
    """A request this server cannot read: answered with `status` and the connection closed."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class Headers(dict):
    """Request headers by lower-cased name (the last of repeated ones); `get` ignores case, as
    `http.client.HTTPMessage.get` does for the handlers."""

    def get(self, name: str, default=None):  # noqa: D102 - dict's
        return super().get(name.lower(), default)

    def __getitem__(self, name: str):
        return super().get(name.lower())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(name.lower())


class Request:
    """One request as far as it has arrived: its head parsed, its body still coming in."""

    __slots__ = ("command", "path", "version", "requestline", "headers", "chunked", "length", "expects_continue",
                 "ready_at", "chunk_spans", "arrived_at")

    def __init__(self, head: bytes, ready_at: float) -> None:
        lines = head.decode("latin-1").split("\r\n")
        self.requestline = lines[0]
        words = self.requestline.split()
        if len(words) != 3 or not words[2].startswith("HTTP/1."):
            raise RequestError(400, f"Bad request line {self.requestline[:100]!r}")
        self.command, self.path, self.version = words
        self.headers = Headers()
        for line in lines[1:]:
            name, colon, value = line.partition(":")
            if not colon or not name or name != name.strip():
                raise RequestError(400, f"Bad header line {line[:100]!r}")
            self.headers[name.lower()] = value.strip()
        self.chunked = "chunked" in self.headers.get("transfer-encoding", "").lower()
        try:
            self.length = 0 if self.chunked else int(self.headers.get("content-length") or 0)
        except ValueError:
            raise RequestError(400, "Bad Content-Length") from None
        if self.length < 0:
            raise RequestError(400, "Bad Content-Length")
        self.expects_continue = (self.version != "HTTP/1.0"
                                 and self.headers.get("expect", "").lower() == "100-continue")
        self.ready_at = ready_at
        self.arrived_at = ready_at  # set by the connection: when its head was in
        self.chunk_spans: list[tuple[int, int]] = []  # a chunked body's data, once it has all arrived

    def keeps_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"

    def body_end(self, buffer: bytearray, start: int) -> int | None:
        """Where this request's body ends in `buffer` (it starts at `start`); None while it is still coming."""
        if not self.chunked:
            end = start + self.length
            return end if len(buffer) >= end else None
        found = chunked_spans(buffer, start)
        if found is None:
            return None
        self.chunk_spans, end = found
        return end

    def body(self, raw: bytes) -> bytes:
        """The body as the handler reads it (`raw`: its bytes as they came, up to `body_end`): a chunked
        body's data joined, its framing and trailers left out."""
        if not self.chunked:
            return raw
        return b"".join(raw[start:end] for start, end in self.chunk_spans)


def chunked_spans(buffer: bytearray, at: int) -> tuple[list[tuple[int, int]], int] | None:
    """A chunked body starting at `at`: where each chunk's data lies in `buffer` (start, end), and where
    the body ends (its last chunk and trailers included); None if it has not all arrived. Malformed
    framing is a RequestError."""
    spans = []
    while True:
        line_end = buffer.find(b"\r\n", at)
        if line_end < 0:
            return None
        try:
            size = int(bytes(buffer[at:line_end]).split(b";")[0].strip() or b"0", 16)
        except ValueError:
            raise RequestError(400, "Bad chunk size") from None
        at = line_end + 2
        if size == 0:
            while True:  # trailers, up to the empty line
                line_end = buffer.find(b"\r\n", at)
                if line_end < 0:
                    return None
                if line_end == at:
                    return spans, at + 2
                at = line_end + 2
        spans.append((at, at + size))
        at += size + 2
        if len(buffer) < at:
            return None


class Connection(asyncio.Protocol):
    """One client connection: reads requests in order, holds each for the latency, answers it."""

    def __init__(self, server: "EventLoopServer") -> None:
        self.server = server
        self.loop = server.loop
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.peer = ("", 0)
        self.request: Request | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.body: Iterator[bytes] | None = None  # a response body still being sent
        self.piece = memoryview(b"")  # what is left of the body chunk being sent
        self.close_after = False
        self.paused = False
        self.reading_paused = False
        self.sending_file = False
        self.refused = False  # answered with an error and half-closed: the rest is dropped
        self.last_activity = self.loop.time()
        self.idle_timer: asyncio.TimerHandle | None = None
        self.over_tls = server.tls is not None
        self.upgrading = False  # a TLS handshake after CONNECT is under way: no request is read
        self.handshake_wait = 0.0  # the handshake's round trip, charged to the first request after it
        self.answering_since: float | None = None  # the answered request's arrival, until its last byte is handed over

    # ----- asyncio's callbacks
    def connection_made(self, transport) -> None:
        self.transport = transport
        raw = transport.get_extra_info("socket")
        if raw is not None:
            with contextlib.suppress(OSError):
                raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.peer = transport.get_extra_info("peername") or ("", 0)
        transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
        self.server.counters.add(connections=1)
        self.server.connections.add(self)
        self.idle_timer = self.loop.call_later(IDLE_TIMEOUT_S, self._check_idle)

    def connection_lost(self, exc) -> None:
        self.server.connections.discard(self)
        for timer in (self.timer, self.idle_timer):
            if timer is not None:
                timer.cancel()
        self._drop_body()
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.last_activity = self.loop.time()
        if self.refused:
            return
        self.buffer += data
        if self.body is None and self.timer is None:
            self._advance()
        if (self.transport is not None and not self.reading_paused and len(self.buffer) > (1 << 20)
                and (self.body is not None or self.timer is not None)):
            self.transport.pause_reading()  # pipelined requests wait for this answer: TCP holds the rest
            self.reading_paused = True

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if not self.sending_file and self._pump():
            self._advance()

    # ----- reading requests
    def _advance(self) -> None:
        """Moves this connection on as far as the bytes in hand and the clock allow."""
        while (self.transport is not None and not self.transport.is_closing() and not self.refused
               and self.body is None and self.timer is None and not self.upgrading):
            if self.reading_paused:
                self.transport.resume_reading()
                self.reading_paused = False
            try:
                if not self._take_request():
                    return
            except RequestError as refused:
                self._refuse(refused)
                return

    def _take_request(self) -> bool:
        """Answers the next request if it has all arrived and waited out its latency; False when
        there is nothing more to do until bytes arrive or a timer fires."""
        if self.request is None:
            while self.buffer.startswith(b"\r\n"):  # stray line ends between requests are allowed
                del self.buffer[:2]
            head_end = self.buffer.find(b"\r\n\r\n")
            if head_end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise RequestError(431, "Request header fields too large")
                return False
            ready_at = self.loop.time() + self.server.latency_s + self.handshake_wait
            self.request = Request(bytes(self.buffer[:head_end]), ready_at)
            self.request.arrived_at = self.loop.time()
            self.handshake_wait = 0.0
            del self.buffer[:head_end + 4]
        request = self.request
        now = self.loop.time()
        if request.expects_continue:
            if now < request.ready_at:
                return self._wait_until(request.ready_at)
            self.transport.write(_CONTINUE)  # the client sends the body now; it pays another round trip
            request.expects_continue = False
            request.ready_at = now + self.server.latency_s
        body_end = request.body_end(self.buffer, 0)
        if body_end is None:
            return False
        if now < request.ready_at:
            return self._wait_until(request.ready_at)
        raw = bytes(self.buffer[:body_end])
        del self.buffer[:body_end]
        self.request = None
        self._answer(request, request.body(raw))
        return True

    def _wait_until(self, moment: float) -> bool:
        self.timer = self.loop.call_at(moment, self._wake)
        return False

    def _wake(self) -> None:
        self.timer = None
        self._advance()

    def _check_idle(self) -> None:
        """No bytes for IDLE_TIMEOUT_S while waiting for a request: the connection is closed, as the
        threaded server's read timeout closes it. A request being held or answered is not idle."""
        if self.transport is None:
            return
        quiet_for = self.loop.time() - self.last_activity
        if (self.refused or self.body is None and self.timer is None) and quiet_for >= IDLE_TIMEOUT_S:
            self.transport.close()
            return
        self.idle_timer = self.loop.call_later(max(IDLE_TIMEOUT_S - quiet_for, 1.0), self._check_idle)

    # ----- answering
    def _answer(self, request: Request, raw_body: bytes) -> None:
        self.answering_since = request.arrived_at
        handler = self.server.handler_class.__new__(self.server.handler_class)
        handler.server = self.server
        handler.client_address = self.peer
        handler.command, handler.path, handler.request_version = request.command, request.path, request.version
        handler.requestline = request.requestline
        handler.headers = request.headers
        handler.close_connection = not request.keeps_alive()
        handler.rfile = io.BytesIO(raw_body)
        handler.wfile = io.BytesIO()
        handler.body = None
        handler.upgrade = None
        handler.over_tls = self.over_tls
        method = getattr(handler, "do_" + request.command, None)
        try:
            if method is None:
                handler.send_error(501, f"Unsupported method ({request.command!r})")
            else:
                method()
        except Exception:  # noqa: BLE001 - a handler's failure ends its connection, not the store
            log.debug("a request from %s failed", self.peer, exc_info=True)
            self.transport.close()
            return
        self.close_after = handler.close_connection
        head = handler.wfile.getvalue()
        if handler.upgrade is not None:
            self._start_tls(head, handler.upgrade)
            return
        if handler.body is None:
            self.transport.write(head)
            self._finish()
            return
        if (isinstance(handler.body, FileRange) and not self.over_tls
                and handler.body.last - handler.body.first >= JOINED_BODY_BYTES):
            self.transport.write(head)
            self.body = iter(())  # answering: the next request waits for the file to be sent
            self.loop.create_task(self._send_file(handler.body))
            return
        body = iter(handler.body)
        first = next(body, b"")
        self.body = body
        # Bytes are counted before they are handed over, as the threaded server counts them before its
        # buffered answer is flushed: a client that has read an answer sees it counted.
        self.server.counters.add(bytes=len(first))
        if len(first) <= JOINED_BODY_BYTES:
            self.transport.write(head + first)
            self.piece = memoryview(b"")
        else:
            self.transport.write(head)
            self.piece = memoryview(first)
        self._pump()

    def _start_tls(self, head: bytes, context: ssl.SSLContext) -> None:
        """Sends `head` (a CONNECT's 200), then makes this connection a TLS server's: the client's
        hello is read by the TLS layer, not taken for a request (reading waits until it is in place)."""
        self.answering_since = None  # a tunnel opened, not a request answered
        self.transport.pause_reading()
        self.transport.write(head)
        self.upgrading = True
        self.loop.create_task(self._upgrade(context))

    async def _upgrade(self, context: ssl.SSLContext) -> None:
        try:
            transport = await self.loop.start_tls(self.transport, self, context, server_side=True,
                                                  ssl_handshake_timeout=IDLE_TIMEOUT_S)
        except (OSError, ssl.SSLError, asyncio.TimeoutError, RuntimeError, AttributeError):
            log.debug("TLS with %s failed", self.peer, exc_info=True)  # a refused CA, a peer gone
            if self.transport is not None:
                self.transport.close()
            return
        finally:
            self.upgrading = False
        if self.transport is None:  # the peer left during the handshake
            return
        self.transport = transport
        self.over_tls = True
        # The handshake's flight (ClientHello to ServerHello) is a round trip the client waits for,
        # as a relay holding each burst makes it: charged to the tunnel's first request.
        self.handshake_wait = self.server.latency_s
        self._advance()

    async def _send_file(self, part: FileRange) -> None:
        """A large part of a file goes from the page cache to the socket in the kernel (os.sendfile):
        no copy through Python, no 128 KB pieces handed to the transport one by one."""
        self.sending_file = True
        size = part.last - part.first + 1
        self.server.counters.add(bytes=size)  # before it is sent (see `_answer`)
        try:
            with open(part.path, "rb") as handle:
                await self.loop.sendfile(self.transport, handle, part.first, size)
        except (OSError, RuntimeError, AttributeError):  # the peer left (the transport is gone), or a read failed
            log.debug("sending %s to %s failed", part.path, self.peer, exc_info=True)
            if self.transport is not None:
                self.transport.close()
            return
        finally:
            self.sending_file = False
        self.body = None
        self._finish()
        self._advance()

    def _pump(self) -> bool:
        """Sends what is left of a response body while the socket takes it, in pieces of at most
        SEND_PIECE_BYTES (what the transport cannot send at once it buffers, and trims from the front
        as it sends: a copy of what is left each time); True once the body is all sent."""
        if self.body is None:
            return True
        while not self.paused and self.transport is not None:
            if not self.piece:
                chunk = next(self.body, None)
                if chunk is None:
                    self.body = None
                    self._finish()
                    return True
                self.piece = memoryview(chunk)
                self.server.counters.add(bytes=len(chunk))
                continue
            self.transport.write(self.piece[:SEND_PIECE_BYTES])
            self.piece = self.piece[SEND_PIECE_BYTES:]
        return False

    def _finish(self) -> None:
        """The answer's last byte is handed over: its time at the store, from arrival, is counted."""
        if self.answering_since is not None:
            self.server.counters.observe(self.loop.time() - self.answering_since)
            self.answering_since = None
        if self.close_after and self.transport is not None:
            self.transport.close()

    def _drop_body(self) -> None:
        if self.body is not None:
            close = getattr(self.body, "close", None)
            if close is not None:
                close()  # a generator reading a file closes it
            self.body = None
        self.piece = memoryview(b"")

    def _refuse(self, refused: RequestError) -> None:
        reason = str(refused).encode("latin-1", "replace")
        phrase = http.HTTPStatus(refused.status).phrase.encode()
        self.transport.write(b"HTTP/1.1 %d %s\r\nConnection: close\r\nContent-Type: text/plain\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (refused.status, phrase, len(reason), reason))
        self.server.counters.add(requests=1, errors=1)
        self.request = None
        self.refused = True
        if self.transport.can_write_eof():
            # Lingering close: what the client still sends is read and dropped until it closes (or the
            # idle timeout), so the answer is not lost to a reset from unread bytes.
            self.transport.write_eof()
            self.buffer.clear()
        else:
            self.transport.close()


class EventLoopServer:
    """Binds 127.0.0.1 only; `port=0` takes a free port (see `.port`). `serve_forever` runs the loop in
    the calling thread until `shutdown` (from another thread); `server_close` releases the port.
    `latency_s`: how long each request waits, from when its headers are in, before it is answered: the
    one round trip a request pays on a kept-alive connection (two for an upload that waits for
    '100 Continue'). `tls`: a server-side context to serve HTTPS."""

    def __init__(self, port: int, handler: type[CountingHandler], counters: SharedCounters, *,
                 latency_s: float = 0.0, tls: ssl.SSLContext | None = None) -> None:
        self.counters = counters
        self.latency_s = latency_s
        self.tls = tls
        self.handler_class = handler
        self.connections: set[Connection] = set()
        self.socket = listening_socket(port)  # a taken port fails; one in TIME-WAIT only does not
        try:
            self.loop = asyncio.new_event_loop()
            self._listener = self.loop.run_until_complete(self.loop.create_server(
                lambda: Connection(self), sock=self.socket, ssl=tls,
                ssl_handshake_timeout=IDLE_TIMEOUT_S if tls is not None else None))
        except BaseException:
            self.socket.close()
            raise
        self._started = False
        self._done = threading.Event()
        self._lock = threading.Lock()

    @property
    def port(self) -> int:
        return self.socket.getsockname()[1]

    def serve_forever(self) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self._started = True
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self._close_all()
            self._done.set()

    def shutdown(self) -> None:
        """Stops the loop (from any thread) and waits, bounded, until it has closed everything."""
        with self._lock:
            started = self._started
            if not started:
                self._done.set()
        if started and not self.loop.is_closed():
            with contextlib.suppress(RuntimeError):  # already closed: nothing to stop
                self.loop.call_soon_threadsafe(self.loop.stop)
            self._done.wait(10.0)

    def server_close(self) -> None:
        with self._lock:
            never_served = not self._started
        if never_served and not self.loop.is_closed():
            self._close_all()

    def _close_all(self) -> None:
        self._listener.close()
        for connection in list(self.connections):
            if connection.transport is not None:
                connection.transport.abort()
        self.loop.run_until_complete(asyncio.sleep(0))  # the aborted connections' callbacks run
        self.loop.close()
        self.socket.close()
