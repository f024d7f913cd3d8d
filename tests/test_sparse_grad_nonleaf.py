"""``sparse_grad=True`` layers whose weight (or bias) is not a leaf Parameter.

A weight read as a view of a tensor requiring grad (slices of one flat parameter vector given
to ``torch.func.functional_call``, ``p.t()``, ``p[i]``), or made by an operation whose
backward cannot take a sparse gradient (``torch.cat``, a dtype cast), gets the dense gradient
``sparse_grad=False`` gives: torch's view backwards cannot reshape a sparse gradient ("reshape
is not implemented for sparse tensors"), which failed the backward, dense input and sparse
batch alike.  A weight made from leaves by elementwise products and sums (pruning's
``weight_orig * weight_mask``, a scaled weight) keeps its sparse gradient, which those
backwards hand on; leaf Parameters keep theirs, bit for bit.  A parametrized weight
(``torch.nn.utils.parametrize``) gets dense gradients on a sparse batch too (it was refused).
"""
from typing import Any, Callable, Dict, Tuple

import pytest
import torch
from torch import Tensor, nn
from torch.func import functional_call
from torch.nn.utils import prune

import nnsparse
from nnsparse.layers.linear import _sparse_grad_reaches

IN, OUT, ROWS = 6, 4, 5
F64 = torch.float64


def _batch(seed: int = 0) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, IN, generator=gen, dtype=F64)
    return x * (torch.rand(ROWS, IN, generator=gen) < 0.5)  # some rows of zeros and entries


def _pattern(seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.rand(ROWS, OUT, generator=gen) < 0.5).to(F64)


FORMS: Dict[str, Callable[[Tensor], Any]] = {
    "dense": lambda t: t,
    "coo": lambda t: t.to_sparse(),
    "csr": lambda t: t.to_sparse_csr(),
}

def _seeded(cls: Any) -> nn.Module:
    torch.manual_seed(0)  # (each reference layer holds the same values)
    return cls(IN, OUT, sparse_grad=True, dtype=F64)


# layer name: (build, the weight's parameter name, its shape, the call on an input form)
LAYERS: Dict[str, Tuple[Callable[[], nn.Module], str, Tuple[int, int], Callable[..., Any]]] = {
    "SparseLinearBatch": (
        lambda: _seeded(nnsparse.SparseLinearBatch),
        "weight_t", (IN, OUT),
        lambda form: ((FORMS[form](_batch()),), {})),
    "SparseOutputLinear": (
        lambda: _seeded(nnsparse.SparseOutputLinear),
        "weight", (OUT, IN),
        lambda form: ((_batch(2), None if form == "dense" else FORMS[form](_pattern())), {})),
}


def _values(out: Tensor) -> Tensor:
    return out if out.layout == torch.strided else out.values()


def _loss(out: Tensor) -> Tensor:
    v = _values(out)
    return (v * torch.linspace(-1, 2, v.numel(), dtype=v.dtype).view_as(v)).sum()


# view kind: (the upstream leaves for a weight of `shape`, the weight made of them, whether
# the gradient stays sparse)
def _leaves(*shapes: Tuple[int, ...]) -> Tuple[nn.Parameter, ...]:
    gen = torch.Generator().manual_seed(3)
    return tuple(nn.Parameter(torch.randn(s, generator=gen, dtype=F64)) for s in shapes)


