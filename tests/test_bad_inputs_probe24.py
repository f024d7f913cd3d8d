"""The twenty-fourth bad-input probe (docs/bad_inputs_probe24.md): what changed on the
session's last day, as an outside user calls it: the checked records (``TrainResult``,
``CrossValidation``, ``Recommendations``, ``Split``/``UserSplit``), used the usual ways and
given bad fields, and their ``==``.

Each row pairs a call with the exception and a regex of its message (``error=None``: the
call must work, and ``check`` its result).
"""
import copy
import functools
import io
import math
import pickle

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

from nnsparse.data import (HeldOut, Ratings, Split, UserSplit, random_split, rating_matrix,
                           split_ratings, synthetic_ratings, user_split)
from nnsparse.models import (AutoRec, CrossValidation, Recommendations, Trainer, TrainResult,
                             cross_validate, kfold)
from probe_cases import Case, run_case


def _reloaded(obj, **kwargs):  # torch.save then torch.load (weights_only by default)
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, **kwargs)


@functools.lru_cache(maxsize=None)
def _ratings() -> Ratings:
    return synthetic_ratings(0, 40, 30, 600)


@functools.lru_cache(maxsize=None)
def _split() -> Split:
    return random_split(_ratings(), test=0.1, validation=0.1)


@functools.lru_cache(maxsize=None)
def _user_split() -> UserSplit:
    return user_split(_ratings(), test=0.2, validation=0.1)


@functools.lru_cache(maxsize=None)
def _model() -> AutoRec:
    split = _split()
    return AutoRec(hidden=8, epochs=2, refit=False).fit(split.train, split.validation,
                                                        progress=False, verbose=False)


def _rec() -> Recommendations:
    return _model().recommend(0, k=3, min_support=0, by_index=True)


def _train_result() -> TrainResult:  # Trainer.fit without validation: best_rmse is NaN
    return Trainer(_model(), epochs=2, batch_size=8, lr=1e-3, progress=False,
                   log=None).fit(rating_matrix(_split().train, "item"))


@functools.lru_cache(maxsize=None)
def _cv() -> CrossValidation:
    return cross_validate(lambda: AutoRec(hidden=8, epochs=1, refit=False),
                          kfold(_ratings(), 2), progress=False)


def _unhashable(obj) -> bool:
    try:
        hash(obj)
    except TypeError:
        return True
    return False


# -- ==: a record equals its copy and its reload (was: the dataclass's and the tuple's ==
#    compared the tensors elementwise, "Boolean value of Tensor with more than one value is
#    ambiguous"; a TrainResult without validation, NaN best_rmse, was unequal to its
#    reload); every record unhashable, as a dataclass that is not frozen -----------------

EQUAL_CASES = [
    Case("Ratings==deepcopy", lambda: _ratings() == copy.deepcopy(_ratings()), None,
         check=lambda equal: equal is True),
    Case("Ratings!=subset", lambda: _ratings() != _ratings().subset(
        torch.arange(len(_ratings())) < 5), None, check=lambda differ: differ is True),
    Case("Ratings!=float64", lambda: _ratings() == Ratings(
        *[getattr(_ratings(), f) for f in ("user", "item")], _ratings().rating.double(),
        _ratings().user_map, _ratings().item_map, _ratings().titles, _ratings().source), None,
         check=lambda equal: equal is False),
    Case("Split==torch.load", lambda: _reloaded(_split()) == _split(), None,
         check=lambda equal: equal is True),
    Case("Split==deepcopy", lambda: copy.deepcopy(_split()) == _split(), None,
         check=lambda equal: equal is True),
    Case("split_ratings==torch.load", lambda: (lambda parts: _reloaded(parts) == parts)(
        split_ratings(_ratings(), 0.2)), None, check=lambda equal: equal is True),
    Case("UserSplit==torch.load", lambda: _reloaded(_user_split()) == _user_split(), None,
         check=lambda equal: equal is True),
    Case("UserSplit!=Split", lambda: _user_split() != _split(), None,
         check=lambda differ: differ is True),
    Case("HeldOut==deepcopy", lambda: copy.deepcopy(_user_split().test) == _user_split().test,
         None, check=lambda equal: equal is True),
    Case("Recommendations==deepcopy", lambda: _rec() == copy.deepcopy(_rec()), None,
         check=lambda equal: equal is True),
    Case("Recommendations==torch.load", lambda: _reloaded(_rec()) == _rec(), None,
         check=lambda equal: equal is True),
    Case("Recommendations!=copy", lambda: _rec() != copy.deepcopy(_rec()), None,
         check=lambda differ: differ is False),
    Case("Recommendations!=other-score", lambda: _rec() != _rec()._replace(
        score=_rec().score + 1), None, check=lambda differ: differ is True),
    Case("Recommendations!=float64", lambda: _rec() == _rec()._replace(
        score=_rec().score.double()), None, check=lambda equal: equal is False),
    Case("Recommendations==plain-tuple", lambda: tuple(copy.deepcopy(_rec())) == _rec(), None,
         check=lambda equal: equal is True),
    Case("Recommendations-in-list", lambda: _rec() in [copy.deepcopy(_rec())], None,
         check=lambda found: found is True),
    Case("TrainResult-nan==pickle", lambda: (lambda r: pickle.loads(pickle.dumps(r)) == r)(
        _train_result()), None, check=lambda equal: equal is True),
    Case("TrainResult-nan==torch.load", lambda: (lambda r: _reloaded(r) == r)(
        _train_result()), None, check=lambda equal: equal is True),
    Case("CrossValidation-nan==deepcopy", lambda: (lambda cv: copy.deepcopy(cv) == cv)(
        CrossValidation([dict(fold=1, rmse=0.9, ndcg=math.nan)])), None,
         check=lambda equal: equal is True),
    Case("CrossValidation!=other", lambda: CrossValidation([dict(fold=1, rmse=0.9)]) != (
        CrossValidation([dict(fold=1, rmse=0.8)])), None, check=lambda differ: differ is True),
    Case("unhashable", lambda: [_unhashable(x) for x in (
        _ratings(), _split(), _user_split(), _user_split().test, _rec(), _train_result(),
        _cv())], None, check=lambda flags: all(flags)),
]


