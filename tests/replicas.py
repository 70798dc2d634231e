"""Servers that fail over, for tests that kill a primary: PostgreSQL with a streaming standby, Redis with a
replica watched by three Sentinels. Real servers on TCP, beside `tests.hosts`' (whose `PostgresServer` and
`RedisServer` they build on); everything is waited for by asking the servers, never by sleeping a guessed time.

- `PostgresStandby(directory, primary)`: pg_basebackup -R of a running `PostgresServer` (standby.signal and
  primary_conninfo written), started on its own port with the same roles and passwords; `caught_up` waits until
  it has replayed what the primary wrote, `promote` runs `pg_ctl promote` and waits for it to take writes.
- `RedisSentinels(directory)`: a master and a replica (`--replicaof`, `requirepass` and `masterauth` on both) and
  three Sentinels (`redis-server sentinel.conf --sentinel`, `requirepass`, `sentinel auth-pass`, `sentinel-pass`)
  with a small `down-after-milliseconds`, so a killed master is replaced in seconds; `wait_for_failover` polls
  `SENTINEL get-master-addr-by-name` until it names another server that answers as master.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.hosts import (
    REDIS_SERVER,
    PostgresServer,
    RedisServer,
    _log_tail,
    _pg_bin,
    _stop_process,
    free_port,
    wait_for,
)

# --- PostgreSQL -----------------------------------------------------------------------------------------------


class PostgresStandby(PostgresServer):
    """A hot standby of `primary` streaming its WAL, on its own port; `promote` makes it the primary."""

    def __init__(self, directory: str | os.PathLike[str], primary: PostgresServer, *, start_timeout: float = 30) -> None:
        super().__init__(directory, address=primary.address, vector=primary.vector, start_timeout=start_timeout)
        self.primary = primary
        self.password, self.superuser_password = primary.password, primary.superuser_password

    def __enter__(self) -> PostgresStandby:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cluster = Path(tempfile.mkdtemp(prefix=f"mas-pg-{os.getpid():x}-"))
        try:
            self._chown(self.cluster)
            self.socket_dir.mkdir(mode=0o700)
            self._chown(self.socket_dir)
            self._base_backup()
            self.port = free_port(self.address)
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def _pg(self, argv: list[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """A PostgreSQL program run as the cluster's owner."""
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=timeout,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", "PGPASSWORD": self.superuser_password},
            **self._as_user(),
        )
        if result.returncode != 0:
            raise RuntimeError(f"{Path(argv[0]).name} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def _base_backup(self) -> None:
        """Copy the primary's cluster as a standby: -R writes standby.signal and primary_conninfo (with the
        password, so the standby can log in), -X stream keeps the WAL written meanwhile."""
        conninfo = f"host={self.primary.address} port={self.primary.port} user=postgres password={self.superuser_password}"
        self._pg(
            [str(_pg_bin() / "pg_basebackup"), "-D", str(self.pgdata), "-R", "-X", "stream", "-c", "fast",
             "--no-sync", "-d", conninfo]
        )  # fmt: skip

    def _sql(self, server: PostgresServer, query: str) -> Any:
        with server._connect(server.superuser_url) as conn:
            return conn.execute(query).fetchone()[0]

    def in_recovery(self) -> bool:
        return bool(self._sql(self, "select pg_is_in_recovery()"))

    def caught_up(self, timeout: float = 30) -> None:
        """Wait until this standby has replayed everything the primary has written so far (to its WAL buffers:
        with synchronous_commit off a commit is acknowledged before its WAL is even written)."""
        target = self._sql(self.primary, "select pg_current_wal_insert_lsn()::text")

        def replayed() -> bool:
            return bool(self._sql(self, f"select pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '{target}') >= 0"))

        wait_for(replayed, timeout=timeout, what=f"the standby to replay the primary's WAL up to {target}")

    def promote(self, timeout: float = 30) -> None:
        """`pg_ctl promote`, waiting until the server takes writes."""
        self._pg([str(_pg_bin() / "pg_ctl"), "promote", "-D", str(self.pgdata), "-w", "-t", str(int(timeout))])
        wait_for(lambda: not self.in_recovery(), timeout=timeout, what="the promoted standby to leave recovery")


def failover_url(*servers: PostgresServer) -> str:
    """MAS_DATABASE_URL naming `servers` in order, in libpq's multi-host form."""
    first = servers[0]
    hosts = ",".join(f"{server.address}:{server.port}" for server in servers)
    return f"postgresql://studio:{first.password}@{hosts}/studio?target_session_attrs=read-write"


# --- Redis Sentinel -------------------------------------------------------------------------------------------


class Sentinel:
    """One Redis Sentinel (`redis-server sentinel.conf --sentinel`) watching `master_name`."""

    def __init__(
        self, directory: Path, *, address: str, password: str, master_name: str, master: RedisServer,
        quorum: int, down_after_ms: int, failover_timeout_ms: int, port: int = 0,
    ) -> None:  # fmt: skip
        self.directory, self.address, self.password = directory, address, password
        self.port = port or free_port(address)  # `port`: a fixed one (a host's own network namespace)
        self.log = directory / "sentinel.log"
        self.config = directory / "sentinel.conf"
        directory.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            f"port {self.port}\nbind {address}\nprotected-mode no\ndaemonize no\ndir {directory}\n"
            f"requirepass {password}\n"
            f"sentinel sentinel-pass {password}\n"  # the other Sentinels ask with it
            f"sentinel monitor {master_name} {master.address} {master.port} {quorum}\n"
            f"sentinel auth-pass {master_name} {master.password}\n"
            f"sentinel down-after-milliseconds {master_name} {down_after_ms}\n"
            f"sentinel failover-timeout {master_name} {failover_timeout_ms}\n"
            f"sentinel parallel-syncs {master_name} 1\n"
        )
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [REDIS_SERVER, str(self.config), "--sentinel"], stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        process = self.process

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"sentinel exited ({process.returncode}):\n{_log_tail(self.log)}")
            return self.ask("ping") is not None

        wait_for(answering, timeout=timeout, what=f"sentinel on {self.address}:{self.port}")

    def ask(self, *command: str) -> Any:
        """A command's answer, or None when this Sentinel does not answer."""
        import redis

        try:
            with redis.Redis(self.address, self.port, password=self.password, socket_timeout=1,
                             socket_connect_timeout=1, decode_responses=True) as client:  # fmt: skip
                return client.execute_command(*command)
        except (redis.ConnectionError, redis.TimeoutError):
            return None

    def stop(self) -> None:
        if self.process is not None:
            _stop_process(self.process, signal.SIGTERM, 10)


