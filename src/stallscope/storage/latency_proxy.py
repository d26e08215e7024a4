"""A loopback TCP proxy that makes a local store behave like a distant one.

The kernel here has no `netem`, so delay is added in user space: every burst a client sends (a
request, a TLS handshake message, a CONNECT) is held for the latency before it goes on, the way a
round trip delays it; bytes in either direction share a bandwidth cap per direction. Connections run
in their own threads, so requests in flight overlap their waits, as they do on a real network.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from stallscope.storage.http_base import IDLE_TIMEOUT_S, LOOPBACK

log = logging.getLogger(__name__)

CHUNK = 1 << 16


class Throttle:
    """A shared link of `bits_per_s`: each chunk is sent when the link has carried those before it."""

    def __init__(self, bits_per_s: float) -> None:
        self.bytes_per_s = bits_per_s / 8.0
        self._free_at = 0.0
        self._lock = threading.Lock()

    def wait(self, size: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._free_at = max(now, self._free_at) + size / self.bytes_per_s
            done = self._free_at
        delay = done - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class LatencyProxy:
    """Listens on 127.0.0.1:`port` (0: a free one) and relays to 127.0.0.1:`upstream_port`."""

    def __init__(self, port: int, upstream_port: int, *, latency_s: float = 0.0,
                 bandwidth_bps: float | None = None) -> None:
        self.upstream_port = upstream_port
        self.latency_s = max(0.0, float(latency_s))
        self._up = Throttle(bandwidth_bps) if bandwidth_bps else None
        self._down = Throttle(bandwidth_bps) if bandwidth_bps else None
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.bind((LOOPBACK, port))
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self.port = self._listener.getsockname()[1]
        self._stopped = threading.Event()

    def serve_forever(self) -> None:
        self._listener.settimeout(0.5)
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                break
            threading.Thread(target=self._relay, args=(client,), daemon=True, name="latency-proxy").start()

    def shutdown(self) -> None:
        self._stopped.set()
        self._listener.close()

    def _relay(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((LOOPBACK, self.upstream_port), timeout=IDLE_TIMEOUT_S)
        except OSError:
            client.close()
            return
        for end in (client, upstream):
            end.settimeout(IDLE_TIMEOUT_S)
            end.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        answered = threading.Event()  # the store sent something since the client's last burst
        answered.set()
        back = threading.Thread(target=self._pump_back, args=(upstream, client, answered), daemon=True)
        back.start()
        try:
            while True:
                data = client.recv(CHUNK)
                if not data:
                    upstream.shutdown(socket.SHUT_WR)
                    break
                if answered.is_set():  # a new request burst: it pays one round trip
                    answered.clear()
                    if self.latency_s:
                        time.sleep(self.latency_s)
                if self._up:
                    self._up.wait(len(data))
                upstream.sendall(data)
        except OSError:
            pass
        back.join(IDLE_TIMEOUT_S)
        client.close()
        upstream.close()

    def _pump_back(self, upstream: socket.socket, client: socket.socket, answered: threading.Event) -> None:
        try:
            while True:
                data = upstream.recv(CHUNK)
                if not data:
                    client.shutdown(socket.SHUT_WR)
                    return
                answered.set()
                if self._down:
                    self._down.wait(len(data))
                client.sendall(data)
        except OSError:
            try:
                client.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
