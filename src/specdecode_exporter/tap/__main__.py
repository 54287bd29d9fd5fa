"""``python -m specdecode_exporter.tap LISTEN_FD CONTROL_FD``: the tap process the sidecar starts (tap/process.py).
Not a user command: run the sidecar with --tap.listen-address instead."""

import sys

from specdecode_exporter.tap.process import main

sys.exit(main(sys.argv))
