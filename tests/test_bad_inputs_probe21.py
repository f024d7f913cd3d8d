"""The twenty-first bad-input probe (docs/bad_inputs_probe21.md): the public API fed wrong
types, dtypes, shapes, layouts and devices, keyword misuse, and refused calls in sequence
(a refused call must leave every object as it was).

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result, against a reference where there is one).
"""
import copy
import os
import tempfile
from typing import Any, Callable, List
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from probe_cases import Case, run_case
from nnsparse import (DynamicSparseTensor, SparseLinearBatch, SparseOutputLinear,
                      SplitOptimizer, make_optimizer, normalize, sampled_linear, sparse_parts)
from nnsparse.distributed import init_from_env, is_distributed
from nnsparse.optim import LazyAdam, apply_optimizer_in_backward, fused_step_optimizer

_X = torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.], [0., 0., 0., 0.]])
_PATTERN = torch.ones(3, 5).tril().to_sparse()


def _weight(dtype: torch.dtype) -> torch.Tensor:
    return torch.zeros(5, 4, dtype=dtype)


# -- LazyAdam: a reloaded state is the state saved; a refused load changes nothing -------

def _stepped_lazy() -> LazyAdam:
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(5, 4))
    opt = LazyAdam([p], lr=0.1)
    p.grad = torch.ones_like(p)
    opt.step()
    return opt


def _reload_keeps_groups(copied: bool) -> bool:
    """``load_state_dict(state_dict())`` (of the optimiser, or of a deep copy of it, whose
    ``__setstate__`` gives torch's defaults a ``differentiable`` key) gives back the
    groups saved: torch's load added ``differentiable`` to every group."""
    opt = _stepped_lazy()
    saved = copy.deepcopy(opt.state_dict())
    target = copy.deepcopy(opt) if copied else opt
    target.load_state_dict(saved)
    return target.state_dict()["param_groups"] == saved["param_groups"]


def _lazy_loads_extra_keys() -> bool:
    """A LazyAdam state whose groups carry torch Adam's switches (off) and a user's key
    (a group added with a ``name``), as a state saved on main (reloaded, with
    ``differentiable``) or by torch's conventions has: loaded as saved, then stepped."""
    opt = _stepped_lazy()
    q = nn.Parameter(torch.ones(2))
    opt.add_param_group({"params": [q], "name": "bias", "lr": 0.5})
    q.grad = torch.ones(2)
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    for group in saved["param_groups"]:
        group.update(differentiable=False, foreach=None, maximize=False, capturable=False,
                     fused=None, amsgrad=False)
    opt.load_state_dict(saved)
    opt.step()
    return opt.state_dict()["param_groups"] == saved["param_groups"] and bool((q < 0.5).all())


def _split() -> Any:
    torch.manual_seed(0)
    model = nn.Sequential(SparseLinearBatch(4, 5, sparse_grad=True), nn.Linear(5, 2))
    opt = make_optimizer(model, lr=0.1)
    model(_X.to_sparse()).sum().backward()
    opt.step()
    return opt


def _split_refused_load(part: str, key: str, value: Any, match: str) -> bool:
    """A :class:`SplitOptimizer` load refused for ``part``'s group ``key`` leaves the state
    dict of every part as it was: the parts loaded back after a refusal gained torch's
    ``differentiable`` key in the LazyAdam groups, and the torch Adam part took a
    negative lr (its next steps ascended the loss)."""
    opt = _split()
    before = repr(opt.state_dict())
    bad = copy.deepcopy(opt.state_dict())
    for group in bad[part]["param_groups"]:
        group[key] = value
    with pytest.raises(ValueError, match=match):
        opt.load_state_dict(bad)
    return repr(opt.state_dict()) == before


_DENSE_GROUP = r"^state_dict\['dense'\]\['param_groups'\]\[0\]"


