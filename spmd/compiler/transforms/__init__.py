"""Program-to-program transformations: automatic differentiation (``ad``, its eager
linearisation ``ad_concrete`` and the vocabulary of its rules ``ad_util``), batching
(``vmap``), rematerialisation (``checkpoint``), user-defined derivative rules
(``custom_jvp``/``custom_vjp``) and the cutting of a traced function in two
(``split``).  It may import :mod:`spmd.compiler.core`, the pass pipeline
(:mod:`spmd.compiler.passes`, to clean up the programs it makes) and the base modules;
not the op library, which is written with it: the few ops the transformations build
themselves reach them through :data:`array_ops.OPS`, which the op library fills.  Never
a layer above the compiler."""
