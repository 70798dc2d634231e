"""ARCHITECTURE.md's worked "add a step", done for real: the three edits it lists, applied to a copy of the
studio, and a batch run through that copy by real workers (embedded PostgreSQL and Redis, the preview
renderer). Every attempt then passes through the new step between render and grade, and the videos end
accepted. If the walk-through stops being three edits (a fourth place that names the steps), this fails.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

UPSCALE_STEP = '''    Step(
        name="upscale",
        task="gpu.tasks.upscale_video",
        queue=names.GPU_QUEUE,
        state=S.upscaling,
        leads_to=(S.grading,),
        work="the upscaler doubles the render's size",
        retry=ON_THE_GPU,
        time_limit=lambda settings: settings.gpu.max_render_seconds,
        on_gpu=True,
    ),
'''

UPSCALE_BODY = '''

class Upscale:
    """Upscale the attempt's render (here: the render as it is; a real body writes the larger file)."""

    def prepare(self, run: StepRun, session: Session, video: Video) -> str:
        return states.attempt_row(session, video.id, run.attempt).output_path or ""

    def work(self, run: StepRun, location: str) -> str:
        return location

    def record(self, run: StepRun, session: Session, video: Video, location: str) -> Outcome:
        states.attempt_row(session, video.id, run.attempt).output_path = location
        return Outcome(state=run.step.next_state)


upscale_video = step_task(BY_NAME["upscale"], Upscale())
'''


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, f"{path.name}: the walk-through's anchor {old!r} is not there once"
    path.write_text(text.replace(old, new))


def _three_edits(root: Path) -> None:
    """The edits ARCHITECTURE.md lists, and nothing else."""
    steps = root / "mas" / "domain" / "steps.py"  # 1. the table: the new entry, and render leads to it
    render_leads = 'state=S.rendering,\n        leads_to=(S.grading,),'
    _edit(steps, render_leads, 'state=S.rendering,\n        leads_to=(S.upscaling,),')
    _edit(steps, '    Step(\n        name="grade",', UPSCALE_STEP + '    Step(\n        name="grade",')
    states = root / "mas" / "domain" / "states.py"  # 2. its state
    _edit(states, '    rendering = "rendering"\n', '    rendering = "rendering"\n    upscaling = "upscaling"\n')
    tasks = root / "gpu" / "tasks.py"  # 3. its body, registered
    tasks.write_text(tasks.read_text() + UPSCALE_BODY)


RUN_A_BATCH = """
import json, sys
from pathlib import Path
import sqlalchemy as sa
from mas import db
from tests.studio import IsolatedStudio

with IsolatedStudio(Path(sys.argv[1])) as studio:
    studio.worker("cpu", concurrency=2)
    studio.worker("gpu")
    batch = studio.enqueue("Create 2 videos of lighthouses")
    studio.wait_batch(batch, timeout=float(sys.argv[2]))
    with db.session_scope(studio.settings) as s:
        steps = s.execute(sa.text("select video_id, attempt, step from step_leases order by started_at")).all()
        ended = s.execute(sa.text("select state from videos")).scalars().all()
print(json.dumps({"steps": [list(row) for row in steps], "ended": ended}))
"""


@pytest.fixture
def copy_of_the_studio():
    with tempfile.TemporaryDirectory(prefix="mas-add-a-step-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # as root, the embedded PostgreSQL runs as another user that must enter its folder
        for name in ("mas", "tasks", "gpu", "tests"):
            shutil.copytree(ROOT / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "beat_schedule.py", root)
        (root / "data").mkdir(mode=0o755)
        yield root


def test_a_step_added_in_three_edits_runs_in_every_attempt(copy_of_the_studio):
    root = copy_of_the_studio
    _three_edits(root)
    env = {key: value for key, value in os.environ.items() if not key.startswith("MAS_")}
    env["PYTHONPATH"] = str(root)
    run = subprocess.run(
        [sys.executable, "-c", RUN_A_BATCH, str(root / "data"), "240"],
        cwd=root, env=env, capture_output=True, text=True, timeout=420,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ended"] == ["accepted", "accepted"], result
    attempts: dict[tuple[int, int], list[str]] = {}
    for video_id, attempt, step in result["steps"]:
        attempts.setdefault((video_id, attempt), []).append(step)
    assert attempts and all(
        steps == ["write", "render", "upscale", "grade", "review"] for steps in attempts.values()
    ), attempts
