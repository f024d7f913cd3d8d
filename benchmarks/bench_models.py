"""The difficulty ladder of the synthetic default: baselines beside nnsparse.models.

On MovieLens-100K (u1.base -> u1.test) the field's ladder is: item mean
1.035, a biased matrix factorisation about 0.93, a 30-line dense I-AutoRec
0.911.  This script prints the same rungs on the synthetic default
(:func:`nnsparse.data.synthetic_ratings`, 80 % train / 20 % test, like the
u-splits) with nnsparse's models next to them, each with its defaults
(their number of epochs chosen on a validation split of the training part,
then a refit on all of it; the test part is only scored).

Beside the RMSE, each row gets its top-``k`` ranking figures (precision, recall,
NDCG and hit rate at ``--k``, default 10) under :meth:`RatingModel.evaluate_ranking`'s
full-ranking protocol: every item a candidate less the user's training items, ties
to the smaller item index; every test rating relevant, and with ``--rank-threshold
T`` the same four again with only the test ratings ``>= T`` relevant.  The models'
figures are ``evaluate_ranking``'s; the baselines' are computed here by the same
protocol (:func:`_rank_baseline`): the item mean ranked raw, and a ranking-only
baseline, most popular (items by their number of training ratings).  The two
``_baselines.py`` rows predict only the test pairs, so they have no ranking figures.
The seconds are the fit and the prediction of the test pairs, not the ranking.
A ``--test`` rating of a pair that ``--train`` rates too counts in the RMSE but is
left out of the ranking, with a note, by ``examples/movielens_autoencoder.py``'s own
``ranked_part`` (no ranking columns when every test pair is one).

Run:  python benchmarks/bench_models.py                 # every row, 2 threads
      python benchmarks/bench_models.py --quick         # small data, few epochs (a smoke run)
      python benchmarks/bench_models.py --models autorec cfn++
      python benchmarks/bench_models.py --train ml-100k/u1.base --test ml-100k/u1.test
                                                        # the same rows on real files
      python benchmarks/bench_models.py --k 20 --rank-threshold 4
                                                        # lists of 20; also relevant = >= 4 stars

With ``--train``/``--test`` the rows are measured on those files instead, in the
format ``--format`` names (default ``auto``: detected from the training file, as
:func:`nnsparse.data.detect_format` does); CFN++ reads the item genres next to the
training file in that format: ``u.item``, ``movies.dat``.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, List, Optional, Tuple

import torch

from nnsparse.data import (FORMATS, Ratings, detect_format, mean_prediction,
                           read_item_features, read_split, rmse, split_ratings)
from nnsparse.data import synthetic_item_features, synthetic_ratings
from nnsparse.data import ranking_metrics
from nnsparse.models import CFN, AutoRec, GLocalK, KernelNet

from _baselines import biased_mf, dense_autorec  # this script's folder, on sys.path

ZOO = {"autorec": (AutoRec, False), "cfn": (CFN, False), "cfn++": (CFN, True),
       "sparsefc": (KernelNet, False), "glocalk": (GLocalK, False)}


#: a row: (test RMSE, or None for a ranking-only baseline; seconds to fit and predict;
#: the ranking figures, keyed as evaluate_ranking's, with " >=T" after the keys of the
#: --rank-threshold run; empty where not computed)
Row = Tuple[Optional[float], float, Dict[str, float]]
_METRICS = ("precision", "recall", "ndcg", "hit_rate")
_HEADERS = {"precision": "precision@{k}", "recall": "recall@{k}", "ndcg": "NDCG@{k}",
            "hit_rate": "hit rate@{k}"}


def _timed(run: Callable[[], torch.Tensor], test: Ratings) -> Tuple[float, float]:
    start = time.perf_counter()
    pred = run()
    return float(rmse(pred, test.rating)), time.perf_counter() - start


def _rank_baseline(train: Ratings, test: Ratings, score: torch.Tensor, k: int,
                   threshold: Optional[float] = None, chunk: int = 1024) -> Dict[str, float]:
    """The ranking figures of one score per item, the same for every user, by
    :meth:`RatingModel.evaluate_ranking`'s protocol (``nnsparse/models/_ranking.py``).

    Evaluated: the users with a relevant test rating (every test rating, or those
    ``>= threshold``).  Candidates: every item of the id maps (``max(train.n_items,
    test.n_items)``, as evaluate_ranking's ``max(test.n_items, fitted items)``) less the
    user's training items.  Order: score descending, ties to the smaller item index
    (a stable sort of the items in index order).  ``precision = hits / k``, ``recall =
    hits / n_relevant``, NDCG with a ``1 / log2(place + 1)`` discount over the places of
    the user's candidates and the ideal DCG over ``min(n_relevant, k, items)`` places,
    hit rate 1 when any hit; means over the users.  ``score``: ``(items,)``."""
    n_items = max(train.n_items, test.n_items)
    if score.shape != (n_items,):
        raise ValueError(f"score must have shape ({n_items},), got {tuple(score.shape)}")
    user = test.user if threshold is None else test.user[test.rating >= threshold]
    users = torch.unique(user)  # sorted: the evaluated users, row j of the lists users[j]
    if users.shape[0] == 0:  # (ranking_metrics' refusal: nothing to rank, or none relevant)
        return ranking_metrics(torch.full((0, min(k, n_items)), -1), test, k,
                               threshold=threshold, users=users)
    order = score.double().argsort(descending=True, stable=True)  # ties: smaller index
    train_at = torch.searchsorted(users, train.user).clamp(max=users.shape[0] - 1)
    train_in = users[train_at] == train.user  # training ratings of evaluated users
    tops = []  # each evaluated user's list, -1 where it is shorter than k
    for start in range(0, users.shape[0], chunk):
        stop = min(start + chunk, users.shape[0])
        seen = torch.zeros(stop - start, n_items, dtype=torch.bool)
        t = train_in & (train_at >= start) & (train_at < stop)
        seen[train_at[t] - start, train.item[t]] = True
        candidate = ~seen[:, order]  # in ranking order
        place = candidate.long().cumsum(1)  # 1-based place among the user's candidates
        row, at = (candidate & (place <= k)).nonzero(as_tuple=True)
        top = torch.full((stop - start, min(k, n_items)), -1, dtype=torch.int64)
        top[row, place[row, at] - 1] = order[at]
        tops.append(top)
    # scored as evaluate_ranking scores its lists (nnsparse.data.ranking_metrics)
    return ranking_metrics(torch.cat(tops), test, k, threshold=threshold,
                           users=users)  # show() drops "users"


def _baseline_scores(train: Ratings, test: Ratings) -> Dict[str, torch.Tensor]:
    """The baselines' score of each item: the item mean (the global mean for an item
    without training ratings, as :func:`mean_prediction`) and the training count."""
    n_items = max(train.n_items, test.n_items)
    rating = train.rating.to(torch.float64)
    count = torch.bincount(train.item, minlength=n_items).to(torch.float64)
    total = torch.zeros(n_items, dtype=torch.float64).index_add_(0, train.item, rating)
    mean = torch.where(count > 0, total / count.clamp(min=1), rating.mean())
    return {"item mean": mean, "most popular": count}


def main(argv: List[str] = None) -> Dict[str, Row]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true",
                   help="300 users x 400 items, 15k ratings, few epochs: checks the script runs")
    p.add_argument("--models", nargs="*", default=sorted(ZOO), choices=sorted(ZOO))
    p.add_argument("--no-baselines", action="store_true")
    p.add_argument("--train", help="a training rating file (with --test): real data")
    p.add_argument("--test", help="its test file")
    p.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                   help="the files' format (default: auto, detected from --train)")
    p.add_argument("--k", type=int, default=10,
                   help="the length of the ranked lists of the ranking columns (default 10)")
    p.add_argument("--rank-threshold", type=float, default=None,
                   help="also the ranking columns with only the test ratings >= this relevant")
    p.add_argument("--recommend", type=int, default=42,
                   help="print this user's top 10 by the best nnsparse model (-1: none)")
    args = p.parse_args(argv)
    if args.k < 1:
        p.error(f"--k must be a positive int, got {args.k}")
    if args.rank_threshold is not None and not math.isfinite(args.rank_threshold):
        p.error(f"--rank-threshold must be finite, got {args.rank_threshold}")
    if (args.train is None) != (args.test is None):
        p.error("--train and --test go together")
    if args.train is not None and args.format == "auto":
        # a concrete format: the side files (u.item, movies.dat) are that format's.  (No
        # advice to give --format: a file detect_format refuses, missing, empty, compressed
        # or of comma-separated fields that are not 3 or 4, no format reads.)
        try:
            args.format = detect_format(args.train)
        except (ValueError, OSError) as error:
            p.error(f"--train: {str(error).removeprefix('path: ')}")
    torch.set_num_threads(args.threads)
    if args.train is not None:
        train, test = read_split(args.train, args.test, args.format)
        print(f"{args.train} -> {args.test}: {len(train)} / {len(test)} ratings, "
              f"{train.n_users} users x {train.n_items} items; {args.threads} threads")
    else:
        train, test = _synthetic(args)
    ranked, note = _ranked_part(train, test) if args.train is not None else (test, None)
    if note is not None:
        print(note)
    if ranked is None:  # (every test pair is rated in --train too: no ranking columns)
        ranked = test.subset(torch.zeros(len(test), dtype=torch.bool))
    mf, dense, zoo = (dict(epochs=5), dict(epochs=10), dict(epochs=5, patience=5)) \
        if args.quick else ({}, {}, {})
    rows: Dict[str, Row] = {}
    ranks: List[Optional[float]] = [] if len(ranked) == 0 else [None]
    if ranks and args.rank_threshold is not None:
        top = float(ranked.rating.max())
        if top >= args.rank_threshold:
            ranks.append(args.rank_threshold)
        else:  # (evaluate_ranking would refuse it: no user has a relevant item)
            print(f"ranking: no test rating to rank reaches --rank-threshold "
                  f"{args.rank_threshold:g} (the highest is {top:g}), no columns for it")
    keys = [f"{m}@{args.k}" + ("" if t is None else f" >={t:g}") for t in ranks for m in _METRICS]
    heads = [_HEADERS[m].format(k=args.k) + ("" if t is None else f", relevant >= {t:g}")
             for t in ranks for m in _METRICS]
    print("| " + " | ".join(["model", "test RMSE", "seconds"] + heads) + " |\n"
          + "|---" * (3 + len(heads)) + "|")

    def show(name: str, result: Tuple[Optional[float], float],
             ranking: Optional[Callable[[Optional[float]], Dict[str, float]]] = None) -> None:
        figures: Dict[str, float] = {}
        if ranking is not None:
            for t in ranks:
                suffix = "" if t is None else f" >={t:g}"
                figures.update({key + suffix: v for key, v in ranking(t).items()
                                if key != "users"})
        rows[name] = (result[0], result[1], figures)
        cells = ["" if result[0] is None else f"{result[0]:.4f}", f"{result[1]:.1f}"]
        cells += [f"{figures[key]:.4f}" if key in figures else "" for key in keys]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)

    scores = _baseline_scores(train, test)
    show("item mean", _timed(lambda: mean_prediction(train, test, by="item"), test),
         lambda t: _rank_baseline(train, ranked, scores["item mean"], args.k, t))
    show("most popular (ranking only)", (None, 0.0),
         lambda t: _rank_baseline(train, ranked, scores["most popular"], args.k, t))
    if not args.no_baselines:
        show("biased MF (_baselines.py)", _timed(lambda: biased_mf(train, test, **mf), test))
        show("dense I-AutoRec (_baselines.py)",
             _timed(lambda: dense_autorec(train, test, **dense), test))
    fitted = {}
    for name in args.models:
        cls, uses_features = ZOO[name]
        features = _features(args, train) if uses_features else None
        # (--quick: GLocalK's fine-tuning as short as its pre-training)
        extra = dict(global_epochs=5) if args.quick and cls is GLocalK else {}
        model = fitted[name] = cls(**zoo, **extra)
        show(f"nnsparse.models {name}", _timed(
            lambda: model.fit(train, features=features, verbose=False,
                              progress=False).predict(test), test),
             lambda t: model.evaluate_ranking(ranked, args.k, threshold=t, progress=False))
    if fitted and args.recommend >= 0 and args.train is None:
        best = min(fitted, key=lambda n: rows[f"nnsparse.models {n}"][0])
        _show_recommendations(fitted[best], best, args.recommend)
    return rows


def _example(name: str) -> ModuleType:
    """``examples/<name>.py`` as a module (the examples are scripts, not a package): its
    ``main`` is not run."""
    path = Path(__file__).resolve().parent.parent / "examples" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"_bench_models_{name}", path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


#: the test ratings a ranking scores, and the note on those left out: the example's own
#: (a test pair the training file rates too could never be a hit, and evaluate_ranking
#: refuses it; read_split only warns of it), so the two scripts rank the same part
_ranked_part = _example("movielens_autoencoder").ranked_part


def _synthetic(args: argparse.Namespace) -> Tuple[Ratings, Ratings]:
    if args.quick:
        ratings = synthetic_ratings(args.seed, n_users=300, n_items=400, n_ratings=15_000)
    else:
        ratings = synthetic_ratings(args.seed)
    print(f"synthetic_ratings(seed={args.seed}): {len(ratings)} ratings, {ratings.n_users} users "
          f"x {ratings.n_items} items; 80/20 split; {args.threads} threads")
    train, test = split_ratings(ratings, 0.2, seed=args.seed)
    return train, test


#: the item file of each format, next to its rating file (where read_ratings finds titles)
_ITEM_FILES = {"ml-100k": "u.item", "ml-1m": "movies.dat", "csv": "movies.csv"}


def _features(args: argparse.Namespace, train: Ratings) -> torch.Tensor:
    """The item side features CFN++ reads: the synthetic genres, or the item file next to
    ``--train`` (for item rows; the models' default orientation)."""
    if args.train is None:
        return synthetic_item_features(args.seed, train.n_items)
    # the item file read_ratings reads titles from, next to the ratings
    # ('~' as the readers take it: a shell leaves --train=~/... as it is)
    name = _ITEM_FILES.get(args.format)
    path = Path(os.path.expanduser(args.train)).parent / name if name else None
    if path is None or not path.is_file():
        raise SystemExit(f"cfn++ needs the item genres of --format {args.format} next to "
                         f"{args.train}; none found")
    return read_item_features(path, args.format, train.item_map)


def _show_recommendations(model, name: str, user: int) -> None:
    """The user's top 10 with the default filters, and without them for contrast."""
    for label, kw in (("defaults: min_support=20, shrinkage=10", {}),
                      ("no filter: min_support=0, shrinkage=0", dict(min_support=0, shrinkage=0))):
        recs = model.recommend(user, 10, **kw)
        print(f"\nuser {user}'s top 10 by {name} ({label}):\n"
              "| item | predicted | ranking score | training ratings |\n|---|---|---|---|")
        for title, rating, score, support in zip(recs.titles, recs.rating.tolist(),
                                                 recs.score.tolist(), recs.support.tolist()):
            print(f"| {title} | {rating:.2f} | {score:.2f} | {support} |")


if __name__ == "__main__":
    main()
