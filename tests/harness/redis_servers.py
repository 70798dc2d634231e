"""Real Redis servers for the tests: Debian's redis-server on TCP (or TLS) with a password, and a master with a
replica watched by three Sentinels, on host A or on hosts of a `Network`. Everything is waited for by asking the
servers, never by sleeping a guessed time.

- `RedisServer`: every write in the append-only file, so the queues survive `stop` / `start` / `restart`.
- `RedisSentinels`: a master and a replica (`--replicaof`, `requirepass` and `masterauth` on both) and three
  Sentinels (`sentinel.conf --sentinel`, `requirepass`, `sentinel auth-pass`, `sentinel-pass`) with a small
  `down-after-milliseconds`, so a killed master is replaced in seconds; `wait_for_failover` polls
  `SENTINEL get-master-addr-by-name` until it names another server that answers as master.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.harness.processes import REDIS_SERVER, Server, redis_server_available, wait_for
from tests.ports import free_port

if TYPE_CHECKING:
    from tests.harness.network import Host

REDIS_PORT, SENTINEL_PORT = 6379, 26379  # on a host of a Network: its namespace is its own, every port is free


class RedisServer(Server):
    """redis-server at (`address`, a free port), or on `host` at its address and the usual port; password
    protected, every write in the append-only file; its files under `directory`. With `tls` (CA, certificate,
    key) it listens on TLS only and its `url` is rediss://.

    `stop` sends SIGTERM: Redis then flushes and fsyncs the append-only file before exiting, so nothing
    acknowledged is lost (as `SHUTDOWN NOSAVE` would also keep it: NOSAVE skips only the RDB snapshot).
    `kill` is the crash (SIGKILL): up to a second of writes lost, as with appendfsync everysec.
    """

    def __init__(
        self, directory: str | os.PathLike[str], *, address: str = "127.0.0.1", host: Host | None = None,
        executable: str = REDIS_SERVER, start_timeout: float = 15, password: str | None = None,
        extra_args: Sequence[str] = (), tls: tuple[Path, Path, Path] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(directory, address=address, host=host)
        self.executable = executable
        self.start_timeout = start_timeout
        self.password = password or secrets.token_hex(16)
        self.extra_args = tuple(extra_args)  # say `--replicaof HOST PORT` (RedisSentinels)
        self.tls = tls
        self.log = self.directory / "redis.log"

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://:{self.password}@{self.address}:{self.port}/0"

    def env(self) -> dict[str, str]:
        """The studio's settings for this broker."""
        return {"MAS_BROKER_URL": self.url}

    def __enter__(self) -> RedisServer:
        if self.host is None and (reason := redis_server_available(self.executable)):
            raise RuntimeError(reason)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = REDIS_PORT if self.host is not None else free_port(self.address)
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def client(self, timeout: float = 2) -> Any:
        """A redis-py client of this server (timeouts of `timeout` s)."""
        import redis

        tls = {"ssl": True, "ssl_ca_certs": str(self.tls[0])} if self.tls else {}
        return redis.Redis(
            host=self.address, port=self.port, password=self.password, socket_timeout=timeout,
            socket_connect_timeout=timeout, **tls,
        )  # fmt: skip

    def answering(self) -> bool:
        import redis

        try:
            with self.client(timeout=1) as client:
                return bool(client.ping())
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError):
            return False

    def start(self) -> None:
        """Start (again, on the same port and data) and wait until it answers PING."""
        if self.tls:
            ca, cert, key = self.tls
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                      "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca), "--tls-auth-clients", "no"]  # fmt: skip
        else:
            listen = ["--port", str(self.port)]
        argv = [
            self.executable, "--bind", self.address, *listen, "--requirepass", self.password,
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "", "--maxmemory-policy", "noeviction",
            "--dir", str(self.directory), "--daemonize", "no", "--protected-mode", "no", "--loglevel", "notice",
            *self.extra_args,
        ]  # fmt: skip
        self.launch(argv, what="redis-server", timeout=self.start_timeout)

    def restart(self, down_seconds: float) -> None:
        """Stop, stay down `down_seconds` (the fault injected), start again and wait for PING."""
        self.stop()
        time.sleep(down_seconds)
        self.start()

    def replication(self) -> dict[str, Any]:
        """INFO replication, or nothing when the server does not answer."""
        import redis

        try:
            with self.client(timeout=1) as client:
                return dict(client.info("replication"))
        except (redis.ConnectionError, redis.TimeoutError):
            return {}


class Sentinel(Server):
    """One Redis Sentinel (`redis-server sentinel.conf --sentinel`) watching `master_name`, at (`address`, a
    free port), or on `host` at its address and the usual port."""

    stop_timeout = 10

    def __init__(
        self, directory: Path, *, address: str, password: str, master_name: str, master: RedisServer,
        quorum: int, down_after_ms: int, failover_timeout_ms: int, host: Host | None = None,
    ) -> None:  # fmt: skip
        super().__init__(directory, address=address, host=host)
        self.password = password
        self.port = SENTINEL_PORT if host is not None else free_port(self.address)
        self.log = directory / "sentinel.log"
        self.config = directory / "sentinel.conf"
        directory.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            f"port {self.port}\nbind {self.address}\nprotected-mode no\ndaemonize no\ndir {directory}\n"
            f"requirepass {password}\n"
            f"sentinel sentinel-pass {password}\n"  # the other Sentinels ask with it
            f"sentinel monitor {master_name} {master.address} {master.port} {quorum}\n"
            f"sentinel auth-pass {master_name} {master.password}\n"
            f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
            f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {master_name} 1\n"
        )

    def start(self, timeout: float = 15) -> None:
        self.launch([REDIS_SERVER, str(self.config), "--sentinel"], what="sentinel", timeout=timeout)

    def answering(self) -> bool:
        return self.ask("ping") is not None

    def ask(self, *command: str) -> Any:
        """A command's answer, or None when this Sentinel does not answer."""
        import redis

        try:
            with redis.Redis(self.address, self.port, password=self.password, socket_timeout=1,
                             socket_connect_timeout=1, decode_responses=True) as client:  # fmt: skip
                return client.execute_command(*command)
        except (redis.ConnectionError, redis.TimeoutError):
            return None


