"""LazyAdam against torch.optim.Adam/AdamW/SparseAdam and a masked reference."""
import copy

import numpy as np
import pytest
import torch
from torch.optim.optimizer import required

import nnsparse

from nnsparse import optim as noptim
from matrix import DEVICES

CASES = dict(lr=0.05, betas=(0.8, 0.95), eps=1e-6)


def _row_grad(rows, shape, gen, dtype=torch.float64):
    values = torch.randn(len(rows), *shape[1:], generator=gen, dtype=dtype)
    return torch.sparse_coo_tensor(torch.tensor([rows]), values, shape)


def _column_grad(cols, shape, gen):
    block = torch.randn(shape[0], len(cols), generator=gen, dtype=torch.float64)
    dense = torch.zeros(shape, dtype=torch.float64)
    dense[:, cols] = block
    # a 2-D COO holding every row of the touched columns, as SparseLinearBatch gives
    index = torch.stack(torch.meshgrid(torch.arange(shape[0]), torch.tensor(cols),
                                       indexing="ij")).reshape(2, -1)
    return torch.sparse_coo_tensor(index, block.reshape(-1), shape).coalesce(), dense


def _masked_reference(p, grads_and_masks, lr, betas, eps, weight_decay=0.0, decoupled=False):
    """Lazy Adam written with dense masks: untouched entries keep p, m and v."""
    p, m, v = p.clone(), torch.zeros_like(p), torch.zeros_like(p)
    for step, (g, mask) in enumerate(grads_and_masks, 1):
        if weight_decay and not decoupled:
            g = g + weight_decay * p
        m_new = betas[0] * m + (1 - betas[0]) * g
        v_new = betas[1] * v + (1 - betas[1]) * g * g
        denom = v_new.sqrt() / (1 - betas[1] ** step) ** 0.5 + eps
        update = -lr / (1 - betas[0] ** step) * m_new / denom
        if weight_decay and decoupled:
            update = update - lr * weight_decay * p
        p = torch.where(mask, p + update, p)
        m, v = torch.where(mask, m_new, m), torch.where(mask, v_new, v)
    return p


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("decoupled", [False, True])
def test_dense_grad_is_adam(device, decoupled, kernel):
    gen = torch.Generator().manual_seed(0)
    p = torch.randn(5, 4, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    q = p.detach().clone().requires_grad_()
    ours = noptim.LazyAdam([p], weight_decay=0.1, decoupled_weight_decay=decoupled, **CASES)
    ref = (torch.optim.AdamW if decoupled else torch.optim.Adam)([q], weight_decay=0.1, **CASES)
    for _ in range(3):
        g = torch.randn(5, 4, generator=gen, dtype=torch.float64).to(device)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, q)


def test_row_grad_is_sparse_adam(kernel):
    gen = torch.Generator().manual_seed(1)
    p = torch.randn(8, 3, generator=gen, dtype=torch.float64).requires_grad_()
    q = p.detach().clone().requires_grad_()
    # tiny eps: SparseAdam adds eps before the bias correction of the second
    # moment, Adam (and LazyAdam, so that dense and sparse agree) after it
    args = dict(CASES, eps=1e-300)
    ours, ref = noptim.LazyAdam([p], **args), torch.optim.SparseAdam([q], **args)
    for rows in ([1, 5], [5, 0, 7], [], [2]):
        g = _row_grad(rows, (8, 3), gen)
        p.grad, q.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, q)


@pytest.fixture(params=["fused", "plain"])
def kernel(request, monkeypatch):
    """Run a test with torch's fused Adam kernel and with the plain fallback."""
    monkeypatch.setattr(noptim, "_USE_FUSED", request.param == "fused")
    return request.param


@pytest.mark.parametrize("chunk", [4, 12, 1 << 22])
@pytest.mark.parametrize("decoupled", [False, True])
@pytest.mark.parametrize("kind", ["rows", "columns", "entries"])
def test_lazy_weight_decay_touches_only_used_entries(kind, decoupled, chunk, kernel,
                                                     monkeypatch):
    # small chunks exercise the blocked loops and both per-block strategies
    monkeypatch.setattr(noptim, "_CHUNK", chunk)
    gen = torch.Generator().manual_seed(2)
    shape = (4, 6)
    p = torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_()
    start = p.detach().clone()
    opt = noptim.LazyAdam([p], weight_decay=0.3, decoupled_weight_decay=decoupled, **CASES)
    steps = []
    # at most half and more than half of the rows/columns: both strategies
    for touched in ([0, 2], [1, 2, 3, 5], [1], [0, 1, 2, 3, 4, 5], [3]):
        if kind == "rows":
            rows = [t for t in touched if t < shape[0]]
            g = _row_grad(rows, shape, gen)
            dense = g.to_dense()
            mask = torch.zeros(shape, dtype=torch.bool)
            mask[rows] = True
        elif kind == "columns":
            g, dense = _column_grad(touched, shape, gen)
            mask = torch.zeros(shape, dtype=torch.bool)
            mask[:, touched] = True
        else:
            index = torch.tensor([[t % shape[0] for t in touched], touched])
            values = torch.randn(len(touched), generator=gen, dtype=torch.float64)
            # uncoalesced, with a duplicate: the two halves must be summed
            g = torch.sparse_coo_tensor(torch.cat([index, index], 1),
                                        torch.cat([values * 0.5, values * 0.5]), shape)
            dense = g.to_dense()
            mask = dense != 0
        steps.append((dense, mask))
        p.grad = g
        opt.step()
    expected = _masked_reference(start, steps, weight_decay=0.3, decoupled=decoupled, **CASES)
    torch.testing.assert_close(p.detach(), expected)
    never = ~torch.stack([m for _, m in steps]).any(0)
    assert torch.equal(p.detach()[never], start[never])


def test_sparse_everywhere_equals_dense_adam_with_decay(kernel):
    """When every row is touched each step, lazy decay is Adam's decay."""
    gen = torch.Generator().manual_seed(3)
    p = torch.randn(3, 2, generator=gen, dtype=torch.float64).requires_grad_()
    q = p.detach().clone().requires_grad_()
    ours = noptim.LazyAdam([p], weight_decay=0.2, **CASES)
    ref = torch.optim.Adam([q], weight_decay=0.2, **CASES)
    for _ in range(3):
        g = _row_grad([0, 1, 2], (3, 2), gen)
        p.grad, q.grad = g, g.to_dense()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, q)