KINDS: Dict[str, Tuple[Callable[[Tuple[int, int]], Tuple[nn.Parameter, ...]],
                       Callable[..., Tensor], bool]] = {
    "flat-slice-view": (lambda s: _leaves((s[0] * s[1] + 3,)),
                        lambda s, flat: flat[3:].view(s), False),
    "transposed": (lambda s: _leaves((s[1], s[0])), lambda s, p: p.t(), False),
    "select": (lambda s: _leaves((2,) + s), lambda s, p: p[1], False),
    "scaled-view": (lambda s: _leaves((s[0] * s[1],)),
                    lambda s, flat: flat.view(s) * 2, False),
    "cat": (lambda s: _leaves((2, s[1]), (s[0] - 2, s[1])),
            lambda s, a, b: torch.cat([a, b]), False),
    "cast": (lambda s: _leaves(s), lambda s, p: p.float().double(), False),
    "masked": (lambda s: _leaves(s), lambda s, p: p * (torch.arange(s[0] * s[1]).view(s) % 3 > 0),
               True),
    # products and sums with factors that require grad, broadcast or 0-d: torch reduces their
    # share of the sparse gradient (sum_to), in either layout
    "learned-scale": (lambda s: _leaves(s, ()), lambda s, p, c: -(p * c), True),
    "row-scaled": (lambda s: _leaves(s, (s[0], 1)), lambda s, p, r: p * r, True),
    "plus-broadcast": (lambda s: _leaves(s, (s[1],)), lambda s, p, b: p.clone() + b, True),
    "sub-alpha": (lambda s: _leaves(s, s), lambda s, p, q: torch.sub(p, q, alpha=0.5), True),
    # divisions by a number or a 0-d tensor (torch's sparse division takes no other divisor:
    # by a tensor of the weight's shape the gradient is dense), and 1 - w (Rsub)
    "divided": (lambda s: _leaves(s), lambda s, p: p / 4.0, True),
    "divided-0d": (lambda s: _leaves(s), lambda s, p: p / torch.tensor(3, dtype=F64), True),
    "div-scalar-op": (lambda s: _leaves(s), lambda s, p: torch.ops.aten.div.Scalar(p, 2), True),
    "scalar-ops": (lambda s: _leaves(s), lambda s, p: torch.ops.aten.sub.Scalar(
        torch.ops.aten.add.Scalar(torch.ops.aten.mul.Scalar(p, 2.0), 1.0), 0.5), True),
    "learned-temperature": (lambda s: _leaves(s, ()), lambda s, p, t: p / (t + 3.0), True),
    "divided-by-a-tensor": (lambda s: _leaves(s), lambda s, p: p / (torch.arange(
        s[0] * s[1], dtype=F64).view(s) + 1.0), False),
    "one-minus": (lambda s: _leaves(s), lambda s, p: 1 - p, True),
    "rsub-learned-broadcast": (lambda s: _leaves(s, (s[1],)),
                               lambda s, p, b: torch.rsub(p, b, alpha=2.0), True),
}


def _run(layer_name: str, form: str, kind: str, call: str, sparse_grad: bool):
    """The call's gradients of the upstream leaves, with the layer's ``sparse_grad`` set."""
    build, name, shape, args = LAYERS[layer_name]
    layer = build()
    layer.sparse_grad = sparse_grad
    make_leaves, make_weight, _ = KINDS[kind]
    leaves = make_leaves(shape)
    weight = make_weight(shape, *leaves)
    positional, _ = args(form)
    if call == "functional_call":
        out = functional_call(layer, {name: weight}, positional)
    else:  # the tensor assigned in the parameter's place
        del layer._parameters[name]
        setattr(layer, name, weight)
        out = layer(*positional)
    _loss(out).backward()
    return leaves, layer.bias.grad


