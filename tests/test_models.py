"""Tests of nnsparse.models: fit, predict, fallback, recommend, save/load, cross-validation."""
import contextlib
import copy
import errno
import io
import math
import os
import pickle
import re
import shutil
import signal
import stat
import threading

import numpy as np
import pytest
import torch

from nnsparse import Batchifier
from nnsparse.data import (Ratings, mean_prediction, rmse, split_ratings, synthetic_item_features,
                           synthetic_ratings)
from nnsparse.data import SparseRowDataset
from nnsparse.models import (AutoRec, CFN, GLocalK, KernelNet, RatingModel, Trainer, cross_validate,
                             kfold)
from nnsparse.models.base import _COMMON

TINY = dict(hidden=16, epochs=8, batch_size=16, lr=1e-2, validation_ratio=0.0)
MODELS = [(AutoRec, dict(l2=10.0)), (CFN, dict(l2=60.0)), (KernelNet, dict(l2=10.0, layers=1))]


@pytest.fixture(scope="module")
def data():
    r = synthetic_ratings(seed=3, n_users=200, n_items=150, n_ratings=8000)
    return split_ratings(r, 0.15, seed=0)


def _fit(cls, extra, train, **kw):
    torch.manual_seed(0)
    return cls(**{**TINY, **extra, **kw}).fit(train, verbose=False, progress=False)


@pytest.mark.parametrize("cls, extra", MODELS, ids=lambda v: getattr(v, "name", ""))
def test_fit_decreases_loss_and_beats_the_item_mean(data, cls, extra):
    train, test = data
    model = _fit(cls, extra, train, epochs=12)
    losses = [h["train_loss"] for h in model.history]
    assert losses[-1] < 0.8 * losses[0]
    item_mean = float(rmse(mean_prediction(train, test), test.rating))
    assert model.evaluate(test)["rmse"] < item_mean


@pytest.mark.parametrize("orientation", ["item", "user"])
def test_predictions_on_the_rating_scale(data, orientation):
    train, test = data
    model = _fit(AutoRec, {}, train, orientation=orientation, epochs=2)
    pred = model.predict(test)
    assert pred.shape == test.rating.shape and pred.dtype == torch.float32
    assert float(pred.min()) >= 1.0 and float(pred.max()) <= 5.0
    # the same entries asked twice, in another order, give the same numbers
    order = torch.randperm(len(test), generator=torch.Generator().manual_seed(0))
    again = model.predict_entries(torch.cat([test.user[order], test.user]),
                                  torch.cat([test.item[order], test.item]))
    assert torch.allclose(again[:len(test)], pred[order], atol=1e-5)
    assert torch.allclose(again[len(test):], pred, atol=1e-5)


def test_fallback_counts():
    # user 2 and item 2 have no training rating
    train = Ratings(torch.tensor([0, 0, 1, 1]), torch.tensor([0, 1, 0, 1]),
                    torch.tensor([4., 2., 5., 3.]), {0: 0, 1: 1, 2: 2}, {0: 0, 1: 1, 2: 2})
    model = AutoRec(hidden=4, epochs=1, validation_ratio=0.0).fit(train, verbose=False,
                                                                  progress=False)
    users, items = torch.tensor([2, 0, 2, 1]), torch.tensor([0, 2, 2, 1])
    pred, counts = model.predict_entries(users, items, return_counts=True)
    assert counts == dict(item_mean=1, user_mean=1, global_mean=1)
    assert pred[2] == pytest.approx(3.5)                      # global mean
    assert pred[0] == pytest.approx((4 + 5 + 3 * 3.5) / 5)    # item 0's mean, shrunk
    assert pred[1] == pytest.approx((4 + 2 + 3 * 3.5) / 5)    # user 0's mean, shrunk
    test = Ratings(users, items, torch.tensor([3., 3., 3., 3.]), train.user_map, train.item_map)
    assert model.evaluate(test)["fallback"] == 3


def test_early_stopping_and_refit(data):
    train, _ = data
    model = AutoRec(hidden=16, epochs=6, batch_size=16, lr=1e-2, validation_ratio=0.1,
                    patience=2).fit(train, verbose=False, progress=False)
    valid = [h["valid_rmse"] for h in model.history]
    assert model.best_epoch == 1 + valid.index(min(valid))
    # the refit trained on all of train: every training rating is in its input
    assert model._input._nnz() == len(train)


def test_save_load_round_trip(tmp_path, data):
    train, test = data
    features = synthetic_item_features(3, train.n_items)
    model = CFN(**{**TINY, "epochs": 2}).fit(train, features=features, verbose=False,
                                               progress=False)
    path = tmp_path / "m.pt"
    model.save(path)
    blob = torch.load(path, weights_only=True)
    assert blob["model"] == "cfn" and blob["hparams"]["hidden"] == 16
    loaded = RatingModel.load(path)
    assert isinstance(loaded, CFN) and loaded.hparams == model.hparams
    assert torch.equal(loaded.predict(test), model.predict(test))
    assert loaded.recommend(0, 3, min_support=0).ids == model.recommend(0, 3, min_support=0).ids
    with pytest.raises(ValueError, match="holds a CFN, not an AutoRec"):
        AutoRec.load(path)


def test_load_leaves_the_global_rng_alone(tmp_path, data):
    model = AutoRec(**{**TINY, "epochs": 1}).fit(data[0], verbose=False, progress=False)
    model.save(tmp_path / "m.pt")
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    RatingModel.load(tmp_path / "m.pt")
    assert torch.equal(torch.rand(4), expected)



@pytest.mark.parametrize("copy_", ["deepcopy", "pickle"])
@pytest.mark.parametrize("cls, extra", MODELS, ids=lambda v: getattr(v, "name", ""))
def test_a_fitted_model_copies(data, cls, extra, copy_):
    # a snapshot of the best model of a sweep: deepcopy failed on the CSR training matrix
    train, test = data
    model = _fit(cls, extra, train, epochs=1)
    other = copy.deepcopy(model) if copy_ == "deepcopy" else pickle.loads(pickle.dumps(model))
    assert other._input.layout == torch.sparse_csr
    assert torch.equal(other._input.to_dense(), model._input.to_dense())
    assert torch.equal(other.predict(test), model.predict(test))
    other.fit(train, verbose=False, progress=False)  # the copy trains on its own
    for p, q in zip(model.state_dict().values(), _fit(cls, extra, train, epochs=1)
                    .state_dict().values()):
        assert torch.equal(p, q)

def test_recommend_filters(data):
    train, _ = data
    model = _fit(AutoRec, {}, train, epochs=3)
    recs = model.recommend(5, 10, min_support=40, shrinkage=0)
    assert bool((recs.support >= 40).all())
    rated = set(train.item[train.user == 5].tolist())
    assert not rated & set(recs.index.tolist())
    assert recs.score.tolist() == sorted(recs.score.tolist(), reverse=True)
    assert torch.allclose(recs.score, recs.rating)  # no shrinkage: ranked by the prediction
    shrunk = model.recommend(5, 10, min_support=0, shrinkage=1e6)
    assert float((shrunk.score - model.global_mean).abs().max()) < 1e-2
    assert len(model.recommend(5, 10, min_support=10**6).ids) == 0
    with pytest.raises(KeyError, match="user 'nobody' is not in the training data"):
        model.recommend("nobody")


def test_cross_validate_table():
    r = synthetic_ratings(seed=2, n_users=50, n_items=40, n_ratings=900)
    folds = list(kfold(r, k=3, seed=0))
    assert sum(len(test) for _, test in folds) == len(r)
    cv = cross_validate(lambda: AutoRec(hidden=8, epochs=2, validation_ratio=0.0), folds,
                        progress=False)
    assert len(cv.folds) == 3 and math.isfinite(cv.mean()) and cv.std() >= 0
    lines = cv.table().splitlines()
    assert len(lines) == 2 + 3 + 1 and lines[-1].startswith("| mean ± std |")


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(hidden=0), ValueError, "hidden must be an int >= 1, got 0"),
    (dict(epochs=0), ValueError, "epochs must be an int >= 1, got 0"),
    (dict(orientation="row"), ValueError, "orientation must be 'item' or 'user'"),
    (dict(l2=-1.0), ValueError, "l2 must be non-negative"),
    (dict(alpha=1.0), TypeError, "unknown hyperparameters \\['alpha'\\]"),
])
def test_bad_hyperparameters(kwargs, error, match):
    with pytest.raises(error, match=match):
        AutoRec(**kwargs)


_NO_AUTO = (r"takes 'auto' for none of its hyperparameters \('auto' is for penalties that fit "
            r"sets from the number of training ratings, such as KernelNet's l2, l2_kernel; GLocalK's "
            r"l2, l2_kernel\); "
            r"give {key} a value$")
_ONLY_PENALTIES = (r"KernelNet takes 'auto' only for its penalties l2, l2_kernel, which fit sets "
                   r"from the number of training ratings; give {key} a value$")


def _auto_case(cls, key):
    """(cls, kwargs, error, match) of "auto" given to a hyperparameter that refuses it."""
    if key == "orientation":  # a str hyperparameter: "auto" is a wrong value of it
        return cls, {key: "auto"}, ValueError, r"orientation must be 'item' or 'user', got 'auto'"
    words = _ONLY_PENALTIES if cls.AUTO else cls.__name__ + " " + _NO_AUTO
    return cls, {key: "auto"}, TypeError, f"^{key} cannot be 'auto': " + words.format(key=key)


_REFUSES_AUTO = [_auto_case(cls, key) for cls in (AutoRec, CFN, KernelNet)
                 for key in {**_COMMON, **cls.DEFAULTS} if key not in cls.AUTO]


@pytest.mark.parametrize("as_", [str, np.str_], ids=["str", "np.str_"])
@pytest.mark.parametrize("cls, kwargs, error, match", _REFUSES_AUTO,
                         ids=lambda v: v.__name__ if isinstance(v, type) else
                         str(v) if isinstance(v, dict) else "")
def test_auto_only_where_a_model_sets_it(cls, kwargs, error, match, as_):
    """"auto" is for the penalties a model lists in AUTO (KernelNet's l2, l2_kernel); any
    other hyperparameter refuses it, a numpy str too, naming the key and the ones that
    take it: an "auto" lr or size would reach the Trainer or build() as a str."""
    kwargs = {k: as_(v) for k, v in kwargs.items()}
    with pytest.raises(error, match=match):
        cls(**kwargs)
    model = cls(hidden=4, epochs=1, validation_ratio=0.0)  # an edit after __init__: fit checks
    before = dict(model.hparams)
    model.hparams.update(kwargs)
    with pytest.raises(error, match=match):
        model.fit(synthetic_ratings(0, 20, 15, 120), verbose=False, progress=False)
    assert not model._built  # refused before training: hparams as edited, not normalised
    assert all(model.hparams[k] is v for k, v in {**before, **kwargs}.items())


@pytest.mark.parametrize("kwargs, match", [
    (dict(l2="Auto"), "l2 must be a real number or 'auto', got str 'Auto'"),
    (dict(l2_kernel=" auto"), "l2_kernel must be a real number or 'auto', got str ' auto'"),
    (dict(l2_kernel=None), "l2_kernel must be a real number or 'auto', got NoneType None"),
])
def test_an_auto_penalty_takes_a_number_or_auto(kwargs, match):
    with pytest.raises(TypeError, match=match):
        KernelNet(**kwargs)


def test_auto_penalties_pass_as_str_and_numpy_str():
    model = KernelNet(l2=np.str_("auto"), l2_kernel="auto")
    assert model.hparams["l2"] == model.hparams["l2_kernel"] == "auto"
    assert type(model.hparams["l2"]) is str
    with pytest.raises(TypeError, match=r"^l2 cannot be 'auto': CFN takes 'auto' for none"):
        CFN(l2=np.str_("auto"))


def _subclass(**attrs):
    """An AutoRec subclass with class attributes ``attrs`` (not registered)."""
    return type("Custom", (AutoRec,), {"name": "custom-test", **attrs})


