"""The second ecosystem probe: more ordinary PyTorch idioms on nnsparse's layers and optimisers.

Activation checkpointing (with the optimiser in the backward), ``load_state_dict(assign=True)``
and ``torch.load(mmap=True)``, ``to_empty``, parametrizations, ``torch.func``, parameter
swapping on conversion, freezing, gradient accumulation, ``zero_grad(set_to_none=False)``,
``AveragedModel`` / ``update_bn``, hooks with keyword arguments, ``DataLoader`` workers;
each checked against the dense model or torch's optimiser where there is a number.
What was found and fixed: docs/ecosystem_probe2.md.
"""
import contextlib
import copy
import os

import pytest
import torch
import torch.__future__ as future
from torch import nn
from torch.func import functional_call, grad, vjp
from torch.nn.utils import parametrize, prune
from torch.nn.utils.parametrizations import spectral_norm, weight_norm
from torch.optim.swa_utils import AveragedModel, update_bn
from torch.utils.checkpoint import checkpoint

import nnsparse
from nnsparse.data import SparseRowDataset
from nnsparse.optim import LazyAdam, apply_optimizer_in_backward, fused_step_optimizer

from probe_cases import Case, run_case


def _x():
    """Every input and output column touched: lazy steps are then torch's steps."""
    return torch.tensor([[1., 2, 0, 3, 0, 1], [0, 1, 2, 0, 4, 2]]).to_sparse()


def _x2():
    return torch.tensor([[0., 1, 0, 2, 1, 3], [3, 0, 1, 0, 2, 2]]).to_sparse()


def _autoencoder(sparse_grad=False, seed=0):
    torch.manual_seed(seed)
    return nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse_grad), nn.Tanh(),
        nn.Linear(4, 4), nn.Tanh(), nnsparse.SparseOutputLinear(4, 6, sparse_grad=sparse_grad))


def _loss(model, x):
    return (model(x, x).values() - x.values()).pow(2).mean()


def _dense(t):
    return t.detach().to_dense() if t.is_sparse else t.detach()


def _assert_same_weights(a, b):
    want, got = a.state_dict(), b.state_dict()  # (sparse_grad=True lists bias first)
    assert sorted(want) == sorted(got)
    for name, p in want.items():
        torch.testing.assert_close(_dense(p), _dense(got[name]), rtol=1e-5, atol=1e-6,
                                   msg=name)


OPTIMISERS = {
    "lazy-adam": lambda m: LazyAdam(m.parameters(), lr=1e-2),
    "make-optimizer": lambda m: nnsparse.make_optimizer(m, lr=1e-2),
    "fused-step": lambda m: fused_step_optimizer(m, lr=1e-2),
    "in-backward-sgd": lambda m: apply_optimizer_in_backward(m, "sgd", lr=1e-2, momentum=0.9),
    "in-backward-adamw": lambda m: apply_optimizer_in_backward(m, "adamw", lr=1e-2),
    "in-backward-adagrad": lambda m: apply_optimizer_in_backward(m, "adagrad", lr=1e-2),
    "in-backward-rowwise": lambda m: apply_optimizer_in_backward(m, "rowwise_adagrad", lr=1e-2),
}
IN_BACKWARD = [k for k in OPTIMISERS if k.startswith(("in-backward", "fused"))]


# -- activation checkpointing ------------------------------------------------------------------

class _Checkpointed(nn.Module):
    """The autoencoder with its encoder and/or decoder under ``checkpoint``."""

    def __init__(self, model, reentrant, where):
        super().__init__()
        self.model, self.reentrant, self.where = model, reentrant, where

    def forward(self, x, pattern):
        enc, act, mid, act2, dec = self.model
        if self.where in ("encoder", "both"):
            h = checkpoint(lambda x: act(enc(x)), x, use_reentrant=self.reentrant)
        else:
            h = act(enc(x))
        h = act2(mid(h))
        if self.where in ("decoder", "both"):
            return checkpoint(dec, h, pattern, use_reentrant=self.reentrant)
        return dec(h, pattern)


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("reentrant,where", [(False, "encoder"), (False, "both"),
                                             (True, "decoder")])
def test_checkpoint_gives_the_plain_gradients(sparse_grad, reentrant, where):
    plain = _autoencoder(sparse_grad)
    wrapped = _Checkpointed(copy.deepcopy(plain), reentrant, where)
    _loss(plain, _x()).backward()
    x = _x()
    (wrapped(x, x).values() - x.values()).pow(2).mean().backward()
    for (name, p), q in zip(plain.named_parameters(), wrapped.model.parameters()):
        assert q.grad.layout == p.grad.layout, name
        torch.testing.assert_close(_dense(q.grad), _dense(p.grad), msg=name)


@pytest.mark.parametrize("kind", ["fused-step", "in-backward-sgd", "in-backward-rowwise"])
@pytest.mark.parametrize("reentrant,where", [(False, "encoder"), (False, "both"),
                                             (True, "decoder")])
def test_checkpoint_with_the_optimiser_in_the_backward_steps_once(kind, reentrant, where):
    """The recomputed forward takes no step: three steps equal the plain model's three."""
    plain = _autoencoder()
    wrapped = _Checkpointed(copy.deepcopy(plain), reentrant, where)
    opts = OPTIMISERS[kind](plain), OPTIMISERS[kind](wrapped.model)
    x = _x()
    for _ in range(3):
        for opt, loss in ((opts[0], lambda: _loss(plain, x)),
                          (opts[1], lambda: (wrapped(x, x).values() - x.values()).pow(2).mean())):
            opt.zero_grad()
            loss().backward()
            opt.step()
    assert [u.updates for u in opts[1]._updates.values()] == [3, 3]
    _assert_same_weights(plain, wrapped.model)


def test_reentrant_checkpoint_of_a_sparse_input_alone_trains_nothing_inside():
    """torch's reentrant rule (an input must require grad): the encoder, given only the
    sparse batch, gets no gradient and no in-backward step; torch warns.  Documented, use
    use_reentrant=False."""
    model = _autoencoder()
    opt = apply_optimizer_in_backward(model, "sgd", lr=0.1)
    before = model[0].weight.detach().clone()
    wrapped = _Checkpointed(model, True, "encoder")
    x = _x()
    with pytest.warns(UserWarning, match="None of the inputs have requires_grad=True"):
        (wrapped(x, x).values() - x.values()).pow(2).mean().backward()
    assert torch.equal(model[0].weight, before) and opt._updates["0"].updates == 0


# -- assign=True, mmap, to_empty --------------------------------------------------------------

@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("how", ["assign", "mmap-assign", "mmap", "to-empty"])
def test_state_dict_loading_variants_keep_the_layout(sparse_grad, how, tmp_path):
    source = _autoencoder(sparse_grad)
    path = os.fspath(tmp_path / "model.pt")
    torch.save(source.state_dict(), path)
    state = (torch.load(path, mmap=True, weights_only=True) if how.startswith("mmap")
             else source.state_dict())
    if how == "to-empty":
        with torch.device("meta"):
            target = _autoencoder(sparse_grad)
        target.to_empty(device="cpu")
    else:
        target = _autoencoder(sparse_grad, seed=1)
    target.load_state_dict(state, assign=how in ("assign", "mmap-assign"))
    assert target[0].weight.stride() == (1, 4)  # the encoder's weight.t() contiguous
    assert target[4].weight.is_contiguous()
    x = _x()
    torch.testing.assert_close(target(x, x).values(), source(x, x).values())
    opt = fused_step_optimizer(target, lr=1e-2)  # the in-backward update accepts the layout
    opt.zero_grad()
    _loss(target, x).backward()
    opt.step()


