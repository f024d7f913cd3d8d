"""SparseLinearBatch / sparse_linear against nn.Linear on the densified batch."""
import copy
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

import nnsparse
from nnsparse.layers import linear as linear_module
from matrix import (BATCH_FORMS, DEVICES, FLOAT_DTYPES, TOL, LargestTensor, make_form,
                    random_sparse_dense)

MODES = ["sparse", "dense", "auto"]


def _layers(in_features, out_features, dtype, device, **kwargs):
    torch.manual_seed(3)
    sparse = nnsparse.SparseLinearBatch(in_features, out_features, **kwargs).to(device, dtype)
    dense = nn.Linear(in_features, out_features).to(device, dtype)
    dense.load_state_dict(sparse.state_dict())
    return sparse, dense


def _dense_grad(grad):
    return grad.to_dense() if grad.layout != torch.strided else grad


def _check_against_linear(x_form, dense_x, sparse, dense, dtype):
    out = sparse(x_form)
    ref = dense(dense_x)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(_dense_grad(sparse.weight.grad), dense.weight.grad, **TOL[dtype])
    torch.testing.assert_close(_dense_grad(sparse.bias.grad), dense.bias.grad, **TOL[dtype])


@pytest.mark.parametrize("init", ["cpu", "meta"])
@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("sparse_grad", [False, True])
def test_assign_load_of_an_nn_linear_state_keeps_the_weight_column_major(sparse_grad, nested,
                                                                           init):
    # load_state_dict(assign=True) makes the given tensor the parameter: nn.Linear's
    # row-major weight is stored as the layer keeps it, so the in-backward optimiser takes it
    torch.manual_seed(0)
    reference = nn.Linear(12, 3)
    with torch.device(init):
        layer = nnsparse.SparseLinearBatch(12, 3, sparse_grad=sparse_grad)
    state = reference.state_dict()
    if nested:
        nn.Sequential(layer).load_state_dict({"0." + k: v for k, v in state.items()},
                                             assign=True)
    else:
        layer.load_state_dict(state, assign=True)
    assert layer._table().is_contiguous() and layer.weight.requires_grad
    assert torch.equal(layer.weight, reference.weight)
    x = torch.eye(12)[:4].to_sparse()
    torch.testing.assert_close(layer(x), reference(x.to_dense()))
    nnsparse.optim.apply_optimizer_in_backward(layer, "sgd", lr=0.1)  # refuses a copy


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
@pytest.mark.parametrize("mode", MODES)
def test_matches_nn_linear(form, dtype, device, mode, generator):
    dense_x = random_sparse_dense(6, 40, 0.2, dtype=dtype, device=device, generator=generator,
                                  empty_rows=2)
    sparse, dense = _layers(40, 5, dtype, device, mode=mode)
    _check_against_linear(make_form(dense_x, form), dense_x, sparse, dense, dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", BATCH_FORMS)
def test_sparse_grad_matches_nn_linear(form, dtype, device, generator):
    dense_x = random_sparse_dense(5, 30, 0.15, dtype=dtype, device=device, generator=generator)
    sparse, dense = _layers(30, 4, dtype, device, sparse_grad=True)
    out, ref = sparse(make_form(dense_x, form)), dense(dense_x)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    g = torch.randn_like(ref)
    out.backward(g), ref.backward(g)
    grad = sparse.weight_t.grad  # hybrid COO over the rows of weight_t (= weight's columns)
    assert grad.layout == torch.sparse_coo and (grad.sparse_dim(), grad.dense_dim()) == (1, 1)
    torch.testing.assert_close(grad.to_dense().t(), dense.weight.grad, **TOL[dtype])
    torch.testing.assert_close(sparse.bias.grad.to_dense(), dense.bias.grad, **TOL[dtype])
    touched = dense_x.ne(0).any(0).nonzero().squeeze(1)
    assert grad._indices()[0].tolist() == touched.tolist()  # the touched columns, once each


@pytest.mark.parametrize("grad_output, specified", [
    ([[0.0, 1.0, 0.0]], [0, 1, 2]),               # a zero sum is still touched
    ([[1.0, -1.0, 0.0], [-1.0, 1.0, 0.0]], [0, 1, 2]),  # sums cancelling to 0 too
    (torch.zeros(0, 3), []),                       # a batch of no rows touches nothing
])
def test_sparse_grad_bias_specifies_every_output_of_the_batch(grad_output, specified):
    # Every row's output adds the bias: its sparse gradient specifies each entry, zero
    # or not.  (It dropped the exact zeros, so LazyAdam skipped them, moments and weight
    # decay included, where Adam steps them: found by tests/test_optim_properties.py.)
    layer = nnsparse.SparseLinearBatch(4, 3, sparse_grad=True).double()
    grad_output = torch.as_tensor(grad_output, dtype=torch.float64)
    x = torch.eye(4, dtype=torch.float64)[:grad_output.shape[0]].to_sparse()
    layer(x).backward(grad_output)
    grad = layer.bias.grad
    assert grad.layout == torch.sparse_coo
    assert grad._indices()[0].tolist() == specified
    torch.testing.assert_close(grad.to_dense(), grad_output.sum(0))


def test_sparse_grad_layout_and_state_dict():
    torch.manual_seed(0)
    reference = nn.Linear(12, 3)
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(12, 3, sparse_grad=True)
    assert torch.equal(layer.weight, reference.weight)
    assert [n for n, _ in layer.named_parameters()] == ["weight_t", "bias"]
    state = layer.state_dict()
    assert list(state) == ["bias", "weight"] and state["weight"].shape == (3, 12)
    reference.load_state_dict(state)
    fresh = nnsparse.SparseLinearBatch(12, 3, sparse_grad=True)
    fresh.load_state_dict(nn.Linear(12, 3).state_dict())
    fresh.load_state_dict(reference.state_dict())
    assert torch.equal(fresh.weight, reference.weight)
    nested = nn.Sequential(nnsparse.SparseLinearBatch(12, 3, sparse_grad=True), nn.Tanh())
    nested.load_state_dict(nn.Sequential(reference, nn.Tanh()).state_dict())
    assert torch.equal(nested[0].weight, reference.weight)
    x = torch.eye(12)[:4].to_sparse()
    for clone in (copy.deepcopy(fresh), pickle.loads(pickle.dumps(fresh))):
        torch.testing.assert_close(clone(x), reference(x.to_dense()))
        assert clone.state_dict()["weight"].shape == (3, 12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("case", ["empty_rows_only", "batch_of_one", "no_rows_with_two_empty"])
def test_edge_batches(case, dtype, device):
    sparse, dense = _layers(12, 3, dtype, device)
    dense_x = {"empty_rows_only": torch.zeros(3, 12),
               "batch_of_one": torch.tensor([[0.0] * 11 + [2.5]]),
               "no_rows_with_two_empty": torch.tensor([[0.0] * 12, [1.0] + [0.0] * 11,
                                                       [0.0] * 12])}[case]
    dense_x = dense_x.to(device, dtype)
    for form in BATCH_FORMS:
        if form == "coo_uncoalesced" and not dense_x.any():
            continue  # nothing to duplicate
        sparse.zero_grad(), dense.zero_grad()
        _check_against_linear(make_form(dense_x, form), dense_x, sparse, dense, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows_give_the_bias(device):
    layer = nnsparse.SparseLinearBatch(8, 3).to(device)
    out = layer(torch.zeros(4, 8, device=device).to_sparse())
    torch.testing.assert_close(out, layer.bias.detach().expand(4, 3))


def _form_from_values(v, row, col, shape, form):
    """The form ``form`` of a batch whose values are the leaf ``v`` (so gradients reach it)."""
    if form == "coo":
        return torch.sparse_coo_tensor(torch.stack([row, col]), v, shape, is_coalesced=True)
    if form == "csr":
        crow = torch.zeros(shape[0] + 1, dtype=torch.int64, device=v.device)
        crow[1:] = torch.cumsum(torch.bincount(row, minlength=shape[0]), 0)
        return torch.sparse_csr_tensor(crow, col, v, shape)
    counts = torch.bincount(row, minlength=shape[0]).tolist()
    if form == "list":
        return [torch.sparse_coo_tensor(c.unsqueeze(0), x, (shape[1],))
                for c, x in zip(col.split(counts), v.split(counts))]
    return [torch.stack([c.to(v.dtype), x], 1) for c, x in zip(col.split(counts), v.split(counts))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("form", ["coo", "csr", "list", "pair_list"])
@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_input_values_gradient(form, dtype, device, mode, generator):
    dense_x = random_sparse_dense(5, 20, 0.25, dtype=dtype, device=device, generator=generator,
                                  empty_rows=1)
    row, col = dense_x.nonzero().unbind(1)
    v = dense_x[row, col].clone().requires_grad_()
    sparse, dense = _layers(20, 4, dtype, device, mode=mode)
    out = sparse(_form_from_values(v, row, col, dense_x.shape, form))
    ref_x = dense_x.clone().requires_grad_()
    ref = dense(ref_x)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(v.grad, ref_x.grad[row, col], **TOL[dtype])


def test_input_values_gradient_skipped_when_not_needed(monkeypatch, generator):
    def fail(*args):
        raise AssertionError("the input's gradient was computed though nothing needs it")

    monkeypatch.setattr(linear_module, "_sampled_mm", fail)
    layer = nnsparse.SparseLinearBatch(20, 4, mode="sparse")
    layer(random_sparse_dense(3, 20, 0.3, dtype=torch.float32, generator=generator)
          .to_sparse()).sum().backward()
    assert layer.weight.grad is not None


def test_gradcheck_float64(generator):
    dense_x = random_sparse_dense(4, 9, 0.3, generator=generator, empty_rows=1)
    row, col = dense_x.nonzero().unbind(1)
    v = dense_x[row, col].clone().requires_grad_()
    w = torch.randn(3, 9, dtype=torch.float64, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, requires_grad=True)

    def f(v, w, b):
        x = torch.sparse_coo_tensor(torch.stack([row, col]), v, (4, 9), is_coalesced=True)
        return nnsparse.sparse_linear(x, w, b, mode="sparse")

    assert torch.autograd.gradcheck(f, (v, w, b))
    # the layer's own transposed weight storage too
    wt = w.detach().t().contiguous().t().requires_grad_()
    assert torch.autograd.gradcheck(f, (v, wt, b))


def test_uncoalesced_duplicates_are_summed(generator):
    index = torch.tensor([[0, 0, 1, 0], [3, 3, 1, 5]])
    values = torch.tensor([1.0, 2.0, -1.0, 0.5])
    x = torch.sparse_coo_tensor(index, values, (2, 6))
    sparse, dense = _layers(6, 2, torch.float32, "cpu", mode="sparse")
    _check_against_linear(x, x.to_dense(), sparse, dense, torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_lua_suite_cases(dtype):
    """The Lua test: one sample and a mini-batch match the dense layer to 1e-6."""
    torch.manual_seed(0)
    dense_x = (torch.rand(8, 100) < 0.1).to(dtype) * torch.randn(8, 100, dtype=dtype)
    sparse, dense = _layers(100, 10, dtype, "cpu")
    for x, ref_x in ((dense_x[0].to_sparse(), dense_x[0]), (dense_x.to_sparse(), dense_x)):
        sparse.zero_grad(), dense.zero_grad()
        out, ref = sparse(x), dense(ref_x)
        assert out.shape == ref.shape
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
        g = torch.randn_like(ref)
        out.backward(g), ref.backward(g)
        torch.testing.assert_close(sparse.weight.grad, dense.weight.grad, atol=1e-6, rtol=0)
        torch.testing.assert_close(sparse.bias.grad, dense.bias.grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_vector_and_dense_inputs(device):
    sparse, dense = _layers(7, 2, torch.float64, device)
    x = torch.tensor([0, 1.5, 0, 0, -2, 0, 0], dtype=torch.float64, device=device)
    torch.testing.assert_close(sparse(x.to_sparse()), dense(x))
    pairs = torch.tensor([[1, 1.5], [4, -2]], dtype=torch.float64, device=device)
    # a strided tensor is always dense (nn.Linear's rule): pairs go through from_pairs
    torch.testing.assert_close(sparse(nnsparse.from_pairs(pairs, size=7)), dense(x))
    with pytest.raises(ValueError, match="from_pairs"):
        sparse(pairs)
    torch.testing.assert_close(sparse(x), dense(x))  # dense vector: F.linear
    batch = torch.randn(3, 7, dtype=torch.float64, device=device)
    torch.testing.assert_close(sparse(batch), dense(batch))


def test_never_densifies_the_input(generator):
    rows, width = 8, 5000
    dense_x = random_sparse_dense(rows, width, 0.002, dtype=torch.float32, generator=generator)
    row, col = dense_x.nonzero().unbind(1)
    v = dense_x[row, col].clone().requires_grad_()
    layer = nnsparse.SparseLinearBatch(width, 3)
    # Not "csr": torch's own sparse_csr_tensor(values) backward densifies the
    # gradient of values (SparseCompressedTensorBackward0), before nnsparse runs.
    for form in ["coo", "list", "pair_list"]:
        x = _form_from_values(v, row, col, dense_x.shape, form)
        with LargestTensor() as seen:
            layer(x).sum().backward()
        # the (in, out) weight gradient is the largest tensor: 3 * 5000 < 8 * 5000
        assert seen.numel <= 3 * width, (form, seen.numel, seen.op)


def test_auto_mode_switches_on_density(monkeypatch):
    calls = []
    real = linear_module._SparseLinear.apply
    monkeypatch.setattr(linear_module._SparseLinear, "apply",
                        lambda *a: calls.append(1) or real(*a))
    layer = nnsparse.SparseLinearBatch(10, 2)
    layer(torch.eye(10)[:3].to_sparse())  # 10% dense: sparse kernels
    assert calls == [1]
    layer(torch.ones(3, 10).to_sparse())  # 100% dense: densify and GEMM
    assert calls == [1]
    nnsparse.SparseLinearBatch(10, 2, mode="sparse")(torch.ones(3, 10).to_sparse())
    assert calls == [1, 1]


def test_module_protocols():
    torch.manual_seed(0)
    reference = nn.Linear(30, 4)
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(30, 4)
    assert torch.equal(layer.weight, reference.weight)  # nn.Linear's initialisation
    assert repr(layer) == ("SparseLinearBatch(in_features=30, out_features=4, bias=True, "
                          "sparse_grad=False, mode='auto')")
    x = (torch.eye(30)[:5] * 2).to_sparse()
    expected = layer(x)
    for clone in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        torch.testing.assert_close(clone(x), expected)
    buffer = io.BytesIO()
    torch.save(layer.state_dict(), buffer)
    buffer.seek(0)
    fresh = nnsparse.SparseLinearBatch(30, 4)
    fresh.load_state_dict(torch.load(buffer))
    torch.testing.assert_close(fresh(x), expected)
    assert fresh.weight.t().is_contiguous()  # the fast layout survives loading
    double = copy.deepcopy(layer).double()
    assert double(x.double()).dtype == torch.float64 and double.weight.t().is_contiguous()
    with torch.no_grad():
        assert not layer(x).requires_grad
    net = nn.Sequential(layer, nn.Tanh(), nn.Linear(4, 2))
    assert net(x).shape == (5, 2)


def test_contiguous_weight_assigned_still_correct():
    layer = nnsparse.SparseLinearBatch(6, 2, mode="sparse")
    layer.weight.data = torch.randn(2, 6)  # contiguous: a copy per step, same result
    x = torch.eye(6)[:3].to_sparse()
    torch.testing.assert_close(layer(x), F.linear(x.to_dense(), layer.weight, layer.bias))
    layer(x).sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(2, 1) @ x.to_dense().sum(0, True))


@pytest.mark.parametrize("optimizer", ["sgd", "sparse_adam", "lazy_adam"])
def test_sparse_grad_optimisers_touch_only_used_columns(optimizer):
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(20, 3, sparse_grad=True)
    before = layer.weight.detach().clone()
    make = {"sgd": lambda p: torch.optim.SGD(p, lr=0.1),
            "sparse_adam": lambda p: torch.optim.SparseAdam(p, lr=0.1),
            "lazy_adam": lambda p: nnsparse.optim.LazyAdam(p, lr=0.1)}[optimizer]
    opt = make(list(layer.parameters()))
    x = torch.zeros(2, 20)
    x[0, 3], x[1, 7] = 1.0, -2.0
    layer(x.to_sparse()).pow(2).sum().backward()
    opt.step()
    changed = (layer.weight.detach() != before).any(0).nonzero().squeeze(1).tolist()
    assert changed == [3, 7]


def test_sparse_grad_sgd_step_equals_dense_sgd():
    torch.manual_seed(1)
    sparse = nnsparse.SparseLinearBatch(15, 3, sparse_grad=True)
    dense = copy.deepcopy(sparse)
    dense.sparse_grad = False
    x = random_sparse_dense(4, 15, 0.3, dtype=torch.float32).to_sparse()
    for layer in (sparse, dense):
        opt = torch.optim.SGD(layer.parameters(), lr=0.5)
        layer(x).pow(2).sum().backward()
        opt.step()
    torch.testing.assert_close(sparse.weight, dense.weight)
    torch.testing.assert_close(sparse.bias, dense.bias)


def test_errors():
    layer = nnsparse.SparseLinearBatch(5, 2)
    with pytest.raises(ValueError, match=r"input has width 7, larger than in_features 5$"):
        layer(torch.zeros(2, 7).to_sparse())
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(
            ValueError, match=r"input has width 7, larger than in_features 5$"):
        layer(torch.zeros(2, 7, dtype=torch.bfloat16).to_sparse())  # (the AMP cast's check)
    with pytest.raises(ValueError, match=r"input\[0\] indices must be in \[0, 5\), got max 9"):
        layer([torch.tensor([[9.0, 1.0]])])
    with pytest.raises(ValueError, match=r"5 features .*got shape \(1, 2\).*from_pairs"):
        layer(torch.tensor([[9.0, 1.0]]))  # strided: dense, never a pair vector
    with pytest.raises(ValueError, match=r"input must have the weight's dtype torch.float32, "
                                         r"got torch.float64"):
        layer(torch.eye(5, dtype=torch.float64).to_sparse())
    with pytest.raises(TypeError, match=r"input must be a sparse tensor.*got str"):
        layer("x")
    with pytest.raises(ValueError, match=r"mode must be one of .*got 'fast'"):
        nnsparse.SparseLinearBatch(5, 2, mode="fast")
    with pytest.raises(ValueError, match=r"sparse_grad=True needs the sparse kernels"):
        nnsparse.SparseLinearBatch(5, 2, sparse_grad=True, mode="dense")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool])
@pytest.mark.parametrize("density", ["sparse", "dense"])
def test_integer_weight_refused_for_a_sparse_input_in_every_mode(density, dtype, mode):
    x = (torch.tensor([[0, 2, 0, 0]]) if density == "sparse" else torch.tensor([[1, 2, 3, 1]]))
    with pytest.raises(TypeError, match=f"weight must be floating-point for a sparse input, "
                                        f"got {dtype}"):
        nnsparse.sparse_linear(x.to(dtype).to_sparse(), torch.ones(3, 4, dtype=dtype), mode=mode)


def test_integer_weight_with_a_dense_input_is_f_linear():
    x, w = torch.tensor([[0, 2, 0, 1]]), torch.ones(3, 4, dtype=torch.long)
    assert torch.equal(nnsparse.sparse_linear(x, w), F.linear(x, w))


# -- torch.nn.utils.prune (docs/ecosystem.md) -------------------------------------------
def _prune_batch(device):
    dense = random_sparse_dense(5, 12, 0.4, dtype=torch.float32, device=device)
    return dense, dense.to_sparse()


def test_plain_prune_fails_inside_torch_and_leaves_the_layer():
    """torch's L1Unstructured flattens the weight with .view(-1), which the column-major
    weight refuses: this pins the documented limitation (if a torch release lifts it, the
    workaround in docs/ecosystem.md and the class docstring can go)."""
    layer = nnsparse.SparseLinearBatch(12, 4)
    weight = layer.weight
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        prune.l1_unstructured(layer, "weight", amount=0.5)
    assert layer.weight is weight and not hasattr(layer, "weight_mask")  # torch rolled back


def _sgd_step(layer, x):
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    opt.zero_grad()
    layer(x).pow(2).sum().backward()
    opt.step()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode", ["sparse", "dense"])
def test_prune_with_contiguous_importance_scores_trains(mode, device):
    """The workaround: importance scores given as weight.contiguous().  The pruned layer is
    the dense layer with the mask applied, forward and backward; its pruned entries stay zero
    through an optimiser step; after prune.remove it trains as a plain layer, and
    load_state_dict(assign=True) stores its weight column-major again."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(12, 4, mode=mode).to(device)
    dense, x = _prune_batch(device)
    prune.l1_unstructured(layer, "weight", amount=0.5, importance_scores=layer.weight.contiguous())
    mask = layer.weight_mask
    assert int(mask.sum()) == 24 and sorted(n for n, _ in layer.named_parameters()) == [
        "bias", "weight_orig"]
    orig = layer.weight_orig
    ref_w = orig.detach().clone().requires_grad_()
    out = layer(x)
    ref = F.linear(dense, ref_w * mask, layer.bias.detach())
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(orig.grad, ref_w.grad, **TOL[torch.float32])
    assert not orig.grad[mask == 0].any()
    _sgd_step(layer, x)
    layer(x)  # the forward pre-hook recomputes weight from weight_orig and the mask
    assert not layer.weight[mask == 0].any() and layer.weight[mask == 1].all()
    prune.remove(layer, "weight")
    assert sorted(n for n, _ in layer.named_parameters()) == ["bias", "weight"]
    pruned = layer.weight.detach().clone()
    _sgd_step(layer, x)
    torch.testing.assert_close(layer(x), F.linear(dense, layer.weight, layer.bias),
                               **TOL[torch.float32])
    assert not torch.equal(layer.weight, pruned)  # trains, every entry again
    layer.load_state_dict(layer.state_dict(), assign=True)
    assert layer.weight.t().is_contiguous() and isinstance(layer.weight, nn.Parameter)


def test_prune_of_a_sparse_grad_layer_prunes_weight_t():
    """sparse_grad=True keeps the weight as weight_t (in, out), contiguous: plain pruning
    works on it, layer.weight stays its (out, in) view, and SGD on the sparse gradient
    keeps the pruned entries zero."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(12, 4, sparse_grad=True)
    dense, x = _prune_batch("cpu")
    prune.l1_unstructured(layer, "weight_t", amount=0.5)
    mask = layer.weight_t_mask
    torch.testing.assert_close(layer(x), F.linear(dense, layer.weight, layer.bias))
    assert torch.equal(layer.weight, (layer.weight_t_orig * mask).t())
    _sgd_step(layer, x)
    layer(x)
    assert not layer.weight_t[mask == 0].any()
    prune.remove(layer, "weight_t")
    _sgd_step(layer, x)
    assert layer._table().is_contiguous()
    torch.testing.assert_close(layer(x), F.linear(dense, layer.weight, layer.bias))


@pytest.mark.parametrize("method, works", [
    (lambda layer: prune.ln_structured(layer, "weight", amount=0.5, n=2, dim=0), True),
    (lambda layer: prune.random_structured(layer, "weight", amount=0.5, dim=1), True),
    (lambda layer: prune.identity(layer, "weight"), True),
    (lambda layer: prune.custom_from_mask(layer, "weight",
                                                   mask=torch.rand(4, 12) > 0.5), True),
    (lambda layer: prune.random_unstructured(layer, "weight", amount=0.5), False),
    (lambda layer: prune.global_unstructured(
        [(layer, "weight")], pruning_method=prune.L1Unstructured, amount=0.5,
        importance_scores={(layer, "weight"): layer.weight.contiguous()}), False),
], ids=["ln_structured", "random_structured", "identity", "custom_from_mask",
        "random_unstructured", "global_unstructured"])
def test_which_prune_methods_take_the_column_major_weight(method, works):
    """What docs/ecosystem.md says of torch's other pruning methods."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(12, 4)
    dense, x = _prune_batch("cpu")
    if works:
        method(layer)
        torch.testing.assert_close(layer(x), F.linear(dense, layer.weight_orig * layer.weight_mask,
                                                      layer.bias))
    else:
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            method(layer)


@pytest.mark.parametrize("value", [nn.Parameter(torch.zeros(3, 5)), torch.zeros(3, 5), None])
def test_sparse_grad_weight_cannot_be_assigned(value):
    """With sparse_grad the parameter is weight_t: assigning weight is refused by name, and
    the layer is unchanged (torch's KeyError named neither; a plain tensor would shadow)."""
    layer = nnsparse.SparseLinearBatch(5, 3, sparse_grad=True)
    before = layer.weight_t.detach().clone()
    with pytest.raises(AttributeError, match=r"keeps its weight as the parameter weight_t of "
                       r"shape \(in_features, out_features\) = \(5, 3\).*layer.weight_t = "):
        layer.weight = value
    assert "weight" not in layer.__dict__ and torch.equal(layer.weight, before.t())
    layer.weight_t = nn.Parameter(torch.ones(5, 3))  # the documented way
    assert torch.equal(layer.weight, torch.ones(3, 5))
