"""Learning-rate schedules: functions of the step count (optax's names and formulas).

A schedule maps the number of updates applied so far (an int32 scalar, traced
under ``jit``) to a value; pass one wherever a learning rate is taken.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

import spmd.numpy as snp
from spmd.optim._base import OptimError

Schedule = Callable[[object], object]


def _check_steps(name: str, arg: str, value, allow_zero: bool = False) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or \
            value < (0 if allow_zero else 1):
        bound = ">= 0" if allow_zero else ">= 1"
        raise OptimError(f"{name}: {arg} must be an integer {bound}, got {value!r}")
    return int(value)


def constant_schedule(value: float) -> Schedule:
    """``value`` at every step.

    >>> constant_schedule(0.1)(5)
    0.1
    """
    return lambda count: value


def linear_schedule(init_value: float, end_value: float, transition_steps: int,
                    transition_begin: int = 0) -> Schedule:
    """From ``init_value`` to ``end_value`` linearly over ``transition_steps`` steps
    starting at ``transition_begin``; constant before and after.

    >>> float(linear_schedule(1.0, 0.0, 10)(5))
    0.5
    """
    steps = _check_steps("linear_schedule", "transition_steps", transition_steps)
    begin = _check_steps("linear_schedule", "transition_begin", transition_begin, True)

    def schedule(count):
        frac = snp.clip((snp.asarray(count, snp.float32) - begin) / steps, 0.0, 1.0)
        return init_value + (end_value - init_value) * frac

    return schedule


def cosine_decay_schedule(init_value: float, decay_steps: int, alpha: float = 0.0,
                          exponent: float = 1.0) -> Schedule:
    """``init_value * ((1 - alpha) * (0.5 * (1 + cos(pi * t / decay_steps))) ** exponent +
    alpha)`` with ``t = min(count, decay_steps)``.

    >>> float(cosine_decay_schedule(1.0, 10)(10))
    0.0
    """
    steps = _check_steps("cosine_decay_schedule", "decay_steps", decay_steps)

    def schedule(count):
        t = snp.minimum(snp.asarray(count, snp.float32), steps)
        cosine = 0.5 * (1 + snp.cos(np.pi * t / steps))
        return init_value * ((1 - alpha) * cosine ** exponent + alpha)

    return schedule


def warmup_cosine_decay_schedule(init_value: float, peak_value: float, warmup_steps: int,
                                 decay_steps: int, end_value: float = 0.0,
                                 exponent: float = 1.0) -> Schedule:
    """Linear warm-up from ``init_value`` to ``peak_value`` over ``warmup_steps``,
    then cosine decay to ``end_value`` at step ``decay_steps`` (which counts the
    warm-up, as in optax).

    >>> float(warmup_cosine_decay_schedule(0.0, 1.0, 10, 110)(10))
    1.0
    """
    warm = _check_steps("warmup_cosine_decay_schedule", "warmup_steps", warmup_steps, True)
    total = _check_steps("warmup_cosine_decay_schedule", "decay_steps", decay_steps)
    if total <= warm:
        raise OptimError(f"warmup_cosine_decay_schedule: decay_steps ({total}) counts the "
                         f"warm-up and must exceed warmup_steps ({warm})")
    up = linear_schedule(init_value, peak_value, warm) if warm else constant_schedule(peak_value)
    alpha = 0.0 if peak_value == 0 else end_value / peak_value
    down = cosine_decay_schedule(peak_value, total - warm, alpha, exponent)

    def schedule(count):
        c = snp.asarray(count, snp.int32)
        return snp.where(c < warm, up(c), down(c - warm))

    return schedule
