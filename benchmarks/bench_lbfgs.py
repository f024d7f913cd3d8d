"""Sparse FC trained as its papers train it: full batch, L-BFGS, restarted each round.

The Sparse FC code (kernelNet) and GLocal-K's pre-training minimise the whole
objective (squared errors over every training rating plus the penalties) with
scipy's L-BFGS-B, ``maxcor`` 10, restarted every ``maxiter`` iterations: on
MovieLens-100K 30 rounds of 5 iterations, on MovieLens-1M 20 of 50 (kernelNet:
20 of 50 as well).  ``nnsparse.models.KernelNet`` trains with Adam on
mini-batches instead.  This script trains the same model (same layers, same
initialisation, same objective: ``KernelNet.batch_loss`` over every row at once)
with ``torch.optim.LBFGS`` (history 10, strong-Wolfe line search, at most 4
evaluations per iteration), or with ``--scipy`` with scipy's L-BFGS-B itself
(``maxcor`` 10, ``maxiter`` the round's iterations, on the papers' objective
``1/2 sum err^2 + 1/2 penalties``: the reference code's optimiser call; scipy is
an optional, benchmark-only import), restarted each round as those scripts do,
and prints the test RMSE every ``--every`` rounds, so the two ways of training
can be compared on the same files.

Run:  python benchmarks/bench_lbfgs.py --train ml-100k/u1.base --test ml-100k/u1.test
                                                    # GLocal-K's ML-100K schedule, 30 x 5
      python benchmarks/bench_lbfgs.py --rounds 20 --iters 50 --l2 70 --l2-kernel 0.018 ...
      python benchmarks/bench_lbfgs.py --scipy --seed 1 ...   # scipy's L-BFGS-B, another init
      python benchmarks/bench_lbfgs.py --quick      # small synthetic data: a smoke run
"""
from __future__ import annotations

import argparse
import time
from typing import List, Optional, Tuple

import torch

from nnsparse.data import FORMATS, Ratings, read_split, split_ratings, synthetic_ratings
from nnsparse.models import KernelNet


def train_lbfgs(model: KernelNet, train: Ratings, test: Ratings, rounds: int, iters: int,
                every: int, scipy: bool = False) -> List[Tuple[int, float, float, float]]:
    """``(round, objective, test RMSE, seconds)`` every ``every`` rounds of full-batch L-BFGS.

    The objective is ``batch_loss`` of every row: the papers' objective divided
    by a constant (the model's expected ratings per mini-batch).  ``scipy``:
    each round is one call of scipy's L-BFGS-B instead of torch's LBFGS.
    """
    # the layers, normaliser and training matrix that fit() would build (fit() itself
    # would train them with Adam); _prepare seeds the initialisation with the model's seed
    x = model._prepare(train, train.scale, None)
    rows = torch.arange(x.shape[0])
    params = [p for p in model.parameters() if p.requires_grad]
    out: List[Tuple[int, float, float, float]] = []
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        model.train()
        if scipy:
            _scipy_round(model, rows, x, params, iters)
        else:
            _torch_round(model, rows, x, params, iters)
        if r % every == 0 or r == rounds:
            with torch.no_grad():
                loss = model.batch_loss(rows, x)  # the objective this round reached
                model.eval()
                out.append((r, float(loss), model.evaluate(test)["rmse"],
                            time.perf_counter() - start))
    return out


def _torch_round(model: KernelNet, rows: torch.Tensor, x: torch.Tensor,
                 params: List[torch.Tensor], iters: int) -> None:
    """``iters`` iterations of torch's LBFGS from an empty history."""
    # a new optimiser per round: scipy's L-BFGS-B forgets its history at each call
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=iters, max_eval=4 * iters,
                            history_size=10, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = model.batch_loss(rows, x)
        loss.backward()
        return loss

    opt.step(closure)  # (returns the loss of its first evaluation: the round's start)


