"""``SparseOutputLinear(sparse_grad=True)`` (and ``sampled_linear(..., sparse_grad=True)``)
called without a pattern: the dense output, with the gradients a pattern holding every entry
gives.

Without a pattern every output of every row is computed, so every row of ``weight`` (an
output column) and every bias entry is touched (none for an input of no rows), as a pattern
specifying every entry touches them.  (``F.linear`` gave both dense gradients: ``SparseAdam``
refused them, DDP refused them for a parameter declared sparse.)  Inside torch.func
transforms, torch.compile and for a parametrized weight the dense gradients stay, as for
``SparseLinearBatch``'s dense input (tests/test_sparse_grad_dense_input.py).  The checks the
two layers share are in tests/test_sparse_grad_dense_paths.py.
"""
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import _grad_origin
from nnsparse.layers import linear as linear_module
from nnsparse.layers import sparse_output as sparse_output_module

DTYPES = [torch.float32, torch.float64]


def _every_entry(shape):
    """A sparse COO pattern of ``shape`` (1-D or 2-D) specifying every entry."""
    ones = torch.ones(shape)
    index = torch.ones_like(ones, dtype=torch.bool).nonzero().t()
    return torch.sparse_coo_tensor(index, ones.reshape(-1), shape, is_coalesced=True)


def _integer_decoder(in_features, out_features, dtype, bias=True, seed=0):
    """A ``sparse_grad`` decoder with small integer parameters: products and sums exact, so
    the dense and the sampled kernels give equal gradients whatever their order."""
    gen = torch.Generator().manual_seed(seed)
    layer = nnsparse.SparseOutputLinear(in_features, out_features, bias=bias,
                                        sparse_grad=True, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(torch.randint(-3, 4, layer.weight.shape, generator=gen))
        if bias:
            layer.bias.copy_(torch.randint(-3, 4, (out_features,), generator=gen))
    return layer


def _ints(shape, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-2, 3, shape, generator=gen).to(dtype)


CASES = {  # name: (input shape, in_features, out_features)
    "batch": ((4, 6), 6, 3),
    "one row": ((1, 6), 6, 3),
    "vector": ((6,), 6, 3),
    "no rows": ((0, 6), 6, 3),
    "no outputs": ((3, 6), 6, 0),
    "no inputs": ((3, 0), 0, 2),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("bias", [True, False])
def test_no_pattern_gives_the_gradients_of_a_pattern_holding_every_entry(case, dtype, bias):
    shape, in_features, out_features = CASES[case]
    dense_layer = _integer_decoder(in_features, out_features, dtype, bias)
    sampled_layer = _integer_decoder(in_features, out_features, dtype, bias)
    h = _ints(shape, dtype, seed=1).requires_grad_()
    h_ref = h.detach().clone().requires_grad_()
    out_shape = shape[:-1] + (out_features,)
    out, ref = dense_layer(h), sampled_layer(h_ref, _every_entry(out_shape))
    assert out.layout == torch.strided and torch.equal(out.reshape(-1), ref.values())
    g = _ints(out_shape, dtype, seed=2)
    out.backward(g), ref.values().backward(g.reshape(-1))
    for name in ["weight", "bias"] if bias else ["weight"]:
        got, want = getattr(dense_layer, name).grad, getattr(sampled_layer, name).grad
        assert got.layout == want.layout == torch.sparse_coo, name
        assert (got.sparse_dim(), got.dense_dim()) == (want.sparse_dim(), want.dense_dim())
        assert got.dtype == dtype and got.shape == want.shape
        assert torch.equal(got._indices(), want._indices()), name  # same rows touched
        assert torch.equal(got._values(), want._values()), name
        # marked, as the sampled kernels' are: LazyAdam skips its index check
        assert _grad_origin.known_in_range(got) and _grad_origin.known_coalesced(got), name
    rows = 1 if h.dim() == 1 else h.shape[0]
    # every row of weight, in_features == 0 included (as the pattern gives); none for no rows
    assert dense_layer.weight.grad._indices()[0].tolist() == (
        list(range(out_features)) if rows else [])
    assert h.grad.layout == torch.strided and torch.equal(h.grad, h_ref.grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 7), (7,), (2, 3, 7), (0, 7), (2, 0, 7)],
                         ids=["batch", "vector", "leading dims", "no rows", "empty lead"])
