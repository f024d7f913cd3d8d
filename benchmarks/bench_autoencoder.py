"""Training steps of an item autoencoder: the dense masked model vs nnsparse, beside the floor.

Shapes like MovieLens-1M (3,706 items x 6,040 users, 1M ratings),
MovieLens-10M (10,677 x 69,878, 10M) and Netflix (17,770 x 480,189, 100M;
nnsparse only: the dense model cannot run), with synthetic long-tailed
ratings.  Each configuration runs in its own subprocess (its memory is its
own):

* ``dense-masked``: a dense ``(items, users)`` rating matrix and a boolean
  mask, ``nn.Linear`` both sides, ``torch.optim.Adam(fused=True)`` (torch's
  fastest Adam), MSE weighted by the mask.  Skipped with a note when its
  estimated memory exceeds ``--dense-limit-gb``.
* ``nns-default``: today's default of the main example:
  ``SparseLinearBatch`` encoder, ``SparseOutputLinear`` decoder at the
  observed entries, dense gradients, ``torch.optim.Adam()``.
* ``nns-lazyadam``: the same layers with ``sparse_grad=True`` and
  :class:`nnsparse.optim.LazyAdam` (``dense_above=nnsparse.optim.DENSE_ABOVE``).
* ``nns-in-backward``, nnsparse's fastest and recommended step: the same
  layers with the optimiser in the backward
  (:func:`nnsparse.optim.fused_step_optimizer`: Adam applied to the touched
  weight rows during ``loss.backward()``, no weight gradients; dense Adam
  when a step touches more than ``DENSE_ABOVE`` of the rows).
* ``nns-rowwise-adagrad``: the optimiser in the backward with row-wise
  Adagrad (lr 3e-3; one state value per row: the smallest state, for the
  largest tables), nnsparse's fastest step.  Another optimiser: its RMSE is
  not comparable step for step; trained to the end
  (``benchmarks/bench_optimisers.py``) it matched Adam's best test RMSE.

The model is ``tanh(decoder(tanh(encoder(x))))``, hidden 500, batch 128
items, MSE on the observed ratings (1..5 stars mapped to [-1, 1]); every
configuration sees the same batches (a seeded item order) from the same
initial weights.  Each run takes ``--warmup`` steps, then times ``--steps``
steps (0: a whole epoch) and extrapolates the epoch from the mean step.

Columns: ``s/epoch`` (extrapolated), ``x dense``, ``floor`` and ``x floor``
(the floor of one epoch of the sparse model on this machine: the FLOPs of
its five products, ``5 * 2 * nnz * hidden``, at the dense GEMM rate measured
in this run, plus the bytes an Adam update of the touched rows must move,
read and write of weight and both moments, 24 bytes per float32 entry of
every touched encoder and decoder row, at the copy bandwidth measured in this
run; 8 bytes, weight read and written, for row-wise Adagrad), ``optim %`` (share of the timed steps spent in the optimiser: its
``step()``, and for the in-backward mode the row updates inside the
backward, not the gradient products; timed with a device synchronisation
around each on CUDA), ``ops/step`` (aten operators one step dispatches: those
the profiler records outside another aten operator), ``peak MB`` (CUDA: ``max_memory_allocated``;
CPU: the process's peak resident set, ``VmHWM``, less its resident set
once the ratings are loaded), ``state MB`` (bytes of parameters,
gradients and optimiser state, computed from the tensors), and ``RMSE``
(training RMSE in stars over the timed steps, for comparing configurations
on a fixed seed).

Run:  python benchmarks/bench_autoencoder.py                     # ML-1M, ML-10M, 10 steps
      python benchmarks/bench_autoencoder.py --shape ml-1m --steps 0   # whole epochs
      python benchmarks/bench_autoencoder.py --shape netflix --steps 5
      python benchmarks/bench_autoencoder.py --device cuda --threads 1 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

# run from a checkout without installing: the repository root holds nnsparse/
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SHAPES = {
    "ml-1m": (3706, 6040, 1_000_209),
    "ml-10m": (10677, 69878, 10_000_054),
    "netflix": (17770, 480189, 100_480_507),
    "tiny": (300, 400, 12_000),  # a check that every configuration runs, not a benchmark
}
CONFIGS = ["dense-masked", "nns-default", "nns-lazyadam", "nns-in-backward",
           "nns-rowwise-adagrad"]
_CHUNK_RATINGS = 1 << 23


# -- data -------------------------------------------------------------------------
def generate(items: int, users: int, nnz: int, seed: int = 0):
    """Long-tailed synthetic ratings as item-major CSR numpy arrays (int64, int32, float32).

    Memory: the result plus one chunk of about 8M draws.
    """
    rng = np.random.default_rng(seed)
    popularity = rng.lognormal(0.0, 1.2, items)
    counts = np.maximum(1, np.round(nnz * popularity / popularity.sum())).astype(np.int64)
    counts = np.minimum(counts, int(0.6 * users))
    weights = rng.lognormal(0.0, 1.0, users)
    weights /= weights.sum()
    draws = _draws_for_unique(counts, weights)
    activity = np.cumsum(weights)
    crow = np.zeros(items + 1, dtype=np.int64)
    cols, vals = [], []
    start = 0
    while start < items:
        stop = start + 1 + int(np.searchsorted(np.cumsum(draws[start:]), _CHUNK_RATINGS))
        stop = min(stop, items)
        item = np.repeat(np.arange(stop - start, dtype=np.int64), draws[start:stop])
        user = np.searchsorted(activity, rng.random(item.shape[0])).clip(0, users - 1)
        key = np.unique(item * users + user)
        per_item = np.bincount(key // users, minlength=stop - start)
        crow[start + 1:stop + 1] = crow[start] + np.cumsum(per_item)
        cols.append((key % users).astype(np.int32))
        stars = rng.integers(1, 6, key.shape[0])
        vals.append(((stars - 3) / 2).astype(np.float32))  # 1..5 stars -> [-1, 1]
        start = stop
    return crow, np.concatenate(cols), np.concatenate(vals)


def _draws_for_unique(counts, weights):
    """Draws per item so that the expected number of distinct users is ``counts``.

    With ``d`` draws from ``weights`` the expected distinct count is
    ``sum_u 1 - exp(-d w_u)``; it is tabulated on a grid and inverted.
    """
    grid = np.unique(np.geomspace(1, 20 * counts.max(), 256).round())
    expected = np.array([np.sum(-np.expm1(-d * weights)) for d in grid])
    return np.round(np.interp(counts, expected, grid)).astype(np.int64)


def _save(directory: str, crow, col, val) -> None:
    for name, array in (("crow", crow), ("col", col), ("val", val)):
        np.save(os.path.join(directory, f"{name}.npy"), array)


def _load(directory: str):
    return tuple(torch.from_numpy(np.load(os.path.join(directory, f"{n}.npy")))
                 for n in ("crow", "col", "val"))


def _gather(crow, col, val, items):
    """The ratings of ``items`` as (row, col, value), row-major, columns sorted."""
    # index_select, not advanced indexing: 4x faster for a 1-D index on CPU
    starts = crow.index_select(0, items)
    counts = crow.index_select(0, items + 1) - starts
    total = int(counts.sum())
    rows = torch.repeat_interleave(torch.arange(items.shape[0], device=crow.device), counts,
                                   output_size=total)
    offsets = torch.cumsum(counts, 0) - counts
    pos = torch.arange(total, device=crow.device) + (starts - offsets).index_select(0, rows)
    return rows, col.index_select(0, pos).long(), val.index_select(0, pos)


def _dense_bytes(items: int, users: int, hidden: int) -> int:
    """Dense masked run: float32 ratings, bool mask, 2 layers x (weight, grad, 2 Adam states)."""
    return items * users * 5 + 2 * users * hidden * 4 * 4


def _order(items: int, seed: int) -> torch.Tensor:
    """The epoch's item order: the same in every configuration and in the driver."""
    return torch.randperm(items, generator=torch.Generator().manual_seed(seed))


