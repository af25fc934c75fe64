"""Layer 0: avals, the IR, tracing, primitives and their rules, transformations,
passes and the code-generating executor.  Knows nothing of devices or processes."""
