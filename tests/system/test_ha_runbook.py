"""The operator's high-availability page (docs/operating/high-availability.md), run as written.

The page marks each block an operator runs with an HTML comment naming this file (not rendered). The test reads
those blocks from the page itself, so the page and the test cannot drift apart, and replaces only what the page
calls examples: the hosts `db-a` and `db-b` (here two hosts of the harness's test network, each PostgreSQL at
its address and the usual port 5432), the studio's network `10.0.0.0/24` (the test network's) and `$PGDATA`
(set in the steps' environment, as an operator's shell has it).

PostgreSQL, on real servers (`tests/harness`): the primary on db-a given the page's `postgresql.conf` lines
(restarted), its replication role (the page's SQL) and its `pg_hba.conf` lines; each host's `~/.pgpass`; the
standby made on db-b by the page's `pg_basebackup -R` step and streaming as that role. Then a failover that
leaves the old primary ahead of the standby: the standby's cable pulled, a write on the primary it never sees,
the primary killed, the standby promoted (`pg_ctl promote`) and written to. The page's rebuild (`pg_rewind` from
the new primary) makes the old primary its standby: it streams from it, sees its writes, and the write that
never reached the standby is gone. Each step runs as the user that runs PostgreSQL; the page's `pg_ctl start` and
`pg_ctl stop -m fast` are the harness's own start and fast stop of that server.

Redis: the page's one Sentinel password (the Sentinels' `requirepass` and `sentinel-pass`, the studio's
MAS_REDIS_SENTINEL_PASSWORD) against the harness's Sentinels, which run with it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.harness.network import Host, Network
from tests.harness.postgres_servers import PostgresServer, PostgresStandby
from tests.harness.processes import need_hosts, redis_server_available, wait_for
from tests.harness.redis_servers import RedisSentinels

pytestmark = pytest.mark.timeout(300)

PAGE = Path(__file__).resolve().parents[2] / "docs" / "operating" / "high-availability.md"
BLOCK = re.compile(r"<!-- (?:run|checked) by tests/system/test_ha_runbook\.py: (.+?) -->\n\n```\w*\n(.*?)```", re.S)
SETTINGS = ("full_page_writes=on",)  # the default the page assumes (pg_rewind needs it); the harness turns it off
PG_CTL: dict[tuple[str, ...], Callable[[PostgresServer], None]] = {
    ("pg_ctl", "-D", "$PGDATA", "start"): PostgresServer.start,
    ("pg_ctl", "-D", "$PGDATA", "stop", "-m", "fast"): PostgresServer.stop,  # SIGINT: fast; nothing if not running
}


def page_blocks() -> dict[str, str]:
    """The page's marked blocks, by the name in their marker."""
    blocks = dict(BLOCK.findall(PAGE.read_text()))
    assert blocks, f"no block of {PAGE.name} is marked for this test"
    return blocks


def commands(block: str) -> list[str]:
    """A shell block's commands: continued lines joined, blank lines dropped."""
    return [line for line in block.replace("\\\n", " ").splitlines() if line.strip()]


def run_steps(server: PostgresServer, block: str, home: Path) -> str:
    """Run a shell block's commands on `server`'s host as the user that runs PostgreSQL (its home `home`); their
    output."""
    output = []
    for command in commands(block):
        words = shlex.split(command, comments=True)
        if words[0] == "pg_ctl":
            assert tuple(words) in PG_CTL, f"the test does not know the page's step {command!r}"
            PG_CTL[tuple(words)](server)
        else:
            done = server.shell(command, HOME=str(home))
            output.append(done.stdout + done.stderr)
    return "\n".join(output)


def give_pgpass(server: PostgresServer, line: str) -> Path:
    """The page's `~/.pgpass` for the user that runs `server` (a home of that user's own on its host)."""
    home = server.cluster / "home"
    server.shell(f'mkdir "$HOME" && printf "%s\\n" {shlex.quote(line)} > "$HOME/.pgpass" && chmod 600 "$HOME/.pgpass"',
                 HOME=str(home))  # fmt: skip
    return home


def notes(server: PostgresServer) -> list[str]:
    """The rows written so far, in order, as `server` has them."""
    return list(server.scalar("select coalesce(array_agg(note order by id), '{}') from runbook", database="studio"))


def write(server: PostgresServer, note: str) -> None:
    server.scalar("insert into runbook (note) values (%s)", note, database="studio")


def seen_on(server: PostgresServer, note: str, timeout: float = 30) -> None:
    wait_for(lambda: note in notes(server), timeout=timeout, what=f"{note!r} to be seen on {server.address}")


def streaming_to(server: PostgresServer, standby: Host) -> bool:
    """Whether `server` streams WAL to `standby` as the page's role."""
    state = server.scalar(
        "select state from pg_stat_replication where usename = 'replicator' and client_addr = %s", standby.address
    )
    return state == "streaming"


@pytest.fixture
def hosts(tmp_path):
    """The test network with the page's two hosts."""
    need_hosts()
    with Network(tmp_path / "hosts") as network:
        yield network, network.host("db-a"), network.host("db-b")


