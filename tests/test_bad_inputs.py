"""The table-driven bad-input suite: every public entry point x every kind of bad input.

Each case pairs a call with the exception type and a regex of the message,
which names the argument and what was expected (torchsparsegradutils'
``BAD_TEST_DATA`` is the model).  Inputs that must WORK (int32 indices,
uncoalesced duplicates, non-contiguous tensors, empty batches, dense input
to a layer) are checked against a dense reference: a silently wrong result
is the worst outcome.  ``python tests/test_bad_inputs.py`` prints the tally.
"""
import math
import re
import sys
from typing import Any, Callable, List, NamedTuple, Optional

import pytest
import torch
from torch import nn

import nnsparse
from nnsparse.data import (Ratings, RatingNormalizer, SparseRowDataset, collate_sparse_rows,
                           holdout_split, mae, mean_prediction, random_split, rating_matrix,
                           read_ratings, rmse, split_ratings, synthetic_ratings)
from nnsparse.optim import LazyAdam

F32 = torch.float32
X = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 3.0, 0.0, 4.0]])


def coo(idx, val, shape):
    return torch.sparse_coo_tensor(torch.tensor(idx), torch.tensor(val, dtype=F32), shape,
                                   check_invariants=False)


def csr(crow, col, val, shape, index_dtype=torch.int64):
    return torch.sparse_csr_tensor(torch.tensor(crow, dtype=index_dtype),
                                   torch.tensor(col, dtype=index_dtype),
                                   torch.tensor(val, dtype=F32), shape, check_invariants=False)


class Case(NamedTuple):
    id: str
    call: Callable[[], Any]
    error: Optional[type]  # None: the call must work, and `check` its result
    match: str = ""
    check: Optional[Callable[[Any], bool]] = None


# -- bad sparse arguments x every entry point that takes one -------------------------------

BAD_SPARSE = {
    "coo-out-of-range": (lambda: coo([[0, 1], [1, 4]], [1, 2], (2, 4)),
                         ValueError, r"column indices must be in \[0, 4\), got max 4"),
    "coo-negative": (lambda: coo([[0, 1], [1, -1]], [1, 2], (2, 4)),
                     ValueError, r"column indices must be non-negative, got min -1"),
    "coo-negative-row": (lambda: coo([[-1, 1], [1, 2]], [1, 2], (2, 4)),
                         ValueError, r"row indices must be non-negative, got min -1"),
    "coo-row-out-of-range": (lambda: coo([[0, 2], [1, 2]], [1, 2], (2, 4)),
                             ValueError, r"row indices must be in \[0, 2\), got max 2"),
    "csr-crow0": (lambda: csr([1, 1, 2], [0, 1], [1, 2], (2, 4)),
                  ValueError, r"crow_indices must start at 0, got 1"),
    "csr-decreasing": (lambda: csr([0, 2, 1], [0, 1], [1, 2], (2, 4)),
                       ValueError, r"crow_indices must be non-decreasing"),
    "csr-last-past-nnz": (lambda: csr([0, 1, 3], [0, 1], [1, 2], (2, 4)),
                          ValueError, r"crow_indices must end at nnz = 2"),
    "csr-last-below-nnz": (lambda: csr([0, 1, 1], [0, 1], [1, 2], (2, 4)),
                           ValueError, r"crow_indices must end at nnz = 2"),
    "csr-unsorted-columns": (lambda: csr([0, 2, 2], [3, 1], [1, 2], (2, 4)),
                             ValueError, r"column indices must increase within each row"),
    "csr-repeated-columns": (lambda: csr([0, 2, 2], [1, 1], [1, 2], (2, 4)),
                             ValueError, r"column indices must increase within each row"),
    "csr-column-out-of-range": (lambda: csr([0, 1, 2], [0, 4], [1, 2], (2, 4)),
                                ValueError, r"column indices must be in \[0, 4\), got max 4"),
    "csr-column-negative": (lambda: csr([0, 1, 2], [0, -1], [1, 2], (2, 4)),
                            ValueError, r"column indices must be non-negative"),
    "csr-values-length": (lambda: csr([0, 1, 2], [0, 1], [1, 2, 3], (2, 4)),
                          ValueError, r"one value per column index, got 3 values for 2"),
    "sparse-3d": (lambda: torch.ones(2, 2, 2).to_sparse(),
                  ValueError, r"(vector or a 2-D sparse batch, got 3 dimensions|2-D)"),
    "hybrid": (lambda: torch.ones(2, 4, 3).to_sparse(2),
               (NotImplementedError, ValueError), r"(hybrid sparse tensors are not supported|2-D)"),
    "bsr-layout": (lambda: X.to_sparse_bsr((1, 2)),
                   (NotImplementedError, TypeError), r"(layout torch.sparse_bsr is not supported|"
                                                     r"got layout torch.sparse_bsr)"),
    "wrong-type-str": (lambda: "abc", TypeError, r"got str"),
    "wrong-type-none": (lambda: None, TypeError, r"got NoneType"),
    "list-of-ints": (lambda: [1, 2], TypeError, r"(\[0\] must be a tensor, got int|got list)"),
}

# entry point -> (call on the sparse argument, the argument's name in messages)
SPARSE_ENTRIES = {
    "densify": (lambda x: nnsparse.densify(x), "x"),
    "to_pairs": (lambda x: nnsparse.to_pairs(x), "x"),
    "ssort": (lambda x: nnsparse.ssort(x), "x"),
    "ssort_by_index": (lambda x: nnsparse.ssort_by_index(x), "x"),
    "stopk": (lambda x: nnsparse.stopk(x, 1), "x"),
    "values_map": (lambda x: nnsparse.values_map(torch.sin, x), "input"),
    "ValuesMap": (lambda x: nnsparse.ValuesMap(nn.Tanh())(x), "input"),
    "SparseLinearBatch": (lambda x: nnsparse.SparseLinearBatch(4, 3)(x), "input"),
    "sparse_linear": (lambda x: nnsparse.layers.linear.sparse_linear(x, torch.ones(3, 4)), "input"),
    "Densify": (lambda x: nnsparse.Densify(4)(x), "input"),
    "SparseOutputLinear": (lambda x: nnsparse.SparseOutputLinear(3, 4)(torch.ones(2, 3), x),
                           "pattern"),
    "SparseCriterion": (lambda x: nnsparse.SparseCriterion(nn.MSELoss())(torch.zeros(2, 4), x),
                        "target"),
    "SDAESparseCriterion": (lambda x: nnsparse.SDAESparseCriterion(nn.MSELoss())(
        torch.zeros(2, 4), x, mask=torch.zeros(2, 4, dtype=torch.bool)), "target"),
    "SDAESparseCriterion.prepare_input": (lambda x: nnsparse.SDAESparseCriterion(
        nn.MSELoss(), hide_ratio=0.5).prepare_input(x), "input"),
    "MaskCriterion.prepare_input": (lambda x: nnsparse.MaskCriterion(
        nn.MSELoss(), hide_ratio=0.5).prepare_input(x), "input"),
    "Batchifier": (lambda x: nnsparse.Batchifier(nnsparse.Densify(4), 4, batch_size=1,
                                                 progress=False)(x), "data"),
    "SparseRowDataset": (lambda x: SparseRowDataset(x), "input"),
    # the second probe: the newer entry points that read a sparse argument
    "SparseWeightLinear": (lambda x: nnsparse.SparseWeightLinear(x), "pattern"),
    "SparseWeightLinear.forward": (lambda x: nnsparse.SparseWeightLinear.random(4, 3, 0.5)(x), "input"),
    "sparse_mm": (lambda x: nnsparse.sparse_mm(x, torch.ones(4, 3)), "A"),
    "sparse_parts": (lambda x: nnsparse.sparse_parts(x), "x"),
}

# Kinds an entry point answers with its own (clear) message rather than the shared one.
OWN = {
    ("SparseRowDataset", "hybrid"): (ValueError, r"input must be 2-D \(rows, width\)"),
    ("SparseRowDataset", "sparse-3d"): (ValueError, r"input must be 2-D \(rows, width\)"),
    ("SparseRowDataset", "bsr-layout"): (TypeError, r"input must be a 2-D sparse CSR or COO"),
    ("SparseRowDataset", "list-of-ints"): (TypeError, r"input must be a 2-D sparse CSR or COO"),
    # sparse_mm takes a batched (3-D) sparse operand: the dense one must then be 3-D too
    ("sparse_mm", "sparse-3d"): (ValueError, r"B must be 3-D like the sparse operand, got shape \(4, 3\)"),
    ("Batchifier", "wrong-type-str"): (TypeError, r"data must be a sparse matrix.*got str"),
    ("Batchifier", "wrong-type-none"): (TypeError, r"data must be a sparse matrix.*got NoneType"),
}


# Not bad inputs there: SparseOutputLinear's pattern=None asks for the dense output.
VALID = {("SparseOutputLinear", "wrong-type-none")}


def _sparse_cases() -> List[Case]:
    cases = []
    for entry, (call, name) in SPARSE_ENTRIES.items():
        for kind, (make, error, match) in BAD_SPARSE.items():
            if (entry, kind) in VALID:
                continue
            error, match = OWN.get((entry, kind), (error, match))
            if (entry, kind) not in OWN and not kind.startswith(("wrong-type", "list-of")):
                match = rf"{re.escape(name)}\b.*{match}"
            cases.append(Case(f"{entry}-{kind}", (lambda c=call, m=make: c(m())), error, match))
    return cases


# -- inputs that must work, against a dense reference ----------------------------------------

def _uncoalesced():  # X with (0, 2) = 2 split into 1.5 + 0.5, entries out of order
    return torch.sparse_coo_tensor(torch.tensor([[1, 0, 0, 1, 0], [3, 2, 0, 1, 2]]),
                                   torch.tensor([4.0, 1.5, 1.0, 3.0, 0.5]), (2, 4))


GOOD_SPARSE = {
    "coo": lambda: X.to_sparse(),
    "csr": lambda: X.to_sparse_csr(),
    "uncoalesced-duplicates": _uncoalesced,
    "csr-int32-indices": lambda: csr([0, 2, 4], [0, 2, 1, 3], [1, 2, 3, 4], (2, 4), torch.int32),
    "coo-int32-indices": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 0, 1, 1], [0, 2, 1, 3]], dtype=torch.int32), torch.tensor([1., 2, 3, 4]),
        (2, 4)),
    "non-contiguous-values": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 0, 1, 1], [0, 2, 1, 3]]), torch.tensor([[1.0, 9], [2, 9], [3, 9], [4, 9]])[:, 0],
        (2, 4)),
    "non-contiguous-indices": lambda: torch.sparse_coo_tensor(
        torch.tensor([[0, 0], [0, 2], [1, 1], [1, 3]]).T, torch.tensor([1.0, 2, 3, 4]), (2, 4)),
    "list-of-vectors": lambda: [X[0].to_sparse(), X[1].to_sparse()],
}

torch.manual_seed(0)
_LIN = nnsparse.SparseLinearBatch(4, 3)
_OUT = nnsparse.SparseOutputLinear(3, 4)
_H = torch.randn(2, 3)
_EST = torch.arange(8.0).reshape(2, 4)

GOOD_ENTRIES = {
    "densify": (nnsparse.densify, lambda: X),
    "Densify": (nnsparse.Densify(4), lambda: X),
    "SparseLinearBatch": (_LIN, lambda: X @ _LIN.weight.T + _LIN.bias),
    "SparseOutputLinear": (lambda x: nnsparse.densify(_OUT(_H, x)),
                           lambda: (_H @ _OUT.weight.T + _OUT.bias) * (X != 0)),
    "SparseCriterion": (lambda x: nnsparse.SparseCriterion(nn.MSELoss())(_EST, x),
                        lambda: ((_EST - X)[X != 0] ** 2).mean()),
    "values_map": (lambda x: nnsparse.densify(nnsparse.values_map(lambda v: 2 * v, x)),
                   lambda: 2 * X),
    "Batchifier": (nnsparse.Batchifier(nnsparse.Densify(4), 4, batch_size=1, progress=False),
                   lambda: X),
    "to_pairs+from_pairs": (lambda x: nnsparse.densify(nnsparse.from_pairs(nnsparse.to_pairs(x),
                                                                           size=4)), lambda: X),
}


def _close(expected):
    def check(out):
        return torch.allclose(out.detach(), expected().detach(), atol=1e-5)
    return check


def _good_cases() -> List[Case]:
    cases = []
    for entry, (call, ref) in GOOD_ENTRIES.items():
        for kind, make in GOOD_SPARSE.items():
            cases.append(Case(f"{entry}-{kind}-works", (lambda c=call, m=make: c(m())), None,
                              check=_close(ref)))
    empty = {"empty-coo": lambda: torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long),
                                                          torch.zeros(0), (2, 4)),
             "empty-csr": lambda: torch.zeros(2, 4).to_sparse_csr()}
    for entry, (call, ref) in GOOD_ENTRIES.items():
        for kind, make in empty.items():
            if entry == "SparseCriterion":  # no entry: loss 0, not NaN
                cases.append(Case(f"{entry}-{kind}-works", (lambda c=call, m=make: c(m())), None,
                                  check=lambda out: float(out) == 0.0))
                continue
            zero = (lambda: torch.zeros(2, 4)) if entry != "SparseLinearBatch" else (
                lambda: _LIN.bias.expand(2, 3))
            cases.append(Case(f"{entry}-{kind}-works", (lambda c=call, m=make: c(m())), None,
                              check=_close(zero)))
    cases += [
        Case("SparseLinearBatch-zero-rows-works", lambda: _LIN(torch.zeros(0, 4).to_sparse_csr()),
             None, check=lambda out: out.shape == (0, 3)),
        Case("SparseLinearBatch-dense-input-is-nn.Linear", lambda: _LIN(X), None,
             check=_close(lambda: X @ _LIN.weight.T + _LIN.bias)),
        Case("SparseLinearBatch-dense-non-contiguous", lambda: _LIN(X.T.contiguous().T), None,
             check=_close(lambda: X @ _LIN.weight.T + _LIN.bias)),
        Case("SparseOutputLinear-non-contiguous-input",
             lambda: nnsparse.densify(_OUT(_H.T.contiguous().T, X.to_sparse_csr())), None,
             check=_close(lambda: (_H @ _OUT.weight.T + _OUT.bias) * (X != 0))),
        Case("sparsify-non-contiguous", lambda: nnsparse.densify(nnsparse.sparsify(X.T.contiguous().T)),
             None, check=_close(lambda: X)),
        Case("SparseCriterion-non-contiguous-estimate",
             lambda: nnsparse.SparseCriterion(nn.MSELoss())(_EST.T.contiguous().T, X.to_sparse()),
             None, check=_close(lambda: ((_EST - X)[X != 0] ** 2).mean())),
        Case("from_pairs-int32-pairs", lambda: nnsparse.from_pairs(
            torch.tensor([[1, 3], [3, 5]], dtype=torch.int32), size=5).to_dense(), None,
            check=lambda out: out.tolist() == [0, 3, 0, 5, 0]),
        Case("to_pairs-int8-fits", lambda: nnsparse.to_pairs(
            torch.sparse_coo_tensor(torch.tensor([[100]]), torch.tensor([1], dtype=torch.int8), (101,))),
            None, check=lambda out: out.tolist() == [[100, 1]]),
        Case("collate-int32-indices", lambda: nnsparse.densify(collate_sparse_rows(
            [(0, (torch.tensor([0, 3], dtype=torch.int32), torch.tensor([1.0, 2.0])))], 4)[1]),
            None, check=lambda out: out.tolist() == [[1.0, 0, 0, 2.0]]),
    ]
    return cases


# -- everything else: shapes, widths, dtypes, NaN, narrow dtypes, constructor arguments ----------

S = X.to_sparse_csr()
_R = synthetic_ratings(seed=0, n_users=10, n_items=8, n_ratings=40)
_P = [nn.Parameter(torch.ones(2))]


def _builder_with(value, dtype):
    b = nnsparse.DynamicSparseTensor(dtype=dtype)
    b.append(0, value)