@pytest.mark.parametrize("kind", list(OPTIMISERS))
def test_optimiser_state_loaded_with_mmap_resumes(kind, tmp_path):
    model = _autoencoder()
    opt = OPTIMISERS[kind](model)
    x = _x()
    opt.zero_grad()
    _loss(model, x).backward()
    opt.step()
    path = os.fspath(tmp_path / "opt.pt")
    torch.save(opt.state_dict(), path)
    again = copy.deepcopy(model)
    again_opt = OPTIMISERS[kind](again)
    again_opt.load_state_dict(torch.load(path, mmap=True, weights_only=True))
    for m, o in ((model, opt), (again, again_opt)):
        o.zero_grad()
        _loss(m, x).backward()
        o.step()
    _assert_same_weights(model, again)


# -- parametrizations --------------------------------------------------------------------------

class _Twice(nn.Module):
    def forward(self, w):
        return 2 * w


PARAMETRIZE = {
    "register": lambda layer: parametrize.register_parametrization(layer, "weight", _Twice()),
    "weight-norm": lambda layer: weight_norm(layer, "weight"),
    "spectral-norm": lambda layer: spectral_norm(layer, "weight"),
}


@pytest.mark.parametrize("how", list(PARAMETRIZE))
def test_parametrized_weight_trains_with_dense_gradients(how):
    model = _autoencoder()
    PARAMETRIZE[how](model[0])
    PARAMETRIZE[how](model[4])
    _loss(model, _x()).backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert all(g is not None and g.layout == torch.strided for g in grads.values())
    assert "0.parametrizations.weight.original" in grads or \
        "0.parametrizations.weight.original0" in grads


class _Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, w):
        self.calls += 1
        return 2 * w


@pytest.mark.parametrize("layer_index", [0, 4])
def test_a_parametrization_runs_once_per_call_as_under_nn_linear(layer_index):
    # the forward reads the weight in its checks, its dtype test and the product: three
    # runs of the parametrization before parametrize.cached() was entered for the call
    model = _autoencoder()
    counted = _Counted()
    parametrize.register_parametrization(model[layer_index], "weight", counted)
    counted.calls = 0  # (registering runs it once, to check it)
    _loss(model, _x()).backward()
    assert counted.calls == 1
    with torch.no_grad():
        model(_x(), _x())
    assert counted.calls == 2


def _spectral_pair(sparse_layer, dense_layer):
    dense_layer.load_state_dict(sparse_layer.state_dict())
    for layer in (sparse_layer, dense_layer):
        torch.manual_seed(1)  # the same first u and v
        spectral_norm(layer, "weight")
    return sparse_layer, dense_layer


@pytest.mark.parametrize("which", ["SparseLinearBatch", "SparseOutputLinear"])
def test_spectral_norm_gives_nn_linears_output_and_buffers(which):
    torch.manual_seed(0)
    x = _x()
    if which == "SparseLinearBatch":
        sparse, dense = _spectral_pair(nnsparse.SparseLinearBatch(6, 4), nn.Linear(6, 4))
        out, ref = sparse(x), dense(x.to_dense())
    else:
        sparse, dense = _spectral_pair(nnsparse.SparseOutputLinear(5, 6), nn.Linear(5, 6))
        h = torch.randn(2, 5)
        out, ref = sparse(h, x).to_dense(), dense(h) * (x.to_dense() != 0)
    torch.testing.assert_close(out, ref)
    for name in ("_u", "_v"):  # one power iteration each, not three
        torch.testing.assert_close(getattr(sparse.parametrizations.weight[0], name),
                                   getattr(dense.parametrizations.weight[0], name))


_PARAMETRIZED = (r"its weight is parametrized \(torch.nn.utils.parametrize.*the "
                 r"parametrization's original tensors would never be trained")


def _parametrize_then_attach(how, layer):
    model = _autoencoder()
    PARAMETRIZE[how](model[layer])
    return apply_optimizer_in_backward(model, "sgd", lr=0.1)


def _attach_then_parametrize(how, layer):
    model = _autoencoder()
    apply_optimizer_in_backward(model, "sgd", lr=0.1)
    PARAMETRIZE[how](model[layer])
    before = [p.detach().clone() for p in model.parameters()]
    try:
        _loss(model, _x()).backward()
    finally:  # refused before anything moved
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def _attach_then_parametrize_no_grad():
    model = _autoencoder()
    apply_optimizer_in_backward(model, "sgd", lr=0.1)
    PARAMETRIZE["register"](model[0])
    x = _x()
    with torch.no_grad():
        return model(x, x)


def _unchanged_by_the_refusal(call, layer_index):
    """``call(model)`` on the autoencoder whose layer ``layer_index`` has ``spectral_norm``
    (a parametrization whose every run, in training mode, updates its buffers): it must
    raise, leaving every tensor of the model's state as it was."""
    def run():
        model = _autoencoder()
        spectral_norm(model[layer_index], "weight")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            call(model)
        finally:  # (a refused call reads no parametrized weight: its power iteration not run)
            after = model.state_dict()
            assert [k for k in before if not torch.equal(before[k], after[k])] == []
    return run


def _attach_then_spectral_norm_forward(layer_index):
    def run():
        model = _autoencoder()
        apply_optimizer_in_backward(model, "sgd", lr=0.1)
        spectral_norm(model[layer_index], "weight")
        before = {k: v.clone() for k, v in model.state_dict().items()}
        try:
            model(_x(), _x())
        finally:
            after = model.state_dict()
            assert [k for k in before if not torch.equal(before[k], after[k])] == []
    return run


