"""SparseOutputLinear / sampled_linear against nn.Linear's dense output, masked."""
import copy
import pickle

import pytest
import torch
from torch import nn

import nnsparse
from nnsparse._forms import as_sparse_batch
from matrix import BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, make_form, random_sparse_dense


def _positions(out):
    batch = as_sparse_batch(out, name="out")
    return batch.row, batch.col, batch.values


def _check_against_dense(dense_pattern, form, dtype, device, *, bias=True, sparse_grad=False,
                         seed=0, in_features=5):
    g = torch.Generator().manual_seed(seed)
    rows, out_features = dense_pattern.shape
    h = torch.randn(rows, in_features, generator=g, dtype=dtype).to(device).requires_grad_()
    ref = nn.Linear(in_features, out_features, bias=bias).to(device=device, dtype=dtype)
    layer = nnsparse.SparseOutputLinear(in_features, out_features, bias=bias,
                                        sparse_grad=sparse_grad).to(device=device, dtype=dtype)
    layer.load_state_dict(ref.state_dict())
    grad_out = torch.randn(rows, out_features, generator=g, dtype=dtype).to(device)
    mask = (dense_pattern != 0).to(dtype)

    out = layer(h, make_form(dense_pattern, form))
    # exactly the target's positions, one value each
    row, col, values = _positions(out)
    expected = mask.nonzero()
    got = torch.stack([row, col], 1)
    assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, expected.tolist()))
    assert out.layout == (torch.sparse_csr if form == "csr" else torch.sparse_coo)

    dense_out = ref(h)
    torch.testing.assert_close(values, dense_out[row, col], **TOL[dtype])
    (values * grad_out[row, col]).sum().backward()
    grad_h = h.grad.clone()
    h.grad = None
    (dense_out * grad_out * mask).sum().backward()
    torch.testing.assert_close(grad_h, h.grad, **TOL[dtype])
    grads = [(layer.weight.grad, ref.weight.grad)]
    if bias:
        grads.append((layer.bias.grad, ref.bias.grad))
    for got_grad, ref_grad in grads:
        assert got_grad.is_sparse == sparse_grad
        if sparse_grad:
            # only the output columns the pattern touches are stored
            touched = mask.sum(0).nonzero().squeeze(1)
            assert torch.equal(got_grad._indices()[0], touched)
            got_grad = got_grad.to_dense()
        torch.testing.assert_close(got_grad, ref_grad, **TOL[dtype])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
