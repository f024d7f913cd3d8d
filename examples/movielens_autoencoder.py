"""Train a collaborative-filtering autoencoder of nnsparse.models and report its test RMSE.

A thin command line over :mod:`nnsparse.models`: I-AutoRec / U-AutoRec
(``--model autorec``), CFN and CFN++ with side information (``cfn``,
``cfn++``), Sparse FC with kernelised weights (``sparsefc``, the default),
and GLocal-K, Sparse FC fine-tuned behind a global kernel (``glocalk``).
Each model chooses its number of epochs on a validation split of the
training ratings, then is refit on all of them; the test part is read once,
at the end, beside the item-mean baseline.

    python examples/movielens_autoencoder.py                       # synthetic default
    python examples/movielens_autoencoder.py --ratings ml-1m/      # an unzipped MovieLens
    python examples/movielens_autoencoder.py --ratings ml-1m/ratings.dat   # format detected
    python examples/movielens_autoencoder.py --train u1.base --test u1.test
    python examples/movielens_autoencoder.py --folds ml-100k/                     # u1..u5
    python examples/movielens_autoencoder.py --folds ml-10M100K/          # r1..r5 (split_ratings.sh)
    python examples/movielens_autoencoder.py --folds 5 --model autorec          # random folds
    python examples/movielens_autoencoder.py --recommend 42 -k 10
    torchrun --nproc_per_node=2 examples/movielens_autoencoder.py --threads 1   # 2 processes

Beside the RMSE it reports the top-k ranking metrics of the test part
(precision@k, recall@k, NDCG@k, hit rate@k with ``-k``, default 10: the
full-ranking protocol of ``RatingModel.evaluate_ranking``; with ``--folds``, of
every fold's test part, with their mean ± std).
A ``--test`` rating of a (user, item) pair that ``--train`` rates too (which
``read_split`` warns of) counts in the RMSE but is left out of the ranking, which
leaves each user's training items out: a line says how many.
The last line is ``test RMSE: <value>`` (the mean over the folds with ``--folds``),
except with ``--test-ratio 0`` (allowed with ``--save`` or ``--recommend``: the model
trains on every rating and is not evaluated).
Under ``torchrun`` the processes train one model with DistributedDataParallel
(gloo on CPU, NCCL with ``--device cuda``, one GPU a process), the batch size
being the global batch; rank 0 alone prints, shows bars and saves.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import torch

from nnsparse import distributed as nd
from nnsparse.data import (FORMATS, Ratings, detect_format, mae, mean_prediction, random_split,
                           read_item_features, read_ratings, read_split, read_user_features,
                           rmse, synthetic_item_features, synthetic_ratings)
from nnsparse.models import (CFN, AutoRec, GLocalK, KernelNet, RatingModel, cross_validate,
                             fold_files, kfold)

#: --model name -> (class, uses side features)
CHOICES = {"autorec": (AutoRec, False), "cfn": (CFN, False), "cfn++": (CFN, True),
           "sparsefc": (KernelNet, False), "glocalk": (GLocalK, False)}
#: the item and user files of each format, next to the rating file
SIDE_FILES = {"ml-100k": ("u.item", "u.user"), "ml-1m": ("movies.dat", "users.dat"),
              "csv": ("movies.csv", None)}


#: one past the largest int64: the bound of the library's counts (epochs, k, min_support, ...)
_INT64_END = 2 ** 63
#: one past the largest seed torch.manual_seed takes (a uint64)
_SEED_END = 2 ** 64


def _positive(kind: type, name: str):
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}")
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {text}")
        if value == math.inf:
            raise argparse.ArgumentTypeError(f"{name} must be finite, got {text}")
        if kind is int and value >= _INT64_END:  # the library's counts are int64
            raise argparse.ArgumentTypeError(f"{name} must be below 2**63 (int64), got {text}")
        return value
    return parse


def default_threads() -> int:
    """Half the cores, at most 4: leaves room for the others on a shared machine."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--ratings", help="a rating file, or a MovieLens directory holding one "
                      "(ratings.dat, ratings.csv or u.data); default: the synthetic set")
    data.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                      help="the files' format; auto: detected from the first line")
    data.add_argument("--train", help="a given training file (with --test)")
    data.add_argument("--test", help="a given test file (with --train)")
    data.add_argument("--folds", help="cross-validate: a number k of seeded random folds, or "
                      "a directory holding u1.base/u1.test ... (MovieLens-100K) or "
                      "r1.train/r1.test ... (MovieLens-10M, made by its split_ratings.sh)")
    data.add_argument("--orientation", choices=["item", "user"], default="item",
                      help="item: rows are items (I-AutoRec); user: rows are users")
    data.add_argument("--test-ratio", type=float, default=0.1)
    data.add_argument("--validation-ratio", type=float, default=0.05,
                      help="share of the training ratings that choose the epoch count")
    model = p.add_argument_group("model and training (default: the model's own)")
    model.add_argument("--model", choices=sorted(CHOICES), default="sparsefc")
    model.add_argument("--hidden", type=_positive(int, "--hidden"))
    model.add_argument("--epochs", type=_positive(int, "--epochs"),
                       help="at most (glocalk: of the pre-training only; its fine-tuning "
                            "keeps GLocalK's global_epochs, 100)")
    model.add_argument("--batch-size", type=_positive(int, "--batch-size"))
    model.add_argument("--lr", type=_positive(float, "--lr"),
                       help="Adam's initial rate (glocalk: of the pre-training only; its "
                            "fine-tuning keeps GLocalK's global_lr, 1e-3)")
    model.add_argument("--l2", type=float, help="the weight penalty of the full-data objective "
                       "(default: the model's; sparsefc's grows with the training ratings: "
                       "20 at ML-100K's 80,000, 53 at ML-1M's 900,000)")
    model.add_argument("--l2-kernel", type=float,
                       help="sparsefc: the kernels' penalty (default: 0.006 at 80,000 training "
                            "ratings, grown as --l2; GLocal-K: 0.006 on ML-100K, 0.018 on ML-1M "
                            "with --l2 70)")
    model.add_argument("--no-refit", action="store_true",
                       help="keep the early-stopped model instead of refitting on all ratings")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--device", default="cpu", help="cpu or cuda")
    model.add_argument("--threads", type=_positive(int, "--threads"), default=default_threads(),
                       help="torch CPU threads (default: half the cores, at most 4; 1 on a "
                            "2-core machine). torch's default, one spinning thread per core, "
                            "made training 5-10x slower on a busy 2-core machine; the "
                            "products of these models are too small to gain beyond ~4")
    model.add_argument("--dense-decoder", action="store_true",
                       help="train with the decoder's dense output read at the ratings "
                            "(same numbers as the sampled decoder, slower: a check)")
    out = p.add_argument_group("output")
    out.add_argument("--metrics-out", help="write the run's numbers to this JSON file")
    out.add_argument("--save", help="save the trained model to this file")
    out.add_argument("--load", help="load a model saved with --save instead of training")
    out.add_argument("--recommend", help="print this user's top-k unrated items (original id)")
    out.add_argument("-k", type=_positive(int, "-k"), default=10,
                     help="how many items --recommend prints, and the k of the test "
                          "ranking metrics (precision@k, recall@k, NDCG@k, hit rate@k; "
                          "of every fold with --folds)")
    out.add_argument("--rank-threshold", type=float,
                     help="ranking metrics: the lowest relevant test rating (default: "
                          "every test rating is relevant; not with --test-ratio 0, which "
                          "ranks nothing)")
    out.add_argument("--min-support", type=int, default=20,
                     help="--recommend: fewest training ratings of a recommended item")
    out.add_argument("--shrinkage", type=float, default=10.0,
                     help="--recommend: pseudo-ratings pulling a prediction to the mean")
    out.add_argument("--no-progress", action="store_true", help="no tqdm bars "
                     "(they are off anyway when stderr is not a terminal)")
    return p