CALLS = ["functional_call", "assigned"]


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_non_leaf_weight_gets_the_dense_reference_gradient(layer_name, form, kind, call):
    leaves, bias_grad = _run(layer_name, form, kind, call, sparse_grad=True)
    ref_leaves, ref_bias_grad = _run(layer_name, form, kind, call, sparse_grad=False)
    sparse = KINDS[kind][2]
    for i, (leaf, ref) in enumerate(zip(leaves, ref_leaves)):
        assert leaf.grad is not None and ref.grad is not None
        if i == 0 or not sparse:  # (a broadcast factor's reduced gradient: either layout)
            assert leaf.grad.layout == (torch.sparse_coo if sparse else torch.strided)
        torch.testing.assert_close(leaf.grad.to_dense(), ref.grad, rtol=1e-12, atol=1e-12)
    # the call's gradients are all dense where the weight's must be (the bias's too)
    assert bias_grad.layout == (torch.sparse_coo if sparse else torch.strided)
    torch.testing.assert_close(bias_grad.to_dense(), ref_bias_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_bias_as_a_view_gives_the_call_dense_gradients(layer_name, form):
    """One flat vector holding the weight and the bias (torch.nn.utils.vector_to_parameters'
    layout), both given as its views: dense gradients equal to sparse_grad=False's."""
    build, name, shape, args = LAYERS[layer_name]
    grads = []
    for sparse_grad in (True, False):
        layer = build()
        layer.sparse_grad = sparse_grad
        (flat,) = _leaves((shape[0] * shape[1] + OUT,))
        params = {name: flat[:-OUT].view(shape), "bias": flat[-OUT:]}
        _loss(functional_call(layer, params, args(form)[0])).backward()
        grads.append(flat.grad)
    assert grads[0].layout == torch.strided
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["dense", "coo", "csr"])
def test_sampled_linear_with_a_view_weight(form):
    """The functional form: a flat vector's view as the weight, with and without a pattern."""
    pattern = None if form == "dense" else FORMS[form](_pattern())
    grads = []
    for sparse_grad in (True, False):
        (flat,) = _leaves((OUT * IN,))
        bias = nn.Parameter(torch.zeros(OUT, dtype=F64))
        out = nnsparse.sampled_linear(_batch(2), flat.view(OUT, IN), bias, pattern,
                                      sparse_grad=sparse_grad)
        _loss(out).backward()
        grads.append((flat.grad, bias.grad))
    assert grads[0][0].layout == grads[0][1].layout == torch.strided
    for got, want in zip(grads[0], grads[1]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("form", ["dense", "coo", "csr"])
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_leaf_parameters_keep_sparse_gradients(layer_name, form):
    """A leaf (the layer's own Parameter, or a leaf given to functional_call) keeps the sparse
    gradient, with the values of the dense reference."""
    build, name, shape, args = LAYERS[layer_name]
    for call in ("own", "functional_call"):
        grads = []
        for sparse_grad in (True, False):
            layer = build()
            layer.sparse_grad = sparse_grad
            if call == "own":
                _loss(layer(*args(form)[0])).backward()
                grads.append(getattr(layer, name).grad)
            else:
                (leaf,) = _leaves(shape)
                _loss(functional_call(layer, {name: leaf}, args(form)[0])).backward()
                grads.append(leaf.grad)
        assert grads[0].layout == torch.sparse_coo and grads[1].layout == torch.strided
        torch.testing.assert_close(grads[0].to_dense(), grads[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer_name, form", [("SparseLinearBatch", "coo"),
                                              ("SparseOutputLinear", "csr"),
                                              ("SparseLinearBatch", "dense")])
def test_gradcheck_through_a_flat_vector(layer_name, form):
    build, name, shape, args = LAYERS[layer_name]
    layer = build()
    positional = args(form)[0]
    (flat,) = _leaves((shape[0] * shape[1] + 3,))

    def f(flat: Tensor) -> Tensor:
        return _values(functional_call(layer, {name: flat[3:].view(shape)}, positional))

    assert torch.autograd.gradcheck(f, (flat.detach().requires_grad_(),))


def test_parametrized_weight_on_a_sparse_batch_gets_dense_gradients():
    """weight_norm on weight_t / weight: a training call on a sparse batch or with a pattern
    (refused before) gives the originals the dense reference's gradients."""
    for layer_name, form in (("SparseLinearBatch", "coo"), ("SparseOutputLinear", "csr")):
        build, name, _, args = LAYERS[layer_name]
        grads = []
        for sparse_grad in (True, False):
            layer = nn.utils.parametrizations.weight_norm(build(), name=name)
            layer.sparse_grad = sparse_grad
            _loss(layer(*args(form)[0])).backward()
            grads.append([p.grad for p in layer.parameters()])
        assert len(grads[0]) == 3
        for got, want in zip(*grads):
            assert got.layout == torch.strided
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


REACHES = [  # what the rule reads: (name, tensors, sparse gradients reach their leaves)
    ("leaf", lambda p: (p,), True),
    ("no grad", lambda p: (p.detach().view(-1),), True),
    ("none", lambda p: (None,), True),
    ("view", lambda p: (p.view(-1),), False),
    ("product of leaves", lambda p: (p * p + p - (-p).clone(),), True),
    ("product with a view", lambda p: (p * p.t(),), False),
    ("view of a product", lambda p: ((p * 2).t(),), False),
    ("leaf and view", lambda p: (p, p[0]), False),
    ("divided by a number", lambda p: (1 - p / 2,), True),
    ("scalar overloads", lambda p: (torch.ops.aten.sub.Scalar(torch.ops.aten.add.Scalar(
        torch.ops.aten.mul.Scalar(p, 2.0), 1.0), 0.5),), True),
    ("scalar division", lambda p: (torch.ops.aten.div.Scalar(p, 2.0),), True),
    ("divided by a 0-d tensor", lambda p: (p / torch.tensor(2.0),), True),
    ("divided by a tensor", lambda p: (p / p.detach(),), False),
    ("divided by a view", lambda p: (p / p[0, 0],), False),
]


@pytest.mark.parametrize("name, tensors, reaches", REACHES, ids=[r[0] for r in REACHES])
def test_sparse_grad_reaches(name, tensors, reaches):
    p = nn.Parameter(torch.randn(3, 3))
    assert _sparse_grad_reaches(*tensors(p)) is reaches


def test_a_freed_graph_s_division_is_not_walked_past():
    """A weight ``p / 2`` whose graph a backward freed: its saved divisor cannot be read;
    the walk says no (dense gradients) and the next backward raises torch's own error."""
    p = nn.Parameter(torch.randn(3, 3))
    w = p / 2
    w.sum().backward()
    assert not _sparse_grad_reaches(w)


@pytest.mark.parametrize("divisor, sparse", [
    (lambda: torch.tensor(3.0, dtype=F64), False),  # saved under the hooks: not looked at
    (lambda: 3.0, True),  # a Python number is saved unpacked, no hook
], ids=["0-d-tensor", "number"])
def test_a_division_saved_under_hooks_runs_no_hook_in_the_forward(divisor, sparse):
    """The walk looks at a division's saved divisor without unpacking it where saved-tensor
    hooks hold it (torch.utils.checkpoint's, save_on_cpu's): no unpack hook runs in the
    forward (it ran once per call, and non-reentrant checkpointing recomputed its whole
    function there); the gradients are the dense reference's."""
    build, name, _, args = LAYERS["SparseLinearBatch"]
    grads, unpacked = [], []
    for sparse_grad in (True, False):
        layer = build()
        layer.sparse_grad = sparse_grad
        (p,) = _leaves((IN, OUT))
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t,
                                                      lambda t: unpacked.append(1) or t):
            out = functional_call(layer, {name: p / divisor()}, args("coo")[0])
            if sparse_grad:
                assert unpacked == []
        _loss(out).backward()
        grads.append(p.grad)
    assert grads[0].layout == (torch.sparse_coo if sparse else torch.strided)
    torch.testing.assert_close(grads[0].to_dense(), grads[1], rtol=1e-12, atol=1e-12)