def test_mixed_params_and_state_dict():
    emb = torch.nn.Embedding(6, 2, sparse=True)
    lin = torch.nn.Linear(2, 1)
    params = list(emb.parameters()) + list(lin.parameters())
    opt = noptim.LazyAdam(params, lr=0.1)
    lin(emb(torch.tensor([0, 3]))).sum().backward()
    opt.step()
    clone = copy.deepcopy(opt.state_dict())
    other = noptim.LazyAdam(params, lr=0.1)
    other.load_state_dict(clone)
    assert other.state_dict()["state"][0]["step"] == 1


def test_closure_and_errors():
    p = torch.zeros(2, requires_grad=True)
    opt = noptim.LazyAdam([p])

    def closure():
        opt.zero_grad()
        loss = (p - 1).pow(2).sum()
        loss.backward()
        return loss
    assert opt.step(closure) == 2.0
    with pytest.raises(ValueError, match="lr must be non-negative, got -1"):
        noptim.LazyAdam([p], lr=-1)
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\), got \(1.0, 0.9\)"):
        noptim.LazyAdam([p], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="weight_decay must be non-negative"):
        noptim.LazyAdam([p], weight_decay=-0.1)
    w = torch.zeros(2, 3, 4, requires_grad=True)
    w.grad = torch.ones(2, 3, 4).to_sparse()
    with pytest.raises(NotImplementedError, match="got sparse_dim 3 for a 3-D parameter"):
        noptim.LazyAdam([w]).step()


@pytest.mark.parametrize("decoupled", [False, True])
def test_gradient_strides_differ_from_parameter(decoupled, kernel):
    """SparseLinearBatch.weight is a transposed view; a gradient in nn.Linear's layout."""
    import nnsparse
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 4).double()
    ref = torch.nn.Linear(6, 4).double()
    ref.load_state_dict(layer.state_dict())
    assert layer.weight.stride() != ref.weight.stride()
    ours = noptim.LazyAdam(layer.parameters(), weight_decay=0.1,
                           decoupled_weight_decay=decoupled, **CASES)
    theirs = (torch.optim.AdamW if decoupled else torch.optim.Adam)(ref.parameters(),
                                                                     weight_decay=0.1, **CASES)
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        g = torch.randn(4, 6, generator=gen, dtype=torch.float64)
        layer.weight.grad, ref.weight.grad = g.clone(), g.clone()
        layer.bias.grad = ref.bias.grad = None
        ours.step()
        theirs.step()
    torch.testing.assert_close(layer.weight, ref.weight)


@pytest.mark.parametrize("shape,strided_t,sparse_dim,message", [
    ((2, 3, 4), False, 2, "sparse_dim 2 for a 3-D parameter"),
    ((1, 1, 1, 1, 1, 1, 2, 2), False, 3, "sparse_dim 3 for an 8-D parameter"),
    ((4, 3), True, 1, "needs a contiguous parameter for a sparse gradient"),
])
def test_failed_step_changes_nothing(shape, strided_t, sparse_dim, message):
    """Validate before mutating: a bad second gradient leaves the first parameter as it was."""
    gen = torch.Generator().manual_seed(4)
    good = torch.randn(5, 4, generator=gen, dtype=torch.float64).requires_grad_()
    other = torch.randn(*shape, generator=gen, dtype=torch.float64)
    other = (other.t().contiguous().t() if strided_t else other).requires_grad_()
    opt = noptim.LazyAdam([good, other], **CASES)
    good.grad = torch.ones(5, 4, dtype=torch.float64)
    other.grad = torch.ones(shape, dtype=torch.float64).to_sparse(sparse_dim)
    before = good.detach().clone()
    with pytest.raises(NotImplementedError, match=message):
        opt.step()
    assert torch.equal(good, before) and not opt.state
    other.grad = None
    opt.step()  # a retry steps the good parameter once
    assert opt.state[good]["step"] == 1