class RedisSentinels:
    """A Redis master and its replica, password protected, watched by three Sentinels (quorum 2). All on
    `address` by default; with `hosts` (the master's, the replica's), the master and the replica on theirs and a
    Sentinel on each of them and on `address` (host A)."""

    master_name = "studio"

    def __init__(
        self, directory: str | os.PathLike[str], *, address: str = "127.0.0.1",
        hosts: tuple[Host | None, Host | None] = (None, None), down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:  # fmt: skip
        self.directory = Path(directory).resolve()
        self.address = address
        self.hosts = hosts
        self.password = secrets.token_hex(16)  # the Redis servers'
        self.sentinel_password = secrets.token_hex(16)
        self.down_after_ms, self.failover_timeout_ms = down_after_ms, failover_timeout_ms
        self.servers: list[RedisServer] = []
        self.sentinels: list[Sentinel] = []

    @property
    def url(self) -> str:
        """MAS_BROKER_URL: the three Sentinels, with the Redis servers' password."""
        return ";".join(f"sentinel://:{self.password}@{s.address}:{s.port}/0" for s in self.sentinels)

    def env(self) -> dict[str, str]:
        return {
            "MAS_BROKER_URL": self.url,
            "MAS_REDIS_SENTINEL_MASTER": self.master_name,
            "MAS_REDIS_SENTINEL_PASSWORD": self.sentinel_password,
        }

    def __enter__(self) -> RedisSentinels:
        master_host, replica_host = self.hosts
        try:
            auth = ["--masterauth", self.password]  # the master too: it comes back as a replica after a failover
            master = RedisServer(self.directory / "redis-master", address=self.address, host=master_host,
                                 password=self.password, extra_args=auth)  # fmt: skip
            self.servers.append(master.__enter__())
            replica = RedisServer(self.directory / "redis-replica", address=self.address, host=replica_host,
                                  password=self.password,
                                  extra_args=[*auth, "--replicaof", master.address, str(master.port)])  # fmt: skip
            self.servers.append(replica.__enter__())
            wait_for(lambda: replica.replication().get("master_link_status") == "up", timeout=30,
                     what="the replica to sync with the master")  # fmt: skip
            spread = master_host is not None or replica_host is not None
            for number, host in enumerate((master_host, replica_host, None) if spread else (None, None, None)):
                sentinel = Sentinel(
                    self.directory / f"sentinel-{number}", address=self.address, host=host,
                    password=self.sentinel_password, master_name=self.master_name, master=master, quorum=2,
                    down_after_ms=self.down_after_ms, failover_timeout_ms=self.failover_timeout_ms,
                )  # fmt: skip
                self.sentinels.append(sentinel)
                sentinel.start()
            wait_for(self._watching, timeout=60, what="each Sentinel to know the replica and the other two")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for sentinel in self.sentinels:
            sentinel.stop()
        for server in self.servers:
            server.stop()

    def _watching(self) -> bool:
        for sentinel in self.sentinels:
            answer = sentinel.ask("sentinel", "master", self.master_name)
            if not answer:
                return False
            fields = dict(zip(answer[::2], answer[1::2], strict=True)) if isinstance(answer, list) else answer
            if int(fields.get("num-other-sentinels", 0)) < 2 or int(fields.get("num-slaves", 0)) < 1:
                return False
        return True

    def master_address(self) -> tuple[str, int] | None:
        """Where the Sentinels say the master is now (the first that answers)."""
        for sentinel in self.sentinels:
            answer = sentinel.ask("sentinel", "get-master-addr-by-name", self.master_name)
            if answer:
                return str(answer[0]), int(answer[1])
        return None

    def server_at(self, address: tuple[str, int]) -> RedisServer:
        return next(server for server in self.servers if (server.address, server.port) == address)

    def master(self) -> RedisServer:
        address = self.master_address()
        assert address is not None, "no Sentinel answers"
        return self.server_at(address)

    def replicated(self, timeout_ms: int = 10_000) -> None:
        """Wait until the replica has every write the master took so far (Redis's WAIT)."""
        with self.master().client(timeout=timeout_ms / 1000 + 2) as client:
            assert client.execute_command("WAIT", 1, timeout_ms) >= 1, "the replica did not acknowledge the writes"

    def wait_for_failover(self, old: tuple[str, int], timeout: float = 60) -> tuple[str, int]:
        """Poll the Sentinels until they name a master other than `old` that answers as master; its address."""
        found: list[tuple[str, int]] = []

        def moved() -> bool:
            address = self.master_address()
            if address is None or address == old:
                return False
            if self.server_at(address).replication().get("role") != "master":
                return False
            found.append(address)
            return True

        wait_for(moved, timeout=timeout, what=f"the Sentinels to promote a new master in place of {old}", interval=0.1)
        return found[-1]