@pytest.mark.parametrize("sparse_grad", [False, True])
def test_matches_masked_linear(form, dtype, device, sparse_grad):
    pattern = random_sparse_dense(6, 9, 0.35, empty_rows=2, dtype=dtype, device=device)
    _check_against_dense(pattern, form, dtype, device, sparse_grad=sparse_grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("form", ["coo", "csr"])
@pytest.mark.parametrize("sparse_grad", [False, True])
def test_zero_input_width(form, dtype, sparse_grad):
    # h of shape (rows, 0): float32's embedding_bag refuses a zero-width table
    pattern = random_sparse_dense(4, 6, 0.5, dtype=dtype)
    _check_against_dense(pattern, form, dtype, "cpu", sparse_grad=sparse_grad, in_features=0)


@pytest.mark.parametrize("form", ["coo", "csr", "coo_uncoalesced"])
def test_no_bias_batch_of_one(form):
    pattern = random_sparse_dense(1, 7, 0.5)
    _check_against_dense(pattern, form, torch.float64, "cpu", bias=False)


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("form", ["coo", "csr"])
def test_empty_pattern(form, sparse_grad):
    pattern = torch.zeros(3, 4, dtype=torch.float64)
    layer = nnsparse.SparseOutputLinear(2, 4, sparse_grad=sparse_grad).double()
    h = torch.randn(3, 2, dtype=torch.float64, requires_grad=True)
    out = layer(h, make_form(pattern, form))
    assert out.shape == (3, 4) and out.values().numel() == 0
    out.values().sum().backward()
    assert torch.equal(h.grad, torch.zeros_like(h))
    assert layer.weight.grad.to_dense().abs().sum() == 0


def test_vector():
    layer = nnsparse.SparseOutputLinear(3, 5).double()
    h = torch.randn(3, dtype=torch.float64)
    pattern = torch.sparse_coo_tensor([[4, 1]], [1.0, 2.0], (5,)).double()
    out = layer(h, pattern)
    assert out.shape == (5,) and out.sparse_dim() == 1
    torch.testing.assert_close(out.to_dense()[[1, 4]], layer(h)[[1, 4]])


def test_gradcheck():
    pattern = random_sparse_dense(4, 6, 0.4, empty_rows=1).to_sparse()
    h = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    b = torch.randn(6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda h, w, b: nnsparse.sampled_linear(h, w, b, pattern).values(), (h, w, b))
    assert torch.autograd.gradcheck(
        lambda h, w, b: nnsparse.sampled_linear(h, w, b, pattern.to_sparse_csr()).values(),
        (h, w, b))


def test_needs_input_grad_only_input():
    pattern = random_sparse_dense(4, 6, 0.5).to_sparse()
    layer = nnsparse.SparseOutputLinear(3, 6).double().requires_grad_(False)
    h = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    layer(h, pattern).values().sum().backward()
    assert h.grad is not None and layer.weight.grad is None and layer.bias.grad is None


def test_without_pattern_is_linear():
    layer = nnsparse.SparseOutputLinear(3, 6)
    ref = nn.Linear(3, 6)
    ref.load_state_dict(layer.state_dict())
    x = torch.randn(5, 3)
    torch.testing.assert_close(layer(x), ref(x))
    assert "in_features=3, out_features=6" in repr(layer)


def test_module_round_trips():
    layer = nnsparse.SparseOutputLinear(3, 6, sparse_grad=True)
    x, pattern = torch.randn(2, 3), random_sparse_dense(2, 6, 0.5, dtype=torch.float32).to_sparse()
    for other in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert other.sparse_grad
        torch.testing.assert_close(other(x, pattern).values(), layer(x, pattern).values())
    with torch.no_grad():
        assert not layer(x, pattern).requires_grad


def test_sparse_adam_accepts_sparse_grads():
    layer = nnsparse.SparseOutputLinear(3, 6, sparse_grad=True)
    before = layer.weight.detach().clone()
    pattern = torch.sparse_coo_tensor([[0, 1], [2, 2]], [1.0, 1.0], (2, 6))
    opt = torch.optim.SparseAdam(layer.parameters(), lr=0.1)
    layer(torch.randn(2, 3), pattern).values().sum().backward()
    opt.step()
    changed = (layer.weight.detach() != before).any(1)
    assert changed.tolist() == [False, False, True, False, False, False]


@pytest.mark.parametrize("bad, error, match", [
    (lambda: torch.zeros(3, 6).to_sparse(), ValueError, "pattern must have 2 rows"),
    (lambda: torch.zeros(2, 7).to_sparse(), ValueError, "width 7, larger than"),
    (lambda: torch.zeros(6).to_sparse(), ValueError, "pattern must be a sparse vector for a 1-D"),
    (lambda: "abc", TypeError, "pattern must be a sparse tensor"),
])
def test_bad_pattern(bad, error, match):
    layer = nnsparse.SparseOutputLinear(3, 6)
    with pytest.raises(error, match=match):
        layer(torch.randn(2, 3), bad())


def test_bad_input():
    layer = nnsparse.SparseOutputLinear(3, 6)
    pattern = torch.zeros(2, 6).to_sparse()
    with pytest.raises(ValueError, match="input must have 3 features"):
        layer(torch.randn(2, 4), pattern)
    with pytest.raises(TypeError, match="input must be a dense tensor"):
        layer(torch.randn(2, 3).to_sparse(), pattern)


@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr", "list"])
@pytest.mark.parametrize("kind", ["sparse", "sdae"])
def test_with_criteria_equals_dense_decoder(form, kind):
    """The sparse estimate gives the loss and gradients of the dense decoder's."""
    if not hasattr(nnsparse, "SDAESparseCriterion"):
        pytest.skip("nnsparse criteria not available")
    torch.manual_seed(0)
    decoder = nnsparse.SparseOutputLinear(4, 7).double()
    h = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    target = make_form(random_sparse_dense(3, 7, 0.5, empty_rows=1), form)
    losses = []
    for sparse in (True, False):
        if kind == "sparse":
            crit = nnsparse.SparseCriterion(nn.MSELoss())
        else:
            crit = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.3,
                                                generator=torch.Generator().manual_seed(3))
            crit.prepare_input(target)
        est = (nnsparse.values_map(torch.tanh, decoder(h, target)) if sparse
               else torch.tanh(decoder(h)))
        loss = crit(est, target)
        losses.append((loss, *torch.autograd.grad(loss, [h, decoder.weight, decoder.bias])))
    for a, b in zip(*losses):
        torch.testing.assert_close(a, b, **TOL[torch.float64])


