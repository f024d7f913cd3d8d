"""The fifteenth bad-input probe (docs/bad_inputs_probe15.md): the Lua calling forms of every
module and criterion, right and wrong (1-based, float, NaN and negative pair indices, mixed
lists, transposed and (k, 3) pairs, duplicate indices, empty rows in a batch, SDAEconf
tables), and what a PyTorch user does to the modules (dtype conversions, zero-width layers,
zero-entry batches, copies mid-use).

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result against the dense reference).  The rows marked
"was:" failed before this probe.
"""
import copy
import io
import pickle
from typing import Any, Callable, Dict, List, Tuple

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import nnsparse
from nnsparse import (Batchifier, Densify, MaskCriterion, PatternSequential, SDAECriterion,
                      SDAESparseCriterion, SparseCriterion, SparseLinearBatch,
                      SparseOutputLinear, SparseWeightLinear, densify, from_pairs, to_pairs)
from nnsparse.optim import LazyAdam
from probe_cases import Case, run_case

W = 5
D = torch.tensor([[0., 3., 0., 1., 0.], [2., 0., 0., 0., 5.], [0., 0., 4., 0., 0.]])
M = D != 0
P = to_pairs(D.to_sparse())  # Lua's table of (k, 2) pair tensors, 0-based
P1 = [torch.cat([p[:, :1] + 1, p[:, 1:]], 1) for p in P]  # Lua's 1-based indices
PAIR = torch.tensor([[1., 3.], [3., 1.], [4., 2.]])  # one Lua sparse vector
PAIR_DENSE = densify(PAIR, size=W)
EMPTY_MID = [P[0], torch.zeros(0, 2), P[2]]
D_EMPTY_MID = torch.stack([D[0], torch.zeros(W), D[2]])
MSE = nn.MSELoss()


def _close(a: Any, b: Any) -> bool:
    a = a.to_dense() if a.layout != torch.strided else a
    return a.shape == b.shape and torch.allclose(a, b, atol=1e-6)