def _check_file(p: argparse.ArgumentParser, flag: str, path: Optional[str]) -> None:
    if path is None:
        return
    if Path(path).is_dir():
        p.error(f"{flag}: {path} is a directory, not a file")
    if not Path(path).is_file():
        p.error(f"{flag}: no file at {path}")


def _check_output(p: argparse.ArgumentParser, flag: str, path: Optional[str]) -> None:
    """An output file must be writable where asked, checked before hours of training."""
    if path is None:
        return
    if Path(path).is_dir():
        p.error(f"{flag}: {path} is a directory, not a file")
    if not Path(path).resolve().parent.is_dir():
        p.error(f"{flag}: no directory {Path(path).parent} to write {Path(path).name} in")


def parse_args(argv: Optional[List[str]] = None):
    """Parse and check every flag and file before any training."""
    p = build_parser()
    args = p.parse_args(argv)
    for flag in ("ratings", "train", "test", "folds", "load", "save", "metrics_out"):
        if getattr(args, flag) is not None:  # (no shell expands the ~ of --ratings=~/ml-1m)
            setattr(args, flag, os.path.expanduser(getattr(args, flag)))
    if (args.train is None) != (args.test is None):
        p.error("--train and --test go together")
    if args.ratings and args.train:
        p.error("give either --ratings or --train/--test")
    if args.folds and args.train:
        p.error("--folds makes its own train/test pairs; drop --train/--test")
    if args.folds and (args.load or args.save or args.recommend):
        p.error("--folds trains one model per fold: --load, --save and --recommend need one model")
    if args.ratings is None or not Path(args.ratings).is_dir():  # a directory: its rating file
        _check_file(p, "--ratings", args.ratings)
    for flag in ("train", "test", "load"):
        _check_file(p, f"--{flag}", getattr(args, flag))
    for flag in ("save", "metrics_out"):
        _check_output(p, f"--{flag.replace('_', '-')}", getattr(args, flag))
    if args.folds is not None:
        if args.folds.isdigit():
            args.folds = int(args.folds)
            if args.folds < 2:
                p.error(f"--folds must be at least 2 folds or a directory, got {args.folds}")
        elif not Path(args.folds).is_dir():
            p.error(f"--folds: {args.folds} is neither a number of folds nor a directory")
    for name in ("test_ratio", "validation_ratio"):
        if not 0 <= getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be in [0, 1), got {getattr(args, name)}")
    for name in ("l2", "l2_kernel"):
        value = getattr(args, name)
        if value is not None and not 0 <= value < math.inf:
            p.error(f"--{name.replace('_', '-')} must be non-negative and finite, got {value}")
    if args.l2_kernel is not None and args.model not in ("sparsefc", "glocalk"):
        p.error(f"--l2-kernel is the kernels' penalty of --model sparsefc or glocalk, got "
                f"--model {args.model}")
    if args.rank_threshold is not None and not math.isfinite(args.rank_threshold):
        p.error(f"--rank-threshold must be finite, got {args.rank_threshold}")
    # a flag that would change nothing is refused, not ignored
    if args.rank_threshold is not None and args.test_ratio == 0 and args.train is None:
        p.error("--rank-threshold: --test-ratio 0 leaves no test ratings to rank")
    if args.min_support < 0 or not 0 <= args.shrinkage < math.inf:
        p.error(f"--min-support and --shrinkage must be non-negative (and finite), got "
                f"{args.min_support} and {args.shrinkage}")
    if args.min_support >= _INT64_END:
        p.error(f"--min-support must be below 2**63 (int64), got {args.min_support}")
    if args.seed < 0:
        p.error(f"--seed must be non-negative, got {args.seed}")
    if args.seed >= _SEED_END:
        p.error(f"--seed must be below 2**64 (torch.manual_seed's range), got {args.seed}")
    # torch.set_num_threads(10**8) crashed the process; more threads than CPUs only
    # oversubscribe them, but torch runs them (1,024 on a 2-CPU machine)
    limit = max(1024, os.cpu_count() or 1)
    if args.threads > limit:
        p.error(f"--threads must be at most {limit}, got {args.threads}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {args.device}: no CUDA device is available")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if device.type not in ("cpu", "cuda"):
        p.error(f"--device must be cpu or cuda[:N], got {args.device!r}")
    if not args.load:  # the model's own checks of what the flags make of its hyperparameters
        try:
            CHOICES[args.model][0](**hparams(args))
        except (TypeError, ValueError) as error:
            p.error(f"--model {args.model}: {error}")
    return p, args


