#!/usr/bin/env bash
# Build the specdecode-exporter container image without a daemon or a registry, and optionally run it.
#
#   scripts/build-image.sh [--local-base] [--smoke] [--tag IMAGE]
#
#   --local-base  build the base image locally (Debian bookworm + python3 + python3-venv, by debootstrap from
#                 Debian's package mirror) instead of pulling docker.io/library/python:3.11-slim-bookworm;
#                 for machines that reach Debian's packages but no container registry. Made once, then reused.
#   --smoke       run the built image with podman the way Kubernetes runs the sidecar (read-only root
#                 filesystem, uid 65532, all capabilities dropped, no-new-privileges) against the simulator
#                 (also from the image), with the request tap on, and check from inside the sidecar's container:
#                 /healthz, the HEALTHCHECK, specdecode_up 1, a windowed specdecode_acceptance_ratio, the status
#                 page, and a completion through the tap (the client's answer as the simulator gives it, the
#                 request counted). Both containers are removed afterwards. `make test` runs this.
#   --tag IMAGE   image name (default localhost/specdecode-exporter:<version from pyproject.toml>)
#
# Needs: buildah (and debootstrap for --local-base, podman + runc for --smoke):
#   scripts/install-deploy-tools.sh --image
# Needs root and Debian's packages; the base is built once (a few minutes), then each build takes about 1.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml | head -n1)"
TAG="localhost/specdecode-exporter:${VERSION}"
LOCAL_BASE=0
SMOKE=0
BASE_IMAGE="docker.io/library/python:3.11-slim-bookworm"
LOCAL_BASE_IMAGE="localhost/specdecode-base:py3.11-bookworm"

while [ "$#" -gt 0 ]; do
  case "$1" in
    --local-base) LOCAL_BASE=1 ;;
    --smoke) SMOKE=1 ;;
    --tag) TAG="$2"; shift ;;
    -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done

log() { echo "build-image: $*"; }
need() { command -v "$1" >/dev/null 2>&1 || { echo "build-image: $1 missing (scripts/install-deploy-tools.sh --image)" >&2; exit 1; }; }
need buildah
[ -f README.md ] || { echo "build-image: README.md missing (pyproject.toml's readme; the image build copies it)" >&2; exit 1; }

WORK="$(mktemp -d)"
CONTAINERS=()
cleanup() {
  for c in "${CONTAINERS[@]}"; do podman "${PODMAN_OPTS[@]}" rm -f "$c" >/dev/null 2>&1 || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- base image ----
if [ "$LOCAL_BASE" -eq 1 ]; then
  if buildah inspect --type image "$LOCAL_BASE_IMAGE" >/dev/null 2>&1; then
    log "reusing local base $LOCAL_BASE_IMAGE"
  else
    need debootstrap
    log "debootstrap bookworm (minbase + python3, python3-venv) -> $LOCAL_BASE_IMAGE"
    rootfs="$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates bookworm "$rootfs" \
      http://deb.debian.org/debian >"$WORK/debootstrap.log" 2>&1 \
      || { tail -n 20 "$WORK/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    ctr="$(buildah from scratch)"
    mnt="$(buildah mount "$ctr")"
    cp -a "$rootfs/." "$mnt/"
    buildah umount "$ctr" >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
      --cmd python3 "$ctr"
    buildah commit --quiet --rm "$ctr" "$LOCAL_BASE_IMAGE" >/dev/null
  fi
  BASE_IMAGE="$LOCAL_BASE_IMAGE"
fi

# ---- build ----
# When the host's pip trusts a custom CA bundle (a TLS-inspecting proxy in front of PyPI), lend it and a
# pip.conf pointing at it to the build's RUN steps; nothing of it stays in the image.
BUILD_VOLUMES=()
host_cert="${PIP_CERT:-}"
for pip in "$ROOT/.venv/bin/pip" pip3 pip; do
  [ -n "$host_cert" ] && break
  command -v "$pip" >/dev/null 2>&1 && host_cert="$("$pip" config get global.cert 2>/dev/null || true)"
done
if [ -n "$host_cert" ] && [ -f "$host_cert" ]; then
  cp "$host_cert" "$WORK/ca.crt"
  printf '[global]\ncert = /run/build-ca.crt\n' >"$WORK/pip.conf"
  BUILD_VOLUMES+=(-v "$WORK/ca.crt:/run/build-ca.crt:ro" -v "$WORK/pip.conf:/etc/pip.conf:ro")
fi
log "building $TAG from $BASE_IMAGE"
start=$(date +%s)
buildah build --format docker --isolation chroot --network host --layers=false "${BUILD_VOLUMES[@]}" \
  --build-arg "PYTHON_BASE=$BASE_IMAGE" --build-arg "VERSION=$VERSION" -t "$TAG" . >"$WORK/build.log" 2>&1 \
  || { tail -n 40 "$WORK/build.log" >&2; exit 1; }
log "built $TAG in $(( $(date +%s) - start ))s; $(buildah images --format '{{.Size}}' "$TAG" | head -n1)"
buildah inspect --type image --format 'user={{.Docker.Config.User}} entrypoint={{.Docker.Config.Entrypoint}} cmd={{.Docker.Config.Cmd}}{{println}}' "$TAG"

[ "$SMOKE" -eq 1 ] || exit 0

# ---- smoke: run it as Kubernetes would, against the simulator ----
need podman
# Sandboxed hosts: no raising of rlimits, cgroup v1/hybrid (crun refuses it; runc does not).
printf '[containers]\ndefault_ulimits = []\n' >"$WORK/containers.conf"
export CONTAINERS_CONF="$WORK/containers.conf"
PODMAN_OPTS=(--cgroup-manager cgroupfs)
if command -v runc >/dev/null 2>&1; then PODMAN_OPTS+=(--runtime runc); fi
RESTRICTED=(--read-only --user 65532:65532 --cap-drop ALL --security-opt no-new-privileges --network host)

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'; }
SIM_PORT="$(port)"
SIDECAR_PORT="$(port)"
TAP_PORT="$(port)"

sim="$(podman "${PODMAN_OPTS[@]}" run -d "${RESTRICTED[@]}" --no-healthcheck "$TAG" simulate \
  --web.listen-address "127.0.0.1:$SIM_PORT" --acceptance-rate 0.7 --num-speculative-tokens 3 --model-name tiny)"
CONTAINERS+=("$sim")
# --health-interval disable: no systemd timer here; the check is run once below with `podman healthcheck run`.
sidecar="$(podman "${PODMAN_OPTS[@]}" run -d "${RESTRICTED[@]}" --health-interval disable \
  -e "SPECDECODE_WEB_LISTEN_ADDRESS=127.0.0.1:$SIDECAR_PORT" "$TAG" run \
  --target "vllm=http://127.0.0.1:$SIM_PORT/metrics" --collect.interval 1s \
  --tap.listen-address "127.0.0.1:$TAP_PORT" 2> >(grep -v 'systemd connection' >&2))"
