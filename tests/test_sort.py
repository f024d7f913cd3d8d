"""nnsparse.sort: ssort, ssort_by_index and stopk against dense references."""
import math

import pytest
import torch

from matrix import DEVICES, FLOAT_DTYPES, TOL, make_form, random_sparse_dense
from nnsparse import ssort, ssort_by_index, stopk

TORCH_BATCH_FORMS = ["coo", "coo_uncoalesced", "csr", "list"]
INF = math.inf


def _padded(values, indices, specified, k, fill):
    """Dense sort results cut or padded to ``k`` columns, padding index -1."""
    rows = values.shape[0]
    taken = specified.sum(1, keepdim=True)
    width = values.shape[1]
    if k > width:
        values = torch.cat([values, values.new_full((rows, k - width), fill)], 1)
        indices = torch.cat([indices, indices.new_full((rows, k - width), -1)], 1)
    values, indices = values[:, :k], indices[:, :k]
    pad = torch.arange(k, device=values.device) >= taken
    return values.masked_fill(pad, fill), indices.masked_fill(pad, -1)


def _reference_sort(dense, descending):
    specified = dense != 0
    fill = -INF if descending else INF
    values, indices = dense.masked_fill(~specified, fill).sort(dim=1, descending=descending, stable=True)
    k = int(specified.sum(1).max()) if dense.numel() else 0
    return _padded(values, indices, specified, k, fill)


def _reference_sort_by_index(dense, descending):
    specified = dense != 0
    columns = torch.arange(dense.shape[1], device=dense.device).expand_as(dense)
    key = torch.where(specified, columns, dense.shape[1] if not descending else -1)
    indices = key.sort(dim=1, descending=descending, stable=True).indices
    values = dense.gather(1, indices)
    k = int(specified.sum(1).max()) if dense.numel() else 0
    return _padded(values, indices, specified, k, 0.0)


def _reference_topk(dense, k):
    """torch.topk of the rows, unspecified entries -inf, k taken at most as the width."""
    specified = dense != 0
    top = min(k, dense.shape[1])
    values, indices = dense.masked_fill(~specified, -INF).topk(top, dim=1)
    return _padded(values, indices, specified, top, -INF)


