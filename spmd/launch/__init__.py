"""Layer 1: processes — who am I, MPI initialisation, the ``spmd-run`` launcher."""


def register() -> None:
    """Fill the compiler's extension point this layer provides (the array module of
    this process's platform); called once, by the wiring (``spmd/_install.py``).

    >>> from spmd.compiler import extensions
    >>> extensions.ARRAY_MODULE.installed_by
    'spmd.launch.platform'
    """
    # Here, not at the top: spmd-run loads this package, and must not load the
    # compiler (which the platform module and the extension points are part of).
    from spmd.compiler import extensions
    from spmd.launch import platform

    extensions.ARRAY_MODULE.install(platform.resolve_array_module, by="spmd.launch.platform")
