"""``python -m tailrace.cli``: as ``python -m tailrace``, less the signal mask (see tailrace.cli)."""

import sys

from . import main

sys.exit(main())
