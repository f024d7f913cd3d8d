"""values_map / ValuesMap against the dense function at the specified entries."""
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse._forms import as_sparse_batch
from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, make_form, random_sparse_dense


def _entries(x):
    b = as_sparse_batch(x, name="x").coalesce()
    return b.row, b.col, b.values


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
@pytest.mark.parametrize("fn", [torch.tanh, torch.sigmoid])
def test_matches_dense_at_entries(form, dtype, device, fn):
    dense = random_sparse_dense(5, 7, 0.4, empty_rows=1, dtype=dtype, device=device)
    x = make_form(dense, form)
    y = nnsparse.values_map(fn, x)
    if form in ("coo", "coo_uncoalesced", "csr"):
        assert y.layout == x.layout
    else:
        assert isinstance(y, list) and len(y) == len(x)
    if form == "coo_uncoalesced":
        assert y.is_coalesced()  # fn of a sum of duplicates, not a sum of fn
    row, col, values = _entries(y)
    mask = dense != 0
    assert torch.equal(torch.stack([row, col], 1), mask.nonzero())
    torch.testing.assert_close(values, fn(dense)[row, col], **TOL[dtype])


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_gradient_reaches_values_only(layout):
    dense = random_sparse_dense(4, 6, 0.5, empty_rows=1)
    index = dense.nonzero().t()
    leaf = dense[index[0], index[1]].clone().requires_grad_()
    x = torch.sparse_coo_tensor(index, leaf, dense.shape, is_coalesced=True)
    if layout == "csr":
        x = torch.sparse_csr_tensor(dense.to_sparse_csr().crow_indices(),
                                    dense.to_sparse_csr().col_indices(), leaf, dense.shape)
    grad_out = torch.randn(leaf.shape, dtype=leaf.dtype)
    y = nnsparse.values_map(torch.tanh, x)
    (y.values() * grad_out).sum().backward()
    torch.testing.assert_close(leaf.grad, grad_out * (1 - torch.tanh(leaf.detach()) ** 2))
    assert torch.autograd.gradcheck(
        lambda v: nnsparse.values_map(torch.sigmoid, torch.sparse_coo_tensor(
            index, v, dense.shape, is_coalesced=True)).values(), (leaf.detach().requires_grad_(),))


def test_vector_and_empty():
    v = torch.sparse_coo_tensor([[3, 1]], [1.0, -2.0], (5,))
    y = nnsparse.values_map(torch.tanh, v)
    assert y.shape == (5,) and y.sparse_dim() == 1
    torch.testing.assert_close(y.to_dense(), torch.tanh(v.to_dense()))
    empty = torch.zeros(3, 4).to_sparse()
    assert nnsparse.values_map(torch.sigmoid, empty)._nnz() == 0


def test_dense_passes_through():
    x = torch.randn(3, 2)
    torch.testing.assert_close(nnsparse.values_map(torch.tanh, x), torch.tanh(x))


def test_module_in_sequential():
    net = nn.Sequential(nnsparse.ValuesMap(nn.Tanh()), nnsparse.ValuesMap(torch.sigmoid))
    dense = random_sparse_dense(3, 4, 0.5, dtype=torch.float32)
    y = net(dense.to_sparse())
    row, col, values = _entries(y)
    torch.testing.assert_close(values, torch.sigmoid(torch.tanh(dense))[row, col])
    torch.testing.assert_close(net(dense), torch.sigmoid(torch.tanh(dense)))


def test_after_sparse_output_linear():
    decoder = nnsparse.SparseOutputLinear(3, 6)
    h, target = torch.randn(2, 3), random_sparse_dense(2, 6, 0.5, dtype=torch.float32)
    y = nnsparse.values_map(torch.tanh, decoder(h, target.to_sparse_csr()))
    row, col, values = _entries(y)
    torch.testing.assert_close(values, torch.tanh(decoder(h))[row, col])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_parts_give_sparse_parts_as_the_tensor_forms(layout, device):
    """The compile input form: the same pattern tensors, the values (and their gradients)
    of the COO/CSR result."""
    dense = random_sparse_dense(5, 7, 0.4, empty_rows=1, dtype=torch.float64, device=device)
    x = dense.to_sparse_csr() if layout == "csr" else dense.to_sparse()
    parts = nnsparse.sparse_parts(x)
    leaf = parts.values.clone().requires_grad_()
    act = nnsparse.ValuesMap(nn.Tanh())
    y = act(parts.with_values(leaf))
    assert isinstance(y, nnsparse.SparseParts) and y.size == parts.size
    assert y.crow is parts.crow and y.col is parts.col
    want = nnsparse.values_map(torch.tanh, x)
    row, col, values = _entries(want)
    torch.testing.assert_close(y.values, values)  # both in row-major order
    torch.testing.assert_close(y.to_sparse_csr().to_dense(), want.to_dense())
    y.values.sum().backward()
    torch.testing.assert_close(leaf.grad, 1 - torch.tanh(leaf.detach()) ** 2)
    with pytest.raises(ValueError, match=r"fn must keep the values' shape \(\d+,\), got \(1,\)"):
        nnsparse.values_map(lambda v: v.sum().reshape(1), parts)