def test_a_checkpointed_division_is_computed_once_in_the_forward():
    """torch.utils.checkpoint (non-reentrant) of a layer on ``p / c``: the function runs once
    in the forward and once more in the backward, as for any checkpointed function (the
    walk's look at the divisor recomputed it in the forward)."""
    from torch.utils.checkpoint import checkpoint
    build, name, _, args = LAYERS["SparseLinearBatch"]
    layer = build()
    (p,) = _leaves((IN, OUT))
    calls = []

    def block(p: Tensor) -> Tensor:
        calls.append(1)
        return _loss(functional_call(layer, {name: p / torch.tensor(3.0, dtype=F64)},
                                     args("coo")[0]))

    loss = checkpoint(block, p, use_reentrant=False)
    assert len(calls) == 1
    loss.backward()
    assert len(calls) == 2
    ref = p.detach().clone().requires_grad_()
    layer.sparse_grad = False
    _loss(functional_call(layer, {name: ref / 3.0}, args("coo")[0])).backward()
    torch.testing.assert_close(p.grad.to_dense(), ref.grad, rtol=1e-12, atol=1e-12)


def test_a_long_chain_of_products_gets_dense_gradients():
    """The walk is bounded: past 32 nodes the gradient is dense (still correct)."""
    p = nn.Parameter(torch.randn(IN, OUT, dtype=F64))
    w = p
    for _ in range(40):
        w = w * 1.0
    assert not _sparse_grad_reaches(w)
    layer = nnsparse.SparseLinearBatch(IN, OUT, sparse_grad=True, dtype=F64)
    _loss(functional_call(layer, {"weight_t": w}, (_batch().to_sparse(),))).backward()
    assert p.grad.layout == torch.strided


