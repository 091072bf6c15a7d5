"""``python -m tailrace``: the command line (see tailrace.cli)."""

import sys

from .cli import main

sys.exit(main())
