"""The sixteenth probe (docs/bad_inputs_probe16.md): silent wrong results, every public entry
point that computes numbers compared with a dense torch reference.

One defect: a COO tensor marked coalesced (``torch.sparse_coo_tensor(..., is_coalesced=True)``
or ``x._coalesced_(True)``) whose indices are not sorted and unique, which torch takes
unchecked, was read as row-sorted and duplicate-free: the layers, criteria, ``sparse_mm``,
``stopk``, ``to_pairs`` and the rest returned wrong numbers without an error.  Its first
check now refuses it, as an invalid CSR tensor is refused.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result against the dense reference).  The rows marked
"was:" returned a wrong result (or, for ``densify``, a right one by another route) before.
"""
import pickle
from collections import Counter
from typing import Any, Callable

import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import (Batchifier, SDAESparseCriterion, SparseCriterion, SparseLinearBatch,
                      SparseOutputLinear, SparseWeightLinear, densify, sparse_mm, stopk,
                      to_pairs)
from nnsparse._forms import _counts, _reset_counts, _structure
from nnsparse.data import SparseRowBatch, SparseRowDataset
from nnsparse.data.dataset import _build, _parts
from probe_cases import Case, run_case

W = 3


def _marked(index: Any, values: Any, size: Any) -> torch.Tensor:
    """A COO tensor marked coalesced on the caller's word (torch does not check it)."""
    return torch.sparse_coo_tensor(torch.tensor(index), torch.tensor(values), size,
                                   is_coalesced=True)


# rows out of order, a repeated entry, and a column out of order within a row
UNSORTED = lambda: _marked([[1, 0, 1, 0], [2, 1, 0, 0]], [1., 2., 3., 4.], (2, W))  # noqa: E731
REPEATED = lambda: _marked([[0, 0, 1], [1, 1, 2]], [1., 2., 3.], (2, W))  # noqa: E731
COLUMNS = lambda: _marked([[0, 0, 1], [2, 1, 2]], [1., 2., 3.], (2, W))  # noqa: E731
VECTOR = lambda: _marked([[3, 1]], [1., 2.], (5,))  # noqa: E731
BATCH3D = lambda: _marked([[1, 0], [0, 0], [0, 1]], [1., 2.], (2, 2, 2))  # noqa: E731

# the dense reference of each, which torch's to_dense gives (duplicates summed)
REF = {"unsorted": UNSORTED().to_dense(), "repeated": REPEATED().to_dense(),
       "columns": COLUMNS().to_dense()}
MARKED = {"unsorted": UNSORTED, "repeated": REPEATED, "columns": COLUMNS}
BAD = (r"is marked coalesced \(is_coalesced\(\) is True\), so its indices must be sorted and "
       r"unique \(torch's COO invariant, unchecked unless check_invariants=True\), got \d+ entr(y|ies) out "
       r"of order or repeated; build it without is_coalesced=True, then \.coalesce\(\) "
       r"\(which returns a tensor marked coalesced as it is\)$")


def _seeded(make: Callable[[], Any]) -> Any:
    torch.manual_seed(0)
    return make()