def test_the_pages_steps_fail_over_and_rebuild_the_old_primary_as_a_standby(hosts, tmp_path):
    network, db_a, db_b = hosts
    blocks = page_blocks()

    def placed(name: str) -> str:
        """Block `name` with the page's example hosts and network replaced by the test network's."""
        text = blocks[name]
        for example, here in (("db-a", db_a.address), ("db-b", db_b.address), ("10.0.0.0/24", str(network.subnet))):
            text = text.replace(example, here)
        return text

    with PostgresServer(tmp_path / "db-a", host=db_a, vector=False, settings=SETTINGS) as primary:
        # 1. the settings, then a restart
        with (primary.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# the high-availability page's lines\n" + placed("postgresql.conf"))
        primary.stop()
        primary.start()
        assert primary.scalar("show wal_log_hints") == "on"
        assert primary.scalar("show full_page_writes") == "on"
        # 2. the replication role, pg_hba.conf (after the harness's own line for the test's superuser), ~/.pgpass
        primary.scalar(placed("replication role"))
        (primary.pgdata / "pg_hba.conf").write_text(
            f"local all postgres scram-sha-256\nhost all postgres {network.gateway}/32 scram-sha-256\n"
            + placed("pg_hba.conf")
        )
        primary.scalar("select pg_reload_conf()")
        assert primary.scalar("select count(*) from pg_hba_file_rules where error is not null") == 0
        home_a = give_pgpass(primary, placed(".pgpass").strip())
        primary.scalar("create table runbook (id serial primary key, note text not null)", database="studio")
        write(primary, "before the standby")

        # 3. the standby, made on db-b by the page's step
        def base_backup(standby: PostgresStandby) -> None:
            run_steps(standby, placed("the standby"), give_pgpass(standby, placed(".pgpass").strip()))

        with PostgresStandby(
            tmp_path / "db-b", primary, host=db_b, settings=SETTINGS, base_backup=base_backup
        ) as standby:
            wait_for(lambda: streaming_to(primary, db_b), timeout=30, what="db-a to stream to db-b as replicator")
            assert standby.in_recovery()
            assert standby.scalar("show wal_log_hints") == "on"
            write(primary, "streamed")
            seen_on(standby, "streamed")

            # the failover: the old primary gets ahead of the standby (a checkpoint the two have in common, then
            # WAL of its own in later segments), dies, and the standby is promoted
            primary.scalar("checkpoint")
            primary.scalar("select pg_switch_wal()")
            write(primary, "before the cut")
            seen_on(standby, "before the cut")
            # the standby stops receiving (no conninfo): a cut cable would not do, since the dead primary's kernel
            # still sends what its sockets held once the cable is back
            standby.scalar("alter system set primary_conninfo = ''")
            standby.scalar("select pg_reload_conf()")
            wait_for(lambda: not streaming_to(primary, db_b), timeout=30, what="db-b to stop receiving")
            for n in range(3):
                write(primary, f"never streamed {n}")
                primary.scalar("select pg_switch_wal()")
            primary.crash()
            standby.promote()
            write(standby, "after the failover")

            # the rebuild, on db-a, by the page's step
            rewound = run_steps(primary, placed("the rebuild"), home_a)
            assert "servers diverged at WAL location" in rewound, rewound
            assert "Done!" in rewound, rewound
            wait_for(lambda: streaming_to(standby, db_a), timeout=30, what="db-b to stream to db-a as replicator")
            assert primary.scalar("select pg_is_in_recovery()") is True
            write(standby, "after the rebuild")
            seen_on(primary, "after the rebuild")
            assert notes(primary) == notes(standby) == [
                "before the standby", "streamed", "before the cut", "after the failover", "after the rebuild",
            ]  # fmt: skip


def directives(block: str) -> dict[str, list[str]]:
    """A redis.conf or sentinel.conf's lines by directive (`sentinel NAME` counts as one): their arguments."""
    found: dict[str, list[str]] = {}
    for line in block.splitlines():
        words = shlex.split(line, comments=True)  # a rewritten sentinel.conf quotes its values
        if words:
            cut = 2 if words[0] == "sentinel" else 1
            found[" ".join(words[:cut])] = words[cut:]
    return found


@pytest.mark.skipif(bool(redis_server_available()), reason=str(redis_server_available()))
def test_every_sentinel_has_the_one_password_the_studio_is_given(tmp_path):
    blocks = page_blocks()
    redis, sentinel = directives(blocks["redis.conf"]), directives(blocks["sentinel.conf"])
    studio = dict(word.split("=", 1) for word in shlex.split(blocks["the studio's Sentinel settings"], comments=True))
    # the page: one Sentinel password, the Redis servers' another
    (sentinel_password,) = sentinel["requirepass"]
    assert sentinel["sentinel sentinel-pass"] == [sentinel_password]
    assert studio["MAS_REDIS_SENTINEL_PASSWORD"] == sentinel_password
    (redis_password,) = redis["requirepass"]
    assert redis["masterauth"] == [redis_password]
    master = studio["MAS_REDIS_SENTINEL_MASTER"]
    assert sentinel["sentinel monitor"][0] == master
    assert sentinel["sentinel auth-pass"] == [master, redis_password]
    assert {urlsplit(url).password for url in studio["MAS_BROKER_URL"].split(";")} == {redis_password}

    # the harness's servers: as the page sets them, and running with those passwords
    with RedisSentinels(tmp_path / "redis") as servers:
        one = servers.env()["MAS_REDIS_SENTINEL_PASSWORD"]
        assert one != servers.password
        for server in servers.servers:
            with server.client() as client:
                for name in ("requirepass", "masterauth", "appendonly", "maxmemory-policy"):
                    value = servers.password if redis[name] == [redis_password] else redis[name][0]
                    assert client.config_get(name) == {name: value}, name
        for each in servers.sentinels:
            written = directives(each.config.read_text())  # as the Sentinel rewrote it
            assert written["requirepass"] == written["sentinel sentinel-pass"] == [one]
            assert written["sentinel auth-pass"] == [servers.master_name, servers.password]
            assert each.ask("ping") is not None, f"the Sentinel on port {each.port} refuses the one password"
