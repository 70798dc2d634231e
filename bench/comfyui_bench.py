"""Does the GPU wait on the studio? The same renders through ComfyUI alone and through mas, in one run.

Every figure of the ComfyUI runs comes from ComfyUI's own history (when it queued, started and ended each
prompt, by its clock), not from the studio's task events. The server is a real ComfyUI 0.3.75
(`scripts/comfyui-env.sh`) rendering a weightless workflow whose node takes a fixed time per render.

1. ComfyUI alone: N prompts posted at once straight to its queue (the best a GPU can be kept busy).
2. mas, one gpu worker (MAS_GPU_LOOKAHEAD renders queued ahead): a warm studio (workers up, a first batch
   done), then a batch of N videos from a request; every video is accepted at its first attempt
   (quality_standards.MAX_RETRIES = 1), so both runs render the same N prompts.
3. mas, two gpu workers, each with its own ComfyUI server (two GPUs), the same N videos.
4. The in-process path (preview renderer of the same fixed duration), from the gpu worker's own record of
   when its GPU was held (its GPU turns): gap between consecutive turns.

Reported: busy fraction while there was work (sum of render times / first start to last end), gap
between consecutive renders (median, p90), wall time (ComfyUI alone: first queued to last ended; mas:
request accepted to last render ended, and to batch done), their ratio, time from the request to the first
render's start, and the throughput of two workers against one.

    python bench/comfyui_bench.py --renders 20 --seconds 1.0
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import itertools

from bench.harness import command_line, machine, new_data_dir
from tests.comfyui_real import NODE_MAP, RealComfyUI, Render, timed_workflow, write_workflow
from tests.studio import IsolatedStudio


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """Renders as their GPU record has them: (start, end) seconds per GPU, in start order, and when work
    began. With several GPUs, gaps and busy fractions are each GPU's own (averaged for busy)."""

    per_gpu: list[list[tuple[float, float]]]
    asked_at: float  # when the work was asked for (first prompt queued / request accepted)
    done_at: float | None = None  # when the studio said the batch was done

    @property
    def spans(self) -> list[tuple[float, float]]:
        return sorted(span for spans in self.per_gpu for span in spans)

    @property
    def gaps(self) -> list[float]:
        return [max(0.0, b[0] - a[1]) for spans in self.per_gpu for a, b in itertools.pairwise(spans)]

    @property
    def busy(self) -> float:
        fractions = [sum(e - s for s, e in spans) / (spans[-1][1] - spans[0][0]) for spans in self.per_gpu if spans]
        return sum(fractions) / len(fractions)

    @property
    def wall(self) -> float:
        return self.spans[-1][1] - self.asked_at

    @property
    def first_render(self) -> float:
        return self.spans[0][0] - self.asked_at

    def row(self, name: str, base: Timeline | None) -> str:
        gaps = sorted(self.gaps) or [0.0]
        p90 = gaps[min(len(gaps) - 1, int(0.9 * len(gaps)))]
        ratio = f"{self.wall / base.wall:.3f}" if base else "1"
        done = f"{self.done_at - self.asked_at:.2f} s" if self.done_at else "-"
        return (f"| {name} | {len(self.spans)} | {100 * self.busy:.1f} % | {1000 * statistics.median(gaps):.1f} ms | "
                f"{1000 * p90:.1f} ms | {self.wall:.2f} s | {done} | {ratio} | {self.first_render:.2f} s |")


def spans_of(renders: list[Render]) -> list[tuple[float, float]]:
    return sorted((r.started, r.ended) for r in renders if r.status == "success")


def comfyui_alone(server: RealComfyUI, *, renders: int, seconds: float) -> Timeline:
    server.clear()
    workflow = timed_workflow(seconds=seconds)
    for n in range(renders):
        workflow["1"]["inputs"].update(text=f"a lighthouse, render {n}", seed=n)
        httpx.post(server.url + "/prompt", json={"prompt": workflow, "prompt_id": str(uuid.uuid4())}, timeout=30)
    while True:
        queue = server.queue()
        if not queue["queue_running"] and not queue["queue_pending"]:
            break
        time.sleep(0.2)
    done = server.renders()
    return Timeline(per_gpu=[spans_of(done)], asked_at=min(r.extra["create_time"] / 1000 for r in done))


def studio_env(url: str, data_dir: Path, *, seconds: float, lookahead: int, renders: int) -> dict[str, str]:
    data_dir.mkdir(parents=True, exist_ok=True)
    workflow = write_workflow(data_dir / "workflow.json", seconds=seconds)
    return {
        "MAS_VIDEO_BACKEND": "comfyui", "MAS_COMFYUI_URL": url, "MAS_COMFYUI_WORKFLOW": str(workflow),
        "MAS_COMFYUI_NODES": json.dumps(NODE_MAP), "MAS_VIDEO_FRAMES": "8", "MAS_VIDEO_FPS": "12",
        "MAS_GPU_LOOKAHEAD": str(lookahead), "MAS_MAX_BATCH_VIDEOS": str(max(renders, 100)),
    }


