"""``python -m spmd.launch -n 4 script.py``: the same as ``spmd-run``."""

import sys

from spmd.launch.cli import main

sys.exit(main())
