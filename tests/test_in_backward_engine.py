"""The optimiser in the backward steps a weight only where torch's engine accumulates into it
(``nnsparse/layers/linear.py::_engine_use``): the cases around the autoencoder's of
``tests/test_ecosystem_probe2.py`` that a review of that change checked.

The weight's gradient path in float64 (``gradcheck`` / ``gradgradcheck``), one layer used
twice in one graph (under reentrant checkpoints too), non-reentrant activation
checkpointing, autocast, every in-backward
kind and ``sparse_grad`` for ``backward(inputs=[the weights])`` and for the refused
recorded gradients.  Each: the dense model's numbers, and nothing moved where nothing
should step.
"""
import contextlib
import copy
import pickle
import sys
import weakref

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck, gradgradcheck
from torch.utils.checkpoint import checkpoint

import nnsparse
from nnsparse import _rowopt
from nnsparse.optim import apply_optimizer_in_backward, fused_step_optimizer

from test_ecosystem_probe2 import (IN_BACKWARD, OPTIMISERS, _Holder,
                                   _assert_same_weights,
                                   _assert_unchanged, _autoencoder, _input_requiring_grad,
                                   _loss, _misused, _state, _tables, _targets, _tie, _x,
                                   _x2)


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
    step before); the ordinary backward of such a graph is still refused, before the
    step (test_a_layer_used_twice_is_refused_before_any_step)."""
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
    with pytest.raises(RuntimeError, match=r"^SparseLinearBatch 'SparseLinearBatch': this "
                                           r"layer is used 2 times in the graph"):
        twice(layer, _x(), _x2()).backward()
    _assert_same_weights(layer, _Holder(before))
    assert _updates(opt) == [0]


# -- one layer used twice in the graph an ordinary backward runs: refused before any step ----
# (before: the first use's backward stepped the table, the second's was then refused, leaving
# the table and its state half updated and the step counted)

def _body(m, x):
    """The autoencoder up to the decoder's input."""
    return m[3](m[2](m[1](m[0](x))))


def _crit(out, x):
    return (out.values() - x.values()).pow(2).mean()


# how the graph uses a layer twice -> the message's start (the layer named first, the others)
USED_TWICE = {
    "summed losses": (lambda m: _loss(m, _x()) + _loss(m, _x2()),
                      r"SparseOutputLinear '4': this layer is used 2 times in the graph this "
                      r"backward runs \(.*; so is SparseLinearBatch '0' \(2 times\)\)"),
    "decoder on two hidden batches": (
        lambda m: (lambda h: _crit(m[4](h, _x()), _x()) + _crit(m[4](h.flip(0), _x2()), _x2()))(
            _body(m, _x())),
        r"SparseOutputLinear '4': this layer is used 2 times in the graph this backward runs "
        r"\(called on several batches, or several batches' losses summed, before one "
        r"backward\), and"),
    "decoder three times": (
        lambda m: (lambda h: sum(_crit(m[4](h * k, _x()), _x()) for k in (1, 2, 3)))(
            _body(m, _x())),
        r"SparseOutputLinear '4': this layer is used 3 times .*: 3 steps, each from one use's "
        r"gradient, where torch.optim takes one step on their sum"),
    # the decoder, nearer the loss, runs first and refuses for the encoder: nothing moved
    "encoder on two batches": (lambda m: _crit(m[4](_body(m, _x()) + _body(m, _x2()), _x()),
                                               _x()),
                               r"SparseLinearBatch '0': this layer is used 2 times in the graph"),
}
_WAY_ROUND = (r"Refused before any layer of this optimiser stepped .*zero_grad\(\) drops\)\. "
              r"Call the layer once on the batches concatenated along the rows "
              r"\(torch\.cat\(\[x1, x2\]\).*or train a weight used twice with torch\.optim or "
              r"nnsparse\.optim\.LazyAdam \(call remove\(\) on the in-backward optimiser\)$")


