"""The ecosystem probe: ordinary PyTorch idioms on nnsparse's modules, optimisers and models.

Each test is an idiom a PyTorch user applies unchanged (``torch.load(weights_only=True)``,
LR schedulers, ``GradScaler``, gradient clipping, ``random_split``, ``torch.export``),
checked against torch's own result on a dense (or in-backward-free) reference where there
is a number to compare.  What was found and fixed: docs/ecosystem_probe.md.
"""
import copy
import io
import pickle

import pytest
import torch
from torch import nn
from torch.optim import lr_scheduler as S
from torch.utils.data import Subset, random_split

import nnsparse
from nnsparse.data import SparseRowDataset, split_ratings, synthetic_ratings
from nnsparse.optim import LazyAdam, apply_optimizer_in_backward, fused_step_optimizer

from matrix import random_sparse_dense
from probe_cases import Case, run_case


def _round_trip(obj):
    """``torch.save`` then ``torch.load`` with torch's default ``weights_only=True``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _x():
    return torch.tensor([[1., 0, 0, 2, 0, 0], [0, 0, 3, 0, 0, 1]]).to_sparse()


def _autoencoder(sparse_grad=False):
    torch.manual_seed(0)
    return nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse_grad), nn.Tanh(),
        nn.Linear(4, 4), nn.Tanh(), nnsparse.SparseOutputLinear(4, 6, sparse_grad=sparse_grad))


def _train_step(model, opt):
    x = _x()
    loss = (model(x, x).values() - x.values()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss


# -- torch.load(weights_only=True) of every optimiser's state dict -----------------------------

OPTIMISERS = {
    "lazy-adam-dense": (False, lambda m: LazyAdam(m.parameters(), lr=1e-2)),
    "lazy-adam-sparse": (True, lambda m: LazyAdam(m.parameters(), lr=1e-2)),
    "make-optimizer": (True, lambda m: nnsparse.make_optimizer(m, lr=1e-2)),
    "make-optimizer-sparse-adam": (True, lambda m: nnsparse.make_optimizer(
        m, lr=1e-2, sparse="sparse_adam")),
    "fused-step": (False, lambda m: fused_step_optimizer(m, lr=1e-2)),
    "fused-step-sparse-bias": (True, lambda m: fused_step_optimizer(m, lr=1e-2)),
    "in-backward-sgd": (False, lambda m: apply_optimizer_in_backward(m, "sgd", lr=1e-2,
                                                                     momentum=0.9)),
    "in-backward-adamw": (False, lambda m: apply_optimizer_in_backward(m, "adamw", lr=1e-2)),
    "in-backward-adagrad": (False, lambda m: apply_optimizer_in_backward(m, "adagrad")),
    "in-backward-rowwise": (False, lambda m: apply_optimizer_in_backward(m, "rowwise_adagrad")),
}


def _tensors(state):
    """Every tensor of a (nested) state dict, in a fixed order."""
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for k in sorted(state, key=str) for t in _tensors(state[k])]
    if isinstance(state, (list, tuple)):
        return [t for v in state for t in _tensors(v)]
    return []


@pytest.mark.parametrize("name", list(OPTIMISERS))
def test_optimiser_state_dict_loads_with_weights_only(name):
    sparse_grad, make = OPTIMISERS[name]
    model = _autoencoder(sparse_grad)
    opt = make(model)
    _train_step(model, opt)
    saved = _round_trip(opt.state_dict())
    again = make(_autoencoder(sparse_grad))
    again.load_state_dict(saved)
    want, got = _tensors(opt.state_dict()), _tensors(again.state_dict())
    assert len(want) == len(got) > 0
    assert all(torch.equal(a, b) for a, b in zip(want, got))


# -- torch.load(weights_only=True) of whole objects --------------------------------------------

def test_builder_saved_half_way_loads_with_weights_only_and_goes_on():
    builder = nnsparse.DynamicSparseTensor(reserve=2, ndim=2)
    for i in range(5):  # past the reserve, with entries still in the host buffers
        builder.append((i, i + 1), float(i))
    loaded = _round_trip(builder)
    for b in (builder, loaded):
        b.append((7, 0), 7.0)
    assert len(loaded) == len(builder) == 6
    assert torch.equal(loaded.build((8, 8)).to_dense(), builder.build((8, 8)).to_dense())


def test_a_builder_file_with_more_dimensions_than_a_builder_takes_is_refused(monkeypatch):
    """A builder's state sets how many host buffers loading allocates (one per
    dimension): a file claiming more than a builder can have is refused, not obeyed."""
    saving = nnsparse.DynamicSparseTensor.__getstate__
    with monkeypatch.context() as m:
        m.setattr(nnsparse.DynamicSparseTensor, "__getstate__",
                  lambda self: dict(saving(self), _ndim=1000))
        buffer = io.BytesIO()
        torch.save(nnsparse.DynamicSparseTensor(), buffer)
    buffer.seek(0)
    with pytest.raises(ValueError, match=r"a saved DynamicSparseTensor must have ndim an int "
                                         r"in \[1, 64\], got 1000"):
        torch.load(buffer, weights_only=True)


def test_denoising_criterion_after_prepare_input_loads_with_weights_only():
    criterion = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.5)
    x = _x()
    corrupted = criterion.prepare_input(x)
    loaded = _round_trip(criterion)
    out = corrupted.coalesce()
    assert torch.equal(loaded(out, x), criterion(out, x))


@pytest.fixture(scope="module")
def ratings():
    return split_ratings(synthetic_ratings(0, 40, 30, 600), 0.1, seed=0)


@pytest.mark.parametrize("cls", ["AutoRec", "CFN", "KernelNet"])
def test_whole_fitted_zoo_model_loads_with_weights_only(cls, ratings):
    train, test = ratings
    model = getattr(nnsparse.models, cls)(hidden=8, epochs=1, validation_ratio=0.0)
    model.fit(train, verbose=False, progress=False)
    loaded = _round_trip(model)
    assert type(loaded) is type(model)
    assert torch.equal(loaded.predict(test), model.predict(test))


# -- LR schedulers drive the optimiser in the backward -----------------------------------------

def _full_batch():
    """Every input column touched: the in-backward step is then its torch optimiser's."""
    return torch.tensor([[1., 2, 0, 3, 0, 1], [0, 1, 2, 0, 4, 2]]).to_sparse()