@pytest.mark.parametrize("chunk", [4, 1 << 22])
def test_dense_above_falls_back_to_adam(chunk, kernel, monkeypatch):
    """Above dense_above of the rows touched, the step is torch's dense Adam; at or
    below it, lazy."""
    monkeypatch.setattr(noptim._rowopt, "_CHUNK", chunk)
    gen = torch.Generator().manual_seed(8)
    p = torch.randn(6, 3, generator=gen, dtype=torch.float64).requires_grad_()
    q = p.detach().clone().requires_grad_()
    ours = noptim.LazyAdam([p], dense_above=0.5, weight_decay=0.1, **CASES)
    ref = torch.optim.Adam([q], weight_decay=0.1, **CASES)
    for rows in ([0, 2, 3, 5], [1, 2, 4, 5]):  # 4 of 6 rows > 0.5: dense
        g = _row_grad(rows, (6, 3), gen)
        p.grad, q.grad = g, g.to_dense()
        ours.step()
        ref.step()
    torch.testing.assert_close(p, q)
    before = p.detach().clone()
    p.grad = _row_grad([1, 4], (6, 3), gen)  # 2 of 6: lazy, untouched rows keep their values
    ours.step()
    assert torch.equal(p.detach()[[0, 2, 3, 5]], before[[0, 2, 3, 5]])
    with pytest.raises(ValueError, match=r"dense_above must be None or in \[0, 1\], got 2"):
        noptim.LazyAdam([p], dense_above=2)


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(lr="x"), TypeError, "lr must be a number, got str 'x'"),
    (dict(eps="a"), TypeError, "eps must be a number, got str"),
    (dict(weight_decay=None), TypeError, "weight_decay must be a number, got NoneType"),
    (dict(lr=True), TypeError, "lr must be a number, got bool"),
    (dict(betas=0.9), TypeError, r"betas must be a pair \(beta1, beta2\), got 0.9"),
    (dict(betas=(0.9, "b")), TypeError, "betas must be a number, got str"),
    (dict(dense_above="a"), TypeError, "dense_above must be a number, got str"),
    (dict(lr=-1.0), ValueError, "lr must be non-negative, got -1.0"),
    (dict(dense_above=2.0), ValueError, r"dense_above must be None or in \[0, 1\], got 2.0"),
])
def test_lazy_adam_hyperparameters_of_the_wrong_kind(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        nnsparse.optim.LazyAdam([torch.nn.Parameter(torch.zeros(3))], **kwargs)


@pytest.mark.parametrize("kwargs,exc,message", [
    (dict(lr="x"), TypeError, "lr must be a number, got str"),
    (dict(betas=(0.9,)), ValueError, r"betas must be a pair \(beta1, beta2\), got \(0.9,\)"),
    (dict(betas=0.9), TypeError, r"betas must be a pair \(beta1, beta2\), got 0.9"),
    (dict(weight_decay=-1.0), ValueError, "weight_decay must be non-negative, got -1.0"),
])
def test_in_backward_hyperparameters_of_the_wrong_kind(kwargs, exc, message):
    model = nnsparse.SparseLinearBatch(6, 3)
    with pytest.raises(exc, match=message):
        nnsparse.optim.apply_optimizer_in_backward(model, "adam", **kwargs)
    assert model._row_update is None  # a refused call leaves the layer as it was


def _adam_trained(p):
    adam = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones_like(p)
    adam.step()
    return adam


def test_lazy_adam_loads_torch_adam_state():
    # Adam's state dict (a float tensor step, no dense_above) continues as Adam
    p, q = (torch.nn.Parameter(torch.arange(6.).view(3, 2)) for _ in range(2))
    adam = _adam_trained(p)
    _adam_trained(q)
    ours = noptim.LazyAdam([q], lr=0.1)
    ours.load_state_dict(copy.deepcopy(adam.state_dict()))
    assert ours.param_groups[0]["dense_above"] is None and ours.state[q]["step"] == 1
    for opt, param in ((adam, p), (ours, q)):
        param.grad = torch.full_like(param, 0.5)
        opt.step()
    torch.testing.assert_close(q, p)


class _ScaledAdam(noptim.LazyAdam):
    """A LazyAdam subclass with a default of its own, ``scale`` (its gradients are
    multiplied by it), read by its step: a group without it failed with KeyError."""

    def __init__(self, params, scale=0.5, **kwargs):
        super().__init__(params, **kwargs)
        self.defaults["scale"] = scale
        for group in self.param_groups:
            group.setdefault("scale", scale)

    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(group["scale"])
        return super().step(closure)


def _saved_by(make):
    """The state dict of ``make([p], lr=0.1)`` after one step of a ones gradient."""
    p = torch.nn.Parameter(torch.arange(6.).view(3, 2))
    opt = make([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.step()
    return copy.deepcopy(opt.state_dict())


# name -> (the optimiser that saved the state, whether the loading one is a deep copy, the
# scale the loaded groups must hold)
SUBCLASS_LOADS = {
    "older-lazy-adam-state": (noptim.LazyAdam, False, 0.5),
    "torch-adam-state": (torch.optim.Adam, False, 0.5),
    "own-state-keeps-its-scale": (lambda ps, lr: _ScaledAdam(ps, scale=2.0, lr=lr), False, 2.0),
    "own-state-into-a-copy": (lambda ps, lr: _ScaledAdam(ps, scale=2.0, lr=lr), True, 2.0),
}


@pytest.mark.parametrize("name", list(SUBCLASS_LOADS))
def test_subclass_defaults_fill_a_loaded_state(name):
    """A subclass's own defaults fill the keys a loaded state's groups lack, as a group
    added by ``add_param_group`` gets them (the saved value wins; LazyAdam's own keys
    still filled, torch's ``differentiable`` not added), and it steps on as LazyAdam with
    the gradients scaled by the scale loaded."""
    make, copied, scale = SUBCLASS_LOADS[name]
    saved = _saved_by(make)
    p, q = (torch.nn.Parameter(torch.arange(6.).view(3, 2)) for _ in range(2))
    ours = _ScaledAdam([p], lr=0.3)
    if copied:
        ours = copy.deepcopy(ours)  # torch's __setstate__: "differentiable" in the defaults
        p = ours.param_groups[0]["params"][0]
    ours.load_state_dict(copy.deepcopy(saved))
    group = ours.param_groups[0]
    assert group["scale"] == scale and group["dense_above"] is None and group["lr"] == 0.1
    assert set(group) == set(saved["param_groups"][0]) | {"scale", "dense_above"}
    reference = noptim.LazyAdam([q], lr=0.3)
    reference.load_state_dict(copy.deepcopy(saved))
    p.grad = torch.full_like(p, 0.7)
    q.grad = torch.full_like(q, 0.7 * scale)
    ours.step()
    reference.step()
    torch.testing.assert_close(p, q, rtol=0, atol=0)


class _RequiredScaleAdam(_ScaledAdam):
    """A LazyAdam subclass whose ``scale`` has no default (torch's ``required``)."""

    def __init__(self, params, scale=required, **kwargs):
        super().__init__(params, scale=scale, **kwargs)


def test_subclass_hyperparameter_without_default_is_refused_at_load():
    """A loaded group lacking a subclass's hyperparameter that has no default is refused,
    as ``add_param_group`` refuses it, before anything is loaded (it was filled with
    torch's ``required`` placeholder, which the step then multiplied by)."""
    saved = _saved_by(noptim.LazyAdam)
    p = torch.nn.Parameter(torch.arange(6.).view(3, 2))
    opt = _RequiredScaleAdam([{"params": [p], "scale": 2.0}], lr=0.3)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(ValueError, match=r"^state_dict\['param_groups'\]\[0\] must hold "
                       r"\['scale'\], hyperparameters of _RequiredScaleAdam without a default "
                       r"\(torch.optim.optimizer.required\), got the keys \['betas', "):
        opt.load_state_dict(copy.deepcopy(saved))
    assert repr(opt.state_dict()) == repr(before) and opt.param_groups[0]["scale"] == 2.0
    saved["param_groups"][0]["scale"] = 3.0  # given: it loads
    opt.load_state_dict(saved)
    assert opt.param_groups[0]["scale"] == 3.0


@pytest.mark.parametrize("step", [
    3, 3.0, torch.tensor(3.0), torch.tensor(3), torch.tensor([3.0]),
    torch.tensor(3.0, dtype=torch.float64), np.float64(3.0), np.int64(3),
], ids=["int", "float", "tensor-float32", "tensor-int64", "tensor-1", "tensor-float64",
        "numpy-float64", "numpy-int64"])
def test_lazy_adam_keeps_a_loaded_step_as_an_int(step):
    """Whatever form a loaded step count takes (torch's Adam keeps a float32 tensor, a
    hand-edited or older state a float), LazyAdam keeps an int, as its docstring says
    and as its own steps make it (a float stayed a float), and steps on from it as
    from the int."""
    params = [torch.nn.Parameter(torch.arange(6.).view(3, 2)) for _ in range(2)]
    opts = [noptim.LazyAdam([p], lr=0.1) for p in params]
    for opt, p in zip(opts, params):
        p.grad = torch.ones_like(p)
        opt.step()
    for opt, count in zip(opts, (step, 3)):
        state = copy.deepcopy(opt.state_dict())
        state["state"][0]["step"] = count
        opt.load_state_dict(state)
    loaded = opts[0].state[params[0]]["step"]
    assert type(loaded) is int and loaded == 3
    assert type(opts[0].state_dict()["state"][0]["step"]) is int
    for opt, p in zip(opts, params):
        p.grad = torch.full_like(p, 0.5)
        opt.step()
    assert opts[0].state[params[0]]["step"] == 4 and type(opts[0].state[params[0]]["step"]) is int
    assert torch.equal(params[0], params[1])


def test_a_lazy_adam_state_loads_into_torch_adam():
    """The other way: torch's Adam makes its float32 tensor of LazyAdam's int step."""
    p, q = (torch.nn.Parameter(torch.arange(6.).view(3, 2)) for _ in range(2))
    ours = noptim.LazyAdam([p], lr=0.1)
    adam = _adam_trained(q)
    p.grad = torch.ones_like(p)
    ours.step()
    adam.load_state_dict(copy.deepcopy(ours.state_dict()))
    assert adam.state[q]["step"].dtype == torch.float32 and adam.state[q]["step"] == 1
    for opt, param in ((adam, q), (ours, p)):
        param.grad = torch.full_like(param, 0.5)
        opt.step()
    torch.testing.assert_close(q, p)


def _state_with(entry):
    p = torch.nn.Parameter(torch.zeros(3, 2))
    state = _adam_trained(p).state_dict()
    state["state"][0] = entry(state["state"][0])
    return state


@pytest.mark.parametrize("entry,message", [
    (lambda e: {"step": e["step"], "momentum_buffer": e["exp_avg"]},
     r"state_dict\['state'\]\[0\] must hold \['step', 'exp_avg', 'exp_avg_sq'\], got the "
     r"keys \['momentum_buffer', 'step'\]"),
    (lambda e: {k: v for k, v in e.items() if k != "exp_avg_sq"}, "must hold"),
    (lambda e: {**e, "exp_avg": torch.zeros(2)},
     r"state_dict\['state'\]\[0\]\['exp_avg'\] must have its parameter's shape \(3, 2\), "
     r"got \(2,\)"),
])
def test_lazy_adam_refuses_a_state_it_cannot_step(entry, message):
    p = torch.nn.Parameter(torch.zeros(3, 2))
    opt = noptim.LazyAdam([p])
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(_state_with(entry))
    assert opt.state_dict()["state"] == {}  # nothing loaded


@pytest.mark.parametrize("group,exc,message", [
    (dict(maximize=True), ValueError, r"param_group: LazyAdam has no maximize, got maximize=True"),
    (dict(amsgrad=True), ValueError, "LazyAdam has no amsgrad"),
    (dict(lr=-1.0), ValueError, r"param_group\['lr'\] must be non-negative, got -1.0"),
    (dict(eps=-1), ValueError, r"param_group\['eps'\] must be non-negative"),
    (dict(betas=(2.0, 0.5)), ValueError, r"betas must be in \[0, 1\)"),
    (dict(dense_above=3), ValueError, r"dense_above must be None or in \[0, 1\]"),
    (dict(decoupled_weight_decay=1), TypeError, "decoupled_weight_decay'\\] must be a bool"),
])
def test_lazy_adam_checks_every_param_group(group, exc, message):
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    with pytest.raises(exc, match=message):
        noptim.LazyAdam([{"params": [p], **group}])
    opt = noptim.LazyAdam([p])
    with pytest.raises(exc, match=message):
        opt.add_param_group({"params": [q], **group})
    assert len(opt.param_groups) == 1


def test_lazy_adam_refuses_a_group_changed_to_a_bad_value_before_stepping():
    p, q = torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))
    opt = noptim.LazyAdam([{"params": [p]}, {"params": [q]}], lr=0.1)
    p.grad, q.grad = torch.ones(2), torch.ones(2)
    opt.param_groups[1]["lr"] = -1.0
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['lr'\] must be non-negative"):
        opt.step()
    assert torch.equal(p, torch.zeros(2)) and not opt.state  # the first group untouched


@pytest.mark.parametrize("step", [2, 2.0, torch.tensor(2.0), torch.tensor([2.0])])
def test_lazy_adam_loads_any_whole_step_count(step):
    # a number or a one-element tensor (torch's Adam keeps a 0-d float one); a (1,) step
    # is a step count, not a moment to be shaped like its parameter
    p = torch.nn.Parameter(torch.ones(3, 2))
    opt = noptim.LazyAdam([p])
    for _ in range(2):
        p.grad = torch.ones(3, 2)
        opt.step()
    state = copy.deepcopy(opt.state_dict())  # as from torch.load: no tensor shared
    state["state"][0]["step"] = step
    q = torch.nn.Parameter(p.detach().clone())
    other = noptim.LazyAdam([q])
    other.load_state_dict(state)
    p.grad, q.grad = torch.full((3, 2), 0.5), torch.full((3, 2), 0.5)
    opt.step(), other.step()
    torch.testing.assert_close(q, p)


# A hand-set sparse gradient (torch.sparse_coo_tensor checks no index by default) is checked
# at step(), before anything changes: out-of-range or negative indices, a sparse_dim it
# cannot apply, a size, dtype or device its parameter has not (the parameter changed since).
def _hand_grad(index, values, size=(4, 3)):
    return lambda p: torch.sparse_coo_tensor(torch.tensor(index), torch.tensor(values), size)


def _refit(data):
    def set_grad(p):
        p.grad = torch.sparse_coo_tensor(torch.tensor([[1]]), torch.ones(1, 3), (4, 3))
        p.data = data
    return set_grad


_WHERE = r"the sparse gradient of param_groups\[0\]\['params'\]\[1\] must have indices in "


@pytest.mark.parametrize("set_grad, error, message", [
    (_hand_grad([[4]], [[1.0, 2.0, 3.0]]), ValueError,
     _WHERE + r"\[0, 4\) in dimension 0 \(its shape \(4, 3\)\), got max 4$"),
    (_hand_grad([[2, -1]], [[1.0] * 3, [2.0] * 3]), ValueError,
     _WHERE + r"\[0, 4\) in dimension 0 \(its shape \(4, 3\)\), got min -1$"),
    (_hand_grad([[1], [3]], [1.0]), ValueError,  # (1, 3) would update the entry (2, 0)
     _WHERE + r"\[0, 3\) in dimension 1 \(its shape \(4, 3\)\), got max 3$"),
    (_hand_grad([[1, 0], [-1, 0]], [1.0, 2.0]), ValueError,
     _WHERE + r"\[0, 3\) in dimension 1 \(its shape \(4, 3\)\), got min -1$"),
    (_hand_grad([[0, 1, 2, 3], [5, 5, 5, 5]], [1.0] * 4), ValueError,  # whole columns
     _WHERE + r"\[0, 3\) in dimension 1 \(its shape \(4, 3\)\), got max 5$"),
    (_hand_grad([[7, 1]], [[1.0] * 3, [2.0] * 3]), ValueError,  # uncoalesced
     _WHERE + r"\[0, 4\) in dimension 0 \(its shape \(4, 3\)\), got max 7$"),
    (lambda p: torch.sparse_coo_tensor(torch.zeros(0, 1, dtype=torch.long), torch.ones(1, 4, 3),
                                       (4, 3)), NotImplementedError,
     r"got sparse_dim 0 for a 2-D parameter$"),
    (_refit(torch.zeros(5, 3)), ValueError,
     r"the gradient of a parameter of shape \(5, 3\) must have its shape, got \(4, 3\)$"),
    (_refit(torch.zeros(4, 3, dtype=torch.float64)), ValueError,
     r"the gradient must have its parameter's dtype and device \(torch.float64, cpu\), "
     r"got \(torch.float32, cpu\)$"),
], ids=["row-beyond", "row-negative", "entry-beyond", "entry-negative", "columns-beyond",
        "uncoalesced-beyond", "sparse_dim-0", "size", "dtype"])
def test_hand_set_sparse_gradient_is_refused_before_any_change(set_grad, error, message):
    gen = torch.Generator().manual_seed(5)
    good = torch.randn(4, 3, generator=gen).requires_grad_()
    bad = torch.randn(4, 3, generator=gen).requires_grad_()
    opt = noptim.LazyAdam([good, bad], lr=0.1)
    good.grad = _row_grad([0, 2], (4, 3), gen, torch.float32)
    opt.step()  # one good step first: state to keep
    state = copy.deepcopy(opt.state[good])
    before = good.detach().clone()
    good.grad = _row_grad([1, 3], (4, 3), gen, torch.float32)
    out = set_grad(bad)
    if out is not None:
        bad.grad = out
    bad_before = bad.detach().clone()
    with pytest.raises(error, match=message):
        opt.step()
    assert torch.equal(good, before) and torch.equal(bad, bad_before)
    assert opt.state[good]["step"] == state["step"] and bad not in opt.state
    for key in ("exp_avg", "exp_avg_sq"):
        assert torch.equal(opt.state[good][key], state[key])


def test_gradients_of_nnsparse_layers_pass_the_index_check():
    """The layers' own sparse gradients (rows of a table, a sparse bias) step as before."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(nnsparse.SparseLinearBatch(7, 3, sparse_grad=True))
    x = torch.tensor([[0.0, 1.0, 0, 0, 0, 0, 2.0], [0, 0, 0, 3.0, 0, 0, 0]]).to_sparse()
    opt = noptim.LazyAdam(model.parameters(), lr=0.1)
    table = model[0].weight_t  # (in, out): the rows the batch touched get a gradient
    before = table.detach().clone()
    model(x).sum().backward()
    assert table.grad.layout == model[0].bias.grad.layout == torch.sparse_coo
    opt.step()
    changed = (table.detach() != before).any(1).nonzero().flatten().tolist()
    assert changed == [1, 3, 6]


# -- the step of nnsparse's own sparse gradients reads nothing back (no GPU sync) ----------
# conftest's host_reads: every Python-level read of a tensor to the host (item, tolist,
# bool, int, float, index) spied on, with the nnsparse function that made it.

def _nnsparse_reads(run, host_reads):
    """``(file, function)`` of the nnsparse frame nearest each host read ``run()`` makes,
    but for ``_rowopt._block``'s, which reads a block's bounds on CPU only (cheap there)."""
    import sys
    reads = []

    def spy(name, original):
        def read(t, *args, **kwargs):
            f = sys._getframe(1)
            while f is not None and "/nnsparse/" not in f.f_code.co_filename.replace("\\", "/"):
                f = f.f_back
            if f is not None:
                reads.append((f.f_code.co_filename.rsplit("/", 1)[-1], f.f_code.co_name))
            return original(t, *args, **kwargs)
        return read

    with host_reads(spy):
        run()
    return [r for r in reads if r != ("_rowopt.py", "_block")]


def _sparse_grad_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict(dict(enc=nnsparse.SparseLinearBatch(9, 4, sparse_grad=True),
                                    dec=nnsparse.SparseOutputLinear(4, 8, sparse_grad=True)))


def _backward(model, x, y):
    out = model["dec"](torch.sigmoid(model["enc"](x)), y)
    (out.values() - y.values()).square().sum().backward()


def _sparse_batches():
    gen = torch.Generator().manual_seed(3)
    x = (torch.rand(3, 9, generator=gen) < 0.3) * torch.rand(3, 9, generator=gen)
    y = (torch.rand(3, 8, generator=gen) < 0.5) * torch.rand(3, 8, generator=gen)
    return nnsparse.trust(x.to_sparse().coalesce()), nnsparse.trust(y.to_sparse().coalesce())


@pytest.mark.parametrize("dense_above", [None, 0.0])  # 0.0: the dense step of every row
def test_lazy_adam_step_of_nnsparse_gradients_reads_nothing_back(dense_above, host_reads):
    """The layers' sparse gradients on a trusted batch are in range and coalesced by
    construction: LazyAdam's step neither checks their indices nor their order (each a
    read back, a host synchronisation on a GPU), and steps as with the checks."""
    x, y = _sparse_batches()
    ours, ref = _sparse_grad_model(), _sparse_grad_model()
    opt = noptim.LazyAdam(ours.parameters(), lr=0.1, dense_above=dense_above)
    ref_opt = noptim.LazyAdam(ref.parameters(), lr=0.1, dense_above=dense_above)
    for step in range(2):
        for model in (ours, ref):
            model.zero_grad()
            _backward(model, x, y)
        assert all(p.grad.layout == torch.sparse_coo for p in ours.parameters())
        for p in ref.parameters():  # the same gradients, not made by a layer: checked
            p.grad = torch.sparse_coo_tensor(p.grad._indices(), p.grad._values(), p.shape)
        assert _nnsparse_reads(opt.step, host_reads) == [], step
        assert _nnsparse_reads(ref_opt.step, host_reads) != [], step  # the spy sees reads
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("clip", [lambda ps: noptim.clip_grad_norm_(ps, 1e-3),
                                  lambda ps: noptim.clip_grad_value_(ps, 1e-4)],
                         ids=["norm", "value"])
def test_clipping_keeps_the_layers_gradients_known(clip, host_reads):
    """nnsparse's clip_grad_norm_ and clip_grad_value_ change the values in place, the
    indices stay (no coalescing of a layer's gradient): the step checks nothing."""
    x, y = _sparse_batches()
    model = _sparse_grad_model()
    opt = noptim.LazyAdam(model.parameters(), lr=0.1)
    _backward(model, x, y)
    grads = [p.grad for p in model.parameters()]
    clip(model.parameters())
    assert all(p.grad is g for p, g in zip(model.parameters(), grads))
    assert _nnsparse_reads(opt.step, host_reads) == []


def _bad_row(p):
    return torch.sparse_coo_tensor(torch.tensor([[p.shape[0]]]),
                                   torch.ones((1,) + p.shape[1:]), p.shape)


def _set_by_hand(p):
    p.grad = _bad_row(p)


def _added_in_place(p):
    p.grad.add_(_bad_row(p))


def _indices_changed(p):
    p.grad._indices()[0, 0] = p.shape[0]


@pytest.mark.parametrize("change, backward_after", [
    (_set_by_hand, False),  # a layer's gradient replaced by a hand-made one
    (_set_by_hand, True),  # a hand-made gradient, then a layer's accumulated into it
    (_added_in_place, False),  # a layer's gradient changed in place
    (_indices_changed, False),
], ids=["replaced", "accumulated-into", "added-in-place", "indices-written"])
def test_a_layers_gradient_changed_by_hand_is_checked_again(change, backward_after):
    x, y = _sparse_batches()
    model = _sparse_grad_model()
    opt = noptim.LazyAdam(model.parameters(), lr=0.1)
    table = model["enc"].weight_t
    _backward(model, x, y)
    change(table)
    if backward_after:
        _backward(model, x, y)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"must have indices in \[0, 9\) in dimension 0 "
                                         r"\(its shape \(9, 4\)\), got max 9$"):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))


