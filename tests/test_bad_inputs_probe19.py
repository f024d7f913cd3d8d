"""The nineteenth bad-input probe (docs/bad_inputs_probe19.md): Tensor subclasses with a
``__torch_function__`` (a logging subclass, and torch's default one of a bare subclass)
as inputs, weights and data; a ``mult_coef`` that grows a builder's storage past int64;
a ``clip_value`` beyond a gradient's dtype range.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result, against a reference where there is one).
"""
import copy
import io
import pickle
from typing import Any, Callable, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.func import functional_call

from probe_cases import Case, run_case
from nnsparse import (DynamicSparseTensor, PatternSequential, SparseLinearBatch,
                      SparseOutputLinear, sampled_linear, sparsify)
from nnsparse.data import RatingNormalizer, Ratings, synthetic_ratings
from nnsparse.models import CFN, AutoRec, GLocalK, KernelNet, Trainer
from nnsparse.optim import clip_grad_value_


class _Logged(Tensor):
    """A subclass with a ``__torch_function__`` of its own, as a logging or tracing one."""
    calls = 0

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        cls.calls += 1
        return super().__torch_function__(func, types, args, kwargs or {})


class _Bare(Tensor):
    """A subclass with torch's default ``__torch_function__`` (results cast to it)."""


_SUBCLASSES = [_Logged, _Bare]

# -- sampled products of subclass inputs and weights --------------------------------------

_X = torch.tensor([[0., 3., 0., 1.], [2., 0., 0., 0.], [0., 0., 0., 0.]])
_MASK = torch.ones(3, 5).tril()
_PATTERN = _MASK.to_sparse()


