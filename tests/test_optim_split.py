"""make_optimizer / SplitOptimizer: sparse-gradient parameters to a sparse optimiser, the rest
to Adam."""
import copy

import numpy as np
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse._optim_split import SplitOptimizer, make_optimizer, sparse_grad_parameters
from nnsparse.optim import LazyAdam

from matrix import DEVICES
from probe_cases import Case, run_case

WIDTH, HIDDEN = 8, 4


class _Mixed(nn.Module):
    """Sparse gradients (encoder, decoder), a dense layer between, an unused frozen one."""

    def __init__(self, sparse_grad: bool = True) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(WIDTH, HIDDEN, sparse_grad=sparse_grad)
        self.middle = nn.Linear(HIDDEN, HIDDEN)
        self.decoder = nnsparse.SparseOutputLinear(HIDDEN, WIDTH, sparse_grad=sparse_grad)
        self.frozen = nn.Linear(2, 2).requires_grad_(False)

    def forward(self, x):
        return self.decoder(torch.tanh(self.middle(torch.tanh(self.encoder(x)))), x)


def _x(device="cpu"):
    return torch.tensor([[1., 0, 0, 2, 0, 0, 0, 0], [0, 0, 3, 0, 0, 1, 0, 0]],
                        device=device).to_sparse()


def _steps(model, opt, n=3, device="cpu"):
    for _ in range(n):
        opt.zero_grad()
        model(_x(device)).values().pow(2).sum().backward()
        opt.step()


def test_split_by_gradient_kind():
    model = _Mixed()
    sparse = sparse_grad_parameters(model)
    assert [id(p) for p in sparse] == [id(model.encoder.weight_t), id(model.encoder.bias),
                                       id(model.decoder.weight), id(model.decoder.bias)]
    opt = make_optimizer(model, lr=0.1)
    assert isinstance(opt, SplitOptimizer)
    assert isinstance(opt.optimizers["sparse"], LazyAdam)
    assert isinstance(opt.optimizers["dense"], torch.optim.Adam)
    dense_ids = {id(p) for g in opt.optimizers["dense"].param_groups for p in g["params"]}
    assert dense_ids == {id(model.middle.weight), id(model.middle.bias)}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dense, wd", [("adam", 0.0), ("adam", 0.01), ("adamw", 0.01)])
def test_same_as_the_two_optimisers_by_hand(dense, wd, device):
    torch.manual_seed(0)
    model = _Mixed().to(device)
    torch.manual_seed(0)
    ref = _Mixed().to(device)
    opt = make_optimizer(model, lr=0.05, weight_decay=wd, dense=dense)
    cls = torch.optim.AdamW if dense == "adamw" else torch.optim.Adam
    by_hand = [cls(ref.middle.parameters(), lr=0.05, weight_decay=wd),
               LazyAdam(sparse_grad_parameters(ref), lr=0.05, weight_decay=wd,
                        decoupled_weight_decay=dense == "adamw")]
    before = [p.detach().clone() for p in model.parameters()]
    _steps(model, opt, device=device)
    for _ in range(3):
        for o in by_hand:
            o.zero_grad()
        ref(_x(device)).values().pow(2).sum().backward()
        for o in by_hand:
            o.step()
    for (name, a), b, b0 in zip(model.named_parameters(), ref.parameters(), before):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        if a.requires_grad:
            assert not torch.equal(a, b0), f"{name} did not move"


def test_one_kind_gives_one_optimiser():
    assert type(make_optimizer(_Mixed(sparse_grad=False))) is torch.optim.Adam
    emb = nn.Embedding(5, 2, sparse=True)
    assert isinstance(make_optimizer(emb), LazyAdam)
    assert isinstance(make_optimizer(emb, sparse="sparse_adam"), torch.optim.SparseAdam)


def test_sparse_adam_part_trains():
    model = _Mixed()
    opt = make_optimizer(model, lr=0.1, sparse="sparse_adam")
    before = model.decoder.weight.detach().clone()
    _steps(model, opt, 2)
    assert not torch.equal(before, model.decoder.weight)