def _split_in_two(g):
    """The same gradient with each entry split in two halves: duplicate indices, unsorted."""
    g = g.coalesce()
    index, values = g.indices(), g.values()
    return torch.sparse_coo_tensor(torch.cat([index.flip(1), index], 1),
                                   torch.cat([0.5 * values.flip(0), 0.5 * values]), g.shape)


def test_a_gradient_hook_registered_after_the_first_forward_is_not_trusted():
    """A hook on the parameter that runs after nnsparse's (registered after the forward
    that put them) may return another gradient: its duplicates are summed by the step,
    as for the same hook on a model whose gradients nobody marked."""
    x, y = _sparse_batches()
    ours, ref = _sparse_grad_model(), _sparse_grad_model()
    _backward(ours, x, y)  # the layers' first forward: their hooks go on first
    ours.zero_grad()
    for model in (ours, ref):
        for p in model.parameters():
            p.register_hook(_split_in_two)
    for model in (ours, ref):
        opt = noptim.LazyAdam(model.parameters(), lr=0.1)
        _backward(model, x, y)
        if model is ref:  # the same gradients, not made by a layer
            for p in model.parameters():
                p.grad = torch.sparse_coo_tensor(p.grad._indices(), p.grad._values(), p.shape)
        opt.step()
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)


