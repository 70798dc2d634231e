"""Where a webhook may go: a receiver's host resolved, and every address it resolves to checked.

A receiver named by a request (`--notify`, the API's `notify_url`) or by the studio (MAS_WEBHOOK_URL) must not
turn the studio against itself or the network it runs in (server-side request forgery). Its host is resolved
and every address it resolves to must be public; a name with one bad address among good ones is refused.
Refused: loopback, unspecified (0.0.0.0, ::), link-local (169.254.0.0/16, cloud metadata at 169.254.169.254
included; fe80::/10), multicast, private (10/8, 172.16/12, 192.168/16, fc00::/7), and every other range that
is not globally reachable (100.64/10 shared, 192.0.0/24, 198.18/15, 240/4, the documentation ranges ...: the
`ipaddress` module's `is_global` and `is_reserved`). An IPv6 address that carries an IPv4 one (IPv4-mapped
::ffff:a.b.c.d, NAT64 64:ff9b::/96, 6to4 2002::/16) is judged by the IPv4 address it carries. So are the
hosts of the studio's own services (database, Redis, ComfyUI, LLM, Letta, S3 endpoint), by name and by
address. Whatever form a host takes (127.1, 2130706433, 0x7f000001, 0177.0.0.1), what the resolver makes of it
is what is checked, and what is connected to.

MAS_WEBHOOK_ALLOWED_HOSTS makes exceptions: a host name listed is allowed whatever it resolves to, an address
within a listed network is allowed. An exception lifts every rule, the studio's own services' included.

The check runs when a request names its receiver (refused whole) and again before each delivery, which then
connects to the address checked (`Target.address`), never to a second resolution: a name that resolved to a
public address when it was submitted and resolves to an internal one later (DNS rebinding) is refused then.

Pure code: the resolver is passed in (`socket.getaddrinfo` unless a test injects one).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from mas import urls as service_urls
from mas.config import Settings
from mas.errors import PermanentError, RetryableError, StudioError

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network

Resolver = Callable[..., Sequence[tuple[Any, ...]]]
"""`socket.getaddrinfo`'s shape: called as `resolver(host, port, type=socket.SOCK_STREAM)`, it answers
`(family, type, proto, canonname, sockaddr)` tuples whose `sockaddr[0]` is an address. Tests pass one that
answers what they need, differently from one call to the next when they stand in for a rebinding DNS server."""

ALLOW = "allow it with MAS_WEBHOOK_ALLOWED_HOSTS"

PRIVATE: tuple[Network, ...] = tuple(
    ipaddress.ip_network(net) for net in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7")
)
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class TargetError(StudioError):
    """A webhook receiver the studio may not send to, now or ever; its message says why (no URL in it)."""


class TargetRefused(TargetError, PermanentError):
    """The receiver's host, or an address it resolves to, is one webhooks may not go to."""


class TargetUnresolved(TargetError, RetryableError):
    """The receiver's host name does not resolve now (DNS may answer later)."""


@dataclass(frozen=True, kw_only=True)
class Rules:
    """What is allowed beyond public addresses, and what is refused among them (the studio's own services)."""

    allowed_names: frozenset[str] = frozenset()
    allowed_networks: tuple[Network, ...] = ()
    service_names: frozenset[str] = frozenset()
    service_addresses: frozenset[Address] = frozenset()


@dataclass(frozen=True, kw_only=True)
class Target:
    """A receiver that passed: its host as named (for the Host header and TLS), its port, and the addresses to
    connect to (the ones checked, in the resolver's order)."""

    host: str
    port: int
    addresses: tuple[str, ...]

    @property
    def address(self) -> str:
        """The first address to connect to."""
        return self.addresses[0]


def rules(settings: Settings, resolver: Resolver = socket.getaddrinfo) -> Rules:
    """The rules of these settings: MAS_WEBHOOK_ALLOWED_HOSTS, and the studio's own services by name and by what
    they resolve to now (a service host that does not resolve is compared by name only)."""
    names, networks = set(), []
    for entry in settings.webhooks.allowed_hosts:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            names.add(_name(entry))
    hosts = service_hosts(settings)
    addresses = {a for host in sorted(hosts) for a in _addresses_or_none(host, resolver)}
    return Rules(
        allowed_names=frozenset(names),
        allowed_networks=tuple(networks),
        service_names=frozenset(host for host in hosts if not _is_address(host)),  # those: by address
        service_addresses=frozenset(addresses | {_carried(a) or a for a in addresses}),
    )


