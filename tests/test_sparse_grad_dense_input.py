"""``sparse_grad=True`` layers given a dense (strided) input: the same kinds of gradient as
a sparse batch gives.

A strided input specifies every entry, zeros included, so it is the sparse batch holding
every entry explicitly: every row of ``weight_t`` is touched (none for a batch of no
rows), and the bias gradient specifies every entry.  (``F.linear`` gave both dense
gradients: ``SparseAdam`` refused them, ``LazyAdam`` stepped every row as Adam, by the
input's layout.)  Inside torch.func transforms and torch.compile the dense gradients
stay, as before (batched backwards and dynamo take no sparse tensor).  The checks this
layer shares with SparseOutputLinear's dense path are in tests/test_sparse_grad_dense_paths.py.
"""
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnsparse
from nnsparse import _grad_origin
from nnsparse.layers import linear as linear_module

DTYPES = [torch.float32, torch.float64]


def _explicit(x):
    """``x`` (1-D or 2-D, dense) as a sparse COO tensor specifying every entry, zeros too."""
    index = torch.ones_like(x, dtype=torch.bool).nonzero().t()
    return torch.sparse_coo_tensor(index, x.reshape(-1), x.shape, is_coalesced=True)


def _integer_layer(in_features, out_features, dtype, bias=True, seed=0):
    """A ``sparse_grad`` layer with small integer parameters: products and sums exact, so
    the dense and the sparse kernels give equal gradients whatever their order."""
    gen = torch.Generator().manual_seed(seed)
    layer = nnsparse.SparseLinearBatch(in_features, out_features, bias=bias,
                                       sparse_grad=True, dtype=dtype)
    with torch.no_grad():
        layer.weight_t.copy_(torch.randint(-3, 4, layer.weight_t.shape, generator=gen))
        if bias:
            layer.bias.copy_(torch.randint(-3, 4, (out_features,), generator=gen))
    return layer


def _batch(shape, dtype, seed=1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=gen).to(dtype)
    if x.dim() == 2 and x.shape[0] > 1:
        x[1] = 0  # an all-zero row: still specified
    return x


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
def test_dense_input_gives_the_gradients_of_the_explicit_sparse_batch(case, dtype, bias):
    shape, in_features, out_features = CASES[case]
    dense_layer = _integer_layer(in_features, out_features, dtype, bias)
    sparse_layer = _integer_layer(in_features, out_features, dtype, bias)
    x = _batch(shape, dtype).requires_grad_()
    values = x.detach().reshape(-1).clone().requires_grad_()
    explicit = torch.sparse_coo_tensor(_explicit(x.detach())._indices(), values, x.shape,
                                       is_coalesced=True)
    out, ref = dense_layer(x), sparse_layer(explicit)
    assert torch.equal(out, ref)
    g = _batch(tuple(out.shape), dtype, seed=2)
    out.backward(g), ref.backward(g)
    for name in ["weight_t", "bias"] if bias else ["weight_t"]:
        got, want = getattr(dense_layer, name).grad, getattr(sparse_layer, name).grad
        assert got.layout == want.layout == torch.sparse_coo, name
        assert (got.sparse_dim(), got.dense_dim()) == (want.sparse_dim(), want.dense_dim())
        assert got.dtype == dtype and got.shape == want.shape
        assert torch.equal(got._indices(), want._indices()), name  # same rows touched
        assert torch.equal(got._values(), want._values()), name
        # marked, as the sparse kernels' are: LazyAdam skips its index check
        assert _grad_origin.known_in_range(got) and _grad_origin.known_coalesced(got), name
    rows = 1 if x.dim() == 1 else x.shape[0]
    touched = list(range(in_features)) if rows and out_features else []
    assert dense_layer.weight_t.grad._indices()[0].tolist() == touched
    if bias:
        assert dense_layer.bias.grad._indices()[0].tolist() == (
            list(range(out_features)) if rows else [])
    # the input's gradient: dense, every entry (the sparse batch's values, one for one)
    assert x.grad.layout == torch.strided
    assert torch.equal(x.grad.reshape(-1), values.grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(5, 7), (7,), (2, 3, 7), (0, 7), (2, 0, 7)],
                         ids=["batch", "vector", "leading dims", "no rows", "empty lead"])
