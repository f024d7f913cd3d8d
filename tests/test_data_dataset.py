"""Tests of nnsparse.data.dataset: sparse rows through a DataLoader."""
import pickle
import warnings

import pytest
import torch
from torch.utils.data import DataLoader

import nnsparse
from nnsparse import densify
from nnsparse.data import (RatingNormalizer, SparseRowBatch, SparseRowDataset, collate_sparse_rows,
                           random_split, synthetic_ratings)


@pytest.fixture(scope="module")
def matrices():
    r = synthetic_ratings(seed=3, n_users=80, n_items=60, n_ratings=900)
    train, valid, test = random_split(r, test=0.1, validation=0.1, seed=0)
    norm = RatingNormalizer(train, "item")
    return norm.matrix(train), norm.matrix(valid, normalize=False)


def dense_rows(matrix, rows):
    return densify(matrix)[rows]


def test_items(matrices):
    x, _ = matrices
    ds = SparseRowDataset(x)
    assert len(ds) == x.shape[0] == 60
    for i in (0, 7, 59, -1):
        index, (col, val) = ds[i]
        assert torch.equal(ds[i][1].indices, col)
        assert index == i % 60
        crow = x.crow_indices()
        begin, end = int(crow[index]), int(crow[index + 1])
        assert torch.equal(col, x.col_indices()[begin:end])
        assert torch.equal(val, x.values()[begin:end])
    with pytest.raises(IndexError, match=r"index must be in \[-60, 60\), got 60"):
        ds[60]


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_collate_matches_dense(matrices, layout):
    x, y = matrices
    ds = SparseRowDataset(x, y, layout=layout)
    rows = [5, 0, 59, 5, 17]  # order kept, a repeated row, and rows with no target entry
    batch = ds.collate([ds[i] for i in rows])
    assert isinstance(batch, SparseRowBatch)
    assert batch.row_index.tolist() == rows
    assert batch.input.layout == layout and batch.target.layout == layout
    assert batch.input.shape == (5, x.shape[1]) and batch.target.shape == (5, y.shape[1])
    assert torch.equal(densify(batch.input), dense_rows(x, rows))
    assert torch.equal(densify(batch.target), dense_rows(y, rows))
    nnz = int(x.crow_indices().diff()[rows].sum())
    assert batch.input.values().numel() == nnz  # zeros after centring are still entries
    if layout == torch.sparse_coo:
        assert batch.input.is_coalesced()


def test_collate_empty_rows_and_batch_size_one():
    x = torch.sparse_csr_tensor(torch.tensor([0, 0, 2, 2]), torch.tensor([1, 3]),
                                torch.tensor([0.0, -1.0]), (3, 4))
    ds = SparseRowDataset(x)
    b = ds.collate([ds[0]])
    assert b.input.shape == (1, 4) and b.input.values().numel() == 0 and b.target is None
    b = ds.collate([ds[2], ds[1], ds[0]])
    assert b.input.crow_indices().tolist() == [0, 0, 2, 2]
    assert b.input.values().tolist() == [0.0, -1.0]


def test_collate_function_errors():
    rows = [(0, (torch.tensor([5]), torch.tensor([1.0])))]
    with pytest.raises(ValueError, match=r"rows indices must be in \[0, 3\), got max 5"):
        collate_sparse_rows(rows, width=3)
    with pytest.raises(TypeError, match="layout must be torch.sparse_csr or torch.sparse_coo"):
        collate_sparse_rows(rows, width=6, layout=torch.strided)


def _row(cols, vals, dtype=torch.int64):
    return (0, (torch.tensor(cols, dtype=dtype), torch.tensor(vals)))


@pytest.mark.parametrize("row, error, message", [
    (_row([-1], [1.0]), ValueError, r"rows indices must be non-negative, got min -1"),
    (_row([4], [1.0]), ValueError, r"rows indices must be in \[0, 4\), got max 4"),
    (_row([0, 1], [1.0]), ValueError, r"rows\[0\] must have one value per index"),
    (_row([2, 1], [1.0, 2.0]), ValueError, r"rows\[0\] indices must be increasing and unique"),
    (_row([1, 1], [1.0, 2.0]), ValueError, r"rows\[0\] indices must be increasing and unique"),
    (_row([1.0], [1.0], torch.float32), TypeError, r"rows\[0\] indices must be an integer"),
    ((0, [1, 2]), TypeError, r"rows\[0\] indices and values must be tensors"),
    ((0, 5), TypeError, r"rows\[0\] must be \(row_index, \(indices, values\)\)"),
])
def test_collate_checks_each_row(row, error, message):
    with pytest.raises(error, match=message):
        collate_sparse_rows([row], width=4)