def _status_mb(key: str) -> float:
    """``VmRSS`` (resident now) or ``VmHWM`` (peak resident) of this process, in MB.

    Not ``ru_maxrss``: Linux keeps it across ``exec``, so a child would start
    from the driver's peak.
    """
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


# -- the configurations ---------------------------------------------------------------
class _SparseAE(torch.nn.Module):
    """The main example's model: ``tanh(decoder(tanh(encoder(x)), x))``."""

    def __init__(self, users: int, hidden: int, sparse_grad: bool, device) -> None:
        super().__init__()
        import nnsparse
        self.encoder = nnsparse.SparseLinearBatch(users, hidden, sparse_grad=sparse_grad,
                                                  device=device)
        self.decoder = nnsparse.SparseOutputLinear(hidden, users, sparse_grad=sparse_grad,
                                                   device=device)

    def forward(self, x):
        import nnsparse
        return nnsparse.values_map(torch.tanh, self.decoder(torch.tanh(self.encoder(x)), x))


def _build(config: str, users: int, hidden: int, device, dense_above):
    """``(model, optimiser)`` of a configuration, from the current torch seed."""
    from torch import nn
    from nnsparse import optim as noptim

    if dense_above is None:
        dense_above = noptim.DENSE_ABOVE
    elif dense_above < 0:
        dense_above = None

    if config == "dense-masked":
        model = nn.Sequential(nn.Linear(users, hidden, device=device), nn.Tanh(),
                              nn.Linear(hidden, users, device=device), nn.Tanh())
        return model, torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    model = _SparseAE(users, hidden, config == "nns-lazyadam", device)
    if config == "nns-rowwise-adagrad":
        return model, noptim.apply_optimizer_in_backward(model, "rowwise_adagrad", lr=3e-3)
    if config == "nns-default":
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)
    if config == "nns-lazyadam":
        return model, noptim.LazyAdam(model.parameters(), lr=1e-3, dense_above=dense_above)
    return model, noptim.fused_step_optimizer(model, lr=1e-3, dense_above=dense_above)