def _sampled(cls: type, wrap_input: bool, wrap_weight: bool) -> Tuple[Tensor, ...]:
    """``sampled_linear`` at ``_PATTERN`` with the input and/or weight of ``cls``: the
    output (densified) and the gradients of the input, weight and bias."""
    torch.manual_seed(0)
    x = _X.clone().requires_grad_()
    w = torch.randn(5, 4, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    out = sampled_linear(x.as_subclass(cls) if wrap_input else x,
                         w.as_subclass(cls) if wrap_weight else w, b, pattern=_PATTERN)
    dense = out.to_dense()
    (dense * torch.arange(15.).reshape(3, 5)).sum().backward()
    return (dense.detach().as_subclass(Tensor), x.grad, w.grad, b.grad)


def _sampled_reference() -> Tuple[Tensor, ...]:
    torch.manual_seed(0)
    x = _X.clone().requires_grad_()
    w = torch.randn(5, 4, requires_grad=True)
    b = torch.randn(5, requires_grad=True)
    dense = F.linear(x, w, b) * _MASK
    (dense * torch.arange(15.).reshape(3, 5)).sum().backward()
    return (dense.detach(), x.grad, w.grad, b.grad)


def _close(got: Tuple[Any, ...], want: Tuple[Any, ...]) -> bool:
    return all(torch.allclose(g, w, atol=1e-5) for g, w in zip(got, want))


def _layer_params_subclass(cls: type, sparse_grad: bool) -> Tuple[Tensor, ...]:
    """A ``SparseOutputLinear`` called through ``functional_call`` with its parameters
    as ``cls``, against the same layer called plainly: outputs and weight gradients."""
    torch.manual_seed(0)
    layer = SparseOutputLinear(4, 5, sparse_grad=sparse_grad)
    out = []
    for params in ({k: p.as_subclass(cls) for k, p in layer.named_parameters()}, None):
        layer.zero_grad(set_to_none=True)
        y = (functional_call(layer, params, (_X, _PATTERN)) if params is not None
             else layer(_X, _PATTERN)).to_dense()
        (y * torch.arange(15.).reshape(3, 5)).sum().backward()
        out += [y.detach().as_subclass(Tensor), layer.weight.grad.to_dense(),
                layer.bias.grad.to_dense()]
    return tuple(out)


def _sequential(cls: type) -> Tuple[Tensor, Tensor]:
    torch.manual_seed(0)
    net = PatternSequential(SparseLinearBatch(4, 5), nn.ReLU(), SparseOutputLinear(5, 4))
    pattern = sparsify(_X)
    return (net(_X.as_subclass(cls), pattern).to_dense().as_subclass(Tensor),
            net(_X, pattern).to_dense())


SUBCLASS_CASES: List[Case] = []
for _cls in _SUBCLASSES:
    _n = _cls.__name__.strip("_").lower()
    for _wi, _ww, _what in ((True, False, "input"), (False, True, "weight"),
                            (True, True, "both")):
        SUBCLASS_CASES.append(Case(
            f"sampled_linear_{_what}_{_n}",
            lambda c=_cls, wi=_wi, ww=_ww: (_sampled(c, wi, ww), _sampled_reference()),
            None, check=lambda r: _close(*r)))
    for _sg in (False, True):
        SUBCLASS_CASES.append(Case(
            f"sparse_output_linear_params_{_n}_sparse_grad_{_sg}",
            lambda c=_cls, sg=_sg: _layer_params_subclass(c, sg), None,
            check=lambda r: _close(r[:3], r[3:])))
    SUBCLASS_CASES.append(Case(f"pattern_sequential_input_{_n}",
                               lambda c=_cls: _sequential(c), None,
                               check=lambda r: torch.allclose(r[0], r[1])))


@pytest.mark.parametrize("case", SUBCLASS_CASES, ids=lambda c: c.id)
def test_probe19_subclass_sampled(case: Case) -> None:
    run_case(case)


def test_probe19_subclass_logged_calls_seen() -> None:
    """The logging subclass still sees the calls made on it before the sampled product."""
    before = _Logged.calls
    _sampled(_Logged, True, True)
    assert _Logged.calls > before


# -- data of a subclass: the records, models and normalisers hold plain tensors -----------

_R = synthetic_ratings(seed=0, n_users=30, n_items=20, n_ratings=250, titles=False)


def _subclassed(cls: type) -> Ratings:
    return Ratings(_R.user.as_subclass(cls), _R.item.as_subclass(cls),
                   _R.rating.as_subclass(cls), _R.user_map, _R.item_map)


def _fit_copy_save_load(model_cls: type, cls: type) -> Tuple[Tensor, Tensor, Tensor]:
    """A model fitted on subclass ratings: its predictions, a deep copy's, a loaded copy's."""
    model = model_cls(epochs=1, batch_size=32, hidden=8).fit(_subclassed(cls), progress=False,
                                                               verbose=False)
    buf = io.BytesIO()
    model.save(buf)
    buf.seek(0)
    loaded = model_cls.load(buf)
    u, i = _R.user[:9], _R.item[:9]
    return (model.predict_entries(u, i), copy.deepcopy(model).predict_entries(u, i),
            loaded.predict_entries(u, i))


def _fit_same_as_plain(cls: type) -> Tuple[Tensor, Tensor]:
    kw = dict(epochs=1, batch_size=32, hidden=8, seed=3)
    u, i = _R.user[:9], _R.item[:9]
    return (AutoRec(**kw).fit(_subclassed(cls), progress=False, verbose=False)
            .predict_entries(u, i),
            AutoRec(**kw).fit(_R, progress=False, verbose=False).predict_entries(u, i))


def _features_model(cls: type) -> Tuple[Tensor, Tensor]:
    torch.manual_seed(0)
    feats = torch.rand(_R.n_items, 3)
    model = CFN(epochs=1, batch_size=32, hidden=8).fit(_R, features=feats.as_subclass(cls),
                                                        progress=False, verbose=False)
    buf = io.BytesIO()
    model.save(buf)
    buf.seek(0)
    u, i = _R.user[:9], _R.item[:9]
    return model.predict_entries(u, i), CFN.load(buf).predict_entries(u, i)


DATA_CASES: List[Case] = []
for _cls in _SUBCLASSES:
    _n = _cls.__name__.strip("_").lower()
    DATA_CASES += [
        Case(f"ratings_fields_plain_{_n}", lambda c=_cls: _subclassed(c), None,
             check=lambda r: all(type(t) is Tensor for t in (r.user, r.item, r.rating))
             and torch.equal(r.rating, _R.rating)),
        Case(f"ratings_subset_plain_{_n}", lambda c=_cls: _subclassed(c).subset([0, 2]), None,
             check=lambda r: type(r.user) is Tensor and r.rating.tolist() == _R.rating[[0, 2]]
             .tolist()),
        Case(f"normalizer_deepcopy_{_n}",
             lambda c=_cls: copy.deepcopy(RatingNormalizer(_subclassed(c))).row_mean, None,
             check=lambda m: type(m) is Tensor
             and torch.equal(m, RatingNormalizer(_R).row_mean)),
        Case(f"fit_same_as_plain_{_n}", lambda c=_cls: _fit_same_as_plain(c), None,
             check=lambda r: torch.equal(r[0], r[1])),
        Case(f"cfn_features_save_load_{_n}", lambda c=_cls: _features_model(c), None,
             check=lambda r: torch.equal(r[0], r[1])),
    ]
    for _model in (AutoRec, CFN, KernelNet, GLocalK):
        DATA_CASES.append(Case(
            f"{_model.__name__.lower()}_fit_copy_save_load_{_n}",
            lambda m=_model, c=_cls: _fit_copy_save_load(m, c), None,
            check=lambda r: torch.equal(r[0], r[1]) and torch.equal(r[0], r[2])))


@pytest.mark.parametrize("case", DATA_CASES, ids=lambda c: c.id)
def test_probe19_subclass_data(case: Case) -> None:
    run_case(case)


def test_probe19_ratings_plain_keeps_graph_and_storage() -> None:
    """The plain alias of a subclass rating shares its storage; a Parameter is kept as is."""
    rating = _R.rating.clone()
    r = Ratings(_R.user, _R.item, rating.as_subclass(_Logged), _R.user_map, _R.item_map)
    assert r.rating.data_ptr() == rating.data_ptr()
    p = nn.Parameter(_R.rating.clone())
    assert Ratings(_R.user, _R.item, p, _R.user_map, _R.item_map).rating is p
    assert Ratings(_R.user, _R.item, rating, _R.user_map, _R.item_map).rating is rating


# -- DynamicSparseTensor: a mult_coef that grows the storage past int64 -------------------

def _grown(mult: float, ndim: int = 1, reserve: int = 1) -> DynamicSparseTensor:
    builder = DynamicSparseTensor(reserve=reserve, mult_coef=mult, ndim=ndim)
    builder.append(0 if ndim == 1 else (0, 0), 1.0)
    index = torch.arange(1, 50) if ndim == 1 else torch.arange(1, 50).repeat(2, 1).t()
    builder.extend(index, torch.ones(49))
    return builder


def _refused_then_same(mult: float) -> Tuple[int, Tensor]:
    builder = DynamicSparseTensor(reserve=1, mult_coef=mult)
    builder.append(3, 2.0)
    with pytest.raises(ValueError, match=r"mult_coef must keep the storage below 2\*\*63 bytes"):
        builder.extend(torch.arange(1, 50), torch.ones(49))
    return len(builder), builder.build(size=5).to_dense()


BUILDER_CASES = [
    Case("mult_coef_1e308", lambda: _grown(1e308), ValueError,
         r"mult_coef must keep the storage below 2\*\*63 bytes \(1 int64 indices an entry\), "
         r"got 1e\+308: it would grow the storage from 1 to 1e\+308 entries to hold 50; "
         r"nothing was added"),
    # reserve 2: capacity * mult_coef is inf, whose math.ceil raised Python's OverflowError
    # ("cannot convert float infinity to integer") before the check
    Case("mult_coef_1e308_reserve_2", lambda: _grown(1e308, reserve=2), ValueError,
         r"mult_coef must keep the storage below 2\*\*63 bytes \(1 int64 indices an entry\), "
         r"got 1e\+308: it would grow the storage from 2 to more than 1\.8e\+308 entries to "
         r"hold 50; nothing was added"),
    Case("mult_coef_1e200_reserve_5_ndim_2", lambda: _grown(1e200, ndim=2, reserve=5),
         ValueError, r"\(2 int64 indices an entry\), got 1e\+200: it would grow the storage "
         r"from 5 to 5e\+200 entries to hold 50"),
    Case("mult_coef_2_60", lambda: _grown(2.0 ** 60), ValueError,
         r"mult_coef must keep .* got 1\.15292e\+18: it would grow the storage from 1 to "
         r"1\.15e\+18 entries"),
    Case("mult_coef_ndim_2", lambda: _grown(2.0 ** 59, ndim=2), ValueError,
         r"\(2 int64 indices an entry\), got 5\.76461e\+17"),
    Case("mult_coef_1e308_state_kept", lambda: _refused_then_same(1e308), None,
         check=lambda r: r[0] == 1 and r[1].tolist() == [0., 0., 0., 2., 0.]),
    Case("mult_coef_large_fits", lambda: _grown(1e3).capacity, None, check=lambda c: c == 1000),
]


@pytest.mark.parametrize("case", BUILDER_CASES, ids=lambda c: c.id)
def test_probe19_builder_growth(case: Case) -> None:
    run_case(case)


# -- clip_grad_value_ beyond a gradient's dtype range -------------------------------------

def _clipped(dtype: torch.dtype, value: float,
             scale: float = 1000.0) -> Tuple[List[Tensor], List[Tensor]]:
    """Gradients before and after ``clip_grad_value_(value)``: a sparse and a dense one
    (the loss times ``scale``: the largest entry is 2 * ``scale``)."""
    torch.manual_seed(0)
    model = nn.Sequential(SparseLinearBatch(4, 3, sparse_grad=True), nn.Linear(3, 2)).to(dtype)
    x = torch.tensor([[1., 0, 2, 0], [0, 3, 0, 1]], dtype=dtype).to_sparse_csr()
    (model(x) * scale).sum().backward()
    before = [p.grad.to_dense().clone() for p in model.parameters()]
    clip_grad_value_(model.parameters(), value)
    return before, [p.grad.to_dense() for p in model.parameters()]


CLIP_CASES = []
for _dt, _value in ((torch.float16, 1e5), (torch.float16, 1e308), (torch.bfloat16, 1e39),
                    (torch.float32, 1e39), (torch.float32, 1e308)):
    CLIP_CASES.append(Case(f"clip_value_{_value:g}_{str(_dt)[6:]}_unclipped",
                           lambda d=_dt, v=_value: _clipped(d, v), None,
                           check=lambda r: all(torch.equal(a, b) for a, b in zip(*r))))
# (the clipping cases' gradients reach past clip_value: at 1000 times the loss, float32's
# peaked at 2000, which 1e5 left as it was, and a clip skipped in float32 passed unseen)
CLIP_CASES += [
    Case("clip_value_1e5_float32_clips", lambda: _clipped(torch.float32, 1e5, scale=1e5), None,
         check=lambda r: all(torch.equal(a.clamp(-1e5, 1e5), b) for a, b in zip(*r))
         and any(not torch.equal(a, b) for a, b in zip(*r))),
    Case("clip_value_2_float16_clips", lambda: _clipped(torch.float16, 2.0), None,
         check=lambda r: all(torch.equal(a.clamp(-2, 2), b) for a, b in zip(*r))
         and any(not torch.equal(a, b) for a, b in zip(*r))),
]


@pytest.mark.parametrize("case", CLIP_CASES, ids=lambda c: c.id)
def test_probe19_clip_value_beyond_dtype(case: Case) -> None:
    run_case(case)


# -- loss weights beyond the loss's dtype -------------------------------------------------

def _weighted_loss(criterion: type, dtype: torch.dtype, **kw: float) -> Tensor:
    from nnsparse import SDAECriterion, prepare_input
    crit = criterion(nn.MSELoss(), **kw)
    x = torch.tensor([[1., 0, 2, 0], [0, 3, 0, 1]], dtype=dtype)
    target = x if criterion is SDAECriterion else x.to_sparse()
    prepare_input(crit, target)
    return crit(torch.zeros(2, 4, dtype=dtype), target)


def _weight_cases() -> List[Case]:
    from nnsparse import MaskCriterion, SDAECriterion, SDAESparseCriterion
    cases = []
    for crit in (SDAECriterion, SDAESparseCriterion, MaskCriterion):
        for key in ("alpha", "beta"):
            for dtype, value, shown in ((torch.float32, 1e308, r"1e\+308"),
                                        (torch.bfloat16, 1e39, r"1e\+39")):
                cases.append(Case(
                    f"{crit.__name__}_{key}_{value:g}_{str(dtype)[6:]}",
                    lambda c=crit, k=key, d=dtype, v=value: _weighted_loss(c, d, **{k: v}),
                    ValueError, rf"{key} must be a value the loss's dtype torch.float32 can hold "
                    rf"\(in \[-3.40\d*e\+38, 3.40\d*e\+38\]\), got {shown}$"))
        # the largest float32 weight is taken: beta weighs every uncorrupted entry
        cases.append(Case(f"{crit.__name__}_beta_float32_max",
                          lambda c=crit: _weighted_loss(c, torch.float32, beta=3.4e38), None,
                          check=lambda r: r.dtype == torch.float32))
    for key in ("alpha", "beta"):
        cases.append(Case(f"cfn_{key}_beyond_float32", lambda k=key: CFN(**{k: 1e39}), ValueError,
                          rf"{key} must be at most 3.40\d*e\+38 \(the loss is float32\), "
                          rf"got 1e\+39"))
    return cases


@pytest.mark.parametrize("case", _weight_cases(), ids=lambda c: c.id)
def test_probe19_loss_weight_beyond_dtype(case: Case) -> None:
    run_case(case)


def test_probe19_cfn_edited_alpha_refused_at_fit() -> None:
    """``hparams`` edited after construction are checked again by ``fit``, before it starts."""
    model = CFN(epochs=1, batch_size=32, hidden=8)
    model.hparams["alpha"] = 1e300
    with pytest.raises(ValueError, match=r"alpha must be at most 3.40\d*e\+38"):
        model.fit(_R, progress=False, verbose=False)


# -- a model file whose name MODELS maps to another class ---------------------------------

@pytest.mark.parametrize("entry, shown", [
    (CFN, "CFN, named 'cfn'"),
    # no model class: said "a damaged model file ... AttributeError: 'str' object has no
    # attribute 'name'", blaming the file
    ("AutoRec", "'AutoRec', no RatingModel subclass"),
    (nn.Linear, "<class 'torch.nn.modules.linear.Linear'>, no RatingModel subclass"),
], ids=["another_model", "a_str", "another_class"])
def test_probe19_load_refuses_models_edited_by_hand(entry: Any, shown: str) -> None:
    """``MODELS`` edited by hand (not through ``register``): the file's model is not
    rebuilt as the class the name now maps to (a CFN with an AutoRec's weights)."""
    import re
    from nnsparse.models import MODELS, RatingModel
    model = AutoRec(hidden=4, epochs=1, batch_size=32).fit(_R, progress=False, verbose=False)
    buf = io.BytesIO()
    model.save(buf)
    saved = MODELS["autorec"]
    MODELS["autorec"] = entry
    try:
        for loader in (RatingModel, AutoRec):
            buf.seek(0)
            with pytest.raises(ValueError, match=r"holds a model named 'autorec', but MODELS "
                               rf"maps that name to {re.escape(shown)}; register\(\) keeps "
                               r"each class under its own name$"):
                loader.load(buf)
    finally:
        MODELS["autorec"] = saved
    buf.seek(0)
    assert torch.equal(RatingModel.load(buf).predict_entries(_R.user[:5], _R.item[:5]),
                       model.predict_entries(_R.user[:5], _R.item[:5]))


# -- GLocalK's own counts take what the common counts take --------------------------------

GLOCALK_CASES = [
    Case("gk_size_0d_tensor", lambda: GLocalK(gk_size=torch.tensor(5)).hparams["gk_size"], None,
         check=lambda v: type(v) is int and v == 5),
    Case("gk_size_0d_uint8", lambda: GLocalK(gk_size=torch.tensor(5, dtype=torch.uint8))
         .hparams["gk_size"], None, check=lambda v: type(v) is int and v == 5),
    Case("gk_size_0d_numpy", lambda: GLocalK(gk_size=__import__("numpy").array(5))
         .hparams["gk_size"], None, check=lambda v: type(v) is int and v == 5),
    Case("global_epochs_0d_tensor", lambda: GLocalK(global_epochs=torch.tensor(2))
         .hparams["global_epochs"], None, check=lambda v: type(v) is int and v == 2),
    Case("hidden_0d_tensor_as_before", lambda: GLocalK(hidden=torch.tensor(7)).hparams["hidden"],
         None, check=lambda v: type(v) is int and v == 7),
    Case("gk_size_0d_even", lambda: GLocalK(gk_size=torch.tensor(4)), ValueError,
         r"gk_size must be odd .*got 4"),
    Case("gk_size_0d_float", lambda: GLocalK(gk_size=torch.tensor(5.)), TypeError,
         r"gk_size must be an int >= 1, got tensor\(5\.\)"),
    Case("gk_size_1d", lambda: GLocalK(gk_size=torch.tensor([5])), TypeError,
         r"gk_size must be an int >= 1, got tensor\(\[5\]\)"),
    Case("dot_scale_tensor_as_lr", lambda: GLocalK(dot_scale=torch.tensor(2.)), TypeError,
         r"dot_scale must be a real number, got Tensor tensor\(2\.\)"),
]


@pytest.mark.parametrize("case", GLOCALK_CASES, ids=lambda c: c.id)
def test_probe19_glocalk_counts(case: Case) -> None:
    run_case(case)


def test_probe19_glocalk_0d_gk_size_saves() -> None:
    """A 0-d tensor count is stored as an int: the model file loads with weights_only."""
    model = GLocalK(gk_size=torch.tensor(3), global_epochs=torch.tensor(1), epochs=1, hidden=4,
                    batch_size=32).fit(_R, progress=False, verbose=False)
    buf = io.BytesIO()
    model.save(buf)
    buf.seek(0)
    assert GLocalK.load(buf).hparams["gk_size"] == 3


# -- a run that ends diverged is not returned as a fitted model ---------------------------

def _fit(model_cls: type, **hp: Any) -> Any:
    return model_cls(batch_size=32, hidden=8, **hp).fit(_R, progress=False, verbose=False)


def _diverged_cases() -> List[Case]:
    cases = []
    for model_cls in (AutoRec, CFN, KernelNet):
        name = model_cls.__name__.lower()
        # one epoch: its loss is read before its last step, which leaves NaN weights; the
        # validation RMSE after it is NaN (the model predicted NaN everywhere, silently)
        cases.append(Case(f"{name}_one_epoch_validated", lambda m=model_cls: _fit(
            m, epochs=1, lr=1e308), FloatingPointError,
            r"training diverged: no epoch's validation RMSE is finite \(nan\); the learning "
            r"rate was 1e\+308 in epoch 1; a smaller lr"))
        cases.append(Case(f"{name}_one_epoch_unvalidated", lambda m=model_cls: _fit(
            m, epochs=1, lr=1e308, validation_ratio=0.0), FloatingPointError,
            r"training diverged: the weights after epoch 1 are not finite; the learning rate "
            r"was 1e\+308 in epoch 1"))
    # finite weights that predict NaN (KernelNet's kernel of huge weights): seen by validation
    cases.append(Case("kernelnet_nan_predictions_validated", lambda: _fit(
        KernelNet, epochs=1, lr=1e30), FloatingPointError,
        r"no epoch's validation RMSE is finite \(nan\)"))
    # a long run whose every validation is NaN while its loss stays finite (a validation
    # function of one's own): the message shows the first three RMSEs and the last
    cases.append(Case("trainer_eight_epochs_validated", lambda: Trainer(
        _Module("dense"), epochs=8, batch_size=2, lr=1e-3, log=None,
        progress=False).fit(
            torch.eye(4).to_sparse_csr(), validate=lambda: float("nan")), FloatingPointError,
        r"no epoch's validation RMSE is finite \(nan, nan, nan, \.\.\., nan: 8 epochs\); "
        r"the learning rate was"))
    # a large lr whose first epoch validates keeps that epoch, as before (without the refit:
    # the refit's one unvalidated epoch ends at weights whose training loss is inf, which
    # the end-of-run check refuses, below)
    cases.append(Case("autorec_large_lr_kept_epoch", lambda: _fit(
        AutoRec, epochs=3, lr=1e30, refit=False), None, check=lambda m: bool(torch.isfinite(
            m.predict_entries(_R.user[:5], _R.item[:5])).all())))
    cases.append(Case("autorec_large_lr_refit_loss_inf", lambda: _fit(
        AutoRec, epochs=3, lr=1e30), FloatingPointError,
        r"^training diverged: the weights after epoch 1 give a training loss of inf on the "
        r"first 20 rows \(the last step's weights, which no epoch's loss reads\); the learning "
        r"rate was 1e\+30 in epoch 1; a smaller lr"))
    return cases


@pytest.mark.parametrize("case", _diverged_cases(), ids=lambda c: c.id)
def test_probe19_fit_ends_diverged(case: Case) -> None:
    run_case(case)


def test_probe19_diverged_refit_predicts_nothing() -> None:
    """A fitted model refit with an lr that ends diverged raises, and is then unfitted (as
    any fit that fails once it started): it predicts no NaN."""
    model = _fit(AutoRec, epochs=1)
    model.hparams["lr"] = 1e308
    with pytest.raises(FloatingPointError, match="training diverged"):
        model.fit(_R, progress=False, verbose=False)
    with pytest.raises(RuntimeError):
        model.predict_entries(_R.user[:5], _R.item[:5])


# -- the end-of-run check on a Trainer's own module: which parameters it reads -----------

class _Module(nn.Module):
    """A module with one trainable parameter ``w`` of a ``kind`` and a frozen one."""

    def __init__(self, kind: str, frozen: float = 0.0) -> None:
        super().__init__()
        w = torch.ones(4, 4)
        self.w = nn.Parameter(w.to_sparse() if kind == "coo" else w.to(torch.complex64)
                              if kind == "complex" else w)
        self.floor = nn.Parameter(torch.tensor(frozen), requires_grad=False)

    def batch_loss(self, rows: Tensor, x: Any) -> Tensor:
        w = self.w.coalesce().values() if self.w.layout == torch.sparse_coo else self.w
        return (w.abs() ** 2).sum() * 1e-3  # (floor unused: a bound kept for later)


def _sgd_trainer(poison: bool) -> Any:
    """A Trainer with SGD (which takes a sparse COO parameter), optionally poisoning ``w``
    after the step (one an epoch), whose loss was read before it (as a diverging step's is)."""

    class SGDTrainer(Trainer):
        def make_optimizer(self) -> torch.optim.Optimizer:
            return torch.optim.SGD([p for p in self.model.parameters() if p.requires_grad],
                                   lr=self.lr)

        def step(self, batch: Any, optimizer: torch.optim.Optimizer) -> Tensor:
            loss = super().step(batch, optimizer)
            if poison:
                w = self.model.w.detach()
                (w._values() if w.layout == torch.sparse_coo else w).fill_(float("nan"))
            return loss
    return SGDTrainer


def _trainer_run(kind: str, poison: bool, frozen: float = 0.0) -> Any:
    model = _Module(kind, frozen)
    trainer = _sgd_trainer(poison)(model, epochs=2, batch_size=4, lr=1e-2, progress=False,
                                       log=None)
    return trainer.fit(torch.eye(4).to_sparse_csr(), epochs=1)


TRAINER_CASES = [
    # a frozen parameter is none of training's: an inf or NaN there is the module's own
    Case("frozen_inf_kept", lambda: _trainer_run("dense", False, float("-inf")), None,
         check=lambda r: r.best_epoch == 1),
    Case("frozen_nan_kept", lambda: _trainer_run("dense", False, float("nan")), None,
         check=lambda r: r.best_epoch == 1),
    # a sparse COO parameter (SGD takes it): torch's isfinite has no sparse kernel
    Case("sparse_coo_param_finite", lambda: _trainer_run("coo", False), None,
         check=lambda r: r.best_epoch == 1),
    Case("sparse_coo_param_nan", lambda: _trainer_run("coo", True), FloatingPointError,
         r"training diverged: the weights after epoch 1 are not finite"),
    Case("dense_param_nan", lambda: _trainer_run("dense", True), FloatingPointError,
         r"training diverged: the weights after epoch 1 are not finite; the learning rate "
         r"was 0\.01 in epoch 1"),
    # complex weights are checked as save() checks them
    Case("complex_param_nan", lambda: _trainer_run("complex", True), FloatingPointError,
         r"training diverged: the weights after epoch 1 are not finite"),
    Case("complex_param_finite", lambda: _trainer_run("complex", False), None,
         check=lambda r: r.best_epoch == 1),
]


@pytest.mark.parametrize("case", TRAINER_CASES, ids=lambda c: c.id)
def test_probe19_trainer_end_check_parameters(case: Case) -> None:
    run_case(case)
