"""sparse_mm: sparse @ dense and dense @ sparse against dense references, forward and backward."""
import re

import pytest
import torch

import nnsparse
import nnsparse.matmul as mm
from nnsparse import _index
from nnsparse import sparse_mm
from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, LargestTensor, make_form, \
    random_sparse_dense

TORCH_FORMS = ["coo", "coo_uncoalesced", "csr"]


def _dense(shape, density, dtype, device, seed=0, empty_rows=0):
    g = torch.Generator().manual_seed(seed)
    if len(shape) == 2:
        return random_sparse_dense(*shape, density, dtype=dtype, device=device, generator=g,
                                   empty_rows=empty_rows)
    return torch.stack([random_sparse_dense(*shape[1:], density, dtype=dtype, device=device,
                                            generator=g) for _ in range(shape[0])])


def _leaf(form_value):
    return form_value.requires_grad_() if isinstance(form_value, torch.Tensor) else form_value


def _assert_same_pattern(grad, a):
    """The gradient has ``a``'s layout and ``a``'s pattern (coalesced COO for COO)."""
    assert grad.layout == a.layout and grad.shape == a.shape
    if a.layout == torch.sparse_coo:
        assert torch.equal(grad.coalesce().indices(), a.detach().coalesce().indices())
    else:
        assert torch.equal(grad.crow_indices(), a.crow_indices())
        assert torch.equal(grad.col_indices(), a.col_indices())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_sparse_dense_2d_matches_dense(device, dtype, form):
    d = _dense((9, 7), 0.3, dtype, device, empty_rows=2)
    a = _leaf(make_form(d, form))
    b = torch.randn(7, 4, dtype=dtype, device=device, requires_grad=True)
    out = sparse_mm(a, b)
    d_ref = d.clone().requires_grad_()
    b_ref = b.detach().clone().requires_grad_()
    ref = d_ref @ b_ref
    torch.testing.assert_close(out, ref, **TOL[dtype])
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(b.grad, b_ref.grad, **TOL[dtype])
    if form in TORCH_FORMS:
        _assert_same_pattern(a.grad, a)
        # masked semantics: the dense gradient read at the specified entries
        torch.testing.assert_close(a.grad.to_dense(), d_ref.grad * (d != 0), **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", TORCH_FORMS)
def test_dense_sparse_2d_matches_dense(device, dtype, form):
    d = _dense((7, 9), 0.3, dtype, device, seed=1, empty_rows=1)
    s = _leaf(make_form(d, form))
    a = torch.randn(5, 7, dtype=dtype, device=device, requires_grad=True)
    out = sparse_mm(a, s)
    d_ref, a_ref = d.clone().requires_grad_(), a.detach().clone().requires_grad_()
    ref = a_ref @ d_ref
    torch.testing.assert_close(out, ref, **TOL[dtype])
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(a.grad, a_ref.grad, **TOL[dtype])
    _assert_same_pattern(s.grad, s)
    torch.testing.assert_close(s.grad.to_dense(), d_ref.grad * (d != 0), **TOL[dtype])


def _batched_csr(nb, n, m, per_row, dtype, device, seed=0):
    """A batched CSR tensor: torch needs the same nnz in every matrix."""
    g = torch.Generator().manual_seed(seed)
    d = torch.zeros(nb, n, m, dtype=dtype)
    for k in range(nb):
        for i in range(1, n):  # row 0 stays empty
            cols = torch.randperm(m, generator=g)[:per_row]
            d[k, i, cols] = torch.randn(per_row, generator=g, dtype=dtype)
    d = d.to(device)
    return d, d.to_sparse_csr()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_batched_matches_dense(device, dtype, form, side):
    if form == "csr":
        d, s = _batched_csr(3, 6, 5, 2, dtype, device)
    else:
        d = _dense((3, 6, 5), 0.4, dtype, device)
        s = d.to_sparse()
        if form == "coo_uncoalesced":
            idx, val = s.indices(), s.values()
            s = torch.sparse_coo_tensor(torch.cat([idx, idx], 1), torch.cat([val / 2, val / 2]),
                                        s.shape)
            assert not s.is_coalesced()
    s.requires_grad_()
    dense = torch.randn(3, 5, 4, dtype=dtype, device=device) if side == "left" else \
        torch.randn(3, 2, 6, dtype=dtype, device=device)
    dense.requires_grad_()
    d_ref, dense_ref = d.clone().requires_grad_(), dense.detach().clone().requires_grad_()
    out = sparse_mm(s, dense) if side == "left" else sparse_mm(dense, s)
    ref = torch.bmm(d_ref, dense_ref) if side == "left" else torch.bmm(dense_ref, d_ref)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(dense.grad, dense_ref.grad, **TOL[dtype])
    _assert_same_pattern(s.grad, s)
    torch.testing.assert_close(s.grad.to_dense(), d_ref.grad * (d != 0), **TOL[dtype])


def test_values_behind_a_constructor_get_their_gradient():
    """A sparse tensor built from a values tensor passes the gradient on to it."""
    idx = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 2]])
    v = torch.tensor([1., 2., 3., 4.], dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, 2, dtype=torch.float64)
    sparse_mm(torch.sparse_coo_tensor(idx, v, (3, 3)), b).sum().backward()
    assert torch.allclose(v.grad, b.sum(1)[idx[1]])


