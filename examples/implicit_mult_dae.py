"""Mult-DAE (Liang et al. 2018) on implicit feedback, with the paper's held-out-users protocol.

"Variational Autoencoders for Collaborative Filtering" (WWW 2018), its denoising
autoencoder with a multinomial likelihood, the nnsparse way:

* ratings binarised by ``nnsparse.data.implicit_clicks``: a rating >= ``--threshold``
  (4, as the paper's ``> 3.5`` on ML-20M) is a click, the others are dropped; users with
  fewer than ``--min-clicks`` (5, as the paper) clicks are dropped too;
* ``nnsparse.data.user_split``: the training users' clicks whole; validation and test
  users held out, each with 80 % of its clicks (``--fold-in``) as input, the rest to predict
  (the held-out clicks of items no training user clicked are dropped, as the paper's
  code does, and those items are never ranked); each part's matrix holds its users' rows
  only (``rating_matrix(part, "user", rows=users)``), and their lists are scored by
  ``ranking_metrics(top, target, k, users=users)``, row ``j`` user ``users[j]``'s;
* input: a user's clicks, a CSR row, L2-normalised (``nnsparse.normalize``) and dropped
  out (``ValuesMap(nn.Dropout(0.5))`` on the specified values, ``--dropout``: a zero
  stays a zero, as in the paper's dropout of the dense input);
  encoder ``SparseLinearBatch(n_items, 200)`` + tanh, decoder a dense
  ``nn.Linear(200, n_items)`` + ``log_softmax``: the paper's Mult-DAE
  ``[I -> 200 -> I]``, which Liang et al.'s code found better on ML-20M's validation
  NDCG@100 than Mult-VAE's ``[I -> 600 -> 200 -> 600 -> I]`` (``--hidden`` sets the width);
* loss: the multinomial log-likelihood ``-(log_softmax * x).sum(1).mean()``, read at
  the clicks only, ``SparseCriterion(nn.KLDivLoss(reduction="batchmean"))`` (the
  target is never densified), plus ``lam / batch * sum ||W||^2`` on the two weight
  matrices (Liang et al.'s code: ``lam=0.01 / batch_size``); Adam, lr 1e-3, batch 500;
* the epoch of the best validation NDCG@100 is kept (stopping after ``--patience``
  epochs without a better one); the test users are ranked once, at the end: Recall@20,
  Recall@50 (the paper's: hits / min(k, n)) and NDCG@100, fold-in items excluded, beside
  the item-popularity baseline ranked the same way.

    python examples/implicit_mult_dae.py                              # synthetic default
    python examples/implicit_mult_dae.py --ratings ml-20m/ratings.csv \\
        --test-users 10000 --validation-users 10000                     # the paper's ML-20M
    python examples/implicit_mult_dae.py --ratings ml-1m/ratings.dat    # format detected

The default data is ``nnsparse.data.synthetic_ratings(seed)`` (MovieLens-100K's shape;
its users choose what they rate by their tastes, which the clicks reveal); the last
lines are the test table, Mult-DAE beside popularity.
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader
from tqdm import tqdm

import nnsparse
from nnsparse.data import (FORMATS, HeldOut, Ratings, SparseRowDataset, implicit_clicks,
                           ranking_metrics, rating_matrix, read_ratings, synthetic_ratings,
                           user_split)

#: the paper's figures: Recall@20, Recall@50, NDCG@100
KS = (("Recall@20", "recall", 20), ("Recall@50", "recall", 50), ("NDCG@100", "ndcg", 100))


def _positive(kind: type, name: str) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be {'an integer' if kind is int else 'a number'}, got {text!r}")
        if not 0 < value < math.inf:
            raise argparse.ArgumentTypeError(f"{name} must be positive and finite, got {text}")
        if kind is int and value >= 2 ** 63:  # (torch's sizes and counts are int64)
            raise argparse.ArgumentTypeError(f"{name} must be below 2**63, got {text}")
        return value
    return parse


def _users(name: str) -> Callable[[str], Any]:
    """A number of users (an int) or a fraction of them (a float in [0, 1))."""
    def parse(text: str) -> Any:
        try:
            return int(text)
        except ValueError:
            pass
        try:
            return float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be a number of users or a fraction of them, got {text!r}")
    return parse


def default_threads() -> int:
    """Half the cores, at most 4: leaves room for the others on a shared machine."""
    return max(1, min(4, (os.cpu_count() or 1) // 2))


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = p.add_argument_group("data")
    data.add_argument("--ratings", help="a rating file, or a MovieLens directory holding one "
                      "(ratings.csv, ratings.dat or u.data); default: the synthetic set")
    data.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                      help="the file's format; auto: detected from its first line")
    data.add_argument("--synthetic-users", type=_positive(int, "--synthetic-users"),
                      default=943, help="the synthetic set's users (its items: 1682)")
    data.add_argument("--synthetic-items", type=_positive(int, "--synthetic-items"),
                      default=1682)
    data.add_argument("--synthetic-ratings", type=_positive(int, "--synthetic-ratings"),
                      default=100_000)
    data.add_argument("--threshold", type=float, default=4.0,
                      help="the lowest rating kept as a click (the paper: 4 on ML-20M)")
    data.add_argument("--min-clicks", type=_positive(int, "--min-clicks"), default=5,
                      help="users with fewer clicks are dropped (the paper: 5)")
    data.add_argument("--test-users", type=_users("--test-users"), default=0.1,
                      help="held-out test users: a count, or a fraction (the paper: "
                           "10000 on ML-20M)")
    data.add_argument("--validation-users", type=_users("--validation-users"), default=0.1,
                      help="held-out validation users, likewise")
    data.add_argument("--fold-in", type=float, default=0.8,
                      help="the share of a held-out user's clicks given as input")
    model = p.add_argument_group("model and training")
    model.add_argument("--hidden", type=_positive(int, "--hidden"), default=200,
                       help="the code's width (the paper's Mult-DAE: 200)")
    model.add_argument("--dropout", type=float, default=0.5,
                       help="the input dropout on the clicks' values")
    model.add_argument("--lam", type=float, default=0.01,
                       help="the weights' L2 penalty; the loss adds lam / batch-size * "
                            "sum ||W||^2, as Liang et al.'s code (lam=0.01 / batch_size)")
    model.add_argument("--lr", type=_positive(float, "--lr"), default=1e-3)
    model.add_argument("--batch-size", type=_positive(int, "--batch-size"), default=500)
    model.add_argument("--epochs", type=_positive(int, "--epochs"), default=200,
                       help="at most (the paper's code: 200)")
    model.add_argument("--patience", type=_positive(int, "--patience"), default=20,
                       help="stop after this many epochs without a better validation NDCG@100")
    model.add_argument("--seed", type=int, default=0)
    model.add_argument("--threads", type=_positive(int, "--threads"), default=default_threads(),
                       help="torch CPU threads (default: half the cores, at most 4)")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bars "
                   "(they are off anyway when stderr is not a terminal)")
    return p


def parse_args(argv: Optional[List[str]] = None
               ) -> Tuple[argparse.ArgumentParser, argparse.Namespace]:
    """Parse and check every flag before reading or training."""
    p = build_parser()
    args = p.parse_args(argv)
    if args.ratings is not None:
        args.ratings = os.path.expanduser(args.ratings)
        if not os.path.exists(args.ratings):
            p.error(f"--ratings: no file or directory at {args.ratings}")
    if not math.isfinite(args.threshold):
        p.error(f"--threshold must be finite, got {args.threshold}")
    if not 0 <= args.dropout < 1:
        p.error(f"--dropout must be in [0, 1), got {args.dropout}")
    if not 0 < args.fold_in < 1:
        p.error(f"--fold-in must be in (0, 1), got {args.fold_in}")
    if not 0 <= args.lam < math.inf:
        p.error(f"--lam must be non-negative and finite, got {args.lam}")
    if not 0 <= args.seed < 2 ** 63:
        p.error(f"--seed must be in [0, 2**63), got {args.seed}")
    # torch.set_num_threads(10**5) crashed the process (as examples/movielens_autoencoder.py
    # bounds it: more threads than CPUs only oversubscribe them)
    limit = max(1024, os.cpu_count() or 1)
    if args.threads > limit:
        p.error(f"--threads must be at most {limit}, got {args.threads}")
    return p, args


#: the peak bytes a weight of the two matrices (float32), measured with ru_maxrss (hidden
#: 10,000-40,000, 500-1682 items): 24-26; the weight, its gradient and Adam's two moments
#: are 16, the kept best epoch's copy 4, the penalty's squares and the activations the rest
_BYTES_PER_WEIGHT = 24


def check_memory(p: argparse.ArgumentParser, args: argparse.Namespace, n_items: int) -> None:
    """Refuse a --hidden whose two ``n_items x hidden`` weight matrices need more than this
    machine's memory in training (``_BYTES_PER_WEIGHT``): torch's allocation failed with a
    traceback (--hidden 2**40), or the process swapped or was killed."""
    need = _BYTES_PER_WEIGHT * 2 * n_items * args.hidden
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # not a POSIX system: nothing to compare
        return
    if need > have:
        p.error(f"--hidden {args.hidden} of {n_items} items needs about {need / 2**30:.3g} GiB "
                f"to train (about {_BYTES_PER_WEIGHT} bytes a weight: the weights, their "
                f"gradients, Adam's moments, the best epoch's copy), more than this "
                f"machine's {have / 2**30:.3g} GiB of memory; choose a smaller --hidden")


def read_clicks(p: argparse.ArgumentParser, args: argparse.Namespace) -> Tuple[Ratings, str]:
    """The click record (ratings >= --threshold, users with >= --min-clicks of them)."""
    if args.ratings is None:
        try:
            ratings = synthetic_ratings(args.seed, args.synthetic_users, args.synthetic_items,
                                        args.synthetic_ratings, titles=False)
        except ValueError as error:
            p.error(f"cannot make the synthetic set: {error}")
        source = f"synthetic_ratings(seed={args.seed})"
    else:
        try:
            ratings = read_ratings(args.ratings, args.format, titles=False)
        except ValueError as error:
            p.error(f"cannot read --ratings {args.ratings}: {error}")
        source = ratings.source or args.ratings
    clicks = implicit_clicks(ratings, args.threshold, min_user_clicks=args.min_clicks)
    if len(clicks) == 0:
        p.error(f"no user has {args.min_clicks} ratings >= --threshold {args.threshold:g} "
                f"in {source}")
    return clicks, source


class MultDAE(nn.Module):
    """``normalize -> dropout -> SparseLinearBatch -> tanh -> Linear -> log_softmax``."""

    def __init__(self, n_items: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.drop = nnsparse.ValuesMap(nn.Dropout(dropout))
        self.encoder = nnsparse.SparseLinearBatch(n_items, hidden)
        self.decoder = nn.Linear(hidden, n_items)

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(self.encoder(self.drop(nnsparse.normalize(x))))
        return F.log_softmax(self.decoder(h), dim=1)

    def penalty(self) -> Tensor:
        """``sum ||W||^2`` of the two weight matrices (not the biases), as the paper."""
        return self.encoder.weight.pow(2).sum() + self.decoder.weight.pow(2).sum()


class Popularity(nn.Module):
    """Every user's scores are the items' training click counts: the paper's sanity check."""

    counts: Tensor

    def __init__(self, counts: Tensor) -> None:
        super().__init__()
        self.register_buffer("counts", counts.float())

    def forward(self, x: Tensor) -> Tensor:
        return self.counts.expand(x.shape[0], -1)