@pytest.mark.parametrize("backward", ["backward()", "backward(inputs=weights)"])
@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", IN_BACKWARD)
@pytest.mark.parametrize("case", list(USED_TWICE))
def test_a_layer_used_twice_is_refused_before_any_step(case, kind, sparse_grad, backward):
    """Refused, naming the layer, before any table moved: weights, gradients, optimiser
    state (steps included), update counts unchanged; the next step then works, and a
    step on the batches concatenated equals torch's step of the summed gradient."""
    model = _autoencoder(sparse_grad)
    opt = OPTIMISERS[kind](model)
    opt.zero_grad()
    _loss(model, _x()).backward()  # a step first: the state is not all zeros
    opt.step()
    make, message = USED_TWICE[case]
    loss = make(model)
    before, updates = _state(model, opt), _updates(opt)
    pending = [u.pending for u in opt._updates.values()]
    inputs = _targets(model, ["0.weight", "4.weight"], None)
    with pytest.raises(RuntimeError, match="^" + message + ".*" + _WAY_ROUND):
        if backward == "backward()":
            loss.backward()
        else:
            loss.backward(inputs=inputs)
    after = _state(model, opt)
    assert sorted(before) == sorted(after)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    assert _updates(opt) == updates == [1, 1]
    assert [u.pending for u in opt._updates.values()] == pending
    opt.zero_grad()  # the loop goes on
    _loss(model, _x2()).backward()
    opt.step()
    assert _updates(opt) == [2, 2]


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", ["in-backward-sgd", "in-backward-adamw", "fused-step"])
def test_the_way_round_one_call_on_the_concatenated_batches(kind, sparse_grad):
    """The message's way round, one call on torch.cat of the batches (sparse COO), equals
    torch's optimiser on the dense model given the summed losses of the two calls."""
    model, reference = _autoencoder(sparse_grad), _autoencoder()
    opt = OPTIMISERS[kind](model)
    torch_opt = {"in-backward-sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
                 "in-backward-adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
                 "fused-step": lambda p: torch.optim.Adam(p, lr=1e-2)}[kind](
                     reference.parameters())
    both = torch.cat([_x(), _x2()])
    for _ in range(2):
        opt.zero_grad()
        (model(both, both).values() - both.coalesce().values()).pow(2).sum().backward()
        opt.step()
        torch_opt.zero_grad()
        ((reference(_x(), _x()).values() - _x().values()).pow(2).sum()
         + (reference(_x2(), _x2()).values() - _x2().values()).pow(2).sum()).backward()
        torch_opt.step()
    _assert_same_weights(model, reference)


def _twin_steps(model, opt, extra):
    """Two ordinary steps on _x() then _x2(), with ``extra(model)`` before each."""
    kept = []
    for x in (_x(), _x2()):
        kept.append(extra(model))
        opt.zero_grad()
        loss = _loss(model, x)
        loss.backward()
        opt.step()
        kept.append(loss)  # (its graph, and the layers' nodes, stay alive)
    return kept


# forwards beside a training step that must change nothing (as before the check)
NOT_TWICE = {
    # an evaluation outside torch.no_grad(), its output (and graph) kept alive
    "evaluation forward kept": lambda m: m(_x2(), _x2()),
    "evaluation of the encoder kept": lambda m: m[0](_x2()),
    "evaluation forward dropped": lambda m: [m(_x2(), _x2())] and None,
    "no_grad forward": lambda m: torch.no_grad()(lambda: m(_x2(), _x2()))(),
    # a forward whose own backward ran: its loss kept (next iteration)
    "earlier step's loss kept": lambda m: None,
}


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", IN_BACKWARD)
@pytest.mark.parametrize("extra", list(NOT_TWICE))
def test_forwards_the_backward_does_not_reach_keep_working(extra, kind, sparse_grad):
    """A second forward that is never differentiated, or two forwards each followed by
    its own backward: the steps equal a model's that made no such forward."""
    model, twin = _autoencoder(sparse_grad), _autoencoder(sparse_grad)
    opt, twin_opt = OPTIMISERS[kind](model), OPTIMISERS[kind](twin)
    _twin_steps(model, opt, NOT_TWICE[extra])
    _twin_steps(twin, twin_opt, lambda m: None)
    _assert_same_weights(model, twin)
    assert _updates(opt) == [2, 2]


def test_a_layer_used_twice_another_not_asked():
    """backward(inputs=[the decoder's weight]) of a graph using the encoder twice: the
    engine runs no encoder node, so the decoder steps and the encoder is not refused."""
    model = _autoencoder()
    opt = OPTIMISERS["in-backward-sgd"](model)
    encoder = model[0].weight.detach().clone()
    loss = _crit(model[4](_body(model, _x()) + _body(model, _x2()), _x()), _x())
    loss.backward(inputs=[model[4].weight])
    assert _updates(opt) == [0, 1] and torch.equal(model[0].weight, encoder)