def _in_backward_refused_dense_lr(make: Callable[[nn.Module], Any]) -> bool:
    """An :class:`InBackwardOptimizer` whose dense part (torch's optimiser of the
    parameters outside the in-backward layers) is loaded a negative lr: refused, nothing
    changed (torch's load took it); its own state then reloads."""
    torch.manual_seed(0)
    model = nn.Sequential(SparseLinearBatch(4, 3), nn.Linear(3, 2))
    opt = make(model)
    model(_X.to_sparse()).sum().backward()
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    before = repr(opt.state_dict())
    bad = copy.deepcopy(saved)
    for group in bad["dense"]["param_groups"]:
        group["lr"] = -1.0
    with pytest.raises(ValueError, match=r"^state_dict\['dense'\]\['param_groups'\]\[0\]"
                                         r"\['lr'\] must be non-negative, got -1\.0$"):
        opt.load_state_dict(bad)
    unchanged = repr(opt.state_dict()) == before
    opt.load_state_dict(saved)
    return unchanged and repr(opt.state_dict()) == before


def _lazy_meta_step() -> None:
    p = nn.Parameter(torch.zeros(3, device="meta"))
    opt = LazyAdam([p])
    p.grad = torch.ones(3, device="meta")
    opt.step()


def _lazy_meta_step_without_grad() -> bool:
    """A meta parameter without a gradient is not read by a step: no refusal."""
    p = nn.Parameter(torch.zeros(3, device="meta"))
    q = nn.Parameter(torch.zeros(3))
    opt = LazyAdam([p, q], lr=0.1)
    q.grad = torch.ones(3)
    opt.step()
    return bool((q.detach() < 0).all())