@pytest.mark.parametrize("attrs, error, match", [
    (dict(AUTO=dict(lr=1e-3)), ValueError,
     r"Custom.AUTO may name only Custom's own penalty hyperparameters \(DEFAULTS keys starting "
     r"with 'l2'\), got 'lr'"),
    (dict(AUTO=dict(hidden=500)), ValueError, r"Custom.AUTO may name only .*got 'hidden'"),
    (dict(AUTO=dict(l2_other=1.0)), ValueError, r"Custom.AUTO may name only .*got 'l2_other'"),
    (dict(AUTO=dict(l2=0.0)), ValueError,
     r"Custom.AUTO\['l2'\] must be a positive finite number, got 0.0"),
    (dict(AUTO=dict(l2="auto")), ValueError,
     r"Custom.AUTO\['l2'\] must be a positive finite number, got 'auto'"),
    (dict(AUTO=dict(l2=math.inf)), ValueError,
     r"Custom.AUTO\['l2'\] must be a positive finite number, got inf"),
    (dict(AUTO=["l2"]), TypeError, r"Custom.AUTO must be a dict .*got list"),
    (dict(AUTO=dict(l2=1.0), AUTO_RATINGS=0), ValueError,
     r"Custom.AUTO_RATINGS must be an int >= 1, got 0"),
    (dict(AUTO=dict(l2=1.0), AUTO_EXPONENT=math.nan), ValueError,
     r"Custom.AUTO_EXPONENT must be a finite number, got nan"),
], ids=["lr", "hidden", "not-a-default", "zero", "str", "inf", "list", "ratings", "exponent"])
def test_auto_table_names_penalties_only(attrs, error, match):
    """A subclass whose AUTO names a learning rate or a size (which would reach the Trainer
    as 'auto') is refused by register and at construction; MODELS is left as it was."""
    from nnsparse.models import MODELS, register
    cls = _subclass(**attrs)
    with pytest.raises(error, match=match):
        register(cls)
    assert "custom-test" not in MODELS
    with pytest.raises(error, match=match):
        cls()


def test_a_subclass_auto_penalty_is_set_by_fit():
    cls = _subclass(AUTO=dict(l2=200.0))
    model = cls(l2="auto", hidden=4, epochs=1, validation_ratio=0.0)
    with pytest.raises(TypeError, match=r"^hidden cannot be 'auto': Custom takes 'auto' only "
                                        r"for its penalties l2, which fit"):
        cls(hidden="auto")
    model.fit(synthetic_ratings(0, 20, 15, 120), verbose=False, progress=False)
    assert model.effective_hparams()["l2"] == pytest.approx(200.0 * (120 / 80_000) ** 0.4)


@pytest.mark.parametrize("value, expected", [
    (np.float32(0.5), 0.5), (np.int64(3), 3), (np.bool_(True), True), (np.str_("tanh"), "tanh"),
    ((np.int64(1), 2.0), (1, 2.0)), ([np.float64(0.25)], [0.25]), ({"a": np.int32(1)}, {"a": 1}),
    (None, None), (1 + 2j, 1 + 2j), (np.complex64(1 + 2j), 1 + 2j),
    (torch.float64, torch.float64), (torch.device("cpu"), torch.device("cpu")),
    ("auto", "auto"), (np.str_("auto"), "auto"),
], ids=["float32", "int64", "bool_", "str_", "tuple", "list", "dict", "None", "complex",
        "complex64", "dtype", "device", "auto", "np-auto"])
def test_a_subclass_hyperparameter_is_kept_as_a_plain_value(value, expected):
    """A subclass's own hyperparameters (which no built-in check knows) are normalised as the
    built-in ones: a numpy scalar in a saved file made it unreadable with weights_only."""
    cls = _subclass(DEFAULTS={**AutoRec.DEFAULTS, "act": "sigmoid"})
    got = cls(act=value).hparams["act"]
    assert got == expected and type(got) is type(expected)
    items = (zip(got, expected) if isinstance(expected, (list, tuple))
             else zip(got.values(), expected.values()) if isinstance(expected, dict) else [])
    assert all(type(a) is type(b) for a, b in items)


@pytest.mark.parametrize("value, name", [(torch.nn.Tanh(), "Tanh"), (torch.tensor(1.0), "Tensor"),
                                         ([object()], "object")])
def test_a_subclass_hyperparameter_a_file_cannot_hold_is_refused(value, name):
    cls = _subclass(DEFAULTS={**AutoRec.DEFAULTS, "act": "sigmoid"})
    with pytest.raises(TypeError, match=rf"^hyperparameter act must be None, a bool, a number, a "
                                        rf"str, a torch.dtype or torch.device, or a list, tuple "
                                        rf"or dict of them \(what a model file holds\), got {name}"):
        cls(act=value)


def test_a_subclass_hyperparameter_of_its_own_may_be_auto_and_saved(tmp_path):
    """Only the hyperparameters nnsparse checks refuse "auto": a subclass's own one (an
    init scheme, a dtype) keeps any value weights_only loading reads, through save/load."""
    from nnsparse.models import MODELS, register
    cls = type("OwnAuto", (AutoRec,), {"name": "own-auto-test",
                                       "DEFAULTS": {**AutoRec.DEFAULTS, "init": "auto",
                                                    "dtype": torch.float64, "c": 1 + 2j}})
    register(cls)
    try:
        model = cls(hidden=4, epochs=1, validation_ratio=0.0)
        assert model.hparams["init"] == "auto" and model.hparams["dtype"] is torch.float64
        model.fit(synthetic_ratings(0, 20, 15, 120), verbose=False, progress=False)
        model.save(tmp_path / "m.pt")
        loaded = RatingModel.load(tmp_path / "m.pt")
        assert type(loaded) is cls and loaded.hparams == model.hparams
    finally:
        MODELS.pop("own-auto-test", None)


def test_auto_penalties_follow_the_ratings_fit_was_given(data, tmp_path):
    """KernelNet's "auto" l2 / l2_kernel: set from len(train) as given to fit (not the part
    left once validation is held out), equal to passing those numbers, kept by save/load."""
    train, _ = data
    kw = dict(hidden=8, layers=1, epochs=3, batch_size=16, validation_ratio=0.2)
    auto = KernelNet(**kw)
    assert auto.effective_hparams()["l2"] == "auto"
    auto.fit(train, verbose=False, progress=False)
    grow = (len(train) / 80_000) ** 0.4
    eff = auto.effective_hparams()
    assert eff["l2"] == pytest.approx(20.0 * grow) and eff["l2_kernel"] == pytest.approx(0.006 * grow)
    assert auto.hparams["l2"] == "auto"  # the setting stays; only its value is derived
    fixed = KernelNet(**kw, l2=eff["l2"], l2_kernel=eff["l2_kernel"]).fit(
        train, verbose=False, progress=False)
    for a, b in zip(auto.state_dict().values(), fixed.state_dict().values()):
        assert torch.equal(a, b)
    # a penalty 10x larger trains other weights: the value really is the one used
    other = KernelNet(**kw, l2=10 * eff["l2"], l2_kernel=eff["l2_kernel"]).fit(
        train, verbose=False, progress=False)
    assert not torch.equal(other.state_dict()["kernels.0.weight"],
                           auto.state_dict()["kernels.0.weight"])
    path = tmp_path / "k.pt"
    auto.save(path)
    assert KernelNet.load(path).effective_hparams() == eff
    blob = torch.load(path, weights_only=True)
    del blob["penalty_ratings"]  # a file written before the count was saved
    torch.save(blob, path)
    assert KernelNet.load(path).effective_hparams()["l2"] == pytest.approx(20.0 * grow)
    blob["penalty_ratings"] = 0
    torch.save(blob, path)
    with pytest.raises(ValueError, match="penalty_ratings must be an int >= 1, got 0"):
        KernelNet.load(path)


def test_auto_penalties_count_a_validation_set_passed_to_fit(data):
    """fit(train) holding out validation_ratio and fit(part, validation) of the same split
    train the same model: "auto" counts the validation ratings given either way (the
    refit trains on them), as fixed penalties give equal weights on both paths."""
    train, _ = data
    kw = dict(hidden=8, layers=1, epochs=2, batch_size=16, validation_ratio=0.2)
    whole = KernelNet(**kw).fit(train, verbose=False, progress=False)
    part, validation = split_ratings(train, 0.2, seed=0)  # the split fit draws (seed 0)
    apart = KernelNet(**kw).fit(part, validation, verbose=False, progress=False)
    assert apart.effective_hparams() == whole.effective_hparams()
    assert apart.penalty_ratings == len(train)
    for a, b in zip(whole.state_dict().values(), apart.state_dict().values()):
        assert torch.equal(a, b)


def test_a_numpy_str_auto_is_saved_as_a_str(tmp_path):
    """np.str_("auto") (read from a numpy array of settings) is kept as the plain str: a
    numpy str in the saved hparams made the file unreadable with weights_only=True."""
    r = synthetic_ratings(0, 60, 50, 1200)
    model = KernelNet(hidden=4, layers=1, epochs=1, validation_ratio=0.0, l2=np.str_("auto"))
    assert type(model.hparams["l2"]) is str
    model.hparams["l2_kernel"] = np.str_("auto")  # edited after construction: fit checks again
    model.fit(r, verbose=False, progress=False)
    assert type(model.hparams["l2_kernel"]) is str
    model.save(tmp_path / "k.pt")
    assert KernelNet.load(tmp_path / "k.pt").effective_hparams() == model.effective_hparams()
    # a copy (the best model's snapshot) and a pickle keep the count the values come from
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin.effective_hparams() == model.effective_hparams()
        assert float(twin.penalty().detach()) == pytest.approx(float(model.penalty().detach()))


def test_features_need_cfn(data):
    train, _ = data
    with pytest.raises(ValueError, match="reads no side features"):
        AutoRec(**TINY).fit(train, features=torch.zeros(train.n_items, 3), verbose=False)
    with pytest.raises(ValueError, match="features must have 150 rows"):
        CFN(**TINY).fit(train, features=torch.zeros(5, 3), verbose=False)


@pytest.mark.parametrize("model, expected", [
    (AutoRec(), "AutoRec(hidden=500, l2=200.0)"),
    # the training settings given appear after the model's own (they were left out)
    (AutoRec(hidden=8, epochs=2, lr=1e-2, batch_size=32),
     "AutoRec(hidden=8, l2=200.0, epochs=2, batch_size=32, lr=0.01)"),
    (AutoRec(hidden=8, epochs=100), "AutoRec(hidden=8, l2=200.0)"),  # a default, not shown
    # CFN's lr is its own default (3e-4), shown with its own
    (CFN(hidden=4, refit=False), "CFN(lr=0.0003, hidden=4, l2=200.0, alpha=1.0, beta=0.5, "
                                 "hide_ratio=0.25, refit=False)"),
    (KernelNet(orientation="user", seed=3),
     "KernelNet(batch_size=256, hidden=500, layers=2, dim=5, l2='auto', l2_kernel='auto', "
     "orientation='user', seed=3)"),
], ids=["autorec-default", "autorec-trained", "autorec-default-epochs", "cfn", "kernelnet"])
def test_repr_shows_the_training_settings_given(model, expected):
    assert repr(model) == expected


def _half_built():
    class Half(AutoRec):
        def __init__(self):  # a subclass's __init__ that has not reached RatingModel's
            torch.nn.Module.__init__(self)
    return Half()


def _edited(key, value):
    model = AutoRec(hidden=4)
    model.hparams[key] = value  # hparams is a public dict: fit and save check it again
    return model


def _hparams(value):
    model = AutoRec(hidden=4)
    model.hparams = value
    return model


@pytest.mark.parametrize("make, expected", [
    # an int past Python's 4,300-digit repr limit (seed takes any int): repr raised ValueError
    (lambda: AutoRec(hidden=4, seed=10 ** 5000), "AutoRec(hidden=4, l2=200.0, seed=<int>)"),
    # != of an array is no bool: repr raised RuntimeError / ValueError
    (lambda: _edited("lr", torch.tensor([1e-3, 2e-3])),
     "AutoRec(hidden=4, l2=200.0, lr=tensor([0.0010, 0.0020]))"),
    (lambda: _edited("lr", np.array([1e-3, 2e-3])),
     "AutoRec(hidden=4, l2=200.0, lr=array([0.001, 0.002]))"),
    (lambda: _edited("hidden", list(range(1000))),
     "AutoRec(hidden=[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, "
     "21..., l2=200.0)"),
    (_half_built, "Half()"), (lambda: _hparams(None), "AutoRec()"),
], ids=["huge-seed", "tensor-lr", "array-lr", "long-list", "half-built", "hparams-none"])
def test_repr_never_raises(make, expected):
    assert repr(make()) == expected


