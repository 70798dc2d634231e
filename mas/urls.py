"""Service URLs that name several servers, read in one place: PostgreSQL's primary and standbys, Redis Sentinel.

- PostgreSQL: libpq's multi-host URL, `postgresql://user:pw@h1:5432,h2:5432/db?target_session_attrs=read-write`.
  libpq tries the hosts in order and keeps the first that `target_session_attrs` accepts (`read-write`: the
  primary, whichever host that is now). SQLAlchemy does not read several hosts in the host part, only as
  `?host=h1,h2&port=5432,5432`: `sqlalchemy_database_url` writes it so, and adds `target_session_attrs=read-write`
  to a URL of several hosts that sets none (the studio writes: a standby is of no use to it).
- Redis Sentinel: `sentinel://:pw@h1:26379;sentinel://:pw@h2:26379;sentinel://:pw@h3:26379` (kombu's and
  Celery's form): the Sentinels to ask which server is the master of MAS_REDIS_SENTINEL_MASTER now; the
  user-info is the Redis servers' own password (the first URL's is used), Sentinel's is
  MAS_REDIS_SENTINEL_PASSWORD; a path `/N` picks database N.

Every function raises `ValueError` for a URL it cannot read, with a message that never repeats the URL (it
may hold a password).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

SENTINEL = "sentinel"
SENTINEL_PORT = 26379
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg")

_SCHEME = re.compile(r"(?i)^([a-z][a-z0-9+.-]*)://")


@dataclass(frozen=True)
class Server:
    """One server of a URL: its host (an IPv6 address without brackets) and port (None: the default)."""

    host: str
    port: int | None

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


def _port(text: str) -> int | None:
    if not text:
        return None
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ValueError("a port is not a number from 1 to 65535")
    return int(text)


def _server(text: str) -> Server:
    """`host`, `host:port`, `[v6]` or `[v6]:port`."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError("brackets around an IPv6 address do not close")
        return Server(host, _port(rest[1:]))
    host, _, port = text.partition(":")
    return Server(host, _port(port))


def _split_netloc(netloc: str) -> tuple[str, str]:
    """(user-info with its `@`, or "", hosts part): the user-info ends at the last `@`."""
    at = netloc.rfind("@")
    return (netloc[: at + 1], netloc[at + 1 :]) if at >= 0 else ("", netloc)


def _netloc(url: str) -> tuple[str, str, str]:
    """(scheme, netloc, the rest from the path on), split by hand: urlsplit refuses several ports."""
    match = _SCHEME.match(url)
    if match is None:
        raise ValueError("not a URL (no scheme://)")
    rest = url[match.end() :]
    end = min((i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest))
    return match.group(1).lower(), rest[:end], rest[end:]


def scheme(url: str) -> str:
    """The URL's scheme, lowercase."""
    return _netloc(url)[0]


# --- PostgreSQL -----------------------------------------------------------------------------------------------


def database_servers(url: str) -> list[Server]:
    """The servers a PostgreSQL URL names, in order: its host part (`h1:5432,h2:5432`) or its `host` / `port`
    parameters (`?host=h1,h2&port=5432,5433`); a Unix socket folder names none."""
    _, netloc, rest = _netloc(url)
    _, hosts = _split_netloc(netloc)
    servers = [_server(part) for part in hosts.split(",") if part] if hosts else []
    query = dict(parse_qsl(urlsplit("x://h" + rest).query)) if "?" in rest else {}
    if not servers and query.get("host"):
        names = query["host"].split(",")
        ports = query.get("port", "").split(",") if query.get("port") else [""] * len(names)
        if len(ports) == 1 and len(names) > 1:
            ports *= len(names)
        if len(ports) != len(names):
            raise ValueError("the URL's host and port parameters name different numbers of servers")
        servers = [Server(unquote(name), _port(port)) for name, port in zip(names, ports, strict=True)]
    return [server for server in servers if server.host and not server.host.startswith("/")]