SCHEDULERS = {
    "step": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
    "lambda": lambda o: S.LambdaLR(o, lambda epoch: 0.8 ** epoch),
    "cosine": lambda o: S.CosineAnnealingLR(o, T_max=4),
    "one-cycle": lambda o: S.OneCycleLR(o, max_lr=0.05, total_steps=5),  # cycles betas/momentum
    "sequential": lambda o: S.SequentialLR(o, [S.LinearLR(o, 0.1, total_iters=2),
                                               S.ExponentialLR(o, 0.9)], milestones=[2]),
    "plateau": lambda o: S.ReduceLROnPlateau(o, patience=0, factor=0.5),
}
KINDS = {  # in-backward kind -> the torch optimiser it equals with every row touched
    "adam": (dict(lr=1e-2), lambda p: torch.optim.Adam(p, lr=1e-2)),
    "sgd": (dict(lr=1e-2, momentum=0.9), lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9)),
    "adagrad": (dict(lr=1e-2), lambda p: torch.optim.Adagrad(p, lr=1e-2)),
}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_scheduler_reaches_the_in_backward_update(kind, scheduler):
    if scheduler == "one-cycle" and kind == "adagrad":
        pytest.skip("torch's OneCycleLR refuses Adagrad too (no momentum nor betas to cycle)")
    kwargs, make_torch = KINDS[kind]
    torch.manual_seed(0)
    ours = nnsparse.SparseLinearBatch(6, 3)
    reference = copy.deepcopy(ours)
    opt = apply_optimizer_in_backward(ours, kind, **kwargs)
    ref_opt = make_torch(reference.parameters())
    scheds = [SCHEDULERS[scheduler](opt), SCHEDULERS[scheduler](ref_opt)]
    x = _full_batch()
    for _ in range(4):
        for layer, o, s in ((ours, opt, scheds[0]), (reference, ref_opt, scheds[1])):
            o.zero_grad()
            loss = layer(x).pow(2).sum()
            loss.backward()
            o.step()
            s.step(float(loss)) if scheduler == "plateau" else s.step()
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in ref_opt.param_groups] * 2
    torch.testing.assert_close(ours.weight, reference.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.bias, reference.bias, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scheduler", ["step", "one-cycle"])
def test_scheduler_resumed_by_last_epoch_after_the_optimiser_loads(scheduler):
    """torch's other resume: the optimiser's state dict keeps what a scheduler put in the
    groups (``initial_lr``, OneCycleLR's ``max_lr``...), which a scheduler built with
    ``last_epoch`` reads, into a fresh model and optimiser."""
    make = {"step": lambda o, last: S.StepLR(o, step_size=1, gamma=0.5, last_epoch=last),
            "one-cycle": lambda o, last: S.OneCycleLR(o, max_lr=0.05, total_steps=6,
                                                      last_epoch=last)}[scheduler]
    x = _full_batch()

    def run(model, opt, sched, steps):
        for _ in range(steps):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
            sched.step()

    torch.manual_seed(0)
    ours, reference = nnsparse.SparseLinearBatch(6, 3), nnsparse.SparseLinearBatch(6, 3)
    reference.load_state_dict(ours.state_dict())
    fresh, fresh_ref = copy.deepcopy(ours), copy.deepcopy(reference)
    opt, ref_opt = apply_optimizer_in_backward(ours, "adam", lr=1e-2), torch.optim.Adam(
        reference.parameters(), lr=1e-2)
    run(ours, opt, make(opt, -1), 2)
    run(reference, ref_opt, make(ref_opt, -1), 2)
    opt2 = apply_optimizer_in_backward(fresh, "adam", lr=1e-2)
    opt2.load_state_dict(_round_trip(opt.state_dict()))
    ref_opt2 = torch.optim.Adam(fresh_ref.parameters(), lr=1e-2)
    ref_opt2.load_state_dict(ref_opt.state_dict())
    run(fresh, opt2, make(opt2, 1), 2)
    run(fresh_ref, ref_opt2, make(ref_opt2, 1), 2)
    assert [g["lr"] for g in opt2.param_groups] == [g["lr"] for g in ref_opt2.param_groups] * 2
    torch.testing.assert_close(fresh.weight, fresh_ref.weight, rtol=1e-5, atol=1e-6)


def test_in_backward_optimizer_is_a_torch_optimizer():
    model = _autoencoder()
    opt = fused_step_optimizer(model, lr=0.01)
    assert isinstance(opt, torch.optim.Optimizer)
    # one group per in-backward layer (the dict its backward reads), then the dense part's
    assert opt.param_groups[0]["params"][0] is model[0].weight
    assert opt.param_groups[1]["params"][0] is model[4].weight
    assert len(opt.param_groups) == 2 + len(opt.dense.param_groups)
    assert opt.defaults == dict(lr=0.01, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                dense_above=nnsparse.optim.DENSE_ABOVE)
    calls = []
    opt.register_step_pre_hook(lambda o, a, k: calls.append("pre"))
    opt.register_step_post_hook(lambda o, a, k: calls.append("post"))
    opt.register_state_dict_post_hook(lambda o, s: calls.append("state"))
    opt.register_load_state_dict_post_hook(lambda o: calls.append("load"))
    _train_step(model, opt)
    opt.load_state_dict(opt.state_dict())
    assert calls == ["pre", "post", "state", "load"]
    opt.set_lr(0.5)
    assert {g["lr"] for g in opt.param_groups} == {0.5}
    copied_model, copied = copy.deepcopy((model, opt))  # hooks dropped, as pickling drops them
    assert copied._optimizer_step_pre_hooks == {}
    before = copied_model[0].weight.detach().clone()
    _train_step(copied_model, copied)
    assert not torch.equal(copied_model[0].weight, before)
    assert copied.param_groups[0]["params"][0] is copied_model[0].weight


def test_in_backward_step_hooks_as_torch_calls_them():
    """The step hooks get torch's arguments (the step's args, the optimiser first, and
    kwargs), a pre-hook's (args, kwargs) replace them, and the global hooks of
    torch.optim.optimizer run too, as around a torch optimiser's step."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    model = _autoencoder()
    opt = fused_step_optimizer(model, lr=0.01)
    seen = []
    handles = [register_optimizer_step_pre_hook(lambda o, a, k: seen.append(("global", o))),
               register_optimizer_step_post_hook(lambda o, a, k: seen.append(("global-post", o)))]
    try:
        opt.register_step_pre_hook(lambda o, a, k: ((o,), {"closure": lambda: 2.0}))
        opt.register_step_post_hook(lambda o, a, k: seen.append(("post", a, sorted(k))))
        assert opt.step(lambda: 1.0) == 2.0  # the pre-hook's closure ran
    finally:
        for h in handles:
            h.remove()
    assert ("global", opt) in seen and ("global-post", opt) in seen
    assert ("post", (opt,), ["closure"]) in seen


def _sparse_only():
    """An autoencoder whose every parameter is in the backward: no dense part."""
    torch.manual_seed(0)
    return nnsparse.PatternSequential(nnsparse.SparseLinearBatch(6, 4, bias=False), nn.Tanh(),
                                      nnsparse.SparseOutputLinear(4, 6, bias=False))


def _frozen_encoder():
    """The encoder's weight frozen: its bias gets sparse gradients, so the in-backward
    optimiser's dense part is a LazyAdam."""
    model = _autoencoder(sparse_grad=True)
    model[0].weight_t.requires_grad_(False)
    return model


STEPPED_ONCE = {  # name: (model, optimiser, its parts: the optimisers it steps inside)
    "in-backward": (_autoencoder, lambda m: fused_step_optimizer(m, lr=0.01),
                    lambda o: [o.dense]),
    "in-backward-lazy-adam-dense": (_frozen_encoder, lambda m: fused_step_optimizer(m, lr=0.01),
                                    lambda o: [o.dense]),
    "in-backward-alone": (_sparse_only, lambda m: apply_optimizer_in_backward(m, "sgd", lr=0.1),
                          lambda o: []),
    "split": (lambda: _autoencoder(sparse_grad=True), lambda m: nnsparse.make_optimizer(m),
              lambda o: list(o.optimizers.values())),
    "lazy-adam": (_autoencoder, lambda m: LazyAdam(m.parameters()), lambda o: []),
    "torch-adam": (_autoencoder, lambda m: torch.optim.Adam(m.parameters()), lambda o: []),
}


@pytest.mark.parametrize("name", list(STEPPED_ONCE))
def test_global_step_hooks_run_once_per_step_with_the_optimiser_called(name):
    """torch.optim.optimizer's global step hooks run once around one step() of one
    optimiser, with that optimiser, as for torch's own (not again for the parts it steps
    inside: the in-backward optimiser's dense part, a SplitOptimizer's parts); the
    parts' own hooks still run around their step, the profiler still names each step."""
    from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                       register_optimizer_step_pre_hook)
    make_model, build, parts_of = STEPPED_ONCE[name]
    model = make_model()
    opt = build(model)
    parts = parts_of(opt)
    assert all(p is not None for p in parts)
    if name == "in-backward-lazy-adam-dense":
        assert isinstance(opt.dense, LazyAdam)
    seen = []
    handles = [register_optimizer_step_pre_hook(lambda o, a, k: seen.append(("global-pre", o))),
               register_optimizer_step_post_hook(lambda o, a, k: seen.append(("global-post", o))),
               opt.register_step_pre_hook(lambda o, a, k: seen.append(("pre", o))),
               opt.register_step_post_hook(lambda o, a, k: seen.append(("post", o)))]
    for part in parts:
        handles += [part.register_step_pre_hook(lambda o, a, k: seen.append(("part-pre", o))),
                    part.register_step_post_hook(lambda o, a, k: seen.append(("part-post", o)))]
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                _train_step(model, opt)
    finally:
        for h in handles:
            h.remove()
    one_step = ([("global-pre", opt), ("pre", opt)]
                + [(kind, part) for part in parts for kind in ("part-pre", "part-post")]
                + [("post", opt), ("global-post", opt)])
    assert seen == one_step * 2
    names = [e.name for e in prof.events() if e.name.startswith("Optimizer.step#")]
    expected = [f"Optimizer.step#{type(o).__name__}.step" for o in [opt] + parts]
    assert sorted(names) == sorted(expected * 2)


