"""The studio across three hosts, on real servers over TCP with passwords, broken on purpose (the harness's
`Topology` of THREE_HOSTS: Redis restarted mid-batch, a host cut off mid-step and let back, the gpu worker killed
mid-render), and `mas up` as a role that may not create the vector extension."""

from __future__ import annotations

import base64
import os
import re
import subprocess
import sys
import time
import urllib.request

import pytest
import sqlalchemy as sa
from celery import Celery

from tests.harness.postgres_servers import PostgresServer
from tests.harness.processes import need_hosts, wait_for
from tests.harness.s3_server import S3Server
from tests.harness.topology import CpuHost, Topology, clean_env
from tests.studio import ROOT

pytestmark = pytest.mark.timeout(900)

RECOVERY_LIMIT_S = 30  # each fault: the work it hit moves on within this (it took 105-175 s before)


def test_a_batch_across_three_hosts_survives_a_broker_restart_a_network_cut_and_a_gpu_worker_killed(tmp_path):
    need_hosts()
    total = 16
    with Topology(tmp_path) as studio:
        started = time.monotonic()
        batch_id = studio.enqueue(total)
        recovery = studio.break_it(batch_id, total)
        studio.wait_accepted(batch_id, total)
        print(f"wall {time.monotonic() - started:.1f} s; recovery after each fault (s): {recovery}")

        with studio.engine.connect() as conn:
            status = conn.scalar(sa.text("select status from batches where id = :b"), {"b": batch_id})
            attempts = conn.execute(sa.text(
                "select a.video_id, a.number, a.output_path from attempts a join videos v on v.id = a.video_id "
                "where v.batch_id = :b"), {"b": batch_id}).all()  # fmt: skip
        assert status == "done"
        assert len(attempts) == total  # every video accepted at its first attempt: no attempt failed
        renders = studio.renders()  # no attempt rendered twice, but a render that ended as the kill came
        twice = {attempt for attempt, count in renders.items() if count > 1}  # (its result was never recorded)
        assert len(renders) == total and max(renders.values()) <= 2 and twice <= studio.finished_at_kill, (
            renders, studio.finished_at_kill)  # fmt: skip
        assert max(recovery.values()) < RECOVERY_LIMIT_S, recovery

        # no worker left dead: every process runs and answers; a worker that took over says so
        b, c = studio.cpu["B"], studio.cpu["C"]
        assert b.proc.poll() is None and c.proc.poll() is None and studio.gpu.proc.poll() is None
        assert "Unrecoverable error" not in b.log.read_text() + c.log.read_text()
        assert "gpu@A took over the steps its previous run left" in studio.gpu.log.read_text()
        answered = Celery(broker=studio.broker.url).control.ping(timeout=3)
        assert {"cpu@B", "cpu@C", "gpu@A"} <= {name for reply in answered for name in reply}, answered

        # no password in any log or output
        for text in [*(log.read_text() for log in studio.logs()), *studio.outputs]:
            assert not any(secret in text for secret in studio.secrets)

        # the videos are in the bucket, and a cpu host lists and serves every one of them
        assert {row.output_path.removeprefix("s3://videos/") for row in attempts} <= set(studio.s3.keys())
        listed = c.mas("videos", "--batch", str(batch_id))
        assert listed.returncode == 0, listed.stderr
        paths = re.findall(r"^video \d+: (\S+)$", listed.stdout, flags=re.M)
        assert len(paths) == total, listed.stdout
        check = c.host.run([sys.executable, "-c", "import sys, os; print(all(os.path.getsize(p) > 1000 "
                            "for p in sys.argv[1:]))", *paths], env=c.env)  # fmt: skip
        assert check.stdout.strip() == "True", (check.stdout, check.stderr)
        _gallery_serves_every_video(b, attempts, studio.s3)


def _gallery_serves_every_video(host: CpuHost, attempts, s3: S3Server) -> None:
    env = {**host.env, "MAS_GALLERY_USER": "viewer", "MAS_GALLERY_PASSWORD": "gallery-secret"}
    log = host.host.storage / "gallery.log"
    port = 8765
    proc = host.host.popen([sys.executable, "-m", "mas.cli", "serve", "--host", host.host.address, "--port",
                            str(port)], env=env, cwd=ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT)  # fmt: skip
    auth = "Basic " + base64.b64encode(b"viewer:gallery-secret").decode()

    def get(path: str) -> bytes:
        request = urllib.request.Request(f"http://{host.host.address}:{port}{path}", headers={"Authorization": auth})
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.read()

    def answering() -> bool:
        try:
            get("/")
            return True
        except OSError:
            assert proc.poll() is None, log.read_text()
            return False

    try:
        wait_for(answering, timeout=60, what="the gallery on host B", interval=0.3)
        client = s3.client()
        for row in attempts:
            key = row.output_path.removeprefix("s3://videos/")
            served = get("/files/" + key)
            assert served == client.get_object(Bucket="videos", Key=key)["Body"].read()
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_mas_up_as_a_role_that_may_not_create_the_vector_extension_says_what_to_run(tmp_path):
    """A managed PostgreSQL's login role is no superuser: one line naming the command, then success once a
    superuser has created the extension."""
    need_hosts()
    with PostgresServer(tmp_path / "pg", vector=False) as pg:
        env = clean_env(MAS_DATABASE_URL=pg.url, MAS_DATA_DIR=str(tmp_path / "mas"))
        env.pop("MAS_BROKER_URL", None)
        try:
            _up_twice(pg, env)
        finally:  # `mas up` started an embedded Redis in the data folder: stop it with the test
            subprocess.run([sys.executable, "-m", "mas.cli", "down"], env=env, cwd=ROOT, capture_output=True,
                           timeout=180)  # fmt: skip


def _up_twice(pg: PostgresServer, env: dict[str, str]) -> None:
    """`mas up` as the role: refused in one line naming the command; then, once the extension exists, done."""
    up = subprocess.run([sys.executable, "-m", "mas.cli", "up"], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=180)  # fmt: skip
    assert up.returncode != 0
    lines = [line for line in up.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, up.stderr
    assert "CREATE EXTENSION vector" in lines[0] and "superuser" in lines[0], lines
    assert pg.password not in up.stderr
    with sa.create_engine(pg.superuser_url.rsplit("/", 1)[0] + "/studio").begin() as conn:
        conn.execute(sa.text("create extension vector"))
    up = subprocess.run([sys.executable, "-m", "mas.cli", "up"], env=env, cwd=ROOT, capture_output=True,
                        text=True, timeout=180)  # fmt: skip
    assert up.returncode == 0, up.stderr
    with sa.create_engine(pg.url).connect() as conn:
        assert conn.scalar(sa.text("select count(*) from videos")) == 0  # the schema is there
