"""spmd.config's process settings: the malloc tuning done at import."""

import os
import platform
import subprocess
import sys

import pytest

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc" or sys.platform != "linux",
                           reason="the tuning is glibc's mallopt")

# Rounds of 20 buffers of 2 MiB, made, touched and freed: the pattern of a program
# that frees each value after its last use.  Prints MALLOC_TUNED and the page faults
# of rounds 2-5 (round 1 faults the heap in).
PROBE = """
import resource
import numpy as np
from spmd.config import MALLOC_TUNED
def round_():
    xs = [np.ones(512 * 1024, np.float32) for _ in range(20)]
    del xs
round_()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    round_()
print(MALLOC_TUNED, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _probe(**env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "SPMD_TUNE"))}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    tuned, faults = out.stdout.split()
    return tuned == "True", int(faults)


@glibc
def test_freed_buffers_are_reused_not_faulted_in_again():
    tuned, faults = _probe()
    assert tuned
    pages_per_round = 20 * 2 * 1024 * 1024 // 4096
    assert faults < pages_per_round // 4, faults
    # The same rounds with malloc as glibc leaves it fault every page in again: the
    # probe measures what the tuning changes.
    untuned, faults_off = _probe(SPMD_TUNE_MALLOC="0")
    assert not untuned
    assert faults_off > 2 * pages_per_round, faults_off


@glibc
def test_users_malloc_settings_stand():
    tuned, faults = _probe(MALLOC_TRIM_THRESHOLD_="100000")
    assert not tuned


def test_bad_switch_is_an_error_naming_it():
    out = subprocess.run([sys.executable, "-c", "import spmd"],
                         env={**os.environ, "SPMD_TUNE_MALLOC": "maybe"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "SPMD_TUNE_MALLOC='maybe' is not a switch; set it to 1 or 0" in out.stderr


def test_default_matmul_precision_is_recorded_and_checked():
    import pytest
    import spmd
    from spmd.errors import ArgumentError

    @spmd.default_matmul_precision("float32")
    def inside():
        return spmd.config.default_matmul_precision

    assert inside() == "float32" and spmd.config.default_matmul_precision is None
    with spmd.default_matmul_precision("bfloat16"):
        assert spmd.config.default_matmul_precision == "bfloat16"
    with pytest.raises(ArgumentError, match=r"default_matmul_precision='fp7' is not one of "
                                            r"JAX's names"):
        with spmd.default_matmul_precision("fp7"):
            pass
    assert spmd.config.default_matmul_precision is None