class _ThreeBetas(torch.optim.Optimizer):
    """An optimiser outside torch with three ``betas`` (as Adan's), a pair ``eps`` holding
    None (as torch's Adafactor) and a ``momentum`` that is not a number: its own keys."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, dict(lr=0.1, betas=(0.98, 0.92, 0.99), eps=(None, 1e-3),
                                      momentum="auto"))

    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data.add_(p.grad, alpha=-group["lr"])


def _split_part_reload(make: Callable[[Any], torch.optim.Optimizer],
                       edit: Callable[[dict], None] = lambda group: None) -> bool:
    """A :class:`SplitOptimizer` with one part ``make(params)``, stepped, loaded its own
    state (each saved group passed through ``edit``), stepped again: the groups' checks
    refuse only wrong numbers, not another optimiser's keys nor torch's tensor lr.  The
    groups are then those loaded."""
    torch.manual_seed(0)
    lin = nn.Linear(4, 2)
    opt = SplitOptimizer({"part": make(lin.parameters())})
    lin(_X).sum().backward()
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    for group in saved["part"]["param_groups"]:
        edit(group)
    opt.load_state_dict(saved)
    lin(_X).sum().backward()
    opt.step()
    def keyed(groups: List[dict]) -> List[List[Any]]:
        return [sorted((k, repr(v)) for k, v in group.items()) for group in groups]
    return keyed(opt.state_dict()["part"]["param_groups"]) == keyed(saved["part"]["param_groups"])


def _split_part_refused(make: Callable[[Any], torch.optim.Optimizer], key: str,
                        value: Any) -> None:
    def edit(group: dict) -> None:
        group[key] = value
    _split_part_reload(make, edit)


_SGD = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True)  # noqa: E731
_PART_GROUP = r"^state_dict\['part'\]\['param_groups'\]\[0\]"


OPTIM_CASES: List[Case] = [
    Case("lazy_reload_own_state_keeps_groups", lambda: _reload_keeps_groups(False), None,
         check=bool),
    Case("lazy_reload_into_copy_keeps_groups", lambda: _reload_keeps_groups(True), None,
         check=bool),
    Case("lazy_loads_torch_switches_and_user_keys", _lazy_loads_extra_keys, None, check=bool),
    Case("split_refused_by_sparse_part_keeps_state", lambda: _split_refused_load(
        "sparse", "lr", -1.0, r"^state_dict\['param_groups'\]\[0\]\['lr'\] must be "
                              r"non-negative, got -1\.0$"), None, check=bool),
    Case("split_dense_part_negative_lr", lambda: _split_refused_load(
        "dense", "lr", -1.0, _DENSE_GROUP + r"\['lr'\] must be non-negative, got -1\.0$"),
         None, check=bool),
    Case("split_dense_part_nan_eps", lambda: _split_refused_load(
        "dense", "eps", float("nan"), _DENSE_GROUP + r"\['eps'\] must be non-negative, "
                                                     r"got nan$"), None, check=bool),
    Case("split_dense_part_negative_weight_decay", lambda: _split_refused_load(
        "dense", "weight_decay", -0.1, _DENSE_GROUP + r"\['weight_decay'\] must be "
                                                      r"non-negative, got -0\.1$"),
         None, check=bool),
    Case("split_dense_part_beta_one", lambda: _split_refused_load(
        "dense", "betas", (0.9, 1.0), _DENSE_GROUP + r": betas must be in \[0, 1\), "
                                                     r"got \(0\.9, 1\.0\)$"), None, check=bool),
    Case("fused_step_dense_part_negative_lr", lambda: _in_backward_refused_dense_lr(
        lambda m: fused_step_optimizer(m, lr=0.1)), None, check=bool),
    Case("in_backward_sgd_dense_part_negative_lr", lambda: _in_backward_refused_dense_lr(
        lambda m: apply_optimizer_in_backward(m, "sgd", lr=0.1, momentum=0.5)), None,
         check=bool),
    # references: torch parts of other optimisers, and one outside torch, still load
    Case("split_sgd_nesterov_part_reloads", lambda: _split_part_reload(_SGD), None, check=bool),
    Case("split_sgd_dampening_part_reloads", lambda: _split_part_reload(
        lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.5, dampening=0.5)), None, check=bool),
    Case("split_adamw_part_reloads", lambda: _split_part_reload(torch.optim.AdamW), None,
         check=bool),
    Case("split_adagrad_part_reloads", lambda: _split_part_reload(torch.optim.Adagrad), None,
         check=bool),
    Case("split_rmsprop_part_reloads", lambda: _split_part_reload(
        lambda p: torch.optim.RMSprop(p, momentum=0.5, centered=True)), None, check=bool),
    Case("split_adam_tensor_lr_betas_part_reloads", lambda: _split_part_reload(
        lambda p: torch.optim.Adam(p, lr=torch.tensor(0.01),
                                   betas=(torch.tensor(0.9), torch.tensor(0.99)))), None,
         check=bool),
    Case("split_part_group_with_a_name_reloads", lambda: _split_part_reload(
        torch.optim.AdamW, lambda g: g.update(name="dense")), None, check=bool),
    Case("split_part_outside_torch_reloads", lambda: _split_part_reload(_ThreeBetas), None,
         check=bool),
    # a wrong number in any of those forms is still refused
    Case("split_adam_tensor_lr_negative", lambda: _split_part_refused(
        lambda p: torch.optim.Adam(p, lr=torch.tensor(0.01)), "lr", torch.tensor(-1.0)),
         ValueError, _PART_GROUP + r"\['lr'\] must be non-negative, got -1\.0$"),
    Case("split_adam_tensor_beta_one", lambda: _split_part_refused(
        torch.optim.Adam, "betas", (torch.tensor(0.9), torch.tensor(1.0))), ValueError,
         _PART_GROUP + r": betas must be in \[0, 1\), got \(tensor\(0\.9000\), "
                       r"tensor\(1\.\)\)$"),
    Case("split_sgd_negative_momentum", lambda: _split_part_refused(_SGD, "momentum", -0.9),
         ValueError, _PART_GROUP + r"\['momentum'\] must be non-negative, got -0\.9$"),
    Case("split_part_outside_torch_negative_lr", lambda: _split_part_refused(
        _ThreeBetas, "lr", -0.1), ValueError,
         _PART_GROUP + r"\['lr'\] must be non-negative, got -0\.1$"),
    Case("lazy_step_meta_parameter", _lazy_meta_step, ValueError,
         r"^param_groups\[0\]\['params'\]\[0\] must hold data, got a tensor on the meta "
         r"device$"),
    Case("lazy_step_meta_parameter_without_grad", _lazy_meta_step_without_grad, None,
         check=bool),
]

# -- sampled_linear / SparseOutputLinear: an integer weight is the one to convert --------

LAYER_CASES: List[Case] = [
    Case("sampled_int32_weight", lambda: sampled_linear(_X, _weight(torch.int32),
                                                        pattern=_PATTERN), ValueError,
         r"^weight must have input's dtype torch\.float32, got torch\.int32; convert weight "
         r"\(weight\.to\(torch\.float32\)\)$"),
    Case("sampled_bool_weight", lambda: sampled_linear(_X, _weight(torch.bool),
                                                       pattern=_PATTERN), ValueError,
         r"^weight must have input's dtype torch\.float32, got torch\.bool; convert weight "
         r"\(weight\.to\(torch\.float32\)\)$"),
    Case("sampled_int64_weight_no_pattern", lambda: sampled_linear(_X, _weight(torch.int64)),
         ValueError, r"^weight must have input's dtype torch\.float32, got torch\.int64; "
                     r"convert weight \(weight\.to\(torch\.float32\)\)$"),
    Case("sampled_int64_bias", lambda: sampled_linear(
        _X.double(), _weight(torch.float64), torch.zeros(5, dtype=torch.int64),
        pattern=_PATTERN), ValueError,
         r"^bias must have (the weight's|input's) dtype torch\.float64, got torch\.int64"),
    Case("sampled_int32_weight_parts_pattern", lambda: sampled_linear(
        _X, _weight(torch.int32), pattern=sparse_parts(_PATTERN.to_sparse_csr())), ValueError,
         r"^weight must have input's dtype torch\.float32, got torch\.int32; convert weight "
         r"\(weight\.to\(torch\.float32\)\)$"),
    # references: an integer or float64 input to a float32 layer is still the input's to fix
    Case("decoder_int64_input", lambda: SparseOutputLinear(4, 5)(_X.long(), _PATTERN),
         ValueError, r"^weight must have input's dtype torch\.int64, got torch\.float32; "
                     r"convert the input \(x\.to\(torch\.float32\)\)$"),
    Case("decoder_float64_input", lambda: SparseOutputLinear(4, 5)(_X.double(), _PATTERN),
         ValueError, r"^weight must have input's dtype torch\.float64, got torch\.float32; "
                     r"convert the input \(x\.to\(torch\.float32\)\) or the layer "
                     r"\(\.to\(torch\.float64\)\)$"),
]

# -- normalize: a dense input gets the sparse path's checks ------------------------------

_P_REFUSED = r"^nnsparse\.normalize takes p > 0 \(a norm; math\.inf for the largest \|value\|\)"

NORMALIZE_CASES: List[Case] = [
    Case("dense_p_negative", lambda: normalize(_X, p=-1), NotImplementedError,
         _P_REFUSED + r", got p=-1\.0$"),
    Case("dense_p_zero", lambda: normalize(_X, p=0), NotImplementedError,
         _P_REFUSED + r", got p=0\.0$"),
    Case("dense_vector_p_negative", lambda: normalize(_X[0], p=-2.5, dim=0),
         NotImplementedError, _P_REFUSED + r", got p=-2\.5$"),
    Case("sparse_p_negative_as_before", lambda: normalize(_X.to_sparse(), p=-1),
         NotImplementedError, _P_REFUSED + r", got p=-1\.0$"),
    Case("dense_dim_out_of_range", lambda: normalize(_X, dim=5), IndexError,
         r"^dim out of range for a 2-D tensor \(expected to be in range of \[-2, 1\]\), got 5$"),
    Case("dense_dim_negative_out_of_range", lambda: normalize(_X, dim=-3), IndexError,
         r"^dim out of range for a 2-D tensor \(expected to be in range of \[-2, 1\]\), "
         r"got -3$"),
    Case("dense_0d_default_dim", lambda: normalize(torch.tensor(3.)), IndexError,
         r"^dim out of range for a 0-D tensor \(expected to be in range of \[-1, 0\]\), got 1$"),
    # references: F.normalize's results where the arguments are in range
    Case("dense_default_is_F_normalize", lambda: normalize(_X), None,
         check=lambda out: torch.equal(out, F.normalize(_X))),
    Case("dense_p_inf_dim_minus_1", lambda: normalize(_X, p=float("inf"), dim=-1), None,
         check=lambda out: torch.equal(out, F.normalize(_X, p=float("inf"), dim=-1))),
    Case("dense_vector_dim_0", lambda: normalize(torch.tensor([3., 4.]), dim=0), None,
         check=lambda out: torch.allclose(out, torch.tensor([0.6, 0.8]))),
    Case("dense_0d_dim_0", lambda: normalize(torch.tensor(3.), dim=0), None,
         check=lambda out: torch.equal(out, F.normalize(torch.tensor(3.), dim=0))),
    Case("dense_3d_dim_2", lambda: normalize(torch.ones(2, 3, 4), dim=2), None,
         check=lambda out: torch.allclose(out, torch.full((2, 3, 4), 0.5))),
]

# -- DynamicSparseTensor: a reserve whose storage passes 2**63 bytes ----------------------

_RESERVE = r"^reserve must keep the storage below 2\*\*63 bytes \({} int64 indices an entry\), "

BUILDER_CASES: List[Case] = [
    Case("reserve_2_62", lambda: DynamicSparseTensor(reserve=2 ** 62), ValueError,
         _RESERVE.format(1) + r"got 4611686018427387904$"),
    Case("reserve_2_60", lambda: DynamicSparseTensor(reserve=2 ** 60), ValueError,
         _RESERVE.format(1) + r"got 1152921504606846976$"),
    Case("reserve_2_59_ndim_2", lambda: DynamicSparseTensor(reserve=2 ** 59, ndim=2),
         ValueError, _RESERVE.format(2) + r"got 576460752303423488$"),
    Case("reserve_int64_max", lambda: DynamicSparseTensor(reserve=2 ** 63 - 1), ValueError,
         _RESERVE.format(1) + r"got 9223372036854775807$"),
    # as before: beyond int64, and a reserve that fits
    Case("reserve_beyond_int64", lambda: DynamicSparseTensor(reserve=2 ** 63), ValueError,
         r"^reserve must be a non-negative int within int64 \(below 2\*\*63\), got "),
    Case("reserve_zero", lambda: DynamicSparseTensor(reserve=0, ndim=3).build(size=(1, 1, 1)),
         None, check=lambda out: out._nnz() == 0 and out.shape == (1, 1, 1)),
]

# -- distributed.init_from_env: MASTER_PORT checked with the other variables -------------

def _init_with_port(port: str) -> Any:
    """``init_from_env`` of a launched one-process run whose ``MASTER_PORT`` is ``port``
    (the environment restored after; refused before any group is joined)."""
    env = dict(WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    try:
        with mock.patch.dict(os.environ, env):
            return init_from_env(device="cpu", timeout=5)
    finally:
        assert not is_distributed()


def _joined_port_unread() -> bool:
    """A group joined by hand before (a ``file://`` store, not ``env://``) in a launched
    run: ``init_from_env`` joins nothing, so a ``MASTER_PORT`` it would not read (here
    malformed) is not refused; the group's device comes back."""
    env = dict(WORLD_SIZE="1", RANK="0", MASTER_PORT="unused")
    with mock.patch.dict(os.environ, env), tempfile.TemporaryDirectory() as tmp:
        try:
            dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0,
                                    world_size=1)
            return init_from_env(device="cpu", timeout=5) == torch.device("cpu")
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()


DIST_CASES: List[Case] = [
    Case("master_port_not_an_int", lambda: _init_with_port("notaport"), ValueError,
         r"^environment variable MASTER_PORT must be an integer, got 'notaport'$"),
    Case("master_port_above_65535", lambda: _init_with_port("99999"), ValueError,
         r"^environment variable MASTER_PORT must be an integer in \[0, 65536\), got '99999'$"),
    Case("master_port_negative", lambda: _init_with_port("-1"), ValueError,
         r"^environment variable MASTER_PORT must be an integer in \[0, 65536\), got '-1'$"),
    Case("master_port_unread_in_a_joined_group", _joined_port_unread, None, check=bool),
]

CASES = OPTIM_CASES + LAYER_CASES + NORMALIZE_CASES + BUILDER_CASES + DIST_CASES


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_probe21(case: Case) -> None:
    run_case(case)


def test_ids_distinct() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
