"""A rank's timeline: what each process records while a trace is on
(:mod:`~spmd.launch.timeline.recorder`), how the ranks' records become one
clock-aligned Chrome trace (:mod:`~spmd.launch.timeline.merge`), what the
launcher prints about it (:mod:`~spmd.launch.timeline.summary`) and draws
(:mod:`~spmd.launch.timeline.plot`).

The public front end is :mod:`spmd.profiler`; ``spmd-run --trace`` drives the
rest.  This package sits in the launch layer so that every layer above it (the
collectives, the call path, checkpointing) can record into it, and the launcher
can merge without loading the compiler.
"""