def test_a_trained_layer_converts_with_swapped_parameters():
    """torch.__future__.set_swap_module_params_on_conversion(True) makes Module.to swap
    each parameter (torch.utils.swap_tensors), which refuses one with a weak reference:
    nnsparse keeps none to the parameters whose gradients it marks."""
    x, y = _sparse_batches()
    model = _sparse_grad_model()
    _backward(model, x, y)
    before = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to(torch.float64)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(before)
    assert all(p.dtype == torch.float64 for p in model.parameters())
    model.zero_grad()
    _backward(model, x.double(), y.double())  # the swapped parameters train on
    assert all(p.grad.dtype == torch.float64 for p in model.parameters())


def _grad_of_all(model, loss):
    return torch.autograd.grad(loss, list(model.parameters()))


def _grad_of_encoder(model, loss):
    return torch.autograd.grad(loss, [model["enc"].weight_t])


def _grad_then_backward(model, loss):
    grads = torch.autograd.grad(loss, list(model.parameters()), retain_graph=True)
    loss.backward()
    return grads


def _backward_of_the_decoder(model, loss):
    loss.backward(inputs=[model["dec"].weight])
    return (model["dec"].weight.grad,)


@pytest.mark.parametrize("run", [_grad_of_all, _grad_of_encoder, _grad_then_backward,
                                 _backward_of_the_decoder],
                         ids=["autograd.grad", "autograd.grad-one", "grad-then-backward",
                              "backward-inputs"])