PARAMETRIZED_CASES = [
    # before the review fix: refused, but only after reading the weight, which ran the
    # spectral_norm power iteration and changed its buffers (_u, _v)
    Case("spectral-norm-encoder-then-in-backward-changes-nothing",
         _unchanged_by_the_refusal(lambda m: apply_optimizer_in_backward(m, "sgd", lr=0.1), 0),
         NotImplementedError, r"model: ParametrizedSparseLinearBatch '0': " + _PARAMETRIZED),
    Case("spectral-norm-decoder-then-fused-step-changes-nothing",
         _unchanged_by_the_refusal(lambda m: fused_step_optimizer(m), 4),
         NotImplementedError, r"model: ParametrizedSparseOutputLinear '4': " + _PARAMETRIZED),
    Case("in-backward-then-spectral-norm-encoder-forward-changes-nothing",
         _attach_then_spectral_norm_forward(0), RuntimeError,
         r"SparseLinearBatch '0': " + _PARAMETRIZED),
    Case("in-backward-then-spectral-norm-decoder-forward-changes-nothing",
         _attach_then_spectral_norm_forward(4), RuntimeError,
         r"SparseOutputLinear '4': " + _PARAMETRIZED),

    # before the fix: accepted, and the step wrote the parametrization's output (a
    # temporary): the weight never moved while torch.optim.SGD moved it
    Case("parametrize-then-in-backward-encoder",
         lambda: _parametrize_then_attach("register", 0), NotImplementedError,
         r"model: ParametrizedSparseLinearBatch '0': " + _PARAMETRIZED),
    Case("parametrize-then-in-backward-decoder",
         lambda: _parametrize_then_attach("register", 4), NotImplementedError,
         r"model: ParametrizedSparseOutputLinear '4': " + _PARAMETRIZED),
    Case("weight-norm-then-in-backward",
         lambda: _parametrize_then_attach("weight-norm", 0), NotImplementedError, _PARAMETRIZED),
    Case("fused-step-of-a-parametrized-model",
         lambda: fused_step_optimizer(_autoencoder().apply(
             lambda m: PARAMETRIZE["register"](m) if isinstance(m, nnsparse.SparseOutputLinear)
             else None)), NotImplementedError, _PARAMETRIZED),
    Case("in-backward-then-parametrize-encoder",
         lambda: _attach_then_parametrize("register", 0), RuntimeError,
         r"SparseLinearBatch '0': " + _PARAMETRIZED),
    Case("in-backward-then-parametrize-decoder",
         lambda: _attach_then_parametrize("register", 4), RuntimeError,
         r"SparseOutputLinear '4': " + _PARAMETRIZED),
    Case("in-backward-then-weight-norm",
         lambda: _attach_then_parametrize("weight-norm", 0), RuntimeError, _PARAMETRIZED),
    Case("in-backward-then-parametrize-no-grad-forward", _attach_then_parametrize_no_grad,
         None, check=lambda out: out.layout == torch.sparse_coo),
]


@pytest.mark.parametrize("case", PARAMETRIZED_CASES, ids=lambda c: c.id)
def test_parametrized_weight_with_the_optimiser_in_the_backward(case):
    run_case(case)


# -- the weight the forward reads is not the in-backward table's Parameter ---------------------
# (before: each row but the last two trained silently, stepping a temporary or another
# parameter with this table's state; now refused at the training forward, or at attaching)

def _state(model, opt):
    """Every tensor of the model's and the optimiser's state, cloned."""
    tensors = {"model." + k: v for k, v in model.state_dict().items()}

    def walk(prefix, value):
        if torch.is_tensor(value):
            tensors[prefix] = value
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
    walk("opt", opt.state_dict())
    tensors.update({"grad." + k: p.grad for k, p in model.named_parameters()
                    if p.grad is not None})
    return {k: v.detach().clone() for k, v in tensors.items()}


def _misused(sparse_grad, misuse, call=lambda model: _loss(model, _x()).backward()):
    """The autoencoder with its optimiser in the backward (one step taken), then
    ``misuse(model)``, then ``call(model)``, which must raise leaving the model, its
    parameters' gradients and the optimiser's state as they were."""
    def run():
        model = _autoencoder(sparse_grad)
        opt = apply_optimizer_in_backward(model, "adam", lr=0.1)
        opt.zero_grad()
        _loss(model, _x()).backward()  # a step first: the state is not all zeros
        opt.step()
        misuse(model)
        before = _state(model, opt)
        try:
            call(model)
        finally:
            after = _state(model, opt)
            assert sorted(before) == sorted(after)
            assert [k for k in before if not torch.equal(before[k], after[k])] == []
    return run


def _prune(name, amount=0.0):
    """``torch.nn.utils.prune`` of ``name`` of a layer (a mask keeping every entry for
    ``custom_from_mask``, which the column-major weight of sparse_grad=False takes)."""
    def apply(layer):
        weight = getattr(layer, name)
        if amount:
            prune.l1_unstructured(layer, name, amount=amount)
        else:
            prune.custom_from_mask(layer, name, torch.ones_like(weight))
    return apply


def _prune_then_attach(index, name, amount=0.0, sparse_grad=False, frozen=False):
    model = _autoencoder(sparse_grad)
    _prune(name, amount)(model[index])
    if frozen:
        getattr(model[index], name + "_orig").requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        return apply_optimizer_in_backward(model, "sgd", lr=0.1)
    finally:
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


def _tie(dst, dst_name, src, src_name):
    return lambda model: setattr(model[dst], dst_name, getattr(model[src], src_name))


def _functional_call(weights, no_grad=False):
    def call(model):
        params = {name: fn(model) for name, fn in weights.items()}
        with torch.no_grad() if no_grad else contextlib.nullcontext():
            out = functional_call(model, params, (_x(), _x()))
        if not no_grad:
            (out.values() - _x().values()).pow(2).mean().backward()
        return out
    return call


def _own_parameters_in_functional_call():
    model = _autoencoder()
    twin = copy.deepcopy(model)
    opt, twin_opt = (apply_optimizer_in_backward(m, "adam", lr=0.1) for m in (model, twin))
    for m, o, call in ((model, opt, lambda m: _loss(m, _x())),
                       (twin, twin_opt, lambda m: (functional_call(
                           m, dict(m.named_parameters()), (_x(), _x())).values()
                           - _x().values()).pow(2).mean())):
        o.zero_grad()
        call(m).backward()
        o.step()
    _assert_same_weights(model, twin)
    return model


def _frozen_in_functional_call(sparse_grad, frozen):
    """``functional_call`` with the weights of the layers ``frozen`` detached (no grad),
    the input values requiring grad: the input's gradient is the model's, the frozen
    layers' weights and table states do not move, the other layers train as the model."""
    model, twin = _autoencoder(sparse_grad), _autoencoder(sparse_grad)
    opt = apply_optimizer_in_backward(model, "adam", lr=0.1)
    twin_opt = apply_optimizer_in_backward(twin, "adam", lr=0.1)
    def name(k):  # (a SparseOutputLinear's is weight whatever sparse_grad)
        return "weight_t" if sparse_grad and k == "0" else "weight"
    for k in frozen:  # the reference: the weight frozen in place (not the bias)
        getattr(twin[int(k)], name(k)).requires_grad_(False)
    grads = []
    for m, o, params in ((model, opt, {f"{k}.{name(k)}": getattr(model[int(k)], name(k))
                                       .detach() for k in frozen}),
                         (twin, twin_opt, {})):
        x = _x().coalesce()
        values = x.values().clone().requires_grad_()
        x = torch.sparse_coo_tensor(x.indices(), values, x.shape)
        o.zero_grad()
        out = functional_call(m, params, (x, _x()))
        (out.values() - _x().values()).pow(2).mean().backward()
        o.step()
        grads.append(values.grad)
    torch.testing.assert_close(grads[0], grads[1])
    _assert_same_weights(model, twin)
    return all(torch.equal(opt.tables[k][s], twin_opt.tables[k][s])
               for k in twin_opt.tables for s in opt.tables[k])


_PRUNED = (r"its {0} is pruned \(torch.nn.utils.prune: the layer reads {0}_orig \* {0}_mask.*"
           r"{0}_orig would never be trained. Call remove\(\) on the in-backward optimiser and "
           r"train with torch.optim or nnsparse.optim.LazyAdam.*prune.remove\(layer, '{0}'\)")
_NOT_OWNED = (r"{0}: the optimiser in the backward was built on this layer's {1} Parameter and "
              r"updates it in place, but the training forward reads {2}")