def test_trainer_lr_schedule():
    t = Trainer(torch.nn.Linear(1, 1), epochs=5, batch_size=1, lr=1.0, min_lr_ratio=0.1)
    rates = [t._lr_at(e) for e in range(1, 6)]
    assert rates[0] == pytest.approx(1.0) and rates[-1] == pytest.approx(0.1)
    assert rates == sorted(rates, reverse=True)


def test_a_diverged_validation_epoch_is_never_the_best():
    class NoTraining(Trainer):
        def run_epoch(self, loader, optimizer, epoch):
            return 0.0

    t = NoTraining(torch.nn.Linear(1, 1), epochs=4, batch_size=1, lr=0.1, log=None)
    rmses = iter([float("nan"), 1.0, 0.5, float("nan")])
    result = t.fit(torch.eye(2).to_sparse_csr(), validate=lambda: next(rmses))
    assert (result.best_epoch, result.best_rmse) == (3, 0.5)


class _DivergesAt(Trainer):
    """A trainer whose epoch losses are given (no training), so divergence is scripted."""

    def __init__(self, losses, **kw):
        super().__init__(torch.nn.Linear(1, 1), batch_size=1, lr=0.1, log=None, **kw)
        self.losses = iter(losses)

    def run_epoch(self, loader, optimizer, epoch):
        return next(self.losses)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_diverged_epoch_stops_training_and_keeps_the_best_validated(bad):
    t = _DivergesAt([1.0, 0.8, bad, 0.5, 0.4], epochs=5)
    rmses = iter([1.0, 0.9, 0.8, 0.7])
    result = t.fit(torch.eye(2).to_sparse_csr(), validate=lambda: next(rmses))
    assert [e["epoch"] for e in result.history] == [1, 2, 3]  # stopped at the diverged one
    assert math.isnan(result.history[-1]["train_loss"]) or math.isinf(
        result.history[-1]["train_loss"])
    assert "valid_rmse" not in result.history[-1]  # its weights are not validated
    assert (result.best_epoch, result.best_rmse) == (2, 0.9)


@pytest.mark.parametrize("validate", [None, "first"])
def test_a_diverged_epoch_with_nothing_to_keep_raises(validate):
    t = _DivergesAt([float("nan"), 0.5], epochs=2)
    with pytest.raises(FloatingPointError,
                       match=r"training diverged: the mean training loss of epoch 1 is nan, "
                             r"and no earlier epoch was validated .*learning rate was 0\.1"):
        t.fit(torch.eye(2).to_sparse_csr(),
              validate=None if validate is None else (lambda: 1.0))


def test_a_model_trained_with_a_huge_lr_says_it_diverged(data):
    """End to end: a real model whose Adam steps blow its outputs past float32."""
    train, _ = data
    model = AutoRec(hidden=8, epochs=3, batch_size=32, lr=1e30, validation_ratio=0.0)
    with pytest.raises(FloatingPointError, match="training diverged"):
        model.fit(train, verbose=False, progress=False)


_HUGE_LR = synthetic_ratings(0, n_users=50, n_items=40, n_ratings=600)
# every model that trains with a Trainer, one epoch at lr=1e30 and no validation: the epoch's
# loss is read before its one step (40 rows, one batch), so only the end-of-run check can see
# the step's result.  KernelNet's and GLocalK's weights stay finite (about 1e29) but their
# kernel 1 - |u|^2 - |v|^2 + 2 u.v is inf - inf = NaN; AutoRec's and CFN's outputs overflow
HUGE_LR_CASES = [
    (AutoRec, {}, "inf", False), (CFN, {}, "inf", False), (KernelNet, {}, "nan", True),
    (GLocalK, dict(global_epochs=1), "nan", True),
]


@pytest.mark.parametrize("cls, extra, loss, finite_weights", HUGE_LR_CASES,
                         ids=[c[0].__name__ for c in HUGE_LR_CASES])
def test_one_unvalidated_epoch_with_a_huge_lr_raises_naming_the_epoch(cls, extra, loss,
                                                                      finite_weights):
    model = cls(epochs=1, lr=1e30, validation_ratio=0, batch_size=64, hidden=8, **extra)
    with pytest.raises(FloatingPointError, match=(
            rf"^training diverged: the weights after epoch 1 give a training loss of {loss} "
            rf"on the first 40 rows \(the last step's weights, which no epoch's loss reads\); "
            rf"the learning rate was 1e\+30 in epoch 1; a smaller lr, or finite data and "
            rf"penalties, avoid it$")):
        model.fit(_HUGE_LR, verbose=False, progress=False)
    if finite_weights:  # (the weights check alone passed them: NaN predictions, silently)
        assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    with pytest.raises(RuntimeError, match=r"is not fitted \(its last fit\(\) raised "
                                           r"FloatingPointError\)"):
        model.predict_entries(_HUGE_LR.user[:3], _HUGE_LR.item[:3])


def test_glocalk_fine_tuning_with_a_huge_lr_names_its_epoch_and_lr():
    # the stage-2 run (global_lr) of one epoch: its end check, with that stage's lr
    model = GLocalK(epochs=1, global_epochs=1, global_lr=1e30, validation_ratio=0,
                    batch_size=64, hidden=8)
    with pytest.raises(FloatingPointError, match=r"^training diverged: the weights after epoch "
                                                 r"1 .*; the learning rate was 1e\+30 in epoch 1; "
                                                 r"a smaller lr"):
        model.fit(_HUGE_LR, verbose=False, progress=False)
    assert bool(model.finetuned)  # (raised in stage 2, not in the pre-training)


@pytest.mark.parametrize("cls, extra", [(AutoRec, {}), (CFN, dict(hide_ratio=0.25)),
                                        (KernelNet, {}), (GLocalK, dict(global_epochs=1))],
                         ids=lambda v: getattr(v, "__name__", ""))
def test_the_end_check_loss_changes_nothing(cls, extra):
    """The end-of-run loss (RatingModel._plain_loss) draws no random number, keeps no mask
    and builds no graph; without corruption it is batch_loss's value."""
    model = cls(epochs=1, validation_ratio=0, batch_size=64, hidden=8, **extra).fit(
        _HUGE_LR, verbose=False, progress=False)
    dataset = SparseRowDataset(model._input)
    batch = dataset.collate([dataset[i] for i in range(10)])
    criterion = model._criterion
    generator = getattr(criterion, "generator", None)
    state = None if generator is None else generator.get_state()
    mask = getattr(criterion, "_mask", None)
    loss = model._plain_loss(batch.row_index, batch.input)
    assert loss.dim() == 0 and not loss.requires_grad and bool(torch.isfinite(loss))
    assert getattr(criterion, "_mask", None) is mask
    if generator is not None:
        assert torch.equal(generator.get_state(), state)
    if cls is not CFN:  # (no corruption: the training loss itself)
        torch.testing.assert_close(loss, model.batch_loss(batch.row_index, batch.input).detach())


class _NoisyAutoRec(AutoRec):
    """A user's subclass whose network draws random numbers and keeps running statistics in
    train mode (dropout, batch norm on the hidden layer)."""

    def build(self, rows, width, features):
        super().build(rows, width, features)
        self.drop = torch.nn.Dropout(0.5)
        self.norm = torch.nn.BatchNorm1d(self.hparams["hidden"])

    def network(self, x, rows, pattern=None):
        return self.decoder(self.drop(self.norm(torch.sigmoid(self.encoder(x)))), pattern)


def test_the_end_check_loss_runs_in_eval_mode_and_puts_the_modes_back():
    """_plain_loss runs the network as predict does (eval mode): a subclass's dropout draws
    no random number and its batch norm's running statistics stay; each mode is put back."""
    model = _NoisyAutoRec(epochs=1, validation_ratio=0, batch_size=64, hidden=8).fit(
        _HUGE_LR, verbose=False, progress=False)
    dataset = SparseRowDataset(model._input)
    batch = dataset.collate([dataset[i] for i in range(10)])
    model.train()
    model.encoder.eval()  # a mode of one's own, put back as it was
    stats = {k: v.clone() for k, v in model.norm.state_dict().items()}
    state = torch.get_rng_state()
    loss = model._plain_loss(batch.row_index, batch.input)
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(v, stats[k]) for k, v in model.norm.state_dict().items())
    assert model.training and model.drop.training and not model.encoder.training
    model.eval()
    torch.testing.assert_close(loss, model.batch_loss(batch.row_index, batch.input).detach())