def test_a_layer_used_twice_where_torch_cannot_be_asked(monkeypatch):
    """Without torch._C._will_engine_execute_node, as before: the first use's backward
    steps, the second's is refused as stale (tables already stepped)."""
    monkeypatch.delattr(torch._C, "_will_engine_execute_node")
    model = _autoencoder()
    opt = OPTIMISERS["in-backward-sgd"](model)
    with pytest.raises(RuntimeError, match="its weight was already updated by the optimiser "
                                           "in the backward since this forward"):
        (_loss(model, _x()) + _loss(model, _x2())).backward()
    assert _updates(opt)[1] == 1


def test_the_tables_forget_their_nodes_at_each_step():
    """A table keeps the nodes of its training forwards since its last step only (weakly):
    the check asks nothing in an ordinary step, whatever was kept."""
    model = _autoencoder()
    opt = OPTIMISERS["fused-step"](model)
    kept = [model(_x2(), _x2()) for _ in range(3)]
    assert [len(u.nodes) for u in opt._updates.values()] == [3, 3]
    _loss(model, _x()).backward()
    opt.step()
    assert [len(u.nodes) for u in opt._updates.values()] == [0, 0]
    with torch.no_grad():
        model(_x(), _x())
    assert [len(u.nodes) for u in opt._updates.values()] == [0, 0] and len(kept) == 3


def test_copies_of_the_optimiser_keep_the_check():
    """A deep copy (and a pickle) of the optimiser with its model: the copies' tables are
    checked together, and their nodes are not copied."""
    model = _autoencoder()
    opt = OPTIMISERS["in-backward-adagrad"](model)
    kept = model(_x2(), _x2())
    model2, opt2 = copy.deepcopy((model, opt))
    assert [len(u.nodes) for u in opt2._updates.values()] == [0, 0]
    assert all(u.group == list(opt2._updates.values()) for u in opt2._updates.values())
    with pytest.raises(RuntimeError, match="SparseOutputLinear '4': this layer is used 2"):
        (_loss(model2, _x()) + _loss(model2, _x2())).backward()
    assert _updates(opt2) == [0, 0] and kept is not None


def test_an_optimiser_pickled_before_its_tables_knew_one_another_checks_them_together():
    """Tables pickled before they kept their optimiser's others (no ``group``): the
    optimiser unpickled joins them again, so an encoder used twice is refused by the
    decoder's backward, before the decoder steps (before: each table checked alone, the
    decoder stepped and the encoder was then refused)."""
    model = _autoencoder()
    opt = OPTIMISERS["in-backward-sgd"](model)
    for u in opt._updates.values():
        del u.group  # as pickled before
    model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    assert all(u.group == list(opt2._updates.values()) for u in opt2._updates.values())
    before = _state(model2, opt2)
    with pytest.raises(RuntimeError, match=r"^SparseLinearBatch '0': this layer is used 2 times"):
        USED_TWICE["encoder on two batches"][0](model2).backward()
    after = _state(model2, opt2)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    assert _updates(opt2) == [0, 0]


def test_a_table_pickled_before_param_and_pending_gets_their_defaults():
    """A table pickled by a release before it kept ``param`` and ``pending`` unpickles with
    them given (``None``: no parameter known, no accumulation counted), as ``group`` is,
    and trains: the code reads them plainly."""
    model = _autoencoder()
    opt = OPTIMISERS["in-backward-sgd"](model)
    for u in opt._updates.values():
        del u.param, u.pending  # as pickled before
    model2, opt2 = pickle.loads(pickle.dumps((model, opt)))
    assert all(u.param is None and u.pending is None for u in opt2._updates.values())
    _loss(model2, _x()).backward()
    opt2.step()
    opt2.zero_grad()
    assert _updates(opt2) == [1, 1]


# -- another thread's training forward (or optimiser) beside a backward: the weak sets the check
# walks change meanwhile (before: "Set changed size during iteration" from the backward) -------

class _Member:
    """Weakly referenceable: the node (or table) another thread's forward adds."""

    # as a table built on another parameter: _owner_of reads every live table's param (a
    # walk that met the member raised AttributeError, as memory layout ordered the WeakSet)
    param = None


@contextlib.contextmanager
def _a_member_added_midway(weak_sets):
    """Add a member to one of ``weak_sets`` while the code under test walks it with
    WeakSet.__iter__, a generator between two of whose steps another thread may run (as a
    training forward adding its node, or an optimiser built adding its tables, would):
    deterministic where a race of threads is not."""
    added = []

    def tracer(frame, event, arg):
        walked = frame.f_locals.get("self")
        if (frame.f_code is not weakref.WeakSet.__iter__.__code__
                or not any(walked is s for s in weak_sets)):
            return None

        def on_line(frame, event, arg):  # (past the first element: the walk has begun)
            if event == "line" and "itemref" in frame.f_locals and not any(
                    walked is s for s, _ in added):
                added.append((walked, _Member()))
                walked.add(added[-1][1])
            return on_line
        return on_line

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        yield added
    finally:
        sys.settrace(previous)


