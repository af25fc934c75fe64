"""Helpers of the spmd.testing tests."""


def usage_error(pytester, source: str) -> str:
    """Run ``source`` as a user's test file in an inner pytest (a subprocess), assert that
    the run failed, and return all it printed (the caller checks the message)."""
    pytester.makepyfile(test_user=source)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    assert result.ret != 0
    return result.stdout.str() + result.stderr.str()
