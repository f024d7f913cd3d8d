"""Time of one loss forward + backward: SparseCriterion vs the dense masked loss.

For a batch of ``rows`` item rows over ``width`` users with ``per_row``
ratings each (uniform positions), all in one run so that the ratios compare
like with like on a shared machine:

* ``dense-masked``: what users write today, given the dense rating rows and a
  0/1 mask already in memory: ``((estimate - dense) ** 2 * mask).sum() / mask.sum()``;
* ``densify+masked``: the same, building the dense rows and mask from the
  sparse batch first (what one pays when only the sparse ratings are kept);
* ``SparseCriterion``: ``SparseCriterion(nn.MSELoss())(estimate, target)`` with a
  dense estimate and a CSR target (reads the estimate at the target's entries);
* ``sparse-est ctor``: the same with a sparse CSR estimate built on the
  target's index tensors by ``torch.sparse_csr_tensor(crow, col, values)``
  (torch's backward of that constructor densifies its gradient: a
  ``(rows, width)`` dense tensor per step);
* ``sparse-est fn``: the same estimate made by a small ``autograd.Function``
  whose backward returns ``grad.values()`` (what a sparse-output decoder can
  do): no dense tensor at all.

Run:  python benchmarks/bench_criteria.py [--repeat 20] [--threads 2]
"""
from __future__ import annotations

import argparse
import time
import warnings

import torch
from torch import nn

from nnsparse import SparseCriterion

SHAPES = {  # rows, width, per_row: item batches of 128 shaped like the data sets
    "ML-1M": (128, 6040, 270),
    "ML-10M": (128, 69878, 937),
    "Netflix": (128, 480189, 5600),
}


def _batch(rows, width, per_row, seed=0):
    g = torch.Generator().manual_seed(seed)
    col = torch.stack([torch.randperm(width, generator=g)[:per_row].sort().values for _ in range(rows)])
    crow = torch.arange(0, rows * per_row + 1, per_row)
    values = torch.rand(rows * per_row, generator=g) * 2 - 1
    target = torch.sparse_csr_tensor(crow, col.reshape(-1), values, (rows, width),
                                     check_invariants=False)
    return target


class _AsCsr(torch.autograd.Function):
    """values -> CSR tensor on given indices; the gradient of the values is grad.values()."""

    @staticmethod
    def forward(ctx, values, crow, col, shape):
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)

    @staticmethod
    def backward(ctx, grad):
        return grad.values(), None, None, None


def _time(fns, repeat):
    """Best time of each function, run in turns so that a busy moment hits all of them."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--shapes", nargs="*", default=list(SHAPES))
    args = parser.parse_args()
    warnings.filterwarnings("ignore", "Sparse CSR tensor support is in beta")
    torch.set_num_threads(args.threads)
    crit = SparseCriterion(nn.MSELoss())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"best of {args.repeat} (run in turns), forward + backward, ms")
    print(f"{'shape':<8} {'rows x width':>16} {'nnz':>8} {'dense-masked':>13} {'densify+masked':>15} "
          f"{'SparseCrit':>11} {'sparse-est ctor':>16} {'sparse-est fn':>14} "
          f"{'SparseCrit/dense':>17} {'fn/dense':>9}")
    for name in args.shapes:
        rows, width, per_row = SHAPES[name]
        target = _batch(rows, width, per_row)
        dense = target.to_dense()
        mask = (dense != 0).to(dense.dtype)
        estimate = torch.randn(rows, width, requires_grad=True)
        values = torch.randn(target.values().shape[0], requires_grad=True)

        def dense_masked(dense=dense, mask=mask):
            loss = ((estimate - dense) ** 2 * mask).sum() / mask.sum()
            loss.backward()

        def densify_masked():
            d = target.to_dense()
            dense_masked(d, (d != 0).to(d.dtype))

        def sparse_criterion():
            crit(estimate, target).backward()

        def sparse_estimate():
            est = torch.sparse_csr_tensor(target.crow_indices(), target.col_indices(), values,
                                          target.shape, check_invariants=False)
            crit(est, target).backward()

        def sparse_estimate_fn():
            est = _AsCsr.apply(values, target.crow_indices(), target.col_indices(), target.shape)
            crit(est, target).backward()

        times = [t * 1e3 for t in _time(
            (dense_masked, densify_masked, sparse_criterion, sparse_estimate, sparse_estimate_fn),
            args.repeat)]
        print(f"{name:<8} {f'{rows} x {width}':>16} {target.values().shape[0]:>8} "
              f"{times[0]:>13.2f} {times[1]:>15.2f} {times[2]:>11.2f} {times[3]:>16.2f} "
              f"{times[4]:>14.2f} {times[2] / times[0]:>17.2f} {times[4] / times[0]:>9.2f}")


if __name__ == "__main__":
    main()