def evaluate(net: nn.Module, held: HeldOut, seen: Tensor, batch_size: int) -> Dict[str, float]:
    """Recall@20, Recall@50 (hits / min(k, n)) and NDCG@100 of the held-out users: each
    ranks every item a training user clicked (``seen``) less its fold-in ones."""
    fold_in, target = held
    users = torch.unique(torch.cat([fold_in.user, target.user]))
    # row j of the input and of the lists: user users[j] (no row for the other users)
    clicks = rating_matrix(fold_in, "user", torch.ones(len(fold_in)), rows=users)
    top = nnsparse.Batchifier(net, seen.shape[0], batch_size, progress=False).topk(
        clicks, 100, exclude=True, candidates=seen)
    figures: Dict[str, float] = {}
    for title, key, k in KS:
        figures[title] = ranking_metrics(top, target, k, recall="min",
                                         users=users)[f"{key}@{k}"]
    figures["users"] = float(len(torch.unique(target.user)))
    return figures


def train(args: argparse.Namespace, train_part: Ratings, valid: HeldOut,
          seen: Tensor) -> Tuple[MultDAE, List[Dict[str, float]], int, float]:
    """Mult-DAE trained on the training users, the epoch of the best validation NDCG@100."""
    n_items = train_part.n_items
    # the training users' rows only: an empty row would shrink the 'batchmean' loss
    users = torch.unique(train_part.user)
    clicks = rating_matrix(train_part, "user", torch.ones(len(train_part)), rows=users)
    dataset = SparseRowDataset(clicks)
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True,
                        collate_fn=dataset.collate,
                        generator=torch.Generator().manual_seed(args.seed))
    net = MultDAE(n_items, args.hidden, args.dropout)
    optimiser = torch.optim.Adam(net.parameters(), lr=args.lr)
    nll = nnsparse.SparseCriterion(nn.KLDivLoss(reduction="batchmean"))  # -(log_p * x).sum(1).mean()
    lam = args.lam / args.batch_size
    best: Tuple[float, int, Dict[str, Any]] = (-1.0, 0, {})
    history: List[Dict[str, float]] = []
    start = time.perf_counter()
    bar = tqdm(range(1, args.epochs + 1), desc="epochs", disable=args.no_progress or None,
               leave=False)
    for epoch in bar:
        net.train()
        total = 0.0
        for x, _ in loader:
            loss = nll(net(x), x) + lam * net.penalty()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total += loss.item() * x.shape[0]
        ndcg = evaluate(net, valid, seen, args.batch_size)["NDCG@100"]
        history.append(dict(epoch=epoch, loss=total / len(dataset), valid_ndcg=ndcg))
        bar.set_postfix(loss=f"{total / len(dataset):.2f}", ndcg=f"{ndcg:.4f}")
        improved = ndcg > best[0]
        if improved:
            best = (ndcg, epoch, copy.deepcopy(net.state_dict()))
        stop = epoch - best[1] >= args.patience
        if epoch == 1 or epoch % 10 == 0 or stop or epoch == args.epochs:
            tqdm.write(f"epoch {epoch}: train loss {total / len(dataset):.3f}, validation "
                       f"NDCG@100 {ndcg:.4f}{' (best)' if improved else ''}")
        if stop:
            break
    net.load_state_dict(best[2])
    return net, history, best[1], time.perf_counter() - start


