"""Keeping a tf.data service server's port closed to other machines.

TensorFlow 2.21's dispatcher and worker take a port but no address: their gRPC server listens on
every interface (`*:PORT`, IPv4 and IPv6), with no authentication, and runs the dataset graphs it is
sent. gRPC sets SO_REUSEPORT on that socket, and Linux hands a connection to the listener bound to
the exact address it was made to before a wildcard one. So a listener of our own on PORT at each
address of this machine that should not serve (every non-loopback one but `--host`) takes the
connections made to it, and closes them unanswered; the gRPC server only ever sees connections made
to loopback (or to `--host`). What remains: the port still shows as `*:PORT` in `ss -ltn`; the
milliseconds between the server starting and the guard binding; and an address added to this
machine later is guarded on the next rescan (`RESCAN_S`).
"""

from __future__ import annotations

import ipaddress
import logging
import selectors
import socket
import threading

log = logging.getLogger(__name__)

RESCAN_S = 2.0
EVERY_INTERFACE = ("0.0.0.0", "::")


def machine_addresses() -> list[str]:
    """Every IPv4 and IPv6 address of this machine's interfaces (link-local ones with their %scope)."""
    import psutil

    found = []
    for entries in psutil.net_if_addrs().values():
        for entry in entries:
            if entry.family in (socket.AF_INET, socket.AF_INET6) and entry.address not in found:
                found.append(entry.address)
    return found


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%", 1)[0]).is_loopback


def other_addresses(host: str) -> list[str]:
    """The addresses of this machine a server meant for `host` must not answer on: all but loopback
    and `host` itself; none where `host` is every interface."""
    if host in EVERY_INTERFACE:
        return []
    return [a for a in machine_addresses() if not is_loopback(a) and a.split("%", 1)[0] != host]


class PortGuard:
    """Listens on `port` at each address `addresses()` names and closes every connection made there, on
    a daemon thread that rescans the addresses every `RESCAN_S`. `guarded` lists the addresses held."""

    def __init__(self, port: int, addresses=None, *, host: str = "127.0.0.1") -> None:
        self.port = port
        self._addresses = addresses if addresses is not None else (lambda: other_addresses(host))
        self._selector = selectors.DefaultSelector()
        self._sockets: dict[str, socket.socket] = {}
        self.unguarded: list[str] = []  # addresses that could not be taken (the server would answer there)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._wake, self._waker = socket.socketpair()  # stop() writes to it: the thread ends now, not on its next rescan
        self._selector.register(self._wake, selectors.EVENT_READ, data="wake")

    @property
    def guarded(self) -> list[str]:
        return sorted(self._sockets)

    def start(self) -> PortGuard:
        self._rescan()
        self._thread = threading.Thread(target=self._run, name=f"stallscope-service-port-guard-{self.port}",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._waker.send(b"x")
        except OSError:  # stopped already
            pass
        if self._thread is not None:
            self._thread.join(RESCAN_S + 1)
        for sock in self._sockets.values():
            sock.close()
        self._sockets.clear()
        self._selector.close()
        self._wake.close()
        self._waker.close()

    def _rescan(self) -> None:
        wanted = set(self._addresses())
        self.unguarded = []
        for address in sorted(wanted - set(self._sockets)):
            sock = _listen(address, self.port)
            if sock is None:
                self.unguarded.append(address)
                continue
            self._sockets[address] = sock
            self._selector.register(sock, selectors.EVENT_READ)
        for address in set(self._sockets) - wanted:  # an address this machine no longer has
            sock = self._sockets.pop(address)
            self._selector.unregister(sock)
            sock.close()

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=RESCAN_S):
                if key.data == "wake":
                    continue
                try:
                    conn, peer = key.fileobj.accept()
                except OSError:
                    continue
                conn.close()
                log.info("closed a connection from %s to a tf.data service port kept to this machine", peer[0])
            if not self._stop.is_set():
                self._rescan()


def _listen(address: str, port: int) -> socket.socket | None:
    """A listener on address:port beside gRPC's wildcard one (SO_REUSEPORT, as gRPC sets); None where
    the address cannot be taken (gRPC did not share the port, or the address went away)."""
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM,
                                                              flags=socket.AI_NUMERICHOST)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        log.info("cannot guard %s:%d: %s", address, port, exc)
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
        sock.listen(64)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        log.info("cannot guard %s:%d: %s", address, port, exc)
        return None
    return sock
