"""Real PostgreSQL servers for the tests: pgserver's PostgreSQL 16 + pgvector, a primary and its streaming
standby, on host A or on hosts of a `Network` (there in the host's network namespace, as the `pgserver` user
through `setpriv`, at the usual port). Everything is waited for by asking the servers, never by sleeping.

- `PostgresServer`: a fresh cluster with a login role `studio` that is no superuser; `stop` / `start` keep the
  data. `replication` settings (`REPLICATION`) shorten the time a dead peer's connection is held. `shell` runs
  an operator's command line on its host as the user that runs it.
- `PostgresStandby(directory, primary)`: pg_basebackup -R of a running `PostgresServer` (standby.signal and
  primary_conninfo written), started on its own port with the same roles and passwords; `caught_up` waits until
  it has replayed what the primary wrote, `promote` runs `pg_ctl promote` and waits for it to take writes.
  `base_backup` makes the copy another way (a documented runbook's steps).
"""

from __future__ import annotations

import functools
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.harness.processes import Server, on_host, pg_bin, pid_alive, pid_gone, postgres_available, run, wait_for
from tests.ports import free_port

if TYPE_CHECKING:
    from tests.harness.network import Host

PG_USER = "pgserver"  # the user PostgreSQL runs as when the tests run as root (pgserver's own choice)
PG_PORT = 5432  # on a host of a Network: its namespace is its own, every port is free
STANDBY_NAME = "standby"  # a standby's cluster_name, hence its application_name on the primary
REPLICATION = ("wal_sender_timeout=5s", "wal_receiver_timeout=5s")


