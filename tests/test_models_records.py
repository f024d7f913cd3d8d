"""The records of :mod:`nnsparse.models` (``TrainResult``, ``CrossValidation``,
``Recommendations``) checked as ``Ratings`` and ``Split`` are: at construction, at an
assignment (a refused one leaves the record as it was) and when loaded from a file."""
import copy
import io
import math
import pickle

import numpy as np
import pytest
import torch

from reload import RELOADS, reload
from nnsparse.models import CrossValidation, Recommendations, TrainResult


def _history(n=2):
    return [{"epoch": e, "train_loss": 0.5, "valid_rmse": 0.9, "seconds": 0.1}
            for e in range(1, n + 1)]


def _fold(**changes):
    return {**dict(fold=1, rmse=0.9, mae=0.7, item_mean_rmse=1.0, fallback=0, epochs=3,
                   seconds=1.5), **changes}


def _recs(**changes):
    fields = dict(ids=[10, "b"], index=torch.tensor([3, 1]), score=torch.tensor([4.5, 4.0]),
                  rating=torch.tensor([4.6, 4.1]), support=torch.tensor([20, 31]),
                  titles=["x", "y"])
    return {**fields, **changes}


# (id, make, error, message): each record built by hand with one field wrong
BAD_RECORDS = [
    ("TrainResult-history-tuple", lambda: TrainResult(tuple(_history())), TypeError,
     r"^TrainResult\.history must be a list of dicts, got tuple$"),
    ("TrainResult-history-of-floats", lambda: TrainResult([0.5, 0.4]), TypeError,
     r"^TrainResult\.history must be a list of dicts, got float at history\[0\]$"),
    ("TrainResult-history-key-int", lambda: TrainResult([{1: 0.5}]), TypeError,
     r"^TrainResult\.history\[0\] keys must be str, got int 1$"),
    ("TrainResult-history-value-str", lambda: TrainResult([{"train_loss": "0.5"}]), TypeError,
     r"^TrainResult\.history\[0\]\['train_loss'\] must be a number, got str '0\.5'$"),
    ("TrainResult-history-value-tensor", lambda: TrainResult([{"seconds": torch.tensor(1.)}]),
     TypeError, r"^TrainResult\.history\[0\]\['seconds'\] must be a number, got Tensor"),
    ("TrainResult-best_epoch-float", lambda: TrainResult(_history(), 1.0), TypeError,
     r"^TrainResult\.best_epoch must be a non-negative int, got 1\.0$"),
    ("TrainResult-best_epoch-negative", lambda: TrainResult(_history(), -1), ValueError,
     r"^TrainResult\.best_epoch must be a non-negative int, got -1$"),
    ("TrainResult-best_epoch-beyond-history", lambda: TrainResult(_history(2), 3), ValueError,
     r"^TrainResult\.best_epoch must be at most len\(history\) = 2 \(an epoch of the history, "
     r"0 for none\), got 3$"),
    ("TrainResult-best_rmse-str", lambda: TrainResult(_history(), 1, "0.9"), TypeError,
     r"^TrainResult\.best_rmse must be a real number \(nan without validation\), got str "
     r"'0\.9'$"),
    ("TrainResult-best_rmse-negative", lambda: TrainResult(_history(), 1, -0.5), ValueError,
     r"^TrainResult\.best_rmse must be a validation RMSE \(non-negative, or nan without "
     r"validation\), got -0\.5$"),
    ("CrossValidation-folds-dict", lambda: CrossValidation(_fold()), TypeError,
     r"^CrossValidation\.folds must be a list of dicts, got dict$"),
    ("CrossValidation-folds-of-ints", lambda: CrossValidation([1, 2]), TypeError,
     r"^CrossValidation\.folds must be a list of dicts, got int at folds\[0\]$"),
    ("CrossValidation-fold-value-None", lambda: CrossValidation([_fold(rmse=None)]), TypeError,
     r"^CrossValidation\.folds\[0\]\['rmse'\] must be a number, got NoneType None$"),
    ("CrossValidation-fold-value-bool", lambda: CrossValidation([_fold(), _fold(fallback=True)]),
     TypeError, r"^CrossValidation\.folds\[1\]\['fallback'\] must be a number, got bool True$"),
    ("CrossValidation-k-str", lambda: CrossValidation([_fold()], k="10"), TypeError,
     r"^CrossValidation\.k must be a positive int, got '10'$"),
    ("CrossValidation-k-0", lambda: CrossValidation([_fold()], k=0), ValueError,
     r"^CrossValidation\.k must be a positive int, got 0$"),
    ("CrossValidation-threshold-str", lambda: CrossValidation([], k=5, threshold="4"), TypeError,
     r"^CrossValidation\.threshold must be a real number or None, got str '4'$"),
    ("CrossValidation-threshold-nan", lambda: CrossValidation([], k=5, threshold=math.nan),
     ValueError, r"^CrossValidation\.threshold must be finite or None, got nan$"),
    ("CrossValidation-threshold-without-k", lambda: CrossValidation([], threshold=3.5),
     ValueError, r"^CrossValidation\.threshold=3\.5 needs k \(the folds' ranking figures are "
     r"at k\), got k=None; set k too, or leave threshold None$"),
    ("Recommendations-ids-tuple", lambda: Recommendations(**_recs(ids=(10, "b"))), TypeError,
     r"^Recommendations\.ids must be a list \(one per item\), got tuple$"),
    ("Recommendations-titles-not-str", lambda: Recommendations(**_recs(titles=["x", None])),
     TypeError, r"^Recommendations\.titles must be a list of str, got NoneType at titles\[1\]$"),
    ("Recommendations-index-float", lambda: Recommendations(
        **_recs(index=torch.tensor([3., 1.]))), TypeError,
     r"^Recommendations\.index must be a dense 1-D int64 tensor \(k,\), got torch\.float32$"),
    ("Recommendations-index-list", lambda: Recommendations(**_recs(index=[3, 1])), TypeError,
     r"^Recommendations\.index must be a dense 1-D int64 tensor \(k,\), got list$"),
    ("Recommendations-score-2-D", lambda: Recommendations(**_recs(score=torch.ones(2, 1))),
     TypeError, r"^Recommendations\.score must be a dense 1-D floating tensor \(k,\), got "
     r"torch\.strided tensor of shape \(2, 1\)$"),
    ("Recommendations-rating-sparse", lambda: Recommendations(
        **_recs(rating=torch.tensor([4.6, 4.1]).to_sparse())), TypeError,
     r"^Recommendations\.rating must be a dense 1-D floating tensor \(k,\), got "
     r"torch\.sparse_coo tensor of shape \(2,\)$"),
    ("Recommendations-support-int32", lambda: Recommendations(
        **_recs(support=torch.tensor([20, 31], dtype=torch.int32))), TypeError,
     r"^Recommendations\.support must be a dense 1-D int64 tensor \(k,\), got torch\.int32$"),
    ("Recommendations-lengths", lambda: Recommendations(**_recs(titles=["x"])), ValueError,
     r"^Recommendations fields must have one length k \(one entry per item\), got ids 2, "
     r"index 2, score 2, rating 2, support 2, titles 1$"),
    ("Recommendations-devices", lambda: Recommendations(
        **_recs(score=torch.tensor([4.5, 4.0], device="meta"))), ValueError,
     r"^Recommendations tensors must be on one device, got index on cpu, score on meta, "
     r"rating on cpu, support on cpu$"),
]


