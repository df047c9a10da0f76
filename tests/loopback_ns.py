"""A loopback-only network namespace for the tests that start Ray: Ray listens on every interface it finds (its GCS
on `*`, agents on the host's address, whatever `--node-ip-address` says), so the only way to keep a cluster off the
network is a namespace in which the loopback interface is the only one.

`python tests/loopback_ns.py ARGS` (run under `unshare -n`) brings `lo` up and becomes `python -m pytest ARGS`;
`test_ray_confined.py` starts it that way. `confined()` tells whether this process is in such a namespace.
"""
from __future__ import annotations

import fcntl
import ipaddress
import os
import shutil
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1


def interfaces() -> set[str]:
    """The network interfaces of this process's namespace (/proc/self/net/dev; /sys/class/net shows the namespace
    that mounted /sys, not this one)."""
    try:
        with open("/proc/self/net/dev", encoding="ascii") as f:
            lines = f.read().splitlines()[2:]
    except OSError:
        return set()
    return {line.split(":", 1)[0].strip() for line in lines if ":" in line}


def loopback_works() -> bool:
    try:
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            socket.create_connection(server.getsockname(), timeout=2).close()
        return True
    except OSError:
        return False


def confined() -> bool:
    """Whether this process's network namespace holds only `lo`, and `lo` is up."""
    return interfaces() == {"lo"} and loopback_works()


def require_confined() -> None:
    """Fail the test about to start Ray unless this process is in a loopback-only namespace (a test that starts Ray
    must be marked `starts_ray`, which keeps it out of any other process)."""
    if not confined():
        import pytest

        pytest.fail(f"this test starts Ray outside a loopback-only network namespace (interfaces: "
                    f"{sorted(interfaces())}): mark it @pytest.mark.starts_ray", pytrace=False)


def is_loopback(host: str) -> bool:
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:  # `*`: every interface
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # [::ffff:127.0.0.1]
    return (mapped or address).is_loopback


def confine_prefix() -> list[str] | None:
    """The command that puts what follows it into a new network namespace: `unshare -n` as root, `unshare -rn` (a user
    namespace mapping this user to root there) otherwise; None where `unshare` is missing or not allowed here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    prefix = [unshare, "-n"] if os.geteuid() == 0 else [unshare, "-r", "-n"]
    import subprocess

    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return None
    return prefix if ok else None


def bring_loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sh", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sh", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


if __name__ == "__main__":
    bring_loopback_up()
    if not confined():
        sys.exit(f"not a loopback-only network namespace (interfaces: {sorted(interfaces())}); run this under "
                 "`unshare -n`")
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *sys.argv[1:]])