def test_collate_int32_indices_work():
    index, batch = collate_sparse_rows([_row([0, 3], [1.0, 2.0], torch.int32)], width=4)
    assert torch.equal(densify(batch), torch.tensor([[1.0, 0, 0, 2.0]]))


def _csr(crow, col, values, shape):
    return torch.sparse_csr_tensor(torch.tensor(crow), torch.tensor(col), torch.tensor(values),
                                   shape)


@pytest.mark.parametrize("matrix, message", [
    (_csr([0, 2], [2, 1], [1.0, 2.0], (1, 3)), "input column indices must increase"),
    (_csr([0, 2], [1, 1], [1.0, 2.0], (1, 3)), "input column indices must increase"),
    (_csr([0, 3], [0, 1, 2], [1.0], (1, 3)), "input must have one value per column index"),
    (_csr([1, 1], [0], [1.0], (1, 3)), "input crow_indices must start at 0"),
    (_csr([0, 1], [-1], [1.0], (1, 3)), "input column indices must be non-negative"),
    (torch.sparse_coo_tensor(torch.tensor([[0], [5]]), torch.tensor([1.0]), (1, 3),
                             check_invariants=False), r"input column indices must be in \[0, 3\)"),
])
def test_dataset_checks_the_matrix_where_built(matrix, message):
    with pytest.raises(ValueError, match=message):
        SparseRowDataset(matrix)
    with pytest.raises(ValueError, match=message.replace("input", "target")):
        SparseRowDataset(torch.eye(1, 3).to_sparse_csr(), matrix)


@pytest.mark.parametrize("index", [1.5, "1", True, None])
def test_dataset_index_must_be_an_integer(index):
    ds = SparseRowDataset(torch.eye(3).to_sparse_csr())
    with pytest.raises(TypeError, match="^index must be an int, got"):
        ds[index]
    assert ds[torch.tensor(1)][0] == 1  # 0-dim integer tensors and numpy ints are indices


def test_batch_unpacks_as_input_target(matrices):
    x, y = matrices
    ds = SparseRowDataset(x, y)
    batch = ds.collate([ds[i] for i in (3, 1)])
    inp, tgt = batch
    assert inp is batch.input and tgt is batch.target and len(batch) == 2
    assert batch[0] is inp and batch[1] is tgt and batch.row_index.tolist() == [3, 1]
    inp, tgt = SparseRowDataset(x).collate([SparseRowDataset(x)[0]])
    assert tgt is None


def test_collated_batches_are_trusted_and_stay_so_when_moved(matrices):
    from nnsparse._forms import _attached, _counts, _reset_counts
    x, y = matrices
    ds = SparseRowDataset(x, y)
    _reset_counts()
    batch = ds.collate([ds[i] for i in range(5)])
    moved = batch.to("cpu")
    stays = batch.to(None)  # where it is, as Tensor.to(None)
    again = pickle.loads(pickle.dumps(batch))
    for b in (batch, moved, stays, again):
        assert _attached(b.input) is not None and _attached(b.target) is not None
        nnsparse_densify = densify(b.input)
        assert torch.equal(nnsparse_densify, dense_rows(x, list(range(5))))
    assert _counts().get("validate", 0) == 0


def test_dataloader_without_collate_fn_names_the_fix(matrices):
    x, _ = matrices
    ds = SparseRowDataset(x)
    with pytest.raises(TypeError, match=r"collate_fn=ds\.collate"):
        next(iter(DataLoader(ds, batch_size=4)))