def test_no_index_storage_outlives_its_backward(run):
    """The hook noting a layer's gradient for the post-accumulate hook: a note nothing
    reads (torch.autograd.grad accumulates nothing) is dropped when the backward ends,
    so the gradient's index storage is freed with the gradient."""
    import gc
    from torch.multiprocessing.reductions import StorageWeakRef
    from nnsparse import _grad_origin
    x, y = _sparse_batches()
    model = _sparse_grad_model()
    keys = {id(p) for p in model.parameters()}
    grads = run(model, (model["dec"](torch.sigmoid(model["enc"](x)), y).values()
                        - y.values()).square().sum())
    assert all(g.layout == torch.sparse_coo for g in grads)
    assert keys.isdisjoint(_grad_origin._SEEN)
    held = [p.grad for p in model.parameters() if p.grad is not None]
    assert all(_grad_origin.known_in_range(g) for g in held)  # backward(): still marked
    storages = [StorageWeakRef(g._indices().untyped_storage()) for g in grads]
    del grads, held, x, y
    model.zero_grad()
    gc.collect()
    assert all(s.expired() for s in storages)


def test_a_gradient_from_autograd_grad_set_by_hand_is_checked(host_reads):
    """The gradient torch.autograd.grad returns is the layer's own tensor, but nothing
    accumulated it: set as p.grad by hand, the step checks it as any hand-set one."""
    x, y = _sparse_batches()
    model = _sparse_grad_model()
    opt = noptim.LazyAdam(model.parameters(), lr=0.1)
    loss = (model["dec"](torch.sigmoid(model["enc"](x)), y).values() - y.values()).square().sum()
    for p, g in zip(model.parameters(), torch.autograd.grad(loss, list(model.parameters()))):
        p.grad = g
    assert _nnsparse_reads(opt.step, host_reads) != []