def hparams(args: argparse.Namespace) -> Dict[str, Any]:
    """The model's hyperparameters from the flags given (the others stay the model's)."""
    out: Dict[str, Any] = dict(orientation=args.orientation, seed=args.seed,
                               validation_ratio=args.validation_ratio, refit=not args.no_refit,
                               dense_decoder=args.dense_decoder)
    for flag, key in (("hidden", "hidden"), ("epochs", "epochs"), ("batch_size", "batch_size"),
                      ("lr", "lr"), ("l2", "l2"), ("l2_kernel", "l2_kernel")):
        if getattr(args, flag) is not None:
            out[key] = getattr(args, flag)
    return out


def read_data(p: argparse.ArgumentParser, args: argparse.Namespace):
    """``(train, test, all ratings)`` or, with --folds, the fold iterator; reader errors -> p.error."""
    try:
        if args.folds is not None and not isinstance(args.folds, int):
            # read the first pair now, so a bad format fails before training
            folds = list(fold_files(args.folds, args.format))
            _settle_format(args, folds[0][0].source)
            return folds, None, folds[0][0]
        if args.train:
            train, test = read_split(args.train, args.test, args.format)
            _settle_format(args, args.train)
            return train, test, train
        ratings = (read_ratings(args.ratings, args.format) if args.ratings
                   else synthetic_ratings(seed=args.seed))
        if args.ratings:
            _settle_format(args, args.ratings)
    except ValueError as error:
        p.error(f"cannot read the ratings as --format {args.format}: {error}")
    if isinstance(args.folds, int):
        try:
            return list(kfold(ratings, args.folds, seed=args.seed)), None, ratings
        except ValueError as error:  # more folds than ratings
            p.error(f"--folds {args.folds}: {error}")
    split = random_split(ratings, test=args.test_ratio, validation=0.0, seed=args.seed)
    # found before training, not by fit or by the evaluation after it.  No test ratings
    # (--test-ratio 0) trains on them all: a model to --save or to --recommend from
    if len(split.train) == 0:
        p.error(f"--test-ratio {args.test_ratio} of {len(ratings)} ratings leaves no "
                f"training ratings")
    if len(split.test) == 0 and not (args.save or args.recommend is not None):
        p.error(f"--test-ratio {args.test_ratio} of {len(ratings)} ratings leaves no test "
                f"ratings; to train on all of them, give --save or --recommend")
    return split.train, split.test, ratings


