#!/usr/bin/env bash
# Build the Letta server's own virtualenv for the Letta tests (tests/test_letta.py), in one command:
#
#   bash scripts/letta-server-env.sh            # build the cached server virtualenv (nothing to do if current)
#   bash scripts/letta-server-env.sh --force    # rebuild from scratch
#   LETTA_VENV=some/dir bash scripts/letta-server-env.sh
#
# Why it is built this way (checked on these machines):
# - letta 0.16.8 is the last PyPI release that contains the server (later `letta` releases are a terminal
#   app), and it cannot live in the studio's own virtualenv: its pins clash with ours;
# - its wheel has no migrations and no pins; its sdist has both: alembic/ + alembic.ini, and the uv.lock
#   the release was tested with (an unpinned install fails to import). So: download the sdist, keep its
#   alembic files under $VENV/letta-src (the tests run `alembic upgrade head` from there), export the
#   pins from uv.lock with uv, install them, then letta itself without dependencies;
# - psycopg2 (a source build that needs pg_config) is left out: psycopg2-binary, pg8000 (migrations) and
#   asyncpg (the server) come from the `postgres` extra's pins.
# uv (from PyPI, installed into the new virtualenv) exports the lock and installs ~260 pinned packages in
# well under a minute; pip would take several.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.16.8
# Outside the checkout and keyed by version, so a fresh clone (CI) reuses a build made once on this machine.
VENV=${LETTA_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mas/letta-venv-$VERSION}
MARKER="$VENV/mas-letta-ready"
PYTHON=${PYTHON:-python3}

if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(cat "$MARKER")" == "letta==$VERSION" ]]; then
    echo "letta-server-env: $VENV is ready (letta==$VERSION); --force rebuilds it"
    exit 0
fi

start=$(date +%s)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
VENV=$(cd "$VENV" && pwd)  # absolute from here on
# the tools that read the release's lock, pinned: the server's own packages come from that lock
"$VENV/bin/python" -m pip install -q --disable-pip-version-check uv==0.13.9 hatchling==1.33.0

# the sdist (metadata prepared in place by hatchling: no isolated build environment to set up)
"$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: \
    --no-build-isolation "letta==$VERSION" -d "$work"
tar -xzf "$work/letta-$VERSION.tar.gz" -C "$work"
src="$work/letta-$VERSION"
mkdir -p "$VENV/letta-src"
cp -r "$src/alembic" "$src/alembic.ini" "$src/uv.lock" "$src/pyproject.toml" "$VENV/letta-src/"

# the pins of the release, for the server and PostgreSQL
(cd "$src" && "$VENV/bin/uv" export --frozen --no-dev --extra postgres --extra server \
    --no-hashes --no-emit-project --no-header --quiet -o "$work/pins.txt")
grep -v -E '^psycopg2==' "$work/pins.txt" > "$work/pins-binary.txt"
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" -r "$work/pins-binary.txt"
"$VENV/bin/uv" pip install --quiet --python "$VENV/bin/python" --no-deps "letta==$VERSION"

# the server, its migrations' drivers and its async driver import with these pins
# (from $work: importing the app writes an openapi_letta.json into the working directory)
(cd "$work" && "$VENV/bin/python" -W ignore -c "import letta.server.rest_api.app, asyncpg, pg8000, alembic" >/dev/null)
test -x "$VENV/bin/letta" && test -x "$VENV/bin/alembic"

echo "letta==$VERSION" > "$MARKER"
echo "letta-server-env: built $VENV (letta==$VERSION, $(du -sh "$VENV" | cut -f1)) in $(( $(date +%s) - start )) s"