@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_in_backward_optimiser_refuses_a_flat_vector_view_before_anything_moves(layer_name):
    build, name, shape, args = LAYERS[layer_name]
    layer = build()
    optimizer = nnsparse.optim.apply_optimizer_in_backward(layer, "adam", lr=0.1)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    (flat,) = _leaves((shape[0] * shape[1] + 3,))
    before = flat.detach().clone()
    with pytest.raises(RuntimeError, match=rf"{layer_name}.*reads a view of another Parameter, "
                       rf"of shape \({flat.numel()},\) \(a slice of one flat parameter vector "
                       r"given to torch.func.functional_call\).*call remove\(\)"):
        functional_call(layer, {name: flat[3:].view(shape)}, args("coo")[0])
    assert all(torch.equal(v, state[k]) for k, v in layer.state_dict().items())
    assert torch.equal(flat.detach(), before) and flat.grad is None
    optimizer.remove()  # then the view trains, with dense gradients
    _loss(functional_call(layer, {name: flat[3:].view(shape)}, args("coo")[0])).backward()
    assert flat.grad.layout == torch.strided


@pytest.mark.parametrize("kind", ["pruned", "flat-slice-view"])
@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_compiled_fullgraph_with_a_non_leaf_weight(layer_name, kind):
    """torch.compile(fullgraph=True) of a sparse_grad layer whose weight is made in the
    region (pruning's weight_orig * weight_mask, a flat vector's view): no graph break (dynamo
    reads no grad_fn), and the dense gradients eager sparse_grad=False gives."""
    build, name, shape, args = LAYERS[layer_name]
    grads = []
    for compiled in (True, False):
        layer = build()
        layer.sparse_grad = compiled
        (flat,) = _leaves((shape[0] * shape[1] + 3,))
        if kind == "pruned":
            torch.manual_seed(4)
            prune.random_unstructured(layer, name, 0.5)  # (the same mask both times)

            def f(*inputs: Tensor) -> Tensor:
                return layer(*inputs)
        else:
            def f(*inputs: Tensor) -> Tensor:
                return functional_call(layer, {name: flat[3:].view(shape)}, inputs)
        torch._dynamo.reset()
        try:
            run = torch.compile(f, backend="aot_eager", fullgraph=True) if compiled else f
            _loss(run(*args("dense")[0])).backward()
        finally:
            torch._dynamo.reset()
        grads.append(getattr(layer, name + "_orig").grad if kind == "pruned" else flat.grad)
    assert grads[0].layout == torch.strided
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer_name", list(LAYERS))
def test_parametrized_layer_is_not_listed_as_giving_sparse_gradients(layer_name):
    """A parametrized weight's calls give dense gradients, the bias's too: the layer's
    parameters are not listed by sparse_grad_parameters (which make_optimizer and
    DistributedDataParallel read), so make_optimizer(sparse="sparse_adam") trains it."""
    build, name, _, args = LAYERS[layer_name]
    layer = nn.utils.parametrizations.weight_norm(build(), name=name)
    assert nnsparse.sparse_grad_parameters(layer) == []
    before = [p.detach().clone() for p in layer.parameters()]
    optimizer = nnsparse.make_optimizer(layer, lr=0.1, sparse="sparse_adam")
    _loss(layer(*args("coo")[0])).backward()
    optimizer.step()
    assert all(not torch.equal(p, b) for p, b in zip(layer.parameters(), before))
    # unparametrized, both are listed, as before
    assert [tuple(p.shape) for p in nnsparse.sparse_grad_parameters(build())] == [
        tuple(getattr(build(), name).shape), (OUT,)]