def test_dense_input_matches_dense_autograd_of_f_linear(shape, dtype):
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(7, 4, sparse_grad=True, dtype=dtype)
    reference = nn.Linear(7, 4, dtype=dtype)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(shape, dtype=dtype, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    out, ref = layer(x), reference(x_ref)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, ref, **tol)  # (the weight's layouts differ: rounding)
    g = torch.randn_like(ref)
    out.backward(g), ref.backward(g)
    assert layer.weight_t.grad.layout == layer.bias.grad.layout == torch.sparse_coo
    torch.testing.assert_close(layer.weight_t.grad.to_dense().t(), reference.weight.grad, **tol)
    torch.testing.assert_close(layer.bias.grad.to_dense(), reference.bias.grad, **tol)
    torch.testing.assert_close(x.grad, x_ref.grad, **tol)


class _DenseGrad(torch.autograd.Function):
    """The identity, whose backward densifies a sparse gradient: gradcheck compares the
    layout of a gradient with its input's, so the sparse values are checked through it."""

    @staticmethod
    def forward(t):
        return t.view_as(t)

    @staticmethod
    def setup_context(ctx, inputs, output):
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad.to_dense() if grad.layout != torch.strided else grad


@pytest.mark.parametrize("shape", [(4, 6), (6,), (2, 2, 6)])
def test_gradcheck_float64(shape, monkeypatch):
    # a custom Function's output gets dense gradients (its backward may not take a sparse
    # one: nnsparse cannot tell); _DenseGrad's takes one, declared so for this check
    monkeypatch.setattr(linear_module, "_TAKE_SPARSE_GRAD",
                        linear_module._TAKE_SPARSE_GRAD | {"_DenseGradBackward"})
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True, dtype=torch.float64)
    x = torch.randn(shape, dtype=torch.float64, requires_grad=True)
    w = layer.weight_t.detach().clone().requires_grad_()
    b = layer.bias.detach().clone().requires_grad_()
    seen = []

    def f(x, w, b):
        # the layer's own function, sparse_grad=True, on the parameters as leaves
        def record(grad):
            seen.append(grad.layout)
        wt, bias = _DenseGrad.apply(w), _DenseGrad.apply(b)
        wt.register_hook(record), bias.register_hook(record)
        return linear_module._linear_table(x, wt, bias, "auto", True)

    assert torch.autograd.gradcheck(f, (x, w, b))
    assert torch.autograd.gradgradcheck(f, (x, w, b))
    assert seen and set(seen) == {torch.sparse_coo}  # the sparse gradients were checked


def test_parametrized_weight_t_keeps_dense_gradients_for_a_dense_input():
    """torch's parametrizations refuse a sparse gradient: a dense input runs as before."""
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True)
    torch.nn.utils.parametrizations.weight_norm(layer, name="weight_t")
    layer(torch.randn(2, 6)).sum().backward()
    assert all(p.grad.layout == torch.strided for p in layer.parameters())


