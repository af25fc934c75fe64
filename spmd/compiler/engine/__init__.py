"""The engine that runs programs: code generation (``codegen``: a program becomes one
generated Python function), buffer ownership (``buffers``), elementwise fusion
(``fusion``, ``fusion_jit``, ``fusion_gpu``), row kernels (``rows``, ``rows_jit``),
compiled loops (``loops``) and their vectorizable float32 math (``kernel_math``), the
engine's threads (``threads``) and BLAS accumulation in place (``gemm``).  It may import
:mod:`spmd.compiler.core`, the primitives of :mod:`spmd.compiler.ops`, the passes that
plan what it runs (:mod:`spmd.compiler.passes`), and the base modules; never a layer
above the compiler."""
