"""Every public count takes one rule: a Python int, a numpy integer or a 0-d integer tensor
(as ``torch.topk``'s ``k`` and ``nn.Linear``'s sizes take one), and refuses a bool, a
float, a 0-d bool or floating tensor and a tensor of one element but more dimensions, with
a message that names the argument (``nnsparse._forms.as_count``).

Until session 16 ``Batchifier.topk`` and ``nnsparse.stopk`` took a 0-d tensor ``k`` while
``recommend(k=)``, the models' counts and ``kfold``'s ``k`` refused it.
"""
import functools
import math
import re
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import nnsparse
from nnsparse import Batchifier, Densify, distributed as nd, sparsify
from nnsparse.data import synthetic_ratings
from nnsparse.models import AutoRec, kfold
from nnsparse.models.trainer import Trainer

X = torch.tensor([[0., 3., 0., 1.], [2., 0., 5., 0.]])
T = torch.tensor
SMALL = dict(hidden=4, epochs=1, batch_size=16, validation_ratio=0.0)


@functools.lru_cache(maxsize=None)
def _ratings():
    return synthetic_ratings(0, 30, 20, 300)


@functools.lru_cache(maxsize=None)
def _fitted():
    return AutoRec(**SMALL).fit(_ratings(), verbose=False, progress=False)


def _net():
    torch.manual_seed(0)
    return nn.Sequential(Densify(4), nn.Linear(4, 4))


def _batchifier(**kw):
    return Batchifier(_net(), **{"output_size": 4, "progress": False, **kw})


def _model(**changes):
    """A tiny AutoRec fitted with ``changes`` to its hyperparameters: its predictions."""
    model = AutoRec(**{**SMALL, **changes}).fit(_ratings(), verbose=False, progress=False)
    return model.predict_entries(_ratings().user[:5], _ratings().item[:5]), model.hparams


def _trainer(**kw):
    return Trainer(nn.Linear(2, 2), **{"epochs": 2, "batch_size": 4, "lr": 0.1, **kw})


def _trainer_settings(**kw):
    t = _trainer(**kw)
    return t.epochs, t.batch_size, t.patience


def _same(a: Any, b: Any) -> bool:
    """Equal results: tensors (sparse ones densified) by value and dtype, containers by item."""
    if isinstance(a, torch.Tensor):
        a, b = (t.to_dense() if t.layout != torch.strided else t for t in (a, b))
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, nnsparse.data.Ratings):
        return _same((a.user, a.item, a.rating), (b.user, b.item, b.rating))
    return type(a) is type(b) and a == b


# (id, call of the count) — each is called with 3, np.int64(3), tensor(3) and an int32
# tensor(3) (2 where 3 does not fit), and must give what the Python int gives
COUNTS = [
    ("recommend-k", lambda n: tuple(_fitted().recommend(0, k=n, min_support=0))),
    ("recommend-min_support", lambda n: tuple(_fitted().recommend(0, k=4, min_support=n))),
    ("kfold-k", lambda n: [pair for pair in kfold(_ratings(), k=n)]),
    ("model-hidden", lambda n: _model(hidden=n)),
    ("model-epochs", lambda n: _model(epochs=n)),
    ("model-batch_size", lambda n: _model(batch_size=n)),
    ("model-patience", lambda n: _model(patience=n)),
    ("Trainer-epochs-batch_size-patience",
     lambda n: _trainer_settings(epochs=n, batch_size=n, patience=n)),
    ("Batchifier-topk-k", lambda n: tuple(_batchifier().topk(X.to_sparse_csr(), n))),
    ("Batchifier-batch_size", lambda n: _batchifier(batch_size=n)(X.to_sparse_csr())),
    ("stopk-k", lambda n: tuple(nnsparse.stopk(X.to_sparse(), n))),
    ("sparsify-offset", lambda n: sparsify(X, offset=n)),
    ("Sparsify-offset", lambda n: nnsparse.Sparsify(offset=n)(X)),
    ("Densify-in_features", lambda n: Densify(n + 1)(sparsify(X))),
    ("SparseWeightLinear.random-sizes",
     lambda n: nnsparse.SparseWeightLinear.random(n, n, 0.5, seed=0).crow),
    ("synthetic_ratings-sizes", lambda n: synthetic_ratings(0, n, n, n)),
    ("distributed.loader-batch_size",
     lambda n: [b[0] for b in nd.loader(torch.utils.data.TensorDataset(torch.arange(7.)),
                                        batch_size=n, shuffle=False)]),
    ("collate_sparse_rows-width", lambda n: nnsparse.data.collate_sparse_rows(
        [(0, (T([1]), T([2.])))], n + 1)),
]


def _forms(n: int):
    return [("int", n), ("numpy", np.int64(n)), ("0-d int64 tensor", T(n)),
            ("0-d int32 tensor", T(n, dtype=torch.int32)),
            # (as torch.topk and nn.Linear take it; stopk did before session 16's rule)
            ("0-d numpy array", np.array(n)), ("0-d uint8 numpy array", np.array(n, np.uint8))]


