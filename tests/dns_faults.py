"""A FAULT-INJECTING STAND-IN for DNS, passed where the studio takes a resolver (`mas.outbox.targets`). It is
not a DNS server and asks none.

The webhook address checks need names that resolve to what a test says: one public and one private address,
the studio's own services, and a name that resolves to a public address when a request is submitted and to
127.0.0.1 when its events are delivered (a rebinding DNS server). `Dns` has the shape of
`socket.getaddrinfo`: it answers the names in its table, a name given several answers gets the next one at
each call and then keeps the last, IP literals in every form the system reads (127.1, 2130706433, ::1) and
`localhost` resolve as this machine resolves them (no network), and any other name does not resolve.
"""

from __future__ import annotations

import socket
from collections import Counter


class Dns:
    def __init__(self, **answers: str | list[str] | list[list[str]]) -> None:
        """Names with `_` for `.`: `hooks_example_com="93.184.216.34"`, `rebinds_test=[["93.184.216.34"],
        ["127.0.0.1"]]` (public at the first call, loopback from the second on)."""
        self.answers = {name.replace("_", "."): _rounds(answer) for name, answer in answers.items()}
        self.calls: Counter[str] = Counter()

    def __call__(self, host: str, port: int, **_: object) -> list[tuple]:
        if host not in self.answers:  # an address in any form, read without asking any DNS; localhost
            flags = 0 if host == "localhost" else socket.AI_NUMERICHOST
            return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags)  # or socket.gaierror
        rounds = self.answers[host]
        answer = rounds[min(self.calls[host], len(rounds) - 1)]
        self.calls[host] += 1
        return [_info(address, port) for address in answer]


def _rounds(answer: str | list[str] | list[list[str]]) -> list[list[str]]:
    if isinstance(answer, str):
        return [[answer]]
    return [answer] if isinstance(answer[0], str) else answer


def _info(address: str, port: int) -> tuple:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))