def test_gradcheck_float64():
    d = _dense((5, 6), 0.4, torch.float64, "cpu")
    idx = d.to_sparse().indices()
    v = d[tuple(idx)].clone().requires_grad_()
    b = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    c = torch.randn(2, 5, dtype=torch.float64, requires_grad=True)
    crow, col = d.to_sparse_csr().crow_indices(), d.to_sparse_csr().col_indices()

    def left(v, b):
        return sparse_mm(torch.sparse_coo_tensor(idx, v, (5, 6)), b)

    def right(v, c):
        return sparse_mm(c, nnsparse.values._csr_with_values(crow, col, v, (5, 6)))

    assert torch.autograd.gradcheck(left, (v, b))
    assert torch.autograd.gradcheck(right, (v, c))


def test_masked_gradcheck_on_a_sparse_leaf():
    a = _dense((4, 5), 0.5, torch.float64, "cpu").to_sparse().requires_grad_()
    b = torch.randn(5, 2, dtype=torch.float64, requires_grad=True)
    gradcheck = torch.sparse.as_sparse_gradcheck(torch.autograd.gradcheck)
    assert gradcheck(sparse_mm, (a, b), masked=True)


@pytest.mark.parametrize("wanted", ["A", "B"])
def test_each_gradient_only_when_needed(monkeypatch, wanted):
    calls = []
    real_sampled = mm._sampled
    monkeypatch.setattr(mm, "_sampled", lambda *a: calls.append("A") or real_sampled(*a))
    a = _dense((6, 5), 0.5, torch.float64, "cpu").to_sparse().requires_grad_(wanted == "A")
    b = torch.randn(5, 3, dtype=torch.float64, requires_grad=wanted == "B")
    _index.COUNTS.clear()
    sparse_mm(a, b).sum().backward()
    # B's gradient needs the transposed structure (built lazily), A's the sampled product
    transposed = _index.COUNTS["column_major_all"]
    calls += ["B"] * transposed
    assert calls == [wanted]


def test_never_builds_a_dense_sparse_operand():
    a = _dense((300, 400), 0.01, torch.float32, "cpu").to_sparse().requires_grad_()
    b = torch.randn(400, 8, requires_grad=True)
    with LargestTensor() as seen:
        sparse_mm(a, b).sum().backward()
        sparse_mm(torch.randn(8, 300), a).sum().backward()
    assert seen.numel < 300 * 400 // 10, seen.op


@pytest.mark.parametrize("shape_a,shape_b", [((0, 4), (4, 3)), ((3, 4), (4, 0)), ((3, 0), (0, 2)),
                                             ((2, 0, 4), (2, 4, 3)), ((0, 3, 4), (0, 4, 2))])
def test_empty_shapes(shape_a, shape_b):
    a = torch.zeros(shape_a).to_sparse().requires_grad_()
    b = torch.randn(shape_b, requires_grad=True)
    out = sparse_mm(a, b)
    assert out.shape == torch.Size(shape_a[:-1] + shape_b[-1:])
    out.sum().backward()
    assert b.grad.shape == b.shape and not b.grad.any()