OTHER = [
    # width mismatch
    Case("SparseLinearBatch-narrower-input", lambda: nnsparse.SparseLinearBatch(5, 3)(S),
         ValueError, r"input has width 4, smaller than in_features 5"),
    Case("SparseLinearBatch-wider-input", lambda: nnsparse.SparseLinearBatch(3, 3)(S),
         ValueError, r"input has width 4, larger than in_features 3$"),
    Case("sparse_linear-wider-input", lambda: nnsparse.sparse_linear(S, torch.ones(2, 3)),
         ValueError, r"input has width 4, larger than in_features 3$"),
    Case("SparseWeightLinear-wider-input", lambda: nnsparse.SparseWeightLinear(
        torch.eye(2, 3).to_sparse())(S), ValueError, r"input has width 4, larger than in_features 3$"),
    Case("SparseLinearBatch-dense-wrong-width", lambda: nnsparse.SparseLinearBatch(4, 3)(torch.ones(2, 5)),
         ValueError, r"input must have 4 features \(in_features\)"),
    Case("SparseOutputLinear-pattern-wider", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 3), torch.zeros(2, 5).to_sparse_csr()), ValueError,
         r"pattern has width 5, larger than out_features 4$"),
    Case("SparseOutputLinear-pattern-narrower", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 3), torch.zeros(2, 3).to_sparse_csr()), ValueError,
         r"pattern has width 3, smaller than out_features 4"),
    Case("SparseOutputLinear-pattern-rows", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(3, 3), S), ValueError, r"pattern must have 3 rows, as input, got 2"),
    Case("SparseOutputLinear-input-width", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 2), S), ValueError, r"input must have 3 features \(in_features\), got 2"),
    Case("Densify-narrower-size", lambda: nnsparse.Densify(3)(S), ValueError,
         r"input has width 4, larger than in_features 3$"),
    Case("densify-size-too-small", lambda: nnsparse.densify(S, size=(2, 3)), ValueError,
         r"size must have at least 4 columns, got 3"),
    Case("densify-size-negative-rows", lambda: nnsparse.densify(S, size=(-2, 4)), ValueError,
         r"size must have at least 2 rows, got -2"),
    Case("densify-size-wrong-type", lambda: nnsparse.densify(S, size="x"), ValueError,
         r"size of a batch must be a \(rows, width\) tuple, got 'x'"),
    Case("SparseCriterion-width", lambda: nnsparse.SparseCriterion(nn.MSELoss())(torch.ones(2, 3), S),
         ValueError, r"target has width 4, the estimate has 3 columns"),
    Case("SDAECriterion-shape", lambda: nnsparse.SDAECriterion(nn.MSELoss())(
        torch.ones(2, 4), torch.ones(2, 3), mask=torch.ones(2, 4, dtype=torch.bool)), ValueError,
         r"target has shape \(2, 3\), estimate has \(2, 4\)"),
    Case("from_pairs-index-beyond-size", lambda: nnsparse.from_pairs(torch.tensor([[5.0, 2.0]]), size=3),
         ValueError, r"pairs indices must be in \[0, 3\), got max 5"),
    Case("from_pairs-shape", lambda: nnsparse.from_pairs(torch.ones(2, 3)), ValueError,
         r"pairs must be a pair tensor of shape \(k, 2\), got shape \(2, 3\)"),
    Case("Batchifier-network-width", lambda: nnsparse.Batchifier(nnsparse.Densify(4), 3,
                                                                 progress=False)(S),
         ValueError, r"network must return a dense tensor of shape \(2, 3\)"),
    Case("rmse-shapes", lambda: rmse(torch.ones(3), torch.ones(2)), ValueError,
         r"prediction and target must have one shape"),
    Case("rating_matrix-values-length", lambda: rating_matrix(_R, values=torch.ones(3)), ValueError,
         r"values must have shape \(40,\), got \(3,\)"),
    Case("rating_matrix-shape-too-small", lambda: rating_matrix(_R, shape=(2, 2)), ValueError,
         r"item matrix row indices must be in \[0, 2\)"),
    Case("rating_matrix-user-edited-negative", lambda: (lambda r: (
        r.user.__setitem__(0, -10 ** 12), rating_matrix(r)))(Ratings.from_triples(
            [10, 42], [7, 7], [4., 5.])), ValueError,
         r"item matrix column indices must be in \[0, 2\), got min -1000000000000"),
    Case("SparseRowDataset-target-rows", lambda: SparseRowDataset(S, torch.zeros(3, 2).to_sparse_csr()),
         ValueError, r"target must have 2 rows like input, got 3"),
    Case("Ratings-lengths", lambda: Ratings(torch.ones(2), torch.ones(2), torch.ones(3), {}, {}),
         ValueError, r"must have one length, got 2, 2 and 3"),
    # float / NaN / inf indices
    Case("from_pairs-float-index", lambda: nnsparse.from_pairs(torch.tensor([[1.5, 2.0]])),
         ValueError, r"pairs indices must be integers, got 1.5"),
    Case("from_pairs-nan-index", lambda: nnsparse.from_pairs(torch.tensor([[math.nan, 2.0]])),
         ValueError, r"pairs indices must be finite integers, got nan"),
    Case("from_pairs-inf-index", lambda: nnsparse.from_pairs(torch.tensor([[math.inf, 2.0]])),
         ValueError, r"pairs indices must be finite integers, got inf"),
    Case("from_pairs-negative-index", lambda: nnsparse.from_pairs(torch.tensor([[-1.0, 2.0]])),
         ValueError, r"pairs indices must be non-negative, got min -1"),
    Case("from_pairs-bool", lambda: nnsparse.from_pairs(torch.tensor([[True, False]])),
         TypeError, r"pairs indices must be real numbers, got dtype torch.bool"),
    Case("densify-float-pair-index", lambda: nnsparse.densify(torch.tensor([[0.5, 1.0]])),
         ValueError, r"x indices must be integers, got 0.5"),
    Case("ssort-nan-pair-index", lambda: nnsparse.ssort(torch.tensor([[math.nan, 1.0]])),
         ValueError, r"x indices must be finite integers, got nan"),
    Case("collate-float-indices", lambda: collate_sparse_rows(
        [(0, (torch.tensor([1.0]), torch.tensor([1.0])))], 4), TypeError,
         r"rows\[0\] indices must be an integer tensor, got torch.float32"),
    Case("SparseRowDataset-float-index", lambda: SparseRowDataset(S)[1.5], TypeError,
         r"index must be an int, got float 1.5"),
    Case("rating_matrix-nan-values", lambda: rating_matrix(_R, values=torch.full((40,), math.nan)),
         ValueError, r"values must be finite, got NaN or inf"),
    Case("SDAE-alpha-nan", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=math.nan),
         ValueError, r"alpha must be finite, got nan"),
    Case("SDAE-hide_ratio-nan", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), hide_ratio=math.nan),
         ValueError, r"hide_ratio must be finite, got nan"),
    Case("random_split-nan", lambda: random_split(_R, test=math.nan), ValueError,
         r"test must be a number in \[0, 1\), got nan"),
    # mixed dtype
    Case("SparseLinearBatch-dtype", lambda: nnsparse.SparseLinearBatch(4, 3)(S.double()), ValueError,
         r"input must have the weight's dtype torch.float32, got torch.float64"),
    Case("SparseLinearBatch-integer-values", lambda: nnsparse.SparseLinearBatch(4, 3)(
        torch.tensor([[1, 0, 2, 0]]).to_sparse()), ValueError,
         r"input must have the weight's dtype torch.float32, got torch.int64"),
    Case("SparseOutputLinear-dtype", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 3, dtype=torch.float64), S), ValueError,
         r"weight must have input's dtype torch.float64, got torch.float32"),
    Case("from_pairs-mixed-dtype-rows", lambda: nnsparse.from_pairs(
        [torch.tensor([[1.0, 2.0]]), torch.tensor([[1, 2]])]), TypeError,
         r"pairs rows must share one dtype"),
    Case("densify-mixed-forms", lambda: nnsparse.densify([X[0].to_sparse(), torch.tensor([[1.0, 2.0]])]),
         TypeError, r"x mixes sparse vectors and pair tensors"),
    # sparse-for-dense and dense-for-sparse
    Case("sparsify-sparse", lambda: nnsparse.sparsify(S), TypeError,
         r"x must be a dense tensor, got layout torch.sparse_csr"),
    Case("Sparsify-sparse", lambda: nnsparse.Sparsify()(S), TypeError,
         r"x must be a dense tensor, got layout torch.sparse_csr"),
    Case("SparseOutputLinear-sparse-input", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 3).to_sparse(), S), TypeError, r"input must be a dense tensor, got torch.sparse_coo"),
    Case("SparseOutputLinear-dense-pattern", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 3), X), TypeError, r"pattern must be sparse, got a dense.*nnsparse.sparsify"),
    Case("SparseCriterion-dense-target", lambda: nnsparse.SparseCriterion(nn.MSELoss())(
        torch.ones(2, 4), X), TypeError, r"target must be sparse, got a dense.*nnsparse.sparsify"),
    Case("SDAESparseCriterion-dense-input", lambda: nnsparse.SDAESparseCriterion(
        nn.MSELoss()).prepare_input(X), TypeError, r"input must be sparse, got a dense"),
    Case("SDAECriterion-sparse-input", lambda: nnsparse.SDAECriterion(nn.MSELoss()).prepare_input(S),
         TypeError, r"SDAECriterion corrupts dense tensors.*use SDAESparseCriterion"),
    Case("SDAESparseCriterion-float-mask", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss())(
        torch.ones(2, 4), S, mask=torch.ones(2, 4)), TypeError, r"mask must be a dense bool tensor"),
    Case("Densify-dense-batch", lambda: nnsparse.Densify(4)(X), ValueError,
         r"input must be a pair tensor of shape \(k, 2\), got shape \(2, 4\)"),
    Case("from_pairs-sparse", lambda: nnsparse.from_pairs(S), TypeError,
         r"pairs must be a dense \(k, 2\) tensor or a list of them, got layout torch.sparse_csr"),
    Case("rmse-sparse", lambda: rmse(torch.ones(3).to_sparse(), torch.ones(3)), TypeError,
         r"prediction must be a dense tensor, got layout torch.sparse_coo"),
    Case("mae-list", lambda: mae([1.0], torch.ones(1)), TypeError,
         r"prediction must be a dense tensor, got list"),
    Case("SparseRowDataset-dense", lambda: SparseRowDataset(X), TypeError,
         r"input must be a 2-D sparse CSR or COO tensor, got layout torch.strided"),
    Case("Sparsify-3d", lambda: nnsparse.Sparsify()(torch.ones(2, 2, 2)), ValueError,
         r"x must be 1-D \(a vector\) or 2-D \(rows, n\), got 3 dimensions"),
    # narrow dtypes
    Case("to_pairs-int8-index-200", lambda: nnsparse.to_pairs(torch.sparse_coo_tensor(
        torch.tensor([[200]]), torch.tensor([1], dtype=torch.int8), (300,))), ValueError,
         r"int64 indices .* cannot be cast exactly to the values' dtype torch.int8"),
    Case("to_pairs-bool", lambda: nnsparse.to_pairs(torch.sparse_coo_tensor(
        torch.tensor([[2]]), torch.tensor([True]), (3,))), ValueError,
         r"cannot be cast exactly to the values' dtype torch.bool"),
    Case("to_pairs-float16-index-3000", lambda: nnsparse.to_pairs(torch.sparse_coo_tensor(
        torch.tensor([[3000]]), torch.tensor([1.0], dtype=torch.float16), (3001,))), ValueError,
         r"cannot be stored exactly as torch.float16"),
    Case("builder-int8-1000", lambda: _builder_with(1000, torch.int8), ValueError,
         r"value 1000 does not fit in dtype torch.int8: its range is \[-128, 127\]"),
    Case("builder-float16-1e6", lambda: _builder_with(1e6, torch.float16), ValueError,
         r"does not fit in dtype torch.float16"),
    Case("builder-int16-extend", lambda: nnsparse.DynamicSparseTensor(dtype=torch.int16).extend(
        [0], torch.tensor([70000])), ValueError, r"values must fit in dtype torch.int16"),
    # bad arguments and constructor arguments, wrong types included
    Case("SparseLinearBatch-negative", lambda: nnsparse.SparseLinearBatch(-1, 3), ValueError,
         r"in_features must be non-negative, got -1"),
    Case("SparseLinearBatch-str", lambda: nnsparse.SparseLinearBatch("4", 3), TypeError,
         r"in_features must be an int, got str"),
    Case("SparseLinearBatch-float", lambda: nnsparse.SparseLinearBatch(4, 3.5), TypeError,
         r"out_features must be an int, got float"),
    Case("SparseLinearBatch-lua-third-arg", lambda: nnsparse.SparseLinearBatch(4, 3, True), TypeError,
         r"takes bias, sparse_grad and mode as keywords"),
    Case("SparseLinearBatch-mode", lambda: nnsparse.SparseLinearBatch(4, 3, mode="x"), ValueError,
         r"mode must be one of"),
    Case("SparseLinearBatch-sparse_grad-str", lambda: nnsparse.SparseLinearBatch(4, 3, sparse_grad="y"),
         TypeError, r"sparse_grad must be a bool, got str"),
    Case("SparseOutputLinear-negative", lambda: nnsparse.SparseOutputLinear(-3, 4), ValueError,
         r"in_features must be non-negative, got -3"),
    Case("SparseOutputLinear-str", lambda: nnsparse.SparseOutputLinear(3, "4"), TypeError,
         r"out_features must be an int, got str"),
    Case("SparseOutputLinear-bias-str", lambda: nnsparse.SparseOutputLinear(3, 4, bias="no"),
         TypeError, r"bias must be a bool, got str"),
    Case("Densify-negative", lambda: nnsparse.Densify(-1), ValueError,
         r"in_features must be a non-negative int, got -1"),
    Case("Densify-str", lambda: nnsparse.Densify("a"), TypeError,
         r"in_features must be a non-negative int, got str"),
    Case("Densify-elem-str", lambda: nnsparse.Densify(4, elem="x"), TypeError,
         r"elem must be a number, got str"),
    Case("densify-elem-str", lambda: nnsparse.densify(S, elem="x"), TypeError,
         r"elem must be a number, got str"),
    Case("Sparsify-layout", lambda: nnsparse.Sparsify(layout=torch.strided), TypeError,
         r"layout must be torch.sparse_coo or torch.sparse_csr"),
    Case("Sparsify-offset", lambda: nnsparse.Sparsify(offset=-1), ValueError,
         r"offset must be a non-negative int, got -1"),
    Case("Sparsify-elem-none", lambda: nnsparse.Sparsify(elem=None), TypeError,
         r"elem must be a number, got NoneType"),
    Case("sparsify-offset-str", lambda: nnsparse.sparsify(X, offset="1"), TypeError,
         r"offset must be a non-negative int, got '1'"),
    Case("from_pairs-size-str", lambda: nnsparse.from_pairs(torch.tensor([[1.0, 2.0]]), size="3"),
         TypeError, r"size must be an int, got str"),
    Case("stopk-negative-k", lambda: nnsparse.stopk(S, -1), ValueError, r"k must be a non-negative int, got -1"),
    Case("stopk-float-k", lambda: nnsparse.stopk(S, 1.5), TypeError, r"k must be a non-negative int, got 1.5"),
    Case("ssort-descending-str", lambda: nnsparse.ssort(S, descending="yes"), TypeError,
         r"descending must be a bool, got str"),
    Case("values_map-not-callable", lambda: nnsparse.values_map("sin", S), TypeError,
         r"fn must be callable"),
    Case("values_map-changes-shape", lambda: nnsparse.values_map(lambda v: v[:1], S), ValueError,
         r"fn must keep the values' shape \(4,\), got \(1,\)"),
    Case("ValuesMap-not-callable", lambda: nnsparse.ValuesMap(3), TypeError, r"fn must be callable"),
    Case("SparseCriterion-str", lambda: nnsparse.SparseCriterion("mse"), TypeError,
         r"criterion must be a loss module such as nn.MSELoss\(\), got str"),
    Case("SparseCriterion-reduction-none", lambda: nnsparse.SparseCriterion(nn.MSELoss(reduction="none")),
         ValueError, r"reduction must be 'mean' or 'sum'"),
    Case("SDAE-hide_ratio", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), hide_ratio=1.5),
         ValueError, r"hide_ratio must be in \[0, 1\], got 1.5"),
    Case("SDAE-alpha-str", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha="x"), TypeError,
         r"alpha must be a real number, got str"),
    Case("SDAE-noise_std", lambda: nnsparse.SDAECriterion(nn.MSELoss(), noise_std=-1), ValueError,
         r"noise_std must be non-negative, got -1"),
    Case("SDAE-flip_range", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), flip_range=(1,)),
         ValueError, r"flip_range must hold 2 values"),
    Case("SDAE-generator", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), generator=3), TypeError,
         r"generator must be a torch.Generator or None, got int"),
    Case("SDAE-ratios-sum", lambda: nnsparse.SDAECriterion(nn.MSELoss(), noise_ratio=0.6,
                                                           hide_ratio=0.6), ValueError,
         r"noise_ratio \+ flip_ratio \+ hide_ratio must be at most 1"),
    Case("MaskCriterion-hide_ratio", lambda: nnsparse.MaskCriterion(nn.MSELoss(), hide_ratio=2),
         ValueError, r"hide_ratio must be in \[0, 1\], got 2"),
    Case("MaskCriterion-none", lambda: nnsparse.MaskCriterion(None), TypeError,
         r"criterion must be a loss module such as nn.MSELoss\(\), got NoneType"),
    Case("MaskCriterion-beta-str", lambda: nnsparse.MaskCriterion(nn.MSELoss(), beta="0"), TypeError,
         r"beta must be a real number, got str"),
    Case("MaskCriterion-without-prepare_input", lambda: nnsparse.MaskCriterion(nn.MSELoss())(
        torch.ones(2, 4), S), ValueError, r"no mask: call prepare_input on the batch first"),
    Case("Batchifier-output_size", lambda: nnsparse.Batchifier(nn.Identity(), -1), ValueError,
         r"output_size must be an int >= 0, got -1"),
    Case("Batchifier-batch_size", lambda: nnsparse.Batchifier(nn.Identity(), 4, batch_size=0),
         ValueError, r"batch_size must be an int >= 1, got 0"),
    Case("Batchifier-network", lambda: nnsparse.Batchifier("net", 4), TypeError,
         r"network must be an nn.Module, got str"),
    Case("LazyAdam-lr", lambda: LazyAdam(_P, lr=-1), ValueError, r"lr must be non-negative, got -1"),
    Case("LazyAdam-betas", lambda: LazyAdam(_P, betas=(1.5, 0.9)), ValueError,
         r"betas must be in \[0, 1\), got \(1.5, 0.9\)"),
    Case("LazyAdam-eps", lambda: LazyAdam(_P, eps=-1), ValueError, r"eps must be non-negative, got -1"),
    Case("DynamicSparseTensor-reserve", lambda: nnsparse.DynamicSparseTensor(reserve=-1), ValueError,
         r"reserve must be non-negative, got -1"),
    Case("DynamicSparseTensor-dtype-bool", lambda: nnsparse.DynamicSparseTensor(dtype=torch.bool),
         TypeError, r"dtype must be a floating or integer torch.dtype, got torch.bool"),
    Case("DynamicSparseTensor-dtype-str", lambda: nnsparse.DynamicSparseTensor(dtype="float"),
         TypeError, r"dtype must be a floating or integer torch.dtype, got str 'float' "
                    r"\(use torch.float32\)"),
    Case("DynamicSparseTensor-mult_coef", lambda: nnsparse.DynamicSparseTensor(mult_coef=1), ValueError,
         r"mult_coef must be > 1"),
    Case("DynamicSparseTensor-append-bool-index",
         lambda: nnsparse.DynamicSparseTensor().append(True, 1.0), TypeError,
         r"index must be an int, got bool True"),
    Case("DynamicSparseTensor-append-bool-in-tuple",
         lambda: nnsparse.DynamicSparseTensor(ndim=2).append((1, False), 1.0), TypeError,
         r"index must be an int, got bool False"),
    Case("read_ratings-format", lambda: read_ratings("x", format="xx"), ValueError,
         r"format must be one of \['auto', 'ml-100k', 'ml-1m', 'csv', 'text'\], got 'xx'"),
    Case("read_ratings-path-int", lambda: read_ratings(3), TypeError,
         r"path must be a str or os.PathLike, got int"),
    Case("read_ratings-unseen", lambda: read_ratings("x", unseen="skip"), ValueError,
         r"unseen must be 'keep' or 'drop', got 'skip'"),
    Case("read_ratings-user_map-list", lambda: read_ratings("x", user_map=[1]), TypeError,
         r"user_map must be a dict"),
    Case("random_split-ratio", lambda: random_split(_R, test=1.5), ValueError,
         r"test must be a number in \[0, 1\), got 1.5"),
    Case("random_split-sum", lambda: random_split(_R, test=0.6, validation=0.5), ValueError,
         r"test \+ validation must be below 1"),
    Case("random_split-not-ratings", lambda: random_split("r"), TypeError,
         r"ratings must be a Ratings record .*got str"),
    Case("random_split-seed-str", lambda: random_split(_R, seed="x"), TypeError,
         r"seed must be an int, got str"),
    Case("split_ratings-ratio", lambda: split_ratings(_R, ratio=-0.1), ValueError,
         r"ratio must be a number in \[0, 1\), got -0.1"),
    Case("holdout_split-not-ratings", lambda: holdout_split(_R, "t"), TypeError,
         r"test must be a Ratings record"),
    Case("rating_matrix-orientation", lambda: rating_matrix(_R, "x"), ValueError,
         r"orientation must be 'item' or 'user', got 'x'"),
    Case("rating_matrix-layout", lambda: rating_matrix(_R, layout=torch.strided), TypeError,
         r"layout must be torch.sparse_csr or torch.sparse_coo"),
    Case("rating_matrix-not-ratings", lambda: rating_matrix("r"), TypeError,
         r"ratings must be a Ratings record"),
    Case("rating_matrix-shape-str", lambda: rating_matrix(_R, shape="x"), TypeError,
         r"shape must be two non-negative ints"),
    Case("RatingNormalizer-orientation", lambda: RatingNormalizer(_R, "x"), ValueError,
         r"orientation must be 'item' or 'user'"),
    Case("RatingNormalizer-not-ratings", lambda: RatingNormalizer(None), TypeError,
         r"train must be a Ratings record"),
    Case("RatingNormalizer-scale", lambda: RatingNormalizer(_R, scale=(5, 1)), ValueError,
         r"scale must have min < max"),
    Case("mean_prediction-by", lambda: mean_prediction(_R, _R, by="x"), ValueError,
         r"orientation must be 'item' or 'user'"),
    Case("synthetic_ratings-negative", lambda: synthetic_ratings(n_users=-1), ValueError,
         r"n_users must be a positive int, got -1"),
    Case("SparseRowDataset-layout", lambda: SparseRowDataset(S, layout=torch.strided), TypeError,
         r"layout must be torch.sparse_csr or torch.sparse_coo"),
    Case("collate_sparse_rows-width-str", lambda: collate_sparse_rows([], "4"), TypeError,
         r"width must be an int, got str"),
    Case("trust-dense", lambda: nnsparse.trust(X), TypeError,
         r"x must be a sparse COO or CSR tensor, got layout torch.strided"),
]


# The files the probes' cases read are written under pytest's tmp_path_factory (a
# mkdtemp in /tmp left 390 nnsparse-probe*-* directories there over earlier runs).
_TMP_ROOT = None


@pytest.fixture(autouse=True, scope="module")
def _tmp_root_dir(tmp_path_factory):
    global _TMP_ROOT
    _TMP_ROOT = str(tmp_path_factory.mktemp("bad-inputs-files"))
    yield
    _TMP_ROOT = None


def _tmp_root():
    """This module's directory for files (set while its tests run)."""
    if _TMP_ROOT is None:
        raise RuntimeError("the files of tests/test_bad_inputs.py are written while its tests "
                           "run (under pytest's tmp_path_factory)")
    return _TMP_ROOT


# -- the second probe (wt-probe2): what the tables above did not reach --------------------------

def _meta_coo():
    return torch.sparse_coo_tensor(torch.tensor([[0], [1]], device="meta"),
                                   torch.ones(1, device="meta"), (2, 4))


def _pairs_file(text):
    import os
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="probe2-", dir=_tmp_root()), "r.txt")
    with open(path, "w") as f:
        f.write(text)
    return path


_W = torch.randn(3, 4)
_N = RatingNormalizer(_R)
_OTHER_R = synthetic_ratings(seed=1, n_users=5, n_items=5, n_ratings=10)

