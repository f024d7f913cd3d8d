"""The custom operators of nnsparse/_ops.py: dense references, opcheck, gradcheck."""
import pytest
import torch

import nnsparse
from nnsparse import _ops  # noqa: F401  (registers the operators)
from tests.matrix import DEVICES, FLOAT_DTYPES, TOL, random_sparse_dense

ops = torch.ops.nnsparse
# Patterns: ordinary, with empty rows, and with no entry at all.
CASES = {"plain": dict(rows=5, density=0.4, empty_rows=0),
         "empty_rows": dict(rows=5, density=0.4, empty_rows=2),
         "nnz0": dict(rows=3, density=0.0, empty_rows=0)}


def _pattern(case, width, dtype, device):
    dense = random_sparse_dense(CASES[case]["rows"], width, CASES[case]["density"], dtype=dtype,
                                device=device, empty_rows=CASES[case]["empty_rows"])
    return dense, nnsparse.sparse_parts(dense.to_sparse_csr())


def _opcheck(case, op, args):
    """torch.library.opcheck (schema, fake tensor, autograd registration, aot_dispatch).

    On the empty-row pattern only (it covers the plain one): opcheck runs each
    operator many times and the suite must stay fast.
    """
    if case == "empty_rows":
        torch.library.opcheck(op, args)