@pytest.mark.parametrize("name", ["in-backward", "split"])
def test_a_scheduler_on_a_part_sees_its_step(name):
    """An LR scheduler driving a part (opt.dense, opt.optimizers[...]) sees that part's
    step taken inside the whole optimiser's: no "lr_scheduler.step() before
    optimizer.step()" warning, and the rate moves."""
    import warnings
    make_model, build, parts_of = STEPPED_ONCE[name]
    model = make_model()
    opt = build(model)
    part = parts_of(opt)[0]
    sched = S.StepLR(part, step_size=1, gamma=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train_step(model, opt)
        sched.step()
    assert part.param_groups[0]["lr"] == 0.5 * part.defaults["lr"]


def _mixed(sparse_grad):
    """SparseLinearBatch with sparse gradients beside a dense nn.Linear: make_optimizer
    then gives a SplitOptimizer."""
    torch.manual_seed(0)
    return nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse_grad), nn.Tanh(), nn.Linear(4, 4),
        nn.Tanh(), nnsparse.SparseOutputLinear(4, 6))


COPIED_WITH_A_SCHEDULER = {
    "in-backward": lambda m: fused_step_optimizer(m, lr=0.01),
    "split": lambda m: nnsparse.make_optimizer(m, lr=0.01),
    "lazy-adam": lambda m: LazyAdam(m.parameters(), lr=0.01),
}


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("name", list(COPIED_WITH_A_SCHEDULER))
def test_optimiser_copied_after_a_scheduler_steps_the_copy(name, how):
    model = _mixed(sparse_grad=name == "split")
    opt = COPIED_WITH_A_SCHEDULER[name](model)
    assert type(opt).__name__ == {"in-backward": "InBackwardOptimizer", "split": "SplitOptimizer",
                                  "lazy-adam": "LazyAdam"}[name]
    S.StepLR(opt, step_size=1)  # wraps opt.step, bound to opt
    copied_model, copied = (copy.deepcopy((model, opt)) if how == "deepcopy" else
                            pickle.loads(pickle.dumps((model, opt))))
    before = [p.detach().clone() for p in model.parameters()]
    copied_before = [p.detach().clone() for p in copied_model.parameters()]
    _train_step(copied_model, copied)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(not torch.equal(a, b) for a, b in zip(copied_before, copied_model.parameters()))