def test_a_trainer_of_ones_own_module_checks_weights_only():
    """A module without RatingModel's _plain_loss: the end check reads its weights alone."""
    class Module(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def batch_loss(self, rows, x):
            return (self.w ** 2).sum()

    result = Trainer(Module(), epochs=1, batch_size=2, lr=1e-3, log=None, progress=False).fit(
        torch.eye(3).to_sparse_csr())
    assert result.best_epoch == 1


def _kernelised_reference(weight, u, v):
    kernel = torch.clamp(1 - ((v[:, None] - u[None]) ** 2).sum(-1), min=0)
    return weight * kernel, kernel, weight.square().sum(), kernel.square().sum()


@pytest.mark.parametrize("outputs", [(0, 1, 2, 3), (0,), (1,), (2,), (3,), (0, 3), (1, 2)])
def test_kernelised_weight_matches_the_composed_operators(outputs):
    """KernelNet's fused (W * K, K, sum W^2, sum K^2): values, gradients (any subset of the
    outputs used, the others' gradients None) and second derivatives, in float64, with
    part of the kernel clamped to 0."""
    from nnsparse.models.kernel import _Kernelised
    torch.manual_seed(0)
    weight = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    u = (torch.randn(7, 3, dtype=torch.float64) * 0.4).requires_grad_()
    v = (torch.randn(5, 3, dtype=torch.float64) * 0.4).requires_grad_()
    fused = _Kernelised.apply(weight, u, v)
    ref = _kernelised_reference(weight, u, v)
    assert 0.1 < float((ref[1] == 0).double().mean()) < 0.9  # both sides of the clamp
    for a, b in zip(fused, ref):
        torch.testing.assert_close(a, b)
    picked = lambda w, a, b: tuple(_Kernelised.apply(w, a, b)[i] for i in outputs)  # noqa: E731
    assert torch.autograd.gradcheck(picked, (weight, u, v))
    assert torch.autograd.gradgradcheck(picked, (weight, u, v))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_kernel_penalty_sums_do_not_overflow_half_precision(dtype):
    from nnsparse.models.kernel import _square_sum
    total = _square_sum(torch.ones(2000, 2000, dtype=dtype))  # 4e6 > float16's 65504
    assert total.dtype == torch.float32 and float(total) == 4e6
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert float(_square_sum(torch.full((3, 3), 1.5))) == 9 * 2.25
    assert _square_sum(torch.ones(3, 3, device="meta")).shape == ()  # no autocast there


def test_kernelnet_penalty_is_of_the_current_weights():
    """The penalty reuses a training forward's kernelised parts once: never after the
    weights changed, nor after a forward without grad."""
    r = synthetic_ratings(0, 60, 50, 1200)
    model = KernelNet(hidden=4, layers=1, epochs=1, validation_ratio=0.0)
    model.fit(r, verbose=False, progress=False)
    h = model.effective_hparams()
    fresh = lambda: float(sum(h["l2"] * p.weight_sq + h["l2_kernel"] * p.kernel_sq  # noqa: E731
                              for p in (k.weighted() for k in model.kernels)))
    x, rows = model._input, torch.arange(model._input.shape[0])
    model.train()
    model(x, rows, x)  # a forward with grad leaves its parts...
    with torch.no_grad():
        for k in model.kernels:
            k.weight.mul_(2.0)  # ...then the weights change...
        model(x, rows, x)  # ...and a forward without grad drops them
    assert float(model.penalty()) == pytest.approx(fresh())


def test_kernelised_weight_honours_needs_input_grad():
    from nnsparse.models.kernel import _Kernelised
    weight = torch.randn(3, 4, requires_grad=True)
    u, v = torch.randn(4, 2) * 0.3, (torch.randn(3, 2) * 0.3).requires_grad_()
    out, kernel, w_sq, k_sq = _Kernelised.apply(weight, u, v)
    (out.sum() + k_sq).backward()
    assert u.grad is None and weight.grad is not None and v.grad is not None
    expected = _kernelised_reference(weight, u, v)
    torch.testing.assert_close(weight.grad, expected[1].detach())


def _reference_pretraining_graph(model, r):
    """GLocal-K's pre-training graph (its notebook, ``kernel_layer`` and ``loss_p``),
    transcribed densely: ``W`` (in, out), ``u`` (in, 1, d), ``v`` (1, out, d),
    ``tf.nn.l2_loss`` halves on the error and on both ``l2_regularizer`` terms.
    ``r`` is the dense (items, users) training matrix, 0 where missing."""
    h = model.effective_hparams()
    y, reg, last = r, 0.0, len(model.kernels) - 1
    for i, layer in enumerate(model.kernels):
        w, b = layer.weight.t(), layer.bias
        u, v = layer.u[:, None, :], layer.v[None, :, :]
        w_hat = torch.clamp(1.0 - torch.linalg.norm(u - v, ord=2, dim=2) ** 2, min=0.0)
        reg = reg + h["l2_kernel"] * (w_hat ** 2).sum() / 2 + h["l2"] * (w ** 2).sum() / 2
        y = y @ (w * w_hat) + b
        y = torch.sigmoid(y) if i < last else y
    mask = (r > 0).to(r.dtype)
    return ((mask * (r - y)) ** 2).sum() / 2 + reg, y


def test_kernelnet_is_the_reference_pretraining_network():
    """KernelNet's objective over every row is the reference's ``loss_p`` times the constant
    2 / per_batch, and its predictions are the reference's, at the same parameters (float64;
    items as rows, raw stars in, 0 for missing)."""
    train = synthetic_ratings(0, 30, 24, 300)
    model = KernelNet(hidden=6, layers=2, dim=3, l2=2.0, l2_kernel=0.05, seed=3)
    x = model._prepare(train, train.scale, None)
    model.double()
    with torch.no_grad():  # a kernel with both sides of the clamp, a bias per unit
        for layer in model.kernels:
            layer.u.normal_(0, 0.4), layer.v.normal_(0, 0.4), layer.bias.normal_(0, 0.1)
    x = x.to(torch.float64)
    r = torch.zeros(x.shape, dtype=torch.float64)  # the reference's train_r: rows are items
    r[train.item, train.user] = train.rating.to(torch.float64)
    assert x.shape == (train.n_items, train.n_users) and r.count_nonzero() == len(train)
    loss_ref, pred_ref = _reference_pretraining_graph(model, r)
    kernel = model.kernels[0].weighted().kernel
    assert 0.05 < float((kernel == 0).double().mean()) < 0.95
    rows = torch.arange(x.shape[0])
    model.train()
    ours = model.batch_loss(rows, x) * model._per_batch / 2
    torch.testing.assert_close(ours, loss_ref, rtol=1e-12, atol=0)
    model.eval()
    with torch.no_grad():
        pred = model._to_model(model(x, rows))  # dense (items, users), stars
    torch.testing.assert_close(pred, pred_ref.detach(), rtol=1e-12, atol=1e-12)


def test_batchifier_topk_candidates():
    net = torch.nn.Sequential(torch.nn.Identity())
    data = torch.tensor([[5., 1., 3., 4.], [1., 2., 3., 0.]])
    run = Batchifier(net, output_size=4, progress=False)
    best = run.topk(data, 2, candidates=torch.tensor([False, True, True, True]))
    assert best.indices.tolist() == [[3, 2], [2, 1]]
    assert run.topk(data, 1).indices.tolist() == [[0], [2]]  # default unchanged
    with pytest.raises(ValueError, match="candidates must have shape \\(4,\\)"):
        run.topk(data, 1, candidates=torch.tensor([True]))
    with pytest.raises(TypeError, match="candidates must be a bool tensor"):
        run.topk(data, 1, candidates=torch.ones(4))


def test_dense_decoder_trains_the_same(data):
    train, test = data
    sparse = _fit(AutoRec, {}, train, epochs=2)
    dense = _fit(AutoRec, dict(dense_decoder=True), train, epochs=2)
    assert [h["train_loss"] for h in dense.history] == pytest.approx(
        [h["train_loss"] for h in sparse.history], rel=1e-4)
    assert torch.allclose(dense.predict(test), sparse.predict(test), atol=1e-3)


def test_weight_decay_spares_the_biases(data):
    train, _ = data
    model = _fit(AutoRec, dict(weight_decay=0.5), train, epochs=1)
    optimizer = model._trainer(torch.device("cpu"), False).make_optimizer()
    decays = {tuple(p.shape): g["weight_decay"] for g in optimizer.param_groups
              for p in g["params"]}
    assert decays[(16, train.n_users)] == 0.5 and decays[(train.n_users,)] == 0.0
    assert decays[(16,)] == 0.0


def test_weight_decay_of_kernelnet_covers_its_kernel_embeddings(data):
    """KernelNet's weight_decay (0 by default) decays every parameter of 2+ dimensions:
    each kernel layer's weight and its embeddings u and v, not its bias (docs/models.md
    says so; the reference code penalises W and the kernel values, not u, v directly)."""
    train, _ = data
    model = _fit(KernelNet, dict(weight_decay=0.5), train, epochs=1)
    optimizer = model._trainer(torch.device("cpu"), False).make_optimizer()
    decays = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    names = dict(model.named_parameters())
    assert {n.split(".")[-1] for n in names} == {"weight", "u", "v", "bias"}
    for name, p in names.items():
        assert decays[id(p)] == (0.0 if name.endswith("bias") else 0.5), name


SMALL = dict(hidden=4, epochs=2, batch_size=8, validation_ratio=0.0)


def _twice():
    # user 2 rates item 20 twice
    return Ratings.from_triples([1, 2, 2, 3, 4, 5, 6], [10, 20, 20, 30, 10, 20, 30],
                                [1.0, 2.0, 3.0, 4.0, 5.0, 2.0, 4.0])


def _fit_twice(model):
    return model.fit(_twice(), verbose=False, progress=False)


def _fit_overlapping_validation(model):
    r = Ratings.from_triples([1, 2, 3, 4, 5, 6], [10, 20, 30, 10, 20, 30],
                             [1.0, 2.0, 3.0, 4.0, 5.0, 2.0])
    model.fit(r, validation=r.subset([2]), verbose=False, progress=False)


@pytest.mark.parametrize("call, message", [
    (_fit_twice, "train: 1 (user, item) pair rated more than once, e.g. user 2 and item 20 "
                 "(2 ratings)"),
    (_fit_overlapping_validation, "train and validation together: 1 (user, item) pair rated "
                                  "more than once, e.g. user 3 and item 30 (2 ratings)"),
], ids=["in-train", "train-and-validation"])
@pytest.mark.parametrize("validation_ratio", [0.0, 0.3])
def test_fit_refuses_a_pair_rated_twice_before_training(call, message, validation_ratio):
    fresh = AutoRec(**{**SMALL, "validation_ratio": validation_ratio, "seed": 3})
    with pytest.raises(ValueError, match=re.escape(message)):
        call(fresh)
    assert not fresh._built and fresh.history == [] and fresh.normalizer is None
    fitted = AutoRec(**SMALL).fit(synthetic_ratings(0, 20, 15, 120), verbose=False,
                                  progress=False)
    state = {k: v.clone() for k, v in fitted.state_dict().items()}
    history, train = list(fitted.history), fitted._train
    with pytest.raises(ValueError, match=re.escape(message)):
        call(fitted)
    assert fitted.history == history and fitted._train is train
    assert all(torch.equal(state[k], v) for k, v in fitted.state_dict().items())


def _count_pair_checks(monkeypatch):
    """Count the sorts of (user, item) keys that _check_unique_pairs does."""
    from nnsparse.data import readers
    calls = []
    original = readers._sorted_pair_keys

    def counting(*parts):
        calls.append(sum(len(p) for p in parts))
        return original(*parts)
    monkeypatch.setattr(readers, "_sorted_pair_keys", counting)
    return calls


@pytest.mark.parametrize("how", ["no-validation", "drawn-validation", "given-validation"])
def test_fit_checks_the_pairs_once(monkeypatch, how):
    # fit checks the pairs; the normaliser, the training matrix and the refit's matrix
    # reuse that knowledge instead of sorting the keys again
    r = synthetic_ratings(0, 20, 15, 120)
    kw = dict(validation=None)
    if how == "given-validation":
        r, kw["validation"] = split_ratings(r, 0.3, seed=1)
    calls = _count_pair_checks(monkeypatch)
    model = AutoRec(**{**SMALL, "validation_ratio": 0.3 if how == "drawn-validation" else 0.0,
                       "refit": True})
    model.fit(r, verbose=False, progress=False, **kw)
    assert model._built
    total = len(r) + (len(kw["validation"]) if kw["validation"] is not None else 0)
    assert calls == [total]


@pytest.mark.parametrize("validation_ratio", [0.0, 0.3])
def test_fit_checks_again_a_record_edited_in_place(monkeypatch, validation_ratio):
    # a record checked once is checked again after its indices change in place (the
    # knowledge follows the tensors' versions), so a pair made twice is still refused
    r = Ratings.from_triples([1, 2, 3, 4, 5, 6], [10, 20, 30, 10, 20, 30],
                             [1.0, 2.0, 3.0, 4.0, 5.0, 2.0])
    calls = _count_pair_checks(monkeypatch)
    AutoRec(**SMALL).fit(r, verbose=False, progress=False)
    r.item[2] = 1  # user 3 now rates item 20 ...
    r.user[2] = 1  # ... as user 2 does
    with pytest.raises(ValueError, match=re.escape(
            "train: 1 (user, item) pair rated more than once, e.g. user 2 and item 20")):
        AutoRec(**{**SMALL, "validation_ratio": validation_ratio}).fit(
            r, verbose=False, progress=False)
    assert calls == [6, 6]


def test_fit_refuses_a_subset_that_repeats_an_entry():
    # an integer subset may take one entry twice: it is not known unique as a mask subset is
    r = synthetic_ratings(0, 20, 15, 120)
    AutoRec(**SMALL).fit(r, verbose=False, progress=False)  # r is now known unique
    twice = r.subset(torch.tensor([0, 1, 0]))
    with pytest.raises(ValueError, match=r"train from synthetic_ratings\(seed=0\): 1 \(user, item\) pair "
                                         r"rated more than once"):
        AutoRec(**SMALL).fit(twice, verbose=False, progress=False)
    assert r.subset(torch.arange(len(r)) % 2 == 0)._known_unique()
    assert not twice._known_unique()


class EntryTuple(tuple):
    """A tuple of a vowel-named type (the message's article follows the name)."""


@pytest.mark.parametrize("call, error, message", [
    (lambda r: kfold(r, k="3"), TypeError, "k must be an int >= 2, got '3'"),
    (lambda r: kfold(r, k=3.0), TypeError, "k must be an int >= 2, got 3.0"),
    (lambda r: kfold(r, k=1), ValueError, "k must be an int >= 2, got 1"),
    (lambda r: cross_validate(lambda: AutoRec(**SMALL), [r]), TypeError,
     "folds must yield (train, test) pairs, got Ratings at fold 1"),
    (lambda r: cross_validate(lambda: AutoRec(**SMALL), [(r, r, r)]), ValueError,
     "folds must yield (train, test) pairs, got a tuple of 3 at fold 1"),
    (lambda r: cross_validate(lambda: AutoRec(**SMALL), [EntryTuple((r,))]), ValueError,
     "folds must yield (train, test) pairs, got an EntryTuple of 1 at fold 1"),
    (lambda r: AutoRec(**SMALL).fit(r, verbose=False, progress=False).recommend(
        0, k=2.0, by_index=True), TypeError, "k must be a non-negative int, got 2.0"),
    (lambda r: AutoRec(**SMALL).fit(r, verbose=False, progress=False).recommend(
        0, k=-1, by_index=True), ValueError, "k must be a non-negative int, got -1"),
    (lambda r: AutoRec(**SMALL).fit(r, verbose=False, progress=False).recommend(
        0, min_support=1.0, by_index=True), TypeError, "min_support must be a non-negative int, got 1.0"),
    (lambda r: AutoRec(**SMALL).fit(r, verbose=False, progress=False).recommend(
        0, k=2 ** 63, by_index=True), ValueError,
     "k must be a non-negative int within int64 (below 2**63), got 9223372036854775808"),
    (lambda r: kfold(r, k=2 ** 64), ValueError,
     "k must be an int >= 2 within int64 (below 2**63), got 18446744073709551616"),
], ids=["kfold-k-str", "kfold-k-float", "kfold-k-1", "folds-not-a-pair", "folds-triple",
        "folds-single",
        "recommend-k-float", "recommend-k-negative", "recommend-min_support-float",
        "recommend-k-beyond-int64", "kfold-k-beyond-int64"])
def test_count_and_pair_arguments(call, error, message):
    # another kind is a TypeError; the right kind with a wrong value or length a ValueError
    with pytest.raises(error, match="^" + re.escape(message) + "$"):
        call(synthetic_ratings(0, 20, 15, 120))


def test_kfold_refuses_a_pair_rated_twice():
    with pytest.raises(ValueError, match=r"ratings: 1 \(user, item\) pair rated more than once, "
                                         r"e\.g\. user 2 and item 20 \(2 ratings\)"):
        kfold(_twice(), k=2)


def test_user_index_follows_a_second_fit():
    a = Ratings.from_triples([100, 200, 200, 300], [1, 1, 2, 2], [1., 5., 3., 4.])
    b = Ratings.from_triples([5, 100, 100, 200], [1, 1, 2, 2], [2., 5., 3., 1.])
    model = AutoRec(**SMALL).fit(a, verbose=False, progress=False)
    assert model.user_index(200) == 1
    model.fit(b, verbose=False, progress=False)
    assert [model.user_index(u) for u in (5, 100, 200)] == [0, 1, 2]
    rated = model.recommend(200, 5, min_support=0, exclude_rated=False).ids
    unrated = model.recommend(200, 5, min_support=0).ids  # user 200 rated item 2 in b
    assert sorted(rated) == [1, 2] and unrated == [1]
    with pytest.raises(KeyError, match="user 300 is not in the training data"):
        model.user_index(300)


@pytest.mark.parametrize("cls", [AutoRec, CFN, KernelNet])
@pytest.mark.parametrize("seed", [2**64, 2**70 + 3, np.int64(7)])
def test_any_int_is_a_model_seed(tmp_path, cls, seed):
    r = synthetic_ratings(0, 20, 15, 120)
    hp = {**SMALL, "validation_ratio": 0.2}
    model = cls(**hp, seed=seed).fit(r, verbose=False, progress=False)
    again = cls(**hp, seed=int(seed)).fit(r, verbose=False, progress=False)
    assert type(model.hparams["seed"]) is int
    assert torch.equal(model.predict(r), again.predict(r))
    model.save(tmp_path / "m.pt")  # a plain int: weights_only loading reads it
    assert RatingModel.load(tmp_path / "m.pt").hparams["seed"] == int(seed)


def test_kfold_takes_any_int_seed():
    r = synthetic_ratings(0, 20, 15, 120)
    folds = [len(test) for _, test in kfold(r, k=3, seed=2**64)]
    assert folds == [40, 40, 40]
    first = lambda seed: next(kfold(r, k=3, seed=seed))[1].user.tolist()  # noqa: E731
    assert first(2**64) != first(0) and first(np.int64(4)) == first(4)


class _NoTraining(Trainer):
    def run_epoch(self, loader, optimizer, epoch):
        return 0.0


def _trainer(**kw):
    return Trainer(AutoRec(**SMALL), **{**dict(epochs=1, batch_size=2, lr=1e-3, log=None,
                                               progress=False), **kw})


@pytest.mark.parametrize("call, error, match", [
    (lambda: _trainer().fit(torch.zeros(0, 4).to_sparse_csr()), ValueError,
     r"x_train must have at least one row to train on, got shape \(0, 4\)"),
    (lambda: _NoTraining(torch.nn.Linear(1, 1), epochs=1, batch_size=1, lr=0.1, log=None,
                         progress=False).fit(torch.eye(2).to_sparse_csr(), validate=lambda: "x"),
     TypeError, r"validate must return a number \(the validation RMSE\), got str 'x'"),
    (lambda: _trainer(epochs=np.float64(1)), TypeError, r"epochs must be an int >= 1"),
    (lambda: _trainer(seed="1"), TypeError, r"seed must be an int, got str"),
    (lambda: _trainer().fit(torch.eye(2).to_sparse_csr(), epochs=1.0), TypeError,
     r"^epochs must be None or an int >= 1, got 1.0$"),
    (lambda: _trainer().fit(torch.eye(2).to_sparse_csr(), epochs=0), ValueError,
     r"^epochs must be None or an int >= 1, got 0$"),
], ids=["no-rows", "validate-str", "epochs-float", "seed-str", "fit-epochs-float",
        "fit-epochs-0"])
def test_trainer_bad_inputs(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("rmse", [0.5, np.float32(0.5), torch.tensor(0.5), torch.tensor([0.5])])
def test_trainer_validate_may_return_any_real_number(rmse):
    t = _NoTraining(torch.nn.Linear(1, 1), epochs=2, batch_size=1, lr=0.1, log=None)
    result = t.fit(torch.eye(2).to_sparse_csr(), validate=lambda: rmse)
    assert (result.best_epoch, result.best_rmse) == (1, 0.5)


def test_trainer_takes_numpy_ints_as_the_models_do():
    t = _trainer(epochs=np.int64(3), batch_size=np.int32(2), patience=np.int64(0),
                 seed=np.int64(2**62))
    assert (t.epochs, t.batch_size, t.patience, t.seed) == (3, 2, 0, 2**62)
    assert all(type(v) is int for v in (t.epochs, t.batch_size, t.patience, t.seed))
    t = _NoTraining(torch.nn.Linear(1, 1), epochs=np.int64(3), batch_size=1, lr=0.1, log=None,
                    seed=2**64)
    assert len(t.fit(torch.eye(2).to_sparse_csr(), epochs=np.int64(2)).history) == 2


# -- save() checks hparams edited since fit; load() refuses files that would load wrong ------
_TINY_R = synthetic_ratings(0, 20, 15, 120)  # 20 users x 15 items: not square


def _tiny(cls=AutoRec, r=_TINY_R, **kw):
    torch.manual_seed(0)
    hp = {**dict(hidden=4, epochs=1, batch_size=8, validation_ratio=0.0), **kw}
    return cls(**hp).fit(r, verbose=False, progress=False)


_FITTED_TINY = {}


def _fitted_copy(cls):
    """A fitted tiny model of ``cls``, a fresh copy each time (the cases edit its hparams)."""
    if cls not in _FITTED_TINY:
        _FITTED_TINY[cls] = _tiny(cls, layers=1) if cls is KernelNet else _tiny(cls)
    return copy.deepcopy(_FITTED_TINY[cls])


def _delete(key):
    return lambda h: h.pop(key)


_SHAPES = r"hparams no longer describe the fitted network: they build "
_BACK = r"; set them back, or fit again, before saving \(the file would not load\)$"
_BAD_EDITS = [
    (AutoRec, dict(lr="auto"), TypeError, r"^lr cannot be 'auto': AutoRec takes 'auto' for none"),
    (AutoRec, dict(lr=np.str_("auto")), TypeError, r"^lr cannot be 'auto'"),
    (KernelNet, dict(lr="auto"), TypeError,
     r"^lr cannot be 'auto': KernelNet takes 'auto' only for its penalties l2, l2_kernel"),
    (KernelNet, dict(epochs="auto"), TypeError, r"^epochs cannot be 'auto'"),
    (CFN, dict(hide_ratio="auto"), TypeError, r"^hide_ratio cannot be 'auto'"),
    (AutoRec, dict(lr=float("nan")), ValueError, r"^lr must be positive, got nan$"),
    (AutoRec, dict(lr=float("inf")), ValueError, r"^lr must be finite, got inf$"),
    (KernelNet, dict(l2=-np.float32(1)), ValueError, r"^l2 must be non-negative, got -1.0$"),
    (AutoRec, dict(l2=None), TypeError, r"^l2 must be a real number, got NoneType None$"),
    (AutoRec, dict(lr="0.1"), TypeError, r"^lr must be a real number, got str '0.1'$"),
    (AutoRec, dict(epochs=2.5), TypeError, r"^epochs must be an int >= 1, got 2.5$"),
    (AutoRec, dict(refit=1), TypeError, r"^refit must be a bool, got int 1$"),
    (CFN, dict(hide_ratio=1.0), ValueError, r"^hide_ratio must be in \[0, 1\), got 1.0$"),
    (AutoRec, dict(hiden=4), TypeError, r"^AutoRec got unknown hyperparameters \['hiden'\]"),
    (AutoRec, _delete("lr"), TypeError,
     r"^AutoRec.hparams lacks \['lr'\]; every hyperparameter needs a value \(defaults: "
     r"\{'lr': 0.001\}\)$"),
    (AutoRec, dict(hidden=8), ValueError,
     _SHAPES + r"encoder.weight of shape \(8, 20\), the model has \(4, 20\); changed since fit: "
     r"hidden 4 -> 8" + _BACK),
    (KernelNet, dict(layers=2), ValueError,
     _SHAPES + r"kernels.1.weight of shape \(4, 4\), the model has \(20, 4\); changed since "
     r"fit: layers 1 -> 2" + _BACK),
    (KernelNet, dict(dim=np.int64(3)), ValueError,
     _SHAPES + r"kernels.0.u of shape \(20, 3\), the model has \(20, 5\); changed since fit: "
     r"dim 5 -> 3" + _BACK),
    (CFN, dict(orientation="user"), ValueError,
     r"^hparams no longer describe the fitted network: orientation is 'user', the model was "
     r"fitted with 'item' rows; changed since fit: orientation 'item' -> 'user'" + _BACK),
]


@pytest.mark.parametrize("existing", [False, True], ids=["new-path", "existing-file"])
@pytest.mark.parametrize("cls, edit, error, match", _BAD_EDITS,
                         ids=lambda v: v.__name__ if isinstance(v, type) else
                         str(v) if isinstance(v, dict) else "")
def test_save_checks_hparams_edited_after_fit(tmp_path, cls, edit, error, match, existing):
    """An edit fit would refuse, or one that no longer describes the fitted network, is
    refused by save before anything is written (the file load then refused, or loaded with
    other weights): no file, or the existing one byte for byte; the model as it was."""
    model = _fitted_copy(cls)
    path = tmp_path / "m.pt"
    if existing:
        path.write_bytes(b"an older file")
    predictions = model.predict(_TINY_R)
    edit(model.hparams) if callable(edit) else model.hparams.update(edit)
    before = dict(model.hparams)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(error, match=match):
        model.save(path)
    assert (path.read_bytes() == b"an older file") if existing else not path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == (["m.pt"] if existing else [])
    assert model.hparams.keys() == before.keys()
    assert all(model.hparams[k] is before[k] for k in before)  # not even normalised
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    # still fitted, predicting as fitted (an edited orientation read the other matrix's rows)
    assert torch.equal(model.predict(_TINY_R), predictions)


@pytest.mark.parametrize("cls, edit", [
    (AutoRec, dict(lr=np.float32(1e-3))),
    (AutoRec, dict(epochs=np.int64(3), patience=np.int32(2), refit=np.bool_(False),
                   orientation=np.str_("item"), seed=np.uint8(5))),
    (CFN, dict(l2=np.float64(3.5), alpha=np.float16(2), hide_ratio=np.float32(0.5))),
    (KernelNet, dict(l2=np.float32(7), l2_kernel=np.str_("auto"), hidden=np.int16(4))),
], ids=["lr-float32", "ints-bool-str", "cfn-floats", "kernelnet-penalties"])
def test_save_after_a_numpy_edit_round_trips(tmp_path, cls, edit):
    """Settings edited after fit (for the next one) as numpy scalars: saved as the Python
    values construction makes of them, so torch.load(weights_only=True) reads the file and
    load rebuilds the same model (a numpy float32 lr made the file unreadable)."""
    model = _fitted_copy(cls)
    model.hparams.update(edit)
    path = tmp_path / "m.pt"
    model.save(path)
    saved = torch.load(path, weights_only=True)["hparams"]
    loaded = cls.load(path)
    for k, v in edit.items():
        expected = "auto" if isinstance(v, str) and v == "auto" else v.item()
        assert saved[k] == expected and type(saved[k]) is type(expected), k
        assert loaded.hparams[k] == expected and type(loaded.hparams[k]) is type(expected), k
    assert loaded.hparams == model._checked_hparams()
    assert torch.equal(loaded.predict(_TINY_R), model.predict(_TINY_R))
    assert model.hparams["lr"] is (edit.get("lr", model.hparams["lr"]))  # save changed nothing


@contextlib.contextmanager
def _disk_full_in_torch_save(monkeypatch):
    """Inside the block torch.save writes part of a file, then fails as a full disk does;
    the block must raise that error.  torch.save is itself again after it."""
    real_save = torch.save

    def half_then_fail(obj, f, *args, **kwargs):
        f.write(b"half a model")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_fail)
    try:
        with pytest.raises(OSError, match="No space left on device"):
            yield
    finally:
        monkeypatch.setattr(torch, "save", real_save)


def test_a_failed_write_leaves_the_existing_file(tmp_path, monkeypatch):
    """The file is written through a temporary one renamed over it: a save failing half-way
    (a full disk) leaves the previous file whole and no temporary file behind."""
    model = _fitted_copy(AutoRec)
    path = tmp_path / "m.pt"
    model.save(path)
    good = path.read_bytes()
    with _disk_full_in_torch_save(monkeypatch):
        model.save(path)
    assert path.read_bytes() == good and [p.name for p in tmp_path.iterdir()] == ["m.pt"]
    assert torch.equal(AutoRec.load(path).predict(_TINY_R), model.predict(_TINY_R))


def test_save_writes_through_a_link_and_keeps_the_mode(tmp_path):
    model = _fitted_copy(AutoRec)
    target, link = tmp_path / "target.pt", tmp_path / "link.pt"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link.symlink_to(target)
    model.save(link)
    assert link.is_symlink() and (target.stat().st_mode & 0o777) == 0o640
    assert torch.equal(AutoRec.load(target).predict(_TINY_R), model.predict(_TINY_R))


@pytest.mark.skipif(not hasattr(os, "link"), reason="no hard links on this system")
def test_save_over_a_hard_linked_file_updates_every_link(tmp_path):
    """Renamed over, the saved name got a new file and the other link kept the old model;
    now the file is written in place (once the temporary file is whole): one inode, its
    mode kept, no temporary file left."""
    old, new = _fitted_copy(AutoRec), _tiny(AutoRec, hidden=8, lr=0.5)  # a larger file
    target, other = tmp_path / "m.pt", tmp_path / "also.pt"
    old.save(target)
    target.chmod(0o640)
    os.link(target, other)
    inode = target.stat().st_ino
    new.save(target)
    assert target.stat().st_ino == other.stat().st_ino == inode
    assert target.stat().st_nlink == 2 and (target.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["also.pt", "m.pt"]
    for path in (target, other):
        assert AutoRec.load(path).hparams["lr"] == 0.5
        assert torch.equal(AutoRec.load(path).predict(_TINY_R), new.predict(_TINY_R))
    old.save(other)  # a shorter file: the rest of the longer one does not remain
    assert target.read_bytes() == other.read_bytes()
    assert torch.equal(AutoRec.load(target).predict(_TINY_R), old.predict(_TINY_R))


@pytest.mark.skipif(not hasattr(os, "link"), reason="no hard links on this system")
def test_a_failed_save_over_a_hard_linked_file_leaves_it(tmp_path, monkeypatch):
    model = _fitted_copy(AutoRec)
    target, other = tmp_path / "m.pt", tmp_path / "also.pt"
    model.save(target)
    os.link(target, other)
    good = target.read_bytes()
    with _disk_full_in_torch_save(monkeypatch):
        _tiny(AutoRec, lr=0.5).save(target)
    assert target.read_bytes() == other.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["also.pt", "m.pt"]


def _read_only(monkeypatch, *paths):
    """``paths`` made read-only (mode 0o444).  Root may write any file, so for root
    ``os.open`` is also made to refuse writing them, as the kernel refuses others."""
    for path in paths:
        path.chmod(0o444)
    if os.geteuid() != 0:
        return
    real_open, refused = os.open, {os.fspath(p) for p in paths}

    def open_as_a_user(path, flags, *args, **kwargs):
        if os.fspath(path) in refused and flags & (os.O_WRONLY | os.O_RDWR):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return real_open(path, flags, *args, **kwargs)
    monkeypatch.setattr(os, "open", open_as_a_user)


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
@pytest.mark.parametrize("links,through", [(1, "name"), (2, "name"), (2, "symlink")],
                         ids=["one-link", "hard-linked", "through-a-symlink"])
def test_save_over_a_read_only_file_is_refused_before_writing(tmp_path, monkeypatch, links,
                                                              through):
    """A read-only file is refused as open() refuses it (PermissionError naming the path
    given; torch.save refuses it too, with a RuntimeError), before anything is written:
    not renamed over (one link), no failed in-place copy after the serialisation (hard
    links)."""
    target = tmp_path / "m.pt"
    _fitted_copy(AutoRec).save(target)
    names = [target] + [tmp_path / f"also{i}.pt" for i in range(1, links)]
    for other in names[1:]:
        os.link(target, other)
    given = target
    if through == "symlink":
        given = tmp_path / "link.pt"
        given.symlink_to(target)
    good, listing = target.read_bytes(), sorted(p.name for p in tmp_path.iterdir())
    _read_only(monkeypatch, *({target, given} if os.geteuid() == 0 else {target}))
    saved = []
    real_save = torch.save
    monkeypatch.setattr(torch, "save", lambda *a, **k: saved.append(a) or real_save(*a, **k))
    with pytest.raises(PermissionError) as refused:
        _tiny(AutoRec, hidden=8, lr=0.5).save(given)
    assert refused.value.errno == errno.EACCES and refused.value.filename == os.fspath(given)
    assert str(refused.value) == f"[Errno 13] Permission denied: {os.fspath(given)!r}"
    if os.geteuid() != 0:  # open()'s error; torch.save's own is a RuntimeError naming no path
        with pytest.raises(PermissionError) as open_refused:
            open(given, "wb")
        assert str(open_refused.value) == str(refused.value)
        with pytest.raises(RuntimeError, match="Permission denied"):
            real_save({}, given)
    assert saved == []  # refused before the model was serialised
    assert target.read_bytes() == good and stat.S_IMODE(target.stat().st_mode) == 0o444
    assert target.stat().st_nlink == links
    assert sorted(p.name for p in tmp_path.iterdir()) == listing  # no temporary file


def _read_only_directory(monkeypatch, directory):
    """``directory`` made read-only (mode 0o555).  Root may still create files in it (the
    mode does not hold it back: checked with os.access), so for root the temporary file's
    creation by RatingModel.save is made to refuse as the kernel refuses others."""
    directory.chmod(0o555)
    if not os.access(directory, os.W_OK):
        return
    import builtins
    from nnsparse.models import base

    def open_as_a_user(file, mode="r", *args, **kwargs):
        if "x" in mode and os.path.dirname(os.path.abspath(file)) == os.fspath(directory):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(file))
        return builtins.open(file, mode, *args, **kwargs)
    monkeypatch.setattr(base, "open", open_as_a_user, raising=False)


def _rename_refused(monkeypatch, directory):
    """os.replace refused as a sticky directory refuses to rename over another user's file
    (EPERM), naming both files, as the system does."""
    def refuse(src, dst):
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM), os.fspath(src),
                              None, os.fspath(dst))
    monkeypatch.setattr(os, "replace", refuse)


