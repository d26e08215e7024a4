"""A lease on a bucket prefix, so two conversions do not publish into it at once.

A bucket has no `flock`, and TF's gs:// offers no conditional create, so this is a lease: the holder
writes `.stallscope-convert/lock.json` (host, PID and the PID's start time, command, heartbeat) before
any work (which also proves the prefix takes writes before hours of converting), rewrites its
heartbeat every HEARTBEAT_S and deletes it at the end. Another run refuses while the heartbeat is
younger than LEASE_S, unless the holder is a dead process on this same host (its PID free, or another
process's now: the start time differs). Two runs that both find the prefix free both write the lease,
and the store keeps the last write: so each reads it back SETTLE_S later, and the one whose write was
overwritten refuses, leaving the lease to the other. Only runs whose look and write are SETTLE_S or
more apart could both hold it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator

from stallscope.lifetime import start_time, still_running
from stallscope.records.completeness import STATE_DIR
from stallscope.records.lock import LockedError
from stallscope.storage import location
from stallscope.storage.location import RemotePath, StorageError

log = logging.getLogger(__name__)

LOCK_OBJECT = "lock.json"
HEARTBEAT_S = 60.0
LEASE_S = 600.0  # a holder silent this long is taken for dead (its host lost, say)
SETTLE_S = 1.0  # from writing the lease to reading it back: longer than one look-and-write


def _alive_here(holder: dict) -> bool:
    if holder.get("host") != socket.gethostname():
        return True  # another host's process: only its heartbeat tells
    try:
        pid = int(holder.get("pid", 0))
        started = holder.get("process_started")
        started = None if started is None else float(started)  # None: a lease written before it was recorded
    except (TypeError, ValueError):
        return False
    return pid > 0 and still_running(pid, started)


def _held_by_other(lock: RemotePath) -> dict | None:
    if not lock.is_file():
        return None
    try:
        holder = json.loads(lock.read_bytes())
        age = time.time() - float(holder["heartbeat"])
    except (ValueError, KeyError, TypeError):
        return None  # unreadable: no one can be vouched for
    if age > LEASE_S or not _alive_here(holder):
        log.info("%s: taking over a lease left by PID %s on %s (%.0f s old)", lock, holder.get("pid"),
                 holder.get("host"), age)
        return None
    return {**holder, "age": age}


def _settle(seconds: float) -> None:
    time.sleep(seconds)


class Lease:
    """A held lease. `confirm()` reads it back from the store (not from a listing) and raises
    LockedError naming the run that holds it now, if another does: a run whose write replaced ours at
    the start, or one that took it over while this run was silent past LEASE_S."""

    def __init__(self, out: RemotePath, lock: RemotePath, me: dict) -> None:
        self.out, self.lock, self.me = out, lock, me
        self.lost_to: dict | None = None

    def beat(self) -> None:
        location.write_bytes(self.lock, json.dumps({**self.me, "heartbeat": time.time()}).encode())

    def _holder(self) -> dict:
        try:
            return json.loads(location.backend(self.lock).read(self.lock))
        except ValueError:
            return {}

    def _mine(self, holder: dict) -> bool:
        return all(holder.get(key) == self.me[key] for key in ("host", "pid", "started"))

    def confirm(self) -> None:
        holder = self.lost_to or self._holder()
        if self._mine(holder):
            return
        self.lost_to = holder
        raise LockedError(
            f"--output_path: another `stallscope convert` into {self.out} holds the lease now (PID "
            f"{holder.get('pid')} on {holder.get('host')}); this run writes nothing more there; wait for it "
            f"to finish, or delete {self.lock} if it is gone")

    def renew(self) -> None:
        """The heartbeat: rewrites the lease while it is ours; never overwrites another run's."""
        if self.lost_to is not None:
            return
        holder = self._holder()
        if not self._mine(holder):
            self.lost_to = holder
            log.error("%s: the lease was taken by PID %s on %s; this run will publish nothing more", self.out,
                      holder.get("pid"), holder.get("host"))
            return
        self.beat()

    def release(self) -> None:
        """Deletes the lease if it is still ours (a Beam run's clean-up may have taken it with the rest
        of the state; another run's is left alone)."""
        if self.lost_to is None and self.lock.is_file() and self._mine(self._holder()):
            location.delete(self.lock)


@contextlib.contextmanager
def bucket_lease(out: RemotePath, command: str, *, heartbeat_s: float = HEARTBEAT_S) -> Iterator[Lease]:
    """Holds the lease on `out` for the block; raises LockedError naming the holder when another
    run holds it, and StorageError when the prefix takes no writes. Publishing code calls the
    yielded lease's `confirm()` before each step that another run's publishing would clash with."""
    lock = out / STATE_DIR / LOCK_OBJECT
    holder = _held_by_other(lock)
    if holder is not None:
        raise LockedError(
            f"--output_path: another `stallscope convert` into {out} is running (PID {holder.get('pid')} on "
            f"{holder.get('host')}, heartbeat {holder['age']:.0f} s ago, lease {LEASE_S:.0f} s); wait for it to "
            f"finish, or delete {lock} if it is gone")
    lease = Lease(out, lock, {"host": socket.gethostname(), "pid": os.getpid(),
                              "process_started": start_time(os.getpid()), "command": command,
                              "started": time.time()})
    lease.beat()
    _settle(SETTLE_S)
    lease.confirm()  # two runs that found the prefix free at once: the later write holds it
    stop = threading.Event()

    def keep_beating() -> None:
        while not stop.wait(heartbeat_s):
            try:
                lease.renew()
            except StorageError as exc:  # the next beat may get through; the lease is long
                log.warning("could not renew the lease on %s: %s", out, exc)

    thread = threading.Thread(target=keep_beating, daemon=True, name="bucket-lease")
    thread.start()
    try:
        yield lease
    finally:
        stop.set()
        thread.join(timeout=heartbeat_s + 30)
        try:
            lease.release()
        except StorageError as exc:
            log.warning("could not remove the lease %s (it expires in %.0f s): %s", lock, LEASE_S, exc)