def test_state_dict_round_trip_and_scheduler():
    torch.manual_seed(0)
    model = _Mixed()
    opt = make_optimizer(model, lr=0.1)
    _steps(model, opt, 2)
    state = copy.deepcopy(opt.state_dict())  # load_state_dict may share the tensors
    assert set(state) == {"dense", "sparse"}
    torch.manual_seed(0)
    other = _Mixed()
    other.load_state_dict(model.state_dict())
    opt2 = make_optimizer(other, lr=0.1)
    opt2.load_state_dict(state)
    _steps(model, opt, 1)
    _steps(other, opt2, 1)
    for a, b in zip(model.parameters(), other.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    _steps(model, opt, 1)
    sched.step()
    assert {g["lr"] for g in opt.param_groups} == {0.05}
    assert len(opt.param_groups) == 2 and len(opt.state) == 6


@pytest.mark.parametrize("dense", ["adam", "adamw"])
def test_decay_matrices_only(dense):
    """Each part in two groups: the decay on the matrices, none on the biases; the steps
    those of the two optimisers built by hand with the same groups."""
    torch.manual_seed(0)
    model = _Mixed()
    torch.manual_seed(0)
    ref = _Mixed()
    opt = make_optimizer(model, lr=0.05, weight_decay=0.1, dense=dense, decay_matrices_only=True)
    for part in opt.optimizers.values():
        assert [g["weight_decay"] for g in part.param_groups] == [0.1, 0.0]
        assert all(p.dim() >= 2 for p in part.param_groups[0]["params"])
        assert all(p.dim() < 2 for p in part.param_groups[1]["params"])

    def groups(params):
        params = list(params)
        return [dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
                dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)]
    cls = torch.optim.AdamW if dense == "adamw" else torch.optim.Adam
    by_hand = [cls(groups(ref.middle.parameters()), lr=0.05),
               LazyAdam(groups(sparse_grad_parameters(ref)), lr=0.05,
                        decoupled_weight_decay=dense == "adamw")]
    _steps(model, opt)
    for _ in range(3):
        for o in by_hand:
            o.zero_grad()
        ref(_x()).values().pow(2).sum().backward()
        for o in by_hand:
            o.step()
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_torch_adam_refuses_sparse_gradients():
    # What a user meets without the helper (README/docs name make_optimizer for it).
    model = _Mixed()
    opt = torch.optim.Adam(model.parameters())
    model(_x()).values().sum().backward()
    with pytest.raises(RuntimeError, match="does not support sparse gradients"):
        opt.step()


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(dense="sgd"), ValueError, r"dense must be one of \('adam', 'adamw'\), got 'sgd'"),
    (dict(sparse="adagrad"), ValueError, "sparse must be one of"),
    (dict(sparse="sparse_adam", weight_decay=0.1), NotImplementedError,
     "SparseAdam.*got weight_decay=0.1; use sparse='lazy_adam'"),
    (dict(decay_matrices_only="yes"), TypeError, "decay_matrices_only must be a bool"),
])
def test_make_optimizer_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        make_optimizer(_Mixed(), **kwargs)


def test_no_trainable_parameters():
    with pytest.raises(ValueError, match="parameters that require grad, got none"):
        make_optimizer(nn.Linear(2, 2).requires_grad_(False))


def test_split_optimizer_errors():
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    with pytest.raises(ValueError, match="at least one optimiser"):
        SplitOptimizer({})
    with pytest.raises(TypeError, match=r"optimizers\['x'\] must be a torch.optim.Optimizer, "
                                        "got Linear"):
        SplitOptimizer({"x": a})
    with pytest.raises(ValueError, match="shares parameters"):
        SplitOptimizer({"x": torch.optim.Adam(a.parameters()),
                        "y": torch.optim.SGD(a.parameters(), lr=0.1)})
    opt = SplitOptimizer({"x": torch.optim.Adam(a.parameters()),
                          "y": torch.optim.SGD(b.parameters(), lr=0.1)})
    with pytest.raises(ValueError,
                       match=r"state_dict must have the parts \['x', 'y'\], got \['x'\]"):
        opt.load_state_dict({"x": {}})
    with pytest.raises(NotImplementedError, match="add it to one part"):
        opt.add_param_group({"params": [nn.Parameter(torch.zeros(1))]})


def _split_case():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3),
                                nnsparse.SparseOutputLinear(3, 5, sparse_grad=True))
    return model, nnsparse.make_optimizer(model, sparse="sparse_adam")


def test_a_step_a_part_would_refuse_changes_no_parameter():
    model, opt = _split_case()
    model[1].sparse_grad = False  # switched after the split: a dense decoder gradient
    model(torch.randn(2, 4)).sum().backward()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"optimizers\['sparse'\] is SparseAdam, which takes "
                                           r"sparse gradients only.*no parameter was changed"):
        opt.step()
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_a_refused_state_dict_leaves_every_part_as_it_was():
    model, opt = _split_case()
    good = copy.deepcopy(opt.state_dict())
    bad = copy.deepcopy(good)
    bad["dense"]["param_groups"][0]["lr"] = 0.123
    bad["sparse"] = {"state": {}, "param_groups": []}
    with pytest.raises(ValueError):
        opt.load_state_dict(bad)
    assert opt.state_dict() == good


