"""SparseRowDataset with dense labels as its target: (sparse features, dense label) pairs,
as ``TensorDataset(x, y)`` gives them (a classifier, a click-through-rate model)."""
import pickle
import re

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from nnsparse import densify
from nnsparse.data import SparseRowBatch, SparseRowDataset

ROWS, WIDTH = 30, 12


@pytest.fixture(scope="module")
def x():
    g = torch.Generator().manual_seed(0)
    dense = (torch.rand(ROWS, WIDTH, generator=g) < 0.25) * torch.rand(ROWS, WIDTH, generator=g)
    dense[4] = 0  # an empty row
    return dense.to_sparse_csr()


LABELS = {
    "class-int64": torch.arange(ROWS) % 3,
    "click-float": (torch.arange(ROWS) % 2).float(),
    "bool": torch.arange(ROWS) % 4 == 0,
    "2d-float64": torch.arange(ROWS * 3, dtype=torch.float64).reshape(ROWS, 3),
    "2d-one-column": torch.ones(ROWS, 1),
}


@pytest.mark.parametrize("name", LABELS)
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_batches_stack_the_labels_of_their_rows(x, name, layout):
    labels = LABELS[name]
    ds = SparseRowDataset(x, labels, layout=layout)
    assert ds[5][2].shape == labels.shape[1:] and torch.equal(ds[-1][2], labels[-1])
    loader = DataLoader(ds, batch_size=7, shuffle=True, collate_fn=ds.collate,
                        generator=torch.Generator().manual_seed(1))
    seen = []
    for batch in loader:
        xb, yb = batch
        assert xb.layout == layout and yb.layout == torch.strided
        assert yb.dtype == labels.dtype and yb.shape == (xb.shape[0],) + labels.shape[1:]
        assert torch.equal(yb, labels[batch.row_index])
        assert torch.equal(densify(xb), densify(x)[batch.row_index])
        seen += batch.row_index.tolist()
    assert sorted(seen) == list(range(ROWS))


def test_labels_are_kept_detached_on_the_cpu(x):
    labels = torch.rand(ROWS, requires_grad=True)
    ds = SparseRowDataset(x, labels)
    y = ds.collate([ds[0], ds[1]]).target
    assert not y.requires_grad and y.device.type == "cpu"
    assert ds.target_width is None and SparseRowDataset(x, torch.ones(ROWS, 4)).target_width == 4


def test_empty_batch_and_moves(x):
    ds = SparseRowDataset(x, torch.ones(ROWS, 2, dtype=torch.int64))
    empty = ds.collate([])
    assert empty.target.shape == (0, 2) and empty.target.dtype == torch.int64
    assert empty.input.shape == (0, WIDTH)
    batch = ds.collate([ds[3], ds[4]])
    moved = batch.to("cpu")
    assert torch.equal(moved.target, batch.target) and moved.target.layout == torch.strided


def test_a_batch_with_labels_pickles_and_crosses_workers(x):
    labels = torch.arange(ROWS) * 10
    ds = SparseRowDataset(x, labels)
    batch = ds.collate([ds[i] for i in (2, 9, 4)])
    again = pickle.loads(pickle.dumps(batch))
    assert isinstance(again, SparseRowBatch) and torch.equal(again.target, batch.target)
    assert torch.equal(densify(again.input), densify(batch.input))

    def epoch(**kwargs):
        loader = DataLoader(ds, batch_size=8, shuffle=True, collate_fn=ds.collate,
                            generator=torch.Generator().manual_seed(0), **kwargs)
        return [(b.row_index, densify(b.input), b.target) for b in loader]
    serial, parallel = epoch(), epoch(num_workers=2)
    assert len(serial) == len(parallel) == 4
    for a, b in zip(serial, parallel):
        assert all(torch.equal(p, q) for p, q in zip(a, b))
        assert torch.equal(a[2], labels[a[0]])


def test_the_batch_takes_dense_labels_of_one_or_two_dimensions():
    x = torch.eye(3).to_sparse_csr()
    index = torch.arange(3)
    assert SparseRowBatch(x, torch.zeros(3), index).target.shape == (3,)
    assert SparseRowBatch(x, torch.zeros(3, 5), index).target.shape == (3, 5)
    with pytest.raises(ValueError, match=re.escape(
            "target must be a 1-D or 2-D dense batch of the input's 3 rows, got shape (3, 1, 1)")):
        SparseRowBatch(x, torch.zeros(3, 1, 1), index)
    with pytest.raises(ValueError, match=re.escape(
            "target must be a 1-D or 2-D dense batch of the input's 3 rows, got shape (2,)")):
        SparseRowBatch(x, torch.zeros(2), index)
    with pytest.raises(ValueError, match=re.escape(
            "target must be a 2-D batch of the input's 3 rows, got shape (3,)")):
        SparseRowBatch(x, torch.zeros(3).to_sparse(), index)


