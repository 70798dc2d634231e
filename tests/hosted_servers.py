"""PostgreSQL and Redis servers on hosts of a `tests.hosts.Network`, for `tests/failover_hosts.py`.

Each runs in its host's network namespace (`ip netns exec`; PostgreSQL as the `pgserver` user through
`setpriv`), listening on the host's address at the usual port (the namespace is the host's own: every port is
free there); every step execs the next, so a server's pid is the server's and `crash` SIGKILLs its whole process
group, as a host dying would. `HostedPrimary` may wait for its standby (synchronous replication);
`HostedStandby` streams from it (pg_basebackup -R, `cluster_name=standby`); `SpreadSentinels` puts a Redis master
on one host, its replica on another and a Sentinel on each of them and on host A.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from tests.hosts import (
    REDIS_SERVER,
    Host,
    PostgresServer,
    RedisServer,
    _log_tail,
    _pg_bin,
    _tool,
    postgres_available,
    remove_stale_clusters,
    wait_for,
)
from tests.replicas import PostgresStandby, RedisSentinels, Sentinel

STANDBY_NAME = "standby"  # the standby's cluster_name, hence its application_name on the primary
PG_PORT, REDIS_PORT, SENTINEL_PORT = 5432, 6379, 26379  # a host's own namespace: every port is free there


def on_host(host: Host | None, argv: list[str], *, user: Any = None) -> list[str]:
    """`argv` run in `host`'s network namespace (None: this one), as `user` (a pwd entry) when given."""
    prefix = [_tool("ip"), "netns", "exec", host.netns] if host is not None else []
    if user is not None:
        prefix += [_tool("setpriv"), f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups"]
    return [*prefix, *argv]


def _wrapper(directory: Path, host: Host, program: str) -> str:
    """An executable that runs `program` on `host` (each step execs the next: its pid is the program's)."""
    directory.mkdir(parents=True, exist_ok=True)
    script = directory / f"on-{host.name}"
    script.write_text(f'#!/bin/sh\nexec {" ".join(on_host(host, [program]))} "$@"\n')
    script.chmod(0o755)
    return str(script)


def crash(proc: subprocess.Popen[Any] | None) -> None:
    """SIGKILL a server's whole process tree at once (its process group), as a host dying would."""
    if proc is not None and proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


class _PostgresOnHost:
    """PostgresServer's `start` on a host, with its replication settings (mixed into the server classes)."""

    host: Host
    settings: list[str]

    def start(self: Any) -> None:
        if self.process is not None and self.process.poll() is None:
            return
        argv = [
            str(_pg_bin() / "postgres"), "-D", str(self.pgdata), "-c", f"listen_addresses={self.address}",
            "-c", f"port={self.port}", "-c", f"unix_socket_directories={self.socket_dir}",
            "-c", "max_connections=300", "-c", "fsync=off", "-c", "full_page_writes=off",
            "-c", "shared_buffers=64MB", "-c", "wal_sender_timeout=5s", "-c", "wal_receiver_timeout=5s",
            *(arg for setting in self.settings for arg in ("-c", setting)),
        ]  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                on_host(self.host, argv, user=self._user), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True, env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
            )  # fmt: skip
        process = self.process

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"postgres exited ({process.returncode}):\n{_log_tail(self.log)}")
            return bool(self._answering())

        wait_for(answering, timeout=self.start_timeout, what=f"postgres on {self.address}:{self.port}")


