#!/usr/bin/env bash
# A virtual environment with nothing but the built wheel and its declared dependencies ([project].dependencies,
# no extras): what `pip install specdecode-exporter` gives a user. tests/packaging runs the sidecar from it, so
# an import of anything undeclared (a test or build-time package) fails there as it would for a user.
#
#   scripts/runtime-venv.sh    # (re)creates .venv-runtime (or $RUNTIME_VENV) from dist/*.whl (make install builds it)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUNTIME_VENV="${RUNTIME_VENV:-$ROOT/.venv-runtime}"
PYTHON="${PYTHON:-python3}"
wheel="$(ls "$ROOT"/dist/specdecode_exporter-*.whl 2>/dev/null | head -n1 || true)"
[ -n "$wheel" ] || { echo "runtime-venv: no wheel in dist/: run make install first" >&2; exit 1; }
# The dependencies are resolved afresh when pyproject.toml changes; otherwise only the wheel is replaced.
want="$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)"
stamp="$RUNTIME_VENV/.specdecode-deps"
if [ ! -x "$RUNTIME_VENV/bin/python" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  rm -rf "$RUNTIME_VENV"
  "$PYTHON" -m venv "$RUNTIME_VENV"
  "$RUNTIME_VENV/bin/python" -m pip install -q --disable-pip-version-check "$wheel"
  echo "$want" >"$stamp"
fi
"$RUNTIME_VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
echo "runtime-venv: $RUNTIME_VENV has $(basename "$wheel") and its dependencies only"