class _OptTimer:
    """Time spent in the optimiser: ``step()`` and, for the in-backward mode, the
    row updates (``_rowopt._block``, the dense-fallback kernels and the GPU's
    ``update_masked``), not nested."""

    def __init__(self, sync) -> None:
        self.seconds, self._depth, self._sync = 0.0, 0, sync

    def wrap(self, fn):
        def timed(*args, **kwargs):
            if self._depth:
                return fn(*args, **kwargs)
            self._depth += 1
            self._sync()
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self._sync()
                self.seconds += time.perf_counter() - t
                self._depth -= 1
        return timed

    def install(self) -> None:
        from nnsparse import _rowopt
        _rowopt._block = self.wrap(_rowopt._block)
        _rowopt.update_masked = self.wrap(_rowopt.update_masked)  # the GPU's step
        # In place: optim.LazyAdam and _rowopt look kernels up in this one dict.
        for kind, kernel in list(_rowopt.KERNELS.items()):
            _rowopt.KERNELS[kind] = self.wrap(kernel)


def _state_mb(model, optimiser) -> float:
    """Parameters, gradients and optimiser state, in MB (computed from the tensors)."""
    seen, total = set(), 0

    def add(t):
        nonlocal total
        if isinstance(t, torch.Tensor) and id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size() if t.layout == torch.strided else (
                t._values().numel() * t.element_size() + t._indices().numel() * 8)
    for p in model.parameters():
        add(p)
        add(p.grad)
    opts = [optimiser.dense] if hasattr(optimiser, "tables") else [optimiser]
    if hasattr(optimiser, "tables"):
        for state in optimiser.tables.values():
            for t in state.values():
                add(t)
    for opt in opts:
        if opt is not None:
            for state in opt.state.values():
                for t in state.values():
                    add(t)
    return total / 2**20


def _child(args) -> dict:
    import nnsparse

    if args.threads[0]:
        torch.set_num_threads(args.threads[0])
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    crow, col, val = (t.to(device) for t in _load(args.data))
    items, users = crow.shape[0] - 1, int(args.users)
    rss0 = _status_mb("VmRSS")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    config = args.config
    torch.manual_seed(args.seed)
    model, optimiser = _build(config, users, args.hidden, device, args.dense_above)
    dense = config == "dense-masked"
    if dense:
        ratings = torch.zeros(items, users, device=device)
        mask = torch.zeros(items, users, dtype=torch.bool, device=device)
        for s in range(0, items, 1024):  # fill in chunks: no dense index copy
            it = torch.arange(s, min(s + 1024, items), device=device)
            r, c, v = _gather(crow, col, val, it)
            ratings[it[0] + r, c] = v
            mask[it[0] + r, c] = True

    def step(b):
        """One training step on the items ``b``; returns the loss (a tensor)."""
        if dense:
            x, m = ratings.index_select(0, b), mask.index_select(0, b)
            loss = ((model(x) - x).square() * m).sum() / m.sum()
        else:
            row, c, v = _gather(crow, col, val, b)
            # built correctly here, as nnsparse's collate builds its batches: trusted
            x = nnsparse.trust(torch.sparse_coo_tensor(
                torch.stack([row, c]), v, (b.shape[0], users), is_coalesced=True,
                check_invariants=False))
            loss = (model(x).values() - v).square().mean()
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
        return loss.detach()

    batches = _order(items, args.seed).to(device).split(args.batch_size)
    per_epoch = len(batches)
    for b in batches[:args.warmup]:
        step(b)
    timed = batches[args.warmup:] if args.steps == 0 else \
        batches[args.warmup:args.warmup + args.steps]
    timer = _OptTimer(sync)
    if not cuda:  # on a GPU the timer's synchronisations would slow the step: see below
        timer.install()
        optimiser.step = timer.wrap(optimiser.step)
    progress = None
    if args.progress:
        from tqdm import tqdm
        progress = tqdm(total=len(timed), desc=config, file=sys.stderr, leave=False)
    losses = []
    sync()
    start = time.perf_counter()
    for b in timed:
        losses.append(step(b))
        if progress is not None:
            progress.update()
    sync()
    seconds = time.perf_counter() - start
    if progress is not None:
        progress.close()
    opt_share = timer.seconds / seconds if seconds else 0.0
    if cuda and timed:
        # the optimiser's share from a second, synchronised pass over a few batches
        timer.install()
        optimiser.step = timer.wrap(optimiser.step)
        share_steps = timed[:20]
        sync()
        t0 = time.perf_counter()
        for b in share_steps:
            step(b)
        sync()
        opt_share = timer.seconds / (time.perf_counter() - t0)
    state_mb = _state_mb(model, optimiser)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else _status_mb("VmHWM") - rss0
    mse = float(torch.stack(losses).mean()) if losses else float("nan")
    ops = _count_ops(step, batches[0], cuda)
    return dict(config=config, seconds=seconds / max(1, len(timed)) * per_epoch,
                steps=len(timed), opt_share=opt_share,
                peak_mb=peak, state_mb=state_mb, rmse=2 * mse ** 0.5, ops=ops)