@pytest.mark.parametrize("transform", ["grad", "vmap_grad", "jacrev"])
def test_torch_func_transforms_keep_dense_gradients(transform):
    """Inside a torch.func transform the dense input keeps F.linear's dense gradients:
    vmap and jacrev batch the backward, which no sparse tensor can be (per-sample
    gradients of a dense input worked, and still do)."""
    from torch.func import functional_call, grad, jacrev, vmap
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True, dtype=torch.float64)
    reference = nn.Linear(6, 3, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(4, 6, dtype=torch.float64)
    params = {k: v.detach() for k, v in layer.named_parameters()}
    ref_params = {"weight": params["weight_t"].t(), "bias": params["bias"]}
    run = {
        "grad": lambda m, p: grad(lambda p: functional_call(m, p, (x,)).sum())(p),
        "vmap_grad": lambda m, p: vmap(grad(lambda p, xi: functional_call(m, p, (xi,)).sum()),
                                       in_dims=(None, 0))(p, x),
        "jacrev": lambda m, p: jacrev(lambda p: functional_call(m, p, (x,)))(p),
    }[transform]
    got, want = run(layer, params), run(reference, ref_params)
    assert all(g.layout == torch.strided for g in got.values())
    torch.testing.assert_close(got["weight_t"].transpose(-1, -2), want["weight"])
    torch.testing.assert_close(got["bias"], want["bias"])


def test_compiled_fullgraph_keeps_dense_gradients():
    """torch.compile traces no sparse constructor: a compiled sparse_grad layer on a dense
    input keeps F.linear's dense gradients (fullgraph=True compiled before, and does)."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True)
    x = torch.randn(4, 6)
    torch.compile(layer, fullgraph=True)(x).sum().backward()
    assert layer.weight_t.grad.layout == torch.strided
    torch.testing.assert_close(layer.weight_t.grad, x.t() @ torch.ones(4, 3))
    torch._dynamo.reset()


# -- training: dense batch == the explicit-zeros sparse batch, step for step ------------------

class _Explicit(nn.Module):
    """Hands the next layer its (dense) input as the sparse batch of every entry."""

    def forward(self, x):
        return _explicit(x)


def _model(explicit):
    torch.manual_seed(0)
    enc = nnsparse.SparseLinearBatch(8, 5, sparse_grad=True, dtype=torch.float64)
    dec = nnsparse.SparseLinearBatch(5, 8, sparse_grad=True, dtype=torch.float64)
    if explicit:
        return nn.Sequential(_Explicit(), enc, nn.Tanh(), _Explicit(), dec)
    return nn.Sequential(enc, nn.Tanh(), dec)  # dec: a dense hidden input, as usual


OPTIMISERS = {
    "SparseAdam": lambda params: torch.optim.SparseAdam(params, lr=0.05),
    "LazyAdam": lambda params: nnsparse.optim.LazyAdam(params, lr=0.05, weight_decay=0.01),
    "SGD": lambda params: torch.optim.SGD(params, lr=0.05),
}


@pytest.mark.parametrize("kind", list(OPTIMISERS))
def test_training_on_a_dense_batch_equals_the_explicit_sparse_batch(kind):
    models = [_model(False), _model(True)]
    opts = [OPTIMISERS[kind](m.parameters()) for m in models]
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        x = torch.randint(-2, 3, (6, 8), generator=gen).to(torch.float64)
        for model, opt in zip(models, opts):
            opt.zero_grad()
            loss = (model(x) - x).pow(2).mean()
            loss.backward()
            for p in model.parameters():
                assert p.grad.layout == torch.sparse_coo
                assert _grad_origin.known_in_range(p.grad)
            opt.step()
        for (name, p), q in zip(models[0].named_parameters(), models[1].parameters()):
            torch.testing.assert_close(p, q, rtol=1e-12, atol=1e-12, msg=f"{name} {step}")


def test_lazy_adam_checks_no_index_of_a_dense_batch_s_gradients(monkeypatch):
    """The gradients are marked (made in range): LazyAdam checks none of their indices (a
    host synchronisation on a GPU); a hand-made copy, unmarked, is checked."""
    model = _model(False)
    opt = nnsparse.optim.LazyAdam(model.parameters(), lr=0.05)
    checked = []
    real = nnsparse.optim._check_grad_indices
    monkeypatch.setattr(nnsparse.optim, "_check_grad_indices",
                        lambda grads: checked.append(len(grads)) or real(grads))
    model(torch.randn(3, 8, dtype=torch.float64)).sum().backward()
    opt.step()
    assert checked == [0]
    for p in model.parameters():
        p.grad = p.grad.clone()  # unmarked
    opt.step()
    assert checked == [0, 4]


# -- the other layers -------------------------------------------------------------------------

def test_sparse_output_linear_dense_hidden_input_gives_sparse_gradients():
    """SparseOutputLinear's input is dense (a hidden layer's output): with a pattern its
    gradients are sparse over the pattern's columns, marked, equal to nn.Linear's there."""
    torch.manual_seed(0)
    dec = nnsparse.SparseOutputLinear(4, 6, sparse_grad=True, dtype=torch.float64)
    reference = nn.Linear(4, 6, dtype=torch.float64)
    reference.load_state_dict(dec.state_dict())
    target = torch.tensor([[0., 1, 0, 0, 0, 3], [2, 0, 0, 0, 0, 0]], dtype=torch.float64)
    h = torch.randn(2, 4, dtype=torch.float64)
    dec(h, target.to_sparse()).values().sum().backward()
    (reference(h) * target.ne(0)).sum().backward()
    for name in ("weight", "bias"):
        grad = getattr(dec, name).grad
        assert grad.layout == torch.sparse_coo and _grad_origin.known_in_range(grad)
        assert grad._indices()[0].tolist() == [0, 1, 5]
        torch.testing.assert_close(grad.to_dense(), getattr(reference, name).grad)


def test_sparse_weight_linear_gradients_are_dense_for_either_input():
    """SparseWeightLinear has no sparse_grad: its values get an (nnz,) dense gradient for a
    dense and a sparse input alike (every value is a weight entry the product reads)."""
    pattern = torch.tensor([[1., 0., 1.], [0., 1., 0.]]).to_sparse()
    grads = []
    for form in (lambda x: x, lambda x: x.to_sparse()):
        layer = nnsparse.SparseWeightLinear(pattern)
        with torch.no_grad():
            layer.values.copy_(torch.tensor([1., 2., 3.]))
            layer.bias.zero_()
        layer(form(torch.tensor([[1., 0., 2.], [0., 0., 0.]]))).sum().backward()
        assert layer.values.grad.layout == layer.bias.grad.layout == torch.strided
        grads.append((layer.values.grad, layer.bias.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])


# -- forward-mode AD and batched backwards: dense, as F.linear gave ----------------------------

def test_forward_ad_with_dual_parameters_requiring_grad():
    """torch.autograd.forward_ad with dual parameters that require grad (the identity
    Function on them has a jvp): nn.Linear's output and tangent."""
    import torch.autograd.forward_ad as fwAD
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True, dtype=torch.float64)
    reference = nn.Linear(6, 3, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(4, 6, dtype=torch.float64)
    tangents = {"weight_t": torch.randn(6, 3, dtype=torch.float64),
                "bias": torch.randn(3, dtype=torch.float64)}
    leaves = {k: v.detach().clone().requires_grad_() for k, v in layer.named_parameters()}
    with fwAD.dual_level():
        duals = {k: fwAD.make_dual(leaves[k], tangents[k]) for k in leaves}
        out = torch.func.functional_call(layer, duals, (x,))
        primal, tangent = fwAD.unpack_dual(out)
        ref_primal, ref_tangent = fwAD.unpack_dual(torch.func.functional_call(
            reference, {"weight": fwAD.make_dual(leaves["weight_t"].detach().t(),
                                                 tangents["weight_t"].t()),
                        "bias": fwAD.make_dual(leaves["bias"].detach(), tangents["bias"])},
            (x,)))
        torch.testing.assert_close(primal, ref_primal)
        torch.testing.assert_close(tangent, ref_tangent)
    # (a backward from here would meet make_dual's view, whose backward reshapes: torch
    # has no reshape of a sparse gradient, for a sparse batch's as for this one)
    assert out.grad_fn is not None


@pytest.mark.parametrize("how", ["is_grads_batched", "vmap_of_autograd_grad"])
def test_a_batched_backward_gets_dense_gradients(how):
    """A backward run under vmap (the forward outside any transform): torch has no batched
    sparse tensor, so the parameters' gradients stay dense, nn.Linear's, per sample."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True, dtype=torch.float64)
    reference = nn.Linear(6, 3, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    x = torch.randn(4, 6, dtype=torch.float64)
    vs = torch.randn(5, 4, 3, dtype=torch.float64)
    got, want = [], []
    for module, params, sink in ((layer, [layer.weight_t, layer.bias], got),
                                 (reference, [reference.weight, reference.bias], want)):
        out = module(x)
        if how == "is_grads_batched":
            sink.extend(torch.autograd.grad(out, params, vs, is_grads_batched=True))
        else:
            sink.extend(torch.func.vmap(lambda v, out=out, params=params: torch.autograd.grad(
                out, params, v, retain_graph=True))(vs))
    assert all(g.layout == torch.strided for g in got)
    assert got[0].shape == (5, 6, 3) and got[1].shape == (5, 3)
    torch.testing.assert_close(got[0].transpose(-1, -2), want[0])
    torch.testing.assert_close(got[1], want[1])
    # an unbatched backward afterwards: sparse again
    layer(x).sum().backward()
    assert layer.weight_t.grad.layout == layer.bias.grad.layout == torch.sparse_coo


def test_jit_trace_keeps_dense_gradients():
    """torch.jit.trace records F.linear, as before (the identity Function failed the
    trace's check: "Graphs differed across invocations"); eager calls stay sparse."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True)
    x = torch.randn(4, 6)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch.jit.trace is deprecated in torch 2.13)
        traced = torch.jit.trace(layer, x)
    torch.testing.assert_close(traced(x), F.linear(x, layer.weight, layer.bias))
    traced(x).sum().backward()
    assert layer.weight_t.grad.layout == torch.strided
    torch.testing.assert_close(layer.weight_t.grad, x.t() @ torch.ones(4, 3))
    layer.zero_grad()
    layer(x).sum().backward()
    assert layer.weight_t.grad.layout == layer.bias.grad.layout == torch.sparse_coo


def _sparse_rows(x):
    """``x`` (2-D) as a torch sparse COO batch of its nonzero entries."""
    return x.to_sparse()


ACCUMULATIONS = {  # name: (zero_grad first with set_to_none=False, the inputs' forms)
    "dense then sparse": (False, ("dense", "sparse")),
    "sparse then dense": (False, ("sparse", "dense")),
    "dense twice": (False, ("dense", "dense")),
    "zeroed in place, then dense": (True, ("dense",)),
}


@pytest.mark.parametrize("case", list(ACCUMULATIONS))
def test_gradients_accumulated_over_backwards_lose_the_mark_and_stay_right(case):
    """Two backwards into the same .grad (a dense and a sparse input, in either order), or
    one into a grad zeroed in place: the sum is right, and not marked (its indices are not
    the layer's own: LazyAdam checks and coalesces them), and LazyAdam steps as Adam."""
    zero_in_place, forms = ACCUMULATIONS[case]
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 3, sparse_grad=True, dtype=torch.float64)
    reference = nn.Linear(6, 3, dtype=torch.float64)
    reference.load_state_dict(layer.state_dict())
    xs = [torch.randn(4, 6, dtype=torch.float64).relu() for _ in forms]
    if zero_in_place:
        layer(xs[0]).sum().backward()
        layer.zero_grad(set_to_none=False)
    for form, x in zip(forms, xs):
        layer(x if form == "dense" else _sparse_rows(x)).pow(2).sum().backward()
        reference(x).pow(2).sum().backward()
    for name, ref_name in (("weight_t", "weight"), ("bias", "bias")):
        grad = getattr(layer, name).grad
        assert grad.layout == torch.sparse_coo
        assert _grad_origin.origin(grad) is None, name
        want = getattr(reference, ref_name).grad
        torch.testing.assert_close(grad.to_dense(), want.t() if name == "weight_t" else want)
    lazy = nnsparse.optim.LazyAdam(layer.parameters(), lr=0.1)
    adam = torch.optim.Adam(reference.parameters(), lr=0.1)
    lazy.step(), adam.step()  # every row touched: LazyAdam's step is Adam's
    torch.testing.assert_close(layer.weight.detach(), reference.weight.detach())
    torch.testing.assert_close(layer.bias.detach(), reference.bias.detach())
