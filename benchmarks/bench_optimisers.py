"""Accuracy of the training-step configurations: does the faster step train as well?

``bench_autoencoder.py`` times a step of each configuration; this script
trains the same item autoencoder (``tanh(decoder(tanh(encoder(x)), x))``,
hidden 500, MSE on the observed ratings, batch 128) to the end on synthetic
ratings (:func:`nnsparse.data.synthetic_ratings`, 80 / 10 / 10 % train /
validation / test) with each optimiser, and prints the test RMSE (rating
scale) at the epoch of the best validation RMSE, that epoch, and the mean
seconds per epoch.  Configurations:

* ``adam-<lr>``: dense gradients, ``torch.optim.Adam`` (the layers' default);
* ``in-backward-adam-<lr>``: ``nnsparse.optim.fused_step_optimizer`` (Adam in
  the backward, the dense step above 10 % touched rows);
* ``rowwise-adagrad-<lr>``: row-wise Adagrad in the backward
  (``apply_optimizer_in_backward(model, "rowwise_adagrad", lr=...)``).

Run:  python benchmarks/bench_optimisers.py [--users 6040 --items 3706 --ratings 1000000]
"""
from __future__ import annotations

import argparse
import time
from typing import Callable, Dict, List, Tuple

import torch
from torch import nn

import nnsparse
from nnsparse import optim as noptim
from nnsparse.data import RatingNormalizer, SparseRowDataset, random_split, synthetic_ratings


class _AE(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width)

    def forward(self, x, pattern):
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), pattern))


def _optimisers(adam_lrs: List[float], lrs: List[float]
                ) -> Dict[str, Callable[[nn.Module], object]]:
    made: Dict[str, Callable[[nn.Module], object]] = {}
    for lr in adam_lrs:
        made[f"adam-{lr:g}"] = lambda m, lr=lr: torch.optim.Adam(m.parameters(), lr=lr)
        made[f"in-backward-adam-{lr:g}"] = (
            lambda m, lr=lr: noptim.fused_step_optimizer(m, lr=lr))
    for lr in lrs:
        made[f"rowwise-adagrad-{lr:g}"] = (
            lambda m, lr=lr: noptim.apply_optimizer_in_backward(m, "rowwise_adagrad", lr=lr))
    return made


def _rmse(model: nn.Module, x, target, half_range: float) -> float:
    """RMSE in rating units of the predictions at ``target``'s entries (inputs ``x``)."""
    with torch.no_grad():
        out = model(x, target)
    return half_range * float((out.values() - target.values()).square().mean().sqrt())


def _train(name: str, make: Callable, data: Tuple, epochs: int, batch: int, hidden: int,
           seed: int) -> Tuple[float, int, float]:
    train, val, test, half_range = data
    torch.manual_seed(seed)
    model = _AE(train.shape[1], hidden)
    opt = make(model)
    ds = SparseRowDataset(train)
    order = torch.Generator().manual_seed(seed)
    best = (float("inf"), 0, float("nan"))
    seconds = 0.0
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        for idx in torch.randperm(len(ds), generator=order).split(batch):
            x = ds.collate([ds[int(i)] for i in idx]).input
            loss = (model(x, x).values() - x.values()).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        seconds += time.perf_counter() - start
        v = _rmse(model, train, val, half_range)
        if v < best[0]:
            best = (v, epoch, _rmse(model, train, test, half_range))
    print(f"{name:<24}{best[2]:>10.4f}{best[1]:>7}{best[0]:>10.4f}{seconds / epochs:>9.2f}",
          flush=True)
    return best[2], best[1], seconds / epochs


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=6040)
    p.add_argument("--items", type=int, default=3706)
    p.add_argument("--ratings", type=int, default=1_000_000)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--hidden", type=int, default=500)
    p.add_argument("--adam-lrs", type=float, nargs="*", default=[1e-3, 3e-4],
                   help="Adam learning rates (both Adam configurations)")
    p.add_argument("--lrs", type=float, nargs="*", default=[3e-3, 1e-3],
                   help="row-wise Adagrad learning rates")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    ratings = synthetic_ratings(args.seed, n_users=args.users, n_items=args.items,
                                n_ratings=args.ratings)
    train, val, test = random_split(ratings, test=0.1, validation=0.1, seed=args.seed)
    norm = RatingNormalizer(train, "item")
    lo, hi = norm.scale
    data = (norm.matrix(train), norm.matrix(val), norm.matrix(test), (hi - lo) / 2)
    print(f"{args.items} items x {args.users} users, {len(ratings):,} ratings; hidden "
          f"{args.hidden}, batch {args.batch_size}, {args.epochs} epochs, "
          f"{args.threads} thread(s)")
    print(f"{'optimiser':<24}{'test':>10}{'epoch':>7}{'valid':>10}{'s/epoch':>9}")
    for name, make in _optimisers(args.adam_lrs, args.lrs).items():
        _train(name, make, data, args.epochs, args.batch_size, args.hidden, args.seed)


if __name__ == "__main__":
    main()
