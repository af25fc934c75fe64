"""Optimisation passes: each maps a program to an equivalent, cheaper one.  Scalar
folding (``fold``), zero pads summed as a concatenation (``pads``), collective
combining (``combine``) and overlap (``overlap``), recomputation of cheap values
(``recompute``), products accumulated into a buffer (``accumulate``), and the
pipeline that runs them in order (``pipeline``: inlining, constant folding, CSE, DCE,
lowering for execution).  It may import :mod:`spmd.compiler.core`, the primitives of
:mod:`spmd.compiler.ops`, the engine's kernels that lowering groups equations into
(:mod:`spmd.compiler.engine`), and the base modules; never a layer above the
compiler."""