class RedisSentinels:
    """A Redis master and its replica, password protected, watched by three Sentinels (quorum 2)."""

    master_name = "studio"

    def __init__(
        self, directory: str | os.PathLike[str], *, address: str = "127.0.0.1", down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:  # fmt: skip
        self.directory = Path(directory).resolve()
        self.address = address
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
        try:
            auth = ["--masterauth", self.password]  # the master too: it comes back as a replica after a failover
            master = RedisServer(self.directory / "redis-a", address=self.address, password=self.password,
                                 extra_args=auth)  # fmt: skip
            self.servers.append(master.__enter__())
            replica = RedisServer(self.directory / "redis-b", address=self.address, password=self.password,
                                  extra_args=[*auth, "--replicaof", self.address, str(master.port)])  # fmt: skip
            self.servers.append(replica.__enter__())
            wait_for(lambda: self._replication(replica).get("master_link_status") == "up", timeout=30,
                     what="the replica to sync with the master")  # fmt: skip
            for number in range(3):
                sentinel = Sentinel(
                    self.directory / f"sentinel-{number}", address=self.address, password=self.sentinel_password,
                    master_name=self.master_name, master=master, quorum=2, down_after_ms=self.down_after_ms,
                    failover_timeout_ms=self.failover_timeout_ms,
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

    def _replication(self, server: RedisServer) -> dict[str, Any]:
        import redis

        try:
            with server.client(timeout=1) as client:
                return dict(client.info("replication"))
        except (redis.ConnectionError, redis.TimeoutError):
            return {}

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
            if self._replication(self.server_at(address)).get("role") != "master":
                return False
            found.append(address)
            return True

        wait_for(moved, timeout=timeout, what=f"the Sentinels to promote a new master in place of {old}", interval=0.1)
        return found[-1]