@pytest.mark.parametrize("kind", ["fused-step", "in-backward-sgd"])
def test_a_node_added_while_the_backward_checks_the_nodes(kind):
    """A forward kept beside a training step (two nodes: the backward asks which run) and a
    node added while the check walks them: the steps are those of a model that made no
    such forward."""
    model, twin = _autoencoder(), _autoencoder()
    opt, twin_opt = OPTIMISERS[kind](model), OPTIMISERS[kind](twin)
    with _a_member_added_midway([u.nodes for u in opt._updates.values()]):
        kept = _twin_steps(model, opt, lambda m: m(_x2(), _x2()))
    _twin_steps(twin, twin_opt, lambda m: None)
    _assert_same_weights(model, twin)
    assert _updates(opt) == [2, 2] and len(kept) == 4


def test_a_table_added_while_a_tied_weight_is_named():
    """The refusal of a tied weight names the other table (found among the live ones) when
    another table is made meanwhile."""
    with _a_member_added_midway([_rowopt.LIVE_UPDATES]):
        with pytest.raises(RuntimeError, match=r"the weight of SparseLinearBatch '0', which "
                                               r"its own in-backward table steps too"):
            _misused(True, _tie(4, "weight", 0, "weight_t"))()


# -- reentrant activation checkpointing: the checkpointed layers' backward runs nested ----------

def _reentrant(fn, *args):
    return checkpoint(fn, *args, use_reentrant=True)


@pytest.mark.parametrize("kind", IN_BACKWARD)
def test_a_layer_used_twice_outside_a_reentrant_checkpoint_is_refused_before_any_step(kind):
    """The decoder under checkpoint(use_reentrant=True), the encoder used on two batches:
    the decoder's backward runs in a nested backward, whose engine knows nothing of the
    encoder's two nodes.  Refused when the decoder's forward is recomputed (asked of the
    enclosing backward), before the decoder steps (before: the decoder stepped, then the
    encoder was refused with a message saying no layer had stepped)."""
    model = _autoencoder()
    opt = OPTIMISERS[kind](model)
    h = _body(model, _x()) + _body(model, _x2())
    loss = (_reentrant(lambda hh: model[4](hh, _x()).values(), h) - _x().values()).pow(2).mean()
    before, pending = _state(model, opt), [u.pending for u in opt._updates.values()]
    with pytest.raises(RuntimeError, match="^SparseLinearBatch '0': this layer is used 2 times "
                                           "in the graph this backward runs .*" + _WAY_ROUND):
        loss.backward()
    after = _state(model, opt)
    assert [k for k in before if not torch.equal(before[k], after[k])] == []
    assert _updates(opt) == [0, 0]
    assert [u.pending for u in opt._updates.values()] == pending


@pytest.mark.parametrize("bias", [False, True], ids=["no dense part", "dense part"])
def test_a_layer_in_two_reentrant_checkpoints_is_refused(bias):
    """The decoder called in two reentrant checkpoints of one graph: each checkpoint
    recomputes it inside the backward, the first one's nested backward steps it, and the
    second recomputation (from the stepped weight) is refused, naming the layer (before:
    without a dense part, a second step from a gradient taken at the moved weight; with
    one, a refusal as gradient accumulation)."""
    torch.manual_seed(0)
    enc = nnsparse.SparseLinearBatch(6, 4, bias=bias)
    dec = nnsparse.SparseOutputLinear(4, 6, bias=bias)
    model = nn.ModuleList([enc, dec])
    opt = apply_optimizer_in_backward(model, "sgd", lr=0.1)
    assert (opt.dense is None) != bias
    h = torch.tanh(enc(_x()))
    loss = sum(_reentrant(lambda hh, x=x: dec(hh, x).values(), g).pow(2).sum()
               for x, g in ((_x(), h), (_x2(), h.flip(0))))
    with pytest.raises(RuntimeError, match=r"^SparseOutputLinear '1': its weight was already "
                                           r"updated by the optimiser in the backward"):
        loss.backward()
    assert _updates(opt) == [0, 1]
    opt.zero_grad()  # the loop goes on
    (dec(torch.tanh(enc(_x())), _x()).values().pow(2).sum()).backward()
    opt.step()
    assert _updates(opt) == [1, 2]


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