PROBE2 = [
    # sparse_linear: the functional form checks its weight and bias
    Case("sparse_linear-weight-1d", lambda: nnsparse.sparse_linear(S, torch.ones(4)), ValueError,
         r"weight must have shape \(out_features, in_features\), got \(4,\)"),
    Case("sparse_linear-weight-sparse", lambda: nnsparse.sparse_linear(S, _W.to_sparse()), TypeError,
         r"weight must be a dense tensor, got torch.sparse_coo"),
    Case("sparse_linear-weight-str", lambda: nnsparse.sparse_linear(S, "w"), TypeError,
         r"weight must be a dense tensor, got str"),
    Case("sparse_linear-bias-shape", lambda: nnsparse.sparse_linear(S, _W, torch.ones(4)), ValueError,
         r"bias must have shape \(3,\) \(out_features\), got \(4,\)"),
    Case("sparse_linear-bias-2d", lambda: nnsparse.sparse_linear(S, _W, torch.ones(1, 3)), ValueError,
         r"bias must have shape \(3,\) \(out_features\), got \(1, 3\)"),
    Case("sparse_linear-bias-dtype", lambda: nnsparse.sparse_linear(S, _W, torch.ones(3).double()),
         ValueError, r"bias must have the weight's dtype torch.float32, got torch.float64"),
    Case("sparse_linear-bias-device", lambda: nnsparse.sparse_linear(S, _W, torch.ones(3, device="meta")),
         ValueError, r"bias must be on the weight's device cpu, got meta"),
    Case("sparse_linear-weight-device", lambda: nnsparse.sparse_linear(S, _W.to("meta")), ValueError,
         r"input must be on the weight's device meta, got cpu"),
    Case("SparseLinearBatch-dense-float64", lambda: nnsparse.SparseLinearBatch(4, 3)(X.double()),
         ValueError, r"input must have the weight's dtype torch.float32, got torch.float64"),
    Case("SparseLinearBatch-dense-int", lambda: nnsparse.SparseLinearBatch(4, 3)(X.long()),
         ValueError, r"input must have the weight's dtype torch.float32, got torch.int64"),
    Case("SparseLinearBatch-dense-device", lambda: nnsparse.SparseLinearBatch(4, 3)(X.to("meta")),
         ValueError, r"input must be on the weight's device cpu, got meta"),
    Case("SparseLinearBatch-meta-sparse", lambda: nnsparse.SparseLinearBatch(4, 3)(_meta_coo()),
         ValueError, r"input must be on the weight's device cpu, got meta"),
    Case("SparseOutputLinear-meta-pattern", lambda: nnsparse.SparseOutputLinear(3, 4)(
        torch.ones(2, 3), _meta_coo()), ValueError, r"pattern must be on input's device cpu, got meta"),
    Case("SparseCriterion-meta-target", lambda: nnsparse.SparseCriterion(nn.MSELoss())(
        torch.zeros(2, 4), _meta_coo()), ValueError, r"target is on meta, estimate on cpu"),
    Case("SparseLinearBatch-dtype-int64", lambda: nnsparse.SparseLinearBatch(4, 3, dtype=torch.int64),
         TypeError, r"dtype must be a floating-point torch.dtype .*got torch.int64"),
    Case("SparseOutputLinear-dtype-int64", lambda: nnsparse.SparseOutputLinear(4, 3, dtype=torch.int64),
         TypeError, r"dtype must be a floating-point torch.dtype .*got torch.int64"),
    Case("SparseLinearBatch-bool-size", lambda: nnsparse.SparseLinearBatch(True, 3), TypeError,
         r"in_features must be an int, got bool True"),
    Case("SparseLinearBatch-numpy-size-works", lambda: nnsparse.SparseLinearBatch(
        __import__("numpy").int64(4), 3).in_features, None, check=lambda n: n == 4 and type(n) is int),
    Case("SparseOutputLinear-numpy-size-works", lambda: nnsparse.SparseOutputLinear(
        3, __import__("numpy").int64(4)).out_features, None, check=lambda n: n == 4),
    Case("sampled_linear-sparse_grad-str", lambda: nnsparse.sampled_linear(
        torch.ones(2, 3), torch.ones(4, 3), pattern=S, sparse_grad="y"), TypeError,
         r"sparse_grad must be a bool, got str 'y'"),
    Case("sampled_linear-no-pattern-bias", lambda: nnsparse.sampled_linear(
        torch.ones(2, 3), torch.ones(4, 3), torch.ones(5)), ValueError,
         r"bias must have shape \(4,\) \(out_features\), got \(5,\)"),
    Case("sampled_linear-no-pattern-width", lambda: nnsparse.sampled_linear(
        torch.ones(2, 2), torch.ones(4, 3)), ValueError, r"input must have 3 features \(in_features\), got 2"),
    Case("SparseOutputLinear-0d-input", lambda: nnsparse.SparseOutputLinear(3, 4)(torch.tensor(1.0)),
         ValueError, r"input must have 3 features \(in_features\), got a 0-d tensor"),
    Case("SparseWeightLinear.random-seed-str", lambda: nnsparse.SparseWeightLinear.random(
        4, 3, 0.5, seed="a"), TypeError, r"seed must be an int or None, got str 'a'"),
    Case("PatternSequential.insert-index-str", lambda: nnsparse.PatternSequential(nn.ReLU()).insert(
        "a", nn.ReLU()), TypeError, r"index must be an int, got str 'a'"),
    Case("PatternSequential.insert-index-range", lambda: nnsparse.PatternSequential(nn.ReLU()).insert(
        5, nn.ReLU()), IndexError, r"index must be in \[-1, 1\], got 5"),
    # sizes and values
    Case("densify-size-float", lambda: nnsparse.densify(S, size=(2.0, 4.0)), TypeError,
         r"size must hold ints, got float 2.0"),
    Case("densify-size-bool", lambda: nnsparse.densify(S, size=(True, 4)), TypeError,
         r"size must hold ints, got bool True"),
    Case("densify-vector-size-float", lambda: nnsparse.densify(X[0].to_sparse(), size=4.5), TypeError,
         r"size must hold ints, got float 4.5"),
    Case("densify-size-numpy-works", lambda: nnsparse.densify(S, size=(__import__("numpy").int64(2), 5)),
         None, check=lambda out: out.shape == (2, 5) and torch.equal(out[:, :4], X)),
    Case("densify-size-float-for-batch", lambda: nnsparse.densify(S, size=1.5), TypeError,
         r"size of a batch must be a \(rows, width\) tuple, got float 1.5"),
    Case("DynamicSparseTensor-device-bad", lambda: nnsparse.DynamicSparseTensor(device="x"), ValueError,
         r"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got 'x'"),
    Case("DynamicSparseTensor-device-list", lambda: nnsparse.DynamicSparseTensor(device=[0]), TypeError,
         r"device must be None, a torch.device or a name such as 'cpu' or 'cuda:0', got list"),
    Case("sparse_linear-weight-none", lambda: nnsparse.sparse_linear(S, None), TypeError,
         r"weight must be a dense tensor, got NoneType"),
    Case("sampled_linear-weight-none", lambda: nnsparse.sampled_linear(torch.ones(2, 3), None, pattern=S),
         TypeError, r"weight must be a dense tensor, got NoneType"),
    Case("LazyAdam-params-none", lambda: LazyAdam(None), TypeError,
         r"params must be an iterable of parameters or of param-group dicts, got NoneType"),
    Case("read_ratings-format-list", lambda: read_ratings("x", format=["csv"]), TypeError,
         r"format must be one of \['auto', 'ml-100k', 'ml-1m', 'csv', 'text'\] \(a str\), got list "
         r"\['csv'\]"),  # a TypeError since probe 12 (a wrong kind)
    Case("collate_sparse_rows-rows-none", lambda: collate_sparse_rows(None, 4), TypeError,
         r"rows must be a list of \(row_index, \(indices, values\)\) pairs, got NoneType"),
    Case("mean_prediction-by-names-argument", lambda: mean_prediction(_R, _R, by="x"), ValueError,
         r"by: orientation must be 'item' or 'user', got 'x'"),
    Case("densify-elem-fraction-int-values", lambda: nnsparse.densify(X.long().to_sparse(), elem=0.5),
         ValueError, r"elem must be stored exactly in the values' dtype torch.int64 .*got 0.5"),
    Case("densify-elem-beyond-int8", lambda: nnsparse.densify(X.to(torch.int8).to_sparse(), elem=300),
         ValueError, r"elem must be stored exactly in the values' dtype torch.int8 \(an integer in "
                     r"\[-128, 127\]\), got 300"),
    Case("densify-elem-inf-int-values", lambda: nnsparse.densify(X.long().to_sparse(), elem=math.inf),
         ValueError, r"elem must be stored exactly in the values' dtype torch.int64 .*got inf"),
    Case("densify-elem-complex", lambda: nnsparse.densify(S, elem=1j), TypeError,
         r"elem must be a real number for values of dtype torch.float32, got 1j"),
    Case("densify-elem-int-values-works", lambda: nnsparse.densify(X.long().to_sparse(), elem=-1), None,
         check=lambda out: out.dtype == torch.int64 and out.tolist() == [[1, -1, 2, -1], [-1, 3, -1, 4]]),
    Case("sparsify-offset-numpy-works", lambda: nnsparse.sparsify(X, offset=__import__("numpy").int64(1)),
         None, check=lambda out: out.shape == (2, 5) and torch.equal(out.to_dense()[:, 1:], X)),
    Case("Densify-numpy-size-works", lambda: nnsparse.Densify(__import__("numpy").int64(4))(S), None,
         check=_close(lambda: X)),
    Case("values_map-fn-returns-list", lambda: nnsparse.values_map(lambda v: v.tolist(), S), TypeError,
         r"fn must return a Tensor, got list"),
    Case("values_map-fn-moves-values", lambda: nnsparse.values_map(lambda v: v.to("meta"), S),
         ValueError, r"fn must keep the values' device cpu, got meta"),
    # DynamicSparseTensor
    Case("DynamicSparseTensor-mult_coef-inf", lambda: nnsparse.DynamicSparseTensor(mult_coef=math.inf),
         ValueError, r"mult_coef must be finite, got inf"),
    Case("DynamicSparseTensor.append-tensor-of-2", lambda: nnsparse.DynamicSparseTensor().append(
        0, torch.tensor([1.0, 2.0])), ValueError, r"value must be a single number, got a tensor of shape \(2,\)"),
    Case("DynamicSparseTensor.extend-str", lambda: nnsparse.DynamicSparseTensor().extend("ab", [1.0, 2.0]),
         TypeError, r"indices must be a tensor or a sequence of numbers, got str"),
    Case("DynamicSparseTensor.build-size-float", lambda: nnsparse.DynamicSparseTensor().build(size=5.0),
         TypeError, r"size must be an int or a tuple of 1 ints, got float 5.0"),
    Case("DynamicSparseTensor.build-size-bool", lambda: nnsparse.DynamicSparseTensor().build(size=(True,)),
         TypeError, r"size must be an int, got bool"),
    # criteria
    Case("SparseCriterion-full_size_average-str", lambda: nnsparse.SparseCriterion(
        nn.MSELoss(), full_size_average="y"), TypeError, r"full_size_average must be a bool, got str 'y'"),
    Case("SparseCriterion-complex-target", lambda: nnsparse.SparseCriterion(nn.MSELoss())(
        torch.zeros(2, 4), X.to(torch.complex64).to_sparse()), TypeError,
         r"target values must be real numbers, got dtype torch.complex64"),
    Case("SDAE-alpha-negative", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=-1.0), ValueError,
         r"alpha must be non-negative, got -1.0"),
    Case("SDAE-beta-negative", lambda: nnsparse.SDAECriterion(nn.MSELoss(), beta=-0.5), ValueError,
         r"beta must be non-negative, got -0.5"),
    Case("MaskCriterion-alpha-negative", lambda: nnsparse.MaskCriterion(nn.MSELoss(), alpha=-1.0),
         ValueError, r"alpha must be non-negative, got -1.0"),
    Case("SDAE-flip_range-int", lambda: nnsparse.SDAESparseCriterion(nn.MSELoss(), flip_range=3),
         TypeError, r"flip_range must be a pair \(low, high\), got int 3"),
    Case("SDAE-noise-on-integers", lambda: nnsparse.SDAESparseCriterion(
        nn.MSELoss(), noise_ratio=0.5).prepare_input(X.long().to_sparse()), TypeError,
         r"input values must be floating point for noise_ratio > 0 \(Gaussian noise\), got dtype torch.int64"),
    Case("SDAECriterion-noise-on-integers", lambda: nnsparse.SDAECriterion(
        nn.MSELoss(), noise_ratio=0.5).prepare_input(X.long()), TypeError,
         r"input values must be floating point for noise_ratio > 0"),
    # data: Ratings, readers, splits
    Case("Ratings.from_triples-nan", lambda: Ratings.from_triples([1, 2], [1, 2], [3.0, math.nan]),
         ValueError, r"rating must be finite, got nan"),
    Case("Ratings.from_triples-inf", lambda: Ratings.from_triples([1, 2], [1, 2], [3.0, math.inf]),
         ValueError, r"rating must be finite, got inf"),
    Case("Ratings.from_triples-str-rating", lambda: Ratings.from_triples([1, 2], [1, 2], ["a", "b"]),
         TypeError, r"rating must be a sequence of real numbers"),
    Case("Ratings.from_triples-none-user", lambda: Ratings.from_triples(None, [1], [3.0]), TypeError,
         r"user must be a sequence of ids \(a list, array or tensor\), got NoneType"),
    Case("Ratings.from_triples-scalar-item", lambda: Ratings.from_triples([1], 1, [3.0]), TypeError,
         r"item must be a sequence of ids .*got int"),
    Case("Ratings.from_triples-2d-rating", lambda: Ratings.from_triples([1, 2], [1, 2], [[3.0], [4.0]]),
         ValueError, r"rating must be 1-D, one value per \(user, item\), got shape \(2, 1\)"),
    Case("Ratings.from_triples-tensors-work", lambda: Ratings.from_triples(
        torch.tensor([5, 7]), torch.tensor([1, 1]), torch.tensor([3.0, 4.0])), None,
         check=lambda r: r.user_map == {5: 0, 7: 1} and r.rating.tolist() == [3.0, 4.0]),
    Case("Ratings-float-user", lambda: Ratings(torch.ones(2), torch.zeros(2, dtype=torch.long),
                                               torch.ones(2), {1: 0}, {1: 0}), TypeError,
         r"Ratings.user must be an int64 tensor of indices, got torch.float32"),
    Case("Ratings-int-rating", lambda: Ratings(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                               torch.ones(1, dtype=torch.long), {1: 0}, {1: 0}), TypeError,
         r"Ratings.rating must be a floating-point tensor, got torch.int64"),
    Case("Ratings-map-list", lambda: Ratings(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                                             torch.ones(1), [1], {1: 0}), TypeError,
         r"Ratings.user_map must be a dict of original id -> index, got list"),
    Case("Ratings-user-beyond-map", lambda: Ratings(torch.tensor([0, 5]), torch.tensor([0, 0]), torch.ones(2),
                                                    {1: 0}, {1: 0}), ValueError,
         r"Ratings.user indices must be in \[0, 1\) \(the size of user_map\), got min 0, max 5"),
    Case("Ratings-negative-item", lambda: Ratings(torch.tensor([0]), torch.tensor([-1]), torch.ones(1),
                                                  {1: 0}, {1: 0}), ValueError,
         r"Ratings.item indices must be in \[0, 1\) \(the size of item_map\), got min -1"),
    Case("Ratings-nan-rating", lambda: Ratings(torch.tensor([0]), torch.tensor([0]), torch.tensor([math.nan]),
                                               {1: 0}, {1: 0}), ValueError,
         r"Ratings.rating must be finite, got NaN or inf"),
    Case("Ratings.subset-float", lambda: _R.subset(torch.tensor([0.5])), TypeError,
         r"index must be an integer or bool tensor, got torch.float32"),
    Case("Ratings.subset-str", lambda: _R.subset("a"), TypeError,
         r"index must be an integer or bool tensor, got str"),
    Case("Ratings.subset-mask-length", lambda: _R.subset(torch.ones(3, dtype=torch.bool)), ValueError,
         r"index must have shape \(40,\) as a bool mask, got \(3,\)"),
    Case("Ratings.subset-scalar", lambda: _R.subset(-1), ValueError,
         r"index must be 1-D \(entries to keep\), got shape \(\)"),
    Case("Ratings.from_triples-source-int", lambda: Ratings.from_triples([1], [1], [3.0], source=3), TypeError,
         r"source must be a str, got int"),
    Case("RatingNormalizer.to-bad", lambda: RatingNormalizer(_R).to("x"), ValueError,
         r"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got 'x'"),
    Case("RatingNormalizer.to-float", lambda: RatingNormalizer(_R).to(1.5), TypeError,
         r"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got float"),
    Case("RatingNormalizer.predict_entries-output", lambda: _N.predict_entries("x", torch.arange(8), S), TypeError,
         r"output must be a dense tensor, got str"),
    Case("RatingNormalizer.predict_entries-rows", lambda: _N.predict_entries(torch.zeros(2, 4), [0, 1], S),
         TypeError, r"rows must be an int64 tensor of matrix rows, got list"),
    Case("RatingNormalizer.predict_entries-rows-length", lambda: _N.predict_entries(
        torch.zeros(2, 4), torch.arange(3), S), ValueError,
         r"rows must have shape \(2,\), one per output row, got \(3,\)"),
    Case("RatingNormalizer.predict_entries-target-rows", lambda: _N.predict_entries(
        torch.zeros(3, 4), torch.arange(3), S), ValueError, r"target must have 3 rows like output, got 2"),
    Case("DynamicSparseTensor.build-size-true", lambda: nnsparse.DynamicSparseTensor().build(size=True),
         TypeError, r"size must be an int, got bool"),
    Case("Ratings.subset-list-works", lambda: _R.subset([0, 1]), None,
         check=lambda r: len(r) == 2 and r.user_map is _R.user_map),
    Case("Ratings.subset-empty-list-works", lambda: _R.subset([]), None,  # torch reads [] as float
         check=lambda r: len(r) == 0 and r.user_map is _R.user_map),
    Case("read_ratings-titles-int", lambda: read_ratings(_pairs_file("1 2 3\n"), titles=3), TypeError,
         r"titles must be a bool or a path \(str or os.PathLike\), got int"),
    Case("read_ratings-item_map-str-index", lambda: read_ratings(_pairs_file("1 2 3\n"), item_map={2: "a"}),
         TypeError, r"item_map must map ids to int indices, got str for id 2"),
    Case("read_ratings-item_map-negative", lambda: read_ratings(_pairs_file("1 2 3\n"), item_map={2: -1}),
         ValueError, r"item_map indices must be in \[0, 1\) \(one per id\), got -1 for id 2"),
    Case("read_ratings-item_map-repeated", lambda: read_ratings(_pairs_file("1 2 3\n"),
                                                                item_map={2: 0, 3: 0}),
         ValueError, r"item_map indices must be in \[0, 2\)|item_map indices must be distinct"),
    Case("read_ratings-item_map-gap", lambda: read_ratings(_pairs_file("1 2 3\n"), item_map={2: 5}),
         ValueError, r"item_map indices must be in \[0, 1\) \(one per id\), got 5 for id 2"),
    Case("random_split-test-bool", lambda: random_split(_R, test=True), TypeError,
         r"test must be a number in \[0, 1\), got bool True"),
    Case("random_split-test-str", lambda: random_split(_R, test="0.1"), TypeError,
         r"test must be a number in \[0, 1\), got str '0.1'"),
    Case("rating_matrix-complex-values", lambda: rating_matrix(_R, values=torch.ones(40, dtype=torch.complex64)),
         TypeError, r"values must be real numbers, got dtype torch.complex64"),
    Case("rating_matrix-values-device", lambda: rating_matrix(_R, values=torch.ones(40, device="meta")),
         ValueError, r"values must be on the ratings' device cpu, got meta"),
    # RatingNormalizer
    Case("RatingNormalizer-center-str", lambda: RatingNormalizer(_R, center="y"), TypeError,
         r"center must be a bool, got str 'y'"),
    Case("RatingNormalizer-scale-str", lambda: RatingNormalizer(_R, scale="15"), TypeError,
         r"scale must be a pair of numbers \(min, max\), got '15'"),
    Case("RatingNormalizer-scale-three", lambda: RatingNormalizer(_R, scale=(1, 3, 5)), ValueError,
         r"scale must be a pair of numbers \(min, max\), got \(1, 3, 5\)"),
    Case("RatingNormalizer-scale-nan", lambda: RatingNormalizer(_R, scale=(math.nan, 5)), ValueError,
         r"scale must be finite, got \(nan, 5.0\)"),
    Case("RatingNormalizer-scale-narrower", lambda: RatingNormalizer(_R, scale=(2.0, 3.0)), ValueError,
         r"scale must contain the training ratings' range \[1.0, 5.0\], got \(2.0, 3.0\)"),
    Case("RatingNormalizer.index-not-ratings", lambda: _N.index(torch.ones(3)), TypeError,
         r"ratings must be a Ratings record .*got Tensor"),
    Case("RatingNormalizer.index-other-maps", lambda: _N.index(_OTHER_R), ValueError,
         r"ratings must index users as in the training ratings"),
    Case("RatingNormalizer.matrix-not-ratings", lambda: _N.matrix("r"), TypeError,
         r"ratings must be a Ratings record"),
    Case("RatingNormalizer.matrix-normalize-str", lambda: _N.matrix(_R, normalize="y"), TypeError,
         r"normalize must be a bool, got str"),
    Case("RatingNormalizer.normalize-row-range", lambda: _N.normalize(torch.ones(1), torch.tensor([99])),
         ValueError, r"row indices must be in \[0, 8\), got max 99"),
    Case("RatingNormalizer.normalize-row-negative", lambda: _N.normalize(torch.ones(1), torch.tensor([-1])),
         ValueError, r"row indices must be non-negative, got min -1"),
    Case("RatingNormalizer.normalize-row-float", lambda: _N.normalize(torch.ones(1), torch.tensor([0.5])),
         TypeError, r"row must be an integer tensor, got torch.float32"),
    Case("RatingNormalizer.normalize-str", lambda: _N.normalize("a", torch.tensor([0])), TypeError,
         r"rating must be a dense tensor, got str"),
    Case("RatingNormalizer.normalize-shapes", lambda: _N.normalize(torch.ones(3), torch.zeros(2, dtype=torch.long)),
         ValueError, r"rating and row must have one shape or broadcast, got \(3,\) and \(2,\)"),
    Case("RatingNormalizer.denormalize-row-range", lambda: _N.denormalize(torch.ones(1), torch.tensor([8])),
         ValueError, r"row indices must be in \[0, 8\), got max 8"),
    Case("RatingNormalizer.normalize-int-ratings-work", lambda: _N.normalize(
        torch.tensor([3]), torch.tensor([0])), None,
         check=lambda out: out.dtype == torch.float32
         and torch.allclose(out, _N.normalize(torch.tensor([3.0]), torch.tensor([0])))),
    # metrics, baseline, synthetic data, collate
    Case("rmse-empty", lambda: rmse(torch.ones(0), torch.ones(0)), ValueError,
         r"prediction and target are empty; an error needs at least one entry"),
    Case("rmse-bool", lambda: rmse(torch.ones(2, dtype=torch.bool), torch.ones(2)), TypeError,
         r"prediction must hold real numbers, got dtype torch.bool"),
    Case("mae-complex", lambda: mae(torch.ones(2), torch.ones(2, dtype=torch.complex64)), TypeError,
         r"target must hold real numbers, got dtype torch.complex64"),
    Case("rmse-devices", lambda: rmse(torch.ones(2), torch.ones(2, device="meta")), ValueError,
         r"prediction and target must be on one device, got cpu and meta"),
    Case("rmse-integer-ratings-work", lambda: rmse(torch.tensor([3, 4]), torch.tensor([4, 4])), None,
         check=lambda out: abs(float(out) - math.sqrt(0.5)) < 1e-6),
    Case("mean_prediction-other-maps", lambda: mean_prediction(_R, _OTHER_R), ValueError,
         r"test must index users as in train"),
    Case("synthetic_ratings-noise-nan", lambda: synthetic_ratings(n_users=5, n_items=5, n_ratings=10,
                                                                  noise=math.nan), ValueError,
         r"noise must be non-negative and finite, got nan"),
    Case("synthetic_ratings-sigma-str", lambda: synthetic_ratings(n_users=5, n_items=5, n_ratings=10,
                                                                  user_sigma="a"), TypeError,
         r"user_sigma must be a real number, got str 'a'"),
    Case("synthetic_ratings-titles-str", lambda: synthetic_ratings(n_users=5, n_items=5, n_ratings=10,
                                                                   titles="y"), TypeError,
         r"titles must be a bool, got str 'y'"),
    Case("SparseRowDataset.collate-str", lambda: SparseRowDataset(S).collate("ab"), TypeError,
         r"items must be a list of this dataset's items"),
    Case("SparseRowDataset.collate-foreign-row", lambda: SparseRowDataset(S).collate(
        [(0, (torch.tensor([7]), torch.tensor([1.0])))]), TypeError,
         r"items must be a list of this dataset's items, \(row, row_data\) tuples as dataset\[i\] returns"),
    Case("SparseRowBatch-input-str", lambda: __import__("nnsparse.data", fromlist=["SparseRowBatch"]).SparseRowBatch(
        "a", None, torch.tensor([0])), TypeError, r"input must be a Tensor, got str"),
    Case("collate_sparse_rows-row-index-str", lambda: collate_sparse_rows(
        [("a", (torch.tensor([0]), torch.tensor([1.0])))], 3), TypeError,
         r"rows\[0\] row_index must be an int, got str"),
    # zero sizes
    Case("SparseLinearBatch-no-output-features-works", lambda: _no_outputs(), None,
         check=lambda grad: grad.shape == (0, 4) and not grad.any()),
    Case("SparseCriterion-full_size_average-empty-works", lambda: nnsparse.SparseCriterion(
        nn.MSELoss(), full_size_average=True)(torch.zeros(0, 4), torch.zeros(0, 4).to_sparse_csr()),
         None, check=lambda out: float(out) == 0.0),
    # inference mode: every sparse form, made there, is read (the checked-structure cache
    # read the version counter inference tensors lack)
    Case("inference_mode-SparseLinearBatch-works", lambda: _in_inference(lambda: _LIN(X.to_sparse())),
         None, check=_close(lambda: X @ _LIN.weight.T + _LIN.bias)),
    Case("inference_mode-densify-csr-works", lambda: _in_inference(lambda: nnsparse.densify(
        X.to_sparse_csr())), None, check=_close(lambda: X)),
    Case("inference_mode-SparseCriterion-works", lambda: _in_inference(lambda: nnsparse.SparseCriterion(
        nn.MSELoss())(_EST, X.to_sparse())), None, check=_close(lambda: ((_EST - X)[X != 0] ** 2).mean())),
]


# -- the third probe (fix-probe): sparse_mm, SparseParts, sorting, the builder, conversions,
#    Batchifier, PatternSequential, distributed -------------------------------------------------

_PARTS = nnsparse.sparse_parts(S)
_O3 = nnsparse.SparseOutputLinear(3, 4)


def _meta_3d():
    return torch.sparse_coo_tensor(torch.zeros(3, 1, dtype=torch.long, device="meta"),
                                   torch.ones(1, device="meta"), (1, 2, 4))


def _parts_with(**changes):
    return _PARTS._replace(**changes)


def _inference_pairs():
    with torch.inference_mode():
        return torch.tensor([[3.0, 5.0], [1.0, 4.0]])


def _view_of_leaf():
    return torch.tensor([[3.0, 5.0], [1.0, 4.0]], requires_grad=True)[:]


class _Scores(nn.Module):
    """Densifies its batch; from the second batch on, ``later`` changes the scores."""

    def __init__(self, first=None, later=None):
        super().__init__()
        self.first, self.later, self.calls = first, later, 0

    def forward(self, x):
        self.calls += 1
        y = nnsparse.densify(x, size=(x.shape[0], 4))
        change = self.later if self.calls > 1 else self.first
        return change(y) if change is not None else y


def _batchifier(net, **kw):
    return nnsparse.Batchifier(net, 4, batch_size=1, progress=False, **kw)


class _PositionalPattern(nn.Module):
    def forward(self, x, pattern=None, /):
        return pattern is not None


def _none_item_forward():
    model = nnsparse.PatternSequential(nn.ReLU(), nn.ReLU())
    model[1] = None  # item assignment bypasses add_module
    return model(torch.ones(2))


def _with_env(call, **env):
    import os
    from unittest import mock
    with mock.patch.dict(os.environ, env):  # (the environment put back after)
        return call()


def _init(**env):
    from nnsparse import distributed
    return _with_env(lambda: distributed.init_from_env(device="cpu", timeout=5.0), **env)


def _loader(**kw):
    from nnsparse import distributed
    return distributed.loader(SparseRowDataset(S), 2, **kw)


_NP = __import__("numpy")
_FRACTION = __import__("fractions").Fraction(1, 2)
_UINT16 = lambda: torch.sparse_coo_tensor(torch.tensor([[0, 1], [0, 1]]),  # noqa: E731
                                          torch.tensor([1, 2], dtype=torch.uint16), (2, 4))

PROBE3 = [
    # sparse_mm
    Case("sparse_mm-B-nested-list", lambda: nnsparse.sparse_mm(X.to_sparse(), [[1.0] * 3] * 4),
         TypeError, r"B must be a dense torch.Tensor, got list"),
    Case("sparse_mm-B-tuple-of-numbers", lambda: nnsparse.sparse_mm(X.to_sparse(), (1, 2)),
         TypeError, r"B must be a dense torch.Tensor, got tuple"),
    Case("sparse_mm-A-nested-list", lambda: nnsparse.sparse_mm([[1.0, 2.0]], X.to_sparse()),
         TypeError, r"A must be a dense torch.Tensor, got list"),
    Case("sparse_mm-A-empty-list", lambda: nnsparse.sparse_mm([], torch.ones(4, 3)), ValueError,
         r"A is an empty list of sparse rows, which has no width; pass a torch sparse tensor "
         r"of shape \(0, m\)"),
    Case("sparse_mm-A-meta", lambda: nnsparse.sparse_mm(_meta_coo(), torch.ones(4, 3, device="meta")),
         ValueError, r"A must hold data, got a tensor on the meta device"),
    Case("sparse_mm-A-meta-3d", lambda: nnsparse.sparse_mm(_meta_3d(), torch.ones(1, 4, 3, device="meta")),
         ValueError, r"A must hold data, got a tensor on the meta device"),
    Case("sparse_mm-B-meta-sparse", lambda: nnsparse.sparse_mm(torch.ones(3, 2), _meta_coo()),
         ValueError, r"B must hold data, got a tensor on the meta device"),
    # SparseOutputLinear on SparseParts (the compile path): the input is checked as in eager
    Case("SparseOutputLinear-parts-input-width", lambda: _O3(torch.ones(2, 5), _PARTS), ValueError,
         r"input must have shape \(2, 3\) for pattern of size \(2, 4\), got \(2, 5\)"),
    Case("SparseOutputLinear-parts-input-dtype", lambda: _O3(torch.ones(2, 3, dtype=torch.float64),
                                                             _PARTS), ValueError,
         r"weight must have input's dtype torch.float64, got torch.float32"),
    Case("SparseOutputLinear-parts-input-int", lambda: _O3(torch.ones(2, 3, dtype=torch.long), _PARTS),
         ValueError, r"weight must have input's dtype torch.int64, got torch.float32"),
    Case("SparseOutputLinear-parts-input-str", lambda: _O3("h", _PARTS), TypeError,
         r"input must be a dense tensor, got str"),
    Case("SparseOutputLinear-parts-input-sparse", lambda: _O3(torch.ones(2, 3).to_sparse(), _PARTS),
         TypeError, r"input must be a dense tensor, got torch.sparse_coo"),
    Case("SparseOutputLinear-parts-input-meta", lambda: _O3(torch.ones(2, 3, device="meta"), _PARTS),
         ValueError, r"weight must be on input's device meta, got cpu"),
    Case("sparse_parts-uint16-values", lambda: nnsparse.sparse_parts(_UINT16()), TypeError,
         r"x values of dtype torch.uint16 are not supported"),
    Case("SparseParts.to_sparse_csr-float-crow", lambda: _parts_with(
        crow=_PARTS.crow.float()).to_sparse_csr(), TypeError,
         r"parts.crow must be an int64 or int32 tensor, got torch.float32"),
    Case("SparseParts.to_sparse_csr-size-str", lambda: _parts_with(size="ab").to_sparse_csr(),
         TypeError, r"parts.size must be \(rows, width\), two non-negative ints, got 'ab'"),
    Case("SparseParts.to_sparse_csr-values-length", lambda: _parts_with(
        values=torch.ones(3)).to_sparse_csr(), ValueError,
         r"parts.values must hold one value per column index, got 3 values for 4"),
    # sorting
    Case("ssort-uint16-values", lambda: nnsparse.ssort(_UINT16()), TypeError,
         r"x values of dtype torch.uint16 are not supported: torch's sparse kernels lack that dtype"),
    Case("stopk-uint16-values", lambda: nnsparse.stopk(_UINT16(), 1), TypeError,
         r"x values of dtype torch.uint16 are not supported"),
    Case("ssort-inplace-expanded", lambda: nnsparse.ssort(torch.tensor([[2.0, 9.0]]).expand(2, 2),
                                                          inplace=True), RuntimeError,
         r"inplace=True cannot reorder x: an expanded tensor, whose elements share memory; "
         r"sort a copy"),
    Case("ssort-inplace-inference", lambda: nnsparse.ssort(_inference_pairs(), inplace=True),
         RuntimeError, r"inplace=True cannot reorder x: an inference tensor outside "
                       r"torch.inference_mode"),
    Case("ssort-inplace-view-of-leaf", lambda: nnsparse.ssort(_view_of_leaf(), inplace=True),
         RuntimeError, r"inplace=True cannot reorder x: a view of a leaf tensor that requires grad"),
    Case("ssort-inplace-list-row-named", lambda: nnsparse.ssort(
        [torch.tensor([[3.0, 5.0]]), torch.tensor([[2.0, 9.0]]).expand(2, 2)], inplace=True),
         RuntimeError, r"an expanded tensor at x\[1\]"),
    # a numpy bool is a flag (the seventh probe: "must be a bool, got bool np.True_" was
    # refused with a message contradicting itself)
    Case("ssort-descending-numpy-bool-works", lambda: nnsparse.ssort(S, descending=_NP.bool_(True)),
         None, check=lambda out: torch.equal(out.values, nnsparse.ssort(S, descending=True).values)
         and torch.equal(out.indices, nnsparse.ssort(S, descending=True).indices)),
    # DynamicSparseTensor
    Case("DynamicSparseTensor-dtype-qint8", lambda: nnsparse.DynamicSparseTensor(dtype=torch.qint8),
         TypeError, r"dtype must be one of the dtypes torch's sparse kernels take \(torch.float16, .*\), "
                    r"got torch.qint8"),
    Case("DynamicSparseTensor-dtype-uint16", lambda: nnsparse.DynamicSparseTensor(dtype=torch.uint16),
         TypeError, r"dtype must be one of the dtypes torch's sparse kernels take .*got torch.uint16"),
    Case("DynamicSparseTensor-dtype-float8", lambda: nnsparse.DynamicSparseTensor(
        dtype=torch.float8_e4m3fn), TypeError, r"got torch.float8_e4m3fn"),
    Case("DynamicSparseTensor-dtype-bits8", lambda: nnsparse.DynamicSparseTensor(dtype=torch.bits8),
         TypeError, r"dtype must be one of the dtypes torch's sparse kernels take .*got torch.bits8"),
    Case("DynamicSparseTensor-device-meta", lambda: nnsparse.DynamicSparseTensor(device="meta"),
         ValueError, r"device must hold data, got 'meta'; use 'cpu' or 'cuda'"),
    Case("DynamicSparseTensor-device-absent", lambda: nnsparse.DynamicSparseTensor(device="cuda:99"),
         ValueError, r"device must be one this machine has, got 'cuda:99'"),
    Case("DynamicSparseTensor.append-meta-value", lambda: nnsparse.DynamicSparseTensor().append(
        1, torch.tensor(1.0, device="meta")), ValueError,
         r"value must be a number, got a tensor on the meta device"),
    Case("DynamicSparseTensor.append-meta-index", lambda: nnsparse.DynamicSparseTensor(ndim=2).append(
        (1, torch.tensor(1, device="meta")), 1.0), ValueError,
         r"index must be a number, got a tensor on the meta device"),
    Case("DynamicSparseTensor.append-meta-row", lambda: nnsparse.DynamicSparseTensor().append(
        torch.tensor([1.0, 2.0], device="meta")), TypeError,
         r"append needs one \[index, value\] row .*layout torch.strided on the meta device"),
    # sparsify / densify and the layers
    Case("sparsify-elem-numpy-nan-works", lambda: nnsparse.sparsify(
        torch.tensor([math.nan, 1.0, 0.0]), elem=_NP.float32("nan")), None,
         check=lambda out: out.indices().tolist() == [[1, 2]]),
    Case("Sparsify-elem-numpy-nan-works", lambda: nnsparse.Sparsify(elem=_NP.float32("nan"))(
        torch.tensor([[math.nan, 1.0]])), None, check=lambda out: out.indices().tolist() == [[0], [1]]),
    Case("sparsify-elem-fraction", lambda: nnsparse.sparsify(X, elem=_FRACTION), TypeError,
         r"elem must be an int, float or complex number \(or a numpy scalar\), got Fraction"),
    Case("Sparsify-elem-fraction", lambda: nnsparse.Sparsify(elem=_FRACTION), TypeError,
         r"elem must be an int, float or complex number \(or a numpy scalar\), got Fraction"),
    Case("Densify-elem-decimal", lambda: nnsparse.Densify(4, elem=__import__("decimal").Decimal(1)),
         TypeError, r"elem must be an int, float or complex number \(or a numpy scalar\), "
                    r"got Decimal"),
    Case("densify-elem-beyond-int64", lambda: nnsparse.densify(S, elem=2 ** 70), ValueError,
         r"elem must be an int within int64 \(below 2\*\*63\), got 1180591620717411303424"),
    Case("sparsify-elem-beyond-int64", lambda: nnsparse.sparsify(X, elem=-2 ** 70), ValueError,
         r"elem must be an int within int64 \(at least -2\*\*63\), got -1180591620717411303424"),
    Case("densify-elem-numpy-complex", lambda: nnsparse.densify(S, elem=_NP.complex64(1j)), TypeError,
         r"elem must be a real number for values of dtype torch.float32"),
    Case("sparsify-meta", lambda: nnsparse.sparsify(torch.ones(2, 2, device="meta")), ValueError,
         r"x must hold data, got a tensor on the meta device"),
    Case("Sparsify-meta", lambda: nnsparse.Sparsify()(torch.ones(2, 2, device="meta")), ValueError,
         r"x must hold data, got a tensor on the meta device"),
    Case("sparsify-offset-overflow", lambda: nnsparse.sparsify(X, offset=2 ** 62), ValueError,
         r"offset must keep the result's size \(2, 4611686018427387908\) within int64 elements, "
         r"got 4611686018427387904"),
    Case("sparsify-offset-beyond-int64", lambda: nnsparse.sparsify(X[0], offset=2 ** 63), ValueError,
         r"offset must keep the result's size"),
    Case("densify-empty-list-negative-width", lambda: nnsparse.densify([], size=(0, -3)),
         ValueError, r"size must have at least 0 columns, got -3"),
    Case("densify-empty-list-width-str", lambda: nnsparse.densify([], size=(0, "a")), TypeError,
         r"size must hold ints, got str 'a'"),
    Case("densify-empty-list-size-int", lambda: nnsparse.densify([], size=3), ValueError,
         r"size of a batch must be a \(rows, width\) tuple, got 3"),
    Case("densify-empty-list-size-works", lambda: nnsparse.densify((), size=(2, 3)), None,
         check=lambda out: out.shape == (2, 3) and not out.any()),
    Case("densify-uint16-values", lambda: nnsparse.densify(_UINT16()), TypeError,
         r"x values of dtype torch.uint16 are not supported"),
    Case("Densify-uint16-values", lambda: nnsparse.Densify(4)(_UINT16()), TypeError,
         r"input values of dtype torch.uint16 are not supported"),
    # Batchifier
    Case("Batchifier-dtype-changes", lambda: _batchifier(_Scores(
        first=lambda y: y.long(), later=lambda y: y / 2))(S), ValueError,
         r"network must return one dtype for every batch: torch.int64 for the first, got "
         r"torch.float32 for rows \[1, 2\)"),
    Case("Batchifier.topk-dtype-changes", lambda: _batchifier(_Scores(
        later=lambda y: y.double())).topk(S, 1), ValueError,
         r"network must return one dtype for every batch: torch.float32 for the first, got "
         r"torch.float64"),
    Case("Batchifier-uint16-data", lambda: _batchifier(_Scores())(_UINT16()), TypeError,
         r"data values of dtype torch.uint16 are not supported"),
    Case("Batchifier-meta-output", lambda: _batchifier(_Scores(
        first=lambda y: y.to("meta")))(S), ValueError,
         r"network must return a tensor that holds data, got one on the meta device"),
    Case("Batchifier.topk-candidates-sparse", lambda: _batchifier(_Scores()).topk(
        S, 1, candidates=torch.ones(4, dtype=torch.bool).to_sparse()), TypeError,
         r"candidates must be a dense bool tensor, got layout torch.sparse_coo"),
    Case("Batchifier.topk-uint16-scores", lambda: _batchifier(_Scores(
        first=lambda y: y.long().to(torch.uint16))).topk(S, 1), TypeError,
         r"topk ranks scores of a dtype torch.topk takes, the network returned dtype torch.uint16"),
    Case("Batchifier.topk-exclude-numpy-bool-works", lambda: _batchifier(_Scores()).topk(
        S, 1, exclude=_NP.bool_(True)), None,
         check=lambda out: torch.equal(out.indices, _batchifier(_Scores()).topk(
             S, 1, exclude=True).indices)),
    # PatternSequential
    Case("PatternSequential-None-item", lambda: nnsparse.PatternSequential(None), TypeError,
         r"PatternSequential takes nn.Module items, got NoneType None for item '0'"),
    Case("PatternSequential.append-None", lambda: nnsparse.PatternSequential(nn.ReLU()).append(None),
         TypeError, r"PatternSequential takes nn.Module items, got NoneType None for item '1'"),
    Case("PatternSequential-None-item-assigned", _none_item_forward, TypeError,
         r"PatternSequential item '1' is None; give it an nn.Module \(nn.Identity\(\) to skip it\)"),
    Case("PatternSequential.extend-bad-item", lambda: nnsparse.PatternSequential(nn.ReLU()).extend(
        [nn.ReLU(), "a"]), TypeError,
         r"PatternSequential takes nn.Module items, got str 'a' for item '2' \(nothing was added\)"),
    Case("PatternSequential-positional-only-pattern-works", lambda: nnsparse.PatternSequential(
        _PositionalPattern())(torch.ones(2), S), None, check=lambda out: out is True),
    # distributed
    Case("init_from_env-rank-beyond-world", lambda: _init(RANK="2", WORLD_SIZE="2"), ValueError,
         r"environment variable RANK must be an integer in \[0, 2\), got '2'"),
    Case("init_from_env-rank-negative", lambda: _init(RANK="-1", WORLD_SIZE="1"), ValueError,
         r"environment variable RANK must be an integer in \[0, 1\), got '-1'"),
    Case("init_from_env-rank-str", lambda: _init(RANK="x", WORLD_SIZE="1"), ValueError,
         r"environment variable RANK must be an integer, got 'x'"),
    Case("init_from_env-world-0", lambda: _init(RANK="0", WORLD_SIZE="0"), ValueError,
         r"environment variable WORLD_SIZE must be an integer >= 1, got '0'"),
    Case("init_from_env-local-rank-negative", lambda: _init(LOCAL_RANK="-1", WORLD_SIZE="1"),
         ValueError,
         r"environment variable LOCAL_RANK must be an integer >= 0, got '-1'"),
    Case("loader-seed-str", lambda: _loader(seed="3"), TypeError,
         r"seed must be an int, got str '3'"),
    Case("loader-sampler-kwarg", lambda: _loader(sampler=None), TypeError,
         r"kwargs must not set sampler: loader makes its own DistributedSampler"),
    Case("loader-batch_sampler-kwarg", lambda: _loader(batch_sampler=[[0, 1]]), TypeError,
         r"kwargs must not set batch_sampler"),
    Case("save-empty-path", lambda: __import__("nnsparse.distributed", fromlist=["save"]).save({}, ""),
         ValueError, r"path must name a file to write, got ''"),
]


