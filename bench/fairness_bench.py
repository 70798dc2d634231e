"""Fair share of the GPU between users, through a real ComfyUI rendering fixed-time renders.

A real studio (PostgreSQL, Redis, a cpu worker with 2 processes, one gpu worker) renders through a real
ComfyUI 0.3.75 whose weightless workflow takes `--seconds` per render; every video is accepted at its first
attempt (quality_standards.MAX_RETRIES = 1), so each video is one render. Which user a render was for comes
from ComfyUI's own history (the prompt id is the attempt's render id in PostgreSQL), and when it started from
ComfyUI's own clock.

1. A newcomer: user ana asks for `--videos` videos; ben asks for one video `--rounds` times during her batch,
   each time after `--head-start` more of her renders.
   Reported: the time from ben's request (his batch row) to his render's start, and how many of ana's
   renders started in between, against the bound the fair queue promises: the render in progress, the ones
   already handed to ComfyUI (MAS_GPU_LOOKAHEAD) and the prompts already written ahead of the GPU
   (MAS_WRITE_AHEAD), plus ben's own agent calls. Without fair sharing, ben waits for all of ana's videos.
2. Shares 3:1: ana (share 3) and ben (share 1) each ask for `--shared` videos at the same moment; the renders
   of each among those that started while both still had videos waiting, against 3:1.

Both users' batches are cancelled once the figure is taken.

    python bench/fairness_bench.py --videos 100 --shared 60 --seconds 1.0
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.comfyui_bench import studio_env
from bench.harness import command_line, machine, new_data_dir
from mas import db
from mas.models import Attempt, Batch, Video, VideoState
from tests.comfyui_real import RealComfyUI, Render
from tests.studio import IsolatedStudio


def owners(studio: IsolatedStudio, renders: list[Render]) -> list[tuple[Render, str]]:
    """Each render ComfyUI ran, with the user whose video it was (by the attempt's render id)."""
    with db.session_scope(studio.settings) as session:
        by_render = dict(
            session.execute(
                sa.select(Attempt.render_id, Batch.user_name)
                .join(Video, Video.id == Attempt.video_id)
                .join(Batch, Batch.id == Video.batch_id)
                .where(Attempt.render_id.in_([r.prompt_id for r in renders]))
            ).all()
        )
    return [(r, by_render[r.prompt_id]) for r in renders if r.prompt_id in by_render]


def enqueue(studio: IsolatedStudio, user: str, request: str) -> tuple[int, float]:
    result = studio.mas("enqueue", "--user", user, request)
    assert result.returncode == 0, result.stderr
    batch_id = int(result.stdout.split()[1].rstrip(":"))
    with db.session_scope(studio.settings) as session:
        return batch_id, session.get(Batch, batch_id).created_at.timestamp()


def cancel(studio: IsolatedStudio, *batch_ids: int) -> None:
    for batch_id in batch_ids:
        studio.mas("cancel", str(batch_id))
    studio.wait_quiet(timeout=300)


def rendered(studio: IsolatedStudio, batch_id: int) -> int:
    with db.session_scope(studio.settings) as session:
        return session.scalar(
            sa.select(sa.func.count()).select_from(Video).where(Video.batch_id == batch_id, Video.state.in_(
                [VideoState.grading, VideoState.reviewing, VideoState.accepted, VideoState.failed]))
        ) or 0  # fmt: skip


def newcomer(studio: IsolatedStudio, server: RealComfyUI, *, videos: int, head_start: int, rounds: int) -> list[dict]:
    """ana's long batch; ben asks for one video `rounds` times, each after `head_start` more of ana's renders."""
    server.clear()
    ana, _ = enqueue(studio, "ana", f"Create {videos} videos of lighthouses")
    results = []
    for round_ in range(1, rounds + 1):
        studio.wait_until(lambda n=round_: rendered(studio, ana) >= n * head_start, timeout=900, what="ana's renders")
        ben, asked = enqueue(studio, "ben", "Create 1 video of owls")
        studio.wait_until(lambda ben=ben: rendered(studio, ben) >= 1, timeout=600, what="ben's render")
        runs = owners(studio, server.renders())
        mine = {r.prompt_id for r in server.renders()} & set(_render_ids(studio, ben))
        ben_start = next(r.started for r, _ in runs if r.prompt_id in mine)
        between = sum(1 for r, user in runs if user == "ana" and asked <= r.started < ben_start)
        results.append({"wait_s": ben_start - asked, "ana_between": between, "ana_left": videos - rendered(studio, ana)})
        print(results[-1], flush=True)
    cancel(studio, ana)
    return results


def _render_ids(studio: IsolatedStudio, batch_id: int) -> list[str]:
    with db.session_scope(studio.settings) as session:
        return list(
            session.scalars(
                sa.select(Attempt.render_id).join(Video, Video.id == Attempt.video_id).where(Video.batch_id == batch_id)
            )
        )


def shared(studio: IsolatedStudio, server: RealComfyUI, *, videos: int) -> dict:
    server.clear()
    with db.session_scope(studio.settings) as session:  # the shares, as `mas users` keeps them
        session.execute(sa.text("insert into users (name, role, gpu_share) values ('ana', 'member', 3), "
                                "('ben', 'member', 1) on conflict (name) do update set gpu_share = excluded.gpu_share"))
    ana, _ = enqueue(studio, "ana", f"Create {videos} videos of lighthouses")
    ben, _ = enqueue(studio, "ben", f"Create {videos} videos of owls")
    studio.wait_until(lambda: rendered(studio, ben) >= videos // 4, timeout=1800, what="a quarter of ben's renders")
    runs = owners(studio, server.renders())
    cancel(studio, ana, ben)
    counts = {"ana": 0, "ben": 0}
    for _, user in runs:  # both had videos waiting throughout: at 3:1 ana has rendered about 3/4 of hers
        counts[user] += 1
    return {"ana": counts["ana"], "ben": counts["ben"], "ratio": counts["ana"] / max(counts["ben"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--videos", type=int, default=100, help="ana's batch in the newcomer run")
    parser.add_argument("--head-start", type=int, default=5, help="ana's renders done before ben asks")
    parser.add_argument("--rounds", type=int, default=5, help="times ben asks for one video during ana's batch")
    parser.add_argument("--shared", type=int, default=60, help="each user's batch in the 3:1 run")
    parser.add_argument("--seconds", type=float, default=1.0, help="GPU time of one render")
    parser.add_argument("--lookahead", type=int, default=1)
    parser.add_argument("--write-ahead", type=int, default=2)
    args = parser.parse_args()
    data_dir = new_data_dir("mas-fairness-bench-")
    with RealComfyUI(data_dir / "comfyui") as server:
        env = studio_env(server.url, data_dir, seconds=args.seconds, lookahead=args.lookahead, renders=args.videos)
        env["MAS_WRITE_AHEAD"] = str(args.write_ahead)
        with IsolatedStudio(data_dir / "studio", **env) as studio:
            studio.worker("cpu", concurrency=2)
            studio.worker("gpu")
            assert studio.mas("memory", "set", "quality_standards", "MAX_RETRIES", "1").returncode == 0
            warm, _ = enqueue(studio, "default", "Create 2 videos of harbours")
            studio.wait_batch(warm, timeout=300)
            first = newcomer(studio, server, videos=args.videos, head_start=args.head_start, rounds=args.rounds)
            second = shared(studio, server, videos=args.shared)
            print(second, flush=True)
    bound = 1 + args.lookahead + args.write_ahead
    rows = [
        f"| newcomer, round {n} | {r['wait_s']:.1f} s | {r['ana_between']} (bound {bound}) | {r['ana_left']} |"
        for n, r in enumerate(first, 1)
    ]
    print("\n".join([
        f"\n{command_line(__file__)}\n{machine()}\n",
        f"Bound on ana's renders started while ben's video waits: {bound} (1 in progress + {args.lookahead} "
        f"lookahead + {args.write_ahead} written ahead).\n",
        "| run | ben's wait, request to render start | ana's renders started in that wait | ana's videos still "
        "to render (what he waited for before) |", "| --- | --- | --- | --- |", *rows,
        "",
        f"Shares 3:1, each asking for {args.shared} at once: renders ana : ben while both waited = "
        f"{second['ana']} : {second['ben']} = {second['ratio']:.2f} (3.00 +- 10 %: 2.70 to 3.30).",
    ]))


if __name__ == "__main__":
    main()