@pytest.mark.parametrize("form", [f for f, _ in _forms(3)])
@pytest.mark.parametrize("call", [c for _, c in COUNTS], ids=[i for i, _ in COUNTS])
def test_a_count_takes_a_numpy_int_and_a_0d_integer_tensor(call, form):
    value = dict(_forms(3))[form]
    assert _same(call(value), call(3))


def test_a_model_keeps_a_tensor_count_as_its_int():
    """The fitted model's hyperparameters (what save() writes) hold the int, not the tensor."""
    _, hparams = _model(hidden=T(4), epochs=T(1), batch_size=T(16), patience=T(0))
    assert [type(hparams[k]) for k in ("hidden", "epochs", "batch_size", "patience")] == [int] * 4


# (id, call, error, message): what the rule still refuses, the argument named
REFUSED = [
    ("recommend-k-bool-tensor", lambda: _fitted().recommend(0, k=T(True)), TypeError,
     r"^k must be a non-negative int, got tensor\(True\)$"),
    ("recommend-k-float-tensor", lambda: _fitted().recommend(0, k=T(3.)), TypeError,
     r"^k must be a non-negative int, got tensor\(3\.\)$"),
    ("recommend-k-1d-tensor", lambda: _fitted().recommend(0, k=T([3])), TypeError,
     r"^k must be a non-negative int, got tensor\(\[3\]\)$"),
    ("recommend-k-negative-tensor", lambda: _fitted().recommend(0, k=T(-1)), ValueError,
     r"^k must be a non-negative int, got -1$"),
    ("recommend-k-meta-tensor", lambda: _fitted().recommend(0, k=T(3, device="meta")),
     ValueError, r"^k .*meta"),
    ("kfold-k-bool-tensor", lambda: kfold(_ratings(), k=T(True)), TypeError,
     r"^k must be an int >= 2, got tensor\(True\)$"),
    ("kfold-k-float-tensor", lambda: kfold(_ratings(), k=T(2.)), TypeError,
     r"^k must be an int >= 2, got tensor\(2\.\)$"),
    ("kfold-k-1-tensor", lambda: kfold(_ratings(), k=T(1)), ValueError,
     r"^k must be an int >= 2, got 1$"),
    ("kfold-k-uint64-beyond-int64",
     lambda: kfold(_ratings(), k=T(2 ** 63, dtype=torch.uint64)), ValueError,
     r"^k must be an int >= 2 within int64 \(below 2\*\*63\), got 9223372036854775808$"),
    ("model-hidden-float-tensor", lambda: _model(hidden=T(4.)), TypeError,
     r"^hidden must be an int >= 1, got tensor\(4\.\)$"),
    ("model-epochs-bool-tensor", lambda: _model(epochs=T(True)), TypeError,
     r"^epochs must be an int >= 1, got tensor\(True\)$"),
    ("Trainer-batch_size-complex-tensor", lambda: _trainer(batch_size=T(4 + 0j)), TypeError,
     r"^batch_size must be an int >= 1, got tensor\(4\.\+0\.j\)$"),
    ("Trainer.fit-epochs-float-tensor", lambda: _trainer().fit(
        X.to_sparse_csr(), epochs=T(1.)), TypeError,
     r"^epochs must be None or an int >= 1, got tensor\(1\.\)$"),
    ("stopk-k-bool-tensor", lambda: nnsparse.stopk(X.to_sparse(), T(True)), TypeError,
     r"^k must be a non-negative int, got tensor\(True\)$"),
    ("stopk-k-1d-tensor", lambda: nnsparse.stopk(X.to_sparse(), T([2])), TypeError,
     r"^k must be a non-negative int, got tensor\(\[2\]\)$"),
    ("stopk-k-bool", lambda: nnsparse.stopk(X.to_sparse(), True), TypeError,
     r"^k must be a non-negative int, got True$"),
    ("Batchifier-topk-k-float-tensor", lambda: _batchifier().topk(X.to_sparse_csr(), T(2.)),
     TypeError, r"^k must be a non-negative int, got tensor\(2\.\)$"),
    ("Batchifier-batch_size-bool-tensor", lambda: _batchifier(batch_size=T(True)), TypeError,
     r"^batch_size must be an int >= 1, got tensor\(True\)$"),
    ("sparsify-offset-float-tensor", lambda: sparsify(X, offset=T(1.)), TypeError,
     r"^offset must be a non-negative int, got tensor\(1\.\)$"),
    ("distributed.loader-batch_size-1d-tensor",
     lambda: nd.loader(torch.utils.data.TensorDataset(torch.arange(7.)), batch_size=T([2])),
     TypeError, r"^batch_size must be a positive int, got tensor\(\[2\]\)$"),
    ("collate_sparse_rows-width-bool-tensor", lambda: nnsparse.data.collate_sparse_rows(
        [(0, (T([1]), T([2.])))], T(True)), TypeError, r"^width must be an int, got Tensor "
     r"tensor\(True\)$"),
    ("Densify-in_features-bool-tensor", lambda: Densify(T(True)), TypeError,
     r"^in_features must be a non-negative int, got tensor\(True\)$"),
    # numpy arrays as tensors: a 0-d integer one only
    ("stopk-k-bool-array", lambda: nnsparse.stopk(X.to_sparse(), np.array(True)), TypeError,
     r"^k must be a non-negative int, got array\(True\)$"),
    ("stopk-k-float-array", lambda: nnsparse.stopk(X.to_sparse(), np.array(2.)), TypeError,
     r"^k must be a non-negative int, got array\(2\.\)$"),
    ("stopk-k-1d-array", lambda: nnsparse.stopk(X.to_sparse(), np.array([2])), TypeError,
     r"^k must be a non-negative int, got array\(\[2\]\)$"),
    ("kfold-k-uint64-array-beyond-int64",
     lambda: kfold(_ratings(), k=np.array(2 ** 63, dtype=np.uint64)), ValueError,
     r"^k must be an int >= 2 within int64 \(below 2\*\*63\), got 9223372036854775808$"),
    ("sparsify-offset-array-beyond-the-size", lambda: sparsify(X, offset=np.array(2 ** 62)),
     ValueError, r"^offset must keep the result's size \(2, 4611686018427387908\) within int64 "
     r"elements, got 4611686018427387904$"),
    ("Trainer.fit-epochs-1d-array", lambda: _trainer().fit(X.to_sparse_csr(),
                                                           epochs=np.array([1])), TypeError,
     r"^epochs must be None or an int >= 1, got array\(\[1\]\)$"),
]