def check_memory(p: argparse.ArgumentParser, args: argparse.Namespace,
                 ratings: Ratings) -> None:
    """Refuse a --hidden whose network needs more than this machine's memory to train: its
    parameters, their gradients and Adam's two moments (float32: at least 16 bytes a
    parameter), counted on a network built on the meta device (nothing allocated).
    torch's allocation failed with a traceback (--hidden 2**40), or the process swapped
    or was killed."""
    if args.load or args.hidden is None:  # (the models' default widths fit any machine)
        return
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: nothing to compare
        return
    rows, width = ((ratings.n_items, ratings.n_users) if args.orientation == "item"
                   else (ratings.n_users, ratings.n_items))
    try:
        with torch.device("meta"):  # the layers' sizes only
            net = CHOICES[args.model][0](**hparams(args))
            net.build(rows, width, 0)
        need = 16 * sum(param.numel() for param in net.parameters())
        needs = f"about {need / 2**30:.3g} GiB"
    except RuntimeError:  # a layer of more than 2**63 bytes ("Storage size ... overflowed")
        need, needs = math.inf, "more than 2**63 bytes"
    if need > have:
        p.error(f"--hidden {args.hidden} of --model {args.model} on {rows} x {width} "
                f"({args.orientation} rows) needs {needs} to train (16 bytes a parameter: "
                f"the weights, their gradients and Adam's moments), more than this "
                f"machine's {have / 2**30:.3g} GiB of memory; choose a smaller --hidden")


def _settle_format(args: argparse.Namespace, path: str) -> None:
    """--format auto becomes the format read (the side files and the saved args use it)."""
    if args.format == "auto":
        args.format = detect_format(path)


