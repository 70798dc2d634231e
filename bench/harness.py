"""What every benchmark shares: the machine line and the command line of a report, a scratch data folder.

Benchmarks start real services and workers through the test suite's launcher (`tests.studio`), so a
benchmark measures exactly what the tests exercise.
"""

from __future__ import annotations

import os
import platform
import shlex
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def machine() -> str:
    """Cores, CPU model, memory, GPU and OS, for the header of a report."""
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as info:
            cpu = next(line.split(":", 1)[1].strip() for line in info if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    try:
        import torch

        gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except ImportError:
        gpu = "torch not installed"
    return (
        f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {gpu}; {platform.system()} "
        f"{platform.release()}; Python {platform.python_version()}"
    )


def command_line(script: str) -> str:
    """How this run was started, relative to the repository, for a report to be re-run as written."""
    return "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(script, ROOT), *sys.argv[1:]])


def new_data_dir(prefix: str) -> Path:
    """A temporary data folder that the embedded PostgreSQL can enter (as root it runs as another user).

    The caller removes it when the run ends (with the services it started there stopped first).
    """
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(data_dir, 0o755)
    return data_dir


def remove_data_dir(settings, data_dir: Path) -> None:
    """Stop the embedded PostgreSQL a run started in `data_dir` (none when a server URL was given), then
    delete the folder."""
    from mas.runtime import services

    if settings.embedded_database:
        services.stop_postgres(settings)
    shutil.rmtree(data_dir, ignore_errors=True)


PACKAGES = ("mas", "torch", "transformers", "sentence-transformers", "onnxruntime", "celery", "redis", "psycopg", "sqlalchemy")


def provenance(extra: dict[str, str] | None = None) -> str:
    """The commit (with "+changes" when the tree differs from it), the date and the versions behind a report."""
    import subprocess
    from datetime import UTC, datetime
    from importlib import metadata

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    if git("status", "--porcelain", "--untracked-files=no"):
        commit += "+changes"
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    versions |= extra or {}
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    return f"Commit {commit}, {when}; " + ", ".join(f"{k} {v}" for k, v in versions.items())
