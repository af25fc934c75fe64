import os

# Simulated devices of a single process; set before anything imports spmd.
os.environ.setdefault("SPMD_NUM_DEVICES", "8")

from hypothesis import settings  # noqa: E402

# `ci` (the default) is derandomized, so every MPI rank draws the same examples;
# `dev` explores at random: HYPOTHESIS_PROFILE=dev (single-process runs only).
settings.register_profile("ci", deadline=None, max_examples=25, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")


import pytest  # noqa: E402


@pytest.fixture
def x64():
    """64-bit types on (``enable_x64``) for one test, restored after it."""
    import spmd

    old = spmd.config.enable_x64
    spmd.config.update("enable_x64", True)
    yield
    spmd.config.update("enable_x64", old)
