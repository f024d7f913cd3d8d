"""Time to build a sparse vector entry by entry: DynamicSparseTensor vs the usual ways.

Run (after ``pip install -e .``): ``python benchmarks/bench_builder.py [--sizes 100000 1000000]``

Every method builds the same sparse COO vector from the same Python ints and
floats (random indices in ``[0, 10 n)``, random values), and all timings are
taken in one run, so the ratios compare like with like on a shared machine:

* ``append``: ``DynamicSparseTensor.append`` per entry, then ``build()``;
* ``extend``: ``DynamicSparseTensor.extend`` with tensors of 1000 entries
  (e.g. one row of ratings at a time), then ``build()``;
* ``list+tensor``: Python ``list.append`` per entry, then one ``torch.tensor``
  call per list and ``torch.sparse_coo_tensor``;
* ``torch.cat``: the classic method the Lua README compares against, growing a
  ``(k, 2)`` pair tensor by ``torch.cat`` at each entry.  It is O(n^2): above
  ``--cat-max`` entries it is not run, and its time is extrapolated from the
  largest size measured as ``t * (n / n_measured) ** 2`` (marked ``est.``).
"""
from __future__ import annotations

import argparse
import random
import time
from typing import Callable, List

import torch

from nnsparse import DynamicSparseTensor


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def by_append(index: List[int], values: List[float]) -> torch.Tensor:
    builder = DynamicSparseTensor()
    append = builder.append
    for i, v in zip(index, values):
        append(i, v)
    return builder.build()


def by_extend(index_t: torch.Tensor, values_t: torch.Tensor, chunk: int = 1000) -> torch.Tensor:
    builder = DynamicSparseTensor()
    for start in range(0, index_t.shape[0], chunk):
        builder.extend(index_t[start:start + chunk], values_t[start:start + chunk])
    return builder.build()


def by_list(index: List[int], values: List[float]) -> torch.Tensor:
    ix, vs = [], []
    for i, v in zip(index, values):
        ix.append(i)
        vs.append(v)
    return torch.sparse_coo_tensor(torch.tensor([ix]), torch.tensor(vs, dtype=torch.float32),
                                   check_invariants=False)


def by_cat(index: List[int], values: List[float]) -> torch.Tensor:
    pairs = torch.empty(0, 2)
    for i, v in zip(index, values):
        pairs = torch.cat([pairs, torch.tensor([[i, v]], dtype=torch.float32)])
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10 ** 5, 10 ** 6])
    parser.add_argument("--repeat", type=int, default=3, help="best of this many runs")
    parser.add_argument("--cat-max", type=int, default=10 ** 5,
                        help="largest size at which torch.cat is run (it is O(n^2))")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rng = random.Random(0)
    print(f"torch {torch.__version__}, 1 thread, best of {args.repeat} (torch.cat: 1 run)")
    header = f"{'n':>9} | {'append':>9} | {'extend':>9} | {'list+tensor':>11} | {'torch.cat':>14} | " \
             f"{'cat/append':>10} | {'append/list':>11}"
    print(header)
    print("-" * len(header))
    cat_measured = None  # (n, seconds) of the largest torch.cat run
    for n in args.sizes:
        index = [rng.randrange(10 * n) for _ in range(n)]
        values = [rng.random() for _ in range(n)]
        index_t, values_t = torch.tensor(index), torch.tensor(values)
        reference = by_list(index, values)
        assert torch.equal(by_append(index, values).to_dense(), reference.to_dense())
        assert torch.equal(by_extend(index_t, values_t).to_dense(), reference.to_dense())
        t_append = _best(lambda: by_append(index, values), args.repeat)
        t_extend = _best(lambda: by_extend(index_t, values_t), args.repeat)
        t_list = _best(lambda: by_list(index, values), args.repeat)
        if n <= args.cat_max:
            t_cat = _best(lambda: by_cat(index, values), 1)
            cat_measured = (n, t_cat)
            cat_text = f"{t_cat:>12.3f} s"
        elif cat_measured is not None:
            t_cat = cat_measured[1] * (n / cat_measured[0]) ** 2
            cat_text = f"est.{t_cat:>8.0f} s"
        else:
            t_cat, cat_text = float("nan"), "not run"
        print(f"{n:>9} | {t_append:>7.3f} s | {t_extend:>7.3f} s | {t_list:>9.3f} s | {cat_text:>14} | "
              f"{t_cat / t_append:>9.0f}x | {t_append / t_list:>10.2f}x")
    print("targets: cat/append >= 100x at n = 10^5; append/list <= 2x")


if __name__ == "__main__":
    main()