@pytest.mark.parametrize("call, error, message", [r[1:] for r in REFUSED],
                         ids=[r[0] for r in REFUSED])
def test_what_a_count_still_refuses(call, error, message):
    with pytest.raises(error, match=message):
        call()


# Sizes (``_forms.as_int``: the layers' sizes, the builder's reserve / ndim / size, widths)
# read a 0-d tensor as the counts do (``int_of_0d``).  Until session 17 they went through
# operator.index: a meta tensor gave torch's "Tensor.item() cannot be called on meta
# tensors", and a uint64 tensor beyond int64 torch's "value cannot be converted to type
# int64_t without overflow", neither naming the argument, where a numpy uint64 of the same
# value reached the size's own int64 check.
SIZES = [
    ("SparseLinearBatch-in_features", "in_features",
     lambda n: nnsparse.SparseLinearBatch(n, 2)),
    ("DynamicSparseTensor-reserve", "reserve", lambda n: nnsparse.DynamicSparseTensor(reserve=n)),
    ("DynamicSparseTensor-ndim", "ndim", lambda n: nnsparse.DynamicSparseTensor(ndim=n)),
    ("DynamicSparseTensor.build-size", "size",
     lambda n: nnsparse.DynamicSparseTensor().build(size=(n,))),
    ("densify-size", "size", lambda n: nnsparse.densify(sparsify(X), size=(n, 4))),
    ("collate_sparse_rows-width", "width",
     lambda n: nnsparse.data.collate_sparse_rows([(0, (T([1]), T([2.])))], n)),
]


@pytest.mark.parametrize("name, call", [s[1:] for s in SIZES], ids=[s[0] for s in SIZES])
def test_a_size_refuses_a_meta_tensor_by_name(name, call):
    with pytest.raises(ValueError, match=rf"^{name} must hold data, got a tensor on the meta "
                                         r"device$"):
        call(T(3, device="meta"))


@pytest.mark.parametrize("call", [s[2] for s in SIZES], ids=[s[0] for s in SIZES])
def test_a_size_reads_a_uint64_tensor_beyond_int64_as_the_numpy_uint64(call):
    errors = []
    for n in (T(2 ** 63, dtype=torch.uint64), np.uint64(2 ** 63)):
        with pytest.raises(ValueError) as info:
            call(n)
        errors.append(str(info.value))
    assert errors[0] == errors[1] and "9223372036854775808" in errors[0]


@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("name, call", [s[1:] for s in SIZES], ids=[s[0] for s in SIZES])
def test_a_size_still_refuses_a_0d_timedelta_array(name, call, unit):
    # numpy files timedelta64 under np.integer, but a duration is no size (torch.topk
    # refuses one as k): refused naming what came, as before int_of_0d read sizes, not
    # taken as 3 (or reported as the datetime.timedelta its item() makes)
    value = np.array(np.timedelta64(3) if unit == "generic" else np.timedelta64(3, unit))
    with pytest.raises(TypeError, match=rf"^{name} must (be an int|hold ints), got ndarray "
                                        r"array\(3, dtype='?timedelta64"):
        call(value)


