"""The S3 store's event-loop HTTP server at the socket: framing, order, flow control, refusals, idle
connections and shutdown, which the readers' own tests do not reach."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from stallscope.storage.emulator import http_loop
from stallscope.storage.emulator.counters import InProcessCounters
from stallscope.storage.emulator.folder_bucket import FolderBucket
from stallscope.storage.emulator.s3_server import S3Server

BUCKET = "data"


@pytest.fixture
def folder(tmp_path):
    root = tmp_path / "bucket"
    (root / "a").mkdir(parents=True)
    (root / "a" / "small.bin").write_bytes(b"small object")
    (root / "a" / "large.bin").write_bytes(bytes(range(256)) * (16 * 1024))  # 4 MiB
    return root


@pytest.fixture
def serve(folder):
    """Starts an S3Server on 127.0.0.1 in a thread; every one started is shut down at the end."""
    started = []

    def start(*, writable: bool = False, latency_s: float = 0.0) -> S3Server:
        server = S3Server(0, FolderBucket(folder, BUCKET, writable=writable), InProcessCounters(), latency_s=latency_s)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def connect(server: S3Server) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    return connection


def read_response(connection: socket.socket, pending: bytearray) -> tuple[int, dict[str, str], bytes]:
    """One response (status, headers, body) off the connection; `pending` keeps bytes read past it."""
    while b"\r\n\r\n" not in pending:
        chunk = connection.recv(65536)
        assert chunk, f"connection closed mid-head: {bytes(pending)[:200]!r}"
        pending += chunk
    head, _, rest = bytes(pending).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {name.lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        chunk = connection.recv(1 << 20)
        assert chunk, "connection closed mid-body"
        body += chunk
    pending[:] = body[length:]
    return status, headers, bytes(body[:length])


def test_pipelined_requests_are_answered_whole_and_in_order(serve, folder):
    server = serve()
    with connect(server) as connection:
        connection.sendall(b"GET /data/a/large.bin HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /data/a/small.bin HTTP/1.1\r\nHost: x\r\n\r\n"
                           b"GET /data/a/large.bin HTTP/1.1\r\nHost: x\r\nRange: bytes=1000-1999\r\n\r\n"
                           b"GET /data/a/missing HTTP/1.1\r\nHost: x\r\n\r\n")
        pending = bytearray()
        answers = [read_response(connection, pending) for _ in range(4)]
    large = (folder / "a" / "large.bin").read_bytes()
    assert [status for status, _, _ in answers] == [200, 200, 206, 404]
    assert answers[0][2] == large and answers[1][2] == b"small object" and answers[2][2] == large[1000:2000]
    assert b"NoSuchKey" in answers[3][2]
    counted = server.counters.snapshot()
    assert (counted.requests, counted.errors, counted.connections) == (4, 1, 1)
    assert counted.bytes == len(large) + len(b"small object") + 1000 + len(answers[3][2])


def test_a_slow_reader_gets_a_large_body_whole_while_other_connections_are_answered(serve, folder):
    """Flow control: a body the peer does not take yet waits in the server, which goes on serving."""
    server = serve()
    slow = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    slow.settimeout(10)
    slow.connect(("127.0.0.1", server.port))
    with slow:
        slow.sendall(b"GET /data/a/large.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)  # the server has filled what the socket takes and waits for the reader
        with connect(server) as other:
            other.sendall(b"GET /data/a/small.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_response(other, bytearray())[2] == b"small object"
        status, _, body = read_response(slow, bytearray())
    assert status == 200 and body == (folder / "a" / "large.bin").read_bytes()


def test_a_chunked_upload_is_read_by_its_framing(serve, folder):
    server = serve(writable=True)
    with connect(server) as connection:
        connection.sendall(b"PUT /data/up/chunked.txt HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: yes\r\n\r\n"
                           b"GET /data/up/chunked.txt HTTP/1.1\r\nHost: x\r\n\r\n")
        pending = bytearray()
        put, got = read_response(connection, pending), read_response(connection, pending)
    assert put[0] == 200 and got == (200, got[1], b"hello, world")
    assert (folder / "up" / "chunked.txt").read_bytes() == b"hello, world"


@pytest.mark.parametrize(("request_bytes", "status"), [
    (b"NONSENSE\r\n\r\n", 400),
    (b"GET /data/a/small.bin HTTP/1.1\r\nno colon here\r\n\r\n", 400),
    (b"PUT /data/a/x HTTP/1.1\r\nContent-Length: many\r\n\r\n", 400),
    (b"GET /data/a/small.bin HTTP/1.1\r\nX-Big: " + b"y" * (70 * 1024), 431),
])
def test_an_unreadable_request_is_refused_and_its_connection_closed(serve, request_bytes, status):
    server = serve()
    with connect(server) as connection:
        connection.sendall(request_bytes)
        pending = bytearray()
        answered, headers, _ = read_response(connection, pending)
        assert (answered, headers.get("connection")) == (status, "close")
        assert connection.recv(100) == b""  # closed by the server
    assert server.counters.snapshot().errors == 1


def test_an_unknown_method_is_501_as_http_server_answers_it(serve):
    server = serve()
    with connect(server) as connection:
        connection.sendall(b"BREW /data/a/small.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, _ = read_response(connection, bytearray())
        assert (status, headers.get("connection")) == (501, "close")
        assert connection.recv(100) == b""


def test_connection_close_and_http_1_0_end_the_connection_after_the_answer(serve):
    server = serve()
    for request in (b"GET /data/a/small.bin HTTP/1.1\r\nConnection: close\r\n\r\n",
                    b"GET /data/a/small.bin HTTP/1.0\r\n\r\n"):
        with connect(server) as connection:
            connection.sendall(request)
            pending = bytearray()
            assert read_response(connection, pending)[2] == b"small object"
            assert connection.recv(100) == b""


def test_an_idle_connection_is_closed_and_a_held_request_is_not_idle(serve, monkeypatch):
    monkeypatch.setattr(http_loop, "IDLE_TIMEOUT_S", 0.3)
    server = serve(latency_s=0.5)  # longer than the idle timeout: a request waiting out its latency
    with connect(server) as connection:
        connection.sendall(b"GET /data/a/small.bin HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(connection, bytearray())[2] == b"small object"
        began = time.monotonic()
        assert connection.recv(100) == b""  # nothing more sent: closed for idleness
        assert time.monotonic() - began < 5


def test_shutdown_ends_open_connections_and_frees_the_port(serve, folder):
    server = serve()
    connection = connect(server)
    connection.sendall(b"GET /data/a/small.bin HTTP/1.1\r\nHost: x\r\n\r\n")
    read_response(connection, bytearray())
    port = server.port
    server.shutdown()
    server.server_close()
    with connection:
        assert connection.recv(100) == b""
    with pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_a_server_never_started_shuts_down_at_once(folder):
    server = S3Server(0, FolderBucket(folder, BUCKET), InProcessCounters())
    began = time.monotonic()
    server.shutdown()
    server.server_close()
    assert time.monotonic() - began < 1
    assert server.socket.fileno() == -1  # the port is released