def _randn(*shape, dtype, device, grad=True):
    g = torch.Generator().manual_seed(sum(shape))
    return torch.randn(*shape, generator=g, dtype=dtype).to(device).requires_grad_(grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_sparse_mm(case, dtype, device):
    dense, p = _pattern(case, 6, dtype, device)
    table, bias = _randn(6, 4, dtype=dtype, device=device), _randn(4, dtype=dtype, device=device)
    values = p.values.clone().requires_grad_()
    out = ops.sparse_mm(p.crow, p.col, values, table, bias)
    torch.testing.assert_close(out, dense @ table + bias, **TOL[dtype])
    grad = _randn(*out.shape, dtype=dtype, device=device, grad=False)
    out.backward(grad)
    ref_table, ref_bias = table.detach().requires_grad_(), bias.detach().requires_grad_()
    ref_dense = dense.clone().requires_grad_()
    (ref_dense @ ref_table + ref_bias).backward(grad)
    torch.testing.assert_close(table.grad, ref_table.grad, **TOL[dtype])
    torch.testing.assert_close(bias.grad, ref_bias.grad, **TOL[dtype])
    row = torch.repeat_interleave(torch.arange(dense.shape[0], device=device), p.crow.diff())
    # the values' gradient only at the specified entries
    torch.testing.assert_close(values.grad, ref_dense.grad[row, p.col], **TOL[dtype])
    _opcheck(case, ops.sparse_mm.default, (p.crow, p.col, values, table, bias))
    _opcheck(case, ops.sparse_mm.default, (p.crow, p.col, p.values, table, None))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_sampled_mm(case, dtype, device):
    dense, p = _pattern(case, 6, dtype, device)
    h, weight = _randn(dense.shape[0], 3, dtype=dtype, device=device), _randn(6, 3, dtype=dtype,
                                                                             device=device)
    bias = _randn(6, dtype=dtype, device=device)
    out = ops.sampled_mm(h, weight, bias, p.crow, p.col)
    row = torch.repeat_interleave(torch.arange(dense.shape[0], device=device), p.crow.diff())
    full = h @ weight.t() + bias
    torch.testing.assert_close(out, full[row, p.col], **TOL[dtype])
    grad = _randn(out.shape[0], dtype=dtype, device=device, grad=False)
    got = torch.autograd.grad(out, (h, weight, bias), grad)
    ref = torch.autograd.grad(full[row, p.col], (h, weight, bias), grad)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    _opcheck(case, ops.sampled_mm.default, (h, weight, bias, p.crow, p.col))
    _opcheck(case, ops.sampled_mm.default, (h, weight.detach(), None, p.crow, p.col))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_sparse_t_mm(case, dtype, device):
    dense, p = _pattern(case, 6, dtype, device)
    values = p.values.clone().requires_grad_()
    d = _randn(dense.shape[0], 3, dtype=dtype, device=device)
    out = ops.sparse_t_mm(p.crow, p.col, values, d, 6)
    torch.testing.assert_close(out, dense.t() @ d, **TOL[dtype])
    _opcheck(case, ops.sparse_t_mm.default, (p.crow, p.col, values, d, 6))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", ["empty_rows"])
def test_gradcheck_float64(case, device):
    """Every operator's backward, and the backward of the backward (they call each other)."""
    dense, p = _pattern(case, 5, torch.float64, device)
    rows = dense.shape[0]
    values = p.values.clone().requires_grad_()
    table, bias = _randn(5, 3, dtype=torch.float64, device=device), _randn(
        3, dtype=torch.float64, device=device)
    h, w = _randn(rows, 2, dtype=torch.float64, device=device), _randn(5, 2, dtype=torch.float64,
                                                                      device=device)
    wb = _randn(5, dtype=torch.float64, device=device)
    fns = [(lambda v, t, b: ops.sparse_mm(p.crow, p.col, v, t, b), (values, table, bias)),
           (lambda h, w, b: ops.sampled_mm(h, w, b, p.crow, p.col), (h, w, wb)),
           (lambda v, d: ops.sparse_t_mm(p.crow, p.col, v, d, 5), (values, h))]
    for fn, args in fns:
        assert torch.autograd.gradcheck(fn, args)
        assert torch.autograd.gradgradcheck(fn, args, fast_mode=True)


def test_needs_input_grad_honoured():
    """No gradient is computed for inputs that do not require one (values, here)."""
    _, p = _pattern("plain", 6, torch.float64, "cpu")
    table = _randn(6, 4, dtype=torch.float64, device="cpu")
    out = ops.sparse_mm(p.crow, p.col, p.values, table, None)
    assert not p.values.requires_grad
    out.sum().backward()
    assert p.values.grad is None and table.grad is not None


def test_sparse_parts_forms():
    """COO (uncoalesced too), CSR and list inputs give the same coalesced parts."""
    dense = random_sparse_dense(4, 6, 0.5, dtype=torch.float32, empty_rows=1)
    ref = nnsparse.sparse_parts(dense.to_sparse_csr())
    coo = dense.to_sparse()
    doubled = torch.sparse_coo_tensor(torch.cat([coo.indices()] * 2, 1),
                                      torch.cat([coo.values() * 0.5] * 2), coo.shape)
    for x in (coo, doubled, [r.to_sparse() for r in dense]):
        got = nnsparse.sparse_parts(x)
        assert got.size == ref.size == (4, 6)
        for a, b in zip(got[:3], ref[:3]):
            torch.testing.assert_close(a, b)
        assert not any(t._is_view() for t in got[:3])  # dynamo cannot fake a sparse base
    torch.testing.assert_close(ref.to_sparse_csr().to_dense(), dense)


@pytest.mark.parametrize("bad, error, message", [
    (torch.ones(3).to_sparse(), ValueError, "x must be a 2-D sparse batch, got a vector"),
    (torch.ones(2, 3), TypeError, "x must be sparse, got a dense"),
    ("text", TypeError, "x must be a sparse tensor"),
])
def test_sparse_parts_errors(bad, error, message):
    with pytest.raises(error, match=message):
        nnsparse.sparse_parts(bad)


@pytest.mark.parametrize("device", DEVICES)
def test_parts_methods(device):
    """to() moves every tensor, with_values keeps the pattern, to_sparse_csr round-trips."""
    dense = random_sparse_dense(4, 6, 0.5, dtype=torch.float32, empty_rows=1)
    parts = nnsparse.sparse_parts(dense.to_sparse_csr()).to(device)
    assert all(t.device.type == device for t in parts[:3]) and parts.size == (4, 6)
    doubled = parts.with_values(parts.values * 2)
    assert doubled.crow is parts.crow and doubled.col is parts.col
    torch.testing.assert_close(doubled.to_sparse_csr().to_dense(), 2 * dense.to(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_types(device, dtype):
    """A half-precision model (``.half()``, no autocast): computed in float32, returned in dtype."""
    dense, p = _pattern("empty_rows", 6, torch.float32, device)
    h, w = torch.randn(dense.shape[0], 3, device=device), torch.randn(6, 3, device=device)
    row = torch.repeat_interleave(torch.arange(dense.shape[0], device=device), p.crow.diff())
    out = ops.sampled_mm(h.to(dtype), w.to(dtype), None, p.crow, p.col)
    assert out.dtype == dtype
    ref = (h.to(dtype).float() @ w.to(dtype).float().t())[row, p.col]
    torch.testing.assert_close(out.float(), ref, rtol=1e-2, atol=1e-2)
    out = ops.sparse_mm(p.crow, p.col, p.values.to(dtype), w.to(dtype), None)
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), dense @ w, rtol=3e-2, atol=3e-2)


@pytest.mark.parametrize("size, error", [
    ("ab", TypeError), (None, TypeError), ((2.0, 3), TypeError), ((True, 3), TypeError),
    ((2, 3, 4), ValueError), ((2,), ValueError), ((-1, 3), ValueError),
])
def test_sparse_parts_size_errors(size, error):
    # another kind than a sequence of ints is a TypeError, a wrong length or sign a ValueError
    import re
    parts = nnsparse.sparse_parts(torch.eye(2, 3).to_sparse_csr())._replace(size=size)
    with pytest.raises(error, match=r"^parts.size must be \(rows, width\), two non-negative ints, "
                                    r"got " + re.escape(repr(size)) + "$"):
        parts.to_sparse_csr()


def test_parts_under_inference_mode():
    """Parts made or built by hand under torch.inference_mode (tensors with no version
    counter) are checked and used: the check's key reads no version of them."""
    x = nnsparse.sparsify(torch.tensor([[0., 1., 2.], [3., 0., 0.]]))
    lin, out = nnsparse.SparseLinearBatch(3, 2), nnsparse.SparseOutputLinear(2, 3)
    with torch.inference_mode():
        parts = nnsparse.sparse_parts(x)
        by_hand = nnsparse.SparseParts(torch.tensor([0, 2, 3]), torch.tensor([1, 2, 0]),
                                       torch.tensor([1., 2., 3.]), (2, 3))
        torch.testing.assert_close(lin(by_hand), lin(parts))
        assert out(lin(parts), parts).values.shape == (3,)
        bad = by_hand._replace(crow=torch.tensor([0, 2, 4]))
        with pytest.raises(ValueError):
            lin(bad)
