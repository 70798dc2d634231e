"""Ports for the servers the tests start, chosen below the kernel's ephemeral range.

A port the kernel picks (bind to port 0) is free only until the socket closes: the kernel hands the same range
out to every outgoing connection and every other port-0 bind, so under pytest -n, or on a host address that
talks to network namespaces, another socket may take it before the server binds it (seen: SeaweedFS's master
port). A port below that range is never handed out by the kernel: probed free here, it stays free until a
server binds it, unless another test's pick lands on the same one.
"""

from __future__ import annotations

import secrets
import socket
from pathlib import Path

LOWEST = 10000
"""Below it: the ports of services a machine may run (databases, brokers, web servers)."""


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 unless configured)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(address: str = "127.0.0.1", size: int = 1, *, twins: int = 0) -> int:
    """A base port B with B..B+size free on `address` now, and B+twins..B+twins+size as well when `twins` is
    given (SeaweedFS opens a gRPC port 10000 above each of its ports), all below the ephemeral range."""
    highest = ephemeral_low() - twins - size
    if highest <= LOWEST:
        raise RuntimeError(f"no room for {size} ports (twins +{twins}) below the ephemeral range on {address}")
    for _ in range(200):
        base = LOWEST + secrets.randbelow(highest - LOWEST)
        ports = [base + i for i in range(size)] + ([base + twins + i for i in range(size)] if twins else [])
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind((address, port))
        except OSError:
            continue
        return base
    raise RuntimeError(f"no block of {size} free ports on {address}")


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port free on `address` now, which no outgoing connection will take in the meantime."""
    return free_port_block(address)
