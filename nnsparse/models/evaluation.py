"""Evaluation as the field does it: k folds, each test part read once, mean and std."""
from __future__ import annotations

import math
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union, cast

import torch

from .._forms import _a, as_choice, as_count
from ..data import Ratings, mean_prediction, read_split, rmse
from ..data.matrix import _check_same_maps
from ..data.readers import _CHOICES, _check_ratings, _check_unique_pairs, \
    _check_unique_pairs_apart, _path, _records_equal
from ..data.split import (_checked_setattr, _checked_state, _refuse_field_delete,
                          _torch_seed)
from ..data.ranking import _checked_threshold
from .base import RatingModel
from .trainer import _check_entries

__all__ = ["kfold", "fold_files", "cross_validate", "CrossValidation"]

_Fold = Tuple[Ratings, Ratings]


def kfold(ratings: Ratings, k: int = 5, seed: int = 0) -> Iterator[_Fold]:
    r"""Seeded random ``k``-fold splits of the ratings: ``(train, test)`` per fold.

    The entries are shuffled once with ``seed``; fold ``j`` tests on the
    ``j``-th of ``k`` near-equal parts and trains on the others.  Every
    rating is tested exactly once.

    Args:
        ratings (Ratings): the whole set; the folds share its id maps.
        k (int): the number of folds (a numpy int or a 0-d integer tensor too, as
            every count of nnsparse).  Default: 5.
        seed (int): the shuffle's seed.  Default: 0.

    Returns:
        Iterator of ``k`` ``(train, test)`` :class:`~nnsparse.data.Ratings` pairs.

    Raises:
        ValueError: ``k`` below 2 or above ``len(ratings)``; a (user, item)
            pair rated more than once (its ratings could be trained on and
            tested).
        TypeError: ``k`` or ``seed`` is not an int (any int is a seed).

    Example::

        >>> r = Ratings.from_triples(range(10), [0] * 10, [3.] * 10)
        >>> [(len(a), len(b)) for a, b in kfold(r, k=5)]
        [(8, 2), (8, 2), (8, 2), (8, 2), (8, 2)]
    """
    _check_ratings(ratings, "ratings")
    k, seed = as_count("k", k, 2), _torch_seed(seed)
    if len(ratings) < k:
        raise ValueError(f"k-fold needs at least k={k} ratings, got {len(ratings)}")
    _check_unique_pairs("ratings", ratings)
    return _kfold(ratings, k, seed)  # checked now, at the call, not at the first fold


def _kfold(ratings: Ratings, k: int, seed: int) -> Iterator[_Fold]:
    # (on the CPU, the generator's device, whatever torch's default device)
    order = torch.randperm(len(ratings), generator=torch.Generator().manual_seed(seed),
                           device="cpu")
    fold_of = torch.empty(len(ratings), dtype=torch.int64, device="cpu")
    fold_of[order] = torch.arange(len(ratings), device="cpu") % k
    for j in range(k):
        test = fold_of == j
        yield ratings.subset(~test), ratings.subset(test)