@pytest.mark.parametrize("make, error, message", [c[1:] for c in BAD_RECORDS],
                         ids=[c[0] for c in BAD_RECORDS])
def test_a_record_built_by_hand_is_checked(make, error, message):
    with pytest.raises(error, match=message):
        make()


GOOD_RECORDS = {
    "TrainResult-empty": TrainResult,
    "TrainResult": lambda: TrainResult(_history(3), 2, 0.9),
    # (a numpy best_epoch and best_rmse stored as int and float, so torch.load's default
    # loads it; numpy numbers in the history are kept as they came, and that default
    # refuses them: test_a_record_holds_plain_numbers)
    "TrainResult-numpy": lambda: TrainResult([{"epoch": 1, "loss": 0.5}], np.int64(1),
                                             np.float64(0.9)),
    "CrossValidation-empty": CrossValidation,
    "CrossValidation-ranked": lambda: CrossValidation([_fold(**{"ndcg@10": 0.1})], 10, 4),
    "Recommendations": lambda: Recommendations(**_recs()),
    "Recommendations-empty": lambda: Recommendations(
        [], torch.empty(0, dtype=torch.long), torch.empty(0), torch.empty(0, dtype=torch.float64),
        torch.empty(0, dtype=torch.long), []),
}


@pytest.mark.parametrize("name", list(GOOD_RECORDS))
def test_a_valid_record_builds_copies_and_loads(name):
    record = GOOD_RECORDS[name]()
    buf = io.BytesIO()
    torch.save(record, buf)
    buf.seek(0)
    for other in (copy.copy(record), copy.deepcopy(record), pickle.loads(pickle.dumps(record)),
                  torch.load(buf)):
        assert type(other) is type(record) and repr(other) == repr(record)
        assert other == record


