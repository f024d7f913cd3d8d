"""The main example's model and data shape, shared by the step-cost benchmarks
(``bench_step_checks.py``, ``bench_grad_checks.py``).

The model of ``examples/movielens_autoencoder.py`` (``SparseLinearBatch``
encoder, ``SparseOutputLinear`` decoder sampled at the batch's pattern,
``values_map(tanh)``), item rows shaped like MovieLens-1M, and the command-line
options both scripts take.
"""
from __future__ import annotations

import argparse
import warnings
from typing import Callable

import torch
from torch import nn

import nnsparse


class Autoencoder(nn.Module):
    def __init__(self, width: int, hidden: int, sparse_grad: bool = False) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden, sparse_grad=sparse_grad)
        self.decoder = nnsparse.SparseOutputLinear(hidden, width, sparse_grad=sparse_grad)

    def forward(self, x, pattern=None):
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), pattern))


def matrix(rows: int, width: int, per_row: int, seed: int = 0) -> torch.Tensor:
    """``(rows, width)`` CSR ratings in [-1, 1], about ``per_row`` a row."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(rows, width, generator=g) < per_row / width
    values = torch.randn(rows, width, generator=g).clamp(-1, 1) * keep
    return values.to_sparse_csr()


def parser(doc: str) -> argparse.ArgumentParser:
    """The options of a step benchmark: data shape, model width, repeats, threads."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1024, help="item rows in the data")
    p.add_argument("--width", type=int, default=6040, help="users (columns)")
    p.add_argument("--per-row", type=int, default=270, help="ratings per item row, on average")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--hidden", type=int, default=500)
    p.add_argument("--repeat", type=int, default=30)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    return p


def main(doc: str, title: str, run: Callable[[int, argparse.Namespace], None]) -> None:
    """Parse the common options, print the setting and ``run(threads, args)`` per thread count."""
    args = parser(doc).parse_args()
    warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")
    print(f"{title}, batch {args.batch} x {args.width}, ~{args.per_row} entries/row, "
          f"hidden {args.hidden}, median of {args.repeat}")
    for threads in args.threads:
        run(threads, args)