_TIED = r"train tied weights with torch.optim or nnsparse.optim.LazyAdam"
_NOT_PARAMETER = (r"a Tensor that is not a Parameter \(a tensor given to torch.func."
                  r"functional_call, or assigned\).*pass the model's own parameters to "
                  r"functional_call")

MISUSE_CASES = [
    # 2. tied after attaching: each table would step the shared weight with its own state
    Case("tie-decoder-to-the-encoder",
         _misused(True, _tie(4, "weight", 0, "weight_t")), RuntimeError,
         _NOT_OWNED.format("SparseOutputLinear '4'", "weight",
                           r"the weight of SparseLinearBatch '0', which its own in-backward "
                           r"table steps too \(a tied weight: two steps with two states\)")
         + ".*" + _TIED),
    Case("tie-encoder-to-the-decoder",
         _misused(True, _tie(0, "weight_t", 4, "weight")), RuntimeError,
         _NOT_OWNED.format("SparseLinearBatch '0'", "weight_t",
                           r"the weight of SparseOutputLinear '4'") + ".*" + _TIED),
    Case("another-parameter-assigned",
         _misused(False, lambda m: setattr(m[4], "weight", nn.Parameter(torch.zeros(6, 4)))),
         RuntimeError, _NOT_OWNED.format("SparseOutputLinear '4'", "weight",
                                         r"another Parameter, assigned since the optimiser "
                                         r"was attached") + r".*copy_\(w\)"),
    Case("load-state-dict-assign-after-attaching",
         _misused(False, lambda m: m.load_state_dict(copy.deepcopy(m.state_dict()),
                                                     assign=True)),
         RuntimeError, _NOT_OWNED.format("SparseLinearBatch '0'", "weight",
                                         "another Parameter")),
    # 3. pruned: the update would write weight_orig * mask, a temporary
    Case("prune-encoder-after-attaching",
         _misused(False, lambda m: _prune("weight")(m[0])), RuntimeError,
         r"SparseLinearBatch '0': " + _PRUNED.format("weight")),
    Case("prune-sparse-grad-encoder-after-attaching",
         _misused(True, lambda m: _prune("weight_t", 0.5)(m[0])), RuntimeError,
         r"SparseLinearBatch '0': " + _PRUNED.format("weight_t")),
    Case("prune-decoder-after-attaching",
         _misused(False, lambda m: _prune("weight", 0.5)(m[4])), RuntimeError,
         r"SparseOutputLinear '4': " + _PRUNED.format("weight")),
    Case("prune-then-attach-encoder", lambda: _prune_then_attach(0, "weight"),
         NotImplementedError, r"model: SparseLinearBatch '0': " + _PRUNED.format("weight")),
    Case("prune-then-attach-sparse-grad-encoder",
         lambda: _prune_then_attach(0, "weight_t", 0.5, sparse_grad=True),
         NotImplementedError, r"model: SparseLinearBatch '0': " + _PRUNED.format("weight_t")),
    Case("prune-then-attach-decoder", lambda: _prune_then_attach(4, "weight", 0.5),
         NotImplementedError, r"model: SparseOutputLinear '4': " + _PRUNED.format("weight")),
    Case("pruned-and-frozen-then-attach-is-left-to-the-dense-part",
         lambda: _prune_then_attach(4, "weight", 0.5, frozen=True), None,
         check=lambda opt: list(opt.tables) == ["0"]),
    # 4. torch.func.functional_call with a tensor that is not the parameter
    Case("functional-call-of-a-computed-encoder-weight",
         _misused(False, lambda m: None,
                  _functional_call({"0.weight": lambda m: m[0].weight * 1.0})),
         RuntimeError, _NOT_OWNED.format("SparseLinearBatch '0'", "weight", _NOT_PARAMETER)),
    Case("functional-call-of-a-detached-decoder-weight-that-requires-grad",
         _misused(True, lambda m: None,
                  _functional_call({"4.weight": lambda m: m[4].weight.detach().clone()
                                    .requires_grad_()})),
         RuntimeError, _NOT_OWNED.format("SparseOutputLinear '4'", "weight", _NOT_PARAMETER)),
    Case("functional-call-of-another-parameter",
         _misused(False, lambda m: None,
                  _functional_call({"4.weight": lambda m: nn.Parameter(torch.zeros(6, 4))})),
         RuntimeError, _NOT_OWNED.format("SparseOutputLinear '4'", "weight",
                                         "another Parameter")),
    # what still works: no_grad (nothing is updated), and the model's own parameters
    Case("functional-call-of-a-computed-weight-under-no-grad",
         lambda: _functional_call({"0.weight": lambda m: m[0].weight * 2.0}, no_grad=True)(
             _autoencoder()), None, check=lambda out: out.layout == torch.sparse_coo),
    Case("functional-call-of-the-models-own-parameters-trains-as-the-model",
         _own_parameters_in_functional_call, None, check=lambda m: True),
    # a weight that requires no grad gets no step (nothing for the table to update): a
    # grad-enabled call with it runs as before (refused in between, review rvm)
    *[Case(f"functional-call-of-{what}-runs-sparse-grad-{sg}",
           lambda sg=sg, names=names: _frozen_in_functional_call(sg, names), None,
           check=lambda ok: ok)
      for sg in (False, True)
      for what, names in (("detached-weights-for-input-gradients", ("0", "4")),
                          ("a-detached-decoder-weight", ("4",)))],
]


@pytest.mark.parametrize("case", MISUSE_CASES, ids=lambda c: c.id)
def test_the_weight_read_must_be_the_in_backward_tables_parameter(case):
    run_case(case)


def test_pruned_way_round_trains_weight_orig():
    """The way round the pruning refusal names: remove() the in-backward optimiser and
    train with LazyAdam, which trains weight_orig through the mask."""
    model = _autoencoder()
    opt = apply_optimizer_in_backward(model, "adam", lr=0.1)
    _prune("weight", 0.5)(model[4])
    with pytest.raises(RuntimeError, match="is pruned"):
        _loss(model, _x()).backward()
    opt.remove()
    lazy = LazyAdam(model.parameters(), lr=0.1)
    orig = model[4].weight_orig.detach().clone()
    lazy.zero_grad()
    _loss(model, _x()).backward()
    lazy.step()
    mask = model[4].weight_mask.bool()
    assert not torch.equal(model[4].weight_orig[mask], orig[mask])


@pytest.mark.parametrize("how", list(PARAMETRIZE))
def test_parametrized_weight_of_a_frozen_layer_is_left_to_the_dense_part(how):
    model = _autoencoder()
    PARAMETRIZE[how](model[0])
    model[0].requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    opt = apply_optimizer_in_backward(model, "sgd", lr=0.1)
    assert list(opt.tables) == ["4"]
    after = model.state_dict()  # (the parametrization was not run: spectral_norm's buffers)
    assert all(torch.equal(before[k], after[k]) for k in before)


# -- torch.func --------------------------------------------------------------------------------