def _scipy_round(model: KernelNet, rows: torch.Tensor, x: torch.Tensor,
                 params: List[torch.Tensor], iters: int) -> None:
    """One call of scipy's L-BFGS-B (``maxcor`` 10, ``maxiter`` ``iters``), as the papers' code.

    It minimises the papers' objective itself, ``batch_loss`` times
    ``per_batch / 2`` (``tf.nn.l2_loss``'s halves): scipy's stopping tests are
    absolute in the gradient, so the scale is kept.  Parameters go to scipy as
    one float64 vector; the model computes in its own dtype.
    """
    import numpy as np  # (numpy is a dependency; scipy an optional, benchmark-only one)
    from scipy.optimize import minimize
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    scale = model._per_batch / 2.0
    dtype = params[0].dtype

    def objective(theta: "np.ndarray") -> Tuple[float, "np.ndarray"]:
        with torch.no_grad():
            vector_to_parameters(torch.from_numpy(theta).to(dtype), params)
        for p in params:
            p.grad = None
        loss = model.batch_loss(rows, x) * scale
        loss.backward()
        grad = torch.cat([p.grad.reshape(-1) for p in params])  # (every param is used)
        return float(loss.detach()), grad.double().numpy()

    start = parameters_to_vector(params).detach().double().numpy()
    found = minimize(objective, start, jac=True, method="L-BFGS-B",
                     options=dict(maxiter=iters, maxcor=10))
    with torch.no_grad():
        vector_to_parameters(torch.from_numpy(found.x).to(dtype), params)


def main(argv: Optional[List[str]] = None) -> List[Tuple[int, float, float, float]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train", help="a training rating file (with --test)")
    p.add_argument("--test", help="its test file")
    p.add_argument("--format", choices=("auto",) + FORMATS, default="auto",
                   help="the files' format (default: auto, detected from --train)")
    p.add_argument("--quick", action="store_true", help="small synthetic data, hidden 16")
    p.add_argument("--rounds", type=int, default=30, help="L-BFGS restarts (GLocal-K: 30)")
    p.add_argument("--iters", type=int, default=5, help="iterations per round (GLocal-K: 5)")
    p.add_argument("--every", type=int, default=5, help="print every this many rounds")
    # default: KernelNet's ("auto": 20 and 0.006 at ML-100K's 80,000 training ratings),
    # so the run compares with the model's default Adam training on the same file
    p.add_argument("--l2", type=float, help="default: KernelNet's ('auto')")
    p.add_argument("--l2-kernel", type=float, help="default: KernelNet's ('auto')")
    p.add_argument("--scipy", action="store_true",
                   help="scipy's L-BFGS-B (the papers' code) instead of torch's LBFGS")
    p.add_argument("--seed", type=int, default=0, help="the model's seed (initialisation)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    if (args.train is None) != (args.test is None):
        p.error("--train and --test go together")
    if min(args.rounds, args.iters, args.every) < 1:
        p.error("--rounds, --iters and --every must be at least 1")
    if args.scipy:
        try:
            import scipy  # noqa: F401
        except ImportError:
            p.error("--scipy needs scipy (pip install scipy)")
    torch.set_num_threads(args.threads)
    if args.train is not None:
        try:
            train, test = read_split(args.train, args.test, args.format)
        except (OSError, ValueError) as error:  # an unreadable or undetectable file
            p.error(f"cannot read --train/--test: {error}")
    elif args.quick:
        train, test = split_ratings(synthetic_ratings(0, 200, 300, 8_000), 0.2, seed=0)
    else:
        train, test = split_ratings(synthetic_ratings(0), 0.2, seed=0)
    hidden = dict(hidden=16) if args.quick else {}
    penalties = {k: v for k, v in (("l2", args.l2), ("l2_kernel", args.l2_kernel))
                 if v is not None}
    model = KernelNet(**penalties, **hidden, seed=args.seed)
    model.verbose = False
    rows = train_lbfgs(model, train, test, args.rounds, args.iters, args.every, args.scipy)
    h = model.effective_hparams()  # ("auto" set for len(train) by train_lbfgs)
    how = "scipy L-BFGS-B" if args.scipy else "torch LBFGS"
    print(f"{len(train)} / {len(test)} ratings; full-batch {how}, seed {args.seed}, "
          f"{args.rounds} rounds of {args.iters} iterations; l2 {h['l2']:.4g}, "
          f"l2_kernel {h['l2_kernel']:.4g}; {args.threads} thread(s)\n"
          "| round | objective | test RMSE | seconds |\n|---|---|---|---|")
    for r, loss, rmse, seconds in rows:
        print(f"| {r} | {loss:.4f} | {rmse:.4f} | {seconds:.0f} |")
    return rows


if __name__ == "__main__":
    main()