def test_step_hooks_run_and_can_be_removed():
    model, opt = _split_case()
    calls = []
    pre = opt.register_step_pre_hook(lambda o, args, kwargs: calls.append("pre"))
    opt.register_step_post_hook(lambda o, args, kwargs: calls.append("post"))
    x = torch.tensor([[1., 0, 0, 0, 1], [0, 1, 0, 0, 0]]).to_sparse()
    model[1](torch.randn(2, 3), x).values().sum().backward()
    opt.step()
    pre.remove()
    opt.step()
    assert calls == ["pre", "post", "post"]


def test_a_lazy_adam_part_refusing_its_gradient_changes_no_parameter():
    a = nn.Parameter(torch.randn(3))
    b = nn.Parameter(torch.randn(4, 3).t())  # not contiguous: LazyAdam refuses a sparse grad
    opt = SplitOptimizer({"dense": torch.optim.Adam([a], lr=0.1), "sparse": LazyAdam([b], lr=0.1)})
    a.grad = torch.ones(3)
    b.grad = torch.sparse_coo_tensor(torch.tensor([[0]]), torch.ones(1, 4), (3, 4))
    before = a.detach().clone()
    with pytest.raises(NotImplementedError, match="LazyAdam needs a contiguous parameter"):
        opt.step()
    assert torch.equal(a, before) and not opt.state


@pytest.mark.parametrize("make", [
    lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=6),
    lambda opt: torch.optim.lr_scheduler.CyclicLR(opt, 0.01, 0.1, step_size_up=2),
], ids=["OneCycleLR", "CyclicLR"])
def test_momentum_cycling_schedulers_drive_both_parts(make):
    torch.manual_seed(0)
    model = _Mixed()
    opt = make_optimizer(model, lr=0.1)
    assert "betas" in opt.defaults
    sched = make(opt)
    for _ in range(3):
        _steps(model, opt, 1)
        sched.step()
    lrs = {g["lr"] for g in opt.param_groups}
    betas = {g["betas"] for g in opt.param_groups}
    assert len(lrs) == 1 and len(betas) == 1 and lrs != {0.1}


SPLITS = {
    "lazy-adam": lambda m: make_optimizer(m, lr=0.1),
    "sparse-adam": lambda m: make_optimizer(m, lr=0.1, sparse="sparse_adam"),
    "by-hand-sgd": lambda m: SplitOptimizer({
        "dense": torch.optim.SGD([m.middle.weight, m.middle.bias], lr=0.1, momentum=0.9),
        "sparse": LazyAdam(sparse_grad_parameters(m), lr=0.1)}),
}


@pytest.mark.parametrize("copy_", [None, "deepcopy", "pickle"])
@pytest.mark.parametrize("name", list(SPLITS))
def test_state_is_one_mapping_of_the_parts_entries(name, copy_):
    """opt.state as torch.optim.Optimizer.state: the same mapping at each access, each
    entry the part's own dict (keys written into it stay, the part steps it), through a
    load_state_dict (which replaces a part's state) and in a copy."""
    import pickle
    torch.manual_seed(0)
    model = _Mixed()
    opt = SPLITS[name](model)
    _steps(model, opt, 1)
    if copy_ is not None:
        model, opt = (copy.deepcopy((model, opt)) if copy_ == "deepcopy"
                      else pickle.loads(pickle.dumps((model, opt))))
    assert opt.state is opt.state
    trained = [p for p in model.parameters() if p.requires_grad]
    assert set(map(id, opt.state)) == set(map(id, trained)) and len(opt.state) == len(trained)
    owner = {id(p): part for part in opt.optimizers.values()
             for g in part.param_groups for p in g["params"]}
    for p in trained:
        assert opt.state[p] is owner[id(p)].state[p]
        opt.state[p]["note"] = 1
    entries = {id(p): opt.state[p] for p in trained}
    _steps(model, opt, 1)
    assert all(opt.state[p] is entries[id(p)] and opt.state[p]["note"] == 1 for p in trained)
    mapping = opt.state
    state = copy.deepcopy(opt.state_dict())
    for entry in (e for part in state.values() for e in part["state"].values()):
        del entry["note"]  # the parts refuse another optimiser's keys
    opt.load_state_dict(state)
    assert opt.state is mapping
    for p in trained:
        assert opt.state[p] is owner[id(p)].state[p] and "note" not in opt.state[p]
    stranger = torch.zeros(1)
    assert stranger not in opt.state and opt.state.get(stranger) is None
    assert len(opt.state) == len(trained)


