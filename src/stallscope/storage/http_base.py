"""The loopback HTTP server the GCS store builds on (one thread per connection, keep-alive, every idle
connection timed out, counters for connections, requests and bytes, optionally a latency each request
waits before it is answered), and the request handler both stores answer with. The S3 store answers
with the same handler on one event loop instead (`event_loop_http`)."""

from __future__ import annotations

import abc
import http.server
import logging
import socket
import socketserver
import time
from typing import Iterable

from stallscope.storage.counters import SharedCounters

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
IDLE_TIMEOUT_S = 30.0


class LoopbackServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """Binds 127.0.0.1 only. `port=0` takes a free port (see `.port`). `latency_s`: how long each
    request's thread waits, once its request line and headers are in, before it is answered: the one
    round trip a request pays on a kept-alive connection, without a relay (see `serving`)."""

    daemon_threads = True
    allow_reuse_address = False  # a second server on a taken port must fail, not share it
    request_queue_size = 128

    def __init__(self, port: int, handler: type, counters: SharedCounters, *, latency_s: float = 0.0) -> None:
        self.counters = counters
        self.latency_s = latency_s
        super().__init__((LOOPBACK, port), handler)

    @property
    def port(self) -> int:
        return self.server_address[1]

    def process_request(self, request, client_address) -> None:
        self.counters.add(connections=1)
        request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().process_request(request, client_address)

    def handle_error(self, request, client_address) -> None:  # a reader that hangs up is not news
        log.debug("connection from %s ended with an error", client_address, exc_info=True)


class CountingHandler(http.server.BaseHTTPRequestHandler, metaclass=abc.ABCMeta):
    """HTTP/1.1 with keep-alive; `send_body` and `send_error_body` count what they send."""

    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S
    # Responses are buffered and sent once complete (http.server flushes after each request): a JPEG's
    # headers and body in one send instead of two, each of which is a GIL hand-off among the connections.
    wbufsize = 256 * 1024
    server: LoopbackServer
    server_version = "stallscope-storage"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version

    def parse_request(self) -> bool:
        """The request is in: it waits out the server's latency (its thread sleeps; no CPU)."""
        parsed = super().parse_request()
        if parsed and self.server.latency_s:
            time.sleep(self.server.latency_s)
        return parsed

    def handle_expect_100(self) -> bool:
        """The interim '100 Continue' goes out now: the client waits for it before sending the body.
        With a latency, the headers' round trip is waited out first, and the body's after it (in
        `parse_request`): two, as a relay holding each burst would make it."""
        if self.server.latency_s:
            time.sleep(self.server.latency_s)
        answer = super().handle_expect_100()
        self.wfile.flush()
        return answer

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's name
        if log.isEnabledFor(logging.DEBUG):  # every request is logged: format only when it is kept
            log.debug("%s %s", self.address_string(), format % args)

    # Reads only: GET and HEAD share the store's `_answer`, HEAD without the body.
    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(head_only=False)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(head_only=True)

    @abc.abstractmethod
    def _answer(self, *, head_only: bool) -> None:
        """Answers a GET (or a HEAD, without the body): each store's own."""

    def count_request(self, *, lists: int = 0, errors: int = 0) -> None:
        self.server.counters.add(requests=1, lists=lists, errors=errors)

    def send_body(self, status: int, headers: dict[str, str], body: bytes | Iterable[bytes],
                  length: int, *, head_only: bool = False) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()
        if head_only:
            return
        self.send_chunks([body] if isinstance(body, (bytes, bytearray)) else body)

    def send_chunks(self, chunks: Iterable[bytes]) -> None:
        """Writes a response body and counts its bytes (on an event loop, it is streamed instead)."""
        sent = 0
        for chunk in chunks:
            self.wfile.write(chunk)
            sent += len(chunk)
        self.server.counters.add(bytes=sent)

    def read_body(self, limit: int = 1 << 30) -> bytes:
        """The request's body, sent with a Content-Length or chunked; at most `limit` bytes kept."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            pieces, kept = [], 0
            while True:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(pieces)
                chunk = self.rfile.read(size)
                self.rfile.readline(16)
                if kept < limit:
                    pieces.append(chunk[: limit - kept])
                    kept += len(pieces[-1])
        length = int(self.headers.get("Content-Length") or 0)
        pieces, kept = [], 0
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)
            if kept < limit:
                pieces.append(chunk[: limit - kept])
                kept += len(pieces[-1])
        return b"".join(pieces)

    def drain_body(self) -> None:
        """Reads and drops a request body, so the connection stays usable after a refused write."""
        self.read_body(limit=0)
