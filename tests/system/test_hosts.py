"""Self-test of the harness's hosts and servers (tests/harness): a host in its own namespaces reaches the
servers on host A, sees only its own folder under the hosts root, drops off the network when cut and comes back
when healed; Redis keeps its queues over a restart."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness.network import Host, Network
from tests.harness.postgres_servers import PostgresServer
from tests.harness.processes import need_hosts, wait_for
from tests.harness.redis_servers import RedisServer

ROOT = Path(__file__).resolve().parents[2]

need_hosts(module=True)
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def servers(tmp_path_factory) -> Iterator[tuple[Network, RedisServer, PostgresServer]]:
    base = tmp_path_factory.mktemp("hosts")
    with Network(base / "hosts") as network:
        a = base / "hosts" / "A"
        with (
            RedisServer(a / "redis", address=network.gateway) as redis,
            PostgresServer(a / "postgres", address=network.gateway) as postgres,
        ):
            yield network, redis, postgres


def on_host(host: Host, code: str, *, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet on `host`, from the repository (importable there as on host A)."""
    return host.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, timeout=timeout)


REACH_REDIS = textwrap.dedent("""
    import sys, time, redis
    started = time.monotonic()
    try:
        ok = redis.Redis.from_url(sys.argv[1], socket_connect_timeout=2, socket_timeout=2).ping()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        print(f"unreachable after {time.monotonic() - started:.1f} s: {exc!r}")
        sys.exit(3)
    print("pong" if ok else "no")
""")


def test_host_reaches_the_servers_on_host_a(servers) -> None:
    network, redis, postgres = servers
    b = network.host("B")
    assert b.address != network.gateway
    result = b.run([sys.executable, "-c", REACH_REDIS, redis.url], cwd=ROOT)
    assert result.returncode == 0 and result.stdout.strip() == "pong", result
    result = on_host(
        b,
        f"""
        import psycopg
        with psycopg.connect({postgres.url.replace("+psycopg", "")!r}, connect_timeout=5) as conn:
            print(conn.execute("select '[1,2,3]'::vector").fetchone()[0])
            print(conn.execute("select rolsuper, rolcreatedb from pg_roles where rolname = current_user").fetchone())
            print(conn.execute("select inet_server_addr()").fetchone()[0])
        """,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:3] == ["[1,2,3]", "(False, False)", network.gateway], result.stdout


def test_host_sees_only_its_own_folder(servers) -> None:
    network, _, _ = servers
    c = network.host("C")
    a_file = network.hosts_root / "A" / "secret.txt"
    a_file.parent.mkdir(parents=True, exist_ok=True)
    a_file.write_text("host A's")
    result = c.run(
        [
            "sh",
            "-c",
            'ls -A "$1"; test ! -e "$2" && echo "mine" > "$3/mine.txt" && ls -A "$3"',
            "sh",
            str(network.hosts_root),
            str(a_file),
            str(c.root),
        ],
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["C", "mine.txt"]  # the root holds C's folder only; A's file unseen
    assert not (network.hosts_root / "C" / "mine.txt").exists()  # not visible outside under the root
    assert (c.storage / "mine.txt").read_text() == "mine\n"  # kept for C's next processes
    result = c.run(["cat", str(c.root / "mine.txt")])
    assert result.stdout == "mine\n", result


def test_cut_and_heal(servers) -> None:
    network, redis, _ = servers
    d = network.host("D")
    d.cut()
    result = d.run([sys.executable, "-c", REACH_REDIS, redis.url], cwd=ROOT)
    assert result.returncode == 3 and "unreachable after" in result.stdout, result
    assert float(result.stdout.split()[2]) < 2.5, result.stdout  # a connect timeout, within the 2 s asked
    d.heal()
    answers: list = []  # a connection refused in the moment the link comes back is tried again
    wait_for(
        lambda: (
            answers.append(d.run([sys.executable, "-c", REACH_REDIS, redis.url], cwd=ROOT))
            or answers[-1].stdout.strip() == "pong"
        ),
        timeout=20,
        what="host D to reach Redis again",
    )


def test_redis_keeps_a_list_over_a_restart(servers) -> None:
    _, redis, _ = servers
    with redis.client() as client:
        client.delete("queue")
        client.rpush("queue", "one", "two")
    redis.restart(2)
    with redis.client() as client:
        assert client.lrange("queue", 0, -1) == [b"one", b"two"]


def test_postgres_restart_and_no_vector(tmp_path) -> None:
    with PostgresServer(tmp_path / "pg", vector=False) as postgres:
        import psycopg

        url = postgres.url.replace("+psycopg", "")
        with psycopg.connect(url, autocommit=True) as conn:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("create extension vector")
            conn.execute("create table kept (x int)")
            conn.execute("insert into kept values (7)")
        postgres.stop()
        postgres.start()
        with psycopg.connect(url) as conn:
            assert conn.execute("select x from kept").fetchall() == [(7,)]
