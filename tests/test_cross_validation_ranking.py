"""cross_validate(..., k=, threshold=): each fold's ranking is evaluate_ranking's on its test
part; CrossValidation's mean ± std, table and summary of them; the arguments' refusals."""
import json
import math
import statistics

import pytest
import torch

from nnsparse.data import synthetic_ratings
from nnsparse.models import AutoRec, CrossValidation, KernelNet, cross_validate, kfold

RANKING = ("precision", "recall", "ndcg", "hit_rate")


@pytest.fixture(scope="module")
def folds():
    return list(kfold(synthetic_ratings(0, 60, 50, 1200), k=3, seed=0))


def _run(folds, cls, orientation="item", **kw):
    """cross_validate, keeping each fold's fitted model."""
    models = []

    def make():
        models.append(cls(hidden=8, epochs=1, validation_ratio=0.0, orientation=orientation))
        return models[-1]
    return cross_validate(make, folds, progress=False, **kw), models


@pytest.mark.parametrize("cls, orientation, k, threshold", [
    (AutoRec, "item", 5, None),
    (AutoRec, "user", 10, 4.0),
    (KernelNet, "item", 3, 4),
    (KernelNet, "user", 100, None),  # k above the items: every candidate
])
def test_each_fold_ranks_as_evaluate_ranking(folds, cls, orientation, k, threshold):
    cv, models = _run(folds, cls, orientation, k=k, threshold=threshold)
    assert (cv.k, cv.threshold) == (k, None if threshold is None else float(threshold))
    keys = [f"{name}@{k}" for name in RANKING]
    assert cv.ranking_keys() == keys
    for fold, model, (_, test) in zip(cv.folds, models, folds):
        expected = model.evaluate_ranking(test, k, threshold=threshold, progress=False)
        assert {key: fold[key] for key in keys} == {key: expected[key] for key in keys}
        assert fold["ranked_users"] == expected["users"] and fold["rank_seconds"] >= 0
        assert fold["rmse"] == model.evaluate(test)["rmse"]  # the RMSE as before
    for key in keys:
        values = [f[key] for f in cv.folds]
        assert cv.mean(key) == pytest.approx(statistics.mean(values), abs=1e-15)
        assert cv.std(key) == pytest.approx(statistics.stdev(values), abs=1e-15)
    summary = cv.summary()
    assert summary["k"] == k and summary["threshold"] == cv.threshold and summary["folds"] == 3
    for key in keys:
        assert (summary[key], summary[f"{key}_std"]) == (cv.mean(key), cv.std(key))
    json.dumps(summary)  # plain values
    lines = cv.table().splitlines()
    assert lines[0].endswith(f"| seconds | precision@{k} | recall@{k} | NDCG@{k} | "
                             f"hit rate@{k} |")
    assert lines[1] == "|---" * 11 + "|"
    first = cv.folds[0]
    assert lines[2].endswith(" | " + " | ".join(f"{first[key]:.4f}" for key in keys) + " |")
    assert lines[-1].endswith(" | " + " | ".join(
        f"{cv.mean(key):.4f} ± {cv.std(key):.4f}" for key in keys) + " |")


def test_no_k_no_ranking(folds):
    """The default: the folds' keys, the table and the summary as before (nothing ranked)."""
    cv, _ = _run(folds[:2], AutoRec)
    assert cv.k is None and cv.ranking_keys() == []
    assert all(sorted(f) == sorted(["fold", "rmse", "mae", "item_mean_rmse", "fallback",
                                    "epochs", "seconds"]) for f in cv.folds)
    assert cv.table().splitlines()[0] == (
        "| fold | RMSE | MAE | item mean RMSE | fallback | epochs | seconds |")
    assert sorted(cv.summary()) == sorted(["folds", "rmse", "rmse_std", "mae", "mae_std",
                                           "item_mean_rmse", "seconds"])


def test_a_hand_built_ranking_lacking_its_keys_is_named():
    cv = CrossValidation([dict(fold=1, rmse=1.0, mae=1.0, item_mean_rmse=1.0, fallback=0,
                               epochs=1, seconds=1.0)], k=10)
    with pytest.raises(ValueError, match=r"folds\[0\] lacks \['precision@10', 'recall@10', "
                                         r"'ndcg@10', 'hit_rate@10'\]"):
        cv.table()
    # (refused by the constructor since session 24, in cross_validate's words for its k)
    with pytest.raises(TypeError, match="CrossValidation.k must be a positive int, got '10'"):
        CrossValidation([], k="10")