# numpy files timedelta64 under np.integer (so numbers.Integral takes one), but a duration
# is no count: refused naming the count (_forms.int_kind, the rule int_of_0d reads 0-d arrays
# by).  Before: np.timedelta64(3) was taken as 3, and one with a unit gave int()'s unnamed
# "int() argument must be ... not 'datetime.timedelta'".
MORE_COUNTS = COUNTS + [
    ("Trainer.fit-epochs", lambda n: _trainer().fit(X.to_sparse_csr(), epochs=n)),
    ("from_pairs-size", lambda n: nnsparse.from_pairs(T([[1., 3.]]), size=n)),
]


@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("call", [c for _, c in MORE_COUNTS], ids=[i for i, _ in MORE_COUNTS])
def test_a_count_refuses_a_timedelta(call, unit):
    value = np.timedelta64(3) if unit == "generic" else np.timedelta64(3, unit)
    shown = r"np\.timedelta64\(\d\)" if unit == "generic" else rf"np\.timedelta64\(\d,'{unit}'\)"
    with pytest.raises(TypeError, match=rf"^[a-z_]+ must be (None or )?(an|a positive|a "
                                        rf"non-negative) int( >= \d)?, got (timedelta64 )?"
                                        rf"{shown}$"):
        call(value)


# Every entry point that takes a size refuses one beyond int64 naming it, given as an int, a
# numpy uint64 or a uint64 tensor alike (_forms.as_int, the sizes' one check).  Before:
# collate_sparse_rows' width and densify's width of an empty batch reached torch's unnamed
# "Overflow when unpacking long long" TypeError; densify's other sizes were reported as "x
# is too large to densify".  (id, call, message)
_ROW = [(0, (T([1]), T([2.])))]
SIZES_BEYOND_INT64 = [
    ("collate_sparse_rows-width", lambda n: nnsparse.data.collate_sparse_rows(_ROW, n),
     "width must be an int"),
    ("collate_sparse_rows-width-coo",
     lambda n: nnsparse.data.collate_sparse_rows(_ROW, n, layout=torch.sparse_coo),
     "width must be an int"),
    ("densify-empty-width", lambda n: nnsparse.densify([], size=(0, n)), "size must be an int"),
    ("densify-empty-rows", lambda n: nnsparse.densify([], size=(n, 3)), "size must be an int"),
    ("densify-width", lambda n: nnsparse.densify(sparsify(X), size=(2, n)),
     "size must be an int"),
    ("densify-rows", lambda n: nnsparse.densify(sparsify(X), size=(n, 4)),
     "size must be an int"),
    ("densify-rows-list", lambda n: nnsparse.densify(list(sparsify(X)), size=(n, 4)),
     "size must be an int"),
    ("densify-vector", lambda n: nnsparse.densify(sparsify(X[0]), size=n),
     "size must be an int"),
    ("from_pairs-size", lambda n: nnsparse.from_pairs(T([[1., 3.]]), size=n),
     "size must be a non-negative int"),
    ("Densify-in_features", lambda n: Densify(n), "in_features must be a non-negative int"),
    ("DynamicSparseTensor-reserve", lambda n: nnsparse.DynamicSparseTensor(reserve=n),
     "reserve must be a non-negative int"),
    ("DynamicSparseTensor.build-size", lambda n: nnsparse.DynamicSparseTensor().build(size=n),
     "size must be an int"),
    ("SparseLinearBatch-in_features", lambda n: nnsparse.SparseLinearBatch(n, 2),
     "in_features must be a non-negative int"),
    ("SparseOutputLinear-out_features", lambda n: nnsparse.SparseOutputLinear(2, n),
     "out_features must be a non-negative int"),
]


@pytest.mark.parametrize("form", ["int", "numpy uint64", "uint64 tensor"])
@pytest.mark.parametrize("call, message", [s[1:] for s in SIZES_BEYOND_INT64],
                         ids=[s[0] for s in SIZES_BEYOND_INT64])
def test_a_size_beyond_int64_is_refused_by_name(call, message, form):
    n = {"int": 2 ** 63, "numpy uint64": np.uint64(2 ** 63),
         "uint64 tensor": T(2 ** 63, dtype=torch.uint64)}[form]
    with pytest.raises(ValueError, match=rf"^{message} within int64 \(below 2\*\*63\), got "
                                         rf"9223372036854775808$"):
        call(n)