def _calls(x: Callable[[], torch.Tensor]) -> Any:
    """(id, call, argument name) for each entry point, ``x`` the marked tensor."""
    return [
        # was: SparseLinearBatch gave F.linear of another matrix (rows read as sorted)
        ("SparseLinearBatch", lambda: _seeded(lambda: SparseLinearBatch(W, 2))(x()), "input"),
        ("sparse_linear", lambda: nnsparse.sparse_linear(x(), torch.ones(2, W)), "input"),
        # was: the loss over the wrong entries (7.5 for the reference 12 on UNSORTED)
        ("SparseCriterion", lambda: SparseCriterion(nn.MSELoss())(torch.zeros(2, W), x()),
         "target"),
        ("SparseOutputLinear", lambda: _seeded(lambda: SparseOutputLinear(2, W))(
            torch.ones(2, 2), x()), "pattern"),
        ("SDAESparseCriterion.prepare_input",
         lambda: SDAESparseCriterion(nn.MSELoss()).prepare_input(x()), "input"),
        # was: rows mixed ((0, 2, 1.) read as row 0's)
        ("stopk", lambda: stopk(x(), 2), "x"),
        ("to_pairs", lambda: to_pairs(x()), "x"),
        ("sparse_mm", lambda: sparse_mm(x(), torch.eye(W)), "A"),
        ("sparse_mm right", lambda: sparse_mm(torch.eye(2), x()), "B"),
        ("SparseWeightLinear pattern", lambda: SparseWeightLinear(x()), "pattern"),
        ("SparseWeightLinear input",
         lambda: SparseWeightLinear(torch.ones(2, W).to_sparse())(x()), "input"),
        ("Batchifier.topk exclude", lambda: Batchifier(nn.Identity(), W, progress=False).topk(
            torch.ones(2, W).to_sparse(), 1, exclude=x()), "exclude"),
        ("values_map", lambda: nnsparse.values_map(torch.exp, x()), "input"),
        ("sparse_parts", lambda: nnsparse.sparse_parts(x()), "x"),
        # (densify was right before, by torch's to_dense; refused now with the rest: one
        # check per tensor, its structure then shared by every call)
        ("densify", lambda: densify(x()), "x"),
    ]


MARKED_CASES = [
    Case(f"{kind} {name}", call, ValueError, rf"^{arg} " + BAD)
    for kind, x in MARKED.items() for name, call, arg in _calls(x)
] + [
    Case("vector stopk", lambda: stopk(VECTOR(), 1), ValueError, r"^x " + BAD),
    Case("vector in a list", lambda: SparseLinearBatch(5, 2)(
        [VECTOR(), torch.zeros(5).to_sparse()]), ValueError, r"^input\[0\] " + BAD),
    # was: the batched product on the wrong row pointers
    Case("batched sparse_mm", lambda: sparse_mm(BATCH3D(), torch.ones(2, 2, 2)), ValueError,
         r"^A " + BAD),
]


@pytest.mark.parametrize("case", MARKED_CASES, ids=lambda c: c.id)
def test_probe16_marked_coalesced(case: Case) -> None:
    run_case(case)


def _linear_ok(x: torch.Tensor, ref: torch.Tensor) -> Callable[[Any], bool]:
    layer = _seeded(lambda: SparseLinearBatch(ref.shape[-1], 2))
    want = nn.functional.linear(ref, layer.weight, layer.bias)
    return lambda _: torch.allclose(layer(x), want)


_VALID = _marked([[0, 0, 1], [0, 2, 1]], [1., 2., 3.], (2, W))  # truly coalesced
_VALID_REF = torch.tensor([[1., 0., 2.], [0., 3., 0.]])
_ONE = _marked([[1], [2]], [5.], (2, W))
_EMPTY = torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), (2, W),
                                 is_coalesced=True)

KEPT_CASES = [
    # a claim that holds is taken, as before
    Case("kept: truly coalesced, layer", lambda: _VALID, None,
         check=_linear_ok(_VALID, _VALID_REF)),
    Case("kept: truly coalesced, criterion",
         lambda: SparseCriterion(nn.MSELoss())(torch.zeros(2, W), _VALID), None,
         check=lambda out: torch.allclose(out, torch.tensor(14. / 3))),
    Case("kept: truly coalesced, stopk", lambda: stopk(_VALID, 1), None,
         check=lambda out: out.indices.tolist() == [[2], [1]]),
    Case("kept: one entry", lambda: densify(_ONE), None,
         check=lambda out: out[1, 2] == 5 and out.sum() == 5),
    Case("kept: no entry", lambda: densify(_EMPTY), None,
         check=lambda out: torch.equal(out, torch.zeros(2, W))),
    # a tensor not marked coalesced may hold anything (duplicates sum)
    Case("kept: unmarked duplicates", lambda: densify(torch.sparse_coo_tensor(
        torch.tensor([[0, 0], [1, 1]]), torch.tensor([1., 2.]), (2, W))), None,
         check=lambda out: out[0, 1] == 3),
    # trust() still skips every check, as documented (an invalid trusted tensor gives wrong
    # results): the marked tensor is taken
    Case("kept: trust skips the check", lambda: nnsparse.trust(UNSORTED()), None,
         check=lambda out: out.is_coalesced()),
]