def test_a_record_holds_plain_numbers():
    assert TrainResult([{"epoch": np.int64(1), "loss": np.float32(.5)}]).history[0]["loss"] == .5
    result = TrainResult([], np.int64(0), np.float32(0.5))
    cv = CrossValidation([], np.int64(5), np.float32(3.5))
    assert (type(result.best_epoch), type(result.best_rmse)) == (int, float)
    assert (type(cv.k), cv.k, type(cv.threshold), cv.threshold) == (int, 5, float, 3.5)


# (id, make, field, value, error, message): an assignment refused, the record unchanged
BAD_ASSIGNMENTS = [
    ("TrainResult.history-str", lambda: TrainResult(_history(2), 2, 0.9), "history", "x",
     TypeError, r"^TrainResult\.history must be a list of dicts, got str$"),
    ("TrainResult.history-shorter-than-best_epoch", lambda: TrainResult(_history(2), 2, 0.9),
     "history", _history(1), ValueError, r"^TrainResult\.history must hold at least "
     r"best_epoch = 2 epochs, got 1; assign best_epoch first$"),
    ("TrainResult.best_epoch-beyond-history", lambda: TrainResult(_history(2), 2, 0.9),
     "best_epoch", 3, ValueError, r"^TrainResult\.best_epoch must be at most len\(history\) "
     r"= 2 \(an epoch of the history, 0 for none\), got 3$"),
    ("TrainResult.best_epoch-bool", lambda: TrainResult(_history(2), 2, 0.9), "best_epoch",
     True, TypeError, r"^TrainResult\.best_epoch must be a non-negative int, got True$"),
    ("TrainResult.best_rmse-tensor", lambda: TrainResult(_history(2), 2, 0.9), "best_rmse",
     torch.tensor(0.5), TypeError, r"^TrainResult\.best_rmse must be a real number"),
    ("CrossValidation.folds-None", lambda: CrossValidation([_fold()]), "folds", None,
     TypeError, r"^CrossValidation\.folds must be a list of dicts, got NoneType$"),
    ("CrossValidation.folds-value-str", lambda: CrossValidation([_fold()]), "folds",
     [_fold(rmse="x")], TypeError, r"^CrossValidation\.folds\[0\]\['rmse'\] must be a number, "
     r"got str 'x'$"),
    ("CrossValidation.k-float", lambda: CrossValidation([_fold()], 10), "k", 10.0, TypeError,
     r"^CrossValidation\.k must be a positive int, got 10\.0$"),
    ("CrossValidation.k-None-under-a-threshold", lambda: CrossValidation([_fold()], 10, 4.0),
     "k", None, ValueError, r"^CrossValidation\.threshold=4 needs k"),
    ("CrossValidation.threshold-without-k", lambda: CrossValidation([_fold()]), "threshold",
     4.0, ValueError, r"^CrossValidation\.threshold=4 needs k"),
    ("CrossValidation.threshold-inf", lambda: CrossValidation([_fold()], 10), "threshold",
     10 ** 400, ValueError, r"^CrossValidation\.threshold must be finite or None, got 1000"),
]


@pytest.mark.parametrize("make, field, value, error, message",
                         [c[1:] for c in BAD_ASSIGNMENTS], ids=[c[0] for c in BAD_ASSIGNMENTS])
def test_a_record_field_assigned_is_checked_before_the_record_changes(make, field, value, error,
                                                                      message):
    record = make()
    before = dict(vars(record))
    with pytest.raises(error, match=message):
        setattr(record, field, value)
    assert vars(record).keys() == before.keys()
    assert all(getattr(record, key) is value for key, value in before.items())


# (id, make, field, value, stored): an assignment taken, as the constructor takes it
GOOD_ASSIGNMENTS = [
    ("TrainResult.best_epoch-numpy", lambda: TrainResult(_history(2)), "best_epoch",
     np.int64(2), 2),
    ("TrainResult.best_rmse-nan", lambda: TrainResult(_history(2), 1, 0.9), "best_rmse",
     math.nan, math.nan),
    ("TrainResult.history-longer", lambda: TrainResult(_history(2), 2), "history", _history(5),
     _history(5)),
    ("CrossValidation.k-0-d-tensor", lambda: CrossValidation([_fold()]), "k", torch.tensor(5), 5),
    ("CrossValidation.threshold-int", lambda: CrossValidation([_fold()], 5), "threshold", 4, 4.0),
    ("CrossValidation.folds-empty", lambda: CrossValidation([_fold()]), "folds", [], []),
    ("CrossValidation.other-attribute", lambda: CrossValidation(), "note", "x", "x"),
]


@pytest.mark.parametrize("make, field, value, stored", [c[1:] for c in GOOD_ASSIGNMENTS],
                         ids=[c[0] for c in GOOD_ASSIGNMENTS])
