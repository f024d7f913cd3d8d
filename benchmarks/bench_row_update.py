"""The in-backward row update of one weight table: lazy (touched rows only) vs dense.

``nnsparse._rowopt.update_rows`` on a ``--rows`` x ``--width`` float32 table
for a share of touched rows drawn at random, the gradient rows given:

* ``lazy``: the touched rows gathered, updated, scattered back;
* ``dense``: the optimiser's dense step over every row, the untouched ones
  with a zero gradient (``dense_above``).  For Adam this is another step
  (untouched rows move); for row-wise Adagrad and plain SGD without weight
  decay it is the same step (``_rowopt.zero_grad_neutral``), and nnsparse
  takes it above ``_rowopt._NEUTRAL_SHARE``, the crossover measured here.

Medians of ``--repeat`` updates, one table per ``--threads`` value.

Run:  python benchmarks/bench_row_update.py [--rows 69878] [--width 500]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from nnsparse import _rowopt

SHARES = (0.05, 0.1, 0.2, 0.25, 0.3, 0.4, 0.5, 0.7)
HP = {"rowwise_adagrad": dict(lr=0.01, eps=1e-10, weight_decay=0.0),
      "adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)}


def _median_ms(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _table(kind: str, rows: int, width: int, repeat: int) -> None:
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(rows, width, generator=gen)
    state = _rowopt.new_state(kind, table)
    print(f"{kind:<16}{'share':>7}{'lazy ms':>10}{'dense ms':>10}")
    for share in SHARES:
        touched = torch.randperm(rows, generator=gen)[:int(share * rows)].sort().values
        grad = torch.randn(touched.shape[0], width, generator=gen)
        full = torch.zeros(rows, width).index_copy_(0, touched, grad)
        times = []
        for above in (None, 0.0):
            hp = dict(HP[kind], dense_above=above)
            saved = _rowopt._NEUTRAL_SHARE
            _rowopt._NEUTRAL_SHARE = 2.0  # lazy means lazy here, for every kind
            try:
                times.append(_median_ms(lambda: _rowopt.update_rows(
                    kind, hp, table, touched, lambda a, b: grad[a:b], state,
                    lambda a, b: full[a:b]), repeat))
            finally:
                _rowopt._NEUTRAL_SHARE = saved
        print(f"{'':<16}{share:>7.2f}{times[0]:>10.1f}{times[1]:>10.1f}", flush=True)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=69878, help="table rows (ML-10M: 69,878 users)")
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--kinds", nargs="+", default=list(HP), choices=list(HP))
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    for threads in args.threads:
        torch.set_num_threads(threads)
        print(f"\n{threads} thread(s), {args.rows} x {args.width} float32")
        for kind in args.kinds:
            _table(kind, args.rows, args.width, args.repeat)


if __name__ == "__main__":
    main()
