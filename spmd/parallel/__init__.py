"""``spmd.parallel``: parallelism strategies written on ``shard_map`` and the collectives
(issue 29): pipelines (:func:`pipeline`, GPipe differentiated by autodiff;
:func:`pipeline_value_and_grad`, run by a GPipe or 1F1B schedule), context parallelism
(:func:`ring_attention`) and expert parallelism (:func:`moe`)."""

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
from spmd.parallel.moe import moe, moe_capacity  # noqa: F401
from spmd.parallel.pipeline import (PipelineGrads, gpipe_bubble, pipeline,  # noqa: F401
                                    pipeline_value_and_grad)
from spmd.parallel.schedule import Schedule, build as pipeline_schedule  # noqa: F401
from spmd.parallel.ring_attention import (ring_attention, zigzag_order,  # noqa: F401
                                          zigzag_restore)

__all__ = ["PipelineGrads", "Schedule", "gpipe_bubble", "moe", "moe_capacity", "pipeline",
           "pipeline_schedule", "pipeline_value_and_grad", "ring_attention",
           "zigzag_order", "zigzag_restore"]

from spmd._install import install_extensions as _install_extensions  # noqa: E402

_install_extensions()
