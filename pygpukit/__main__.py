"""`python -m pygpukit ...` is the `pygpukit` command."""

import sys

from pygpukit.cli import main

sys.exit(main())