def side_features(p: argparse.ArgumentParser, args: argparse.Namespace, train: Ratings):
    """The row features of CFN++: genres (item rows) or demographics (user rows)."""
    source = args.ratings or args.train or (args.folds if isinstance(args.folds, str) else None)
    if source is None:  # the synthetic set
        if args.orientation == "user":
            p.error("--model cfn++ on the synthetic set has item genres only: use --orientation item")
        return synthetic_item_features(args.seed, train.n_items)
    folder = Path(source) if Path(source).is_dir() else Path(source).parent
    names = SIDE_FILES.get(args.format)
    name = None if names is None else names[0 if args.orientation == "item" else 1]
    if name is None or not (folder / name).is_file():
        # (MovieLens-10M and later ship the ml-1m format without its users.dat)
        why = "" if args.orientation == "item" else (
            "; only MovieLens-100K (u.user) and -1M (users.dat) ship user demographics, "
            "the later releases none: use --orientation item (genres)")
        p.error(f"--model cfn++ needs the {args.orientation} file of --format {args.format} "
                f"({name or 'none exists for this format'}) next to the ratings in {folder}"
                + why)
    try:
        if args.orientation == "item":
            return read_item_features(folder / name, args.format, train.item_map)
        return read_user_features(folder / name, args.format, train.user_map)
    except ValueError as error:
        p.error(f"cannot read side features: {error}")


def print_recommendations(model: RatingModel, args: argparse.Namespace) -> None:
    recs = model.recommend(args.recommend, args.k, min_support=args.min_support,
                           shrinkage=args.shrinkage)
    nd.main_print(f"top {len(recs.ids)} items for user {args.recommend}: "
          f"(among items with >= {args.min_support} training ratings; "
          f"shrinkage {args.shrinkage:g})")
    for item, score, rating, support, title in zip(recs.ids, recs.score.tolist(),
                                                   recs.rating.tolist(), recs.support.tolist(),
                                                   recs.titles):
        nd.main_print(f"  {rating:4.2f} ({score:4.2f} shrunk, {support:4d} ratings)  "
                      f"{item}  {title}")


def run_folds(p, args, folds) -> Dict[str, Any]:
    """One model per fold, each scored and ranked (at -k) on its fold's test part."""
    cls, uses_features = CHOICES[args.model]
    features = (lambda train: side_features(p, args, train)) if uses_features else None
    for number, (_, test) in enumerate(folds, start=1):  # every fold, before any training
        highest = float(test.rating.max()) if len(test) else None
        if args.rank_threshold is not None and highest is not None \
                and not highest >= args.rank_threshold:
            p.error(f"--rank-threshold {args.rank_threshold:g}: no test rating of fold "
                    f"{number} reaches it (the highest is {highest:g}), so no user has a "
                    f"relevant item")
    try:
        cv = cross_validate(lambda: cls(**hparams(args)), folds, features=features,
                            device=args.device, progress=not args.no_progress and None,
                            verbose=nd.is_main(), k=args.k, threshold=args.rank_threshold)
    except ValueError as error:  # a fold refused by fit before its training
        p.error(f"cannot train on these folds: {error}")
    nd.main_print(cv.table())
    summary = cv.summary()
    ranking = {key: summary[key] for key in ["k", "threshold"] + [
        name for key in cv.ranking_keys() for name in (key, f"{key}_std")]}
    # the ranked users of every fold, and the seconds of the rankings together
    ranking.update(folds=len(cv.folds), users=[f["ranked_users"] for f in cv.folds],
                   seconds=sum(f["rank_seconds"] for f in cv.folds))
    return dict(folds=cv.folds, test_rmse=cv.mean(), test_rmse_std=cv.std(),
                test_mae=cv.mean("mae"), item_mean_rmse=cv.mean("item_mean_rmse"),
                ranking=ranking)


