"""An empty list of rows ``[]`` holds no width, dtype nor device.

Where the call knows the width (a layer's in_features, a criterion's estimate or sparse
target) ``[]`` is that empty batch.  Where it cannot (no size argument, nothing beside it
that has a width) the refusal offers a way round that the function takes: an empty sparse
tensor of the width, or the function's own size argument.  The refusals used to say "pass a
size to give its width" to functions that take no size (MaskCriterion.prepare_input,
ssort, values_map, ...).
"""
import re

import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import (MaskCriterion, SDAESparseCriterion, SparseCriterion, SparseWeightLinear,
                      ValuesMap, densify, from_pairs, sparse_parts, ssort, ssort_by_index, stopk,
                      to_pairs, values_map)


def _empty(n=3, dtype=torch.float32):
    """The way round the messages give: an empty sparse tensor of the width ``n``."""
    return torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0, dtype=dtype),
                                   (0, n))


_TENSOR_WAY = ("which has no width; pass instead an empty sparse tensor of the width n: "
               "torch.sparse_coo_tensor(torch.zeros(2, 0, dtype=torch.long), torch.zeros(0), "
               "(0, n))")

# (id, call with x, the argument's name in the message, way round given in the message)
NO_SIZE = [
    ("ssort", lambda x: ssort(x), "x"),
    ("ssort_by_index", lambda x: ssort_by_index(x), "x"),
    ("stopk", lambda x: stopk(x, 1), "x"),
    ("to_pairs", lambda x: to_pairs(x), "x"),
    ("values_map", lambda x: values_map(torch.exp, x), "input"),
    ("ValuesMap", lambda x: ValuesMap(torch.exp)(x), "input"),
    ("sparse_parts", lambda x: sparse_parts(x), "x"),
    ("MaskCriterion.prepare_input", lambda x: MaskCriterion(nn.MSELoss()).prepare_input(x),
     "input"),
    ("SDAESparseCriterion.prepare_input",
     lambda x: SDAESparseCriterion(nn.MSELoss(), hide_ratio=0.5).prepare_input(x), "input"),
    ("SparseWeightLinear", lambda x: SparseWeightLinear(x), "pattern"),
    ("SparseCriterion, both []", lambda x: SparseCriterion(nn.MSELoss())(x, x), "estimate"),
    ("SDAESparseCriterion, both []",
     lambda x: SDAESparseCriterion(nn.MSELoss())(x, x, mask=torch.zeros(0, 3, dtype=torch.bool)),
     "estimate"),
]


@pytest.mark.parametrize("call, name", [c[1:] for c in NO_SIZE], ids=[c[0] for c in NO_SIZE])
def test_no_size_refusal_offers_a_tensor(call, name):
    message = f"{name} is an empty list of rows, {_TENSOR_WAY}"
    with pytest.raises(ValueError, match=re.escape(message)):
        call([])
    call(_empty())  # the way round the message gives is taken


# functions with a size argument name it (from_pairs takes pair tensors only: no sparse tensor)
WITH_SIZE = [
    ("densify", lambda: densify([]),
     "x is an empty list of rows, which has no width; pass size=(0, n), or an empty sparse "
     "tensor of the width n: torch.sparse_coo_tensor(", lambda: densify([], size=(0, 3))),
    ("from_pairs", lambda: from_pairs([]),
     "pairs is an empty list of rows, which has no width; pass size=n to give it one",
     lambda: from_pairs([], size=3)),
]


@pytest.mark.parametrize("call, message, way", [c[1:] for c in WITH_SIZE],
                         ids=[c[0] for c in WITH_SIZE])
def test_size_refusal_names_the_size(call, message, way):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()
    assert way().shape == (0, 3)


def test_no_message_asks_for_a_size_where_none_is():
    """No refusal left says "pass a size" (the wording that named no argument)."""
    for _, call, _ in NO_SIZE:
        with pytest.raises(ValueError) as info:
            call([])
        assert "pass a size" not in str(info.value)


# where the width is known, [] is the empty batch of that width
@pytest.mark.parametrize("crit", [
    lambda: SparseCriterion(nn.MSELoss()),
    lambda: SDAESparseCriterion(nn.MSELoss()),
], ids=["SparseCriterion", "SDAESparseCriterion"])
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_empty_estimate_takes_the_sparse_targets_width(crit, layout):
    target = _empty(4, torch.float64)
    target = target.to_sparse_csr() if layout == "csr" else target
    kw = {"mask": torch.zeros(0, 4, dtype=torch.bool)} if "SDAE" in repr(crit()) else {}
    got = crit()([], target, **kw)
    want = crit()(_empty(4), target, **kw)  # the dense reference: the tensor of no rows
    torch.testing.assert_close(got, want)
    assert got.shape == ()


def test_empty_estimate_refuses_a_target_with_rows():
    target = torch.eye(2, 4).to_sparse()
    with pytest.raises(ValueError, match="target has 2 rows"):
        SparseCriterion(nn.MSELoss())([], target)


def test_sparse_mm_keeps_its_own_wording():
    with pytest.raises(ValueError, match=re.escape(
            "A is an empty list of sparse rows, which has no width; pass a torch sparse tensor "
            "of shape (0, m)")):
        nnsparse.sparse_mm([], torch.ones(3, 2))
