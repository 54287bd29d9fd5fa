#!/usr/bin/env bash
# Build the sdist and the wheel into dist/ (the wheel is built from the sdist, so both must be complete) and
# install that wheel, not the source tree, into $VENV (default .venv). What the tests import is then exactly
# what `pip install specdecode-exporter` gives a user.
#
#   scripts/install-package.sh                 # rebuild and reinstall the package only (its dependencies stay)
#   scripts/install-package.sh --extras test   # also install the dependencies of these extras
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
EXTRAS=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --extras) EXTRAS="$2"; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "install-package: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
cd "$ROOT"
rm -rf dist
# --no-isolation: the build backend (setuptools) comes from the venv, so a build needs no download.
"$VENV/bin/python" -m build --no-isolation --outdir dist . >dist.log 2>&1 || { tail -n 30 dist.log >&2; exit 1; }
rm -f dist.log
rm -rf src/*.egg-info build
wheel="$(ls dist/specdecode_exporter-*.whl)"
if [ -n "$EXTRAS" ]; then
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${wheel}[${EXTRAS}]"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
echo "install-package: installed $(basename "$wheel") into $VENV"