def test_dataset_errors(matrices):
    x, y = matrices
    with pytest.raises(TypeError, match=r"^input must be a 2-D sparse CSR or COO tensor, "
                                        r"got layout torch.strided; convert a dense matrix with "
                                        r"nnsparse\.sparsify\(x, layout=torch\.sparse_csr\) "
                                        r"\(its zeros left out\)$"):
        SparseRowDataset(densify(x))
    # a numpy matrix, the other thing a user has at hand (a numpy target is told how labels
    # go in first: tests/test_user_study_bow.py)
    with pytest.raises(TypeError, match=r"^target must be a 2-D sparse CSR or COO tensor or a "
                                        r"dense tensor of labels, got ndarray; dense labels .* "
                                        r"becomes sparse with nnsparse\.sparsify\(torch\."
                                        r"from_numpy\(x\), layout=torch\.sparse_csr\)$"):
        SparseRowDataset(x, densify(y).numpy())
    with pytest.raises(TypeError, match=r"^input must be a 2-D sparse CSR or COO tensor, "
                                        r"got list$"):
        SparseRowDataset([[1.0]])
    # the hint's own call is taken, and gives the rows of the sparse matrix
    ds = SparseRowDataset(nnsparse.sparsify(densify(x), layout=torch.sparse_csr))
    assert torch.equal(ds[3][1][0], SparseRowDataset(x)[3][1][0])
    with pytest.raises(ValueError, match="target must have 60 rows like input, got 59"):
        SparseRowDataset(x, densify(y)[:59].to_sparse_csr())
    coo = SparseRowDataset(x.to_sparse_coo())  # COO input is accepted
    assert torch.equal(coo[3][1][0], SparseRowDataset(x)[3][1][0])


def test_batch_pickles_as_plain_tensors(matrices):
    x, y = matrices
    ds = SparseRowDataset(x, y)
    batch = ds.collate([ds[i] for i in range(4)])
    again = pickle.loads(pickle.dumps(batch))
    assert isinstance(again, SparseRowBatch)
    assert torch.equal(densify(again.input), densify(batch.input))
    assert torch.equal(densify(again.target), densify(batch.target))
    assert torch.equal(again.row_index, batch.row_index)
    moved = batch.to("cpu")
    assert moved.input.layout == torch.sparse_csr


def epoch(ds, **kwargs):
    loader = DataLoader(ds, batch_size=16, shuffle=True, collate_fn=ds.collate,
                        generator=torch.Generator().manual_seed(0), **kwargs)
    return [(b.row_index, densify(b.input), densify(b.target)) for b in loader]


def test_workers_give_the_same_batches(matrices):
    x, y = matrices
    ds = SparseRowDataset(x, y)
    serial = epoch(ds)
    with warnings.catch_warnings():
        # Only CUDA pins memory; on a CPU-only machine DataLoader warns and skips it.
        warnings.filterwarnings("ignore", message=".*pin_memory.*")
        parallel = epoch(ds, num_workers=2, pin_memory=True)
    assert len(serial) == len(parallel) == 4
    for a, b in zip(serial, parallel):
        assert all(torch.equal(p, q) for p, q in zip(a, b))
    assert sorted(torch.cat([b[0] for b in serial]).tolist()) == list(range(60))


def test_pin_memory_batch():
    if not torch.cuda.is_available():
        pytest.skip("pinned memory needs CUDA")
    x = torch.eye(4).to_sparse_csr()
    ds = SparseRowDataset(x, x)
    batch = next(iter(DataLoader(ds, batch_size=3, collate_fn=ds.collate, pin_memory=True)))
    assert batch.input.is_pinned() and batch.target.is_pinned()
    on_gpu = batch.to("cuda", non_blocking=True)
    assert on_gpu.input.is_cuda and torch.equal(densify(on_gpu.input).cpu(), torch.eye(4)[:3])
    from nnsparse._forms import _attached  # pinned and moved batches stay trusted
    assert _attached(batch.input) is not None and _attached(on_gpu.input) is not None


def test_collate_under_another_default_device_keeps_the_batch_on_the_cpu():
    # the row index and row pointers were made on the default device (the meta device stands
    # for CUDA here), beside the rows' CPU columns: "Cannot copy out of meta tensor"
    x = torch.tensor([[1., 0., 2.], [0., 0., 0.], [0., 3., 0.]]).to_sparse_csr()
    ds = SparseRowDataset(x)
    expected = ds.collate([ds[2], ds[0], ds[1]])
    with torch.device("meta"):
        got = ds.collate([ds[2], ds[0], ds[1]])
        empty = ds.collate([])
    assert torch.equal(got.row_index, expected.row_index)
    assert torch.equal(got.input.to_dense(), expected.input.to_dense())
    assert got.input.device == empty.input.device == torch.device("cpu")
