"""Layer 1: processes — who am I, MPI initialisation, the ``spmd-run`` launcher."""