def test_no_specified_entry():
    a = torch.zeros(3, 4).to_sparse().requires_grad_()
    b = torch.randn(4, 2, requires_grad=True)
    out = sparse_mm(a, b)
    out.sum().backward()
    assert not out.any() and a.grad._nnz() == 0 and not b.grad.any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    d = _dense((20, 30), 0.2, torch.float32, "cpu")
    a = d.to(dtype).to_sparse().requires_grad_()
    b = torch.randn(30, 5, dtype=dtype, requires_grad=True)
    out = sparse_mm(a, b)
    out.sum().backward()
    assert out.dtype == dtype and a.grad.dtype == dtype and b.grad.dtype == dtype
    ref = d.to(dtype).float() @ b.float()
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=5e-2)
    g_ref = torch.ones(20, 5) @ b.detach().float().t()
    torch.testing.assert_close(a.grad.to_dense().float(), g_ref * (d != 0), rtol=2e-2, atol=5e-2)


def test_sparse_on_the_right_needs_a_dense_left():
    s = torch.eye(3).to_sparse()
    out = sparse_mm(torch.ones(2, 3), [r.to_sparse() for r in torch.eye(3)])
    assert torch.equal(out, torch.ones(2, 3))
    assert torch.equal(sparse_mm(torch.ones(2, 3), s), torch.ones(2, 3))


S2 = torch.eye(3).to_sparse()
S3 = torch.stack([torch.eye(3)] * 2).to_sparse()


def _csr(crow, col, size):
    """A CSR tensor that may break torch's invariants (nnsparse checks them)."""
    crow, col = torch.tensor(crow), torch.tensor(col)
    return torch.sparse_csr_tensor(crow, col, torch.ones(col.shape), size, check_invariants=False)


