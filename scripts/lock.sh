#!/usr/bin/env bash
# Refresh the lock of the studio's virtualenv, then check it: resolve every dependency afresh (the newest
# releases the ranges in pyproject.toml allow) in a new virtualenv, write what was installed to lock/studio.txt,
# and run the lint, the type check and the fast tier against exactly that.
#
#   bash scripts/lock.sh
#
# The README's commands and CI install with `-c lock/studio.txt`, so a fresh clone installs what was tested;
# commit the new lock only when this passes. The servers the tests build (scripts/*-env.sh) are locked the same
# way in lock/comfyui.txt and lock/llm-server.txt: `bash scripts/lock.sh --servers` rebuilds them unlocked and
# writes those too.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="dev,docs,gpu,train,letta"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
PY="$work/venv/bin/python"
"$PY" -m pip install -q --disable-pip-version-check --upgrade pip
# torch first: its CPU build, so pip never pulls a CUDA build
"$PY" -m pip install -q --disable-pip-version-check torch==2.13.0
"$PY" -m pip install -q --disable-pip-version-check -e ".[$EXTRAS]"
{
    echo "# The studio's virtualenv as tested: every package and version (pip, torch's CPU build and the test,"
    echo "# lint and docs tools included). Installed with \`pip install -c lock/studio.txt ...\`; refreshed by"
    echo "# \`bash scripts/lock.sh\`, which resolves afresh and runs the fast tier on the result."
    "$PY" -m pip freeze --all --exclude-editable --disable-pip-version-check | grep -v -i -E '^(mas|setuptools|wheel)=='
} > "$work/studio.txt"

# the new lock in place for the checks (its own test reads it), the old one back if they fail
cp lock/studio.txt "$work/studio.old"
cp "$work/studio.txt" lock/studio.txt
if ! (
    . "$work/venv/bin/activate"
    ruff check mas tasks gpu beat_schedule.py tests bench
    ruff format --check mas tasks gpu beat_schedule.py
    mypy
    python -m pytest -q -p no:cacheprovider tests/unit
); then
    cp "$work/studio.old" lock/studio.txt
    echo "lock: the checks failed on the fresh resolution; lock/studio.txt left as it was" >&2
    exit 1
fi
echo "lock: lock/studio.txt written ($(grep -c '==' lock/studio.txt) packages); the fast tier passed on it"

if [[ "${1:-}" == "--servers" ]]; then
    MAS_UNLOCKED=1 bash scripts/comfyui-env.sh --force
    MAS_UNLOCKED=1 bash scripts/llm-server-env.sh --force
fi
