"""A scipy.sparse matrix given where nnsparse takes a torch sparse tensor: refused (scipy is no
dependency) with the conversion named, by duck typing (scipy is never imported for it)."""
import re
import sys

import numpy as np
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import criteria
from nnsparse._forms import scipy_sparse_hint
from nnsparse.data import SparseRowDataset

DENSE = torch.tensor([[0., 1., 0., 4.], [2., 0., 3., 0.], [0., 0., 0., 0.]])


class csr_matrix:  # noqa: N801 (scipy's name: the messages name the type)
    """A stand-in for scipy.sparse.csr_matrix: indptr/indices/data numpy arrays (int32
    indices, as scipy makes them), ``shape`` a property, and the conversion methods, which
    nnsparse must not call (it accepts no scipy object)."""

    def __init__(self, dense):
        d = dense.numpy()
        self._shape = d.shape
        self.indptr = np.concatenate([[0], np.cumsum((d != 0).sum(1))]).astype(np.int32)
        self.indices = np.nonzero(d)[1].astype(np.int32)
        self.data = d[d != 0].astype(np.float64)
        self.has_canonical_format = True
        self.calls = []

    @property
    def shape(self):
        return self._shape

    def tocsr(self):
        self.calls.append("tocsr")
        return self

    def tocoo(self):
        self.calls.append("tocoo")
        raise AssertionError("nnsparse converted a scipy matrix")


class _NotSparse:
    """Has the methods but no shape: no hint."""

    def tocsr(self):
        return self

    def tocoo(self):
        return self


class _RaisingShape(_NotSparse):
    """The methods and a shape property that raises (as a stranger object's may): recognised
    by its class, its property never read."""
    @property
    def shape(self):
        raise AssertionError("scipy_sparse_hint read the object's shape")


def _hint(name):
    return (f"; nnsparse takes torch sparse tensors, not scipy.sparse ones: convert it with "
            f"m = {name}.tocsr(); torch.sparse_csr_tensor(m.indptr, m.indices, m.data, "
            f"m.shape) (m.sum_duplicates() first if not m.has_canonical_format)")


_SPARSE_FORMS = "must be a sparse tensor, a pair tensor or a list of sparse rows, got csr_matrix"
_CRITERION = criteria.SparseCriterion(nn.MSELoss())

# (id, call on the matrix m, the message before the hint, the argument's name)
CASES = [
    ("SparseLinearBatch", lambda m: nnsparse.SparseLinearBatch(4, 2)(m),
     f"input {_SPARSE_FORMS}", "input"),
    ("SparseOutputLinear-pattern", lambda m: nnsparse.SparseOutputLinear(2, 4)(torch.ones(3, 2), m),
     f"pattern {_SPARSE_FORMS}", "pattern"),
    ("densify", nnsparse.densify, f"x {_SPARSE_FORMS}", "x"),
    ("sparsify", nnsparse.sparsify, "x must be a dense tensor, got csr_matrix (sparse already)",
     "x"),
    ("SparseRowDataset", SparseRowDataset,
     "input must be a 2-D sparse CSR or COO tensor, got csr_matrix", "input"),
    ("SparseRowDataset-target", lambda m: SparseRowDataset(DENSE.to_sparse_csr(), m),
     "target must be a 2-D sparse CSR or COO tensor or a dense tensor of labels, got "
     "csr_matrix", "target"),
    ("criterion-target", lambda m: _CRITERION(torch.zeros(3, 4), m),
     f"target {_SPARSE_FORMS}", "target"),
    ("criterion-estimate", lambda m: _CRITERION(m, DENSE.to_sparse()),
     "estimate must be a tensor or a sparse batch, got csr_matrix", "estimate"),
    ("sparse_mm-A", lambda m: nnsparse.sparse_mm(m, torch.ones(4, 2)),
     "A must be a sparse or dense torch.Tensor, got csr_matrix", "A"),
    ("sparse_mm-B", lambda m: nnsparse.sparse_mm(torch.ones(2, 3), m),
     "B must be a torch.Tensor, got csr_matrix", "B"),
]


def _real_scipy():
    sp = pytest.importorskip("scipy.sparse")
    return sp.csr_matrix(DENSE.double().numpy())  # float64, as the stand-in's (scipy's default)


@pytest.mark.parametrize("matrix", [lambda: csr_matrix(DENSE), _real_scipy],
                         ids=["stand-in", "scipy"])
@pytest.mark.parametrize("call, message, name", [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_a_scipy_matrix_is_refused_with_the_conversion_named(call, message, name, matrix):
    m = matrix()
    had_scipy = "scipy" in sys.modules  # (after making m: the real one imports scipy)
    with pytest.raises(TypeError, match="^" + re.escape(message + _hint(name)) + "$"):
        call(m)
    assert getattr(m, "calls", []) == []  # not converted: refused
    assert ("scipy" in sys.modules) == had_scipy  # nothing imported for the hint


@pytest.mark.parametrize("matrix", [lambda: csr_matrix(DENSE), _real_scipy],
                         ids=["stand-in", "scipy"])
def test_the_named_conversion_works(matrix):
    """The recipe of the message, run as written, gives what nnsparse takes: the same
    matrix (against the dense reference), through a layer and a dataset."""
    m = matrix().tocsr()
    x = torch.sparse_csr_tensor(m.indptr, m.indices, m.data, m.shape)
    torch.testing.assert_close(nnsparse.densify(x), DENSE.double())
    layer = nnsparse.SparseLinearBatch(4, 2).double()
    torch.testing.assert_close(layer(x), layer(DENSE.double().to_sparse()))
    rows = SparseRowDataset(x)
    assert len(rows) == 3 and rows[1][1].indices.tolist() == [0, 2]


@pytest.mark.parametrize("x", [
    DENSE, DENSE.to_sparse(), [DENSE[0].to_sparse()], np.zeros((2, 2)), "m", _NotSparse(),
    csr_matrix,  # the class itself
], ids=["dense", "coo", "list", "ndarray", "str", "no-shape", "class"])
def test_no_hint_for_what_is_no_scipy_matrix(x):
    assert scipy_sparse_hint(x, "x") == ""


def test_the_hint_reads_nothing_of_the_object():
    """Recognised by its class: a shape property (or any attribute) of the object is not
    read, so nothing of a stranger object runs while an error is being raised."""
    assert scipy_sparse_hint(_RaisingShape(), "x") == _hint("x")
    m = csr_matrix(DENSE)
    m.tocsr = m.tocoo = None  # (instance attributes: the class's methods are what count)
    assert scipy_sparse_hint(m, "x") == _hint("x")
