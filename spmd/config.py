"""Global switches, read from the environment and changeable at run time.

Example::

    spmd.config.update("enable_x64", True)   # or SPMD_ENABLE_X64=1
"""

from __future__ import annotations

import os

from spmd.errors import ArgumentError


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


class Config:
    """Holds the switches; ``update(name, value)`` changes one."""

    def __init__(self) -> None:
        self.enable_x64: bool = _env_flag("SPMD_ENABLE_X64")
        # Listeners are told of every change; the dtype layer and the jit cache
        # use this so that a switch never leaves a stale cached program behind.
        self._listeners: list = []

    def update(self, name: str, value) -> None:
        if not hasattr(self, name) or name.startswith("_"):
            known = sorted(k for k in vars(self) if not k.startswith("_"))
            raise ArgumentError(
                f"spmd.config.update: unknown option {name!r}; known options: {known}")
        setattr(self, name, value)
        for fn in self._listeners:
            fn(name, value)


config = Config()