def start_batch(studio: IsolatedStudio, request: str, servers: list[RealComfyUI]) -> tuple[int, float]:
    """Enqueue `request` with `mas enqueue`; its id and when the studio accepted it (the batch row's time,
    so the command's own start-up is not in the figure)."""
    from mas import db
    from mas.models import Batch

    for server in servers:
        server.clear()
    batch_id = studio.enqueue(request)
    with db.session_scope(studio.settings) as session:
        return batch_id, session.get(Batch, batch_id).created_at.timestamp()


def through_mas(servers: list[RealComfyUI], data_dir: Path, *, renders: int, seconds: float, lookahead: int) -> Timeline:
    env = studio_env(servers[0].url, data_dir, seconds=seconds, lookahead=lookahead, renders=renders)
    with IsolatedStudio(data_dir / "studio", **env) as studio:
        studio.worker("cpu", concurrency=2)
        for n, server in enumerate(servers):
            studio.worker("gpu", MAS_COMFYUI_URL=server.url, MAS_GPU_DEVICE=f"cuda:{n}")
        assert studio.mas("memory", "set", "quality_standards", "MAX_RETRIES", "1").returncode == 0
        batch_id, _ = start_batch(studio, "Create 2 videos of harbours", servers)  # the studio warms up
        studio.wait_batch(batch_id, timeout=300)
        batch_id, asked_at = start_batch(studio, f"Create {renders} videos of lighthouses", servers)
        studio.wait_batch(batch_id, timeout=60 + 20 * renders * seconds)
        done_at = time.time()
    return Timeline(per_gpu=[spans_of(server.renders()) for server in servers], asked_at=asked_at, done_at=done_at)


def in_process(data_dir: Path, *, renders: int, seconds: float, lookahead: int) -> Timeline:
    """The preview renderer of the same duration; the GPU record is the worker's GPU turns."""
    from mas import names
    from mas.runtime.clients import redis_client

    env = {"MAS_PREVIEW_RENDER_SECONDS": str(seconds), "MAS_GPU_LOOKAHEAD": str(lookahead),
               "MAS_MAX_BATCH_VIDEOS": str(max(renders, 100))}
    with IsolatedStudio(data_dir / f"inprocess-{lookahead}", **env) as studio:
        studio.worker("cpu", concurrency=2)
        studio.worker("gpu")
        assert studio.mas("memory", "set", "quality_standards", "MAX_RETRIES", "1").returncode == 0
        batch_id, _ = start_batch(studio, "Create 2 videos of harbours", [])
        studio.wait_batch(batch_id, timeout=300)
        batch_id, asked_at = start_batch(studio, f"Create {renders} videos of lighthouses", [])
        studio.wait_batch(batch_id, timeout=60 + 20 * renders * seconds)
        done_at = time.time()
        client = redis_client(studio.settings)
        (key,) = list(client.scan_iter(match=names.GPU_STATS_PREFIX + "*"))
        turns = json.loads(client.get(key))["recent_turns"]
    spans = sorted((start, end) for start, end, what in turns if start >= asked_at)
    renders_only = [(s, e) for s, e, what in turns if s >= asked_at and what.startswith("render")]
    timeline = Timeline(per_gpu=[spans], asked_at=asked_at, done_at=done_at)
    print(f"in-process lookahead {lookahead}: {len(renders_only)} renders, {len(spans) - len(renders_only)} gradings")
    return timeline


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--renders", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=1.0, help="GPU time of one render")
    parser.add_argument("--lookahead", type=int, default=1)
    args = parser.parse_args()
    data_dir = new_data_dir("mas-comfyui-bench-")
    header = ("| run | renders | busy | gap median | gap p90 | wall (to last render) | to batch done | wall ratio | "
              "first render |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    with RealComfyUI(data_dir / "comfyui-a") as first, RealComfyUI(data_dir / "comfyui-b") as second:
        alone = comfyui_alone(first, renders=args.renders, seconds=args.seconds)
        rows.append(alone.row("ComfyUI alone", None))
        print(rows[-1], flush=True)
        one = through_mas([first], data_dir / "one", renders=args.renders, seconds=args.seconds, lookahead=args.lookahead)
        rows.append(one.row(f"mas, 1 gpu worker (lookahead {args.lookahead})", alone))
        print(rows[-1], flush=True)
        two = through_mas([first, second], data_dir / "two", renders=args.renders, seconds=args.seconds,
                          lookahead=args.lookahead)
        rows.append(two.row(f"mas, 2 gpu workers, a ComfyUI each (lookahead {args.lookahead})", alone))
        print(rows[-1], flush=True)
    gpu_rows = []
    for lookahead in (0, args.lookahead):
        timeline = in_process(data_dir, renders=args.renders, seconds=args.seconds, lookahead=lookahead)
        gpu_rows.append(timeline.row(f"in process, lookahead {lookahead} (GPU turns: renders and gradings)", None))
        print(gpu_rows[-1], flush=True)
    span = lambda t: t.spans[-1][1] - t.spans[0][0]  # noqa: E731
    throughput = (len(two.spans) / span(two)) / (len(one.spans) / span(one))
    end_to_end = (len(two.spans) / two.wall) / (len(one.spans) / one.wall)
    print("\n".join([
        f"\n{command_line(__file__)}\n{machine()}\n", header, *rows, "",
        f"2 gpu workers / 1: {throughput:.2f}x renders per second of rendering, {end_to_end:.2f}x request to last render",
        "", header, *gpu_rows,
    ]))


if __name__ == "__main__":
    main()
