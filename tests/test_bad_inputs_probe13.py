"""The thirteenth bad-input probe (docs/bad_inputs_probe13.md): optimiser hyperparameters
given as a ``Fraction``, a numpy float or a tensor (accepted, then failing inside torch at
the first step), parameters deleted from a layer (``del layer.bias``), ``to_pairs`` of an
uncoalesced tensor (a repeated position was two pairs, out of order), and the wording of a
``dtype=`` that is not a ``torch.dtype`` (the str ``'float64'`` read as ``got float64``).

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result, against a reference where there is one).
"""
import io
from decimal import Decimal
from fractions import Fraction
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from probe_cases import Case, run_case
from nnsparse import (DynamicSparseTensor, SparseLinearBatch, SparseOutputLinear,
                      SparseWeightLinear, make_optimizer, ssort, stopk, to_pairs)
from nnsparse.optim import LazyAdam, apply_optimizer_in_backward, fused_step_optimizer

# -- optimiser hyperparameters as Fraction, numpy floats, tensors ----------------------------

_X = torch.tensor([[1., 0, 2, 0], [0, 3, 0, 1]]).to_sparse_csr()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(SparseLinearBatch(4, 3, sparse_grad=True), nn.Linear(3, 2))


_BUILDERS: Dict[str, Callable[..., Any]] = {
    "lazy_adam": lambda m, **kw: LazyAdam(m.parameters(), **kw),
    "make_optimizer": lambda m, **kw: make_optimizer(m, **kw),
    "sparse_adam": lambda m, **kw: make_optimizer(m, sparse="sparse_adam", **kw),
    "fused_step": lambda m, **kw: fused_step_optimizer(m, **kw),
    "in_backward_adam": lambda m, **kw: apply_optimizer_in_backward(m, "adam", **kw),
    "in_backward_sgd": lambda m, **kw: apply_optimizer_in_backward(m, "sgd", **kw),
    "in_backward_adagrad": lambda m, **kw: apply_optimizer_in_backward(m, "adagrad", **kw),
}


def _trained(builder: str, **hp: Any) -> torch.Tensor:
    """The model's parameters after two steps of ``builder``'s optimiser with ``hp``."""
    model = _model()
    opt = _BUILDERS[builder](model, **hp)
    for _ in range(2):
        opt.zero_grad()
        model(_X).pow(2).sum().backward()
        opt.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def _as_floats(hp: Dict[str, Any]) -> Dict[str, Any]:
    return {k: tuple(float(b) for b in v) if k == "betas" else float(v) for k, v in hp.items()}


def _steps_as_floats(builder: str, **hp: Any) -> Case:
    """A row: two steps with ``hp`` move the parameters as the same numbers as floats do."""
    name = "-".join(f"{k}_{type(v if k != 'betas' else v[0]).__name__}" for k, v in hp.items())
    return Case(f"{builder}_{name}_steps", lambda: (_trained(builder, **hp),
                                                     _trained(builder, **_as_floats(hp))),
                None, check=lambda r: torch.allclose(r[0], r[1]))


def _lazy_group_edited() -> Tuple[torch.Tensor, torch.Tensor]:
    """A LazyAdam whose group's eps and weight_decay were set by hand after construction."""
    out = []
    for eps, decay in ((Fraction(1, 10**8), torch.tensor([0.1])), (1e-8, 0.1)):
        model = _model()
        opt = LazyAdam(model.parameters())
        opt.param_groups[0].update(eps=eps, weight_decay=decay)
        model(_X).pow(2).sum().backward()
        opt.step()
        out.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    return out[0], out[1]


def _added_group() -> Any:
    model = _model()
    opt = LazyAdam(model[0].parameters())
    opt.add_param_group({"params": model[1].parameters(), "lr": Fraction(1, 10),
                         "eps": torch.tensor([1e-6]), "betas": (np.float32(0.5), 0.9)})
    model(_X).pow(2).sum().backward()
    opt.step()
    return opt.param_groups[1]


def _custom_keys_kept(make: Callable[[List[Dict[str, Any]]], Any]) -> Dict[str, Any]:
    """A group with keys of the user's own (torch keeps any key) beside the hyperparameters:
    they are the user's, stored as given (a ``(3,)`` tensor failed "only one element
    tensors can be converted", a numpy float became a float)."""
    model = _model()
    tag, scale = torch.ones(3), np.float32(2.0)
    opt = make([{"params": list(model.parameters()), "tag": tag, "scale": scale,
                 "name": "all"}])
    model(_X).pow(2).sum().backward()
    opt.step()
    group = opt.param_groups[0]
    return {"tag": group["tag"] is tag, "scale": type(group["scale"]), "name": group["name"]}