def sqlalchemy_database_url(url: str) -> str:
    """The URL as SQLAlchemy with psycopg 3 reads it: scheme `postgresql+psycopg`; several hosts in the host
    part moved to `?host=h1,h2&port=p1,p2` (with `target_session_attrs=read-write` unless the URL sets it)."""
    scheme, netloc, rest = _netloc(url)
    if scheme not in POSTGRES_SCHEMES:
        raise ValueError(f"expected a postgresql:// URL, got scheme {scheme!r}")
    userinfo, hosts = _split_netloc(netloc)
    if "," not in hosts:
        return f"postgresql+psycopg://{netloc}{rest}"
    servers = [_server(part) for part in hosts.split(",")]
    if not all(server.host for server in servers):
        raise ValueError("a server of the URL's host list names no host")
    path, _, query_part = rest.partition("?")
    query_part, hash_, fragment = query_part.partition("#")
    query = parse_qsl(query_part, keep_blank_values=True)
    if any(name in ("host", "port", "hostaddr") for name, _ in query):
        raise ValueError("the URL names its servers twice: in its host part and in a host or port parameter")
    if not any(name == "target_session_attrs" for name, _ in query):
        query.append(("target_session_attrs", "read-write"))
    multi = [("host", ",".join(s.host for s in servers))]
    if any(s.port is not None for s in servers):
        multi.append(("port", ",".join("" if s.port is None else str(s.port) for s in servers)))
    encoded = urlencode(multi + query, safe=",:/", quote_via=quote)
    return f"postgresql+psycopg://{userinfo}{path or '/'}?{encoded}{hash_}{fragment}"


def libpq_database_url(url: str) -> str:
    """The URL as libpq (psycopg.connect) reads it: scheme `postgresql`, several hosts left in the host part."""
    scheme, netloc, rest = _netloc(url)
    if scheme not in POSTGRES_SCHEMES:
        raise ValueError(f"expected a postgresql:// URL, got scheme {scheme!r}")
    return f"postgresql://{netloc}{rest}"


# --- Redis Sentinel -------------------------------------------------------------------------------------------


def is_sentinel(url: str | None) -> bool:
    """Whether `url` lists Redis Sentinels (`sentinel://...;sentinel://...`)."""
    return url is not None and url.lower().startswith(f"{SENTINEL}://")


@dataclass(frozen=True)
class Sentinels:
    """What a `sentinel://` list says: the Sentinels to ask, and how to log in to the Redis servers."""

    servers: tuple[Server, ...]
    username: str | None
    password: str | None
    db: int

    def addresses(self) -> list[tuple[str, int]]:
        """(host, port) of each Sentinel, the default port filled in, as redis-py's `Sentinel` takes them."""
        return [(server.host, server.port or SENTINEL_PORT) for server in self.servers]


def sentinels(url: str) -> Sentinels:
    """Read a `sentinel://[user:pw@]host[:port][/db];sentinel://...` list (port 26379 by default)."""
    servers, credentials, db = [], None, 0
    for number, part in enumerate(p for p in url.split(";") if p.strip()):
        scheme, netloc, rest = _netloc(part.strip())
        if scheme != SENTINEL:
            raise ValueError(f"every server of a Sentinel list must be sentinel://, got scheme {scheme!r}")
        userinfo, hosts = _split_netloc(netloc)
        server = _server(hosts)
        if not server.host:
            raise ValueError("a sentinel:// URL names no host")
        servers.append(Server(server.host, server.port or SENTINEL_PORT))
        if number == 0:
            user, colon, password = userinfo.removesuffix("@").partition(":")
            credentials = (unquote(user) or None, unquote(password) if colon else None)
            path = rest.partition("?")[0].strip("/")
            if path and not path.isdigit():
                raise ValueError("a sentinel:// URL's path is a database number")
            db = int(path or 0)
    if not servers or credentials is None:
        raise ValueError("a Sentinel list names no Sentinel")
    return Sentinels(servers=tuple(servers), username=credentials[0], password=credentials[1], db=db)


def service_hosts(url: str | None) -> list[str]:
    """Every host a service URL names (several for a multi-host PostgreSQL URL or a Sentinel list; none for a
    Unix socket or a URL that cannot be read)."""
    if not url:
        return []
    try:
        if is_sentinel(url):
            return [server.host for server in sentinels(url).servers]
        if _netloc(url)[0] in POSTGRES_SCHEMES:
            return [server.host for server in database_servers(url)]
        host = urlsplit(url).hostname
    except ValueError:
        return []
    return [host] if host else []


def passwords(url: str) -> list[str]:
    """The passwords in a URL's user-info parts (each server of a list), for redaction."""
    found = []
    for part in re.split(r";(?=[A-Za-z][A-Za-z0-9+.-]*://)", url):
        try:
            _, netloc, _ = _netloc(part.strip())
        except ValueError:
            continue
        userinfo, _ = _split_netloc(netloc)
        user, colon, password = userinfo.removesuffix("@").partition(":")
        found.append(unquote(password) if colon else unquote(user))
    return [secret for secret in found if secret]
