"""Optimizers as gradient transformations (the interface users know from optax).

>>> import spmd.optim as optim
>>> opt = optim.chain(optim.clip_by_global_norm(1.0),
...                   optim.adamw(optim.warmup_cosine_decay_schedule(0, 1e-3, 100, 1000)))
>>> state = opt.init(params)
>>> updates, state = opt.update(grads, state, params)
>>> params = optim.apply_updates(params, updates)

All of it is pure pytree code over ``spmd.numpy``: it runs eagerly or under
``jit``, and the state of each parameter is computed from, and sharded like, that
parameter (see docs/training.md).
"""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.optim._base import (EmptyState, GradientTransformation, OptimError,  # noqa: F401
                              apply_updates, chain, global_norm, stateless)
from spmd.optim import mixed_precision  # noqa: F401  (bfloat16 compute, float32 masters)
from spmd.optim._schedules import (constant_schedule, cosine_decay_schedule,  # noqa: F401
                                   linear_schedule, warmup_cosine_decay_schedule)
from spmd.optim.losses import (cosine_distance, cosine_similarity, huber_loss,  # noqa: F401
                               l2_loss, log_cosh, sigmoid_binary_cross_entropy,
                               softmax_cross_entropy,
                               softmax_cross_entropy_with_integer_labels, squared_error)
from spmd.optim._transforms import (ScaleByAdamState, ScaleByLionState,  # noqa: F401
                                    ScaleByScheduleState, TraceState, add_decayed_weights, adam,
                                    adamw, clip_by_global_norm, lion, scale, scale_by_adam,
                                    scale_by_learning_rate, scale_by_lion, scale_by_schedule,
                                    sgd, trace)

__all__ = ["EmptyState", "GradientTransformation", "OptimError", "ScaleByAdamState",
           "ScaleByLionState", "ScaleByScheduleState", "TraceState", "add_decayed_weights",
           "adam", "adamw", "apply_updates", "chain", "clip_by_global_norm",
           "constant_schedule", "cosine_decay_schedule", "global_norm", "lion",
           "linear_schedule", "mixed_precision", "scale", "scale_by_adam", "scale_by_learning_rate",
           "scale_by_lion", "scale_by_schedule", "sgd", "stateless", "trace",
           "warmup_cosine_decay_schedule"]