def fold_files(directory: Union[str, Path], format: str = "auto") -> Iterator[_Fold]:
    r"""The published folds of a directory: ``u1.base``/``u1.test`` ... ``uN.base``/``uN.test``
    (MovieLens-100K), or ``r1.train``/``r1.test`` ... (MovieLens-10M, after its
    ``split_ratings.sh``).

    Each pair is read when its fold starts (:func:`~nnsparse.data.read_split`,
    the test part with the training part's maps), so a fold's test data is
    read once.

    Args:
        directory (str or os.PathLike): holds ``u1.base``, ``u1.test``, ... or
            ``r1.train``, ``r1.test``, ... (not both); ``ua``/``ub`` and ``ra``/``rb``,
            the per-user splits, are no folds and are left out.
        format (str): as :func:`~nnsparse.data.read_split`'s: ``"auto"``
            (default) detects each fold's format from its ``u<N>.base``
            (MovieLens-100K's files read as ``"ml-100k"``) or ``r<N>.train``
            (MovieLens-10M's, ``"ml-1m"``), or one of
            :data:`~nnsparse.data.FORMATS`.

    Returns:
        Iterator of ``(train, test)`` :class:`~nnsparse.data.Ratings` pairs, in
        fold order, for :func:`cross_validate`.

    Raises:
        TypeError: ``directory`` is not a path, ``format`` is not a str.
        ValueError: no directory, or no ``u<N>.base`` with its ``u<N>.test`` nor
            ``r<N>.train`` with its ``r<N>.test``, or both kinds, an unknown
            ``format``; a fold's file as :func:`~nnsparse.data.read_split`.

    Example::

        >>> import tempfile, pathlib
        >>> with tempfile.TemporaryDirectory() as d:
        ...     for n in (1, 2):
        ...         _ = (pathlib.Path(d) / f"u{n}.base").write_text(f"1\t10\t4\t0\n{n}\t20\t5\t0\n")
        ...         _ = (pathlib.Path(d) / f"u{n}.test").write_text("2\t10\t3\t0\n")
        ...     folds = [(len(train), len(test)) for train, test in fold_files(d)]
        >>> folds
        [(2, 1), (2, 1)]
    """
    if not isinstance(directory, (str, os.PathLike)):
        raise TypeError(f"directory must be a str or os.PathLike, got {type(directory).__name__}")
    as_choice(format, "format", _CHOICES)
    directory = _path(directory)
    if not directory.is_dir():
        raise ValueError(f"folds: no directory at {directory}")
    return _read_folds(_fold_pairs(directory), format)  # checked now, not at the first fold


def _read_folds(pairs: List[Tuple[Path, Path]], format: str) -> Iterator[_Fold]:
    for base, test in pairs:
        yield read_split(base, test, format)


#: the published folds' file names: (training file pattern, test file of fold N), of
#: MovieLens-100K (u1.base/u1.test, its mku.sh) and MovieLens-10M (r1.train/r1.test, made
#: by its split_ratings.sh)
_FOLD_NAMES = ((r"u(\d+)\.base", "u{}.test"), (r"r(\d+)\.train", "r{}.test"))


def _fold_pairs(directory: Path) -> List[Tuple[Path, Path]]:
    found: Dict[str, List[Tuple[int, Path, Path]]] = {}
    for base in directory.iterdir():
        for pattern, test_name in _FOLD_NAMES:
            match = re.fullmatch(pattern, base.name)
            if match is None:
                continue
            test = directory / test_name.format(match.group(1))
            if not test.is_file():
                continue
            if not base.is_file():  # (read lazily, it failed at its fold, after the fits)
                raise ValueError(f"folds: {base} must be a rating file, got a "
                                 f"{'directory' if base.is_dir() else 'special file'}")
            found.setdefault(pattern, []).append((int(match.group(1)), base, test))
    if not found:
        raise ValueError(f"folds: {directory} holds no u<N>.base / u<N>.test pair (MovieLens-"
                         f"100K) nor r<N>.train / r<N>.test pair (MovieLens-10M's "
                         f"split_ratings.sh)")
    if len(found) > 1:  # which set of folds is meant would be a guess
        raise ValueError(f"folds: {directory} holds both u<N>.base / u<N>.test and "
                         f"r<N>.train / r<N>.test pairs; give a directory of one set of folds")
    return [(b, t) for _, b, t in sorted(next(iter(found.values())))]


# the keys of a fold that CrossValidation.table prints (what cross_validate records)
_TABLE_KEYS = ("fold", "rmse", "mae", "item_mean_rmse", "fallback", "epochs", "seconds")
# the keys of a fold that CrossValidation.summary reads
_SUMMARY_KEYS = ("rmse", "mae", "item_mean_rmse", "seconds")
# the ranking figures evaluate_ranking returns, as the keys "<name>@<k>", and their titles
_RANKING = (("precision", "precision"), ("recall", "recall"), ("ndcg", "NDCG"),
            ("hit_rate", "hit rate"))


def _ranking_keys(k: int) -> List[str]:
    return [f"{name}@{k}" for name, _ in _RANKING]


#: the fields of :class:`CrossValidation`, in ``__init__``'s order
_CV_FIELDS = ("folds", "k", "threshold")

