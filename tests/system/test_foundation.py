"""Settings, migrations, the video state machine, routing, and a chain and a chord on real workers."""

import itertools
import os
import subprocess
import sys
import time
from unittest import mock

import pytest
import sqlalchemy as sa

from mas import db
from mas.models import Batch, Video, VideoState
from mas.pipeline import states


@pytest.mark.usefixtures("settings")
def test_migrations_down_and_up(engine):
    """Up from nothing, down to nothing and up again, in a scratch database of the same server (the session's
    workers keep theirs: tables dropped under them would break their cached statements)."""
    name = f"mas_migrations_{os.getpid()}"
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(sa.text(f"drop database if exists {name}"))
        conn.execute(sa.text(f"create database {name}"))
    scratch = sa.create_engine(engine.url.set(database=name))
    try:
        db.migrate(scratch)
        db.downgrade(scratch, "base")
        with scratch.connect() as conn:
            assert "videos" not in sa.inspect(conn).get_table_names()
        db.migrate(scratch)
        with scratch.connect() as conn:
            insp = sa.inspect(conn)
            tables = set(insp.get_table_names())
            assert {"batches", "videos", "attempts", "memory_blocks", "archival_passages", "webhook_events"} <= tables
            indexes = {i["name"]: i for i in insp.get_indexes("archival_passages")}
            assert "ix_archival_embedding_hnsw" in indexes
            assert conn.execute(sa.text("select extversion from pg_extension where extname='vector'")).scalar()
    finally:
        scratch.dispose()
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(sa.text(f"drop database if exists {name}"))



def test_a_session_opens_no_pid_file_and_starts_nothing(clean):
    """The database is found once, when the process starts (here: the session's fixture); a transaction only
    opens a session on it. Nothing under the embedded server's folder is opened (its postmaster.pid), no process
    is inspected (psutil reads /proc), and the lookup and the start are never called."""
    opened: list[str] = []
    watching = True

    def count_opens(event: str, args: tuple) -> None:
        if watching and event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
            path = os.fsdecode(args[0])
            if path.startswith((str(clean.pgdata), "/proc/")):
                opened.append(path)

    sys.addaudithook(count_opens)  # an audit hook cannot be removed: it stops counting when the test ends
    refuse = mock.Mock(side_effect=AssertionError("session_scope looked for the server"))
    try:
        with (
            mock.patch("mas.runtime.services.postmaster", refuse),
            mock.patch("mas.runtime.services.start_postgres", refuse),
        ):
            for _ in range(3):
                with db.session_scope(clean) as s:
                    assert s.scalar(sa.text("select 1")) == 1
    finally:
        watching = False
    assert opened == [] and not refuse.called


def _video(session) -> int:
    batch = Batch(request="r", theme="t", total=1)
    session.add(batch)
    session.flush()
    video = Video(batch_id=batch.id, position=1, concept="c", attempt_count=1)
    session.add(video)
    session.flush()
    return video.id


def test_state_machine_guards(clean):
    with db.session_scope(clean) as s:
        vid = _video(s)
    with db.session_scope(clean) as s:
        assert states.transition(s, vid, VideoState.writing, VideoState.rendering, attempt=1)
    with db.session_scope(clean) as s:  # the same message delivered again: no-op
        assert not states.transition(s, vid, VideoState.writing, VideoState.rendering, attempt=1)
    with db.session_scope(clean) as s:  # the wrong attempt: no-op
        assert not states.transition(s, vid, VideoState.rendering, VideoState.grading, attempt=2)
    with pytest.raises(states.IllegalTransition), db.session_scope(clean) as s:
        states.transition(s, vid, VideoState.rendering, VideoState.accepted)
    with db.session_scope(clean) as s:
        assert s.get(Video, vid).state == VideoState.rendering
        assert states.fail(s, vid, "stuck")
        assert not states.fail(s, vid, "stuck again")
    with db.session_scope(clean) as s:
        v = s.get(Video, vid)
        assert v.state == VideoState.failed and v.failure_reasons == ["stuck"]


def test_routing_by_package(settings):
    from mas.runtime.app import app_for

    app = app_for(settings)
    router = app.amqp.router
    assert router.route({}, "gpu.tasks.generate_video")["queue"].name == "gpu"
    assert router.route({}, "gpu.health.ping")["queue"].name == "gpu"
    # preview renders (like ComfyUI's) leave the grader loaded: a grading follows its render in one queue
    assert not settings.groups_gpu_work
    assert router.route({}, "gpu.tasks.evaluate_video")["queue"].name == "gpu"
    from mas.runtime.app import celery_config

    for grouping, queue in ((True, "gpu-grade"), (False, "gpu"), ("auto", "gpu")):
        routes = celery_config(settings.model_copy(update={"gpu_grouping": grouping}))["task_routes"]
        assert routes["gpu.tasks.evaluate_video"] == {"queue": queue}
    in_process = settings.model_copy(update={"video_backend": "diffusers"})
    assert celery_config(in_process)["task_routes"]["gpu.tasks.evaluate_video"] == {"queue": "gpu-grade"}
    assert router.route({}, "tasks.pipeline.plan_batch")["queue"].name == "cpu"
    conf = app.conf
    assert conf.task_acks_late and conf.task_reject_on_worker_lost
    assert conf.broker_transport_options["visibility_timeout"] > settings.gpu.max_render_seconds
    assert conf.result_backend_transport_options["visibility_timeout"] > settings.gpu.max_render_seconds
    assert conf.accept_content == ["json"]