# -- every torch.optim optimiser as a part: its state_dict round-trips ---------------------

# name -> (the part's class, its keywords, the side it trains: the dense nn.Linear or the
# sparse-gradient layer, the other side being Adam or LazyAdam)
PART_KINDS = {
    "Adam": (torch.optim.Adam, {}, "dense"),
    "AdamW": (torch.optim.AdamW, {}, "dense"),
    "SGD": (torch.optim.SGD, dict(lr=0.1, momentum=0.9), "dense"),
    "Adagrad": (torch.optim.Adagrad, {}, "dense"),
    "RMSprop": (torch.optim.RMSprop, dict(momentum=0.9, centered=True), "dense"),
    "Adadelta": (torch.optim.Adadelta, {}, "dense"),
    "Adamax": (torch.optim.Adamax, {}, "dense"),
    "NAdam": (torch.optim.NAdam, {}, "dense"),
    "RAdam": (torch.optim.RAdam, {}, "dense"),
    "ASGD": (torch.optim.ASGD, {}, "dense"),
    "Rprop": (torch.optim.Rprop, {}, "dense"),
    "LBFGS": (torch.optim.LBFGS, dict(history_size=3, max_iter=3), "dense"),
    "Adafactor": (torch.optim.Adafactor, {}, "dense"),
    "SparseAdam": (torch.optim.SparseAdam, {}, "sparse"),
    "Muon": (getattr(torch.optim, "Muon", None), {}, "dense-matrices"),  # matrices only
}


def _with_part(name):
    """A model (a sparse-gradient SparseLinearBatch, a dense nn.Linear) and a
    SplitOptimizer whose part ``name`` trains one side."""
    cls, kwargs, side = PART_KINDS[name]
    if cls is None:
        pytest.skip(f"torch.optim.{name} is not in torch {torch.__version__}")
    torch.manual_seed(0)
    model = nn.Sequential(nnsparse.SparseLinearBatch(6, 4, sparse_grad=True), nn.Linear(4, 3))
    dense = [model[1].weight] if side == "dense-matrices" else list(model[1].parameters())
    if side == "sparse":
        parts = {"dense": torch.optim.Adam(dense), "sparse": cls(model[0].parameters(), **kwargs)}
    else:
        parts = {"dense": cls(dense, **kwargs), "sparse": LazyAdam(model[0].parameters())}
    return model, SplitOptimizer(parts)


def _part_steps(model, opt, n):
    x = torch.eye(6)[:3].to_sparse()

    def closure():
        opt.zero_grad()
        loss = model(x).pow(2).sum()
        loss.backward()
        return loss

    for _ in range(n):
        if isinstance(opt.optimizers["dense"], torch.optim.LBFGS):  # its step needs the closure
            for part in opt.optimizers.values():
                part.step(closure)
        else:
            closure()
            opt.step()


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return a == b