@pytest.mark.parametrize("sparse_grad", [False, True])
def test_functional_call_grad_and_vjp_equal_autograd(sparse_grad):
    model = _autoencoder(sparse_grad)
    x = _x()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    g = grad(lambda p: _loss_of_out(functional_call(model, p, (x, x)), x))(params)
    out, pullback = vjp(lambda p: functional_call(model, p, (x, x)).values(), params)
    v = pullback(torch.ones_like(out))[0]
    _loss(model, x).backward()
    for name, p in model.named_parameters():
        assert g[name].layout == p.grad.layout, name
        torch.testing.assert_close(_dense(g[name]), _dense(p.grad), msg=name)
    model.zero_grad()
    model(x, x).values().sum().backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(_dense(v[name]), _dense(p.grad), msg=name)


def _loss_of_out(out, x):
    return (out.values() - x.values()).pow(2).mean()


def test_func_grad_with_respect_to_the_input_values():
    model = _autoencoder()
    x = _x().coalesce()
    g = grad(lambda v: model(nnsparse.values_map(lambda _: v, x), x).values().sum())(x.values())
    values = x.values().clone().requires_grad_()
    model(torch.sparse_coo_tensor(x.indices(), values, x.shape), x).values().sum().backward()
    torch.testing.assert_close(g, values.grad)


def test_func_grad_through_the_optimiser_in_the_backward_is_refused():
    model = _autoencoder()
    apply_optimizer_in_backward(model, "adam")
    x = _x()
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises(NotImplementedError, match=r"SparseLinearBatch '0': the optimiser in the "
                                                  r"backward .* a torch.func transform"):
        grad(lambda p: functional_call(model, p, (x, x)).values().sum())(params)


# -- swap_module_params_on_conversion ----------------------------------------------------------

@pytest.fixture
def swap_on_conversion():
    future.set_swap_module_params_on_conversion(True)
    yield
    future.set_swap_module_params_on_conversion(False)


@pytest.mark.parametrize("kind", ["lazy-adam", "make-optimizer"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_swap_conversion_then_the_optimiser_reloaded_as_with_torch(swap_on_conversion, kind, dtype):
    """torch's own Adam fails after such a conversion (its state stays float32); its way
    round, ``opt.load_state_dict(opt.state_dict())``, casts the state: so does nnsparse's."""
    model = _autoencoder()
    opt = OPTIMISERS[kind](model)
    x = _x()
    opt.zero_grad()
    _loss(model, x).backward()
    opt.step()
    ids = [id(p) for p in model.parameters()]
    model.to(dtype)
    assert [id(p) for p in model.parameters()] == ids  # swapped in place, optimiser kept
    with pytest.raises(RuntimeError):
        opt.zero_grad()
        _loss(model, x.to(dtype)).backward()
        opt.step()
    opt.load_state_dict(opt.state_dict())
    opt.zero_grad()
    _loss(model, x.to(dtype)).backward()
    opt.step()
    assert model[0].weight.dtype == dtype and model[0].weight.stride() == (1, 4)


@pytest.mark.parametrize("kind", IN_BACKWARD)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_swap_conversion_with_the_optimiser_in_the_backward(swap_on_conversion, kind, dtype):
    """Its state is made when it is built: a step after the conversion is refused, naming
    the ways round; ``opt.load_state_dict(opt.state_dict())`` converts the state, as for
    torch's optimisers (before the fix it copied into the old float32 state and the next
    step was refused again), and trains as an optimiser built again and given the state."""
    model = _autoencoder()
    opt = OPTIMISERS[kind](model)
    x = _x()
    opt.zero_grad()
    _loss(model, x).backward()
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    rebuilt = copy.deepcopy(model).to(dtype)  # the reference: built again, given the state
    model.to(dtype)
    with pytest.raises(RuntimeError, match=r"SparseOutputLinear '4': the in-backward optimiser "
                                           r"state is torch.float32 .* move or convert the model "
                                           r"before .* optimizer.load_state_dict\("
                                           r"optimizer.state_dict\(\)\) converts the state"):
        _loss(model, x.to(dtype)).backward()
    opt.load_state_dict(opt.state_dict())
    rebuilt_opt = OPTIMISERS[kind](rebuilt)
    rebuilt_opt.load_state_dict(saved)
    for m, o in ((model, opt), (rebuilt, rebuilt_opt)):
        o.zero_grad()
        _loss(m, x.to(dtype)).backward()
        o.step()
    assert all(t.dtype == dtype for t in opt.tables["0"].values() if t.dim() > 0)
    assert model[0].weight.stride() == (1, 4)
    _assert_same_weights(model, rebuilt)


# -- freezing ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", list(OPTIMISERS))
@pytest.mark.parametrize("what", ["encoder", "weight"])
def test_frozen_after_building_stays_then_trains_when_unfrozen(kind, what):
    model = _autoencoder()
    reference = copy.deepcopy(model)
    opt = OPTIMISERS[kind](model)
    x = _x()

    def step():
        opt.zero_grad()
        _loss(model, x).backward()
        opt.step()

    step()
    (model[0] if what == "encoder" else model[0].weight).requires_grad_(False)
    frozen = [model[0].weight.detach().clone(), model[0].bias.detach().clone()]
    decoder = model[4].weight.detach().clone()
    step()
    step()
    assert torch.equal(model[0].weight, frozen[0])
    assert torch.equal(model[0].bias, frozen[1]) == (what == "encoder")
    assert not torch.equal(model[4].weight, decoder)
    model[0].requires_grad_(True)
    step()
    assert not torch.equal(model[0].weight, frozen[0])
    del reference


@pytest.mark.parametrize("kind", list(OPTIMISERS))
def test_frozen_before_building_never_moves(kind):
    model = _autoencoder()
    model[0].requires_grad_(False)
    opt = OPTIMISERS[kind](model)
    before = model[0].weight.detach().clone()
    opt.zero_grad()
    _loss(model, _x()).backward()
    opt.step()
    assert torch.equal(model[0].weight, before)


# -- gradient accumulation ---------------------------------------------------------------------

ACCUMULATING = {  # nnsparse optimiser -> torch's, on the same model with dense gradients
    "lazy-adam": (False, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)),
    "lazy-adam-sparse-grad": (True, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)),
    "make-optimizer": (True, lambda m: torch.optim.Adam(m.parameters(), lr=1e-2)),
}


@pytest.mark.parametrize("name", list(ACCUMULATING))
def test_gradient_accumulation_equals_torch(name):
    sparse_grad, make_torch = ACCUMULATING[name]
    model = _autoencoder(sparse_grad)
    reference = _autoencoder(False)
    opt = (nnsparse.make_optimizer(model, lr=1e-2) if name == "make-optimizer"
           else LazyAdam(model.parameters(), lr=1e-2))
    ref_opt = make_torch(reference)
    for m, o in ((model, opt), (reference, ref_opt)):
        for _ in range(2):
            o.zero_grad(set_to_none=False)
            _loss(m, _x()).backward()
            _loss(m, _x2()).backward()
            o.step()
    _assert_same_weights(model, reference)


_ACCUMULATION = (r"SparseOutputLinear '4': a second backward since the optimiser's last "
                 r"step\(\) or zero_grad\(\) \(gradient accumulation.*not an accumulated step")