@pytest.mark.parametrize("functional", [False, True], ids=["layer", "sampled_linear"])
def test_no_pattern_matches_dense_autograd_of_nn_linear(shape, dtype, functional):
    torch.manual_seed(0)
    layer = nnsparse.SparseOutputLinear(7, 4, sparse_grad=True, dtype=dtype)
    reference = nn.Linear(7, 4, dtype=dtype)
    reference.load_state_dict(layer.state_dict())
    h = torch.randn(shape, dtype=dtype, requires_grad=True)
    h_ref = h.detach().clone().requires_grad_()
    if functional:
        out = nnsparse.sampled_linear(h, layer.weight, layer.bias, None, sparse_grad=True)
    else:
        out = layer(h)
    ref = reference(h_ref)
    assert torch.equal(out, ref)  # the same F.linear
    g = torch.randn_like(ref)
    out.backward(g), ref.backward(g)
    rows = h.shape[:-1].numel()
    for name in ("weight", "bias"):
        grad = getattr(layer, name).grad
        assert grad.layout == torch.sparse_coo and grad._nnz() == (4 if rows else 0), name
        torch.testing.assert_close(grad.to_dense(), getattr(reference, name).grad)
    torch.testing.assert_close(h.grad, h_ref.grad)


def _graph_names(tensor):
    """The names of every autograd node ``tensor``'s graph reaches."""
    seen, stack, names = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_the_pattern_path_is_unchanged():
    """With a pattern the sampled Function receives the parameters themselves (no identity
    node before them); without one the identity hands F.linear's gradients on as sparse."""
    decoder = nnsparse.SparseOutputLinear(4, 3, sparse_grad=True)
    h = torch.randn(2, 4, requires_grad=True)
    values = decoder(h, _every_entry((2, 3))).values()
    assert not any("EveryRowSparseGrad" in name for name in _graph_names(values))
    node = values.grad_fn
    while not type(node).__name__.startswith("_SampledLinear"):
        node = node.next_functions[0][0]
    assert [type(n).__name__ for n, _ in node.next_functions[1:3]] == [
        "AccumulateGrad", "AccumulateGrad"]  # weight and bias, directly
    without = _graph_names(decoder(h))
    assert sum("EveryRowSparseGrad" in name for name in without) == 2


def test_sampled_linear_sparse_grad_false_is_unchanged():
    """(The rest of this check, for the layer: tests/test_sparse_grad_dense_paths.py.)"""
    torch.manual_seed(0)
    h = torch.randn(2, 6)
    w = torch.randn(3, 6, requires_grad=True)
    nnsparse.sampled_linear(h, w).sum().backward()  # sparse_grad=False: dense
    assert w.grad.layout == torch.strided


def test_parametrized_weight_keeps_dense_gradients_without_a_pattern():
    """torch's parametrizations refuse a sparse gradient: without a pattern it runs as
    before, and with one too (a training call was refused; tests/test_sparse_grad_nonleaf.py
    checks the values)."""
    decoder = nnsparse.SparseOutputLinear(6, 3, sparse_grad=True)
    torch.nn.utils.parametrizations.weight_norm(decoder, name="weight")
    decoder(torch.randn(2, 6)).sum().backward()
    assert all(p.grad.layout == torch.strided for p in decoder.parameters())
    decoder.zero_grad()
    decoder(torch.randn(2, 6), _every_entry((2, 3))).values().sum().backward()
    assert all(p.grad.layout == torch.strided for p in decoder.parameters())