@pytest.mark.parametrize("case", KEPT_CASES, ids=lambda c: c.id)
def test_probe16_kept(case: Case) -> None:
    run_case(case)


@pytest.mark.parametrize("kind", sorted(MARKED))
def test_probe16_rebuilt_matches_reference(kind: str) -> None:
    """The message's way out: the same entries rebuilt unmarked and coalesced give the dense
    reference (torch's to_dense of the marked tensor, which sums its duplicates)."""
    bad = MARKED[kind]()
    fixed = torch.sparse_coo_tensor(bad._indices(), bad._values(), bad.shape).coalesce()
    assert torch.equal(densify(fixed), REF[kind])
    layer = _seeded(lambda: SparseLinearBatch(W, 2))
    assert torch.allclose(layer(fixed), nn.functional.linear(REF[kind], layer.weight,
                                                             layer.bias))


# -- second reading (probe16-r) ---------------------------------------------------------------

def _bmm_ok(a: torch.Tensor) -> Callable[[Any], bool]:
    dense = a.to_dense()
    b = torch.arange(float(dense.shape[0] * dense.shape[2] * 2)).reshape(dense.shape[0], -1, 2)
    return lambda _: torch.allclose(sparse_mm(a, b), torch.bmm(dense, b))


# 3-D: the order is lexicographic over (batch, row, column); each row breaks it at one place
ORDER_3D = [
    ("batch out of order", [[1, 0], [0, 1], [0, 1]], 1),
    ("row out of order in a matrix", [[0, 0, 1], [1, 0, 0], [0, 1, 0]], 1),
    ("column out of order in a row", [[0, 0, 0], [1, 1, 1], [2, 0, 1]], 1),
    ("repeated entry", [[1, 1], [0, 0], [1, 1]], 1),
    ("reversed", [[1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 1, 0]], 3),
]
ORDER_CASES = [
    Case(f"3-D {what}", lambda index=index: sparse_mm(
        _marked(index, [1.] * len(index[0]), (2, 2, 3)), torch.ones(2, 3, 2)), ValueError,
        rf"^A " + BAD.replace(r"got \d+ entr(y|ies)",
                              f"got {bad} entr{'y' if bad == 1 else 'ies'}"))
    for what, index, bad in ORDER_3D
] + [
    # later dimensions may decrease where an earlier one increases
    Case("kept: 3-D, rows and columns fall where the batch index rises",
         lambda: 0, None, check=_bmm_ok(_marked([[0, 0, 1, 1], [1, 1, 0, 0], [0, 2, 1, 2]],
                                                 [1., 2., 3., 4.], (2, 2, 3)))),
    Case("kept: 3-D one entry", lambda: 0, None,
         check=_bmm_ok(_marked([[1], [1], [2]], [5.], (2, 2, 3)))),
    # sizes near torch's int64 numel limit: compared dimension by dimension, no linear index
    Case("(3, 2**61): rows out of order", lambda: to_pairs(_marked(
        [[1, 0], [0, 2**61 - 1]], [1., 2.], (3, 2**61))), ValueError, r"^x " + BAD),
    Case("(2**31, 2**31): a repeated entry", lambda: to_pairs(_marked(
        [[2**31 - 1, 2**31 - 1], [2**31 - 1, 2**31 - 1]], [1., 2.], (2**31, 2**31))),
        ValueError, r"^x " + BAD.replace(r"got \d+ entr(y|ies)", "got 1 entry")),
    Case("kept: (3, 2**61) sorted", lambda: stopk(_marked(
        [[0, 1, 2], [2**61 - 1, 0, 2**61 - 2]], [1., 2., 3.], (3, 2**61)), 1), None,
        check=lambda out: out.indices.tolist() == [[2**61 - 1], [0], [2**61 - 2]]),
    Case("kept: (2**31, 2**31) sorted", lambda: nnsparse.values_map(torch.neg, _marked(
        [[0, 2**31 - 1], [2**31 - 1, 0]], [1., 2.], (2**31, 2**31))), None,
        check=lambda out: out._values().tolist() == [-1., -2.]),
]