def test_sparse_parts_through_a_pattern_sequential():
    """PatternSequential(..., SparseOutputLinear, ValuesMap) runs on the compile input path."""
    torch.manual_seed(0)
    model = nnsparse.PatternSequential(nnsparse.SparseLinearBatch(6, 3), nn.Tanh(),
                                       nnsparse.SparseOutputLinear(3, 6),
                                       nnsparse.ValuesMap(torch.sigmoid))
    x = random_sparse_dense(4, 6, 0.5, empty_rows=1, dtype=torch.float32).to_sparse_csr()
    parts = nnsparse.sparse_parts(x)
    got = model(parts, parts)
    assert isinstance(got, nnsparse.SparseParts)
    torch.testing.assert_close(got.values, model(x, x).values())


def test_bad_arguments():
    x = torch.zeros(2, 3).to_sparse()
    with pytest.raises(ValueError, match=r"fn must keep the values' shape \(0,\), got \(1,\)"):
        nnsparse.values_map(lambda v: v.sum().reshape(1), x)
    with pytest.raises(TypeError, match="input must be a sparse tensor"):
        nnsparse.values_map(torch.tanh, "abc")


# -- the sparse result's own autograd: O(nnz) backward ------------------------------------
from nnsparse.values import _coo_with_values, _csr_with_values  # noqa: E402
from matrix import LargestTensor  # noqa: E402


def _pattern(layout, dense):
    """Index tensors of ``dense``'s nonzeros and a builder of the sparse result on them."""
    if layout == "csr":
        csr = dense.to_sparse_csr()
        crow, col = csr.crow_indices(), csr.col_indices()
        return lambda v: _csr_with_values(crow, col, v, dense.shape)
    index = dense.to_sparse()._indices()
    return lambda v: _coo_with_values(index, v, dense.shape)


# How the gradient reaches the result: sparse on its own indices (values()), sparse on
# other index tensors (to_dense's backward), a sum of both (uncoalesced), dense (a product
# with a dense tensor).
_READS = {
    "values": lambda out, w: (out.values() * w.reshape(-1)[:out.values().numel()]).sum(),
    "to_dense": lambda out, w: (out.to_dense() * w).sum(),
    "sum_of_two": lambda out, w: out.values().sum() * 2 + (out.to_dense() * w).sum(),
    "dense_grad": lambda out, w: (out * w).sum(),
}


@pytest.mark.parametrize("read", list(_READS))
@pytest.mark.parametrize("layout", ["coo", "coo_vector", "csr"])
def test_sparse_result_gradcheck(layout, read):
    dense = random_sparse_dense(4, 6, 0.4, empty_rows=1)
    if layout == "coo_vector":
        dense = dense[1] if dense[1].any() else dense.reshape(-1)
    build = _pattern("csr" if layout == "csr" else "coo", dense)
    weights = torch.randn(dense.shape, dtype=torch.float64)
    values = torch.randn(int((dense != 0).sum()), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda v: _READS[read](build(v), weights), (values,))


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_result_dense_grad_output(layout):
    """A dense gradient handed straight to the result is read at its entries."""
    dense = random_sparse_dense(3, 5, 0.5)
    build = _pattern(layout, dense)
    values = torch.randn(int((dense != 0).sum()), dtype=torch.float64, requires_grad=True)
    grad_out = torch.randn(dense.shape, dtype=torch.float64)
    out = build(values)
    torch.autograd.backward(out, grad_out)
    row, col = dense.nonzero().unbind(1)
    torch.testing.assert_close(values.grad, grad_out[row, col])


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_sparse_result_empty(layout):
    dense = torch.zeros(3, 4, dtype=torch.float64)
    build = _pattern(layout, dense)
    values = torch.zeros(0, dtype=torch.float64, requires_grad=True)
    out = build(values)
    (out.to_dense().sum() + out.values().sum()).backward()
    assert values.grad.shape == (0,)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_keeps_index_tensors(layout):
    """values_map reuses the input's index tensors: criteria see the same pattern for free."""
    x = make_form(random_sparse_dense(3, 6, 0.5, dtype=torch.float32), layout)
    y = nnsparse.values_map(torch.tanh, x)
    if layout == "csr":
        assert y.crow_indices().data_ptr() == x.crow_indices().data_ptr()
        assert y.col_indices().data_ptr() == x.col_indices().data_ptr()
    else:
        assert y._indices().data_ptr() == x._indices().data_ptr()


@pytest.mark.parametrize("layout", ["coo", "coo_uncoalesced", "csr"])
def test_backward_never_dense(layout):
    """torch's CSR constructor back-propagates a dense (rows, width) tensor; ours does not."""
    rows, width = 8, 5000
    dense = random_sparse_dense(rows, width, 100 / (rows * width), dtype=torch.float32)
    x = make_form(dense, layout).requires_grad_()
    with LargestTensor() as seen:
        y = nnsparse.values_map(torch.tanh, x)
        y.values().square().sum().backward()
    assert x.grad is not None
    assert seen.numel < rows * width, f"{seen.op} made {seen.numel} elements"