class HostedPrimary(_PostgresOnHost, PostgresServer):
    """The primary on `host`; with `sync`, commits wait until the standby has flushed them."""

    def __init__(self, directory: Path, host: Host, *, sync: bool) -> None:
        super().__init__(directory, address=host.address)
        self.host = host
        self.sync = sync
        self.settings = [f"synchronous_commit={'on' if sync else 'off'}"]

    def wait_for_sync_standby(self, timeout: float = 30) -> None:
        """Name the standby in synchronous_standby_names (not before: the provisioning's commits would wait for
        it) and wait until the primary says it is `sync`."""
        with self._connect(self.superuser_url) as conn:
            conn.execute(f"alter system set synchronous_standby_names = '{STANDBY_NAME}'")
            conn.execute("select pg_reload_conf()")

        def sync() -> bool:
            with self._connect(self.superuser_url) as conn:
                row = conn.execute("select sync_state from pg_stat_replication where application_name = %s",
                                   (STANDBY_NAME,)).fetchone()  # fmt: skip
            return row is not None and row[0] == "sync"

        wait_for(sync, timeout=timeout, what="the standby to be the primary's synchronous standby")

    def __enter__(self) -> HostedPrimary:
        if reason := postgres_available():
            raise RuntimeError(reason)
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_stale_clusters()
        self.cluster = Path(tempfile.mkdtemp(prefix=f"mas-pg-{os.getpid():x}-"))
        try:
            self._initdb()
            self.port = PG_PORT
            self.start()
            self._provision()
        except BaseException:
            self.close()
            raise
        return self


class HostedStandby(_PostgresOnHost, PostgresStandby):
    """The streaming standby of `primary`, on `host`."""

    def __init__(self, directory: Path, primary: HostedPrimary, host: Host) -> None:
        super().__init__(directory, primary)
        self.host, self.address = host, host.address
        self.settings = [f"cluster_name={STANDBY_NAME}", "synchronous_commit=off"]

    def __enter__(self) -> HostedStandby:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cluster = Path(tempfile.mkdtemp(prefix=f"mas-pg-{os.getpid():x}-"))
        try:
            self._chown(self.cluster)
            self.socket_dir.mkdir(mode=0o700)
            self._chown(self.socket_dir)
            self._base_backup()
            self.port = PG_PORT
            self.start()
        except BaseException:
            self.close()
            raise
        return self


class HostedRedis(RedisServer):
    """A redis-server on `host` (its fixed port: the namespace is its own)."""

    def __init__(self, directory: Path, host: Host, **kwargs: Any) -> None:
        super().__init__(directory, address=host.address, executable=_wrapper(directory, host, REDIS_SERVER),
                         **kwargs)  # fmt: skip

    def __enter__(self) -> HostedRedis:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = REDIS_PORT
        self.start()
        return self


class HostedSentinel(Sentinel):
    """A Sentinel on `host` (None: host A, on `address`)."""

    def __init__(self, directory: Path, host: Host | None, **kwargs: Any) -> None:
        super().__init__(directory, port=SENTINEL_PORT if host is not None else 0, **kwargs)
        self.host = host

    def start(self, timeout: float = 15) -> None:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                on_host(self.host, [REDIS_SERVER, str(self.config), "--sentinel"]), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        wait_for(lambda: self.ask("ping") is not None, timeout=timeout, what=f"sentinel on {self.address}:{self.port}")


class SpreadSentinels(RedisSentinels):
    """The Redis master on D, its replica on E, a Sentinel on each of D, E and A."""

    def __init__(self, directory: Path, d: Host, e: Host, gateway: str) -> None:
        super().__init__(directory, address=gateway)
        self.d, self.e = d, e

    def __enter__(self) -> SpreadSentinels:
        try:
            auth = ["--masterauth", self.password]
            master = HostedRedis(self.directory / "redis-d", self.d, password=self.password, extra_args=auth)
            self.servers.append(master.__enter__())
            replica = HostedRedis(self.directory / "redis-e", self.e, password=self.password,
                                  extra_args=[*auth, "--replicaof", master.address, str(master.port)])  # fmt: skip
            self.servers.append(replica.__enter__())
            wait_for(lambda: self._replication(replica).get("master_link_status") == "up", timeout=30,
                     what="the replica to sync with the master")  # fmt: skip
            for host in (self.d, self.e, None):
                sentinel = HostedSentinel(
                    self.directory / f"sentinel-{host.name if host else 'A'}", host,
                    address=host.address if host else self.address, password=self.sentinel_password,
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