@pytest.mark.usefixtures("workers")
def test_chain_and_chord_across_queues(settings):
    from celery import chain, chord

    from mas.runtime.app import app_for

    app = app_for(settings)

    gpu_ping = app.signature("gpu.health.ping", args=["g"])
    cpu_ping = app.signature("tasks.health.ping", args=["c"])
    res = chain(app.signature("gpu.health.ping", args=["g"]), app.signature("tasks.health.ping")).apply_async()
    assert res.get(timeout=60)["worker"] == "cpu@test"
    assert res.parent.get(timeout=5)["worker"] == "gpu@test"
    joined = chord([gpu_ping, cpu_ping, gpu_ping.clone()])(app.signature("tasks.health.collect")).get(timeout=60)
    assert joined == {"queues": ["cpu", "gpu", "gpu"], "count": 3}


@pytest.mark.usefixtures("workers")
def test_gpu_task_lands_only_on_gpu_worker(settings):
    from mas.runtime.app import app_for

    app = app_for(settings)

    results = [app.send_task("gpu.health.ping") for _ in range(3)]
    assert {r.get(timeout=60)["worker"] for r in results} == {"gpu@test"}


@pytest.mark.usefixtures("workers")
def test_beat_schedule_names_registered_tasks(settings):
    import beat_schedule
    from mas.runtime.app import app_for

    app = app_for(settings)

    registered = set(app.control.inspect(destination=["cpu@test"], timeout=5).registered()["cpu@test"])
    for entry in beat_schedule.schedule(settings).values():
        assert entry["task"] in registered
    assert app.send_task("tasks.maintenance.maintain_buffers").get(timeout=60)[0]["action"] == "ok"


@pytest.mark.usefixtures("workers")
def test_gpu_worker_stays_with_one_kind_of_work_while_it_has_work(settings):
    """Renders and gradings queued interleaved run as two runs, not alternating (fewer model swaps)."""
    from mas.runtime.app import app_for

    app = app_for(settings)
    from mas.names import GPU_QUEUE, GRADE_QUEUE

    for queue in (GPU_QUEUE, GRADE_QUEUE):  # hold the gpu worker off while the work is queued
        app.control.cancel_consumer(queue, destination=["gpu@test"], reply=True, timeout=5)
    try:
        results = [
            app.send_task("gpu.health.ping", args=[f"{queue}-{i}"], queue=queue)
            for i in range(4)
            for queue in (GRADE_QUEUE, GPU_QUEUE)
        ]
    finally:
        for queue in (GPU_QUEUE, GRADE_QUEUE):
            app.control.add_consumer(queue, destination=["gpu@test"], reply=True, timeout=5)
    answers = sorted((r.get(timeout=60) for r in results), key=lambda a: a["answered_at"])
    order = [a["queue"] for a in answers]
    assert sorted(order) == [GPU_QUEUE] * 4 + [GRADE_QUEUE] * 4
    assert sum(a != b for a, b in itertools.pairwise(order)) == 1, order
    assert all(a["worker"] == "gpu@test" for a in answers)


def test_a_queue_gives_work_that_finishes_a_started_video_first(clean):
    """Reviews and gradings before refinements before new videos, each level first come, first served: the
    levels are the Redis transport's priority lists (the same polling order serves a worker's BRPOP)."""
    from kombu import Queue

    from mas.domain.steps import BY_NAME, FINISH, NEW, REFINE, message_priority
    from mas.runtime.app import app_for

    write, grade, review = BY_NAME["write"], BY_NAME["grade"], BY_NAME["review"]
    assert message_priority(review, 1, grouped=False) == message_priority(grade, 1, grouped=False) == FINISH
    assert message_priority(write, 2, grouped=False) == REFINE and message_priority(write, 1, grouped=False) == NEW
    assert message_priority(grade, 1, grouped=True) == NEW  # grouped: at the renders' level, the worker stays
    queue = Queue("mas-test-order", routing_key="mas-test-order")
    with app_for(clean).connection_for_write() as conn:
        producer = conn.Producer(serializer="json")
        for i in range(3):
            for level in (NEW, REFINE, FINISH):  # newest work sent first
                producer.publish({"level": level, "i": i}, routing_key=queue.name, declare=[queue], priority=level)
        with conn.SimpleQueue(queue) as taken:
            order = []
            for _ in range(9):
                message = taken.get(timeout=10)
                order.append((message.payload["level"], message.payload["i"]))
                message.ack()
    assert order == [(level, i) for level in (FINISH, REFINE, NEW) for i in range(3)]


