"""Host callbacks and debug printing: Python functions and ``print`` run on host values
from inside transformed code.  ``callback`` holds ``pure_callback`` and ``io_callback``
(public as ``spmd.pure_callback``, ``spmd.callback`` and ``spmd.experimental``),
``debug`` holds ``spmd.debug``'s printing, host callbacks and
``visualize_array_sharding`` (public as ``spmd.debug``), each with its primitives and
their rules.  A front end: it may import every layer (it loads the shard layer first,
and whole) and the base modules; no layer imports it."""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
