#!/usr/bin/env bash
# See the whole alert chain work on your laptop, in one command:
#
#   bash scripts/see-it-work.sh            # scripted: healthy → α drops to 0.35 → page → α recovers → resolved
#   bash scripts/see-it-work.sh --keep     # the same, then leave everything running until Ctrl-C
#   bash scripts/see-it-work.sh --manual   # start the chain and wait; drive the fake vLLM yourself
#
# Starts, on 127.0.0.1 with free ports: the fake vLLM (specdecode-exporter simulate), the sidecar, Prometheus with
# the real rules (built with the e2e profile: 1m window, for: 15s), Alertmanager with
# alerts/alertmanager.example.yml (webhooks pointed at a local receiver that prints what it gets). Ctrl-C or the
# end of the scenario stops every process it started. The same chain as `pytest -m e2e tests/e2e`.
#
# Needs the venv (make install) and Debian's prometheus + prometheus-alertmanager (make tools), or $PROMETHEUS and
# $ALERTMANAGER pointing at the binaries.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
if [[ ! -x "$VENV/bin/python" ]]; then
    echo "see-it-work: no $VENV; run 'make install' first" >&2
    exit 1
fi
exec "$VENV/bin/python" -m devtools.chain "$@"