def _no_outputs():
    """nn.Linear(4, 0)'s behaviour: a (rows, 0) output, zero gradients (torch's row kernels
    failed with an internal assertion)."""
    import warnings
    with warnings.catch_warnings():  # nn.Linear's init warns on zero-element weights too
        warnings.simplefilter("ignore", UserWarning)
        layer = nnsparse.SparseLinearBatch(4, 0)
    out = layer(S)
    assert out.shape == (2, 0)
    out.sum().backward()
    return layer.weight.grad


def _in_inference(call):
    with torch.inference_mode():
        return call().clone()

# A meta tensor reaches the one parser of sparse forms (as_sparse_batch): refused there,
# before any index is read, for every function and layer that parses a batch.
META = [
    Case(f"meta-{label}", call, ValueError, rf"{name} must hold data, got a tensor on the meta device")
    for label, call, name in [
        ("densify", lambda: nnsparse.densify(_meta_coo()), "x"),
        ("to_pairs", lambda: nnsparse.to_pairs(_meta_coo()), "x"),
        ("from_pairs", lambda: nnsparse.from_pairs(torch.empty(2, 2, device="meta")), "pairs"),
        ("ssort-pairs", lambda: nnsparse.ssort(torch.empty(2, 2, device="meta")), "x"),
        ("stopk", lambda: nnsparse.stopk(_meta_coo(), 1), "x"),
        ("sparse_parts", lambda: nnsparse.sparse_parts(_meta_coo()), "x"),
        ("Densify", lambda: nnsparse.Densify(4)(_meta_coo()), "input"),
        ("list-row", lambda: nnsparse.densify([torch.empty(2, 2, device="meta")]), r"x\[0\]"),
        ("csr", lambda: nnsparse.densify(torch.sparse_csr_tensor(
            torch.tensor([0, 1, 1], device="meta"), torch.tensor([1], device="meta"),
            torch.ones(1, device="meta"), (2, 4))), "x"),
    ]
]

# -- the fourth probe: repeated positions in list forms, layer devices, optimiser states,
# -- rating-matrix shapes and Ratings titles ----------------------------------------------

_REPEATS = lambda: torch.tensor([[2.0, 1.0], [2.0, 2.0], [0.0, 3.0]])  # noqa: E731  index 2 twice


def _repeated_vector():  # (4,) with index 2 given twice: 1 + 2
    return torch.sparse_coo_tensor(torch.tensor([[2, 2, 0]]), torch.tensor([1.0, 2.0, 3.0]), (4,))


def _square(v):
    return v * v


def _lazy_refused_load(entry):
    """Load a LazyAdam state with ``entry`` for its parameter: the refusal must leave the
    optimiser's state as it was (it used to be loaded before a NaN step failed)."""
    p = nn.Parameter(torch.ones(3, 2))
    opt = LazyAdam([p])
    p.grad = torch.ones(3, 2)
    opt.step()
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in opt.state[p].items()}
    state = {"state": {0: entry}, "param_groups": opt.state_dict()["param_groups"]}
    try:
        opt.load_state_dict(state)
    except (TypeError, ValueError) as e:
        kept = all(torch.equal(opt.state[p][k], v) if isinstance(v, torch.Tensor)
                   else opt.state[p][k] == v for k, v in before.items())
        raise type(e)(f"{e} (state kept: {kept})") from None


def _entry(**changes):
    entry = {"step": 1, "exp_avg": torch.zeros(3, 2), "exp_avg_sq": torch.zeros(3, 2)}
    entry.update(changes)
    return entry


def _in_backward_state(**changes):
    opt = nnsparse.optim.apply_optimizer_in_backward(
        nn.Sequential(nnsparse.SparseLinearBatch(4, 3), nn.Linear(3, 2)), "adam")
    state = opt.state_dict()
    state["tables"]["0"]["step"] = changes.pop("step", state["tables"]["0"]["step"])
    state.update(changes)
    opt.load_state_dict(state)


def _short_titles_recommend():
    """Titles for fewer items than the item map holds (the shared map grew after they
    were read): recommend gives those items an empty title."""
    r = Ratings(_R.user, _R.item, _R.rating, _R.user_map, _R.item_map, titles=["only"])
    model = nnsparse.models.AutoRec(hidden=3, epochs=1, validation_ratio=0.0, batch_size=8)
    model.fit(r, progress=False, verbose=False)
    return model.recommend(_R.user_ids()[0], k=8, min_support=0)


PROBE4 = [
    # values_map of a list whose rows repeat a position: fn of the sum, not the sum of fn
    Case("values_map-pair-list-repeated-index-works", lambda: nnsparse.densify(
        nnsparse.values_map(_square, [_REPEATS()]), size=(1, 4)), None,
         check=lambda out: out.tolist() == [[9.0, 0.0, 9.0, 0.0]]),
    Case("values_map-list-of-uncoalesced-vectors-works", lambda: nnsparse.densify(
        nnsparse.values_map(_square, [_repeated_vector(), X[0].to_sparse()])), None,
         check=lambda out: out.tolist() == [[9.0, 0.0, 9.0, 0.0], [1.0, 0.0, 4.0, 0.0]]),
    Case("ValuesMap-pair-list-repeated-index-works", lambda: nnsparse.densify(
        nnsparse.ValuesMap(_square)([_REPEATS(), _REPEATS()]), size=(2, 3)), None,
         check=lambda out: out.tolist() == [[9.0, 0.0, 9.0]] * 2),
    Case("values_map-pair-list-distinct-keeps-order-works", lambda: nnsparse.values_map(
        _square, [torch.tensor([[3.0, 2.0], [1.0, 3.0]])]), None,
         check=lambda out: out[0].tolist() == [[3.0, 4.0], [1.0, 9.0]]),
    # SparseWeightLinear: a torch sparse input declares its width, as for the other layers
    Case("SparseWeightLinear-narrower-sparse-input", lambda: nnsparse.SparseWeightLinear(
        X.to_sparse())(torch.ones(2, 3).to_sparse()), ValueError,
         r"input has width 3, smaller than in_features 4; give it shape \(rows, 4\)"),
    Case("SparseWeightLinear-narrower-csr-input", lambda: nnsparse.SparseWeightLinear(
        X.to_sparse())(torch.ones(2, 3).to_sparse_csr()), ValueError,
         r"input has width 3, smaller than in_features 4"),
    Case("SparseWeightLinear-pair-list-input-works", lambda: (lambda layer: (
        layer(nnsparse.to_pairs(S)), layer(X)))(nnsparse.SparseWeightLinear(X.to_sparse())), None,
         check=lambda out: torch.allclose(out[0], out[1])),
    # layer devices: a name torch does not know is the caller's ValueError, not torch's RuntimeError
    Case("SparseLinearBatch-device-unknown", lambda: nnsparse.SparseLinearBatch(4, 3, device="nope"),
         ValueError, r"device must be a torch.device or a name such as 'cpu' or 'cuda:0', got 'nope'"),
    Case("SparseLinearBatch-device-list", lambda: nnsparse.SparseLinearBatch(4, 3, device=[0]),
         TypeError, r"device must be None, a torch.device or a name .*got list"),
    Case("SparseOutputLinear-device-unknown", lambda: nnsparse.SparseOutputLinear(3, 4, device="gpu"),
         ValueError, r"device must be a torch.device or a name .*got 'gpu'"),
    Case("SparseWeightLinear-device-unknown", lambda: nnsparse.SparseWeightLinear(
        X.to_sparse(), device="nope"), ValueError, r"device must be a torch.device .*got 'nope'"),
    Case("SparseWeightLinear.random-device-float", lambda: nnsparse.SparseWeightLinear.random(
        4, 3, 0.5, device=1.5), TypeError, r"device must be None, a torch.device .*got float"),
    Case("SparseLinearBatch-device-meta-works", lambda: nnsparse.SparseLinearBatch(
        4, 3, device="meta").weight.device, None, check=lambda d: d.type == "meta"),
    Case("SparseRowBatch.to-unknown-device", lambda: SparseRowDataset(S).collate(
        [SparseRowDataset(S)[0]]).to("nope"), ValueError,
         r"device must be a torch.device or a name .*got 'nope'"),
    # LazyAdam.load_state_dict: the form and every entry checked before anything is loaded
    Case("LazyAdam.load_state_dict-None", lambda: LazyAdam(_P).load_state_dict(None), TypeError,
         r"state_dict must be a dict \(from Optimizer.state_dict\(\)\), got NoneType"),
    Case("LazyAdam.load_state_dict-empty", lambda: LazyAdam(_P).load_state_dict({}), ValueError,
         r"state_dict must have the keys 'state' and 'param_groups' .*lacks \['state', "
         r"'param_groups'\]"),
    Case("LazyAdam.load_state_dict-step-str", lambda: _lazy_refused_load(_entry(step="x")),
         TypeError, r"state_dict\['state'\]\[0\]\['step'\] must be a number or a one-element "
                    r"tensor, got str 'x' \(state kept: True\)"),
    Case("LazyAdam.load_state_dict-step-negative", lambda: _lazy_refused_load(_entry(step=-3)),
         ValueError, r"\['step'\] must be a whole number >= 0, got -3 \(state kept: True\)"),
    Case("LazyAdam.load_state_dict-step-fraction", lambda: _lazy_refused_load(_entry(step=1.5)),
         ValueError, r"\['step'\] must be a whole number >= 0, got 1.5"),
    Case("LazyAdam.load_state_dict-step-nan-tensor", lambda: _lazy_refused_load(
        _entry(step=torch.tensor(math.nan))), ValueError,
         r"\['step'\] must be a whole number >= 0, got nan \(state kept: True\)"),
    Case("LazyAdam.load_state_dict-step-bool", lambda: _lazy_refused_load(_entry(step=True)),
         TypeError, r"\['step'\] must be a number or a one-element tensor, got bool"),
    Case("LazyAdam.load_state_dict-step-2d-tensor", lambda: _lazy_refused_load(
        _entry(step=torch.ones(3, 2))), TypeError, r"\['step'\] must be a number or a one-element"),
    Case("LazyAdam.load_state_dict-moment-list", lambda: _lazy_refused_load(
        _entry(exp_avg=[[0.0, 0.0]] * 3)), TypeError,
         r"\['exp_avg'\] must be a dense tensor of its parameter's shape \(3, 2\), got list"),
    Case("LazyAdam.load_state_dict-moment-None", lambda: _lazy_refused_load(
        _entry(exp_avg_sq=None)), TypeError, r"\['exp_avg_sq'\] must be a dense tensor .*NoneType"),
    Case("LazyAdam.load_state_dict-moment-sparse", lambda: _lazy_refused_load(
        _entry(exp_avg=torch.zeros(3, 2).to_sparse())), TypeError,
         r"\['exp_avg'\] must be a dense tensor .*got layout torch.sparse_coo"),
    Case("LazyAdam.load_state_dict-moment-0d", lambda: _lazy_refused_load(
        _entry(exp_avg=torch.tensor(0.0))), ValueError,
         r"\['exp_avg'\] must have its parameter's shape \(3, 2\), got \(\)"),
    Case("LazyAdam.load_state_dict-adam-float-step-works", lambda: _lazy_refused_load(
        _entry(step=torch.tensor(4.0))), None, check=lambda out: out is None),
    Case("LazyAdam.add_param_group-no-params", lambda: LazyAdam(_P).add_param_group({"lr": 0.1}),
         ValueError, r"param_group must have 'params', got the keys \['lr'\]"),
    Case("InBackwardOptimizer.load_state_dict-step-negative", lambda: _in_backward_state(
        step=torch.tensor(-1.0)), ValueError,
         r"state_dict\['tables'\]\['0'\]\['step'\] must be a whole number >= 0, got -1.0"),
    Case("InBackwardOptimizer.load_state_dict-dense-int", lambda: _in_backward_state(dense=3),
         TypeError, r"state_dict\['dense'\] must be a dict \(from Optimizer.state_dict\(\)\), "
                    r"got int"),
    Case("InBackwardOptimizer.load_state_dict-dense-no-groups", lambda: _in_backward_state(
        dense={"state": {}}), ValueError, r"state_dict\['dense'\] must have the keys 'state' and "
                                          r"'param_groups'"),
    # rating_matrix's shape: numpy ints are ints; rows * width must fit int64
    Case("rating_matrix-shape-numpy-works", lambda: rating_matrix(
        _R, shape=(_NP.int64(9), _NP.int64(11))).shape, None, check=lambda s: s == (9, 11)),
    Case("rating_matrix-shape-beyond-int64", lambda: rating_matrix(
        _R, shape=(10 ** 12, 10 ** 12), layout=torch.sparse_coo), ValueError,
         r"shape must have at most 2\*\*63 - 1 elements \(torch counts them in int64\), got "
         r"\(1000000000000, 1000000000000\)$"),
    # Ratings.titles and .source: checked where they enter, not where a recommendation reads them
    Case("Ratings-titles-str", lambda: Ratings(_R.user, _R.item, _R.rating, _R.user_map,
                                               _R.item_map, titles="abc"), TypeError,
         r"Ratings.titles must be None or a list of str \(one per item\), got str"),
    Case("Ratings-titles-ints", lambda: Ratings(_R.user, _R.item, _R.rating, _R.user_map,
                                                _R.item_map, titles=list(range(8))), TypeError,
         r"Ratings.titles must be None or a list of str .*got a list holding int"),
    Case("Ratings-titles-too-many", lambda: Ratings(_R.user, _R.item, _R.rating, _R.user_map,
                                                    _R.item_map, titles=["a"] * 9), ValueError,
         r"Ratings.titles must hold at most one title per item of item_map \(8\), got 9"),
    Case("Ratings-source-int", lambda: Ratings(_R.user, _R.item, _R.rating, _R.user_map,
                                               _R.item_map, source=3), TypeError,
         r"Ratings.source must be a str, got int"),
    Case("recommend-fewer-titles-than-items-works", _short_titles_recommend, None,
         check=lambda rec: rec.titles.count("only") <= 1 and len(rec.titles) == len(rec.ids)),
]

def _read_split_texts(train: str, test: str):
    """read_split of two text files written to a fresh temporary directory."""
    import tempfile
    from pathlib import Path
    from nnsparse.data import read_split
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "train").write_text(train)
        (Path(d) / "test").write_text(test)
        return read_split(Path(d) / "train", Path(d) / "test", titles=False)


def _load_bytes(blob: bytes):
    """RatingModel.load of a file holding ``blob``."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "m.pt").write_bytes(blob)
        return nnsparse.models.AutoRec.load(Path(d) / "m.pt")


def _features_of(name: str, text: str, what: str):
    """read_item_features / read_user_features (MovieLens format by file name) of ``text``."""
    import tempfile
    from pathlib import Path
    from nnsparse.data import read_item_features, read_user_features
    fmt = {"movies.dat": "ml-1m", "users.dat": "ml-1m", "u.item": "ml-100k",
           "movies.csv": "csv"}[name]
    read = read_item_features if what == "item" else read_user_features
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_text(text)
        return read(Path(d) / name, fmt, {2: 0})


_FITTED: List[Any] = []


def _fitted_autorec():
    """One small AutoRec fitted on _R (one epoch), shared by the cases that need a model."""
    if not _FITTED:
        model = nnsparse.models.AutoRec(hidden=3, epochs=1, validation_ratio=0.0, batch_size=8)
        _FITTED.append(model.fit(_R, progress=False, verbose=False))
    return _FITTED[0]


def _numpy_hparams_round_trip():
    """AutoRec with numpy hyperparameters, fitted, saved and loaded: the loaded hparams."""
    import io
    import numpy as np
    model = nnsparse.models.AutoRec(hidden=np.int64(3), epochs=1, lr=np.float32(0.01),
                                    l2=np.float64(1.0), validation_ratio=np.float64(0.0),
                                    orientation=np.str_("item"), batch_size=8)
    model.fit(_R, progress=False, verbose=False)
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    return nnsparse.models.AutoRec.load(buffer).hparams


def _numpy_ids_round_trip():
    """A model of ratings whose maps hold numpy ids and whose titles are numpy strs, saved,
    loaded, asked for two items of a user given as a numpy int."""
    import io
    import numpy as np
    ratings = Ratings(_R.user, _R.item, _R.rating, {np.int64(k): v for k, v in _R.user_map.items()},
                      _R.item_map, titles=[np.str_("t")] * len(_R.item_map))
    model = nnsparse.models.AutoRec(hidden=3, epochs=1, validation_ratio=0.0, batch_size=8)
    model.fit(ratings, progress=False, verbose=False)
    buffer = io.BytesIO()
    model.save(buffer)
    buffer.seek(0)
    loaded = nnsparse.models.AutoRec.load(buffer)
    return loaded.recommend(np.int64(_R.user_ids()[0]), k=2, min_support=0)


def _read_text(name: str, text: str, fmt: str):
    """read_ratings of ``text`` written to ``name`` in a fresh temporary directory."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_bytes(text.encode())
        return read_ratings(Path(d) / name, fmt, titles=False)


def _row(k=2):
    return (torch.arange(k), torch.ones(k))