def run_one(p, args, train, test) -> Dict[str, Any]:
    if args.load:
        try:
            model = RatingModel.load(args.load, device=args.device)
        except (ValueError, RuntimeError, KeyError) as error:
            p.error(f"--load: {error}")
    else:
        cls, uses_features = CHOICES[args.model]
        model = cls(**hparams(args))
    if args.rank_threshold is not None and len(test) \
            and not float(test.rating.max()) >= args.rank_threshold:
        p.error(f"--rank-threshold {args.rank_threshold:g}: no test rating reaches it (the "
                f"highest is {float(test.rating.max()):g}), so no user has a relevant item")
    if args.recommend is not None and not args.load:
        # check the user before training; unknown ids would only fail at the end
        if not any(k in train.user_map for k in (args.recommend, _int(args.recommend))):
            p.error(f"--recommend: user {args.recommend!r} is not in the training data")
    if not args.load:
        feats = side_features(p, args, train) if CHOICES[args.model][1] else None
        try:
            model.fit(train, features=feats, device=args.device,
                      progress=False if args.no_progress else None)
        except ValueError as error:  # fit's refusals come before any training
            p.error(f"cannot train on these ratings: {error}")
        nd.main_print(f"trained {model.name} in {model.fit_seconds:.1f} s, "
                      f"{model.best_epoch} epochs")
    if args.save and nd.is_main():
        model.save(args.save)
    if args.recommend is not None:
        try:
            print_recommendations(model, args)
        except KeyError as error:
            p.error(f"--recommend: {error.args[0]}")
    if len(test) == 0:  # --test-ratio 0 with --save or --recommend
        nd.main_print("no test ratings (--test-ratio 0): not evaluated")
        return dict(epochs=model.history, test_rmse=None, test_mae=None, fallback=None,
                    best_epoch=model.best_epoch, seconds=model.fit_seconds)
    try:
        scores = model.evaluate(test)
    except ValueError as error:  # a loaded model read with other ids than its training's
        if not args.load:  # (a model trained here on these ratings: a bug, not a usage error)
            raise
        p.error(f"cannot evaluate the model on these ratings: {error} "
                f"(--load {args.load}: give the --ratings it was trained on)")
    counts = scores["fallback_counts"]
    nd.main_print(f"{scores['fallback']} of {scores['count']} test ratings predicted by a mean "
          f"(item mean {counts['item_mean']}, user mean {counts['user_mean']}, "
          f"global mean {counts['global_mean']}): their user or item has no training rating")
    result = dict(epochs=model.history, test_rmse=scores["rmse"], test_mae=scores["mae"],
                  fallback=counts, best_epoch=model.best_epoch, seconds=model.fit_seconds)
    # (a random split, --ratings or --folds N, shares no pair: nothing to look for)
    ranked, note = ranked_part(train, test, args.rank_threshold) if args.train else (test, None)
    if note is not None:
        result["ranking_note"] = note
    result["ranking"] = None if ranked is None else ranking(p, args, model, ranked)
    return result


def ranked_part(train: Ratings, test: Ratings, threshold: Optional[float] = None
                ) -> Tuple[Optional[Ratings], Optional[str]]:
    """The test ratings to rank and a note on those left out (``None``: all of them).
    ``read_split`` only warns of a --test pair that --train rates too (its RMSE measures a
    fitted rating); the ranking leaves each user's training items out, so such a pair
    could never be a hit (``evaluate_ranking`` refuses it): it is left out of the ranking
    only, with the note, and the ranking is skipped (``None``) when nothing rankable is
    left, or nothing rated ``>= threshold`` (``--rank-threshold``) once they are left out.
    (benchmarks/bench_models.py ranks its --train/--test files with this too.)"""
    shared = test.rated_in(train)  # (read_split's parts share their id maps)
    n = int(shared.sum())
    if n == 0:
        return test, None
    why = (f"their (user, item) pair is rated in --train too, and the ranking leaves each "
           f"user's training items out")
    if n == len(test):
        return None, f"test ranking skipped: all {n} test ratings are left out ({why})"
    kept = test.subset(~shared)
    if threshold is not None and not float(kept.rating.max()) >= threshold:
        return None, (f"test ranking skipped: {n} of the {len(test)} test ratings are left "
                      f"out ({why}), and none of the other {len(kept)} is rated >= "
                      f"--rank-threshold {threshold:g}")
    return kept, f"test ranking: {n} of the {len(test)} test ratings left out ({why})"


def ranking(p: argparse.ArgumentParser, args: argparse.Namespace, model: RatingModel,
            test: Ratings) -> Dict[str, Any]:
    """The test ranking metrics at -k (full ranking, training items left out), timed."""
    start = time.perf_counter()
    try:
        scores = model.evaluate_ranking(test, args.k, threshold=args.rank_threshold,
                                        progress=False if args.no_progress else None)
    except ValueError as error:
        if not args.load:  # a model trained here on these ratings: a bug to show
            raise
        p.error(f"cannot rank the test ratings with this model: {error} "
                f"(--load {args.load}: give the --ratings and --seed it was trained with)")
    scores.update(k=args.k, threshold=args.rank_threshold,
                  seconds=time.perf_counter() - start)
    return scores


