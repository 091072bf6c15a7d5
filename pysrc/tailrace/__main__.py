"""``python -m tailrace``: the command line (see tailrace.cli)."""

import sys

from .cli import console_main

sys.exit(console_main())
