"""A loopback TCP proxy that makes a local store behave like a distant one.

The kernel here has no `netem`, so delay is added in user space: every burst a client sends (a
request, a TLS handshake message, a CONNECT) is held for the latency before it goes on, the way a
round trip delays it; bytes in either direction share a bandwidth cap per direction. Requests in flight
overlap their waits, as they do on a real network. It runs where it shapes what a server cannot: a
bandwidth cap, and the round trips of TF's gs:// TLS handshakes; an S3 store without a cap waits out
its latency on its own event loop (`http_loop`).

All connections run on one asyncio event loop, held bytes waiting on timers. The first design, a
thread per connection and direction, made the store's process spend 1.9 ms of CPU per GET at 10 ms with
16 obstore GETs of 75 KB JPEGs in flight (1.2-1.5 ms with no proxy), which on 2 cores capped what it
was meant to measure at ~490 GETs/s; on one event loop, 1.4 ms and ~615 GETs/s
(benchmarks/s3_reader.py --latency 10).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
import threading
import time

from stallscope.storage.emulator.http_handler import IDLE_TIMEOUT_S, LOOPBACK, listening_socket

log = logging.getLogger(__name__)

# Bytes a direction may hold (waiting out the latency or the bandwidth cap) before it stops reading its
# sender: the sender then waits on TCP's flow control, as it would on a slow link.
HELD_BYTES_LIMIT = 1 << 20


class Throttle:
    """A shared link of `bits_per_s`: each chunk is sent when the link has carried those before it."""

    def __init__(self, bits_per_s: float) -> None:
        self.bytes_per_s = bits_per_s / 8.0
        self._free_at = 0.0
        self._lock = threading.Lock()

    def reserve(self, size: int, start: float) -> float:
        """The monotonic time at which `size` bytes handed to the link at `start` have crossed it."""
        with self._lock:
            self._free_at = max(start, self._free_at) + size / self.bytes_per_s
            return self._free_at

    def wait(self, size: int) -> None:
        """Blocks this thread until `size` bytes handed over now have crossed the link."""
        delay = self.reserve(size, time.monotonic()) - time.monotonic()
        if delay > 0:
            time.sleep(delay)


class _Lane:
    """One direction of one relayed connection: chunks go out in order, none before its time."""

    def __init__(self, relay: _Relay, throttle: Throttle | None) -> None:
        self.relay = relay
        self.loop = relay.loop
        self.throttle = throttle
        self.source: asyncio.Transport | None = None  # paused while too much is held
        self.sink: asyncio.Transport | None = None
        self._held: collections.deque[tuple[float, bytes]] = collections.deque()
        self._held_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._ending = False
        self.ended = False
        self._sink_full = False

    def push(self, data: bytes, not_before: float) -> None:
        """Sends `data` at `not_before` (the event loop's clock, which is time.monotonic), or later: after
        what is held before it, and once the link has carried it."""
        at = not_before
        if self.throttle is not None:
            at = self.throttle.reserve(len(data), at)
        if self._held:
            at = max(at, self._held[-1][0])
        self._held.append((at, data))
        self._held_bytes += len(data)
        self._pause_source_if_full()
        if self._timer is None:
            self.release()

    @property
    def holding(self) -> bool:
        """Bytes wait here for their time (a slow link can hold them longer than the idle timeout)."""
        return bool(self._held)

    def end(self) -> None:
        """The sender is done: pass the end on once what is held has gone out."""
        self._ending = True
        if self._timer is None:
            self.release()

    def sink_full(self, full: bool) -> None:
        self._sink_full = full
        if full:
            self._pause_source_if_full()
        else:
            self._resume_source()

    def _pause_source_if_full(self) -> None:
        if self.source is not None and (self._sink_full or self._held_bytes > HELD_BYTES_LIMIT):
            self.source.pause_reading()

    def _resume_source(self) -> None:
        if self.source is not None and not self._sink_full and self._held_bytes <= HELD_BYTES_LIMIT \
                and not self.source.is_closing():
            self.source.resume_reading()

    def release(self) -> None:
        """Sends what is due; wakes again when the next held chunk is."""
        self._timer = None
        if self.sink is None or self.sink.is_closing():
            return
        now = self.loop.time()
        while self._held and self._held[0][0] <= now:
            _, data = self._held.popleft()
            self._held_bytes -= len(data)
            self.sink.write(data)
        if self._held:
            self._timer = self.loop.call_at(self._held[0][0], self.release)
            return
        self._resume_source()
        if self._ending and not self.ended:
            self.ended = True
            self.sink.write_eof()
            self.relay.lane_ended()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()
        self._held_bytes = 0


class _Relay:
    """One client connection and its connection to the store."""

    def __init__(self, proxy: LatencyProxy) -> None:
        self.proxy = proxy
        self.loop = proxy.loop
        self.up = _Lane(self, proxy.up_throttle)
        self.down = _Lane(self, proxy.down_throttle)
        self.answered = True  # the store sent something since the client's last burst
        self.last_active = self.loop.time()
        self.ends: list[asyncio.Transport] = []
        self.closed = False

    def attach(self, side: str, transport: asyncio.Transport) -> None:
        """`side` ('client' or 'store') is connected: the client's bytes wait until the store's is."""
        self.ends.append(transport)
        # asyncio sets TCP_NODELAY only on sockets made with proto=IPPROTO_TCP, which accepted ones are not;
        # without it a body shorter than one segment waits for the ack of its headers (40 ms on Linux).
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        feeds, fed = (self.up, self.down) if side == "client" else (self.down, self.up)
        feeds.source = transport
        fed.sink = transport
        if side == "client" and self.up.sink is None:
            transport.pause_reading()
        elif side == "store" and self.up.source is not None:
            self.up.source.resume_reading()
            self.up.release()

    def received(self, side: str, data: bytes) -> None:
        self.last_active = now = self.loop.time()
        if side == "store":
            self.answered = True
            self.down.push(data, now)
        elif self.answered:  # a new request burst: it pays one round trip
            self.answered = False
            self.up.push(data, now + self.proxy.latency_s)
        else:  # more of a burst: right after what is held of it
            self.up.push(data, now)

    def lane_ended(self) -> None:
        if self.up.ended and self.down.ended:
            self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.up.cancel()
        self.down.cancel()
        for end in self.ends:
            end.close()
        self.proxy.relays.discard(self)


class _End(asyncio.Protocol):
    """The protocol of one end of a relay: `side` is 'client' or 'store'."""

    def __init__(self, relay: _Relay, side: str) -> None:
        self.relay = relay
        self.side = side
        # The lane this end's bytes go into, and the lane that writes to this end.
        self.feeds, self.fed = (relay.up, relay.down) if side == "client" else (relay.down, relay.up)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.relay.closed:
            transport.close()
        else:
            self.relay.attach(self.side, transport)

    def data_received(self, data: bytes) -> None:
        self.relay.received(self.side, data)

    def eof_received(self) -> bool:
        self.feeds.end()
        return True  # the other direction stays open until it ends too

    def pause_writing(self) -> None:  # this end's send buffer is full: stop reading the other end
        self.fed.sink_full(True)

    def resume_writing(self) -> None:
        self.fed.sink_full(False)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay.close()


class LatencyProxy:
    """Listens on 127.0.0.1:`port` (0: a free one) and relays to 127.0.0.1:`upstream_port`."""

    def __init__(self, port: int, upstream_port: int, *, latency_s: float = 0.0,
                 bandwidth_bps: float | None = None) -> None:
        self.upstream_port = upstream_port
        self.latency_s = max(0.0, float(latency_s))
        self.up_throttle = Throttle(bandwidth_bps) if bandwidth_bps else None
        self.down_throttle = Throttle(bandwidth_bps) if bandwidth_bps else None
        self._listener = listening_socket(port)
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self.loop = asyncio.new_event_loop()
        self.relays: set[_Relay] = set()

    def serve_forever(self) -> None:
        """Relays until `shutdown()`; run it in a thread of its own."""
        loop = self.loop
        try:
            try:
                server = loop.run_until_complete(loop.create_server(self._accept, sock=self._listener))
            except RuntimeError:  # shut down before it was listening
                return
            loop.call_soon(self._drop_idle)
            loop.run_forever()
            server.close()
            for relay in list(self.relays):
                relay.close()
            loop.run_until_complete(asyncio.sleep(0))  # the transports' own closing callbacks
        finally:
            self._listener.close()
            loop.close()

    def shutdown(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.loop.stop)
        except RuntimeError:  # the loop has ended
            pass

    def _accept(self) -> asyncio.Protocol:
        relay = _Relay(self)
        self.relays.add(relay)
        self.loop.create_task(self._connect(relay))
        return _End(relay, "client")

    async def _connect(self, relay: _Relay) -> None:
        try:
            await asyncio.wait_for(
                self.loop.create_connection(lambda: _End(relay, "store"), LOOPBACK, self.upstream_port),
                IDLE_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError):
            log.debug("the store on port %d took no connection", self.upstream_port)
            relay.close()

    def _drop_idle(self) -> None:
        """Closes connections idle for IDLE_TIMEOUT_S, as the store does its own; not those still
        passing on bytes they hold."""
        cutoff = self.loop.time() - IDLE_TIMEOUT_S
        for relay in [r for r in self.relays if r.last_active < cutoff and not (r.up.holding or r.down.holding)]:
            relay.close()
        self.loop.call_later(min(5.0, IDLE_TIMEOUT_S / 2), self._drop_idle)