def _x():
    return torch.eye(4).to_sparse_csr()


@pytest.mark.parametrize("call, error, message", [
    (lambda: SparseRowDataset(_x(), torch.tensor(1)), ValueError,
     "target must be 1-D (rows,) or 2-D (rows, k) as dense labels, got shape ()"),
    (lambda: SparseRowDataset(_x(), torch.zeros(4, 2, 2)), ValueError,
     "target must be 1-D (rows,) or 2-D (rows, k) as dense labels, got shape (4, 2, 2)"),
    (lambda: SparseRowDataset(_x(), torch.zeros(3)), ValueError,
     "target must have 4 rows like input, got 3"),
    (lambda: SparseRowDataset(_x(), torch.zeros(4, device="meta")), ValueError,
     "target must hold data, got a tensor on the meta device"),
    (lambda: SparseRowDataset(_x(), np.zeros(4)), TypeError,
     "target must be a 2-D sparse CSR or COO tensor or a dense tensor of labels, got ndarray; "
     "dense labels (a class or a click per row, or a dense vector per row) are a dense "
     "tensor target: torch.from_numpy(y)"),
    (lambda: SparseRowDataset(_x(), [0, 1, 0, 1]), TypeError,
     "target must be a 2-D sparse CSR or COO tensor or a dense tensor of labels, got list"),
], ids=["0-d", "3-d", "rows", "meta", "numpy", "list"])
def test_bad_labels(call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call()


def _datasets():
    x = _x()
    return {"none": SparseRowDataset(x), "sparse": SparseRowDataset(x, x),
            "dense": SparseRowDataset(x, torch.arange(4))}


@pytest.mark.parametrize("own, other, hint", [
    ("dense", "none", "an item without a target, which this dataset's batches need"),
    ("none", "dense", "an item with a target, which this dataset (built without one) would "
                      "drop"),
    ("sparse", "dense", "an item with dense labels as its target, where this dataset's target "
                        "is a sparse matrix"),
    ("dense", "sparse", "an item with a sparse target row, where this dataset's target is "
                        "dense labels"),
])
def test_items_of_another_kind_of_target_are_refused(own, other, hint):
    sets = _datasets()
    items = [sets[own][0], sets[other][1]]
    with pytest.raises(TypeError, match=re.escape(
            f"got items[1] = {type(items[1]).__name__} ({', '.join(type(f).__name__ for f in items[1])})"
            f": {hint}; collate it with the dataset it came from")):
        sets[own].collate(items)


@pytest.mark.parametrize("labels, error, message", [
    (torch.arange(4).float(), TypeError,
     "items[1] holds labels of shape () and dtype torch.float32 on cpu, this dataset's are of "
     "shape () and dtype torch.int64 on cpu; collate each dataset's items with its own collate"),
    (torch.zeros(4, 2, dtype=torch.int64), ValueError,
     "items[1] holds labels of shape (2,) and dtype torch.int64 on cpu, this dataset's are of "
     "shape () and dtype torch.int64 on cpu"),
], ids=["dtype", "shape"])
def test_foreign_labels_are_refused_by_name(labels, error, message):
    # another dataset's labels: torch.stack would promote the dtype (a float batch of classes)
    # or fail naming no item
    ds = _datasets()["dense"]
    other = SparseRowDataset(_x(), labels)
    with pytest.raises(error, match="^" + re.escape(message)):
        ds.collate([ds[0], other[1]])
    # the same kind from another dataset is taken (dense labels need no trust)
    same = SparseRowDataset(_x(), torch.arange(4) + 10)
    assert ds.collate([ds[0], same[1]]).target.tolist() == [0, 11]


@pytest.mark.parametrize("labels", [torch.arange(ROWS) % 3, torch.rand(ROWS, 2)],
                         ids=["1-d", "2-d"])
def test_the_dataset_pickles_with_its_labels(x, labels):
    # a spawn or forkserver DataLoader worker gets the dataset pickled
    ds = pickle.loads(pickle.dumps(SparseRowDataset(x, labels)))
    batch = ds.collate([ds[7], ds[2]])
    assert torch.equal(batch.target, labels[[7, 2]])
    assert ds.target_width == (labels.shape[1] if labels.dim() == 2 else None)


def test_a_dataset_pickled_without_labels_reads_as_one_without_a_target(x):
    # a dataset pickled before labels existed has no _labels: its items stay (i, row)
    ds = SparseRowDataset(x)
    del ds.__dict__["_labels"]
    again = pickle.loads(pickle.dumps(ds))
    assert len(again[3]) == 2 and again.collate([again[3]]).target is None