@pytest.mark.parametrize("folds, k, lacks", [
    # the class docstring's own folds: mean() reads them, summary() needs two keys more
    ([dict(fold=1, rmse=0.9, mae=0.7), dict(fold=2, rmse=0.94, mae=0.74)], None,
     r"folds\[0\] lacks \['item_mean_rmse', 'seconds'\]"),
    ([dict(rmse=0.9, mae=0.7, item_mean_rmse=1.0, seconds=1.0), dict(rmse=0.9)], None,
     r"folds\[1\] lacks \['mae', 'item_mean_rmse', 'seconds'\]"),
    ([dict(rmse=0.9, mae=0.7, item_mean_rmse=1.0, seconds=1.0, **{"ndcg@5": 0.1})], 5,
     r"folds\[0\] lacks \['precision@5', 'recall@5', 'hit_rate@5'\]"),
], ids=["the-docstring-folds", "a-fold-short", "ranked-short"])
def test_a_hand_built_summary_names_the_keys_it_lacks(folds, k, lacks):
    """summary() of a CrossValidation built by hand: a ValueError naming the keys a fold
    lacks, as table()'s (was: mean()'s KeyError "key must be one of ..., got
    'item_mean_rmse'", a key the caller never passed)."""
    cv = CrossValidation(folds, k=k)
    with pytest.raises(ValueError, match=r"summary needs the keys \['rmse', 'mae', "
                                         r"'item_mean_rmse', 'seconds'.*\] in every fold "
                                         r"\(cross_validate's\), " + lacks):
        cv.summary()


def test_a_hand_built_summary_with_the_keys_works():
    cv = CrossValidation([dict(rmse=0.9, mae=0.7, item_mean_rmse=1.0, seconds=2.0),
                          dict(rmse=0.94, mae=0.74, item_mean_rmse=1.0, seconds=4.0)])
    s = cv.summary()  # no "fold", "fallback" nor "epochs": summary reads none of them
    assert (s["folds"], s["rmse"], s["mae"], s["seconds"]) == (2, cv.mean(), cv.mean("mae"), 3.0)
    with pytest.raises(ValueError, match="CrossValidation holds no folds"):
        CrossValidation().summary()


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(k=0), ValueError, "k must be a positive int, got 0"),
    (dict(k=2.0), TypeError, "k must be a positive int, got 2.0"),
    (dict(k="10"), TypeError, "k must be a positive int, got '10'"),
    (dict(k=True), TypeError, "k must be a positive int, got True"),
    (dict(threshold=4.0), ValueError, "threshold=4.0 needs k: without k the folds are not "
                                      "ranked (pass k=10, say, or leave threshold None)"),
    (dict(k=10, threshold="4"), TypeError, "threshold must be a real number or None, got str '4'"),
    (dict(k=10, threshold=math.nan), ValueError, "threshold must be finite or None, got nan"),
    # beyond float's range: refused as evaluate_ranking refuses it (was: OverflowError)
    (dict(k=10, threshold=10 ** 400), ValueError, "threshold must be finite or None, got 1000"),
    (dict(k=10, threshold=torch.tensor(4.0)), TypeError,
     "threshold must be a real number or None, got Tensor"),
    # checked per fold before its fit: fold 1 trains nothing when no rating reaches it
    (dict(k=10, threshold=5.5), ValueError, "fold 1's test holds no rating reaching "
     "threshold=5.5 (the highest is 5), so no user has a relevant item to rank"),
])
def test_argument_errors_before_any_fit(folds, kwargs, error, message):
    made = []
    with pytest.raises(error) as info:
        cross_validate(lambda: made.append(1) or AutoRec(hidden=8, epochs=1), folds,
                       progress=False, **kwargs)
    assert message in str(info.value)
    assert made == []  # no model was made, none trained


def test_one_pass_folds_rank_as_a_list(folds):
    """A generator of folds (read once, as fold_files' is) gives the list's figures."""
    listed, _ = _run(folds[:2], AutoRec, k=5)
    once, _ = _run((fold for fold in folds[:2]), AutoRec, k=5)
    keys = ["fold", "rmse", "mae", "ranked_users"] + listed.ranking_keys()
    assert [[f[key] for key in keys] for f in once.folds] == \
           [[f[key] for key in keys] for f in listed.folds]


def test_a_cross_validation_pickled_before_k_loads_unranked():
    """A CrossValidation pickled (or torch.saved) before the k and threshold fields: its
    state holds only folds; it loads with k=None and prints the table it printed (its
    missing fields filled, session 24: an assignment to them is then checked)."""
    import pickle
    old = CrossValidation([dict(fold=1, rmse=0.9, mae=0.7, item_mean_rmse=1.0, fallback=0,
                                epochs=3, seconds=1.5)])
    table = old.table()
    del old.__dict__["k"], old.__dict__["threshold"]  # what an older nnsparse pickled
    loaded = pickle.loads(pickle.dumps(old))
    assert vars(loaded) == {"folds": old.folds, "k": None, "threshold": None}
    assert (loaded.k, loaded.threshold, loaded.ranking_keys()) == (None, None, [])
    assert loaded.table() == table and loaded.summary()["rmse"] == 0.9
    assert loaded == CrossValidation(old.folds)