@pytest.mark.parametrize("name", list(PART_KINDS))
def test_every_torch_optimiser_part_round_trips(name):
    """save -> load of a SplitOptimizer with each torch.optim class as a part: the loaded
    state is the state saved, and the next step is the original's (Adafactor's factored
    ``row_var`` / ``col_var`` and LBFGS's flat ``d`` / ``prev_flat_grad`` were refused as
    not of their parameter's shape)."""
    model, opt = _with_part(name)
    _part_steps(model, opt, 2)
    saved = copy.deepcopy(opt.state_dict())
    other, opt2 = _with_part(name)
    other.load_state_dict(model.state_dict())
    opt2.load_state_dict(copy.deepcopy(saved))
    assert _same(opt2.state_dict(), saved)
    _part_steps(model, opt, 1)
    _part_steps(other, opt2, 1)
    for a, b in zip(model.parameters(), other.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


_DENSE_ENTRY = r"^state_dict\['dense'\]\['state'\]\[0\]"

# name -> (the part, the key of the first dense parameter's entry (the (3, 4) weight), the
# shape put there, the message)
MISFIT_STATES = {
    "adafactor-row-var-of-the-parameters-shape": (
        "Adafactor", "row_var", (3, 4),
        _DENSE_ENTRY + r"\['row_var'\] must have the shape \(3, 1\) \(Adafactor's row factor "
                       r"for a parameter of shape \(3, 4\)\), got \(3, 4\)$"),
    "adafactor-col-var-transposed": (
        "Adafactor", "col_var", (4, 1),
        _DENSE_ENTRY + r"\['col_var'\] must have the shape \(1, 4\) \(Adafactor's column "
                       r"factor for a parameter of shape \(3, 4\)\), got \(4, 1\)$"),
    "lbfgs-d-of-the-parameters-shape": (
        "LBFGS", "d", (3, 4),
        _DENSE_ENTRY + r"\['d'\] must have the shape \(15,\) \(LBFGS's flat vector of its "
                       r"parameters' 15 entries\), got \(3, 4\)$"),
    "lbfgs-prev-flat-grad-short": (
        "LBFGS", "prev_flat_grad", (12,),
        _DENSE_ENTRY + r"\['prev_flat_grad'\] must have the shape \(15,\) \(LBFGS's flat "
                       r"vector of its parameters' 15 entries\), got \(12,\)$"),
    "rmsprop-square-avg-short": (
        "RMSprop", "square_avg", (3,),
        _DENSE_ENTRY + r"\['square_avg'\] must have its parameter's shape \(3, 4\), "
                       r"got \(3,\)$"),
    # 0-d: loaded before (0-d tensors pass as a step count), and the step failed in torch's
    # broadcast ("output with shape [] doesn't match") or dot ("1D tensors expected")
    "adafactor-row-var-0-d": (
        "Adafactor", "row_var", (),
        _DENSE_ENTRY + r"\['row_var'\] must have the shape \(3, 1\) \(Adafactor's row factor "
                       r"for a parameter of shape \(3, 4\)\), got \(\)$"),
    "adafactor-col-var-0-d": (
        "Adafactor", "col_var", (),
        _DENSE_ENTRY + r"\['col_var'\] must have the shape \(1, 4\) \(Adafactor's column "
                       r"factor for a parameter of shape \(3, 4\)\), got \(\)$"),
    "lbfgs-d-0-d": (
        "LBFGS", "d", (),
        _DENSE_ENTRY + r"\['d'\] must have the shape \(15,\) \(LBFGS's flat vector of its "
                       r"parameters' 15 entries\), got \(\)$"),
    "lbfgs-prev-flat-grad-0-d": (
        "LBFGS", "prev_flat_grad", (),
        _DENSE_ENTRY + r"\['prev_flat_grad'\] must have the shape \(15,\) \(LBFGS's flat "
                       r"vector of its parameters' 15 entries\), got \(\)$"),
    "adafactor-unknown-key-of-another-shape": (
        "Adafactor", "note", (3, 1),
        _DENSE_ENTRY + r"\['note'\] must have its parameter's shape \(3, 4\), got \(3, 1\)$"),
}


@pytest.mark.parametrize("name", list(MISFIT_STATES))
def test_part_state_of_another_shape_is_refused(name):
    """A state whose tensors do not fit the parameter (the shape the optimiser keeps there:
    its parameter's, Adafactor's factors, LBFGS's flat vectors) is refused naming the entry,
    before anything is loaded."""
    part, key, shape, match = MISFIT_STATES[name]
    model, opt = _with_part(part)
    _part_steps(model, opt, 1)
    before = repr(opt.state_dict())
    bad = copy.deepcopy(opt.state_dict())
    bad["dense"]["state"][0][key] = torch.zeros(shape)
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(bad)
    assert repr(opt.state_dict()) == before


# -- make_optimizer's switches for the dense optimiser -------------------------------------

def _split_model():
    return nn.Sequential(nnsparse.SparseLinearBatch(6, 4, sparse_grad=True), nn.Linear(4, 3))


def _dense_part(opt):
    return opt.optimizers["dense"] if isinstance(opt, SplitOptimizer) else opt


# foreach / fused are torch's None-or-bool, the others bools: a str, an int 0/1, a tensor
# (torch stores any and reads it by its truth: maximize="no" maximised) or None for a bool
# one (differentiable=None failed in torch's set_grad_enabled at the first step) refused
FLAG_CASES = [
    Case("foreach-str-split", lambda: make_optimizer(_split_model(), foreach="x"), TypeError,
         r"^foreach must be None or a bool, got str 'x'$"),
    Case("foreach-str-dense", lambda: make_optimizer(nn.Linear(3, 2), foreach="x"), TypeError,
         r"^foreach must be None or a bool, got str 'x'$"),
    Case("fused-int", lambda: make_optimizer(nn.Linear(3, 2), fused=1), TypeError,
         r"^fused must be None or a bool, got int 1$"),
    Case("capturable-tensor", lambda: make_optimizer(
        nn.Linear(3, 2), capturable=torch.tensor(True)), TypeError,
         r"^capturable must be a bool, got Tensor tensor\(True\)$"),
    Case("differentiable-none", lambda: make_optimizer(nn.Linear(3, 2), differentiable=None),
         TypeError, r"^differentiable must be a bool, got NoneType None$"),
    Case("maximize-str", lambda: make_optimizer(nn.Linear(3, 2), maximize="no"), TypeError,
         r"^maximize must be a bool, got str 'no'$"),
    Case("amsgrad-int-0-split", lambda: make_optimizer(_split_model(), amsgrad=0), TypeError,
         r"^amsgrad must be a bool, got int 0$"),
    Case("decoupled_weight_decay-str", lambda: make_optimizer(
        nn.Linear(3, 2), decoupled_weight_decay="yes"), TypeError,
         r"^decoupled_weight_decay must be a bool, got str 'yes'$"),
    Case("foreach-numpy-bool-passed-as-bool", lambda: make_optimizer(
        nn.Linear(3, 2), foreach=np.True_), None,
         check=lambda opt: opt.param_groups[0]["foreach"] is True),
    Case("maximize-numpy-false-split", lambda: make_optimizer(_split_model(), maximize=np.False_),
         None, check=lambda opt: _dense_part(opt).param_groups[0]["maximize"] is False),
    Case("fused-none-split", lambda: make_optimizer(_split_model(), fused=None), None,
         check=lambda opt: _dense_part(opt).param_groups[0]["fused"] is None),
    Case("amsgrad-true-dense", lambda: make_optimizer(nn.Linear(3, 2), amsgrad=True), None,
         check=lambda opt: opt.param_groups[0]["amsgrad"] is True),
]


@pytest.mark.parametrize("case", FLAG_CASES, ids=[c.id for c in FLAG_CASES])
def test_make_optimizer_checks_the_dense_switches(case, monkeypatch):
    """Each switch of ``dense_kwargs`` is a bool (``foreach``, ``fused``: or None), checked
    before any optimiser is built (a refused call builds none)."""
    if case.error is not None:
        def built(self, *args, **kwargs):
            raise AssertionError(f"{type(self).__name__} built before the check")
        monkeypatch.setattr(torch.optim.Optimizer, "__init__", built)
    run_case(case)


def _lbfgs_then_a_group():
    """A SplitOptimizer whose dense part is an LBFGS of the dense layer's weight, stepped
    twice, then given the bias in a group of its own (torch's LBFGS keeps its flat vectors
    over its first group's parameters, ``_params``; it steps no more with two groups)."""
    torch.manual_seed(0)
    model = _split_model()
    opt = SplitOptimizer({"dense": torch.optim.LBFGS([model[1].weight], history_size=3,
                                                     max_iter=3),
                          "sparse": LazyAdam(model[0].parameters())})
    _part_steps(model, opt, 2)
    opt.optimizers["dense"].add_param_group({"params": [model[1].bias]})
    return opt


def test_lbfgs_flat_vectors_span_its_first_group_only():
    """LBFGS's ``d`` / ``prev_flat_grad`` have its first group's 12 entries, not the 15 of
    all its groups: its own state loads (it was refused, "must have the shape (15,)"), one
    over all the groups' entries is refused, and a refused load changes nothing."""
    saved = copy.deepcopy(_lbfgs_then_a_group().state_dict())
    assert saved["dense"]["state"][0]["d"].shape == (12,)
    opt = _lbfgs_then_a_group()
    opt.optimizers["dense"].state.clear()
    opt.load_state_dict(copy.deepcopy(saved))
    assert _same(opt.state_dict(), saved)
    bad = copy.deepcopy(saved)
    bad["dense"]["state"][0]["d"] = torch.zeros(15)
    with pytest.raises(ValueError, match=_DENSE_ENTRY + r"\['d'\] must have the shape \(12,\) "
                       r"\(LBFGS's flat vector of its parameters' 12 entries\), got \(15,\)$"):
        opt.load_state_dict(bad)
    assert _same(opt.state_dict(), saved)