def test_torch_func_grad_and_compile_keep_dense_gradients():
    from torch.func import functional_call, grad
    torch.manual_seed(0)
    decoder = nnsparse.SparseOutputLinear(6, 3, sparse_grad=True, dtype=torch.float64)
    h = torch.randn(4, 6, dtype=torch.float64)
    params = {k: v.detach() for k, v in decoder.named_parameters()}
    got = grad(lambda p: functional_call(decoder, p, (h,)).sum())(params)
    assert all(g.layout == torch.strided for g in got.values())
    torch.testing.assert_close(got["weight"], torch.ones(3, 4, dtype=torch.float64) @ h)
    torch._dynamo.reset()
    try:
        torch.compile(decoder, fullgraph=True)(h).sum().backward()
    finally:
        torch._dynamo.reset()
    assert decoder.weight.grad.layout == torch.strided
    torch.testing.assert_close(decoder.weight.grad, torch.ones(3, 4, dtype=torch.float64) @ h)


# -- training: no pattern == a pattern holding every entry, step for step ---------------------

def _model():
    torch.manual_seed(0)
    enc = nnsparse.SparseLinearBatch(8, 5, sparse_grad=True, dtype=torch.float64)
    dec = nnsparse.SparseOutputLinear(5, 8, sparse_grad=True, dtype=torch.float64)
    return nn.ModuleList([enc, dec])


def _loss(model, x, every_entry):
    hidden = torch.tanh(model[0](x))
    if every_entry:
        out = model[1](hidden, _every_entry(tuple(x.shape))).values()
    else:
        out = model[1](hidden).reshape(-1)
    return (out - x.reshape(-1)).pow(2).mean()


OPTIMISERS = {
    "SparseAdam": lambda params: torch.optim.SparseAdam(params, lr=0.05),
    "LazyAdam": lambda params: nnsparse.optim.LazyAdam(params, lr=0.05, weight_decay=0.01),
    "SGD": lambda params: torch.optim.SGD(params, lr=0.05),
    "make_optimizer sparse_adam": lambda params: None,
}


@pytest.mark.parametrize("kind", list(OPTIMISERS))
def test_training_without_a_pattern_equals_a_pattern_holding_every_entry(kind):
    models = [_model(), _model()]
    if kind.startswith("make_optimizer"):  # SparseAdam refused the dense decoder's gradients
        opts = [nnsparse.make_optimizer(m, sparse="sparse_adam", lr=0.05) for m in models]
    else:
        opts = [OPTIMISERS[kind](m.parameters()) for m in models]
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        x = torch.randint(-2, 3, (6, 8), generator=gen).to(torch.float64)
        for every_entry, (model, opt) in enumerate(zip(models, opts)):
            opt.zero_grad()
            _loss(model, x, bool(every_entry)).backward()
            for p in model.parameters():
                assert p.grad.layout == torch.sparse_coo
                assert _grad_origin.known_in_range(p.grad)
            opt.step()
        for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=f"{name} {step}")


def test_lazy_adam_checks_no_index_of_the_dense_output_s_gradients(monkeypatch):
    """The gradients are marked (made in range): LazyAdam checks none of their indices (a
    host synchronisation on a GPU); a hand-made copy, unmarked, is checked."""
    decoder = nnsparse.SparseOutputLinear(5, 8, sparse_grad=True)
    opt = nnsparse.optim.LazyAdam(decoder.parameters(), lr=0.05)
    checked = []
    real = nnsparse.optim._check_grad_indices
    monkeypatch.setattr(nnsparse.optim, "_check_grad_indices",
                        lambda grads: checked.append(len(grads)) or real(grads))
    decoder(torch.randn(3, 5)).sum().backward()
    opt.step()
    assert checked == [0]
    for p in decoder.parameters():
        p.grad = p.grad.clone()  # unmarked
    opt.step()
    assert checked == [0, 2]


def test_the_helpers_are_shared_with_sparse_linear_batch():
    """One implementation: the decoder uses linear.py's _with_sparse_grad."""
    assert sparse_output_module._with_sparse_grad is linear_module._with_sparse_grad
