"""Compiled vs eager training step of the main example's model.

The model of ``examples/movielens_autoencoder.py``
(``tanh(SparseOutputLinear(tanh(SparseLinearBatch(x)), pattern=x))``) at the
MovieLens-1M shape: rows are items (3,706), the width is the users (6,040),
batch 128 rows, hidden 500, about 1M ratings (4.5% dense, uniform here).  One
step is forward, ``SparseCriterion(MSELoss)`` on the pattern's entries,
backward and ``torch.optim.Adam``:

* ``eager``: the batch as a torch CSR tensor (what the collate function
  yields), the layers' own eager kernels;
* ``eager-parts``: the batch as :class:`nnsparse.SparseParts` through the
  custom operators, not compiled (the cost of the operator path itself);
* ``compiled``: ``torch.compile(model, fullgraph=True)`` (``--backend``,
  default inductor) over :class:`nnsparse.SparseParts`; the loss and the
  optimiser run eagerly, as in a user's loop;
* ``eager-fused``: ``eager`` with ``torch.optim.Adam(fused=True)``;
* ``compiled-step``: the model and the loss (the same MSE over the pattern's
  entries, written on the values) compiled as one graph, and
  ``optimiser.step`` compiled too (inductor fuses Adam).

Each step gets a fresh CSR tensor (as from a ``DataLoader``, trusted), so no
per-batch structure is reused across steps.  Figures are medians over
``--steps`` steps after ``--warmup`` (which includes compilation); the three
configurations take turns step by step, so a busy machine slows them alike.

Run:  python benchmarks/bench_compile.py                       # CPU, 1 and 2 threads
      python benchmarks/bench_compile.py --device cuda --threads 0
      python benchmarks/bench_compile.py --steps 5 --rows 32     # a quick check
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import nnsparse  # noqa: E402
from nnsparse._index import csr_tensor  # noqa: E402  (torch's constructor, checks skipped)

NAMES = ("eager", "eager-parts", "compiled", "eager-fused", "compiled-step")


class Autoencoder(nn.Module):
    """The main example's model; the decoder is read at ``pattern``'s entries."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.encoder = nnsparse.SparseLinearBatch(width, hidden, mode="sparse")
        self.decoder = nnsparse.SparseOutputLinear(hidden, width)

    def forward(self, x, pattern):
        out = self.decoder(torch.tanh(self.encoder(x)), pattern)
        if isinstance(out, nnsparse.SparseParts):
            return out.with_values(torch.tanh(out.values))
        return nnsparse.values_map(torch.tanh, out)


def make_batches(count: int, rows: int, width: int, density: float, device: str, seed: int):
    """``count`` CSR batches as plain parts (crow, col, values), nnz varying around density."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        counts = torch.binomial(torch.full((rows,), float(width)),
                                torch.full((rows,), density), generator=g).long()
        crow = torch.zeros(rows + 1, dtype=torch.int64)
        torch.cumsum(counts, 0, out=crow[1:])
        cols = [torch.randperm(width, generator=g)[:int(c)].sort().values for c in counts]
        col = torch.cat(cols)
        values = torch.rand(col.shape[0], generator=g) * 2 - 1
        out.append(tuple(t.to(device) for t in (crow, col, values)))
    return out


def csr(parts, rows: int, width: int) -> torch.Tensor:
    """A fresh trusted CSR tensor on the parts, as the collate function gives."""
    crow, col, values = parts
    return nnsparse.trust(csr_tensor(crow, col, values, (rows, width)))


def _timed(step: Callable[[int], None], i: int, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    step(i)
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def make_step(args: argparse.Namespace, name: str, batches, criterion) -> Callable[[int], None]:
    """One configuration's training step (its own seeded model and optimiser)."""
    torch.manual_seed(0)
    model = Autoencoder(args.width, args.hidden).to(args.device)
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-4, fused=name == "eager-fused")
    forward, update = model, optimiser.step
    if name == "compiled":
        forward = torch.compile(model, fullgraph=True, backend=args.backend)
    if name == "compiled-step":
        def model_loss(parts):
            # the criterion's MSE over the pattern's entries, inside the graph
            return (model(parts, parts).values - parts.values).pow(2).mean()
        forward = torch.compile(model_loss, fullgraph=True, backend=args.backend)
        update = torch.compile(optimiser.step, backend=args.backend)

    def step(i: int) -> None:
        x = csr(batches[i % len(batches)], args.rows, args.width)
        if name.startswith("eager") and name != "eager-parts":
            loss = criterion(forward(x, x), x)
        elif name == "compiled-step":
            loss = forward(nnsparse.sparse_parts(x))
        else:
            parts = nnsparse.sparse_parts(x)
            loss = criterion(forward(parts, parts).to_sparse_csr(), x)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        update()

    return step


def run(args: argparse.Namespace, threads: int) -> dict:
    """Median ms per step of each configuration, the configurations interleaved
    step by step so that a change in the machine's load hits them alike."""
    from tqdm import tqdm

    if threads:
        torch.set_num_threads(threads)
    torch._dynamo.reset()
    batches = make_batches(args.batches, args.rows, args.width, args.density, args.device, 0)
    criterion = nnsparse.SparseCriterion(nn.MSELoss())
    steps = {name: make_step(args, name, batches, criterion) for name in NAMES}
    for name, step in steps.items():  # warm-up, compilation included
        for i in range(args.warmup):
            step(i)
    times: Dict[str, List[float]] = {name: [] for name in NAMES}
    for i in tqdm(range(args.steps), desc=f"{threads or torch.get_num_threads()} threads",
                  disable=not args.progress, leave=False):
        for name, step in steps.items():
            times[name].append(_timed(step, args.warmup + i, args.device))
    return {name: 1e3 * statistics.median(t) for name, t in times.items()}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2],
                   help="torch threads to measure with (0: torch's default)")
    p.add_argument("--rows", type=int, default=128, help="batch size (items per batch)")
    p.add_argument("--width", type=int, default=6040, help="users (ML-1M: 6,040)")
    p.add_argument("--hidden", type=int, default=500)
    p.add_argument("--density", type=float, default=1_000_209 / (3706 * 6040),
                   help="share of specified entries (ML-1M: 4.47%%)")
    p.add_argument("--batches", type=int, default=8, help="distinct batches cycled")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--backend", default="inductor", help="torch.compile backend")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: no CUDA device on this machine")
    print(f"torch {torch.__version__}, {args.device}, batch {args.rows} x {args.width}, "
          f"hidden {args.hidden}, density {args.density:.4f}, backend {args.backend}; "
          f"median of {args.steps} steps (forward + backward + Adam), ms")
    for threads in args.threads:
        r = run(args, threads)
        print(f"threads {threads or torch.get_num_threads():>2}: "
              + "  ".join(f"{n} {r[n]:.2f}" for n in NAMES)
              + f"  (eager / compiled = {r['eager'] / r['compiled']:.2f}, "
              f"eager-fused / compiled-step = {r['eager-fused'] / r['compiled-step']:.2f})",
              flush=True)

if __name__ == "__main__":
    main()
