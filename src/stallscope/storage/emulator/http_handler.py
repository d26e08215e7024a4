"""The request handler both emulated stores answer with (S3 and GCS dialects), on the event loop of
`http_loop`: http.server's request handler for its status lines and headers, with the bodies
counted (connections, requests and bytes feed the report)."""

from __future__ import annotations

import abc
import http.server
import logging
import socket
import ssl
import sys
from typing import Iterable

from stallscope.storage.emulator.folder_bucket import read_range

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
IDLE_TIMEOUT_S = 30.0


def listening_socket(port: int) -> socket.socket:
    """A TCP socket bound to 127.0.0.1:`port` and listening. SO_REUSEADDR lets a store stopped with
    clients connected start again on its port while their closed connections wait out TIME-WAIT (a
    minute); on Linux it never lets two sockets listen on one port, so a taken port still fails."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        if sys.platform != "win32":  # there it would share a port that is listening
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, port))
        listener.listen(128)
    except BaseException:
        listener.close()
        raise
    return listener


class CountingHandler(http.server.BaseHTTPRequestHandler, metaclass=abc.ABCMeta):
    """HTTP/1.1 with keep-alive; what `send_body` sends is counted. Its request is read whole by the
    event loop's connection, which then answers it and streams the body it was handed
    (`http_loop.Connection`). `over_tls`: the request came over TLS."""

    body: Iterable[bytes] | None
    upgrade: ssl.SSLContext | None
    over_tls: bool
    protocol_version = "HTTP/1.1"
    server_version = "stallscope-storage"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version

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

    def send_object(self, path, size: int, headers: dict, wanted: tuple[int, int] | None, *, head_only: bool) -> None:
        """An object's bytes as both stores answer a GET: whole (200), or the range asked for (206)."""
        self.count_request()
        if size == 0:
            return self.send_body(200, headers, b"", 0, head_only=head_only)
        first, last = wanted or (0, size - 1)
        if wanted:
            headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        self.send_body(206 if wanted else 200, headers, read_range(path, first, last), last - first + 1,
                       head_only=head_only)

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
        """Hands a response body to the connection, which sends and counts it as the peer takes it."""
        self.body = chunks

    def start_tls(self, context: ssl.SSLContext) -> None:
        """Once this answer (a CONNECT's 200) is sent, the connection speaks TLS as a server with `context`."""
        self.upgrade = context

    def read_body(self, limit: int = 1 << 30) -> bytes:
        """The request's body, sent with a Content-Length or chunked; at most `limit` bytes kept. The event
        loop hands it over whole, a chunked body's data already joined (`http_loop.Request.body`)."""
        pieces, kept = [], 0
        while True:
            chunk = self.rfile.read(1 << 16)
            if not chunk:
                break
            if kept < limit:
                pieces.append(chunk[: limit - kept])
                kept += len(pieces[-1])
        return b"".join(pieces)

    def drain_body(self) -> None:
        """Reads and drops a request body, so the connection stays usable after a refused write."""
        self.read_body(limit=0)
