"""The gpu worker's queue order: sticky to the queue that delivered last, with a bounded streak."""

from mas.runtime.queue_order import StickyCycle


def drain(cycle: StickyCycle, queues: dict[str, list[str]]) -> list[str]:
    """Deliver as BRPOP would: the first non-empty queue in the cycle's order, then tell the cycle."""
    served = []
    while any(queues.values()):
        queue = next(q for q in cycle.consume(len(cycle.items)) if queues[q])
        served.append(queues[queue].pop(0))
        cycle.rotate(queue)
    return served


def test_stays_with_the_queue_that_delivered_while_it_has_work():
    cycle = StickyCycle(["gpu-grade", "gpu"])
    assert cycle.items == ["gpu", "gpu-grade"]  # new queues join in name order: renders first on a fresh worker
    served = drain(cycle, {"gpu": ["r1", "r2"], "gpu-grade": ["g1", "g2", "g3"]})
    assert served == ["r1", "r2", "g1", "g2", "g3"]
    assert cycle.items[0] == "gpu-grade"  # the grade queue delivered last: it is polled first now


def test_a_render_arriving_during_gradings_waits_for_them():
    cycle = StickyCycle(["gpu", "gpu-grade"])
    queues = {"gpu": [], "gpu-grade": ["g1", "g2"]}
    served = [queues["gpu-grade"].pop(0)]
    cycle.rotate("gpu-grade")
    queues["gpu"].append("r1")  # a refinement render arrives while gradings wait
    served += drain(cycle, queues)
    assert served == ["g1", "g2", "r1"]


def test_streak_limit_gives_the_other_queue_a_turn():
    cycle = StickyCycle(["gpu", "gpu-grade"], streak_limit=2)
    served = drain(cycle, {"gpu": ["r1", "r2", "r3", "r4", "r5"], "gpu-grade": ["g1", "g2", "g3"]})
    assert served == ["r1", "r2", "g1", "g2", "r3", "r4", "g3", "r5"]


def test_streak_limit_keeps_serving_when_the_other_queue_is_empty():
    cycle = StickyCycle(["gpu", "gpu-grade"], streak_limit=1)
    assert drain(cycle, {"gpu": ["r1", "r2", "r3"], "gpu-grade": []}) == ["r1", "r2", "r3"]


def test_update_keeps_known_queues_in_place():
    cycle = StickyCycle(["gpu", "gpu-grade"])
    cycle.rotate("gpu-grade")
    cycle.update({"gpu", "gpu-grade", "extra"})
    assert cycle.items == ["gpu-grade", "gpu", "extra"]
    cycle.update({"gpu"})
    assert cycle.items == ["gpu"]
    assert cycle.rotate("gone") == "gone" and cycle.items == ["gpu"]


def test_urgent_work_goes_first_whatever_the_sticky_order():
    cycle = StickyCycle(["gpu", "gpu-grade", "gpu-urgent"])
    queues = {"gpu": ["r1", "r2"], "gpu-grade": ["g1"], "gpu-urgent": []}
    served = [queues["gpu"].pop(0)]
    cycle.rotate("gpu")
    queues["gpu-urgent"] += ["u1", "u2"]  # an A/B test arrives during the batch
    served += drain(cycle, queues)
    assert served == ["r1", "u1", "u2", "r2", "g1"]  # and the batch stays sticky to renders afterwards


def test_a_stream_of_urgent_work_does_not_starve_the_batch():
    cycle = StickyCycle(["gpu", "gpu-urgent"], urgent_streak_limit=2)
    served = drain(cycle, {"gpu": ["r1", "r2"], "gpu-urgent": ["u1", "u2", "u3", "u4", "u5"]})
    assert served == ["u1", "u2", "r1", "u3", "u4", "r2", "u5"]