def test_a_record_field_assigned_a_valid_value_takes_it(make, field, value, stored):
    record = make()
    setattr(record, field, value)
    got = getattr(record, field)
    assert type(got) is type(stored) and (got == stored or (got != got and stored != stored))


@pytest.mark.parametrize("make, field", [
    (lambda: TrainResult(_history(2), 1, 0.9), "best_rmse"),
    (lambda: TrainResult(_history(2), 1, 0.9), "history"),
    (lambda: CrossValidation([_fold()], 5, 4.0), "threshold"),
    (lambda: CrossValidation([_fold()], 5, 4.0), "folds"),
], ids=["TrainResult.best_rmse", "TrainResult.history", "CrossValidation.threshold",
        "CrossValidation.folds"])
def test_a_record_field_cannot_be_deleted(make, field):
    # deleting the last field also read as a record still in __init__: later assignments
    # went in unchecked
    record = make()
    before = dict(vars(record))
    name = type(record).__name__
    with pytest.raises(AttributeError, match=rf"^cannot delete {name}\.{field}: a {name} "
                                             rf"keeps its fields \[.*\] \(assign a new "
                                             rf"{field} instead\)$"):
        delattr(record, field)
    assert vars(record).keys() == before.keys()
    assert all(getattr(record, k) is v for k, v in before.items())
    with pytest.raises(TypeError, match=rf"^{name}\.{field} must be "):  # still checked
        setattr(record, field, "x")
    record.note = "x"  # another attribute comes and goes as on any object
    del record.note


def test_recommendations_replace_is_checked():
    """A named tuple is never assigned: ``_replace`` (and ``_make``) build a checked one."""
    recs = Recommendations(**_recs())
    assert recs._replace(titles=["a", "b"]).titles == ["a", "b"]
    assert type(Recommendations._make(list(recs))) is Recommendations
    with pytest.raises(ValueError, match=r"^Recommendations fields must have one length k"):
        recs._replace(ids=[10])
    with pytest.raises(TypeError, match=r"^Recommendations\.support must be a dense 1-D int64"):
        Recommendations._make([*recs[:4], torch.tensor([1.5, 2.0]), recs.titles])
    with pytest.raises(AttributeError):
        recs.titles = []  # (a named tuple's field, as before)


def _forged(record, **fields):
    """``record`` with fields set past the checks (as an edited file sets them)."""
    if isinstance(record, tuple):
        return tuple.__new__(type(record), [fields.get(f, getattr(record, f))
                                            for f in record._fields])
    for name, value in fields.items():
        object.__setattr__(record, name, value)
    return record


# (id, record with a forged field, error, message): a file is checked as the constructor
FORGED = [
    ("TrainResult-best_epoch", lambda: _forged(TrainResult(_history(2), 2), best_epoch=7),
     ValueError, r"^TrainResult\.best_epoch must be at most len\(history\) = 2"),
    ("TrainResult-history", lambda: _forged(TrainResult(), history=[{"loss": "nan"}]),
     TypeError, r"^TrainResult\.history\[0\]\['loss'\] must be a number, got str 'nan'$"),
    ("CrossValidation-threshold", lambda: _forged(CrossValidation([_fold()]), threshold=4.0),
     ValueError, r"^CrossValidation\.threshold=4 needs k"),
    ("CrossValidation-k", lambda: _forged(CrossValidation([_fold()]), k=-3),
     ValueError, r"^CrossValidation\.k must be a positive int, got -3$"),
    ("Recommendations-lengths", lambda: _forged(Recommendations(**_recs()), ids=[1, 2, 3]),
     ValueError, r"^Recommendations fields must have one length k \(one entry per item\), got "
     r"ids 3, index 2"),
    ("Recommendations-index-dtype", lambda: _forged(Recommendations(**_recs()),
                                                    index=torch.tensor([0.5, 1.5])),
     TypeError, r"^Recommendations\.index must be a dense 1-D int64 tensor"),
]


@pytest.mark.parametrize("how", RELOADS)
@pytest.mark.parametrize("make, error, message", [c[1:] for c in FORGED],
                         ids=[c[0] for c in FORGED])
def test_a_forged_record_is_refused_when_loaded(make, error, message, how):
    record = make()
    with pytest.raises(error, match=message):
        reload(record, how)


@pytest.mark.parametrize("state, error, message", [
    ({"history": [], "best_epoch": 0}, ValueError,
     r"^a loaded TrainResult's state lacks the fields \['best_rmse'\] \(it holds "
     r"\['best_epoch', 'history'\]\)$"),
    ([1, 2], TypeError, r"^a loaded TrainResult's state must be a dict of its fields, got list$"),
])
def test_a_record_state_without_its_fields_is_refused(state, error, message):
    with pytest.raises(error, match=message):
        TrainResult.__new__(TrainResult).__setstate__(state)