@pytest.mark.parametrize("kind", IN_BACKWARD)
def test_accumulation_with_the_optimiser_in_the_backward_is_refused(kind):
    """Before the fix, as the docs did not say: each backward stepped the in-backward weights
    with its own batch's gradient, while the dense part summed the gradients and stepped
    once.  The docs promised a RuntimeError: the second backward now raises it, in the
    decoder's backward, before the decoder's step (the first to run), so nothing moved."""
    model = _autoencoder()
    opt = OPTIMISERS[kind](model)
    opt.zero_grad()
    _loss(model, _x()).backward()
    after_first = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    with pytest.raises(RuntimeError, match=_ACCUMULATION):
        _loss(model, _x2()).backward()
    _assert_same_weights(model, _Holder(after_first))
    assert all(torch.equal(a, p.grad) for a, p in
               zip(grads, [p for p in model.parameters() if p.grad is not None]))
    opt.step()  # the step of the first batch; the loop goes on
    for x in (_x2(), _x()):
        opt.zero_grad()
        _loss(model, x).backward()
        opt.step()


@pytest.mark.parametrize("kind", IN_BACKWARD)
def test_accumulation_refused_behind_a_dense_head(kind):
    """A dense module nearer the loss than the sparse layer runs its backward before the
    refusal: the sparse weight has not moved, the head's .grad holds both batches' (the
    message says so), and zero_grad() starts a proper step again."""
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(6, 4), nn.Tanh(), nn.Linear(4, 2))
    opt = OPTIMISERS[kind](model)
    opt.zero_grad()
    model(_x()).pow(2).sum().backward()
    weight, head = model[0].weight.detach().clone(), model[2].weight.grad.clone()
    with pytest.raises(RuntimeError, match=r"SparseLinearBatch '0': a second backward since "
                       r".*another parameter \(a dense head\) an addition to its \.grad, "
                       r"which zero_grad\(\) drops"):
        model(_x2()).pow(2).sum().backward()
    assert torch.equal(model[0].weight, weight)
    assert not torch.equal(model[2].weight.grad, head)
    opt.zero_grad()
    model(_x2()).pow(2).sum().backward()
    opt.step()
    assert not torch.equal(model[0].weight, weight)


class _Holder:
    def __init__(self, state):
        self._state = state

    def state_dict(self):
        return self._state


@pytest.mark.parametrize("end", ["step", "zero_grad"])
def test_a_backward_after_step_or_zero_grad_is_a_new_step(end):
    model = _autoencoder()
    opt = apply_optimizer_in_backward(model, "sgd", lr=0.1)
    for x in (_x(), _x2(), _x()):
        _loss(model, x).backward()
        getattr(opt, end)()
    assert opt._updates["0"].updates == 3


def test_without_a_dense_part_each_backward_is_a_step():
    """A layer with no bias has nothing to accumulate beside its in-backward weight: each
    backward steps it (torch's SGD stepped after each batch), with or without step()."""
    torch.manual_seed(0)
    ours = nnsparse.SparseLinearBatch(6, 3, bias=False)
    reference = copy.deepcopy(ours)
    opt = apply_optimizer_in_backward(ours, "sgd", lr=0.1)
    assert opt.dense is None
    ours(_x()).pow(2).sum().backward()
    ours(_x2()).pow(2).sum().backward()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x in (_x(), _x2()):
        ref_opt.zero_grad()
        reference(x).pow(2).sum().backward()
        ref_opt.step()
    torch.testing.assert_close(ours.weight, reference.weight)


def test_summed_losses_with_the_optimiser_in_the_backward_are_refused():
    model = _autoencoder()
    apply_optimizer_in_backward(model, "adam")
    with pytest.raises(RuntimeError, match=r"SparseOutputLinear '4': this layer is used 2 "
                                           r"times in the graph this backward runs"):
        (_loss(model, _x()) + _loss(model, _x2())).backward()


# -- torch.autograd.grad and backward(inputs=...) with the optimiser in the backward ----------

# what is asked for: parameter names of the model (a sparse layer's weight: its parameter,
# weight_t with sparse_grad=True) or "input" (the batch's values); "2.weight" lies between
# the encoder and the decoder, "input" before the encoder
GRAD_TARGETS = {
    "enc-bias": ["0.bias"],
    "dense-between": ["2.weight", "2.bias"],
    "dec-bias": ["4.bias"],
    "input": ["input"],
    "input-and-biases": ["input", "0.bias", "4.bias"],
    "enc-weight": ["0.weight"],
    "dec-weight": ["4.weight"],
    "every-parameter": ["0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"],
}


def _input_requiring_grad():
    x = _x().coalesce()
    values = x.values().clone().requires_grad_()
    return torch.sparse_coo_tensor(x.indices(), values, x.shape, is_coalesced=True), values


def _targets(model, names, values):
    params = dict(model.named_parameters())
    out = []
    for name in names:
        if name == "input":
            out.append(values)
        elif name not in params:  # sparse_grad=True: the encoder's parameter is weight_t
            out.append(params[name + "_t"])
        else:
            out.append(params[name])
    return out


def _as_reference(t, like):
    """A gradient of weight_t (sparse_grad=True) read in the reference's weight shape."""
    return t.t() if t.shape != like.shape else t


def _tables(opt):
    return {f"{n}.{k}": t.clone() for n, table in opt.tables.items() for k, t in table.items()}


def _assert_unchanged(model, opt, weights, tables):
    _assert_same_weights(model, _Holder(weights))
    for key, t in _tables(opt).items():
        assert torch.equal(t, tables[key]), key
    assert all(u.updates == 0 and not u.pending for u in opt._updates.values())


# backward(inputs=[a sparse layer's weight]) accumulates into it: that is its step
_HOWS = [(how, target) for target in GRAD_TARGETS for how in ("autograd.grad", "backward(inputs)")
         if how == "autograd.grad" or "weight" not in target and target != "every-parameter"]


@pytest.mark.parametrize("kind", IN_BACKWARD)
@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("how,target", _HOWS)
def test_gradients_of_other_tensors_step_nothing(kind, sparse_grad, how, target):
    """Before: every in-backward layer on the path took its step (state and all) when
    torch.autograd.grad or backward(inputs=...) asked for anything behind it.  Now
    nothing moves, the gradients are the dense model's under torch's autograd (the
    weight's own: dense, in its parameter's shape), and the next ordinary step is the
    step of a model that never made the call (not refused as gradient accumulation)."""
    names = GRAD_TARGETS[target]
    model, twin, reference = (_autoencoder(sparse_grad), _autoencoder(sparse_grad),
                              _autoencoder(False))
    opt, twin_opt = OPTIMISERS[kind](model), OPTIMISERS[kind](twin)
    weights, tables = copy.deepcopy(model.state_dict()), _tables(opt)
    x, values = _input_requiring_grad()
    ref_x, ref_values = _input_requiring_grad()
    ref_targets = _targets(reference, names, ref_values)
    want = torch.autograd.grad(_loss(reference, ref_x), ref_targets)
    targets = _targets(model, names, values)
    if how == "autograd.grad":
        got = torch.autograd.grad(_loss(model, x), targets)
        assert all(p.grad is None for p in model.parameters())
    else:
        _loss(model, x).backward(inputs=targets)
        got = tuple(t.grad for t in targets)
    for g, w, t in zip(got, want, targets):
        assert g.layout == torch.strided and g.shape == t.shape
        torch.testing.assert_close(_as_reference(g, w), w, rtol=1e-6, atol=1e-7)
    _assert_unchanged(model, opt, weights, tables)
    for m, o in ((model, opt), (twin, twin_opt)):  # then the ordinary loop, as if never called
        for batch in (_x(), _x2()):
            o.zero_grad()
            _loss(m, batch).backward()
            o.step()
    _assert_same_weights(model, twin)