def _seeded(make: Callable[[], nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return make()


# -- zero-width layers (hidden size 0) -------------------------------------------------------

def _zero_hidden_step(optimizer: str, enc_sparse: bool, dec_sparse: bool) -> Tuple[Any, ...]:
    """One step of an autoencoder of hidden size 0, and of its dense-gradient twin with
    torch's Adam: (parameters, reference parameters, gradient layouts)."""
    out = []
    layouts = []
    for sparse in (True, False):
        model = _seeded(lambda: PatternSequential(
            SparseLinearBatch(W, 0, sparse_grad=enc_sparse and sparse), nn.Tanh(),
            SparseOutputLinear(0, W, sparse_grad=dec_sparse and sparse)))
        if not sparse:
            opt: Any = torch.optim.Adam(model.parameters(), lr=0.1)
        elif optimizer == "sparse_adam":
            opt = nnsparse.make_optimizer(model, lr=0.1, sparse="sparse_adam")
        elif optimizer == "lazy":
            opt = LazyAdam(model.parameters(), lr=0.1)
        else:
            opt = nnsparse.make_optimizer(model, lr=0.1)
        x = torch.eye(3, W).to_sparse()
        SparseCriterion(MSE)(model(x, x), x).backward()
        if sparse:
            layouts = [p.grad.layout for p in model.parameters()]
        opt.step()
        out.append([p.detach().clone() for p in model.parameters()])
    return out[0], out[1], layouts


def _same_step(r: Tuple[Any, ...], sparse_layouts: int) -> bool:
    got, ref, layouts = r
    # (with sparse_grad the encoder's parameter is weight_t, (in, out): compared flat)
    return (all(a.numel() == b.numel() and torch.allclose(a.flatten(), b.flatten())
                for a, b in zip(got, ref))
            and layouts.count(torch.sparse_coo) == sparse_layouts)


def _zero_out_grads(sparse_grad: bool) -> Tuple[Any, ...]:
    """SparseLinearBatch(5, 0): the output, the input values' and parameters' gradients,
    and nn.Linear(5, 0)'s input gradient."""
    layer = SparseLinearBatch(W, 0, sparse_grad=sparse_grad)
    values = D[M].clone().requires_grad_()
    out = layer(torch.sparse_coo_tensor(M.nonzero().t(), values, D.shape))
    out.sum().backward()
    dense = D.clone().requires_grad_()
    nn.Linear(W, 0)(dense).sum().backward()
    weight = layer.weight_t if sparse_grad else layer.weight
    return out.shape, values.grad, dense.grad[M], weight.grad, layer.bias.grad


def _sparse_adam_zero_out() -> Tuple[int, ...]:
    """torch.optim.SparseAdam over SparseLinearBatch(5, 0, sparse_grad=True) steps."""
    layer = SparseLinearBatch(W, 0, sparse_grad=True)
    opt = torch.optim.SparseAdam(list(layer.parameters()))
    layer(D.to_sparse()).sum().backward()
    opt.step()
    return tuple(layer.weight_t.shape)


ZERO_CASES = [
    # was: RuntimeError "cannot reshape tensor of 0 elements into shape [-1, 0]" in LazyAdam
    Case("lazy_adam_steps_sparse_output_linear_of_no_inputs",
         lambda: _zero_hidden_step("lazy", False, True), None,
         check=lambda r: _same_step(r, 2)),
    Case("make_optimizer_steps_sparse_output_linear_of_no_inputs",
         lambda: _zero_hidden_step("make", True, True), None,
         check=lambda r: _same_step(r, 4)),
    # was: SparseLinearBatch(5, 0, sparse_grad=True) gave dense gradients: SparseAdam's
    # "takes sparse gradients only, got a dense one for a parameter of shape (5, 0)"
    Case("sparse_adam_steps_sparse_linear_batch_of_no_outputs",
         lambda: _zero_hidden_step("sparse_adam", True, True), None,
         check=lambda r: _same_step(r, 4)),
    Case("torch_sparse_adam_steps_sparse_linear_batch_of_no_outputs", _sparse_adam_zero_out,
         None, check=lambda shape: shape == (W, 0)),
    Case("sparse_linear_batch_of_no_outputs_sparse_grad_layouts",
         lambda: _zero_out_grads(True), None,
         check=lambda r: (r[0] == (3, 0) and r[3].layout == r[4].layout == torch.sparse_coo
                          and r[3].shape == (W, 0) and r[4].shape == (0,)
                          and torch.equal(r[1], r[2]))),
    # was: the input's values got no gradient (None) where nn.Linear(5, 0) gives zeros
    Case("sparse_linear_batch_of_no_outputs_input_values_grad",
         lambda: _zero_out_grads(False), None,
         check=lambda r: (r[0] == (3, 0) and r[1] is not None and torch.equal(r[1], r[2])
                          and r[3].layout == torch.strided)),
    Case("sparse_linear_batch_hidden_size_negative", lambda: SparseLinearBatch(W, -1),
         ValueError, r"^out_features must be non-negative, got -1$"),
    Case("sparse_linear_batch_hidden_size_float", lambda: SparseLinearBatch(W, 3.0),
         TypeError, r"^out_features must be an int, got float 3\.0$"),
    Case("sparse_linear_batch_hidden_size_bool", lambda: SparseLinearBatch(W, True),
         TypeError, r"^out_features must be an int, got bool True$"),
    Case("sparse_output_linear_hidden_size_float", lambda: SparseOutputLinear(2.5, W),
         TypeError, r"^in_features must be an int, got float 2\.5$"),
]


@pytest.mark.parametrize("case", ZERO_CASES, ids=lambda c: c.id)
def test_probe15_zero_width(case: Case) -> None:
    run_case(case)


# -- MaskCriterion and Lua's one-sample call -------------------------------------------------

def _mask_loss(prepared: Any, target: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """MaskCriterion (alpha = beta = 1, nothing hidden) on a 1-D estimate, and the dense
    reference: the squared error over the observed entries (every entry, for a dense
    prepared input), divided by the estimate's size."""
    crit = MaskCriterion(MSE, alpha=1., beta=1.)
    crit.prepare_input(prepared)
    torch.manual_seed(0)
    estimate = torch.randn(W)
    observed = (PAIR_DENSE != 0) if prepared.layout != torch.strided else torch.ones(W, dtype=torch.bool)
    ref = ((estimate - PAIR_DENSE) ** 2)[observed].sum() / W
    return crit(estimate, target), ref


def _mask_rows(target: Any) -> torch.Tensor:
    crit = MaskCriterion(MSE)
    crit.prepare_input(PAIR_DENSE)
    return crit(torch.zeros(W), target)


def _mask_after_lone_pair() -> torch.Tensor:
    crit = MaskCriterion(MSE)
    crit.prepare_input(PAIR)  # a strided (k, 2) tensor: a dense batch of k rows
    return crit(torch.zeros(W), PAIR)


def _one_sample(make: Callable[[], nn.Module], target: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """An SDAE criterion (nothing corrupted) prepared on from_pairs(PAIR), called on a 1-D
    estimate and ``target``; and SparseCriterion's value, the reference."""
    crit = make()
    crit.prepare_input(from_pairs(PAIR, W))
    torch.manual_seed(0)
    estimate = torch.randn(W)
    ref = ((estimate - PAIR_DENSE) ** 2)[PAIR_DENSE != 0].mean()
    return crit(estimate, target), ref


_SAME = lambda r: torch.allclose(r[0], r[1])  # noqa: E731

TARGET_PAIR = torch.tensor([[1., 2.], [2., 7.], [4., 2.5]])  # another pattern than PAIR's


def _mask_weighted(prepared: str, target: Any) -> Tuple[torch.Tensor, ...]:
    """MaskCriterion (alpha 2, beta 0.5, half the entries hidden) prepared on PAIR, sparse
    or dense, and called on a 1-D estimate and ``target`` (TARGET_PAIR in some form): its
    loss and gradient, and the dense reference's, weighted by the remembered mask (alpha
    where hidden, beta where observed, 0 elsewhere) whatever the target's pattern."""
    crit = MaskCriterion(MSE, alpha=2., beta=.5, hide_ratio=.5,
                         generator=torch.Generator().manual_seed(0))
    crit.prepare_input(from_pairs(PAIR, W) if prepared == "sparse" else PAIR_DENSE)
    if prepared == "sparse":
        mask = crit._sparse_mask
        hidden, observed = torch.zeros(W, dtype=torch.bool), torch.zeros(W, dtype=torch.bool)
        observed[mask.col], hidden[mask.col[mask.flag]] = True, True
    else:
        hidden, observed = crit._dense_mask, torch.ones(W, dtype=torch.bool)
    assert 0 < int(hidden.sum()) < int(observed.sum())  # both weights in play
    weight = torch.where(hidden, 2., torch.where(observed, .5, 0.))
    estimate = torch.randn(W, generator=torch.Generator().manual_seed(1), requires_grad=True)
    loss = crit(estimate, target)
    ref = (weight * (estimate - densify(TARGET_PAIR, size=W)) ** 2).sum() / W
    return loss, ref, *torch.autograd.grad(loss, estimate), *torch.autograd.grad(ref, estimate)


def _mask_dense_prepared(target: Any) -> torch.Tensor:
    crit = MaskCriterion(MSE)
    crit.prepare_input(D)
    return crit(torch.zeros(D.shape), target)


_TARGET_FORMS: Dict[str, Callable[[], Any]] = {
    "lone_pair": lambda: TARGET_PAIR, "pair_list": lambda: [TARGET_PAIR],
    "one_row_coo": lambda: densify([TARGET_PAIR], size=(1, W)).to_sparse(),
    "sparse_vector": lambda: from_pairs(TARGET_PAIR, W),
    "dense": lambda: densify(TARGET_PAIR, size=W)}

MASK_CASES = [
    # was: ValueError "target has shape (3, 2), estimate of shape (5,)": the lone pair target
    # of a 1-D estimate, which SparseCriterion and SDAESparseCriterion take (README)
    Case("mask_sparse_prepared_lone_pair_target", lambda: _mask_loss(from_pairs(PAIR, W), PAIR),
         None, check=_SAME),
    Case("mask_dense_prepared_lone_pair_target", lambda: _mask_loss(PAIR_DENSE, PAIR),
         None, check=_SAME),
    # was: ValueError "size of a batch must be a (rows, width) tuple, got 5" (densify's
    # size=, which the caller never passed): a one-row batch beside a 1-D estimate
    Case("mask_dense_prepared_one_row_pair_list_target", lambda: _mask_loss(PAIR_DENSE, [PAIR]),
         None, check=_SAME),
    Case("mask_dense_prepared_one_row_coo_target",
         lambda: _mask_loss(PAIR_DENSE, PAIR_DENSE.unsqueeze(0).to_sparse()), None, check=_SAME),
    Case("mask_sparse_prepared_sparse_vector_target",
         lambda: _mask_loss(from_pairs(PAIR, W), from_pairs(PAIR, W)), None, check=_SAME),
    Case("mask_dense_prepared_dense_target", lambda: _mask_loss(PAIR_DENSE, PAIR_DENSE),
         None, check=_SAME),
    # was (both): "size of a batch must be a (rows, width) tuple, got 5", from densify
    Case("mask_dense_prepared_two_row_target", lambda: _mask_rows([PAIR, PAIR]), ValueError,
         r"^target has 2 rows, estimate of shape \(5,\) has 1$"),
    Case("mask_dense_prepared_wider_target", lambda: _mask_rows([torch.tensor([[7., 1.]])]),
         ValueError, r"^target indices must be in \[0, 5\) \(the columns of the estimate\), "
                     r"got max 7$"),
    # was: "... call prepare_input on this batch" (it had been: the lone pair was read as a
    # dense batch of 3 rows there)
    Case("mask_prepared_on_a_lone_pair_names_from_pairs", _mask_after_lone_pair, ValueError,
         r"given a batch of shape \(3, 2\), the estimate has shape \(5,\); call prepare_input "
         r"on this batch \(a lone \(k, 2\) tensor given to prepare_input is a dense batch; a "
         r"Lua pair vector goes through nnsparse\.from_pairs\(x, size=n\) first\)$"),
    # (review) the one-sample forms keep the remembered mask: alpha on the hidden entries,
    # beta on the others observed, a target of another pattern; loss and gradient
    *[Case(f"mask_{prepared}_prepared_one_sample_{form}_target_weighted",
           lambda prepared=prepared, form=form: _mask_weighted(prepared, _TARGET_FORMS[form]()),
           None, check=lambda r: torch.allclose(r[0], r[1]) and torch.allclose(r[2], r[3]))
      for prepared in ("sparse", "dense") for form in _TARGET_FORMS],
    # was (review: the target read by as_target): after a dense prepare_input, a sparse
    # target of fewer rows or columns, or no rows, was taken, the rest read as 0 (densify
    # padded it to the estimate's size); the criteria's messages now, as SparseCriterion's
    Case("mask_dense_prepared_coo_target_of_fewer_rows",
         lambda: _mask_dense_prepared(D[:2].to_sparse()), ValueError,
         r"^target has 2 rows, estimate of shape \(3, 5\) has 3$"),
    Case("mask_dense_prepared_narrower_coo_target",
         lambda: _mask_dense_prepared(D[:, :4].to_sparse()), ValueError,
         r"^target has width 4, the estimate has 5 columns$"),
    Case("mask_dense_prepared_empty_list_target", lambda: _mask_dense_prepared([]),
         ValueError, r"^target has 0 rows, estimate of shape \(3, 5\) has 3$"),
    Case("sdae_sparse_one_sample_lone_pair_target",
         lambda: _one_sample(lambda: SDAESparseCriterion(MSE, alpha=1., beta=1.), PAIR), None,
         check=_SAME),
    Case("sdae_sparse_one_sample_pair_list_target",
         lambda: _one_sample(lambda: SDAESparseCriterion(MSE, alpha=1., beta=1.), [PAIR]),
         None, check=_SAME),
    Case("sdae_sparse_prepare_lone_pair_refused",
         lambda: SDAESparseCriterion(MSE).prepare_input(PAIR), TypeError,
         r"^input must be sparse, got a dense \(strided\) tensor of shape \(3, 2\); .*"
         # (the hint names size=: from_pairs(x) alone gives the narrowest width, which the
         # estimate then refuses)
         r"a Lua \(k, 2\) pair vector goes through nnsparse\.from_pairs\(x, size=n\), n its "
         r"width \(without size= its width is its largest index \+ 1\)$"),
]


@pytest.mark.parametrize("case", MASK_CASES, ids=lambda c: c.id)
def test_probe15_mask_criterion(case: Case) -> None:
    run_case(case)


# -- SDAEconf tables -------------------------------------------------------------------------

_CRITERIA = [SDAECriterion, SDAESparseCriterion, MaskCriterion]
_PAIR_FORMS: Dict[str, Callable[[], Any]] = {
    "list": lambda: [-1, 1], "tuple": lambda: (-1., 1.), "tensor": lambda: torch.Tensor([-1, 1]),
    "array": lambda: np.array([-1, 1])}

CONF_CASES = [
    # was: the last of the two keys silently won (hide_ratio 0.3)
    *[Case(f"{c.__name__}_conf_names_hide_ratio_twice",
           lambda c=c: c(MSE, {"hideRatio": 0.2, "hide_ratio": 0.3}), ValueError,
           rf"^{c.__name__}: the mapping gives hide_ratio twice, as 'hideRatio': 0\.2 and "
           r"'hide_ratio': 0\.3; keep one of them$") for c in _CRITERIA],
    Case("sdae_sparse_conf_names_flip_range_twice",
         lambda: SDAESparseCriterion(MSE, {"flipRange": [-1, 2], "flip_range": (-1., 1.)}),
         ValueError, r"gives flip_range twice, as 'flipRange': \[-1, 2\] and 'flip_range'"),
    *[Case(f"{c.__name__}_conf_same_value_twice_passes",
           lambda c=c: c(MSE, {"hideRatio": 0.2, "hide_ratio": 0.2}).hide_ratio, None,
           check=lambda r: r == 0.2) for c in _CRITERIA],
    Case("sdae_conf_flip_range_as_list_tensor_and_tuple_passes",
         lambda: SDAECriterion(MSE, {"flipRange": torch.Tensor([-1, 1]),
                                     "flip_range": (-1, 1)}).flip_range, None,
         check=lambda r: tuple(r) == (-1.0, 1.0)),
    # (review) one pair in two forms is one value, whichever forms and order: was refused as
    # "gives flip_range twice" for a list beside a tensor, two equal tensors or arrays
    *[Case(f"sdae_conf_flip_range_as_{a}_and_{b}_passes",
           lambda a=a, b=b: SDAECriterion(MSE, {"flipRange": _PAIR_FORMS[a](),
                                                "flip_range": _PAIR_FORMS[b]()}).flip_range,
           None, check=lambda r: tuple(r) == (-1.0, 1.0))
      for a, b in [("list", "tensor"), ("tensor", "list"), ("tensor", "tensor"),
                   ("array", "list"), ("array", "array"), ("tuple", "array")]],
    # (review) 1 and True are two values (a bool setting is refused), in either order: was
    # refused or taken by the order of the keys
    *[Case(f"mask_conf_hide_ratio_{a}_and_{b}_refused",
           lambda a=a, b=b: MaskCriterion(MSE, {"hideRatio": a, "hide_ratio": b}), ValueError,
           rf"^MaskCriterion: the mapping gives hide_ratio twice, as 'hideRatio': {a!r} and "
           rf"'hide_ratio': {b!r}; keep one of them$")
      for a, b in [(1, True), (True, 1)]],
    # a 0-d tensor is refused alone ("must be a real number"): beside an equal float too
    *[Case(f"mask_conf_hide_ratio_0d_tensor_{order}_refused",
           lambda order=order: MaskCriterion(MSE, dict(
               [("hideRatio", torch.tensor(0.5)), ("hide_ratio", 0.5)][::order])), ValueError,
           r"^MaskCriterion: the mapping gives hide_ratio twice")
      for order in (1, -1)],
    Case("mask_conf_hide_ratio_float_and_numpy_float_passes",
         lambda: MaskCriterion(MSE, {"hideRatio": 0.2, "hide_ratio": np.float64(0.2)}).hide_ratio,
         None, check=lambda r: r == 0.2),
    Case("sdae_conf_lua_table", lambda: SDAESparseCriterion(MSE, {
        "alpha": 1.0, "beta": 0.5, "hideRatio": 0.2, "noiseRatio": 0.1, "noiseMean": 0.,
        "noiseStd": 0.1, "flipRatio": 0.1, "flipRange": [-1, 1]}), None,
         check=lambda c: (c.hide_ratio, c.noise_ratio, c.flip_ratio, c.beta) == (0.2, 0.1, 0.1, 0.5)),
]


@pytest.mark.parametrize("case", CONF_CASES, ids=lambda c: c.id)
def test_probe15_conf(case: Case) -> None:
    run_case(case)


# -- the Lua forms at every module and criterion ---------------------------------------------

def _linear() -> SparseLinearBatch:
    return _seeded(lambda: SparseLinearBatch(W, 3))


def _decoder() -> Tuple[SparseOutputLinear, torch.Tensor]:
    dec = _seeded(lambda: SparseOutputLinear(3, W))
    return dec, torch.randn(3, 3)


def _lin_vs_dense(x: Any, dense: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    lin = _linear()
    return lin(x), F.linear(dense, lin.weight, lin.bias)


def _dec_vs_dense(pattern: Any, dense: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    dec, h = _decoder()
    return dec(h, pattern), F.linear(h, dec.weight, dec.bias) * (dense != 0)


def _crit_vs_dense(target: Any, dense: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(1)
    estimate = torch.randn(dense.shape)
    return (SparseCriterion(MSE)(estimate, target),
            ((estimate - dense) ** 2)[dense != 0].mean())


def _batchify(data: Any, dense: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    net = _seeded(lambda: nn.Sequential(Densify(W), nn.Linear(W, 2)))
    return Batchifier(net, 2, batch_size=2, progress=False)(data), net[1](dense)


def _swl() -> SparseWeightLinear:
    return _seeded(lambda: SparseWeightLinear(torch.tensor([[1., 0, 1, 0, 0], [0, 1, 0, 1, 1],
                                                            [1, 1, 0, 0, 0]]).to_sparse()))


_PAIR_SAME = lambda r: _close(r[0], r[1])  # noqa: E731
DUP = [torch.tensor([[1., 3.], [1., 2.], [3., 1.]])]  # index 1 twice: the values sum
D_DUP = torch.tensor([[0., 5., 0., 1., 0.]])

LUA_CASES = [
    Case("linear_pair_list", lambda: _lin_vs_dense(P, D), None, check=_PAIR_SAME),
    Case("linear_pair_list_empty_row_between", lambda: _lin_vs_dense(EMPTY_MID, D_EMPTY_MID),
         None, check=_PAIR_SAME),
    Case("linear_pair_list_duplicate_index_sums", lambda: _lin_vs_dense(DUP, D_DUP), None,
         check=_PAIR_SAME),
    Case("linear_one_sample_from_pairs", lambda: _lin_vs_dense(from_pairs(PAIR, W), PAIR_DENSE),
         None, check=_PAIR_SAME),
    Case("densify_module_pair_list_empty_row_between", lambda: (Densify(W)(EMPTY_MID), D_EMPTY_MID),
         None, check=_PAIR_SAME),
    Case("densify_module_one_pair", lambda: (Densify(W)(PAIR), PAIR_DENSE), None,
         check=_PAIR_SAME),
    Case("decoder_pattern_pair_list_empty_row_between",
         lambda: _dec_vs_dense(EMPTY_MID, D_EMPTY_MID), None, check=_PAIR_SAME),
    Case("criterion_pair_list_empty_row_between", lambda: _crit_vs_dense(EMPTY_MID, D_EMPTY_MID),
         None, check=_SAME),
    Case("criterion_pair_list_duplicate_index_sums", lambda: _crit_vs_dense(DUP, D_DUP), None,
         check=_SAME),
    Case("batchifier_pair_list_empty_row_between", lambda: _batchify(EMPTY_MID, D_EMPTY_MID),
         None, check=_PAIR_SAME),
    Case("swl_pair_list", lambda: (_swl()(P), F.linear(D, _swl().weight.to_dense()
                                                      if _swl().weight.layout != torch.strided
                                                      else _swl().weight, _swl().bias)),
         None, check=_PAIR_SAME),
    # was: "input must have in_features=5 columns, got shape (3, 2)" without the way round
    Case("swl_lone_pair_names_from_pairs", lambda: _swl()(PAIR), ValueError,
         r"^input must have in_features=5 columns, got shape \(3, 2\); a Lua \(k, 2\) pair "
         r"vector goes through nnsparse\.from_pairs\(input, size=5\), a batch of them as a "
         r"list$"),
    # was: "size must be an int, got tuple (3, 5)" alone
    Case("from_pairs_rows_and_width_size", lambda: from_pairs(P, (3, 5)), TypeError,
         r"^size must be an int, got tuple \(3, 5\); a batch's size is its width, "
         r"from_pairs\(pairs, 5\)$"),
    # (1-based indices whose largest is the width: the message names the Lua slip since
    # test_lua_port's test_lua_one_based_pairs_get_the_hint_wherever_the_width_shows_them)
    Case("linear_lua_one_based_indices", lambda: _linear()(P1), ValueError,
         r"^input\[1\] indices must be in \[0, 5\), got max 5"
         r" \(pair indices are 0-based: a Lua pair tensor's 1-based indices need "
         r"pairs\[:, 0\] - 1\)$"),
    Case("decoder_lua_one_based_pattern", lambda: _decoder()[0](torch.zeros(3, 3), P1),
         ValueError, r"^pattern\[1\] indices must be in \[0, 5\), got max 5"
         r" \(pair indices are 0-based: a Lua pair tensor's 1-based indices need "
         r"pairs\[:, 0\] - 1\)$"),
    Case("criterion_lua_one_based_target", lambda: SparseCriterion(MSE)(torch.zeros(3, W), P1),
         ValueError, r"^target indices must be in \[0, 5\) \(the columns of the estimate\), "
                     r"got max 5"
         r" \(pair indices are 0-based: a Lua pair tensor's 1-based indices need "
         r"pairs\[:, 0\] - 1\)$"),
    Case("linear_fractional_index", lambda: _linear()([torch.tensor([[0.5, 3.]])]), ValueError,
         r"^input\[0\] indices must be integers, got 0\.5$"),
    Case("linear_nan_index", lambda: _linear()([torch.tensor([[float("nan"), 3.]])]),
         ValueError, r"^input\[0\] indices must be finite integers, got nan$"),
    Case("linear_negative_index", lambda: _linear()([torch.tensor([[-1., 3.]])]), ValueError,
         r"^input\[0\] indices must be non-negative, got min -1$"),
    Case("linear_transposed_pairs", lambda: _linear()([p.t() for p in P]), ValueError,
         r"^input\[2\] must be a pair tensor of shape \(k, 2\), got shape \(2, 1\)$"),
    Case("linear_k3_rows", lambda: _linear()([torch.zeros(2, 3)]), ValueError,
         r"^input\[0\] must be a pair tensor of shape \(k, 2\), got shape \(2, 3\)$"),
    Case("linear_pairs_and_sparse_vectors_mixed", lambda: _linear()([P[0], D[1].to_sparse()]),
         TypeError, r"^input mixes sparse vectors and pair tensors; use one form per batch$"),
    Case("criterion_pairs_of_two_dtypes",
         lambda: SparseCriterion(MSE)(torch.zeros(3, W), [P[0], P[1].double(), P[2]]),
         TypeError, r"^target rows must share one dtype, got \['torch\.float32', "
                    r"'torch\.float64'\]$"),
    Case("sdae_sparse_prepare_pairs_and_sparse_vectors_mixed",
         lambda: SDAESparseCriterion(MSE).prepare_input([P[0], D[1].to_sparse()]), TypeError,
         r"^input mixes sparse vectors and pair tensors; use one form per batch$"),
    Case("double_layer_float_pairs", lambda: _linear().double()(P), ValueError,
         r"^input must have the weight's dtype torch\.float64, got torch\.float32; convert the "
         r"input \(x\.to\(torch\.float64\)\) or the layer \(\.to\(torch\.float32\)\)$"),
    Case("half_decoder_float_hidden", lambda: _decoder()[0].half()(torch.zeros(3, 3), P),
         ValueError, r"^weight must have input's dtype torch\.float32, got torch\.float16; convert "
         r"the input \(x\.to\(torch\.float16\)\) or the layer \(\.to\(torch\.float32\)\)$"),
    Case("bfloat16_swl_float_pairs", lambda: _swl().to(torch.bfloat16)(P), ValueError,
         r"^input must have the layer's dtype torch\.bfloat16, got torch\.float32$"),
]


@pytest.mark.parametrize("case", LUA_CASES, ids=lambda c: c.id)
def test_probe15_lua_forms(case: Case) -> None:
    run_case(case)


# -- copies mid-use, and refused calls that change nothing -----------------------------------

def _rt_pickle(o: Any) -> Any:
    return pickle.loads(pickle.dumps(o))


def _rt_torch(o: Any) -> Any:
    buffer = io.BytesIO()
    torch.save(o, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


_COPIES: Dict[str, Callable[[Any], Any]] = {"deepcopy": copy.deepcopy, "pickle": _rt_pickle,
                                            "torch_save": _rt_torch}
_PREPARED: Dict[str, Tuple[Callable[[], nn.Module], torch.Tensor]] = {
    "sdae": (lambda: SDAECriterion(MSE, hide_ratio=0.5, alpha=1., beta=.5,
                                   generator=torch.Generator().manual_seed(1)), D),
    "sdae_sparse": (lambda: SDAESparseCriterion(MSE, hide_ratio=0.5, alpha=1., beta=.5,
                                                generator=torch.Generator().manual_seed(1)),
                    D.to_sparse()),
    "mask": (lambda: MaskCriterion(MSE, hide_ratio=0.5, alpha=1., beta=.5,
                                   generator=torch.Generator().manual_seed(1)), D.to_sparse()),
}


def _copied_mid_use(name: str, how: str) -> List[torch.Tensor]:
    """A criterion copied after prepare_input and a backward: the copy gives the same loss
    on the prepared batch, and the same corruption of the next one (its generator's state)."""
    make, x = _PREPARED[name]
    crit = make()
    crit.prepare_input(x)
    estimate = torch.randn(D.shape, requires_grad=True)
    crit(estimate, x).backward()
    twin = _COPIES[how](crit)
    out = [crit(estimate, x), twin(estimate, x)]
    out += [densify(crit.prepare_input(x)), densify(twin.prepare_input(x))] if x.is_sparse \
        else [crit.prepare_input(x), twin.prepare_input(x)]
    return out


def _refused_prepare_keeps(name: str, bad: Any) -> bool:
    """A refused prepare_input leaves the criterion's masks and generator as they were."""
    make, x = _PREPARED[name]
    crit = make()
    crit.prepare_input(x)
    state = crit.generator.get_state().clone()
    estimate = torch.randn(D.shape)
    loss = crit(estimate, x)
    masks = {k: v for k, v in vars(crit).items() if "mask" in k}
    with pytest.raises((TypeError, ValueError)):
        crit.prepare_input(bad)
    return (torch.equal(state, crit.generator.get_state())
            and all(vars(crit)[k] is v for k, v in masks.items())
            and torch.equal(crit(estimate, x), loss))


_BAD_ROWS = {"k3": [torch.zeros(1, 3)] * 3, "mixed": [P[0], D[1].to_sparse(), P[2]],
             "nan_index": [torch.tensor([[float("nan"), 1.]])] * 3}

STATE_CASES = [
    *[Case(f"{name}_{how}_mid_use", lambda name=name, how=how: _copied_mid_use(name, how), None,
           check=lambda r: torch.allclose(r[0], r[1]) and torch.equal(r[2], r[3]))
      for name in _PREPARED for how in _COPIES],
    *[Case(f"{name}_refused_prepare_{bad}_keeps_state",
           lambda name=name, bad=bad: _refused_prepare_keeps(name, _BAD_ROWS[bad]), None,
           check=bool)
      for name in ("sdae_sparse", "mask") for bad in _BAD_ROWS],
]


@pytest.mark.parametrize("case", STATE_CASES, ids=lambda c: c.id)
def test_probe15_state(case: Case) -> None:
    run_case(case)
