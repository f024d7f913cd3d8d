"""Densify and Sparsify layers against nnsparse.densify / sparsify and dense references."""
import math
import pickle

import pytest
import torch
from torch import nn

import nnsparse
from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, VECTOR_FORMS, make_form, random_sparse_dense

WIDTH = 7


def _dense(rows=5, dtype=torch.float64, device="cpu", empty_rows=1, density=0.4):
    return random_sparse_dense(rows, WIDTH, density, dtype=dtype, device=device,
                               empty_rows=empty_rows)


def _form_from_values(dense, values, form):
    """The sparse ``form`` of ``dense``'s pattern holding ``values`` (which may require grad),
    so that gradients w.r.t. ``values`` can be checked.  Returns (form, row, col) where
    entry ``i`` of ``values`` sits at ``(row[i], col[i])``."""
    row, col = dense.nonzero().unbind(1)
    shape = dense.shape
    if form == "coo":
        return torch.sparse_coo_tensor(torch.stack([row, col]), values, shape), row, col
    if form == "coo_uncoalesced":  # every entry twice, reversed order
        row2, col2 = torch.cat([row, row]).flip(0), torch.cat([col, col]).flip(0)
        x = torch.sparse_coo_tensor(torch.stack([row2, col2]), values, shape, check_invariants=False)
        return x, row2, col2
    if form == "csr":
        crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=dense.device)
        crow[1:] = torch.bincount(row, minlength=shape[0]).cumsum(0)
        return torch.sparse_csr_tensor(crow, col, values, shape), row, col
    counts = torch.bincount(row, minlength=shape[0]).tolist()
    parts = zip(col.split(counts), values.split(counts))
    if form == "list":
        return [torch.sparse_coo_tensor(c.unsqueeze(0), v, (shape[1],)) for c, v in parts], row, col
    if form == "pair_list":
        return [torch.stack([c.to(v.dtype), v], 1) for c, v in parts], row, col
    raise ValueError(form)


def _n_values(dense, form):
    return int((dense != 0).sum()) * (2 if form == "coo_uncoalesced" else 1)


# -- Densify ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_densify_matches_function_and_dense(form, dtype, device):
    dense = _dense(dtype=dtype, device=device)
    x = make_form(dense, form)
    out = nnsparse.Densify(WIDTH)(x)
    assert out.shape == (5, WIDTH) and out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out, dense, **TOL[dtype])
    torch.testing.assert_close(out, nnsparse.densify(x, size=(5, WIDTH)), **TOL[dtype])


@pytest.mark.parametrize("form", VECTOR_FORMS)
def test_densify_vector(form):
    vector = _dense()[2]
    out = nnsparse.Densify(WIDTH + 3)(make_form(vector, form))
    assert out.shape == (WIDTH + 3,)
    torch.testing.assert_close(out, torch.cat([vector, vector.new_zeros(3)]))


def test_densify_pads_narrower_input():
    # A pair tensor's width is its largest index + 1; the layer gives in_features columns.
    out = nnsparse.Densify(5)([torch.tensor([[1., 2.]]), torch.tensor([[0., 3.]])])
    torch.testing.assert_close(out, torch.tensor([[0., 2., 0., 0., 0.], [3., 0., 0., 0., 0.]]))


@pytest.mark.parametrize("form", ["coo", "csr", "list", "pair_list"])
def test_densify_empty_batches(form):
    only_empty = torch.zeros(3, WIDTH)
    out = nnsparse.Densify(WIDTH)(make_form(only_empty, form))
    torch.testing.assert_close(out, only_empty)
    assert nnsparse.Densify(WIDTH)([]).shape == (0, WIDTH)
    assert nnsparse.Densify(WIDTH)(torch.zeros(0, WIDTH).to_sparse()).shape == (0, WIDTH)


