"""GPU queue benchmark: busy fraction, orchestration overhead per video, model swaps per batch.

Runs a real studio (embedded PostgreSQL and Redis, a cpu worker with 2 processes, one gpu worker) with the
preview renderer set to a fixed simulated render time, enqueues one batch, and records the gpu worker's
task events (task-started / task-succeeded). From that timeline:

- GPU busy fraction: time inside gpu tasks / time from the first gpu task's start to the last one's end;
- overhead per video: GPU idle time (gaps between gpu tasks) divided by the number of videos;
- model swaps: how often consecutive gpu tasks need a different model (render <-> grade), i.e. the swaps a
  residency budget that holds one of the two models would make. Three orders are compared: sticky (the
  default: gradings on their own queue, the worker stays with one kind while it has work), first come first
  served on one queue (MAS_GPU_GROUPING=false), and the naive per-video order of the seed (each video rendered
  and graded before the next, so every gpu task but the first swaps: computed from the same batch's tasks).

    python bench/gpu_bench.py --videos 50 --render-seconds 1.0
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the isolated-studio harness of the test suite lives in tests/


def run(*, videos: int, render_seconds: float, grouping: bool) -> dict:
    from mas.runtime.app import Studio
    from tests.studio import IsolatedStudio

    with tempfile.TemporaryDirectory(prefix="mas-gpu-bench-") as tmp:
        Path(tmp).chmod(0o755)
        env = {"MAS_PREVIEW_RENDER_SECONDS": str(render_seconds), "MAS_GPU_GROUPING": str(grouping).lower(),
               "MAS_MAX_BATCH_VIDEOS": str(max(videos, 100))}
        with IsolatedStudio(Path(tmp), **env) as studio:
            studio.worker_args = ["-E"]
            app = Studio(studio.settings)
            events: list[tuple[str, str, float]] = []
            names: dict[str, str] = {}
            stop = threading.Event()

            def listen() -> None:
                def on_event(event: dict) -> None:
                    if event["type"] == "task-received":
                        names[event["uuid"]] = event["name"]
                    elif event["type"] in ("task-started", "task-succeeded") and event["hostname"].startswith("gpu"):
                        events.append((event["type"], event["uuid"], event["timestamp"]))

                with app.connection() as conn:
                    receiver = app.events.Receiver(conn, handlers={"*": on_event})
                    while not stop.is_set():
                        try:
                            receiver.capture(limit=None, timeout=1, wakeup=False)
                        except (TimeoutError, OSError):
                            continue

            listener = threading.Thread(target=listen, daemon=True)
            listener.start()
            studio.worker("cpu", concurrency=2)
            studio.worker("gpu")
            time.sleep(1)
            started = time.monotonic()
            batch_id = studio.enqueue(f"Create {videos} videos of lighthouses")
            studio.wait_batch(batch_id, timeout=videos * render_seconds * 6 + 120)
            wall = time.monotonic() - started
            time.sleep(1.5)
            stop.set()
            listener.join(5)
    spans: dict[str, list[float]] = {}
    for kind, uuid, ts in events:
        spans.setdefault(uuid, [0.0, 0.0])[0 if kind == "task-started" else 1] = ts
    timeline = sorted((s, e, names.get(u, "?")) for u, (s, e) in spans.items() if s and e)
    busy = sum(e - s for s, e, _ in timeline)
    span = timeline[-1][1] - timeline[0][0]
    gaps = sum(max(0.0, b[0] - a[1]) for a, b in itertools.pairwise(timeline))
    kinds = ["render" if "generate" in n else "grade" for _, _, n in timeline]
    swaps = sum(a != b for a, b in itertools.pairwise(kinds))
    return {
        "grouping": grouping, "videos": videos, "gpu_tasks": len(timeline), "renders": kinds.count("render"),
        "busy_fraction": busy / span, "overhead_per_video_s": gaps / videos, "swaps": swaps,
        "per_video_swaps": len(timeline) - 1, "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=50)
    parser.add_argument("--render-seconds", type=float, default=1.0, help="simulated render time")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    for grouping in (True, False):
        r = run(videos=args.videos, render_seconds=args.render_seconds, grouping=grouping)
        print(
            f"{'sticky' if grouping else 'fifo  '}: {r['videos']} videos, {r['gpu_tasks']} gpu tasks "
            f"({r['renders']} renders), GPU busy {r['busy_fraction']:.1%}, overhead "
            f"{r['overhead_per_video_s'] * 1000:.0f} ms/video, model swaps {r['swaps']} "
            f"(per-video order: {r['per_video_swaps']}), wall {r['wall_s']:.0f} s"
        )


if __name__ == "__main__":
    main()