def test_backward_inputs_of_one_weight_steps_that_layer_only():
    """backward(inputs=[encoder weight]) accumulates into the encoder's weight, so the
    encoder takes its step; the decoder, whose weight is not asked for, does not."""
    model = _autoencoder()
    opt = apply_optimizer_in_backward(model, "sgd", lr=0.1)
    before = copy.deepcopy(model.state_dict())
    _loss(model, _x()).backward(inputs=[model[0].weight])
    assert not torch.equal(model[0].weight, before["0.weight"])
    assert torch.equal(model[4].weight, before["4.weight"])
    assert (opt._updates["0"].updates, opt._updates["4"].updates) == (1, 0)


def test_a_gradient_of_other_tensors_then_the_backward_of_the_same_graph_steps_once():
    """A gradient norm logged from the graph (retain_graph=True), then its backward: one
    step, the step of a model that never made the call."""
    model, twin = _autoencoder(), _autoencoder()
    opt, twin_opt = fused_step_optimizer(model, lr=1e-2), fused_step_optimizer(twin, lr=1e-2)
    loss = _loss(model, _x())
    dense = [p for name, p in model.named_parameters() if not name.endswith(("0.weight",
                                                                             "4.weight"))]
    norm = torch.linalg.vector_norm(torch.cat(
        [g.flatten() for g in torch.autograd.grad(loss, dense, retain_graph=True)]))
    assert norm > 0
    for m, o, l in ((model, opt, loss), (twin, twin_opt, _loss(twin, _x()))):
        o.zero_grad()
        l.backward()
        o.step()
    _assert_same_weights(model, twin)
    assert opt._updates["0"].updates == 1


def test_without_the_engines_answer_every_backward_steps(monkeypatch):
    """torch._C._will_engine_execute_node is private: where a torch lacks it, the layers
    step in every backward that reaches them, as before they asked."""
    monkeypatch.delattr(torch._C, "_will_engine_execute_node")
    model = _autoencoder()
    opt = apply_optimizer_in_backward(model, "sgd", lr=0.1)
    before = model[0].weight.detach().clone()
    torch.autograd.grad(_loss(model, _x()), model[0].bias)
    assert not torch.equal(model[0].weight, before)
    assert opt._updates["0"].updates == 1


def test_gradients_of_other_tensors_make_no_weight_gradient_rows(monkeypatch):
    """Skipped, not made and dropped: the step and the weight's gradient products are
    never called (the same on the synchronisation-free path of a GPU, forced here)."""
    from nnsparse.layers import linear, sparse_output

    def refuse(*args, **kwargs):
        raise AssertionError("the weight's gradient rows were made")
    for module, name in ((linear, "_update_rows_of"), (linear, "_table_grad"),
                         (sparse_output, "_update_rows_of"), (sparse_output, "_t_mm")):
        monkeypatch.setattr(module, name, refuse)
    monkeypatch.setattr(nnsparse._kernels, "_SYNC_FREE", ("cpu",))
    model = _autoencoder()
    fused_step_optimizer(model, lr=1e-2)
    x, values = _input_requiring_grad()
    torch.autograd.grad(_loss(model, x), [values, model[0].bias, model[2].weight])
    with pytest.raises(AssertionError, match="gradient rows were made"):
        _loss(model, _x()).backward()


@pytest.mark.parametrize("kind", IN_BACKWARD)
def test_sync_free_path_after_a_gradient_of_other_tensors(kind, monkeypatch):
    """The GPU's path (forced on the CPU): the same as the row update's."""
    monkeypatch.setattr(nnsparse._kernels, "_SYNC_FREE", ("cpu",))
    model, twin = _autoencoder(), _autoencoder()
    opt, twin_opt = OPTIMISERS[kind](model), OPTIMISERS[kind](twin)
    weights, tables = copy.deepcopy(model.state_dict()), _tables(opt)
    g, = torch.autograd.grad(_loss(model, _x()), model[2].weight)
    want, = torch.autograd.grad(_loss(twin, _x()), twin[2].weight)
    torch.testing.assert_close(g, want)
    _assert_unchanged(model, opt, weights, tables)
    for m, o in ((model, opt), (twin, twin_opt)):
        o.zero_grad()
        _loss(m, _x2()).backward()
        o.step()
    _assert_same_weights(model, twin)


# the torch optimiser each in-backward kind is (every row touched: _x()), on a dense model
TORCH_EQUIVALENT = {
    "fused-step": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2),
    "in-backward-sgd": lambda m: torch.optim.SGD(m.parameters(), lr=1e-2, momentum=0.9),
    "in-backward-adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2),
    "in-backward-adagrad": lambda m: torch.optim.Adagrad(m.parameters(), lr=1e-2),
}


@pytest.mark.parametrize("kind", list(TORCH_EQUIVALENT))
@pytest.mark.parametrize("of", ["4.bias", "4.weight"])
@pytest.mark.parametrize("sparse_grad", [False, True])
def test_gradient_penalty_of_the_decoder_equals_torch(kind, of, sparse_grad):
    """create_graph=True for the decoder's own bias or weight (whose recorded gradient
    does not read the weight; dense, in the weight's shape, with sparse_grad=True too):
    the penalised loss's backward steps each layer with the whole gradient, as torch's
    optimiser on the dense model does."""
    model, reference = _autoencoder(sparse_grad), _autoencoder()
    opt, ref_opt = OPTIMISERS[kind](model), TORCH_EQUIVALENT[kind](reference)
    for m, o in ((model, opt), (reference, ref_opt)):
        for batch in (_x(), _x2()):
            o.zero_grad()
            loss = _loss(m, batch)
            g, = torch.autograd.grad(loss, dict(m.named_parameters())[of], create_graph=True)
            assert g.layout == torch.strided
            (loss + g.square().sum()).backward()
            o.step()
    _assert_same_weights(model, reference)
    assert all(p.grad is None for n, p in model.named_parameters() if "weight" in n and
               n.startswith(("0.", "4.")))


@pytest.mark.parametrize("sparse_grad", [False, True])
@pytest.mark.parametrize("kind", list(TORCH_EQUIVALENT))
@pytest.mark.parametrize("of", ["0.bias", "0.weight", "2.weight"])
def test_gradient_penalty_behind_a_dense_head_equals_torch(of, kind, sparse_grad):
    """The encoder nearest the input (nothing before it requires grad): a penalty on its
    bias or weight (dense, in the parameter's shape: weight_t's with sparse_grad=True) or
    on the head's weight, then the penalised loss's backward, is torch's step."""
    def build(sparse):
        torch.manual_seed(0)
        return nn.Sequential(nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse), nn.Tanh(),
                             nn.Linear(4, 2))
    model, reference = build(sparse_grad), build(False)
    opt, ref_opt = OPTIMISERS[kind](model), TORCH_EQUIVALENT[kind](reference)
    for m, o in ((model, opt), (reference, ref_opt)):
        for batch in (_x(), _x2()):
            o.zero_grad()
            loss = m(batch).pow(2).mean()
            g, = torch.autograd.grad(loss, _targets(m, [of], None), create_graph=True)
            assert g.layout == torch.strided
            (loss + g.square().sum()).backward()
            o.step()
    _assert_same_weights(model, reference)