# (id, an existing file first, how the directory refuses, the system's errno)
REFUSING_DIRECTORIES = [
    ("read-only-new-file", False, _read_only_directory, errno.EACCES),
    ("read-only-existing-file", True, _read_only_directory, errno.EACCES),
    ("rename-refused", True, _rename_refused, errno.EPERM),
]


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="POSIX permissions")
@pytest.mark.parametrize("existing, refuse, code", [r[1:] for r in REFUSING_DIRECTORIES],
                         ids=[r[0] for r in REFUSING_DIRECTORIES])
def test_save_into_a_refusing_directory_names_the_path_given(tmp_path, monkeypatch, existing,
                                                             refuse, code):
    """The error of the hidden temporary file (made in the directory, then renamed over the
    path) names the path the user gave, the system's error as its cause; nothing is left."""
    directory = tmp_path / "models"
    directory.mkdir()
    given = directory / "m.pt"
    if existing:
        _fitted_copy(AutoRec).save(given)
    before = {p.name: p.read_bytes() for p in directory.iterdir()}
    refuse(monkeypatch, directory)
    try:
        with pytest.raises(PermissionError) as refused:
            _tiny(AutoRec, hidden=8, lr=0.5).save(given)
    finally:
        directory.chmod(0o755)
    error = refused.value
    assert (error.errno, error.filename, error.filename2) == (code, os.fspath(given), None)
    assert str(error) == (f"[Errno {code}] {os.strerror(code)} (a save writes a temporary file "
                          f"in {directory}, then renames it to the path given): "
                          f"{os.fspath(given)!r}")
    cause = error.__cause__
    assert isinstance(cause, PermissionError) and cause.errno == code
    assert re.fullmatch(r"\.m\.pt\.[0-9a-f]{12}\.tmp", os.path.basename(cause.filename))
    assert {p.name: p.read_bytes() for p in directory.iterdir()} == before  # no temporary file


