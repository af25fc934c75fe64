"""optax's common losses, written with ``spmd.numpy`` so that they run eagerly, under
``jit``, ``grad`` and ``vmap``, and on sharded arrays.  Each returns the loss per
example (no mean over the batch), as optax's do; also reachable as ``spmd.losses``.

>>> loss = optim.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
"""

from __future__ import annotations

import numpy as np

import spmd.shard  # noqa: F401  (first, and whole: spmd/_install.py, "Threads")
import spmd.nn as nn
import spmd.numpy as snp
from spmd.errors import DTypeError

__all__ = ["cosine_distance", "cosine_similarity", "huber_loss", "l2_loss", "log_cosh",
           "sigmoid_binary_cross_entropy", "softmax_cross_entropy",
           "softmax_cross_entropy_with_integer_labels", "squared_error"]


def _errors(predictions, targets):
    return predictions if targets is None else predictions - targets


def softmax_cross_entropy(logits, labels, axis: int = -1):
    """``-sum(labels * log_softmax(logits))`` over ``axis``: the cross entropy of the
    class probabilities ``labels`` and the distribution of ``logits``.

    >>> softmax_cross_entropy(snp.zeros((1, 2)), snp.array([[0.0, 1.0]]))  # [log 2]
    """
    return -snp.sum(labels * nn.log_softmax(logits, axis=axis), axis=axis)


def softmax_cross_entropy_with_integer_labels(logits, labels, axis: int = -1):
    """The cross entropy of integer class ``labels`` (shape of ``logits`` less
    ``axis``) and the distribution of ``logits``: ``logsumexp(logits) -
    logits[label]``.

    >>> softmax_cross_entropy_with_integer_labels(snp.zeros((1, 4)), snp.array([2]))
    """
    if not np.issubdtype(np.dtype(labels.dtype if hasattr(labels, "dtype")
                                  else np.asarray(labels).dtype), np.integer):
        raise DTypeError(f"softmax_cross_entropy_with_integer_labels: labels must be "
                         f"integers (class indices), got dtype "
                         f"{getattr(labels, 'dtype', np.asarray(labels).dtype)}; for class "
                         "probabilities use softmax_cross_entropy")
    axis = axis % snp.ndim(logits)
    picked = snp.take_along_axis(logits, snp.expand_dims(labels, axis), axis=axis)
    return nn.logsumexp(logits, axis=axis) - snp.squeeze(picked, axis)


def sigmoid_binary_cross_entropy(logits, labels):
    """Elementwise ``-labels * log(sigmoid(logits)) - (1 - labels) *
    log(1 - sigmoid(logits))``, computed with ``log_sigmoid`` (no overflow).

    >>> sigmoid_binary_cross_entropy(snp.array([0.0]), snp.array([1.0]))   # [log 2]
    """
    return -labels * nn.log_sigmoid(logits) - (1.0 - labels) * nn.log_sigmoid(-logits)


def squared_error(predictions, targets=None):
    """Elementwise ``(predictions - targets) ** 2`` (``predictions ** 2`` without
    targets).

    >>> squared_error(snp.array([3.0]), snp.array([1.0]))   # [4.]
    """
    return snp.square(_errors(predictions, targets))


def l2_loss(predictions, targets=None):
    """Half the squared error, elementwise.

    >>> l2_loss(snp.array([3.0]), snp.array([1.0]))   # [2.]
    """
    return 0.5 * squared_error(predictions, targets)


def huber_loss(predictions, targets=None, delta: float = 1.0):
    """Elementwise: half the squared error where ``|error| <= delta``, else
    ``delta * (|error| - delta / 2)``.

    >>> huber_loss(snp.array([3.0]), snp.array([1.0]))   # [1.5]
    """
    abs_err = snp.abs(_errors(predictions, targets))
    quadratic = snp.minimum(abs_err, delta)
    return 0.5 * snp.square(quadratic) + delta * (abs_err - quadratic)


def log_cosh(predictions, targets=None):
    """Elementwise ``log(cosh(error))``, computed as ``logaddexp(e, -e) - log 2`` (no
    overflow for large errors).

    >>> log_cosh(snp.array([0.0]))   # [0.]
    """
    err = _errors(predictions, targets)
    return snp.logaddexp(err, -err) - _LOG2


_LOG2 = float(np.log(2.0))  # a Python float: weakly typed, so the errors keep their dtype


def cosine_similarity(predictions, targets, epsilon: float = 0.0, axis: int = -1):
    """The cosine of the angle between ``predictions`` and ``targets`` along ``axis``;
    each norm is taken at least ``epsilon`` (0 vectors give 0 with ``epsilon > 0``).

    >>> cosine_similarity(snp.array([1.0, 0.0]), snp.array([1.0, 1.0]))   # 0.7071
    """
    def unit(v):
        norm = snp.sqrt(snp.sum(snp.square(v), axis=axis, keepdims=True))
        return v / snp.maximum(norm, epsilon)

    return snp.sum(unit(predictions) * unit(targets), axis=axis)


def cosine_distance(predictions, targets, epsilon: float = 0.0, axis: int = -1):
    """``1 - cosine_similarity(predictions, targets)``.

    >>> cosine_distance(snp.array([1.0, 0.0]), snp.array([1.0, 0.0]))   # 0.
    """
    return 1.0 - cosine_similarity(predictions, targets, epsilon, axis)