# A seed takes the counts' rule too (_forms.is_int): numpy files timedelta64 under np.integer,
# so numbers.Integral took np.timedelta64(3) as the seed 3, and one with a unit reached int()'s
# unnamed "int() argument must be ... not 'datetime.timedelta'" (the defect 5b434f1 fixed for
# the counts, left in the seeds' own checks).  (id, call)
SEEDS = [
    ("split_ratings", lambda s: nnsparse.data.split_ratings(_ratings(), seed=s)),
    ("random_split", lambda s: nnsparse.data.random_split(_ratings(), seed=s)),
    ("holdout_split",
     lambda s: nnsparse.data.holdout_split(*nnsparse.data.split_ratings(_ratings()), seed=s)),
    ("kfold", lambda s: kfold(_ratings(), seed=s)),
    ("synthetic_ratings", lambda s: synthetic_ratings(s, 5, 6, 20)),
    ("Trainer", lambda s: _trainer(seed=s)),
    ("loader", lambda s: nd.loader(torch.utils.data.TensorDataset(torch.zeros(3)), 2, seed=s)),
    ("AutoRec", lambda s: AutoRec(seed=s)),
    ("SparseWeightLinear.random",
     lambda s: nnsparse.SparseWeightLinear.random(3, 4, 0.5, seed=s)),
]


@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("call", [c for _, c in SEEDS], ids=[i for i, _ in SEEDS])
def test_a_seed_refuses_a_timedelta(call, unit):
    value = np.timedelta64(3) if unit == "generic" else np.timedelta64(3, unit)
    with pytest.raises(TypeError, match=r"^seed must be an int( or None)?, got timedelta64"):
        call(value)


@pytest.mark.parametrize("call", [c for _, c in SEEDS], ids=[i for i, _ in SEEDS])
def test_a_seed_still_takes_a_numpy_int(call):
    call(np.int64(3))
    call(np.uint8(3))


# So do the ints that index or shape (is_int): a row index, a matrix shape, an insertion point,
# an id map's index.  Before: np.timedelta64(3) was torch's or numpy's unnamed "cannot be
# interpreted as an integer" (a row index), read as 3 (a rating matrix's shape) or an
# IndexError "got 3 generic time units" (PatternSequential.insert); one with a unit, int()'s
# unnamed "not 'datetime.timedelta'".  (id, call, the message's start)
def _row_dataset():
    return nnsparse.data.SparseRowDataset(nnsparse.data.rating_matrix(_ratings()))


def _with_item_map(index):
    r = _ratings()
    item_map = {**{i: i for i in range(r.n_items - 1)}, r.n_items - 1: index}
    return nnsparse.data.Ratings(r.user, r.item, r.rating, r.user_map, item_map).item_ids()


INDICES = [
    ("collate_sparse_rows-row_index",
     lambda i: nnsparse.data.collate_sparse_rows([(i, (T([1]), T([2.])))], 4),
     r"rows\[0\] row_index must be an int"),
    ("SparseRowDataset.collate-row",
     lambda i: _row_dataset().collate([(i, _row_dataset()[0][1])]),
     r"items\[0\] row must be a row of this dataset"),
    ("PatternSequential.insert-index",
     lambda i: nnsparse.PatternSequential(nn.Identity()).insert(i, nn.Identity()),
     "index must be an int"),
    ("rating_matrix-shape", lambda i: nnsparse.data.rating_matrix(_ratings(), shape=(i, 40)),
     "shape must be two non-negative ints"),
    ("Ratings-item_map", _with_item_map, "Ratings.item_map must map ids to int indices"),
]


@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("call, message", [s[1:] for s in INDICES], ids=[s[0] for s in INDICES])
def test_an_index_or_shape_refuses_a_timedelta(call, message, unit):
    value = np.timedelta64(3) if unit == "generic" else np.timedelta64(3, unit)
    with pytest.raises((TypeError, ValueError), match=rf"^{message}"):
        call(value)


# The remaining numbers.Integral checks of user-facing numbers take the rule too (is_int):
# a duration is no number of nnsparse.  Before: a float builder stored np.timedelta64(3) as
# 3.0 and an int one said "value ... does not fit in dtype torch.int64"; MaskCriterion's beta
# (real_arg) took it as 3.0, and beside a mapping read it as Lua's third argument (an input
# size); sparsify / densify's elem with a unit reached int()'s unnamed "not
# 'datetime.timedelta'"; a model class's AUTO_RATINGS took it as 3 ratings.  (id, call, the
# message before ", got <the value>", or the whole message ending with $)
def _auto_ratings(n):
    class Custom(nnsparse.models.KernelNet):
        AUTO_RATINGS = n
    return Custom()


def _mask(*args, **kwargs):
    return nnsparse.MaskCriterion(nn.MSELoss(), *args, **kwargs)