PROBE5 = [
    # read_split: the test file's ids are looked up as the kind the training maps hold
    Case("read_split-string-ids-then-int-ids-works", lambda: _read_split_texts(
        "a 1 3\n1 2 4\n", "1 1 5\n"), None,
         check=lambda parts: parts[1].user.tolist() == [0] and len(parts[0].user_map) == 2),
    Case("read_split-int-ids-then-string-ids-works", lambda: _read_split_texts(
        "1 1 3\n2 2 4\n", "b 2 5\n1 2 2\n"), None,
         check=lambda parts: parts[1].user.tolist() == [2, 0]
         and parts[1].user_map == {1: 0, 2: 1, "b": 2}),
    Case("read_split-leading-zero-string-ids-works", lambda: _read_split_texts(
        "01 1 3\nx 2 4\n", "01 2 5\n"), None,
         check=lambda parts: parts[1].user.tolist() == [0] and "01" in parts[1].user_map),
    # float pair indices beyond the integers their dtype holds exactly
    Case("densify-pairs-float32-index-beyond-exact", lambda: nnsparse.densify(
        torch.tensor([[1e18, 1.0]])), ValueError,
         r"x indices stored as torch.float32 are exact only up to 16777216, got 1e\+18"),
    Case("from_pairs-float16-index-beyond-exact", lambda: nnsparse.from_pairs(
        torch.tensor([[3000.0, 1.0]]).half()), ValueError,
         r"pairs indices stored as torch.float16 are exact only up to 2048, got 3000"),
    Case("densify-pairs-float16-largest-exact-works", lambda: nnsparse.densify(
        torch.tensor([[2048.0, 1.0]]).half()).shape, None, check=lambda s: s == (2049,)),
    # values_map: fn returning a sparse tensor
    Case("values_map-fn-returns-sparse", lambda: nnsparse.values_map(
        lambda v: v.to_sparse(), X.to_sparse()), TypeError,
         r"fn must return a dense tensor of values, got layout torch.sparse_coo"),
    # RatingModel.load of junk: not torch's struct.error
    Case("RatingModel.load-four-bytes", lambda: _load_bytes(b"junk"), ValueError,
         r"is not a model saved by nnsparse.models \(RatingModel.save\)"),
    Case("RatingModel.load-damaged-zip", lambda: _load_bytes(b"PK\x03\x04garbage"), ValueError,
         r"is not a model saved by nnsparse.models"),
    # meta tensors where data is read
    Case("Ratings-meta-user", lambda: Ratings(_R.user.to("meta"), _R.item, _R.rating, _R.user_map,
                                              _R.item_map), ValueError,
         r"Ratings.user must hold data, got a tensor on the meta device"),
    Case("Ratings.subset-meta-index", lambda: _R.subset(torch.tensor([0], device="meta")),
         ValueError, r"index must hold data, got a tensor on the meta device"),
    Case("RatingNormalizer.normalize-meta-row", lambda: RatingNormalizer(_R).normalize(
        torch.ones(1, device="meta"), torch.tensor([1], device="meta")), ValueError,
         r"row must hold data, got a tensor on the meta device"),
    # SparseRowBatch: its shapes agree
    Case("SparseRowBatch-row_index-short", lambda: nnsparse.data.SparseRowBatch(
        S, None, torch.tensor([0])), ValueError,
         r"row_index must hold one matrix row per input row, shape \(2,\), got \(1,\)"),
    Case("SparseRowBatch-row_index-float", lambda: nnsparse.data.SparseRowBatch(
        S, None, torch.tensor([0.0, 1.0])), TypeError,
         r"row_index must be an int64 tensor of matrix rows, got torch.float32"),
    Case("SparseRowBatch-target-rows", lambda: nnsparse.data.SparseRowBatch(
        S, X[:1].to_sparse_csr(), torch.tensor([0, 1])), ValueError,
         r"target must be a 2-D batch of the input's 2 rows, got shape \(1, 4\)"),
    Case("SparseRowBatch-input-1d", lambda: nnsparse.data.SparseRowBatch(
        X[0].to_sparse(), None, torch.tensor([0])), ValueError,
         r"input must be a 2-D \(batch, width\) batch, got shape \(4,\)"),
    # collate_sparse_rows: the row index of each row
    Case("collate_sparse_rows-negative-row_index", lambda: collate_sparse_rows(
        [(-1, _row())], 4), ValueError,
         r"rows\[0\] row_index must be a non-negative matrix row, got -1"),
    Case("collate_sparse_rows-float-tensor-row_index", lambda: collate_sparse_rows(
        [(torch.tensor(1.5), _row())], 4), TypeError,
         r"rows\[0\] row_index must be an int or a 0-d integer tensor, got a torch.float32"),
    Case("collate_sparse_rows-1d-tensor-row_index", lambda: collate_sparse_rows(
        [(torch.tensor([1]), _row())], 4), TypeError,
         r"row_index must be an int or a 0-d integer tensor, got a torch.int64 tensor of "
         r"shape \(1,\)"),
    Case("collate_sparse_rows-row_index-beyond-int64", lambda: collate_sparse_rows(
        [(2 ** 63, _row())], 4), ValueError,
         r"rows\[0\] row_index must be a matrix row within int64 \(below 2\*\*63\), "
         r"got 9223372036854775808"),
    Case("collate_sparse_rows-tensor-row_index-works", lambda: collate_sparse_rows(
        [(torch.tensor(3), _row())], 4)[0], None, check=lambda index: index.tolist() == [3]),
    # prepare_input: a criterion that is not one
    Case("prepare_input-criterion-None", lambda: nnsparse.prepare_input(None, S), TypeError,
         r"criterion must be a loss \(a callable such as nn.MSELoss\(\) or an nnsparse "
         r"criterion\), got NoneType"),
    Case("prepare_input-criterion-int", lambda: nnsparse.prepare_input(3, S), TypeError,
         r"criterion must be a loss .*got int"),
    Case("collate_sparse_rows-row-not-a-pair", lambda: collate_sparse_rows([(0, "x")], 4),
         TypeError, r"rows\[0\] must be \(row_index, \(indices, values\)\), got tuple \(0, 'x'\)"),
    # feature files listing an id twice: which line counts is not decided silently
    Case("read_item_features-ml-1m-id-twice", lambda: _features_of(
        "movies.dat", "2::A::Action\n2::B::Comedy\n", "item"), ValueError,
         r"movies.dat, line 2: the item id 2 is listed again \(first on line 1\); a feature "
         r"file gives each item one line"),
    Case("read_item_features-ml-100k-id-twice", lambda: _features_of(
        "u.item", "2|A|x|y|z|0|1\n2|A|x|y|z|1|0\n", "item"), ValueError,
         r"u.item, line 2: the item id 2 is listed again"),
    Case("read_item_features-csv-id-twice", lambda: _features_of(
        "movies.csv", "movieId,title,genres\n2,A,X\n2,B,Y\n", "item"), ValueError,
         r"movies.csv, line 3: the item id 2 is listed again \(first on line 2\)"),
    Case("read_user_features-id-twice", lambda: _features_of(
        "users.dat", "2::M::25::3::1\n2::F::1::1::2\n", "user"), ValueError,
         r"users.dat, line 2: the user id 2 is listed again \(first on line 1\); a feature "
         r"file gives each user one line"),
    # the normaliser of training ratings that rate a pair twice
    Case("RatingNormalizer-pair-rated-twice", lambda: RatingNormalizer(Ratings.from_triples(
        [1, 1, 2], [1, 1, 2], [3.0, 4.0, 5.0])), ValueError,
         r"train: 1 \(user, item\) pair rated more than once, e.g. user 1 and item 1"),
    # CSR indices torch builds unchecked but cannot index with
    Case("densify-csr-int16-indices", lambda: nnsparse.densify(torch.sparse_csr_tensor(
        torch.tensor([0, 1], dtype=torch.int16), torch.tensor([0], dtype=torch.int16),
        torch.tensor([1.0]), (1, 2))), TypeError,
         r"x must have int32 or int64 crow_indices and col_indices, got torch.int16 and "
         r"torch.int16"),
    Case("SparseRowDataset-csr-int8-indices", lambda: SparseRowDataset(torch.sparse_csr_tensor(
        torch.tensor([0, 1], dtype=torch.int8), torch.tensor([0], dtype=torch.int8),
        torch.tensor([1.0]), (1, 2))), TypeError, r"int32 or int64 crow_indices and col_indices"),
    # Batchifier of a TensorDataset: its (x,) items need a collate_fn, and the message says so
    Case("Batchifier-TensorDataset-default-collate", lambda: nnsparse.Batchifier(
        nn.Linear(4, 4), 4, progress=False)(torch.utils.data.TensorDataset(X)), TypeError,
         r"the dataset's items must be sparse vectors or \(k, 2\) pair tensors for the default "
         r"collation, got tuple; pass collate_fn="),
    Case("Batchifier-TensorDataset-collate_fn-works", lambda: nnsparse.Batchifier(
        nn.Linear(4, 4), 4, progress=False,
        collate_fn=lambda items: torch.stack([x for x, in items]))(
            torch.utils.data.TensorDataset(X)).shape, None, check=lambda s: s == (2, 4)),
    # counts beyond int64: refused where given, not by itertools.islice inside fit
    Case("AutoRec-batch_size-beyond-int64", lambda: nnsparse.models.AutoRec(batch_size=10 ** 20),
         ValueError, r"batch_size must be an int >= 1 "
                     r"within int64 \(below 2\*\*63\), got 100000000000000000000"),
    Case("Batchifier-batch_size-beyond-int64", lambda: nnsparse.Batchifier(
        nn.Linear(4, 4), 4, batch_size=2 ** 64), ValueError,
         r"batch_size must be an int >= 1 "
         r"within int64 \(below 2\*\*63\), got 18446744073709551616"),
    Case("AutoRec-batch_size-int64-max-works", lambda: nnsparse.models.AutoRec(
        batch_size=2 ** 63 - 1).hparams["batch_size"], None, check=lambda b: b == 2 ** 63 - 1),
    # a user id given as a 0-d tensor (hashed by identity, it found nobody)
    Case("recommend-user-0d-tensor-works", lambda: _fitted_autorec().user_index(
        torch.tensor(_R.user_ids()[2])), None, check=lambda index: index == 2),
    Case("recommend-user-1d-tensor", lambda: _fitted_autorec().recommend(torch.tensor([1])),
         TypeError, r"user must be an original user id \(a 0-d integer tensor at most\), got a "
                    r"torch.int64 tensor of shape \(1,\)"),
    Case("recommend-user-float-tensor", lambda: _fitted_autorec().user_index(torch.tensor(1.0)),
         TypeError, r"got a torch.float32 tensor of shape \(\)"),
    Case("distributed.loader-batch_size-beyond-int64", lambda: nnsparse.distributed.loader(
        list(range(4)), batch_size=2 ** 64), ValueError,
         r"batch_size must be a positive int "
         r"within int64 \(below 2\*\*63\), got 18446744073709551616"),
    # the normaliser moved to the meta device lost its means: refused; meta tensors named
    Case("RatingNormalizer.to-meta", lambda: RatingNormalizer(_R).to("meta"), ValueError,
         r"device must hold data, got 'meta'; use 'cpu' or 'cuda'"),
    Case("RatingNormalizer.predict_entries-meta-rows", lambda: RatingNormalizer(_R).predict_entries(
        torch.zeros(8, 10), torch.arange(8, device="meta"), torch.zeros(8, 10).to_sparse()),
         ValueError, r"rows must hold data, got a tensor on the meta device"),
    Case("RatingNormalizer.predict_entries-meta-output", lambda: RatingNormalizer(
        _R).predict_entries(torch.zeros(8, 10, device="meta"), torch.arange(8),
                            torch.zeros(8, 10).to_sparse()),
         ValueError, r"output must hold data, got a tensor on the meta device"),
    Case("Ratings.from_triples-meta-rating", lambda: Ratings.from_triples(
        [1], [1], torch.tensor([3.0], device="meta")), ValueError,
         r"rating must hold data, got a tensor on the meta device"),
    Case("Ratings.from_triples-meta-ids", lambda: Ratings.from_triples(
        torch.tensor([1], device="meta"), [1], [3.0]), ValueError,
         r"user must hold data, got a tensor on the meta device"),
    Case("collate_sparse_rows-meta-indices", lambda: collate_sparse_rows(
        [(0, (torch.tensor([0], device="meta"), torch.tensor([1.0], device="meta")))], 4),
         ValueError, r"rows\[0\] indices must hold data, got a tensor on the meta device"),
    Case("RatingErrors.update-meta", lambda: nnsparse.data.RatingErrors().update(
        torch.ones(2, device="meta"), torch.ones(2, device="meta")), ValueError,
         r"prediction must hold data, got a tensor on the meta device"),
    Case("stopk-meta-k", lambda: nnsparse.stopk(X.to_sparse(), torch.tensor(1, device="meta")),
         ValueError, r"k must hold data, got a tensor on the meta device"),
    # sparsify's elem that x's dtype cannot hold equals no entry: all were kept, silently
    Case("sparsify-int-elem-nan", lambda: nnsparse.sparsify(torch.tensor([1, 0]), elem=math.nan),
         ValueError, r"elem nan needs floating values, got dtype torch.int64"),
    Case("sparsify-int-elem-fraction", lambda: nnsparse.sparsify(torch.tensor([1, 0]), elem=0.5),
         ValueError, r"elem must be stored exactly in the values' dtype torch.int64 .*got 0.5"),
    Case("sparsify-int8-elem-1000", lambda: nnsparse.sparsify(
        torch.tensor([1, 0], dtype=torch.int8), elem=1000), ValueError,
         r"elem must be stored exactly in the values' dtype torch.int8 \(an integer in "
         r"\[-128, 127\]\), got 1000"),
    Case("sparsify-float-elem-complex", lambda: nnsparse.sparsify(X, elem=1j), TypeError,
         r"elem must be a real number for values of dtype torch.float32, got 1j"),
    Case("sparsify-int-elem-whole-float-works", lambda: nnsparse.sparsify(
        torch.tensor([2, 0]), elem=2.0).indices().tolist(), None, check=lambda i: i == [[1]]),
    # numpy hyperparameters: the saved model loads (weights_only=True took no numpy scalar)
    Case("AutoRec-numpy-hparams-save-load-works", _numpy_hparams_round_trip, None,
         check=lambda hp: all(type(v) in (int, float, str, bool) for v in hp.values())),
    Case("AutoRec-numpy-ids-and-titles-save-load-works", _numpy_ids_round_trip, None,
         check=lambda rec: rec.titles == ["t", "t"]),
    # a Ratings map that is not a bijection onto 0..n-1 lost an id silently
    Case("Ratings-map-repeated-index", lambda: Ratings(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0]), {1: 0, 2: 0}, {2: 0}),
         ValueError, r"Ratings.user_map indices must be distinct \(one per id\), got 0 for ids "
                     r"1 and 2"),
    Case("Ratings-map-index-gap", lambda: Ratings(
        torch.tensor([0]), torch.tensor([0]), torch.tensor([1.0]), {1: 0}, {2: 0, 3: 5}),
         ValueError, r"Ratings.item_map indices must be in \[0, 2\) \(one per id\), got 5 for "
                     r"id 3"),
    # a model's forward / batch_loss: rows outside the matrix were ignored (or wrapped)
    Case("RatingModel.forward-rows-out-of-range", lambda: _fitted_autorec()(
        torch.zeros(2, 10).to_sparse_csr(), torch.tensor([0, 8])), ValueError,
         r"rows must be in \[0, 8\), got max 8"),
    Case("RatingModel.forward-rows-negative", lambda: _fitted_autorec()(
        torch.zeros(2, 10).to_sparse_csr(), torch.tensor([0, -1])), ValueError,
         r"rows must be non-negative, got min -1"),
    Case("RatingModel.batch_loss-rows-out-of-range", lambda: _fitted_autorec().batch_loss(
        torch.tensor([0, 99]), torch.zeros(2, 10).to_sparse_csr()), ValueError,
         r"rows must be in \[0, 8\), got max 99"),
    Case("RatingModel.forward-rows-meta", lambda: _fitted_autorec()(
        torch.zeros(2, 10).to_sparse_csr(), torch.tensor([0, 1], device="meta")), ValueError,
         r"rows must hold data, got a tensor on the meta device"),
    # DistributedTrainer names a wrong argument before it asks for a process group
    Case("DistributedTrainer-batch_size-0-without-group", lambda: nnsparse.models.DistributedTrainer(
        nnsparse.models.AutoRec(hidden=3), epochs=1, batch_size=0, lr=0.1), ValueError,
         r"batch_size must be an int >= 1, got 0"),
    Case("DistributedTrainer-lr-str-without-group", lambda: nnsparse.models.DistributedTrainer(
        nnsparse.models.AutoRec(hidden=3), epochs=1, batch_size=8, lr="x"), TypeError,
         r"lr must be a real number, got str 'x'"),
    # SparseRowDataset.collate of items that are not its own: they entered a trusted batch
    Case("SparseRowDataset.collate-item-of-a-wider-dataset", lambda: SparseRowDataset(
        torch.eye(4).to_sparse_csr()).collate([SparseRowDataset(torch.eye(6).to_sparse_csr())[5]]),
         ValueError, r"items\[0\] row must be a row of this dataset, in \[0, 4\), got 5"),
    Case("SparseRowDataset.collate-foreign-column-beyond-width", lambda: SparseRowDataset(
        torch.eye(4).to_sparse_csr()).collate([(1, SparseRowDataset(
            torch.eye(6).to_sparse_csr())[5][1])]),
         ValueError, r"rows indices must be in \[0, 4\), got max 5"),
    Case("SparseRowDataset.collate-hand-built-unsorted-row", lambda: SparseRowDataset(
        torch.eye(4).to_sparse_csr()).collate([(0, nnsparse.data.dataset.SparseRow(
            torch.tensor([3, 1]), torch.tensor([1.0, 1.0])))]), ValueError,
         r"rows\[0\] indices must be increasing and unique within the row, got \[3, 1\]"),
    Case("SparseRowDataset.collate-pickled-own-items-works", lambda: (lambda ds: ds.collate(
        __import__("pickle").loads(__import__("pickle").dumps([ds[0], ds[3]]))).input.to_dense())(
            SparseRowDataset(torch.eye(4).to_sparse_csr())), None,
         check=lambda dense: dense.tolist() == [[1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]]),
    Case("densify-bytes-beyond-int64", lambda: nnsparse.densify(torch.sparse_coo_tensor(
        torch.tensor([[0], [0]]), torch.tensor([1.0]), (2 ** 31, 2 ** 31))), ValueError,
         r"x is too large to densify: \(2147483648, 2147483648\) torch.float32 would take "
         r"18446744073709551616 bytes, beyond int64"),
    # a separator at a line's edge is an empty field, not a line of the fields beside it
    Case("read_ratings-ml-1m-trailing-separator", lambda: _read_text(
        "ratings.dat", "1::2::3::4\n1::3::3::4::\n", "ml-1m"), ValueError,
         r"ratings.dat, line 2: a line starts or ends with the separator '::' \(an empty "
         r"field\), got '1::3::3::4::'"),
    Case("read_ratings-ml-100k-leading-tab", lambda: _read_text(
        "u.data", "\t1\t2\t3\t4\n", "ml-100k"), ValueError,
         r"u.data, line 1: a line starts or ends with the separator '\\t'"),
    Case("read_ratings-csv-trailing-comma", lambda: _read_text(
        "ratings.csv", "userId,movieId,rating,timestamp\n1,2,3,4,\n", "csv"), ValueError,
         r"ratings.csv, line 2: a line starts or ends with the separator ','"),
    Case("read_ratings-ml-1m-crlf-works", lambda: _read_text(
        "ratings.dat", "1::2::3::4\r\n1::3::3::4\r\n", "ml-1m").user.tolist(), None,
         check=lambda users: users == [0, 0]),
    # the DDP comm hook called by hand
    Case("sparse_allgather_hook-bucket-None", lambda: nnsparse.distributed.sparse_allgather_hook(
        None, None), TypeError, r"bucket must be the torch.distributed.GradBucket DDP passes "
                                r"to a comm hook, got NoneType"),
]


# -- the sixth probe -----------------------------------------------------------------------

def _parts(crow, col, values, size=(1, 4)):
    """A SparseParts built by hand (not by sparse_parts): checked at its first use."""
    return nnsparse.SparseParts(torch.tensor(crow), torch.tensor(col),
                                torch.tensor(values, dtype=F32), size)


_PARTS_ENTRIES = {
    "SparseLinearBatch": (lambda p: nnsparse.SparseLinearBatch(4, 3)(p), "input"),
    "SparseOutputLinear": (lambda p: nnsparse.SparseOutputLinear(3, 4)(torch.ones(1, 3), p),
                           "pattern"),
    "to_sparse_csr": (lambda p: p.to_sparse_csr(), "parts"),
}
# hand-built parts whose pattern the kernels would read out of bounds (a segfault before)
_BAD_PARTS = {
    "crow-past-nnz": (([0, 5], [0], [1.0]), r"crow_indices must end at nnz = 1 \(the number of "
                                            r"column indices\), got 5"),
    "column-beyond-width": (([0, 1], [10 ** 8], [1.0]),
                            r"column indices must be in \[0, 4\), got max 100000000"),
    "column-negative": (([0, 1], [-5], [1.0]), r"column indices must be non-negative, got min -5"),
    "crow-start": (([3, 1], [0], [1.0]), r"crow_indices must start at 0, got 3"),
    "columns-unsorted": (([0, 2], [3, 1], [1.0, 1.0]),
                         r"column indices must increase within each row"),
}


def _parts_cases() -> List[Case]:
    cases = []
    for entry, (call, name) in _PARTS_ENTRIES.items():
        for kind, (args, match) in _BAD_PARTS.items():
            cases.append(Case(f"SparseParts-hand-built-{kind}-{entry}",
                              (lambda c=call, a=args: c(_parts(*a))), ValueError,
                              rf"{name} {match}"))
        cases.append(Case(f"SparseParts-hand-built-valid-{entry}-works",
                          (lambda c=call: c(_parts([0, 2], [0, 2], [1.0, 2.0]))), None,
                          check=lambda out: out is not None))
    return cases


def _load_refused(module, entry, make):
    """Load a state whose ``entry`` is ``make``(it) and whose bias is 9: refused, and the
    module keeps its bias (torch copied the entries before the one it failed on)."""
    state = module.state_dict()
    bias = state["bias"].clone()
    bad = {**state, entry: make(state[entry]), "bias": torch.full_like(bias, 9.0)}
    try:
        module.load_state_dict(bad)
    finally:
        assert torch.equal(module.bias.detach(), bias), "a refused load changed the bias"


_LAYERS = {
    "SparseLinearBatch": (lambda: nnsparse.SparseLinearBatch(4, 3), "weight"),
    "SparseOutputLinear": (lambda: nnsparse.SparseOutputLinear(3, 4), "weight"),
    "SparseWeightLinear": (lambda: nnsparse.SparseWeightLinear.random(4, 3, 0.5, seed=0), "values"),
}
_BAD_ENTRIES = {
    "sparse": (lambda t: t.to_sparse(), r"expected a tensor of layout torch.strided from "
                                        r"checkpoint, got torch.sparse_coo"),
    "meta": (lambda t: t.to("meta"), r"expected a tensor that holds data from checkpoint, got a "
                                     r"tensor on the meta device"),
    "complex": (lambda t: t.to(torch.complex64) + 1j,
                r"expected a real tensor \(torch.float32\) from checkpoint, got torch.complex64"),
}


def _load_cases() -> List[Case]:
    cases = []
    for layer, (make_layer, entry) in _LAYERS.items():
        for kind, (make, match) in _BAD_ENTRIES.items():
            cases.append(Case(f"{layer}.load_state_dict-{entry}-{kind}-keeps-the-layer",
                              (lambda m=make_layer, e=entry, k=make: _load_refused(m(), e, k)),
                              RuntimeError, rf'"{entry}", {match}\n\(nothing was loaded\)'))
    for entry in ("crow", "col"):
        cases.append(Case(f"SparseWeightLinear.load_state_dict-{entry}-sparse",
                          (lambda e=entry: _load_refused(nnsparse.SparseWeightLinear.random(
                              4, 3, 0.5, seed=0), e, lambda t: t.to_sparse())), RuntimeError,
                          rf'"{entry}", expected a tensor of layout torch.strided'))
    return cases


PROBE6 = _parts_cases() + _load_cases() + [
    Case("SparseParts-hand-built-to-checks-on-the-cpu", lambda: _parts([0, 5], [0], [1.0]).to("cpu"),
         ValueError, r"parts crow_indices must end at nnz = 1"),
    Case("SparseParts-hand-built-to-works", lambda: nnsparse.SparseLinearBatch(4, 3)(
        _parts([0, 1], [3], [1.0]).to("cpu")).shape, None, check=lambda shape: shape == (1, 3)),
    Case("sampled_linear-int64-input-with-pattern", lambda: nnsparse.sampled_linear(
        torch.ones(2, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long),
        pattern=X.long().to_sparse_csr()), TypeError,
         r"input must be floating-point for a sparse pattern, got torch.int64"),
    Case("sampled_linear-int64-dense-output-works", lambda: nnsparse.sampled_linear(
        torch.ones(2, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long)), None,
         check=lambda out: out.tolist() == [[3] * 4] * 2),
    Case("SDAECriterion-mask-sparse", lambda: nnsparse.SDAECriterion(nn.MSELoss(), hide_ratio=0.5)(
        torch.zeros(2, 4), X, mask=torch.zeros(2, 4, dtype=torch.bool).to_sparse()), TypeError,
         r"mask must be a bool tensor of layout torch.strided \(dense\), got a tensor with layout "
         r"torch.sparse_coo"),
    Case("SparseCriterion-estimate-complex", lambda: nnsparse.SparseCriterion(nn.MSELoss())(
        torch.zeros(2, 4, dtype=torch.complex64), S), TypeError,
         r"estimate values must be real numbers for MSELoss, got dtype torch.complex64"),
    Case("SDAESparseCriterion-estimate-complex", lambda: nnsparse.SDAESparseCriterion(
        nn.L1Loss())(torch.zeros(2, 4, dtype=torch.complex128), S,
                     mask=torch.zeros(2, 4, dtype=torch.bool)), TypeError,
         r"estimate values must be real numbers for L1Loss, got dtype torch.complex128"),
    Case("make_optimizer-unknown-dense-keyword", lambda: nnsparse.make_optimizer(
        nn.Linear(2, 2), foo=1), TypeError,
         r"dense_kwargs: torch.optim.Adam takes no keyword\(s\) \['foo'\]; it takes \['amsgrad'"),
    Case("make_optimizer-adamw-unknown-keyword", lambda: nnsparse.make_optimizer(
        nn.Linear(2, 2), dense="adamw", momentum=0.9), TypeError,
         r"torch.optim.AdamW takes no keyword\(s\) \['momentum'\]"),
    Case("make_optimizer-foreach-keyword-works", lambda: nnsparse.make_optimizer(
        nn.Linear(2, 2), foreach=False), None,
         check=lambda opt: opt.param_groups[0]["foreach"] is False),
    Case("AutoRec-positional-hyperparameter", lambda: nnsparse.models.AutoRec(3), TypeError,
         r"AutoRec takes its hyperparameters as keywords \(hidden=...\), got 1 positional "
         r"argument\(s\) \(3,\)"),
    Case("KernelNet-positional-hyperparameter", lambda: nnsparse.models.KernelNet(3, 4),
         TypeError, r"KernelNet takes its hyperparameters as keywords"),
]


def _trained_optimizer(kind):
    """An optimiser of a small sparse model after two steps: make_optimizer's split
    ("split"), LazyAdam ("lazy"), or apply_optimizer_in_backward of ``kind``."""
    torch.manual_seed(0)
    sparse_grad = kind in ("split", "lazy")
    model = nn.Sequential(nnsparse.SparseLinearBatch(4, 3, sparse_grad=sparse_grad),
                          nn.Linear(3, 2))
    if kind == "split":
        opt = nnsparse.make_optimizer(model, lr=0.1)
    elif kind == "lazy":
        opt = LazyAdam(model.parameters(), lr=0.1)
    else:
        opt = nnsparse.optim.apply_optimizer_in_backward(
            model, kind, lr=0.1, **({"momentum": 0.9} if kind == "sgd" else {}))
    for _ in range(2):
        model(X.to_sparse_csr()).sum().backward()
        opt.step()
        opt.zero_grad()
    return opt


def _tensors(tree, path=()):
    """Every tensor of a nested state dict, by path."""
    if isinstance(tree, dict):
        return {p: t for k, v in tree.items() for p, t in _tensors(v, path + (k,)).items()}
    if isinstance(tree, (list, tuple)):
        return {p: t for i, v in enumerate(tree) for p, t in _tensors(v, path + (i,)).items()}
    return {path: tree.clone()} if isinstance(tree, torch.Tensor) else {}


def _refused_state_load(kind, path, make):
    """Load a state whose entry at ``path`` is ``make``(it): refused before any part is
    loaded (torch's own load checks no entry: the step then failed deep inside torch)."""
    import copy
    opt = _trained_optimizer(kind)
    state = copy.deepcopy(opt.state_dict())
    entry = state
    for key in path[:-1]:
        entry = entry[key]
    entry[path[-1]] = make(entry[path[-1]])
    before = _tensors(opt.state_dict())
    try:
        opt.load_state_dict(state)
    finally:
        after = _tensors(opt.state_dict())
        assert before.keys() == after.keys() and all(
            torch.equal(before[k], after[k]) for k in before), "a refused load changed the state"


