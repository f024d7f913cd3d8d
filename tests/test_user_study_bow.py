"""The bag-of-words and one-hot user study (docs/user_study_bow.md).

A text classifier and a CTR-like model meet nnsparse the PyTorch way: ``SparseLinearBatch``
against ``nn.EmbeddingBag(mode="sum")`` with ``per_sample_weights`` (same weights, same
batches: losses and gradients agree, dense and sparse gradients), the labels beside
``SparseRowDataset`` through ``batch.row_index``, and the refusals that did not say what
to do: a dense ``target`` (labels) was told to go through ``sparsify``, which drops every
label 0, a ``(crow, col, values)`` triple was refused as a list of pair rows, a loader's whole
``SparseRowBatch`` and EmbeddingBag's ``(bags, k)`` index input were refused without the
way round.
"""
import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import nnsparse
from nnsparse.data import SparseRowDataset

from probe_cases import Case, run_case


def _bow(rows=12, vocab=40, seed=0, dtype=torch.float64):
    """A small bag-of-words CSR batch (TF-IDF-like positive values), an empty row included,
    and one label per row."""
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(rows, vocab, generator=g, dtype=dtype)
    dense = dense * (torch.rand(rows, vocab, generator=g) < 0.15)
    dense[3] = 0
    labels = torch.randint(0, 4, (rows,), generator=g)
    return dense.to_sparse_csr(), labels


def _parts(x):
    return x.crow_indices(), x.col_indices(), x.values()


def _grad(p):
    return p.grad.to_dense() if p.grad.is_sparse else p.grad


@pytest.mark.parametrize("sparse_grad", [False, True], ids=["dense-grad", "sparse-grad"])
@pytest.mark.parametrize("task", ["text", "ctr"])
def test_embedding_bag_peer(task, sparse_grad):
    x, labels = _bow()
    vocab, hidden = x.shape[1], 8
    torch.manual_seed(0)
    enc = nnsparse.SparseLinearBatch(vocab, hidden, sparse_grad=sparse_grad).double()
    head = nn.Linear(hidden, 4 if task == "text" else 1).double()
    bag = nn.EmbeddingBag(vocab, hidden, mode="sum", sparse=sparse_grad).double()
    bias = nn.Parameter(enc.bias.detach().clone())
    with torch.no_grad():
        bag.weight.copy_(enc.weight.t())
    head2 = nn.Linear(hidden, head.out_features).double()
    head2.load_state_dict(head.state_dict())
    if task == "text":
        lossf, y = nn.CrossEntropyLoss(), labels
    else:
        lossf, y = nn.BCEWithLogitsLoss(), (labels % 2).double()
    ds = SparseRowDataset(x)
    batch = next(iter(DataLoader(ds, batch_size=len(ds), collate_fn=ds.collate)))
    xb, _ = batch
    yb = y[batch.row_index]
    crow, col, val = _parts(xb)
    out1 = head(torch.relu(enc(xb))).squeeze(-1) if task == "text" else head(enc(xb)).squeeze(-1)
    h2 = bag(col, crow[:-1], per_sample_weights=val) + bias
    out2 = head2(torch.relu(h2)).squeeze(-1) if task == "text" else head2(h2).squeeze(-1)
    l1, l2 = lossf(out1, yb), lossf(out2, yb)
    l1.backward()
    l2.backward()
    torch.testing.assert_close(l1, l2, rtol=0, atol=1e-14)
    g1 = _grad(enc.weight_t) if sparse_grad else enc.weight.grad.t()
    torch.testing.assert_close(g1, _grad(bag.weight), rtol=0, atol=1e-14)
    torch.testing.assert_close(_grad(enc.bias), bias.grad, rtol=0, atol=1e-14)
    if sparse_grad:  # only the touched words' rows, as EmbeddingBag(sparse=True)
        touched = enc.weight_t.grad.coalesce().indices()[0]
        assert torch.equal(touched, torch.unique(col))


def test_labels_by_row_index_through_a_shuffled_loader():
    x, labels = _bow()
    ds = SparseRowDataset(x)
    loader = DataLoader(ds, batch_size=5, shuffle=True, collate_fn=ds.collate,
                        generator=torch.Generator().manual_seed(0))
    dense = x.to_dense()
    for batch in loader:
        xb, _ = batch
        assert torch.equal(xb.to_dense(), dense[batch.row_index])
        assert labels[batch.row_index].shape == (xb.shape[0],)


_X = torch.eye(4).to_sparse_csr()
_LABELS_HINT = (r"dense labels \(a class or a click per row, or a dense vector per row\) are "
                r"a dense tensor target: torch.from_numpy\(y\)")
_TRIPLE_HINT = (r"a \(crow_indices, col_indices, values\) triple is no sparse form: build the "
                r"batch with torch.sparse_csr_tensor\(crow, col, values, \(rows, width\)\) "
                r"\(from EmbeddingBag's \(input, offsets, per_sample_weights\), whose bags may "
                r"repeat or reorder indices: torch.sparse_coo_tensor\(torch.stack\(\["
                r"torch.repeat_interleave\(torch.diff\(offsets, append=offsets.new_tensor\(\["
                r"len\(input\)\]\)\)\), input\]\), per_sample_weights, \(len\(offsets\), "
                r"width\)\)\)$")
