"""The compiler's core: what every stage is written in.  Abstract values and dtypes,
the IR (typed SSA programs), primitives and the registry of their rules, tracing, the
type checker, the concrete array types and their array module, the varying and manual
axes types, and ``jit`` (trace once per signature, optimise, generate code, cache)
with its ahead-of-time stages.  Its basic modules import only each other and the base
modules (``spmd.errors``, ``spmd.config``); ``jit`` and ``traced`` drive the other
stages and so also import :mod:`spmd.compiler.transforms`, :mod:`spmd.compiler.passes`
and :mod:`spmd.compiler.engine`; no module here imports the op library.  Nothing here
imports a layer above the compiler.  The extension points that upper layers fill stay
beside this package, in :mod:`spmd.compiler.extensions`:
``import spmd`` loads them alone, and one more package on that path closes cycles of
import locks between threads making their first imports together."""