@pytest.mark.parametrize("case", EQUAL_CASES, ids=[c.id for c in EQUAL_CASES])
def test_records_compare_by_value(case):
    run_case(case)


# -- the records used the usual ways (controls: all worked before) ----------------------

USAGE_CASES = [
    Case("Recommendations-unpack", lambda: (lambda ids, index, score, rating, support,
                                            titles: len(ids))(*_rec()), None,
         check=lambda n: n == 3),
    Case("Recommendations-index", lambda: _rec()[1], None,
         check=lambda index: index.dtype == torch.int64),
    Case("Recommendations-asdict", lambda: list(_rec()._asdict()), None,
         check=lambda keys: keys == ["ids", "index", "score", "rating", "support", "titles"]),
    Case("Recommendations-to-list-comprehension", lambda: Recommendations(
        *[x.to("cpu") if torch.is_tensor(x) else x for x in _rec()]), None,
         check=lambda rec: rec == _rec()),
    Case("Recommendations-tree_map-clone", lambda: tree_map(
        lambda x: x.clone() if torch.is_tensor(x) else x, _rec()), None,
         check=lambda rec: type(rec) is Recommendations and rec == _rec()),
    Case("Recommendations-torch.load-weights_only", lambda: _reloaded(_rec()), None,
         check=lambda rec: type(rec) is Recommendations),
    Case("TrainResult-pickle", lambda: pickle.loads(pickle.dumps(_train_result())), None,
         check=lambda r: type(r) is TrainResult and len(r.history) == 2),
    Case("CrossValidation-torch.load", lambda: _reloaded(_cv()), None,
         check=lambda cv: cv == _cv() and cv.mean() == _cv().mean()),
    Case("UserSplit-torch.load-HeldOut", lambda: _reloaded(_user_split()).test, None,
         check=lambda held: type(held) is HeldOut),
    Case("TrainResult-numpy-epoch", lambda: TrainResult([{"epoch": 1}], np.int64(1), 0.5),
         None, check=lambda r: type(r.best_epoch) is int),
]


@pytest.mark.parametrize("case", USAGE_CASES, ids=[c.id for c in USAGE_CASES])
def test_records_used_the_usual_ways(case):
    run_case(case)


# -- bad fields: refused by name, the record left as it was (controls: all refused before) -

def _assigned(make, name, value):
    record = make()
    before = copy.deepcopy(record)
    try:
        setattr(record, name, value)
    finally:
        assert record == before  # (== itself: probe 24's fix)