def _conversions_in_steps(monkeypatch: Any, **hp: Any) -> int:
    """How often three LazyAdam steps convert a constructor-made group's hyperparameters
    (``optim._hyper_numbers``): never, an int ``weight_decay=0`` or a float subclass
    (``np.float64``) included, which the constructor stores as they are."""
    import nnsparse.optim as optim
    calls = []
    real = optim._hyper_numbers
    model = _model()
    opt = LazyAdam(model.parameters(), **hp)
    monkeypatch.setattr(optim, "_hyper_numbers", lambda d: calls.append(1) or real(d))
    for _ in range(3):
        model(_X).pow(2).sum().backward()
        opt.step()
    return len(calls)


def _tensor_betas_changed_in_place(make: Callable[..., Any]) -> torch.Tensor:
    """A parameter after three steps of ``make([w], lr=, betas=)`` with betas a pair of 0-d
    tensors (torch's optimisers take one), ``betas[0]`` set to 0 in place before the third:
    the optimiser reads the tensors, as torch.optim.Adam does (they were copied as floats)."""
    w = nn.Parameter(torch.ones(3))
    betas = (torch.tensor(0.9), torch.tensor(0.999))
    opt = make([w], lr=0.1, betas=betas)
    assert opt.param_groups[0]["betas"][0] is betas[0]
    for i in range(3):
        if i == 2:
            betas[0].fill_(0.0)
        opt.zero_grad()
        (w * torch.arange(3.)).sum().backward()
        opt.step()
    return w.detach()


