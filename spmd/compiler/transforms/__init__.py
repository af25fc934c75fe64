"""Program-to-program transformations: automatic differentiation (``ad``, its eager
linearisation ``ad_eager`` and the vocabulary of its rules ``ad_util``), batching
(``vmap``), rematerialisation (``checkpoint``), user-defined derivative rules
(``custom_jvp``/``custom_vjp``) and the cutting of a traced function in two
(``split``).  It may import :mod:`spmd.compiler.core`, the primitives of
:mod:`spmd.compiler.ops` and the pass pipeline (:mod:`spmd.compiler.passes`, to clean
up the programs it makes), and the base modules; never a layer above the compiler."""
