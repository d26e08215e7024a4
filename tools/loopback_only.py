"""Runs a command in a network namespace of its own, where loopback is the only network.

`make test` runs the suite this way where the machine allows it (root with CAP_SYS_ADMIN), so the
stores, proxies and servers the tests start are provably reachable from nowhere else and no test
can reach out. Where it is not allowed (an unprivileged container), the command runs as it is, and
this says so on stderr; the tests bind 127.0.0.1 only either way.

usage: python tools/loopback_only.py COMMAND [ARG ...]
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import sys

CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


def loopback_up() -> None:
    """A new namespace's `lo` is down; bring it up (as `ip link set lo up` does, without iproute2)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))


def enter_loopback_only_namespace() -> str | None:
    """Moves this process into a new network namespace with loopback up; the reason it could not, or None."""
    libc = ctypes.CDLL(None, use_errno=True)
    original = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        if libc.unshare(CLONE_NEWNET) != 0:
            return os.strerror(ctypes.get_errno())
        try:
            loopback_up()
        except OSError as exc:
            libc.setns(original, CLONE_NEWNET)  # back to the machine's network rather than none at all
            return f"loopback would not come up: {exc.strerror}"
        return None
    finally:
        os.close(original)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    why_not = enter_loopback_only_namespace()
    if why_not:
        print(f"loopback_only: no network namespace here ({why_not}); running with this machine's network",
              file=sys.stderr)
    os.execvp(argv[0], argv)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