#: each field of :class:`CrossValidation` checked on its own (the value to store)
_CV_CHECKS: Dict[str, Callable[[Any], Any]] = {
    "folds": lambda v: _check_entries(v, "CrossValidation.folds"),
    "k": lambda v: None if v is None else as_count("CrossValidation.k", v, 1, must="positive"),
    "threshold": lambda v: _checked_threshold(v, "CrossValidation.threshold"),
}


def _check_ranked(k: Optional[int], threshold: Optional[float]) -> None:
    """A ranking's ``threshold`` needs its ``k`` (as :func:`cross_validate` refuses it)."""
    if threshold is not None and k is None:
        raise ValueError(f"CrossValidation.threshold={threshold:g} needs k (the folds' ranking "
                         f"figures are at k), got k=None; set k too, or leave threshold None")


@dataclass
class CrossValidation:
    """Per-fold results and their summary.

    Attributes:
        folds (list of dict): ``fold``, ``rmse``, ``mae``, ``item_mean_rmse``,
            ``fallback`` (test entries predicted by a mean), ``epochs``, ``seconds``;
            with a ranking (``k``), also ``precision@k``, ``recall@k``, ``ndcg@k``,
            ``hit_rate@k`` (the keys carry the value of ``k``, e.g. ``"ndcg@10"``)
            ``ranked_users`` (:meth:`RatingModel.evaluate_ranking`'s ``users``) and
            ``rank_seconds`` (the ranking's time).
        k (int, optional): the length of the ranked lists, or ``None`` (the
            default) when the folds were not ranked.
        threshold (float, optional): the lowest relevant test rating of the ranking,
            ``None``: every test rating is relevant.

    Built by hand, assigned later or loaded from a file (pickle, ``torch.load``), the
    fields are checked as the constructor checks them (a refused assignment leaves the
    record as it was; a field cannot be deleted, ``AttributeError``); what is changed
    inside ``folds`` is checked by the methods that read it.

    Raises:
        TypeError: ``folds`` that is not a list of dicts of str keys and numbers, ``k``
            that is not None or an int, ``threshold`` that is not None or a real number.
        ValueError: ``k`` below 1, ``threshold`` not finite, or given without ``k``.

    Example::

        >>> cv = CrossValidation([dict(fold=1, rmse=0.90, mae=0.70),
        ...                       dict(fold=2, rmse=0.94, mae=0.74)])
        >>> round(cv.mean(), 4), round(cv.std(), 4), round(cv.mean("mae"), 4)
        (0.92, 0.0283, 0.72)
        >>> cv.threshold = 4.0
        Traceback (most recent call last):
            ...
        ValueError: CrossValidation.threshold=4 needs k (the folds' ranking figures are at k), got k=None; set k too, or leave threshold None
    """

    folds: List[Dict[str, Any]] = field(default_factory=list)
    k: Optional[int] = None
    threshold: Optional[float] = None

    def __post_init__(self) -> None:
        # every field checked before any is stored (a numpy int k as an int)
        checked = {name: _CV_CHECKS[name](getattr(self, name)) for name in _CV_FIELDS}
        _check_ranked(checked["k"], checked["threshold"])
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        """A field assigned after construction: the constructor's checks first (a refused
        assignment leaves the record as it was)."""
        _checked_setattr(self, name, value, self._checked, _CV_FIELDS)

    def __delattr__(self, name: str) -> None:
        """A field cannot be deleted (``AttributeError``): the record keeps its fields."""
        _refuse_field_delete(self, name, _CV_FIELDS)

    def _checked(self, name: str, value: Any) -> Any:
        value = _CV_CHECKS[name](value)
        if name == "k":
            _check_ranked(value, self.threshold)
        elif name == "threshold":
            _check_ranked(self.k, value)
        return value

    def __setstate__(self, state: Any) -> None:
        """Unpickling (``pickle``, ``copy``, ``torch.load``): the constructor's checks; a
        file from before ``k`` and ``threshold`` loads unranked."""
        _checked_state(self, state, ("folds",), {"k": None, "threshold": None})

    def __eq__(self, other: object) -> bool:
        """The same fields, NaN equal to NaN (a fold's figure that is NaN): a record equals
        its copy and its reload (the dataclass's ``==`` found a reloaded CrossValidation
        unequal to itself when a fold's figure was NaN).  Unhashable, as a dataclass that
        is not frozen."""
        return cast(bool, _records_equal(self, other, _CV_FIELDS))

    __hash__ = None  # type: ignore[assignment]

    def mean(self, key: str = "rmse") -> float:
        """Mean over the folds of ``key`` (``"rmse"``, ``"mae"``, ...)."""
        if not self.folds:
            raise ValueError("CrossValidation holds no folds; run cross_validate first")
        self._check_folds()
        if not isinstance(key, str) or key not in self.folds[0]:
            raise KeyError(f"key must be one of {sorted(self.folds[0])}, got {key!r}")
        for i, f in enumerate(self.folds):  # built by hand: "unsupported operand", KeyError
            if key not in f:
                raise ValueError(f"folds[{i}] lacks {key!r}, which folds[0] holds")
        return float(sum(f[key] for f in self.folds) / len(self.folds))

    def _check_folds(self) -> None:
        """``folds`` a list of dicts of numbers, as the constructor checks it: what was
        changed inside it since (a fold appended or edited) is not seen by an assignment
        (a hand-built one gave "argument of type 'int' is not iterable")."""
        _check_entries(self.folds, "CrossValidation.folds")

    def _check_keys(self, method: str, needed: List[str]) -> None:
        """Every fold holds the keys ``method`` reads (a hand-built one may not: it gave
        mean()'s KeyError, which named a key the caller never passed)."""
        if not self.folds:  # (no folds: mean() says so)
            return
        self._check_folds()
        for i, f in enumerate(self.folds):
            lacks = [k for k in needed if k not in f]
            if lacks:
                raise ValueError(f"{method} needs the keys {needed} in every fold "
                                 f"(cross_validate's), folds[{i}] lacks {lacks}")

    def std(self, key: str = "rmse") -> float:
        """Sample standard deviation over the folds (0 for one fold)."""
        m = self.mean(key)  # refuses no folds and unknown keys
        if len(self.folds) < 2:
            return 0.0
        return math.sqrt(sum((f[key] - m) ** 2 for f in self.folds) / (len(self.folds) - 1))

    def ranking_keys(self) -> List[str]:
        """The ranking figures' keys of the folds: ``["precision@k", "recall@k", "ndcg@k",
        "hit_rate@k"]`` with the value of :attr:`k`, ``[]`` without a ranking."""
        if self.k is None:  # (k an int otherwise: checked when set, as folds and threshold)
            return []
        return _ranking_keys(self.k)

    def summary(self) -> Dict[str, Any]:
        """The mean and std over the folds of every figure, as plain values (for JSON).

        Returns:
            dict: ``{"folds": n, "rmse": mean, "rmse_std": std, "mae", "mae_std",
            "item_mean_rmse", "seconds"}``; with a ranking also ``"k"``,
            ``"threshold"``, and the mean and ``_std`` of each ranking figure
            (``"ndcg@10"``, ``"ndcg@10_std"``, ...).

        Raises:
            ValueError: no folds; a fold lacking one of ``rmse``, ``mae``,
                ``item_mean_rmse``, ``seconds`` (and with :attr:`k` the ranking
                figures), which :func:`cross_validate` records: the message names them.
            TypeError: as :meth:`mean`'s.

        Example::

            >>> cv = CrossValidation([dict(fold=1, rmse=0.90, mae=0.70, item_mean_rmse=1.0,
            ...                            seconds=2.0),
            ...                       dict(fold=2, rmse=0.94, mae=0.74, item_mean_rmse=1.0,
            ...                            seconds=4.0)])
            >>> s = cv.summary()
            >>> s["folds"], round(s["rmse"], 4), round(s["rmse_std"], 4), s["seconds"]
            (2, 0.92, 0.0283, 3.0)
        """
        keys = self.ranking_keys()
        self._check_keys("summary", list(_SUMMARY_KEYS) + keys)
        out: Dict[str, Any] = {"folds": len(self.folds)}
        for key in ("rmse", "mae"):
            out[key], out[f"{key}_std"] = self.mean(key), self.std(key)
        out["item_mean_rmse"], out["seconds"] = self.mean("item_mean_rmse"), self.mean("seconds")
        if keys:
            out["k"], out["threshold"] = self.k, self.threshold
            for key in keys:
                out[key], out[f"{key}_std"] = self.mean(key), self.std(key)
        return out

    def table(self) -> str:
        """A Markdown table: one line per fold, then mean ± std (with a ranking, its four
        figures at ``k`` in the last columns)."""
        ranking = self.ranking_keys()
        self._check_keys("table", list(_TABLE_KEYS) + ranking)
        titles = "".join(f" {title}@{self.k} |" for _, title in _RANKING) if ranking else ""
        lines = ["| fold | RMSE | MAE | item mean RMSE | fallback | epochs | seconds |" + titles,
                 "|---|---|---|---|---|---|---|" + "---|" * len(ranking)]
        for f in self.folds:
            lines.append(f"| {f['fold']} | {f['rmse']:.4f} | {f['mae']:.4f} | "
                         f"{f['item_mean_rmse']:.4f} | {f['fallback']} | {f['epochs']} | "
                         f"{f['seconds']:.1f} |" + "".join(f" {f[k]:.4f} |" for k in ranking))
        lines.append(f"| mean ± std | {self.mean():.4f} ± {self.std():.4f} | "
                     f"{self.mean('mae'):.4f} ± {self.std('mae'):.4f} | "
                     f"{self.mean('item_mean_rmse'):.4f} | | | {self.mean('seconds'):.1f} |"
                     + "".join(f" {self.mean(k):.4f} ± {self.std(k):.4f} |" for k in ranking))
        return "\n".join(lines)