def service_hosts(settings: Settings) -> set[str]:
    """The hosts of the services the studio's settings name (a Unix socket has none)."""
    urls = (
        settings.database.url,
        settings.broker.url,
        settings.broker.result_backend,
        settings.comfyui.url,
        settings.llm.url,
        settings.letta.url,
        settings.storage.s3_endpoint_url,
    )
    # every server of a primary and its standbys, every Sentinel of a list (`mas.urls`)
    return {_name(host) for url in urls for host in service_urls.service_hosts(url)}


def check_url(url: str, rules: Rules, resolver: Resolver = socket.getaddrinfo) -> Target:
    """The target of an http(s) URL (its host and port read as `urllib.parse` reads them), checked."""
    try:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise TargetRefused("is not a URL that can be read (a bad port, or brackets that do not close)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise TargetRefused("is not an http(s) URL with a host")
    return check_host(parts.hostname, port, rules, resolver)


def check_host(host: str, port: int, rules: Rules, resolver: Resolver = socket.getaddrinfo) -> Target:
    """Resolve `host` and check every address it resolves to; the Target to connect to, or TargetRefused
    (permanent) or TargetUnresolved (retryable) with a reason fit to show."""
    name = _name(host)
    allowed = name in rules.allowed_names
    if name in rules.service_names and not allowed:
        raise TargetRefused(f"names a host of the studio's own services; {ALLOW}")
    addresses = _resolve(host.strip().removeprefix("[").removesuffix("]"), port, resolver)
    if not allowed:
        for address in addresses:
            if reason := refusal(address, rules):
                raise TargetRefused(f"resolves to {reason}; {ALLOW}")
    return Target(host=host, port=port, addresses=tuple(str(address) for address in addresses))


def refusal(address: Address, rules: Rules | None = None) -> str | None:
    """Why `address` may not be sent to ("a loopback address 127.0.0.1"), or None when it may."""
    rules = rules or Rules()
    carried = _carried(address)
    judged = carried or address
    if any(a in net for a in (address, judged) for net in rules.allowed_networks):
        return None
    shown = f"{address} (IPv4 {carried})" if carried else str(address)
    if kind := _kind(judged):
        return f"{kind} {shown}"
    if address in rules.service_addresses or judged in rules.service_addresses:
        return f"an address of the studio's own services {shown}"
    return None


def _kind(address: Address) -> str | None:
    """The kind of address webhooks never go to by default, or None for a public one."""
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address"
    if address.is_multicast:
        return "a multicast address"
    if any(address in net for net in PRIVATE):
        return "a private address"
    if isinstance(address, ipaddress.IPv6Address) and address.is_site_local:
        return "a site-local address"
    if address.is_reserved or not address.is_global:
        return "a reserved or non-public address"
    return None


def _carried(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (IPv4-mapped, NAT64 well-known prefix, 6to4), else None."""
    if not isinstance(address, ipaddress.IPv6Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address.sixtofour


def _resolve(host: str, port: int, resolver: Resolver) -> list[Address]:
    """Every address `host` resolves to, in the resolver's order, each once."""
    try:
        found = resolver(host, port, type=socket.SOCK_STREAM)
    except ValueError:  # UnicodeError included: a label too long for IDNA, a NUL
        raise TargetRefused("has a host name that is not a valid name") from None
    except OSError:
        raise TargetUnresolved("has a host name that does not resolve now") from None
    addresses = list(dict.fromkeys(_parsed(info[4][0]) for info in found))
    if not addresses:
        raise TargetUnresolved("has a host name that does not resolve now")
    return addresses


def _addresses_or_none(host: str, resolver: Resolver) -> Iterable[Address]:
    try:
        return _resolve(host, 0, resolver)
    except TargetError:
        return ()


def _is_address(host: str) -> bool:
    try:
        _parsed(host)
    except ValueError:
        return False
    return True


def _parsed(text: str) -> Address:
    return ipaddress.ip_address(text.partition("%")[0])  # a scope (fe80::1%eth0) changes nothing here


def _name(host: str) -> str:
    """A host as compared with the allowed and the services' names: lowercase, no brackets, no final dot."""
    return host.strip().lower().removeprefix("[").removesuffix("]").removesuffix(".")