def main(argv: Optional[List[str]] = None) -> Dict[str, Any]:
    p, args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    clicks, source = read_clicks(p, args)
    check_memory(p, args, clicks.n_items)
    try:
        split = user_split(clicks, test=args.test_users, validation=args.validation_users,
                           fold_in=args.fold_in, seed=args.seed)
    except (TypeError, ValueError) as error:
        p.error(f"cannot split the users: {error}")
    train_part = split.train
    # the held-out clicks of items no training user clicked are dropped (the paper's
    # code), and those items are never ranked (candidates)
    seen = torch.bincount(train_part.item, minlength=clicks.n_items) > 0
    valid, test = (HeldOut(*(part.subset(seen[part.item]) for part in held))
                   for held in (split.validation, split.test))
    active = len(torch.unique(clicks.user))
    print(f"{len(clicks)} clicks (ratings >= {args.threshold:g}) of {active} users with >= "
          f"{args.min_clicks} clicks (the others dropped, as the paper), "
          f"{int(seen.sum())} items clicked by training users, from {source}")
    print(f"users: {len(torch.unique(train_part.user))} train, "
          f"{len(torch.unique(valid.fold_in.user))} validation, "
          f"{len(torch.unique(test.fold_in.user))} test (fold-in {args.fold_in:g})")
    if len(test.target) == 0 or len(valid.target) == 0:
        p.error("no held-out user has a click left to predict: give more --test-users "
                "and --validation-users")

    net, history, best_epoch, seconds = train(args, train_part, valid, seen)
    print(f"trained in {seconds:.1f} s, {len(history)} epochs; kept epoch {best_epoch}, the "
          f"best validation NDCG@100 ({history[best_epoch - 1]['valid_ndcg']:.4f})")
    popularity = Popularity(torch.bincount(train_part.item, minlength=clicks.n_items))
    results = {"popularity": evaluate(popularity, test, seen, args.batch_size),
               "Mult-DAE": evaluate(net, test, seen, args.batch_size)}
    users = int(results["Mult-DAE"]["users"])
    print(f"\ntest users: {users} (fold-in items excluded from the ranking)\n")
    print("| model | " + " | ".join(title for title, _, _ in KS) + " |")
    print("|---" * (len(KS) + 1) + "|")
    for name, figures in results.items():
        print(f"| {name} | " + " | ".join(f"{figures[t]:.4f}" for t, _, _ in KS) + " |")
    return dict(results=results, history=history, best_epoch=best_epoch, seconds=seconds,
                users=users, clicks=len(clicks))


if __name__ == "__main__":
    main()
