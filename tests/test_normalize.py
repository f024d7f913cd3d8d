"""nnsparse.normalize against F.normalize of the densified batch, forward and backward."""
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

import nnsparse
from nnsparse._forms import as_sparse_batch
from matrix import (BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, LargestTensor, make_form,
                    random_sparse_dense)

NORMS = [2.0, 1.0, 3.0, 0.5, math.inf]


def _entries(x):
    b = as_sparse_batch(x, name="x").coalesce()
    return b.row, b.col, b.values


def _batch(dtype, device="cpu"):
    """6 x 7, the first row empty, the last row's specified values all 0."""
    dense = random_sparse_dense(6, 7, 0.4, empty_rows=1, dtype=dtype, device=device)
    dense[-1] = 0
    mask = dense != 0
    mask[5, :3] = True  # specified zeros: row 5, columns 0-2
    return dense, mask


def _specified(dense, mask, form):
    """``form`` of ``dense`` whose specified entries are ``mask`` (zeros included)."""
    index = mask.nonzero().t()
    coo = torch.sparse_coo_tensor(index, dense[index[0], index[1]], dense.shape).coalesce()
    if form == "coo":
        return coo
    if form == "csr":
        return coo.to_sparse_csr()
    if form == "coo_uncoalesced":
        i, v = coo.indices(), coo.values()
        perm = torch.randperm(2 * v.shape[0], generator=torch.Generator().manual_seed(1))
        return torch.sparse_coo_tensor(torch.cat([i, i], 1)[:, perm.to(i.device)],
                                       torch.cat([v * 0.25, v * 0.75])[perm.to(v.device)],
                                       dense.shape, check_invariants=False)
    rows = [torch.sparse_coo_tensor(mask[r].nonzero().t(), dense[r][mask[r]], (dense.shape[1],))
            for r in range(dense.shape[0])]
    if form == "list":
        return rows
    assert form == "pair_list"
    return [torch.stack([mask[r].nonzero().squeeze(1).to(dense.dtype), dense[r][mask[r]]], 1)
            for r in range(dense.shape[0])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
@pytest.mark.parametrize("p", NORMS, ids=str)
def test_matches_dense_forward_and_backward(form, dtype, device, p):
    dense, mask = _batch(dtype, device)
    leaf = dense.clone().requires_grad_()
    x = _specified(leaf, mask, form)
    y = nnsparse.normalize(x, p=p)
    if form in ("coo", "coo_uncoalesced", "csr"):
        assert y.layout == x.layout and y.shape == x.shape
        assert y.dtype == dtype and y.device == x.device
    else:
        assert isinstance(y, list) and len(y) == len(x)
    if form == "csr":  # on the input's own index tensors
        assert y.col_indices().data_ptr() == x.col_indices().data_ptr()
    row, col, values = _entries(y)
    assert torch.equal(torch.stack([row, col], 1), mask.nonzero())  # nothing specified added

    ref_leaf = dense.clone().requires_grad_()
    ref = F.normalize(ref_leaf, p=p, dim=1)
    torch.testing.assert_close(values, ref[row, col].detach(), **TOL[dtype])
    grad_out = torch.randn(dense.shape, generator=torch.Generator().manual_seed(2),
                           dtype=dtype).to(device)
    (values * grad_out[row, col]).sum().backward()
    (ref * grad_out).sum().backward()
    # the zero row's gradient is grad_out / eps (1e12): relative tolerance
    torch.testing.assert_close(leaf.grad[mask], ref_leaf.grad[mask], **TOL[dtype])
    assert not leaf.grad[~mask].any()  # gradients at specified entries only


@pytest.mark.parametrize("dim", [1, -1])
def test_dim_minus_one_and_the_csr_rows_helper_agree(dim):
    dense, mask = _batch(torch.float64)
    x = _specified(dense, mask, "csr")
    torch.testing.assert_close(nnsparse.normalize(x, dim=dim).to_dense(),
                               F.normalize(dense, dim=1) * mask)


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced"])
@pytest.mark.parametrize("dim", [0, -1])
def test_a_vector_is_normalised_whole(form, dim):
    vector = random_sparse_dense(1, 9, 0.5, generator=torch.Generator().manual_seed(3))[0]
    y = nnsparse.normalize(make_form(vector, form), dim=dim)
    assert y.shape == vector.shape and y.dim() == 1
    torch.testing.assert_close(y.to_dense(), F.normalize(vector, dim=0))


def test_a_wrapped_pair_tensor_is_a_batch_of_one():
    # a lone pair tensor is dense (values_map's rule): wrapped in a list it is one row
    vector = random_sparse_dense(1, 9, 0.5, generator=torch.Generator().manual_seed(3))[0]
    y = nnsparse.normalize([make_form(vector, "pairs")])[0]
    torch.testing.assert_close(y[:, 1], F.normalize(vector, dim=0)[vector != 0])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_sums_as_torch(dtype):
    # 300 ** 2 overflows float16: torch's norm sums in float32, so does normalize
    dense = torch.tensor([[300., 0., 400.], [0., 0., 0.], [0., -2., 0.]], dtype=dtype)
    leaf = dense.clone().requires_grad_()
    y = nnsparse.normalize(leaf.to_sparse())
    ref_leaf = dense.clone().requires_grad_()
    ref = F.normalize(ref_leaf, dim=1)
    mask = dense != 0  # (torch's empty float16 row is NaN: eps=1e-12 is 0 in float16)
    assert y.dtype == dtype
    torch.testing.assert_close(y.to_dense()[mask], ref[mask])
    y.values().sum().backward()
    ref[mask].sum().backward()
    torch.testing.assert_close(leaf.grad[mask], ref_leaf.grad[mask])


def test_dim_may_be_a_numpy_int():
    np = pytest.importorskip("numpy")
    x = torch.tensor([[3., 0., 4.]]).to_sparse()
    torch.testing.assert_close(nnsparse.normalize(x, dim=np.int64(1)).values(),
                               torch.tensor([0.6, 0.8]))


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("p", [2.0, 1.0, 3.0, math.inf], ids=str)
def test_gradcheck_float64(layout, p):
    dense = random_sparse_dense(5, 6, 0.5, empty_rows=1)  # no row of zeros: 1/eps slope
    if p == math.inf:  # a tie for a row's largest |value| has no derivative
        dense = dense + torch.linspace(0, 0.01, 30, dtype=torch.float64).view(5, 6) * (dense != 0)
    coo = dense.to_sparse().coalesce()
    index, leaf = coo.indices(), coo.values().clone().requires_grad_()
    csr = dense.to_sparse_csr()
    crow, col = csr.crow_indices(), csr.col_indices()

    def fn(values):
        if layout == "coo":
            x = torch.sparse_coo_tensor(index, values, dense.shape, is_coalesced=True)
        else:
            x = torch.sparse_csr_tensor(crow, col, values, dense.shape)
        return as_sparse_batch(nnsparse.normalize(x, p=p), name="y").values

    assert torch.autograd.gradcheck(fn, (leaf,))


def test_complex_values_as_dense():
    dense = random_sparse_dense(4, 5, 0.5, empty_rows=1).to(torch.complex128)
    dense = dense * (1 + 2j)
    y = nnsparse.normalize(dense.to_sparse())
    torch.testing.assert_close(y.to_dense(), F.normalize(dense, dim=1))


def test_sparse_parts_and_torch_compile():
    dense, mask = _batch(torch.float64)
    parts = nnsparse.sparse_parts(_specified(dense, mask, "csr"))
    ref = F.normalize(dense, dim=1)
    compiled = torch.compile(lambda x: nnsparse.normalize(x), backend="eager", fullgraph=True)
    out = compiled(parts)
    assert isinstance(out, nnsparse.SparseParts) and out.col is parts.col
    torch.testing.assert_close(out.values, ref[mask])
    csr = _specified(dense, mask, "csr")  # a torch CSR tensor: the boundary runs it eagerly
    out = torch.compile(lambda x: nnsparse.normalize(x, p=1), backend="eager")(csr)
    torch.testing.assert_close(out.to_dense(), F.normalize(dense, p=1, dim=1) * mask)


def test_no_densification_of_a_wide_batch():
    index = torch.tensor([[0, 0, 9], [5, 10**9 - 1, 7]])
    values = torch.tensor([3., 4., -2.], requires_grad=True)
    x = torch.sparse_coo_tensor(index, values, (10, 10**9)).coalesce()
    with LargestTensor() as seen:
        y = nnsparse.normalize(x)
        y.values().sum().backward()
    assert seen.numel <= 10
    assert y.shape == x.shape
    torch.testing.assert_close(y.values(), torch.tensor([0.6, 0.8, -1.0]))


def test_dense_input_is_f_normalize():
    dense = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(nnsparse.normalize(dense, p=3, dim=0, eps=0.1),
                               F.normalize(dense, p=3, dim=0, eps=0.1))


def test_eps_is_the_smallest_divisor():
    x = torch.tensor([[1e-3, 0.], [0., 0.]]).to_sparse()
    torch.testing.assert_close(nnsparse.normalize(x, eps=0.1).values(), torch.tensor([1e-2]))


_BATCH = torch.tensor([[1., 0.], [0., 2.]]).to_sparse()
_VECTOR = torch.tensor([1., 0., 2.]).to_sparse()
BAD_INPUTS = [
    ("p a string", _BATCH, dict(p="2"), TypeError, r"p must be a number .*got str"),
    ("p a bool", _BATCH, dict(p=True), TypeError, r"p must be a number .*got bool"),
    ("dim a float", _BATCH, dict(dim=1.0), TypeError, r"dim must be an int, got float"),
    ("eps None", _BATCH, dict(eps=None), TypeError, r"eps must be a number, got NoneType"),
    # numpy's timedelta64 is an Integral to numbers (the house's is_real / is_int refuse it)
    ("p a timedelta", _BATCH, dict(p=np.timedelta64(2)), TypeError,
     r"^p must be a number \(the norm's exponent\), got timedelta64$"),
    ("dim a timedelta", _BATCH, dict(dim=np.timedelta64(1)), TypeError,
     r"^dim must be an int, got timedelta64$"),
    ("p NaN", _BATCH, dict(p=math.nan), ValueError, r"p and eps must not be NaN, got p=nan"),
    ("eps negative", _BATCH, dict(eps=-1.0), ValueError, r"eps must be >= 0 .*got -1.0"),
    ("p 0", _BATCH, dict(p=0), NotImplementedError, r"takes p > 0 .*got p=0.0"),
    ("p negative", _BATCH, dict(p=-2), NotImplementedError, r"takes p > 0 .*got p=-2.0"),
    ("columns", _BATCH, dict(dim=0), NotImplementedError,
     r"normalises rows \(dim=1 or -1\), got dim=0 \(columns\)"),
    ("columns, -2", _BATCH.to_sparse_csr(), dict(dim=-2), NotImplementedError,
     r"got dim=-2 \(columns\)"),
    ("dim 2 of a batch", _BATCH, dict(dim=2), IndexError,
     r"dim out of range for a 2-D sparse batch \(expected to be in range of \[-2, 1\]\), got 2"),
    ("dim 1 of a vector", _VECTOR, {}, IndexError,
     r"1-D sparse vector \(expected to be in range of \[-1, 0\]\), got 1"),
    ("integer values", torch.tensor([[1, 0], [0, 2]]).to_sparse(), {}, TypeError,
     r"floating-point or complex values \(as F.normalize\), got torch.int64"),
    ("bool values", [torch.tensor([True, False]).to_sparse()], {}, TypeError,
     r"floating-point or complex values .*got torch.bool"),
    ("dense integer", torch.tensor([[1, 0], [0, 2]]), {}, TypeError,
     r"floating-point or complex values \(as F.normalize\), got torch.int64"),
    ("3-D", torch.ones(2, 2, 2).to_sparse(), {}, ValueError,
     r"input must be a sparse vector or a 2-D sparse batch, got 3 dimensions"),
    ("not a tensor", "abc", {}, TypeError, r"input"),
]


@pytest.mark.parametrize("case", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_inputs(case):
    _, x, kwargs, error, message = case
    before = x.clone() if isinstance(x, torch.Tensor) else None
    with pytest.raises(error, match=message):
        nnsparse.normalize(x, **kwargs)
    if before is not None:  # a refused call changes nothing
        assert torch.equal(x.to_dense(), before.to_dense())


# -- the Normalize layer ---------------------------------------------------------------


@pytest.mark.parametrize("form", BATCH_FORMS)
@pytest.mark.parametrize("kwargs", [{}, dict(p=1), dict(p=math.inf, dim=-1, eps=0.5)], ids=str)
def test_layer_equals_the_function(form, kwargs):
    dense, mask = _batch(torch.float64)
    x = _specified(dense, mask, form)
    got = nnsparse.Normalize(**kwargs)(x)
    want = nnsparse.normalize(x, **kwargs)
    torch.testing.assert_close(_entries(got), _entries(want), rtol=0, atol=0)
    assert type(got) is type(want)
    if isinstance(want, torch.Tensor):
        assert got.layout == want.layout and got.shape == want.shape


def test_layer_on_dense_input_and_sparse_parts():
    dense = torch.randn(3, 4, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(nnsparse.Normalize(p=3, dim=0, eps=0.1)(dense),
                               F.normalize(dense, p=3, dim=0, eps=0.1))
    sparse_dense, mask = _batch(torch.float64)
    parts = nnsparse.sparse_parts(_specified(sparse_dense, mask, "csr"))
    out = nnsparse.Normalize()(parts)
    assert isinstance(out, nnsparse.SparseParts)
    torch.testing.assert_close(out.values, F.normalize(sparse_dense, dim=1)[mask])


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_layer_in_sequential_before_sparse_linear_batch(layout):
    # Mult-VAE's input: each user's row divided by its L2 norm, then the encoder
    dense, mask = _batch(torch.float64)
    x = _specified(dense, mask, "coo" if layout == torch.sparse_coo else "csr")
    torch.manual_seed(0)
    encoder = nnsparse.SparseLinearBatch(7, 3, dtype=torch.float64)
    net = torch.nn.Sequential(nnsparse.Normalize(), encoder)
    out = net(x)
    linear = net[1]
    ref = F.linear(F.normalize(dense * mask, dim=1), linear.weight, linear.bias)
    torch.testing.assert_close(out, ref)
    out.sum().backward()
    ref_weight_grad = linear.weight.grad.clone()
    linear.weight.grad = None
    F.linear(F.normalize(dense * mask, dim=1), linear.weight, linear.bias).sum().backward()
    torch.testing.assert_close(ref_weight_grad, linear.weight.grad)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_layer_gradcheck_float64(layout):
    dense = random_sparse_dense(5, 6, 0.5, empty_rows=1)  # no row of zeros: 1/eps slope
    coo = dense.to_sparse().coalesce()
    index, leaf = coo.indices(), coo.values().clone().requires_grad_()
    csr = dense.to_sparse_csr()
    crow, col = csr.crow_indices(), csr.col_indices()
    layer = nnsparse.Normalize(p=3)

    def fn(values):
        if layout == "coo":
            x = torch.sparse_coo_tensor(index, values, dense.shape, is_coalesced=True)
        else:
            x = torch.sparse_csr_tensor(crow, col, values, dense.shape)
        return as_sparse_batch(layer(x), name="y").values

    assert torch.autograd.gradcheck(fn, (leaf,))


def test_layer_keeps_python_numbers_and_repr():
    np = pytest.importorskip("numpy")
    layer = nnsparse.Normalize(p=np.float32(1), dim=np.int64(-1), eps=np.float64(0.5))
    assert (type(layer.p), type(layer.dim), type(layer.eps)) == (float, int, float)
    assert repr(layer) == "Normalize(p=1.0, dim=-1, eps=0.5)"
    assert repr(nnsparse.Normalize()) == "Normalize(p=2.0, dim=1, eps=1e-12)"
    assert layer.state_dict() == {} and list(layer.parameters()) == []


BAD_LAYER_ARGS = [
    ("p a string", dict(p="2"), TypeError,
     r"^p must be a number \(the norm's exponent\), got str$"),
    ("p a bool", dict(p=True), TypeError, r"^p must be a number .*got bool$"),
    ("p a tensor", dict(p=torch.tensor(2.)), TypeError, r"^p must be a number .*got Tensor$"),
    ("dim a float", dict(dim=1.0), TypeError, r"^dim must be an int, got float$"),
    ("dim None", dict(dim=None), TypeError, r"^dim must be an int, got NoneType$"),
    ("eps None", dict(eps=None), TypeError, r"^eps must be a number, got NoneType$"),
    ("p NaN", dict(p=math.nan), ValueError, r"^p and eps must not be NaN, got p=nan, eps=1e-12$"),
    ("eps NaN", dict(eps=math.nan), ValueError,
     r"^p and eps must not be NaN, got p=2.0, eps=nan$"),
    ("eps negative", dict(eps=-1.0), ValueError,
     r"^eps must be >= 0 \(the smallest divisor\), got -1.0$"),
    ("p 0", dict(p=0), NotImplementedError, r"^Normalize takes p > 0 .*got p=0.0$"),
    ("p negative", dict(p=-1), NotImplementedError, r"^Normalize takes p > 0 .*got p=-1.0$"),
]


@pytest.mark.parametrize("case", BAD_LAYER_ARGS, ids=[c[0] for c in BAD_LAYER_ARGS])
def test_layer_bad_constructor_arguments(case):
    _, kwargs, error, message = case
    with pytest.raises(error, match=message):
        nnsparse.Normalize(**kwargs)


BAD_LAYER_CALLS = [
    # an attribute assigned after construction is checked again at the call (as Densify's)
    ("p assigned a string", dict(p="2"), _BATCH, TypeError, r"^p must be a number"),
    ("eps assigned negative", dict(eps=-1.0), _BATCH, ValueError, r"^eps must be >= 0"),
    ("p 0 of a sparse batch", dict(p=0), _BATCH, NotImplementedError, r"takes p > 0 .*got p=0.0"),
    ("p 0 of a dense batch", dict(p=0), _BATCH.to_dense(), NotImplementedError,
     r"takes p > 0 .*got p=0.0"),
    ("columns", dict(dim=0), _BATCH, NotImplementedError, r"got dim=0 \(columns\)"),
    ("dim 1 of a vector", {}, _VECTOR, IndexError, r"1-D sparse vector"),
    ("integer values", {}, torch.tensor([[1, 0], [0, 2]]).to_sparse(), TypeError,
     r"floating-point or complex values \(as F.normalize\), got torch.int64"),
]


@pytest.mark.parametrize("case", BAD_LAYER_CALLS, ids=[c[0] for c in BAD_LAYER_CALLS])
def test_layer_bad_calls(case):
    _, assigned, x, error, message = case
    layer = nnsparse.Normalize()
    for name, value in assigned.items():
        setattr(layer, name, value)
    with pytest.raises(error, match=message):
        layer(x)


def test_an_int_beyond_floats_range_is_infinite():
    # float(10 ** 400) raised OverflowError naming nothing: read as inf, as the house's
    # real_float reads it (p: the largest |value|; eps: every row divided by inf)
    assert torch.equal(nnsparse.normalize(_BATCH, p=10 ** 400).values(),
                       nnsparse.normalize(_BATCH, p=math.inf).values())
    assert torch.equal(nnsparse.normalize(_BATCH, eps=10 ** 400).values(), torch.zeros(2))