def test_swalr_and_averaged_model_with_the_in_backward_optimizer():
    from torch.optim.swa_utils import SWALR, AveragedModel
    model = _autoencoder()
    opt = fused_step_optimizer(model, lr=0.01)
    swa, sched = AveragedModel(model), SWALR(opt, swa_lr=0.05, anneal_epochs=2)
    for _ in range(3):
        _train_step(model, opt)
        swa.update_parameters(model)
        sched.step()
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.05] * len(opt.param_groups))
    assert opt._updates["0"].hp["lr"] == pytest.approx(0.05)  # what the backward reads
    x = _x()
    assert swa(x, x).layout == torch.sparse_coo


# -- refusals: what cannot work says so ---------------------------------------------------------

def _scaled_in_backward_step():
    model = _autoencoder()
    opt = fused_step_optimizer(model, lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    x = _x()
    opt.zero_grad()
    scaler.scale((model(x, x).values() - x.values()).pow(2).mean()).backward()
    try:
        scaler.step(opt)
    finally:
        opt.step()  # the scaler's attributes are gone: a plain step works again


def _add_group():
    opt = fused_step_optimizer(_autoencoder(), lr=0.01)
    opt.add_param_group({"params": [nn.Parameter(torch.zeros(2))]})


def _export_csr():
    encoder = nn.Sequential(nnsparse.SparseLinearBatch(6, 4), nn.Tanh())
    torch.export.export(encoder, (_x().to_sparse_csr(),))


REFUSALS = [
    Case("grad-scaler-drives-in-backward", _scaled_in_backward_step, NotImplementedError,
         r"GradScaler cannot drive an InBackwardOptimizer: its layers' rows were updated "
         r"inside backward\(\) from the scaled gradient.*LazyAdam / torch.optim with the scaler"),
    Case("in-backward-add-param-group", _add_group, NotImplementedError,
         r"add the group to its dense part: optimizer\.dense\.add_param_group"),
    Case("in-backward-as-a-split-part", lambda: nnsparse.SplitOptimizer(
        {"model": fused_step_optimizer(_autoencoder(), lr=0.01)}), TypeError,
         r"optimizers\['model'\] is an InBackwardOptimizer, which trains a whole model .*"
         r"use it alone, not as a part of a SplitOptimizer"),
    Case("export-a-csr-batch", _export_csr, NotImplementedError,
         r"input: a torch sparse CSR tensor cannot enter a graph of torch.compile or "
         r"torch.export; give the compiled or exported model nnsparse.sparse_parts\(input\)"),
    Case("clip-value-negative", lambda: nnsparse.optim.clip_grad_value_(
        [nn.Parameter(torch.ones(2))], -1.0), ValueError,
         r"clip_value must be non-negative, got -1.0"),
    Case("clip-value-nan", lambda: nnsparse.optim.clip_grad_value_(
        [nn.Parameter(torch.ones(2))], float("nan")), ValueError,
         r"clip_value must be non-negative, got nan"),
    Case("clip-value-str", lambda: nnsparse.optim.clip_grad_value_(
        [nn.Parameter(torch.ones(2))], "1"), TypeError, r"clip_value must be a number, got str"),
    Case("clip-value-foreach", lambda: nnsparse.optim.clip_grad_value_(
        [nn.Parameter(torch.ones(2))], 1.0, foreach=1), TypeError,
         r"foreach must be a bool or None, got int"),
    # torch's own limitation, documented: SparseLinearBatch's column-major weight
    Case("parameters-to-vector", lambda: nn.utils.parameters_to_vector(
        nnsparse.SparseLinearBatch(6, 4).parameters()), RuntimeError,
         r"view size is not compatible with input tensor's size and stride"),
]


@pytest.mark.parametrize("case", REFUSALS, ids=[c.id for c in REFUSALS])
def test_refusal(case):
    run_case(case)


def test_parameters_to_vector_workaround_equals_nn_linear():
    torch.manual_seed(0)
    layer = nnsparse.SparseLinearBatch(6, 4)
    linear = nn.Linear(6, 4)
    linear.load_state_dict(layer.state_dict())
    vector = torch.cat([p.reshape(-1) for p in layer.parameters()])  # docs/ecosystem_probe.md
    assert torch.equal(vector, nn.utils.parameters_to_vector(linear.parameters()))
    with torch.no_grad():  # back, keeping the layout: copy_ into each parameter
        start = 0
        for p in layer.parameters():
            p.copy_((vector * 2)[start:start + p.numel()].view_as(p))
            start += p.numel()
    assert layer.weight.t().is_contiguous()
    assert torch.equal(layer.weight, 2 * linear.weight)


@pytest.mark.parametrize("sparse_grad", [False, True])
def test_custom_init_copied_in_gives_nn_linear_s_values(sparse_grad):
    layer, linear = nnsparse.SparseLinearBatch(6, 4, sparse_grad=sparse_grad), nn.Linear(6, 4)
    for module in (layer, linear):
        torch.manual_seed(1)
        w = torch.empty(4, 6)  # docs/ecosystem_probe.md: drawn row-major, then copied in
        nn.init.xavier_uniform_(w)
        module.weight.data.copy_(w)
    assert torch.equal(layer.weight, linear.weight)
    assert layer._table().is_contiguous()


# -- clip_grad_value_ on sparse gradients --------------------------------------------------------

@pytest.mark.parametrize("clip", [0.0, 0.05, 0.3, 10.0])
def test_clip_grad_value_equals_torch_on_the_dense_model(clip):
    sparse, dense = _autoencoder(sparse_grad=True), _autoencoder(sparse_grad=False)
    x = torch.tensor([[1., 0, 0, 2, 0, 0], [0, 0, 3, 0, 0, 1], [2., 0, 0, 0, 0, 1]]).to_sparse()
    for model in (sparse, dense):
        ((model(x, x).values() - x.values()) * 3).pow(2).sum().backward()
    nnsparse.optim.clip_grad_value_(sparse.parameters(), clip)
    nn.utils.clip_grad_value_(dense.parameters(), clip)
    for p, q in zip(sparse.parameters(), dense.parameters()):
        if p.grad.is_sparse:
            # clamped in place, not densified (a layer's gradient is coalesced in
            # fact, without torch's flag: not coalesced again)
            assert torch.equal(p.grad.coalesce()._indices(), p.grad._indices())
        got = p.grad.to_dense()
        torch.testing.assert_close(got.t() if got.shape != q.shape else got, q.grad)


def test_clip_grad_value_sums_duplicates_first():
    emb = nn.Embedding(10, 2, sparse=True)
    emb(torch.tensor([1, 1, 4])).sum().backward()
    assert not emb.weight.grad.is_coalesced()
    want = emb.weight.grad.to_dense().clamp(-1.5, 1.5)
    nnsparse.optim.clip_grad_value_(emb.parameters(), 1.5)
    assert emb.weight.grad.is_sparse
    assert torch.equal(emb.weight.grad.to_dense(), want)


# -- random_split parts of a SparseRowDataset in the Batchifier ----------------------------------

def test_batchifier_takes_a_random_split_part():
    dense = random_sparse_dense(20, 7, 0.4, dtype=torch.float32)
    dataset = SparseRowDataset(dense.to_sparse_csr())
    part, _ = random_split(dataset, [13, 7], generator=torch.Generator().manual_seed(0))
    nested = Subset(part, [5, 0, 2])
    torch.manual_seed(0)
    network = nn.Sequential(nnsparse.SparseLinearBatch(7, 3), nn.Tanh(), nn.Linear(3, 7))
    run = nnsparse.Batchifier(network, output_size=7, batch_size=4, progress=False)
    for data in (part, nested):
        rows = [data[i][0] for i in range(len(data))]
        with torch.no_grad():
            want = network(dense[rows])
        torch.testing.assert_close(run(data), want)
        best = run.topk(data, k=2, exclude=True)
        real = best.values.isfinite()  # -inf completes a row with fewer than k candidates
        assert bool((dense[rows].gather(1, best.indices) == 0)[real].all())
        assert int(real.sum()) == int((dense[rows] == 0).sum(1).clamp(max=2).sum())


# -- torch.export of an inference forward on SparseParts ----------------------------------------

def test_export_on_sparse_parts_equals_eager_for_another_nnz():
    torch.manual_seed(0)
    autoencoder = nnsparse.PatternSequential(
        nnsparse.SparseLinearBatch(6, 4), nn.Tanh(), nnsparse.SparseOutputLinear(4, 6))
    x = nnsparse.sparse_parts(_x())
    other = torch.tensor([[0., 5, 0, 0, 0, 0], [0, 0, 0, 0, 7, 1]]).to_sparse()
    exported = torch.export.export(autoencoder, (x,)).module()
    torch.testing.assert_close(exported(nnsparse.sparse_parts(other)), autoencoder(other))
    with_pattern = torch.export.export(autoencoder, (x, x)).module()
    got = with_pattern(nnsparse.sparse_parts(other), nnsparse.sparse_parts(other))
    want = autoencoder(other, other)
    torch.testing.assert_close(got.to_sparse_csr().to_dense(), want.to_dense())
