"""What LazyAdam's check of the sparse gradients' indices costs in a training step.

The model of ``examples/movielens_autoencoder.py`` with ``sparse_grad=True``
(``SparseLinearBatch`` encoder, ``SparseOutputLinear`` decoder sampled at the
batch's pattern, ``values_map(tanh)``, ``SDAESparseCriterion`` with
``prepare_input``) and :class:`nnsparse.optim.LazyAdam`
(``dense_above=DENSE_ABOVE``), on item rows shaped like MovieLens-1M
(``--width`` users, about ``--per-row`` ratings per item row), batches from
``SparseRowDataset.collate``.  The step (forward, backward, ``step()``) is
timed, median of ``--repeat``; the check (``optim._check_grad_indices``: one
``aminmax`` per sparse gradient, one read back) is timed alone on the step's
own gradients, median of 50, and given as a share of the step.  Target: < 2 %.

Run:  python benchmarks/bench_grad_checks.py [--repeat 30] [--threads 1 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import nnsparse
from nnsparse import optim as noptim
from nnsparse.data import SparseRowDataset

import _step_model as step_model  # this script's folder, on sys.path
from _step_model import Autoencoder, matrix


def _sparse_grads(optimiser: torch.optim.Optimizer):
    return [(f"param_groups[{i}]['params'][{j}]", p.grad)
            for i, group in enumerate(optimiser.param_groups)
            for j, p in enumerate(group["params"])
            if p.grad is not None and p.grad.layout == torch.sparse_coo]


def run(threads: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    ds = SparseRowDataset(matrix(args.rows, args.width, args.per_row))
    model = Autoencoder(args.width, args.hidden, sparse_grad=True)
    criterion = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.25,
                                             generator=torch.Generator().manual_seed(0))
    optimiser = noptim.LazyAdam(model.parameters(), lr=1e-4, dense_above=noptim.DENSE_ABOVE)
    n_batches = args.rows // args.batch
    steps, checks = [], []
    for i in range(args.warmup + args.repeat):
        k = i % n_batches
        batch = ds.collate([ds[r] for r in range(k * args.batch, (k + 1) * args.batch)]).input
        start = time.perf_counter()
        loss = criterion(model(criterion.prepare_input(batch), batch), batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        grads = _sparse_grads(optimiser)  # before step(): the same gradients it checks
        optimiser.step()
        if i >= args.warmup:
            steps.append(time.perf_counter() - start)
            for _ in range(5):
                start = time.perf_counter()
                noptim._check_grad_indices(grads)
                checks.append(time.perf_counter() - start)
    step, check = statistics.median(steps) * 1e3, statistics.median(checks) * 1e3
    print(f"threads={threads}  step {step:8.2f} ms  check {check:.3f} ms "
          f"= {100 * check / step:.2f} % of the step (target < 2 %); "
          f"{len(grads)} sparse gradients, {sum(g._nnz() for _, g in grads)} indices")


if __name__ == "__main__":
    step_model.main(__doc__, "LazyAdam step", run)