_LAYER = nnsparse.SparseLinearBatch(4, 2)
_CROW, _COL, _VAL = _parts(_X)

_BATCH = SparseRowDataset(_X).collate([(0, SparseRowDataset(_X)[0][1])])
_UNPACK_HINT = r"got SparseRowBatch; unpack the loader's batch first: x, y = batch"
_BAG_HINT = (r"an integer \(rows, k\) tensor of column indices \(nn.EmbeddingBag's 2-D "
             r"input\) becomes a batch with torch.sparse_coo_tensor\(torch.stack\(\[torch."
             r"arange\(rows, device=input.device\).repeat_interleave\(k\), input.flatten\(\)"
             r"\]\), weights.flatten\(\), \(rows, 4\)\), weights its per_sample_weights or "
             r"torch.ones\(rows, k, device=input.device\) \(repeated indices summed, as "
             r"mode='sum'\)$")
# EmbeddingBag's 1-D triple: bags [1, 3, 3] (a repeat) and [2, 0] (out of order)
_EB_INPUT, _EB_OFFSETS = torch.tensor([1, 3, 3, 2, 0]), torch.tensor([0, 3])
_EB_WEIGHTS = torch.tensor([0.5, 2.0, 1.0, 1.5, -1.0])


def _embedding_bag(input, *args, **kwargs):
    bag = nn.EmbeddingBag(4, 2, mode="sum")
    with torch.no_grad():
        bag.weight.copy_(_LAYER.weight.t())
    return bag(input, *args, **kwargs) + _LAYER.bias
def _bag_recipe():
    """The message's recipe, run as written (a repeated index included) against
    EmbeddingBag: the largest difference."""
    input = torch.tensor([[1, 3, 3], [0, 2, 1]])
    rows, k = input.shape
    weights = torch.tensor([[0.5, 2.0, 1.0], [1.5, -1.0, 3.0]])
    x = torch.sparse_coo_tensor(torch.stack([torch.arange(rows, device=input.device)
                                             .repeat_interleave(k), input.flatten()]),
                                weights.flatten(), (rows, 4))
    ref = _embedding_bag(input, per_sample_weights=weights)
    return (_LAYER(x) - ref).abs().max().item()


def _triple_recipe(offsets_dtype):
    """The triple message's EmbeddingBag recipe, run as written, against EmbeddingBag."""
    input, offsets = _EB_INPUT.to(offsets_dtype), _EB_OFFSETS.to(offsets_dtype)
    per_sample_weights, width = _EB_WEIGHTS, 4
    x = torch.sparse_coo_tensor(torch.stack([torch.repeat_interleave(torch.diff(
        offsets, append=offsets.new_tensor([len(input)]))), input]), per_sample_weights,
        (len(offsets), width))
    ref = _embedding_bag(input, offsets, per_sample_weights=per_sample_weights)
    return (_LAYER(x) - ref).abs().max().item()