def test_densify_batch_of_one_and_elem_nan():
    dense = _dense(rows=1, empty_rows=0)
    out = nnsparse.Densify(WIDTH, elem=math.nan)(make_form(dense, "coo"))
    expected = torch.where(dense != 0, dense, torch.full_like(dense, math.nan))
    torch.testing.assert_close(out, expected, equal_nan=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_densify_gradient_reaches_specified_values_only(form, device):
    dense = _dense(device=device)
    values = torch.randn(_n_values(dense, form), dtype=torch.float64, device=device,
                         requires_grad=True)
    x, row, col = _form_from_values(dense, values, form)
    grad_output = torch.randn(5, WIDTH, dtype=torch.float64, device=device)
    nnsparse.Densify(WIDTH)(x).backward(grad_output)
    # Dense reference: d(sum(G * densify(x)))/d value_i = G[row_i, col_i], duplicates included.
    torch.testing.assert_close(values.grad, grad_output[row, col], **TOL[torch.float64])


@pytest.mark.parametrize("form", BATCH_FORMS)
def test_densify_gradcheck(form):
    dense = _dense(rows=3, density=0.5)
    values = torch.randn(_n_values(dense, form), dtype=torch.float64, requires_grad=True)
    layer = nnsparse.Densify(WIDTH + 1)
    assert torch.autograd.gradcheck(lambda v: layer(_form_from_values(dense, v, form)[0]), (values,))


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr"])
def test_densify_gradient_of_sparse_leaf_keeps_its_pattern(form):
    dense = _dense()
    x = make_form(dense, form).detach().requires_grad_()
    grad_output = torch.randn(5, WIDTH, dtype=torch.float64)
    nnsparse.Densify(WIDTH)(x).backward(grad_output)
    assert x.grad.layout == x.layout
    torch.testing.assert_close(x.grad.to_dense(), grad_output * (dense != 0))


def test_densify_in_sequential_matches_linear_on_dense():
    torch.manual_seed(0)
    dense = _dense(rows=6, dtype=torch.float32)
    net = nn.Sequential(nnsparse.Densify(WIDTH), nn.Linear(WIDTH, 3))
    reference = nn.Linear(WIDTH, 3)
    reference.load_state_dict(net[1].state_dict())
    grad_output = torch.randn(6, 3)
    net(make_form(dense, "csr")).backward(grad_output)
    reference(dense).backward(grad_output)
    torch.testing.assert_close(net[1].weight.grad, reference.weight.grad)
    torch.testing.assert_close(net[1].bias.grad, reference.bias.grad)


def test_densify_module_facts():
    layer = nnsparse.Densify(WIDTH)
    assert repr(layer) == f"Densify(in_features={WIDTH})"
    assert repr(nnsparse.Densify(3, elem=math.nan)) == "Densify(in_features=3, elem=nan)"
    assert layer.state_dict() == {} and list(layer.parameters()) == []
    clone = pickle.loads(pickle.dumps(layer))
    torch.testing.assert_close(clone(make_form(_dense(), "coo")), _dense())


def test_densify_errors():
    with pytest.raises(ValueError, match=r"in_features must be a non-negative int, got -1"):
        nnsparse.Densify(-1)
    with pytest.raises(ValueError, match=r"input has width 7, larger than in_features 4$"):
        nnsparse.Densify(4)(make_form(_dense(), "coo"))
    with pytest.raises(ValueError, match=r"input column indices must be in \[0, 4\), got max 5"):
        nnsparse.Densify(4)(torch.sparse_coo_tensor([[0], [5]], [1.], (1, 4), check_invariants=False))
    with pytest.raises(TypeError, match=r"input must be a sparse tensor.*got int"):
        nnsparse.Densify(4)(3)


# -- Sparsify --------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparsify_matches_function(layout, dtype, device):
    dense = _dense(dtype=dtype, device=device)
    out = nnsparse.Sparsify(layout=layout)(dense)
    expected = nnsparse.sparsify(dense, layout=layout)
    assert out.layout == layout and out.dtype == dtype and out.device.type == device
    torch.testing.assert_close(out.to_dense(), expected.to_dense())
    torch.testing.assert_close(out.to_dense(), dense)


def test_sparsify_vector_elem_nan_and_offset():
    x = torch.tensor([[math.nan, 0., 2.], [1., math.nan, math.nan]])
    out = nnsparse.Sparsify(elem=math.nan, offset=2)(x)
    assert out.shape == (2, 5)
    torch.testing.assert_close(out.indices(), torch.tensor([[0, 0, 1], [3, 4, 2]]))
    torch.testing.assert_close(out.values(), torch.tensor([0., 2., 1.]))  # 0 is a value
    vector = nnsparse.Sparsify(offset=1)(torch.tensor([0., 5.]))
    torch.testing.assert_close(vector.to_dense(), torch.tensor([0., 0., 5.]))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparsify_gradient_at_kept_entries_only(layout):
    dense = _dense().requires_grad_()
    grad_output = torch.randn(5, WIDTH + 2, dtype=torch.float64)
    net = nn.Sequential(nnsparse.Sparsify(offset=2, layout=layout), nnsparse.Densify(WIDTH + 2))
    out = net(dense)
    torch.testing.assert_close(out[:, 2:], dense.detach())
    out.backward(grad_output)
    torch.testing.assert_close(dense.grad, grad_output[:, 2:] * (dense.detach() != 0))


def test_sparsify_gradcheck():
    # NaN marks the unspecified entries: a finite-difference step cannot flip them.
    x = torch.randn(3, 4, dtype=torch.float64)
    x[0, 1] = x[2, 3] = math.nan
    x.requires_grad_()
    layer = nnsparse.Sparsify(elem=math.nan)
    assert torch.autograd.gradcheck(lambda t: layer(t).values(), (x,))


def test_sparsify_module_facts():
    assert repr(nnsparse.Sparsify()) == "Sparsify(elem=0, offset=0)"
    assert repr(nnsparse.Sparsify(math.nan, 3, torch.sparse_csr)) == \
        "Sparsify(elem=nan, offset=3, layout=torch.sparse_csr)"
    assert nnsparse.Sparsify().state_dict() == {}


def test_sparsify_errors():
    with pytest.raises(ValueError, match=r"offset must be a non-negative int, got -1"):
        nnsparse.Sparsify(offset=-1)
    with pytest.raises(TypeError, match=r"layout must be torch.sparse_coo or torch.sparse_csr"):
        nnsparse.Sparsify(layout=torch.strided)
    with pytest.raises(TypeError, match=r"x must be a dense tensor, got layout torch.sparse_coo"):
        nnsparse.Sparsify()(torch.eye(2).to_sparse())
    with pytest.raises(ValueError, match=r"layout torch.sparse_csr needs a 2-D x, got a vector"):
        nnsparse.Sparsify(layout=torch.sparse_csr)(torch.ones(3))


@pytest.mark.parametrize("offset, error", [
    (-1, ValueError), ("1", TypeError), (1.0, TypeError), (True, TypeError), (None, TypeError),
])
def test_sparsify_offset_errors(offset, error):
    # another kind than an int is a TypeError, a negative int a ValueError (as sparsify)
    with pytest.raises(error, match=f"^offset must be a non-negative int, got {offset!r}$"):
        nnsparse.Sparsify(offset=offset)
