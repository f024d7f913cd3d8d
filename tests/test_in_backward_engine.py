"""The optimiser in the backward steps a weight only where torch's engine accumulates into it
(``nnsparse/layers/linear.py::_engine_use``): the cases around the autoencoder's of
``tests/test_ecosystem_probe2.py`` that a review of that change checked.

The weight's gradient path in float64 (``gradcheck`` / ``gradgradcheck``), one layer used
twice in one graph, non-reentrant activation checkpointing, autocast, every in-backward
kind and ``sparse_grad`` for ``backward(inputs=[the weights])`` and for the refused
recorded gradients.  Each: the dense model's numbers, and nothing moved where nothing
should step.
"""
import copy

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck, gradgradcheck
from torch.utils.checkpoint import checkpoint

import nnsparse
from nnsparse.optim import apply_optimizer_in_backward, fused_step_optimizer

from test_ecosystem_probe2 import (IN_BACKWARD, OPTIMISERS, _Holder,
                                   _assert_same_weights,
                                   _assert_unchanged, _autoencoder, _input_requiring_grad,
                                   _loss, _tables, _targets, _x, _x2)


def _updates(opt):
    return [u.updates for u in opt._updates.values()]


# -- the weight's own gradient (torch.autograd.grad of the weight) in float64 -------------------

_X64 = torch.tensor([[1., 2, 0, 3, 0, 1], [0, 1, 2, 0, 4, 2]], dtype=torch.float64).to_sparse()
_H64 = torch.linspace(-1, 1, 8, dtype=torch.float64).reshape(2, 4)

# (layer, its trained parameter, the function of that parameter checked)
GRADCHECK_LAYERS = {
    "encoder": lambda sg: (nnsparse.SparseLinearBatch(6, 4, sparse_grad=sg, dtype=torch.float64),
                           "weight_t" if sg else "weight", lambda layer: layer(_X64).tanh()),
    "decoder": lambda sg: (nnsparse.SparseOutputLinear(4, 6, sparse_grad=sg, dtype=torch.float64),
                           "weight", lambda layer: layer(_H64, _X64).values().tanh()),
}
GRADCHECK_KINDS = {
    "fused-step": lambda m: fused_step_optimizer(m, lr=0.1),
    "in-backward-sgd": lambda m: apply_optimizer_in_backward(m, "sgd", lr=0.1),
    "in-backward-rowwise": lambda m: apply_optimizer_in_backward(m, "rowwise_adagrad", lr=0.1),
}


@pytest.mark.parametrize("kind", list(GRADCHECK_KINDS))
@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("which", list(GRADCHECK_LAYERS))
def test_gradient_of_the_weight_passes_gradcheck(which, sparse_grad, kind):
    """gradcheck / gradgradcheck differentiate with torch.autograd.grad of the weight: the
    returned gradient (and its recorded graph) is exact, and the checks step nothing."""
    torch.manual_seed(0)
    layer, name, f = GRADCHECK_LAYERS[which](sparse_grad)
    opt = GRADCHECK_KINDS[kind](layer)
    weight = getattr(layer, name)
    before = weight.detach().clone()
    assert gradcheck(lambda w: f(layer), (weight,))
    assert gradgradcheck(lambda w: f(layer), (weight,))
    assert torch.equal(weight.detach(), before) and _updates(opt) == [0]


# -- one layer used twice in one graph ---------------------------------------------------------