_STATE_LOADS = [
    ("SplitOptimizer-dense-exp_avg-shape", "split", ("dense", "state", 0, "exp_avg"),
     lambda t: torch.zeros(9), ValueError,
     r"state_dict\['dense'\]\['state'\]\[0\]\['exp_avg'\] must have its parameter's shape "
     r"\(2, 3\), got \(9,\)"),
    ("SplitOptimizer-dense-step-sparse", "split", ("dense", "state", 0, "step"),
     lambda t: t.reshape(1).to_sparse(), TypeError,
     r"state_dict\['dense'\]\['state'\]\[0\]\['step'\] must be a number or a dense one-element "
     r"tensor, got a tensor of layout torch.sparse_coo"),
    ("SplitOptimizer-dense-exp_avg-None", "split", ("dense", "state", 1, "exp_avg"),
     lambda t: None, TypeError, r"state_dict\['dense'\]\['state'\]\[1\]\['exp_avg'\] must be a "
                                r"dense tensor of its parameter's shape \(2,\), got NoneType"),
    ("SplitOptimizer-sparse-exp_avg-meta", "split", ("sparse", "state", 0, "exp_avg"),
     lambda t: t.to("meta"), ValueError, r"state_dict\['sparse'\]\['state'\]\[0\]\['exp_avg'\] "
                                         r"must hold data, got a tensor on the meta device"),
    ("LazyAdam-exp_avg_sq-complex", "lazy", ("state", 1, "exp_avg_sq"),
     lambda t: t.to(torch.complex64), TypeError,
     r"state_dict\['state'\]\[1\]\['exp_avg_sq'\] must be a real tensor, got torch.complex64"),
    ("InBackwardOptimizer-adam-table-exp_avg-sparse", "adam", ("tables", "0", "exp_avg"),
     lambda t: t.to_sparse(), TypeError,
     r"state_dict\['tables'\]\['0'\]\['exp_avg'\] must be a dense tensor, got layout "
     r"torch.sparse_coo"),
    ("InBackwardOptimizer-adam-table-step-meta", "adam", ("tables", "0", "step"),
     lambda t: t.to("meta"), TypeError, r"state_dict\['tables'\]\['0'\]\['step'\] must be a "
                                        r"number or a dense one-element tensor, got a tensor on "
                                        r"the meta device"),
    ("InBackwardOptimizer-sgd-dense-momentum-None", "sgd",
     ("dense", "state", 0, "momentum_buffer"), lambda t: None, TypeError,
     r"state_dict\['dense'\]\['state'\]\[0\]\['momentum_buffer'\] must be a dense tensor of its "
     r"parameter's shape \(3,\), got NoneType"),
    ("InBackwardOptimizer-adagrad-dense-sum-str", "adagrad", ("dense", "state", 1, "sum"),
     lambda t: "x", TypeError, r"state_dict\['dense'\]\['state'\]\[1\]\['sum'\] must be a dense "
                               r"tensor of its parameter's shape \(2, 3\), got str"),
    ("InBackwardOptimizer-adagrad-dense-step-meta", "adagrad", ("dense", "state", 1, "step"),
     lambda t: t.to("meta"), TypeError, r"\['step'\] must be a number or a dense one-element "
                                        r"tensor, got a tensor on the meta device"),
]
PROBE6 += [Case(f"{name}.load_state_dict-keeps-the-state",
                (lambda k=kind, p=path, m=make: _refused_state_load(k, p, m)), error, match)
           for name, kind, path, make, error, match in _STATE_LOADS]
PROBE6 += [
    Case("SplitOptimizer.load_state_dict-own-state-works", lambda: _refused_state_load(
        "split", ("dense", "state", 0, "exp_avg"), lambda t: t), None, check=lambda out: True),
    Case("SparseCriterion-BCEWithLogitsLoss-weight-meta", lambda: nnsparse.SparseCriterion(
        nn.BCEWithLogitsLoss(weight=torch.ones(4, device="meta")))(
            torch.zeros(2, 4), (X > 0).float().to_sparse_csr()), ValueError,
         r"BCEWithLogitsLoss.weight must be on the estimate's device cpu, got meta"),
    Case("SparseCriterion-BCELoss-weight-meta-vector", lambda: nnsparse.SparseCriterion(
        nn.BCELoss(weight=torch.ones(4, device="meta")))(
            torch.full((4,), 0.5), (X[0] > 0).float().to_sparse()), ValueError,
         r"BCELoss.weight must be on the estimate's device cpu, got meta"),
]


def _crafted_load(edit):
    """The fitted AutoRec saved, its file's dict changed by ``edit``, saved and loaded."""
    import io
    buffer = io.BytesIO()
    _fitted_autorec().save(buffer)
    buffer.seek(0)
    blob = torch.load(buffer, weights_only=True)
    edit(blob)
    buffer = io.BytesIO()
    torch.save(blob, buffer)
    buffer.seek(0)
    return nnsparse.models.AutoRec.load(buffer)


_DAMAGED = r"is a damaged model file \(RatingModel.save wrote something else\): "
PROBE6 += [
    # a file missing a weight loaded with the fresh layer's random one (strict=False)
    Case("RatingModel.load-state-lacks-a-weight", lambda: _crafted_load(
        lambda b: b["state"].pop("decoder.weight")), ValueError,
         _DAMAGED + r"its state lacks \['decoder.weight'\]"),
    Case("RatingModel.load-row_mean-shape", lambda: _crafted_load(
        lambda b: b["normalizer"].__setitem__("row_mean", torch.zeros(3))), ValueError,
         _DAMAGED + r"normalizer row_mean must be a floating tensor of shape \(\d+,\), got "
                    r"torch.float32 of shape \(3,\)"),
    Case("RatingModel.load-row_mean-str", lambda: _crafted_load(
        lambda b: b["normalizer"].__setitem__("row_mean", "x")), ValueError,
         _DAMAGED + r"normalizer row_mean must be a floating tensor of shape \(\d+,\), got str"),
    Case("RatingModel.load-global_mean-nan", lambda: _crafted_load(
        lambda b: b["normalizer"].__setitem__("global_mean", float("nan"))), ValueError,
         _DAMAGED + r"normalizer global_mean must be a finite number, got nan"),
    Case("RatingModel.load-global_mean-str", lambda: _crafted_load(
        lambda b: b["normalizer"].__setitem__("global_mean", "3.5")), ValueError,
         _DAMAGED + r"normalizer global_mean must be a finite number, got '3.5'"),
    Case("RatingModel.load-best_epoch-str", lambda: _crafted_load(
        lambda b: b.__setitem__("best_epoch", "x")), ValueError,
         _DAMAGED + r"best_epoch must be an int >= 0, got 'x'"),
    Case("RatingModel.load-untouched-works", lambda: _crafted_load(lambda b: None).predict(_R),
         None, check=lambda pred: torch.equal(pred, _fitted_autorec().predict(_R))),
]


PROBE6 += [
    Case(f"{cls.__name__}.{method}-before-fit", (lambda c=cls, m=method: getattr(c(hidden=3), m)()),
         RuntimeError, rf"{cls.__name__} is not fitted; call fit\(\) or load\(\)")
    for cls in (nnsparse.models.AutoRec, nnsparse.models.CFN, nnsparse.models.KernelNet)
    for method in ("penalty", "output_bias") if (cls, method) != (nnsparse.models.CFN, "output_bias")
] + [
    Case(f"{cls.__name__}.network-before-fit", (lambda c=cls: c(hidden=3).network(
        torch.eye(3).to_sparse(), torch.tensor([0, 1, 2]))), RuntimeError,
         rf"{cls.__name__} is not fitted; call fit\(\) or load\(\)")
    for cls in (nnsparse.models.AutoRec, nnsparse.models.CFN, nnsparse.models.KernelNet)
]


def _lazy_changed_param(make, sparse=False):
    """LazyAdam stepped once, its parameter's data then replaced by ``make``(it) and
    stepped again (the fused kernels wrote out of bounds of a grown parameter: a crash)."""
    p = nn.Parameter(torch.zeros(3, 2))
    opt = LazyAdam([p])
    p.grad = torch.ones(3, 2)
    opt.step()
    p.data = make(p.data)
    p.grad = torch.ones_like(p.data).to_sparse(1) if sparse else torch.ones_like(p.data)
    opt.step()


def _slb_flag(built, value, mode=None):
    layer = nnsparse.SparseLinearBatch(4, 3, sparse_grad=built)
    layer.sparse_grad = value
    if mode is not None:
        layer.mode = mode
    return layer(X.to_sparse_csr())


def _sol_flag(value):
    layer = nnsparse.SparseOutputLinear(3, 4)
    layer.sparse_grad = value
    return layer(torch.ones(2, 3), X.to_sparse_csr())


_CHANGED = (r"LazyAdam: the state of a parameter is \(3, 2\) torch.float32 on cpu, the parameter "
            r"is now {} on cpu \(changed after the optimiser's first step\)")
PROBE6 += [
    Case("LazyAdam.step-parameter-grown", lambda: _lazy_changed_param(lambda d: torch.zeros(5, 2)),
         RuntimeError, _CHANGED.format(r"\(5, 2\) torch.float32")),
    Case("LazyAdam.step-parameter-grown-sparse-grad", lambda: _lazy_changed_param(
        lambda d: torch.zeros(5, 2), sparse=True), RuntimeError,
         _CHANGED.format(r"\(5, 2\) torch.float32")),
    Case("LazyAdam.step-parameter-shrunk", lambda: _lazy_changed_param(
        lambda d: torch.zeros(2, 2)), RuntimeError, _CHANGED.format(r"\(2, 2\) torch.float32")),
    Case("LazyAdam.step-parameter-converted", lambda: _lazy_changed_param(lambda d: d.double()),
         RuntimeError, _CHANGED.format(r"\(3, 2\) torch.float64")),
    Case("LazyAdam.step-parameter-same-works", lambda: _lazy_changed_param(lambda d: d * 2),
         None, check=lambda out: out is None),
    Case("SparseLinearBatch-sparse_grad-assigned-str", lambda: _slb_flag(False, "x"), TypeError,
         r"sparse_grad must be a bool, got str 'x'"),
    Case("SparseLinearBatch-sparse_grad-assigned-True", lambda: _slb_flag(False, True),
         ValueError, r"sparse_grad=True needs the layer built with it \(it decides the weight "
                     r"parameter: weight_t, \(in_features, out_features\)\), got a layer built "
                     r"with sparse_grad=False"),
    Case("SparseLinearBatch-sparse_grad-assigned-False-works", lambda: _slb_flag(True, False).shape,
         None, check=lambda shape: shape == (2, 3)),
    Case("SparseLinearBatch-sparse_grad-mode-dense-assigned", lambda: _slb_flag(
        True, True, mode="dense"), ValueError,
         r"sparse_grad=True needs the sparse kernels, got mode='dense'"),
    Case("SparseLinearBatch-sparse_grad-reassigned-same-works", lambda: _slb_flag(
        True, True).shape, None, check=lambda shape: shape == (2, 3)),
    Case("SparseOutputLinear-sparse_grad-assigned-int", lambda: _sol_flag(1), TypeError,
         r"sparse_grad must be a bool, got int 1"),
    Case("SparseWeightLinear.from_dense-empty-linear", lambda: nnsparse.SparseWeightLinear.from_dense(
        nn.Linear(3, 0), 0.5), ValueError,
         r"linear must have in_features and out_features >= 1, got Linear\(3, 0\)"),
]


_SPARSE_INDEX = torch.tensor([1, 2]).to_sparse()  # a sparse tensor where indices are due
PROBE6 += [
    Case("Ratings.subset-sparse-index", lambda: _R.subset(_SPARSE_INDEX), TypeError,
         r"index must be a dense integer or bool tensor, got layout torch.sparse_coo"),
    Case("RatingNormalizer.denormalize-sparse-rows", lambda: RatingNormalizer(_R).denormalize(
        torch.ones(2), _SPARSE_INDEX), TypeError,
         r"row indices must be a dense tensor of indices, got layout torch.sparse_coo"),
    Case("RatingNormalizer.normalize-sparse-rows", lambda: RatingNormalizer(_R).normalize(
        torch.ones(2), _SPARSE_INDEX), TypeError,
         r"row indices must be a dense tensor of indices, got layout torch.sparse_coo"),
    Case("collate_sparse_rows-sparse-indices", lambda: collate_sparse_rows(
        [(0, (_SPARSE_INDEX, torch.ones(2)))], 4), TypeError,
         r"rows\[0\] indices must be a dense tensor, got layout torch.sparse_coo"),
    Case("SparseRowBatch-sparse-row_index", lambda: nnsparse.data.SparseRowBatch(
        X.to_sparse_csr(), None, _SPARSE_INDEX), TypeError,
         r"row_index must be a dense tensor of matrix rows, got layout torch.sparse_coo"),
    Case("SparseRowBatch-meta-row_index", lambda: nnsparse.data.SparseRowBatch(
        X.to_sparse_csr(), None, torch.tensor([0, 1], device="meta")), ValueError,
         r"row_index must hold data, got a tensor on the meta device"),
    Case("SparseParts-sparse-col", lambda: nnsparse.SparseLinearBatch(4, 3)(nnsparse.SparseParts(
        torch.tensor([0, 2]), _SPARSE_INDEX, torch.ones(2), (1, 4))), TypeError,
         r"input.col must be a dense tensor, got layout torch.sparse_coo"),
]


PROBE6 += [
    Case("RatingModel.predict_entries-sparse-users", lambda: _fitted_autorec().predict_entries(
        _SPARSE_INDEX, torch.tensor([0, 1])), TypeError,
         r"users must be a dense integer tensor, got layout torch.sparse_coo"),
    Case("Ratings-sparse-rating", lambda: Ratings(torch.tensor([0]), torch.tensor([0]),
                                                  torch.tensor([1.0]).to_sparse(), {1: 0}, {1: 0}),
         TypeError, r"Ratings.rating must be a dense 1-D tensor, got layout torch.sparse_coo"),
    Case("Ratings-csr-user", lambda: Ratings(torch.tensor([[0]]).to_sparse_csr(), torch.tensor([0]),
                                             torch.tensor([1.0]), {1: 0}, {1: 0}), TypeError,
         r"Ratings.user must be a 1-D tensor, got shape \(1, 1\)"),
    Case("Ratings-sparse-user", lambda: Ratings(torch.tensor([0]).to_sparse(), torch.tensor([0]),
                                                torch.tensor([1.0]), {1: 0}, {1: 0}), TypeError,
         r"Ratings.user must be a dense 1-D tensor, got layout torch.sparse_coo"),
    Case("Ratings.from_triples-sparse-users", lambda: Ratings.from_triples(
        _SPARSE_INDEX, [1, 2], [3.0, 4.0]), TypeError,
         r"user must be a dense tensor or a sequence of ids, got layout torch.sparse_coo"),
    Case("Ratings.from_triples-sparse-rating", lambda: Ratings.from_triples(
        [1, 2], [1, 2], torch.tensor([3.0, 4.0]).to_sparse()), TypeError,
         r"rating must be a dense tensor or a sequence of numbers, got layout torch.sparse_coo"),
    Case("LazyAdam-lr-sparse-tensor", lambda: LazyAdam([nn.Parameter(torch.zeros(2))],
                                                       lr=torch.tensor([0.1]).to_sparse()),
         TypeError, r"lr must be a number, got Tensor"),
    Case("make_optimizer-lr-sparse-tensor", lambda: nnsparse.make_optimizer(
        nn.Linear(2, 2), lr=torch.tensor([0.1]).to_sparse()), TypeError,
         r"lr must be a number, got Tensor"),
    Case("SparseParts.with_values-sparse", lambda: nnsparse.sparse_parts(X.to_sparse()).with_values(
        torch.ones(4).to_sparse()), TypeError,
         r"values must be a dense \(nnz,\) tensor, got layout torch.sparse_coo"),
]


PROBE6 += [
    # a model registered under a non-str name made MODELS unsortable (and no file could name it)
    Case("register-name-int", lambda: nnsparse.models.register(
        type("IntNamed", (nnsparse.models.RatingModel,), {"name": 3})), TypeError,
         r"IntNamed.name must be a str, got int 3"),
    Case("register-name-empty", lambda: nnsparse.models.register(
        type("EmptyNamed", (nnsparse.models.RatingModel,), {"name": ""})), ValueError,
         r"EmptyNamed.name must be a non-empty str, got ''"),
]


PROBE6 += [
    # the identity of a plain criterion returned a str; the denoising criteria refuse it
    Case("SparseCriterion.prepare_input-str", lambda: nnsparse.SparseCriterion(
        nn.MSELoss()).prepare_input("x"), TypeError,
         r"input must be a sparse batch or a dense \(rows, n\) tensor, got str"),
    Case("SparseCriterion.prepare_input-list-of-ints", lambda: nnsparse.SparseCriterion(
        nn.MSELoss()).prepare_input([1, 2]), TypeError, r"input\[0\] must be a tensor, got int"),
    Case("SparseCriterion.prepare_input-batch-works", lambda: nnsparse.SparseCriterion(
        nn.MSELoss()).prepare_input(S), None, check=lambda out: out is S),
]


PROBE6 += [
    Case("Trainer.fit-unbuilt-model", lambda: nnsparse.models.Trainer(
        nnsparse.models.AutoRec(hidden=3), epochs=1, batch_size=2, lr=0.1, progress=False,
        log=None).fit(S), ValueError,
         r"model must have parameters that require grad, got none \(AutoRec is not built: "
         r"RatingModel.fit\(\) builds its layers"),
    Case("Trainer.make_optimizer-frozen-model", lambda: nnsparse.models.Trainer(
        _frozen(nn.Linear(2, 2)), epochs=1, batch_size=2, lr=0.1).make_optimizer(), ValueError,
         r"model must have parameters that require grad, got none$"),
]


PROBE6 += [
    # torch has no autocast state for the meta device: asking it raised a RuntimeError
    Case("SparseOutputLinear-meta-dense-output-works", lambda: nnsparse.SparseOutputLinear(
        3, 4, device="meta")(torch.ones(2, 3, device="meta")).shape, None,
         check=lambda shape: shape == (2, 4)),
    Case("SparseLinearBatch-meta-input-other-dtype", lambda: nnsparse.SparseLinearBatch(
        4, 3, device="meta")(X.double().to_sparse().to("meta")), ValueError,
         r"input must hold data, got a tensor on the meta device"),
    Case("SparseOutputLinear-meta-input-other-dtype", lambda: nnsparse.SparseOutputLinear(
        3, 4, device="meta")(torch.ones(2, 3, device="meta", dtype=torch.float64),
                             X.to_sparse().to("meta")), ValueError,
         r"weight must have input's dtype torch.float64, got torch.float32"),
]



def _read_item_text(text: str):
    """read_item_features of an ml-100k ``u.item`` text, for items 1 and 2."""
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "u.item").write_text(text)
        return nnsparse.data.read_item_features(Path(d) / "u.item", "ml-100k", {1: 0, 2: 1})


_FLAGS = "|".join(["0"] * 18)
PROBE6 += [
    Case("read_item_features-ml-100k-nan-flag", lambda: _read_item_text(
        f"1|Toy|d||u|{_FLAGS}|nan\n"), ValueError,
         r"u.item, line 1: the genre flags must be finite numbers, got nan"),
    Case("read_item_features-ml-100k-inf-flag", lambda: _read_item_text(
        f"1|Toy|d||u|{_FLAGS}|1\n2|Heat|d||u|inf|{_FLAGS}\n"), ValueError,
         r"u.item, line 2: the genre flags must be finite numbers, got inf"),
    Case("read_item_features-ml-100k-works", lambda: _read_item_text(
        f"1|Toy|d||u|{_FLAGS}|1\n").sum(1).tolist(), None, check=lambda rows: rows == [1.0, 0.0]),
]



def _trainer_and_batch():
    model = _fitted_autorec()
    trainer = nnsparse.models.Trainer(model, epochs=1, batch_size=2, lr=0.1, progress=False,
                                      log=None)
    dataset = SparseRowDataset(model._input)
    return trainer, dataset


PROBE6 += [
    # the public hooks of the training loop, called by hand (AttributeError: 'str'.to before)
    Case("Trainer.step-batch-str", lambda: (lambda t, d: t.step("b", t.make_optimizer()))(
        *_trainer_and_batch()), TypeError,
         r"batch must be a SparseRowBatch \(SparseRowDataset.collate\) or another batch with "
         r"to\(\), row_index and input, got str"),
    Case("Trainer.step-optimizer-str", lambda: (lambda t, d: t.step(d.collate([d[0]]), "o"))(
        *_trainer_and_batch()), TypeError,
         r"optimizer must be an optimiser with step\(\) and zero_grad\(\) \(make_optimizer\), "
         r"got str"),
    Case("Trainer.run_epoch-loader-str", lambda: (lambda t, d: t.run_epoch(
        "batches", t.make_optimizer(), 1))(*_trainer_and_batch()), TypeError,
         r"loader must be a DataLoader or another sized iterable of batches \(make_loader\), "
         r"got str"),
    Case("Trainer.run_epoch-loader-int", lambda: (lambda t, d: t.run_epoch(
        3, t.make_optimizer(), 1))(*_trainer_and_batch()), TypeError,
         r"loader must be a DataLoader or another sized iterable of batches \(make_loader\), "
         r"got int"),
    # an overridden make_loader may return a list of collated batches: it trains
    Case("Trainer.run_epoch-loader-list", lambda: (lambda t, d: t.run_epoch(
        [d.collate([d[0]]), d.collate([d[1], d[2]])], t.make_optimizer(), 1))(
        *_trainer_and_batch()), None, check=lambda loss: loss > 0),
    Case("Trainer.run_epoch-epoch-0", lambda: (lambda t, d: t.run_epoch(
        t.make_loader(d), t.make_optimizer(), 0))(*_trainer_and_batch()), ValueError,
         r"epoch must be an int >= 1, got 0"),
    Case("Trainer.run_epoch-epoch-float", lambda: (lambda t, d: t.run_epoch(
        t.make_loader(d), t.make_optimizer(), 1.0))(*_trainer_and_batch()), TypeError,
         r"epoch must be an int >= 1, got 1.0"),
]


PROBE6 += [
    Case("distributed.loader-dataset-str", lambda: nnsparse.distributed.loader("abc", 1), TypeError,
         r"dataset must be a map-style dataset \(with __len__ and __getitem__\), got str"),
]



def _swl_edited(edit):
    """A SparseWeightLinear whose pattern buffers were edited by hand, then run (a crow
    past nnz crashed the process; a zeroed crow gave a silently empty weight)."""
    layer = nnsparse.SparseWeightLinear.random(4, 3, 0.5, seed=0)
    with torch.no_grad():
        edit(layer)
    return layer(torch.ones(2, 4))


_SWL_PATTERN = r"SparseWeightLinear crow/col "
PROBE6 += [
    Case("SparseWeightLinear-crow-edited-past-nnz", lambda: _swl_edited(
        lambda l: l.crow.__setitem__(-1, 100)), ValueError,
         _SWL_PATTERN + r"crow_indices must end at nnz = 6 \(the number of column indices\), "
                        r"got 100"),
    Case("SparseWeightLinear-crow-zeroed", lambda: _swl_edited(lambda l: l.crow.zero_()),
         ValueError, _SWL_PATTERN + r"crow_indices must end at nnz = 6"),
    Case("SparseWeightLinear-col-edited-negative", lambda: _swl_edited(
        lambda l: l.col.__setitem__(0, -1)), ValueError,
         _SWL_PATTERN + r"column indices must be non-negative, got min -1"),
    Case("SparseWeightLinear-crow-replaced-float", lambda: _swl_edited(
        lambda l: setattr(l, "crow", l.crow.float())), TypeError,
         r"SparseWeightLinear.crow must be a 1-D int64 or int32 tensor, got torch.float32"),
    Case("SparseWeightLinear-col-edited-in-range-works", lambda: _swl_edited(
        lambda l: l.col.copy_(l.col)).shape, None, check=lambda shape: shape == (2, 3)),
]



def _collate_edited(edit):
    """SparseRowDataset.collate of an item edited in place (its tensors are views of the
    dataset's checked matrix, which collate trusted: the layer's kernel failed)."""
    ds = SparseRowDataset(torch.eye(4).to_sparse_csr())
    item = ds[0]
    edit(item[1])
    return ds.collate([item, ds[1]]).input.to_dense()


PROBE6 += [
    Case("SparseRowDataset.collate-item-index-edited", lambda: _collate_edited(
        lambda row: row.indices.fill_(10 ** 6)), ValueError,
         r"the dataset's input \(edited since it was built\) column indices must be in \[0, 4\), "
         r"got max 1000000"),
    Case("SparseRowDataset.collate-item-values-resized", lambda: _collate_edited(
        lambda row: row.values.resize_(5)), ValueError,
         r"rows\[0\] must have one value per index \(1-D, equal lengths\), got indices of shape "
         r"\(1,\) and values of shape \(5,\)"),
    Case("SparseRowDataset.collate-item-values-edited-works", lambda: _collate_edited(
        lambda row: row.values.mul_(2)).tolist(), None,
         check=lambda dense: dense == [[2.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]]),
]



def _pickled_batch(input):
    """A SparseRowBatch built by hand, through pickle (as a DataLoader worker sends it)."""
    import pickle
    batch = pickle.loads(pickle.dumps(nnsparse.data.SparseRowBatch(input, None,
                                                                   torch.tensor([0, 1]))))
    return nnsparse.SparseLinearBatch(4, 3)(batch.input)


PROBE6 += [
    # the rebuilt batch was trusted whatever it held: a crash of the process
    Case("SparseRowBatch-hand-built-csr-through-pickle", lambda: _pickled_batch(
        csr([0, 7, 2], [0, 1], [1, 2], (2, 4))), ValueError,
         r"input crow_indices must be non-decreasing, got a step of -5"),
    Case("SparseRowBatch-hand-built-coo-through-pickle", lambda: _pickled_batch(
        coo([[0, 1], [0, 9]], [1, 2], (2, 4))), ValueError,
         r"input column indices must be in \[0, 4\), got max 9"),
    Case("SparseRowBatch-hand-built-valid-through-pickle-works", lambda: _pickled_batch(
        X.to_sparse_csr()), None, check=lambda out: out.shape == (2, 3)),
]


# -- optimisers of models with frozen or no sparse layers --------------------------------------

def _frozen(model):
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def _frozen_sparse_weights():
    model = nn.Sequential(nnsparse.SparseLinearBatch(4, 3), nn.Linear(3, 2))
    model[0].weight.requires_grad_(False)
    return model