def _check_fold(number: int, train: Ratings, test: Ratings) -> None:
    """A fold's test part: not empty, indexed as its train part, and sharing no
    (user, item) pair with it (a pair in both is scored on a rating it trained on)."""
    if len(test) == 0:
        raise ValueError(f"fold {number}'s test holds no ratings; there is nothing to score")
    _check_same_maps(test, train, f"fold {number}'s test", f"fold {number}'s train")
    # the test part alone first: a repeat of its own is named with its maps (it may
    # hold ids the train part's maps lack)
    _check_unique_pairs(f"fold {number}'s test", test)
    _check_unique_pairs_apart(f"fold {number}'s train", train,
                              f"fold {number}'s train and test together", test)


def cross_validate(make_model: Callable[[], RatingModel], folds: Iterable[_Fold], *,
                   features: Optional[Callable[[Ratings], Optional[torch.Tensor]]] = None,
                   device: Union[str, torch.device] = "cpu", progress: Optional[bool] = None,
                   verbose: bool = False, k: Optional[int] = None,
                   threshold: Optional[float] = None) -> CrossValidation:
    r"""Fit a fresh model per fold on its training part; score it once on its test part.

    The test part is used for nothing but the score: the number of epochs
    is chosen on a validation split of the training part (the model's
    ``validation_ratio``).  With ``k``, each fold's model also ranks its test
    part, :meth:`RatingModel.evaluate_ranking`'s full-ranking protocol (every
    item less the user's training items; ``threshold`` as there), after the
    RMSE.

    Args:
        make_model: returns a new, unfitted model (e.g. ``lambda: AutoRec()``).
        folds: ``(train, test)`` pairs sharing id maps: :func:`kfold` or
            :func:`fold_files`.
        features: optional ``train -> (rows, f)`` side features for CFN++.
        device, progress, verbose: passed to ``fit`` (``progress`` to
            ``evaluate_ranking`` too).
        k (int, optional): rank each fold's test part, top-``k`` lists;
            ``None``: no ranking (RMSE and MAE only).  Default: ``None``.
        threshold (float, optional): with ``k``, the lowest relevant test rating;
            ``None``: every test rating is relevant.  Default: ``None``.

    Returns:
        CrossValidation: per fold RMSE, MAE, the item-mean baseline, fallback
        count, epochs and seconds, and with ``k`` ``precision@k``, ``recall@k``,
        ``ndcg@k``, ``hit_rate@k``, ``ranked_users`` and ``rank_seconds``;
        ``.table()`` prints them
        with mean ± std, ``.summary()`` gives the means and stds as a dict.

    Raises:
        TypeError: ``make_model`` is a model instead of a function, or not
            callable, or returns no :class:`RatingModel`; ``features`` is not
            callable; ``folds`` is not iterable or yields no ``(train, test)``
            pairs of :class:`~nnsparse.data.Ratings`; ``k`` not an int or None,
            ``threshold`` not a real number or None.
        ValueError: ``k`` below 1, ``threshold`` not finite or given without ``k``
            (checked before any fold); a fold that is not a pair, whose test part
            is empty, does not share the train part's id maps, repeats a (user,
            item) pair or shares one with the train part, or (with ``threshold``)
            holds no rating reaching ``threshold`` (checked before its fit);
            ``fit``'s refusals.

    Example::

        >>> from nnsparse.data import synthetic_ratings
        >>> from nnsparse.models import AutoRec
        >>> r = synthetic_ratings(0, 60, 50, 1200)
        >>> cv = cross_validate(lambda: AutoRec(hidden=8, epochs=2, validation_ratio=0.0),
        ...                     kfold(r, k=3), progress=False)
        >>> len(cv.folds), cv.mean() > 0
        (3, True)
    """
    if isinstance(make_model, RatingModel):
        raise TypeError(f"make_model must be a function returning a new model per fold "
                        f"(e.g. lambda: AutoRec()), got an instance of {type(make_model).__name__}")
    if not callable(make_model):
        raise TypeError(f"make_model must be callable (e.g. lambda: AutoRec()), got "
                        f"{type(make_model).__name__}")
    if features is not None and not callable(features):
        raise TypeError(f"features must be None or callable (train -> Tensor), got "
                        f"{type(features).__name__}")
    if k is not None:
        k = as_count("k", k, 1, must="positive")
    given = threshold
    threshold = _checked_threshold(threshold)  # (evaluate_ranking's check)
    if threshold is not None and k is None:  # refused, not ignored: it would change nothing
        raise ValueError(f"threshold={given} needs k: without k the folds are not "
                         f"ranked (pass k=10, say, or leave threshold None)")
    try:
        folds = iter(folds)
    except TypeError:
        raise TypeError(f"folds must be an iterable of (train, test) pairs, got "
                        f"{type(folds).__name__}") from None
    result = CrossValidation(k=k, threshold=threshold)
    for number, fold in enumerate(folds, start=1):
        if not isinstance(fold, (tuple, list)):
            raise TypeError(f"folds must yield (train, test) pairs, got "
                            f"{type(fold).__name__} at fold {number}")
        if len(fold) != 2:
            raise ValueError(f"folds must yield (train, test) pairs, got "
                             f"{_a(type(fold).__name__)} of {len(fold)} at fold {number}")
        train, test = fold
        _check_ratings(train, f"fold {number}'s train")
        _check_ratings(test, f"fold {number}'s test")
        _check_fold(number, train, test)  # before the fit, not after it (or never)
        if threshold is not None and not float(test.rating.detach().max()) >= threshold:
            raise ValueError(f"fold {number}'s test holds no rating reaching threshold="
                             f"{threshold:g} (the highest is {float(test.rating.max()):g}), "
                             f"so no user has a relevant item to rank")
        model = make_model()
        if not isinstance(model, RatingModel):
            raise TypeError(f"make_model must return a RatingModel, got {type(model).__name__}")
        feats = features(train) if features is not None else None
        model.fit(train, features=feats, device=device, progress=progress, verbose=verbose)
        scores = model.evaluate(test)
        baseline = float(rmse(mean_prediction(train, test, by="item"), test.rating))
        row = dict(fold=number, rmse=scores["rmse"], mae=scores["mae"],
                   item_mean_rmse=baseline, fallback=scores["fallback"],
                   epochs=model.best_epoch, seconds=model.fit_seconds)
        ranked = ""
        if k is not None:
            start = time.perf_counter()
            ranking = model.evaluate_ranking(test, k, threshold=threshold, progress=progress)
            row.update({key: ranking[key] for key in _ranking_keys(k)},
                       ranked_users=ranking["users"], rank_seconds=time.perf_counter() - start)
            ranked = f", NDCG@{k} {ranking[f'ndcg@{k}']:.4f}"
        result.folds.append(row)
        if verbose:
            print(f"fold {number}: RMSE {scores['rmse']:.4f}{ranked} "
                  f"({model.fit_seconds:.1f} s)")
    if not result.folds:
        raise ValueError("folds is empty")
    return result
