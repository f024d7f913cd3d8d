"""What the checks of a user's batch cost in one training step of the main example.

The model of ``examples/movielens_autoencoder.py`` (``SparseLinearBatch``
encoder, ``SparseOutputLinear`` decoder sampled at the batch's pattern,
``values_map(tanh)``, ``SDAESparseCriterion`` with ``prepare_input``, Adam),
on item rows shaped like MovieLens-1M (``--width`` users, about
``--per-row`` ratings per item row), one step per batch:

* ``checked``: each step gets a fresh user-built CSR tensor (no structure
  attached), so nnsparse validates it completely (one host sync) and builds
  its structure at the first call of the step;
* ``trusted``: each step gets a fresh batch from ``SparseRowDataset.collate``
  (trusted: built with its structure, never checked).

Both see the same batches in the same order, interleaved, so the share
compares like with like on a shared machine.  Medians of ``--repeat`` steps,
for 1 and 2 threads.  The target (issue 11): the checks cost at most 5 % of
the step.

Run:  python benchmarks/bench_step_checks.py [--repeat 30] [--batch 128]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

import nnsparse
from nnsparse._forms import _structure
from nnsparse.data import SparseRowDataset

import _step_model as step_model  # this script's folder, on sys.path
from _step_model import Autoencoder, matrix


def _fresh_user_batch(batch: torch.Tensor) -> torch.Tensor:
    """A new CSR tensor on the same data, as a user's own loader would build it."""
    return torch.sparse_csr_tensor(batch.crow_indices().clone(), batch.col_indices().clone(),
                                   batch.values().clone(), batch.shape)


def run(threads: int, args: argparse.Namespace) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    x = matrix(args.rows, args.width, args.per_row)
    ds = SparseRowDataset(x)
    model = Autoencoder(args.width, args.hidden)
    criterion = nnsparse.SDAESparseCriterion(nn.MSELoss(), alpha=1.0, beta=0.5, hide_ratio=0.25,
                                             generator=torch.Generator().manual_seed(0))
    optimiser = torch.optim.Adam(model.parameters(), lr=1e-4)

    def step(batch: torch.Tensor) -> float:
        start = time.perf_counter()
        out = model(criterion.prepare_input(batch), batch)
        loss = criterion(out, batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        return time.perf_counter() - start

    times: dict = {"checked": [], "trusted": []}
    n_batches = args.rows // args.batch
    for i in range(args.warmup + args.repeat):
        k = i % n_batches
        rows = list(range(k * args.batch, (k + 1) * args.batch))
        trusted = ds.collate([ds[r] for r in rows]).input  # fresh, trusted
        user = _fresh_user_batch(trusted)  # fresh, unchecked: validated at its first use
        for name, batch in (("checked", user), ("trusted", trusted)) if i % 2 else (
                ("trusted", trusted), ("checked", user)):
            t = step(batch)
            if i >= args.warmup:
                times[name].append(t)
    checked, trusted = (statistics.median(times[n]) * 1e3 for n in ("checked", "trusted"))
    share = 100.0 * (checked - trusted) / checked
    # The check alone, timed in isolation (steadier than a difference of two
    # step times on a busy machine): validating + attaching the structure of a
    # fresh batch vs attaching it unchecked (what nnsparse.trust does).
    batch = ds.collate([ds[r] for r in range(args.batch)]).input
    cost = {}
    for check in (True, False):
        samples = []
        for _ in range(50):
            fresh = _fresh_user_batch(batch)
            start = time.perf_counter()
            _structure(fresh, "input", check)
            samples.append(time.perf_counter() - start)
        cost[check] = statistics.median(samples) * 1e3
    alone = 100.0 * (cost[True] - cost[False]) / checked
    print(f"threads={threads}  checked {checked:8.2f} ms  trusted {trusted:8.2f} ms  "
          f"difference {share:5.1f} % of the step; "
          f"the check alone {cost[True] - cost[False]:.3f} ms "
          f"= {alone:.2f} % (target <= 5 %)")


if __name__ == "__main__":
    step_model.main(__doc__, "main example step", run)
