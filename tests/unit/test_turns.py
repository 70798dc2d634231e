"""GPU turns inside one gpu worker: one holder at a time, priority with a bounded head start, a watchdog."""

import itertools
import threading
import time

import pytest

from gpu.turns import GpuTurns, rank


def hold_in_threads(turns: GpuTurns, jobs: list[tuple[str, str]], *, first_holds: float = 0.3) -> list[str]:
    """Start `jobs` (name, priority) while a first turn holds the GPU; the order they got it in."""
    order: list[str] = []
    holding = threading.Event()

    def first():
        with turns.turn(what="first", limit_seconds=60):
            holding.set()
            time.sleep(first_holds)

    def job(name, priority):
        with turns.turn(what=name, priority=priority, limit_seconds=60):
            order.append(name)

    threads = [threading.Thread(target=first)]
    threads[0].start()
    holding.wait(5)
    for n, (name, priority) in enumerate(jobs, start=1):
        t = threading.Thread(target=job, args=(name, priority))
        t.start()
        threads.append(t)
        while turns.waiting < n:  # arrival order: this one is in line before the next one starts
            time.sleep(0.001)
        time.sleep(0.002)  # and its rank's clock reading is behind the next one's
    for t in threads:
        t.join(10)
    return order


def test_one_holder_at_a_time_and_first_come_first_served():
    turns = GpuTurns(head_start_seconds=600)
    assert hold_in_threads(turns, [("a", "normal"), ("b", "normal"), ("c", "normal")]) == ["a", "b", "c"]
    intervals = list(turns.busy)
    assert len(intervals) == 4
    assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(intervals))  # never overlapping


def test_high_priority_passes_waiting_normal_work():
    turns = GpuTurns(head_start_seconds=600)
    assert hold_in_threads(turns, [("n1", "normal"), ("n2", "normal"), ("h", "high")]) == ["h", "n1", "n2"]


def test_the_head_start_is_bounded_so_old_work_keeps_its_place():
    assert rank("high", head_start_seconds=10, now=1000) == 990
    assert rank("normal", head_start_seconds=10, now=1000) == 1000
    assert rank("normal", head_start_seconds=10, now=985) < rank("high", head_start_seconds=10, now=1000)
    turns = GpuTurns(head_start_seconds=0.0)  # no head start: high work waits its turn like the rest
    assert hold_in_threads(turns, [("n1", "normal"), ("h", "high")]) == ["n1", "h"]


def test_a_turn_past_its_limit_is_told_and_a_stuck_one_ends_the_worker():
    stuck = threading.Event()
    turns = GpuTurns(head_start_seconds=0, grace_seconds=0.5, on_stuck=stuck.set)
    with turns.turn(what="a hung model call", limit_seconds=0.2) as turn:
        assert not turn.expired()
        time.sleep(0.3)
        assert turn.expired()
        assert stuck.wait(5)  # the watchdog's verdict, within a second of limit + grace


def test_a_failing_holder_gives_the_gpu_back():
    turns = GpuTurns(head_start_seconds=0)
    with pytest.raises(RuntimeError), turns.turn(what="failing", limit_seconds=5):
        raise RuntimeError("model error")
    with turns.turn(what="next", limit_seconds=5):
        pass
    assert len(turns.busy) == 2 and turns.waiting == 0


def test_a_gpu_worker_per_gpu_gets_its_own_name_and_threads_for_its_lookahead(tmp_path):
    from mas.config import Settings
    from mas.runtime.processes import worker_argv

    def argv(**settings):
        return worker_argv(Settings(data_dir=tmp_path, **settings), "gpu")

    first, second = argv(gpu_device="cuda:0"), argv(gpu_device="cuda:1")
    assert first[first.index("-n") + 1] == "gpu-cuda0@%h" and second[second.index("-n") + 1] == "gpu-cuda1@%h"
    plain = argv(gpu_lookahead=2)
    assert plain[plain.index("-n") + 1] == "gpu@%h"
    assert plain[plain.index("-P") + 1] == "threads" and plain[plain.index("-c") + 1] == "3"
    assert plain[plain.index("-Q") + 1] == "gpu-urgent,gpu,gpu-grade"


def test_settings_refuse_a_visibility_timeout_shorter_than_a_gpu_task_may_be_held(tmp_path):
    from pydantic import ValidationError

    from mas.config import Settings

    with pytest.raises(ValidationError, match="MAS_GPU_LOOKAHEAD"):
        Settings(data_dir=tmp_path, max_render_seconds=1800, gpu_lookahead=3, visibility_timeout_seconds=7200)
    with pytest.raises(ValidationError, match="MAS_GPU_DEVICE"):
        Settings(data_dir=tmp_path, gpu_device="gpu zero")