CONTAINERS+=("$sidecar")
log "simulator :$SIM_PORT, sidecar :$SIDECAR_PORT, tap :$TAP_PORT (read-only root, uid 65532, no capabilities)"

# Every check runs inside the sidecar's container, with the image's own Python.
fetch() {
  podman "${PODMAN_OPTS[@]}" exec "$sidecar" python3 -c \
    'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode())' "$1"
}
ok=0
for _ in $(seq 1 60); do
  metrics="$(fetch "http://127.0.0.1:$SIDECAR_PORT/metrics" 2>/dev/null || true)"
  if grep -q '^specdecode_up{.*} 1' <<<"$metrics" && grep -q '^specdecode_acceptance_ratio{' <<<"$metrics"; then
    ok=1; break
  fi
  sleep 1
done
if [ "$ok" -ne 1 ]; then
  echo "build-image: smoke FAILED; sidecar log:" >&2
  podman "${PODMAN_OPTS[@]}" logs "$sidecar" 2>&1 | tail -n 30 >&2
  exit 1
fi
[ "$(fetch "http://127.0.0.1:$SIDECAR_PORT/healthz")" != "" ] || { echo "build-image: /healthz empty" >&2; exit 1; }
podman "${PODMAN_OPTS[@]}" healthcheck run "$sidecar" >/dev/null \
  && log "HEALTHCHECK passed" || { echo "build-image: HEALTHCHECK failed" >&2; exit 1; }
grep -E '^specdecode_(up|acceptance_ratio)\{' <<<"$metrics" | head -n 5
grep -q 'α' <<<"$(fetch "http://127.0.0.1:$SIDECAR_PORT/")" && log "status page OK" \
  || { echo "build-image: the status page shows no α" >&2; exit 1; }

# The request tap: one completion through it and one straight to the simulator; the client gets the same kind of
# answer, and the sidecar counts the tapped request under its workload.
podman "${PODMAN_OPTS[@]}" exec -i "$sidecar" python3 - "$SIM_PORT" "$TAP_PORT" <<'PY' \
  || { echo "build-image: the request tap failed" >&2; exit 1; }
import json, sys, urllib.request
sim, tap = sys.argv[1:]
body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 8, "temperature": 0}).encode()
def post(port):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                 {"content-type": "application/json", "x-workload": "smoke"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.status, json.loads(resp.read())
(s1, direct), (s2, tapped) = post(sim), post(tap)
assert s1 == s2 == 200 and direct.keys() == tapped.keys(), (s1, s2, direct.keys(), tapped.keys())
PY
tapped=0
for _ in $(seq 1 20); do
  grep -q '^specdecode_requests_total{.*workload="smoke".*} 1.0' <<<"$(fetch "http://127.0.0.1:$SIDECAR_PORT/metrics")" \
    && { tapped=1; break; }
  sleep 0.5
done
if [ "$tapped" -ne 1 ]; then
  echo "build-image: the tapped request was not counted; the sidecar's request series:" >&2
  grep -E '^specdecode_(requests_total|tap_)' <<<"$(fetch "http://127.0.0.1:$SIDECAR_PORT/metrics")" | head -n 10 >&2
  exit 1
fi
log "request tap OK: the completion passed through and was counted"
rss="$(podman "${PODMAN_OPTS[@]}" exec "$sidecar" python3 -c 'print(next(l.split()[1] for l in open("/proc/1/status") if l.startswith("VmRSS")))')"
cpu_seconds() {
  podman "${PODMAN_OPTS[@]}" exec "$sidecar" python3 -c \
    'import os; f = open("/proc/1/stat").read().rsplit(")", 1)[1].split(); print((int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))'
}
c0="$(cpu_seconds)"; sleep 10; c1="$(cpu_seconds)"
log "sidecar RSS ${rss} kB; CPU $(python3 -c "print(round(($c1 - $c0) / 10 * 1000))")m over 10 s at --collect.interval 1s"
log "smoke OK: image runs read-only as uid 65532: specdecode_up 1, α, the status page and the request tap"