# -- a training step costs O(nnz): no (rows, out_features) tensor, forward or backward -------
from matrix import LargestTensor  # noqa: E402
from nnsparse.criteria._entries import as_estimate  # noqa: E402

_ROWS, _IN, _OUT = 8, 4, 5000  # in_features < rows: the weight is smaller than rows * out


def _criterion(kind, target):
    if kind == "sparse":
        return nnsparse.SparseCriterion(nn.MSELoss())
    crit = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.3,
                                        generator=torch.Generator().manual_seed(1))
    crit.prepare_input(target)
    return crit


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", ["sparse", "sdae"])
@pytest.mark.parametrize("form", ["coo", "coo_uncoalesced", "csr", "list"])
def test_training_step_never_dense(form, kind, sparse_grad):
    torch.manual_seed(0)
    dense = random_sparse_dense(_ROWS, _OUT, 100 / (_ROWS * _OUT), empty_rows=1,
                                dtype=torch.float32)
    target = make_form(dense, form)
    decoder = nnsparse.SparseOutputLinear(_IN, _OUT, sparse_grad=sparse_grad)
    h = torch.randn(_ROWS, _IN, requires_grad=True)
    crit = _criterion(kind, target)
    with LargestTensor() as seen:
        loss = crit(nnsparse.values_map(torch.tanh, decoder(h, target)), target)
        loss.backward()
    assert h.grad is not None and decoder.weight.grad is not None
    assert seen.numel < _ROWS * _OUT, f"{seen.op} made {seen.numel} elements"


def test_largest_tensor_sees_the_dense_decoder():
    """The check above can fail: the dense decoder's step makes (rows, out) tensors."""
    target = random_sparse_dense(_ROWS, _OUT, 100 / (_ROWS * _OUT), dtype=torch.float32)
    decoder = nnsparse.SparseOutputLinear(_IN, _OUT)
    with LargestTensor() as seen:
        nnsparse.SparseCriterion(nn.MSELoss())(
            torch.tanh(decoder(torch.randn(_ROWS, _IN))), target.to_sparse()).backward()
    assert seen.numel >= _ROWS * _OUT


@pytest.mark.parametrize("form", ["coo", "csr", "coo_vector"])
def test_output_shares_the_target_pattern(form):
    """Built on a coalesced COO or CSR pattern's own index tensors: criteria read it one for one."""
    dense = random_sparse_dense(3, 7, 0.5, dtype=torch.float32)
    decoder = nnsparse.SparseOutputLinear(4, 7)
    if form == "coo_vector":
        target, h = dense[0].to_sparse(), torch.randn(4)
    else:
        target, h = make_form(dense, form), torch.randn(3, 4)
    out = nnsparse.values_map(torch.tanh, decoder(h, target))
    assert as_estimate(out, target).shared is not None
    if form == "csr":
        assert out.col_indices().data_ptr() == target.col_indices().data_ptr()
    else:
        assert out._indices().data_ptr() == target._indices().data_ptr()


def test_pattern_requiring_grad_uncoalesced():
    """as_sparse_batch coalesces such a pattern itself: the output must not reuse its indices."""
    pattern = torch.sparse_coo_tensor([[1, 0, 1], [2, 1, 2]], [1.0, 2.0, 3.0], (2, 3),
                                      requires_grad=True)
    decoder = nnsparse.SparseOutputLinear(2, 3)
    h = torch.randn(2, 2)
    out = decoder(h, pattern)
    assert out._nnz() == 2 and out._indices().tolist() == [[0, 1], [1, 2]]
    torch.testing.assert_close(out.values(), decoder(h)[[0, 1], [1, 2]])


@pytest.mark.parametrize("form", ["coo", "csr"])
@pytest.mark.parametrize("read", ["dense_grad", "to_dense"])
def test_gradcheck_other_gradients(form, read):
    """A gradient arriving dense (a product with a dense tensor) or on other index tensors."""
    pattern = make_form(random_sparse_dense(4, 6, 0.4, empty_rows=1), form)
    h = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, 3, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 6, dtype=torch.float64)

    def fn(h, w):
        out = nnsparse.sampled_linear(h, w, None, pattern)
        return ((out * g) if read == "dense_grad" else (out.to_dense() * g)).sum()

    assert torch.autograd.gradcheck(fn, (h, w))
