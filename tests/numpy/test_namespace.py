"""``spmd.numpy``'s public names are its ``__all__``: a star import brings the numpy
API and nothing of the implementation (numpy itself, math, the compiler's helpers)."""

from __future__ import annotations

import types

import numpy as np
import pytest

import spmd.numpy as snp


def test_star_import_is_exactly_all():
    ns: dict = {}
    exec("from spmd.numpy import *", ns)
    names = set(ns) - {"__builtins__"}
    assert names == set(snp.__all__)
    for leaked in ("np", "math", "operator", "get_aval", "dtypes", "ew", "st", "convert",
                   "to_host", "dot_general", "annotations", "ArgumentError", "to_array"):
        assert leaked not in names


def test_all_lists_every_public_name_once():
    assert len(snp.__all__) == len(set(snp.__all__))
    public = {n for n in dir(snp) if not n.startswith("_")
              and not isinstance(getattr(snp, n), types.ModuleType)}
    assert public == set(snp.__all__), (sorted(public - set(snp.__all__)),
                                        sorted(set(snp.__all__) - public))
    for n in ("sum", "dot", "where", "take", "concatenate", "float32", "pi", "ndarray",
              "broadcast_shapes"):
        assert n in snp.__all__


def test_where_with_one_argument_names_the_numpy_alternative():
    with pytest.raises(TypeError, match=r"spmd.numpy.where: the one-argument form.*"
                                        r"np.nonzero\(np.asarray\(condition\)\)"):
        snp.where(np.array([True, False]))