def _count_ops(step, batch, cuda: bool) -> int:
    """aten operators called in one training step: those the profiler records
    outside another aten operator (the ones a step dispatches)."""
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        step(batch)
    return sum(1 for e in prof.events() if e.name.startswith("aten::") and not (
        e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::")))


# -- the floor ------------------------------------------------------------------------
def _machine_rates(device: str, threads: int) -> tuple:
    """(GEMM FLOP/s, copy bytes/s) measured now: the best of a few float32 runs."""
    if threads:
        torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    n = 4096 if device == "cuda" else 1024
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    src = torch.randn(1 << 26, device=device)  # 256 MB: well beyond the caches
    dst = torch.empty_like(src)

    def best(fn, reps):
        fn()
        times = []
        for _ in range(reps):
            sync()
            t = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t)
        return min(times)
    gemm = 2 * n ** 3 / best(lambda: torch.mm(a, b), 5)
    copy = 2 * src.numel() * 4 / best(lambda: dst.copy_(src), 5)
    return gemm, copy


def _floor_parts(crow, col, items: int, hidden: int, batch_size: int, seed: int,
                 gemm: float) -> tuple:
    """``(seconds of the products at the GEMM rate, touched row entries per epoch)``."""
    nnz = int(crow[-1])
    flops = 5 * 2 * nnz * hidden
    touched = 0
    for b in _order(items, seed).split(batch_size):
        b = b.numpy()
        users = np.concatenate([col[crow[i]:crow[i + 1]] for i in b])
        touched += np.unique(users).shape[0]
    return flops / gemm, 2 * touched * hidden  # encoder and decoder rows


# Bytes an optimiser step must move per touched weight entry: Adam reads and
# writes weight and both moments (24), row-wise Adagrad the weight (8; its
# one value per row is negligible).
_STEP_BYTES = {"nns-rowwise-adagrad": 8}


def _floor_of(config: str, parts: tuple, copy: float) -> float:
    """Floor of one epoch of the sparse model with ``config``'s optimiser."""
    product_seconds, entries = parts
    return product_seconds + entries * _STEP_BYTES.get(config, 24) / copy


# -- the driver ----------------------------------------------------------------------
def _run_child(args, config, data_dir, users, threads):
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--config", config,
           "--data", data_dir, "--users", str(users), "--hidden", str(args.hidden),
           "--batch-size", str(args.batch_size), "--seed", str(args.seed),
           "--steps", str(args.steps), "--warmup", str(args.warmup),
           "--threads", str(threads), "--device", args.device]
    cmd += ["--progress"] if args.progress else []
    cmd += ["--dense-above", str(args.dense_above)] if args.dense_above is not None else []
    best = None
    for _ in range(args.repeat):  # the fastest of --repeat runs: the least disturbed
        # stderr kept back (the profiler's chatter) and shown on a failure
        done = subprocess.run(cmd, stdout=subprocess.PIPE,
                              stderr=None if args.progress else subprocess.PIPE, text=True)
        if done.returncode != 0:
            return dict(config=config, error=f"exit status {done.returncode}\n{done.stderr}")
        r = json.loads(done.stdout.strip().splitlines()[-1])
        best = r if best is None or r["seconds"] < best["seconds"] else best
    return best


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", "--shapes", dest="shapes", nargs="+", choices=list(SHAPES),
                   default=["ml-1m", "ml-10m"])
    p.add_argument("--configs", nargs="+", choices=CONFIGS, default=CONFIGS)
    p.add_argument("--quick", action="store_true", help="only the ML-1M shape")
    p.add_argument("--steps", "--max-batches", type=int, default=10,
                   help="time this many steps and extrapolate the epoch (0: a whole epoch)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before (default 2)")
    p.add_argument("--hidden", type=int, default=500)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense-limit-gb", type=float, default=12.0)
    p.add_argument("--dense-above", type=float, default=None,
                   help="touched share above which LazyAdam and the in-backward optimiser "
                        "take the dense step (default nnsparse.optim.DENSE_ABOVE; "
                        "negative: always lazy)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run each configuration this many times, report the fastest")
    p.add_argument("--threads", type=int, nargs="+", default=[0],
                   help="torch threads per run, one table each (0: torch's default)")
    p.add_argument("--progress", action="store_true", help="tqdm bar per run (stderr)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--users", type=int, help=argparse.SUPPRESS)
    return p