def _weights_only_round_trip(make: Callable[[nn.Module], Any]) -> Any:
    """``torch.load(weights_only=True)`` of the state of an optimiser built by ``make``."""
    model = _model()
    opt = make(model)
    model(_X).pow(2).sum().backward()
    opt.step()
    buffer = io.BytesIO()
    torch.save(opt.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _first_lr(state: Dict[str, Any]) -> Any:
    groups = state["param_groups"] if "param_groups" in state else state["dense"]["param_groups"]
    return groups[0]["lr"]


OPTIM_CASES = [
    # Fraction, (1,) tensors and requires-grad tensors passed the checks and failed inside
    # torch at the first step ("_fused_adam_() received an invalid combination of
    # arguments", "add(): argument 'alpha' must be Number, not Fraction")
    _steps_as_floats("lazy_adam", lr=Fraction(1, 2)),
    _steps_as_floats("lazy_adam", eps=torch.tensor([1e-8])),
    _steps_as_floats("lazy_adam", weight_decay=torch.tensor(0.1, requires_grad=True)),
    _steps_as_floats("lazy_adam", betas=(Fraction(1, 2), 0.999)),
    _steps_as_floats("make_optimizer", lr=Fraction(1, 2)),
    _steps_as_floats("make_optimizer", eps=torch.tensor([1e-8])),
    _steps_as_floats("make_optimizer", weight_decay=torch.tensor([0.1])),
    # torch.optim.Adam: "betas must be either both floats or both Tensors", at construction
    _steps_as_floats("make_optimizer", betas=(torch.tensor(0.5), 0.999)),
    _steps_as_floats("make_optimizer", betas=(np.float32(0.5), 0.999)),
    _steps_as_floats("sparse_adam", lr=Fraction(1, 2)),
    _steps_as_floats("fused_step", lr=Fraction(1, 2)),
    _steps_as_floats("fused_step", betas=(np.float32(0.5), 0.999)),
    _steps_as_floats("in_backward_adam", eps=Fraction(1, 10**8)),
    _steps_as_floats("in_backward_sgd", lr=Fraction(1, 10), momentum=Fraction(1, 2)),
    _steps_as_floats("in_backward_adagrad", lr=Fraction(1, 10), eps=Fraction(1, 10**10)),
    Case("lazy_adam_group_edited_after_construction_steps", _lazy_group_edited, None,
         check=lambda r: torch.allclose(r[0], r[1])),
    Case("lazy_adam_added_group_stores_floats", _added_group, None,
         check=lambda g: (type(g["lr"]), type(g["eps"]), g["betas"]) == (float, float, (0.5, 0.9))),
    # the Fraction was stored in the state: torch.load(weights_only=True) refused the file
    Case("lazy_adam_fraction_lr_state_loads_weights_only",
         lambda: _weights_only_round_trip(lambda m: LazyAdam(m.parameters(), lr=Fraction(1, 2))),
         None, check=lambda s: _first_lr(s) == 0.5),
    Case("make_optimizer_fraction_lr_state_loads_weights_only",
         lambda: _weights_only_round_trip(lambda m: make_optimizer(m, lr=Fraction(1, 2))),
         None, check=lambda s: _first_lr(s) == 0.5),
    # torch's optimisers take a tensor lr (LR schedulers on the device): it stays a tensor
    Case("lazy_adam_tensor_lr_stays_a_tensor",
         lambda: LazyAdam(_model().parameters(), lr=torch.tensor(0.01)).param_groups[0]["lr"],
         None, check=lambda lr: isinstance(lr, torch.Tensor)),
    # a pair of tensor betas is what torch's Adam takes: kept, read at each step
    Case("lazy_adam_tensor_betas_stay_tensors",
         lambda: (_tensor_betas_changed_in_place(LazyAdam),
                  _tensor_betas_changed_in_place(torch.optim.Adam)), None,
         check=lambda r: torch.allclose(r[0], r[1])),
    Case("make_optimizer_tensor_betas_stay_tensors",
         lambda: make_optimizer(_model(), betas=(torch.tensor(0.9), torch.tensor(0.999))),
         None, check=lambda opt: all(isinstance(b, torch.Tensor) for group in opt.param_groups
                                     for b in group["betas"])),
    # keys of the user's own in a group are not hyperparameters: kept as given
    Case("lazy_adam_group_custom_keys_kept",
         lambda: _custom_keys_kept(lambda groups: LazyAdam(groups, lr=0.1)), None,
         check=lambda r: r == {"tag": True, "scale": np.float32, "name": "all"}),
    Case("lazy_adam_decimal_lr_refused",
         lambda: LazyAdam(_model().parameters(), lr=Decimal("0.1")), TypeError,
         r"^lr must be a number, got Decimal Decimal\('0.1'\)$"),
    Case("make_optimizer_str_eps_refused", lambda: make_optimizer(_model(), eps="1e-8"),
         TypeError, r"^eps must be a number, got str '1e-8'$"),
]


@pytest.mark.parametrize("case", OPTIM_CASES, ids=lambda c: c.id)
def test_probe13_optim(case: Case) -> None:
    run_case(case)


# -- parameters deleted from a layer ---------------------------------------------------------

_D = torch.tensor([[1., 0, 2, 0], [0, 3, 0, 1]])


def _deleted(make: Callable[[], nn.Module], name: str, call: Callable[[nn.Module], Any]) -> Any:
    """``call(layer)`` after ``del layer.<name>``; a refused call leaves the layer as it was."""
    layer = make()
    delattr(layer, name)
    state = {k: v.clone() for k, v in layer.state_dict().items()}
    try:
        return call(layer)
    except AttributeError:
        assert state.keys() == layer.state_dict().keys()
        assert all(torch.equal(v, layer.state_dict()[k]) for k, v in state.items())
        raise


def _no_bias_after_delete(make: Callable[[], nn.Module]) -> Tuple[torch.Tensor, torch.Tensor]:
    layer = make()
    del layer.bias
    layer.bias = None
    return layer(_D.to_sparse()), F.linear(_D, layer.weight)


_BIAS_DELETED = (r"\.bias was deleted \(del layer\.bias\); assign layer\.bias = None for no "
                 r"bias, or a parameter of shape \(out_features,\)$")

LAYER_CASES = [
    # torch's "'SparseLinearBatch' object has no attribute 'bias'", from inside the forward
    Case("linear_bias_deleted", lambda: _deleted(lambda: SparseLinearBatch(4, 3), "bias",
                                                 lambda m: m(_D.to_sparse())),
         AttributeError, r"^SparseLinearBatch" + _BIAS_DELETED),
    Case("linear_sparse_grad_bias_deleted",
         lambda: _deleted(lambda: SparseLinearBatch(4, 3, sparse_grad=True), "bias",
                          lambda m: m(_D.to_sparse())),
         AttributeError, r"^SparseLinearBatch" + _BIAS_DELETED),
    Case("linear_weight_deleted", lambda: _deleted(lambda: SparseLinearBatch(4, 3), "weight",
                                                   lambda m: m(_D.to_sparse())),
         AttributeError, r"^SparseLinearBatch\.weight was deleted \(del layer\.weight\); assign "
                         r"a parameter of shape \(out_features, in_features\)$"),
    Case("output_bias_deleted",
         lambda: _deleted(lambda: SparseOutputLinear(4, 3), "bias",
                          lambda m: m(_D, torch.eye(2, 3).to_sparse())),
         AttributeError, r"^SparseOutputLinear" + _BIAS_DELETED),
    Case("sparse_weight_bias_deleted",
         lambda: _deleted(lambda: SparseWeightLinear(torch.eye(3, 4).to_sparse()), "bias",
                          lambda m: m(_D.to_sparse())),
         AttributeError, r"^SparseWeightLinear" + _BIAS_DELETED),
    # repr(layer) raised torch's AttributeError too
    Case("linear_repr_after_bias_deleted",
         lambda: _deleted(lambda: SparseLinearBatch(4, 3), "bias", repr), None,
         check=lambda r: r == "SparseLinearBatch(in_features=4, out_features=3, bias=False, "
                              "sparse_grad=False, mode='auto')"),
    Case("output_repr_after_bias_deleted",
         lambda: _deleted(lambda: SparseOutputLinear(4, 3), "bias", repr), None,
         check=lambda r: "bias=False" in r),
    Case("sparse_weight_repr_after_bias_deleted",
         lambda: _deleted(lambda: SparseWeightLinear(torch.eye(3, 4).to_sparse()), "bias", repr),
         None, check=lambda r: "bias=False" in r),
    Case("linear_bias_deleted_then_none_works",
         lambda: _no_bias_after_delete(lambda: SparseLinearBatch(4, 3)), None,
         check=lambda r: torch.allclose(r[0], r[1])),
    Case("linear_sparse_grad_bias_deleted_then_none_works",
         lambda: _no_bias_after_delete(lambda: SparseLinearBatch(4, 3, sparse_grad=True)), None,
         check=lambda r: torch.allclose(r[0], r[1])),
]


@pytest.mark.parametrize("case", LAYER_CASES, ids=lambda c: c.id)
def test_probe13_layers(case: Case) -> None:
    run_case(case)


# -- to_pairs of an uncoalesced tensor -------------------------------------------------------

def _uncoalesced() -> torch.Tensor:
    """``_D`` plus a zero row, with the entry (0, 2) = 2 given as 1 + 1, columns unsorted."""
    return torch.sparse_coo_tensor(torch.tensor([[0, 0, 1, 1, 0], [2, 0, 3, 1, 2]]),
                                   torch.tensor([1., 1, 1, 3, 1]), (3, 4))


def _same_pairs(got: List[torch.Tensor], expected: List[torch.Tensor]) -> bool:
    return len(got) == len(expected) and all(torch.equal(g, e) for g, e in zip(got, expected))


def _pairs_grad() -> torch.Tensor:
    values = torch.tensor([1., 1, 1, 3, 1], requires_grad=True)
    x = torch.sparse_coo_tensor(_uncoalesced()._indices(), values, (3, 4))
    pairs = to_pairs(x)
    (pairs[0][:, 1] * torch.tensor([10., 20.])).sum().backward()  # (0, 0) * 10, (0, 2) * 20
    return values.grad


PAIRS_CASES = [
    # row 0 was [[2, 1], [0, 1], [2, 1]]: index 2 twice, out of order, where the tensor's
    # dense equivalent (and to_pairs(x.coalesce())) has [[0, 1], [2, 2]]
    Case("to_pairs_uncoalesced_batch_sums_duplicates", lambda: to_pairs(_uncoalesced()), None,
         check=lambda p: _same_pairs(p, to_pairs(_uncoalesced().coalesce()))
         and torch.equal(p[0], torch.tensor([[0., 1.], [2., 2.]]))),
    Case("to_pairs_uncoalesced_vector_sums_duplicates",
         lambda: to_pairs(torch.sparse_coo_tensor(torch.tensor([[3, 0, 3]]),
                                                  torch.tensor([1., 2., 3.]), (5,))),
         None, check=lambda p: torch.equal(p, torch.tensor([[0., 2.], [3., 4.]]))),
    # (stopk sums repeated pair indices itself: a guard that the pairs rank as the tensor)
    Case("stopk_of_to_pairs_matches_stopk", lambda: (stopk(to_pairs(_uncoalesced())[0], 1),
                                                     stopk(_uncoalesced(), 1)), None,
         check=lambda r: r[0].values.tolist() == r[1].values[0].tolist() == [2.0]
         and r[0].indices.tolist() == r[1].indices[0].tolist() == [2]),
    # input already in the (Lua) pair form is returned as given, ordered as ssort left it
    # and a repeated index kept, as ssort keeps it (the coalescing above reordered it by index)
    Case("to_pairs_repeated_pair_rows_kept",
         lambda: to_pairs([torch.tensor([[1., 2.], [1., 3.]]), torch.zeros(0, 2)]), None,
         check=lambda p: _same_pairs(p, [torch.tensor([[1., 2.], [1., 3.]]), torch.zeros(0, 2)])),
    Case("to_pairs_of_ssorted_pairs_keeps_the_order",
         lambda: to_pairs(ssort(torch.tensor([[3., 1.], [1., 4.], [6., 2.]]), descending=True)),
         None, check=lambda p: torch.equal(p, torch.tensor([[1., 4.], [6., 2.], [3., 1.]]))),
    Case("to_pairs_of_ssorted_pair_list_keeps_the_order",
         lambda: to_pairs(ssort([torch.tensor([[3., 1.], [1., 4.]]), torch.zeros(0, 2)])),
         None, check=lambda p: _same_pairs(p, [torch.tensor([[3., 1.], [1., 4.]]),
                                               torch.zeros(0, 2)])),
    Case("to_pairs_uncoalesced_values_stay_differentiable", _pairs_grad, None,
         check=lambda g: g.tolist() == [20., 10., 0., 0., 20.]),
    Case("to_pairs_csr_unchanged", lambda: to_pairs(_D.to_sparse_csr()), None,
         check=lambda p: _same_pairs(p, [torch.tensor([[0., 1.], [2., 2.]]),
                                         torch.tensor([[1., 3.], [3., 1.]])])),
]


@pytest.mark.parametrize("case", PAIRS_CASES, ids=lambda c: c.id)
def test_probe13_pairs(case: Case) -> None:
    run_case(case)


# -- dtype= that is not a torch.dtype --------------------------------------------------------

DTYPE_CASES = [
    # "got float64": the str read as the dtype it names
    Case("linear_dtype_str", lambda: SparseLinearBatch(4, 3, dtype="float64"), TypeError,
         r"^dtype must be a floating-point torch\.dtype \(the parameters learn\), got str "
         r"'float64' \(use torch\.float64\)$"),
    Case("output_dtype_numpy_type", lambda: SparseOutputLinear(4, 3, dtype=np.float64),
         TypeError, r"got type <class 'numpy\.float64'> \(use torch\.float64\)$"),
    # "dtype must be a torch.dtype, got str": no value
    Case("sparse_weight_dtype_str",
         lambda: SparseWeightLinear(torch.eye(3).to_sparse(), dtype="torch.float64"), TypeError,
         r"^dtype must be a floating-point torch\.dtype, got str 'torch\.float64' "
         r"\(use torch\.float64\)$"),
    Case("sparse_weight_dtype_int", lambda: SparseWeightLinear(torch.eye(3).to_sparse(),
                                                               dtype=torch.int64),
         TypeError, r"^dtype must be a floating-point torch\.dtype, got torch\.int64$"),
    Case("builder_dtype_numpy_dtype", lambda: DynamicSparseTensor(dtype=np.dtype("float64")),
         TypeError, r"^dtype must be a floating or integer torch\.dtype, got Float64DType "
                    r"dtype\('float64'\) \(use torch\.float64\)$"),
    Case("builder_dtype_layout", lambda: DynamicSparseTensor(dtype=torch.sparse_coo), TypeError,
         r"^dtype must be a floating or integer torch\.dtype, got layout torch\.sparse_coo$"),
    Case("linear_dtype_float64_works",
         lambda: SparseLinearBatch(4, 3, dtype=torch.float64)(_D.double().to_sparse()), None,
         check=lambda y: y.dtype == torch.float64),
]


@pytest.mark.parametrize("case", DTYPE_CASES, ids=lambda c: c.id)
def test_probe13_dtype(case: Case) -> None:
    run_case(case)



# -- the step converts nothing for a group the constructor made (no per-step cost) ----------

@pytest.mark.parametrize("hp", [dict(weight_decay=0), dict(eps=np.float64(1e-8)),
                                dict(weight_decay=0.0, betas=(0.9, 0.999))],
                         ids=["int_weight_decay", "float64_eps", "floats"])
def test_probe13_lazy_adam_step_converts_nothing_made_by_the_constructor(monkeypatch, hp):
    assert _conversions_in_steps(monkeypatch, **hp) == 0