# (id, a file name as long as a file system takes: 255 bytes, NAME_MAX on Linux and macOS)
LONG_NAMES = [
    ("ascii-255-bytes", "m" * 252 + ".pt"),
    ("utf-8-254-bytes", "\u00e9" * 124 + "m.pt"),  # (é: 2 bytes each)
]


@pytest.mark.parametrize("existing", [False, True], ids=["new-file", "over-a-file"])
@pytest.mark.parametrize("name", [n for _, n in LONG_NAMES], ids=[i for i, _ in LONG_NAMES])
def test_save_to_a_name_of_the_longest_length_a_file_system_takes(tmp_path, name, existing):
    """The temporary file's name stays within NAME_MAX, however long the name given (it was
    the name plus 18 characters: "File name too long" for a name a plain open takes)."""
    given = tmp_path / name
    try:
        given.write_bytes(b"")  # the file system takes the name
    except OSError as error:
        pytest.skip(f"this file system refuses the name itself: {error}")
    if not existing:
        given.unlink()
    model = _fitted_copy(AutoRec)
    model.save(given)
    assert [p.name for p in tmp_path.iterdir()] == [name]  # no temporary file left
    loaded = RatingModel.load(given)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(),
                                                 model.state_dict().values()))


@pytest.mark.skipif(not hasattr(os, "link"), reason="no hard links on this system")
def test_an_interrupt_during_the_in_place_copy_is_held_until_it_is_done(tmp_path,
                                                                         monkeypatch):
    """A KeyboardInterrupt (SIGINT) half-way through the copy into a hard-linked file is
    raised once the copy is done: every link holds the whole new model, not half of it,
    and the interrupt handler is the one before."""
    target, other = tmp_path / "m.pt", tmp_path / "also.pt"
    _fitted_copy(AutoRec).save(target)
    os.link(target, other)
    new = _tiny(AutoRec, hidden=8, lr=0.5)
    real_copy, handler = shutil.copyfileobj, signal.getsignal(signal.SIGINT)

    def interrupted_copy(src, dst, *args, **kwargs):
        dst.write(src.read(100))
        signal.raise_signal(signal.SIGINT)  # as a Ctrl-C here
        real_copy(src, dst, *args, **kwargs)
    monkeypatch.setattr(shutil, "copyfileobj", interrupted_copy)
    with pytest.raises(KeyboardInterrupt):
        new.save(target)
    assert signal.getsignal(signal.SIGINT) is handler
    assert target.stat().st_ino == other.stat().st_ino and target.stat().st_nlink == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["also.pt", "m.pt"]
    for path in (target, other):
        assert torch.equal(AutoRec.load(path).predict(_TINY_R), new.predict(_TINY_R))


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate here")
def test_a_hard_linked_file_without_room_for_the_new_model_is_left(tmp_path, monkeypatch):
    """The copy into a hard-linked file reserves the new length first: a disk too full
    for it fails before a byte is overwritten, and the file keeps its old length."""
    target, other = tmp_path / "m.pt", tmp_path / "also.pt"
    _fitted_copy(AutoRec).save(target)
    os.link(target, other)
    good = target.read_bytes()

    def full_disk(fd, offset, length):
        size = os.fstat(fd).st_size  # part of the room reserved (appended), then none left
        os.ftruncate(fd, size + (offset + length - size) // 2)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        _tiny(AutoRec, hidden=8, lr=0.5).save(target)  # a larger file
    assert target.read_bytes() == other.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == ["also.pt", "m.pt"]


@pytest.mark.skipif(not hasattr(os, "posix_fallocate"), reason="no posix_fallocate here")
def test_an_interrupt_during_the_reservation_is_held_until_the_copy_is_done(tmp_path,
                                                                             monkeypatch):
    """A SIGINT arriving while the hard-linked file's new length is reserved (the file
    already longer, its tail zeros) is held as during the copy: every link gets the
    whole new model, not the old one with zeros appended."""
    target, other = tmp_path / "m.pt", tmp_path / "also.pt"
    _fitted_copy(AutoRec).save(target)
    os.link(target, other)
    new = _tiny(AutoRec, hidden=8, lr=0.5)
    real_fallocate, handler = os.posix_fallocate, signal.getsignal(signal.SIGINT)

    def interrupted_fallocate(fd, offset, length):
        real_fallocate(fd, offset, length)
        signal.raise_signal(signal.SIGINT)  # as a Ctrl-C during the call
    monkeypatch.setattr(os, "posix_fallocate", interrupted_fallocate)
    with pytest.raises(KeyboardInterrupt):
        new.save(target)
    assert signal.getsignal(signal.SIGINT) is handler
    assert target.stat().st_ino == other.stat().st_ino and target.stat().st_nlink == 2
    for path in (target, other):
        assert torch.equal(AutoRec.load(path).predict(_TINY_R), new.predict(_TINY_R))


@pytest.mark.skipif(not hasattr(os, "link"), reason="no hard links on this system")
def test_a_failed_in_place_copy_off_the_main_thread_raises_its_own_error(tmp_path,
                                                                          monkeypatch):
    """Off the main thread no interrupt is held (Python runs signal handlers on the main
    thread only): a failed copy into a hard-linked file raises its own error, not one
    chained to signal's refusal ("During handling of ... signal only works in main
    thread")."""
    import threading
    target, other = tmp_path / "m.pt", tmp_path / "also.pt"
    _fitted_copy(AutoRec).save(target)
    os.link(target, other)
    new = _tiny(AutoRec, hidden=8, lr=0.5)

    def full_disk(src, dst, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(shutil, "copyfileobj", full_disk)
    raised = []

    def save():
        try:
            new.save(target)
        except OSError as error:
            raised.append(error)
    thread = threading.Thread(target=save)
    thread.start()
    thread.join()
    assert len(raised) == 1 and raised[0].errno == errno.ENOSPC
    assert raised[0].__context__ is None and raised[0].__cause__ is None


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no named pipes on this system")
def test_save_writes_into_a_named_pipe_not_over_it(tmp_path):
    """A path that is not a regular file (a named pipe, a device such as /dev/null) is
    written as torch.save writes it: renamed over, a pipe's reader got nothing and the
    pipe (or, for root, /dev/null itself) became a regular file."""
    import threading
    model = _fitted_copy(AutoRec)
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    got = []
    reader = threading.Thread(target=lambda: got.append(pipe.read_bytes()), daemon=True)
    reader.start()
    try:
        model.save(pipe)
    finally:
        # unblock a reader that was never written to; non-blocking, so that a reader
        # which finished in the meantime cannot leave this open waiting for a partner
        if reader.is_alive() and stat.S_ISFIFO(os.stat(pipe).st_mode):
            try:
                os.close(os.open(pipe, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:  # ENXIO: no reader any more
                pass
        reader.join(10)
    assert stat.S_ISFIFO(os.stat(pipe).st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["pipe"]
    assert torch.equal(AutoRec.load(io.BytesIO(got[0])).predict(_TINY_R), model.predict(_TINY_R))


def test_a_refused_save_writes_nothing_to_a_file_object():
    import io
    model = _fitted_copy(AutoRec)
    model.hparams["lr"] = np.str_("auto")
    buffer = io.BytesIO()
    with pytest.raises(TypeError, match=r"^lr cannot be 'auto'"):
        model.save(buffer)
    assert buffer.getvalue() == b""
    model.hparams["lr"] = np.float32(0.5)
    model.save(buffer)
    buffer.seek(0)
    assert AutoRec.load(buffer).hparams["lr"] == 0.5


def test_save_before_fit_writes_nothing(tmp_path):
    with pytest.raises(RuntimeError, match=r"^AutoRec is not fitted; call fit\(\) or load\(\)$"):
        AutoRec(hidden=4).save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_a_diverged_fit_leaves_the_model_not_fitted(tmp_path):
    """A fit that raised FloatingPointError left NaN weights that predict returned and save
    wrote (a file whose model predicted NaN): the model is now not fitted until a fit
    succeeds, a fitted one too (its earlier weights are gone)."""
    model = _fitted_copy(AutoRec)
    assert model.history and model.best_epoch > 0
    model.hparams["lr"] = 1e30
    with pytest.raises(FloatingPointError, match="training diverged"):
        model.fit(_TINY_R, verbose=False, progress=False)
    assert model.history == [] and model.best_epoch == 0  # not the earlier fit's
    why = (r"^AutoRec is not fitted \(its last fit\(\) raised FloatingPointError\); "
           r"call fit\(\) or load\(\)$")
    for call in (lambda: model.save(tmp_path / "m.pt"), lambda: model.predict(_TINY_R),
                 lambda: model.recommend(0)):
        with pytest.raises(RuntimeError, match=why):
            call()
    assert not (tmp_path / "m.pt").exists()
    model.hparams["lr"] = 1e-2
    model.fit(_TINY_R, verbose=False, progress=False).save(tmp_path / "m.pt")
    assert torch.isfinite(AutoRec.load(tmp_path / "m.pt").predict(_TINY_R)).all()


def test_save_refuses_weights_that_are_not_finite(tmp_path):
    model = _fitted_copy(KernelNet)
    with torch.no_grad():
        model.kernels[0].u[0, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^KernelNet holds weights that are not finite "
                                         r"\(\['kernels.0.u'\]\): its training diverged; fit it "
                                         r"again \(a smaller lr\) before saving$"):
        model.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def _old_file(tmp_path, cls, change):
    """A file as the save before these checks wrote it: ``change(blob)`` edits the blob of a
    fitted tiny ``cls`` model (what an edit of its hparams after fit made save write)."""
    path = tmp_path / "old.pt"
    _fitted_copy(cls).save(path)
    blob = torch.load(path, weights_only=True)
    change(blob)
    torch.save(blob, path)
    return path


def _set(part, **values):
    return lambda blob: blob[part].update(values)


def _nan_weight(blob):
    blob["state"]["encoder.weight"][0, 0] = float("nan")


@pytest.mark.parametrize("cls, change, match", [
    (AutoRec, _set("hparams", lr="auto"),
     r"old.pt holds hyperparameters AutoRec refuses \(edited after fit, then saved\?\): lr "
     r"cannot be 'auto'"),
    (AutoRec, _set("hparams", lr=float("nan")),
     r"old.pt holds hyperparameters AutoRec refuses .*: lr must be positive, got nan$"),
    (AutoRec, _set("hparams", hidden=8),
     r"old.pt is a damaged model file \(RatingModel.save wrote something else\): size mismatch "
     r"for encoder.weight: its hparams build \(8, 20\), its state holds \(4, 20\) \(hparams "
     r"edited after fit, then saved\?\)$"),
    (KernelNet, _set("hparams", layers=2),
     r"old.pt is a damaged model file .*: its state lacks \['kernels.2.bias', "),
    (CFN, _set("hparams", orientation="user"),
     r"old.pt holds hparams with orientation 'user', but its normaliser was fitted with 'item' "
     r"rows \(edited after fit, then saved\?\)$"),
    (AutoRec, _nan_weight,
     r"old.pt holds weights that are not finite \(encoder.weight\): the model it saved had "
     r"diverged; fit it again$"),
    (AutoRec, lambda blob: blob.update(hparams=[("hidden", 4)]),
     r"old.pt is a damaged model file .*: hparams must be a dict, got list$"),
], ids=["auto-lr", "nan-lr", "hidden", "layers", "orientation", "nan-weight", "hparams-list"])
def test_load_refuses_a_file_that_would_load_wrong(tmp_path, cls, change, match):
    """Files the previous save wrote after an edit of hparams, or after a diverged fit: each
    refused with its cause, not loaded with other weights or NaN predictions."""
    path = _old_file(tmp_path, cls, change)
    for load in (cls.load, RatingModel.load):
        with pytest.raises(ValueError, match=match):
            load(path)


def test_load_refuses_an_edited_orientation_of_a_square_matrix(tmp_path):
    """With as many users as items, the swapped orientation built layers of the same shapes:
    the old file loaded without complaint and predicted with the other matrix's rows."""
    square = synthetic_ratings(1, 15, 15, 120)
    model = _tiny(AutoRec, square)
    path = tmp_path / "m.pt"
    model.hparams["orientation"] = "user"
    with pytest.raises(ValueError, match=r"orientation is 'user', the model was fitted with "
                                         r"'item' rows"):
        model.save(path)
    model.hparams["orientation"] = "item"
    model.save(path)
    blob = torch.load(path, weights_only=True)
    blob["hparams"]["orientation"] = "user"  # what the unchecked save wrote
    torch.save(blob, path)
    with pytest.raises(ValueError, match=r"holds hparams with orientation 'user', but its "
                                         r"normaliser was fitted with 'item' rows"):
        AutoRec.load(path)


@pytest.mark.parametrize("saved", [AutoRec, CFN, KernelNet])
@pytest.mark.parametrize("loader", [AutoRec, CFN, KernelNet])
def test_a_file_loads_with_its_own_class_or_the_base(tmp_path, saved, loader):
    path = tmp_path / "m.pt"
    model = _fitted_copy(saved)
    model.save(path)
    assert type(RatingModel.load(path)) is saved
    if loader is saved:
        assert torch.equal(loader.load(path).predict(_TINY_R), model.predict(_TINY_R))
        return
    article = lambda name: ("an " if name[0] in "AEIOU" else "a ") + name  # noqa: E731
    with pytest.raises(ValueError, match=rf"m.pt holds {article(saved.__name__)}, not "
                                         rf"{article(loader.__name__)}$"):
        loader.load(path)


def test_a_loaded_model_saves_again_the_same_file_contents(tmp_path):
    """The file format is unchanged: a loaded model saves the same parts, and an edit of
    the next fit's settings on a loaded model is saved like one on a fitted model."""
    model = _fitted_copy(KernelNet)
    model.save(tmp_path / "a.pt")
    loaded = KernelNet.load(tmp_path / "a.pt")
    loaded.save(tmp_path / "b.pt")
    a, b = (torch.load(tmp_path / n, weights_only=True) for n in ("a.pt", "b.pt"))
    assert a.keys() == b.keys() and a["hparams"] == b["hparams"]
    assert all(torch.equal(a["state"][k], b["state"][k]) for k in a["state"])
    loaded.hparams["epochs"] = np.int64(9)
    loaded.save(tmp_path / "c.pt")
    assert KernelNet.load(tmp_path / "c.pt").hparams["epochs"] == 9


class _Unregistered(AutoRec):
    """A subclass that changes the network but inherits AutoRec's name: its file said
    "autorec", and load() rebuilt an AutoRec with its weights (other predictions)."""

    def network(self, x, rows, pattern=None):
        return super().network(x, rows, pattern) * 2.0


@pytest.mark.parametrize("cls, match", [
    (_Unregistered, r"^_Unregistered is not registered under its name 'autorec' \(the name a "
                    r"model file holds, which load\(\) would rebuild as an AutoRec\); give the "
                    r"class its own name and decorate it with nnsparse.models.register$"),
    (_subclass(), r"^Custom is not registered under its name 'custom-test' \(the name a model "
                  r"file holds\); give the class its own name"),
], ids=["inherited-name", "own-name"])
def test_save_refuses_a_class_load_would_not_rebuild(tmp_path, cls, match):
    model = _tiny(cls)
    with pytest.raises(TypeError, match=match):
        model.save(tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_save_checks_a_build_the_meta_device_cannot_run(tmp_path):
    """A registered subclass whose build reads a value back (no meta-device run): save
    checks its hparams on a CPU build instead, drawing no random number of the caller's."""
    from nnsparse.models import MODELS, register

    class ReadsBack(AutoRec):
        name = "reads-back-test"

        def build(self, rows, width, features):
            self.scale = float(torch.ones(1).sum())  # a meta tensor has no value
            super().build(rows, width, features)

    register(ReadsBack)
    try:
        model = _tiny(ReadsBack)
        rng = torch.get_rng_state()
        model.save(tmp_path / "m.pt")
        assert torch.equal(rng, torch.get_rng_state())
        assert torch.equal(RatingModel.load(tmp_path / "m.pt").predict(_TINY_R),
                           model.predict(_TINY_R))
        model.hparams["hidden"] = 5
        with pytest.raises(ValueError, match=r"they build encoder.weight of shape \(5, 20\), "
                                             r"the model has \(4, 20\)"):
            model.save(tmp_path / "m.pt")
    finally:
        MODELS.pop("reads-back-test", None)


def test_save_checks_a_build_that_reads_the_fitted_statistics(tmp_path):
    """A registered subclass whose build reads what fit set before it (the mean rating, the
    normaliser): save's check of hparams builds with them too (it failed on AttributeError)."""
    from nnsparse.models import MODELS, register

    class Prior(AutoRec):
        name = "prior-test"

        def build(self, rows, width, features):
            super().build(rows, width, features)
            assert self.normalizer.shape == (rows, width)
            self.register_buffer("prior", torch.full((width,), self.global_mean))

    register(Prior)
    try:
        model = _tiny(Prior)
        model.save(tmp_path / "m.pt")
        loaded = RatingModel.load(tmp_path / "m.pt")
        assert torch.equal(loaded.prior, model.prior)
        assert torch.equal(loaded.predict(_TINY_R), model.predict(_TINY_R))
        model.hparams["hidden"] = 5
        with pytest.raises(ValueError, match=r"they build encoder.weight of shape \(5, 20\)"):
            model.save(tmp_path / "m.pt")
    finally:
        MODELS.pop("prior-test", None)


def test_load_of_an_unregistered_name_says_what_to_import(tmp_path):
    path = _old_file(tmp_path, AutoRec, lambda blob: blob.update(model="mine"))
    with pytest.raises(ValueError, match=r"old.pt holds an unknown model 'mine' \(registered: "
                                         r"\[.*'autorec'.*\]; import the module that registers "
                                         r"it first\)$"):
        RatingModel.load(path)


@pytest.mark.parametrize("error", [MemoryError(), PermissionError(13, "Permission denied")],
                         ids=["memory", "permission"])
def test_load_lets_the_machine_s_errors_through(tmp_path, monkeypatch, error):
    """Only a failure to read the bytes as a model file is 'not a model saved by
    nnsparse.models': a file the process may not read, or memory running out while a
    large model file loads, reaches the caller as the error it is."""
    path = tmp_path / "model.pt"
    path.write_bytes(b"any")

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(torch, "load", fail)
    with pytest.raises(type(error)) as caught:
        RatingModel.load(path)
    assert caught.value is error


# -- torch's global modes: the default dtype, autograd off (probe 18) ------------------------

_PROBE18 = dict(hidden=8, epochs=2, batch_size=16, validation_ratio=0.0)
_PROBE18_MODELS = [(AutoRec, {}), (CFN, {}), (KernelNet, {}), (GLocalK, dict(global_epochs=2))]


@pytest.fixture(scope="module")
def small():
    return split_ratings(synthetic_ratings(0, 40, 30, 600), 0.2, seed=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cls, extra", _PROBE18_MODELS, ids=lambda v: getattr(v, "name", ""))
def test_fit_under_another_default_dtype_trains_the_float32_model(small, cls, extra, dtype,
                                                                  default_dtype):
    # the layers were built in the default dtype and refused the float32 matrix ("input must
    # have the weight's dtype"); CFN's corruption drew in it too (another model for a seed)
    train, test = small
    reference = cls(**_PROBE18, **extra).fit(train, verbose=False, progress=False)
    with default_dtype(dtype):
        model = cls(**_PROBE18, **extra).fit(train, verbose=False, progress=False)
    assert torch.get_default_dtype() == torch.float32  # (restored)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert torch.equal(model.predict(test), reference.predict(test))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("cls, extra", _PROBE18_MODELS, ids=lambda v: getattr(v, "name", ""))
def test_a_fitted_model_predicts_and_ranks_the_same_under_another_default_dtype(small, cls,
                                                                               extra, dtype,
                                                                               default_dtype):
    # float16 / bfloat16 defaults: torch's "Index put requires the source and destination
    # dtypes match" in predict; every default but float32: the same in evaluate_ranking
    train, test = small
    model = cls(**_PROBE18, **extra).fit(train, verbose=False, progress=False)
    pred, ranking = model.predict(test), model.evaluate_ranking(test, k=3)
    means, _ = model.fallback(test.user, test.item)
    with default_dtype(dtype):
        got = model.predict(test)
        got_means, _ = model.fallback(test.user, test.item)
        got_ranking = model.evaluate_ranking(test, k=3)
        buffer = io.BytesIO()
        model.save(buffer)
        buffer.seek(0)
        loaded = RatingModel.load(buffer).predict(test)
    assert got.dtype == got_means.dtype == loaded.dtype == torch.float32
    assert torch.equal(got, pred) and torch.equal(got_means, means)
    assert torch.equal(loaded, pred)
    assert got_ranking == ranking


_GRAD_OFF = [
    (torch.no_grad, r"inside torch.no_grad\(\) or torch.set_grad_enabled\(False\)"),
    (lambda: torch.set_grad_enabled(False),
     r"inside torch.no_grad\(\) or torch.set_grad_enabled\(False\)"),
    (torch.inference_mode, r"inside torch.inference_mode\(\)"),
]


@pytest.mark.parametrize("off, where", _GRAD_OFF, ids=["no_grad", "set_grad_enabled", "inference"])
@pytest.mark.parametrize("cls, extra", _PROBE18_MODELS, ids=lambda v: getattr(v, "name", ""))
def test_fit_with_autograd_off_is_refused_and_leaves_the_model_fitted(small, cls, extra, off,
                                                                      where):
    # was torch's "element 0 of tensors does not require grad" at the first backward, after
    # the model had been rebuilt: the fitted model was left unfitted
    train, test = small
    model = cls(**_PROBE18, **extra).fit(train, verbose=False, progress=False)
    pred = model.predict(test)
    with pytest.raises(RuntimeError, match=rf"^{cls.__name__}.fit trains with autograd, but "
                                           rf"gradients are off here \({where}\); call it "
                                           rf"outside that block$"):
        with off():
            model.fit(train, verbose=False, progress=False)
    assert torch.equal(model.predict(test), pred)


@pytest.mark.parametrize("off, where", _GRAD_OFF, ids=["no_grad", "set_grad_enabled", "inference"])
def test_trainer_with_autograd_off_is_refused(small, off, where):
    model = AutoRec(**_PROBE18).fit(small[0], verbose=False, progress=False)
    trainer = model._trainer(torch.device("cpu"), False)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=rf"^Trainer.fit trains with autograd, .*\({where}\)"):
        with off():
            trainer.fit(model._input, epochs=1)
    loader = trainer.make_loader(SparseRowDataset(model._input))
    batch, optimizer = next(iter(loader)), trainer.make_optimizer()
    with pytest.raises(RuntimeError, match=rf"^Trainer.step trains with autograd, .*\({where}\)"):
        with off():
            trainer.step(batch, optimizer)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


def test_indices_as_numpy_arrays_with_negative_strides_are_taken(small):
    # np.flip(a) and a[::-1]: torch.as_tensor refuses them, and the refusal read "users must
    # be an integer tensor (or a list of ints), got ndarray", though other arrays are taken
    train, test = small
    model = AutoRec(**_PROBE18).fit(train, verbose=False, progress=False)
    users, items = test.user.numpy(), test.item.numpy()
    expected = model.predict_entries(test.user.flip(0), test.item.flip(0))
    assert torch.equal(model.predict_entries(np.flip(users), np.flip(items)), expected)
    assert torch.equal(model.predict_entries(users[::-1], items[::-1]), expected)
    means, counts = model.fallback(np.flip(users), items[::-1])
    assert torch.equal(means, model.fallback(test.user.flip(0), test.item.flip(0))[0])
    with pytest.raises(TypeError, match=r"^users must be an integer tensor, got torch.float64$"):
        model.predict_entries(np.flip(users.astype(float)), items)


@contextlib.contextmanager
def _set_default_device(device):
    torch.set_default_device(device)
    try:
        yield
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("default", [lambda: _set_default_device("meta"),
                                     lambda: torch.device("meta")],
                         ids=["set_default_device", "with-torch.device"])
@pytest.mark.parametrize("cls, extra", _PROBE18_MODELS, ids=lambda v: getattr(v, "name", ""))
def test_models_work_on_cpu_data_under_another_default_device(small, cls, extra, default):
    # (the meta device stands for CUDA on a machine without one: every tensor made without a
    # device lands there.)  fit failed in Module.to ("Cannot copy out of meta tensor"), and
    # predict, evaluate, recommend and evaluate_ranking with "users must hold data" or in
    # torch.nonzero: the models' own tensors were made on the default device (probe 18)
    train, test = small
    reference = cls(**_PROBE18, **extra).fit(train, verbose=False, progress=False)
    folds = list(kfold(train, 2))
    with default():
        model = cls(**_PROBE18, **extra).fit(train, verbose=False, progress=False)
        got = (model.predict(test), reference.predict(test), reference.evaluate(test),
               reference.evaluate_ranking(test, k=3), reference.recommend(0, k=2).ids,
               [len(a) for a, _ in kfold(train, 2)])
        buffer = io.BytesIO()
        reference.save(buffer)
        buffer.seek(0)
        loaded = RatingModel.load(buffer)
    pred = reference.predict(test)
    assert torch.equal(got[0], pred) and torch.equal(got[1], pred)
    assert got[2] == reference.evaluate(test)
    assert got[3] == reference.evaluate_ranking(test, k=3)
    assert got[4] == reference.recommend(0, k=2).ids
    assert got[5] == [len(a) for a, _ in folds]
    assert torch.equal(loaded.predict(test), pred)
    assert torch.get_default_device() == torch.device("cpu")


class _SeesDefaultDtype(AutoRec):
    """A user's model adding a layer of its own (made in torch's default dtype); its build
    records the default dtype seen by itself and by another thread meanwhile."""

    name = "sees-default-dtype-test"

    def build(self, rows, width, features):
        super().build(rows, width, features)
        self.extra = torch.nn.Linear(2, 2)
        self.register_buffer("counts", torch.zeros(3, dtype=torch.int64))
        seen = []
        other = threading.Thread(target=lambda: seen.append(torch.get_default_dtype()))
        other.start()
        other.join()
        self.seen = (torch.get_default_dtype(), seen[0])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16], ids=str)
def test_fit_leaves_torch_s_process_wide_default_dtype_alone(small, dtype, default_dtype):
    # the default dtype is the process's: fit had set it to float32 around build, and
    # another thread made its tensors in float32 meanwhile.  The models' layers are made in
    # float32 by their dtype; a subclass's own layers are converted after its build
    train, test = small
    with default_dtype(dtype):
        model = _SeesDefaultDtype(**_PROBE18).fit(train, verbose=False, progress=False)
    assert model.seen == (dtype, dtype)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.counts.dtype == torch.int64
    reference = AutoRec(**_PROBE18).fit(train, verbose=False, progress=False)
    assert torch.equal(model.encoder.weight, reference.encoder.weight)
    assert torch.equal(model.predict(test), reference.predict(test))
    with default_dtype(dtype):  # refits: the layers replaced, their tensors' ids free
        for _ in range(8):
            model.fit(train, verbose=False, progress=False)
            assert {p.dtype for p in model.parameters()} == {torch.float32}