def _batch(dtype, device, rows=6, width=8):
    return random_sparse_dense(rows, width, 0.4, empty_rows=2, dtype=dtype, device=device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", TORCH_BATCH_FORMS)
@pytest.mark.parametrize("descending", [False, True])
def test_ssort_batch(descending, form, dtype, device):
    dense = _batch(dtype, device)
    values, indices = ssort(make_form(dense, form), descending=descending)
    ref_values, ref_indices = _reference_sort(dense, descending)
    assert values.dtype == dtype and values.device == dense.device and indices.dtype == torch.int64
    torch.testing.assert_close(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", TORCH_BATCH_FORMS)
@pytest.mark.parametrize("descending", [False, True])
def test_ssort_by_index_batch(descending, form, device):
    dense = _batch(torch.float64, device)
    values, indices = ssort_by_index(make_form(dense, form), descending=descending)
    ref_values, ref_indices = _reference_sort_by_index(dense, descending)
    torch.testing.assert_close(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, **TOL[torch.float64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced"])
@pytest.mark.parametrize("by_index", [False, True])
@pytest.mark.parametrize("descending", [False, True])
def test_sort_vector(descending, by_index, form, device):
    dense = random_sparse_dense(1, 9, 0.5, device=device)[0]
    fn = ssort_by_index if by_index else ssort
    reference = _reference_sort_by_index if by_index else _reference_sort
    result = fn(make_form(dense, form), descending=descending)
    ref_values, ref_indices = reference(dense.unsqueeze(0), descending)
    assert result.values.shape == (int((dense != 0).sum()),)
    torch.testing.assert_close(result.indices, ref_indices[0])
    torch.testing.assert_close(result.values, ref_values[0], **TOL[torch.float64])


def test_integer_values_and_ties():
    x = torch.sparse_coo_tensor([[0, 2, 5, 7]], [3, 1, 3, 2], (8,))
    values, indices = ssort(x)
    assert values.tolist() == [1, 2, 3, 3] and indices.tolist() == [2, 7, 0, 5]  # ties: by index
    values, indices = ssort(x, descending=True)
    assert values.tolist() == [3, 3, 2, 1] and indices.tolist() == [0, 5, 7, 2]
    batch = torch.tensor([[0, 4], [0, 0]]).to_sparse()
    values, indices = ssort(batch)
    assert values.tolist() == [[4], [torch.iinfo(torch.int64).max]] and indices.tolist() == [[1], [-1]]
    values, _ = stopk(batch, 2)
    assert values.tolist() == [[4, torch.iinfo(torch.int64).min]] * 1 + [[torch.iinfo(torch.int64).min] * 2]


def test_nan_values_sort_as_largest():
    x = torch.sparse_coo_tensor([[0, 1, 2]], [1.0, math.nan, -1.0], (3,))
    assert ssort(x).indices.tolist() == [2, 0, 1]
    assert ssort(x, descending=True).indices.tolist() == [1, 0, 2]
    assert stopk(x, 1).indices.tolist() == [1]


# -- Lua pair form -----------------------------------------------------------------------

def test_pairs_lua_examples():
    x = torch.tensor([[1.0, 1.0], [3.0, 4.0], [6.0, 2.0]])
    torch.testing.assert_close(ssort(x), torch.tensor([[1.0, 1.0], [6.0, 2.0], [3.0, 4.0]]))
    torch.testing.assert_close(ssort(x, descending=True), torch.tensor([[3.0, 4.0], [6.0, 2.0], [1.0, 1.0]]))
    y = torch.tensor([[3.0, 1.0], [1.0, 4.0], [6.0, 2.0]])
    torch.testing.assert_close(ssort_by_index(y), torch.tensor([[1.0, 4.0], [3.0, 1.0], [6.0, 2.0]]))
    torch.testing.assert_close(ssort_by_index(y, descending=True),
                               torch.tensor([[6.0, 2.0], [3.0, 1.0], [1.0, 4.0]]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("by_index", [False, True])
def test_pairs_are_reordered_with_duplicates_kept(by_index, device):
    x = torch.tensor([[4.0, 1.0], [2.0, 5.0], [4.0, 3.0], [0.0, 2.0]], device=device)
    out = (ssort_by_index if by_index else ssort)(x)
    column = 0 if by_index else 1
    torch.testing.assert_close(out, x[x[:, column].sort(stable=True).indices])
    assert out.device == x.device


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("descending", [False, True])
def test_pair_list(descending, device):
    dense = _batch(torch.float64, device)
    rows = make_form(dense, "pair_list")
    out = ssort(rows, descending=descending)
    assert isinstance(out, list) and len(out) == len(rows)
    for row, sorted_row in zip(rows, out):
        order = row[:, 1].sort(descending=descending, stable=True).indices
        torch.testing.assert_close(sorted_row, row[order])
    assert out[0].shape == (0, 2)
    by_index = ssort_by_index([r.flip(0) for r in rows])
    for row, sorted_row in zip(rows, by_index):
        torch.testing.assert_close(sorted_row, row)  # make_form's rows come by increasing index


@pytest.mark.parametrize("empty", [torch.zeros(0, 2, dtype=torch.float64), torch.tensor([]),
                                   torch.zeros(0, 2, dtype=torch.int64)],
                         ids=["float64", "torch.tensor([])", "int64"])
@pytest.mark.parametrize("sort", [ssort, ssort_by_index], ids=["ssort", "ssort_by_index"])
def test_pair_list_with_an_empty_row_of_another_dtype(sort, empty):
    rows = [torch.tensor([[3.0, 1.0], [1.0, 2.0]], dtype=torch.float16), empty,
            torch.tensor([[0.0, 5.0]], dtype=torch.float16)]
    out = sort(rows, descending=True)
    # each row keeps its dtype: the empty one does not promote the others
    assert [r.dtype for r in out] == [r.dtype for r in rows]
    assert out[1].numel() == 0
    expected = [[1.0, 2.0], [3.0, 1.0]] if sort is ssort else [[3.0, 1.0], [1.0, 2.0]]
    assert out[0].tolist() == expected
    top = stopk(rows, 1)
    assert top.values.dtype == torch.float16
    copies = [r.clone() for r in rows]
    assert sort(copies, descending=True, inplace=True) is copies
    assert [r.dtype for r in copies] == [r.dtype for r in rows]


def test_empty_inputs():
    empty = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0), (4,))
    values, indices = ssort(empty)
    assert values.shape == indices.shape == (0,)
    values, indices = ssort(torch.zeros(3, 4).to_sparse())
    assert values.shape == indices.shape == (3, 0)
    values, indices = stopk(torch.zeros(3, 4).to_sparse_csr(), 2)
    assert values.tolist() == [[-INF, -INF]] * 3 and indices.tolist() == [[-1, -1]] * 3
    assert ssort(torch.zeros(0, 2)).shape == (0, 2)
    assert ssort([torch.zeros(0, 2)])[0].shape == (0, 2)
    values, indices = stopk(torch.zeros(0, 2), 3)  # a pair vector declares no width
    assert indices.tolist() == [-1, -1, -1] and values.tolist() == [-INF] * 3


# -- stopk ------------------------------------------------------------------------------------

@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", TORCH_BATCH_FORMS + ["pair_list"])
@pytest.mark.parametrize("k", [0, 1, 3, 10])
def test_stopk_batch(k, form, dtype, device):
    dense = _batch(dtype, device)
    dense[-1, -1] = 1.0  # pair forms infer the width
    values, indices = stopk(make_form(dense, form), k)
    ref_values, ref_indices = _reference_topk(dense, k)
    declared = form != "pair_list"  # a pair form's result keeps k columns
    assert values.shape == indices.shape == (dense.shape[0],
                                             min(k, dense.shape[1]) if declared else k)
    assert values.dtype == dtype and values.device == dense.device
    if not declared:  # its columns beyond the width are padding
        assert (indices[:, dense.shape[1]:] == -1).all()
        values, indices = values[:, :dense.shape[1]], indices[:, :dense.shape[1]]
    torch.testing.assert_close(indices, ref_indices)
    torch.testing.assert_close(values, ref_values, **TOL[dtype])


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "pairs"])
def test_stopk_vector(form):
    dense = torch.tensor([0.0, 0.5, -2.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    values, indices = stopk(make_form(dense, form), 2)
    assert values.tolist() == [3.0, 1.0] and indices.tolist() == [4, 5]
    values, indices = stopk(make_form(dense, form), 6)
    assert indices.tolist() == [4, 5, 1, 2, -1, -1]
    assert values[-2:].tolist() == [-INF, -INF]


def test_stopk_sums_duplicate_pairs():
    pairs = torch.tensor([[1.0, 2.0], [0.0, 3.0], [1.0, 2.0]])
    assert stopk(pairs, 1).indices.tolist() == [1]
    assert stopk(pairs, 1).values.tolist() == [4.0]


# k far beyond the width: every entry, in memory bounded by rows * width (a (rows, k) result
# of k = 2**40 would need terabytes; 2**62 and 2**63 - 1 overflow torch's storage size)
HUGE_K = [2 ** 31, 2 ** 40, 2 ** 62, 2 ** 63 - 1]


# (pair forms declare no width: their result keeps k columns, test_stopk_pairs_give_k_columns)
@pytest.mark.parametrize("form", TORCH_BATCH_FORMS)
@pytest.mark.parametrize("k", [2, 3, 4, 8, 9] + HUGE_K)
def test_stopk_k_beyond_the_entries(k, form):
    dense = _batch(torch.float64, "cpu")
    dense[-1, -1] = 1.0  # pair forms infer the width
    longest = int((dense != 0).sum(1).max())
    assert 2 < longest < dense.shape[1]  # k below, at and above it, and above the width
    values, indices = stopk(make_form(dense, form), k)
    ref_values, ref_indices = _reference_topk(dense, k)
    assert values.shape == indices.shape == (dense.shape[0], min(k, dense.shape[1]))
    torch.testing.assert_close(indices, ref_indices)
    torch.testing.assert_close(values, ref_values)


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced"])
@pytest.mark.parametrize("k", HUGE_K)
def test_stopk_vector_huge_k(k, form):
    dense = torch.tensor([0.0, 0.5, -2.0, 0.0, 3.0, 1.0], dtype=torch.float64)
    values, indices = stopk(make_form(dense, form), k)
    ref = dense.masked_fill(dense == 0, -INF).topk(dense.shape[0])
    assert indices.tolist() == ref.indices[:4].tolist() + [-1, -1] == [4, 5, 1, 2, -1, -1]
    assert values.tolist() == ref.values.tolist()


@pytest.mark.parametrize("k", [3, 5, 9])
def test_stopk_pairs_give_k_columns_whatever_their_indices(k):
    """A pair tensor declares no width (its largest index + 1 is no width): its result has
    k columns whatever indices it holds, so that the results of several concatenate."""
    low = torch.tensor([[2.0, 0.5], [0.0, 0.25]])  # indices up to 2
    high = torch.tensor([[7.0, 0.5], [0.0, 0.25]])  # indices up to 7
    for pairs in (low, high):
        values, indices = stopk(pairs, k)
        assert values.shape == indices.shape == (k,)
        assert indices.tolist() == [int(pairs[0, 0]), 0] + [-1] * (k - 2)
        assert values.tolist() == [0.5, 0.25] + [-INF] * (k - 2)
    values, indices = stopk([low, high[:1]], k)
    assert values.shape == indices.shape == (2, k)
    assert indices.tolist() == [[2, 0] + [-1] * (k - 2), [7] + [-1] * (k - 1)]


# -- gradients -----------------------------------------------------------------------------

def _leaf_batch(dense):
    coo = dense.to_sparse()
    values = coo.values().detach().requires_grad_()
    return torch.sparse_coo_tensor(coo.indices(), values, dense.shape), values


@pytest.mark.parametrize("fn", ["ssort", "ssort_by_index", "stopk"])
def test_gradients_reach_the_selected_values(fn):
    dense = _batch(torch.float64, "cpu")
    x, values = _leaf_batch(dense)
    call = {"ssort": lambda t: ssort(t, descending=True), "ssort_by_index": ssort_by_index,
            "stopk": lambda t: stopk(t, 2)}[fn]
    out_values, out_indices = call(x)
    grad_output = torch.randn(out_values.shape, dtype=torch.float64,
                              generator=torch.Generator().manual_seed(5))
    real = out_indices >= 0
    (out_values[real] * grad_output[real]).sum().backward()
    # dense reference: the same grad_output scattered back to the selected entries
    rows = torch.arange(dense.shape[0]).unsqueeze(1).expand_as(out_indices)
    expected = torch.zeros_like(dense).index_put((rows[real], out_indices[real]), grad_output[real])
    coo = dense.to_sparse()
    torch.testing.assert_close(values.grad, expected[coo.indices()[0], coo.indices()[1]])


def test_gradcheck():
    index = torch.tensor([[0, 0, 1, 1, 2], [1, 3, 0, 2, 2]])
    values = torch.tensor([0.3, -1.2, 2.0, 0.7, 1.1], dtype=torch.float64, requires_grad=True)

    def fn(v):
        x = torch.sparse_coo_tensor(index, v, (3, 4))
        sorted_values, sorted_index = ssort(x)
        top_values, top_index = stopk(x, 1)
        return sorted_values[sorted_index >= 0], top_values

    torch.autograd.gradcheck(fn, (values,))
    # gradcheck would perturb the index column too: only the value column is an input
    pair_index = torch.tensor([2.0, 0.0, 3.0], dtype=torch.float64)
    pair_values = torch.tensor([0.5, -1.0, 0.1], dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda v: ssort(torch.stack([pair_index, v], 1)), (pair_values,))


# -- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make, error, message", [
    (lambda: stopk(torch.eye(2).to_sparse(), -1), ValueError, "k must be a non-negative int, got -1"),
    (lambda: stopk(torch.eye(2).to_sparse(), 1.5), TypeError, "k must be a non-negative int, got 1.5"),
    (lambda: stopk(torch.eye(2).to_sparse(), True), TypeError, "k must be a non-negative int, got True"),
    (lambda: ssort(torch.eye(2).to_sparse(), descending=1), TypeError, "descending must be a bool, got int"),
    (lambda: ssort(torch.ones(3)), ValueError, r"x must be a pair tensor of shape \(k, 2\), got shape \(3,\)"),
    (lambda: ssort(torch.ones(2, 2, 2).to_sparse()), ValueError, "got 3 dimensions"),
    (lambda: ssort(torch.tensor([[0.5, 1.0]])), ValueError, "x indices must be integers, got 0.5"),
    (lambda: ssort_by_index(torch.eye(2, dtype=torch.bool).to_sparse()), TypeError,
     "x values must be real numbers to be ranked, got dtype torch.bool"),
    (lambda: stopk(torch.eye(2, dtype=torch.complex64).to_sparse(), 1), TypeError,
     "x values must be real numbers to be ranked, got dtype torch.complex64"),
    (lambda: stopk("x", 1), TypeError, "x must be a sparse tensor"),
])
def test_errors(make, error, message):
    with pytest.raises(error, match=message):
        make()