BAD_CASES = [
    Case("TrainResult.best_epoch-bool", lambda: _assigned(_train_result, "best_epoch", True),
         TypeError, r"^TrainResult\.best_epoch must be a non-negative int, got True$"),
    Case("TrainResult.history-None-value", lambda: _assigned(
        _train_result, "history", [{"epoch": 1, "valid_rmse": None}] * 2), TypeError,
         r"^TrainResult\.history\[0\]\['valid_rmse'\] must be a number, got NoneType None$"),
    Case("CrossValidation.k-None-beside-threshold", lambda: _assigned(
        lambda: CrossValidation([dict(fold=1, rmse=0.9)], k=3, threshold=4.0), "k", None),
         ValueError, r"^CrossValidation\.threshold=4 needs k"),
    Case("Recommendations.index-int32", lambda: _rec()._replace(index=_rec().index.int()),
         TypeError, r"^Recommendations\.index must be a dense 1-D int64 tensor \(k,\), got "
                    r"torch\.int32$"),
    Case("Recommendations-tree_map-double", lambda: tree_map(
        lambda x: x.double() if torch.is_tensor(x) else x, _rec()), TypeError,
         r"^Recommendations\.index must be a dense 1-D int64 tensor \(k,\), got "
         r"torch\.float64$"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[c.id for c in BAD_CASES])
def test_records_refuse_bad_fields_by_name(case):
    run_case(case)


# -- the records' value comparison (nnsparse.data.readers._same) on what a record's field
#    could hold, each answered True/False (second reading: torch.equal has no sparse
#    kernel, NotImplementedError; isnan of a complex value is either part's, so a NaN
#    real part matched a NaN imaginary part; math.isnan(10**400) raised OverflowError) --

def _coo(values, indices=((0, 1), (1, 0))):
    return torch.sparse_coo_tensor(torch.tensor(indices), torch.tensor(values), (2, 2))


_NAN = math.nan
SAME_CASES = [
    ("coo-copy", lambda: (_coo([1., 2.]), _coo([1., 2.])), True),
    ("coo-uncoalesced-vs-coalesced", lambda: (_coo([1., 2.]), _coo([1., 2.]).coalesce()),
     True),
    ("coo-other-order", lambda: (_coo([1., 2.]), _coo([2., 1.], ((1, 0), (0, 1)))), True),
    ("coo-other-value", lambda: (_coo([1., 2.]), _coo([1., 3.])), False),
    ("coo-other-nnz", lambda: (_coo([1., 2.]), _coo([1.], ((0,), (1,)))), False),
    ("coo-nan", lambda: (_coo([1., _NAN]), _coo([1., _NAN])), True),
    ("coo-vs-dense", lambda: (_coo([1., 2.]), _coo([1., 2.]).to_dense()), False),
    ("csr-copy", lambda: (_coo([1., 2.]).to_sparse_csr(), _coo([1., 2.]).to_sparse_csr()),
     True),
    ("csr-other-value", lambda: (_coo([1., 2.]).to_sparse_csr(),
                                 _coo([1., 3.]).to_sparse_csr()), False),
    ("complex-nan-same-part", lambda: (torch.tensor([complex(1, _NAN)]),
                                       torch.tensor([complex(1, _NAN)])), True),
    ("complex-nan-other-part", lambda: (torch.tensor([complex(1, _NAN)]),
                                        torch.tensor([complex(_NAN, 1)])), False),
    ("float-nan", lambda: (torch.tensor([1., _NAN]), torch.tensor([1., _NAN])), True),
    ("float-nan-other-place", lambda: (torch.tensor([1., _NAN]), torch.tensor([_NAN, 1.])),
     False),
    ("meta-one-tensor", lambda: (lambda m: (m, m))(torch.empty(2, device="meta")), True),
    ("meta-two-tensors", lambda: (torch.empty(2, device="meta"),
                                  torch.empty(2, device="meta")), False),
    ("meta-vs-cpu", lambda: (torch.empty(2, device="meta"), torch.empty(2)), False),
    ("huge-int", lambda: (10 ** 400, 1), False),
    ("huge-int-same", lambda: (10 ** 400, 10 ** 400), True),
    ("float-nan-number", lambda: (_NAN, np.float32(_NAN)), True),
]


@pytest.mark.parametrize("make, expected", [c[1:] for c in SAME_CASES],
                         ids=[c[0] for c in SAME_CASES])
def test_same_answers_without_raising(make, expected):
    from nnsparse.data.readers import _same
    a, b = make()
    assert _same(a, b) is expected and _same(b, a) is expected


def test_records_with_a_huge_int_compare():  # (was OverflowError from ==)
    for make in (lambda n: TrainResult([{"epoch": 1, "n": n}], 1, 0.5),
                 lambda n: CrossValidation([dict(fold=1, rmse=0.9, n=n)])):
        assert make(10 ** 400) != make(1) and make(1) != make(10 ** 400)
        assert make(10 ** 400) == make(10 ** 400)
