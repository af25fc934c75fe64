"""``spmd.pure_callback`` and ``io_callback``: calling a Python function on host values
from inside transformed code.  The public path; the code is in :mod:`spmd.host.callback`."""

from spmd.host.callback import (CallbackError, io_callback, io_callback_p,  # noqa: F401
                                pure_callback, pure_callback_p)