NUMBERS = [
    ("SparseRowDataset-getitem", lambda v: _row_dataset()[v], "index must be an int"),
    ("DynamicSparseTensor.append-float-value", lambda v: nnsparse.DynamicSparseTensor()
     .append(1, v), "value must be a real number"),
    ("DynamicSparseTensor.append-int-value",
     lambda v: nnsparse.DynamicSparseTensor(dtype=torch.int64).append(1, v),
     r"value must be a real number \(an int for dtype torch.int64\)"),
    ("DynamicSparseTensor.append-2d-value",
     lambda v: nnsparse.DynamicSparseTensor(ndim=2).append((1, 2), v),
     "value must be a real number"),
    ("DynamicSparseTensor.append-lua-row", lambda v: nnsparse.DynamicSparseTensor()
     .append([1, v]), "value must be a real number"),
    ("sparsify-elem", lambda v: sparsify(X, elem=v), "elem must be a number"),
    ("densify-elem", lambda v: nnsparse.densify(sparsify(X), elem=v), "elem must be a number"),
    ("MaskCriterion-beta", lambda v: _mask(1.0, v), "beta must be a real number"),
    ("MaskCriterion-SDAEconf-beta", lambda v: _mask({"alpha": 1.0, "beta": v}),
     "beta must be a real number"),
    # not Lua's inputSize (an int): the clash of a mapping and a keyword
    ("MaskCriterion-SDAEconf-third", lambda v: _mask({"alpha": 1.0}, v),
     r"MaskCriterion: pass the settings either in one mapping \(Lua's SDAEconf\) or as "
     r"keywords, not both; got a mapping and beta=$"),
    ("AUTO_RATINGS", _auto_ratings, "Custom.AUTO_RATINGS must be an int >= 1"),
]


def _refuses_timedelta(call, message, unit):
    """``call(np.timedelta64(3[, unit]))`` raises ``message``, ending in the value shown."""
    value = np.timedelta64(3) if unit == "generic" else np.timedelta64(3, unit)
    shown = r"np\.timedelta64\(3\)" if unit == "generic" else rf"np\.timedelta64\(3,'{unit}'\)"
    if not message.endswith("$"):
        message += rf", got (timedelta64 )?{shown}$"
    with pytest.raises((TypeError, ValueError), match=rf"^{message}"):
        call(value)


@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("call, message", [s[1:] for s in NUMBERS], ids=[s[0] for s in NUMBERS])
def test_a_number_refuses_a_timedelta(call, message, unit):
    _refuses_timedelta(call, message, unit)


def test_a_refused_timedelta_value_leaves_the_builder_as_it_was():
    builder = nnsparse.DynamicSparseTensor()
    builder.append(0, 1.0)
    with pytest.raises(TypeError, match="value must be a real number"):
        builder.append(1, np.timedelta64(3))
    builder.append(2, 5.0)
    assert len(builder) == 2
    assert torch.equal(builder.build().to_dense(), T([1., 0., 5.]))


# ... and still take what they took: a numpy int, a bool where a number is one (not an index
# nor a count), a Python int; Lua's inputSize is still named beside a mapping.  (id, call,
# value, the message or None: no error)
NUMBERS_STILL = [
    ("SparseRowDataset-getitem-np.int64", lambda v: _row_dataset()[v], np.int64(1), None),
    ("SparseRowDataset-getitem-0d", lambda v: _row_dataset()[v], T(1), None),
    ("SparseRowDataset-getitem-bool", lambda v: _row_dataset()[v], True,
     r"^index must be an int, got bool True$"),
    ("SparseRowDataset-getitem-0d-np.int64", lambda v: _row_dataset()[v], np.array(1), None),
    # (operator.index read a 0-d bool tensor as 1, beside a refused True: refused alike now)
    ("SparseRowDataset-getitem-0d-bool", lambda v: _row_dataset()[v], T(True),
     r"^index must be an int, got Tensor tensor\(True\)$"),
    ("DynamicSparseTensor.append-int-np.int64",
     lambda v: nnsparse.DynamicSparseTensor(dtype=torch.int64).append(1, v), np.int64(3), None),
    ("DynamicSparseTensor.append-float-np.float32",
     lambda v: nnsparse.DynamicSparseTensor().append(1, v), np.float32(3), None),
    ("sparsify-elem-np.int64", lambda v: sparsify(X, elem=v), np.int64(3), None),
    ("MaskCriterion-beta-np.int64", lambda v: _mask(1.0, v), np.int64(3), None),
    ("MaskCriterion-SDAEconf-inputSize", lambda v: _mask({"alpha": 1.0}, v), 5,
     r"^MaskCriterion\(criterion, SDAEconf\) takes no input size"),
    ("MaskCriterion-SDAEconf-inputSize-np.int64", lambda v: _mask({"alpha": 1.0}, v),
     np.int64(5), r"^MaskCriterion\(criterion, SDAEconf\) takes no input size"),
    ("AUTO_RATINGS-np.int64", _auto_ratings, np.int64(80_000), None),
    ("AUTO_RATINGS-bool", _auto_ratings, True,
     r"^Custom.AUTO_RATINGS must be an int >= 1, got True$"),
]


@pytest.mark.parametrize("call, value, message", [s[1:] for s in NUMBERS_STILL],
                         ids=[s[0] for s in NUMBERS_STILL])
