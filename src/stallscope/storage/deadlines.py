"""A store's errors and deadlines: the one-line `StorageError`, the storage timeout every request is
made with, and calls given up when a store stops answering (`with_deadline`, `with_silence_limit`).

The bottom of the client side: paths and listings (`paths`), the stores' clients and `location` build
on it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TypeVar

from stallscope.errors import UsageError

DEFAULT_TIMEOUT_S = 30.0

T = TypeVar("T")


class StorageError(UsageError):
    """A store cannot be reached or refuses: one line naming the location and what was expected."""


_settings: dict = {"timeout_s": DEFAULT_TIMEOUT_S, "abandoned": False}

# How each client words a connection nothing accepted: the OS's, obstore's debug dump, libcurl's (TF's gs://).
_REFUSED = ("connection refused", "connectionrefused", "errno 111")


def refused_connection(exc: BaseException | str) -> bool:
    """True where the store's host refused the connection (nothing listens at the endpoint: a store
    that was stopped or killed, a wrong port). A longer timeout cannot help there, so the line says
    so instead of "did not answer". `exc` or any exception it was raised from counts."""
    seen: set[int] = set()
    current: BaseException | str | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionRefusedError) or any(word in str(current).lower() for word in _REFUSED):
            return True
        current = None if isinstance(current, str) else (current.__cause__ or current.__context__)
    return False


def refused(what: object, endpoint: str, who: str = "store") -> StorageError:
    """The one line for a store (or the proxy in front of it: `who`) whose endpoint refused the connection."""
    return StorageError(f"{what}: the {who} at {endpoint} refused the connection (nothing listens there: a {who} "
                        f"that was stopped, or a wrong address); expected a running {who} at that address")


def set_storage_timeout(seconds: float) -> None:
    """The connect and read timeout for store requests made from now on (`location.set_timeout` also
    drops the clients made with the old one)."""
    if not seconds > 0:
        raise UsageError(f"--storage-timeout: expected a number of seconds above 0, got {seconds!r}")
    _settings["timeout_s"] = float(seconds)


def storage_timeout() -> float:
    return _settings["timeout_s"]


def abandoned_requests() -> bool:
    """True once a request was given up by `with_deadline`: its thread still waits inside the store's
    client, and a normal interpreter exit would tear TF's C++ down under it (an abort). The CLI then
    ends the process with `os._exit` after printing its line."""
    return bool(_settings.get("abandoned"))


def no_answer(what: object, seconds: float) -> StorageError:
    """The one line for a request the store did not answer in time."""
    return StorageError(f"{what}: the store did not answer within {seconds:.0f} s (--storage-timeout); "
                        "expected a store that answers")


def with_deadline(fn: Callable[[], T], seconds: float, what: str) -> T:
    """`fn()`, or a StorageError when it has not returned within `seconds` (it runs on in a daemon
    thread; see `abandoned_requests`)."""
    return with_silence_limit(lambda heard: fn(), seconds, what)


def with_silence_limit(fn: Callable[[Callable[[], None]], T], seconds: float, what: str,
                       probe: Callable[[], object] | None = None) -> T:
    """`fn(heard)`, or a StorageError once `seconds` pass without `fn` calling `heard()` (it runs on in a
    daemon thread; see `abandoned_requests`). A listing calls it for each answer: ImageNet train's
    listing takes minutes of answers, each within the timeout, and only a store that stops answering
    is silent (a limit on the whole listing failed it past 35 s).

    One answer can take longer than the limit: a folder of half a million objects is a thousand
    pages inside one call. So once `fn` has heard one answer, a silence asks `probe()`, a request of
    its own: a store that answers it within `seconds` is not silent, and the wait goes on (a request
    that stalls inside `fn` still ends at its client's own timeout)."""
    box: dict[str, object] = {}
    last_heard = [time.monotonic()]
    answers = [0]

    def heard() -> None:
        last_heard[0] = time.monotonic()
        answers[0] += 1

    def call() -> None:
        try:
            box["value"] = fn(heard)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=call, name="storage-deadline", daemon=True)
    thread.start()
    while True:
        thread.join(max(0.0, last_heard[0] + seconds - time.monotonic()))
        if not thread.is_alive():
            break
        if time.monotonic() - last_heard[0] >= seconds:
            if probe is not None and answers[0] and _answers(probe, seconds):
                last_heard[0] = time.monotonic()
                continue
            _settings["abandoned"] = True
            raise no_answer(what, seconds)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _answers(probe: Callable[[], object], seconds: float) -> bool:
    """Whether `probe()` returns within `seconds` (an answer, whatever it says)."""
    done = threading.Event()

    def ask() -> None:
        try:
            probe()
            done.set()
        except Exception:  # noqa: BLE001 - refused or unreachable: no answer
            pass

    threading.Thread(target=ask, name="storage-probe", daemon=True).start()
    return done.wait(seconds)


def deadline() -> float:
    """How long a listing may go without an answer before the store is called silent: the timeout
    plus a margin for the client's own connect/read timeouts to report first."""
    return storage_timeout() + 5.0


def short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