def main(argv=None) -> None:
    args = _parser().parse_args(argv)
    if args.child:
        print(json.dumps(_child(args)))
        return
    where = torch.cuda.get_device_name() if args.device == "cuda" else f"{os.cpu_count()} CPUs"
    span = "whole epochs" if args.steps == 0 else \
        f"{args.steps} timed steps after {args.warmup}, epoch extrapolated from the mean step"
    print(f"torch {torch.__version__}, {where}; hidden {args.hidden}, batch {args.batch_size}; "
          f"{span}; fastest of {args.repeat}")
    for shape in ["ml-1m"] if args.quick else args.shapes:
        items, users, nominal = SHAPES[shape]
        with tempfile.TemporaryDirectory() as data_dir:
            t = time.perf_counter()
            crow, col, val = generate(items, users, nominal, args.seed)
            _save(data_dir, crow, col, val)
            nnz = int(crow[-1])
            print(f"\n{shape}: {items} items x {users} users, {nnz:,} ratings "
                  f"(generated in {time.perf_counter() - t:.1f} s)")
            for threads in args.threads:
                _table(args, shape, data_dir, crow, col, threads)
            del crow, col, val


def _table(args, shape, data_dir, crow, col, threads) -> None:
    items, users, _ = SHAPES[shape]
    gemm, copy = _machine_rates(args.device, threads)
    parts = _floor_parts(crow, col, items, args.hidden, args.batch_size, args.seed, gemm)
    print(f"{threads or torch.get_num_threads()} threads: GEMM {gemm / 1e9:.0f} GFLOP/s, "
          f"copy {copy / 1e9:.1f} GB/s, floor {_floor_of('adam', parts, copy):.2f} s/epoch "
          f"(Adam; row-wise Adagrad {_floor_of('nns-rowwise-adagrad', parts, copy):.2f})")
    print(f"{'config':<18}{'s/epoch':>9}{'x dense':>8}{'floor':>7}{'x floor':>8}"
          f"{'optim %':>8}{'ops/step':>9}{'peak MB':>9}{'x dense':>8}{'state MB':>9}"
          f"{'RMSE':>8}")
    dense = None
    for config in args.configs:
        if config == "dense-masked":
            need = _dense_bytes(items, users, args.hidden) / 2**30
            if need > args.dense_limit_gb:
                print(f"{config:<18}skipped: needs about {need:.0f} GB "
                      f"(> --dense-limit-gb {args.dense_limit_gb:g})")
                continue
        r = _run_child(args, config, data_dir, users, threads)
        if "error" in r:
            print(f"{config:<18}failed: {r['error']}")
            continue
        floor = _floor_of(config, parts, copy)
        if config == "dense-masked":
            dense = r
        rt = f"{r['seconds'] / dense['seconds']:.3f}" if dense else "-"
        rm = f"{r['peak_mb'] / dense['peak_mb']:.3f}" if dense else "-"
        print(f"{config:<18}{r['seconds']:>9.2f}{rt:>8}{floor:>7.2f}"
              f"{r['seconds'] / floor:>8.1f}{100 * r['opt_share']:>7.1f}%{r['ops']:>9}"
              f"{r['peak_mb']:>9.0f}{rm:>8}{r['state_mb']:>9.0f}{r['rmse']:>8.4f}",
              flush=True)


if __name__ == "__main__":
    main()
