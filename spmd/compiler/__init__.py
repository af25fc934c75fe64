"""Layer 0: avals, the IR, tracing, primitives and their rules, transformations,
passes and the code-generating executor.  Knows nothing of devices or processes.

Inside, the core, the transformations and the op library are layered, each importing
only itself and what is below it (``tests/test_structure.py`` measures the circles):

1. :mod:`spmd.compiler.core`: avals, dtypes, the IR, :class:`Primitive` and its rule
   record, tracers and traces (``tracer``, ``trace``, ``communication``).  ``jit`` and
   ``traced`` are the exception: they drive the stages (transforms, passes, engine).
2. :mod:`spmd.compiler.transforms`: autodiff, batching, remat, custom rules.  The few
   ops they build (moving a batch axis, zero and summed tangents, a cast) come from
   the op library through :data:`spmd.compiler.transforms.array_ops.OPS`, which
   ``spmd/compiler/ops/__init__.py`` fills once.
3. :mod:`spmd.compiler.ops`: the primitives, one module per family, each with all its
   rules (set in that module only: ``tests/compiler/test_rules_defined_once.py``).
   They import the core and the transforms at the top.  The families whose rules
   build each other's ops (``elementwise``, ``structural``, ``reduce``, ``complex``)
   reach one another at call time; the others import them at the top.

:mod:`spmd.compiler.passes` (program rewrites) and :mod:`spmd.compiler.engine` (code
generation, compiled loops, threads) read the primitives; the transformations and the
higher-order ops call the pass pipeline on the programs they make, and a few ops
(attention, linalg, indexing) run on the engine's kernels and threads.
"""