@pytest.mark.parametrize("of", ["2.weight", "input", "0.weight"])
def test_gradient_penalty_reading_an_in_backward_weight_is_refused(of):
    """The gradient of anything before the decoder reads the decoder's weight: a backward
    through it would give that weight a .grad no optimiser applies.  Refused, before
    anything moves."""
    model = _autoencoder()
    opt = fused_step_optimizer(model, lr=1e-2)
    weights, tables = copy.deepcopy(model.state_dict()), _tables(opt)
    x, values = _input_requiring_grad()
    with pytest.raises(RuntimeError, match=r"^SparseOutputLinear '4': a gradient recorded with "
                       r"create_graph=True through this layer's input reads its weight.*"
                       r"would give the weight a \.grad that no optimiser applies"):
        torch.autograd.grad(_loss(model, x), _targets(model, [of], values), create_graph=True)
    _assert_unchanged(model, opt, weights, tables)


# -- zero_grad(set_to_none=False), AveragedModel, update_bn, clip_grad_value_ ------------------

@pytest.mark.parametrize("kind", list(OPTIMISERS))
def test_zero_grad_keeping_tensors_trains_as_set_to_none(kind):
    a, b = _autoencoder(), _autoencoder()
    opts = OPTIMISERS[kind](a), OPTIMISERS[kind](b)
    for _ in range(2):
        for m, o, to_none in ((a, opts[0], True), (b, opts[1], False)):
            o.zero_grad(set_to_none=to_none)
            _loss(m, _x()).backward()
            o.step()
    _assert_same_weights(a, b)
    if kind in IN_BACKWARD:
        assert b[0].weight.grad is None and b[4].weight.grad is None


class _WithBatchNorm(nn.Module):
    def __init__(self, sparse_grad):
        super().__init__()
        torch.manual_seed(0)
        self.enc = nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse_grad)
        self.bn = nn.BatchNorm1d(4)
        self.dec = nnsparse.SparseOutputLinear(4, 6, sparse_grad=sparse_grad)

    def forward(self, x, pattern=None):
        return self.dec(torch.tanh(self.bn(self.enc(x))), pattern)


@pytest.mark.parametrize("kind,sparse_grad", [("lazy-adam", True), ("make-optimizer", True),
                                              ("fused-step", False),
                                              ("in-backward-rowwise", True)])
def test_averaged_model_and_update_bn(kind, sparse_grad):
    model = _WithBatchNorm(sparse_grad)
    opt = OPTIMISERS[kind](model)
    averaged = AveragedModel(model)
    seen = []
    for _ in range(3):
        opt.zero_grad()
        _loss(model, _x()).backward()
        opt.step()
        averaged.update_parameters(model)
        seen.append(copy.deepcopy(model.state_dict()))
    mean = torch.stack([s["enc.weight"] for s in seen]).mean(0)
    torch.testing.assert_close(averaged.module.enc.weight, mean)
    update_bn([_x(), _x2()], averaged)  # a loader of sparse tensors
    batches = torch.cat([_x().to_dense(), _x2().to_dense()]) @ averaged.module.enc.weight.t() \
        + averaged.module.enc.bias
    torch.testing.assert_close(averaged.module.bn.running_mean, batches.mean(0))
    assert averaged(_x(), _x()).layout == torch.sparse_coo


def test_update_bn_over_a_sparse_row_loader_takes_the_inputs():
    """update_bn hands a loader's item to the model as it is (the first element of a list
    or tuple): a SparseRowBatch is refused by the layer, naming it; give it the inputs."""
    data = SparseRowDataset(torch.cat([_x().to_dense(), _x2().to_dense()]).to_sparse_csr())
    loader = torch.utils.data.DataLoader(data, batch_size=4, collate_fn=data.collate)
    averaged = AveragedModel(_WithBatchNorm(False))
    with pytest.raises(TypeError, match=r"input must be a sparse tensor, a pair tensor or a "
                                        r"list of sparse rows, got SparseRowBatch"):
        update_bn(loader, averaged)
    update_bn((batch.input for batch in loader), averaged)
    assert int(averaged.module.bn.num_batches_tracked) == 1


@pytest.mark.parametrize("clip", [0.01, 0.1])
def test_clip_grad_value_on_sparse_gradients_equals_torch_on_dense(clip):
    sparse, dense = _autoencoder(True), _autoencoder(False)
    for m in (sparse, dense):
        _loss(m, _x()).backward()
    with pytest.raises(NotImplementedError, match="clamp_min_"):
        torch.nn.utils.clip_grad_value_(sparse.parameters(), clip)
    nnsparse.optim.clip_grad_value_(sparse.parameters(), clip)
    torch.nn.utils.clip_grad_value_(dense.parameters(), clip)
    for p, q in zip(sparse.parameters(), dense.parameters()):
        torch.testing.assert_close(_dense(p.grad).reshape(-1).sort()[0],
                                   _dense(q.grad).reshape(-1).sort()[0])


# -- hooks with keyword arguments --------------------------------------------------------------

def test_forward_pre_hook_with_kwargs_sees_and_replaces_the_pattern():
    model = _autoencoder()
    seen = []
    narrower = torch.tensor([[1., 0, 0, 0, 0, 1], [0, 0, 0, 0, 4, 0]]).to_sparse()
    model[4].register_forward_pre_hook(lambda m, args, kw: seen.append(sorted(kw)),
                                       with_kwargs=True)
    model.register_forward_pre_hook(lambda m, args, kw: (args, {**kw, "pattern": narrower}),
                                    with_kwargs=True)
    out = model(_x(), pattern=_x())
    assert seen == [["pattern"]] and out._nnz() == narrower._nnz()


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_full_backward_hook_on_a_dense_boundary_module(sparse_grad):
    """On the encoder (dense output) and the middle layer: works.  On the whole model (a
    sparse input): torch's own error, docs/ecosystem_probe.md."""
    model = _autoencoder(sparse_grad)
    grads = []
    model[0].register_full_backward_hook(lambda m, gi, go: grads.append(go[0].shape))
    model[2].register_full_backward_hook(lambda m, gi, go: grads.append(gi[0].shape))
    _loss(model, _x()).backward()
    assert grads == [torch.Size([2, 4])] * 2


# -- DataLoader workers ------------------------------------------------------------------------

@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_persistent_workers_over_a_pair_dataset(context):
    dense = torch.cat([_x().to_dense(), _x2().to_dense(), torch.zeros(1, 6)])
    data = SparseRowDataset(dense.to_sparse_csr(), (2 * dense).to_sparse())
    loader = torch.utils.data.DataLoader(
        data, batch_size=2, num_workers=2, persistent_workers=True, pin_memory=False,
        collate_fn=data.collate, multiprocessing_context=context, shuffle=True)
    rows = 0
    for _ in range(2):  # the second epoch on the same workers
        for batch in loader:
            torch.testing.assert_close(batch.input.to_dense(), dense[batch.row_index])
            torch.testing.assert_close(batch.target.to_dense(), 2 * dense[batch.row_index])
            rows += len(batch.row_index)
    assert rows == 2 * len(dense)