def _pg_user() -> pwd.struct_passwd | None:
    """The user PostgreSQL runs as: `pgserver` (created if missing) when we are root, else ourselves (None)."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(PG_USER)
    except KeyError:
        run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", PG_USER])
        return pwd.getpwnam(PG_USER)


def remove_stale_clusters() -> None:
    """Stop the servers and remove the clusters that PostgresServers of processes no longer alive left
    behind (a test run killed before its clean-up)."""
    for folder in Path(tempfile.gettempdir()).glob("mas-pg-*-*"):
        match = re.fullmatch(r"mas-pg-([0-9a-f]+)-.*", folder.name)
        if match is None or pid_alive(int(match.group(1), 16)):
            continue
        try:
            pid = int((folder / "pgdata" / "postmaster.pid").read_text().split()[0])
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError, IndexError):
            pid, cmdline = 0, b""
        if pid and str(folder).encode() in cmdline:  # our postmaster, not a recycled pid
            os.kill(pid, signal.SIGQUIT)  # immediate shutdown: the cluster is thrown away
            wait_for(functools.partial(pid_gone, pid), timeout=10, what=f"stale postgres {pid} to exit")
        shutil.rmtree(folder, ignore_errors=True)


class PostgresServer(Server):
    """A fresh cluster listening on (`address`, a free port), or on `host` at its address and the usual port, and
    on a unix socket, with scram-sha-256 passwords for everyone (local, 127.0.0.1, ::1, 10.0.0.0/8).

    The superuser `postgres` (`superuser_url`) makes a login role `studio` (not superuser, no createdb, no
    createrole) owning a database `studio` (`url`, as MAS_DATABASE_URL wants it) and, unless `vector=False`,
    runs `create extension vector` there, which `studio` could not do itself. `settings` are the server's
    own (`-c name=value`; by default commits acknowledged before their WAL is written).

    Run as root, the cluster belongs to the `pgserver` user (PostgreSQL refuses root) and lives in a
    temporary folder of that user (a pytest tmp_path is closed to other users); the server log is written
    to `directory / "postgres.log"`. Fast settings for tests: no fsync (safe against a killed server, not
    against a crashed machine).
    """

    stop_signal = signal.SIGINT  # fast shutdown, as `pg_ctl stop -m fast`: sessions rolled back, the data kept
    stop_timeout = 30

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        address: str = "127.0.0.1",
        host: Host | None = None,
        vector: bool = True,
        settings: Sequence[str] = ("synchronous_commit=off",),
        start_timeout: float = 30,
    ) -> None:
        super().__init__(directory, address=address, host=host)
        self.vector = vector
        self.settings = tuple(settings)
        self.start_timeout = start_timeout
        self.password = secrets.token_hex(16)  # studio's
        self.superuser_password = secrets.token_hex(16)
        self.log = self.directory / "postgres.log"
        self.cluster = Path()  # made on enter: pgdata/ and sockets/
        self._user = _pg_user()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://studio:{self.password}@{self.address}:{self.port}/studio"

    @property
    def superuser_url(self) -> str:
        return f"postgresql+psycopg://postgres:{self.superuser_password}@{self.address}:{self.port}/postgres"

    @property
    def pgdata(self) -> Path:
        return self.cluster / "pgdata"

    @property
    def socket_dir(self) -> Path:
        return self.cluster / "sockets"

    def __enter__(self) -> PostgresServer:
        if reason := postgres_available():
            raise RuntimeError(reason)
        remove_stale_clusters()
        self._make_cluster(self._initdb)
        try:
            self._provision()
        except BaseException:
            self.close()
            raise
        return self

    def _make_cluster(self, fill: Any) -> None:
        """A cluster folder of the server's user, filled by `fill`, then the server started on it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        self.cluster = Path(tempfile.mkdtemp(prefix=f"mas-pg-{os.getpid():x}-"))
        try:
            self._chown(self.cluster)
            self.socket_dir.mkdir(mode=0o700)
            self._chown(self.socket_dir)
            self.port = PG_PORT if self.host is not None else free_port(self.address)
            fill()  # may start the server itself (a runbook's `pg_ctl start`): `start` is then a no-op
            self.start()
        except BaseException:
            self.close()
            raise

    def _as_user(self) -> dict[str, Any]:
        if self._user is None:
            return {}
        return {"user": self._user.pw_uid, "group": self._user.pw_gid, "extra_groups": []}

    def _chown(self, path: Path) -> None:
        if self._user is not None:
            os.chown(path, self._user.pw_uid, self._user.pw_gid)

    def pg(self, argv: list[str], *, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        """A PostgreSQL program run to the end as the cluster's owner; RuntimeError if it fails."""
        result = subprocess.run(
            [str(pg_bin() / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=timeout,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C", **env}, **self._as_user(),
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{argv[0]} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def shell(self, line: str, *, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
        """`line` run by sh to the end on the server's host as the cluster's owner, PostgreSQL's programs on PATH
        and PGDATA naming the data folder: an operator's step as a page writes it; RuntimeError if it fails."""
        result = subprocess.run(
            on_host(self.host, ["/bin/sh", "-c", line], user=self._user), capture_output=True, text=True,
            timeout=timeout, env={"PATH": f"{pg_bin()}:{os.environ.get('PATH', '')}", "LC_ALL": "C",
                                  "PGDATA": str(self.pgdata), **env},
        )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"{line!r} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
        return result

    def _initdb(self) -> None:
        pwfile = self.cluster / "pwfile"
        pwfile.write_text(self.superuser_password + "\n")
        pwfile.chmod(0o600)
        self._chown(pwfile)
        try:
            self.pg(["initdb", "-D", str(self.pgdata), "--auth=scram-sha-256", "--username=postgres",
                     f"--pwfile={pwfile}", "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions"])  # fmt: skip
        finally:
            pwfile.unlink()
        (self.pgdata / "pg_hba.conf").write_text(
            "# written by the test harness\n"
            "local all all scram-sha-256\n"
            "host all all 127.0.0.1/32 scram-sha-256\n"
            "host all all ::1/128 scram-sha-256\n"
            "host all all 10.0.0.0/8 scram-sha-256\n"
            "host replication all 127.0.0.1/32 scram-sha-256\n"  # a standby's (PostgresStandby)
            "host replication all 10.0.0.0/8 scram-sha-256\n"
        )

    def _connect(self, url: str, timeout: float = 2) -> Any:
        import psycopg

        return psycopg.connect(
            url.replace("postgresql+psycopg://", "postgresql://", 1),
            connect_timeout=max(1, int(timeout)),
            autocommit=True,
        )

    def scalar(self, query: str, *params: Any, database: str = "postgres") -> Any:
        """The first value `query` returns (None: no row, or a statement that returns none), run as the superuser
        in `database`."""
        with self._connect(self.superuser_url.rsplit("/", 1)[0] + f"/{database}") as conn:
            cursor = conn.execute(query, params or None)
            row = cursor.fetchone() if cursor.description else None
        return None if row is None else row[0]

    def answering(self) -> bool:
        import psycopg

        try:
            with self._connect(self.superuser_url, timeout=1) as conn:
                conn.execute("select 1")
            return True
        except psycopg.OperationalError:
            return False

    def start(self) -> None:
        """Start the server (again, on the same port and data) and wait until it takes connections."""
        argv = [
            str(pg_bin() / "postgres"), "-D", str(self.pgdata), "-c", f"listen_addresses={self.address}",
            "-c", f"port={self.port}", "-c", f"unix_socket_directories={self.socket_dir}",
            "-c", "max_connections=300", "-c", "fsync=off", "-c", "full_page_writes=off",
            "-c", "shared_buffers=64MB", *(arg for setting in self.settings for arg in ("-c", setting)),
        ]  # fmt: skip
        self.launch(argv, what="postgres", timeout=self.start_timeout, user=self._user,
                    env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"})  # fmt: skip

    def _provision(self) -> None:
        from psycopg import sql

        with self._connect(self.superuser_url) as conn:
            conn.execute(
                sql.SQL("create role studio login password {} nosuperuser nocreatedb nocreaterole").format(
                    sql.Literal(self.password)
                )
            )
            conn.execute("create database studio owner studio")
        if self.vector:
            self.scalar("create extension vector", database="studio")

    def replication_state(self) -> str | None:
        """How the primary replicates to the standby: "sync", "async", or None (no standby streams)."""
        return self.scalar("select sync_state from pg_stat_replication where application_name = %s", STANDBY_NAME)

    def wait_for_sync_standby(self, timeout: float = 30) -> None:
        """Name the standby in synchronous_standby_names (not before: the provisioning's commits would wait for
        it) and wait until the primary says it is `sync`."""
        self.scalar(f"alter system set synchronous_standby_names = '{STANDBY_NAME}'")
        self.scalar("select pg_reload_conf()")
        wait_for(lambda: self.replication_state() == "sync", timeout=timeout,
                 what="the standby to be the primary's synchronous standby")  # fmt: skip

    def close(self) -> None:
        """Stop the server and remove its cluster (the log stays in `directory`)."""
        self.stop()
        if self.cluster != Path():
            shutil.rmtree(self.cluster, ignore_errors=True)


class PostgresStandby(PostgresServer):
    """A hot standby of `primary` streaming its WAL, on its own port (or on `host`); `promote` makes it the
    primary. `base_backup`, when given, makes the copy (and may start it) in place of the harness's own
    pg_basebackup: an operator's steps, as a page writes them."""

    def __init__(
        self, directory: str | os.PathLike[str], primary: PostgresServer, *, host: Host | None = None,
        settings: Sequence[str] = ("synchronous_commit=off",), start_timeout: float = 30,
        base_backup: Callable[[PostgresStandby], object] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(directory, address=primary.address, host=host, vector=primary.vector, settings=settings,
                         start_timeout=start_timeout)  # fmt: skip
        self.primary = primary
        self.password, self.superuser_password = primary.password, primary.superuser_password
        self.make_copy = base_backup

    def __enter__(self) -> PostgresStandby:
        self._make_cluster(self._base_backup)
        return self

    def _base_backup(self) -> None:
        """Copy the primary's cluster as a standby: -R writes standby.signal and primary_conninfo (with the
        password, so the standby can log in), -X stream keeps the WAL written meanwhile."""
        if self.make_copy is not None:
            self.make_copy(self)
            return
        conninfo = (
            f"host={self.primary.address} port={self.primary.port} user=postgres password={self.superuser_password}"
        )
        self.pg(["pg_basebackup", "-D", str(self.pgdata), "-R", "-X", "stream", "-c", "fast", "--no-sync",
                 "-d", conninfo], PGPASSWORD=self.superuser_password)  # fmt: skip

    def in_recovery(self) -> bool:
        return bool(self.scalar("select pg_is_in_recovery()"))

    def caught_up(self, timeout: float = 30) -> None:
        """Wait until this standby has replayed everything the primary has written so far (to its WAL buffers:
        with synchronous_commit off a commit is acknowledged before its WAL is even written)."""
        target = self.primary.scalar("select pg_current_wal_insert_lsn()::text")

        def replayed() -> bool:
            return bool(self.scalar(f"select pg_wal_lsn_diff(pg_last_wal_replay_lsn(), '{target}') >= 0"))

        wait_for(replayed, timeout=timeout, what=f"the standby to replay the primary's WAL up to {target}")

    def promote(self, timeout: float = 30) -> None:
        """`pg_ctl promote`, waiting until the server takes writes."""
        self.pg(["pg_ctl", "promote", "-D", str(self.pgdata), "-w", "-t", str(int(timeout))],
                PGPASSWORD=self.superuser_password)  # fmt: skip
        wait_for(lambda: not self.in_recovery(), timeout=timeout, what="the promoted standby to leave recovery")


def failover_url(*servers: PostgresServer) -> str:
    """MAS_DATABASE_URL naming `servers` in order, in libpq's multi-host form."""
    first = servers[0]
    hosts = ",".join(f"{server.address}:{server.port}" for server in servers)
    return f"postgresql://studio:{first.password}@{hosts}/studio?target_session_attrs=read-write"
