"""The difficulty ladder of the synthetic default: baselines beside nnsparse.models.

On MovieLens-100K (u1.base -> u1.test) the field's ladder is: item mean
1.035, a biased matrix factorisation about 0.93, a 30-line dense I-AutoRec
0.911.  This script prints the same rungs on the synthetic default
(:func:`nnsparse.data.synthetic_ratings`, 80 % train / 20 % test, like the
u-splits) with nnsparse's models next to them, each with its defaults
(their number of epochs chosen on a validation split of the training part,
then a refit on all of it; the test part is only scored).

Run:  python benchmarks/bench_models.py                 # every row, 2 threads
      python benchmarks/bench_models.py --quick         # small data, few epochs (a smoke run)
      python benchmarks/bench_models.py --models autorec cfn++
      python benchmarks/bench_models.py --train ml-100k/u1.base --test ml-100k/u1.test
                                                        # the same rows on real files

With ``--train``/``--test`` the rows are measured on those files instead, in the
format ``--format`` names (default ``auto``: detected from the training file, as
:func:`nnsparse.data.detect_format` does); CFN++ reads the item genres next to the
training file in that format: ``u.item``, ``movies.dat``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _baselines import biased_mf, dense_autorec  # noqa: E402

from nnsparse.data import (FORMATS, Ratings, detect_format, mean_prediction,  # noqa: E402
                           read_item_features, read_split, rmse, split_ratings)
from nnsparse.data import synthetic_item_features, synthetic_ratings  # noqa: E402
from nnsparse.data.readers import _title_file  # noqa: E402
from nnsparse.models import CFN, AutoRec, GLocalK, KernelNet  # noqa: E402

ZOO = {"autorec": (AutoRec, False), "cfn": (CFN, False), "cfn++": (CFN, True),
       "sparsefc": (KernelNet, False), "glocalk": (GLocalK, False)}


def _timed(run: Callable[[], torch.Tensor], test: Ratings) -> Tuple[float, float]:
    start = time.perf_counter()
    pred = run()
    return float(rmse(pred, test.rating)), time.perf_counter() - start


def main(argv: List[str] = None) -> Dict[str, Tuple[float, float]]:
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
    p.add_argument("--recommend", type=int, default=42,
                   help="print this user's top 10 by the best nnsparse model (-1: none)")
    args = p.parse_args(argv)
    if (args.train is None) != (args.test is None):
        p.error("--train and --test go together")
    if args.train is not None and args.format == "auto":
        # a concrete format: the side files (u.item, movies.dat) are that format's.  (No
        # advice to give --format: a file detect_format refuses, missing, empty, compressed
        # or of 3 comma-separated fields, no format reads.)
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
    mf, dense, zoo = (dict(epochs=5), dict(epochs=10), dict(epochs=5, patience=5)) \
        if args.quick else ({}, {}, {})
    rows: Dict[str, Tuple[float, float]] = {}
    print("| model | test RMSE | seconds |\n|---|---|---|")

    def show(name: str, result: Tuple[float, float]) -> None:
        rows[name] = result
        print(f"| {name} | {result[0]:.4f} | {result[1]:.1f} |", flush=True)

    show("item mean", _timed(lambda: mean_prediction(train, test, by="item"), test))
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
                              progress=False).predict(test), test))
    if fitted and args.recommend >= 0 and args.train is None:
        best = min(fitted, key=lambda n: rows[f"nnsparse.models {n}"][0])
        _show_recommendations(fitted[best], best, args.recommend)
    return rows


def _synthetic(args: argparse.Namespace) -> Tuple[Ratings, Ratings]:
    if args.quick:
        ratings = synthetic_ratings(args.seed, n_users=300, n_items=400, n_ratings=15_000)
    else:
        ratings = synthetic_ratings(args.seed)
    print(f"synthetic_ratings(seed={args.seed}): {len(ratings)} ratings, {ratings.n_users} users "
          f"x {ratings.n_items} items; 80/20 split; {args.threads} threads")
    train, test = split_ratings(ratings, 0.2, seed=args.seed)
    return train, test


def _features(args: argparse.Namespace, train: Ratings) -> torch.Tensor:
    """The item side features CFN++ reads: the synthetic genres, or the item file next to
    ``--train`` (for item rows; the models' default orientation)."""
    if args.train is None:
        return synthetic_item_features(args.seed, train.n_items)
    # the item file read_ratings reads titles from, next to the ratings
    path = _title_file(Path(args.train), args.format, True)
    if path is None:
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
