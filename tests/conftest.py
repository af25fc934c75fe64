import os

# Simulated devices of a single process; set before anything imports spmd.
os.environ.setdefault("SPMD_NUM_DEVICES", "8")

from hypothesis import settings  # noqa: E402

# `ci` (the default) is derandomized, so every MPI rank draws the same examples;
# `dev` explores at random: HYPOTHESIS_PROFILE=dev (single-process runs only).
settings.register_profile("ci", deadline=None, max_examples=25, derandomize=True)
settings.register_profile("dev", deadline=None, max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or "ci")