@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("of", ["weight", "bias"])
def test_a_layer_used_twice_gives_the_summed_gradient_and_steps_nothing(of, sparse_grad):
    """Two uses of one layer (two nodes on one weight): torch.autograd.grad of its weight or
    bias sums both uses, as nn.Linear's, and steps nothing (it was refused as a second
    step before); the ordinary backward of such a graph is still refused."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse_grad)
    reference = nn.Linear(6, 4)
    with torch.no_grad():
        reference.weight.copy_(layer.weight)
        reference.bias.copy_(layer.bias)
    opt = fused_step_optimizer(layer, lr=1e-2)
    before = copy.deepcopy(layer.state_dict())

    def twice(m, a, b):
        return (m(a).tanh() * m(b)).sum()
    param = layer.weight_t if sparse_grad and of == "weight" else getattr(layer, of)
    got, = torch.autograd.grad(twice(layer, _x(), _x2()), param)
    want, = torch.autograd.grad(twice(reference, _x().to_dense(), _x2().to_dense()),
                                getattr(reference, of))
    torch.testing.assert_close(got.t() if got.shape != want.shape else got, want)
    _assert_same_weights(layer, _Holder(before))
    assert _updates(opt) == [0]
    with pytest.raises(RuntimeError, match="its weight was already updated by the optimiser "
                                           "in the backward since this forward"):
        twice(layer, _x(), _x2()).backward()


# -- non-reentrant activation checkpointing (the forward recomputed inside the backward) ------

class _Checkpointed(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, pattern):
        return checkpoint(self.model, x, pattern, use_reentrant=False)


CHECKPOINT_TARGETS = {"dense-and-bias": ["2.weight", "0.bias", "4.bias"],
                      "weights": ["0.weight", "4.weight"]}


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", ["fused-step", "in-backward-sgd", "in-backward-rowwise"])
@pytest.mark.parametrize("target", list(CHECKPOINT_TARGETS))
def test_checkpoint_gradients_of_other_tensors_then_one_step(target, kind, sparse_grad):
    """Under checkpoint(use_reentrant=False) the forward runs again inside the backward:
    torch.autograd.grad (retain_graph) moves nothing and gives the plain model's gradients;
    the backward of that graph then steps once, as the plain model's."""
    plain = _autoencoder(sparse_grad)
    wrapped = _Checkpointed(copy.deepcopy(plain))
    opt, plain_opt = OPTIMISERS[kind](wrapped.model), OPTIMISERS[kind](plain)
    weights, tables = copy.deepcopy(wrapped.model.state_dict()), _tables(opt)
    x = _x()
    loss = (wrapped(x, x).values() - x.values()).pow(2).mean()
    names = CHECKPOINT_TARGETS[target]
    got = torch.autograd.grad(loss, _targets(wrapped.model, names, None), retain_graph=True)
    reference = _autoencoder(sparse_grad)  # (no optimiser: the same seed, the same weights)
    want = torch.autograd.grad(_loss(reference, x), _targets(reference, names, None))
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w if w.layout == torch.strided else w.to_dense())
    _assert_unchanged(wrapped.model, opt, weights, tables)
    for o, backward in ((opt, loss.backward), (plain_opt, _loss(plain, x).backward)):
        o.zero_grad()
        backward()
        o.step()
    assert _updates(opt) == [1, 1]
    _assert_same_weights(plain, wrapped.model)


# -- autocast ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fused-step", "in-backward-adagrad"])
def test_autocast_gradients_of_other_tensors_step_nothing(kind):
    """Under CPU bfloat16 autocast: torch.autograd.grad of the biases moves nothing, of
    the weights returns the gradients of a model without the optimiser (float32; its
    encoder on the sparse kernels, which the optimiser forces), and the backward after
    steps once."""
    model, reference = _autoencoder(), _autoencoder()
    reference[0].mode = "sparse"
    opt = OPTIMISERS[kind](model)
    weights, tables = copy.deepcopy(model.state_dict()), _tables(opt)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, ref_loss = _loss(model, _x()), _loss(reference, _x())
    torch.autograd.grad(loss, [model[0].bias, model[4].bias], retain_graph=True)
    got = torch.autograd.grad(loss, [model[0].weight, model[4].weight], retain_graph=True)
    want = torch.autograd.grad(ref_loss, [reference[0].weight, reference[4].weight])
    for g, w in zip(got, want):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, w)
    _assert_unchanged(model, opt, weights, tables)
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert _updates(opt) == [1, 1]


# -- every kind, dense and sparse_grad layers --------------------------------------------------