BAD = [
    (S2, torch.ones(4, 2), ValueError, "Incompatible inner dimensions: A[..., 3] vs B[4, ...]"),
    (torch.ones(2, 4), S2, ValueError, "Incompatible inner dimensions: A[..., 4] vs B[3, ...]"),
    (S2, torch.ones(3), ValueError, "B must be 2-D like the sparse operand"),
    (S3, torch.ones(3, 2), ValueError, "B must be 3-D like the sparse operand"),
    (S3, torch.ones(3, 3, 2), ValueError, "same batch size, got 2 and 3"),
    (torch.ones(3, 2, 3), S3, ValueError, "same batch size, got 3 and 2"),
    (S2, torch.ones(3, 2, dtype=torch.float64), ValueError, "dtype torch.float32, got torch.float64"),
    (S2, torch.ones(3, 2, dtype=torch.int64), TypeError, "floating-point tensor, got torch.int64"),
    (S2, 3.0, TypeError, "B must be a dense torch.Tensor, got float"),
    (torch.ones(3, 3), torch.ones(3, 3), TypeError, "got two dense tensors"),
    ("A", torch.ones(3, 3), TypeError, "A must be a sparse or dense torch.Tensor, got str"),
    (torch.ones(3, 3), "B", TypeError, "B must be a torch.Tensor, got str"),
    (S2, S2, NotImplementedError, "got two sparse ones"),
    (torch.ones(3).to_sparse(), torch.ones(3, 2), ValueError, "2-D or 3-D sparse matrix, got shape (3,)"),
    (torch.ones(2, 2, 2, 2).to_sparse(), torch.ones(2, 2), ValueError, "2-D or 3-D sparse matrix"),
    (torch.eye(3).to_sparse(1), torch.ones(3, 2), NotImplementedError, "hybrid"),
    (torch.stack([torch.eye(3)] * 2).to_sparse(2), torch.ones(2, 3, 2), NotImplementedError,
     "hybrid"),
    (torch.eye(3).to_sparse_csc(), torch.ones(3, 2), NotImplementedError, "layout"),
    (torch.sparse_coo_tensor(torch.tensor([[0], [5]]), torch.ones(1), (3, 3),
                             check_invariants=False), torch.ones(3, 2), ValueError,
     "A column indices must be in [0, 3), got max 5"),
    (torch.sparse_coo_tensor(torch.tensor([[0], [0], [7]]), torch.ones(1), (2, 3, 3),
                             check_invariants=False), torch.ones(2, 3, 2), ValueError,
     "A column indices must be in [0, 3), got max 7"),
    (torch.sparse_coo_tensor(torch.tensor([[4], [0], [0]]), torch.ones(1), (2, 3, 3),
                             check_invariants=False), torch.ones(2, 3, 2), ValueError,
     "A batch indices must be in [0, 2), got max 4"),
    (torch.sparse_coo_tensor(torch.tensor([[0], [-1]]), torch.ones(1), (2, 3),
                             check_invariants=False), torch.ones(3, 2), ValueError,
     "A column indices must be non-negative, got min -1"),
    (torch.sparse_coo_tensor(torch.tensor([[0], [-1], [0]]), torch.ones(1), (2, 3, 3),
                             check_invariants=False), torch.ones(2, 3, 2), ValueError,
     "A row indices must be non-negative, got min -1"),
    # invalid CSR, 2-D and batched
    (_csr([1, 1, 2], [0, 1], (2, 3)), torch.ones(3, 2), ValueError,
     "A crow_indices must start at 0, got 1"),
    (_csr([0, 1, 1], [0, 1], (2, 3)), torch.ones(3, 2), ValueError,
     "A crow_indices must end at nnz = 2 (the number of column indices), got 1"),
    (_csr([0, 2, 1, 2], [0, 1], (3, 3)), torch.ones(3, 2), ValueError,
     "A crow_indices must be non-decreasing, got a step of -1"),
    (_csr([0, 2, 2], [1, 0], (2, 3)), torch.ones(3, 2), ValueError,
     "A column indices must increase within each row"),
    (_csr([0, 1, 2], [0, 5], (2, 3)), torch.ones(3, 2), ValueError,
     "A column indices must be in [0, 3), got max 5"),
    (torch.ones(2, 3), _csr([0, 1, 2, 2], [0, 7], (3, 4)), ValueError,
     "B column indices must be in [0, 4), got max 7"),
    (_csr([[0, 1, 1], [1, 1, 1]], [[0], [0]], (2, 2, 3)), torch.ones(2, 3, 2), ValueError,
     "A crow_indices must start at 0 in every matrix, got 1"),
    (_csr([[0, 1, 1], [0, 0, 0]], [[0], [0]], (2, 2, 3)), torch.ones(2, 3, 2), ValueError,
     "A crow_indices must end at nnz = 1 (the column indices per matrix) in every matrix, got 0"),
    (_csr([[0, 2, 1, 2], [0, 1, 1, 2]], [[0, 1], [0, 1]], (2, 3, 3)), torch.ones(2, 3, 2), ValueError,
     "A crow_indices must be non-decreasing"),
    (_csr([[0, 1, 1], [0, 0, 1]], [[0], [9]], (2, 2, 3)), torch.ones(2, 3, 2), ValueError,
     "A column indices must be in [0, 3), got max 9"),
    (_csr([[0, 2, 2], [0, 0, 2]], [[1, 0], [0, 1]], (2, 2, 3)), torch.ones(2, 3, 2), ValueError,
     "A column indices must increase within each row"),
    (torch.stack([torch.eye(3)] * 2).to_sparse_csc(), torch.ones(2, 3, 2), NotImplementedError,
     "A: layout torch.sparse_csc is not supported"),
    # dtype and kind, sparse on either side
    (torch.eye(3, dtype=torch.int64).to_sparse(), torch.ones(3, 2), TypeError,
     "A must be a floating-point sparse matrix, got torch.int64"),
    (torch.ones(2, 3), torch.eye(3, dtype=torch.int64).to_sparse(), TypeError,
     "B must be a floating-point sparse matrix, got torch.int64"),
    (torch.ones(2, 3, dtype=torch.float64), S2, ValueError,
     "A must have the sparse operand's dtype torch.float32, got torch.float64"),
    (torch.ones(2, 3, dtype=torch.int64), S2, TypeError,
     "A must be a floating-point tensor, got torch.int64"),
    (torch.ones(2, 2, 3), S2, ValueError, "A must be 2-D like the sparse operand, got shape (2, 2, 3)"),
    (torch.ones(2, 3), S3, ValueError, "A must be 3-D like the sparse operand"),
    ([1, 2], torch.ones(3, 2), TypeError, "A[0] must be a tensor, got int"),
    ([S2[0], "x"], torch.ones(3, 2), TypeError, "A[1] must be a tensor, got str"),
    (None, torch.ones(3, 2), TypeError, "A must be a sparse or dense torch.Tensor, got NoneType"),
    (S2, None, TypeError, "B must be a dense torch.Tensor, got NoneType"),
    # a nested list of numbers is no list of sparse rows: the (wrong) dense operand, by name
    (S2, [[1.0, 2.0]] * 3, TypeError, "B must be a dense torch.Tensor, got list"),
    ([[1.0, 2.0]] * 2, S2, TypeError, "A must be a dense torch.Tensor, got list"),
    ([S2[0]], [S2[0]], NotImplementedError, "got two sparse ones"),
]