def test_a_number_still_takes_what_it_took(call, value, message):
    if message is None:
        call(value)
    else:
        with pytest.raises((TypeError, ValueError), match=message):
            call(value)


# A 0-d timedelta64 array is a duration too: a float builder's buffer read it through the
# array's __float__ and stored np.array(np.timedelta64(3)) as 3.0 (the scalar was refused);
# an int one said "value must be a real number, got ndarray" without the value.  numpy's
# masked array, a subclass, alike.  (id, make the builder and append the value)
BUILDER_ARRAYS = [
    ("float", lambda v: nnsparse.DynamicSparseTensor().append(1, v), ""),
    ("int", lambda v: nnsparse.DynamicSparseTensor(dtype=torch.int64).append(1, v),
     r" \(an int for dtype torch.int64\)"),
    ("2d", lambda v: nnsparse.DynamicSparseTensor(ndim=2).append((1, 2), v), ""),
    ("lua-row", lambda v: nnsparse.DynamicSparseTensor().append([1, v]), ""),
]


@pytest.mark.parametrize("wrap", [np.array, np.ma.masked_array], ids=["ndarray", "masked"])
@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("call, dtype", [s[1:] for s in BUILDER_ARRAYS],
                         ids=[s[0] for s in BUILDER_ARRAYS])
def test_a_builder_value_refuses_a_0d_timedelta_array(call, dtype, unit, wrap):
    value = wrap(np.timedelta64(3) if unit == "generic" else np.timedelta64(3, unit))
    shown = re.escape(f"{type(value).__name__} {value!r}")
    with pytest.raises(TypeError, match=rf"^value must be a real number{dtype}, got {shown}$"):
        call(value)


# ... while the values a builder stores keep their numbers: a 0-d float or int array, numpy
# floats and ints, bools, a 0-d tensor.  (value, as stored in a float32 builder)
BUILDER_VALUES = [(np.array(2.5), 2.5), (np.array(3), 3.0), (np.float64(2.5), 2.5),
                  (np.float32(2.5), 2.5), (np.int8(3), 3.0), (True, 1.0), (T(2.5), 2.5),
                  (np.ma.masked_array(2.5), 2.5), (2.5, 2.5), (3, 3.0)]


@pytest.mark.parametrize("value, stored", BUILDER_VALUES, ids=[repr(v) for v, _ in BUILDER_VALUES])
def test_a_builder_value_still_stores_its_number(value, stored):
    for builder, index in ((nnsparse.DynamicSparseTensor(), 1),
                           (nnsparse.DynamicSparseTensor(ndim=2), (1, 0))):
        builder.append(index, value)
        assert builder.build().to_dense()[index].item() == stored


# The hyperparameters and other real numbers that checked numbers.Real alone (a
# np.timedelta64 is an Integral, hence a Real, to numbers) take the rule too (_forms.is_real):
# before, np.timedelta64(3) passed as 3 as a Trainer's lr or weight_decay, a model's lr or
# penalty, a builder's mult_coef, a clip's max_norm, an optimiser's lr, and a timedelta64
# with a unit reached float()'s unnamed "not 'datetime.timedelta'", numpy's UFuncTypeError
# (synthetic_ratings' noise, LazyAdam's lr) or a range message.  (id, call, the message
# before ", got <the value>", or the whole message ending with $)
def _lin():
    return nn.Linear(2, 2)


def _custom(**attrs):
    return type("Custom", (nnsparse.models.KernelNet,), attrs)()


def _mean_of(v):  # a fold edited in place, past the assignment's check: mean() checks it
    cv = nnsparse.models.CrossValidation([{"rmse": 0.9}])
    cv.folds[0]["rmse"] = v
    return cv.mean()


def _folds_assigned(v):
    cv = nnsparse.models.CrossValidation()
    cv.folds = [{"rmse": v}]


def _validate(v):
    trainer = Trainer(AutoRec(hidden=4), epochs=1, batch_size=2, lr=0.1, log=None)
    return trainer.validation_rmse(lambda: v)


def _step_of(v):
    p = nn.Parameter(torch.zeros(2))
    opt = nnsparse.optim.LazyAdam([p])
    state = {"state": {0: {"step": v, "exp_avg": torch.zeros(2), "exp_avg_sq": torch.zeros(2)}},
             "param_groups": opt.state_dict()["param_groups"]}
    opt.load_state_dict(state)


_R = synthetic_ratings(n_users=20, n_items=10, n_ratings=80, seed=0)