@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", IN_BACKWARD)
def test_backward_inputs_of_the_weights_is_the_ordinary_step(kind, sparse_grad):
    """backward(inputs=[both weights]) (weight_t with sparse_grad=True) accumulates into
    them: the same step as loss.backward() for the sparse layers."""
    model, twin = _autoencoder(sparse_grad), _autoencoder(sparse_grad)
    opt, twin_opt = OPTIMISERS[kind](model), OPTIMISERS[kind](twin)
    _loss(model, _x()).backward(inputs=_targets(model, ["0.weight", "4.weight"], None))
    _loss(twin, _x()).backward()
    state, twin_state = model.state_dict(), twin.state_dict()
    for name in state:
        if name.endswith(("weight", "weight_t")) and not name.startswith("2."):
            assert torch.equal(state[name], twin_state[name]), name
    assert _updates(opt) == _updates(twin_opt) == [1, 1]


@pytest.mark.parametrize("how", ["autograd.grad", "backward(inputs)"])
@pytest.mark.parametrize("of", ["2.weight", "input", "0.weight", "0.bias"])
@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", IN_BACKWARD)
def test_recorded_gradients_reading_a_weight_are_refused(kind, sparse_grad, of, how):
    """create_graph=True asking for anything before the decoder (its recorded gradient reads
    the decoder's weight): refused naming the decoder, every kind, dense and sparse_grad
    layers, through torch.autograd.grad or backward(inputs=...); nothing moves and no
    .grad is left."""
    model = _autoencoder(sparse_grad)
    opt = OPTIMISERS[kind](model)
    weights, tables = copy.deepcopy(model.state_dict()), _tables(opt)
    x, values = _input_requiring_grad()
    targets = _targets(model, [of], values)
    with pytest.raises(RuntimeError, match=r"^SparseOutputLinear '4': a gradient recorded with "
                       r"create_graph=True through this layer's input reads its weight"):
        if how == "autograd.grad":
            torch.autograd.grad(_loss(model, x), targets, create_graph=True)
        else:
            _loss(model, x).backward(inputs=targets, create_graph=True)
    _assert_unchanged(model, opt, weights, tables)
    assert all(p.grad is None for p in model.parameters()) and values.grad is None


# -- a layer built with sparse_grad=True, then set to sparse_grad=False ------------------------

def _flipped(when, kind):
    """A SparseLinearBatch built with sparse_grad=True and set to False (its kernels then
    read weight_t.t().t(): two transposes), before or after attaching the optimiser."""
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 4, sparse_grad=True)
    if when == "before":
        layer.sparse_grad = False
    opt = OPTIMISERS[kind](layer)
    if when == "after":
        layer.sparse_grad = False
    return layer, opt


@pytest.mark.parametrize("create_graph", [False, True])
@pytest.mark.parametrize("of", ["weight_t", "bias"])
@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("kind", ["fused-step", "in-backward-sgd"])
def test_gradient_of_a_layer_set_to_sparse_grad_false(kind, when, of, create_graph):
    """Before: torch.autograd.grad(loss, layer.weight_t) of such a layer took the step
    (the engine was asked about the inner transpose, not the parameter) and then torch
    raised that weight_t was not used; with create_graph=True it was refused as a step.
    Now: nn.Linear's gradient, nothing moves, and the next step is that of a layer that
    never made the call."""
    layer, opt = _flipped(when, kind)
    twin, twin_opt = _flipped(when, kind)
    reference = nn.Linear(6, 4)
    with torch.no_grad():
        reference.weight.copy_(layer.weight)
        reference.bias.copy_(layer.bias)
    before = copy.deepcopy(layer.state_dict())
    got, = torch.autograd.grad(layer(_x()).tanh().sum(), getattr(layer, of),
                               create_graph=create_graph)
    want, = torch.autograd.grad(reference(_x().to_dense()).tanh().sum(),
                                getattr(reference, "weight" if of == "weight_t" else of))
    assert got.layout == torch.strided
    torch.testing.assert_close(got.t() if of == "weight_t" else got, want)
    _assert_same_weights(layer, _Holder(before))
    assert _updates(opt) == [0]
    for m, o in ((layer, opt), (twin, twin_opt)):
        o.zero_grad()
        m(_x2()).tanh().sum().backward()
        o.step()
    _assert_same_weights(layer, twin)
    assert _updates(opt) == [1]