# -- clip_grad_norm_: torch's, with sparse COO gradients (torch 2.13 raises on them) -------
def test_torch_clip_grad_norm_raises_on_sparse_gradients():
    """Why nnsparse.optim.clip_grad_norm_ exists: if torch takes them one day, this fails."""
    p = torch.zeros(4, 3, requires_grad=True)
    p.grad = torch.ones(4, 3).to_sparse(1)
    with pytest.raises(NotImplementedError, match="linalg_vector_norm"):
        torch.nn.utils.clip_grad_norm_([p], 1.0)


class _ClipAE(torch.nn.Module):
    def __init__(self, sparse_grad, dtype):
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(7, 4, sparse_grad=sparse_grad, dtype=dtype)
        self.decoder = nnsparse.SparseOutputLinear(4, 7, sparse_grad=sparse_grad, dtype=dtype)

    def forward(self, x):
        return nnsparse.densify(self.decoder(torch.tanh(self.encoder(x)), x))


def _uncoalesced(g):
    """The same gradient with every entry split in two (duplicate indices, unsorted)."""
    g = g.coalesce()
    index, values = g.indices(), g.values()
    return torch.sparse_coo_tensor(torch.cat([index.flip(1), index], 1),
                                   torch.cat([0.25 * values.flip(0), 0.75 * values]), g.shape)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf"), "inf"])
@pytest.mark.parametrize("share", [0.5, 2.0], ids=["clipped", "under"])
def test_clip_grad_norm_matches_the_dense_model(dtype, norm_type, share):
    """sparse_grad=True layers (gradients made uncoalesced) against the same model with
    sparse_grad=False and torch.nn.utils.clip_grad_norm_."""
    torch.manual_seed(0)
    ours, ref = _ClipAE(True, dtype), _ClipAE(False, dtype)
    ref.load_state_dict(ours.state_dict())
    x = torch.tensor([[0.0, 1.0, 0, 0, 0, 0, 2.0], [0, 0, 0, 3.0, 0, 0, 0]], dtype=dtype)
    for model in (ours, ref):
        model(x.to_sparse_csr()).pow(2).sum().backward()
    sparse = [p for p in ours.parameters() if p.grad.layout == torch.sparse_coo]
    assert len(sparse) == 4  # both weights and both biases
    for p in sparse:
        p.grad = _uncoalesced(p.grad)
        assert p.grad._nnz() == 2 * p.grad.coalesce()._nnz()
    indices = [p.grad._indices().clone() for p in sparse]
    dense_norm = torch.linalg.vector_norm(
        torch.stack([torch.linalg.vector_norm(p.grad, float(norm_type))
                     for p in ref.parameters()]), float(norm_type))
    max_norm = share * float(dense_norm)
    expected = torch.nn.utils.clip_grad_norm_(ref.parameters(), max_norm, norm_type)
    total = noptim.clip_grad_norm_(ours.parameters(), max_norm, norm_type)
    assert total.dtype == expected.dtype == dtype
    torch.testing.assert_close(total, expected)
    for (name, p), q in zip(ours.named_parameters(), ref.parameters()):
        # the sparse encoder's parameter is its (in, out) table, the dense one's (out, in)
        expected_grad = q.grad.t() if name == "encoder.weight_t" else q.grad
        torch.testing.assert_close(p.grad.to_dense(), expected_grad, msg=name)
    # scaled in place, not coalesced nor densified: the gradients keep their indices
    assert all(torch.equal(p.grad._indices(), i) for p, i in zip(sparse, indices))


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 0.5, 0.0, -1.0, float("inf"), float("-inf")])
def test_clip_grad_norm_of_hand_made_sparse_gradients(norm_type):
    """Row, entry and 1-D gradients, uncoalesced, with a dense one beside: torch's result on
    their dense equivalents, for every norm type (0 and negative ones count the zeros the
    sparse gradients leave out)."""
    gen = torch.Generator().manual_seed(3)
    grads = [
        torch.sparse_coo_tensor(torch.tensor([[3, 0, 3]]), torch.randn(3, 2, generator=gen), (5, 2)),
        torch.sparse_coo_tensor(torch.tensor([[1, 1, 0], [2, 2, 0]]), torch.randn(3, generator=gen),
                                (2, 3)),
        torch.sparse_coo_tensor(torch.tensor([[0, 1, 2, 3]]), torch.randn(4, generator=gen), (4,)),
        torch.randn(3, 2, generator=gen),
    ]
    ours = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    ref = [torch.zeros(g.shape, requires_grad=True) for g in grads]
    for p, q, g in zip(ours, ref, grads):
        p.grad, q.grad = g.clone(), g.to_dense()
    expected = torch.nn.utils.clip_grad_norm_(ref, 0.5, norm_type)
    total = noptim.clip_grad_norm_(ours, 0.5, norm_type)
    torch.testing.assert_close(total, expected)
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.grad.to_dense(), q.grad)


