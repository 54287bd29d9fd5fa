"""python -m specdecode_exporter: the same as the specdecode-exporter command."""

import sys

from specdecode_exporter.cli import main

sys.exit(main())