def test_cpu_pool_processes_preload_the_embedding_model(workers):
    """Each cpu pool process loads MiniLM as it starts (in the background); the gpu worker never does."""
    cpu, gpu = workers
    deadline = time.monotonic() + 90
    while cpu.log.read_text().count("embedding model loaded in") < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert cpu.log.read_text().count("embedding model loaded in") == 2  # -c 2: once per process
    assert "embedding model" not in gpu.log.read_text()


def test_a_step_lease_counts_only_take_overs_from_a_dead_holder(clean):
    """A delivery that ended (a retry, a duplicate passing through) does not count toward giving the step up;
    a lease whose holder died does, and past MAS_MAX_DELIVERIES of those the step is given up."""
    from mas.pipeline import leases

    with db.session_scope(clean) as s:
        vid = _video(s)
    where = {"video_id": vid, "attempt": 1, "step": "render", "worker": "gpu@test"}
    first = leases.claim(clean, **where)
    assert first is not None and first.claims == 1
    assert leases.claim(clean, **where) is None  # held and alive: another delivery leaves it alone
    leases.release(clean, first)
    for _ in range(clean.reliability.max_deliveries + 2):  # ended normally each time: never counted
        again = leases.claim(clean, **where)
        assert again is not None and again.claims == 1
        leases.check_claims(clean, again)
        leases.release(clean, again)
    assert leases.claim(clean, **where) is not None  # held again: now its holder dies, again and again
    for died in range(1, clean.reliability.max_deliveries + 1):  # the holder dies: its heartbeat stops, the next takes over
        with db.session_scope(clean) as s:
            s.execute(sa.text("update step_leases set heartbeat_at = now() - interval '1 day' where video_id = :v"),
                      {"v": vid})
        taken = leases.claim(clean, **where)
        assert taken is not None and taken.claims == 1 + died
    with pytest.raises(leases.StepGivenUp):
        leases.check_claims(clean, taken)


def test_reconcile_ends_the_dead_leases_of_final_videos_only(clean):
    """A lease whose release was lost (a failover's unreplicated commit) on a video that is final is ended by
    reconcile; a dead lease of a video still at work is left to the next delivery, a live one to its holder."""
    from mas.pipeline import leases
    from tasks.recovery import reconcile

    with db.session_scope(clean) as s:
        vids = [_video(s) for _ in range(3)]
    for vid in vids:
        assert leases.claim(clean, video_id=vid, attempt=1, step="review", worker="cpu@gone") is not None
    with db.session_scope(clean) as s:
        s.execute(sa.text("update videos set state = 'accepted' where id = any(:v)"), {"v": vids[:2]})
        s.execute(sa.text("update step_leases set heartbeat_at = now() - interval '1 day' where video_id = any(:v)"),
                  {"v": [vids[0], vids[2]]})  # fmt: skip
    reconcile(clean, older_than=3600)
    assert leases.running(clean) == {vids[1]} and leases.dead(clean) == {vids[2]}


def test_a_restarted_worker_and_recover_take_over_the_leases_of_holders_that_are_gone(clean):
    """A worker started again under its name ends at once the live leases its dead processes held (not those of
    a live process of it, nor another worker's); `mas recover` ends those of workers that did not answer once
    their heartbeat missed a beat, and leaves an answering worker's alone."""
    from mas.pipeline import leases

    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)  # a process that has exited
    with db.session_scope(clean) as s:
        vids = [_video(s) for _ in range(4)]
    holders = {vids[0]: f"gpu@a/{dead_pid}", vids[1]: f"gpu@a/{os.getpid()}", vids[2]: f"gpu@b/{dead_pid}",
               vids[3]: f"cpu@c/{dead_pid}"}
    for vid, holder in holders.items():
        node, pid = holder.split("/")
        with mock.patch("os.getpid", return_value=int(pid)):
            assert leases.claim(clean, video_id=vid, attempt=1, step="render", worker=node) is not None
    assert leases.running(clean) == set(vids)
    assert leases.take_over_predecessors(clean, "gpu@a") == {vids[0]}
    assert leases.dead(clean) == {vids[0]}
    assert leases.expire_unanswered(clean, answering={"gpu@a", "cpu@c"}) == set()  # no beat missed yet
    with db.session_scope(clean) as s:
        s.execute(sa.text("update step_leases set heartbeat_at = heartbeat_at - make_interval(secs => :s)"),
                  {"s": 2 * clean.reliability.lease_heartbeat_seconds})
    assert leases.expire_unanswered(clean, answering={"gpu@a", "cpu@c"}) == {vids[2]}  # gpu@b is gone or cut off
    assert leases.running(clean) == {vids[1], vids[3]}
    # what `mas status` and `mas enqueue --wait` show meanwhile: the steps whose worker stopped beating
    from mas.reports import queries

    waiting = queries.waiting_on_recovery(clean)
    assert set(waiting) == set(vids)  # every heartbeat here is late (the dead ones and the aged live ones)
    assert waiting[vids[2]] == "render on gpu@b stopped answering; waiting on recovery"
