"""The suite's own grouping under pytest-xdist: a test module runs in one process, so its servers start once.

`tests/conftest.py` names each module a group; `--dist loadgroup` is what reads the groups. A pytest that
pytest-xdist cannot mark them on distributes the tests one by one instead, with nothing failing: this
test is what notices.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_test_module_runs_whole_in_one_process_under_loadgroup(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    module = "tests/unit/test_roles.py"
    # a base folder of its own: a pytest without one closes its per-user temporary folder to its owner at its start, and
    # the suite's embedded PostgreSQL, which runs as another user under it when we are root, then loses its
    # data folder (it stopped at its next checkpoint, and every later test on it failed)
    inner = ["--basetemp", str(tmp_path / "inner")]
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *inner, "-n", "2", "--dist", "loadgroup", "-v", module],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = re.findall(rf"\[(gw\d+)\] \[\s*\d+%\] PASSED {re.escape(module)}::\w+@(\S+)", run.stdout)
    assert len(ran) >= 5, run.stdout[-3000:]  # every test carries its group
    assert {group for _, group in ran} == {module} and len({worker for worker, _ in ran}) == 1, ran