CASES = [
    # dense labels are a dense target (session 23): batches stack them
    Case("dataset-class-labels", lambda: SparseRowDataset(_X, torch.tensor([0, 1, 2, 3])),
         None, check=lambda ds: torch.equal(ds.collate([ds[3], ds[1]]).target,
                                            torch.tensor([3, 1]))),
    Case("dataset-click-labels-2d", lambda: SparseRowDataset(_X, torch.ones(4, 1)),
         None, check=lambda ds: ds.collate([ds[0]]).target.shape == (1, 1)),
    # scikit-learn's y is a numpy array: labels too, not a matrix to sparsify
    Case("dataset-numpy-labels", lambda: SparseRowDataset(_X, np.array([0, 1, 2, 3])),
         TypeError, r"got ndarray; " + _LABELS_HINT),
    Case("dataset-numpy-input", lambda: SparseRowDataset(np.eye(4)), TypeError,
         r"got ndarray; a numpy array goes through torch.from_numpy\(a\), then "
         r"nnsparse.sparsify$"),
    # a dense input is still told to sparsify (its zeros are missing entries)
    Case("dataset-dense-input", lambda: SparseRowDataset(torch.eye(4)), TypeError,
         r"input must be a 2-D sparse CSR or COO tensor, got layout torch.strided; convert a "
         r"dense matrix with nnsparse.sparsify"),
    Case("layer-csr-triple", lambda: _LAYER((_CROW, _COL, _VAL)), ValueError,
         r"input\[0\] must be a pair tensor of shape \(k, 2\), got shape \(5,\); " + _TRIPLE_HINT),
    Case("layer-csr-triple-list", lambda: _LAYER([_CROW, _COL, _VAL]), ValueError, _TRIPLE_HINT),
    Case("layer-embedding-bag-triple", lambda: _LAYER((_COL, _CROW[:-1], _VAL)), ValueError,
         _TRIPLE_HINT),
    Case("layer-embedding-bag-triple-repeats",
         lambda: _LAYER((_EB_INPUT, _EB_OFFSETS, _EB_WEIGHTS)), ValueError, _TRIPLE_HINT),
    # a CSR triple of integer values (word counts) still reads as one
    Case("layer-csr-triple-counts", lambda: _LAYER((_CROW, _COL, torch.ones(4, dtype=torch.long))),
         ValueError, _TRIPLE_HINT),
    # three rows of column indices (a bag of words without values) are no triple: the plain
    # message, whether their lengths agree (no CSR row pointers) or not
    Case("layer-three-index-rows", lambda: _LAYER([torch.tensor([3, 1, 2]), torch.tensor([2, 0]),
                                                   torch.tensor([1, 1, 3])]), ValueError,
         r"input\[0\] must be a pair tensor of shape \(k, 2\), got shape \(3,\)$"),
    Case("layer-three-index-rows-uneven", lambda: _LAYER([torch.tensor([1, 2]), torch.tensor([0]),
                                                          torch.tensor([3, 1, 2])]), ValueError,
         r"input\[0\] must be a pair tensor of shape \(k, 2\), got shape \(2,\)$"),
    # three (k, 2) pair rows (the Lua form), an empty 1-D row first: accepted as before
    Case("layer-three-pair-rows", lambda: _LAYER([torch.tensor([[0, 1.0]]), torch.tensor([[3, 2.0]]),
                                                  torch.tensor([[1, -1.0], [2, 0.5]])]), None,
         check=lambda out: torch.allclose(out, _LAYER(torch.tensor(
             [[1.0, 0, 0, 0], [0, 0, 0, 2.0], [0, -1.0, 0.5, 0]]).to_sparse()))),
    Case("layer-empty-row-first", lambda: _LAYER([torch.tensor([]), torch.tensor([[3, 2.0]]),
                                                  torch.tensor([[1, -1.0]])]), None,
         check=lambda out: out.shape == (3, 2)),
    Case("function-csr-triple", lambda: nnsparse.sparse_linear((_CROW, _COL, _VAL), _LAYER.weight),
         ValueError, _TRIPLE_HINT),
    Case("densify-csr-triple", lambda: nnsparse.densify((_CROW, _COL, _VAL)), ValueError,
         _TRIPLE_HINT),
    # two 1-D tensors, or float first: no triple, the plain message
    Case("layer-pair-of-1d", lambda: _LAYER((_COL, _VAL)), ValueError,
         r"input\[0\] must be a pair tensor of shape \(k, 2\), got shape \(4,\)$"),
    # a loader's batch passed whole, to a layer, a function, a criterion
    Case("layer-whole-batch", lambda: _LAYER(_BATCH), TypeError,
         r"input must be a sparse tensor, a pair tensor or a list of sparse rows, got "
         r"SparseRowBatch; unpack the loader's batch first: x, y = batch \(or batch.input\)$"),
    Case("densify-whole-batch", lambda: nnsparse.densify(_BATCH), TypeError, _UNPACK_HINT),
    Case("criterion-whole-batch",
         lambda: nnsparse.SparseCriterion(nn.MSELoss())(torch.zeros(2, 4), _BATCH), TypeError,
         _UNPACK_HINT),
    # EmbeddingBag's (bags, k) input of indices given to the layer
    Case("layer-bag-indices", lambda: _LAYER(torch.tensor([[1, 3, 3], [0, 2, 1]])), ValueError,
         r"input must have 4 features \(in_features\) in its last dimension, got shape "
         r"\(2, 3\); a Lua \(k, 2\) pair vector goes through nnsparse.from_pairs\(input, "
         r"size=4\); " + _BAG_HINT),
    Case("layer-bag-indices-int32", lambda: _LAYER(torch.tensor([[1], [0]], dtype=torch.int32)),
         ValueError, _BAG_HINT),
    Case("function-bag-indices",
         lambda: nnsparse.sparse_linear(torch.tensor([[1, 3, 3]]), _LAYER.weight), ValueError,
         _BAG_HINT),
    # a float input of the wrong width is no bag of indices: no such hint
    Case("layer-float-wrong-width", lambda: _LAYER(torch.ones(2, 3)), ValueError,
         r"size=4\)$"),
    Case("the-bag-recipe", lambda: _bag_recipe(), None, check=lambda d: d < 1e-6),
    Case("the-triple-recipe", lambda: _triple_recipe(torch.int64), None, check=lambda d: d < 1e-6),
    Case("the-triple-recipe-int32", lambda: _triple_recipe(torch.int32), None,
         check=lambda d: d < 1e-6),
    Case("the-triple-built", lambda: _LAYER(torch.sparse_csr_tensor(_CROW, _COL, _VAL, (4, 4))),
         None, check=lambda out: torch.allclose(out, _LAYER(_X))),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refusals_say_what_to_do(case):
    run_case(case)