REALS = [
    ("Trainer-lr", lambda v: Trainer(AutoRec(hidden=4), epochs=1, batch_size=2, lr=v),
     "lr must be a real number"),
    ("Trainer-min_lr_ratio", lambda v: Trainer(AutoRec(hidden=4), epochs=1, batch_size=2,
                                               lr=0.1, min_lr_ratio=v),
     "min_lr_ratio must be a real number"),
    ("Trainer-weight_decay", lambda v: Trainer(AutoRec(hidden=4), epochs=1, batch_size=2,
                                               lr=0.1, weight_decay=v),
     "weight_decay must be a real number"),
    ("Trainer-validate", _validate, r"validate must return a number \(the validation RMSE\)"),
    ("AutoRec-lr", lambda v: AutoRec(lr=v), "lr must be a real number"),
    ("AutoRec-l2", lambda v: AutoRec(l2=v), "l2 must be a real number"),
    ("KernelNet-l2_kernel", lambda v: nnsparse.models.KernelNet(l2_kernel=v),
     "l2_kernel must be a real number or 'auto'"),
    ("AUTO-value", lambda v: _custom(AUTO={"l2": v}), r"Custom.AUTO\['l2'\] must be a positive "
     r"finite number"),
    ("AUTO_EXPONENT", lambda v: _custom(AUTO_EXPONENT=v),
     "Custom.AUTO_EXPONENT must be a finite number"),
    ("CrossValidation.mean", _mean_of, r"CrossValidation\.folds\[0\]\['rmse'\] must be a number"),
    # (refused by the assignment cv.folds = ... since session 24)
    ("CrossValidation.folds", _folds_assigned,
     r"CrossValidation\.folds\[0\]\['rmse'\] must be a number"),
    ("split_ratings-ratio", lambda v: nnsparse.data.split_ratings(_R, v),
     r"ratio must be a number in \[0, 1\)"),
    ("random_split-test", lambda v: nnsparse.data.random_split(_R, v, 0.1),
     r"test must be a number in \[0, 1\)"),
    ("random_split-validation", lambda v: nnsparse.data.random_split(_R, 0.1, v),
     r"validation must be a number in \[0, 1\)"),
    ("synthetic_ratings-noise", lambda v: synthetic_ratings(n_users=5, n_items=5, n_ratings=5,
                                                            noise=v),
     "noise must be a real number"),
    ("RatingNormalizer-scale", lambda v: nnsparse.data.RatingNormalizer(_R, scale=(v, 5)),
     r"scale must be a pair of numbers \(min, max\), got \(np\.timedelta64\(3(,'s')?\), 5\)$"),
    ("SparseWeightLinear.random-density",
     lambda v: nnsparse.SparseWeightLinear.random(4, 4, v), "density must be a real number"),
    ("SparseWeightLinear.from_dense-density",
     lambda v: nnsparse.SparseWeightLinear.from_dense(_lin(), v), "density must be a real number"),
    ("DynamicSparseTensor-mult_coef", lambda v: nnsparse.DynamicSparseTensor(mult_coef=v),
     "mult_coef must be a real number"),
    ("clip_grad_norm_-max_norm", lambda v: nnsparse.optim.clip_grad_norm_(_lin().parameters(), v),
     "max_norm must be a number"),
    ("clip_grad_norm_-norm_type",
     lambda v: nnsparse.optim.clip_grad_norm_(_lin().parameters(), 1.0, v),
     "norm_type must be a number"),
    ("clip_grad_value_", lambda v: nnsparse.optim.clip_grad_value_(_lin().parameters(), v),
     "clip_value must be a number"),
    ("LazyAdam-lr", lambda v: nnsparse.optim.LazyAdam(_lin().parameters(), lr=v),
     "lr must be a number"),
    ("LazyAdam-betas", lambda v: nnsparse.optim.LazyAdam(_lin().parameters(), betas=(v, 0.9)),
     "betas must be a number"),
    ("LazyAdam-step", _step_of, r"state_dict\['state'\]\[0\]\['step'\] must be a number or a "
     r"one-element tensor"),
    ("make_optimizer-lr", lambda v: nnsparse.make_optimizer(_lin(), lr=v), "lr must be a number"),
]


@pytest.mark.parametrize("unit", ["generic", "s"])
@pytest.mark.parametrize("call, message", [s[1:] for s in REALS], ids=[s[0] for s in REALS])
def test_a_real_number_refuses_a_timedelta(call, message, unit):
    _refuses_timedelta(call, message, unit)


# is_real: what the hyperparameters still take, and what they refuse.  (value, is_real)
IS_REAL = [(3, True), (2.5, True), (np.int64(3), True), (np.uint8(3), True),
           (np.float32(2.5), True), (np.float64(2.5), True), (Fraction(1, 2), True),
           (math.inf, True), (True, False), (np.bool_(True), False), (np.timedelta64(3), False),
           (np.timedelta64(3, "s"), False), (np.datetime64(3, "D"), False), (T(2.5), False),
           (np.array(2.5), False), ("2.5", False), (None, False), (1j, False)]


@pytest.mark.parametrize("value, expected", IS_REAL, ids=[repr(v) for v, _ in IS_REAL])
def test_is_real(value, expected):
    from nnsparse._forms import is_real
    assert is_real(value) is expected