OPTIM_FROZEN = [
    Case("fused_step-nothing-trainable", lambda: nnsparse.optim.fused_step_optimizer(
        _frozen(nn.Sequential(nnsparse.SparseLinearBatch(4, 3), nn.Linear(3, 2)))), ValueError,
         r"model must have parameters that require grad, got none \(its 4 parameters are all "
         r"frozen\)"),
    Case("in_backward-nothing-trainable", lambda: nnsparse.optim.apply_optimizer_in_backward(
        _frozen(nnsparse.SparseOutputLinear(3, 4))), ValueError,
         r"model must have parameters that require grad, got none"),
    Case("fused_step-no-parameters", lambda: nnsparse.optim.fused_step_optimizer(
        nn.Sequential()), ValueError, r"model must have parameters that require grad, got none "
                                      r"\(it has none\)"),
    Case("in_backward-no-sparse-layer", lambda: nnsparse.optim.apply_optimizer_in_backward(
        nn.Linear(2, 2)), ValueError,
         r"model must hold a SparseLinearBatch or SparseOutputLinear, found none in Linear"),
    # must work: frozen sparse weights, a model with no sparse layer (fused_step: Adam)
    Case("fused_step-frozen-sparse-weights-works", lambda: nnsparse.optim.fused_step_optimizer(
        _frozen_sparse_weights()), None,
         check=lambda opt: repr(opt) == "InBackwardOptimizer(kind='adam', in_backward=[], "
                                        "dense=Adam)"),
    Case("in_backward-frozen-sparse-weights-works",
         lambda: nnsparse.optim.apply_optimizer_in_backward(_frozen_sparse_weights(), "sgd"),
         None, check=lambda opt: opt.tables == {}),
    Case("fused_step-no-sparse-layer-works", lambda: nnsparse.optim.fused_step_optimizer(
        nn.Linear(2, 2)), None, check=lambda opt: type(opt.dense) is torch.optim.Adam),
    Case("LazyAdam.load_state_dict-step-fractional", lambda: _load_lazy_step(2.5), ValueError,
         r"state_dict\['state'\]\[0\]\['step'\] must be a whole number >= 0, got 2.5"),
    Case("LazyAdam.load_state_dict-step-float-works", lambda: _load_lazy_step(2.0), None,
         check=lambda step: type(step) is int and step == 2),
]


def _load_lazy_step(step):
    p = nn.Parameter(torch.zeros(3, 2))
    opt = LazyAdam([p])
    opt.load_state_dict({"state": {0: _entry(step=step)},
                         "param_groups": opt.state_dict()["param_groups"]})
    return opt.state[p]["step"]


# -- the seventh probe ---------------------------------------------------------------------

def _probe7_file(name, data):
    """``data`` (bytes) written to a fresh temporary file ``name``; its path."""
    import os
    import tempfile
    path = os.path.join(tempfile.mkdtemp(prefix="probe7-", dir=_tmp_root()), name)
    with open(path, "wb") as f:
        f.write(data)
    return path


_ML1M = b"1::10::5::978300760\n1::20::3::978300760\n2::10::4::978300760\n"


def _probe7_gzip():
    import gzip
    return _probe7_file("ratings.dat", gzip.compress(_ML1M))


def _probe7_zip():
    import io
    import zipfile
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr("ml-1m/ratings.dat", _ML1M)
    return _probe7_file("ml-1m.zip", buffer.getvalue())


def _refused_in_backward_hp():
    """A hand-built InBackwardOptimizer refused for its hp: the layer is left without one."""
    layer = nnsparse.SparseLinearBatch(4, 3)
    try:
        nnsparse.optim.InBackwardOptimizer(layer, "adam", dict(_HP7, lr=-1.0))
    except ValueError:
        return layer._row_update
    return "not refused"


_HP7 = dict(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum=0.0,
            nesterov=False, initial_accumulator_value=0.0, dense_above=None)


class _LossNet(nn.Module):
    """A model for Trainer whose batch_loss returns ``result(x)``."""

    def __init__(self, result):
        super().__init__()
        self.layer, self.result = nnsparse.SparseLinearBatch(4, 3), result

    def batch_loss(self, rows, x):
        return self.result(self.layer(x))


def _trainer_fit(model):
    return nnsparse.models.Trainer(model, epochs=1, batch_size=2, lr=0.01, progress=False,
                                   log=None).fit(S)


def _converted_predictions(convert):
    """The fitted AutoRec's predictions on _R after ``convert`` (e.g. ``.double()``) of a copy."""
    import copy
    return convert(copy.deepcopy(_fitted_autorec())).predict(_R)


_PAIRS7 = [torch.tensor([[0.0, 1.0]]), torch.zeros(0, 2)]
# pair rows covering X's entries, and X as a sparse target 6 columns wide
_EST7 = [torch.tensor([[0.0, 0.5], [2.0, 2.0]]), torch.tensor([[1.0, 3.0], [3.0, 1.0]])]
_WIDE7 = torch.cat([X, torch.zeros(2, 2)], 1).to_sparse()


def _missing_device():
    """A device type torch names that this machine lacks (xpu or mps here; cuda without a GPU)."""
    for name in ("xpu", "mps", "cuda"):
        try:
            torch.empty(0, device=name)
        except (RuntimeError, AssertionError, NotImplementedError):
            return name
    return "xpu:99"  # an index past the devices of a machine that has all three


_MISSING_DEVICE = _missing_device()
_NET7 = nn.Sequential(nnsparse.SparseLinearBatch(4, 3), nn.Linear(3, 4))

PROBE7 = [
    # sizes beyond int64: torch's "Overflow when unpacking long long" / "Storage size
    # calculation overflowed"
    Case("SparseLinearBatch-in_features-2**64", lambda: nnsparse.SparseLinearBatch(2 ** 64, 1),
         ValueError, r"in_features must be a non-negative int "
                     r"within int64 \(below 2\*\*63\), got 18446744073709551616"),
    Case("SparseLinearBatch-weight-bytes-overflow", lambda: nnsparse.SparseLinearBatch(
        2 ** 63 - 1, 1, device="meta"), ValueError,
         r"in_features \* out_features \(the weight's elements, 4 bytes each\) must take fewer "
         r"than 2\*\*63 bytes, got 9223372036854775807 \* 1"),
    Case("SparseOutputLinear-weight-bytes-overflow", lambda: nnsparse.SparseOutputLinear(
        2 ** 62, 4, device="meta"), ValueError,
         r"in_features \* out_features \(the weight's elements, 4 bytes each\) must take fewer "
         r"than 2\*\*63 bytes, got 4611686018427387904 \* 4"),
    Case("SparseLinearBatch-2**31-inputs-meta-works", lambda: nnsparse.SparseLinearBatch(
        2 ** 31, 2, device="meta").weight.shape, None,
         check=lambda shape: shape == (2, 2 ** 31)),
    Case("Densify-in_features-2**64", lambda: nnsparse.Densify(2 ** 64), ValueError,
         r"in_features must be a non-negative int "
         r"within int64 \(below 2\*\*63\), got 18446744073709551616"),
    Case("from_pairs-size-2**63", lambda: nnsparse.from_pairs(torch.tensor([[0.0, 1.0]]), 2 ** 63),
         ValueError, r"size must be a non-negative int "
                     r"within int64 \(below 2\*\*63\), got 9223372036854775808"),
    Case("from_pairs-index-int64-max", lambda: nnsparse.from_pairs(
        torch.tensor([[2 ** 63 - 1, 1]])), ValueError,
         r"pairs indices must be below 2\*\*63 - 1 \(the size max \+ 1 must fit int64\), "
         r"got max 9223372036854775807"),
    Case("from_pairs-index-2**62-works", lambda: nnsparse.from_pairs(
        torch.tensor([[2 ** 62, 1]])).shape, None, check=lambda shape: shape == (2 ** 62 + 1,)),
    Case("stopk-k-2**63", lambda: nnsparse.stopk(S, 2 ** 63), ValueError,
         r"k must be a non-negative int within int64 \(below 2\*\*63\), got 9223372036854775808"),
    Case("DynamicSparseTensor-index-int64-max-build", lambda: (lambda d: (
        d.append(2 ** 63 - 1, 1.0), d.build()))(nnsparse.DynamicSparseTensor()), ValueError,
         r"indices must be below 2\*\*63 - 1 \(the size max \+ 1 must fit int64\)"),
    Case("DynamicSparseTensor.build-size-2**63", lambda: (lambda d: (
        d.append(5, 1.0), d.build(2 ** 63)))(nnsparse.DynamicSparseTensor()), ValueError,
         r"size must be an int within int64 \(below 2\*\*63\), got 9223372036854775808"),
    Case("DynamicSparseTensor-reserve-2**63", lambda: nnsparse.DynamicSparseTensor(
        reserve=2 ** 63), ValueError,
         r"reserve must be a non-negative int within int64 \(below 2\*\*63\)"),
    Case("recommend-min_support-2**70", lambda: _fitted_autorec().recommend(
        _R.user_ids()[0], min_support=2 ** 70), ValueError,
         r"min_support must be a non-negative int "
         r"within int64 \(below 2\*\*63\), got 1180591620717411303424"),
    # a float [index, value] row whose index its dtype no longer holds exactly
    Case("DynamicSparseTensor.append-float32-row-index-rounded", lambda: (
        nnsparse.DynamicSparseTensor().append(torch.tensor([2.0 ** 25 + 2, 1.0]))), ValueError,
         r"the index of an \[index, value\] row stored as torch.float32 is exact only up to "
         r"16777216, got 3.35544e\+07; build the row as float64 or int64"),
    Case("DynamicSparseTensor.append-float16-row-2048-works", lambda: (lambda d: (
        d.append(torch.tensor([2048.0, 1.0], dtype=torch.float16)), d.build()))(
            nnsparse.DynamicSparseTensor())[1].shape, None,
         check=lambda shape: shape == (2049,)),
    # every float dtype has its limit, float64's 2**53 as from_pairs, the e5m2 kinds' 8
    # (torch.finfo's eps for float8_e5m2fnuz said 16); the second index of an ndim=2 row;
    # ±inf is no whole number, not an index that float64 would hold
    *(Case(f"DynamicSparseTensor.append-{dtype}-row-index-{index:g}".replace("torch.", ""),
           (lambda dtype=dtype, index=index: (lambda d: (
               d.append(torch.tensor([index, 1.0], dtype=torch.float64).to(dtype)),
               d.build_pairs()))(nnsparse.DynamicSparseTensor(dtype=torch.float64))[1]),
           ValueError if fail else None,
           rf"^the index of an \[index, value\] row stored as {dtype} is exact only up to "
           rf"{int(limit)}, got {re.escape(f'{index:g}')}; {re.escape(fix)}$",
           check=lambda pairs, index=index: pairs.tolist() == [[index, 1.0]])
      for dtype, limit, fix in [
          *((d, lim, "build the row as float64 or int64") for d, lim in [
              (torch.float16, 2048), (torch.bfloat16, 256), (torch.float32, 2 ** 24),
              (torch.float8_e4m3fn, 16), (torch.float8_e5m2, 8), (torch.float8_e5m2fnuz, 8)]),
          (torch.float64, 2 ** 53, "give the index as an int, append(index, value)")]
      for index, fail in [(float(limit), False), (float(limit + limit // 4), True)]),
    # the float64 message's fix: an int index above 2**53 is kept (build() has int64 indices)
    Case("DynamicSparseTensor.append-int-index-above-2**53-works", lambda: (lambda d: (
        d.append(2 ** 53 + 1, 1.0), d.build()))(nnsparse.DynamicSparseTensor(
            dtype=torch.float64))[1]._indices().tolist(), None,
         check=lambda indices: indices == [[2 ** 53 + 1]]),
    Case("DynamicSparseTensor.append-ndim2-float32-row-second-index-rounded", lambda: (
        nnsparse.DynamicSparseTensor(ndim=2).append(torch.tensor([1.0, 2.0 ** 25 + 2, 1.0]))),
         ValueError, r"^the index of an \[index, value\] row stored as torch.float32 is exact "
                     r"only up to 16777216, got 3.35544e\+07; build the row as float64 or int64$"),
    Case("DynamicSparseTensor.append-ndim2-refused-row-leaves-the-builder", lambda: (
        lambda d: (pytest.raises(ValueError, d.append, torch.tensor([1.0, 2.0 ** 25 + 2, 1.0])),
                   len(d)))(nnsparse.DynamicSparseTensor(ndim=2))[1], None,
         check=lambda n: n == 0),
    *(Case(f"DynamicSparseTensor.append-{dtype}-row-index-inf-ndim{ndim}".replace("torch.", ""),
           (lambda dtype=dtype, ndim=ndim: nnsparse.DynamicSparseTensor(ndim=ndim).append(
               torch.tensor([float("inf")] * ndim + [1.0], dtype=dtype))), ValueError,
           r"^the index of an \[index, value\] row must be a whole number, got inf$")
      for dtype in (torch.float32, torch.float64) for ndim in (1, 2)),
    # float8_e8m0fnu (exponent-only: powers of two only) holds no 0, so no index: refused
    # for indices by kind, whatever their values (its table entry said "exact up to 2";
    # to_pairs stored index 0 as 2**-127, an appended row's 3 became 4)
    *(Case(f"DynamicSparseTensor.append-float8_e8m0fnu-row-{'-'.join(f'{v:g}' for v in row)}",
           (lambda row=row: nnsparse.DynamicSparseTensor(ndim=len(row) - 1).append(
               torch.tensor(row).to(torch.float8_e8m0fnu))), TypeError,
           r"^the index of an \[index, value\] row must be stored in a dtype that holds 0 and "
           r"every whole number up to it, got torch.float8_e8m0fnu, which cannot hold 0; "
           r"build the row as float64 or int64$")
      for row in ([0.0, 1.0], [1.0, 2.0], [3.0, 1.0], [1.0, 2.0, 4.0])),
    *(Case(f"to_pairs-float8_e8m0fnu-{nnz}", (lambda x=x: nnsparse.to_pairs(x)), TypeError,
           r"^x's indices \(cast to the values' dtype\) must be stored in a dtype that holds 0 "
           r"and every whole number up to them, got torch.float8_e8m0fnu, which cannot hold "
           r"0; convert the values to float64 or int64$")
      for nnz, x in [("entries", torch.tensor([[0., 2.], [1., 0.]]).to_sparse().to(
                          torch.float8_e8m0fnu)),
                     ("no-entries", torch.zeros(2, 3).to_sparse().to(torch.float8_e8m0fnu))]),
    Case("from_pairs-float8_e8m0fnu", lambda: nnsparse.from_pairs(
        torch.tensor([[1., 2.]]).to(torch.float8_e8m0fnu)), TypeError,
         r"^pairs indices must be stored in a dtype that holds 0 and every whole number up to "
         r"them, got torch.float8_e8m0fnu, which cannot hold 0; build the pairs as float64 or "
         r"int64$"),
    Case("EXACT_INDEX-has-no-float8_e8m0fnu", lambda: torch.float8_e8m0fnu in
         nnsparse._forms.EXACT_INDEX, None, check=lambda inside: not inside),
    # LazyAdam: a parameter named twice was updated twice a step (torch only warns)
    Case("LazyAdam-parameter-twice", lambda: (lambda p: LazyAdam([p, p]))(
        nn.Parameter(torch.zeros(2))), ValueError,
         r"params must name each parameter once, got the same tensor at positions 0 and 1 "
         r"\(each step would update it twice\)"),
    Case("LazyAdam-parameter-twice-generator", lambda: (lambda p: LazyAdam(
        q for q in [p, p]))(nn.Parameter(torch.zeros(2))), ValueError,
         r"params must name each parameter once"),
    Case("LazyAdam-generator-of-parameters-works", lambda: LazyAdam(
        p for p in nn.Linear(2, 2).parameters()).param_groups[0]["params"], None,
         check=lambda params: len(params) == 2),
    Case("LazyAdam-integer-tensor", lambda: LazyAdam([torch.zeros(2, dtype=torch.long)]),
         TypeError, r"params must be floating-point tensors \(Adam's moments\), got torch.int64 "
                    r"at position 0"),
    Case("LazyAdam-bool-tensor-in-group", lambda: LazyAdam([
        {"params": [nn.Parameter(torch.zeros(2)), torch.zeros(2, dtype=torch.bool)]}]),
         TypeError, r"got torch.bool at position 1"),
    # InBackwardOptimizer built by hand: KeyError 'lr', torch's "Invalid learning rate"
    Case("InBackwardOptimizer-hp-empty", lambda: nnsparse.optim.InBackwardOptimizer(
        nnsparse.SparseLinearBatch(4, 3), "adam", {}), ValueError,
         r"hp must hold \['lr', 'betas', 'eps', 'weight_decay', 'momentum', 'nesterov', "
         r"'initial_accumulator_value', 'dense_above'\], got no \['lr',.*apply_optimizer_in_backward"),
    Case("InBackwardOptimizer-hp-lr-nan", lambda: nnsparse.optim.InBackwardOptimizer(
        nnsparse.SparseLinearBatch(4, 3), "adam", dict(_HP7, lr=float("nan"))), ValueError,
         r"lr must be non-negative, got nan"),
    Case("InBackwardOptimizer-hp-refused-leaves-the-layer", _refused_in_backward_hp, None,
         check=lambda update: update is None),
    Case("InBackwardOptimizer-hp-complete-works", lambda: nnsparse.optim.InBackwardOptimizer(
        nnsparse.SparseLinearBatch(4, 3), "adam", dict(_HP7)).kind, None,
         check=lambda kind: kind == "adam"),
    # Lua pair rows through a Batchifier were cut as wide as their largest index + 1
    Case("Batchifier-pair-rows-works", lambda: nnsparse.Batchifier(
        _NET7, 4, batch_size=1, progress=False)(_PAIRS7), None,
         check=lambda out: torch.allclose(out, _NET7(_PAIRS7))),
    Case("Batchifier.topk-pair-rows-exclude-works", lambda: nnsparse.Batchifier(
        _NET7, 4, batch_size=1, progress=False).topk(_PAIRS7, 4, exclude=True).values[0],
         None, check=lambda top: bool(torch.isinf(top[-1])) and bool(torch.isfinite(top[:3]).all())),
    # PatternSequential dropped a pattern no module takes: a dense output of every column
    Case("PatternSequential-pattern-no-module-takes", lambda: nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(4, 3), nn.Linear(3, 4))(S, S), ValueError,
         r"pattern was given, but no module of this PatternSequential takes one .* its modules "
         r"are \['SparseLinearBatch', 'Linear'\]"),
    Case("PatternSequential-pattern-taken-works", lambda: nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(4, 3), nnsparse.SparseOutputLinear(3, 4))(S, S), None,
         check=lambda out: out.layout == torch.sparse_csr and out._nnz() == 4),
    # flags: a numpy bool was refused as "must be a bool, got bool np.True_"
    Case("SparseCriterion-full_size_average-numpy-bool-works", lambda: nnsparse.SparseCriterion(
        nn.MSELoss(), full_size_average=_NP.True_).full_size_average, None,
         check=lambda flag: flag is True),
    Case("SparseLinearBatch-numpy-bool-flags-works", lambda: nnsparse.SparseLinearBatch(
        4, 3, bias=_NP.False_, sparse_grad=_NP.True_), None,
         check=lambda layer: layer.bias is None and layer.sparse_grad is True
         and layer(S).shape == (2, 3)),
    Case("LazyAdam-decoupled-numpy-bool-works", lambda: LazyAdam(
        [nn.Parameter(torch.zeros(2))], decoupled_weight_decay=_NP.True_).defaults[
            "decoupled_weight_decay"], None, check=lambda flag: flag is True),
    Case("AutoRec-refit-numpy-bool-works", lambda: nnsparse.models.AutoRec(
        refit=_NP.True_).hparams["refit"], None, check=lambda flag: flag is True),
    Case("ssort-descending-int-still-refused", lambda: nnsparse.ssort(S, descending=1),
         TypeError, r"descending must be a bool, got int 1"),
    Case("SparseLinearBatch-bias-bool-tensor-still-refused", lambda: nnsparse.SparseLinearBatch(
        4, 3, bias=torch.tensor(True)), TypeError, r"bias must be a bool, got Tensor"),
    # readers: a compressed or binary file failed on its first line, its bytes quoted
    Case("read_ratings-gzip-without-gz-name", lambda: read_ratings(
        _probe7_gzip(), "ml-1m", titles=False), ValueError,
         r"ratings.dat is gzip-compressed \(it starts with b'\\x1f\\x8b'\), not a text file; "
         r"decompress it first \(gunzip\)"),
    Case("read_ratings-zip-archive", lambda: read_ratings(_probe7_zip(), "ml-1m", titles=False),
         ValueError, r"ml-1m.zip is a zip archive .* extract it and give the rating file in it"),
    Case("read_ratings-utf16", lambda: read_ratings(_probe7_file(
        "ratings.dat", _ML1M.decode().encode("utf-16")), "ml-1m", titles=False), ValueError,
         r"ratings\.dat, line 1: a NUL byte \(\\x00\), which no text file holds, got "
         r"'\xff\xfe1\\x00.*' \(in its first 4096 bytes: a binary file or UTF-16 text"),
    Case("read_ratings-text-starting-BZh-works", lambda: read_ratings(_probe7_file(
        "r.txt", b"BZh 10 5\nx 10 4\n"), "text", titles=False).user_ids(), None,
         check=lambda ids: ids == ["BZh", "x"]),
    Case("read_user_features-age-says-what-came", lambda: nnsparse.data.read_user_features(
        _probe7_file("users.dat", b"1::M::x::10::48067\n"), "ml-1m", {1: 0}), ValueError,
         r"line 1: the id and the age must be integers, got '1' and 'x'"),
    # Ratings.from_triples: numpy made str of every id of a mixed list, read '3' as 3.0
    Case("Ratings.from_triples-mixed-id-kinds", lambda: Ratings.from_triples(
        [1, "1"], [2, 2], [1.0, 2.0]), TypeError,
         r"user must hold ids of one kind \(all str or all numbers\), got str '1' and int 1"),
    Case("Ratings.from_triples-numeric-str-rating", lambda: Ratings.from_triples(
        [1], [2], ["3"]), TypeError, r"rating must be a sequence of real numbers, got str '3'"),
    Case("Ratings.from_triples-bool-rating-list", lambda: Ratings.from_triples(
        [1], [2], [True]), TypeError, r"rating must be a sequence of real numbers, got bool True"),
    Case("Ratings.from_triples-bool-rating-tensor", lambda: Ratings.from_triples(
        [1], [2], torch.tensor([True])), TypeError,
         r"rating must be a sequence of real numbers, got a bool tensor"),
    Case("Ratings.from_triples-ids-dict", lambda: Ratings.from_triples({1: 0}, [2], [1.0]),
         TypeError, r"user must be a sequence of ids \(a list, array or tensor\), got dict"),
    Case("Ratings.from_triples-ids-ragged", lambda: Ratings.from_triples(
        [[1], [2, 3]], [2, 3], [1.0, 2.0]), ValueError,
         r"user must be 1-D, one id per rating, got nested sequences of different lengths"),
    Case("Ratings.from_triples-int-and-float-ids-works", lambda: Ratings.from_triples(
        [1, 2.5], [2, 2], [1.0, 2.0]).user_ids(), None, check=lambda ids: ids == [1.0, 2.5]),
    # a model converted since fit: "input must have the weight's dtype torch.float64"
    Case("RatingModel.predict-after-double-works", lambda: _converted_predictions(
        lambda m: m.double()), None, check=lambda pred: pred.dtype == torch.float32
         and torch.allclose(pred, _fitted_autorec().predict(_R), atol=1e-5)),
    Case("RatingModel.predict-after-half-works", lambda: _converted_predictions(
        lambda m: m.half()), None, check=lambda pred: pred.dtype == torch.float32
         and torch.allclose(pred, _fitted_autorec().predict(_R), atol=0.05)),
    # Trainer: AttributeError, torch's "grad can be implicitly created only for scalar outputs"
    Case("Trainer-model-without-batch_loss", lambda: _trainer_fit(nn.Linear(4, 4)), TypeError,
         r"model must have a batch_loss\(rows, x\) method for Trainer's step \(a RatingModel has "
         r"one\), got Linear without one"),
    Case("Trainer-batch_loss-vector", lambda: _trainer_fit(_LossNet(lambda y: y.sum(1))),
         ValueError, r"model.batch_loss must return a scalar loss tensor, got shape \(2,\)"),
    Case("Trainer-batch_loss-float", lambda: _trainer_fit(_LossNet(lambda y: 1.0)), TypeError,
         r"model.batch_loss must return a scalar loss tensor, got float"),
    Case("Batchifier.forward-lua-nFrame", lambda: nnsparse.Batchifier(
        nnsparse.Densify(4), 4, progress=False)(S, 2, 5), TypeError,
         r"Batchifier.forward takes \(data, batch_size\), got 1 more positional argument\(s\) "
         r"\(5,\); Lua's nFrame has no equivalent"),
    Case("Batchifier.forward-lua-batchSize-works", lambda: nnsparse.Batchifier(
        nnsparse.Densify(4), 4, progress=False)(S, 1), None, check=lambda out: torch.equal(out, X)),
    # integer ratings: the difference wrapped before the cast (uint8 0 - 255 is 1)
    Case("rmse-uint8-no-wrap-works", lambda: rmse(torch.tensor([0], dtype=torch.uint8),
                                                  torch.tensor([255], dtype=torch.uint8)),
         None, check=lambda out: out.item() == 255.0 and out.dtype == torch.float32),
    Case("mae-int8-no-wrap-works", lambda: mae(torch.tensor([-128], dtype=torch.int8),
                                               torch.tensor([127], dtype=torch.int8)),
         None, check=lambda out: out.item() == 255.0),
    Case("RatingErrors-uint8-no-wrap-works", lambda: (lambda e: (e.update(
        torch.tensor([0], dtype=torch.uint8), torch.tensor([255], dtype=torch.uint8)),
        e.compute()))(nnsparse.data.RatingErrors())[1], None,
         check=lambda out: out["rmse"] == 255.0 and out["mae"] == 255.0),
    # a device torch names but this machine lacks: torch's AssertionError ("Torch not
    # compiled with XPU enabled") at the first tensor
    Case("SparseLinearBatch-device-missing", lambda: nnsparse.SparseLinearBatch(
        4, 3, device=_MISSING_DEVICE), ValueError, r"device must be one this machine has, got "),
    Case("SparseRowBatch.to-device-missing", lambda: SparseRowDataset(S).collate(
        [SparseRowDataset(S)[0]]).to(_MISSING_DEVICE), ValueError,
         r"device must be one this machine has, got "),
    Case("SparseParts.to-device-missing", lambda: nnsparse.sparse_parts(S).to(_MISSING_DEVICE),
         ValueError, r"device must be one this machine has, got "),
    Case("RatingNormalizer.to-device-missing", lambda: RatingNormalizer(_R).to(_MISSING_DEVICE),
         ValueError, r"device must be one this machine has, got "),
    Case("Batchifier-device-missing", lambda: nnsparse.Batchifier(
        nnsparse.Densify(4), 4, device=_MISSING_DEVICE, progress=False), ValueError,
         r"device must be one this machine has, got "),
    Case("Trainer-device-missing", lambda: nnsparse.models.Trainer(
        nn.Linear(2, 2), epochs=1, batch_size=1, lr=0.1, device=_MISSING_DEVICE), ValueError,
         r"device must be one this machine has, got "),
    # Lua pair rows times a dense B: as wide as their largest index + 1, refused as too narrow
    Case("sparse_mm-pair-rows-works", lambda: nnsparse.sparse_mm(
        _PAIRS7, torch.arange(12.0).view(4, 3)), None,
         check=lambda out: torch.equal(out, nnsparse.densify(_PAIRS7, size=(2, 4))
                                       @ torch.arange(12.0).view(4, 3))),
    Case("sparse_mm-pair-rows-past-B", lambda: nnsparse.sparse_mm(
        [torch.tensor([[3.0, 1.0]])], torch.ones(3, 2)), ValueError,
         r"A\[0\] indices must be in \[0, 3\), got max 3"),
    Case("register-RatingModel-itself", lambda: nnsparse.models.register(
        nnsparse.models.RatingModel), TypeError,
         r"register takes a RatingModel subclass, got RatingModel itself"),
    # load_state_dict flags: torch took strict="no" as true
    Case("SparseLinearBatch.load_state_dict-strict-str", lambda: nnsparse.SparseLinearBatch(
        4, 3).load_state_dict(nnsparse.SparseLinearBatch(4, 3).state_dict(), strict="no"),
         TypeError, r"strict must be a bool, got str 'no'"),
    Case("RatingModel.load_state_dict-assign-int", lambda: _fitted_autorec().load_state_dict(
        _fitted_autorec().state_dict(), assign=1), TypeError, r"assign must be a bool, got int 1"),
    Case("SparseWeightLinear.load_state_dict-strict-numpy-bool-works", lambda: (lambda w: (
        w.load_state_dict(w.state_dict(), strict=_NP.False_)))(
            nnsparse.SparseWeightLinear.random(4, 3, 0.5)), None,
         check=lambda out: not out.missing_keys and not out.unexpected_keys),
    # the generic fuzz: 2**64, -0.0, a (1, 1) tensor, a 0-d tensor where a size or data goes
    Case("DynamicSparseTensor-ndim-2**64", lambda: nnsparse.DynamicSparseTensor(ndim=2 ** 64),
         ValueError, r"ndim must be at most 64 \(one index buffer is kept per dimension\), got "
                     r"18446744073709551616"),
    Case("DynamicSparseTensor-ndim-64-works", lambda: nnsparse.DynamicSparseTensor(ndim=64).ndim,
         None, check=lambda ndim: ndim == 64),
    Case("SparseWeightLinear.random-in_features-2**64", lambda: (
        nnsparse.SparseWeightLinear.random(2 ** 64, 3, 0.5)), ValueError,
         r"in_features must be a positive int "
         r"within int64 \(below 2\*\*63\), got 18446744073709551616"),
    Case("synthetic_ratings-n_users-2**64", lambda: synthetic_ratings(n_users=2 ** 64),
         ValueError, r"n_users must be a positive int within int64 \(below 2\*\*63\)"),
    Case("synthetic_ratings-rank-2**64", lambda: synthetic_ratings(
        n_users=5, n_items=5, n_ratings=5, rank=2 ** 64), ValueError,
         r"rank must be a positive int within int64 \(below 2\*\*63\)"),
    Case("synthetic_ratings-noise-negative-zero-works", lambda: synthetic_ratings(
        n_users=5, n_items=5, n_ratings=5, noise=-0.0, user_sigma=-0.0, item_sigma=-0.0), None,
         check=lambda r: len(r) == 5),
    Case("SparseLinearBatch-in_features-1x1-tensor", lambda: nnsparse.SparseLinearBatch(
        torch.ones(1, 1, dtype=torch.long), 3), TypeError,
         r"in_features must be an int, got Tensor tensor\(\[\[1\]\]\)"),
    Case("SparseLinearBatch-in_features-0d-tensor-works", lambda: nnsparse.SparseLinearBatch(
        torch.tensor(4), 3).in_features, None, check=lambda n: n == 4 and type(n) is int),
    Case("distributed.loader-0d-tensor", lambda: nnsparse.distributed.loader(
        torch.tensor(1.0), 2), TypeError, r"dataset must be a map-style dataset .* got a 0-d tensor"),
    # an estimate of Lua pair rows took their largest index + 1 as its width
    Case("SparseCriterion-pair-rows-estimate-works", lambda: nnsparse.SparseCriterion(
        nn.MSELoss())(_EST7, _WIDE7), None, check=lambda loss: torch.allclose(
            loss, nnsparse.SparseCriterion(nn.MSELoss())(
                nnsparse.densify(_EST7, size=(2, 6)), _WIDE7))),
    # a CrossValidation built by hand: "argument of type 'int' is not iterable", KeyError
    Case("CrossValidation.mean-folds-of-ints", lambda: nnsparse.models.CrossValidation(
        [1, 2]).mean(), TypeError,
         r"CrossValidation.folds must be a list of dicts, got int at folds\[0\]"),
    Case("CrossValidation.mean-value-str", lambda: nnsparse.models.CrossValidation(
        [{"rmse": "x"}]).mean(), TypeError, r"folds\[0\]\['rmse'\] must be a number, got str 'x'"),
    Case("CrossValidation.mean-key-missing-in-a-fold", lambda: nnsparse.models.CrossValidation(
        [{"rmse": 1.0}, {"mae": 1.0}]).mean(), ValueError,
         r"folds\[1\] lacks 'rmse', which folds\[0\] holds"),
    Case("CrossValidation.table-fold-lacks-keys", lambda: nnsparse.models.CrossValidation(
        [{"fold": 1, "rmse": 1.0}]).table(), ValueError,
         r"table needs the keys \['fold', 'rmse', 'mae', .*\] in every fold \(cross_validate's\), "
         r"folds\[0\] lacks \['mae', "),
    Case("CrossValidation.mean-numpy-values-works", lambda: nnsparse.models.CrossValidation(
        [{"rmse": _NP.float32(1.0)}, {"rmse": 2.0}]).mean(), None,
         check=lambda m: type(m) is float and m == 1.5),
    Case("Trainer-batch_loss-scalar-works", lambda: _trainer_fit(_LossNet(
        lambda y: (y ** 2).mean())).best_epoch, None, check=lambda epoch: epoch == 1),
]



# -- the eighth probe ----------------------------------------------------------------------

def _inference(make):
    """``make()`` run under ``torch.inference_mode()``: an inference tensor."""
    with torch.inference_mode():
        return make()


def _output_and_grads(layer, call, x):
    """``call(layer, x)`` densified, and the gradients of its sum for ``layer``'s parameters."""
    out = call(layer, x)
    dense = nnsparse.densify(out) if out.layout != torch.strided else out
    dense.sum().backward()
    return [dense.detach()] + [q.grad.to_dense() for q in layer.parameters()]


def _trains_on_inference(make_layer, call, make_x, first_in_mode=False):
    """Whether an inference-mode copy of ``make_x()`` trains ``make_layer()`` as the
    ordinary tensor does (same output, same gradients).  ``first_in_mode``: the tensor
    is read once under ``torch.inference_mode()`` first (its structure attached there)."""
    import copy
    torch.manual_seed(0)
    layer = make_layer()
    twin = copy.deepcopy(layer)
    x = _inference(make_x)
    if first_in_mode:
        with torch.inference_mode():
            call(twin, x)
    ours, want = _output_and_grads(twin, call, x), _output_and_grads(layer, call, make_x())
    return all(torch.allclose(a, b) for a, b in zip(ours, want))


def _neg_bit(t):
    """``t``'s values in a tensor with the negative bit set, made by public API (the
    imaginary part of a conjugate view)."""
    out = torch.complex(torch.zeros_like(t), -t).conj().imag
    assert out.is_neg()
    return out


def _lazy_adam_refused_group():
    """LazyAdam.add_param_group of a sparse parameter: refused, the groups left as they were."""
    opt = LazyAdam([nn.Parameter(torch.zeros(2))])
    try:
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(2, 2).to_sparse_csr())]})
    except TypeError:
        return [len(g["params"]) for g in opt.param_groups]
    return "not refused"