def test_clip_grad_norm_odds_and_ends():
    assert torch.equal(noptim.clip_grad_norm_([torch.zeros(2, requires_grad=True)], 1.0),
                       torch.tensor(0.0))  # no gradient: torch's 0
    p = torch.zeros(4, requires_grad=True)
    p.grad = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0), (4,))
    assert noptim.clip_grad_norm_(p, 1.0) == 0  # one tensor; an empty sparse gradient
    p.grad = torch.tensor([3.0, 0, 0, 4.0]).to_sparse()
    assert noptim.clip_grad_norm_((q for q in [p]), 1.0, foreach=False) == 5  # a generator
    torch.testing.assert_close(p.grad.to_dense(), torch.tensor([0.6, 0, 0, 0.8]))


def _csr_grad():
    p = torch.eye(2).to_sparse_csr().requires_grad_()
    p.grad = torch.eye(2).to_sparse_csr()
    return p


def _grad_of(g):
    p = torch.zeros(g.shape, requires_grad=True)
    p.grad = g
    return [p]


@pytest.mark.parametrize("call, error, message", [
    (lambda ps: noptim.clip_grad_norm_(ps, "1"), TypeError, r"max_norm must be a number, got str '1'"),
    (lambda ps: noptim.clip_grad_norm_(ps, 1.0, norm_type="two"), ValueError,
     r"norm_type must be a number or 'inf', got 'two'"),
    (lambda ps: noptim.clip_grad_norm_(ps, True), TypeError, r"max_norm must be a number, got bool"),
    (lambda ps: noptim.clip_grad_norm_(ps, 1.0, error_if_nonfinite=1), TypeError,
     r"error_if_nonfinite must be a bool, got int"),
    (lambda ps: noptim.clip_grad_norm_(ps, 1.0, foreach="yes"), TypeError,
     r"foreach must be a bool or None, got str"),
    (lambda ps: noptim.clip_grad_norm_(3, 1.0), TypeError,
     r"parameters must be a tensor or an iterable of tensors, got int"),
    (lambda ps: noptim.clip_grad_norm_(ps + [None], 1.0), TypeError,
     r"parameters must hold tensors, got NoneType at 2"),
    (lambda ps: noptim.clip_grad_norm_(ps + [_csr_grad()], 1.0),
     NotImplementedError, r"clip_grad_norm_ takes strided and sparse COO gradients, got layout "
                          r"torch.sparse_csr"),
    (lambda ps: noptim.clip_grad_norm_(ps + _grad_of(torch.tensor([float("inf")]).to_sparse()),
                                       1.0, error_if_nonfinite=True), RuntimeError,
     r"The total norm of order 2.0 for gradients from `parameters` is non-finite"),
    # the optimisers' hyperparameter check (was: torch's "Tensor.item() cannot be called on
    # meta tensors", "Could not run 'aten::_local_scalar_dense' ... 'SparseCsrCPU'")
    (lambda ps: noptim.clip_grad_norm_(ps, torch.tensor(1.0, device="meta")), ValueError,
     r"max_norm must hold data, got a tensor on the meta device"),
    (lambda ps: noptim.clip_grad_norm_(ps, torch.ones(1, 1).to_sparse_csr()), TypeError,
     r"max_norm must be a number, got Tensor"),
    (lambda ps: noptim.clip_grad_norm_(ps, 1.0, norm_type=torch.ones(1, 1).to_sparse_csr()),
     TypeError, r"norm_type must be a number, got Tensor"),
    (lambda ps: noptim.clip_grad_value_(ps, torch.tensor(1.0, device="meta")), ValueError,
     r"clip_value must hold data, got a tensor on the meta device"),
], ids=["max_norm-str", "norm_type-str", "max_norm-bool", "error_if_nonfinite-int", "foreach-str",
        "parameters-int", "parameters-None", "csr-gradient", "nonfinite", "max_norm-meta",
        "max_norm-csr", "norm_type-csr", "clip_value-meta"])
def test_clip_grad_norm_errors_change_nothing(call, error, message):
    ps = _grad_of(torch.tensor([3.0, 4.0])) + _grad_of(torch.tensor([0.0, 12.0]).to_sparse())
    with pytest.raises(error, match=message):
        call(ps)
    assert torch.equal(ps[0].grad, torch.tensor([3.0, 4.0]))
    assert torch.equal(ps[1].grad.to_dense(), torch.tensor([0.0, 12.0]))


@pytest.mark.parametrize("to_tensor", [
    lambda v: torch.tensor([v]).to_sparse(),  # one-element sparse COO: float() reads it
    lambda v: torch.tensor(v).to_sparse(),
    lambda v: torch.tensor([[v]], dtype=torch.float64),
], ids=["coo-1", "coo-0d", "strided-1x1"])
@pytest.mark.parametrize("clip", ["norm", "norm_type", "value"])
def test_clip_takes_one_element_tensors_as_torch_does(clip, to_tensor):
    """A one-element tensor max_norm, norm_type or clip_value, sparse COO included (torch's
    clip functions take it, through float()): the same clipping as the float (a COO one
    was refused as "not a number" since the clip functions shared the optimisers' check)."""
    def run(hp):
        ps = _grad_of(torch.tensor([3.0, 4.0])) + _grad_of(torch.tensor([0.0, 12.0]).to_sparse())
        if clip == "norm":
            out = noptim.clip_grad_norm_(ps, hp(2.0))
        elif clip == "norm_type":
            out = noptim.clip_grad_norm_(ps, 2.0, norm_type=hp(1.0))
        else:
            out = noptim.clip_grad_value_(ps, hp(5.0))
        return out, [p.grad.to_dense() for p in ps]
    (got, got_grads), (want, want_grads) = run(to_tensor), run(lambda v: v)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=0)
