"""`python -m hloexec ...`: the `hloexec` command (hloexec.tools.cli)."""

import sys

from .tools.cli import main

sys.exit(main())