def _lazy_adam_vs_adam(make):
    """The largest difference of three LazyAdam and torch.optim.Adam steps on ``make()``."""
    a, b = make(), make()
    ours, theirs = LazyAdam([a], lr=0.1), torch.optim.Adam([b], lr=0.1)
    for k in range(3):
        a.grad = torch.full_like(a, k + 1.0) * (1 + 2j)
        b.grad = a.grad.clone()
        ours.step()
        theirs.step()
    return float((a - b).detach().abs().max())


def _probe8_dir(files):
    """``files`` (name -> bytes) written to a fresh temporary directory; its path."""
    import os
    import tempfile
    path = tempfile.mkdtemp(prefix="probe8-", dir=_tmp_root())
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    return path


# a movies.dat whose first title holds the separator '::'
_MOVIES8 = b"10::A::B (1995)::Animation|Children's\n20::GoldenEye (1995)::Action\n"
_U_ITEM8 = (b"10|A|B (1995)|01-Jan-1995||http://x|"
            + b"|".join([b"0"] * 3 + [b"1"] * 3 + [b"0"] * 13)
            + b"\n20|Heat (1995)|01-Jan-1995||http://x|" + b"|".join([b"1"] + [b"0"] * 18) + b"\n")


def _probe8_titles():
    import os
    d = _probe8_dir({"ratings.dat": b"1::10::5::1\n2::20::3::1\n", "movies.dat": _MOVIES8})
    return read_ratings(os.path.join(d, "ratings.dat"), "ml-1m").titles


class _SparseGradNet(nn.Module):
    """An autoencoder for Trainer whose layers give sparse gradients (sparse_grad=True)."""

    def __init__(self, sparse_grad=True):
        super().__init__()
        self.enc = nnsparse.SparseLinearBatch(4, 3, sparse_grad=sparse_grad)
        self.dec = nnsparse.SparseOutputLinear(3, 4, sparse_grad=sparse_grad)

    def batch_loss(self, rows, x):
        return nnsparse.SparseCriterion(nn.MSELoss())(self.dec(torch.sigmoid(self.enc(x)), x), x)


def _trainer8(model, weight_decay=0.0):
    return nnsparse.models.Trainer(model, epochs=2, batch_size=1, lr=0.05, progress=False,
                                   log=None, weight_decay=weight_decay)


def _save_load(x):
    """``x`` through torch.save and torch.load(weights_only=True), torch's default."""
    import io
    buffer = io.BytesIO()
    torch.save(x, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _read_by_a_layer(x):
    """``x`` after a layer read it (its checked structure attached)."""
    nnsparse.SparseLinearBatch(4, 3)(x)
    return x


def _validations_of_two_reads():
    """How many times nnsparse validated a batch read twice by a layer (once: cached)."""
    from nnsparse import _index
    x, before = X.to_sparse_csr(), _index.COUNTS["validate"]
    layer = nnsparse.SparseLinearBatch(4, 3)
    layer(x)
    layer(x)
    return _index.COUNTS["validate"] - before


def _structure_outlives_its_tensor():
    """Whether the structure attached to a tensor stays once the tensor is gone."""
    import gc
    from nnsparse import _forms
    x = _read_by_a_layer(X.to_sparse_csr())
    slot = (id(x), _forms._ATTR)
    assert slot in _forms._STRUCTURES
    del x
    gc.collect()
    return slot in _forms._STRUCTURES


_H8 = torch.randn(2, 3)
_SOL8 = lambda layer, x: layer(_H8, x)  # noqa: E731
_PATTERN8 = nn.Linear(3, 4)  # sampled_linear's weight and bias, as a module for the helper

PROBE8 = [
    # an inference tensor (torch.inference_mode) as training data: torch's "Inference
    # tensors cannot be saved for backward" from the layers that save the input's indices
    Case("SparseLinearBatch-sparse_grad-inference-input-trains-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseLinearBatch(4, 3, sparse_grad=True),
                                      lambda m, x: m(x), lambda: X.to_sparse_csr()),
         None, check=lambda same: same is True),
    Case("SparseOutputLinear-inference-csr-pattern-trains-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseOutputLinear(3, 4), _SOL8,
                                      lambda: X.to_sparse_csr()), None,
         check=lambda same: same is True),
    Case("SparseOutputLinear-sparse_grad-inference-coo-pattern-trains-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseOutputLinear(3, 4, sparse_grad=True),
                                      _SOL8, lambda: X.to_sparse()), None,
         check=lambda same: same is True),
    Case("sampled_linear-inference-pattern-trains-works",
         lambda: _trains_on_inference(lambda: nn.Linear(3, 4), lambda m, x: nnsparse.sampled_linear(
             _H8, m.weight, m.bias, x), lambda: X.to_sparse_csr()), None,
         check=lambda same: same is True),
    Case("SparseWeightLinear-inference-input-trains-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseWeightLinear.random(4, 3, 0.5),
                                      lambda m, x: m(x), lambda: X.to_sparse()), None,
         check=lambda same: same is True),
    Case("SparseOutputLinear-pattern-read-in-inference-mode-then-trains-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseOutputLinear(3, 4), _SOL8,
                                      lambda: X.to_sparse_csr(), first_in_mode=True), None,
         check=lambda same: same is True),
    Case("SparseLinearBatch-sparse_grad-input-read-in-inference-mode-then-trains-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseLinearBatch(4, 3, sparse_grad=True),
                                      lambda m, x: m(x), lambda: X.to_sparse(), first_in_mode=True),
         None, check=lambda same: same is True),
    Case("sparse_parts-of-inference-batch-trains-SparseLinearBatch-works",
         lambda: _trains_on_inference(lambda: nnsparse.SparseLinearBatch(4, 3),
                                      lambda m, x: m(nnsparse.sparse_parts(x)),
                                      lambda: X.to_sparse_csr()), None,
         check=lambda same: same is True),
    Case("SparseLinearBatch-inference-input-trains-works",  # the default path worked: kept
         lambda: _trains_on_inference(lambda: nnsparse.SparseLinearBatch(4, 3),
                                      lambda m, x: m(x), lambda: X.to_sparse_csr()),
         None, check=lambda same: same is True),
    Case("SparseOutputLinear-ordinary-pattern-output-shares-its-indices-works",
         lambda: (lambda out: out.col_indices().data_ptr() == S.col_indices().data_ptr())(
             nnsparse.SparseOutputLinear(3, 4)(_H8, S)), None, check=lambda shared: shared is True),
    # Batchifier over inference data: torch's "Cannot set version_counter for inference tensor"
    Case("Batchifier-inference-csr-data-works", lambda: nnsparse.Batchifier(
        nnsparse.Densify(4), 4, batch_size=1, progress=False)(_inference(X.to_sparse_csr)),
         None, check=lambda out: torch.equal(out, X)),
    Case("Batchifier-inference-coo-data-works", lambda: nnsparse.Batchifier(
        nnsparse.Densify(4), 4, batch_size=1, progress=False)(_inference(X.to_sparse)),
         None, check=lambda out: torch.equal(out, X)),
    Case("Batchifier-inference-data-inside-inference-mode-works", lambda: _inference(
        lambda: nnsparse.Batchifier(nnsparse.Densify(4), 4, batch_size=1, progress=False)(
            X.to_sparse_csr())), None, check=lambda out: torch.equal(out, X)),
    # Ratings.from_triples: numpy dropped complex ratings' imaginary parts (a warning only);
    # a tensor with the negative or conjugate bit failed in .numpy()
    Case("Ratings.from_triples-complex-rating-tensor", lambda: Ratings.from_triples(
        [1, 2], [1, 2], torch.tensor([1 + 2j, 2])), TypeError,
         r"rating must be a sequence of real numbers, got a torch.complex64 tensor"),
    Case("Ratings.from_triples-complex-rating-numpy", lambda: Ratings.from_triples(
        [1, 2], [1, 2], _NP.array([1 + 2j, 2])), TypeError,
         r"rating must be a sequence of real numbers, got complex values \(numpy complex128\)"),
    Case("Ratings.from_triples-complex-rating-list", lambda: Ratings.from_triples(
        [1, 2], [1, 2], [1 + 2j, 2.0]), TypeError,
         r"rating must be a sequence of real numbers, got complex values"),
    Case("Ratings.from_triples-neg-bit-rating-works", lambda: Ratings.from_triples(
        [1, 2], [1, 2], _neg_bit(torch.tensor([3.0, 4.0]))).rating, None,
         check=lambda rating: rating.tolist() == [3.0, 4.0]),
    Case("Ratings.from_triples-neg-bit-ids-works", lambda: Ratings.from_triples(
        _neg_bit(torch.tensor([1.0, 2.0])), [1, 2], [3.0, 4.0]).user_ids(), None,
         check=lambda ids: ids == [1.0, 2.0]),
    Case("Ratings.from_triples-float64-numpy-rating-works", lambda: Ratings.from_triples(
        [1, 2], [1, 2], _NP.array([3.0, 4.0])).rating, None,
         check=lambda rating: rating.tolist() == [3.0, 4.0] and rating.dtype == torch.float32),
    # item files whose title holds the separator: ml-1m took the title's second half as
    # the genres (a genre "B (1995)"), and cut the title; ml-100k refused the flags
    Case("read_item_features-ml-1m-title-holding-separator-works", lambda: (
        nnsparse.data.read_item_features(_probe7_file("movies.dat", _MOVIES8), "ml-1m",
                                         {10: 0, 20: 1})), None,
         check=lambda f: f.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 0.0]]),
    Case("read_ratings-ml-1m-title-holding-separator-works", _probe8_titles, None,
         check=lambda titles: titles == ["A::B (1995)", "GoldenEye (1995)"]),
    Case("read_item_features-ml-100k-title-holding-bar-works", lambda: (
        nnsparse.data.read_item_features(_probe7_file("u.item", _U_ITEM8), "ml-100k",
                                         {10: 0, 20: 1})), None,
         check=lambda f: f.shape == (2, 19) and f[0, 3:6].tolist() == [1.0] * 3
         and f[0].sum() == 3 and f[1, 0] == 1 and f[1].sum() == 1),
    # Trainer of a model with sparse_grad=True layers: torch's "Adam does not support
    # sparse gradients" at the first step (its optimiser was AdamW for every parameter)
    Case("Trainer-model-with-sparse_grad-layers-works", lambda: (lambda t: (
        t.fit(S).history, t.make_optimizer()))(_trainer8(_SparseGradNet(), 0.01)), None,
         check=lambda out: len(out[0]) == 2 and all(math.isfinite(h["train_loss"]) for h in out[0])
         and type(out[1]).__name__ == "SplitOptimizer"
         and sorted(type(o).__name__ for o in out[1].optimizers.values()) == ["LazyAdam"]),
    Case("Trainer-model-without-sparse-gradients-keeps-AdamW-works", lambda: _trainer8(
        _SparseGradNet(sparse_grad=False)).make_optimizer(), None,
         check=lambda opt: type(opt) is torch.optim.AdamW),
    # torch.save of a batch nnsparse had read (or made) wrote nnsparse's cached structure
    # into the file: torch.load's default (weights_only=True) refused it
    Case("torch.load-weights_only-of-a-csr-batch-a-layer-read-works", lambda: _save_load(
        _read_by_a_layer(X.to_sparse_csr())), None, check=lambda x: torch.equal(x.to_dense(), X)),
    Case("torch.load-weights_only-of-a-coo-batch-a-layer-read-works", lambda: _save_load(
        _read_by_a_layer(X.to_sparse())), None, check=lambda x: torch.equal(x.to_dense(), X)),
    Case("torch.load-weights_only-of-sparsify-output-works", lambda: _save_load(
        nnsparse.sparsify(X, layout=torch.sparse_csr)), None,
         check=lambda x: torch.equal(x.to_dense(), X)),
    Case("torch.load-weights_only-of-rating_matrix-works", lambda: (lambda m: (
        m, _save_load(m)))(rating_matrix(_R)), None,
         check=lambda pair: torch.equal(pair[0].to_dense(), pair[1].to_dense())),
    Case("SparseLinearBatch-validates-a-batch-read-twice-once-works", _validations_of_two_reads,
         None, check=lambda n: n == 1),
    Case("attached-structure-goes-with-its-tensor-works", _structure_outlives_its_tensor, None,
         check=lambda stays: stays is False),
    # rmse / mae of float16: the square (or the difference) overflowed to inf
    Case("rmse-float16-error-300-works", lambda: rmse(
        torch.full((3,), 300.0, dtype=torch.float16), torch.zeros(3, dtype=torch.float16)),
         None, check=lambda out: out.dtype == torch.float16 and out.item() == 300.0),
    Case("mae-float16-difference-beyond-float16-works", lambda: mae(
        torch.tensor([40000.0, 0.0], dtype=torch.float16),
        torch.tensor([-40000.0, 0.0], dtype=torch.float16)),
         None, check=lambda out: out.dtype == torch.float16 and out.item() == 40000.0),
    Case("rmse-float64-stays-float64-works", lambda: rmse(
        torch.tensor([1.0, 2.0], dtype=torch.float64), torch.zeros(2, dtype=torch.float64)),
         None, check=lambda out: out.dtype == torch.float64
         and abs(out.item() - 2.5 ** 0.5) < 1e-12),
    Case("RatingErrors-float16-error-300-works", lambda: (lambda e: (e.update(
        torch.full((3,), 300.0, dtype=torch.float16), torch.zeros(3, dtype=torch.float16)),
        e.compute()))(nnsparse.data.RatingErrors())[1], None,
         check=lambda out: out["rmse"] == 300.0 and out["mae"] == 300.0),
    # LazyAdam of a sparse parameter: its first step failed on the strides
    Case("LazyAdam-sparse-coo-parameter", lambda: LazyAdam(
        [nn.Parameter(torch.zeros(3).to_sparse())]), TypeError,
         r"params must be dense \(strided\) tensors, got layout torch.sparse_coo at position 0; "
         r"LazyAdam takes sparse gradients of dense parameters"),
    Case("LazyAdam.add_param_group-sparse-csr-parameter-keeps-the-groups",
         _lazy_adam_refused_group, None, check=lambda sizes: sizes == [1]),
    Case("LazyAdam-complex-parameter-matches-Adam-works", lambda: _lazy_adam_vs_adam(
        lambda: nn.Parameter(torch.ones(3, dtype=torch.complex64))), None,
         check=lambda diff: diff < 1e-6),
    # a lone sparse tensor as params: torch's "Unimplemented backend SparseCsrCPU" (its
    # message's torch.typename fails); a dense one had torch's own message
    Case("LazyAdam-params-sparse-csr-tensor-not-a-list", lambda: LazyAdam(S), TypeError,
         r"params must be an iterable of parameters or of param-group dicts, got a tensor "
         r"\(torch.sparse_csr, shape \(2, 4\)\); pass \[tensor\]"),
    Case("LazyAdam-params-dense-tensor-not-a-list", lambda: LazyAdam(nn.Parameter(X)), TypeError,
         r"params must be an iterable of parameters or of param-group dicts, got a tensor "
         r"\(torch.strided, shape \(2, 4\)\)"),
    # rating_matrix of sparse values: "values must be a dense tensor, got Tensor"
    Case("rating_matrix-values-sparse-says-the-layout", lambda: rating_matrix(
        _R, values=_R.rating.to_sparse()), TypeError,
         r"values must be a dense tensor, got layout torch.sparse_coo"),
    # collate_sparse_rows refused a numpy int width ("width must be an int, got int64")
    Case("collate_sparse_rows-width-numpy-int-works", lambda: collate_sparse_rows(
        [(0, (torch.tensor([0, 3]), torch.ones(2)))], _NP.int64(4))[1].shape, None,
         check=lambda shape: shape == (1, 4)),
    Case("collate_sparse_rows-width-0d-tensor-works", lambda: collate_sparse_rows(
        [(0, (torch.tensor([0, 3]), torch.ones(2)))], torch.tensor(4))[1].shape, None,
         check=lambda shape: shape == (1, 4)),
    Case("collate_sparse_rows-width-float-still-refused", lambda: collate_sparse_rows(
        [(0, (torch.tensor([0, 3]), torch.ones(2)))], 4.0), TypeError,
         r"width must be an int, got float 4.0"),
]

CASES = (_sparse_cases() + _good_cases() + OTHER + PROBE2 + PROBE3 + META + PROBE4 + PROBE5
         + OPTIM_FROZEN + PROBE6 + PROBE7 + PROBE8)


def run_case(case: Case) -> str:
    """'ok', or what went wrong: 'silent' (no error where one was due), 'wrong', 'unclear'."""
    try:
        out = case.call()
    except Exception as e:  # noqa: BLE001 - the suite judges every exception
        if case.error is None:
            return f"unclear: {type(e).__name__}: {e}"
        if not isinstance(e, case.error) or not re.search(case.match, str(e)):
            return f"unclear: {type(e).__name__}: {e}"
        return "ok"
    if case.error is not None:
        return f"silent: returned {type(out).__name__}"
    return "ok" if case.check(out) else "wrong: a result that differs from the dense reference"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case):
    assert run_case(case) == "ok"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="mixed devices need a CUDA device")
@pytest.mark.parametrize("entry", ["SparseLinearBatch", "SparseOutputLinear", "SparseCriterion"])
def test_mixed_devices(entry):
    x = X.to_sparse_csr().cuda()
    calls = {
        "SparseLinearBatch": lambda: nnsparse.SparseLinearBatch(4, 3)(x),
        "SparseOutputLinear": lambda: nnsparse.SparseOutputLinear(3, 4)(torch.ones(2, 3), x),
        "SparseCriterion": lambda: nnsparse.SparseCriterion(nn.MSELoss())(torch.ones(2, 4), x),
    }
    with pytest.raises(ValueError, match=r"(device|cuda)"):
        calls[entry]()


if __name__ == "__main__":  # the tally for reports
    results = [(c, run_case(c)) for c in CASES]
    bad = [c for c in CASES if c.error is not None]
    clear = sum(1 for c, r in results if c.error is not None and r == "ok")
    print(f"{len(CASES)} cases: {len(bad)} bad inputs, {len(CASES) - len(bad)} that must work")
    print(f"bad inputs answered by a clear error: {clear}/{len(bad)} "
          f"({100.0 * clear / len(bad):.1f} %)")
    for kind in ("silent", "wrong", "unclear"):
        found = [c.id for c, r in results if r.startswith(kind)]
        print(f"{kind}: {len(found)} {found}")
    sys.exit(0 if all(r == "ok" for _, r in results) else 1)
