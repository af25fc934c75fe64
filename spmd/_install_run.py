"""Importing this module runs the installer of the extension points once.

Why a module: Python's import lock for it makes a second thread wait while the
first one installs, with the import system's deadlock detection (see
:func:`spmd._install.install_extensions`).  A failed run leaves it unimported, so
the next attempt runs again and says why.
"""

from spmd._install import run_once

run_once()