def ranking_line(rank: Dict[str, Any]) -> str:
    """The ranking's line: one test part's figures, or the folds' mean ± std."""
    k = rank["k"]
    relevant = "" if rank["threshold"] is None else f", relevant: rated >= {rank['threshold']:g}"
    if "folds" in rank:  # --folds
        spread = {key: f" ± {rank[f'{key}_std']:.4f}" for key in
                  (f"precision@{k}", f"recall@{k}", f"ndcg@{k}", f"hit_rate@{k}")}
        who = (f"mean ± std of {rank['folds']} folds, {min(rank['users'])}-"
               f"{max(rank['users'])} users a fold")
        seconds = f"{rank['seconds']:.1f} s in all"
    else:
        spread = dict.fromkeys((f"precision@{k}", f"recall@{k}", f"ndcg@{k}", f"hit_rate@{k}"),
                               "")
        who, seconds = f"{rank['users']} users", f"{rank['seconds']:.1f} s"
    return (f"test ranking ({who}, all items less their training ones{relevant}): "
            + ", ".join(f"{title}@{k} {rank[key]:.4f}{spread[key]}" for title, key in (
                ("precision", f"precision@{k}"), ("recall", f"recall@{k}"),
                ("NDCG", f"ndcg@{k}"), ("hit rate", f"hit_rate@{k}")))
            + f" ({seconds})")


def _int(text: str) -> Any:
    try:
        return int(text)
    except ValueError:
        return text


def check_world(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Under torchrun: a model that trains in a process group, and a global batch that
    splits evenly over the processes."""
    world = nd.world_size()
    if world == 1 or args.load:
        return
    if args.model == "glocalk":  # (GLocalK.fit raises NotImplementedError in a group)
        p.error("--model glocalk does not train under torchrun yet (its global kernel reads "
                "the network's output on every row at each step); use --model sparsefc, or "
                "one process")
    batch = CHOICES[args.model][0](**hparams(args)).hparams["batch_size"]
    if batch % world:
        p.error(f"--batch-size {batch} (the global batch) must be a multiple of the "
                f"{world} processes")


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    p, args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if "WORLD_SIZE" in os.environ:  # started by torchrun: join the group, take a device
        device = nd.init_from_env(device="cuda" if args.device.startswith("cuda") else "cpu")
        args.device = str(device)
        try:
            return _main(p, args)
        finally:
            nd.cleanup()
    return _main(p, args)


def _main(p: argparse.ArgumentParser, args: argparse.Namespace) -> Dict[str, Any]:
    check_world(p, args)
    torch.manual_seed(args.seed)
    first, test, ratings = read_data(p, args)
    check_memory(p, args, ratings)
    nd.main_print(f"{len(ratings)} ratings, {ratings.n_users} users x {ratings.n_items} items; "
          f"model {args.model if not args.load else 'from ' + args.load}")
    try:
        result = run_folds(p, args, first) if test is None else run_one(p, args, first, test)
    except FloatingPointError as error:  # training diverged (Trainer.fit): no traceback
        p.exit(1, f"{p.prog}: error: {error}\n")
    if test is not None and len(test):
        baseline = mean_prediction(first, test, by="item")
        result.update(item_mean_rmse=float(rmse(baseline, test.rating)),
                      item_mean_mae=float(mae(baseline, test.rating)))
        nd.main_print(f"item-mean baseline: RMSE {result['item_mean_rmse']:.4f}, "
              f"MAE {result['item_mean_mae']:.4f}")
    if result.get("ranking_note"):
        nd.main_print(result["ranking_note"])
    rank = result.get("ranking")
    if rank is not None:
        nd.main_print(ranking_line(rank))
    result["args"] = vars(args)
    result["processes"] = nd.world_size()
    if args.metrics_out and nd.is_main():
        with open(args.metrics_out, "w") as f:
            json.dump(result, f, indent=2, default=str)
    if result["test_rmse"] is not None:
        nd.main_print(f"test MAE: {result['test_mae']:.4f}")
        nd.main_print(f"test RMSE: {result['test_rmse']:.4f}")
    return result


if __name__ == "__main__":
    main()