@pytest.mark.parametrize("a,b,exc,msg", BAD, ids=[f"{i}-{m[:30]}" for i, (*_, m) in enumerate(BAD)])
def test_bad_inputs(a, b, exc, msg):
    with pytest.raises(exc, match=re.escape(msg)):
        sparse_mm(a, b)


def test_device_mismatch():
    # a meta tensor stands for "another device" on a CPU-only machine
    with pytest.raises(ValueError, match="B must be on the sparse operand's device cpu, got meta"):
        sparse_mm(S2, torch.ones(3, 2, device="meta"))
    with pytest.raises(ValueError, match="A must be on the sparse operand's device cpu, got meta"):
        sparse_mm(torch.ones(2, 3, device="meta"), S2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")
@pytest.mark.parametrize("sparse_on", ["cpu", "cuda"])
def test_device_mismatch_cuda(sparse_on):
    dense_on = "cpu" if sparse_on == "cuda" else "cuda"
    s = S2.to(sparse_on)
    with pytest.raises(ValueError, match=f"B must be on the sparse operand's device {sparse_on}"):
        sparse_mm(s, torch.ones(3, 2, device=dense_on))
    with pytest.raises(ValueError, match=f"A must be on the sparse operand's device {sparse_on}"):
        sparse_mm(torch.ones(2, 3, device=dense_on), s)


@pytest.mark.parametrize("form", ["coo", "csr"])
@pytest.mark.parametrize("batched", [False, True])
def test_checked_once_and_transposed_built_once(form, batched):
    """A leaf multiplied every step is validated and transposed at its first use only."""
    d = _dense((6, 5), 0.5, torch.float64, "cpu")
    d = torch.stack([d, -2 * d]) if batched else d  # batched CSR: the same nnz per matrix
    a = d.to_sparse() if form == "coo" else d.to_sparse_csr()
    a.requires_grad_()
    _index.COUNTS.clear()
    for _ in range(3):
        b = torch.randn(*d.shape[:-2], 5, 3, dtype=torch.float64, requires_grad=True)
        sparse_mm(a, b).sum().backward()
        sparse_mm(torch.randn(*d.shape[:-2], 4, 6, dtype=torch.float64), a).sum().backward()
    built = _index.COUNTS["column_major_all"]
    assert built == 1 and _index.COUNTS["validate"] <= 1
    b.grad = None
    assert torch.allclose(sparse_mm(a, b), d @ b)


def test_a_changed_tensor_is_checked_again():
    a = torch.stack([torch.eye(3)] * 2).to_sparse()
    sparse_mm(a, torch.ones(2, 3, 1))
    with torch.no_grad():
        a._indices()[2, 0] = 5  # an in-place change of the indices bumps their version
    with pytest.raises(ValueError, match=r"A column indices must be in \[0, 3\), got max 5"):
        sparse_mm(a, torch.ones(2, 3, 1))



def test_a_3d_structure_is_cached_by_the_forms_helpers():
    """The flat pattern of a 3-D tensor is cached with nnsparse._forms' _attach/_cached under
    matmul's own attribute: reused while the tensor is unchanged, never read as a 2-D batch's
    structure, and forgotten once the indices change."""
    from nnsparse import _forms
    a = torch.stack([torch.eye(3)] * 2).to_sparse()
    sparse_mm(a, torch.ones(2, 3, 1))
    flat = _forms._cached(a, mm._ATTR, mm._Flat)
    assert flat is not None and _forms._attached(a) is None
    assert _forms._cached(a, mm._ATTR, _forms._Attached) is None
    sparse_mm(a, torch.ones(2, 3, 1))
    assert _forms._cached(a, mm._ATTR, mm._Flat) is flat
    with torch.no_grad():
        a._indices()[2, 0] = 1
    assert _forms._cached(a, mm._ATTR, mm._Flat) is None
    sparse_mm(a, torch.ones(2, 3, 1))
    assert _forms._cached(a, mm._ATTR, mm._Flat) not in (None, flat)


def _sparse_weight_layer():
    layer = nnsparse.SparseWeightLinear(torch.eye(4, 6).to_sparse())
    return layer  # it multiplies its weight by the input's transpose: a non-contiguous view


@pytest.mark.parametrize("make, shape", [
    pytest.param(lambda: (lambda t: sparse_mm(torch.eye(3, 4).to_sparse(), t.t())), (5, 4),
                 id="sparse_mm-B-transposed"),
    pytest.param(_sparse_weight_layer, (3, 6), id="SparseWeightLinear-input"),
])
def test_a_non_contiguous_operand_changed_after_the_forward(make, shape):
    """A non-contiguous dense operand is copied for the product, and the copy is what the
    backward reads (as before the torch.func change): changing the caller's tensor in place
    after the forward is no error, and the gradients are those of the values read."""
    torch.manual_seed(0)
    product = make()
    start = torch.randn(*shape)
    t = start.clone().requires_grad_()
    out = product(t)
    with torch.no_grad():
        t.add_(1.0)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    reference = start.clone().requires_grad_()
    (product(reference) * weights).sum().backward()
    assert torch.allclose(t.grad, reference.grad)


@pytest.mark.parametrize("layout", ["coo", "csr"])
def test_a_3d_structure_is_walked_for_inference_tensors_only_after_inference_mode(
        layout, monkeypatch):
    """A cached flat pattern is looked through for inference tensors only when it was
    used under ``torch.inference_mode()`` since (the batch cache's rule, nnsparse._forms),
    not at every call."""
    from nnsparse import matmul
    walks = []
    original = matmul._Flat.holds_inference
    monkeypatch.setattr(matmul._Flat, "holds_inference",
                        lambda self: walks.append(1) or original(self))
    dense, csr = _batched_csr(2, 3, 4, 2, torch.float32, "cpu")
    a = csr if layout == "csr" else dense.to_sparse()
    b = torch.randn(2, 4, 5, requires_grad=True)
    for _ in range(3):
        sparse_mm(a, b).sum().backward()
    assert walks == []
    with torch.inference_mode():
        sparse_mm(a, b.detach())
    sparse_mm(a, b).sum().backward()  # after the evaluation pass: one walk, then none
    sparse_mm(a, b).sum().backward()
    assert walks == [1]


@pytest.mark.parametrize("layout", ["coo", "csr"])
@pytest.mark.parametrize("how", ["made-in-inference-mode", "read-in-inference-mode"])
def test_a_3d_tensor_of_inference_mode_then_trains(layout, how):
    """A batched (3-D) sparse operand made under ``torch.inference_mode()``, or an ordinary
    one first multiplied in that mode (an evaluation pass), then multiplied in training:
    B's gradient as for a tensor never seen in that mode (the flat structure cached there
    held inference tensors: "Inference tensors cannot be saved for backward")."""
    dense, csr = _batched_csr(2, 3, 4, 2, torch.float32, "cpu")

    def make():
        return csr.clone() if layout == "csr" else dense.to_sparse()

    b = torch.randn(2, 4, 5)
    if how == "made-in-inference-mode":
        with torch.inference_mode():
            a = make()
    else:
        a = make()
        with torch.inference_mode():
            sparse_mm(a, b)
    grads = []
    for operand in (a, make()):
        leaf = b.clone().requires_grad_()
        out = sparse_mm(operand, leaf)
        out.square().sum().backward()
        grads.append((out.detach(), leaf.grad))
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[1][0], torch.bmm(dense, b))