@pytest.mark.parametrize("case", ORDER_CASES, ids=lambda c: c.id)
def test_probe16r_order(case: Case) -> None:
    run_case(case)


def _ops_of_check(x: torch.Tensor, check: bool) -> "Counter[str]":
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: "Counter[str]" = Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            if isinstance(out, torch.Tensor):  # (not the metadata queries: is_coalesced...)
                self.ops[str(func.overloadpacket)] += 1
            return out

    with _Ops() as mode:
        _structure(x.clone(), "x", check)
    return mode.ops


def test_probe16r_unmarked_pays_nothing_new() -> None:
    """The first check of a COO tensor not marked coalesced runs the range check only (its
    min, max and their one read-back): no order check, no placeholder for it."""
    x = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1], [2, 1, 0]]), torch.ones(3), (2, W))
    extra = _ops_of_check(x, True) - _ops_of_check(x, False)
    assert set(extra) == {"aten.amin", "aten.amax", "aten.cat"}, extra


UNMARKED_OR_TRUSTED = [
    ("unmarked 2-D", lambda: densify(torch.sparse_coo_tensor(
        torch.tensor([[1, 0], [0, 2]]), torch.ones(2), (2, W)))),
    ("unmarked 1-D", lambda: densify(torch.sparse_coo_tensor(
        torch.tensor([[2, 0]]), torch.ones(2), (W,)))),
    # coalesced by nnsparse for autograd: torch made it so, nothing to verify
    ("unmarked 3-D requiring grad", lambda: sparse_mm(torch.sparse_coo_tensor(
        torch.tensor([[1, 0], [0, 1], [2, 0]]), torch.ones(2), (2, 2, W)).requires_grad_(),
        torch.ones(2, W, 2))),
    ("unmarked 2-D requiring grad", lambda: densify(torch.sparse_coo_tensor(
        torch.tensor([[1, 0], [0, 2]]), torch.ones(2), (2, W)).requires_grad_())),
    ("trusted", lambda: densify(nnsparse.trust(_VALID.clone()))),
    ("sparsify", lambda: densify(nnsparse.sparsify(torch.eye(W)))),
    ("layer output", lambda: densify(SparseOutputLinear(2, W)(torch.ones(2, 2), _VALID))),
]


@pytest.mark.parametrize("name,call", UNMARKED_OR_TRUSTED, ids=[n for n, _ in
                                                                 UNMARKED_OR_TRUSTED])
def test_probe16r_order_checked_only_where_claimed(name: str, call: Callable[[], Any]) -> None:
    call()  # (builds what it needs first: the count is of the call below)
    _reset_counts()
    call()
    assert _counts().get("order", 0) == 0


def test_probe16r_order_checked_once_where_claimed() -> None:
    x = _VALID.clone()
    _reset_counts()
    densify(x), stopk(x, 1), to_pairs(x)
    assert _counts().get("order", 0) == 1


def test_probe16r_pickled_batch_keeps_its_claim() -> None:
    """A SparseRowBatch whose COO input nnsparse checked while not coalesced came back
    from pickle (a DataLoader worker's trip) marked coalesced and trusted: its rows were
    read as sorted (to_pairs gave row 1's entry to row 0)."""
    x = torch.sparse_coo_tensor(torch.tensor([[1, 0, 1, 0], [2, 1, 0, 0]]),
                                torch.tensor([1., 2., 3., 4.]), (2, W))
    densify(x)  # checked: its structure attached
    back = pickle.loads(pickle.dumps(SparseRowBatch(x, None, torch.arange(2)))).input
    assert not back.is_coalesced()
    want = [[[0., 4.], [1., 2.]], [[0., 3.], [2., 1.]]]
    assert [p.tolist() for p in to_pairs(back)] == want
    assert torch.equal(densify(back), x.to_dense())
    # a collated (coalesced) batch keeps its mark, and a pickle of an older version (no
    # claim in its parts) reads as before
    ds = SparseRowDataset(x.coalesce(), layout=torch.sparse_coo)
    batch = ds.collate([ds[0], ds[1]])
    assert pickle.loads(pickle.dumps(batch)).input.is_coalesced()
    old = _parts(batch.input)
    assert old is not None and _build(old[:4]).is_coalesced()
