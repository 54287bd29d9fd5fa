#!/usr/bin/env bash
# Create the project's virtual environment (.venv, or $VENV) with the tools that build the wheel and the
# package's dependencies, read from pyproject.toml: its runtime ones and its test extras, or with --runtime the
# runtime ones alone (what `make demo` needs). The package itself is installed by scripts/install-package.sh,
# from a freshly built wheel, once: the tests always run against what users install, never against src/.
# On a fresh Debian, python3 lacks ensurepip until python3-venv is installed: do that first when needed.
#
#   scripts/bootstrap-venv.sh             # runtime dependencies and the test extras
#   scripts/bootstrap-venv.sh --runtime   # runtime dependencies only
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
EXTRAS="test"
case "${1:-}" in
  --runtime) EXTRAS="" ;;
  "") ;;
  *) echo "bootstrap-venv: unknown argument $1" >&2; exit 2 ;;
esac

if ! "$PYTHON" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
  echo "bootstrap-venv: $PYTHON is $("$PYTHON" --version 2>&1); specdecode-exporter needs Python 3.11 or newer" >&2
  exit 1
fi
if [ ! -x "$VENV/bin/python" ]; then
  if ! "$PYTHON" -m venv "$VENV" 2>/dev/null; then
    rm -rf "$VENV"
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
      echo "bootstrap-venv: installing python3-venv (Debian)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      apt-get install -y -qq --no-install-recommends python3-venv >/dev/null
      "$PYTHON" -m venv "$VENV"
    else
      echo "bootstrap-venv: '$PYTHON -m venv' failed; install your distribution's venv package (python3-venv)" >&2
      exit 1
    fi
  fi
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip "setuptools>=77" "build>=1.2"
requirements="$(mktemp)"
trap 'rm -f "$requirements"' EXIT
"$VENV/bin/python" "$ROOT/scripts/requirements.py" "$ROOT/pyproject.toml" $EXTRAS >"$requirements"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements"
echo "bootstrap-venv: $VENV ready ($("$VENV/bin/python" --version)), dependencies: runtime${EXTRAS:+ and $EXTRAS}"
